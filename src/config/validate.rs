//! The rules across sections, and building the validated [`Config`]: [`ConfigFile::validate`]
//! runs the checks of every section, collects every problem with its path, and builds a
//! `Config` only when there is none.

use super::environment::Environment;
use super::fleet::{self, Fleet};
use super::limits::{
    BURST, CHECKPOINT_INTERVAL_MS, DISCOVERY_REFRESH_SECS, HEARTBEAT_INTERVAL_SECS,
    LEASE_DURATION_SECS, MAX_IN_FLIGHT, MAX_QUEUE_BYTES, MAX_TOTAL_QUEUE_BYTES, QPS,
    QUEUE_CAPACITY, RETRY_PERIOD_SECS, SHARD_LEASE_DURATION_SECS, SHARD_RENEW_SECS,
    SHUTDOWN_DELAY_SECS, SHUTDOWN_GRACE_SECS,
};
use super::names::{is_dns_label, is_dns_subdomain};
use super::resource::{self, Resource};
use super::sink::{CheckpointSupport, Checkpointing, Context, Sink, validate_sink};
use super::{Config, ConfigFile, Error, Result};

/// The longest `sharding.leasePrefix`: a Lease name (at most 253 characters) appends `-w-` and
/// 16 hex digits.
const LEASE_PREFIX_MAX: usize = 234;

impl ConfigFile {
    /// Checks every rule that needs no cluster and returns the validated config, or every
    /// problem found, each prefixed by its path. Without a `sink` section, `K_SINK` in the
    /// process environment selects an HTTP sink ([`ConfigFile::validate_in`]).
    pub fn validate(self) -> Result<Config> {
        self.validate_in(&Environment::from_process())
    }

    /// [`ConfigFile::validate`] with the given environment.
    pub fn validate_in(self, env: &Environment) -> Result<Config> {
        let mut errors = Vec::new();
        if !is_dns_subdomain(&self.cluster) {
            errors.push(format!(
                "cluster: {:?} must be a lowercase DNS name (letters, digits, '-', '.')",
                self.cluster
            ));
        }
        let mut resources = self.validate_resources(&mut errors);
        let fleet = fleet::validate_fleet(
            &self.cluster,
            &self.kubernetes,
            &self.clusters,
            self.cluster_secrets.as_ref(),
            &mut errors,
        );
        fleet::check_resource_clusters(&resources, &fleet, &mut errors);
        let heartbeat = self.heartbeat_destination();
        let c = &self.checkpoint;
        let context = Context {
            cluster: &self.cluster,
            heartbeat: self.heartbeat.enabled.then_some(heartbeat.as_str()),
            checkpoint: c.enabled.then_some(Checkpointing {
                interval_ms: c.interval_ms,
                kafka_topic: &c.kafka_topic,
                nats_bucket: &c.nats_bucket,
            }),
        };
        let sink = validate_sink(&self.sink, &context, env, &mut errors);
        if let Some(sink) = &sink {
            resource::check_sink_fields(&mut resources, sink.as_ref(), &self.cluster, &mut errors);
            fleet::check_shared_keys(&resources, sink.as_ref(), &fleet, &mut errors);
        }
        self.check_numbers(&mut errors);
        if self.admin.address.parse::<std::net::SocketAddr>().is_err() {
            errors.push(format!(
                "admin.address: {:?} is not host:port with an IP address",
                self.admin.address
            ));
        }
        self.check_leader_election(&mut errors);
        self.check_sharding(&mut errors);
        if let Some(ns) = &self.snapshot_requests.namespace
            && !is_dns_label(ns)
        {
            errors.push(format!(
                "snapshotRequests.namespace: {ns:?} is not a valid namespace name"
            ));
        }
        self.check_checkpoint(sink.as_ref(), &mut errors);
        match sink {
            Some(sink) if errors.is_empty() => Ok(self.build(resources, sink, fleet)),
            _ => Err(Error::Invalid(errors)),
        }
    }

