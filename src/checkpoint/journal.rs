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
//! 1 MB that Kafka (`max.message.bytes`) and NATS (`max_payload`) accept by default.
//!
//! Records are named by a writer id (16 random hex digits, one per store instance) and a
//! sequence number; the meta record lists them as segments `[writer, first, last]`. A fenced
//! instance writing at the same time as its successor therefore never overwrites its records.

use serde::{Deserialize, Serialize};

use crate::known::{BUCKETS, KnownObjects, StoredEntry};

/// The largest journal record written (an entry is never split; one entry is far smaller).
pub const RECORD_BYTES: usize = 256 * 1024;

/// The most journal records kept before a compaction.
pub const MAX_RECORDS: u64 = 1024;

/// The journal may always grow to this many bytes, however small the base.
pub const MIN_JOURNAL_BYTES: usize = 64 * 1024;

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
            return Some(format!(
                "journal writer {:?} is not 16 hex digits",
                self.0
            ));
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
    /// The stored size of each base bucket.
    bucket_bytes: Vec<usize>,
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
            bucket_bytes: vec![0; BUCKETS],
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
    pub fn plan(
        &self,
        known: &mut KnownObjects,
        digests: bool,
        stamp: Option<Stamp<'_>>,
    ) -> Plan {
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
        let base_bytes: usize = self.bucket_bytes.iter().sum();
        if records_after > MAX_RECORDS
            || self.bytes + bytes > (base_bytes / 2).max(MIN_JOURNAL_BYTES)
        {
            return Plan::Compact;
        }
        Plan::Append(records)
    }

    fn stored_records(&self) -> u64 {
        self.segments.iter().map(Segment::records).sum()
    }

    /// Records that the planned `records`, named `reserved`, are stored.
    pub fn appended(&mut self, reserved: Option<&Segment>, records: &[Vec<u8>]) {
        self.segments = self.segments_after(reserved);
        self.bytes += records.iter().map(Vec::len).sum::<usize>();
    }

    /// Records that a compaction stored `written` (bucket, bytes; 0 for an emptied bucket) and
    /// dropped the journal; `base`: a file's new base id.
    pub fn compacted(&mut self, written: impl IntoIterator<Item = (usize, usize)>, base: Option<String>) {
        for (b, bytes) in written {
            self.bucket_bytes[b] = bytes;
        }
        self.segments.clear();
        self.strays.clear();
        self.bytes = 0;
        self.based = true;
        self.base = base;
    }

    /// Records what a load found: the base's bucket sizes, the journal's segments and bytes.
    pub fn loaded(
        &mut self,
        bucket_bytes: impl IntoIterator<Item = (usize, usize)>,
        segments: Vec<Segment>,
        journal_bytes: usize,
        base: Option<String>,
    ) {
        self.bucket_bytes = vec![0; BUCKETS];
        for (b, bytes) in bucket_bytes {
            if b < BUCKETS {
                self.bucket_bytes[b] = bytes;
            }
        }
        self.segments = segments;
        self.bytes = journal_bytes;
        self.based = true;
        self.base = base;
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
