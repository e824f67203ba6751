//! Durable progress per watch: the resourceVersion up to which every event is acknowledged, plus
//! the known-object index needed to find deletions after a long gap. Stored where the events go:
//!
//! - Kafka: records in a compacted topic, written in the same transaction as the events they
//!   cover (one `transactional.id` per watch, which also fences an older instance);
//! - NATS JetStream: a KV bucket; index buckets are written under fresh keys, then the meta record
//!   is swapped with compare-and-swap on its revision, which fences a stale writer;
//! - stdout: an optional local file, replaced atomically.
//!
//! A checkpoint is only saved when every event before it has been acknowledged (see
//! [`crate::pipeline`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_nats::jetstream::kv;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::known::{BUCKETS, KnownObjects};
use crate::sink::kafka::KafkaSink;

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

/// The identity of a watch, stable across restarts: cluster, resource, namespace and selectors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchKey {
    /// Key-safe id: `{cluster}.{16 hex digits}`.
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
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in description.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let safe: String = cluster
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        Self {
            id: format!("{safe}.{h:016x}"),
            description,
        }
    }
}

/// What a checkpoint holds.
#[derive(Debug)]
pub struct Checkpoint {
    /// Every event up to here is acknowledged.
    pub resource_version: String,
    /// The objects known at that point.
    pub known: KnownObjects,
}

/// The meta record.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    version: u32,
    watch: String,
    resource_version: String,
    objects: usize,
    /// NATS only: the key suffix holding each non-empty bucket.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    buckets: BTreeMap<usize, String>,
}

/// Where one watch's checkpoints live.
#[derive(Debug)]
#[expect(clippy::large_enum_variant, reason = "one value per watch")]
pub enum Store {
    /// Kafka: compacted topic, in the events' transaction.
    Kafka(KafkaStore),
    /// NATS JetStream KV.
    Nats(NatsStore),
    /// A local file.
    File(FileStore),
    /// Not persisted (stdout without a checkpoint file).
    Memory,
}

impl Store {
    /// Loads the last saved checkpoint, if any.
    pub async fn load(&mut self) -> Result<Option<Checkpoint>> {
        match self {
            Store::Kafka(s) => s.load().await,
            Store::Nats(s) => s.load().await,
            Store::File(s) => s.load().await,
            Store::Memory => Ok(None),
        }
    }

    /// Saves progress up to `resource_version`: the changed index buckets and the meta record.
    /// Called only when every event before it is acknowledged.
    pub async fn save(&mut self, resource_version: &str, known: &mut KnownObjects) -> Result<()> {
        match self {
            Store::Kafka(s) => s.save(resource_version, known).await,
            Store::Nats(s) => s.save(resource_version, known).await,
            Store::File(s) => s.save(resource_version, known).await,
            Store::Memory => {
                known.take_dirty();
                Ok(())
            }
        }
    }

    /// Deletes the checkpoint, so the next start lists and publishes a fresh snapshot. A running
    /// instance that owns the watch is fenced by this (Kafka: a newer transactional producer;
    /// NATS: the meta revision changes) and exits, to be restarted.
    pub async fn reset(&mut self) -> Result<()> {
        match self {
            Store::Kafka(s) => {
                let mut records: Vec<(String, Option<Vec<u8>>)> = (0..BUCKETS)
                    .map(|b| (format!("{}/b/{b}", s.key.id), None))
                    .collect();
                records.push((format!("{}/meta", s.key.id), None));
                s.sink
                    .commit_tombstones(&s.topic, records)
                    .await
                    .map_err(|e| Error::Store {
                        store: "kafka",
                        message: e.to_string(),
                    })
            }
            Store::Nats(s) => {
                s.kv.purge(format!("{}.meta", s.key.id))
                    .await
                    .map_err(NatsStore::err)
            }
            Store::File(s) => match tokio::fs::remove_file(&s.path).await {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(FileStore::err(e)),
            },
            Store::Memory => Ok(()),
        }
    }

    /// Whether checkpoints survive a restart.
    pub fn durable(&self) -> bool {
        !matches!(self, Store::Memory)
    }
}

fn meta(key: &WatchKey, resource_version: &str, known: &KnownObjects) -> Meta {
    Meta {
        version: 1,
        watch: key.description.clone(),
        resource_version: resource_version.into(),
        objects: known.len(),
        buckets: BTreeMap::new(),
    }
}

fn corrupt(key: &WatchKey, message: impl std::fmt::Display) -> Error {
    Error::Corrupt {
        watch: key.description.clone(),
        message: message.to_string(),
    }
}

