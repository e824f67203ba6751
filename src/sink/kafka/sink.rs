//! The Kafka sink: one idempotent producer (`acks=all`), record key = partition key (the object's
//! uid), so every change of an object lands in one partition, in order. With checkpoints, every
//! watch gets its own transactional producer, whose transactions carry its events and its
//! checkpoint records together.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use tokio::sync::watch;
use tracing::warn;

use super::config::{consumer_settings, producer_config};
use crate::change::ChangeKind;
use crate::config::{ContentMode, KafkaConfig};
use crate::encode::{DATA_CONTENT_TYPE, Event, STRUCTURED_CONTENT_TYPE};
use crate::sink::{
    Checkpoints, Delivered, Error, Outcome, Pending, Result, Sink, Transactions, ready,
};
use crate::template::Template;

/// Errors of committing, aborting or starting a transaction.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// A newer producer with the same transactional id exists: this instance must stop.
    #[error("producer fenced by a newer instance with the same transactional id")]
    Fenced,
    /// The broker or client failed; the transaction did not commit. Its records must be sent
    /// again after [`KafkaSink::recover`].
    #[error("kafka transaction failed")]
    Kafka(#[source] KafkaError),
}

/// How long transactional calls may block.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);

/// What a transactional producer needs to be made again after a fatal error, and the signal
/// that a delivery failed inside the open transaction.
#[derive(Debug, Clone)]
struct Transactional {
    id: String,
    timeout: Duration,
    /// The least time between the starts of two commits (`sink.kafka.commitIntervalMs`).
    commit_interval: Duration,
    /// Raised (`true`) by a failed delivery inside the open transaction: the transaction is
    /// void, and librdkafka keeps what it had not sent yet (or must send again) queued until it
    /// is aborted, neither sending nor timing it out (`message.timeout.ms` is 0). Whoever waits
    /// for those deliveries in order must abort instead of waiting.
    voided: Arc<watch::Sender<bool>>,
}

/// The Kafka sink.
pub struct KafkaSink {
    /// Replaced as a whole when a fatal error makes it unusable (transactional producers only).
    producer: std::sync::RwLock<FutureProducer>,
    /// The producer's settings, secrets from files included (for consumers and admin clients).
    settings: ClientConfig,
    transactional: Option<Transactional>,
    topic: Template,
    mode: ContentMode,
    /// The validated settings, for the transactional producers of the watches.
    config: KafkaConfig,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("topic", &self.topic.to_string())
            .finish_non_exhaustive()
    }
}

impl KafkaSink {
    /// Creates the producer (connections are made lazily by librdkafka).
    pub fn new(config: &KafkaConfig, topic: Template) -> Result<Self> {
        let settings = producer_config(config)?;
        let producer = settings.create().map_err(Error::KafkaClient)?;
        Ok(Self {
            producer: std::sync::RwLock::new(producer),
            settings,
            transactional: None,
            topic,
            mode: config.content_mode,
            config: config.clone(),
        })
    }

