//! One watch's path to the sink: classify what the watch saw against the known-object index
//! ([`classify`]), filter, encode, send in order, take acknowledgements in order
//! ([`delivery`]), and save a checkpoint only when every event before it has been acknowledged.
//!
//! Acknowledgements are handled before new input (a `biased` select), and at most
//! `max_in_flight` events await one, so memory stays bounded while a slow broker applies
//! backpressure all the way to the watch. When a checkpoint is due the pipeline stops taking
//! input until what is in flight is acknowledged, then saves: the saved resourceVersion and index
//! never run ahead of the broker.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::budget::{self, Reservation};
use crate::change::{Change, ChangeKind, Origin};
use crate::checkpoint::{self, Checkpoint, Store};
use crate::config::SnapshotPolicy;
use crate::encode::{self, ResourceInfo};
use crate::leader::Leadership;
use crate::payload::Mode;
use crate::sink::AnySink;
use crate::watch::Item;

mod classify;
mod delivery;
#[cfg(test)]
mod tests;

use classify::Classifier;
use delivery::{Failing, Flight, HELD_BYTES_MAX};

/// Upper bounds (seconds) of the publish latency histogram: observed to acknowledged.
pub const LATENCY_BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0];

/// Counters and position of one watch, read by the admin server.
#[derive(Debug, Default)]
pub struct Status {
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
    /// Publish attempts that were retried.
    pub retried: AtomicU64,
    /// Repaired events (found by a relist after lost history).
    pub repaired: AtomicU64,
    /// Watch restarts by reason (`gone`, `forbidden`, `not_found`, `request`, `status`).
    pub restarts: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Lists by reason (`initial`, `gone`).
    pub relists: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Checkpoints saved.
    pub checkpoints: AtomicU64,
    /// Stored checkpoints that could not be decoded (the watch relisted to repair).
    pub checkpoints_corrupt: AtomicU64,
    /// Events queued or awaiting acknowledgement.
    pub queue_depth: AtomicU64,
    /// Publish latency histogram: cumulative counts per [`LATENCY_BUCKETS`] bound.
    pub latency_buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    /// Sum of publish latencies, in microseconds.
    pub latency_sum_micros: AtomicU64,
    /// Number of latency observations.
    pub latency_count: AtomicU64,
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
    /// Closed-set label (`not_authorized`, `unknown_topic`, `invalid_topic`,
    /// `publish_failing`, `broker_unavailable`).
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
pub const STALL_REASONS: [&str; 6] = [
    "not_authorized",
    "unknown_topic",
    "invalid_topic",
    "publish_failing",
    "broker_unavailable",
    "watch_failing",
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

fn kind_index(kind: ChangeKind) -> usize {
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
    fn clear_watch_stall(&self) -> Option<Stall> {
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
    fn clear_stall(&self) -> Option<Stall> {
        self.stall.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn set_checkpointed(&self, rv: &str) {
        *self.checkpointed.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((rv.to_string(), std::time::Instant::now()));
    }

    fn observe_latency(&self, seconds: f64) {
        for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                self.latency_buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_sum_micros
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        self.latency_count.fetch_add(1, Ordering::Relaxed);
    }
}

/// Why a pipeline stopped: this instance must not publish for the watch any more.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The lease was lost: another replica may be publishing now.
    #[error("watch {watch}: leadership lost, stopped publishing")]
    LeadershipLost {
        /// The watch (its `source`).
        watch: String,
    },
    /// A newer producer with the same transactional id took over, or the producer broke for
    /// good.
    #[error("watch {watch}: the producer was fenced by another instance")]
    Fenced {
        /// The watch (its `source`).
        watch: String,
    },
    /// The checkpoint store fenced this instance.
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::Error),
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything one pipeline needs.
#[derive(Debug)]
pub struct Pipeline {
    /// Resource-wide event attributes.
    pub info: Arc<ResourceInfo>,
    /// The change kinds to publish.
    pub events: BTreeSet<ChangeKind>,
    /// The sink.
    pub sink: Arc<AnySink>,
    /// Events awaiting acknowledgement at most.
    pub max_in_flight: usize,
    /// Counters and position.
    pub status: Arc<Status>,
    /// Where checkpoints go.
    pub store: Store,
    /// The loaded checkpoint, if any.
    pub resume: Option<Checkpoint>,
    /// What the first list publishes when there is no checkpoint.
    pub snapshot: SnapshotPolicy,
    /// How often a busy watch checkpoints.
    pub checkpoint_interval: Duration,
    /// Held leadership, when replicas elect a leader: nothing is published without it.
    pub leadership: Option<Leadership>,
    /// Periodic heartbeats, if enabled.
    pub heartbeat: Option<Heartbeat>,
}

/// Heartbeat settings of one watch.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    /// Time between two heartbeats.
    pub interval: Duration,
    /// Topic or subject.
    pub destination: String,
    /// The watch's key (message key, id prefix).
    pub watch: crate::checkpoint::WatchKey,
}

struct State {
    /// The known-object index and the list in progress.
    classifier: Classifier,
    position: Option<String>,
    committed: Option<String>,
    sync_pending: bool,
    last_commit: Instant,
    next_heartbeat: Instant,
    /// Diff mode only: the last published version of each object, to diff the next against.
    previous: HashMap<Box<str>, Box<[u8]>>,
    /// Events sent and not yet settled (or, in a transaction, not yet committed).
    flight: Flight,
    /// Publishing keeps failing: since when, and the backoff between attempts.
    failing: Option<Failing>,
}

impl Pipeline {
    /// Runs until the watch closes its side of the channel, then drains what is in flight and
    /// saves a last checkpoint. An error means this instance must stop (fenced, or leadership
    /// lost).
    pub async fn run(mut self, mut rx: mpsc::Receiver<(Item, Reservation)>) -> Result<()> {
        let mut st = self.start();
        let transactional = self.sink.transactions().is_some();
        loop {
            if let Some(l) = &self.leadership
                && !l.is_valid()
            {
                error!("leadership lost: stopping this watch");
                return Err(Error::LeadershipLost {
                    watch: self.info.source.clone(),
                });
            }
            self.status
                .queue_depth
                .store((st.flight.queue.len() + rx.len()) as u64, Ordering::Relaxed);
            let listing = st.classifier.listing();
            let pending = st.position != st.committed && !listing;
            // A transaction holding part of a list is committed as it goes (events only, the
            // checkpoint stays where it was), so that no transaction outgrows the broker's
            // timeout or this process's memory.
            let flushing = transactional && listing && !st.flight.held.is_empty();
            let due = (pending || flushing)
                && (st.last_commit.elapsed() >= self.checkpoint_interval
                    || st.flight.held_bytes >= HELD_BYTES_MAX);
            let idle = st.flight.queue.is_empty();
            if idle && self.settle(&mut st, due, listing).await? {
                continue;
            }
            if let Some(hb) = self.heartbeat.clone()
                && idle
                && !listing
                && st.position.is_some()
                && Instant::now() >= st.next_heartbeat
            {
                st.next_heartbeat = Instant::now() + hb.interval;
                self.heartbeat(&hb, &mut st).await?;
            }
            let heartbeat_wake = self
                .heartbeat
                .as_ref()
                .filter(|_| st.position.is_some())
                .map(|_| st.next_heartbeat);
            let wake = st.last_commit + self.checkpoint_interval;
            let room = st.flight.queue.len() < self.max_in_flight;
            tokio::select! {
                biased;
                Some(done) = st.flight.queue.next(), if !idle => self.complete(done, &mut st).await?,
                () = self.voided(), if !idle => self.restart_transaction(None, &mut st).await?,
                () = tokio::time::sleep_until(st.flight.progress + STALL_AFTER), if !idle && !st.flight.silence_reported => self.broker_silent(&mut st),
                () = tokio::time::sleep_until(wake), if (pending || flushing) && idle => {}
                () = tokio::time::sleep_until(heartbeat_wake.unwrap_or(wake)), if heartbeat_wake.is_some() && idle => {}
                item = rx.recv(), if room && !due => {
                    let Some((item, reservation)) = item else { break };
                    self.take(item, reservation, &mut st).await?;
                }
            }
        }
        while self.settle_next(&mut st).await? {}
        if st.position != st.committed && !st.classifier.listing() {
            self.commit(&mut st).await?;
        }
        Ok(())
    }

    /// The state at start: from the loaded checkpoint, if any.
    fn start(&mut self) -> State {
        let resumed = self.resume.take();
        let committed = resumed.as_ref().and_then(|c| c.resource_version.clone());
        // A repair (a checkpoint that could not be decoded) lists as after a lost history.
        let repairs = resumed.is_some();
        let known = resumed.map(|c| c.known).unwrap_or_default();
        let classifier = Classifier::new(self.info.clone(), self.snapshot, known, repairs);
        let mut st = State {
            classifier,
            position: committed.clone(),
            committed,
            sync_pending: false,
            last_commit: Instant::now(),
            next_heartbeat: Instant::now(),
            previous: HashMap::new(),
            flight: Flight::default(),
            failing: None,
        };
        if let Some(rv) = &st.committed {
            info!(rv = %rv, objects = st.classifier.known().len(), "resuming from checkpoint");
            self.status.set_checkpointed(rv);
            self.status.synced.store(true, Ordering::Relaxed);
        } else if self.store.durable() {
            // Everything a first checkpoint holds is new (after a repair: replaces what was stored).
            st.classifier.known().mark_all_dirty();
        }
        st
    }

    /// Takes one item from the watch: classifies it, counts what the classification found, and
    /// publishes what it produced.
    async fn take(&self, item: Item, reservation: Reservation, st: &mut State) -> Result<()> {
        // A list that begins (or is abandoned) proves nothing: a LIST failing again and again
        // sends those too.
        if !matches!(item, Item::ListBegin | Item::ListAbort)
            && let Some(stall) = self.status.clear_watch_stall()
        {
            info!(
                stalled_secs = stall.since.elapsed().as_secs(),
                "the watch delivers again"
            );
        }
        let step = st.classifier.classify(item);
        if let Some(reason) = step.relist {
            count(&self.status.relists, reason);
        }
        if step.suppressed {
            self.status.suppressed.fetch_add(1, Ordering::Relaxed);
        }
        if step.listed && !self.status.synced.load(Ordering::Relaxed) {
            st.sync_pending = true;
        }
        if let Some(rv) = step.position {
            self.status
                .position
                .store(rv.parse().unwrap_or(0), Ordering::Relaxed);
            st.position = Some(rv);
        }
        // The item's budget goes with its event, if it makes one.
        let mut reservation = Some(reservation);
        for change in step.change.into_iter().chain(step.deletes) {
            self.publish(change, reservation.take(), st).await?;
        }
        Ok(())
    }

    /// With nothing in flight: the watch is synced once its initial state is acknowledged, and
    /// a due checkpoint is saved (during a list, the open transaction is committed instead).
    /// Returns whether it committed.
    async fn settle(&mut self, st: &mut State, due: bool, listing: bool) -> Result<bool> {
        if st.sync_pending {
            st.sync_pending = false;
            self.status.synced.store(true, Ordering::Relaxed);
            info!("initial state published");
        }
        if !due {
            return Ok(false);
        }
        if listing {
            self.commit_events(st).await?;
        } else {
            self.commit(st).await?;
        }
        Ok(true)
    }

    /// Filters, encodes and sends one change. In diff mode, `st.previous` holds the last
    /// published version of each object.
    async fn publish(
        &self,
        change: Change,
        budget: Option<Reservation>,
        st: &mut State,
    ) -> Result<()> {
        self.status.observed[kind_index(change.kind)].fetch_add(1, Ordering::Relaxed);
        if change.origin == Origin::Repaired {
            self.status.repaired.fetch_add(1, Ordering::Relaxed);
        }
        if !self.events.contains(&change.kind) {
            self.status.filtered.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let diff = self.info.payload == Mode::Diff;
        let uid = change.object.metadata.uid.as_deref().unwrap_or_default();
        let last = diff.then(|| st.previous.get(uid)).flatten();
        let mut event = match encode::encode(&self.info, change, last.map(|b| &b[..])) {
            Ok(encoded) => {
                if diff {
                    let uid: Box<str> = encoded.event.uid.as_str().into();
                    match (encoded.event.kind, encoded.object) {
                        (ChangeKind::Deleted, _) => st.previous.remove(&uid),
                        (_, Some(object)) => st.previous.insert(uid, object.into_boxed_slice()),
                        (_, None) => None,
                    };
                }
                encoded.event
            }
            Err(error) => {
                self.status.encode_failed.fetch_add(1, Ordering::Relaxed);
                error!(error = %error, "cannot encode change, skipped");
                return Ok(());
            }
        };
        event.budget = budget;
        if !self.sink.ordered_in_flight() {
            // Never two publishes of one object awaiting acknowledgement at once.
            while st.flight.uids.contains_key(&event.uid) && self.settle_next(st).await? {}
            *st.flight.uids.entry(event.uid.clone()).or_default() += 1;
        }
        st.flight.push(self.sink.send(event).await);
        Ok(())
    }

    /// Publishes a heartbeat with the checkpoint's resourceVersion and the lag, then commits (a
    /// Kafka heartbeat becomes visible with the transaction it was sent in).
    async fn heartbeat(&mut self, hb: &Heartbeat, st: &mut State) -> Result<()> {
        let position = st.position.clone().unwrap_or_default();
        self.commit(st).await?;
        let Some(committed) = st.committed.clone() else {
            return Ok(());
        };
        let report = encode::HeartbeatReport {
            watch_id: &hb.watch.id,
            watch: &hb.watch.description,
            checkpoint: &committed,
            position: &position,
            queue_depth: self.status.queue_depth.load(Ordering::Relaxed),
        };
        let payload = encode::heartbeat(&self.info, &report, time::OffsetDateTime::now_utc());
        if let Err(e) = self
            .sink
            .send_raw(&hb.destination, &hb.watch.id, payload)
            .await
        {
            // The broker client's own message says why.
            let cause =
                std::error::Error::source(&e).map_or_else(|| e.to_string(), |c| c.to_string());
            warn!(error = %cause, "heartbeat not published");
            return Ok(());
        }
        if self.sink.transactions().is_some() {
            // The heartbeat sits in the open transaction: commit it now.
            self.commit_events(st).await?;
        }
        Ok(())
    }

    async fn commit(&mut self, st: &mut State) -> Result<()> {
        let Some(rv) = st.position.clone() else {
            return Ok(());
        };
        match self.store.save(&rv, st.classifier.known()).await {
            Ok(()) => {
                self.status.checkpoints.fetch_add(1, Ordering::Relaxed);
                self.status.set_checkpointed(&rv);
                st.committed = Some(rv);
                st.flight.committed();
            }
            Err(e @ checkpoint::Error::Fenced { .. }) => {
                error!(error = %e, "fenced: another instance owns this watch now");
                return Err(e.into());
            }
            Err(e) if self.sink.transactions().is_some() => {
                // The checkpoint records went down with the transaction: write every bucket
                // with the next one.
                st.classifier.known().mark_all_dirty();
                self.resend_after_abort(st, &e).await?;
            }
            Err(e) => {
                warn!(error = %e, "checkpoint not saved, will retry");
                st.classifier.known().mark_all_dirty();
            }
        }
        st.last_commit = Instant::now();
        Ok(())
    }
}

/// The bytes an item weighs in the watch's budget: its object's JSON size.
pub fn item_bytes(item: &Item) -> usize {
    match item {
        Item::Event(_, object, _) | Item::Listed(object, _) => budget::serialized_size(object),
        _ => 0,
    }
}
