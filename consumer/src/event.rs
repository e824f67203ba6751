//! Decoding what the bridge publishes: CloudEvents in binary or structured content mode (Kafka
//! `ce_` headers, NATS percent-encoded `ce-` headers), the begin and end markers of snapshots on
//! demand (always structured), and Kafka tombstones.

use std::collections::HashMap;
use std::fmt;

use percent_encoding::percent_decode_str;
use serde_json::Value;

/// The `content-type` of a structured-mode message.
const STRUCTURED: &str = "application/cloudevents+json";
/// The prefix of every object event's `type`.
const TYPE_PREFIX: &str = "io.kubeeventbridge.object.";
/// The `type` of a snapshot's begin marker.
pub const SNAPSHOT_BEGIN: &str = "io.kubeeventbridge.snapshot.begin";
/// The `type` of a snapshot's end marker.
pub const SNAPSHOT_END: &str = "io.kubeeventbridge.snapshot.end";

/// Errors decoding a message.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A required CloudEvents attribute or bridge extension is missing.
    #[error("attribute {0} is missing")]
    Missing(&'static str),
    /// An attribute holds a value outside the event contract.
    #[error("attribute {name} has the unexpected value {value:?}")]
    Unexpected {
        /// The attribute.
        name: &'static str,
        /// Its value.
        value: String,
    },
    /// The body is not JSON (binary mode: `data`; structured mode: the whole event).
    #[error("body is not JSON")]
    Json(#[source] serde_json::Error),
    /// A structured-mode body is not a JSON object.
    #[error("structured event is not a JSON object")]
    NotAnObject,
    /// A header value is not UTF-8.
    #[error("header {0} is not UTF-8")]
    Utf8(String),
    /// A snapshot marker's `data` lacks a member, or one has the wrong type.
    #[error("the data of snapshot marker {id} is invalid")]
    MarkerData {
        /// The marker's id.
        id: String,
        /// Which member and why.
        #[source]
        source: serde_json::Error,
    },
    /// An object event was expected, and the message is a snapshot marker ([`decode`] and
    /// [`decode_structured`]; [`decode_message`] reads both).
    #[error("message {0} is a snapshot marker, not an object event")]
    Marker(String),
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The change an event describes (the last part of its `type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChangeType {
    /// `io.kubeeventbridge.object.added`
    Added,
    /// `io.kubeeventbridge.object.modified`
    Modified,
    /// `io.kubeeventbridge.object.deleted`
    Deleted,
}

/// Why the bridge emitted an event (the `origin` extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    /// The first LIST of a watch.
    Snapshot,
    /// A change read from the watch stream.
    Live,
    /// A difference found by a relist after the watch history was lost.
    Repaired,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Origin::Snapshot => "snapshot",
            Origin::Live => "live",
            Origin::Repaired => "repaired",
        })
    }
}

/// What `data` carries (the `payload` extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Payload {
    /// The object.
    Full,
    /// Only the object's identity (also every truncated event).
    Reference,
    /// `{"object", "patch", "previous"}`.
    Diff,
}

/// One decoded event of the bridge.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// `id`: `{uid}:{resourceVersion}:{change}`.
    pub id: String,
    /// `source`.
    pub source: String,
    /// The change, from `type`.
    pub change: ChangeType,
    /// `time`, as sent.
    pub time: Option<String>,
    /// `cluster`.
    pub cluster: String,
    /// `apiversion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// `resource` (plural).
    pub resource: String,
    /// `namespace`, absent for cluster-scoped objects.
    pub namespace: Option<String>,
    /// `name`.
    pub name: String,
    /// `uid`.
    pub uid: String,
    /// `resourceversion`.
    pub resource_version: String,
    /// `sequence`: the resourceVersion padded to 20 digits, compared as a string.
    pub sequence: String,
    /// `partitionkey`: the Kafka record key.
    pub partition_key: String,
    /// `origin`.
    pub origin: Origin,
    /// `payload`.
    pub payload: Payload,
    /// `truncated`: the event exceeded the broker's size limit and carries a reference.
    pub truncated: bool,
    /// `snapshotid`: the snapshot on demand the event belongs to (its id is then
    /// `{uid}:{resourceVersion}:{snapshotid}`).
    pub snapshot_id: Option<String>,
    /// `data`.
    pub data: Value,
}

/// A control event framing a snapshot on demand on its watch's topic or subject
/// (docs/events.md, "Snapshots on demand").
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    /// `id`: `{snapshotid}:{watch id}:begin|end`.
    pub id: String,
    /// `snapshotid`: the snapshot's id, also on its object events.
    pub snapshot_id: String,
    /// Which marker, and what it says.
    pub kind: MarkerKind,
    /// `time`, as sent.
    pub time: Option<String>,
    /// `cluster`.
    pub cluster: String,
    /// `apiversion`.
    pub api_version: String,
    /// `resource` (plural).
    pub resource: String,
    /// `namespace`: the namespace the snapshot is limited to, if any.
    pub namespace: Option<String>,
    /// The watch's id: the middle of `id`.
    pub watch: String,
}

/// What a marker says.
#[derive(Debug, Clone, PartialEq)]
pub enum MarkerKind {
    /// `io.kubeeventbridge.snapshot.begin`: the snapshot's objects follow.
    Begin {
        /// The label selector the snapshot is limited to, beside the watch's own.
        label_selector: Option<String>,
        /// The count the API server reported when the snapshot began; `None` when it gave none
        /// (a list narrowed by a selector).
        expected: Option<u64>,
    },
    /// `io.kubeeventbridge.snapshot.end`.
    End {
        /// Objects published with the snapshot's id.
        sent: u64,
        /// Objects not published: a newer state or their delete was published since.
        skipped: u64,
        /// Tombstones published for keys the compacted topic held for objects the cluster no
        /// longer has (a snapshot with `prune`); 0 otherwise.
        pruned: u64,
        /// Whether the events since the begin marker hold the complete state.
        result: SnapshotResult,
    },
}

/// How a snapshot ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotResult {
    /// The events from the begin marker to the end marker hold the scope's complete state.
    Complete,
    /// They do not; the bridge's reason.
    Failed(String),
}

