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
//!
//! Announcements ([`super::announce`]) are records `{id}.a.{writer}.{sequence}`, each tied (in
//! its content) to the meta record's revision it extends (0: none stored); a save purges them
//! with what its meta record no longer names, and the writer's numbering starts again at 1, so
//! the keys a watch ever uses stay few (a purged key keeps a marker in the stream).

use std::collections::{BTreeMap, BTreeSet};

use async_nats::jetstream::kv;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};

use super::journal::{Journal, Plan, RECORD_BYTES, Segment, Stored};
use super::{Backend, Cluster, Error, Found, Loaded, Meta, Parts, Result, WatchKey, announce};
use crate::checkpoint;
use crate::known::{KnownObjects, StoredEntry};

/// Records written (or purged) at once by a save.
const WRITES_AT_ONCE: usize = 64;

/// Records a load reads at once.
const READS_AT_ONCE: usize = 64;

/// Bytes of records a save holds before writing them (a compaction of a large index is
/// written in batches, not held whole).
const BATCH_BYTES: usize = 8 << 20;

/// Writes `records` side by side ([`WRITES_AT_ONCE`] at a time, one round trip rather than one
/// per record); fails if any write failed (the others may be stored: names of their own that no
/// meta record names yet).
async fn put_all(kv: &kv::Store, records: Vec<(String, Bytes)>) -> Result<()> {
    futures::stream::iter(records.into_iter().map(|(key, value)| kv.put(key, value)))
        .buffer_unordered(WRITES_AT_ONCE)
        .try_collect::<Vec<_>>()
        .await
        .map_err(store_err)?;
    Ok(())
}

/// Reads `keys` side by side ([`READS_AT_ONCE`] at a time), each record or `None` where the key
/// holds none, in the order of `keys`: a checkpoint's hundreds of records load in a few round
/// trips rather than one each.
async fn get_all(kv: &kv::Store, keys: Vec<String>) -> Result<Vec<Option<Bytes>>> {
    futures::stream::iter(keys.into_iter().map(|key| kv.get(key)))
        .buffered(READS_AT_ONCE)
        .try_collect()
        .await
        .map_err(store_err)
}

/// Purges `keys` side by side. Best effort: an orphaned record is harmless, only space.
async fn purge_all(kv: &kv::Store, keys: BTreeSet<String>) {
    futures::stream::iter(keys.into_iter().map(|key| kv.purge(key)))
        .buffer_unordered(WRITES_AT_ONCE)
        .for_each(|_| async {})
        .await;
}

/// A save encoded whole ([`NatsStore::stage`]): it owns its records and the compare-and-swap of
/// the meta record, so it is written apart from the store while the pipeline goes on taking
/// changes ([`Staged::write`]), then applied ([`NatsStore::finish`]).
#[derive(Debug)]
pub(super) struct Staged {
    swap: MetaSwap,
    /// Records to write before the meta record.
    records: Vec<(String, Bytes)>,
    layout: Layout,
}

/// A staged save, written: how its meta record's swap ended.
#[derive(Debug)]
pub(super) struct Written {
    staged: Staged,
    swapped: Swapped,
}

impl Written {
    /// Whether the meta record was swapped in.
    pub(super) fn is_ok(&self) -> bool {
        matches!(self.swapped, Swapped::Done(_))
    }
}

/// What the store holds once a save's meta record is swapped in.
#[derive(Debug)]
struct Layout {
    /// The meta record.
    meta: Bytes,
    buckets: Named,
    journal: Vec<Segment>,
    /// Keys the meta record no longer names, purged after the swap.
    stale: BTreeSet<String>,
    done: Done,
}

/// What a save adds to the journal's account of the store.
#[derive(Debug)]
enum Done {
    Compacted(Vec<(usize, Stored)>),
    Appended(Option<Segment>, Vec<Vec<u8>>),
}

