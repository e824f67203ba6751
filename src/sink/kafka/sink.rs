//! The Kafka sink: one idempotent producer (`acks=all`), record key = partition key (the object's
//! uid), so every change of an object lands in one partition, in order. With checkpoints, the
//! watches share one transactional producer ([`super::group`]), whose transactions carry their
//! events and their checkpoint records together; with sharding, each watch has its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use tracing::warn;

use super::KafkaConfig;
use super::config::{consumer_settings, producer_config};
use super::error::Error as SetupError;
use super::group::{CommitError, Group, Member, Records};
use super::producer::{DeliveryFuture, Producer};
use super::reads::SharedReads;
use crate::change::ChangeKind;
use crate::config::ContentMode;
use crate::encode::{DATA_CONTENT_TYPE, Event, ResourceInfo, STRUCTURED_CONTENT_TYPE, ce_header};
use crate::lease::Validity;
use crate::sink::{
    Checkpoints, Compaction, Delivered, Error, Outcome, Pending, Result, Sink, Transactions, ready,
};
use crate::template::{Template, Values};

/// How watches share transactional producers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sharing {
    /// One producer for every watch of this sink, with this transactional id.
    Sink(String),
    /// One producer per watch, its transactional id made from the watch's (with sharding, where
    /// each watch is fenced on its own).
    Watch,
}

/// The shared transactional producers, by transactional id.
type Groups = Arc<tokio::sync::Mutex<HashMap<String, Weak<Group>>>>;

/// Makes the sinks of watches whose checkpoints are written in their events' transactions (an
/// owned handle on a [`KafkaSink`]'s settings and shared producers, held by the checkpoint
/// stores).
#[derive(Clone)]
pub struct WatchSinks {
    settings: ClientConfig,
    config: KafkaConfig,
    topic: Template,
    groups: Groups,
    reads: Arc<SharedReads>,
}

impl std::fmt::Debug for WatchSinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchSinks")
            .field("topic", &self.topic.to_string())
            .finish_non_exhaustive()
    }
}

impl WatchSinks {
    /// The sink of one watch, with the settings of this sink: its share of the sink's
    /// transactional producer ([`Sharing::Sink`], made by the first watch), or a transactional
    /// producer of its own ([`Sharing::Watch`]). A producer's `init_transactions` fences an
    /// older instance with the same transactional id. `owner` is valid while this process owns
    /// the transactional id (the leader Lease, or with sharding the watch's Lease; `None`
    /// without either): a producer fenced while it does, by the broker aborting a transaction
    /// open past its timeout, is replaced rather than stopped.
    pub async fn for_watch(
        &self,
        watch_id: &str,
        sharing: &Sharing,
        owner: Option<Validity>,
    ) -> Result<KafkaSink> {
        let group = match sharing {
            Sharing::Sink(id) => self.shared_group(id, owner).await?,
            Sharing::Watch => {
                self.start_group(&format!("kube-event-bridge.{watch_id}"), owner)
                    .await?
            }
        };
        let member = group.join();
        Ok(KafkaSink::with(
            self.settings.clone(),
            Some(member),
            &self.config,
            self.topic.clone(),
            self.reads.clone(),
        ))
    }

    /// The group with transactional id `id`, made if no watch holds it (the watches sharing
    /// it share the process's leadership, so the first one's `owner` holds for all).
    async fn shared_group(&self, id: &str, owner: Option<Validity>) -> Result<Arc<Group>> {
        let mut groups = self.groups.lock().await;
        if let Some(group) = groups.get(id).and_then(Weak::upgrade) {
            return Ok(group);
        }
        let group = self.start_group(id, owner).await?;
        groups.insert(id.to_string(), Arc::downgrade(&group));
        Ok(group)
    }

    async fn start_group(&self, id: &str, owner: Option<Validity>) -> Result<Arc<Group>> {
        let timeout = Duration::from_secs(self.config.transaction_timeout_secs);
        Group::start(&self.settings, id, timeout, owner)
            .await
            .map_err(|e| SetupError::Client(e).into())
    }

