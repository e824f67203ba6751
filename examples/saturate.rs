//! Saturation benchmark for `scripts/bench saturation`: recorded watch events pushed through the
//! bridge's real path (decode → classify and digest → encode → publish → acknowledgement →
//! checkpoint) into the real broker as fast as it takes them, with no API server in the loop.
//!
//! `saturate record <namespace> <file> <events>` writes the raw watch stream of the ConfigMaps in
//! `<namespace>` (one line per event, the bytes the API server sent), from the namespace's
//! current resourceVersion, until `<events>` events; it prints `recording` once the watch is open.
//!
//! `saturate run <config> <file> <runs>` replays the recording `<runs>` times, each time as a new
//! watch (a fresh checkpoint key, so a fresh index and, for Kafka, a fresh transactional id) of
//! the config's first resource: an empty list, then every recorded event decoded from its line.
//! Each run prints (on stderr: stdout is the stdout sink's) events, wall seconds, CPU seconds of this process (every thread, broker
//! clients included) and events per second per core (events / CPU seconds).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail, ensure};
use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, ListParams, WatchEvent};
use kube_event_bridge::budget::{self, Budget};
use kube_event_bridge::change::ChangeKind;
use kube_event_bridge::checkpoint::WatchKey;
use kube_event_bridge::config::ConfigFile;
use kube_event_bridge::encode::ResourceInfo;
use kube_event_bridge::pipeline::{self, Pipeline};
use kube_event_bridge::sink;
use kube_event_bridge::status::Status;
use kube_event_bridge::stores::Stores;
use kube_event_bridge::tasks::Tasks;
use kube_event_bridge::watch::Item;
use kube_event_bridge::{discovery, kubernetes};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

/// The bridge's allocator, as in `src/main.rs`.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The runtime as the bridge builds it (`src/main.rs`): `KEB_WORKER_THREADS` workers, one by
/// default, with the pipeline and the watch's feed as tasks on them.
fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let workers = match std::env::var("KEB_WORKER_THREADS") {
        Ok(n) => n.parse().context("KEB_WORKER_THREADS")?,
        Err(_) => 1,
    };
    kube_event_bridge::allocator::thread_cache_on();
    let runtime = kube_event_bridge::allocator::async_runtime(workers)?;
    let args: Vec<String> = std::env::args().collect();
    runtime.block_on(async {
        match args.get(1).map(String::as_str) {
            Some("record") if args.len() == 5 => {
                record(&args[2], &args[3], args[4].parse()?).await
            }
            Some("run") if args.len() == 5 => run(&args[2], &args[3], args[4].parse()?).await,
            _ => bail!(
                "usage: saturate record <namespace> <file> <events> | saturate run <config> <file> <runs>"
            ),
        }
    })
}

/// Writes the first line (`{"listResourceVersion": ...}`) and then `events` raw watch lines.
async fn record(namespace: &str, file: &str, events: usize) -> anyhow::Result<()> {
    let client = kube::Client::try_default().await?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let listed = api.list_metadata(&ListParams::default().limit(1)).await?;
    let rv = listed
        .metadata
        .resource_version
        .context("list without resourceVersion")?;
    let mut out = tokio::io::BufWriter::new(tokio::fs::File::create(file).await?);
    out.write_all(format!("{{\"listResourceVersion\":\"{rv}\"}}\n").as_bytes())
        .await?;
    let (mut written, mut from, mut announced) = (0, rv, false);
    // The API server may end a watch at any time: it is reopened from the last recorded event.
    while written < events {
        let path = format!(
            "/api/v1/namespaces/{namespace}/configmaps?watch=true&resourceVersion={from}&timeoutSeconds=3600"
        );
        let request = hyper::Request::get(path).body(Vec::new())?;
        let mut lines = client.request_stream(request).await?.lines();
        if !announced {
            println!("recording");
            announced = true;
        }
        while written < events {
            let Some(line) = lines.next().await.transpose()? else {
                break;
            };
            let event: serde_json::Value = serde_json::from_str(&line)?;
            ensure!(event["type"] != "ERROR", "the watch failed: {line}");
            from = event["object"]["metadata"]["resourceVersion"]
                .as_str()
                .context("an event without resourceVersion")?
                .to_owned();
            out.write_all(line.as_bytes()).await?;
            out.write_all(b"\n").await?;
            written += 1;
        }
    }
    out.flush().await?;
    println!("recorded {written} events");
    Ok(())
}

/// The recording: the list's resourceVersion and the raw event lines.
struct Recording {
    list_rv: String,
    lines: Arc<Vec<String>>,
}

