//! Checkpoints end to end: a restarted bridge resumes from its checkpoint without a LIST, publishes
//! exactly what changed while it was down, and replays nothing; odd object names round-trip; a
//! checkpoint that cannot be decoded is repaired by a relist; a checkpoint of another cluster and
//! an unsafe Kafka checkpoint topic are refused.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cloudevents::AttributesReader;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_event_bridge::checkpoint::{NatsStore, Staging, Store, WatchKey};
use kube_event_bridge::known::{KnownObjects, bucket_of};
use kube_event_bridge::sink::kafka::KafkaSink;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
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
    // Saves due every 10 s only: what the first bridge published after its start is
    // checkpointed by its shutdown alone (a staged NATS save included), so a restart that
    // replayed it would show that the last save was lost.
    if matches!(sink, SinkKind::Stdout | SinkKind::Http) {
        config.push_str(&format!(
            "checkpoint: {{directory: {}, intervalMs: 10000}}\n",
            dir.path().display()
        ));
    } else {
        config.push_str("checkpoint: {intervalMs: 10000}\n");
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
    // Not even a copy the broker would drop as a duplicate (JetStream's window, Kafka's
    // idempotence): the second bridge published the three changes alone.
    assert_eq!(
        metric(&second, "kube_event_bridge_events_published_total").await,
        3.0,
        "published by the second bridge; log:\n{}",
        second.log_text()
    );
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

#[tokio::test(flavor = "multi_thread")]
async fn http_restart_resumes_from_checkpoint_file() {
    resume(SinkKind::Http).await;
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

/// `kube-event-bridge snapshot --reset` deletes a watch's checkpoint: the running instance is fenced and
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
        "--reset",
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

/// The checkpoint file of the only watch of a bridge using `dir` as `checkpoint.directory`.
fn checkpoint_file(dir: &std::path::Path) -> std::path::PathBuf {
    let files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "checkpoint"))
        .collect();
    assert_eq!(files.len(), 1, "one watch, one checkpoint file: {files:?}");
    files[0].clone()
}

/// Stops a bridge with SIGTERM and asserts it exits 0.
async fn stop(bridge: &mut Bridge) {
    bridge.signal("TERM");
    let status = bridge
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("exit after SIGTERM");
    assert!(status.success(), "{}", bridge.log_text());
}

/// A counter of the bridge's `/metrics`, summed over its samples.
async fn metric(bridge: &Bridge, name: &str) -> f64 {
    let address = bridge.admin_address().await;
    let (_, body) = crate::admin::get(&address, "/metrics").await;
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("metrics parse");
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

/// RBAC objects may have names with spaces, tabs, line breaks, quotes and any other character
/// but `/` and `%`: their checkpoint round-trips, and a restart resumes from it without a LIST.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_odd_rbac_names_resume_without_relisting() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "oddnames").await;
    let cluster = unique_name("c");
    let label = unique_name("odd");
    let config = format!(
        "cluster: {cluster}\nresources:\n\
         - {{apiVersion: rbac.authorization.k8s.io/v1, resource: roles, namespaces: [{ns}]}}\n\
         - {{apiVersion: rbac.authorization.k8s.io/v1, resource: clusterroles, labelSelector: keb-test={label}}}\n{}",
        sink_yaml(SinkKind::Kafka, &cluster)
    );
    let roles: Api<Role> = Api::namespaced(client.clone(), &ns);
    let cluster_roles: Api<ClusterRole> = Api::all(client.clone());
    let pp = PostParams::default();
    let role: Role = serde_json::from_value(json!({"metadata": {"name": "read only"}})).unwrap();
    let role = roles.create(&pp, &role).await.unwrap();
    let odd_name = format!("{label} odd:\t\"quoted\" & ünïçode, {{json}} [x] \\ 😀\nend");
    let odd: ClusterRole = serde_json::from_value(
        json!({"metadata": {"name": odd_name, "labels": {"keb-test": label}}}),
    )
    .unwrap();
    let odd = cluster_roles.create(&pp, &odd).await.unwrap();
    let topics = vec![
        format!("k8s.{cluster}.rbac.authorization.k8s.io.roles"),
        format!("k8s.{cluster}.rbac.authorization.k8s.io.clusterroles"),
    ];
    let mut reader = Reader::kafka(&topics).await;

    let mut first = Bridge::start(&config);
    first.wait_synced(2).await;
    let snapshot = reader
        .read_until(Duration::from_secs(60), |got| got.len() >= 2)
        .await;
    let names: BTreeSet<String> = snapshot.iter().map(|r| r.ext("name")).collect();
    assert_eq!(
        names,
        BTreeSet::from(["read only".to_string(), odd_name.clone()]),
        "{}",
        summary(&snapshot)
    );
    stop(&mut first).await;

    // While the bridge is down.
    // kube-rs puts names in request paths as they are: encode them.
    let path = |name: &str| utf8_percent_encode(name, NON_ALPHANUMERIC).to_string();
    let patched = roles
        .patch(
            &path("read only"),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"changed": "yes"}}})),
        )
        .await
        .unwrap();
    cluster_roles
        .delete(&path(&odd_name), &DeleteParams::default())
        .await
        .unwrap();

    let second = Bridge::start(&config);
    let mut events = reader
        .read_until(Duration::from_secs(60), |got| got.len() >= 2)
        .await;
    events.extend(reader.drain(Duration::from_secs(2)).await);
    let got: BTreeSet<(String, String, String, String)> = events
        .iter()
        .map(|r| {
            (
                r.ext("uid"),
                r.ext("name"),
                r.change().to_string(),
                r.ext("origin"),
            )
        })
        .collect();
    let want = BTreeSet::from([
        (
            role.metadata.uid.clone().unwrap(),
            "read only".to_string(),
            "modified".to_string(),
            "live".to_string(),
        ),
        (
            odd.metadata.uid.clone().unwrap(),
            odd_name.clone(),
            "deleted".to_string(),
            "live".to_string(),
        ),
    ]);
    assert_eq!(got, want, "{}", summary(&events));
    assert_eq!(events.len(), 2, "nothing replayed:\n{}", summary(&events));
    let modified = events.iter().find(|r| r.change() == "modified").unwrap();
    assert_eq!(
        modified.ext("resourceversion"),
        patched.metadata.resource_version.unwrap()
    );
    assert_eq!(
        second.count_log("resuming from checkpoint"),
        2,
        "{}",
        second.log_text()
    );
    assert_eq!(second.count_log("listed"), 0, "{}", second.log_text());
    assert_eq!(
        metric(&second, "kube_event_bridge_checkpoints_corrupt_total").await,
        0.0
    );
}

