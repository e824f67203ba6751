//! The checkpoint journal: what a checkpoint writes when few objects changed.
//!
//! A checkpoint is a *base* (the index buckets, see [`crate::known`]) plus the *journal records*
//! written since: each holds only the entries upserted and the uids removed since the checkpoint
//! before, so a checkpoint costs what changed, not what is known. Loading replays the records
//! over the base in order. A checkpoint *compacts* instead (rewrites the buckets changed since
//! the base and drops the journal) when
//!
//! - there is no base yet, the changes were too many to track one by one (a relist) or the whole
//!   index must be stored again ([`KnownObjects::mark_all_dirty`], after a failed save or a
//!   version migration);
//! - the journal, with this checkpoint's records, would exceed half of the base's bytes (but at
//!   least [`MIN_JOURNAL_BYTES`]): loading then reads at most 1.5 times the base;
//! - or it would exceed [`MAX_RECORDS`] records.
//!
//! One checkpoint's changes are split into records of at most [`RECORD_BYTES`], far below the
//! 1 MB that Kafka (`max.message.bytes`) and NATS (`max_payload`) accept by default; a base
//! bucket past that size is stored in parts of at most as much (the meta record names their number).
//!
//! Records are named by a writer id (16 random hex digits, one per store instance) and a
//! sequence number; the meta record lists them as segments `[writer, first, last]`. A fenced
//! instance writing at the same time as its successor therefore never overwrites its records.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::known::{BUCKETS, KnownObjects, StoredEntry};

/// The largest record a checkpoint writes: journal records, and the parts of a bucket that
/// grows past it ([`KnownObjects::encode_bucket_parts`]). An entry is never split; one entry is
/// far smaller.
pub const RECORD_BYTES: usize = 256 * 1024;

/// The most journal records kept before a compaction.
pub const MAX_RECORDS: u64 = 1024;

/// The journal may always grow to this many bytes, however small the base.
pub const MIN_JOURNAL_BYTES: usize = 64 * 1024;

/// How one base bucket is stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stored {
    /// Its bytes, over all parts.
    pub bytes: usize,
    /// The number of its records (see [`KnownObjects::encode_bucket_parts`]); 0 if none is.
    pub parts: usize,
}

/// A run of records of one writer, numbered `first..=last`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment(pub String, pub u64, pub u64);

impl Segment {
    /// The records' names, in order: `(writer, sequence)`.
    pub fn names(&self) -> impl Iterator<Item = (&str, u64)> {
        (self.1..=self.2).map(|seq| (&*self.0, seq))
    }

    /// Number of records.
    pub fn records(&self) -> u64 {
        self.2.saturating_sub(self.1) + 1
    }

    /// A problem with a segment read from a meta record, if any.
    pub fn problem(&self) -> Option<String> {
        if self.0.len() != 16 || !self.0.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Some(format!("journal writer {:?} is not 16 hex digits", self.0));
        }
        if self.1 > self.2 || self.2 - self.1 >= MAX_RECORDS {
            return Some(format!(
                "journal segment {}..={} is empty or longer than {MAX_RECORDS} records",
                self.1, self.2
            ));
        }
        None
    }
}

/// One journal record. Kafka and NATS records hold only the changes (their meta record holds
/// the resourceVersion); a checkpoint file's journal lines also name the base they apply to and
/// their sequence, and the last line of each checkpoint carries its resourceVersion and object
/// count (lines after the last such line are a checkpoint whose write was cut short).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Record {
    /// File: the id of the base this line applies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// File: the line's sequence number, from 1 after each base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Entries added or changed, sorted by uid.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upserts: Vec<StoredEntry>,
    /// Uids removed, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removes: Vec<Box<str>>,
    /// File: on the last line of a checkpoint, its resourceVersion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// File: on the last line of a checkpoint, the number of objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects: Option<usize>,
}

impl Record {
    /// Decodes a stored record; the message says what is wrong.
    pub fn decode(stored: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(stored).map_err(|e| format!("journal record: {e}"))
    }

    /// Applies the record to `known`: upserts, then removals (one record never names a uid
    /// twice).
    pub fn apply(self, known: &mut KnownObjects) {
        for entry in self.upserts {
            known.apply_stored(entry);
        }
        for uid in &self.removes {
            known.remove(uid);
        }
    }

