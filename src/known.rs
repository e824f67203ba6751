//! The known-object index: for every watched object only what a relist diff needs
//! (uid, resourceVersion, namespace, name), never the object itself.
//!
//! After a watch loses its history (410 Gone) the bridge lists again and diffs the listing against
//! this index, as kubert's `index.rs` does: keys known before but absent from the listing are
//! deletions. The index is split into [`BUCKETS`] buckets by uid so that a checkpoint rewrites
//! only the buckets that changed.
//!
//! Memory is what limits how many objects one process can watch, so an entry is kept compact
//! (no allocation of its own in the common case; figures in docs/benchmarks.md, "Memory"): a uid
//! that is a UUID in the API server's canonical form is kept as its 16 bytes, any other uid as
//! text; a resourceVersion that is a decimal integer as a `u64`, any other as text (they are
//! opaque by contract); a name of up to 24 bytes inline ([`CompactString`]); the namespace as a
//! 4-byte number into a table of interned names. Entries with packed uids are kept densely
//! ([`dense`]). Every value is given back exactly as it was received.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::Arc;

use compact_str::CompactString;
use uuid::Uuid;

use dense::Dense;

mod dense;

/// Number of buckets; a checkpoint stores each bucket as one record, or in parts of bounded
/// size once it grows past the bound ([`KnownObjects::encode_bucket_parts`]; record sizes by
/// index size are in docs/architecture.md, "Who owns which state").
pub const BUCKETS: usize = 256;

/// What the index knows of one object, as [`KnownObjects::get`] gives it back (it is kept in
/// a compact form of its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The last resourceVersion seen.
    pub resource_version: Box<str>,
    /// Namespace, `None` for cluster-scoped objects.
    pub namespace: Option<Arc<str>>,
    /// Name.
    pub name: Box<str>,
    /// Content digest of the last version published or compared ([`crate::payload::digest`]);
    /// 0 when unknown.
    pub digest: u64,
}

/// How an observed object relates to what the index knew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// A uid the index did not know.
    New,
    /// A known uid with another resourceVersion.
    Changed,
    /// A known uid at the same resourceVersion: nothing to publish.
    Unchanged,
    /// A known uid with another resourceVersion but the same content digest: only noise
    /// changed (resourceVersion, managedFields, ignored paths), nothing to publish.
    Touched,
}

/// How a stored bucket is written: checkpoint meta records carry the version that says which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Checkpoint version 1: a line `uid resourceVersion namespace|- name [digest]` per object.
    /// Ambiguous for names with spaces (RBAC objects may have them), so only read, never written.
    Text,
    /// Checkpoint version 2: a JSON list of `[uid, resourceVersion, namespace|null, name, digest]`
    /// (digest 0: unknown), sorted by uid. JSON strings round-trip every string the API server
    /// accepts; an empty bucket is an empty record.
    Json,
}

/// Errors of decoding a stored bucket.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The bucket number is not below [`BUCKETS`].
    #[error("bucket {bucket} is out of range (there are {BUCKETS})")]
    Range {
        /// The bucket number.
        bucket: usize,
    },
    /// A text bucket is not UTF-8.
    #[error("bucket {bucket} is not UTF-8")]
    Utf8 {
        /// The bucket number.
        bucket: usize,
    },
    /// A line of a text bucket does not have the expected fields.
    #[error(
        "bucket {bucket} line {line}: expected `uid resourceVersion namespace|- name [digest]`"
    )]
    Line {
        /// The bucket number.
        bucket: usize,
        /// 1-based line number.
        line: usize,
    },
    /// A JSON bucket (or one part of it) is not a list of
    /// `[uid, resourceVersion, namespace|null, name, digest]`.
    #[error(
        "bucket {bucket}{} is not a JSON list of [uid, resourceVersion, namespace|null, name, digest]",
        part_of(*.part)
    )]
    Json {
        /// The bucket number.
        bucket: usize,
        /// The part, when the bucket is stored in several.
        part: Option<usize>,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// A part of a bucket stored in several is empty (a bucket is only split when its entries
    /// fill more than one part).
    #[error("bucket {bucket} part {part} is empty")]
    EmptyPart {
        /// The bucket number.
        bucket: usize,
        /// The part.
        part: usize,
    },
    /// The entries of a bucket stored in several parts are not in uid order across the parts:
    /// the parts were not split from one bucket record.
    #[error("bucket {bucket} part {part} does not continue the uid order of the parts before it")]
    Unordered {
        /// The bucket number.
        bucket: usize,
        /// The first part out of order.
        part: usize,
    },
    /// An object's uid belongs in another bucket (it could never be found there).
    #[error("bucket {bucket} holds an object of bucket {belongs}")]
    Misplaced {
        /// The bucket number.
        bucket: usize,
        /// The bucket its uid belongs in.
        belongs: usize,
    },
    /// The same uid twice.
    #[error("bucket {bucket} holds one uid twice")]
    Duplicate {
        /// The bucket number.
        bucket: usize,
    },
}

/// One stored object of a [`Encoding::Json`] bucket, as written: the uid as text, the
/// resourceVersion as a JSON string whatever its kept form.
type Record<'a> = (&'a str, RvText<'a>, Option<&'a str>, &'a str, u64);
/// The same, decoded (strings with escapes cannot be borrowed).
type OwnedRecord = (Box<str>, Box<str>, Option<Box<str>>, Box<str>, u64);

/// A uid as kept: the 16 bytes of a UUID in canonical text form (lowercase, hyphenated: what
/// the API server generates), else the text itself (the API server accepts any string).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key<'a> {
    Uuid([u8; 16]),
    Text(&'a str),
}

impl<'a> Key<'a> {
    fn of(uid: &'a str) -> Self {
        // `try_parse` also takes upper case: only the form that prints back identically is packed.
        match Uuid::try_parse(uid) {
            Ok(u) if uid.len() == 36 && !uid.bytes().any(|c| c.is_ascii_uppercase()) => {
                Key::Uuid(u.into_bytes())
            }
            _ => Key::Text(uid),
        }
    }
}

/// The text of a packed uid, on the stack.
fn uuid_text(bytes: &[u8; 16]) -> [u8; 36] {
    let mut buf = [0; 36];
    Uuid::from_bytes(*bytes).hyphenated().encode_lower(&mut buf);
    buf
}

