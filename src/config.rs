//! The bridge's configuration: parsed strictly from YAML, then validated with no I/O.
//!
//! [`ConfigFile`] mirrors the file (unknown keys are errors); [`ConfigFile::validate`] turns it
//! into a [`Config`] or into every problem found, each naming its path
//! (`resources[1].apiVersion: ...`). Resolving resources against a cluster happens later, in
//! [`crate::discovery`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::template::{self, Template, Token};

mod resource;

pub use resource::{
    EventFormat, Exclude, ExcludeConfig, RecordKey, Resource, ResourceConfig, glob, same_objects,
};

/// Errors of reading or validating a configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("cannot read config file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The YAML does not match the configuration's shape.
    #[error("{path}: {message}")]
    Parse {
        /// Where in the document (`resources[0].events[1]`), or `(root)`.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The document parsed but breaks one or more rules.
    #[error("invalid configuration:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The values an integer setting accepts: absurd values are refused at validation, naming the
/// field, instead of overflowing a timer, hanging or spinning at run time. Documented in
/// docs/configuration.md ("Limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// The smallest accepted value.
    pub min: u64,
    /// The largest accepted value.
    pub max: u64,
}

impl Limit {
    /// Records a problem at `path` unless `min <= value <= max`.
    fn check(self, path: &str, value: impl TryInto<u64>, errors: &mut Vec<String>) {
        let value = value.try_into().unwrap_or(u64::MAX);
        if !(self.min..=self.max).contains(&value) {
            errors.push(format!(
                "{path}: {value} is out of range; allowed: {} to {}",
                self.min, self.max
            ));
        }
    }
}

/// A day: rediscovering less often leaves new CRDs unwatched (without a wildcard) for longer.
pub const DISCOVERY_REFRESH_SECS: Limit = Limit {
    min: 1,
    max: 86_400,
};
/// A day: consumers alert on a heartbeat missing for a few intervals.
pub const HEARTBEAT_INTERVAL_SECS: Limit = Limit {
    min: 1,
    max: 86_400,
};
/// An hour: the pod's termination grace period must cover it.
pub const SHUTDOWN_DELAY_SECS: Limit = Limit { min: 0, max: 3_600 };
/// An hour: the pod's termination grace period must cover it. 0 exits without draining.
pub const SHUTDOWN_GRACE_SECS: Limit = Limit { min: 0, max: 3_600 };
/// An hour: a Lease stores whole seconds, and a standby takes over only after it.
pub const LEASE_DURATION_SECS: Limit = Limit { min: 2, max: 3_600 };
/// Ten minutes, and less than the lease duration.
pub const RETRY_PERIOD_SECS: Limit = Limit { min: 1, max: 600 };
/// Ten seconds: each save of a Kafka watch commits the transaction its events were sent in,
/// which must stay well below the transaction timeout.
pub const CHECKPOINT_INTERVAL_MS: Limit = Limit {
    min: 1,
    max: 10_000,
};
/// Requests per second (client-side throttling): 0.01 is one request every 100 s, which
/// already takes minutes to start a handful of watches; above 10,000 there is no throttling.
pub const QPS: (f64, f64) = (0.01, 10_000.0);
/// Requests at once above `qps`.
pub const BURST: Limit = Limit {
    min: 1,
    max: 10_000,
};
/// A day: JetStream keeps every message id of the window in memory.
pub const DUPLICATE_WINDOW_SECS: Limit = Limit {
    min: 1,
    max: 86_400,
};
/// Ten minutes without an acknowledgement is an outage, not a slow server.
pub const ACK_TIMEOUT_SECS: Limit = Limit { min: 1, max: 600 };
/// Changes buffered per watch: a million is beyond any pod's memory already.
pub const QUEUE_CAPACITY: Limit = Limit {
    min: 1,
    max: 1_000_000,
};
/// Publishes awaiting acknowledgement per watch: librdkafka's own queue holds 100,000 messages
/// by default.
pub const MAX_IN_FLIGHT: Limit = Limit {
    min: 1,
    max: 100_000,
};

/// Bytes per watch between the API server and the broker's acknowledgement: from 1 MiB (a few
/// ordinary objects, and the largest object still passes alone) to 64 GiB.
pub const MAX_QUEUE_BYTES: Limit = Limit {
    min: 1 << 20,
    max: 64 << 30,
};
/// Kafka's `transaction.timeout.ms` in seconds: up to the broker's default
/// `transaction.max.timeout.ms` (15 minutes).
pub const TRANSACTION_TIMEOUT_SECS: Limit = Limit { min: 1, max: 900 };

/// The configuration file as written (camelCase keys, unknown keys rejected).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConfigFile {
    /// This cluster's name, carried by every event (`source`, the `cluster` extension, templates).
    pub cluster: String,
    /// How to reach the API server; default: in-cluster, then `KUBECONFIG` or `~/.kube/config`.
    #[serde(default)]
    pub kubernetes: KubernetesConfig,
    /// The resources to watch.
    pub resources: Vec<ResourceConfig>,
    /// Where events go: exactly one of `kafka`, `nats`, `stdout`; default `stdout`.
    #[serde(default)]
    pub sink: SinkConfig,
    /// Buffering between the watches and the sink.
    #[serde(default)]
    pub delivery: DeliveryConfig,
    /// Where and how often progress is saved.
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
    /// What the first start (no checkpoint yet) publishes: `initial` (every existing object, marked
    /// `origin=snapshot`) or `none` (only changes from now on).
    #[serde(default)]
    pub initial_snapshot: SnapshotPolicy,
    /// Run several replicas, one publishing at a time, through a Lease.
    #[serde(default)]
    pub leader_election: LeaderElectionConfig,
    /// The admin server (`/livez`, `/readyz`, `/metrics`).
    #[serde(default)]
    pub admin: AdminConfig,
    /// Periodic heartbeat events per watch, so consumers can tell a quiet resource from a
    /// stalled bridge.
    #[serde(default)]
    pub heartbeat: HeartbeatConfig,
    /// The shape of events: `cloudevents` (default) or `knative` (like Knative
    /// ApiServerSource's); a resource entry may override it.
    #[serde(default)]
    pub event_format: EventFormat,
    /// Dynamic discovery: how often to refresh the list of served resources, which picks up
    /// CRDs and namespaces the watches of CRDs and namespaces missed.
    #[serde(default)]
    pub discovery: DiscoveryConfig,
}

