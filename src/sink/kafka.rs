//! Kafka: one idempotent producer (`acks=all`), record key = partition key (the object's uid), so
//! every change of an object lands in one partition, in order.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use tracing::warn;

use super::{Delivered, Error, Outcome, Pending, Result, ready};
use crate::config::{ContentMode, KafkaConfig};
use crate::encode::{DATA_CONTENT_TYPE, Event, STRUCTURED_CONTENT_TYPE};
use crate::template::{Template, Values};

/// The Kafka sink.
pub struct KafkaSink {
    producer: FutureProducer,
    topic: Template,
    mode: ContentMode,
    cluster: Arc<str>,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("topic", &self.topic.to_string())
            .finish_non_exhaustive()
    }
}

/// Producer settings the delivery guarantees rest on; user properties cannot weaken them
/// (validated in `config`).
pub fn producer_config(config: &KafkaConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &config.bootstrap_servers)
        .set("client.id", "kube-event-bridge")
        .set("enable.idempotence", "true")
        .set("acks", "all")
        // Never give up on a message: an unreachable broker pauses the watches behind a bounded
        // queue instead of dropping events.
        .set("message.timeout.ms", "0")
        .set("linger.ms", "5");
    for (k, v) in &config.properties {
        c.set(k, v);
    }
    c
}

impl KafkaSink {
    /// Creates the producer (connections are made lazily by librdkafka).
    pub fn new(cluster: &str, config: &KafkaConfig, topic: Template) -> Result<Self> {
        let producer = producer_config(config)
            .create()
            .map_err(Error::KafkaClient)?;
        Ok(Self {
            producer,
            topic,
            mode: config.content_mode,
            cluster: cluster.into(),
        })
    }

    /// The topic for `event`.
    pub fn topic_for(&self, event: &Event) -> String {
        self.topic.render_topic(&Values {
            cluster: &self.cluster,
            group: &event.info.group,
            version: &event.info.version,
            resource: &event.info.resource,
            namespace: event.namespace.as_deref(),
            name: &event.name,
        })
    }

    /// Enqueues `event`; waits while librdkafka's queue is full.
    pub async fn send(&self, event: Event) -> Pending {
        let topic = self.topic_for(&event);
        let structured;
        let (payload, headers) = match self.mode {
            ContentMode::Binary => {
                let mut h = OwnedHeaders::new_with_capacity(20).insert(Header {
                    key: "content-type",
                    value: Some(DATA_CONTENT_TYPE),
                });
                for (name, value) in event.attributes() {
                    h = h.insert(Header {
                        key: &format!("ce_{name}"),
                        value: Some(value),
                    });
                }
                (&event.data[..], h)
            }
            ContentMode::Structured => {
                structured = event.to_structured_json();
                let h = OwnedHeaders::new_with_capacity(1).insert(Header {
                    key: "content-type",
                    value: Some(STRUCTURED_CONTENT_TYPE),
                });
                (&structured[..], h)
            }
        };
        let mut record = FutureRecord::to(&topic)
            .key(&event.uid)
            .payload(payload)
            .headers(headers);
        let delivery = loop {
            match self.producer.send_result(record) {
                Ok(delivery) => break delivery,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((error, _)) => {
                    let outcome = classify(&error);
                    return ready(event, outcome);
                }
            }
        };
        Box::pin(async move {
            let outcome = match delivery.await {
                Ok(Ok(_)) => Outcome::Acked,
                Ok(Err((error, _))) => classify(&error),
                Err(_) => Outcome::Retry {
                    error: "producer dropped the delivery".into(),
                },
            };
            Delivered { event, outcome }
        })
    }

    /// Flushes the producer's queue.
    pub async fn flush(&self, timeout: Duration) {
        let producer = self.producer.clone();
        let flushed = tokio::task::spawn_blocking(move || producer.flush(timeout)).await;
        if let Ok(Err(error)) = flushed {
            warn!(error = %error, "kafka flush incomplete");
        }
    }
}

/// Sorts broker errors into permanent rejections and retries.
pub fn classify(error: &KafkaError) -> Outcome {
    use RDKafkaErrorCode as C;
    let reason = match error.rdkafka_error_code() {
        Some(C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge) => {
            "too_large"
        }
        Some(
            C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::TransactionalIdAuthorizationFailed,
        ) => "not_authorized",
        Some(C::InvalidTopic | C::InvalidRecord | C::InvalidMessage | C::InvalidRequiredAcks) => {
            "invalid"
        }
        _ => {
            return Outcome::Retry {
                error: error.to_string(),
            };
        }
    };
    Outcome::Rejected {
        reason,
        error: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        let too_large = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert!(matches!(
            classify(&too_large),
            Outcome::Rejected {
                reason: "too_large",
                ..
            }
        ));
        let denied = KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed);
        assert!(matches!(
            classify(&denied),
            Outcome::Rejected {
                reason: "not_authorized",
                ..
            }
        ));
        let transient = KafkaError::MessageProduction(RDKafkaErrorCode::NotEnoughReplicas);
        assert!(matches!(classify(&transient), Outcome::Retry { .. }));
    }

    #[test]
    fn user_properties_pass_through_but_guarantees_stay() {
        let cfg = KafkaConfig {
            bootstrap_servers: "127.0.0.1:9092".into(),
            topic: "t".into(),
            content_mode: ContentMode::Binary,
            properties: [("compression.type".to_string(), "zstd".to_string())].into(),
        };
        let c = producer_config(&cfg);
        assert_eq!(c.get("compression.type"), Some("zstd"));
        assert_eq!(c.get("enable.idempotence"), Some("true"));
        assert_eq!(c.get("acks"), Some("all"));
    }
}
