//! One `resources[]` entry: what to watch (a resource, or a wildcard over groups and resources
//! with exclusions), where (namespaces, a namespace label selector), and what its events carry
//! (payload mode, redaction, noise control, routing, event format).

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::names::{is_dns_label, is_dns_subdomain, is_qualified_name, is_version};
use crate::change::ChangeKind;
use crate::payload::{self, Pointer};
use crate::template::Template;

/// The default of flags that are on unless turned off.
pub(super) const fn default_true() -> bool {
    true
}

/// One watched resource, or a wildcard over many.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ResourceConfig {
    /// `v1`, `apps/v1`, `stable.example.com/v1`: as in manifests. Wildcards: `example.com/*`
    /// (the preferred version of each resource), `*.example.com/*` (every group matching the
    /// pattern); then `resource` must be `"*"` or a name.
    pub api_version: String,
    /// The plural resource name (`configmaps`); a kind name (`ConfigMap`) is resolved through
    /// discovery; `"*"` is every watchable resource of the group(s).
    pub resource: String,
    /// Resources a wildcard entry leaves out (Events and Leases are typical).
    #[serde(default)]
    pub exclude: Vec<ExcludeConfig>,
    /// In a fleet, the clusters whose resource this entry watches (their names); default: every
    /// cluster.
    pub clusters: Option<Vec<String>>,
    /// Namespaces to watch; omitted: all namespaces (or the cluster-scoped resource).
    pub namespaces: Option<Vec<String>>,
    /// Watch only namespaces whose labels match this selector (`team=payments`), following
    /// namespaces that gain or lose the labels at run time. Excludes `namespaces`.
    pub namespace_selector: Option<String>,
    /// A label selector, applied by the API server.
    pub label_selector: Option<String>,
    /// A field selector, applied by the API server.
    pub field_selector: Option<String>,
    /// Which changes to publish; default all three.
    pub events: Option<Vec<ChangeKind>>,
    /// What `data` carries: `full` (default), `reference` or `diff`.
    #[serde(default)]
    pub payload: payload::Mode,
    /// Diff mode: also carry the previous version of the object.
    #[serde(default)]
    pub include_previous: bool,
    /// JSON pointers (`/status`) whose changes alone do not make an update worth publishing;
    /// such updates still advance the checkpoint.
    #[serde(default)]
    pub ignore_paths: Vec<String>,
    /// Drop updates that change nothing but `resourceVersion` and `managedFields` (resyncs,
    /// no-op applies). Default true.
    #[serde(default = "default_true")]
    pub drop_unchanged_updates: bool,
    /// JSON pointers whose values are replaced by `<redacted>` (`/spec/password`,
    /// `/metadata/annotations/example.com~1token`).
    #[serde(default)]
    pub redact: Vec<String>,
    /// Replace the values of a Secret's `data` and `stringData` by a marker (keys stay). Default
    /// true, also for Secrets reached through a wildcard; turning it off is logged as a warning
    /// at start.
    #[serde(default = "default_true")]
    pub redact_secret_data: bool,
    /// Remove `metadata.managedFields` from published objects. Default true.
    #[serde(default = "default_true")]
    pub strip_managed_fields: bool,
    /// Remove the `kubectl.kubernetes.io/last-applied-configuration` annotation. Default true.
    #[serde(default = "default_true")]
    pub strip_last_applied: bool,
    /// Kafka: this resource's topic template, instead of `sink.kafka.topic`.
    pub topic: Option<String>,
    /// NATS: this resource's subject template, instead of `sink.nats.subject`.
    pub subject: Option<String>,
    /// HTTP: this resource's URL template, instead of `sink.http.url`.
    pub url: Option<String>,
    /// Kafka: the record key, `uid` (default) or `namespacedName` (`namespace/name`).
    #[serde(default)]
    pub key: RecordKey,
    /// Kafka: after each delete, write a tombstone (same key, null value) so that a compacted
    /// topic keeps only the objects that exist. Needs `key: namespacedName` or `uid` alike.
    #[serde(default)]
    pub tombstones: bool,
    /// The event shape for this resource; default the top-level `eventFormat`.
    pub event_format: Option<EventFormat>,
    /// The annotation holding the W3C `traceparent` of whatever changed the object (KEP-5915
    /// proposes `tracing.k8s.io/traceparent`): the event's span is its child. Without it, or
    /// when its value is invalid, each change starts a new trace.
    #[serde(default = "default_traceparent_annotation")]
    pub traceparent_annotation: String,
    /// The annotation holding the `tracestate` that goes with it, carried as received.
    #[serde(default = "default_tracestate_annotation")]
    pub tracestate_annotation: String,
}

