//! The store of current objects: a cheap-to-clone reader ([`Store`]) and the [`Writer`] that
//! applies the event contract (docs/consumers.md) to every record read. Objects are kept per
//! cluster (the `cluster` attribute): one store can follow a whole fleet, and
//! [`Store::cluster`] views one cluster's objects.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde_json::Value;
use tokio::sync::watch;

use crate::event::{ChangeType, Event, Origin, Payload, Record};

mod snapshot;

/// How much earlier than a begin marker's Kafka timestamp an event may be stamped and still
/// count as published after it ([`Writer::apply_at`]): room for the clocks of the bridge
/// replicas that published them. Keeping an object is the safe side.
pub const CLOCK_MARGIN_MS: i64 = 5_000;

/// How many deleted (or replaced) uids the writer remembers by default, so that a late or
/// repeated event of a deleted object cannot bring it back.
pub const DEFAULT_FORGOTTEN_CAPACITY: usize = 100_000;

/// Identifies an object by cluster, resource, namespace and name (`kubectl` style resource:
/// `configmaps`, `deployments.apps`). The cluster is the event's `cluster` attribute: the
/// bridge's `cluster`, or in a fleet the member's name, so that the objects of two clusters with
/// the same namespace and name are two objects.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// The cluster (the `cluster` attribute).
    pub cluster: String,
    /// The plural resource, with its group after a dot unless it is the core group.
    pub resource: String,
    /// The namespace; `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    /// The name.
    pub name: String,
}

impl ObjectKey {
    /// A namespaced object, e.g. `ObjectKey::namespaced("prod", "deployments.apps", "shop", "web")`.
    pub fn namespaced(cluster: &str, resource: &str, namespace: &str, name: &str) -> Self {
        ObjectKey {
            cluster: cluster.into(),
            resource: resource.into(),
            namespace: Some(namespace.into()),
            name: name.into(),
        }
    }

    /// A cluster-scoped object, e.g. `ObjectKey::cluster_scoped("prod", "nodes", "node-7")`.
    pub fn cluster_scoped(cluster: &str, resource: &str, name: &str) -> Self {
        ObjectKey {
            cluster: cluster.into(),
            resource: resource.into(),
            namespace: None,
            name: name.into(),
        }
    }

    fn of(event: &Event) -> Self {
        ObjectKey {
            cluster: event.cluster.clone(),
            resource: resource_key(&event.api_version, &event.resource),
            namespace: event.namespace.clone(),
            name: event.name.clone(),
        }
    }
}

/// `configmaps`, `deployments.apps`: the resource as [`ObjectKey`] names it.
fn resource_key(api_version: &str, resource: &str) -> String {
    match api_version.split_once('/') {
        Some((group, _)) => format!("{resource}.{group}"),
        None => resource.to_string(),
    }
}

impl fmt::Display for ObjectKey {
    /// `configmaps shop/web in prod`, `nodes node-7 in prod`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(
                f,
                "{} {ns}/{} in {}",
                self.resource, self.name, self.cluster
            ),
            None => write!(f, "{} {} in {}", self.resource, self.name, self.cluster),
        }
    }
}

/// An object's identity in the store: its cluster and uid. Uids are unique within a cluster;
/// clusters restored from one etcd backup share them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Id {
    cluster: String,
    uid: String,
}

impl Id {
    fn of_event(event: &Event) -> Self {
        Id {
            cluster: event.cluster.clone(),
            uid: event.uid.clone(),
        }
    }

    fn of(object: &Object) -> Self {
        Id {
            cluster: object.key.cluster.clone(),
            uid: object.uid.clone(),
        }
    }
}

/// Why the store does not hold an object's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingBody {
    /// The event exceeded the broker's size limit and was published as a reference
    /// (`truncated: true`).
    Truncated,
    /// The resource publishes `payload: reference`.
    Reference,
    /// A `payload: diff` event without `object` whose patch could not be applied to the version
    /// the store held.
    Diff,
}

/// What the store knows of an object's content.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// The whole object at [`Object::resource_version`], as the bridge published it.
    Full(Value),
    /// The object changed to [`Object::resource_version`], but the event did not carry it: read
    /// it from the API server if you need it. `last_full` is the last whole version seen.
    Missing {
        /// Why.
        reason: MissingBody,
        /// The last whole version the store saw, if any (older than `resource_version`).
        last_full: Option<Value>,
    },
}

impl Body {
    /// The current object, if the store has it.
    pub fn full(&self) -> Option<&Value> {
        match self {
            Body::Full(v) => Some(v),
            Body::Missing { .. } => None,
        }
    }

