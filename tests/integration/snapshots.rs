//! Snapshots on demand end to end: a request ConfigMap makes the running bridge publish the
//! current objects of one watch between a begin and an end marker while live changes go on; per
//! object the stream never goes backwards, and every object is covered between the markers; a
//! bridge killed in the middle resumes the snapshot; a request that cannot be served fails with
//! its reason; `snapshot --wait` follows a request to its end.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cloudevents::AttributesReader;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::admin::sample;
use crate::harness::{
    Bridge, Reader, Received, SinkKind, checkpoint_extra, get, run_cli, sink_yaml, summary,
};
use crate::receiver::Reply;
use crate::support::{kube_client, unique_name, unique_namespace, wait_until};

const BEGIN: &str = "io.kubeeventbridge.snapshot.begin";
const END: &str = "io.kubeeventbridge.snapshot.end";
const PHASE: &str = "kube-event-bridge.dev/snapshot-phase";
const STATUS: &str = "kube-event-bridge.dev/snapshot-status";

/// A namespace of `count` ConfigMaps, and a namespace for the requests.
async fn objects(prefix: &str, count: usize) -> (kube::Client, String, String) {
    let client = kube_client().await;
    let ns = unique_namespace(&client, prefix).await;
    let requests = unique_namespace(&client, &format!("{prefix}-req")).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for i in 0..count {
        let cm = json!({"metadata": {"name": format!("cm-{i:04}")}, "data": {"v": "0"}});
        let cm: ConfigMap = serde_json::from_value(cm).unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    (client, ns, requests)
}

/// A bridge configuration watching `ns`'s ConfigMaps, reading requests in `requests`.
fn config(cluster: &str, ns: &str, requests: &str, sink: SinkKind) -> String {
    format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsnapshotRequests: {{namespace: {requests}}}\ncheckpoint: {{enabled: true{}}}\n{}",
        checkpoint_extra(sink, cluster),
        sink_yaml(sink, cluster)
    )
}

/// Writes a request for `ns`'s ConfigMaps in chunks of `chunk`; returns its name and uid.
async fn request(client: &kube::Client, requests: &str, ns: &str, chunk: u32) -> (String, String) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), requests);
    let cm = json!({
        "metadata": {"generateName": "snapshot-", "labels": {"kube-event-bridge.dev/snapshot-request": "true"}},
        "data": {"resource": "v1/configmaps", "namespace": ns, "chunkSize": chunk.to_string()},
    });
    let created = api
        .create(&PostParams::default(), &serde_json::from_value(cm).unwrap())
        .await
        .unwrap();
    (
        created.metadata.name.unwrap(),
        created.metadata.uid.unwrap(),
    )
}

/// Runs `kube-event-bridge snapshot --wait` for `resource` with `bridge`'s configuration and
/// `flags`: its exit status, standard output and standard error.
fn snapshot_cli(
    bridge: &Bridge,
    resource: &str,
    flags: &[&str],
) -> (std::process::ExitStatus, String, String) {
    let path = bridge.dir().join("bridge.yaml");
    let mut args = vec![
        "snapshot",
        "--config",
        path.to_str().unwrap(),
        "--resource",
        resource,
    ];
    args.extend(flags);
    args.push("--wait");
    run_cli(&args)
}

/// Waits until the request `name` reaches a final phase; returns it and the status document.
async fn ended(client: &kube::Client, requests: &str, name: &str) -> (String, serde_json::Value) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), requests);
    wait_until(
        "the snapshot request ends",
        Duration::from_secs(180),
        || {
            let api = api.clone();
            async move {
                let cm = api.get(name).await.ok()?;
                let a = cm.metadata.annotations.unwrap_or_default();
                let phase = a.get(PHASE)?.clone();
                let status = serde_json::from_str(a.get(STATUS)?).ok()?;
                matches!(phase.as_str(), "Complete" | "Failed").then_some((phase, status))
            }
        },
    )
    .await
}