/// A resourceVersion as kept: a decimal integer as written by the API server (no sign, no
/// leading zero) as a number, any other text as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Rv {
    Int(u64),
    Text(Box<str>),
}

impl Rv {
    fn new(rv: &str) -> Self {
        match Self::integer(rv) {
            Some(n) => Rv::Int(n),
            None => Rv::Text(rv.into()),
        }
    }

    /// The number `rv` spells if it prints back identically.
    fn integer(rv: &str) -> Option<u64> {
        let canonical = rv.bytes().all(|c| c.is_ascii_digit())
            && !rv.is_empty()
            && (rv.len() == 1 || !rv.starts_with('0'));
        canonical.then(|| rv.parse().ok()).flatten()
    }

    fn is(&self, rv: &str) -> bool {
        match self {
            Rv::Int(n) => Self::integer(rv) == Some(*n),
            Rv::Text(t) => &**t == rv,
        }
    }

    fn text(&self) -> Box<str> {
        match self {
            Rv::Int(n) => n.to_string().into(),
            Rv::Text(t) => t.clone(),
        }
    }
}

/// Serializes an [`Rv`] as the JSON string of its text, without building the text.
struct RvText<'a>(&'a Rv);

impl serde::Serialize for RvText<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Rv::Int(n) => s.collect_str(n),
            Rv::Text(t) => s.serialize_str(t),
        }
    }
}

/// What the index keeps of one object (the compact form of an [`Entry`]).
#[derive(Debug, Clone)]
struct Slot {
    digest: u64,
    resource_version: Rv,
    name: CompactString,
    /// 1 + the index of the interned namespace; `None` for cluster-scoped objects.
    namespace: Option<NonZeroU32>,
}

/// The objects of one bucket: packed uids in a dense table, other uids (rare) in a map.
#[derive(Debug, Clone, Default)]
struct Bucket {
    uuids: Dense<Slot>,
    texts: HashMap<Box<str>, Slot>,
}

impl Bucket {
    fn len(&self) -> usize {
        self.uuids.len() + self.texts.len()
    }

    fn is_empty(&self) -> bool {
        self.uuids.is_empty() && self.texts.is_empty()
    }

    fn get(&self, key: Key<'_>) -> Option<&Slot> {
        match key {
            Key::Uuid(u) => self.uuids.get(&u),
            Key::Text(t) => self.texts.get(t),
        }
    }

    fn get_mut(&mut self, key: Key<'_>) -> Option<&mut Slot> {
        match key {
            Key::Uuid(u) => self.uuids.get_mut(&u),
            Key::Text(t) => self.texts.get_mut(t),
        }
    }

    fn remove(&mut self, key: Key<'_>) -> Option<Slot> {
        match key {
            Key::Uuid(u) => self.uuids.remove(&u),
            Key::Text(t) => self.texts.remove(t),
        }
    }

    /// Inserts `slot` unless the key is there; says whether it was inserted.
    fn insert_new(&mut self, key: Key<'_>, slot: Slot) -> bool {
        match key {
            Key::Uuid(u) => self.uuids.insert_new(u, slot),
            Key::Text(t) if self.texts.contains_key(t) => false,
            Key::Text(t) => {
                self.texts.insert(t.into(), slot);
                true
            }
        }
    }

    fn slots(&self) -> impl Iterator<Item = &Slot> {
        self.uuids.values().chain(self.texts.values())
    }

    /// Every object as (uid text, slot).
    fn iter(&self) -> impl Iterator<Item = (UidText<'_>, &Slot)> {
        let packed = self
            .uuids
            .iter()
            .map(|(u, slot)| (UidText::Uuid(uuid_text(u)), slot));
        packed.chain(self.texts.iter().map(|(t, slot)| (UidText::Text(t), slot)))
    }

    /// Every object as (uid text, slot), sorted by uid: a packed uid's text sorts as its bytes
    /// do, but text uids interleave with them, so all are compared as text.
    fn sorted(&self) -> Vec<(UidText<'_>, &Slot)> {
        let mut all: Vec<(UidText<'_>, &Slot)> = self.iter().collect();
        all.sort_unstable_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        all
    }
}

/// The text of a uid, borrowed or formatted on the stack.
enum UidText<'a> {
    Uuid([u8; 36]),
    Text(&'a str),
}

impl UidText<'_> {
    fn as_str(&self) -> &str {
        match self {
            // Only ever filled by `uuid_text`: ASCII.
            UidText::Uuid(buf) => std::str::from_utf8(buf).expect("a formatted uuid is ASCII"),
            UidText::Text(t) => t,
        }
    }
}

/// One object as checkpoints store it: `(uid, resourceVersion, namespace, name, digest)`, the
/// element of an [`Encoding::Json`] bucket and of a checkpoint journal record.
pub type StoredEntry = OwnedRecord;

/// Changes tracked for a checkpoint journal stop being tracked one by one past this many and
/// past a quarter of the index: the next checkpoint then rewrites the changed buckets instead.
const TRACKED_CHANGES: usize = 1024;

/// The uids upserted or removed since the last [`KnownObjects::take_changes`].
#[derive(Debug)]
enum Changes {
    /// Every changed uid.
    Tracked(HashSet<Box<str>>),
    /// Too many to track, or the whole index must be stored again.
    Overflowed,
}

/// uid -> [`Entry`] for one watch.
#[derive(Debug)]
pub struct KnownObjects {
    buckets: Vec<Bucket>,
    /// Interned namespaces, by [`Slot::namespace`] - 1.
    namespaces: Vec<Arc<str>>,
    namespace_ids: HashMap<Arc<str>, NonZeroU32>,
    dirty: BTreeSet<usize>,
    /// Entries known before a relist and not listed yet.
    relisting: Option<Vec<Bucket>>,
    /// The uids of `relisting` by the hash of their namespace and name, made at the first new
    /// uid a relist finds ([`KnownObjects::take_predecessor`]); entries listed since are
    /// skipped when looked up.
    relisting_names: Option<HashMap<u64, Vec<Box<str>>>>,
    /// Changes since the last checkpoint, for its journal record.
    changes: Changes,
}

impl Default for KnownObjects {
    fn default() -> Self {
        Self {
            buckets: vec![Bucket::default(); BUCKETS],
            namespaces: Vec::new(),
            namespace_ids: HashMap::new(),
            dirty: BTreeSet::new(),
            relisting: None,
            relisting_names: None,
            changes: Changes::Tracked(HashSet::new()),
        }
    }
}

