//! A fleet: many clusters watched by one process. Each cluster is a member with its own client
//! (and throttle), identity, checkpoint stores, discovery and [`Supervisor`](crate::supervisor)
//! ([`member`]); they share the sink, the leadership or the shard, and the process's tasks.
//! The members are the clusters of `clusters[]` and those of Cluster API's kubeconfig Secrets
//! ([`secret`]), followed while running: a new Secret starts its cluster, a deleted one stops it
//! cleanly (its checkpoints kept), a rotated kubeconfig restarts it from its checkpoints.
//!
//! One cluster's trouble is never another's: a member that cannot start or fails is named to
//! the [`Observer`] (readiness, metrics) and tried again with backoff, alone. Two members that
//! turn out to be the same cluster (the same `kube-system` uid) are refused, naming both.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::budget::Budget;
use crate::config::{Access, Config};
use crate::lease::Validity;
use crate::shard::Shard;
use crate::sink::AnySink;
use crate::supervisor::{self, WatchHandle};
use crate::tasks::Tasks;
use crate::{discovery, kubernetes, stores};

mod member;
pub mod secret;

use secret::{Discovered, Found, Refusal};

/// Why a member does not publish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Its client could not be built.
    #[error(transparent)]
    Kubernetes(#[from] kubernetes::Error),
    /// Its checkpoint store or identity could not be read.
    #[error(transparent)]
    Stores(#[from] stores::Error),
    /// Its discovery failed.
    #[error(transparent)]
    Discovery(#[from] discovery::Error),
    /// Its watches could not start, or failed for good.
    #[error(transparent)]
    Supervisor(#[from] supervisor::Error),
    /// It did not answer in time.
    #[error("unreachable: no answer within {secs} s")]
    Unreachable {
        /// How long it waited.
        secs: u64,
    },
    /// Its watches did not start in time.
    #[error("its watches did not start within {secs} s")]
    StartTimeout {
        /// How long it waited.
        secs: u64,
    },
    /// Another member is the same cluster.
    #[error(
        "refused: the same cluster as {other:?} (namespace kube-system has uid {uid} in both); each cluster is listed once"
    )]
    SameCluster {
        /// The member already holding the identity.
        other: String,
        /// The `kube-system` uid.
        uid: String,
    },
}

/// What a fleet tells the outside (the admin server): each cluster's watches, why it does not
/// publish, and that it left.
pub trait Observer: Send + Sync {
    /// The running watches of `cluster` (again whenever they change).
    fn watches(&self, cluster: &str, watches: Vec<WatchHandle>);
    /// Why `cluster` does not publish, or `None` once it does.
    fn problem(&self, cluster: &str, problem: Option<String>);
    /// `cluster` left the fleet.
    fn left(&self, cluster: &str);
}

/// The fleet's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Secrets refused, by [`Refusal::ALL`]'s order.
    pub refused: [AtomicU64; Refusal::ALL.len()],
    /// Members running (started, possibly retrying).
    pub members: AtomicU64,
}

/// How a member is reached.
#[derive(Clone, Debug)]
pub enum Reach {
    /// A `clusters[]` entry.
    Configured(Access),
    /// A kubeconfig Secret.
    Secret(Box<Discovered>),
}

impl Reach {
    /// Changes when the member must restart to take it (a rotated kubeconfig).
    fn digest(&self) -> u64 {
        match self {
            Reach::Configured(_) => 0,
            Reach::Secret(d) => d.digest,
        }
    }
}

/// What every member shares.
pub struct Shared {
    /// The whole configuration; each member takes its cluster's part.
    pub config: Arc<Config>,
    /// The connected sink.
    pub sink: Arc<AnySink>,
    /// Told about each cluster.
    pub observer: Arc<dyn Observer>,
    /// Held leadership, with leader election.
    pub leadership: Option<Validity>,
    /// This replica's part, with sharding: the unit shared is one cluster's watch.
    pub shard: Option<Shard>,
    /// Where followers and forwarders are spawned.
    pub tasks: Tasks,
    /// The counters.
    pub metrics: Arc<Metrics>,
    /// The process's byte budget (`delivery.maxTotalQueueBytes`): every member's watches draw on
    /// it.
    pub total: Budget,
    /// The `kube-system` uid of each member that read it, and the member's name.
    uids: Mutex<BTreeMap<String, String>>,
}

