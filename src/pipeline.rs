//! One watch's path to the sink: classify what the watch saw against the known-object index
//! ([`classify`]), filter, encode, send in order, take acknowledgements in order
//! ([`delivery`]), and save a checkpoint only when every event before it has been acknowledged.
//!
//! Acknowledgements are handled before new input (a `biased` select), and at most
//! `max_in_flight` events await one, so memory stays bounded while a slow broker applies
//! backpressure all the way to the watch. When a checkpoint is due the pipeline stops taking
//! input until what is in flight is acknowledged, then saves: the saved resourceVersion and index
//! never run ahead of the broker. A Kafka watch commits its transaction, with the checkpoint, on
//! a cadence of its own ([`Pipeline::commit_interval`]), so committed readers see events within
//! milliseconds of their acknowledgement.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{Instrument as _, error, info, warn};

use crate::budget::{self, Budget, Reservation};
use crate::change::{Change, ChangeKind, Origin};
use crate::checkpoint::{self, Checkpoint, Store};
use crate::config::SnapshotPolicy;
use crate::demand::Demand;
use crate::encode::{self, ResourceInfo};
use crate::lease::Validity;
use crate::payload::Mode;
use crate::sink::AnySink;
use crate::status::{STALL_AFTER, Status, count, kind_index};
use crate::watch::Item;

mod announce;
mod classify;
mod delivery;
mod demand;
mod save;
mod spans;
#[cfg(test)]
mod tests;
mod turn;

use classify::{Classifier, Step};
use delivery::{Failing, Flight, HELD_BYTES_MAX};
use save::Saving;
use turn::{Facts, Phase, Turn};

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
    pub leadership: Option<Validity>,
    /// Periodic heartbeats, if enabled.
    pub heartbeat: Option<Heartbeat>,
    /// The watch this pipeline publishes for.
    pub watch: WatchIdentity,
    /// The items of snapshots on demand of the watch, taken only when no item of the watch
    /// waits.
    pub demands: Option<mpsc::Receiver<Demand>>,
    /// The watch's byte budget (drawing on the process's), whose reservations the items and
    /// their events carry: while reservations wait for room, a listing transaction commits on
    /// the sink's cadence to give back what its held events reserve.
    pub budget: Option<Budget>,
}

/// The watch a pipeline publishes for, as a snapshot's markers name it.
#[derive(Debug, Clone)]
pub struct WatchIdentity {
    /// Its key (the markers' record key and id).
    pub key: crate::checkpoint::WatchKey,
    /// Its namespace, when it watches one.
    pub namespace: Option<String>,
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
    /// The items of snapshots on demand that wait for the stream.
    demands: demand::Demands,
    /// Publishing keeps failing: since when, and the backoff between attempts.
    failing: Option<Failing>,
    /// A commit was found due and is waiting for what is in flight to be acknowledged.
    commit_due: bool,
    /// Another watch sharing the Kafka transaction waits for this one to commit.
    requested: bool,
    /// The due commit had the producer send what is in flight at once.
    sent_now: bool,
    /// A checkpoint being written while the watch goes on (NATS).
    saving: Option<Saving>,
}

