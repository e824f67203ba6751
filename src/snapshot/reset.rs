//! `snapshot --reset`: deletes the checkpoints of one resource's watches, so that the next start
//! lists and publishes every object again. A running bridge owning them is fenced.

use std::collections::HashMap;

use kube::Client;

use crate::checkpoint::{self, WatchKey};
use crate::clusters::{self, Cluster};
use crate::config::Config;
use crate::discovery::{ResolvedResource, list_namespaces};
use crate::kubernetes;
use crate::sink;
use crate::stores::{self, Stores};

/// Errors of resetting checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No configured watch is of the resource asked for.
    #[error(
        "--resource {resource}: no configured watch matches (use apiVersion/plural, e.g. v1/configmaps)"
    )]
    NoWatch {
        /// The resource asked for.
        resource: String,
    },
    /// A fleet's checkpoints are per cluster: the command must name one.
    #[error("--cluster: this configuration is a fleet; name the cluster whose checkpoints to reset ({})", .known.join(", "))]
    NoCluster {
        /// The configured clusters.
        known: Vec<String>,
    },
    /// The cluster could not be named or reached.
    #[error(transparent)]
    Cluster(#[from] clusters::Error),
    /// The Kubernetes client could not be built.
    #[error(transparent)]
    Kubernetes(#[from] kubernetes::Error),
    /// The sink could not be connected.
    #[error(transparent)]
    Sink(#[from] sink::Error),
    /// The checkpoint store, or a watch's store, could not be prepared.
    #[error(transparent)]
    Stores(#[from] stores::Error),
    /// A checkpoint could not be deleted.
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::Error),
    /// The namespaces of a `namespaceSelector` could not be listed. The client's error already
    /// prints its cause, so it is part of this message rather than a chained source.
    #[error("namespaceSelector {selector:?}: cannot list namespaces: {error}")]
    NamespaceSelector {
        /// The selector.
        selector: String,
        /// What failed.
        error: kube::Error,
    },
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Deletes the checkpoints of the watches of `resource` (`v1/configmaps`, `apps/v1/deployments`),
/// optionally only the one of `namespace`, in `cluster` (required for a fleet, whose checkpoints
/// are per cluster), so that the next start publishes a fresh snapshot. Returns the watches
/// reset; none is an error ([`Error::NoWatch`]).
pub async fn reset_checkpoints(
    config: &Config,
    resource: &str,
    namespace: Option<&str>,
    cluster: Option<&str>,
) -> Result<Vec<String>> {
    let (config, client) = &reach(config, cluster).await?;
    let mut scopes = watched_scopes(config, client, resource, namespace).await?;
    // A watch of every namespace is not reset for one of them.
    scopes.retain(|(_, scope)| namespace.is_none() || scope.as_deref() == namespace);
    let shared = sink::connect(&config.sink).await?;
    let stores = Stores::prepare(config, &shared, client).await?;
    let mut reset = Vec::new();
    for (r, scope) in &scopes {
        let key = WatchKey::for_scope(&config.cluster, r, scope.as_deref());
        let (_, mut store) = stores.for_watch(&shared, &key, None).await?;
        store.reset().await?;
        reset.push(key.description);
    }
    if reset.is_empty() {
        return Err(Error::NoWatch {
            resource: resource.into(),
        });
    }
    Ok(reset)
}

/// The watches of `resource` (`v1/configmaps`) the configuration runs in the cluster of
/// `client`, each with its namespace (`None`: all namespaces or cluster scope); only the one of
/// `namespace` when given. None is an error ([`Error::NoWatch`]).
pub(super) async fn watched_scopes(
    config: &Config,
    client: &Client,
    resource: &str,
    namespace: Option<&str>,
) -> Result<Vec<(ResolvedResource, Option<String>)>> {
    let resources = clusters::resolve(config, &config.cluster, client, &config.resources)
        .await?
        .resources;
    let mut selected = HashMap::new();
    for r in resources.iter().filter(|r| r.label() == resource) {
        if let Some(selector) = &r.config.namespace_selector
            && !selected.contains_key(selector)
        {
            let found = list_namespaces(client, selector).await.map_err(|error| {
                Error::NamespaceSelector {
                    selector: selector.clone(),
                    error,
                }
            })?;
            selected.insert(selector.clone(), found);
        }
    }
    let mut scopes = Vec::new();
    for r in resources.iter().filter(|r| r.label() == resource) {
        for scope in r.scopes(&selected) {
            if namespace.is_none() || scope.is_none() || scope.as_deref() == namespace {
                scopes.push((r.clone(), scope));
            }
        }
    }
    if scopes.is_empty() {
        return Err(Error::NoWatch {
            resource: resource.into(),
        });
    }
    Ok(scopes)
}

/// The configuration as the cluster's watches see it (a fleet member's, or the single cluster's)
/// and a client for that cluster.
pub(super) async fn reach(config: &Config, cluster: Option<&str>) -> Result<(Config, Client)> {
    let Some(name) = cluster else {
        if config.fleet.is_fleet() {
            return Err(Error::NoCluster {
                known: clusters::known(config),
            });
        }
        return Ok((
            config.clone(),
            kubernetes::client(&config.kubernetes).await?,
        ));
    };
    let target = clusters::named(config, name)?;
    let (client, _) = clusters::connect(config, &target).await?;
    let kubernetes = match &target {
        Cluster::Configured(spec) => spec.access.kubernetes().clone(),
        Cluster::Secret(_) => config.kubernetes.clone(),
    };
    Ok((config.for_cluster(name, kubernetes), client))
}
