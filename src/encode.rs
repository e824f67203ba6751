//! Turns a [`Change`] into a CloudEvent: deterministic id, attributes, extensions, and the
//! payload the resource asks for (the object with managedFields and the last-applied annotation
//! stripped and secrets redacted, a reference, or a diff), in this bridge's shape or Knative
//! ApiServerSource's.
//!
//! The result, [`Event`], is binding-neutral: [`Event::attributes`] drives Kafka's `ce_` headers,
//! NATS's `ce-` headers and the structured JSON form alike.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use kube::api::DynamicObject;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::attribute;
pub use crate::attribute::ce_header;
use crate::audit::{self, Author};
use crate::change::{Change, ChangeKind, Origin};
use crate::config::{EventFormat, RecordKey};
use crate::discovery::ResolvedResource;
use crate::knative;
use crate::payload::{self, Mode, Pointer};
pub use crate::payload::{LAST_APPLIED, REDACTED};
use crate::template::Template;
use crate::trace::{self, Parent, TraceContext};

/// Prefix of every event type: `io.kubeeventbridge.object.added`, `.modified`, `.deleted`.
pub const TYPE_PREFIX: &str = "io.kubeeventbridge.object.";
/// The `dataschema` of every event: the `$id` of `schemas/event.schema.json`, whose `data` property describes the payload.
pub const DATA_SCHEMA: &str = "https://kube-event-bridge.dev/schemas/event/v1";
/// `content-type` of the data.
pub const DATA_CONTENT_TYPE: &str = "application/json";
/// `content-type` of a structured-mode event.
pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json; charset=utf-8";

/// Errors of encoding one change.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object lacks metadata every event needs.
    #[error("object {name:?} has no metadata.{field}")]
    MissingMetadata {
        /// The object's name, if any.
        name: String,
        /// The missing field.
        field: &'static str,
    },
    /// The object could not be serialized.
    #[error("cannot serialize object {name:?}")]
    Serialize {
        /// The object's name.
        name: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
}

/// What every event of one resource shares, computed once per resource.
#[derive(Debug)]
pub struct ResourceInfo {
    /// Cluster name.
    pub cluster: Arc<str>,
    /// API group (`""` for core).
    pub group: String,
    /// Version.
    pub version: String,
    /// `apps/v1`.
    pub api_version: String,
    /// Kind.
    pub kind: String,
    /// Plural resource name.
    pub resource: String,
    /// The `source` attribute: `/k8s/{cluster}/apis/{group}/{version}/{plural}` (`/api/v1/...`
    /// for core), or the API server's URL in Knative format.
    pub source: String,
    /// Payload mode.
    pub payload: Mode,
    /// Diff mode: carry the previous object.
    pub include_previous: bool,
    /// Pointers ignored when deciding whether an update changed anything.
    pub ignore: Vec<Pointer>,
    /// Whether updates are compared by content digest at all.
    pub compare_content: bool,
    /// Event shape.
    pub format: EventFormat,
    /// Kafka record key.
    pub key: RecordKey,
    /// Kafka tombstones after deletes.
    pub tombstones: bool,
    /// This resource's topic, subject or URL template, overriding the sink's.
    pub destination: Option<Template>,
    /// Whether events carry the audit extensions (`manager`, `operation`, `clusterid`).
    pub audit: bool,
    redact: Vec<Pointer>,
    redact_secret_data: bool,
    strip_managed_fields: bool,
    strip_last_applied: bool,
    /// Knative's collection name for subjects (its guess from the kind, kept for compatibility).
    knative_plural: String,
    /// With the audit extensions on: the `clusterid` (uid of namespace `kube-system`).
    cluster_id: Option<Arc<str>>,
    /// The annotation naming an object's trace context (`traceparent`).
    traceparent_annotation: String,
    /// The annotation holding its `tracestate`.
    tracestate_annotation: String,
}

impl ResourceInfo {
    /// Builds the shared part for a resolved resource; `api_server` is the API server's URL
    /// (Knative's `source`).
    pub fn new(cluster: &str, r: &ResolvedResource, api_server: &str) -> Self {
        let api = &r.api;
        let c = &r.config;
        let source = match c.event_format {
            EventFormat::Knative => api_server.trim_end_matches('/').to_string(),
            EventFormat::Cloudevents if api.group.is_empty() => {
                format!("/k8s/{cluster}/api/{}/{}", api.version, api.plural)
            }
            EventFormat::Cloudevents => format!(
                "/k8s/{cluster}/apis/{}/{}/{}",
                api.group, api.version, api.plural
            ),
        };
        Self {
            cluster: cluster.into(),
            group: api.group.clone(),
            version: api.version.clone(),
            api_version: api.api_version.clone(),
            kind: api.kind.clone(),
            resource: api.plural.clone(),
            source,
            payload: c.payload,
            include_previous: c.include_previous,
            ignore: c.ignore_paths.clone(),
            compare_content: c.drop_unchanged_updates || !c.ignore_paths.is_empty(),
            format: c.event_format,
            key: c.key,
            tombstones: c.tombstones,
            destination: c.destination.clone(),
            audit: false,
            redact: c.redact.clone(),
            redact_secret_data: c.redact_secret_data && r.is_secret(),
            strip_managed_fields: c.strip_managed_fields,
            strip_last_applied: c.strip_last_applied,
            knative_plural: knative::guess_plural(&api.kind),
            cluster_id: None,
            traceparent_annotation: c.traceparent_annotation.clone(),
            tracestate_annotation: c.tracestate_annotation.clone(),
        }
    }

    /// Turns the audit extensions on: every object event then carries `clusterid` (this uid of
    /// namespace `kube-system`) and, when its object names one, `manager` and `operation`.
    pub fn with_audit(mut self, cluster_id: Arc<str>) -> Self {
        self.cluster_id = Some(cluster_id).filter(|id| !id.is_empty());
        self.audit = true;
        self
    }

    /// Whether events hide values (Secret data, `redact` pointers): nothing derived from them,
    /// such as content digests, may then leave the process.
    pub fn redacts(&self) -> bool {
        self.redact_secret_data || !self.redact.is_empty()
    }
}

