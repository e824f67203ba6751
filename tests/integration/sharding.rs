//! Replicas sharing the watches (`sharding`), on the real API server with Kafka and NATS: fair
//! ownership, hand-offs on SIGKILL, a replica joining and SIGTERM, under continuous churn, with
//! every change delivered once per id and in order per object; and a replica paused (SIGSTOP)
//! past its Leases that, resumed, publishes and saves nothing.
//!
//! CI runs a short churn; `KEB_SHARDING_OBJECTS` (default 96) sets how many ConfigMaps the
//! churn creates for a longer local run.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudevents::AttributesReader;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::harness::{Bridge, Reader, Received, SinkKind, sink_yaml};
use crate::support::{kube_client, unique_name, unique_namespace, wait_until};

/// Short Leases keep a SIGKILL's hand-off short.
const LEASE_SECS: u64 = 4;
const WAIT: Duration = Duration::from_secs(90);

/// How many ConfigMaps the churn creates: `KEB_SHARDING_OBJECTS`, default 96.
fn objects() -> usize {
    std::env::var("KEB_SHARDING_OBJECTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96)
}

/// Namespaces to watch (one watch each), the Leases' namespace and the configuration.
struct Scene {
    client: kube::Client,
    cluster: String,
    lease_ns: String,
    prefix: String,
    namespaces: Vec<String>,
    config: String,
    sink: SinkKind,
}

impl Scene {
    async fn new(sink: SinkKind, watches: usize, extra_sink: &str) -> Scene {
        let client = kube_client().await;
        let lease_ns = unique_namespace(&client, "shard-leases").await;
        let mut namespaces = Vec::new();
        for i in 0..watches {
            namespaces.push(unique_namespace(&client, &format!("shard{i}")).await);
        }
        let cluster = unique_name("c");
        let prefix = unique_name("keb");
        let config = format!(
            "cluster: {cluster}\ncheckpoint: {{intervalMs: 200}}\nsharding: {{enabled: true, namespace: {lease_ns}, leasePrefix: {prefix}, leaseDurationSecs: {LEASE_SECS}, renewSecs: 1}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{}]}}\n{}",
            namespaces.join(", "),
            sink_yaml(sink, &cluster).replace("create: true", extra_sink)
        );
        Scene {
            client,
            cluster,
            lease_ns,
            prefix,
            namespaces,
            config,
            sink,
        }
    }

    /// Starts a replica whose identity begins with `name`.
    fn start(&self, name: &str) -> Bridge {
        Bridge::start_with_env(&self.config, &[("POD_NAME", name)])
    }

    /// The Leases of this group with `role` (`member` or `watch`); `None` when the API server
    /// did not answer.
    async fn leases(&self, role: &str) -> Option<Vec<Lease>> {
        group_leases(&self.client, &self.lease_ns, &self.prefix, role).await
    }

    /// The valid holder of every watch Lease (by its name), judged by the renew time of the
    /// holder's member Lease; `None` for a watch Lease without one. Replicas are named by the
    /// `POD_NAME` they were given. `None` when the API server did not answer (the caller reads
    /// again).
    async fn holders(&self) -> Option<BTreeMap<String, Option<String>>> {
        let members = self.leases("member").await?;
        let leases = self.leases("watch").await?;
        let holders = leases
            .into_iter()
            .map(|l| {
                let name = l.metadata.name.clone().unwrap_or_default();
                (name, valid_holder(&l, &members))
            })
            .collect();
        Some(holders)
    }

    /// Waits until every watch is held, only by `replicas`, each holding its fair share.
    async fn wait_fair(&self, replicas: &[&str]) -> BTreeMap<String, String> {
        let w = self.namespaces.len();
        let (low, high) = (w / replicas.len(), w.div_ceil(replicas.len()));
        wait_until(
            &format!("{w} watches held by {replicas:?}, {low} or {high} each"),
            WAIT,
            || async {
                let holders = self.holders().await?;
                let held: BTreeMap<String, String> = holders
                    .into_iter()
                    .filter_map(|(l, h)| Some((l, h?)))
                    .collect();
                let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
                for h in held.values() {
                    *counts.entry(h.as_str()).or_default() += 1;
                }
                let fair = held.len() == w
                    && counts.keys().all(|h| replicas.contains(h))
                    && replicas.iter().all(|r| {
                        let n = counts.get(r).copied().unwrap_or(0);
                        n == low || n == high
                    });
                fair.then_some(held)
            },
        )
        .await
    }
}

/// The Leases with `role` (`member` or `watch`) in `namespace` whose names begin with
/// `prefix`; `None` when the API server did not answer (the caller reads again).
pub(crate) async fn group_leases(
    client: &kube::Client,
    namespace: &str,
    prefix: &str,
    role: &str,
) -> Option<Vec<Lease>> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().labels(&format!("kube-event-bridge/shard-role={role}"));
    let leases = api
        .list(&params)
        .await
        .inspect_err(|e| eprintln!("cannot list the leases, reading again: {e}"))
        .ok()?;
    let ours = |l: &Lease| {
        l.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with(prefix))
    };
    Some(leases.items.into_iter().filter(ours).collect())
}

