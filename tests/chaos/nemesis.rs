//! The nemesis: faults chosen with the seed and undone after a random time. Replicas are
//! killed (SIGKILL, then started again as the kubelet would), paused (SIGSTOP, sometimes past
//! their Lease), stopped in order and joined; Kafka and NATS are stopped, killed and paused (Kafka
//! sometimes past the transaction timeout); the API server restarts; etcd compacts its history;
//! HTTP receivers answer 5xx, 429 with `Retry-After`, slowly, not at all, or drop connections;
//! the bystanders of fleet deployments are stopped, paused, killed, removed from the fleet and
//! rotated ([`crate::fleet`]).

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::deployment::{Deployment, KAFKA_TRANSACTION_TIMEOUT_SECS, Mode, Sink};
use crate::fleet::{Bystanders, MemberUndo};
use crate::receiver::{Receiver, Reply};

/// One fault as it was injected.
#[derive(Debug, Clone, Serialize)]
pub struct Injected {
    /// Seconds since the round started.
    pub at_secs: f64,
    /// Its kind (the report counts these).
    pub kind: String,
    /// What exactly.
    pub detail: String,
}

/// Something to undo later.
enum Undo {
    Resume {
        deployment: usize,
        number: usize,
    },
    Restart {
        deployment: usize,
    },
    RestartAfterExit {
        deployment: usize,
        number: usize,
    },
    Component {
        verb: &'static str,
        name: &'static str,
    },
    Receiver {
        deployment: usize,
    },
    Member {
        index: usize,
        undo: MemberUndo,
    },
}

/// The nemesis of one round.
pub struct Nemesis {
    rng: StdRng,
    started: Instant,
    undo: Vec<(Instant, Undo)>,
    /// Components are faulted one at a time: the next may start after this.
    component_free: Instant,
    /// Faults injected.
    pub injected: Vec<Injected>,
    hold: Arc<AtomicBool>,
    /// The bystanders of the round's fleet deployments, if it has any.
    pub bystanders: Option<Bystanders>,
    /// Bystanders are faulted one at a time: the next may start after this.
    member_free: Instant,
}

impl Nemesis {
    /// A nemesis whose choices follow `seed`; `hold` stops the workload's writes while the API
    /// server is down on purpose.
    pub fn new(seed: u64, started: Instant, hold: Arc<AtomicBool>) -> Self {
        Nemesis {
            rng: StdRng::seed_from_u64(seed),
            started,
            undo: Vec::new(),
            component_free: Instant::now(),
            injected: Vec::new(),
            hold,
            bystanders: None,
            member_free: Instant::now(),
        }
    }

    /// When the round started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Set while the API server is down on purpose.
    pub fn hold(&self) -> Arc<AtomicBool> {
        self.hold.clone()
    }

    fn note(&mut self, kind: &str, detail: String) {
        let at_secs = (self.started.elapsed().as_millis() as f64) / 1000.0;
        println!("chaos: {at_secs:7.1}s {kind}: {detail}");
        self.injected.push(Injected {
            at_secs,
            kind: kind.to_string(),
            detail,
        });
    }

    fn secs(&mut self, low: f64, high: f64) -> Duration {
        Duration::from_secs_f64(self.rng.random_range(low..high))
    }

    /// Injects one fault into `deployments` (receivers by deployment index).
    pub async fn strike(
        &mut self,
        deployments: &mut [Deployment],
        receivers: &BTreeMap<usize, Receiver>,
    ) {
        let component_free = Instant::now() >= self.component_free;
        let member_free = self.bystanders.is_some() && Instant::now() >= self.member_free;
        let roll = self.rng.random_range(0..100);
        match roll {
            0..=44 => self.replica_fault(deployments),
            45..=59 if !receivers.is_empty() => self.receiver_fault(receivers),
            60..=84 if member_free => self.member_fault().await,
            _ if component_free => self.component_fault(deployments).await,
            _ => self.replica_fault(deployments),
        }
    }

