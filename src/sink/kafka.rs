//! Kafka: one idempotent producer (`acks=all`), record key = partition key (the object's uid), so
//! every change of an object lands in one partition, in order.

use std::time::Duration;

use std::collections::HashMap;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, FutureProducer, FutureRecord, Producer, ProducerContext};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use tracing::{info, warn};

use super::{Delivered, Error, Outcome, Pending, Result, ready};
use crate::change::ChangeKind;
use crate::config::{ContentMode, KafkaConfig};
use crate::encode::{DATA_CONTENT_TYPE, Event, STRUCTURED_CONTENT_TYPE};
use crate::template::Template;

/// Errors of committing a transaction.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// A newer producer with the same transactional id exists: this instance must stop.
    #[error("producer fenced by a newer instance with the same transactional id")]
    Fenced,
    /// The broker or client failed.
    #[error("kafka transaction failed")]
    Kafka(#[source] KafkaError),
}

/// How long transactional calls may block.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);

/// The Kafka sink.
pub struct KafkaSink {
    producer: FutureProducer,
    /// The producer's settings, secrets from files included (for consumers and admin clients).
    settings: ClientConfig,
    transactional: bool,
    topic: Template,
    mode: ContentMode,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("topic", &self.topic.to_string())
            .finish_non_exhaustive()
    }
}

/// Producer settings the delivery guarantees rest on; user properties cannot weaken them
/// (validated in `config`). The values of `propertyFiles` are read here, each time.
pub fn producer_config(config: &KafkaConfig) -> Result<ClientConfig> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &config.bootstrap_servers)
        .set("client.id", "kube-event-bridge")
        .set("enable.idempotence", "true")
        .set("acks", "all")
        // Never give up on a message: an unreachable broker pauses the watches behind a bounded
        // queue instead of dropping events.
        .set("message.timeout.ms", "0")
        .set("linger.ms", "5");
    for (k, v) in &config.properties {
        c.set(k, v);
    }
    for (key, path) in &config.property_files {
        c.set(key, read_property_file(key, path)?);
    }
    Ok(c)
}

/// The value of a secret property kept in a file (a mounted Kubernetes Secret): the whole file,
/// without its trailing line break. The value is handed to librdkafka only, never logged.
fn read_property_file(key: &str, path: &std::path::Path) -> Result<String> {
    let mut value = std::fs::read_to_string(path).map_err(|source| Error::KafkaPropertyFile {
        key: key.into(),
        path: path.display().to_string(),
        source,
    })?;
    let kept = value.trim_end_matches(['\n', '\r']).len();
    value.truncate(kept);
    Ok(value)
}

/// How long the start-up check waits for the brokers before going on without them.
const CHECK_TIMEOUT: Duration = Duration::from_secs(20);

/// Checks at start that the brokers accept this client's TLS and credentials, so a wrong password
/// or CA stops the start with the brokers' reason instead of leaving librdkafka to retry it
/// forever behind a healthy-looking process. Brokers that cannot be reached yet are only logged:
/// the producer keeps trying, as it does while running. Also warns once when the properties turn
/// TLS certificate verification off (librdkafka verifies by default).
pub async fn check_brokers(config: &KafkaConfig) -> Result<()> {
    let settings = producer_config(config)?;
    for (property, value) in unverified_tls(&settings) {
        warn!(
            property,
            value,
            "kafka tls certificate verification is turned off: the brokers' identity is not checked"
        );
    }
    let producer: BaseProducer<RefusalContext> = settings
        .create_with_context(RefusalContext::default())
        .map_err(Error::KafkaClient)?;
    let outcome = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + CHECK_TIMEOUT;
        loop {
            let reached = producer
                .client()
                .fetch_metadata(None, Duration::from_millis(500));
            // Serves every queued event (log lines included: one poll with a zero timeout would
            // take only one), so a refusal reaches the context.
            producer.poll(Duration::from_millis(100));
            if let Some(refusal) = producer.context().take() {
                return Err(refusal);
            }
            match reached {
                Ok(_) => return Ok(None),
                Err(e) if std::time::Instant::now() >= deadline => return Ok(Some(e)),
                Err(_) => {}
            }
        }
    })
    .await
    .expect("broker check task");
    match outcome {
        Ok(None) => {
            info!(servers = %config.bootstrap_servers, "kafka brokers accepted the connection");
            Ok(())
        }
        Ok(Some(error)) => {
            warn!(servers = %config.bootstrap_servers, error = %error, "kafka brokers not reachable at start; the producer keeps trying");
            Ok(())
        }
        Err(Refusal { tls, reason }) => Err(Error::KafkaRefused {
            fields: refused_fields(config, tls),
            what: if tls {
                "could not complete the TLS handshake"
            } else {
                "refused the credentials"
            },
            servers: config.bootstrap_servers.clone(),
            reason,
        }),
    }
}

