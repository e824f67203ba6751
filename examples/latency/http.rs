//! The probe as an HTTP receiver (`latency http`): every program under comparison posts its
//! CloudEvents (binary or structured mode; the object, with its stamp, in the body) to a path of
//! its own, and each path is measured on its own.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use tokio::net::TcpListener;

use super::Probe;

/// One path's probe, and every request it received (stamped or not).
pub struct Path {
    pub probe: Arc<Probe>,
    pub requests: AtomicU64,
}

/// Listens on 127.0.0.1:`port` and feeds each POST's body to the probe of its path; a request
/// to another path is answered 404.
pub async fn serve(port: u16, paths: Arc<BTreeMap<String, Path>>) -> anyhow::Result<()> {
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let paths = paths.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| receive(request, paths.clone()));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn receive(
    request: Request<Incoming>,
    paths: Arc<BTreeMap<String, Path>>,
) -> Result<Response<Empty<Bytes>>, Infallible> {
    let path = paths.get(request.uri().path());
    let origin = request
        .headers()
        .get("ce-origin")
        .map(|v| v.as_bytes().to_vec());
    let body = request.into_body().collect().await.map(|b| b.to_bytes());
    let mut response = Response::new(Empty::new());
    *response.status_mut() = match (path, body) {
        (Some(path), Ok(body)) => {
            path.requests.fetch_add(1, Ordering::Relaxed);
            path.probe.observe(&body, origin.as_deref(), None).await;
            StatusCode::ACCEPTED
        }
        (Some(_), Err(_)) => StatusCode::BAD_REQUEST,
        (None, _) => StatusCode::NOT_FOUND,
    };
    Ok(response)
}

/// Waits until every program watches: each path has received a request (some send nothing for
/// the objects they list at start, Knative's adapter among them, so `ping` is patched every second
/// until then), and then none for a second. Fails after `timeout`.
pub async fn wait_watching(
    paths: &BTreeMap<String, Path>,
    ping: &Api<ConfigMap>,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let count = |p: &Path| p.requests.load(Ordering::Relaxed);
    let mut pings = 0u64;
    while !paths.values().all(|p| count(p) > 0) {
        if Instant::now() >= deadline {
            let counts: Vec<String> = paths
                .iter()
                .map(|(name, p)| format!("{name}: {}", count(p)))
                .collect();
            anyhow::bail!("not every path received an event: {}", counts.join(", "));
        }
        pings += 1;
        let body = serde_json::json!({"metadata": {"annotations": {PING: pings.to_string()}}});
        ping.patch("cm-000000", &PatchParams::default(), &Patch::Merge(body))
            .await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let total = || -> u64 { paths.values().map(count).sum() };
    let mut last = (total(), Instant::now());
    while last.1.elapsed() < Duration::from_secs(1) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if total() != last.0 {
            last = (total(), Instant::now());
        }
    }
    Ok(())
}

/// The annotation of the pings: not a stamp, so never a sample.
const PING: &str = "bench.kube-event-bridge.io/ping";
