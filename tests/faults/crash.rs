//! The bridge killed with SIGKILL at random points many times while a workload of creates,
//! updates and deletes runs; a consumer (read committed for Kafka) deduplicating by event id must
//! see every change exactly once, in order per object.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cloudevents::AttributesReader;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::{Bridge, Reader, Received, SinkKind, checkpoint_extra, sink_yaml};
use crate::support::{kube_client, unique_name, unique_namespace};

/// What the workload did: every resourceVersion the API server returned per object name, and
/// whether the object was finally deleted.
#[derive(Debug, Default)]
struct Ledger {
    writes: BTreeMap<String, Vec<u64>>,
    deleted: BTreeSet<String>,
}

/// Creates `objects` ConfigMaps, updates each a few times and deletes a third, in random order,
/// until done.
async fn workload(client: kube::Client, ns: String, objects: usize, ledger: Arc<Mutex<Ledger>>) {
    let cms: Api<ConfigMap> = Api::namespaced(client, &ns);
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::from_os_rng();
    let mut alive: Vec<String> = Vec::new();
    let mut created = 0;
    let mut ops = 0;
    while created < objects || !alive.is_empty() {
        let roll: f64 = rng.random();
        if created < objects && (alive.is_empty() || roll < 0.4) {
            let name = format!("o{created:04}");
            let cm: ConfigMap =
                serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": "0"}}))
                    .unwrap();
            let made = cms.create(&PostParams::default(), &cm).await.unwrap();
            ledger
                .lock()
                .unwrap()
                .writes
                .entry(name.clone())
                .or_default()
                .push(rv(&made));
            alive.push(name);
            created += 1;
        } else {
            let i = rng.random_range(0..alive.len());
            let name = alive[i].clone();
            if roll < 0.85 || created < objects && roll < 0.9 {
                let patched = cms
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"data": {"v": ops.to_string()}})),
                    )
                    .await
                    .unwrap();
                ledger
                    .lock()
                    .unwrap()
                    .writes
                    .entry(name)
                    .or_default()
                    .push(rv(&patched));
            } else if rng.random_bool(0.33) {
                cms.delete(&name, &DeleteParams::default()).await.unwrap();
                ledger.lock().unwrap().deleted.insert(name);
                alive.swap_remove(i);
            } else {
                // Retire it alive: it keeps its last state.
                alive.swap_remove(i);
            }
        }
        ops += 1;
        tokio::time::sleep(Duration::from_millis(rng.random_range(2..12))).await;
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

/// Reads until every object's final state (its last write, or its delete) has arrived, plus
/// whatever follows within a few seconds.
async fn read_final_state(reader: &mut Reader, ledger: &Ledger) -> Vec<Received> {
    let last_rvs: BTreeMap<String, u64> = ledger
        .writes
        .iter()
        .map(|(n, w)| (n.clone(), *w.last().unwrap()))
        .collect();
    let events = reader
        .read_until(Duration::from_secs(120), |got| {
            let mut latest: BTreeMap<String, (u64, String)> = BTreeMap::new();
            for r in got {
                let e = latest.entry(r.ext("name")).or_insert((0, String::new()));
                if r.rv() >= e.0 {
                    *e = (r.rv(), r.change().to_string());
                }
            }
            last_rvs.iter().all(|(name, rv)| {
                latest.get(name).is_some_and(|(seen, change)| {
                    if ledger.deleted.contains(name) {
                        change == "deleted"
                    } else {
                        seen >= rv
                    }
                })
            })
        })
        .await;
    let mut all = events;
    all.extend(reader.drain(Duration::from_secs(3)).await);
    all
}

/// The figures of one run.
struct Report {
    expected: usize,
    delivered: usize,
    duplicates: usize,
    gaps: usize,
    /// Of the gaps, those followed by a repaired event of the same object.
    gaps_repaired: usize,
}

/// How many times `bridge` listed again after it had started from a checkpoint: history lost
/// (410), a resourceVersion ahead of the API server, or a checkpoint it could not decode.
fn relisted(bridge: &Bridge) -> usize {
    bridge.count_log("watch history lost, relisting")
        + bridge.count_log(
            "resourceVersion is ahead of the API server (etcd restored from a backup?), relisting",
        )
        + bridge.log_text().matches("is corrupt").count()
}