/// Dynamic discovery settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DiscoveryConfig {
    /// Seconds between two full discovery refreshes (CRD changes are also seen within seconds
    /// through a watch on CustomResourceDefinitions when an entry uses a wildcard).
    #[serde(default = "default_discovery_refresh_secs")]
    #[schemars(range(min = DISCOVERY_REFRESH_SECS.min, max = DISCOVERY_REFRESH_SECS.max))]
    pub refresh_secs: u64,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        Self {
            refresh_secs: default_discovery_refresh_secs(),
        }
    }
}

const fn default_discovery_refresh_secs() -> u64 {
    60
}

/// Heartbeat settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HeartbeatConfig {
    /// Publish heartbeats; default false.
    #[serde(default)]
    pub enabled: bool,
    /// Seconds between two heartbeats of one watch.
    #[serde(default = "default_heartbeat_interval_secs")]
    #[schemars(range(min = HEARTBEAT_INTERVAL_SECS.min, max = HEARTBEAT_INTERVAL_SECS.max))]
    pub interval_secs: u64,
    /// Kafka topic or NATS subject (core publish) for heartbeats; `{cluster}` is replaced.
    #[serde(default = "default_heartbeat_destination")]
    pub destination: String,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            interval_secs: default_heartbeat_interval_secs(),
            destination: default_heartbeat_destination(),
        }
    }
}

/// Often enough for a one-minute staleness alert.
const fn default_heartbeat_interval_secs() -> u64 {
    30
}

fn default_heartbeat_destination() -> String {
    "k8s.{cluster}.heartbeats".into()
}

/// Admin server settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AdminConfig {
    /// `host:port` to listen on; default `0.0.0.0:8080` (in a pod, probes and Prometheus reach it).
    #[serde(default = "default_admin_address")]
    pub address: String,
    /// After the first SIGTERM, how long `/readyz` reports 503 while the bridge keeps publishing,
    /// before it stops its watches and drains (a "lame duck" period, so that endpoints and
    /// rollouts see the pod unready before it stops). Default 0: nothing is served through the
    /// bridge's Service, and a delay postpones the handover to a standby replica.
    #[serde(default)]
    #[schemars(range(min = SHUTDOWN_DELAY_SECS.min, max = SHUTDOWN_DELAY_SECS.max))]
    pub shutdown_delay_secs: u64,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            address: default_admin_address(),
            shutdown_delay_secs: 0,
        }
    }
}

fn default_admin_address() -> String {
    "0.0.0.0:8080".into()
}

/// Leader election settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LeaderElectionConfig {
    /// Elect a leader among replicas; default false (a single replica publishes at once).
    #[serde(default)]
    pub enabled: bool,
    /// The Lease name; default `kube-event-bridge-{cluster}`.
    pub lease_name: Option<String>,
    /// The Lease namespace; default `$POD_NAMESPACE`, else `default`.
    pub namespace: Option<String>,
    /// This replica's identity; default `$POD_NAME`, else the host name, with the process id.
    pub identity: Option<String>,
    /// How long a lease stays valid without renewal (client-go's default).
    #[serde(default = "default_lease_duration_secs")]
    #[schemars(range(min = LEASE_DURATION_SECS.min, max = LEASE_DURATION_SECS.max))]
    pub lease_duration_secs: u64,
    /// How often the leader renews and followers retry (client-go's default).
    #[serde(default = "default_retry_period_secs")]
    #[schemars(range(min = RETRY_PERIOD_SECS.min, max = RETRY_PERIOD_SECS.max))]
    pub retry_period_secs: u64,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            lease_name: None,
            namespace: None,
            identity: None,
            lease_duration_secs: default_lease_duration_secs(),
            retry_period_secs: default_retry_period_secs(),
        }
    }
}

const fn default_lease_duration_secs() -> u64 {
    15
}

const fn default_retry_period_secs() -> u64 {
    2
}

/// Checkpoint settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CheckpointConfig {
    /// Save progress, so a restart resumes where the broker's acknowledgements stopped. Default
    /// true; core NATS (no JetStream) cannot checkpoint and must set false.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Kafka: the compacted topic holding checkpoints (created if missing).
    #[serde(default = "default_checkpoint_topic")]
    pub kafka_topic: String,
    /// NATS: the JetStream KV bucket holding checkpoints (created if missing).
    #[serde(default = "default_checkpoint_bucket")]
    pub nats_bucket: String,
    /// stdout: a directory for checkpoint files; omitted, the stdout sink keeps no checkpoint.
    pub directory: Option<PathBuf>,
    /// How often a busy watch saves progress. Default 500 ms: a crash replays at most about that
    /// much; each save of a Kafka watch commits a transaction.
    #[serde(default = "default_checkpoint_interval_ms")]
    #[schemars(range(min = CHECKPOINT_INTERVAL_MS.min, max = CHECKPOINT_INTERVAL_MS.max))]
    pub interval_ms: u64,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            kafka_topic: default_checkpoint_topic(),
            nats_bucket: default_checkpoint_bucket(),
            directory: None,
            interval_ms: default_checkpoint_interval_ms(),
        }
    }
}

fn default_checkpoint_topic() -> String {
    "kube-event-bridge.checkpoints".into()
}

fn default_checkpoint_bucket() -> String {
    "kube-event-bridge".into()
}

const fn default_checkpoint_interval_ms() -> u64 {
    500
}

/// What the first start publishes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum SnapshotPolicy {
    /// Every existing object, once, as `added` with `origin=snapshot`.
    #[default]
    Initial,
    /// Nothing: only changes after the start.
    None,
}

/// How to reach the API server.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubernetesConfig {
    /// Path of a kubeconfig file; default: in-cluster, then `KUBECONFIG` or `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use; default: its current context.
    pub context: Option<String>,
    /// Requests per second the bridge starts against the API server, on average (client-side
    /// throttling; a watch counts once however long it streams). Fractions are allowed.
    #[serde(default = "default_qps")]
    #[schemars(range(min = QPS.0, max = QPS.1))]
    pub qps: f64,
    /// Requests that may start at once after a quiet period, above `qps`.
    #[serde(default = "default_burst")]
    #[schemars(range(min = BURST.min, max = BURST.max))]
    pub burst: u32,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            context: None,
            qps: default_qps(),
            burst: default_burst(),
        }
    }
}

/// Holding its watches, the bridge makes about one request per watch every 290 s; the limit
/// matters at start and when every watch reconnects or relists at once. controller-runtime's and
/// kube-controller-manager's default: 100 watches start (LIST + WATCH each) in under 10 s.
const fn default_qps() -> f64 {
    20.0
}

/// controller-runtime's default; discovery and the first watches start without waiting.
const fn default_burst() -> u32 {
    30
}