/// Patches `ns`'s ConfigMaps one after the other until `stop`, as fast as the API server takes.
fn churn(
    client: kube::Client,
    ns: String,
    count: usize,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let cms: Api<ConfigMap> = Api::namespaced(client, &ns);
        let mut writes = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let name = format!("cm-{:04}", writes as usize % count);
            let patch = Patch::Merge(json!({"data": {"v": writes.to_string()}}));
            if cms
                .patch(&name, &PatchParams::default(), &patch)
                .await
                .is_ok()
            {
                writes += 1;
            }
        }
        writes
    })
}

/// Per object, the resourceVersions of its events in stream order never go down.
fn never_backwards(events: &[Received]) {
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.event.ty().starts_with("io.kubeeventbridge.object."))
    {
        let rv = e.rv();
        let before = last.insert(e.ext("name"), rv).unwrap_or(0);
        assert!(
            rv >= before,
            "{} went back from {before} to {rv}:\n{}",
            e.ext("name"),
            summary(events)
        );
    }
}

/// What a snapshot requested during changes published.
struct Framed {
    /// Everything read, to a little after the end marker.
    events: Vec<Received>,
    /// The snapshot's id.
    uid: String,
    /// The request's recorded progress.
    status: serde_json::Value,
    /// Changes written meanwhile.
    writes: u64,
    /// Where the begin and end markers are in `events`.
    begin: usize,
    end: usize,
}

/// Requests a snapshot of `ns`'s `count` ConfigMaps in chunks of `chunk` while they change, waits
/// until it is complete and reads what `reader` received to its end marker: never backwards
/// per object, the begin marker before the end marker.
async fn during_churn(
    client: &kube::Client,
    ns: &str,
    requests: &str,
    reader: &mut Reader,
    count: usize,
    chunk: u32,
) -> Framed {
    let stop = Arc::new(AtomicBool::new(false));
    let writer = churn(client.clone(), ns.to_string(), count, stop.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (name, uid) = request(client, requests, ns, chunk).await;
    let (phase, status) = ended(client, requests, &name).await;
    stop.store(true, Ordering::Relaxed);
    let writes = writer.await.unwrap();
    assert_eq!(phase, "Complete", "{status}");
    let mut events = reader
        .read_until(Duration::from_secs(60), |got| {
            got.iter().any(|e| e.event.ty() == END)
        })
        .await;
    events.extend(reader.drain(Duration::from_secs(2)).await);
    never_backwards(&events);
    let at = |ty: &str| events.iter().position(|e| e.event.ty() == ty).unwrap();
    let (begin, end) = (at(BEGIN), at(END));
    assert!(begin < end);
    Framed {
        events,
        uid,
        status,
        writes,
        begin,
        end,
    }
}

/// On NATS (one order for the whole stream), with changes going on, a snapshot in chunks:
/// framed by its markers, every object covered between them, never backwards, and the counts on
/// the request and in the end marker agree with what was published.
#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_during_changes_covers_every_object_and_never_goes_backwards() {
    let count = 240;
    let (client, ns, requests) = objects("snapdemand", count).await;
    let cluster = unique_name("c");
    let mut bridge = Bridge::start(&config(&cluster, &ns, &requests, SinkKind::Nats));
    bridge.wait_synced(1).await;
    let mut reader = Reader::nats(&cluster).await;
    let Framed {
        events,
        uid,
        status,
        writes,
        begin,
        end,
    } = during_churn(&client, &ns, &requests, &mut reader, count, 25).await;
    assert_eq!(events[begin].ext("snapshotid"), uid);
    assert_eq!(events[begin].data()["expected"], count);
    let covered: BTreeSet<String> = events[begin..end]
        .iter()
        .filter(|e| e.event.ty().starts_with("io.kubeeventbridge.object."))
        .map(|e| e.ext("name"))
        .collect();
    let missing: Vec<String> = (0..count)
        .map(|i| format!("cm-{i:04}"))
        .filter(|n| !covered.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "not covered between the markers: {missing:?}"
    );
    let snapshot: Vec<&Received> = events
        .iter()
        .filter(|e| e.ext("snapshotid") == uid && e.ext("origin") == "snapshot")
        .collect();
    let end_data = events[end].data();
    assert_eq!(end_data["result"], "complete");
    assert_eq!(end_data["sent"], snapshot.len(), "{}", summary(&events));
    assert_eq!(
        snapshot.len() as u64 + end_data["skipped"].as_u64().unwrap(),
        count as u64,
        "every listed object is sent or skipped"
    );
    assert_eq!(status["sent"], end_data["sent"]);
    assert!(writes > 0, "changes went on during the snapshot");
    assert!(
        snapshot
            .iter()
            .all(|e| e.event.id().ends_with(&format!(":{uid}"))),
        "snapshot events have ids of their own"
    );
    // The metrics agree with the end marker.
    let (_, metrics) = get(&bridge.admin_address().await, "/metrics").await;
    let counted = |name: &str, label: (&str, &str)| sample(&metrics, name, &[label]);
    let objects = "kube_event_bridge_snapshot_objects_total";
    assert_eq!(
        counted("kube_event_bridge_snapshots_total", ("result", "complete")),
        1.0
    );
    assert_eq!(
        counted(objects, ("outcome", "emitted")),
        end_data["sent"].as_f64().unwrap()
    );
    assert_eq!(
        counted(objects, ("outcome", "skipped")),
        end_data["skipped"].as_f64().unwrap()
    );
    assert_eq!(
        sample(&metrics, "kube_event_bridge_snapshots_running", &[]),
        0.0
    );
}

