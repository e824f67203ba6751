//! Classification of what a watch saw against the known-object index, with no I/O: a live event
//! is published unless only noise changed; a list compares every object with what was known
//! before it, so an object listed again unchanged is a duplicate, one that changed is a
//! `modified`, and one known before but not listed was deleted while the history was lost (a
//! synthetic delete). A list after a lost history (HTTP 410) marks its events repaired.
//!
//! Objects announced past the loaded checkpoint ([`crate::checkpoint::announce`]) are *carried*
//! apart from the index until the watch names them again: a live event or a listing makes them
//! ordinary objects, and a list that ends without them publishes their deletes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use kube::api::{DynamicObject, ObjectMeta, TypeMeta};

use crate::change::{Change, ChangeKind, Origin};
use crate::config::SnapshotPolicy;
use crate::encode::ResourceInfo;
use crate::known::{Entry, KnownObjects, Seen, StoredEntry};
use crate::payload;
use crate::watch::Item;

/// What classifying one item produced.
#[derive(Debug, Default)]
pub(crate) struct Step {
    /// The change to publish, if any.
    pub change: Option<Change>,
    /// Synthetic deletes: found at the end of a list, or the predecessor of a listed object
    /// under the same name (published before `change`).
    pub deletes: Vec<Change>,
    /// The resourceVersion the stream has reached, if the item moves it.
    pub position: Option<String>,
    /// A list began, and why (`initial`, `gone`).
    pub relist: Option<&'static str>,
    /// An update was not published because only noise changed.
    pub suppressed: bool,
    /// A list completed.
    pub listed: bool,
    /// `change` is the first of an object the index did not know.
    pub first: bool,
}

/// Owns the known-object index of one watch and classifies the watch's items against it.
#[derive(Debug)]
pub(crate) struct Classifier {
    info: Arc<ResourceInfo>,
    /// What the first list publishes when nothing was known.
    snapshot: SnapshotPolicy,
    known: KnownObjects,
    /// Objects announced past the loaded checkpoint, not yet named again by the watch.
    carried: HashMap<Box<str>, Entry>,
    /// Origin of the list in progress, if any, and whether its findings are published.
    listing: Option<(Origin, bool)>,
    /// Whether a list completed before (or a checkpoint was resumed): the next list repairs.
    listed_once: bool,
    /// Reused buffer for content digests.
    scratch: Vec<u8>,
}

impl Classifier {
    /// A classifier starting from `known`; `resumed` when it comes from a checkpoint (also one
    /// that could not be decoded: its list then repairs as after a lost history).
    pub fn new(
        info: Arc<ResourceInfo>,
        snapshot: SnapshotPolicy,
        known: KnownObjects,
        resumed: bool,
    ) -> Self {
        Self {
            info,
            snapshot,
            known,
            carried: HashMap::new(),
            listing: None,
            listed_once: resumed,
            scratch: Vec::new(),
        }
    }

    /// Carries the objects announced past the loaded checkpoint (see the module's notes).
    pub fn carry(&mut self, announced: Vec<StoredEntry>) {
        for (uid, rv, ns, name, _) in announced {
            let entry = Entry {
                resource_version: rv,
                namespace: ns.map(Into::into),
                name,
                digest: 0,
            };
            self.carried.insert(uid, entry);
        }
    }

    /// How many announced objects are still carried: until none is, no checkpoint may be saved
    /// (it would drop their announcements).
    pub fn carried(&self) -> usize {
        self.carried.len()
    }

    /// The index, for checkpoints.
    pub fn known(&mut self) -> &mut KnownObjects {
        &mut self.known
    }

    /// The index as it stands.
    pub fn index(&self) -> &KnownObjects {
        &self.known
    }

    /// The resourceVersion the index holds for `uid`.
    pub fn version_of(&self, uid: &str) -> Option<Box<str>> {
        self.known.get(uid).map(|e| e.resource_version)
    }

    /// Whether a list is in progress.
    pub fn listing(&self) -> bool {
        self.listing.is_some()
    }

