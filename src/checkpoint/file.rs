//! Checkpoints of the stdout sink in a local file, one per watch: the meta record on the first
//! line, then one `{bucket}\t{record}` line per non-empty bucket (version 1 files: one line per
//! object). Replaced atomically: write a temporary file, fsync, rename.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{Cluster, Found, Meta, Result, WatchKey};
use crate::known::{BUCKETS, Encoding, KnownObjects};

/// A checkpoint file.
#[derive(Debug)]
pub struct FileStore {
    /// The watch.
    pub key: WatchKey,
    /// The file (named after the watch's id, in the configured directory).
    pub path: PathBuf,
    /// The cluster the checkpoint belongs to (`None`: not checked, not recorded).
    pub cluster: Option<Cluster>,
}

impl FileStore {
    fn err(&self, e: impl std::fmt::Display) -> super::Error {
        super::Error::Store {
            store: "file",
            message: format!("{}: {e}", self.path.display()),
        }
    }

    pub(super) async fn load(&self) -> Result<Option<Found>> {
        match tokio::fs::read(&self.path).await {
            Ok(stored) => decode(&self.key, self.cluster.as_ref(), &stored).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }

    pub(super) async fn save(
        &self,
        resource_version: &str,
        known: &mut KnownObjects,
        digests: bool,
    ) -> Result<()> {
        known.take_dirty();
        let meta = Meta::new(&self.key, self.cluster.as_ref(), resource_version, known);
        let out = encode(&meta, known, digests);
        let tmp = self.path.with_extension("tmp");
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&out)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        })
        .await
        .map_err(|e| self.err(e))?
        .map_err(|e| self.err(e))
    }

    pub(super) async fn reset(&self) -> Result<()> {
        match tokio::fs::remove_file(&self.path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }
}

/// The file's content.
fn encode(meta: &Meta, known: &KnownObjects, digests: bool) -> Vec<u8> {
    let mut out = meta.to_bytes();
    out.push(b'\n');
    for b in 0..BUCKETS {
        let record = known.encode_bucket(b, digests);
        if !record.is_empty() {
            // A JSON record never holds a raw line break.
            out.extend_from_slice(format!("{b}\t").as_bytes());
            out.extend_from_slice(&record);
            out.push(b'\n');
        }
    }
    out
}

/// Decodes a checkpoint file. Never panics; anything unexpected makes the checkpoint damaged.
pub(super) fn decode(key: &WatchKey, cluster: Option<&Cluster>, stored: &[u8]) -> Result<Found> {
    let (head, body) = match stored.iter().position(|&c| c == b'\n') {
        Some(at) => (&stored[..at], &stored[at + 1..]),
        None => (stored, &[][..]),
    };
    let meta = match Meta::decode(key, head) {
        Ok(meta) => meta,
        Err(e) => return Ok(Found::unreadable(e)),
    };
    meta.check_cluster(key, cluster)?;
    let mut records: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
    let mut problems = Vec::new();
    for (i, line) in body.split(|&c| c == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let parsed = line.iter().position(|&c| c == b'\t').and_then(|tab| {
            let b = std::str::from_utf8(&line[..tab])
                .ok()?
                .parse::<usize>()
                .ok()?;
            Some((b, &line[tab + 1..]))
        });
        let Some((b, record)) = parsed else {
            problems.push(format!(
                "line {} does not start with a bucket number",
                i + 2
            ));
            continue;
        };
        match meta.encoding() {
            Encoding::Text => {
                let text = records.entry(b).or_default();
                text.extend_from_slice(record);
                text.push(b'\n');
            }
            Encoding::Json => {
                if records.insert(b, record.to_vec()).is_some() {
                    problems.push(format!("bucket {b} appears twice"));
                }
            }
        }
    }
    Ok(Found::assemble(
        key,
        meta,
        records.iter().map(|(b, r)| (*b, Some(&r[..]))),
        problems,
    ))
}
