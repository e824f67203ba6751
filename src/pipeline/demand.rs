//! A snapshot on demand inside the pipeline: its items wait in a queue of their own, in order,
//! and each listed object is decided against the stream's position and the index
//! ([`crate::demand::watermark`]) as soon as it can be. Live items never wait for them: a held
//! object only stops the snapshot's queue, and the queue moves again after every item that
//! moves the position. A mark does not stop the pipeline either: it is answered once what was
//! sent before it is acknowledged (and, in a Kafka transaction, committed), while live items go
//! on ([`Demands::answer_marks`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use kube::api::DynamicObject;
use tokio::sync::oneshot;
use tracing::{info, warn};

use super::{Pipeline, Result, State};
use crate::budget::Reservation;
use crate::change::{Change, ChangeKind, Origin};
use crate::demand::marker::{self, Watch};
use crate::demand::watermark::{Decision, decide};
use crate::demand::{self, Demand, Outcome, Scope, Tally};
use crate::known::KnownObjects;

/// The queue of a watch's snapshot items and what was done with them.
#[derive(Debug, Default)]
pub(super) struct Demands {
    queue: VecDeque<(Demand, Reservation)>,
    /// Per snapshot: what was emitted and skipped since its last mark.
    tallies: HashMap<Arc<str>, Tally>,
    /// Per snapshot: why a marker could not be published, told at its next mark.
    failed: HashMap<Arc<str>, String>,
    /// The snapshots with markers or tombstones in the open Kafka transaction.
    uncommitted: Vec<Arc<str>>,
    /// Marks taken, in order, waiting for what was sent before them.
    marks: VecDeque<Mark>,
    /// Commits of the Kafka transaction since the pipeline started.
    commits: u64,
}

/// A mark waiting for what was sent before it.
#[derive(Debug)]
struct Mark {
    /// Deliveries handed to the sink before it.
    sent: u64,
    /// Commits made before it.
    commits: u64,
    /// The snapshot.
    id: Arc<str>,
    /// What was done with the snapshot's objects since its last mark.
    tally: Tally,
    /// Where the walk waits.
    answer: oneshot::Sender<std::result::Result<Tally, String>>,
}

/// Where the pipeline's deliveries stand, for the marks waiting on them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Deliveries {
    /// Deliveries whose acknowledgement was taken since the pipeline started.
    pub settled: u64,
    /// Events are sent in Kafka transactions.
    pub transactional: bool,
    /// Nothing sent is waiting for a commit: no acknowledged event, marker or tombstone in the
    /// open transaction, nothing in flight.
    pub all_committed: bool,
}

/// Whether a mark taken after `sent` deliveries and `commits` commits may be answered: every
/// delivery before it settled and, in a transaction, committed (a commit since the mark, or
/// nothing left to commit).
fn answerable(sent: u64, commits: u64, now: Deliveries, commits_now: u64) -> bool {
    now.settled >= sent && (!now.transactional || commits_now > commits || now.all_committed)
}

impl Demands {
    /// Whether snapshot items wait.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The open transaction committed: the markers and tombstones in it are visible.
    pub fn committed(&mut self) {
        self.uncommitted.clear();
        self.commits += 1;
    }

    /// Whether a mark waits for the open transaction, which holds markers or tombstones, or
    /// acknowledged events (`held`), to commit.
    pub fn waits_for_commit(&self, held: bool) -> bool {
        !self.marks.is_empty() && (held || !self.uncommitted.is_empty())
    }

    /// Whether nothing sent out of band (markers, tombstones) waits for a commit.
    pub fn none_uncommitted(&self) -> bool {
        self.uncommitted.is_empty()
    }

    /// Answers the marks, oldest first, whose deliveries before them have settled (`now`):
    /// with their tally, or why a marker or tombstones of their snapshot were not published.
    pub fn answer_marks(&mut self, now: Deliveries) {
        while let Some(mark) = self.marks.front() {
            if !answerable(mark.sent, mark.commits, now, self.commits) {
                return;
            }
            let Some(mark) = self.marks.pop_front() else {
                return;
            };
            let answered = match self.failed.remove(&mark.id) {
                Some(why) => Err(why),
                None => Ok(mark.tally),
            };
            // The walk may have stopped meanwhile: nothing waits for the answer then.
            let _ = mark.answer.send(answered);
        }
    }

