//! Streaming lists (`kubernetes.initialList`) against real API servers: the default one serves
//! them (its `WatchList` gate is on), an extra one started with `WatchList=false` refuses them.
//! `auto` streams where it can and lists in pages where it cannot (saying so once per
//! resource), `stream` fails readiness where it cannot, `list` lists in pages; every way
//! publishes every object exactly once, and a relist after lost history streams and repairs.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::admin::sample;
use crate::harness::{Bridge, Reader, Received, get, set_file_checkpoints_rv, summary};
use crate::support::{ExtraCluster, kube_client, unique_namespace, wait_until};

const WAIT: Duration = Duration::from_secs(90);

/// The refusal of a streaming list by an API server whose `WatchList` gate is off, as the
/// bridge logs it.
const FALLBACK: &str = "the API server refuses streaming lists: listing this resource in pages instead (kubernetes.initialList: auto)";

/// Creates ConfigMaps `prefix-0` .. `prefix-{n-1}` in `ns` of `client`, labelled `listed: yes`.
async fn create(client: &kube::Client, ns: &str, prefix: &str, n: usize) -> Vec<String> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let mut names = Vec::new();
    for i in 0..n {
        let name = format!("{prefix}-{i}");
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"listed": "yes"}},
            "data": {"v": "0"},
        }))
        .unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
        names.push(name);
    }
    names
}

/// Reads the bridge's events until `n` have arrived, then what follows within two quiet seconds.
async fn read(bridge: &Bridge, n: usize) -> Vec<Received> {
    let mut reader = Reader::stdout(bridge);
    let mut events = reader.read_until(WAIT, |got| got.len() >= n).await;
    events.extend(reader.drain(Duration::from_secs(2)).await);
    events
}

/// Asserts that `events` are exactly one `added` event of `origin` per name of `names`.
fn assert_once_each(events: &[Received], names: &[String], origin: &str) {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for e in events {
        assert_eq!(
            (e.change(), e.ext("origin").as_str()),
            ("added", origin),
            "{}",
            summary(events)
        );
        *seen.entry(e.ext("name")).or_default() += 1;
    }
    let want: BTreeMap<String, usize> = names.iter().map(|n| (n.clone(), 1)).collect();
    assert_eq!(
        seen,
        want,
        "every object exactly once:\n{}",
        summary(events)
    );
}

