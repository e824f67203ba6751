//! The event contract on in-memory events: every rule of docs/consumers.md.

use serde_json::{Value, json};

use super::*;

const TOPIC: &str = "k8s.c.core.configmaps";

/// A ConfigMap event: `ns/name`, its uid, resourceVersion, change and `data.v`.
pub(crate) fn event(name: &str, uid: &str, rv: u64, change: ChangeType, v: &str) -> Event {
    let word = match change {
        ChangeType::Added => "added",
        ChangeType::Modified => "modified",
        ChangeType::Deleted => "deleted",
    };
    Event {
        id: format!("{uid}:{rv}:{word}"),
        source: "/k8s/c/api/v1/configmaps".into(),
        change,
        time: None,
        cluster: "c".into(),
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        resource: "configmaps".into(),
        namespace: Some("ns".into()),
        name: name.into(),
        uid: uid.into(),
        resource_version: rv.to_string(),
        sequence: format!("{rv:020}"),
        partition_key: uid.into(),
        origin: Origin::Live,
        payload: Payload::Full,
        truncated: false,
        snapshot_id: None,
        data: object(name, uid, rv, v),
    }
}

fn object(name: &str, uid: &str, rv: u64, v: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv.to_string()},
        "data": {"v": v}
    })
}

pub(crate) fn rec(e: Event) -> Record {
    Record::Event {
        destination: TOPIC.into(),
        event: Box::new(e),
    }
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::namespaced("c", "configmaps", "ns", name)
}

/// `data.v` of the stored object `name`, or why there is none.
fn value_of(store: &Store, name: &str) -> Option<String> {
    let object = store.get(&key(name))?;
    Some(match &object.body {
        Body::Full(v) => v["data"]["v"].as_str().unwrap_or_default().to_string(),
        Body::Missing { reason, .. } => format!("{reason:?}"),
    })
}

use ChangeType::{Added, Deleted, Modified};

#[test]
fn an_event_seen_twice_is_a_duplicate() {
    let mut w = Writer::new();
    let e = event("a", "u1", 10, Added, "1");
    assert!(matches!(w.apply(rec(e.clone())), Outcome::Changed(_)));
    assert_eq!(w.apply(rec(e)), Outcome::Duplicate);
    assert_eq!(w.store().len(), 1);
}

#[test]
fn an_older_sequence_of_a_uid_is_stale_in_string_order() {
    let mut w = Writer::new();
    w.apply(rec(event("a", "u1", 1000, Modified, "new")));
    assert_eq!(
        w.apply(rec(event("a", "u1", 999, Modified, "old"))),
        Outcome::Stale
    );
    assert_eq!(value_of(&w.store(), "a").as_deref(), Some("new"));
    let Outcome::Changed(Change::Applied { object, previous }) =
        w.apply(rec(event("a", "u1", 1001, Modified, "newer")))
    else {
        panic!("a newer sequence applies");
    };
    assert_eq!(object.resource_version, "1001");
    assert_eq!(previous.unwrap().resource_version, "1000");
}

#[test]
fn a_repaired_delete_with_the_last_sequence_removes_the_object_keeping_its_last_body() {
    let mut w = Writer::new();
    w.apply(rec(event("a", "u1", 10, Added, "1")));
    let mut delete = event("a", "u1", 10, Deleted, "");
    delete.origin = Origin::Repaired;
    delete.data = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "10"}});
    let Outcome::Changed(Change::Deleted { object, cause }) = w.apply(rec(delete.clone())) else {
        panic!("a repaired delete applies");
    };
    assert_eq!(cause, DeleteCause::Event(Origin::Repaired));
    // The repaired delete is a reference: the last full body stays with the deleted object.
    assert_eq!(object.body.full().unwrap()["data"]["v"], "1");
    assert!(w.store().is_empty());
    assert_eq!(w.apply(rec(delete)), Outcome::Duplicate);
}