    fn last_full(&self) -> Option<&Value> {
        match self {
            Body::Full(v) => Some(v),
            Body::Missing { last_full, .. } => last_full.as_ref(),
        }
    }
}

/// One object in the store: its identity and version from the last applied event, and its body.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    /// Cluster, resource, namespace and name.
    pub key: ObjectKey,
    /// `metadata.uid`.
    pub uid: String,
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// `metadata.resourceVersion` of the last applied event.
    pub resource_version: String,
    /// The `sequence` of the last applied event.
    pub sequence: String,
    /// The `origin` of the last applied event.
    pub origin: Origin,
    /// The `id` of the last applied event.
    pub event_id: String,
    /// The topic or subject the last event came from.
    pub destination: String,
    /// The object itself, or why the store does not have it.
    pub body: Body,
    partition_key: String,
}

/// A change of the store, as the stream of changes reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// An object was added or updated.
    Applied {
        /// The object now in the store.
        object: Arc<Object>,
        /// What it replaced under its name: the older version of the same uid, or, for an
        /// object recreated under the same name (a new uid) whose predecessor's delete has not
        /// arrived (it may be in another partition, or compacted away), the predecessor.
        /// `None` for a new name.
        previous: Option<Arc<Object>>,
    },
    /// An object left the store. `object` is its last state.
    Deleted {
        /// The object's last state (from the delete event when it carried the object).
        object: Arc<Object>,
        /// What removed it.
        cause: DeleteCause,
    },
    /// Every topic partition or stream reached, at least, the position it had when reading
    /// started: the store now reflects the state published until then.
    CaughtUp,
    /// A snapshot on demand completed (its end marker said `complete` and its begin marker was
    /// read): the store holds the complete state of its scope as of the end marker. Objects
    /// of the scope that got no event since the begin marker were removed first, each reported
    /// as [`Change::Deleted`] with [`DeleteCause::Snapshot`] (none with a label selector:
    /// docs/consumers.md, "Snapshots on demand").
    SnapshotComplete {
        /// The snapshot's id (its request's uid).
        id: String,
        /// Its cluster.
        cluster: String,
        /// Its resource, as [`ObjectKey::resource`] names it.
        resource: String,
        /// The namespace it was limited to, if any.
        namespace: Option<String>,
        /// How many stale objects it removed.
        pruned: usize,
    },
}

/// What removed an object from the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteCause {
    /// A `deleted` event, with its origin.
    Event(Origin),
    /// A Kafka tombstone for its key.
    Tombstone,
    /// A completed snapshot on demand: the object was in its scope, yet neither came with it
    /// nor changed since its begin marker, so the cluster no longer has it (its delete was
    /// lost: compacted away, beyond retention, or never read).
    Snapshot,
}

/// What applying one record did.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The store changed.
    Changed(Change),
    /// The store already held this event (same id), or the uid was deleted and this is its
    /// delete again.
    Duplicate,
    /// Older than what the store holds for that uid (`sequence` not newer), or an event of a
    /// deleted or replaced uid: dropped.
    Stale,
    /// A delete or tombstone of an object the store never held: nothing to do (the uid is
    /// remembered as deleted).
    Unknown,
    /// A snapshot marker, with what the snapshot's completion changed: the objects it removed,
    /// then [`Change::SnapshotComplete`]. Empty for a begin marker, a failed snapshot, and an
    /// end marker whose begin marker was not read.
    Marker(Vec<Change>),
}

#[derive(Debug, Default)]
struct State {
    by_uid: HashMap<Id, Arc<Object>>,
    /// Key → uid (the key holds the cluster).
    by_key: HashMap<ObjectKey, String>,
    /// (topic, record key) → the object a tombstone there removes.
    by_partition_key: HashMap<(String, String), Id>,
    forgotten: Forgotten,
    /// Per object, the position of the last event that applied to it, or of a snapshot event
    /// that found it up to date: what tells a snapshot's completion it is not stale.
    stamps: HashMap<Id, i64>,
    /// The position of the last record applied with [`Writer::apply`] (reading order).
    read: i64,
    /// The snapshots whose begin marker was read and whose end marker was not.
    open: HashMap<String, snapshot::Open>,
}

