//! The RBAC objects the bridge needs, rendered from its resolved resources.
//!
//! The bridge only lists and watches the resources it is configured to watch (`list`, `watch`:
//! nothing reads one object with `get`) and, for leader election, reads and writes
//! `coordination.k8s.io` Leases in its own namespace (`get`, `create`, `update`).
//! [`permissions`] computes those grants and [`render`] turns them into multi-document YAML that
//! `kubectl apply -f -` accepts:
//!
//! - resources watched only in listed namespaces get a `Role` + `RoleBinding` in each of those
//!   namespaces, so the bridge cannot read the same kind elsewhere;
//! - resources watched in every namespace, and cluster-scoped resources, get one `ClusterRole` +
//!   `ClusterRoleBinding` (only those resources: a Secret watched in one namespace stays a `Role`
//!   even when another entry needs the cluster role);
//! - the Lease grants are a `Role` + `RoleBinding` in the bridge's own namespace.
//!
//! In a fleet, each cluster gets its own: a member reached through a kubeconfig needs list and
//! watch on the resources watched there and the read of its identity, nothing about Leases
//! ([`needs`] with its name); the bridge's own cluster needs its resources if it is a member,
//! the Leases, and with `clusterSecrets` a `Role` + `RoleBinding` granting `get`, `list` and
//! `watch` on Secrets in that one namespace ([`needs`] without a name). [`render_needs`] renders
//! either.
//!
//! Resources are taken after discovery ([`crate::discovery::resolve`]) because RBAC names the
//! plural (`configmaps`), while a configuration may name the kind (`ConfigMap`). A wildcard entry
//! (`resource: "*"`) is granted the resources discovery resolved it to, each by name: never `*`,
//! which in RBAC also matches every subresource (`nodes/proxy`, `pods/exec`) and cannot leave out
//! an excluded resource (Secrets). Any wildcard adds `list` and `watch` on
//! CustomResourceDefinitions; a `namespaceSelector` adds `list` and `watch` on Namespaces.
//! Resources a wildcard matches only later (a new CRD) need the RBAC rendered again.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

use crate::config::Config;
use crate::discovery::ResolvedResource;

/// The verbs granted on every watched resource, and on Namespaces and CRDs when followed: the
/// bridge lists and watches, it never reads a single object (`get`) nor writes.
pub const WATCH_VERBS: [&str; 2] = ["list", "watch"];

/// The verbs granted on Leases in the bridge's own namespace (leader election).
pub const LEASE_VERBS: [&str; 3] = ["get", "create", "update"];

/// The verbs granted on Leases with sharding: replicas also follow the group's Leases (`list`,
/// `watch`) and a replica leaving deletes its member Lease (`delete`).
pub const SHARDING_LEASE_VERBS: [&str; 6] = ["get", "list", "watch", "create", "update", "delete"];

/// The API group of Leases.
pub const LEASE_GROUP: &str = "coordination.k8s.io";

/// Resources as RBAC names them: API group (`""` for core) → plural resource names.
pub type Grants = BTreeMap<String, BTreeSet<String>>;

/// What the bridge may read, split by where the grant must apply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permissions {
    /// Resources read in every namespace, or cluster-scoped: granted by a `ClusterRole`.
    pub cluster: Grants,
    /// Resources read only in listed namespaces: namespace → grants, each granted by a `Role`
    /// in that namespace. A resource already in [`Permissions::cluster`] is not repeated here.
    pub namespaced: BTreeMap<String, Grants>,
}

/// Computes where each resource must be readable: entries without `namespaces` (all namespaces,
/// or a cluster-scoped resource) go to the cluster grants, the others to each listed namespace.
pub fn permissions(resources: &[ResolvedResource]) -> Permissions {
    let mut out = Permissions::default();
    for r in resources {
        match &r.config.namespaces {
            Some(list) if r.namespaced => {
                for ns in list {
                    add(out.namespaced.entry(ns.clone()).or_default(), r);
                }
            }
            // Cluster-scoped resources, and namespaced ones watched everywhere.
            _ => add(&mut out.cluster, r),
        }
    }
    // Following namespaces by label, and CRDs for wildcards, reads them cluster-wide.
    if resources
        .iter()
        .any(|r| r.config.namespace_selector.is_some())
    {
        grant(&mut out.cluster, "", "namespaces");
    }
    if resources.iter().any(|r| r.config.is_wildcard()) {
        grant(&mut out.cluster, CRD_GROUP, "customresourcedefinitions");
    }
    // A grant the cluster role already gives needs no Role.
    for grants in out.namespaced.values_mut() {
        for (group, plurals) in grants.iter_mut() {
            if let Some(everywhere) = out.cluster.get(group) {
                plurals.retain(|p| !everywhere.contains(p));
            }
        }
        grants.retain(|_, plurals| !plurals.is_empty());
    }
    out.namespaced.retain(|_, grants| !grants.is_empty());
    out
}

/// Grants one resolved resource by its plural, also when a wildcard entry resolved it: discovery
/// lists no subresources and has already left out what the entry excludes.
fn add(grants: &mut Grants, r: &ResolvedResource) {
    grant(grants, &r.api.group, &r.api.plural);
}

fn grant(grants: &mut Grants, group: &str, plural: &str) {
    grants
        .entry(group.to_string())
        .or_default()
        .insert(plural.to_string());
}

/// The API group of CustomResourceDefinitions.
pub const CRD_GROUP: &str = "apiextensions.k8s.io";

/// The name of every Role and ClusterRole (and its binding) that grants reads to the bridge
/// running as `service_account` in `namespace`: `kube-event-bridge:<namespace>:<service-account>`.
/// It names the bridge's own namespace so that two bridges with the same account name in
/// different namespaces never share a ClusterRole, nor a Role in a namespace both watch.
pub fn role_name(service_account: &str, namespace: &str) -> String {
    format!("kube-event-bridge:{namespace}:{service_account}")
}

/// The name of the Role (and binding) for leader election: [`role_name`] plus `:leader-election`.
pub fn lease_role_name(service_account: &str, namespace: &str) -> String {
    format!("{}:leader-election", role_name(service_account, namespace))
}

