//! Fault injection against the real components: brokers stopped while changes continue, the API
//! server restarted so that every watch gets 410 Gone. These tests stop and start shared
//! components, so they live in their own test binary (cargo runs binaries one after another) and
//! take a global lock so they never overlap each other.

mod acks;
mod announce;
mod crash;
#[path = "../integration/harness.rs"]
mod harness;
#[path = "../integration/receiver.rs"]
mod receiver;
mod shard;
#[path = "../integration/support.rs"]
mod support;
mod transactions;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use cloudevents::AttributesReader;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use harness::{Bridge, Proxy, Reader, Received, SinkKind, kubeconfig_via, sink_yaml, summary};
use support::{kube_client, unique_name, unique_namespace};

/// Serializes the tests of this binary: each one stops shared components.
static EXCLUSIVE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs `scripts/testenv <verb> <component>`.
fn testenv(verb: &str, component: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/testenv");
    let ok = Command::new(script)
        .args([verb, component])
        .status()
        .expect("run scripts/testenv")
        .success();
    assert!(ok, "scripts/testenv {verb} {component} failed");
}

/// A component stopped for a fault. Started again by [`Stopped::start`], or when dropped by a
/// test that failed before it could: the tests after it need the component.
struct Stopped<'a> {
    component: &'a str,
    started: bool,
}

impl<'a> Stopped<'a> {
    fn new(component: &'a str) -> Self {
        testenv("stop", component);
        Stopped {
            component,
            started: false,
        }
    }

    fn start(mut self) {
        self.started = true;
        testenv("start", self.component);
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        if !self.started {
            eprintln!("starting {} again after a failure", self.component);
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/testenv");
            let _ = Command::new(script)
                .args(["start", self.component])
                .status();
        }
    }
}

/// A component paused with SIGSTOP for a fault (`scripts/testenv pause`). Resumed by
/// [`Paused::resume`], or when dropped by a test that failed before it could.
struct Paused<'a> {
    component: &'a str,
    resumed: bool,
}

impl<'a> Paused<'a> {
    fn new(component: &'a str) -> Self {
        testenv("pause", component);
        Paused {
            component,
            resumed: false,
        }
    }

    fn resume(mut self) {
        self.resumed = true;
        testenv("resume", self.component);
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        if !self.resumed {
            eprintln!("resuming {} after a failure", self.component);
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/testenv");
            let _ = Command::new(script)
                .args(["resume", self.component])
                .status();
        }
    }
}

fn cm(name: &str, v: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": v}})).unwrap()
}

/// What a consumer saw, per object after deduplicating by event id.
struct Tally {
    per_object: BTreeMap<String, Vec<Received>>,
    duplicates: usize,
}

fn tally(events: Vec<Received>) -> Tally {
    let mut seen = BTreeSet::new();
    let mut duplicates = 0;
    let mut per_object: BTreeMap<String, Vec<Received>> = BTreeMap::new();
    for r in events {
        if !seen.insert(r.event.id().to_string()) {
            duplicates += 1;
            continue;
        }
        per_object.entry(r.ext("name")).or_default().push(r);
    }
    Tally {
        per_object,
        duplicates,
    }
}

