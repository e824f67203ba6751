//! The bridge's lifecycle: [`run`] serves the admin endpoints, waits for leadership, starts the
//! [`Bridge`] (every watch and pipeline, owned by a [`Supervisor`]) and runs it until a shutdown
//! signal, leadership lost or a failure. The first signal stops the watches and drains what is
//! in flight within the grace period ([`crate::shutdown`] handles the second one).

use std::sync::Arc;
use std::time::Duration;

use kube::Api;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::admin;
use crate::allocator;
use crate::budget::Budget;
use crate::config::{Config, SnapshotRequestsConfig};
use crate::discovery;
use crate::fleet::{
    self,
    secret::{self, Found},
};
use crate::kubernetes;
use crate::leader::{self, Leader};
use crate::lease::Validity;
use crate::shard::{self, Shard};
use crate::sink::{self, AnySink};
use crate::snapshot::requests::Requests;
use crate::stores::{self, Stores};
use crate::supervisor::{self, OnChange, Parts, Supervisor};
use crate::tasks::Tasks;

/// Errors of starting the bridge, and the reasons it stops other than a clean shutdown.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes client could not be built.
    #[error(transparent)]
    Kubernetes(#[from] kubernetes::Error),
    /// A resource could not be resolved.
    #[error(transparent)]
    Discovery(#[from] discovery::Error),
    /// The sink could not be connected.
    #[error(transparent)]
    Sink(#[from] sink::Error),
    /// The checkpoint store could not be prepared.
    #[error(transparent)]
    Stores(#[from] stores::Error),
    /// A watch could not start, or failed for good while running.
    #[error(transparent)]
    Supervisor(#[from] supervisor::Error),
    /// Leader election failed.
    #[error(transparent)]
    Leader(#[from] leader::Error),
    /// Joining the replicas that share the watches failed.
    #[error(transparent)]
    Shard(#[from] shard::Error),
    /// The admin server could not start.
    #[error(transparent)]
    Admin(#[from] admin::Error),
    /// Every watch stopped, so nothing is left to publish.
    #[error("every watch stopped")]
    AllStopped,
    /// The supervisor task ended abnormally.
    #[error("the supervisor task failed")]
    SupervisorTask(#[source] tokio::task::JoinError),
    /// The supervisor task ended without a result: it panicked (the log says where).
    #[error("the supervisor task panicked")]
    SupervisorPanicked,
    /// Validity was lost while running.
    #[error("leadership lost: exiting so that a restart waits as a follower")]
    LeadershipLost,
    /// A signal came during start-up, and the start did not finish within the grace period.
    #[error("shutdown grace period exceeded during start-up")]
    GraceExceededDuringStart,
    /// In-flight events were still undelivered when the grace period ended.
    #[error("shutdown grace period exceeded")]
    GraceExceeded,
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The running bridge: a [`Supervisor`] task owning every watch and pipeline.
#[derive(Debug)]
pub struct Bridge {
    stop: CancellationToken,
    supervisor: JoinHandle<Option<supervisor::Result<()>>>,
    sink: Arc<AnySink>,
}

/// Follows snapshot requests ([`crate::snapshot::requests`]) until `stop`, when they are on.
fn serve_snapshot_requests(
    settings: &SnapshotRequestsConfig,
    home: kube::Client,
    admin: Arc<admin::State>,
    fleet: bool,
    stop: &CancellationToken,
    tasks: &Tasks,
) {
    if !settings.enabled {
        return;
    }
    let namespace = settings.namespace(|k| std::env::var(k).ok());
    info!(namespace = %namespace, "following snapshot requests");
    let requests = Requests::new(Api::namespaced(home, &namespace), admin, fleet);
    tasks.spawn("snapshot requests", requests.serve(stop.clone()));
}

impl Bridge {
    /// Resolves every resource, connects the sink, loads each watch's checkpoint and starts one
    /// watch and one pipeline per resource and namespace scope; from then on the supervisor
    /// follows CRDs and namespaces. The admin server is told the running watches whenever they
    /// change. Every task it spawns is one of `tasks`. A fleet starts its clusters one by one
    /// instead ([`Bridge::start_fleet`]).
    pub async fn start(
        config: Config,
        leadership: Option<Validity>,
        shard: Option<Shard>,
        admin: Arc<admin::State>,
        tasks: &Tasks,
    ) -> Result<Self> {
        if config.fleet.is_fleet() {
            return Self::start_fleet(config, leadership, shard, admin, tasks).await;
        }
        let (client, api_server) = kubernetes::client_and_url(&config.kubernetes).await?;
        let resources = discovery::resolve(&client, &config.resources).await?;
        let shared = sink::connect(&config.sink).await?;
        info!(
            sink = shared.name(),
            resources = resources.len(),
            "sink connected"
        );
        let stores = Stores::prepare(&config, &shared, &client).await?;
        let stop = CancellationToken::new();
        let cluster = config.cluster.clone();
        let (config_requests, client_home) = (config.snapshot_requests.clone(), client.clone());
        let admin_requests = admin.clone();
        let total = Budget::new(config.delivery.max_total_queue_bytes);
        admin.set_queue_budget(total.clone());
        let on_change: OnChange = Box::new(move |w| admin.set_watches(&cluster, w));
        let mut supervisor = Supervisor::new(Parts {
            config: Arc::new(config),
            client,
            api_server,
            sink: shared.clone(),
            stores,
            leadership,
            shard,
            stop: stop.clone(),
            on_change,
            tasks: tasks.clone(),
            total,
        });
        supervisor.start(resources).await?;
        info!(watches = supervisor.handles().len(), "bridge started");
        serve_snapshot_requests(
            &config_requests,
            client_home,
            admin_requests,
            false,
            &stop,
            tasks,
        );
        Ok(Self {
            stop,
            supervisor: tasks.spawn("supervisor", supervisor.run()),
            sink: shared,
        })
    }

    /// Connects the sink and starts the fleet: each cluster of `clusters[]` and of the
    /// kubeconfig Secrets starts, fails and recovers on its own, so the start succeeds once the
    /// sink is connected (and the Secrets are followed, when configured).
    async fn start_fleet(
        config: Config,
        leadership: Option<Validity>,
        shard: Option<Shard>,
        admin: Arc<admin::State>,
        tasks: &Tasks,
    ) -> Result<Self> {
        let shared = sink::connect(&config.sink).await?;
        let metrics = Arc::new(fleet::Metrics::default());
        admin.set_fleet(metrics.clone());
        let stop = CancellationToken::new();
        let (found_tx, found) = watch::channel(Found::default());
        if let Some(secrets) = config.fleet.secrets.clone() {
            let client = kubernetes::client(&config.kubernetes).await?;
            let api = Api::namespaced(client, &secrets.namespace);
            let counted = metrics.clone();
            let told = admin.clone();
            let follow = secret::follow(
                api,
                secrets,
                found_tx,
                move |r| fleet::count_refusal(&counted, r),
                move |trouble| told.set_fleet_problem(trouble),
            );
            let until = stop.clone();
            tasks.spawn("cluster Secret follower", async move {
                tokio::select! {
                    () = until.cancelled() => {}
                    () = follow => {}
                }
            });
        }
        info!(
            sink = shared.name(),
            clusters = config.fleet.clusters.len(),
            secrets = config.fleet.secrets.is_some(),
            "sink connected; starting the fleet"
        );
        if config.snapshot_requests.enabled {
            // The requests live in the bridge's own cluster, which a fleet may not be able to
            // reach (its members named by kubeconfig files only): it then serves none.
            match kubernetes::client(&config.kubernetes).await {
                Ok(home) => {
                    let requests = &config.snapshot_requests;
                    serve_snapshot_requests(requests, home, admin.clone(), true, &stop, tasks);
                }
                Err(e) => {
                    warn!(error = %e, "snapshot requests not followed: the bridge's own cluster cannot be reached")
                }
            }
        }
        let told = admin.clone();
        let members = Arc::new(fleet::Shared::new(
            Arc::new(config),
            shared.clone(),
            admin,
            leadership,
            shard,
            tasks.clone(),
            metrics,
        ));
        told.set_queue_budget(members.total.clone());
        Ok(Self {
            supervisor: tasks.spawn("fleet", fleet::run(members, found, stop.clone())),
            stop,
            sink: shared,
        })
    }

    /// Stops the watches, then waits up to `grace` for the pipelines to drain and the sink to
    /// flush. Returns whether everything drained in time.
    pub async fn shutdown(mut self, grace: Duration) -> bool {
        info!(
            grace_secs = grace.as_secs(),
            "shutting down: stopping watches, draining in-flight events"
        );
        self.stop.cancel();
        let deadline = tokio::time::Instant::now() + grace;
        let drained = tokio::time::timeout_at(deadline, &mut self.supervisor)
            .await
            .is_ok();
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.sink.flush(left.max(Duration::from_millis(100))).await;
        if !drained {
            warn!(
                "grace period over with events still in flight; they will be published again after restart"
            );
            self.supervisor.abort();
        }
        drained
    }

    /// Waits until a watch or pipeline fails for good (fenced, checkpoint store lost) and returns
    /// why; while everything is healthy it never returns.
    pub async fn failure(&mut self) -> Error {
        match (&mut self.supervisor).await {
            Ok(Some(Err(failure))) => failure.into(),
            Ok(Some(Ok(()))) => Error::AllStopped,
            Ok(None) => Error::SupervisorPanicked,
            Err(e) => Error::SupervisorTask(e),
        }
    }
}

/// How long the end of a run waits for its tasks to stop (each stops at its next await).
const TASKS_CLOSE_WITHIN: Duration = Duration::from_secs(5);

/// Runs the bridge of `config` until `stop` is cancelled (then drains), leadership is lost or a
/// watch fails for good. Serves the admin endpoints from the start; readiness turns true once
/// every watch has synced and false when shutdown begins. Returns once every task it spawned
/// has ended.
pub async fn run(config: Config, stop: CancellationToken) -> Result<()> {
    let tasks = Tasks::default();
    // The thread polling this future (the main thread, which runs the start) and one worker
    // flush their allocator caches while the bridge runs.
    tasks.spawn("allocator caches", allocator::release_idle_caches());
    let ran = tokio::select! {
        ran = run_bridge(config, stop, &tasks) => ran,
        () = allocator::release_idle_caches() => Ok(()),
    };
    tasks.close(TASKS_CLOSE_WITHIN).await;
    ran
}

async fn run_bridge(config: Config, stop: CancellationToken, tasks: &Tasks) -> Result<()> {
    let grace = Duration::from_secs(config.delivery.shutdown_grace_secs);
    let delay = Duration::from_secs(config.admin.shutdown_delay_secs);
    let admin = admin::State::new(config.sink.kind());
    admin::serve(&config.admin.address, admin.clone(), tasks).await?;
    if config.leader_election.enabled {
        admin.set_role(admin::Role::Follower);
    }
    // Waiting for leadership holds nothing: a signal simply ends the wait.
    let leader = tokio::select! {
        elected = leader::elect(&config, tasks) => elected?,
        () = stop.cancelled() => {
            admin.shutting_down();
            info!("stopped before start-up finished: nothing to drain");
            info!("shutdown complete");
            return Ok(());
        }
    };
    if leader.is_some() {
        admin.set_role(admin::Role::Leader);
    }
    let leadership = leader.as_ref().map(|l| l.validity().clone());
    // Joining holds nothing yet either: the member Lease expires if a signal ends the join.
    let shard = if config.sharding.enabled {
        tokio::select! {
            joined = Shard::join(&config, stop.clone(), tasks) => Some(joined?),
            () = stop.cancelled() => {
                admin.shutting_down();
                info!("stopped before start-up finished: nothing to drain");
                return Ok(());
            }
        }
    } else {
        None
    };
    if let Some(shard) = &shard {
        admin.set_shard(shard.metrics());
    }
    let started = Bridge::start(config, leadership.clone(), shard, admin.clone(), tasks);
    tokio::pin!(started);
    // A signal during start lets the start finish (it may have begun writing to the broker and
    // the checkpoint store), then drains: no half-written state, within the grace period.
    let deadline = tokio::select! {
        bridge = &mut started => {
            // The start ran on this thread: what it freed need not wait for the next flush.
            allocator::flush_thread_cache();
            let served = serve_until_stopped(bridge?, leadership, &admin, &stop, delay, grace).await;
            return hand_over(leader, served).await;
        }
        () = stop.cancelled() => tokio::time::Instant::now() + grace,
    };
    admin.shutting_down();
    info!("signal during start-up: finishing the start, then draining");
    let Ok(bridge) = tokio::time::timeout_at(deadline, started).await else {
        return Err(Error::GraceExceededDuringStart);
    };
    let drained = drain(
        bridge?,
        deadline.saturating_duration_since(tokio::time::Instant::now()),
    )
    .await;
    hand_over(leader, drained).await
}

/// After a clean shutdown (everything drained, nothing published any more), hands the leader
/// Lease over so a follower takes it at once; after a failed one it expires instead.
async fn hand_over(leader: Option<Leader>, shutdown: Result<()>) -> Result<()> {
    if let (Some(leader), Ok(())) = (leader, &shutdown) {
        leader.release().await;
    }
    shutdown
}

/// Runs the started bridge until the first signal, then drains it.
async fn serve_until_stopped(
    mut bridge: Bridge,
    leadership: Option<Validity>,
    admin: &admin::State,
    stop: &CancellationToken,
    delay: Duration,
    grace: Duration,
) -> Result<()> {
    let lost = async {
        match &leadership {
            Some(l) => l.lost().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(lost);
    tokio::select! {
        () = stop.cancelled() => {}
        failure = bridge.failure() => return Err(failure),
        () = &mut lost => return Err(Error::LeadershipLost),
    }
    admin.shutting_down();
    if !delay.is_zero() {
        info!(
            delay_secs = delay.as_secs(),
            "shutdown delay: not ready, still publishing"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            failure = bridge.failure() => return Err(failure),
            () = &mut lost => return Err(Error::LeadershipLost),
        }
    }
    drain(bridge, grace).await
}

/// Stops the watches and drains what is in flight within `grace`.
async fn drain(bridge: Bridge, grace: Duration) -> Result<()> {
    if bridge.shutdown(grace).await {
        info!("shutdown complete");
        Ok(())
    } else {
        Err(Error::GraceExceeded)
    }
}