/// The holder of the watch Lease `lease` while it is valid (its holder's member Lease among
/// `members` renewed within its duration, by the wall clock), named by the replica's `POD_NAME`
/// (the identity without its `-pid`).
pub(crate) fn valid_holder(lease: &Lease, members: &[Lease]) -> Option<String> {
    let spec = lease.spec.as_ref()?;
    let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty())?;
    let member = members
        .iter()
        .find(|m| m.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(holder))?;
    let spec = member.spec.as_ref()?;
    let renewed = spec.renew_time.as_ref()?.0;
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(renewed);
    let valid = age.as_secs_f64() < spec.lease_duration_seconds.unwrap_or(15) as f64;
    valid.then(|| {
        holder
            .rsplit_once('-')
            .map_or(holder, |(n, _)| n)
            .to_string()
    })
}

/// Every resourceVersion the churn wrote per object uid, and the uids it deleted.
#[derive(Debug, Default)]
struct Ledger {
    writes: BTreeMap<String, Vec<u64>>,
    deleted: BTreeSet<String>,
}

/// Creates `objects` ConfigMaps over `namespaces`, updating and deleting some, until `stop` is
/// cancelled (and at least every object was created).
async fn churn(
    client: kube::Client,
    namespaces: Vec<String>,
    objects: usize,
    ledger: Arc<Mutex<Ledger>>,
    stop: CancellationToken,
) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::from_os_rng();
    let mut alive: Vec<(String, String, String)> = Vec::new();
    let mut created = 0;
    let mut op = 0;
    while created < objects || !stop.is_cancelled() {
        let roll: f64 = rng.random();
        if created < objects && (alive.is_empty() || roll < 0.4) {
            let ns = namespaces[created % namespaces.len()].clone();
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
            let name = format!("o{created:04}");
            let cm: ConfigMap =
                serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": "0"}}))
                    .unwrap();
            let made = cms.create(&PostParams::default(), &cm).await.unwrap();
            let uid = made.metadata.uid.clone().unwrap();
            record(&ledger, &uid, &made);
            alive.push((ns, name, uid));
            created += 1;
        } else if !alive.is_empty() {
            let i = rng.random_range(0..alive.len());
            let (ns, name, uid) = alive[i].clone();
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
            if roll < 0.93 {
                let patch = Patch::Merge(json!({"data": {"v": op.to_string()}}));
                let patched = cms
                    .patch(&name, &PatchParams::default(), &patch)
                    .await
                    .unwrap();
                record(&ledger, &uid, &patched);
            } else {
                cms.delete(&name, &DeleteParams::default()).await.unwrap();
                ledger.lock().unwrap().deleted.insert(uid);
                alive.swap_remove(i);
            }
        }
        op += 1;
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..25))).await;
    }
}

fn record(ledger: &Mutex<Ledger>, uid: &str, cm: &ConfigMap) {
    let rv = cm
        .metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    ledger
        .lock()
        .unwrap()
        .writes
        .entry(uid.to_string())
        .or_default()
        .push(rv);
}

/// Reads until every object's final state arrived (its last write, or its delete), then what
/// follows within a few seconds.
async fn read_final_state(reader: &mut Reader, ledger: &Ledger) -> Vec<Received> {
    let mut all = reader
        .read_until(Duration::from_secs(180), |got| {
            let mut latest: BTreeMap<String, (u64, String)> = BTreeMap::new();
            for r in got {
                let e = latest.entry(r.ext("uid")).or_default();
                if r.rv() >= e.0 {
                    *e = (r.rv(), r.change().to_string());
                }
            }
            ledger.writes.iter().all(|(uid, writes)| {
                latest.get(uid).is_some_and(|(rv, change)| {
                    if ledger.deleted.contains(uid) {
                        change == "deleted"
                    } else {
                        rv >= writes.last().unwrap()
                    }
                })
            })
        })
        .await;
    all.extend(reader.drain(Duration::from_secs(3)).await);
    all
}