#[test]
fn a_live_delete_carries_the_last_state() {
    let mut w = Writer::new();
    w.apply(rec(event("a", "u1", 10, Added, "1")));
    let Outcome::Changed(Change::Deleted { object, .. }) =
        w.apply(rec(event("a", "u1", 12, Deleted, "2")))
    else {
        panic!("a delete applies");
    };
    assert_eq!(object.body.full().unwrap()["data"]["v"], "2");
    assert_eq!(object.resource_version, "12");
}

#[test]
fn a_deleted_uid_never_comes_back() {
    let mut w = Writer::new();
    assert_eq!(
        w.apply(rec(event("a", "u1", 12, Deleted, "2"))),
        Outcome::Unknown
    );
    assert_eq!(
        w.apply(rec(event("a", "u1", 10, Added, "1"))),
        Outcome::Stale
    );
    assert!(w.store().is_empty());
}

#[test]
fn a_recreated_object_replaces_its_predecessor_whatever_order_the_partitions_give() {
    // New uid first (another partition ran ahead), then the old uid's history.
    let mut w = Writer::new();
    w.apply(rec(event("a", "new", 20, Added, "new")));
    assert_eq!(
        w.apply(rec(event("a", "old", 10, Added, "old"))),
        Outcome::Stale
    );
    assert_eq!(
        w.apply(rec(event("a", "old", 15, Deleted, "old"))),
        Outcome::Duplicate
    );
    assert_eq!(value_of(&w.store(), "a").as_deref(), Some("new"));

    // Old uid first, its delete not yet read: the new uid takes the name.
    let mut w = Writer::new();
    w.apply(rec(event("a", "old", 10, Added, "old")));
    let Outcome::Changed(Change::Applied { object, previous }) =
        w.apply(rec(event("a", "new", 20, Added, "new")))
    else {
        panic!("the new uid applies");
    };
    assert_eq!(object.uid, "new");
    assert_eq!(previous.unwrap().uid, "old");
    assert_eq!(w.store().len(), 1);
    assert!(w.store().get_by_uid("c", "old").is_none());
    assert_eq!(
        w.apply(rec(event("a", "old", 15, Deleted, "old"))),
        Outcome::Duplicate
    );
    assert_eq!(value_of(&w.store(), "a").as_deref(), Some("new"));
}

#[test]
fn tombstones_remove_by_record_key_within_their_topic() {
    let mut w = Writer::new();
    let mut e = event("a", "u1", 10, Added, "1");
    e.partition_key = "ns/a".into();
    w.apply(rec(e));
    let other_topic = Record::Tombstone {
        destination: "elsewhere".into(),
        key: "ns/a".into(),
    };
    assert_eq!(w.apply(other_topic), Outcome::Unknown);
    let tombstone = Record::Tombstone {
        destination: TOPIC.into(),
        key: "ns/a".into(),
    };
    let Outcome::Changed(Change::Deleted { object, cause }) = w.apply(tombstone.clone()) else {
        panic!("the tombstone removes the object");
    };
    assert_eq!((object.uid.as_str(), cause), ("u1", DeleteCause::Tombstone));
    assert_eq!(w.apply(tombstone), Outcome::Unknown);
    // The tombstone right behind a delete finds nothing left.
    w.apply(rec(event("b", "u2", 11, Added, "1")));
    w.apply(rec(event("b", "u2", 12, Deleted, "1")));
    let behind = Record::Tombstone {
        destination: TOPIC.into(),
        key: "u2".into(),
    };
    assert_eq!(w.apply(behind), Outcome::Unknown);
}

