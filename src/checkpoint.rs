//! Durable progress per watch: the resourceVersion up to which every event is acknowledged, plus
//! the known-object index needed to find deletions after a long gap. Stored where the events go:
//!
//! - Kafka ([`kafka`]): records in a compacted single-partition topic, written in the same
//!   transaction as the events they cover (one `transactional.id` per watch, which also fences an
//!   older instance);
//! - NATS JetStream ([`nats`]): a KV bucket; index buckets are written under fresh keys, then the
//!   meta record is swapped with compare-and-swap on its revision, which fences a stale writer;
//! - stdout ([`file`]): an optional local file, replaced atomically.
//!
//! A checkpoint is only saved when every event before it has been acknowledged (see
//! [`crate::pipeline`]). It belongs to one cluster: the meta record carries the uid of the
//! cluster's `kube-system` namespace, and a checkpoint of another cluster is refused.
//!
//! A checkpoint that cannot be decoded never keeps the bridge down: [`Store::load`] logs it,
//! counts it and hands the watch a repair (see [`Checkpoint::resource_version`]).

pub mod announce;
pub mod file;
pub mod journal;
pub mod kafka;
pub mod nats;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::Namespace;
use serde::{Deserialize, Serialize};
use tracing::{error, warn};

pub use file::FileStore;
pub use kafka::KafkaStore;
pub use nats::{NatsStore, nats_bucket};

use futures::future::BoxFuture;
use journal::{Journal, Plan, Record, Segment, Stored};

use crate::known::{BUCKETS, Encoding, KnownObjects, StoredEntry};

/// Errors of loading or saving checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Another instance now owns this watch: its transactional id or KV revision won.
    #[error("checkpoint of watch {watch} was taken over by another instance (fenced)")]
    Fenced {
        /// The watch.
        watch: String,
    },
    /// A stored checkpoint could not be decoded.
    #[error("checkpoint of watch {watch} is corrupt: {message}")]
    Corrupt {
        /// The watch.
        watch: String,
        /// What is wrong.
        message: String,
    },
    /// The stored checkpoint was written for another cluster that has the same `cluster` name.
    #[error(
        "checkpoint of watch {watch} belongs to another cluster: `cluster: {cluster}` names the \
         cluster whose kube-system namespace has uid {actual}, but the checkpoint was written for \
         uid {stored}; give each cluster its own `cluster` name, or delete the checkpoint \
         (`kube-event-bridge snapshot`) if the cluster was rebuilt"
    )]
    OtherCluster {
        /// The watch.
        watch: String,
        /// The configured `cluster` name.
        cluster: String,
        /// The uid stored in the checkpoint.
        stored: String,
        /// The uid of this cluster's kube-system namespace.
        actual: String,
    },
    /// The cluster's identity could not be read.
    #[error(
        "cannot read the uid of namespace kube-system, the cluster identity checkpoints are tied \
         to and the `clusterid` extension names (the bridge needs `get` on namespaces/kube-system; \
         `auditExtensions: false` drops the extension)"
    )]
    Identity(#[source] kube::Error),
    /// The Kafka checkpoint topic cannot hold checkpoints safely.
    #[error("checkpoint topic {topic}: {problem}")]
    Topic {
        /// The topic (`checkpoint.kafkaTopic`).
        topic: String,
        /// What is wrong, and the fix.
        problem: String,
    },
    /// The Kafka transaction holding the checkpoint was aborted by another watch sharing it:
    /// the checkpoint is saved again with the next commit (nothing is wrong with the store).
    #[error(
        "checkpoint of watch {watch} not saved: another watch sharing the transaction aborted it"
    )]
    Aborted {
        /// The watch.
        watch: String,
    },
    /// The store failed.
    #[error("checkpoint store {store}: {message}")]
    Store {
        /// `kafka`, `nats` or `file`.
        store: &'static str,
        /// The cause, as text (broker client errors are not all `Send + Sync`).
        message: String,
    },
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The cluster checkpoints belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// The configured `cluster` name.
    pub name: String,
    /// The uid of its `kube-system` namespace, which lives as long as the cluster.
    pub uid: String,
}

impl Cluster {
    /// Reads the identity of the cluster `client` talks to (one GET of namespace `kube-system`).
    pub async fn identify(name: &str, client: &kube::Client) -> Result<Self> {
        let api: kube::Api<Namespace> = kube::Api::all(client.clone());
        let ns = api.get("kube-system").await.map_err(Error::Identity)?;
        Ok(Self {
            name: name.into(),
            uid: ns.metadata.uid.unwrap_or_default(),
        })
    }
}

/// The identity of a watch, stable across restarts: cluster, resource, namespace and selectors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchKey {
    /// Key-safe id: `{cluster}.{16 hex digits}`, the cluster name made [`key_safe`].
    pub id: String,
    /// Readable form, stored in the meta record.
    pub description: String,
}

impl WatchKey {
    /// The key of the watch of `r` in `namespace` (`None`: all namespaces or cluster scope).
    pub fn for_scope(
        cluster: &str,
        r: &crate::discovery::ResolvedResource,
        namespace: Option<&str>,
    ) -> Self {
        Self::new(
            cluster,
            &r.api.api_version,
            &r.api.plural,
            namespace,
            r.config.label_selector.as_deref(),
            r.config.field_selector.as_deref(),
        )
    }

    /// The key of one watch.
    pub fn new(
        cluster: &str,
        api_version: &str,
        plural: &str,
        namespace: Option<&str>,
        labels: Option<&str>,
        fields: Option<&str>,
    ) -> Self {
        let description = format!(
            "{cluster}/{api_version}/{plural}/{}?labels={}&fields={}",
            namespace.unwrap_or("*"),
            labels.unwrap_or(""),
            fields.unwrap_or("")
        );
        let h = crate::known::stable_hash(description.as_bytes());
        Self {
            id: format!("{}.{h:016x}", key_safe(cluster)),
            description,
        }
    }
}

/// `name` as it stands in a persisted id (a watch's [`WatchKey::id`], the Kafka transactional
/// id): ASCII letters, digits and `-` as they are, any other character (a dot, a slash, each
/// non-ASCII character) one `_`. Stored checkpoints and transaction state are found by these
/// ids: never change the rule.
pub fn key_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// What a checkpoint holds.
#[derive(Debug)]
pub struct Checkpoint {
    /// Every event up to here is acknowledged. `None` for a repair: the stored checkpoint could
    /// not be decoded, so the watch lists again (a relist, published as `repaired`) and diffs the
    /// listing against [`Checkpoint::known`], which holds the part of the index that could be
    /// read (possibly nothing: then every listed object is published as a repaired `added`).
    pub resource_version: Option<String>,
    /// The objects known at that point.
    pub known: KnownObjects,
    /// Objects that may have been published past that point, which `known` does not know
    /// ([`announce`]).
    pub announced: Vec<StoredEntry>,
}