/// Every written (uid, resourceVersion) arrived, none under two ids, in order per object;
/// returns (events expected, distinct delivered, copies of an id seen more than once).
fn verify(events: &[Received], ledger: &Ledger) -> (usize, usize, usize) {
    let mut ids = BTreeSet::new();
    let mut ids_of: BTreeMap<(String, u64), BTreeSet<String>> = BTreeMap::new();
    let mut per_object: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut copies = 0;
    for r in events {
        let id = r.event.id().to_string();
        ids_of
            .entry((r.ext("uid"), r.rv()))
            .or_default()
            .insert(id.clone());
        if !ids.insert(id) {
            copies += 1;
            continue;
        }
        if r.change() != "deleted" {
            per_object.entry(r.ext("uid")).or_default().push(r.rv());
        }
    }
    for (key, ids) in &ids_of {
        assert_eq!(ids.len(), 1, "{key:?} arrived under several ids: {ids:?}");
    }
    let mut expected = 0;
    for (uid, writes) in &ledger.writes {
        let seen = per_object.get(uid).cloned().unwrap_or_default();
        assert!(
            seen.windows(2).all(|w| w[0] < w[1]),
            "{uid}: out of order: {seen:?}"
        );
        for w in writes {
            expected += 1;
            assert!(
                seen.contains(w),
                "{uid}: rv {w} never arrived (saw {seen:?})"
            );
        }
    }
    (expected, ids.len(), copies)
}

