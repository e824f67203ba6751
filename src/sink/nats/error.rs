//! The NATS sink's errors of connecting and preparing its client; they reach the rest of the
//! bridge as [`crate::sink::Error::Setup`].

/// Errors of connecting to or preparing the NATS sink.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The NATS client could not load `sink.nats.credentials.credsFile`.
    #[error("sink.nats.credentials.{field}: cannot read {path}")]
    Credential {
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
    Connect {
        /// The URL (without credentials).
        url: String,
        /// The cause.
        #[source]
        source: async_nats::ConnectError,
    },
    /// The NATS server refused the credentials, or the TLS handshake with it failed.
    #[error("{field}: the server at {url} {what}: {reason}")]
    Refused {
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
    Stream {
        /// What went wrong.
        message: String,
    },
}

impl From<Error> for crate::sink::Error {
    fn from(e: Error) -> Self {
        crate::sink::Error::Setup(Box::new(e))
    }
}
