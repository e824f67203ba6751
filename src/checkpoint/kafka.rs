//! Kafka checkpoints: records `{id}/meta`, `{id}/b/{bucket}` (and `{id}/b/{bucket}.{part}` for
//! the further parts of a bucket larger than [`RECORD_BYTES`]) and journal records
//! `{id}/j/{writer}/{sequence}` (see [`super::journal`]) in a compacted topic with one
//! partition, written in the transaction of the events they cover. A compaction tombstones the
//! journal records, and the parts a shrunk bucket no longer needs, in the same transaction.
//!
//! The topic must keep the last record of every key for ever (`cleanup.policy=compact`; with
//! `delete` retention would silently drop the checkpoints of quiet watches) and keep one watch's
//! records in order (one partition), so an existing topic is checked for both at start.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use super::journal::{Journal, Plan, RECORD_BYTES, Stored};

use super::{Backend, Cluster, Error, Found, Loaded, Meta, Parts, Result, WatchKey, Written};
use crate::known::{BUCKETS, KnownObjects};
use crate::sink::kafka::{CommitError, KafkaSink, Latest};

mod topic;

pub use topic::ensure_topic;

/// How long reading the topic may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// One watch's Kafka checkpoints.
#[derive(Debug)]
pub struct KafkaStore {
    /// The watch.
    pub key: WatchKey,
    /// The watch's transactional sink (events and checkpoints share its transactions).
    pub sink: Arc<KafkaSink>,
    /// The compacted checkpoint topic.
    pub topic: String,
    /// The cluster the checkpoint belongs to (`None`: not checked, not recorded).
    pub cluster: Option<Cluster>,
}

fn store_err(e: impl std::fmt::Display) -> Error {
    Error::Store {
        store: "kafka",
        message: e.to_string(),
    }
}

#[async_trait::async_trait]
impl Backend for KafkaStore {
    /// Kafka announces nothing: the checkpoint is in the transaction with the events.
    async fn load(&mut self, journal: &mut Journal) -> Result<Loaded> {
        Ok((self.load_checkpoint(journal).await?, Vec::new(), Vec::new()))
    }

    async fn save(
        &mut self,
        resource_version: &str,
        known: &mut KnownObjects,
        digests: bool,
        plan: Plan,
        journal: &mut Journal,
    ) -> Result<()> {
        let mut records = Vec::new();
        let mut meta = Meta::new(&self.key, self.cluster.as_ref(), resource_version, known);
        let mut written = Vec::new();
        let mut reserved = None;
        match &plan {
            Plan::Compact => {
                (records, written) = compaction(&self.key, known, digests, journal);
                meta.parts = journal.parts_after(&written);
            }
            Plan::Append(appended) => {
                meta.parts = journal.parts_after(&[]);
                reserved = journal.reserve(appended.len());
                let names = reserved.iter().flat_map(|s| s.names());
                for ((writer, seq), record) in names.zip(appended) {
                    records.push((journal_key(&self.key, writer, seq), Some(record.clone())));
                }
                // The journal as it is once this transaction commits.
                meta.journal = journal.segments_after(reserved.as_ref());
            }
        }
        records.push((format!("{}/meta", self.key.id), Some(meta.to_bytes())));
        let committed = self.sink.commit_with(&self.topic, records).await;
        if committed.is_err() {
            // The transaction may have committed all the same (its outcome unknown): the next
            // compaction deletes the parts either outcome left.
            journal.maybe_stored(&written);
        }
        committed.map_err(|e| match e {
            CommitError::Fenced => Error::Fenced {
                watch: self.key.description.clone(),
            },
            CommitError::Aborted => Error::Aborted {
                watch: self.key.description.clone(),
            },
            other => store_err(other),
        })?;
        match plan {
            Plan::Compact => journal.compacted(written, None),
            Plan::Append(appended) => journal.appended(reserved.as_ref(), &appended),
        }
        Ok(())
    }

    async fn reset(&mut self) -> Result<()> {
        // Every record of the watch, whatever its name.
        let prefix = format!("{}/", self.key.id);
        let stored = read_compacted(
            self.sink.consumer_config(),
            &self.topic,
            vec![prefix.clone()],
        )
        .await
        .map_err(store_err)?
        .pop()
        .unwrap_or_default();
        let mut records: Vec<(String, Option<Vec<u8>>)> = (0..BUCKETS)
            .map(|b| (part_key(&self.key, b, 0), None))
            .collect();
        // Journal records and further parts of buckets.
        let (journal, parts) = (format!("{prefix}j/"), format!("{prefix}b/"));
        records.extend(
            stored
                .into_keys()
                .filter(|k| {
                    k.starts_with(&journal)
                        || k.strip_prefix(&parts)
                            .is_some_and(|name| name.contains('.'))
                })
                .map(|k| (k, None)),
        );
        records.push((format!("{}/meta", self.key.id), None));
        self.sink
            .commit_with(&self.topic, records)
            .await
            .map_err(store_err)
    }

