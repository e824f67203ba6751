//! A snapshot on demand inside the pipeline: its items wait in a queue of their own, in order,
//! and each listed object is decided against the stream's position and the index
//! ([`crate::demand::watermark`]) as soon as it can be. Live items never wait for them: a held
//! object only stops the snapshot's queue, and the queue moves again after every item that
//! moves the position.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use kube::api::DynamicObject;
use tracing::{info, warn};

use super::{Pipeline, Result, State};
use crate::budget::Reservation;
use crate::change::{Change, ChangeKind, Origin};
use crate::demand::marker::{self, Watch};
use crate::demand::watermark::{Decision, decide};
use crate::demand::{Demand, Outcome, Scope, Tally};
use crate::template::Values;

/// The queue of a watch's snapshot items and what was done with them.
#[derive(Debug, Default)]
pub(super) struct Demands {
    queue: VecDeque<(Demand, Reservation)>,
    /// Per snapshot: what was emitted and skipped since its last mark.
    tallies: HashMap<Arc<str>, Tally>,
    /// Per snapshot: why a marker could not be published, told at its next mark.
    failed: HashMap<Arc<str>, String>,
}

impl Demands {
    /// Whether snapshot items wait.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
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
            if let Demand::Listed(_, object, _) = front
                && decision(object, st) == Decision::Hold
            {
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
                    if let Err(why) = sent {
                        st.demands.failed.insert(scope.id.clone(), why);
                    }
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
                    self.acknowledge_all(st).await?;
                    let tally = st.demands.tallies.remove(&id).unwrap_or_default();
                    let answered = match st.demands.failed.remove(&id) {
                        Some(why) => Err(why),
                        None => Ok(tally),
                    };
                    // The walk may have stopped meanwhile: nothing waits for the answer then.
                    let _ = answer.send(answered);
                }
                Demand::End(scope, total, outcome) => {
                    info!(snapshot = %scope.id, sent = total.emitted, skipped = total.skipped, complete = outcome == Outcome::Complete, "snapshot ends");
                    st.demands.tallies.remove(&scope.id);
                    st.demands.failed.remove(&scope.id);
                    // Nothing follows an end marker that failed: its absence tells consumers.
                    let _ = self
                        .send_marker(&scope, marker::END, |info, watch, now| {
                            marker::end(info, &scope, watch, total, &outcome, now)
                        })
                        .await;
                    self.acknowledge_all(st).await?;
                }
            }
        }
        Ok(())
    }

    /// Waits until everything sent is acknowledged, and in a Kafka transaction committed.
    async fn acknowledge_all(&mut self, st: &mut State) -> Result<()> {
        while self.settle_next(st).await? {}
        if self.sink.transactions().is_some() {
            self.commit_events(st).await?;
        }
        Ok(())
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
        let values = Values {
            cluster: &info.cluster,
            group: &info.group,
            version: &info.version,
            resource: &info.resource,
            namespace: scope
                .namespace
                .as_deref()
                .or(self.watch.namespace.as_deref()),
            name: "",
        };
        let Some(destination) = self.sink.watch_destination(info, &values) else {
            let why = "the destination of this watch's events names the object ({name}, or {namespace} without a namespace): a snapshot's markers have no single destination";
            warn!(snapshot = %scope.id, "snapshot marker not published: {why}");
            return Err(why.to_string());
        };
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
        sent.map_err(|e| {
            // The broker client's own message says why.
            let cause =
                std::error::Error::source(&e).map_or_else(|| e.to_string(), |c| c.to_string());
            warn!(snapshot = %scope.id, destination = %destination, error = %cause, "snapshot marker not published");
            format!("the marker to {destination} was not published: {cause}")
        })
    }
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
