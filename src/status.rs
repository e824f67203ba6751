//! A watch's status: its counters (changes observed, events published, failures by reason,
//! restarts, relists, checkpoints), its publish latency histogram, its position and last
//! checkpoint, whether it has synced, and why it is stalled, if it is.
//!
//! The watch task ([`crate::watch`]) writes restarts, lists by method, fallbacks from streaming
//! lists and its own stall; the pipeline
//! ([`crate::pipeline`]) writes everything about classifying, publishing and checkpointing. The
//! admin server ([`crate::admin`]) reads it for `/readyz` and `/metrics`. Counters are atomics;
//! the counters by closed-set reason, the last checkpoint and the stalls sit behind mutexes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::change::ChangeKind;

/// Upper bounds (seconds) of the latency histograms (read to sent, to acknowledged, to
/// visible).
/// Fine below 25 ms, where the acknowledgement latency of a healthy broker lies, and below
/// 250 ms, where a Kafka commit makes events visible, so their percentiles can be read from the
/// histograms.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 5.0,
    30.0,
];

/// Counters and position of one watch, read by the admin server.
#[derive(Debug, Default)]
pub struct Status {
    /// With sharding: how long the watch had no owner before this replica took it, in
    /// milliseconds, as seen here (0 for a watch that never had an owner).
    pub unowned_before_ms: AtomicU64,
    /// Changes classified for publishing, by kind (added, modified, deleted).
    pub observed: [AtomicU64; 3],
    /// Events the broker acknowledged, by kind.
    pub published: [AtomicU64; 3],
    /// Events the broker refused for good, by reason.
    pub rejected: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Changes dropped by the event-type filter.
    pub filtered: AtomicU64,
    /// Updates not published because only noise changed (resourceVersion, generation,
    /// managedFields, ignored paths).
    pub suppressed: AtomicU64,
    /// Events published as a reference because the whole event exceeded the broker's size.
    pub truncated: AtomicU64,
    /// Changes that could not be encoded.
    pub encode_failed: AtomicU64,
    /// Trace context annotations ignored as invalid (the event started a new trace, or went
    /// without the `tracestate`).
    pub trace_context_invalid: AtomicU64,
    /// Publish attempts that were retried.
    pub retried: AtomicU64,
    /// Repaired events (found by a relist after lost history).
    pub repaired: AtomicU64,
    /// Watch restarts by reason (`gone`, `forbidden`, `not_found`, `request`, `status`).
    pub restarts: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Lists by reason (`initial`, `gone`).
    pub relists: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Lists completed, by method (`stream`, `list`: [`crate::watch::LIST_METHODS`]).
    pub lists: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Streaming lists the API server refused, listed in pages instead.
    pub list_fallbacks: AtomicU64,
    /// Requests to the API server the watch spared because another watch of its resource had
    /// found out, by reason ([`crate::watch::SPARED_REASONS`]).
    pub spared: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Checkpoints saved.
    pub checkpoints: AtomicU64,
    /// Stored checkpoints that could not be decoded (the watch relisted to repair).
    pub checkpoints_corrupt: AtomicU64,
    /// Events queued or awaiting acknowledgement.
    pub queue_depth: AtomicU64,
    /// From a change being read to the broker's acknowledgement of its event.
    pub latency: Histogram,
    /// From a change being read to its event being handed to the broker client: the bridge's
    /// own part of [`Status::latency`].
    pub send_latency: Histogram,
    /// Kafka transactions only: from a change being read to the commit of the transaction
    /// holding its event, when `read_committed` consumers can see it.
    pub visible_latency: Histogram,
    /// The resourceVersion the watch has reached (numeric form; 0 if not numeric).
    pub position: AtomicU64,
    /// Whether the initial list (or the resume) has been published and acknowledged.
    pub synced: AtomicBool,
    /// Events refused for a reason that blocks the whole destination, by reason (each
    /// refusal counts; the event is sent again after a pause).
    pub blocked: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Transactions aborted and sent again (Kafka with checkpoints).
    pub aborted_transactions: AtomicU64,
    checkpointed: std::sync::Mutex<Option<(String, std::time::Instant)>>,
    stall: std::sync::Mutex<Option<Stall>>,
    /// The watch side: it has kept failing (decoding, authorization, requests) for
    /// [`STALL_AFTER`]; cleared when it delivers again.
    watch_stall: std::sync::Mutex<Option<Stall>>,
    watch_stalled: AtomicBool,
}