    /// The current producer (a cheap handle).
    fn producer(&self) -> FutureProducer {
        self.producer
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether events are sent in transactions (with the checkpoint records).
    pub fn is_transactional(&self) -> bool {
        self.transactional.is_some()
    }

    /// The transactional producer of one watch, with the settings of this sink: its
    /// transactional id (from `watch_id`) fences an older instance of the same watch.
    pub async fn for_watch(&self, watch_id: &str) -> Result<Self> {
        let id = format!("kube-event-bridge.{watch_id}");
        Self::new_transactional(&self.config, self.topic.clone(), &id).await
    }

    /// Resolves once a delivery failed inside the open transaction (never for a sink without
    /// transactions). The signal stays raised until [`KafkaSink::recover`] has aborted the
    /// transaction and [`KafkaSink::settled_voided`] clears it.
    async fn voided(&self) {
        let Some(t) = &self.transactional else {
            return std::future::pending().await;
        };
        // The sender lives as long as this sink: waiting cannot fail.
        let _ = t.voided.subscribe().wait_for(|raised| *raised).await;
    }

    /// Every delivery of the aborted transaction has settled: the signal is lowered.
    fn settled_voided(&self) {
        if let Some(t) = &self.transactional {
            t.voided.send_replace(false);
        }
    }

    /// Creates a transactional producer for one watch: `init_transactions` fences any older
    /// producer with the same id (a previous instance or a deposed leader), then a transaction
    /// is opened for the first events. The broker aborts a transaction left open longer than
    /// `transaction_timeout` (`sink.kafka.transactionTimeoutSecs`).
    pub async fn new_transactional(
        config: &KafkaConfig,
        topic: Template,
        transactional_id: &str,
    ) -> Result<Self> {
        let settings = producer_config(config)?;
        let transactional = Transactional {
            id: transactional_id.into(),
            timeout: Duration::from_secs(config.transaction_timeout_secs),
            commit_interval: Duration::from_millis(config.commit_interval_ms),
            voided: Arc::new(watch::channel(false).0),
        };
        let producer = start_transactional(&settings, &transactional)
            .await
            .map_err(Error::KafkaClient)?;
        Ok(Self {
            producer: std::sync::RwLock::new(producer),
            settings,
            transactional: Some(transactional),
            topic,
            mode: config.content_mode,
            config: config.clone(),
        })
    }

    /// Brings a transactional producer back to an open, empty transaction after a failed
    /// delivery or commit: the open transaction is aborted (everything sent in it since the last
    /// commit is discarded and must be sent again), and a producer that hit a fatal error is
    /// replaced by a new one with the same transactional id. Fails with
    /// [`CommitError::Fenced`] when another instance owns the id, and with
    /// [`CommitError::Kafka`] while the broker cannot be reached (call again later).
    async fn recover(&self) -> Result<(), CommitError> {
        let Some(transactional) = &self.transactional else {
            return Ok(());
        };
        let producer = self.producer();
        if let Some((code, reason)) = producer.client().fatal_error() {
            if is_fenced(code) {
                return Err(CommitError::Fenced);
            }
            warn!(code = ?code, reason = %reason, "kafka producer failed fatally: creating a new one");
            return self.replace_producer(transactional).await;
        }
        let aborted = tokio::task::spawn_blocking(move || {
            producer.abort_transaction(TRANSACTION_TIMEOUT)?;
            producer.begin_transaction()
        })
        .await
        .expect("abort task");
        match aborted.map_err(classify_commit) {
            Ok(()) => Ok(()),
            Err(CommitError::Fenced) => Err(CommitError::Fenced),
            Err(CommitError::Kafka(e)) if needs_new_producer(&e) => {
                warn!(error = %e, "kafka transaction cannot be aborted: creating a new producer");
                self.replace_producer(transactional).await
            }
            Err(e) => Err(e),
        }
    }

    async fn replace_producer(&self, transactional: &Transactional) -> Result<(), CommitError> {
        let producer = start_transactional(&self.settings, transactional)
            .await
            .map_err(classify_commit)?;
        *self.producer.write().unwrap_or_else(|e| e.into_inner()) = producer;
        Ok(())
    }

    /// Commits the open transaction as it is (events only, no checkpoint record) and opens the
    /// next: used during a long list, so that no transaction outlives the broker's timeout and
    /// memory holds only what the open transaction holds.
    async fn commit(&self) -> Result<(), CommitError> {
        self.write_and_commit("", Vec::new(), true).await
    }

    /// Writes `records` (key, value; `None` is a tombstone) to `topic` in the open transaction,
    /// commits it (events and checkpoint become visible to `read_committed` consumers together)
    /// and opens the next.
    pub async fn commit_with(
        &self,
        topic: &str,
        records: Vec<(String, Option<Vec<u8>>)>,
    ) -> Result<(), CommitError> {
        assert!(
            self.transactional.is_some(),
            "commit_with needs a transactional producer"
        );
        self.write_and_commit(topic, records, true).await
    }

    /// Writes tombstones (`None` values delete a key in a compacted topic) and commits.
    pub async fn commit_tombstones(
        &self,
        topic: &str,
        records: Vec<(String, Option<Vec<u8>>)>,
    ) -> Result<(), CommitError> {
        self.write_and_commit(topic, records, false).await
    }

    /// Sends `records` in the open transaction, commits, and opens the next transaction if
    /// `reopen`. The records' acknowledgements are not awaited one by one: committing flushes
    /// everything the transaction holds (without waiting for `linger.ms`), and fails if any
    /// record of it was not stored, so a commit costs one flush and one `EndTxn` round trip.
    async fn write_and_commit(
        &self,
        topic: &str,
        records: Vec<(String, Option<Vec<u8>>)>,
        reopen: bool,
    ) -> Result<(), CommitError> {
        let producer = self.producer();
        for (key, value) in &records {
            let mut record: FutureRecord<'_, String, Vec<u8>> = FutureRecord::to(topic).key(key);
            if let Some(v) = value {
                record = record.payload(v);
            }
            // The delivery future is dropped: the commit reports a failed record.
            producer
                .send_result(record)
                .map_err(|(e, _)| classify_commit(e))?;
        }
        tokio::task::spawn_blocking(move || {
            wait_until_queue_empty(&producer, TRANSACTION_TIMEOUT);
            producer.commit_transaction(TRANSACTION_TIMEOUT)?;
            if reopen {
                producer.begin_transaction()
            } else {
                Ok(())
            }
        })
        .await
        .expect("commit task")
        .map_err(classify_commit)
    }

    /// Client settings for consumers and admin clients (the checkpoint topic): the producer's
    /// settings, secrets from files included, without the producer-only ones.
    pub(crate) fn consumer_config(&self) -> ClientConfig {
        consumer_settings(self.settings.clone())
    }

    /// The topic for `event`.
    pub fn topic_for(&self, event: &Event) -> String {
        event
            .info
            .destination
            .as_ref()
            .unwrap_or(&self.topic)
            .render_topic(&event.template_values())
    }

    /// Enqueues `event`; waits while librdkafka's queue is full.
    async fn publish(&self, event: Event) -> Pending {
        let topic = self.topic_for(&event);
        let structured;
        let (payload, headers) = match self.mode {
            ContentMode::Binary => {
                let mut h = OwnedHeaders::new_with_capacity(20).insert(Header {
                    key: "content-type",
                    value: Some(DATA_CONTENT_TYPE),
                });
                for (name, value) in event.attributes() {
                    h = h.insert(Header {
                        key: &format!("ce_{name}"),
                        value: Some(value),
                    });
                }
                (&event.data[..], h)
            }
            ContentMode::Structured => {
                structured = event.to_structured_json();
                let h = OwnedHeaders::new_with_capacity(1).insert(Header {
                    key: "content-type",
                    value: Some(STRUCTURED_CONTENT_TYPE),
                });
                (&structured[..], h)
            }
        };
        let record = FutureRecord::to(&topic)
            .key(event.key())
            .payload(payload)
            .headers(headers);
        let delivery = match self.enqueue(record).await {
            Ok(d) => d,
            Err(error) => return ready(event, classify(&error)),
        };
        // A tombstone right behind the delete (same key, so same partition and order): a
        // compacted topic then forgets the object.
        let tombstone = if event.kind == ChangeKind::Deleted && event.info.tombstones {
            let record: FutureRecord<'_, str, [u8]> = FutureRecord::to(&topic).key(event.key());
            match self.enqueue(record).await {
                Ok(d) => Some(d),
                Err(error) => return ready(event, classify(&error)),
            }
        } else {
            None
        };
        let voided = self.transactional.as_ref().map(|t| t.voided.clone());
        Box::pin(async move {
            let mut outcome = settle(delivery).await;
            if let (Outcome::Acked, Some(t)) = (&outcome, tombstone) {
                outcome = settle(t).await;
            }
            if let (false, Some(voided)) = (matches!(outcome, Outcome::Acked), voided) {
                voided.send_replace(true);
            }
            Delivered { event, outcome }
        })
    }

    /// Hands one record to librdkafka, waiting while its queue is full.
    async fn enqueue<K, P>(
        &self,
        mut record: FutureRecord<'_, K, P>,
    ) -> Result<rdkafka::producer::DeliveryFuture, KafkaError>
    where
        K: rdkafka::message::ToBytes + ?Sized,
        P: rdkafka::message::ToBytes + ?Sized,
    {
        let producer = self.producer();
        loop {
            match producer.send_result(record) {
                Ok(delivery) => return Ok(delivery),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((error, _)) => return Err(error),
            }
        }
    }

    /// Sends one structured CloudEvent to `topic` and waits for its acknowledgement.
    async fn publish_raw(&self, topic: &str, key: &str, payload: &[u8]) -> Result<()> {
        let headers = OwnedHeaders::new_with_capacity(1).insert(Header {
            key: "content-type",
            value: Some(STRUCTURED_CONTENT_TYPE),
        });
        let record = FutureRecord::to(topic)
            .key(key)
            .payload(payload)
            .headers(headers);
        let failed = |error: KafkaError| Error::Publish {
            destination: topic.to_string(),
            source: Box::new(error),
        };
        let delivery = self
            .producer()
            .send_result(record)
            .map_err(|(e, _)| failed(e))?;
        match delivery.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((e, _))) => Err(failed(e)),
            Err(_) => Err(failed(KafkaError::Canceled)),
        }
    }

    /// Flushes the producer's queue.
    async fn flush_queue(&self, timeout: Duration) {
        let producer = self.producer();
        let flushed = tokio::task::spawn_blocking(move || producer.flush(timeout)).await;
        if let Ok(Err(error)) = flushed {
            warn!(error = %error, "kafka flush incomplete");
        }
    }
}

