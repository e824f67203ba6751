//! The clusters a bridge watches: by default its own (the `cluster` name and the `kubernetes`
//! section), or a fleet: `clusters[]` entries, each reached through a kubeconfig or, without
//! one, the bridge's own cluster; and `clusterSecrets`, Cluster API's kubeconfig Secrets in the
//! bridge's own cluster, followed while it runs ([`crate::fleet`]).

use std::collections::BTreeSet;

use super::file::{ClusterEntry, ClusterSecrets, KubernetesConfig};
use super::limits::{BURST, QPS};
use super::names::is_dns_label;
use super::resource::{RecordKey, Resource};
use super::sink::SinkSettings;
use crate::template::Token;

/// How the bridge reaches one cluster.
#[derive(Debug, Clone, PartialEq)]
pub enum Access {
    /// Through the `kubernetes` section: in-cluster, `$KUBECONFIG`, or its kubeconfig.
    Own(KubernetesConfig),
    /// Through a kubeconfig file and context, throttled as given.
    File(KubernetesConfig),
}

impl Access {
    /// The client settings.
    pub fn kubernetes(&self) -> &KubernetesConfig {
        match self {
            Access::Own(k) | Access::File(k) => k,
        }
    }
}

/// A cluster named in the configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSpec {
    /// Its name.
    pub name: String,
    /// How to reach it.
    pub access: Access,
}

/// The validated clusters of a configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Fleet {
    /// The clusters named in the file; without `clusters` (and `clusterSecrets`), the bridge's
    /// own, named `cluster`.
    pub clusters: Vec<ClusterSpec>,
    /// Where clusters are discovered while running.
    pub secrets: Option<ClusterSecrets>,
    /// Whether the file lists `clusters`.
    pub listed: bool,
}

impl Fleet {
    /// Whether this is a fleet (`clusters` or `clusterSecrets` given), rather than the single
    /// cluster of a configuration without them: a fleet's clusters fail and recover one by
    /// one, while a single cluster's failure to start fails the start.
    pub fn is_fleet(&self) -> bool {
        self.listed || self.secrets.is_some()
    }
}

/// The fleet of a file: its `clusters[]` entries and `clusterSecrets`, or the single cluster
/// `cluster` reached through `kubernetes`. Every problem is added to `errors`, with its path.
pub(super) fn validate_fleet(
    cluster: &str,
    kubernetes: &KubernetesConfig,
    entries: &[ClusterEntry],
    secrets: Option<&ClusterSecrets>,
    errors: &mut Vec<String>,
) -> Fleet {
    if entries.is_empty() && secrets.is_none() {
        return Fleet {
            clusters: vec![ClusterSpec {
                name: cluster.to_string(),
                access: Access::Own(kubernetes.clone()),
            }],
            secrets: None,
            listed: false,
        };
    }
    let mut names = BTreeSet::new();
    let mut own = None;
    let mut clusters = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let at = format!("clusters[{i}]");
        if !is_dns_label(&e.name) {
            errors.push(format!(
                "{at}.name: {:?} must be a DNS label (lowercase letters, digits and '-', at most 63)",
                e.name
            ));
        } else if !names.insert(e.name.as_str()) {
            errors.push(format!("{at}.name: {:?} is listed twice", e.name));
        }
        if let Some(qps) = e.qps
            && !(QPS.0..=QPS.1).contains(&qps)
        {
            errors.push(format!(
                "{at}.qps: {qps} is out of range ({} to {})",
                QPS.0, QPS.1
            ));
        }
        if let Some(burst) = e.burst
            && !(BURST.min..=BURST.max).contains(&u64::from(burst))
        {
            errors.push(format!(
                "{at}.burst: {burst} is out of range ({} to {})",
                BURST.min, BURST.max
            ));
        }
        let access = match &e.kubeconfig {
            None => {
                if e.context.is_some() {
                    errors.push(format!(
                        "{at}.context: a context needs a kubeconfig; without one the entry is the bridge's own cluster (the kubernetes section)"
                    ));
                }
                if let Some(first) = own.replace(i) {
                    errors.push(format!(
                        "{at}: clusters[{first}] is already the bridge's own cluster (no kubeconfig); name it once"
                    ));
                }
                Access::Own(throttled(kubernetes.clone(), e))
            }
            Some(path) => Access::File(throttled(
                KubernetesConfig {
                    kubeconfig: Some(path.clone()),
                    context: e.context.clone(),
                    ..kubernetes.clone()
                },
                e,
            )),
        };
        clusters.push(ClusterSpec {
            name: e.name.clone(),
            access,
        });
    }
    if let Some(s) = secrets {
        if !is_dns_label(&s.namespace) {
            errors.push(format!(
                "clusterSecrets.namespace: {:?} is not a valid namespace name",
                s.namespace
            ));
        }
        if let Some(selector) = &s.label_selector
            && selector.trim().is_empty()
        {
            errors.push("clusterSecrets.labelSelector: empty; leave it out to take every Secret named <cluster>-kubeconfig".into());
        }
    }
    Fleet {
        clusters,
        secrets: secrets.cloned(),
        listed: !entries.is_empty(),
    }
}