/// KEP-5915's annotation (proposed) for the trace context of an object's last change.
fn default_traceparent_annotation() -> String {
    "tracing.k8s.io/traceparent".into()
}

/// The `tracestate` beside KEP-5915's annotation.
fn default_tracestate_annotation() -> String {
    "tracing.k8s.io/tracestate".into()
}

/// Both trace context annotations (`traceparent`, `tracestate`) are annotation keys.
fn check_trace_annotations(at: &str, keys: [&str; 2], errors: &mut Vec<String>) {
    for (field, key) in ["traceparentAnnotation", "tracestateAnnotation"]
        .into_iter()
        .zip(keys)
    {
        if !is_qualified_name(key) {
            errors.push(format!(
                "{at}.{field}: {key:?} is not an annotation key ([prefix/]name, the name at most 63 letters, digits, '-', '_' or '.')"
            ));
        }
    }
}

/// A resource a wildcard entry leaves out.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExcludeConfig {
    /// `v1`, `events.k8s.io/*`, `*.example.com/*`; omitted: any group.
    pub api_version: Option<String>,
    /// Plural name or kind (`events`, `Lease`).
    pub resource: String,
}

/// The Kafka record key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum RecordKey {
    /// The object's uid: a recreated object is a new key.
    #[default]
    Uid,
    /// `namespace/name` (`name` for cluster-scoped objects): a recreated object keeps its key.
    NamespacedName,
}

/// The shape of events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum EventFormat {
    /// This bridge's own types (`io.kubeeventbridge.object.*`), source and subject.
    #[default]
    Cloudevents,
    /// Shaped like Knative ApiServerSource's events (`dev.knative.apiserver.resource.add`, ...),
    /// keeping the deterministic id and this bridge's extensions.
    Knative,
}

/// A validated resource entry.
#[derive(Debug, Clone)]
pub struct Resource {
    /// Index in the file, for messages (`resources[2]`).
    pub index: usize,
    /// The API group (`""` for core), or a pattern with `*`.
    pub group: String,
    /// The version, or `*` for the preferred one.
    pub version: String,
    /// Plural name or kind, as written, or `*`.
    pub resource: String,
    /// Left out of a wildcard.
    pub exclude: Vec<Exclude>,
    /// The clusters it is watched in, or `None` for every one.
    pub clusters: Option<Vec<String>>,
    /// Namespaces, or `None` for all.
    pub namespaces: Option<Vec<String>>,
    /// Namespaces by label.
    pub namespace_selector: Option<String>,
    /// Label selector.
    pub label_selector: Option<String>,
    /// Field selector.
    pub field_selector: Option<String>,
    /// Which changes are published.
    pub events: BTreeSet<ChangeKind>,
    /// Payload mode.
    pub payload: payload::Mode,
    /// Diff mode: carry the previous object.
    pub include_previous: bool,
    /// Ignored when comparing versions.
    pub ignore_paths: Vec<Pointer>,
    /// Drop updates that change nothing but noise.
    pub drop_unchanged_updates: bool,
    /// Redacted values.
    pub redact: Vec<Pointer>,
    /// Redact Secret data.
    pub redact_secret_data: bool,
    /// Strip managedFields.
    pub strip_managed_fields: bool,
    /// Strip the last-applied annotation.
    pub strip_last_applied: bool,
    /// The replacement of the sink's destination template (a topic, subject or URL), parsed by
    /// the sink's rules once the sink is known ([`check_sink_fields`]).
    pub destination: Option<Template>,
    /// The destination fields the entry sets (`topic`, `subject`, `url`), as written.
    pub destination_texts: Vec<(&'static str, String)>,
    /// Kafka record key.
    pub key: RecordKey,
    /// Kafka tombstones after deletes.
    pub tombstones: bool,
    /// Event shape.
    pub event_format: EventFormat,
    /// The annotation naming the object's trace context (`traceparent`).
    pub traceparent_annotation: String,
    /// The annotation holding its `tracestate`.
    pub tracestate_annotation: String,
}

/// A validated exclusion.
#[derive(Debug, Clone)]
pub struct Exclude {
    /// Group pattern, `None` for any.
    pub group: Option<String>,
    /// Version, `None` or `*` for any.
    pub version: Option<String>,
    /// Plural or kind.
    pub resource: String,
}

impl Resource {
    /// `apps/v1` or `v1` (with `*` where a wildcard is).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether the entry names more than one resource (or a version to choose).
    pub fn is_wildcard(&self) -> bool {
        self.group.contains('*') || self.version == "*" || self.resource == "*"
    }

