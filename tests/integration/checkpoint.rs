//! Checkpoints end to end: a restarted bridge resumes from its checkpoint without a LIST, publishes
//! exactly what changed while it was down, and replays nothing.

use std::collections::BTreeSet;
use std::time::Duration;

use cloudevents::AttributesReader;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::{Bridge, Reader, SinkKind, sink_yaml, summary};
use crate::support::{kube_client, unique_name, unique_namespace};

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": "0"}})).unwrap()
}

async fn resume(sink: SinkKind) {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "resume").await;
    let cluster = unique_name("c");
    let dir = tempfile::tempdir().unwrap();
    let mut config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}",
        sink_yaml(sink, &cluster)
    );
    if sink == SinkKind::Stdout {
        config.push_str(&format!(
            "checkpoint: {{directory: {}}}\n",
            dir.path().display()
        ));
    }
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    cms.create(&pp, &cm("pre")).await.unwrap();
    let topics = vec![format!("k8s.{cluster}.core.configmaps")];

    let mut first = Bridge::start(&config);
    let mut reader = Reader::for_sink(sink, &cluster, &topics, &first).await;
    first.wait_synced(1).await;
    cms.create(&pp, &cm("a")).await.unwrap();
    let seen = reader
        .read_until(Duration::from_secs(60), |got| got.len() >= 2)
        .await;
    first.signal("TERM");
    let status = first
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("exit after SIGTERM");
    assert!(status.success(), "{}", first.log_text());

    // While the bridge is down.
    let a2 = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": "1"}})),
        )
        .await
        .unwrap();
    let b = cms.create(&pp, &cm("b")).await.unwrap();
    cms.delete("pre", &DeleteParams::default()).await.unwrap();

    let second = Bridge::start(&config);
    if sink == SinkKind::Stdout {
        reader = Reader::stdout(&second);
    }
    let mut events = reader
        .read_until(Duration::from_secs(60), |got| got.len() >= 3)
        .await;
    events.extend(reader.drain(Duration::from_secs(2)).await);
    let got: BTreeSet<(String, String, String)> = events
        .iter()
        .map(|r| (r.ext("name"), r.change().to_string(), r.ext("origin")))
        .collect();
    let want: BTreeSet<(String, String, String)> =
        [("a", "modified"), ("b", "added"), ("pre", "deleted")]
            .iter()
            .map(|(n, c)| (n.to_string(), c.to_string(), "live".to_string()))
            .collect();
    assert_eq!(
        got,
        want,
        "exactly the changes made while down:\n{}",
        summary(&events)
    );
    assert_eq!(events.len(), 3, "nothing replayed:\n{}", summary(&events));
    let a = events.iter().find(|r| r.ext("name") == "a").unwrap();
    assert_eq!(
        a.ext("resourceversion"),
        a2.metadata.resource_version.unwrap()
    );
    let bev = events.iter().find(|r| r.ext("name") == "b").unwrap();
    assert_eq!(bev.ext("uid"), b.metadata.uid.unwrap());
    let ids: BTreeSet<String> = seen
        .iter()
        .chain(&events)
        .map(|r| r.event.id().to_string())
        .collect();
    assert_eq!(ids.len(), 5);
    assert_eq!(
        second.count_log("listed"),
        0,
        "a resume within the watch history needs no LIST; log:\n{}",
        second.log_text()
    );
    assert_eq!(second.count_log("resuming from checkpoint"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_restart_resumes_from_checkpoint() {
    resume(SinkKind::Kafka).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_restart_resumes_from_checkpoint() {
    resume(SinkKind::Nats).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stdout_restart_resumes_from_checkpoint_file() {
    resume(SinkKind::Stdout).await;
}

/// `initialSnapshot: none`: existing objects are indexed but not published; changes are.
#[tokio::test(flavor = "multi_thread")]
async fn snapshot_policy_none_publishes_only_changes() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "nosnap").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    cms.create(&PostParams::default(), &cm("existing"))
        .await
        .unwrap();
    let config = format!(
        "cluster: dev\ninitialSnapshot: none\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink: {{stdout: {{}}}}\n"
    );
    let mut bridge = Bridge::start(&config);
    let mut reader = Reader::stdout(&bridge);
    bridge.wait_synced(1).await;
    cms.patch(
        "existing",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "1"}})),
    )
    .await
    .unwrap();
    let events = reader
        .read_until(Duration::from_secs(30), |got| !got.is_empty())
        .await;
    let extra = reader.drain(Duration::from_secs(1)).await;
    assert!(extra.is_empty(), "{}", summary(&extra));
    assert_eq!(events.len(), 1);
    assert_eq!(
        events[0].change(),
        "modified",
        "the existing object is known, so its change is a modify"
    );
}

