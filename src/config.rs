//! The bridge's configuration: parsed strictly from YAML, then validated with no I/O.
//!
//! [`ConfigFile`] mirrors the file (unknown keys are errors); [`ConfigFile::validate`] turns it
//! into a [`Config`] or into every problem found, each naming its path
//! (`resources[1].apiVersion: ...`). Resolving resources against a cluster happens later, in
//! [`crate::discovery`].
//!
//! The parts: `file` (the sections as written, with their defaults), `resource` (one
//! `resources[]` entry), `sink` (the sink section: each sink kind registers its own settings
//! from its folder under `src/sink/`), `environment` (the process environment a sink kind may
//! read, such as Knative's `K_SINK`), `destination` (topic and subject templates), `limits` (the
//! range of every number), `names` (DNS and broker name rules), `validate` (the rules across
//! sections, and building the [`Config`]).

use std::path::{Path, PathBuf};

mod content;
mod destination;
mod environment;
mod file;
mod fleet;
#[cfg(test)]
mod fuzz;
mod limits;
mod names;
mod resource;
mod sink;
mod validate;

pub use content::ContentMode;
pub use destination::parse_template;
pub use environment::Environment;
pub use file::{
    AdminConfig, CheckpointConfig, CheckpointNats, ConfigFile, DeliveryConfig, DiscoveryConfig,
    HeartbeatConfig, InitialList, KubernetesConfig, LeaderElectionConfig, ShardingConfig,
    SnapshotPolicy, SnapshotRequestsConfig,
};
pub use file::{ClusterEntry, ClusterSecrets, NatsCredentials};
pub use fleet::{Access, ClusterSpec, Fleet};
pub use limits::{
    ACK_TIMEOUT_SECS, BURST, CHECKPOINT_INTERVAL_MS, COMMIT_INTERVAL_MS, DISCOVERY_REFRESH_SECS,
    DUPLICATE_WINDOW_SECS, HEARTBEAT_INTERVAL_SECS, HTTP_MAX_IN_FLIGHT, HTTP_MAX_RETRY_AFTER_SECS,
    HTTP_TIMEOUT_SECS, LEASE_DURATION_SECS, Limit, MAX_IN_FLIGHT, MAX_QUEUE_BYTES,
    MAX_TOTAL_QUEUE_BYTES, QPS, QUEUE_CAPACITY, RETRY_PERIOD_SECS, SHARD_LEASE_DURATION_SECS,
    SHARD_RENEW_SECS, SHUTDOWN_DELAY_SECS, SHUTDOWN_GRACE_SECS, TRANSACTION_TIMEOUT_SECS,
};
pub use names::{is_dns_label, is_nats_name};
pub use resource::{
    EventFormat, Exclude, ExcludeConfig, RecordKey, Resource, ResourceConfig, glob, same_objects,
};
pub use sink::{
    CheckpointSupport, Context, ResourceFields, Section, Sink, SinkConfig, SinkKind, SinkSettings,
    parse_section,
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

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The cluster's name.
    pub cluster: String,
    /// How to reach the API server of the bridge's own cluster.
    pub kubernetes: KubernetesConfig,
    /// The clusters watched: the bridge's own, or a fleet.
    pub fleet: Fleet,
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
    /// Sharing the watches among replicas.
    pub sharding: ShardingConfig,
    /// Admin server.
    pub admin: AdminConfig,
    /// Heartbeats.
    pub heartbeat: HeartbeatConfig,
    /// Discovery refresh.
    pub discovery: DiscoveryConfig,
    /// Snapshot requests.
    pub snapshot_requests: SnapshotRequestsConfig,
    /// The `manager`, `operation` and `clusterid` extensions.
    pub audit_extensions: bool,
}

impl Config {
    /// Whether checkpoints are kept somewhere durable (the sink's broker, or a store apart from
    /// it, which some sinks require);
    /// they are then tied to the cluster's identity (the uid of namespace `kube-system`).
    pub fn keeps_checkpoints(&self) -> bool {
        let c = &self.checkpoint;
        let optional = self.sink.checkpoints() == CheckpointSupport::Apart { required: false };
        c.enabled && !(optional && c.directory.is_none() && c.nats.is_none())
    }