/// The version of the meta records (and bucket encoding) this build writes: version 4 stores a
/// bucket larger than [`journal::RECORD_BYTES`] in several records (parts, see [`Meta::parts`]),
/// version 3 added the journal ([`journal`]). Versions 1 (text buckets), 2 (buckets only) and 3
/// are still read; their first save rewrites every bucket (so that none stays larger than the
/// bound).
const VERSION: u32 = 4;

/// The most parts a meta record may name for one bucket (256 MiB of entries, hundreds of
/// millions of objects over all buckets): a bound on what a corrupt meta record makes a load
/// fetch.
const MAX_PARTS: usize = 1024;

/// The stored records of a checkpoint's buckets, as a backend found them: bucket → part →
/// record. A bucket listed with no parts was expected (named by the meta record) but not found.
type Parts<'a> = BTreeMap<usize, BTreeMap<usize, &'a [u8]>>;

/// The meta record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    version: u32,
    watch: String,
    resource_version: String,
    objects: usize,
    /// NATS only: the key suffix (generation) holding each non-empty bucket.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    buckets: BTreeMap<usize, String>,
    /// Version 4: the number of parts of each bucket stored in more than one (at most
    /// [`journal::RECORD_BYTES`] each, see [`KnownObjects::encode_bucket_parts`]); every other
    /// bucket is one record. Part 0 has the bucket's own name, part `p` that name followed by
    /// `.{p}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    parts: BTreeMap<usize, usize>,
    /// The uid of the cluster's kube-system namespace; absent in checkpoints written before
    /// checkpoints were tied to a cluster (those are adopted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cluster_uid: Option<String>,
    /// Version 3, Kafka and NATS: the journal records written since the buckets, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    journal: Vec<Segment>,
    /// Version 3, file: the id of this base, which its journal lines name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base: Option<String>,
}

impl Meta {
    /// A meta record for the current state of `known`.
    fn new(
        key: &WatchKey,
        cluster: Option<&Cluster>,
        resource_version: &str,
        known: &KnownObjects,
    ) -> Self {
        Self {
            version: VERSION,
            watch: key.description.clone(),
            resource_version: resource_version.into(),
            objects: known.len(),
            buckets: BTreeMap::new(),
            parts: BTreeMap::new(),
            cluster_uid: cluster.map(|c| c.uid.clone()),
            journal: Vec::new(),
            base: None,
        }
    }

    /// Decodes a stored meta record; anything unexpected is [`Error::Corrupt`].
    fn decode(key: &WatchKey, stored: &[u8]) -> Result<Self> {
        let meta: Meta = serde_json::from_slice(stored)
            .map_err(|e| corrupt(key, format!("meta record: {e}")))?;
        if !(1..=VERSION).contains(&meta.version) {
            return Err(corrupt(
                key,
                format!(
                    "meta record version {} is unknown (this build reads 1 to {VERSION})",
                    meta.version
                ),
            ));
        }
        let mut records = 0;
        for segment in &meta.journal {
            if let Some(problem) = segment.problem() {
                return Err(corrupt(key, format!("meta record: {problem}")));
            }
            records += segment.records();
        }
        if records > journal::MAX_RECORDS {
            return Err(corrupt(
                key,
                format!("meta record names {records} journal records, more than are ever written"),
            ));
        }
        for (b, generation) in &meta.buckets {
            if *b >= BUCKETS {
                return Err(corrupt(
                    key,
                    format!("meta record names bucket {b}, out of range"),
                ));
            }
            if generation.len() != 16 || !generation.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(corrupt(
                    key,
                    format!(
                        "meta record names bucket {b} generation {generation:?}, not 16 hex digits"
                    ),
                ));
            }
        }
        meta.check_parts(key)?;
        Ok(meta)
    }

    /// Checks the parts the meta record names: only version 4 writes them, for buckets in range,
    /// 2 to [`MAX_PARTS`] each.
    fn check_parts(&self, key: &WatchKey) -> Result<()> {
        for (b, n) in &self.parts {
            let problem = if self.version < 4 {
                format!(
                    "meta record of version {} names parts, which version 4 introduced",
                    self.version
                )
            } else if *b >= BUCKETS {
                format!("meta record names parts of bucket {b}, out of range")
            } else if !(2..=MAX_PARTS).contains(n) {
                format!("meta record names {n} parts of bucket {b}, not 2 to {MAX_PARTS}")
            } else {
                continue;
            };
            return Err(corrupt(key, problem));
        }
        Ok(())
    }

    /// The number of parts of bucket `b`.
    fn parts_of(&self, b: usize) -> usize {
        self.parts.get(&b).copied().unwrap_or(1)
    }

    /// Refuses a checkpoint of another cluster with the same name.
    fn check_cluster(&self, key: &WatchKey, cluster: Option<&Cluster>) -> Result<()> {
        match (&self.cluster_uid, cluster) {
            (Some(stored), Some(c)) if *stored != c.uid => Err(Error::OtherCluster {
                watch: key.description.clone(),
                cluster: c.name.clone(),
                stored: stored.clone(),
                actual: c.uid.clone(),
            }),
            _ => Ok(()),
        }
    }

    fn encoding(&self) -> Encoding {
        if self.version == 1 {
            Encoding::Text
        } else {
            Encoding::Json
        }
    }

    fn to_bytes(&self) -> Vec<u8> {
        // Strings and integers always serialize.
        serde_json::to_vec(self).expect("meta serializes")
    }
}

/// A stored checkpoint, decoded.
#[derive(Debug)]
pub enum Found {
    /// Everything decoded.
    Intact(Checkpoint),
    /// Not everything could be decoded: what is wrong, and the part of the index that could.
    Damaged {
        /// An [`Error::Corrupt`].
        problem: Error,
        /// The buckets that decoded.
        known: KnownObjects,
    },
}

impl Found {
    /// A checkpoint whose meta record cannot be decoded: its index is unusable (which encoding
    /// its buckets use, or where they are, is unknown).
    fn unreadable(problem: Error) -> Self {
        Found::Damaged {
            problem,
            known: KnownObjects::default(),
        }
    }

