//! The consumer examples in other languages, against the real brokers: Python
//! (`examples/consumers/python`: confluent-kafka and the CloudEvents SDK's Kafka binding for a
//! topic, nats-py and its HTTP binding for a stream), Java (`examples/consumers/java`:
//! kafka-clients, a topic) and Go (`examples/consumers/go`: franz-go for a topic, nats.go's
//! JetStream API for a stream) each read what the bridge wrote through creates, updates, deletes
//! and a recreated name; each store ends equal to a live LIST (uid and resourceVersion). The
//! stores' own unit tests pass too (Python's `test_store.py`, Java's `StoreTest`, Go's `go test`).
//!
//! `KEB_PYTHON` (a venv with the examples' pinned packages from PyPI), `KEB_GO_NATSSTORE` and
//! `KEB_GO_KAFKASTORE` (the Go examples, built) and `KEB_JAVA_CONSUMER` come from
//! `scripts/testenv`; without them the tests fail.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::{Bridge, SinkKind, sink_yaml, stream_name};
use crate::support::{self, kube_client, unique_name, unique_namespace};

fn python() -> String {
    match std::env::var("KEB_PYTHON") {
        Ok(p) if Path::new(&p).is_file() => p,
        Ok(p) => panic!(
            "the consumer examples' Python is not available (KEB_PYTHON={p} does not exist): run \
             `scripts/testenv up` (it installs them) and load its variables"
        ),
        Err(_) => panic!(
            "the consumer examples' Python is not available (KEB_PYTHON is not set): run \
             `scripts/testenv up` and load its variables (`eval \"$(scripts/testenv env)\"`)"
        ),
    }
}

fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/consumers/python")
}