/// The namespace whose uid identifies the cluster: checkpoints belong to it, and it is the
/// `clusterid` extension.
pub const IDENTITY_NAMESPACE: &str = "kube-system";

/// The Role (in [`IDENTITY_NAMESPACE`]) that lets the bridge read that namespace alone.
pub fn identity_role_name(service_account: &str, namespace: &str) -> String {
    format!("{}:cluster-identity", role_name(service_account, namespace))
}

/// Renders the RBAC objects the bridge needs when it runs as `service_account` in `namespace`,
/// reading `resources` (resolved through discovery), as multi-document YAML: a commented
/// header, then the ClusterRole and ClusterRoleBinding (only if some resource is watched in
/// every namespace or is cluster-scoped), a Role and RoleBinding per namespace with fixed-
/// namespace resources, and, when leader election is on (`lease_namespace` is where its Lease
/// lives), the leader-election Role and RoleBinding there. When the bridge reads the cluster's
/// identity (`identity`: checkpoints are kept, or the `clusterid` extension is on, see
/// [`crate::config::Config::reads_cluster_identity`]), a Role in `kube-system` grants `get` on
/// that one Namespace (by name), whose uid ties checkpoints to the cluster and is the `clusterid`.
///
/// The ServiceAccount itself is not rendered (a Helm chart or `kubectl create serviceaccount`
/// owns it). The output is deterministic: objects and rules are sorted.
pub fn render(
    resources: &[ResolvedResource],
    service_account: &str,
    namespace: &str,
    lease_namespace: Option<&str>,
    identity: bool,
) -> String {
    let leases = lease_namespace.map(|ns| (ns, &LEASE_VERBS[..]));
    render_with_leases(resources, service_account, namespace, leases, identity)
}

/// [`render`], granting `verbs` on Leases in the namespace `leases` names (leader election:
/// [`LEASE_VERBS`]; sharding: [`SHARDING_LEASE_VERBS`]).
pub fn render_with_leases(
    resources: &[ResolvedResource],
    service_account: &str,
    namespace: &str,
    leases: Option<(&str, &[&str])>,
    identity: bool,
) -> String {
    let needs = Needs {
        leases: leases.map(|(ns, verbs)| {
            (
                ns.to_string(),
                verbs.iter().map(|v| v.to_string()).collect(),
            )
        }),
        identity,
        ..Needs::default()
    };
    render_needs(resources, service_account, namespace, &needs)
}

/// What the bridge needs in one cluster besides list and watch on the resources watched there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs {
    /// The cluster and its part in the configuration, for the header; `None` for the single
    /// cluster of a configuration without a fleet (the header then reads as it always did).
    pub cluster: Option<Part>,
    /// The namespace of the Leases and the verbs on them (leader election or sharding).
    pub leases: Option<(String, Vec<String>)>,
    /// The namespace of the kubeconfig Secrets the bridge reads (`clusterSecrets`).
    pub cluster_secrets: Option<String>,
    /// The namespace of the snapshot requests the bridge follows (`snapshotRequests`).
    pub snapshot_requests: Option<String>,
    /// Whether the bridge reads the cluster's identity (`get` on namespace `kube-system`).
    pub identity: bool,
    /// Entries of `resources` not watched in this cluster (not served there, or watching the
    /// objects of an earlier entry): named in the header, not granted.
    pub not_served: Vec<String>,
}

/// A cluster's part in a fleet, as the header of its RBAC names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// The bridge's own cluster (its Leases, the kubeconfig Secrets), named `cluster`; `member`
    /// when the bridge also watches it.
    Own {
        /// The cluster's name.
        name: String,
        /// Whether it is also a member of the fleet.
        member: bool,
    },
    /// A member the bridge reaches through a kubeconfig: only its watched resources and identity.
    Member {
        /// The cluster's name.
        name: String,
        /// The bridge's own cluster, where the Leases live.
        own: String,
    },
}

/// The name of the Role (and binding) granting reads of the kubeconfig Secrets:
/// [`role_name`] plus `:cluster-secrets`.
pub fn cluster_secrets_role_name(service_account: &str, namespace: &str) -> String {
    format!("{}:cluster-secrets", role_name(service_account, namespace))
}

/// The name of the Role (and binding) granting access to the snapshot requests:
/// [`role_name`] plus `:snapshot-requests`.
pub fn snapshot_requests_role_name(service_account: &str, namespace: &str) -> String {
    format!(
        "{}:snapshot-requests",
        role_name(service_account, namespace)
    )
}

/// The verbs granted on ConfigMaps in `snapshotRequests.namespace`: the bridge follows the
/// requests (`list`, `watch`), reads one (`get`) and records its progress (`patch`). Never
/// cluster-wide; who may ask for a snapshot is whoever may create ConfigMaps there.
pub const SNAPSHOT_REQUEST_VERBS: [&str; 4] = ["get", "list", "watch", "patch"];

/// The verbs granted on Secrets in `clusterSecrets.namespace`: the bridge follows them (`list`,
/// `watch`) and commands read one cluster's (`get`). Never cluster-wide.
pub const CLUSTER_SECRET_VERBS: [&str; 3] = ["get", "list", "watch"];

/// What one cluster of `config` needs: `cluster` is `None` for the bridge's own cluster (its
/// member's resources, if it is one, the Leases and the kubeconfig Secrets), or a member's name
/// (its resources and identity; Leases only live in the bridge's own cluster). `namespace` is the
/// bridge's, where its Leases live unless the configuration names another namespace. Pure: the
/// resources watched there are resolved by the caller.
pub fn needs(config: &Config, cluster: Option<&str>, namespace: &str) -> Needs {
    let fleet = config.fleet.is_fleet();
    let own = crate::clusters::own(config).map(|c| c.name.clone());
    match cluster {
        Some(name) if !crate::clusters::is_own(config, name) => Needs {
            cluster: Some(Part::Member {
                name: name.to_string(),
                own: config.cluster.clone(),
            }),
            identity: config.reads_cluster_identity(),
            ..Needs::default()
        },
        _ => Needs {
            cluster: fleet.then(|| Part::Own {
                name: own.clone().unwrap_or_else(|| config.cluster.clone()),
                member: own.is_some(),
            }),
            leases: leases(config, namespace),
            cluster_secrets: config.fleet.secrets.as_ref().map(|s| s.namespace.clone()),
            snapshot_requests: snapshot_requests(config, namespace),
            // The identity is read by each member, not by the bridge's own cluster as such.
            identity: own.is_some() && config.reads_cluster_identity(),
            not_served: Vec::new(),
        },
    }
}

