//! More publishes awaiting JetStream's acknowledgement than async-nats admits by default. Each
//! publish holds one of its context's acknowledgement permits (5,000 by default, shared by every
//! watch on the connection, checkpoint writes included) until the watch that sent it takes the
//! acknowledgement; a watch waiting for a permit takes none. Once the permits ran out, the
//! watches holding them all waited for more, for ever (the scale bench's NATS wedge,
//! docs/benchmarks.md; each watch sends a list's objects 512 at a time without taking
//! acknowledgements in between). The bridge bounds what is in flight itself, per watch
//! (`delivery.maxInFlight`, `delivery.maxQueueBytes`), so the context admits any number.
//!
//! Here a proxy in front of NATS holds the stream's acknowledgements back for a few seconds, as
//! a busy server would, while one watch admitting more than 5,000 in flight lists 6,000 objects.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::EXCLUSIVE;
use crate::harness::{Bridge, Reader, SinkKind, sink_yaml};
use crate::support::{create_configmaps, kube_client, unique_name, unique_namespace};

const OBJECTS: usize = 6_000;
/// How long the stream's acknowledgements are held from the first event published.
const HOLD: Duration = Duration::from_secs(3);

/// When the hold began (the first event the bridge published), if it did.
type Since = Arc<Mutex<Option<Instant>>>;

/// A proxy to NATS that holds the acknowledgements of the events' stream (`KEB_...`) for
/// [`HOLD`] from the first event the bridge publishes; everything else passes (the checkpoint
/// bucket's answers, the server's pings).
struct AckHold {
    url: String,
    since: Since,
}

impl AckHold {
    async fn start(upstream: &str) -> AckHold {
        let upstream = upstream.trim_start_matches("nats://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let url = format!("nats://{}", listener.local_addr().expect("addr"));
        let since = Since::default();
        let held = since.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(&upstream).await.expect("connect NATS");
                let ((from_client, to_client), (from_server, to_server)) =
                    (client.into_split(), server.into_split());
                tokio::spawn(upstream_copy(from_client, to_server, held.clone()));
                tokio::spawn(downstream_copy(from_server, to_client, held.clone()));
            }
        });
        AckHold { url, since }
    }

    fn engaged(&self) -> bool {
        self.since.lock().unwrap().is_some()
    }
}

/// Client to server, untouched; the hold begins with the first event (`HPUB k8s.`).
async fn upstream_copy(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, since: Since) {
    let mut buf = vec![0; 64 << 10];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        if buf[..n].windows(9).any(|w| w == b"HPUB k8s.") {
            since.lock().unwrap().get_or_insert_with(Instant::now);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// The length of the first whole protocol operation in `buf` (a line, or a `MSG`/`HMSG` line
/// with its payload), if `buf` holds one.
fn next_op(buf: &[u8]) -> Option<usize> {
    let line = buf.windows(2).position(|w| w == b"\r\n")? + 2;
    let head = std::str::from_utf8(&buf[..line]).ok()?;
    if !(head.starts_with("MSG ") || head.starts_with("HMSG ")) {
        return Some(line);
    }
    let total: usize = head.split_whitespace().last()?.parse().ok()?;
    let end = line + total + 2;
    (buf.len() >= end).then_some(end)
}

/// Server to client, read all along (the server never waits): the events' acknowledgements are
/// kept back while the hold lasts, the rest passes at once.
async fn downstream_copy(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, since: Since) {
    let mut buf = vec![0; 64 << 10];
    let (mut pending, mut held) = (Vec::new(), Vec::new());
    loop {
        let until = since.lock().unwrap().map(|t| t + HOLD);
        let holding = until.is_some_and(|u| Instant::now() < u);
        tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(n @ 1..) => pending.extend_from_slice(&buf[..n]),
                _ => return,
            },
            () = tokio::time::sleep_until(until.unwrap_or_else(Instant::now)), if holding => {}
        }
        let holding = since
            .lock()
            .unwrap()
            .is_some_and(|t| Instant::now() < t + HOLD);
        let mut out = Vec::new();
        if !holding {
            out.append(&mut held);
        }
        while let Some(len) = next_op(&pending) {
            let op: Vec<u8> = pending.drain(..len).collect();
            let ack = op.windows(14).any(|w| w == b"\"stream\":\"KEB_");
            if holding && ack { &mut held } else { &mut out }.extend_from_slice(&op);
        }
        if !out.is_empty() && to.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// With its acknowledgements late, a watch lists more objects than async-nats's default number
/// of permits: all are published and acknowledged, and the watch reports its initial state
/// published.
pub async fn more_in_flight_than_the_default_permits() {
    let _guard = EXCLUSIVE.lock().await;
    let client = kube_client().await;
    let ns = unique_namespace(&client, "acks").await;
    create_configmaps(&client, &ns, (0..OBJECTS).map(|i| format!("o{i}"))).await;
    let cluster = unique_name("c");
    let nats = crate::support::env().nats_url;
    let proxy = AckHold::start(&nats).await;
    let config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\ndelivery: {{maxInFlight: 8192}}\n{}",
        sink_yaml(SinkKind::Nats, &cluster).replace(&nats, &proxy.url)
    );
    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(1).await;
    assert!(proxy.engaged(), "the proxy saw no event published");

    let mut reader = Reader::nats(&cluster).await;
    let events = reader
        .read_until(Duration::from_secs(60), |got| got.len() >= OBJECTS)
        .await;
    let names: std::collections::BTreeSet<String> = events.iter().map(|r| r.ext("name")).collect();
    assert_eq!(names.len(), OBJECTS, "every listed object published once");
    assert!(
        events.iter().all(|r| r.change() == "added"),
        "a listing publishes additions only"
    );
    assert_eq!(
        bridge.count_log("no answer from the broker"),
        0,
        "the watch waited on the broker; log:\n{}",
        bridge.log_text()
    );
    // The tests after this one that watch every namespace need not list these.
    let cms: Api<ConfigMap> = Api::namespaced(client, &ns);
    cms.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .expect("delete the ConfigMaps");
}
