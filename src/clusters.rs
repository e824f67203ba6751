//! The clusters of a configuration as the commands see them (`rbac`, `check-config`, `tail`,
//! `asyncapi`): the configured ones by name (the `clusters[]` entries, or the single cluster
//! `cluster` of a configuration without a fleet), one a kubeconfig Secret names
//! ([`crate::fleet::secret`], read when a command is asked about it by name), how to reach each
//! and what discovery makes of the resources watched there.
//!
//! A running bridge follows the Secrets itself ([`crate::fleet`]); a command names such a cluster
//! on its command line, or describes all of them at once ([`discovered_resources`]).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ListParams};

use crate::config::{
    Access, ClusterSecrets, ClusterSpec, Config, KubernetesConfig, Resource, is_dns_label,
};
use crate::discovery::{self, ResolvedResource};
use crate::fleet::secret;
use crate::kubernetes;

/// How long a command waits for one cluster (client, Secret, discovery) before it counts as
/// unreachable: a paused API server accepts connections and never answers.
pub const REACH_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors of addressing or reaching a cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The name is not a cluster of the configuration.
    #[error("cluster {name:?} is not a cluster of this configuration ({})", .known.join(", "))]
    Unknown {
        /// The name asked for.
        name: String,
        /// The configuration's clusters.
        known: Vec<String>,
    },
    /// The name cannot be a cluster discovered from a Secret: those are DNS labels.
    #[error(
        "cluster {name:?} is not listed in clusters[] and is not a DNS label, so no kubeconfig Secret can name it"
    )]
    NotDnsLabel {
        /// The name asked for.
        name: String,
    },
    /// The kubeconfig of a `clusters[]` entry could not be read.
    #[error("cluster {cluster}: clusters[{index}].kubeconfig: cannot read {path}")]
    Kubeconfig {
        /// The cluster.
        cluster: String,
        /// Its entry in `clusters`.
        index: usize,
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The cluster's client could not be built.
    #[error("cluster {cluster}")]
    Client {
        /// The cluster.
        cluster: String,
        /// The cause.
        #[source]
        source: kubernetes::Error,
    },
    /// The kubeconfig Secrets could not be listed in the bridge's own cluster.
    #[error("cluster {cluster}: cannot list the kubeconfig Secrets in namespace {namespace}")]
    Secrets {
        /// The cluster looked for.
        cluster: String,
        /// `clusterSecrets.namespace`.
        namespace: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// No Secret names the cluster.
    #[error(
        "cluster {cluster}: no kubeconfig Secret in namespace {namespace}{selector} names it (a Secret {cluster}{suffix} with key {key:?}, or one labelled {label}={cluster}){refused}",
        suffix = secret::SUFFIX,
        key = secret::KEY,
        label = secret::NAME_LABEL,
        selector = .selector.as_ref().map(|s| format!(" matching {s:?}")).unwrap_or_default(),
        refused = .refused.as_ref().map(|r| format!("; refused: {r}")).unwrap_or_default(),
    )]
    NoSecret {
        /// The cluster looked for.
        cluster: String,
        /// `clusterSecrets.namespace`.
        namespace: String,
        /// `clusterSecrets.labelSelector`.
        selector: Option<String>,
        /// Why the Secret named after the cluster was refused, when there is one.
        refused: Option<String>,
    },
    /// Discovery failed.
    #[error("cluster {cluster}")]
    Discovery {
        /// The cluster.
        cluster: String,
        /// The cause.
        #[source]
        source: discovery::Error,
    },
    /// The cluster did not answer in time.
    #[error("cluster {cluster}: unreachable: no answer within {secs} s")]
    Timeout {
        /// The cluster.
        cluster: String,
        /// How long the command waited.
        secs: u64,
    },
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A cluster a command addresses.
#[derive(Debug, Clone, PartialEq)]
pub enum Cluster {
    /// A `clusters[]` entry, or the single cluster of a configuration without a fleet.
    Configured(ClusterSpec),
    /// A cluster a kubeconfig Secret of `clusterSecrets` names (read when it is reached).
    Secret(String),
}

impl Cluster {
    /// Its name: the `cluster` attribute of its events and the `{cluster}` token.
    pub fn name(&self) -> &str {
        match self {
            Cluster::Configured(c) => &c.name,
            Cluster::Secret(name) => name,
        }
    }