impl Staged {
    /// Writes the records, then swaps the meta record naming them in (only once every one is
    /// stored), then purges what it no longer names.
    pub(super) async fn write(mut self) -> Written {
        let records = std::mem::take(&mut self.records);
        let swapped = match put_all(&self.swap.kv, records).await {
            Ok(()) => self.swap.run(&self.layout.meta).await,
            Err(e) => Swapped::Failed(e),
        };
        if let Swapped::Done(_) = swapped {
            let stale = std::mem::take(&mut self.layout.stale);
            purge_all(&self.swap.kv, stale).await;
        }
        Written {
            staged: self,
            swapped,
        }
    }
}

/// The compare-and-swap of one watch's meta record, owning what it needs (a staged save runs
/// apart from the store).
#[derive(Debug)]
struct MetaSwap {
    kv: kv::Store,
    key: String,
    /// The revision the swap expects.
    revision: Option<u64>,
    /// The value of an earlier write of ours whose outcome is unknown.
    earlier: Option<Bytes>,
}

/// How a swap of the meta record ended.
#[derive(Debug)]
enum Swapped {
    Done(u64),
    /// The record holds a foreign value: another instance owns the watch.
    Fenced,
    /// The write may or may not have happened (its reply was lost).
    Unknown(String),
    /// Nothing was swapped.
    Failed(Error),
}

/// How one compare-and-swap attempt ended.
enum Swap {
    Done(u64),
    /// The revision was not the expected one.
    Conflict,
    /// Failed; the write may or may not have happened.
    Failed(String),
}

impl MetaSwap {
    /// Swaps the meta record for `value`. A conflict is fencing only if the record holds a
    /// foreign value: it may hold this very value (its write happened but the reply was lost,
    /// and the client retried), or an earlier write of ours whose reply was lost, which is
    /// adopted (its revision becomes the expected one) before swapping again.
    async fn run(&mut self, value: &Bytes) -> Swapped {
        let mut adopted = false;
        loop {
            match self.try_swap(value.clone()).await {
                Swap::Done(revision) => return Swapped::Done(revision),
                Swap::Failed(message) => return Swapped::Unknown(message),
                Swap::Conflict => {}
            }
            let current = match self.kv.entry(&self.key).await {
                Ok(entry) => entry.filter(|e| e.operation == kv::Operation::Put),
                Err(e) => return Swapped::Failed(store_err(e)),
            };
            let Some(current) = current else {
                return Swapped::Fenced;
            };
            if current.value == *value {
                return Swapped::Done(current.revision);
            }
            let earlier = self.earlier.as_ref() == Some(&current.value);
            if !earlier || adopted {
                return Swapped::Fenced;
            }
            adopted = true;
            self.revision = Some(current.revision);
        }
    }

    async fn try_swap(&self, value: Bytes) -> Swap {
        match self.revision {
            Some(rev) => match self.kv.update(&self.key, value, rev).await {
                Ok(revision) => Swap::Done(revision),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Swap::Conflict,
                Err(e) => Swap::Failed(e.to_string()),
            },
            None => match self.kv.create(&self.key, value).await {
                Ok(revision) => Swap::Done(revision),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Swap::Conflict,
                Err(e) => Swap::Failed(e.to_string()),
            },
        }
    }
}

