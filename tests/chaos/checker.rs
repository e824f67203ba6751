//! The checker: decides from the evidence alone (writes, events received, live state) whether a
//! deployment kept the promises of docs/guarantees.md. It knows nothing of the bridge's
//! internals.
//!
//! The rules, per object (uid):
//! - every version the workload wrote while the watch selected the object arrives, except a
//!   version superseded before a relist, which may be missing only when the object's next event
//!   after it is `origin=repaired` (or the object's delete arrived repaired);
//! - every delete (or departure from a label selector) arrives, live with its resourceVersion
//!   or repaired;
//! - an object none of whose events arrived is allowed only if it no longer exists and the
//!   deployment relisted (some repaired event arrived): its whole life fell in a gap;
//! - nothing is invented: every (uid, resourceVersion) received was written;
//! - one id per (uid, resourceVersion): only a repaired delete may share the resourceVersion
//!   of the object's previous event;
//! - per-object order: an event not seen before never has a lower resourceVersion than one
//!   already received for its uid (equal is allowed for a repaired delete);
//! - at quiescence the consumer crate's store equals the live objects of every watch, and a
//!   compacted topic replayed from its start equals the live objects by name.
//!
//! Writes are made only after every watch published its initial snapshot, so every write is
//! after its watch's snapshot point (docs/guarantees.md, "What the fault campaign checks").

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::history::{Change, Evidence, Seen, WatchKey, Write};

/// A broken promise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Anomaly {
    /// Which rule: `lost-version`, `lost-delete`, `lost-object`, `invented`, `two-ids`,
    /// `out-of-order`, `store-differs`, `compacted-differs`, `stuck-while-ready`, `exited`.
    pub kind: &'static str,
    /// The watch.
    pub watch: String,
    /// The object's name (empty when not about one object).
    pub object: String,
    /// The uid.
    pub uid: String,
    /// Event ids or resourceVersions involved.
    pub ids: Vec<String>,
    /// What is wrong.
    pub detail: String,
}

impl Anomaly {
    fn of(kind: &'static str, watch: &WatchKey, name: &str, uid: &str, detail: String) -> Self {
        Anomaly {
            kind,
            watch: watch.to_string(),
            object: name.to_string(),
            uid: uid.to_string(),
            ids: Vec::new(),
            detail,
        }
    }

    fn with_ids(mut self, ids: Vec<String>) -> Self {
        self.ids = ids;
        self
    }
}

/// Checks one deployment's evidence.
pub fn check(evidence: &Evidence) -> Vec<Anomaly> {
    let by_uid = group_seen(&evidence.seen);
    let relisted = evidence.seen.iter().any(|s| s.repaired);
    let mut anomalies = Vec::new();
    anomalies.extend(check_promises(evidence, &by_uid, relisted));
    anomalies.extend(check_invented(evidence));
    anomalies.extend(check_ids(&by_uid));
    anomalies.extend(check_order(&by_uid));
    anomalies.extend(check_store(evidence));
    anomalies.extend(check_compacted(evidence));
    anomalies
}

/// Events per uid, in arrival order.
fn group_seen(seen: &[Seen]) -> BTreeMap<&str, Vec<&Seen>> {
    let mut by_uid: BTreeMap<&str, Vec<&Seen>> = BTreeMap::new();
    for s in seen {
        by_uid.entry(&s.uid).or_default().push(s);
    }
    by_uid
}

