//! Nothing stalls silently: a broker that refuses one record inside a Kafka transaction, or every
//! record of a topic, never leaves a watch stuck while `/readyz` says ready. The bridge aborts
//! and re-sends what a voided transaction held, publishes an oversized event as a truncated
//! reference, and pauses (readiness, a metric and a log line naming the cause) while every
//! event is refused, resuming by itself once the cause is fixed.

use std::sync::Arc;
use std::time::Duration;

use cloudevents::AttributesReader;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use serde_json::json;

use crate::admin::get;
use crate::harness::{Bridge, Reader, SinkKind, sink_yaml, summary};
use crate::support::{
    self, create_topic, env, kube_client, unique_name, unique_namespace, wait_until,
};

const WAIT: Duration = Duration::from_secs(120);

fn cm(name: &str, data: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": data,
    }))
    .expect("configmap")
}

/// Creates `name` (3 partitions) with topic-level `configs`.
async fn create_topic_with(name: &str, configs: &[(&str, &str)]) {
    let admin: Arc<AdminClient<DefaultClientContext>> =
        Arc::new(support::kafka_config().create().expect("admin client"));
    let mut topic = NewTopic::new(name, 3, TopicReplication::Fixed(1));
    for (k, v) in configs {
        topic = topic.set(k, v);
    }
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin
        .create_topics([&topic], &options)
        .await
        .expect("create")
    {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, code)) => panic!("cannot create Kafka topic {t}: {code}"),
        }
    }
    // Waits for leaders the usual way (the topic exists now).
    create_topic(name, 3).await;
}