#[test]
fn a_truncated_event_keeps_the_version_and_flags_the_body_until_a_full_one_arrives() {
    let mut w = Writer::new();
    w.apply(rec(event("a", "u1", 10, Added, "1")));
    let mut truncated = event("a", "u1", 11, Modified, "");
    truncated.payload = Payload::Reference;
    truncated.truncated = true;
    truncated.data =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "a", "namespace": "ns"});
    w.apply(rec(truncated));
    let object = w.store().get(&key("a")).unwrap();
    assert_eq!(object.resource_version, "11");
    let Body::Missing { reason, last_full } = &object.body else {
        panic!("the body is missing");
    };
    assert_eq!(*reason, MissingBody::Truncated);
    assert_eq!(last_full.as_ref().unwrap()["data"]["v"], "1");
    w.apply(rec(event("a", "u1", 12, Modified, "3")));
    assert_eq!(value_of(&w.store(), "a").as_deref(), Some("3"));
}

#[test]
fn a_reference_payload_stores_identity_and_version_only() {
    let mut w = Writer::new();
    let mut e = event("a", "u1", 10, Added, "");
    e.payload = Payload::Reference;
    w.apply(rec(e));
    assert_eq!(value_of(&w.store(), "a").as_deref(), Some("Reference"));
}

#[test]
fn diff_payloads_give_the_object_or_apply_the_patch_to_the_stored_version() {
    let mut w = Writer::new();
    w.apply(rec(event("a", "u1", 10, Added, "1")));
    let mut with_object = event("a", "u1", 11, Modified, "");
    with_object.payload = Payload::Diff;
    with_object.data = json!({"object": object("a", "u1", 11, "2"), "patch": null});
    w.apply(rec(with_object));
    assert_eq!(value_of(&w.store(), "a").as_deref(), Some("2"));

    let mut patch_only = event("a", "u1", 12, Modified, "");
    patch_only.payload = Payload::Diff;
    patch_only.data = json!({"patch": [
        {"op": "replace", "path": "/data/v", "value": "3"},
        {"op": "replace", "path": "/metadata/resourceVersion", "value": "12"}]});
    w.apply(rec(patch_only));
    let stored = w.store().get(&key("a")).unwrap();
    assert_eq!(stored.body.full().unwrap(), &object("a", "u1", 12, "3"));

    // A patch from a version the store does not hold cannot be applied.
    let mut wrong_base = event("a", "u1", 14, Modified, "");
    wrong_base.payload = Payload::Diff;
    wrong_base.data = json!({"patch": [{"op": "replace", "path": "/data/v", "value": "5"}],
        "previous": object("a", "u1", 13, "4")});
    w.apply(rec(wrong_base));
    assert_eq!(value_of(&w.store(), "a").as_deref(), Some("Diff"));
}

#[test]
fn cluster_scoped_and_grouped_objects_are_keyed_by_resource_and_group() {
    let mut w = Writer::new();
    let mut node = event("n1", "u1", 10, Added, "");
    node.namespace = None;
    node.resource = "nodes".into();
    w.apply(rec(node));
    let mut deployment = event("web", "u2", 11, Added, "");
    deployment.api_version = "apps/v1".into();
    deployment.resource = "deployments".into();
    w.apply(rec(deployment));
    let store = w.store();
    assert!(
        store
            .get(&ObjectKey::cluster_scoped("c", "nodes", "n1"))
            .is_some()
    );
    assert!(
        store
            .get(&ObjectKey::namespaced("c", "deployments.apps", "ns", "web"))
            .is_some()
    );
    assert!(store.get(&key("web")).is_none());
}

#[test]
fn an_object_back_in_its_label_selector_returns_and_late_duplicates_stay_out() {
    let mut w = Writer::new();
    w.apply(rec(event("a", "u1", 10, Added, "1")));
    // It stops matching the watch's label selector: the API server sends a delete.
    w.apply(rec(event("a", "u1", 12, Deleted, "2")));
    assert!(w.store().is_empty());
    assert_eq!(
        w.apply(rec(event("a", "u1", 10, Added, "1"))),
        Outcome::Stale,
        "a late duplicate of a version before the delete"
    );
    // It matches again, same uid, a newer version.
    assert!(matches!(
        w.apply(rec(event("a", "u1", 14, Added, "3"))),
        Outcome::Changed(_)
    ));
    assert_eq!(value_of(&w.store(), "a").as_deref(), Some("3"));
}