    /// The open transaction was aborted: the markers and tombstones in it are lost, and each
    /// snapshot that sent one is told so at its next mark (its walk sends them again).
    pub fn aborted(&mut self) {
        for id in self.uncommitted.drain(..) {
            self.failed.entry(id).or_insert_with(|| {
                "the Kafka transaction holding its marker or tombstones was aborted".into()
            });
        }
    }

    /// What `id` sent out of band was acknowledged (`Ok`) or not (why), in a transaction or not.
    fn sent(&mut self, id: &Arc<str>, sent: std::result::Result<(), String>, transaction: bool) {
        match sent {
            Ok(()) if transaction => self.uncommitted.push(id.clone()),
            Ok(()) => {}
            Err(why) => {
                self.failed.insert(id.clone(), why);
            }
        }
    }
}

impl Pipeline {
    /// Queues a snapshot's item behind its earlier ones and moves the queue.
    pub(super) async fn demand(
        &mut self,
        demand: Demand,
        reservation: Reservation,
        st: &mut State,
    ) -> Result<()> {
        st.demands.queue.push_back((demand, reservation));
        self.advance_demands(st).await
    }

    /// Takes snapshot items from the front of the queue until one must wait for the stream.
    pub(super) async fn advance_demands(&mut self, st: &mut State) -> Result<()> {
        while let Some((front, _)) = st.demands.queue.front() {
            let hold = match front {
                Demand::Listed(_, object, _) => decision(object, st) == Decision::Hold,
                // The index is complete only once a (re)list is over.
                Demand::Prune(..) => st.classifier.listing(),
                _ => false,
            };
            if hold {
                return Ok(());
            }
            let Some((demand, reservation)) = st.demands.queue.pop_front() else {
                break;
            };
            match demand {
                Demand::Begin(scope) => {
                    info!(snapshot = %scope.id, request = %scope.request, expected = scope.expected, "snapshot begins");
                    let sent = self
                        .send_marker(&scope, marker::BEGIN, |info, watch, now| {
                            marker::begin(info, &scope, watch, now)
                        })
                        .await;
                    st.demands.sent(&scope.id, sent, self.transactional());
                }
                Demand::Prune(scope, keys) => {
                    let absent = absent(keys, st.classifier.index());
                    let pruned = self.prune(&scope, &absent).await;
                    if pruned.is_ok() {
                        let tally = st.demands.tallies.entry(scope.id.clone()).or_default();
                        tally.pruned += absent.len() as u64;
                    }
                    st.demands.sent(&scope.id, pruned, self.transactional());
                }
                Demand::Listed(scope, object, observed) => {
                    let decision = decision(&object, st);
                    let tally = st.demands.tallies.entry(scope.id.clone()).or_default();
                    if decision == Decision::Emit {
                        tally.emitted += 1;
                        let change = Change {
                            kind: ChangeKind::Added,
                            origin: Origin::Snapshot,
                            object: *object,
                            observed,
                        };
                        self.publish_as(change, Some(reservation), Some(scope.id.clone()), st)
                            .await?;
                    } else {
                        tally.skipped += 1;
                    }
                }
                Demand::Mark(id, answer) => {
                    let tally = st.demands.tallies.remove(&id).unwrap_or_default();
                    st.demands.marks.push_back(Mark {
                        sent: st.flight.pushed,
                        commits: st.demands.commits,
                        id,
                        tally,
                        answer,
                    });
                }
                Demand::End(scope, total, outcome) => {
                    info!(snapshot = %scope.id, sent = total.emitted, skipped = total.skipped, pruned = total.pruned, complete = outcome == Outcome::Complete, "snapshot ends");
                    st.demands.tallies.remove(&scope.id);
                    st.demands.failed.remove(&scope.id);
                    let sent = self
                        .send_marker(&scope, marker::END, |info, watch, now| {
                            marker::end(info, &scope, watch, total, &outcome, now)
                        })
                        .await;
                    st.demands.sent(&scope.id, sent, self.transactional());
                }
            }
        }
        Ok(())
    }