/// Why a watch cannot publish at the moment: a refusal of every event (authorization, a missing
/// topic) or a broker that stayed unreachable past [`STALL_AFTER`]. The watch keeps retrying and
/// resumes by itself once the cause is gone; meanwhile `/readyz` fails naming the reason.
#[derive(Debug, Clone)]
pub struct Stall {
    /// Closed-set label (`not_authorized`, `not_found`, `unknown_topic`, `invalid_topic`,
    /// `publish_failing`, `broker_unavailable`, `watch_failing`, `cannot_start`).
    pub reason: &'static str,
    /// The broker's last message.
    pub error: String,
    /// When the watch stopped publishing.
    pub since: std::time::Instant,
}

/// How long publishing may keep failing with retriable errors before the watch reports itself
/// stalled (refusals of every event stall it at once).
pub const STALL_AFTER: Duration = Duration::from_secs(30);

/// Closed set of [`Stall`] reasons, for metrics.
pub const STALL_REASONS: [&str; 8] = [
    "not_authorized",
    "not_found",
    "unknown_topic",
    "invalid_topic",
    "publish_failing",
    "broker_unavailable",
    "watch_failing",
    "cannot_start",
];

/// Adds one to a counter keyed by a closed-set reason.
pub fn count(
    map: &std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    reason: &'static str,
) {
    *map.lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(reason)
        .or_default() += 1;
}

/// The index of `kind` in the per-kind counters ([`Status::observed`], [`Status::published`]).
pub(crate) fn kind_index(kind: ChangeKind) -> usize {
    match kind {
        ChangeKind::Added => 0,
        ChangeKind::Modified => 1,
        ChangeKind::Deleted => 2,
    }
}

impl Status {
    /// The resourceVersion of the last saved checkpoint and when it was saved.
    pub fn checkpoint(&self) -> Option<(String, std::time::Instant)> {
        self.checkpointed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The resourceVersion of the last saved checkpoint.
    pub fn checkpoint_resource_version(&self) -> Option<String> {
        self.checkpoint().map(|(rv, _)| rv)
    }

    /// Why the watch cannot publish now, if it cannot: the sink's side first, then the watch's.
    pub fn stall(&self) -> Option<Stall> {
        let publishing = self.stall.lock().unwrap_or_else(|e| e.into_inner()).clone();
        publishing.or_else(|| {
            self.watch_stall
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        })
    }

    /// Records that the watch side has kept failing; says whether this is news.
    pub(crate) fn set_watch_stall(&self, error: &str) -> bool {
        let mut stall = self.watch_stall.lock().unwrap_or_else(|e| e.into_inner());
        let news = stall.is_none();
        let since = stall
            .as_ref()
            .map_or_else(std::time::Instant::now, |s| s.since);
        *stall = Some(Stall {
            reason: "watch_failing",
            error: error.to_string(),
            since,
        });
        self.watch_stalled.store(true, Ordering::Relaxed);
        news
    }

    /// The watch delivers again; returns the stall it leaves, if any.
    pub(crate) fn clear_watch_stall(&self) -> Option<Stall> {
        // Read on every item: a plain load while nothing is stalled.
        if !self.watch_stalled.load(Ordering::Relaxed)
            || !self.watch_stalled.swap(false, Ordering::Relaxed)
        {
            return None;
        }
        self.watch_stall
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Records that the watch cannot publish; says whether this is news (a new reason).
    pub(crate) fn set_stall(&self, reason: &'static str, error: &str) -> bool {
        let mut stall = self.stall.lock().unwrap_or_else(|e| e.into_inner());
        let news = stall.as_ref().is_none_or(|s| s.reason != reason);
        let since = match stall.as_ref() {
            Some(s) => s.since,
            None => std::time::Instant::now(),
        };
        *stall = Some(Stall {
            reason,
            error: error.to_string(),
            since,
        });
        news
    }

    /// Records that the watch publishes again; returns the stall it leaves, if any.
    pub(crate) fn clear_stall(&self) -> Option<Stall> {
        self.stall.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Clears the stall if it has this reason; returns it.
    pub(crate) fn clear_stall_if(&self, reason: &str) -> Option<Stall> {
        let mut stall = self.stall.lock().unwrap_or_else(|e| e.into_inner());
        if stall.as_ref().is_some_and(|s| s.reason == reason) {
            stall.take()
        } else {
            None
        }
    }

    pub(crate) fn set_checkpointed(&self, rv: &str) {
        *self.checkpointed.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((rv.to_string(), std::time::Instant::now()));
    }
}

/// A latency histogram over [`LATENCY_BUCKETS`], written by the pipeline and read by the admin
/// server.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Cumulative counts per [`LATENCY_BUCKETS`] bound.
    pub buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    /// Sum of the observations, in microseconds.
    pub sum_micros: AtomicU64,
    /// Number of observations.
    pub count: AtomicU64,
}

impl Histogram {
    /// Counts one observation.
    pub(crate) fn observe(&self, seconds: f64) {
        for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.sum_micros
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }
}