    /// Client settings for consumers and admin clients (the checkpoint topic), as
    /// [`KafkaSink::consumer_config`].
    pub(crate) fn consumer_config(&self) -> ClientConfig {
        consumer_settings(self.settings.clone())
    }
}

/// The Kafka sink.
pub struct KafkaSink {
    /// The plain producer (without transactions), made at first use.
    plain: Mutex<Option<Producer>>,
    /// The producer's settings, secrets from files included (for consumers and admin clients).
    settings: ClientConfig,
    /// A watch's share of a transactional producer.
    member: Option<Member>,
    topic: Template,
    mode: ContentMode,
    /// The validated settings, for the transactional producers of the watches.
    config: KafkaConfig,
    /// The shared transactional producers, by transactional id.
    groups: Groups,
    /// Reads of the checkpoint topic, shared by the watches loading at once.
    reads: Arc<SharedReads>,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("topic", &self.topic.to_string())
            .field("member", &self.member)
            .finish_non_exhaustive()
    }
}

impl KafkaSink {
    /// Checks the settings; the producer is made at first use (a sink whose watches all use
    /// transactions never makes it).
    pub fn new(config: &KafkaConfig, topic: Template) -> Result<Self> {
        let settings = producer_config(config)?;
        settings
            .create_native_config()
            .map_err(SetupError::Client)?;
        let reads = Arc::default();
        Ok(Self::with(settings, None, config, topic, reads))
    }

    fn with(
        settings: ClientConfig,
        member: Option<Member>,
        config: &KafkaConfig,
        topic: Template,
        reads: Arc<SharedReads>,
    ) -> Self {
        Self {
            plain: Mutex::new(None),
            settings,
            member,
            topic,
            mode: config.content_mode,
            config: config.clone(),
            groups: Groups::default(),
            reads,
        }
    }

    /// Reads of the checkpoint topic, shared by this sink's watches.
    pub fn checkpoint_reads(&self) -> &SharedReads {
        &self.reads
    }

    /// The plain producer, made at first use.
    fn plain(&self) -> Result<Producer, KafkaError> {
        let mut plain = self.plain.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = &*plain {
            return Ok(p.clone());
        }
        let producer = Producer::create(&self.settings)?;
        *plain = Some(producer.clone());
        Ok(producer)
    }

    /// What makes the sinks of watches whose checkpoints go into their transactions
    /// ([`WatchSinks::for_watch`]), for the checkpoint stores to hold.
    pub fn watch_sinks(&self) -> WatchSinks {
        WatchSinks {
            settings: self.settings.clone(),
            config: self.config.clone(),
            topic: self.topic.clone(),
            groups: self.groups.clone(),
            reads: self.reads.clone(),
        }
    }

    /// The transactional id of this watch's producer.
    pub fn transactional_id(&self) -> Option<&str> {
        self.member.as_ref().map(Member::transactional_id)
    }

    /// Brings the shared transactional producer back to an open, empty transaction after a
    /// failed delivery or commit (see [`Member::recover`]), replacing it when it cannot abort or
    /// the broker fenced it for a transaction open past its timeout. Fails with
    /// [`CommitError::Fenced`] when another instance owns the id, and with
    /// [`CommitError::Kafka`] while the broker cannot be reached (call again later).
    async fn recover(&self) -> Result<(), CommitError> {
        match &self.member {
            Some(m) => m.recover().await,
            None => Ok(()),
        }
    }

    /// Writes `records` (key, value; `None` is a tombstone) to `topic` in the open transaction,
    /// and commits it together with the events and records of every watch that sent in it (so
    /// events and checkpoints become visible to `read_committed` consumers together). Committing
    /// flushes everything the transaction holds, and fails if any record of it was not stored.
    pub async fn commit_with(&self, topic: &str, records: Records) -> Result<(), CommitError> {
        let member = self
            .member
            .as_ref()
            .expect("commit_with needs a transactional producer");
        member.commit(topic, records).await
    }