/// The broker stops while objects keep changing; when it returns, every change arrives, in
/// order per object, and the bridge never dropped one. (Outages longer than Kafka's transaction
/// timeout: [`transactions`].)
async fn broker_outage(sink: SinkKind, component: &str) {
    let _guard = EXCLUSIVE.lock().await;
    let client = kube_client().await;
    let ns = unique_namespace(&client, "outage").await;
    let cluster = unique_name("c");
    let mut config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}",
        sink_yaml(sink, &cluster)
    );
    if sink == SinkKind::Nats {
        config = config.replace("create: true}", "create: true, ackTimeoutSecs: 2}");
    }
    let topics = vec![format!("k8s.{cluster}.core.configmaps")];
    let mut bridge = Bridge::start(&config);
    {
        let mut reader = Reader::for_sink(sink, &cluster, &topics, &bridge).await;
        bridge.wait_synced(1).await;
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        cms.create(&PostParams::default(), &cm("before", "0"))
            .await
            .unwrap();
        reader
            .read_until(Duration::from_secs(30), |got| got.len() == 1)
            .await;
    }

    let outage = Stopped::new(component);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    for i in 0..10 {
        let name = format!("o{i}");
        cms.create(&pp, &cm(&name, "1")).await.unwrap();
        cms.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": "2"}})),
        )
        .await
        .unwrap();
        if i % 2 == 0 {
            cms.delete(&name, &DeleteParams::default()).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        bridge.wait_exit(Duration::from_millis(10)).await.is_none(),
        "the bridge must ride out the outage"
    );
    outage.start();

    // 1 + 10 adds + 10 modifies + 5 deletes, read from the start by a fresh consumer.
    let mut reader = Reader::for_sink(sink, &cluster, &topics, &bridge).await;
    let events = reader
        .read_until(Duration::from_secs(120), |got| {
            got.iter()
                .map(|r| r.event.id().to_string())
                .collect::<BTreeSet<_>>()
                .len()
                >= 26
        })
        .await;
    let mut all = events;
    all.extend(reader.drain(Duration::from_secs(2)).await);
    let t = tally(all);
    for i in 0..10 {
        let name = format!("o{i}");
        let changes: Vec<&str> = t.per_object[&name].iter().map(|r| r.change()).collect();
        let expected: &[&str] = if i % 2 == 0 {
            &["added", "modified", "deleted"]
        } else {
            &["added", "modified"]
        };
        assert_eq!(changes, expected, "{name}");
        let rvs: Vec<u64> = t.per_object[&name].iter().map(|r| r.rv()).collect();
        assert!(
            rvs.windows(2).all(|w| w[0] < w[1]),
            "{name}: resourceVersions go backwards: {rvs:?}"
        );
    }
    eprintln!(
        "{component} outage: 26 changes expected, {} objects, {} duplicates before dedup, {} transactions aborted and sent again",
        t.per_object.len(),
        t.duplicates,
        bridge.count_log("kafka transaction did not commit: aborting it and sending its events again")
            + bridge.count_log("a delivery failed inside the kafka transaction: aborting it and sending its events again")
    );
    assert!(
        bridge.log_text().contains("retrying") || sink == SinkKind::Kafka,
        "NATS publishes should have been retried"
    );
}

/// JetStream's acknowledgements come late while a watch lists more objects than async-nats
/// admits unacknowledged by default: the watch never waits for ever on its own permits.
#[tokio::test(flavor = "multi_thread")]
async fn nats_more_in_flight_than_the_default_ack_permits() {
    acks::more_in_flight_than_the_default_permits().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_outage_loses_nothing() {
    broker_outage(SinkKind::Kafka, "kafka").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_outage_loses_nothing() {
    broker_outage(SinkKind::Nats, "nats").await;
}

/// Kafka stopped for seven times the transaction timeout while a transaction is open at the
/// coordinator and its commit due: the bridge keeps running (readiness names the unreachable
/// broker meanwhile), and once Kafka is back the resumed commit completes, or the producer the
/// coordinator fenced when it aborted the transaction is replaced and the events sent again.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_outage_longer_than_the_transaction_timeout_loses_nothing() {
    transactions::kafka_stopped().await;
}

/// As [`kafka_outage_longer_than_the_transaction_timeout_loses_nothing`], Kafka paused
/// (SIGSTOP): connections stay open and nothing answers; the commit is resumed past its call
/// timeout.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_paused_longer_than_the_transaction_timeout_loses_nothing() {
    transactions::kafka_paused().await;
}

/// A commit unanswered past its call timeout is resumed, not aborted, and completes once Kafka
/// answers: nothing is sent twice.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_commit_unanswered_past_its_call_timeout_is_resumed() {
    transactions::commit_unanswered().await;
}

