//! Checkpoints of the stdout sink in local files, one base and one journal per watch.
//!
//! The base: the meta record on the first line, then one `{bucket}\t{record}` line per
//! non-empty bucket, or for a bucket larger than [`RECORD_BYTES`] one line per part, the first
//! `{bucket}\t{part}` and the others `{bucket}.{part number}\t{part}` (version 1 files: one
//! line per object); replaced atomically at a compaction
//! (write a temporary file, fsync, rename, fsync the directory), then the journal is deleted.
//! The journal, `{base}.journal`: one [`Record`] per line, appended and fsynced by each
//! checkpoint between compactions (see [`super::journal`]). Each line names the base it
//! extends and its sequence number; the last line of a checkpoint carries its resourceVersion.
//! A crash at any point therefore loads a checkpoint that was completely saved: lines of an
//! older base are skipped, and so are the lines of a checkpoint cut short; the next save then
//! compacts.
//!
//! Announcements ([`super::announce`]) go to `{base}.announced`, one record per line, appended
//! and fsynced; a save deletes the file once it is stored (it covers them), and a load counts
//! only the lines tied to the checkpoint it found (its base and number of journal lines).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::journal::{Journal, Plan, RECORD_BYTES, Record, Segment, Stored};

use super::{Backend, Cluster, Found, Loaded, Meta, Parts, Result, WatchKey, Written, announce};
use crate::known::{BUCKETS, Encoding, KnownObjects, StoredEntry};

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

#[async_trait::async_trait]
impl Backend for FileStore {
    /// Loads the checkpoint, if any, and the announcements tied to it (or, without one, to no
    /// checkpoint) with the problems of the lines that could not be decoded.
    async fn load(&mut self, journal: &mut Journal) -> Result<Loaded> {
        let found = self.load_checkpoint(journal).await?;
        let lines = self.read_announced().await?;
        let (entries, problems) = announce::entries_tied(
            &tie(journal),
            lines.split(|&c| c == b'\n').filter(|l| !l.is_empty()),
        );
        Ok((found, entries, problems))
    }

    async fn save(
        &mut self,
        resource_version: &str,
        known: &mut KnownObjects,
        digests: bool,
        plan: Plan,
        journal: &mut Journal,
    ) -> Result<()> {
        match plan {
            Plan::Compact => {
                known.take_dirty();
                let mut meta = Meta::new(&self.key, self.cluster.as_ref(), resource_version, known);
                let base = format!("{:016x}", super::random_u64());
                meta.base = Some(base.clone());
                let (out, sizes) = encode(meta, known, digests);
                let (path, lines) = (self.path.clone(), self.journal_path());
                tokio::task::spawn_blocking(move || replace(&path, &out, &lines))
                    .await
                    .map_err(|e| self.err(e))?
                    .map_err(|e| self.err(e))?;
                journal.compacted(sizes.into_iter().enumerate(), Some(base));
            }
            Plan::Append(records) => {
                let reserved = journal.reserve(records.len());
                let mut out = Vec::with_capacity(records.iter().map(|r| r.len() + 1).sum());
                for record in &records {
                    // A JSON record never holds a raw line break.
                    out.extend_from_slice(record);
                    out.push(b'\n');
                }
                let lines = self.journal_path();
                tokio::task::spawn_blocking(move || append(&lines, &out))
                    .await
                    .map_err(|e| self.err(e))?
                    .map_err(|e| self.err(e))?;
                journal.appended(reserved.as_ref(), &records);
            }
        }
        // The save covers every announcement: they are tied to the checkpoint before it.
        match tokio::fs::remove_file(self.announced_path()).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }

    async fn reset(&mut self) -> Result<()> {
        for path in [
            self.announced_path(),
            self.journal_path(),
            self.path.clone(),
        ] {
            match tokio::fs::remove_file(&path).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(self.err(e)),
            }
        }
        Ok(())
    }

    /// The journal is appended apart from the meta record, which may lag behind it.
    fn stamps(&self) -> bool {
        true
    }

    fn announces(&self) -> bool {
        true
    }

    /// Appends announcements of `entries`, tied to the stored checkpoint, and fsyncs them.
    async fn announce(&mut self, journal: &Journal, entries: &[StoredEntry]) -> Result<()> {
        let mut out = Vec::new();
        for record in announce::encode(&tie(journal), entries) {
            // A JSON record never holds a raw line break.
            out.extend_from_slice(&record);
            out.push(b'\n');
        }
        let path = self.announced_path();
        tokio::task::spawn_blocking(move || append(&path, &out))
            .await
            .map_err(|e| self.err(e))?
            .map_err(|e| self.err(e))
    }

    fn finish(&mut self, written: Written, _: &mut Journal) -> Result<()> {
        Err(written.not_staged_here("file"))
    }
}

