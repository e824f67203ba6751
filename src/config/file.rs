//! The configuration file as written: one struct per section, camelCase keys, unknown keys
//! rejected, and the defaults of every setting (each with the reason for its value).

use std::fmt;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::limits::{
    BURST, CHECKPOINT_INTERVAL_MS, DISCOVERY_REFRESH_SECS, HEARTBEAT_INTERVAL_SECS,
    LEASE_DURATION_SECS, MAX_IN_FLIGHT, MAX_QUEUE_BYTES, MAX_TOTAL_QUEUE_BYTES, QPS,
    QUEUE_CAPACITY, RETRY_PERIOD_SECS, SHARD_LEASE_DURATION_SECS, SHARD_RENEW_SECS,
    SHUTDOWN_DELAY_SECS, SHUTDOWN_GRACE_SECS,
};
use super::resource::{EventFormat, ResourceConfig, default_true};
use super::sink::SinkConfig;

/// The configuration file as written (camelCase keys, unknown keys rejected).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConfigFile {
    /// This cluster's name, carried by every event (`source`, the `cluster` extension, templates).
    /// In a fleet, the name of the bridge's own cluster, where its Leases live.
    pub cluster: String,
    /// How to reach the API server; default: in-cluster, then `KUBECONFIG` or `~/.kube/config`.
    #[serde(default)]
    pub kubernetes: KubernetesConfig,
    /// A fleet: the clusters to watch, each by name and kubeconfig (without one: the bridge's
    /// own cluster). Default: the bridge's own cluster only, named `cluster`.
    #[serde(default)]
    pub clusters: Vec<ClusterEntry>,
    /// A fleet discovered from Cluster API's kubeconfig Secrets in the bridge's own cluster
    /// (`<name>-kubeconfig`, key `value`), followed while the bridge runs.
    pub cluster_secrets: Option<ClusterSecrets>,
    /// The resources to watch.
    pub resources: Vec<ResourceConfig>,
    /// Where events go: exactly one of `kafka`, `nats`, `http`, `stdout`; default `stdout`, or
    /// `http` to `$K_SINK` when that is set (Knative's SinkBinding).
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
    /// Run several replicas that share the watches, each watch owned through a Lease of its own
    /// (exclusive with `leaderElection`).
    #[serde(default)]
    pub sharding: ShardingConfig,
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
    /// Add the audit extensions to every object event: `manager` and `operation` (the field
    /// manager and operation of the newest `managedFields` entry) and `clusterid` (the uid of
    /// namespace `kube-system`, read once at start). Default true.
    #[serde(default = "default_true")]
    pub audit_extensions: bool,
    /// Dynamic discovery: how often to refresh the list of served resources, which picks up
    /// CRDs and namespaces the watches of CRDs and namespaces missed.
    #[serde(default)]
    pub discovery: DiscoveryConfig,
    /// Snapshots on demand: ConfigMaps labelled `kube-event-bridge.dev/snapshot-request=true`
    /// in this namespace ask a running bridge for the current state of one watch's objects.
    #[serde(default)]
    pub snapshot_requests: SnapshotRequestsConfig,
}

/// Where snapshot requests are read.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SnapshotRequestsConfig {
    /// Follow snapshot requests; default true (RBAC: list, watch and patch ConfigMaps in
    /// `namespace`).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// The requests' namespace; default `$POD_NAMESPACE`, else `default`. Set it when
    /// `kube-event-bridge snapshot` runs outside the bridge's pod.
    pub namespace: Option<String>,
}

impl Default for SnapshotRequestsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            namespace: None,
        }
    }
}

impl SnapshotRequestsConfig {
    /// The requests' namespace, with the pod's environment read through `env`.
    pub fn namespace(&self, env: impl Fn(&str) -> Option<String>) -> String {
        self.namespace
            .clone()
            .or_else(|| env("POD_NAMESPACE"))
            .unwrap_or_else(|| "default".into())
    }
}

