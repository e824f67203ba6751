//! The fault campaign (`scripts/chaos`): a seeded workload writes to the real API server while a
//! nemesis injects faults into the bridge's replicas and the real components, and a checker
//! that knows nothing of the bridge's internals decides, from what consumers received and what
//! the API server holds, whether every promise of docs/guarantees.md held.
//!
//! Settings come from the environment (`scripts/chaos` sets them from its arguments):
//! `KEB_CHAOS_SECONDS` (default 300), `KEB_CHAOS_SEED` (default: from the clock, printed),
//! `KEB_CHAOS_SINKS` (`kafka,nats,http`), `KEB_CHAOS_MODES` (`single,leader,sharded,fleet`),
//! `KEB_CHAOS_DIR` (where the report and the bridges' logs go; default `target/chaos`),
//! `KEB_CHAOS_BIN` (the bridge binary; default the one cargo built).
//! Any anomaly fails the run.

mod checker;
mod deployment;
mod fleet;
#[path = "../integration/harness.rs"]
mod harness;
mod history;
mod nemesis;
mod observe;
#[path = "../integration/receiver.rs"]
mod receiver;
mod report;
mod round;
mod snapshots;
#[path = "../integration/support.rs"]
mod support;
mod workload;

use std::path::PathBuf;
use std::time::Duration;

use deployment::{Mode, Sink};

/// The campaign's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Total length, seconds.
    pub seconds: u64,
    /// The seed of every random choice.
    pub seed: u64,
    /// Sinks to cover.
    pub sinks: Vec<Sink>,
    /// Modes to cover.
    pub modes: Vec<Mode>,
    /// Report and logs.
    pub dir: PathBuf,
}

impl Settings {
    fn from_env() -> Result<Settings, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let seconds = match var("KEB_CHAOS_SECONDS") {
            Some(v) => v
                .parse()
                .map_err(|_| format!("KEB_CHAOS_SECONDS: {v:?} is not a number of seconds"))?,
            None => 300,
        };
        let seed = match var("KEB_CHAOS_SEED") {
            Some(v) => v
                .parse()
                .map_err(|_| format!("KEB_CHAOS_SEED: {v:?} is not an unsigned integer"))?,
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs()),
        };
        let sinks = list(var("KEB_CHAOS_SINKS"), "KEB_CHAOS_SINKS", |s| match s {
            "kafka" => Some(Sink::Kafka),
            "nats" => Some(Sink::Nats),
            "http" => Some(Sink::Http),
            _ => None,
        })?;
        let modes = list(var("KEB_CHAOS_MODES"), "KEB_CHAOS_MODES", |s| match s {
            "single" => Some(Mode::Single),
            "leader" => Some(Mode::Leader),
            "sharded" => Some(Mode::Sharded),
            "fleet" => Some(Mode::Fleet),
            _ => None,
        })?;
        let dir = var("KEB_CHAOS_DIR").map_or_else(
            || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/chaos")),
            PathBuf::from,
        );
        Ok(Settings {
            seconds,
            seed,
            sinks,
            modes,
            dir,
        })
    }

    /// The rounds: each runs every sink at once, sink `i` in mode `(i + round) % modes`, so
    /// that every sink meets every mode over `modes` rounds. Rounds last about `seconds / 3`,
    /// between 60 and 180 s.
    pub fn rounds(&self) -> Vec<(Vec<(Sink, Mode)>, Duration)> {
        let length = (self.seconds / 3).clamp(60, 180);
        let count = (self.seconds / length).max(1);
        (0..count as usize)
            .map(|r| {
                let pairs = self
                    .sinks
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (*s, self.modes[(i + r) % self.modes.len()]))
                    .collect();
                (pairs, Duration::from_secs(length))
            })
            .collect()
    }
}

/// Parses a comma-separated list (`all` or unset: every value).
fn list<T: Copy>(
    value: Option<String>,
    name: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Vec<T>, String> {
    let every = [
        "kafka", "nats", "http", "single", "leader", "sharded", "fleet",
    ];
    let value = value.unwrap_or_else(|| "all".into());
    let words: Vec<&str> = if value == "all" {
        every
            .iter()
            .copied()
            .filter(|w| parse(w).is_some())
            .collect()
    } else {
        value.split(',').map(str::trim).collect()
    };
    words
        .into_iter()
        .map(|w| parse(w).ok_or_else(|| format!("{name}: {w:?} is not one of {value}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn campaign() {
    let settings = Settings::from_env().unwrap_or_else(|e| panic!("{e}"));
    println!(
        "chaos: seed {} for {} s over sinks {:?} and modes {:?}; replay with scripts/chaos {} --seed {}",
        settings.seed,
        settings.seconds,
        settings.sinks,
        settings.modes,
        settings.seconds,
        settings.seed
    );
    let run_dir = settings.dir.join(format!("seed-{}", settings.seed));
    let mut rounds = Vec::new();
    for (i, (pairs, length)) in settings.rounds().into_iter().enumerate() {
        let seed = settings.seed.wrapping_mul(1_000_003).wrapping_add(i as u64);
        let dir = run_dir.join(format!("round-{i}"));
        let round = round::run(i, seed, &pairs, length, &dir).await;
        println!(
            "chaos: round {i} done: {} writes, {} faults, {} anomalies, settled {:?}",
            round.writes,
            round.faults.len(),
            round.anomalies.len(),
            round.settled_secs
        );
        for a in &round.anomalies {
            let detail: String = a.anomaly.detail.chars().take(400).collect();
            println!(
                "chaos:   ANOMALY {} {} {} {}: {detail}",
                a.deployment, a.anomaly.kind, a.anomaly.watch, a.anomaly.object
            );
        }
        rounds.push(round);
    }
    let report = report::Report::new(&settings, rounds);
    let path = report.write(&run_dir);
    println!("{}", report.summary());
    println!("chaos: report written to {}", path.display());
    assert!(
        report.anomalies() == 0,
        "the campaign found {} anomalies (seed {}); see {}",
        report.anomalies(),
        settings.seed,
        path.display()
    );
}