/// 64-bit FNV-1a of `bytes`: the hash of everything persisted (index buckets, watch keys), so it
/// must stay the same across versions and platforms (`std`'s hashers promise neither).
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The hash of an object's namespace and name (in memory only).
fn name_hash(namespace: Option<&str>, name: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&(namespace, name), &mut h);
    std::hash::Hasher::finish(&h)
}

/// The bucket of a uid ([`stable_hash`]; it is persisted).
pub fn bucket_of(uid: &str) -> usize {
    (stable_hash(uid.as_bytes()) % BUCKETS as u64) as usize
}

impl KnownObjects {
    /// Number of known objects.
    pub fn len(&self) -> usize {
        self.buckets.iter().map(Bucket::len).sum()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.buckets.iter().all(Bucket::is_empty)
    }

    /// What the index knows of `uid`.
    pub fn get(&self, uid: &str) -> Option<Entry> {
        self.buckets[bucket_of(uid)]
            .get(Key::of(uid))
            .map(|slot| self.entry(slot))
    }

    /// Records an object seen at `resource_version` with content `digest` (0: not computed) and
    /// says how it relates to what was known (during a relist: to what was known before the
    /// relist). A touched entry takes the new resourceVersion without dirtying its bucket: the
    /// stored digest still describes it, so noise never costs a checkpoint write.
    pub fn observe(
        &mut self,
        uid: &str,
        resource_version: &str,
        namespace: Option<&str>,
        name: &str,
        digest: u64,
    ) -> Seen {
        let (b, key) = (bucket_of(uid), Key::of(uid));
        if let Some(previous) = self.relisting.as_mut()
            && let Some(slot) = previous[b].remove(key)
        {
            self.buckets[b].insert_new(key, slot);
        }
        if let Some(slot) = self.buckets[b].get_mut(key) {
            if slot.resource_version.is(resource_version) {
                return Seen::Unchanged;
            }
            slot.resource_version = Rv::new(resource_version);
            if digest != 0 && slot.digest == digest {
                return Seen::Touched;
            }
            slot.digest = digest;
            self.dirty.insert(b);
            self.track(uid);
            return Seen::Changed;
        }
        let slot = Slot {
            digest,
            resource_version: Rv::new(resource_version),
            name: name.into(),
            namespace: namespace.map(|ns| self.intern(ns)),
        };
        self.buckets[b].insert_new(key, slot);
        self.dirty.insert(b);
        self.track(uid);
        Seen::New
    }

    /// Forgets a deleted object; returns what was known of it.
    pub fn remove(&mut self, uid: &str) -> Option<Entry> {
        let b = bucket_of(uid);
        let removed = self.buckets[b].remove(Key::of(uid))?;
        self.dirty.insert(b);
        self.track(uid);
        Some(self.entry(&removed))
    }

    /// Starts a relist: objects then fed to [`KnownObjects::observe`] are compared with what was
    /// known before; [`KnownObjects::finish_relist`] returns the objects that vanished.
    pub fn begin_relist(&mut self) {
        self.abort_relist();
        self.relisting_names = None;
        let previous = std::mem::replace(&mut self.buckets, vec![Bucket::default(); BUCKETS]);
        self.relisting = Some(previous);
    }

    /// The namespace (`None`: cluster-scoped) and name of every object of the index, in no
    /// particular order.
    pub fn names(&self) -> impl Iterator<Item = (Option<&str>, &str)> {
        self.buckets.iter().flat_map(Bucket::slots).map(|slot| {
            let namespace = slot
                .namespace
                .map(|id| &*self.namespaces[id.get() as usize - 1]);
            (namespace, slot.name.as_str())
        })
    }

    /// Ends a relist: every object known before but not listed, as (uid, entry), sorted by uid so
    /// synthetic deletes come out in a stable order. They are removed from the index.
    pub fn finish_relist(&mut self) -> Vec<(Box<str>, Entry)> {
        self.relisting_names = None;
        let Some(previous) = self.relisting.take() else {
            return Vec::new();
        };
        let mut gone: Vec<(Box<str>, Entry)> = Vec::new();
        for (b, bucket) in previous.iter().enumerate() {
            if !bucket.is_empty() {
                self.dirty.insert(b);
                gone.extend(
                    bucket
                        .iter()
                        .map(|(uid, slot)| (uid.as_str().into(), self.entry(slot))),
                );
            }
        }
        gone.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (uid, _) in &gone {
            self.track(uid);
        }
        for bucket in &mut self.buckets {
            bucket.uuids.fit();
        }
        gone
    }

