//! What the campaign records: the writes the workload made (as the API server answered them), the
//! events consumers received, and the live state at the end. The checker reads nothing else.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

/// A watch as consumers tell it apart: the resource (plural) and the namespace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct WatchKey {
    /// The resource's plural name.
    pub resource: String,
    /// The namespace.
    pub namespace: String,
}

impl std::fmt::Display for WatchKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.resource, self.namespace)
    }
}

/// What a write did to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Op {
    /// Created it.
    Create,
    /// Changed it (data or labels).
    Update,
    /// Deleted it.
    Delete,
}

/// One write the API server acknowledged.
#[derive(Debug, Clone, Serialize)]
pub struct Write {
    /// When it was sent, milliseconds since the round started.
    pub at_ms: u64,
    /// The watch whose scope holds the object.
    pub watch: WatchKey,
    /// The object's name.
    pub name: String,
    /// The object's uid.
    pub uid: String,
    /// The resourceVersion the API server returned (for a delete: the deletion's, or 0 when the
    /// API server answered with a Status, which does not carry it).
    pub rv: u64,
    /// What the write did.
    pub op: Op,
    /// Whether the watch selects the object before the write (always for watches without a
    /// label selector, false for a create).
    pub was_visible: bool,
    /// Whether the watch selects it after the write (false for a delete).
    pub visible: bool,
}

impl Write {
    /// The event this write promises a consumer of the watch: `Some(true)` a delete (the object
    /// was deleted or left the selector), `Some(false)` an add or update, `None` nothing.
    pub fn promise(&self) -> Option<bool> {
        match (self.was_visible, self.visible) {
            (_, true) => Some(false),
            (true, false) => Some(true),
            (false, false) => None,
        }
    }
}

/// The change an event describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Change {
    /// `added`
    Added,
    /// `modified`
    Modified,
    /// `deleted`
    Deleted,
}

/// One event as a consumer received it.
#[derive(Debug, Clone, Serialize)]
pub struct Seen {
    /// Milliseconds since the round started.
    pub at_ms: u64,
    /// The event id.
    pub id: String,
    /// The watch it belongs to.
    pub watch: WatchKey,
    /// The object's name.
    pub name: String,
    /// `uid`.
    pub uid: String,
    /// `resourceversion`.
    pub rv: u64,
    /// The change.
    pub change: Change,
    /// Whether `origin` is `repaired`.
    pub repaired: bool,
    /// `snapshotid` of an event with `origin: snapshot` (a snapshot on demand's object).
    pub snapshot: Option<String>,
}

/// A snapshot marker as a consumer received it.
#[derive(Debug, Clone, Serialize)]
pub struct MarkerSeen {
    /// Milliseconds since the round started.
    pub at_ms: u64,
    /// Events received before it (its place in [`Evidence::seen`]).
    pub after: usize,
    /// The marker's id (`{snapshotid}:{watch id}:begin|end`).
    pub id: String,
    /// `snapshotid`.
    pub snapshot: String,
    /// `None` for a begin marker; for an end marker, `Ok(())` when its result is `complete`,
    /// else the failure's message.
    pub end: Option<Result<(), String>>,
    /// `sent` of an end marker (0 for a begin marker).
    pub sent: u64,
    /// `skipped` of an end marker (0 for a begin marker).
    pub skipped: u64,
}

/// A snapshot on demand the campaign asked a deployment for, and how its request ended.
#[derive(Debug, Clone, Serialize)]
pub struct Requested {
    /// The request's name.
    pub name: String,
    /// Its uid: the snapshot's id.
    pub uid: String,
    /// The watch it covers.
    pub watch: WatchKey,
    /// When it was sent, milliseconds since the round started.
    pub at_ms: u64,
    /// How many of the ledger's writes were acknowledged before it was sent.
    pub writes_before: usize,
    /// `kube-event-bridge.dev/snapshot-phase` once the round was quiet (empty: none).
    pub phase: String,
    /// `message` of `kube-event-bridge.dev/snapshot-status`.
    pub message: Option<String>,
}

/// One record of a compacted Kafka topic, in offset order per key.
#[derive(Debug, Clone, Serialize)]
pub struct KeyedRecord {
    /// The record key (`namespace/name`).
    pub key: String,
    /// `(uid, resourceVersion)` of the event, `None` for a tombstone.
    pub value: Option<(String, u64)>,
}

/// Everything one deployment's check needs.
#[derive(Debug, Default)]
pub struct Evidence {
    /// The workload's acknowledged writes, in the order they were acknowledged.
    pub writes: Vec<Write>,
    /// Objects whose writes had an unknown outcome (a timeout, a dropped connection): their
    /// versions may appear without a matching write. By watch and name.
    pub uncertain: BTreeSet<(WatchKey, String)>,
    /// Events in arrival order.
    pub seen: Vec<Seen>,
    /// The live objects of every watch at quiescence: uid to resourceVersion.
    pub live: BTreeMap<WatchKey, BTreeMap<String, u64>>,
    /// What the consumer crate's store held at quiescence, by watch: uid to resourceVersion.
    pub store: BTreeMap<WatchKey, BTreeMap<String, u64>>,
    /// The compacted topic replayed from its start, if the deployment has one, and the live
    /// objects it must equal (key `namespace/name` to (uid, resourceVersion)).
    pub compacted: Option<(Vec<KeyedRecord>, ByName)>,
    /// Snapshot markers in arrival order.
    pub markers: Vec<MarkerSeen>,
    /// The snapshots requested of the deployment.
    pub requested: Vec<Requested>,
    /// Whether [`Evidence::seen`] is in publishing order per watch (NATS, HTTP): markers can
    /// then be placed among the events; not with several Kafka partitions.
    pub ordered: bool,
}

/// Objects by `namespace/name`: (uid, resourceVersion).
pub type ByName = BTreeMap<String, (String, u64)>;