/// The name of a compaction's buckets, new for each.
fn new_generation() -> String {
    format!("{:016x}", super::random_u64())
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
    /// This instance's name for its announcements, and the number of the next.
    announcer: (String, u64),
    /// The announcement keys stored (found at load or written since), purged by the next save.
    announced: BTreeSet<String>,
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

fn store_err(e: impl std::fmt::Display) -> Error {
    Error::Store {
        store: "nats",
        message: e.to_string(),
    }
}

#[async_trait::async_trait]
impl Backend for NatsStore {
    /// Loads the checkpoint, if any, and the announcements tied to it (or, without one, to no
    /// checkpoint) with the problems of those that could not be decoded.
    async fn load(&mut self, journal: &mut Journal) -> Result<Loaded> {
        let found = self.load_checkpoint(journal).await?;
        let prefix = self.announced_prefix();
        let filter = format!("{}{prefix}>", self.kv.prefix);
        let mut subjects = self
            .kv
            .stream
            .info_with_subjects(&filter)
            .await
            .map_err(store_err)?;
        self.announced.clear();
        while let Some((subject, _)) = subjects.try_next().await.map_err(store_err)? {
            if let Some(key) = subject.strip_prefix(&self.kv.prefix) {
                self.announced.insert(key.to_owned());
            }
        }
        let tie = self.revision.unwrap_or(0).to_string();
        // A purged key answers nothing.
        let stored: Vec<Bytes> = get_all(&self.kv, self.announced.iter().cloned().collect())
            .await?
            .into_iter()
            .flatten()
            .collect();
        let (entries, problems) = announce::entries_tied(&tie, stored.iter().map(|r| &r[..]));
        Ok((found, entries, problems))
    }

    /// Saves in place: a compaction is written in batches of about [`BATCH_BYTES`] as its
    /// buckets are encoded (a large index is never held whole), then its last batch and the meta
    /// record as a staged save; a journal record is staged and written at once.
    async fn save(
        &mut self,
        resource_version: &str,
        known: &mut KnownObjects,
        digests: bool,
        plan: Plan,
        journal: &mut Journal,
    ) -> Result<()> {
        if let Plan::Append(_) = plan {
            let staged = self.stage(resource_version, known, digests, plan, journal);
            return self.finish(staged.write().await, journal);
        }
        let mut buckets = self.buckets.clone();
        let meta = Meta::new(&self.key, self.cluster.as_ref(), resource_version, known);
        let generation = new_generation();
        let mut written = Vec::new();
        let mut batch = Vec::new();
        let mut bytes = 0;
        for b in known.take_dirty() {
            let parts = known.encode_bucket_parts(b, digests, RECORD_BYTES);
            bytes += parts.iter().map(Vec::len).sum::<usize>();
            batch.extend(self.place(b, parts, &generation, &mut buckets, &mut written));
            if bytes >= BATCH_BYTES {
                put_all(&self.kv, std::mem::take(&mut batch)).await?;
                bytes = 0;
            }
        }
        let staged = Staged {
            swap: self.meta_swap(),
            records: batch,
            layout: self.layout(meta, buckets, Done::Compacted(written), journal),
        };
        self.finish(staged.write().await, journal)
    }

    async fn reset(&mut self) -> Result<()> {
        self.kv.purge(self.meta_key()).await.map_err(store_err)
    }

    fn announces(&self) -> bool {
        true
    }

    /// Stores announcements of `entries`, tied to the meta record stored.
    async fn announce(&mut self, _: &Journal, entries: &[StoredEntry]) -> Result<()> {
        let tie = self.tie().await?;
        let prefix = self.announced_prefix();
        let records: Vec<(String, Bytes)> = announce::encode(&tie.to_string(), entries)
            .into_iter()
            .map(|record| {
                let (writer, seq) = &mut self.announcer;
                let key = format!("{prefix}{writer}.{seq}");
                *seq += 1;
                (key, Bytes::from(record))
            })
            .collect();
        self.announced
            .extend(records.iter().map(|(k, _)| k.clone()));
        put_all(&self.kv, records).await
    }

    /// Encoded whole, the save owns what it writes: the watch goes on while the bucket stores it.
    fn stage(
        &mut self,
        resource_version: &str,
        known: &mut KnownObjects,
        digests: bool,
        plan: Plan,
        journal: &mut Journal,
    ) -> std::result::Result<checkpoint::Staged, Plan> {
        let staged = NatsStore::stage(self, resource_version, known, digests, plan, journal);
        Ok(checkpoint::Staged::new(staged))
    }

    fn finish(&mut self, written: checkpoint::Written, journal: &mut Journal) -> Result<()> {
        let written: Written = written.downcast("nats")?;
        NatsStore::finish(self, written, journal)
    }
}

impl checkpoint::StagedSave for Staged {
    fn write(self: Box<Self>) -> BoxFuture<'static, checkpoint::Written> {
        Box::pin(async move { checkpoint::Written::new(Staged::write(*self).await) })
    }
}