/// The bridge paused past the transaction timeout: the coordinator aborts the transaction and
/// fences the producer; the bridge, the only instance, replaces its producer instead of exiting.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_bridge_paused_past_the_transaction_timeout_replaces_its_producer() {
    transactions::bridge_paused().await;
}

/// Round 15 of the fault campaign (seed 7): Kafka paused past the transaction timeout, the
/// bridge killed meanwhile and a new instance started as Kafka resumes, then Kafka stopped: the
/// new instance takes over the transactional id, and what it publishes reaches `read_committed`
/// consumers at once; nothing is lost.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_bridge_replaced_while_kafka_is_paused_past_the_transaction_timeout_loses_nothing() {
    transactions::bridge_replaced_while_kafka_paused().await;
}

/// A bridge started while Kafka is paused asks again for its checkpoint topic, not ready
/// meanwhile, instead of exiting; once Kafka answers it starts and loses nothing.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_bridge_started_while_kafka_is_paused_waits_for_it() {
    transactions::bridge_started_while_kafka_paused().await;
}

/// The setting of a 410 repair: ConfigMaps `same`, `changed`, `deleted` and `recreated` in a new
/// namespace, and a bridge configuration whose API server connection runs through a proxy that
/// can hold it off.
pub struct GoneScene {
    /// The namespace.
    pub ns: String,
    /// Its ConfigMaps.
    pub cms: Api<ConfigMap>,
    /// The cluster name (topic, subject and stream carry it).
    pub cluster: String,
    /// The bridge's configuration.
    pub config: String,
    proxy: Proxy,
    _dir: tempfile::TempDir,
}

impl GoneScene {
    /// Creates the namespace, its four ConfigMaps and the proxy.
    pub async fn new(sink: SinkKind, prefix: &str) -> Self {
        let client = kube_client().await;
        let ns = unique_namespace(&client, prefix).await;
        let cms: Api<ConfigMap> = Api::namespaced(client, &ns);
        for name in ["same", "changed", "deleted", "recreated"] {
            cms.create(&PostParams::default(), &cm(name, "0"))
                .await
                .unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let (_, upstream) = kubeconfig_via(0, dir.path());
        let proxy = Proxy::start(upstream).await;
        let (kubeconfig, _) = kubeconfig_via(proxy.port, dir.path());
        let cluster = unique_name("c");
        let config = format!(
            "cluster: {cluster}\nkubernetes: {{kubeconfig: {}}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}",
            kubeconfig.display(),
            sink_yaml(sink, &cluster)
        );
        GoneScene {
            ns,
            cms,
            cluster,
            config,
            proxy,
            _dir: dir,
        }
    }

    /// While the bridge cannot see the API server: `changed` patched, `deleted` deleted,
    /// `recreated` deleted and created again, `added` created; then the API server restarts, so
    /// the bridge's resourceVersion is gone (410). Returns the new `recreated` and `added`.
    pub async fn change_unseen_then_restart(&self) -> (ConfigMap, ConfigMap) {
        let cms = &self.cms;
        let pp = PostParams::default();
        self.proxy.pause(true);
        cms.patch(
            "changed",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": "1"}})),
        )
        .await
        .unwrap();
        cms.delete("deleted", &DeleteParams::default())
            .await
            .unwrap();
        cms.delete("recreated", &DeleteParams::default())
            .await
            .unwrap();
        let recreated = cms.create(&pp, &cm("recreated", "new")).await.unwrap();
        let added = cms.create(&pp, &cm("added", "1")).await.unwrap();
        testenv("stop", "kube-apiserver");
        testenv("start", "kube-apiserver");
        self.proxy.pause(false);
        (recreated, added)
    }
}

/// A name deleted and created again while the bridge could not see it, on a topic keyed by name
/// with tombstones: after the repair the last record of that key is the new object, not a
/// tombstone (the old uid's end comes before the new uid's beginning), so compaction keeps it.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_repair_of_a_recreated_name_leaves_it_on_a_compacted_topic() {
    use rdkafka::Message;
    use rdkafka::consumer::{Consumer, StreamConsumer};
    let _guard = EXCLUSIVE.lock().await;
    let mut scene = GoneScene::new(SinkKind::Kafka, "gonekey").await;
    scene.config = scene.config.replace(
        "resource: configmaps, namespaces: [",
        "resource: configmaps, key: namespacedName, tombstones: true, namespaces: [",
    );
    let topic = format!("k8s.{}.core.configmaps", scene.cluster);
    support::create_topic(&topic, 3).await;
    let mut bridge = Bridge::start(&scene.config);
    bridge.wait_synced(1).await;
    let (recreated, _) = scene.change_unseen_then_restart().await;
    let consumer: StreamConsumer = support::kafka_consumer(&unique_name("compacted"));
    consumer.subscribe(&[topic.as_str()]).unwrap();
    let key = format!("{}/recreated", scene.ns);
    let new_uid = recreated.metadata.uid.clone().unwrap();
    // Per key, the last record: Some(uid) for an event, None for a tombstone.
    let mut last: BTreeMap<String, Option<String>> = BTreeMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let mut quiet_since = std::time::Instant::now();
    while std::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_millis(500), consumer.recv()).await {
            Ok(Ok(m)) => {
                let k = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
                let uid = m.payload().map(|_| {
                    kube_event_bridge::tail::decode_kafka(&m)
                        .unwrap()
                        .extension("uid")
                        .map(|v| v.to_string())
                        .unwrap_or_default()
                });
                last.insert(k, uid);
                quiet_since = std::time::Instant::now();
            }
            // Records of the first list carry the old uid: wait for the repair's, however long
            // the bridge's backoff after the restart lasts.
            _ if last.get(&key) == Some(&Some(new_uid.clone()))
                && quiet_since.elapsed() > Duration::from_secs(5) =>
            {
                break;
            }
            _ => {}
        }
    }
    assert!(
        bridge.count_log("watch history lost, relisting") >= 1,
        "the repair ran"
    );
    assert_eq!(
        last.get(&key),
        Some(&Some(new_uid)),
        "the last record of {key} is the new object: {last:?}"
    );
    let deleted = format!("{}/deleted", scene.ns);
    assert_eq!(
        last.get(&deleted),
        Some(&None),
        "a deleted name ends in a tombstone"
    );
}

