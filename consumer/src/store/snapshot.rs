//! Snapshots on demand in the store: a begin marker opens a snapshot, and its end marker, when
//! complete, removes the objects of its scope that got no event since the begin marker. The
//! bridge guarantees that every object existing during the whole snapshot is, between the two
//! markers, either published with the snapshot's id or changed by a newer live event (or
//! deleted): an object that got neither no longer exists (docs/events.md, "Snapshots on
//! demand").

use std::sync::Arc;

use super::{Change, DeleteCause, Object, Outcome, State, resource_key};
use crate::event::{Marker, MarkerKind, SnapshotResult};

/// A snapshot whose begin marker was read.
#[derive(Debug)]
pub(super) struct Open {
    /// Events at or after this position were published after the begin marker.
    began: i64,
    scope: Scope,
}

/// What a snapshot covers, as the store can tell.
#[derive(Debug)]
struct Scope {
    cluster: String,
    /// As [`super::ObjectKey::resource`] names it.
    resource: String,
    namespace: Option<String>,
    /// The topic or subject of the markers, the watch's: objects read elsewhere come from
    /// another watch (see [`same_watch`]).
    destination: String,
    label_selector: Option<String>,
}

impl Scope {
    fn of(marker: &Marker, destination: String, label_selector: Option<String>) -> Self {
        Scope {
            cluster: marker.cluster.clone(),
            resource: resource_key(&marker.api_version, &marker.resource),
            namespace: marker.namespace.clone(),
            destination,
            label_selector,
        }
    }

    /// Whether `object` is in the scope. Without its labels in every event, membership in a
    /// label selector cannot be judged: the caller prunes nothing then.
    fn holds(&self, object: &Object) -> bool {
        object.key.cluster == self.cluster
            && object.key.resource == self.resource
            && same_watch(&self.destination, &object.destination)
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| object.key.namespace.as_ref() == Some(ns))
    }
}

/// Whether an object read from `object` belongs to the watch whose markers were read from
/// `marker`: the same topic or subject, where a NATS subject's tokens `_watch` (the name of a
/// watch's own messages) and `_all` (every namespace) stand for any token of an object's subject.
fn same_watch(marker: &str, object: &str) -> bool {
    let (m, o): (Vec<&str>, Vec<&str>) = (marker.split('.').collect(), object.split('.').collect());
    m.len() == o.len()
        && m.iter()
            .zip(&o)
            .all(|(m, o)| m == o || *m == "_watch" || *m == "_all")
}

impl State {
    /// Applies a marker read from `destination`, published at position `at`.
    pub(super) fn apply_marker(&mut self, destination: String, marker: Marker, at: i64) -> Outcome {
        match &marker.kind {
            MarkerKind::Begin { label_selector, .. } => {
                // A begin marker sent again (the bridge restarted during the snapshot) keeps
                // the first one's position: what the snapshot published since counts.
                let scope = Scope::of(&marker, destination, label_selector.clone());
                self.open
                    .entry(marker.snapshot_id.clone())
                    .or_insert(Open { began: at, scope });
                Outcome::Marker(Vec::new())
            }
            MarkerKind::End { result, .. } => {
                let Some(open) = self.open.remove(&marker.snapshot_id) else {
                    tracing::debug!(snapshot = %marker.snapshot_id, "end marker without its begin marker: nothing to complete");
                    return Outcome::Marker(Vec::new());
                };
                match result {
                    SnapshotResult::Complete => {
                        Outcome::Marker(self.complete(marker.snapshot_id, open))
                    }
                    SnapshotResult::Failed(why) => {
                        tracing::info!(snapshot = %marker.snapshot_id, reason = %why, "snapshot failed: the store keeps what it has");
                        Outcome::Marker(Vec::new())
                    }
                }
            }
        }
    }

    /// Removes the stale objects of a completed snapshot's scope: the removals, then
    /// [`Change::SnapshotComplete`].
    fn complete(&mut self, id: String, open: Open) -> Vec<Change> {
        let Open { began, scope } = open;
        let stale: Vec<Arc<Object>> = if scope.label_selector.is_some() {
            Vec::new()
        } else {
            self.by_uid
                .iter()
                .filter(|(uid, object)| {
                    scope.holds(object) && self.stamps.get(*uid).is_none_or(|at| *at < began)
                })
                .map(|(_, object)| object.clone())
                .collect()
        };
        let mut changes: Vec<Change> = stale
            .into_iter()
            .map(|object| {
                // Remembered as deleted: its late events cannot bring it back.
                self.remove(&object);
                Change::Deleted {
                    object,
                    cause: DeleteCause::Snapshot,
                }
            })
            .collect();
        changes.push(Change::SnapshotComplete {
            id,
            cluster: scope.cluster,
            resource: scope.resource,
            namespace: scope.namespace,
            pruned: changes.len(),
        });
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::same_watch;

    #[test]
    fn a_watch_s_subject_stands_for_its_objects_subjects() {
        assert!(same_watch("k8s.c.configmaps", "k8s.c.configmaps"));
        assert!(same_watch(
            "k8s.c.core.configmaps.shop._watch",
            "k8s.c.core.configmaps.shop.web"
        ));
        assert!(same_watch(
            "k8s.c.core.configmaps._all._watch",
            "k8s.c.core.configmaps.shop.web"
        ));
        assert!(!same_watch(
            "k8s.c.core.configmaps.shop._watch",
            "k8s.c.core.configmaps.other.web"
        ));
        assert!(!same_watch("k8s.c.core.configmaps", "k8s.c.core.secrets"));
    }
}
