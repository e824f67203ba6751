//! Watches that come and go while the bridge runs: resources matched by a wildcard as their CRDs
//! are created and deleted, and namespaces matched by a label selector as they gain and lose
//! the label.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use cloudevents::AttributesReader;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

use crate::harness::{Bridge, Reader, summary};
use crate::support::{create_crd, kube_client, unique_name, unique_namespace};

const WAIT: Duration = Duration::from_secs(60);

/// The watches `bridge` runs now, as its `/metrics` lists them: (resource, namespace).
pub(crate) async fn watches(bridge: &Bridge) -> BTreeSet<(String, String)> {
    let address = bridge.admin_address().await;
    let (_, body) = crate::admin::get(&address, "/metrics").await;
    body.lines()
        .filter_map(|l| l.strip_prefix("kube_event_bridge_queue_depth_events{"))
        .filter_map(|l| {
            let labels = l.split_once('}')?.0;
            let value = |key: &str| {
                labels.split(',').find_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    (k == key).then(|| v.trim_matches('"').to_string())
                })
            };
            Some((value("resource")?, value("namespace")?))
        })
        .collect()
}

/// Waits until `bridge` runs exactly `expected` watches.
async fn wait_watches(bridge: &Bridge, expected: &[(&str, &str)]) {
    let expected: BTreeSet<(String, String)> = expected
        .iter()
        .map(|(r, n)| (r.to_string(), n.to_string()))
        .collect();
    crate::support::wait_until(
        &format!("the bridge runs exactly the watches {expected:?}"),
        WAIT,
        || async { (watches(bridge).await == expected).then_some(()) },
    )
    .await;
}

pub(crate) async fn create_object(
    client: &kube::Client,
    group: &str,
    kind: &str,
    plural: &str,
    ns: &str,
    name: &str,
) {
    let res = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1", kind), plural);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &res);
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{group}/v1"), "kind": kind, "metadata": {"name": name}, "spec": {"n": 1}
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
}

/// A wildcard over `*.{suffix}` groups: a CRD created after the start is watched within seconds
/// and its objects flow; an excluded kind is not; a deleted CRD's watch stops cleanly (its
/// objects' deletions are published first) while the others continue.
#[tokio::test(flavor = "multi_thread")]
async fn wildcard_follows_crds_created_and_deleted_at_run_time() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "wild").await;
    let suffix = format!("{}.keb.dev", unique_name("w"));
    let config = format!(
        "cluster: dev\nresources:\n- apiVersion: \"*.{suffix}/*\"\n  resource: \"*\"\n  namespaces: [{ns}]\n  exclude: [{{resource: Gadget}}]\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink: {{stdout: {{}}}}\n"
    );
    let mut bridge = Bridge::start(&config);
    let mut reader = Reader::stdout(&bridge);
    bridge.wait_synced(1).await;

    let (things, gadgets) = (format!("a.{suffix}"), format!("b.{suffix}"));
    let started = Instant::now();
    create_crd(&client, &things, "Thing", "things", "Namespaced").await;
    bridge.wait_synced(2).await;
    let picked_up = started.elapsed();
    create_crd(&client, &gadgets, "Gadget", "gadgets", "Namespaced").await;
    create_object(&client, &things, "Thing", "things", &ns, "t1").await;
    create_object(&client, &gadgets, "Gadget", "gadgets", &ns, "g1").await;
    let events = reader
        .read_until(WAIT, |got| got.iter().any(|r| r.ext("name") == "t1"))
        .await;
    assert_eq!(events.len(), 1, "{}", summary(&events));
    assert_eq!(events[0].ext("apiversion"), format!("{things}/v1"));
    assert_eq!(events[0].change(), "added");
    assert_eq!(events[0].ext("origin"), "live");
    eprintln!("CRD watched and synced {picked_up:?} after its creation was requested");

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete(&format!("things.{things}"), &DeleteParams::default())
        .await
        .unwrap();
    // The discovery that stops the Things' watch runs after the Gadget CRD was served: had the
    // exclusion failed, a Gadget watch would be running by then. Only the ConfigMaps' remains.
    bridge
        .wait_log("watch no longer desired or owned here: stopping it")
        .await;
    wait_watches(&bridge, &[("v1/configmaps", &ns)]).await;
    let mut deletes = reader
        .read_until(WAIT, |got| got.iter().any(|r| r.change() == "deleted"))
        .await;
    assert_eq!(deletes[0].ext("name"), "t1", "{}", summary(&deletes));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "after"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let events = reader
        .read_until(WAIT, |got| got.iter().any(|r| r.ext("name") == "after"))
        .await;
    // Sent by the API server (`live`) or, when it dropped it closing the watch, by the bridge
    // (`repaired`): one delete either way.
    deletes.extend(events.iter().cloned());
    let t1_deleted: Vec<_> = deletes
        .iter()
        .filter(|r| r.ext("name") == "t1" && r.change() == "deleted")
        .collect();
    assert_eq!(t1_deleted.len(), 1, "{}", summary(&deletes));
    eprintln!("t1's delete: origin {}", t1_deleted[0].ext("origin"));
    assert!(
        events.iter().all(|r| r.ext("kind") != "Gadget"),
        "excluded: {}",
        summary(&events)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = bridge.log_text();
    assert!(
        !log.contains("\"message\":\"watch failed\""),
        "a deleted CRD's watch must stop, not fail and retry:\n{log}"
    );
    assert!(
        log.contains("\"crd_deleted\":true"),
        "the CRD watch saw the deletion:\n{log}"
    );
    assert!(bridge.wait_exit(Duration::from_millis(10)).await.is_none());
    crds.delete(&format!("gadgets.{gadgets}"), &DeleteParams::default())
        .await
        .unwrap();
}

