//! The admin server: `/livez`, `/readyz` and `/metrics` (Prometheus text format).
//!
//! Readiness is true once every watch has published its initial state (or resumed from a
//! checkpoint) with the sink connected, and false again once shutdown starts. A follower waiting
//! for leadership is ready: standing by is its job, and a rollout must be able to replace it.
//! Metric names follow `kube_event_bridge_<name>_<unit>`, counters end in `_total`, and labels
//! come from closed sets (resource, namespace scope of a configured watch, kind, reason, sink).
//! The API request counters are the process's ([`throttle::Counters::process`]).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info};

use crate::pipeline::{LATENCY_BUCKETS, STALL_REASONS, Status};
use crate::runtime::WatchHandle;
use crate::throttle;

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

/// Leadership as the admin server reports it.
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
    watches: Mutex<Vec<WatchHandle>>,
    api: Arc<throttle::Counters>,
}

impl State {
    /// State for a bridge publishing to `sink`.
    pub fn new(sink: &'static str) -> Arc<Self> {
        Arc::new(Self {
            sink,
            role: AtomicU8::new(Role::Single as u8),
            shutting_down: AtomicBool::new(false),
            started: AtomicBool::new(false),
            watches: Mutex::new(Vec::new()),
            api: throttle::Counters::process(),
        })
    }

    /// Sets the role.
    pub fn set_role(&self, role: Role) {
        self.role.store(role as u8, Ordering::Relaxed);
    }

