//! NATS checkpoints in a KV bucket: `{id}.meta`, `{id}.b{bucket}.{generation}` (and
//! `{id}.b{bucket}.{generation}.{part}` for the further parts of a bucket larger than
//! [`RECORD_BYTES`]) and journal records `{id}.j.{writer}.{sequence}` (see
//! [`super::journal`]). A save writes its journal records, or at a compaction the changed
//! buckets (all their parts) under a fresh generation (side by side, in batches of about
//! [`BATCH_BYTES`]), then swaps the meta record with
//! compare-and-swap on the revision this instance last wrote or read, which fences a stale
//! writer (whose records have names of their own); buckets, parts and journal records the new
//! meta record no longer names are purged afterwards. Until the swap the previous meta record
//! names only records that are still there, so a crash or a failed write at any point leaves the
//! previous checkpoint whole.

use std::collections::{BTreeMap, BTreeSet};

use async_nats::jetstream::kv;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use super::journal::{Journal, Plan, RECORD_BYTES, Segment, Stored};
use super::{Cluster, Error, Found, Meta, Parts, Result, WatchKey};
use crate::known::KnownObjects;

/// Records written (or purged) at once by a save.
const WRITES_AT_ONCE: usize = 64;

/// Bytes of records a save holds before writing them (a compaction of a large index is
/// written in batches, not held whole).
const BATCH_BYTES: usize = 8 << 20;

/// Records a save writes, side by side ([`WRITES_AT_ONCE`] at a time, one round trip rather than
/// one per record), in batches of about [`BATCH_BYTES`].
struct Puts<'a> {
    kv: &'a kv::Store,
    pending: Vec<(String, Bytes)>,
    bytes: usize,
}

impl<'a> Puts<'a> {
    fn new(kv: &'a kv::Store) -> Self {
        Self {
            kv,
            pending: Vec::new(),
            bytes: 0,
        }
    }

    async fn push(&mut self, key: String, value: Bytes) -> Result<()> {
        self.bytes += value.len();
        self.pending.push((key, value));
        if self.bytes >= BATCH_BYTES {
            self.flush().await?;
        }
        Ok(())
    }

    /// Writes what is pending; fails if any write failed (the others may be stored: names of
    /// their own that no meta record names yet).
    async fn flush(&mut self) -> Result<()> {
        self.bytes = 0;
        let batch = std::mem::take(&mut self.pending);
        let kv = self.kv;
        futures::stream::iter(batch.into_iter().map(|(key, value)| kv.put(key, value)))
            .buffer_unordered(WRITES_AT_ONCE)
            .try_collect::<Vec<_>>()
            .await
            .map_err(store_err)?;
        Ok(())
    }
}

/// One watch's NATS checkpoints.
#[derive(Debug)]
pub struct NatsStore {
    key: WatchKey,
    kv: kv::Store,
    cluster: Option<Cluster>,
    /// The meta record's revision this instance last wrote or read.
    revision: Option<u64>,
    /// The generation and number of parts of each non-empty bucket, as the meta record at
    /// `revision` names them.
    buckets: Named,
    /// A meta record whose write failed with an unknown outcome (its reply was lost), and the
    /// buckets and journal records it names: the store may hold it.
    unconfirmed: Option<Unconfirmed>,
}

/// A meta record that may or may not be stored.
#[derive(Debug)]
struct Unconfirmed {
    value: Bytes,
    buckets: Named,
    journal: Vec<Segment>,
}

/// Bucket → (generation, number of parts).
type Named = BTreeMap<usize, (String, usize)>;

/// How a compare-and-swap of the meta record ended.
enum Swap {
    Done(u64),
    /// The revision was not the expected one.
    Conflict,
    /// Failed; the write may or may not have happened.
    Failed(String),
}

fn store_err(e: impl std::fmt::Display) -> Error {
    Error::Store {
        store: "nats",
        message: e.to_string(),
    }
}

impl NatsStore {
    /// A store for one watch in `kv`.
    pub fn new(key: WatchKey, kv: kv::Store, cluster: Option<Cluster>) -> Self {
        Self {
            key,
            kv,
            cluster,
            revision: None,
            buckets: BTreeMap::new(),
            unconfirmed: None,
        }
    }

    fn meta_key(&self) -> String {
        format!("{}.meta", self.key.id)
    }

    /// The key of part `part` of bucket `b` in `generation`.
    fn bucket_key(&self, b: usize, generation: &str, part: usize) -> String {
        match part {
            0 => format!("{}.b{b}.{generation}", self.key.id),
            p => format!("{}.b{b}.{generation}.{p}", self.key.id),
        }
    }

