//! Keeps the running watches equal to the desired ones while the bridge runs. The desired set is
//! computed from the configuration, the API server's discovery (refreshed when a
//! CustomResourceDefinition changes, and periodically) and the namespaces that match each
//! `namespaceSelector` (followed through a watch on Namespaces). A watch that is no longer
//! desired is stopped cleanly: its pipeline drains and saves a last checkpoint. Starting or
//! stopping one watch never disturbs the others.
//!
//! With sharding, the desired watches are told to the [`Shard`], and only those whose Lease this
//! replica holds run; a watch given up drains, saves its checkpoint, then releases its Lease.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, DynamicObject, PartialObjectMeta, TypeMeta};
use kube::runtime::watcher::{self, Event as WatcherEvent};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, warn};

use crate::backoff::Backoff;
use crate::budget::{self, Budget};
use crate::checkpoint::{self, Checkpoint, Store, WatchKey};
use crate::config::Config;
use crate::crd;
use crate::demand::Demand;
use crate::discovery::{self, ResolvedResource};
use crate::encode::ResourceInfo;
use crate::lease::Validity;
use crate::pipeline::{Heartbeat, Pipeline, WatchIdentity};
use crate::shard::{Ownership, Shard};
use crate::sink::{self, AnySink};
use crate::status::Status;
use crate::stores::{self, Stores};
use crate::tasks::Tasks;
use crate::watch::{self, History, Listing, Target};