impl FileStore {
    fn err(&self, e: impl std::fmt::Display) -> super::Error {
        super::Error::Store {
            store: "file",
            message: format!("{}: {e}", self.path.display()),
        }
    }

    /// The journal file beside the base: `{path}.journal`.
    fn journal_path(&self) -> PathBuf {
        let mut path = self.path.clone().into_os_string();
        path.push(".journal");
        PathBuf::from(path)
    }

    /// The announcements beside the base: `{path}.announced`.
    fn announced_path(&self) -> PathBuf {
        let mut path = self.path.clone().into_os_string();
        path.push(".announced");
        PathBuf::from(path)
    }

    async fn load_checkpoint(&self, journal: &mut Journal) -> Result<Option<Found>> {
        let stored = match tokio::fs::read(&self.path).await {
            Ok(stored) => stored,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.err(e)),
        };
        let lines = match tokio::fs::read(self.journal_path()).await {
            Ok(lines) => lines,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(self.err(e)),
        };
        decode(&self.key, self.cluster.as_ref(), &stored, &lines, journal).map(Some)
    }

    /// The announcement lines, whole: a last line cut short by a crash is cut off the file
    /// (durably), so that the next line appended starts a line of its own.
    async fn read_announced(&self) -> Result<Vec<u8>> {
        let path = self.announced_path();
        let mut lines = match tokio::fs::read(&path).await {
            Ok(lines) => lines,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.err(e)),
        };
        let whole = lines
            .iter()
            .rposition(|&c| c == b'\n')
            .map_or(0, |at| at + 1);
        if whole < lines.len() {
            lines.truncate(whole);
            tokio::task::spawn_blocking(move || truncate(&path, whole as u64))
                .await
                .map_err(|e| self.err(e))?
                .map_err(|e| self.err(e))?;
        }
        Ok(lines)
    }
}

