//! Transaction groups: one transactional producer shared by the watches of a sink, and the
//! transactions they commit together.
//!
//! A transaction holds the events of every member that sent since the last commit, and it
//! commits only with the checkpoint records of every one of them (a barrier): a member whose
//! commit is due arrives with its records, every other member that sent in the open
//! transaction is asked to commit too ([`Member::requested`]), and the last to arrive writes
//! all the records and commits. So a `read_committed` consumer never sees an event whose
//! checkpoint is not committed with it, and a restart resumes every watch exactly where its
//! committed events end.
//!
//! A failed delivery, a failed commit or a member leaving with events in the open transaction
//! dooms it: every member that sent in it is told ([`Member::voided`]), sends nothing more into
//! it, and after [`Member::recover`] (the first one aborts) sends its events again. A commit or
//! abort that did not finish in time is resumed, and a producer that cannot abort is replaced
//! ([`super::recovery`]).
//!
//! The producer's transactional id fences an older instance: a group per sink (`id` shared by
//! every watch) or a group per watch (with sharding, where each watch has its own owner). A fence
//! that is the coordinator aborting a transaction open past the transaction timeout, while this
//! process still owns the id, replaces the producer instead ([`super::recovery::fence`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::producer::FutureRecord;
use tokio::sync::watch;
use tracing::{debug, warn};

use super::producer::Producer;
use super::recovery::{self, ABORT_ATTEMPTS, AfterAbort, COMMIT_ATTEMPTS, Failure, Fence};
use crate::lease::Validity;

/// How long one transactional call may block (a commit or abort that did not finish is resumed,
/// see [`resuming`]).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long [`Group::send_now`] keeps the producer sending at once: time enough for what it holds
/// to leave (librdkafka returns as soon as all of it is acknowledged).
const SEND_NOW_FOR: Duration = Duration::from_millis(100);

/// Transactional producers alive in this process (`kube_event_bridge_kafka_producers`).
pub static PRODUCERS: AtomicU64 = AtomicU64::new(0);

/// Records to write in a commit: topic, then (key, value; `None` is a tombstone).
pub(super) type Records = Vec<(String, Option<Vec<u8>>)>;