    /// Whether this entry and `other`, applied to the same resource, would watch some objects
    /// twice: same selectors and overlapping namespaces (a namespace selector may match any).
    pub fn overlaps(&self, other: &Resource) -> bool {
        let in_both = match (&self.clusters, &other.clusters) {
            (Some(x), Some(y)) => x.iter().any(|c| y.contains(c)),
            _ => true,
        };
        in_both
            && self.label_selector == other.label_selector
            && self.field_selector == other.field_selector
            && match (&self.namespaces, &other.namespaces) {
                (Some(x), Some(y)) => x.iter().any(|n| y.contains(n)),
                _ => true,
            }
    }

    /// Whether the entry is watched in the cluster `name`.
    pub fn watched_in(&self, name: &str) -> bool {
        self.clusters
            .as_ref()
            .is_none_or(|c| c.iter().any(|c| c == name))
    }

    /// Whether `group`, `version`, `plural`/`kind` is matched by this entry (pure name matching;
    /// the version choice is discovery's).
    pub fn matches(&self, group: &str, version: &str, plural: &str, kind: &str) -> bool {
        glob(&self.group, group)
            && (self.version == "*" || self.version == version)
            && (self.resource == "*" || names(&self.resource, plural, kind))
            && !self.exclude.iter().any(|x| {
                x.group.as_deref().is_none_or(|g| glob(g, group))
                    && x.version
                        .as_deref()
                        .is_none_or(|v| v == "*" || v == version)
                    && names(&x.resource, plural, kind)
            })
    }
}

fn names(wanted: &str, plural: &str, kind: &str) -> bool {
    wanted == plural
        || wanted == kind
        || wanted.eq_ignore_ascii_case(plural)
        || wanted.eq_ignore_ascii_case(kind)
}

/// `*` matches any run of characters (dots included); everything else literally.
pub fn glob(pattern: &str, text: &str) -> bool {
    let Some((first, rest)) = pattern.split_once('*') else {
        return pattern == text;
    };
    let Some(mut text) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = rest.split('*').collect();
    let (last, middle) = parts.split_last().expect("split yields one part");
    for part in middle {
        match text.find(part) {
            Some(i) => text = &text[i + part.len()..],
            None => return false,
        }
    }
    text.len() >= last.len() && text.ends_with(last)
}

fn split_api_version(v: &str) -> (String, String) {
    match v.rsplit_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), v.to_string()),
    }
}

fn is_group_pattern(g: &str) -> bool {
    g.is_empty()
        || is_dns_subdomain(g)
        || (g.contains('*')
            && g.len() <= 253
            && g.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.' | '*')
            }))
}

fn parse_pointers(
    at: &str,
    field: &str,
    list: Vec<String>,
    errors: &mut Vec<String>,
) -> Vec<Pointer> {
    list.into_iter()
        .enumerate()
        .filter_map(|(j, p)| match Pointer::parse(&p) {
            Ok(p) => Some(p),
            Err(e) => {
                errors.push(format!("{at}.{field}[{j}]: {e}"));
                None
            }
        })
        .collect()
}