/// One decoded message of the bridge: an object event or a snapshot marker.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// An object event.
    Event(Box<Event>),
    /// A snapshot's begin or end marker.
    Marker(Box<Marker>),
}
/// One message read from a topic or subject.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// An event, with the topic or subject it was read from.
    Event {
        /// Kafka topic or NATS subject.
        destination: String,
        /// The event.
        event: Box<Event>,
    },
    /// A snapshot's begin or end marker, with the topic or subject it was read from.
    Marker {
        /// Kafka topic or NATS subject.
        destination: String,
        /// The marker.
        marker: Box<Marker>,
    },
    /// A Kafka record with a null value: the bridge wrote it right after a delete with
    /// `tombstones: true`, so that a compacted topic forgets the key.
    Tombstone {
        /// The Kafka topic.
        destination: String,
        /// The record key (the uid, or `namespace/name` with `key: namespacedName`).
        key: String,
    },
}

/// How the attributes travel in binary mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// Kafka: `ce_` headers, plain UTF-8.
    Kafka,
    /// NATS: `ce-` headers, percent-encoded.
    Nats,
}

impl Record {
    /// The record of `message`, read from `destination`.
    pub fn of(destination: String, message: Message) -> Record {
        match message {
            Message::Event(event) => Record::Event { destination, event },
            Message::Marker(marker) => Record::Marker {
                destination,
                marker,
            },
        }
    }
}

/// Decodes an object event in binary or structured mode (a snapshot marker is an
/// [`Error::Marker`]: see [`decode_message`]). `headers` are (name, value) pairs as they
/// arrived; `body` is the Kafka value or NATS payload.
pub fn decode<'a>(
    binding: Binding,
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    body: &[u8],
) -> Result<Event> {
    object_event(decode_message(binding, headers, body)?)
}