/// Changes the bridge cannot see (its connection is held off), then an API server restart so its
/// resourceVersion is gone (410): it relists, diffs against what it knew, and publishes exactly
/// the differences, marked as repaired; unchanged objects produce nothing.
async fn gone_repair(sink: SinkKind) {
    let _guard = EXCLUSIVE.lock().await;
    let scene = GoneScene::new(sink, "gone").await;
    let mut bridge = Bridge::start(&scene.config);
    let cluster = &scene.cluster;
    let topics = vec![format!("k8s.{cluster}.core.configmaps")];
    let mut reader = Reader::for_sink(sink, cluster, &topics, &bridge).await;
    bridge.wait_synced(1).await;
    let snapshot = reader
        .read_until(Duration::from_secs(30), |got| got.len() == 4)
        .await;
    assert!(
        snapshot.iter().all(|r| r.ext("origin") == "snapshot"),
        "{}",
        summary(&snapshot)
    );
    let old_recreated_uid = snapshot
        .iter()
        .find(|r| r.ext("name") == "recreated")
        .unwrap()
        .ext("uid");

    let (recreated, added) = scene.change_unseen_then_restart().await;

    // The broker stays up; only the API server restarts (for Kafka and NATS the checkpoint's
    // resourceVersion is then gone, so the restarted watch relists against the saved index).
    let events = reader
        .read_until(Duration::from_secs(90), |got| got.len() >= 5)
        .await;
    let extra = reader.drain(Duration::from_secs(2)).await;
    assert!(extra.is_empty(), "unexpected:\n{}", summary(&extra));
    let got: BTreeSet<(String, String, String)> = events
        .iter()
        .map(|r| (r.ext("name"), r.change().to_string(), r.ext("origin")))
        .collect();
    let want: BTreeSet<(String, String, String)> = [
        ("changed", "modified"),
        ("deleted", "deleted"),
        ("recreated", "deleted"),
        ("recreated", "added"),
        ("added", "added"),
    ]
    .iter()
    .map(|(n, c)| (n.to_string(), c.to_string(), "repaired".to_string()))
    .collect();
    assert_eq!(got, want, "{}", summary(&events));
    let del = events
        .iter()
        .find(|r| r.ext("name") == "recreated" && r.change() == "deleted")
        .unwrap();
    assert_eq!(del.ext("uid"), old_recreated_uid, "the old uid is deleted");
    let add = events
        .iter()
        .find(|r| r.ext("name") == "recreated" && r.change() == "added")
        .unwrap();
    assert_eq!(
        add.ext("uid"),
        recreated.metadata.uid.unwrap(),
        "the new uid is added"
    );
    let a = events.iter().find(|r| r.ext("name") == "added").unwrap();
    assert_eq!(
        a.ext("resourceversion"),
        added.metadata.resource_version.unwrap()
    );
    assert!(
        bridge.count_log("watch history lost, relisting") >= 1,
        "log:\n{}",
        bridge.log_text()
    );
}

