//! Kafka transactions across faults that outlast a commit's call timeout (30 s) or the
//! transaction timeout: the broker paused or stopped, the bridge paused. Each fault starts while
//! a transaction is open at the coordinator, holding an acknowledged event, with its commit due
//! a few seconds later: transactions commit every three seconds here, and the fault follows a
//! commit by half a second. The bridge must keep running (or, killed, its successor take over),
//! become ready again and lose nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use cloudevents::AttributesReader;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::{self, Bridge, Reader, Received, SinkKind, sink_yaml};
use crate::support::{self, kube_client, unique_name, unique_namespace};
use crate::{EXCLUSIVE, Paused, Stopped, cm};

/// The objects the changes go to.
const OBJECTS: usize = 5;

/// Transactions commit this often (and checkpoints with them).
const COMMIT_INTERVAL_MS: u64 = 3_000;

/// Log lines that tell which way the bridge got through.
const RESUMED: &str = "kafka transaction call did not finish in time: resuming it";
const TIMED_OUT: &str = "kafka transaction outlived the transaction timeout and the broker aborted it: creating a new producer";
const CANNOT_ABORT: &str = "kafka transaction cannot be aborted: creating a new producer";
const COMMIT_UNANSWERED: &str = "kafka transaction commit went unanswered: creating a new producer";
const ABORT_UNANSWERED: &str = "kafka transaction abort went unanswered: creating a new producer";
const FENCED: &str = "fenced: another instance owns this watch now";
const FENCED_DELIVERY: &str = "producer fenced or broken: stopping this watch";
const TOPIC_RETRY: &str =
    "kafka brokers did not answer while preparing the checkpoint topic; retrying";

/// A bridge watching the ConfigMaps of a fresh namespace, and every change written to them.
struct Scene {
    cms: Api<ConfigMap>,
    topics: Vec<String>,
    /// The bridge's configuration (a replacement starts on it).
    config: String,
    bridge: Bridge,
    /// (name, resourceVersion) of every change written, in order.
    written: Vec<(String, u64)>,
}

impl Scene {
    /// Starts a bridge whose transactions time out after `timeout_secs` and commit every
    /// [`COMMIT_INTERVAL_MS`], once the objects exist and their events are committed.
    async fn start(prefix: &str, timeout_secs: u64) -> Scene {
        let client = kube_client().await;
        let ns = unique_namespace(&client, prefix).await;
        let cluster = unique_name("c");
        let config = format!(
            "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}    transactionTimeoutSecs: {timeout_secs}\n    commitIntervalMs: {COMMIT_INTERVAL_MS}\ncheckpoint: {{intervalMs: {COMMIT_INTERVAL_MS}}}\n",
            sink_yaml(SinkKind::Kafka, &cluster)
        );
        // Investigations: `KEB_KAFKA_DEBUG=broker,eos` has librdkafka log those contexts (its
        // `debug` property) into the bridge's log (kept with `KEB_KEEP_LOGS`).
        let debug = std::env::var("KEB_KAFKA_DEBUG").ok();
        let config = match &debug {
            Some(contexts) => config.replace(
                "    transactionTimeoutSecs",
                &format!("    properties: {{debug: \"{contexts}\"}}\n    transactionTimeoutSecs"),
            ),
            None => config,
        };
        let topics = vec![format!("k8s.{cluster}.core.configmaps")];
        support::create_topic(&topics[0], 3).await;
        let filter = match debug {
            Some(_) => "info,kube_event_bridge=debug,librdkafka=debug",
            None => "info,kube_event_bridge=debug",
        };
        let mut bridge = Bridge::start_with_env(&config, &[("RUST_LOG", filter)]);
        bridge.wait_synced(1).await;
        let cms: Api<ConfigMap> = Api::namespaced(client, &ns);
        let mut written = Vec::new();
        for i in 0..OBJECTS {
            let name = format!("o{i}");
            let made = cms
                .create(&PostParams::default(), &cm(&name, "0"))
                .await
                .unwrap();
            written.push((name, rv(&made)));
        }
        let scene = Scene {
            cms,
            topics,
            config,
            bridge,
            written,
        };
        support::wait_until(
            "the objects' events are committed",
            Duration::from_secs(30),
            || async {
                (scene.metric("kube_event_bridge_checkpoints_total").await >= 1.0
                    && scene
                        .metric("kube_event_bridge_events_published_total")
                        .await
                        >= OBJECTS as f64)
                    .then_some(())
            },
        )
        .await;
        scene
    }

    /// Patches the next object; its resourceVersion is kept.
    async fn change(&mut self) {
        let name = format!("o{}", self.written.len() % OBJECTS);
        let patch = json!({"data": {"v": self.written.len().to_string()}});
        let patched = self
            .cms
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap();
        self.written.push((name, rv(&patched)));
    }