    /// Decodes the index `meta` describes from its bucket records (in parts) and its journal
    /// records, replayed in order (`None`: a record the meta record names is missing), and
    /// records in `state` what is stored. `problems` are those already found reading the
    /// records. A bucket that cannot be decoded, or whose parts are not exactly those the meta
    /// record names, stays empty and makes the checkpoint damaged; the journal is replayed up to
    /// its first record that cannot be decoded.
    fn assemble<'a>(
        key: &WatchKey,
        meta: Meta,
        buckets: Parts<'a>,
        journal: impl IntoIterator<Item = (String, Option<&'a [u8]>)>,
        mut problems: Vec<String>,
        state: &mut Journal,
    ) -> Self {
        let mut known = KnownObjects::default();
        let mut sizes = Vec::new();
        let named: BTreeSet<usize> = buckets.keys().chain(meta.parts.keys()).copied().collect();
        for b in named {
            let found = buckets.get(&b);
            // What is stored, even if it is wrong: a compaction deletes the parts it replaces.
            let stored = found.map_or(0, |f| f.keys().max().map_or(0, |p| p + 1));
            sizes.push((
                b,
                Stored {
                    bytes: found.map_or(0, |f| f.values().map(|r| r.len()).sum()),
                    parts: stored.max(meta.parts_of(b)),
                },
            ));
            let decoded = exact_parts(b, meta.parts_of(b), found).and_then(|parts| {
                known
                    .decode_bucket_parts(b, &parts, meta.encoding())
                    .map_err(|e| e.to_string())
            });
            if let Err(problem) = decoded {
                problems.push(problem);
            }
        }
        let mut journal_bytes = 0;
        for (name, stored) in journal {
            let replayed = match stored {
                None => Err(format!("journal record {name} is missing")),
                Some(stored) => Record::decode(stored).map(|r| {
                    journal_bytes += stored.len();
                    r.apply(&mut known);
                }),
            };
            if let Err(problem) = replayed {
                problems.push(format!("{problem} (record {name})"));
                break;
            }
        }
        // Replayed changes are stored already.
        known.take_changes();
        // Even a damaged checkpoint's records are deleted by the compaction that replaces it.
        state.loaded(
            sizes,
            meta.journal.clone(),
            journal_bytes,
            meta.base.clone(),
        );
        if problems.is_empty() && meta.objects != known.len() {
            problems.push(format!(
                "meta record says {} objects, buckets hold {}",
                meta.objects,
                known.len()
            ));
        }
        if let Some(first) = problems.first() {
            let more = match problems.len() {
                1 => String::new(),
                n => format!(" (and {} more problems)", n - 1),
            };
            return Found::Damaged {
                problem: corrupt(key, format!("{first}{more}")),
                known,
            };
        }
        if meta.version < VERSION {
            // Rewrite every bucket in the current encoding at the first save.
            known.mark_all_dirty();
        }
        Found::Intact(Checkpoint {
            resource_version: Some(meta.resource_version),
            known,
            announced: Vec::new(),
        })
    }
}

/// The bucket and part a stored record's name gives: `{bucket}` (part 0) or `{bucket}.{part}`
/// (part 1 or more), numbers in canonical decimal.
fn parse_part(name: &str) -> Option<(usize, usize)> {
    let number = |text: &str| {
        let canonical = !text.is_empty()
            && text.bytes().all(|c| c.is_ascii_digit())
            && (text == "0" || !text.starts_with('0'));
        canonical.then(|| text.parse::<usize>().ok()).flatten()
    };
    match name.split_once('.') {
        None => Some((number(name)?, 0)),
        Some((b, p)) => Some((number(b)?, number(p).filter(|p| *p > 0)?)),
    }
}

/// The records of bucket `b` in order, if `found` holds exactly its `expected` parts. A bucket
/// of one part may be absent (an empty bucket that was never stored).
fn exact_parts<'a>(
    b: usize,
    expected: usize,
    found: Option<&BTreeMap<usize, &'a [u8]>>,
) -> Result<Vec<&'a [u8]>, String> {
    let Some(found) = found else {
        return match expected {
            1 => Ok(Vec::new()),
            n => Err(format!("bucket {b} is missing (all of its {n} parts)")),
        };
    };
    if let Some(extra) = found.keys().find(|p| **p >= expected) {
        return Err(format!(
            "bucket {b} has a part {extra}, but the meta record names {expected} part(s)"
        ));
    }
    (0..expected)
        .map(|p| {
            found.get(&p).copied().ok_or_else(|| match expected {
                1 => format!("bucket {b} is missing"),
                n => format!("bucket {b} part {p} of {n} is missing"),
            })
        })
        .collect()
}

/// What a load found: the checkpoint, the announcements tied to it, and the problems of the
/// announcements that could not be decoded.
pub type Loaded = (Option<Found>, Vec<StoredEntry>, Vec<String>);

/// Where one watch's checkpoints live: the Kafka topic written in the transactions of the
/// watch's events ([`KafkaStore`]), a NATS key-value bucket ([`NatsStore`]), a file
/// ([`FileStore`]), or nothing durable ([`MemoryStore`]). What differs between them is said by
/// capabilities, not by matching on the store; [`crate::stores`] chooses one for each watch.
#[async_trait::async_trait]
pub trait Backend: std::fmt::Debug + Send + Sync {
    /// Loads the stored checkpoint, and the announcements tied to it ([`announce`]).
    async fn load(&mut self, journal: &mut Journal) -> Result<Loaded>;

    /// Saves `plan` in place (see [`Store::save`]).
    async fn save(
        &mut self,
        resource_version: &str,
        known: &mut KnownObjects,
        digests: bool,
        plan: Plan,
        journal: &mut Journal,
    ) -> Result<()>;

    /// Deletes every record of the watch.
    async fn reset(&mut self) -> Result<()>;

    /// Whether journal records carry the resourceVersion they stand for: a file's journal is
    /// appended apart from its meta record, which may lag behind it.
    fn stamps(&self) -> bool {
        false
    }

    /// Whether the objects a watch publishes first must be announced before they are sent:
    /// the sink's events are not stored with the checkpoint.
    fn announces(&self) -> bool {
        false
    }

    /// Stores announcements of `entries`; called only when [`Backend::announces`].
    async fn announce(&mut self, journal: &Journal, entries: &[StoredEntry]) -> Result<()> {
        let _ = (journal, entries);
        Ok(())
    }

    /// Whether checkpoints survive a restart.
    fn durable(&self) -> bool {
        true
    }

    /// Encodes a save whole, to be written while the watch goes on, when this store can; gives
    /// the plan back otherwise.
    fn stage(
        &mut self,
        resource_version: &str,
        known: &mut KnownObjects,
        digests: bool,
        plan: Plan,
        journal: &mut Journal,
    ) -> std::result::Result<Staged, Plan> {
        let _ = (resource_version, known, digests, journal);
        Err(plan)
    }

    /// Applies a save [`Backend::stage`] staged, once written.
    fn finish(&mut self, written: Written, journal: &mut Journal) -> Result<()>;
}

/// Checkpoints kept nowhere: every start lists and publishes everything again.
#[derive(Debug, Default)]
pub struct MemoryStore;

#[async_trait::async_trait]
impl Backend for MemoryStore {
    async fn load(&mut self, _: &mut Journal) -> Result<Loaded> {
        Ok((None, Vec::new(), Vec::new()))
    }

    async fn save(
        &mut self,
        _: &str,
        known: &mut KnownObjects,
        _: bool,
        _: Plan,
        _: &mut Journal,
    ) -> Result<()> {
        known.take_dirty();
        Ok(())
    }

    async fn reset(&mut self) -> Result<()> {
        Ok(())
    }

    fn durable(&self) -> bool {
        false
    }

    fn finish(&mut self, written: Written, _: &mut Journal) -> Result<()> {
        Err(written.not_staged_here("memory"))
    }
}

