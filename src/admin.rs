//! The admin server: `/livez`, `/readyz` and `/metrics` (OpenMetrics text to a scraper that asks
//! for it, as Prometheus does; the Prometheus text format to others).
//!
//! Readiness is true once every watch has published its initial state (or resumed from a
//! checkpoint) with the sink connected, and false again once shutdown starts. A follower waiting
//! for leadership is ready: standing by is its job, and a rollout must be able to replace it.
//! Metric names follow `kube_event_bridge_<name>_<unit>`, counters end in `_total`, and labels
//! come from closed sets (resource, namespace scope of a configured watch, kind, reason, sink).
//! The API request counters are the process's ([`throttle::Counters::process`]).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_io_timeout::TimeoutStream;
use tracing::{debug, info, warn};

use crate::budget::Budget;
use crate::supervisor::WatchHandle;
use crate::tasks::Tasks;
use crate::throttle;

mod metrics;
mod process;
mod text_format;

/// Metric name prefix.
pub const NAMESPACE: &str = "kube_event_bridge";

/// Errors of the admin server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The address could not be bound.
    #[error("admin.address: cannot listen on {address}")]
    Bind {
        /// The address.
        address: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// The counters of snapshots on demand served by this replica.
#[derive(Debug, Default)]
pub struct SnapshotCounters {
    /// Snapshots ended, by [`SNAPSHOT_RESULTS`].
    pub ended: [AtomicU64; 2],
    /// Objects decided, by [`SNAPSHOT_OUTCOMES`].
    pub objects: [AtomicU64; 3],
    /// Walks going on now.
    pub running: AtomicU64,
}

/// The `result` label of `snapshots_total`.
pub const SNAPSHOT_RESULTS: [&str; 2] = ["complete", "failed"];
/// The `outcome` label of `snapshot_objects_total`.
pub const SNAPSHOT_OUTCOMES: [&str; 3] = ["emitted", "skipped", "pruned"];

/// Validity as the admin server reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Role {
    /// No leader election: this replica publishes.
    Single = 0,
    /// Waiting for the lease.
    Follower = 1,
    /// Holding the lease.
    Leader = 2,
}

/// What the admin server reports, shared with the runtime.
#[derive(Debug)]
pub struct State {
    sink: &'static str,
    role: AtomicU8,
    shutting_down: AtomicBool,
    /// Whether the bridge has started its watches (there may be none: a wildcard can match
    /// nothing yet).
    started: AtomicBool,
    /// Whether the bridge watches a fleet: then it is ready while one cluster publishes.
    fleet: AtomicBool,
    /// Each cluster's running watches and, in a fleet, why it does not publish.
    clusters: Mutex<BTreeMap<String, ClusterView>>,
    /// Sharding's counters, when replicas share the watches.
    shard: Mutex<Option<Arc<crate::shard::Metrics>>>,
    /// The fleet's counters, when the bridge watches a fleet.
    fleet_metrics: Mutex<Option<Arc<crate::fleet::Metrics>>>,
    /// Why the fleet's members cannot be followed (their Secrets unreadable), and since when.
    fleet_problem: Mutex<Option<(String, std::time::Instant)>>,
    api: Arc<throttle::Counters>,
    /// The process's byte budget, once the bridge has made it.
    queue_budget: Mutex<Option<Budget>>,
    /// Snapshots on demand served here.
    pub snapshots: SnapshotCounters,
    /// Bumped whenever the running watches change (snapshot requests are routed by them).
    watches_changed: tokio::sync::watch::Sender<u64>,
    /// Holds the collector that reads this state at scrape time.
    registry: Registry,
    /// The standard `process_*` metrics.
    process: Registry,
}

