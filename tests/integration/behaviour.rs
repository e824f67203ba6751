//! Behaviour that does not depend on the sink: configuration errors, unknown resources, resuming a
//! dropped watch without a relist, a resource that disappears while others continue.

use std::time::Duration;

use cloudevents::AttributesReader;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

use crate::harness::{Bridge, Proxy, Reader, kubeconfig_via, run_cli, summary};
use crate::support::{create_crd, env, kube_client, unique_name, unique_namespace};

fn write_config(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bridge.yaml");
    std::fs::write(&path, text).unwrap();
    (dir, path.display().to_string())
}

#[test]
fn bad_config_fails_with_the_path_and_problem() {
    let (_d, path) = write_config(
        "cluster: dev\nresources:\n- apiVersion: v1\n  resource: configmaps\n  lableSelector: a=b\n",
    );
    let (status, _, stderr) = run_cli(&["check-config", &path]);
    assert!(!status.success());
    assert!(
        stderr.contains("resources[0]") && stderr.contains("unknown field `lableSelector`"),
        "{stderr}"
    );

    let (_d, path) = write_config(
        "cluster: dev\nresources: [{apiVersion: v1, resource: configmaps, events: [created]}]\n",
    );
    let (status, _, stderr) = run_cli(&["run", "--config", &path]);
    assert!(!status.success(), "run must refuse a bad config");
    assert!(
        stderr.contains("resources[0].events[0]") && stderr.contains("unknown variant `created`"),
        "{stderr}"
    );

    let (_d, path) = write_config(
        "cluster: dev\nresources: [{apiVersion: v1, resource: configmaps}]\nsink: {kafka: {bootstrapServers: 'x:1', properties: {enable.idempotence: 'false'}}}\n",
    );
    let (status, _, stderr) = run_cli(&["check-config", &path]);
    assert!(!status.success());
    assert!(
        stderr.contains("sink.kafka.properties.enable.idempotence"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_resources_fail_at_start_naming_them() {
    let e = env();
    let (_d, path) = write_config(&format!(
        "cluster: dev\nkubernetes: {{kubeconfig: {}}}\nresources:\n- {{apiVersion: v1, resource: configmaps}}\n- {{apiVersion: apps/v9, resource: deployments}}\n- {{apiVersion: v1, resource: nosuchthings}}\n- {{apiVersion: nope.example.com/v1, resource: things}}\n",
        e.kubeconfig
    ));
    let (status, _, stderr) = run_cli(&["run", "--config", &path]);
    assert!(!status.success());
    assert!(
        stderr.contains(
            "resources[1].apiVersion: apps/v9 is not served; served versions of group apps: v1"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("resources[2].resource: \"nosuchthings\" is not a resource of v1"),
        "{stderr}"
    );
    assert!(
        stderr.contains("resources[3].apiVersion: nope.example.com/v1 is not served"),
        "{stderr}"
    );

    // The same resource named by plural and by kind: found once discovery has resolved both.
    let (_d, path) = write_config(&format!(
        "cluster: dev\nkubernetes: {{kubeconfig: {}}}\nresources:\n- {{apiVersion: v1, resource: pods}}\n- {{apiVersion: v1, resource: Pod}}\n",
        e.kubeconfig
    ));
    let (status, _, stderr) = run_cli(&["run", "--config", &path]);
    assert!(!status.success());
    assert!(
        stderr.contains(
            "resources[1]: watches the same objects as resources[0] (pods); merge the entries"
        ),
        "{stderr}"
    );

    let (_d, path) = write_config(&format!(
        "cluster: dev\nkubernetes: {{kubeconfig: {}}}\nresources:\n- {{apiVersion: v1, resource: ConfigMap, namespaces: [a, b], labelSelector: x=y}}\n- {{apiVersion: v1, resource: namespaces}}\nsink: {{kafka: {{bootstrapServers: 'x:1'}}}}\n",
        e.kubeconfig
    ));
    let (status, stdout, stderr) = run_cli(&["check-config", "--cluster", &path]);
    assert!(status.success(), "{stderr}");
    assert!(
        stdout.contains(
            "v1/configmaps kind=ConfigMap scope=Namespaced namespaces=a,b labelSelector=x=y"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("-> kafka topic k8s.dev.core.configmaps"),
        "{stdout}"
    );
    assert!(
        stdout.contains("v1/namespaces kind=Namespace scope=Cluster namespaces=-"),
        "{stdout}"
    );
}

/// Cutting every connection to the API server: the watch resumes from its last resourceVersion,
/// the changes made meanwhile arrive once each, and no relist happens.
#[tokio::test(flavor = "multi_thread")]
async fn dropped_watch_resumes_without_relist() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "drop").await;
    let dir = tempfile::tempdir().unwrap();
    let (_, upstream) = kubeconfig_via(0, dir.path());
    let proxy = Proxy::start(upstream).await;
    let (kubeconfig, _) = kubeconfig_via(proxy.port, dir.path());
    let config = format!(
        "cluster: dev\nkubernetes: {{kubeconfig: {}}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink: {{stdout: {{}}}}\n",
        kubeconfig.display()
    );
    let mut bridge = Bridge::start(&config);
    let mut reader = Reader::stdout(&bridge);
    bridge.wait_synced(1).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
    };
    cms.create(&PostParams::default(), &cm("one"))
        .await
        .unwrap();
    reader
        .read_until(Duration::from_secs(30), |got| got.len() == 1)
        .await;

    for round in 0..3 {
        let watches_before = bridge.count_log("watching");
        proxy.cut_all();
        cms.create(&PostParams::default(), &cm(&format!("r{round}")))
            .await
            .unwrap();
        cms.patch(
            &format!("r{round}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"a": "b"}})),
        )
        .await
        .unwrap();
        // The next cut only after the watch has been re-established, so each cut ends one.
        crate::support::wait_until(
            "the watch is re-established",
            Duration::from_secs(30),
            || async { (bridge.count_log("watching") > watches_before).then_some(()) },
        )
        .await;
    }
    let events = reader
        .read_until(Duration::from_secs(60), |got| got.len() >= 6)
        .await;
    let extra = reader.drain(Duration::from_millis(1500)).await;
    assert!(
        extra.is_empty(),
        "duplicates after reconnect:\n{}",
        summary(&extra)
    );
    let ids: std::collections::BTreeSet<_> =
        events.iter().map(|r| r.event.id().to_string()).collect();
    assert_eq!(ids.len(), 6, "{}", summary(&events));
    assert!(
        bridge.count_log("watching") >= 4,
        "each cut must end the watch and start a new one; log:\n{}",
        bridge.log_text()
    );
    assert_eq!(
        bridge.count_log("listed"),
        1,
        "a dropped connection must not cause a relist; log:\n{}",
        bridge.log_text()
    );
}

/// A CRD deleted while the bridge runs: its watch (an explicit entry) is stopped once discovery
/// no longer serves the resource, the other resources keep flowing.
#[tokio::test(flavor = "multi_thread")]
async fn vanished_resource_does_not_stop_the_others() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "vanish").await;
    let group = format!("{}.test.keb.dev", unique_name("g"));
    create_crd(&client, &group, "Thing", "things", "Namespaced").await;
    let config = format!(
        "cluster: dev\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n- {{apiVersion: {group}/v1, resource: things, namespaces: [{ns}]}}\nsink: {{stdout: {{}}}}\n"
    );
    let mut bridge = Bridge::start(&config);
    let mut reader = Reader::stdout(&bridge);
    bridge.wait_synced(2).await;
    let res =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(&group, "v1", "Thing"), "things");
    let things: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &res);
    let t: DynamicObject = serde_json::from_value(
        json!({"apiVersion": format!("{group}/v1"), "kind": "Thing", "metadata": {"name": "t"}}),
    )
    .unwrap();
    things.create(&PostParams::default(), &t).await.unwrap();
    reader
        .read_until(Duration::from_secs(30), |got| got.len() == 1)
        .await;

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete(&format!("things.{group}"), &DeleteParams::default())
        .await
        .unwrap();
    bridge
        .wait_log("watch no longer desired or owned here: stopping it")
        .await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let c: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "still-flowing"}})).unwrap();
    cms.create(&PostParams::default(), &c).await.unwrap();
    let events = reader
        .read_until(Duration::from_secs(30), |got| {
            got.iter().any(|r| r.ext("name") == "still-flowing")
        })
        .await;
    assert!(!events.is_empty());
    assert!(
        bridge.wait_exit(Duration::from_millis(10)).await.is_none(),
        "the bridge must keep running"
    );
}
