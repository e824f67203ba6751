//! Bootstrapping a topic: looking back from its end for the latest completed snapshot on demand
//! (windows of offsets growing until one is found or the beginning is reached), then the offset
//! of every partition at its begin marker's timestamp.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::{CLOCK_MARGIN_MS, Error, METADATA_TIMEOUT, Result, record};
use crate::bootstrap::{self, Found};
use crate::event::Record;

/// How many records per partition the first look back reads; each next one reads four times
/// as many.
const FIRST_WINDOW: i64 = 1_000;
/// How long one poll may wait for a record of a window.
const POLL_TIMEOUT: Duration = Duration::from_secs(10);

/// Partition → the offset to start at: every partition at the begin marker of the latest
/// completed snapshot, or its first retained offset when there is none. `ends` are (partition,
/// first offset, end offset) of every partition.
pub(super) fn starts(
    config: &ClientConfig,
    topic: &str,
    ends: &[(i32, i64, i64)],
) -> Result<HashMap<i32, i64>> {
    let failed = |source| Error::Bootstrap {
        topic: topic.into(),
        source,
    };
    let consumer: BaseConsumer = config.create().map_err(failed)?;
    let Some(timestamp) = latest_snapshot(&consumer, topic, ends).map_err(failed)? else {
        tracing::warn!(
            topic,
            "no completed snapshot with its begin marker: reading from the beginning"
        );
        return Ok(ends.iter().map(|(p, low, _)| (*p, *low)).collect());
    };
    let mut wanted = TopicPartitionList::new();
    for (partition, _, _) in ends {
        wanted
            .add_partition_offset(
                topic,
                *partition,
                Offset::Offset(timestamp - CLOCK_MARGIN_MS),
            )
            .map_err(failed)?;
    }
    let found = consumer
        .offsets_for_times(wanted, METADATA_TIMEOUT)
        .map_err(failed)?;
    let starts = ends
        .iter()
        .map(|(partition, low, high)| {
            let offset = match found.find_partition(topic, *partition).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o.max(*low),
                // No record at or after the timestamp: nothing of it to read.
                _ => *high,
            };
            (*partition, offset)
        })
        .collect();
    tracing::debug!(
        topic,
        timestamp,
        ?starts,
        "bootstrapping from a completed snapshot"
    );
    Ok(starts)
}

/// The timestamp of the begin marker to start at, looking back through ever larger windows.
fn latest_snapshot(
    consumer: &BaseConsumer,
    topic: &str,
    ends: &[(i32, i64, i64)],
) -> Result<Option<i64>, KafkaError> {
    let mut window = FIRST_WINDOW;
    loop {
        let ranges: Vec<(i32, i64, i64)> = ends
            .iter()
            .map(|(partition, low, high)| (*partition, (*high - window).max(*low), *high))
            .collect();
        let whole = ranges
            .iter()
            .zip(ends)
            .all(|((_, from, _), (_, low, _))| from == low);
        let found = markers(consumer, topic, &ranges)?;
        if let Some(start) = bootstrap::start(&found) {
            return Ok(Some(start));
        }
        if whole {
            return Ok(None);
        }
        window = window.saturating_mul(4);
    }
}

/// The markers between offsets `from` and `to` of every `(partition, from, to)` in `ranges`,
/// read under one assignment. A partition is done at its `to`, or when the client reports its
/// end (a `read_committed` end before `to`, or transaction markers at the end). Events of
/// partitions not in `ranges`, or already done, are ignored: an end-of-partition report from an
/// earlier assignment must never end the reading of another partition.
fn markers(
    consumer: &BaseConsumer,
    topic: &str,
    ranges: &[(i32, i64, i64)],
) -> Result<Vec<Found>, KafkaError> {
    let mut found = Vec::new();
    let mut assignment = TopicPartitionList::new();
    let mut open: HashMap<i32, i64> = HashMap::new();
    for (partition, from, to) in ranges.iter().filter(|(_, from, to)| from < to) {
        assignment.add_partition_offset(topic, *partition, Offset::Offset(*from))?;
        open.insert(*partition, *to);
    }
    if open.is_empty() {
        return Ok(found);
    }
    consumer.assign(&assignment)?;
    while !open.is_empty() {
        match consumer.poll(POLL_TIMEOUT) {
            Some(Ok(message)) => {
                let (partition, offset) = (message.partition(), message.offset());
                let Some(&to) = open.get(&partition) else {
                    continue;
                };
                // Records that are not the bridge's are skipped here; reading reports them.
                if offset < to
                    && let Ok(Record::Marker { marker, .. }) = record(topic, &message)
                {
                    // A watch's markers are keyed by their own ids, so spread over the
                    // partitions: their offsets do not order them, their timestamps do.
                    let start = message.timestamp().to_millis().unwrap_or_default();
                    found.push(Found {
                        order: start,
                        start,
                        marker: *marker,
                    });
                }
                if offset + 1 >= to {
                    open.remove(&partition);
                }
            }
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                open.remove(&partition);
            }
            Some(Err(error)) => return Err(error),
            None => {
                tracing::warn!(
                    topic,
                    partitions = ?open.keys().collect::<Vec<_>>(),
                    "no record nor end of partition within {POLL_TIMEOUT:?} while looking for \
                     snapshot markers: these partitions count as read"
                );
                break;
            }
        }
    }
    consumer.unassign()?;
    Ok(found)
}