/// Decodes the structured form of an object event (the stdout line, or a structured-mode body).
pub fn decode_structured(body: &[u8]) -> Result<Event> {
    object_event(decode_structured_message(body)?)
}

fn object_event(message: Message) -> Result<Event> {
    match message {
        Message::Event(event) => Ok(*event),
        Message::Marker(marker) => Err(Error::Marker(marker.id)),
    }
}

/// Decodes a message in binary or structured mode: an object event or a snapshot marker.
/// `headers` are (name, value) pairs as they arrived; `body` is the Kafka value or NATS
/// payload.
pub fn decode_message<'a>(
    binding: Binding,
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    body: &[u8],
) -> Result<Message> {
    let prefix = match binding {
        Binding::Kafka => "ce_",
        Binding::Nats => "ce-",
    };
    let mut attributes = HashMap::new();
    let mut structured = false;
    for (name, value) in headers {
        let text = std::str::from_utf8(value).map_err(|_| Error::Utf8(name.to_string()))?;
        if name.eq_ignore_ascii_case("content-type") {
            structured = text.starts_with(STRUCTURED);
        } else if name.len() > prefix.len() && name[..prefix.len()].eq_ignore_ascii_case(prefix) {
            let text = match binding {
                Binding::Kafka => text.to_string(),
                Binding::Nats => percent_decode_str(text)
                    .decode_utf8()
                    .map_err(|_| Error::Utf8(name.to_string()))?
                    .into_owned(),
            };
            attributes.insert(name[prefix.len()..].to_ascii_lowercase(), text);
        }
    }
    if structured {
        return decode_structured_message(body);
    }
    let data = serde_json::from_slice(body).map_err(Error::Json)?;
    from_attributes(attributes, data)
}

/// Decodes a structured-mode body: an object event or a snapshot marker.
pub fn decode_structured_message(body: &[u8]) -> Result<Message> {
    let Value::Object(map) = serde_json::from_slice(body).map_err(Error::Json)? else {
        return Err(Error::NotAnObject);
    };
    let mut data = Value::Null;
    let mut attributes = HashMap::new();
    for (name, value) in map {
        match value {
            v if name == "data" => data = v,
            Value::String(s) => {
                attributes.insert(name, s);
            }
            other => {
                attributes.insert(name, other.to_string());
            }
        }
    }
    from_attributes(attributes, data)
}

fn from_attributes(mut a: HashMap<String, String>, data: Value) -> Result<Message> {
    let specversion = a
        .remove("specversion")
        .ok_or(Error::Missing("specversion"))?;
    if specversion != "1.0" {
        return Err(unexpected("specversion", specversion));
    }
    let ty = a.remove("type").ok_or(Error::Missing("type"))?;
    match ty.as_str() {
        SNAPSHOT_BEGIN | SNAPSHOT_END => {
            marker_from(a, &ty, data).map(|m| Message::Marker(Box::new(m)))
        }
        _ => event_from(a, ty, data).map(|e| Message::Event(Box::new(e))),
    }
}

/// The `data` of a begin or end marker, as the bridge writes it.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct MarkerData {
    label_selector: Option<String>,
    expected: Option<u64>,
    sent: Option<u64>,
    skipped: Option<u64>,
    pruned: Option<u64>,
    result: Option<String>,
    message: Option<String>,
}

/// The watch's id in a marker's id, `{snapshotid}:{watch id}:begin|end`.
fn watch_of(id: &str) -> Result<&str> {
    match id.split(':').collect::<Vec<_>>()[..] {
        [_, watch, "begin" | "end"] if !watch.is_empty() => Ok(watch),
        _ => Err(unexpected("id", id.to_string())),
    }
}