    fn finish(&mut self, written: Written, _: &mut Journal) -> Result<()> {
        Err(written.not_staged_here("kafka"))
    }
}

impl KafkaStore {
    async fn load_checkpoint(&self, journal: &mut Journal) -> Result<Option<Found>> {
        let prefix = format!("{}/", self.key.id);
        let started = std::time::Instant::now();
        let config = self.sink.consumer_config();
        let records = self
            .sink
            .checkpoint_reads()
            .read(&prefix, |prefixes| {
                read_compacted(config.clone(), &self.topic, prefixes)
            })
            .await
            .map_err(store_err)?;
        tracing::debug!(topic = %self.topic, records = records.len(), elapsed_ms = started.elapsed().as_millis() as u64, "checkpoint topic read");
        decode(&self.key, self.cluster.as_ref(), &records, journal)
    }
}

/// Records of one transaction: key and value (`None`: a tombstone).
type Records = Vec<(String, Option<Vec<u8>>)>;

fn journal_key(key: &WatchKey, writer: &str, seq: u64) -> String {
    format!("{}/j/{writer}/{seq}", key.id)
}

/// The record of part `part` of bucket `b`.
fn part_key(key: &WatchKey, b: usize, part: usize) -> String {
    match part {
        0 => format!("{}/b/{b}", key.id),
        p => format!("{}/b/{b}.{p}", key.id),
    }
}

/// The records of a compaction: the dirty buckets in parts, tombstones for the parts they no
/// longer need, for the journal and for stray records; and how the buckets are stored once
/// they are written.
pub(super) fn compaction(
    key: &WatchKey,
    known: &mut KnownObjects,
    digests: bool,
    journal: &Journal,
) -> (Records, Vec<(usize, Stored)>) {
    let mut records = Vec::new();
    let mut written = Vec::new();
    for b in known.take_dirty() {
        let parts = known.encode_bucket_parts(b, digests, RECORD_BYTES);
        let stored = Stored {
            bytes: parts.iter().map(Vec::len).sum(),
            parts: parts.len(),
        };
        written.push((b, stored));
        for (p, part) in parts.into_iter().enumerate() {
            records.push((part_key(key, b, p), Some(part)));
        }
        for p in stored.parts..journal.parts(b) {
            records.push((part_key(key, b, p), None));
        }
    }
    for segment in journal.segments() {
        for (writer, seq) in segment.names() {
            records.push((journal_key(key, writer, seq), None));
        }
    }
    // A stray may be a part this compaction writes again: it must stay.
    let writes: std::collections::HashSet<String> =
        records.iter().map(|(k, _)| k.clone()).collect();
    for stray in journal.strays().iter().filter(|k| !writes.contains(*k)) {
        records.push((stray.clone(), None));
    }
    (records, written)
}

/// Decodes the records of one watch (key → last value, keys starting with `{id}/`). Never
/// panics; anything unexpected makes the checkpoint damaged.
pub(super) fn decode(
    key: &WatchKey,
    cluster: Option<&Cluster>,
    records: &HashMap<String, Vec<u8>>,
    journal: &mut Journal,
) -> Result<Option<Found>> {
    let prefix = format!("{}/", key.id);
    let Some(meta) = records.get(&format!("{prefix}meta")) else {
        return Ok(None);
    };
    let meta = match Meta::decode(key, meta) {
        Ok(meta) => meta,
        Err(e) => {
            // Which journal records and parts it named is unknown: the compaction deletes them
            // all (and writes the parts it needs again).
            let (journal_prefix, parts) = (format!("{prefix}j/"), format!("{prefix}b/"));
            let strays = records.keys().filter(|k| {
                k.starts_with(&journal_prefix)
                    || k.strip_prefix(&parts)
                        .is_some_and(|name| name.contains('.'))
            });
            journal.set_strays(strays.cloned().collect());
            return Ok(Some(Found::unreadable(e)));
        }
    };
    meta.check_cluster(key, cluster)?;
    let mut buckets = Parts::new();
    let mut problems = Vec::new();
    let named: Vec<String> = meta
        .journal
        .iter()
        .flat_map(|s| s.names().map(|(w, seq)| format!("{prefix}j/{w}/{seq}")))
        .collect();
    let named_set: std::collections::HashSet<&String> = named.iter().collect();
    let mut strays = Vec::new();
    for (k, v) in records {
        let Some(rest) = k.strip_prefix(&prefix) else {
            continue;
        };
        if rest == "meta" {
            continue;
        }
        if rest.starts_with("j/") {
            // Named ones are replayed below; others belong to no checkpoint (deleted at the
            // next compaction).
            if !named_set.contains(k) {
                strays.push(k.clone());
            }
            continue;
        }
        match rest.strip_prefix("b/").and_then(super::parse_part) {
            Some((b, p)) => {
                buckets.entry(b).or_default().insert(p, &v[..]);
            }
            None => problems.push(format!("record {k:?} is neither meta nor a bucket")),
        }
    }
    let replay = named.iter().map(|k| {
        let name = k[prefix.len() + 2..].to_string();
        (name, records.get(k).map(|v| &v[..]))
    });
    let found = Found::assemble(key, meta, buckets, replay, problems, journal);
    journal.set_strays(strays);
    Ok(Some(found))
}