impl Sink for KafkaSink {
    fn name(&self) -> &'static str {
        "kafka"
    }

    fn send(&self, event: Event) -> BoxFuture<'_, Pending> {
        Box::pin(self.publish(event))
    }

    fn send_raw<'a>(
        &'a self,
        destination: &'a str,
        key: &'a str,
        payload: Vec<u8>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.publish_raw(destination, key, &payload).await })
    }

    fn flush(&self, timeout: Duration) -> BoxFuture<'_, ()> {
        Box::pin(self.flush_queue(timeout))
    }

    /// The idempotent producer keeps order within a partition across its own retries.
    fn ordered_in_flight(&self) -> bool {
        true
    }

    fn transactions(&self) -> Option<&dyn Transactions> {
        self.transactional
            .as_ref()
            .map(|_| self as &dyn Transactions)
    }

    fn checkpoints(&self) -> Checkpoints<'_> {
        Checkpoints::KafkaTopic(self)
    }
}

impl Transactions for KafkaSink {
    fn voided(&self) -> BoxFuture<'_, ()> {
        Box::pin(KafkaSink::voided(self))
    }

    fn settled_voided(&self) {
        KafkaSink::settled_voided(self);
    }

    fn recover(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move { KafkaSink::recover(self).await.map_err(Error::from) })
    }

    fn commit(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move { KafkaSink::commit(self).await.map_err(Error::from) })
    }

    fn commit_interval(&self) -> Duration {
        self.transactional
            .as_ref()
            .map_or(Duration::ZERO, |t| t.commit_interval)
    }
}

