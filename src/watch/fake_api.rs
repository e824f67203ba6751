//! A stand-in API server on loopback for the watch's tests, and what a real one sends.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, TypeMeta, WatchEvent};
use kube::core::Status as ApiStatus;
use kube::discovery::ApiResource;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::{Listing, Target};
use crate::config::InitialList;
use crate::status::Status;
use crate::throttle::ThrottleLayer;

/// The status kube-apiserver sends for a resourceVersion it has not reached
/// (`storage.NewTooLargeResourceVersionError`).
pub(super) fn too_large_status(with_cause: bool) -> serde_json::Value {
    let mut status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Timeout: Too large resource version: 999999999, current: 1234",
        "reason": "Timeout", "code": 504,
        "details": {"retryAfterSeconds": 1},
    });
    if with_cause {
        status["details"]["causes"] =
            json!([{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]);
    }
    status
}

pub(super) fn status(value: serde_json::Value) -> Box<ApiStatus> {
    Box::new(serde_json::from_value(value).unwrap())
}

pub(super) fn cm_event(kind: &str, name: &str, rv: &str) -> WatchEvent<DynamicObject> {
    serde_json::from_value(json!({"type": kind, "object": {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "resourceVersion": rv},
    }}))
    .unwrap()
}

/// Requests a stand-in API server received: when, and the request line's target.
pub(super) type Seen = Arc<Mutex<Vec<(Instant, String)>>>;

/// The request targets `seen` holds, in order.
pub(super) fn targets(seen: &Seen) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|(_, t)| t.clone())
        .collect()
}

/// A stand-in API server on loopback (plain HTTP/1.1, one request per connection) answering
/// each request with `answer(path and query)`: (status code, body).
pub(super) async fn fake_api(
    answer: impl Fn(&str) -> (u16, String) + Send + Sync + 'static,
) -> (kube::Client, Seen) {
    fake_api_with(answer, None).await
}

/// [`fake_api`] with its client's requests through `throttle`, as the bridge's are.
pub(super) async fn fake_api_with(
    answer: impl Fn(&str) -> (u16, String) + Send + Sync + 'static,
    throttle: Option<ThrottleLayer>,
) -> (kube::Client, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let (answer, log) = (Arc::new(answer), seen.clone());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let (answer, log) = (answer.clone(), log.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head);
                let target = head.split(' ').nth(1).unwrap_or_default().to_string();
                log.lock().unwrap().push((Instant::now(), target.clone()));
                let (code, body) = answer(&target);
                let response = format!(
                    "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(response.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    let mut config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
    // kube-client retries 429, 503 and 504 up to 15 times on its own: seen here, that would
    // only slow the tests down.
    config.default_retry = false;
    let client = match throttle {
        Some(layer) => kube::client::ClientBuilder::try_from(config)
            .unwrap()
            .with_layer(&layer)
            .build(),
        None => kube::Client::try_from(config).unwrap(),
    };
    (client, seen)
}

pub(super) fn target(client: kube::Client) -> Target {
    let resource = ApiResource::erase::<ConfigMap>(&());
    Target {
        api: Api::namespaced_with(client, "ns", &resource),
        types: TypeMeta {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
        },
        label_selector: None,
        field_selector: None,
        page_size: 500,
        page_bytes: 16 << 20,
        watch_timeout_secs: 290,
        not_found: Arc::default(),
        resource_deleted: Arc::default(),
        // The tests of the paged LIST; those of streaming lists set their own.
        listing: Arc::new(Listing::new("v1/configmaps", InitialList::List)),
        history: Arc::default(),
    }
}

pub(super) fn restarts(status: &Status, reason: &str) -> u64 {
    status
        .restarts
        .lock()
        .unwrap()
        .get(reason)
        .copied()
        .unwrap_or(0)
}
