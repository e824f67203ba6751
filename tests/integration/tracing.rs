//! Trace context end to end: the bridge runs with its spans exported over OTLP to the test
//! environment's receiver (the OpenTelemetry Collector's own OTLP receiver,
//! `KEB_OTLP_ENDPOINT`), publishes to NATS JetStream, and sees a ConfigMap carrying a
//! `tracing.k8s.io/traceparent` annotation and one without. The annotated one's event continues
//! the annotation's trace (same trace id, the annotation's span as parent), the other starts a
//! new one; the receiver got each event's `read` span with the event's span id and that parent,
//! and its `publish` and `ack` spans as `read`'s children. An invalid annotation starts a new
//! trace and is counted (`kube_event_bridge_trace_context_invalid_total`).

use std::collections::BTreeMap;
use std::time::Duration;

use cloudevents::AttributesReader as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::admin::{get, sample};
use crate::harness::{Bridge, Reader, Received, SinkKind, sink_yaml};
use crate::support::{kube_client, unique_name, unique_namespace, wait_until};

const WAIT: Duration = Duration::from_secs(60);

/// The OTLP receiver's HTTP address and the file it writes what it receives to, from the
/// variables `scripts/testenv up` prints.
fn receiver() -> (String, String) {
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| panic!("{name} is not set: start the environment with scripts/testenv up, which runs the OTLP receiver"))
    };
    (var("KEB_OTLP_ENDPOINT"), var("KEB_OTLP_TRACES_FILE"))
}

/// One span as the receiver wrote it (OTLP/JSON: ids in hexadecimal).
#[derive(Debug, Clone)]
struct Span {
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    kind: Value,
    attributes: BTreeMap<String, String>,
}

/// Every span the receiver got from the service `service`.
fn spans_of(file: &str, service: &str) -> Vec<Span> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut out = Vec::new();
    for line in text.lines() {
        let doc: Value = serde_json::from_str(line).expect("the receiver writes OTLP/JSON lines");
        for rs in doc["resourceSpans"].as_array().into_iter().flatten() {
            if attributes(&rs["resource"]["attributes"]).get("service.name")
                != Some(&service.into())
            {
                continue;
            }
            for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                for s in ss["spans"].as_array().into_iter().flatten() {
                    let text = |k: &str| s[k].as_str().unwrap_or_default().to_string();
                    out.push(Span {
                        trace_id: text("traceId"),
                        span_id: text("spanId"),
                        parent_span_id: text("parentSpanId"),
                        name: text("name"),
                        kind: s["kind"].clone(),
                        attributes: attributes(&s["attributes"]),
                    });
                }
            }
        }
    }
    out
}

/// OTLP/JSON attributes as `key → string value`.
fn attributes(list: &Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for kv in list.as_array().into_iter().flatten() {
        let value = &kv["value"];
        let text = value["stringValue"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| value.to_string());
        out.insert(kv["key"].as_str().unwrap_or_default().to_string(), text);
    }
    out
}

/// `(version, trace id, span id, flags)` of a `traceparent`.
fn fields(traceparent: &str) -> (String, String, String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "traceparent {traceparent:?}");
    assert_eq!(traceparent.len(), 55, "traceparent {traceparent:?}");
    let f = |i: usize| parts[i].to_string();
    (f(0), f(1), f(2), f(3))
}

fn configmap(name: &str, annotations: Value) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "data": {"k": "v"}
    }))
    .unwrap()
}

/// The `added` event of ConfigMap `name`.
async fn added(reader: &mut Reader, name: &str) -> Received {
    let seen = |r: &Received| r.change() == "added" && r.ext("name") == name;
    let got = reader.read_until(WAIT, |got| got.iter().any(seen)).await;
    got.into_iter()
        .find(seen)
        .expect("the event read_until waited for")
}

/// Waits until the receiver has the `read`, `publish` and `ack` spans of trace `trace_id`.
async fn event_spans(file: &str, service: &str, trace_id: &str) -> BTreeMap<String, Span> {
    wait_until(
        &format!("the receiver has read, publish and ack of trace {trace_id}"),
        WAIT,
        || async {
            let spans: BTreeMap<String, Span> = spans_of(file, service)
                .into_iter()
                .filter(|s| s.trace_id == trace_id)
                .map(|s| (s.name.clone(), s))
                .collect();
            ["read", "publish", "ack"]
                .iter()
                .all(|n| spans.contains_key(*n))
                .then_some(spans)
        },
    )
    .await
}