/// Runs Kafka's own ACL tool against the test broker.
pub(crate) fn kafka_acl(args: &[&str]) {
    let libs = std::env::var("KEB_KAFKA_LIBS").expect(
        "KEB_KAFKA_LIBS is not set: run the tests through scripts/test (scripts/testenv env)",
    );
    let out = std::process::Command::new("java")
        .arg("-cp")
        .arg(format!("{libs}/*"))
        .arg("org.apache.kafka.tools.AclCommand")
        .args(["--bootstrap-server", &env().kafka_bootstrap])
        .args(args)
        .output()
        .expect("run java (Kafka's AclCommand)");
    assert!(
        out.status.success(),
        "kafka acl {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The value of the first sample of `family` whose labels contain `labels`.
pub(crate) fn sample(metrics: &str, family: &str, labels: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(labels))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Waits until `/readyz` fails naming the watch of `v1/configmaps` stalled for `reason`, then
/// checks the gauge and the log line that say the same; returns the metrics document.
pub(crate) async fn wait_stalled(bridge: &Bridge, address: &str, reason: &str) -> String {
    let why = wait_until(&format!("/readyz names {reason}"), WAIT, || async {
        let (code, body) = get(address, "/readyz").await;
        (code == 503 && body.contains(reason)).then_some(body)
    })
    .await;
    assert!(why.contains("v1/configmaps"), "{why}");
    let metrics = get(address, "/metrics").await.1;
    let gauge = format!("reason=\"{reason}\"");
    assert_eq!(
        sample(&metrics, "kube_event_bridge_watch_stalled", &gauge),
        Some(1.0),
        "{metrics}"
    );
    bridge
        .wait_log("watch stalled: cannot publish; retrying until the cause is fixed")
        .await;
    metrics
}

/// Waits until the stall is over: `/readyz` answers 200 and the log says so.
pub(crate) async fn wait_recovered(bridge: &Bridge, address: &str) {
    wait_until("/readyz answers 200 again", WAIT, || async {
        (get(address, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    bridge.wait_log("publishing again").await;
}

/// The topic refuses records over 100 kB while the client allows 1 MB, so the refusal comes
/// from the broker, inside the open transaction: it voids the transaction. The bridge aborts
/// it, sends its events again with the big one as a truncated reference, and keeps going; a
/// restart then replays nothing (the checkpoint moved past the big object).
#[tokio::test(flavor = "multi_thread")]
async fn kafka_broker_refusing_a_record_inside_a_transaction_does_not_stall_the_watch() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "txbig").await;
    let cluster = unique_name("c");
    let topic = format!("k8s.{cluster}.core.configmaps");
    create_topic_with(&topic, &[("max.message.bytes", "100000")]).await;
    // A long linger keeps the records behind the big one queued when its refusal comes back.
    let config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}    properties: {{linger.ms: \"100\"}}\ncheckpoint: {{intervalMs: 200}}\n",
        sink_yaml(SinkKind::Kafka, &cluster)
    );
    let mut bridge = Bridge::start(&config);
    let address = bridge.admin_address().await;
    let mut reader = Reader::kafka(std::slice::from_ref(&topic)).await;
    bridge.wait_synced(1).await;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    cms.create(&pp, &cm("before", json!({"v": "1"})))
        .await
        .unwrap();
    let big = cms
        .create(&pp, &cm("big", json!({"blob": "x".repeat(200_000)})))
        .await
        .unwrap();
    // Objects created at once behind the big one are still queued when its refusal voids the
    // transaction: librdkafka neither sends nor times them out until the transaction aborts.
    let behind = (0..20).map(|i| {
        let cms = cms.clone();
        async move {
            cms.create(
                &PostParams::default(),
                &cm(&format!("behind-{i}"), json!({})),
            )
            .await
        }
    });
    for created in futures::future::join_all(behind).await {
        created.unwrap();
    }
    cms.create(&pp, &cm("after", json!({}))).await.unwrap();
    cms.patch(
        "before",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "2"}})),
    )
    .await
    .unwrap();

    let expected = [
        ("before", "added"),
        ("big", "added"),
        ("after", "added"),
        ("before", "modified"),
    ];
    let events = reader
        .read_until(WAIT, |got| {
            expected
                .iter()
                .all(|(n, c)| got.iter().any(|r| r.ext("name") == *n && r.change() == *c))
                && (0..20).all(|i| got.iter().any(|r| r.ext("name") == format!("behind-{i}")))
        })
        .await;
    let log = bridge.log_text();
    let truncated: Vec<_> = events.iter().filter(|r| r.ext("name") == "big").collect();
    assert!(
        truncated
            .iter()
            .all(|r| r.ext("truncated") == "true" && r.ext("payload") == "reference"),
        "the big object arrives as a truncated reference only\n{}\nlog:\n{log}",
        summary(&events)
    );
    assert!(
        events
            .iter()
            .filter(|r| r.ext("name") != "big")
            .all(|r| r.ext("truncated").is_empty() && r.ext("payload") == "full"),
        "only the big object is cut to a reference, not the others of its batch\n{}\nlog:\n{log}",
        summary(&events)
    );
    let uid = big.metadata.uid.clone().unwrap();
    let rv = big.metadata.resource_version.clone().unwrap();
    assert_eq!(truncated[0].event.id(), format!("{uid}:{rv}:added"));
    assert!(
        log.contains("a delivery failed inside the kafka transaction: aborting it and sending its events again"),
        "{log}"
    );
    let metrics = get(&address, "/metrics").await.1;
    assert!(
        sample(&metrics, "kube_event_bridge_transactions_aborted_total", "").unwrap_or(0.0) >= 1.0,
        "{metrics}"
    );
    assert_eq!(get(&address, "/readyz").await.0, 200, "{log}");

    // Later changes keep flowing.
    cms.create(&pp, &cm("later", json!({}))).await.unwrap();
    reader
        .read_until(WAIT, |got| got.iter().any(|r| r.ext("name") == "later"))
        .await;

    // A restart resumes after all of it: only the new object arrives.
    bridge.signal("TERM");
    assert!(
        bridge
            .wait_exit(Duration::from_secs(30))
            .await
            .is_some_and(|s| s.success()),
        "{}",
        bridge.log_text()
    );
    let again = Bridge::start(&config);
    again.wait_log("resuming from checkpoint").await;
    cms.create(&pp, &cm("after-restart", json!({})))
        .await
        .unwrap();
    let replayed = reader
        .read_until(WAIT, |got| {
            got.iter().any(|r| r.ext("name") == "after-restart")
        })
        .await;
    let names: Vec<String> = replayed.iter().map(|r| r.ext("name")).collect();
    assert_eq!(
        names,
        ["after-restart"],
        "nothing replayed after a restart\nlog:\n{}",
        again.log_text()
    );
}

