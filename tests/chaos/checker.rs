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
//!   already received for its uid (equal is allowed for a repaired delete, and for a snapshot
//!   on demand's event, which repeats the version of the last live event under its own id
//!   `{uid}:{resourceVersion}:{snapshotid}`);
//! - at quiescence the consumer crate's store equals the live objects of every watch, and a
//!   compacted topic replayed from its start equals the live objects by name;
//! - every snapshot on demand the campaign requested ended (`snapshot-unfinished`): its
//!   request reached `Complete` or `Failed` once the round was quiet, a failed one says why, and
//!   a complete one has exactly one end marker with `result: complete`, its begin marker
//!   received before it (`snapshot-markers`);
//! - a complete snapshot covers its scope (`snapshot-coverage`): see [`check_coverage`].
//!
//! Promises of writes are judged on live and repaired events alone: a snapshot's event never
//! excuses a lost live event.
//!
//! Writes are made only after every watch published its initial snapshot, so every write is
//! after its watch's snapshot point (docs/guarantees.md, "What the fault campaign checks").

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::history::{Change, Evidence, MarkerSeen, Requested, Seen, WatchKey, Write};

/// A broken promise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Anomaly {
    /// Which rule: `lost-version`, `lost-delete`, `lost-object`, `invented`, `two-ids`,
    /// `out-of-order`, `store-differs`, `compacted-differs`, `snapshot-unfinished`,
    /// `snapshot-markers`, `snapshot-coverage`, `stuck-while-ready`, `exited`.
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
    let live: Vec<Seen> = evidence
        .seen
        .iter()
        .filter(|s| s.snapshot.is_none())
        .cloned()
        .collect();
    let live_by_uid = group_seen(&live);
    let relisted = evidence.seen.iter().any(|s| s.repaired);
    let mut anomalies = Vec::new();
    anomalies.extend(check_promises(evidence, &live_by_uid, relisted));
    anomalies.extend(check_invented(evidence));
    anomalies.extend(check_ids(&by_uid));
    anomalies.extend(check_order(&by_uid));
    anomalies.extend(check_store(evidence));
    anomalies.extend(check_compacted(evidence));
    anomalies.extend(check_snapshots_end(evidence));
    anomalies.extend(check_coverage(evidence));
    anomalies
}

