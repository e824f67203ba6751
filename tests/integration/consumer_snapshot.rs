//! Snapshots on demand as the consumer library reads them, against the real Kafka (three
//! partitions) and NATS JetStream. The records are what the bridge publishes, encoded by its
//! own encoders (`encode::encode`, `Event::for_snapshot`, `demand::marker`): objects before a
//! snapshot (one of them deleted in the cluster, its delete lost), the begin marker, the
//! snapshot's events and a live change it skipped, the end marker, and a live event after.
//! A store reading from the beginning removes the lost object at the end marker; a store
//! bootstrapping from the latest completed snapshot never sees what preceded the begin marker.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use kube::api::{DynamicObject, ObjectMeta, TypeMeta};
use kube::core::ApiResource;
use kube_event_bridge::change::{Change as BridgeChange, ChangeKind, Origin as BridgeOrigin};
use kube_event_bridge::checkpoint::WatchKey;
use kube_event_bridge::config::ConfigFile;
use kube_event_bridge::demand::marker::{self, Watch};
use kube_event_bridge::demand::{Outcome, Scope, Tally};
use kube_event_bridge::discovery::ResolvedResource;
use kube_event_bridge::encode::{self, ResourceInfo, STRUCTURED_CONTENT_TYPE};
use kube_event_bridge_consumer::{Change, DeleteCause, Origin, Writer};
use time::OffsetDateTime;

use crate::support::{create_topic, kafka_config, nats_client, unique_name};

/// How long a store may take to read the few records.
const READ: Duration = Duration::from_secs(60);

/// One record as published: its key, its structured body, and when (seconds before now).
struct Published {
    key: String,
    body: Vec<u8>,
    ago_secs: i64,
}

/// The resource of the records: ConfigMaps of namespace `shop` in `cluster`.
fn resource(cluster: &str) -> (Arc<ResourceInfo>, ResolvedResource) {
    let yaml = format!(
        "cluster: {cluster}\nresources: [{{apiVersion: v1, resource: configmaps, namespaces: [shop]}}]\nsink: {{kafka: {{bootstrapServers: 'x:1'}}}}\n"
    );
    let config = ConfigFile::parse(&yaml)
        .expect("a configuration")
        .validate()
        .expect("a valid configuration");
    let resolved = ResolvedResource {
        config: config.resources[0].clone(),
        api: ApiResource {
            group: String::new(),
            version: "v1".into(),
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
        },
        namespaced: true,
    };
    let info = Arc::new(ResourceInfo::new(
        cluster,
        &resolved,
        "https://127.0.0.1:6443",
    ));
    (info, resolved)
}

/// An object event of ConfigMap `shop/name`, as the bridge encodes it (of snapshot `snapshot`).
fn object(
    info: &Arc<ResourceInfo>,
    (name, uid, rv): (&str, &str, u64),
    kind: ChangeKind,
    snapshot: Option<&str>,
    ago_secs: i64,
) -> Published {
    let object = DynamicObject {
        types: Some(TypeMeta {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
        }),
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            uid: Some(uid.into()),
            resource_version: Some(rv.to_string()),
            ..ObjectMeta::default()
        },
        data: serde_json::json!({"data": {"rv": rv.to_string()}}),
    };
    let change = BridgeChange {
        kind,
        origin: BridgeOrigin::Live,
        object,
        observed: SystemTime::now(),
    };
    let mut event = encode::encode(info, change, None)
        .expect("the bridge encodes the object")
        .event;
    if let Some(id) = snapshot {
        event.for_snapshot(id.into());
    }
    Published {
        key: event.key().to_string(),
        body: event.to_structured_json(),
        ago_secs,
    }
}

/// The records of the scenario, in publishing order; `snapshot` is the snapshot's id.
fn scenario(cluster: &str, snapshot: &str) -> Vec<Published> {
    let (info, resolved) = resource(cluster);
    let key = WatchKey::for_scope(cluster, &resolved, Some("shop"));
    let watch = Watch {
        id: &key.id,
        description: &key.description,
    };
    let scope = Scope {
        id: snapshot.into(),
        request: "kube-event-bridge/snapshot-test".into(),
        resource: "v1/configmaps".into(),
        namespace: None,
        label_selector: None,
        expected: Some(3),
        prune: false,
    };
    // Keyed as the bridge keys a marker: by its own id.
    let marker_at = |ago: i64, body: Vec<u8>| Published {
        key: serde_json::from_slice::<serde_json::Value>(&body).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string(),
        body,
        ago_secs: ago,
    };
    let now = OffsetDateTime::now_utc();
    let total = Tally {
        emitted: 1,
        skipped: 1,
        pruned: 0,
    };
    vec![
        object(&info, ("a", "ua", 10), ChangeKind::Added, None, 120),
        object(&info, ("b", "ub", 11), ChangeKind::Added, None, 120),
        object(&info, ("gone", "ug", 12), ChangeKind::Added, None, 120),
        marker_at(60, marker::begin(&info, &scope, watch, now)),
        object(
            &info,
            ("a", "ua", 10),
            ChangeKind::Added,
            Some(snapshot),
            59,
        ),
        object(&info, ("b", "ub", 20), ChangeKind::Modified, None, 59),
        marker_at(
            58,
            marker::end(&info, &scope, watch, total, &Outcome::Complete, now),
        ),
        object(&info, ("after", "ue", 30), ChangeKind::Added, None, 57),
    ]
}