fn load(file: &Path) -> anyhow::Result<Recording> {
    let text = std::fs::read_to_string(file)?;
    let mut lines = text.lines();
    let header: serde_json::Value = serde_json::from_str(lines.next().context("empty file")?)?;
    let list_rv = header["listResourceVersion"]
        .as_str()
        .context("first line lacks listResourceVersion")?
        .to_owned();
    Ok(Recording {
        list_rv,
        lines: Arc::new(lines.map(str::to_owned).collect()),
    })
}

async fn run(config: &str, file: &str, runs: usize) -> anyhow::Result<()> {
    let recording = load(Path::new(file))?;
    let config = ConfigFile::load(Path::new(config))?.validate()?;
    let (client, api_server) = kubernetes::client_and_url(&config.kubernetes).await?;
    let resources = discovery::resolve(&client, &config.resources).await?;
    let resource = resources.first().context("the config watches nothing")?;
    let shared = sink::connect(&config.sink).await?;
    shared.prepare(&config.cluster, &resources).await?;
    let stores = Stores::prepare(&config, &shared, &client).await?;
    let tasks = Tasks::default();
    let stamp = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_millis();
    for run in 1..=runs {
        let key = WatchKey::for_scope(
            &config.cluster,
            resource,
            Some(&format!("saturate-{stamp}-{run}")),
        );
        let (sink, mut store) = stores.for_watch(&shared, &key, None).await?;
        let mut info = ResourceInfo::new(&config.cluster, resource, &api_server);
        if let Some(uid) = stores.cluster_uid().filter(|_| config.audit_extensions) {
            info = info.with_audit(uid);
        }
        let info = Arc::new(info);
        store.set_redacted(info.redacts());
        let status = Arc::new(Status::default());
        let resume = store.load(&status.checkpoints_corrupt).await?;
        ensure!(
            resume.is_none(),
            "run {run}: a fresh watch has a checkpoint"
        );
        let (tx, unmetered) = mpsc::channel(1);
        let budget = Budget::new(config.delivery.max_queue_bytes);
        let rx = budget::metered(
            unmetered,
            config.delivery.queue_capacity,
            budget.clone(),
            pipeline::item_bytes,
            &tasks,
        );
        let pipeline = Pipeline {
            info,
            events: resource.config.events.clone(),
            sink,
            max_in_flight: config.delivery.max_in_flight,
            status: status.clone(),
            store,
            resume,
            snapshot: config.initial_snapshot,
            checkpoint_interval: Duration::from_millis(config.checkpoint.interval_ms),
            leadership: None,
            heartbeat: None,
            watch: pipeline::WatchIdentity {
                key: key.clone(),
                namespace: None,
            },
            demands: None,
            budget: Some(budget),
        };
        let (cpu, wall) = (cpu_seconds()?, Instant::now());
        let feeder = tokio::spawn(feed(recording.list_rv.clone(), recording.lines.clone(), tx));
        tokio::spawn(pipeline.run(rx)).await??;
        let fed = feeder.await??;
        let (cpu, wall) = (cpu_seconds()? - cpu, wall.elapsed().as_secs_f64());
        let published: u64 = status
            .published
            .iter()
            .map(|p| p.load(Ordering::Relaxed))
            .sum();
        ensure!(
            published == fed,
            "run {run}: fed {fed} events, {published} published"
        );
        eprintln!(
            "run {run}: {fed} events, {wall:.2} s, {cpu:.2} CPU s, {:.0} events/s, {:.0} events/s per core",
            fed as f64 / wall,
            fed as f64 / cpu
        );
    }
    Ok(())
}

/// Sends an empty list, then every recorded event decoded as the watch decodes it; returns how
/// many events were sent.
async fn feed(
    list_rv: String,
    lines: Arc<Vec<String>>,
    tx: mpsc::Sender<Item>,
) -> anyhow::Result<u64> {
    tx.send(Item::ListBegin).await?;
    tx.send(Item::ListEnd(list_rv)).await?;
    let mut sent = 0;
    for line in lines.iter() {
        let (kind, object) = match serde_json::from_str::<WatchEvent<DynamicObject>>(line)? {
            WatchEvent::Added(o) => (ChangeKind::Added, o),
            WatchEvent::Modified(o) => (ChangeKind::Modified, o),
            WatchEvent::Deleted(o) => (ChangeKind::Deleted, o),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => bail!("the recording holds a watch error: {e}"),
        };
        tx.send(Item::Event(kind, Box::new(object), SystemTime::now()))
            .await?;
        sent += 1;
    }
    Ok(sent)
}

/// User plus system CPU seconds of this process, every thread included (Linux, USER_HZ = 100).
fn cpu_seconds() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("/proc/self/stat")?
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    Ok(ticks as f64 / 100.0)
}
