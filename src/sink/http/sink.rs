//! The HTTP sink: one `POST` per event (CloudEvents HTTP binding, binary or structured mode),
//! acknowledged by a 2xx response. Requests run as tasks of their own, at most `maxInFlight` at
//! once across every watch; the pipeline keeps one event per object in flight, so the order of
//! each object's events holds. The response status is sorted in [`classify`].

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::future::BoxFuture;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use super::HttpConfig;
use super::config::{Credentials, client};
use super::error::Error as SetupError;
use crate::config::ContentMode;
use crate::encode::{
    self, DATA_CONTENT_TYPE, Event, ResourceInfo, STRUCTURED_CONTENT_TYPE, ce_header,
};
use crate::sink::{Delivered, Error, Outcome, Pending, Result, Sink, ready};
use crate::template::{Template, Values};

/// How much of a refusing receiver's response body goes into the error.
const ERROR_BODY_BYTES: usize = 512;

/// The HTTP sink.
#[derive(Debug)]
pub struct HttpSink {
    inner: Arc<Inner>,
    url: Template,
    mode: ContentMode,
    /// `sink.http.extensions`, as header names and as structured-mode members.
    extensions: Vec<(HeaderName, String)>,
    permits: Arc<Semaphore>,
    max_in_flight: u32,
}

/// What the request tasks share.
#[derive(Debug)]
struct Inner {
    client: reqwest::Client,
    credentials: Credentials,
    /// Per origin (`scheme://host:port`): no request before this instant (`Retry-After`).
    not_before: Mutex<HashMap<String, Instant>>,
    max_retry_after: Duration,
}

/// One request, ready to go.
struct Request {
    url: reqwest::Url,
    headers: HeaderMap,
    body: Bytes,
}

impl HttpSink {
    /// Builds the client and reads the credentials (nothing is sent: receivers may start after
    /// the bridge).
    pub fn new(config: &HttpConfig, url: Template) -> Result<Self> {
        let extensions = config
            .extensions
            .iter()
            .map(|(name, value)| {
                HeaderName::try_from(format!("ce-{name}"))
                    .map(|h| (h, value.clone()))
                    .map_err(|_| SetupError::Extension { name: name.clone() })
            })
            .collect::<std::result::Result<_, SetupError>>()?;
        let max_in_flight = u32::try_from(config.max_in_flight).unwrap_or(u32::MAX);
        Ok(Self {
            inner: Arc::new(Inner {
                client: client(config)?,
                credentials: Credentials::load(&config.credentials)?,
                not_before: Mutex::new(HashMap::new()),
                max_retry_after: Duration::from_secs(config.max_retry_after_secs),
            }),
            url,
            mode: config.content_mode,
            extensions,
            permits: Arc::new(Semaphore::new(max_in_flight as usize)),
            max_in_flight,
        })
    }

    /// The URL for `event`: its resource's template, else the sink's.
    pub fn url_for(&self, event: &Event) -> String {
        event
            .info
            .destination
            .as_ref()
            .unwrap_or(&self.url)
            .render_url(&event.template_values())
    }

    /// Headers and body of `event`.
    pub fn message(&self, event: &Event) -> (HeaderMap, Bytes) {
        // Room for every attribute, the content type and a few configured extensions.
        let mut headers = HeaderMap::with_capacity(32);
        let body = match self.mode {
            ContentMode::Binary => {
                headers.insert(CONTENT_TYPE, HeaderValue::from_static(DATA_CONTENT_TYPE));
                for (name, value) in event.attributes() {
                    insert_ce(&mut headers, name, value);
                }
                for (name, value) in &self.extensions {
                    headers.insert(name.clone(), header_value(value));
                }
                Bytes::copy_from_slice(&event.data)
            }
            ContentMode::Structured => {
                let structured = HeaderValue::from_static(STRUCTURED_CONTENT_TYPE);
                headers.insert(CONTENT_TYPE, structured);
                Bytes::from(structured_json(event, &self.extensions))
            }
        };
        (headers, body)
    }

    /// Waits for a free request slot, then sends `event` in a task of its own; the returned
    /// future resolves with the receiver's answer.
    async fn post(&self, event: Event) -> Pending {
        let url = match reqwest::Url::parse(&self.url_for(&event)) {
            Ok(url) => url,
            // Validation checked the template; a value cannot break it (percent-encoded).
            Err(e) => {
                let error = format!("the URL rendered for this object is invalid: {e}");
                return ready(
                    event,
                    Outcome::Rejected {
                        reason: "invalid",
                        error,
                    },
                );
            }
        };
        let (headers, body) = self.message(&event);
        let permit = acquire(&self.permits).await;
        let inner = self.inner.clone();
        let permits = self.permits.clone();
        // Owned by the delivery it serves: dropped with it (a pipeline aborted at the end of
        // the grace period), it stops, instead of waiting out a `Retry-After` for nobody.
        let task = AbortOnDropHandle::new(tokio::spawn(async move {
            let origin = url.origin().ascii_serialization();
            let permit = inner.slot_for(&origin, permit, &permits).await;
            let outcome = inner.deliver(Request { url, headers, body }).await;
            drop(permit);
            outcome
        }));
        Box::pin(async move {
            let outcome = task.await.unwrap_or_else(|e| Outcome::Retry {
                error: format!("the request task ended: {e}"),
            });
            Delivered { event, outcome }
        })
    }