/// Every promised version and delete arrived, or was excused by a relist.
fn check_promises(
    evidence: &Evidence,
    by_uid: &BTreeMap<&str, Vec<&Seen>>,
    relisted: bool,
) -> Vec<Anomaly> {
    let mut writes: BTreeMap<&str, Vec<&Write>> = BTreeMap::new();
    for w in &evidence.writes {
        writes.entry(&w.uid).or_default().push(w);
    }
    // When each watch's last repaired event arrived (a relist happened before then).
    let mut repaired_at: BTreeMap<&WatchKey, Vec<u64>> = BTreeMap::new();
    for s in evidence.seen.iter().filter(|s| s.repaired) {
        repaired_at.entry(&s.watch).or_default().push(s.at_ms);
    }
    let mut anomalies = Vec::new();
    for (uid, writes) in writes {
        let seen = by_uid.get(uid).map(Vec::as_slice).unwrap_or_default();
        let first = writes[0];
        let exists = evidence
            .live
            .get(&first.watch)
            .is_some_and(|l| l.contains_key(uid));
        if seen.is_empty() && writes.iter().any(|w| w.promise().is_some()) {
            if !relisted || exists {
                anomalies.push(Anomaly::of(
                    "lost-object",
                    &first.watch,
                    &first.name,
                    uid,
                    format!(
                        "no event arrived for an object written {} times{}",
                        writes.len(),
                        if exists { " that still exists" } else { "" }
                    ),
                ));
            }
            continue;
        }
        let gap = Gap {
            exists,
            repaired_at: repaired_at.get(&first.watch).cloned().unwrap_or_default(),
            newest_written: writes.iter().map(|w| w.rv).max().unwrap_or(0),
        };
        for w in &writes {
            if let Some(mut anomaly) = check_one_promise(w, seen, &gap) {
                anomaly
                    .detail
                    .push_str(&format!("; {}", story(&writes, seen)));
                anomalies.push(anomaly);
            }
        }
    }
    anomalies
}

/// The object's writes and events, for a report: `rv:op:visible` and `id[:repaired]`.
fn story(writes: &[&Write], seen: &[&Seen]) -> String {
    let writes: Vec<String> = writes
        .iter()
        .map(|w| format!("{}:{:?}:{}", w.rv, w.op, w.visible))
        .collect();
    let seen: Vec<String> = seen
        .iter()
        .map(|s| format!("{}{}", s.id, if s.repaired { ":repaired" } else { "" }))
        .collect();
    format!("writes {writes:?}, events {seen:?}")
}

/// Whether the object's remaining life after `w` fell in a gap the watch then repaired: no
/// event of it after `w`, its last event received a delete, it is gone at the end, and its
/// watch relisted (a repaired event arrived) after `w` was written. The relist found it absent,
/// as the consumer already has it, so nothing was owed.
fn unseen_to_its_end(w: &Write, seen: &[&Seen], gap: &Gap) -> bool {
    // A delete answered without its version (0) came after every other write.
    let rv = if w.rv == 0 { gap.newest_written } else { w.rv };
    let later = seen.iter().any(|s| s.rv > rv);
    let ends_deleted = seen.last().is_some_and(|s| s.change == Change::Deleted);
    !later && ends_deleted && !gap.exists && gap.relisted_between(w.at_ms, u64::MAX)
}

/// What the checker knows of an object's watch at the end.
struct Gap {
    /// Whether the object exists at the end.
    exists: bool,
    /// When the watch's repaired events arrived (a relist happened before each).
    repaired_at: Vec<u64>,
    /// The newest resourceVersion the workload was told for the object.
    newest_written: u64,
}

impl Gap {
    /// Whether the watch relisted between `from` and `to` (a repaired event of it arrived).
    fn relisted_between(&self, from: u64, to: u64) -> bool {
        self.repaired_at.iter().any(|t| (from..=to).contains(t))
    }
}

/// Whether `next`, the first event after a missing version, is an appearance to a consumer
/// for whom the object was absent (nothing of it received before, or its last event before
/// `next` a delete: it had left the label selector) after a relist of its watch that came
/// after the missing write: the object was outside the watch (beyond a label selector) when
/// the relist found it absent, so there was nothing to repair, and it appeared live later.
fn appeared_after_a_relist(w: &Write, next: &Seen, seen: &[&Seen], gap: &Gap) -> bool {
    let before = seen
        .iter()
        .filter(|s| s.rv < next.rv)
        .max_by_key(|s| (s.rv, s.at_ms));
    let absent = before.is_none_or(|s| s.change == Change::Deleted);
    absent && next.change == Change::Added && gap.relisted_between(w.at_ms, next.at_ms)
}

