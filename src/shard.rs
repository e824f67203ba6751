//! Sharding: replicas running the same configuration share its watches, each watch owned through
//! a `coordination.k8s.io/v1` Lease of its own.
//!
//! Every replica keeps a member Lease ([`membership`]), follows every Lease of its group through
//! one watch, and computes the same fair assignment of the desired watches to the live members
//! ([`assign`]). It claims the watches assigned to it whose Lease is free, expired or its own, and
//! gives up the others in order: the supervisor stops the watch, the pipeline drains and saves its
//! checkpoint, and only then is the Lease released ([`Ownership::release`]), so the next owner
//! resumes from that checkpoint without a LIST. A replica that dies loses its Leases by expiry.
//!
//! A Lease is not fencing by itself: like leader election, each held watch has a validity
//! ([`Leadership`]) that lapses four fifths of the lease duration after its last successful
//! renewal on the monotonic clock, and the pipeline publishes and checkpoints nothing without
//! it; the brokers fence the rest (the Kafka transactional id per watch, the NATS checkpoint's
//! compare-and-swap).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::watcher::{self, Event as WatcherEvent};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::{Config, ShardingConfig};
use crate::kubernetes;
use crate::leader::Leadership;

mod assign;
mod lease;
mod membership;
mod status;

pub use status::{LeaseRow, report};

use lease::{Names, Seen};

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
}

/// The `reason` label values of hand-offs, in the order of [`Reason`].
pub const REASONS: [&str; 4] = ["rebalance", "unselected", "shutdown", "lost"];

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
    pub validity: Leadership,
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
    metrics: Arc<Metrics>,
    settings: Settings,
}

impl Shard {
    /// Joins the replicas of `config` (with a Kubernetes client of its own): writes this
    /// replica's member Lease and lists the group's Leases, then keeps coordinating in the
    /// background until the process ends. When `stop` is cancelled it leaves: deletes its member
    /// Lease, claims nothing more, and keeps renewing what it holds until each is released.
    pub async fn join(config: &Config, stop: CancellationToken) -> Result<Self> {
        let client = kubernetes::client(&config.kubernetes).await?;
        let settings = Settings::new(&config.sharding, &config.cluster, |name| {
            std::env::var(name).ok()
        });
        let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
        let names = Names::new(&settings.prefix);
        let selector = names.selector();
        let leases =
            watcher::watcher(api.clone(), watcher::Config::default().labels(&selector)).boxed();
        let (owned_tx, owned) = watch::channel(Owned::new());
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let metrics = Arc::new(Metrics::default());
        let mut coordinator = Coordinator {
            api,
            names,
            s: settings.clone(),
            view: BTreeMap::new(),
            listing: None,
            held: BTreeMap::new(),
            desired: BTreeMap::new(),
            absent_since: BTreeMap::new(),
            owned: owned_tx,
            commands: commands.clone(),
            metrics: metrics.clone(),
            leaving: false,
            epoch: 0,
            member: None,
        };
        coordinator
            .renew_member()
            .await
            .map_err(|e| fatal(&settings, e))?;
        info!(identity = %settings.identity, namespace = %settings.namespace, prefix = %settings.prefix, "joined the replicas sharing the watches");
        let (first_tx, first_rx) = oneshot::channel();
        tokio::spawn(coordinator.run(leases, commands_rx, stop, first_tx));
        match first_rx.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                return Err(Error::List {
                    namespace: settings.namespace,
                    error,
                });
            }
            Err(_) => {
                return Err(Error::Stopped {
                    namespace: settings.namespace,
                });
            }
        }
        Ok(Self {
            owned,
            commands,
            metrics,
            settings,
        })
    }

    /// Tells the watches every replica should run now (id and description): the assignment
    /// follows.
    pub fn set_desired(&self, watches: BTreeMap<String, String>) {
        let _ = self.commands.send(Command::Desired(watches));
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
}

