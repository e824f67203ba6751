//! The RBAC `kube-event-bridge rbac` renders for a wildcard configuration, applied to the real
//! API server and questioned with SubjectAccessReviews (`authorization.k8s.io/v1`) as the
//! bridge's ServiceAccount: `list` and `watch` on exactly the resources discovery resolved, and
//! nothing dangerous a wildcard grant (`resources: ["*"]`) would have given: no subresources
//! (`nodes/proxy`, `pods/log`, `pods/exec`, `services/proxy`), no excluded Secrets, no `get`, no
//! writes.

use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube_event_bridge::config::ConfigFile;
use kube_event_bridge::discovery::{self, ResolvedResource};
use kube_event_bridge::rbac;
use serde::de::DeserializeOwned;

use crate::support::{kube_client, unique_namespace, wait_until};

/// How long RBAC changes may take to reach the API server's authorizer (it reads them through
/// informers).
const RBAC_SETTLE: Duration = Duration::from_secs(30);

/// One access question and the answer the rendered RBAC must give.
#[derive(Debug, Clone)]
pub(crate) struct Access {
    verb: &'static str,
    group: String,
    resource: String,
    subresource: Option<&'static str>,
    /// `None`: cluster-wide (every namespace, or a cluster-scoped resource).
    namespace: Option<String>,
    /// `Some`: one object by name.
    name: Option<&'static str>,
    allowed: bool,
}

impl Access {
    pub(crate) fn new(
        verb: &'static str,
        group: &str,
        resource: &str,
        namespace: Option<&str>,
    ) -> Self {
        Access {
            verb,
            group: group.to_string(),
            resource: resource.to_string(),
            subresource: None,
            namespace: namespace.map(String::from),
            name: None,
            allowed: false,
        }
    }

    pub(crate) fn allowed(mut self) -> Self {
        self.allowed = true;
        self
    }

    fn subresource(mut self, subresource: &'static str) -> Self {
        self.subresource = Some(subresource);
        self
    }

    pub(crate) fn named(mut self, name: &'static str) -> Self {
        self.name = Some(name);
        self
    }

    fn describe(&self) -> String {
        let mut resource = self.resource.clone();
        if let Some(sub) = self.subresource {
            resource = format!("{resource}/{sub}");
        }
        if !self.group.is_empty() {
            resource = format!("{resource}.{}", self.group);
        }
        if let Some(name) = self.name {
            resource = format!("{resource} {name}");
        }
        let scope = self.namespace.as_deref().unwrap_or("cluster-wide");
        format!("{} {resource} in {scope}", self.verb)
    }
}

/// Asks the API server whether the ServiceAccount `namespace`/`name` (with the groups its token
/// carries) may do `access`.
async fn review(client: &kube::Client, namespace: &str, name: &str, access: &Access) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{namespace}:{name}")),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(access.verb.into()),
                group: Some(access.group.clone()),
                resource: Some(access.resource.clone()),
                subresource: access.subresource.map(String::from),
                namespace: access.namespace.clone(),
                name: access.name.map(String::from),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap_or_else(|e| panic!("SubjectAccessReview for {}: {e}", access.describe()));
    answer
        .status
        .unwrap_or_else(|| panic!("SubjectAccessReview for {}: no status", access.describe()))
        .allowed
}