    fn journal_key(&self, writer: &str, seq: u64) -> String {
        format!("{}.j.{writer}.{seq}", self.key.id)
    }

    pub(super) async fn load(&mut self, journal: &mut Journal) -> Result<Option<Found>> {
        let entry = self.kv.entry(self.meta_key()).await.map_err(store_err)?;
        let Some(entry) = entry.filter(|e| e.operation == kv::Operation::Put) else {
            return Ok(None);
        };
        // Even a corrupt meta record is replaced by compare-and-swap on its revision.
        self.revision = Some(entry.revision);
        self.buckets.clear();
        let meta = match Meta::decode(&self.key, &entry.value) {
            Ok(meta) => meta,
            Err(e) => return Ok(Some(Found::unreadable(e))),
        };
        meta.check_cluster(&self.key, self.cluster.as_ref())?;
        let mut stored: BTreeMap<usize, Vec<(usize, Bytes)>> = BTreeMap::new();
        for (b, generation) in &meta.buckets {
            let parts = stored.entry(*b).or_default();
            for p in 0..meta.parts_of(*b) {
                let record = self
                    .kv
                    .get(self.bucket_key(*b, generation, p))
                    .await
                    .map_err(store_err)?;
                parts.extend(record.map(|r| (p, r)));
            }
        }
        let mut records = Vec::new();
        for (writer, seq) in meta.journal.iter().flat_map(Segment::names) {
            let record = self
                .kv
                .get(self.journal_key(writer, seq))
                .await
                .map_err(store_err)?;
            records.push((format!("{writer}.{seq}"), record));
        }
        self.buckets = meta
            .buckets
            .iter()
            .map(|(b, g)| (*b, (g.clone(), meta.parts_of(*b))))
            .collect();
        let found: Parts<'_> = stored
            .iter()
            .map(|(b, parts)| (*b, parts.iter().map(|(p, r)| (*p, &r[..])).collect()))
            .collect();
        Ok(Some(Found::assemble(
            &self.key,
            meta,
            found,
            records.iter().map(|(name, r)| (name.clone(), r.as_deref())),
            Vec::new(),
            journal,
        )))
    }

    pub(super) async fn save(
        &mut self,
        resource_version: &str,
        known: &mut KnownObjects,
        digests: bool,
        plan: Plan,
        journal: &mut Journal,
    ) -> Result<()> {
        let mut buckets = self.buckets.clone();
        let mut written = Vec::new();
        let mut reserved = None;
        let mut puts = Puts::new(&self.kv);
        let mut meta = Meta::new(&self.key, self.cluster.as_ref(), resource_version, known);
        match &plan {
            Plan::Compact => {
                let generation = format!("{:016x}", super::random_u64());
                for b in known.take_dirty() {
                    let parts = known.encode_bucket_parts(b, digests, RECORD_BYTES);
                    buckets.remove(&b);
                    let bytes = parts.iter().map(Vec::len).sum();
                    if bytes == 0 {
                        written.push((b, Stored::default()));
                        continue;
                    }
                    let n = parts.len();
                    written.push((b, Stored { bytes, parts: n }));
                    for (p, part) in parts.into_iter().enumerate() {
                        let key = self.bucket_key(b, &generation, p);
                        puts.push(key, Bytes::from(part)).await?;
                    }
                    buckets.insert(b, (generation.clone(), n));
                }
            }
            Plan::Append(records) => {
                reserved = journal.reserve(records.len());
                let names = reserved.iter().flat_map(Segment::names);
                for ((writer, seq), record) in names.zip(records) {
                    let key = self.journal_key(writer, seq);
                    puts.push(key, Bytes::from(record.clone())).await?;
                }
                meta.journal = journal.segments_after(reserved.as_ref());
            }
        }
        // The meta record naming the records is swapped only once every one is stored.
        puts.flush().await?;
        meta.buckets = buckets.iter().map(|(b, (g, _))| (*b, g.clone())).collect();
        meta.parts = buckets
            .iter()
            .filter(|(_, (_, n))| *n > 1)
            .map(|(b, (_, n))| (*b, *n))
            .collect();
        let value = Bytes::from(meta.to_bytes());
        let revision = self.swap_meta(value, &buckets, &meta.journal).await?;
        let stale = self.stale_after(&buckets, &meta.journal, journal);
        self.revision = Some(revision);
        self.buckets = buckets;
        match plan {
            Plan::Compact => journal.compacted(written, None),
            Plan::Append(records) => journal.appended(reserved.as_ref(), &records),
        }
        // Best effort: an orphaned record is harmless, only space.
        futures::stream::iter(stale.into_iter().map(|key| self.kv.purge(key)))
            .buffer_unordered(WRITES_AT_ONCE)
            .for_each(|_| async {})
            .await;
        Ok(())
    }