/// A watch Lease this replica holds.
#[derive(Debug)]
struct Held {
    epoch: u64,
    validity: Leadership,
    /// The Lease as last written.
    lease: Lease,
    /// Set once the watch is being given up (its pipeline drains).
    giving_up: Option<Reason>,
    /// Not given up for a rebalance before then (a watch taken as an orphan is kept a while).
    keep_until: Instant,
}

/// How a renewal went.
enum Renewal {
    Renewed(Box<Lease>, Instant),
    Lost,
    Failed(kube::Error),
}

/// The task that holds the Leases: one loop, so its state needs no lock.
struct Coordinator {
    api: Api<Lease>,
    names: Names,
    s: Settings,
    /// Every Lease of the group, by name.
    view: BTreeMap<String, Seen>,
    /// A relist in progress.
    listing: Option<BTreeMap<String, Lease>>,
    held: BTreeMap<String, Held>,
    desired: BTreeMap<String, String>,
    /// Desired watches without a Lease, since when (as seen here).
    absent_since: BTreeMap<String, Instant>,
    owned: watch::Sender<Owned>,
    commands: mpsc::UnboundedSender<Command>,
    metrics: Arc<Metrics>,
    leaving: bool,
    epoch: u64,
    /// This replica's member Lease as last written.
    member: Option<Lease>,
}

impl Coordinator {
    async fn run(
        mut self,
        mut leases: BoxStream<'static, watcher::Result<WatcherEvent<Lease>>>,
        mut commands: mpsc::UnboundedReceiver<Command>,
        stop: CancellationToken,
        first: oneshot::Sender<Result<(), watcher::Error>>,
    ) {
        let mut first = Some(first);
        let mut next_renew = tokio::time::Instant::now() + self.s.renew;
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled(), if !self.leaving => self.leave().await,
                Some(command) = commands.recv() => self.command(command).await,
                () = tokio::time::sleep_until(next_renew) => {
                    next_renew = tokio::time::Instant::now() + self.s.renew;
                    self.renew_all().await;
                }
                event = leases.next() => match event {
                    Some(Ok(event)) => {
                        if self.observe(event) && let Some(tx) = first.take() {
                            let _ = tx.send(Ok(()));
                        }
                    }
                    Some(Err(error)) => {
                        if let Some(tx) = first.take() {
                            let _ = tx.send(Err(error));
                            return;
                        }
                        warn!(error = %error, "lease watch failed; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    None => return,
                },
            }
            if first.is_none() {
                self.reconcile().await;
            }
        }
    }