    fn replica_fault(&mut self, deployments: &mut [Deployment]) {
        let d = self.rng.random_range(0..deployments.len());
        let deployment = &mut deployments[d];
        if deployment.replicas.is_empty() {
            return;
        }
        let i = self.rng.random_range(0..deployment.replicas.len());
        let lease = Duration::from_secs(deployment.mode.lease_secs().max(4));
        let name = deployment.name.clone();
        let number = deployment.replicas[i].number;
        let sharded = deployment.mode == Mode::Sharded;
        let live = deployment.replicas.len();
        match self.rng.random_range(0..10) {
            0..=3 => {
                deployment.replicas[i].signal("KILL");
                deployment.retire(i);
                let after = self.secs(0.5, 5.0);
                self.undo
                    .push((Instant::now() + after, Undo::Restart { deployment: d }));
                self.note(
                    "replica-kill",
                    format!("{name} replica {number}, back after {after:.1?}"),
                );
            }
            4..=6 => {
                let long = self.rng.random_bool(0.4);
                let pause = if long {
                    lease + self.secs(0.5, 4.0)
                } else {
                    self.secs(0.3, 2.5)
                };
                deployment.replicas[i].signal("STOP");
                self.undo.push((
                    Instant::now() + pause,
                    Undo::Resume {
                        deployment: d,
                        number,
                    },
                ));
                let kind = if long {
                    "replica-pause-past-lease"
                } else {
                    "replica-pause"
                };
                self.note(kind, format!("{name} replica {number} for {pause:.1?}"));
            }
            7 | 8 if sharded && live > 2 => {
                deployment.replicas[i].signal("TERM");
                deployment.retire(i);
                let after = self.secs(2.0, 10.0);
                self.undo
                    .push((Instant::now() + after, Undo::Restart { deployment: d }));
                self.note(
                    "replica-leave",
                    format!("{name} replica {number}, one joins after {after:.1?}"),
                );
            }
            _ if sharded && live < 4 => {
                deployment.add_replica();
                self.note("replica-join", format!("{name} now {} replicas", live + 1));
            }
            _ => {
                deployment.replicas[i].signal("TERM");
                deployment.retire(i);
                let after = self.secs(0.5, 3.0);
                // One replica is replaced as the chart's Recreate strategy does: the new pod
                // starts once the old one has exited.
                let undo = if deployment.mode == Mode::Single {
                    Undo::RestartAfterExit {
                        deployment: d,
                        number,
                    }
                } else {
                    Undo::Restart { deployment: d }
                };
                self.undo.push((Instant::now() + after, undo));
                self.note(
                    "replica-sigterm",
                    format!("{name} replica {number}, back after {after:.1?}"),
                );
            }
        }
    }

    fn receiver_fault(&mut self, receivers: &BTreeMap<usize, Receiver>) {
        let keys: Vec<usize> = receivers.keys().copied().collect();
        let d = keys[self.rng.random_range(0..keys.len())];
        let (kind, reply, share) = match self.rng.random_range(0..5) {
            0 => ("receiver-5xx", Reply::Status(503), 2),
            1 => (
                "receiver-429-retry-after",
                Reply::RetryAfter(429, "2".into()),
                1,
            ),
            2 => ("receiver-slow", Reply::Slow(Duration::from_millis(1500)), 2),
            3 => ("receiver-no-answer", Reply::Slow(Duration::from_secs(8)), 3),
            _ => ("receiver-drops", Reply::Drop, 2),
        };
        let length = self.secs(2.0, 12.0);
        let mut n = 0u64;
        receivers[&d].script(move |_| {
            n += 1;
            if n.is_multiple_of(share) {
                Reply::Accept
            } else {
                reply.clone()
            }
        });
        self.undo
            .push((Instant::now() + length, Undo::Receiver { deployment: d }));
        self.note(kind, format!("deployment {d} for {length:.1?}"));
    }

    async fn component_fault(&mut self, deployments: &[Deployment]) {
        let kafka = deployments.iter().any(|d| d.sink == Sink::Kafka);
        let nats = deployments.iter().any(|d| d.sink == Sink::Nats);
        let roll = self.rng.random_range(0..10);
        let broker = match (kafka, nats) {
            (true, true) => Some(if self.rng.random_bool(0.5) {
                "kafka"
            } else {
                "nats"
            }),
            (true, false) => Some("kafka"),
            (false, true) => Some("nats"),
            _ => None,
        };
        match (roll, broker) {
            (0..=1, _) => self.restart_apiserver().await,
            (2..=3, _) => self.compact_etcd().await,
            (4..=5, Some(b)) => {
                let long = b == "kafka" && self.rng.random_bool(0.5);
                let length = if long {
                    Duration::from_secs(KAFKA_TRANSACTION_TIMEOUT_SECS) + self.secs(1.0, 6.0)
                } else {
                    self.secs(1.0, 8.0)
                };
                testenv("pause", b).await;
                self.component(b, "resume", length);
                let kind = if long {
                    "broker-pause-past-transaction-timeout"
                } else {
                    "broker-pause"
                };
                self.note(kind, format!("{b} for {length:.1?}"));
            }
            (6..=7, Some(b)) => {
                testenv("stop", b).await;
                let length = self.secs(1.0, 15.0);
                self.component(b, "start", length);
                self.note("broker-stop", format!("{b} for {length:.1?}"));
            }
            (_, Some(b)) => {
                testenv("kill", b).await;
                let length = self.secs(0.5, 6.0);
                self.component(b, "start", length);
                self.note("broker-kill", format!("{b}, back after {length:.1?}"));
            }
            (_, None) => self.compact_etcd().await,
        }
    }