/// `kubernetes` with an entry's own `qps` and `burst`.
fn throttled(kubernetes: KubernetesConfig, e: &ClusterEntry) -> KubernetesConfig {
    KubernetesConfig {
        qps: e.qps.unwrap_or(kubernetes.qps),
        burst: e.burst.unwrap_or(kubernetes.burst),
        ..kubernetes
    }
}

/// A resource's `clusters` must name clusters of the fleet: those of `clusters[]`, or any
/// DNS label when clusters are discovered from Secrets (their names are known only then).
pub(super) fn check_resource_clusters(
    resources: &[Resource],
    fleet: &Fleet,
    errors: &mut Vec<String>,
) {
    for r in resources {
        let Some(names) = &r.clusters else { continue };
        let at = format!("resources[{}].clusters", r.index);
        if names.is_empty() {
            errors.push(format!(
                "{at}: an empty list watches nothing; leave it out to watch every cluster"
            ));
        }
        let mut seen = BTreeSet::new();
        for (j, name) in names.iter().enumerate() {
            if !seen.insert(name) {
                errors.push(format!("{at}[{j}]: {name:?} is listed twice"));
            } else if fleet.secrets.is_some() {
                if !is_dns_label(name) {
                    errors.push(format!("{at}[{j}]: {name:?} is not a DNS label"));
                }
            } else if !fleet.clusters.iter().any(|c| &c.name == name) {
                let known: Vec<&str> = fleet.clusters.iter().map(|c| c.name.as_str()).collect();
                errors.push(format!(
                    "{at}[{j}]: {name:?} is not a cluster of this configuration ({})",
                    known.join(", ")
                ));
            }
        }
    }
}