/// Errors of committing, aborting or starting a transaction.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CommitError {
    /// A newer producer with the same transactional id exists: this instance must stop.
    #[error("producer fenced by a newer instance with the same transactional id")]
    Fenced,
    /// The broker or client failed; the transaction did not commit. Its records must be sent
    /// again after [`KafkaSink::recover`](super::KafkaSink::recover).
    #[error("kafka transaction failed")]
    Kafka(#[source] KafkaError),
    /// Another watch sharing the transaction voided it (a failed delivery, or it stopped with
    /// events in it): its records must be sent again after [`KafkaSink::recover`](super::KafkaSink::recover).
    #[error("kafka transaction aborted by another watch sharing it")]
    Aborted,
    /// The broker aborted the transaction because it stayed open longer than
    /// `transactionTimeoutSecs` (an outage, a pause), fencing the producer as it did, while this
    /// process still owns the transactional id: [`KafkaSink::recover`](super::KafkaSink::recover) replaces the producer, and
    /// the records must be sent again.
    #[error("kafka transaction aborted by the broker: open longer than the transaction timeout")]
    TimedOut(#[source] KafkaError),
}

/// One transactional producer and the members sharing its transactions.
pub(super) struct Group {
    id: String,
    /// The producer's settings, `transactional.id` included.
    settings: ClientConfig,
    /// The transaction timeout: the coordinator aborts a transaction open for longer.
    timeout: Duration,
    /// How long one transactional call may block.
    call_timeout: Duration,
    /// Valid while this process owns the transactional id (its leader Lease, or with sharding
    /// the watch's Lease); `None` without either, where the process owns it.
    owner: Option<Validity>,
    producer: RwLock<Producer>,
    /// Sends and arrivals hold it shared; a commit, an abort or a new producer holds it alone
    /// (librdkafka refuses records while a transaction is being committed or aborted).
    gate: tokio::sync::RwLock<()>,
    state: Mutex<State>,
    /// Bumped whenever waiting members should look at the state again.
    changed: watch::Sender<u64>,
    next_member: AtomicU64,
    /// A [`Group::send_now`] is under way.
    sending_now: AtomicBool,
}

/// The open transaction and the members.
#[derive(Default)]
struct State {
    /// The number of the open transaction.
    txn: u64,
    /// The open transaction cannot commit any more: it is aborted before the next use.
    doomed: bool,
    /// The open transaction's commit was given up unanswered ([`COMMIT_ATTEMPTS`] calls): it is
    /// not aborted but the producer replaced ([`Group::recover`]).
    unanswered: bool,
    /// When the open transaction was handed its first record (the coordinator's timer starts
    /// later, when that record reaches it).
    opened: Option<Instant>,
    /// Members that sent in the open transaction, with their records once they arrived.
    participants: HashMap<u64, Option<(String, Records)>>,
    members: HashMap<u64, Signals>,
}

/// What one member is told.
struct Signals {
    /// Raised when a transaction it sent in is doomed; lowered by the member once it settled
    /// what it had in flight ([`Member::settled_voided`]).
    voided: Arc<watch::Sender<bool>>,
    /// Raised when another member waits to commit a transaction it sent in.
    requested: Arc<watch::Sender<bool>>,
    /// The outcome of the transaction it arrived at, once that transaction ended.
    outcome: Option<Result<(), CommitError>>,
}

impl State {
    /// Dooms the open transaction: its members are told, and those waiting to commit fail.
    fn doom(&mut self) {
        if self.doomed {
            return;
        }
        self.doomed = true;
        for (id, arrived) in &self.participants {
            let Some(signals) = self.members.get_mut(id) else {
                continue;
            };
            signals.voided.send_replace(true);
            if arrived.is_some() {
                signals.outcome = Some(Err(CommitError::Aborted));
            }
        }
    }

    /// Gives the members that arrived the outcome of their transaction.
    fn deliver(&mut self, outcome: &Result<(), CommitError>, arrived: &[u64]) {
        for id in arrived {
            if let Some(signals) = self.members.get_mut(id) {
                signals.outcome = Some(outcome.clone());
            }
        }
    }

    /// The open transaction ended (committed or aborted): the next one is open and empty.
    fn ended(&mut self) {
        for signals in self.members.values() {
            signals.requested.send_replace(false);
        }
        self.participants.clear();
        self.doomed = false;
        self.unanswered = false;
        self.opened = None;
        self.txn += 1;
    }

    /// Asks every member that sent in the open transaction and has not arrived to commit.
    fn request_commit(&self) {
        for (id, arrived) in &self.participants {
            if let (None, Some(signals)) = (arrived, self.members.get(id)) {
                signals.requested.send_replace(true);
            }
        }
    }
}

impl Group {
    /// Creates the producer: `init_transactions` fences any older producer with the same id
    /// (a previous instance, a deposed leader) and completes or aborts what it left open.
    /// `owner` is valid while this process owns the id (`None`: it always does).
    pub(super) async fn start(
        settings: &ClientConfig,
        id: &str,
        timeout: Duration,
        owner: Option<Validity>,
    ) -> Result<Arc<Self>, KafkaError> {
        Self::start_with(settings, id, timeout, owner, CALL_TIMEOUT).await
    }

    /// [`Group::start`], each transactional call blocking up to `call_timeout`.
    async fn start_with(
        settings: &ClientConfig,
        id: &str,
        timeout: Duration,
        owner: Option<Validity>,
        call_timeout: Duration,
    ) -> Result<Arc<Self>, KafkaError> {
        let mut settings = settings.clone();
        settings
            .set("transactional.id", id)
            .set("transaction.timeout.ms", timeout.as_millis().to_string());
        let started = Instant::now();
        let producer = start_producer(&settings, call_timeout).await?;
        PRODUCERS.fetch_add(1, Ordering::Relaxed);
        debug!(
            transactional_id = id,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "transactional producer started"
        );
        Ok(Arc::new(Self {
            id: id.to_string(),
            settings,
            timeout,
            call_timeout,
            owner,
            producer: RwLock::new(producer),
            gate: tokio::sync::RwLock::new(()),
            state: Mutex::new(State::default()),
            changed: watch::channel(0).0,
            next_member: AtomicU64::new(0),
            sending_now: AtomicBool::new(false),
        }))
    }

    /// Adds a member.
    pub(super) fn join(self: &Arc<Self>) -> Member {
        let id = self.next_member.fetch_add(1, Ordering::Relaxed);
        let voided = Arc::new(watch::channel(false).0);
        let requested = Arc::new(watch::channel(false).0);
        self.lock().members.insert(
            id,
            Signals {
                voided: voided.clone(),
                requested: requested.clone(),
                outcome: None,
            },
        );
        Member {
            group: self.clone(),
            id,
            voided,
            requested,
        }
    }

    /// The current producer (a cheap handle).
    pub(super) fn producer(&self) -> Producer {
        self.producer
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Has the producer send what it holds now instead of after `linger.ms`: a member's commit is
    /// due and waits for its events to be acknowledged. librdkafka ignores `linger.ms` while a
    /// flush runs, so a flush runs, on a blocking thread, until what the producer holds is
    /// acknowledged or [`SEND_NOW_FOR`] has passed; one at a time for all the members.
    fn send_now(self: &Arc<Self>) {
        if self.sending_now.swap(true, Ordering::AcqRel) {
            return;
        }
        let group = self.clone();
        tokio::task::spawn_blocking(move || {
            // Not acknowledged yet is no failure here: the member waits for its deliveries.
            let _ = group.producer().flush(SEND_NOW_FOR);
            group.sending_now.store(false, Ordering::Release);
        });
    }

    /// A delivery of transaction `txn` failed: the transaction is doomed (if still open).
    pub(super) fn void(&self, txn: u64) {
        let mut state = self.lock();
        if state.txn == txn {
            debug!(
                transaction = txn,
                "a delivery failed: the transaction is doomed"
            );
            state.doom();
            drop(state);
            self.wake();
        }
    }

    /// Commits the open transaction with every participant's records, if all have arrived and
    /// nothing doomed it; returns whether it ended (committed, or failed and doomed).
    async fn try_commit(&self) -> bool {
        let _alone = self.gate.write().await;
        let (txn, batch) = {
            let mut state = self.lock();
            let ready = !state.doomed
                && !state.participants.is_empty()
                && state.participants.values().all(Option::is_some);
            if !ready {
                return false;
            }
            let batch: Vec<(u64, (String, Records))> = state
                .participants
                .drain()
                .map(|(id, arrived)| (id, arrived.expect("all arrived")))
                .collect();
            // Checkpoint records alone open the transaction at the coordinator too.
            state.opened.get_or_insert_with(Instant::now);
            (state.txn, batch)
        };
        let arrived: Vec<u64> = batch.iter().map(|(id, _)| *id).collect();
        let outcome = self.write_and_commit(batch).await;
        debug!(
            transaction = txn,
            members = arrived.len(),
            ok = outcome.is_ok(),
            "transaction ended"
        );
        let mut state = self.lock();
        state.deliver(&outcome, &arrived);
        match &outcome {
            Ok(()) => state.ended(),
            Err(e) => {
                // Still to be aborted: the members it failed send their events again after
                // `recover`, which aborts it.
                warn!(transactional_id = %self.id, transaction = txn, error = %e, "kafka transaction did not commit");
                state.doomed = true;
                state.unanswered = matches!(e, CommitError::Kafka(k) if recovery::failure(k) == Failure::Unfinished);
            }
        }
        drop(state);
        self.wake();
        true
    }

    /// Writes the members' records and commits. The commit flushes first (`linger.ms` ignored,
    /// [`Producer::commit_transaction`]), waiting for the events and the records to be
    /// acknowledged, and fails if any of them was not stored. A commit that does not finish within the call timeout goes on in the
    /// background and is resumed, [`COMMIT_ATTEMPTS`] calls at most: aborting it instead would be
    /// refused for as long as it is under way.
    async fn write_and_commit(
        &self,
        batch: Vec<(u64, (String, Records))>,
    ) -> Result<(), CommitError> {
        let producer = self.producer();
        let call_timeout = self.call_timeout;
        for (_, (topic, records)) in &batch {
            for (key, value) in records {
                let mut record: FutureRecord<'_, String, Vec<u8>> =
                    FutureRecord::to(topic).key(key);
                if let Some(v) = value {
                    record = record.payload(v);
                }
                // Its fate is the commit's: the acknowledgement is not awaited on its own.
                drop(
                    producer
                        .send_result(record)
                        .map_err(|(e, _)| self.classify(e))?,
                );
            }
        }
        tokio::task::spawn_blocking(move || {
            resuming("commit", COMMIT_ATTEMPTS, || {
                producer.commit_transaction(call_timeout)
            })?;
            producer.begin_transaction()
        })
        .await
        .expect("commit task")
        .map_err(|e| self.classify(e))
    }

    /// Who fenced the producer, judged now ([`recovery::fence`]).
    fn fence(&self) -> Fence {
        let open_for = self.lock().opened.map(|at| at.elapsed());
        let owned = self.owner.as_ref().is_none_or(Validity::is_valid);
        recovery::fence(open_for, self.timeout, owned)
    }

    /// The members' view of a failed commit: fenced by a rival, the transaction aborted by the
    /// coordinator's timeout (recovered with a new producer), or failed.
    fn classify(&self, e: KafkaError) -> CommitError {
        if recovery::failure(&e) != Failure::Fenced {
            return CommitError::Kafka(e);
        }
        match self.fence() {
            Fence::Rival => CommitError::Fenced,
            Fence::Timeout => CommitError::TimedOut(e),
        }
    }

    /// Aborts a doomed transaction and opens the next; nothing to do when no transaction is
    /// doomed (another member aborted it). A producer that failed fatally, whose commit went
    /// unanswered, or that cannot abort (refused, or unanswered call after call) is replaced;
    /// one fenced by a rival is not ([`recovery`]).
    async fn recover(&self) -> Result<(), CommitError> {
        let _alone = self.gate.write().await;
        let producer = self.producer();
        if let Some((code, reason)) = producer.client().fatal_error() {
            if recovery::failure_of(code, false, true) == Failure::Fenced {
                if self.fence() == Fence::Rival {
                    return Err(CommitError::Fenced);
                }
                self.log_timed_out(&reason);
            } else {
                warn!(code = ?code, reason = %reason, "kafka producer failed fatally: creating a new one");
            }
            return self.replace_producer().await;
        }
        let (doomed, unanswered, txn) = {
            let state = self.lock();
            (state.doomed, state.unanswered, state.txn)
        };
        if !doomed {
            return Ok(());
        }
        if unanswered {
            // Its commit went unanswered call after call: either the commit is still under way
            // in librdkafka (an abort is refused, `_CONFLICT`) or the producer no longer moves
            // the transaction at all (its flush waits for records never sent, and an abort
            // would wait for them too). Only a new producer gets out of both.
            warn!(transactional_id = %self.id, transaction = txn, "kafka transaction commit went unanswered: creating a new producer");
            return self.replace_producer().await;
        }
        debug!(
            transaction = self.lock().txn,
            "aborting the doomed transaction"
        );
        let call_timeout = self.call_timeout;
        let aborted = tokio::task::spawn_blocking(move || {
            resuming("abort", ABORT_ATTEMPTS, || {
                producer.abort_transaction(call_timeout)
            })?;
            producer.begin_transaction()
        })
        .await
        .expect("abort task");
        let Err(e) = aborted else {
            self.aborted();
            return Ok(());
        };
        let failure = recovery::failure(&e);
        match recovery::after_abort(failure, self.fence()) {
            AfterAbort::Replace if failure == Failure::Fenced => {
                self.log_timed_out(&e.to_string());
                self.replace_producer().await
            }
            AfterAbort::Replace if failure == Failure::Unfinished => {
                warn!(error = %e, "kafka transaction abort went unanswered: creating a new producer");
                self.replace_producer().await
            }
            AfterAbort::Replace => {
                warn!(error = %e, "kafka transaction cannot be aborted: creating a new producer");
                self.replace_producer().await
            }
            AfterAbort::Fenced => Err(CommitError::Fenced),
            AfterAbort::Later => Err(CommitError::Kafka(e)),
        }
    }

    /// Logs a fence read as the coordinator's timeout, before the producer is replaced.
    fn log_timed_out(&self, reason: &str) {
        let open_secs = self.lock().opened.map(|at| at.elapsed().as_secs());
        warn!(
            transactional_id = %self.id,
            open_secs,
            timeout_secs = self.timeout.as_secs(),
            reason = %reason,
            "kafka transaction outlived the transaction timeout and the broker aborted it: creating a new producer"
        );
    }

    /// The doomed transaction is gone: the next one is open.
    fn aborted(&self) {
        let mut state = self.lock();
        state.doom();
        state.ended();
        drop(state);
        self.wake();
    }

    /// A new producer with the same transactional id (its `init_transactions` completes or
    /// aborts what the old one left open). The caller holds the gate alone.
    async fn replace_producer(&self) -> Result<(), CommitError> {
        self.lock().doom();
        let producer = start_producer(&self.settings, self.call_timeout)
            .await
            .map_err(CommitError::Kafka)?;
        let old = std::mem::replace(
            &mut *self.producer.write().unwrap_or_else(|e| e.into_inner()),
            producer,
        );
        // Destroying a producer waits for its threads: not on the runtime's.
        tokio::task::spawn_blocking(move || drop(old));
        debug!(transactional_id = %self.id, "transactional producer replaced");
        self.aborted();
        Ok(())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        PRODUCERS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One watch's share of a group.
pub(super) struct Member {
    group: Arc<Group>,
    id: u64,
    voided: Arc<watch::Sender<bool>>,
    requested: Arc<watch::Sender<bool>>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("transactional_id", &self.group.id)
            .field("member", &self.id)
            .finish()
    }
}

impl Member {
    /// The group's current producer.
    pub(super) fn producer(&self) -> Producer {
        self.group.producer()
    }

    /// Opens a send into the open transaction (commits and aborts wait until it is dropped).
    /// `None` when the member must not send now: a transaction it sent in is doomed and it has
    /// not recovered yet, or the open one is doomed.
    pub(super) async fn sending(&self) -> Option<Sending<'_>> {
        let shared = self.group.gate.read().await;
        let state = self.group.lock();
        if state.doomed || *self.voided.borrow() {
            return None;
        }
        Some(Sending {
            member: self,
            txn: state.txn,
            _shared: shared,
        })
    }

    /// What a delivery of transaction `txn` that failed calls: the transaction is doomed.
    pub(super) fn voider(&self) -> impl Fn(u64) + Send + Sync + 'static {
        let group = self.group.clone();
        move |txn| group.void(txn)
    }

    /// The producer's transactional id.
    pub(super) fn transactional_id(&self) -> &str {
        &self.group.id
    }

    /// Commits the open transaction with `records` in it, together with the events and records
    /// of every other member that sent in it (waiting for them to arrive).
    pub(super) async fn commit(&self, topic: &str, records: Records) -> Result<(), CommitError> {
        let mut changed = self.group.changed.subscribe();
        {
            let _shared = self.group.gate.read().await;
            let mut state = self.group.lock();
            if state.doomed || *self.voided.borrow() {
                return Err(CommitError::Aborted);
            }
            state
                .participants
                .insert(self.id, Some((topic.to_string(), records)));
            self.requested.send_replace(false);
            if let Some(signals) = state.members.get_mut(&self.id) {
                signals.outcome = None;
            }
            state.request_commit();
            debug!(
                transaction = state.txn,
                member = self.id,
                participants = state.participants.len(),
                arrived = state.participants.values().filter(|a| a.is_some()).count(),
                "arrived to commit"
            );
        }
        loop {
            if let Some(outcome) = self.take_outcome() {
                return outcome;
            }
            if self.group.try_commit().await {
                continue;
            }
            // Woken by an arrival, a departure or an outcome.
            let _ = changed.changed().await;
        }
    }

    fn take_outcome(&self) -> Option<Result<(), CommitError>> {
        let mut state = self.group.lock();
        state.members.get_mut(&self.id)?.outcome.take()
    }

    /// A commit of this member is due and waits for its events in flight: the producer sends
    /// them now ([`Group::send_now`]).
    pub(super) fn send_now(&self) {
        self.group.send_now();
    }

    /// Resolves while a transaction this member sent in is doomed.
    pub(super) async fn voided(&self) {
        // The sender lives as long as this member: waiting cannot fail.
        let _ = self.voided.subscribe().wait_for(|raised| *raised).await;
    }

    /// What this member had in flight has settled: it may send again.
    pub(super) fn settled_voided(&self) {
        self.voided.send_replace(false);
    }

    /// Resolves while another member waits for this one to commit.
    pub(super) async fn requested(&self) {
        let _ = self.requested.subscribe().wait_for(|raised| *raised).await;
    }

    /// Aborts the doomed transaction, if no other member has yet, and opens the next.
    pub(super) async fn recover(&self) -> Result<(), CommitError> {
        self.group.recover().await
    }
}

impl Drop for Member {
    /// A member leaving with events in the open transaction dooms it: they must not commit
    /// without its checkpoint.
    fn drop(&mut self) {
        let mut state = self.group.lock();
        if state.participants.contains_key(&self.id) {
            state.doom();
            state.participants.remove(&self.id);
        }
        state.members.remove(&self.id);
        drop(state);
        self.group.wake();
    }
}

/// One send into the open transaction, between [`Member::sending`] and the record's fate.
pub(super) struct Sending<'a> {
    member: &'a Member,
    txn: u64,
    _shared: tokio::sync::RwLockReadGuard<'a, ()>,
}

