//! Running the real `kube-event-bridge` binary in tests, and reading what it published with real
//! clients: Kafka consumers (read committed), JetStream consumers, or its standard output.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cloudevents::{AttributesReader, Event};
use futures::StreamExt;
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::support::{self, env};

/// The bridge binary built by cargo for this test run.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_kube-event-bridge")
}

/// Which sink a scenario runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkKind {
    /// Kafka, binary content mode.
    Kafka,
    /// NATS JetStream, binary content mode.
    Nats,
    /// Standard output (structured JSON lines).
    Stdout,
    /// HTTP, binary content mode, to a receiver in the test process
    /// ([`crate::receiver::for_cluster`]).
    Http,
}

/// The `sink:` section for `kind`, isolated by `cluster` (topic and subject carry it; the NATS
/// stream is named after it).
pub fn sink_yaml(kind: SinkKind, cluster: &str) -> String {
    let e = env();
    match kind {
        SinkKind::Kafka => format!(
            "sink:\n  kafka:\n    bootstrapServers: \"{}\"\n    topic: \"k8s.{{cluster}}.{{group}}.{{resource}}\"\n",
            e.kafka_bootstrap
        ),
        SinkKind::Nats => format!(
            "sink:\n  nats:\n    url: \"{}\"\n    subject: \"k8s.{{cluster}}.{{group}}.{{resource}}.{{namespace}}.{{name}}\"\n    jetstream: {{stream: \"{}\", create: true}}\n",
            e.nats_url,
            stream_name(cluster)
        ),
        SinkKind::Stdout => "sink:\n  stdout: {}\n".into(),
        SinkKind::Http => format!(
            "sink:\n  http:\n    url: \"{}\"\n",
            crate::receiver::for_cluster(cluster).url()
        ),
    }
}

/// What the `checkpoint` section needs for `kind` besides its settings (`, directory: ...`
/// for the HTTP sink: a directory kept across restarts of the bridges of `cluster`).
pub fn checkpoint_extra(kind: SinkKind, cluster: &str) -> String {
    match kind {
        SinkKind::Http => format!(
            ", directory: \"{}\"",
            std::env::temp_dir()
                .join(format!("keb-checkpoints-{cluster}"))
                .display()
        ),
        _ => String::new(),
    }
}

/// The JetStream stream a test's bridge publishes to.
pub fn stream_name(cluster: &str) -> String {
    format!("KEB_{}", cluster.replace(['-', '.'], "_"))
}

/// A running bridge process; killed when dropped.
pub struct Bridge {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// Its JSON log (standard error).
    pub log: PathBuf,
    /// Its standard output (events, for the stdout sink).
    pub stdout: PathBuf,
}

impl Bridge {
    /// Writes `config` to a file and starts `kube-event-bridge run` on it, logging JSON.
    pub fn start(config: &str) -> Bridge {
        Self::start_with_env(config, &[])
    }

    /// [`Bridge::start`] with these environment variables set.
    pub fn start_with_env(config: &str, vars: &[(&str, &str)]) -> Bridge {
        Self::start_via(config, |dir| {
            let mut command = Command::new(bin());
            command
                .args(["--log-format", "json", "run", "--config"])
                .arg(dir.join("bridge.yaml"))
                .env("RUST_LOG", "info,kube_event_bridge=debug")
                .envs(vars.iter().copied());
            command
        })
    }

