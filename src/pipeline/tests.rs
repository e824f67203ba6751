//! The pipeline's ordering, retry and gating rules, on the scripted sink with tokio's paused
//! clock (backoffs pass at once, nothing waits on real time).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::classify::tests::object;
use super::{Error, Pipeline, Status};
use crate::budget::{Budget, Reservation};
use crate::change::ChangeKind;
use crate::checkpoint::{Checkpoint, FileStore, MemoryStore, Store, WatchKey};
use crate::config::SnapshotPolicy;
use crate::encode::tests::configmaps;
use crate::lease::Validity;
use crate::sink::AnySink;
use crate::sink::scripted::{Script, ScriptedSink};
use crate::watch::Item;

/// A live event of ConfigMap `uid` at resourceVersion `rv` (its data differs per version).
fn event(uid: &str, rv: &str) -> Item {
    let object = object(uid, rv, rv);
    let kind = if rv == "1" {
        ChangeKind::Added
    } else {
        ChangeKind::Modified
    };
    Item::Event(kind, Box::new(object), SystemTime::now())
}

/// The id of the event of `uid` at `rv`.
fn id(uid: &str, rv: &str) -> String {
    let kind = if rv == "1" { "added" } else { "modified" };
    format!("{uid}:{rv}:{kind}")
}

/// A running pipeline on `sink`, fed `items`; the watch's side of the channel stays open until
/// [`Run::finish`].
struct Run {
    sink: Arc<ScriptedSink>,
    status: Arc<Status>,
    watch: mpsc::Sender<(Item, Reservation)>,
    task: JoinHandle<Result<(), Error>>,
}

impl Run {
    fn start(sink: ScriptedSink, items: Vec<Item>) -> Self {
        Self::start_with(sink, items, Store::new(MemoryStore), Duration::from_secs(1))
    }

    /// Like [`Run::start`], with checkpoints in `store` every `interval`.
    fn start_with(
        sink: ScriptedSink,
        items: Vec<Item>,
        store: Store,
        checkpoint_interval: Duration,
    ) -> Self {
        Self::start_full(sink, items, store, checkpoint_interval, None)
    }

    /// Like [`Run::start_with`], publishing only while `leadership` is valid.
    fn start_full(
        sink: ScriptedSink,
        items: Vec<Item>,
        store: Store,
        checkpoint_interval: Duration,
        leadership: Option<Validity>,
    ) -> Self {
        Self::resume(sink, items, store, checkpoint_interval, leadership, None)
    }

    /// Like [`Run::start_full`], resuming from `resume`.
    fn resume(
        sink: ScriptedSink,
        items: Vec<Item>,
        store: Store,
        checkpoint_interval: Duration,
        leadership: Option<Validity>,
        resume: Option<Checkpoint>,
    ) -> Self {
        Self::launch(
            sink,
            items,
            store,
            checkpoint_interval,
            leadership,
            resume,
            None,
        )
    }

    /// Like [`Run::resume`], with the watch's byte `budget`.
    fn launch(
        sink: ScriptedSink,
        items: Vec<Item>,
        store: Store,
        checkpoint_interval: Duration,
        leadership: Option<Validity>,
        resume: Option<Checkpoint>,
        budget: Option<Budget>,
    ) -> Self {
        let sink = Arc::new(sink);
        let status = Arc::new(Status::default());
        let pipeline = Pipeline {
            info: configmaps(""),
            events: [ChangeKind::Added, ChangeKind::Modified, ChangeKind::Deleted].into(),
            sink: sink.clone() as Arc<AnySink>,
            max_in_flight: 8,
            status: status.clone(),
            store,
            resume,
            snapshot: SnapshotPolicy::Initial,
            checkpoint_interval,
            leadership,
            heartbeat: None,
            watch: super::WatchIdentity {
                key: crate::checkpoint::WatchKey::new("dev", "v1", "configmaps", None, None, None),
                namespace: None,
            },
            demands: None,
            budget,
        };
        let (tx, rx) = mpsc::channel(items.len().max(1));
        for item in items {
            tx.try_send((item, Reservation::none())).expect("room");
        }
        let task = tokio::spawn(pipeline.run(rx));
        Self {
            sink,
            status,
            watch: tx,
            task,
        }
    }