impl Pipeline {
    /// Runs until the watch closes its side of the channel, then drains what is in flight and
    /// saves a last checkpoint. An error means this instance must stop (fenced, or leadership
    /// lost).
    pub async fn run(mut self, mut rx: mpsc::Receiver<(Item, Reservation)>) -> Result<()> {
        let mut st = self.start();
        let transactional = self.sink.transactions().is_some();
        let mut demands = self.demands.take();
        loop {
            self.check_leadership()?;
            self.answer_marks(&mut st);
            self.status
                .queue_depth
                .store((st.flight.queue.len() + rx.len()) as u64, Ordering::Relaxed);
            let listing = st.classifier.listing();
            let starved = self.budget.as_ref().is_some_and(Budget::starved);
            let interval = turn::cadence(
                self.sink.transactions().map(|t| t.commit_interval()),
                self.checkpoint_interval,
                listing,
                starved,
            );
            let turn = Turn::decide(Facts {
                transactional,
                listing,
                uncommitted: st.position != st.committed,
                held: !st.flight.held.is_empty(),
                held_full: st.flight.held_bytes >= HELD_BYTES_MAX,
                elapsed: st.last_commit.elapsed(),
                interval,
                checkpoint_interval: self.checkpoint_interval,
                queued: !rx.is_empty(),
                saving: st.saving.is_some(),
                requested: st.requested,
                commit_due: st.commit_due,
                in_flight: !st.flight.queue.is_empty(),
                mark_waits: transactional
                    && st.demands.waits_for_commit(!st.flight.held.is_empty()),
            });
            st.commit_due = turn.commit_due;
            let (due, saving) = (turn.due(), st.saving.is_some());
            let idle = st.flight.queue.is_empty();
            if idle && self.settle(&mut st, due, turn.pending).await? {
                st.commit_due = false;
                st.requested = false;
                st.sent_now = false;
                continue;
            }
            // The due commit waits for what is in flight: a Kafka producer sends it now rather
            // than after its batching delay (linger.ms), once per commit.
            if turn.phase == Phase::Draining
                && !st.sent_now
                && let Some(transactions) = self.sink.transactions()
            {
                transactions.send_now();
                st.sent_now = true;
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
            let wake = st.last_commit + interval;
            let room = st.flight.queue.len() < self.max_in_flight;
            tokio::select! {
                biased;
                Some(done) = st.flight.queue.next(), if !idle => self.complete(done, &mut st).await?,
                // A shared transaction can be voided by another watch while this one is idle.
                () = self.voided(), if transactional => self.restart_transaction(None, &mut st).await?,
                () = self.requested(), if transactional && !st.requested => st.requested = true,
                () = tokio::time::sleep_until(st.flight.progress + STALL_AFTER), if !idle && !st.flight.silence_reported => self.broker_silent(&mut st),
                written = save::written(&mut st.saving), if saving => self.saved(written, &mut st)?,
                // Only with nothing waiting: a commit time that passed while events wait would
                // fire at once on every turn, ahead of taking them (a busy loop until the
                // checkpoint interval forced the commit); they are taken first.
                () = tokio::time::sleep_until(wake), if turn.wait_for_cadence => {}
                // A listing transaction's held events commit sooner once others wait for the room
                // they keep (the cadence is decided again on the next turn).
                () = starving(self.budget.as_ref()), if transactional && listing && !starved && !st.flight.held.is_empty() => {}
                () = tokio::time::sleep_until(heartbeat_wake.unwrap_or(wake)), if heartbeat_wake.is_some() && idle && !listing && rx.is_empty() => {}
                item = rx.recv(), if room && !due => {
                    let Some((item, reservation)) = item else { break };
                    self.take(item, reservation, &mut rx, &mut st).await?;
                }
                // Last: a snapshot's item is taken only when none of the watch's waits.
                demand = next_demand(&mut demands), if room && !due && demands.is_some() => match demand {
                    Some(demand) => self.demand(demand, Reservation::none(), &mut st).await?,
                    None => demands = None,
                },
            }
        }
        while self.settle_next(&mut st).await? {}
        if st.position != st.committed && !st.classifier.listing() {
            self.commit(&mut st).await?;
        }
        // The last checkpoint is written before the watch lets go (a handoff, a shutdown).
        self.finish_saving(&mut st).await
    }

    /// Fails once the lease is no longer held: checked before every publish and every save,
    /// so a process resumed after a pause past its lease (SIGSTOP) sends and saves nothing.
    fn check_leadership(&self) -> Result<()> {
        match &self.leadership {
            Some(l) if !l.is_valid() => {
                error!("leadership lost: stopping this watch");
                Err(Error::LeadershipLost {
                    watch: self.info.source.clone(),
                })
            }
            _ => Ok(()),
        }
    }

    /// The state at start: from the loaded checkpoint, if any.
    fn start(&mut self) -> State {
        let resumed = self.resume.take();
        let committed = resumed.as_ref().and_then(|c| c.resource_version.clone());
        // A repair (a checkpoint that could not be decoded) lists as after a lost history.
        let repairs = resumed.is_some();
        let (known, announced) = resumed.map(|c| (c.known, c.announced)).unwrap_or_default();
        let mut classifier = Classifier::new(self.info.clone(), self.snapshot, known, repairs);
        if !announced.is_empty() {
            info!(
                objects = announced.len(),
                "objects announced past the checkpoint: carried until the watch names them again"
            );
            classifier.carry(announced);
        }
        let mut st = State {
            classifier,
            position: committed.clone(),
            committed,
            sync_pending: false,
            last_commit: Instant::now(),
            next_heartbeat: Instant::now(),
            previous: HashMap::new(),
            flight: Flight::default(),
            demands: demand::Demands::default(),
            failing: None,
            commit_due: false,
            requested: false,
            sent_now: false,
            saving: None,
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

    /// Classifies one item from the watch and counts what the classification found.
    fn classify(&self, item: Item, st: &mut State) -> Step {
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
        step
    }

    /// Publishes what classifying one item produced, and moves the position.
    async fn apply(&self, step: Step, reservation: Reservation, st: &mut State) -> Result<()> {
        if step.listed && !self.status.synced.load(Ordering::Relaxed) {
            st.sync_pending = true;
            // The starting point is saved at once: the watch reports itself synced only once a
            // restart would resume from a checkpoint rather than start afresh.
            st.last_commit = Instant::now()
                .checked_sub(self.checkpoint_interval)
                .unwrap_or(st.last_commit);
        }
        if let Some(rv) = step.position {
            self.status
                .position
                .store(rv.parse().unwrap_or(0), Ordering::Relaxed);
            st.position = Some(rv);
        }
        // Deletes go first (a recreated name's predecessor before its successor); the item's
        // budget goes with its own event if it makes one, else with the first delete.
        let mut reservation = Some(reservation);
        let own = step.change.map(|c| (c, reservation.take()));
        for change in step.deletes {
            self.publish(change, reservation.take(), st).await?;
        }
        if let Some((change, reservation)) = own {
            self.publish(change, reservation, st).await?;
        }
        Ok(())
    }

    /// With nothing in flight: a due commit is made, with a checkpoint when it carries progress
    /// (`checkpoint`; otherwise, during a list or for a snapshot's mark, the open transaction is
    /// committed alone), and the watch is synced once its initial state is acknowledged and,
    /// with durable checkpoints, saved. Returns whether it committed.
    async fn settle(&mut self, st: &mut State, due: bool, checkpoint: bool) -> Result<bool> {
        if due {
            if checkpoint {
                self.commit(st).await?;
            } else {
                self.commit_events(st).await?;
            }
        }
        if st.sync_pending
            && st.flight.queue.is_empty()
            && (!self.store.durable() || st.committed == st.position)
        {
            st.sync_pending = false;
            self.status.synced.store(true, Ordering::Relaxed);
            info!("initial state published");
        }
        Ok(due)
    }

    /// Filters, encodes and sends one change. In diff mode, `st.previous` holds the last
    /// published version of each object.
    async fn publish(
        &self,
        change: Change,
        budget: Option<Reservation>,
        st: &mut State,
    ) -> Result<()> {
        self.publish_as(change, budget, None, st).await
    }

    /// [`Pipeline::publish`], as part of the snapshot on demand `snapshot` if any.
    async fn publish_as(
        &self,
        change: Change,
        budget: Option<Reservation>,
        snapshot: Option<Arc<str>>,
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
        let read = spans::read();
        let diff = self.info.payload == Mode::Diff;
        let uid = change.object.metadata.uid.as_deref().unwrap_or_default();
        let last = diff.then(|| st.previous.get(uid)).flatten();
        let mut event = match encode::encode(&self.info, change, last.map(|b| &b[..])) {
            Ok(encoded) => {
                if let Some(error) = encoded.trace_error {
                    self.trace_context_ignored(&encoded.event, error);
                }
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
        if let Some(id) = snapshot {
            event.for_snapshot(id);
        }
        spans::adopt(&read, &mut event);
        if !self.sink.ordered_in_flight() {
            // Never two publishes of one object awaiting acknowledgement at once.
            while st.flight.uids.contains_key(&event.uid) && self.settle_next(st).await? {}
            *st.flight.uids.entry(event.uid.clone()).or_default() += 1;
        }
        self.check_leadership()?;
        let received = event.received;
        let pending = self
            .sink
            .send(event)
            .instrument(spans::publish(&read))
            .await;
        self.status
            .send_latency
            .observe(received.elapsed().as_secs_f64());
        st.flight.push(spans::acknowledged(pending, &read));
        Ok(())
    }

    /// The object's trace context annotation was invalid: counted and logged, and the event
    /// published with a new trace (or without the `tracestate`).
    fn trace_context_ignored(&self, event: &encode::Event, error: crate::trace::context::Error) {
        self.status
            .trace_context_invalid
            .fetch_add(1, Ordering::Relaxed);
        warn!(object = %event.reference(), error = %error, "invalid trace context annotation ignored");
    }

    /// Publishes a heartbeat with the checkpoint's resourceVersion and the lag, then commits (a
    /// Kafka heartbeat becomes visible with the transaction it was sent in).
    async fn heartbeat(&mut self, hb: &Heartbeat, st: &mut State) -> Result<()> {
        let position = st.position.clone().unwrap_or_default();
        self.commit(st).await?;
        self.finish_saving(st).await?;
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
}

/// The next item of a snapshot on demand; never, once there is no queue.
async fn next_demand(demands: &mut Option<mpsc::Receiver<Demand>>) -> Option<Demand> {
    match demands {
        Some(demands) => demands.recv().await,
        None => std::future::pending().await,
    }
}

/// Returns once reservations wait for room in `budget` ([`Budget::starving`]); never without one.
async fn starving(budget: Option<&Budget>) {
    match budget {
        Some(budget) => budget.starving().await,
        None => std::future::pending().await,
    }
}

/// The bytes an item weighs in the budgets: its object's charge ([`budget::charge`]).
pub fn item_bytes(item: &Item) -> usize {
    match item {
        Item::Event(_, object, _) | Item::Listed(object, _) => budget::charge(object),
        _ => 0,
    }
}