/// Runs `cmd` (`what` names it) to completion; panics with its output unless it succeeds.
fn succeeds(mut cmd: Command, what: &str) -> Vec<u8> {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Runs a store example (`what` names it): the objects it reports, uid → resourceVersion.
fn objects(cmd: Command, what: &str) -> BTreeMap<String, String> {
    let report: serde_json::Value =
        serde_json::from_slice(&succeeds(cmd, what)).expect("a JSON report");
    serde_json::from_value(report["objects"].clone()).expect("objects")
}

#[test]
fn python_store_follows_the_event_contract() {
    let mut cmd = Command::new(python());
    cmd.args(["-m", "unittest", "test_store"])
        .current_dir(example_dir());
    succeeds(cmd, "the Python store's unit tests");
}

#[test]
fn go_store_follows_the_event_contract() {
    let mut cmd = Command::new("go");
    cmd.args(["test", "./..."])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/consumers/go"))
        .env("GOFLAGS", "-mod=readonly")
        .env("GOTOOLCHAIN", "local");
    succeeds(cmd, "go test of the Go store");
}

/// `java` with the Java example's classes and the Kafka jars on its class path.
fn java() -> Command {
    let var = |name: &str| match std::env::var(name) {
        Ok(p) if Path::new(&p).exists() => p,
        _ => panic!(
            "{name} is not set or names nothing: run `scripts/testenv up` (it compiles the Java \
             example) and load its variables"
        ),
    };
    let mut cmd = Command::new("java");
    cmd.arg("-cp").arg(format!(
        "{}:{}/*",
        var("KEB_JAVA_CONSUMER"),
        var("KEB_KAFKA_LIBS")
    ));
    cmd
}

#[test]
fn java_store_follows_the_event_contract() {
    let mut cmd = java();
    cmd.arg("StoreTest");
    succeeds(cmd, "the Java store's checks");
}

/// Runs the Java Kafka store over `topic`: the objects it holds, uid → resourceVersion.
fn java_store(topic: &str) -> BTreeMap<String, String> {
    let mut cmd = java();
    cmd.args(["KafkaStore", &support::env().kafka_bootstrap, topic]);
    objects(cmd, "KafkaStore")
}

fn cm(name: &str, v: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": v}})).unwrap()
}

/// Runs the Python Kafka store over `topic`: the objects it holds, uid → resourceVersion.
fn python_store(topic: &str) -> BTreeMap<String, String> {
    let mut cmd = Command::new(python());
    cmd.args(["kafka_store.py", &support::env().kafka_bootstrap, topic])
        .current_dir(example_dir());
    objects(cmd, "kafka_store.py")
}

/// Runs the Python NATS store (nats-py) over `stream`: the objects it holds, uid →
/// resourceVersion.
fn python_nats_store(stream: &str) -> BTreeMap<String, String> {
    let mut cmd = Command::new(python());
    cmd.args(["nats_store.py", &support::env().nats_url, stream])
        .current_dir(example_dir());
    objects(cmd, "nats_store.py")
}

/// A Go consumer example, built by `scripts/testenv` (its path in `var`).
fn go_example(var: &str) -> Command {
    match std::env::var(var) {
        Ok(p) if Path::new(&p).is_file() => Command::new(p),
        _ => panic!(
            "the Go consumer examples are not built ({var}): run `scripts/testenv up` and load \
             its variables"
        ),
    }
}

/// Runs the Go NATS store (nats.go) over `stream`: the objects it holds, uid → resourceVersion.
fn go_store(stream: &str) -> BTreeMap<String, String> {
    let mut cmd = go_example("KEB_GO_NATSSTORE");
    cmd.args([&support::env().nats_url, stream]);
    objects(cmd, "natsstore")
}

/// Runs the Go Kafka store (franz-go) over `topic`: the objects it holds, uid → resourceVersion.
fn go_kafka_store(topic: &str) -> BTreeMap<String, String> {
    let mut cmd = go_example("KEB_GO_KAFKASTORE");
    cmd.args([&support::env().kafka_bootstrap, topic]);
    objects(cmd, "kafkastore")
}

/// Runs a bridge on `sink` over a fresh namespace through creates (before and after its start),
/// updates, deletes and a name deleted and created again; returns the live LIST (uid →
/// resourceVersion) once `store` equals it, or panics with both after a minute.
async fn store_equals_the_live_list(
    sink: SinkKind,
    prepare: impl AsyncFnOnce(&str),
    store: impl Fn(&str) -> BTreeMap<String, String>,
) {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "lang").await;
    let cluster = unique_name("c");
    prepare(&cluster).await;
    let config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}",
        sink_yaml(sink, &cluster)
    );
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    for i in 0..10 {
        cms.create(&pp, &cm(&format!("before-{i}"), "0"))
            .await
            .unwrap();
    }
    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(1).await;
    for i in 0..20 {
        cms.create(&pp, &cm(&format!("live-{i}"), "0"))
            .await
            .unwrap();
    }
    for i in 0..10 {
        let patch = Patch::Merge(json!({"data": {"v": "1"}}));
        cms.patch(&format!("live-{i}"), &PatchParams::default(), &patch)
            .await
            .unwrap();
    }
    for name in ["before-0", "before-1", "live-19"] {
        cms.delete(name, &DeleteParams::default()).await.unwrap();
    }
    cms.delete("before-2", &DeleteParams::default())
        .await
        .unwrap();
    cms.create(&pp, &cm("before-2", "again")).await.unwrap();
    let live: BTreeMap<String, String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| {
            (
                c.metadata.uid.unwrap(),
                c.metadata.resource_version.unwrap(),
            )
        })
        .collect();
    assert_eq!(live.len(), 27);
    // The bridge publishes within milliseconds; read again until the store has caught up.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut held = store(&cluster);
    while held != live && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        held = store(&cluster);
    }
    assert_eq!(held, live, "{sink:?}: the store equals the live LIST");
    drop(bridge);
}

/// [`store_equals_the_live_list`] for a Kafka reader: `store` reads the topic of the watch's
/// ConfigMaps (created first, three partitions).
async fn kafka_store_equals_the_live_list(store: fn(&str) -> BTreeMap<String, String>) {
    let topic = |cluster: &str| format!("k8s.{cluster}.core.configmaps");
    store_equals_the_live_list(
        SinkKind::Kafka,
        async |cluster| support::create_topic(&topic(cluster), 3).await,
        |cluster| store(&topic(cluster)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn python_kafka_consumer_store_equals_the_live_list() {
    kafka_store_equals_the_live_list(python_store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn python_nats_consumer_store_equals_the_live_list() {
    store_equals_the_live_list(
        SinkKind::Nats,
        async |_| {},
        |cluster| python_nats_store(&stream_name(cluster)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn go_nats_consumer_store_equals_the_live_list() {
    store_equals_the_live_list(
        SinkKind::Nats,
        async |_| {},
        |cluster| go_store(&stream_name(cluster)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn go_kafka_consumer_store_equals_the_live_list() {
    kafka_store_equals_the_live_list(go_kafka_store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn java_kafka_consumer_store_equals_the_live_list() {
    kafka_store_equals_the_live_list(java_store).await;
}