    /// Like [`Run::start`], with checkpoints in memory every hour (so that only the sink's own
    /// commit cadence commits).
    fn checkpointing_hourly(sink: ScriptedSink, items: Vec<Item>) -> Self {
        Self::start_with(
            sink,
            items,
            Store::new(MemoryStore),
            Duration::from_secs(3600),
        )
    }

    /// Closes the watch's side, waits until the pipeline drained and stopped; returns how it
    /// ended.
    async fn finish(self) -> (Arc<ScriptedSink>, Arc<Status>, Result<(), Error>) {
        drop(self.watch);
        let ended = self.task.await.expect("the pipeline does not panic");
        (self.sink, self.status, ended)
    }

    fn published(&self) -> u64 {
        published(&self.status)
    }
}

fn published(status: &Status) -> u64 {
    status
        .published
        .iter()
        .map(|n| n.load(Ordering::Relaxed))
        .sum()
}

fn sent_ids(sink: &ScriptedSink) -> Vec<String> {
    sink.book().sent.iter().map(|s| s.id.clone()).collect()
}

/// Polls `condition` on the paused clock until it holds (a generous virtual timeout).
async fn until(what: &str, condition: impl Fn() -> bool) {
    for _ in 0..60_000 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

#[tokio::test(start_paused = true)]
async fn two_publishes_of_one_object_are_never_in_flight_at_once_when_the_sink_cannot_order_them() {
    let sink = ScriptedSink::new(false, false);
    sink.script("a", &[Script::AckAfter(Duration::from_secs(1))]);
    let items = vec![event("a", "1"), event("b", "1"), event("a", "2")];
    let (sink, status, ended) = Run::start(sink, items).finish().await;
    ended.expect("the pipeline ends cleanly");
    let book = sink.book();
    assert_eq!(book.max_in_flight_per_object, 1);
    assert_eq!(book.max_in_flight, 2, "another object is not held up");
    assert_eq!(book.acked, [id("b", "1"), id("a", "1"), id("a", "2")]);
    assert_eq!(published(&status), 3);
}

#[tokio::test(start_paused = true)]
async fn a_sink_that_keeps_order_gets_several_publishes_of_one_object_at_once() {
    let sink = ScriptedSink::new(true, false);
    sink.script("a", &[Script::AckAfter(Duration::from_secs(1))]);
    let (sink, _, ended) = Run::start(sink, vec![event("a", "1"), event("a", "2")])
        .finish()
        .await;
    ended.expect("the pipeline ends cleanly");
    assert_eq!(sink.book().max_in_flight_per_object, 2);
}

#[tokio::test(start_paused = true)]
async fn retries_send_the_same_id_until_the_broker_stores_it() {
    let sink = ScriptedSink::new(true, false);
    sink.script("a", &[Script::Retry, Script::Retry]);
    let (sink, status, ended) = Run::start(sink, vec![event("a", "1"), event("b", "1")])
        .finish()
        .await;
    ended.expect("the pipeline ends cleanly");
    assert_eq!(
        sent_ids(&sink),
        [id("a", "1"), id("a", "1"), id("a", "1"), id("b", "1")]
    );
    assert_eq!(sink.book().acked, [id("a", "1"), id("b", "1")]);
    assert_eq!(status.retried.load(Ordering::Relaxed), 2);
    assert_eq!(published(&status), 2);
    assert!(status.stall().is_none(), "a short failure does not stall");
}

/// A replica whose Lease lapsed while it waited to send an event again sends nothing more:
/// ownership is checked before every retry, not only before the first send.
#[tokio::test(start_paused = true)]
async fn a_retry_after_the_lease_lapsed_sends_nothing() {
    let sink = ScriptedSink::new(true, false);
    sink.script("a", &[Script::Retry, Script::Retry, Script::Retry]);
    let leadership = Validity::unrenewed();
    leadership.renewed(Duration::from_secs(3600), std::time::Instant::now());
    let store = Store::new(MemoryStore);
    let items = vec![event("a", "1")];
    let run = Run::start_full(
        sink,
        items,
        store,
        Duration::from_secs(1),
        Some(leadership.clone()),
    );
    until("the first send failed", || {
        run.status.retried.load(Ordering::Relaxed) >= 1
    })
    .await;
    leadership.lose();
    let (sink, _, ended) = run.finish().await;
    assert!(
        matches!(ended, Err(Error::LeadershipLost { .. })),
        "{ended:?}"
    );
    assert_eq!(sent_ids(&sink), [id("a", "1")], "no retry after the lapse");
}

/// The send histogram times each event once, when the broker client takes it (a retry is not
/// a second send), before and apart from its acknowledgement.
#[tokio::test(start_paused = true)]
async fn the_send_is_timed_once_per_event_as_the_broker_client_takes_it() {
    let sink = ScriptedSink::new(true, false);
    sink.script("a", &[Script::Retry, Script::Hold]);
    let run = Run::start(sink, vec![event("a", "1"), event("b", "1")]);
    // The retry of a is sent and held; b waits behind it.
    run.sink.sent(2).await;
    assert_eq!(sent_ids(&run.sink), [id("a", "1"), id("a", "1")]);
    assert_eq!(run.status.send_latency.count.load(Ordering::Relaxed), 1);
    assert_eq!(run.status.latency.count.load(Ordering::Relaxed), 0);
    run.sink.release();
    let (sink, status, ended) = run.finish().await;
    ended.expect("the pipeline ends cleanly");
    assert_eq!(sink.book().sent.len(), 3, "a twice, b once");
    assert_eq!(status.send_latency.count.load(Ordering::Relaxed), 2);
    assert_eq!(status.latency.count.load(Ordering::Relaxed), 2);
}

#[tokio::test(start_paused = true)]
async fn an_event_refused_twice_as_too_large_is_published_as_a_truncated_reference() {
    let sink = ScriptedSink::new(true, false);
    sink.script("a", &[Script::TooLarge, Script::TooLarge]);
    let (sink, status, ended) = Run::start(sink, vec![event("a", "1")]).finish().await;
    ended.expect("the pipeline ends cleanly");
    let truncated: Vec<bool> = sink.book().sent.iter().map(|s| s.truncated).collect();
    assert_eq!(
        truncated,
        [false, false, true],
        "cut only when refused alone again"
    );
    assert_eq!(sink.book().acked, [id("a", "1")]);
    assert_eq!(status.truncated.load(Ordering::Relaxed), 1);
    assert_eq!(published(&status), 1);
}

#[tokio::test(start_paused = true)]
async fn an_event_refused_for_good_is_skipped_and_counted_without_blocking_later_objects() {
    let sink = ScriptedSink::new(true, false);
    sink.script("a", &[Script::Refuse]);
    let items = vec![event("a", "1"), event("b", "1"), event("b", "2")];
    let (sink, status, ended) = Run::start(sink, items).finish().await;
    ended.expect("the pipeline ends cleanly");
    assert_eq!(sent_ids(&sink), [id("a", "1"), id("b", "1"), id("b", "2")]);
    assert_eq!(sink.book().acked, [id("b", "1"), id("b", "2")]);
    let rejected = status.rejected.lock().unwrap().clone();
    assert_eq!(rejected.get("invalid"), Some(&1));
    assert_eq!(published(&status), 2);
    assert_eq!(status.checkpoint_resource_version().as_deref(), Some("2"));
}

#[tokio::test(start_paused = true)]
async fn a_refusal_of_every_event_pauses_and_stalls_the_watch_until_it_is_lifted() {
    let sink = ScriptedSink::new(true, false);
    sink.script("a", &[Script::Block, Script::Block, Script::Hold]);
    let run = Run::start(sink, vec![event("a", "1")]);
    run.sink.sent(3).await;
    let stall = run.status.stall().expect("stalled while refused");
    assert_eq!(stall.reason, "not_authorized");
    {
        let book = run.sink.book();
        let at: Vec<_> = book.sent.iter().map(|s| s.at).collect();
        assert!(at[1] > at[0] && at[2] > at[1], "each refusal pauses");
        assert!(book.acked.is_empty());
    }
    assert_eq!(run.published(), 0);
    // The operator fixes the permission: the held send is stored.
    run.sink.release();
    let (sink, status, ended) = run.finish().await;
    ended.expect("the pipeline ends cleanly");
    assert_eq!(sink.book().acked, [id("a", "1")]);
    assert!(
        status.stall().is_none(),
        "publishing again clears the stall"
    );
    let blocked = status.blocked.lock().unwrap().clone();
    assert_eq!(blocked.get("not_authorized"), Some(&2));
    assert_eq!(published(&status), 1);
}

#[tokio::test(start_paused = true)]
async fn the_checkpoint_never_passes_an_unacknowledged_event() {
    let sink = ScriptedSink::new(true, false);
    sink.script("a", &[Script::Hold]);
    let items = vec![event("a", "7"), event("b", "8"), Item::Progress("9".into())];
    let run = Run::start(sink, items);
    run.sink.sent(2).await;
    // The broker stays silent past the stall threshold: the watch says so, and saves nothing.
    let status = run.status.clone();
    until("the silent broker stalls the watch", || {
        status
            .stall()
            .is_some_and(|s| s.reason == "broker_unavailable")
    })
    .await;
    assert_eq!(run.sink.book().acked, [id("b", "8")]);
    assert_eq!(
        run.status.checkpoint_resource_version(),
        None,
        "b is stored, but a before it is not"
    );
    run.sink.release();
    let (_, status, ended) = run.finish().await;
    ended.expect("the pipeline ends cleanly");
    assert_eq!(status.checkpoint_resource_version().as_deref(), Some("9"));
    assert!(status.stall().is_none());
}

/// With durable checkpoints, a first list's starting point is saved as soon as its snapshot is
/// acknowledged (not at the next checkpoint interval), and only then is the watch synced: a
/// restart after `/readyz` said ready resumes from a checkpoint instead of starting afresh.
#[tokio::test(start_paused = true)]
async fn a_watch_is_synced_only_once_its_starting_point_is_saved() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("watch.checkpoint");
    let store = Store::new(FileStore {
        key: WatchKey::new("c", "v1", "configmaps", None, None, None),
        path: path.clone(),
        cluster: None,
    });
    let sink = ScriptedSink::new(true, false);
    sink.script("a", &[Script::Hold]);
    let listed = Item::Listed(Box::new(object("a", "5", "5")), SystemTime::now());
    let items = vec![Item::ListBegin, listed, Item::ListEnd("5".into())];
    let run = Run::start_with(sink, items, store, Duration::from_secs(3600));
    run.sink.sent(1).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        !run.status.synced.load(Ordering::Relaxed),
        "not synced while the snapshot awaits its acknowledgement"
    );
    assert!(!path.exists(), "nothing saved before the acknowledgement");
    run.sink.release();
    let status = run.status.clone();
    until("the watch is synced", || {
        status.synced.load(Ordering::Relaxed)
    })
    .await;
    assert_eq!(status.checkpoint_resource_version().as_deref(), Some("5"));
    assert!(path.exists(), "the starting point is on disk");
    let (_, _, ended) = run.finish().await;
    ended.expect("the pipeline ends cleanly");
}