    /// Posts one structured CloudEvent (a heartbeat) to `url` and waits for a 2xx.
    async fn post_raw(&self, url: &str, payload: Vec<u8>) -> Result<()> {
        let failed = |error: String| Error::Publish {
            destination: shown(url),
            source: error.into(),
        };
        let url = reqwest::Url::parse(url).map_err(|e| failed(e.to_string()))?;
        let mut headers = HeaderMap::new();
        let structured = HeaderValue::from_static(STRUCTURED_CONTENT_TYPE);
        headers.insert(CONTENT_TYPE, structured);
        let request = Request {
            url,
            headers,
            body: payload.into(),
        };
        self.inner
            .wait_for(&request.url.origin().ascii_serialization())
            .await;
        match self.inner.deliver(request).await {
            Outcome::Acked => Ok(()),
            Outcome::Rejected { error, .. }
            | Outcome::Blocked { error, .. }
            | Outcome::Fatal { error }
            | Outcome::Retry { error } => Err(failed(error)),
            Outcome::Aborted => Err(failed("aborted".into())),
        }
    }

    /// Waits until no request is in flight, or `timeout`.
    async fn drain(&self, timeout: Duration) {
        if let Ok(Ok(all)) =
            tokio::time::timeout(timeout, self.permits.acquire_many(self.max_in_flight)).await
        {
            drop(all);
        } else {
            tracing::warn!("http requests still in flight after the flush timeout");
        }
    }
}

impl Inner {
    /// A request slot for `origin` once no `Retry-After` holds it. A slot is never kept while
    /// the origin's `Retry-After` runs: the other receivers' requests take the slots meanwhile.
    async fn slot_for(
        &self,
        origin: &str,
        mut permit: OwnedSemaphorePermit,
        permits: &Arc<Semaphore>,
    ) -> OwnedSemaphorePermit {
        while self.held(origin) {
            drop(permit);
            self.wait_for(origin).await;
            permit = acquire(permits).await;
        }
        permit
    }

    /// Whether a `Retry-After` of `origin` still runs.
    fn held(&self, origin: &str) -> bool {
        self.not_before
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(origin)
            .is_some_and(|until| *until > Instant::now())
    }

    /// Sends one request (its origin's `Retry-After` has passed) and sorts the answer.
    async fn deliver(&self, request: Request) -> Outcome {
        let origin = request.url.origin().ascii_serialization();
        let at = shown(request.url.as_str());
        let credential = match self.credentials.current() {
            Ok(c) => c,
            Err(e) => {
                return Outcome::Blocked {
                    reason: "not_authorized",
                    error: error_chain(&e),
                };
            }
        };
        let mut builder = self
            .client
            .post(request.url)
            .headers(request.headers)
            .body(request.body);
        if let Some(credential) = credential {
            builder = credential.apply(builder);
        }
        let response = match builder.send().await {
            Ok(r) => r,
            Err(e) => {
                return Outcome::Retry {
                    error: format!("POST {at}: {}", error_chain(&e.without_url())),
                };
            }
        };
        let status = response.status();
        let retry_after = retry_after(response.headers(), SystemTime::now());
        let body = drain_body(response, !status.is_success()).await;
        let outcome = classify(status, &format!("POST {at}: {status}{body}"));
        match &outcome {
            Outcome::Retry { .. } => {
                if let Some(after) = retry_after {
                    self.hold(origin, after.min(self.max_retry_after));
                }
            }
            Outcome::Blocked {
                reason: "not_authorized",
                ..
            } => self.credentials.refused(),
            _ => {}
        }
        outcome
    }

    /// Waits until a `Retry-After` of `origin` has passed.
    async fn wait_for(&self, origin: &str) {
        let until = self
            .not_before
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(origin)
            .copied();
        if let Some(until) = until {
            tokio::time::sleep_until(until).await;
        }
    }

    /// No request to `origin` for `after`.
    fn hold(&self, origin: String, after: Duration) {
        let until = Instant::now() + after;
        let mut map = self.not_before.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, t| *t > Instant::now());
        let entry = map.entry(origin).or_insert(until);
        *entry = (*entry).max(until);
    }
}