    /// Takes one event of the Lease watch; true when a complete listing was just taken.
    fn observe(&mut self, event: WatcherEvent<Lease>) -> bool {
        let now = Instant::now();
        match event {
            WatcherEvent::Init => self.listing = Some(BTreeMap::new()),
            WatcherEvent::InitApply(lease) => {
                let name = lease.metadata.name.clone().unwrap_or_default();
                self.listing.get_or_insert_default().insert(name, lease);
            }
            WatcherEvent::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                self.view.retain(|name, _| listed.contains_key(name));
                for (name, lease) in listed {
                    self.seen(name, lease, now);
                }
                return true;
            }
            WatcherEvent::Apply(lease) => {
                let name = lease.metadata.name.clone().unwrap_or_default();
                self.seen(name, lease, now);
            }
            WatcherEvent::Delete(lease) => {
                let name = lease.metadata.name.clone().unwrap_or_default();
                self.view.remove(&name);
            }
        }
        false
    }

    /// Records a Lease as read or written; an older copy than the one seen is ignored.
    fn seen(&mut self, name: String, lease: Lease, now: Instant) {
        match self.view.get_mut(&name) {
            Some(seen) if !older(&lease, &seen.lease) => seen.update(lease, now),
            Some(_) => {}
            None => {
                self.view.insert(name, Seen::first(lease, now));
            }
        }
    }

    async fn command(&mut self, command: Command) {
        match command {
            Command::Desired(desired) => self.desired = desired,
            Command::Release { id, epoch, done } => {
                if self.held.get(&id).is_some_and(|h| h.epoch == epoch) {
                    self.release(&id).await;
                }
                let _ = done.send(());
            }
            Command::Abandon { id, epoch } => {
                if self.held.get(&id).is_some_and(|h| h.epoch == epoch) {
                    warn!(watch = %id, "watch stopped without draining: its lease is given up");
                    self.forget(&id, Reason::Lost);
                }
            }
        }
    }

    /// Gives up what the assignment no longer gives this replica, then claims what it does.
    async fn reconcile(&mut self) {
        let members = membership::live(&self.view, &self.s.identity, self.leaving);
        let ids: Vec<String> = self.desired.keys().cloned().collect();
        let owners = assign::assign(&members, &ids);
        let me = self.s.identity.clone();
        let now = Instant::now();
        let mut given_up = Vec::new();
        for (id, held) in &mut self.held {
            if held.giving_up.is_some() {
                continue;
            }
            let reason = if self.leaving {
                Some(Reason::Shutdown)
            } else if !self.desired.contains_key(id) {
                Some(Reason::Unselected)
            } else if owners.get(id).is_some_and(|o| *o != me.as_str()) && now >= held.keep_until {
                Some(Reason::Rebalance)
            } else {
                None
            };
            if let Some(reason) = reason {
                held.giving_up = Some(reason);
                given_up.push((id.clone(), reason));
            }
        }
        for (id, reason) in given_up {
            info!(watch = %id, reason = REASONS[reason as usize], "giving the watch up: draining it, then releasing its lease");
            self.owned.send_modify(|o| {
                if let Some(o) = o.get_mut(&id) {
                    o.giving_up = true;
                }
            });
        }
        if self.leaving {
            return;
        }
        self.absent_since
            .retain(|id, _| self.desired.contains_key(id));
        for id in ids {
            if self.held.contains_key(&id) {
                continue;
            }
            let assigned = owners.get(&id).is_some_and(|o| *o == me.as_str());
            if let Some(orphan) = self.claimable(&id, assigned, now) {
                self.claim(&id, orphan).await;
            }
        }
    }

    /// Whether this replica should claim the watch `id` now: `Some(false)` when it is assigned
    /// here and free (or already this replica's), `Some(true)` when it is assigned elsewhere but
    /// has had no owner for two lease durations (its assignee does not run it: the replicas'
    /// views of the desired watches differ for a while).
    fn claimable(&mut self, id: &str, assigned: bool, now: Instant) -> Option<bool> {
        let name = self.names.watch(id);
        let free_since = match self.view.get(&name) {
            Some(seen) => {
                self.absent_since.remove(id);
                match seen.holder() {
                    Some(h) if h == self.s.identity => return Some(false),
                    Some(_) => return None,
                    None => seen.free_since().unwrap_or(now),
                }
            }
            None => *self.absent_since.entry(id.to_string()).or_insert(now),
        };
        if assigned {
            return Some(false);
        }
        (free_since.elapsed() >= self.s.lease_duration * 2).then_some(true)
    }

    /// Takes the Lease of watch `id` (creating it if need be).
    async fn claim(&mut self, id: &str, orphan: bool) {
        let name = self.names.watch(id);
        let (me, d) = (self.s.identity.clone(), self.s.lease_duration);
        let description = self.desired.get(id).cloned().unwrap_or_default();
        let (lease, unowned) = match self.view.get(&name) {
            Some(seen) => (
                lease::held_by(&seen.lease, &me, d),
                seen.free_since().map(|t| t.elapsed()),
            ),
            None => (
                self.names.lease(&name, &me, d, Some((id, &description))),
                None,
            ),
        };
        let at = Instant::now();
        match lease::write(&self.api, &lease).await {
            Ok(Some(written)) => self.claimed(id, written, at, unowned, orphan),
            Ok(None) => debug!(watch = %id, "another replica took the watch first"),
            Err(e) => {
                warn!(watch = %id, lease = %name, error = %e, "cannot claim the watch's lease; retrying")
            }
        }
    }

    fn claimed(
        &mut self,
        id: &str,
        written: Lease,
        at: Instant,
        unowned: Option<Duration>,
        orphan: bool,
    ) {
        let validity = Leadership::unrenewed();
        validity.renewed(self.s.lease_duration, at);
        self.epoch += 1;
        let name = self.names.watch(id);
        self.seen(name.clone(), written.clone(), at);
        let keep = if orphan {
            self.s.lease_duration * 10
        } else {
            Duration::ZERO
        };
        self.held.insert(
            id.to_string(),
            Held {
                epoch: self.epoch,
                validity: validity.clone(),
                lease: written,
                giving_up: None,
                keep_until: at + keep,
            },
        );
        if let Some(gap) = unowned {
            self.metrics.unowned(gap);
        }
        self.metrics
            .owned
            .store(self.held.len() as u64, Ordering::Relaxed);
        info!(watch = %id, lease = %name, orphan, unowned_ms = unowned.map(|d| d.as_millis() as u64), "watch claimed");
        let ownership = Ownership {
            id: id.to_string(),
            epoch: self.epoch,
            validity,
            unowned,
            giving_up: false,
            commands: self.commands.clone(),
        };
        self.owned.send_modify(|o| {
            o.insert(id.to_string(), ownership);
        });
    }

    /// Drops a held watch without releasing its Lease.
    fn forget(&mut self, id: &str, reason: Reason) {
        if let Some(held) = self.held.remove(id) {
            held.validity.lose();
            self.metrics.handoff(reason);
        }
        self.metrics
            .owned
            .store(self.held.len() as u64, Ordering::Relaxed);
        self.owned.send_modify(|o| {
            o.remove(id);
        });
    }

    /// Releases the Lease of a drained watch: no holder, so the next owner takes it at once.
    async fn release(&mut self, id: &str) {
        let Some(held) = self.held.get(id) else {
            return;
        };
        let reason = held.giving_up.unwrap_or(Reason::Rebalance);
        let mut current = held.lease.clone();
        self.forget(id, reason);
        for _ in 0..3 {
            match lease::write(&self.api, &lease::released(&current)).await {
                Ok(Some(written)) => {
                    let name = self.names.watch(id);
                    self.seen(name, written, Instant::now());
                    info!(watch = %id, reason = REASONS[reason as usize], "watch lease released");
                    return;
                }
                Ok(None) => match self.api.get_opt(&self.names.watch(id)).await {
                    Ok(Some(lease)) if holder(&lease) == Some(&self.s.identity) => current = lease,
                    Ok(_) => return,
                    Err(e) => {
                        warn!(watch = %id, error = %e, "cannot release the watch's lease; it expires instead");
                        return;
                    }
                },
                Err(e) => {
                    warn!(watch = %id, error = %e, "cannot release the watch's lease; it expires instead");
                    return;
                }
            }
        }
    }

    /// Renews the member Lease and every watch Lease held; a watch whose Lease was taken over or
    /// not renewed in time is lost.
    async fn renew_all(&mut self) {
        if !self.leaving
            && let Err(e) = self.renew_member().await
        {
            warn!(error = %e, "cannot renew the member lease; retrying");
        }
        let ids: Vec<String> = self.held.keys().cloned().collect();
        let renewals = ids.iter().map(|id| {
            let current = self.held[id].lease.clone();
            renew(&self.api, current, &self.s)
        });
        let results = futures::future::join_all(renewals).await;
        for (id, result) in ids.into_iter().zip(results) {
            match result {
                Renewal::Renewed(lease, at) => {
                    let lease = *lease;
                    if let Some(held) = self.held.get_mut(&id) {
                        held.validity.renewed(self.s.lease_duration, at);
                        held.lease = lease.clone();
                    }
                    self.seen(self.names.watch(&id), lease, at);
                }
                Renewal::Lost => {
                    warn!(watch = %id, "watch lease taken over: stopping the watch");
                    self.forget(&id, Reason::Lost);
                }
                Renewal::Failed(e) => {
                    warn!(watch = %id, error = %e, "cannot renew the watch's lease; retrying");
                    if self.held.get(&id).is_some_and(|h| !h.validity.is_valid()) {
                        warn!(watch = %id, "watch lease not renewed in time: stopping the watch");
                        self.forget(&id, Reason::Lost);
                    }
                }
            }
        }
    }

    /// Creates or renews this replica's member Lease.
    async fn renew_member(&mut self) -> kube::Result<()> {
        let name = self.names.member(&self.s.identity);
        let (me, d) = (self.s.identity.clone(), self.s.lease_duration);
        let current = match self.member.take() {
            Some(lease) => Some(lease),
            None => self.api.get_opt(&name).await?,
        };
        let lease = match current {
            Some(current) => lease::held_by(&current, &me, d),
            None => self.names.lease(&name, &me, d, None),
        };
        let at = Instant::now();
        // A lost race leaves `member` empty: the next renewal reads the Lease again.
        if let Some(written) = lease::write(&self.api, &lease).await? {
            self.member = Some(written.clone());
            self.seen(name, written, at);
        }
        Ok(())
    }

    /// Leaves the replicas: the member Lease goes first, so the others count this replica out
    /// at once; every held watch is given up (the supervisor drains them all).
    async fn leave(&mut self) {
        self.leaving = true;
        let name = self.names.member(&self.s.identity);
        let rv = self
            .member
            .as_ref()
            .and_then(|l| l.metadata.resource_version.clone());
        lease::delete(&self.api, &name, rv).await;
        info!(identity = %self.s.identity, watches = self.held.len(), "left the replicas: handing the watches over");
    }
}

