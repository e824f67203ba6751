//! One round: fresh namespaces, one deployment per sink, the workload and the nemesis for most
//! of the round, then everything healed, quiescence awaited, and the checker run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::ListParams;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::checker::{Anomaly, check};
use crate::deployment::{Deployment, KAFKA_TRANSACTION_TIMEOUT_SECS, Mode, Sink, tail};
use crate::fleet::Bystanders;
use crate::history::{Evidence, WatchKey};
use crate::nemesis::{Injected, Nemesis};
use crate::observe::Observer;
use crate::receiver::Receiver;
use crate::snapshots::{Asker, Target};
use crate::workload::{CRD_GROUP, CRD_PLURAL, Layout, SELECT_LABEL, Workload};

/// How long the bridge may make no progress before `/readyz` must name why (the stall
/// threshold of docs/guarantees.md), plus a margin for probing.
const STALL: Duration = Duration::from_secs(45);
/// How long to wait for quiescence once every fault is healed.
const SETTLE: Duration = Duration::from_secs(150);

/// What one round found.
#[derive(Debug, Serialize)]
pub struct RoundReport {
    /// Its number.
    pub round: usize,
    /// Its seed.
    pub seed: u64,
    /// `sink/mode` of each deployment.
    pub deployments: Vec<String>,
    /// Faults injected.
    pub faults: Vec<Injected>,
    /// Acknowledged writes.
    pub writes: usize,
    /// Writes refused or failed, by reason.
    pub write_failures: BTreeMap<String, u64>,
    /// Events received per deployment.
    pub events: BTreeMap<String, usize>,
    /// What broke, with log lines.
    pub anomalies: Vec<Found>,
    /// Seconds from healing to quiescence, per deployment (`None`: never quiescent).
    pub settled_secs: BTreeMap<String, Option<f64>>,
    /// Replicas that exited by design (a leader that lost its Lease), per deployment.
    pub designed_exits: BTreeMap<String, usize>,
    /// The snapshots on demand asked of each deployment: request name, final phase, and how
    /// many begin and end markers of it the consumer received (copies of one marker id
    /// included: more than one end marker means the snapshot was published again).
    pub snapshots: BTreeMap<String, Vec<(String, String, usize, usize)>>,
}

/// An anomaly of one deployment, with the bridge's log lines about it.
#[derive(Debug, Serialize)]
pub struct Found {
    /// `sink/mode`.
    pub deployment: String,
    /// The anomaly.
    #[serde(flatten)]
    pub anomaly: Anomaly,
    /// Log lines of the replicas naming the object.
    pub log: Vec<String>,
}