    /// Commits the open transaction as it is (events only, no checkpoint record): used during
    /// a long list, so that no transaction outlives the broker's timeout and memory holds only
    /// what the open transaction holds.
    async fn commit(&self) -> Result<(), CommitError> {
        self.commit_with("", Vec::new()).await
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
                        key: &ce_header(name, '_'),
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
        let (txn, delivery) = match self.enqueue(record).await {
            Ok(Some(sent)) => sent,
            Ok(None) => return ready(event, Outcome::Aborted),
            Err(error) => return ready(event, classify(&error)),
        };
        // A tombstone right behind the delete (same key, so same partition and order): a
        // compacted topic then forgets the object.
        let tombstone = if event.kind == ChangeKind::Deleted && event.info.tombstones {
            let record: FutureRecord<'_, str, [u8]> = FutureRecord::to(&topic).key(event.key());
            match self.enqueue(record).await {
                Ok(Some((_, d))) => Some(d),
                Ok(None) => return ready(event, Outcome::Aborted),
                Err(error) => return ready(event, classify(&error)),
            }
        } else {
            None
        };
        let voids = self.member.as_ref().map(Member::voider);
        Box::pin(async move {
            let mut outcome = settle(delivery).await;
            if let (Outcome::Acked, Some(t)) = (&outcome, tombstone) {
                outcome = settle(t).await;
            }
            if let (false, Some(void), Some(txn)) = (matches!(outcome, Outcome::Acked), voids, txn)
            {
                void(txn);
            }
            Delivered { event, outcome }
        })
    }

    /// Hands one record to librdkafka, waiting while its queue is full; a watch's record goes
    /// into the open transaction (whose number it returns). `None`: the watch must not send
    /// now (a transaction it sent in is doomed; see [`Member::send`]).
    async fn enqueue<K, P>(
        &self,
        mut record: FutureRecord<'_, K, P>,
    ) -> Result<Option<(Option<u64>, DeliveryFuture)>, KafkaError>
    where
        K: rdkafka::message::ToBytes + ?Sized,
        P: rdkafka::message::ToBytes + ?Sized,
    {
        loop {
            let (txn, sent) = match &self.member {
                Some(m) => {
                    let Some(sending) = m.sending().await else {
                        return Ok(None);
                    };
                    let sent = sending.producer().send_result(record);
                    match &sent {
                        Ok(_) => sending.sent(),
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {}
                        Err(_) => sending.refused(),
                    }
                    (Some(sending.txn()), sent)
                }
                None => (None, self.plain()?.send_result(record)),
            };
            match sent {
                Ok(delivery) => return Ok(Some((txn, delivery))),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((error, _)) => return Err(error),
            }
        }
    }

    /// Sends one structured CloudEvent to `topic` and waits for its acknowledgement (a watch's
    /// goes into the open transaction, visible once it commits).
    async fn publish_raw(&self, topic: &str, key: &str, payload: &[u8]) -> Result<()> {
        let headers = OwnedHeaders::new_with_capacity(1).insert(Header {
            key: "content-type",
            value: Some(STRUCTURED_CONTENT_TYPE),
        });
        let record = FutureRecord::to(topic)
            .key(key)
            .payload(payload)
            .headers(headers);
        let (txn, delivery) = self.enqueue_out_of_band(topic, record).await?;
        self.settle_out_of_band(topic, txn, delivery).await
    }

    /// Hands one out-of-band record for `topic` to librdkafka (in a transaction: the open one).
    pub(super) async fn enqueue_out_of_band<K, P>(
        &self,
        topic: &str,
        record: FutureRecord<'_, K, P>,
    ) -> Result<(Option<u64>, DeliveryFuture)>
    where
        K: rdkafka::message::ToBytes + ?Sized,
        P: rdkafka::message::ToBytes + ?Sized,
    {
        match self.enqueue(record).await {
            Ok(Some(sent)) => Ok(sent),
            Ok(None) => Err(Error::TransactionAborted),
            Err(e) => Err(failed(topic, e)),
        }
    }

