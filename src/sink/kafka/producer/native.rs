//! The one call of librdkafka the rdkafka crate does not offer: `rd_kafka_flush` with a timeout.
//!
//! The crate's `Producer::flush` calls `rd_kafka_flush` with a zero timeout and, while anything
//! is queued, polls the producer's queue itself for up to 100 ms at a time. Here that queue is
//! polled by the producer's own thread ([`super::Producer`]), so such a poll sleeps out its
//! 100 ms whenever that thread serves the last delivery report first; and a zero-timeout
//! `rd_kafka_flush` lifts `linger.ms` only for the instant it runs. Called with the timeout,
//! librdkafka waits until every record is delivered and its report served (the crate takes
//! reports as events), sending at once meanwhile: `linger.ms` is ignored while a flush runs.
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

use rdkafka::bindings::{rd_kafka_flush, rd_kafka_resp_err_t};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::producer::{BaseProducer, Producer as _};

use super::Reports;

/// Waits (blocking) until everything handed to `producer` is delivered or failed and its report
/// served, at most `timeout`; `KafkaError::Flush(OperationTimedOut)` if that time passed first.
pub(super) fn flush(producer: &BaseProducer<Reports>, timeout: Duration) -> KafkaResult<()> {
    let millis = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: the pointer is the live client that `producer` owns, and `producer` is borrowed
    // for the whole call, so librdkafka cannot destroy it meanwhile; `rd_kafka_flush` may be
    // called from any thread at the same time as the polling thread's `rd_kafka_queue_poll`.
    let code = unsafe { rd_kafka_flush(producer.client().native_ptr(), millis) };
    match code {
        rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR => Ok(()),
        e => Err(KafkaError::Flush(e.into())),
    }
}

/// Flushes, then commits the open transaction, both within `timeout`. After the flush nothing is
/// queued, so the crate's own flush before `rd_kafka_commit_transaction` returns at once.
pub(super) fn commit_transaction(
    producer: &BaseProducer<Reports>,
    timeout: Duration,
) -> KafkaResult<()> {
    let started = Instant::now();
    flush(producer, timeout)?;
    producer.commit_transaction(timeout.saturating_sub(started.elapsed()))
}