/// The `/metrics` document once the bridge is ready.
async fn metrics_when_ready(bridge: &Bridge) -> String {
    let address = bridge.admin_address().await;
    wait_until("/readyz answers 200", WAIT, || async {
        (get(&address, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    get(&address, "/metrics").await.1
}

/// Lists completed by `method` in a scrape, over every watch.
fn lists(metrics: &str, method: &str) -> f64 {
    sample(
        metrics,
        "kube_event_bridge_lists_completed_total",
        &[("method", method)],
    )
}

/// How many `listed` log lines name `method`.
fn listed_lines(bridge: &Bridge, method: &str) -> usize {
    let needle = format!("\"method\":\"{method}\"");
    bridge
        .log_text()
        .lines()
        .filter(|l| l.contains("\"message\":\"listed\"") && l.contains(&needle))
        .count()
}

/// On an API server that serves streaming lists, `auto` (the default) lists by a stream, `list`
/// in pages, side by side: each publishes every selected object exactly once, as a snapshot,
/// then live changes; neither falls back.
#[tokio::test(flavor = "multi_thread")]
async fn auto_streams_where_the_api_server_serves_streams_and_list_lists_in_pages() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "stream-auto").await;
    let mut names = create(&client, &ns, "cm", 40).await;
    // Not selected: the label selector holds for streams.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let other: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "other"}})).unwrap();
    cms.create(&PostParams::default(), &other).await.unwrap();

    for (setting, method, not) in [("", "stream", "list"), ("list", "list", "stream")] {
        let kubernetes = if setting.is_empty() {
            String::new()
        } else {
            format!("kubernetes: {{initialList: {setting}}}\n")
        };
        let config = format!(
            "cluster: dev\n{kubernetes}resources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}], labelSelector: listed=yes}}\nsink: {{stdout: {{}}}}\n"
        );
        let bridge = Bridge::start(&config);
        let events = read(&bridge, names.len()).await;
        assert_once_each(&events, &names, "snapshot");
        let metrics = metrics_when_ready(&bridge).await;
        assert_eq!(lists(&metrics, method), 1.0, "{setting:?}: {metrics}");
        assert_eq!(lists(&metrics, not), 0.0, "{setting:?}: {metrics}");
        let fallbacks = sample(
            &metrics,
            "kube_event_bridge_initial_list_fallbacks_total",
            &[],
        );
        assert_eq!(fallbacks, 0.0, "{setting:?}: {metrics}");
        assert_eq!(listed_lines(&bridge, method), 1, "{}", bridge.log_text());
        assert_eq!(bridge.count_log(FALLBACK), 0, "{}", bridge.log_text());

        // The stream's connection goes on as the live watch.
        let live = format!("live-{method}");
        names.extend(create(&client, &ns, &live, 1).await);
        let mut reader = Reader::stdout(&bridge);
        let events = reader
            .read_until(WAIT, |got| {
                got.iter().any(|e| e.ext("name") == format!("{live}-0"))
            })
            .await;
        let last = events.last().unwrap();
        assert_eq!(
            (last.change(), last.ext("origin").as_str()),
            ("added", "live"),
            "{}",
            summary(&events)
        );
    }
}

/// A relist after lost history (the checkpoint is ahead of the API server, as after an etcd
/// restore: the same relist as after 410 Gone) is a streaming list too, and repairs exactly
/// what changed while the bridge was down.
#[tokio::test(flavor = "multi_thread")]
async fn a_relist_after_lost_history_streams_and_repairs() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "stream-relist").await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "cluster: dev\nkubernetes: {{initialList: stream}}\ncheckpoint: {{directory: {}, intervalMs: 100}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink: {{stdout: {{}}}}\n",
        dir.path().display()
    );
    let names = create(&client, &ns, "kept", 20).await;
    let mut first = Bridge::start(&config);
    assert_once_each(&read(&first, names.len()).await, &names, "snapshot");
    first.wait_synced(1).await;
    first.signal("TERM");
    first.wait_exit(WAIT).await.expect("the bridge exits");

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let changed = cms
        .patch(
            "kept-3",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": "1"}})),
        )
        .await
        .unwrap();
    cms.delete("kept-5", &Default::default()).await.unwrap();
    let added = create(&client, &ns, "added", 1).await;
    assert_eq!(set_file_checkpoints_rv(dir.path(), "90000000000"), 1);

    let second = Bridge::start(&config);
    let events = read(&second, 3).await;
    let mut got: Vec<(String, String, String)> = events
        .iter()
        .map(|e| (e.ext("name"), e.change().to_string(), e.ext("origin")))
        .collect();
    got.sort();
    let repaired =
        |name: &str, change: &str| (name.to_string(), change.to_string(), "repaired".to_string());
    assert_eq!(
        got,
        [
            repaired(&added[0], "added"),
            repaired("kept-3", "modified"),
            repaired("kept-5", "deleted"),
        ],
        "{}",
        summary(&events)
    );
    let modified = events.iter().find(|e| e.ext("name") == "kept-3").unwrap();
    assert_eq!(
        Some(modified.ext("resourceversion")),
        changed.metadata.resource_version
    );
    let metrics = metrics_when_ready(&second).await;
    assert_eq!(lists(&metrics, "stream"), 1.0, "{metrics}");
    assert_eq!(lists(&metrics, "list"), 0.0, "{metrics}");
    let gone = [("reason", "gone")];
    assert_eq!(
        sample(&metrics, "kube_event_bridge_relists_total", &gone),
        1.0,
        "{metrics}"
    );
}