    /// How it is reached, for a person: `the bridge's own cluster`, `kubeconfig /k/east, context
    /// admin`, `kubeconfig Secret in namespace fleet`. Never a credential.
    pub fn describe(&self, config: &Config) -> String {
        match self {
            Cluster::Configured(ClusterSpec {
                access: Access::Own(_),
                ..
            }) => "the bridge's own cluster".into(),
            Cluster::Configured(ClusterSpec {
                access: Access::File(k),
                ..
            }) => {
                let path = k.kubeconfig.as_deref().map(|p| p.display().to_string());
                let mut text = format!("kubeconfig {}", path.unwrap_or_default());
                if let Some(context) = &k.context {
                    text.push_str(&format!(", context {context}"));
                }
                text
            }
            Cluster::Secret(_) => match &config.fleet.secrets {
                Some(s) => format!("kubeconfig Secret in namespace {}", s.namespace),
                None => "kubeconfig Secret".into(),
            },
        }
    }

    /// Whether this is the bridge's own cluster, where its Leases (and the kubeconfig Secrets)
    /// live: see [`is_own`].
    pub fn is_own(&self, config: &Config) -> bool {
        is_own(config, self.name())
    }
}

/// The clusters the configuration names: its `clusters[]` entries, or its single cluster.
/// Clusters discovered from Secrets are not among them.
pub fn configured(config: &Config) -> Vec<Cluster> {
    config
        .fleet
        .clusters
        .iter()
        .cloned()
        .map(Cluster::Configured)
        .collect()
}

/// The cluster named `name`: a configured one, or, with `clusterSecrets`, one a Secret may name
/// (any DNS label: Secrets are read at run time). Otherwise an error listing the known names.
pub fn named(config: &Config, name: &str) -> Result<Cluster> {
    if let Some(c) = config.fleet.clusters.iter().find(|c| c.name == name) {
        return Ok(Cluster::Configured(c.clone()));
    }
    match &config.fleet.secrets {
        Some(_) if is_dns_label(name) => Ok(Cluster::Secret(name.to_string())),
        Some(_) => Err(Error::NotDnsLabel { name: name.into() }),
        None => Err(Error::Unknown {
            name: name.into(),
            known: known(config),
        }),
    }
}

/// The names of the configured clusters, in order.
pub fn known(config: &Config) -> Vec<String> {
    config
        .fleet
        .clusters
        .iter()
        .map(|c| c.name.clone())
        .collect()
}

/// The member that is the bridge's own cluster: the `clusters[]` entry without a kubeconfig, or
/// the one named `cluster`; `None` when the bridge's cluster only holds its Leases (and Secrets).
pub fn own(config: &Config) -> Option<&ClusterSpec> {
    let clusters = &config.fleet.clusters;
    clusters
        .iter()
        .find(|c| matches!(c.access, Access::Own(_)))
        .or_else(|| clusters.iter().find(|c| c.name == config.cluster))
}

/// Whether `name` is the bridge's own cluster: the member [`own`] finds, or `cluster` itself.
pub fn is_own(config: &Config, name: &str) -> bool {
    name == config.cluster || own(config).is_some_and(|c| c.name == name)
}

/// The resources watched in clusters discovered from Secrets: every entry not narrowed to
/// `clusters`, and those naming a cluster no `clusters[]` entry is. Empty without
/// `clusterSecrets`.
pub fn discovered_resources(config: &Config) -> Vec<Resource> {
    if config.fleet.secrets.is_none() {
        return Vec::new();
    }
    let configured = known(config);
    config
        .resources
        .iter()
        .filter(|r| {
            r.clusters
                .as_ref()
                .is_none_or(|names| names.iter().any(|n| !configured.contains(n)))
        })
        .cloned()
        .collect()
}

/// A client for `cluster` and its API server's URL; a Secret's cluster is read from its
/// kubeconfig Secret in the bridge's own cluster. Bounded by [`REACH_TIMEOUT`].
pub async fn connect(config: &Config, cluster: &Cluster) -> Result<(Client, String)> {
    within(cluster.name(), connect_unbounded(config, cluster)).await
}

async fn connect_unbounded(config: &Config, cluster: &Cluster) -> Result<(Client, String)> {
    let name = cluster.name().to_string();
    let client_error = |source| Error::Client {
        cluster: name.clone(),
        source,
    };
    match cluster {
        Cluster::Configured(c) => kubernetes::client_and_url(c.access.kubernetes())
            .await
            .map_err(|e| match (e, &c.access) {
                // The file is the entry's, not the kubernetes section's.
                (kubernetes::Error::Kubeconfig { path, source }, Access::File(_)) => {
                    Error::Kubeconfig {
                        cluster: name.clone(),
                        index: config
                            .fleet
                            .clusters
                            .iter()
                            .position(|x| x.name == c.name)
                            .unwrap_or_default(),
                        path,
                        source,
                    }
                }
                (e, _) => client_error(e),
            }),
        Cluster::Secret(_) => {
            let found = kubeconfig_secret(config, &name).await?;
            let k = &config.kubernetes;
            kubernetes::client_from_kubeconfig(&found.secret, found.kubeconfig, k.qps, k.burst)
                .await
                .map_err(client_error)
        }
    }
}

