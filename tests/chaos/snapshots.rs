//! Snapshots on demand asked during a round: at moments drawn from the seed, faults active or
//! not, a request ConfigMap for one of a deployment's watches is written to the deployment's own
//! request namespace (`snapshotRequests.namespace`, naming its cluster, which a fleet requires),
//! and once the round is quiet each request's phase and message are read back for the checker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::history::{Requested, WatchKey};
use crate::observe::Observer;
use crate::workload::{CRD_GROUP, CRD_PLURAL, Layout, Ledger};

/// The request's phase.
const PHASE: &str = "kube-event-bridge.dev/snapshot-phase";
/// The request's progress document (JSON, with `message`).
const STATUS: &str = "kube-event-bridge.dev/snapshot-status";
/// How long requests may take to end once the round is quiet (a snapshot of a few dozen
/// objects takes seconds once every fault is healed).
const FINISH: Duration = Duration::from_secs(60);

/// One deployment's side: where its requests go and which cluster they name.
pub struct Target {
    /// The deployment's `snapshotRequests.namespace`.
    pub namespace: String,
    /// Its checked cluster.
    pub cluster: String,
}

/// Asks the round's deployments for snapshots.
pub struct Asker {
    client: kube::Client,
    rng: StdRng,
    started: Instant,
    next: Instant,
    /// The watches snapshots are asked of: those whose namespace the workload never deletes.
    watches: Vec<WatchKey>,
    targets: Vec<Target>,
    /// What was asked, per deployment (in the order of the targets).
    pub requested: Vec<Vec<Requested>>,
}

impl Asker {
    /// An asker over `targets` whose choices follow `seed`.
    pub fn new(
        client: kube::Client,
        layout: &Layout,
        targets: Vec<Target>,
        seed: u64,
        started: Instant,
    ) -> Self {
        let keep = |w: &WatchKey| w.namespace == layout.plain[0] || w.namespace == layout.selected;
        let mut rng = StdRng::seed_from_u64(seed);
        let first = Duration::from_millis(rng.random_range(3_000..12_000));
        Asker {
            client,
            rng,
            started,
            next: Instant::now() + first,
            watches: layout.watches().into_iter().filter(keep).collect(),
            requested: targets.iter().map(|_| Vec::new()).collect(),
            targets,
        }
    }

    /// When due, writes one request for a deployment and a watch drawn at random (not while
    /// the API server is down on purpose: `hold`); a request the API server refuses is asked
    /// again at the next turn.
    pub async fn maybe_ask(&mut self, ledger: &Arc<Mutex<Ledger>>, hold: &AtomicBool) {
        if Instant::now() < self.next || hold.load(Ordering::Acquire) || self.targets.is_empty() {
            return;
        }
        let deployment = self.rng.random_range(0..self.targets.len());
        let watch = self.watches[self.rng.random_range(0..self.watches.len())].clone();
        let chunk = [2, 5, 50][self.rng.random_range(0..3)];
        self.next = Instant::now() + Duration::from_millis(self.rng.random_range(8_000..20_000));
        let target = &self.targets[deployment];
        let resource = if watch.resource == CRD_PLURAL {
            format!("{CRD_GROUP}/v1/{CRD_PLURAL}")
        } else {
            "v1/configmaps".to_string()
        };
        let request = json!({
            "metadata": {"generateName": "snapshot-", "labels": {"kube-event-bridge.dev/snapshot-request": "true"}},
            "data": {
                "resource": resource,
                "namespace": watch.namespace,
                "cluster": target.cluster,
                "chunkSize": chunk.to_string(),
            },
        });
        let request: ConfigMap = serde_json::from_value(request).expect("a request ConfigMap");
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &target.namespace);
        // Every write acknowledged so far came before the request.
        let writes_before = ledger.lock().unwrap().writes.len();
        let at_ms = self.started.elapsed().as_millis() as u64;
        let created = tokio::time::timeout(
            Duration::from_secs(5),
            api.create(&PostParams::default(), &request),
        )
        .await;
        let Ok(Ok(created)) = created else {
            // Unknown whether it exists: a request the campaign does not know of is read back
            // by nobody, and is harmless.
            self.next = Instant::now() + Duration::from_secs(1);
            return;
        };
        let name = created.metadata.name.unwrap_or_default();
        println!(
            "chaos: {:7.1}s snapshot: {name} of {watch} asked of deployment {deployment} (chunks of {chunk})",
            at_ms as f64 / 1000.0
        );
        self.requested[deployment].push(Requested {
            name,
            uid: created.metadata.uid.unwrap_or_default(),
            watch,
            at_ms,
            writes_before,
            phase: String::new(),
            message: None,
        });
    }

    /// Waits until every request ended (or [`FINISH`] passed) and each complete one's end
    /// marker reached its deployment's consumer, then records every request's phase and
    /// message.
    pub async fn finish(&mut self, observers: &[Observer]) {
        let deadline = Instant::now() + FINISH;
        loop {
            self.read_back().await;
            let done = self.requested.iter().enumerate().all(|(i, asked)| {
                let observed = observers[i].observed.lock().unwrap();
                asked.iter().all(|r| match r.phase.as_str() {
                    "Failed" => true,
                    "Complete" => observed
                        .markers
                        .iter()
                        .any(|m| m.snapshot == r.uid && m.end.is_some()),
                    _ => false,
                })
            });
            if done || Instant::now() > deadline {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    async fn read_back(&mut self) {
        for (target, asked) in self.targets.iter().zip(&mut self.requested) {
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &target.namespace);
            for r in asked.iter_mut() {
                let Ok(cm) = api.get(&r.name).await else {
                    continue;
                };
                let annotations = cm.metadata.annotations.unwrap_or_default();
                r.phase = annotations.get(PHASE).cloned().unwrap_or_default();
                r.message = annotations
                    .get(STATUS)
                    .and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok())
                    .and_then(|v| v["message"].as_str().map(str::to_string));
            }
        }
    }
}