/// Whether the promise of one write was kept.
fn check_one_promise(w: &Write, seen: &[&Seen], gap: &Gap) -> Option<Anomaly> {
    let delete = w.promise()?;
    if unseen_to_its_end(w, seen, gap) {
        return None;
    }
    let repaired_delete = seen
        .iter()
        .any(|s| s.repaired && s.change == Change::Deleted);
    let next = seen
        .iter()
        .filter(|s| s.rv > w.rv)
        .min_by_key(|s| (s.rv, s.at_ms));
    if delete {
        // A delete answered with a Status has no known resourceVersion (0): any later delete
        // of the uid keeps it. A departure from a label selector superseded (the object came
        // back) while the history was lost is excused like any version.
        let kept = repaired_delete
            || next.is_some_and(|n| n.repaired || appeared_after_a_relist(w, n, seen, gap))
            || seen.iter().any(|s| {
                s.change == Change::Deleted
                    && (s.rv == w.rv || (w.rv == 0 && s.rv > gap.newest_written))
            });
        return (!kept).then(|| {
            Anomaly::of(
                "lost-delete",
                &w.watch,
                &w.name,
                &w.uid,
                format!("the delete at resourceVersion {} never arrived", w.rv),
            )
            .with_ids(vec![w.rv.to_string()])
        });
    }
    if seen
        .iter()
        .any(|s| s.rv == w.rv && s.change != Change::Deleted)
    {
        return None;
    }
    let excused = match next {
        Some(next) => next.repaired || appeared_after_a_relist(w, next, seen, gap),
        None => repaired_delete,
    };
    (!excused).then(|| {
        Anomaly::of(
            "lost-version",
            &w.watch,
            &w.name,
            &w.uid,
            format!(
                "resourceVersion {} ({:?}) never arrived; the next event received is {}",
                w.rv,
                w.op,
                next.map_or("none".to_string(), |n| format!(
                    "{} ({})",
                    n.id,
                    if n.repaired {
                        "repaired"
                    } else {
                        "not repaired"
                    }
                ))
            ),
        )
        .with_ids(vec![w.rv.to_string()])
    })
}

/// Every (uid, resourceVersion) received was written (a delete whose resourceVersion the API
/// server did not tell: any delete of that uid newer than its other writes).
fn check_invented(evidence: &Evidence) -> Vec<Anomaly> {
    let written: BTreeSet<(&str, u64)> = evidence
        .writes
        .iter()
        .map(|w| (w.uid.as_str(), w.rv))
        .collect();
    let mut newest: BTreeMap<&str, u64> = BTreeMap::new();
    for w in &evidence.writes {
        let n = newest.entry(&w.uid).or_default();
        *n = (*n).max(w.rv);
    }
    let unknown_delete = |s: &Seen| {
        s.change == Change::Deleted
            && written.contains(&(s.uid.as_str(), 0))
            && newest.get(s.uid.as_str()).is_some_and(|n| s.rv >= *n)
    };
    let mut reported = BTreeSet::new();
    evidence
        .seen
        .iter()
        .filter(|s| !written.contains(&(s.uid.as_str(), s.rv)) && !unknown_delete(s))
        .filter(|s| {
            !evidence
                .uncertain
                .contains(&(s.watch.clone(), s.name.clone()))
        })
        .filter(|s| reported.insert(s.id.clone()))
        .map(|s| {
            Anomaly::of(
                "invented",
                &s.watch,
                &s.name,
                &s.uid,
                format!("no write made resourceVersion {}", s.rv),
            )
            .with_ids(vec![s.id.clone()])
        })
        .collect()
}

