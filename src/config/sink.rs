//! The `sink` section: exactly one of Kafka, NATS, HTTP or standard output, its settings as
//! written ([`SinkConfig`]) and validated ([`Sink`]: parsed templates, guarded Kafka properties,
//! NATS credentials given in pairs). Without a `sink` section, Knative's `K_SINK` selects an HTTP
//! sink (see `config/http.rs`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::content::ContentMode;
use super::destination::{Destination, parse_template};
use super::http::{Environment, HttpConfig, validate_environment, validate_http};
use super::limits::{
    ACK_TIMEOUT_SECS, COMMIT_INTERVAL_MS, DUPLICATE_WINDOW_SECS, TRANSACTION_TIMEOUT_SECS,
};
use super::names::is_nats_name;
use crate::template::Template;

/// The sink section: exactly one of its members.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SinkConfig {
    /// Publish to Apache Kafka.
    pub kafka: Option<KafkaConfig>,
    /// Publish to NATS (JetStream or core).
    pub nats: Option<NatsConfig>,
    /// POST CloudEvents to an HTTP receiver (CloudEvents HTTP binding): a Knative Broker or
    /// Service, a webhook, a cloud function.
    pub http: Option<HttpConfig>,
    /// Print structured CloudEvents as JSON lines on standard output.
    pub stdout: Option<StdoutConfig>,
}

/// Kafka sink settings.
#[derive(Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KafkaConfig {
    /// Comma-separated `host:port` list.
    pub bootstrap_servers: String,
    /// Topic template; tokens `{cluster}`, `{group}` (`core` for the core group), `{version}`,
    /// `{resource}`, `{namespace}` (`_` for cluster-scoped objects).
    #[serde(default = "default_kafka_topic")]
    pub topic: String,
    /// `binary` (attributes as `ce_` headers) or `structured` (one JSON document).
    #[serde(default)]
    pub content_mode: ContentMode,
    /// Passed to librdkafka as-is (compression, TLS, SASL, ...). Settings that would weaken
    /// delivery (`enable.idempotence`, `acks`) are refused.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// librdkafka properties whose values are read from files at start (mounted Secrets), for
    /// secrets such as `sasl.password`: property name to path. The whole file is the value,
    /// without its trailing line break.
    #[serde(default)]
    pub property_files: BTreeMap<String, PathBuf>,
    /// With checkpoints on, events and checkpoints are written in transactions; the broker
    /// aborts one left open longer than this (`transaction.timeout.ms`). Transactions are
    /// committed at least every `checkpoint.intervalMs`, lists included, so this only matters
    /// while the broker is unreachable (the bridge then aborts and sends again). At most the
    /// broker's `transaction.max.timeout.ms` (default 900).
    #[serde(default = "default_transaction_timeout_secs")]
    #[schemars(range(min = TRANSACTION_TIMEOUT_SECS.min, max = TRANSACTION_TIMEOUT_SECS.max))]
    pub transaction_timeout_secs: u64,
    /// With checkpoints on: the least time between the starts of two transaction commits of one
    /// watch. A watch commits as soon as its previous commit has completed, events are pending
    /// and this much time has passed, each commit carrying the checkpoint of what it holds; a
    /// `read_committed` consumer sees an event once the commit holding it has completed. Larger
    /// values mean fewer, larger transactions and checkpoint writes, and less CPU per event (a
    /// commit costs the same CPU whatever it holds).
    #[serde(default = "default_commit_interval_ms")]
    #[schemars(range(min = COMMIT_INTERVAL_MS.min, max = COMMIT_INTERVAL_MS.max))]
    pub commit_interval_ms: u64,
}

/// librdkafka's default.
const fn default_transaction_timeout_secs() -> u64 {
    60
}

/// 50 milliseconds: events visible to `read_committed` consumers within a few tens of
/// milliseconds, at most twenty commits per second. A commit costs the bridge about the same CPU
/// whatever it holds, so the interval sets the CPU per live event; shorter intervals stop intake
/// more often. The measurements that chose it: docs/benchmarks.md, "Figures behind defaults".
const fn default_commit_interval_ms() -> u64 {
    50
}

/// Properties whose values are secrets: shown as `<redacted>` by `Debug`.
const KAFKA_SECRET_PROPERTIES: &[&str] = &[
    "sasl.password",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.config",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl.keystore.password",
];

impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let properties: BTreeMap<&str, &str> = self
            .properties
            .iter()
            .map(|(k, v)| {
                let secret = KAFKA_SECRET_PROPERTIES.contains(&k.as_str())
                    || k.contains("password")
                    || k.contains("secret");
                (k.as_str(), if secret { "<redacted>" } else { v.as_str() })
            })
            .collect();
        f.debug_struct("KafkaConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("topic", &self.topic)
            .field("content_mode", &self.content_mode)
            .field("properties", &properties)
            .field("property_files", &self.property_files)
            .field("transaction_timeout_secs", &self.transaction_timeout_secs)
            .field("commit_interval_ms", &self.commit_interval_ms)
            .finish()
    }
}

/// NATS sink settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NatsConfig {
    /// Server URL(s), comma-separated.
    pub url: String,
    /// Subject template; tokens as for Kafka topics plus `{name}`, each made subject-safe.
    #[serde(default = "default_nats_subject")]
    pub subject: String,
    /// JetStream settings; omit for core NATS (no acknowledgement, no deduplication).
    pub jetstream: Option<JetStreamConfig>,
    /// `binary` (attributes as `ce-` headers) or `structured`.
    #[serde(default)]
    pub content_mode: ContentMode,
    /// How to authenticate.
    #[serde(default)]
    pub credentials: NatsCredentials,
}

/// JetStream settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JetStreamConfig {
    /// The stream that captures the subjects.
    pub stream: String,
    /// Create the stream if it does not exist.
    #[serde(default)]
    pub create: bool,
    /// Window in which the server drops a message whose `Nats-Msg-Id` it has seen (used when
    /// creating the stream). Default 2 minutes, the server's own default.
    #[serde(default = "default_duplicate_window_secs")]
    #[schemars(range(min = DUPLICATE_WINDOW_SECS.min, max = DUPLICATE_WINDOW_SECS.max))]
    pub duplicate_window_secs: u64,
    /// How long to wait for one publish acknowledgement before publishing again.
    #[serde(default = "default_ack_timeout_secs")]
    #[schemars(range(min = ACK_TIMEOUT_SECS.min, max = ACK_TIMEOUT_SECS.max))]
    pub ack_timeout_secs: u64,
}

/// NATS credentials. Secret values are read from files so they never sit in the config itself.
#[derive(Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NatsCredentials {
    /// User name, with `passwordFile`.
    pub user: Option<String>,
    /// File holding the password.
    pub password_file: Option<PathBuf>,
    /// File holding a token.
    pub token_file: Option<PathBuf>,
    /// File holding an nkey seed.
    pub nkey_seed_file: Option<PathBuf>,
    /// A `.creds` file (JWT and seed).
    pub creds_file: Option<PathBuf>,
    /// CA bundle to verify the server's TLS certificate; implies TLS.
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate, with `tlsKeyFile`.
    pub tls_cert_file: Option<PathBuf>,
    /// Client key, with `tlsCertFile`.
    pub tls_key_file: Option<PathBuf>,
}

impl fmt::Debug for NatsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Paths only, never contents; still, keep the shape small in logs.
        f.debug_struct("NatsCredentials")
            .field("user", &self.user)
            .field("password_file", &self.password_file.is_some())
            .field("token_file", &self.token_file.is_some())
            .field("nkey_seed_file", &self.nkey_seed_file.is_some())
            .field("creds_file", &self.creds_file.is_some())
            .finish_non_exhaustive()
    }
}

/// Standard output sink settings (none yet).
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StdoutConfig {}

fn default_kafka_topic() -> String {
    "k8s.{cluster}.{group}.{resource}".into()
}

fn default_nats_subject() -> String {
    "k8s.{cluster}.{group}.{resource}.{namespace}.{name}".into()
}

/// The JetStream server default, so a created stream behaves like one made by hand.
const fn default_duplicate_window_secs() -> u64 {
    120
}

/// Long enough for a loaded server, short enough to notice a lost ack quickly.
const fn default_ack_timeout_secs() -> u64 {
    10
}

