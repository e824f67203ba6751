//! Reading what a deployment published, as its consumers would: a `read_committed` Kafka
//! consumer, a JetStream ordered consumer, or what the HTTP receiver accepted, decoded by the
//! consumer crate and applied to its store.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube_event_bridge_consumer::event::{Binding, decode_message, decode_structured_message};
use kube_event_bridge_consumer::{
    ChangeType, Event, Marker, MarkerKind, Message as Decoded, Origin, Record, SnapshotResult,
    Writer,
};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio::task::JoinHandle;

use crate::history::{Change, KeyedRecord, MarkerSeen, Seen, WatchKey};
use crate::receiver::Receiver;

/// Everything received so far.
pub struct Observed {
    /// Events in arrival order.
    pub seen: Vec<Seen>,
    /// Snapshot markers in arrival order, each placed among [`Observed::seen`].
    pub markers: Vec<MarkerSeen>,
    /// The consumer crate's store, fed every record.
    pub writer: Writer,
    /// The records of the compacted topic, in arrival order.
    pub compacted: Vec<KeyedRecord>,
    /// When an event with an id not received before last arrived, per watch.
    pub last_new: HashMap<WatchKey, Instant>,
    ids: HashSet<String>,
    started: Instant,
    /// Records that could not be decoded (an anomaly of their own).
    pub undecodable: Vec<String>,
    /// The cluster checked; events of the other clusters of a fleet are kept apart in
    /// [`Observed::others`] (empty: every event is checked).
    pub cluster: String,
    /// The names of the objects other clusters published, by cluster.
    pub others: BTreeMap<String, HashSet<String>>,
}

impl Observed {
    fn new(started: Instant) -> Self {
        Observed {
            seen: Vec::new(),
            markers: Vec::new(),
            writer: Writer::new(),
            compacted: Vec::new(),
            last_new: HashMap::new(),
            ids: HashSet::new(),
            started,
            undecodable: Vec::new(),
            cluster: String::new(),
            others: BTreeMap::new(),
        }
    }

    fn event(&mut self, destination: String, event: Event, compacted_key: Option<String>) {
        if !self.cluster.is_empty() && event.cluster != self.cluster {
            let names = self.others.entry(event.cluster.clone()).or_default();
            names.insert(event.name.clone());
            return;
        }
        if self.ids.insert(event.id.clone()) {
            let watch = WatchKey {
                resource: event.resource.clone(),
                namespace: event.namespace.clone().unwrap_or_default(),
            };
            self.last_new.insert(watch, Instant::now());
        }
        if let Some(key) = compacted_key {
            let rv = event.resource_version.parse().unwrap_or_default();
            self.compacted.push(KeyedRecord {
                key,
                value: Some((event.uid.clone(), rv)),
            });
        }
        self.seen.push(Seen {
            at_ms: self.started.elapsed().as_millis() as u64,
            id: event.id.clone(),
            watch: WatchKey {
                resource: event.resource.clone(),
                namespace: event.namespace.clone().unwrap_or_default(),
            },
            name: event.name.clone(),
            uid: event.uid.clone(),
            rv: event.resource_version.parse().unwrap_or_default(),
            change: match event.change {
                ChangeType::Added => Change::Added,
                ChangeType::Modified => Change::Modified,
                ChangeType::Deleted => Change::Deleted,
            },
            repaired: event.origin == Origin::Repaired,
            snapshot: event
                .snapshot_id
                .clone()
                .filter(|_| event.origin == Origin::Snapshot),
        });
        self.writer.apply(Record::Event {
            destination,
            event: Box::new(event),
        });
    }

    /// Records a snapshot marker. It is not applied to the store: a store fed from several
    /// Kafka partitions in reading order would judge a completion wrongly, and the store's
    /// handling of markers has tests of its own.
    fn marker(&mut self, marker: Marker) {
        if !self.cluster.is_empty() && marker.cluster != self.cluster {
            return;
        }
        let (end, sent, skipped) = match marker.kind {
            MarkerKind::Begin { .. } => (None, 0, 0),
            MarkerKind::End {
                result,
                sent,
                skipped,
                ..
            } => {
                let result = match result {
                    SnapshotResult::Complete => Ok(()),
                    SnapshotResult::Failed(message) => Err(message),
                };
                (Some(result), sent, skipped)
            }
        };
        self.markers.push(MarkerSeen {
            at_ms: self.started.elapsed().as_millis() as u64,
            after: self.seen.len(),
            id: marker.id,
            snapshot: marker.snapshot_id,
            end,
            sent,
            skipped,
        });
    }

