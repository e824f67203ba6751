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
use kube_event_bridge::payload::{Pointer, digest};
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

fn resource(extra: &str) -> Arc<ResourceInfo> {
    let config = ConfigFile::parse(&format!(
        "cluster: dev\nresources: [{{apiVersion: v1, resource: configmaps{extra}}}]\n"
    ))
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
    Arc::new(ResourceInfo::new(
        "dev",
        &resolved,
        "https://127.0.0.1:6443",
    ))
}

fn change(object: &DynamicObject) -> Change {
    Change {
        kind: ChangeKind::Modified,
        origin: Origin::Live,
        object: object.clone(),
        observed: SystemTime::now(),
    }
}

fn bench(c: &mut Criterion) {
    let info = resource("");
    let template = object();
    c.bench_function("encode_configmap_1kib", |b| {
        b.iter_batched(
            || Change {
                kind: ChangeKind::Modified,
                origin: Origin::Live,
                object: template.clone(),
                observed: SystemTime::now(),
            },
            |change| black_box(encode(&info, change, None).unwrap()),
            criterion::BatchSize::SmallInput,
        )
    });
    let event = encode(&info, change(&template), None).unwrap().event;
    c.bench_function("structured_json", |b| {
        b.iter(|| black_box(event.to_structured_json()))
    });
    c.bench_function("nats_binary_message", |b| {
        b.iter(|| black_box(message(&event, ContentMode::Binary, true)))
    });
    let reference = resource(", payload: reference");
    c.bench_function("encode_reference", |b| {
        b.iter_batched(
            || change(&template),
            |change| black_box(encode(&reference, change, None).unwrap()),
            criterion::BatchSize::SmallInput,
        )
    });
    let diff = resource(", payload: diff");
    let previous = encode(&diff, change(&template), None)
        .unwrap()
        .object
        .unwrap();
    let mut edited = template.clone();
    edited.data["data"]["a"] = serde_json::json!("z".repeat(512));
    c.bench_function("encode_diff", |b| {
        b.iter_batched(
            || change(&edited),
            |change| black_box(encode(&diff, change, Some(&previous)).unwrap()),
            criterion::BatchSize::SmallInput,
        )
    });
    let ignore = vec![Pointer::parse("/status").unwrap()];
    let mut scratch = Vec::new();
    let mut object = template.clone();
    c.bench_function("content_digest", |b| {
        b.iter(|| black_box(digest(&mut object, &ignore, &mut scratch)))
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
