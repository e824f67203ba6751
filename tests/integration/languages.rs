//! The consumer examples in other languages, against the real brokers: the Python example
//! (`examples/consumers/python`: confluent-kafka and the CloudEvents SDK's Kafka binding) reads
//! a topic, the Go example (`examples/consumers/go`: nats.go's JetStream API) a stream, that the
//! bridge wrote through creates, updates, deletes and a recreated name; each store ends equal to
//! a live LIST (uid and resourceVersion). The Python store's own unit tests pass too (the Go
//! example's run with `go test` in its folder).
//!
//! `KEB_PYTHON` (a venv with the examples' pinned packages from PyPI) and `KEB_GO_NATSSTORE` (the
//! Go example, built) come from `scripts/testenv`; without them the tests fail.

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

#[test]
fn python_store_follows_the_event_contract() {
    let out = Command::new(python())
        .args(["-m", "unittest", "test_store"])
        .current_dir(example_dir())
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn go_store_follows_the_event_contract() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/consumers/go");
    let out = Command::new("go")
        .args(["test", "./..."])
        .current_dir(dir)
        .env("GOFLAGS", "-mod=readonly")
        .env("GOTOOLCHAIN", "local")
        .output()
        .expect("run go test (Go is part of the environment: scripts/testenv builds with it)");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
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
    let out = java().arg("StoreTest").output().expect("run java");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs the Java Kafka store over `topic`: the objects it holds, uid → resourceVersion.
fn java_store(topic: &str) -> BTreeMap<String, String> {
    let out = java()
        .args(["KafkaStore", &support::env().kafka_bootstrap, topic])
        .output()
        .expect("run java");
    assert!(
        out.status.success(),
        "KafkaStore failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    serde_json::from_value(report["objects"].clone()).expect("objects")
}

fn cm(name: &str, v: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": v}})).unwrap()
}

/// Runs the Python Kafka store over `topic`: the objects it holds, uid → resourceVersion.
fn python_store(topic: &str) -> BTreeMap<String, String> {
    let out = Command::new(python())
        .args(["kafka_store.py", &support::env().kafka_bootstrap, topic])
        .current_dir(example_dir())
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "kafka_store.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    serde_json::from_value(report["objects"].clone()).expect("objects")
}

/// Runs the Go NATS store over `stream`: the objects it holds, uid → resourceVersion.
fn go_store(stream: &str) -> BTreeMap<String, String> {
    let bin = match std::env::var("KEB_GO_NATSSTORE") {
        Ok(p) if Path::new(&p).is_file() => p,
        _ => panic!(
            "the Go consumer example is not built (KEB_GO_NATSSTORE): run `scripts/testenv up` and \
             load its variables"
        ),
    };
    let out = Command::new(bin)
        .args([&support::env().nats_url, stream])
        .output()
        .expect("run natsstore");
    assert!(
        out.status.success(),
        "natsstore failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    serde_json::from_value(report["objects"].clone()).expect("objects")
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

#[tokio::test(flavor = "multi_thread")]
async fn python_kafka_consumer_store_equals_the_live_list() {
    let topic = |cluster: &str| format!("k8s.{cluster}.core.configmaps");
    store_equals_the_live_list(
        SinkKind::Kafka,
        async |cluster| support::create_topic(&topic(cluster), 3).await,
        |cluster| python_store(&topic(cluster)),
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
async fn java_kafka_consumer_store_equals_the_live_list() {
    let topic = |cluster: &str| format!("k8s.{cluster}.core.configmaps");
    store_equals_the_live_list(
        SinkKind::Kafka,
        async |cluster| support::create_topic(&topic(cluster), 3).await,
        |cluster| java_store(&topic(cluster)),
    )
    .await;
}