    /// Every `resources[]` entry that passes its checks; then entries watching the same objects.
    fn validate_resources(&self, errors: &mut Vec<String>) -> Vec<Resource> {
        if self.resources.is_empty() {
            errors.push("resources: at least one resource is required".into());
        }
        let resources: Vec<Resource> = self
            .resources
            .iter()
            .cloned()
            .enumerate()
            .filter_map(|(i, r)| resource::validate_resource(i, r, self.event_format, errors))
            .collect();
        resource::check_overlaps(&resources, errors);
        resources
    }

    /// A lease outlasts its retry period, and a new leader has a checkpoint to resume from.
    fn check_leader_election(&self, errors: &mut Vec<String>) {
        let le = &self.leader_election;
        if le.enabled && le.lease_duration_secs <= le.retry_period_secs {
            errors.push(
                "leaderElection: leaseDurationSecs must be greater than retryPeriodSecs".into(),
            );
        }
        if le.enabled && !self.checkpoint.enabled {
            errors.push("leaderElection.enabled: a new leader resumes from the checkpoint; enable checkpoints".into());
        }
    }

    /// One way of running replicas at a time; a watch's next owner resumes from its checkpoint;
    /// a renewal fits in the lease at least twice; the Lease names are valid.
    fn check_sharding(&self, errors: &mut Vec<String>) {
        let sh = &self.sharding;
        if !sh.enabled {
            return;
        }
        if self.leader_election.enabled {
            errors.push(
                "sharding.enabled, leaderElection.enabled: replicas either share the watches (sharding) or elect one leader that runs them all (leaderElection); enable one of them".into(),
            );
        }
        if !self.checkpoint.enabled {
            errors.push("sharding.enabled: a watch's next owner resumes from its checkpoint; enable checkpoints".into());
        }
        if sh.renew_secs.saturating_mul(2) > sh.lease_duration_secs {
            errors.push(format!(
                "sharding.renewSecs: {} s must be at most half of sharding.leaseDurationSecs ({} s), so that one failed renewal does not cost the watches",
                sh.renew_secs, sh.lease_duration_secs
            ));
        }
        if let Some(ns) = &sh.namespace
            && !is_dns_label(ns)
        {
            errors.push(format!(
                "sharding.namespace: {ns:?} is not a valid namespace name"
            ));
        }
        if let Some(prefix) = &sh.lease_prefix
            && !(is_dns_subdomain(prefix) && prefix.len() <= LEASE_PREFIX_MAX)
        {
            errors.push(format!(
                "sharding.leasePrefix: {prefix:?} must be a lowercase DNS name (letters, digits, '-', '.') of at most {LEASE_PREFIX_MAX} characters: the Lease names append 19"
            ));
        }
        if sh.lease_prefix.is_none()
            && self.cluster.len() + "kube-event-bridge-".len() > LEASE_PREFIX_MAX
        {
            errors.push("sharding.leasePrefix: the default prefix `kube-event-bridge-{cluster}` is too long for a Lease name; set a shorter one".into());
        }
    }