/// The namespace of the snapshot requests, when the bridge follows them: the configured one,
/// else the bridge's own (where `$POD_NAMESPACE` points).
pub fn snapshot_requests(config: &Config, namespace: &str) -> Option<String> {
    let requests = &config.snapshot_requests;
    requests.enabled.then(|| {
        requests
            .namespace
            .clone()
            .unwrap_or_else(|| namespace.into())
    })
}

/// The namespace of the Leases and their verbs: sharding's, else leader election's, in the
/// bridge's own namespace unless the configuration names another.
pub fn leases(config: &Config, namespace: &str) -> Option<(String, Vec<String>)> {
    let (election, sharding) = (&config.leader_election, &config.sharding);
    if sharding.enabled {
        let ns = sharding.namespace.as_deref().unwrap_or(namespace);
        Some((
            ns.to_string(),
            SHARDING_LEASE_VERBS.map(String::from).to_vec(),
        ))
    } else if election.enabled {
        let ns = election.namespace.as_deref().unwrap_or(namespace);
        Some((ns.to_string(), LEASE_VERBS.map(String::from).to_vec()))
    } else {
        None
    }
}

/// Renders what `needs` says, with list and watch on `resources` (resolved through discovery in
/// that cluster), for the bridge running as `service_account` in `namespace`: as [`render`], plus
/// a Role and RoleBinding in the namespace of the kubeconfig Secrets when the bridge reads them,
/// and one in the namespace of the snapshot requests when it follows them.
pub fn render_needs(
    resources: &[ResolvedResource],
    service_account: &str,
    namespace: &str,
    needs: &Needs,
) -> String {
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: service_account.into(),
        namespace: Some(namespace.into()),
        api_group: None,
    };
    let mut docs = watch_grants(resources, &role_name(service_account, namespace), &subject);
    let mut out = header(service_account, namespace, needs);
    if let Some((lease_ns, verbs)) = &needs.leases {
        let role = lease_role_name(service_account, namespace);
        let rule = policy(LEASE_GROUP, "leases", verbs);
        docs.extend(granted(&role, lease_ns, rule, &subject));
    }
    // Core objects read in one namespace alone: the fleet's kubeconfig Secrets, the requests.
    let core = [
        (
            &needs.cluster_secrets,
            cluster_secrets_role_name(service_account, namespace),
            "secrets",
            &CLUSTER_SECRET_VERBS[..],
            "the kubeconfig Secrets of the fleet's clusters",
        ),
        (
            &needs.snapshot_requests,
            snapshot_requests_role_name(service_account, namespace),
            "configmaps",
            &SNAPSHOT_REQUEST_VERBS[..],
            "snapshot requests (snapshotRequests)",
        ),
    ];
    for (ns, role, plural, verbs, what) in core {
        let Some(ns) = ns else { continue };
        docs.extend(granted(&role, ns, policy("", plural, verbs), &subject));
        out.push_str(&format!(
            "# {} on {plural} in {ns} alone: {what}.\n",
            verbs.join(", ")
        ));
    }
    if needs.identity {
        let role = identity_role_name(service_account, namespace);
        let rule = PolicyRule {
            resource_names: Some(vec![IDENTITY_NAMESPACE.into()]),
            ..policy("", "namespaces", &["get"])
        };
        docs.extend(granted(&role, IDENTITY_NAMESPACE, rule, &subject));
        out.push_str(&format!(
            "# get on namespace {IDENTITY_NAMESPACE}, whose uid identifies this cluster (checkpoints, clusterid).\n"
        ));
    }
    for missing in &needs.not_served {
        out.push_str(&format!("# not watched here, not granted: {missing}\n"));
    }
    for doc in docs {
        out.push_str("---\n");
        out.push_str(&doc);
    }
    out
}

/// The ClusterRole and Roles (with their bindings) granting list and watch on `resources`.
fn watch_grants(resources: &[ResolvedResource], name: &str, subject: &Subject) -> Vec<String> {
    let perms = permissions(resources);
    let mut docs = Vec::new();
    if !perms.cluster.is_empty() {
        docs.push(yaml(&ClusterRole {
            metadata: meta(name, None),
            rules: Some(rules(&perms.cluster)),
            aggregation_rule: None,
        }));
        docs.push(yaml(&ClusterRoleBinding {
            metadata: meta(name, None),
            role_ref: role_ref("ClusterRole", name),
            subjects: Some(vec![subject.clone()]),
        }));
    }
    for (ns, grants) in &perms.namespaced {
        docs.push(yaml(&Role {
            metadata: meta(name, Some(ns)),
            rules: Some(rules(grants)),
        }));
        docs.push(yaml(&RoleBinding {
            metadata: meta(name, Some(ns)),
            role_ref: role_ref("Role", name),
            subjects: Some(vec![subject.clone()]),
        }));
    }
    docs
}

