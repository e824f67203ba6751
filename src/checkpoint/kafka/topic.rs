//! The checkpoint topic, prepared at start: created as a compacted topic with one partition, or
//! an existing one checked for both. Brokers that do not answer in time or cannot be reached (a
//! broker restarting, or catching up after a pause) are asked again with backoff, so a replica
//! starting during a broker's recovery waits for it instead of exiting; a topic of the wrong
//! shape, or any other refusal, fails the start at once.

use std::time::{Duration, Instant};

use backon::Retryable;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tracing::warn;

use super::store_err;
use crate::checkpoint::{Error, Result};

/// How long one attempt's admin request or metadata fetch may take.
const ATTEMPT: Duration = Duration::from_secs(15);

/// How long a start keeps asking brokers that time out or cannot be reached before it fails.
const UNREACHABLE_FOR: Duration = Duration::from_secs(120);

/// Creates `topic` as a compacted single-partition topic, or checks that the existing one is
/// (`config`: the client settings of consumers and admin clients). Brokers that time out or
/// cannot be reached are asked again, each failure logged, for up to [`UNREACHABLE_FOR`].
pub async fn ensure_topic(config: ClientConfig, topic: &str) -> Result<()> {
    let started = Instant::now();
    let problem = (|| check(&config, topic))
        .retry(crate::backoff::policy())
        .when(|e| transient(e) && started.elapsed() < UNREACHABLE_FOR)
        .notify(|e, delay| {
            warn!(
                topic,
                error = %e,
                retry_in_ms = delay.as_millis() as u64,
                "kafka brokers did not answer while preparing the checkpoint topic; retrying"
            );
        })
        .await
        .map_err(store_err)?;
    match problem {
        None => Ok(()),
        Some(problem) => Err(Error::Topic {
            topic: topic.into(),
            problem,
        }),
    }
}

/// One attempt: creates the topic, or checks the existing one. `Some(problem)` when it exists
/// with the wrong shape.
async fn check(config: &ClientConfig, topic: &str) -> Result<Option<String>, KafkaError> {
    let admin: AdminClient<DefaultClientContext> = config.create()?;
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(-1)).set("cleanup.policy", "compact");
    let options = AdminOptions::new()
        .request_timeout(Some(ATTEMPT))
        .operation_timeout(Some(ATTEMPT));
    for r in admin.create_topics([&new], &options).await? {
        match r {
            Ok(_) => return Ok(None),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(KafkaError::AdminOp(code)),
        }
    }
    let partitions = partition_count(config.clone(), topic).await?;
    if partitions != 1 {
        return Ok(Some(format!(
            "has {partitions} partitions, checkpoints need exactly 1 (a watch's records must stay \
             in one ordered partition); delete the topic or set checkpoint.kafkaTopic to a new \
             name, and the bridge creates it with 1 partition and cleanup.policy=compact"
        )));
    }
    let described = admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &options)
        .await?;
    let policy = match described.into_iter().next() {
        Some(Ok(resource)) => resource
            .get("cleanup.policy")
            .and_then(|e| e.value.clone())
            .unwrap_or_default(),
        Some(Err(code)) => return Err(KafkaError::AdminOp(code)),
        None => String::new(),
    };
    if policy != "compact" {
        return Ok(Some(format!(
            "cleanup.policy is {policy:?}, checkpoints need \"compact\" (otherwise retention \
             deletes the checkpoints of quiet watches and they list again); fix it with \
             `kafka-configs.sh --alter --entity-type topics --entity-name {topic} --add-config \
             cleanup.policy=compact`"
        )));
    }
    Ok(None)
}

/// Whether a failed attempt only found brokers that did not answer in time, could not be
/// reached, or were still settling (no controller yet; a topic another replica just created
/// not yet in the metadata): worth asking again.
fn transient(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    let code = match e {
        KafkaError::AdminOp(code) | KafkaError::MetadataFetch(code) => Some(*code),
        other => other.rdkafka_error_code(),
    };
    matches!(
        code,
        Some(
            C::OperationTimedOut
                | C::RequestTimedOut
                | C::TimedOutQueue
                | C::BrokerTransportFailure
                | C::AllBrokersDown
                | C::BrokerNotAvailable
                | C::NetworkException
                | C::NotController
                | C::LeaderNotAvailable
                | C::UnknownTopicOrPartition
        )
    )
}

/// The number of partitions of an existing topic.
async fn partition_count(config: ClientConfig, topic: &str) -> Result<usize, KafkaError> {
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create()?;
        let metadata = consumer.fetch_metadata(Some(&topic), ATTEMPT)?;
        let found = metadata.topics().iter().find(|t| t.name() == topic);
        match found {
            Some(t) if t.error().is_none() => Ok(t.partitions().len()),
            Some(t) => Err(KafkaError::MetadataFetch(
                t.error()
                    .map(Into::into)
                    .unwrap_or(RDKafkaErrorCode::Unknown),
            )),
            None => Err(KafkaError::MetadataFetch(
                RDKafkaErrorCode::UnknownTopicOrPartition,
            )),
        }
    })
    .await
    .expect("metadata task")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brokers_that_time_out_or_cannot_be_reached_are_asked_again() {
        use RDKafkaErrorCode as C;
        for code in [
            C::OperationTimedOut,
            C::RequestTimedOut,
            C::AllBrokersDown,
            C::NotController,
        ] {
            assert!(transient(&KafkaError::AdminOp(code)), "{code:?}");
        }
        assert!(transient(&KafkaError::MetadataFetch(
            C::BrokerTransportFailure
        )));
    }

    #[test]
    fn refusals_and_bad_settings_fail_at_once() {
        use RDKafkaErrorCode as C;
        for code in [
            C::TopicAuthorizationFailed,
            C::ClusterAuthorizationFailed,
            C::InvalidReplicationFactor,
            C::PolicyViolation,
            C::InvalidConfig,
        ] {
            assert!(!transient(&KafkaError::AdminOp(code)), "{code:?}");
        }
        let settings = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:9")
            .set("no.such.property", "1")
            .create::<AdminClient<DefaultClientContext>>()
            .expect_err("an unknown property is refused");
        assert!(!transient(&settings), "{settings}");
    }
}