/// Uids deleted or replaced, each of its cluster, with the newest `sequence` the store had seen
/// of each when it forgot it, oldest evicted first beyond the capacity. A uid's events up to
/// that sequence are late duplicates; a newer one is the object coming back into a label
/// selector it had left (the API server sends `deleted` when an object stops matching, `added`
/// when it matches again, with the same uid).
#[derive(Debug, Default)]
struct Forgotten {
    set: HashMap<Id, String>,
    order: VecDeque<Id>,
    capacity: usize,
}

impl Forgotten {
    fn insert(&mut self, id: Id, sequence: &str) {
        if self.capacity == 0 {
            return;
        }
        if let Some(known) = self.set.get_mut(&id) {
            if known.as_str() < sequence {
                *known = sequence.to_string();
            }
            return;
        }
        self.set.insert(id.clone(), sequence.to_string());
        self.order.push_back(id);
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }
}

/// A read handle on the store: cheap to clone, shared with the [`Writer`].
#[derive(Debug, Clone)]
pub struct Store {
    state: Arc<RwLock<State>>,
    ready: watch::Receiver<bool>,
}

impl Store {
    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The object with this cluster, resource, namespace and name.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<Object>> {
        let state = self.read();
        let uid = state.by_key.get(key)?;
        state
            .by_uid
            .get(&Id {
                cluster: key.cluster.clone(),
                uid: uid.clone(),
            })
            .cloned()
    }

    /// The object with this uid in `cluster`.
    pub fn get_by_uid(&self, cluster: &str, uid: &str) -> Option<Arc<Object>> {
        self.read()
            .by_uid
            .get(&Id {
                cluster: cluster.into(),
                uid: uid.into(),
            })
            .cloned()
    }

    /// Every object of every cluster, in no particular order.
    pub fn list(&self) -> Vec<Arc<Object>> {
        self.read().by_uid.values().cloned().collect()
    }

    /// How many objects the store holds, of every cluster.
    pub fn len(&self) -> usize {
        self.read().by_uid.len()
    }

    /// The clusters the store holds objects of, sorted.
    pub fn clusters(&self) -> Vec<String> {
        let state = self.read();
        let mut clusters: Vec<String> = state.by_uid.keys().map(|id| id.cluster.clone()).collect();
        clusters.sort();
        clusters.dedup();
        clusters
    }