/// On Kafka through the command: `snapshot --wait` writes the request and returns once it is
/// complete; the markers are on the watch's topic, keyed by their own ids, and every object has a
/// snapshot event.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_snapshot_command_waits_for_a_complete_snapshot() {
    let count = 30;
    let (_client, ns, requests) = objects("snapcli", count).await;
    let cluster = unique_name("c");
    let mut bridge = Bridge::start(&config(&cluster, &ns, &requests, SinkKind::Kafka));
    bridge.wait_synced(1).await;
    let topic = format!("k8s.{cluster}.core.configmaps");
    let mut reader = Reader::kafka(&[topic]).await;
    let (status, out, err) = snapshot_cli(&bridge, "v1/configmaps", &[]);
    assert!(status.success(), "{out}\n{err}");
    assert!(out.contains("snapshot requested:"), "{out}");
    assert!(out.contains("Complete sent 30"), "{out}");
    let events = reader
        .read_until(Duration::from_secs(60), |got| {
            got.iter().any(|e| e.event.ty() == END)
                && got
                    .iter()
                    .filter(|e| !e.ext("snapshotid").is_empty() && e.ext("origin") == "snapshot")
                    .count()
                    >= count
        })
        .await;
    let begin = events
        .iter()
        .find(|e| e.event.ty() == BEGIN)
        .expect("a begin marker");
    assert_eq!(
        begin.key.as_deref(),
        Some(begin.event.id()),
        "keyed by its own id, so that compaction keeps every marker"
    );
    assert!(
        begin.event.id().contains(&format!(":{cluster}.")),
        "{}",
        begin.event.id()
    );
    never_backwards(&events);
}