/// Reaches `cluster` ([`connect`]) and resolves the resources watched there ([`resolve`]): its
/// client, its API server's URL and what discovery made of them.
pub async fn connect_and_resolve(
    config: &Config,
    cluster: &Cluster,
) -> Result<(Client, String, Resolution)> {
    let (client, api_server) = connect(config, cluster).await?;
    let watched = config.for_cluster(cluster.name(), config.kubernetes.clone());
    let resolution = resolve(config, cluster.name(), &client, &watched.resources).await?;
    Ok((client, api_server, resolution))
}

/// A client through `kubernetes` (a kubeconfig given on the command line), for `cluster`.
pub async fn connect_with(
    cluster: &str,
    kubernetes: &KubernetesConfig,
) -> Result<(Client, String)> {
    within(cluster, async {
        kubernetes::client_and_url(kubernetes)
            .await
            .map_err(|source| Error::Client {
                cluster: cluster.into(),
                source,
            })
    })
    .await
}

/// The kubeconfig Secret naming `cluster`, as the bridge would take it: of those `clusterSecrets`
/// selects, in name order, the first whose cluster is `cluster`.
async fn kubeconfig_secret(config: &Config, cluster: &str) -> Result<secret::Discovered> {
    let (listed, secrets) = list_secrets(config, cluster).await?;
    let mut refused = None;
    for s in &listed {
        match secret::parse(s) {
            Ok(d) if d.name == cluster => return Ok(d),
            Ok(_) => {}
            Err(r)
                if s.metadata.name.as_deref() == Some(&format!("{cluster}{}", secret::SUFFIX)) =>
            {
                refused = Some(r.message);
            }
            Err(_) => {}
        }
    }
    Err(Error::NoSecret {
        cluster: cluster.into(),
        namespace: secrets.namespace.clone(),
        selector: secrets.label_selector.clone(),
        refused,
    })
}

/// The clusters the kubeconfig Secrets of `clusterSecrets` name now, as the bridge would take
/// them (refused Secrets and names of `clusters[]` entries left out), in name order; none
/// without `clusterSecrets`.
pub async fn from_secrets(config: &Config) -> Result<Vec<Cluster>> {
    if config.fleet.secrets.is_none() {
        return Ok(Vec::new());
    }
    let (listed, _) = list_secrets(config, &config.cluster).await?;
    let configured = known(config);
    let names: BTreeSet<String> = listed
        .iter()
        .filter_map(|s| secret::parse(s).ok())
        .map(|d| d.name)
        .filter(|n| !configured.contains(n))
        .collect();
    Ok(names.into_iter().map(Cluster::Secret).collect())
}

/// The Secrets `clusterSecrets` selects in the bridge's own cluster, in name order (an error
/// names `cluster`, the cluster looked for).
async fn list_secrets<'a>(
    config: &'a Config,
    cluster: &str,
) -> Result<(Vec<Secret>, &'a ClusterSecrets)> {
    let Some(secrets) = &config.fleet.secrets else {
        return Err(Error::Unknown {
            name: cluster.into(),
            known: known(config),
        });
    };
    let hub = kubernetes::client(&config.kubernetes)
        .await
        .map_err(|source| Error::Client {
            cluster: config.cluster.clone(),
            source,
        })?;
    let mut params = ListParams::default();
    if let Some(selector) = &secrets.label_selector {
        params = params.labels(selector);
    }
    let mut listed = Api::<Secret>::namespaced(hub, &secrets.namespace)
        .list(&params)
        .await
        .map_err(|source| Error::Secrets {
            cluster: cluster.into(),
            namespace: secrets.namespace.clone(),
            source,
        })?
        .items;
    listed.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok((listed, secrets))
}

/// What discovery makes of some resources in one cluster.
#[derive(Debug, Clone)]
pub struct Resolution {
    /// The resources resolved, as the bridge would watch them.
    pub resources: Vec<ResolvedResource>,
    /// One message per entry the cluster does not serve (a fleet's cluster watches the others).
    pub missing: Vec<String>,
}

/// Asks `client`'s API server what it serves and resolves `resources` against it, within
/// [`REACH_TIMEOUT`]. In a fleet an entry a cluster does not serve is reported in
/// [`Resolution::missing`], as the running bridge warns of it and watches the others; for the
/// single cluster of a configuration without a fleet it is an error, as it fails the start.
pub async fn resolve(
    config: &Config,
    cluster: &str,
    client: &Client,
    resources: &[Resource],
) -> Result<Resolution> {
    let discovery_error = |source| Error::Discovery {
        cluster: cluster.into(),
        source,
    };
    let found = within(cluster, async {
        discovery::discover(client).await.map_err(discovery_error)
    })
    .await?;
    let (resources, missing) = discovery::select(resources, &found);
    if !config.fleet.is_fleet() && !missing.is_empty() {
        return Err(discovery_error(discovery::Error::Unresolved(missing)));
    }
    Ok(Resolution { resources, missing })
}