    /// Classifies one item against the index (which it updates) and says what to publish.
    pub fn classify(&mut self, item: Item) -> Step {
        match item {
            Item::Event(kind, object, observed) => self.event(kind, *object, observed),
            Item::ListBegin => {
                let (origin, reason) = if self.listed_once {
                    (Origin::Repaired, "gone")
                } else {
                    (Origin::Snapshot, "initial")
                };
                let publish =
                    origin == Origin::Repaired || self.snapshot == SnapshotPolicy::Initial;
                self.known.begin_relist();
                self.listing = Some((origin, publish));
                Step {
                    relist: Some(reason),
                    ..Step::default()
                }
            }
            Item::Listed(object, observed) => self.listed(*object, observed),
            Item::ListEnd(rv) => {
                let mut gone = self.known.finish_relist();
                gone.extend(self.carried.drain());
                self.listing = None;
                self.listed_once = true;
                Step {
                    deletes: self.synthetic_deletes(gone),
                    position: Some(rv),
                    listed: true,
                    ..Step::default()
                }
            }
            Item::ListAbort => {
                self.known.abort_relist();
                self.listing = None;
                Step::default()
            }
            Item::Progress(rv) => Step {
                position: Some(rv),
                ..Step::default()
            },
            Item::Vanished(rv) => {
                // Every object still known is gone, also one a list in progress had found.
                self.listing = None;
                self.known.begin_relist();
                let mut gone = self.known.finish_relist();
                gone.extend(self.carried.drain());
                Step {
                    deletes: self.synthetic_deletes(gone),
                    position: rv,
                    ..Step::default()
                }
            }
        }
    }

    /// A live event: deletes are always published, other changes unless nothing (or only
    /// noise) changed.
    fn event(&mut self, kind: ChangeKind, mut object: DynamicObject, observed: SystemTime) -> Step {
        let digest = if kind == ChangeKind::Deleted {
            0
        } else {
            self.digest(&mut object)
        };
        let Some((uid, rv, ns, name)) = identity(&object.metadata) else {
            return Step::default();
        };
        self.carried.remove(uid);
        let position = Some(rv.to_string());
        let seen = match kind {
            ChangeKind::Deleted => {
                self.known.remove(uid);
                Seen::New
            }
            _ => self.known.observe(uid, rv, ns, name, digest),
        };
        let publish = matches!(seen, Seen::New | Seen::Changed);
        Step {
            change: publish.then_some(Change {
                kind,
                origin: Origin::Live,
                object,
                observed,
            }),
            position,
            suppressed: seen == Seen::Touched,
            first: publish && kind != ChangeKind::Deleted && seen == Seen::New,
            ..Step::default()
        }
    }

    /// One listed object, compared with what was known before the list.
    fn listed(&mut self, mut object: DynamicObject, observed: SystemTime) -> Step {
        let Some((origin, publish)) = self.listing else {
            return Step::default();
        };
        let digest = self.digest(&mut object);
        let Some((uid, rv, ns, name)) = identity(&object.metadata) else {
            return Step::default();
        };
        let announced = self.carried.remove(uid);
        let mut deletes = Vec::new();
        let kind = match self.known.observe(uid, rv, ns, name, digest) {
            Seen::New => {
                // A name deleted and created again while the history was lost: the old uid's
                // delete goes first.
                if let Some(predecessor) = self.known.take_predecessor(ns, name)
                    && publish
                {
                    deletes = self.synthetic_deletes(vec![predecessor]);
                }
                // An object announced past the checkpoint may have been published up to any
                // version since: `added` only at the version announced (its first event's id),
                // `modified` at a later one (the id a live update of it had).
                match announced {
                    Some(a) if *a.resource_version != *rv => ChangeKind::Modified,
                    _ => ChangeKind::Added,
                }
            }
            Seen::Changed => ChangeKind::Modified,
            Seen::Unchanged => return Step::default(),
            Seen::Touched => {
                return Step {
                    suppressed: true,
                    ..Step::default()
                };
            }
        };
        Step {
            change: publish.then_some(Change {
                kind,
                origin,
                object,
                observed,
            }),
            deletes,
            first: publish && kind == ChangeKind::Added,
            ..Step::default()
        }
    }