impl State {
    /// State for a bridge publishing to `sink`.
    pub fn new(sink: &'static str) -> Arc<Self> {
        Arc::new_cyclic(|state| Self {
            sink,
            role: AtomicU8::new(Role::Single as u8),
            shutting_down: AtomicBool::new(false),
            started: AtomicBool::new(false),
            fleet: AtomicBool::new(false),
            clusters: Mutex::new(BTreeMap::new()),
            shard: Mutex::new(None),
            fleet_metrics: Mutex::new(None),
            fleet_problem: Mutex::new(None),
            queue_budget: Mutex::new(None),
            api: throttle::Counters::process(),
            snapshots: SnapshotCounters::default(),
            watches_changed: tokio::sync::watch::Sender::new(0),
            registry: metrics::registry(state.clone()),
            process: process::registry(),
        })
    }

    /// Sets the role.
    pub fn set_role(&self, role: Role) {
        self.role.store(role as u8, Ordering::Relaxed);
    }

    /// Registers the running watches of `cluster` (again whenever they change).
    pub fn set_watches(&self, cluster: &str, watches: Vec<WatchHandle>) {
        self.cluster(cluster, |c| c.watches = watches);
        self.started.store(true, Ordering::Relaxed);
        self.watches_changed.send_modify(|n| *n += 1);
    }

    /// Every cluster's running watches.
    pub fn watch_handles(&self) -> Vec<WatchHandle> {
        let clusters = self.lock_clusters();
        clusters.values().flat_map(|c| c.watches.clone()).collect()
    }

    /// Told whenever the running watches change.
    pub fn subscribe_watches(&self) -> tokio::sync::watch::Receiver<u64> {
        self.watches_changed.subscribe()
    }

    /// Reports the process's byte budget (`delivery.maxTotalQueueBytes`) in the metrics.
    pub fn set_queue_budget(&self, budget: Budget) {
        *self.queue_budget.lock().unwrap_or_else(|e| e.into_inner()) = Some(budget);
    }