/// Checks what a consumer saw against the ledger. After a relist (`relisted`), a repaired event
/// describes an object the bridge's index did not know as `added` at its current version, which
/// may already have arrived as `modified`: a (uid, resourceVersion) may then carry two ids, one
/// of them repaired.
fn verify(events: &[Received], ledger: &Ledger, relisted: bool) -> Report {
    let mut by_id = BTreeSet::new();
    let mut duplicates = 0;
    let mut per_object: BTreeMap<String, Vec<&Received>> = BTreeMap::new();
    let mut ids_of: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for r in events {
        ids_of
            .entry((r.ext("uid"), r.ext("resourceversion")))
            .or_default()
            .insert(r.event.id().to_string());
        if !by_id.insert(r.event.id().to_string()) {
            duplicates += 1;
            continue;
        }
        per_object.entry(r.ext("name")).or_default().push(r);
    }
    for ((uid, rv), ids) in &ids_of {
        let repaired = events.iter().any(|r| {
            r.ext("uid") == *uid && r.ext("resourceversion") == *rv && r.ext("origin") == "repaired"
        });
        if ids.len() == 1 || (relisted && repaired && ids.len() == 2) {
            continue;
        }
        let history: Vec<String> = events
            .iter()
            .filter(|r| r.ext("uid") == *uid)
            .map(|r| format!("{} origin={}", r.event.id(), r.ext("origin")))
            .collect();
        panic!(
            "({uid}, {rv}) appears under several ids: {ids:?} (relisted: {relisted}, repaired: {repaired}); every event of the object, in arrival order: {history:#?}"
        );
    }
    let mut gaps = 0;
    let mut gaps_repaired = 0;
    let mut expected = 0;
    for (name, writes) in &ledger.writes {
        let seen = per_object.get(name).cloned().unwrap_or_default();
        let rvs: Vec<u64> = seen.iter().map(|r| r.rv()).collect();
        assert!(
            rvs.windows(2).all(|w| w[0] < w[1]),
            "{name}: resourceVersions go backwards: {rvs:?}"
        );
        for w in writes {
            expected += 1;
            if !rvs.contains(w) {
                gaps += 1;
                // Repaired: a later event of the object came from a relist.
                let repaired = seen
                    .iter()
                    .any(|r| r.rv() > *w && r.ext("origin") == "repaired");
                if repaired {
                    gaps_repaired += 1;
                }
                eprintln!(
                    "gap: {name} rv {w} never arrived (saw {rvs:?}; repaired later: {repaired})"
                );
            }
        }
        let last = seen
            .last()
            .unwrap_or_else(|| panic!("{name}: no event at all"));
        if ledger.deleted.contains(name) {
            expected += 1;
            assert_eq!(
                last.change(),
                "deleted",
                "{name}: the last event must be its delete"
            );
        } else {
            assert_eq!(
                Some(&last.rv()),
                writes.last(),
                "{name}: the last event must match the final state"
            );
        }
    }
    Report {
        expected,
        delivered: by_id.len(),
        duplicates,
        gaps,
        gaps_repaired,
    }
}