/// Waits until every allowed question is allowed (RBAC reaches the authorizer through
/// informers), then asserts every answer.
pub(crate) async fn assert_reviews(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    questions: &[Access],
) {
    wait_until(
        "the ServiceAccount is granted what its RBAC grants",
        RBAC_SETTLE,
        || async {
            for q in questions.iter().filter(|q| q.allowed) {
                if !review(client, namespace, name, q).await {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    let mut wrong = Vec::new();
    for q in questions {
        let answer = review(client, namespace, name, q).await;
        if answer != q.allowed {
            wrong.push(format!(
                "{}: {} (expected {})",
                q.describe(),
                if answer { "allowed" } else { "denied" },
                if q.allowed { "allowed" } else { "denied" }
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "system:serviceaccount:{namespace}:{name}:\n  {}",
        wrong.join("\n  ")
    );
}

/// Creates one rendered RBAC object through the API as its typed resource.
async fn create<K>(client: &kube::Client, doc: serde_json::Value)
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
        + DeserializeOwned
        + serde::Serialize
        + Clone
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let object: K = serde_json::from_value(doc).expect("a rendered RBAC object");
    Api::<K>::all(client.clone())
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("cannot create {object:?}: {e}"));
}

/// Creates one rendered namespaced RBAC object in its namespace.
async fn create_in<K>(client: &kube::Client, doc: serde_json::Value)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + DeserializeOwned
        + serde::Serialize
        + Clone
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let object: K = serde_json::from_value(doc).expect("a rendered RBAC object");
    let namespace = object.meta().namespace.clone().expect("a namespace");
    Api::<K>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("cannot create {object:?}: {e}"));
}

/// Applies every document of a `rbac::render` output.
pub(crate) async fn apply(client: &kube::Client, rendered: &str) {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_str_multiple(rendered).expect("rendered YAML");
    for doc in docs {
        if doc.is_null() {
            continue;
        }
        match doc["kind"].as_str() {
            Some("ClusterRole") => create::<ClusterRole>(client, doc).await,
            Some("ClusterRoleBinding") => create::<ClusterRoleBinding>(client, doc).await,
            Some("Role") => create_in::<Role>(client, doc).await,
            Some("RoleBinding") => create_in::<RoleBinding>(client, doc).await,
            other => panic!("unexpected kind {other:?} in the rendered RBAC:\n{rendered}"),
        }
    }
}

/// The core resources every kube-apiserver serves that can be listed and watched: a core
/// wildcard must resolve to them.
const CORE_EXPECTED: [&str; 8] = [
    "configmaps",
    "endpoints",
    "events",
    "namespaces",
    "nodes",
    "pods",
    "serviceaccounts",
    "services",
];

#[tokio::test(flavor = "multi_thread")]
async fn a_core_wildcard_grants_list_and_watch_on_its_resources_and_nothing_dangerous() {
    let client = kube_client().await;
    let home = unique_namespace(&client, "sar-home").await;
    let shop = unique_namespace(&client, "sar-shop").await;
    let other = unique_namespace(&client, "sar-other").await;
    let yaml = format!(
        "cluster: dev\nleaderElection: {{enabled: true}}\ncheckpoint: {{nats: {{url: \"nats://127.0.0.1:4222\"}}}}\n\
         resources:\n\
         - {{apiVersion: v1, resource: '*', exclude: [{{resource: Secret}}]}}\n\
         - {{apiVersion: apps/v1, resource: Deployment, namespaces: [{shop}]}}\n"
    );
    let config = ConfigFile::parse(&yaml)
        .and_then(ConfigFile::validate)
        .unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    let resolved = discovery::resolve(&client, &config.resources)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let plurals: Vec<&str> = resolved.iter().map(|r| r.api.plural.as_str()).collect();
    for expected in CORE_EXPECTED {
        assert!(plurals.contains(&expected), "{expected} not in {plurals:?}");
    }
    assert!(!plurals.contains(&"secrets"), "{plurals:?}");

    let sa = "bridge";
    Api::<ServiceAccount>::namespaced(client.clone(), &home)
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(sa.into()),
                    ..ObjectMeta::default()
                },
                ..ServiceAccount::default()
            },
        )
        .await
        .expect("create the ServiceAccount");
    let rendered = rbac::render(&resolved, sa, &home, Some(&home), true);
    assert!(
        !rendered.contains("'*'"),
        "a wildcard is granted by name, never \"*\":\n{rendered}"
    );
    apply(&client, &rendered).await;

    let questions = questions(&resolved, &home, &shop, &other);
    assert_reviews(&client, &home, sa, &questions).await;

    let name = rbac::role_name(sa, &home);
    let dp = DeleteParams::default();
    let _ = Api::<ClusterRoleBinding>::all(client.clone())
        .delete(&name, &dp)
        .await;
    let _ = Api::<ClusterRole>::all(client.clone())
        .delete(&name, &dp)
        .await;
}

