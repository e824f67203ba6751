//! The exporter's HTTP client: the bridge's own reqwest, whose requests run on the bridge's
//! runtime (the SDK's batch processor exports from a thread of its own, outside any runtime).

use std::time::Duration;

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use tokio_util::task::AbortOnDropHandle;

/// The spec's default export timeout.
const TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// Sends OTLP requests with reqwest on the bridge's runtime.
#[derive(Debug)]
pub(super) struct Client {
    http: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl Client {
    /// A client whose requests time out after `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` or
    /// `OTEL_EXPORTER_OTLP_TIMEOUT` milliseconds (10 s by default), as the exporter's own would.
    pub(super) fn from_env(runtime: tokio::runtime::Handle) -> reqwest::Result<Self> {
        let timeout = [
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ]
        .iter()
        .find_map(|name| std::env::var(name).ok()?.trim().parse().ok())
        .map_or(TIMEOUT_DEFAULT, Duration::from_millis);
        crate::tls::install_crypto_provider();
        let http = reqwest::Client::builder().timeout(timeout).build()?;
        Ok(Self { http, runtime })
    }
}

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let http = self.http.clone();
        // Owned by this call: a caller that gives up stops the request.
        let sent = AbortOnDropHandle::new(self.runtime.spawn(async move {
            let response = http.execute(request).await?;
            let mut answer = Response::builder().status(response.status());
            if let Some(headers) = answer.headers_mut() {
                *headers = response.headers().clone();
            }
            let body = response.bytes().await?;
            Ok::<_, HttpError>(answer.body(body)?)
        }));
        sent.await?
    }
}