/// One encoded CloudEvent.
#[derive(Debug)]
pub struct Event {
    /// `{uid}:{resourceVersion}:{added|modified|deleted}`: the same change always gets the same id.
    pub id: String,
    /// What happened.
    pub kind: ChangeKind,
    /// Why it was emitted.
    pub origin: Origin,
    /// The snapshot on demand it belongs to (see [`Event::for_snapshot`]).
    pub snapshot: Option<Arc<str>>,
    /// Resource-wide attributes.
    pub info: Arc<ResourceInfo>,
    /// `namespace/name` or `name` (Knative: `/apis/{apiVersion}/namespaces/{ns}/{plural}/{name}`).
    pub subject: String,
    /// RFC 3339 observation time.
    pub time: String,
    /// Namespace, if namespaced.
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// uid.
    pub uid: String,
    /// `namespace/name` when the resource keys records by name.
    key: Option<String>,
    /// resourceVersion.
    pub resource_version: String,
    /// resourceVersion zero-padded to 20 digits so it sorts as a string.
    pub sequence: String,
    /// What `data` carries (a truncated event carries a reference).
    pub payload: Mode,
    /// Whether the payload was cut down to a reference because the event was too large.
    pub truncated: bool,
    /// Who made the newest write (audit extensions on, and the object names a manager).
    pub author: Option<Author>,
    /// The W3C trace context of the event's span (`traceparent`, `tracestate`).
    pub trace: TraceContext,
    /// The payload as JSON.
    pub data: Vec<u8>,
    /// When the watch read the change (its `time`), on the monotonic clock, for latency
    /// figures: waits in the pipeline's queue count.
    pub received: Instant,
    /// The watch's byte budget this event holds until it is settled (given back on drop).
    pub budget: Option<crate::budget::Reservation>,
}

/// Characters percent-encoded in a binary-mode header value, as the HTTP and NATS bindings ask:
/// controls, non-ASCII, space, `"` and `%` (so that decoding gives the value back).
const HEADER_VALUE: &AsciiSet = &CONTROLS.add(b'%').add(b'"').add(b' ');

/// `value` percent-encoded for a binary-mode header; borrowed when nothing needed encoding.
pub fn header_value(value: &str) -> Cow<'_, str> {
    utf8_percent_encode(value, HEADER_VALUE).into()
}

impl Event {
    /// Makes this event part of the snapshot on demand `id`: `origin=snapshot`, the
    /// `snapshotid` extension, and an id of its own, `{uid}:{resourceVersion}:{snapshotid}`, so
    /// that a broker deduplicating by id (JetStream's `Nats-Msg-Id`) never takes it for the live
    /// event of the same version, while a snapshot resumed after a restart repeats its ids.
    pub fn for_snapshot(&mut self, id: Arc<str>) {
        self.origin = Origin::Snapshot;
        self.id = format!("{}:{}:{id}", self.uid, self.resource_version);
        self.snapshot = Some(id);
    }

    /// Template values for this event's topic or subject.
    pub fn template_values(&self) -> crate::template::Values<'_> {
        crate::template::Values {
            cluster: &self.info.cluster,
            group: &self.info.group,
            version: &self.info.version,
            resource: &self.info.resource,
            namespace: self.namespace.as_deref(),
            name: &self.name,
        }
    }

    /// The record key and `partitionkey`: the uid, or `namespace/name`.
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or(&self.uid)
    }

    /// The CloudEvents `type`.
    pub fn event_type(&self) -> &'static str {
        match self.info.format {
            EventFormat::Knative => knative::event_type(self.kind, self.payload),
            EventFormat::Cloudevents => match self.kind {
                ChangeKind::Added => "io.kubeeventbridge.object.added",
                ChangeKind::Modified => "io.kubeeventbridge.object.modified",
                ChangeKind::Deleted => "io.kubeeventbridge.object.deleted",
            },
        }
    }

    /// Every attribute except `data` and `datacontenttype`, in a fixed order: the context
    /// attributes, then the extensions (lowercase names as the specification requires).
    pub fn attributes(&self) -> impl Iterator<Item = (&'static str, &str)> {
        let cloudevents = self.info.format == EventFormat::Cloudevents;
        [
            Some((attribute::SPECVERSION, "1.0")),
            Some((attribute::ID, self.id.as_str())),
            Some((attribute::SOURCE, self.info.source.as_str())),
            Some((attribute::TYPE, self.event_type())),
            Some((attribute::SUBJECT, self.subject.as_str())),
            Some((attribute::TIME, self.time.as_str())),
            cloudevents.then_some((attribute::DATASCHEMA, DATA_SCHEMA)),
            Some((attribute::CLUSTER, &*self.info.cluster)),
            Some((attribute::APIVERSION, self.info.api_version.as_str())),
            Some((attribute::KIND, self.info.kind.as_str())),
            Some((attribute::RESOURCE, self.info.resource.as_str())),
            self.namespace
                .as_deref()
                .map(|ns| (attribute::NAMESPACE, ns)),
            Some((attribute::NAME, self.name.as_str())),
            Some((attribute::UID, self.uid.as_str())),
            Some((attribute::RESOURCEVERSION, self.resource_version.as_str())),
            Some((attribute::SEQUENCE, self.sequence.as_str())),
            Some((attribute::PARTITIONKEY, self.key())),
            Some((attribute::ORIGIN, self.origin.as_str())),
            self.snapshot
                .as_deref()
                .map(|id| (attribute::SNAPSHOTID, id)),
            Some((attribute::PAYLOAD, self.payload.as_str())),
            self.truncated.then_some((attribute::TRUNCATED, "true")),
            self.author
                .as_ref()
                .map(|a| (attribute::MANAGER, a.manager.as_str())),
            self.author
                .as_ref()
                .and_then(|a| a.operation)
                .map(|o| (attribute::OPERATION, o.as_str())),
            self.info
                .cluster_id
                .as_deref()
                .map(|id| (attribute::CLUSTERID, id)),
            Some((attribute::TRACEPARENT, self.trace.traceparent())),
            self.trace
                .tracestate()
                .map(|state| (attribute::TRACESTATE, state)),
        ]
        .into_iter()
        .flatten()
    }

    /// The structured-mode document: every attribute, `datacontenttype` and `data`.
    pub fn to_structured_json(&self) -> Vec<u8> {
        // Room for every attribute beside the data, so the buffer is not grown while writing.
        let mut out = Vec::with_capacity(self.data.len() + 768);
        out.push(b'{');
        let content_type = [(attribute::DATACONTENTTYPE, DATA_CONTENT_TYPE)];
        for (name, value) in self.attributes().chain(content_type) {
            push_json_string(&mut out, name);
            out.push(b':');
            push_json_string(&mut out, value);
            out.push(b',');
        }
        push_json_string(&mut out, attribute::DATA);
        out.push(b':');
        out.extend_from_slice(&self.data);
        out.push(b'}');
        out
    }

    /// `namespace/name uid@resourceVersion`, for logs.
    pub fn reference(&self) -> String {
        format!(
            "{} {}@{}",
            self.namespace
                .as_deref()
                .map_or_else(|| self.name.clone(), |ns| format!("{ns}/{}", self.name)),
            self.uid,
            self.resource_version
        )
    }

    /// Replaces the payload by a reference and marks the event truncated: what is published
    /// when the whole event exceeds the broker's message size.
    pub fn truncate(&mut self) {
        self.data = reference_document(
            &self.info,
            self.namespace.as_deref(),
            &self.name,
            &self.uid,
            &self.resource_version,
        );
        self.payload = Mode::Reference;
        self.truncated = true;
    }
}