    /// During a relist, the object known before it under `namespace`/`name` and not listed
    /// (yet): the predecessor of a new uid listed under that name, deleted and recreated while
    /// the history was lost. It is taken out of the relist, so it is deleted now, before its
    /// successor is added, never after it (a compacted topic keyed by name keeps the last record).
    pub fn take_predecessor(
        &mut self,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<(Box<str>, Entry)> {
        let previous = self.relisting.as_ref()?;
        let names = self.relisting_names.get_or_insert_with(|| {
            let mut names: HashMap<u64, Vec<Box<str>>> = HashMap::new();
            for bucket in previous {
                for (uid, slot) in bucket.iter() {
                    let ns = slot
                        .namespace
                        .map(|id| &*self.namespaces[id.get() as usize - 1]);
                    let key = name_hash(ns, &slot.name);
                    names.entry(key).or_default().push(uid.as_str().into());
                }
            }
            names
        });
        let candidates = names.get(&name_hash(namespace, name))?.clone();
        for uid in candidates {
            let b = bucket_of(&uid);
            let previous = self.relisting.as_mut()?;
            let Some(slot) = previous[b].get(Key::of(&uid)) else {
                continue;
            };
            let ns = slot
                .namespace
                .map(|id| &*self.namespaces[id.get() as usize - 1]);
            if ns != namespace || slot.name.as_str() != name {
                continue;
            }
            let slot = previous[b].remove(Key::of(&uid))?;
            self.dirty.insert(b);
            self.track(&uid);
            let entry = self.entry(&slot);
            return Some((uid, entry));
        }
        None
    }

    /// Abandons a relist (a failed page): entries not reached are kept, so nothing is deleted
    /// without a complete listing.
    pub fn abort_relist(&mut self) {
        self.relisting_names = None;
        if let Some(previous) = self.relisting.take() {
            for (b, bucket) in previous.into_iter().enumerate() {
                let current = &mut self.buckets[b];
                for (u, slot) in bucket.uuids {
                    current.uuids.insert_new(u, slot);
                }
                for (t, slot) in bucket.texts {
                    current.texts.entry(t).or_insert(slot);
                }
            }
        }
    }

    /// Buckets changed since the last [`KnownObjects::take_dirty`].
    pub fn take_dirty(&mut self) -> BTreeSet<usize> {
        std::mem::take(&mut self.dirty)
    }

    /// Whether any entry holds a content digest.
    pub fn has_digests(&self) -> bool {
        self.buckets
            .iter()
            .flat_map(Bucket::slots)
            .any(|slot| slot.digest != 0)
    }

    /// Marks every bucket changed (a first checkpoint writes them all).
    pub fn mark_all_dirty(&mut self) {
        self.dirty = (0..BUCKETS).collect();
        self.changes = Changes::Overflowed;
    }

    /// The uids upserted or removed since the last call (an upsert if [`KnownObjects::get`]
    /// finds the uid, else a removal), for a checkpoint journal record; `None` when they were
    /// too many to track or [`KnownObjects::mark_all_dirty`] was called: the checkpoint must
    /// then rewrite the changed buckets. Buckets stay dirty until [`KnownObjects::take_dirty`].
    pub fn take_changes(&mut self) -> Option<Vec<Box<str>>> {
        match std::mem::replace(&mut self.changes, Changes::Tracked(HashSet::new())) {
            Changes::Tracked(uids) => Some(uids.into_iter().collect()),
            Changes::Overflowed => None,
        }
    }

    /// The entry of `uid` as checkpoints store it (digest 0 unless `digests`).
    pub fn stored_entry(&self, uid: &str, digests: bool) -> Option<StoredEntry> {
        self.get(uid).map(|e| {
            (
                uid.into(),
                e.resource_version,
                e.namespace.as_deref().map(Into::into),
                e.name,
                if digests { e.digest } else { 0 },
            )
        })
    }

    /// Replays a stored upsert of a checkpoint journal: inserts or replaces the entry, marking
    /// its bucket dirty and the change tracked (see [`KnownObjects::take_changes`]).
    pub fn apply_stored(&mut self, (uid, rv, ns, name, digest): StoredEntry) {
        let (b, key) = (bucket_of(&uid), Key::of(&uid));
        let slot = Slot {
            digest,
            resource_version: Rv::new(&rv),
            name: name.as_ref().into(),
            namespace: ns.map(|ns| self.intern(&ns)),
        };
        self.track(&uid);
        self.buckets[b].remove(key);
        self.buckets[b].insert_new(key, slot);
        self.dirty.insert(b);
    }

    fn track(&mut self, uid: &str) {
        let Changes::Tracked(uids) = &mut self.changes else {
            return;
        };
        if uids.contains(uid) {
            return;
        }
        if uids.len() >= TRACKED_CHANGES
            && uids.len() % TRACKED_CHANGES == 0
            && uids.len() > self.buckets.iter().map(Bucket::len).sum::<usize>() / 4
        {
            self.changes = Changes::Overflowed;
            return;
        }
        uids.insert(uid.into());
    }

    /// One bucket in the current [`Encoding::Json`]; empty when the bucket is. Content digests
    /// are written only if `digests` (see [`crate::checkpoint::Store::set_redacted`]): else 0,
    /// unknown.
    pub fn encode_bucket(&self, b: usize, digests: bool) -> Vec<u8> {
        let mut whole = self.encode_bucket_parts(b, digests, usize::MAX);
        whole.pop().unwrap_or_default()
    }

    /// One bucket in the current [`Encoding::Json`], split into parts of at most `bound` bytes:
    /// each part is a JSON list of whole entries, the parts in uid order, so that they hold,
    /// concatenated in order, what [`KnownObjects::encode_bucket`] holds (a bucket that fits is
    /// one part, byte for byte that record; an empty bucket is one empty part). A part holds one
    /// entry at least: only an entry longer than `bound` by itself makes a longer part.
    pub fn encode_bucket_parts(&self, b: usize, digests: bool, bound: usize) -> Vec<Vec<u8>> {
        let bucket = &self.buckets[b];
        let mut parts = Vec::new();
        let mut part: Vec<u8> = Vec::new();
        let mut entry = Vec::new();
        for (uid, slot) in bucket.sorted() {
            let record: Record<'_> = (
                uid.as_str(),
                RvText(&slot.resource_version),
                slot.namespace
                    .map(|id| &*self.namespaces[id.get() as usize - 1]),
                slot.name.as_str(),
                if digests { slot.digest } else { 0 },
            );
            entry.clear();
            // Serializing strings and integers into memory cannot fail.
            serde_json::to_writer(&mut entry, &record).expect("entry serializes");
            // The separator before the entry and the `]` after it.
            if !part.is_empty() && part.len().saturating_add(entry.len() + 2) > bound {
                part.push(b']');
                parts.push(std::mem::take(&mut part));
            }
            part.push(if part.is_empty() { b'[' } else { b',' });
            part.extend_from_slice(&entry);
        }
        if !part.is_empty() {
            part.push(b']');
        }
        parts.push(part);
        parts
    }

    /// Loads one stored bucket (replacing what the index held for that bucket). On error the
    /// index is unchanged.
    pub fn decode_bucket(
        &mut self,
        b: usize,
        stored: &[u8],
        encoding: Encoding,
    ) -> Result<(), DecodeError> {
        self.decode_bucket_parts(b, &[stored], encoding)
    }

