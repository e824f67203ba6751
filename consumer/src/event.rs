//! Decoding what the bridge publishes: CloudEvents in binary or structured content mode (Kafka
//! `ce_` headers, NATS percent-encoded `ce-` headers), and Kafka tombstones.

use std::collections::HashMap;
use std::fmt;

use percent_encoding::percent_decode_str;
use serde_json::Value;

/// The `content-type` of a structured-mode message.
const STRUCTURED: &str = "application/cloudevents+json";
/// The prefix of every event `type` the bridge publishes.
const TYPE_PREFIX: &str = "io.kubeeventbridge.object.";

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
    /// `data`.
    pub data: Value,
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

/// Decodes a message in binary or structured mode. `headers` are (name, value) pairs as they
/// arrived; `body` is the Kafka value or NATS payload.
pub fn decode<'a>(
    binding: Binding,
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    body: &[u8],
) -> Result<Event> {
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
        return decode_structured(body);
    }
    let data = serde_json::from_slice(body).map_err(Error::Json)?;
    from_attributes(attributes, data)
}

/// Decodes the structured form (the stdout line, or a structured-mode body).
pub fn decode_structured(body: &[u8]) -> Result<Event> {
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

fn from_attributes(mut a: HashMap<String, String>, data: Value) -> Result<Event> {
    let mut take = |name: &'static str| a.remove(name).ok_or(Error::Missing(name));
    let specversion = take("specversion")?;
    if specversion != "1.0" {
        return Err(unexpected("specversion", specversion));
    }
    let ty = take("type")?;
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
}
