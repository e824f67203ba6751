//! What events carry and where they go: diff payloads, noise control, redaction through a
//! wildcard, Kafka keys and tombstones for compacted topics, per-resource subjects, and the
//! Knative ApiServerSource shape.

use std::collections::BTreeMap;
use std::time::Duration;

use cloudevents::AttributesReader;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use rdkafka::Message;
use rdkafka::consumer::Consumer;
use serde_json::{Value, json};

use crate::harness::{Bridge, Reader, SinkKind, sink_yaml, summary};
use crate::support::{self, create_crd, env, kube_client, unique_name, unique_namespace};

const WAIT: Duration = Duration::from_secs(60);

fn cm(name: &str, data: Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": data})).unwrap()
}

/// Diff mode on NATS with a per-resource subject: each update's RFC 6902 patch, applied to the
/// previous version it carries, gives the new object; the subject is the resource's own.
#[tokio::test(flavor = "multi_thread")]
async fn diff_patches_rebuild_every_version_on_the_resources_subject() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "diff").await;
    let cluster = unique_name("c");
    let config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}], payload: diff, includePrevious: true, subject: \"audit.{{cluster}}.cm.{{name}}\"}}\n{}",
        sink_yaml(SinkKind::Nats, &cluster)
    );
    let mut bridge = Bridge::start(&config);
    let mut reader = Reader::nats(&cluster).await;
    bridge.wait_synced(1).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    cms.create(&PostParams::default(), &cm("web", json!({"k": "1"})))
        .await
        .unwrap();
    for patch in [
        json!({"data": {"k": "2"}}),
        json!({"data": {"n": "x"}, "metadata": {"labels": {"tier": "a"}}}),
        json!({"data": {"k": null}}),
    ] {
        cms.patch("web", &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap();
    }
    cms.delete("web", &DeleteParams::default()).await.unwrap();
    let events = reader
        .read_until(WAIT, |got| got.iter().any(|r| r.change() == "deleted"))
        .await;
    let changes: Vec<&str> = events.iter().map(|r| r.change()).collect();
    assert_eq!(
        changes,
        ["added", "modified", "modified", "modified", "deleted"],
        "{}",
        summary(&events)
    );
    let mut previous: Option<Value> = None;
    for r in &events {
        assert_eq!(r.destination, format!("audit.{cluster}.cm.web"));
        assert_eq!(r.ext("payload"), "diff");
        let doc = r.data();
        let object = doc["object"].clone();
        assert_eq!(
            object["metadata"]["resourceVersion"],
            r.ext("resourceversion").as_str()
        );
        if r.change() == "modified" {
            let before = previous.clone().expect("a previous version");
            assert_eq!(
                doc["previous"], before,
                "previous is the last published version"
            );
            let patch: json_patch::Patch = serde_json::from_value(doc["patch"].clone()).unwrap();
            let mut rebuilt = before;
            json_patch::patch(&mut rebuilt, &patch).unwrap();
            assert_eq!(
                rebuilt, object,
                "patch applied to previous gives the object"
            );
        } else {
            assert_eq!(doc["patch"], Value::Null);
        }
        previous = Some(object);
    }
}

fn checkpoint_rv(dir: &std::path::Path) -> u64 {
    // The base file's first line is its meta record; each checkpoint appended to the journal
    // beside it (`.checkpoint.journal`) ends with a line carrying its resourceVersion.
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.ends_with(".checkpoint") || name.ends_with(".checkpoint.journal")
        })
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|line| {
                    let record: Value = serde_json::from_str(line).ok()?;
                    record["resourceVersion"]
                        .as_str()
                        .or(record["resource_version"].as_str())?
                        .parse::<u64>()
                        .ok()
                })
                .collect::<Vec<_>>()
        })
        .max()
        .unwrap_or(0)
}