    /// Loads one bucket stored in `parts` (as [`KnownObjects::encode_bucket_parts`] writes them,
    /// in order), replacing what the index held for that bucket. A bucket in several parts must
    /// have no empty part and its entries in uid order across the parts. On error the index is
    /// unchanged.
    pub fn decode_bucket_parts(
        &mut self,
        b: usize,
        parts: &[&[u8]],
        encoding: Encoding,
    ) -> Result<(), DecodeError> {
        if b >= BUCKETS {
            return Err(DecodeError::Range { bucket: b });
        }
        let split = parts.len() > 1;
        let mut records: Vec<OwnedRecord> = Vec::new();
        for (p, stored) in parts.iter().enumerate() {
            let first = records.len();
            match encoding {
                Encoding::Text => records.extend(decode_text(b, stored)?),
                Encoding::Json if stored.is_empty() && split => {
                    return Err(DecodeError::EmptyPart { bucket: b, part: p });
                }
                Encoding::Json if stored.is_empty() => {}
                Encoding::Json => {
                    records.extend(serde_json::from_slice::<Vec<OwnedRecord>>(stored).map_err(
                        |source| DecodeError::Json {
                            bucket: b,
                            part: split.then_some(p),
                            source,
                        },
                    )?)
                }
            }
            let ordered = |r: &[OwnedRecord]| r.windows(2).all(|w| w[0].0 < w[1].0);
            if split && !ordered(&records[first.saturating_sub(1)..]) {
                return Err(DecodeError::Unordered { bucket: b, part: p });
            }
        }
        let mut bucket = Bucket::default();
        for (uid, rv, ns, name, digest) in records {
            let belongs = bucket_of(&uid);
            if belongs != b {
                return Err(DecodeError::Misplaced { bucket: b, belongs });
            }
            let slot = Slot {
                digest,
                resource_version: Rv::new(&rv),
                name: name.as_ref().into(),
                namespace: ns.map(|ns| self.intern(&ns)),
            };
            if !bucket.insert_new(Key::of(&uid), slot) {
                return Err(DecodeError::Duplicate { bucket: b });
            }
        }
        bucket.uuids.fit();
        bucket.texts.shrink_to_fit();
        self.buckets[b] = bucket;
        Ok(())
    }

    /// The number of an interned namespace (interned now if new). Namespaces are few: the table
    /// only grows.
    fn intern(&mut self, ns: &str) -> NonZeroU32 {
        if let Some(id) = self.namespace_ids.get(ns) {
            return *id;
        }
        let arc: Arc<str> = ns.into();
        self.namespaces.push(arc.clone());
        let id = u32::try_from(self.namespaces.len())
            .ok()
            .and_then(NonZeroU32::new)
            .expect("fewer than 2^32 namespaces");
        self.namespace_ids.insert(arc, id);
        id
    }

    /// The [`Entry`] a slot stands for.
    fn entry(&self, slot: &Slot) -> Entry {
        Entry {
            resource_version: slot.resource_version.text(),
            namespace: slot
                .namespace
                .map(|id| self.namespaces[id.get() as usize - 1].clone()),
            name: slot.name.as_str().into(),
            digest: slot.digest,
        }
    }
}

/// `" part {p}"` for a bucket stored in parts, else nothing.
fn part_of(part: Option<usize>) -> String {
    part.map(|p| format!(" part {p}")).unwrap_or_default()
}