    /// The objects of one cluster: a cheap view sharing this store.
    ///
    /// ```no_run
    /// # fn example(store: kube_event_bridge_consumer::Store) {
    /// let east = store.cluster("east");
    /// let web = east.get("configmaps", Some("shop"), "web");
    /// println!("{} objects in east", east.len());
    /// # }
    /// ```
    pub fn cluster(&self, name: &str) -> ClusterView {
        ClusterView {
            store: self.clone(),
            cluster: name.to_string(),
        }
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether reading has caught up with what was published when it started.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until reading has caught up with what was published when it started (see
    /// [`Change::CaughtUp`]). Returns at once if it already has; waits forever if the stream
    /// of changes is dropped before.
    pub async fn wait_until_ready(&self) {
        let mut ready = self.ready.clone();
        if ready.wait_for(|r| *r).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The objects of one cluster of a [`Store`] ([`Store::cluster`]). Listing and counting walk
/// the whole store.
#[derive(Debug, Clone)]
pub struct ClusterView {
    store: Store,
    cluster: String,
}

impl ClusterView {
    /// The cluster's name.
    pub fn name(&self) -> &str {
        &self.cluster
    }

    /// The object with this resource (`configmaps`, `deployments.apps`), namespace (`None` for
    /// cluster-scoped objects) and name.
    pub fn get(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Arc<Object>> {
        self.store.get(&ObjectKey {
            cluster: self.cluster.clone(),
            resource: resource.into(),
            namespace: namespace.map(Into::into),
            name: name.into(),
        })
    }

    /// The object with this uid.
    pub fn get_by_uid(&self, uid: &str) -> Option<Arc<Object>> {
        self.store.get_by_uid(&self.cluster, uid)
    }

    /// The cluster's objects, in no particular order.
    pub fn list(&self) -> Vec<Arc<Object>> {
        let state = self.store.read();
        state
            .by_uid
            .iter()
            .filter(|(id, _)| id.cluster == self.cluster)
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// How many objects of the cluster the store holds.
    pub fn len(&self) -> usize {
        let state = self.store.read();
        state
            .by_uid
            .keys()
            .filter(|id| id.cluster == self.cluster)
            .count()
    }

    /// Whether the store holds no object of the cluster.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Applies records to the store. Created with [`Writer::new`]; hand it to a subscription
/// (`kafka::Subscription::reflect`, `nats::Subscription::reflect`) or call [`Writer::apply`].
#[derive(Debug)]
pub struct Writer {
    state: Arc<RwLock<State>>,
    ready: watch::Sender<bool>,
    store: Store,
}

impl Default for Writer {
    fn default() -> Self {
        Writer::new()
    }
}

impl Writer {
    /// An empty store and its writer, remembering [`DEFAULT_FORGOTTEN_CAPACITY`] deleted uids.
    pub fn new() -> Self {
        Writer::with_forgotten_capacity(DEFAULT_FORGOTTEN_CAPACITY)
    }

    /// An empty store remembering up to `capacity` deleted or replaced uids (oldest forgotten
    /// first). A forgotten uid's late events could bring the object back; deletes arrive
    /// after every other event of their uid, so this only matters for duplicates older than
    /// `capacity` deletions.
    pub fn with_forgotten_capacity(capacity: usize) -> Self {
        let state = Arc::new(RwLock::new(State {
            forgotten: Forgotten {
                capacity,
                ..Forgotten::default()
            },
            ..State::default()
        }));
        let (ready, receiver) = watch::channel(false);
        Writer {
            store: Store {
                state: state.clone(),
                ready: receiver,
            },
            state,
            ready,
        }
    }

    /// A reader of this writer's store.
    pub fn store(&self) -> Store {
        self.store.clone()
    }

    /// Marks the store as caught up ([`Store::wait_until_ready`] returns).
    pub fn caught_up(&self) {
        self.ready.send_replace(true);
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies one record following the event contract. Records are taken to be published in
    /// the order they are applied (one JetStream stream, one partition): a snapshot's
    /// begin marker separates what was published before it from what was published after.
    pub fn apply(&mut self, record: Record) -> Outcome {
        let mut state = self.write();
        state.read += 1;
        let at = state.read;
        state.apply(record, at, 0)
    }

    /// Applies one record published at `timestamp_ms` (a Kafka record's timestamp): for
    /// records read from several partitions, whose reading order is not their publishing
    /// order. An object event stamped at most [`CLOCK_MARGIN_MS`] before a begin marker counts
    /// as published after it. Do not mix with [`Writer::apply`] in one store.
    pub fn apply_at(&mut self, record: Record, timestamp_ms: i64) -> Outcome {
        self.write().apply(record, timestamp_ms, CLOCK_MARGIN_MS)
    }
}

impl State {
    /// Applies `record`, published at position `at`; `margin`: see [`CLOCK_MARGIN_MS`].
    fn apply(&mut self, record: Record, at: i64, margin: i64) -> Outcome {
        match record {
            Record::Event { destination, event } => self.apply_event(destination, *event, at),
            Record::Marker {
                destination,
                marker,
            } => self.apply_marker(destination, *marker, at - margin),
            Record::Tombstone { destination, key } => self.apply_tombstone(destination, key),
        }
    }

    fn apply_event(&mut self, destination: String, event: Event, at: i64) -> Outcome {
        let id = Id::of_event(&event);
        if let Some(sequence) = self.forgotten.set.get(&id) {
            match event.change {
                ChangeType::Deleted => return Outcome::Duplicate,
                _ if event.sequence <= *sequence => return Outcome::Stale,
                // Back in the selector it had left: known again.
                _ => {
                    self.forgotten.set.remove(&id);
                    self.forgotten.order.retain(|u| *u != id);
                }
            }
        }
        let current = self.by_uid.get(&id).cloned();
        match (event.change, current) {
            (ChangeType::Deleted, Some(current)) => {
                // Never dropped for its sequence: a repaired delete repeats the last one.
                // A repaired delete's data is a reference (name, uid, last resourceVersion):
                // the object's last state is the one the store holds.
                let origin = event.origin;
                let body = match body_of(&event, Some(&current)) {
                    Body::Full(v) if origin != Origin::Repaired => Body::Full(v),
                    _ => current.body.clone(),
                };
                let last = Object {
                    body,
                    ..object_of(destination, event, Body::Full(Value::Null))
                };
                self.remove(&current);
                self.forgotten.insert(Id::of(&last), &last.sequence);
                Outcome::Changed(Change::Deleted {
                    object: Arc::new(last),
                    cause: DeleteCause::Event(origin),
                })
            }
            (ChangeType::Deleted, None) => {
                self.forgotten.insert(id, &event.sequence);
                Outcome::Unknown
            }
            (_, Some(current)) if event.sequence <= current.sequence => {
                if event.snapshot_id.is_some() {
                    // A snapshot found the object as the store has it: not stale.
                    self.stamps.insert(Id::of(&current), at);
                }
                if event.id == current.event_id {
                    Outcome::Duplicate
                } else {
                    Outcome::Stale
                }
            }
            (_, current) => self.upsert(destination, event, current, at),
        }
    }

    /// Adds or updates the object of an added or modified event newer than the store's.
    fn upsert(
        &mut self,
        destination: String,
        event: Event,
        previous: Option<Arc<Object>>,
        at: i64,
    ) -> Outcome {
        let key = ObjectKey::of(&event);
        let holder = self
            .by_key
            .get(&key)
            .filter(|uid| **uid != event.uid)
            .and_then(|uid| {
                self.by_uid.get(&Id {
                    cluster: key.cluster.clone(),
                    uid: uid.clone(),
                })
            })
            .cloned();
        if let Some(holder) = &holder
            && holder.sequence > event.sequence
        {
            // An older incarnation of a name a newer uid already holds.
            self.forgotten.insert(Id::of_event(&event), &event.sequence);
            return Outcome::Stale;
        }
        let body = body_of(&event, previous.as_deref());
        let object = Arc::new(object_of(destination, event, body));
        let previous = match holder {
            Some(holder) => {
                self.remove(&holder);
                Some(holder)
            }
            None => previous,
        };
        self.by_key.insert(object.key.clone(), object.uid.clone());
        self.by_partition_key.insert(
            (object.destination.clone(), object.partition_key.clone()),
            Id::of(&object),
        );
        self.by_uid.insert(Id::of(&object), object.clone());
        self.stamps.insert(Id::of(&object), at);
        Outcome::Changed(Change::Applied { object, previous })
    }

    fn apply_tombstone(&mut self, destination: String, key: String) -> Outcome {
        let Some(id) = self
            .by_partition_key
            .get(&(destination, key.clone()))
            .cloned()
        else {
            return Outcome::Unknown;
        };
        let Some(current) = self.by_uid.get(&id).cloned() else {
            return Outcome::Unknown;
        };
        self.remove(&current);
        Outcome::Changed(Change::Deleted {
            object: current,
            cause: DeleteCause::Tombstone,
        })
    }

    fn remove(&mut self, object: &Object) {
        let id = Id::of(object);
        self.by_uid.remove(&id);
        self.stamps.remove(&id);
        if self.by_key.get(&object.key) == Some(&object.uid) {
            self.by_key.remove(&object.key);
        }
        let pk = (object.destination.clone(), object.partition_key.clone());
        if self.by_partition_key.get(&pk) == Some(&id) {
            self.by_partition_key.remove(&pk);
        }
        self.forgotten.insert(id, &object.sequence);
    }
}

/// The object an event describes, holding `body`.
fn object_of(destination: String, event: Event, body: Body) -> Object {
    Object {
        key: ObjectKey::of(&event),
        uid: event.uid,
        api_version: event.api_version,
        kind: event.kind,
        resource_version: event.resource_version,
        sequence: event.sequence,
        origin: event.origin,
        event_id: event.id,
        destination,
        body,
        partition_key: event.partition_key,
    }
}

/// The body an event gives the object, given the version the store held.
fn body_of(event: &Event, previous: Option<&Object>) -> Body {
    let last_full = || previous.and_then(|p| p.body.last_full()).cloned();
    let missing = |reason| Body::Missing {
        reason,
        last_full: last_full(),
    };
    if event.truncated {
        return missing(MissingBody::Truncated);
    }
    match event.payload {
        Payload::Full => Body::Full(event.data.clone()),
        Payload::Reference => missing(MissingBody::Reference),
        Payload::Diff => match event.data.get("object") {
            Some(object) if object.is_object() => Body::Full(object.clone()),
            _ => patched(event, previous).map_or_else(|| missing(MissingBody::Diff), Body::Full),
        },
    }
}

/// A diff event without `object`: its patch applied to the store's version, if that is the
/// version the patch starts from.
fn patched(event: &Event, previous: Option<&Object>) -> Option<Value> {
    let previous = previous?;
    let base = previous.body.full()?;
    let from = event.data.pointer("/previous/metadata/resourceVersion");
    if from.is_some_and(|rv| rv.as_str() != Some(previous.resource_version.as_str())) {
        return None;
    }
    let patch: json_patch::Patch = serde_json::from_value(event.data.get("patch")?.clone()).ok()?;
    let mut doc = base.clone();
    json_patch::patch(&mut doc, &patch).ok()?;
    Some(doc)
}

#[cfg(test)]
pub(crate) mod tests;