/// Watches of one resource resuming together from a resourceVersion the API server has lost
/// share what the first of them finds out: one watch is answered 410 Gone, the others relist
/// without asking (their watch requests, queued behind the client-side throttle, are withdrawn
/// before they are sent), and one probe answers for them all. Every watch still repairs exactly
/// what changed while the bridge was down.
#[tokio::test(flavor = "multi_thread")]
async fn watches_resuming_together_from_lost_history_ask_once() {
    const WATCHES: usize = 6;
    // An API server of its own, whose watch cache starts at etcd's current revision: history
    // from resourceVersion 1 is gone however fresh the environment (the shared API server's cache,
    // started on an empty etcd, keeps it until its window moves on).
    let cluster = ExtraCluster::add("shared-gone").await;
    let client = cluster.client().await;
    let mut namespaces = Vec::new();
    let mut names = Vec::new();
    for i in 0..WATCHES {
        let ns = unique_namespace(&client, "shared-gone").await;
        names.extend(create(&client, &ns, &format!("w{i}"), 2).await);
        namespaces.push(ns);
    }
    let dir = tempfile::tempdir().unwrap();
    // A slow throttle: the watch requests queue behind it, as a thousand watches' do behind the
    // default one.
    let config = format!(
        "cluster: dev\nkubernetes: {{kubeconfig: {}, initialList: stream, qps: 2, burst: 1}}\ncheckpoint: {{directory: {}, intervalMs: 100}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{}]}}\nsink: {{stdout: {{}}}}\n",
        cluster.kubeconfig.display(),
        dir.path().display(),
        namespaces.join(", ")
    );
    let mut first = Bridge::start(&config);
    assert_once_each(&read(&first, names.len()).await, &names, "snapshot");
    first.wait_synced(WATCHES).await;
    first.signal("TERM");
    first.wait_exit(WAIT).await.expect("the bridge exits");

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &namespaces[2]);
    let changed = cms
        .patch(
            "w2-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": "1"}})),
        )
        .await
        .unwrap();
    // Every checkpoint from resourceVersion 1, which the new API server's watch cache never had.
    assert_eq!(set_file_checkpoints_rv(dir.path(), "1"), WATCHES);

    let second = Bridge::start(&config);
    let events = read(&second, 1).await;
    let got: Vec<(String, String, String)> = events
        .iter()
        .map(|e| (e.ext("name"), e.change().to_string(), e.ext("origin")))
        .collect();
    assert_eq!(
        got,
        [(
            "w2-1".to_string(),
            "modified".to_string(),
            "repaired".to_string()
        )],
        "{}",
        summary(&events)
    );
    assert_eq!(
        Some(events[0].ext("resourceversion")),
        changed.metadata.resource_version
    );
    let address = second.admin_address().await;
    let metrics = wait_until("every watch relisted", WAIT, || async {
        let metrics = get(&address, "/metrics").await.1;
        let gone = sample(
            &metrics,
            "kube_event_bridge_relists_total",
            &[("reason", "gone")],
        );
        (gone == WATCHES as f64 && lists(&metrics, "stream") == WATCHES as f64).then_some(metrics)
    })
    .await;
    let spared = |reason: &str| {
        sample(
            &metrics,
            "kube_event_bridge_watch_requests_spared_total",
            &[("reason", reason)],
        )
    };
    // All but the first watch, give or take one whose request was sent before the first answer.
    assert!(spared("gone") >= (WATCHES - 2) as f64, "{metrics}");
    assert!(spared("probe") >= (WATCHES - 2) as f64, "{metrics}");
    assert_eq!(
        sample(
            &metrics,
            "kube_event_bridge_watch_restarts_total",
            &[("reason", "gone")]
        ),
        WATCHES as f64,
        "{metrics}"
    );
}