/// One id per (uid, resourceVersion), but for a repaired delete.
fn check_ids(by_uid: &BTreeMap<&str, Vec<&Seen>>) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    for (uid, seen) in by_uid {
        let mut ids: BTreeMap<u64, BTreeSet<&str>> = BTreeMap::new();
        for s in seen {
            if !(s.repaired && s.change == Change::Deleted) {
                ids.entry(s.rv).or_default().insert(&s.id);
            }
        }
        for (rv, ids) in ids.into_iter().filter(|(_, ids)| ids.len() > 1) {
            anomalies.push(
                Anomaly::of(
                    "two-ids",
                    &seen[0].watch,
                    &seen[0].name,
                    uid,
                    format!("resourceVersion {rv} arrived under {} ids", ids.len()),
                )
                .with_ids(ids.into_iter().map(str::to_string).collect()),
            );
        }
    }
    anomalies
}

/// An event not seen before never goes back in resourceVersion for its uid.
fn check_order(by_uid: &BTreeMap<&str, Vec<&Seen>>) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    for (uid, seen) in by_uid {
        let mut ids = BTreeSet::new();
        let mut newest: Option<&Seen> = None;
        for s in seen {
            if !ids.insert(&s.id) {
                continue;
            }
            // A repaired delete carries the last version the repairing replica knew, which may
            // be older than what a predecessor published after its last checkpoint: deletes are
            // never dropped for their sequence (docs/guarantees.md, "How to deduplicate").
            let repaired_delete = s.repaired && s.change == Change::Deleted;
            if let Some(n) = newest.filter(|_| !repaired_delete) {
                let back = s.rv <= n.rv;
                if back {
                    anomalies.push(
                        Anomaly::of(
                            "out-of-order",
                            &s.watch,
                            &s.name,
                            uid,
                            format!("{} arrived after {}", s.id, n.id),
                        )
                        .with_ids(vec![n.id.clone(), s.id.clone()]),
                    );
                }
            }
            if newest.is_none_or(|n| s.rv > n.rv) {
                newest = Some(s);
            }
        }
    }
    anomalies
}

/// The consumer crate's store equals the live objects of every watch.
fn check_store(evidence: &Evidence) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    let empty = BTreeMap::new();
    let watches: BTreeSet<&WatchKey> = evidence.live.keys().chain(evidence.store.keys()).collect();
    for watch in watches {
        let live = evidence.live.get(watch).unwrap_or(&empty);
        let store = evidence.store.get(watch).unwrap_or(&empty);
        for (uid, rv) in live {
            if store.get(uid) != Some(rv) {
                anomalies.push(Anomaly::of(
                    "store-differs",
                    watch,
                    "",
                    uid,
                    format!(
                        "live at resourceVersion {rv}, the consumer store holds {}",
                        store.get(uid).map_or("nothing".into(), |r| r.to_string())
                    ),
                ));
            }
        }
        for (uid, rv) in store.iter().filter(|(uid, _)| !live.contains_key(*uid)) {
            anomalies.push(Anomaly::of(
                "store-differs",
                watch,
                "",
                uid,
                format!("gone from the cluster, the consumer store holds resourceVersion {rv}"),
            ));
        }
    }
    anomalies
}

