//! Resolves configured resources against the cluster's discovery API: the plural name, kind,
//! scope and verbs of each, so that an unknown or unwatchable resource fails at start-up with a
//! message that names it; wildcard entries expand to every matching served resource (at its
//! preferred version), minus their exclusions. [`select`] is pure, so the supervisor can run it
//! again whenever CRDs change.

use kube::Client;
use kube::discovery::{ApiGroup, ApiResource, Discovery, Scope, verbs};

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
    /// `selected` holds the namespaces matching each `namespaceSelector`.
    pub fn scopes(
        &self,
        selected: &std::collections::HashMap<String, std::collections::BTreeSet<String>>,
    ) -> Vec<Option<String>> {
        match (&self.config.namespaces, &self.config.namespace_selector) {
            (Some(list), _) => list.iter().cloned().map(Some).collect(),
            (None, Some(selector)) => selected
                .get(selector)
                .map(|set| set.iter().cloned().map(Some).collect())
                .unwrap_or_default(),
            (None, None) => vec![None],
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

    /// This resource's topic, subject or URL template: its own (`topic`, `subject` or `url`),
    /// else the sink's.
    pub fn destination<'a>(
        &'a self,
        sink: &'a crate::template::Template,
    ) -> &'a crate::template::Template {
        self.config.destination.as_ref().unwrap_or(sink)
    }

    /// Whether this is the core Secret resource, redacted by default however it was selected.
    pub fn is_secret(&self) -> bool {
        self.api.group.is_empty() && self.api.plural == "secrets"
    }

    /// A label for logs and metrics: `apps/v1/deployments`, `v1/configmaps`.
    pub fn label(&self) -> String {
        format!("{}/{}", self.api.api_version, self.api.plural)
    }
}

/// Asks the API server what it serves: aggregated discovery (two requests), else the classic
/// walk over every group.
pub async fn discover(client: &Client) -> Result<Discovery> {
    let error = |source| Error::Discovery {
        group: "*".into(),
        source,
    };
    match Discovery::new(client.clone()).run_aggregated().await {
        Ok(d) => Ok(d),
        Err(kube::Error::Api(_) | kube::Error::Discovery(_) | kube::Error::SerdeError(_)) => {
            Discovery::new(client.clone()).run().await.map_err(error)
        }
        Err(e) => Err(error(e)),
    }
}

/// Resolves every entry, reporting every problem at once: explicit entries must be served;
/// wildcard entries may match nothing yet (their CRDs can come later).
pub async fn resolve(
    client: &Client,
    resources: &[config::Resource],
) -> Result<Vec<ResolvedResource>> {
    let discovery = discover(client).await?;
    let (resolved, errors) = select(resources, &discovery);
    if errors.is_empty() {
        Ok(resolved)
    } else {
        Err(Error::Unresolved(errors))
    }
}

/// Chooses the resources to watch (pure): explicit entries first, in file order, then wildcards
/// in file order; an entry does not get a resource an earlier one already watches in an
/// overlapping set of namespaces with the same selectors (so no change is published twice). Returns the resources and one
/// message per explicit entry the cluster does not serve.
pub fn select(
    resources: &[config::Resource],
    discovery: &Discovery,
) -> (Vec<ResolvedResource>, Vec<String>) {
    let mut errors = Vec::new();
    let mut chosen: Vec<ResolvedResource> = Vec::new();
    // Takes `x` unless an earlier entry watches the same objects; returns that entry's index.
    let mut claim = |x: ResolvedResource| {
        let owner = chosen.iter().find(|c| {
            c.api.group == x.api.group
                && c.api.plural == x.api.plural
                && c.config.overlaps(&x.config)
        });
        match owner {
            Some(c) => Some(c.config.index),
            None => {
                chosen.push(x);
                None
            }
        }
    };
    for r in resources.iter().filter(|r| !r.is_wildcard()) {
        match resolve_one(r, discovery.get(&r.group)) {
            // Written differently (`pods` and `Pod`), two explicit entries can still collide.
            Ok(x) => {
                let plural = x.api.plural.clone();
                if let Some(first) = claim(x) {
                    errors.push(config::same_objects(r.index, first, &plural));
                }
            }
            Err(message) => errors.push(message),
        }
    }
    for r in resources.iter().filter(|r| r.is_wildcard()) {
        for group in discovery.groups_alphabetical() {
            if !config::glob(&r.group, group.name()) {
                continue;
            }
            let candidates = if r.version == "*" {
                group.recommended_resources()
            } else {
                group.versioned_resources(&r.version)
            };
            for (api, caps) in candidates {
                let namespaced = caps.scope == Scope::Namespaced;
                let watchable = [verbs::LIST, verbs::WATCH]
                    .iter()
                    .all(|v| caps.supports_operation(v));
                let scoped = r.namespaces.is_none() && r.namespace_selector.is_none();
                if watchable
                    && (namespaced || scoped)
                    && r.matches(&api.group, &api.version, &api.plural, &api.kind)
                {
                    // Taken already: the earlier entry owns it.
                    let _ = claim(ResolvedResource {
                        config: r.clone(),
                        api,
                        namespaced,
                    });
                }
            }
        }
    }
    chosen.sort_by(|a, b| {
        (a.config.index, &a.api.group, &a.api.plural).cmp(&(
            b.config.index,
            &b.api.group,
            &b.api.plural,
        ))
    });
    (chosen, errors)
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
    if !namespaced && (r.namespaces.is_some() || r.namespace_selector.is_some()) {
        return Err(format!(
            "{at}.namespaces: {} is cluster-scoped; remove namespaces and namespaceSelector",
            api.plural
        ));
    }
    Ok(ResolvedResource {
        config: r.clone(),
        api: api.clone(),
        namespaced,
    })
}

/// The namespaces matching `selector` now (one LIST), for commands that do not follow them.
pub(crate) async fn list_namespaces(
    client: &Client,
    selector: &str,
) -> Result<std::collections::BTreeSet<String>, kube::Error> {
    let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    let list = api
        .list_metadata(&kube::api::ListParams::default().labels(selector))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|ns| ns.metadata.name)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigFile;
    use std::collections::{BTreeSet, HashMap};

    fn resolved(entry: &str) -> ResolvedResource {
        let yaml = format!("cluster: dev\nresources: [{entry}]\n");
        let config = ConfigFile::parse(&yaml).unwrap().validate().unwrap();
        ResolvedResource {
            config: config.resources[0].clone(),
            api: ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
            namespaced: true,
        }
    }

    #[test]
    fn scopes_follow_namespaces_selectors_or_everything() {
        let selected = HashMap::from([(
            "team=a".to_string(),
            BTreeSet::from(["x".to_string(), "y".to_string()]),
        )]);
        let by_selector =
            resolved("{apiVersion: v1, resource: configmaps, namespaceSelector: team=a}");
        assert_eq!(
            by_selector.scopes(&selected),
            [Some("x".into()), Some("y".into())]
        );
        assert!(
            by_selector.scopes(&HashMap::new()).is_empty(),
            "no namespace matches yet"
        );
        let listed = resolved("{apiVersion: v1, resource: configmaps, namespaces: [b]}");
        assert_eq!(listed.scopes(&selected), [Some("b".to_string())]);
        let all = resolved("{apiVersion: v1, resource: configmaps}");
        assert_eq!(all.scopes(&selected), [None]);
    }
}
