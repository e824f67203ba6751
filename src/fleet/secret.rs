//! Cluster API's kubeconfig Secrets: a Secret named `<cluster>-kubeconfig` whose key `value`
//! holds a kubeconfig; the cluster's name is the Secret's name without the suffix, or its
//! `cluster.x-k8s.io/cluster-name` label. [`parse`] reads one, or says why it is refused,
//! without I/O; [`follow`] keeps the parsed set current from a watch on the Secrets.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::config::Kubeconfig;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::{ClusterSecrets, is_dns_label};
use crate::status::STALL_AFTER;

/// The suffix of a kubeconfig Secret's name.
pub const SUFFIX: &str = "-kubeconfig";
/// The key of the kubeconfig in the Secret's data.
pub const KEY: &str = "value";
/// The label naming the cluster, which wins over the Secret's name.
pub const NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

/// A cluster read from a Secret.
#[derive(Clone)]
pub struct Discovered {
    /// The cluster's name.
    pub name: String,
    /// The Secret it came from (`namespace/name`).
    pub secret: String,
    /// Its kubeconfig.
    pub kubeconfig: Kubeconfig,
    /// A digest of the kubeconfig's text: a rotation changes it.
    pub digest: u64,
}

impl std::fmt::Debug for Discovered {
    /// Leaves the kubeconfig out: it holds credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovered")
            .field("name", &self.name)
            .field("secret", &self.secret)
            .field("digest", &format_args!("{:016x}", self.digest))
            .finish_non_exhaustive()
    }
}

/// Why a Secret is not a cluster: a closed set, the `reason` label of
/// `cluster_secrets_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refusal {
    /// Its name does not end in `-kubeconfig` and it has no cluster-name label.
    Name,
    /// The cluster's name is not a DNS label.
    ClusterName,
    /// It has no key `value`.
    NoValue,
    /// `value` is not a kubeconfig (not UTF-8 YAML of one, or without a current context).
    Kubeconfig,
}

impl Refusal {
    /// Every reason, in the metric's order.
    pub const ALL: [Refusal; 4] = [
        Refusal::Name,
        Refusal::ClusterName,
        Refusal::NoValue,
        Refusal::Kubeconfig,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Name => "name",
            Refusal::ClusterName => "cluster_name",
            Refusal::NoValue => "no_value",
            Refusal::Kubeconfig => "kubeconfig",
        }
    }
}

/// A refused Secret: why, in a sentence that names the Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The reason.
    pub reason: Refusal,
    /// What is wrong.
    pub message: String,
}

/// Reads the cluster a Secret describes, in Cluster API's format.
pub fn parse(secret: &Secret) -> Result<Discovered, Refused> {
    let meta = &secret.metadata;
    let name = meta.name.clone().unwrap_or_default();
    let at = format!("Secret {}/{name}", meta.namespace.as_deref().unwrap_or(""));
    let refuse = |reason, what: String| Refused {
        reason,
        message: format!("{at}: {what}"),
    };
    let labelled = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(NAME_LABEL))
        .cloned();
    let cluster = match (labelled, name.strip_suffix(SUFFIX)) {
        (Some(label), _) => label,
        (None, Some(stem)) => stem.to_string(),
        (None, None) => {
            return Err(refuse(
                Refusal::Name,
                format!(
                    "not a cluster's kubeconfig: the name does not end in {SUFFIX:?} and no {NAME_LABEL} label names the cluster"
                ),
            ));
        }
    };
    if !is_dns_label(&cluster) {
        return Err(refuse(
            Refusal::ClusterName,
            format!(
                "the cluster name {cluster:?} is not a DNS label (lowercase letters, digits and '-', at most 63)"
            ),
        ));
    }
    let Some(value) = secret.data.as_ref().and_then(|d| d.get(KEY)) else {
        return Err(refuse(
            Refusal::NoValue,
            format!("no key {KEY:?} holding the kubeconfig"),
        ));
    };
    let kubeconfig = std::str::from_utf8(&value.0)
        .map_err(|_| "not UTF-8 text".to_string())
        .and_then(|text| Kubeconfig::from_yaml(text).map_err(|e| kubeconfig_error(&e)))
        .and_then(|k| match k.current_context {
            Some(_) => Ok(k),
            None => Err("it names no current-context".into()),
        })
        .map_err(|why| {
            refuse(
                Refusal::Kubeconfig,
                format!("key {KEY:?} is not a usable kubeconfig: {why}"),
            )
        })?;
    Ok(Discovered {
        name: cluster,
        secret: format!("{}/{name}", meta.namespace.as_deref().unwrap_or("")),
        kubeconfig,
        digest: crate::known::stable_hash(&value.0),
    })
}