    async fn member_fault(&mut self) {
        let roll = self.rng.random_range(0..5);
        let pick = self.rng.random_range(0..8);
        let length = self.secs(1.0, 12.0);
        let Some(bystanders) = self.bystanders.as_mut() else {
            return;
        };
        let Some((kind, detail, index, undo)) = bystanders.fault(roll, length, pick).await else {
            return;
        };
        self.member_free = Instant::now() + length + Duration::from_secs(1);
        if let Some(undo) = undo {
            self.undo
                .push((Instant::now() + length, Undo::Member { index, undo }));
        }
        self.note(kind, detail);
    }

    fn component(&mut self, name: &'static str, verb: &'static str, after: Duration) {
        let at = Instant::now() + after;
        self.component_free = at + Duration::from_secs(3);
        self.undo.push((at, Undo::Component { verb, name }));
    }

    async fn restart_apiserver(&mut self) {
        self.hold.store(true, Ordering::Release);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let down = self.secs(0.5, 4.0);
        testenv("stop", "kube-apiserver").await;
        tokio::time::sleep(down).await;
        testenv("start", "kube-apiserver").await;
        self.hold.store(false, Ordering::Release);
        self.component_free = Instant::now() + Duration::from_secs(3);
        self.note(
            "apiserver-restart",
            format!("down for {down:.1?} plus its start"),
        );
    }

    async fn compact_etcd(&mut self) {
        match compact().await {
            Ok(revision) => self.note("etcd-compaction", format!("to revision {revision}")),
            Err(e) => self.note("etcd-compaction-failed", e),
        }
    }

    /// Undoes what is due; with `all`, everything.
    pub async fn heal(
        &mut self,
        deployments: &mut [Deployment],
        receivers: &BTreeMap<usize, Receiver>,
        all: bool,
    ) {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.undo)
            .into_iter()
            .partition(|(at, _)| all || *at <= now);
        self.undo = later;
        for (_, undo) in due {
            match undo {
                Undo::Resume { deployment, number } => {
                    if let Some(r) = deployments[deployment]
                        .replicas
                        .iter_mut()
                        .find(|r| r.number == number)
                    {
                        r.signal("CONT");
                    }
                }
                Undo::Restart { deployment } => deployments[deployment].add_replica(),
                Undo::RestartAfterExit { deployment, number } => {
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while all
                        && !deployments[deployment].gone_exited(number)
                        && Instant::now() < deadline
                    {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    if all || deployments[deployment].gone_exited(number) {
                        deployments[deployment].add_replica();
                    } else {
                        let later = Instant::now() + Duration::from_millis(200);
                        self.undo
                            .push((later, Undo::RestartAfterExit { deployment, number }));
                    }
                }
                Undo::Component { verb, name } => testenv(verb, name).await,
                Undo::Receiver { deployment } => receivers[&deployment].script(|_| Reply::Accept),
                Undo::Member { index, undo } => {
                    if let Some(b) = self.bystanders.as_mut() {
                        b.undo(index, undo).await;
                    }
                }
            }
        }
    }
}

/// Runs `scripts/testenv VERB NAME`, panicking if it fails (the environment is broken).
pub async fn testenv(verb: &'static str, name: &'static str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/testenv");
    let ok = tokio::task::spawn_blocking(move || {
        Command::new(script)
            .args([verb, name])
            .status()
            .is_ok_and(|s| s.success())
    })
    .await
    .expect("testenv task");
    assert!(ok, "scripts/testenv {verb} {name} failed");
}

/// Compacts etcd's history up to its current revision (through etcd's JSON gateway), so that a
/// watch resuming from an older resourceVersion meets 410 Gone.
async fn compact() -> Result<i64, String> {
    let url = std::env::var("KEB_ETCD_URL").map_err(|_| "KEB_ETCD_URL is not set".to_string())?;
    kube_event_bridge::tls::install_crypto_provider();
    let client = reqwest::Client::new();
    let post = |path: &str, body: serde_json::Value| {
        client
            .post(format!("{url}{path}"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let range = post("/v3/kv/range", serde_json::json!({"key": "AA=="}))
        .await
        .map_err(|e| e.to_string())?
        .text()
        .await
        .map_err(|e| e.to_string())?;
    let value: serde_json::Value = serde_json::from_str(&range).map_err(|e| e.to_string())?;
    let revision: i64 = value["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .ok_or_else(|| format!("no revision in {range}"))?;
    let answer = post(
        "/v3/kv/compaction",
        serde_json::json!({"revision": revision.to_string(), "physical": true}),
    )
    .await
    .map_err(|e| e.to_string())?;
    if !answer.status().is_success() {
        return Err(format!("compaction answered {}", answer.status()));
    }
    Ok(revision)
}