#[test]
fn a_repaired_delete_older_than_what_the_store_saw_still_keeps_out_what_it_saw() {
    let mut w = Writer::new();
    w.apply(rec(event("a", "u1", 10, Added, "1")));
    w.apply(rec(event("a", "u1", 14, Modified, "2")));
    // A restart from an older checkpoint repairs with the last version it knew.
    let mut repaired = event("a", "u1", 10, Deleted, "");
    repaired.origin = Origin::Repaired;
    w.apply(rec(repaired));
    assert_eq!(
        w.apply(rec(event("a", "u1", 14, Modified, "2"))),
        Outcome::Stale,
        "a replay of the version the store saw does not bring it back"
    );
    assert!(w.store().is_empty());
}

#[test]
fn forgotten_uids_are_bounded() {
    let mut w = Writer::with_forgotten_capacity(2);
    for uid in ["u1", "u2", "u3"] {
        w.apply(rec(event(uid, uid, 10, Deleted, "")));
    }
    // u1 was forgotten first: its late add is taken as new.
    assert!(matches!(
        w.apply(rec(event("u1", "u1", 9, Added, ""))),
        Outcome::Changed(_)
    ));
    assert_eq!(
        w.apply(rec(event("u3", "u3", 9, Added, ""))),
        Outcome::Stale
    );
}

/// [`event`] of cluster `cluster`, read from `destination`.
fn in_topic(cluster: &str, destination: &str, e: Event) -> Record {
    Record::Event {
        destination: destination.into(),
        event: Box::new(Event {
            cluster: cluster.into(),
            source: format!("/k8s/{cluster}/api/v1/configmaps"),
            ..e
        }),
    }
}

/// [`event`] of cluster `cluster`, read from its own topic.
fn of_cluster(cluster: &str, e: Event) -> Record {
    in_topic(cluster, &format!("k8s.{cluster}.core.configmaps"), e)
}

/// `data.v` of `name` in `cluster`, or why there is none.
fn value_in(store: &Store, cluster: &str, name: &str) -> Option<String> {
    let object = store.cluster(cluster).get("configmaps", Some("ns"), name)?;
    Some(match &object.body {
        Body::Full(v) => v["data"]["v"].as_str().unwrap_or_default().to_string(),
        Body::Missing { reason, .. } => format!("{reason:?}"),
    })
}

#[test]
fn two_clusters_objects_of_one_name_are_two_objects_whatever_the_interleaving() {
    let mut w = Writer::new();
    let store = w.store();
    // The same namespace, name, uid (clusters restored from one etcd backup share uids) and
    // resourceVersions in two clusters, their events interleaved.
    let applied = |o: Outcome| matches!(o, Outcome::Changed(Change::Applied { .. }));
    assert!(applied(
        w.apply(of_cluster("east", event("a", "u1", 10, Added, "e1")))
    ));
    assert!(applied(
        w.apply(of_cluster("west", event("a", "u1", 10, Added, "w1")))
    ));
    assert_eq!(
        w.apply(of_cluster("east", event("a", "u1", 10, Added, "e1"))),
        Outcome::Duplicate
    );
    assert!(applied(w.apply(of_cluster(
        "west",
        event("a", "u1", 12, Modified, "w2")
    ))));
    // Older than west's version, newer than east's: a change of east.
    assert!(applied(w.apply(of_cluster(
        "east",
        event("a", "u1", 11, Modified, "e2")
    ))));
    assert_eq!(
        w.apply(of_cluster("west", event("a", "u1", 11, Modified, "w-late"))),
        Outcome::Stale
    );
    assert_eq!(store.len(), 2);
    assert_eq!(store.clusters(), ["east", "west"]);
    assert_eq!(value_in(&store, "east", "a").as_deref(), Some("e2"));
    assert_eq!(value_in(&store, "west", "a").as_deref(), Some("w2"));
    assert_eq!(
        store.get_by_uid("east", "u1").unwrap().resource_version,
        "11"
    );
    assert_eq!(
        store.get_by_uid("west", "u1").unwrap().resource_version,
        "12"
    );
    let west = store.cluster("west");
    assert_eq!((west.name(), west.len()), ("west", 1));
    assert_eq!(west.list()[0].key.cluster, "west");
    assert!(store.cluster("north").is_empty());
    assert_eq!(
        store
            .get(&ObjectKey::namespaced("east", "configmaps", "ns", "a"))
            .unwrap()
            .key
            .to_string(),
        "configmaps ns/a in east"
    );
}