/// A checkpoint file that cannot be decoded at all: the bridge starts anyway, says so at error
/// level naming the watch, counts it, lists again and publishes the whole listing as repaired;
/// the next start resumes from the checkpoint it wrote since.
#[tokio::test(flavor = "multi_thread")]
async fn stdout_corrupt_checkpoint_file_is_repaired_by_a_relist() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "corruptfile").await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "cluster: dev\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n\
         sink: {{stdout: {{}}}}\ncheckpoint: {{directory: {}}}\n",
        dir.path().display()
    );
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    cms.create(&pp, &cm("a")).await.unwrap();
    let mut first = Bridge::start(&config);
    first.wait_synced(1).await;
    stop(&mut first).await;

    let path = checkpoint_file(dir.path());
    std::fs::write(&path, b"\x00\xffnot a checkpoint\n7\tnor a bucket\n").unwrap();
    cms.create(&pp, &cm("b")).await.unwrap();

    let mut second = Bridge::start(&config);
    second.wait_synced(1).await;
    let mut reader = Reader::stdout(&second);
    let events = reader
        .read_until(Duration::from_secs(60), |got| got.len() >= 2)
        .await;
    let got: BTreeSet<(String, String, String)> = events
        .iter()
        .map(|r| (r.ext("name"), r.change().to_string(), r.ext("origin")))
        .collect();
    let want: BTreeSet<(String, String, String)> = ["a", "b"]
        .iter()
        .map(|n| (n.to_string(), "added".into(), "repaired".into()))
        .collect();
    assert_eq!(got, want, "{}", summary(&events));
    let log = second.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("checkpoint cannot be decoded"))
        .unwrap_or_else(|| panic!("no corrupt-checkpoint line:\n{log}"));
    assert!(line.contains("\"level\":\"ERROR\""), "{line}");
    assert!(
        line.contains(&format!("v1/configmaps/{ns}")),
        "names the watch: {line}"
    );
    assert_eq!(second.count_log("listed"), 1, "{log}");
    assert_eq!(
        metric(&second, "kube_event_bridge_checkpoints_corrupt_total").await,
        1.0
    );
    assert_eq!(
        metric(&second, "kube_event_bridge_events_repaired_total").await,
        2.0
    );
    stop(&mut second).await;

    let mut third = Bridge::start(&config);
    third.wait_log("resuming from checkpoint").await;
    cms.create(&pp, &cm("c")).await.unwrap();
    let mut reader = Reader::stdout(&third);
    let events = reader
        .read_until(Duration::from_secs(60), |got| !got.is_empty())
        .await;
    assert_eq!(events[0].ext("name"), "c", "{}", summary(&events));
    assert_eq!(third.count_log("listed"), 0, "{}", third.log_text());
    assert_eq!(
        metric(&third, "kube_event_bridge_checkpoints_corrupt_total").await,
        0.0
    );
    stop(&mut third).await;
}

/// A NATS checkpoint with one undecodable bucket record: the buckets that decode still serve
/// the relist diff, so only the objects of the broken bucket are published again (as repaired
/// adds), changes made meanwhile arrive as repaired, and nothing else is repeated.
#[tokio::test(flavor = "multi_thread")]
async fn nats_damaged_checkpoint_bucket_is_repaired_keeping_the_rest() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "corruptkv").await;
    let cluster = unique_name("c");
    let config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}",
        sink_yaml(SinkKind::Nats, &cluster)
    );
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    let mut uids = Vec::new();
    for name in ["a", "b", "c", "d"] {
        let created = cms.create(&pp, &cm(name)).await.unwrap();
        uids.push((name, created.metadata.uid.unwrap()));
    }
    let mut first = Bridge::start(&config);
    let mut reader = Reader::nats(&cluster).await;
    first.wait_synced(1).await;
    reader
        .read_until(Duration::from_secs(60), |got| got.len() >= 4)
        .await;
    stop(&mut first).await;

    // Break the bucket holding "a".
    let key = WatchKey::new(&cluster, "v1", "configmaps", Some(&ns), None, None);
    let kv = async_nats::jetstream::new(crate::support::nats_client().await)
        .get_key_value("kube-event-bridge")
        .await
        .expect("the checkpoint bucket");
    let meta: serde_json::Value =
        serde_json::from_slice(&kv.get(format!("{}.meta", key.id)).await.unwrap().unwrap())
            .unwrap();
    let broken = bucket_of(&uids[0].1);
    let generation = meta["buckets"][broken.to_string()].as_str().unwrap();
    kv.put(
        format!("{}.b{broken}.{generation}", key.id),
        "[[\"not\", \"a record".into(),
    )
    .await
    .unwrap();
    // While the bridge is down: "a" (in the broken bucket) and "d" change.
    let mut changed = BTreeMap::new();
    for name in ["a", "d"] {
        let patched = cms
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"v": "1"}})),
            )
            .await
            .unwrap();
        changed.insert(name, patched.metadata.resource_version.unwrap());
    }

    let mut second = Bridge::start(&config);
    second.wait_synced(1).await;
    // Objects of the broken bucket are unknown: published as repaired adds. The unchanged ones
    // carry the id of their first event, so JetStream drops them as duplicates; the changed ones
    // arrive. Objects of the buckets that decoded are diffed: "d" is a repaired modify.
    let unknown: BTreeSet<&str> = uids
        .iter()
        .filter(|(_, uid)| bucket_of(uid) == broken)
        .map(|(name, _)| *name)
        .collect();
    let want: BTreeSet<(String, String)> = ["a", "d"]
        .iter()
        .map(|n| {
            let change = if unknown.contains(n) {
                "added"
            } else {
                "modified"
            };
            (n.to_string(), change.to_string())
        })
        .collect();
    let mut events = reader
        .read_until(Duration::from_secs(60), |got| got.len() >= want.len())
        .await;
    events.extend(reader.drain(Duration::from_secs(2)).await);
    let got: BTreeSet<(String, String)> = events
        .iter()
        .map(|r| (r.ext("name"), r.change().to_string()))
        .collect();
    assert_eq!(got, want, "{}", summary(&events));
    assert_eq!(events.len(), want.len(), "{}", summary(&events));
    for r in &events {
        assert_eq!(r.ext("origin"), "repaired", "{}", summary(&events));
        assert_eq!(r.ext("resourceversion"), changed[r.ext("name").as_str()]);
    }
    let repaired = (unknown.len() + usize::from(!unknown.contains("d"))) as f64;
    assert_eq!(
        metric(&second, "kube_event_bridge_events_repaired_total").await,
        repaired,
        "the broken bucket's objects and the changed one"
    );
    assert_eq!(
        metric(&second, "kube_event_bridge_checkpoints_corrupt_total").await,
        1.0
    );
    assert!(
        second
            .log_text()
            .contains(&format!("bucket {broken} is not a JSON list")),
        "{}",
        second.log_text()
    );
    // The repair's checkpoint swaps the damaged meta record (no fencing) and rewrites the
    // broken bucket.
    let meta_key = format!("{}.meta", key.id);
    let broken_generation = generation.to_string();
    let rewritten = crate::support::wait_until(
        "the repaired checkpoint replaces the damaged one",
        Duration::from_secs(60),
        || {
            let (kv, meta_key) = (kv.clone(), meta_key.clone());
            let broken_generation = broken_generation.clone();
            async move {
                let stored = kv.get(meta_key).await.ok()??;
                let meta: serde_json::Value = serde_json::from_slice(&stored).ok()?;
                let now = meta["buckets"][broken.to_string()].as_str()?.to_string();
                (now != broken_generation).then_some(meta)
            }
        },
    )
    .await;
    assert_eq!(rewritten["version"], 4, "{rewritten}");
    assert_eq!(rewritten["objects"], 4, "{rewritten}");
    assert_eq!(
        second.count_log("fenced: another instance owns this watch now"),
        0
    );
}

