//! The consumer examples in other languages, against the real broker: the Python example
//! (`examples/consumers/python`: confluent-kafka and the CloudEvents SDK's Kafka binding) reads
//! a topic the bridge wrote through creates, updates, deletes and a recreated name, and its store
//! ends equal to a live LIST (uid and resourceVersion); its store's own unit tests pass too.
//!
//! The interpreter is `KEB_PYTHON`, a venv `scripts/testenv` builds with the examples' pinned
//! packages from PyPI; without it the tests fail.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::{Bridge, SinkKind, sink_yaml};
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

#[tokio::test(flavor = "multi_thread")]
async fn python_kafka_consumer_store_equals_the_live_list() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "python").await;
    let cluster = unique_name("c");
    let topic = format!("k8s.{cluster}.core.configmaps");
    support::create_topic(&topic, 3).await;
    let config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}",
        sink_yaml(SinkKind::Kafka, &cluster)
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
    // Live changes: creates, updates, deletes, a name deleted and created again.
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
    // The bridge commits within tens of milliseconds; read until the store has caught up.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut held = python_store(&topic);
    while held != live && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        held = python_store(&topic);
    }
    assert_eq!(held, live, "the Python store equals the live LIST");
    drop(bridge);
}
