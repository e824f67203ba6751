//! Latency probe for `scripts/bench latency`: patches ConfigMaps at a steady rate, each patch
//! stamping its wall-clock time into an annotation, while a consumer reads the bridge's events
//! from the broker and measures, per event, the time from the patch to its receipt: for Kafka
//! with `isolation.level=read_committed` (when the event becomes visible), for NATS with a
//! JetStream ordered consumer.
//!
//! `latency kafka <bootstrap> <topic> <namespace> <objects> <rate> <seconds>`
//! `latency nats <url> <stream> <subject-filter> <namespace> <objects> <rate> <seconds>`
//! `latency http <port> <path,path,...> <namespace> <objects> <rate> <seconds>`
//!
//! With `http` the probe is the receiver: it listens on 127.0.0.1:`port` and answers every POST
//! at once with 202, measuring each path on its own (one per program under comparison, all fed
//! the same patches: `scripts/bench peers-latency`). It patches only once every program watches
//! (every path received an event, then none for a second), and prints `paths`, each path's
//! figures.
//!
//! The ConfigMaps `cm-000000` … must exist (`loadgen create`). Prints one JSON line: patches
//! sent, events received, the achieved patch rate, and p50 / p99 / max of patch → receipt in
//! milliseconds; with `LATENCY_SAMPLES` set, every sample too (`samples_ms`), and with
//! `LATENCY_SAMPLES=timed` each sample's patch time as well (`sent_s`, seconds since the epoch,
//! in the order of `samples_ms`), for a caller measuring a window of the run (`scripts/bench
//! snapshot`).
//!
//! Only live events count: an event with `origin: snapshot` (a snapshot on demand's, which
//! carries the object's newest stamp again) is not a receipt of a patch; such events are counted
//! in `snapshot_events`.
//!
//! NATS also gives the bridge's part alone, without the API server's and the consumer's: for each
//! live event of a patch, its `time` (when the bridge read the change) to the stream's store time
//! of the message (`stored_p50_ms`, `stored_p99_ms`; with `LATENCY_SAMPLES=timed` every one as
//! `stored_ms`, with its read time `read_s`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::Mutex;

/// The annotation carrying `<run>-<unix nanos>` of the patch.
const STAMP: &str = "bench.kube-event-bridge.io/stamp";

/// Patches in flight at most.
const CONCURRENCY: usize = 64;

#[path = "latency/http.rs"]
mod http;

struct Probe {
    run: String,
    /// (patch time, patch → receipt), nanoseconds, of this run's live events.
    samples: Mutex<Vec<(u64, u64)>>,
    received: AtomicU64,
    /// Events with `origin: snapshot` seen (not samples).
    snapshot_events: AtomicU64,
    /// (read time, read → stored in the stream), nanoseconds, of this run's live events (NATS).
    stored: Mutex<Vec<(u64, u64)>>,
}