/// Whether `s` is a snapshot on demand's event under its own id `{uid}:{rv}:{snapshotid}`.
fn snapshot_event(s: &Seen) -> bool {
    s.snapshot
        .as_ref()
        .is_some_and(|id| s.id == format!("{}:{}:{id}", s.uid, s.rv))
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
            // A repaired delete, and a snapshot's event, repeat a version under their own id.
            let repeats = (s.repaired && s.change == Change::Deleted) || snapshot_event(s);
            if !repeats {
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
                // A snapshot's event may repeat the newest version, never go below it.
                let back = if snapshot_event(s) {
                    s.rv < n.rv
                } else {
                    s.rv <= n.rv
                };
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

/// Every requested snapshot ended once the round was quiet: `Complete` with exactly one end
/// marker `result: complete` received (duplicates of one marker id count once), its begin marker
/// received before it (on Kafka, whose partitions are read in no common order, received at
/// all), and no failed end marker; or `Failed` with a message. A request still `Pending` or
/// `Running` is a snapshot that vanished silently.
fn check_snapshots_end(evidence: &Evidence) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    for r in &evidence.requested {
        let of = |kind, detail: String| Anomaly::of(kind, &r.watch, &r.name, &r.uid, detail);
        let markers: Vec<(usize, &MarkerSeen)> = evidence
            .markers
            .iter()
            .enumerate()
            .filter(|(_, m)| m.snapshot == r.uid)
            .collect();
        let complete: BTreeSet<&str> = markers
            .iter()
            .filter(|(_, m)| m.end == Some(Ok(())))
            .map(|(_, m)| m.id.as_str())
            .collect();
        let failed: Vec<&str> = markers
            .iter()
            .filter_map(|(_, m)| m.end.as_ref()?.as_ref().err().map(String::as_str))
            .collect();
        let ids = markers.iter().map(|(_, m)| m.id.clone()).collect();
        match r.phase.as_str() {
            "Complete" => {
                let first_end = markers
                    .iter()
                    .find(|(_, m)| m.end == Some(Ok(())))
                    .map(|(i, _)| *i);
                let begin = markers
                    .iter()
                    .find(|(_, m)| m.end.is_none())
                    .map(|(i, _)| *i);
                let why = if complete.len() != 1 {
                    Some(format!(
                        "the request is Complete, {} end markers with result complete arrived",
                        complete.len()
                    ))
                } else if !failed.is_empty() {
                    Some(format!(
                        "the request is Complete, a failed end marker arrived too: {failed:?}"
                    ))
                } else if begin.is_none() {
                    Some("the request is Complete, its begin marker never arrived".into())
                } else if evidence.ordered && begin > first_end {
                    Some("its begin marker arrived after its end marker".into())
                } else {
                    None
                };
                anomalies.extend(why.map(|w| of("snapshot-markers", w).with_ids(ids)));
            }
            "Failed" => {
                if r.message.as_deref().is_none_or(str::is_empty) {
                    anomalies.push(of(
                        "snapshot-unfinished",
                        "the request failed without a message".into(),
                    ));
                }
                if !complete.is_empty() {
                    anomalies.push(
                        of(
                            "snapshot-markers",
                            "the request is Failed, an end marker says complete".into(),
                        )
                        .with_ids(ids),
                    );
                }
            }
            phase => anomalies.push(
                of(
                    "snapshot-unfinished",
                    format!(
                        "the request is still {:?} after the round's quiet period ({} markers arrived)",
                        if phase.is_empty() { "Pending" } else { phase },
                        markers.len()
                    ),
                )
                .with_ids(ids),
            ),
        }
    }
    anomalies
}

/// A complete snapshot covers its scope. The objects it must cover are those the workload's
/// history shows in the watch's scope when the request was sent (their last write acknowledged
/// before it leaves them selected; the begin marker is published after the request exists)
/// and not deleted nor moved out of the selector by a write sent before the end marker
/// arrived (a write sent after that came after the end marker was published); objects with a
/// write of unknown outcome are left out. Then:
/// - the end marker's `sent + skipped` is at least their number (every one of them was read),
///   and at least `sent` distinct objects arrived with the snapshot's id;
/// - where the consumer's arrival order is the publishing order of the watch (NATS, HTTP:
///   [`Evidence::ordered`]), each of them has, between the first begin marker and the end
///   marker, an event with the snapshot's id or a live event, the newest at least the version
///   it had when the request was sent (its state at the begin marker is no older). On Kafka
///   the markers and the objects lie in several partitions, read in no common order: only the
///   counts are checked there.
fn check_coverage(evidence: &Evidence) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    for r in evidence.requested.iter().filter(|r| r.phase == "Complete") {
        let mine = |m: &&MarkerSeen| m.snapshot == r.uid;
        let begin = evidence
            .markers
            .iter()
            .filter(mine)
            .find(|m| m.end.is_none());
        let end = evidence
            .markers
            .iter()
            .filter(mine)
            .find(|m| m.end == Some(Ok(())));
        let (Some(begin), Some(end)) = (begin, end) else {
            continue; // reported by check_snapshots_end
        };
        let required = required_objects(evidence, r, end.at_ms);
        let of = |name: &str, uid: &str, detail: String| {
            Anomaly::of("snapshot-coverage", &r.watch, name, uid, detail)
                .with_ids(vec![r.uid.clone()])
        };
        if end.sent + end.skipped < required.len() as u64 {
            anomalies.push(of(
                &r.name,
                &r.uid,
                format!(
                    "the end marker counts {} sent and {} skipped, {} objects existed throughout",
                    end.sent,
                    end.skipped,
                    required.len()
                ),
            ));
        }
        let received: BTreeSet<&str> = evidence
            .seen
            .iter()
            .filter(|s| s.snapshot.as_deref() == Some(r.uid.as_str()))
            .map(|s| s.uid.as_str())
            .collect();
        if (received.len() as u64) < end.sent {
            anomalies.push(of(
                &r.name,
                &r.uid,
                format!(
                    "the end marker counts {} sent, {} objects arrived with the snapshot's id",
                    end.sent,
                    received.len()
                ),
            ));
        }
        if !evidence.ordered || begin.after > end.after {
            continue;
        }
        let window = &evidence.seen[begin.after..end.after];
        for (uid, (name, version)) in &required {
            let newest = window
                .iter()
                .filter(|s| s.uid == *uid)
                .filter(|s| s.snapshot.is_none() || s.snapshot.as_deref() == Some(r.uid.as_str()))
                .map(|s| s.rv)
                .max();
            if newest.is_none_or(|n| n < *version) {
                anomalies.push(of(
                    name,
                    uid,
                    format!(
                        "snapshot {} ({}) is complete, and between its markers the object, at resourceVersion {version} or newer throughout, {}",
                        r.uid,
                        r.name,
                        newest.map_or("got no event".to_string(), |n| format!(
                            "got nothing newer than {n}"
                        ))
                    ),
                ));
            }
        }
    }
    anomalies
}

