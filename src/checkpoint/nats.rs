//! NATS checkpoints in a KV bucket: `{id}.meta` and `{id}.b{bucket}.{generation}`. A save writes
//! the changed buckets under a fresh generation, then swaps the meta record with
//! compare-and-swap on the revision this instance last wrote or read, which fences a stale
//! writer; buckets the new meta record no longer names are purged afterwards.

use std::collections::{BTreeMap, BTreeSet};

use async_nats::jetstream::kv;
use bytes::Bytes;

use super::{Cluster, Error, Found, Meta, Result, WatchKey};
use crate::known::KnownObjects;

/// One watch's NATS checkpoints.
#[derive(Debug)]
pub struct NatsStore {
    key: WatchKey,
    kv: kv::Store,
    cluster: Option<Cluster>,
    /// The meta record's revision this instance last wrote or read.
    revision: Option<u64>,
    /// The generation of each non-empty bucket, as the meta record at `revision` names them.
    buckets: BTreeMap<usize, String>,
    /// A meta record whose write failed with an unknown outcome (its reply was lost), and the
    /// buckets it names: the store may hold it.
    unconfirmed: Option<(Bytes, BTreeMap<usize, String>)>,
}

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

    fn bucket_key(&self, b: usize, generation: &str) -> String {
        format!("{}.b{b}.{generation}", self.key.id)
    }

    pub(super) async fn load(&mut self) -> Result<Option<Found>> {
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
        let mut stored = Vec::with_capacity(meta.buckets.len());
        for (b, generation) in &meta.buckets {
            let record = self
                .kv
                .get(self.bucket_key(*b, generation))
                .await
                .map_err(store_err)?;
            stored.push((*b, record));
        }
        self.buckets = meta.buckets.clone();
        Ok(Some(Found::assemble(
            &self.key,
            meta,
            stored.iter().map(|(b, r)| (*b, r.as_deref())),
            Vec::new(),
        )))
    }

    pub(super) async fn save(
        &mut self,
        resource_version: &str,
        known: &mut KnownObjects,
        digests: bool,
    ) -> Result<()> {
        let generation = format!("{:016x}", random_u64());
        let mut buckets = self.buckets.clone();
        for b in known.take_dirty() {
            let record = known.encode_bucket(b, digests);
            buckets.remove(&b);
            if !record.is_empty() {
                self.kv
                    .put(self.bucket_key(b, &generation), Bytes::from(record))
                    .await
                    .map_err(store_err)?;
                buckets.insert(b, generation.clone());
            }
        }
        let mut meta = Meta::new(&self.key, self.cluster.as_ref(), resource_version, known);
        meta.buckets = buckets.clone();
        let value = Bytes::from(meta.to_bytes());
        let revision = self.swap_meta(value, &buckets).await?;
        // Named by no meta record now: the buckets replaced, and those of an unconfirmed write
        // (whether or not it happened).
        let mut stale: BTreeSet<(usize, String)> =
            std::mem::take(&mut self.buckets).into_iter().collect();
        if let Some((_, written)) = self.unconfirmed.take() {
            stale.extend(written);
        }
        for current in buckets.iter().map(|(b, g)| (*b, g.clone())) {
            stale.remove(&current);
        }
        self.revision = Some(revision);
        self.buckets = buckets;
        for (b, generation) in stale {
            // Best effort: an orphaned old generation is harmless, only space.
            let _ = self.kv.purge(self.bucket_key(b, &generation)).await;
        }
        Ok(())
    }

    /// Swaps the meta record for `value` (which names `buckets`). A conflict is fencing only if
    /// the record holds a foreign value: it may hold this very value (its write happened but the
    /// reply was lost, and the client retried), or an earlier write of ours whose reply was lost,
    /// which is adopted before swapping again.
    async fn swap_meta(&mut self, value: Bytes, buckets: &BTreeMap<usize, String>) -> Result<u64> {
        let mut adopted = false;
        loop {
            match self.try_swap(value.clone()).await {
                Swap::Done(revision) => return Ok(revision),
                Swap::Failed(message) => {
                    self.unconfirmed = Some((value, buckets.clone()));
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
                .is_some_and(|(earlier, _)| *earlier == current.value);
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