    /// Records a decoded message read from `destination`.
    fn message(&mut self, destination: String, message: Decoded, compacted_key: Option<String>) {
        match message {
            Decoded::Event(e) => self.event(destination, *e, compacted_key),
            Decoded::Marker(m) => self.marker(*m),
        }
    }

    fn tombstone(&mut self, destination: String, key: String, compacted: bool) {
        if compacted {
            self.compacted.push(KeyedRecord {
                key: key.clone(),
                value: None,
            });
        }
        self.writer.apply(Record::Tombstone { destination, key });
    }

    /// The store's objects by watch: uid to resourceVersion.
    pub fn store(&self) -> BTreeMap<WatchKey, BTreeMap<String, u64>> {
        let mut out: BTreeMap<WatchKey, BTreeMap<String, u64>> = BTreeMap::new();
        for o in self.writer.store().list() {
            // The store names a resource `plural.group`; events and watches by its plural.
            let plural = o.key.resource.split('.').next().unwrap_or_default();
            let watch = WatchKey {
                resource: plural.to_string(),
                namespace: o.key.namespace.clone().unwrap_or_default(),
            };
            let rv = o.resource_version.parse().unwrap_or_default();
            out.entry(watch).or_default().insert(o.uid.clone(), rv);
        }
        out
    }
}