/// The validated sink.
#[derive(Debug, Clone)]
pub enum Sink {
    /// Kafka.
    Kafka {
        /// Settings.
        config: KafkaConfig,
        /// The parsed topic template.
        topic: Template,
    },
    /// NATS.
    Nats {
        /// Settings.
        config: NatsConfig,
        /// The parsed subject template.
        subject: Template,
    },
    /// HTTP.
    Http {
        /// Settings.
        config: HttpConfig,
        /// The parsed URL template.
        url: Template,
    },
    /// Standard output.
    Stdout,
}

impl Sink {
    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Sink::Kafka { .. } => "kafka",
            Sink::Nats { .. } => "nats",
            Sink::Http { .. } => "http",
            Sink::Stdout => "stdout",
        }
    }
}

/// Properties that must keep the values the delivery guarantees depend on, with the values that
/// keep them (`acks=-1` is librdkafka's other spelling of `all`).
const KAFKA_GUARDED: &[(&str, &[&str])] =
    &[("enable.idempotence", &["true"]), ("acks", &["all", "-1"])];

/// The Kafka sink's properties: none may weaken delivery or replace what the bridge sets itself.
fn check_kafka_properties(kafka: &KafkaConfig, errors: &mut Vec<String>) {
    if kafka.bootstrap_servers.trim().is_empty() {
        errors.push("sink.kafka.bootstrapServers: must not be empty".into());
    }
    for (key, accepted) in KAFKA_GUARDED {
        if let Some(v) = kafka.properties.get(*key)
            && !accepted.contains(&v.as_str())
        {
            errors.push(format!(
                "sink.kafka.properties.{key}: {v:?} would weaken delivery; the bridge requires {:?}",
                accepted[0]
            ));
        }
    }
    if kafka
        .properties
        .keys()
        .chain(kafka.property_files.keys())
        .any(|k| k == "transactional.id" || k == "transaction.timeout.ms")
    {
        errors.push(
            "sink.kafka.properties: transactional.id and transaction.timeout.ms are set by the bridge (per watch; sink.kafka.transactionTimeoutSecs)"
                .into(),
        );
    }
    if kafka.properties.contains_key("bootstrap.servers") {
        errors.push(
            "sink.kafka.properties.bootstrap.servers: set sink.kafka.bootstrapServers instead"
                .into(),
        );
    }
    for (key, path) in &kafka.property_files {
        let at = format!("sink.kafka.propertyFiles.{key}");
        if kafka.properties.contains_key(key) {
            errors.push(format!(
                "{at}: also set in sink.kafka.properties; set it in one place"
            ));
        }
        if key == "bootstrap.servers" || KAFKA_GUARDED.iter().any(|(k, _)| k == key) {
            errors.push(format!(
                "{at}: the bridge sets this property itself; it cannot come from a file"
            ));
        }
        if path.as_os_str().is_empty() {
            errors.push(format!("{at}: the path must not be empty"));
        }
    }
}