/// A bridge killed in the middle of a snapshot: the next start resumes it from the recorded
/// progress (no second begin marker once the first was recorded) and completes it.
#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_resumes_after_the_bridge_is_killed() {
    let count = 400;
    let (client, ns, requests) = objects("snapresume", count).await;
    let cluster = unique_name("c");
    let config = config(&cluster, &ns, &requests, SinkKind::Nats);
    let mut first = Bridge::start(&config);
    first.wait_synced(1).await;
    let (name, uid) = request(&client, &requests, &ns, 10).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &requests);
    wait_until(
        "the snapshot is under way",
        Duration::from_secs(120),
        || {
            let api = api.clone();
            let name = name.clone();
            async move {
                let cm = api.get(&name).await.ok()?;
                let status: serde_json::Value =
                    serde_json::from_str(cm.metadata.annotations?.get(STATUS)?).ok()?;
                (status["sent"].as_u64()? >= 20).then_some(())
            }
        },
    )
    .await;
    first.signal("KILL");
    first
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("killed");
    // It resumes from its checkpoint, and the walk from the request's progress.
    let second = Bridge::start(&config);
    let (phase, status) = ended(&client, &requests, &name).await;
    assert_eq!(phase, "Complete", "{status}");
    assert_eq!(status["expected"], count);
    assert!(
        second.log_text().contains("\"resumed\":true"),
        "the second bridge resumed the walk"
    );
    let mut reader = Reader::nats(&cluster).await;
    let events = reader
        .read_until(Duration::from_secs(60), |got| {
            got.iter().any(|e| e.event.ty() == END)
        })
        .await;
    let begins = events.iter().filter(|e| e.event.ty() == BEGIN).count();
    assert_eq!(begins, 1, "one begin marker");
    let sent: BTreeSet<String> = events
        .iter()
        .filter(|e| e.ext("snapshotid") == uid && e.ext("origin") == "snapshot")
        .map(|e| e.ext("name"))
        .collect();
    assert_eq!(sent.len(), count, "every object, none lost across the kill");
    never_backwards(&events);
}

/// Over HTTP: the markers and the snapshot's events are POSTed to the watch's URL, the markers
/// in structured mode whatever the sink's content mode, and every object is covered between them
/// while changes go on.
#[tokio::test(flavor = "multi_thread")]
async fn http_snapshot_posts_every_object_between_its_markers() {
    let count = 60;
    let (client, ns, requests) = objects("snaphttp", count).await;
    let cluster = unique_name("c");
    let mut bridge = Bridge::start(&config(&cluster, &ns, &requests, SinkKind::Http));
    bridge.wait_synced(1).await;
    let mut reader = Reader::for_sink(SinkKind::Http, &cluster, &[], &bridge).await;
    // The initial list's events first, so that what follows is the snapshot and the churn.
    reader
        .read_until(Duration::from_secs(60), |got| got.len() >= count)
        .await;
    // The receiver refuses each marker once: the walk sends it again, the snapshot completes.
    let receiver = crate::receiver::for_cluster(&cluster);
    receiver.script(|seen| {
        let marker = seen.id.ends_with(":begin") || seen.id.ends_with(":end");
        if marker && seen.attempt == 0 {
            Reply::Status(503)
        } else {
            Reply::Accept
        }
    });
    let Framed {
        events,
        uid,
        begin,
        end,
        ..
    } = during_churn(&client, &ns, &requests, &mut reader, count, 10).await;
    let refused = receiver
        .seen()
        .iter()
        .filter(|s| s.id.starts_with(&format!("{uid}:")) && s.attempt == 1)
        .count();
    assert_eq!(refused, 2, "both markers were sent again once");
    for marker in [&events[begin], &events[end]] {
        assert_eq!(marker.ext("snapshotid"), uid);
        assert_eq!(
            marker.headers.get("content-type").map(String::as_str),
            Some("application/cloudevents+json; charset=utf-8"),
            "a marker is structured: {:?}",
            marker.headers
        );
    }
    let covered: BTreeSet<String> = events[begin..end]
        .iter()
        .filter(|e| e.event.ty().starts_with("io.kubeeventbridge.object."))
        .map(|e| e.ext("name"))
        .collect();
    assert_eq!(covered.len(), count, "every object between the markers");
    let sent = events
        .iter()
        .filter(|e| e.ext("snapshotid") == uid && e.ext("origin") == "snapshot")
        .count();
    assert_eq!(events[end].data()["sent"], sent, "{}", summary(&events));
}

