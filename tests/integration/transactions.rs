//! Kafka watches share one transactional producer (one per sink, not one per watch), and their
//! transactions commit together with every watch's checkpoint: a `read_committed` consumer sees
//! each change of every watch exactly once across SIGKILLs, and a watch the broker refuses
//! does not hold the others back.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudevents::AttributesReader;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::admin::get;
use crate::harness::{Bridge, Reader, Received, SinkKind, sink_yaml, summary};
use crate::stalls::{kafka_acl, sample, wait_recovered};
use crate::support::{create_topic, kube_client, unique_name, unique_namespace, wait_until};

const WAIT: Duration = Duration::from_secs(180);

/// Every resourceVersion written, per uid, in order.
type Ledger = BTreeMap<String, Vec<u64>>;

/// `count` namespaces, watched by one resource entry each (so one watch each).
async fn namespaces(client: &kube::Client, count: usize) -> Vec<String> {
    let mut all = Vec::new();
    for i in 0..count {
        all.push(unique_namespace(client, &format!("tx{i}")).await);
    }
    all
}

fn resources(namespaces: &[String]) -> String {
    namespaces
        .iter()
        .map(|ns| format!("- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n"))
        .collect()
}

/// Creates `per_namespace` ConfigMaps in each namespace, then patches random ones until `stop`;
/// every write's resourceVersion goes into the ledger.
async fn churn(
    client: kube::Client,
    namespaces: Vec<String>,
    per_namespace: usize,
    ledger: Arc<Mutex<Ledger>>,
    stop: CancellationToken,
) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::from_os_rng();
    let mut objects = Vec::new();
    for i in 0..per_namespace * namespaces.len() {
        let ns = &namespaces[i % namespaces.len()];
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("o{i}")}, "data": {}}))
                .unwrap();
        let made = cms.create(&PostParams::default(), &cm).await.unwrap();
        record(&ledger, &made);
        objects.push((cms, format!("o{i}")));
    }
    let mut n = 0;
    while !stop.is_cancelled() {
        let (cms, name) = &objects[rng.random_range(0..objects.len())];
        let patch = Patch::Merge(json!({"data": {"v": n.to_string()}}));
        let patched = cms
            .patch(name, &PatchParams::default(), &patch)
            .await
            .unwrap();
        record(&ledger, &patched);
        n += 1;
        tokio::time::sleep(Duration::from_millis(rng.random_range(2..12))).await;
    }
}

fn record(ledger: &Mutex<Ledger>, cm: &ConfigMap) {
    let uid = cm.metadata.uid.clone().unwrap();
    let rv = cm.metadata.resource_version.as_deref().unwrap();
    let mut ledger = ledger.lock().unwrap();
    ledger.entry(uid).or_default().push(rv.parse().unwrap());
}

/// Reads until every written (uid, resourceVersion) arrived, then whatever follows within a few
/// seconds.
async fn read_all(reader: &mut Reader, ledger: &Ledger) -> Vec<Received> {
    let expected: usize = ledger.values().map(Vec::len).sum();
    let mut all = reader
        .read_until(WAIT, |got| {
            let seen: BTreeSet<(String, u64)> =
                got.iter().map(|r| (r.ext("uid"), r.rv())).collect();
            ledger
                .iter()
                .all(|(uid, rvs)| rvs.iter().all(|rv| seen.contains(&(uid.clone(), *rv))))
        })
        .await;
    all.extend(reader.drain(Duration::from_secs(3)).await);
    assert!(all.len() >= expected);
    all
}

/// Checks that every event arrived exactly once (by id) and in resourceVersion order per object.
fn assert_exactly_once_in_order(all: &[Received]) {
    let mut ids = BTreeMap::new();
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for r in all {
        *ids.entry(r.event.id().to_string()).or_insert(0) += 1;
        let previous = last.insert(r.ext("uid"), r.rv());
        assert!(
            previous.is_none_or(|p| p < r.rv()),
            "{}: resourceVersion {} after {previous:?}",
            r.ext("name"),
            r.rv()
        );
    }
    let repeated: Vec<_> = ids.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "a read_committed consumer saw {} ids more than once: {repeated:?}",
        repeated.len()
    );
}

async fn producers(address: &str) -> f64 {
    let metrics = get(address, "/metrics").await.1;
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("kube_event_bridge_kafka_transactional_producers ")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no producer gauge in {metrics}"))
}