impl From<CommitError> for Error {
    fn from(e: CommitError) -> Self {
        match e {
            CommitError::Fenced => Error::Fenced,
            CommitError::Kafka(source) => Error::Transaction {
                sink: "kafka",
                source: Box::new(source),
            },
        }
    }
}

/// Makes a transactional producer: `init_transactions` (fencing an older producer with the same
/// id, and completing or aborting what it left open), then `begin_transaction`.
async fn start_transactional(
    settings: &ClientConfig,
    transactional: &Transactional,
) -> Result<FutureProducer, KafkaError> {
    let producer: FutureProducer = settings
        .clone()
        .set("transactional.id", &transactional.id)
        .set(
            "transaction.timeout.ms",
            transactional.timeout.as_millis().to_string(),
        )
        .create()?;
    let p = producer.clone();
    tokio::task::spawn_blocking(move || {
        p.init_transactions(TRANSACTION_TIMEOUT)?;
        p.begin_transaction()
    })
    .await
    .expect("init_transactions task")?;
    Ok(producer)
}

/// Codes that mean another producer with the same transactional id took over.
fn is_fenced(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::Fenced
    )
}

/// Whether only a new producer gets out of this error: librdkafka's fatal errors, and "wrong
/// state" (the producer is not where a transaction call expects it, for example after a commit
/// whose outcome was lost), which a new producer's `init_transactions` resolves.
fn needs_new_producer(e: &KafkaError) -> bool {
    match e {
        KafkaError::Transaction(t) => t.is_fatal() || t.code() == RDKafkaErrorCode::State,
        other => matches!(
            other.rdkafka_error_code(),
            Some(RDKafkaErrorCode::Fatal | RDKafkaErrorCode::State)
        ),
    }
}