    /// Answers the snapshots' marks whose deliveries before them settled (and committed).
    pub(super) fn answer_marks(&self, st: &mut State) {
        if st.demands.marks.is_empty() {
            return;
        }
        let flight = &st.flight;
        let now = Deliveries {
            settled: flight.settled_count(),
            transactional: self.transactional(),
            all_committed: flight.queue.is_empty()
                && flight.held.is_empty()
                && st.demands.none_uncommitted(),
        };
        st.demands.answer_marks(now);
    }

    fn transactional(&self) -> bool {
        self.sink.transactions().is_some()
    }

    /// The one destination of the events of `scope` (a snapshot's markers and tombstones go
    /// there); why there is none, logged.
    fn snapshot_destination(&self, scope: &Scope) -> std::result::Result<String, String> {
        let namespace = scope.namespace.as_deref();
        demand::destination(
            &*self.sink,
            &self.info,
            namespace.or(self.watch.namespace.as_deref()),
        )
        .ok_or_else(|| {
            let why = demand::NO_DESTINATION;
            warn!(snapshot = %scope.id, "snapshot marker not published: {why}");
            why.to_string()
        })
    }

    /// Publishes a tombstone for each of `keys` to the destination of `scope`'s events; why it
    /// could not, logged.
    async fn prune(&self, scope: &Scope, keys: &[String]) -> std::result::Result<(), String> {
        if keys.is_empty() {
            return Ok(());
        }
        let destination = self.snapshot_destination(scope)?;
        let Some(compaction) = self.sink.compaction() else {
            return Err(format!("sink {} keeps no keys to prune", self.sink.name()));
        };
        info!(snapshot = %scope.id, destination = %destination, keys = keys.len(), "snapshot prunes keys the cluster no longer has");
        let sent = compaction.tombstones(&destination, keys).await;
        sent.map_err(|e| not_published(scope, &destination, "tombstones", &e))
    }