/// On an API server with the `WatchList` gate off, `auto` lists in pages: the refusal is
/// logged once for the resource (two watches of it, one per namespace), counted, and every
/// object of both namespaces arrives exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn auto_falls_back_to_pages_once_where_streaming_lists_are_refused() {
    let cluster = ExtraCluster::add_with_gates("wl-off", Some("WatchList=false")).await;
    let client = cluster.client().await;
    let (a, b) = (
        unique_namespace(&client, "fallback-a").await,
        unique_namespace(&client, "fallback-b").await,
    );
    let mut names = create(&client, &a, "a", 15).await;
    names.extend(create(&client, &b, "b", 15).await);
    let config = format!(
        "cluster: dev\nkubernetes: {{kubeconfig: {}}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{a}, {b}]}}\nsink: {{stdout: {{}}}}\n",
        cluster.kubeconfig.display()
    );
    let bridge = Bridge::start(&config);
    assert_once_each(&read(&bridge, names.len()).await, &names, "snapshot");
    let metrics = metrics_when_ready(&bridge).await;
    assert_eq!(lists(&metrics, "list"), 2.0, "{metrics}");
    assert_eq!(lists(&metrics, "stream"), 0.0, "{metrics}");
    let fallbacks = sample(
        &metrics,
        "kube_event_bridge_initial_list_fallbacks_total",
        &[],
    );
    // Both watches may ask before either heard the answer; at least one asked.
    assert!((1.0..=2.0).contains(&fallbacks), "{metrics}");
    assert_eq!(bridge.count_log(FALLBACK), 1, "{}", bridge.log_text());
    let warning = bridge
        .log_text()
        .lines()
        .find(|l| l.contains(FALLBACK))
        .map(str::to_string)
        .unwrap();
    assert!(warning.contains("v1/configmaps"), "{warning}");
    assert!(warning.contains("WatchList feature gate"), "{warning}");
    let restarts = sample(
        &metrics,
        "kube_event_bridge_watch_restarts_total",
        &[("reason", "stream_refused")],
    );
    assert_eq!(restarts, 0.0, "a fallback is no failure: {metrics}");
}

/// On an API server with the `WatchList` gate off, `stream` does not fall back: the watch keeps
/// failing, and after 30 s `/readyz` fails naming the cause.
#[tokio::test(flavor = "multi_thread")]
async fn stream_fails_readiness_where_streaming_lists_are_refused() {
    let cluster = ExtraCluster::add_with_gates("wl-off-stream", Some("WatchList=false")).await;
    let client = cluster.client().await;
    let ns = unique_namespace(&client, "refused").await;
    create(&client, &ns, "cm", 3).await;
    let config = format!(
        "cluster: dev\nkubernetes: {{kubeconfig: {}, initialList: stream}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink: {{stdout: {{}}}}\n",
        cluster.kubeconfig.display()
    );
    let bridge = Bridge::start(&config);
    let address = bridge.admin_address().await;
    let why = wait_until("/readyz names the refusal", WAIT, || async {
        let (code, body) = get(&address, "/readyz").await;
        (code == 503 && body.contains("watch_failing")).then_some(body)
    })
    .await;
    assert!(why.contains("v1/configmaps"), "{why}");
    assert!(why.contains("stream_refused"), "{why}");
    assert!(why.contains("WatchList feature gate"), "{why}");
    let metrics = get(&address, "/metrics").await.1;
    let restarts = sample(
        &metrics,
        "kube_event_bridge_watch_restarts_total",
        &[("reason", "stream_refused")],
    );
    assert!(restarts >= 2.0, "{metrics}");
    assert_eq!(lists(&metrics, "list"), 0.0, "no fallback: {metrics}");
    let fallbacks = sample(
        &metrics,
        "kube_event_bridge_initial_list_fallbacks_total",
        &[],
    );
    assert_eq!(fallbacks, 0.0, "{metrics}");
    assert!(
        Reader::stdout(&bridge)
            .drain(Duration::from_secs(1))
            .await
            .is_empty()
    );
}