/// One renewal of a watch Lease held: a compare-and-swap on the copy last written; after a
/// conflict, read it again and renew it if it is still ours.
async fn renew(api: &Api<Lease>, current: Lease, s: &Settings) -> Renewal {
    let at = Instant::now();
    let name = current.metadata.name.clone().unwrap_or_default();
    let mut current = current;
    for _ in 0..2 {
        match lease::write(
            api,
            &lease::held_by(&current, &s.identity, s.lease_duration),
        )
        .await
        {
            Ok(Some(lease)) => return Renewal::Renewed(Box::new(lease), at),
            Ok(None) => match api.get_opt(&name).await {
                Ok(Some(lease)) if holder(&lease) == Some(&s.identity) => current = lease,
                Ok(_) => return Renewal::Lost,
                Err(e) => return Renewal::Failed(e),
            },
            Err(e) => return Renewal::Failed(e),
        }
    }
    Renewal::Lost
}

/// The holder written in `lease`, if any.
fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// Whether `a` is an older copy than `b` (resourceVersions compared as numbers, as the API
/// server issues them; when either is not a number, `a` is taken as newer).
fn older(a: &Lease, b: &Lease) -> bool {
    let rv = |l: &Lease| {
        l.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    matches!((rv(a), rv(b)), (Some(a), Some(b)) if a < b)
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

    #[test]
    fn an_older_copy_of_a_lease_is_recognised() {
        let with_rv = |rv: &str| Lease {
            metadata: kube::api::ObjectMeta {
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            spec: None,
        };
        assert!(older(&with_rv("9"), &with_rv("10")));
        assert!(!older(&with_rv("10"), &with_rv("10")));
        assert!(!older(&with_rv("x"), &with_rv("10")));
    }
}