fn push_json_string(out: &mut Vec<u8>, s: &str) {
    // Serializing a &str into a Vec cannot fail.
    serde_json::to_writer(&mut *out, s).expect("string serializes");
}

/// The reference payload: this bridge's (`apiVersion`, `kind`, `namespace`, `name`, `uid`,
/// `resourceVersion`) or Knative's (`apiVersion`, `kind`, `name`, `namespace`).
fn reference_document(
    info: &ResourceInfo,
    namespace: Option<&str>,
    name: &str,
    uid: &str,
    resource_version: &str,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    let field = |out: &mut Vec<u8>, key: &str, value: &str| {
        out.push(if out.is_empty() { b'{' } else { b',' });
        push_json_string(out, key);
        out.push(b':');
        push_json_string(out, value);
    };
    field(&mut out, "apiVersion", &info.api_version);
    field(&mut out, "kind", &info.kind);
    match info.format {
        EventFormat::Knative => {
            field(&mut out, "name", name);
            if let Some(ns) = namespace {
                field(&mut out, "namespace", ns);
            }
        }
        EventFormat::Cloudevents => {
            if let Some(ns) = namespace {
                field(&mut out, "namespace", ns);
            }
            field(&mut out, "name", name);
            field(&mut out, "uid", uid);
            field(&mut out, "resourceVersion", resource_version);
        }
    }
    out.push(b'}');
    out
}

/// What encoding one change produced.
#[derive(Debug)]
pub struct Encoded {
    /// The event.
    pub event: Event,
    /// Diff mode: the object as published, to diff the next version against.
    pub object: Option<Vec<u8>>,
    /// Why the object's trace context annotation was ignored, if it was.
    pub trace_error: Option<trace::context::Error>,
}

/// Encodes one change of a resource described by `info`. Takes the change by value: the object
/// is edited in place (managedFields, last-applied, redaction) and serialized once, never
/// cloned. `previous` is the last published version of the object (diff mode).
pub fn encode(
    info: &Arc<ResourceInfo>,
    change: Change,
    previous: Option<&[u8]>,
) -> Result<Encoded, Error> {
    let Change {
        kind,
        origin,
        mut object,
        observed,
    } = change;
    let meta = &object.metadata;
    let name = meta.name.clone().unwrap_or_default();
    let missing = |field| Error::MissingMetadata {
        name: name.clone(),
        field,
    };
    let uid = meta.uid.clone().ok_or_else(|| missing("uid"))?;
    let resource_version = meta
        .resource_version
        .clone()
        .ok_or_else(|| missing("resourceVersion"))?;
    if name.is_empty() {
        return Err(missing("name"));
    }
    let namespace = meta.namespace.clone();
    let (trace, trace_error) = trace_context(info, meta.annotations.as_ref());
    // Before `clean` strips managedFields.
    let author = if info.audit {
        meta.managed_fields.as_deref().and_then(audit::author)
    } else {
        None
    };
    let (payload, data, published) = match info.payload {
        Mode::Reference => (
            Mode::Reference,
            reference_document(info, namespace.as_deref(), &name, &uid, &resource_version),
            None,
        ),
        mode => {
            clean(info, &mut object);
            let bytes = serde_json::to_vec(&object).map_err(|source| Error::Serialize {
                name: name.clone(),
                source,
            })?;
            if mode == Mode::Diff {
                let previous = previous.filter(|_| kind == ChangeKind::Modified);
                let doc = payload::diff_document(&bytes, previous, info.include_previous);
                (Mode::Diff, doc, Some(bytes))
            } else {
                (Mode::Full, bytes, None)
            }
        }
    };
    let namespaced_name = || match &namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.clone(),
    };
    let subject = match info.format {
        EventFormat::Knative => knative::subject(
            &info.api_version,
            namespace.as_deref(),
            &info.knative_plural,
            &name,
        ),
        EventFormat::Cloudevents => namespaced_name(),
    };
    let key = (info.key == RecordKey::NamespacedName).then(namespaced_name);
    Ok(Encoded {
        event: Event {
            id: event_id(&uid, &resource_version, kind),
            kind,
            origin,
            snapshot: None,
            info: info.clone(),
            subject,
            time: rfc3339(observed),
            namespace,
            sequence: sequence(&resource_version),
            name,
            uid,
            key,
            resource_version,
            payload,
            truncated: false,
            author,
            trace,
            data,
            received: monotonic(observed),
            budget: None,
        },
        object: published,
        trace_error,
    })
}