/// A checkpoint written for another cluster with the same `cluster` name is refused at start
/// with an error naming both kube-system uids and the `cluster` field.
#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_of_another_cluster_is_refused() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "othercluster").await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "cluster: dev\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n\
         sink: {{stdout: {{}}}}\ncheckpoint: {{directory: {}}}\n",
        dir.path().display()
    );
    let mut first = Bridge::start(&config);
    first.wait_synced(1).await;
    stop(&mut first).await;
    let ours = Api::<Namespace>::all(client.clone())
        .get("kube-system")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let path = checkpoint_file(dir.path());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains(&format!("\"clusterUid\":\"{ours}\"")),
        "{text}"
    );
    let foreign = "00000000-0000-0000-0000-00000000f00d";
    std::fs::write(&path, text.replace(&ours, foreign)).unwrap();

    let mut second = Bridge::start(&config);
    let status = second
        .wait_exit(Duration::from_secs(60))
        .await
        .expect("refused at start");
    assert!(!status.success());
    let log = second.log_text();
    for part in [
        ours.as_str(),
        foreign,
        "cluster: dev",
        "belongs to another cluster",
    ] {
        assert!(log.contains(part), "{part} missing from:\n{log}");
    }
}

/// An existing Kafka checkpoint topic must have one partition and `cleanup.policy=compact`;
/// otherwise the bridge refuses to start, naming the topic, what is wrong and the fix.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_checkpoint_topic_must_be_compacted_with_one_partition() {
    let cluster = unique_name("c");
    for (partitions, problem) in [(2, "has 2 partitions"), (1, "cleanup.policy is \"delete\"")] {
        let topic = unique_name("keb-checkpoints");
        crate::support::create_topic(&topic, partitions).await;
        let config = format!(
            "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [default]}}\n\
             checkpoint: {{kafkaTopic: {topic}}}\n{}",
            sink_yaml(SinkKind::Kafka, &cluster)
        );
        let mut bridge = Bridge::start(&config);
        let status = bridge
            .wait_exit(Duration::from_secs(60))
            .await
            .expect("refused at start");
        assert!(!status.success());
        let log = bridge.log_text();
        for part in [format!("checkpoint topic {topic}"), problem.to_string()] {
            assert!(log.contains(&part), "{part} missing from:\n{log}");
        }
    }
}

/// NATS: a compare-and-swap of the meta record whose write happened but whose reply was lost is
/// recognised as this instance's own write, not taken for fencing; a foreign write still fences.
#[tokio::test(flavor = "multi_thread")]
async fn nats_lost_reply_to_a_successful_swap_is_not_fencing() {
    let kv = async_nats::jetstream::new(crate::support::nats_client().await);
    let kv = kube_event_bridge::checkpoint::nats_bucket(&kv, "kube-event-bridge")
        .await
        .unwrap();
    let key = WatchKey::new(&unique_name("c"), "v1", "configmaps", None, None, None);
    let store = |kv: &async_nats::jetstream::kv::Store| {
        Store::new(NatsStore::new(key.clone(), kv.clone(), None))
    };
    let mut known = KnownObjects::default();
    known.observe("u", "1", Some("ns"), "read only", 0);
    known.mark_all_dirty();
    let mut writer = store(&kv);
    writer.save("1", &mut known).await.unwrap();

    // Nothing dirty: the next meta record is predictable. Its write lands, its reply is lost.
    let meta_key = format!("{}.meta", key.id);
    let current = kv.get(&meta_key).await.unwrap().unwrap();
    let next = String::from_utf8(current.to_vec())
        .unwrap()
        .replace("\"resourceVersion\":\"1\"", "\"resourceVersion\":\"2\"");
    kv.put(&meta_key, next.into()).await.unwrap();
    writer
        .save("2", &mut known)
        .await
        .expect("our own write is not fencing");
    writer
        .save("3", &mut known)
        .await
        .expect("and saving goes on");

    kv.put(&meta_key, "{\"foreign\":true}".into())
        .await
        .unwrap();
    assert!(matches!(
        writer.save("4", &mut known).await,
        Err(kube_event_bridge::checkpoint::Error::Fenced { .. })
    ));
}

/// The checkpoint of the configmaps watch of `ns`, loaded by this build's code as a restarted
/// bridge would load it, and the number of journal records it holds beyond its base.
async fn load_checkpoint(
    sink: SinkKind,
    cluster: &str,
    ns: &str,
    dir: &std::path::Path,
) -> Option<(Option<String>, KnownObjects, u64)> {
    let key = WatchKey::new(cluster, "v1", "configmaps", Some(ns), None, None);
    let mut store = backend(sink, key, dir, false).await?;
    let corrupt = std::sync::atomic::AtomicU64::new(0);
    let loaded = store.load(&corrupt).await.expect("the checkpoint loads")?;
    assert_eq!(
        corrupt.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "the checkpoint decodes"
    );
    Some((
        loaded.resource_version,
        loaded.known,
        store.journal_records(),
    ))
}