    /// Checkpoints live where the sink keeps them: in its own broker (no other store may be
    /// set), or apart from it, in files or a NATS key-value bucket (some sinks require one).
    /// Replicas (leader election, sharding) need a store every replica reaches: a directory is
    /// each pod's own, so a new owner would start from nothing.
    fn check_checkpoint(&self, sink: Option<&Sink>, errors: &mut Vec<String>) {
        let c = &self.checkpoint;
        if !c.enabled {
            return;
        }
        if let Some(sink) = sink {
            let kind = sink.kind();
            match sink.checkpoints() {
                CheckpointSupport::Unsupported(why) => errors.push(format!(
                    "checkpoint.enabled: {why}, or checkpoint.enabled: false"
                )),
                CheckpointSupport::Own if c.directory.is_some() => errors.push(format!(
                    "checkpoint.directory: the {kind} sink keeps checkpoints in its own broker, not in files"
                )),
                CheckpointSupport::Own if c.nats.is_some() => errors.push(format!(
                    "checkpoint.nats: the {kind} sink keeps checkpoints in its own broker, not apart from it"
                )),
                CheckpointSupport::Apart { required: true }
                    if c.directory.is_none() && c.nats.is_none() =>
                {
                    errors.push(format!(
                        "checkpoint.directory, checkpoint.nats: the {kind} sink needs a checkpoint store; set nats (a JetStream key-value bucket every replica reaches) or a directory on a persistent volume, or checkpoint.enabled: false (every start then lists and sends every object again)"
                    ))
                }
                _ => {}
            }
        }
        if c.directory.is_some() && c.nats.is_some() {
            errors
                .push("checkpoint.directory, checkpoint.nats: choose one checkpoint store".into());
        }
        let replicas = if self.leader_election.enabled {
            Some("leaderElection.enabled")
        } else if self.sharding.enabled {
            Some("sharding.enabled")
        } else {
            None
        };
        if let (Some(field), Some(_)) = (replicas, &c.directory) {
            errors.push(format!(
                "checkpoint.directory, {field}: each replica has a directory of its own, so the next owner of a watch would start from nothing and lose the changes made meanwhile; use checkpoint.nats, a key-value bucket every replica reaches"
            ));
        }
        if let Some(n) = &c.nats {
            if n.url.trim().is_empty() {
                errors.push("checkpoint.nats.url: must not be empty".into());
            }
            n.credentials.check("checkpoint.nats.credentials", errors);
        }
    }

    /// Every number of the file within its [`Limit`](super::Limit) (settings of a disabled
    /// feature too: a value that would break it when enabled is refused now).
    fn check_numbers(&self, errors: &mut Vec<String>) {
        let d = &self.delivery;
        QUEUE_CAPACITY.check("delivery.queueCapacity", d.queue_capacity, errors);
        MAX_IN_FLIGHT.check("delivery.maxInFlight", d.max_in_flight, errors);
        MAX_QUEUE_BYTES.check("delivery.maxQueueBytes", d.max_queue_bytes, errors);
        MAX_TOTAL_QUEUE_BYTES.check(
            "delivery.maxTotalQueueBytes",
            d.max_total_queue_bytes,
            errors,
        );
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
        let sh = &self.sharding;
        let lease = sh.lease_duration_secs;
        SHARD_LEASE_DURATION_SECS.check("sharding.leaseDurationSecs", lease, errors);
        SHARD_RENEW_SECS.check("sharding.renewSecs", sh.renew_secs, errors);
        let interval = self.checkpoint.interval_ms;
        CHECKPOINT_INTERVAL_MS.check("checkpoint.intervalMs", interval, errors);
        let delay = self.admin.shutdown_delay_secs;
        SHUTDOWN_DELAY_SECS.check("admin.shutdownDelaySecs", delay, errors);
        let heartbeat = self.heartbeat.interval_secs;
        HEARTBEAT_INTERVAL_SECS.check("heartbeat.intervalSecs", heartbeat, errors);
        let refresh = self.discovery.refresh_secs;
        DISCOVERY_REFRESH_SECS.check("discovery.refreshSecs", refresh, errors);
    }