    fn queue_budget(&self) -> Option<Budget> {
        self.queue_budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Marks the bridge as watching a fleet: ready while at least one cluster publishes, with
    /// the others named in the body of `/readyz`; `/metrics` shows the fleet's counters.
    pub fn set_fleet(&self, metrics: Arc<crate::fleet::Metrics>) {
        *self.fleet_metrics.lock().unwrap_or_else(|e| e.into_inner()) = Some(metrics);
        self.fleet.store(true, Ordering::Relaxed);
        self.started.store(true, Ordering::Relaxed);
    }

    fn fleet_metrics(&self) -> Option<Arc<crate::fleet::Metrics>> {
        self.fleet_metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records why `cluster` cannot publish (unreachable, refused), or that it can again.
    pub fn set_cluster_problem(&self, cluster: &str, problem: Option<String>) {
        self.cluster(cluster, |c| {
            c.problem = problem.map(|p| (p, std::time::Instant::now()));
        });
    }

    /// Records why the fleet's members cannot be followed (their Secrets cannot be read), or
    /// that they can again: named in `/readyz`, and not ready while no cluster publishes.
    pub fn set_fleet_problem(&self, problem: Option<String>) {
        let mut current = self.fleet_problem.lock().unwrap_or_else(|e| e.into_inner());
        match problem {
            None => *current = None,
            Some(p) => {
                let since = current
                    .as_ref()
                    .map_or_else(std::time::Instant::now, |c| c.1);
                *current = Some((p, since));
            }
        }
    }

    /// Forgets a cluster that left the fleet.
    pub fn forget_cluster(&self, cluster: &str) {
        self.lock_clusters().remove(cluster);
    }

    fn cluster(&self, cluster: &str, f: impl FnOnce(&mut ClusterView)) {
        f(self.lock_clusters().entry(cluster.to_string()).or_default());
    }

    fn lock_clusters(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ClusterView>> {
        self.clusters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers sharding's counters (`/metrics` then shows the `shard_*` families).
    pub fn set_shard(&self, metrics: Arc<crate::shard::Metrics>) {
        *self.shard.lock().unwrap_or_else(|e| e.into_inner()) = Some(metrics);
    }

    fn shard(&self) -> Option<Arc<crate::shard::Metrics>> {
        self.shard.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Marks the start of shutdown: readiness turns false.
    pub fn shutting_down(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
    }

    fn role(&self) -> Role {
        match self.role.load(Ordering::Relaxed) {
            1 => Role::Follower,
            2 => Role::Leader,
            _ => Role::Single,
        }
    }

    /// Whether `/readyz` answers 200.
    pub fn ready(&self) -> bool {
        self.readiness().is_ok()
    }

    /// Readiness, or why not: shutting down, a watch not synced yet, or a watch stalled
    /// (named with its reason and the broker's message). In a fleet, ready while at least one
    /// cluster publishes, with what keeps the others from it.
    pub fn readiness(&self) -> Result<Vec<String>, String> {
        if self.shutting_down.load(Ordering::Relaxed) {
            return Err("shutting down".into());
        }
        if self.role() == Role::Follower {
            return Ok(Vec::new());
        }
        if !self.started.load(Ordering::Relaxed) {
            return Err("starting".into());
        }
        let fleet = self.fleet.load(Ordering::Relaxed);
        let clusters = self.lock_clusters();
        let mut problems = Vec::new();
        let mut publishing = 0;
        for (name, c) in clusters.iter() {
            let before = problems.len();
            c.problems(&mut problems);
            if fleet {
                for p in &mut problems[before..] {
                    *p = format!("cluster {name}: {p}");
                }
            }
            publishing += usize::from(problems.len() == before);
        }
        drop(clusters);
        let fleet_problem = self.fleet_problem.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((problem, since)) = fleet_problem.as_ref() {
            problems.push(format!("{problem} (for {} s)", since.elapsed().as_secs()));
        }
        match (problems.is_empty(), fleet && publishing > 0) {
            (true, _) => Ok(Vec::new()),
            (false, true) => Ok(problems),
            (false, false) => Err(problems.join("\n")),
        }
    }

    /// Each cluster's name and whether it publishes (no problem, every watch synced).
    pub(crate) fn clusters_publishing(&self) -> Vec<(String, bool)> {
        let clusters = self.lock_clusters();
        clusters
            .iter()
            .map(|(name, c)| {
                let mut problems = Vec::new();
                c.problems(&mut problems);
                (name.clone(), problems.is_empty())
            })
            .collect()
    }

    /// The `/metrics` document (OpenMetrics text).
    pub fn metrics(&self) -> String {
        metrics::encode(&[&self.registry, &self.process])
    }

    /// The running watches of every cluster, as registered last.
    fn watches(&self) -> Vec<WatchHandle> {
        let clusters = self.lock_clusters();
        clusters.values().flat_map(|c| c.watches.clone()).collect()
    }
}

impl crate::fleet::Observer for State {
    fn watches(&self, cluster: &str, watches: Vec<WatchHandle>) {
        self.set_watches(cluster, watches);
    }

    fn problem(&self, cluster: &str, problem: Option<String>) {
        self.set_cluster_problem(cluster, problem);
    }

    fn left(&self, cluster: &str) {
        self.forget_cluster(cluster);
    }
}

/// What the admin server knows of one cluster.
#[derive(Debug, Default)]
struct ClusterView {
    watches: Vec<WatchHandle>,
    /// Why the cluster cannot publish, and since when.
    problem: Option<(String, std::time::Instant)>,
}

impl ClusterView {
    /// Adds what keeps this cluster from publishing: its own problem, and each watch stalled
    /// or not synced yet.
    fn problems(&self, out: &mut Vec<String>) {
        if let Some((problem, since)) = &self.problem {
            out.push(format!("{problem} (for {} s)", since.elapsed().as_secs()));
        }
        for w in &self.watches {
            if let Some(stall) = w.status.stall() {
                out.push(format!(
                    "watch {} in {} stalled for {} s ({}): {}",
                    w.resource,
                    w.namespace.as_deref().unwrap_or("*"),
                    stall.since.elapsed().as_secs(),
                    stall.reason,
                    stall.error
                ));
            } else if !w.status.synced.load(Ordering::Relaxed) {
                out.push(format!(
                    "watch {} in {} has not published its initial state yet",
                    w.resource,
                    w.namespace.as_deref().unwrap_or("*")
                ));
            }
        }
    }
}

/// Limits that keep the admin server cheap whatever its clients do: a bounded number of
/// connections, each with deadlines, so idle, slow or hostile clients cannot exhaust the
/// process's file descriptors, memory or CPU, and probes get through once they are cut.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Connections served at once; a connection beyond is answered 503 and closed at once.
    pub max_connections: usize,
    /// Time for a request's head (request line and headers) to arrive, counted from the
    /// connection's start or the end of the previous response: slow senders (slowloris) and
    /// idle keep-alive connections are closed after it.
    pub header_read_timeout: Duration,
    /// Time a write may make no progress (a client that stops reading) before the connection is
    /// closed.
    pub write_timeout: Duration,
    /// A connection's whole life, so also the longest a request and its response can take: then
    /// it is closed after its current response, or cut [`CLOSE_GRACE`] later.
    pub max_connection_age: Duration,
    /// Requests served on one keep-alive connection; the last response says `Connection: close`.
    pub max_requests_per_connection: u32,
}

impl Default for Limits {
    /// Probes and scrapes are a handful of connections, and a response (`/metrics` grows with
    /// the watches, to a few megabytes at a thousand) is written to a reading client well within
    /// these deadlines: they only ever cut clients that misbehave.
    fn default() -> Self {
        Self {
            max_connections: 64,
            header_read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            max_connection_age: Duration::from_secs(30),
            max_requests_per_connection: 100,
        }
    }
}

/// How long a connection past its age may finish its current response.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Request heads larger than this are refused (`431`); hyper's minimum.
const MAX_HEAD_BYTES: usize = 8 * 1024;

/// Sent, without waiting, to a connection refused because every slot is taken.
const BUSY: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

/// Binds `address` and serves the admin endpoints on tasks of `tasks` until they close, within
/// [`Limits::default`]. Returns the bound address (useful with port 0).
pub async fn serve(address: &str, state: Arc<State>, tasks: &Tasks) -> Result<SocketAddr, Error> {
    serve_with(address, state, Limits::default(), tasks).await
}

/// [`serve`] with explicit limits.
pub(crate) async fn serve_with(
    address: &str,
    state: Arc<State>,
    limits: Limits,
    tasks: &Tasks,
) -> Result<SocketAddr, Error> {
    let bind_error = |source| Error::Bind {
        address: address.into(),
        source,
    };
    let listener = TcpListener::bind(address).await.map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    info!(
        address = %local,
        max_connections = limits.max_connections,
        "admin server listening"
    );
    let connections = tasks.clone();
    tasks.spawn(
        "admin server",
        accept_loop(listener, state, limits, connections),
    );
    Ok(local)
}

/// Accepts connections while a slot is free; refuses the others at once; backs off when
/// accepting fails for a reason of the process (out of file descriptors), instead of spinning.
async fn accept_loop(listener: TcpListener, state: Arc<State>, limits: Limits, tasks: Tasks) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut failures = 0u32;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                failures = 0;
                stream
            }
            Err(error) => {
                if let Some(delay) = accept_backoff(&error, failures) {
                    failures = failures.saturating_add(1);
                    warn!(error = %error, retry_in_ms = delay.as_millis() as u64, "admin server cannot accept connections");
                    tokio::time::sleep(delay).await;
                }
                continue;
            }
        };
        match slots.clone().try_acquire_owned() {
            Ok(slot) => {
                let connection = serve_connection(stream, state.clone(), limits, slot);
                tasks.spawn("admin connection", connection);
            }
            Err(_) => {
                debug!(
                    max_connections = limits.max_connections,
                    "admin connection refused: every slot is taken"
                );
                // Best effort, never waiting: the socket closes when dropped.
                let _ = stream.try_write(BUSY);
            }
        }
    }
}

