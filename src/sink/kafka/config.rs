//! The Kafka client's settings from the validated `sink.kafka` section: the producer settings the
//! delivery guarantees rest on, secrets read from `propertyFiles`, the consumer settings derived
//! from them, and the start-up check that the brokers accept this client's TLS and credentials.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};
use tracing::{info, warn};

use super::KafkaConfig;
use super::error::Error as SetupError;
use crate::sink::Result;

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
        let field = format!("sink.kafka.propertyFiles.{key}");
        c.set(key, crate::secret::read(&field, path)?);
    }
    Ok(c)
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
        .map_err(SetupError::Client)?;
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
        Err(Refusal { tls, reason }) => Err(SetupError::Refused {
            fields: refused_fields(config, tls),
            what: if tls {
                "could not complete the TLS handshake"
            } else {
                "refused the credentials"
            },
            servers: config.bootstrap_servers.clone(),
            reason,
        }
        .into()),
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
pub(super) fn consumer_settings(producer: ClientConfig) -> ClientConfig {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ContentMode;

    #[test]
    fn user_properties_pass_through_but_guarantees_stay() {
        let cfg = KafkaConfig {
            bootstrap_servers: "127.0.0.1:9092".into(),
            topic: "t".into(),
            content_mode: ContentMode::Binary,
            properties: [("compression.type".to_string(), "zstd".to_string())].into(),
            property_files: Default::default(),
            transaction_timeout_secs: 60,
            commit_interval_ms: 10,
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
            transaction_timeout_secs: 60,
            commit_interval_ms: 10,
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