/// Noise control: status-only updates (with `/status` ignored), changes of an ignored
/// annotation and a server-side apply that only changes managedFields are not published but
/// still advance the checkpoint; a spec change is published.
#[tokio::test(flavor = "multi_thread")]
async fn noise_is_suppressed_but_the_checkpoint_advances() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "noise").await;
    let group = format!("{}.test.keb.dev", unique_name("n"));
    create_crd(&client, &group, "Widget", "widgets", "Namespaced").await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "cluster: dev\nresources:\n- {{apiVersion: {group}/v1, resource: widgets, namespaces: [{ns}], ignorePaths: [/status, /metadata/annotations/example.com~1heartbeat]}}\nsink: {{stdout: {{}}}}\ncheckpoint: {{directory: {}, intervalMs: 100}}\n",
        dir.path().display()
    );
    let mut bridge = Bridge::start(&config);
    let mut reader = Reader::stdout(&bridge);
    bridge.wait_synced(1).await;
    let res = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&group, "v1", "Widget"),
        "widgets",
    );
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &res);
    let manifest = json!({"apiVersion": format!("{group}/v1"), "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 1}});
    widgets
        .patch("w", &PatchParams::apply("first"), &Patch::Apply(&manifest))
        .await
        .unwrap();
    reader.read_until(WAIT, |got| got.len() == 1).await;

    let merge = |v: Value| Patch::Merge(v);
    widgets
        .patch(
            "w",
            &PatchParams::default(),
            &merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    widgets
        .patch(
            "w",
            &PatchParams::default(),
            &merge(json!({"metadata": {"annotations": {"example.com/heartbeat": "1"}}})),
        )
        .await
        .unwrap();
    let noop = widgets
        .patch("w", &PatchParams::apply("second"), &Patch::Apply(&manifest))
        .await
        .unwrap();
    let last_noise: u64 = noop
        .metadata
        .resource_version
        .clone()
        .unwrap()
        .parse()
        .unwrap();
    support::wait_until(
        "the checkpoint passes the suppressed updates",
        WAIT,
        || async { (checkpoint_rv(dir.path()) >= last_noise).then_some(()) },
    )
    .await;
    let noise = reader.drain(Duration::from_millis(500)).await;
    assert!(
        noise.is_empty(),
        "noise must not be published:\n{}\n{}",
        summary(&noise),
        noise
            .iter()
            .map(|r| r.data().to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    widgets
        .patch(
            "w",
            &PatchParams::default(),
            &merge(json!({"spec": {"size": 2}})),
        )
        .await
        .unwrap();
    let events = reader.read_until(WAIT, |got| !got.is_empty()).await;
    assert_eq!(events.len(), 1, "{}", summary(&events));
    assert_eq!(events[0].change(), "modified");
    assert_eq!(events[0].data()["spec"]["size"], 2);
    assert_eq!(
        events[0].data()["status"]["phase"],
        "Running",
        "the published object is whole"
    );

    let address = bridge.admin_address().await;
    let (_, metrics) = crate::admin::get(&address, "/metrics").await;
    let suppressed: f64 = metrics
        .lines()
        .find(|l| l.starts_with("kube_event_bridge_events_suppressed_total{"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_default();
    assert_eq!(suppressed, 3.0, "{metrics}");
}

/// Secrets reached through a wildcard are redacted; `redact` pointers apply to other kinds; an
/// explicit opt-out publishes a Secret in clear and is logged loudly.
#[tokio::test(flavor = "multi_thread")]
async fn redaction_holds_through_a_wildcard() {
    let client = kube_client().await;
    let (wild, clear) = (
        unique_namespace(&client, "redact").await,
        unique_namespace(&client, "clear").await,
    );
    let config = format!(
        "cluster: dev\nresources:\n- {{apiVersion: v1, resource: \"*\", namespaces: [{wild}], exclude: [{{resource: events}}], redact: [/data/password]}}\n- {{apiVersion: v1, resource: secrets, namespaces: [{clear}], redactSecretData: false}}\nsink: {{stdout: {{}}}}\n"
    );
    let mut bridge = Bridge::start(&config);
    let mut reader = Reader::stdout(&bridge);
    bridge.wait_synced(2).await;
    let secret = |name: &str| -> Secret {
        serde_json::from_value(
            json!({"metadata": {"name": name}, "stringData": {"password": "hunter2"}}),
        )
        .unwrap()
    };
    Api::<Secret>::namespaced(client.clone(), &wild)
        .create(&PostParams::default(), &secret("s"))
        .await
        .unwrap();
    Api::<Secret>::namespaced(client.clone(), &clear)
        .create(&PostParams::default(), &secret("s-clear"))
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), &wild)
        .create(
            &PostParams::default(),
            &cm("c", json!({"password": "p4ss", "user": "u"})),
        )
        .await
        .unwrap();
    let events = reader
        .read_until(WAIT, |got| {
            ["s", "s-clear", "c"]
                .iter()
                .all(|n| got.iter().any(|r| r.ext("name") == *n))
        })
        .await;
    let by_name: BTreeMap<String, Value> =
        events.iter().map(|r| (r.ext("name"), r.data())).collect();
    assert_eq!(by_name["s"]["data"]["password"], "<redacted>");
    assert_eq!(by_name["c"]["data"]["password"], "<redacted>");
    assert_eq!(by_name["c"]["data"]["user"], "u");
    assert_eq!(
        by_name["s-clear"]["data"]["password"], "aHVudGVyMg==",
        "opted out"
    );
    let log = bridge.log_text();
    assert!(
        log.contains("\"level\":\"WARN\"") && log.contains("Secret redaction is OFF"),
        "{log}"
    );
    let leaked = std::fs::read_to_string(&bridge.stdout).unwrap();
    assert_eq!(
        leaked.matches("aHVudGVyMg==").count(),
        1,
        "only the opted-out Secret is in clear"
    );
}

/// One Kafka record as read back.
struct Record {
    partition: i32,
    offset: i64,
    key: String,
    value: Option<Value>,
    headers: BTreeMap<String, String>,
}

impl Record {
    fn of(m: &rdkafka::message::BorrowedMessage<'_>) -> Self {
        use rdkafka::message::Headers;
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|x| {
                        let value = String::from_utf8_lossy(x.value.unwrap_or_default());
                        (x.key.to_string(), value.into_owned())
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            partition: m.partition(),
            offset: m.offset(),
            key: String::from_utf8(m.key().expect("a key").to_vec()).expect("utf-8 key"),
            value: m
                .payload()
                .map(|p| serde_json::from_slice(p).expect("JSON value")),
            headers,
        }
    }
}

/// Kafka with `key: namespacedName` and tombstones on the resource's own topic: every delete is
/// followed by a tombstone with the same key, and folding the topic by key (what compaction
/// keeps) yields exactly the objects that exist.
#[tokio::test(flavor = "multi_thread")]
async fn tombstones_make_a_compacted_topic_hold_the_live_objects() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "tomb").await;
    let cluster = unique_name("c");
    let topic = format!("state.{cluster}.configmaps");
    support::create_topic(&topic, 3).await;
    let config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}], topic: \"state.{{cluster}}.{{resource}}\", key: namespacedName, tombstones: true}}\n{}",
        sink_yaml(SinkKind::Kafka, &cluster)
    );
    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(1).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for name in ["a", "b", "c"] {
        cms.create(&PostParams::default(), &cm(name, json!({"v": "1"})))
            .await
            .unwrap();
    }
    cms.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "2"}})),
    )
    .await
    .unwrap();
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    cms.delete("c", &DeleteParams::default()).await.unwrap();
    cms.create(&PostParams::default(), &cm("c", json!({"v": "new"})))
        .await
        .unwrap();

    let consumer = support::kafka_consumer(&unique_name("state"));
    consumer.subscribe(&[&topic]).unwrap();
    let mut records: Vec<Record> = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while records.len() < 9 && tokio::time::Instant::now() < deadline {
        let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(5), consumer.recv()).await else {
            continue;
        };
        records.push(Record::of(&m));
    }
    let seen: Vec<_> = records
        .iter()
        .map(|r| (&r.key, r.value.is_some()))
        .collect();
    assert_eq!(records.len(), 9, "{seen:?}");
    for (i, r) in records.iter().enumerate() {
        if r.value.is_none() {
            // Right behind its delete, in the same partition.
            let before = records[..i]
                .iter()
                .rev()
                .find(|b| b.partition == r.partition)
                .expect("a record before the tombstone");
            assert_eq!(before.offset + 1, r.offset);
            assert_eq!(before.key, r.key);
            assert_eq!(
                before.headers["ce_type"],
                "io.kubeeventbridge.object.deleted"
            );
        } else {
            assert_eq!(r.headers["ce_partitionkey"], r.key);
            assert!(r.key.starts_with(&format!("{ns}/")), "{}", r.key);
        }
    }
    // What compaction keeps: the last value per key, a tombstone removing the key.
    records.sort_by_key(|r| (r.partition, r.offset));
    let mut state: BTreeMap<String, Value> = BTreeMap::new();
    for r in records {
        match r.value {
            Some(v) => state.insert(r.key, v),
            None => state.remove(&r.key),
        };
    }
    let live: BTreeMap<String, Value> = cms
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| {
            (
                format!("{ns}/{}", c.metadata.name.clone().unwrap()),
                json!(c.data),
            )
        })
        .collect();
    let folded: BTreeMap<String, Value> = state
        .into_iter()
        .map(|(k, v)| (k, v["data"].clone()))
        .collect();
    assert_eq!(folded, live);
}