/// A request slot (the semaphore is never closed).
async fn acquire(permits: &Arc<Semaphore>) -> OwnedSemaphorePermit {
    let Ok(permit) = permits.clone().acquire_owned().await else {
        unreachable!("the semaphore is never closed")
    };
    permit
}

/// Sorts a response status: 2xx acknowledges; 408, 425, 429 and 5xx are retried (the receiver
/// is busy or failing); 401, 403 and 407 refuse every event until the credentials are fixed,
/// and so do 404, 410 and redirects (the URL names no receiver); 413 is too large (sent again
/// as a reference); any other status refuses this event for good.
pub fn classify(status: StatusCode, error: &str) -> Outcome {
    let blocked = |reason| Outcome::Blocked {
        reason,
        error: error.to_string(),
    };
    let rejected = |reason| Outcome::Rejected {
        reason,
        error: error.to_string(),
    };
    match status.as_u16() {
        200..=299 => Outcome::Acked,
        401 | 403 | 407 => blocked("not_authorized"),
        404 | 410 | 300..=399 => blocked("not_found"),
        413 => rejected("too_large"),
        408 | 425 | 429 => Outcome::Retry {
            error: error.to_string(),
        },
        400..=499 => rejected("invalid"),
        _ => Outcome::Retry {
            error: error.to_string(),
        },
    }
}

/// The delay a `Retry-After` header asks for: seconds, or an HTTP date (zero once passed).
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Reads the response body to its end so the connection can be reused; for a refusal, returns
/// its first bytes for the error (`: ...`).
async fn drain_body(mut response: reqwest::Response, keep: bool) -> String {
    let mut kept = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        if keep && kept.len() < ERROR_BODY_BYTES {
            let room = ERROR_BODY_BYTES - kept.len();
            kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
        }
    }
    let text = String::from_utf8_lossy(&kept);
    let text = text.trim();
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

/// The structured-mode document with `extensions` as members.
fn structured_json(event: &Event, extensions: &[(HeaderName, String)]) -> Vec<u8> {
    let document = event.to_structured_json();
    if extensions.is_empty() {
        return document;
    }
    let mut out = Vec::with_capacity(document.len() + 64 * extensions.len());
    out.push(b'{');
    for (header, value) in extensions {
        let name = header.as_str().trim_start_matches("ce-");
        // Serializing a &str cannot fail.
        serde_json::to_writer(&mut out, name).expect("string serializes");
        out.push(b':');
        serde_json::to_writer(&mut out, value).expect("string serializes");
        out.push(b',');
    }
    out.extend_from_slice(&document[1..]);
    out
}

/// Adds attribute `name`'s `ce-` header.
fn insert_ce(headers: &mut HeaderMap, name: &str, value: &str) {
    let name = match ce_header(name, '-') {
        Cow::Borrowed(name) => HeaderName::from_static(name),
        Cow::Owned(name) => match HeaderName::try_from(name) {
            Ok(name) => name,
            Err(_) => return,
        },
    };
    headers.insert(name, header_value(value));
}

fn header_value(value: &str) -> HeaderValue {
    // Percent-encoding leaves visible ASCII only.
    HeaderValue::try_from(encode::header_value(value).into_owned())
        .expect("percent-encoded text is a header value")
}

/// A URL for messages: without its query string, which may hold a key.
fn shown(url: &str) -> String {
    url.split(['?', '#']).next().unwrap_or(url).to_string()
}

/// An error and its causes, `a: b: c`.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

