//! The NATS client's settings from the validated `sink.nats` section: credentials read from
//! their files, TLS, and errors of a refused connection that name the field behind them.

use std::time::Duration;

use backon::Retryable;

use tracing::{info, warn};

use super::error::Error as SetupError;
use crate::config::NatsCredentials;
use crate::secret::redact_url;
use crate::sink::Result;

/// The secret in the file of `sink.nats.credentials.<field>` (also a checkpoint store's own
/// credentials, which share the type).
fn read_secret(field: &str, path: &std::path::Path) -> Result<String> {
    Ok(crate::secret::read(
        &format!("sink.nats.credentials.{field}"),
        path,
    )?)
}

pub(super) async fn connect_options(c: &NatsCredentials) -> Result<async_nats::ConnectOptions> {
    let mut o = async_nats::ConnectOptions::new()
        .name("kube-event-bridge")
        .connection_timeout(Duration::from_secs(10))
        .event_callback(|event| async move {
            match event {
                async_nats::Event::Connected => info!("nats connected"),
                async_nats::Event::Disconnected => warn!("nats disconnected"),
                other => info!(event = %other, "nats connection event"),
            }
        });
    if let (Some(user), Some(path)) = (&c.user, &c.password_file) {
        o = o.user_and_password(user.clone(), read_secret("passwordFile", path)?);
    }
    if let Some(path) = &c.token_file {
        o = o.token(read_secret("tokenFile", path)?);
    }
    if let Some(path) = &c.nkey_seed_file {
        o = o.nkey(read_secret("nkeySeedFile", path)?);
    }
    if let Some(path) = &c.creds_file {
        o = o
            .credentials_file(path)
            .await
            .map_err(|source| SetupError::Credential {
                field: "credsFile",
                path: path.display().to_string(),
                source,
            })?;
    }
    if let Some(ca) = &c.tls_ca_file {
        o = o.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let (Some(cert), Some(key)) = (&c.tls_cert_file, &c.tls_key_file) {
        o = o
            .add_client_certificate(cert.clone(), key.clone())
            .require_tls(true);
    }
    Ok(o)
}

/// A client of the NATS server at `url` with `credentials` (the sink's, or a checkpoint store's
/// of its own). A server that cannot be reached (refused, timed out) is tried again with backoff
/// for up to [`UNREACHABLE_FOR`], so a start during a broker's restart does not fail; refused
/// credentials and TLS failures fail at once, naming the field.
pub async fn connect_client(
    url: &str,
    credentials: &NatsCredentials,
) -> Result<async_nats::Client> {
    let options = connect_options(credentials).await?;
    let started = std::time::Instant::now();
    (|| options.clone().connect(url))
        .retry(crate::backoff::policy())
        .when(|source| unreachable(source) && started.elapsed() < UNREACHABLE_FOR)
        .notify(|source, delay| {
            warn!(url = %redact_url(url), error = %source, retry_in_ms = delay.as_millis() as u64, "cannot reach the nats server; retrying");
        })
        .await
        .map_err(|source| connect_error(credentials, url, source).into())
}

/// How long a start waits for an unreachable NATS server before it fails.
const UNREACHABLE_FOR: Duration = Duration::from_secs(30);

/// Whether a failed connection only found no server (it may be restarting).
fn unreachable(e: &async_nats::ConnectError) -> bool {
    use async_nats::ConnectErrorKind as Kind;
    matches!(e.kind(), Kind::TimedOut) || (matches!(e.kind(), Kind::Io) && !is_tls_failure(e))
}

/// The error for a failed connection: a refused credential or a failed TLS handshake names the
/// field behind it; anything else is a plain connection failure.
pub(super) fn connect_error(
    c: &NatsCredentials,
    url: &str,
    source: async_nats::ConnectError,
) -> SetupError {
    use async_nats::ConnectErrorKind as Kind;
    let url = redact_url(url);
    let (field, what) = match source.kind() {
        Kind::AuthorizationViolation | Kind::Authentication => {
            (credential_field(c), "refused the credentials")
        }
        Kind::Tls => (tls_field(c), "could not complete the TLS setup"),
        Kind::Io if is_tls_failure(&source) => {
            (tls_field(c), "could not complete the TLS handshake")
        }
        _ => return SetupError::Connect { url, source },
    };
    SetupError::Refused {
        field: field.into(),
        url,
        what,
        reason: source.to_string(),
    }
}

/// The credential the client presented, as its configuration path.
fn credential_field(c: &NatsCredentials) -> &'static str {
    if c.creds_file.is_some() {
        "sink.nats.credentials.credsFile"
    } else if c.nkey_seed_file.is_some() {
        "sink.nats.credentials.nkeySeedFile"
    } else if c.token_file.is_some() {
        "sink.nats.credentials.tokenFile"
    } else if c.password_file.is_some() {
        "sink.nats.credentials.passwordFile"
    } else {
        // None configured (or a `user:password@` in the URL).
        "sink.nats.credentials"
    }
}

/// The setting TLS verification rests on, as its configuration path.
fn tls_field(c: &NatsCredentials) -> &'static str {
    if c.tls_ca_file.is_some() {
        "sink.nats.credentials.tlsCaFile"
    } else {
        "sink.nats.credentials.tlsCaFile (unset: the system's roots)"
    }
}

/// Whether `error` comes from the TLS library (a certificate not verified, a protocol mismatch).
fn is_tls_failure(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.is::<async_nats::rustls::Error>()
            || e.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .is_some_and(|inner| inner.is::<async_nats::rustls::Error>())
        {
            return true;
        }
        cause = e.source();
    }
    false
}