/// Kafka checkpoints: `{id}/meta` and `{id}/b/{bucket}` records in a compacted topic.
#[derive(Debug)]
pub struct KafkaStore {
    /// The watch.
    pub key: WatchKey,
    /// The watch's transactional sink (events and checkpoints share its transactions).
    pub sink: Arc<KafkaSink>,
    /// The compacted checkpoint topic.
    pub topic: String,
}

impl KafkaStore {
    async fn load(&self) -> Result<Option<Checkpoint>> {
        let prefix = format!("{}/", self.key.id);
        let records = self
            .sink
            .read_compacted(&self.topic, &prefix)
            .await
            .map_err(|e| Error::Store {
                store: "kafka",
                message: e.to_string(),
            })?;
        let Some(meta_bytes) = records.get(&format!("{prefix}meta")) else {
            return Ok(None);
        };
        let meta: Meta = serde_json::from_slice(meta_bytes).map_err(|e| corrupt(&self.key, e))?;
        let mut known = KnownObjects::default();
        for b in 0..BUCKETS {
            if let Some(text) = records.get(&format!("{prefix}b/{b}")) {
                known
                    .decode_bucket(b, &String::from_utf8_lossy(text))
                    .map_err(|e| corrupt(&self.key, e))?;
            }
        }
        loaded(&self.key, meta, known)
    }

    async fn save(&self, resource_version: &str, known: &mut KnownObjects) -> Result<()> {
        let mut records = Vec::new();
        for b in known.take_dirty() {
            records.push((
                format!("{}/b/{b}", self.key.id),
                known.encode_bucket(b).into_bytes(),
            ));
        }
        let m =
            serde_json::to_vec(&meta(&self.key, resource_version, known)).expect("meta serializes");
        records.push((format!("{}/meta", self.key.id), m));
        self.sink
            .commit_with(&self.topic, records)
            .await
            .map_err(|e| match e {
                crate::sink::kafka::CommitError::Fenced => Error::Fenced {
                    watch: self.key.description.clone(),
                },
                other => Error::Store {
                    store: "kafka",
                    message: other.to_string(),
                },
            })
    }
}

/// Checks a loaded index against its meta record and wraps it as the loaded checkpoint (nothing
/// dirty: it is what the store holds).
fn loaded(key: &WatchKey, meta: Meta, mut known: KnownObjects) -> Result<Option<Checkpoint>> {
    known.take_dirty();
    if meta.objects != known.len() {
        return Err(corrupt(
            key,
            format!(
                "meta says {} objects, buckets hold {}",
                meta.objects,
                known.len()
            ),
        ));
    }
    Ok(Some(Checkpoint {
        resource_version: meta.resource_version,
        known,
    }))
}

/// NATS checkpoints in a KV bucket: `{id}.meta` (compare-and-swap) and `{id}.b{bucket}.{generation}`.
#[derive(Debug)]
pub struct NatsStore {
    /// The watch.
    pub key: WatchKey,
    /// The KV bucket.
    pub kv: kv::Store,
    revision: Option<u64>,
    buckets: BTreeMap<usize, String>,
}

impl NatsStore {
    /// A store for one watch in `kv`.
    pub fn new(key: WatchKey, kv: kv::Store) -> Self {
        Self {
            key,
            kv,
            revision: None,
            buckets: BTreeMap::new(),
        }
    }

    fn err(e: impl std::fmt::Display) -> Error {
        Error::Store {
            store: "nats",
            message: e.to_string(),
        }
    }

    async fn load(&mut self) -> Result<Option<Checkpoint>> {
        let Some(entry) = self
            .kv
            .entry(format!("{}.meta", self.key.id))
            .await
            .map_err(Self::err)?
        else {
            return Ok(None);
        };
        if entry.value.is_empty() {
            return Ok(None);
        }
        let meta: Meta = serde_json::from_slice(&entry.value).map_err(|e| corrupt(&self.key, e))?;
        let mut known = KnownObjects::default();
        for (b, generation) in &meta.buckets {
            let text = self
                .kv
                .get(format!("{}.b{b}.{generation}", self.key.id))
                .await
                .map_err(Self::err)?
                .ok_or_else(|| {
                    corrupt(
                        &self.key,
                        format!("bucket {b} generation {generation} is missing"),
                    )
                })?;
            known
                .decode_bucket(*b, &String::from_utf8_lossy(&text))
                .map_err(|e| corrupt(&self.key, e))?;
        }
        self.revision = Some(entry.revision);
        self.buckets = meta.buckets.clone();
        loaded(&self.key, meta, known)
    }