/// The sink section: exactly one of its members.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SinkConfig {
    /// Publish to Apache Kafka.
    pub kafka: Option<KafkaConfig>,
    /// Publish to NATS (JetStream or core).
    pub nats: Option<NatsConfig>,
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
}

/// librdkafka's default.
const fn default_transaction_timeout_secs() -> u64 {
    60
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

/// How a CloudEvent is laid out on the wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ContentMode {
    /// Attributes in headers, the object alone in the body.
    #[default]
    Binary,
    /// The whole event as one `application/cloudevents+json` document.
    Structured,
}

/// Buffering between the watches and the sink.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeliveryConfig {
    /// Changes buffered per watch before the watch pauses (backpressure, not loss).
    #[serde(default = "default_queue_capacity")]
    #[schemars(range(min = QUEUE_CAPACITY.min, max = QUEUE_CAPACITY.max))]
    pub queue_capacity: usize,
    /// Publishes awaiting acknowledgement per watch.
    #[serde(default = "default_max_in_flight")]
    #[schemars(range(min = MAX_IN_FLIGHT.min, max = MAX_IN_FLIGHT.max))]
    pub max_in_flight: usize,
    /// Bytes of objects per watch between reading them from the API server and the broker's
    /// acknowledgement (queued, in flight, or in an open Kafka transaction); the watch pauses
    /// while they are spent, so memory follows object sizes, not only event counts. LIST pages
    /// are sized to a quarter of it. An object larger than the whole budget passes alone.
    #[serde(default = "default_max_queue_bytes")]
    #[schemars(range(min = MAX_QUEUE_BYTES.min, max = MAX_QUEUE_BYTES.max))]
    pub max_queue_bytes: usize,
    /// How long SIGTERM waits for in-flight events before exiting.
    #[serde(default = "default_shutdown_grace_secs")]
    #[schemars(range(min = SHUTDOWN_GRACE_SECS.min, max = SHUTDOWN_GRACE_SECS.max))]
    pub shutdown_grace_secs: u64,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        Self {
            queue_capacity: default_queue_capacity(),
            max_in_flight: default_max_in_flight(),
            max_queue_bytes: default_max_queue_bytes(),
            shutdown_grace_secs: default_shutdown_grace_secs(),
        }
    }
}

pub(crate) const fn default_true() -> bool {
    true
}

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

/// About a second of a busy resource: enough to ride out short broker stalls.
const fn default_queue_capacity() -> usize {
    1024
}

/// 64 MiB: thousands of ordinary objects, and a pod memory limit of 512 MiB holds it with room
/// for the index and the broker client.
const fn default_max_queue_bytes() -> usize {
    64 << 20
}

/// Enough to keep a loopback broker busy; bounded so memory stays bounded.
const fn default_max_in_flight() -> usize {
    256
}

/// Kubernetes' default termination grace period is 30 s; leave room for the exit.
const fn default_shutdown_grace_secs() -> u64 {
    25
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The cluster's name.
    pub cluster: String,
    /// How to reach the API server.
    pub kubernetes: KubernetesConfig,
    /// The resources, each with its parsed group and version.
    pub resources: Vec<Resource>,
    /// The one sink.
    pub sink: Sink,
    /// Buffering.
    pub delivery: DeliveryConfig,
    /// Checkpoints.
    pub checkpoint: CheckpointConfig,
    /// First-start snapshot.
    pub initial_snapshot: SnapshotPolicy,
    /// Leader election.
    pub leader_election: LeaderElectionConfig,
    /// Admin server.
    pub admin: AdminConfig,
    /// Heartbeats.
    pub heartbeat: HeartbeatConfig,
    /// Discovery refresh.
    pub discovery: DiscoveryConfig,
}

impl Config {
    /// Whether checkpoints are kept somewhere durable (a broker, or the stdout sink's directory);
    /// they are then tied to the cluster's identity (the uid of namespace `kube-system`).
    pub fn keeps_checkpoints(&self) -> bool {
        self.checkpoint.enabled
            && !(matches!(self.sink, Sink::Stdout) && self.checkpoint.directory.is_none())
    }
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
    /// Standard output.
    Stdout,
}

impl Sink {
    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Sink::Kafka { .. } => "kafka",
            Sink::Nats { .. } => "nats",
            Sink::Stdout => "stdout",
        }
    }
}

/// Properties that must keep the values the delivery guarantees depend on, with the values that
/// keep them (`acks=-1` is librdkafka's other spelling of `all`).
const KAFKA_GUARDED: &[(&str, &[&str])] =
    &[("enable.idempotence", &["true"]), ("acks", &["all", "-1"])];