impl Shared {
    /// What the members of a fleet share; `uids` starts empty.
    pub fn new(
        config: Arc<Config>,
        sink: Arc<AnySink>,
        observer: Arc<dyn Observer>,
        leadership: Option<Validity>,
        shard: Option<Shard>,
        tasks: Tasks,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            total: Budget::new(config.delivery.max_total_queue_bytes),
            config,
            sink,
            observer,
            leadership,
            shard,
            tasks,
            metrics,
            uids: Mutex::default(),
        }
    }

    /// Takes the identity `uid` for the member `name`, unless another member holds it.
    fn claim(self: &Arc<Self>, name: &str, uid: &str) -> Result<Claim, Error> {
        let mut uids = self.uids.lock().unwrap_or_else(|e| e.into_inner());
        match uids.get(uid) {
            Some(other) if other != name => {
                warn!(cluster = %name, other = %other, uid = %uid, "two members of the fleet are the same cluster: refusing the second");
                Err(Error::SameCluster {
                    other: other.clone(),
                    uid: uid.to_string(),
                })
            }
            _ => {
                uids.insert(uid.to_string(), name.to_string());
                Ok(Claim {
                    shared: self.clone(),
                    uid: uid.to_string(),
                })
            }
        }
    }
}

/// A member's hold on its cluster's identity, released when dropped.
struct Claim {
    shared: Arc<Shared>,
    uid: String,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut uids = self.shared.uids.lock().unwrap_or_else(|e| e.into_inner());
        uids.remove(&self.uid);
    }
}

/// The members wanted now: every `clusters[]` entry, then each cluster of a Secret whose name no
/// entry or earlier Secret took (those are logged and left out).
pub fn desired(config: &Config, found: &Found) -> BTreeMap<String, Reach> {
    let mut desired: BTreeMap<String, Reach> = config
        .fleet
        .clusters
        .iter()
        .map(|c| (c.name.clone(), Reach::Configured(c.access.clone())))
        .collect();
    for d in found.clusters.values() {
        match desired.get(&d.name) {
            None => {
                desired.insert(d.name.clone(), Reach::Secret(Box::new(d.clone())));
            }
            Some(Reach::Configured(_)) => {
                warn!(secret = %d.secret, cluster = %d.name, "a clusters[] entry already names this cluster; the Secret is ignored");
            }
            Some(Reach::Secret(first)) => {
                warn!(secret = %d.secret, cluster = %d.name, first = %first.secret, "another Secret already names this cluster; this one is ignored");
            }
        }
    }
    desired
}

/// A running member.
struct Member {
    digest: u64,
    stop: CancellationToken,
}