/// One watch's checkpoint store.
#[derive(Debug)]
pub struct Store {
    backend: Box<dyn Backend>,
    /// Whether content digests are stored (see [`Store::set_redacted`]).
    digests: bool,
    /// What is stored, and what the next journal record is called.
    journal: Journal,
}

/// Objects up to which a NATS compaction is staged whole in memory (an index entry encodes to
/// a few tens of bytes: a few MiB at most) and written while the watch goes on; a larger one is
/// written in batches, in place.
pub const STAGED_OBJECTS_MAX: usize = 100_000;

/// How [`Store::stage`] left a save.
#[derive(Debug)]
pub enum Staging {
    /// Encoded whole: write it ([`Staged::write`]) while the watch goes on, then apply it
    /// ([`Store::finish`]).
    Staged(Staged),
    /// To be saved in place ([`Store::save_planned`]).
    InPlace(Planned),
}

/// A save planned by [`Store::stage`], to be saved in place.
#[derive(Debug)]
pub struct Planned(Plan);

/// A save encoded whole, owning everything it writes.
#[derive(Debug)]
pub struct Staged(Box<dyn StagedSave>);

/// A staged save, written: [`Store::finish`] applies it.
#[derive(Debug)]
pub struct Written(Box<dyn WrittenSave>);

/// A save a store encoded whole ([`Backend::stage`]).
pub trait StagedSave: std::fmt::Debug + Send {
    /// Writes it; nothing here touches the store.
    fn write(self: Box<Self>) -> BoxFuture<'static, Written>;
}

/// A staged save, written ([`StagedSave::write`]).
pub trait WrittenSave: std::fmt::Debug + Send + std::any::Any {
    /// Whether the save is stored.
    fn is_ok(&self) -> bool;

    /// For the store that staged it, which knows its type.
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any>;
}

impl Staged {
    /// A staged save of a store.
    pub fn new(save: impl StagedSave + 'static) -> Self {
        Self(Box::new(save))
    }

    /// Writes the save's records, then its meta record. Nothing here touches the store: what
    /// the write changed is applied by [`Store::finish`].
    pub async fn write(self) -> Written {
        self.0.write().await
    }
}

impl Written {
    /// A written save of a store.
    pub fn new(save: impl WrittenSave + 'static) -> Self {
        Self(Box::new(save))
    }

    /// Whether the save is stored.
    pub fn is_ok(&self) -> bool {
        self.0.is_ok()
    }

    /// The save as the type `T` of the store that staged it, or the error of a store that
    /// did not (`store` names it).
    pub fn downcast<T: 'static>(self, store: &'static str) -> Result<T> {
        match self.0.into_any().downcast::<T>() {
            Ok(save) => Ok(*save),
            Err(_) => Err(Error::Store {
                store,
                message: "a save staged by another store".into(),
            }),
        }
    }

    fn not_staged_here(self, store: &'static str) -> Error {
        Error::Store {
            store,
            message: "this store stages no saves".into(),
        }
    }
}

impl Store {
    /// A store on `backend`.
    pub fn new(backend: impl Backend + 'static) -> Self {
        Self {
            backend: Box::new(backend),
            digests: true,
            journal: Journal::default(),
        }
    }

    /// Declares that the watched resource's events hide values (Secret data, `redact`
    /// pointers). Its content digests are then kept in memory only, and stored as 0 (unknown):
    /// a digest is a fast hash of the whole object before redaction, so whoever can read the
    /// checkpoint topic or bucket could test guesses of the hidden values against it offline.
    /// Keying the digest with a per-process secret would also prevent that, but a stored digest
    /// is only ever compared after a restart, when a new process would have a new key: it could
    /// never match, so storing nothing loses nothing. Within a run noise suppression is
    /// unchanged; after a restart the first update of each such object is published even if
    /// only noise changed.
    pub fn set_redacted(&mut self, redacted: bool) {
        self.digests = !redacted;
    }

    /// Loads the last saved checkpoint, if any. A checkpoint that cannot be decoded (corrupt,
    /// or of an unknown version) is logged at error level, counted in `corrupt` and returned as
    /// a repair (no resourceVersion, the part of the index that could be read), so the watch
    /// lists again instead of keeping the bridge down. Errors are the store's failures, fencing
    /// and a checkpoint of another cluster.
    pub async fn load(&mut self, corrupt: &AtomicU64) -> Result<Option<Checkpoint>> {
        self.journal.forget();
        let journal = &mut self.journal;
        let (found, announced, problems) = self.backend.load(journal).await?;
        for problem in problems {
            // Only a write cut short by a crash leaves one: what it announced was not sent.
            warn!(error = %problem, "announcement cannot be decoded, skipped");
        }
        let checkpoint = match found {
            None if announced.is_empty() => return Ok(None),
            // Published before any checkpoint was saved: the watch lists as after a lost
            // history and publishes the deletes of those that are gone.
            None => Checkpoint {
                resource_version: None,
                known: KnownObjects::default(),
                announced: Vec::new(),
            },
            Some(found) => self.found(found, corrupt),
        };
        let announced = announced
            .into_iter()
            .filter(|e| checkpoint.known.get(&e.0).is_none())
            .collect();
        Ok(Some(Checkpoint {
            announced,
            ..checkpoint
        }))
    }

    /// The checkpoint a load found.
    fn found(&mut self, found: Found, corrupt: &AtomicU64) -> Checkpoint {
        let digests = self.digests;
        match found {
            Found::Intact(mut checkpoint) => {
                if !digests && checkpoint.known.has_digests() {
                    // Written before the resource redacted: rewritten without them at the first save.
                    checkpoint.known.mark_all_dirty();
                }
                checkpoint
            }
            Found::Damaged { problem, mut known } => {
                self.journal.invalidate();
                // The repair's compaction rewrites every bucket, the damaged ones (and their
                // stray parts) included, even if the relist changes nothing in them.
                known.mark_all_dirty();
                corrupt.fetch_add(1, Ordering::Relaxed);
                error!(
                    error = %problem,
                    objects_recovered = known.len(),
                    "checkpoint cannot be decoded: listing again to repair, the listing is published as repaired"
                );
                Checkpoint {
                    resource_version: None,
                    known,
                    announced: Vec::new(),
                }
            }
        }
    }

    /// Saves progress up to `resource_version`: a journal record of the objects changed since
    /// the last save, or a compaction (the changed index buckets), and the meta record (see
    /// [`journal`]). Called only when every event before it is acknowledged. After an error the
    /// caller marks the index dirty ([`KnownObjects::mark_all_dirty`]): the changes taken are
    /// then stored by the next save's compaction.
    pub async fn save(&mut self, resource_version: &str, known: &mut KnownObjects) -> Result<()> {
        let plan = self.plan(resource_version, known);
        self.save_planned(resource_version, known, Planned(plan))
            .await
    }