/// Runs per sink: `KEB_CRASH_OBJECTS` objects (default 200) and `KEB_CRASH_KILLS` SIGKILLs
/// (default 20); `scripts/faults-full` runs a longer series.
fn crash_params() -> (usize, usize) {
    let get = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    (get("KEB_CRASH_OBJECTS", 200), get("KEB_CRASH_KILLS", 20))
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_sigkill_loop_loses_nothing() {
    let _guard = EXCLUSIVE.lock().await;
    let (objects, kills) = crash_params();
    crash::crash_loop(SinkKind::Kafka, objects, kills).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_sigkill_loop_loses_nothing() {
    let _guard = EXCLUSIVE.lock().await;
    let (objects, kills) = crash_params();
    crash::crash_loop(SinkKind::Nats, objects, kills).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_sigkill_loop_loses_nothing() {
    let _guard = EXCLUSIVE.lock().await;
    let (objects, kills) = crash_params();
    crash::crash_loop(SinkKind::Http, objects, kills).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_failover_between_replicas() {
    let _guard = EXCLUSIVE.lock().await;
    crash::failover(SinkKind::Kafka, 250).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_failover_between_replicas() {
    let _guard = EXCLUSIVE.lock().await;
    crash::failover(SinkKind::Nats, 250).await;
}

/// The HTTP sink's replicas keep their checkpoints in a NATS bucket they all reach: the new
/// leader resumes where the old one stopped, so no delete and no version is lost at a failover
/// (with a directory per pod, the new leader listed from nothing and lost 18 of 60 deletes).
#[tokio::test(flavor = "multi_thread")]
async fn http_failover_with_a_shared_checkpoint_bucket_loses_nothing() {
    let _guard = EXCLUSIVE.lock().await;
    crash::failover(SinkKind::Http, 250).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_object_published_past_the_checkpoint_is_deleted_after_a_crash_and_a_410() {
    announce::published_past_the_checkpoint(SinkKind::Nats).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_object_published_past_the_checkpoint_is_deleted_after_a_crash_and_a_410() {
    announce::published_past_the_checkpoint(SinkKind::Http).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stdout_gone_after_apiserver_restart_is_repaired() {
    gone_repair(SinkKind::Stdout).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_gone_after_apiserver_restart_is_repaired() {
    gone_repair(SinkKind::Kafka).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_gone_after_apiserver_restart_is_repaired() {
    gone_repair(SinkKind::Nats).await;
}

mod consumer;
#[path = "../integration/store_check.rs"]
mod store_check;

#[tokio::test(flavor = "multi_thread")]
async fn kafka_consumer_store_equals_the_list_after_gone_repair() {
    consumer::store_after_gone_repair(SinkKind::Kafka).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_consumer_store_equals_the_list_after_gone_repair() {
    consumer::store_after_gone_repair(SinkKind::Nats).await;
}
