//! The HTTP sink's errors of connecting and preparing its client; they reach the rest of the
//! bridge as [`crate::sink::Error::Setup`].

/// Errors of connecting to or preparing the HTTP sink.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The HTTP client could not be created.
    #[error("sink.http: cannot create the HTTP client")]
    Client(#[source] reqwest::Error),
    /// A file of `sink.http.credentials` could not be read.
    #[error("sink.http.credentials.{field}: cannot read {path}")]
    File {
        /// The field naming the file.
        field: &'static str,
        /// The path.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file of `sink.http.credentials` holds no usable certificate or key.
    #[error("sink.http.credentials.{field}: {path}: {reason}")]
    Tls {
        /// The field naming the file.
        field: &'static str,
        /// The path.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Knative's `K_CA_CERTS` holds no usable CA certificate.
    #[error("K_CA_CERTS: {reason}")]
    KnativeCaCerts {
        /// What is wrong with it.
        reason: String,
    },
    /// An extension name cannot be an HTTP header name.
    #[error("sink.http.extensions.{name}: not usable as a ce- header name")]
    Extension {
        /// The extension.
        name: String,
    },
}

impl From<Error> for crate::sink::Error {
    fn from(e: Error) -> Self {
        crate::sink::Error::Setup(Box::new(e))
    }
}
