//! The bridge end to end, for each sink: the real binary against the real API server and broker,
//! its events read back with real clients and checked attribute by attribute.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cloudevents::AttributesReader;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

use crate::harness::{Bridge, Reader, Received, SinkKind, checkpoint_extra, sink_yaml, summary};
use crate::support::{create_crd, kube_client, unique_name, unique_namespace};

const WAIT: Duration = Duration::from_secs(60);

fn cm(name: &str, labels: serde_json::Value, data: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "data": data}))
        .unwrap()
}

fn rv_of(meta: &kube::api::ObjectMeta) -> u64 {
    meta.resource_version.as_deref().unwrap().parse().unwrap()
}

/// Checks every attribute, extension and binding header of one event.
fn check_attributes(
    r: &Received,
    sink: SinkKind,
    cluster: &str,
    source: &str,
    kind: &str,
    namespace: Option<&str>,
) {
    let e = &r.event;
    let uid = r.ext("uid");
    let rv = r.ext("resourceversion");
    assert_eq!(e.specversion().as_str(), "1.0");
    assert_eq!(
        e.id(),
        format!("{uid}:{rv}:{}", r.change()),
        "deterministic id"
    );
    assert_eq!(e.source().to_string(), source);
    assert!(
        ["added", "modified", "deleted"].contains(&r.change()),
        "type {}",
        e.ty()
    );
    assert_eq!(e.ty(), format!("io.kubeeventbridge.object.{}", r.change()));
    let name = r.ext("name");
    let subject = match namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.clone(),
    };
    assert_eq!(e.subject(), Some(subject.as_str()));
    assert!(e.time().is_some(), "time");
    assert_eq!(
        e.dataschema().map(|u| u.to_string()).as_deref(),
        Some("https://kube-event-bridge.dev/schemas/event/v1")
    );
    assert_eq!(e.datacontenttype(), Some("application/json"));
    assert_eq!(r.ext("cluster"), cluster);
    assert_eq!(r.ext("kind"), kind);
    assert_eq!(r.ext("namespace"), namespace.unwrap_or_default());
    assert!(!uid.is_empty());
    assert_eq!(r.ext("sequence"), format!("{rv:0>20}"));
    assert_eq!(r.ext("partitionkey"), uid);
    let data = r.data();
    assert_eq!(data["metadata"]["uid"], uid.as_str());
    assert_eq!(data["metadata"]["name"], name.as_str());
    assert_eq!(data["kind"], kind);
    assert!(
        data["metadata"].get("managedFields").is_none(),
        "managedFields stripped: {data}"
    );
    match sink {
        SinkKind::Kafka => {
            assert_eq!(
                r.key.as_deref(),
                Some(uid.as_str()),
                "record key is the uid"
            );
            assert_eq!(r.headers["content-type"], "application/json");
            assert_eq!(r.headers["ce_id"], e.id());
            assert_eq!(r.headers["ce_specversion"], "1.0");
        }
        SinkKind::Nats => {
            assert_eq!(r.headers["Nats-Msg-Id"], e.id(), "JetStream dedup id");
            assert_eq!(r.headers["Content-Type"], "application/json");
            assert!(
                r.destination.starts_with(&format!("k8s.{cluster}.")),
                "{}",
                r.destination
            );
            assert!(
                r.destination
                    .ends_with(&format!(".{}", name.replace('.', "_"))),
                "{}",
                r.destination
            );
        }
        SinkKind::Http => {
            assert_eq!(r.headers["content-type"], "application/json");
            assert_eq!(r.headers["ce-id"], e.id());
            assert_eq!(r.headers["ce-specversion"], "1.0");
        }
        SinkKind::Stdout => {}
    }
}

/// Groups events by object (uid) in arrival order.
fn by_uid(events: &[Received]) -> BTreeMap<String, Vec<&Received>> {
    let mut m: BTreeMap<String, Vec<&Received>> = BTreeMap::new();
    for r in events {
        m.entry(r.ext("uid")).or_default().push(r);
    }
    m
}

