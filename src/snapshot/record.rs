//! A request's progress, written back on its ConfigMap as two annotations: [`PHASE`]
//! (`Running`, `Complete`, `Failed`; absent while pending) for `kubectl get -L`, and [`STATUS`],
//! a JSON document with the counts, the watch, and where the walk resumes. Written only after
//! the broker acknowledged what it counts, so a new owner of the watch resumes from it.

use serde::{Deserialize, Serialize};

/// The annotation holding the phase.
pub const PHASE: &str = "kube-event-bridge.dev/snapshot-phase";
/// The annotation holding the progress document.
pub const STATUS: &str = "kube-event-bridge.dev/snapshot-status";

/// Where a request stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// No replica has taken it yet.
    #[default]
    Pending,
    /// Its walk is going on.
    Running,
    /// Every object was read and decided; the end marker was published.
    Complete,
    /// It stopped; `message` says why.
    Failed,
}

impl Phase {
    /// Whether nothing more will happen.
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Complete | Phase::Failed)
    }

    /// The phase's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Complete => "Complete",
            Phase::Failed => "Failed",
        }
    }
}

/// The progress document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// The phase (also in [`PHASE`]).
    pub phase: Phase,
    /// The watch serving it, as its markers name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<String>,
    /// Objects the API server reported when the snapshot began; absent when it could not say
    /// (it gives no count for a list narrowed by a selector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<u64>,
    /// Objects published with `origin=snapshot`, acknowledged.
    #[serde(default)]
    pub sent: u64,
    /// Objects left out because a newer state or their delete was published since.
    #[serde(default)]
    pub skipped: u64,
    /// Tombstones published for keys the compacted destination held and the cluster no longer
    /// has (`prune`), acknowledged.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pruned: u64,
    /// Whether the begin marker was acknowledged.
    #[serde(default)]
    pub begun: bool,
    /// The LIST continue token of the next chunk.
    #[serde(default, rename = "continue", skip_serializing_if = "Option::is_none")]
    pub continue_token: Option<String>,
    /// How often the walk started over (its continue token had expired).
    #[serde(default)]
    pub restarts: u32,
    /// Why it failed, or what it is waiting for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The progress recorded in `annotations`; a request without one (or with one that cannot be
/// read) is pending.
pub fn read(annotations: Option<&std::collections::BTreeMap<String, String>>) -> Progress {
    annotations
        .and_then(|a| a.get(STATUS))
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default()
}

/// The merge patch that records `progress`.
pub fn patch(progress: &Progress) -> serde_json::Value {
    // A struct of strings, integers and options always serializes.
    let status = serde_json::to_string(progress).expect("progress serializes");
    serde_json::json!({
        "metadata": {"annotations": {PHASE: progress.phase.as_str(), STATUS: status}}
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_recorded_progress_reads_back() {
        let progress = Progress {
            phase: Phase::Running,
            watch: Some("dev/v1/configmaps/*".into()),
            expected: Some(10),
            sent: 4,
            skipped: 1,
            pruned: 2,
            begun: true,
            continue_token: Some("eyJ2Ijo".into()),
            restarts: 0,
            message: None,
        };
        let patch = patch(&progress);
        let annotations: BTreeMap<String, String> =
            serde_json::from_value(patch["metadata"]["annotations"].clone()).unwrap();
        assert_eq!(annotations[PHASE], "Running");
        assert!(annotations[STATUS].contains("\"continue\":\"eyJ2Ijo\""));
        assert_eq!(read(Some(&annotations)), progress);
    }

    #[test]
    fn no_record_or_an_unreadable_one_is_pending() {
        assert_eq!(read(None).phase, Phase::Pending);
        let garbage = BTreeMap::from([(STATUS.to_string(), "{not json".to_string())]);
        assert_eq!(read(Some(&garbage)), Progress::default());
        assert!(!Phase::Running.is_final() && Phase::Failed.is_final());
    }
}