impl ConfigFile {
    /// `heartbeat.destination` with `{cluster}` replaced.
    pub fn heartbeat_destination(&self) -> String {
        self.heartbeat
            .destination
            .replace("{cluster}", &self.cluster)
    }
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

/// Sharding settings: replicas share the watches, each watch owned through its own Lease.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ShardingConfig {
    /// Share the watches among every replica running this configuration; default false.
    /// Exclusive with `leaderElection.enabled`; needs checkpoints (a new owner resumes from them).
    #[serde(default)]
    pub enabled: bool,
    /// The Leases' namespace; default `$POD_NAMESPACE`, else `default`.
    pub namespace: Option<String>,
    /// The prefix of the Lease names: `{prefix}-m-{hash}` per replica, `{prefix}-w-{hash}` per
    /// watch; default `kube-event-bridge-{cluster}`.
    pub lease_prefix: Option<String>,
    /// This replica's identity; default `$POD_NAME`, else the host name, with the process id.
    pub identity: Option<String>,
    /// How long a replica's Leases stay valid without renewal: a killed replica's watches are
    /// taken over after about this long. Shorter than leader election's default because a
    /// sharded deployment hands off one watch at a time and every replica is already running.
    #[serde(default = "default_shard_lease_duration_secs")]
    #[schemars(range(min = SHARD_LEASE_DURATION_SECS.min, max = SHARD_LEASE_DURATION_SECS.max))]
    pub lease_duration_secs: u64,
    /// How often a replica renews its member Lease (which keeps every watch Lease it holds
    /// valid: one write per period however many watches) and looks again at the assignment:
    /// well below the lease duration, so that a slow renewal or two does not cost the watches.
    #[serde(default = "default_shard_renew_secs")]
    #[schemars(range(min = SHARD_RENEW_SECS.min, max = SHARD_RENEW_SECS.max))]
    pub renew_secs: u64,
}

impl Default for ShardingConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            namespace: None,
            lease_prefix: None,
            identity: None,
            lease_duration_secs: default_shard_lease_duration_secs(),
            renew_secs: default_shard_renew_secs(),
        }
    }
}

/// A killed replica's watches wait this long for a new owner; 10 s keeps that short while a
/// renewal every 2 s may fail four times in a row before a healthy replica loses anything.
const fn default_shard_lease_duration_secs() -> u64 {
    10
}

/// A fifth of the default lease duration.
const fn default_shard_renew_secs() -> u64 {
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
    /// stdout and http: a directory for checkpoint files, local to one replica; omitted (and
    /// without `nats`), the stdout sink keeps no checkpoint, and the http sink refuses to start
    /// while checkpoints are enabled.
    pub directory: Option<PathBuf>,
    /// stdout and http: a JetStream key-value bucket (`natsBucket`) on this NATS server for the
    /// checkpoints, which every replica reaches (leader election and sharding need one).
    pub nats: Option<CheckpointNats>,
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
            nats: None,
            interval_ms: default_checkpoint_interval_ms(),
        }
    }
}

/// A NATS server with JetStream holding the checkpoints of a sink that has no store of its own.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CheckpointNats {
    /// Server URL (`nats://host:4222`, `tls://...`; several separated by commas).
    pub url: String,
    /// How to authenticate, as for `sink.nats.credentials`.
    #[serde(default)]
    pub credentials: NatsCredentials,
}

/// NATS credentials, of the NATS sink and of the NATS checkpoint store. Secret values are read from files so they never sit in the config itself.
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

impl NatsCredentials {
    /// Settings that only work in pairs; problems are named under `at`.
    pub fn check(&self, at: &str, errors: &mut Vec<String>) {
        if self.password_file.is_some() != self.user.is_some() {
            errors.push(format!(
                "{at}: user and passwordFile must be given together"
            ));
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            errors.push(format!(
                "{at}: tlsCertFile and tlsKeyFile must be given together"
            ));
        }
    }