impl Sending<'_> {
    /// The open transaction's number, for [`Member::voider`].
    pub(super) fn txn(&self) -> u64 {
        self.txn
    }

    /// The group's producer.
    pub(super) fn producer(&self) -> Producer {
        self.member.group.producer()
    }

    /// The record is in the open transaction: the member is one that sent in it (and asked to
    /// commit if others wait to).
    pub(super) fn sent(&self) {
        let m = self.member;
        let mut state = m.group.lock();
        let newcomer = !state.participants.contains_key(&m.id);
        state.participants.entry(m.id).or_insert(None);
        state.opened.get_or_insert_with(Instant::now);
        if state.doomed {
            // Doomed since `sending`: the record goes down with the transaction.
            m.voided.send_replace(true);
        } else if newcomer && state.participants.values().any(Option::is_some) {
            m.requested.send_replace(true);
        }
    }

    /// The producer refused the record before it entered the transaction (it stays unsent).
    /// A member with records in the open transaction sends them again with it, after an
    /// abort: the transaction is doomed.
    pub(super) fn refused(&self) {
        let m = self.member;
        let mut state = m.group.lock();
        if state.participants.contains_key(&m.id) {
            debug!(
                transaction = state.txn,
                "a record was refused: the transaction is doomed"
            );
            state.doom();
            drop(state);
            m.group.wake();
        }
    }
}