/// Validates one entry; `default_format` is the top-level `eventFormat`. Its destination field
/// is checked once the sink is known ([`check_sink_fields`]).
pub(super) fn validate_resource(
    i: usize,
    r: ResourceConfig,
    default_format: EventFormat,
    errors: &mut Vec<String>,
) -> Option<Resource> {
    let at = format!("resources[{i}]");
    let before = errors.len();
    let (group, version) = split_api_version(&r.api_version);
    check_target(&at, &r, &group, &version, errors);
    let exclude = validate_excludes(&at, r.exclude, errors);
    check_namespaces(
        &at,
        r.namespaces.as_deref(),
        r.namespace_selector.is_some(),
        errors,
    );
    for (field, selector) in [
        ("labelSelector", &r.label_selector),
        ("fieldSelector", &r.field_selector),
        ("namespaceSelector", &r.namespace_selector),
    ] {
        check_selector(&at, field, selector.as_deref(), errors);
    }
    let trace_keys = [&r.traceparent_annotation, &r.tracestate_annotation];
    check_trace_annotations(&at, trace_keys.map(String::as_str), errors);
    let events = validate_events(&at, r.events, errors);
    let event_format = r.event_format.unwrap_or(default_format);
    check_payload(&at, r.payload, r.include_previous, event_format, errors);
    let ignore_paths = parse_pointers(&at, "ignorePaths", r.ignore_paths, errors);
    let redact = parse_pointers(&at, "redact", r.redact, errors);
    let destination_texts = [("topic", r.topic), ("subject", r.subject), ("url", r.url)]
        .into_iter()
        .filter_map(|(field, text)| Some((field, text?)))
        .collect();
    (errors.len() == before).then_some(Resource {
        index: i,
        group,
        version,
        resource: r.resource,
        exclude,
        clusters: r.clusters,
        namespaces: r.namespaces,
        namespace_selector: r.namespace_selector,
        label_selector: r.label_selector,
        field_selector: r.field_selector,
        events,
        payload: r.payload,
        include_previous: r.include_previous,
        ignore_paths,
        drop_unchanged_updates: r.drop_unchanged_updates,
        redact,
        redact_secret_data: r.redact_secret_data,
        strip_managed_fields: r.strip_managed_fields,
        strip_last_applied: r.strip_last_applied,
        destination: None,
        destination_texts,
        key: r.key,
        tombstones: r.tombstones,
        event_format,
        traceparent_annotation: r.traceparent_annotation,
        tracestate_annotation: r.tracestate_annotation,
    })
}

/// What the entry names: `apiVersion` (a version, or a group pattern with `*`) and `resource`;
/// a group pattern needs `resource: "*"`, and only a wildcard entry may exclude resources.
fn check_target(
    at: &str,
    r: &ResourceConfig,
    group: &str,
    version: &str,
    errors: &mut Vec<String>,
) {
    if !is_group_pattern(group) || !(version == "*" || is_version(version)) {
        errors.push(format!(
            "{at}.apiVersion: {:?} is not of the form \"v1\", \"group/version\", \"group/*\" or \"*.group/*\"",
            r.api_version
        ));
    }
    if r.resource != "*" && !is_resource_name(&r.resource) {
        errors.push(format!(
            "{at}.resource: {:?} must be a plural resource name, a kind (letters and digits) or \"*\"",
            r.resource
        ));
    }
    if group.contains('*') && r.resource != "*" {
        errors.push(format!(
            "{at}.resource: a group pattern ({group:?}) matches many groups; use resource: \"*\" with exclude"
        ));
    }
    let wildcard = group.contains('*') || version == "*" || r.resource == "*";
    if !wildcard && !r.exclude.is_empty() {
        errors.push(format!(
            "{at}.exclude: only a wildcard entry (\"*\" in apiVersion or resource) can exclude resources"
        ));
    }
}

/// A plural resource name or a kind: letters and digits.
fn is_resource_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric())
}

/// The `exclude` list, each item checked and split into group and version.
fn validate_excludes(
    at: &str,
    exclude: Vec<ExcludeConfig>,
    errors: &mut Vec<String>,
) -> Vec<Exclude> {
    exclude
        .into_iter()
        .enumerate()
        .map(|(j, x)| {
            let (g, v) = match x.api_version.as_deref().map(split_api_version) {
                Some((g, v)) => {
                    if !is_group_pattern(&g) || !(v == "*" || is_version(&v)) {
                        errors.push(format!(
                            "{at}.exclude[{j}].apiVersion: {:?} is not of the form \"v1\", \"group/version\" or \"group/*\"",
                            x.api_version.as_deref().unwrap_or_default()
                        ));
                    }
                    (Some(g), Some(v))
                }
                None => (None, None),
            };
            if !is_resource_name(&x.resource) {
                errors.push(format!(
                    "{at}.exclude[{j}].resource: {:?} must be a plural resource name or a kind",
                    x.resource
                ));
            }
            Exclude {
                group: g,
                version: v,
                resource: x.resource,
            }
        })
        .collect()
}