/// Waits, in steps of 100 µs, until nothing is queued in the producer (records in flight and
/// delivery reports its polling thread has not served yet), or `limit` has passed.
/// rust-rdkafka's `commit_transaction` flushes first, and its flush polls for up to 100 ms
/// whenever anything is still queued: after the last acknowledgement the report is often still
/// being served, so without this wait a commit took 100 ms instead of its round trip (7 ms here).
fn wait_until_queue_empty(producer: &FutureProducer, limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    while producer.in_flight_count() > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(100));
    }
}

fn classify_commit(e: KafkaError) -> CommitError {
    let fenced = match &e {
        KafkaError::Transaction(t) => is_fenced(t.code()),
        other => other.rdkafka_error_code().is_some_and(is_fenced),
    };
    if fenced {
        CommitError::Fenced
    } else {
        CommitError::Kafka(e)
    }
}

async fn settle(delivery: rdkafka::producer::DeliveryFuture) -> Outcome {
    match delivery.await {
        Ok(Ok(_)) => Outcome::Acked,
        Ok(Err((error, _))) => classify(&error),
        Err(_) => Outcome::Retry {
            error: "producer dropped the delivery".into(),
        },
    }
}

/// Sorts broker errors into retries, refusals of one event, refusals of every event of a
/// destination (which pause the watch until fixed) and fatal ones.
pub fn classify(error: &KafkaError) -> Outcome {
    use RDKafkaErrorCode as C;
    let code = error.rdkafka_error_code();
    if code.is_some_and(is_fenced) || matches!(code, Some(C::Fatal | C::InvalidProducerEpoch)) {
        return Outcome::Fatal {
            error: error.to_string(),
        };
    }
    let blocked = match code {
        Some(
            C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::TransactionalIdAuthorizationFailed,
        ) => Some("not_authorized"),
        Some(C::UnknownTopicOrPartition | C::UnknownTopic | C::UnknownPartition) => {
            Some("unknown_topic")
        }
        Some(C::InvalidTopic) => Some("invalid_topic"),
        _ => None,
    };
    if matches!(code, Some(C::PurgeQueue | C::PurgeInflight)) {
        return Outcome::Aborted;
    }
    if let Some(reason) = blocked {
        return Outcome::Blocked {
            reason,
            error: error.to_string(),
        };
    }
    let reason = match code {
        Some(C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge) => {
            "too_large"
        }
        Some(C::InvalidRecord | C::InvalidMessage | C::InvalidRequiredAcks) => "invalid",
        _ => {
            return Outcome::Retry {
                error: error.to_string(),
            };
        }
    };
    Outcome::Rejected {
        reason,
        error: error.to_string(),
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        let too_large = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert!(matches!(
            classify(&too_large),
            Outcome::Rejected {
                reason: "too_large",
                ..
            }
        ));
        let denied = KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed);
        assert!(matches!(
            classify(&denied),
            Outcome::Blocked {
                reason: "not_authorized",
                ..
            }
        ));
        let missing = KafkaError::MessageProduction(RDKafkaErrorCode::UnknownTopicOrPartition);
        assert!(matches!(
            classify(&missing),
            Outcome::Blocked {
                reason: "unknown_topic",
                ..
            }
        ));
        let fenced = KafkaError::MessageProduction(RDKafkaErrorCode::Fenced);
        assert!(matches!(classify(&fenced), Outcome::Fatal { .. }));
        assert!(matches!(classify_commit(fenced), CommitError::Fenced));
        let state = KafkaError::MessageProduction(RDKafkaErrorCode::State);
        assert!(needs_new_producer(&state));
        assert!(!needs_new_producer(&too_large));
        let transient = KafkaError::MessageProduction(RDKafkaErrorCode::NotEnoughReplicas);
        assert!(matches!(classify(&transient), Outcome::Retry { .. }));
        for purged in [
            RDKafkaErrorCode::PurgeQueue,
            RDKafkaErrorCode::PurgeInflight,
        ] {
            let purged = KafkaError::MessageProduction(purged);
            assert!(matches!(classify(&purged), Outcome::Aborted));
        }
    }
}
