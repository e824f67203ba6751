//! Settling what the pipeline sent: acknowledgements in order, retries, truncation of events
//! too large for the broker, pauses while the broker refuses every event, and — for a Kafka
//! watch, whose events and checkpoints share transactions — aborting a transaction a failed
//! delivery voided and sending its events again.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::{Error, Pipeline, Result, State};
use crate::backoff::Backoff;
use crate::checkpoint::Written;
use crate::encode::Event;
use crate::sink::{self, Delivered, Outcome};
use crate::status::{Histogram, STALL_AFTER, Stall, Status, count, kind_index};

/// A Kafka transaction holding more than this is committed early: what it holds stays in memory
/// until then, to be sent again if it aborts.
pub(super) const HELD_BYTES_MAX: usize = 16 << 20;

/// Room for held events kept between transactions, and for uids awaiting an acknowledgement
/// once none does: a steady stream reuses it, and neither a snapshot nor a burst pins its size
/// in every watch (a larger transaction grows the room again by doubling; docs/benchmarks.md,
/// "Where the bytes per watched object go").
const HELD_ROOM_KEPT: usize = 16;

/// Retriable failures are retried at least this often.
const RETRY_DELAY_MAX: Duration = Duration::from_secs(5);

/// The stall reported while the broker answers nothing: a call unanswered, or no acknowledgement.
pub(super) const UNANSWERED: &str = "broker_unavailable";

/// What was sent and is not settled yet.
pub(super) struct Flight {
    /// Acknowledgements to come, in the order the events were sent.
    pub queue: FuturesOrdered<BoxFuture<'static, Delivered>>,
    /// For sinks that cannot keep two publishes of one object in order: uids awaiting an ack.
    pub uids: HashMap<String, u32>,
    /// Transactional sinks: events acknowledged in the open transaction, kept to be sent again
    /// if it aborts.
    pub held: Vec<Event>,
    /// Bytes of `held`.
    pub held_bytes: usize,
    /// When the broker last settled an event, or the queue last became non-empty.
    pub progress: Instant,
    /// Whether the broker's silence past [`STALL_AFTER`] has been reported.
    pub silence_reported: bool,
    /// Deliveries handed to the sink since the pipeline started.
    pub pushed: u64,
}

impl Default for Flight {
    fn default() -> Self {
        Self {
            queue: FuturesOrdered::new(),
            uids: HashMap::new(),
            held: Vec::new(),
            held_bytes: 0,
            progress: Instant::now(),
            silence_reported: false,
            pushed: 0,
        }
    }
}

impl Flight {
    /// Queues the acknowledgement of an event just handed to the sink.
    pub fn push(&mut self, pending: BoxFuture<'static, Delivered>) {
        if self.queue.is_empty() {
            self.progress = Instant::now();
        }
        self.queue.push_back(pending);
        self.pushed += 1;
    }

    /// Deliveries handed to the sink since the pipeline started whose acknowledgement was
    /// taken (acknowledgements are taken in the order the events were sent).
    pub fn settled_count(&self) -> u64 {
        self.pushed - self.queue.len() as u64
    }

    /// The open transaction committed: what it held is durable, and visible to `read_committed`
    /// consumers from now on. A snapshot's transaction can hold thousands of events: their room
    /// is given back rather than kept for good.
    pub fn committed(&mut self, visible: &Histogram) {
        for event in &self.held {
            visible.observe(event.received.elapsed().as_secs_f64());
        }
        self.held.clear();
        self.held.shrink_to(HELD_ROOM_KEPT);
        self.held_bytes = 0;
    }

    fn take_held(&mut self) -> Vec<Event> {
        self.held_bytes = 0;
        std::mem::take(&mut self.held)
    }

    fn settled(&mut self, uid: &str) {
        if let Some(n) = self.uids.get_mut(uid) {
            *n -= 1;
            if *n == 0 {
                self.uids.remove(uid);
                // A snapshot's window of uids is given back once drained, like `held`.
                if self.uids.is_empty() {
                    self.uids.shrink_to(HELD_ROOM_KEPT);
                }
            }
        }
    }
}