/// What the bridge of the test may and may not do: list and watch what it watches, where it
/// watches it; Leases for leader election at home; nothing else.
fn questions(resolved: &[ResolvedResource], home: &str, shop: &str, other: &str) -> Vec<Access> {
    let mut q = Vec::new();
    for r in resolved {
        let (group, plural) = (r.api.group.as_str(), r.api.plural.as_str());
        // Where this resource is watched; a Role in `shop` grants nothing cluster-wide.
        let watched: Vec<Option<&str>> = match &r.config.namespaces {
            Some(_) => vec![Some(shop)],
            None if r.namespaced => vec![None, Some(other), Some(home)],
            None => vec![None],
        };
        for ns in &watched {
            for verb in rbac::WATCH_VERBS {
                q.push(Access::new(verb, group, plural, *ns).allowed());
            }
            for verb in [
                "get",
                "create",
                "update",
                "patch",
                "delete",
                "deletecollection",
            ] {
                q.push(Access::new(verb, group, plural, *ns));
            }
        }
        if r.config.namespaces.is_some() {
            for ns in [None, Some(other), Some(home)] {
                q.push(Access::new("list", group, plural, ns));
                q.push(Access::new("watch", group, plural, ns));
            }
        }
    }
    // What `resources: ["*"]` in the core group would have granted.
    q.push(Access::new("get", "", "nodes", None).subresource("proxy"));
    q.push(Access::new("create", "", "nodes", None).subresource("proxy"));
    for ns in [Some(other), Some(shop)] {
        q.push(Access::new("get", "", "pods", ns).subresource("log"));
        q.push(Access::new("create", "", "pods", ns).subresource("exec"));
        q.push(Access::new("get", "", "pods", ns).subresource("exec"));
        q.push(Access::new("create", "", "pods", ns).subresource("attach"));
        q.push(Access::new("create", "", "pods", ns).subresource("portforward"));
        q.push(Access::new("create", "", "pods", ns).subresource("eviction"));
        q.push(Access::new("get", "", "services", ns).subresource("proxy"));
        q.push(Access::new("create", "", "serviceaccounts", ns).subresource("token"));
        q.push(Access::new("update", "", "pods", ns).subresource("status"));
    }
    // The excluded Secrets, everywhere.
    for ns in [None, Some(other), Some(shop), Some(home)] {
        for verb in ["get", "list", "watch"] {
            q.push(Access::new(verb, "", "secrets", ns));
        }
    }
    q.push(Access::new("get", "", "secrets", Some(other)).named("anything"));
    // The explicit Deployment entry grants no other apps resource, and no other group leaks.
    q.push(Access::new("list", "apps", "replicasets", Some(shop)));
    q.push(Access::new("list", "apps", "deployments", Some(other)));
    q.push(Access::new(
        "list",
        "rbac.authorization.k8s.io",
        "clusterroles",
        None,
    ));
    q.push(Access::new(
        "list",
        "rbac.authorization.k8s.io",
        "roles",
        Some(shop),
    ));
    q.push(Access::new(
        "impersonate",
        "",
        "serviceaccounts",
        Some(home),
    ));
    // Checkpoints are tied to the cluster's identity: `get` of the kube-system Namespace by
    // name (a namespace's own attributes carry it as their namespace), and of no other.
    q.push(
        Access::new("get", "", "namespaces", Some("kube-system"))
            .named("kube-system")
            .allowed(),
    );
    q.push(Access::new("get", "", "namespaces", Some("default")).named("default"));
    q.push(Access::new("get", "", "secrets", Some("kube-system")));
    q.push(Access::new("get", "", "configmaps", Some("kube-system")).named("x"));
    // CRDs, followed because of the wildcard: list and watch only.
    let crds = "customresourcedefinitions";
    q.push(Access::new("list", rbac::CRD_GROUP, crds, None).allowed());
    q.push(Access::new("watch", rbac::CRD_GROUP, crds, None).allowed());
    for verb in ["get", "create", "update", "delete"] {
        q.push(Access::new(verb, rbac::CRD_GROUP, crds, None));
    }
    // Leader election: what leader.rs does with its Lease, at home only.
    for verb in rbac::LEASE_VERBS {
        q.push(Access::new(verb, rbac::LEASE_GROUP, "leases", Some(home)).allowed());
    }
    for verb in ["list", "watch", "delete", "patch"] {
        q.push(Access::new(verb, rbac::LEASE_GROUP, "leases", Some(home)));
    }
    q.push(Access::new("get", rbac::LEASE_GROUP, "leases", Some(other)));
    q.push(Access::new("update", rbac::LEASE_GROUP, "leases", None));
    q
}