    /// Plans the save of `resource_version` like [`Store::save`]. A NATS save small enough to
    /// hold whole (a journal record, or a compaction of at most [`STAGED_OBJECTS_MAX`] objects)
    /// comes back encoded ([`Staging::Staged`]): it owns what it writes, so the watch goes on
    /// taking changes while the broker stores it. Any other comes back to be saved in place
    /// with [`Store::save_planned`]: a Kafka save commits the transaction the next events go
    /// into, a file is rewritten, a large compaction is written in batches.
    pub fn stage(&mut self, resource_version: &str, known: &mut KnownObjects) -> Staging {
        let plan = self.plan(resource_version, known);
        let staging = match plan {
            Plan::Compact if known.len() > STAGED_OBJECTS_MAX => Err(plan),
            plan => {
                let journal = &mut self.journal;
                self.backend
                    .stage(resource_version, known, self.digests, plan, journal)
            }
        };
        match staging {
            Ok(staged) => Staging::Staged(staged),
            Err(plan) => Staging::InPlace(Planned(plan)),
        }
    }

    /// Applies a staged save once written. Errors as for [`Store::save`].
    pub fn finish(&mut self, written: Written) -> Result<()> {
        self.backend.finish(written, &mut self.journal)
    }

    /// Saves a planned save in place ([`Store::stage`]).
    pub async fn save_planned(
        &mut self,
        resource_version: &str,
        known: &mut KnownObjects,
        Planned(plan): Planned,
    ) -> Result<()> {
        let (digests, journal) = (self.digests, &mut self.journal);
        self.backend
            .save(resource_version, known, digests, plan, journal)
            .await
    }

    /// What the next save writes (taking the changes from `known`).
    fn plan(&self, resource_version: &str, known: &mut KnownObjects) -> Plan {
        let stamp = self
            .backend
            .stamps()
            .then_some(journal::Stamp { resource_version });
        self.journal.plan(known, self.digests, stamp)
    }

    /// Deletes the checkpoint, so the next start lists and publishes a fresh snapshot. A running
    /// instance that owns the watch is fenced by this (Kafka: a newer transactional producer;
    /// NATS: the meta revision changes) and exits, to be restarted.
    pub async fn reset(&mut self) -> Result<()> {
        self.journal.forget();
        self.backend.reset().await
    }

    /// The journal records the stored checkpoint holds beyond its base, as of the last load or
    /// save (see [`journal`]).
    pub fn journal_records(&self) -> u64 {
        self.journal.records()
    }

    /// Whether the objects a watch publishes first must be announced before they are sent
    /// ([`announce`]): the sink's events are not stored with the checkpoint.
    pub fn announces(&self) -> bool {
        self.backend.announces()
    }

    /// Stores announcements of `entries` (see [`announce`]); called only when
    /// [`Store::announces`] and no save is being written.
    pub async fn announce(&mut self, entries: &[StoredEntry]) -> Result<()> {
        self.backend.announce(&self.journal, entries).await
    }

    /// Whether checkpoints survive a restart.
    pub fn durable(&self) -> bool {
        self.backend.durable()
    }
}

/// A random value for names of stored records that no other instance may pick.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