/// A reader task and what it received.
pub struct Observer {
    /// What arrived.
    pub observed: Arc<Mutex<Observed>>,
    task: JoinHandle<()>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Observer {
    /// Checks only the events of `cluster`, keeping the other clusters' apart (a fleet).
    pub fn checking(self, cluster: &str) -> Observer {
        self.observed.lock().unwrap().cluster = cluster.to_string();
        self
    }

    /// Reads the `partitions` partitions of each of `topics` from their start with
    /// `read_committed`; records of `compacted` are also kept as keyed records.
    ///
    /// The partitions are assigned, not subscribed through a group, and the consumer is replaced
    /// after [`KAFKA_QUIET`] without a record, resuming after the last record read: a long-lived
    /// librdkafka consumer was seen to stop receiving for good after broker restarts while fresh
    /// readers saw every committed record (campaign seed 7, round 15), which the checker would
    /// report as the bridge's loss.
    pub fn kafka(
        topics: Vec<String>,
        partitions: i32,
        compacted: String,
        started: Instant,
    ) -> Observer {
        let observed = Arc::new(Mutex::new(Observed::new(started)));
        let sink = observed.clone();
        let task = tokio::spawn(async move {
            let mut next: BTreeMap<(String, i32), Offset> = topics
                .iter()
                .flat_map(|t| (0..partitions).map(move |p| ((t.clone(), p), Offset::Beginning)))
                .collect();
            loop {
                let consumer = assigned(&next);
                while let Ok(received) = tokio::time::timeout(KAFKA_QUIET, consumer.recv()).await {
                    let Ok(m) = received else {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    };
                    next.insert(
                        (m.topic().to_string(), m.partition()),
                        Offset::Offset(m.offset() + 1),
                    );
                    record(&sink, &m, &compacted);
                }
                // Closing a wedged client may block: not on the runtime.
                std::thread::spawn(move || drop(consumer));
            }
        });
        Observer { observed, task }
    }

    /// Reads the JetStream stream `stream` from its start with an ordered consumer.
    pub fn nats(js: async_nats::jetstream::Context, stream: String, started: Instant) -> Observer {
        let observed = Arc::new(Mutex::new(Observed::new(started)));
        let sink = observed.clone();
        let task = tokio::spawn(async move {
            let stream = loop {
                match js.get_stream(&stream).await {
                    Ok(s) => break s,
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            };
            let config = async_nats::jetstream::consumer::pull::OrderedConfig::default();
            let consumer = stream
                .create_consumer(config)
                .await
                .expect("ordered consumer");
            let mut messages = consumer.messages().await.expect("consumer messages");
            while let Some(m) = messages.next().await {
                let Ok(m) = m else {
                    continue;
                };
                let pairs: Vec<(&str, &[u8])> = m
                    .headers
                    .iter()
                    .flat_map(|h| h.iter())
                    .filter_map(|(k, v)| Some((k.as_ref(), v.first()?.as_str().as_bytes())))
                    .collect();
                let decoded = decode_message(Binding::Nats, pairs, &m.payload);
                let mut o = sink.lock().unwrap();
                match decoded {
                    Ok(message) => o.message(m.subject.to_string(), message, None),
                    Err(e) => o.undecodable.push(format!("{}: {e}", m.subject)),
                }
            }
        });
        Observer { observed, task }
    }

    /// Follows what `receiver` accepted.
    pub fn http(receiver: Receiver, started: Instant) -> Observer {
        let observed = Arc::new(Mutex::new(Observed::new(started)));
        let sink = observed.clone();
        let task = tokio::spawn(async move {
            let mut next = 0;
            loop {
                let Some(r) = receiver.accepted_at(next) else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                next += 1;
                // A structured-mode request (a snapshot marker, always) is read back whole.
                let structured = r.headers.iter().any(|(k, v)| {
                    k.eq_ignore_ascii_case("content-type")
                        && v.starts_with("application/cloudevents+json")
                });
                if structured {
                    let decoded = serde_json::to_vec(&r.event)
                        .map_err(|e| e.to_string())
                        .and_then(|b| decode_structured_message(&b).map_err(|e| e.to_string()));
                    let mut o = sink.lock().unwrap();
                    match decoded {
                        Ok(message) => o.message(r.destination.clone(), message, None),
                        Err(e) => o.undecodable.push(format!("{}: {e}", r.destination)),
                    }
                    continue;
                }
                let body = match r.event.data() {
                    Some(cloudevents::Data::Json(v)) => serde_json::to_vec(v).unwrap_or_default(),
                    Some(cloudevents::Data::String(s)) => s.clone().into_bytes(),
                    Some(cloudevents::Data::Binary(b)) => b.clone(),
                    None => b"null".to_vec(),
                };
                let pairs: Vec<(&str, &[u8])> = r
                    .headers
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_bytes()))
                    .collect();
                let decoded = decode_message(Binding::Nats, pairs, &body);
                let mut o = sink.lock().unwrap();
                match decoded {
                    Ok(message) => o.message(r.destination.clone(), message, None),
                    Err(e) => o.undecodable.push(format!("{}: {e}", r.destination)),
                }
            }
        });
        Observer { observed, task }
    }
}

/// How long the Kafka reader waits for a record before it replaces its consumer.
const KAFKA_QUIET: Duration = Duration::from_secs(5);

/// A `read_committed` consumer assigned every partition of `next` from its offset there.
fn assigned(next: &BTreeMap<(String, i32), Offset>) -> StreamConsumer {
    let consumer: StreamConsumer =
        crate::support::kafka_consumer(&crate::support::unique_name("chaos-reader"));
    let mut list = TopicPartitionList::new();
    for ((topic, partition), offset) in next {
        list.add_partition_offset(topic, *partition, *offset)
            .expect("a valid offset");
    }
    consumer.assign(&list).expect("assign");
    consumer
}

/// Records one Kafka record in `sink`.
fn record(sink: &Mutex<Observed>, m: &BorrowedMessage<'_>, compacted: &str) {
    let topic = m.topic().to_string();
    let key = m.key().map(|k| String::from_utf8_lossy(k).into_owned());
    let in_compacted = topic == compacted;
    let mut o = sink.lock().unwrap();
    let Some(payload) = m.payload() else {
        o.tombstone(topic, key.unwrap_or_default(), in_compacted);
        return;
    };
    let headers: Vec<(&str, &[u8])> = m
        .headers()
        .map(|h| {
            h.iter()
                .map(|x| (x.key, x.value.unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    match decode_message(Binding::Kafka, headers, payload) {
        Ok(message) => o.message(topic, message, key.filter(|_| in_compacted)),
        Err(e) => o.undecodable.push(format!("{topic}: {e}")),
    }
}
