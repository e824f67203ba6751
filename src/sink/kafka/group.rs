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
//! it, and after [`Member::recover`] (the first one aborts) sends its events again.
//!
//! The producer's transactional id fences an older instance: a group per sink (`id` shared by
//! every watch) or a group per watch (with sharding, where each watch has its own owner).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use tokio::sync::watch;
use tracing::{debug, warn};

use super::sink::{CommitError, classify_commit, is_fenced, needs_new_producer};

/// How long transactional calls may block.
pub(super) const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);

/// How long [`Group::send_now`] keeps the producer sending at once: time enough for what it holds
/// to leave (librdkafka returns as soon as all of it is acknowledged).
const SEND_NOW_FOR: Duration = Duration::from_millis(100);

/// Transactional producers alive in this process (`kube_event_bridge_kafka_producers`).
pub static PRODUCERS: AtomicU64 = AtomicU64::new(0);

/// Records to write in a commit: topic, then (key, value; `None` is a tombstone).
pub(super) type Records = Vec<(String, Option<Vec<u8>>)>;

/// One transactional producer and the members sharing its transactions.
pub(super) struct Group {
    id: String,
    /// The producer's settings, `transactional.id` included.
    settings: ClientConfig,
    producer: RwLock<FutureProducer>,
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
    pub(super) async fn start(
        settings: &ClientConfig,
        id: &str,
        timeout: Duration,
    ) -> Result<Arc<Self>, KafkaError> {
        let mut settings = settings.clone();
        settings
            .set("transactional.id", id)
            .set("transaction.timeout.ms", timeout.as_millis().to_string());
        let started = std::time::Instant::now();
        let producer = start_producer(&settings).await?;
        PRODUCERS.fetch_add(1, Ordering::Relaxed);
        debug!(
            transactional_id = id,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "transactional producer started"
        );
        Ok(Arc::new(Self {
            id: id.to_string(),
            settings,
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
    pub(super) fn producer(&self) -> FutureProducer {
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
            }
        }
        drop(state);
        self.wake();
        true
    }

    /// Writes the members' records and commits. librdkafka's commit flushes first (`linger.ms`
    /// ignored), waiting for the events and the records to be acknowledged, and fails if any of
    /// them was not stored; the whole commit is bounded by [`TRANSACTION_TIMEOUT`].
    async fn write_and_commit(
        &self,
        batch: Vec<(u64, (String, Records))>,
    ) -> Result<(), CommitError> {
        let producer = self.producer();
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
                        .map_err(|(e, _)| classify_commit(e))?,
                );
            }
        }
        tokio::task::spawn_blocking(move || {
            producer.commit_transaction(TRANSACTION_TIMEOUT)?;
            producer.begin_transaction()
        })
        .await
        .expect("commit task")
        .map_err(classify_commit)
    }

    /// Aborts a doomed transaction and opens the next (a producer that failed fatally is
    /// replaced). Nothing to do when no transaction is doomed: another member aborted it.
    async fn recover(&self) -> Result<(), CommitError> {
        let _alone = self.gate.write().await;
        let producer = self.producer();
        if let Some((code, reason)) = producer.client().fatal_error() {
            if is_fenced(code) {
                return Err(CommitError::Fenced);
            }
            warn!(code = ?code, reason = %reason, "kafka producer failed fatally: creating a new one");
            return self.replace_producer().await;
        }
        if !self.lock().doomed {
            return Ok(());
        }
        debug!(
            transaction = self.lock().txn,
            "aborting the doomed transaction"
        );
        let aborted = tokio::task::spawn_blocking(move || {
            producer.abort_transaction(TRANSACTION_TIMEOUT)?;
            producer.begin_transaction()
        })
        .await
        .expect("abort task")
        .map_err(classify_commit);
        match aborted {
            Ok(()) => {
                self.aborted();
                Ok(())
            }
            Err(CommitError::Kafka(e)) if needs_new_producer(&e) => {
                warn!(error = %e, "kafka transaction cannot be aborted: creating a new producer");
                self.replace_producer().await
            }
            Err(e) => Err(e),
        }
    }

    /// The doomed transaction is gone: the next one is open.
    fn aborted(&self) {
        let mut state = self.lock();
        state.doom();
        state.ended();
        drop(state);
        self.wake();
    }

    /// A new producer with the same transactional id (its `init_transactions` aborts what the
    /// old one left open). The caller holds the gate alone.
    async fn replace_producer(&self) -> Result<(), CommitError> {
        self.lock().doom();
        let producer = start_producer(&self.settings)
            .await
            .map_err(classify_commit)?;
        *self.producer.write().unwrap_or_else(|e| e.into_inner()) = producer;
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
    pub(super) fn producer(&self) -> FutureProducer {
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
    pub(super) fn producer(&self) -> FutureProducer {
        self.member.group.producer()
    }

    /// The record is in the open transaction: the member is one that sent in it (and asked to
    /// commit if others wait to).
    pub(super) fn sent(&self) {
        let m = self.member;
        let mut state = m.group.lock();
        let newcomer = !state.participants.contains_key(&m.id);
        state.participants.entry(m.id).or_insert(None);
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

/// Makes a transactional producer: `init_transactions`, then `begin_transaction`.
async fn start_producer(settings: &ClientConfig) -> Result<FutureProducer, KafkaError> {
    let producer: FutureProducer = settings.create()?;
    let p = producer.clone();
    tokio::task::spawn_blocking(move || {
        p.init_transactions(TRANSACTION_TIMEOUT)?;
        p.begin_transaction()
    })
    .await
    .expect("init_transactions task")?;
    Ok(producer)
}