#[test]
fn a_delete_and_the_memory_of_deleted_uids_stay_within_their_cluster() {
    let mut w = Writer::new();
    let store = w.store();
    w.apply(of_cluster("east", event("a", "u1", 10, Added, "e1")));
    w.apply(of_cluster("west", event("a", "u1", 10, Added, "w1")));
    let Outcome::Changed(Change::Deleted { object, .. }) =
        w.apply(of_cluster("east", event("a", "u1", 12, Deleted, "e1")))
    else {
        panic!("east's delete applies");
    };
    assert_eq!(object.key.cluster, "east");
    assert!(store.cluster("east").is_empty());
    assert_eq!(value_in(&store, "west", "a").as_deref(), Some("w1"));
    // East's uid stays deleted; the same uid in west keeps changing.
    assert_eq!(
        w.apply(of_cluster("east", event("a", "u1", 11, Modified, "e-late"))),
        Outcome::Stale
    );
    assert!(matches!(
        w.apply(of_cluster("west", event("a", "u1", 13, Modified, "w2"))),
        Outcome::Changed(_)
    ));
    assert_eq!(value_in(&store, "west", "a").as_deref(), Some("w2"));
    // A delete of west's object that east never had is unknown to east.
    assert!(matches!(
        w.apply(of_cluster("west", event("a", "u1", 14, Deleted, "w2"))),
        Outcome::Changed(Change::Deleted { .. })
    ));
    assert!(store.is_empty());
}

#[test]
fn a_recreated_name_replaces_its_predecessor_in_its_cluster_only() {
    let mut w = Writer::new();
    let store = w.store();
    w.apply(of_cluster("east", event("a", "old", 10, Added, "e-old")));
    w.apply(of_cluster("west", event("a", "other", 11, Added, "w")));
    let Outcome::Changed(Change::Applied { previous, .. }) =
        w.apply(of_cluster("east", event("a", "new", 20, Added, "e-new")))
    else {
        panic!("the new uid applies");
    };
    assert_eq!(previous.unwrap().uid, "old");
    assert_eq!(value_in(&store, "east", "a").as_deref(), Some("e-new"));
    assert_eq!(value_in(&store, "west", "a").as_deref(), Some("w"));
}

#[test]
fn tombstones_of_per_cluster_topics_remove_that_cluster_s_object() {
    let mut w = Writer::new();
    let store = w.store();
    for cluster in ["east", "west"] {
        let mut e = event("a", &format!("{cluster}-u1"), 10, Added, cluster);
        e.partition_key = "ns/a".into();
        w.apply(of_cluster(cluster, e));
    }
    let tombstone = Record::Tombstone {
        destination: "k8s.west.core.configmaps".into(),
        key: "ns/a".into(),
    };
    let Outcome::Changed(Change::Deleted { object, cause }) = w.apply(tombstone) else {
        panic!("the tombstone removes west's object");
    };
    assert_eq!(
        (object.key.cluster.as_str(), cause),
        ("west", DeleteCause::Tombstone)
    );
    assert_eq!(value_in(&store, "east", "a").as_deref(), Some("east"));
    // In a topic the clusters share, uid keys (the default) tell their objects apart.
    let shared = "k8s.all.core.configmaps";
    w.apply(in_topic(
        "east",
        shared,
        event("b", "ub-east", 20, Added, "e"),
    ));
    w.apply(in_topic(
        "west",
        shared,
        event("b", "ub-west", 21, Added, "w"),
    ));
    assert!(matches!(
        w.apply(Record::Tombstone {
            destination: shared.into(),
            key: "ub-east".into(),
        }),
        Outcome::Changed(Change::Deleted { .. })
    ));
    assert!(value_in(&store, "east", "b").is_none());
    assert_eq!(value_in(&store, "west", "b").as_deref(), Some("w"));
}

