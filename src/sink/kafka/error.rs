//! The Kafka sink's errors of connecting and preparing its client; they reach the rest of the
//! bridge as [`crate::sink::Error::Setup`].

/// Errors of connecting to or preparing the Kafka sink.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kafka client could not be created.
    #[error("sink.kafka: cannot create the producer")]
    Client(#[source] rdkafka::error::KafkaError),
    /// The Kafka brokers refused the credentials, or the TLS handshake with them failed.
    #[error("{fields}: the brokers at {servers} {what}: {reason}")]
    Refused {
        /// The configuration fields behind the refused setting.
        fields: String,
        /// What failed.
        what: &'static str,
        /// `bootstrap.servers`.
        servers: String,
        /// librdkafka's report, with the broker's reason.
        reason: String,
    },
}

impl From<Error> for crate::sink::Error {
    fn from(e: Error) -> Self {
        crate::sink::Error::Setup(Box::new(e))
    }
}