/// Makes a transactional producer: `init_transactions`, then `begin_transaction`. On a blocking
/// thread, where a producer that failed to start is also destroyed.
async fn start_producer(
    settings: &ClientConfig,
    call_timeout: Duration,
) -> Result<Producer, KafkaError> {
    let settings = settings.clone();
    tokio::task::spawn_blocking(move || {
        let producer = Producer::create(&settings)?;
        producer.init_transactions(call_timeout)?;
        producer.begin_transaction()?;
        Ok(producer)
    })
    .await
    .expect("init_transactions task")
}

/// Calls `call`, a transactional call of librdkafka named `name`, until it succeeds, fails
/// otherwise than by not finishing in time, or has been made `attempts` times: a call that did
/// not finish goes on in the background, and calling it again resumes it ([`recovery`]).
fn resuming(
    name: &'static str,
    attempts: u32,
    mut call: impl FnMut() -> KafkaResult<()>,
) -> KafkaResult<()> {
    let mut attempt = 1;
    loop {
        match call() {
            Err(e) if recovery::resume(recovery::failure(&e), attempt, attempts) => {
                warn!(call = name, attempt, error = %e, "kafka transaction call did not finish in time: resuming it");
                attempt += 1;
            }
            done => return done,
        }
    }
}

#[cfg(test)]
mod tests {
    //! Against librdkafka's mock cluster: commits and aborts that do not finish in time, and
    //! fences by a rival or by the coordinator's transaction timeout.

