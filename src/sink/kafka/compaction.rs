//! What a snapshot's `prune` needs of a Kafka topic compacted by key: the keys it still holds
//! for one watch's objects (read from the beginning to the end of every partition as it was
//! when asked, committed records only), and tombstones for those the cluster no longer has,
//! written in the watch's stream like its markers.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::producer::FutureRecord;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::Deserialize;

use super::sink::KafkaSink;
use crate::encode::ce_header;
use crate::sink::{Compaction, Error, Owner, Result};

/// How long a read may go without moving before it fails.
const STALL: Duration = Duration::from_secs(30);
/// The longest wait for metadata and end offsets.
const TIMEOUT: Duration = Duration::from_secs(10);

impl Compaction for KafkaSink {
    fn held_keys<'a>(
        &'a self,
        destination: &'a str,
        owner: &'a Owner,
    ) -> BoxFuture<'a, Result<Vec<String>>> {
        let config = self.consumer_config();
        let (topic, owner) = (destination.to_string(), owner.clone());
        Box::pin(async move {
            let read = tokio::task::spawn_blocking(move || held(config, &topic, &owner));
            read.await
                .expect("key read task")
                .map_err(|source| Error::Publish {
                    destination: destination.to_string(),
                    source: Box::new(source),
                })
        })
    }

    fn tombstones<'a>(
        &'a self,
        destination: &'a str,
        keys: &'a [String],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let mut sent = Vec::with_capacity(keys.len());
            for key in keys {
                let record: FutureRecord<'_, str, [u8]> = FutureRecord::to(destination).key(key);
                sent.push(self.enqueue_out_of_band(destination, record).await?);
            }
            for (txn, delivery) in sent {
                self.settle_out_of_band(destination, txn, delivery).await?;
            }
            Ok(())
        })
    }
}

/// The keys of `topic` whose latest record is an event of `owner`'s objects.
fn held(config: ClientConfig, topic: &str, owner: &Owner) -> Result<Vec<String>, KafkaError> {
    let mut config = config;
    config
        .set(
            "group.id",
            format!("kube-event-bridge-prune-{}", std::process::id()),
        )
        .set("enable.partition.eof", "true");
    let consumer: BaseConsumer = config.create()?;
    let ends = ends(&consumer, topic)?;
    let mut assigned = TopicPartitionList::new();
    for partition in ends.keys() {
        assigned.add_partition_offset(topic, *partition, Offset::Beginning)?;
    }
    consumer.assign(&assigned)?;
    let mut pending: HashMap<i32, i64> = ends.into_iter().filter(|(_, end)| *end > 0).collect();
    let mut keys = HashSet::new();
    let mut moved = Instant::now();
    while !pending.is_empty() {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                moved = Instant::now();
                keep_latest(&mut keys, &m, owner);
                if pending
                    .get(&m.partition())
                    .is_some_and(|end| m.offset() + 1 >= *end)
                {
                    pending.remove(&m.partition());
                }
            }
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                pending.remove(&partition);
            }
            // Nothing for a while: the end may be a transaction marker, never delivered, so
            // the positions tell.
            None => {
                let positions = consumer.position()?;
                pending.retain(|partition, end| {
                    let at = positions.find_partition(topic, *partition).and_then(|p| {
                        match p.offset() {
                            Offset::Offset(o) => Some(o),
                            _ => None,
                        }
                    });
                    at.is_none_or(|at| at < *end)
                });
                if moved.elapsed() > STALL {
                    return Err(KafkaError::MessageConsumption(
                        rdkafka::types::RDKafkaErrorCode::OperationTimedOut,
                    ));
                }
            }
            Some(Err(e)) => return Err(e),
        }
    }
    let mut keys: Vec<String> = keys.into_iter().collect();
    keys.sort_unstable();
    Ok(keys)
}

