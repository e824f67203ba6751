//! The consumer library against the real bridge, API server and brokers: after churn and
//! bridge restarts (SIGTERM, SIGKILL), its store equals a LIST from the API server; a new store
//! reading from the beginning rebuilds the same state (Kafka: from a compacted topic with
//! tombstones); structured content mode and truncated events; a fleet's objects of one name in
//! two clusters.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_event_bridge_consumer::{Body, MissingBody, ObjectKey};
use serde_json::json;

use crate::harness::{Bridge, SinkKind, sink_yaml};
use crate::store_check::{
    LiveStore, assert_new_store_rebuilds, churn, compacted_topic, wait_store_equals_list,
};
use crate::support::{ExtraCluster, env, kube_client, unique_name, unique_namespace, wait_until};

/// How long a store may take to reflect what the API server holds.
const CONVERGE: Duration = Duration::from_secs(120);

/// The bridge's configuration and the topics a store reads. Kafka: the resource's own
/// compacted topic, keyed by `namespace/name`, with tombstones.
async fn setup(sink: SinkKind, cluster: &str, ns: &str) -> (String, Vec<String>) {
    let (extra, topics) = match sink {
        SinkKind::Kafka => {
            let topic = format!("state.{cluster}.configmaps");
            compacted_topic(&topic, 3).await;
            (
                ", topic: \"state.{cluster}.{resource}\", key: namespacedName, tombstones: true",
                vec![topic],
            )
        }
        _ => ("", Vec::new()),
    };
    let config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]{extra}}}\n{}",
        sink_yaml(sink, cluster)
    );
    (config, topics)
}