    /// Whether the bridge reads the cluster's identity (the uid of namespace `kube-system`) at
    /// start: to tie checkpoints to it, or for the `clusterid` extension. RBAC must then grant
    /// `get` on that one namespace.
    pub fn reads_cluster_identity(&self) -> bool {
        self.keeps_checkpoints() || self.audit_extensions || self.fleet.is_fleet()
    }

    /// The configuration of one cluster's watches: named `name`, reached through `kubernetes`,
    /// with the resources watched in it.
    pub fn for_cluster(&self, name: &str, kubernetes: KubernetesConfig) -> Config {
        Config {
            cluster: name.to_string(),
            kubernetes,
            resources: self
                .resources
                .iter()
                .filter(|r| r.watched_in(name))
                .cloned()
                .collect(),
            ..self.clone()
        }
    }
}

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
        let mut options = serde_saphyr::Options::default();
        // The message fits one line (`... at line 5, column 3`), without the source snippet.
        options.with_snippet = false;
        // YAML 1.2's booleans only: `yes`, `on` or `y` stay strings, also in sink sections,
        // which are read as generic values before their kind deserializes them.
        options.strict_booleans = true;
        let mut path = None;
        serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
            serde_path_to_error::deserialize(de).map_err(|e| {
                path = Some(e.path().to_string());
                e.into_inner()
            })
        })
        .map_err(|e| Error::Parse {
            path: match path {
                Some(path) if path != "." => path,
                // A syntax error outside any value, or the document's root.
                _ => "(root)".into(),
            },
            message: e.to_string(),
        })
    }
}

/// The message of every problem in `yaml`, which must be refused.
#[cfg(test)]
pub(crate) fn invalid(yaml: &str) -> String {
    match ConfigFile::parse(yaml).and_then(ConfigFile::validate) {
        Ok(_) => panic!("expected an error for:\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_config_defaults_to_stdout_and_all_events() {
        let cfg = ConfigFile::parse(
            "cluster: dev\nresources:\n- apiVersion: v1\n  resource: configmaps\n",
        )
        .unwrap()
        .validate()
        .unwrap();
        assert_eq!(cfg.sink.kind(), "stdout");
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
        assert!(e.ends_with("at line 5, column 3"), "{e}");
    }

    #[test]
    fn only_yaml_1_2_booleans_are_booleans() {
        // `y` is a string (an extension's value), as YAML 1.2 reads it.
        let cfg = ConfigFile::parse(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nsink: {stdout: {extensions: {team: y}}}\n",
        );
        let sink = &cfg.unwrap().sink.0["stdout"];
        assert_eq!(sink["extensions"]["team"], "y");
        let e = invalid(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods, includePrevious: yes}]\n",
        );
        assert!(e.starts_with("resources[0].includePrevious"), "{e}");
    }

    #[test]
    fn the_initial_list_defaults_to_auto_and_a_wrong_value_names_the_field() {
        let base = "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\n";
        let parsed = |extra: &str| {
            ConfigFile::parse(&format!("{base}{extra}"))
                .and_then(ConfigFile::validate)
                .unwrap()
                .kubernetes
                .initial_list
        };
        assert_eq!(parsed(""), InitialList::Auto);
        assert_eq!(
            parsed("kubernetes: {initialList: stream}\n"),
            InitialList::Stream
        );
        assert_eq!(
            parsed("kubernetes: {initialList: list}\n"),
            InitialList::List
        );
        let e = invalid(&format!("{base}kubernetes: {{initialList: watch}}\n"));
        assert!(
            e.starts_with("kubernetes.initialList: unknown variant `watch`"),
            "{e}"
        );
        assert!(e.contains("expected one of auto, stream, list"), "{e}");
        // A fleet member reached through its own kubeconfig lists the same way.
        let fleet = ConfigFile::parse(&format!(
            "{base}kubernetes: {{initialList: list}}\nclusters: [{{name: dev}}, {{name: east, kubeconfig: /k}}]\n"
        ))
        .and_then(ConfigFile::validate)
        .unwrap();
        assert_eq!(
            fleet.fleet.clusters[1].access.kubernetes().initial_list,
            InitialList::List
        );
    }
}