/// Reads the compacted single-partition `topic` with `read_committed`, up to where it ended when
/// the read began, and returns, for each of `prefixes` (watch ids followed by `/`), the last
/// value of every key starting with it (a tombstone removes its key).
///
/// The end is the partition's high watermark, not the last stable offset a `read_committed`
/// client is told: that one stops at the first transaction still open, so a checkpoint committed
/// after it (by another watch or replica), or one whose commit markers the broker is still
/// writing when `commit_transaction` has returned, would be missed and an older one loaded. So
/// the read waits for the transactions open before the end; one left open by a writer that
/// stopped while committing lasts until the broker aborts it, and is warned about every
/// [`TIMEOUT`] (see [`stalled`]).
async fn read_compacted(
    config: ClientConfig,
    topic: &str,
    prefixes: Vec<String>,
) -> Result<Vec<Latest>, ReadError> {
    let mut config = config;
    config
        .set(
            "group.id",
            format!("kube-event-bridge-checkpoint-{}", std::process::id()),
        )
        // The end of the partition is reported, so the read needs no position request per
        // record (docs/benchmarks.md, "Figures behind defaults").
        .set("enable.partition.eof", "true");
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        // The end is asked for by a client of its own while this one starts reading: each
        // takes a connection's round trips, which then overlap.
        let ends = {
            let (config, topic) = (config.clone(), topic.clone());
            std::thread::spawn(move || end_offset(&config, &topic))
        };
        let consumer: BaseConsumer = config.create()?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, 0, Offset::Beginning)?;
        consumer.assign(&tpl)?;
        let high = ends.join().expect("end offset query")?;
        let mut out = Wanted::new(prefixes);
        if high == 0 {
            return Ok(out.found);
        }
        let started = std::time::Instant::now();
        let mut moved = (0, started);
        loop {
            let at = match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    out.keep_latest(&m);
                    m.offset() + 1
                }
                // At the end, or nothing for a while: the end may be a transaction marker,
                // which is never delivered, so the position tells.
                Some(Err(KafkaError::PartitionEOF(_))) | None => read_to(&consumer, &topic)?,
                Some(Err(e)) => return Err(e.into()),
            };
            if at >= high {
                return Ok(out.found);
            }
            if at > moved.0 {
                moved = (at, std::time::Instant::now());
            } else if moved.1.elapsed() > TIMEOUT {
                // A read_committed client is told the last stable offset.
                let (_, stable) = consumer.fetch_watermarks(&topic, 0, TIMEOUT)?;
                match stalled(at, stable, started.elapsed()) {
                    Stall::Wait => {
                        tracing::warn!(%topic, offset = at, end = high, waited_s = started.elapsed().as_secs(), "loading checkpoints waits for a transaction left open in the checkpoint topic (by a writer stopped while committing) until the broker aborts it (transaction.timeout.ms)");
                        moved.1 = std::time::Instant::now();
                    }
                    Stall::HeldBack => return Err(ReadError::HeldBack { topic, at, high }),
                    Stall::NoProgress => {
                        return Err(KafkaError::MessageConsumption(
                            RDKafkaErrorCode::OperationTimedOut,
                        )
                        .into());
                    }
                }
            }
        }
    })
    .await
    .expect("read task")
}

/// Why a read of the checkpoint topic failed.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// A transaction still open before the end holds `read_committed` readers back.
    #[error(
        "checkpoint topic {topic} read only to offset {at} of {high} in {mins} minutes: a \
         transaction left open there holds back every read_committed reader, and the broker has \
         not aborted it (transaction.timeout.ms)",
        mins = HELD_BACK_LIMIT.as_secs() / 60
    )]
    HeldBack { topic: String, at: i64, high: i64 },
}

