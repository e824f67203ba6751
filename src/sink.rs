//! Where events go. Every sink has the same shape: `send` hands one event to the broker client in
//! order and returns a [`Pending`] acknowledgement; the pipeline awaits acknowledgements in order,
//! so progress only moves past events the broker has accepted.
//!
//! Broker errors are sorted into [`Outcome::Retry`] (the event is sent again, nothing is lost) and
//! [`Outcome::Rejected`] (the broker refuses it for good: logged with the object's reference,
//! counted, and skipped so it never blocks the objects behind it) in one place per sink.

pub mod kafka;
pub mod nats;
pub mod stdout;

use std::time::Duration;

use futures::future::BoxFuture;

use crate::config;
use crate::encode::Event;

/// Errors of connecting to or preparing a sink.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kafka client could not be created.
    #[error("sink.kafka: cannot create the producer")]
    KafkaClient(#[source] rdkafka::error::KafkaError),
    /// A file of `sink.kafka.propertyFiles` could not be read.
    #[error("sink.kafka.propertyFiles.{key}: cannot read {path}")]
    KafkaPropertyFile {
        /// The librdkafka property.
        key: String,
        /// The path.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The Kafka brokers refused the credentials, or the TLS handshake with them failed.
    #[error("{fields}: the brokers at {servers} {what}: {reason}")]
    KafkaRefused {
        /// The configuration fields behind the refused setting.
        fields: String,
        /// What failed.
        what: &'static str,
        /// `bootstrap.servers`.
        servers: String,
        /// librdkafka's report, with the broker's reason.
        reason: String,
    },
    /// A NATS credential file could not be read.
    #[error("sink.nats.credentials.{field}: cannot read {path}")]
    NatsCredential {
        /// The field naming the file.
        field: &'static str,
        /// The path.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The NATS server could not be reached.
    #[error("sink.nats.url: cannot connect to {url}")]
    NatsConnect {
        /// The URL (without credentials).
        url: String,
        /// The cause.
        #[source]
        source: async_nats::ConnectError,
    },
    /// The NATS server refused the credentials, or the TLS handshake with it failed.
    #[error("{field}: the server at {url} {what}: {reason}")]
    NatsRefused {
        /// The configuration field behind the refused setting.
        field: String,
        /// The URL (without credentials).
        url: String,
        /// What failed.
        what: &'static str,
        /// The client's report, with the server's reason.
        reason: String,
    },
    /// The JetStream stream is missing or could not be created.
    #[error("sink.nats.jetstream.stream: {message}")]
    NatsStream {
        /// What went wrong.
        message: String,
    },
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the broker said about one event.
#[derive(Debug)]
pub enum Outcome {
    /// Stored by the broker.
    Acked,
    /// Refused for good; `reason` is a closed-set label (`too_large`, `not_authorized`, ...).
    Rejected {
        /// Closed-set label for logs and metrics.
        reason: &'static str,
        /// The broker's message.
        error: String,
    },
    /// Refused for a reason that holds for every event of the destination until an operator
    /// fixes it (authorization, a missing or invalid topic): skipping would lose data, so the
    /// event is sent again after a pause and the watch reports itself stalled meanwhile.
    Blocked {
        /// Closed-set label for logs, metrics and readiness (`not_authorized`, ...).
        reason: &'static str,
        /// The broker's message.
        error: String,
    },
    /// The producer can never publish again (fenced by a newer instance): the watch must stop.
    Fatal {
        /// The broker's message.
        error: String,
    },
    /// Not stored: the transaction it was sent in was aborted, because another event of it
    /// failed. Sent again at once in the next transaction; not a failure of its own.
    Aborted,
    /// Not stored this time; sending again is safe (the id deduplicates).
    Retry {
        /// The broker's message.
        error: String,
    },
}

/// An event with its outcome.
#[derive(Debug)]
pub struct Delivered {
    /// The event, returned so a retry can send it again.
    pub event: Event,
    /// The outcome.
    pub outcome: Outcome,
}

/// An acknowledgement still to come.
pub type Pending = BoxFuture<'static, Delivered>;

fn ready(event: Event, outcome: Outcome) -> Pending {
    Box::pin(std::future::ready(Delivered { event, outcome }))
}

/// The sinks this bridge knows.
#[derive(Debug)]
#[expect(clippy::large_enum_variant, reason = "one value per process")]
pub enum AnySink {
    /// Apache Kafka.
    Kafka(std::sync::Arc<kafka::KafkaSink>),
    /// NATS, JetStream or core.
    Nats(nats::NatsSink),
    /// JSON lines on standard output.
    Stdout(stdout::StdoutSink),
}

impl AnySink {
    /// Connects to the configured sink. The JetStream stream is prepared per resource, when its
    /// watches start ([`nats::NatsSink::cover`]).
    pub async fn connect(sink: &config::Sink) -> Result<Self> {
        Ok(match sink {
            config::Sink::Kafka { config, topic } => {
                kafka::check_brokers(config).await?;
                AnySink::Kafka(std::sync::Arc::new(kafka::KafkaSink::new(
                    config,
                    topic.clone(),
                )?))
            }
            config::Sink::Nats { config, subject } => {
                AnySink::Nats(nats::NatsSink::connect(config, subject.clone()).await?)
            }
            config::Sink::Stdout => AnySink::Stdout(stdout::StdoutSink::new()),
        })
    }

    /// A short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            AnySink::Kafka(_) => "kafka",
            AnySink::Nats(_) => "nats",
            AnySink::Stdout(_) => "stdout",
        }
    }

    /// Hands `event` to the broker client. Called in order; the returned acknowledgements may be
    /// awaited concurrently.
    pub async fn send(&self, event: Event) -> Pending {
        match self {
            AnySink::Kafka(s) => s.send(event).await,
            AnySink::Nats(s) => s.send(event).await,
            AnySink::Stdout(s) => s.send(event),
        }
    }

    /// Publishes one out-of-band message (a heartbeat) to `destination` and waits for it to be
    /// handed over (Kafka: acknowledged within the open transaction; NATS: core publish, flushed).
    pub async fn send_raw(
        &self,
        destination: &str,
        key: &str,
        payload: Vec<u8>,
    ) -> Result<(), String> {
        match self {
            AnySink::Kafka(s) => s.send_raw(destination, key, &payload).await,
            AnySink::Nats(s) => s.send_raw(destination, payload).await,
            AnySink::Stdout(_) => {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                out.write_all(&payload)
                    .and_then(|()| out.write_all(b"\n"))
                    .and_then(|()| out.flush())
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// The transactional Kafka producer, when events are committed in transactions with the
    /// checkpoint: a failed delivery then voids the whole open transaction.
    pub fn transactional(&self) -> Option<&kafka::KafkaSink> {
        match self {
            AnySink::Kafka(s) if s.is_transactional() => Some(s),
            _ => None,
        }
    }

    /// Whether two events of one object may be awaiting acknowledgement at once without risking
    /// their order. Kafka's idempotent producer keeps order within a partition across its own
    /// retries; a JetStream publish that is retried could land after a later one.
    pub fn ordered_in_flight(&self) -> bool {
        !matches!(self, AnySink::Nats(_))
    }

    /// Waits until everything handed over is acknowledged, or `timeout`.
    pub async fn flush(&self, timeout: Duration) {
        match self {
            AnySink::Kafka(s) => s.flush(timeout).await,
            AnySink::Nats(s) => s.flush(timeout).await,
            AnySink::Stdout(s) => s.flush(),
        }
    }
}
