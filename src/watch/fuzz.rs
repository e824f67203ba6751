//! Watch events as the API server streams them, and anything else a connection may carry: every
//! line goes through kube-client's decoding (`Client::request_events`), [`step`], then what the
//! bridge does with a decoded object (digest, encoding for several resource configurations,
//! rendering destinations). Nothing may panic.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use kube::discovery::ApiResource;
use proptest::prelude::*;
use serde_json::{Value, json};

use kube::api::{DynamicObject, TypeMeta, WatchEvent};
use kube::core::Status as ApiStatus;

use super::stream::{Step, step};
use crate::change::{Change, Origin};
use crate::discovery::ResolvedResource;
use crate::encode::{self, ResourceInfo};
use crate::payload::{self, Pointer};
use crate::template::Template;

/// What kube-client yields for one line of a watch response: the event; a status for any
/// other JSON object; a decoding error; nothing for an incomplete line. kube-client's
/// `LinesCodec` reports a line that is not UTF-8 as an I/O error, and strips one `\r`.
fn decode_line(line: &[u8]) -> Option<Result<WatchEvent<DynamicObject>, kube::Error>> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = match std::str::from_utf8(line) {
        Ok(line) => line,
        Err(e) => {
            let io = std::io::Error::new(std::io::ErrorKind::InvalidData, e);
            return Some(Err(kube::Error::ReadEvents(io)));
        }
    };
    match serde_json::from_str::<WatchEvent<DynamicObject>>(line) {
        Ok(event) => Some(Ok(event)),
        Err(e) if e.is_eof() => None,
        Err(e) => Some(match serde_json::from_str::<ApiStatus>(line) {
            Ok(status) => Err(kube::Error::Api(Box::new(status))),
            Err(_) => Err(kube::Error::SerdeError(e)),
        }),
    }
}

/// Resource configurations covering every payload mode, Secret redaction, redaction and
/// ignore pointers, both event formats and both record keys.
fn infos() -> Vec<Arc<ResourceInfo>> {
    [
        ("configmaps", "ConfigMap", ""),
        (
            "configmaps",
            "ConfigMap",
            ", payload: diff, includePrevious: true, ignorePaths: [/data/x, /metadata/labels/a~1b, /spec/0], redact: [/data/password, /metadata/annotations/tok, /spec/items/1]",
        ),
        ("secrets", "Secret", ""),
        ("configmaps", "ConfigMap", ", payload: reference, key: namespacedName"),
        (
            "configmaps",
            "ConfigMap",
            ", eventFormat: knative, stripManagedFields: false, stripLastApplied: false, tombstones: true, key: namespacedName",
        ),
    ]
    .into_iter()
    .map(|(plural, kind, extra)| {
        let yaml = format!(
            "cluster: dev\nresources: [{{apiVersion: v1, resource: {plural}{extra}}}]\nsink: {{kafka: {{bootstrapServers: 'x:1'}}}}\n"
        );
        let config = crate::config::ConfigFile::parse(&yaml)
            .and_then(crate::config::ConfigFile::validate)
            .unwrap_or_else(|e| panic!("{yaml}: {e}"));
        let resolved = ResolvedResource {
            config: config.resources[0].clone(),
            api: ApiResource {
                group: String::new(),
                version: "v1".into(),
                api_version: "v1".into(),
                kind: kind.into(),
                plural: plural.into(),
            },
            namespaced: true,
        };
        Arc::new(ResourceInfo::new("dev", &resolved, "https://127.0.0.1:6443"))
    })
    .collect()
}

/// What the bridge does with one line; returns whether it produced a change.
fn handle(line: &[u8], infos: &[Arc<ResourceInfo>]) -> bool {
    let Some(decoded) = decode_line(line) else {
        return false;
    };
    let Ok(Step::Event(kind, mut object, rv)) = step(decoded, "1") else {
        return false;
    };
    assert_eq!(
        object.metadata.resource_version.as_deref(),
        Some(rv.as_str())
    );
    let uid = object.metadata.uid.clone().expect("an event has a uid");
    object.types.get_or_insert_with(|| TypeMeta {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
    });
    let before = serde_json::to_value(&object).expect("a decoded object serializes");
    let ignore: Vec<Pointer> = ["/data/x", "/metadata/labels/a", "/spec/0", "/status"]
        .iter()
        .map(|p| Pointer::parse(p).unwrap())
        .collect();
    let mut scratch = Vec::new();
    let digest = payload::digest(&mut object, &ignore, &mut scratch);
    assert_eq!(
        serde_json::to_value(&object).unwrap(),
        before,
        "digest restores the object"
    );
    assert_eq!(digest, payload::digest(&mut object, &ignore, &mut scratch));
    assert_ne!(digest, 0);
    for info in infos {
        let change = Change {
            kind,
            origin: Origin::Live,
            object: object.clone(),
            observed: SystemTime::now(),
        };
        let previous = serde_json::to_vec(&json!({"metadata": {"name": "before"}})).unwrap();
        match encode::encode(info, change, Some(&previous)) {
            Ok(encoded) => {
                let mut event = encoded.event;
                assert_eq!(event.id, encode::event_id(&uid, &rv, kind));
                let structured: Value = serde_json::from_slice(&event.to_structured_json())
                    .expect("the structured event is JSON");
                assert_eq!(structured["id"], event.id.as_str());
                let _ = event.reference();
                for template in ["k8s.{cluster}.{group}.{resource}.{namespace}", "x.{name}"] {
                    let t = Template::parse(template).unwrap();
                    let _ = t.render_topic(&event.template_values());
                    let _ = t.render_subject(&event.template_values());
                }
                event.truncate();
                serde_json::from_slice::<Value>(&event.to_structured_json())
                    .expect("the truncated event is JSON");
            }
            Err(e) => assert!(
                object.metadata.name.as_deref().is_none_or(str::is_empty),
                "only a nameless object cannot be encoded: {e}"
            ),
        }
    }
    true
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "",
            "a",
            "web",
            "read only",
            "0",
            "1",
            "18446744073709551616",
            "-1",
            "ns/x",
            "~1",
            "/",
            "\u{0}",
            "ü",
            "\u{202e}",
            "a\nb",
            "\"",
            "\\",
        ])
        .prop_map(String::from),
        prop::collection::vec(any::<char>(), 0..12).prop_map(String::from_iter),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "metadata",
            "name",
            "namespace",
            "uid",
            "resourceVersion",
            "generation",
            "labels",
            "annotations",
            "managedFields",
            "apiVersion",
            "kind",
            "type",
            "object",
            "data",
            "stringData",
            "spec",
            "status",
            "items",
            "password",
            "tok",
            "x",
            "a/b",
            "kubectl.kubernetes.io/last-applied-configuration",
        ])
        .prop_map(String::from),
        text(),
    ]
}

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A string field as the API server sends it, or now and then any JSON at all.
fn field() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        14 => text().prop_map(|t| Some(Value::from(t))),
        1 => Just(None),
        1 => json().prop_map(Some),
    ]
}