/// `namespaces`: not empty, valid names, none twice, and not together with a selector.
fn check_namespaces(
    at: &str,
    namespaces: Option<&[String]>,
    selector: bool,
    errors: &mut Vec<String>,
) {
    let Some(ns) = namespaces else {
        return;
    };
    if ns.is_empty() {
        errors.push(format!(
            "{at}.namespaces: an empty list watches nothing; omit it to watch all namespaces"
        ));
    }
    let mut seen = BTreeSet::new();
    for (j, n) in ns.iter().enumerate() {
        if !is_dns_label(n) {
            errors.push(format!(
                "{at}.namespaces[{j}]: {n:?} is not a valid namespace name"
            ));
        } else if !seen.insert(n) {
            errors.push(format!("{at}.namespaces[{j}]: {n:?} is listed twice"));
        }
    }
    if selector {
        errors.push(format!(
            "{at}.namespaceSelector: give either namespaces or namespaceSelector, not both"
        ));
    }
}

/// A selector the API server receives as one query parameter: not blank, one line.
fn check_selector(at: &str, field: &str, selector: Option<&str>, errors: &mut Vec<String>) {
    if let Some(s) = selector
        && (s.trim().is_empty() || s.contains(['\n', '\r']))
    {
        errors.push(format!(
            "{at}.{field}: {s:?} must be a non-empty single-line selector"
        ));
    }
}

/// The changes to publish: all three when omitted, an empty list refused.
fn validate_events(
    at: &str,
    events: Option<Vec<ChangeKind>>,
    errors: &mut Vec<String>,
) -> BTreeSet<ChangeKind> {
    match events {
        Some(list) if list.is_empty() => {
            errors.push(format!(
                "{at}.events: an empty list publishes nothing; omit it for all changes"
            ));
            BTreeSet::new()
        }
        Some(list) => list.into_iter().collect(),
        None => [ChangeKind::Added, ChangeKind::Modified, ChangeKind::Deleted].into(),
    }
}

/// `includePrevious` needs the diff payload, which Knative-shaped events cannot carry.
fn check_payload(
    at: &str,
    payload: payload::Mode,
    include_previous: bool,
    event_format: EventFormat,
    errors: &mut Vec<String>,
) {
    if include_previous && payload != payload::Mode::Diff {
        errors.push(format!(
            "{at}.includePrevious: only the diff payload carries the previous object; set payload: diff"
        ));
    }
    if event_format == EventFormat::Knative && payload == payload::Mode::Diff {
        errors.push(format!(
            "{at}.payload: Knative-shaped events carry the object or a reference; diff needs eventFormat: cloudevents"
        ));
    }
}

/// Fields only some sinks read, checked once the sink is known: each resource may replace the
/// sink's destination template by the field the sink names, and give record keys when the sink's
/// records have them.
pub(super) fn check_sink_fields(
    resources: &mut [Resource],
    settings: &dyn super::sink::SinkSettings,
    cluster: &str,
    errors: &mut Vec<String>,
) {
    let (sink, fields) = (settings.kind(), settings.resource_fields());
    let instead = fields
        .destination
        .map_or(String::new(), |f| format!("; use {f}"));
    for r in resources {
        let at = format!("resources[{}]", r.index);
        for (field, text) in &r.destination_texts {
            let at = format!("{at}.{field}");
            if fields.destination == Some(*field) {
                r.destination = settings.parse_destination(&at, text, cluster, errors);
            } else {
                errors.push(format!("{at}: the {sink} sink does not read it{instead}"));
            }
        }
        if r.key != RecordKey::Uid && !fields.keys {
            errors.push(format!(
                "{at}.key: only records with keys have one (sink is {sink})"
            ));
        }
        if r.tombstones && !fields.keys {
            errors.push(format!(
                "{at}.tombstones: tombstones are records with keys (sink is {sink})"
            ));
        }
    }
}

/// The message for entry `later` watching what entry `first` already watches.
pub fn same_objects(later: usize, first: usize, resource: &str) -> String {
    format!(
        "resources[{later}]: watches the same objects as resources[{first}] ({resource}); merge the entries"
    )
}

