//! The consumer library (`kube-event-bridge-consumer`) fed by the real brokers, and the
//! comparison of its store with a LIST from the API server. Used by the integration tests
//! (`consumer`) and the fault suite (`faults::consumer`).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube_event_bridge_consumer::{Body, Change, Store, Writer, kafka, nats};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use serde_json::{Value, json};

use crate::harness::{SinkKind, stream_name};
use crate::support::{self, env, wait_until};

/// Per object name: uid, resourceVersion and `data`.
pub type State = BTreeMap<String, (String, String, Value)>;

/// A store kept current by a task reading the broker; the task stops when this is dropped.
pub struct LiveStore {
    /// The store.
    pub store: Store,
    /// Every error the change stream yielded.
    pub errors: Arc<Mutex<Vec<String>>>,
    /// How many changes it yielded, by kind (`applied`, `deleted`, `tombstone`, `caught up`).
    pub counts: Arc<Mutex<BTreeMap<&'static str, usize>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LiveStore {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LiveStore {
    /// Drives `changes` in a task, recording errors and counting changes.
    fn drive<E: std::fmt::Display>(
        store: Store,
        changes: impl futures::Stream<Item = Result<Change, E>> + Send + 'static,
    ) -> LiveStore {
        let errors = Arc::new(Mutex::new(Vec::new()));
        let counts = Arc::new(Mutex::new(BTreeMap::new()));
        let (e, c) = (errors.clone(), counts.clone());
        let task = tokio::spawn(async move {
            let mut changes = std::pin::pin!(changes);
            while let Some(change) = changes.next().await {
                let kind = match change {
                    Ok(Change::Applied { .. }) => "applied",
                    Ok(Change::Deleted {
                        cause: kube_event_bridge_consumer::DeleteCause::Tombstone,
                        ..
                    }) => "tombstone",
                    Ok(Change::Deleted { .. }) => "deleted",
                    Ok(Change::CaughtUp) => "caught up",
                    Ok(Change::SnapshotComplete { .. }) => "snapshot complete",
                    Err(error) => {
                        e.lock().unwrap().push(format!("{error:#}"));
                        continue;
                    }
                };
                *c.lock().unwrap().entry(kind).or_default() += 1;
            }
        });
        LiveStore {
            store,
            errors,
            counts,
            task,
        }
    }

    /// A new store reading `topics` from the beginning.
    pub async fn kafka(topics: &[String]) -> LiveStore {
        let mut client = rdkafka::ClientConfig::new();
        client
            .set("bootstrap.servers", env().kafka_bootstrap)
            .set("group.id", support::unique_name("store"));
        let writer = Writer::new();
        let store = writer.store();
        let changes = kafka::Subscription::new(client, topics)
            .reflect(writer)
            .await
            .unwrap_or_else(|e| panic!("cannot read {topics:?}: {e}"));
        LiveStore::drive(store, changes)
    }

    /// A new store reading the JetStream stream of `cluster`'s bridge from its first message.
    pub async fn nats(cluster: &str) -> LiveStore {
        let js = async_nats::jetstream::new(support::nats_client().await);
        let name = stream_name(cluster);
        wait_until(
            "the bridge's JetStream stream exists",
            Duration::from_secs(30),
            || {
                let (js, name) = (js.clone(), name.clone());
                async move { js.get_stream(name).await.ok().map(drop) }
            },
        )
        .await;
        let writer = Writer::new();
        let store = writer.store();
        let changes = nats::Subscription::new(js, &name)
            .reflect(writer)
            .await
            .unwrap_or_else(|e| panic!("cannot read stream {name}: {e}"));
        LiveStore::drive(store, changes)
    }

    /// A new store for `sink` (Kafka: `topics`; NATS: the stream of `cluster`).
    pub async fn open(sink: SinkKind, cluster: &str, topics: &[String]) -> LiveStore {
        match sink {
            SinkKind::Kafka => LiveStore::kafka(topics).await,
            SinkKind::Nats => LiveStore::nats(cluster).await,
            SinkKind::Stdout | SinkKind::Http => {
                panic!("the consumer library reads Kafka or NATS, not {sink:?}")
            }
        }
    }

    /// Waits (up to `timeout`) until the store has caught up.
    pub async fn wait_ready(&self, timeout: Duration) {
        tokio::time::timeout(timeout, self.store.wait_until_ready())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the store did not catch up within {timeout:?}; errors: {:?}",
                    self.errors.lock().unwrap()
                )
            });
    }

    /// The objects of namespace `ns` in the store. An object whose body is missing shows
    /// `data` as the string `"<missing body>"`, which no LIST gives.
    pub fn state(&self, ns: &str) -> State {
        self.store
            .list()
            .into_iter()
            .filter(|o| o.key.namespace.as_deref() == Some(ns))
            .map(|o| {
                let data = match &o.body {
                    Body::Full(v) => v.get("data").cloned().unwrap_or(Value::Null),
                    Body::Missing { .. } => Value::String("<missing body>".into()),
                };
                (
                    o.key.name.clone(),
                    (o.uid.clone(), o.resource_version.clone(), data),
                )
            })
            .collect()
    }

    /// Asserts that the change stream yielded no error.
    pub fn assert_no_errors(&self) {
        let errors = self.errors.lock().unwrap();
        assert!(errors.is_empty(), "the change stream failed: {errors:#?}");
    }

    /// How many changes of `kind` the stream yielded.
    pub fn count(&self, kind: &str) -> usize {
        self.counts.lock().unwrap().get(kind).copied().unwrap_or(0)
    }
}