#[tokio::test(start_paused = true)]
async fn a_failure_inside_a_transaction_aborts_it_and_sends_its_events_again_in_order() {
    let sink = ScriptedSink::new(true, true);
    // b fails once c is sent behind it; the abort purges c.
    sink.script("b", &[Script::RetryAfter(Duration::from_secs(1))]);
    sink.script("c", &[Script::Hold]);
    let items = vec![event("a", "1"), event("b", "1"), event("c", "1")];
    let (sink, status, ended) = Run::start(sink, items).finish().await;
    ended.expect("the pipeline ends cleanly");
    let round = [id("a", "1"), id("b", "1"), id("c", "1")];
    assert_eq!(sent_ids(&sink), [round.clone(), round.clone()].concat());
    let book = sink.book();
    assert_eq!(book.aborts, 1);
    assert_eq!(book.acked, [vec![id("a", "1")], round.to_vec()].concat());
    assert_eq!(status.aborted_transactions.load(Ordering::Relaxed), 1);
    assert_eq!(status.checkpoint_resource_version().as_deref(), Some("1"));
}

#[tokio::test(start_paused = true)]
async fn a_fenced_producer_stops_the_pipeline() {
    let sink = ScriptedSink::new(true, false);
    sink.script("a", &[Script::Fatal]);
    let (_, status, ended) = Run::start(sink, vec![event("a", "1"), event("b", "1")])
        .finish()
        .await;
    assert!(
        matches!(ended, Err(Error::Fenced { .. })),
        "ended with {ended:?}"
    );
    assert_eq!(status.checkpoint_resource_version(), None);
}