/// The header's first lines: the cluster's part in a fleet, the account, what it may watch and
/// its Lease access.
fn header(service_account: &str, namespace: &str, needs: &Needs) -> String {
    let mut out = String::new();
    match &needs.cluster {
        None => {}
        Some(Part::Own { name, member }) => {
            let watched = if *member {
                "a member of the fleet: its watched resources, "
            } else {
                "not a member of the fleet: "
            };
            out.push_str(&format!(
                "# Cluster {name}, the bridge's own ({watched}its Leases and kubeconfig Secrets); apply it there.\n"
            ));
        }
        Some(Part::Member { name, own }) => out.push_str(&format!(
            "# Cluster {name} of the fleet; apply it there. The ServiceAccount below must be the identity of\n\
             # the bridge's kubeconfig for {name}. Its Leases live in {own}: `rbac` without --cluster.\n"
        )),
    }
    let watched = match &needs.cluster {
        Some(Part::Own { member: false, .. }) => "no resources watched here".to_string(),
        Some(Part::Member { .. } | Part::Own { member: true, .. }) => format!(
            "{} on the resources watched in this cluster",
            WATCH_VERBS.join(", ")
        ),
        _ => format!("{} on the configured resources", WATCH_VERBS.join(", ")),
    };
    out.push_str(&format!(
        "# RBAC for kube-event-bridge running as system:serviceaccount:{namespace}:{service_account}:\n\
         # {watched}"
    ));
    match (&needs.leases, &needs.cluster) {
        (Some((lease_ns, verbs)), _) => {
            out.push_str(&format!(
                ", {} on leases in {lease_ns}.\n",
                verbs.join(", ")
            ));
        }
        (None, Some(Part::Member { .. })) => out.push_str(".\n"),
        (None, _) => out.push_str(" (leader election and sharding off: no Lease access).\n"),
    }
    out
}

/// A Role named `role` in `namespace` holding `rule`, and its RoleBinding to `subject`.
fn granted(role: &str, namespace: &str, rule: PolicyRule, subject: &Subject) -> [String; 2] {
    [
        yaml(&Role {
            metadata: meta(role, Some(namespace)),
            rules: Some(vec![rule]),
        }),
        yaml(&RoleBinding {
            metadata: meta(role, Some(namespace)),
            role_ref: role_ref("Role", role),
            subjects: Some(vec![subject.clone()]),
        }),
    ]
}

/// `verbs` on `plural` of API group `group`.
fn policy(group: &str, plural: &str, verbs: &[impl ToString]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(vec![plural.into()]),
        verbs: verbs.iter().map(ToString::to_string).collect(),
        ..PolicyRule::default()
    }
}

/// One rule per API group, its plurals sorted, the watch verbs.
fn rules(grants: &Grants) -> Vec<PolicyRule> {
    grants
        .iter()
        .map(|(group, plurals)| PolicyRule {
            api_groups: Some(vec![group.clone()]),
            resources: Some(plurals.iter().cloned().collect()),
            verbs: WATCH_VERBS.iter().map(|v| v.to_string()).collect(),
            ..PolicyRule::default()
        })
        .collect()
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(Into::into),
        labels: Some(
            [
                ("app.kubernetes.io/name", "kube-event-bridge"),
                ("app.kubernetes.io/component", "rbac"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ),
        ..ObjectMeta::default()
    }
}

fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".into(),
        kind: kind.into(),
        name: name.into(),
    }
}