impl checkpoint::WrittenSave for Written {
    fn is_ok(&self) -> bool {
        Written::is_ok(self)
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
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
            announcer: (format!("{:016x}", super::random_u64()), 1),
            announced: BTreeSet::new(),
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

    /// The prefix of this watch's announcement keys.
    fn announced_prefix(&self) -> String {
        format!("{}.a.", self.key.id)
    }

    /// The revision of the meta record stored (0: none). After a save whose outcome is unknown
    /// it is read back: either that save's record or the one before it, else another instance
    /// wrote it (fenced).
    async fn tie(&self) -> Result<u64> {
        let Some(unconfirmed) = &self.unconfirmed else {
            return Ok(self.revision.unwrap_or(0));
        };
        let current = self.kv.entry(self.meta_key()).await.map_err(store_err)?;
        match current.filter(|e| e.operation == kv::Operation::Put) {
            Some(c) if c.value == unconfirmed.value || Some(c.revision) == self.revision => {
                Ok(c.revision)
            }
            None if self.revision.is_none() => Ok(0),
            _ => Err(self.fenced()),
        }
    }

    async fn load_checkpoint(&mut self, journal: &mut Journal) -> Result<Option<Found>> {
        let entry = self.kv.entry(self.meta_key()).await.map_err(store_err)?;
        let Some(entry) = entry.filter(|e| e.operation == kv::Operation::Put) else {
            self.revision = None;
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
        let named: Vec<(usize, usize)> = meta
            .buckets
            .keys()
            .flat_map(|&b| (0..meta.parts_of(b)).map(move |p| (b, p)))
            .collect();
        let keys = named
            .iter()
            .map(|&(b, p)| self.bucket_key(b, &meta.buckets[&b], p))
            .collect();
        let mut stored: BTreeMap<usize, Vec<(usize, Bytes)>> = BTreeMap::new();
        let read = get_all(&self.kv, keys).await?;
        for ((b, p), record) in named.iter().zip(read) {
            let parts = stored.entry(*b).or_default();
            parts.extend(record.map(|r| (*p, r)));
        }
        let names: Vec<_> = meta.journal.iter().flat_map(Segment::names).collect();
        let keys = names
            .iter()
            .map(|(writer, seq)| self.journal_key(writer, *seq))
            .collect();
        let read = get_all(&self.kv, keys).await?;
        let records: Vec<(String, Option<Bytes>)> = names
            .iter()
            .map(|(writer, seq)| format!("{writer}.{seq}"))
            .zip(read)
            .collect();
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

    /// Encodes a save whole (the journal records, or every changed bucket under a fresh
    /// generation) with its meta record, to be written apart from the store.
    fn stage(
        &mut self,
        resource_version: &str,
        known: &mut KnownObjects,
        digests: bool,
        plan: Plan,
        journal: &mut Journal,
    ) -> Staged {
        let mut buckets = self.buckets.clone();
        let mut meta = Meta::new(&self.key, self.cluster.as_ref(), resource_version, known);
        let mut records = Vec::new();
        let done = match plan {
            Plan::Compact => {
                let generation = new_generation();
                let mut written = Vec::new();
                for b in known.take_dirty() {
                    let parts = known.encode_bucket_parts(b, digests, RECORD_BYTES);
                    records.extend(self.place(b, parts, &generation, &mut buckets, &mut written));
                }
                Done::Compacted(written)
            }
            Plan::Append(appended) => {
                let reserved = journal.reserve(appended.len());
                let names = reserved.iter().flat_map(Segment::names);
                for ((writer, seq), record) in names.zip(&appended) {
                    records.push((self.journal_key(writer, seq), Bytes::from(record.clone())));
                }
                meta.journal = journal.segments_after(reserved.as_ref());
                Done::Appended(reserved, appended)
            }
        };
        Staged {
            swap: self.meta_swap(),
            records,
            layout: self.layout(meta, buckets, done, journal),
        }
    }

    /// Applies a written save: once its meta record is swapped in, the store and the journal
    /// name what it holds; a swap of unknown outcome is remembered (the store may hold it).
    fn finish(&mut self, written: Written, journal: &mut Journal) -> Result<()> {
        let Written { staged, swapped } = written;
        let Staged { swap, layout, .. } = staged;
        self.revision = swap.revision;
        let revision = match swapped {
            Swapped::Done(revision) => revision,
            Swapped::Fenced => return Err(self.fenced()),
            Swapped::Failed(e) => return Err(e),
            Swapped::Unknown(message) => {
                self.unconfirmed = Some(Unconfirmed {
                    value: layout.meta,
                    buckets: layout.buckets,
                    journal: layout.journal,
                });
                return Err(store_err(message));
            }
        };
        self.revision = Some(revision);
        self.buckets = layout.buckets;
        self.unconfirmed = None;
        // Purged with the stale records (the save covers them): their keys are used again.
        self.announced.clear();
        self.announcer.1 = 1;
        match layout.done {
            Done::Compacted(written) => journal.compacted(written, None),
            Done::Appended(reserved, records) => journal.appended(reserved.as_ref(), &records),
        }
        Ok(())
    }

    /// Names the `parts` of bucket `b` under `generation` (an empty bucket is stored as none),
    /// and notes where the bucket is stored.
    fn place(
        &self,
        b: usize,
        parts: Vec<Vec<u8>>,
        generation: &str,
        buckets: &mut Named,
        written: &mut Vec<(usize, Stored)>,
    ) -> Vec<(String, Bytes)> {
        buckets.remove(&b);
        let bytes = parts.iter().map(Vec::len).sum();
        if bytes == 0 {
            written.push((b, Stored::default()));
            return Vec::new();
        }
        let n = parts.len();
        written.push((b, Stored { bytes, parts: n }));
        buckets.insert(b, (generation.to_owned(), n));
        parts
            .into_iter()
            .enumerate()
            .map(|(p, part)| (self.bucket_key(b, generation, p), Bytes::from(part)))
            .collect()
    }

    /// The meta record naming `buckets` (and `meta.journal`), and what it leaves stale.
    fn layout(&self, mut meta: Meta, buckets: Named, done: Done, journal: &Journal) -> Layout {
        meta.buckets = buckets.iter().map(|(b, (g, _))| (*b, g.clone())).collect();
        meta.parts = buckets
            .iter()
            .filter(|(_, (_, n))| *n > 1)
            .map(|(b, (_, n))| (*b, *n))
            .collect();
        let stale = self.stale_after(&buckets, &meta.journal, journal);
        Layout {
            meta: Bytes::from(meta.to_bytes()),
            buckets,
            journal: std::mem::take(&mut meta.journal),
            stale,
            done,
        }
    }

    /// The keys named by no meta record once the one naming `buckets` and `segments` is
    /// stored: buckets replaced, the journal records of the previous meta record (after a
    /// compaction), those of an unconfirmed write (whether or not it happened), and every
    /// announcement (tied to an earlier meta record).
    fn stale_after(
        &self,
        buckets: &Named,
        segments: &[Segment],
        journal: &Journal,
    ) -> BTreeSet<String> {
        let mut stale: BTreeSet<(usize, (String, usize))> =
            self.buckets.clone().into_iter().collect();
        let mut old_journal: Vec<Segment> = journal.segments().to_vec();
        if let Some(unconfirmed) = &self.unconfirmed {
            stale.extend(unconfirmed.buckets.clone());
            old_journal.extend(unconfirmed.journal.iter().cloned());
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
        keys.extend(self.announced.iter().cloned());
        keys
    }

    /// The swap of the meta record expected next (an earlier unconfirmed write may be adopted).
    fn meta_swap(&self) -> MetaSwap {
        MetaSwap {
            kv: self.kv.clone(),
            key: self.meta_key(),
            revision: self.revision,
            earlier: self.unconfirmed.as_ref().map(|u| u.value.clone()),
        }
    }

    fn fenced(&self) -> Error {
        Error::Fenced {
            watch: self.key.description.clone(),
        }
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