pub(super) fn validate_sink(
    sink: SinkConfig,
    cluster: &str,
    env: &Environment,
    errors: &mut Vec<String>,
) -> Option<Sink> {
    let count = [
        sink.kafka.is_some(),
        sink.nats.is_some(),
        sink.http.is_some(),
        sink.stdout.is_some(),
    ]
    .iter()
    .filter(|x| **x)
    .count();
    if count > 1 {
        errors.push("sink: exactly one of kafka, nats, http, stdout may be set".into());
        return None;
    }
    if count == 0
        && let Some(config) = env.sink(errors)
    {
        let url = validate_environment(&config, errors)?;
        return Some(Sink::Http { config, url });
    }
    if let Some(config) = sink.http {
        let url = validate_http(&config, errors)?;
        return Some(Sink::Http { config, url });
    }
    if let Some(kafka) = sink.kafka {
        check_kafka_properties(&kafka, errors);
        let topic = parse_template(
            "sink.kafka.topic",
            &kafka.topic,
            Destination::Topic { cluster },
            errors,
        )?;
        return Some(Sink::Kafka {
            config: kafka,
            topic,
        });
    }
    if let Some(nats) = sink.nats {
        if nats.url.trim().is_empty() {
            errors.push("sink.nats.url: must not be empty".into());
        }
        if let Some(js) = &nats.jetstream
            && !is_nats_name(&js.stream)
        {
            errors.push(format!(
                "sink.nats.jetstream.stream: {:?} must be letters, digits, '_' or '-'",
                js.stream
            ));
        }
        let c = &nats.credentials;
        if c.password_file.is_some() != c.user.is_some() {
            errors
                .push("sink.nats.credentials: user and passwordFile must be given together".into());
        }
        if c.tls_cert_file.is_some() != c.tls_key_file.is_some() {
            errors.push(
                "sink.nats.credentials: tlsCertFile and tlsKeyFile must be given together".into(),
            );
        }
        let subject = parse_template(
            "sink.nats.subject",
            &nats.subject,
            Destination::Subject,
            errors,
        )?;
        return Some(Sink::Nats {
            config: nats,
            subject,
        });
    }
    Some(Sink::Stdout)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::{ConfigFile, invalid};

    #[test]
    fn kafka_guarded_properties_are_refused() {
        let e = invalid(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nsink:\n  kafka:\n    bootstrapServers: x:1\n    properties: {acks: \"1\"}\n",
        );
        assert!(e.contains("sink.kafka.properties.acks"), "{e}");
    }

    #[test]
    fn kafka_property_files_are_checked_and_debug_shows_no_secret() {
        let base = "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nsink:\n  kafka:\n    bootstrapServers: x:1\n";
        let cfg = ConfigFile::parse(&format!(
            "{base}    properties: {{sasl.username: bridge, ssl.key.password: hunter2}}\n    propertyFiles: {{sasl.password: /etc/kafka/password}}\n"
        ))
        .unwrap()
        .validate()
        .unwrap();
        let Sink::Kafka { config, .. } = &cfg.sink else {
            panic!("a kafka sink")
        };
        assert_eq!(
            config.property_files["sasl.password"],
            Path::new("/etc/kafka/password")
        );
        let debug = format!("{cfg:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(
            debug.contains("\"ssl.key.password\": \"<redacted>\""),
            "{debug}"
        );
        assert!(debug.contains("\"sasl.username\": \"bridge\""), "{debug}");
        assert!(debug.contains("/etc/kafka/password"), "{debug}");

        let e = invalid(&format!(
            "{base}    properties: {{sasl.password: x}}\n    propertyFiles: {{sasl.password: /p, acks: /a, bootstrap.servers: /b, sasl.username: ''}}\n"
        ));
        for needle in [
            "sink.kafka.propertyFiles.sasl.password: also set in sink.kafka.properties",
            "sink.kafka.propertyFiles.acks: the bridge sets this property itself",
            "sink.kafka.propertyFiles.bootstrap.servers: the bridge sets this property itself",
            "sink.kafka.propertyFiles.sasl.username: the path must not be empty",
        ] {
            assert!(e.contains(needle), "missing {needle:?} in {e}");
        }
    }

    #[test]
    fn acks_minus_one_is_all() {
        ConfigFile::parse(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nsink:\n  kafka:\n    bootstrapServers: x:1\n    properties: {acks: \"-1\"}\n",
        )
        .unwrap()
        .validate()
        .unwrap();
    }

    #[test]
    fn http_sink_is_parsed() {
        let cfg = ConfigFile::parse(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\ncheckpoint: {directory: /var/lib/keb}\nsink: {http: {url: 'https://h/{namespace}', contentMode: structured, credentials: {bearerTokenFile: /t}}}\n",
        )
        .unwrap()
        .validate()
        .unwrap();
        let Sink::Http { config, url } = &cfg.sink else {
            panic!("an http sink")
        };
        assert_eq!(url.to_string(), "https://h/{namespace}");
        assert_eq!(config.content_mode, ContentMode::Structured);
        assert_eq!(config.max_in_flight, 64);
        assert_eq!(config.timeout_secs, 10);
        assert_eq!(cfg.sink.kind(), "http");
    }

    #[test]
    fn two_sinks_are_refused() {
        let e = invalid(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nsink: {stdout: {}, nats: {url: 'nats://x'}}\n",
        );
        assert!(e.contains("sink: exactly one"), "{e}");
    }

    #[test]
    fn bad_topic_token_is_named() {
        let e = invalid(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nsink: {kafka: {bootstrapServers: 'x:1', topic: 'k8s.{clutser}'}}\n",
        );
        assert!(
            e.contains("sink.kafka.topic: unknown token {clutser}"),
            "{e}"
        );
    }
}
