//! Sharding: replicas running the same configuration share its watches, each watch owned through
//! a `coordination.k8s.io/v1` Lease of its own.
//!
//! Every replica keeps a member Lease ([`membership`]), follows every Lease of its group through
//! one watch, and computes the same fair assignment of the desired watches to the live members
//! ([`assign`]). It claims the watches assigned to it whose Lease is free, expired or its own, and
//! gives up the others in order: the supervisor stops the watch, the pipeline drains and saves its
//! checkpoint, and only then is the Lease released ([`Ownership::release`]), so the next owner
//! resumes from that checkpoint without a LIST. A replica that dies loses its Leases when its
//! member Lease expires.
//!
//! A watch Lease is written only when the watch changes hands: it stays held while its holder's
//! member Lease is live, so a replica renews one Lease however many watches it holds (renewing
//! each watch's Lease, a thousand watches over three replicas would need more requests per
//! second than `kubernetes.qps` allows). A replica takes a watch Lease still naming another
//! only after reading that replica's member Lease from the API server unchanged since it
//! expired here.
//!
//! A Lease is not fencing by itself: like leader election, each held watch has a validity
//! ([`Validity`], a child of the member Lease's) that lapses four fifths of the lease duration
//! after the member Lease's last renewal on the monotonic clock, and the pipeline publishes and
//! checkpoints nothing without it; a renewal that completes after the validity lapsed gives every
//! watch up instead of extending it. The brokers fence the rest (the Kafka transactional id per
//! watch, the NATS checkpoint's compare-and-swap).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use backon::Retryable;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{Config, KubernetesConfig, ShardingConfig};
use crate::kubernetes;
use crate::lease::{self, Validity};
use crate::tasks::Tasks;

mod assign;
mod coordinator;
mod membership;
mod names;
mod stale;
mod status;

pub use status::{LeaseRow, desired, report};

use crate::lease::holder;
use coordinator::Coordinator;
use names::Names;