/// How long to wait after a failed accept: nothing when the error concerns only the connection
/// being accepted (the client went away), else a delay doubling from 10 ms to 1 s, so a process
/// out of file descriptors keeps serving its open connections instead of spinning.
fn accept_backoff(error: &std::io::Error, failures: u32) -> Option<Duration> {
    use std::io::ErrorKind::*;
    if matches!(
        error.kind(),
        ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted | WouldBlock
    ) {
        return None;
    }
    let millis = 10u64.saturating_mul(1 << failures.min(7)).min(1000);
    Some(Duration::from_millis(millis))
}

/// Serves one connection (HTTP/1.1, keep-alive) within `limits`, holding its `slot`.
async fn serve_connection(
    stream: TcpStream,
    state: Arc<State>,
    limits: Limits,
    _slot: OwnedSemaphorePermit,
) {
    let mut io = TimeoutStream::new(stream);
    io.set_write_timeout(Some(limits.write_timeout));
    let io = TokioIo::new(Box::pin(io));
    let served = AtomicU32::new(0);
    let service = service_fn(move |request: Request<Incoming>| {
        let accept = request
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok());
        let openmetrics = text_format::wants_openmetrics(accept);
        let mut response = route(request.method(), request.uri().path(), openmetrics, &state);
        if served.fetch_add(1, Ordering::Relaxed) + 1 >= limits.max_requests_per_connection {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        std::future::ready(Ok::<_, Infallible>(response))
    });
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true)
        .serve_connection(io, service);
    tokio::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = tokio::time::sleep(limits.max_connection_age) => {
            connection.as_mut().graceful_shutdown();
            match tokio::time::timeout(CLOSE_GRACE, connection).await {
                Ok(result) => result,
                Err(_) => {
                    debug!("admin connection cut: older than its maximum age");
                    return;
                }
            }
        }
    };
    if let Err(error) = result {
        debug!(error = %error, "admin connection closed with an error");
    }
}