/// Samples the watch Leases every 100 ms until `stop`: returns the samples taken and how many
/// showed a watch without a valid holder. Each sample must show every watch held by at most one
/// replica, and only by a replica in `allowed` (the replicas that may hold Leases at that time,
/// kept current by the scenario).
async fn sample_leases(
    scene: Arc<Scene>,
    allowed: Arc<Mutex<BTreeSet<String>>>,
    stop: CancellationToken,
) -> (usize, usize) {
    let (mut samples, mut unowned) = (0, 0);
    while !stop.is_cancelled() {
        // A replica allowed when the listing was asked for may still show in it.
        let before = allowed.lock().unwrap().clone();
        if let Some(holders) = scene.holders().await {
            let mut allowed = allowed.lock().unwrap().clone();
            allowed.extend(before);
            for (lease, holder) in &holders {
                match holder {
                    Some(h) => assert!(
                        allowed.contains(h),
                        "watch lease {lease} held by {h}, which may not hold any (allowed: {allowed:?})"
                    ),
                    None => unowned += 1,
                }
            }
            samples += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (samples, unowned)
}

/// The `unowned_ms` of every "watch claimed" line `bridge` logged from its `skip`-th on.
fn claims(bridge: &Bridge, skip: usize) -> Vec<u64> {
    bridge
        .log_text()
        .lines()
        .filter(|l| l.contains("\"message\":\"watch claimed\""))
        .skip(skip)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["unowned_ms"].as_u64())
        .collect()
}

fn spread(mut ms: Vec<u64>) -> String {
    ms.sort_unstable();
    match (ms.first(), ms.get(ms.len() / 2), ms.last()) {
        (Some(min), Some(median), Some(max)) => {
            format!(
                "min {min} ms, median {median} ms, max {max} ms over {}",
                ms.len()
            )
        }
        _ => "none".into(),
    }
}

/// Three replicas share twelve watches under churn; one is killed, a fourth joins, two are
/// stopped with SIGTERM. Ownership stays fair and single; the consumer gets every change.
async fn share_and_hand_off(sink: SinkKind) {
    let scene = Arc::new(Scene::new(sink, 12, "create: true").await);
    let allowed: Arc<Mutex<BTreeSet<String>>> = Arc::new(Mutex::new(
        ["r0", "r1", "r2", "r3"].map(String::from).into(),
    ));
    let mut r0 = scene.start("r0");
    let r1 = scene.start("r1");
    let r2 = scene.start("r2");
    scene.wait_fair(&["r0", "r1", "r2"]).await;
    // Every watch has published its initial state (and saved its first checkpoint) before the
    // churn starts: a watch without a checkpoint that changes hands starts with a LIST.
    wait_until("the twelve watches synced", WAIT, || async {
        let synced: usize = [&r0, &r1, &r2]
            .iter()
            .map(|b| b.count_log("initial state published"))
            .sum();
        (synced >= 12).then_some(())
    })
    .await;

    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = CancellationToken::new();
    let work = tokio::spawn(churn(
        scene.client.clone(),
        scene.namespaces.clone(),
        objects(),
        ledger.clone(),
        stop.clone(),
    ));
    let sampling = tokio::spawn(sample_leases(scene.clone(), allowed.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_secs(2)).await;

    // SIGKILL: r0's watches wait for its Leases to expire, then go to r1 and r2.
    let (before_r1, before_r2) = (claims(&r1, 0).len(), claims(&r2, 0).len());
    r0.signal("KILL");
    r0.wait_exit(Duration::from_secs(10)).await.expect("killed");
    scene.wait_fair(&["r1", "r2"]).await;
    allowed.lock().unwrap().remove("r0");
    let mut after_kill = claims(&r1, before_r1);
    after_kill.extend(claims(&r2, before_r2));

    // A fourth replica joins: it takes its share from r1 and r2, handed over in order.
    let r3 = scene.start("r3");
    scene.wait_fair(&["r1", "r2", "r3"]).await;
    let before_r3 = claims(&r3, 0).len();

    // SIGTERM two: they drain, save and release; r3 takes every watch.
    let (mut r1, mut r2) = (r1, r2);
    r1.signal("TERM");
    r2.signal("TERM");
    for r in [&mut r1, &mut r2] {
        let status = r
            .wait_exit(WAIT)
            .await
            .expect("a replica stopped with SIGTERM exits");
        assert!(
            status.success(),
            "SIGTERM drains and exits cleanly: {status}"
        );
    }
    allowed.lock().unwrap().retain(|r| r == "r3");
    scene.wait_fair(&["r3"]).await;
    let after_term = claims(&r3, before_r3);
    // The killed replica could not delete its member Lease: a live one does, three lease
    // durations after its last renewal.
    wait_until(
        "the killed replica's member lease is deleted",
        WAIT,
        || async {
            let members = scene.leases("member").await?;
            let left = members.iter().any(|l| {
                let holder = l.spec.as_ref().and_then(|s| s.holder_identity.as_deref());
                holder.is_some_and(|h| h.starts_with("r0-"))
            });
            (!left).then_some(())
        },
    )
    .await;

    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    work.await.unwrap();
    let (samples, unowned) = sampling.await.unwrap();
    let topics = vec![format!("k8s.{}.core.configmaps", scene.cluster)];
    let mut reader = Reader::for_sink(sink, &scene.cluster, &topics, &r3).await;
    let ledger = Arc::try_unwrap(ledger).unwrap().into_inner().unwrap();
    let events = read_final_state(&mut reader, &ledger).await;
    let (expected, delivered, copies) = verify(&events, &ledger);
    eprintln!(
        "sharding {sink:?}: {} objects, {expected} changes, {delivered} delivered, {copies} copies of an id; {samples} lease samples, {unowned} watch-samples without owner; time without owner after SIGKILL: {}; after SIGTERM: {}",
        ledger.writes.len(),
        spread(after_kill),
        spread(after_term),
    );
    drop(r3);
}

/// Three replicas started together each claim a fair share from the start: no watch is listed
/// by one replica and then given away at the first rebalance.
#[tokio::test(flavor = "multi_thread")]
async fn replicas_started_together_claim_fair_shares_at_once() {
    let scene = Scene::new(SinkKind::Nats, 9, "create: true").await;
    let bridges: Vec<Bridge> = ["r0", "r1", "r2"].iter().map(|n| scene.start(n)).collect();
    scene.wait_fair(&["r0", "r1", "r2"]).await;
    // Time for a rebalance to show, were any due.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let given_up: usize = bridges
        .iter()
        .map(|b| b.count_log("giving the watch up: draining it, then releasing its lease"))
        .sum();
    let listed: usize = bridges
        .iter()
        .map(|b| b.count_log("initial state published"))
        .sum();
    assert_eq!(given_up, 0, "no watch changes hands after a start together");
    assert_eq!(listed, 9, "each watch lists once");
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_replicas_share_the_watches_and_hand_them_off() {
    share_and_hand_off(SinkKind::Kafka).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_replicas_share_the_watches_and_hand_them_off() {
    share_and_hand_off(SinkKind::Nats).await;
}

/// Patches every ConfigMap `o{i}` of `namespaces` (2 each), returning the resourceVersions
/// written.
async fn patch_all(client: &kube::Client, namespaces: &[String], value: &str) -> Vec<u64> {
    let mut rvs = Vec::new();
    for ns in namespaces {
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        for i in 0..2 {
            let patch = Patch::Merge(json!({"data": {"v": value}}));
            let cm = cms
                .patch(&format!("o{i}"), &PatchParams::default(), &patch)
                .await
                .unwrap();
            rvs.push(cm.metadata.resource_version.unwrap().parse().unwrap());
        }
    }
    rvs
}

/// Reads until events of every resourceVersion in `rvs` arrived.
async fn read_rvs(reader: &mut Reader, rvs: &[u64]) -> Vec<Received> {
    let want: BTreeSet<u64> = rvs.iter().copied().collect();
    reader
        .read_until(WAIT, |got| {
            let seen: BTreeSet<u64> = got.iter().map(Received::rv).collect();
            want.is_subset(&seen)
        })
        .await
}

/// A replica paused past its Leases while changes wait in its watch connections: another
/// replica takes its watches over; resumed, it publishes none of them (no id arrives twice) and
/// saves no checkpoint (it is never fenced by the store, because it never tries).
async fn paused_replica_is_fenced(sink: SinkKind) {
    // A one-second duplicate window: a copy published later is stored, not dropped.
    let scene = Scene::new(sink, 2, "create: true, duplicateWindowSecs: 1").await;
    for ns in &scene.namespaces {
        let cms: Api<ConfigMap> = Api::namespaced(scene.client.clone(), ns);
        for i in 0..2 {
            let cm: ConfigMap =
                serde_json::from_value(json!({"metadata": {"name": format!("o{i}")}})).unwrap();
            cms.create(&PostParams::default(), &cm).await.unwrap();
        }
    }
    let mut a = scene.start("a");
    a.wait_synced(2).await;
    scene.wait_fair(&["a"]).await;
    let topics = vec![format!("k8s.{}.core.configmaps", scene.cluster)];
    let mut reader = Reader::for_sink(scene.sink, &scene.cluster, &topics, &a).await;
    let mut events = reader.read_until(WAIT, |got| got.len() >= 4).await;

    a.signal("STOP");
    let written = patch_all(&scene.client, &scene.namespaces, "while-paused").await;
    let b = scene.start("b");
    scene.wait_fair(&["b"]).await;
    events.extend(read_rvs(&mut reader, &written).await);
    // Outlast the stream's duplicate window before resuming the paused replica.
    tokio::time::sleep(Duration::from_secs(2)).await;

    a.signal("CONT");
    wait_until(
        "the resumed replica gives both watches up",
        WAIT,
        || async {
            (a.count_log("watch no longer desired or owned here: stopping it")
                + a.count_log("watch lost to another replica: stopping it")
                >= 2)
                .then_some(())
        },
    )
    .await;
    let after = patch_all(&scene.client, &scene.namespaces, "after-resume").await;
    events.extend(read_rvs(&mut reader, &after).await);
    events.extend(reader.drain(Duration::from_secs(3)).await);

    let mut ids = BTreeMap::<String, usize>::new();
    for e in &events {
        *ids.entry(e.event.id().to_string()).or_default() += 1;
    }
    let twice: Vec<_> = ids.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "the resumed replica published again: {twice:?}"
    );
    for message in [
        "fenced: another instance owns this watch now",
        "producer fenced or broken: stopping this watch",
    ] {
        assert_eq!(
            a.count_log(message),
            0,
            "the resumed replica tried to publish or save: it logged {message:?}"
        );
    }
    assert_eq!(
        b.count_log("fenced: another instance owns this watch now"),
        0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_paused_replica_publishes_and_saves_nothing_after_its_leases_expired() {
    paused_replica_is_fenced(SinkKind::Kafka).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_paused_replica_publishes_and_saves_nothing_after_its_leases_expired() {
    paused_replica_is_fenced(SinkKind::Nats).await;
}