    /// The validated configuration, once every check passed.
    fn build(self, resources: Vec<Resource>, sink: Sink, fleet: Fleet) -> Config {
        Config {
            cluster: self.cluster,
            kubernetes: self.kubernetes,
            fleet,
            resources,
            sink,
            delivery: self.delivery,
            checkpoint: self.checkpoint,
            initial_snapshot: self.initial_snapshot,
            leader_election: self.leader_election,
            sharding: self.sharding,
            admin: self.admin,
            heartbeat: self.heartbeat,
            discovery: self.discovery,
            audit_extensions: self.audit_extensions,
            snapshot_requests: self.snapshot_requests,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{ConfigFile, invalid};

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
    fn a_checkpoint_directory_is_refused_with_replicas_and_a_shared_bucket_is_taken() {
        const HTTP: &str = "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nsink: {http: {url: 'http://r/'}}\n";
        for (replicas, field) in [
            ("leaderElection: {enabled: true}", "leaderElection.enabled"),
            ("sharding: {enabled: true}", "sharding.enabled"),
        ] {
            let e = invalid(&format!(
                "{HTTP}{replicas}\ncheckpoint: {{directory: /var/lib/keb}}\n"
            ));
            assert!(
                e.contains(&format!(
                    "checkpoint.directory, {field}: each replica has a directory of its own"
                )),
                "{e}"
            );
            let ok = format!("{HTTP}{replicas}\ncheckpoint: {{nats: {{url: 'nats://n:4222'}}}}\n");
            let cfg = ConfigFile::parse(&ok).unwrap().validate().unwrap();
            assert!(cfg.keeps_checkpoints());
        }
        let e = invalid(&format!("{HTTP}checkpoint: {{intervalMs: 100}}\n"));
        assert!(e.contains("the http sink needs a checkpoint store"), "{e}");
        let e = invalid(&format!(
            "{HTTP}checkpoint: {{directory: /d, nats: {{url: 'nats://n', credentials: {{user: u}}}}}}\n"
        ));
        assert!(
            e.contains("checkpoint.directory, checkpoint.nats: choose one"),
            "{e}"
        );
        assert!(
            e.contains("checkpoint.nats.credentials: user and passwordFile"),
            "{e}"
        );
        let e = invalid(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nsink: {kafka: {bootstrapServers: 'k:9092'}}\ncheckpoint: {nats: {url: 'nats://n'}}\n",
        );
        assert!(
            e.contains("checkpoint.nats: the kafka sink keeps checkpoints in its own broker"),
            "{e}"
        );
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
    fn sharding_is_exclusive_with_leader_election_and_needs_checkpoints() {
        let base = "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\n";
        let e = invalid(&format!(
            "{base}sharding: {{enabled: true}}\nleaderElection: {{enabled: true}}\n"
        ));
        assert!(
            e.contains("sharding.enabled, leaderElection.enabled: replicas either share"),
            "{e}"
        );
        let e = invalid(&format!(
            "{base}sharding: {{enabled: true}}\ncheckpoint: {{enabled: false}}\n"
        ));
        assert!(
            e.contains("sharding.enabled: a watch's next owner resumes from its checkpoint"),
            "{e}"
        );
        let e = invalid(&format!(
            "{base}sharding: {{enabled: true, leaseDurationSecs: 5, renewSecs: 3}}\n"
        ));
        assert!(
            e.contains(
                "sharding.renewSecs: 3 s must be at most half of sharding.leaseDurationSecs (5 s)"
            ),
            "{e}"
        );
        let e = invalid(&format!(
            "{base}sharding: {{enabled: true, namespace: Ops, leasePrefix: 'a_b'}}\n"
        ));
        assert!(
            e.contains("sharding.namespace: \"Ops\" is not a valid namespace name"),
            "{e}"
        );
        assert!(e.contains("sharding.leasePrefix: \"a_b\" must be"), "{e}");
        let long = "c".repeat(220);
        let e = invalid(&format!(
            "cluster: {long}\nresources: [{{apiVersion: v1, resource: pods}}]\nsharding: {{enabled: true}}\n"
        ));
        assert!(
            e.contains("sharding.leasePrefix: the default prefix"),
            "{e}"
        );
        let cfg = ConfigFile::parse(&format!("{base}sharding: {{enabled: true}}\n"))
            .unwrap()
            .validate()
            .unwrap();
        assert!(cfg.sharding.enabled);
        assert_eq!(
            (cfg.sharding.lease_duration_secs, cfg.sharding.renew_secs),
            (10, 2)
        );
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
}
