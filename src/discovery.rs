//! Resolves configured resources against the cluster's discovery API: the plural name, kind,
//! scope and verbs of each, so that an unknown or unwatchable resource fails at start-up with a
//! message that names it.

use std::collections::HashMap;

use kube::Client;
use kube::discovery::{self, ApiGroup, ApiResource, Scope, verbs};

use crate::config;

/// Errors of resolving resources.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// One or more resources could not be resolved; each message names its entry.
    #[error("cannot resolve resources:\n  {}", .0.join("\n  "))]
    Unresolved(Vec<String>),
    /// Discovery itself failed (connection, authentication).
    #[error("discovery of API group {group:?} failed")]
    Discovery {
        /// The group (`""` for core).
        group: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A configured resource with what discovery said of it.
#[derive(Debug, Clone)]
pub struct ResolvedResource {
    /// The validated entry.
    pub config: config::Resource,
    /// Group, version, kind and plural.
    pub api: ApiResource,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
}

impl ResolvedResource {
    /// The namespaces to watch, one watch each; `None` is all namespaces or cluster scope.
    pub fn scopes(&self) -> Vec<Option<String>> {
        match &self.config.namespaces {
            Some(list) => list.iter().cloned().map(Some).collect(),
            None => vec![None],
        }
    }

    /// Template values for this resource (no particular object).
    pub fn template_values<'a>(&'a self, cluster: &'a str) -> crate::template::Values<'a> {
        crate::template::Values {
            cluster,
            group: &self.api.group,
            version: &self.api.version,
            resource: &self.api.plural,
            namespace: None,
            name: "",
        }
    }

    /// A label for logs and metrics: `apps/v1/deployments`, `v1/configmaps`.
    pub fn label(&self) -> String {
        format!("{}/{}", self.api.api_version, self.api.plural)
    }
}

/// Resolves every entry, reporting every problem at once.
pub async fn resolve(
    client: &Client,
    resources: &[config::Resource],
) -> Result<Vec<ResolvedResource>> {
    let mut groups: HashMap<String, Option<ApiGroup>> = HashMap::new();
    for r in resources {
        if groups.contains_key(&r.group) {
            continue;
        }
        let found = match discovery::group(client, &r.group).await {
            Ok(g) => Some(g),
            Err(kube::Error::Discovery(_)) => None,
            Err(source) => {
                return Err(Error::Discovery {
                    group: r.group.clone(),
                    source,
                });
            }
        };
        groups.insert(r.group.clone(), found);
    }
    let mut errors = Vec::new();
    let mut resolved = Vec::new();
    for r in resources {
        match resolve_one(r, groups.get(&r.group).and_then(Option::as_ref)) {
            Ok(x) => resolved.push(x),
            Err(message) => errors.push(message),
        }
    }
    if errors.is_empty() {
        Ok(resolved)
    } else {
        Err(Error::Unresolved(errors))
    }
}

/// Resolves one entry against its group's discovery document (pure, for unit tests).
pub fn resolve_one(
    r: &config::Resource,
    group: Option<&ApiGroup>,
) -> Result<ResolvedResource, String> {
    let at = format!("resources[{}]", r.index);
    let Some(group) = group else {
        return Err(format!(
            "{at}.apiVersion: {} is not served: the cluster has no API group {:?}",
            r.api_version(),
            r.group
        ));
    };
    if !group.versions().any(|v| v == r.version) {
        let served: Vec<&str> = group.versions().collect();
        let name = if r.group.is_empty() { "core" } else { &r.group };
        return Err(format!(
            "{at}.apiVersion: {} is not served; served versions of group {name}: {}",
            r.api_version(),
            served.join(", ")
        ));
    }
    let candidates = group.versioned_resources(&r.version);
    let wanted = r.resource.as_str();
    let found = candidates
        .iter()
        .find(|(ar, _)| ar.plural == wanted)
        .or_else(|| candidates.iter().find(|(ar, _)| ar.kind == wanted))
        .or_else(|| {
            candidates.iter().find(|(ar, _)| {
                ar.kind.eq_ignore_ascii_case(wanted) || ar.plural.eq_ignore_ascii_case(wanted)
            })
        });
    let Some((api, caps)) = found else {
        let mut names: Vec<&str> = candidates
            .iter()
            .map(|(ar, _)| ar.plural.as_str())
            .collect();
        names.sort_unstable();
        return Err(format!(
            "{at}.resource: {wanted:?} is not a resource of {}; served resources: {}",
            r.api_version(),
            names.join(", ")
        ));
    };
    let missing: Vec<&str> = [verbs::LIST, verbs::WATCH]
        .into_iter()
        .filter(|v| !caps.supports_operation(v))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "{at}.resource: {} of {} cannot be watched: the API server does not serve {}",
            api.plural,
            r.api_version(),
            missing.join(" and ")
        ));
    }
    let namespaced = caps.scope == Scope::Namespaced;
    if !namespaced && r.namespaces.is_some() {
        return Err(format!(
            "{at}.namespaces: {} is cluster-scoped; remove namespaces",
            api.plural
        ));
    }
    Ok(ResolvedResource {
        config: r.clone(),
        api: api.clone(),
        namespaced,
    })
}