fn string_map() -> impl Strategy<Value = Value> {
    prop_oneof![
        8 => prop::collection::btree_map(key(), text(), 0..4)
            .prop_map(|m| json!(m)),
        1 => json(),
    ]
}

/// A watch event shaped like the API server's, with arbitrary content where it allows any,
/// and now and then a field of the wrong type or an unknown event type.
fn event() -> impl Strategy<Value = Value> {
    let kind = prop_oneof![
        8 => prop::sample::select(vec!["ADDED", "MODIFIED", "DELETED"]),
        1 => prop::sample::select(vec!["BOOKMARK", "ERROR", "added", "SYNC"]),
    ];
    let meta = (
        field(),
        field(),
        field(),
        field(),
        string_map(),
        string_map(),
        json(),
        json(),
    );
    let body = prop::collection::btree_map(key(), json(), 0..5);
    (kind, meta, body).prop_map(|(kind, meta, body)| {
        let (name, namespace, uid, rv, labels, annotations, managed, generation) = meta;
        let mut metadata = BTreeMap::new();
        for (k, v) in [
            ("name", name),
            ("namespace", namespace),
            ("uid", uid),
            ("resourceVersion", rv),
        ] {
            if let Some(v) = v {
                metadata.insert(k.to_string(), v);
            }
        }
        metadata.insert("labels".into(), labels);
        metadata.insert("annotations".into(), annotations);
        if managed.is_array() {
            metadata.insert("managedFields".into(), managed);
        }
        if generation.is_i64() {
            metadata.insert("generation".into(), generation);
        }
        let mut object: serde_json::Map<String, Value> = body.into_iter().collect();
        object.insert("apiVersion".into(), "v1".into());
        object.insert("metadata".into(), json!(metadata));
        json!({"type": kind, "object": object})
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let infos = infos();
        for line in bytes.split(|b| *b == b'\n') {
            handle(line, &infos);
        }
    }

    #[test]
    fn arbitrary_json_lines_never_panic(values in prop::collection::vec(json(), 1..4)) {
        let infos = infos();
        for v in values {
            handle(v.to_string().as_bytes(), &infos);
        }
    }

    #[test]
    fn watch_events_never_panic(e in event(), cut in any::<prop::sample::Index>()) {
        let infos = infos();
        let line = e.to_string();
        handle(line.as_bytes(), &infos);
        // The same line cut short, as a dropped connection leaves it.
        handle(&line.as_bytes()[..cut.index(line.len() + 1)], &infos);
    }
}

/// The generator reaches the encoder: a good share of its events become changes.
#[test]
fn generated_events_reach_the_encoder() {
    use proptest::strategy::ValueTree;
    let infos = infos();
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = event();
    let handled = (0..200)
        .filter(|_| {
            let line = strategy
                .new_tree(&mut runner)
                .unwrap()
                .current()
                .to_string();
            handle(line.as_bytes(), &infos)
        })
        .count();
    assert!(
        handled >= 20,
        "only {handled} of 200 generated events were changes"
    );
}

#[test]
fn a_secret_with_odd_values_is_handled() {
    let infos = infos();
    let line = json!({"type": "MODIFIED", "object": {"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "read only", "namespace": "ns", "uid": "u", "resourceVersion": "18446744073709551616",
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
        "data": {"password": "c2VjcmV0"}, "spec": [1, {"x": null}]}})
    .to_string();
    assert!(handle(line.as_bytes(), &infos));
    // Duplicate keys (the generators cannot make them): kept or refused, never a panic.
    let duplicate = br#"{"type":"ADDED","object":{"metadata":{"name":"a","uid":"u","resourceVersion":"1","name":"b"},"data":{},"data":[]}}"#;
    handle(duplicate, &infos);
}
