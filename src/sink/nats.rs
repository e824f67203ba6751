//! NATS: JetStream publishes wait for the stream's acknowledgement and carry `Nats-Msg-Id` = event
//! id, so the server drops a duplicate within its window. Core NATS (no `jetstream` section) is
//! fire-and-forget: at most once.

use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind, stream};
use async_nats::{HeaderMap, HeaderValue};
use bytes::Bytes;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use tracing::{info, warn};

use super::{Delivered, Error, Outcome, Pending, Result, ready};
use crate::config::{ContentMode, NatsConfig, NatsCredentials};
use crate::discovery::ResolvedResource;
use crate::encode::{DATA_CONTENT_TYPE, Event, STRUCTURED_CONTENT_TYPE};
use crate::template::Template;

/// Characters percent-encoded in `ce-` header values (the NATS binding asks for percent-encoding;
/// header values must not carry control characters or `%` unescaped).
const HEADER_VALUE: &AsciiSet = &CONTROLS.add(b'%').add(b'"').add(b' ');

/// The NATS sink.
#[derive(Debug)]
pub struct NatsSink {
    client: async_nats::Client,
    jetstream: Option<jetstream::Context>,
    stream: Option<StreamSettings>,
    subject: Template,
    mode: ContentMode,
}

/// What is needed to extend the stream for resources discovered later.
#[derive(Debug, Clone)]
struct StreamSettings {
    name: String,
    create: bool,
    duplicate_window: Duration,
}

async fn read_secret(field: &'static str, path: &std::path::Path) -> Result<String> {
    tokio::fs::read_to_string(path)
        .await
        .map(|s| s.trim().to_string())
        .map_err(|source| Error::NatsCredential {
            field,
            path: path.display().to_string(),
            source,
        })
}

