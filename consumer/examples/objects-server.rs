//! A small microservice built on the consumer library: it keeps the current objects of the
//! topics or stream the bridge writes, serves them over HTTP and logs every change.
//!
//! Configured by the environment:
//!
//! | variable | meaning |
//! |---|---|
//! | `KAFKA_BOOTSTRAP_SERVERS` and `KEB_TOPICS` | read these comma-separated Kafka topics, or |
//! | `NATS_URL` and `KEB_STREAM` | read this JetStream stream (`KEB_SUBJECTS`: optional comma-separated filters) |
//! | `KEB_LISTEN` | the HTTP address, default `127.0.0.1:8080` |
//!
//! Endpoints: `GET /readyz` (200 once the store caught up, 503 before), `GET /clusters` (each
//! cluster and how many objects it has: one store can follow a fleet), `GET /objects` (every
//! object of every cluster), `GET /objects/{cluster}` (one cluster's),
//! `GET /objects/{cluster}/{resource}/{namespace}/{name}` and
//! `GET /objects/{cluster}/{resource}/{name}` (`cluster` as the events' `cluster` attribute,
//! `resource` as `configmaps` or `deployments.apps`).
//!
//! ```sh
//! KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 KEB_TOPICS=state.prod.configmaps \
//!   cargo run --release -p kube-event-bridge-consumer --example objects-server
//! curl -s localhost:8080/objects/prod/configmaps/shop/web
//! ```

use std::convert::Infallible;
use std::pin::Pin;

use futures::{Stream, StreamExt};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kube_event_bridge_consumer::{Body, Change, Object, ObjectKey, Store, Writer, kafka, nats};
use serde_json::{Value, json};
use tracing::{info, warn};

type Changes = Pin<Box<dyn Stream<Item = Result<Change, String>> + Send>>;

#[tokio::main]
async fn main() {
    if let Err(error) = run().await {
        eprintln!("objects-server: {error}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let writer = Writer::new();
    let store = writer.store();
    let changes = subscribe(writer).await?;
    tokio::spawn(log_changes(changes, store.clone()));

    let listen = std::env::var("KEB_LISTEN").unwrap_or_else(|_| "127.0.0.1:8080".into());
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    info!(address = %listener.local_addr()?, "serving objects");
    loop {
        let (socket, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        let store = store.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let store = store.clone();
                async move { Ok::<_, Infallible>(respond(&store, &request)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(socket), service);
            if let Err(error) = connection.await {
                warn!(error = %error, "connection failed");
            }
        });
    }
}

/// The change stream for the broker the environment names.
async fn subscribe(writer: Writer) -> Result<Changes, Box<dyn std::error::Error>> {
    let list = |v: String| -> Vec<String> {
        v.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    };
    if let (Ok(bootstrap), Ok(topics)) = (
        std::env::var("KAFKA_BOOTSTRAP_SERVERS"),
        std::env::var("KEB_TOPICS"),
    ) {
        let mut client = rdkafka::ClientConfig::new();
        client.set("bootstrap.servers", bootstrap);
        let changes = kafka::Subscription::new(client, list(topics))
            .reflect(writer)
            .await?;
        return Ok(Box::pin(changes.map(|c| c.map_err(|e| format!("{e:#}")))));
    }
    if let (Ok(url), Ok(stream)) = (std::env::var("NATS_URL"), std::env::var("KEB_STREAM")) {
        let context = async_nats::jetstream::new(async_nats::connect(url).await?);
        let subjects = list(std::env::var("KEB_SUBJECTS").unwrap_or_default());
        let changes = nats::Subscription::new(context, stream)
            .filter_subjects(subjects)
            .reflect(writer)
            .await?;
        return Ok(Box::pin(changes.map(|c| c.map_err(|e| format!("{e:#}")))));
    }
    Err("set KAFKA_BOOTSTRAP_SERVERS and KEB_TOPICS, or NATS_URL and KEB_STREAM".into())
}

/// Logs every change; the store is already up to date when a change arrives.
async fn log_changes(mut changes: Changes, store: Store) {
    while let Some(change) = changes.next().await {
        match change {
            Ok(Change::Applied { object, previous }) => info!(
                object = %object.key,
                uid = %object.uid,
                rv = %object.resource_version,
                origin = %object.origin,
                replaced_uid = previous.as_ref().filter(|p| p.uid != object.uid).map(|p| p.uid.as_str()),
                "object applied"
            ),
            Ok(Change::Deleted { object, cause }) => {
                info!(object = %object.key, uid = %object.uid, cause = ?cause, "object deleted")
            }
            Ok(Change::CaughtUp) => info!(objects = store.len(), "caught up"),
            Ok(Change::SnapshotComplete { id, pruned, .. }) => {
                info!(snapshot = %id, pruned, objects = store.len(), "snapshot complete")
            }
            Err(error) => warn!(error = %error, "message skipped"),
        }
    }
    warn!("change stream ended");
}

fn respond(store: &Store, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let path: Vec<&str> = request.uri().path().trim_matches('/').split('/').collect();
    match path.as_slice() {
        ["readyz"] if store.is_ready() => reply(StatusCode::OK, json!("ready")),
        ["readyz"] => reply(StatusCode::SERVICE_UNAVAILABLE, json!("catching up")),
        ["clusters"] => {
            let counts: serde_json::Map<String, Value> = store
                .clusters()
                .into_iter()
                .map(|c| {
                    let objects = store.cluster(&c).len();
                    (c, json!(objects))
                })
                .collect();
            reply(StatusCode::OK, Value::Object(counts))
        }
        ["objects"] => listed(store.list()),
        ["objects", cluster] => listed(store.cluster(cluster).list()),
        ["objects", cluster, resource, namespace, name] => {
            found(store.get(&ObjectKey::namespaced(cluster, resource, namespace, name)))
        }
        ["objects", cluster, resource, name] => {
            found(store.get(&ObjectKey::cluster_scoped(cluster, resource, name)))
        }
        _ => reply(StatusCode::NOT_FOUND, json!("no such endpoint")),
    }
}

fn listed(mut objects: Vec<std::sync::Arc<Object>>) -> Response<Full<Bytes>> {
    objects.sort_by(|a, b| a.key.cmp(&b.key));
    reply(
        StatusCode::OK,
        Value::Array(objects.iter().map(|o| describe(o)).collect()),
    )
}

fn found(object: Option<std::sync::Arc<Object>>) -> Response<Full<Bytes>> {
    match object {
        Some(o) => reply(StatusCode::OK, describe(&o)),
        None => reply(StatusCode::NOT_FOUND, json!("no such object")),
    }
}

fn describe(o: &Object) -> Value {
    let (object, missing) = match &o.body {
        Body::Full(v) => (v.clone(), Value::Null),
        Body::Missing { reason, .. } => (Value::Null, json!(format!("{reason:?}"))),
    };
    json!({
        "cluster": o.key.cluster, "resource": o.key.resource, "namespace": o.key.namespace,
        "name": o.key.name,
        "uid": o.uid, "resourceVersion": o.resource_version, "origin": o.origin.to_string(),
        "missingBody": missing, "object": object,
    })
}

fn reply(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}
