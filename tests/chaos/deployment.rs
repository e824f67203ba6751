//! One deployment of the bridge under test: a sink, a mode (one replica, leader election, or
//! sharding) and its replicas, run from the built binary with their logs kept in the run's
//! directory. A replica that exits is started again after a second, as the kubelet would.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::workload::Layout;

/// Which sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Sink {
    /// Kafka, transactional.
    Kafka,
    /// NATS JetStream.
    Nats,
    /// HTTP to a receiver of the campaign.
    Http,
}

impl Sink {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Sink::Kafka => "kafka",
            Sink::Nats => "nats",
            Sink::Http => "http",
        }
    }
}

/// How the replicas share the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    /// One replica.
    Single,
    /// Two replicas, leader election.
    Leader,
    /// Three replicas (two to three while replicas leave and join), sharding.
    Sharded,
    /// Two replicas sharing the watches of a fleet (sharding): the checked cluster, named in
    /// `clusters[]`, and the bystanders of [`crate::fleet::Bystanders`], from their Secrets.
    Fleet,
}

impl Mode {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Single => "single",
            Mode::Leader => "leader",
            Mode::Sharded => "sharded",
            Mode::Fleet => "fleet",
        }
    }

    /// Replicas at the start.
    pub fn replicas(self) -> usize {
        match self {
            Mode::Single => 1,
            Mode::Leader => 2,
            Mode::Sharded => 3,
            Mode::Fleet => 2,
        }
    }

    /// The Lease duration the mode's configuration sets (seconds).
    pub fn lease_secs(self) -> u64 {
        match self {
            Mode::Single => 0,
            Mode::Leader | Mode::Sharded | Mode::Fleet => 4,
        }
    }
}

/// The Kafka transaction timeout of the campaign's configuration: outages and pauses of the
/// broker are drawn both shorter and longer than it.
pub const KAFKA_TRANSACTION_TIMEOUT_SECS: u64 = 10;

/// One replica process.
pub struct Replica {
    /// Its number within the deployment (never reused).
    pub number: usize,
    child: Option<Child>,
    /// Its JSON log.
    pub log: PathBuf,
    /// Whether it is stopped with SIGSTOP.
    pub paused: bool,
    /// Its admin address, once read from the log.
    admin: Option<String>,
    /// When the nemesis last stopped, killed or paused it.
    pub touched: Option<Instant>,
}

impl Replica {
    fn start(config: &Path, log: PathBuf, number: usize) -> Replica {
        // `KEB_CHAOS_BIN` runs another build (a copy, so that rebuilding meanwhile is safe).
        let bin = std::env::var("KEB_CHAOS_BIN").unwrap_or_else(|_| crate::harness::bin().into());
        let child = Command::new(bin)
            .args(["--log-format", "json", "run", "--config"])
            .arg(config)
            .env("RUST_LOG", "info,kube_event_bridge=debug")
            .env("POD_NAME", format!("replica-{number}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start kube-event-bridge");
        Replica {
            number,
            child: Some(child),
            log,
            paused: false,
            admin: None,
            touched: None,
        }
    }

    /// Sends a signal (`KILL`, `STOP`, `CONT`, `TERM`).
    pub fn signal(&mut self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(child.id().to_string())
                .status();
        }
        match signal {
            "STOP" => self.paused = true,
            "CONT" => self.paused = false,
            _ => {}
        }
        self.touched = Some(Instant::now());
    }

