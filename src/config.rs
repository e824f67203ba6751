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

use crate::template::{Template, Token};

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
    pub lease_duration_secs: u64,
    /// How often the leader renews and followers retry (client-go's default).
    #[serde(default = "default_retry_period_secs")]
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
    pub qps: f64,
    /// Requests that may start at once after a quiet period, above `qps`.
    #[serde(default = "default_burst")]
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
    pub duplicate_window_secs: u64,
    /// How long to wait for one publish acknowledgement before publishing again.
    #[serde(default = "default_ack_timeout_secs")]
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
    pub queue_capacity: usize,
    /// Publishes awaiting acknowledgement per watch.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Bytes of objects per watch between reading them from the API server and the broker's
    /// acknowledgement (queued, in flight, or in an open Kafka transaction); the watch pauses
    /// while they are spent, so memory follows object sizes, not only event counts. LIST pages
    /// are sized to a quarter of it. An object larger than the whole budget passes alone.
    #[serde(default = "default_max_queue_bytes")]
    pub max_queue_bytes: usize,
    /// How long SIGTERM waits for in-flight events before exiting.
    #[serde(default = "default_shutdown_grace_secs")]
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
        let de = serde_yaml::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let path = if path == "." { "(root)".into() } else { path };
            Error::Parse {
                path,
                message: e.into_inner().to_string(),
            }
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
            .into_iter()
            .enumerate()
            .filter_map(|(i, r)| resource::validate_resource(i, r, self.event_format, &mut errors))
            .collect();
        resource::check_overlaps(&resources, &mut errors);
        let sink = validate_sink(self.sink, &mut errors);
        if let Some(sink) = &sink {
            resource::check_sink_fields(&resources, sink.kind(), &mut errors);
        }
        if self.discovery.refresh_secs == 0 {
            errors.push("discovery.refreshSecs: must be at least 1".into());
        }
        let d = &self.delivery;
        if d.queue_capacity == 0 {
            errors.push("delivery.queueCapacity: must be at least 1".into());
        }
        if !(1 << 20..=64 << 30).contains(&d.max_queue_bytes) {
            errors.push(format!(
                "delivery.maxQueueBytes: {} is out of range (1 MiB to 64 GiB)",
                d.max_queue_bytes
            ));
        }
        if d.max_in_flight == 0 {
            errors.push("delivery.maxInFlight: must be at least 1".into());
        }
        let k = &self.kubernetes;
        if !(k.qps.is_finite() && k.qps > 0.0) {
            errors.push("kubernetes.qps: must be > 0".into());
        }
        if k.burst == 0 {
            errors.push("kubernetes.burst: must be at least 1".into());
        }
        if self.admin.address.parse::<std::net::SocketAddr>().is_err() {
            errors.push(format!(
                "admin.address: {:?} is not host:port with an IP address",
                self.admin.address
            ));
        }
        if self.heartbeat.enabled && self.heartbeat.interval_secs == 0 {
            errors.push("heartbeat.intervalSecs: must be at least 1".into());
        }
        let le = &self.leader_election;
        if le.enabled
            && (le.retry_period_secs == 0 || le.lease_duration_secs <= le.retry_period_secs)
        {
            errors.push("leaderElection: leaseDurationSecs must be greater than retryPeriodSecs, and both at least 1".into());
        }
        if le.enabled && !self.checkpoint.enabled {
            errors.push("leaderElection.enabled: a new leader resumes from the checkpoint; enable checkpoints".into());
        }
        let c = &self.checkpoint;
        if c.interval_ms == 0 {
            errors.push("checkpoint.intervalMs: must be at least 1".into());
        }
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
}

fn validate_sink(sink: SinkConfig, errors: &mut Vec<String>) -> Option<Sink> {
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
        if !(1..=900).contains(&kafka.transaction_timeout_secs) {
            errors.push(format!(
                "sink.kafka.transactionTimeoutSecs: {} is out of range (1 to 900, the broker's default transaction.max.timeout.ms)",
                kafka.transaction_timeout_secs
            ));
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
        let topic = parse_template("sink.kafka.topic", &kafka.topic, false, errors)?;
        return Some(Sink::Kafka {
            config: kafka,
            topic,
        });
    }
    if let Some(nats) = sink.nats {
        if nats.url.trim().is_empty() {
            errors.push("sink.nats.url: must not be empty".into());
        }
        if let Some(js) = &nats.jetstream {
            if js.stream.is_empty()
                || !js
                    .stream
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                errors.push(format!(
                    "sink.nats.jetstream.stream: {:?} must be letters, digits, '_' or '-'",
                    js.stream
                ));
            }
            if js.ack_timeout_secs == 0 {
                errors.push("sink.nats.jetstream.ackTimeoutSecs: must be at least 1".into());
            }
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
        let subject = parse_template("sink.nats.subject", &nats.subject, true, errors)?;
        return Some(Sink::Nats {
            config: nats,
            subject,
        });
    }
    Some(Sink::Stdout)
}

pub(crate) fn parse_template(
    at: &str,
    text: &str,
    allow_name: bool,
    errors: &mut Vec<String>,
) -> Option<Template> {
    match Template::parse(text) {
        Ok(t) if !allow_name && t.uses(Token::Name) => {
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
        assert!(e.contains("kubernetes.qps: must be > 0"), "{e}");
        assert!(e.contains("kubernetes.burst: must be at least 1"), "{e}");
        let e = invalid(&format!("{base}kubernetes: {{qps: -3}}\n"));
        assert!(e.contains("kubernetes.qps: must be > 0"), "{e}");
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
}