    /// The keys named by no meta record once the one naming `buckets` and `segments` is
    /// stored: buckets replaced, the journal records of the previous meta record (after a
    /// compaction), and those of an unconfirmed write (whether or not it happened).
    fn stale_after(
        &mut self,
        buckets: &Named,
        segments: &[Segment],
        journal: &Journal,
    ) -> BTreeSet<String> {
        let mut stale: BTreeSet<(usize, (String, usize))> =
            std::mem::take(&mut self.buckets).into_iter().collect();
        let mut old_journal: Vec<Segment> = journal.segments().to_vec();
        if let Some(unconfirmed) = self.unconfirmed.take() {
            stale.extend(unconfirmed.buckets);
            old_journal.extend(unconfirmed.journal);
        }
        for current in buckets.iter().map(|(b, g)| (*b, g.clone())) {
            stale.remove(&current);
        }
        let keep: BTreeSet<(&str, u64)> = segments.iter().flat_map(Segment::names).collect();
        let mut keys: BTreeSet<String> = stale
            .into_iter()
            .flat_map(|(b, (g, n))| (0..n).map(move |p| (b, g.clone(), p)))
            .map(|(b, g, p)| self.bucket_key(b, &g, p))
            .collect();
        for (writer, seq) in old_journal.iter().flat_map(Segment::names) {
            if !keep.contains(&(writer, seq)) {
                keys.insert(self.journal_key(writer, seq));
            }
        }
        keys
    }

    /// Swaps the meta record for `value` (which names `buckets`). A conflict is fencing only if
    /// the record holds a foreign value: it may hold this very value (its write happened but the
    /// reply was lost, and the client retried), or an earlier write of ours whose reply was lost,
    /// which is adopted before swapping again.
    async fn swap_meta(
        &mut self,
        value: Bytes,
        buckets: &Named,
        journal: &[Segment],
    ) -> Result<u64> {
        let mut adopted = false;
        loop {
            match self.try_swap(value.clone()).await {
                Swap::Done(revision) => return Ok(revision),
                Swap::Failed(message) => {
                    self.unconfirmed = Some(Unconfirmed {
                        value,
                        buckets: buckets.clone(),
                        journal: journal.to_vec(),
                    });
                    return Err(store_err(message));
                }
                Swap::Conflict => {}
            }
            let current = self
                .kv
                .entry(self.meta_key())
                .await
                .map_err(store_err)?
                .filter(|e| e.operation == kv::Operation::Put);
            let Some(current) = current else {
                return Err(self.fenced());
            };
            if current.value == value {
                return Ok(current.revision);
            }
            let earlier = self
                .unconfirmed
                .as_ref()
                .is_some_and(|earlier| earlier.value == current.value);
            if !earlier || adopted {
                return Err(self.fenced());
            }
            adopted = true;
            self.revision = Some(current.revision);
        }
    }

    async fn try_swap(&self, value: Bytes) -> Swap {
        let key = self.meta_key();
        match self.revision {
            Some(rev) => match self.kv.update(&key, value, rev).await {
                Ok(revision) => Swap::Done(revision),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Swap::Conflict,
                Err(e) => Swap::Failed(e.to_string()),
            },
            None => match self.kv.create(&key, value).await {
                Ok(revision) => Swap::Done(revision),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Swap::Conflict,
                Err(e) => Swap::Failed(e.to_string()),
            },
        }
    }

    fn fenced(&self) -> Error {
        Error::Fenced {
            watch: self.key.description.clone(),
        }
    }

    pub(super) async fn reset(&self) -> Result<()> {
        self.kv.purge(self.meta_key()).await.map_err(store_err)
    }
}

/// Opens (creating if allowed) the KV bucket for checkpoints.
pub async fn nats_bucket(js: &async_nats::jetstream::Context, name: &str) -> Result<kv::Store> {
    match js.get_key_value(name).await {
        Ok(store) => Ok(store),
        Err(_) => js
            .create_key_value(kv::Config {
                bucket: name.into(),
                history: 1,
                description: "kube-event-bridge checkpoints".into(),
                ..Default::default()
            })
            .await
            .map_err(store_err),
    }
}