impl ConfigFile {
    /// Reads and parses a file; errors name the path inside the document.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Parses YAML text.
    pub fn parse(text: &str) -> Result<Self> {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let path = if path == "." { "(root)".into() } else { path };
            // serde_yaml_ng's messages may start with the path too: say it once.
            let message = e.into_inner().to_string();
            let message = match message.strip_prefix(&format!("{path}: ")) {
                Some(rest) => rest.to_string(),
                None => message,
            };
            Error::Parse { path, message }
        })
    }

    /// Checks every rule that needs no cluster and returns the validated config, or every
    /// problem found, each prefixed by its path.
    pub fn validate(self) -> Result<Config> {
        let mut errors = Vec::new();
        if !is_dns_subdomain(&self.cluster) {
            errors.push(format!(
                "cluster: {:?} must be a lowercase DNS name (letters, digits, '-', '.')",
                self.cluster
            ));
        }
        if self.resources.is_empty() {
            errors.push("resources: at least one resource is required".into());
        }
        let resources: Vec<Resource> = self
            .resources
            .iter()
            .cloned()
            .enumerate()
            .filter_map(|(i, r)| {
                resource::validate_resource(i, r, self.event_format, &self.cluster, &mut errors)
            })
            .collect();
        resource::check_overlaps(&resources, &mut errors);
        let sink = validate_sink(self.sink.clone(), &self.cluster, &mut errors);
        if let Some(sink) = &sink {
            resource::check_sink_fields(&resources, sink.kind(), &mut errors);
        }
        self.check_numbers(&mut errors);
        self.check_names(sink.as_ref(), &mut errors);
        if self.admin.address.parse::<std::net::SocketAddr>().is_err() {
            errors.push(format!(
                "admin.address: {:?} is not host:port with an IP address",
                self.admin.address
            ));
        }
        let le = &self.leader_election;
        if le.enabled && le.lease_duration_secs <= le.retry_period_secs {
            errors.push(
                "leaderElection: leaseDurationSecs must be greater than retryPeriodSecs".into(),
            );
        }
        if le.enabled && !self.checkpoint.enabled {
            errors.push("leaderElection.enabled: a new leader resumes from the checkpoint; enable checkpoints".into());
        }
        let c = &self.checkpoint;
        if c.enabled {
            match &sink {
                Some(Sink::Nats { config, .. }) if config.jetstream.is_none() => errors.push(
                    "checkpoint.enabled: core NATS has no acknowledgements to checkpoint; set sink.nats.jetstream or checkpoint.enabled: false".into(),
                ),
                Some(Sink::Kafka { .. } | Sink::Nats { .. }) if c.directory.is_some() => {
                    errors.push("checkpoint.directory: only the stdout sink keeps checkpoint files".into())
                }
                _ => {}
            }
        }
        match sink {
            Some(sink) if errors.is_empty() => Ok(Config {
                cluster: self.cluster,
                kubernetes: self.kubernetes,
                resources,
                sink,
                delivery: self.delivery,
                checkpoint: self.checkpoint,
                initial_snapshot: self.initial_snapshot,
                leader_election: self.leader_election,
                admin: self.admin,
                heartbeat: self.heartbeat,
                discovery: self.discovery,
            }),
            _ => Err(Error::Invalid(errors)),
        }
    }

    /// Every number of the file within its [`Limit`] (settings of a disabled feature too: a
    /// value that would break it when enabled is refused now).
    fn check_numbers(&self, errors: &mut Vec<String>) {
        let d = &self.delivery;
        QUEUE_CAPACITY.check("delivery.queueCapacity", d.queue_capacity, errors);
        MAX_IN_FLIGHT.check("delivery.maxInFlight", d.max_in_flight, errors);
        MAX_QUEUE_BYTES.check("delivery.maxQueueBytes", d.max_queue_bytes, errors);
        SHUTDOWN_GRACE_SECS.check("delivery.shutdownGraceSecs", d.shutdown_grace_secs, errors);
        let qps = self.kubernetes.qps;
        if !(QPS.0..=QPS.1).contains(&qps) {
            // NaN is in no range. Tiny and huge values in scientific notation, as written.
            let shown = if qps == 0.0 || (1e-4..1e15).contains(&qps.abs()) {
                qps.to_string()
            } else {
                format!("{qps:e}")
            };
            errors.push(format!(
                "kubernetes.qps: {shown} is out of range; allowed: {} to {}",
                QPS.0, QPS.1
            ));
        }
        BURST.check("kubernetes.burst", self.kubernetes.burst, errors);
        let le = &self.leader_election;
        let lease = le.lease_duration_secs;
        LEASE_DURATION_SECS.check("leaderElection.leaseDurationSecs", lease, errors);
        let retry = le.retry_period_secs;
        RETRY_PERIOD_SECS.check("leaderElection.retryPeriodSecs", retry, errors);
        let interval = self.checkpoint.interval_ms;
        CHECKPOINT_INTERVAL_MS.check("checkpoint.intervalMs", interval, errors);
        let delay = self.admin.shutdown_delay_secs;
        SHUTDOWN_DELAY_SECS.check("admin.shutdownDelaySecs", delay, errors);
        let heartbeat = self.heartbeat.interval_secs;
        HEARTBEAT_INTERVAL_SECS.check("heartbeat.intervalSecs", heartbeat, errors);
        let refresh = self.discovery.refresh_secs;
        DISCOVERY_REFRESH_SECS.check("discovery.refreshSecs", refresh, errors);
        if let Some(kafka) = &self.sink.kafka {
            let timeout = kafka.transaction_timeout_secs;
            let at = "sink.kafka.transactionTimeoutSecs";
            TRANSACTION_TIMEOUT_SECS.check(at, timeout, errors);
            if self.checkpoint.enabled && interval.saturating_mul(2) > timeout.saturating_mul(1000)
            {
                errors.push(format!(
                    "{at}: {timeout} s must be at least twice checkpoint.intervalMs ({interval} ms): a transaction is committed at every checkpoint"
                ));
            }
        }
        if let Some(js) = self.sink.nats.as_ref().and_then(|n| n.jetstream.as_ref()) {
            let at = "sink.nats.jetstream";
            let ack = js.ack_timeout_secs;
            ACK_TIMEOUT_SECS.check(&format!("{at}.ackTimeoutSecs"), ack, errors);
            let window = js.duplicate_window_secs;
            DUPLICATE_WINDOW_SECS.check(&format!("{at}.duplicateWindowSecs"), window, errors);
        }
    }

    /// The names the sink is given as they are (not templates): the heartbeat destination
    /// (`{cluster}` replaced), the checkpoint topic or bucket.
    fn check_names(&self, sink: Option<&Sink>, errors: &mut Vec<String>) {
        let destination = self
            .heartbeat
            .destination
            .replace("{cluster}", &self.cluster);
        let checkpoint = &self.checkpoint;
        match sink {
            Some(Sink::Kafka { .. }) => {
                if self.heartbeat.enabled
                    && let Err(e) = template::check_topic_name(&destination)
                {
                    errors.push(format!("heartbeat.destination: {e}"));
                }
                if checkpoint.enabled
                    && let Err(e) = template::check_topic_name(&checkpoint.kafka_topic)
                {
                    errors.push(format!("checkpoint.kafkaTopic: {e}"));
                }
            }
            Some(Sink::Nats { .. }) => {
                if self.heartbeat.enabled
                    && let Err(e) = template::check_subject_name(&destination)
                {
                    errors.push(format!("heartbeat.destination: {e}"));
                }
                let bucket = &checkpoint.nats_bucket;
                if checkpoint.enabled && !is_nats_name(bucket) {
                    errors.push(format!(
                        "checkpoint.natsBucket: {bucket:?} must be letters, digits, '_' or '-'"
                    ));
                }
            }
            Some(Sink::Stdout) | None => {}
        }
    }
}

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