/// A request that cannot be served fails with a reason naming the data key, and `--wait`
/// reports it with a non-zero exit.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_that_cannot_be_served_fails_naming_why() {
    let (client, ns, requests) = objects("snapbad", 1).await;
    let cluster = unique_name("c");
    let mut bridge = Bridge::start(&config(&cluster, &ns, &requests, SinkKind::Stdout));
    bridge.wait_synced(1).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &requests);
    let refused = [
        (
            json!({"resource": "v1/configmaps", "chunkSize": "lots"}),
            "data.chunkSize: \"lots\"",
        ),
        (
            json!({"resource": "v1/configmaps", "namespace": ns, "prune": "true"}),
            "data.prune: the stdout sink keeps no keys",
        ),
    ];
    for (data, why) in refused {
        let bad = json!({
            "metadata": {"generateName": "snapshot-", "labels": {"kube-event-bridge.dev/snapshot-request": "true"}},
            "data": data,
        });
        let created = api
            .create(
                &PostParams::default(),
                &serde_json::from_value(bad).unwrap(),
            )
            .await
            .unwrap();
        let (phase, status) = ended(&client, &requests, &created.metadata.name.unwrap()).await;
        assert_eq!(phase, "Failed");
        let message = status["message"].as_str().unwrap();
        assert!(message.starts_with(why), "{status}");
    }
    let (status, _, err) = snapshot_cli(&bridge, "v1/secrets", &[]);
    assert!(!status.success());
    assert!(
        err.contains("--resource v1/secrets: no configured watch matches"),
        "{err}"
    );
}

/// Every record of `topic` from the beginning to its end (committed ones): key, and the value
/// (`None`: a tombstone), in each partition's order.
fn topic_records(topic: &str) -> Vec<(String, Option<Vec<u8>>)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Message, Offset, TopicPartitionList};
    let consumer: BaseConsumer = crate::support::kafka_config()
        .set("group.id", unique_name("prune-check"))
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let timeout = Duration::from_secs(10);
    let metadata = consumer.fetch_metadata(Some(topic), timeout).unwrap();
    let mut assigned = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for p in metadata.topics()[0].partitions() {
        assigned
            .add_partition_offset(topic, p.id(), Offset::Beginning)
            .unwrap();
        ends.insert(
            p.id(),
            consumer.fetch_watermarks(topic, p.id(), timeout).unwrap().1,
        );
    }
    consumer.assign(&assigned).unwrap();
    let mut records = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let done = |consumer: &BaseConsumer| {
        let at = consumer.position().unwrap();
        ends.iter().all(|(p, end)| {
            *end == 0
                || at
                    .find_partition(topic, *p)
                    .is_some_and(|e| matches!(e.offset(), Offset::Offset(o) if o >= *end))
        })
    };
    while !done(&consumer) {
        assert!(
            std::time::Instant::now() < deadline,
            "{topic} not read to its end"
        );
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            let m = m.unwrap();
            let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
            records.push((key, m.payload().map(<[u8]>::to_vec)));
        }
    }
    records
}