/// Errors of starting watches, and the failures that stop the bridge while it runs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The namespaces of a `namespaceSelector` could not be listed. The watcher's error already
    /// prints its cause, so it is part of this message rather than a chained source.
    #[error("namespaceSelector {selector:?}: cannot list namespaces: {error}")]
    NamespaceSelector {
        /// The selector.
        selector: String,
        /// What failed.
        error: watcher::Error,
    },
    /// The Namespace watch of a `namespaceSelector` ended before its first complete listing.
    #[error("namespaceSelector {selector:?}: the namespace watch stopped")]
    NamespaceWatchStopped {
        /// The selector.
        selector: String,
    },
    /// A watch's sink or checkpoint store could not be prepared.
    #[error(transparent)]
    Stores(#[from] stores::Error),
    /// A watch's checkpoint could not be loaded.
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::Error),
    /// The checkpoint store did not answer a watch's load in time (unreachable, and its client
    /// waits for it to come back rather than failing).
    #[error("loading the watch's checkpoint: no answer from the checkpoint store within {secs} s")]
    CheckpointUnanswered {
        /// How long it waited.
        secs: u64,
    },
    /// The sink could not prepare the destinations of new resources.
    #[error(transparent)]
    Sink(#[from] sink::Error),
    /// The sink could not prepare the destinations of a new watch's resource (its broker
    /// unreachable): the watch cannot start for now.
    #[error("the sink could not prepare this watch's destination")]
    Unprepared(#[source] Arc<Error>),
    /// A running watch or pipeline failed for good (fenced, checkpoint store lost).
    #[error(transparent)]
    Watch(crate::pipeline::Error),
    /// A watch or pipeline task panicked.
    #[error("a watch task panicked")]
    Panicked(#[source] tokio::task::JoinError),
}

impl Error {
    /// Whether a watch failing to open with this error may open later (its broker or store
    /// unreachable for now): it is then retried and named in readiness instead of failing the
    /// start. A checkpoint of another cluster or a misconfigured checkpoint topic fail it.
    fn is_transient(&self) -> bool {
        let transient = |e: &checkpoint::Error| {
            matches!(
                e,
                checkpoint::Error::Store { .. } | checkpoint::Error::Aborted { .. }
            )
        };
        match self {
            Error::Stores(stores::Error::Checkpoint(e)) | Error::Checkpoint(e) => transient(e),
            Error::Stores(stores::Error::Sink(_))
            | Error::CheckpointUnanswered { .. }
            | Error::Unprepared(_) => true,
            _ => false,
        }
    }
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Watches and pipelines sized per resource.
const PAGE_SIZE: u32 = 500;
/// How long loading a watch's checkpoint may take before the watch counts as one that cannot
/// start.
const LOAD_TIMEOUT: Duration = Duration::from_secs(20);
/// Below the API server's 5-minute limit, like client-go's reflector.
const WATCH_TIMEOUT_SECS: u32 = 290;

/// One watch: its label for logs and its pipeline's status.
#[derive(Debug, Clone)]
pub struct WatchHandle {
    /// The cluster's name.
    pub cluster: Arc<str>,
    /// `apps/v1/deployments`.
    pub resource: String,
    /// The namespace, `None` for all or cluster scope.
    pub namespace: Option<String>,
    /// Counters and acknowledged position.
    pub status: Arc<Status>,
    /// Where a snapshot on demand of this watch is queued.
    pub demand: Option<DemandPort>,
}

/// What a snapshot on demand needs of a running watch: its key, what it lists, and its queue
/// to the pipeline, beside the watch's own items.
#[derive(Debug, Clone)]
pub struct DemandPort {
    /// The watch's key.
    pub key: WatchKey,
    /// What the watch lists and watches (API, selectors).
    pub target: watch::Target,
    /// The queue of snapshot items to the watch's pipeline, beside the watch's own: weak, and
    /// held open by the watch task, so that it closes once the watch does.
    pub queue: mpsc::WeakSender<Demand>,
    /// Cancelled when the watch stops here (a hand-off, a shutdown).
    pub stopped: CancellationToken,
    /// The watch's sink (a snapshot's `prune` reads the keys of its destination).
    pub sink: Arc<AnySink>,
    /// What the watch's events say of its resource, and where they go.
    pub info: Arc<ResourceInfo>,
}

/// Items of a snapshot's walk queued to the pipeline at most; the walk waits for room, so a
/// chunk enters the pipeline as fast as it takes them between the watch's items.
const DEMAND_QUEUE: usize = 64;

/// A desired watch: its key, resource and namespace scope (`None`: all or cluster scope).
type Scope = (WatchKey, ResolvedResource, Option<String>);

/// Called with the running watches whenever they change (the admin server's view).
pub type OnChange = Box<dyn Fn(Vec<WatchHandle>) + Send + Sync>;

/// Namespaces matching each selector, kept current by one Namespace watch per selector.
type Selected = Arc<Mutex<HashMap<String, BTreeSet<String>>>>;

/// What a finished watch or pipeline task reports: its watch, the generation it was started in,
/// and how it ended.
type Finished = (String, u64, Result<(), crate::pipeline::Error>);

struct Running {
    handle: WatchHandle,
    cancel: CancellationToken,
    generation: u64,
    /// The claim of its Lease, with sharding.
    epoch: Option<u64>,
    /// The name of the CRD that may serve its resource.
    crd: Option<String>,
    /// Set before `cancel` when its resource was deleted ([`Target::resource_deleted`]).
    resource_deleted: Arc<AtomicBool>,
}

/// The watches' owner.
pub(crate) struct Supervisor {
    config: Arc<Config>,
    client: Client,
    api_server: String,
    sink: Arc<AnySink>,
    stores: Stores,
    leadership: Option<Validity>,
    shard: Option<Shard>,
    /// With sharding: the claims (watch id, epoch) started here, whose pipeline releases the
    /// Lease once drained; a claim given up before it started is released at once.
    started: BTreeSet<(String, u64)>,
    running: BTreeMap<String, Running>,
    /// Desired watches that could not start (their sink, checkpoint store or checkpoint could
    /// not be opened), each with a status stalled `cannot_start` naming why: readiness, the
    /// `watch_stalled` metric and the log name them, and they are tried again with backoff.
    unstarted: BTreeMap<String, WatchHandle>,
    /// With sharding: unstarted watches whose Lease was released for another replica to try
    /// (their status stays here until the hold-off ends, when this replica may claim them again).
    declined: BTreeMap<String, tokio::time::Instant>,
    /// When to try the unstarted watches again, and the backoff to it.
    retry: Backoff,
    tasks: JoinSet<Finished>,
    generation: u64,
    stop: CancellationToken,
    /// Asks for a new discovery (a CRD changed).
    refresh: Arc<Notify>,
    /// Asks for a reconcile against the last discovery (a namespace gained or lost a label).
    rescope: Arc<Notify>,
    /// The resources of the last discovery.
    resolved: Vec<ResolvedResource>,
    selected: Selected,
    /// The CRDs followed (with a wildcard entry): which were deleted.
    crds: crd::Shared,
    on_change: OnChange,
    /// The followers of namespaces and CRDs, and each watch's queue forwarder.
    background: Tasks,
    /// What the watches of each resource (by its label) share.
    shared: BTreeMap<String, Shared>,
    /// The process's byte budget, which every watch's draws on too.
    total: Budget,
}

/// What the supervisor needs to start.
pub(crate) struct Parts {
    /// The validated configuration.
    pub config: Arc<Config>,
    /// The Kubernetes client.
    pub client: Client,
    /// The API server's URL (Knative's `source`).
    pub api_server: String,
    /// The shared sink.
    pub sink: Arc<AnySink>,
    /// The checkpoint stores.
    pub stores: Stores,
    /// Held leadership, if replicas elect a leader.
    pub leadership: Option<Validity>,
    /// This replica's part, if replicas share the watches.
    pub shard: Option<Shard>,
    /// Cancelled at shutdown.
    pub stop: CancellationToken,
    /// Told about the running watches.
    pub on_change: OnChange,
    /// Where the followers and forwarders are spawned, tracked.
    pub tasks: Tasks,
    /// The process's byte budget (`delivery.maxTotalQueueBytes`), shared by every cluster.
    pub total: Budget,
}

impl Supervisor {
    /// Prepares the supervisor; [`Supervisor::start`] starts the watches.
    pub fn new(parts: Parts) -> Self {
        Self {
            config: parts.config,
            client: parts.client,
            api_server: parts.api_server,
            sink: parts.sink,
            stores: parts.stores,
            leadership: parts.leadership,
            shard: parts.shard,
            started: BTreeSet::new(),
            running: BTreeMap::new(),
            unstarted: BTreeMap::new(),
            declined: BTreeMap::new(),
            retry: Backoff::default(),
            tasks: JoinSet::new(),
            generation: 0,
            stop: parts.stop,
            refresh: Arc::new(Notify::new()),
            rescope: Arc::new(Notify::new()),
            resolved: Vec::new(),
            selected: Arc::default(),
            crds: Arc::default(),
            on_change: parts.on_change,
            background: parts.tasks,
            shared: BTreeMap::new(),
            total: parts.total,
        }
    }

    /// Follows namespaces (waiting for each selector's first listing) and CRDs, then starts
    /// every desired watch for `resources` (resolved at start, so an explicit entry the cluster
    /// does not serve has already failed the start).
    pub async fn start(&mut self, resources: Vec<ResolvedResource>) -> Result<()> {
        let selectors: BTreeSet<String> = self
            .config
            .resources
            .iter()
            .filter_map(|r| r.namespace_selector.clone())
            .collect();
        for selector in selectors {
            let (first_tx, first_rx) = oneshot::channel();
            self.spawn_follower(
                "namespace follower",
                follow_namespaces(
                    self.client.clone(),
                    selector.clone(),
                    self.selected.clone(),
                    self.rescope.clone(),
                    first_tx,
                ),
            );
            match first_rx.await {
                Ok(Ok(n)) => info!(selector = %selector, namespaces = n, "namespaces selected"),
                Ok(Err(error)) => return Err(Error::NamespaceSelector { selector, error }),
                Err(_) => return Err(Error::NamespaceWatchStopped { selector }),
            }
        }
        if self.config.resources.iter().any(|r| r.is_wildcard()) {
            self.spawn_follower(
                "CRD follower",
                crd::follow(self.client.clone(), self.refresh.clone(), self.crds.clone()),
            );
        }
        self.reconcile(resources).await?;
        // With sharding, the first claims land before the watches are reported, so that
        // `/readyz` waits for the watches this replica will own.
        if let Some(shard) = &self.shard {
            shard.settled().await;
            self.reconcile(self.resolved.clone()).await?;
        }
        (self.on_change)(self.handles());
        Ok(())
    }

    fn spawn_follower(&self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let stop = self.stop.clone();
        self.background.spawn(name, async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = task => {}
            }
        });
    }

    /// Runs until shutdown (then drains every pipeline) or until a watch fails for good
    /// (fenced, checkpoint store lost), returning why.
    pub async fn run(mut self) -> Result<()> {
        let period = Duration::from_secs(self.config.discovery.refresh_secs);
        let mut next_refresh = tokio::time::Instant::now() + period;
        let mut next_retry = tokio::time::Instant::now() + self.retry.next_delay();
        loop {
            tokio::select! {
                biased;
                () = self.stop.cancelled() => break,
                () = tokio::time::sleep_until(next_retry), if !self.unstarted.is_empty() => {
                    self.update(self.resolved.clone()).await;
                    next_retry = tokio::time::Instant::now() + self.retry.next_delay().min(period);
                }
                Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    if let Some(failure) = self.finished(done) {
                        return Err(failure);
                    }
                }
                () = self.refresh.notified() => self.refresh().await,
                () = self.rescope.notified() => self.update(self.resolved.clone()).await,
                () = owned_changed(&mut self.shard) => self.update(self.resolved.clone()).await,
                () = tokio::time::sleep_until(next_refresh) => {
                    next_refresh = tokio::time::Instant::now() + period;
                    self.refresh().await;
                }
            }
        }
        for r in self.running.values() {
            r.cancel.cancel();
        }
        while let Some(done) = self.tasks.join_next().await {
            self.finished(done);
        }
        self.release_left_over().await;
        Ok(())
    }

    /// Looks at one finished task; returns a failure that must stop the bridge.
    fn finished(&mut self, done: Result<Finished, tokio::task::JoinError>) -> Option<Error> {
        match done {
            Ok((key, generation, Err(e))) => {
                let current = self
                    .running
                    .get(&key)
                    .is_some_and(|r| r.generation == generation);
                if current && self.shard.is_some() && lost(&e) {
                    // Another replica owns the watch now: only this watch stops.
                    warn!(watch = %key, error = %e, "watch lost to another replica: stopping it");
                    if let Some(r) = self.running.remove(&key) {
                        r.cancel.cancel();
                    }
                    (self.on_change)(self.handles());
                    None
                } else if current {
                    Some(Error::Watch(e))
                } else {
                    // A watch already stopped (its resource or namespace went away) may be
                    // fenced by its successor while draining: nothing is lost, its successor
                    // resumes from the checkpoint.
                    warn!(watch = %key, error = %e, "a stopped watch ended with an error");
                    None
                }
            }
            Err(e) if e.is_panic() => Some(Error::Panicked(e)),
            _ => None,
        }
    }

    async fn refresh(&mut self) {
        match discovery::discover(&self.client).await {
            Ok(found) => {
                let (resources, missing) = discovery::select(&self.config.resources, &found);
                for m in missing {
                    info!(problem = %m, "resource no longer served; its watch stops");
                }
                self.update(resources).await;
            }
            Err(e) => warn!(error = %e, "discovery refresh failed; keeping the current watches"),
        }
    }

    /// Makes the running watches match `resources` × their namespace scopes.
    async fn reconcile(&mut self, resources: Vec<ResolvedResource>) -> Result<()> {
        self.resolved.clone_from(&resources);
        let mut desired: BTreeMap<String, (WatchKey, ResolvedResource, Option<String>)> =
            BTreeMap::new();
        {
            let selected = self.selected.lock().unwrap_or_else(|e| e.into_inner());
            for r in &resources {
                for ns in r.scopes(&selected) {
                    let key = WatchKey::for_scope(&self.config.cluster, r, ns.as_deref());
                    desired.insert(key.id.clone(), (key, r.clone(), ns));
                }
            }
        }
        let owned = self.owned(&desired);
        // The watches this replica is to run: desired and, with sharding, validly claimed here.
        // An unstarted watch no longer among them is forgotten (its new owner starts it).
        let runnable: BTreeSet<String> = desired
            .keys()
            .filter(|k| {
                owned.as_ref().is_none_or(|o| {
                    o.get(*k)
                        .is_some_and(|o| o.validity.is_valid() && !o.giving_up)
                })
            })
            .cloned()
            .collect();
        let gone: Vec<String> = self
            .running
            .iter()
            .filter(|(k, r)| {
                !desired.contains_key(*k)
                    || owned.as_ref().is_some_and(|o| {
                        o.get(*k).filter(|o| !o.giving_up).map(|o| o.epoch) != r.epoch
                    })
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in &gone {
            if let Some(r) = self.running.remove(key) {
                let deleted = !desired.contains_key(key) && self.crd_deleted(&r);
                info!(resource = %r.handle.resource, namespace = r.handle.namespace.as_deref().unwrap_or("*"), crd_deleted = deleted, "watch no longer desired or owned here: stopping it");
                r.resource_deleted.store(deleted, Ordering::Release);
                r.cancel.cancel();
            }
        }
        let new: Vec<_> = desired
            .into_iter()
            .filter(|(k, _)| !self.running.contains_key(k))
            .filter_map(|(k, v)| match &owned {
                None => Some((v, None)),
                // A lapsed claim is not started again: the shard forgets it.
                Some(o) => o
                    .get(&k)
                    .filter(|o| o.validity.is_valid() && !o.giving_up)
                    .map(|o| (v, Some(o.clone()))),
            })
            .collect();
        let opened = self.open_new(new).await;
        let now = tokio::time::Instant::now();
        self.declined.retain(|_, until| now < *until);
        let declined = &self.declined;
        self.unstarted
            .retain(|id, _| runnable.contains(id) || declined.contains_key(id));
        let mut failure = None;
        for (id, handle, opened) in opened {
            match opened {
                Ok(opened) => {
                    if self.unstarted.remove(&id).is_some() {
                        info!(resource = %handle.resource, namespace = handle.namespace.as_deref().unwrap_or("*"), "watch started after failing to");
                    }
                    self.launch(opened);
                }
                Err(e) => {
                    if let Some(o) = owned.as_ref().and_then(|o| o.get(&id)) {
                        let hold_off =
                            Duration::from_secs(self.config.sharding.lease_duration_secs)
                                * crate::shard::DECLINE_HOLD_OFF;
                        self.declined.insert(id.clone(), now + hold_off);
                        o.decline();
                    }
                    self.cannot_start(id, handle, &e);
                    if !e.is_transient() {
                        failure = failure.or(Some(e));
                    }
                }
            }
        }
        if self.unstarted.is_empty() {
            self.retry.reset();
        }
        if let Some(owned) = owned {
            self.release_unstarted(&owned);
        }
        failure.map_or(Ok(()), Err)
    }

    /// Prepares the sink's destinations for the new watches, then opens them (a few at once):
    /// each with its id, handle and what opening gave. When the sink could not prepare their
    /// destinations (its broker unreachable), every new watch counts as one that cannot start,
    /// named in readiness and retried.
    async fn open_new(
        &self,
        new: Vec<(Scope, Option<Ownership>)>,
    ) -> Vec<(String, WatchHandle, Result<Opened>)> {
        let mut unprepared = None;
        if !new.is_empty() {
            let fresh: Vec<ResolvedResource> = new.iter().map(|((_, r, _), _)| r.clone()).collect();
            if let Err(e) = self.sink.prepare(&self.config.cluster, &fresh).await {
                unprepared = Some(Arc::new(Error::Sink(e)));
            }
        }
        // Kafka checkpoints load through reads shared by the watches waiting at the time: every
        // new watch waits for its load together, so that one read of the topic serves them all.
        let loads_at_once = if self.stores.loads_share_reads() {
            new.len().max(1)
        } else {
            OPEN_AT_ONCE
        };
        futures::stream::iter(new)
            .map(|((key, r, ns), ownership)| {
                let id = key.id.clone();
                let handle = WatchHandle {
                    cluster: self.config.cluster.as_str().into(),
                    resource: r.label(),
                    namespace: ns.clone(),
                    status: Arc::new(Status::default()),
                    demand: None,
                };
                let unprepared = unprepared.clone();
                let open = self.open(key, r, ns, ownership);
                async move {
                    let opened = match unprepared {
                        Some(e) => Err(Error::Unprepared(e)),
                        None => open.await,
                    };
                    (id, handle, opened)
                }
            })
            .buffered(OPEN_AT_ONCE)
            .map(|(id, handle, opened)| async move {
                let loaded = match opened {
                    Ok(unloaded) => unloaded.load().await,
                    Err(e) => Err(e),
                };
                (id, handle, loaded)
            })
            .buffered(loads_at_once)
            .collect()
            .await
    }

    /// Records a desired watch that could not start: its status is stalled `cannot_start`
    /// with the error, so `/readyz`, `watch_stalled` and the log name it until it starts.
    fn cannot_start(&mut self, id: String, handle: WatchHandle, error: &Error) {
        let chain = error_chain(error);
        let previous = self.unstarted.remove(&id);
        let status = previous.map_or(handle.status.clone(), |p| p.status);
        if status.set_stall("cannot_start", &chain) {
            error!(resource = %handle.resource, namespace = handle.namespace.as_deref().unwrap_or("*"), error = %chain, "watch cannot start; retrying with backoff");
        }
        self.unstarted.insert(id, WatchHandle { status, ..handle });
    }

    /// Runs `pipeline` as a task; with sharding, records the claim it runs under (returned) so
    /// that its pipeline, not [`Supervisor::release_unstarted`], releases the Lease.
    fn spawn_pipeline(
        &mut self,
        id: &str,
        generation: u64,
        pipeline: Pipeline,
        rx: mpsc::Receiver<(crate::watch::Item, budget::Reservation)>,
        ownership: Option<Ownership>,
        span: tracing::Span,
    ) -> Option<u64> {
        let epoch = ownership.as_ref().map(|o| o.epoch);
        if let Some(epoch) = epoch {
            self.started.insert((id.to_string(), epoch));
        }
        let within = Duration::from_secs(self.config.sharding.lease_duration_secs);
        let id = id.to_string();
        self.tasks.spawn(
            async move {
                let result = run_owned(pipeline, rx, ownership, within).await;
                (id, generation, result)
            }
            .instrument(span),
        );
        epoch
    }

    /// Releases at once the Leases given up before their watch started here (no pipeline will),
    /// and forgets the claims no longer held.
    fn release_unstarted(&mut self, owned: &crate::shard::Owned) {
        let within = Duration::from_secs(self.config.sharding.lease_duration_secs);
        for o in owned.values().filter(|o| o.giving_up) {
            if self.started.insert((o.id.clone(), o.epoch)) {
                let o = o.clone();
                self.tasks.spawn(async move {
                    o.release(within).await;
                    (o.id.clone(), 0, Ok(()))
                });
            }
        }
        self.started
            .retain(|(id, epoch)| owned.get(id).is_some_and(|o| o.epoch == *epoch));
    }

    /// At shutdown, once every pipeline has drained and released its Lease: releases the
    /// claims that landed while shutting down and never started here, as
    /// [`Supervisor::release_unstarted`] does for any claim given up before it started (once the
    /// shard has settled it claims nothing more and every claim is given up), so that no Lease
    /// stays held until it expires.
    async fn release_left_over(&mut self) {
        let Some(shard) = &self.shard else {
            return;
        };
        shard.settled().await;
        let owned = owned_in(shard, &self.config.cluster);
        self.release_unstarted(&owned);
        while let Some(done) = self.tasks.join_next().await {
            self.finished(done);
        }
    }

    /// With sharding: tells the shard the desired watches and returns the ones held here.
    fn owned(
        &self,
        desired: &BTreeMap<String, (WatchKey, ResolvedResource, Option<String>)>,
    ) -> Option<crate::shard::Owned> {
        let shard = self.shard.as_ref()?;
        shard.set_desired(
            &self.config.cluster,
            desired
                .iter()
                .map(|(id, (key, _, _))| (id.clone(), key.description.clone()))
                .collect(),
        );
        Some(owned_in(shard, &self.config.cluster))
    }

    /// Reconciles while running: a watch that cannot start is retried at the next refresh, and
    /// the admin server learns the running watches whatever happened.
    async fn update(&mut self, resources: Vec<ResolvedResource>) {
        if let Err(e) = self.reconcile(resources).await {
            warn!(error = %e, "not every watch could start; retrying with backoff");
        }
        (self.on_change)(self.handles());
    }

    /// Whether the CRD serving the running watch `r`'s resource was seen deleted: its objects
    /// are gone, and the watch publishes the deletion of those it still knows as it stops.
    fn crd_deleted(&self, r: &Running) -> bool {
        let crds = self.crds.lock().unwrap_or_else(|e| e.into_inner());
        r.crd.as_deref().is_some_and(|name| crds.was_deleted(name))
    }

    /// The running watches.
    pub fn handles(&self) -> Vec<WatchHandle> {
        let running = self.running.values().map(|r| r.handle.clone());
        running.chain(self.unstarted.values().cloned()).collect()
    }

    /// Opens what a new watch needs before it runs, but its checkpoint: its sink and checkpoint
    /// store. Only reads `self`, so several watches open at once.
    async fn open(
        &self,
        key: WatchKey,
        r: ResolvedResource,
        namespace: Option<String>,
        ownership: Option<Ownership>,
    ) -> Result<Unloaded> {
        let span = info_span!("watch", resource = %r.label(), namespace = namespace.as_deref().unwrap_or("*"));
        let owner = validity(ownership.as_ref(), self.leadership.as_ref());
        let (sink, mut store) = self
            .stores
            .for_watch(&self.sink, &key, owner)
            .instrument(span.clone())
            .await?;
        let mut info = ResourceInfo::new(&self.config.cluster, &r, &self.api_server);
        if self.config.audit_extensions
            && let Some(uid) = self.stores.cluster_uid()
        {
            info = info.with_audit(uid);
        }
        store.set_redacted(info.redacts());
        let status = new_status(ownership.as_ref());
        Ok(Unloaded(Opened {
            key,
            r,
            namespace,
            ownership,
            span,
            info: Arc::new(info),
            sink,
            store,
            status,
            resume: None,
        }))
    }

    /// What the watches of `r` share, made with its first.
    fn shared(&mut self, r: &ResolvedResource) -> Shared {
        let initial_list = self.config.kubernetes.initial_list;
        self.shared
            .entry(r.label())
            .or_insert_with(|| Shared {
                listing: Arc::new(Listing::new(r.label(), initial_list)),
                history: Arc::default(),
            })
            .clone()
    }

    /// Starts an opened watch: its watch task and its pipeline.
    fn launch(&mut self, opened: Opened) {
        let Opened {
            key,
            r,
            namespace,
            ownership,
            span,
            info,
            sink,
            store,
            status,
            resume,
        } = opened;
        let (config, r) = (self.config.clone(), &r);
        let (tx, unmetered) = mpsc::channel(1);
        let budget = Budget::within(config.delivery.max_queue_bytes, &self.total);
        let rx = budget::metered(
            unmetered,
            config.delivery.queue_capacity,
            budget.clone(),
            crate::pipeline::item_bytes,
            &self.background,
        );
        let start_rv = resume.as_ref().and_then(|c| c.resource_version.clone());
        let shared = self.shared(r);
        // A LIST page is held whole while decoded: a quarter of the watch's budget.
        let target = target(
            &self.client,
            r,
            namespace.as_deref(),
            self.refresh.clone(),
            shared,
            config.delivery.max_queue_bytes / 4,
        );
        let resource_deleted = target.resource_deleted.clone();
        let cancel = self.stop.child_token();
        // A snapshot's walk queues beside the watch; the watch task holds the queue open, so
        // that it closes (and a walk stops here) when the watch does.
        let (demand_tx, demand_rx) = mpsc::channel(DEMAND_QUEUE);
        let demand = DemandPort {
            key: key.clone(),
            target: target.clone(),
            queue: demand_tx.downgrade(),
            stopped: cancel.clone(),
            sink: sink.clone(),
            info: info.clone(),
        };
        self.generation += 1;
        let generation = self.generation;
        let (stop, watch_status, id) = (cancel.clone(), status.clone(), key.id.clone());
        self.tasks.spawn(
            async move {
                let _demands = demand_tx;
                watch::run(target, start_rv, tx, stop, watch_status).await;
                (id, generation, Ok(()))
            }
            .instrument(span.clone()),
        );
        if !r.config.redact_secret_data && r.is_secret() {
            warn!(resource = %r.label(), "Secret redaction is OFF for this resource: secret values will be published in clear");
        }
        let pipeline = Pipeline {
            info,
            events: r.config.events.clone(),
            sink,
            max_in_flight: config.delivery.max_in_flight,
            status: status.clone(),
            store,
            resume,
            snapshot: config.initial_snapshot,
            checkpoint_interval: Duration::from_millis(config.checkpoint.interval_ms),
            leadership: validity(ownership.as_ref(), self.leadership.as_ref()),
            heartbeat: heartbeat(&config, &key),
            watch: WatchIdentity {
                key: key.clone(),
                namespace: namespace.clone(),
            },
            demands: Some(demand_rx),
            budget: Some(budget),
        };
        let epoch = self.spawn_pipeline(&key.id, generation, pipeline, rx, ownership, span);
        self.running.insert(
            key.id,
            Running {
                handle: WatchHandle {
                    cluster: config.cluster.as_str().into(),
                    resource: r.label(),
                    namespace,
                    status,
                    demand: Some(demand),
                },
                cancel,
                generation,
                epoch,
                crd: crd::name(&r.api.group, &r.api.plural),
                resource_deleted,
            },
        );
    }
}

/// An error and its causes, on one line.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A watch ready to start ([`Supervisor::open`], then [`Unloaded::load`]).
struct Opened {
    key: WatchKey,
    r: ResolvedResource,
    namespace: Option<String>,
    ownership: Option<Ownership>,
    span: tracing::Span,
    info: Arc<ResourceInfo>,
    sink: Arc<AnySink>,
    store: Store,
    status: Arc<Status>,
    resume: Option<Checkpoint>,
}

/// An opened watch whose checkpoint is not loaded yet ([`Unloaded::load`] sets `resume`).
struct Unloaded(Opened);

impl Unloaded {
    /// Loads the checkpoint to resume from. One that cannot be decoded comes back as a repair
    /// (no resourceVersion: list). A store that does not answer (a NATS client waiting to
    /// reconnect) makes the watch one that cannot start, named in readiness and retried, rather
    /// than holding up every other watch's start behind it.
    async fn load(self) -> Result<Opened> {
        let Unloaded(mut opened) = self;
        let load = opened.store.load(&opened.status.checkpoints_corrupt);
        opened.resume = tokio::time::timeout(LOAD_TIMEOUT, load)
            .instrument(opened.span.clone())
            .await
            .map_err(|_| Error::CheckpointUnanswered {
                secs: LOAD_TIMEOUT.as_secs(),
            })??;
        Ok(opened)
    }
}

/// Watches opened at once when many start together (a takeover, a selector matching many
/// namespaces): their Kafka producers start side by side, and their checkpoints load so, but
/// Kafka's: those load through reads of the topic shared by the watches waiting at the time
/// (`src/sink/kafka/reads.rs`), so every new watch waits for its load at once.
const OPEN_AT_ONCE: usize = 64;

/// A new watch's status; with sharding it records how long the watch had no owner.
fn new_status(ownership: Option<&Ownership>) -> Arc<Status> {
    let status = Arc::new(Status::default());
    if let Some(gap) = ownership.and_then(|o| o.unowned) {
        let ms = gap.as_millis() as u64;
        status
            .unowned_before_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
    }
    status
}

/// The heartbeat settings of the watch `key`, if heartbeats are on.
fn heartbeat(config: &Config, key: &WatchKey) -> Option<Heartbeat> {
    config.heartbeat.enabled.then(|| Heartbeat {
        interval: Duration::from_secs(config.heartbeat.interval_secs),
        destination: config
            .heartbeat
            .destination
            .replace("{cluster}", &config.cluster),
        watch: key.clone(),
    })
}

/// Runs a pipeline; with sharding, its Lease is released only once it drained and saved its
/// last checkpoint (waiting at most `within`), and forgotten without release when it failed.
async fn run_owned(
    pipeline: Pipeline,
    rx: mpsc::Receiver<(crate::watch::Item, budget::Reservation)>,
    ownership: Option<Ownership>,
    within: Duration,
) -> Result<(), crate::pipeline::Error> {
    let result = pipeline.run(rx).await;
    match (&ownership, &result) {
        (Some(o), Ok(())) => o.release(within).await,
        (Some(o), Err(_)) => o.abandon(),
        (None, _) => {}
    }
    result
}

/// What a watch's pipeline publishes under, and its producer owns the transactional id under:
/// the watch's Lease with sharding, else the leader Lease with leader election, else nothing.
fn validity(ownership: Option<&Ownership>, leadership: Option<&Validity>) -> Option<Validity> {
    ownership
        .map(|o| o.validity.clone())
        .or_else(|| leadership.cloned())
}

/// The watches of `cluster` held here: in a fleet, the other clusters' claims are their
/// supervisors' to start and release.
fn owned_in(shard: &Shard, cluster: &str) -> crate::shard::Owned {
    let prefix = checkpoint::key_safe(cluster);
    let mut owned = shard.owned();
    owned.retain(|id, _| id.rsplit_once('.').is_some_and(|(c, _)| c == prefix));
    owned
}

/// Resolves when the watches held here change; never without sharding.
async fn owned_changed(shard: &mut Option<Shard>) {
    match shard {
        Some(shard) => shard.changed().await,
        None => std::future::pending().await,
    }
}

/// Whether a pipeline's failure means another replica took its watch over (its Lease lapsed,
/// or the broker or checkpoint store fenced it), rather than a failure of this process.
fn lost(error: &crate::pipeline::Error) -> bool {
    matches!(
        error,
        crate::pipeline::Error::LeadershipLost { .. }
            | crate::pipeline::Error::Fenced { .. }
            | crate::pipeline::Error::Checkpoint(checkpoint::Error::Fenced { .. })
    )
}

/// What the watches of one resource share: how it is listed, so that a streaming list the API
/// server refused is logged once per resource; and what the API server is known to hold of its
/// history, so that watches resuming together do not each ask.
#[derive(Debug, Clone)]
struct Shared {
    listing: Arc<Listing>,
    history: Arc<History>,
}

/// What the watch of `r` in `namespace` (`None`: all namespaces, or cluster scope) lists and
/// watches. `not_found` is told when the resource is no longer served; `shared` is the
/// resource's watches' ([`Shared`]); a LIST page is held whole while decoded, up to `page_bytes`.
fn target(
    client: &Client,
    r: &ResolvedResource,
    namespace: Option<&str>,
    not_found: Arc<Notify>,
    shared: Shared,
    page_bytes: usize,
) -> Target {
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &r.api),
        None => Api::all_with(client.clone(), &r.api),
    };
    Target {
        api,
        types: TypeMeta {
            api_version: r.api.api_version.clone(),
            kind: r.api.kind.clone(),
        },
        label_selector: r.config.label_selector.clone(),
        field_selector: r.config.field_selector.clone(),
        page_size: PAGE_SIZE,
        page_bytes,
        watch_timeout_secs: WATCH_TIMEOUT_SECS,
        not_found,
        resource_deleted: Arc::default(),
        listing: shared.listing,
        history: shared.history,
    }
}

