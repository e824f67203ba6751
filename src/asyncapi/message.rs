//! One AsyncAPI message per resolved resource: its headers (the CloudEvents binding of the sink),
//! its payload schema (the event JSON Schema in structured mode, the object in binary mode) and
//! an example. Header names and values come from an event encoded by [`crate::encode`] and laid
//! out by the sink's own code, so the document describes exactly what is published.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};
use kube::api::{DynamicObject, ObjectMeta, TypeMeta};
use serde_json::{Map, Value, json};

use crate::attribute;
use crate::change::{Change, ChangeKind, Origin};
use crate::config::EventFormat;
use crate::discovery::ResolvedResource;
use crate::encode::{self, DATA_CONTENT_TYPE, Event, ResourceInfo};
use crate::payload::Mode;

use super::{Binding, Error, Result};

/// Attributes an event of a resource may lack: set only on some events.
const SOMETIMES: [&str; 5] = [
    attribute::TRUNCATED,
    attribute::MANAGER,
    attribute::OPERATION,
    attribute::TRACESTATE,
    attribute::SNAPSHOTID,
];

/// The id of the snapshot on demand of the examples (its request's uid).
const EXAMPLE_SNAPSHOT_ID: &str = "5f0c8d2a-7e41-4b9a-9c3e-1d2f3a4b5c6d";

/// The uid of the example object (and, in examples, of the cluster's `kube-system`).
const EXAMPLE_UID: &str = "6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f";
const EXAMPLE_CLUSTER_ID: &str = "3c8a0f2e-9b7d-4e61-a5c4-2d1f0e9b8a76";
/// The example object's trace context annotations (W3C's own examples).
const EXAMPLE_TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const EXAMPLE_TRACESTATE: &str = "congo=t61rcWkgMzE";
/// The example event's span id: fixed, so the document is the same on every run.
const EXAMPLE_SPAN_ID: [u8; 8] = [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7];

/// The name of the cluster in the examples of clusters discovered from kubeconfig Secrets.
pub(super) const EXAMPLE_DISCOVERED_CLUSTER: &str = "workload-1";
/// The API server of that cluster, in examples (Knative's `source`).
pub(super) const EXAMPLE_DISCOVERED_API_SERVER: &str = "https://workload-1.example.com:6443";
/// A DNS label, as the names of the clusters of kubeconfig Secrets are (ECMA-262 regex).
const DNS_LABEL_PATTERN: &str = "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?";

/// The message of one resource, as an AsyncAPI Message Object. `discovered`: `info` is of the
/// clusters of kubeconfig Secrets (named [`EXAMPLE_DISCOVERED_CLUSTER`] in the example), whose
/// `cluster` and `source` follow a pattern instead of having one value.
pub(super) fn message(
    binding: &Binding,
    r: &ResolvedResource,
    info: ResourceInfo,
    discovered: bool,
    descriptions: &Map<String, Value>,
    trait_ref: &str,
) -> Result<Value> {
    let info = Arc::new(info);
    let example = example_event(&info, r, false)?;
    let truncated = example_event(&info, r, true)?;
    let mut snapshot = example_event(&info, r, false)?;
    snapshot.for_snapshot(EXAMPLE_SNAPSHOT_ID.into());
    let structured = binding.structured();
    let cluster = if discovered {
        "a cluster discovered from a kubeconfig Secret".to_string()
    } else {
        format!("cluster {}", info.cluster)
    };
    let mut message = json!({
        "name": message_name(r),
        "title": format!("{} {} change", r.api.api_version, r.api.kind),
        "summary": format!(
            "An add, update or delete of a {} ({}) in {cluster}, as a CloudEvent 1.0 ({} mode).",
            r.api.kind, r.label(), if structured { "structured" } else { "binary" }
        ),
        "contentType": binding.content_type(),
        "traits": [{"$ref": trait_ref}],
    });
    let mut attributes =
        attribute_schemas(&info, r, [&example, &truncated, &snapshot], descriptions);
    if discovered {
        for (name, schema, _) in &mut attributes {
            any_cluster(name, schema, &info);
        }
    }
    let data = data_schema(&info);
    let (payload, example_payload) = if structured || binding.stdout() {
        (
            structured_payload(attributes.clone(), data),
            serde_json::from_slice::<Value>(&example.to_structured_json()),
        )
    } else {
        (data, serde_json::from_slice::<Value>(&example.data))
    };
    let example_payload = example_payload.map_err(Error::Example)?;
    message["payload"] = payload;
    if let Some(headers) = binding.headers(&attributes, &example) {
        message["headers"] = headers.schema;
        message["correlationId"] = json!({
            "description": "The CloudEvents `id`: the same change always has the same id.",
            "location": headers.id_location,
        });
        message["examples"] = json!([{
            "name": "modified",
            "summary": "A live update, as published.",
            "headers": headers.example,
            "payload": example_payload,
        }]);
    } else {
        message["correlationId"] = json!({
            "description": "The CloudEvents `id`: the same change always has the same id.",
            "location": "$message.payload#/id",
        });
        message["examples"] = json!([{
            "name": "modified",
            "summary": "A live update, as published.",
            "payload": example_payload,
        }]);
    }
    if let Some(bindings) = binding.message_bindings(info.key) {
        message["bindings"] = bindings;
    }
    Ok(message)
}