async fn connect_options(c: &NatsCredentials) -> Result<async_nats::ConnectOptions> {
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
        o = o.user_and_password(user.clone(), read_secret("passwordFile", path).await?);
    }
    if let Some(path) = &c.token_file {
        o = o.token(read_secret("tokenFile", path).await?);
    }
    if let Some(path) = &c.nkey_seed_file {
        o = o.nkey(read_secret("nkeySeedFile", path).await?);
    }
    if let Some(path) = &c.creds_file {
        o = o
            .credentials_file(path)
            .await
            .map_err(|source| Error::NatsCredential {
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

impl NatsSink {
    /// Connects; [`NatsSink::cover`] then prepares the JetStream stream for each resource.
    pub async fn connect(config: &NatsConfig, subject: Template) -> Result<Self> {
        let options = connect_options(&config.credentials).await?;
        let client = options
            .connect(config.url.as_str())
            .await
            .map_err(|source| connect_error(&config.credentials, &config.url, source))?;
        let jetstream = match &config.jetstream {
            None => None,
            Some(js) => {
                let mut ctx = jetstream::new(client.clone());
                ctx.set_timeout(Duration::from_secs(js.ack_timeout_secs));
                Some(ctx)
            }
        };
        let sink = Self {
            client,
            jetstream,
            stream: config.jetstream.as_ref().map(|js| StreamSettings {
                name: js.stream.clone(),
                create: js.create,
                duplicate_window: Duration::from_secs(js.duplicate_window_secs),
            }),
            subject,
            mode: config.content_mode,
        };
        Ok(sink)
    }

    /// Makes sure the JetStream stream captures the subjects of `resources` (creating or
    /// extending it when `create` is set); for resources discovered while running as well.
    pub async fn cover(&self, cluster: &str, resources: &[ResolvedResource]) -> Result<()> {
        let (Some(ctx), Some(stream)) = (&self.jetstream, &self.stream) else {
            return Ok(());
        };
        let mut subjects: Vec<String> = resources
            .iter()
            .map(|r| {
                r.destination(&self.subject)
                    .subject_filter(&r.template_values(cluster))
            })
            .collect();
        subjects.sort();
        subjects.dedup();
        ensure_stream(ctx, stream, subjects).await
    }

    /// The JetStream context, if publishing to JetStream.
    pub fn jetstream(&self) -> Option<&jetstream::Context> {
        self.jetstream.as_ref()
    }

    /// The subject for `event`.
    pub fn subject_for(&self, event: &Event) -> String {
        event
            .info
            .destination
            .as_ref()
            .unwrap_or(&self.subject)
            .render_subject(&event.template_values())
    }

    /// Publishes `event`; for JetStream the returned future resolves on the stream's ack.
    pub async fn send(&self, event: Event) -> Pending {
        let subject = self.subject_for(&event);
        let (headers, payload) = message(&event, self.mode, self.jetstream.is_some());
        // Headers travel inside max_payload too; percent-encoding rarely grows them.
        let size = payload.len()
            + 64
            + event
                .attributes()
                .map(|(k, v)| k.len() + v.len() + 8)
                .sum::<usize>();
        let max = self.client.server_info().max_payload;
        if max > 0 && size > max {
            let error =
                format!("message of {size} bytes exceeds the server's max_payload of {max} bytes");
            return ready(
                event,
                Outcome::Rejected {
                    reason: "too_large",
                    error,
                },
            );
        }
        let Some(js) = &self.jetstream else {
            let outcome = match self
                .client
                .publish_with_headers(subject, headers, payload)
                .await
            {
                Ok(()) => Outcome::Acked,
                Err(e) => Outcome::Retry {
                    error: e.to_string(),
                },
            };
            return ready(event, outcome);
        };
        match js.publish_with_headers(subject, headers, payload).await {
            Ok(ack) => Box::pin(async move {
                let outcome = match ack.await {
                    Ok(_) => Outcome::Acked,
                    Err(e) => classify(&e),
                };
                Delivered { event, outcome }
            }),
            Err(e) => ready(event, classify(&e)),
        }
    }

    /// Publishes one structured CloudEvent on core NATS and flushes.
    pub async fn send_raw(&self, subject: &str, payload: Vec<u8>) -> Result<(), String> {
        let mut headers = HeaderMap::new();
        headers.insert("Content-Type", STRUCTURED_CONTENT_TYPE);
        self.client
            .publish_with_headers(subject.to_string(), headers, payload.into())
            .await
            .map_err(|e| e.to_string())?;
        self.client.flush().await.map_err(|e| e.to_string())
    }

    /// Flushes the client's buffer.
    pub async fn flush(&self, timeout: Duration) {
        if tokio::time::timeout(timeout, self.client.flush())
            .await
            .is_err()
        {
            warn!("nats flush timed out");
        }
    }
}

/// Builds headers and body for one event.
pub fn message(event: &Event, mode: ContentMode, jetstream: bool) -> (HeaderMap, Bytes) {
    let mut headers = HeaderMap::new();
    if jetstream {
        headers.insert("Nats-Msg-Id", event.id.as_str());
    }
    let payload = match mode {
        ContentMode::Binary => {
            headers.insert("Content-Type", DATA_CONTENT_TYPE);
            for (name, value) in event.attributes() {
                let encoded: HeaderValue = utf8_percent_encode(value, HEADER_VALUE)
                    .to_string()
                    .as_str()
                    .into();
                headers.insert(format!("ce-{name}").as_str(), encoded);
            }
            Bytes::copy_from_slice(&event.data)
        }
        ContentMode::Structured => {
            headers.insert("Content-Type", STRUCTURED_CONTENT_TYPE);
            Bytes::from(event.to_structured_json())
        }
    };
    (headers, payload)
}

/// Sorts publish errors into permanent rejections and retries.
pub fn classify(error: &jetstream::context::PublishError) -> Outcome {
    use std::error::Error as _;
    let api_code = error
        .source()
        .and_then(|s| s.downcast_ref::<jetstream::Error>())
        .map(|e| e.error_code());
    let reason = match (error.kind(), api_code) {
        (PublishErrorKind::MaxPayloadExceeded, _) => "too_large",
        (_, Some(c))
            if c == jetstream::ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM
                || c == jetstream::ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM =>
        {
            "too_large"
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

/// Whether a stream subject `pattern` captures every subject of `filter` (both may use `*` for
/// one token and a final `>` for one or more).
pub fn captures(pattern: &str, filter: &str) -> bool {
    let mut p = pattern.split('.');
    let mut f = filter.split('.');
    loop {
        match (p.next(), f.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(t)) if t != ">" => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

async fn ensure_stream(
    ctx: &jetstream::Context,
    settings: &StreamSettings,
    subjects: Vec<String>,
) -> Result<()> {
    let StreamSettings {
        name,
        create,
        duplicate_window,
    } = settings;
    let (name, create, duplicate_window) = (name.as_str(), *create, *duplicate_window);
    match ctx.get_stream(name).await {
        Ok(mut existing) => {
            let info = existing.info().await.map_err(|e| Error::NatsStream {
                message: format!("cannot read stream {name}: {e}"),
            })?;
            let missing: Vec<&String> = subjects
                .iter()
                .filter(|s| !info.config.subjects.iter().any(|p| captures(p, s)))
                .collect();
            if !missing.is_empty() {
                if !create {
                    return Err(Error::NatsStream {
                        message: format!(
                            "stream {name} does not capture subjects {missing:?}; add them or set create: true"
                        ),
                    });
                }
                let mut config = info.config.clone();
                config.subjects.extend(missing.into_iter().cloned());
                ctx.update_stream(config)
                    .await
                    .map_err(|e| Error::NatsStream {
                        message: format!("cannot extend stream {name}: {e}"),
                    })?;
                info!(stream = name, "extended stream subjects");
            }
            Ok(())
        }
        Err(_) if create => {
            ctx.create_stream(stream::Config {
                name: name.to_string(),
                subjects,
                duplicate_window,
                ..Default::default()
            })
            .await
            .map_err(|e| Error::NatsStream {
                message: format!("cannot create stream {name}: {e}"),
            })?;
            info!(stream = name, "created stream");
            Ok(())
        }
        Err(e) => Err(Error::NatsStream {
            message: format!("stream {name} is not available and create is false: {e}"),
        }),
    }
}

/// The error for a failed connection: a refused credential or a failed TLS handshake names the
/// field behind it; anything else is a plain connection failure.
fn connect_error(c: &NatsCredentials, url: &str, source: async_nats::ConnectError) -> Error {
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
        _ => return Error::NatsConnect { url, source },
    };
    Error::NatsRefused {
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

/// The URL with any `user:password@` removed, for error messages.
pub fn redact_url(url: &str) -> String {
    url.split(',')
        .map(|u| match (u.find("://"), u.rfind('@')) {
            (Some(s), Some(at)) if at > s => format!("{}***@{}", &u[..s + 3], &u[at + 1..]),
            _ => u.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_subjects_capture_filters_by_wildcard() {
        assert!(captures("k8s.>", "k8s.dev.core.configmaps.*.*"));
        assert!(captures(
            "k8s.*.core.configmaps.*.*",
            "k8s.dev.core.configmaps.*.*"
        ));
        assert!(captures(
            "k8s.dev.core.configmaps.*.*",
            "k8s.dev.core.configmaps.*.*"
        ));
        assert!(!captures(
            "k8s.dev.core.configmaps.*",
            "k8s.dev.core.configmaps.*.*"
        ));
        assert!(!captures(
            "k8s.dev.core.configmaps.a.*",
            "k8s.dev.core.configmaps.*.*"
        ));
        assert!(!captures("k8s.>", "k8s"));
        assert!(!captures("k8s.*", "k8s.>"));
    }

    #[test]
    fn credentials_never_reach_messages() {
        assert_eq!(
            redact_url("nats://alice:s3cret@host:4222"),
            "nats://***@host:4222"
        );
        assert_eq!(
            redact_url("nats://host:4222,tls://t@h2"),
            "nats://host:4222,tls://***@h2"
        );
    }
}