/// The checkpoint backend of `key` for `sink`, as the bridge builds it. A `writer` on Kafka has
/// a transactional producer of its own; a reader's producer is not transactional, so it never
/// fences the running bridge. A NATS reader finds no backend if the KV bucket does not exist.
async fn backend(
    sink: SinkKind,
    key: WatchKey,
    dir: &std::path::Path,
    writer: bool,
) -> Option<Store> {
    let store = match sink {
        SinkKind::Kafka => {
            let topic = "kube-event-bridge.checkpoints";
            let config: kube_event_bridge::sink::kafka::KafkaConfig =
                serde_saphyr::from_str(&format!(
                    "bootstrapServers: \"{}\"",
                    crate::support::env().kafka_bootstrap
                ))
                .unwrap();
            let events = kube_event_bridge::template::Template::parse("unused").unwrap();
            let sink = if writer {
                kube_event_bridge::checkpoint::kafka::ensure_topic(
                    crate::support::kafka_config(),
                    topic,
                )
                .await
                .unwrap();
                let sharing = kube_event_bridge::sink::kafka::Sharing::Watch;
                let base = KafkaSink::new(&config, events).unwrap();
                base.watch_sinks().for_watch(&key.id, &sharing, None).await
            } else {
                KafkaSink::new(&config, events)
            };
            Store::new(kube_event_bridge::checkpoint::KafkaStore {
                key,
                sink: std::sync::Arc::new(sink.unwrap()),
                topic: topic.into(),
                cluster: None,
            })
        }
        SinkKind::Nats => {
            let js = async_nats::jetstream::new(crate::support::nats_client().await);
            let kv = if writer {
                kube_event_bridge::checkpoint::nats_bucket(&js, "kube-event-bridge")
                    .await
                    .unwrap()
            } else {
                js.get_key_value("kube-event-bridge").await.ok()?
            };
            Store::new(NatsStore::new(key, kv, None))
        }
        SinkKind::Stdout | SinkKind::Http => Store::new(kube_event_bridge::checkpoint::FileStore {
            path: dir.join(format!("{}.checkpoint", key.id)),
            key,
            cluster: None,
        }),
    };
    Some(store)
}

/// The configmaps of `ns`: uid → (resourceVersion, name).
async fn configmaps(cms: &Api<ConfigMap>) -> BTreeMap<String, (String, String)> {
    cms.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|cm| {
            let m = cm.metadata;
            (
                m.uid.unwrap(),
                (m.resource_version.unwrap(), m.name.unwrap()),
            )
        })
        .collect()
}

/// Whether `known` holds exactly the configmaps `want` of namespace `ns`; else what differs.
fn index_differs(
    known: &KnownObjects,
    want: &BTreeMap<String, (String, String)>,
    ns: &str,
) -> Option<String> {
    if known.len() != want.len() {
        return Some(format!(
            "{} objects, the cluster has {}",
            known.len(),
            want.len()
        ));
    }
    for (uid, (rv, name)) in want {
        let entry = known.get(uid);
        let same = entry.as_ref().is_some_and(|e| {
            &*e.resource_version == rv && &*e.name == name && e.namespace.as_deref() == Some(ns)
        });
        if !same {
            return Some(format!(
                "{name} ({uid}) at {rv}: the checkpoint holds {entry:?}"
            ));
        }
    }
    None
}

/// A namespace with configmaps `cm-0`… and the configuration of a bridge watching them.
struct Scene {
    ns: String,
    cluster: String,
    /// The checkpoint directory (stdout sink).
    dir: tempfile::TempDir,
    config: String,
    cms: Api<ConfigMap>,
}

impl Scene {
    async fn new(sink: SinkKind, prefix: &str, count: usize) -> Self {
        let client = kube_client().await;
        let ns = unique_namespace(&client, prefix).await;
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
        for i in 0..count {
            cms.create(&PostParams::default(), &cm(&format!("cm-{i}")))
                .await
                .unwrap();
        }
        Self {
            ns,
            cluster,
            dir,
            config,
            cms,
        }
    }

    /// Waits until the stored checkpoint holds exactly the configmaps `want`; returns its
    /// journal records.
    async fn wait_checkpoint(
        &self,
        sink: SinkKind,
        want: &BTreeMap<String, (String, String)>,
    ) -> u64 {
        crate::support::wait_until(
            "the checkpoint holds the cluster's configmaps",
            Duration::from_secs(60),
            || async {
                let (_, known, records) =
                    load_checkpoint(sink, &self.cluster, &self.ns, self.dir.path()).await?;
                index_differs(&known, want, &self.ns)
                    .is_none()
                    .then_some(records)
            },
        )
        .await
    }
}

/// Churn across restarts: every round changes, deletes and creates objects while the bridge
/// runs, waits until the checkpoint (base plus journal, loaded as a restart loads it) holds
/// exactly the cluster's objects, stops the bridge and loads it again. The journal carries the
/// changes between compactions, and every restart resumes without a LIST.
async fn churn_with_restarts(sink: SinkKind) {
    let scene = Scene::new(sink, "journal", 40).await;
    let (ns, cluster, config, cms) = (&scene.ns, &scene.cluster, &scene.config, &scene.cms);
    let dir = &scene.dir;
    let pp = PostParams::default();
    let mut journaled = 0;
    for round in 0..3 {
        let mut bridge = Bridge::start(config);
        if round == 0 {
            bridge.wait_synced(1).await;
        } else {
            bridge.wait_log("resuming from checkpoint").await;
        }
        for i in (round..40).step_by(4) {
            let name = format!("cm-{i}");
            let patch = Patch::Merge(json!({"data": {"v": format!("{round}")}}));
            // Deleted in an earlier round: nothing to patch.
            let _ = cms.patch(&name, &PatchParams::default(), &patch).await;
        }
        cms.delete(&format!("cm-{}", 2 + round * 5), &DeleteParams::default())
            .await
            .unwrap();
        cms.create(&pp, &cm(&format!("new-{round}"))).await.unwrap();
        let want = configmaps(cms).await;
        let records = scene.wait_checkpoint(sink, &want).await;
        journaled = journaled.max(records);
        stop(&mut bridge).await;
        let listed = if round == 0 { 1 } else { 0 };
        assert_eq!(bridge.count_log("listed"), listed, "{}", bridge.log_text());
        let (rv, known, _) = load_checkpoint(sink, cluster, ns, dir.path())
            .await
            .expect("a checkpoint after the stop");
        assert!(rv.is_some());
        assert_eq!(
            index_differs(&known, &want, ns),
            None,
            "after round {round}"
        );
    }
    assert!(journaled > 0, "the changes went to the journal");
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_journal_keeps_the_index_through_churn_and_restarts() {
    churn_with_restarts(SinkKind::Kafka).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_journal_keeps_the_index_through_churn_and_restarts() {
    churn_with_restarts(SinkKind::Nats).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn file_journal_keeps_the_index_through_churn_and_restarts() {
    churn_with_restarts(SinkKind::Stdout).await;
}

/// A checkpoint of an earlier format written into the real store, as the releases that wrote
/// it stored it: version 2 (meta record and JSON buckets, no journal) or version 3 (buckets and
/// a journal record holding the last object). The bridge resumes from it without a LIST,
/// publishes only what changed, and its saves migrate it to version 4 holding the same index.
async fn earlier_version_migrates(sink: SinkKind, version: u32) {
    let scene = Scene::new(sink, &format!("v{version}"), 20).await;
    let (ns, cluster, config, cms) = (&scene.ns, &scene.cluster, &scene.config, &scene.cms);
    let dir = &scene.dir;
    let pp = PostParams::default();
    let listing = cms.list(&Default::default()).await.unwrap();
    let list_rv = listing.metadata.resource_version.clone().unwrap();
    let mut known = KnownObjects::default();
    for item in &listing.items {
        let m = &item.metadata;
        known.observe(
            m.uid.as_deref().unwrap(),
            m.resource_version.as_deref().unwrap(),
            Some(ns),
            m.name.as_deref().unwrap(),
            0,
        );
    }
    let key = WatchKey::new(cluster, "v1", "configmaps", Some(ns), None, None);
    let uids: Vec<String> = listing
        .items
        .iter()
        .map(|i| i.metadata.uid.clone().unwrap())
        .collect();
    write_earlier_version(sink, version, &key, &list_rv, (&known, uids), dir.path()).await;

    let mut bridge = Bridge::start(config);
    let mut reader = Reader::for_sink(
        sink,
        cluster,
        &[format!("k8s.{cluster}.core.configmaps")],
        &bridge,
    )
    .await;
    bridge.wait_log("resuming from checkpoint").await;
    cms.patch(
        "cm-3",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "1"}})),
    )
    .await
    .unwrap();
    cms.create(&pp, &cm("after")).await.unwrap();
    let events = reader
        .read_until(Duration::from_secs(60), |got| got.len() >= 2)
        .await;
    let got: BTreeSet<(String, String)> = events
        .iter()
        .map(|r| (r.ext("name"), r.change().to_string()))
        .collect();
    let expected = BTreeSet::from([
        ("cm-3".to_string(), "modified".to_string()),
        ("after".to_string(), "added".to_string()),
    ]);
    assert_eq!(got, expected, "{}", summary(&events));
    let want = configmaps(cms).await;
    scene.wait_checkpoint(sink, &want).await;
    stop(&mut bridge).await;
    assert_eq!(bridge.count_log("listed"), 0, "{}", bridge.log_text());
    assert_eq!(stored_version(sink, &key, dir.path()).await, 4);
}