    fn to_bytes(&self) -> Vec<u8> {
        // Strings and integers always serialize.
        serde_json::to_vec(self).expect("journal record serializes")
    }
}

/// What a checkpoint writes.
#[derive(Debug)]
pub enum Plan {
    /// Rewrite the buckets changed since the base, drop the journal.
    Compact,
    /// Append these encoded records (at least one).
    Append(Vec<Vec<u8>>),
}

/// For a checkpoint file: what its journal lines carry besides the changes.
#[derive(Debug, Clone, Copy)]
pub struct Stamp<'a> {
    /// The checkpoint's resourceVersion.
    pub resource_version: &'a str,
}

/// One watch's journal state: what is stored, and what the next record is called.
#[derive(Debug)]
pub struct Journal {
    /// This instance's writer id.
    writer: String,
    /// The sequence number of this writer's next record.
    next: u64,
    /// The records since the base, in order.
    segments: Vec<Segment>,
    /// Their total bytes.
    bytes: usize,
    /// How each base bucket is stored.
    stored: Vec<Stored>,
    /// Whether a base is stored that the journal may extend.
    based: bool,
    /// File: the id of the stored base.
    base: Option<String>,
    /// Kafka: journal records found at load that no meta record names, deleted at the next
    /// compaction.
    strays: Vec<String>,
}

impl Default for Journal {
    fn default() -> Self {
        Self {
            writer: format!("{:016x}", super::random_u64()),
            next: 1,
            segments: Vec::new(),
            bytes: 0,
            stored: vec![Stored::default(); BUCKETS],
            based: false,
            base: None,
            strays: Vec::new(),
        }
    }
}

impl Journal {
    /// The records since the base, as the meta record lists them.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// File: the id of the stored base.
    pub fn base(&self) -> Option<&str> {
        self.base.as_deref()
    }

    /// The segments once the `reserved` records are stored.
    pub fn segments_after(&self, reserved: Option<&Segment>) -> Vec<Segment> {
        let mut after = self.segments.clone();
        if let Some(new) = reserved {
            match after.last_mut() {
                Some(last) if last.0 == new.0 && last.2 + 1 == new.1 => last.2 = new.2,
                _ => after.push(new.clone()),
            }
        }
        after
    }

    /// Kafka: journal records no meta record names.
    pub fn strays(&self) -> &[String] {
        &self.strays
    }

    /// Kafka: records the journal records no meta record names.
    pub fn set_strays(&mut self, strays: Vec<String>) {
        self.strays = strays;
    }

    /// Names for `n` new records (`None` if `n` is 0). A name is never given twice, even if
    /// its write fails: a write whose outcome is unknown may have stored it.
    pub fn reserve(&mut self, n: usize) -> Option<Segment> {
        let n = n as u64;
        (n > 0).then(|| {
            let first = self.next;
            self.next += n;
            Segment(self.writer.clone(), first, first + n - 1)
        })
    }

    /// Decides what the next checkpoint writes and takes the changes from `known` (buckets
    /// stay dirty until a compaction takes them). `stamp`: a file's journal lines.
    pub fn plan(&self, known: &mut KnownObjects, digests: bool, stamp: Option<Stamp<'_>>) -> Plan {
        let Some(changed) = known.take_changes() else {
            return Plan::Compact;
        };
        if !self.based {
            return Plan::Compact;
        }
        let stamp = stamp.map(|s| (s, self.base.as_deref(), self.next_line()));
        let records = encode(known, changed, digests, stamp);
        let bytes: usize = records.iter().map(Vec::len).sum();
        let records_after = self.stored_records() + records.len() as u64;
        let base_bytes: usize = self.stored.iter().map(|s| s.bytes).sum();
        if records_after > MAX_RECORDS
            || self.bytes + bytes > (base_bytes / 2).max(MIN_JOURNAL_BYTES)
        {
            return Plan::Compact;
        }
        Plan::Append(records)
    }

    /// The records since the base.
    pub fn records(&self) -> u64 {
        self.stored_records()
    }

    fn stored_records(&self) -> u64 {
        self.segments.iter().map(Segment::records).sum()
    }