/// Errors of sharding that waiting will not heal (transient API errors are retried).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bridge's identity may not use Leases in the namespace: RBAC is missing.
    #[error(
        "leases in namespace {namespace}: forbidden: the bridge's ServiceAccount needs get, list, \
         watch, create, update and delete on leases.coordination.k8s.io in namespace {namespace} \
         (`kube-event-bridge rbac` prints the Role)"
    )]
    Forbidden {
        /// The Leases' namespace.
        namespace: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The Leases' namespace does not exist.
    #[error("leases in namespace {namespace}: the namespace does not exist (sharding.namespace)")]
    NamespaceNotFound {
        /// The Leases' namespace.
        namespace: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The Lease API failed in a way that retrying will not fix.
    #[error("leases in namespace {namespace}")]
    Api {
        /// The Leases' namespace.
        namespace: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The watch on the Leases failed before its first listing. Its error prints its cause.
    #[error("leases in namespace {namespace}: cannot list them: {error}")]
    List {
        /// The Leases' namespace.
        namespace: String,
        /// What failed.
        error: watcher::Error,
    },
    /// The coordinating task ended before its first listing.
    #[error("leases in namespace {namespace}: the lease watch stopped")]
    Stopped {
        /// The Leases' namespace.
        namespace: String,
    },
    /// The namespaces of a `namespaceSelector` could not be listed (`status`). The client's
    /// error prints its cause, so it is part of this message rather than a chained source.
    #[error("namespaceSelector {selector:?}: cannot list namespaces: {error}")]
    NamespaceSelector {
        /// The selector.
        selector: String,
        /// What failed.
        error: kube::Error,
    },
    /// Sharding's own Kubernetes client could not be built.
    #[error(transparent)]
    Kubernetes(#[from] kubernetes::Error),
}

impl Error {
    /// Whether retrying may heal it: an API server unavailable, overloaded or restarting, or
    /// the Lease watch ended; not missing RBAC, a missing namespace or a bad configuration.
    fn is_transient(&self) -> bool {
        match self {
            Error::Api { source, .. } => lease::is_transient(source),
            Error::List { error, .. } => match error {
                watcher::Error::InitialListFailed(e)
                | watcher::Error::WatchStartFailed(e)
                | watcher::Error::WatchFailed(e) => lease::is_transient(e),
                watcher::Error::WatchError(status) => {
                    matches!(status.code, 408 | 410 | 429 | 500..=599)
                }
                watcher::Error::NoResourceVersion => false,
            },
            Error::Stopped { .. } => true,
            _ => false,
        }
    }
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Sharding settings, with what the configuration leaves out taken from the pod's environment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The Leases' namespace.
    pub namespace: String,
    /// The prefix of every Lease name.
    pub prefix: String,
    /// This replica's identity.
    pub identity: String,
    /// How long a Lease stays valid without renewal.
    pub lease_duration: Duration,
    /// How often Leases are renewed.
    pub renew: Duration,
}

impl Settings {
    /// The settings `sharding` asks for; the namespace defaults to `POD_NAMESPACE` (else
    /// `default`), the identity to `POD_NAME` (else `HOSTNAME`) and the process id, read through
    /// `env`.
    pub fn new(sh: &ShardingConfig, cluster: &str, env: impl Fn(&str) -> Option<String>) -> Self {
        let host = env("POD_NAME")
            .or_else(|| env("HOSTNAME"))
            .unwrap_or_else(|| "kube-event-bridge".into());
        Self {
            namespace: sh
                .namespace
                .clone()
                .or_else(|| env("POD_NAMESPACE"))
                .unwrap_or_else(|| "default".into()),
            prefix: sh
                .lease_prefix
                .clone()
                .unwrap_or_else(|| format!("kube-event-bridge-{cluster}")),
            identity: sh
                .identity
                .clone()
                .unwrap_or_else(|| format!("{host}-{}", std::process::id())),
            lease_duration: Duration::from_secs(sh.lease_duration_secs),
            renew: Duration::from_secs(sh.renew_secs),
        }
    }
}

/// Why a replica stopped owning a watch: the `reason` label of the hand-off counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The assignment gave it to another replica (one joined or left).
    Rebalance = 0,
    /// No longer desired (its resource or namespace left the configuration's selection).
    Unselected = 1,
    /// This replica shuts down.
    Shutdown = 2,
    /// Its Lease was lost (not renewed in time, taken over) or its pipeline was fenced.
    Lost = 3,
    /// It could not start here: released so that another replica may try it.
    CannotStart = 4,
}

/// The `reason` label values of hand-offs, in the order of [`Reason`].
pub const REASONS: [&str; 5] = [
    "rebalance",
    "unselected",
    "shutdown",
    "lost",
    "cannot_start",
];

/// Lease durations a replica leaves a watch it could not start before claiming it again, so
/// that another replica may try it meanwhile ([`Ownership::decline`]).
pub const DECLINE_HOLD_OFF: u32 = 6;

/// Upper bounds of the time-without-owner histogram, in seconds.
pub const UNOWNED_BUCKETS: [f64; 10] = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 60.0, 300.0];

/// Sharding's counters, read by `/metrics`.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Watch Leases held now.
    pub owned: AtomicU64,
    /// Watches given up or lost, by [`Reason`].
    pub handoffs: [AtomicU64; REASONS.len()],
    /// Claims that took over a watch: cumulative counts per [`UNOWNED_BUCKETS`] bound of the
    /// time it had no owner, as seen here.
    pub unowned_buckets: [AtomicU64; UNOWNED_BUCKETS.len()],
    /// Sum of those times, in microseconds.
    pub unowned_sum_micros: AtomicU64,
    /// Number of those claims.
    pub unowned_count: AtomicU64,
}