/// Replaces the base at `path` with `content` atomically (temporary file, fsync, rename, fsync
/// of the directory), then deletes the journal at `lines`: until then its lines name the old
/// base, so they are skipped at load.
fn replace(path: &Path, content: &[u8], lines: &Path) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(content)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    sync_dir(path)?;
    match std::fs::remove_file(lines) {
        Ok(()) => sync_dir(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Appends `content` to the journal at `lines` and fsyncs it (and its directory when it was
/// created).
fn append(lines: &Path, content: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let existed = lines.exists();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(lines)?;
    f.write_all(content)?;
    f.sync_data()?;
    if !existed {
        sync_dir(lines)?;
    }
    Ok(())
}

/// Cuts the file at `path` to `len` bytes, durably.
fn truncate(path: &Path, len: u64) -> std::io::Result<()> {
    let f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.set_len(len)?;
    f.sync_data()
}

/// What announcements are tied to: the stored base and the number of its journal lines (`-`
/// when no checkpoint is stored).
fn tie(journal: &Journal) -> String {
    match journal.base() {
        Some(base) => format!("{base}.{}", journal.records()),
        None => "-".into(),
    }
}

/// Makes a rename or creation in the directory of `path` durable.
fn sync_dir(path: &Path) -> std::io::Result<()> {
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => std::fs::File::open(".")?.sync_all(),
    }
}

/// The file's content (`meta` completed with the buckets' parts), and how each bucket is stored.
fn encode(mut meta: Meta, known: &KnownObjects, digests: bool) -> (Vec<u8>, Vec<Stored>) {
    let buckets: Vec<Vec<Vec<u8>>> = (0..BUCKETS)
        .map(|b| known.encode_bucket_parts(b, digests, RECORD_BYTES))
        .collect();
    meta.parts = (0..BUCKETS)
        .zip(&buckets)
        .filter(|(_, parts)| parts.len() > 1)
        .map(|(b, parts)| (b, parts.len()))
        .collect();
    let mut out = meta.to_bytes();
    out.push(b'\n');
    let mut stored = vec![Stored::default(); BUCKETS];
    for (b, parts) in buckets.into_iter().enumerate() {
        stored[b].bytes = parts.iter().map(Vec::len).sum();
        if stored[b].bytes == 0 {
            continue;
        }
        stored[b].parts = parts.len();
        for (p, part) in parts.into_iter().enumerate() {
            // A JSON record never holds a raw line break.
            match p {
                0 => out.extend_from_slice(format!("{b}\t").as_bytes()),
                p => out.extend_from_slice(format!("{b}.{p}\t").as_bytes()),
            }
            out.extend_from_slice(&part);
            out.push(b'\n');
        }
    }
    (out, stored)
}

/// Decodes a checkpoint file and its journal (`lines`) and records in `journal` what is stored.
/// Never panics; anything unexpected makes the checkpoint damaged.
pub(super) fn decode(
    key: &WatchKey,
    cluster: Option<&Cluster>,
    stored: &[u8],
    lines: &[u8],
    journal: &mut Journal,
) -> Result<Found> {
    let (head, body) = match stored.iter().position(|&c| c == b'\n') {
        Some(at) => (&stored[..at], &stored[at + 1..]),
        None => (stored, &[][..]),
    };
    let mut meta = match Meta::decode(key, head) {
        Ok(meta) => meta,
        Err(e) => return Ok(Found::unreadable(e)),
    };
    meta.check_cluster(key, cluster)?;
    let (records, mut problems) = base_records(&meta, body);
    let replay = match meta.base.as_deref() {
        Some(base) => journal_lines(base, lines),
        None => Replay::default(),
    };
    problems.extend(replay.problem);
    if let Some((resource_version, objects)) = replay.last {
        meta.resource_version = resource_version;
        meta.objects = objects;
    }
    if !replay.lines.is_empty() {
        // The stored lines count towards the compaction bound.
        meta.journal = vec![Segment("0".repeat(16), 1, replay.lines.len() as u64)];
    }
    let found = Found::assemble(
        key,
        meta,
        records
            .iter()
            .map(|(b, parts)| (*b, parts.iter().map(|(p, r)| (*p, &r[..])).collect()))
            .collect::<Parts<'_>>(),
        replay
            .lines
            .iter()
            .map(|(seq, line)| (format!("line {seq}"), Some(*line))),
        problems,
        journal,
    );
    if replay.untidy {
        journal.invalidate();
    }
    Ok(found)
}

/// The records of a base's buckets: bucket → part → record.
type BaseRecords = BTreeMap<usize, BTreeMap<usize, Vec<u8>>>;

/// The records of the base's buckets (bucket → part → record), and what is wrong with its
/// lines.
fn base_records(meta: &Meta, body: &[u8]) -> (BaseRecords, Vec<String>) {
    let mut records = BaseRecords::new();
    let mut problems = Vec::new();
    for (i, line) in body.split(|&c| c == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let parsed = line.iter().position(|&c| c == b'\t').and_then(|tab| {
            let name = std::str::from_utf8(&line[..tab]).ok()?;
            Some((super::parse_part(name)?, &line[tab + 1..]))
        });
        let Some(((b, p), record)) = parsed else {
            problems.push(format!(
                "line {} does not start with a bucket number",
                i + 2
            ));
            continue;
        };
        match meta.encoding() {
            Encoding::Text => {
                let text = records.entry(b).or_default().entry(p).or_default();
                text.extend_from_slice(record);
                text.push(b'\n');
            }
            Encoding::Json => {
                if records
                    .entry(b)
                    .or_default()
                    .insert(p, record.to_vec())
                    .is_some()
                {
                    problems.push(format!("bucket {b} part {p} appears twice"));
                }
            }
        }
    }
    (records, problems)
}

/// The journal lines to replay over a base.
#[derive(Debug, Default)]
struct Replay<'a> {
    /// The lines of the checkpoints completely saved, with their sequence numbers.
    lines: Vec<(u64, &'a [u8])>,
    /// The resourceVersion and object count of the last of them.
    last: Option<(String, usize)>,
    /// A line that cannot be decoded or is out of sequence.
    problem: Option<String>,
    /// Lines of an older base or of a checkpoint cut short were skipped: the next save
    /// compacts.
    untidy: bool,
}

/// Selects the lines of journal `lines` that extend base `base`: those of an older base are
/// skipped, and so are the lines after the last one carrying a resourceVersion (a checkpoint
/// whose write was cut short, as is a last line without its line break).
fn journal_lines<'a>(base: &str, lines: &'a [u8]) -> Replay<'a> {
    let mut replay = Replay::default();
    let (complete, torn) = match lines.iter().rposition(|&c| c == b'\n') {
        Some(at) => (&lines[..at], &lines[at + 1..]),
        None => (&[][..], lines),
    };
    replay.untidy = !torn.is_empty();
    let mut pending = Vec::new();
    if complete.is_empty() {
        return replay;
    }
    for line in complete.split(|&c| c == b'\n') {
        let record = match Record::decode(line) {
            Ok(record) => record,
            Err(problem) => {
                replay.problem = Some(format!(
                    "{problem} (line {})",
                    replay.lines.len() + pending.len() + 1
                ));
                return replay;
            }
        };
        if record.base.as_deref() != Some(base) {
            replay.untidy = true;
            continue;
        }
        let expected = (replay.lines.len() + pending.len() + 1) as u64;
        if record.seq != Some(expected) {
            replay.problem = Some(format!(
                "journal line {:?} follows line {}",
                record.seq,
                expected - 1
            ));
            return replay;
        }
        pending.push((expected, line));
        if let (Some(rv), Some(objects)) = (record.resource_version, record.objects) {
            replay.lines.append(&mut pending);
            replay.last = Some((rv, objects));
        }
    }
    replay.untidy |= !pending.is_empty();
    replay
}