/// Every record of the topic is refused (an ACL denies writing it): nothing is skipped and the
/// watch does not spin; `/readyz`, a metric and a log line name the cause, and once the ACL is
/// gone the watch publishes what waited, by itself.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_refusal_of_every_event_pauses_the_watch_until_fixed() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "denied").await;
    let cluster = unique_name("c");
    let topic = format!("k8s.{cluster}.core.configmaps");
    create_topic(&topic, 3).await;
    let deny = [
        "--deny-principal",
        "User:ANONYMOUS",
        "--operation",
        "Write",
        "--topic",
        topic.as_str(),
    ];
    kafka_acl(&[&["--add"][..], &deny].concat());
    let config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}",
        sink_yaml(SinkKind::Kafka, &cluster)
    );
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    cms.create(&PostParams::default(), &cm("waiting", json!({})))
        .await
        .unwrap();
    let bridge = Bridge::start(&config);
    let address = bridge.admin_address().await;

    let metrics = wait_stalled(&bridge, &address, "not_authorized").await;
    assert!(
        sample(
            &metrics,
            "kube_event_bridge_publish_failures_total",
            "reason=\"not_authorized\""
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{metrics}"
    );
    // Paused, not spinning: attempts back off (at most a few per second at first, then slower).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let attempts = bridge.count_log("the broker refuses every event of this destination, retrying")
        + bridge.count_log(
            "a delivery failed inside the kafka transaction: aborting it and sending its events again",
        );
    assert!(
        attempts < 40,
        "{attempts} attempts: spinning\n{}",
        bridge.log_text()
    );

    kafka_acl(&[&["--remove", "--force"][..], &deny].concat());
    let mut reader = Reader::kafka(std::slice::from_ref(&topic)).await;
    let events = reader
        .read_until(WAIT, |got| got.iter().any(|r| r.ext("name") == "waiting"))
        .await;
    assert_eq!(events.len(), 1, "{}", summary(&events));
    wait_recovered(&bridge, &address).await;
    let metrics = get(&address, "/metrics").await.1;
    assert_eq!(
        sample(
            &metrics,
            "kube_event_bridge_watch_stalled",
            "reason=\"not_authorized\""
        ),
        Some(0.0),
        "{metrics}"
    );
}

/// The JetStream stream disappears under a running bridge: every publish fails (no stream
/// captures the subject). The bridge keeps the event and retries with backoff; after
/// `STALL_AFTER` (30 s) of failures `/readyz`, a metric and a log line say the watch is stalled,
/// and once the stream is back the event arrives and readiness returns, by itself.
#[tokio::test(flavor = "multi_thread")]
async fn nats_publishing_that_keeps_failing_stalls_visibly_then_resumes() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "nostream").await;
    let cluster = unique_name("c");
    let config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}",
        sink_yaml(SinkKind::Nats, &cluster)
    );
    let mut bridge = Bridge::start(&config);
    let address = bridge.admin_address().await;
    bridge.wait_synced(1).await;
    let js = async_nats::jetstream::new(support::nats_client().await);
    let name = crate::harness::stream_name(&cluster);
    let stream_config = js
        .get_stream(&name)
        .await
        .expect("the bridge created its stream")
        .info()
        .await
        .expect("stream info")
        .config
        .clone();
    js.delete_stream(&name).await.expect("delete the stream");

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    cms.create(&PostParams::default(), &cm("stranded", json!({})))
        .await
        .unwrap();
    wait_stalled(&bridge, &address, "publish_failing").await;

    js.create_stream(stream_config)
        .await
        .expect("recreate the stream");
    let mut reader = Reader::nats(&cluster).await;
    let events = reader
        .read_until(WAIT, |got| got.iter().any(|r| r.ext("name") == "stranded"))
        .await;
    assert_eq!(events.len(), 1, "{}", summary(&events));
    wait_recovered(&bridge, &address).await;
}