fn yaml(object: &impl Serialize) -> String {
    // Plain structs of strings, vectors and maps: serialization cannot fail.
    serde_saphyr::to_string(object).expect("RBAC objects serialize to YAML")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigFile;
    use kube::core::{ApiResource, GroupVersionKind};
    use serde_json::Value;

    /// Resolves a config's resources by hand: `(kind, plural, namespaced)` per entry, in order.
    fn resolved(yaml: &str, api: &[(&str, &str, bool)]) -> Vec<ResolvedResource> {
        let cfg = ConfigFile::parse(yaml).unwrap().validate().unwrap();
        assert_eq!(cfg.resources.len(), api.len());
        cfg.resources
            .into_iter()
            .zip(api)
            .map(|(r, (kind, plural, namespaced))| ResolvedResource {
                api: ApiResource::from_gvk_with_plural(
                    &GroupVersionKind::gvk(&r.group, &r.version, kind),
                    plural,
                ),
                config: r,
                namespaced: *namespaced,
            })
            .collect()
    }

    fn grants(entries: &[(&str, &[&str])]) -> Grants {
        entries
            .iter()
            .map(|(g, ps)| (g.to_string(), ps.iter().map(|p| p.to_string()).collect()))
            .collect()
    }

    /// The documents of a rendering, as generic values.
    fn docs(text: &str) -> Vec<Value> {
        serde_saphyr::from_str_multiple::<Value, Vec<Value>>(text)
            .unwrap()
            .into_iter()
            .filter(|v| !v.is_null())
            .collect()
    }

    fn summary(doc: &Value) -> String {
        let ns = doc["metadata"]["namespace"].as_str().unwrap_or("-");
        format!(
            "{} {ns}/{}",
            doc["kind"].as_str().unwrap(),
            doc["metadata"]["name"].as_str().unwrap()
        )
    }

    const STDOUT_EXAMPLE: &str = "cluster: dev\nresources:\n\
        - {apiVersion: v1, resource: configmaps, namespaces: [demo]}\n\
        - {apiVersion: v1, resource: Secret, namespaces: [demo]}\n\
        - {apiVersion: v1, resource: namespaces}\n";

    #[test]
    fn kinds_are_granted_by_their_plural_and_split_by_scope() {
        let rs = resolved(
            STDOUT_EXAMPLE,
            &[
                ("ConfigMap", "configmaps", true),
                ("Secret", "secrets", true),
                ("Namespace", "namespaces", false),
            ],
        );
        let p = permissions(&rs);
        assert_eq!(p.cluster, grants(&[("", &["namespaces"])]));
        assert_eq!(
            p.namespaced,
            [(
                "demo".to_string(),
                grants(&[("", &["configmaps", "secrets"])])
            )]
            .into()
        );
    }

    #[test]
    fn wildcards_grant_their_resolved_resources_crds_selectors_grant_namespaces() {
        let rs = resolved(
            "cluster: dev\nresources:\n\
             - {apiVersion: example.com/v1, resource: '*', namespaces: [a]}\n\
             - {apiVersion: apps/v1, resource: deployments, namespaceSelector: team=x}\n",
            &[
                ("Widget", "widgets", true),
                ("Deployment", "deployments", true),
            ],
        );
        let p = permissions(&rs);
        assert_eq!(
            p.cluster,
            grants(&[
                ("", &["namespaces"]),
                ("apiextensions.k8s.io", &["customresourcedefinitions"]),
                ("apps", &["deployments"]),
            ])
        );
        assert_eq!(
            p.namespaced,
            [("a".to_string(), grants(&[("example.com", &["widgets"])]))].into()
        );
    }

    /// What discovery resolves `apiVersion: v1, resource: "*"` to with Secrets excluded: every
    /// core resource that can be listed and watched (`(kind, plural, namespaced)`), no
    /// subresource, no Secret.
    const CORE_WATCHABLE: [(&str, &str, bool); 14] = [
        ("ConfigMap", "configmaps", true),
        ("Endpoints", "endpoints", true),
        ("Event", "events", true),
        ("LimitRange", "limitranges", true),
        ("Namespace", "namespaces", false),
        ("Node", "nodes", false),
        ("PersistentVolumeClaim", "persistentvolumeclaims", true),
        ("PersistentVolume", "persistentvolumes", false),
        ("Pod", "pods", true),
        ("PodTemplate", "podtemplates", true),
        ("ReplicationController", "replicationcontrollers", true),
        ("ResourceQuota", "resourcequotas", true),
        ("ServiceAccount", "serviceaccounts", true),
        ("Service", "services", true),
    ];

    /// The core wildcard (Secrets excluded) expanded as discovery does, then an explicit entry.
    fn core_wildcard() -> Vec<ResolvedResource> {
        let cfg = ConfigFile::parse(
            "cluster: dev\nresources:\n\
             - {apiVersion: v1, resource: '*', exclude: [{resource: secrets}]}\n\
             - {apiVersion: apps/v1, resource: Deployment, namespaces: [shop]}\n",
        )
        .unwrap()
        .validate()
        .unwrap();
        let core = CORE_WATCHABLE.iter().map(|(kind, plural, namespaced)| {
            assert!(cfg.resources[0].matches("", "v1", plural, kind));
            ResolvedResource {
                api: ApiResource::from_gvk_with_plural(
                    &GroupVersionKind::gvk("", "v1", kind),
                    plural,
                ),
                config: cfg.resources[0].clone(),
                namespaced: *namespaced,
            }
        });
        let deployment = ResolvedResource {
            api: ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("apps", "v1", "Deployment"),
                "deployments",
            ),
            config: cfg.resources[1].clone(),
            namespaced: true,
        };
        core.chain([deployment]).collect()
    }

    #[test]
    fn a_core_wildcard_grants_list_and_watch_on_each_resolved_resource_by_name() {
        let rs = core_wildcard();
        assert!(!rs[0].config.matches("", "v1", "secrets", "Secret"));
        let p = permissions(&rs);
        let plurals: Vec<&str> = CORE_WATCHABLE.iter().map(|(_, p, _)| *p).collect();
        assert_eq!(
            p.cluster,
            grants(&[
                ("", &plurals),
                ("apiextensions.k8s.io", &["customresourcedefinitions"]),
            ])
        );
        assert_eq!(
            p.namespaced,
            [("shop".to_string(), grants(&[("apps", &["deployments"])]))].into()
        );
        let text = render(&rs, "keb", "ops", Some("ops"), false);
        let d = docs(&text);
        for doc in d
            .iter()
            .filter(|doc| !summary(doc).contains("leader-election"))
        {
            for rule in doc["rules"].as_array().into_iter().flatten() {
                let verbs: Vec<&str> = rule["verbs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap())
                    .collect();
                assert_eq!(verbs, ["list", "watch"], "{text}");
                for resource in rule["resources"].as_array().unwrap() {
                    let resource = resource.as_str().unwrap();
                    assert!(
                        resource != "*" && !resource.contains('/') && resource != "secrets",
                        "{resource} granted:\n{text}"
                    );
                }
                assert!(!rule["apiGroups"][0].as_str().unwrap().contains('*'));
            }
        }
        let kinds: Vec<String> = d.iter().map(summary).collect();
        assert_eq!(
            kinds,
            [
                "ClusterRole -/kube-event-bridge:ops:keb",
                "ClusterRoleBinding -/kube-event-bridge:ops:keb",
                "Role shop/kube-event-bridge:ops:keb",
                "RoleBinding shop/kube-event-bridge:ops:keb",
                "Role ops/kube-event-bridge:ops:keb:leader-election",
                "RoleBinding ops/kube-event-bridge:ops:keb:leader-election",
            ]
        );
    }

    #[test]
    fn only_leases_get_a_verb_beyond_list_and_watch() {
        let text = render(&core_wildcard(), "keb", "ops", Some("ops"), false);
        let verbs: BTreeSet<String> = docs(&text)
            .iter()
            .flat_map(|doc| doc["rules"].as_array().cloned().unwrap_or_default())
            .flat_map(|rule| {
                let leases = rule["resources"][0] == "leases";
                rule["verbs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| {
                        format!(
                            "{}{}",
                            v.as_str().unwrap(),
                            if leases { " leases" } else { "" }
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let expected: BTreeSet<String> = [
            "list",
            "watch",
            "get leases",
            "create leases",
            "update leases",
        ]
        .map(String::from)
        .into();
        assert_eq!(verbs, expected, "{text}");
    }

    #[test]
    fn sharding_may_also_list_watch_and_delete_leases() {
        let text = render_with_leases(
            &core_wildcard(),
            "keb",
            "ops",
            Some(("shards", &SHARDING_LEASE_VERBS)),
            false,
        );
        let lease = docs(&text)
            .into_iter()
            .find(|d| d["kind"] == "Role" && d["metadata"]["namespace"] == "shards")
            .unwrap_or_else(|| panic!("no Lease Role in {text}"));
        let expected: Value = serde_saphyr::from_str(
            "- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, list, watch, create, update, delete]}\n",
        )
        .unwrap();
        assert_eq!(lease["rules"], expected);
        assert!(text.contains("get, list, watch, create, update, delete on leases in shards"));
    }

    #[test]
    fn fixed_namespaces_only_render_roles_per_namespace_and_no_cluster_role() {
        let rs = resolved(
            "cluster: dev\nresources:\n\
             - {apiVersion: apps/v1, resource: Deployment, namespaces: [b, a]}\n\
             - {apiVersion: v1, resource: configmaps, namespaces: [a]}\n\
             - {apiVersion: stable.example.com/v1, resource: CronTab, namespaces: [a]}\n",
            &[
                ("Deployment", "deployments", true),
                ("ConfigMap", "configmaps", true),
                ("CronTab", "crontabs", true),
            ],
        );
        let text = render(&rs, "bridge", "ops", Some("ops"), false);
        let d = docs(&text);
        let kinds: Vec<String> = d.iter().map(summary).collect();
        assert_eq!(
            kinds,
            [
                "Role a/kube-event-bridge:ops:bridge",
                "RoleBinding a/kube-event-bridge:ops:bridge",
                "Role b/kube-event-bridge:ops:bridge",
                "RoleBinding b/kube-event-bridge:ops:bridge",
                "Role ops/kube-event-bridge:ops:bridge:leader-election",
                "RoleBinding ops/kube-event-bridge:ops:bridge:leader-election",
            ]
        );
        let rules_a: Value = serde_saphyr::from_str(
            "- {apiGroups: [''], resources: [configmaps], verbs: [list, watch]}\n\
             - {apiGroups: [apps], resources: [deployments], verbs: [list, watch]}\n\
             - {apiGroups: [stable.example.com], resources: [crontabs], verbs: [list, watch]}\n",
        )
        .unwrap();
        assert_eq!(d[0]["rules"], rules_a, "{text}");
        let rules_b: Value = serde_saphyr::from_str(
            "- {apiGroups: [apps], resources: [deployments], verbs: [list, watch]}\n",
        )
        .unwrap();
        assert_eq!(d[2]["rules"], rules_b, "{text}");
        for binding in [&d[1], &d[3]] {
            assert_eq!(binding["roleRef"]["kind"], "Role");
            assert_eq!(binding["roleRef"]["name"], "kube-event-bridge:ops:bridge");
            assert_eq!(binding["subjects"][0]["kind"], "ServiceAccount");
            assert_eq!(binding["subjects"][0]["name"], "bridge");
            assert_eq!(binding["subjects"][0]["namespace"], "ops");
        }
    }

    #[test]
    fn all_namespaces_and_cluster_scoped_resources_need_the_cluster_role() {
        let rs = resolved(
            "cluster: dev\nresources:\n\
             - {apiVersion: v1, resource: pods}\n\
             - {apiVersion: rbac.authorization.k8s.io/v1, resource: ClusterRole}\n\
             - {apiVersion: v1, resource: Secret, namespaces: [vault]}\n",
            &[
                ("Pod", "pods", true),
                ("ClusterRole", "clusterroles", false),
                ("Secret", "secrets", true),
            ],
        );
        let d = docs(&render(&rs, "keb", "keb-system", Some("keb-system"), false));
        let kinds: Vec<String> = d.iter().map(summary).collect();
        assert_eq!(
            kinds,
            [
                "ClusterRole -/kube-event-bridge:keb-system:keb",
                "ClusterRoleBinding -/kube-event-bridge:keb-system:keb",
                "Role vault/kube-event-bridge:keb-system:keb",
                "RoleBinding vault/kube-event-bridge:keb-system:keb",
                "Role keb-system/kube-event-bridge:keb-system:keb:leader-election",
                "RoleBinding keb-system/kube-event-bridge:keb-system:keb:leader-election",
            ]
        );
        let cluster_rules: Value = serde_saphyr::from_str(
            "- {apiGroups: [''], resources: [pods], verbs: [list, watch]}\n\
             - {apiGroups: [rbac.authorization.k8s.io], resources: [clusterroles], verbs: [list, watch]}\n",
        )
        .unwrap();
        assert_eq!(d[0]["rules"], cluster_rules);
        assert_eq!(d[1]["roleRef"]["kind"], "ClusterRole");
        // The Secret stays readable in its one namespace only.
        assert_eq!(d[2]["rules"][0]["resources"][0], "secrets");
    }

    #[test]
    fn a_namespace_grant_covered_by_the_cluster_role_is_not_repeated() {
        let rs = resolved(
            "cluster: dev\nresources:\n\
             - {apiVersion: v1, resource: configmaps, namespaces: [a], labelSelector: x=1}\n\
             - {apiVersion: v1, resource: configmaps, labelSelector: x=2}\n",
            &[
                ("ConfigMap", "configmaps", true),
                ("ConfigMap", "configmaps", true),
            ],
        );
        let p = permissions(&rs);
        assert_eq!(p.cluster, grants(&[("", &["configmaps"])]));
        assert!(p.namespaced.is_empty(), "{p:?}");
    }

    #[test]
    fn leases_are_granted_in_the_bridge_namespace_only() {
        let rs = resolved(
            "cluster: dev\nresources: [{apiVersion: v1, resource: configmaps}]\n",
            &[("ConfigMap", "configmaps", true)],
        );
        let text = render(&rs, "sa", "home", Some("home"), false);
        assert!(
            text.starts_with(
                "# RBAC for kube-event-bridge running as system:serviceaccount:home:sa"
            )
        );
        let d = docs(&text);
        let lease = d
            .iter()
            .find(|x| x["kind"] == "Role")
            .expect("leader-election Role");
        assert_eq!(lease["metadata"]["namespace"], "home");
        let expected: Value = serde_saphyr::from_str(
            "- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, create, update]}\n",
        )
        .unwrap();
        assert_eq!(lease["rules"], expected);
        for doc in &d {
            assert_eq!(
                doc["metadata"]["labels"]["app.kubernetes.io/name"],
                "kube-event-bridge"
            );
            let api_version = doc["apiVersion"].as_str().unwrap();
            assert_eq!(api_version, "rbac.authorization.k8s.io/v1");
        }
    }

    #[test]
    fn leases_follow_the_lease_namespace_and_are_left_out_without_leader_election() {
        let rs = resolved(
            "cluster: dev\nresources: [{apiVersion: v1, resource: configmaps}]\n",
            &[("ConfigMap", "configmaps", true)],
        );
        let elsewhere = docs(&render(&rs, "sa", "home", Some("elections"), false));
        let lease = elsewhere
            .iter()
            .find(|x| x["kind"] == "Role")
            .expect("leader-election Role");
        assert_eq!(lease["metadata"]["namespace"], "elections");
        assert_eq!(
            lease["metadata"]["name"],
            "kube-event-bridge:home:sa:leader-election"
        );
        let text = render(&rs, "sa", "home", None, false);
        let kinds: Vec<String> = docs(&text).iter().map(summary).collect();
        assert_eq!(
            kinds,
            [
                "ClusterRole -/kube-event-bridge:home:sa",
                "ClusterRoleBinding -/kube-event-bridge:home:sa",
            ]
        );
        assert!(!text.contains("leases"), "{text}");
    }

    #[test]
    fn rendering_is_deterministic() {
        let api = [
            ("ConfigMap", "configmaps", true),
            ("Secret", "secrets", true),
            ("Namespace", "namespaces", false),
        ];
        let a = render(&resolved(STDOUT_EXAMPLE, &api), "x", "y", None, false);
        let b = render(&resolved(STDOUT_EXAMPLE, &api), "x", "y", None, false);
        assert_eq!(a, b);
    }

    #[test]
    fn kept_checkpoints_add_get_on_the_kube_system_namespace_alone() {
        let rs = resolved(
            STDOUT_EXAMPLE,
            &[
                ("ConfigMap", "configmaps", true),
                ("Secret", "secrets", true),
                ("Namespace", "namespaces", false),
            ],
        );
        let without = render(&rs, "sa", "home", None, false);
        assert!(!without.contains(IDENTITY_NAMESPACE), "{without}");
        let d = docs(&render(&rs, "sa", "home", None, true));
        let role = d
            .iter()
            .find(|d| d["kind"] == "Role" && d["metadata"]["namespace"] == IDENTITY_NAMESPACE)
            .expect("a Role in kube-system");
        assert_eq!(role["metadata"]["name"], identity_role_name("sa", "home"));
        let rule = &role["rules"][0];
        assert_eq!(rule["resources"][0], "namespaces");
        assert_eq!(rule["resourceNames"][0], IDENTITY_NAMESPACE);
        assert_eq!(rule["verbs"].as_array().map(Vec::len), Some(1));
        assert_eq!(rule["verbs"][0], "get");
        assert!(d.iter().any(|d| d["kind"] == "RoleBinding"
            && d["metadata"]["namespace"] == IDENTITY_NAMESPACE
            && d["subjects"][0]["name"] == "sa"));
    }

    const FLEET: &str = "cluster: hub\nleaderElection: {enabled: true}\n\
        clusters: [{name: hub}, {name: east, kubeconfig: /k/east}]\n\
        clusterSecrets: {namespace: fleet}\n\
        resources:\n\
        - {apiVersion: v1, resource: configmaps, clusters: [hub]}\n\
        - {apiVersion: v1, resource: pods, clusters: [east]}\n";

    fn config(yaml: &str) -> Config {
        ConfigFile::parse(yaml).unwrap().validate().unwrap()
    }

    #[test]
    fn a_member_needs_its_resources_and_identity_but_no_lease_nor_secret() {
        let c = config(FLEET);
        let needs = needs(&c, Some("east"), "ops");
        assert_eq!(
            needs,
            Needs {
                cluster: Some(Part::Member {
                    name: "east".into(),
                    own: "hub".into()
                }),
                identity: true,
                ..Needs::default()
            }
        );
        let pods = resolved(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\n",
            &[("Pod", "pods", true)],
        );
        let text = render_needs(&pods, "keb", "ops", &needs);
        assert!(
            text.starts_with("# Cluster east of the fleet; apply it there."),
            "{text}"
        );
        assert!(
            !text.contains("lease") && !text.contains("secrets"),
            "{text}"
        );
        let kinds: Vec<String> = docs(&text).iter().map(summary).collect();
        assert_eq!(
            kinds,
            [
                "ClusterRole -/kube-event-bridge:ops:keb",
                "ClusterRoleBinding -/kube-event-bridge:ops:keb",
                "Role kube-system/kube-event-bridge:ops:keb:cluster-identity",
                "RoleBinding kube-system/kube-event-bridge:ops:keb:cluster-identity",
            ]
        );
    }

    #[test]
    fn the_own_cluster_needs_its_resources_the_leases_and_the_secrets_namespace_alone() {
        let c = config(FLEET);
        let hub = needs(&c, None, "ops");
        assert_eq!(
            needs(&c, Some("hub"), "ops"),
            hub,
            "--cluster of the own cluster"
        );
        assert_eq!(
            hub.cluster,
            Some(Part::Own {
                name: "hub".into(),
                member: true
            })
        );
        assert_eq!(
            hub.leases,
            Some(("ops".into(), LEASE_VERBS.map(String::from).to_vec()))
        );
        assert_eq!(hub.cluster_secrets.as_deref(), Some("fleet"));
        assert!(hub.identity);
        let cms = resolved(
            "cluster: dev\nresources: [{apiVersion: v1, resource: configmaps}]\n",
            &[("ConfigMap", "configmaps", true)],
        );
        let text = render_needs(&cms, "keb", "ops", &hub);
        let d = docs(&text);
        let kinds: Vec<String> = d.iter().map(summary).collect();
        assert_eq!(
            kinds,
            [
                "ClusterRole -/kube-event-bridge:ops:keb",
                "ClusterRoleBinding -/kube-event-bridge:ops:keb",
                "Role ops/kube-event-bridge:ops:keb:leader-election",
                "RoleBinding ops/kube-event-bridge:ops:keb:leader-election",
                "Role fleet/kube-event-bridge:ops:keb:cluster-secrets",
                "RoleBinding fleet/kube-event-bridge:ops:keb:cluster-secrets",
                "Role ops/kube-event-bridge:ops:keb:snapshot-requests",
                "RoleBinding ops/kube-event-bridge:ops:keb:snapshot-requests",
                "Role kube-system/kube-event-bridge:ops:keb:cluster-identity",
                "RoleBinding kube-system/kube-event-bridge:ops:keb:cluster-identity",
            ]
        );
        let secrets = d
            .iter()
            .find(|d| d["metadata"]["namespace"] == "fleet" && d["kind"] == "Role")
            .unwrap();
        let expected: Value = serde_saphyr::from_str(
            "- {apiGroups: [''], resources: [secrets], verbs: [get, list, watch]}\n",
        )
        .unwrap();
        assert_eq!(secrets["rules"], expected, "{text}");
        assert!(
            !d.iter()
                .any(|d| d["kind"] == "ClusterRole" && d["rules"].to_string().contains("secrets")),
            "Secrets are never granted cluster-wide:\n{text}"
        );
        assert!(
            text.contains("# get, list, watch on secrets in fleet alone"),
            "{text}"
        );
    }

    #[test]
    fn a_hub_that_is_no_member_needs_its_leases_and_secrets_only() {
        let c = config(
            "cluster: hub\nsharding: {enabled: true, namespace: shards}\n\
             clusterSecrets: {namespace: fleet}\nresources: [{apiVersion: v1, resource: pods}]\n",
        );
        let hub = needs(&c, None, "ops");
        assert_eq!(
            hub.cluster,
            Some(Part::Own {
                name: "hub".into(),
                member: false
            })
        );
        assert!(!hub.identity, "the identity is read by members only");
        assert_eq!(hub.leases.as_ref().unwrap().0, "shards");
        let text = render_needs(&[], "keb", "ops", &hub);
        assert!(text.contains("not a member of the fleet"), "{text}");
        assert!(text.contains("# no resources watched here, get, list, watch, create, update, delete on leases in shards."), "{text}");
        let kinds: Vec<String> = docs(&text).iter().map(summary).collect();
        assert_eq!(
            kinds,
            [
                "Role shards/kube-event-bridge:ops:keb:leader-election",
                "RoleBinding shards/kube-event-bridge:ops:keb:leader-election",
                "Role fleet/kube-event-bridge:ops:keb:cluster-secrets",
                "RoleBinding fleet/kube-event-bridge:ops:keb:cluster-secrets",
                "Role ops/kube-event-bridge:ops:keb:snapshot-requests",
                "RoleBinding ops/kube-event-bridge:ops:keb:snapshot-requests",
            ]
        );
        // A cluster of the Secrets is a member like any other.
        let later = needs(&c, Some("later"), "ops");
        assert!(later.leases.is_none() && later.cluster_secrets.is_none() && later.identity);
        assert!(
            later.snapshot_requests.is_none(),
            "requests live in the own cluster"
        );
    }

    #[test]
    fn a_single_cluster_renders_as_it_always_did() {
        let c = config(
            "cluster: dev\nleaderElection: {enabled: true}\nsnapshotRequests: {enabled: false}\n\
             resources: [{apiVersion: v1, resource: pods}]\n",
        );
        let rs = resolved(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\n",
            &[("Pod", "pods", true)],
        );
        let n = needs(&c, None, "ops");
        assert_eq!(needs(&c, Some("dev"), "ops"), n);
        assert_eq!(n.cluster, None);
        let lease = n.leases.as_ref().map(|(ns, _)| ns.as_str());
        let verbs = n
            .leases
            .as_ref()
            .map(|(_, v)| v.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(
            render_needs(&rs, "keb", "ops", &n),
            render_with_leases(
                &rs,
                "keb",
                "ops",
                lease.zip(verbs.as_deref()),
                c.reads_cluster_identity()
            )
        );
        assert!(render_needs(&rs, "keb", "ops", &n).starts_with(
            "# RBAC for kube-event-bridge running as system:serviceaccount:ops:keb:\n"
        ));
    }

    #[test]
    fn snapshot_requests_are_read_and_patched_in_their_namespace_alone() {
        let cms = resolved(
            "cluster: dev\nresources: [{apiVersion: v1, resource: configmaps}]\n",
            &[("ConfigMap", "configmaps", true)],
        );
        let own = needs(
            &config("cluster: dev\nresources: [{apiVersion: v1, resource: configmaps}]\n"),
            None,
            "ops",
        );
        assert_eq!(
            own.snapshot_requests.as_deref(),
            Some("ops"),
            "the bridge's namespace"
        );
        let named = config(
            "cluster: dev\nsnapshotRequests: {namespace: asks}\nresources: [{apiVersion: v1, resource: configmaps}]\n",
        );
        let text = render_needs(&cms, "keb", "ops", &needs(&named, None, "ops"));
        let d = docs(&text);
        let requests: Vec<&Value> = d
            .iter()
            .filter(|d| d["metadata"]["name"] == "kube-event-bridge:ops:keb:snapshot-requests")
            .collect();
        assert_eq!(requests.len(), 2, "a Role and its binding:\n{text}");
        assert!(
            requests
                .iter()
                .all(|d| d["metadata"]["namespace"] == "asks")
        );
        let expected: Value = serde_saphyr::from_str(
            "- {apiGroups: [''], resources: [configmaps], verbs: [get, list, watch, patch]}\n",
        )
        .unwrap();
        assert_eq!(requests[0]["rules"], expected, "{text}");
        assert!(
            !d.iter()
                .any(|d| d["kind"] == "ClusterRole" && d["rules"].to_string().contains("patch")),
            "patch is never granted cluster-wide:\n{text}"
        );
        assert!(
            text.contains(
                "# get, list, watch, patch on configmaps in asks alone: snapshot requests"
            ),
            "{text}"
        );
        let off = config(
            "cluster: dev\nsnapshotRequests: {enabled: false}\nresources: [{apiVersion: v1, resource: configmaps}]\n",
        );
        assert_eq!(needs(&off, None, "ops").snapshot_requests, None);
    }

    #[test]
    fn resources_a_member_does_not_serve_are_named_not_granted() {
        let needs = Needs {
            cluster: Some(Part::Member {
                name: "east".into(),
                own: "hub".into(),
            }),
            not_served: vec!["resources[1].apiVersion: apps/v9 is not served".into()],
            ..Needs::default()
        };
        let text = render_needs(&[], "keb", "ops", &needs);
        assert!(
            text.contains(
                "# not watched here, not granted: resources[1].apiVersion: apps/v9 is not served\n"
            ),
            "{text}"
        );
        assert!(docs(&text).is_empty(), "{text}");
    }
}
