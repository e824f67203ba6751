//! The admin endpoints against a running bridge: liveness, readiness after sync, and every
//! documented metric present, parseable, and moving when events flow.

use std::time::{Duration, Instant};

use cloudevents::AttributesReader;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::harness::{Bridge, Reader};
use crate::support::{kube_client, unique_namespace, wait_until};

pub use crate::harness::{get, try_get};

/// The documented metric families (docs/metrics.md).
pub const METRICS: &[&str] = &[
    "kube_event_bridge_build_info",
    "kube_event_bridge_ready",
    "kube_event_bridge_leader",
    "kube_event_bridge_cluster_publishing",
    "kube_event_bridge_api_requests_total",
    "kube_event_bridge_api_requests_throttled_total",
    "kube_event_bridge_api_throttle_wait_seconds_total",
    "kube_event_bridge_events_observed_total",
    "kube_event_bridge_events_published_total",
    "kube_event_bridge_events_filtered_total",
    "kube_event_bridge_events_suppressed_total",
    "kube_event_bridge_events_truncated_total",
    "kube_event_bridge_events_repaired_total",
    "kube_event_bridge_trace_context_invalid_total",
    "kube_event_bridge_publish_failures_total",
    "kube_event_bridge_publish_latency_seconds",
    "kube_event_bridge_queue_depth_events",
    "kube_event_bridge_watch_restarts_total",
    "kube_event_bridge_relists_total",
    "kube_event_bridge_lists_completed_total",
    "kube_event_bridge_watch_requests_spared_total",
    "kube_event_bridge_initial_list_fallbacks_total",
    "kube_event_bridge_snapshots_total",
    "kube_event_bridge_snapshot_objects_total",
    "kube_event_bridge_snapshots_running",
    "kube_event_bridge_checkpoints_total",
    "kube_event_bridge_checkpoints_corrupt_total",
    "kube_event_bridge_checkpoint_age_seconds",
    "kube_event_bridge_checkpoint_lag_resource_versions",
];

/// Documented families only a bridge committing Kafka transactions has samples of
/// (`transactions::kafka_watches_share_one_producer_and_each_change_arrives_once_across_sigkills`).
pub const TRANSACTION_METRICS: &[&str] = &["kube_event_bridge_visible_latency_seconds"];

/// Documented families with samples only in some states: under sharding
/// (`sharded_dynamic::sharded_replicas_follow_crds_and_labelled_namespaces` reads the first), or
/// while a watch is stalled (`stalls`).
pub const CONDITIONAL_METRICS: &[&str] = &[
    "kube_event_bridge_cluster_members",
    "kube_event_bridge_cluster_secrets_refused_total",
    "kube_event_bridge_shard_watches_owned",
    "kube_event_bridge_shard_watch_unowned_before_seconds",
    "kube_event_bridge_watch_stalled",
];

