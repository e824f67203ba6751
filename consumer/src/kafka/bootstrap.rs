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
        let mut found = Vec::new();
        let mut whole = true;
        for (partition, low, high) in ends {
            let from = (*high - window).max(*low);
            whole &= from == *low;
            found.extend(markers(consumer, topic, *partition, from, *high)?);
        }
        if let Some(start) = bootstrap::start(&found) {
            return Ok(Some(start));
        }
        if whole {
            return Ok(None);
        }
        window = window.saturating_mul(4);
    }
}

/// The markers of `partition` between offsets `from` and `to`.
fn markers(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    from: i64,
    to: i64,
) -> Result<Vec<Found>, KafkaError> {
    let mut found = Vec::new();
    if from >= to {
        return Ok(found);
    }
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(topic, partition, Offset::Offset(from))?;
    consumer.assign(&assignment)?;
    loop {
        match consumer.poll(POLL_TIMEOUT) {
            Some(Ok(message)) => {
                let offset = message.offset();
                // Records that are not the bridge's are skipped here; reading reports them.
                if let Ok(Record::Marker { marker, .. }) = record(topic, &message) {
                    found.push(Found {
                        order: offset,
                        start: message.timestamp().to_millis().unwrap_or_default(),
                        marker: *marker,
                    });
                }
                if offset + 1 >= to {
                    break;
                }
            }
            Some(Err(KafkaError::PartitionEOF(_))) | None => break,
            Some(Err(error)) => return Err(error),
        }
    }
    Ok(found)
}