/// A kubeconfig's parse error, without the text it quotes (which may hold credentials).
fn kubeconfig_error(e: &kube::config::KubeconfigError) -> String {
    match e {
        kube::config::KubeconfigError::Parse(_) => "not a kubeconfig document".into(),
        other => other.to_string(),
    }
}

/// The clusters of the Secrets, by Secret name; and the refused Secrets, by name.
#[derive(Debug, Clone, Default)]
pub struct Found {
    /// Accepted Secrets.
    pub clusters: BTreeMap<String, Discovered>,
    /// Refused Secrets.
    pub refused: BTreeMap<String, Refused>,
    /// Whether the first complete listing arrived.
    pub listed: bool,
}

impl Found {
    fn apply(&mut self, secret: &Secret, refusals: &dyn Fn(Refusal)) {
        let key = secret.metadata.name.clone().unwrap_or_default();
        match parse(secret) {
            Ok(d) => {
                self.refused.remove(&key);
                let changed = self.clusters.get(&key).is_none_or(|o| o.digest != d.digest);
                if changed {
                    info!(secret = %d.secret, cluster = %d.name, "cluster kubeconfig Secret read");
                }
                self.clusters.insert(key, d);
            }
            Err(refused) => {
                self.clusters.remove(&key);
                if self.refused.get(&key) != Some(&refused) {
                    warn!(
                        reason = refused.reason.label(),
                        "{}; ignoring it", refused.message
                    );
                    refusals(refused.reason);
                }
                self.refused.insert(key, refused);
            }
        }
    }
}

/// Keeps `found` equal to the kubeconfig Secrets `secrets` selects, through `api` (the bridge's
/// own cluster); `refusals` counts each refusal; `trouble` is told why the Secrets cannot be
/// read (RBAC, the API server) once that has lasted [`STALL_AFTER`], and `None` once they can.
/// Errors are logged and retried by the watcher's backoff; this never returns.
pub async fn follow(
    api: Api<Secret>,
    secrets: ClusterSecrets,
    found: watch::Sender<Found>,
    refusals: impl Fn(Refusal) + Send + Sync + 'static,
    trouble: impl Fn(Option<String>) + Send + Sync + 'static,
) {
    let mut config = watcher::Config::default();
    if let Some(selector) = &secrets.label_selector {
        config = config.labels(selector);
    }
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut listing = Found::default();
    let mut failing = Failing::default();
    while let Some(event) = stream.next().await {
        if event.is_ok() {
            failing = Failing::default();
            trouble(None);
        }
        match event {
            Ok(Event::Init) => {
                listing = Found {
                    listed: true,
                    ..Found::default()
                };
            }
            Ok(Event::InitApply(s)) => listing.apply(&s, &refusals),
            Ok(Event::InitDone) => {
                let complete = std::mem::take(&mut listing);
                found.send_replace(complete);
            }
            Ok(Event::Apply(s)) => found.send_modify(|f| f.apply(&s, &refusals)),
            Ok(Event::Delete(s)) => found.send_modify(|f| {
                let key = s.metadata.name.unwrap_or_default();
                f.refused.remove(&key);
                if let Some(d) = f.clusters.remove(&key) {
                    info!(secret = %d.secret, cluster = %d.name, "cluster kubeconfig Secret deleted");
                }
            }),
            Err(e) => {
                warn!(namespace = %secrets.namespace, error = %e, "cannot watch the cluster Secrets; retrying");
                if failing.persists(std::time::Instant::now()) {
                    trouble(Some(format!(
                        "clusterSecrets: cannot watch the Secrets of namespace {}: {e}",
                        secrets.namespace
                    )));
                }
            }
        }
    }
}

/// Whether the Secrets' watch keeps failing. One error followed by a silent, successful re-watch
/// (a dropped connection in a quiet namespace yields no event) must not fail readiness until the
/// next change; errors that go on for [`STALL_AFTER`] with nothing read in between do.
#[derive(Debug, Default)]
struct Failing {
    since: Option<std::time::Instant>,
}