fn validate_sink(sink: SinkConfig, cluster: &str, errors: &mut Vec<String>) -> Option<Sink> {
    let count = [
        sink.kafka.is_some(),
        sink.nats.is_some(),
        sink.stdout.is_some(),
    ]
    .iter()
    .filter(|x| **x)
    .count();
    if count > 1 {
        errors.push("sink: exactly one of kafka, nats, stdout may be set".into());
        return None;
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

/// What a template names, and so which rules its rendering must follow.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Destination<'a> {
    /// A Kafka topic of the bridge in cluster `cluster`.
    Topic {
        /// The cluster name (`{cluster}`).
        cluster: &'a str,
    },
    /// A NATS subject.
    Subject,
}

/// Parses the template at `at` and checks that it renders legal names for `destination`.
pub(crate) fn parse_template(
    at: &str,
    text: &str,
    destination: Destination<'_>,
    errors: &mut Vec<String>,
) -> Option<Template> {
    let checked = Template::parse(text).and_then(|t| {
        match destination {
            Destination::Topic { cluster } => t.check_topic(cluster)?,
            Destination::Subject => t.check_subject()?,
        }
        Ok(t)
    });
    match checked {
        Ok(t) if matches!(destination, Destination::Topic { .. }) && t.uses(Token::Name) => {
            errors.push(format!(
                "{at}: {{name}} is not allowed here: one topic per object does not scale"
            ));
            None
        }
        Ok(t) => Some(t),
        Err(e) => {
            errors.push(format!("{at}: {e}"));
            None
        }
    }
}

/// A JetStream stream or KV bucket name: letters, digits, `_` and `-`.
fn is_nats_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

pub(crate) fn is_version(v: &str) -> bool {
    let Some(rest) = v.strip_prefix('v') else {
        return false;
    };
    let digits = rest.chars().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 {
        return false;
    }
    let tail = &rest[digits..];
    tail.is_empty()
        || ["alpha", "beta"].iter().any(|p| {
            tail.strip_prefix(p)
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(yaml: &str) -> String {
        match ConfigFile::parse(yaml).and_then(ConfigFile::validate) {
            Ok(_) => panic!("expected an error for:\n{yaml}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn minimal_config_defaults_to_stdout_and_all_events() {
        let cfg = ConfigFile::parse(
            "cluster: dev\nresources:\n- apiVersion: v1\n  resource: configmaps\n",
        )
        .unwrap()
        .validate()
        .unwrap();
        assert!(matches!(cfg.sink, Sink::Stdout));
        assert_eq!(cfg.resources[0].events.len(), 3);
        assert_eq!(cfg.resources[0].group, "");
        assert!(cfg.resources[0].redact_secret_data);
    }

    #[test]
    fn unknown_keys_name_their_path() {
        let e =
            invalid("cluster: dev\nresources:\n- apiVersion: v1\n  resource: pods\n  lables: x\n");
        assert!(e.starts_with("resources[0]"), "{e}");
        assert!(e.contains("unknown field `lables`"), "{e}");
    }

    #[test]
    fn every_problem_is_reported_with_its_path() {
        let e = invalid(
            "cluster: Dev_1\nresources:\n- apiVersion: apps/x1\n  resource: deployments\n  namespaces: [a, a, B]\n  events: []\n",
        );
        for needle in [
            "cluster: \"Dev_1\"",
            "resources[0].apiVersion: \"apps/x1\"",
            "resources[0].namespaces[1]: \"a\" is listed twice",
            "resources[0].namespaces[2]: \"B\" is not a valid namespace name",
            "resources[0].events: an empty list",
        ] {
            assert!(e.contains(needle), "missing {needle:?} in {e}");
        }
    }

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
    fn two_sinks_are_refused() {
        let e = invalid(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nsink: {stdout: {}, nats: {url: 'nats://x'}}\n",
        );
        assert!(e.contains("sink: exactly one"), "{e}");
    }

    #[test]
    fn overlapping_entries_are_refused() {
        let e = invalid(
            "cluster: dev\nresources:\n- {apiVersion: v1, resource: pods, namespaces: [a]}\n- {apiVersion: v1, resource: pods}\n",
        );
        assert!(
            e.contains("resources[1]: watches the same objects as resources[0]"),
            "{e}"
        );
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

    #[test]
    fn api_rate_limits_default_and_are_checked() {
        let base = "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\n";
        let cfg = ConfigFile::parse(base).unwrap().validate().unwrap();
        assert_eq!((cfg.kubernetes.qps, cfg.kubernetes.burst), (20.0, 30));
        let cfg = ConfigFile::parse(&format!("{base}kubernetes: {{qps: 0.5, burst: 1}}\n"))
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!((cfg.kubernetes.qps, cfg.kubernetes.burst), (0.5, 1));
        let e = invalid(&format!("{base}kubernetes: {{qps: 0, burst: 0}}\n"));
        assert!(
            e.contains("kubernetes.qps: 0 is out of range; allowed: 0.01 to 10000"),
            "{e}"
        );
        assert!(
            e.contains("kubernetes.burst: 0 is out of range; allowed: 1 to 10000"),
            "{e}"
        );
        for (qps, shown) in [
            ("-3", "-3"),
            ("1e-20", "1e-20"),
            (".nan", "NaN"),
            (".inf", "inf"),
            ("-.inf", "-inf"),
            ("1e300", "1e300"),
        ] {
            let e = invalid(&format!("{base}kubernetes: {{qps: {qps}}}\n"));
            assert!(
                e.contains(&format!("kubernetes.qps: {shown} is out of range")),
                "{qps}: {e}"
            );
        }
        let e = invalid(&format!("{base}kubernetes: {{burst: 100000}}\n"));
        assert!(
            e.contains("kubernetes.burst: 100000 is out of range"),
            "{e}"
        );
    }

    /// Every integer setting, the sections it lives in, and the limit it must respect.
    const INTEGERS: &[(&str, &str, Limit)] = &[
        ("delivery", "queueCapacity", QUEUE_CAPACITY),
        ("delivery", "maxInFlight", MAX_IN_FLIGHT),
        ("delivery", "maxQueueBytes", MAX_QUEUE_BYTES),
        ("delivery", "shutdownGraceSecs", SHUTDOWN_GRACE_SECS),
        ("kubernetes", "burst", BURST),
        ("leaderElection", "leaseDurationSecs", LEASE_DURATION_SECS),
        ("leaderElection", "retryPeriodSecs", RETRY_PERIOD_SECS),
        ("checkpoint", "intervalMs", CHECKPOINT_INTERVAL_MS),
        ("admin", "shutdownDelaySecs", SHUTDOWN_DELAY_SECS),
        ("heartbeat", "intervalSecs", HEARTBEAT_INTERVAL_SECS),
        ("discovery", "refreshSecs", DISCOVERY_REFRESH_SECS),
    ];

    const NATS: &str = "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nsink: {nats: {url: 'nats://x', jetstream: {stream: S, ackTimeoutSecs: ACK, duplicateWindowSecs: WINDOW}}}\n";

    #[test]
    fn absurd_integers_are_refused_naming_the_field() {
        let base = "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\n";
        for (section, key, limit) in INTEGERS {
            let path = format!("{section}.{key}");
            for value in [limit.max + 1, 1_000_000_000_000_000_000, u64::MAX] {
                let e = invalid(&format!("{base}{section}: {{{key}: {value}}}\n"));
                let refused = format!(
                    "{path}: {value} is out of range; allowed: {} to {}",
                    limit.min, limit.max
                );
                // Or, beyond the field's type (kubernetes.burst is a u32), a parse error.
                let unparsed = format!("{path}: invalid value: integer `{value}`");
                assert!(e.contains(&refused) || e.starts_with(&unparsed), "{e}");
                assert_eq!(e.matches(&path).count(), 1, "{e}");
            }
            if limit.min > 0 {
                let e = invalid(&format!("{base}{section}: {{{key}: 0}}\n"));
                assert!(e.contains(&format!("{path}: 0 is out of range")), "{e}");
            }
            // The bounds themselves are accepted (a lease must outlast its retry period).
            for value in [limit.min, limit.max] {
                let extra = match *key {
                    "leaseDurationSecs" => ", retryPeriodSecs: 1",
                    "retryPeriodSecs" => ", leaseDurationSecs: 3600",
                    _ => "",
                };
                let yaml = format!("{base}{section}: {{{key}: {value}{extra}}}\n");
                if let Err(e) = ConfigFile::parse(&yaml).unwrap().validate() {
                    panic!("{path}: {value} must be accepted: {e}");
                }
            }
            // Beyond any integer type, and negative: a parse error naming the field.
            for value in ["1e30", "-1", "99999999999999999999999"] {
                let e = invalid(&format!("{base}{section}: {{{key}: {value}}}\n"));
                assert!(e.starts_with(&path), "{e}");
            }
        }
        for (ack, window, needle) in [
            (
                "0",
                "120",
                "sink.nats.jetstream.ackTimeoutSecs: 0 is out of range",
            ),
            (
                "601",
                "120",
                "sink.nats.jetstream.ackTimeoutSecs: 601 is out of range",
            ),
            (
                "10",
                "0",
                "sink.nats.jetstream.duplicateWindowSecs: 0 is out of range",
            ),
            (
                "10",
                "1000000000000000000",
                "sink.nats.jetstream.duplicateWindowSecs: 1000000000000000000 is out of range",
            ),
        ] {
            let e = invalid(&NATS.replace("ACK", ack).replace("WINDOW", window));
            assert!(e.contains(needle), "{e}");
        }
        ConfigFile::parse(&NATS.replace("ACK", "600").replace("WINDOW", "86400"))
            .unwrap()
            .validate()
            .unwrap();
    }

    #[test]
    fn a_kafka_transaction_outlasts_two_checkpoint_intervals() {
        let kafka = |timeout: u64, interval: u64| {
            format!(
                "cluster: dev\nresources: [{{apiVersion: v1, resource: pods}}]\nsink: {{kafka: {{bootstrapServers: 'x:1', transactionTimeoutSecs: {timeout}}}}}\ncheckpoint: {{intervalMs: {interval}}}\n"
            )
        };
        for timeout in [0, 901, 1_000_000_000_000_000_000] {
            let e = invalid(&kafka(timeout, 500));
            assert!(
                e.contains(&format!(
                    "sink.kafka.transactionTimeoutSecs: {timeout} is out of range"
                )),
                "{e}"
            );
        }
        let e = invalid(&kafka(5, 3_000));
        assert!(
            e.contains("sink.kafka.transactionTimeoutSecs: 5 s must be at least twice checkpoint.intervalMs (3000 ms)"),
            "{e}"
        );
        assert!(
            ConfigFile::parse(&kafka(6, 3_000))
                .and_then(ConfigFile::validate)
                .is_ok()
        );
    }

    #[test]
    fn a_lease_must_outlast_its_retry_period() {
        let e = invalid(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nleaderElection: {enabled: true, leaseDurationSecs: 5, retryPeriodSecs: 5}\n",
        );
        assert!(
            e.contains("leaderElection: leaseDurationSecs must be greater than retryPeriodSecs"),
            "{e}"
        );
    }

    #[test]
    fn literal_text_of_topics_and_subjects_is_checked() {
        let kafka = "sink: {kafka: {bootstrapServers: 'x:1', topic: 'TOPIC'}}";
        let resources = "resources:\n- {apiVersion: v1, resource: pods}\n- {apiVersion: v1, resource: configmaps}\n- {apiVersion: v1, resource: secrets, topic: 'OVERRIDE'}\n";
        let e = invalid(&format!(
            "cluster: dev\n{}{}\n",
            resources.replace("OVERRIDE", "cm/{resource}"),
            kafka.replace("TOPIC", "k8s events.{resource}")
        ));
        assert!(
            e.contains("sink.kafka.topic: \"k8s events.\" contains ' ': a Kafka topic name"),
            "{e}"
        );
        assert!(
            e.contains("resources[2].topic: \"cm/\" contains '/'"),
            "{e}"
        );
        for (topic, needle) in [
            (
                "..",
                "sink.kafka.topic: \"..\" is not a legal Kafka topic name",
            ),
            (
                &format!("{}{{cluster}}", "t".repeat(247)),
                "sink.kafka.topic: renders to at least 250 characters",
            ),
        ] {
            let e = invalid(&format!(
                "cluster: dev\nresources: [{{apiVersion: v1, resource: pods}}]\n{}\n",
                kafka.replace("TOPIC", topic)
            ));
            assert!(e.contains(needle), "{e}");
        }

        let nats = "sink: {nats: {url: 'nats://x', subject: 'SUBJECT', jetstream: {stream: s}}}";
        let e = invalid(&format!(
            "cluster: dev\n{}{}\n",
            resources
                .replace("topic", "subject")
                .replace("OVERRIDE", "audit..{name}"),
            nats.replace("SUBJECT", "k8s.*.{name}")
        ));
        assert!(
            e.contains("sink.nats.subject: \"k8s.*.\" contains '*': NATS subjects cannot"),
            "{e}"
        );
        assert!(
            e.contains("resources[2].subject: \"audit..{name}\" has an empty token"),
            "{e}"
        );
        for (subject, needle) in [
            ("k8s.>", "contains '>'"),
            ("k8s {name}", "contains ' '"),
            ("{cluster}.", "has an empty token"),
        ] {
            let e = invalid(&format!(
                "cluster: dev\nresources: [{{apiVersion: v1, resource: pods}}]\n{}\n",
                nats.replace("SUBJECT", subject)
            ));
            assert!(e.contains("sink.nats.subject: "), "{e}");
            assert!(e.contains(needle), "{subject}: {e}");
        }
    }

    #[test]
    fn heartbeat_and_checkpoint_names_are_checked_for_their_sink() {
        let base = "cluster: prod.eu\nresources: [{apiVersion: v1, resource: pods}]\n";
        let kafka = "sink: {kafka: {bootstrapServers: 'x:1'}}\n";
        let e = invalid(&format!(
            "{base}{kafka}heartbeat: {{enabled: true, destination: 'hb {{cluster}}'}}\ncheckpoint: {{kafkaTopic: 'a/b'}}\n"
        ));
        assert!(
            e.contains("heartbeat.destination: \"hb prod.eu\" contains ' '"),
            "{e}"
        );
        assert!(
            e.contains("checkpoint.kafkaTopic: \"a/b\" contains '/'"),
            "{e}"
        );
        // Unused names are not checked: heartbeats off, checkpoints off.
        ConfigFile::parse(&format!(
            "{base}{kafka}heartbeat: {{destination: 'hb x'}}\ncheckpoint: {{enabled: false, kafkaTopic: 'a/b'}}\n"
        ))
        .unwrap()
        .validate()
        .unwrap();

        let nats = "sink: {nats: {url: 'nats://x', jetstream: {stream: s}}}\n";
        let e = invalid(&format!(
            "{base}{nats}heartbeat: {{enabled: true, destination: 'hb.>'}}\ncheckpoint: {{natsBucket: 'a.b'}}\n"
        ));
        assert!(
            e.contains("heartbeat.destination: \"hb.>\" contains '>'"),
            "{e}"
        );
        assert!(
            e.contains("checkpoint.natsBucket: \"a.b\" must be letters, digits"),
            "{e}"
        );
        let cfg = ConfigFile::parse(&format!("{base}{nats}heartbeat: {{enabled: true}}\n"))
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(cfg.heartbeat.destination, "k8s.{cluster}.heartbeats");
    }

    #[test]
    fn versions() {
        for ok in ["v1", "v1beta1", "v2alpha3", "v10"] {
            assert!(is_version(ok), "{ok}");
        }
        for bad in ["1", "v", "vbeta1", "v1beta", "v1gamma1", "V1"] {
            assert!(!is_version(bad), "{bad}");
        }
    }

    /// The decoder of a file this process did not write: arbitrary text, and arbitrary
    /// documents of the configuration's shape, never make `parse` or `validate` panic.
    mod fuzz {
        use proptest::prelude::*;
        use serde_yaml_ng::{Mapping, Value};

        use super::super::ConfigFile;

        /// A few hundred cases per property: fast enough for every CI run.
        fn cases() -> ProptestConfig {
            ProptestConfig {
                cases: 256,
                failure_persistence: None,
                ..ProptestConfig::default()
            }
        }

        /// Parses and, when the shape is right, validates: errors are fine, panics are not.
        fn decode(text: &str) {
            if let Ok(file) = ConfigFile::parse(text) {
                let _ = file.validate();
            }
        }

        /// Every key of the file, so that generated documents reach the validation.
        const KEYS: &[&str] = &[
            "cluster",
            "kubernetes",
            "kubeconfig",
            "context",
            "qps",
            "burst",
            "resources",
            "apiVersion",
            "resource",
            "exclude",
            "namespaces",
            "namespaceSelector",
            "labelSelector",
            "fieldSelector",
            "events",
            "payload",
            "includePrevious",
            "ignorePaths",
            "dropUnchangedUpdates",
            "redact",
            "redactSecretData",
            "stripManagedFields",
            "stripLastApplied",
            "topic",
            "subject",
            "key",
            "tombstones",
            "eventFormat",
            "sink",
            "kafka",
            "bootstrapServers",
            "contentMode",
            "properties",
            "propertyFiles",
            "nats",
            "url",
            "jetstream",
            "stream",
            "create",
            "duplicateWindowSecs",
            "ackTimeoutSecs",
            "credentials",
            "user",
            "passwordFile",
            "stdout",
            "delivery",
            "queueCapacity",
            "maxInFlight",
            "shutdownGraceSecs",
            "checkpoint",
            "enabled",
            "kafkaTopic",
            "natsBucket",
            "directory",
            "intervalMs",
            "initialSnapshot",
            "leaderElection",
            "leaseName",
            "namespace",
            "identity",
            "leaseDurationSecs",
            "retryPeriodSecs",
            "admin",
            "address",
            "shutdownDelaySecs",
            "heartbeat",
            "intervalSecs",
            "destination",
            "discovery",
            "refreshSecs",
        ];

        /// Strings that mean something somewhere in the file, and noise.
        fn text() -> impl Strategy<Value = String> {
            prop_oneof![
                prop::sample::select(vec![
                    "v1",
                    "apps/v1",
                    "*.example.com/*",
                    "example.com/*",
                    "*",
                    "pods",
                    "ConfigMap",
                    "added",
                    "deleted",
                    "full",
                    "diff",
                    "reference",
                    "knative",
                    "uid",
                    "namespacedName",
                    "initial",
                    "none",
                    "/status",
                    "/metadata/name",
                    "{cluster}",
                    "k8s.{cluster}.{group}.{resource}",
                    "{name}",
                    "a..b",
                    ".",
                    "127.0.0.1:0",
                    "x:1",
                    "nats://x",
                    "dev",
                    "",
                    "~1",
                    "{",
                    "}",
                ])
                .prop_map(str::to_string),
                "[a-z0-9{}.*>/ _~-]{0,12}",
                any::<String>(),
            ]
        }

        fn scalar() -> impl Strategy<Value = Value> {
            prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<u64>().prop_map(|n| Value::Number(n.into())),
                any::<i64>().prop_map(|n| Value::Number(n.into())),
                any::<f64>().prop_map(|n| Value::Number(n.into())),
                (0u64..4).prop_map(|n| Value::Number(n.into())),
                text().prop_map(Value::String),
            ]
        }

        /// A YAML value of the configuration's shape: maps keyed mostly by its own keys.
        fn document() -> impl Strategy<Value = Value> {
            scalar().prop_recursive(4, 48, 6, |inner| {
                let key = prop_oneof![
                    4 => prop::sample::select(KEYS).prop_map(str::to_string),
                    1 => text(),
                ];
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Sequence),
                    prop::collection::vec((key, inner), 0..6).prop_map(|entries| {
                        Value::Mapping(
                            entries
                                .into_iter()
                                .map(|(k, v)| (Value::String(k), v))
                                .collect::<Mapping>(),
                        )
                    }),
                ]
            })
        }

        /// What a setting holds, to generate values it parses as (mostly).
        #[derive(Debug, Clone, Copy)]
        enum Kind {
            Integer,
            Float,
            Text,
            Flag,
            Texts,
        }

        /// A value for a setting of `kind`; now and then one of any shape.
        fn value(kind: Kind) -> BoxedStrategy<Value> {
            let typed = match kind {
                Kind::Integer => prop_oneof![
                    any::<u64>(),
                    0u64..4,
                    Just(u64::from(u32::MAX) + 1),
                    Just(1_000_000_000_000_000_000),
                ]
                .prop_map(|n| Value::Number(n.into()))
                .boxed(),
                Kind::Float => prop_oneof![
                    any::<f64>(),
                    Just(f64::NAN),
                    Just(f64::INFINITY),
                    Just(1e-20),
                    Just(-1.0)
                ]
                .prop_map(|n| Value::Number(n.into()))
                .boxed(),
                Kind::Text => text().prop_map(Value::String).boxed(),
                Kind::Flag => any::<bool>().prop_map(Value::Bool).boxed(),
                Kind::Texts => prop::collection::vec(text().prop_map(Value::String), 0..4)
                    .prop_map(Value::Sequence)
                    .boxed(),
            };
            prop_oneof![9 => typed, 1 => document()].boxed()
        }

        /// The settings the mutations replace, with what each holds.
        const SETTINGS: &[(&str, Kind)] = &[
            ("cluster", Kind::Text),
            ("kubernetes.qps", Kind::Float),
            ("kubernetes.burst", Kind::Integer),
            ("resources.0.apiVersion", Kind::Text),
            ("resources.0.resource", Kind::Text),
            ("resources.0.namespaces", Kind::Texts),
            ("resources.0.namespaceSelector", Kind::Text),
            ("resources.0.labelSelector", Kind::Text),
            ("resources.0.events", Kind::Texts),
            ("resources.0.topic", Kind::Text),
            ("resources.0.subject", Kind::Text),
            ("resources.0.ignorePaths", Kind::Texts),
            ("resources.0.redact", Kind::Texts),
            ("resources.0.payload", Kind::Text),
            ("resources.0.includePrevious", Kind::Flag),
            ("resources.0.tombstones", Kind::Flag),
            ("resources.0.key", Kind::Text),
            ("resources.0.exclude.0.resource", Kind::Text),
            ("resources.0.exclude.0.apiVersion", Kind::Text),
            ("resources.1.apiVersion", Kind::Text),
            ("resources.1.resource", Kind::Text),
            ("sink.kafka.topic", Kind::Text),
            ("sink.kafka.bootstrapServers", Kind::Text),
            ("sink.nats.subject", Kind::Text),
            ("sink.nats.jetstream.stream", Kind::Text),
            ("sink.nats.jetstream.ackTimeoutSecs", Kind::Integer),
            ("sink.nats.jetstream.duplicateWindowSecs", Kind::Integer),
            ("delivery.queueCapacity", Kind::Integer),
            ("delivery.maxInFlight", Kind::Integer),
            ("delivery.shutdownGraceSecs", Kind::Integer),
            ("checkpoint.enabled", Kind::Flag),
            ("checkpoint.intervalMs", Kind::Integer),
            ("checkpoint.kafkaTopic", Kind::Text),
            ("checkpoint.natsBucket", Kind::Text),
            ("leaderElection.enabled", Kind::Flag),
            ("leaderElection.leaseDurationSecs", Kind::Integer),
            ("leaderElection.retryPeriodSecs", Kind::Integer),
            ("admin.address", Kind::Text),
            ("admin.shutdownDelaySecs", Kind::Integer),
            ("heartbeat.enabled", Kind::Flag),
            ("heartbeat.intervalSecs", Kind::Integer),
            ("heartbeat.destination", Kind::Text),
            ("discovery.refreshSecs", Kind::Integer),
            ("eventFormat", Kind::Text),
            ("initialSnapshot", Kind::Text),
        ];

        /// A valid file with some of its settings replaced by arbitrary values.
        fn mutated() -> impl Strategy<Value = Value> {
            let change = prop::sample::select(SETTINGS)
                .prop_flat_map(|(path, kind)| (Just(path), value(kind)));
            let sink = prop::sample::select(vec![
                "{kafka: {bootstrapServers: 'x:1'}}",
                "{nats: {url: 'nats://x', jetstream: {stream: s}}}",
                "{stdout: {}}",
            ]);
            (sink, prop::collection::vec(change, 1..4)).prop_map(|(sink, changes)| {
                let mut doc: Value = serde_yaml_ng::from_str(&format!(
                    "cluster: dev\nresources: [{{apiVersion: v1, resource: pods}}]\nsink: {sink}\n"
                ))
                .unwrap();
                for (path, value) in changes {
                    set(&mut doc, path, value);
                }
                doc
            })
        }

        /// Sets `value` at a dotted `path`, making maps (or list items) on the way.
        fn set(doc: &mut Value, path: &str, value: Value) {
            let mut at = doc;
            for part in path.split('.') {
                at = match part.parse::<usize>() {
                    Ok(i) => {
                        if !at.is_sequence() {
                            *at = Value::Sequence(Vec::new());
                        }
                        let list = at.as_sequence_mut().unwrap();
                        while list.len() <= i {
                            list.push(Value::Mapping(Mapping::new()));
                        }
                        &mut list[i]
                    }
                    Err(_) => {
                        if !at.is_mapping() {
                            *at = Value::Mapping(Mapping::new());
                        }
                        let map = at.as_mapping_mut().unwrap();
                        map.entry(Value::String(part.into()))
                            .or_insert(Value::Mapping(Mapping::new()))
                    }
                };
            }
            *at = value;
        }

        proptest! {
            #![proptest_config(cases())]

            #[test]
            fn arbitrary_text_never_panics(text in any::<String>()) {
                decode(&text);
            }

            #[test]
            fn yaml_like_text_never_panics(text in "[a-zA-Z0-9:{}\\[\\],.*&!|>'\"#%@ \n-]{0,200}") {
                decode(&text);
            }

            #[test]
            fn documents_of_the_configs_shape_never_panic(doc in document()) {
                decode(&serde_yaml_ng::to_string(&doc).unwrap());
            }

            #[test]
            fn valid_files_with_arbitrary_settings_never_panic(doc in mutated()) {
                decode(&serde_yaml_ng::to_string(&doc).unwrap());
            }
        }
    }
}