/// The last record of every key of the compacted topic is the live object (a tombstone: none).
fn check_compacted(evidence: &Evidence) -> Vec<Anomaly> {
    let Some((records, live)) = &evidence.compacted else {
        return Vec::new();
    };
    let mut last: HashMap<&str, &Option<(String, u64)>> = HashMap::new();
    for r in records {
        last.insert(&r.key, &r.value);
    }
    let keys: BTreeSet<&str> = last
        .keys()
        .copied()
        .chain(live.keys().map(String::as_str))
        .collect();
    let watch = WatchKey {
        resource: "compacted".into(),
        namespace: String::new(),
    };
    keys.into_iter()
        .filter_map(|key| {
            let now = live.get(key);
            let kept = last.get(key).and_then(|v| v.as_ref());
            (now != kept).then(|| {
                Anomaly::of(
                    "compacted-differs",
                    &watch,
                    key,
                    now.or(kept).map_or("", |(uid, _)| uid),
                    format!(
                        "live {}, the topic's last record {}",
                        now.map_or("absent".into(), |(u, r)| format!("{u} at {r}")),
                        match last.get(key) {
                            None => "absent".to_string(),
                            Some(None) => "a tombstone".to_string(),
                            Some(Some((u, r))) => format!("{u} at {r}"),
                        }
                    ),
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{KeyedRecord, Op};

    fn watch() -> WatchKey {
        WatchKey {
            resource: "configmaps".into(),
            namespace: "ns".into(),
        }
    }

    fn write(uid: &str, rv: u64, op: Op) -> Write {
        Write {
            at_ms: rv,
            watch: watch(),
            name: format!("n-{uid}"),
            uid: uid.into(),
            rv,
            op,
            was_visible: op != Op::Create,
            visible: op != Op::Delete,
        }
    }

    fn seen(uid: &str, rv: u64, change: Change, repaired: bool) -> Seen {
        let c = match change {
            Change::Added => "added",
            Change::Modified => "modified",
            Change::Deleted => "deleted",
        };
        Seen {
            at_ms: 0,
            id: format!("{uid}:{rv}:{c}"),
            watch: watch(),
            name: format!("n-{uid}"),
            uid: uid.into(),
            rv,
            change,
            repaired,
        }
    }

    fn kinds(evidence: &Evidence) -> Vec<&'static str> {
        check(evidence).into_iter().map(|a| a.kind).collect()
    }

    fn live(objects: &[(&str, u64)]) -> BTreeMap<WatchKey, BTreeMap<String, u64>> {
        let map = objects.iter().map(|(u, r)| (u.to_string(), *r)).collect();
        BTreeMap::from([(watch(), map)])
    }

    #[test]
    fn a_complete_history_has_no_anomaly() {
        let evidence = Evidence {
            writes: vec![
                write("a", 1, Op::Create),
                write("a", 2, Op::Update),
                write("a", 3, Op::Delete),
                write("b", 4, Op::Create),
            ],
            seen: vec![
                seen("a", 1, Change::Added, false),
                seen("a", 2, Change::Modified, false),
                seen("a", 2, Change::Modified, false),
                seen("b", 4, Change::Added, false),
                seen("a", 3, Change::Deleted, false),
            ],
            live: live(&[("b", 4)]),
            store: live(&[("b", 4)]),
            ..Evidence::default()
        };
        assert_eq!(kinds(&evidence), Vec::<&str>::new());
    }

    #[test]
    fn a_missing_version_is_excused_only_by_a_repaired_successor() {
        let mut evidence = Evidence {
            writes: vec![
                write("a", 1, Op::Create),
                write("a", 2, Op::Update),
                write("a", 3, Op::Update),
            ],
            seen: vec![
                seen("a", 1, Change::Added, false),
                seen("a", 3, Change::Modified, false),
            ],
            live: live(&[("a", 3)]),
            store: live(&[("a", 3)]),
            ..Evidence::default()
        };
        assert_eq!(kinds(&evidence), vec!["lost-version"]);
        evidence.seen[1].repaired = true;
        assert_eq!(kinds(&evidence), Vec::<&str>::new());
    }

    #[test]
    fn a_lost_delete_and_a_stale_store_are_found() {
        let evidence = Evidence {
            writes: vec![write("a", 1, Op::Create), write("a", 2, Op::Delete)],
            seen: vec![seen("a", 1, Change::Added, false)],
            live: live(&[]),
            store: live(&[("a", 1)]),
            ..Evidence::default()
        };
        assert_eq!(kinds(&evidence), vec!["lost-delete", "store-differs"]);
    }

    #[test]
    fn a_selector_departure_superseded_before_a_relist_is_excused() {
        let mut leave = write("a", 2, Op::Update);
        leave.visible = false;
        let mut back = write("a", 3, Op::Update);
        back.was_visible = false;
        let mut evidence = Evidence {
            writes: vec![write("a", 1, Op::Create), leave, back],
            seen: vec![
                seen("a", 1, Change::Added, false),
                seen("a", 3, Change::Added, false),
            ],
            live: live(&[("a", 3)]),
            store: live(&[("a", 3)]),
            ..Evidence::default()
        };
        assert_eq!(kinds(&evidence), vec!["lost-delete"]);
        evidence.seen[1].repaired = true;
        assert_eq!(kinds(&evidence), Vec::<&str>::new());
    }

    #[test]
    fn a_return_to_a_selector_lived_out_inside_a_gap_is_excused_only_after_a_relist() {
        let mut leave = write("a", 2, Op::Update);
        leave.visible = false;
        let mut back = write("a", 3, Op::Update);
        back.was_visible = false;
        let mut gone = write("a", 0, Op::Delete);
        gone.at_ms = 4;
        let mut evidence = Evidence {
            writes: vec![write("a", 1, Op::Create), leave, back, gone],
            seen: vec![
                seen("a", 1, Change::Added, false),
                seen("a", 2, Change::Deleted, false),
            ],
            live: live(&[("b", 9)]),
            store: live(&[("b", 9)]),
            ..Evidence::default()
        };
        evidence.writes.push(write("b", 9, Op::Create));
        evidence.seen.push(seen("b", 9, Change::Added, false));
        assert_eq!(kinds(&evidence), vec!["lost-version", "lost-delete"]);
        // The watch relisted after those writes (a repaired event arrived later).
        evidence.seen[2].repaired = true;
        evidence.seen[2].at_ms = 10;
        assert_eq!(kinds(&evidence), Vec::<&str>::new());
    }

    #[test]
    fn a_life_outside_the_selector_during_a_relist_is_excused_once_it_appears_live() {
        let mut leave = write("a", 2, Op::Update);
        leave.visible = false;
        let mut back = write("a", 3, Op::Update);
        back.was_visible = false;
        let mut added = seen("a", 3, Change::Added, false);
        added.at_ms = 20;
        let mut repaired = seen("b", 9, Change::Added, true);
        repaired.at_ms = 10;
        let mut evidence = Evidence {
            writes: vec![
                write("a", 1, Op::Create),
                leave,
                back,
                write("b", 9, Op::Create),
            ],
            seen: vec![added, repaired],
            live: live(&[("a", 3), ("b", 9)]),
            store: live(&[("a", 3), ("b", 9)]),
            ..Evidence::default()
        };
        assert_eq!(kinds(&evidence), Vec::<&str>::new());
        // Without a relist between the writes and the appearance, they were lost.
        evidence.seen[1].at_ms = 30;
        assert_eq!(kinds(&evidence), vec!["lost-version", "lost-delete"]);
    }

    #[test]
    fn a_return_and_departure_inside_a_relist_gap_after_a_departure_are_excused() {
        // In, out (its departure arrives), in and out again while the history is lost, then
        // in for good after the relist: the consumer saw it gone, then added.
        let mut leave = write("a", 2, Op::Update);
        leave.visible = false;
        let mut back = write("a", 3, Op::Update);
        back.was_visible = false;
        let mut again = write("a", 4, Op::Update);
        again.visible = false;
        let mut last = write("a", 5, Op::Update);
        last.was_visible = false;
        let mut added = seen("a", 5, Change::Added, false);
        added.at_ms = 20;
        let mut repaired = seen("b", 9, Change::Added, true);
        repaired.at_ms = 10;
        let mut evidence = Evidence {
            writes: vec![
                write("a", 1, Op::Create),
                leave,
                back,
                again,
                last,
                write("b", 9, Op::Create),
            ],
            seen: vec![
                seen("a", 1, Change::Added, false),
                seen("a", 2, Change::Deleted, false),
                added,
                repaired,
            ],
            live: live(&[("a", 5), ("b", 9)]),
            store: live(&[("a", 5), ("b", 9)]),
            ..Evidence::default()
        };
        assert_eq!(kinds(&evidence), Vec::<&str>::new());
        // Without a relist between the writes and the return, they were lost.
        evidence.seen[3].at_ms = 30;
        assert_eq!(kinds(&evidence), vec!["lost-version", "lost-delete"]);
        // Nor is a version lost while the consumer still holds the object excused.
        evidence.seen[3].at_ms = 10;
        evidence.seen.remove(1);
        assert!(kinds(&evidence).contains(&"lost-version"));
    }

    #[test]
    fn a_delete_answered_without_its_version_is_kept_by_any_later_delete() {
        let mut gone = write("a", 0, Op::Delete);
        gone.at_ms = 9;
        let evidence = Evidence {
            writes: vec![write("a", 1, Op::Create), gone],
            seen: vec![
                seen("a", 1, Change::Added, false),
                seen("a", 7, Change::Deleted, false),
            ],
            live: live(&[]),
            store: live(&[]),
            ..Evidence::default()
        };
        assert_eq!(kinds(&evidence), Vec::<&str>::new());
    }

    #[test]
    fn a_repaired_delete_may_repeat_the_last_known_version() {
        let evidence = Evidence {
            writes: vec![
                write("a", 1, Op::Create),
                write("a", 2, Op::Update),
                write("a", 3, Op::Delete),
            ],
            seen: vec![
                seen("a", 1, Change::Added, false),
                seen("a", 1, Change::Deleted, true),
            ],
            live: live(&[]),
            store: live(&[]),
            ..Evidence::default()
        };
        assert_eq!(kinds(&evidence), Vec::<&str>::new());
    }

    #[test]
    fn invented_versions_two_ids_and_going_back_are_found() {
        let evidence = Evidence {
            writes: vec![write("a", 1, Op::Create), write("a", 2, Op::Update)],
            seen: vec![
                seen("a", 1, Change::Added, false),
                seen("a", 2, Change::Modified, false),
                seen("a", 1, Change::Modified, false),
                seen("a", 9, Change::Modified, false),
            ],
            live: live(&[("a", 9)]),
            store: live(&[("a", 9)]),
            ..Evidence::default()
        };
        assert_eq!(
            kinds(&evidence),
            vec!["invented", "two-ids", "out-of-order"]
        );
    }

    #[test]
    fn an_object_never_seen_is_allowed_only_inside_a_relist_gap() {
        let mut evidence = Evidence {
            writes: vec![write("a", 1, Op::Create), write("a", 2, Op::Delete)],
            ..Evidence::default()
        };
        assert_eq!(kinds(&evidence), vec!["lost-object"]);
        evidence.writes.push(write("b", 3, Op::Create));
        evidence.seen.push(seen("b", 3, Change::Added, true));
        evidence.live = live(&[("b", 3)]);
        evidence.store = live(&[("b", 3)]);
        assert_eq!(kinds(&evidence), Vec::<&str>::new());
    }

    #[test]
    fn a_compacted_topic_ending_in_a_tombstone_for_a_live_name_is_found() {
        let record = |key: &str, value: Option<(&str, u64)>| KeyedRecord {
            key: key.into(),
            value: value.map(|(u, r)| (u.to_string(), r)),
        };
        let evidence = Evidence {
            compacted: Some((
                vec![
                    record("ns/x", Some(("old", 1))),
                    record("ns/x", Some(("new", 3))),
                    record("ns/x", None),
                ],
                BTreeMap::from([("ns/x".to_string(), ("new".to_string(), 3))]),
            )),
            ..Evidence::default()
        };
        assert_eq!(kinds(&evidence), vec!["compacted-differs"]);
    }
}