impl Failing {
    /// Records an error at `now`; whether the failure has lasted long enough to report.
    fn persists(&mut self, now: std::time::Instant) -> bool {
        let since = *self.since.get_or_insert(now);
        now.duration_since(since) >= STALL_AFTER
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;
    use kube::api::ObjectMeta;

    use super::*;

    const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:6443'}\nusers:\n- name: u\n  user: {token: s3cr3t-token}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";

    fn secret(name: &str, label: Option<&str>, value: Option<&str>) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("fleet".into()),
                labels: label.map(|l| [(NAME_LABEL.to_string(), l.to_string())].into()),
                ..ObjectMeta::default()
            },
            data: value.map(|v| [(KEY.to_string(), ByteString(v.as_bytes().to_vec()))].into()),
            ..Secret::default()
        }
    }

    #[test]
    fn the_cluster_is_named_by_the_label_or_the_secret_s_name() {
        let d = parse(&secret("east-kubeconfig", None, Some(KUBECONFIG))).unwrap();
        assert_eq!(
            (d.name.as_str(), d.secret.as_str()),
            ("east", "fleet/east-kubeconfig")
        );
        let d = parse(&secret("anything", Some("west"), Some(KUBECONFIG))).unwrap();
        assert_eq!(d.name, "west");
        let again = parse(&secret("anything", Some("west"), Some(KUBECONFIG))).unwrap();
        assert_eq!(d.digest, again.digest);
        let rotated = KUBECONFIG.replace("s3cr3t-token", "n3w-token");
        let rotated = parse(&secret("anything", Some("west"), Some(&rotated))).unwrap();
        assert_ne!(d.digest, rotated.digest, "a rotation changes the digest");
    }

    #[test]
    fn secrets_of_another_shape_are_refused_naming_why_without_their_content() {
        for (s, reason, needle) in [
            (
                secret("east", None, Some(KUBECONFIG)),
                Refusal::Name,
                "does not end in \"-kubeconfig\"",
            ),
            (
                secret("East_1-kubeconfig", None, Some(KUBECONFIG)),
                Refusal::ClusterName,
                "\"East_1\" is not a DNS label",
            ),
            (
                secret("east-kubeconfig", None, None),
                Refusal::NoValue,
                "no key \"value\"",
            ),
            (
                secret("east-kubeconfig", None, Some("token: s3cr3t-token\n: [")),
                Refusal::Kubeconfig,
                "not a kubeconfig document",
            ),
            (
                secret(
                    "east-kubeconfig",
                    None,
                    Some(&KUBECONFIG.replace("current-context: x\n", "")),
                ),
                Refusal::Kubeconfig,
                "names no current-context",
            ),
        ] {
            let refused = parse(&s).unwrap_err();
            assert_eq!(refused.reason, reason, "{refused:?}");
            assert!(refused.message.starts_with("Secret fleet/"), "{refused:?}");
            assert!(refused.message.contains(needle), "{refused:?}");
            assert!(!refused.message.contains("s3cr3t"), "{refused:?}");
        }
    }

    #[test]
    fn a_discovered_cluster_prints_without_its_credentials() {
        let d = parse(&secret("east-kubeconfig", None, Some(KUBECONFIG))).unwrap();
        let printed = format!("{d:?}");
        assert!(
            printed.contains("east") && !printed.contains("s3cr3t"),
            "{printed}"
        );
    }

    #[test]
    fn found_replaces_refused_secrets_and_counts_each_refusal_once() {
        let counted = std::sync::Mutex::new(Vec::new());
        let count = |r: Refusal| counted.lock().unwrap().push(r);
        let mut found = Found::default();
        found.apply(&secret("east-kubeconfig", None, None), &count);
        found.apply(&secret("east-kubeconfig", None, None), &count);
        assert_eq!(*counted.lock().unwrap(), vec![Refusal::NoValue]);
        assert!(found.clusters.is_empty());
        found.apply(&secret("east-kubeconfig", None, Some(KUBECONFIG)), &count);
        assert!(found.refused.is_empty());
        assert_eq!(found.clusters["east-kubeconfig"].name, "east");
    }

    #[test]
    fn a_single_error_is_not_reported_errors_that_last_are() {
        let t0 = std::time::Instant::now();
        let mut failing = Failing::default();
        assert!(!failing.persists(t0));
        assert!(!failing.persists(t0 + STALL_AFTER / 2));
        assert!(failing.persists(t0 + STALL_AFTER));
        // Something read in between starts over.
        let mut failing = Failing::default();
        assert!(!failing.persists(t0 + STALL_AFTER));
    }
}