    async fn save(&mut self, resource_version: &str, known: &mut KnownObjects) -> Result<()> {
        let generation = format!("{:016x}", random_u64());
        let mut buckets = self.buckets.clone();
        let mut replaced = Vec::new();
        for b in known.take_dirty() {
            let text = known.encode_bucket(b);
            if let Some(old) = buckets.remove(&b) {
                replaced.push(format!("{}.b{b}.{old}", self.key.id));
            }
            if !text.is_empty() {
                self.kv
                    .put(
                        format!("{}.b{b}.{generation}", self.key.id),
                        Bytes::from(text),
                    )
                    .await
                    .map_err(Self::err)?;
                buckets.insert(b, generation.clone());
            }
        }
        let mut m = meta(&self.key, resource_version, known);
        m.buckets = buckets.clone();
        let value = Bytes::from(serde_json::to_vec(&m).expect("meta serializes"));
        let meta_key = format!("{}.meta", self.key.id);
        let revision = match self.revision {
            Some(rev) => self.kv.update(&meta_key, value, rev).await.map_err(|e| {
                if e.kind() == kv::UpdateErrorKind::WrongLastRevision {
                    Error::Fenced {
                        watch: self.key.description.clone(),
                    }
                } else {
                    Self::err(e)
                }
            })?,
            None => self.kv.create(&meta_key, value).await.map_err(|e| {
                if e.kind() == kv::CreateErrorKind::AlreadyExists {
                    Error::Fenced {
                        watch: self.key.description.clone(),
                    }
                } else {
                    Self::err(e)
                }
            })?,
        };
        self.revision = Some(revision);
        self.buckets = buckets;
        for key in replaced {
            // Best effort: an orphaned old generation is harmless, only space.
            let _ = self.kv.purge(key).await;
        }
        Ok(())
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
            .map_err(NatsStore::err),
    }
}

/// A checkpoint file for the stdout sink: the meta record as the first line, then one
/// `bucket\tline` per object; replaced atomically (write, fsync, rename).
#[derive(Debug)]
pub struct FileStore {
    /// The watch.
    pub key: WatchKey,
    /// The file (one per watch, named after its id, in the configured directory).
    pub path: PathBuf,
}

impl FileStore {
    fn err(e: impl std::fmt::Display) -> Error {
        Error::Store {
            store: "file",
            message: e.to_string(),
        }
    }

    async fn load(&self) -> Result<Option<Checkpoint>> {
        let text = match tokio::fs::read_to_string(&self.path).await {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Self::err(format!("{}: {e}", self.path.display()))),
        };
        let (head, body) = text.split_once('\n').unwrap_or((&text, ""));
        let meta: Meta = serde_json::from_str(head).map_err(|e| corrupt(&self.key, e))?;
        let mut per_bucket: BTreeMap<usize, String> = BTreeMap::new();
        for line in body.lines() {
            let (b, rest) = line
                .split_once('\t')
                .ok_or_else(|| corrupt(&self.key, "line without bucket"))?;
            let b: usize = b.parse().map_err(|e| corrupt(&self.key, e))?;
            let text = per_bucket.entry(b).or_default();
            text.push_str(rest);
            text.push('\n');
        }
        let mut known = KnownObjects::default();
        for (b, text) in per_bucket {
            if b >= BUCKETS {
                return Err(corrupt(&self.key, format!("bucket {b} out of range")));
            }
            known
                .decode_bucket(b, &text)
                .map_err(|e| corrupt(&self.key, e))?;
        }
        loaded(&self.key, meta, known)
    }

    async fn save(&self, resource_version: &str, known: &mut KnownObjects) -> Result<()> {
        known.take_dirty();
        let mut out = serde_json::to_string(&meta(&self.key, resource_version, known))
            .expect("meta serializes");
        out.push('\n');
        for b in 0..BUCKETS {
            for line in known.encode_bucket(b).lines() {
                out.push_str(&format!("{b}\t{line}\n"));
            }
        }
        let tmp = self.path.with_extension("tmp");
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(out.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        })
        .await
        .map_err(Self::err)?
        .map_err(|e| Self::err(format!("{}: {e}", self.path.display())))
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[tokio::test]
    async fn file_store_round_trips_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let key = WatchKey::new("dev", "v1", "configmaps", None, None, None);
        let mut store = Store::File(FileStore {
            key: key.clone(),
            path: dir.path().join("cp"),
        });
        assert!(store.load().await.unwrap().is_none());
        let mut known = KnownObjects::default();
        for i in 0..500 {
            known.observe(
                &format!("u{i}"),
                &format!("{i}"),
                Some("ns"),
                &format!("n{i}"),
                0,
            );
        }
        store.save("777", &mut known).await.unwrap();
        let loaded = store.load().await.unwrap().unwrap();
        assert_eq!(loaded.resource_version, "777");
        assert_eq!(loaded.known.len(), 500);
        assert_eq!(loaded.known.get("u42"), known.get("u42"));
        assert!(!dir.path().join("cp.tmp").exists());
    }
}