/// The properties of `settings` that turn TLS verification off, with their values.
fn unverified_tls(settings: &ClientConfig) -> Vec<(&'static str, String)> {
    let mut off = Vec::new();
    if let Some(v) = settings.get("enable.ssl.certificate.verification")
        && matches!(v.trim().to_ascii_lowercase().as_str(), "false" | "f" | "0")
    {
        off.push(("enable.ssl.certificate.verification", v.to_string()));
    }
    if let Some(v) = settings.get("ssl.endpoint.identification.algorithm")
        && v.trim().eq_ignore_ascii_case("none")
    {
        off.push(("ssl.endpoint.identification.algorithm", v.to_string()));
    }
    off
}

/// Where the settings behind a refusal come from, as configuration paths.
fn refused_fields(config: &KafkaConfig, tls: bool) -> String {
    let keys: &[&str] = if tls {
        &["ssl.ca.location", "ssl.ca.pem"]
    } else {
        &["sasl.username", "sasl.password", "sasl.oauthbearer.config"]
    };
    let fields: Vec<String> = keys
        .iter()
        .filter_map(|key| {
            if config.property_files.contains_key(*key) {
                Some(format!("sink.kafka.propertyFiles.{key}"))
            } else if config.properties.contains_key(*key) {
                Some(format!("sink.kafka.properties.{key}"))
            } else {
                None
            }
        })
        .collect();
    if fields.is_empty() {
        "sink.kafka.properties".into()
    } else {
        fields.join(", ")
    }
}

/// A refusal no retry can fix, as librdkafka reported it (its text names the broker and carries
/// the broker's reason; librdkafka never puts a secret in it).
#[derive(Debug)]
struct Refusal {
    /// The TLS handshake failed (else: authentication failed).
    tls: bool,
    reason: String,
}

/// Records the first authentication or TLS error librdkafka reports.
#[derive(Default)]
struct RefusalContext {
    refusal: std::sync::Mutex<Option<Refusal>>,
}

impl RefusalContext {
    fn take(&self) -> Option<Refusal> {
        self.refusal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

impl ClientContext for RefusalContext {
    fn error(&self, error: KafkaError, reason: &str) {
        let tls = match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::Authentication) => false,
            Some(RDKafkaErrorCode::SSL) => true,
            _ => {
                warn!(error = %error, reason, "kafka client error during the start-up check");
                return;
            }
        };
        let mut slot = self
            .refusal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        slot.get_or_insert(Refusal {
            tls,
            reason: reason.to_string(),
        });
    }
}

impl ProducerContext for RefusalContext {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

/// Client settings for consumers and admin clients: the user's properties (TLS, SASL) without the
/// producer-only ones, reading committed records only.
pub fn consumer_config(config: &KafkaConfig) -> Result<ClientConfig> {
    Ok(consumer_settings(producer_config(config)?))
}

/// `producer` without the producer-only settings, reading committed records only.
fn consumer_settings(producer: ClientConfig) -> ClientConfig {
    let mut c = producer;
    for key in [
        "enable.idempotence",
        "acks",
        "message.timeout.ms",
        "linger.ms",
        "client.id",
        "compression.type",
        "compression.codec",
    ] {
        c.remove(key);
    }
    c.set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false");
    c
}

impl KafkaSink {
    /// Creates the producer (connections are made lazily by librdkafka).
    pub fn new(config: &KafkaConfig, topic: Template) -> Result<Self> {
        let settings = producer_config(config)?;
        let producer = settings.create().map_err(Error::KafkaClient)?;
        Ok(Self {
            producer,
            settings,
            transactional: false,
            topic,
            mode: config.content_mode,
        })
    }

