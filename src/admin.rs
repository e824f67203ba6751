//! The admin server: `/livez`, `/readyz` and `/metrics` (Prometheus text format).
//!
//! Readiness is true once every watch has published its initial state (or resumed from a
//! checkpoint) with the sink connected, and false again once shutdown starts. A follower waiting
//! for leadership is ready: standing by is its job, and a rollout must be able to replace it.
//! Metric names follow `kube_event_bridge_<name>_<unit>`, counters end in `_total`, and labels
//! come from closed sets (resource, namespace scope of a configured watch, kind, reason, sink).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info};

use crate::pipeline::LATENCY_BUCKETS;
use crate::runtime::WatchHandle;

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
    watches: Mutex<Vec<WatchHandle>>,
}

impl State {
    /// State for a bridge publishing to `sink`.
    pub fn new(sink: &'static str) -> Arc<Self> {
        Arc::new(Self {
            sink,
            role: AtomicU8::new(Role::Single as u8),
            shutting_down: AtomicBool::new(false),
            watches: Mutex::new(Vec::new()),
        })
    }

    /// Sets the role.
    pub fn set_role(&self, role: Role) {
        self.role.store(role as u8, Ordering::Relaxed);
    }

    /// Registers the running watches.
    pub fn set_watches(&self, watches: Vec<WatchHandle>) {
        *self.watches.lock().unwrap_or_else(|e| e.into_inner()) = watches;
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
        if self.shutting_down.load(Ordering::Relaxed) {
            return false;
        }
        if self.role() == Role::Follower {
            return true;
        }
        let watches = self.watches.lock().unwrap_or_else(|e| e.into_inner());
        !watches.is_empty()
            && watches
                .iter()
                .all(|w| w.status.synced.load(Ordering::Relaxed))
    }

