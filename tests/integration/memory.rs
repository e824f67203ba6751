//! Memory follows the configuration, not the objects: a namespace of large Secrets (about
//! 900 kB each, near the API server's limit) is listed and published by a bridge whose peak
//! resident memory stays under the Helm chart's memory limit, because LIST pages are sized by
//! bytes and `delivery.maxQueueBytes` bounds what is held between the API server and the broker;
//! and, spread over many namespaces (one watch each, every watch's share within its own budget),
//! because `delivery.maxTotalQueueBytes` bounds what every watch holds together.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};

use crate::harness::{Bridge, Reader, SinkKind, sink_yaml};
use crate::support::{kube_client, unique_name, unique_namespace};

/// Secrets created, and the size of each one's value.
const SECRETS: usize = 300;
const SECRET_BYTES: usize = 900_000;

/// The chart's `resources.limits.memory`, in bytes (a `Mi` quantity).
fn chart_memory_limit() -> u64 {
    let values = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/helm/kube-event-bridge/values.yaml"
    ))
    .expect("read the chart's values");
    let limits = values
        .split("limits:")
        .nth(1)
        .expect("resources.limits in the chart's values");
    let mi: u64 = limits
        .lines()
        .find_map(|l| l.trim().strip_prefix("memory:"))
        .and_then(|m| m.trim().strip_suffix("Mi"))
        .and_then(|m| m.parse().ok())
        .expect("resources.limits.memory in Mi");
    mi << 20
}

/// Creates `count` Secrets of [`SECRET_BYTES`] in `ns`.
async fn create_secrets(client: &kube::Client, ns: &str, count: usize) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let value = ByteString(vec![b's'; SECRET_BYTES]);
    for i in 0..count {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("s{i:04}")),
                ..Default::default()
            },
            data: Some([("blob".to_string(), value.clone())].into()),
            ..Default::default()
        };
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap_or_else(|e| panic!("create secret {i} in {ns}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_list_of_large_secrets_stays_under_the_charts_memory_limit() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "bigsecrets").await;
    create_secrets(&client, &ns, SECRETS).await;
    let cluster = unique_name("c");
    let config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: secrets, namespaces: [{ns}]}}\n{}",
        sink_yaml(SinkKind::Kafka, &cluster)
    );
    let topic = format!("k8s.{cluster}.core.secrets");
    let mut bridge = Bridge::start(&config);
    let mut reader = Reader::kafka(std::slice::from_ref(&topic)).await;
    bridge.wait_synced(1).await;
    let events = reader
        .read_until(std::time::Duration::from_secs(120), |got| {
            got.len() >= SECRETS
        })
        .await;
    assert_eq!(events.len(), SECRETS);
    let peak = bridge.peak_rss();
    let limit = chart_memory_limit();
    eprintln!(
        "{SECRETS} Secrets of {SECRET_BYTES} bytes ({} MiB) listed and published with a peak RSS of {} MiB (chart limit {} MiB)",
        (SECRETS * SECRET_BYTES) >> 20,
        peak >> 20,
        limit >> 20
    );
    assert!(
        peak < limit,
        "peak resident memory {} MiB exceeds the chart's limit of {} MiB\nlog:\n{}",
        peak >> 20,
        limit >> 20,
        bridge.log_text()
    );
}

/// Namespaces the same Secrets are spread over in the next test: ten Secrets (9 MB) each, well
/// within one watch's own `maxQueueBytes`, so only the process's budget bounds them together.
const SPREAD_OVER: usize = 30;

/// The process's budget in the next test: a few Secrets' worth, so the watches must take turns.
const TOTAL_BUDGET: usize = 8 << 20;

/// Thirty watches list their large Secrets at once, each within its own budget: the process's
/// budget holds them to a few Secrets in flight together. Every Secret arrives (the watches
/// waiting for each other's acknowledgements, and for the commits of the Kafka transaction they
/// share, never deadlock), the wait shows in the metrics, and the peak stays under the chart's
/// limit; without the process's budget every watch held its whole namespace at once.
#[tokio::test(flavor = "multi_thread")]
async fn many_watches_of_large_secrets_stay_within_the_process_budget() {
    let client = kube_client().await;
    let per_ns = SECRETS / SPREAD_OVER;
    let mut namespaces = Vec::new();
    for _ in 0..SPREAD_OVER {
        let ns = unique_namespace(&client, "spreadsecrets").await;
        create_secrets(&client, &ns, per_ns).await;
        namespaces.push(ns);
    }
    let cluster = unique_name("c");
    let config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: secrets, namespaces: [{}]}}\n\
         delivery: {{maxTotalQueueBytes: {TOTAL_BUDGET}}}\n{}",
        namespaces.join(", "),
        sink_yaml(SinkKind::Kafka, &cluster)
    );
    let topic = format!("k8s.{cluster}.core.secrets");
    let mut bridge = Bridge::start(&config);
    let mut reader = Reader::kafka(std::slice::from_ref(&topic)).await;
    bridge.wait_synced(SPREAD_OVER).await;
    let events = reader
        .read_until(std::time::Duration::from_secs(180), |got| {
            got.len() >= SECRETS
        })
        .await;
    assert_eq!(events.len(), SECRETS, "{}", bridge.log_text());
    let address = bridge.admin_address().await;
    let (_, body) = crate::admin::get(&address, "/metrics").await;
    let sample = |name: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{body}"))
    };
    let waited = sample("kube_event_bridge_queue_total_wait_seconds_total");
    assert!(
        waited > 0.0,
        "thirty watches of 9 MB each within 8 MiB together must have waited for each other"
    );
    assert_eq!(
        sample("kube_event_bridge_queue_total_limit_bytes"),
        TOTAL_BUDGET as f64
    );
    let peak = bridge.peak_rss();
    let limit = chart_memory_limit();
    eprintln!(
        "{SECRETS} Secrets of {SECRET_BYTES} bytes over {SPREAD_OVER} watches: peak RSS {} MiB, \
         {waited:.1} s waited for the process's budget (chart limit {} MiB)",
        peak >> 20,
        limit >> 20
    );
    assert!(
        peak < limit,
        "peak resident memory {} MiB exceeds the chart's limit of {} MiB",
        peak >> 20,
        limit >> 20
    );
}