/// Two explicit entries for the same resource whose namespaces overlap would publish every
/// change twice. Wildcards are not compared here: at resolution an explicit entry wins over a
/// wildcard, and an earlier wildcard over a later one.
pub(super) fn check_overlaps(resources: &[Resource], errors: &mut Vec<String>) {
    let explicit: Vec<&Resource> = resources.iter().filter(|r| !r.is_wildcard()).collect();
    for (a_pos, a) in explicit.iter().enumerate() {
        for b in &explicit[a_pos + 1..] {
            if a.group == b.group && a.resource.eq_ignore_ascii_case(&b.resource) && a.overlaps(b) {
                errors.push(same_objects(b.index, a.index, &a.resource));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(yaml: &str) -> Result<Resource, Vec<String>> {
        let r: ResourceConfig = serde_saphyr::from_str(yaml).unwrap();
        let mut errors = Vec::new();
        validate_resource(0, r, EventFormat::Cloudevents, &mut errors).ok_or(errors)
    }

    #[test]
    fn trace_annotations_default_to_kep_5915_and_must_be_annotation_keys() {
        let r = entry("{apiVersion: v1, resource: pods}").unwrap();
        assert_eq!(r.traceparent_annotation, "tracing.k8s.io/traceparent");
        assert_eq!(r.tracestate_annotation, "tracing.k8s.io/tracestate");
        let r = entry("{apiVersion: v1, resource: pods, traceparentAnnotation: example.com/tp}");
        assert_eq!(r.unwrap().traceparent_annotation, "example.com/tp");
        let errors = entry(
            "{apiVersion: v1, resource: pods, traceparentAnnotation: 'a b', tracestateAnnotation: x/}",
        )
        .unwrap_err();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors[0].starts_with(
                "resources[0].traceparentAnnotation: \"a b\" is not an annotation key"
            ),
            "{errors:?}"
        );
        assert!(
            errors[1].starts_with("resources[0].tracestateAnnotation: \"x/\""),
            "{errors:?}"
        );
    }

    #[test]
    fn globs() {
        assert!(glob("*.example.com", "stable.example.com"));
        assert!(glob("*.example.com", "a.b.example.com"));
        assert!(!glob("*.example.com", "example.com"));
        assert!(glob("example.com", "example.com"));
        assert!(glob("*", ""));
        assert!(glob("a*c*e", "abcde"));
        assert!(!glob("a*c*e", "abcd"));
    }

    #[test]
    fn wildcards_match_and_exclude() {
        let r = entry("{apiVersion: v1, resource: '*', exclude: [{resource: events}, {apiVersion: v1, resource: Secret}]}").unwrap();
        assert!(r.is_wildcard());
        assert!(r.matches("", "v1", "configmaps", "ConfigMap"));
        assert!(!r.matches("", "v1", "events", "Event"));
        assert!(!r.matches("", "v1", "secrets", "Secret"));
        assert!(!r.matches("apps", "v1", "deployments", "Deployment"));
        let r = entry("{apiVersion: '*.example.com/*', resource: '*'}").unwrap();
        assert!(r.matches("stable.example.com", "v2", "crontabs", "CronTab"));
        assert!(!r.matches("example.org", "v1", "x", "X"));
    }

    #[test]
    fn bad_entries_name_their_fields() {
        let e = entry("{apiVersion: '*.example.com/v1', resource: crontabs, exclude: [{resource: 'a b'}], payload: reference, includePrevious: true, ignorePaths: [status], redact: ['/metadata/name'], namespaces: [a], namespaceSelector: 'x=y', topic: t, subject: s}").unwrap_err().join("\n");
        for needle in [
            "resources[0].resource: a group pattern",
            "resources[0].exclude[0].resource",
            "resources[0].includePrevious",
            "resources[0].ignorePaths[0]: \"status\" is not a JSON pointer",
            "resources[0].redact[0]: \"/metadata/name\": under /metadata",
            "resources[0].namespaceSelector: give either",
        ] {
            assert!(e.contains(needle), "missing {needle:?} in\n{e}");
        }
        let e = entry("{apiVersion: v1, resource: pods, exclude: [{resource: x}]}")
            .unwrap_err()
            .join("\n");
        assert!(e.contains("resources[0].exclude: only a wildcard"), "{e}");
        let e = entry("{apiVersion: v1, resource: pods, payload: diff, eventFormat: knative}")
            .unwrap_err()
            .join("\n");
        assert!(e.contains("resources[0].payload: Knative-shaped"), "{e}");
    }

    #[test]
    fn defaults() {
        let r = entry("{apiVersion: apps/v1, resource: deployments}").unwrap();
        assert!(r.drop_unchanged_updates && r.strip_last_applied && r.redact_secret_data);
        assert_eq!(r.payload, payload::Mode::Full);
        assert_eq!(r.key, RecordKey::Uid);
        assert!(!r.tombstones && !r.is_wildcard());
    }
}