    /// Writes `config` to `bridge.yaml` in a new directory and starts the process `command`
    /// makes of that directory (it must log JSON): the bridge run another way, from the image's
    /// root filesystem for example.
    pub fn start_via(config: &str, command: impl FnOnce(&Path) -> Command) -> Bridge {
        let mut config = config.to_string();
        if !config.contains("\nadmin:") {
            // Tests bind only to loopback, on a free port (read back with `admin_address`).
            config.push_str("admin: {address: \"127.0.0.1:0\"}\n");
        }
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("bridge.yaml"), config).expect("write config");
        let log = dir.path().join("bridge.log");
        let stdout = dir.path().join("stdout.jsonl");
        let child = command(dir.path())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start kube-event-bridge");
        Bridge {
            child: Some(child),
            dir,
            log,
            stdout,
        }
    }

    /// The directory holding its files (config, log, stdout).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The admin server's address, once it is listening.
    pub async fn admin_address(&self) -> String {
        crate::support::wait_until(
            "the admin server listens",
            Duration::from_secs(30),
            || async {
                self.log_text()
                    .lines()
                    .find(|l| l.contains("\"message\":\"admin server listening\""))
                    .and_then(|l| {
                        let v: serde_json::Value = serde_json::from_str(l).ok()?;
                        v["address"].as_str().map(str::to_string)
                    })
            },
        )
        .await
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How many log lines carry `message`.
    pub fn count_log(&self, message: &str) -> usize {
        let needle = format!("\"message\":\"{message}\"");
        self.log_text()
            .lines()
            .filter(|l| l.contains(&needle))
            .count()
    }

    /// Waits up to a minute until a log line carries `message`; panics naming it otherwise.
    pub async fn wait_log(&self, message: &str) {
        crate::support::wait_until(
            &format!("the log says {message:?}"),
            Duration::from_secs(60),
            || async { (self.count_log(message) > 0).then_some(()) },
        )
        .await;
    }

    /// Waits until `watches` watches have published their initial state; panics with the log if
    /// the process exits or time runs out.
    pub async fn wait_synced(&mut self, watches: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.count_log("initial state published") >= watches {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "bridge exited with {status} before syncing; log:\n{}",
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "bridge did not sync {watches} watches in 60s; log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The process's id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the bridge runs").id()
    }

    /// The process's peak resident memory so far (`VmHWM`), in bytes.
    pub fn peak_rss(&self) -> u64 {
        let pid = self.pid();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_else(|e| panic!("cannot read /proc/{pid}/status: {e}"));
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .expect("VmHWM in /proc/PID/status")
    }

    /// Sends `signal` (`TERM`, `KILL`, `STOP`, `CONT`) to the process.
    pub fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let ok = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(child.id().to_string())
                .status()
                .expect("kill")
                .success();
            assert!(ok, "kill -{signal} failed");
        }
    }

    /// Waits for the process to exit, up to `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut()?.try_wait().ok().flatten() {
                self.child = None;
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        None
    }
}

/// How long a bridge dropped by its test gets to exit on SIGTERM before it is killed.
const DROP_GRACE: Duration = Duration::from_secs(5);

/// Ends a bridge its test no longer needs with SIGTERM (and SIGCONT, should it be stopped), and
/// SIGKILL only after [`DROP_GRACE`]. A Kafka bridge killed while a transaction is open leaves
/// that transaction holding back every `read_committed` reader of the shared checkpoint topic
/// until the broker aborts it (the transaction timeout, a minute by default): every Kafka bridge
/// the suite starts meanwhile waits that long to load its checkpoints.
fn stop_gracefully(mut child: Child) {
    let pid = child.id().to_string();
    for signal in ["-TERM", "-CONT"] {
        let _ = Command::new("kill").args([signal, &pid]).status();
    }
    let deadline = Instant::now() + DROP_GRACE;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Bridge {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            stop_gracefully(child);
        }
        if let Ok(dir) = std::env::var("KEB_KEEP_LOGS") {
            // Investigations keep every bridge's log: `KEB_KEEP_LOGS=/some/dir`.
            let name = self.dir.path().file_name().unwrap_or_default();
            let name = format!("{}.log", name.to_string_lossy().trim_start_matches('.'));
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::copy(&self.log, Path::new(&dir).join(name));
        }
        if std::thread::panicking() {
            // A failing test shows what the bridge it ran last was doing.
            let log = self.log_text();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(300)..];
            eprintln!(
                "--- last {} lines of the bridge's log ({}):\n{}\n---",
                tail.len(),
                self.log.display(),
                tail.join("\n")
            );
        }
    }
}