/// Whether the broker refused this event as too large (and it is not a reference yet).
fn too_large(d: &Delivered) -> bool {
    matches!(
        d.outcome,
        Outcome::Rejected {
            reason: "too_large",
            ..
        }
    ) && !d.event.truncated
}

/// Publishing keeps failing: since when, and the backoff between attempts.
pub(super) struct Failing {
    since: Instant,
    backoff: Backoff,
}

/// Whether a failure stalls the watch at once (a refusal of every event) or only once
/// failures have lasted [`STALL_AFTER`] (retriable errors, an unreachable broker).
#[derive(Clone, Copy)]
enum Failure {
    Blocked(&'static str),
    Lasting(&'static str),
}

impl Pipeline {
    /// Takes one acknowledgement (the oldest): counts it, or retries until the broker settles
    /// the event. An error means the watch must stop (fenced).
    pub(super) async fn complete(&self, delivered: Delivered, st: &mut State) -> Result<()> {
        st.flight.progress = Instant::now();
        st.flight.silence_reported = false;
        let transactional = self.sink.transactions().is_some();
        if transactional && !matches!(delivered.outcome, Outcome::Acked) {
            return self.restart_transaction(Some(delivered), st).await;
        }
        let Delivered { event, outcome } = self.retry_until_settled(delivered, st).await?;
        st.flight.settled(&event.uid);
        match outcome {
            Outcome::Acked => {
                self.status.published[kind_index(event.kind)].fetch_add(1, Ordering::Relaxed);
                self.status
                    .latency
                    .observe(event.received.elapsed().as_secs_f64());
                self.publishing_again(st);
                if transactional {
                    st.flight.held_bytes += event.data.len();
                    st.flight.held.push(event);
                }
            }
            Outcome::Rejected { reason, error } => self.refused(&event, reason, &error),
            Outcome::Fatal { error } => {
                error!(error = %error, "producer fenced or broken: stopping this watch");
                return Err(Error::Fenced {
                    watch: self.info.source.clone(),
                });
            }
            Outcome::Retry { .. } | Outcome::Blocked { .. } | Outcome::Aborted => {
                unreachable!("retry_until_settled settles")
            }
        }
        Ok(())
    }

    /// Sends an event again until the broker stores or refuses it for good. The id is
    /// unchanged, so a copy the broker did store is recognised as a duplicate. An event too large
    /// for the broker is sent once more as a reference, marked truncated; a refusal of every
    /// event (authorization, a missing topic) pauses and stalls the watch until it is fixed.
    /// Ownership is checked before every attempt: a replica paused past its Lease never sends
    /// again from here (an HTTP receiver has no fencing of its own).
    async fn retry_until_settled(
        &self,
        mut delivered: Delivered,
        st: &mut State,
    ) -> Result<Delivered> {
        // A broker refuses a whole batch when one record in it is too large: an event is cut to
        // a reference only when it is refused as too large a second time, alone.
        let mut too_large = 0;
        loop {
            let delay = match &delivered.outcome {
                Outcome::Retry { error } => {
                    let object = delivered.event.reference();
                    self.status.retried.fetch_add(1, Ordering::Relaxed);
                    let delay = self.pause(st, Failure::Lasting("publish_failing"), error, &object);
                    warn!(object = %object, error = %error, retry_in_ms = delay.as_millis() as u64, "publish failed, retrying");
                    delay
                }
                Outcome::Blocked { reason, error } => {
                    let object = delivered.event.reference();
                    count(&self.status.blocked, reason);
                    let delay = self.pause(st, Failure::Blocked(reason), error, &object);
                    warn!(object = %object, reason, error = %error, retry_in_ms = delay.as_millis() as u64, "the broker refuses every event of this destination, retrying");
                    delay
                }
                Outcome::Aborted => Duration::ZERO,
                Outcome::Rejected {
                    reason: "too_large",
                    ..
                } if !delivered.event.truncated => {
                    too_large += 1;
                    if too_large > 1 {
                        self.truncate(&mut delivered.event);
                    }
                    Duration::ZERO
                }
                _ => return Ok(delivered),
            };
            tokio::time::sleep(delay).await;
            self.check_leadership()?;
            delivered = self.sink.send(delivered.event).await.await;
        }
    }

    /// Settles the oldest delivery, or restarts the transaction at once when a later delivery
    /// voided it (the oldest may be one librdkafka will not send until the abort). Returns
    /// whether anything was in flight.
    pub(super) async fn settle_next(&self, st: &mut State) -> Result<bool> {
        if st.flight.queue.is_empty() {
            return Ok(false);
        }
        tokio::select! {
            biased;
            Some(done) = st.flight.queue.next() => self.complete(done, st).await?,
            () = self.voided() => self.restart_transaction(None, st).await?,
        }
        Ok(true)
    }

    /// Resolves while another watch sharing the open transaction waits for this one to commit;
    /// never otherwise.
    pub(super) async fn requested(&self) {
        match self.sink.transactions() {
            Some(transactions) => transactions.requested().await,
            None => std::future::pending().await,
        }
    }

    /// Resolves once a delivery failed inside the open transaction; never otherwise.
    pub(super) async fn voided(&self) {
        match self.sink.transactions() {
            Some(transactions) => transactions.voided().await,
            None => std::future::pending().await,
        }
    }

    /// A failed delivery voids the open Kafka transaction, and everything sent in it since the
    /// last commit goes down with it. Aborts first (librdkafka then purges what it still holds,
    /// so every delivery settles), collects those events in order (the acknowledged ones, then
    /// the failed one and everything behind it), and sends them again in a new transaction,
    /// each failure treated as outside a transaction: too large → a reference marked
    /// truncated; refused for every event → a pause; refused for good → skipped.
    pub(super) async fn restart_transaction(
        &self,
        failed: Option<Delivered>,
        st: &mut State,
    ) -> Result<()> {
        self.recover_transaction(st).await?;
        let mut settled: Vec<Delivered> = failed.into_iter().collect();
        while let Some(d) = st.flight.queue.next().await {
            settled.push(d);
        }
        if let Some(transactions) = self.sink.transactions() {
            transactions.settled_voided();
        }
        let mut resend = st.flight.take_held();
        // The broker refuses the whole batch holding a record too large for it: only the
        // largest of the refused events is cut to a reference (another round finds the next).
        let largest = settled
            .iter()
            .enumerate()
            .filter(|(_, d)| too_large(d))
            .max_by_key(|(_, d)| d.event.data.len())
            .map(|(i, _)| i);
        // The cause of the abort decides the pause (one step of the backoff per restart): a
        // refusal of every event first, then any other failure; a refusal as too large or a
        // purge by the abort is no reason to wait.
        let mut cause: Option<(Failure, String, String)> = None;
        for (i, Delivered { mut event, outcome }) in settled.into_iter().enumerate() {
            match outcome {
                Outcome::Acked | Outcome::Aborted => {}
                Outcome::Rejected {
                    reason: "too_large",
                    ..
                } if !event.truncated => {
                    if Some(i) == largest {
                        self.truncate(&mut event);
                    }
                }
                Outcome::Rejected { reason, error } => {
                    self.refused(&event, reason, &error);
                    continue;
                }
                Outcome::Blocked { reason, error } => {
                    count(&self.status.blocked, reason);
                    if !matches!(cause, Some((Failure::Blocked(_), ..))) {
                        cause = Some((Failure::Blocked(reason), error, event.reference()));
                    }
                }
                Outcome::Retry { error } | Outcome::Fatal { error } => {
                    self.status.retried.fetch_add(1, Ordering::Relaxed);
                    let failure = Failure::Lasting("publish_failing");
                    cause.get_or_insert_with(|| (failure, error, event.reference()));
                }
            }
            resend.push(event);
        }
        self.status
            .aborted_transactions
            .fetch_add(1, Ordering::Relaxed);
        let delay = match &cause {
            Some((failure, error, object)) => self.pause(st, *failure, error, object),
            None => Duration::ZERO,
        };
        warn!(
            events = resend.len(),
            error = cause.as_ref().map_or(
                if largest.is_some() {
                    "a record too large for the broker"
                } else {
                    "voided by a failed delivery of this watch or of another sharing the transaction (see librdkafka's TXNERR line)"
                },
                |(_, error, _)| error.as_str()
            ),
            retry_in_ms = delay.as_millis() as u64,
            "a delivery failed inside the kafka transaction: aborting it and sending its events again"
        );
        tokio::time::sleep(delay).await;
        self.check_leadership()?;
        for event in resend {
            st.flight.push(self.sink.send(event).await);
        }
        Ok(())
    }

    /// A commit failed: the transaction is aborted and what it held is sent again, after a
    /// pause if the broker failed (`broken`); at once if another watch sharing the transaction
    /// aborted it.
    pub(super) async fn resend_after_abort(
        &self,
        st: &mut State,
        error: &(dyn std::fmt::Display + Sync),
        broken: bool,
    ) -> Result<()> {
        self.status
            .aborted_transactions
            .fetch_add(1, Ordering::Relaxed);
        let delay = if broken {
            let failure = Failure::Lasting("broker_unavailable");
            self.pause(st, failure, &error.to_string(), "-")
        } else {
            Duration::ZERO
        };
        warn!(error = %error, events = st.flight.held.len(), retry_in_ms = delay.as_millis() as u64, "kafka transaction did not commit: aborting it and sending its events again");
        tokio::time::sleep(delay).await;
        self.recover_transaction(st).await?;
        self.check_leadership()?;
        for event in st.flight.take_held() {
            st.flight.push(self.sink.send(event).await);
        }
        Ok(())
    }

    /// Aborts the open transaction and opens a new one, waiting as long as the broker is
    /// unreachable (an outage of any length only pauses the watch).
    async fn recover_transaction(&self, st: &mut State) -> Result<()> {
        let Some(transactions) = self.sink.transactions() else {
            return Ok(());
        };
        st.demands.aborted();
        loop {
            match awaiting_broker(&self.status, "transaction abort", transactions.recover()).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    let e = self.transaction_failed(e)?;
                    let failure = Failure::Lasting("broker_unavailable");
                    let delay = self.pause(st, failure, &e.to_string(), "-");
                    warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "cannot abort the kafka transaction yet, retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// Commits the open Kafka transaction without moving the checkpoint (during a list, and
    /// for heartbeats).
    pub(super) async fn commit_events(&self, st: &mut State) -> Result<()> {
        let Some(transactions) = self.sink.transactions() else {
            return Ok(());
        };
        let started = Instant::now();
        match awaiting_broker(&self.status, "transaction commit", transactions.commit()).await {
            Ok(()) => {
                st.flight.committed(&self.status.visible_latency);
                st.demands.committed();
            }
            Err(e) => {
                let broken = !matches!(e, sink::Error::TransactionAborted);
                let e = self.transaction_failed(e)?;
                self.resend_after_abort(st, &e, broken).await?;
            }
        }
        st.last_commit = started;
        Ok(())
    }

    /// A transaction call failed: fenced stops the watch; any other failure is returned as the
    /// broker client's error, to be logged and retried.
    fn transaction_failed(
        &self,
        e: sink::Error,
    ) -> Result<Box<dyn std::error::Error + Send + Sync>> {
        match e {
            sink::Error::Transaction { source, .. } => Ok(source),
            sink::Error::Fenced => {
                error!("fenced: another instance owns this watch now");
                Err(Error::Fenced {
                    watch: self.info.source.clone(),
                })
            }
            other => Ok(Box::new(other)),
        }
    }

    /// The delay before trying again, and the stall to report: at once for a refusal of every
    /// event, after [`STALL_AFTER`] of failures otherwise.
    fn pause(&self, st: &mut State, failure: Failure, error: &str, object: &str) -> Duration {
        let failing = st.failing.get_or_insert_with(|| Failing {
            since: Instant::now(),
            backoff: Backoff::default(),
        });
        let stall = match failure {
            Failure::Blocked(reason) => Some(reason),
            Failure::Lasting(reason) => (failing.since.elapsed() >= STALL_AFTER).then_some(reason),
        };
        if let Some(reason) = stall {
            report_stall(&self.status, reason, error, Some(object));
        }
        let delay = failing.backoff.next_delay();
        match failure {
            Failure::Blocked(_) => delay,
            Failure::Lasting(_) => delay.min(RETRY_DELAY_MAX),
        }
    }

    /// The broker has settled nothing for [`STALL_AFTER`] while events wait (an unreachable
    /// broker: librdkafka keeps retrying them without reporting anything): the watch reports
    /// itself stalled until the next acknowledgement.
    pub(super) fn broker_silent(&self, st: &mut State) {
        st.flight.silence_reported = true;
        let error = format!(
            "no acknowledgement from the broker for {} s ({} events waiting)",
            st.flight.progress.elapsed().as_secs(),
            st.flight.queue.len()
        );
        report_stall(&self.status, UNANSWERED, &error, None);
    }

    /// An acknowledgement: publishing works (again).
    fn publishing_again(&self, st: &mut State) {
        st.failing = None;
        if let Some(stall) = self.status.clear_stall() {
            log_resumed(&stall);
        }
    }

    fn truncate(&self, event: &mut Event) {
        self.status.truncated.fetch_add(1, Ordering::Relaxed);
        warn!(object = %event.reference(), id = %event.id, bytes = event.data.len(), "event exceeds the broker's message size: publishing a reference, marked truncated");
        event.truncate();
    }

    fn refused(&self, event: &Event, reason: &'static str, error: &str) {
        count(&self.status.rejected, reason);
        error!(object = %event.reference(), id = %event.id, bytes = event.data.len(), reason, error = %error, "broker refused event for good, skipped");
    }
}

/// Awaits a call the broker must answer (a commit, a checkpoint save, an abort). While the
/// pipeline waits in it, nothing else reports an unreachable broker (librdkafka waits out
/// its timeouts in silence), so a call unanswered for [`STALL_AFTER`] reports the watch
/// stalled (`broker_unavailable`) until it succeeds or the next acknowledgement.
pub(super) async fn awaiting_broker<A: Answer>(
    status: &Status,
    call: &'static str,
    answer: impl Future<Output = A>,
) -> A {
    tokio::pin!(answer);
    if let Ok(answered) = tokio::time::timeout(STALL_AFTER, &mut answer).await {
        return answered;
    }
    let error = format!(
        "no answer from the broker to a {call} for {} s",
        STALL_AFTER.as_secs()
    );
    report_stall(status, UNANSWERED, &error, None);
    let answered = answer.await;
    if answered.succeeded()
        && let Some(stall) = status.clear_stall_if(UNANSWERED)
    {
        log_resumed(&stall);
    }
    answered
}

/// Reports the watch stalled for `reason`, with an error log the first time (until the stall is
/// cleared), naming the object whose event failed where there is one.
pub(super) fn report_stall(
    status: &Status,
    reason: &'static str,
    error: &str,
    object: Option<&str>,
) {
    if status.set_stall(reason, error) {
        error!(reason, error = %error, object, "watch stalled: cannot publish; retrying until the cause is fixed");
    }
}

/// The broker's answer to a call: whether it succeeded.
pub(super) trait Answer {
    fn succeeded(&self) -> bool;
}

impl<T, E> Answer for std::result::Result<T, E> {
    fn succeeded(&self) -> bool {
        self.is_ok()
    }
}

impl Answer for Written {
    fn succeeded(&self) -> bool {
        self.is_ok()
    }
}

/// The line saying a stalled watch publishes again.
pub(super) fn log_resumed(stall: &Stall) {
    info!(
        reason = stall.reason,
        stalled_secs = stall.since.elapsed().as_secs(),
        "publishing again"
    );
}