/// Writes a checkpoint of `known` (whose objects have `uids`) at `rv` in format `version` (2 or
/// 3), as the releases that wrote them did: version 3 with the last object (by uid) in a
/// journal record rather than in its bucket.
async fn write_earlier_version(
    sink: SinkKind,
    version: u32,
    key: &WatchKey,
    rv: &str,
    (known, mut uids): (&KnownObjects, Vec<String>),
    dir: &std::path::Path,
) {
    const WRITER: &str = "00000000000000ab";
    const BASE: &str = "00000000000000cd";
    let mut base = KnownObjects::default();
    let mut journaled = None;
    uids.sort();
    for (i, uid) in uids.iter().enumerate() {
        let e = known.get(uid).unwrap();
        let entry = json!([
            uid,
            e.resource_version,
            e.namespace.as_deref(),
            e.name,
            e.digest
        ]);
        if version == 3 && i + 1 == uids.len() {
            journaled = Some(entry);
        } else {
            base.observe(
                uid,
                &e.resource_version,
                e.namespace.as_deref(),
                &e.name,
                e.digest,
            );
        }
    }
    let journal = journaled.map(|entry| json!({"upserts": [entry]}));
    let meta = |buckets: serde_json::Value, base_id: Option<&str>| {
        let mut meta = json!({"version": version, "watch": key.description,
               "resourceVersion": rv, "objects": known.len(), "buckets": buckets});
        if journal.is_some() {
            match base_id {
                Some(b) => meta["base"] = b.into(),
                None => meta["journal"] = json!([[WRITER, 1, 1]]),
            }
        }
        meta.to_string()
    };
    let buckets: Vec<(usize, Vec<u8>)> = (0..kube_event_bridge::known::BUCKETS)
        .map(|b| (b, base.encode_bucket(b, true)))
        .filter(|(_, r)| !r.is_empty())
        .collect();
    match sink {
        SinkKind::Kafka => {
            use rdkafka::producer::{FutureProducer, FutureRecord};
            kube_event_bridge::checkpoint::kafka::ensure_topic(
                crate::support::kafka_config(),
                "kube-event-bridge.checkpoints",
            )
            .await
            .unwrap();
            let producer: FutureProducer = crate::support::kafka_config().create().unwrap();
            let mut records: Vec<(String, Vec<u8>)> = buckets
                .into_iter()
                .map(|(b, r)| (format!("{}/b/{b}", key.id), r))
                .collect();
            if let Some(record) = &journal {
                let name = format!("{}/j/{WRITER}/1", key.id);
                records.push((name, record.to_string().into_bytes()));
            }
            records.push((
                format!("{}/meta", key.id),
                meta(json!({}), None).into_bytes(),
            ));
            for (k, v) in &records {
                producer
                    .send(
                        FutureRecord::to("kube-event-bridge.checkpoints")
                            .key(k)
                            .payload(v),
                        Duration::from_secs(30),
                    )
                    .await
                    .unwrap();
            }
        }
        SinkKind::Nats => {
            let js = async_nats::jetstream::new(crate::support::nats_client().await);
            let kv = kube_event_bridge::checkpoint::nats_bucket(&js, "kube-event-bridge")
                .await
                .unwrap();
            let generation = "00000000000000aa";
            let mut named = serde_json::Map::new();
            for (b, r) in buckets {
                kv.put(format!("{}.b{b}.{generation}", key.id), r.into())
                    .await
                    .unwrap();
                named.insert(b.to_string(), generation.into());
            }
            if let Some(record) = &journal {
                kv.put(
                    format!("{}.j.{WRITER}.1", key.id),
                    record.to_string().into(),
                )
                .await
                .unwrap();
            }
            kv.put(format!("{}.meta", key.id), meta(named.into(), None).into())
                .await
                .unwrap();
        }
        SinkKind::Stdout | SinkKind::Http => {
            let mut file = meta(json!({}), Some(BASE)).into_bytes();
            file.push(b'\n');
            for (b, r) in buckets {
                file.extend_from_slice(format!("{b}\t").as_bytes());
                file.extend_from_slice(&r);
                file.push(b'\n');
            }
            let path = dir.join(format!("{}.checkpoint", key.id));
            std::fs::write(&path, file).unwrap();
            if let Some(mut record) = journal {
                record["base"] = BASE.into();
                record["seq"] = 1.into();
                record["resourceVersion"] = rv.into();
                record["objects"] = known.len().into();
                std::fs::write(
                    path.with_extension("checkpoint.journal"),
                    format!("{record}\n"),
                )
                .unwrap();
            }
        }
    }
}