    /// Creates a transactional producer for one watch: `init_transactions` fences any older
    /// producer with the same id (a previous instance or a deposed leader), then a transaction
    /// is opened for the first events.
    pub async fn new_transactional(
        config: &KafkaConfig,
        topic: Template,
        transactional_id: &str,
    ) -> Result<Self> {
        let settings = producer_config(config)?;
        let producer: FutureProducer = settings
            .clone()
            .set("transactional.id", transactional_id)
            .set("transaction.timeout.ms", "60000")
            .create()
            .map_err(Error::KafkaClient)?;
        let p = producer.clone();
        tokio::task::spawn_blocking(move || {
            p.init_transactions(TRANSACTION_TIMEOUT)?;
            p.begin_transaction()
        })
        .await
        .expect("init_transactions task")
        .map_err(Error::KafkaClient)?;
        Ok(Self {
            producer,
            settings,
            transactional: true,
            topic,
            mode: config.content_mode,
        })
    }

    /// Writes `records` (key, value) to `topic` in the open transaction, commits it (events
    /// and checkpoint become visible to `read_committed` consumers together) and opens the next.
    pub async fn commit_with(
        &self,
        topic: &str,
        records: Vec<(String, Vec<u8>)>,
    ) -> Result<(), CommitError> {
        assert!(
            self.transactional,
            "commit_with needs a transactional producer"
        );
        let records = records.into_iter().map(|(k, v)| (k, Some(v))).collect();
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

    /// Sends `records` in the open transaction, waits for their acknowledgements, commits, and
    /// opens the next transaction if `reopen`.
    async fn write_and_commit(
        &self,
        topic: &str,
        records: Vec<(String, Option<Vec<u8>>)>,
        reopen: bool,
    ) -> Result<(), CommitError> {
        let mut deliveries = Vec::with_capacity(records.len());
        for (key, value) in &records {
            let mut record: FutureRecord<'_, String, Vec<u8>> = FutureRecord::to(topic).key(key);
            if let Some(v) = value {
                record = record.payload(v);
            }
            deliveries.push(
                self.producer
                    .send_result(record)
                    .map_err(|(e, _)| classify_commit(e))?,
            );
        }
        for d in deliveries {
            match d.await {
                Ok(Ok(_)) => {}
                Ok(Err((e, _))) => return Err(classify_commit(e)),
                Err(_) => return Err(CommitError::Kafka(KafkaError::Canceled)),
            }
        }
        let p = self.producer.clone();
        tokio::task::spawn_blocking(move || {
            p.commit_transaction(TRANSACTION_TIMEOUT)?;
            if reopen {
                p.begin_transaction()
            } else {
                Ok(())
            }
        })
        .await
        .expect("commit task")
        .map_err(classify_commit)
    }

    /// Reads a compacted topic (partition 0) to its end with `read_committed` and returns the last
    /// value of every key starting with `prefix`.
    pub async fn read_compacted(
        &self,
        topic: &str,
        prefix: &str,
    ) -> Result<HashMap<String, Vec<u8>>, KafkaError> {
        let mut config = self.consumer_config();
        config.set(
            "group.id",
            format!("kube-event-bridge-checkpoint-{}", std::process::id()),
        );
        let (topic, prefix) = (topic.to_string(), prefix.to_string());
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = config.create()?;
            let (_, high) = consumer.fetch_watermarks(&topic, 0, TRANSACTION_TIMEOUT)?;
            let mut out = HashMap::new();
            if high == 0 {
                return Ok(out);
            }
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&topic, 0, Offset::Beginning)?;
            consumer.assign(&tpl)?;
            let deadline = std::time::Instant::now() + TRANSACTION_TIMEOUT;
            loop {
                if let Some(m) = consumer.poll(Duration::from_millis(200)) {
                    let m = m?;
                    if let Some(key) = m
                        .key()
                        .map(String::from_utf8_lossy)
                        .filter(|k| k.starts_with(&prefix))
                    {
                        match m.payload() {
                            Some(v) => out.insert(key.into_owned(), v.to_vec()),
                            None => out.remove(key.as_ref()),
                        };
                    }
                }
                let position = consumer.position()?;
                let at = position
                    .find_partition(&topic, 0)
                    .and_then(|p| match p.offset() {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    });
                if at.is_some_and(|o| o >= high) {
                    return Ok(out);
                }
                if std::time::Instant::now() > deadline {
                    return Err(KafkaError::MessageConsumption(
                        RDKafkaErrorCode::OperationTimedOut,
                    ));
                }
            }
        })
        .await
        .expect("read task")
    }

    /// Creates `topic` as a compacted single-partition topic if it does not exist.
    pub async fn ensure_compacted_topic(&self, topic: &str) -> Result<(), KafkaError> {
        let admin: AdminClient<DefaultClientContext> = self.consumer_config().create()?;
        let new =
            NewTopic::new(topic, 1, TopicReplication::Fixed(-1)).set("cleanup.policy", "compact");
        let results = admin
            .create_topics(
                [&new],
                &AdminOptions::new().operation_timeout(Some(TRANSACTION_TIMEOUT)),
            )
            .await?;
        for r in results {
            match r {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => return Err(KafkaError::AdminOp(code)),
            }
        }
        Ok(())
    }

    fn consumer_config(&self) -> ClientConfig {
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
    pub async fn send(&self, event: Event) -> Pending {
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
        Box::pin(async move {
            let mut outcome = settle(delivery).await;
            if let (Outcome::Acked, Some(t)) = (&outcome, tombstone) {
                outcome = settle(t).await;
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
        loop {
            match self.producer.send_result(record) {
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
    pub async fn send_raw(&self, topic: &str, key: &str, payload: &[u8]) -> Result<(), String> {
        let headers = OwnedHeaders::new_with_capacity(1).insert(Header {
            key: "content-type",
            value: Some(STRUCTURED_CONTENT_TYPE),
        });
        let record = FutureRecord::to(topic)
            .key(key)
            .payload(payload)
            .headers(headers);
        let delivery = self
            .producer
            .send_result(record)
            .map_err(|(e, _)| e.to_string())?;
        match delivery.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((e, _))) => Err(e.to_string()),
            Err(_) => Err("delivery canceled".into()),
        }
    }

    /// Flushes the producer's queue.
    pub async fn flush(&self, timeout: Duration) {
        let producer = self.producer.clone();
        let flushed = tokio::task::spawn_blocking(move || producer.flush(timeout)).await;
        if let Ok(Err(error)) = flushed {
            warn!(error = %error, "kafka flush incomplete");
        }
    }
}

fn classify_commit(e: KafkaError) -> CommitError {
    let fenced = matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
                | RDKafkaErrorCode::Fenced
        )
    );
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

/// Sorts broker errors into permanent rejections and retries.
pub fn classify(error: &KafkaError) -> Outcome {
    use RDKafkaErrorCode as C;
    if matches!(
        error.rdkafka_error_code(),
        Some(C::ProducerFenced | C::InvalidProducerEpoch | C::Fenced | C::Fatal)
    ) {
        return Outcome::Fatal {
            error: error.to_string(),
        };
    }
    let reason = match error.rdkafka_error_code() {
        Some(C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge) => {
            "too_large"
        }
        Some(
            C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::TransactionalIdAuthorizationFailed,
        ) => "not_authorized",
        Some(C::InvalidTopic | C::InvalidRecord | C::InvalidMessage | C::InvalidRequiredAcks) => {
            "invalid"
        }
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
            Outcome::Rejected {
                reason: "not_authorized",
                ..
            }
        ));
        let transient = KafkaError::MessageProduction(RDKafkaErrorCode::NotEnoughReplicas);
        assert!(matches!(classify(&transient), Outcome::Retry { .. }));
    }

    #[test]
    fn user_properties_pass_through_but_guarantees_stay() {
        let cfg = KafkaConfig {
            bootstrap_servers: "127.0.0.1:9092".into(),
            topic: "t".into(),
            content_mode: ContentMode::Binary,
            properties: [("compression.type".to_string(), "zstd".to_string())].into(),
            property_files: Default::default(),
        };
        let c = producer_config(&cfg).unwrap();
        assert_eq!(c.get("compression.type"), Some("zstd"));
        assert_eq!(c.get("enable.idempotence"), Some("true"));
        assert_eq!(c.get("acks"), Some("all"));
    }

    fn with_files(files: &[(&str, std::path::PathBuf)]) -> KafkaConfig {
        KafkaConfig {
            bootstrap_servers: "127.0.0.1:9092".into(),
            topic: "t".into(),
            content_mode: ContentMode::Binary,
            properties: [("sasl.username".to_string(), "bridge".to_string())].into(),
            property_files: files
                .iter()
                .map(|(k, p)| (k.to_string(), p.clone()))
                .collect(),
        }
    }

    #[test]
    fn property_files_are_read_without_their_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let password = dir.path().join("password");
        std::fs::write(&password, "s3cret with spaces \n").unwrap();
        let jaas = dir.path().join("config");
        std::fs::write(&jaas, "a=b\r\n").unwrap();
        let cfg = with_files(&[
            ("sasl.password", password),
            ("sasl.oauthbearer.config", jaas),
        ]);
        let c = producer_config(&cfg).unwrap();
        assert_eq!(c.get("sasl.password"), Some("s3cret with spaces "));
        assert_eq!(c.get("sasl.oauthbearer.config"), Some("a=b"));
        assert_eq!(c.get("sasl.username"), Some("bridge"));
        let consumer = consumer_config(&cfg).unwrap();
        assert_eq!(consumer.get("sasl.password"), Some("s3cret with spaces "));
        assert_eq!(consumer.get("acks"), None);
    }

    #[test]
    fn only_explicit_properties_turn_tls_verification_off() {
        let mut cfg = with_files(&[]);
        cfg.properties
            .insert("security.protocol".into(), "sasl_ssl".into());
        assert!(unverified_tls(&producer_config(&cfg).unwrap()).is_empty());
        cfg.properties
            .insert("enable.ssl.certificate.verification".into(), "False".into());
        cfg.properties.insert(
            "ssl.endpoint.identification.algorithm".into(),
            "none".into(),
        );
        let off: Vec<&str> = unverified_tls(&producer_config(&cfg).unwrap())
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            off,
            [
                "enable.ssl.certificate.verification",
                "ssl.endpoint.identification.algorithm"
            ]
        );
        cfg.properties
            .insert("enable.ssl.certificate.verification".into(), "true".into());
        cfg.properties.insert(
            "ssl.endpoint.identification.algorithm".into(),
            "https".into(),
        );
        assert!(unverified_tls(&producer_config(&cfg).unwrap()).is_empty());
    }

    #[test]
    fn a_refusal_names_where_its_settings_come_from() {
        let mut cfg = with_files(&[("sasl.password", "/p".into())]);
        assert_eq!(
            refused_fields(&cfg, false),
            "sink.kafka.properties.sasl.username, sink.kafka.propertyFiles.sasl.password"
        );
        assert_eq!(refused_fields(&cfg, true), "sink.kafka.properties");
        cfg.properties
            .insert("ssl.ca.location".into(), "/ca.crt".into());
        assert_eq!(
            refused_fields(&cfg, true),
            "sink.kafka.properties.ssl.ca.location"
        );
    }

    #[test]
    fn an_unreadable_property_file_names_the_field_and_path() {
        let cfg = with_files(&[("sasl.password", "/nonexistent/kafka/password".into())]);
        let e = producer_config(&cfg).unwrap_err();
        assert_eq!(
            e.to_string(),
            "sink.kafka.propertyFiles.sasl.password: cannot read /nonexistent/kafka/password"
        );
        assert!(
            std::error::Error::source(&e).is_some(),
            "the io error is chained"
        );
    }
}