/// The event's trace context: a child of the one the object's annotations name, or a new trace
/// when they name none or an invalid one (the error says why it was ignored). An invalid
/// `tracestate` is dropped and the `traceparent` kept.
fn trace_context(
    info: &ResourceInfo,
    annotations: Option<&BTreeMap<String, String>>,
) -> (TraceContext, Option<trace::context::Error>) {
    let mut rng = rand::rng();
    let annotation = |key: &String| annotations.and_then(|a| a.get(key));
    let parent = annotation(&info.traceparent_annotation).map(|v| Parent::parse(v));
    match parent {
        None => (TraceContext::root(&mut rng), None),
        Some(Err(e)) => (TraceContext::root(&mut rng), Some(e)),
        Some(Ok(parent)) => {
            let state =
                annotation(&info.tracestate_annotation).map(|v| trace::context::parse_state(v));
            let (state, error) = match state {
                None => (None, None),
                Some(Ok(state)) => (Some(state.to_string()), None),
                Some(Err(e)) => (None, Some(e)),
            };
            (TraceContext::child(parent, state, &mut rng), error)
        }
    }
}

/// Strips and redacts what the resource asks for, in place.
fn clean(info: &ResourceInfo, object: &mut DynamicObject) {
    if info.strip_managed_fields {
        object.metadata.managed_fields = None;
    }
    if info.strip_last_applied
        && let Some(annotations) = object.metadata.annotations.as_mut()
    {
        annotations.remove(LAST_APPLIED);
    }
    if info.redact_secret_data {
        redact_secret(object);
    }
    for p in &info.redact {
        p.redact(object);
    }
}

/// The deterministic event id: the same (uid, resourceVersion, change) always gives the same id,
/// and different changes never share one, because a resourceVersion names one write.
pub fn event_id(uid: &str, resource_version: &str, kind: ChangeKind) -> String {
    format!("{uid}:{resource_version}:{}", kind.as_str())
}

/// A resourceVersion zero-padded to 20 digits, so that it sorts as a string. A resourceVersion
/// that is not a decimal integer (aggregated APIs) is passed through unchanged.
pub fn sequence(resource_version: &str) -> String {
    if !resource_version.is_empty()
        && resource_version.len() <= 20
        && resource_version.bytes().all(|b| b.is_ascii_digit())
    {
        format!("{resource_version:0>20}")
    } else {
        resource_version.to_string()
    }
}

/// The instant of `t` (a recent wall-clock time) on the monotonic clock.
fn monotonic(t: SystemTime) -> Instant {
    let now = Instant::now();
    let ago = SystemTime::now().duration_since(t).unwrap_or_default();
    now.checked_sub(ago).unwrap_or(now)
}

fn rfc3339(t: SystemTime) -> String {
    OffsetDateTime::from(t)
        .format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

/// Replaces the values of `data` and `stringData` (keys stay) and the last-applied annotation,
/// which holds the same data in clear.
fn redact_secret(object: &mut DynamicObject) {
    for field in ["data", "stringData"] {
        if let Some(Value::Object(map)) = object.data.get_mut(field) {
            for v in map.values_mut() {
                *v = Value::String(REDACTED.into());
            }
        }
    }
    if let Some(annotations) = object.metadata.annotations.as_mut()
        && let Some(v) = annotations.get_mut(LAST_APPLIED)
    {
        *v = REDACTED.into();
    }
}

/// What a heartbeat says about one watch.
#[derive(Debug)]
pub struct HeartbeatReport<'a> {
    /// The watch's id (the heartbeat's id prefix).
    pub watch_id: &'a str,
    /// The watch's description (`subject`).
    pub watch: &'a str,
    /// The resourceVersion of the last checkpoint.
    pub checkpoint: &'a str,
    /// The resourceVersion the watch has reached.
    pub position: &'a str,
    /// Events queued or awaiting acknowledgement.
    pub queue_depth: u64,
}