/// The ConfigMaps of `ns` as a LIST from the API server gives them.
pub async fn list_state(client: &kube::Client, ns: &str) -> State {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    cms.list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("cannot list ConfigMaps in {ns}: {e}"))
        .items
        .into_iter()
        .map(|cm| {
            let meta = cm.metadata;
            (
                meta.name.expect("name"),
                (
                    meta.uid.expect("uid"),
                    meta.resource_version.expect("resourceVersion"),
                    cm.data.map_or(Value::Null, |d| json!(d)),
                ),
            )
        })
        .collect()
}

/// Waits until `live` holds exactly what a LIST of `ns` gives (names, uids,
/// resourceVersions, data); panics showing both after `timeout`.
pub async fn wait_store_equals_list(
    live: &LiveStore,
    client: &kube::Client,
    ns: &str,
    timeout: Duration,
) -> State {
    let mut last = (State::new(), State::new());
    let outcome = tokio::time::timeout(timeout, async {
        loop {
            let listed = list_state(client, ns).await;
            let stored = live.state(ns);
            if listed == stored {
                return listed;
            }
            last = (listed, stored);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    match outcome {
        Ok(state) => state,
        Err(_) => panic!(
            "the store never equalled the LIST within {timeout:?}\nLIST:  {:#?}\nstore: {:#?}\nerrors: {:?}",
            last.0,
            last.1,
            live.errors.lock().unwrap()
        ),
    }
}

/// Opens a new store reading from the beginning and asserts that, once it reports that it
/// caught up (within `timeout`), it holds exactly `state` (call it when nothing changes any
/// more). Returns the store.
pub async fn assert_new_store_rebuilds(
    sink: SinkKind,
    cluster: &str,
    topics: &[String],
    ns: &str,
    state: &State,
    timeout: Duration,
) -> LiveStore {
    let fresh = LiveStore::open(sink, cluster, topics).await;
    fresh.wait_ready(timeout).await;
    assert_eq!(&fresh.state(ns), state, "the new store after catching up");
    fresh.assert_no_errors();
    fresh
}

/// Creates a compacted topic (`cleanup.policy=compact`, segments rolled and cleaned quickly
/// so that compaction really runs during a test) with `partitions` partitions.
pub async fn compacted_topic(name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = support::kafka_config()
        .create()
        .unwrap_or_else(|e| panic!("cannot create a Kafka admin client: {e}"));
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1))
        .set("cleanup.policy", "compact")
        .set("segment.ms", "100")
        .set("min.cleanable.dirty.ratio", "0.01")
        .set("delete.retention.ms", "100");
    let results = admin
        .create_topics(
            [&topic],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .unwrap_or_else(|e| panic!("cannot create Kafka topic {name}: {e}"));
    for result in results {
        result.unwrap_or_else(|(t, code)| panic!("cannot create Kafka topic {t}: {code}"));
    }
    // Wait until every partition has a leader (creating again is a no-op).
    support::create_topic(name, partitions).await;
}

fn cm(name: &str, v: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": v}}))
        .expect("ConfigMap")
}

/// One round of churn in `cms`, names prefixed by `round`: creates, updates, deletes, and a
/// delete and recreate under the same name (a new uid).
pub async fn churn(cms: &Api<ConfigMap>, round: &str) {
    let pp = PostParams::default();
    for i in 0..6 {
        cms.create(&pp, &cm(&format!("{round}-{i}"), "0"))
            .await
            .unwrap_or_else(|e| panic!("create {round}-{i}: {e}"));
    }
    for i in 0..6 {
        let name = format!("{round}-{i}");
        for v in 1..=2 {
            cms.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"v": v.to_string()}})),
            )
            .await
            .unwrap_or_else(|e| panic!("patch {name}: {e}"));
        }
    }
    let dp = kube::api::DeleteParams::default();
    for i in [1, 3] {
        cms.delete(&format!("{round}-{i}"), &dp)
            .await
            .unwrap_or_else(|e| panic!("delete {round}-{i}: {e}"));
    }
    let again = format!("{round}-5");
    cms.delete(&again, &dp)
        .await
        .unwrap_or_else(|e| panic!("delete {again}: {e}"));
    cms.create(&pp, &cm(&again, "recreated"))
        .await
        .unwrap_or_else(|e| panic!("recreate {again}: {e}"));
}