/// Runs the members `found` (and the configuration) want until `stop`, then stops every one
/// (each drains its watches). Never fails: members fail and recover alone.
pub async fn run(
    shared: Arc<Shared>,
    mut found: watch::Receiver<Found>,
    stop: CancellationToken,
) -> supervisor::Result<()> {
    let mut members: BTreeMap<String, Member> = BTreeMap::new();
    let mut tasks: JoinSet<String> = JoinSet::new();
    let mut watching = true;
    loop {
        let wanted = desired(&shared.config, &found.borrow_and_update());
        reconcile(&shared, &wanted, &mut members, &mut tasks, &stop);
        tokio::select! {
            () = stop.cancelled() => break,
            changed = found.changed(), if watching => watching = changed.is_ok(),
            Some(done) = tasks.join_next() => {
                if let Ok(name) = done {
                    members.remove(&name);
                    if !desired(&shared.config, &found.borrow()).contains_key(&name) {
                        shared.observer.left(&name);
                    }
                }
            }
        }
    }
    for m in members.values() {
        m.stop.cancel();
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Starts the members wanted and not running; stops those no longer wanted or whose
/// kubeconfig changed (a changed one starts again once stopped, from its checkpoints).
fn reconcile(
    shared: &Arc<Shared>,
    wanted: &BTreeMap<String, Reach>,
    members: &mut BTreeMap<String, Member>,
    tasks: &mut JoinSet<String>,
    stop: &CancellationToken,
) {
    for (name, m) in members.iter() {
        if m.stop.is_cancelled() {
            continue;
        }
        match wanted.get(name) {
            None => {
                info!(cluster = %name, "cluster left the fleet: stopping its watches (checkpoints kept)");
                m.stop.cancel();
            }
            Some(reach) if reach.digest() != m.digest => {
                info!(cluster = %name, "cluster kubeconfig rotated: restarting its watches from their checkpoints");
                m.stop.cancel();
            }
            Some(_) => {}
        }
    }
    for (name, reach) in wanted {
        if members.contains_key(name) {
            continue;
        }
        info!(cluster = %name, "cluster joined the fleet: starting its watches");
        let member_stop = stop.child_token();
        members.insert(
            name.clone(),
            Member {
                digest: reach.digest(),
                stop: member_stop.clone(),
            },
        );
        let (shared, name, reach) = (shared.clone(), name.clone(), reach.clone());
        tasks.spawn(async move {
            // A member that panics is started again like one that failed, not lost.
            let run = member::run(shared, name.clone(), reach, member_stop);
            if std::panic::AssertUnwindSafe(run)
                .catch_unwind()
                .await
                .is_err()
            {
                tracing::error!(cluster = %name, "cluster task panicked; starting it again");
            }
            name
        });
    }
    shared
        .metrics
        .members
        .store(members.len() as u64, Ordering::Relaxed);
}

/// Counts a refused Secret.
pub fn count_refusal(metrics: &Metrics, reason: Refusal) {
    if let Some(i) = Refusal::ALL.iter().position(|r| *r == reason) {
        metrics.refused[i].fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::ObjectMeta;

    use super::*;
    use crate::config::ConfigFile;

    const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:6443'}\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";

    fn found(secrets: &[(&str, Option<&str>)]) -> Found {
        let mut found = Found::default();
        for (name, label) in secrets {
            let s = Secret {
                metadata: ObjectMeta {
                    name: Some((*name).into()),
                    namespace: Some("fleet".into()),
                    labels: label.map(|l| [(secret::NAME_LABEL.to_string(), l.to_string())].into()),
                    ..ObjectMeta::default()
                },
                data: Some([("value".to_string(), ByteString(KUBECONFIG.into()))].into()),
                ..Secret::default()
            };
            found
                .clusters
                .insert((*name).into(), secret::parse(&s).unwrap());
        }
        found
    }

    fn config() -> Config {
        ConfigFile::parse(
            "cluster: hub\nclusters: [{name: hub}, {name: east, kubeconfig: /k}]\nclusterSecrets: {namespace: fleet}\nresources: [{apiVersion: v1, resource: pods}]\n",
        )
        .unwrap()
        .validate()
        .unwrap()
    }

    #[test]
    fn entries_come_first_then_each_secret_s_cluster_once() {
        let wanted = desired(
            &config(),
            &found(&[
                ("east-kubeconfig", None),
                ("west-kubeconfig", None),
                ("a-kubeconfig", Some("west")),
            ]),
        );
        let names: Vec<&str> = wanted.keys().map(String::as_str).collect();
        assert_eq!(names, ["east", "hub", "west"]);
        assert!(
            matches!(wanted["east"], Reach::Configured(_)),
            "an entry wins over a Secret"
        );
        let Reach::Secret(west) = &wanted["west"] else {
            panic!("west comes from a Secret");
        };
        assert_eq!(
            west.secret, "fleet/a-kubeconfig",
            "the first Secret by name wins"
        );
    }

    #[test]
    fn a_rotation_changes_only_a_secret_s_digest() {
        let wanted = desired(&config(), &found(&[("west-kubeconfig", None)]));
        assert_eq!(wanted["hub"].digest(), 0);
        assert_ne!(wanted["west"].digest(), 0);
    }
}