/// Encodes a heartbeat as a structured CloudEvent (`io.kubeeventbridge.heartbeat`) sent at
/// `now`: the checkpoint's resourceVersion, the position, and the lag between them when both
/// are numeric.
pub fn heartbeat(
    info: &ResourceInfo,
    report: &HeartbeatReport<'_>,
    now: OffsetDateTime,
) -> Vec<u8> {
    let lag = report
        .position
        .parse::<u64>()
        .ok()
        .zip(report.checkpoint.parse::<u64>().ok())
        .map(|(p, c)| p.saturating_sub(c));
    let event = serde_json::json!({
        (attribute::SPECVERSION): "1.0",
        (attribute::ID): format!("{}:{}:{}", report.watch_id, report.checkpoint, now.unix_timestamp()),
        (attribute::SOURCE): info.source,
        (attribute::TYPE): "io.kubeeventbridge.heartbeat",
        (attribute::TIME): now.format(&Rfc3339).unwrap_or_default(),
        (attribute::SUBJECT): report.watch,
        (attribute::CLUSTER): &*info.cluster,
        (attribute::RESOURCE): info.resource,
        (attribute::DATACONTENTTYPE): DATA_CONTENT_TYPE,
        (attribute::DATA): {
            "watch": report.watch,
            "checkpointResourceVersion": report.checkpoint,
            "positionResourceVersion": report.position,
            "lagResourceVersions": lag,
            "queueDepth": report.queue_depth,
        },
    });
    // A map of strings and integers always serializes.
    serde_json::to_vec(&event).expect("heartbeat serializes")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config;
    use kube::api::ObjectMeta;
    use kube::discovery::ApiResource;
    use serde_json::json;
    use std::collections::BTreeMap;

    pub(crate) fn info(
        group: &str,
        version: &str,
        kind: &str,
        plural: &str,
        namespaced: bool,
    ) -> Arc<ResourceInfo> {
        info_with(group, version, kind, plural, namespaced, "")
    }

    /// A resource configured with `extra` (`, payload: diff`) added to its entry.
    fn info_with(
        group: &str,
        version: &str,
        kind: &str,
        plural: &str,
        namespaced: bool,
        extra: &str,
    ) -> Arc<ResourceInfo> {
        let api_version = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        let yaml = format!(
            "cluster: dev\nresources: [{{apiVersion: {api_version}, resource: {plural}{extra}}}]\nsink: {{kafka: {{bootstrapServers: 'x:1'}}}}\n"
        );
        let config = config::ConfigFile::parse(&yaml)
            .unwrap()
            .validate()
            .unwrap();
        let resolved = ResolvedResource {
            config: config.resources[0].clone(),
            api: ApiResource {
                group: group.into(),
                version: version.into(),
                api_version,
                kind: kind.into(),
                plural: plural.into(),
            },
            namespaced,
        };
        Arc::new(ResourceInfo::new(
            "dev",
            &resolved,
            "https://127.0.0.1:6443/",
        ))
    }

    /// ConfigMaps configured with `extra`.
    pub(crate) fn configmaps(extra: &str) -> Arc<ResourceInfo> {
        info_with("", "v1", "ConfigMap", "configmaps", true, extra)
    }

    fn encode(info: &Arc<ResourceInfo>, change: Change) -> Result<Event, Error> {
        super::encode(info, change, None).map(|e| e.event)
    }

    fn object(ns: Option<&str>, data: Value) -> DynamicObject {
        let mut obj = DynamicObject {
            types: None,
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: ns.map(Into::into),
                uid: Some("1b4e28ba-2fa1-11d2-883f-0016d3cca427".into()),
                resource_version: Some("4711".into()),
                managed_fields: Some(vec![Default::default()]),
                annotations: Some(BTreeMap::from([(
                    LAST_APPLIED.to_string(),
                    "{\"data\":{\"k\":\"c2VjcmV0\"}}".to_string(),
                )])),
                ..Default::default()
            },
            data,
        };
        obj.types = Some(kube::api::TypeMeta {
            api_version: "v1".into(),
            kind: "Secret".into(),
        });
        obj
    }

    fn change(kind: ChangeKind, obj: DynamicObject) -> Change {
        Change {
            kind,
            origin: Origin::Live,
            object: obj,
            observed: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn attributes_and_extensions() {
        let i = info("apps", "v1", "Deployment", "deployments", true);
        let ev = encode(
            &i,
            change(
                ChangeKind::Modified,
                object(Some("team-a"), json!({"spec": {}})),
            ),
        )
        .unwrap();
        let attrs: BTreeMap<_, _> = ev.attributes().collect();
        assert_eq!(
            attrs["id"],
            "1b4e28ba-2fa1-11d2-883f-0016d3cca427:4711:modified"
        );
        assert_eq!(attrs["source"], "/k8s/dev/apis/apps/v1/deployments");
        assert_eq!(attrs["type"], "io.kubeeventbridge.object.modified");
        assert_eq!(attrs["subject"], "team-a/web");
        assert_eq!(attrs["time"], "1970-01-01T00:00:00Z");
        assert_eq!(attrs["sequence"], "00000000000000004711");
        assert_eq!(attrs["partitionkey"], attrs["uid"]);
        assert_eq!(attrs["apiversion"], "apps/v1");
        assert_eq!(attrs["kind"], "Deployment");
        assert_eq!(attrs["namespace"], "team-a");
        assert_eq!(attrs["origin"], "live");
        for name in attrs.keys() {
            assert!(
                name.len() <= 20
                    && name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
                "{name}"
            );
        }
        let data: Value = serde_json::from_slice(&ev.data).unwrap();
        assert!(data["metadata"].get("managedFields").is_none());
        assert_eq!(data["spec"], json!({}));
    }

    #[test]
    fn ids_are_deterministic_and_distinct() {
        let i = info("", "v1", "ConfigMap", "configmaps", true);
        let a = encode(&i, change(ChangeKind::Added, object(Some("ns"), json!({})))).unwrap();
        let b = encode(&i, change(ChangeKind::Added, object(Some("ns"), json!({})))).unwrap();
        let c = encode(
            &i,
            change(ChangeKind::Deleted, object(Some("ns"), json!({}))),
        )
        .unwrap();
        assert_eq!(a.id, b.id);
        assert_ne!(a.id, c.id);
        assert_eq!(a.info.source, "/k8s/dev/api/v1/configmaps");
    }

    #[test]
    fn secrets_are_redacted_keys_kept() {
        let i = info("", "v1", "Secret", "secrets", true);
        let ev = encode(&i, change(ChangeKind::Added, object(Some("ns"), json!({"data": {"password": "c2VjcmV0"}, "stringData": {"token": "plain"}, "type": "Opaque"})))).unwrap();
        let text = String::from_utf8(ev.data).unwrap();
        assert!(
            !text.contains("c2VjcmV0") && !text.contains("plain"),
            "{text}"
        );
        let data: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(data["data"]["password"], REDACTED);
        assert_eq!(data["stringData"]["token"], REDACTED);
        assert!(data["metadata"]["annotations"].get(LAST_APPLIED).is_none());
        assert_eq!(data["type"], "Opaque");
        // Kept on request, the annotation (which holds the data in clear) is still redacted.
        let i = info_with(
            "",
            "v1",
            "Secret",
            "secrets",
            true,
            ", stripLastApplied: false",
        );
        let ev = encode(
            &i,
            change(
                ChangeKind::Added,
                object(Some("ns"), json!({"data": {"password": "c2VjcmV0"}})),
            ),
        )
        .unwrap();
        let data: Value = serde_json::from_slice(&ev.data).unwrap();
        assert_eq!(data["metadata"]["annotations"][LAST_APPLIED], REDACTED);
    }

    #[test]
    fn non_secrets_are_not_redacted() {
        let i = info("", "v1", "ConfigMap", "configmaps", true);
        let ev = encode(
            &i,
            change(
                ChangeKind::Added,
                object(Some("ns"), json!({"data": {"k": "v"}})),
            ),
        )
        .unwrap();
        let data: Value = serde_json::from_slice(&ev.data).unwrap();
        assert_eq!(data["data"]["k"], "v");
    }

    #[test]
    fn structured_form_is_a_valid_cloudevent() {
        let i = info("stable.example.com", "v1", "CronTab", "crontabs", false);
        let ev = encode(
            &i,
            change(
                ChangeKind::Deleted,
                object(None, json!({"spec": {"x": "\"quoted\""}})),
            ),
        )
        .unwrap();
        let parsed: cloudevents::Event = serde_json::from_slice(&ev.to_structured_json()).unwrap();
        use cloudevents::AttributesReader;
        assert_eq!(parsed.id(), ev.id);
        assert_eq!(parsed.subject(), Some("web"));
        assert_eq!(parsed.datacontenttype(), Some("application/json"));
        assert!(parsed.extension("namespace").is_none());
        assert_eq!(
            parsed.extension("cluster").map(|v| v.to_string()),
            Some("dev".into())
        );
    }

    #[test]
    fn missing_uid_is_an_error_naming_the_object() {
        let i = info("", "v1", "ConfigMap", "configmaps", true);
        let mut obj = object(Some("ns"), json!({}));
        obj.metadata.uid = None;
        let err = encode(&i, change(ChangeKind::Added, obj)).unwrap_err();
        assert_eq!(err.to_string(), "object \"web\" has no metadata.uid");
    }

    #[test]
    fn types_share_the_documented_prefix() {
        let i = info("", "v1", "ConfigMap", "configmaps", true);
        for kind in [ChangeKind::Added, ChangeKind::Modified, ChangeKind::Deleted] {
            let ev = encode(&i, change(kind, object(Some("ns"), json!({})))).unwrap();
            assert_eq!(ev.event_type(), format!("{TYPE_PREFIX}{}", kind.as_str()));
        }
    }

    #[test]
    fn last_applied_is_stripped_and_pointers_redacted() {
        let i = configmaps(", redact: ['/data/password', '/metadata/labels/owner']");
        let mut obj = object(Some("ns"), json!({"data": {"password": "p", "user": "u"}}));
        obj.metadata.labels = Some(BTreeMap::from([("owner".to_string(), "alice".to_string())]));
        let ev = encode(&i, change(ChangeKind::Added, obj)).unwrap();
        let data: Value = serde_json::from_slice(&ev.data).unwrap();
        assert_eq!(data["data"]["password"], REDACTED);
        assert_eq!(data["data"]["user"], "u");
        assert_eq!(data["metadata"]["labels"]["owner"], REDACTED);
        assert!(data["metadata"]["annotations"].get(LAST_APPLIED).is_none());
    }

    #[test]
    fn reference_payload_and_namespaced_name_key() {
        let i = info_with(
            "apps",
            "v1",
            "Deployment",
            "deployments",
            true,
            ", payload: reference, key: namespacedName",
        );
        let ev = encode(
            &i,
            change(ChangeKind::Modified, object(Some("a"), json!({"spec": {}}))),
        )
        .unwrap();
        let data: Value = serde_json::from_slice(&ev.data).unwrap();
        assert_eq!(
            data,
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "a", "name": "web",
                   "uid": "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "resourceVersion": "4711"})
        );
        let attrs: BTreeMap<_, _> = ev.attributes().collect();
        assert_eq!(attrs["payload"], "reference");
        assert_eq!(attrs["partitionkey"], "a/web");
        assert_eq!(ev.key(), "a/web");
    }

    #[test]
    fn diff_payload_patches_the_previous_version() {
        let i = configmaps(", payload: diff, includePrevious: true");
        let first = super::encode(
            &i,
            change(
                ChangeKind::Added,
                object(Some("a"), json!({"data": {"k": "1"}})),
            ),
            None,
        )
        .unwrap();
        let before = first.object.clone().unwrap();
        let first: Value = serde_json::from_slice(&first.event.data).unwrap();
        assert_eq!(
            first["patch"],
            Value::Null,
            "an add has nothing to diff against"
        );
        let mut next = object(Some("a"), json!({"data": {"k": "2", "n": "x"}}));
        next.metadata.resource_version = Some("4712".into());
        let second = super::encode(&i, change(ChangeKind::Modified, next), Some(&before)).unwrap();
        let doc: Value = serde_json::from_slice(&second.event.data).unwrap();
        let mut patched: Value = serde_json::from_slice(&before).unwrap();
        let patch: json_patch::Patch = serde_json::from_value(doc["patch"].clone()).unwrap();
        json_patch::patch(&mut patched, &patch).unwrap();
        assert_eq!(patched, doc["object"]);
        assert_eq!(
            doc["previous"],
            serde_json::from_slice::<Value>(&before).unwrap()
        );
        assert_eq!(second.event.payload, Mode::Diff);
    }

    #[test]
    fn knative_shape() {
        let i = configmaps(", eventFormat: knative");
        let ev = encode(
            &i,
            change(ChangeKind::Modified, object(Some("team-a"), json!({}))),
        )
        .unwrap();
        let attrs: BTreeMap<_, _> = ev.attributes().collect();
        assert_eq!(attrs["type"], "dev.knative.apiserver.resource.update");
        assert_eq!(attrs["source"], "https://127.0.0.1:6443");
        assert_eq!(
            attrs["subject"],
            "/apis/v1/namespaces/team-a/configmaps/web"
        );
        assert_eq!(attrs["kind"], "ConfigMap");
        assert_eq!(attrs["apiversion"], "v1");
        assert_eq!(attrs["name"], "web");
        assert_eq!(attrs["namespace"], "team-a");
        assert_eq!(
            attrs["id"],
            "1b4e28ba-2fa1-11d2-883f-0016d3cca427:4711:modified"
        );
        assert!(!attrs.contains_key("dataschema"));
        let i = configmaps(", eventFormat: knative, payload: reference");
        let ev = encode(
            &i,
            change(ChangeKind::Deleted, object(Some("team-a"), json!({}))),
        )
        .unwrap();
        assert_eq!(ev.event_type(), "dev.knative.apiserver.ref.delete");
        let data: Value = serde_json::from_slice(&ev.data).unwrap();
        assert_eq!(
            data,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "web", "namespace": "team-a"})
        );
    }

    #[test]
    fn truncation_keeps_identity_and_says_so() {
        let i = info("", "v1", "ConfigMap", "configmaps", true);
        let mut ev = encode(
            &i,
            change(
                ChangeKind::Added,
                object(Some("a"), json!({"data": {"big": "x".repeat(4096)}})),
            ),
        )
        .unwrap();
        ev.truncate();
        assert!(ev.data.len() < 300);
        let attrs: BTreeMap<_, _> = ev.attributes().collect();
        assert_eq!(attrs["truncated"], "true");
        assert_eq!(attrs["payload"], "reference");
        assert_eq!(
            attrs["id"],
            "1b4e28ba-2fa1-11d2-883f-0016d3cca427:4711:added"
        );
        let data: Value = serde_json::from_slice(&ev.data).unwrap();
        assert_eq!(data["name"], "web");
        assert_eq!(data["resourceVersion"], "4711");
    }

    #[test]
    fn every_shape_matches_the_published_event_schema() {
        for extra in [
            "",
            ", payload: reference",
            ", payload: diff, includePrevious: true",
            ", eventFormat: knative",
            ", key: namespacedName",
        ] {
            let i = info_with("", "v1", "ConfigMap", "configmaps", true, extra);
            let mut ev = encode(
                &i,
                change(ChangeKind::Modified, object(Some("a"), json!({}))),
            )
            .unwrap();
            for _ in 0..2 {
                let doc = ev.to_structured_json();
                let parsed: crate::schema::EventEnvelope = serde_json::from_slice(&doc)
                    .unwrap_or_else(|e| panic!("{extra}: {e}: {}", String::from_utf8_lossy(&doc)));
                assert_eq!(parsed.payload, ev.payload.as_str());
                ev.truncate();
            }
        }
    }

    /// W3C's example `traceparent`, and a `tracestate`.
    const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const TRACESTATE: &str = "congo=t61rcWkgMzE";

    /// `o` with the default trace context annotations set to `traceparent` and `tracestate`.
    fn traced(mut o: DynamicObject, traceparent: &str, tracestate: &str) -> DynamicObject {
        let annotations = o.metadata.annotations.get_or_insert_with(BTreeMap::new);
        annotations.insert("tracing.k8s.io/traceparent".into(), traceparent.into());
        annotations.insert("tracing.k8s.io/tracestate".into(), tracestate.into());
        o
    }

    /// A ConfigMap written by `kubectl` (Apply) and then by `ctl` (Update, later), in a traced
    /// request.
    fn managed_object() -> DynamicObject {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};
        let entry = |manager: &str, operation: &str, time: &str| ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            time: Some(Time(time.parse().unwrap())),
            ..Default::default()
        };
        let mut o = object(Some("a"), json!({"data": {"k": "v"}}));
        o.metadata.managed_fields = Some(vec![
            entry("kubectl", "Apply", "2025-11-21T14:03:20Z"),
            entry("ctl", "Update", "2025-11-21T14:03:27Z"),
        ]);
        traced(o, TRACEPARENT, TRACESTATE)
    }

    fn encoded(info: &Arc<ResourceInfo>, o: DynamicObject) -> Encoded {
        super::encode(info, change(ChangeKind::Modified, o), None).unwrap()
    }

    #[test]
    fn the_event_span_is_a_child_of_the_annotated_context() {
        let i = configmaps("");
        let e = encoded(
            &i,
            traced(object(Some("a"), json!({})), TRACEPARENT, TRACESTATE),
        );
        assert_eq!(e.trace_error, None);
        let attrs: BTreeMap<_, _> = e.event.attributes().collect();
        let traceparent = attrs["traceparent"];
        assert!(traceparent.starts_with("00-0af7651916cd43dd8448eb211c80319c-"));
        assert!(traceparent.ends_with("-01"), "{traceparent}");
        assert_ne!(&traceparent[36..52], "b7ad6b7169203331");
        assert_eq!(attrs["tracestate"], TRACESTATE);
        let parent = e.event.trace.parent().unwrap();
        assert_eq!(parent, Parent::parse(TRACEPARENT).unwrap());
    }

    #[test]
    fn without_an_annotation_every_change_starts_a_new_trace() {
        let i = configmaps("");
        let a = encoded(&i, object(Some("a"), json!({}))).event;
        let b = encoded(&i, object(Some("a"), json!({}))).event;
        assert_ne!(a.trace.trace_id(), b.trace.trace_id());
        assert!(a.trace.traceparent().ends_with("-00"));
        assert_eq!(a.trace.parent(), None);
        let attrs: BTreeMap<_, _> = a.attributes().collect();
        assert!(!attrs.contains_key("tracestate"));
    }

    #[test]
    fn an_invalid_annotation_is_ignored_and_says_why() {
        let i = configmaps("");
        let bad = encoded(
            &i,
            traced(object(Some("a"), json!({})), "00-xyz", TRACESTATE),
        );
        assert_eq!(bad.trace_error, Some(trace::context::Error::Malformed));
        assert_eq!(bad.event.trace.parent(), None);
        assert_eq!(bad.event.trace.tracestate(), None);
        let state = encoded(
            &i,
            traced(object(Some("a"), json!({})), TRACEPARENT, "nokey"),
        );
        assert_eq!(state.trace_error, Some(trace::context::Error::State));
        assert!(state.event.trace.parent().is_some());
        assert_eq!(state.event.trace.tracestate(), None);
    }

    #[test]
    fn a_configured_annotation_is_read_instead_of_the_default() {
        let i = configmaps(", traceparentAnnotation: example.com/trace");
        let default_only = encoded(
            &i,
            traced(object(Some("a"), json!({})), TRACEPARENT, TRACESTATE),
        );
        assert_eq!(default_only.event.trace.parent(), None);
        let mut o = object(Some("a"), json!({}));
        let annotations = o.metadata.annotations.get_or_insert_with(BTreeMap::new);
        annotations.insert("example.com/trace".into(), TRACEPARENT.into());
        let e = encoded(&i, o);
        assert_eq!(
            e.event.trace.trace_id(),
            Parent::parse(TRACEPARENT).unwrap().trace_id
        );
    }

    #[test]
    fn audit_extensions_name_the_newest_writer_in_every_shape() {
        const UID: &str = "0a9c7e52-6b0e-4c4f-9d1e-3f2a1b0c9d8e";
        for extra in [
            "",
            ", payload: reference",
            ", payload: diff",
            ", eventFormat: knative",
        ] {
            let plain = info_with("", "v1", "ConfigMap", "configmaps", true, extra);
            let audited = Arc::new(
                Arc::into_inner(info_with("", "v1", "ConfigMap", "configmaps", true, extra))
                    .unwrap()
                    .with_audit(UID.into()),
            );
            for kind in [ChangeKind::Added, ChangeKind::Deleted] {
                let mut ev = encode(&audited, change(kind, managed_object())).unwrap();
                for _ in 0..2 {
                    let attrs: BTreeMap<_, _> = ev.attributes().collect();
                    assert_eq!(attrs["manager"], "ctl", "{extra}");
                    assert_eq!(attrs["operation"], "Update", "{extra}");
                    assert_eq!(attrs["clusterid"], UID, "{extra}");
                    assert_static_headers(&ev);
                    let doc = ev.to_structured_json();
                    let parsed: crate::schema::EventEnvelope =
                        serde_json::from_slice(&doc).unwrap_or_else(|e| panic!("{extra}: {e}"));
                    assert_eq!(parsed.manager.as_deref(), Some("ctl"));
                    let text = String::from_utf8(ev.data.clone()).unwrap();
                    assert!(!text.contains("managedFields"), "{extra}: {text}");
                    ev.truncate();
                }
                let ev = encode(&plain, change(kind, managed_object())).unwrap();
                let attrs: BTreeMap<_, _> = ev.attributes().collect();
                for name in ["manager", "operation", "clusterid"] {
                    assert!(!attrs.contains_key(name), "{extra}: {name} with audit off");
                }
            }
        }
    }

    /// Every attribute the event carries has its header names spelled at compile time.
    fn assert_static_headers(ev: &Event) {
        for (name, _) in ev.attributes() {
            for separator in ['-', '_'] {
                let header = ce_header(name, separator);
                assert!(
                    matches!(header, Cow::Borrowed(_)),
                    "{name}: add it to attribute::CARRIED"
                );
                assert_eq!(header, format!("ce{separator}{name}"));
            }
        }
    }

    #[test]
    fn binary_headers_are_prefixed_names_and_values_percent_encoded() {
        assert_eq!(ce_header("resourceversion", '-'), "ce-resourceversion");
        assert_eq!(ce_header("resourceversion", '_'), "ce_resourceversion");
        assert_eq!(
            ce_header("future", '-'),
            "ce-future",
            "unknown names are formatted"
        );
        assert!(matches!(header_value("plain-value_1.2"), Cow::Borrowed(_)));
        assert_eq!(header_value("a b\"%\né"), "a%20b%22%25%0A%C3%A9");
    }

    #[test]
    fn the_reserved_names_are_what_events_carry() {
        // An event with every attribute: this bridge's format (dataschema), a namespaced
        // object, the audit extensions, truncated.
        let audited = Arc::new(
            Arc::into_inner(configmaps(""))
                .unwrap()
                .with_audit("uid-1".into()),
        );
        let mut ev = encode(&audited, change(ChangeKind::Modified, managed_object())).unwrap();
        ev.truncate();
        ev.for_snapshot("5f0c".into());
        let carried: Vec<&str> = ev.attributes().map(|(name, _)| name).collect();
        assert_eq!(carried, attribute::CARRIED);
        // Its structured document has every reserved name as a member but `data_base64`,
        // which the bridge never writes.
        let doc: serde_json::Map<String, Value> =
            serde_json::from_slice(&ev.to_structured_json()).unwrap();
        let mut members: Vec<&str> = doc.keys().map(String::as_str).collect();
        members.push(attribute::DATA_BASE64);
        members.sort_unstable();
        let mut reserved = attribute::RESERVED.to_vec();
        reserved.sort_unstable();
        assert_eq!(members, reserved);
    }

    #[test]
    fn without_managed_fields_only_the_cluster_id_is_carried() {
        // A repaired delete's object is a reference: no managedFields.
        let audited = Arc::new(
            Arc::into_inner(configmaps(""))
                .unwrap()
                .with_audit("uid-1".into()),
        );
        let mut o = object(Some("a"), json!({}));
        o.metadata.managed_fields = None;
        let ev = encode(&audited, change(ChangeKind::Deleted, o)).unwrap();
        let attrs: BTreeMap<_, _> = ev.attributes().collect();
        assert_eq!(attrs["clusterid"], "uid-1");
        assert!(!attrs.contains_key("manager") && !attrs.contains_key("operation"));
        let report = HeartbeatReport {
            watch_id: "w",
            watch: "w",
            checkpoint: "1",
            position: "1",
            queue_depth: 0,
        };
        let now = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        let doc: Value = serde_json::from_slice(&heartbeat(&audited, &report, now)).unwrap();
        for name in ["manager", "operation", "clusterid"] {
            assert!(doc.get(name).is_none(), "heartbeats carry no {name}");
        }
    }

    #[test]
    fn a_heartbeat_reports_checkpoint_position_and_lag() {
        let info = configmaps("");
        let report = HeartbeatReport {
            watch_id: "dev.v1.configmaps.all",
            watch: "v1/configmaps in all namespaces",
            checkpoint: "100",
            position: "142",
            queue_depth: 3,
        };
        let now = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        let doc: Value = serde_json::from_slice(&heartbeat(&info, &report, now)).unwrap();
        assert_eq!(
            doc,
            json!({
                "specversion": "1.0",
                "id": "dev.v1.configmaps.all:100:1700000000",
                "source": "/k8s/dev/api/v1/configmaps",
                "type": "io.kubeeventbridge.heartbeat",
                "time": "2023-11-14T22:13:20Z",
                "subject": "v1/configmaps in all namespaces",
                "cluster": "dev",
                "resource": "configmaps",
                "datacontenttype": "application/json",
                "data": {
                    "watch": "v1/configmaps in all namespaces",
                    "checkpointResourceVersion": "100",
                    "positionResourceVersion": "142",
                    "lagResourceVersions": 42,
                    "queueDepth": 3,
                },
            })
        );
        let opaque = HeartbeatReport {
            position: "abc",
            ..report
        };
        let doc: Value = serde_json::from_slice(&heartbeat(&info, &opaque, now)).unwrap();
        assert_eq!(doc["data"]["lagResourceVersions"], Value::Null);
    }

    #[test]
    fn sequence_pads_numbers_only() {
        assert_eq!(sequence("12"), "00000000000000000012");
        assert_eq!(sequence("abc"), "abc");
    }
}