/// A Kafka watch commits on its sink's cadence, each commit carrying the checkpoint: committed
/// readers see its events long before the checkpoint interval (an hour here) would have
/// committed them, and no commit leaves events visible without the checkpoint that covers them.
#[tokio::test(start_paused = true)]
async fn a_transactional_watch_commits_with_its_checkpoint_on_the_sinks_cadence() {
    let sink = ScriptedSink::new(true, true);
    let items = vec![event("a", "1"), event("b", "2")];
    let run = Run::checkpointing_hourly(sink, items);
    let status = run.status.clone();
    // `until` gives up after 600 s of the paused clock, well before the checkpoint interval.
    until("the checkpoint covers both events", || {
        status.checkpoint_resource_version().as_deref() == Some("2")
    })
    .await;
    assert_eq!(run.sink.book().acked, [id("a", "1"), id("b", "2")]);
    run.watch
        .send((event("a", "3"), Reservation::none()))
        .await
        .expect("the pipeline runs");
    until("a later event is committed with its checkpoint too", || {
        status.checkpoint_resource_version().as_deref() == Some("3")
    })
    .await;
    assert_eq!(
        run.sink.book().commits,
        0,
        "every commit carried the checkpoint"
    );
    let (_, _, ended) = run.finish().await;
    ended.expect("the pipeline ends cleanly");
}