    /// The exit status, if it exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn admin_address(&mut self) -> Option<String> {
        if self.admin.is_none() {
            self.admin = self
                .log_text()
                .lines()
                .find(|l| l.contains("\"message\":\"admin server listening\""))
                .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .and_then(|v| v["address"].as_str().map(str::to_string));
        }
        self.admin.clone()
    }

    /// `/readyz`: `Some((status, body))`, `None` when it does not answer (paused, gone).
    pub async fn readyz(&mut self) -> Option<(u16, String)> {
        if self.paused || self.exited().is_some() {
            return None;
        }
        let address = self.admin_address()?;
        let get = crate::harness::try_get(&address, "/readyz");
        tokio::time::timeout(Duration::from_secs(2), get)
            .await
            .ok()?
            .ok()
    }

    fn count_log(&self, message: &str, also: &str) -> usize {
        let needle = format!("\"message\":\"{message}\"");
        self.log_text()
            .lines()
            .filter(|l| l.contains(&needle) && l.contains(also))
            .count()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One deployment: its configuration and replicas.
pub struct Deployment {
    /// `sink/mode`.
    pub name: String,
    /// The sink.
    pub sink: Sink,
    /// The mode.
    pub mode: Mode,
    /// The cluster whose events are checked (its name in the configuration).
    pub cluster: String,
    config: PathBuf,
    dir: PathBuf,
    /// Live replicas.
    pub replicas: Vec<Replica>,
    /// Replicas gone (killed, left or exited), kept for their logs.
    pub gone: Vec<Replica>,
    next: usize,
    /// Exits nobody caused: (replica, status, last error line).
    pub unexpected_exits: Vec<(usize, String, String)>,
    /// Exits by design (a leader that lost its Lease): (replica, last line).
    pub designed_exits: Vec<(usize, String)>,
}

impl Deployment {
    /// Writes the configuration into `dir` and starts the mode's replicas. `sink_yaml` is the
    /// `sink:` section; a fleet finds its bystanders' Secrets in `secrets`; snapshot requests
    /// are read in `requests` (every destination of the campaign is the watch's own: a Kafka
    /// topic per resource, the HTTP receiver's one URL, NATS subjects with `_watch` markers).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        sink: Sink,
        mode: Mode,
        cluster: &str,
        layout: &Layout,
        sink_yaml: &str,
        dir: &Path,
        secrets: Option<&str>,
        requests: &str,
    ) -> Deployment {
        std::fs::create_dir_all(dir).expect("deployment directory");
        let compacted = (sink == Sink::Kafka).then(|| format!("chaos.{cluster}.compacted"));
        let mut config = format!(
            "cluster: {cluster}\nkubernetes: {{kubeconfig: \"{}\"}}\n{}{sink_yaml}admin: {{address: \"127.0.0.1:0\"}}\n",
            crate::support::env().kubeconfig,
            layout.resources_yaml(compacted.as_deref()),
        );
        config.push_str(&checkpoint_yaml(sink, mode, dir));
        config.push_str(&format!("snapshotRequests: {{namespace: {requests}}}\n"));
        config.push_str(&match mode {
            Mode::Single => String::new(),
            Mode::Leader => format!(
                "leaderElection: {{enabled: true, namespace: default, leaseDurationSecs: {}, retryPeriodSecs: 1}}\n",
                mode.lease_secs()
            ),
            Mode::Sharded | Mode::Fleet => format!(
                "sharding: {{enabled: true, namespace: default, leaseDurationSecs: {}, renewSecs: 1}}\n",
                mode.lease_secs()
            ),
        });
        if mode == Mode::Fleet {
            let secrets = secrets.expect("a fleet deployment needs its bystanders' Secrets");
            config.push_str(&format!(
                "clusters: [{{name: {cluster}}}]\nclusterSecrets: {{namespace: {secrets}}}\n"
            ));
        }
        let path = dir.join("bridge.yaml");
        std::fs::write(&path, config).expect("write config");
        let mut d = Deployment {
            name: format!("{}/{}", sink.name(), mode.name()),
            sink,
            mode,
            cluster: cluster.to_string(),
            config: path,
            dir: dir.to_path_buf(),
            replicas: Vec::new(),
            gone: Vec::new(),
            next: 0,
            unexpected_exits: Vec::new(),
            designed_exits: Vec::new(),
        };
        for _ in 0..mode.replicas() {
            d.add_replica();
        }
        d
    }

    /// Starts one more replica.
    pub fn add_replica(&mut self) {
        let number = self.next;
        self.next += 1;
        let log = self.dir.join(format!("replica-{number}.log"));
        self.replicas
            .push(Replica::start(&self.config, log, number));
    }

    /// Waits until the replicas together published the initial state of `watches` watches (of
    /// the checked cluster, in a fleet: its log lines name it).
    pub async fn wait_synced(&mut self, watches: usize, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let of_cluster = match self.mode {
            Mode::Fleet => format!("\"cluster\":\"{}\"", self.cluster),
            _ => String::new(),
        };
        loop {
            let synced: usize = self
                .replicas
                .iter()
                .map(|r| r.count_log("initial state published", &of_cluster))
                .sum();
            if synced >= watches {
                return Ok(());
            }
            if let Some(r) = self.replicas.iter_mut().find_map(|r| r.exited().map(|_| r)) {
                return Err(format!(
                    "{}: replica {} exited before syncing:\n{}",
                    self.name,
                    r.number,
                    tail(&r.log_text(), 40)
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{}: {synced} of {watches} watches synced after {timeout:?}",
                    self.name
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Restarts replicas that exited on their own (after a second, as the kubelet would) and
    /// records the exits the nemesis did not cause.
    pub fn reap(&mut self) {
        let mut i = 0;
        while i < self.replicas.len() {
            let Some(status) = self.replicas[i].exited() else {
                i += 1;
                continue;
            };
            let r = self.replicas.remove(i);
            let caused = r.touched.is_some_and(|t| {
                t.elapsed() < Duration::from_secs(4 * self.mode.lease_secs() + 10)
            });
            let last_line = r
                .log_text()
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or_default()
                .to_string();
            // A leader that could not renew its Lease exits by design (docs/guarantees.md): the
            // restart waits as a follower.
            let designed = last_line.contains("leadership lost");
            if designed {
                self.designed_exits.push((r.number, last_line));
            } else if !caused {
                let last_error = r
                    .log_text()
                    .lines()
                    .rev()
                    .find(|l| l.contains("\"level\":\"ERROR\""))
                    .unwrap_or_default()
                    .to_string();
                let last_error = format!("{last_error}; last lines:\n{}", tail(&r.log_text(), 3));
                self.unexpected_exits
                    .push((r.number, status.to_string(), last_error));
            }
            self.gone.push(r);
            self.add_replica();
        }
    }

    /// Removes replica `index` from the live ones (after the nemesis killed or stopped it).
    pub fn retire(&mut self, index: usize) {
        let r = self.replicas.remove(index);
        self.gone.push(r);
    }

    /// Whether the retired replica `number` has exited.
    pub fn gone_exited(&mut self, number: usize) -> bool {
        self.gone
            .iter_mut()
            .find(|r| r.number == number)
            .is_none_or(|r| r.exited().is_some())
    }

    /// Log lines of every replica mentioning `needle`, at most `max`, the newest last.
    pub fn log_lines(&self, needle: &str, max: usize) -> Vec<String> {
        let mut lines = Vec::new();
        for r in self.replicas.iter().chain(&self.gone) {
            for l in r.log_text().lines().filter(|l| l.contains(needle)) {
                lines.push(format!("replica-{}: {l}", r.number));
            }
        }
        let skip = lines.len().saturating_sub(max);
        lines.split_off(skip)
    }
}

/// The `checkpoint:` section: Kafka and NATS keep checkpoints with their sink; the HTTP sink
/// keeps them in files for one replica, in a NATS bucket every replica reaches for several.
fn checkpoint_yaml(sink: Sink, mode: Mode, dir: &Path) -> String {
    match (sink, mode) {
        (Sink::Http, Mode::Single) => format!(
            "checkpoint: {{intervalMs: 200, directory: \"{}\"}}\n",
            dir.join("checkpoints").display()
        ),
        (Sink::Http, _) => format!(
            "checkpoint: {{intervalMs: 200, nats: {{url: \"{}\"}}}}\n",
            crate::support::env().nats_url
        ),
        _ => "checkpoint: {intervalMs: 200}\n".to_string(),
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
