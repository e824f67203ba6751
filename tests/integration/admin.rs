//! The admin endpoints against a running bridge: liveness, readiness after sync, and every
//! documented metric present, parseable, and moving when events flow.

use std::time::{Duration, Instant};

use cloudevents::AttributesReader;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::{Bridge, Reader};
use crate::support::{kube_client, unique_namespace, wait_until};

/// GET `path` from `address`: (status code, body).
pub async fn get(address: &str, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect to admin server");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    let code = text
        .split_whitespace()
        .nth(1)
        .unwrap_or("0")
        .parse()
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// The documented metric families (docs/metrics.md).
pub const METRICS: &[&str] = &[
    "kube_event_bridge_build_info",
    "kube_event_bridge_ready",
    "kube_event_bridge_leader",
    "kube_event_bridge_api_requests_total",
    "kube_event_bridge_api_requests_throttled_total",
    "kube_event_bridge_api_throttle_wait_seconds_total",
    "kube_event_bridge_events_observed_total",
    "kube_event_bridge_events_published_total",
    "kube_event_bridge_events_filtered_total",
    "kube_event_bridge_events_suppressed_total",
    "kube_event_bridge_events_truncated_total",
    "kube_event_bridge_events_repaired_total",
    "kube_event_bridge_publish_failures_total",
    "kube_event_bridge_publish_latency_seconds",
    "kube_event_bridge_queue_depth_events",
    "kube_event_bridge_watch_restarts_total",
    "kube_event_bridge_relists_total",
    "kube_event_bridge_checkpoints_total",
    "kube_event_bridge_checkpoints_corrupt_total",
    "kube_event_bridge_checkpoint_age_seconds",
    "kube_event_bridge_checkpoint_lag_resource_versions",
];

fn sample(body: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape =
        prometheus_parse::Scrape::parse(lines).expect("metrics parse as Prometheus text format");
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_endpoints_and_metrics() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "admin").await;
    let config = format!(
        "cluster: dev\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}], events: [added]}}\nsink: {{stdout: {{}}}}\n"
    );
    let mut bridge = Bridge::start(&config);
    let address = bridge.admin_address().await;
    assert_eq!(get(&address, "/livez").await.0, 200);
    bridge.wait_synced(1).await;
    assert_eq!(get(&address, "/readyz").await, (200, "ok\n".into()));
    assert_eq!(get(&address, "/nope").await.0, 404);

    let (_, before) = get(&address, "/metrics").await;
    for name in METRICS {
        assert!(
            before.contains(&format!("# TYPE {name} ")),
            "{name} missing from:\n{before}"
        );
    }
    let labels = [("resource", "v1/configmaps"), ("namespace", ns.as_str())];
    assert_eq!(sample(&before, "kube_event_bridge_ready", &[]), 1.0);
    assert_eq!(
        sample(
            &before,
            "kube_event_bridge_relists_total",
            &[("reason", "initial")]
        ),
        1.0
    );

    let mut reader = Reader::stdout(&bridge);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for i in 0..5 {
        let c: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("m{i}")}})).unwrap();
        cms.create(&PostParams::default(), &c).await.unwrap();
    }
    cms.delete("m0", &Default::default()).await.unwrap();
    reader
        .read_until(Duration::from_secs(30), |got| got.len() == 5)
        .await;
    let body = wait_until(
        "metrics count the events",
        Duration::from_secs(10),
        || async {
            let (_, body) = get(&address, "/metrics").await;
            // The delete is filtered, so no reader sees it: wait for its count too.
            let published = sample(
                &body,
                "kube_event_bridge_events_published_total",
                &[("change", "added")],
            );
            let filtered = sample(&body, "kube_event_bridge_events_filtered_total", &[]);
            (published == 5.0 && filtered == 1.0).then_some(body)
        },
    )
    .await;
    assert_eq!(
        sample(
            &body,
            "kube_event_bridge_events_observed_total",
            &[labels[0], labels[1], ("change", "added")]
        ),
        5.0
    );
    assert_eq!(
        sample(
            &body,
            "kube_event_bridge_events_observed_total",
            &[("change", "deleted")]
        ),
        1.0
    );
    assert_eq!(
        sample(&body, "kube_event_bridge_events_filtered_total", &labels),
        1.0,
        "the delete is filtered out"
    );
    assert_eq!(
        sample(
            &body,
            "kube_event_bridge_publish_latency_seconds_count",
            &labels
        ),
        5.0
    );
    assert!(
        !body.contains("name=\"m1\""),
        "object names never become labels"
    );
    assert!(sample(&body, "kube_event_bridge_api_requests_total", &[]) >= 2.0);
}