#[tokio::test(start_paused = true)]
async fn a_broker_call_unanswered_for_the_stall_threshold_reports_the_watch_stalled_until_it_succeeds()
 {
    let status = Arc::new(Status::default());
    let call = |secs: u64, ok: bool| async move {
        tokio::time::sleep(Duration::from_secs(secs)).await;
        if ok { Ok(()) } else { Err("timed out") }
    };
    let quick = super::delivery::awaiting_broker(&status, "transaction commit", call(29, true));
    assert_eq!(quick.await, Ok(()));
    assert!(
        status.stall().is_none(),
        "an answer within 30 s is no stall"
    );

    let slow = {
        let status = status.clone();
        tokio::spawn(async move {
            super::delivery::awaiting_broker(&status, "transaction commit", call(45, true)).await
        })
    };
    tokio::time::sleep(Duration::from_secs(31)).await;
    let stall = status.stall().expect("stalled while the commit waits");
    assert_eq!(stall.reason, "broker_unavailable");
    assert!(
        stall.error.contains("transaction commit"),
        "{}",
        stall.error
    );
    assert_eq!(slow.await.unwrap(), Ok(()));
    assert!(status.stall().is_none(), "the answer clears the stall");

    let failed = super::delivery::awaiting_broker(&status, "checkpoint save", call(60, false));
    assert_eq!(failed.await, Err("timed out"));
    assert!(
        status.stall().is_some(),
        "a failed call leaves the stall to the next acknowledgement"
    );
}