/// Runs one round.
pub async fn run(
    number: usize,
    seed: u64,
    pairs: &[(Sink, Mode)],
    length: Duration,
    dir: &Path,
) -> RoundReport {
    let client = crate::support::kube_client().await;
    crate::support::create_crd(&client, CRD_GROUP, "Gadget", CRD_PLURAL, "Namespaced").await;
    let layout = make_layout(&client).await;
    let bystanders = if pairs.iter().any(|(_, m)| *m == Mode::Fleet) {
        Some(Bystanders::start(&client, &layout.plain[0]).await)
    } else {
        None
    };
    let started = Instant::now();
    let mut receivers = BTreeMap::new();
    let mut deployments = Vec::new();
    let mut observers = Vec::new();
    let mut targets = Vec::new();
    for (i, (sink, mode)) in pairs.iter().enumerate() {
        let cluster = crate::support::unique_name(&format!("chaos-{}", sink.name()));
        let fleet = bystanders.as_ref().filter(|_| *mode == Mode::Fleet);
        let others = fleet.map(Bystanders::names).unwrap_or_default();
        let (sink_yaml, mut observer) =
            prepare(*sink, &cluster, started, i, &mut receivers, &others).await;
        if fleet.is_some() {
            observer = observer.checking(&cluster);
        }
        let sub = dir.join(format!("{}-{}", sink.name(), mode.name()));
        let secrets = fleet.map(|b| b.namespace.as_str());
        let requests = crate::support::unique_namespace(&client, "chaos-req").await;
        deployments.push(Deployment::start(
            *sink, *mode, &cluster, &layout, &sink_yaml, &sub, secrets, &requests,
        ));
        observers.push(observer);
        targets.push(Target {
            namespace: requests,
            cluster,
        });
    }
    let watches = layout.watches().len();
    for d in &mut deployments {
        if let Err(e) = d.wait_synced(watches, Duration::from_secs(120)).await {
            panic!("round {number}: {e}");
        }
    }
    println!(
        "chaos: round {number} (seed {seed}): {} synced; writing for {length:?}",
        names(&deployments)
    );

    let mut workload = Workload::new(client.clone(), layout.clone(), seed, started);
    let ledger = workload.ledger.clone();
    let mut asker = Asker::new(client.clone(), &layout, targets, seed ^ 0x5a4b, started);
    let mut nemesis = Nemesis::new(seed ^ 0x5eed, started, workload.hold.clone());
    nemesis.bystanders = bystanders;
    let quiet_tail = Duration::from_secs(15).min(length / 4);
    let end = Instant::now() + length.saturating_sub(quiet_tail);
    let writer = tokio::spawn(async move { workload.run(end, 25).await });
    let mut stuck = Vec::new();
    drive(
        &mut nemesis,
        &mut deployments,
        &receivers,
        &observers,
        &ledger,
        end,
        seed,
        &mut stuck,
        &mut asker,
    )
    .await;
    writer.await.expect("workload task");
    nemesis.heal(&mut deployments, &receivers, true).await;
    for c in ["kube-apiserver", "kafka", "nats"] {
        crate::nemesis::testenv("resume", c).await;
        crate::nemesis::testenv("start", c).await;
    }
    for d in &mut deployments {
        for r in d.replicas.iter_mut().filter(|r| r.paused) {
            r.signal("CONT");
        }
    }

    let settled = settle(&client, &layout, &mut deployments, &observers).await;
    asker.finish(&observers).await;
    if let Some(b) = &nemesis.bystanders {
        let fleets: Vec<(usize, &Observer)> = deployments
            .iter()
            .enumerate()
            .filter(|(_, d)| d.mode == Mode::Fleet)
            .map(|(i, _)| (i, &observers[i]))
            .collect();
        stuck.extend(b.probe(number, &fleets).await);
    }
    let ledger = ledger.lock().unwrap();
    let mut anomalies = Vec::new();
    let mut events = BTreeMap::new();
    for (i, d) in deployments.iter().enumerate() {
        let o = observers[i].observed.lock().unwrap();
        events.insert(d.name.clone(), o.seen.len());
        let compacted =
            (d.sink == Sink::Kafka).then(|| (o.compacted.clone(), settled.by_name.clone()));
        let evidence = Evidence {
            writes: ledger.writes.clone(),
            uncertain: ledger.uncertain.clone(),
            seen: o.seen.clone(),
            live: settled.live.clone(),
            store: o.store(),
            compacted,
            markers: o.markers.clone(),
            requested: asker.requested[i].clone(),
            // NATS: one stream. HTTP: a chunk is acknowledged before the next is read and
            // before the end marker is sent, and the begin marker before any object is read.
            // Kafka: several partitions, read in no common order.
            ordered: d.sink != Sink::Kafka,
        };
        let mut found = check(&evidence);
        found.extend(
            o.undecodable
                .iter()
                .map(|e| anomaly("undecodable", e.clone())),
        );
        found.extend(d.unexpected_exits.iter().map(|(n, status, line)| {
            anomaly(
                "exited",
                format!("replica {n} exited by itself ({status}); last error: {line}"),
            )
        }));
        found.extend(
            stuck
                .iter()
                .filter(|(n, _)| *n == i)
                .map(|(_, a)| a.clone()),
        );
        for anomaly in found {
            let needle = if anomaly.object.is_empty() {
                &anomaly.uid
            } else {
                &anomaly.object
            };
            let log = if needle.is_empty() {
                Vec::new()
            } else {
                d.log_lines(needle, 12)
            };
            anomalies.push(Found {
                deployment: d.name.clone(),
                anomaly,
                log,
            });
        }
    }
    RoundReport {
        round: number,
        seed,
        deployments: deployments.iter().map(|d| d.name.clone()).collect(),
        faults: nemesis.injected,
        writes: ledger.writes.len(),
        write_failures: ledger.failures.clone(),
        events,
        anomalies,
        settled_secs: deployments
            .iter()
            .zip(&settled.secs)
            .map(|(d, s)| (d.name.clone(), *s))
            .collect(),
        designed_exits: deployments
            .iter()
            .map(|d| (d.name.clone(), d.designed_exits.len()))
            .collect(),
        snapshots: deployments
            .iter()
            .zip(&asker.requested)
            .zip(&observers)
            .map(|((d, asked), o)| {
                let markers = &o.observed.lock().unwrap().markers;
                let count = |uid: &str, end: bool| {
                    markers
                        .iter()
                        .filter(|m| m.snapshot == uid && m.end.is_some() == end)
                        .count()
                };
                let phases = asked
                    .iter()
                    .map(|r| {
                        let (begins, ends) = (count(&r.uid, false), count(&r.uid, true));
                        (r.name.clone(), r.phase.clone(), begins, ends)
                    })
                    .collect();
                (d.name.clone(), phases)
            })
            .collect(),
    }
}