/// Moves every file checkpoint in `dir` (of a stopped bridge) to resourceVersion `rv`, as an
/// etcd restore or long downtime would leave it: the meta record of each base file, and each
/// journal line that ends a checkpoint. The last checkpoint in the journal is the one loaded,
/// and a bookmark saved after the base writes one, so setting the base alone is not enough.
/// Returns how many watches' checkpoints were moved.
pub fn set_file_checkpoints_rv(dir: &Path, rv: &str) -> usize {
    let mut bases = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let base = name.ends_with(".checkpoint");
        if !base && !name.ends_with(".checkpoint.journal") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        let records = if base {
            &mut lines[..1]
        } else {
            &mut lines[..]
        };
        for line in records {
            let mut record: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}: not a JSON record ({e}): {line}", path.display()));
            if base || record.get("resourceVersion").is_some() {
                assert!(
                    record["resourceVersion"].is_string(),
                    "{}: no resourceVersion in {line}",
                    path.display()
                );
                record["resourceVersion"] = rv.into();
                *line = record.to_string();
            }
        }
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        bases += usize::from(base);
    }
    bases
}

/// Runs the binary with `args` to completion: (status, stdout, stderr).
pub fn run_cli(args: &[&str]) -> (ExitStatus, String, String) {
    let out = Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run kube-event-bridge");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One event as a consumer received it.
#[derive(Debug, Clone)]
pub struct Received {
    /// The decoded CloudEvent.
    pub event: Event,
    /// Kafka record key.
    pub key: Option<String>,
    /// Kafka topic or NATS subject.
    pub destination: String,
    /// Raw headers (Kafka or NATS).
    pub headers: BTreeMap<String, String>,
}

impl Received {
    /// An extension attribute as a string ("" if absent).
    pub fn ext(&self, name: &str) -> String {
        self.event
            .extension(name)
            .map(|v| v.to_string())
            .unwrap_or_default()
    }

    /// The change: `added`, `modified` or `deleted`.
    pub fn change(&self) -> &str {
        self.event.ty().rsplit('.').next().unwrap_or_default()
    }

    /// The object (`data`).
    pub fn data(&self) -> serde_json::Value {
        match self.event.data() {
            Some(cloudevents::Data::Json(v)) => v.clone(),
            Some(cloudevents::Data::String(s)) => serde_json::from_str(s).unwrap_or_default(),
            Some(cloudevents::Data::Binary(b)) => serde_json::from_slice(b).unwrap_or_default(),
            None => serde_json::Value::Null,
        }
    }

    /// The resourceVersion as a number.
    pub fn rv(&self) -> u64 {
        self.ext("resourceversion")
            .parse()
            .expect("numeric resourceVersion")
    }
}

/// Reads what a bridge published.
pub enum Reader {
    /// A Kafka consumer (read committed, from the earliest offset).
    Kafka(StreamConsumer),
    /// A JetStream ordered consumer over the whole stream.
    Nats(Box<async_nats::jetstream::consumer::pull::Ordered>),
    /// The bridge's standard output file and how many lines were consumed.
    Stdout(PathBuf, usize),
    /// What an HTTP receiver accepted and how many events were consumed.
    Http(crate::receiver::Receiver, usize),
}

impl Reader {
    /// A consumer of `topics` (created first, 3 partitions each).
    pub async fn kafka(topics: &[String]) -> Reader {
        for t in topics {
            support::create_topic(t, 3).await;
        }
        let consumer = support::kafka_consumer(&support::unique_name("reader"));
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        consumer.subscribe(&names).expect("subscribe");
        Reader::Kafka(consumer)
    }

    /// An ordered consumer over the stream the bridge of `cluster` created.
    pub async fn nats(cluster: &str) -> Reader {
        Reader::nats_via(support::nats_client().await, cluster).await
    }

    /// An ordered consumer over the stream of `cluster` on the server `client` reached.
    pub async fn nats_via(client: async_nats::Client, cluster: &str) -> Reader {
        let js = async_nats::jetstream::new(client);
        let stream = support::wait_until(
            "the bridge's JetStream stream exists",
            Duration::from_secs(30),
            || {
                let js = js.clone();
                let name = stream_name(cluster);
                async move { js.get_stream(name).await.ok() }
            },
        )
        .await;
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
            .await
            .expect("ordered consumer");
        Reader::Nats(Box::new(
            consumer.messages().await.expect("consumer messages"),
        ))
    }

    /// Reads the bridge's standard output.
    pub fn stdout(bridge: &Bridge) -> Reader {
        Reader::Stdout(bridge.stdout.clone(), 0)
    }

    /// The reader for `kind`.
    pub async fn for_sink(
        kind: SinkKind,
        cluster: &str,
        topics: &[String],
        bridge: &Bridge,
    ) -> Reader {
        match kind {
            SinkKind::Kafka => Reader::kafka(topics).await,
            SinkKind::Nats => Reader::nats(cluster).await,
            SinkKind::Stdout => Reader::stdout(bridge),
            SinkKind::Http => Reader::Http(crate::receiver::for_cluster(cluster), 0),
        }
    }

    /// The next event, or `None` after `wait` without one.
    pub async fn next(&mut self, wait: Duration) -> Option<Received> {
        match self {
            Reader::Kafka(c) => {
                let m = tokio::time::timeout(wait, c.recv())
                    .await
                    .ok()?
                    .expect("kafka receive");
                let mut headers = BTreeMap::new();
                if let Some(h) = rdkafka::message::Message::headers(&m) {
                    use rdkafka::message::Headers;
                    for x in h.iter() {
                        headers.insert(
                            x.key.to_string(),
                            String::from_utf8_lossy(x.value.unwrap_or_default()).into_owned(),
                        );
                    }
                }
                let event = kube_event_bridge::tail::decode_kafka(&m).expect("a CloudEvent");
                Some(Received {
                    event,
                    key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                    destination: m.topic().to_string(),
                    headers,
                })
            }
            Reader::Nats(messages) => {
                let m = tokio::time::timeout(wait, messages.next())
                    .await
                    .ok()??
                    .expect("nats receive");
                let mut headers = BTreeMap::new();
                if let Some(h) = &m.headers {
                    for (k, v) in h.iter() {
                        headers.insert(
                            k.to_string(),
                            v.first().map(|x| x.to_string()).unwrap_or_default(),
                        );
                    }
                }
                let event = kube_event_bridge::tail::decode_nats(&m.message).expect("a CloudEvent");
                Some(Received {
                    event,
                    key: None,
                    destination: m.subject.to_string(),
                    headers,
                })
            }
            Reader::Http(receiver, consumed) => {
                let deadline = Instant::now() + wait;
                loop {
                    if let Some(r) = receiver.accepted_at(*consumed) {
                        *consumed += 1;
                        return Some(r);
                    }
                    if Instant::now() >= deadline {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Reader::Stdout(path, consumed) => {
                let deadline = Instant::now() + wait;
                loop {
                    let text = std::fs::read_to_string(&*path).unwrap_or_default();
                    let complete: Vec<&str> = text
                        .split_inclusive('\n')
                        .filter(|l| l.ends_with('\n'))
                        .collect();
                    if let Some(line) = complete.get(*consumed) {
                        *consumed += 1;
                        let event: Event =
                            serde_json::from_str(line.trim_end()).expect("a structured CloudEvent");
                        return Some(Received {
                            event,
                            key: None,
                            destination: "stdout".into(),
                            headers: BTreeMap::new(),
                        });
                    }
                    if Instant::now() >= deadline {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    /// Reads until `done` holds for what was read, or panics after `timeout` showing what arrived.
    pub async fn read_until(
        &mut self,
        timeout: Duration,
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::new();
        while !done(&got) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "timed out; received {} events:\n{}",
                got.len(),
                summary(&got)
            );
            if let Some(r) = self.next(left.min(Duration::from_millis(500))).await {
                got.push(r);
            }
        }
        got
    }

    /// Reads whatever arrives within `quiet` of the last event.
    pub async fn drain(&mut self, quiet: Duration) -> Vec<Received> {
        let mut got = Vec::new();
        while let Some(r) = self.next(quiet).await {
            got.push(r);
        }
        got
    }
}

/// One line per event: change, subject, resourceVersion, origin.
pub fn summary(events: &[Received]) -> String {
    events
        .iter()
        .map(|r| {
            format!(
                "  {} {} rv={} origin={}",
                r.change(),
                r.event.subject().unwrap_or_default(),
                r.ext("resourceversion"),
                r.ext("origin")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A TCP proxy in front of the API server whose connections a test can cut, to prove that the
/// bridge resumes its watches from the last resourceVersion after a dropped connection.
pub struct Proxy {
    /// The loopback port it listens on.
    pub port: u16,
    cut: Arc<tokio::sync::Notify>,
    stop: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream` (`host:port`).
    pub async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let cut = Arc::new(tokio::sync::Notify::new());
        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(AtomicBool::new(false));
        let (cut2, stop2, paused2) = (cut.clone(), stop.clone(), paused.clone());
        tokio::spawn(async move {
            while !stop2.load(Ordering::Relaxed) {
                let Ok((mut client, _)) = listener.accept().await else {
                    break;
                };
                if paused2.load(Ordering::Relaxed) {
                    continue;
                }
                let upstream = upstream.clone();
                let cut = cut2.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        () = cut.notified() => {
                            let _ = client.shutdown().await;
                        }
                    }
                });
            }
        });
        Proxy {
            port,
            cut,
            stop,
            paused,
        }
    }

    /// While paused, every connection is cut and new ones are closed at once: the bridge sees
    /// nothing, as during a network partition.
    pub fn pause(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
        if paused {
            self.cut_all();
        }
    }

    /// Cuts every open connection (new ones are still accepted).
    pub fn cut_all(&self) {
        self.cut.notify_waiters();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A copy of the test kubeconfig whose server is `127.0.0.1:port` (TLS still verifies: the
/// serving certificate is for 127.0.0.1).
pub fn kubeconfig_via(port: u16, dir: &Path) -> (PathBuf, String) {
    let text = std::fs::read_to_string(env().kubeconfig).expect("read kubeconfig");
    let mut doc: serde_json::Value = serde_saphyr::from_str(&text).expect("parse kubeconfig");
    let server = doc["clusters"][0]["cluster"]["server"]
        .as_str()
        .expect("server")
        .to_string();
    let upstream = server.trim_start_matches("https://").to_string();
    doc["clusters"][0]["cluster"]["server"] = format!("https://127.0.0.1:{port}").into();
    let path = dir.join("kubeconfig-via-proxy");
    std::fs::write(&path, serde_json::to_string(&doc).expect("json")).expect("write kubeconfig");
    (path, upstream)
}

/// GET `path` from `address` on a new connection: (status code, body).
pub async fn get(address: &str, path: &str) -> (u16, String) {
    try_get(address, path)
        .await
        .unwrap_or_else(|e| panic!("GET {path} from the admin server at {address}: {e}"))
}

/// GET `path` from `address` on a new connection (closed after the response), or why not
/// within 10 s.
pub async fn try_get(address: &str, path: &str) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(address).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(request.as_bytes()).await?;
        let mut text = String::new();
        s.read_to_string(&mut text).await?;
        Ok::<_, std::io::Error>(text)
    };
    let text = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| "no response within 10 s".to_string())?
        .map_err(|e| e.to_string())?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}