/// The event of snapshot `id` for `name`: an `added` with the snapshot's id.
fn snapshot_event(name: &str, uid: &str, rv: u64, id: &str) -> Event {
    Event {
        id: format!("{uid}:{rv}:{id}"),
        origin: Origin::Snapshot,
        snapshot_id: Some(id.into()),
        ..event(name, uid, rv, Added, "snap")
    }
}

/// The begin or end marker of snapshot `id` of ConfigMaps (in namespace `ns` when `namespaced`).
fn marker(id: &str, kind: crate::event::MarkerKind, namespaced: bool) -> Record {
    Record::Marker {
        destination: TOPIC.into(),
        marker: Box::new(crate::event::Marker {
            id: format!("{id}:c.00aa:x"),
            snapshot_id: id.into(),
            kind,
            time: None,
            cluster: "c".into(),
            api_version: "v1".into(),
            resource: "configmaps".into(),
            namespace: namespaced.then(|| "ns".into()),
            watch: "c.00aa".into(),
        }),
    }
}

fn begin(id: &str, selector: Option<&str>) -> Record {
    let kind = crate::event::MarkerKind::Begin {
        label_selector: selector.map(Into::into),
        expected: Some(3),
    };
    marker(id, kind, false)
}

fn end(id: &str, result: crate::event::SnapshotResult) -> Record {
    let kind = crate::event::MarkerKind::End {
        sent: 2,
        skipped: 1,
        pruned: 0,
        result,
    };
    marker(id, kind, false)
}

