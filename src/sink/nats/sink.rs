//! The NATS sink: JetStream publishes wait for the stream's acknowledgement and carry
//! `Nats-Msg-Id` = event id, so the server drops a duplicate within its window. Core NATS (no
//! `jetstream` section) is fire-and-forget: at most once. The JetStream stream is created or
//! extended to capture the subjects of the watched resources.

use std::borrow::Cow;
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind, stream};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use futures::future::BoxFuture;
use tracing::{info, warn};

use super::NatsConfig;
use super::config::connect_client;
use super::error::Error as SetupError;
use crate::config::ContentMode;
use crate::discovery::ResolvedResource;
use crate::encode::{
    DATA_CONTENT_TYPE, Event, ResourceInfo, STRUCTURED_CONTENT_TYPE, ce_header, header_value,
};
use crate::sink::{Checkpoints, Delivered, Error, Outcome, Pending, Result, Sink, ready};
use crate::template::{Template, Values};

/// The name token of a subject that carries a watch's own messages (a snapshot's markers):
/// Kubernetes names start with a letter or digit, so no object's subject has it.
pub const WATCH_NAME: &str = "_watch";

/// The namespace token of such a subject when the watch covers every namespace.
pub const ALL_NAMESPACES: &str = "_all";

/// The header by which JetStream drops a message it stored within its duplicate window.
const NATS_MESSAGE_ID: &str = "Nats-Msg-Id";

/// The headers of a structured CloudEvent published out of band, with `id` as its
/// `Nats-Msg-Id` when given.
fn structured(id: Option<&str>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("Content-Type", STRUCTURED_CONTENT_TYPE);
    if let Some(id) = id {
        headers.insert(NATS_MESSAGE_ID, id);
    }
    headers
}

/// The error of a failed out-of-band publish to `subject`.
fn publish_failed(
    subject: &str,
) -> impl Fn(Box<dyn std::error::Error + Send + Sync>) -> Error + '_ {
    move |source| Error::Publish {
        destination: subject.to_string(),
        source,
    }
}

/// Publishes awaiting acknowledgement that the JetStream context admits, for every watch and the
/// checkpoint bucket together. Each holds a permit until its watch takes the acknowledgement, and
/// a watch waiting for a permit takes none: with async-nats's default of 5,000, watches listing
/// at once each held some and all waited for more, for ever (tests/faults/acks.rs). The watches
/// bound what they have in flight themselves (`delivery.maxInFlight`, `delivery.maxQueueBytes`),
/// so the context's bound is never the one reached.
const ACK_PERMITS: usize = 1 << 30;

/// The NATS sink.
#[derive(Debug)]
pub struct NatsSink {
    client: async_nats::Client,
    jetstream: Option<jetstream::Context>,
    stream: Option<StreamSettings>,
    subject: Template,
    mode: ContentMode,
    /// Held while the stream's subjects are read and extended: the clusters of a fleet prepare
    /// their resources at once, and two concurrent extensions would each drop the other's.
    extending: tokio::sync::Mutex<()>,
}

/// What is needed to extend the stream for resources discovered later.
#[derive(Debug, Clone)]
struct StreamSettings {
    name: String,
    create: bool,
    duplicate_window: Duration,
}