fn corrupt(key: &WatchKey, message: impl std::fmt::Display) -> Error {
    Error::Corrupt {
        watch: key.description.clone(),
        message: message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;
    use crate::known::bucket_of;

    fn key() -> WatchKey {
        WatchKey::new(
            "dev",
            "rbac.authorization.k8s.io/v1",
            "roles",
            None,
            None,
            None,
        )
    }

    fn cluster(uid: &str) -> Cluster {
        Cluster {
            name: "dev".into(),
            uid: uid.into(),
        }
    }

    fn file_store(dir: &tempfile::TempDir, cluster: Option<Cluster>) -> Store {
        Store::new(FileStore {
            key: key(),
            path: dir.path().join("cp"),
            cluster,
        })
    }

    fn sample() -> KnownObjects {
        let mut known = KnownObjects::default();
        for i in 0..500 {
            known.observe(
                &format!("u{i}"),
                &format!("{i}"),
                Some("ns"),
                &format!("n{i}"),
                u64::from(i as u32) + 1,
            );
        }
        known.observe("odd", "9", Some("team a"), "read only", 0);
        known.observe("odder", "10", None, "system:aggregate\tto \"edit\"\n", 0);
        known
    }

    #[test]
    fn watch_keys_are_stable_and_distinct() {
        let a = WatchKey::new("dev", "v1", "configmaps", Some("ns"), None, None);
        assert_eq!(
            a,
            WatchKey::new("dev", "v1", "configmaps", Some("ns"), None, None)
        );
        assert_ne!(
            a.id,
            WatchKey::new("dev", "v1", "configmaps", None, None, None).id
        );
        assert_ne!(
            a.id,
            WatchKey::new("dev", "v1", "configmaps", Some("ns"), Some("a=b"), None).id
        );
        assert!(a.id.starts_with("dev.") && a.id.len() == 4 + 16, "{}", a.id);
        assert_eq!(
            a.id, "dev.be6ab4f2658813dd",
            "watch keys are persisted: never change them"
        );
    }

    #[test]
    fn watch_key_ids_of_odd_cluster_names_are_pinned() {
        // Stored checkpoints are found by these ids: whatever a cluster name holds, its watch
        // keeps the id it always had.
        for (cluster, id) in [
            ("prod.eu-1", "prod_eu-1.d40e12e2cdb91664"),
            ("a/b c", "a_b_c.8a81e07e86463882"),
            ("Zürich_2", "Z_rich_2.872a3ed7316a273b"),
            ("日本", "__.70b38c3d20aed5ef"),
            ("", ".a98673cd6d488c63"),
        ] {
            let key = WatchKey::new(cluster, "v1", "configmaps", None, None, None);
            assert_eq!(key.id, id, "{cluster:?}");
        }
    }

    #[tokio::test]
    async fn file_store_round_trips_odd_names_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = file_store(&dir, Some(cluster("uid-1")));
        let corrupt = AtomicU64::new(0);
        assert!(store.load(&corrupt).await.unwrap().is_none());
        let mut known = sample();
        store.save("777", &mut known).await.unwrap();
        let loaded = store.load(&corrupt).await.unwrap().unwrap();
        assert_eq!(loaded.resource_version.as_deref(), Some("777"));
        assert_eq!(loaded.known.len(), 502);
        for uid in ["u42", "odd", "odder"] {
            assert_eq!(loaded.known.get(uid), known.get(uid));
        }
        assert!(!dir.path().join("cp.tmp").exists());
        assert_eq!(corrupt.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_corrupt_file_is_a_counted_repair_keeping_what_decodes() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = file_store(&dir, None);
        let mut known = sample();
        store.save("5", &mut known).await.unwrap();
        let path = dir.path().join("cp");
        let text = std::fs::read_to_string(&path).unwrap();
        let broken_bucket = bucket_of("u42");
        let damaged: String = text
            .lines()
            .map(|l| {
                if l.starts_with(&format!("{broken_bucket}\t")) {
                    format!("{broken_bucket}\tnot json\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        std::fs::write(&path, damaged).unwrap();
        let corrupt = AtomicU64::new(0);
        let repair = store.load(&corrupt).await.unwrap().unwrap();
        assert_eq!(repair.resource_version, None, "a repair lists again");
        assert!(repair.known.get("u42").is_none(), "its bucket is unusable");
        assert_eq!(
            repair.known.get("u7"),
            known.get("u7"),
            "other buckets kept"
        );
        assert_eq!(corrupt.load(Ordering::Relaxed), 1);

        std::fs::write(&path, b"\xff\xfe garbage").unwrap();
        let repair = store.load(&corrupt).await.unwrap().unwrap();
        assert_eq!(repair.resource_version, None);
        assert!(repair.known.is_empty(), "no meta record: nothing usable");
        assert_eq!(corrupt.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn version_one_files_load_and_are_rewritten_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (bucket_of("ua"), bucket_of("ub"));
        let v1 = format!(
            "{{\"version\":1,\"watch\":\"w\",\"resourceVersion\":\"40\",\"objects\":2}}\n\
             {a}\tua 3 ns a 1f\n{b}\tub 4 - b\n"
        );
        std::fs::write(dir.path().join("cp"), v1).unwrap();
        let mut store = file_store(&dir, Some(cluster("uid-1")));
        let corrupt = AtomicU64::new(0);
        let mut loaded = store.load(&corrupt).await.unwrap().unwrap();
        assert_eq!(loaded.resource_version.as_deref(), Some("40"));
        assert_eq!(loaded.known.get("ua").unwrap().digest, 0x1f);
        assert_eq!(loaded.known.take_dirty().len(), BUCKETS, "rewritten whole");
        store.save("41", &mut loaded.known).await.unwrap();
        let text = std::fs::read_to_string(dir.path().join("cp")).unwrap();
        assert!(text.starts_with("{\"version\":4,"), "{text}");
        assert!(text.contains("\"clusterUid\":\"uid-1\""), "adopted: {text}");
        assert_eq!(store.load(&corrupt).await.unwrap().unwrap().known.len(), 2);
        assert_eq!(corrupt.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_checkpoint_of_another_cluster_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut known = sample();
        file_store(&dir, Some(cluster("uid-1")))
            .save("5", &mut known)
            .await
            .unwrap();
        let corrupt = AtomicU64::new(0);
        let err = file_store(&dir, Some(cluster("uid-2")))
            .load(&corrupt)
            .await
            .unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, Error::OtherCluster { .. }), "{message}");
        for part in ["uid-1", "uid-2", "cluster: dev"] {
            assert!(message.contains(part), "{message}");
        }
        assert!(
            file_store(&dir, Some(cluster("uid-1")))
                .load(&corrupt)
                .await
                .unwrap()
                .is_some()
        );
    }

    #[tokio::test]
    async fn digests_of_redacted_resources_stay_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = file_store(&dir, None);
        store.set_redacted(true);
        let secret_digest = 0x5ec2_e7d1_9e57_0001_u64;
        let mut known = KnownObjects::default();
        known.observe("s", "1", Some("ns"), "db", secret_digest);
        store.save("1", &mut known).await.unwrap();
        let text = std::fs::read_to_string(dir.path().join("cp")).unwrap();
        assert!(!text.contains(&secret_digest.to_string()), "{text}");
        assert_eq!(known.get("s").unwrap().digest, secret_digest, "in memory");
        let corrupt = AtomicU64::new(0);
        let loaded = store.load(&corrupt).await.unwrap().unwrap();
        assert_eq!(
            loaded.known.get("s").unwrap().digest,
            0,
            "stored as unknown"
        );

        // Not redacted: the digest is stored, so noise stays suppressed across restarts.
        let mut plain = file_store(&dir, None);
        plain.save("1", &mut known).await.unwrap();
        let loaded = plain.load(&corrupt).await.unwrap().unwrap();
        assert_eq!(loaded.known.get("s").unwrap().digest, secret_digest);
        // Redaction turned on later: the stored digests are rewritten away at the next save.
        let mut loaded = store.load(&corrupt).await.unwrap().unwrap();
        assert_eq!(loaded.known.take_dirty().len(), BUCKETS);
    }

    #[test]
    fn meta_records_out_of_range_or_of_unknown_versions_are_corrupt() {
        let k = key();
        for bad in [
            r#"{"version":5,"watch":"w","resourceVersion":"1","objects":0}"#,
            r#"{"version":3,"watch":"w","resourceVersion":"1","objects":0,"parts":{"3":2}}"#,
            r#"{"version":4,"watch":"w","resourceVersion":"1","objects":0,"parts":{"3":1}}"#,
            r#"{"version":4,"watch":"w","resourceVersion":"1","objects":0,"parts":{"3":1025}}"#,
            r#"{"version":4,"watch":"w","resourceVersion":"1","objects":0,"parts":{"256":2}}"#,
            r#"{"version":4,"watch":"w","resourceVersion":"1","objects":0,"journal":[["0123456789abcdef",5,4]]}"#,
            r#"{"version":4,"watch":"w","resourceVersion":"1","objects":0,"journal":[["xyz",1,4]]}"#,
            r#"{"version":4,"watch":"w","resourceVersion":"1","objects":0,"journal":[["0123456789abcdef",1,5000]]}"#,
            r#"{"version":0,"watch":"w","resourceVersion":"1","objects":0}"#,
            r#"{"version":2,"watch":"w","resourceVersion":"1","objects":0,"buckets":{"256":"0123456789abcdef"}}"#,
            r#"{"version":2,"watch":"w","resourceVersion":"1","objects":0,"buckets":{"3":"a.b >"}}"#,
            r#"{"version":2}"#,
        ] {
            assert!(
                matches!(Meta::decode(&k, bad.as_bytes()), Err(Error::Corrupt { .. })),
                "{bad}"
            );
        }
        let good = r#"{"version":2,"watch":"w","resourceVersion":"1","objects":0,"buckets":{"255":"0123456789abcdef"}}"#;
        assert!(Meta::decode(&k, good.as_bytes()).is_ok());
    }

    #[test]
    fn kafka_records_decode_and_stray_records_damage() {
        let k = key();
        let mut known = sample();
        let meta = Meta::new(&k, None, "9", &known);
        let mut records: HashMap<String, Vec<u8>> = (0..BUCKETS)
            .map(|b| (format!("{}/b/{b}", k.id), known.encode_bucket(b, true)))
            .collect();
        records.insert(format!("{}/meta", k.id), meta.to_bytes());
        known.take_dirty();
        match kafka::decode(&k, None, &records, &mut Journal::default()).unwrap() {
            Some(Found::Intact(c)) => {
                assert_eq!(c.known.len(), known.len());
                assert_eq!(c.known.get("odder"), known.get("odder"));
            }
            other => panic!("{other:?}"),
        }
        records.insert(format!("{}/b/x", k.id), Vec::new());
        assert!(matches!(
            kafka::decode(&k, None, &records, &mut Journal::default()).unwrap(),
            Some(Found::Damaged { .. })
        ));
        records.remove(&format!("{}/meta", k.id));
        assert!(
            kafka::decode(&k, None, &records, &mut Journal::default())
                .unwrap()
                .is_none()
        );
    }

    /// An index whose bucket `b` holds `n` objects with long names (about 300 bytes each as
    /// stored), and one object in another bucket.
    fn crowded(b: usize, n: usize) -> (KnownObjects, Vec<String>) {
        let mut known = KnownObjects::default();
        let mut uids = Vec::new();
        let mut i = 0;
        while uids.len() < n {
            let uid = format!("uid-{i}");
            if bucket_of(&uid) == b {
                known.observe(
                    &uid,
                    &i.to_string(),
                    Some("team-platform-production"),
                    &format!("{i:0>200}"),
                    9,
                );
                uids.push(uid);
            }
            i += 1;
        }
        let other = (0..)
            .map(|i| format!("other-{i}"))
            .find(|u| bucket_of(u) != b)
            .unwrap();
        known.observe(&other, "1", None, "other", 0);
        (known, uids)
    }

    /// Applies Kafka records (a `None` value is a tombstone) to the topic's last values.
    fn apply(topic: &mut HashMap<String, Vec<u8>>, records: Vec<(String, Option<Vec<u8>>)>) {
        for (k, v) in records {
            match v {
                Some(v) => topic.insert(k, v),
                None => topic.remove(&k),
            };
        }
    }

    fn damage(found: Option<Found>) -> String {
        match found {
            Some(Found::Damaged { problem, .. }) => problem.to_string(),
            other => panic!("not damaged: {other:?}"),
        }
    }

    /// A bucket past the record bound is stored in parts, each within the bound; a missing or
    /// an extra part makes the checkpoint damaged; when the bucket shrinks the compaction
    /// tombstones the parts it no longer needs, in its own transaction.
    #[test]
    fn kafka_buckets_in_parts_load_strictly_and_shrink_with_tombstones() {
        let k = key();
        let (mut known, uids) = crowded(7, 3000);
        known.mark_all_dirty();
        let (records, written) = kafka::compaction(&k, &mut known, true, &Journal::default());
        let parts = written.iter().find(|(b, _)| *b == 7).unwrap().1.parts;
        assert!(parts >= 3, "{parts} parts");
        for (name, value) in &records {
            let len = value.as_ref().map_or(0, Vec::len);
            assert!(len <= journal::RECORD_BYTES, "{name}: {len} bytes");
        }
        let mut topic = HashMap::new();
        apply(&mut topic, records);
        let mut meta = Meta::new(&k, None, "9", &known);
        meta.parts = Journal::default().parts_after(&written);
        assert_eq!(meta.parts, BTreeMap::from([(7, parts)]));
        topic.insert(format!("{}/meta", k.id), meta.to_bytes());
        let mut state = Journal::default();
        match kafka::decode(&k, None, &topic, &mut state).unwrap() {
            Some(Found::Intact(c)) => {
                assert_eq!(c.known.len(), known.len());
                for uid in &uids {
                    assert_eq!(c.known.get(uid), known.get(uid));
                }
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(state.parts(7), parts);

        let last = format!("{}/b/7.{}", k.id, parts - 1);
        let mut missing = topic.clone();
        missing.remove(&last);
        let problem = damage(kafka::decode(&k, None, &missing, &mut Journal::default()).unwrap());
        assert!(
            problem.contains(&format!(
                "bucket 7 part {} of {parts} is missing",
                parts - 1
            )),
            "{problem}"
        );
        let mut extra = topic.clone();
        extra.insert(format!("{}/b/7.{parts}", k.id), b"[]".to_vec());
        let mut damaged = Journal::default();
        let problem = damage(kafka::decode(&k, None, &extra, &mut damaged).unwrap());
        assert!(
            problem.contains(&format!("bucket 7 has a part {parts}")),
            "{problem}"
        );
        assert_eq!(
            damaged.parts(7),
            parts + 1,
            "the extra part is deleted when the bucket is rewritten"
        );

        for uid in &uids[..2900] {
            known.remove(uid);
        }
        let (records, written) = kafka::compaction(&k, &mut known, true, &state);
        let tombstones: Vec<&str> = records
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.as_str())
            .collect();
        let want: Vec<String> = (1..parts).map(|p| format!("{}/b/7.{p}", k.id)).collect();
        assert_eq!(tombstones, want);
        apply(&mut topic, records);
        let mut meta = Meta::new(&k, None, "10", &known);
        meta.parts = state.parts_after(&written);
        assert!(meta.parts.is_empty(), "{:?}", meta.parts);
        topic.insert(format!("{}/meta", k.id), meta.to_bytes());
        match kafka::decode(&k, None, &topic, &mut Journal::default()).unwrap() {
            Some(Found::Intact(c)) => assert_eq!(c.known.len(), 101),
            other => panic!("{other:?}"),
        }
    }

    /// A compaction whose transaction failed with an unknown outcome may have stored its
    /// parts: the next compaction of the bucket tombstones them too.
    #[test]
    fn kafka_parts_of_a_commit_of_unknown_outcome_are_deleted_later() {
        let k = key();
        let (mut known, uids) = crowded(7, 3000);
        let mut state = Journal::default();
        state.compacted(
            [(
                7,
                journal::Stored {
                    bytes: 10,
                    parts: 1,
                },
            )],
            None,
        );
        known.mark_all_dirty();
        let (_, written) = kafka::compaction(&k, &mut known, true, &state);
        let parts = written.iter().find(|(b, _)| *b == 7).unwrap().1.parts;
        state.maybe_stored(&written);
        for uid in &uids[..2900] {
            known.remove(uid);
        }
        let (records, _) = kafka::compaction(&k, &mut known, true, &state);
        let tombstones: Vec<&str> = records
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.as_str())
            .collect();
        let want: Vec<String> = (1..parts).map(|p| format!("{}/b/7.{p}", k.id)).collect();
        assert_eq!(tombstones, want);
    }

    /// A file's bucket past the record bound is one line per part; a missing or an extra part
    /// line makes the checkpoint damaged, and the repair's save stores it whole again. A crash
    /// before the new base is renamed into place loads the previous one.
    #[tokio::test]
    async fn file_buckets_in_parts_load_strictly() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = file_store(&dir, None);
        let (mut known, uids) = crowded(7, 3000);
        store.save("5", &mut known).await.unwrap();
        let path = dir.path().join("cp");
        let text = std::fs::read_to_string(&path).unwrap();
        let part_lines = text.lines().filter(|l| l.starts_with("7.")).count();
        assert!(part_lines >= 2, "{text:.200}");
        assert!(text.lines().all(|l| l.len() <= journal::RECORD_BYTES + 8));
        let corrupt = AtomicU64::new(0);
        let loaded = store.load(&corrupt).await.unwrap().unwrap();
        assert_eq!(loaded.resource_version.as_deref(), Some("5"));
        assert_eq!(loaded.known.get(&uids[1999]), known.get(&uids[1999]));

        let without: String = text
            .lines()
            .filter(|l| !l.starts_with("7.1\t"))
            .map(|l| format!("{l}\n"))
            .collect();
        let with_extra = format!("{text}7.{}\t[]\n", part_lines + 1);
        for damaged in [without, with_extra] {
            std::fs::write(&path, damaged).unwrap();
            let mut repair = store.load(&corrupt).await.unwrap().unwrap();
            assert_eq!(repair.resource_version, None, "a repair lists again");
            assert!(
                repair.known.get(&uids[0]).is_none(),
                "the damaged bucket is unusable"
            );
            store.save("6", &mut repair.known).await.unwrap();
            let again = store.load(&corrupt).await.unwrap().unwrap();
            assert_eq!(
                again.resource_version.as_deref(),
                Some("6"),
                "the repair's save is whole"
            );
        }
        assert_eq!(corrupt.load(Ordering::Relaxed), 2);

        std::fs::write(&path, &text).unwrap();
        std::fs::write(dir.path().join("cp.tmp"), &text[..text.len() / 2]).unwrap();
        let loaded = store.load(&corrupt).await.unwrap().unwrap();
        assert_eq!(loaded.resource_version.as_deref(), Some("5"));
        assert_eq!(loaded.known.len(), known.len());
        assert_eq!(corrupt.load(Ordering::Relaxed), 2);
    }

    /// Every decoder of stored data, fed arbitrary input, ends in a checkpoint or a
    /// [`Error::Corrupt`]: never a panic, never another error.
    fn assert_corrupt_or_intact(found: Found) -> std::result::Result<(), TestCaseError> {
        match found {
            Found::Intact(_) => Ok(()),
            Found::Damaged {
                problem: Error::Corrupt { .. },
                ..
            } => Ok(()),
            Found::Damaged { problem, .. } => Err(TestCaseError::fail(problem.to_string())),
        }
    }

    /// Meta records that decode as JSON, with fields anywhere in their range.
    fn meta_json() -> impl Strategy<Value = Vec<u8>> {
        (
            any::<u32>(),
            any::<String>(),
            any::<usize>(),
            proptest::collection::btree_map(0usize..300, "[0-9a-f]{16}|.{0,20}", 0..4),
            proptest::option::of(any::<String>()),
            proptest::collection::vec(("[0-9a-f]{16}|.{0,3}", 0u64..5, 0u64..5), 0..3),
            proptest::option::of("b|[0-9a-f]{16}"),
            proptest::collection::btree_map(0usize..300, 0usize..5, 0..3),
        )
            .prop_map(
                |(version, rv, objects, buckets, uid, journal, base, parts)| {
                    serde_json::to_vec(&serde_json::json!({
                        "parts": parts,
                        "version": version % 6,
                        "watch": "w",
                        "resourceVersion": rv,
                        "objects": objects % 4,
                        "buckets": buckets,
                        "clusterUid": uid,
                        "journal": journal,
                        "base": base,
                    }))
                    .unwrap()
                },
            )
    }

    /// Journal lines that decode as JSON, with fields anywhere in their range, maybe torn.
    fn journal_json() -> impl Strategy<Value = Vec<u8>> {
        let line = (
            prop_oneof![Just("b".to_string()), any::<String>()],
            0u64..4,
            proptest::collection::vec(
                (
                    "u[0-9]",
                    any::<String>(),
                    proptest::option::of("ns"),
                    any::<String>(),
                    any::<u64>(),
                ),
                0..3,
            ),
            proptest::collection::vec("u[0-9]", 0..3),
            proptest::option::of(("[0-9]{1,3}", 0usize..4)),
        )
            .prop_map(|(base, seq, upserts, removes, last)| {
                let mut line = serde_json::json!({
                    "base": base, "seq": seq, "upserts": upserts, "removes": removes,
                });
                if let Some((rv, objects)) = last {
                    line["resourceVersion"] = rv.into();
                    line["objects"] = objects.into();
                }
                line.to_string()
            });
        (proptest::collection::vec(line, 0..5), any::<bool>()).prop_map(|(lines, torn)| {
            let mut out = lines.join("\n");
            if !torn {
                out.push('\n');
            }
            out.into_bytes()
        })
    }

    fn bytes() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 0..200)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn meta_decoder_never_panics(stored in prop_oneof![bytes(), meta_json()]) {
            match Meta::decode(&key(), &stored) {
                Ok(_) | Err(Error::Corrupt { .. }) => {}
                Err(e) => return Err(TestCaseError::fail(e.to_string())),
            }
        }

        #[test]
        fn file_decoder_never_panics(
            meta in prop_oneof![bytes(), meta_json()],
            lines in proptest::collection::vec(("[0-9]{1,3}(\\.[0-9])?", bytes()), 0..4),
            raw in bytes(),
            journal_lines in prop_oneof![bytes(), journal_json()],
        ) {
            let mut stored = meta;
            stored.push(b'\n');
            for (b, line) in lines {
                stored.extend_from_slice(format!("{b}\t").as_bytes());
                stored.extend_from_slice(&line);
                stored.push(b'\n');
            }
            stored.extend_from_slice(&raw);
            assert_corrupt_or_intact(file::decode(&key(), None, &stored, &journal_lines, &mut Journal::default()).unwrap())?;
        }

        #[test]
        fn kafka_and_nats_decoders_never_panic(
            meta in prop_oneof![bytes(), meta_json()],
            buckets in proptest::collection::vec(("[0-9]{1,3}(\\.[0-9])?|.{0,4}", bytes()), 0..4),
        ) {
            let k = key();
            let mut records: HashMap<String, Vec<u8>> = buckets
                .iter()
                .map(|(b, v)| (format!("{}/b/{b}", k.id), v.clone()))
                .collect();
            records.insert(format!("{}/meta", k.id), meta.clone());
            let found = kafka::decode(&k, None, &records, &mut Journal::default()).unwrap().unwrap();
            assert_corrupt_or_intact(found)?;
            // NATS: the meta record names the buckets, fetched by generation.
            let found = match Meta::decode(&k, &meta) {
                Ok(m) => {
                    let mut named = Parts::new();
                    let mut stored = buckets.iter().map(|(_, v)| &v[..]);
                    for b in m.buckets.keys() {
                        let parts = named.entry(*b).or_default();
                        for p in 0..m.parts_of(*b) {
                            parts.extend(stored.next().map(|v| (p, v)));
                        }
                    }
                    Found::assemble(&k, m, named, std::iter::empty(), Vec::new(), &mut Journal::default())
                }
                Err(e) => Found::unreadable(e),
            };
            assert_corrupt_or_intact(found)?;
        }
    }
}