/// The records of a version-1 text bucket.
fn decode_text(b: usize, stored: &[u8]) -> Result<Vec<OwnedRecord>, DecodeError> {
    let text = std::str::from_utf8(stored).map_err(|_| DecodeError::Utf8 { bucket: b })?;
    let mut records = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.is_empty()) {
        let bad = || DecodeError::Line {
            bucket: b,
            line: i + 1,
        };
        let mut parts = line.split(' ');
        let (Some(uid), Some(rv), Some(ns), Some(name), digest, None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(bad());
        };
        let digest = match digest {
            None => 0,
            Some(hex) => u64::from_str_radix(hex, 16).map_err(|_| bad())?,
        };
        let ns = (ns != "-").then(|| ns.into());
        records.push((uid.into(), rv.into(), ns, name.into(), digest));
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observe_classifies_and_interns() {
        let mut k = KnownObjects::default();
        assert_eq!(k.observe("u1", "1", Some("ns"), "a", 0), Seen::New);
        assert_eq!(k.observe("u1", "1", Some("ns"), "a", 0), Seen::Unchanged);
        assert_eq!(k.observe("u1", "2", Some("ns"), "a", 0), Seen::Changed);
        assert_eq!(k.observe("u2", "3", Some("ns"), "b", 0), Seen::New);
        let (a, b) = (k.get("u1").unwrap(), k.get("u2").unwrap());
        assert!(Arc::ptr_eq(
            a.namespace.as_ref().unwrap(),
            b.namespace.as_ref().unwrap()
        ));
        assert_eq!(k.remove("u1").unwrap().resource_version.as_ref(), "2");
        assert_eq!(k.len(), 1);
    }

    #[test]
    fn relist_diff_finds_new_changed_unchanged_and_gone() {
        let mut k = KnownObjects::default();
        k.observe("same", "1", Some("ns"), "same", 0);
        k.observe("changed", "2", Some("ns"), "changed", 0);
        k.observe("gone", "3", Some("ns"), "gone", 0);
        k.observe("recreated-old", "4", Some("ns"), "x", 0);

        k.begin_relist();
        assert_eq!(
            k.observe("same", "1", Some("ns"), "same", 0),
            Seen::Unchanged
        );
        assert_eq!(
            k.observe("changed", "9", Some("ns"), "changed", 0),
            Seen::Changed
        );
        assert_eq!(
            k.observe("recreated-new", "10", Some("ns"), "x", 0),
            Seen::New
        );
        let gone = k.finish_relist();
        let gone: Vec<_> = gone
            .iter()
            .map(|(uid, e)| (&**uid, &*e.resource_version))
            .collect();
        assert_eq!(gone, vec![("gone", "3"), ("recreated-old", "4")]);

        assert_eq!(k.len(), 3);
        assert_eq!(&*k.get("changed").unwrap().resource_version, "9");
        assert!(k.get("gone").is_none());
    }

    #[test]
    fn same_digest_is_touched_and_costs_no_checkpoint_write() {
        let mut k = KnownObjects::default();
        assert_eq!(k.observe("u", "1", None, "a", 7), Seen::New);
        k.take_dirty();
        assert_eq!(k.observe("u", "2", None, "a", 7), Seen::Touched);
        assert!(k.take_dirty().is_empty());
        assert_eq!(&*k.get("u").unwrap().resource_version, "2");
        assert_eq!(k.observe("u", "3", None, "a", 8), Seen::Changed);
        assert_eq!(
            k.observe("u", "4", None, "a", 0),
            Seen::Changed,
            "0 is unknown"
        );
        let stored = k.encode_bucket(bucket_of("u"), true);
        let mut back = KnownObjects::default();
        back.decode_bucket(bucket_of("u"), &stored, Encoding::Json)
            .unwrap();
        assert_eq!(back.get("u"), k.get("u"));
    }

    #[test]
    fn version_one_text_buckets_still_load() {
        let mut back = KnownObjects::default();
        back.decode_bucket(bucket_of("u"), b"u 1 - a 1f\n", Encoding::Text)
            .unwrap();
        assert_eq!(back.get("u").unwrap().digest, 0x1f);
        assert!(back.get("u").unwrap().namespace.is_none());
        back.decode_bucket(bucket_of("v"), b"v 2 ns b\n", Encoding::Text)
            .unwrap();
        assert_eq!(
            back.get("v").unwrap().digest,
            0,
            "checkpoints written before digests load"
        );
        assert_eq!(back.get("v").unwrap().namespace.as_deref(), Some("ns"));
        for bad in [
            &b"u 1 - a zz\n"[..],
            b"only three fields",
            b"u 1 - read only x y",
        ] {
            assert!(matches!(
                back.decode_bucket(bucket_of("u"), bad, Encoding::Text),
                Err(DecodeError::Line { line: 1, .. })
            ));
        }
        assert!(matches!(
            back.decode_bucket(bucket_of("u"), b"\xff", Encoding::Text),
            Err(DecodeError::Utf8 { .. })
        ));
    }

    #[test]
    fn names_with_spaces_round_trip() {
        let mut k = KnownObjects::default();
        k.observe("u1", "7", Some("ns"), "read only", 9);
        k.observe("u2", "8", None, "system:aggregate to edit\t\n\"x\"", 0);
        let mut back = KnownObjects::default();
        for b in 0..BUCKETS {
            back.decode_bucket(b, &k.encode_bucket(b, true), Encoding::Json)
                .unwrap();
        }
        assert_eq!(back.get("u1"), k.get("u1"));
        assert_eq!(back.get("u2"), k.get("u2"));
    }

    #[test]
    fn digests_are_left_out_on_request() {
        let mut k = KnownObjects::default();
        k.observe("u", "1", None, "a", 0x0123_4567_89ab_cdef);
        let b = bucket_of("u");
        let stored = k.encode_bucket(b, false);
        assert!(
            !String::from_utf8_lossy(&stored).contains(&0x0123_4567_89ab_cdef_u64.to_string()),
            "{}",
            String::from_utf8_lossy(&stored)
        );
        let mut back = KnownObjects::default();
        back.decode_bucket(b, &stored, Encoding::Json).unwrap();
        assert_eq!(back.get("u").unwrap().digest, 0, "stored as unknown");
        assert_eq!(
            k.get("u").unwrap().digest,
            0x0123_4567_89ab_cdef,
            "kept in memory"
        );
    }

    #[test]
    fn misplaced_duplicate_and_out_of_range_records_are_refused() {
        let mut k = KnownObjects::default();
        let other = (bucket_of("u") + 1) % BUCKETS;
        let record = br#"[["u","1",null,"a",0]]"#;
        assert!(matches!(
            k.decode_bucket(other, record, Encoding::Json),
            Err(DecodeError::Misplaced { .. })
        ));
        let twice = br#"[["u","1",null,"a",0],["u","2",null,"a",0]]"#;
        assert!(matches!(
            k.decode_bucket(bucket_of("u"), twice, Encoding::Json),
            Err(DecodeError::Duplicate { .. })
        ));
        assert!(matches!(
            k.decode_bucket(BUCKETS, record, Encoding::Json),
            Err(DecodeError::Range { .. })
        ));
        assert!(k.is_empty(), "nothing loaded from a refused bucket");
    }

    #[test]
    fn abandoned_relist_deletes_nothing() {
        let mut k = KnownObjects::default();
        k.observe("a", "1", None, "a", 0);
        k.observe("b", "2", None, "b", 0);
        k.begin_relist();
        assert_eq!(k.observe("a", "5", None, "a", 0), Seen::Changed);
        k.abort_relist();
        assert_eq!(k.len(), 2);
        assert_eq!(&*k.get("a").unwrap().resource_version, "5");
        assert_eq!(&*k.get("b").unwrap().resource_version, "2");
    }

    #[test]
    fn buckets_round_trip_and_track_changes() {
        let mut k = KnownObjects::default();
        for i in 0..1000 {
            k.observe(
                &format!("uid-{i}"),
                &i.to_string(),
                (i % 2 == 0).then_some("ns"),
                &format!("n{i}"),
                0,
            );
        }
        assert!(
            k.take_dirty().len() > 200,
            "1000 uids spread over the buckets"
        );
        k.observe("uid-7", "99", None, "n7", 0);
        assert_eq!(k.take_dirty(), BTreeSet::from([bucket_of("uid-7")]));

        let mut copy = KnownObjects::default();
        for b in 0..BUCKETS {
            copy.decode_bucket(b, &k.encode_bucket(b, true), Encoding::Json)
                .unwrap();
        }
        assert_eq!(copy.len(), 1000);
        assert_eq!(copy.get("uid-7"), k.get("uid-7"));
        assert_eq!(copy.get("uid-8").unwrap().namespace.as_deref(), Some("ns"));
        assert!(copy.get("uid-9").unwrap().namespace.is_none());
        assert!(
            copy.decode_bucket(0, b"only three fields", Encoding::Json)
                .is_err()
        );
    }

    /// Parts that are empty, out of uid order, repeated or swapped are refused, leaving the
    /// index as it was.
    #[test]
    fn parts_out_of_order_or_empty_are_refused() {
        let mut k = KnownObjects::default();
        let mut i = 0;
        while k.buckets[3].len() < 40 {
            let uid = format!("uid-{i}");
            if bucket_of(&uid) == 3 {
                k.observe(&uid, "1", Some("ns"), &format!("name-{i}"), 7);
            }
            i += 1;
        }
        let parts = k.encode_bucket_parts(3, true, 400);
        assert!(parts.len() > 3, "{} parts", parts.len());
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let mut back = KnownObjects::default();
        back.decode_bucket_parts(3, &refs, Encoding::Json).unwrap();
        assert_eq!(back.len(), 40);

        let mut swapped = refs.clone();
        swapped.swap(1, 2);
        let mut repeated = refs.clone();
        repeated[2] = refs[1];
        let mut emptied = refs.clone();
        emptied[1] = b"";
        let mut fresh = KnownObjects::default();
        for (bad, want) in [
            (swapped, "part 2 does not continue"),
            (repeated, "part 2 does not continue"),
            (emptied, "part 1 is empty"),
        ] {
            let error = fresh
                .decode_bucket_parts(3, &bad, Encoding::Json)
                .unwrap_err();
            assert!(error.to_string().contains(want), "{error}");
        }
        let mut broken = refs.clone();
        broken[1] = b"[[";
        let error = fresh
            .decode_bucket_parts(3, &broken, Encoding::Json)
            .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("bucket 3 part 1 is not a JSON list"),
            "{error}"
        );
        assert_eq!(fresh.len(), 0, "unchanged");
        let error = fresh.decode_bucket(3, b"[[", Encoding::Json).unwrap_err();
        assert!(
            error.to_string().starts_with("bucket 3 is not a JSON list"),
            "{error}"
        );
    }

    #[test]
    fn a_hundred_thousand_objects_fit_in_broker_sized_records() {
        let mut k = KnownObjects::default();
        for i in 0..100_000u32 {
            let uid = format!("{:08x}-2fa1-11d2-883f-{:012x}", i, u64::from(i) * 7919);
            k.observe(
                &uid,
                &format!("{}", 1_000_000 + i),
                Some("team-platform-production"),
                &format!("deployment-config-{i:06}"),
                0,
            );
        }
        let largest = (0..BUCKETS)
            .map(|b| k.encode_bucket(b, true).len())
            .max()
            .unwrap();
        let total: usize = (0..BUCKETS).map(|b| k.encode_bucket(b, true).len()).sum();
        // Kafka's default message.max.bytes and NATS's default max_payload are about 1 MB.
        assert!(largest < 64 * 1024, "largest bucket record {largest} bytes");
        assert!(total < 12 * 1024 * 1024, "whole index {total} bytes");
    }

    /// Strings the API server accepts in names of path-segment objects (RBAC), namespaces, uids
    /// and resourceVersions, weighted towards the characters a text format trips on.
    fn field() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            any::<String>(),
            r#"[ \t\n\r\\"'{}\[\],:%a-zA-Z0-9é😀-]{0,16}"#,
            // What the compact form packs, and near misses it must keep as text.
            "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-fA-F]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "[0-9]{1,21}",
            "[+0-]?[0-9]{0,3}",
        ]
    }

    /// Up to 24 objects as (uid, resourceVersion, namespace, name, digest); uids may repeat.
    type Object = (String, String, Option<String>, String, u64);
    fn objects() -> impl proptest::strategy::Strategy<Value = Vec<Object>> {
        use proptest::prelude::*;
        let object = (
            field(),
            field(),
            proptest::option::of(field()),
            field(),
            any::<u64>(),
        );
        proptest::collection::vec(object, 0..24)
    }

    /// The index after observing `objects` in order (a repeated uid is replaced).
    fn index_of(objects: &[Object]) -> KnownObjects {
        let mut k = KnownObjects::default();
        for (uid, rv, ns, name, digest) in objects {
            k.remove(uid);
            k.observe(uid, rv, ns.as_deref(), name, *digest);
        }
        k
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        #[test]
        fn every_field_round_trips(
            objects in objects()
        ) {
            let k = index_of(&objects);
            let mut back = KnownObjects::default();
            for b in 0..BUCKETS {
                back.decode_bucket(b, &k.encode_bucket(b, true), Encoding::Json).unwrap();
            }
            proptest::prop_assert_eq!(back.len(), k.len());
            for (uid, ..) in &objects {
                proptest::prop_assert_eq!(back.get(uid), k.get(uid));
            }
        }

        #[test]
        fn the_stored_form_is_what_it_was_before_the_compact_index(
            objects in objects()
        ) {
            // The version-2 encoding, written from the fields as received: uid order, strings.
            let mut k = KnownObjects::default();
            let mut expected: std::collections::BTreeMap<&str, OwnedRecord> = Default::default();
            for (uid, rv, ns, name, digest) in &objects {
                k.remove(uid);
                k.observe(uid, rv, ns.as_deref(), name, *digest);
                let record = (uid.as_str().into(), rv.as_str().into(), ns.as_deref().map(Into::into), name.as_str().into(), *digest);
                expected.insert(uid, record);
            }
            for b in 0..BUCKETS {
                let records: Vec<&OwnedRecord> =
                    expected.iter().filter(|(uid, _)| bucket_of(uid) == b).map(|(_, r)| r).collect();
                let want = if records.is_empty() { Vec::new() } else { serde_json::to_vec(&records).unwrap() };
                proptest::prop_assert_eq!(k.encode_bucket(b, true), want);
            }
        }

        /// Any index round-trips through parts of any bound: each part is a JSON list of whole
        /// entries no longer than the bound (or a single entry), one part is exactly the
        /// bucket's record, and the parts load back to the same bucket.
        #[test]
        fn any_index_round_trips_through_parts_of_any_bound(
            objects in objects(),
            bound in 0usize..600,
        ) {
            let k = index_of(&objects);
            let mut back = KnownObjects::default();
            for b in 0..BUCKETS {
                let whole = k.encode_bucket(b, true);
                let parts = k.encode_bucket_parts(b, true, bound);
                let entries: usize = parts
                    .iter()
                    .map(|p| serde_json::from_slice::<Vec<OwnedRecord>>(p).map_or(0, |r| r.len()))
                    .sum();
                proptest::prop_assert_eq!(entries, k.buckets[b].len());
                for part in &parts {
                    let n = serde_json::from_slice::<Vec<OwnedRecord>>(part).map_or(0, |r| r.len());
                    proptest::prop_assert!(part.len() <= bound || n <= 1, "{} bytes, {n} entries", part.len());
                }
                if parts.len() == 1 {
                    proptest::prop_assert_eq!(&parts[0], &whole);
                } else {
                    proptest::prop_assert!(parts.iter().all(|p| !p.is_empty()));
                }
                let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                back.decode_bucket_parts(b, &refs, Encoding::Json).unwrap();
            }
            proptest::prop_assert_eq!(back.len(), k.len());
            for (uid, ..) in &objects {
                proptest::prop_assert_eq!(back.get(uid), k.get(uid));
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic_the_bucket_decoder(
            b in 0..BUCKETS + 8,
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
            json in proptest::prelude::any::<bool>(),
        ) {
            let mut k = KnownObjects::default();
            let encoding = if json { Encoding::Json } else { Encoding::Text };
            let _ = k.decode_bucket(b, &bytes, encoding);
        }
    }

    #[test]
    fn uids_and_resource_versions_come_back_exactly_as_received() {
        let uuid = "e79c3f23-b20e-4d2e-9431-2ecebf629d4a";
        assert!(
            matches!(Key::of(uuid), Key::Uuid(_)),
            "the API server's form is packed"
        );
        let odd_uids = [
            "E79C3F23-B20E-4D2E-9431-2ECEBF629D4A",
            "{e79c3f23-b20e-4d2e-9431-2ecebf629d4a}",
            "e79c3f23b20e4d2e94312ecebf629d4a",
            "urn:uuid:e79c3f23-b20e-4d2e-9431-2ecebf629d4a",
            "u1",
            "",
        ];
        for uid in odd_uids {
            assert_eq!(Key::of(uid), Key::Text(uid), "{uid:?} is kept as text");
        }
        let rvs = [
            ("0", true),
            ("123", true),
            ("18446744073709551615", true),
            ("18446744073709551616", false),
            ("007", false),
            ("+5", false),
            ("-1", false),
            (" 1", false),
            ("", false),
            ("rv-a", false),
        ];
        for (rv, integer) in rvs {
            assert_eq!(matches!(Rv::new(rv), Rv::Int(_)), integer, "{rv:?}");
        }
        let mut k = KnownObjects::default();
        let uids = std::iter::once(uuid).chain(odd_uids);
        for (i, (uid, (rv, _))) in uids.zip(rvs.iter().cycle()).enumerate() {
            let ns = (i % 2 == 0).then_some("ns");
            assert_eq!(k.observe(uid, rv, ns, &format!("n{i}"), 0), Seen::New);
            assert_eq!(k.observe(uid, rv, ns, &format!("n{i}"), 0), Seen::Unchanged);
            let entry = k.get(uid).unwrap();
            assert_eq!(
                (&*entry.resource_version, entry.namespace.as_deref()),
                (*rv, ns)
            );
        }
        let mut back = KnownObjects::default();
        for b in 0..BUCKETS {
            back.decode_bucket(b, &k.encode_bucket(b, true), Encoding::Json)
                .unwrap();
        }
        for uid in std::iter::once(uuid).chain(odd_uids) {
            assert_eq!(back.get(uid), k.get(uid), "{uid:?}");
        }
        assert!(
            back.get(&uuid.to_uppercase()).is_some(),
            "a text uid is its own object"
        );
    }

    #[test]
    fn another_spelling_of_the_same_number_is_another_resource_version() {
        let mut k = KnownObjects::default();
        assert_eq!(k.observe("u", "7", None, "a", 0), Seen::New);
        assert_eq!(k.observe("u", "07", None, "a", 0), Seen::Changed);
        assert_eq!(&*k.get("u").unwrap().resource_version, "07");
        assert_eq!(k.observe("u", "7", None, "a", 0), Seen::Changed);
        assert_eq!(k.observe("u", "7", None, "a", 0), Seen::Unchanged);
    }

    #[test]
    fn relist_diff_covers_packed_and_text_uids() {
        let uuid = |i: u32| format!("{i:08x}-b20e-4d2e-9431-2ecebf629d4a");
        let mut k = KnownObjects::default();
        for i in 0..4 {
            k.observe(&uuid(i), "10", Some("ns"), &format!("n{i}"), 0);
            k.observe(&format!("text-{i}"), "rv-a", None, &format!("t{i}"), 0);
        }
        k.begin_relist();
        assert_eq!(
            k.observe(&uuid(0), "10", Some("ns"), "n0", 0),
            Seen::Unchanged
        );
        assert_eq!(
            k.observe(&uuid(1), "11", Some("ns"), "n1", 0),
            Seen::Changed
        );
        assert_eq!(k.observe("text-0", "rv-a", None, "t0", 0), Seen::Unchanged);
        assert_eq!(k.observe("text-1", "rv-b", None, "t1", 0), Seen::Changed);
        assert_eq!(k.observe(&uuid(9), "12", Some("ns"), "n9", 0), Seen::New);
        let gone: Vec<(String, String, Option<String>)> = k
            .finish_relist()
            .into_iter()
            .map(|(uid, e)| {
                (
                    uid.into(),
                    e.resource_version.into(),
                    e.namespace.map(|n| n.to_string()),
                )
            })
            .collect();
        let ns = Some("ns".to_string());
        assert_eq!(
            gone,
            vec![
                (uuid(2), "10".into(), ns.clone()),
                (uuid(3), "10".into(), ns),
                ("text-2".into(), "rv-a".into(), None),
                ("text-3".into(), "rv-a".into(), None),
            ],
            "sorted by uid"
        );
        assert_eq!(k.len(), 5);
        assert_eq!(&*k.get(&uuid(1)).unwrap().resource_version, "11");
    }

    #[test]
    fn namespaces_are_interned_once_and_entries_stay_small() {
        let mut k = KnownObjects::default();
        for i in 0..100 {
            k.observe(&format!("u{i}"), "1", Some(["a", "b"][i % 2]), "x", 0);
        }
        k.remove("u0");
        k.observe("v", "1", Some("a"), "x", 0);
        assert_eq!(k.namespaces.len(), 2);
        assert!(Arc::ptr_eq(
            &k.get("u2").unwrap().namespace.unwrap(),
            &k.get("v").unwrap().namespace.unwrap()
        ));
        // The layout the memory figures in docs/benchmarks.md rest on.
        assert_eq!(std::mem::size_of::<Rv>(), 16);
        assert!(std::mem::size_of::<([u8; 16], Slot)>() <= 72);
    }

    #[test]
    fn the_persisted_hash_is_fnv_1a_and_never_changes() {
        // The FNV-1a 64-bit reference vectors, and a bucket that checkpoints already hold.
        assert_eq!(stable_hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(stable_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(stable_hash(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(bucket_of("e79c3f23-b20e-4d2e-9431-2ecebf629d4a"), 227);
    }
}