    /// The `/metrics` document.
    pub fn metrics(&self) -> String {
        let watches = self
            .watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut out = String::new();
        let mut family =
            |name: &str, kind: &str, help: &str, samples: &mut dyn FnMut(&mut String)| {
                let _ = writeln!(
                    out,
                    "# HELP {NAMESPACE}_{name} {help}\n# TYPE {NAMESPACE}_{name} {kind}"
                );
                samples(&mut out);
            };
        let labels = |w: &WatchHandle| {
            format!(
                "resource=\"{}\",namespace=\"{}\"",
                w.resource,
                w.namespace.as_deref().unwrap_or("*")
            )
        };
        let kinds = ["added", "modified", "deleted"];
        family("build_info", "gauge", "Build information.", &mut |o| {
            let _ = writeln!(
                o,
                "{NAMESPACE}_build_info{{version=\"{}\",sink=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION"),
                self.sink
            );
        });
        family(
            "ready",
            "gauge",
            "1 when every watch has synced and shutdown has not started.",
            &mut |o| {
                let _ = writeln!(o, "{NAMESPACE}_ready {}", u8::from(self.ready()));
            },
        );
        family(
            "leader",
            "gauge",
            "1 when this replica publishes (leader, or no leader election).",
            &mut |o| {
                let _ = writeln!(
                    o,
                    "{NAMESPACE}_leader {}",
                    u8::from(self.role() != Role::Follower)
                );
            },
        );
        family(
            "events_observed_total",
            "counter",
            "Changes classified for publishing, by resource and change.",
            &mut |o| {
                for w in &watches {
                    for (i, k) in kinds.iter().enumerate() {
                        let _ = writeln!(
                            o,
                            "{NAMESPACE}_events_observed_total{{{},change=\"{k}\"}} {}",
                            labels(w),
                            w.status.observed[i].load(Ordering::Relaxed)
                        );
                    }
                }
            },
        );
        family(
            "events_published_total",
            "counter",
            "Events acknowledged by the broker, by resource and change.",
            &mut |o| {
                for w in &watches {
                    for (i, k) in kinds.iter().enumerate() {
                        let _ = writeln!(
                            o,
                            "{NAMESPACE}_events_published_total{{{},change=\"{k}\"}} {}",
                            labels(w),
                            w.status.published[i].load(Ordering::Relaxed)
                        );
                    }
                }
            },
        );
        family(
            "events_filtered_total",
            "counter",
            "Changes dropped by the configured event-type filter.",
            &mut |o| {
                for w in &watches {
                    let _ = writeln!(
                        o,
                        "{NAMESPACE}_events_filtered_total{{{}}} {}",
                        labels(w),
                        w.status.filtered.load(Ordering::Relaxed)
                    );
                }
            },
        );
        family(
            "events_repaired_total",
            "counter",
            "Events found by a relist after lost watch history.",
            &mut |o| {
                for w in &watches {
                    let _ = writeln!(
                        o,
                        "{NAMESPACE}_events_repaired_total{{{}}} {}",
                        labels(w),
                        w.status.repaired.load(Ordering::Relaxed)
                    );
                }
            },
        );
        family(
            "publish_failures_total",
            "counter",
            "Publish failures: reason retried (sent again) or a permanent refusal (too_large, not_authorized, invalid, encode).",
            &mut |o| {
                for w in &watches {
                    let _ = writeln!(
                        o,
                        "{NAMESPACE}_publish_failures_total{{{},reason=\"retried\"}} {}",
                        labels(w),
                        w.status.retried.load(Ordering::Relaxed)
                    );
                    let _ = writeln!(
                        o,
                        "{NAMESPACE}_publish_failures_total{{{},reason=\"encode\"}} {}",
                        labels(w),
                        w.status.encode_failed.load(Ordering::Relaxed)
                    );
                    for reason in ["too_large", "not_authorized", "invalid"] {
                        let n = w
                            .status
                            .rejected
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get(reason)
                            .copied()
                            .unwrap_or(0);
                        let _ = writeln!(
                            o,
                            "{NAMESPACE}_publish_failures_total{{{},reason=\"{reason}\"}} {n}",
                            labels(w)
                        );
                    }
                }
            },
        );
        family(
            "publish_latency_seconds",
            "histogram",
            "Time from a change being received to the broker's acknowledgement.",
            &mut |o| {
                for w in &watches {
                    for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
                        let _ = writeln!(
                            o,
                            "{NAMESPACE}_publish_latency_seconds_bucket{{{},le=\"{bound}\"}} {}",
                            labels(w),
                            w.status.latency_buckets[i].load(Ordering::Relaxed)
                        );
                    }
                    let count = w.status.latency_count.load(Ordering::Relaxed);
                    let _ = writeln!(
                        o,
                        "{NAMESPACE}_publish_latency_seconds_bucket{{{},le=\"+Inf\"}} {count}",
                        labels(w)
                    );
                    let _ = writeln!(
                        o,
                        "{NAMESPACE}_publish_latency_seconds_sum{{{}}} {}",
                        labels(w),
                        w.status.latency_sum_micros.load(Ordering::Relaxed) as f64 / 1e6
                    );
                    let _ = writeln!(
                        o,
                        "{NAMESPACE}_publish_latency_seconds_count{{{}}} {count}",
                        labels(w)
                    );
                }
            },
        );
        family(
            "queue_depth_events",
            "gauge",
            "Events queued or awaiting acknowledgement.",
            &mut |o| {
                for w in &watches {
                    let _ = writeln!(
                        o,
                        "{NAMESPACE}_queue_depth_events{{{}}} {}",
                        labels(w),
                        w.status.queue_depth.load(Ordering::Relaxed)
                    );
                }
            },
        );
        family(
            "watch_restarts_total",
            "counter",
            "Watch restarts by reason.",
            &mut |o| {
                for w in &watches {
                    for reason in ["gone", "forbidden", "not_found", "request", "status"] {
                        let n = w
                            .status
                            .restarts
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get(reason)
                            .copied()
                            .unwrap_or(0);
                        let _ = writeln!(
                            o,
                            "{NAMESPACE}_watch_restarts_total{{{},reason=\"{reason}\"}} {n}",
                            labels(w)
                        );
                    }
                }
            },
        );
        family(
            "relists_total",
            "counter",
            "LISTs by reason: initial (no checkpoint) or gone (410).",
            &mut |o| {
                for w in &watches {
                    for reason in ["initial", "gone"] {
                        let n = w
                            .status
                            .relists
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get(reason)
                            .copied()
                            .unwrap_or(0);
                        let _ = writeln!(
                            o,
                            "{NAMESPACE}_relists_total{{{},reason=\"{reason}\"}} {n}",
                            labels(w)
                        );
                    }
                }
            },
        );
        family(
            "checkpoints_total",
            "counter",
            "Checkpoints saved.",
            &mut |o| {
                for w in &watches {
                    let _ = writeln!(
                        o,
                        "{NAMESPACE}_checkpoints_total{{{}}} {}",
                        labels(w),
                        w.status.checkpoints.load(Ordering::Relaxed)
                    );
                }
            },
        );
        family(
            "checkpoint_age_seconds",
            "gauge",
            "Time since the last checkpoint was saved (-1 before the first).",
            &mut |o| {
                for w in &watches {
                    let age = w
                        .status
                        .checkpoint()
                        .map(|(_, at)| at.elapsed().as_secs_f64())
                        .unwrap_or(-1.0);
                    let _ = writeln!(
                        o,
                        "{NAMESPACE}_checkpoint_age_seconds{{{}}} {age:.3}",
                        labels(w)
                    );
                }
            },
        );
        family(
            "checkpoint_lag_resource_versions",
            "gauge",
            "Watch position minus checkpointed resourceVersion (numeric resourceVersions).",
            &mut |o| {
                for w in &watches {
                    let position = w.status.position.load(Ordering::Relaxed);
                    let saved: u64 = w
                        .status
                        .checkpoint_resource_version()
                        .and_then(|r| r.parse().ok())
                        .unwrap_or(position);
                    let _ = writeln!(
                        o,
                        "{NAMESPACE}_checkpoint_lag_resource_versions{{{}}} {}",
                        labels(w),
                        position.saturating_sub(saved)
                    );
                }
            },
        );
        out
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
        ("GET", "/readyz") if state.ready() => ("200 OK", "text/plain", "ok\n".to_string()),
        ("GET", "/readyz") => (
            "503 Service Unavailable",
            "text/plain",
            "not ready\n".to_string(),
        ),
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
        assert!(!s.ready(), "no watches yet");
        s.set_watches(vec![watch(true), watch(false)]);
        assert!(!s.ready(), "one watch has not synced");
        s.set_watches(vec![watch(true), watch(true)]);
        assert!(s.ready());
        s.shutting_down();
        assert!(!s.ready(), "false once shutdown starts");
        let f = State::new("kafka");
        f.set_role(Role::Follower);
        assert!(f.ready(), "a follower standing by is ready");
        assert!(f.metrics().contains("kube_event_bridge_leader 0"));
    }
}
