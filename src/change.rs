//! A change to one Kubernetes object, as the watch saw it: what happened, why it was emitted,
//! and the object itself (moved through the pipeline, never cloned).

use std::time::SystemTime;

use kube::api::DynamicObject;

/// What happened to the object.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum ChangeKind {
    /// The object appeared (or existed when the bridge first listed it).
    Added,
    /// The object changed.
    Modified,
    /// The object was deleted.
    Deleted,
}

impl ChangeKind {
    /// The lowercase name used in event types and ids.
    pub const fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "added",
            ChangeKind::Modified => "modified",
            ChangeKind::Deleted => "deleted",
        }
    }
}

/// Why the bridge emitted the change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    /// Seen on a live watch.
    Live,
    /// Part of the initial snapshot: the object existed when the bridge first listed the resource.
    Snapshot,
    /// Found by a relist after the watch history was lost (410 Gone): intermediate versions may be
    /// missing, and a repaired delete carries the last known reference only.
    Repaired,
}

impl Origin {
    /// The value of the `origin` extension.
    pub const fn as_str(self) -> &'static str {
        match self {
            Origin::Live => "live",
            Origin::Snapshot => "snapshot",
            Origin::Repaired => "repaired",
        }
    }
}

/// One change to one object.
#[derive(Debug)]
pub struct Change {
    /// What happened.
    pub kind: ChangeKind,
    /// Why it was emitted.
    pub origin: Origin,
    /// The object (for deletes, its last state as the API server sent it).
    pub object: DynamicObject,
    /// When the bridge received it.
    pub observed: SystemTime,
}