impl Sink for HttpSink {
    fn name(&self) -> &'static str {
        "http"
    }

    fn send(&self, event: Event) -> BoxFuture<'_, Pending> {
        Box::pin(self.post(event))
    }

    fn send_raw<'a>(
        &'a self,
        destination: &'a str,
        _key: &'a str,
        payload: Vec<u8>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.post_raw(destination, payload))
    }

    fn watch_destination(&self, info: &ResourceInfo, values: &Values<'_>) -> Option<String> {
        let template = info.destination.as_ref().unwrap_or(&self.url);
        template
            .per_watch(values)
            .then(|| template.render_url(values))
    }

    fn flush(&self, timeout: Duration) -> BoxFuture<'_, ()> {
        Box::pin(self.drain(timeout))
    }

    /// A request that is retried could land after a later one of the same object.
    fn ordered_in_flight(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_sorted() {
        let sorted = |code: u16| match classify(StatusCode::from_u16(code).unwrap(), "e") {
            Outcome::Acked => "acked".to_string(),
            Outcome::Retry { .. } => "retry".into(),
            Outcome::Rejected { reason, .. } => format!("rejected {reason}"),
            Outcome::Blocked { reason, .. } => format!("blocked {reason}"),
            other => format!("{other:?}"),
        };
        for (code, expected) in [
            (200, "acked"),
            (202, "acked"),
            (204, "acked"),
            (400, "rejected invalid"),
            (422, "rejected invalid"),
            (413, "rejected too_large"),
            (401, "blocked not_authorized"),
            (403, "blocked not_authorized"),
            (404, "blocked not_found"),
            (301, "blocked not_found"),
            (307, "blocked not_found"),
            (408, "retry"),
            (429, "retry"),
            (500, "retry"),
            (502, "retry"),
            (503, "retry"),
            (504, "retry"),
        ] {
            assert_eq!(sorted(code), expected, "{code}");
        }
    }

    #[test]
    fn retry_after_takes_seconds_or_a_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers, now), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(3)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(42));
        headers.insert(RETRY_AFTER, HeaderValue::try_from(later).unwrap());
        assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(42)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(42));
        headers.insert(RETRY_AFTER, HeaderValue::try_from(past).unwrap());
        assert_eq!(retry_after(&headers, now), Some(Duration::ZERO));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&headers, now), None);
    }

    fn sink(extra: &str) -> HttpSink {
        let yaml = format!("{{url: 'http://127.0.0.1:1/{{namespace}}/{{name}}'{extra}}}");
        let config: HttpConfig = serde_saphyr::from_str(&yaml).unwrap();
        let url = Template::parse(&config.url).unwrap();
        HttpSink::new(&config, url).unwrap()
    }

    fn event() -> Event {
        let change = crate::change::Change {
            kind: crate::change::ChangeKind::Added,
            origin: crate::change::Origin::Live,
            object: serde_json::from_value(serde_json::json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "web", "namespace": "shop", "uid": "u-1", "resourceVersion": "7"},
                "data": {"k": "v"}
            }))
            .unwrap(),
            observed: SystemTime::now(),
        };
        let info = crate::encode::tests::configmaps("");
        crate::encode::encode(&info, change, None).unwrap().event
    }

    #[tokio::test]
    async fn binary_and_structured_messages_carry_the_extensions() {
        let e = event();
        let binary = sink(", extensions: {team: a b}");
        assert_eq!(binary.url_for(&e), "http://127.0.0.1:1/shop/web");
        let (headers, body) = binary.message(&e);
        assert_eq!(headers[CONTENT_TYPE], DATA_CONTENT_TYPE);
        assert_eq!(headers["ce-id"], e.id.as_str());
        assert_eq!(headers["ce-team"], "a%20b");
        assert_eq!(body.as_ref(), e.data.as_slice());

        let structured = sink(", contentMode: structured, extensions: {team: a b}");
        let (headers, body) = structured.message(&e);
        assert_eq!(headers[CONTENT_TYPE], STRUCTURED_CONTENT_TYPE);
        assert!(!headers.contains_key("ce-id"));
        let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(doc["team"], "a b");
        assert_eq!(doc["id"], e.id.as_str());
        assert_eq!(
            doc["data"],
            serde_json::from_slice::<serde_json::Value>(&e.data).unwrap()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_holds_every_request_to_its_origin_only() {
        let inner = sink("").inner.clone();
        inner.hold("http://a:1".into(), Duration::from_secs(3));
        inner.hold("http://a:1".into(), Duration::from_secs(1));
        let start = Instant::now();
        inner.wait_for("http://a:1").await;
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(3),
            "the longer hold wins"
        );
        let start = Instant::now();
        inner.wait_for("http://b:1").await;
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "another receiver is not held"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_origin_gives_its_request_slot_to_other_receivers() {
        let inner = sink("").inner.clone();
        let permits = Arc::new(Semaphore::new(1));
        inner.hold("http://a:1".into(), Duration::from_secs(120));
        let first = acquire(&permits).await;
        let held = {
            let inner = inner.clone();
            let permits = permits.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                let _slot = inner.slot_for("http://a:1", first, &permits).await;
                start.elapsed()
            })
        };
        tokio::task::yield_now().await;
        // The only slot is free for another receiver at once, while `a` waits out its hold.
        let start = Instant::now();
        let other = acquire(&permits).await;
        let other = inner.slot_for("http://b:1", other, &permits).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        drop(other);
        assert_eq!(held.await.unwrap(), Duration::from_secs(120));
    }

    #[test]
    fn header_values_are_percent_encoded_and_urls_lose_their_query() {
        assert_eq!(
            header_value("a b\"%é").to_str().unwrap(),
            "a%20b%22%25%C3%A9"
        );
        assert_eq!(shown("https://h/p?code=secret"), "https://h/p");
    }
}
