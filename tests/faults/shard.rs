//! A watch that cannot start under sharding: its Lease is released (another replica may try
//! it), readiness and the log name it, and it starts once its checkpoint store is back.

use std::time::Duration;

use cloudevents::AttributesReader;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::{Bridge, Reader, SinkKind, sink_yaml};
use crate::support::{kube_client, unique_name, unique_namespace, wait_until};
use crate::{EXCLUSIVE, Stopped};

const WAIT: Duration = Duration::from_secs(120);
const LEASE_SECS: u64 = 2;

/// Labels `ns` so that the configuration's `namespaceSelector` selects it.
async fn select(client: &kube::Client, ns: &str, label: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let patch = json!({"metadata": {"labels": {"keb-cannot-start": label}}});
    api.patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("label the namespace");
}

/// The holder written in the watch Lease of namespace `ns` (`Some("")` when it has none), or
/// `None` while there is no such Lease.
async fn watch_lease_holder(client: &kube::Client, lease_ns: &str, ns: &str) -> Option<String> {
    let api: Api<Lease> = Api::namespaced(client.clone(), lease_ns);
    let leases = api
        .list(&ListParams::default().labels("kube-event-bridge/shard-role=watch"))
        .await
        .ok()?;
    let lease = leases.items.into_iter().find(|l| {
        l.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kube-event-bridge/watch"))
            .is_some_and(|w| w.ends_with(&format!("/{ns}?labels=&fields=")))
    })?;
    Some(lease.spec?.holder_identity.unwrap_or_default())
}

/// `/readyz`: its status code and body.
async fn readyz(address: &str) -> (u16, String) {
    kube_event_bridge::tls::install_crypto_provider();
    let response = reqwest::get(format!("http://{address}/readyz"))
        .await
        .expect("GET /readyz");
    let code = response.status().as_u16();
    (code, response.text().await.unwrap_or_default())
}

/// NATS stopped: a namespace newly selected gives a watch whose checkpoint store cannot be
/// opened. The replica claims it, fails to start it, releases its Lease (so that another
/// replica could take it) and names it in `/readyz` and the log; once NATS is back and the
/// hold-off has passed, it claims the watch again and its changes arrive.
#[tokio::test(flavor = "multi_thread")]
async fn sharded_watch_that_cannot_start_releases_its_lease_and_starts_later() {
    let _guard = EXCLUSIVE.lock().await;
    let client = kube_client().await;
    let lease_ns = unique_namespace(&client, "cannot-start-leases").await;
    let label = unique_name("sel");
    let (running, stuck) = (
        unique_namespace(&client, "cannot-start-a").await,
        unique_namespace(&client, "cannot-start-b").await,
    );
    select(&client, &running, &label).await;
    let cluster = unique_name("c");
    let config = format!(
        "cluster: {cluster}\nsharding: {{enabled: true, namespace: {lease_ns}, leaseDurationSecs: {LEASE_SECS}, renewSecs: 1}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaceSelector: keb-cannot-start={label}}}\n{}",
        sink_yaml(SinkKind::Nats, &cluster)
    );
    let mut bridge = Bridge::start_with_env(&config, &[("POD_NAME", "only")]);
    bridge.wait_synced(1).await;
    let admin = bridge.admin_address().await;

    let nats = Stopped::new("nats");
    select(&client, &stuck, &label).await;
    bridge
        .wait_log("watch cannot start here: releasing its lease so that another replica may try it")
        .await;
    wait_until("the watch's lease is released", WAIT, || async {
        watch_lease_holder(&client, &lease_ns, &stuck)
            .await?
            .is_empty()
            .then_some(())
    })
    .await;
    let (code, body) = readyz(&admin).await;
    assert_eq!(code, 503, "not ready while a watch cannot start: {body}");
    assert!(
        body.contains("cannot_start") && body.contains(&stuck),
        "/readyz names the watch and why: {body}"
    );
    assert!(bridge.count_log("watch cannot start; retrying with backoff") >= 1);

    nats.start();
    wait_until("the watch is claimed again", WAIT, || async {
        (!watch_lease_holder(&client, &lease_ns, &stuck)
            .await?
            .is_empty())
        .then_some(())
    })
    .await;
    let mut reader = Reader::nats(&cluster).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &stuck);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "after"}})).expect("configmap");
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("create");
    let events = reader
        .read_until(WAIT, |got| {
            got.iter()
                .any(|r| r.event.subject().is_some_and(|s| s.ends_with("/after")))
        })
        .await;
    assert!(
        events
            .iter()
            .any(|r| r.event.subject().is_some_and(|s| s.ends_with("/after"))),
        "the watch runs once its store is back"
    );
    wait_until("ready again", WAIT, || async {
        (readyz(&admin).await.0 == 200).then_some(())
    })
    .await;
    kube_event_bridge::tls::install_crypto_provider();
    let handoffs = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .unwrap_or_default();
    assert!(
        handoffs.lines().any(|l| l
            .starts_with("kube_event_bridge_shard_handoffs_total{reason=\"cannot_start\"}")
            && !l.ends_with(" 0")),
        "the hand-off is counted: {handoffs}"
    );
}