    /// Registers the running watches (again whenever they change).
    pub fn set_watches(&self, watches: Vec<WatchHandle>) {
        *self.watches.lock().unwrap_or_else(|e| e.into_inner()) = watches;
        self.started.store(true, Ordering::Relaxed);
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
    /// (named with its reason and the broker's message).
    pub fn readiness(&self) -> Result<(), String> {
        if self.shutting_down.load(Ordering::Relaxed) {
            return Err("shutting down".into());
        }
        if self.role() == Role::Follower {
            return Ok(());
        }
        if !self.started.load(Ordering::Relaxed) {
            return Err("starting".into());
        }
        let watches = self.watches.lock().unwrap_or_else(|e| e.into_inner());
        let mut problems = Vec::new();
        for w in watches.iter() {
            if let Some(stall) = w.status.stall() {
                problems.push(format!(
                    "watch {} in {} stalled for {} s ({}): {}",
                    w.resource,
                    w.namespace.as_deref().unwrap_or("*"),
                    stall.since.elapsed().as_secs(),
                    stall.reason,
                    stall.error
                ));
            } else if !w.status.synced.load(Ordering::Relaxed) {
                problems.push(format!(
                    "watch {} in {} has not published its initial state yet",
                    w.resource,
                    w.namespace.as_deref().unwrap_or("*")
                ));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }

    /// The `/metrics` document.
    pub fn metrics(&self) -> String {
        let watches = self
            .watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut m = Families {
            out: String::new(),
            watches: &watches,
        };
        m.header("build_info", "gauge", "Build information.");
        m.line(
            "build_info",
            &format!(
                "version=\"{}\",sink=\"{}\"",
                env!("CARGO_PKG_VERSION"),
                self.sink
            ),
            1,
        );
        m.header(
            "ready",
            "gauge",
            "1 when every watch has synced and shutdown has not started.",
        );
        m.line("ready", "", u8::from(self.ready()));
        m.header(
            "leader",
            "gauge",
            "1 when this replica publishes (leader, or no leader election).",
        );
        m.line("leader", "", u8::from(self.role() != Role::Follower));
        let api = &self.api;
        m.header(
            "api_requests_total",
            "counter",
            "Requests started against the Kubernetes API server (a watch counts once).",
        );
        m.line("api_requests_total", "", api.started());
        m.header(
            "api_requests_throttled_total",
            "counter",
            "API server requests delayed by kubernetes.qps and kubernetes.burst.",
        );
        m.line("api_requests_throttled_total", "", api.throttled());
        m.header(
            "api_throttle_wait_seconds_total",
            "counter",
            "Time API server requests were held back waiting for kubernetes.qps.",
        );
        m.line(
            "api_throttle_wait_seconds_total",
            "",
            format!("{:.6}", api.waited().as_secs_f64()),
        );
        let kinds = ["added", "modified", "deleted"];
        m.per_label(
            "events_observed_total",
            "counter",
            "Changes classified for publishing, by resource and change.",
            "change",
            &kinds,
            |s, i, _| s.observed[i].load(Ordering::Relaxed),
        );
        m.per_label(
            "events_published_total",
            "counter",
            "Events acknowledged by the broker, by resource and change.",
            "change",
            &kinds,
            |s, i, _| s.published[i].load(Ordering::Relaxed),
        );
        m.per_watch(
            "events_filtered_total",
            "counter",
            "Changes dropped by the configured event-type filter.",
            |s| s.filtered.load(Ordering::Relaxed).to_string(),
        );
        m.per_watch(
            "events_suppressed_total",
            "counter",
            "Updates not published because only noise changed (resourceVersion, generation, managedFields, ignorePaths).",
            |s| s.suppressed.load(Ordering::Relaxed).to_string(),
        );
        m.per_watch(
            "events_truncated_total",
            "counter",
            "Events published as a reference because the whole event exceeded the broker's message size.",
            |s| s.truncated.load(Ordering::Relaxed).to_string(),
        );
        m.per_watch(
            "events_repaired_total",
            "counter",
            "Events found by a relist after lost watch history.",
            |s| s.repaired.load(Ordering::Relaxed).to_string(),
        );
        m.per_label(
            "publish_failures_total",
            "counter",
            "Publish failures: retried (sent again), refused for good and skipped (too_large, invalid, encode), or refused for every event and retried after a pause (not_authorized, unknown_topic, invalid_topic).",
            "reason",
            &[
                "retried",
                "encode",
                "too_large",
                "invalid",
                "not_authorized",
                "unknown_topic",
                "invalid_topic",
            ],
            |s, _, reason| match reason {
                "retried" => s.retried.load(Ordering::Relaxed),
                "encode" => s.encode_failed.load(Ordering::Relaxed),
                "not_authorized" | "unknown_topic" | "invalid_topic" => by_reason(&s.blocked, reason),
                other => by_reason(&s.rejected, other),
            },
        );
        m.per_label(
            "watch_stalled",
            "gauge",
            "1 while a watch cannot publish, by reason: the broker refuses every event (not_authorized, unknown_topic, invalid_topic) or publishing has failed for 30 s (publish_failing, broker_unavailable). It retries and resumes by itself.",
            "reason",
            &STALL_REASONS,
            |s, _, reason| u64::from(s.stall().is_some_and(|st| st.reason == reason)),
        );
        m.per_watch(
            "transactions_aborted_total",
            "counter",
            "Kafka transactions aborted after a failed delivery or commit; their events were sent again.",
            |s| s.aborted_transactions.load(Ordering::Relaxed).to_string(),
        );
        m.header(
            "publish_latency_seconds",
            "histogram",
            "Time from a change being received to the broker's acknowledgement.",
        );
        for w in &watches {
            let l = labels(w);
            for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
                m.line(
                    "publish_latency_seconds_bucket",
                    &format!("{l},le=\"{bound}\""),
                    w.status.latency_buckets[i].load(Ordering::Relaxed),
                );
            }
            let count = w.status.latency_count.load(Ordering::Relaxed);
            m.line(
                "publish_latency_seconds_bucket",
                &format!("{l},le=\"+Inf\""),
                count,
            );
            m.line(
                "publish_latency_seconds_sum",
                &l,
                w.status.latency_sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
            );
            m.line("publish_latency_seconds_count", &l, count);
        }
        m.per_watch(
            "queue_depth_events",
            "gauge",
            "Events queued or awaiting acknowledgement.",
            |s| s.queue_depth.load(Ordering::Relaxed).to_string(),
        );
        m.per_label(
            "watch_restarts_total",
            "counter",
            "Watch restarts by reason.",
            "reason",
            &crate::watch::RESTART_REASONS,
            |s, _, r| by_reason(&s.restarts, r),
        );
        m.per_label(
            "relists_total",
            "counter",
            "LISTs by reason: initial (no checkpoint) or gone (410).",
            "reason",
            &["initial", "gone"],
            |s, _, r| by_reason(&s.relists, r),
        );
        m.per_watch("checkpoints_total", "counter", "Checkpoints saved.", |s| {
            s.checkpoints.load(Ordering::Relaxed).to_string()
        });
        m.per_watch(
            "checkpoints_corrupt_total",
            "counter",
            "Stored checkpoints that could not be decoded; the watch listed again to repair.",
            |s| s.checkpoints_corrupt.load(Ordering::Relaxed).to_string(),
        );
        m.per_watch(
            "checkpoint_age_seconds",
            "gauge",
            "Time since the last checkpoint was saved (-1 before the first).",
            |s| {
                format!(
                    "{:.3}",
                    s.checkpoint()
                        .map(|(_, at)| at.elapsed().as_secs_f64())
                        .unwrap_or(-1.0)
                )
            },
        );
        m.per_watch(
            "checkpoint_lag_resource_versions",
            "gauge",
            "Watch position minus checkpointed resourceVersion (numeric resourceVersions).",
            |s| {
                let position = s.position.load(Ordering::Relaxed);
                let saved: u64 = s
                    .checkpoint_resource_version()
                    .and_then(|r| r.parse().ok())
                    .unwrap_or(position);
                position.saturating_sub(saved).to_string()
            },
        );
        m.out
    }
}

/// The labels of one watch's samples.
fn labels(w: &WatchHandle) -> String {
    format!(
        "resource=\"{}\",namespace=\"{}\"",
        w.resource,
        w.namespace.as_deref().unwrap_or("*")
    )
}

/// A closed-set counter's value.
fn by_reason(map: &Mutex<std::collections::BTreeMap<&'static str, u64>>, reason: &str) -> u64 {
    map.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(reason)
        .copied()
        .unwrap_or(0)
}

/// Writes metric families in the Prometheus text format.
struct Families<'a> {
    out: String,
    watches: &'a [WatchHandle],
}

impl Families<'_> {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(
            self.out,
            "# HELP {NAMESPACE}_{name} {help}\n# TYPE {NAMESPACE}_{name} {kind}"
        );
    }

    fn line(&mut self, name: &str, labels: &str, value: impl std::fmt::Display) {
        let _ = if labels.is_empty() {
            writeln!(self.out, "{NAMESPACE}_{name} {value}")
        } else {
            writeln!(self.out, "{NAMESPACE}_{name}{{{labels}}} {value}")
        };
    }

    /// One sample per watch.
    fn per_watch(&mut self, name: &str, kind: &str, help: &str, value: impl Fn(&Status) -> String) {
        self.header(name, kind, help);
        for w in self.watches {
            let v = value(&w.status);
            self.line(name, &labels(w), v);
        }
    }

    /// One sample per watch and value of `label`.
    fn per_label(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        label: &str,
        values: &[&str],
        value: impl Fn(&Status, usize, &str) -> u64,
    ) {
        self.header(name, kind, help);
        for w in self.watches {
            for (i, v) in values.iter().enumerate() {
                let n = value(&w.status, i, v);
                self.line(name, &format!("{},{label}=\"{v}\"", labels(w)), n);
            }
        }
    }
}

