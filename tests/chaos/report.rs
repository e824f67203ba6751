//! The campaign's report: printed, and written as JSON beside the bridges' logs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::Settings;
use crate::round::RoundReport;

/// The whole campaign.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The seed to replay it.
    pub seed: u64,
    /// The length asked for, seconds.
    pub seconds: u64,
    /// Faults by kind, over every round.
    pub faults: BTreeMap<String, u64>,
    /// Acknowledged writes.
    pub writes: usize,
    /// Events received and checked, over every deployment.
    pub events: usize,
    /// The rounds.
    pub rounds: Vec<RoundReport>,
}

impl Report {
    /// Sums the rounds.
    pub fn new(settings: &Settings, rounds: Vec<RoundReport>) -> Report {
        let mut faults = BTreeMap::new();
        for f in rounds.iter().flat_map(|r| &r.faults) {
            *faults.entry(f.kind.clone()).or_default() += 1;
        }
        Report {
            seed: settings.seed,
            seconds: settings.seconds,
            faults,
            writes: rounds.iter().map(|r| r.writes).sum(),
            events: rounds.iter().flat_map(|r| r.events.values()).sum(),
            rounds,
        }
    }

    /// How many anomalies were found.
    pub fn anomalies(&self) -> usize {
        self.rounds.iter().map(|r| r.anomalies.len()).sum()
    }

    /// Writes `report.json` into `dir`.
    pub fn write(&self, dir: &Path) -> PathBuf {
        std::fs::create_dir_all(dir).expect("report directory");
        let path = dir.join("report.json");
        let text = serde_json::to_string_pretty(self).expect("report json");
        std::fs::write(&path, text).expect("write report");
        path
    }

    /// A few lines for people.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "chaos: seed {}, {} rounds, {} writes, {} events checked, {} anomalies\nchaos: faults:",
            self.seed,
            self.rounds.len(),
            self.writes,
            self.events,
            self.anomalies()
        );
        for (kind, n) in &self.faults {
            out.push_str(&format!(" {kind}={n}"));
        }
        for r in &self.rounds {
            out.push_str(&format!(
                "\nchaos: round {} [{}]: {} writes, settled {:?}",
                r.round,
                r.deployments.join(", "),
                r.writes,
                r.settled_secs
            ));
            let mut phases: BTreeMap<&str, usize> = BTreeMap::new();
            for (_, phase, _, _) in r.snapshots.values().flatten() {
                *phases.entry(phase.as_str()).or_default() += 1;
            }
            if !phases.is_empty() {
                out.push_str(&format!(", snapshots {phases:?}"));
            }
            // Not an anomaly (a marker may be sent again after a crash), but worth seeing.
            for (deployment, asked) in &r.snapshots {
                for (name, phase, begins, ends) in asked.iter().filter(|a| a.3 > 1) {
                    out.push_str(&format!(
                        "\n  snapshot {deployment} {name} {phase}: its markers arrived {begins} (begin) and {ends} (end) times"
                    ));
                }
            }
            for a in &r.anomalies {
                out.push_str(&format!(
                    "\n  ANOMALY {} {} {} {} {}: {} {:?}",
                    a.deployment,
                    a.anomaly.kind,
                    a.anomaly.watch,
                    a.anomaly.object,
                    a.anomaly.uid,
                    a.anomaly.detail,
                    a.anomaly.ids
                ));
                for l in &a.log {
                    out.push_str(&format!("\n    {l}"));
                }
            }
        }
        out
    }
}
