//! A scripted in-memory sink for unit tests: the outcome of every send of an object's events is
//! scripted in advance (acknowledge, acknowledge late, hold until released, retry, too large,
//! refused for good, refusing every event, fatal), optionally inside transactions like Kafka's,
//! and everything sent is recorded for the test to check.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Compaction, Delivered, Outcome, Owner, Pending, Result, Sink, Transactions};
use crate::encode::{Event, ResourceInfo};
use crate::template::Values;

/// The commit cadence of the scripted transactions (Kafka's default).
pub(crate) const COMMIT_INTERVAL: Duration = Duration::from_millis(10);

/// What the scripted broker does with one send of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Script {
    /// Stored at once.
    Ack,
    /// Stored after this long.
    AckAfter(Duration),
    /// Stored once the test calls [`ScriptedSink::release`]; purged (`Aborted`) if the
    /// transaction is aborted first.
    Hold,
    /// Not stored this time (`Outcome::Retry`).
    Retry,
    /// Not stored, said after this long.
    RetryAfter(Duration),
    /// Refused as too large (`Outcome::Rejected { reason: "too_large" }`).
    TooLarge,
    /// Refused for good (`Outcome::Rejected { reason: "invalid" }`).
    Refuse,
    /// Refused like every event of the destination (`Outcome::Blocked`, `not_authorized`).
    Block,
    /// The producer is fenced (`Outcome::Fatal`).
    Fatal,
}

/// One send, as the scripted broker saw it.
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    /// The event's id.
    pub id: String,
    /// Whether the event was cut to a reference.
    pub truncated: bool,
    /// When it was sent (tokio's clock, paused in tests).
    pub at: Instant,
}

/// What the scripted broker records.
#[derive(Debug, Default)]
pub(crate) struct Book {
    /// Scripts still to play, per object uid; an object without one is acknowledged.
    scripts: HashMap<String, VecDeque<Script>>,
    /// Every send, in order.
    pub sent: Vec<Sent>,
    /// Ids of the events stored, in the order the broker stored them.
    pub acked: Vec<String>,
    /// Sends per object uid whose outcome is not settled yet.
    in_flight: HashMap<String, usize>,
    /// The most sends of one object ever unsettled at once.
    pub max_in_flight_per_object: usize,
    /// The most sends ever unsettled at once.
    pub max_in_flight: usize,
    /// Transactions aborted.
    pub aborts: usize,
    /// Transactions committed without a checkpoint.
    pub commits: usize,
    /// Calls of [`Transactions::send_now`], and how many sends were unsettled at each.
    pub sent_now: Vec<usize>,
}

/// The scripted sink.
#[derive(Debug)]
pub(crate) struct ScriptedSink {
    book: Arc<Mutex<Book>>,
    ordered_in_flight: bool,
    transactional: bool,
    /// Number of sends so far, for tests to wait on.
    sends: watch::Sender<usize>,
    /// Raised when a delivery fails inside the open transaction.
    voided: Arc<watch::Sender<bool>>,
    /// Releases of held events so far.
    released: watch::Sender<u64>,
    /// Aborted transactions so far: held events are purged.
    aborted: watch::Sender<u64>,
    /// Whether it offers [`Compaction`] (holding no keys, taking every tombstone).
    compacted: bool,
}

impl ScriptedSink {
    /// A sink that keeps the order of two events of one object in flight (like Kafka) or not
    /// (like NATS JetStream), with or without transactions.
    pub fn new(ordered_in_flight: bool, transactional: bool) -> Self {
        Self {
            book: Arc::default(),
            ordered_in_flight,
            transactional,
            sends: watch::channel(0).0,
            voided: Arc::new(watch::channel(false).0),
            released: watch::channel(0).0,
            aborted: watch::channel(0).0,
            compacted: false,
        }
    }

    /// The same sink, compacted by key.
    pub fn compacted(mut self) -> Self {
        self.compacted = true;
        self
    }

    /// Scripts the next sends of the events of object `uid`, in order.
    pub fn script(&self, uid: &str, scripts: &[Script]) {
        self.book()
            .scripts
            .entry(uid.into())
            .or_default()
            .extend(scripts);
    }

    /// What was recorded.
    pub fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores every held event.
    pub fn release(&self) {
        self.released.send_modify(|n| *n += 1);
    }

    /// Waits until `n` sends were made.
    pub async fn sent(&self, n: usize) {
        let mut sends = self.sends.subscribe();
        sends.wait_for(|s| *s >= n).await.expect("the sink lives");
    }

    /// The next script for `event`, recording its send.
    fn record(&self, event: &Event) -> Script {
        let mut book = self.book();
        let script = book
            .scripts
            .get_mut(&event.uid)
            .and_then(VecDeque::pop_front)
            .unwrap_or(Script::Ack);
        book.sent.push(Sent {
            id: event.id.clone(),
            truncated: event.truncated,
            at: Instant::now(),
        });
        let unsettled = book.in_flight.entry(event.uid.clone()).or_default();
        *unsettled += 1;
        let per_object = *unsettled;
        let total = book.in_flight.values().sum();
        book.max_in_flight_per_object = book.max_in_flight_per_object.max(per_object);
        book.max_in_flight = book.max_in_flight.max(total);
        script
    }