/// Runs the workload while the bridge is killed `kills` times, then checks what a consumer saw.
pub async fn crash_loop(sink: SinkKind, objects: usize, kills: usize) {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "crash").await;
    let cluster = unique_name("c");
    let config = format!(
        "cluster: {cluster}\ncheckpoint: {{intervalMs: 200{}}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}",
        checkpoint_extra(sink, &cluster),
        sink_yaml(sink, &cluster)
    );
    let topics = vec![format!("k8s.{cluster}.core.configmaps")];
    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(1).await;
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let work = tokio::spawn(workload(
        client.clone(),
        ns.clone(),
        objects,
        ledger.clone(),
    ));
    let started = Instant::now();
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::from_os_rng();
    // Relists after 410 Gone across every bridge of the loop: only they may skip versions.
    let mut relists = 0;
    for _ in 0..kills {
        tokio::time::sleep(Duration::from_millis(rng.random_range(150..900))).await;
        bridge.signal("KILL");
        bridge
            .wait_exit(Duration::from_secs(10))
            .await
            .expect("killed");
        relists += relisted(&bridge);
        bridge = Bridge::start(&config);
    }
    work.await.unwrap();
    let workload_secs = started.elapsed().as_secs_f64();
    let mut reader = Reader::for_sink(sink, &cluster, &topics, &bridge).await;
    let ledger = Arc::try_unwrap(ledger).unwrap().into_inner().unwrap();
    let all = read_final_state(&mut reader, &ledger).await;
    relists += relisted(&bridge);
    let repaired = all.iter().filter(|r| r.ext("origin") == "repaired").count();
    eprintln!(
        "crash loop {sink:?}: {} events read, {repaired} of them repaired, relists {relists}",
        all.len()
    );
    let report = verify(&all, &ledger, relists > 0);
    eprintln!(
        "crash loop {sink:?}: {kills} SIGKILLs over {workload_secs:.0}s, {} objects: events expected {}, delivered {}, duplicates before dedup {}, gaps {}, relists after 410 {relists}",
        ledger.writes.len(),
        report.expected,
        report.delivered,
        report.duplicates,
        report.gaps
    );
    if relists == 0 {
        assert_eq!(
            report.gaps, 0,
            "every change must arrive when outages stay inside the watch history"
        );
    } else {
        // The API server's watch cache is shared by every namespace: under load from other
        // workloads its history can be shorter than a restart, and a 410 relist then replaces
        // the versions it lost by the object's current state, marked repaired.
        assert_eq!(
            report.gaps, report.gaps_repaired,
            "a version may be missing only where a repaired event replaced it"
        );
    }
    drop(bridge);
    if sink == SinkKind::Http {
        let dir = std::env::temp_dir().join(format!("keb-checkpoints-{cluster}"));
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Waits until one of `bridges` logs `message`, returning its index.
async fn which_logs(bridges: &[&Bridge], message: &str, timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(i) = bridges.iter().position(|b| b.count_log(message) > 0) {
            return i;
        }
        assert!(
            Instant::now() < deadline,
            "no replica logged {message:?} within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two replicas with leader election while a workload runs: the leader is killed, then the new
/// leader is paused (SIGSTOP) past its lease and resumed. The deposed leader stops publishing and
/// exits; the consumer sees every change once after deduplication, in order per object.
pub async fn failover(sink: SinkKind, objects: usize) {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "failover").await;
    let cluster = unique_name("c");
    // The HTTP sink keeps its checkpoints in a NATS bucket every replica reaches.
    let store = match sink {
        SinkKind::Http => format!(", nats: {{url: \"{}\"}}", crate::support::env().nats_url),
        _ => String::new(),
    };
    let config = format!(
        "cluster: {cluster}\ncheckpoint: {{intervalMs: 200{store}}}\nleaderElection: {{enabled: true, namespace: {ns}, leaseDurationSecs: 4, retryPeriodSecs: 1}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}",
        sink_yaml(sink, &cluster)
    );
    let topics = vec![format!("k8s.{cluster}.core.configmaps")];
    let mut a = Bridge::start(&config);
    a.wait_synced(1).await;
    let mut b = Bridge::start(&config);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        b.count_log("leadership acquired"),
        0,
        "only one leader at a time"
    );
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let work = tokio::spawn(workload(
        client.clone(),
        ns.clone(),
        objects,
        ledger.clone(),
    ));

    // Kill the leader: the follower takes over.
    tokio::time::sleep(Duration::from_secs(2)).await;
    a.signal("KILL");
    a.wait_exit(Duration::from_secs(10)).await.expect("killed");
    let t0 = Instant::now();
    which_logs(&[&b], "leadership acquired", Duration::from_secs(30)).await;
    let takeover_after_kill = t0.elapsed();
    let a = Bridge::start(&config);

    // Pause the new leader past its lease: the other replica takes over; the paused one, resumed,
    // must stop publishing and exit.
    tokio::time::sleep(Duration::from_secs(1)).await;
    b.signal("STOP");
    let t1 = Instant::now();
    which_logs(&[&a], "leadership acquired", Duration::from_secs(30)).await;
    let takeover_after_pause = t1.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    b.signal("CONT");
    let status = b
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the deposed leader exits");
    assert!(!status.success(), "the deposed leader exits with an error");
    let _b = Bridge::start(&config);

    work.await.unwrap();
    let mut reader = Reader::for_sink(sink, &cluster, &topics, &a).await;
    let ledger = Arc::try_unwrap(ledger).unwrap().into_inner().unwrap();
    let all = read_final_state(&mut reader, &ledger).await;
    let report = verify(&all, &ledger, false);
    eprintln!(
        "failover {sink:?}: takeover {:.1}s after SIGKILL, {:.1}s after SIGSTOP; events expected {}, delivered {}, duplicates before dedup {}, gaps {}",
        takeover_after_kill.as_secs_f64(),
        takeover_after_pause.as_secs_f64(),
        report.expected,
        report.delivered,
        report.duplicates,
        report.gaps
    );
    assert_eq!(report.gaps, 0);
}