    /// The sum of a counter over the bridge's watches.
    async fn metric(&self, name: &str) -> f64 {
        let address = self.bridge.admin_address().await;
        let (_, body) = harness::get(&address, "/metrics").await;
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

    /// Returns once a transaction is open at the coordinator holding an acknowledged event
    /// that arrived just after a commit, with nothing else in flight: its own commit is due
    /// about [`COMMIT_INTERVAL_MS`] after the one before.
    async fn open_transaction(&mut self) {
        let commits = "kube_event_bridge_checkpoints_total";
        let published = "kube_event_bridge_events_published_total";
        let deadline = Instant::now() + Duration::from_secs(60);
        // Changes keep transactions coming; the first commit seen sets the clock.
        let before = self.metric(commits).await;
        let mut last_change = Instant::now() - Duration::from_secs(1);
        while self.metric(commits).await == before {
            assert!(Instant::now() < deadline, "no commit within a minute");
            if last_change.elapsed() >= Duration::from_millis(500) {
                self.change().await;
                last_change = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let committed_at = Instant::now();
        let acked = self.metric(published).await;
        self.change().await;
        support::wait_until(
            "the change after the commit is acknowledged",
            Duration::from_secs(10),
            || async { (self.metric(published).await > acked).then_some(()) },
        )
        .await;
        let margin =
            Duration::from_millis(COMMIT_INTERVAL_MS).saturating_sub(committed_at.elapsed());
        assert!(
            margin >= Duration::from_secs(1),
            "the change took too long to be acknowledged: the next commit may have begun"
        );
    }

    /// Patches the next object; a `read_committed` consumer that starts reading now must see its
    /// event within `within` (panics otherwise).
    async fn change_arrives_within(&mut self, within: Duration) {
        self.change().await;
        let (_, rv) = self.written.last().cloned().expect("a change");
        let mut reader = Reader::kafka(&self.topics).await;
        reader
            .read_until(within, |got| got.iter().any(|r| r.rv() == rv))
            .await;
    }

    /// Waits until /readyz answers 200 again.
    async fn wait_ready(&self) {
        let address = self.bridge.admin_address().await;
        support::wait_until(
            "/readyz answers 200 again",
            Duration::from_secs(120),
            || async { (harness::get(&address, "/readyz").await.0 == 200).then_some(()) },
        )
        .await;
    }

    /// Waits until /readyz names the unreachable broker (once nothing is answered for the stall
    /// threshold, 30 s).
    async fn wait_stalled(&self) {
        let address = self.bridge.admin_address().await;
        let why = support::wait_until(
            "/readyz names the unreachable broker",
            Duration::from_secs(60),
            || async {
                let (code, body) = harness::get(&address, "/readyz").await;
                (code == 503 && body.contains("broker_unavailable")).then_some(body)
            },
        )
        .await;
        eprintln!("during the fault: {why}");
    }

    /// After the fault: the bridge runs and is ready, takes a few more changes, and a
    /// `read_committed` consumer reading from the start sees every change written exactly once
    /// after deduplicating by event id, in order per object. Returns the duplicates.
    async fn check_nothing_lost(&mut self) -> usize {
        assert!(
            self.bridge
                .wait_exit(Duration::from_millis(10))
                .await
                .is_none(),
            "the bridge exited:\n{}",
            self.bridge.log_text()
        );
        self.wait_ready().await;
        for _ in 0..OBJECTS {
            self.change().await;
        }
        let want: BTreeSet<u64> = self.written.iter().map(|(_, rv)| *rv).collect();
        let mut reader = Reader::kafka(&self.topics).await;
        // Room for the slowest recovery: a commit unanswered for its three calls (90 s), then a
        // new producer and the transaction sent again.
        let mut events = reader
            .read_until(Duration::from_secs(180), |got| {
                want.is_subset(&got.iter().map(Received::rv).collect())
            })
            .await;
        events.extend(reader.drain(Duration::from_secs(2)).await);
        let mut ids = BTreeSet::new();
        let mut duplicates = 0;
        let mut per_object: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for r in &events {
            if ids.insert(r.event.id().to_string()) {
                per_object.entry(r.ext("name")).or_default().push(r.rv());
            } else {
                duplicates += 1;
            }
        }
        let mut expected: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for (name, rv) in &self.written {
            expected.entry(name.clone()).or_default().push(*rv);
        }
        assert_eq!(per_object, expected, "{}", harness::summary(&events));
        assert!(
            self.bridge
                .wait_exit(Duration::from_millis(10))
                .await
                .is_none(),
            "the bridge exited:\n{}",
            self.bridge.log_text()
        );
        for message in [FENCED, FENCED_DELIVERY] {
            assert_eq!(self.bridge.count_log(message), 0, "{message}");
        }
        duplicates
    }

    /// One line saying which way the bridge got through.
    fn report(&self, fault: &str, duplicates: usize) {
        eprintln!(
            "{fault}: {} changes, {duplicates} duplicates before dedup; calls resumed {}, producers replaced after the broker's timeout {}, after a refused abort {}, after an unanswered commit {}, after an unanswered abort {}",
            self.written.len(),
            self.bridge.count_log(RESUMED),
            self.bridge.count_log(TIMED_OUT),
            self.bridge.count_log(CANNOT_ABORT),
            self.bridge.count_log(COMMIT_UNANSWERED),
            self.bridge.count_log(ABORT_UNANSWERED),
        );
    }
}

fn rv(cm: &ConfigMap) -> u64 {
    cm.metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

/// Kafka stopped for seven times the transaction timeout while a transaction is open at the
/// coordinator and its commit due: the commit is resumed, and once Kafka is back either it
/// completes or the coordinator has aborted the transaction and fenced the producer, which is
/// then replaced (the process owns its transactional id) and its events sent again.
pub async fn kafka_stopped() {
    let _guard = EXCLUSIVE.lock().await;
    let mut scene = Scene::start("txn-outage", 6).await;
    scene.open_transaction().await;
    let stopped = Instant::now();
    let outage = Stopped::new("kafka");
    scene.wait_stalled().await;
    tokio::time::sleep(Duration::from_secs(42).saturating_sub(stopped.elapsed())).await;
    assert!(
        scene
            .bridge
            .wait_exit(Duration::from_millis(10))
            .await
            .is_none(),
        "the bridge must ride out the outage"
    );
    outage.start();
    let duplicates = scene.check_nothing_lost().await;
    scene.report("kafka stopped for 42 s", duplicates);
}

/// Kafka paused (SIGSTOP: connections stay open, nothing answers) for seven times the
/// transaction timeout, and longer than a commit's call timeout, while a transaction is open
/// and its commit due: as when it is stopped.
pub async fn kafka_paused() {
    let _guard = EXCLUSIVE.lock().await;
    let mut scene = Scene::start("txn-pause", 6).await;
    scene.open_transaction().await;
    let paused_at = Instant::now();
    let paused = Paused::new("kafka");
    scene.wait_stalled().await;
    tokio::time::sleep(Duration::from_secs(42).saturating_sub(paused_at.elapsed())).await;
    assert!(
        scene
            .bridge
            .wait_exit(Duration::from_millis(10))
            .await
            .is_none(),
        "the bridge must ride out the pause"
    );
    paused.resume();
    let duplicates = scene.check_nothing_lost().await;
    scene.report("kafka paused for 42 s", duplicates);
    assert!(
        scene.bridge.count_log(RESUMED) >= 1,
        "the commit was resumed"
    );
}

/// A commit the broker does not answer within its call timeout (Kafka paused for 40 s, the
/// transaction timeout two minutes) goes on in librdkafka: it is resumed, not aborted (an abort
/// would be refused for as long as the commit is under way), and completes once Kafka answers.
/// Once in a while it never completes: the broker comes back fenced by its own controller (a
/// pause past its 9 s session timeout), and librdkafka 2.12 can lose its transaction
/// coordinator then (the commit's later calls time out although Kafka answers). After the
/// commit's third call the producer is replaced and the transaction's events are sent again:
/// duplicates by id, nothing lost. Only that path may send anything again.
pub async fn commit_unanswered() {
    let _guard = EXCLUSIVE.lock().await;
    let mut scene = Scene::start("txn-resume", 120).await;
    scene.open_transaction().await;
    let paused_at = Instant::now();
    let paused = Paused::new("kafka");
    support::wait_until("the commit is resumed", Duration::from_secs(60), || async {
        (scene.bridge.count_log(RESUMED) >= 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(40).saturating_sub(paused_at.elapsed())).await;
    paused.resume();
    let duplicates = scene.check_nothing_lost().await;
    scene.report("kafka paused for 40 s", duplicates);
    for replaced in [TIMED_OUT, CANNOT_ABORT] {
        assert_eq!(scene.bridge.count_log(replaced), 0, "{replaced}");
    }
    if scene.bridge.count_log(COMMIT_UNANSWERED) == 0 {
        assert_eq!(
            duplicates, 0,
            "the resumed commit committed: nothing was sent again"
        );
    } else {
        eprintln!(
            "the resumed commit never completed after Kafka came back: the producer was replaced and {duplicates} events sent again"
        );
    }
}

/// The bridge paused (SIGSTOP) past the transaction timeout while a transaction is open: the
/// coordinator aborts it and bumps the producer's epoch, so the resumed bridge's commit is
/// refused as fenced. No other instance exists: the bridge replaces its producer and sends the
/// transaction's events again instead of exiting.
pub async fn bridge_paused() {
    let _guard = EXCLUSIVE.lock().await;
    let mut scene = Scene::start("txn-bridge-pause", 6).await;
    scene.open_transaction().await;
    scene.bridge.signal("STOP");
    // The coordinator looks for transactions past their timeout every 10 s.
    tokio::time::sleep(Duration::from_secs(6 + 10 + 6)).await;
    scene.bridge.signal("CONT");
    support::wait_until(
        "the bridge replaces its producer",
        Duration::from_secs(60),
        || async { (scene.bridge.count_log(TIMED_OUT) >= 1).then_some(()) },
    )
    .await;
    let duplicates = scene.check_nothing_lost().await;
    scene.report("bridge paused for 22 s", duplicates);
}

/// How round 15 of the fault campaign (seed 7) began: Kafka paused past the transaction timeout
/// while a transaction is open and changes keep coming, the bridge killed while Kafka is still
/// paused (its transaction's partitions reach the coordinator only once Kafka resumes) and a
/// new instance started as Kafka resumes, then Kafka stopped for a few seconds. The new
/// instance's `init_transactions` aborts what the old one left open, and it resumes from the
/// last committed checkpoint: a change made afterwards reaches a `read_committed` consumer
/// within seconds, and every change arrives exactly once (after deduplicating by id), in order.
pub async fn bridge_replaced_while_kafka_paused() {
    let _guard = EXCLUSIVE.lock().await;
    let timeout_secs = 10;
    let mut scene = Scene::start("txn-replaced", timeout_secs).await;
    scene.open_transaction().await;
    let paused_at = Instant::now();
    let paused = Paused::new("kafka");
    // Past the transaction timeout and the producer's AddPartitionsToTxn request timeout.
    while paused_at.elapsed() < Duration::from_secs(timeout_secs + 5) {
        scene.change().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    scene.bridge.signal("KILL");
    assert!(
        scene
            .bridge
            .wait_exit(Duration::from_secs(10))
            .await
            .is_some(),
        "the bridge did not exit after SIGKILL"
    );
    paused.resume();
    scene.bridge = Bridge::start(&scene.config);
    scene.bridge.wait_log("resuming from checkpoint").await;
    scene.wait_ready().await;
    scene.change_arrives_within(Duration::from_secs(30)).await;
    let outage = Stopped::new("kafka");
    scene.change().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    outage.start();
    scene.wait_ready().await;
    scene.change_arrives_within(Duration::from_secs(30)).await;
    let duplicates = scene.check_nothing_lost().await;
    scene.report(
        "kafka paused for 15 s, the bridge replaced meanwhile, then kafka stopped",
        duplicates,
    );
}

/// Found by the fault campaign (seed 1796631439): a replica started while Kafka recovered from
/// a pause exited at start, its one admin request to prepare the checkpoint topic timed out. Here the bridge starts while Kafka is paused, past that request's time limit: it asks
/// again, logging each failure, and is not ready meanwhile; once Kafka answers it starts,
/// becomes ready, and what changed while it was down arrives.
pub async fn bridge_started_while_kafka_paused() {
    let _guard = EXCLUSIVE.lock().await;
    let mut scene = Scene::start("txn-start-paused", 10).await;
    scene.bridge.signal("TERM");
    scene
        .bridge
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the bridge exits after SIGTERM");
    let paused = Paused::new("kafka");
    scene.change().await;
    scene.bridge = Bridge::start(&scene.config);
    let address = scene.bridge.admin_address().await;
    support::wait_until(
        "the bridge asks Kafka again",
        Duration::from_secs(120),
        || async { (scene.bridge.count_log(TOPIC_RETRY) > 0).then_some(()) },
    )
    .await;
    let (code, body) = harness::get(&address, "/readyz").await;
    assert_eq!((code, body.as_str()), (503, "not ready: starting\n"));
    paused.resume();
    scene.bridge.wait_log("resuming from checkpoint").await;
    scene.wait_ready().await;
    scene.change_arrives_within(Duration::from_secs(30)).await;
    let duplicates = scene.check_nothing_lost().await;
    eprintln!(
        "asked Kafka again {} times while it was paused",
        scene.bridge.count_log(TOPIC_RETRY)
    );
    scene.report("a bridge started while kafka was paused", duplicates);
}
