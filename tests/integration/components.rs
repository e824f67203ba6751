//! Proves each component of the test environment is real and usable from Rust: a watch on
//! the kube-apiserver sees a custom resource's lifecycle, Kafka round-trips a record with
//! headers through an idempotent producer, and NATS JetStream deduplicates by `Nats-Msg-Id`
//! and enforces KV revisions.

use std::time::Duration;

use async_nats::jetstream::{self, kv, message::PublishMessage};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchParams,
};
use kube::core::{ApiResource, GroupVersionKind, WatchEvent};
use rdkafka::Message;
use rdkafka::consumer::Consumer;
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::json;

use crate::support::{self, CRD_VERSION};

/// How long any single step against a component may take before the test fails.
const STEP: Duration = Duration::from_secs(30);

/// A resourceVersion as an integer: the apiserver on etcd uses the etcd revision.
fn rv(version: Option<&String>) -> u64 {
    let version = version.expect("object without resourceVersion");
    version
        .parse()
        .unwrap_or_else(|e| panic!("resourceVersion {version:?} is not an integer: {e}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn kube_watch_sees_custom_resource_added_modified_deleted_in_order() {
    let client = support::kube_client().await;
    let group = format!("{}.test.kube-event-bridge.dev", support::unique_name("g"));
    support::create_crd(&client, &group, "Widget", "widgets", "Namespaced").await;
    let namespace = support::unique_namespace(&client, "kube-watch").await;

    let gvk = GroupVersionKind::gvk(&group, CRD_VERSION, "Widget");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    let widgets = Api::<DynamicObject>::namespaced_with(client.clone(), &namespace, &resource);

    // Watch from the LIST's resourceVersion, so only changes made below are reported.
    let list = widgets
        .list(&ListParams::default())
        .await
        .expect("list widgets");
    assert!(
        list.items.is_empty(),
        "fresh namespace {namespace} has widgets"
    );
    let list_rv = list
        .metadata
        .resource_version
        .expect("list resourceVersion");
    let mut events = widgets
        .watch(&WatchParams::default().timeout(60), &list_rv)
        .await
        .expect("start watch")
        .boxed();

    let name = support::unique_name("widget");
    let created = widgets
        .create(
            &PostParams::default(),
            &DynamicObject::new(&name, &resource)
                .within(&namespace)
                .data(json!({ "spec": { "size": 1, "labels": ["a"] } })),
        )
        .await
        .expect("create widget");
    let patched = widgets
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "size": 2 } })),
        )
        .await
        .expect("patch widget");
    let deleted = widgets
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete widget");

    let created_rv = rv(created.metadata.resource_version.as_ref());
    let patched_rv = rv(patched.metadata.resource_version.as_ref());
    assert!(
        rv(Some(&list_rv)) < created_rv,
        "list {list_rv} vs create {created_rv}"
    );
    assert!(
        created_rv < patched_rv,
        "create {created_rv} vs patch {patched_rv}"
    );

    let mut seen = Vec::new();
    while seen.len() < 3 {
        let event = tokio::time::timeout(STEP, events.next())
            .await
            .unwrap_or_else(|_| panic!("no watch event within {STEP:?}; seen so far: {seen:?}"))
            .unwrap_or_else(|| panic!("watch ended early; seen so far: {seen:?}"))
            .expect("watch event");
        let (kind, object) = match event {
            WatchEvent::Added(o) => ("ADDED", o),
            WatchEvent::Modified(o) => ("MODIFIED", o),
            WatchEvent::Deleted(o) => ("DELETED", o),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(status) => panic!("watch error: {status:?}"),
        };
        assert_eq!(object.name_any(), name, "{kind} for an unexpected object");
        assert_eq!(object.namespace().as_deref(), Some(namespace.as_str()));
        seen.push((
            kind,
            rv(object.metadata.resource_version.as_ref()),
            object.data["spec"]["size"].clone(),
        ));
    }

    let kinds: Vec<&str> = seen.iter().map(|(kind, _, _)| *kind).collect();
    assert_eq!(kinds, ["ADDED", "MODIFIED", "DELETED"], "{seen:?}");
    let versions: Vec<u64> = seen.iter().map(|(_, version, _)| *version).collect();
    assert!(
        versions.windows(2).all(|w| w[0] < w[1]),
        "resourceVersions not increasing: {seen:?}"
    );
    assert_eq!(versions[0], created_rv, "ADDED resourceVersion vs create");
    assert_eq!(versions[1], patched_rv, "MODIFIED resourceVersion vs patch");
    assert_eq!(seen[0].2, json!(1));
    assert_eq!(seen[1].2, json!(2));
    // A custom resource without finalizers is gone at once: the apiserver answers DELETE with
    // a Status, not the object, so the DELETED resourceVersion has nothing to match against.
    deleted.either(
        |object| {
            assert_eq!(
                versions[2],
                rv(object.metadata.resource_version.as_ref()),
                "DELETED"
            )
        },
        |status| assert!(status.is_success(), "DELETE answered {status:?}"),
    );

    assert!(
        widgets.get_opt(&name).await.expect("get widget").is_none(),
        "widget still exists"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_idempotent_producer_round_trips_key_payload_and_headers() {
    let topic = support::unique_name("kafka-roundtrip");
    support::create_topic(&topic, 3).await;

    let producer: FutureProducer = support::kafka_config()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "30000")
        .create()
        .expect("create producer");

    let key = "default/widget-1";
    let payload = r#"{"kind":"Widget","metadata":{"name":"widget-1"}}"#;
    let headers: [(&str, &str); 5] = [
        ("ce_specversion", "1.0"),
        ("ce_id", "0b9c3f1e-7d2a-4f7e-9a51-3f7c2d1e8b60"),
        ("ce_type", "dev.kube-event-bridge.widget.added"),
        (
            "ce_source",
            "/apis/test.kube-event-bridge.dev/v1/namespaces/default/widgets",
        ),
        ("content-type", "application/json; charset=utf-8"),
    ];
    let owned_headers = headers
        .iter()
        .fold(OwnedHeaders::new(), |acc, (key, value)| {
            acc.insert(Header {
                key,
                value: Some(*value),
            })
        });

    let delivery = producer
        .send(
            FutureRecord::to(&topic)
                .key(key)
                .payload(payload)
                .headers(owned_headers),
            STEP,
        )
        .await
        .unwrap_or_else(|(e, _)| panic!("produce to {topic}: {e}"));

    let consumer = support::kafka_consumer(&support::unique_name("kafka-roundtrip"));
    consumer.subscribe(&[&topic]).expect("subscribe");
    let message = tokio::time::timeout(STEP, consumer.recv())
        .await
        .unwrap_or_else(|_| panic!("no record from {topic} within {STEP:?}"))
        .expect("consume")
        .detach();

    assert_eq!(message.topic(), topic);
    assert_eq!(
        (message.partition(), message.offset()),
        (delivery.partition, delivery.offset)
    );
    assert_eq!(message.key(), Some(key.as_bytes()));
    assert_eq!(message.payload(), Some(payload.as_bytes()));
    let received: Vec<(String, Option<Vec<u8>>)> = message
        .headers()
        .expect("record has headers")
        .iter()
        .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
        .collect();
    let expected: Vec<(String, Option<Vec<u8>>)> = headers
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Some(v.as_bytes().to_vec())))
        .collect();
    assert_eq!(received, expected);
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_jetstream_drops_duplicate_nats_msg_id() {
    let jetstream = jetstream::new(support::nats_client().await);
    let name = support::unique_name("keb-dedup");
    let subject = format!("keb.test.{name}");
    let mut stream = jetstream
        .create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .expect("create stream");

    let publish = |payload: &'static str| {
        PublishMessage::build()
            .payload(payload.into())
            .message_id("widget-1@42")
            .header("ce_type", "dev.kube-event-bridge.widget.added")
    };
    let first = jetstream
        .send_publish(subject.clone(), publish("first"))
        .await
        .expect("publish first")
        .await
        .expect("ack first");
    let second = jetstream
        .send_publish(subject.clone(), publish("second"))
        .await
        .expect("publish second")
        .await
        .expect("ack second");

    assert!(
        !first.duplicate,
        "first publish reported duplicate: {first:?}"
    );
    assert!(
        second.duplicate,
        "second publish with the same Nats-Msg-Id not a duplicate: {second:?}"
    );
    assert_eq!(
        second.sequence, first.sequence,
        "duplicate ack names the original sequence"
    );
    assert_eq!(stream.info().await.expect("stream info").state.messages, 1);

    let stored = stream
        .get_raw_message(first.sequence)
        .await
        .expect("get message");
    assert_eq!(stored.payload, "first");
    assert_eq!(
        stored.headers.get("Nats-Msg-Id").map(|v| v.as_str()),
        Some("widget-1@42")
    );
    assert_eq!(
        stored.headers.get("ce_type").map(|v| v.as_str()),
        Some("dev.kube-event-bridge.widget.added")
    );

    jetstream.delete_stream(&name).await.expect("delete stream");
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_kv_update_requires_the_current_revision() {
    let jetstream = jetstream::new(support::nats_client().await);
    let bucket = support::unique_name("keb-kv");
    let store = jetstream
        .create_key_value(kv::Config {
            bucket: bucket.clone(),
            history: 5,
            ..Default::default()
        })
        .await
        .expect("create KV bucket");

    let key = "checkpoint.widgets";
    let created = store
        .create(key, "rv-100".into())
        .await
        .expect("create key");
    let again = store.create(key, "rv-999".into()).await;
    assert!(
        again.is_err(),
        "create of an existing key succeeded: {again:?}"
    );

    let updated = store
        .update(key, "rv-200".into(), created)
        .await
        .expect("update with the current revision");
    assert!(updated > created, "revision {updated} after {created}");

    let stale = store.update(key, "rv-300".into(), created).await;
    match stale {
        Err(e) => assert_eq!(e.kind(), kv::UpdateErrorKind::WrongLastRevision, "{e}"),
        Ok(revision) => panic!("update with stale revision {created} succeeded as {revision}"),
    }

    assert_eq!(
        store.get(key).await.expect("get key").as_deref(),
        Some(&b"rv-200"[..])
    );
    let entry = store.entry(key).await.expect("entry").expect("key exists");
    assert_eq!(entry.revision, updated);

    jetstream
        .delete_key_value(&bucket)
        .await
        .expect("delete KV bucket");
}
