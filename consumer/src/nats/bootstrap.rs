//! Bootstrapping a stream: looking back from its last message for the latest completed snapshot
//! on demand, through windows of stream sequences growing until one is found or the first
//! message is reached.

use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::pull::OrderedConfig;
use async_nats::jetstream::stream::Stream;
use futures::StreamExt;

use super::decode;
use crate::bootstrap::{self, Found};
use crate::event::Record;

/// How many stream sequences the first look back covers; each next one four times as many.
const FIRST_WINDOW: u64 = 1_000;
/// How long to wait for the next message of a window.
const NEXT_TIMEOUT: Duration = Duration::from_secs(10);

/// The stream sequence of the begin marker to start at, among `subjects` (every subject when
/// empty) up to `last` (the stream's last sequence at start); `None` without one.
pub(super) async fn start(
    stream: &Stream,
    subjects: &[String],
    last: u64,
) -> Result<Option<u64>, async_nats::Error> {
    let mut window = FIRST_WINDOW;
    loop {
        let from = last.saturating_sub(window).max(1);
        let found = markers(stream, subjects, from, last).await?;
        if let Some(start) = bootstrap::start(&found) {
            return Ok(u64::try_from(start).ok());
        }
        if from == 1 {
            tracing::warn!(
                "no completed snapshot with its begin marker: reading from the first message"
            );
            return Ok(None);
        }
        window = window.saturating_mul(4);
    }
}

/// The markers of `subjects` from stream sequence `from` to `to`.
async fn markers(
    stream: &Stream,
    subjects: &[String],
    from: u64,
    to: u64,
) -> Result<Vec<Found>, async_nats::Error> {
    let mut found = Vec::new();
    if from > to {
        return Ok(found);
    }
    let consumer = stream
        .create_consumer(OrderedConfig {
            filter_subjects: subjects.to_vec(),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: from,
            },
            ..OrderedConfig::default()
        })
        .await?;
    if consumer.cached_info().num_pending == 0 {
        return Ok(found);
    }
    let mut messages = consumer.messages().await?;
    while let Ok(Some(message)) = tokio::time::timeout(NEXT_TIMEOUT, messages.next()).await {
        let message = message?;
        let (sequence, pending) = message
            .info()
            .map_or((0, 0), |i| (i.stream_sequence, i.pending));
        // Messages that are not the bridge's are skipped here; reading reports them.
        if let Ok(Record::Marker { marker, .. }) = decode("", sequence, &message.message) {
            let order = i64::try_from(sequence).unwrap_or(i64::MAX);
            found.push(Found {
                order,
                start: order,
                marker: *marker,
            });
        }
        if pending == 0 || sequence >= to {
            break;
        }
    }
    Ok(found)
}