/// The sum of the samples of `name` with `labels` in a scrape.
pub fn sample(body: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
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
    // Readiness follows the watch's sync; the log line is written just after: wait on /readyz.
    wait_until("/readyz answers 200", Duration::from_secs(60), || async {
        (get(&address, "/readyz").await == (200, "ok\n".into())).then_some(())
    })
    .await;
    assert_eq!(get(&address, "/nope").await.0, 404);

    let (_, before) = get(&address, "/metrics").await;
    for name in METRICS {
        // Without `Accept: application/openmetrics-text`, the Prometheus text format: a
        // counter's `# TYPE` names it as its samples do, with `_total`.
        assert!(
            before.contains(&format!("# TYPE {name} "))
                && before.lines().any(|l| l.starts_with(name)),
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
    // One scrape reads the counters one after the other while the watch moves them: wait until
    // a single scrape shows every value asserted below.
    let expected = [
        ("events_published_total{change=added}", 5.0),
        ("events_observed_total{change=added}", 5.0),
        ("events_observed_total{change=deleted}", 1.0),
        ("events_filtered_total", 1.0),
        ("publish_latency_seconds_count", 5.0),
    ];
    let counts = |body: &str| {
        [
            sample(
                body,
                "kube_event_bridge_events_published_total",
                &[labels[0], labels[1], ("change", "added")],
            ),
            sample(
                body,
                "kube_event_bridge_events_observed_total",
                &[labels[0], labels[1], ("change", "added")],
            ),
            sample(
                body,
                "kube_event_bridge_events_observed_total",
                &[labels[0], labels[1], ("change", "deleted")],
            ),
            // The delete is filtered out (events: [added]), so no reader sees it.
            sample(body, "kube_event_bridge_events_filtered_total", &labels),
            sample(
                body,
                "kube_event_bridge_publish_latency_seconds_count",
                &labels,
            ),
        ]
    };
    let want = expected.map(|(_, v)| v);
    let body = wait_until(
        &format!("one scrape shows {expected:?}"),
        Duration::from_secs(30),
        || async {
            let (_, body) = get(&address, "/metrics").await;
            (counts(&body) == want).then_some(body)
        },
    )
    .await;
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
    // Long enough for a create and its publish on a loaded machine; what the test checks is the
    // order of events in the bridge's own log, not the test's clock.
    const DELAY: Duration = Duration::from_secs(15);
    const STOPPING: &str = "shutting down: stopping watches, draining in-flight events";
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

    // Taken before the signal: the bridge cannot have received it earlier.
    let signalled = Instant::now();
    bridge.signal("TERM");
    wait_until("/readyz answers 503", Duration::from_secs(60), || async {
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
    reader
        .read_until(Duration::from_secs(30), |got| {
            got.iter().any(|r| {
                r.event
                    .subject()
                    .is_some_and(|s| s.ends_with("created-while-unready"))
            })
        })
        .await;
    assert_eq!(
        bridge.count_log(STOPPING),
        0,
        "the event must be published during the delay, before the watches stop; log:\n{}",
        bridge.log_text()
    );

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

/// The process id of `bridge` (found by its config file's path on its command line).
fn bridge_pid(bridge: &Bridge) -> u32 {
    let config = bridge.dir().join("bridge.yaml").display().to_string();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&config))
        })
        .expect("the bridge's process")
}

/// Many idle connections and many slow-header (slowloris) connections, each kind well beyond
/// the admin server's cap (64) and together beyond the bridge's file-descriptor limit (lowered
/// to 256 for the test): `/readyz` and `/metrics` still answer, and changes are still
/// published.
#[tokio::test(flavor = "multi_thread")]
async fn idle_and_slow_connection_floods_stop_neither_probes_nor_publishing() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::net::TcpStream;

    const FLOOD: usize = 300;
    const FILES: u64 = 256;
    let client = kube_client().await;
    let ns = unique_namespace(&client, "flood").await;
    let config = format!(
        "cluster: dev\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink: {{stdout: {{}}}}\n"
    );
    let mut bridge = Bridge::start(&config);
    let address = bridge.admin_address().await;
    bridge.wait_synced(1).await;
    let mut reader = Reader::stdout(&bridge);
    let pid = bridge_pid(&bridge);
    let open_files = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    assert!(
        (open_files as u64) < FILES / 2,
        "the bridge already has {open_files} files open"
    );
    let limited = std::process::Command::new("prlimit")
        .args([format!("--pid={pid}"), format!("--nofile={FILES}:{FILES}")])
        .status()
        .expect("prlimit (util-linux) runs");
    assert!(limited.success(), "prlimit failed");

    let connect = || async {
        tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(&address))
            .await
            .ok()?
            .ok()
    };
    let mut idle = Vec::new();
    let mut slow = Vec::new();
    for _ in 0..FLOOD {
        idle.extend(connect().await);
        if let Some(mut s) = connect().await
            && s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                .await
                .is_ok()
        {
            slow.push(s);
        }
    }
    eprintln!(
        "flood: {} idle and {} slow connections open",
        idle.len(),
        slow.len()
    );
    // Slowloris: one more header line a second on every slow connection, for at most 2 minutes.
    let stop = Arc::new(AtomicBool::new(false));
    let dribble = tokio::spawn({
        let stop = stop.clone();
        async move {
            for _ in 0..120 {
                if stop.load(Ordering::Relaxed) || slow.is_empty() {
                    break;
                }
                let mut alive = Vec::new();
                for mut s in slow.drain(..) {
                    let line = s.write_all(b"X-Slow: 1\r\n");
                    if let Ok(Ok(())) = tokio::time::timeout(Duration::from_millis(100), line).await
                    {
                        alive.push(s);
                    }
                }
                slow = alive;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    });

    wait_until(
        "/readyz answers 200 during the flood",
        Duration::from_secs(60),
        || async { matches!(try_get(&address, "/readyz").await, Ok((200, _))).then_some(()) },
    )
    .await;
    let metrics = wait_until(
        "/metrics answers during the flood",
        Duration::from_secs(60),
        || async {
            match try_get(&address, "/metrics").await {
                Ok((200, body)) => Some(body),
                _ => None,
            }
        },
    )
    .await;
    assert_eq!(sample(&metrics, "kube_event_bridge_ready", &[]), 1.0);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "during-the-flood"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    reader
        .read_until(Duration::from_secs(60), |got| {
            got.iter().any(|r| {
                r.event
                    .subject()
                    .is_some_and(|s| s.ends_with("during-the-flood"))
            })
        })
        .await;
    assert!(
        bridge.wait_exit(Duration::from_millis(10)).await.is_none(),
        "the bridge must keep running; log:\n{}",
        bridge.log_text()
    );
    stop.store(true, Ordering::Relaxed);
    dribble.await.unwrap();
    drop(idle);
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
    let parsed: serde_json::Value = serde_saphyr::from_str(&rules).expect("rules are YAML");
    assert!(
        parsed["groups"][0]["rules"]
            .as_array()
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
                    METRICS.contains(&family.as_str())
                        || TRANSACTION_METRICS.contains(&family.as_str())
                        || CONDITIONAL_METRICS.contains(&family.as_str()),
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

/// The text log carries no colour codes when it is not a terminal (a file, a pipe: what a log
/// collector or `scripts/demo`'s log file gets).
#[tokio::test(flavor = "multi_thread")]
async fn text_logs_to_a_file_carry_no_colour_codes() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "nocolour").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bridge.yaml");
    std::fs::write(
        &config,
        format!(
            "cluster: {}\nadmin: {{address: \"127.0.0.1:0\"}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink:\n  stdout: {{}}\n",
            crate::support::unique_name("c")
        ),
    )
    .unwrap();
    let log = dir.path().join("bridge.log");
    let mut child = std::process::Command::new(crate::harness::bin())
        .args(["--log-format", "text", "run", "--config"])
        .arg(&config)
        .env("KUBECONFIG", &crate::support::env().kubeconfig)
        .env_remove("NO_COLOR")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start the bridge");
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until(
        "the bridge published its initial state",
        Duration::from_secs(60),
        || {
            let t = text();
            async move { t.contains("initial state published").then_some(()) }
        },
    )
    .await;
    child.kill().unwrap();
    child.wait().unwrap();
    let text = text();
    assert!(text.lines().count() >= 3, "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in a log file:\n{text}"
    );
}