    use std::time::{Duration, Instant};

    use rdkafka::ClientConfig;
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    use rdkafka::mocking::{MockCluster, MockCoordinator};
    use rdkafka::producer::{DefaultProducerContext, FutureRecord};
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    use super::{CommitError, Group, Member};
    use crate::lease::Validity;

    const TOPIC: &str = "events";
    const ID: &str = "kube-event-bridge.test";

    fn cluster() -> MockCluster<'static, DefaultProducerContext> {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic(TOPIC, 1, 1).unwrap();
        cluster
    }

    async fn group(
        cluster: &MockCluster<'static, DefaultProducerContext>,
        timeout: Duration,
        owner: Option<Validity>,
        call_timeout: Duration,
    ) -> std::sync::Arc<Group> {
        let mut settings = ClientConfig::new();
        settings.set("bootstrap.servers", cluster.bootstrap_servers());
        Group::start_with(&settings, ID, timeout, owner, call_timeout)
            .await
            .unwrap()
    }

    /// A group whose transactions may stay open 30 s and whose calls time out after
    /// `call_timeout`, with one member that sent a record into the open transaction.
    async fn sending_member(
        cluster: &MockCluster<'static, DefaultProducerContext>,
        call_timeout: Duration,
    ) -> (std::sync::Arc<Group>, Member) {
        let g = group(cluster, Duration::from_secs(30), None, call_timeout).await;
        let member = g.join();
        send(&member).await.unwrap();
        (g, member)
    }

    /// Sends one record into the open transaction and waits for its acknowledgement.
    async fn send(member: &Member) -> Result<(), KafkaError> {
        let delivery = {
            let sending = member.sending().await.expect("may send");
            let record = FutureRecord::to(TOPIC).key("k").payload("v");
            let delivery = sending.producer().send_result(record).map_err(|(e, _)| e)?;
            sending.sent();
            delivery
        };
        match delivery.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((e, _))) => Err(e),
            Err(_) => Err(KafkaError::Canceled),
        }
    }

    /// Sends and commits a transaction, as a watch does after recovering.
    async fn send_and_commit(member: &Member) -> Result<(), CommitError> {
        send(member).await.map_err(CommitError::Kafka)?;
        member.commit("", Vec::new()).await
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_commit_that_did_not_finish_in_time_is_resumed() {
        let cluster = cluster();
        let (_group, member) = sending_member(&cluster, Duration::from_secs(1)).await;
        // The coordinator answers after the first call's timeout, within the second's.
        cluster
            .broker_round_trip_time(-1, Duration::from_millis(1500))
            .unwrap();
        let started = Instant::now();
        member.commit("", Vec::new()).await.unwrap();
        assert!(started.elapsed() >= Duration::from_secs(1));
        cluster.broker_round_trip_time(-1, Duration::ZERO).unwrap();
        send_and_commit(&member).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_commit_that_never_finishes_is_given_up_and_the_producer_replaced() {
        let cluster = cluster();
        let (g, member) = sending_member(&cluster, Duration::from_secs(1)).await;
        // Longer than the commit's attempts together.
        cluster
            .broker_round_trip_time(-1, Duration::from_secs(4))
            .unwrap();
        let gave_up = member.commit("", Vec::new()).await;
        assert!(matches!(gave_up, Err(CommitError::Kafka(_))), "{gave_up:?}");
        cluster.broker_round_trip_time(-1, Duration::ZERO).unwrap();
        // The commit is still under way in librdkafka: an abort is refused (`_CONFLICT`), so
        // recovering takes a new producer.
        let producer = g.producer();
        let refused =
            tokio::task::spawn_blocking(move || producer.abort_transaction(Duration::from_secs(1)))
                .await
                .unwrap();
        assert_eq!(
            refused.unwrap_err().rdkafka_error_code(),
            Some(RDKafkaErrorCode::Conflict)
        );
        // The new producer's `init_transactions` waits for the old commit to end at the
        // coordinator: the pipeline calls `recover` until it succeeds.
        let mut tries = 0;
        while let Err(e) = member.recover().await {
            tries += 1;
            assert!(tries < 40, "{e:?}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        member.settled_voided();
        send_and_commit(&member).await.unwrap();
    }

    /// What the fault suite saw once Kafka resumed from a pause: a producer whose transaction no
    /// longer moves (most likely librdkafka lost its transaction coordinator and stopped looking
    /// for it, see the `recovery` module), so its records stay unacknowledged, the commit's flush
    /// goes unanswered call after call, and an abort waits for the same records. Here the
    /// partition's leader answers late and the coordinator at once: recovering replaces the
    /// producer without trying to abort first.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_commit_whose_records_go_unanswered_is_given_up_and_the_producer_replaced() {
        let cluster = MockCluster::new(2).unwrap();
        cluster.create_topic(TOPIC, 1, 1).unwrap();
        cluster.partition_leader(TOPIC, 0, Some(1)).unwrap();
        cluster
            .coordinator(MockCoordinator::Transaction(ID.into()), 2)
            .unwrap();
        let (g, member) = sending_member(&cluster, Duration::from_secs(1)).await;
        // The next record is acknowledged after the commit's attempts and an abort's together.
        cluster
            .broker_round_trip_time(1, Duration::from_secs(10))
            .unwrap();
        let unanswered = {
            let sending = member.sending().await.expect("may send");
            let record = FutureRecord::to(TOPIC).key("k").payload("v");
            let delivery = sending.producer().send_result(record).map_err(|(e, _)| e);
            sending.sent();
            delivery.unwrap()
        };
        let gave_up = member.commit("", Vec::new()).await;
        assert!(matches!(gave_up, Err(CommitError::Kafka(_))), "{gave_up:?}");
        let old = g.producer();
        // The new producer's first call waits while the coordinator aborts the old transaction,
        // whose partition's broker answers only after 10 s: it may time out, and is made again
        // as long as that lasts, as the pipeline does (`recover_transaction`).
        let mut retried = 0;
        while let Err(e) = member.recover().await {
            assert!(retried < 30, "no new producer after 30 retries: {e:?}");
            retried += 1;
        }
        assert!(
            !std::ptr::eq(
                old.client().native_ptr(),
                g.producer().client().native_ptr()
            ),
            "the producer was replaced"
        );
        drop((old, unanswered));
        cluster.broker_round_trip_time(1, Duration::ZERO).unwrap();
        member.settled_voided();
        send_and_commit(&member).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_abort_that_did_not_finish_in_time_is_resumed() {
        let cluster = cluster();
        let (g, member) = sending_member(&cluster, Duration::from_secs(1)).await;
        let txn = g.lock().txn;
        g.void(txn);
        cluster
            .broker_round_trip_time(-1, Duration::from_millis(1500))
            .unwrap();
        let started = Instant::now();
        member.recover().await.unwrap();
        assert!(started.elapsed() >= Duration::from_secs(1));
        cluster.broker_round_trip_time(-1, Duration::ZERO).unwrap();
        member.settled_voided();
        send_and_commit(&member).await.unwrap();
    }

    /// What the coordinator answers a producer once it aborted the transaction and bumped the
    /// epoch, or once a newer producer with the same id started (the mock cluster fences
    /// nothing on its own).
    fn fence_the_next_commit(cluster: &MockCluster<'static, DefaultProducerContext>) {
        cluster.request_errors(
            RDKafkaApiKey::EndTxn,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED],
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_fence_within_the_transaction_timeout_is_a_rivals_and_stops_the_producer() {
        let cluster = cluster();
        let (_group, member) = sending_member(&cluster, Duration::from_secs(5)).await;
        fence_the_next_commit(&cluster);
        let fenced = member.commit("", Vec::new()).await;
        assert!(matches!(fenced, Err(CommitError::Fenced)), "{fenced:?}");
        assert!(matches!(member.recover().await, Err(CommitError::Fenced)));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_fence_past_the_transaction_timeout_replaces_the_producer() {
        let cluster = cluster();
        let timeout = Duration::from_secs(1);
        let g = group(&cluster, timeout, None, Duration::from_secs(5)).await;
        let member = g.join();
        send(&member).await.unwrap();
        tokio::time::sleep(timeout + Duration::from_millis(200)).await;
        fence_the_next_commit(&cluster);
        let aborted = member.commit("", Vec::new()).await;
        assert!(
            matches!(aborted, Err(CommitError::TimedOut(_))),
            "{aborted:?}"
        );
        member.recover().await.unwrap();
        member.settled_voided();
        send_and_commit(&member).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_fence_past_the_transaction_timeout_stops_a_producer_whose_lease_lapsed() {
        let cluster = cluster();
        let timeout = Duration::from_secs(1);
        let lapsed = Validity::unrenewed();
        let g = group(&cluster, timeout, Some(lapsed), Duration::from_secs(5)).await;
        let member = g.join();
        send(&member).await.unwrap();
        tokio::time::sleep(timeout + Duration::from_millis(200)).await;
        fence_the_next_commit(&cluster);
        let fenced = member.commit("", Vec::new()).await;
        assert!(matches!(fenced, Err(CommitError::Fenced)), "{fenced:?}");
        assert!(matches!(member.recover().await, Err(CommitError::Fenced)));
    }
}