/// `future`, or [`Error::Timeout`] naming `cluster` after [`REACH_TIMEOUT`].
async fn within<T>(
    cluster: &str,
    future: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(REACH_TIMEOUT, future)
        .await
        .unwrap_or_else(|_| {
            Err(Error::Timeout {
                cluster: cluster.into(),
                secs: REACH_TIMEOUT.as_secs(),
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigFile;

    fn config(yaml: &str) -> Config {
        ConfigFile::parse(yaml).unwrap().validate().unwrap()
    }

    const FLEET: &str = "cluster: hub\nclusters:\n- {name: hub}\n- {name: east, kubeconfig: /k/east, context: admin}\n\
        resources:\n- {apiVersion: v1, resource: configmaps}\n- {apiVersion: v1, resource: pods, clusters: [east]}\n";

    #[test]
    fn a_single_cluster_is_its_one_configured_cluster_and_its_own() {
        let c = config("cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\n");
        let all = configured(&c);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].name(), "dev");
        assert!(all[0].is_own(&c));
        assert_eq!(all[0].describe(&c), "the bridge's own cluster");
        assert_eq!(named(&c, "dev").unwrap(), all[0]);
        assert!(discovered_resources(&c).is_empty());
    }

    #[test]
    fn an_unknown_name_lists_the_known_ones() {
        let c = config(FLEET);
        let e = named(&c, "west").unwrap_err().to_string();
        assert_eq!(
            e,
            "cluster \"west\" is not a cluster of this configuration (hub, east)"
        );
        let single = config("cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\n");
        let e = named(&single, "prod").unwrap_err().to_string();
        assert_eq!(
            e,
            "cluster \"prod\" is not a cluster of this configuration (dev)"
        );
    }

    #[test]
    fn with_secrets_any_dns_label_names_a_cluster() {
        let c = config(&FLEET.replace(
            "resources:",
            "clusterSecrets: {namespace: fleet}\nresources:",
        ));
        assert_eq!(named(&c, "later").unwrap(), Cluster::Secret("later".into()));
        assert_eq!(
            named(&c, "later").unwrap().describe(&c),
            "kubeconfig Secret in namespace fleet"
        );
        assert!(matches!(named(&c, "east").unwrap(), Cluster::Configured(_)));
        let e = named(&c, "West_1").unwrap_err().to_string();
        assert!(
            e.contains("\"West_1\" is not listed in clusters[] and is not a DNS label"),
            "{e}"
        );
    }

    #[test]
    fn the_own_cluster_is_the_entry_without_kubeconfig_or_the_one_named_cluster() {
        let c = config(FLEET);
        assert_eq!(own(&c).unwrap().name, "hub");
        let all = configured(&c);
        assert!(all[0].is_own(&c) && !all[1].is_own(&c));
        assert_eq!(all[1].describe(&c), "kubeconfig /k/east, context admin");
        // The hub is not a member: only its Leases and Secrets live there.
        let c = config(
            "cluster: hub\nclusters: [{name: east, kubeconfig: /k/east}]\nresources: [{apiVersion: v1, resource: pods}]\n",
        );
        assert!(own(&c).is_none());
        assert!(is_own(&c, "hub") && !is_own(&c, "east"));
    }

    #[test]
    fn discovered_clusters_watch_what_is_not_narrowed_to_configured_clusters() {
        let c = config(
            "cluster: hub\nclusters: [{name: hub}]\nclusterSecrets: {namespace: fleet}\nresources:\n\
             - {apiVersion: v1, resource: configmaps}\n\
             - {apiVersion: v1, resource: pods, clusters: [hub]}\n\
             - {apiVersion: v1, resource: services, clusters: [hub, later]}\n",
        );
        let plurals: Vec<String> = discovered_resources(&c)
            .into_iter()
            .map(|r| r.resource)
            .collect();
        assert_eq!(plurals, ["configmaps", "services"]);
    }

    #[tokio::test]
    async fn an_entry_s_unreadable_kubeconfig_is_named_by_its_entry() {
        let c = config(&FLEET.replace("/k/east", "/nonexistent/keb/east.kubeconfig"));
        let east = named(&c, "east").unwrap();
        let Err(e) = connect(&c, &east).await else {
            panic!("a kubeconfig that does not exist was read");
        };
        let e = e.to_string();
        assert_eq!(
            e,
            "cluster east: clusters[1].kubeconfig: cannot read /nonexistent/keb/east.kubeconfig"
        );
    }
}