/// The Kafka tombstone that follows each delete with `tombstones: true`, and that a snapshot
/// with `prune` publishes for a key the cluster no longer has.
pub(super) fn tombstone(r: &ResolvedResource) -> Value {
    json!({
        "name": format!("{}Tombstone", message_name(r)),
        "title": format!("{} {} tombstone", r.api.api_version, r.api.kind),
        "summary": "A record with the deleted object's key, no value and no headers, right \
                    after its delete event (same partition, same transaction): a compacted \
                    topic then forgets the object. A snapshot on demand with `prune` also \
                    publishes one, before its end marker, for each key the topic held for an \
                    object the cluster no longer has.",
        "payload": {"type": "null"},
    })
}

/// `ConfigMap`, or `apps.Deployment` outside the core group.
fn message_name(r: &ResolvedResource) -> String {
    if r.api.group.is_empty() {
        r.api.kind.clone()
    } else {
        format!("{}.{}", r.api.group, r.api.kind)
    }
}

/// An example event of the resource: a live update of an object written last by
/// `kubectl-client-side-apply` in a traced request, truncated when `truncated`.
fn example_event(info: &Arc<ResourceInfo>, r: &ResolvedResource, truncated: bool) -> Result<Event> {
    let namespace = r.namespaced.then(|| {
        r.config
            .namespaces
            .as_ref()
            .and_then(|list| list.first().cloned())
            .unwrap_or_else(|| "shop".into())
    });
    let object = DynamicObject {
        types: Some(TypeMeta {
            api_version: r.api.api_version.clone(),
            kind: r.api.kind.clone(),
        }),
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace,
            uid: Some(EXAMPLE_UID.into()),
            resource_version: Some("184467".into()),
            annotations: Some(
                [
                    (&r.config.traceparent_annotation, EXAMPLE_TRACEPARENT),
                    (&r.config.tracestate_annotation, EXAMPLE_TRACESTATE),
                ]
                .into_iter()
                .map(|(k, v)| (k.clone(), v.to_string()))
                .collect(),
            ),
            managed_fields: Some(vec![ManagedFieldsEntry {
                manager: Some("kubectl-client-side-apply".into()),
                operation: Some("Update".into()),
                time: Some(Time("2025-11-21T14:03:27Z".parse().expect("a timestamp"))),
                ..ManagedFieldsEntry::default()
            }]),
            ..ObjectMeta::default()
        },
        data: json!({}),
    };
    let change = Change {
        kind: ChangeKind::Modified,
        origin: Origin::Live,
        object,
        observed: SystemTime::UNIX_EPOCH + Duration::new(1_763_733_807, 512_908_143),
    };
    let mut event = encode::encode(info, change, None)
        .map_err(Error::Encode)?
        .event;
    let trace = &mut event.trace;
    trace.recorded_as(trace.trace_id(), EXAMPLE_SPAN_ID, trace.sampled());
    if truncated {
        event.truncate();
    }
    Ok(event)
}