    /// Records that the planned `records`, named `reserved`, are stored.
    pub fn appended(&mut self, reserved: Option<&Segment>, records: &[Vec<u8>]) {
        self.segments = self.segments_after(reserved);
        self.bytes += records.iter().map(Vec::len).sum::<usize>();
    }

    /// The number of records bucket `b` is stored in (0: none).
    pub fn parts(&self, b: usize) -> usize {
        self.stored.get(b).map_or(0, |s| s.parts)
    }

    /// The buckets stored in more than one part, with their number of parts, once a compaction
    /// has stored `written` (as the meta record names them).
    pub fn parts_after(&self, written: &[(usize, Stored)]) -> BTreeMap<usize, usize> {
        let mut parts: BTreeMap<usize, usize> = (0..BUCKETS)
            .map(|b| (b, self.parts(b)))
            .filter(|(_, n)| *n > 1)
            .collect();
        for (b, stored) in written {
            parts.remove(b);
            if stored.parts > 1 {
                parts.insert(*b, stored.parts);
            }
        }
        parts
    }

    /// Records that a compaction writing `written` may or may not have been stored: each
    /// bucket may now have as many parts as either state has, all of which the next compaction
    /// that rewrites it deletes beyond what it writes.
    pub fn maybe_stored(&mut self, written: &[(usize, Stored)]) {
        for (b, stored) in written {
            self.stored[*b].parts = self.stored[*b].parts.max(stored.parts);
        }
    }

    /// Records that a compaction stored `written` (an emptied bucket as 0 bytes) and dropped
    /// the journal; `base`: a file's new base id.
    pub fn compacted(
        &mut self,
        written: impl IntoIterator<Item = (usize, Stored)>,
        base: Option<String>,
    ) {
        for (b, stored) in written {
            self.stored[b] = stored;
        }
        self.segments.clear();
        self.strays.clear();
        self.bytes = 0;
        self.based = true;
        self.base = base;
    }

    /// Records what a load found: how the base's buckets are stored, the journal's segments
    /// and bytes.
    pub fn loaded(
        &mut self,
        buckets: impl IntoIterator<Item = (usize, Stored)>,
        segments: Vec<Segment>,
        journal_bytes: usize,
        base: Option<String>,
    ) {
        self.stored = vec![Stored::default(); BUCKETS];
        for (b, stored) in buckets {
            if b < BUCKETS {
                self.stored[b] = stored;
            }
        }
        self.segments = segments;
        self.bytes = journal_bytes;
        self.based = true;
        self.base = base;
    }

    /// Distrusts the stored checkpoint (damaged, or a file's journal left untidy by a crash):
    /// the next checkpoint compacts, deleting the journal records known so far.
    pub fn invalidate(&mut self) {
        self.based = false;
    }

    /// Forgets what is stored: the next checkpoint compacts.
    pub fn forget(&mut self) {
        let writer = std::mem::take(&mut self.writer);
        *self = Self {
            writer,
            next: self.next,
            ..Self::default()
        };
    }

    /// File: the sequence number the next line gets (lines count from 1 after each base).
    fn next_line(&self) -> u64 {
        self.stored_records() + 1
    }
}