/// `prune: true` on a compacted topic keyed by `namespace/name`: keys the topic holds for
/// objects the cluster no longer has (written here as a bridge of an earlier life would have,
/// in binary and structured mode) get a tombstone after the snapshot's objects; keys of live
/// objects, of another resource sharing the topic and already tombstoned ones do not; the
/// counts agree in the CLI, the end marker and the metrics; a resource keyed by uid is refused.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_prune_tombstones_the_keys_the_cluster_no_longer_has() {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};

    let count = 5;
    let (_client, ns, requests) = objects("snapprune", count).await;
    let cluster = unique_name("c");
    let topic = format!("state.{cluster}.configmaps");
    crate::store_check::compacted_topic(&topic, 3).await;
    let config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}], topic: \"state.{{cluster}}.{{resource}}\", key: namespacedName, tombstones: true}}\nsnapshotRequests: {{namespace: {requests}}}\ncheckpoint: {{enabled: true{}}}\n{}",
        checkpoint_extra(SinkKind::Kafka, &cluster),
        sink_yaml(SinkKind::Kafka, &cluster)
    );
    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(1).await;

    // What an earlier life left in the topic.
    let producer: FutureProducer = crate::support::kafka_config().create().unwrap();
    let binary = |key: &str, resource: &str| {
        let attributes = [
            ("ce_specversion", "1.0"),
            ("ce_cluster", cluster.as_str()),
            ("ce_apiversion", "v1"),
            ("ce_resource", resource),
            ("ce_namespace", ns.as_str()),
            ("ce_uid", "0000-stale"),
        ];
        let headers = attributes.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
            h.insert(Header {
                key: k,
                value: Some(*v),
            })
        });
        (format!("{ns}/{key}"), Some(b"{}".to_vec()), Some(headers))
    };
    let structured = json!({"specversion": "1.0", "cluster": cluster, "apiversion": "v1",
        "resource": "configmaps", "namespace": ns, "uid": "0001-stale", "data": {}});
    let stale = [
        binary("gone-binary", "configmaps"),
        (
            format!("{ns}/gone-structured"),
            Some(structured.to_string().into_bytes()),
            None,
        ),
        binary("a-secret", "secrets"),
        binary("tombstoned", "configmaps"),
        (format!("{ns}/tombstoned"), None, None),
    ];
    for (key, value, headers) in &stale {
        let mut record = FutureRecord::<str, [u8]>::to(&topic).key(key);
        if let Some(value) = value {
            record = record.payload(value);
        }
        if let Some(headers) = headers {
            record = record.headers(headers.clone());
        }
        producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }

    let (status, out, err) = snapshot_cli(&bridge, "v1/configmaps", &["--prune"]);
    assert!(status.success(), "{out}\n{err}\n{}", bridge.log_text());
    assert!(out.contains("Complete sent 5"), "{out}");
    assert!(out.contains("pruned 2"), "{out}");

    let records = topic_records(&topic);
    let mut tombstones: BTreeMap<&str, usize> = BTreeMap::new();
    for (key, _) in records.iter().filter(|(_, value)| value.is_none()) {
        *tombstones.entry(key.as_str()).or_default() += 1;
    }
    let want: BTreeMap<String, usize> = [
        ("gone-binary", 1),
        ("gone-structured", 1),
        ("tombstoned", 1),
    ]
    .iter()
    .map(|(k, n)| (format!("{ns}/{k}"), *n))
    .collect();
    assert_eq!(
        tombstones,
        want.iter().map(|(k, n)| (k.as_str(), *n)).collect(),
        "the stale keys pruned once; the one already tombstoned has only the tombstone written here; live objects and another resource's key none"
    );
    let end = records
        .iter()
        .filter_map(|(_, v)| serde_json::from_slice::<serde_json::Value>(v.as_deref()?).ok())
        .find(|doc| doc["type"] == END)
        .expect("an end marker");
    assert_eq!(end["data"]["pruned"], 2, "{end}");
    assert_eq!(end["data"]["result"], "complete", "{end}");
    let (_, metrics) = get(&bridge.admin_address().await, "/metrics").await;
    let pruned = [("outcome", "pruned")];
    assert_eq!(
        sample(
            &metrics,
            "kube_event_bridge_snapshot_objects_total",
            &pruned
        ),
        2.0
    );

    // The topic now converges to the cluster: each key's last record is a tombstone exactly
    // for the objects the cluster does not have.
    let last: BTreeMap<&str, bool> = records
        .iter()
        .map(|(key, value)| (key.as_str(), value.is_none()))
        .collect();
    for key in want.keys() {
        assert_eq!(last.get(key.as_str()), Some(&true), "{key}");
    }
    assert_eq!(last.get(format!("{ns}/a-secret").as_str()), Some(&false));
    for i in 0..count {
        assert_eq!(last.get(format!("{ns}/cm-{i:04}").as_str()), Some(&false));
    }
}