/// In a fleet, `namespace/name` record keys repeat from cluster to cluster: a resource keyed so
/// and published by several clusters must go to a destination that names the cluster, or a
/// compacted topic would keep one cluster's object in place of another's.
pub(super) fn check_shared_keys(
    resources: &[Resource],
    sink: &dyn SinkSettings,
    fleet: &Fleet,
    errors: &mut Vec<String>,
) {
    let several = fleet.secrets.is_some() || fleet.clusters.len() > 1;
    if !fleet.is_fleet() || !several {
        return;
    }
    for r in resources {
        let narrowed_to_one = r.clusters.as_ref().is_some_and(|c| c.len() <= 1);
        if r.key != RecordKey::NamespacedName || narrowed_to_one {
            continue;
        }
        let Some(destination) = r.destination.as_ref().or(sink.destination()) else {
            continue;
        };
        if !destination.uses(Token::Cluster) {
            errors.push(format!(
                "resources[{}].key: namespacedName keys repeat across the clusters of a fleet and \
                 {:?} has no {{cluster}}: a compacted topic would keep one cluster's object for \
                 another's; put {{cluster}} in the topic or use key: uid",
                r.index,
                destination.to_string()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{ConfigFile, invalid};

    use super::*;

    fn fleet(yaml: &str) -> Fleet {
        ConfigFile::parse(yaml).unwrap().validate().unwrap().fleet
    }

    const RESOURCES: &str = "resources: [{apiVersion: v1, resource: configmaps}]\n";

    #[test]
    fn without_clusters_the_fleet_is_the_bridge_s_own_cluster() {
        let f = fleet(&format!("cluster: dev\n{RESOURCES}"));
        assert!(!f.is_fleet());
        assert_eq!(f.clusters.len(), 1);
        assert_eq!(f.clusters[0].name, "dev");
        assert!(matches!(f.clusters[0].access, Access::Own(_)));
    }

    #[test]
    fn entries_take_their_kubeconfig_context_and_throttle() {
        let f = fleet(&format!(
            "cluster: hub\nkubernetes: {{qps: 5, burst: 10}}\nclusters:\n- name: hub\n- {{name: east, kubeconfig: /k/east, context: admin, qps: 2}}\n{RESOURCES}"
        ));
        assert!(f.is_fleet());
        let east = f.clusters[1].access.kubernetes();
        assert_eq!(
            east.kubeconfig.as_deref(),
            Some(std::path::Path::new("/k/east"))
        );
        assert_eq!(east.context.as_deref(), Some("admin"));
        assert_eq!((east.qps, east.burst), (2.0, 10));
        assert!(matches!(f.clusters[0].access, Access::Own(_)));
        assert_eq!(f.clusters[0].access.kubernetes().qps, 5.0);
    }

    #[test]
    fn secrets_alone_make_a_fleet() {
        let f = fleet(&format!(
            "cluster: hub\nclusterSecrets: {{namespace: fleet, labelSelector: 'fleet=yes'}}\n{RESOURCES}"
        ));
        assert!(f.is_fleet());
        assert!(f.clusters.is_empty());
        assert_eq!(f.secrets.unwrap().namespace, "fleet");
    }

    #[test]
    fn bad_entries_are_named() {
        let e = invalid(&format!(
            "cluster: hub\nclusters:\n- name: East_1\n- {{name: a, context: x}}\n- {{name: a, kubeconfig: /k}}\n- {{name: b}}\n- {{name: c, qps: 0, burst: 0}}\nclusterSecrets: {{namespace: 'No'}}\n{RESOURCES}"
        ));
        for needle in [
            "clusters[0].name: \"East_1\" must be a DNS label",
            "clusters[1].context: a context needs a kubeconfig",
            "clusters[2].name: \"a\" is listed twice",
            "clusters[3]: clusters[1] is already the bridge's own cluster",
            "clusters[4].qps: 0 is out of range",
            "clusters[4].burst: 0 is out of range",
            "clusterSecrets.namespace: \"No\" is not a valid namespace name",
        ] {
            assert!(e.contains(needle), "missing {needle:?} in {e}");
        }
    }

    #[test]
    fn a_resource_narrows_itself_to_clusters_of_the_fleet() {
        let clusters = "cluster: hub\nclusters: [{name: hub}, {name: east, kubeconfig: /k}]\n";
        let c = ConfigFile::parse(&format!(
            "{clusters}resources: [{{apiVersion: v1, resource: pods, clusters: [east]}}]\n"
        ))
        .unwrap()
        .validate()
        .unwrap();
        assert!(c.resources[0].watched_in("east"));
        assert!(!c.resources[0].watched_in("hub"));
        let e = invalid(&format!(
            "{clusters}resources: [{{apiVersion: v1, resource: pods, clusters: [west, east, east]}}, {{apiVersion: v1, resource: secrets, clusters: []}}]\n"
        ));
        for needle in [
            "resources[0].clusters[0]: \"west\" is not a cluster of this configuration (hub, east)",
            "resources[0].clusters[2]: \"east\" is listed twice",
            "resources[1].clusters: an empty list watches nothing",
        ] {
            assert!(e.contains(needle), "missing {needle:?} in {e}");
        }
    }

    #[test]
    fn with_secrets_any_dns_label_may_be_named_and_one_cluster_only_is_refused() {
        let c = ConfigFile::parse(
            "cluster: hub\nclusterSecrets: {namespace: fleet}\nresources: [{apiVersion: v1, resource: pods, clusters: [later]}]\n",
        );
        assert!(c.unwrap().validate().is_ok());
        let e = invalid(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods, clusters: [prod]}]\n",
        );
        assert!(
            e.contains(
                "resources[0].clusters[0]: \"prod\" is not a cluster of this configuration (dev)"
            ),
            "{e}"
        );
    }

    #[test]
    fn the_same_resource_in_different_clusters_does_not_overlap() {
        let clusters = "cluster: hub\nclusters: [{name: hub}, {name: east, kubeconfig: /k}]\n";
        let ok = ConfigFile::parse(&format!(
            "{clusters}resources:\n- {{apiVersion: v1, resource: pods, clusters: [east]}}\n- {{apiVersion: v1, resource: pods, clusters: [hub]}}\n"
        ));
        assert!(ok.unwrap().validate().is_ok());
        let e = invalid(&format!(
            "{clusters}resources:\n- {{apiVersion: v1, resource: pods, clusters: [east]}}\n- {{apiVersion: v1, resource: pods}}\n"
        ));
        assert!(e.contains("resources[1]"), "{e}");
    }

    #[test]
    fn shared_topics_of_namespaced_name_keys_must_name_the_cluster() {
        let clusters = "cluster: hub\nclusters: [{name: hub}, {name: east, kubeconfig: /k}]\n";
        let kafka = "sink: {kafka: {bootstrapServers: 'k:9092', topic: 'k8s.{resource}'}}\n";
        let e = invalid(&format!(
            "{clusters}{kafka}resources:\n- {{apiVersion: v1, resource: pods, key: namespacedName}}\n- {{apiVersion: v1, resource: secrets, key: namespacedName, topic: 'all'}}\n"
        ));
        for needle in [
            "resources[0].key: namespacedName keys repeat across the clusters of a fleet and \"k8s.{resource}\" has no {cluster}",
            "resources[1].key: namespacedName keys repeat across the clusters of a fleet and \"all\" has no {cluster}",
        ] {
            assert!(e.contains(needle), "missing {needle:?} in {e}");
        }
        for fine in [
            // The cluster in the topic, uid keys, one cluster only, or no fleet.
            format!(
                "{clusters}{kafka}resources: [{{apiVersion: v1, resource: pods, key: namespacedName, topic: '{{cluster}}.pods'}}]\n"
            ),
            format!("{clusters}{kafka}resources: [{{apiVersion: v1, resource: pods, key: uid}}]\n"),
            format!(
                "{clusters}{kafka}resources: [{{apiVersion: v1, resource: pods, key: namespacedName, clusters: [east]}}]\n"
            ),
            format!(
                "cluster: hub\n{kafka}resources: [{{apiVersion: v1, resource: pods, key: namespacedName}}]\n"
            ),
        ] {
            let checked = ConfigFile::parse(&fine).unwrap().validate();
            assert!(checked.is_ok(), "{fine}: {:?}", checked.err());
        }
    }
}