/// The response to `method` on `path`.
fn route(method: &Method, path: &str, openmetrics: bool, state: &State) -> Response<String> {
    const TEXT: &str = "text/plain; charset=utf-8";
    let (status, content_type, body) = match (method, path) {
        (&Method::GET, "/livez") => (StatusCode::OK, TEXT, "ok\n".to_string()),
        (&Method::GET, "/readyz") => match state.readiness() {
            Ok(others) if others.is_empty() => (StatusCode::OK, TEXT, "ok\n".to_string()),
            Ok(others) => (
                StatusCode::OK,
                TEXT,
                format!("ok; not publishing:\n{}\n", others.join("\n")),
            ),
            Err(why) => (
                StatusCode::SERVICE_UNAVAILABLE,
                TEXT,
                format!("not ready: {why}\n"),
            ),
        },
        (&Method::GET, "/metrics") if openmetrics => {
            (StatusCode::OK, metrics::CONTENT_TYPE, state.metrics())
        }
        (&Method::GET, "/metrics") => (
            StatusCode::OK,
            text_format::CONTENT_TYPE,
            text_format::from_openmetrics(&state.metrics()),
        ),
        (&Method::GET, _) => (StatusCode::NOT_FOUND, TEXT, "not found\n".to_string()),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            "method not allowed\n".to_string(),
        ),
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::Status;

    fn watch(synced: bool) -> WatchHandle {
        let status = Arc::new(Status::default());
        status.synced.store(synced, Ordering::Relaxed);
        WatchHandle {
            cluster: "dev".into(),
            resource: "v1/configmaps".into(),
            namespace: None,
            status,
            demand: None,
        }
    }

    #[test]
    fn readiness_follows_sync_role_and_shutdown() {
        let s = State::new("stdout");
        assert!(!s.ready(), "not started yet");
        s.set_watches("dev", Vec::new());
        assert!(
            s.ready(),
            "started, nothing to sync (a wildcard matching nothing yet)"
        );
        s.set_watches("dev", vec![watch(true), watch(false)]);
        assert!(!s.ready(), "one watch has not synced");
        s.set_watches("dev", vec![watch(true), watch(true)]);
        assert!(s.ready());
        s.shutting_down();
        assert!(!s.ready(), "false once shutdown starts");
        let stalled = watch(true);
        stalled
            .status
            .set_stall("not_authorized", "Broker: Topic authorization failed");
        let s = State::new("kafka");
        s.set_watches("dev", vec![watch(true), stalled]);
        let why = s.readiness().unwrap_err();
        assert!(
            why.contains("not_authorized") && why.contains("Topic authorization failed"),
            "{why}"
        );
        assert!(s.metrics().contains(
            "kube_event_bridge_watch_stalled{cluster=\"dev\",resource=\"v1/configmaps\",namespace=\"*\",reason=\"not_authorized\"} 1"
        ));
        let f = State::new("kafka");
        f.set_role(Role::Follower);
        assert!(f.ready(), "a follower standing by is ready");
        assert!(f.metrics().contains("kube_event_bridge_leader 0"));
    }

    #[test]
    fn a_fleet_is_ready_while_one_cluster_publishes_and_names_the_others() {
        let s = State::new("kafka");
        s.set_fleet(Arc::default());
        assert!(s.ready(), "a fleet with no cluster yet has nothing failing");
        s.set_watches("east", vec![watch(true)]);
        s.set_cluster_problem("west", Some("unreachable: connection refused".into()));
        let others = s.readiness().unwrap();
        assert_eq!(others.len(), 1, "{others:?}");
        assert!(
            others[0].starts_with("cluster west: unreachable: connection refused (for "),
            "{others:?}"
        );
        let (status, _, body) = parts(route(&Method::GET, "/readyz", true, &s));
        assert_eq!(status, 200);
        assert!(
            body.starts_with("ok; not publishing:\ncluster west: "),
            "{body}"
        );
        let metrics = s.metrics();
        for line in [
            "kube_event_bridge_cluster_publishing{cluster=\"east\"} 1",
            "kube_event_bridge_cluster_publishing{cluster=\"west\"} 0",
        ] {
            assert!(metrics.contains(line), "{line} in {metrics}");
        }
        s.set_watches("east", vec![watch(false)]);
        let why = s.readiness().unwrap_err();
        assert!(why.contains("cluster east: watch v1/configmaps"), "{why}");
        assert!(why.contains("cluster west: unreachable"), "{why}");
        s.set_cluster_problem("west", None);
        s.forget_cluster("east");
        assert!(s.ready(), "west publishes again, east left");
        s.set_fleet_problem(Some("clusterSecrets: cannot watch: forbidden".into()));
        let others = s.readiness().unwrap();
        assert!(
            others[0].starts_with("clusterSecrets: cannot watch: forbidden (for "),
            "{others:?}"
        );
        s.forget_cluster("west");
        assert!(
            !s.ready(),
            "no cluster publishes and the Secrets cannot be read"
        );
        s.set_fleet_problem(None);
        assert!(s.ready());
    }

    fn parts(r: Response<String>) -> (u16, String, String) {
        let content_type = r.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_string();
        (r.status().as_u16(), content_type, r.into_body())
    }

    #[test]
    fn routes() {
        let s = State::new("stdout");
        let text = "text/plain; charset=utf-8".to_string();
        let get = |path| parts(route(&Method::GET, path, true, &s));
        assert_eq!(get("/livez"), (200, text.clone(), "ok\n".into()));
        assert_eq!(
            get("/readyz"),
            (503, text.clone(), "not ready: starting\n".into())
        );
        s.set_watches("dev", vec![watch(true)]);
        assert_eq!(get("/readyz"), (200, text.clone(), "ok\n".into()));
        let (code, content_type, body) = get("/metrics");
        assert_eq!(
            (code, content_type.as_str()),
            (
                200,
                "application/openmetrics-text; version=1.0.0; charset=utf-8"
            )
        );
        // The allocator's and the process's figures move between two readings (other tests
        // allocate, open files and start threads meanwhile).
        let steady = |text: &str| {
            text.lines()
                .filter(|l| {
                    !l.starts_with("kube_event_bridge_allocator_bytes{")
                        && !l.starts_with("process_")
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(steady(&body), steady(&s.metrics()));
        // A scraper that does not ask for OpenMetrics gets the Prometheus text format.
        let (code, content_type, body) = parts(route(&Method::GET, "/metrics", false, &s));
        assert_eq!(
            (code, content_type.as_str()),
            (200, "text/plain; version=0.0.4; charset=utf-8")
        );
        assert!(body.contains("# TYPE kube_event_bridge_checkpoints_total counter\n"));
        assert!(!body.contains("# EOF"));
        assert_eq!(get("/nope"), (404, text.clone(), "not found\n".into()));
        assert_eq!(get("/livez/"), (404, text.clone(), "not found\n".into()));
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::HEAD] {
            assert_eq!(
                parts(route(&method, "/livez", true, &s)),
                (405, text.clone(), "method not allowed\n".into()),
                "{method}"
            );
        }
    }

    #[test]
    fn accept_backoff_skips_client_errors_and_doubles_up_to_a_second() {
        use std::io::{Error, ErrorKind};
        for kind in [ErrorKind::ConnectionAborted, ErrorKind::ConnectionReset] {
            assert_eq!(accept_backoff(&Error::from(kind), 5), None, "{kind:?}");
        }
        // EMFILE: the process is out of file descriptors.
        let emfile = Error::from_raw_os_error(24);
        let delays: Vec<u64> = (0..10)
            .map(|n| accept_backoff(&emfile, n).unwrap().as_millis() as u64)
            .collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        assert_eq!(
            accept_backoff(&emfile, u32::MAX),
            Some(Duration::from_secs(1))
        );
    }

    /// Limits for tests: `change` adjusts the defaults.
    async fn server(change: impl FnOnce(&mut Limits)) -> (SocketAddr, Arc<State>) {
        let mut limits = Limits::default();
        change(&mut limits);
        let state = State::new("stdout");
        state.set_watches("dev", Vec::new());
        let address = serve_with("127.0.0.1:0", state.clone(), limits, &Tasks::default())
            .await
            .unwrap();
        (address, state)
    }

    /// Reads one response: status code, head, body (by its Content-Length); `None` at EOF.
    async fn response(s: &mut TcpStream) -> Option<(u16, String, String)> {
        use tokio::io::AsyncReadExt;
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            if s.read(&mut byte).await.ok()? == 0 {
                return None;
            }
            buf.push(byte[0]);
        }
        let head = String::from_utf8(buf).unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length: ")?
                    .parse()
                    .ok()
            })
            .unwrap_or(0);
        let mut body = vec![0u8; length];
        s.read_exact(&mut body).await.ok()?;
        let code = head.split(' ').nth(1)?.parse().ok()?;
        Some((code, head, String::from_utf8(body).unwrap()))
    }

    async fn send(s: &mut TcpStream, path: &str) {
        use tokio::io::AsyncWriteExt;
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n");
        s.write_all(request.as_bytes()).await.unwrap();
    }

    /// Whether the peer closed `s` (EOF or reset), discarding what it sent.
    async fn closed(s: &mut TcpStream) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => continue,
            }
        }
    }

    /// Generous: only a stuck server takes this long.
    const WAIT: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn keep_alive_serves_requests_until_the_per_connection_limit() {
        let (address, _) = server(|l| l.max_requests_per_connection = 3).await;
        let mut s = TcpStream::connect(address).await.unwrap();
        for (i, path) in ["/livez", "/readyz?verbose=1", "/metrics"]
            .iter()
            .enumerate()
        {
            send(&mut s, path).await;
            let (code, head, _) = tokio::time::timeout(WAIT, response(&mut s))
                .await
                .unwrap()
                .expect("a response");
            assert_eq!(code, 200, "{path}: {head}");
            let close = head.to_ascii_lowercase().contains("connection: close");
            assert_eq!(close, i == 2, "only the last response closes: {head}");
        }
        assert!(tokio::time::timeout(WAIT, closed(&mut s)).await.unwrap());
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_are_refused_at_once() {
        let (address, _) = server(|l| {
            l.max_connections = 2;
            l.header_read_timeout = Duration::from_secs(3600);
        })
        .await;
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut s = TcpStream::connect(address).await.unwrap();
            // A served connection answers: it holds a slot.
            send(&mut s, "/livez").await;
            assert_eq!(response(&mut s).await.unwrap().0, 200);
            held.push(s);
        }
        for _ in 0..5 {
            let mut s = TcpStream::connect(address).await.unwrap();
            let (code, head, _) = tokio::time::timeout(WAIT, response(&mut s))
                .await
                .unwrap()
                .expect("a 503");
            assert_eq!(code, 503, "{head}");
            assert!(tokio::time::timeout(WAIT, closed(&mut s)).await.unwrap());
        }
        drop(held);
        // The slots come back once their connections close.
        let mut s = loop {
            let mut s = TcpStream::connect(address).await.unwrap();
            send(&mut s, "/readyz").await;
            match tokio::time::timeout(WAIT, response(&mut s)).await.unwrap() {
                Some((200, _, body)) => {
                    assert_eq!(body, "ok\n");
                    break s;
                }
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        send(&mut s, "/livez").await;
        assert_eq!(response(&mut s).await.unwrap().0, 200);
    }

    /// Polls `/readyz` on new connections until one answers 200.
    async fn until_ready(address: SocketAddr) {
        tokio::time::timeout(WAIT, async {
            loop {
                let mut s = TcpStream::connect(address).await.unwrap();
                send(&mut s, "/readyz").await;
                if let Some((200, _, _)) = response(&mut s).await {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("/readyz answers once the slow connections are cut");
    }

    #[tokio::test]
    async fn slow_and_idle_connections_are_cut_so_probes_get_through() {
        use tokio::io::AsyncWriteExt;
        let (address, _) = server(|l| {
            l.max_connections = 4;
            l.header_read_timeout = Duration::from_millis(200);
        })
        .await;
        let mut clients = Vec::new();
        for i in 0..4 {
            let mut s = TcpStream::connect(address).await.unwrap();
            if i % 2 == 0 {
                // Slowloris: a head that never ends.
                s.write_all(b"GET /livez HTTP/1.1\r\nX-Slow: ")
                    .await
                    .unwrap();
            }
            clients.push(s);
        }
        until_ready(address).await;
        for mut s in clients {
            assert!(tokio::time::timeout(WAIT, closed(&mut s)).await.unwrap());
        }
    }

    #[tokio::test]
    async fn connections_end_at_their_maximum_age() {
        let (address, _) = server(|l| {
            l.header_read_timeout = Duration::from_secs(3600);
            l.max_connection_age = Duration::from_millis(200);
        })
        .await;
        let mut s = TcpStream::connect(address).await.unwrap();
        send(&mut s, "/livez").await;
        assert_eq!(response(&mut s).await.unwrap().0, 200);
        assert!(tokio::time::timeout(WAIT, closed(&mut s)).await.unwrap());
    }

    /// A client that sends requests but never reads their responses: once the socket buffers
    /// are full, the write timeout closes the connection and frees its slot.
    #[tokio::test]
    async fn a_client_that_does_not_read_is_cut_by_the_write_timeout() {
        use tokio::io::AsyncWriteExt;
        let (address, _) = server(|l| {
            l.max_connections = 1;
            l.write_timeout = Duration::from_millis(200);
            l.header_read_timeout = Duration::from_secs(3600);
            l.max_connection_age = Duration::from_secs(3600);
            l.max_requests_per_connection = u32::MAX;
        })
        .await;
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let stalled = socket.connect(address).await.unwrap();
        let (_read, mut write) = stalled.into_split();
        let requests = "GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n".repeat(20_000);
        // Blocks once the server stops reading; ends when the server closes the connection.
        let writer = tokio::spawn(async move {
            let _ = write.write_all(requests.as_bytes()).await;
            write
        });
        until_ready(address).await;
        drop(writer);
    }
}