/// What an outcome of a marker changed: `deleted NAME` per removal, then `complete N`.
fn marker_changes(outcome: Outcome) -> Vec<String> {
    let Outcome::Marker(changes) = outcome else {
        panic!("a marker's outcome: {outcome:?}");
    };
    changes
        .iter()
        .map(|c| match c {
            Change::Deleted { object, cause } => {
                assert_eq!(*cause, DeleteCause::Snapshot);
                format!("deleted {}", object.key.name)
            }
            Change::SnapshotComplete { id, pruned, .. } => format!("complete {id} {pruned}"),
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

fn names(store: &Store) -> Vec<String> {
    let mut names: Vec<String> = store.list().iter().map(|o| o.key.name.clone()).collect();
    names.sort();
    names
}

use crate::event::SnapshotResult::{Complete, Failed};

#[test]
fn a_completed_snapshot_removes_what_got_no_event_since_its_begin_marker() {
    let mut w = Writer::new();
    // Before the snapshot: a (unchanged since), b (changes live during it), and gone (deleted
    // meanwhile, its delete lost to compaction).
    w.apply(rec(event("a", "ua", 10, Added, "1")));
    w.apply(rec(event("b", "ub", 11, Added, "1")));
    w.apply(rec(event("gone", "ug", 12, Added, "1")));
    assert_eq!(
        marker_changes(w.apply(begin("s1", None))),
        Vec::<String>::new()
    );
    // a: the snapshot finds it as the store has it (same resourceVersion, another id).
    assert_eq!(
        w.apply(rec(snapshot_event("a", "ua", 10, "s1"))),
        Outcome::Stale
    );
    // b: a live change; the snapshot skips it. new: created during the snapshot.
    w.apply(rec(event("b", "ub", 20, Modified, "2")));
    w.apply(rec(event("new", "un", 21, Added, "1")));
    assert_eq!(
        marker_changes(w.apply(end("s1", Complete))),
        ["deleted gone", "complete s1 1"]
    );
    assert_eq!(names(&w.store()), ["a", "b", "new"]);
    // The removed uid is remembered: its late duplicate does not bring it back.
    assert_eq!(
        w.apply(rec(event("gone", "ug", 12, Added, "1"))),
        Outcome::Stale
    );
}

#[test]
fn a_snapshot_prunes_only_its_scope() {
    let mut w = Writer::new();
    w.apply(rec(event("old", "u1", 10, Added, "1")));
    let mut other_ns = event("elsewhere", "u2", 11, Added, "1");
    other_ns.namespace = Some("other".into());
    w.apply(rec(other_ns));
    let mut other_cluster = event("old", "u3", 12, Added, "1");
    other_cluster.cluster = "east".into();
    w.apply(rec(other_cluster));
    w.apply(Record::Event {
        destination: "another.topic".into(),
        event: Box::new(event("kept", "u4", 13, Added, "1")),
    });
    let kind = crate::event::MarkerKind::Begin {
        label_selector: None,
        expected: Some(0),
    };
    w.apply(marker("s1", kind, true));
    let kind = crate::event::MarkerKind::End {
        sent: 0,
        skipped: 0,
        pruned: 0,
        result: Complete,
    };
    assert_eq!(
        marker_changes(w.apply(marker("s1", kind, true))),
        ["deleted old", "complete s1 1"],
        "namespace ns of cluster c on this topic only"
    );
    assert_eq!(w.store().len(), 3);
}

#[test]
fn a_failed_snapshot_an_end_without_begin_and_a_label_selector_remove_nothing() {
    let mut w = Writer::new();
    w.apply(rec(event("stale", "u1", 10, Added, "1")));
    w.apply(begin("failed", None));
    let failed = w.apply(end("failed", Failed("the request was deleted".into())));
    assert_eq!(marker_changes(failed), Vec::<String>::new());
    assert_eq!(
        marker_changes(w.apply(end("never-begun", Complete))),
        Vec::<String>::new(),
        "no begin read: no way to tell what changed since"
    );
    w.apply(begin("selected", Some("app=web")));
    assert_eq!(
        marker_changes(w.apply(end("selected", Complete))),
        ["complete selected 0"],
        "membership of a label selector cannot be judged: nothing pruned"
    );
    assert_eq!(names(&w.store()), ["stale"]);
}

#[test]
fn a_begin_marker_sent_again_keeps_the_first_position() {
    let mut w = Writer::new();
    w.apply(rec(event("a", "ua", 10, Added, "1")));
    w.apply(begin("s1", None));
    w.apply(rec(snapshot_event("a", "ua", 10, "s1")));
    // The bridge restarted during the snapshot: its begin marker again, a resumed walk.
    w.apply(begin("s1", None));
    assert_eq!(
        marker_changes(w.apply(end("s1", Complete))),
        ["complete s1 0"]
    );
    assert_eq!(names(&w.store()), ["a"]);
}

#[test]
fn timestamps_order_events_read_from_several_partitions() {
    let mut w = Writer::new();
    // Read first, from a partition ahead of the markers' one, but published after the begin
    // marker: b's live change. gone: published before it.
    w.apply_at(rec(event("b", "ub", 20, Added, "2")), 2_000_000);
    w.apply_at(rec(event("gone", "ug", 5, Added, "1")), 1_000_000);
    // Within the clock margin before the begin marker: counts as after it.
    w.apply_at(rec(event("close", "uc", 6, Added, "1")), 1_999_000);
    w.apply_at(begin("s1", None), 2_000_000);
    assert_eq!(
        marker_changes(w.apply_at(end("s1", Complete), 2_100_000)),
        ["deleted gone", "complete s1 1"]
    );
    assert_eq!(names(&w.store()), ["b", "close"]);
}