    /// The files secrets are read from.
    pub fn files(&self) -> Vec<PathBuf> {
        [
            &self.password_file,
            &self.token_file,
            &self.nkey_seed_file,
            &self.creds_file,
            &self.tls_ca_file,
            &self.tls_cert_file,
            &self.tls_key_file,
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect()
    }
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

/// One `clusters[]` entry as written.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterEntry {
    /// The cluster's name (a DNS label): the `cluster` attribute of its events and the
    /// `{cluster}` token of destinations.
    pub name: String,
    /// Path of a kubeconfig reaching it; without one, the bridge's own cluster (the
    /// `kubernetes` section).
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use; default: its current context. Only with `kubeconfig`.
    pub context: Option<String>,
    /// Requests per second to this cluster's API server; default `kubernetes.qps`.
    #[schemars(range(min = QPS.0, max = QPS.1))]
    pub qps: Option<f64>,
    /// Requests that may start at once; default `kubernetes.burst`.
    #[schemars(range(min = BURST.min, max = BURST.max))]
    pub burst: Option<u32>,
}

/// `clusterSecrets` as written: where the kubeconfig Secrets of Cluster API's format live.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterSecrets {
    /// The namespace of the Secrets, in the bridge's own cluster.
    pub namespace: String,
    /// Only Secrets with these labels (a label selector); default: every Secret named
    /// `<cluster>-kubeconfig` in the namespace.
    pub label_selector: Option<String>,
}

/// How to reach the API server.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
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
    /// How a watch reads the current state, at start and after lost history: `auto` (a
    /// streaming list where the API server serves one, else a paged LIST), `stream` (a
    /// streaming list only) or `list` (a paged LIST).
    #[serde(default)]
    pub initial_list: InitialList,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            context: None,
            qps: default_qps(),
            burst: default_burst(),
            initial_list: InitialList::default(),
        }
    }
}

/// How a watch reads the current state of its resource (the initial list, and every relist).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum InitialList {
    /// A streaming list (a watch with `sendInitialEvents=true`, KEP-3157) where the API server
    /// serves one; where it refuses (the `WatchList` feature gate off, a server older than
    /// 1.27), a paged LIST, logged once per resource and counted.
    #[default]
    Auto,
    /// A streaming list only: a refusal is a watch failure, retried with backoff.
    Stream,
    /// A paged LIST, as before streaming lists existed.
    List,
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
    /// acknowledgement (queued, in flight, or in an open Kafka transaction), each counted as its
    /// serialized size plus 4 KiB for what its event holds beside it; the watch pauses while they
    /// are spent, so memory follows object sizes, not only event counts. LIST pages are sized to
    /// a quarter of it. An object larger than the whole budget passes alone.
    #[serde(default = "default_max_queue_bytes")]
    #[schemars(range(min = MAX_QUEUE_BYTES.min, max = MAX_QUEUE_BYTES.max))]
    pub max_queue_bytes: usize,
    /// Bytes of objects of every watch together (every cluster of a fleet), counted as for
    /// `maxQueueBytes`: a watch also pauses while these are spent, so the process's memory is
    /// bounded however many watches it runs. A watch that cannot publish holds up to its own
    /// `maxQueueBytes` of it; an object larger than the whole of it passes alone.
    #[serde(default = "default_max_total_queue_bytes")]
    #[schemars(range(min = MAX_TOTAL_QUEUE_BYTES.min, max = MAX_TOTAL_QUEUE_BYTES.max))]
    pub max_total_queue_bytes: usize,
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
            max_total_queue_bytes: default_max_total_queue_bytes(),
            shutdown_grace_secs: default_shutdown_grace_secs(),
        }
    }
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

/// 128 MiB: two watches' worth, so that a watch stuck with its whole budget (its events retried
/// while the others publish) leaves as much again to the others; a thousand watches listing at
/// once stay within it instead of a thousand times one watch's (docs/benchmarks.md, "The cost
/// curve").
const fn default_max_total_queue_bytes() -> usize {
    128 << 20
}

/// Enough that acknowledgements never hold a LIST back (with 256, a Kafka snapshot waited a
/// linger and a round trip for every 256 events; docs/benchmarks.md, "Figures behind defaults").
/// Memory stays bounded by `maxQueueBytes`, which events in flight still hold.
const fn default_max_in_flight() -> usize {
    4096
}

/// Kubernetes' default termination grace period is 30 s; leave room for the exit.
const fn default_shutdown_grace_secs() -> u64 {
    25
}