/// Six watches under churn share one transactional producer; the bridge is killed three times.
/// A `read_committed` consumer receives every written (uid, resourceVersion) exactly once, in
/// order per object: no watch's events ever commit without its checkpoint.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_watches_share_one_producer_and_each_change_arrives_once_across_sigkills() {
    let client = kube_client().await;
    let namespaces = namespaces(&client, 6).await;
    let cluster = unique_name("c");
    let config = format!(
        "cluster: {cluster}\ncheckpoint: {{intervalMs: 200}}\nresources:\n{}{}",
        resources(&namespaces),
        sink_yaml(SinkKind::Kafka, &cluster)
    );
    let topic = format!("k8s.{cluster}.core.configmaps");
    create_topic(&topic, 3).await;
    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(6).await;
    assert_eq!(producers(&bridge.admin_address().await).await, 1.0);

    let ledger = Arc::new(Mutex::new(Ledger::new()));
    let stop = CancellationToken::new();
    let work = tokio::spawn(churn(
        client.clone(),
        namespaces.clone(),
        8,
        ledger.clone(),
        stop.clone(),
    ));
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::from_os_rng();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1500..3000))).await;
        bridge.signal("KILL");
        bridge
            .wait_exit(Duration::from_secs(10))
            .await
            .expect("killed");
        bridge = Bridge::start(&config);
    }
    let address = bridge.admin_address().await;
    wait_until("the last bridge is ready", WAIT, || async {
        (get(&address, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    work.await.unwrap();
    assert_eq!(producers(&address).await, 1.0);

    let ledger = ledger.lock().unwrap().clone();
    let mut reader = Reader::kafka(std::slice::from_ref(&topic)).await;
    let all = read_all(&mut reader, &ledger).await;
    let writes: usize = ledger.values().map(Vec::len).sum();
    eprintln!(
        "shared producer, 6 watches, 3 SIGKILLs: {writes} writes, {} events read",
        all.len()
    );
    assert_exactly_once_in_order(&all);
    assert_eq!(all.len(), writes, "{}", summary(&all));

    // The last bridge timed each event it published from its reading to the commit that made
    // it visible. (An event acknowledged in a transaction that was then aborted counts as
    // published twice, and is timed once, when its second sending commits.)
    wait_until(
        "every published event timed to its commit",
        WAIT,
        || async {
            let metrics = get(&address, "/metrics").await.1;
            let published = total(&metrics, "kube_event_bridge_events_published_total");
            let visible = total(&metrics, "kube_event_bridge_visible_latency_seconds_count");
            let aborted = total(&metrics, "kube_event_bridge_transactions_aborted_total");
            assert!(
                visible <= published,
                "{visible} timed, {published} published"
            );
            (published > 0.0 && (visible == published || aborted > 0.0 && visible > 0.0))
                .then_some(())
        },
    )
    .await;
}

/// The sum of a family's samples over every watch.
fn total(metrics: &str, family: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One of five watches sharing the producer publishes to a topic the broker refuses (an ACL):
/// it stalls visibly and voids the shared transaction on every attempt, and the others keep
/// publishing, exactly once; once the ACL is gone its event arrives and readiness returns.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_a_refused_watch_does_not_hold_back_the_watches_sharing_its_producer() {
    let client = kube_client().await;
    let namespaces = namespaces(&client, 4).await;
    let denied_ns = unique_namespace(&client, "txdenied").await;
    let cluster = unique_name("c");
    let topic = format!("k8s.{cluster}.core.configmaps");
    let denied_topic = format!("k8s.{cluster}.denied");
    create_topic(&topic, 3).await;
    create_topic(&denied_topic, 3).await;
    let deny = [
        "--deny-principal",
        "User:ANONYMOUS",
        "--operation",
        "Write",
        "--topic",
        denied_topic.as_str(),
    ];
    kafka_acl(&[&["--add"][..], &deny].concat());
    let config = format!(
        "cluster: {cluster}\nresources:\n{}- {{apiVersion: v1, resource: configmaps, namespaces: [{denied_ns}], topic: {denied_topic}}}\n{}",
        resources(&namespaces),
        sink_yaml(SinkKind::Kafka, &cluster)
    );
    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(5).await;
    let address = bridge.admin_address().await;
    let denied: Api<ConfigMap> = Api::namespaced(client.clone(), &denied_ns);
    let waiting: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "waiting"}, "data": {}})).unwrap();
    denied
        .create(&PostParams::default(), &waiting)
        .await
        .unwrap();
    let why = wait_until("/readyz names the refused watch", WAIT, || async {
        let (code, body) = get(&address, "/readyz").await;
        (code == 503 && body.contains("not_authorized")).then_some(body)
    })
    .await;
    assert!(why.contains(&denied_ns), "{why}");
    let metrics = get(&address, "/metrics").await.1;
    let stalled = format!("namespace=\"{denied_ns}\",reason=\"not_authorized\"");
    assert_eq!(
        sample(&metrics, "kube_event_bridge_watch_stalled", &stalled),
        Some(1.0),
        "{metrics}"
    );

    let ledger = Arc::new(Mutex::new(Ledger::new()));
    let stop = CancellationToken::new();
    let work = tokio::spawn(churn(
        client.clone(),
        namespaces.clone(),
        5,
        ledger.clone(),
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(8)).await;
    stop.cancel();
    work.await.unwrap();
    let ledger = ledger.lock().unwrap().clone();
    let mut reader = Reader::kafka(std::slice::from_ref(&topic)).await;
    let all = read_all(&mut reader, &ledger).await;
    assert_exactly_once_in_order(&all);
    let metrics = get(&address, "/metrics").await.1;
    let aborted: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("kube_event_bridge_transactions_aborted_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    eprintln!(
        "refused watch beside 4 others: {} events read, {aborted} aborted transactions",
        all.len()
    );
    assert_eq!(producers(&address).await, 1.0);

    kafka_acl(&[&["--remove", "--force"][..], &deny].concat());
    let mut denied_reader = Reader::kafka(std::slice::from_ref(&denied_topic)).await;
    let events = denied_reader
        .read_until(WAIT, |got| got.iter().any(|r| r.ext("name") == "waiting"))
        .await;
    assert_eq!(events.len(), 1, "{}", summary(&events));
    wait_recovered(&bridge, &address).await;
    wait_until("every watch synced again", WAIT, || async {
        let (code, _) = get(&address, "/readyz").await;
        (code == 200).then_some(())
    })
    .await;
}