/// Keeps `selected[selector]` equal to the namespaces matching `selector`, asking for a
/// reconcile (`rescope`) on every change. The first complete listing (or the error that prevented it) is
/// reported on `first`.
async fn follow_namespaces(
    client: Client,
    selector: String,
    selected: Selected,
    rescope: Arc<Notify>,
    first: oneshot::Sender<Result<usize, watcher::Error>>,
) {
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
    let mut stream = watcher::watcher(api, watcher::Config::default().labels(&selector)).boxed();
    let mut first = Some(first);
    let mut listing: BTreeSet<String> = BTreeSet::new();
    let update_set = |f: &dyn Fn(&mut BTreeSet<String>)| {
        let mut all = selected.lock().unwrap_or_else(|e| e.into_inner());
        f(all.entry(selector.clone()).or_default());
    };
    while let Some(event) = stream.next().await {
        match event {
            Ok(WatcherEvent::Init) => listing.clear(),
            Ok(WatcherEvent::InitApply(ns)) => {
                listing.extend(ns.metadata.name);
            }
            Ok(WatcherEvent::InitDone) => {
                let n = listing.len();
                let complete = std::mem::take(&mut listing);
                update_set(&|set| set.clone_from(&complete));
                match first.take() {
                    Some(tx) => {
                        let _ = tx.send(Ok(n));
                    }
                    None => rescope.notify_one(),
                }
            }
            Ok(WatcherEvent::Apply(ns)) => {
                if let Some(name) = ns.metadata.name {
                    info!(namespace = %name, selector = %selector, "namespace matches the selector");
                    update_set(&|set| {
                        set.insert(name.clone());
                    });
                    rescope.notify_one();
                }
            }
            Ok(WatcherEvent::Delete(ns)) => {
                if let Some(name) = ns.metadata.name {
                    info!(namespace = %name, selector = %selector, "namespace no longer matches the selector");
                    update_set(&|set| {
                        set.remove(&name);
                    });
                    rescope.notify_one();
                }
            }
            Err(e) => {
                if let Some(tx) = first.take() {
                    let _ = tx.send(Err(e));
                    return;
                }
                warn!(selector = %selector, error = %e, "namespace watch failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