/// The version of the stored meta record.
async fn stored_version(sink: SinkKind, key: &WatchKey, dir: &std::path::Path) -> u64 {
    let stored: Vec<u8> = match sink {
        SinkKind::Nats => {
            let js = async_nats::jetstream::new(crate::support::nats_client().await);
            let kv = js.get_key_value("kube-event-bridge").await.unwrap();
            kv.get(format!("{}.meta", key.id))
                .await
                .unwrap()
                .unwrap()
                .to_vec()
        }
        SinkKind::Kafka => kafka_meta(key).await,
        SinkKind::Stdout | SinkKind::Http => {
            let file = std::fs::read(dir.join(format!("{}.checkpoint", key.id))).unwrap();
            file.split(|&c| c == b'\n').next().unwrap().to_vec()
        }
    };
    let meta: serde_json::Value = serde_json::from_slice(&stored).unwrap();
    meta["version"].as_u64().unwrap()
}

/// The last committed meta record of `key` in the Kafka checkpoint topic.
async fn kafka_meta(key: &WatchKey) -> Vec<u8> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Message, Offset, TopicPartitionList};
    let meta_key = format!("{}/meta", key.id);
    tokio::task::spawn_blocking(move || {
        let topic = "kube-event-bridge.checkpoints";
        let mut config = crate::support::kafka_config();
        config
            .set("group.id", unique_name("meta"))
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false");
        // The high watermark: a read_committed client is told the last stable offset, which
        // stops at any transaction still open and so may miss the meta just committed.
        let ends: BaseConsumer = crate::support::kafka_config()
            .set("isolation.level", "read_uncommitted")
            .create()
            .unwrap();
        let (_, high) = ends
            .fetch_watermarks(topic, 0, Duration::from_secs(30))
            .unwrap();
        let consumer: BaseConsumer = config.create().unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, 0, Offset::Beginning)
            .unwrap();
        consumer.assign(&tpl).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut last = None;
        loop {
            if let Some(m) = consumer.poll(Duration::from_millis(200)) {
                let m = m.unwrap();
                if m.key() == Some(meta_key.as_bytes()) {
                    last = m.payload().map(<[u8]>::to_vec);
                }
            }
            let position = consumer.position().unwrap();
            let at = position
                .find_partition(topic, 0)
                .and_then(|p| match p.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                });
            if at.is_some_and(|o| o >= high) {
                return last.expect("a meta record");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the checkpoint topic is read to its end within 60 s"
            );
        }
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_version_two_checkpoint_is_read_and_migrated() {
    earlier_version_migrates(SinkKind::Kafka, 2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_version_two_checkpoint_is_read_and_migrated() {
    earlier_version_migrates(SinkKind::Nats, 2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn file_version_two_checkpoint_is_read_and_migrated() {
    earlier_version_migrates(SinkKind::Stdout, 2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_version_three_checkpoint_is_read_and_migrated() {
    earlier_version_migrates(SinkKind::Kafka, 3).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_version_three_checkpoint_is_read_and_migrated() {
    earlier_version_migrates(SinkKind::Nats, 3).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn file_version_three_checkpoint_is_read_and_migrated() {
    earlier_version_migrates(SinkKind::Stdout, 3).await;
}

/// A store writing the checkpoint of the configmaps watch of `ns` in `cluster`, as the bridge
/// does.
async fn writer_store(sink: SinkKind, cluster: &str, ns: &str, dir: &std::path::Path) -> Store {
    let key = WatchKey::new(cluster, "v1", "configmaps", Some(ns), None, None);
    backend(sink, key, dir, true).await.unwrap()
}

/// `n` objects of namespace `ns` with names of 250 characters, all in bucket 7: about 320 bytes
/// each as stored, so 4,000 make a bucket of 1.3 MB, past the 1 MB a broker accepts in one
/// record by default.
fn crowded_bucket(ns: &str, n: usize) -> (KnownObjects, Vec<String>) {
    let mut known = KnownObjects::default();
    let uids: Vec<String> = (0..)
        .map(|i| format!("{:08x}-0000-4000-8000-{:012x}", i, i * 31))
        .filter(|uid| bucket_of(uid) == 7)
        .take(n)
        .collect();
    for (i, uid) in uids.iter().enumerate() {
        known.observe(
            uid,
            &(1000 + i).to_string(),
            Some(ns),
            &format!("{i:0>250}"),
            i as u64 + 1,
        );
    }
    (known, uids)
}

/// Whether `loaded` holds exactly the objects `uids` of `known`; else what differs.
fn differs(loaded: &KnownObjects, known: &KnownObjects, uids: &[String]) -> Option<String> {
    if loaded.len() != known.len() {
        return Some(format!("{} objects, want {}", loaded.len(), known.len()));
    }
    uids.iter()
        .find(|uid| loaded.get(uid) != known.get(uid))
        .map(|uid| format!("{uid}: {:?}, want {:?}", loaded.get(uid), known.get(uid)))
}

/// A bucket larger than the brokers' default record limit, saved through the real store: stored
/// in parts of at most 256 KiB, it loads back whole (strictly: a missing or extra part would
/// make the load report a damaged checkpoint, which `load_checkpoint` refuses); when it shrinks
/// to one part the parts no longer needed are deleted (Kafka: tombstoned in the compaction's
/// transaction), so the strict load still succeeds; a journal record over parts replays.
async fn large_bucket_in_parts(sink: SinkKind) {
    let (cluster, ns) = (unique_name("c"), unique_name("parts"));
    let dir = tempfile::tempdir().unwrap();
    let mut store = writer_store(sink, &cluster, &ns, dir.path()).await;
    let (mut known, uids) = crowded_bucket(&ns, 4000);
    store.save("100", &mut known).await.unwrap();
    let (rv, loaded, _) = load_checkpoint(sink, &cluster, &ns, dir.path())
        .await
        .expect("a checkpoint");
    assert_eq!(rv.as_deref(), Some("100"));
    assert_eq!(differs(&loaded, &known, &uids), None);

    for uid in &uids[..3900] {
        known.remove(uid);
    }
    store.save("101", &mut known).await.unwrap();
    assert_eq!(
        store.journal_records(),
        0,
        "most objects removed: a compaction"
    );
    let (rv, loaded, _) = load_checkpoint(sink, &cluster, &ns, dir.path())
        .await
        .expect("a checkpoint");
    assert_eq!(rv.as_deref(), Some("101"));
    assert_eq!(differs(&loaded, &known, &uids), None);

    // Grown again past one part, then a journal record on top.
    let (grown, all) = crowded_bucket(&ns, 4000);
    for uid in &all[..3000] {
        let e = grown.get(uid).unwrap();
        known.observe(uid, &e.resource_version, Some(&ns), &e.name, e.digest);
    }
    known.mark_all_dirty();
    store.save("102", &mut known).await.unwrap();
    known.observe(&all[3999], "5000", Some(&ns), "late", 5);
    store.save("103", &mut known).await.unwrap();
    assert_eq!(store.journal_records(), 1, "one change: a journal record");
    let (rv, loaded, records) = load_checkpoint(sink, &cluster, &ns, dir.path())
        .await
        .expect("a checkpoint");
    assert_eq!((rv.as_deref(), records), (Some("103"), 1));
    assert_eq!(differs(&loaded, &known, &all), None);
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_large_bucket_is_stored_in_parts() {
    large_bucket_in_parts(SinkKind::Kafka).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_large_bucket_is_stored_in_parts() {
    large_bucket_in_parts(SinkKind::Nats).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn file_large_bucket_is_stored_in_parts() {
    large_bucket_in_parts(SinkKind::Stdout).await;
}

/// Kafka: a checkpoint committed while another writer's transaction on the checkpoint topic is
/// still open lies past the topic's last stable offset (where that transaction begins), and the
/// commit markers of a transaction that just committed may still be on their way: a load reads
/// to the high watermark and waits for the open transaction to end, instead of stopping at the
/// last stable offset and finding no checkpoint (or an older one).
#[tokio::test(flavor = "multi_thread")]
async fn kafka_checkpoint_committed_behind_an_open_transaction_is_loaded() {
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

    let (cluster, ns) = (unique_name("c"), unique_name("behind"));
    let dir = tempfile::tempdir().unwrap();
    let mut store = writer_store(SinkKind::Kafka, &cluster, &ns, dir.path()).await;
    let other: ThreadedProducer<DefaultProducerContext> = crate::support::kafka_config()
        .set("transactional.id", unique_name("open-transaction"))
        .create()
        .unwrap();
    other.init_transactions(Duration::from_secs(30)).unwrap();
    other.begin_transaction().unwrap();
    other
        .send(
            BaseRecord::to("kube-event-bridge.checkpoints")
                .key("another-watch/meta")
                .payload("uncommitted"),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    other.flush(Duration::from_secs(30)).unwrap();

    let (mut known, uids) = crowded_bucket(&ns, 10);
    store.save("100", &mut known).await.unwrap();
    let ending = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_secs(2));
        other.abort_transaction(Duration::from_secs(30)).unwrap();
    });
    let (rv, loaded, _) = load_checkpoint(SinkKind::Kafka, &cluster, &ns, dir.path())
        .await
        .expect("the checkpoint committed behind the open transaction");
    assert_eq!(rv.as_deref(), Some("100"));
    assert_eq!(differs(&loaded, &known, &uids), None);
    ending.await.unwrap();
}

/// NATS: a compaction that stopped after writing some parts (under its fresh generation) and
/// before swapping the meta record leaves the previous checkpoint whole; a part of the named
/// generation that is missing makes the checkpoint damaged, and the repair's save stores every
/// bucket again.
#[tokio::test(flavor = "multi_thread")]
async fn nats_parts_written_before_a_crash_leave_the_previous_checkpoint() {
    let (cluster, ns) = (unique_name("c"), unique_name("crash"));
    let dir = tempfile::tempdir().unwrap();
    let mut store = writer_store(SinkKind::Nats, &cluster, &ns, dir.path()).await;
    let (mut known, uids) = crowded_bucket(&ns, 4000);
    store.save("100", &mut known).await.unwrap();
    let key = WatchKey::new(&cluster, "v1", "configmaps", Some(&ns), None, None);
    let kv = async_nats::jetstream::new(crate::support::nats_client().await)
        .get_key_value("kube-event-bridge")
        .await
        .unwrap();
    let meta: serde_json::Value =
        serde_json::from_slice(&kv.get(format!("{}.meta", key.id)).await.unwrap().unwrap())
            .unwrap();
    assert_eq!(meta["version"], 4, "{meta}");
    let parts = meta["parts"]["7"].as_u64().expect("bucket 7 in parts") as usize;
    assert!(parts >= 5, "{meta}");
    let generation = meta["buckets"]["7"].as_str().unwrap().to_string();

    // The crashed compaction: the first parts of a new generation, no meta swap.
    let crashed = "00000000000000ee";
    for p in 0..2 {
        let name = match p {
            0 => format!("{}.b7.{crashed}", key.id),
            p => format!("{}.b7.{crashed}.{p}", key.id),
        };
        kv.put(name, "[]".into()).await.unwrap();
    }
    let (rv, loaded, _) = load_checkpoint(SinkKind::Nats, &cluster, &ns, dir.path())
        .await
        .expect("a checkpoint");
    assert_eq!(rv.as_deref(), Some("100"));
    assert_eq!(differs(&loaded, &known, &uids), None);

    // A part of the named generation lost: damaged, repaired by the next save.
    kv.purge(format!("{}.b7.{generation}.{}", key.id, parts - 1))
        .await
        .unwrap();
    let corrupt = std::sync::atomic::AtomicU64::new(0);
    let mut repair = store.load(&corrupt).await.unwrap().unwrap();
    assert_eq!(corrupt.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(repair.resource_version, None, "a repair lists again");
    assert!(repair.known.get(&uids[0]).is_none(), "bucket 7 is unusable");
    for uid in &uids {
        let e = known.get(uid).unwrap();
        repair
            .known
            .observe(uid, &e.resource_version, Some(&ns), &e.name, e.digest);
    }
    store.save("101", &mut repair.known).await.unwrap();
    let (rv, loaded, _) = load_checkpoint(SinkKind::Nats, &cluster, &ns, dir.path())
        .await
        .expect("a checkpoint");
    assert_eq!(rv.as_deref(), Some("101"));
    assert_eq!(differs(&loaded, &known, &uids), None);
}

/// NATS, the pipeline's way of saving: a save is staged (encoded whole) and written while the
/// watch goes on changing the index. What is stored is the index as it was when staged, so the
/// checkpoint matches its resourceVersion; the next save stores the later changes as a journal
/// record; a meta record replaced by another instance before a staged save is written fences it.
#[tokio::test(flavor = "multi_thread")]
async fn nats_staged_saves_store_the_index_as_staged_while_it_moves_on() {
    let (cluster, ns) = (unique_name("c"), unique_name("staged"));
    let dir = tempfile::tempdir().unwrap();
    let mut store = writer_store(SinkKind::Nats, &cluster, &ns, dir.path()).await;
    let uids: Vec<String> = (0..1000)
        .map(|i| format!("{:08x}-0000-4000-8000-{:012x}", i, i * 7))
        .collect();
    let index = || {
        let mut known = KnownObjects::default();
        for (i, uid) in uids.iter().enumerate() {
            known.observe(uid, "10", Some(&ns), &format!("cm-{i}"), i as u64 + 1);
        }
        known.mark_all_dirty();
        known
    };
    let (mut known, staged_at_100) = (index(), index());

    let Staging::Staged(staged) = store.stage("100", &mut known) else {
        panic!("a NATS compaction of 1,000 objects is staged");
    };
    // The watch goes on while the save is written.
    known.observe(&uids[0], "200", Some(&ns), "cm-0", 99);
    known.remove(&uids[1]);
    store.finish(staged.write().await).expect("saved");
    let (rv, loaded, records) = load_checkpoint(SinkKind::Nats, &cluster, &ns, dir.path())
        .await
        .expect("a checkpoint");
    assert_eq!((rv.as_deref(), records), (Some("100"), 0));
    assert_eq!(differs(&loaded, &staged_at_100, &uids), None);

    let Staging::Staged(staged) = store.stage("200", &mut known) else {
        panic!("a journal record is staged");
    };
    store.finish(staged.write().await).expect("saved");
    let (rv, loaded, records) = load_checkpoint(SinkKind::Nats, &cluster, &ns, dir.path())
        .await
        .expect("a checkpoint");
    assert_eq!((rv.as_deref(), records), (Some("200"), 1));
    assert_eq!(differs(&loaded, &known, &uids), None);

    known.observe(&uids[2], "300", Some(&ns), "cm-2", 300);
    let Staging::Staged(staged) = store.stage("300", &mut known) else {
        panic!("a journal record is staged");
    };
    let key = WatchKey::new(&cluster, "v1", "configmaps", Some(&ns), None, None);
    let kv = async_nats::jetstream::new(crate::support::nats_client().await)
        .get_key_value("kube-event-bridge")
        .await
        .unwrap();
    kv.put(format!("{}.meta", key.id), "{\"foreign\":true}".into())
        .await
        .unwrap();
    assert!(matches!(
        store.finish(staged.write().await),
        Err(kube_event_bridge::checkpoint::Error::Fenced { .. })
    ));
}

/// NATS announcements: a load finds those tied to the checkpoint it loads; a save covers and
/// purges them; a writer uses the same keys again after each save, so the keys a watch ever
/// used stay few however long it runs (each purged key keeps a marker in the stream).
#[tokio::test(flavor = "multi_thread")]
async fn nats_announcements_are_tied_to_the_checkpoint_and_reuse_their_keys() {
    let js = async_nats::jetstream::new(crate::support::nats_client().await);
    let kv = kube_event_bridge::checkpoint::nats_bucket(&js, "kube-event-bridge")
        .await
        .unwrap();
    let key = WatchKey::new(&unique_name("c"), "v1", "configmaps", None, None, None);
    let entry = |i: usize| {
        (
            format!("uid-{i}").into(),
            format!("{}", 100 + i).into(),
            Some("ns".into()),
            format!("cm-{i}").into(),
            0,
        )
    };
    let mut known = KnownObjects::default();
    known.mark_all_dirty();
    let mut writer = Store::new(NatsStore::new(key.clone(), kv.clone(), None));
    writer.save("1", &mut known).await.unwrap();
    for round in 0..10 {
        writer.announce(&[entry(2 * round)]).await.unwrap();
        writer.announce(&[entry(2 * round + 1)]).await.unwrap();
        let mut reader = Store::new(NatsStore::new(key.clone(), kv.clone(), None));
        let loaded = reader
            .load(&Default::default())
            .await
            .unwrap()
            .expect("a checkpoint");
        let uids: Vec<String> = loaded.announced.iter().map(|e| e.0.to_string()).collect();
        assert_eq!(
            uids,
            [
                format!("uid-{}", 2 * round),
                format!("uid-{}", 2 * round + 1)
            ],
            "round {round}: the announcements since the last save, and only those"
        );
        known.observe(&format!("uid-{}", 2 * round), "5", Some("ns"), "x", 0);
        writer
            .save(&format!("{}", round + 2), &mut known)
            .await
            .unwrap();
    }
    let subjects = js
        .get_stream("KV_kube-event-bridge")
        .await
        .unwrap()
        .info_with_subjects(format!("$KV.kube-event-bridge.{}.a.>", key.id))
        .await
        .unwrap();
    let count = futures::TryStreamExt::try_collect::<Vec<_>>(subjects)
        .await
        .unwrap()
        .len();
    assert_eq!(count, 2, "20 announcements over 10 saves used 2 keys");
    let mut reader = Store::new(NatsStore::new(key.clone(), kv, None));
    let loaded = reader.load(&Default::default()).await.unwrap().unwrap();
    assert!(loaded.announced.is_empty(), "the last save covered them");
}

/// Watches starting together load their Kafka checkpoints through reads of the topic they share:
/// all of them wait for their load at once, however many open at a time, so that a restart of
/// 150 watches reads the whole topic twice (the first watch's read, then one for every other),
/// not once per handful of watches.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_watches_starting_together_share_one_read_of_the_checkpoint_topic() {
    const WATCHES: usize = 150;
    let client = kube_client().await;
    let cluster = unique_name("c");
    let label = "checkpoint.keb.dev/shared-read";
    for _ in 0..WATCHES {
        crate::dynamic::labelled_namespace(&client, label, Some(&cluster)).await;
    }
    let config = format!(
        "cluster: {cluster}\nkubernetes: {{qps: 500, burst: 500}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaceSelector: \"{label}={cluster}\"}}\n{}",
        sink_yaml(SinkKind::Kafka, &cluster)
    );
    let mut first = Bridge::start(&config);
    first.wait_synced(WATCHES).await;
    first.signal("TERM");
    let status = first.wait_exit(Duration::from_secs(60)).await;
    assert!(status.is_some_and(|s| s.success()), "{}", first.log_text());

    let second = Bridge::start(&config);
    crate::support::wait_until(
        &format!("{WATCHES} watches resume from their checkpoints"),
        Duration::from_secs(120),
        || async { (second.count_log("resuming from checkpoint") >= WATCHES).then_some(()) },
    )
    .await;
    let reads = second.count_log("reading the checkpoint topic for the watches loading");
    assert!(
        (1..=2).contains(&reads),
        "{reads} reads of the checkpoint topic for {WATCHES} watches; log:\n{}",
        second.log_text()
    );
}
