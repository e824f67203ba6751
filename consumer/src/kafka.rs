//! Reading Kafka topics written by the bridge: every partition from the beginning, read
//! committed, caught up once each partition reached the end it had when reading started.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, stream};
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::event::{self, Binding, Record};
use crate::reflect::{Input, reflect};
use crate::store::{Change, Writer};

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
        }
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
                TopicReader::start(&self.client, topic).await?.into_stream(),
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

/// One topic's consumer and the partitions not yet read up to their start-time end.
struct TopicReader {
    consumer: Arc<StreamConsumer>,
    topic: String,
    /// Partition → end offset at start, for partitions not caught up yet.
    pending: HashMap<i32, i64>,
    reported: bool,
}

impl TopicReader {
    async fn start(client: &ClientConfig, topic: &str) -> Result<TopicReader> {
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
        let name = topic.to_string();
        // Metadata and watermark requests block: run them off the async threads.
        let ends = tokio::task::spawn_blocking(move || end_offsets(&uncommitted, &name))
            .await
            .map_err(|_| Error::Task(topic.into()))?;
        let ends = ends?;
        let mut assignment = TopicPartitionList::new();
        let mut pending = HashMap::new();
        for (partition, low, high) in ends {
            assignment
                .add_partition_offset(topic, partition, Offset::Beginning)
                .map_err(|source| Error::Assign {
                    topic: topic.into(),
                    source,
                })?;
            if high > low {
                pending.insert(partition, high);
            }
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
            topic: topic.into(),
            pending,
            reported: false,
        })
    }

    fn into_stream(self) -> impl Stream<Item = Result<Input>> + Send + 'static {
        stream::unfold(self, |mut reader| async move {
            let item = reader.next().await;
            Some((item, reader))
        })
    }

    /// The next input: a record, an error, or (once) the news that every partition caught up.
    async fn next(&mut self) -> Result<Input> {
        loop {
            if self.pending.is_empty() && !self.reported {
                self.reported = true;
                return Ok(Input::CaughtUp);
            }
            match self.consumer.recv().await {
                Ok(message) => {
                    let partition = message.partition();
                    if self
                        .pending
                        .get(&partition)
                        .is_some_and(|end| message.offset() + 1 >= *end)
                    {
                        self.pending.remove(&partition);
                    }
                    return record(&self.topic, &message).map(Input::Record);
                }
                // The end of a partition as it is now. For read_committed that is its last
                // stable offset, which stops before a transaction still open (another
                // producer's, or one a dead producer left): records committed after it are not
                // read yet. Caught up only once reading passed the end the partition had at
                // start.
                Err(KafkaError::PartitionEOF(partition)) => {
                    if let Some(end) = self.pending.get(&partition).copied()
                        && self.stable_end(partition).await >= end
                    {
                        self.pending.remove(&partition);
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

/// Decodes one record: an event, or a tombstone (null value).
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
    let event =
        event::decode(Binding::Kafka, headers, payload).map_err(|source| Error::Decode {
            topic: topic.into(),
            partition: message.partition(),
            offset: message.offset(),
            source,
        })?;
    Ok(Record::Event {
        destination: topic.into(),
        event: Box::new(event),
    })
}