/// ConfigMaps, a namespaced custom resource and a cluster-scoped custom resource in one run: the
/// initial snapshot, then creates, updates and deletes, each object's changes in order with the
/// resourceVersions the API server returned.
async fn lifecycle(sink: SinkKind) {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "life").await;
    let cluster = unique_name("c");
    let group = format!("{}.test.keb.dev", unique_name("g"));
    create_crd(&client, &group, "Widget", "widgets", "Namespaced").await;
    create_crd(&client, &group, "Gadget", "gadgets", "Cluster").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pre = cms
        .create(
            &PostParams::default(),
            &cm("pre", json!({}), json!({"x": "0"})),
        )
        .await
        .unwrap();

    let config = format!(
        "cluster: {cluster}\ncheckpoint: {{intervalMs: 500{}}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n- {{apiVersion: {group}/v1, resource: Widget, namespaces: [{ns}]}}\n- {{apiVersion: {group}/v1, resource: gadgets}}\n{}",
        checkpoint_extra(sink, &cluster),
        sink_yaml(sink, &cluster)
    );
    let mut bridge = Bridge::start(&config);
    let topics = vec![
        format!("k8s.{cluster}.core.configmaps"),
        format!("k8s.{cluster}.{group}.widgets"),
        format!("k8s.{cluster}.{group}.gadgets"),
    ];
    let mut reader = Reader::for_sink(sink, &cluster, &topics, &bridge).await;
    bridge.wait_synced(3).await;

    let pp = PostParams::default();
    let patch = |v: &str| Patch::Merge(json!({"data": {"x": v}}));
    let a = cms
        .create(&pp, &cm("a", json!({}), json!({"x": "1"})))
        .await
        .unwrap();
    let a2 = cms
        .patch("a", &PatchParams::default(), &patch("2"))
        .await
        .unwrap();
    let a3 = cms
        .patch("a", &PatchParams::default(), &patch("3"))
        .await
        .unwrap();
    cms.delete("a", &DeleteParams::default()).await.unwrap();

    let wres = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&group, "v1", "Widget"),
        "widgets",
    );
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &wres);
    let w: DynamicObject = serde_json::from_value(json!({"apiVersion": format!("{group}/v1"), "kind": "Widget", "metadata": {"name": "w.1"}, "spec": {"size": 1}})).unwrap();
    let w1 = widgets.create(&pp, &w).await.unwrap();
    let w2 = widgets
        .patch(
            "w.1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 2}})),
        )
        .await
        .unwrap();
    widgets
        .delete("w.1", &DeleteParams::default())
        .await
        .unwrap();

    let gres = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&group, "v1", "Gadget"),
        "gadgets",
    );
    let gadgets: Api<DynamicObject> = Api::all_with(client.clone(), &gres);
    let g: DynamicObject = serde_json::from_value(json!({"apiVersion": format!("{group}/v1"), "kind": "Gadget", "metadata": {"name": "g1"}, "spec": {"on": true}})).unwrap();
    let g1 = gadgets.create(&pp, &g).await.unwrap();
    gadgets
        .delete("g1", &DeleteParams::default())
        .await
        .unwrap();

    let events = reader.read_until(WAIT, |got| got.len() >= 10).await;
    let extra = reader.drain(Duration::from_millis(1500)).await;
    assert!(
        extra.is_empty(),
        "unexpected extra events:\n{}",
        summary(&extra)
    );
    let objects = by_uid(&events);

    // The snapshot: the object that existed before the bridge started, once, marked as such.
    let pre_events = &objects[pre.metadata.uid.as_deref().unwrap()];
    assert_eq!(pre_events.len(), 1, "{}", summary(&events));
    assert_eq!(pre_events[0].change(), "added");
    assert_eq!(pre_events[0].ext("origin"), "snapshot");
    assert_eq!(pre_events[0].rv(), rv_of(&pre.metadata));

    // ConfigMap "a": every change, in order, with the API server's resourceVersions.
    let a_events = &objects[a.metadata.uid.as_deref().unwrap()];
    let changes: Vec<&str> = a_events.iter().map(|r| r.change()).collect();
    assert_eq!(
        changes,
        ["added", "modified", "modified", "deleted"],
        "{}",
        summary(&events)
    );
    assert_eq!(a_events[0].rv(), rv_of(&a.metadata));
    assert_eq!(a_events[1].rv(), rv_of(&a2.metadata));
    assert_eq!(a_events[2].rv(), rv_of(&a3.metadata));
    assert!(
        a_events[3].rv() > a_events[2].rv(),
        "a delete carries the deletion's revision"
    );
    assert_eq!(
        a_events[3].data()["data"]["x"],
        "3",
        "a delete carries the last state"
    );
    assert!(a_events.iter().all(|r| r.ext("origin") == "live"));
    for r in a_events.iter().chain(pre_events) {
        check_attributes(
            r,
            sink,
            &cluster,
            &format!("/k8s/{cluster}/api/v1/configmaps"),
            "ConfigMap",
            Some(&ns),
        );
        assert_eq!(r.ext("apiversion"), "v1");
        assert_eq!(r.ext("resource"), "configmaps");
    }

    // The namespaced custom resource (a dotted name, for subject safety).
    let w_events = &objects[w1.metadata.uid.as_deref().unwrap()];
    let changes: Vec<&str> = w_events.iter().map(|r| r.change()).collect();
    assert_eq!(changes, ["added", "modified", "deleted"]);
    assert_eq!(w_events[1].rv(), rv_of(&w2.metadata));
    assert_eq!(w_events[1].data()["spec"]["size"], 2);
    for r in w_events {
        check_attributes(
            r,
            sink,
            &cluster,
            &format!("/k8s/{cluster}/apis/{group}/v1/widgets"),
            "Widget",
            Some(&ns),
        );
        assert_eq!(r.ext("apiversion"), format!("{group}/v1"));
    }

    // The cluster-scoped custom resource: no namespace extension, subject = name.
    let g_events = &objects[g1.metadata.uid.as_deref().unwrap()];
    let changes: Vec<&str> = g_events.iter().map(|r| r.change()).collect();
    assert_eq!(changes, ["added", "deleted"]);
    for r in g_events {
        check_attributes(
            r,
            sink,
            &cluster,
            &format!("/k8s/{cluster}/apis/{group}/v1/gadgets"),
            "Gadget",
            None,
        );
        assert!(r.event.extension("namespace").is_none());
    }

    if sink == SinkKind::Kafka {
        // Every change of one object went to one partition of the resource's topic.
        for r in &events {
            let expected = if r.ext("kind") == "ConfigMap" {
                &topics[0]
            } else if r.ext("kind") == "Widget" {
                &topics[1]
            } else {
                &topics[2]
            };
            assert_eq!(&r.destination, expected);
        }
    }

    // SIGTERM: drains and exits 0 within the grace period.
    bridge.signal("TERM");
    let status = bridge
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("bridge exits after SIGTERM");
    assert!(
        status.success(),
        "exit status {status}; log:\n{}",
        bridge.log_text()
    );
    assert_eq!(bridge.count_log("shutdown complete"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_lifecycle() {
    lifecycle(SinkKind::Kafka).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_lifecycle() {
    lifecycle(SinkKind::Nats).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stdout_lifecycle() {
    lifecycle(SinkKind::Stdout).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_lifecycle() {
    lifecycle(SinkKind::Http).await;
}

/// Label and field selectors, the event-type filter, and Secret redaction.
async fn filters_and_redaction(sink: SinkKind) {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "filter").await;
    let cluster = unique_name("c");
    let config = format!(
        "cluster: {cluster}\nresources:\n- apiVersion: v1\n  resource: configmaps\n  namespaces: [{ns}]\n  labelSelector: app=web\n  fieldSelector: metadata.name!=skip-me\n  events: [added, deleted]\n- {{apiVersion: v1, resource: secrets, namespaces: [{ns}]}}\n{}",
        sink_yaml(sink, &cluster)
    );
    let mut bridge = Bridge::start(&config);
    let topics = vec![
        format!("k8s.{cluster}.core.configmaps"),
        format!("k8s.{cluster}.core.secrets"),
    ];
    let mut reader = Reader::for_sink(sink, &cluster, &topics, &bridge).await;
    bridge.wait_synced(2).await;

    let pp = PostParams::default();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    cms.create(&pp, &cm("other", json!({"app": "db"}), json!({})))
        .await
        .unwrap();
    cms.create(&pp, &cm("skip-me", json!({"app": "web"}), json!({})))
        .await
        .unwrap();
    let web = cms
        .create(&pp, &cm("web-1", json!({"app": "web"}), json!({"k": "v"})))
        .await
        .unwrap();
    cms.patch(
        "web-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "v2"}})),
    )
    .await
    .unwrap();
    cms.delete("web-1", &DeleteParams::default()).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let s: Secret = serde_json::from_value(json!({
        "metadata": {"name": "creds", "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"password\":\"aHVudGVyMg==\"}}"}},
        "data": {"password": "aHVudGVyMg=="}, "stringData": {"token": "plain-token"}
    }))
    .unwrap();
    secrets.create(&pp, &s).await.unwrap();

    let mut events = reader.read_until(WAIT, |got| got.len() >= 3).await;
    events.extend(reader.drain(Duration::from_millis(1500)).await);
    let seen: BTreeSet<(String, String)> = events
        .iter()
        .map(|r| (r.ext("name"), r.change().to_string()))
        .collect();
    let expected: BTreeSet<(String, String)> =
        [("web-1", "added"), ("web-1", "deleted"), ("creds", "added")]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
    assert_eq!(seen, expected, "{}", summary(&events));
    assert_eq!(events.len(), 3, "{}", summary(&events));
    let web_added = events
        .iter()
        .find(|r| r.ext("name") == "web-1" && r.change() == "added")
        .unwrap();
    assert_eq!(web_added.ext("uid"), web.metadata.uid.unwrap());

    let secret = events.iter().find(|r| r.ext("name") == "creds").unwrap();
    let data = secret.data();
    assert_eq!(data["data"]["password"], "<redacted>");
    assert_eq!(
        data["data"]["token"], "<redacted>",
        "stringData is merged into data by the API server"
    );
    assert!(
        data["metadata"]["annotations"]
            .get("kubectl.kubernetes.io/last-applied-configuration")
            .is_none(),
        "the last-applied annotation is stripped by default: {data}"
    );
    let raw = serde_json::to_string(&data).unwrap();
    assert!(
        !raw.contains("aHVudGVyMg") && !raw.contains("plain-token"),
        "secret leaked: {raw}"
    );
    assert!(
        !bridge.log_text().contains("aHVudGVyMg"),
        "secret leaked into the log"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_filters_and_redaction() {
    filters_and_redaction(SinkKind::Kafka).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_filters_and_redaction() {
    filters_and_redaction(SinkKind::Nats).await;
}

/// An object whose event exceeds the broker's maximum message size arrives as a reference marked
/// `truncated`, in order, without blocking the objects behind it.
async fn oversized(sink: SinkKind) {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "big").await;
    let cluster = unique_name("c");
    let config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}",
        sink_yaml(sink, &cluster)
    );
    let mut bridge = Bridge::start(&config);
    let topics = vec![format!("k8s.{cluster}.core.configmaps")];
    let mut reader = Reader::for_sink(sink, &cluster, &topics, &bridge).await;
    bridge.wait_synced(1).await;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    // About 1 MB: over librdkafka's message.max.bytes and the test NATS server's max_payload,
    // under the API server's limit.
    let big = "x".repeat(1_000_000);
    let created = cms
        .create(
            &PostParams::default(),
            &cm("big", json!({}), json!({"blob": big})),
        )
        .await
        .unwrap();
    cms.create(&PostParams::default(), &cm("after", json!({}), json!({})))
        .await
        .unwrap();

    // Different objects: Kafka keeps no order between them (different keys, partitions).
    let mut events = reader
        .read_until(WAIT, |got| {
            ["big", "after"]
                .iter()
                .all(|n| got.iter().any(|r| r.ext("name") == *n))
        })
        .await;
    events.sort_by_key(|r| r.ext("name") != "big");
    let names: Vec<String> = events.iter().map(|r| r.ext("name")).collect();
    assert_eq!(
        names,
        ["big", "after"],
        "{}\nlog:\n{}",
        summary(&events),
        bridge.log_text()
    );
    let truncated = &events[0];
    assert_eq!(truncated.ext("truncated"), "true");
    assert_eq!(truncated.ext("payload"), "reference");
    assert_eq!(truncated.change(), "added");
    let uid = created.metadata.uid.clone().unwrap();
    let rv = created.metadata.resource_version.clone().unwrap();
    assert_eq!(truncated.event.id(), format!("{uid}:{rv}:added"));
    assert_eq!(
        truncated.data(),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "namespace": ns, "name": "big", "uid": uid, "resourceVersion": rv})
    );
    assert_eq!(events[1].ext("truncated"), "");
    assert_eq!(events[1].ext("payload"), "full");
    assert!(
        bridge
            .log_text()
            .contains("event exceeds the broker's message size: publishing a reference"),
        "{}",
        bridge.log_text()
    );
    drop(bridge);
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_oversized_message_does_not_block() {
    oversized(SinkKind::Kafka).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_oversized_message_does_not_block() {
    oversized(SinkKind::Nats).await;
}