#[tokio::test]
async fn events_continue_the_annotated_trace_and_the_receiver_gets_their_spans() {
    let (endpoint, file) = receiver();
    let client = kube_client().await;
    let ns = unique_namespace(&client, "trace").await;
    let cluster = unique_name("trace");
    // The receiver is shared: this bridge's spans are told apart by their service name.
    let service = unique_name("keb-trace");
    let config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}",
        sink_yaml(SinkKind::Nats, &cluster)
    );
    let mut bridge = Bridge::start_with_env(
        &config,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_SERVICE_NAME", &service),
            // Export within a fifth of a second instead of the default five.
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ],
    );
    let mut reader = Reader::nats(&cluster).await;
    bridge.wait_synced(1).await;
    bridge.wait_log("exporting spans over OTLP").await;

    let trace_id = format!("{:032x}", rand::random::<u128>() | 1);
    let parent_id = format!("{:016x}", rand::random::<u64>() | 1);
    let annotation = format!("00-{trace_id}-{parent_id}-01");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    let annotated = json!({
        "tracing.k8s.io/traceparent": annotation,
        "tracing.k8s.io/tracestate": "keb=test",
    });
    cms.create(&pp, &configmap("annotated", annotated))
        .await
        .unwrap();
    cms.create(&pp, &configmap("plain", json!({})))
        .await
        .unwrap();
    let invalid = json!({"tracing.k8s.io/traceparent": annotation.to_uppercase()});
    cms.create(&pp, &configmap("invalid", invalid))
        .await
        .unwrap();

    // The events: the annotated one continues the trace, the other starts its own.
    let a = added(&mut reader, "annotated").await;
    let (version, a_trace, a_span, a_flags) = fields(&a.ext("traceparent"));
    assert_eq!(version, "00");
    assert_eq!(a_trace, trace_id, "the annotation's trace");
    assert_ne!(a_span, parent_id, "a span of its own");
    assert_eq!(a_flags, "01", "sampled, as the caller was");
    assert_eq!(a.ext("tracestate"), "keb=test");
    assert_eq!(a.headers["ce-traceparent"], a.ext("traceparent"));
    let p = added(&mut reader, "plain").await;
    let (_, p_trace, p_span, p_flags) = fields(&p.ext("traceparent"));
    assert_ne!(p_trace, trace_id, "a new trace");
    assert_eq!(
        p_flags, "01",
        "recorded: the default sampler keeps new traces"
    );
    assert_eq!(
        p.ext("tracestate"),
        "",
        "no tracestate without an annotation"
    );
    let i = added(&mut reader, "invalid").await;
    let (_, i_trace, _, _) = fields(&i.ext("traceparent"));
    assert!(
        ![trace_id.as_str(), p_trace.as_str()].contains(&i_trace.as_str()),
        "a new trace"
    );
    let (_, metrics) = get(&bridge.admin_address().await, "/metrics").await;
    let labels = [("resource", "v1/configmaps"), ("namespace", ns.as_str())];
    let ignored = sample(
        &metrics,
        "kube_event_bridge_trace_context_invalid_total",
        &labels,
    );
    assert_eq!(ignored, 1.0, "{metrics}");

    // The spans: read is the event's span, parented on the annotation; publish and ack its
    // children.
    let spans = event_spans(&file, &service, &trace_id).await;
    let read = &spans["read"];
    assert_eq!(
        read.span_id, a_span,
        "the event's traceparent is the read span"
    );
    assert_eq!(
        read.parent_span_id, parent_id,
        "the annotation's span is the parent"
    );
    assert_eq!(read.attributes["cloudevents.event_id"], a.event.id());
    assert_eq!(
        read.attributes["cloudevents.event_subject"],
        format!("{ns}/annotated")
    );
    for child in ["publish", "ack"] {
        assert_eq!(
            spans[child].parent_span_id, a_span,
            "{child} is read's child"
        );
    }
    assert!(
        spans["publish"].kind == json!(4) || spans["publish"].kind == json!("SPAN_KIND_PRODUCER"),
        "publish is a producer span: {:?}",
        spans["publish"].kind
    );
    assert_eq!(spans["ack"].attributes["outcome"], "acked");
    let spans = event_spans(&file, &service, &p_trace).await;
    assert_eq!(spans["read"].span_id, p_span);
    assert_eq!(spans["read"].parent_span_id, "", "the root of a new trace");
}