/// After SIGTERM, `/readyz` answers 503 for `admin.shutdownDelaySecs` while the bridge still
/// publishes; then it drains and exits 0.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_turns_readiness_false_for_the_shutdown_delay_then_exits_0() {
    const DELAY: Duration = Duration::from_secs(5);
    let client = kube_client().await;
    let ns = unique_namespace(&client, "lame-duck").await;
    let config = format!(
        "cluster: dev\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink: {{stdout: {{}}}}\nadmin: {{address: \"127.0.0.1:0\", shutdownDelaySecs: {}}}\n",
        DELAY.as_secs()
    );
    let mut bridge = Bridge::start(&config);
    let address = bridge.admin_address().await;
    wait_until("/readyz answers 200", Duration::from_secs(60), || async {
        (get(&address, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    let mut reader = Reader::stdout(&bridge);

    bridge.signal("TERM");
    let signalled = Instant::now();
    wait_until("/readyz answers 503", DELAY, || async {
        (get(&address, "/readyz").await == (503, "not ready: shutting down\n".into())).then_some(())
    })
    .await;
    let (_, metrics) = get(&address, "/metrics").await;
    assert_eq!(sample(&metrics, "kube_event_bridge_ready", &[]), 0.0);

    // Unready, yet still watching and publishing.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let late: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "created-while-unready"}})).unwrap();
    cms.create(&PostParams::default(), &late).await.unwrap();
    assert!(
        signalled.elapsed() < DELAY,
        "the ConfigMap must be created within the delay; took {:?}",
        signalled.elapsed()
    );
    reader
        .read_until(Duration::from_secs(30), |got| {
            got.iter().any(|r| {
                r.event
                    .subject()
                    .is_some_and(|s| s.ends_with("created-while-unready"))
            })
        })
        .await;

    let status = bridge
        .wait_exit(Duration::from_secs(60))
        .await
        .expect("the bridge exits after the delay and the drain");
    assert!(
        status.success(),
        "exit status {status}; log:\n{}",
        bridge.log_text()
    );
    assert!(
        signalled.elapsed() >= DELAY,
        "exited {:?} after SIGTERM, before the {DELAY:?} delay",
        signalled.elapsed()
    );
    assert_eq!(
        bridge.count_log("shutdown delay: not ready, still publishing"),
        1
    );
    assert_eq!(bridge.count_log("shutdown complete"), 1);
}

/// `kubernetes.qps` and `kubernetes.burst` bound the rate at which requests start: at 2 per second
/// with a burst of 1, requests started by any moment are at most 1 + 2 per elapsed second, and
/// `/metrics` counts the requests held back.
#[tokio::test(flavor = "multi_thread")]
async fn api_requests_start_at_most_at_kubernetes_qps() {
    let client = kube_client().await;
    let mut namespaces = Vec::new();
    for _ in 0..3 {
        namespaces.push(unique_namespace(&client, "qps").await);
    }
    let config = format!(
        "cluster: dev\nkubernetes: {{qps: 2, burst: 1}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{}]}}\nsink: {{stdout: {{}}}}\n",
        namespaces.join(", ")
    );
    let started = Instant::now();
    let mut bridge = Bridge::start(&config);
    let address = bridge.admin_address().await;
    bridge.wait_synced(3).await;
    let (_, body) = get(&address, "/metrics").await;
    let elapsed = started.elapsed().as_secs_f64();
    let requests = sample(&body, "kube_event_bridge_api_requests_total", &[]);
    let throttled = sample(&body, "kube_event_bridge_api_requests_throttled_total", &[]);
    let waited = sample(
        &body,
        "kube_event_bridge_api_throttle_wait_seconds_total",
        &[],
    );
    // Discovery, then a LIST per watch: at least 4 requests, 3 of them held back.
    assert!(requests >= 4.0, "{requests} requests");
    assert!(
        requests <= 1.0 + 2.0 * elapsed,
        "{requests} requests started in {elapsed:.2}s"
    );
    assert!(throttled >= 3.0, "{throttled} throttled of {requests}");
    assert!(waited >= 1.0, "waited {waited}s for {throttled} requests");
}

/// The alert rules and the dashboard only use documented metrics.
#[test]
fn monitoring_examples_use_documented_metrics() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/monitoring");
    let rules = std::fs::read_to_string(root.join("prometheus-rules.yaml")).unwrap();
    let dashboard = std::fs::read_to_string(root.join("grafana-dashboard.json")).unwrap();
    let _: serde_json::Value = serde_json::from_str(&dashboard).expect("dashboard is JSON");
    let parsed: serde_yaml::Value = serde_yaml::from_str(&rules).expect("rules are YAML");
    assert!(
        parsed["groups"][0]["rules"]
            .as_sequence()
            .is_some_and(|r| r.len() >= 5)
    );
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"),
    )
    .unwrap();
    for text in [&rules, &dashboard] {
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if let Some(base) = word.strip_prefix("kube_event_bridge_") {
                let base = base.trim_end_matches("_bucket");
                let family = format!("kube_event_bridge_{base}");
                assert!(
                    METRICS.contains(&family.as_str()),
                    "{family} is not a documented metric"
                );
                assert!(
                    docs.contains(&family),
                    "{family} missing from docs/metrics.md"
                );
            }
        }
    }
}