fn marker_from(mut a: HashMap<String, String>, ty: &str, data: Value) -> Result<Marker> {
    let mut take = |name: &'static str| a.remove(name).ok_or(Error::Missing(name));
    let id = take("id")?;
    let invalid = |source| Error::MarkerData {
        id: id.clone(),
        source,
    };
    let d: MarkerData = serde_json::from_value(data).map_err(invalid)?;
    let required = |value: Option<u64>, name: &'static str| {
        value.ok_or_else(|| invalid(serde::de::Error::missing_field(name)))
    };
    let kind = if ty == SNAPSHOT_BEGIN {
        MarkerKind::Begin {
            label_selector: d.label_selector,
            expected: d.expected,
        }
    } else {
        let result = match d.result.as_deref() {
            Some("complete") => SnapshotResult::Complete,
            Some("failed") => SnapshotResult::Failed(d.message.unwrap_or_default()),
            Some(other) => return Err(unexpected("data.result", other.to_string())),
            None => return Err(invalid(serde::de::Error::missing_field("result"))),
        };
        MarkerKind::End {
            sent: required(d.sent, "sent")?,
            skipped: required(d.skipped, "skipped")?,
            pruned: d.pruned.unwrap_or(0),
            result,
        }
    };
    Ok(Marker {
        snapshot_id: take("snapshotid")?,
        kind,
        time: take("time").ok(),
        cluster: take("cluster")?,
        api_version: take("apiversion")?,
        resource: take("resource")?,
        namespace: take("namespace").ok(),
        watch: watch_of(&id)?.to_string(),
        id,
    })
}

fn event_from(mut a: HashMap<String, String>, ty: String, data: Value) -> Result<Event> {
    let mut take = |name: &'static str| a.remove(name).ok_or(Error::Missing(name));
    let change = match ty.strip_prefix(TYPE_PREFIX) {
        Some("added") => ChangeType::Added,
        Some("modified") => ChangeType::Modified,
        Some("deleted") => ChangeType::Deleted,
        _ => return Err(unexpected("type", ty)),
    };
    let origin = match take("origin")?.as_str() {
        "snapshot" => Origin::Snapshot,
        "live" => Origin::Live,
        "repaired" => Origin::Repaired,
        other => return Err(unexpected("origin", other.to_string())),
    };
    // Events of bridges older than the `payload` extension carry the full object.
    let payload = match take("payload").as_deref() {
        Err(_) | Ok("full") => Payload::Full,
        Ok("reference") => Payload::Reference,
        Ok("diff") => Payload::Diff,
        Ok(other) => return Err(unexpected("payload", other.to_string())),
    };
    let uid = take("uid")?;
    Ok(Event {
        id: take("id")?,
        source: take("source")?,
        change,
        time: take("time").ok(),
        cluster: take("cluster")?,
        api_version: take("apiversion")?,
        kind: take("kind")?,
        resource: take("resource")?,
        namespace: take("namespace").ok(),
        name: take("name")?,
        resource_version: take("resourceversion")?,
        sequence: take("sequence")?,
        partition_key: take("partitionkey").unwrap_or_else(|_| uid.clone()),
        uid,
        origin,
        payload,
        truncated: take("truncated").is_ok_and(|t| t == "true"),
        snapshot_id: take("snapshotid").ok(),
        data,
    })
}

