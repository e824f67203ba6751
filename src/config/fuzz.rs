//! The decoder of a file this process did not write: arbitrary text, and arbitrary documents of
//! the configuration's shape, never make `parse` or `validate` panic.

use proptest::prelude::*;
use serde_json::{Map, Value};

use super::ConfigFile;

/// A few hundred cases per property: fast enough for every CI run.
fn cases() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Parses and, when the shape is right, validates: errors are fine, panics are not.
fn decode(text: &str) {
    if let Ok(file) = ConfigFile::parse(text) {
        let _ = file.validate();
    }
}

/// Every key of the file, so that generated documents reach the validation.
const KEYS: &[&str] = &[
    "cluster",
    "kubernetes",
    "kubeconfig",
    "context",
    "qps",
    "burst",
    "initialList",
    "resources",
    "apiVersion",
    "resource",
    "exclude",
    "namespaces",
    "namespaceSelector",
    "labelSelector",
    "fieldSelector",
    "events",
    "payload",
    "includePrevious",
    "ignorePaths",
    "dropUnchangedUpdates",
    "redact",
    "redactSecretData",
    "stripManagedFields",
    "stripLastApplied",
    "topic",
    "subject",
    "key",
    "tombstones",
    "eventFormat",
    "sink",
    "kafka",
    "bootstrapServers",
    "contentMode",
    "properties",
    "propertyFiles",
    "nats",
    "url",
    "jetstream",
    "stream",
    "create",
    "duplicateWindowSecs",
    "ackTimeoutSecs",
    "credentials",
    "user",
    "passwordFile",
    "stdout",
    "http",
    "timeoutSecs",
    "maxRetryAfterSecs",
    "extensions",
    "bearerTokenFile",
    "tlsCaFile",
    "delivery",
    "queueCapacity",
    "maxInFlight",
    "shutdownGraceSecs",
    "checkpoint",
    "enabled",
    "kafkaTopic",
    "natsBucket",
    "directory",
    "intervalMs",
    "initialSnapshot",
    "leaderElection",
    "leaseName",
    "namespace",
    "identity",
    "leaseDurationSecs",
    "retryPeriodSecs",
    "sharding",
    "leasePrefix",
    "renewSecs",
    "admin",
    "address",
    "shutdownDelaySecs",
    "heartbeat",
    "intervalSecs",
    "destination",
    "discovery",
    "refreshSecs",
];

/// Strings that mean something somewhere in the file, and noise.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "v1",
            "apps/v1",
            "*.example.com/*",
            "example.com/*",
            "*",
            "pods",
            "ConfigMap",
            "added",
            "deleted",
            "full",
            "diff",
            "reference",
            "knative",
            "uid",
            "namespacedName",
            "initial",
            "none",
            "auto",
            "stream",
            "list",
            "/status",
            "/metadata/name",
            "{cluster}",
            "k8s.{cluster}.{group}.{resource}",
            "{name}",
            "a..b",
            ".",
            "127.0.0.1:0",
            "x:1",
            "nats://x",
            "dev",
            "",
            "~1",
            "{",
            "}",
        ])
        .prop_map(str::to_string),
        "[a-z0-9{}.*>/ _~-]{0,12}",
        any::<String>(),
    ]
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(|n| Value::Number(n.into())),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        // Not a number and the infinities become null (JSON has none); text covers `.nan`.
        any::<f64>().prop_map(Value::from),
        (0u64..4).prop_map(|n| Value::Number(n.into())),
        text().prop_map(Value::String),
    ]
}

/// A YAML value of the configuration's shape: maps keyed mostly by its own keys.
fn document() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(4, 48, 6, |inner| {
        let key = prop_oneof![
            4 => prop::sample::select(KEYS).prop_map(str::to_string),
            1 => text(),
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key, inner), 0..6).prop_map(|entries| {
                Value::Object(entries.into_iter().collect::<Map<String, Value>>())
            }),
        ]
    })
}

/// What a setting holds, to generate values it parses as (mostly).
#[derive(Debug, Clone, Copy)]
enum Kind {
    Integer,
    Float,
    Text,
    Flag,
    Texts,
}

/// A value for a setting of `kind`; now and then one of any shape.
fn value(kind: Kind) -> BoxedStrategy<Value> {
    let typed = match kind {
        Kind::Integer => prop_oneof![
            any::<u64>(),
            0u64..4,
            Just(u64::from(u32::MAX) + 1),
            Just(1_000_000_000_000_000_000),
        ]
        .prop_map(|n| Value::Number(n.into()))
        .boxed(),
        // JSON values have no NaN or infinities (they would become null): those are written
        // as YAML text in `non_finite_floats_are_refused_without_panicking`.
        Kind::Float => prop_oneof![any::<f64>(), Just(1e-20), Just(-1.0)]
            .prop_map(Value::from)
            .boxed(),
        Kind::Text => text().prop_map(Value::String).boxed(),
        Kind::Flag => any::<bool>().prop_map(Value::Bool).boxed(),
        Kind::Texts => prop::collection::vec(text().prop_map(Value::String), 0..4)
            .prop_map(Value::Array)
            .boxed(),
    };
    prop_oneof![9 => typed, 1 => document()].boxed()
}