/// `eventFormat: knative`: types, source, subject, extensions and data as Knative's
/// ApiServerSource sends them (full and reference mode), with the deterministic id kept.
#[tokio::test(flavor = "multi_thread")]
async fn knative_mode_matches_apiserversource() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "kn").await;
    let cluster = unique_name("c");
    let config = format!(
        "cluster: {cluster}\neventFormat: knative\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n- {{apiVersion: v1, resource: secrets, namespaces: [{ns}], payload: reference}}\n{}",
        sink_yaml(SinkKind::Kafka, &cluster)
    );
    let mut bridge = Bridge::start(&config);
    let topics = vec![
        format!("k8s.{cluster}.core.configmaps"),
        format!("k8s.{cluster}.core.secrets"),
    ];
    let mut reader = Reader::kafka(&topics).await;
    bridge.wait_synced(2).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let created = cms
        .create(&PostParams::default(), &cm("web", json!({"k": "v"})))
        .await
        .unwrap();
    cms.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "w"}})),
    )
    .await
    .unwrap();
    cms.delete("web", &DeleteParams::default()).await.unwrap();
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "s"}, "stringData": {"x": "y"}}))
            .unwrap();
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let events = reader.read_until(WAIT, |got| got.len() >= 4).await;

    let kubeconfig = kube::config::Kubeconfig::read_from(env().kubeconfig).unwrap();
    let server = kubeconfig.clusters[0]
        .cluster
        .as_ref()
        .unwrap()
        .server
        .clone()
        .unwrap();
    let server = server.trim_end_matches('/');
    let uid = created.metadata.uid.unwrap();
    let mut cm_types = Vec::new();
    for r in &events {
        let h = &r.headers;
        assert_eq!(r.event.source().to_string(), server);
        assert_eq!(h["ce_apiversion"], "v1");
        assert_eq!(h["ce_namespace"], ns);
        assert_eq!(h["content-type"], "application/json");
        assert!(!h.contains_key("ce_dataschema"));
        assert_eq!(
            r.event.id(),
            format!(
                "{}:{}:{}",
                r.ext("uid"),
                r.ext("resourceversion"),
                match r.event.ty().rsplit('.').next().unwrap() {
                    "add" => "added",
                    "update" => "modified",
                    _ => "deleted",
                }
            )
        );
        if h["ce_kind"] == "ConfigMap" {
            cm_types.push(r.event.ty().to_string());
            assert_eq!(
                r.event.subject(),
                Some(format!("/apis/v1/namespaces/{ns}/configmaps/web").as_str())
            );
            assert_eq!(h["ce_name"], "web");
            assert_eq!(r.data()["metadata"]["uid"], uid.as_str());
            assert_eq!(r.data()["kind"], "ConfigMap");
        } else {
            assert_eq!(h["ce_kind"], "Secret");
            assert_eq!(r.event.ty(), "dev.knative.apiserver.ref.add");
            assert_eq!(
                r.event.subject(),
                Some(format!("/apis/v1/namespaces/{ns}/secrets/s").as_str())
            );
            assert_eq!(
                r.data(),
                json!({"apiVersion": "v1", "kind": "Secret", "name": "s", "namespace": ns})
            );
        }
    }
    assert_eq!(
        cm_types,
        [
            "dev.knative.apiserver.resource.add",
            "dev.knative.apiserver.resource.update",
            "dev.knative.apiserver.resource.delete"
        ]
    );
}