pub(crate) async fn labelled_namespace(
    client: &kube::Client,
    label: &str,
    value: Option<&str>,
) -> String {
    let name = unique_name("sel");
    let ns: Namespace = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": value.map(|v| json!({label: v})).unwrap_or(json!({}))}
    }))
    .unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    name
}

pub(crate) async fn create_cm(client: &kube::Client, ns: &str, name: &str) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
}

/// `namespaceSelector`: only labelled namespaces flow; a namespace that gains the label starts
/// flowing (its existing objects as a snapshot), one that loses it stops.
#[tokio::test(flavor = "multi_thread")]
async fn namespace_selector_follows_labels() {
    let client = kube_client().await;
    let label = "team.keb.dev/stream";
    let value = unique_name("v");
    let a = labelled_namespace(&client, label, Some(&value)).await;
    let b = labelled_namespace(&client, label, None).await;
    create_cm(&client, &b, "b-before").await;
    let config = format!(
        "cluster: dev\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaceSelector: \"{label}={value}\"}}\nsink: {{stdout: {{}}}}\n"
    );
    let mut bridge = Bridge::start(&config);
    let mut reader = Reader::stdout(&bridge);
    bridge.wait_synced(1).await;
    create_cm(&client, &a, "a1").await;
    create_cm(&client, &b, "b-unlabelled").await;
    let events = reader
        .read_until(WAIT, |got| got.iter().any(|r| r.ext("name") == "a1"))
        .await;
    assert_eq!(events.len(), 1, "{}", summary(&events));

    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            &b,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {label: value}}})),
        )
        .await
        .unwrap();
    let events = reader.read_until(WAIT, |got| got.len() >= 2).await;
    let mut snapshot: Vec<(String, String)> = events
        .iter()
        .map(|r| (r.ext("name"), r.ext("origin")))
        .collect();
    snapshot.sort();
    assert_eq!(
        snapshot,
        [
            ("b-before".to_string(), "snapshot".to_string()),
            ("b-unlabelled".to_string(), "snapshot".to_string())
        ],
        "{}",
        summary(&events)
    );
    create_cm(&client, &b, "b-live").await;
    let events = reader
        .read_until(WAIT, |got| got.iter().any(|r| r.ext("name") == "b-live"))
        .await;
    assert_eq!(events[0].ext("origin"), "live");

    namespaces
        .patch(
            &a,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {label: null}}})),
        )
        .await
        .unwrap();
    // Namespace a's watch is gone from the bridge's running watches (its stop is logged just
    // before it is cancelled): only then is a-after created.
    wait_watches(&bridge, &[("v1/configmaps", &b)]).await;
    create_cm(&client, &a, "a-after").await;
    create_cm(&client, &b, "b-after").await;
    let events = reader
        .read_until(WAIT, |got| got.iter().any(|r| r.ext("name") == "b-after"))
        .await;
    let extra = reader.drain(Duration::from_secs(1)).await;
    assert!(
        events
            .iter()
            .chain(&extra)
            .all(|r| r.ext("name") != "a-after"),
        "{}",
        summary(&events)
    );
    assert!(events.iter().all(|r| r.event.id().contains(':')));
}