    /// The content digest when the resource compares content, else 0 (unknown).
    fn digest(&mut self, object: &mut DynamicObject) -> u64 {
        if self.info.compare_content {
            payload::digest(object, &self.info.ignore, &mut self.scratch)
        } else {
            0
        }
    }

    /// Deletes of the objects known before a list but not in it, as the index last knew them.
    fn synthetic_deletes(&self, gone: Vec<(Box<str>, Entry)>) -> Vec<Change> {
        let observed = SystemTime::now();
        gone.into_iter()
            .map(|(uid, entry)| Change {
                kind: ChangeKind::Deleted,
                origin: Origin::Repaired,
                object: DynamicObject {
                    types: Some(TypeMeta {
                        api_version: self.info.api_version.clone(),
                        kind: self.info.kind.clone(),
                    }),
                    metadata: ObjectMeta {
                        name: Some(entry.name.into()),
                        namespace: entry.namespace.map(|ns| ns.to_string()),
                        uid: Some(uid.into()),
                        resource_version: Some(entry.resource_version.into()),
                        ..Default::default()
                    },
                    data: serde_json::Value::Object(Default::default()),
                },
                observed,
            })
            .collect()
    }
}

fn identity(meta: &ObjectMeta) -> Option<(&str, &str, Option<&str>, &str)> {
    Some((
        meta.uid.as_deref()?,
        meta.resource_version.as_deref()?,
        meta.namespace.as_deref(),
        meta.name.as_deref()?,
    ))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::encode::tests::configmaps;

    /// ConfigMap `cm-{uid}` in namespace `ns` at `rv`, holding `data`.
    pub(crate) fn object(uid: &str, rv: &str, data: &str) -> DynamicObject {
        DynamicObject {
            types: Some(TypeMeta {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
            }),
            metadata: ObjectMeta {
                name: Some(format!("cm-{uid}")),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            data: serde_json::json!({ "data": { "k": data } }),
        }
    }

    /// A listed object whose content differs at each resourceVersion.
    fn listed(uid: &str, rv: &str) -> Item {
        Item::Listed(Box::new(object(uid, rv, rv)), SystemTime::now())
    }

    fn event(kind: ChangeKind, uid: &str, rv: &str, data: &str) -> Item {
        Item::Event(kind, Box::new(object(uid, rv, data)), SystemTime::now())
    }

    fn classifier(snapshot: SnapshotPolicy) -> Classifier {
        Classifier::new(configmaps(""), snapshot, KnownObjects::default(), false)
    }

    /// Runs a complete list of `objects` (uid, resourceVersion) ending at `rv`; returns the
    /// published changes as (kind, origin, uid) and the list's end.
    fn list(c: &mut Classifier, objects: &[(&str, &str)], rv: &str) -> (Vec<Summary>, Step) {
        let begin = c.classify(Item::ListBegin);
        assert!(begin.change.is_none() && begin.relist.is_some());
        assert!(c.listing());
        let changes = objects
            .iter()
            .filter_map(|(uid, v)| c.classify(listed(uid, v)).change)
            .map(summary)
            .collect();
        let end = c.classify(Item::ListEnd(rv.into()));
        assert!(!c.listing());
        (changes, end)
    }

    type Summary = (ChangeKind, Origin, String);

    fn summary(change: Change) -> Summary {
        let uid = change.object.metadata.uid.clone().unwrap_or_default();
        (change.kind, change.origin, uid)
    }

    #[test]
    fn the_first_list_is_a_snapshot_of_adds() {
        let mut c = classifier(SnapshotPolicy::Initial);
        let begin = c.classify(Item::ListBegin);
        assert_eq!(begin.relist, Some("initial"));
        let changes: Vec<Summary> = ["a", "b"]
            .iter()
            .filter_map(|uid| c.classify(listed(uid, "5")).change)
            .map(summary)
            .collect();
        assert_eq!(
            changes,
            [
                (ChangeKind::Added, Origin::Snapshot, "a".into()),
                (ChangeKind::Added, Origin::Snapshot, "b".into())
            ]
        );
        let end = c.classify(Item::ListEnd("9".into()));
        assert!(end.listed && end.deletes.is_empty());
        assert_eq!(end.position.as_deref(), Some("9"));
        assert_eq!(c.known().len(), 2);
    }

    #[test]
    fn without_a_snapshot_the_first_list_only_fills_the_index() {
        let mut c = classifier(SnapshotPolicy::None);
        let (changes, end) = list(&mut c, &[("a", "5")], "9");
        assert!(changes.is_empty());
        assert!(end.listed);
        assert_eq!(c.known().len(), 1);
        // Changes after the start are published.
        let step = c.classify(event(ChangeKind::Modified, "a", "10", "w"));
        assert_eq!(
            step.change.map(summary),
            Some((ChangeKind::Modified, Origin::Live, "a".into()))
        );
    }

    #[test]
    fn an_add_of_a_listed_version_is_a_duplicate() {
        let mut c = classifier(SnapshotPolicy::Initial);
        list(&mut c, &[("a", "5")], "9");
        let step = c.classify(event(ChangeKind::Added, "a", "5", "5"));
        assert!(step.change.is_none(), "the list published it already");
        assert!(!step.suppressed);
        assert_eq!(step.position.as_deref(), Some("5"));
        let step = c.classify(event(ChangeKind::Modified, "a", "6", "v"));
        assert_eq!(
            step.change.map(summary),
            Some((ChangeKind::Modified, Origin::Live, "a".into()))
        );
    }

    #[test]
    fn a_relist_after_lost_history_repairs_and_deletes_what_is_gone() {
        let mut c = classifier(SnapshotPolicy::Initial);
        list(&mut c, &[("a", "5"), ("b", "6"), ("c", "7")], "9");
        // The history is lost (410): the next list compares with what was known.
        let begin = c.classify(Item::ListBegin);
        assert_eq!(begin.relist, Some("gone"));
        let mut changes: Vec<Summary> = [("a", "5"), ("b", "12"), ("d", "13")]
            .iter()
            .filter_map(|(uid, rv)| c.classify(listed(uid, rv)).change)
            .map(summary)
            .collect();
        let end = c.classify(Item::ListEnd("14".into()));
        let deleted = &end.deletes;
        assert_eq!(deleted.len(), 1);
        let meta = &deleted[0].object.metadata;
        assert_eq!(meta.name.as_deref(), Some("cm-c"));
        assert_eq!(meta.namespace.as_deref(), Some("ns"));
        assert_eq!(meta.resource_version.as_deref(), Some("7"));
        changes.extend(end.deletes.into_iter().map(summary));
        assert_eq!(
            changes,
            [
                (ChangeKind::Modified, Origin::Repaired, "b".into()),
                (ChangeKind::Added, Origin::Repaired, "d".into()),
                (ChangeKind::Deleted, Origin::Repaired, "c".into()),
            ]
        );
        assert_eq!(c.known().len(), 3);
    }

    /// A classifier resumed from a checkpoint that knows `a` at 5 and carries `b` (at 7) and
    /// `c` (at 8), announced past it.
    fn carrying() -> Classifier {
        let mut known = KnownObjects::default();
        known.observe("a", "5", Some("ns"), "cm-a", 0);
        let mut c = Classifier::new(configmaps(""), SnapshotPolicy::None, known, true);
        let entry = |uid: &str, rv: &str| -> StoredEntry {
            (
                uid.into(),
                rv.into(),
                Some("ns".into()),
                format!("cm-{uid}").into(),
                0,
            )
        };
        c.carry(vec![entry("b", "7"), entry("c", "8")]);
        c
    }

    #[test]
    fn carried_objects_a_list_does_not_show_are_deleted_as_repaired() {
        let mut c = carrying();
        assert_eq!(c.carried(), 2);
        let (changes, end) = list(&mut c, &[("a", "5"), ("c", "9")], "10");
        // c was announced at 8 and is listed at 9: its update may have been published already,
        // as a `modified`, which the repair's id must match.
        assert_eq!(
            changes,
            [(ChangeKind::Modified, Origin::Repaired, "c".into())]
        );
        let deletes: Vec<Summary> = end.deletes.into_iter().map(summary).collect();
        assert_eq!(
            deletes,
            [(ChangeKind::Deleted, Origin::Repaired, "b".into())]
        );
        assert_eq!(c.carried(), 0);
        assert_eq!(c.known().len(), 2, "a and c");
    }

    #[test]
    fn a_carried_object_listed_at_its_announced_version_is_added_again_with_the_same_id() {
        let mut c = carrying();
        let (changes, _) = list(&mut c, &[("a", "5"), ("b", "7"), ("c", "8")], "10");
        assert_eq!(
            changes,
            [
                (ChangeKind::Added, Origin::Repaired, "b".into()),
                (ChangeKind::Added, Origin::Repaired, "c".into())
            ]
        );
    }

    #[test]
    fn a_carried_object_named_by_a_live_event_is_an_ordinary_first_event() {
        let mut c = carrying();
        let step = c.classify(event(ChangeKind::Added, "b", "7", "v"));
        assert!(
            step.first,
            "published as the object's first event, announced again"
        );
        assert_eq!(
            step.change.map(summary),
            Some((ChangeKind::Added, Origin::Live, "b".into()))
        );
        let step = c.classify(event(ChangeKind::Deleted, "c", "11", "v"));
        assert!(!step.first, "a delete is never announced");
        assert_eq!(c.carried(), 0);
        let (_, end) = list(&mut c, &[("a", "5"), ("b", "7")], "12");
        assert!(end.deletes.is_empty(), "nothing carried is left to delete");
    }

    #[test]
    fn a_resumed_watch_lists_as_a_repair_even_without_a_snapshot() {
        let mut known = KnownObjects::default();
        known.observe("a", "5", Some("ns"), "cm-a", 0);
        let mut c = Classifier::new(configmaps(""), SnapshotPolicy::None, known, true);
        let begin = c.classify(Item::ListBegin);
        assert_eq!(begin.relist, Some("gone"));
        let step = c.classify(listed("b", "8"));
        assert_eq!(
            step.change.map(summary),
            Some((ChangeKind::Added, Origin::Repaired, "b".into()))
        );
        let end = c.classify(Item::ListEnd("9".into()));
        let deletes: Vec<Summary> = end.deletes.into_iter().map(summary).collect();
        assert_eq!(
            deletes,
            [(ChangeKind::Deleted, Origin::Repaired, "a".into())]
        );
    }

    #[test]
    fn a_name_recreated_while_the_history_was_lost_is_deleted_before_it_is_added() {
        let mut c = classifier(SnapshotPolicy::Initial);
        list(&mut c, &[("a", "5"), ("b", "6")], "9");
        c.classify(Item::ListBegin);
        // `a` was deleted and a new uid created under its name: listed before `b`.
        let mut successor = object("z", "12", "new");
        successor.metadata.name = Some("cm-a".into());
        let step = c.classify(Item::Listed(Box::new(successor), SystemTime::now()));
        let order: Vec<Summary> = step
            .deletes
            .into_iter()
            .chain(step.change)
            .map(summary)
            .collect();
        assert_eq!(
            order,
            [
                (ChangeKind::Deleted, Origin::Repaired, "a".into()),
                (ChangeKind::Added, Origin::Repaired, "z".into()),
            ]
        );
        assert!(c.classify(listed("b", "6")).change.is_none());
        let end = c.classify(Item::ListEnd("14".into()));
        assert!(end.deletes.is_empty(), "the predecessor is deleted once");
        assert_eq!(c.known().len(), 2);
        assert!(c.known().get("a").is_none());
    }

    #[test]
    fn a_name_listed_before_its_old_uid_is_not_a_recreation_of_a_listed_one() {
        let mut c = classifier(SnapshotPolicy::Initial);
        list(&mut c, &[("a", "5")], "9");
        c.classify(Item::ListBegin);
        // `a` is listed again (unchanged), then a new uid under another name.
        assert!(c.classify(listed("a", "5")).change.is_none());
        let step = c.classify(listed("b", "10"));
        assert!(step.deletes.is_empty());
        assert!(c.classify(Item::ListEnd("14".into())).deletes.is_empty());
    }

    #[test]
    fn a_vanished_resource_deletes_every_object_still_known_once() {
        let mut c = classifier(SnapshotPolicy::Initial);
        list(&mut c, &[("a", "5"), ("b", "6"), ("c", "7")], "9");
        // The API server delivered one delete before it closed the watch.
        c.classify(event(ChangeKind::Deleted, "b", "10", ""));
        // A relist was under way when the watch stopped: what it had found is gone too.
        c.classify(Item::ListBegin);
        c.classify(listed("a", "5"));
        let step = c.classify(Item::Vanished(Some("10".into())));
        assert!(!c.listing());
        assert_eq!(step.position.as_deref(), Some("10"));
        let deletes: Vec<Summary> = step.deletes.into_iter().map(summary).collect();
        assert_eq!(
            deletes,
            [
                (ChangeKind::Deleted, Origin::Repaired, "a".into()),
                (ChangeKind::Deleted, Origin::Repaired, "c".into()),
            ]
        );
        assert_eq!(c.known().len(), 0);
        let again = c.classify(Item::Vanished(None));
        assert!(again.deletes.is_empty() && again.position.is_none());
    }

    #[test]
    fn an_aborted_list_deletes_nothing() {
        let mut c = classifier(SnapshotPolicy::Initial);
        list(&mut c, &[("a", "5"), ("b", "6")], "9");
        c.classify(Item::ListBegin);
        c.classify(listed("a", "5"));
        let abort = c.classify(Item::ListAbort);
        assert!(abort.change.is_none() && abort.deletes.is_empty() && abort.position.is_none());
        assert!(!c.listing());
        assert_eq!(c.known().len(), 2, "objects not reached are kept");
        let (changes, end) = list(&mut c, &[("a", "5"), ("b", "6")], "10");
        assert!(changes.is_empty() && end.deletes.is_empty());
    }

    #[test]
    fn listed_objects_outside_a_list_are_ignored() {
        let mut c = classifier(SnapshotPolicy::Initial);
        let step = c.classify(listed("a", "5"));
        assert!(step.change.is_none());
        assert!(c.known().is_empty());
    }

    #[test]
    fn a_live_delete_is_published_and_forgotten() {
        let mut c = classifier(SnapshotPolicy::Initial);
        list(&mut c, &[("a", "5")], "9");
        let step = c.classify(event(ChangeKind::Deleted, "a", "11", "v"));
        assert_eq!(
            step.change.map(summary),
            Some((ChangeKind::Deleted, Origin::Live, "a".into()))
        );
        assert_eq!(step.position.as_deref(), Some("11"));
        assert!(c.known().is_empty());
        // A relist then finds nothing to delete.
        let (_, end) = list(&mut c, &[], "12");
        assert!(end.deletes.is_empty());
    }

    #[test]
    fn a_bookmark_moves_the_position_only() {
        let mut c = classifier(SnapshotPolicy::Initial);
        let step = c.classify(Item::Progress("42".into()));
        assert!(step.change.is_none() && step.deletes.is_empty() && !step.listed);
        assert_eq!(step.position.as_deref(), Some("42"));
    }

    #[test]
    fn updates_of_noise_only_are_suppressed_when_content_is_compared() {
        let info = configmaps(", dropUnchangedUpdates: true");
        assert!(info.compare_content);
        let mut c = Classifier::new(
            info,
            SnapshotPolicy::Initial,
            KnownObjects::default(),
            false,
        );
        list(&mut c, &[("a", "5")], "9");
        let step = c.classify(event(ChangeKind::Modified, "a", "10", "5"));
        assert!(step.change.is_none());
        assert!(step.suppressed);
        assert_eq!(step.position.as_deref(), Some("10"));
        let step = c.classify(event(ChangeKind::Modified, "a", "11", "w"));
        assert!(step.change.is_some() && !step.suppressed);
        // A relist that finds only noise changed publishes nothing either.
        c.classify(Item::ListBegin);
        let step = c.classify(Item::Listed(
            Box::new(object("a", "12", "w")),
            SystemTime::now(),
        ));
        assert!(step.change.is_none() && step.suppressed);
    }
}