/// Binds `address` and serves the admin endpoints until the process ends. Returns the bound
/// address (useful with port 0).
pub async fn serve(address: &str, state: Arc<State>) -> Result<SocketAddr, Error> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|source| Error::Bind {
            address: address.into(),
            source,
        })?;
    let local = listener.local_addr().map_err(|source| Error::Bind {
        address: address.into(),
        source,
    })?;
    info!(address = %local, "admin server listening");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let state = state.clone();
            tokio::spawn(async move {
                if let Err(e) = handle(stream, &state).await {
                    debug!(error = %e, "admin request failed");
                }
            });
        }
    });
    Ok(local)
}

async fn handle(mut stream: TcpStream, state: &State) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), stream.read(&mut chunk))
            .await
            .map_err(std::io::Error::other)??;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let request = String::from_utf8_lossy(&buf);
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET", "/livez") => ("200 OK", "text/plain", "ok\n".to_string()),
        ("GET", "/readyz") => match state.readiness() {
            Ok(()) => ("200 OK", "text/plain", "ok\n".to_string()),
            Err(why) => (
                "503 Service Unavailable",
                "text/plain",
                format!("not ready: {why}\n"),
            ),
        },
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            state.metrics(),
        ),
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "method not allowed\n".to_string(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Status;

    fn watch(synced: bool) -> WatchHandle {
        let status = Arc::new(Status::default());
        status.synced.store(synced, Ordering::Relaxed);
        WatchHandle {
            resource: "v1/configmaps".into(),
            namespace: None,
            status,
        }
    }

    #[test]
    fn readiness_follows_sync_role_and_shutdown() {
        let s = State::new("stdout");
        assert!(!s.ready(), "not started yet");
        s.set_watches(Vec::new());
        assert!(
            s.ready(),
            "started, nothing to sync (a wildcard matching nothing yet)"
        );
        s.set_watches(vec![watch(true), watch(false)]);
        assert!(!s.ready(), "one watch has not synced");
        s.set_watches(vec![watch(true), watch(true)]);
        assert!(s.ready());
        s.shutting_down();
        assert!(!s.ready(), "false once shutdown starts");
        let stalled = watch(true);
        stalled
            .status
            .set_stall("not_authorized", "Broker: Topic authorization failed");
        let s = State::new("kafka");
        s.set_watches(vec![watch(true), stalled]);
        let why = s.readiness().unwrap_err();
        assert!(
            why.contains("not_authorized") && why.contains("Topic authorization failed"),
            "{why}"
        );
        assert!(s.metrics().contains(
            "kube_event_bridge_watch_stalled{resource=\"v1/configmaps\",namespace=\"*\",reason=\"not_authorized\"} 1"
        ));
        let f = State::new("kafka");
        f.set_role(Role::Follower);
        assert!(f.ready(), "a follower standing by is ready");
        assert!(f.metrics().contains("kube_event_bridge_leader 0"));
    }
}
