//! The test environment's extra clusters (`scripts/testenv cluster`, issue 31): each one is a
//! cluster of its own (a distinct `kube-system` uid, objects no other cluster sees), one can be
//! stopped while the others answer, and it comes back as the same cluster.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::support::{self, ExtraCluster};

/// How long one request to an API server may take before the test fails.
const STEP: Duration = Duration::from_secs(30);

/// The uid of the `kube-system` namespace: a cluster's identity.
async fn kube_system_uid(client: &kube::Client, cluster: &str) -> String {
    let namespace = tokio::time::timeout(
        STEP,
        Api::<Namespace>::all(client.clone()).get("kube-system"),
    )
    .await
    .unwrap_or_else(|_| panic!("GET namespace kube-system of {cluster}: no answer in {STEP:?}"))
    .unwrap_or_else(|e| panic!("GET namespace kube-system of {cluster}: {e}"));
    namespace
        .metadata
        .uid
        .unwrap_or_else(|| panic!("namespace kube-system of {cluster} has no uid"))
}

/// Whether ConfigMap `default/name` exists in the cluster `client` reaches.
async fn has_config_map(client: &kube::Client, name: &str, cluster: &str) -> bool {
    tokio::time::timeout(
        STEP,
        Api::<ConfigMap>::namespaced(client.clone(), "default").get_opt(name),
    )
    .await
    .unwrap_or_else(|_| panic!("GET configmap default/{name} of {cluster}: no answer in {STEP:?}"))
    .unwrap_or_else(|e| panic!("GET configmap default/{name} of {cluster}: {e}"))
    .is_some()
}

#[tokio::test(flavor = "multi_thread")]
async fn extra_clusters_are_distinct_isolated_and_keep_their_identity_across_a_restart() {
    let main = support::kube_client().await;
    let a = ExtraCluster::add("fleet-a").await;
    let b = ExtraCluster::add("fleet-b").await;
    assert_ne!(a.url, b.url, "two clusters share an address");
    for cluster in [&a, &b] {
        let text = &cluster.kubeconfig_text;
        assert!(
            text.contains("certificate-authority-data") && text.contains("client-key-data"),
            "the kubeconfig of {} does not embed its CA and credential:\n{text}",
            cluster.name
        );
        assert!(
            text.contains(&format!("\"server\": \"{}\"", cluster.url)),
            "the kubeconfig of {} does not name its server {}",
            cluster.name,
            cluster.url
        );
    }
    let (client_a, client_b) = (a.client().await, b.client().await);

    let uid_main = kube_system_uid(&main, "the main cluster").await;
    let uid_a = kube_system_uid(&client_a, &a.name).await;
    let uid_b = kube_system_uid(&client_b, &b.name).await;
    assert_ne!(uid_a, uid_b, "{} and {} are one cluster", a.name, b.name);
    assert_ne!(uid_a, uid_main, "{} is the main cluster", a.name);
    assert_ne!(uid_b, uid_main, "{} is the main cluster", b.name);

    // An object made in one cluster exists in that cluster only.
    let name = support::unique_name("only-in-a");
    let config_map: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"cluster": a.name}}))
            .expect("ConfigMap manifest");
    Api::<ConfigMap>::namespaced(client_a.clone(), "default")
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap_or_else(|e| panic!("create configmap default/{name} in {}: {e}", a.name));
    assert!(has_config_map(&client_a, &name, &a.name).await);
    assert!(
        !has_config_map(&client_b, &name, &b.name).await,
        "{} sees a ConfigMap made in {}",
        b.name,
        a.name
    );
    assert!(
        !has_config_map(&main, &name, "the main cluster").await,
        "the main cluster sees a ConfigMap made in {}",
        a.name
    );

    // Stopped, a is unreachable while b still answers.
    a.stop().await;
    let refused = tokio::time::timeout(
        STEP,
        Api::<Namespace>::all(client_a.clone()).get("kube-system"),
    )
    .await
    .unwrap_or_else(|_| panic!("a request to the stopped {} hung for {STEP:?}", a.name));
    match refused {
        Err(kube::Error::Api(status)) => {
            panic!("the stopped {} answered: {status:?}", a.name)
        }
        Err(_) => {}
        Ok(namespace) => panic!("the stopped {} answered: {namespace:?}", a.name),
    }
    assert_eq!(kube_system_uid(&client_b, &b.name).await, uid_b);

    // Started again, a is the same cluster with the same objects.
    a.start().await;
    let client_a = a.client().await;
    assert_eq!(
        kube_system_uid(&client_a, &a.name).await,
        uid_a,
        "{} came back as another cluster",
        a.name
    );
    assert!(
        has_config_map(&client_a, &name, &a.name).await,
        "{} lost its ConfigMap across a restart",
        a.name
    );
}