/// The objects of `r`'s watch in its scope from before the request until after `end_ms`: uid
/// to (name, the resourceVersion of its last write acknowledged before the request).
fn required_objects<'a>(
    evidence: &'a Evidence,
    r: &Requested,
    end_ms: u64,
) -> BTreeMap<&'a str, (&'a str, u64)> {
    let mut before: BTreeMap<&str, &Write> = BTreeMap::new();
    for w in evidence.writes[..r.writes_before.min(evidence.writes.len())]
        .iter()
        .filter(|w| w.watch == r.watch)
    {
        before.insert(&w.uid, w);
    }
    let left: BTreeSet<&str> = evidence.writes[r.writes_before.min(evidence.writes.len())..]
        .iter()
        .filter(|w| w.watch == r.watch && !w.visible && w.at_ms <= end_ms)
        .map(|w| w.uid.as_str())
        .collect();
    before
        .into_iter()
        .filter(|(uid, w)| w.visible && !left.contains(uid))
        .filter(|(_, w)| {
            !evidence
                .uncertain
                .contains(&(w.watch.clone(), w.name.clone()))
        })
        .map(|(uid, w)| (uid, (w.name.as_str(), w.rv)))
        .collect()
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
            snapshot: None,
        }
    }

    /// An event of snapshot `id` at arrival time `at_ms`.
    fn snap(uid: &str, rv: u64, id: &str, at_ms: u64) -> Seen {
        Seen {
            at_ms,
            id: format!("{uid}:{rv}:{id}"),
            snapshot: Some(id.into()),
            ..seen(uid, rv, Change::Added, false)
        }
    }

    /// A marker of snapshot `id` after `after` events; `end`: see [`MarkerSeen::end`].
    fn marker(id: &str, after: usize, at_ms: u64, end: Option<Result<(), String>>) -> MarkerSeen {
        let which = if end.is_some() { "end" } else { "begin" };
        MarkerSeen {
            at_ms,
            after,
            id: format!("{id}:w:{which}"),
            snapshot: id.into(),
            end,
            sent: 0,
            skipped: 0,
        }
    }

    fn requested(uid: &str, phase: &str, writes_before: usize) -> Requested {
        Requested {
            name: format!("req-{uid}"),
            uid: uid.into(),
            watch: watch(),
            at_ms: 0,
            writes_before,
            phase: phase.into(),
            message: None,
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
    #[test]
    fn a_snapshot_event_may_repeat_the_last_version_but_never_go_back() {
        let mut evidence = Evidence {
            writes: vec![write("a", 1, Op::Create), write("a", 2, Op::Update)],
            seen: vec![
                seen("a", 1, Change::Added, false),
                seen("a", 2, Change::Modified, false),
                snap("a", 2, "s1", 0),
            ],
            live: live(&[("a", 2)]),
            store: live(&[("a", 2)]),
            ..Evidence::default()
        };
        assert_eq!(kinds(&evidence), Vec::<&str>::new());
        // An older version from a snapshot goes back.
        evidence.seen[2] = snap("a", 1, "s1", 0);
        assert_eq!(kinds(&evidence), vec!["out-of-order"]);
        // A live event repeating a version under another id is still two ids going back.
        let mut again = seen("a", 2, Change::Modified, false);
        again.id = "a:2:other".into();
        evidence.seen[2] = again;
        assert_eq!(kinds(&evidence), vec!["two-ids", "out-of-order"]);
        // So is a live event repeating a snapshot's version after it.
        evidence.seen = vec![
            seen("a", 1, Change::Added, false),
            snap("a", 2, "s1", 0),
            seen("a", 2, Change::Modified, false),
        ];
        assert_eq!(kinds(&evidence), vec!["out-of-order"]);
    }

    #[test]
    fn a_snapshot_event_does_not_excuse_a_lost_live_version() {
        let evidence = Evidence {
            writes: vec![write("a", 1, Op::Create), write("a", 2, Op::Update)],
            seen: vec![seen("a", 1, Change::Added, false), snap("a", 2, "s1", 0)],
            live: live(&[("a", 2)]),
            store: live(&[("a", 2)]),
            ..Evidence::default()
        };
        assert_eq!(kinds(&evidence), vec!["lost-version"]);
    }

    /// One object `a` written before the request, a snapshot `s1` of it between its markers.
    fn snapshotted() -> Evidence {
        let mut end = marker("s1", 2, 20, Some(Ok(())));
        end.sent = 1;
        Evidence {
            writes: vec![write("a", 1, Op::Create)],
            seen: vec![seen("a", 1, Change::Added, false), snap("a", 1, "s1", 15)],
            markers: vec![marker("s1", 1, 10, None), end],
            requested: vec![requested("s1", "Complete", 1)],
            live: live(&[("a", 1)]),
            store: live(&[("a", 1)]),
            ordered: true,
            ..Evidence::default()
        }
    }

    #[test]
    fn a_complete_snapshot_with_its_markers_has_no_anomaly() {
        assert_eq!(kinds(&snapshotted()), Vec::<&str>::new());
    }

    #[test]
    fn a_request_left_running_or_failed_without_a_message_is_found() {
        let mut evidence = snapshotted();
        evidence.requested[0].phase = "Running".into();
        assert_eq!(kinds(&evidence), vec!["snapshot-unfinished"]);
        evidence.requested[0].phase = String::new();
        assert_eq!(kinds(&evidence), vec!["snapshot-unfinished"]);
        evidence.markers.pop();
        evidence.seen.pop();
        evidence.requested[0].phase = "Failed".into();
        assert_eq!(kinds(&evidence), vec!["snapshot-unfinished"]);
        evidence.requested[0].message = Some("the request was deleted".into());
        assert_eq!(kinds(&evidence), Vec::<&str>::new());
    }

    #[test]
    fn a_complete_request_needs_one_complete_end_marker_after_its_begin_marker() {
        // The end marker never arrived.
        let mut evidence = snapshotted();
        evidence.markers.pop();
        assert_eq!(kinds(&evidence), vec!["snapshot-markers"]);
        // The same end marker twice counts once; two different ones do not.
        let mut evidence = snapshotted();
        evidence.markers.push(evidence.markers[1].clone());
        assert_eq!(kinds(&evidence), Vec::<&str>::new());
        evidence.markers[2].id = "s1:other:end".into();
        assert_eq!(kinds(&evidence), vec!["snapshot-markers"]);
        // A failed end marker beside the complete one.
        let mut evidence = snapshotted();
        let mut failed = marker("s1", 2, 21, Some(Err("deleted".into())));
        failed.id = "s1:other:end".into();
        evidence.markers.push(failed);
        assert_eq!(kinds(&evidence), vec!["snapshot-markers"]);
        // No begin marker, or one after the end marker.
        let mut evidence = snapshotted();
        evidence.markers.remove(0);
        assert_eq!(kinds(&evidence), vec!["snapshot-markers"]);
        let mut evidence = snapshotted();
        evidence.markers.swap(0, 1);
        assert_eq!(kinds(&evidence), vec!["snapshot-markers"]);
        // On Kafka, order across partitions is not judged.
        evidence.ordered = false;
        assert_eq!(kinds(&evidence), Vec::<&str>::new());
        // A Failed request whose end marker says complete.
        let mut evidence = snapshotted();
        evidence.requested[0].phase = "Failed".into();
        evidence.requested[0].message = Some("x".into());
        assert_eq!(kinds(&evidence), vec!["snapshot-markers"]);
    }

    #[test]
    fn an_object_existing_throughout_must_be_covered_between_the_markers() {
        // `a` got nothing between the markers: not covered.
        let mut evidence = snapshotted();
        evidence.seen.pop();
        evidence.markers[1].after = 1;
        evidence.markers[1].sent = 0;
        evidence.markers[1].skipped = 1;
        assert_eq!(kinds(&evidence), vec!["snapshot-coverage"]);
        // A newer live event between the markers covers it.
        evidence.writes.push(write("a", 2, Op::Update));
        evidence.seen.push(seen("a", 2, Change::Modified, false));
        evidence.markers[1].after = 2;
        evidence.live = live(&[("a", 2)]);
        evidence.store = live(&[("a", 2)]);
        assert_eq!(kinds(&evidence), Vec::<&str>::new());
        // The snapshot's event before the begin marker does not.
        let mut evidence = snapshotted();
        evidence.seen.swap(0, 1);
        evidence.markers[0].after = 2;
        evidence.markers[1].after = 2;
        let found = kinds(&evidence);
        assert!(found.contains(&"snapshot-coverage"), "{found:?}");
        // An older live event between the markers does not.
        let mut evidence = snapshotted();
        evidence.writes.push(write("a", 2, Op::Update));
        evidence.requested[0].writes_before = 2;
        evidence.seen = vec![
            seen("a", 2, Change::Modified, false),
            seen("a", 1, Change::Added, false),
        ];
        evidence.markers[1].sent = 0;
        evidence.markers[1].skipped = 1;
        evidence.live = live(&[("a", 2)]);
        evidence.store = live(&[("a", 2)]);
        let found = kinds(&evidence);
        assert!(found.contains(&"snapshot-coverage"), "{found:?}");
    }

    #[test]
    fn objects_created_after_the_request_or_deleted_before_the_end_need_no_coverage() {
        let mut evidence = snapshotted();
        evidence.seen.pop();
        evidence.markers[1].after = 1;
        evidence.markers[1].sent = 0;
        evidence.markers[1].skipped = 1;
        // Created after the request was sent.
        evidence.requested[0].writes_before = 0;
        assert_eq!(kinds(&evidence), Vec::<&str>::new());
        // Deleted by a write sent before the end marker arrived.
        evidence.requested[0].writes_before = 1;
        let mut gone = write("a", 2, Op::Delete);
        gone.at_ms = 19;
        evidence.writes.push(gone);
        evidence.seen.push(seen("a", 2, Change::Deleted, false));
        evidence.live = live(&[]);
        evidence.store = live(&[]);
        assert_eq!(kinds(&evidence), Vec::<&str>::new());
        // Deleted after it: required.
        evidence.writes[1].at_ms = 21;
        assert_eq!(kinds(&evidence), vec!["snapshot-coverage"]);
    }

    #[test]
    fn end_marker_counts_below_what_existed_or_arrived_are_found_on_kafka_too() {
        let mut evidence = snapshotted();
        evidence.ordered = false;
        evidence.markers[1].sent = 0;
        assert_eq!(kinds(&evidence), vec!["snapshot-coverage"]);
        evidence.markers[1].sent = 2;
        assert_eq!(kinds(&evidence), vec!["snapshot-coverage"]);
        evidence.markers[1].sent = 1;
        assert_eq!(kinds(&evidence), Vec::<&str>::new());
    }
}