    /// Waits for the acknowledgement of an out-of-band record; a failure voids the transaction
    /// it was sent in.
    pub(super) async fn settle_out_of_band(
        &self,
        topic: &str,
        txn: Option<u64>,
        delivery: DeliveryFuture,
    ) -> Result<()> {
        let error = match delivery.await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err((e, _))) => e,
            Err(_) => KafkaError::Canceled,
        };
        if let (Some(m), Some(txn)) = (&self.member, txn) {
            m.voider()(txn);
        }
        Err(failed(topic, error))
    }

    /// Flushes the producer's queue.
    async fn flush_queue(&self, timeout: Duration) {
        let producer = match &self.member {
            Some(m) => m.producer(),
            None => match self.plain.lock().unwrap_or_else(|e| e.into_inner()).clone() {
                Some(p) => p,
                None => return,
            },
        };
        let flushed = tokio::task::spawn_blocking(move || producer.flush(timeout)).await;
        if let Ok(Err(error)) = flushed {
            warn!(error = %error, "kafka flush incomplete");
        }
    }
}

/// An out-of-band record to `topic` was not published.
fn failed(topic: &str, error: KafkaError) -> Error {
    Error::Publish {
        destination: topic.to_string(),
        source: Box::new(error),
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

    fn watch_destination(&self, info: &ResourceInfo, values: &Values<'_>) -> Option<String> {
        let template = info.destination.as_ref().unwrap_or(&self.topic);
        template
            .per_watch(values)
            .then(|| template.render_topic(values))
    }

    fn flush(&self, timeout: Duration) -> BoxFuture<'_, ()> {
        Box::pin(self.flush_queue(timeout))
    }

    /// The idempotent producer keeps order within a partition across its own retries.
    fn ordered_in_flight(&self) -> bool {
        true
    }

    fn compaction(&self) -> Option<&dyn Compaction> {
        Some(self)
    }

    fn transactions(&self) -> Option<&dyn Transactions> {
        self.member.as_ref().map(|_| self as &dyn Transactions)
    }

    fn checkpoints(&self) -> Checkpoints<'_> {
        Checkpoints::KafkaTopic(Box::new(self.watch_sinks()))
    }
}

impl Transactions for KafkaSink {
    fn voided(&self) -> BoxFuture<'_, ()> {
        match &self.member {
            Some(m) => Box::pin(m.voided()),
            None => Box::pin(std::future::pending()),
        }
    }

    fn settled_voided(&self) {
        if let Some(m) = &self.member {
            m.settled_voided();
        }
    }

    fn requested(&self) -> BoxFuture<'_, ()> {
        match &self.member {
            Some(m) => Box::pin(m.requested()),
            None => Box::pin(std::future::pending()),
        }
    }

    fn recover(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move { KafkaSink::recover(self).await.map_err(Error::from) })
    }

    fn commit(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move { KafkaSink::commit(self).await.map_err(Error::from) })
    }

    fn send_now(&self) {
        if let Some(m) = &self.member {
            m.send_now();
        }
    }

    fn commit_interval(&self) -> Duration {
        Duration::from_millis(self.config.commit_interval_ms)
    }
}

impl From<CommitError> for Error {
    fn from(e: CommitError) -> Self {
        match e {
            CommitError::Fenced => Error::Fenced,
            CommitError::Aborted => Error::TransactionAborted,
            CommitError::Kafka(source) | CommitError::TimedOut(source) => Error::Transaction {
                sink: "kafka",
                source: Box::new(source),
            },
        }
    }
}

/// Codes that mean the producer was fenced (see [`super::recovery::fence`] for who did).
fn is_fenced(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::Fenced
    )
}

async fn settle(delivery: DeliveryFuture) -> Outcome {
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