impl Probe {
    /// Records an event's payload if it carries a stamp of this run and is a live event (its
    /// `origin`, from the binary-mode header, is not `snapshot`).
    /// `stored`: when the bridge read the change and when the stream stored its event (NATS).
    async fn observe(&self, payload: &[u8], origin: Option<&[u8]>, stored: Option<(u64, u64)>) {
        if origin == Some(b"snapshot") {
            self.snapshot_events.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Some(sent) = stamp(payload, &self.run) else {
            return;
        };
        if let Some((read, at)) = stored {
            self.stored
                .lock()
                .await
                .push((read, at.saturating_sub(read)));
        }
        let latency = now_nanos().saturating_sub(sent);
        self.samples.lock().await.push((sent, latency));
        self.received.fetch_add(1, Ordering::Relaxed);
    }
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The nanoseconds of a stamp `<run>-<nanos>` of `run` found in `payload` (the event's JSON).
fn stamp(payload: &[u8], run: &str) -> Option<u64> {
    let text = std::str::from_utf8(payload).ok()?;
    let needle = format!("\"{STAMP}\":\"{run}-");
    let at = text.find(&needle)? + needle.len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Sends `rate` patches a second for `seconds`, round-robin over `objects` ConfigMaps; returns
/// how many were applied and the seconds it took.
async fn patch(
    ns: &str,
    objects: usize,
    rate: u64,
    seconds: u64,
    run: &str,
) -> anyhow::Result<(u64, f64)> {
    let client = kube::Client::try_default().await?;
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let total = rate * seconds;
    let mut ticker = tokio::time::interval(Duration::from_nanos(1_000_000_000 / rate.max(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let limit = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let failed = Arc::new(AtomicU64::new(0));
    let start = std::time::Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        ticker.tick().await;
        let permit = limit.clone().acquire_owned().await?;
        let (api, failed, run) = (api.clone(), failed.clone(), run.to_string());
        let name = format!("cm-{:06}", i as usize % objects);
        tasks.push(tokio::spawn(async move {
            let value = format!("{run}-{}", now_nanos());
            let body = serde_json::json!({"metadata": {"annotations": {STAMP: value}}});
            if api
                .patch(&name, &PatchParams::default(), &Patch::Merge(body))
                .await
                .is_err()
            {
                failed.fetch_add(1, Ordering::Relaxed);
            }
            drop(permit);
        }));
    }
    for t in tasks {
        t.await?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    Ok((total - failed.load(Ordering::Relaxed), elapsed))
}

/// Reads the topic with `read_committed` from its end, feeding every record to `probe`.
async fn consume_kafka(
    bootstrap: String,
    topic: String,
    probe: Arc<Probe>,
    ready: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::message::Headers;
    use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", format!("latency-{}", probe.run))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "5")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(&topic), Duration::from_secs(10))?;
    let partitions = metadata
        .topics()
        .first()
        .map(|t| t.partitions().len())
        .filter(|n| *n > 0)
        .context("the topic has no partitions yet")?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(&topic, p as i32, Offset::End)?;
    }
    consumer.assign(&tpl)?;
    let mut stream = consumer.stream();
    ready.store(true, Ordering::Relaxed);
    while let Some(message) = stream.next().await {
        let message = message?;
        let origin = message.headers().and_then(|headers| {
            headers
                .iter()
                .find(|h| h.key == "ce_origin")
                .and_then(|h| h.value)
        });
        if let Some(payload) = message.payload() {
            probe.observe(payload, origin, None).await;
        }
    }
    Ok(())
}

/// Reads new messages of the stream under `filter` with an ordered consumer, feeding each to
/// `probe`.
async fn consume_nats(
    url: String,
    stream: String,
    filter: String,
    probe: Arc<Probe>,
    ready: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    use async_nats::jetstream::consumer::{DeliverPolicy, pull::OrderedConfig};
    let client = async_nats::connect(&url).await?;
    let js = async_nats::jetstream::new(client);
    let consumer = js
        .get_stream(&stream)
        .await?
        .create_consumer(OrderedConfig {
            filter_subject: filter,
            deliver_policy: DeliverPolicy::New,
            ..OrderedConfig::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    ready.store(true, Ordering::Relaxed);
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| anyhow::anyhow!(e))?;
        let origin = message
            .headers
            .as_ref()
            .and_then(|h| h.get("ce-origin"))
            .map(|v| v.as_str().as_bytes());
        // The bridge's read (the event's `time`) and the stream's store time.
        let read = message
            .headers
            .as_ref()
            .and_then(|h| h.get("ce-time"))
            .and_then(|v| {
                time::OffsetDateTime::parse(
                    v.as_str(),
                    &time::format_description::well_known::Rfc3339,
                )
                .ok()
            });
        let stored = match (read, message.info()) {
            (Some(read), Ok(info)) => Some((
                read.unix_timestamp_nanos() as u64,
                info.published.unix_timestamp_nanos() as u64,
            )),
            _ => None,
        };
        probe.observe(&message.payload, origin, stored).await;
    }
    Ok(())
}

fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1e6
}

impl Probe {
    fn new(run: &str) -> Probe {
        Probe {
            run: run.to_string(),
            samples: Mutex::new(Vec::new()),
            received: AtomicU64::new(0),
            snapshot_events: AtomicU64::new(0),
            stored: Mutex::new(Vec::new()),
        }
    }

    /// Patch → receipt p50 / p99 / max of what was received, for `applied` patches sent in
    /// `took` seconds; the samples too when `LATENCY_SAMPLES` asks.
    async fn figures(&self, applied: u64, took: f64) -> serde_json::Value {
        let timed = self.samples.lock().await.clone();
        let mut samples: Vec<u64> = timed.iter().map(|(_, latency)| *latency).collect();
        samples.sort_unstable();
        let mut figures = serde_json::json!({
            "patches": applied,
            "received": samples.len(),
            "rate": applied as f64 / took,
            "p50_ms": percentile(&samples, 0.50),
            "p99_ms": percentile(&samples, 0.99),
            "max_ms": percentile(&samples, 1.0),
            "snapshot_events": self.snapshot_events.load(Ordering::Relaxed),
        });
        let stored = self.stored.lock().await.clone();
        if !stored.is_empty() {
            let mut sorted: Vec<u64> = stored.iter().map(|(_, n)| *n).collect();
            sorted.sort_unstable();
            figures["stored_p50_ms"] = percentile(&sorted, 0.50).into();
            figures["stored_p99_ms"] = percentile(&sorted, 0.99).into();
        }
        // Every sample, for a caller pooling several probes' (`scripts/bench fleet`).
        match std::env::var("LATENCY_SAMPLES").as_deref() {
            // In receipt order, each with its patch time (seconds since the epoch).
            Ok("timed") => {
                figures["samples_ms"] = timed.iter().map(|(_, n)| *n as f64 / 1e6).collect();
                figures["sent_s"] = timed.iter().map(|(t, _)| *t as f64 / 1e9).collect();
                figures["stored_ms"] = stored.iter().map(|(_, n)| *n as f64 / 1e6).collect();
                figures["read_s"] = stored.iter().map(|(t, _)| *t as f64 / 1e9).collect();
            }
            Ok(_) => figures["samples_ms"] = samples.iter().map(|n| *n as f64 / 1e6).collect(),
            Err(_) => {}
        }
        figures
    }
}

/// What follows the sink's own arguments: namespace, objects, rate, seconds.
struct Churn {
    ns: String,
    objects: usize,
    rate: u64,
    seconds: u64,
}

impl Churn {
    fn parse(tail: &[String], usage: &str) -> anyhow::Result<Churn> {
        anyhow::ensure!(tail.len() == 4, usage.to_string());
        Ok(Churn {
            ns: tail[0].clone(),
            objects: tail[1].parse()?,
            rate: tail[2].parse()?,
            seconds: tail[3].parse()?,
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "latency kafka <bootstrap> <topic> <ns> <objects> <rate> <seconds> | latency nats <url> <stream> <filter> <ns> <objects> <rate> <seconds> | latency http <port> <path,...> <ns> <objects> <rate> <seconds>";
    let (sink, rest) = args.split_at(2.min(args.len()));
    let sink = sink.get(1).context(usage)?.clone();
    let run = format!("{:x}", now_nanos());
    let figures = match sink.as_str() {
        "kafka" | "nats" if rest.len() >= 2 => broker(&sink, rest, &run, usage).await?,
        "http" if rest.len() >= 2 => receiver(rest, &run, usage).await?,
        _ => anyhow::bail!(usage),
    };
    println!("{figures}");
    Ok(())
}

/// `latency kafka …` and `latency nats …`: a consumer of the broker.
async fn broker(
    sink: &str,
    rest: &[String],
    run: &str,
    usage: &str,
) -> anyhow::Result<serde_json::Value> {
    let skip = if sink == "kafka" { 2 } else { 3 };
    let churn = Churn::parse(rest.get(skip..).unwrap_or_default(), usage)?;
    let probe = Arc::new(Probe::new(run));
    let ready = Arc::new(AtomicBool::new(false));
    let consumer = match sink {
        "kafka" => tokio::spawn(consume_kafka(
            rest[0].clone(),
            rest[1].clone(),
            probe.clone(),
            ready.clone(),
        )),
        _ => tokio::spawn(consume_nats(
            rest[0].clone(),
            rest[1].clone(),
            rest[2].clone(),
            probe.clone(),
            ready.clone(),
        )),
    };
    while !ready.load(Ordering::Relaxed) {
        anyhow::ensure!(
            !consumer.is_finished(),
            "the consumer stopped: {:?}",
            consumer.await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The consumer resolves its starting offsets with its first fetch.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (applied, took) = patch(&churn.ns, churn.objects, churn.rate, churn.seconds, run).await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while probe.received.load(Ordering::Relaxed) < applied && std::time::Instant::now() < deadline {
        anyhow::ensure!(
            !consumer.is_finished(),
            "the consumer stopped: {:?}",
            consumer.await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(probe.figures(applied, took).await)
}

/// `latency http …`: the receiver of every path, then the same patches for all.
async fn receiver(rest: &[String], run: &str, usage: &str) -> anyhow::Result<serde_json::Value> {
    let churn = Churn::parse(&rest[2..], usage)?;
    let port: u16 = rest[0].parse().context("port")?;
    let paths: BTreeMap<String, http::Path> = rest[1]
        .split(',')
        .map(|p| {
            let path = http::Path {
                probe: Arc::new(Probe::new(run)),
                requests: AtomicU64::new(0),
            };
            (p.to_string(), path)
        })
        .collect();
    let paths = Arc::new(paths);
    let server = tokio::spawn(http::serve(port, paths.clone()));
    let ping: Api<ConfigMap> = Api::namespaced(kube::Client::try_default().await?, &churn.ns);
    http::wait_watching(&paths, &ping, Duration::from_secs(300)).await?;
    let (applied, took) = patch(&churn.ns, churn.objects, churn.rate, churn.seconds, run).await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let all_in = || {
        paths
            .values()
            .all(|p| p.probe.received.load(Ordering::Relaxed) >= applied)
    };
    while !all_in() && std::time::Instant::now() < deadline {
        anyhow::ensure!(
            !server.is_finished(),
            "the receiver stopped: {:?}",
            server.await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut figures = serde_json::Map::new();
    for (name, path) in paths.iter() {
        figures.insert(name.clone(), path.probe.figures(applied, took).await);
    }
    Ok(serde_json::json!({ "paths": figures }))
}