/// Heartbeats: a quiet watch keeps publishing its checkpoint's resourceVersion and lag on the
/// heartbeat topic, visible to a `read_committed` consumer.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_heartbeats_report_the_checkpoint() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "heartbeat").await;
    let cluster = unique_name("c");
    let config = format!(
        "cluster: {cluster}\nheartbeat: {{enabled: true, intervalSecs: 1}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}",
        sink_yaml(SinkKind::Kafka, &cluster)
    );
    let topic = format!("k8s.{cluster}.heartbeats");
    crate::support::create_topic(&topic, 1).await;
    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(1).await;
    let consumer = crate::support::kafka_consumer(&unique_name("hb"));
    use rdkafka::Message;
    use rdkafka::consumer::Consumer;
    consumer.subscribe(&[topic.as_str()]).unwrap();
    let mut beats = Vec::new();
    while beats.len() < 3 {
        let m = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .expect("a heartbeat within 30 s")
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(m.payload().unwrap()).unwrap();
        beats.push(v);
    }
    for b in &beats {
        assert_eq!(b["type"], "io.kubeeventbridge.heartbeat");
        assert_eq!(b["cluster"], cluster.as_str());
        assert!(
            b["data"]["checkpointResourceVersion"]
                .as_str()
                .is_some_and(|rv| !rv.is_empty()),
            "{b}"
        );
        assert_eq!(b["data"]["lagResourceVersions"], 0, "{b}");
    }
}

/// `kube-event-bridge snapshot` deletes a watch's checkpoint: the running instance is fenced and
/// exits, and the next start lists and publishes every object again as a snapshot.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_forced_snapshot_fences_and_republishes() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "forcesnap").await;
    let cluster = unique_name("c");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for name in ["one", "two"] {
        cms.create(&PostParams::default(), &cm(name)).await.unwrap();
    }
    let config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}",
        sink_yaml(SinkKind::Kafka, &cluster)
    );
    let mut first = Bridge::start(&config);
    first.wait_synced(1).await;
    let path = first.dir().join("bridge.yaml");
    let (status, stdout, stderr) = crate::harness::run_cli(&[
        "snapshot",
        "--config",
        path.to_str().unwrap(),
        "--resource",
        "v1/configmaps",
    ]);
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("checkpoint reset"), "{stdout}");
    let patched = cms
        .patch(
            "one",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": "1"}})),
        )
        .await
        .unwrap();
    let exit = first
        .wait_exit(Duration::from_secs(60))
        .await
        .expect("the fenced instance exits");
    assert!(!exit.success());

    let mut second = Bridge::start(&config);
    second.wait_synced(1).await;
    assert_eq!(second.count_log("listed"), 1, "no checkpoint: a fresh list");
    let mut reader = Reader::kafka(&[format!("k8s.{cluster}.core.configmaps")]).await;
    // The second start lists again: both objects arrive as snapshot events in their current
    // state (whether the first start's snapshot was committed before it was fenced or not).
    let patched_rv = patched.metadata.resource_version.clone().unwrap();
    let events = reader
        .read_until(Duration::from_secs(60), |got| {
            let snap = |name: &str, rv: Option<&str>| {
                got.iter().any(|r| {
                    r.ext("origin") == "snapshot"
                        && r.ext("name") == name
                        && rv.is_none_or(|rv| r.ext("resourceversion") == rv)
                })
            };
            snap("one", Some(&patched_rv)) && snap("two", None)
        })
        .await;
    assert!(
        events.iter().all(|r| r.ext("origin") != "repaired"),
        "{}",
        summary(&events)
    );
}