/// A Kafka watch found idle with a commit pending once the commit interval passed, while the
/// watch's channel still held events, used to spin on the passed commit time without taking
/// them (a core at 100 % and intake stopped until the checkpoint interval forced the commit).
/// It takes them, then commits. Real time: a spinning pipeline never lets a paused clock move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_transactional_watch_takes_waiting_events_once_its_commit_interval_passed() {
    let sink = ScriptedSink::new(true, true);
    // A full flight (8) acknowledged after twice the commit interval, a ninth event waiting.
    let mut items = Vec::new();
    for i in 0..9 {
        let uid = format!("u{i}");
        if i < 8 {
            sink.script(&uid, &[Script::AckAfter(Duration::from_millis(20))]);
        }
        items.push(event(&uid, &(i + 1).to_string()));
    }
    let run = Run::checkpointing_hourly(sink, items);
    let status = run.status.clone();
    let committed = tokio::time::timeout(Duration::from_secs(10), async {
        while status.checkpoint_resource_version().as_deref() != Some("9") {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        committed.is_ok(),
        "the ninth event was not committed: the pipeline did not take it (committed: {:?})",
        status.checkpoint_resource_version()
    );
    let (_, _, ended) = run.finish().await;
    ended.expect("the pipeline ends cleanly");
}

/// A listing Kafka watch commits the events it holds in chunks, every checkpoint interval (an
/// hour here), and their reservations go back only then. While another watch waits for the
/// process's budget they keep spent, the transaction commits on the sink's cadence instead.
#[tokio::test(start_paused = true)]
async fn a_listing_transaction_commits_on_the_sinks_cadence_while_another_watch_waits_for_room() {
    const KIB: usize = 1024;
    let total = Budget::new(8 * KIB);
    let (own, other) = (
        Budget::within(64 * KIB, &total),
        Budget::within(64 * KIB, &total),
    );
    let run = Run::launch(
        ScriptedSink::new(true, true),
        vec![Item::ListBegin],
        Store::new(MemoryStore),
        Duration::from_secs(3600),
        None,
        None,
        Some(own.clone()),
    );
    for uid in ["a", "b"] {
        let listed = Item::Listed(Box::new(object(uid, "1", "1")), SystemTime::now());
        let reservation = own.reserve(4 * KIB).await;
        run.watch.send((listed, reservation)).await.expect("runs");
    }
    until("both listed events are acknowledged", || {
        run.sink.book().acked.len() == 2
    })
    .await;
    assert_eq!(run.sink.book().commits, 0, "held in the open transaction");
    let asked = tokio::time::Instant::now();
    let _room = other.reserve(4 * KIB).await;
    let waited = asked.elapsed();
    assert!(
        waited < Duration::from_secs(1),
        "the other watch waited {waited:?}: the held events' reservations went back only with \
         the checkpoint interval's commit"
    );
    assert_eq!(
        run.sink.book().commits,
        1,
        "one commit, without a checkpoint"
    );
    let (_, _, ended) = run.finish().await;
    ended.expect("the pipeline ends cleanly");
}

/// A Kafka commit found due while events are in flight waits for their acknowledgements: it
/// has the producer send them at once (not after `linger.ms`), once per commit, and commits
/// only once they are acknowledged.
#[tokio::test(start_paused = true)]
async fn a_due_commit_has_what_is_in_flight_sent_now_once() {
    let sink = ScriptedSink::new(true, true);
    let mut items = Vec::new();
    for i in 0..4 {
        let uid = format!("u{i}");
        sink.script(&uid, &[Script::AckAfter(Duration::from_millis(25))]);
        items.push(event(&uid, &(i + 1).to_string()));
    }
    let run = Run::checkpointing_hourly(sink, items);
    let status = run.status.clone();
    until("the checkpoint covers every event", || {
        status.checkpoint_resource_version().as_deref() == Some("4")
    })
    .await;
    let (sent_now, acked) = {
        let book = run.sink.book();
        (book.sent_now.clone(), book.acked.len())
    };
    assert!(!sent_now.is_empty(), "a commit waited for events");
    assert!(
        sent_now.iter().all(|&unsettled| unsettled > 0),
        "sent now only with events in flight: {sent_now:?}"
    );
    let commits = status.checkpoints.load(Ordering::Relaxed) as usize;
    assert!(
        sent_now.len() <= commits,
        "once per commit: {} calls, {commits} commits",
        sent_now.len()
    );
    assert_eq!(acked, 4);
    let (_, _, ended) = run.finish().await;
    ended.expect("the pipeline ends cleanly");
}

fn file_store(path: &std::path::Path) -> Store {
    Store::new(FileStore {
        key: WatchKey::new("c", "v1", "configmaps", None, None, None),
        path: path.to_path_buf(),
        cluster: None,
    })
}

/// An object first published past the checkpoint is announced before it is sent. The watch
/// stops without saving (killed); whoever resumes carries the announcement, and when the
/// object is gone from the list that follows a lost history, publishes its delete.
#[tokio::test(start_paused = true)]
async fn an_object_published_past_the_checkpoint_is_deleted_by_whoever_resumes_without_it() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("watch.checkpoint");
    let sink = ScriptedSink::new(true, false);
    sink.script("b", &[Script::Hold]);
    let listed = Item::Listed(Box::new(object("a", "5", "5")), SystemTime::now());
    let items = vec![Item::ListBegin, listed, Item::ListEnd("5".into())];
    let run = Run::start_with(sink, items, file_store(&path), Duration::from_secs(3600));
    let status = run.status.clone();
    until("the starting point is saved", || {
        status.checkpoint_resource_version().as_deref() == Some("5")
    })
    .await;
    let announced = dir.path().join("watch.checkpoint.announced");
    assert!(
        !announced.exists(),
        "the save covers the snapshot's announcements"
    );
    run.watch
        .send((event("b", "1"), Reservation::none()))
        .await
        .expect("the pipeline takes it");
    run.sink.sent(2).await;
    let lines = std::fs::read_to_string(&announced).expect("b was announced before its send");
    assert!(lines.contains("\"b\""), "{lines}");
    // Killed before b is acknowledged and saved.
    run.task.abort();

    let mut store = file_store(&path);
    let resumed = store
        .load(&Default::default())
        .await
        .expect("loads")
        .expect("a checkpoint");
    assert_eq!(resumed.resource_version.as_deref(), Some("5"));
    assert_eq!(resumed.announced.len(), 1);
    // b was deleted while the history was lost: the list after the 410 does not show it.
    let listed = Item::Listed(Box::new(object("a", "5", "5")), SystemTime::now());
    let items = vec![Item::ListBegin, listed, Item::ListEnd("9".into())];
    let sink = ScriptedSink::new(true, false);
    let run = Run::resume(
        sink,
        items,
        store,
        Duration::from_secs(1),
        None,
        Some(resumed),
    );
    let (sink, status, ended) = run.finish().await;
    ended.expect("the pipeline ends cleanly");
    assert_eq!(sent_ids(&sink), ["b:1:deleted"]);
    assert_eq!(status.checkpoint_resource_version().as_deref(), Some("9"));
    assert!(
        !announced.exists(),
        "the save covers the announcement it resolved"
    );
}