/// The example's cluster id (the real one is read by the bridge at start).
pub(super) fn example_cluster_id() -> Arc<str> {
    EXAMPLE_CLUSTER_ID.into()
}

/// The JSON Schema of every attribute an event of this resource carries: name, schema, and
/// whether every event carries it.
fn attribute_schemas(
    info: &ResourceInfo,
    r: &ResolvedResource,
    examples: [&Event; 3],
    descriptions: &Map<String, Value>,
) -> Vec<(String, Value, bool)> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (name, value) in examples.iter().flat_map(|e| e.attributes()) {
        if !seen.insert(name) {
            continue;
        }
        let mut schema = json!({"type": "string"});
        if let Some(d) = descriptions.get(name).and_then(|p| p.get("description")) {
            schema["description"] = d.clone();
        }
        let fixed = attribute_values(info, r, name).unwrap_or_else(|| {
            // Values that are the same for every event of the resource.
            match name {
                attribute::SPECVERSION
                | attribute::SOURCE
                | attribute::DATASCHEMA
                | attribute::CLUSTER
                | attribute::APIVERSION
                | attribute::KIND
                | attribute::RESOURCE
                | attribute::TRUNCATED => vec![value.to_string()],
                _ => Vec::new(),
            }
        });
        match fixed.len() {
            0 => {}
            1 => schema["const"] = json!(fixed[0]),
            _ => schema["enum"] = json!(fixed),
        }
        if name == attribute::TIME {
            schema["format"] = json!("date-time");
        }
        out.push((name.to_string(), schema, !SOMETIMES.contains(&name)));
    }
    out
}

/// The schema of `cluster` and `source` for any cluster of the kubeconfig Secrets: a DNS label,
/// and the source with that label in place of the example's cluster (any API server's URL with
/// `eventFormat: knative`).
fn any_cluster(name: &str, schema: &mut Value, info: &ResourceInfo) {
    let Some(map) = schema.as_object_mut() else {
        return;
    };
    match name {
        attribute::CLUSTER => {
            map.remove("const");
            map.insert("pattern".into(), json!(format!("^{DNS_LABEL_PATTERN}$")));
        }
        attribute::SOURCE => {
            map.remove("const");
            let prefix = format!("/k8s/{EXAMPLE_DISCOVERED_CLUSTER}/");
            if let Some(rest) = info.source.strip_prefix(&prefix) {
                map.insert(
                    "pattern".into(),
                    json!(format!("^/k8s/{DNS_LABEL_PATTERN}/{}$", regex_escape(rest))),
                );
            }
        }
        _ => {}
    }
}

/// `text` with the characters an ECMA-262 regex gives a meaning escaped.
fn regex_escape(text: &str) -> String {
    text.chars().fold(String::new(), |mut out, c| {
        if "\\^$.|?*+()[]{}".contains(c) {
            out.push('\\');
        }
        out.push(c);
        out
    })
}

/// The closed set of values of an attribute, when it has one.
fn attribute_values(info: &ResourceInfo, r: &ResolvedResource, name: &str) -> Option<Vec<String>> {
    let kinds = [ChangeKind::Added, ChangeKind::Modified, ChangeKind::Deleted];
    let payloads = match info.payload {
        Mode::Reference => vec![Mode::Reference],
        mode => vec![mode, Mode::Reference],
    };
    let values: Vec<String> = match name {
        attribute::TYPE => {
            let mut types = BTreeSet::new();
            for kind in kinds {
                for payload in &payloads {
                    types.insert(event_type(info.format, kind, *payload));
                }
            }
            types.into_iter().map(String::from).collect()
        }
        attribute::ORIGIN => [Origin::Snapshot, Origin::Live, Origin::Repaired]
            .iter()
            .map(|o| o.as_str().to_string())
            .collect(),
        attribute::PAYLOAD => payloads.iter().map(|p| p.as_str().to_string()).collect(),
        attribute::OPERATION => vec!["Apply".into(), "Update".into()],
        attribute::NAMESPACE => r.config.namespaces.clone()?,
        _ => return None,
    };
    Some(values)
}