/// The end of every partition of `topic` as a `read_committed` client sees it (the last stable
/// offset: records past it belong to transactions still open).
fn ends(consumer: &BaseConsumer, topic: &str) -> Result<HashMap<i32, i64>, KafkaError> {
    let metadata = consumer.fetch_metadata(Some(topic), TIMEOUT)?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    partitions
        .into_iter()
        .map(|p| Ok((p, consumer.fetch_watermarks(topic, p, TIMEOUT)?.1)))
        .collect()
}

/// Keeps the key of `m` when it is an event of `owner`'s objects, forgets it otherwise (a
/// tombstone, or the latest record under the key is another's).
fn keep_latest(keys: &mut HashSet<String>, m: &BorrowedMessage<'_>, owner: &Owner) {
    let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else {
        return;
    };
    let owned = m
        .payload()
        .is_some_and(|payload| belongs(m, payload, owner));
    if owned {
        keys.insert(key.to_string());
    } else {
        keys.remove(key);
    }
}

/// Whether a record is an event of `owner`'s objects: its attributes in `ce_` headers (binary
/// mode) or in its structured document.
fn belongs(m: &BorrowedMessage<'_>, payload: &[u8], owner: &Owner) -> bool {
    if let Some(headers) = m.headers() {
        let header = |name: &str| {
            let wanted = ce_header(name, '_');
            headers
                .iter()
                .find(|h| h.key == wanted)
                .and_then(|h| h.value)
                .and_then(|v| std::str::from_utf8(v).ok())
        };
        if header(crate::attribute::SPECVERSION).is_some() {
            return owner.owns(header);
        }
    }
    let Ok(doc) = serde_json::from_slice::<Attributes>(payload) else {
        return false;
    };
    owner.owns(|name| doc.get(name))
}

/// The attributes of a structured document that decide whose it is (`data` is skipped).
#[derive(Debug, Deserialize)]
struct Attributes {
    cluster: Option<String>,
    apiversion: Option<String>,
    resource: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
}

impl Attributes {
    fn get(&self, name: &str) -> Option<&str> {
        use crate::attribute::{APIVERSION, CLUSTER, NAMESPACE, RESOURCE, UID};
        match name {
            CLUSTER => self.cluster.as_deref(),
            APIVERSION => self.apiversion.as_deref(),
            RESOURCE => self.resource.as_deref(),
            NAMESPACE => self.namespace.as_deref(),
            UID => self.uid.as_deref(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(namespace: Option<&str>) -> Owner {
        Owner {
            cluster: "prod".into(),
            api_version: "v1".into(),
            resource: "configmaps".into(),
            namespace: namespace.map(Into::into),
        }
    }

    fn doc(json: &str) -> Attributes {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_structured_event_of_the_watch_is_its_own() {
        let event = doc(
            r#"{"specversion":"1.0","cluster":"prod","apiversion":"v1","resource":"configmaps","namespace":"shop","uid":"u1","data":{"big":[1,2,3]}}"#,
        );
        assert!(owner(None).owns(|n| event.get(n)));
        assert!(owner(Some("shop")).owns(|n| event.get(n)));
        assert!(!owner(Some("other")).owns(|n| event.get(n)));
    }

    #[test]
    fn markers_and_other_resources_or_clusters_are_never_its_own() {
        let marker = doc(
            r#"{"type":"io.kubeeventbridge.snapshot.begin","cluster":"prod","apiversion":"v1","resource":"configmaps","namespace":"shop"}"#,
        );
        assert!(
            !owner(None).owns(|n| marker.get(n)),
            "no uid: not an object's event"
        );
        let secret = doc(
            r#"{"cluster":"prod","apiversion":"v1","resource":"secrets","namespace":"shop","uid":"u1"}"#,
        );
        assert!(!owner(None).owns(|n| secret.get(n)));
        let elsewhere = doc(
            r#"{"cluster":"stage","apiversion":"v1","resource":"configmaps","namespace":"shop","uid":"u1"}"#,
        );
        assert!(!owner(None).owns(|n| elsewhere.get(n)));
    }
}
