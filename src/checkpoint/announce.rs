//! Announcements: the objects a watch may have published past its saved checkpoint, for sinks
//! whose events are not stored with the checkpoint (NATS, HTTP, stdout; a Kafka checkpoint
//! goes down with the events' transaction, so Kafka never announces).
//!
//! Such a sink acknowledges events one by one and the checkpoint follows later, so a watch that
//! stops without saving (killed, paused past its Lease) leaves events published past what its
//! checkpoint knows. Whoever resumes replays from the checkpoint, which covers every change
//! except one: an object first published past the checkpoint and deleted while the history was
//! lost (410 Gone). The relist does not show it and the index does not know it, so its delete
//! would never be published, and consumers would keep it for ever.
//!
//! So before a watch sends the first event of an object its index did not know, it stores an
//! announcement of that object (uid, resourceVersion, namespace, name), *tied* to the checkpoint
//! it extends (the tie is in the record): the NATS meta record's revision, or a checkpoint
//! file's base and journal length.
//! Announcements are facts that only add ("this object may have been published"), so they need
//! no fencing: an announcement by a stale writer at worst makes its successor publish a delete
//! of an object that was deleted indeed. The next save covers everything announced before it
//! (all of it is acknowledged by then) and deletes them; at load, only the announcements tied
//! to the loaded checkpoint count, and the watch carries them until a live event names them or
//! a list ends without them (a delete published as repaired). A watch carrying announcements
//! does not save, so that none is lost.

use serde::{Deserialize, Serialize};

use super::journal::RECORD_BYTES;
use crate::known::StoredEntry;

/// Objects announced at once at most: a pipeline announces what it took in one go, up to this.
pub const BATCH: usize = 512;

/// One stored announcement.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Record {
    /// The checkpoint it extends.
    pub tie: String,
    /// The objects (digest always 0: never compared, never a hint of hidden values).
    pub entries: Vec<StoredEntry>,
}

impl Record {
    /// Decodes a stored record; the message says what is wrong.
    pub fn decode(stored: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(stored).map_err(|e| format!("announcement: {e}"))
    }
}

/// `entries` as records tied to `tie`, each at most about [`RECORD_BYTES`] (an entry is never
/// split).
pub fn encode(tie: &str, entries: &[StoredEntry]) -> Vec<Vec<u8>> {
    let mut records: Vec<Record> = Vec::new();
    let mut size = 0;
    for (uid, rv, ns, name, _) in entries {
        let entry: StoredEntry = (uid.clone(), rv.clone(), ns.clone(), name.clone(), 0);
        let bytes = serde_json::to_vec(&entry).map_or(0, |v| v.len()) + 1;
        if records.is_empty() || size + bytes > RECORD_BYTES - 1024 {
            records.push(Record {
                tie: tie.into(),
                entries: Vec::new(),
            });
            size = 0;
        }
        size += bytes;
        records.last_mut().expect("one record").entries.push(entry);
    }
    records
        .iter()
        // Strings and integers always serialize.
        .map(|r| serde_json::to_vec(r).expect("announcement serializes"))
        .collect()
}

/// The entries of the decodable `stored` records tied to `tie`, each uid once; the problems
/// with the others (a record cut short by a crash is one), to be logged.
pub fn entries_tied<'a>(
    tie: &str,
    stored: impl IntoIterator<Item = &'a [u8]>,
) -> (Vec<StoredEntry>, Vec<String>) {
    let mut entries: Vec<StoredEntry> = Vec::new();
    let mut problems = Vec::new();
    for record in stored {
        match Record::decode(record) {
            Ok(r) if r.tie == tie => entries.extend(r.entries),
            Ok(_) => {}
            Err(problem) => problems.push(problem),
        }
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries.dedup_by(|a, b| a.0 == b.0);
    (entries, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(i: usize) -> StoredEntry {
        (
            format!("uid-{i:06}").into(),
            format!("{}", 100 + i).into(),
            Some("ns".into()),
            format!("name-{i}").into(),
            0x5eed,
        )
    }

    #[test]
    fn records_round_trip_bounded_and_without_digests() {
        let entries: Vec<StoredEntry> = (0..20_000).map(entry).collect();
        let records = encode("7", &entries);
        assert!(records.len() > 1, "split into several records");
        assert!(records.iter().all(|r| r.len() <= RECORD_BYTES));
        let (back, problems) = entries_tied("7", records.iter().map(|r| &r[..]));
        assert!(problems.is_empty());
        assert_eq!(back.len(), entries.len());
        assert!(back.iter().all(|e| e.4 == 0), "digests are never stored");
        assert_eq!(back[17].0, entries[17].0);
    }

    #[test]
    fn only_records_of_the_tie_count_and_a_torn_one_is_a_problem() {
        let a = encode("5", &[entry(1), entry(2)]);
        let b = encode("6", &[entry(3)]);
        let c = encode("6", &[entry(3), entry(4)]);
        let torn = &c[0][..c[0].len() / 2];
        let stored = [&a[0][..], &b[0][..], &c[0][..], torn];
        let (entries, problems) = entries_tied("6", stored);
        let uids: Vec<&str> = entries.iter().map(|e| &*e.0).collect();
        assert_eq!(
            uids,
            ["uid-000003", "uid-000004"],
            "one each, of tie 6 only"
        );
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("announcement:"), "{problems:?}");
    }
}