/// Encodes the changes of `changed` uids as records of at most [`RECORD_BYTES`].
fn encode(
    known: &KnownObjects,
    mut changed: Vec<Box<str>>,
    digests: bool,
    stamp: Option<(Stamp<'_>, Option<&str>, u64)>,
) -> Vec<Vec<u8>> {
    changed.sort_unstable();
    let mut records: Vec<Record> = Vec::new();
    let mut size = 0;
    for uid in changed {
        let entry = known.stored_entry(&uid, digests);
        // The entry's bytes as JSON, plus a comma; the record's frame is far below the margin.
        let bytes = match &entry {
            Some(e) => serde_json::to_vec(e).map_or(0, |v| v.len()),
            None => uid.len() * 2 + 3,
        } + 1;
        if records.is_empty() || size + bytes > RECORD_BYTES - 1024 {
            records.push(Record::default());
            size = 0;
        }
        size += bytes;
        let record = records.last_mut().expect("one record at least");
        match entry {
            Some(e) => record.upserts.push(e),
            None => record.removes.push(uid),
        }
    }
    if let Some((stamp, base, first)) = stamp {
        if records.is_empty() {
            // A file's line carries the resourceVersion even when no object changed.
            records.push(Record::default());
        }
        let n = records.len();
        for (i, record) in records.iter_mut().enumerate() {
            record.base = base.map(Into::into);
            record.seq = Some(first + i as u64);
            if i + 1 == n {
                record.resource_version = Some(stamp.resource_version.into());
                record.objects = Some(known.len());
            }
        }
    }
    records.iter().map(Record::to_bytes).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::checkpoint::{FileStore, Found, Meta, Store, WatchKey};

    fn key() -> WatchKey {
        WatchKey::new("dev", "v1", "configmaps", None, None, None)
    }

    fn file_store(dir: &tempfile::TempDir) -> Store {
        Store::new(FileStore {
            key: key(),
            path: dir.path().join("w.checkpoint"),
            cluster: None,
        })
    }

    fn uid(i: u32) -> String {
        format!("{i:08x}-2fa1-11d2-883f-{:012x}", u64::from(i) * 7919)
    }

    fn index(n: u32) -> KnownObjects {
        let mut known = KnownObjects::default();
        for i in 0..n {
            known.observe(
                &uid(i),
                &i.to_string(),
                Some("team"),
                &format!("cm-{i}"),
                u64::from(i) + 1,
            );
        }
        known
    }

    /// How the buckets of `known` are stored in one record each.
    fn stored(known: &KnownObjects) -> Vec<(usize, Stored)> {
        (0..BUCKETS)
            .map(|b| (b, sized(known.encode_bucket(b, true).len())))
            .collect()
    }

    fn sized(bytes: usize) -> Stored {
        Stored { bytes, parts: 1 }
    }

    /// Every bucket as stored, hashed: equal for equal indexes.
    fn contents(known: &KnownObjects) -> (usize, u64) {
        let all: Vec<u8> = (0..BUCKETS)
            .flat_map(|b| known.encode_bucket(b, true))
            .collect();
        (known.len(), crate::known::stable_hash(&all))
    }

    async fn load(store: &mut Store) -> (Option<String>, KnownObjects, u64) {
        let corrupt = AtomicU64::new(0);
        let loaded = store.load(&corrupt).await.unwrap().expect("a checkpoint");
        (
            loaded.resource_version,
            loaded.known,
            corrupt.load(Ordering::Relaxed),
        )
    }

    fn journal_path(dir: &tempfile::TempDir) -> std::path::PathBuf {
        dir.path().join("w.checkpoint.journal")
    }

    #[tokio::test]
    async fn a_journal_round_trips_and_leaves_the_base_alone() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = file_store(&dir);
        let mut known = index(2000);
        known.mark_all_dirty();
        store.save("1", &mut known).await.unwrap();
        let base = std::fs::read(dir.path().join("w.checkpoint")).unwrap();
        assert!(!journal_path(&dir).exists(), "a first save compacts");

        known.observe(&uid(1), "100", Some("team"), "cm-1", 77);
        known.remove(&uid(2));
        known.observe("new", "101", None, "fresh", 0);
        store.save("101", &mut known).await.unwrap();
        store.save("102", &mut known).await.unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("w.checkpoint")).unwrap(),
            base
        );
        let lines = std::fs::read_to_string(journal_path(&dir)).unwrap();
        assert_eq!(lines.lines().count(), 2, "{lines}");
        assert!(lines.len() < 600, "only what changed: {lines}");

        let (rv, loaded, corrupt) = load(&mut store).await;
        assert_eq!((rv.as_deref(), corrupt), (Some("102"), 0));
        assert_eq!(contents(&loaded), contents(&known));
        assert_eq!(loaded.get(&uid(1)).unwrap().digest, 77);
        assert!(loaded.get(&uid(2)).is_none());
    }

    #[test]
    fn replay_applies_records_in_order() {
        let mut known = index(3);
        let (a, b) = (uid(0), uid(1));
        let entry =
            |rv: &str| -> StoredEntry { (a.as_str().into(), rv.into(), None, "a".into(), 5) };
        // Removed, then upserted again (recreated under the same uid): present.
        let records = [
            Record {
                removes: vec![a.as_str().into()],
                ..Record::default()
            },
            Record {
                upserts: vec![entry("9")],
                ..Record::default()
            },
            // Upserted, then removed: gone.
            Record {
                upserts: vec![(b.as_str().into(), "8".into(), None, "b".into(), 0)],
                ..Record::default()
            },
            Record {
                removes: vec![b.as_str().into()],
                ..Record::default()
            },
        ];
        for record in records {
            Record::decode(&record.to_bytes())
                .unwrap()
                .apply(&mut known);
        }
        assert_eq!(&*known.get(&a).unwrap().resource_version, "9");
        assert!(known.get(&b).is_none());
        assert_eq!(known.len(), 2);
    }

    #[test]
    fn large_deltas_are_split_into_records_well_under_broker_limits() {
        let mut known = index(100_000);
        let mut journal = Journal::default();
        journal.compacted(stored(&known), None);
        known.take_changes();
        for i in 0..12_000 {
            known.observe(&uid(i), "2", Some("team"), &format!("cm-{i}"), 3_000_000);
        }
        for i in 50_000..52_000 {
            known.remove(&uid(i));
        }
        let Plan::Append(records) = journal.plan(&mut known, true, None) else {
            panic!("14,000 changes of 100,000 objects are journaled");
        };
        assert!(records.len() > 3, "{} records", records.len());
        assert!(
            records.iter().all(|r| r.len() <= RECORD_BYTES),
            "each record at most {RECORD_BYTES}"
        );
        let mut replayed = index(100_000);
        for r in &records {
            Record::decode(r).unwrap().apply(&mut replayed);
        }
        assert_eq!(contents(&replayed), contents(&known));
    }

    #[test]
    fn the_journal_compacts_past_half_the_base_or_its_record_bound() {
        let mut known = index(10_000);
        let mut journal = Journal::default();
        assert!(
            matches!(journal.plan(&mut known, true, None), Plan::Compact),
            "no base yet"
        );
        let base: usize = (0..BUCKETS)
            .map(|b| known.encode_bucket(b, true).len())
            .sum();
        journal.compacted(stored(&known), None);
        // Rounds of 500 changes (about 1/20 of the base each) until the journal is full.
        let mut journaled = 0;
        for round in 0..20u32 {
            for i in 0..500 {
                let digest = u64::from(round) + 1000;
                known.observe(
                    &uid(i),
                    &format!("r{round}"),
                    Some("team"),
                    &format!("cm-{i}"),
                    digest,
                );
            }
            match journal.plan(&mut known, true, None) {
                Plan::Append(records) => {
                    let reserved = journal.reserve(records.len());
                    journal.appended(reserved.as_ref(), &records);
                    journaled += records.iter().map(Vec::len).sum::<usize>();
                }
                Plan::Compact => break,
            }
        }
        assert!(journaled <= base / 2, "journal {journaled} of base {base}");
        assert!(
            journaled > base / 3,
            "compacted early: journal {journaled} of base {base}"
        );

        // The record bound: one change per checkpoint.
        let mut journal = Journal::default();
        journal.compacted((0..BUCKETS).map(|b| (b, sized(1 << 20))), None);
        let mut saves = 0;
        loop {
            known.observe(
                &uid(1),
                &format!("s{saves}"),
                Some("team"),
                "cm-1",
                saves + 1000,
            );
            let Plan::Append(records) = journal.plan(&mut known, true, None) else {
                break;
            };
            let reserved = journal.reserve(records.len());
            journal.appended(reserved.as_ref(), &records);
            saves += 1;
        }
        assert_eq!(saves, MAX_RECORDS);
        // A relist's worth of changes is not tracked one by one: a compaction.
        let mut journal = Journal::default();
        journal.compacted((0..BUCKETS).map(|b| (b, sized(1 << 30))), None);
        known.begin_relist();
        for i in 0..10_000 {
            known.observe(&uid(i), "relisted", Some("team"), &format!("cm-{i}"), 1);
        }
        known.finish_relist();
        assert!(matches!(
            journal.plan(&mut known, true, None),
            Plan::Compact
        ));
    }

    #[tokio::test]
    async fn a_relist_diffs_against_the_replayed_index() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = file_store(&dir);
        let mut known = index(100);
        known.mark_all_dirty();
        store.save("1", &mut known).await.unwrap();
        known.remove(&uid(5));
        known.observe(&uid(6), "60", Some("team"), "cm-6", 61);
        known.observe("late", "70", Some("team"), "late", 71);
        store.save("2", &mut known).await.unwrap();
        let (_, mut loaded, _) = load(&mut store).await;
        loaded.begin_relist();
        for i in (0..100).filter(|i| *i != 5 && *i != 7) {
            let rv = if i == 6 {
                "60".to_string()
            } else {
                i.to_string()
            };
            loaded.observe(&uid(i), &rv, Some("team"), &format!("cm-{i}"), 0);
        }
        loaded.observe("late", "70", Some("team"), "late", 0);
        let gone: Vec<Box<str>> = loaded.finish_relist().into_iter().map(|(u, _)| u).collect();
        assert_eq!(
            gone,
            vec![uid(7).into_boxed_str()],
            "5 was removed before, late is known"
        );
    }

    /// A crash while appending leaves a torn tail: the checkpoint before it loads, and the next
    /// save compacts. A crash between a compaction's rename and the journal's deletion leaves
    /// lines of the older base: they are skipped.
    #[tokio::test]
    async fn a_crash_at_any_point_loads_a_complete_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = file_store(&dir);
        let mut known = index(500);
        known.mark_all_dirty();
        store.save("1", &mut known).await.unwrap();
        known.observe(&uid(1), "2", Some("team"), "cm-1", 1002);
        store.save("2", &mut known).await.unwrap();
        let before = contents(&known);
        let journal = std::fs::read(journal_path(&dir)).unwrap();
        for i in 0..4000 {
            known.observe(
                &uid(i % 500),
                &format!("3-{i}"),
                Some("team"),
                "x",
                u64::from(i) + 5000,
            );
        }
        store.save("3", &mut known).await.unwrap();
        let after = contents(&known);
        let full = std::fs::read(journal_path(&dir)).unwrap();
        assert!(full.len() > journal.len() && full.starts_with(&journal));
        for cut in (journal.len()..=full.len())
            .step_by(97)
            .chain([full.len() - 1, full.len()])
        {
            std::fs::write(journal_path(&dir), &full[..cut]).unwrap();
            let mut fresh = file_store(&dir);
            let (rv, loaded, corrupt) = load(&mut fresh).await;
            assert_eq!(corrupt, 0, "cut at {cut}");
            if cut == full.len() {
                assert_eq!((rv.as_deref(), contents(&loaded)), (Some("3"), after));
            } else {
                assert_eq!(
                    (rv.as_deref(), contents(&loaded)),
                    (Some("2"), before),
                    "cut at {cut}"
                );
            }
        }
        // Cut short, then saved again: a compaction replaces base and journal.
        std::fs::write(journal_path(&dir), &full[..full.len() - 10]).unwrap();
        let mut fresh = file_store(&dir);
        let (_, mut loaded, _) = load(&mut fresh).await;
        loaded.observe("n", "4", None, "n", 0);
        fresh.save("4", &mut loaded).await.unwrap();
        assert!(!journal_path(&dir).exists(), "compacted");
        let (rv, again, _) = load(&mut fresh).await;
        assert_eq!(
            (rv.as_deref(), contents(&again)),
            (Some("4"), contents(&loaded))
        );

        // Crash after a compaction's rename: the old journal is still there.
        fresh.save("5", &mut loaded).await.unwrap();
        loaded.observe("m", "6", None, "m", 0);
        fresh.save("6", &mut loaded).await.unwrap();
        let stale = std::fs::read(journal_path(&dir)).unwrap();
        loaded.mark_all_dirty();
        fresh.save("7", &mut loaded).await.unwrap();
        std::fs::write(journal_path(&dir), stale).unwrap();
        let (rv, again, corrupt) = load(&mut file_store(&dir)).await;
        assert_eq!((rv.as_deref(), corrupt), (Some("7"), 0));
        assert_eq!(contents(&again), contents(&loaded));
    }

    #[tokio::test]
    async fn a_corrupt_journal_line_is_a_counted_repair() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = file_store(&dir);
        let mut known = index(50);
        known.mark_all_dirty();
        store.save("1", &mut known).await.unwrap();
        known.observe(&uid(1), "2", Some("team"), "cm-1", 1002);
        store.save("2", &mut known).await.unwrap();
        known.observe(&uid(2), "3", Some("team"), "cm-2", 1003);
        store.save("3", &mut known).await.unwrap();
        let lines = std::fs::read_to_string(journal_path(&dir)).unwrap();
        let first = lines.lines().next().unwrap();
        std::fs::write(journal_path(&dir), format!("{first}\n{{\"upserts\": 5}}\n")).unwrap();
        let corrupt = AtomicU64::new(0);
        let repair = store.load(&corrupt).await.unwrap().unwrap();
        assert_eq!(repair.resource_version, None, "a repair lists again");
        assert_eq!(corrupt.load(Ordering::Relaxed), 1);
        assert_eq!(
            &*repair.known.get(&uid(1)).unwrap().resource_version,
            "2",
            "replayed up to the bad line"
        );
        assert_eq!(repair.known.len(), 50);
    }

    /// A version 2 checkpoint file, as the previous release wrote it (the meta record, then one
    /// JSON bucket per line), loads; the next save migrates it to version 3 with a journal.
    #[tokio::test]
    async fn version_two_files_load_and_migrate() {
        let dir = tempfile::tempdir().unwrap();
        let known = index(300);
        let mut v2 =
            br#"{"version":2,"watch":"w","resourceVersion":"40","objects":300,"clusterUid":"u"}"#
                .to_vec();
        v2.push(b'\n');
        for b in 0..BUCKETS {
            let record = known.encode_bucket(b, true);
            if !record.is_empty() {
                v2.extend_from_slice(format!("{b}\t").as_bytes());
                v2.extend_from_slice(&record);
                v2.push(b'\n');
            }
        }
        std::fs::write(dir.path().join("w.checkpoint"), v2).unwrap();
        let mut store = file_store(&dir);
        let (rv, mut loaded, corrupt) = load(&mut store).await;
        assert_eq!((rv.as_deref(), corrupt), (Some("40"), 0));
        assert_eq!(contents(&loaded), contents(&known));
        loaded.observe(&uid(3), "41", Some("team"), "cm-3", 1);
        store.save("41", &mut loaded).await.unwrap();
        let text = std::fs::read_to_string(dir.path().join("w.checkpoint")).unwrap();
        assert!(text.starts_with(r#"{"version":4,"#), "{text}");
        assert!(
            !journal_path(&dir).exists(),
            "the migration rewrites the base"
        );
        loaded.observe(&uid(4), "42", Some("team"), "cm-4", 1);
        store.save("42", &mut loaded).await.unwrap();
        assert!(journal_path(&dir).exists(), "then journals");
        let (rv, again, _) = load(&mut store).await;
        assert_eq!(
            (rv.as_deref(), contents(&again)),
            (Some("42"), contents(&loaded))
        );
    }

    #[test]
    fn kafka_journal_records_replay_and_missing_ones_damage() {
        use std::collections::HashMap;
        let k = key();
        let mut known = index(40);
        let mut records: HashMap<String, Vec<u8>> = (0..BUCKETS)
            .map(|b| (format!("{}/b/{b}", k.id), known.encode_bucket(b, true)))
            .collect();
        known.take_changes();
        known.remove(&uid(3));
        known.observe("n", "9", None, "n", 0);
        let mut journal = Journal::default();
        journal.compacted([], None);
        let Plan::Append(appended) = journal.plan(&mut known, true, None) else {
            panic!()
        };
        let reserved = journal.reserve(appended.len()).unwrap();
        for ((w, seq), r) in reserved.names().zip(&appended) {
            records.insert(format!("{}/j/{w}/{seq}", k.id), r.clone());
        }
        records.insert(
            format!("{}/j/0000000000000000/1", k.id),
            b"a stray".to_vec(),
        );
        let mut meta = Meta::new(&k, None, "9", &known);
        meta.journal = journal.segments_after(Some(&reserved));
        records.insert(format!("{}/meta", k.id), meta.to_bytes());
        let mut state = Journal::default();
        match crate::checkpoint::kafka::decode(&k, None, &records, &mut state).unwrap() {
            Some(Found::Intact(c)) => assert_eq!(contents(&c.known), contents(&known)),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            state.strays().len(),
            1,
            "named for deletion at the next compaction"
        );
        records.remove(&format!("{}/j/{}/{}", k.id, reserved.0, reserved.1));
        assert!(matches!(
            crate::checkpoint::kafka::decode(&k, None, &records, &mut state).unwrap(),
            Some(Found::Damaged { .. })
        ));
    }
}