impl NatsSink {
    /// Connects; [`NatsSink::cover`] then prepares the JetStream stream for each resource.
    pub async fn connect(config: &NatsConfig, subject: Template) -> Result<Self> {
        let client = connect_client(&config.url, &config.credentials).await?;
        let jetstream = config.jetstream.as_ref().map(|js| {
            jetstream::ContextBuilder::new()
                .timeout(Duration::from_secs(js.ack_timeout_secs))
                .max_ack_inflight(ACK_PERMITS)
                .build(client.clone())
        });
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
            extending: tokio::sync::Mutex::new(()),
        };
        Ok(sink)
    }

    /// Makes sure the JetStream stream captures the subjects of `resources` (creating or
    /// extending it when `create` is set); for resources discovered while running as well.
    async fn cover(&self, cluster: &str, resources: &[ResolvedResource]) -> Result<()> {
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
        let _extending = self.extending.lock().await;
        ensure_stream(ctx, stream, subjects).await
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
    async fn publish(&self, event: Event) -> Pending {
        let subject = self.subject_for(&event);
        let (headers, payload) = message(&event, self.mode, self.jetstream.is_some());
        // Headers travel inside max_payload too; percent-encoding rarely grows them.
        let size = payload.len()
            + 64
            + event
                .attributes()
                .map(|(k, v)| k.len() + v.len() + 8)
                .sum::<usize>();
        // The limit the server last announced (an atomic read; `server_info` would copy the
        // whole INFO, strings and all, for every event).
        let max = self.client.max_payload();
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
    async fn publish_raw(&self, subject: &str, payload: Vec<u8>) -> Result<()> {
        let failed = publish_failed(subject);
        self.client
            .publish_with_headers(subject.to_string(), structured(None), payload.into())
            .await
            .map_err(|e| failed(Box::new(e)))?;
        self.client.flush().await.map_err(|e| failed(Box::new(e)))
    }

    /// Publishes `payload` (a structured CloudEvent whose id is `id`) to `subject`: with
    /// JetStream, stored and acknowledged like an event, and dropped as a duplicate within the
    /// stream's window.
    async fn publish_in_stream(&self, subject: &str, id: &str, payload: Vec<u8>) -> Result<()> {
        let Some(js) = &self.jetstream else {
            return self.publish_raw(subject, payload).await;
        };
        let failed = publish_failed(subject);
        let ack = js
            .publish_with_headers(subject.to_string(), structured(Some(id)), payload.into())
            .await
            .map_err(|e| failed(Box::new(e)))?;
        ack.await.map(|_| ()).map_err(|e| failed(Box::new(e)))
    }

    /// Flushes the client's buffer.
    async fn flush_buffer(&self, timeout: Duration) {
        if tokio::time::timeout(timeout, self.client.flush())
            .await
            .is_err()
        {
            warn!("nats flush timed out");
        }
    }
}

impl Sink for NatsSink {
    fn name(&self) -> &'static str {
        "nats"
    }

    fn send(&self, event: Event) -> BoxFuture<'_, Pending> {
        Box::pin(self.publish(event))
    }

    fn send_raw<'a>(
        &'a self,
        destination: &'a str,
        _key: &'a str,
        payload: Vec<u8>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.publish_raw(destination, payload))
    }

    /// A subject names one token per object at most, which the stream captures as a
    /// wildcard: a watch's messages take the token [`WATCH_NAME`] for the name (and
    /// [`ALL_NAMESPACES`] for a namespace the watch does not have), which no object can take.
    fn watch_destination(&self, info: &ResourceInfo, values: &Values<'_>) -> Option<String> {
        let template = info.destination.as_ref().unwrap_or(&self.subject);
        let values = Values {
            name: WATCH_NAME,
            namespace: values.namespace.or(Some(ALL_NAMESPACES)),
            ..*values
        };
        Some(template.render_subject(&values))
    }

    fn send_in_stream<'a>(
        &'a self,
        destination: &'a str,
        key: &'a str,
        payload: Vec<u8>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.publish_in_stream(destination, key, payload))
    }

    fn flush(&self, timeout: Duration) -> BoxFuture<'_, ()> {
        Box::pin(self.flush_buffer(timeout))
    }

    /// A JetStream publish that is retried could land after a later one.
    fn ordered_in_flight(&self) -> bool {
        false
    }

    fn checkpoints(&self) -> Checkpoints<'_> {
        match &self.jetstream {
            Some(js) => Checkpoints::NatsBucket(js),
            None => Checkpoints::Unsupported("core NATS cannot checkpoint"),
        }
    }

    /// Makes sure the JetStream stream captures the subjects of `resources`.
    fn prepare<'a>(
        &'a self,
        cluster: &'a str,
        resources: &'a [ResolvedResource],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.cover(cluster, resources))
    }
}

/// Builds headers and body for one event.
pub fn message(event: &Event, mode: ContentMode, jetstream: bool) -> (HeaderMap, Bytes) {
    let mut headers = HeaderMap::new();
    if jetstream {
        headers.insert(NATS_MESSAGE_ID, event.id.as_str());
    }
    let payload = match mode {
        ContentMode::Binary => {
            headers.insert("Content-Type", DATA_CONTENT_TYPE);
            for (name, value) in event.attributes() {
                let value = HeaderValue::from(header_value(value).into_owned());
                match ce_header(name, '-') {
                    Cow::Borrowed(name) => headers.insert(HeaderName::from_static(name), value),
                    Cow::Owned(name) => headers.insert(name, value),
                }
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
            let info = existing.info().await.map_err(|e| SetupError::Stream {
                message: format!("cannot read stream {name}: {e}"),
            })?;
            let missing: Vec<&String> = subjects
                .iter()
                .filter(|s| !info.config.subjects.iter().any(|p| captures(p, s)))
                .collect();
            if !missing.is_empty() {
                if !create {
                    return Err(SetupError::Stream {
                        message: format!(
                            "stream {name} does not capture subjects {missing:?}; add them or set create: true"
                        ),
                    }.into());
                }
                let mut config = info.config.clone();
                config.subjects.extend(missing.into_iter().cloned());
                ctx.update_stream(config)
                    .await
                    .map_err(|e| SetupError::Stream {
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
            .map_err(|e| SetupError::Stream {
                message: format!("cannot create stream {name}: {e}"),
            })?;
            info!(stream = name, "created stream");
            Ok(())
        }
        Err(e) => Err(SetupError::Stream {
            message: format!("stream {name} is not available and create is false: {e}"),
        }
        .into()),
    }
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
}