/// The settings the mutations replace, with what each holds.
const SETTINGS: &[(&str, Kind)] = &[
    ("cluster", Kind::Text),
    ("kubernetes.qps", Kind::Float),
    ("kubernetes.burst", Kind::Integer),
    ("kubernetes.initialList", Kind::Text),
    ("resources.0.apiVersion", Kind::Text),
    ("resources.0.resource", Kind::Text),
    ("resources.0.namespaces", Kind::Texts),
    ("resources.0.namespaceSelector", Kind::Text),
    ("resources.0.labelSelector", Kind::Text),
    ("resources.0.events", Kind::Texts),
    ("resources.0.topic", Kind::Text),
    ("resources.0.subject", Kind::Text),
    ("resources.0.ignorePaths", Kind::Texts),
    ("resources.0.redact", Kind::Texts),
    ("resources.0.payload", Kind::Text),
    ("resources.0.includePrevious", Kind::Flag),
    ("resources.0.tombstones", Kind::Flag),
    ("resources.0.key", Kind::Text),
    ("resources.0.exclude.0.resource", Kind::Text),
    ("resources.0.exclude.0.apiVersion", Kind::Text),
    ("resources.1.apiVersion", Kind::Text),
    ("resources.1.resource", Kind::Text),
    ("sink.kafka.topic", Kind::Text),
    ("sink.kafka.bootstrapServers", Kind::Text),
    ("sink.nats.subject", Kind::Text),
    ("sink.http.url", Kind::Text),
    ("sink.http.maxInFlight", Kind::Integer),
    ("sink.http.timeoutSecs", Kind::Integer),
    ("resources.0.url", Kind::Text),
    ("sink.nats.jetstream.stream", Kind::Text),
    ("sink.nats.jetstream.ackTimeoutSecs", Kind::Integer),
    ("sink.nats.jetstream.duplicateWindowSecs", Kind::Integer),
    ("delivery.queueCapacity", Kind::Integer),
    ("delivery.maxInFlight", Kind::Integer),
    ("delivery.shutdownGraceSecs", Kind::Integer),
    ("checkpoint.enabled", Kind::Flag),
    ("checkpoint.intervalMs", Kind::Integer),
    ("checkpoint.kafkaTopic", Kind::Text),
    ("checkpoint.natsBucket", Kind::Text),
    ("leaderElection.enabled", Kind::Flag),
    ("leaderElection.leaseDurationSecs", Kind::Integer),
    ("leaderElection.retryPeriodSecs", Kind::Integer),
    ("sharding.enabled", Kind::Flag),
    ("sharding.leaseDurationSecs", Kind::Integer),
    ("sharding.renewSecs", Kind::Integer),
    ("admin.address", Kind::Text),
    ("admin.shutdownDelaySecs", Kind::Integer),
    ("heartbeat.enabled", Kind::Flag),
    ("heartbeat.intervalSecs", Kind::Integer),
    ("heartbeat.destination", Kind::Text),
    ("discovery.refreshSecs", Kind::Integer),
    ("eventFormat", Kind::Text),
    ("initialSnapshot", Kind::Text),
];

/// A valid file with some of its settings replaced by arbitrary values.
fn mutated() -> impl Strategy<Value = Value> {
    let change =
        prop::sample::select(SETTINGS).prop_flat_map(|(path, kind)| (Just(path), value(kind)));
    let sink = prop::sample::select(vec![
        "{kafka: {bootstrapServers: 'x:1'}}",
        "{nats: {url: 'nats://x', jetstream: {stream: s}}}",
        "{stdout: {}}",
        "{http: {url: 'http://x/{namespace}'}}",
    ]);
    (sink, prop::collection::vec(change, 1..4)).prop_map(|(sink, changes)| {
        let mut doc: Value = serde_saphyr::from_str(&format!(
            "cluster: dev\nresources: [{{apiVersion: v1, resource: pods}}]\nsink: {sink}\n"
        ))
        .unwrap();
        for (path, value) in changes {
            set(&mut doc, path, value);
        }
        doc
    })
}

/// Sets `value` at a dotted `path`, making maps (or list items) on the way.
fn set(doc: &mut Value, path: &str, value: Value) {
    let mut at = doc;
    for part in path.split('.') {
        at = match part.parse::<usize>() {
            Ok(i) => {
                if !at.is_array() {
                    *at = Value::Array(Vec::new());
                }
                let list = at.as_array_mut().unwrap();
                while list.len() <= i {
                    list.push(Value::Object(Map::new()));
                }
                &mut list[i]
            }
            Err(_) => {
                if !at.is_object() {
                    *at = Value::Object(Map::new());
                }
                let map = at.as_object_mut().unwrap();
                map.entry(part).or_insert(Value::Object(Map::new()))
            }
        };
    }
    *at = value;
}

#[test]
fn non_finite_floats_are_refused_without_panicking() {
    for value in [".nan", ".NaN", ".inf", "-.inf", "+.Inf"] {
        let text = format!(
            "cluster: dev\nresources: [{{apiVersion: v1, resource: pods}}]\nkubernetes: {{qps: {value}}}\n"
        );
        let refused = ConfigFile::parse(&text).and_then(ConfigFile::validate);
        assert!(refused.is_err(), "{value}");
    }
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        decode(&text);
    }

    #[test]
    fn yaml_like_text_never_panics(text in "[a-zA-Z0-9:{}\\[\\],.*&!|>'\"#%@ \n-]{0,200}") {
        decode(&text);
    }

    #[test]
    fn documents_of_the_configs_shape_never_panic(doc in document()) {
        decode(&serde_saphyr::to_string(&doc).unwrap());
    }

    #[test]
    fn valid_files_with_arbitrary_settings_never_panic(doc in mutated()) {
        decode(&serde_saphyr::to_string(&doc).unwrap());
    }
}