    /// The acknowledgement of one send, played from its script.
    fn pending(&self, event: Event, script: Script) -> Pending {
        let book = self.book.clone();
        let voided = self.transactional.then(|| self.voided.clone());
        let mut released = self.released.subscribe();
        let mut aborted = self.aborted.subscribe();
        let (released_before, aborted_before) = (*released.borrow(), *aborted.borrow());
        Box::pin(async move {
            let outcome = match script {
                Script::Ack => Outcome::Acked,
                Script::AckAfter(delay) => {
                    tokio::time::sleep(delay).await;
                    Outcome::Acked
                }
                Script::Hold => tokio::select! {
                    _ = released.wait_for(|n| *n > released_before) => Outcome::Acked,
                    _ = aborted.wait_for(|n| *n > aborted_before) => Outcome::Aborted,
                },
                Script::Retry => Outcome::Retry {
                    error: "scripted: try again".into(),
                },
                Script::RetryAfter(delay) => {
                    tokio::time::sleep(delay).await;
                    Outcome::Retry {
                        error: "scripted: try again".into(),
                    }
                }
                Script::TooLarge => Outcome::Rejected {
                    reason: "too_large",
                    error: "scripted: message too large".into(),
                },
                Script::Refuse => Outcome::Rejected {
                    reason: "invalid",
                    error: "scripted: invalid record".into(),
                },
                Script::Block => Outcome::Blocked {
                    reason: "not_authorized",
                    error: "scripted: not authorized".into(),
                },
                Script::Fatal => Outcome::Fatal {
                    error: "scripted: fenced".into(),
                },
            };
            let mut b = book.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = b.in_flight.get_mut(&event.uid) {
                *n -= 1;
            }
            match (&outcome, voided) {
                (Outcome::Acked, _) => b.acked.push(event.id.clone()),
                // Like librdkafka's: any failure voids the open transaction.
                (_, Some(voided)) => {
                    voided.send_replace(true);
                }
                (_, None) => {}
            }
            drop(b);
            Delivered { event, outcome }
        })
    }
}

impl Sink for ScriptedSink {
    fn name(&self) -> &'static str {
        "scripted"
    }

    fn send(&self, event: Event) -> BoxFuture<'_, Pending> {
        let script = self.record(&event);
        self.sends.send_modify(|n| *n += 1);
        Box::pin(std::future::ready(self.pending(event, script)))
    }

    fn send_raw<'a>(
        &'a self,
        _destination: &'a str,
        _key: &'a str,
        _payload: Vec<u8>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn flush(&self, _timeout: Duration) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }

    /// The resource's own destination as Kafka renders it, else `{resource}.{namespace}`.
    fn watch_destination(&self, info: &ResourceInfo, values: &Values<'_>) -> Option<String> {
        match &info.destination {
            Some(t) => t.per_watch(values).then(|| t.render_topic(values)),
            None => Some(format!(
                "{}.{}",
                info.resource,
                values.namespace.unwrap_or("all")
            )),
        }
    }

    fn compaction(&self) -> Option<&dyn Compaction> {
        self.compacted.then_some(self as &dyn Compaction)
    }

    fn ordered_in_flight(&self) -> bool {
        self.ordered_in_flight
    }

    fn transactions(&self) -> Option<&dyn Transactions> {
        self.transactional.then_some(self as &dyn Transactions)
    }
}

impl Compaction for ScriptedSink {
    fn held_keys<'a>(
        &'a self,
        _destination: &'a str,
        _owner: &'a Owner,
    ) -> BoxFuture<'a, Result<Vec<String>>> {
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    fn tombstones<'a>(
        &'a self,
        _destination: &'a str,
        _keys: &'a [String],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

impl Transactions for ScriptedSink {
    fn voided(&self) -> BoxFuture<'_, ()> {
        let mut voided = self.voided.subscribe();
        Box::pin(async move {
            // The sender lives as long as the sink.
            let _ = voided.wait_for(|v| *v).await;
        })
    }

    fn settled_voided(&self) {
        self.voided.send_replace(false);
    }

    fn recover(&self) -> BoxFuture<'_, Result<()>> {
        self.book().aborts += 1;
        self.aborted.send_modify(|n| *n += 1);
        Box::pin(std::future::ready(Ok(())))
    }

    fn commit(&self) -> BoxFuture<'_, Result<()>> {
        self.book().commits += 1;
        Box::pin(std::future::ready(Ok(())))
    }

    fn requested(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::pending())
    }

    fn send_now(&self) {
        let mut book = self.book();
        let unsettled = book.in_flight.values().sum();
        book.sent_now.push(unsettled);
    }

    fn commit_interval(&self) -> Duration {
        COMMIT_INTERVAL
    }
}