/// How long a read waits for a transaction left open in the checkpoint topic: longer than the
/// brokers' default `transaction.max.timeout.ms` (15 minutes), after which the broker has aborted
/// any transaction, plus its check for them (every 10 s by default).
const HELD_BACK_LIMIT: Duration = Duration::from_secs(16 * 60);

/// What a read does when its position stopped moving for [`TIMEOUT`].
#[derive(Debug, PartialEq, Eq)]
enum Stall {
    /// The position is the last stable offset: a transaction still open holds it, and the
    /// broker aborts a transaction left open at its timeout, so wait.
    Wait,
    /// Held back longer than any transaction may stay open.
    HeldBack,
    /// Records below the last stable offset did not arrive: the broker does not answer.
    NoProgress,
}

/// What to do when the position `at` has not moved for [`TIMEOUT`], with `stable` the last
/// stable offset and `waited` since the read began.
fn stalled(at: i64, stable: i64, waited: Duration) -> Stall {
    if stable > at {
        Stall::NoProgress
    } else if waited > HELD_BACK_LIMIT {
        Stall::HeldBack
    } else {
        Stall::Wait
    }
}

/// The offset after the last record of partition 0 of `topic`, committed or not: asked with
/// `read_uncommitted`, since a `read_committed` client is answered the last stable offset.
fn end_offset(config: &ClientConfig, topic: &str) -> Result<i64, KafkaError> {
    let mut config = config.clone();
    config.set("isolation.level", "read_uncommitted");
    let client: BaseConsumer = config.create()?;
    let (_, high) = client.fetch_watermarks(topic, 0, TIMEOUT)?;
    Ok(high)
}

/// The records a read keeps: those of the watches it serves.
struct Wanted {
    /// Prefix → index in `found`.
    index: HashMap<String, usize>,
    found: Vec<Latest>,
}

impl Wanted {
    fn new(prefixes: Vec<String>) -> Self {
        let found = vec![Latest::new(); prefixes.len()];
        let index = prefixes
            .into_iter()
            .enumerate()
            .map(|(i, p)| (p, i))
            .collect();
        Self { index, found }
    }

    /// Records the value of `m` under its key when the key belongs to a watch served (its
    /// prefix is the key up to the first `/`: watch ids have none); a tombstone removes it.
    fn keep_latest(&mut self, m: &BorrowedMessage<'_>) {
        let Some(key) = m.key().map(String::from_utf8_lossy) else {
            return;
        };
        let Some(i) = key
            .find('/')
            .and_then(|slash| self.index.get(&key[..=slash]))
        else {
            return;
        };
        let out = &mut self.found[*i];
        match m.payload() {
            Some(v) => out.insert(key.into_owned(), v.to_vec()),
            None => out.remove(key.as_ref()),
        };
    }
}

/// The consumer's position in partition 0 of `topic` (0 when not known yet).
fn read_to(consumer: &BaseConsumer, topic: &str) -> Result<i64, KafkaError> {
    let position = consumer.position()?;
    let offset = position
        .find_partition(topic, 0)
        .and_then(|p| match p.offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        });
    Ok(offset.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_held_at_the_last_stable_offset_waits_for_the_broker_to_abort_the_transaction() {
        let minute = Duration::from_secs(60);
        assert_eq!(stalled(40, 40, minute), Stall::Wait);
        assert_eq!(stalled(40, 40, 15 * minute), Stall::Wait);
        assert_eq!(
            stalled(40, 40, HELD_BACK_LIMIT + Duration::from_secs(1)),
            Stall::HeldBack,
            "longer than any transaction may stay open"
        );
    }

    #[test]
    fn a_read_stuck_below_the_last_stable_offset_fails() {
        assert_eq!(
            stalled(10, 40, Duration::from_secs(31)),
            Stall::NoProgress,
            "committed records did not arrive: the broker does not answer"
        );
    }

    #[test]
    fn the_held_back_error_names_the_topic_the_offsets_and_the_cause() {
        let e = ReadError::HeldBack {
            topic: "keb.checkpoints".into(),
            at: 40,
            high: 52,
        };
        assert_eq!(
            e.to_string(),
            "checkpoint topic keb.checkpoints read only to offset 40 of 52 in 16 minutes: a \
             transaction left open there holds back every read_committed reader, and the broker \
             has not aborted it (transaction.timeout.ms)"
        );
    }
}
