//! Reading Kafka topics written by the bridge: every partition from the beginning (or, with
//! [`Subscription::from_latest_snapshot`], from the begin marker of the latest completed
//! snapshot on demand), read committed, caught up once each partition reached the end it had
//! when reading started. Records are yielded with their timestamps
//! ([`Input::Timestamped`]); a snapshot's end marker is held back until every partition of its
//! topic was read up to where it ended when the marker was read, so that the snapshot's events
//! in other partitions are applied before it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, stream};
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::event::{self, Binding, MarkerKind, Record};
use crate::reflect::{Input, reflect};
use crate::store::{CLOCK_MARGIN_MS, Change, Writer};

mod bootstrap;

/// Errors of a Kafka subscription.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The consumer could not be created (a property is invalid).
    #[error("cannot create a Kafka consumer for topic {topic}")]
    Create {
        /// The topic.
        topic: String,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
    /// The topic's partitions could not be read from the cluster.
    #[error("cannot read the metadata of topic {topic}")]
    Metadata {
        /// The topic.
        topic: String,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
    /// The topic does not exist (or has no partitions).
    #[error("topic {0} does not exist")]
    MissingTopic(String),
    /// The end offsets could not be read.
    #[error("cannot read the end offset of {topic} partition {partition}")]
    Watermarks {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
    /// The partitions could not be assigned.
    #[error("cannot assign the partitions of topic {topic}")]
    Assign {
        /// The topic.
        topic: String,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
    /// Receiving failed (librdkafka retries by itself; the stream goes on).
    #[error("receiving from topic {topic} failed")]
    Receive {
        /// The topic.
        topic: String,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
    /// A record is not an event of the bridge; it is skipped.
    #[error("record {topic}/{partition}@{offset} is not an event of the bridge")]
    Decode {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The offset.
        offset: i64,
        /// What is wrong.
        #[source]
        source: event::Error,
    },
    /// A metadata task panicked or was cancelled.
    #[error("the metadata request for topic {0} did not complete")]
    Task(String),
    /// Looking for the latest completed snapshot failed.
    #[error("cannot look for a completed snapshot in topic {topic}")]
    Bootstrap {
        /// The topic.
        topic: String,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How long metadata and end-offset requests may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(30);

/// Topics to read, and the client settings to read them with.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use futures::StreamExt;
/// use kube_event_bridge_consumer::{Writer, kafka::Subscription};
///
/// let mut client = rdkafka::ClientConfig::new();
/// client.set("bootstrap.servers", "127.0.0.1:9092");
/// let writer = Writer::new();
/// let store = writer.store();
/// let changes = Subscription::new(client, ["k8s.prod.core.configmaps"]).reflect(writer).await?;
/// tokio::spawn(changes.for_each(|_| async {}));
/// store.wait_until_ready().await;
/// println!("{} objects", store.len());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Subscription {
    client: ClientConfig,
    topics: Vec<String>,
    bootstrap: bool,
}

impl Subscription {
    /// Reads `topics` with `client` (`bootstrap.servers`, credentials, TLS). The subscription
    /// sets `isolation.level=read_committed`, `enable.auto.commit=false` and
    /// `enable.partition.eof=true` itself, and a `group.id` unless one is given (no offsets
    /// are ever committed: a store is rebuilt from the beginning of each partition).
    pub fn new(client: ClientConfig, topics: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Subscription {
            client,
            topics: topics.into_iter().map(Into::into).collect(),
            bootstrap: false,
        }
    }

    /// Starts each topic at the begin marker of its latest completed snapshot on demand
    /// instead of its beginning, skipping what precedes it: every partition from the begin
    /// marker's timestamp (less [`CLOCK_MARGIN_MS`]), since objects are keyed across all
    /// partitions. Once the end marker is read, the store holds the complete state of the
    /// snapshot's scope ([`Change::SnapshotComplete`]). When a topic holds markers of several
    /// watches, it starts at the earliest begin marker among each watch's latest completed
    /// snapshot; a topic without a completed snapshot (or whose begin marker compaction
    /// removed) is read from its beginning, with a warning.
    ///
    /// ```no_run
    /// # async fn example(client: rdkafka::ClientConfig) -> Result<(), Box<dyn std::error::Error>> {
    /// use kube_event_bridge_consumer::{Writer, kafka::Subscription};
    /// let changes = Subscription::new(client, ["k8s.prod.core.configmaps"])
    ///     .from_latest_snapshot()
    ///     .reflect(Writer::new())
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_latest_snapshot(mut self) -> Self {
        self.bootstrap = true;
        self
    }

    /// Starts reading and applies every record to `writer`'s store; the stream yields the
    /// changes and must be polled for the store to fill.
    pub async fn reflect(
        self,
        writer: Writer,
    ) -> Result<impl Stream<Item = Result<Change>> + Send + 'static> {
        Ok(reflect(writer, self.start().await?))
    }

    /// Starts reading: every partition of every topic from its first retained offset. The
    /// stream yields each record, then [`Input::CaughtUp`] once every partition reached the
    /// end offset (the last stable offset, for `read_committed`) it had now.
    pub async fn start(self) -> Result<impl Stream<Item = Result<Input>> + Send + 'static> {
        let mut readers = Vec::with_capacity(self.topics.len());
        for topic in &self.topics {
            readers.push(Box::pin(
                TopicReader::start(&self.client, topic, self.bootstrap)
                    .await?
                    .into_stream(),
            ));
        }
        let topics = readers.len();
        let mut caught_up = 0;
        let merged = stream::select_all(readers).filter_map(move |item| {
            let out = match item {
                Ok(Input::CaughtUp) => {
                    caught_up += 1;
                    (caught_up == topics).then_some(Ok(Input::CaughtUp))
                }
                other => Some(other),
            };
            std::future::ready(out)
        });
        // No topic at all: nothing to wait for.
        let empty = (topics == 0).then_some(Ok(Input::CaughtUp));
        Ok(stream::iter(empty).chain(merged))
    }
}

/// One topic's consumer, the partitions not yet read up to their start-time end, and the end
/// markers held back until the partitions were read up to where they ended when each was read.
struct TopicReader {
    consumer: Arc<StreamConsumer>,
    /// A `read_uncommitted` client: its watermarks are the ends of what was written.
    uncommitted: Arc<BaseConsumer>,
    topic: String,
    /// Partition → end offset at start, for partitions not caught up yet.
    pending: HashMap<i32, i64>,
    reported: bool,
    /// Partition → the next offset to read.
    positions: HashMap<i32, i64>,
    /// End markers, in reading order, each with the partitions still to read up to an end.
    held: std::collections::VecDeque<(Input, HashMap<i32, i64>)>,
}

impl TopicReader {
    async fn start(client: &ClientConfig, topic: &str, bootstrap: bool) -> Result<TopicReader> {
        let mut config = client.clone();
        if config.get("group.id").is_none() {
            config.set("group.id", format!("kube-event-bridge-consumer-{topic}"));
        }
        config
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true")
            .set("auto.offset.reset", "earliest");
        let consumer: StreamConsumer = config.create().map_err(|source| Error::Create {
            topic: topic.into(),
            source,
        })?;
        // The ends at start are the high watermarks, every record written: a `read_committed`
        // client's watermark query answers the last stable offset, which stops before a
        // transaction still open although records committed after it are there to read.
        let uncommitted: BaseConsumer = config
            .clone()
            .set("isolation.level", "read_uncommitted")
            .create()
            .map_err(|source| Error::Create {
                topic: topic.into(),
                source,
            })?;
        let uncommitted = Arc::new(uncommitted);
        let (name, client) = (topic.to_string(), uncommitted.clone());
        // Metadata and watermark requests block: run them off the async threads.
        let ends = tokio::task::spawn_blocking(move || end_offsets(&client, &name))
            .await
            .map_err(|_| Error::Task(topic.into()))?;
        let ends = ends?;
        let starts = if bootstrap {
            let (name, ends, config) = (topic.to_string(), ends.clone(), config.clone());
            tokio::task::spawn_blocking(move || bootstrap::starts(&config, &name, &ends))
                .await
                .map_err(|_| Error::Task(topic.into()))??
        } else {
            ends.iter().map(|(p, low, _)| (*p, *low)).collect()
        };
        let mut assignment = TopicPartitionList::new();
        let mut pending = HashMap::new();
        let mut positions = HashMap::new();
        for (partition, _, high) in ends {
            let start = starts.get(&partition).copied().unwrap_or(high);
            assignment
                .add_partition_offset(topic, partition, Offset::Offset(start))
                .map_err(|source| Error::Assign {
                    topic: topic.into(),
                    source,
                })?;
            if high > start {
                pending.insert(partition, high);
            }
            positions.insert(partition, start);
        }
        consumer
            .assign(&assignment)
            .map_err(|source| Error::Assign {
                topic: topic.into(),
                source,
            })?;
        tracing::debug!(
            topic,
            partitions = assignment.count(),
            pending = pending.len(),
            "reading topic"
        );
        Ok(TopicReader {
            consumer: Arc::new(consumer),
            uncommitted,
            topic: topic.into(),
            pending,
            reported: false,
            positions,
            held: Default::default(),
        })
    }

    fn into_stream(self) -> impl Stream<Item = Result<Input>> + Send + 'static {
        stream::unfold(self, |mut reader| async move {
            let item = reader.next().await;
            Some((item, reader))
        })
    }

    /// The next input: a record, an error, an end marker whose partitions were read, or
    /// (once) the news that every partition caught up.
    async fn next(&mut self) -> Result<Input> {
        loop {
            if self.held.front().is_some_and(|(_, ends)| ends.is_empty()) {
                let (marker, _) = self.held.pop_front().expect("a held marker");
                return Ok(marker);
            }
            if self.pending.is_empty() && !self.reported {
                self.reported = true;
                return Ok(Input::CaughtUp);
            }
            match self.consumer.recv().await {
                Ok(message) => {
                    let (partition, next) = (message.partition(), message.offset() + 1);
                    self.positions.insert(partition, next);
                    for ends in std::iter::once(&mut self.pending)
                        .chain(self.held.iter_mut().map(|(_, ends)| ends))
                    {
                        if ends.get(&partition).is_some_and(|end| next >= *end) {
                            ends.remove(&partition);
                        }
                    }
                    let timestamp = message.timestamp().to_millis().unwrap_or_default();
                    let input = Input::Timestamped(record(&self.topic, &message)?, timestamp);
                    if !is_end_marker(&input) {
                        return Ok(input);
                    }
                    let ends = self.unread_ends().await;
                    self.held.push_back((input, ends));
                }
                // The end of a partition as it is now. For read_committed that is its last
                // stable offset, which stops before a transaction still open (another
                // producer's, or one a dead producer left): records committed after it are not
                // read yet. Caught up only once reading passed the end the partition had at
                // start; an end marker is let through once reading passed the ends the
                // partitions had when it was read.
                Err(KafkaError::PartitionEOF(partition)) => {
                    let waiting = std::iter::once(&self.pending)
                        .chain(self.held.iter().map(|(_, ends)| ends))
                        .any(|ends| ends.contains_key(&partition));
                    if !waiting {
                        continue;
                    }
                    let stable = self.stable_end(partition).await;
                    for ends in std::iter::once(&mut self.pending)
                        .chain(self.held.iter_mut().map(|(_, ends)| ends))
                    {
                        if ends.get(&partition).is_some_and(|end| stable >= *end) {
                            ends.remove(&partition);
                        }
                    }
                }
                Err(source) => {
                    return Err(Error::Receive {
                        topic: self.topic.clone(),
                        source,
                    });
                }
            }
        }
    }
}

impl TopicReader {
    /// The partitions not read up to the end they have now (every record written), with that
    /// end; unknown ends (the query failed) count as read.
    async fn unread_ends(&self) -> HashMap<i32, i64> {
        let (client, topic) = (self.uncommitted.clone(), self.topic.clone());
        let ends = tokio::task::spawn_blocking(move || end_offsets(&client, &topic))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        ends.into_iter()
            .filter(|(p, _, high)| self.positions.get(p).is_some_and(|next| next < high))
            .map(|(p, _, high)| (p, high))
            .collect()
    }

    /// The last stable offset of `partition` now (this reader's `read_committed` watermark);
    /// unknown (the query failed) counts as reached, as before the query existed. A transaction
    /// that ends between the end-of-partition report and this query lets the partition count as
    /// caught up a moment before the records it released are read (a window of one round trip).
    async fn stable_end(&self, partition: i32) -> i64 {
        let consumer = self.consumer.clone();
        let topic = self.topic.clone();
        tokio::task::spawn_blocking(move || {
            consumer
                .fetch_watermarks(&topic, partition, METADATA_TIMEOUT)
                .map_or(i64::MAX, |(_, end)| end)
        })
        .await
        .unwrap_or(i64::MAX)
    }
}

/// (partition, first offset, end offset) of every partition of `topic`.
fn end_offsets(consumer: &BaseConsumer, topic: &str) -> Result<Vec<(i32, i64, i64)>> {
    let metadata = consumer
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .map_err(|source| Error::Metadata {
            topic: topic.into(),
            source,
        })?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(Error::MissingTopic(topic.into()));
    }
    partitions
        .into_iter()
        .map(|partition| {
            let (low, high) = consumer
                .fetch_watermarks(topic, partition, METADATA_TIMEOUT)
                .map_err(|source| Error::Watermarks {
                    topic: topic.into(),
                    partition,
                    source,
                })?;
            Ok((partition, low, high))
        })
        .collect()
}

/// Whether `input` is a snapshot's end marker.
fn is_end_marker(input: &Input) -> bool {
    matches!(
        input,
        Input::Timestamped(Record::Marker { marker, .. }, _)
            if matches!(marker.kind, MarkerKind::End { .. })
    )
}

/// Decodes one record: an event, a snapshot marker, or a tombstone (null value).
fn record(topic: &str, message: &BorrowedMessage<'_>) -> Result<Record> {
    let Some(payload) = message.payload() else {
        let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
        return Ok(Record::Tombstone {
            destination: topic.into(),
            key,
        });
    };
    let headers = message
        .headers()
        .map(|h| {
            h.iter()
                .map(|header| (header.key, header.value.unwrap_or_default()))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let decoded = event::decode_message(Binding::Kafka, headers, payload).map_err(|source| {
        Error::Decode {
            topic: topic.into(),
            partition: message.partition(),
            offset: message.offset(),
            source,
        }
    })?;
    Ok(Record::of(topic.into(), decoded))
}
