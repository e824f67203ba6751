//! Encoding cost per event: a realistic ConfigMap-sized object through `encode` and the Kafka and
//! NATS wire forms.

use std::hint::black_box;
use std::sync::Arc;
use std::time::SystemTime;

use criterion::{Criterion, criterion_main};
use kube::api::DynamicObject;
use kube::discovery::ApiResource;
use kube_event_bridge::change::{Change, ChangeKind, Origin};
use kube_event_bridge::config::{ConfigFile, ContentMode};
use kube_event_bridge::discovery::ResolvedResource;
use kube_event_bridge::encode::{ResourceInfo, encode};
use kube_event_bridge::sink::nats::message;

fn object() -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": "web-config", "namespace": "team-a", "uid": "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
            "resourceVersion": "123456789", "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": "web", "tier": "frontend"},
            "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:data": {"f:a": {}, "f:b": {}}}}]
        },
        "data": {"a": "x".repeat(512), "b": "y".repeat(512)}
    }))
    .unwrap()
}

fn info() -> Arc<ResourceInfo> {
    let config =
        ConfigFile::parse("cluster: dev\nresources: [{apiVersion: v1, resource: configmaps}]\n")
            .unwrap()
            .validate()
            .unwrap();
    let resolved = ResolvedResource {
        config: config.resources[0].clone(),
        api: ApiResource {
            group: String::new(),
            version: "v1".into(),
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
        },
        namespaced: true,
    };
    Arc::new(ResourceInfo::new("dev", &resolved))
}

fn bench(c: &mut Criterion) {
    let info = info();
    let template = object();
    c.bench_function("encode_configmap_1kib", |b| {
        b.iter_batched(
            || Change {
                kind: ChangeKind::Modified,
                origin: Origin::Live,
                object: template.clone(),
                observed: SystemTime::now(),
            },
            |change| black_box(encode(&info, change).unwrap()),
            criterion::BatchSize::SmallInput,
        )
    });
    let event = encode(
        &info,
        Change {
            kind: ChangeKind::Modified,
            origin: Origin::Live,
            object: template.clone(),
            observed: SystemTime::now(),
        },
    )
    .unwrap();
    c.bench_function("structured_json", |b| {
        b.iter(|| black_box(event.to_structured_json()))
    });
    c.bench_function("nats_binary_message", |b| {
        b.iter(|| black_box(message(&event, ContentMode::Binary, true)))
    });
    let raw = serde_json::to_vec(&template).unwrap();
    c.bench_function("parse_watch_object", |b| {
        b.iter(|| black_box(serde_json::from_slice::<DynamicObject>(&raw).unwrap()))
    });
}

#[allow(missing_docs)]
mod group {
    criterion::criterion_group!(benches, super::bench);
}
use group::benches;
criterion_main!(benches);