/// A CRD that gains a newer served version (now the preferred one): the wildcard's watch moves
/// to it and the objects are published again in that version, as a snapshot; the old version's
/// watch stops.
#[tokio::test(flavor = "multi_thread")]
async fn wildcard_moves_to_a_crds_new_preferred_version() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "vers").await;
    let group = format!("{}.test.keb.dev", unique_name("v"));
    create_crd(&client, &group, "Thing", "things", "Namespaced").await;
    let config = format!(
        "cluster: dev\nresources:\n- {{apiVersion: \"{group}/*\", resource: \"*\", namespaces: [{ns}]}}\nsink: {{stdout: {{}}}}\n"
    );
    let mut bridge = Bridge::start(&config);
    let mut reader = Reader::stdout(&bridge);
    bridge.wait_synced(1).await;
    create_object(&client, &group, "Thing", "things", &ns, "t1").await;
    let events = reader.read_until(WAIT, |got| got.len() == 1).await;
    assert_eq!(events[0].ext("apiversion"), format!("{group}/v1"));

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = format!("things.{group}");
    let mut crd = serde_json::to_value(crds.get(&name).await.unwrap()).unwrap();
    let mut v2 = crd["spec"]["versions"][0].clone();
    v2["name"] = json!("v2");
    crd["spec"]["versions"][0]["storage"] = json!(false);
    crd["spec"]["versions"].as_array_mut().unwrap().push(v2);
    crds.replace(
        &name,
        &PostParams::default(),
        &serde_json::from_value(crd).unwrap(),
    )
    .await
    .unwrap();

    let events = reader
        .read_until(WAIT, |got| {
            got.iter()
                .any(|r| r.ext("apiversion") == format!("{group}/v2"))
        })
        .await;
    let moved = events
        .iter()
        .find(|r| r.ext("apiversion") == format!("{group}/v2"))
        .unwrap();
    assert_eq!(moved.ext("name"), "t1", "{}", summary(&events));
    assert_eq!(moved.ext("origin"), "snapshot");
    assert_eq!(moved.data()["apiVersion"], format!("{group}/v2"));
    // Only the v2 watch runs before t2 is created, so that "published once, in v2 only" below
    // does not depend on how fast the v1 watch stops.
    wait_watches(&bridge, &[(&format!("{group}/v2/things"), &ns)]).await;
    create_object(&client, &group, "Thing", "things", &ns, "t2").await;
    let events = reader
        .read_until(WAIT, |got| got.iter().any(|r| r.ext("name") == "t2"))
        .await;
    let t2: Vec<_> = events.iter().filter(|r| r.ext("name") == "t2").collect();
    assert_eq!(
        t2.len(),
        1,
        "published once, in v2 only: {}",
        summary(&events)
    );
    assert_eq!(t2[0].ext("apiversion"), format!("{group}/v2"));
    // The v1 watch stopped because v1 is no longer preferred, not because its objects went.
    assert!(
        events.iter().all(|r| r.change() != "deleted"),
        "{}",
        summary(&events)
    );
    let log = bridge.log_text();
    assert!(log.contains("\"crd_deleted\":false"), "{log}");
    crds.delete(&name, &DeleteParams::default()).await.unwrap();
}