    /// Publishes the marker of type `kind` of `scope` to the destination of the watch's events,
    /// under its own id; why it could not, logged, is told to the walk at its next mark (the
    /// snapshot then fails).
    async fn send_marker(
        &self,
        scope: &Scope,
        kind: &str,
        build: impl FnOnce(&crate::encode::ResourceInfo, Watch<'_>, time::OffsetDateTime) -> Vec<u8>,
    ) -> std::result::Result<(), String> {
        let info = &self.info;
        let destination = self.snapshot_destination(scope)?;
        let watch = Watch {
            id: &self.watch.key.id,
            description: &self.watch.key.description,
        };
        let payload = build(info, watch, time::OffsetDateTime::now_utc());
        let sent = self
            .sink
            .send_in_stream(
                &destination,
                &marker::id(&scope.id, watch.id, kind),
                payload,
            )
            .await;
        sent.map_err(|e| not_published(scope, &destination, "marker", &e))
    }
}

/// Logs why `what` (a marker, tombstones) of `scope` was not published to `destination`, and
/// says it for the walk.
fn not_published(scope: &Scope, destination: &str, what: &str, e: &crate::sink::Error) -> String {
    // The broker client's own message says why.
    let cause = std::error::Error::source(e).map_or_else(|| e.to_string(), |c| c.to_string());
    warn!(snapshot = %scope.id, destination = %destination, error = %cause, "snapshot {what} not published");
    format!("the {what} to {destination} not published: {cause}")
}

/// The keys among `keys` (`namespace/name`, or `name` for a cluster-scoped object) that name no
/// object of `index`, in their order.
fn absent(keys: Vec<String>, index: &KnownObjects) -> Vec<String> {
    let mut unheld: HashMap<&str, HashSet<&str>> = HashMap::new();
    for key in &keys {
        let (namespace, name) = split(key);
        unheld.entry(namespace).or_default().insert(name);
    }
    for (namespace, name) in index.names() {
        if let Some(names) = unheld.get_mut(namespace.unwrap_or("")) {
            names.remove(name);
        }
    }
    let gone: Vec<bool> = keys
        .iter()
        .map(|key| {
            let (namespace, name) = split(key);
            unheld
                .get(namespace)
                .is_some_and(|names| names.contains(name))
        })
        .collect();
    drop(unheld);
    let kept = keys.into_iter().zip(gone);
    kept.filter_map(|(key, gone)| gone.then_some(key)).collect()
}

/// A key's namespace (empty for a cluster-scoped object's) and name.
fn split(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

/// The decision for a listed object now.
fn decision(object: &DynamicObject, st: &State) -> Decision {
    let listed = object
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or_default();
    let uid = object.metadata.uid.as_deref().unwrap_or_default();
    decide(
        listed,
        st.position.as_deref(),
        st.classifier.listing(),
        st.classifier.version_of(uid).as_deref(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(objects: &[(&str, Option<&str>, &str)]) -> KnownObjects {
        let mut index = KnownObjects::default();
        for (uid, namespace, name) in objects {
            index.observe(uid, "1", *namespace, name, 0);
        }
        index
    }

    fn now(settled: u64, transactional: bool, all_committed: bool) -> Deliveries {
        Deliveries {
            settled,
            transactional,
            all_committed,
        }
    }

    #[test]
    fn a_mark_waits_for_the_deliveries_sent_before_it_and_not_for_later_ones() {
        assert!(!answerable(5, 0, now(4, false, false), 0));
        assert!(answerable(5, 0, now(5, false, false), 0));
        assert!(
            answerable(5, 0, now(9, false, false), 0),
            "later ones settled too"
        );
    }

    #[test]
    fn in_a_transaction_a_mark_waits_for_a_commit_after_it_unless_nothing_is_left_to_commit() {
        assert!(
            !answerable(5, 2, now(5, true, false), 2),
            "acknowledged, not committed"
        );
        assert!(answerable(5, 2, now(5, true, false), 3), "committed since");
        assert!(
            answerable(5, 2, now(5, true, true), 2),
            "nothing sent waits for a commit"
        );
        assert!(!answerable(5, 2, now(4, true, true), 3), "still in flight");
    }

    #[tokio::test]
    async fn marks_are_answered_in_order_with_their_tally_or_the_failure_of_their_snapshot() {
        let mut demands = Demands::default();
        let mut answers = Vec::new();
        for (sent, id) in [(1, "a"), (3, "b"), (3, "c")] {
            let (tx, rx) = oneshot::channel();
            let tally = Tally {
                emitted: sent,
                ..Tally::default()
            };
            demands.marks.push_back(Mark {
                sent,
                commits: 0,
                id: id.into(),
                tally,
                answer: tx,
            });
            answers.push(rx);
        }
        demands.failed.insert("c".into(), "refused".into());
        demands.answer_marks(now(2, false, false));
        assert_eq!(
            demands.marks.len(),
            2,
            "b and c wait for the third delivery"
        );
        demands.answer_marks(now(3, false, false));
        assert!(demands.marks.is_empty());
        let mut answered = Vec::new();
        for rx in answers {
            answered.push(rx.await.expect("answered"));
        }
        assert_eq!(answered[0].as_ref().map(|t| t.emitted), Ok(1));
        assert_eq!(answered[1].as_ref().map(|t| t.emitted), Ok(3));
        assert_eq!(answered[2], Err("refused".to_string()));
    }

    #[test]
    fn only_keys_naming_no_object_of_the_index_are_pruned_in_their_order() {
        let index = index(&[
            ("u1", Some("shop"), "a"),
            ("u2", Some("shop"), "c"),
            ("u3", None, "node-1"),
        ]);
        let keys = [
            "shop/z", "shop/a", "shop/b", "node-1", "node-2", "other/a", "shop/c",
        ];
        let keys = keys.iter().map(|k| k.to_string()).collect();
        assert_eq!(
            absent(keys, &index),
            ["shop/z", "shop/b", "node-2", "other/a"],
            "a name held in another namespace, or cluster-scoped, is not the key's object"
        );
        assert!(absent(Vec::new(), &index).is_empty());
    }
}