fn unexpected(name: &'static str, value: String) -> Error {
    Error::Unexpected { name, value }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kafka_headers() -> Vec<(&'static str, &'static [u8])> {
        vec![
            ("content-type", b"application/json".as_slice()),
            ("ce_specversion", b"1.0"),
            ("ce_id", b"u1:184467:modified"),
            ("ce_source", b"/k8s/prod/api/v1/configmaps"),
            ("ce_type", b"io.kubeeventbridge.object.modified"),
            ("ce_subject", b"shop/web"),
            ("ce_time", b"2025-11-21T14:03:27.5Z"),
            (
                "ce_dataschema",
                b"https://kube-event-bridge.dev/schemas/event/v1",
            ),
            ("ce_cluster", b"prod"),
            ("ce_apiversion", b"v1"),
            ("ce_kind", b"ConfigMap"),
            ("ce_resource", b"configmaps"),
            ("ce_namespace", b"shop"),
            ("ce_name", b"web"),
            ("ce_uid", b"u1"),
            ("ce_resourceversion", b"184467"),
            ("ce_sequence", b"00000000000000184467"),
            ("ce_partitionkey", b"u1"),
            ("ce_origin", b"live"),
        ]
    }

    #[test]
    fn kafka_binary_mode_decodes_every_attribute() {
        let e = decode(Binding::Kafka, kafka_headers(), br#"{"data":{"k":"v"}}"#).unwrap();
        assert_eq!(e.id, "u1:184467:modified");
        assert_eq!(e.change, ChangeType::Modified);
        assert_eq!(e.namespace.as_deref(), Some("shop"));
        assert_eq!(e.sequence, "00000000000000184467");
        assert_eq!(e.origin, Origin::Live);
        assert_eq!(e.payload, Payload::Full);
        assert!(!e.truncated);
        assert_eq!(e.data, json!({"data": {"k": "v"}}));
    }

    #[test]
    fn nats_binary_mode_percent_decodes_values() {
        let mut headers: Vec<(String, Vec<u8>)> = kafka_headers()
            .into_iter()
            .map(|(k, v)| (k.replacen("ce_", "ce-", 1), v.to_vec()))
            .collect();
        for (k, v) in &mut headers {
            if k == "ce-name" {
                *v = b"my%20name%C3%A9".to_vec();
            }
        }
        let e = decode(
            Binding::Nats,
            headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())),
            b"{}",
        )
        .unwrap();
        assert_eq!(e.name, "my name\u{e9}");
    }

    #[test]
    fn structured_mode_reads_the_whole_event_from_the_body() {
        let body = json!({
            "specversion": "1.0", "id": "u2:7:deleted", "source": "/k8s/c/api/v1/nodes",
            "type": "io.kubeeventbridge.object.deleted", "cluster": "c", "apiversion": "v1",
            "kind": "Node", "resource": "nodes", "name": "n1", "uid": "u2",
            "resourceversion": "7", "sequence": "00000000000000000007", "partitionkey": "n1",
            "origin": "repaired", "payload": "reference", "truncated": "true",
            "data": {"apiVersion": "v1", "kind": "Node"}
        });
        let headers = [(
            "Content-Type",
            b"application/cloudevents+json; charset=utf-8".as_slice(),
        )];
        let e = decode(Binding::Nats, headers, body.to_string().as_bytes()).unwrap();
        assert_eq!(e.change, ChangeType::Deleted);
        assert_eq!(e.namespace, None);
        assert_eq!(e.partition_key, "n1");
        assert_eq!(e.origin, Origin::Repaired);
        assert_eq!(e.payload, Payload::Reference);
        assert!(e.truncated);
        assert_eq!(e.data["kind"], "Node");
    }

    #[test]
    fn a_missing_attribute_is_named() {
        let headers: Vec<_> = kafka_headers()
            .into_iter()
            .filter(|(k, _)| *k != "ce_uid")
            .collect();
        let error = decode(Binding::Kafka, headers, b"{}").unwrap_err();
        assert_eq!(error.to_string(), "attribute uid is missing");
    }

    #[test]
    fn a_foreign_event_type_is_refused() {
        let headers: Vec<_> = kafka_headers()
            .into_iter()
            .map(|(k, v)| {
                if k == "ce_type" {
                    (k, b"dev.knative.apiserver.resource.update".as_slice())
                } else {
                    (k, v)
                }
            })
            .collect();
        let error = decode(Binding::Kafka, headers, b"{}").unwrap_err();
        assert!(
            error.to_string().starts_with("attribute type has"),
            "{error}"
        );
    }

    /// A begin marker as the bridge writes it (`src/demand/marker.rs`).
    fn begin_marker() -> Value {
        json!({
            "specversion": "1.0", "id": "5f0c:prod.0123456789abcdef:begin",
            "source": "/k8s/prod/api/v1/configmaps", "type": SNAPSHOT_BEGIN,
            "subject": "v1/configmaps in shop", "time": "1970-01-01T00:00:00Z",
            "cluster": "prod", "apiversion": "v1", "resource": "configmaps", "namespace": "shop",
            "partitionkey": "5f0c:prod.0123456789abcdef:begin", "snapshotid": "5f0c",
            "datacontenttype": "application/json",
            "data": {"snapshotId": "5f0c", "request": "bridge/snap-1",
                     "watch": "v1/configmaps in shop", "cluster": "prod",
                     "resource": "v1/configmaps", "namespace": "shop",
                     "labelSelector": "app=web", "expected": 42}
        })
    }

    #[test]
    fn snapshot_markers_are_recognized_in_either_binding() {
        let structured = [("content-type", STRUCTURED.as_bytes())];
        let body = begin_marker().to_string();
        let Message::Marker(m) =
            decode_message(Binding::Kafka, structured, body.as_bytes()).unwrap()
        else {
            panic!("a marker");
        };
        assert_eq!(m.snapshot_id, "5f0c");
        assert_eq!(m.watch, "prod.0123456789abcdef");
        assert_eq!(m.namespace.as_deref(), Some("shop"));
        assert_eq!(
            m.kind,
            MarkerKind::Begin {
                label_selector: Some("app=web".into()),
                expected: Some(42)
            }
        );
        let mut end = begin_marker();
        end["type"] = json!(SNAPSHOT_END);
        end["data"] = json!({"snapshotId": "5f0c", "request": "bridge/snap-1", "watch": "w",
            "sent": 40, "skipped": 2, "result": "failed", "message": "the request was deleted"});
        let Message::Marker(m) = decode_structured_message(end.to_string().as_bytes()).unwrap()
        else {
            panic!("a marker");
        };
        assert_eq!(
            m.kind,
            MarkerKind::End {
                sent: 40,
                skipped: 2,
                pruned: 0,
                result: SnapshotResult::Failed("the request was deleted".into())
            }
        );
        let error = decode_structured(body.as_bytes()).unwrap_err();
        assert!(matches!(error, Error::Marker(_)), "{error}");
    }

    #[test]
    fn a_marker_whose_id_names_no_watch_is_refused_naming_the_id() {
        for id in ["5f0c", "5f0c::begin", "5f0c:prod.0123456789abcdef:middle"] {
            let mut marker = begin_marker();
            marker["id"] = json!(id);
            let error = decode_structured_message(marker.to_string().as_bytes()).unwrap_err();
            assert!(error.to_string().contains(id), "{id}: {error}");
        }
    }

    #[test]
    fn a_marker_without_its_count_names_the_member() {
        let mut marker = begin_marker();
        marker["type"] = json!(SNAPSHOT_END);
        marker["data"] = json!({"snapshotId": "5f0c", "request": "bridge/snap-1", "watch": "w",
            "skipped": 0, "result": "complete"});
        let error = decode_structured_message(marker.to_string().as_bytes()).unwrap_err();
        let source = std::error::Error::source(&error).unwrap().to_string();
        assert!(source.contains("sent"), "{error}: {source}");
    }

    #[test]
    fn a_begin_marker_with_no_count_has_none() {
        let mut marker = begin_marker();
        marker["data"]["expected"] = json!(null);
        let Message::Marker(m) = decode_structured_message(marker.to_string().as_bytes()).unwrap()
        else {
            panic!("a marker");
        };
        assert!(
            matches!(m.kind, MarkerKind::Begin { expected: None, .. }),
            "{:?}",
            m.kind
        );
    }
}
