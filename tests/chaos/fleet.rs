//! The bystanders of fleet deployments: extra clusters (`scripts/testenv cluster`) that the
//! fleet deployments of a round discover from Cluster API kubeconfig Secrets, and that the
//! nemesis stops, pauses, kills, removes from the fleet (their Secret deleted, then created
//! again) and rotates (their Secret's kubeconfig rewritten). The checked cluster's promises must
//! hold through all of it, and at the end each bystander must publish again by itself.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::checker::Anomaly;
use crate::observe::Observer;
use crate::support::ExtraCluster;

/// How many bystanders a round with fleet deployments runs.
const BYSTANDERS: usize = 2;
/// How long a bystander may take to publish a probe once everything is healed.
const RECOVER: Duration = Duration::from_secs(90);

/// What a fault left to undo on one bystander.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberUndo {
    /// `cluster start` (after stop or kill).
    Start,
    /// `cluster resume` (after pause).
    Resume,
    /// Create its Secret again (after it was deleted).
    Rejoin,
}

/// The bystanders of one round.
pub struct Bystanders {
    clusters: Vec<ExtraCluster>,
    secrets: Api<Secret>,
    /// The namespace of their Secrets, in the checked cluster.
    pub namespace: String,
    /// Where the probe is written in each bystander.
    probe_namespace: String,
    /// Bystanders with a fault not undone yet.
    faulted: Vec<bool>,
}

impl Bystanders {
    /// Adds the bystander clusters, each with `probe_namespace`, and their Secrets in a new
    /// namespace of the checked cluster.
    pub async fn start(client: &kube::Client, probe_namespace: &str) -> Bystanders {
        let namespace = crate::support::unique_namespace(client, "chaos-fleet").await;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
        let mut clusters = Vec::new();
        for _ in 0..BYSTANDERS {
            let c = ExtraCluster::add("chaos-by").await;
            let ns: Namespace =
                serde_json::from_value(json!({"metadata": {"name": probe_namespace}})).unwrap();
            Api::<Namespace>::all(c.client().await)
                .create(&PostParams::default(), &ns)
                .await
                .unwrap_or_else(|e| panic!("namespace {probe_namespace} in {}: {e}", c.name));
            clusters.push(c);
        }
        let b = Bystanders {
            faulted: vec![false; clusters.len()],
            clusters,
            secrets,
            namespace,
            probe_namespace: probe_namespace.to_string(),
        };
        for i in 0..b.clusters.len() {
            b.join(i).await;
        }
        b
    }

    /// Their names.
    pub fn names(&self) -> Vec<String> {
        self.clusters.iter().map(|c| c.name.clone()).collect()
    }

    fn secret_name(&self, i: usize) -> String {
        format!("{}-kubeconfig", self.clusters[i].name)
    }

    /// Creates bystander `i`'s Secret (retrying while the API server restarts).
    async fn join(&self, i: usize) {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": self.secret_name(i)},
            "stringData": {"value": self.clusters[i].kubeconfig_text},
        }))
        .unwrap();
        retry(&format!("create Secret {}", self.secret_name(i)), || {
            let secret = secret.clone();
            async move {
                match self.secrets.create(&PostParams::default(), &secret).await {
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                    other => other.map(|_| ()),
                }
            }
        })
        .await;
    }

    /// Injects one fault into a bystander without one; returns its kind, detail and what
    /// undoes it (`None`: nothing to undo, or no bystander free).
    pub async fn fault(
        &mut self,
        roll: u32,
        length: Duration,
        pick: usize,
    ) -> Option<(&'static str, String, usize, Option<MemberUndo>)> {
        let free: Vec<usize> = (0..self.clusters.len())
            .filter(|i| !self.faulted[*i])
            .collect();
        let i = *free.get(pick % free.len().max(1))?;
        let c = &self.clusters[i];
        let (kind, undo) = match roll % 5 {
            0 => {
                c.stop().await;
                ("member-stop", Some(MemberUndo::Start))
            }
            1 => {
                c.signal("pause").await;
                ("member-pause", Some(MemberUndo::Resume))
            }
            2 => {
                c.signal("kill").await;
                ("member-kill", Some(MemberUndo::Start))
            }
            3 => {
                let name = self.secret_name(i);
                retry(&format!("delete Secret {name}"), || async {
                    match self.secrets.delete(&name, &DeleteParams::default()).await {
                        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                        other => other.map(|_| ()),
                    }
                })
                .await;
                ("member-leave", Some(MemberUndo::Rejoin))
            }
            _ => {
                let name = self.secret_name(i);
                let rotated = format!("{}\n# rotated {:?}\n", c.kubeconfig_text, Instant::now());
                let patch = Patch::Merge(json!({"stringData": {"value": rotated}}));
                retry(&format!("rotate Secret {name}"), || async {
                    self.secrets
                        .patch(&name, &PatchParams::default(), &patch)
                        .await
                        .map(|_| ())
                })
                .await;
                ("member-rotate", None)
            }
        };
        self.faulted[i] = undo.is_some();
        let detail = match undo {
            Some(_) => format!("{} for {length:.1?}", c.name),
            None => c.name.clone(),
        };
        Some((kind, detail, i, undo))
    }

    /// Undoes `undo` on bystander `i`.
    pub async fn undo(&mut self, i: usize, undo: MemberUndo) {
        let c = &self.clusters[i];
        match undo {
            MemberUndo::Start => c.start().await,
            MemberUndo::Resume => c.signal("resume").await,
            MemberUndo::Rejoin => self.join(i).await,
        }
        self.faulted[i] = false;
    }

    /// Writes a probe ConfigMap into each bystander and waits until every observer of a fleet
    /// deployment received its event: a member that does not publish again by itself once
    /// everything is healed is an anomaly.
    pub async fn probe(
        &self,
        round: usize,
        observers: &[(usize, &Observer)],
    ) -> Vec<(usize, Anomaly)> {
        let name = format!("probe-{round}");
        for c in &self.clusters {
            let cm: ConfigMap =
                serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
            let api = Api::<ConfigMap>::namespaced(c.client().await, &self.probe_namespace);
            retry(&format!("probe in {}", c.name), || async {
                match api.create(&PostParams::default(), &cm).await {
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                    other => other.map(|_| ()),
                }
            })
            .await;
        }
        let deadline = Instant::now() + RECOVER;
        let missing = |observers: &[(usize, &Observer)]| -> Vec<(usize, String)> {
            let mut out = Vec::new();
            for (d, o) in observers {
                let o = o.observed.lock().unwrap();
                for c in &self.clusters {
                    let seen = o.others.get(&c.name).is_some_and(|n| n.contains(&name));
                    if !seen {
                        out.push((*d, c.name.clone()));
                    }
                }
            }
            out
        };
        loop {
            let left = missing(observers);
            if left.is_empty() || Instant::now() > deadline {
                return left
                    .into_iter()
                    .map(|(d, cluster)| {
                        let detail = format!(
                            "bystander {cluster} published no event of ConfigMap {}/{name} within {RECOVER:?} of the end of every fault",
                            self.probe_namespace
                        );
                        (
                            d,
                            Anomaly {
                                kind: "member-not-recovered",
                                watch: format!("configmaps/{}", self.probe_namespace),
                                object: name.clone(),
                                uid: String::new(),
                                ids: Vec::new(),
                                detail,
                            },
                        )
                    })
                    .collect();
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Runs `f` until it succeeds, for at most a minute (the API server may be restarting).
async fn retry<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), kube::Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match f().await {
            Ok(()) => return,
            Err(e) if Instant::now() > deadline => panic!("{what}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}