fn anomaly(kind: &'static str, detail: String) -> Anomaly {
    Anomaly {
        kind,
        watch: String::new(),
        object: String::new(),
        uid: String::new(),
        ids: Vec::new(),
        detail,
    }
}

fn names(deployments: &[Deployment]) -> String {
    deployments
        .iter()
        .map(|d| d.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Namespaces for one round: two plain, one selected; the CRD's watches cover all three.
async fn make_layout(client: &kube::Client) -> Layout {
    let mut plain = Vec::new();
    for _ in 0..2 {
        plain.push(crate::support::unique_namespace(client, "chaos").await);
    }
    let selected = crate::support::unique_namespace(client, "chaos-sel").await;
    let mut gadgets = plain.clone();
    gadgets.push(selected.clone());
    Layout {
        plain,
        selected,
        gadgets,
    }
}

/// The `sink:` section and the observer of one deployment.
/// Partitions of each Kafka topic a round creates.
const KAFKA_PARTITIONS: i32 = 3;

async fn prepare(
    sink: Sink,
    cluster: &str,
    started: Instant,
    index: usize,
    receivers: &mut BTreeMap<usize, Receiver>,
    others: &[String],
) -> (String, Observer) {
    let e = crate::support::env();
    match sink {
        Sink::Kafka => {
            // The checked cluster's topics (the compacted one third), then the bystanders'.
            let mut topics: Vec<String> = ["configmaps", CRD_PLURAL, "compacted"]
                .iter()
                .map(|r| format!("chaos.{cluster}.{r}"))
                .collect();
            topics.extend(others.iter().map(|o| format!("chaos.{o}.configmaps")));
            for t in &topics {
                crate::support::create_topic(t, KAFKA_PARTITIONS).await;
            }
            let yaml = format!(
                "sink:\n  kafka:\n    bootstrapServers: \"{}\"\n    topic: \"chaos.{{cluster}}.{{resource}}\"\n    transactionTimeoutSecs: {KAFKA_TRANSACTION_TIMEOUT_SECS}\n",
                e.kafka_bootstrap
            );
            let compacted = topics[2].clone();
            (
                yaml,
                Observer::kafka(topics, KAFKA_PARTITIONS, compacted, started),
            )
        }
        Sink::Nats => {
            let stream = crate::harness::stream_name(cluster);
            let yaml = format!(
                "sink:\n  nats:\n    url: \"{}\"\n    subject: \"chaos.{{cluster}}.{{resource}}.{{namespace}}.{{name}}\"\n    jetstream: {{stream: \"{stream}\", create: true}}\n",
                e.nats_url
            );
            let js = async_nats::jetstream::new(crate::support::nats_client().await);
            (yaml, Observer::nats(js, stream, started))
        }
        Sink::Http => {
            let receiver = Receiver::start();
            let yaml = format!(
                "sink:\n  http:\n    url: \"{}\"\n    timeoutSecs: 5\n",
                receiver.url()
            );
            receivers.insert(index, receiver.clone());
            (yaml, Observer::http(receiver, started))
        }
    }
}

/// Injects faults until `end`, undoing them when due, restarting replicas that exit and
/// watching for a deployment that makes no progress while every replica that answers says
/// it is ready. Readiness is sampled every second: a deployment is flagged only if no replica
/// said it was not ready during the last [`STALL`] (under leader election a chain of failovers
/// can hold publishing up for longer than that while each new leader says `starting` in turn;
/// one probe at the moment the stall is noticed may find only a follower, ready by design).
#[allow(clippy::too_many_arguments)]
async fn drive(
    nemesis: &mut Nemesis,
    deployments: &mut [Deployment],
    receivers: &BTreeMap<usize, Receiver>,
    observers: &[Observer],
    ledger: &Arc<std::sync::Mutex<crate::workload::Ledger>>,
    end: Instant,
    seed: u64,
    stuck: &mut Vec<(usize, Anomaly)>,
    asker: &mut Asker,
) {
    let hold = nemesis.hold();
    let mut rng = StdRng::seed_from_u64(seed ^ 0xfa17);
    let mut next = Instant::now() + Duration::from_secs(3);
    let mut flagged = BTreeSet::new();
    // When a replica of each deployment last answered /readyz with anything but 200.
    let mut unready: Vec<Option<Instant>> = vec![None; deployments.len()];
    let mut sampled = Instant::now();
    while Instant::now() < end {
        if sampled.elapsed() >= Duration::from_secs(1) {
            sampled = Instant::now();
            for (i, d) in deployments.iter_mut().enumerate() {
                // A fleet stays ready while another cluster publishes, naming this one.
                let named = format!("cluster {}:", d.cluster);
                let answers = readiness(d).await;
                if answers
                    .iter()
                    .any(|(s, body)| *s != 200 || body.contains(&named))
                {
                    unready[i] = Some(Instant::now());
                }
            }
        }
        nemesis.heal(deployments, receivers, false).await;
        for d in deployments.iter_mut() {
            d.reap();
        }
        asker.maybe_ask(ledger, &hold).await;
        if Instant::now() >= next {
            nemesis.strike(deployments, receivers).await;
            next = Instant::now() + Duration::from_millis(rng.random_range(2_000..7_000));
        }
        let started = nemesis.started();
        let waiting = waiting_watches(&ledger.lock().unwrap(), started);
        for (i, d) in deployments.iter_mut().enumerate() {
            if flagged.contains(&i) {
                continue;
            }
            let stuck_watches: Vec<String> = {
                let o = observers[i].observed.lock().unwrap();
                waiting
                    .iter()
                    .filter(|(w, oldest)| {
                        let last = o.last_new.get(*w).copied().unwrap_or(started);
                        last < **oldest && oldest.elapsed() > STALL
                    })
                    .map(|(w, _)| w.to_string())
                    .collect()
            };
            if stuck_watches.is_empty() {
                continue;
            }
            let answers = readiness(d).await;
            let named_lately = unready[i].is_some_and(|t| t.elapsed() < STALL);
            if !named_lately
                && !answers.is_empty()
                && answers.iter().all(|(status, _)| *status == 200)
            {
                flagged.insert(i);
                let detail = format!(
                    "watches {stuck_watches:?} received nothing new for more than {STALL:?} after a write while every replica answering /readyz said ready: {answers:?}; last log lines:\n{}",
                    d.replicas
                        .first()
                        .map(|r| tail(&r.log_text(), 20))
                        .unwrap_or_default()
                );
                stuck.push((i, anomaly("stuck-while-ready", detail)));
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What every replica of `d` that answers says to `/readyz`, asked side by side.
async fn readiness(d: &mut Deployment) -> Vec<(u16, String)> {
    futures::future::join_all(d.replicas.iter_mut().map(|r| r.readyz()))
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Per watch, when the oldest write that promised an event and came after the watch's
/// previous write was made: the clock a consumer waiting for it would run. Only writes of the
/// last [`STALL`] and a half are looked at.
fn waiting_watches(
    ledger: &crate::workload::Ledger,
    started: Instant,
) -> BTreeMap<WatchKey, Instant> {
    let horizon = started
        .elapsed()
        .saturating_sub(STALL + STALL / 2)
        .as_millis() as u64;
    let mut oldest = BTreeMap::new();
    for w in ledger
        .writes
        .iter()
        .rev()
        .take_while(|w| w.at_ms >= horizon)
    {
        if w.promise().is_some() {
            oldest.insert(w.watch.clone(), started + Duration::from_millis(w.at_ms));
        }
    }
    oldest
}

/// The live state at quiescence.
struct Settled {
    live: BTreeMap<WatchKey, BTreeMap<String, u64>>,
    /// The plain ConfigMaps by `namespace/name` (what the compacted topic must hold).
    by_name: BTreeMap<String, (String, u64)>,
    secs: Vec<Option<f64>>,
}

/// Waits until every deployment's store equals the live objects (or [`SETTLE`] passes), and
/// reads the live state.
async fn settle(
    client: &kube::Client,
    layout: &Layout,
    deployments: &mut [Deployment],
    observers: &[Observer],
) -> Settled {
    let healed = Instant::now();
    let mut secs = vec![None; deployments.len()];
    loop {
        for d in deployments.iter_mut() {
            d.reap();
        }
        let (live, by_name) = live_state(client, layout).await;
        for (i, o) in observers.iter().enumerate() {
            let store = o.observed.lock().unwrap().store();
            let same = layout.watches().iter().all(|w| {
                live.get(w).cloned().unwrap_or_default()
                    == store.get(w).cloned().unwrap_or_default()
            });
            if same && secs[i].is_none() {
                secs[i] = Some(healed.elapsed().as_secs_f64());
            }
        }
        let done = secs.iter().all(Option::is_some);
        if done || healed.elapsed() > SETTLE {
            // Late duplicates and tombstones: a moment more, then the final reading.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let (live, by_name) = live_state(client, layout).await;
            return Settled {
                live,
                by_name,
                secs,
            };
        }
        let _ = by_name;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Lists every watch's objects (uid to resourceVersion), retrying while the API server is not
/// answering.
async fn live_state(
    client: &kube::Client,
    layout: &Layout,
) -> (
    BTreeMap<WatchKey, BTreeMap<String, u64>>,
    BTreeMap<String, (String, u64)>,
) {
    let mut live = BTreeMap::new();
    let mut by_name = BTreeMap::new();
    for watch in layout.watches() {
        let api = crate::workload::api(client, &watch);
        let mut params = ListParams::default();
        if watch.resource == "configmaps" && watch.namespace == layout.selected {
            params = params.labels(&format!("{SELECT_LABEL}=in"));
        }
        let list = loop {
            match api.list(&params).await {
                Ok(l) => break l,
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        };
        let mut objects = BTreeMap::new();
        for o in list.items {
            let uid = o.metadata.uid.clone().unwrap_or_default();
            let rv: u64 = o
                .metadata
                .resource_version
                .as_deref()
                .and_then(|r| r.parse().ok())
                .unwrap_or_default();
            if watch.resource == "configmaps" && layout.plain.contains(&watch.namespace) {
                let name = o.metadata.name.clone().unwrap_or_default();
                by_name.insert(format!("{}/{name}", watch.namespace), (uid.clone(), rv));
            }
            objects.insert(uid, rv);
        }
        live.insert(watch, objects);
    }
    (live, by_name)
}