/// What a store's change stream said until it caught up and completed the snapshot: one line
/// per change (`applied NAME RV ORIGIN`, `deleted NAME CAUSE`, `complete PRUNED`), and the names
/// it holds then.
async fn read_until_complete<S, E>(
    changes: S,
    writer_store: kube_event_bridge_consumer::Store,
) -> (Vec<String>, Vec<String>)
where
    S: futures::Stream<Item = Result<Change, E>>,
    E: std::fmt::Display,
{
    let mut changes = std::pin::pin!(changes);
    let (mut said, mut caught_up, mut complete) = (Vec::new(), false, false);
    while !(caught_up && complete) {
        let change = tokio::time::timeout(READ, changes.next())
            .await
            .unwrap_or_else(|_| panic!("no snapshot completion within {READ:?}: {said:?}"))
            .expect("the stream goes on");
        match change {
            Ok(Change::Applied { object, .. }) => said.push(format!(
                "applied {} {} {}",
                object.key.name, object.resource_version, object.origin
            )),
            Ok(Change::Deleted { object, cause }) => {
                said.push(format!("deleted {} {cause:?}", object.key.name))
            }
            Ok(Change::SnapshotComplete { pruned, .. }) => {
                complete = true;
                said.push(format!("complete {pruned}"));
            }
            Ok(Change::CaughtUp) => caught_up = true,
            Err(error) => panic!("the change stream failed: {error}"),
        }
    }
    let mut names: Vec<String> = writer_store
        .list()
        .iter()
        .map(|o| o.key.name.clone())
        .collect();
    names.sort();
    (said, names)
}

/// Both stores' findings: from the beginning, and bootstrapped.
fn assert_findings(
    from_start: (Vec<String>, Vec<String>),
    bootstrapped: (Vec<String>, Vec<String>),
) {
    let (said, names) = from_start;
    assert!(
        said.contains(&format!("deleted gone {:?}", DeleteCause::Snapshot)),
        "{said:?}"
    );
    assert!(said.contains(&"complete 1".to_string()), "{said:?}");
    assert_eq!(names, ["a", "after", "b"], "{said:?}");
    let (said, names) = bootstrapped;
    assert!(
        !said
            .iter()
            .any(|s| s.contains("gone") || s.starts_with("applied b 11")),
        "what preceded the begin marker is skipped: {said:?}"
    );
    assert!(
        said.contains(&format!("applied a 10 {}", Origin::Snapshot)),
        "a comes from the snapshot: {said:?}"
    );
    assert!(said.contains(&"complete 0".to_string()), "{said:?}");
    assert_eq!(names, ["a", "after", "b"], "{said:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_bootstrap_from_the_latest_completed_snapshot() {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};

    let cluster = unique_name("snap");
    let topic = format!("snap.{cluster}.configmaps");
    create_topic(&topic, 3).await;
    let producer: FutureProducer = kafka_config().create().expect("a producer");
    let now_ms = OffsetDateTime::now_utc().unix_timestamp() * 1000;
    for p in scenario(&cluster, "5f0c8d2a-aaaa-4b9a-9c3e-1d2f3a4b5c6d") {
        let headers = OwnedHeaders::new().insert(Header {
            key: "content-type",
            value: Some(STRUCTURED_CONTENT_TYPE),
        });
        // Every record on partition 0 but the end marker, which lands on partition 2 at an
        // offset lower than its begin marker's: offsets of different partitions must not order
        // the markers (the bridge keys each marker by its own id, spreading them).
        let partition = if p.key.ends_with(":end") { 2 } else { 0 };
        let record = FutureRecord::to(&topic)
            .partition(partition)
            .key(&p.key)
            .payload(&p.body)
            .headers(headers)
            .timestamp(now_ms - p.ago_secs * 1000);
        producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| e)
            .expect("the record is stored");
    }
    let subscribe = |bootstrap: bool| {
        let s =
            kube_event_bridge_consumer::kafka::Subscription::new(kafka_config(), [topic.clone()]);
        if bootstrap {
            s.from_latest_snapshot()
        } else {
            s
        }
    };
    let writer = Writer::new();
    let store = writer.store();
    let changes = subscribe(false)
        .reflect(writer)
        .await
        .expect("reading starts");
    let from_start = read_until_complete(changes, store).await;
    let writer = Writer::new();
    let store = writer.store();
    let changes = subscribe(true)
        .reflect(writer)
        .await
        .expect("bootstrapping starts");
    let bootstrapped = read_until_complete(changes, store).await;
    assert_findings(from_start, bootstrapped);
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_bootstrap_from_the_latest_completed_snapshot() {
    use async_nats::jetstream::{self, stream};

    let cluster = unique_name("snap");
    let subject = format!("snap.{cluster}.configmaps");
    let name = unique_name("SNAP").replace(['.', '-'], "_");
    let js = jetstream::new(nats_client().await);
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        ..stream::Config::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cannot create stream {name}: {e}"));
    for p in scenario(&cluster, "5f0c8d2a-bbbb-4b9a-9c3e-1d2f3a4b5c6d") {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Content-Type", STRUCTURED_CONTENT_TYPE);
        js.publish_with_headers(subject.clone(), headers, p.body.into())
            .await
            .expect("published")
            .await
            .expect("stored by the stream");
    }
    let subscribe = |bootstrap: bool| {
        let s = kube_event_bridge_consumer::nats::Subscription::new(js.clone(), name.clone())
            .filter_subjects([subject.clone()]);
        if bootstrap {
            s.from_latest_snapshot()
        } else {
            s
        }
    };
    let writer = Writer::new();
    let store = writer.store();
    let changes = subscribe(false)
        .reflect(writer)
        .await
        .expect("reading starts");
    let from_start = read_until_complete(changes, store).await;
    let writer = Writer::new();
    let store = writer.store();
    let changes = subscribe(true)
        .reflect(writer)
        .await
        .expect("bootstrapping starts");
    let bootstrapped = read_until_complete(changes, store).await;
    assert_findings(from_start, bootstrapped);
}