/// A watch carrying announcements saves nothing until the watch has named them all: a save
/// would drop them.
#[tokio::test(start_paused = true)]
async fn a_watch_carrying_announcements_saves_only_once_the_watch_named_them() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("watch.checkpoint");
    let mut store = file_store(&path);
    let mut known = crate::known::KnownObjects::default();
    known.observe("a", "5", Some("ns"), "cm-a", 0);
    store.save("5", &mut known).await.expect("saved");
    store
        .announce(&[("b".into(), "7".into(), Some("ns".into()), "cm-b".into(), 0)])
        .await
        .expect("announced");
    let resumed = store.load(&Default::default()).await.expect("loads");
    let items = vec![event("a", "6"), Item::Progress("7".into())];
    let run = Run::resume(
        ScriptedSink::new(true, false),
        items,
        store,
        Duration::from_secs(1),
        None,
        resumed,
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let status = run.status.clone();
    assert_eq!(
        status.checkpoint_resource_version().as_deref(),
        Some("5"),
        "b is not named yet: nothing saved past 5"
    );
    run.watch
        .send((event("b", "1"), Reservation::none()))
        .await
        .expect("the pipeline takes it");
    run.watch
        .send((Item::Progress("8".into()), Reservation::none()))
        .await
        .expect("the pipeline takes it");
    until("the checkpoint moves on", || {
        status.checkpoint_resource_version().as_deref() == Some("8")
    })
    .await;
    let (sink, _, ended) = run.finish().await;
    ended.expect("the pipeline ends cleanly");
    assert_eq!(sent_ids(&sink), ["a:6:modified", "b:1:added"]);
}
