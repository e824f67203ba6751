//! A snapshot on demand as a watch's pipeline sees it: the items a snapshot's walk
//! ([`crate::snapshot`]) sends to the watch's pipeline on a queue beside the watch's own, the decision each
//! listed object gets against the stream's position ([`watermark`]), and the control events that
//! frame the snapshot ([`marker`]).
//!
//! The walk reads the resource in chunks while the watch goes on publishing. Each listed object
//! is decided against the pipeline's position and its known-object index: *held* while the
//! watch has not yet delivered the change the object was listed at (publishing it first would
//! let an older live event overtake it), *skipped* when a newer state or a delete of it was
//! published since, and otherwise *emitted*. Per key the stream never goes backwards, and live
//! events never wait for the snapshot.

use std::sync::Arc;
use std::time::SystemTime;

use kube::api::DynamicObject;
use tokio::sync::oneshot;

pub mod marker;
pub mod watermark;

/// What one snapshot covers, as its begin marker states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// The snapshot's id: the request's uid.
    pub id: Arc<str>,
    /// The request, `namespace/name` of its ConfigMap.
    pub request: String,
    /// `apiVersion/plural`, as configured (`v1/configmaps`).
    pub resource: String,
    /// The namespace the snapshot is limited to, if any.
    pub namespace: Option<String>,
    /// The label selector the snapshot is limited to, if any (beside the watch's own).
    pub label_selector: Option<String>,
    /// Objects the API server reported when the snapshot began; `None` when it could not say
    /// (it gives no count for a list narrowed by a label selector).
    pub expected: Option<u64>,
    /// Whether keys of the compacted destination that the cluster no longer has get tombstones.
    pub prune: bool,
}

/// What the pipeline did with a snapshot's objects since the last [`Demand::Mark`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Published with `origin=snapshot`.
    pub emitted: u64,
    /// Not published: a newer state, or the object's delete, was published since it was read.
    pub skipped: u64,
    /// Keys a compacted destination still held for objects the cluster no longer has: a
    /// tombstone was published for each (`prune`).
    pub pruned: u64,
}

impl Tally {
    /// Both counts added.
    pub fn add(&mut self, other: Tally) {
        self.emitted += other.emitted;
        self.skipped += other.skipped;
        self.pruned += other.pruned;
    }
}

/// How a snapshot ended, as its end marker states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every object was read and decided.
    Complete,
    /// The snapshot stopped; the objects published so far are not a complete state.
    Failed(String),
}

/// One item of a snapshot's walk, queued beside the watch's items and taken when none waits.
#[derive(Debug)]
pub enum Demand {
    /// The snapshot begins: the begin marker is published.
    Begin(Arc<Scope>),
    /// One object read by the walk, and when.
    Listed(Arc<Scope>, Box<DynamicObject>, SystemTime),
    /// Keys the compacted destination held for the scope when the walk read it: a tombstone is
    /// published for each that the watch's index does not hold once everything before was
    /// decided (`prune`).
    Prune(Arc<Scope>, Vec<String>),
    /// Answered with the tally since the last mark once everything before it was decided and
    /// acknowledged by the broker (committed, in a Kafka transaction): the walk saves its
    /// progress and reads the next chunk only then. A marker that could not be published is
    /// the answer's error.
    Mark(Arc<str>, oneshot::Sender<Result<Tally, String>>),
    /// The snapshot ends: the end marker is published with the total.
    End(Arc<Scope>, Tally, Outcome),
}

/// Why a snapshot's markers and tombstones have no destination.
pub const NO_DESTINATION: &str = "the destination of this watch's events names the object ({name}, or {namespace} without a namespace): a snapshot's markers have no single destination";

/// The one destination of the events of `info`'s objects in `namespace` (all when `None`):
/// `None` when it names the object.
pub fn destination(
    sink: &crate::sink::AnySink,
    info: &crate::encode::ResourceInfo,
    namespace: Option<&str>,
) -> Option<String> {
    let values = crate::template::Values {
        cluster: &info.cluster,
        group: &info.group,
        version: &info.version,
        resource: &info.resource,
        namespace,
        name: "",
    };
    sink.watch_destination(info, &values)
}