impl Metrics {
    fn handoff(&self, reason: Reason) {
        self.handoffs[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn unowned(&self, gap: Duration) {
        let secs = gap.as_secs_f64();
        for (i, bound) in UNOWNED_BUCKETS.iter().enumerate() {
            if secs <= *bound {
                self.unowned_buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.unowned_sum_micros
            .fetch_add(gap.as_micros() as u64, Ordering::Relaxed);
        self.unowned_count.fetch_add(1, Ordering::Relaxed);
    }
}

/// One watch this replica holds, as the supervisor sees it.
#[derive(Debug, Clone)]
pub struct Ownership {
    /// The watch's id.
    pub id: String,
    /// Tells this claim from an earlier one of the same watch.
    pub epoch: u64,
    /// Valid while the Lease is: the pipeline publishes nothing without it.
    pub validity: Validity,
    /// How long the watch had no owner before this claim, as seen here; `None` for a watch that
    /// never had one.
    pub unowned: Option<Duration>,
    /// Being given up: the watch must stop, drain and then [`Ownership::release`] (at once when
    /// it never started).
    pub giving_up: bool,
    commands: mpsc::UnboundedSender<Command>,
}

impl Ownership {
    /// Releases the Lease once the pipeline has drained and saved its checkpoint, so that the
    /// next owner takes the watch at once; waits until the release is written (at most a lease
    /// duration).
    pub async fn release(&self, within: Duration) {
        let (done, written) = oneshot::channel();
        let release = Command::Release {
            id: self.id.clone(),
            epoch: self.epoch,
            done,
        };
        if self.commands.send(release).is_ok() {
            let _ = tokio::time::timeout(within, written).await;
        }
    }

    /// Releases the Lease of a watch that could not start here, and claims it again only after
    /// a hold-off of six lease durations, so that another replica may try it meanwhile.
    pub fn decline(&self) {
        let _ = self.commands.send(Command::Decline {
            id: self.id.clone(),
            epoch: self.epoch,
        });
    }

    /// Forgets the claim without releasing the Lease: the pipeline stopped without draining
    /// (fenced, or the Lease lapsed).
    pub fn abandon(&self) {
        let _ = self.commands.send(Command::Abandon {
            id: self.id.clone(),
            epoch: self.epoch,
        });
    }
}

/// The watches held, by id.
pub type Owned = BTreeMap<String, Ownership>;

/// This replica's part in sharding: the watches it holds (changing as Leases are claimed and
/// given up), and the desired watches it is told.
#[derive(Debug, Clone)]
pub struct Shard {
    owned: watch::Receiver<Owned>,
    commands: mpsc::UnboundedSender<Command>,
    /// The desired watches of each cluster: their union is what the coordinator is told.
    desired: Arc<std::sync::Mutex<BTreeMap<String, BTreeMap<String, String>>>>,
    metrics: Arc<Metrics>,
    settings: Settings,
}

impl Shard {
    /// Joins the replicas of `config` (with a Kubernetes client of its own): writes this
    /// replica's member Lease and lists the group's Leases, then keeps coordinating on a task of
    /// `tasks`. When `stop` is cancelled it leaves: marks its member Lease leaving, claims nothing
    /// more, keeps renewing it until every watch is released, then deletes it, and the task ends.
    /// Transient API errors are retried with backoff (logged, and `/readyz` says starting);
    /// missing RBAC, a missing namespace or a bad client configuration end the start.
    pub async fn join(config: &Config, stop: CancellationToken, tasks: &Tasks) -> Result<Self> {
        let client = kubernetes::client(&coordination(&config.kubernetes)).await?;
        // The member Lease's renewals and the Lease watch get a client (and a `qps` budget) of
        // their own: hundreds of claims or releases must never delay a renewal, nor hold the
        // watch's requests back while the view it feeds goes stale.
        let renewals = kubernetes::client(&config.kubernetes).await?;
        let settings = Settings::new(&config.sharding, &config.cluster, |name| {
            std::env::var(name).ok()
        });
        let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
        let renew_api: Api<Lease> = Api::namespaced(renewals, &settings.namespace);
        (|| Self::try_join(&api, &renew_api, &settings, stop.clone(), tasks))
            .retry(crate::backoff::policy())
            .when(Error::is_transient)
            .notify(|e, delay| {
                warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "cannot join the replicas sharing the watches; retrying");
            })
            .await
    }

    async fn try_join(
        api: &Api<Lease>,
        renew_api: &Api<Lease>,
        settings: &Settings,
        stop: CancellationToken,
        tasks: &Tasks,
    ) -> Result<Self> {
        let names = Names::new(&settings.prefix);
        let leases = follow(renew_api.clone(), &names.selector(), tasks);
        let (owned_tx, owned) = watch::channel(Owned::new());
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let metrics = Arc::new(Metrics::default());
        let mut coordinator = Coordinator::new(
            [api.clone(), renew_api.clone()],
            names,
            settings.clone(),
            owned_tx,
            commands.clone(),
            metrics.clone(),
        );
        coordinator
            .renew_member()
            .await
            .map_err(|e| fatal(settings, e))?;
        let (first_tx, first_rx) = oneshot::channel();
        tasks.spawn(
            "shard coordinator",
            coordinator.run(leases, commands_rx, stop, first_tx),
        );
        let namespace = settings.namespace.clone();
        match first_rx.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(Error::List { namespace, error }),
            Err(_) => return Err(Error::Stopped { namespace }),
        }
        info!(identity = %settings.identity, namespace = %settings.namespace, prefix = %settings.prefix, "joined the replicas sharing the watches");
        Ok(Self {
            owned,
            commands,
            desired: Arc::default(),
            metrics,
            settings: settings.clone(),
        })
    }

    /// Resolves once the coordinator has taken the desired watches told so far into account:
    /// claimed those assigned here that were free (a start waits for it, so that `/readyz`
    /// does not say ready before the first claims).
    pub async fn settled(&self) {
        let (done, settled) = oneshot::channel();
        if self.commands.send(Command::Settled(done)).is_ok() {
            let _ = settled.await;
        }
    }

    /// Tells the watches every replica should run now in `cluster` (id and description),
    /// replacing those told before for it: the assignment follows, over every cluster's.
    pub fn set_desired(&self, cluster: &str, watches: BTreeMap<String, String>) {
        let mut desired = self.desired.lock().unwrap_or_else(|e| e.into_inner());
        if watches.is_empty() {
            desired.remove(cluster);
        } else {
            desired.insert(cluster.to_string(), watches);
        }
        let all = desired.values().flatten();
        let all = all.map(|(id, d)| (id.clone(), d.clone())).collect();
        let _ = self.commands.send(Command::Desired(all));
    }

    /// The watches held now.
    pub fn owned(&self) -> Owned {
        self.owned.borrow().clone()
    }

    /// Resolves when the watches held change.
    pub async fn changed(&mut self) {
        if self.owned.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The counters.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The settings in use.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }
}

/// What the supervisor and the pipelines tell the coordinator.
#[derive(Debug)]
enum Command {
    /// The desired watches: id and description.
    Desired(BTreeMap<String, String>),
    /// A given-up watch drained: release its Lease, then answer.
    Release {
        id: String,
        epoch: u64,
        done: oneshot::Sender<()>,
    },
    /// A watch stopped without draining: forget it.
    Abandon { id: String, epoch: u64 },
    /// A watch could not start: release its Lease and hold off claiming it again.
    Decline { id: String, epoch: u64 },
    /// Answer once the desired watches told so far have been reconciled.
    Settled(oneshot::Sender<()>),
}

/// The Lease watch, read by a task of its own into a channel: the coordinator awaits claims and
/// releases for seconds at a time, and a watch whose response is read only between them
/// delivers about one event each time (the connection reads the next chunk only once the last
/// was taken), so its view of the Leases would lag further and further. After an error the
/// task waits a second before the watcher tries again.
fn follow(
    api: Api<Lease>,
    selector: &str,
    tasks: &Tasks,
) -> mpsc::UnboundedReceiver<watcher::Result<watcher::Event<Lease>>> {
    let config = watcher::Config::default().labels(selector);
    let mut leases = watcher::watcher(api, config).boxed();
    let (tx, rx) = mpsc::unbounded_channel();
    tasks.spawn("shard lease watch", async move {
        while let Some(event) = leases.next().await {
            let failed = event.is_err();
            if tx.send(event).is_err() {
                return;
            }
            if failed {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    });
    rx
}

/// Lease writes that may start at once after a quiet period (the burst of sharding's own
/// client, when `kubernetes.burst` is lower): a replica killed, the survivors each take their
/// part of its watches at once (half of a third of 1,000 watches over three replicas, all of a
/// half over two), instead of within the hand-off's `qps` budget after its Lease expired.
const HANDOFF_BURST: u32 = 512;

/// The client settings of sharding's Lease writes (claims, releases, deletes): `kubernetes`
/// with a burst of at least [`HANDOFF_BURST`]. They are refilled at `kubernetes.qps` all the
/// same, so the long-run rate of the client stays bounded by it; they go to a client of their
/// own, so the watches' budget is not spent either way.
fn coordination(kubernetes: &KubernetesConfig) -> KubernetesConfig {
    KubernetesConfig {
        burst: kubernetes.burst.max(HANDOFF_BURST),
        ..kubernetes.clone()
    }
}

/// The error for a Lease request that retrying will not fix, or a transient one as it is.
fn fatal(s: &Settings, source: kube::Error) -> Error {
    let namespace = s.namespace.clone();
    match &source {
        kube::Error::Api(status) if status.code == 403 => Error::Forbidden { namespace, source },
        kube::Error::Api(status) if status.code == 404 => {
            Error::NamespaceNotFound { namespace, source }
        }
        _ => Error::Api { namespace, source },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_come_from_the_config_then_the_pod_environment() {
        let env = |name: &str| match name {
            "POD_NAME" => Some("keb-7d9f".to_string()),
            "POD_NAMESPACE" => Some("bridges".to_string()),
            _ => None,
        };
        let defaults = ShardingConfig {
            enabled: true,
            ..Default::default()
        };
        let s = Settings::new(&defaults, "dev", env);
        assert_eq!(s.namespace, "bridges");
        assert_eq!(s.prefix, "kube-event-bridge-dev");
        assert_eq!(s.identity, format!("keb-7d9f-{}", std::process::id()));
        assert_eq!(s.lease_duration, Duration::from_secs(10));
        assert_eq!(s.renew, Duration::from_secs(2));
        let configured = ShardingConfig {
            enabled: true,
            namespace: Some("ops".into()),
            lease_prefix: Some("keb".into()),
            identity: Some("replica-1".into()),
            lease_duration_secs: 6,
            renew_secs: 1,
        };
        let s = Settings::new(&configured, "dev", env);
        assert_eq!(
            (s.namespace.as_str(), s.prefix.as_str(), s.identity.as_str()),
            ("ops", "keb", "replica-1")
        );
    }

    #[test]
    fn joining_is_retried_after_server_errors_not_after_refusals() {
        let api = |code: u16| {
            kube::Error::Api(Box::new(
                serde_json::from_value(serde_json::json!({"code": code, "message": "m"})).unwrap(),
            ))
        };
        let namespace = || "ns".to_string();
        for code in [429, 500, 503] {
            let e = Error::Api {
                namespace: namespace(),
                source: api(code),
            };
            assert!(e.is_transient(), "{code}");
            let e = Error::List {
                namespace: namespace(),
                error: watcher::Error::InitialListFailed(api(code)),
            };
            assert!(e.is_transient(), "list {code}");
        }
        assert!(
            Error::Stopped {
                namespace: namespace()
            }
            .is_transient()
        );
        for code in [401, 403, 404, 422] {
            let e = Error::List {
                namespace: namespace(),
                error: watcher::Error::InitialListFailed(api(code)),
            };
            assert!(!e.is_transient(), "list {code}");
        }
        let s = Settings::new(&ShardingConfig::default(), "dev", |_| None);
        assert!(!fatal(&s, api(403)).is_transient());
        assert!(!fatal(&s, api(404)).is_transient());
        assert!(fatal(&s, api(503)).is_transient());
    }

    #[test]
    fn lease_writes_may_burst_to_a_hand_off_at_the_same_rate() {
        let k = KubernetesConfig::default();
        let c = coordination(&k);
        assert_eq!((c.qps, c.burst), (k.qps, HANDOFF_BURST));
        let k = KubernetesConfig {
            burst: 1000,
            ..Default::default()
        };
        assert_eq!(coordination(&k).burst, 1000);
    }

    #[test]
    fn the_time_without_owner_is_counted_in_its_bucket() {
        let m = Metrics::default();
        m.unowned(Duration::from_millis(300));
        m.unowned(Duration::from_secs(12));
        let counts: Vec<u64> = m
            .unowned_buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        assert_eq!(counts, [0, 0, 1, 1, 1, 1, 1, 2, 2, 2]);
        assert_eq!(m.unowned_count.load(Ordering::Relaxed), 2);
        m.handoff(Reason::Shutdown);
        assert_eq!(m.handoffs[2].load(Ordering::Relaxed), 1);
    }
}