fn event_type(format: EventFormat, kind: ChangeKind, payload: Mode) -> &'static str {
    match format {
        EventFormat::Knative => crate::knative::event_type(kind, payload),
        EventFormat::Cloudevents => match kind {
            ChangeKind::Added => "io.kubeeventbridge.object.added",
            ChangeKind::Modified => "io.kubeeventbridge.object.modified",
            ChangeKind::Deleted => "io.kubeeventbridge.object.deleted",
        },
    }
}

/// The structured form: the event schema, narrowed to this resource's attributes and `data`.
fn structured_payload(attributes: Vec<(String, Value, bool)>, data: Value) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for (name, schema, always) in attributes {
        if always {
            required.push(json!(name));
        }
        properties.insert(name, schema);
    }
    properties.insert(
        attribute::DATACONTENTTYPE.into(),
        json!({"type": "string", "const": DATA_CONTENT_TYPE}),
    );
    properties.insert(attribute::DATA.into(), data);
    json!({
        "allOf": [
            {"$ref": super::EVENT_SCHEMA_REF},
            {"type": "object", "properties": properties, "required": required},
        ],
    })
}

/// What `data` holds for this resource: the object (full), a reference, or a diff document;
/// any of them may be cut down to a reference when too large.
fn data_schema(info: &ResourceInfo) -> Value {
    let object = json!({
        "type": "object",
        "description": format!(
            "The {} as the API server returned it, after stripping and redaction. A repaired \
             delete carries apiVersion, kind and metadata.{{name, namespace, uid, resourceVersion}} only.",
            info.kind
        ),
        "required": ["apiVersion", "kind", "metadata"],
        "properties": {
            "apiVersion": {"type": "string", "const": info.api_version},
            "kind": {"type": "string", "const": info.kind},
            "metadata": {
                "type": "object",
                "required": ["name", "uid", "resourceVersion"],
                "properties": {
                    "name": {"type": "string"},
                    "namespace": {"type": "string"},
                    "uid": {"type": "string"},
                    "resourceVersion": {"type": "string"},
                },
            },
        },
    });
    let reference = reference_schema(info);
    let main = match info.payload {
        Mode::Full => object,
        Mode::Reference => return reference,
        Mode::Diff => json!({
            "type": "object",
            "description": "The object, the RFC 6902 JSON Patch from the previous published \
                            version (null when unknown: adds, deletes, the first update after a \
                            restart) and, with includePrevious, that version.",
            "required": ["object", "patch"],
            "properties": {
                "object": object,
                "patch": {
                    "type": ["array", "null"],
                    "items": {
                        "type": "object",
                        "required": ["op", "path"],
                        "properties": {"op": {"type": "string"}, "path": {"type": "string"}},
                    },
                },
                "previous": object,
            },
        }),
    };
    json!({"anyOf": [main, reference]})
}

/// The reference payload (also what a truncated event carries).
fn reference_schema(info: &ResourceInfo) -> Value {
    let required: &[&str] = match info.format {
        EventFormat::Knative => &["apiVersion", "kind", "name"],
        EventFormat::Cloudevents => &["apiVersion", "kind", "name", "uid", "resourceVersion"],
    };
    let mut properties = json!({
        "apiVersion": {"type": "string", "const": info.api_version},
        "kind": {"type": "string", "const": info.kind},
        "namespace": {"type": "string"},
        "name": {"type": "string"},
    });
    if info.format == EventFormat::Cloudevents {
        properties["uid"] = json!({"type": "string"});
        properties["resourceVersion"] = json!({"type": "string"});
    }
    json!({
        "type": "object",
        "description": "A reference to the object: `payload: reference`, or an event larger than \
                        the broker accepts (`truncated: true`).",
        "required": required,
        "properties": properties,
        "additionalProperties": false,
    })
}