async fn churn_and_restarts(sink: SinkKind) {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "consumer").await;
    let cluster = unique_name("c");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for i in 0..4 {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("pre-{i}")}})).unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let (config, topics) = setup(sink, &cluster, &ns).await;
    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(1).await;
    let live = LiveStore::open(sink, &cluster, &topics).await;
    live.wait_ready(CONVERGE).await;
    churn(&cms, "r1").await;
    wait_store_equals_list(&live, &client, &ns, CONVERGE).await;

    // A graceful restart, with churn while the bridge is down.
    bridge.signal("TERM");
    let status = bridge.wait_exit(Duration::from_secs(30)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "SIGTERM: {status:?}\n{}",
        bridge.log_text()
    );
    churn(&cms, "r2").await;
    // A restart resumes from the checkpoint: no LIST, no "initial state published".
    let mut bridge = Bridge::start(&config);
    wait_store_equals_list(&live, &client, &ns, CONVERGE).await;

    // SIGKILL in the middle of churn: the restart aborts (Kafka) or republishes (NATS) what
    // followed the last checkpoint, with the same ids.
    let background = {
        let cms = cms.clone();
        tokio::spawn(async move { churn(&cms, "r3").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    bridge.signal("KILL");
    assert!(bridge.wait_exit(Duration::from_secs(30)).await.is_some());
    drop(bridge);
    let mut bridge = Bridge::start(&config);
    background.await.unwrap();
    churn(&cms, "r4").await;
    let state = wait_store_equals_list(&live, &client, &ns, CONVERGE).await;
    live.assert_no_errors();
    assert_eq!(
        state.len(),
        4 + 4 * 4,
        "4 objects before, 4 left by each round of churn"
    );
    assert!(live.count("caught up") == 1, "caught up once");

    // A new store from the beginning rebuilds the state on its own: once it reports that it
    // caught up, it holds exactly what the LIST gives (nothing changes any more).
    bridge.signal("TERM");
    assert!(bridge.wait_exit(Duration::from_secs(30)).await.is_some());
    let fresh = assert_new_store_rebuilds(sink, &cluster, &topics, &ns, &state, CONVERGE).await;
    eprintln!(
        "{sink:?}: live store changes {:?}; new store changes {:?}",
        live.counts.lock().unwrap(),
        fresh.counts.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_store_equals_the_list_after_churn_and_restarts_and_a_new_store_rebuilds_it() {
    churn_and_restarts(SinkKind::Kafka).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_store_equals_the_list_after_churn_and_restarts_and_a_new_store_rebuilds_it() {
    churn_and_restarts(SinkKind::Nats).await;
}

/// Structured content mode (the whole event as the body) fills the store as binary mode does.
async fn structured_mode(sink: SinkKind) {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "consumer-structured").await;
    let cluster = unique_name("c");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let (config, topics) = setup(sink, &cluster, &ns).await;
    let config = format!("{config}    contentMode: structured\n");
    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(1).await;
    let live = LiveStore::open(sink, &cluster, &topics).await;
    churn(&cms, "s").await;
    let state = wait_store_equals_list(&live, &client, &ns, CONVERGE).await;
    assert_eq!(state.len(), 4, "4 objects left by a round of churn");
    live.assert_no_errors();
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_structured_mode_fills_the_store() {
    structured_mode(SinkKind::Kafka).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_structured_mode_fills_the_store() {
    structured_mode(SinkKind::Nats).await;
}

/// An object too large for the broker arrives as a truncated reference: the store holds its
/// identity and resourceVersion with the body flagged missing, until a full event restores it.
async fn truncated_body(sink: SinkKind) {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "consumer-big").await;
    let cluster = unique_name("c");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let (config, topics) = setup(sink, &cluster, &ns).await;
    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(1).await;
    let live = LiveStore::open(sink, &cluster, &topics).await;
    // About 1 MB: over librdkafka's message.max.bytes and the test NATS server's max_payload.
    let big: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "big"}, "data": {"blob": "x".repeat(1_000_000)}}),
    )
    .unwrap();
    let created = cms.create(&PostParams::default(), &big).await.unwrap();
    let rv = created.metadata.resource_version.unwrap();
    let key = ObjectKey::namespaced(&cluster, "configmaps", &ns, "big");
    let body = wait_until(
        "the store holds the truncated object at its resourceVersion",
        CONVERGE,
        || async {
            let object = live.store.get(&key)?;
            (object.resource_version == rv).then(|| object.body.clone())
        },
    )
    .await;
    assert_eq!(
        body,
        Body::Missing {
            reason: MissingBody::Truncated,
            last_full: None
        }
    );
    cms.patch(
        "big",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"blob": "small"}})),
    )
    .await
    .unwrap();
    wait_store_equals_list(&live, &client, &ns, CONVERGE).await;
    live.assert_no_errors();
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_truncated_event_flags_the_body_until_a_full_one() {
    truncated_body(SinkKind::Kafka).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_truncated_event_flags_the_body_until_a_full_one() {
    truncated_body(SinkKind::Nats).await;
}

/// Under `read_committed` the end of a partition is its last stable offset, which stops before
/// a transaction another producer left open: records committed after it are not readable yet.
/// The consumer crate reports caught up only once it has read past the end the partition had
/// when it started, so its store never claims completeness while committed records wait.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_caught_up_waits_for_records_behind_another_producers_open_transaction() {
    use futures::StreamExt;
    use kube_event_bridge_consumer::Input;
    use kube_event_bridge_consumer::kafka::Subscription;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    let topic = unique_name("caughtup");
    crate::support::create_topic(&topic, 1).await;
    let transactional = |id: String| -> BaseProducer {
        let producer: BaseProducer = crate::support::kafka_config()
            .set("transactional.id", id)
            .create()
            .unwrap();
        producer.init_transactions(Duration::from_secs(30)).unwrap();
        producer.begin_transaction().unwrap();
        producer
    };
    // A opens a transaction and leaves it open; B commits a record after it.
    let open = transactional(unique_name("open"));
    let tombstone = |key: &'static str| BaseRecord::<str, [u8]>::to(&topic).key(key);
    open.send(tombstone("ns/a")).map_err(|(e, _)| e).unwrap();
    open.flush(Duration::from_secs(10)).unwrap();
    let committed = transactional(unique_name("committed"));
    committed
        .send(tombstone("ns/b"))
        .map_err(|(e, _)| e)
        .unwrap();
    committed
        .commit_transaction(Duration::from_secs(10))
        .unwrap();

    let mut inputs = Box::pin(
        Subscription::new(crate::support::kafka_config(), [topic.clone()])
            .start()
            .await
            .unwrap(),
    );
    let early = tokio::time::timeout(Duration::from_secs(5), inputs.next()).await;
    assert!(
        early.is_err(),
        "nothing is readable and nothing caught up while the transaction is open: {early:?}"
    );
    open.commit_transaction(Duration::from_secs(10)).unwrap();
    let mut keys = Vec::new();
    loop {
        let input = tokio::time::timeout(Duration::from_secs(30), inputs.next())
            .await
            .expect("caught up once the transaction ended")
            .expect("the stream goes on")
            .unwrap();
        match input {
            Input::Timestamped(kube_event_bridge_consumer::Record::Tombstone { key, .. }, _) => {
                keys.push(key)
            }
            Input::CaughtUp => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(keys, ["ns/a", "ns/b"], "caught up only after both records");
}

/// A fleet's stream read by one store: the same namespace and name in two clusters are two
/// objects, and a delete in one cluster leaves the other's.
#[tokio::test(flavor = "multi_thread")]
async fn nats_store_of_a_fleet_keeps_two_clusters_objects_of_one_name_apart() {
    let hub_client = kube_client().await;
    let east = ExtraCluster::add("consumer-east").await;
    let east_client = east.client().await;
    let ns = unique_namespace(&hub_client, "consumer-fleet").await;
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": ns}})).expect("a Namespace");
    Api::<Namespace>::all(east_client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap_or_else(|e| panic!("cannot create namespace {ns} in {}: {e}", east.name));
    let (hub, east_name) = (unique_name("hub"), unique_name("east"));
    for (client, at) in [(&hub_client, &hub), (&east_client, &east_name)] {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "same"}, "data": {"at": at}}))
                .unwrap();
        Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &cm)
            .await
            .unwrap_or_else(|e| panic!("cannot create configmap {ns}/same in {at}: {e}"));
    }
    let config = format!(
        "cluster: {hub}\nkubernetes: {{kubeconfig: {}}}\nclusters:\n- {{name: {hub}}}\n- {{name: {east_name}, kubeconfig: {}}}\n\
         resources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}",
        env().kubeconfig,
        east.kubeconfig.display(),
        sink_yaml(SinkKind::Nats, &hub)
    );
    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(2).await;
    let live = LiveStore::nats(&hub).await;
    let at = |cluster: &str| {
        live.store
            .cluster(cluster)
            .get("configmaps", Some(&ns), "same")
            .and_then(|o| o.body.full()?["data"]["at"].as_str().map(String::from))
    };
    wait_until("the store holds both clusters' ConfigMap", CONVERGE, || {
        let both = at(&hub).is_some() && at(&east_name).is_some();
        async move { both.then_some(()) }
    })
    .await;
    assert_eq!(at(&hub).as_deref(), Some(hub.as_str()));
    assert_eq!(at(&east_name).as_deref(), Some(east_name.as_str()));
    let mut clusters = vec![hub.clone(), east_name.clone()];
    clusters.sort();
    assert_eq!(live.store.clusters(), clusters);
    let key = ObjectKey::namespaced(&east_name, "configmaps", &ns, "same");
    assert_eq!(live.store.get(&key).unwrap().key.cluster, east_name);

    Api::<ConfigMap>::namespaced(east_client.clone(), &ns)
        .delete("same", &Default::default())
        .await
        .expect("delete east's ConfigMap");
    wait_until("east's ConfigMap leaves the store", CONVERGE, || {
        let gone = at(&east_name).is_none();
        async move { gone.then_some(()) }
    })
    .await;
    assert_eq!(at(&hub).as_deref(), Some(hub.as_str()), "the hub's stays");
    live.assert_no_errors();
}
