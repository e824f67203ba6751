//! A fleet end to end against several real API servers (issue 31): one bridge publishes every
//! cluster's changes, each tagged with its cluster; one cluster going away stalls only its own
//! watch while `/readyz` stays ready and names it; clusters discovered from Cluster API's
//! kubeconfig Secrets start, rotate and leave while the bridge runs, losing nothing; a Secret of
//! another shape is refused without harm; two entries of one cluster are refused naming both;
//! replicas share a fleet's watches (one cluster's watch is the unit) and take over a killed one's.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::{Bridge, Reader, Received, SinkKind, get, run_cli, sink_yaml, summary};
use crate::sharding::{group_leases, valid_holder};
use crate::support::{self, ExtraCluster, unique_name, wait_until};

/// The namespace watched in every cluster.
const WORK: &str = "work";
/// How long an expected event may take.
const WAIT: Duration = Duration::from_secs(90);

async fn create_namespace(client: &kube::Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
}

async fn create_cm(client: &kube::Client, name: &str) {
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": "0"}})).unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), WORK)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap_or_else(|e| panic!("create configmap {name}: {e}"));
}

/// A cluster of the test, with its namespace `work` created.
async fn cluster(prefix: &str) -> (ExtraCluster, kube::Client) {
    let c = ExtraCluster::add(prefix).await;
    let client = c.client().await;
    create_namespace(&client, WORK).await;
    (c, client)
}

/// Reads until an event of ConfigMap `name` arrives from `cluster`; panics with what came.
async fn expect_event(reader: &mut Reader, cluster: &str, name: &str) -> Received {
    let got = reader
        .read_until(WAIT, |got| got.iter().any(|e| is(e, cluster, name)))
        .await;
    got.iter()
        .find(|e| is(e, cluster, name))
        .cloned()
        .unwrap_or_else(|| panic!("no event of {cluster}/{name}; got:\n{}", summary(&got)))
}

fn is(e: &Received, cluster: &str, name: &str) -> bool {
    e.ext("cluster") == cluster && e.ext("name") == name
}

/// The configuration of the fleet `hub` over the clusters `a` and `b`: `extra` top-level
/// settings, ConfigMaps of `namespaces` (a YAML flow list's items) watched, `sink`.
fn two_clusters(
    hub: &str,
    (a, b): (&ExtraCluster, &ExtraCluster),
    extra: &str,
    namespaces: &str,
    sink: SinkKind,
) -> String {
    format!(
        "cluster: {hub}\nclusters:\n- {{name: {}, kubeconfig: {}}}\n- {{name: {}, kubeconfig: {}}}\n{extra}resources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{namespaces}]}}\n{}",
        a.name,
        a.kubeconfig.display(),
        b.name,
        b.kubeconfig.display(),
        sink_yaml(sink, hub)
    )
}

/// The `/readyz` answer once `pred` holds for it.
async fn readyz_until(bridge: &Bridge, what: &str, pred: impl Fn(u16, &str) -> bool) -> String {
    let address = bridge.admin_address().await;
    wait_until(what, WAIT, || {
        let address = address.clone();
        let pred = &pred;
        async move {
            let (status, body) = get(&address, "/readyz").await;
            pred(status, &body).then_some(body)
        }
    })
    .await
}

/// The value of the sample `line_start` (name and labels) in `/metrics`.
async fn metric(bridge: &Bridge, line_start: &str) -> Option<f64> {
    let (_, body) = get(&bridge.admin_address().await, "/metrics").await;
    body.lines()
        .find_map(|l| l.strip_prefix(line_start)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_publishes_every_cluster_and_one_cluster_down_stalls_only_itself() {
    let (a, a_client) = cluster("fa").await;
    let (b, b_client) = cluster("fb").await;
    let hub = unique_name("hub");
    let config = two_clusters(&hub, (&a, &b), "", WORK, SinkKind::Nats);
    create_cm(&a_client, "before").await;
    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(2).await;
    let mut reader = Reader::nats(&hub).await;
    let snapshot = expect_event(&mut reader, &a.name, "before").await;
    assert_eq!(snapshot.ext("origin"), "snapshot");
    create_cm(&b_client, "in-b").await;
    let in_b = expect_event(&mut reader, &b.name, "in-b").await;
    assert_ne!(
        snapshot.ext("clusterid"),
        in_b.ext("clusterid"),
        "two clusters, two identities"
    );
    assert!(
        in_b.destination.starts_with(&format!("k8s.{}.", b.name)),
        "{{cluster}} is the member's name: {}",
        in_b.destination
    );
    readyz_until(&bridge, "/readyz answers ok", |s, body| {
        s == 200 && body == "ok\n"
    })
    .await;

    b.stop().await;
    let body = readyz_until(
        &bridge,
        "/readyz names the cluster that went away",
        |s, body| s == 200 && body.contains(&format!("cluster {}: watch v1/configmaps", b.name)),
    )
    .await;
    assert!(body.starts_with("ok; not publishing:\n"), "{body}");
    let publishing = format!(
        "kube_event_bridge_cluster_publishing{{cluster=\"{}\"}}",
        b.name
    );
    assert_eq!(metric(&bridge, &publishing).await, Some(0.0));
    create_cm(&a_client, "while-b-down").await;
    expect_event(&mut reader, &a.name, "while-b-down").await;

    b.start().await;
    create_cm(&b_client, "b-back").await;
    expect_event(&mut reader, &b.name, "b-back").await;
    readyz_until(&bridge, "/readyz is ok again", |s, body| {
        s == 200 && body == "ok\n"
    })
    .await;
    assert_eq!(metric(&bridge, &publishing).await, Some(1.0));
    let log = bridge.log_text();
    let named = format!("\"cluster\":\"{}\"", b.name);
    assert!(
        log.lines()
            .any(|l| l.contains("\"level\":\"WARN\"") && l.contains(&named)),
        "no warning names the cluster {}:\n{log}",
        b.name
    );
    drop(bridge);
}

/// A cluster whose API server hangs (SIGSTOP: connections stay open and nothing is answered) is
/// not taken for a quiet one: its silent watch counts as dead after the client's read timeout,
/// the cluster is named by `/readyz` and its metric while the others publish, and it resumes
/// by itself once the API server answers again.
#[tokio::test(flavor = "multi_thread")]
async fn a_hung_cluster_is_named_and_resumes() {
    let (a, a_client) = cluster("ha").await;
    let (b, b_client) = cluster("hb").await;
    let hub = unique_name("hub");
    let config = two_clusters(&hub, (&a, &b), "", WORK, SinkKind::Nats);
    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(2).await;
    let mut reader = Reader::nats(&hub).await;
    b.signal("pause").await;
    // The read timeout, a failed reconnection, then the stall delay.
    let hung = Duration::from_secs(600);
    let address = bridge.admin_address().await;
    let body = wait_until("/readyz names the hung cluster", hung, || {
        let address = address.clone();
        let named = format!("cluster {}: watch v1/configmaps", b.name);
        async move {
            let (status, body) = get(&address, "/readyz").await;
            (status == 200 && body.contains(&named)).then_some(body)
        }
    })
    .await;
    assert!(body.starts_with("ok; not publishing:\n"), "{body}");
    let publishing = format!(
        "kube_event_bridge_cluster_publishing{{cluster=\"{}\"}}",
        b.name
    );
    assert_eq!(metric(&bridge, &publishing).await, Some(0.0));
    create_cm(&a_client, "while-b-hung").await;
    expect_event(&mut reader, &a.name, "while-b-hung").await;
    b.signal("resume").await;
    create_cm(&b_client, "b-answers").await;
    expect_event(&mut reader, &b.name, "b-answers").await;
    readyz_until(&bridge, "/readyz is ok again", |s, body| {
        s == 200 && body == "ok\n"
    })
    .await;
    drop(bridge);
}

fn kubeconfig_secret(name: &str, kubeconfig: &str) -> Secret {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "stringData": {"value": kubeconfig},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn clusters_of_secrets_join_rotate_and_leave_without_losing_events() {
    let hub_client = support::kube_client().await;
    let secrets_ns = support::unique_namespace(&hub_client, "fleet-secrets").await;
    let secrets: Api<Secret> = Api::namespaced(hub_client.clone(), &secrets_ns);
    let (a, a_client) = cluster("sa").await;
    let hub = unique_name("hub");
    let config = format!(
        "cluster: {hub}\nclusterSecrets: {{namespace: {secrets_ns}}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{WORK}]}}\n{}",
        sink_yaml(SinkKind::Nats, &hub)
    );
    let bridge = Bridge::start(&config);
    readyz_until(&bridge, "a fleet without clusters is ready", |s, _| {
        s == 200
    })
    .await;

    // A Secret of another shape is refused, named, counted; the bridge carries on.
    let pp = PostParams::default();
    let junk: Secret = serde_json::from_value(json!({
        "metadata": {"name": "junk-kubeconfig"}, "stringData": {"other": "x"}
    }))
    .unwrap();
    secrets.create(&pp, &junk).await.unwrap();
    wait_log_containing(&bridge, "no key \\\"value\\\" holding the kubeconfig").await;
    let refused = "kube_event_bridge_cluster_secrets_refused_total{reason=\"no_value\"}";
    assert_eq!(metric(&bridge, refused).await, Some(1.0));

    create_cm(&a_client, "existing").await;
    let secret_name = format!("{}-kubeconfig", a.name);
    secrets
        .create(&pp, &kubeconfig_secret(&secret_name, &a.kubeconfig_text))
        .await
        .unwrap();
    let mut reader = Reader::nats(&hub).await;
    expect_event(&mut reader, &a.name, "existing").await;

    // Rotation: the same cluster through a kubeconfig of other text. A change made while the
    // member restarts is published once it resumes from its checkpoint.
    let rotated = format!("{}\n# rotated\n", a.kubeconfig_text);
    secrets
        .patch(
            &secret_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"value": rotated}})),
        )
        .await
        .unwrap();
    create_cm(&a_client, "during-rotation").await;
    wait_log_containing(&bridge, "cluster kubeconfig rotated").await;
    create_cm(&a_client, "after-rotation").await;
    expect_event(&mut reader, &a.name, "during-rotation").await;
    expect_event(&mut reader, &a.name, "after-rotation").await;

    // Leaving stops the member cleanly; coming back resumes from its checkpoint.
    secrets
        .delete(&secret_name, &DeleteParams::default())
        .await
        .unwrap();
    wait_log_containing(&bridge, "cluster left the fleet").await;
    create_cm(&a_client, "while-away").await;
    let quiet = reader.drain(Duration::from_secs(5)).await;
    assert!(
        !quiet.iter().any(|e| is(e, &a.name, "while-away")),
        "a cluster that left still publishes: {}",
        summary(&quiet)
    );
    secrets
        .create(&pp, &kubeconfig_secret(&secret_name, &a.kubeconfig_text))
        .await
        .unwrap();
    let back = expect_event(&mut reader, &a.name, "while-away").await;
    assert_eq!(back.change(), "added");
    assert_ne!(
        back.ext("origin"),
        "snapshot",
        "resumed from its checkpoint, not snapshotted again"
    );
    // The whole stream: each ConfigMap added exactly once, through rotation and leaving.
    let all = Reader::nats(&hub)
        .await
        .read_until(WAIT, |got| got.iter().any(|e| is(e, &a.name, "while-away")))
        .await;
    for name in [
        "existing",
        "during-rotation",
        "after-rotation",
        "while-away",
    ] {
        let added = all
            .iter()
            .filter(|e| is(e, &a.name, name) && e.change() == "added")
            .count();
        assert_eq!(added, 1, "{name} added {added} times:\n{}", summary(&all));
    }
    drop(bridge);
}

/// Waits until a log line contains `needle` (as it appears in the JSON line).
async fn wait_log_containing(bridge: &Bridge, needle: &str) {
    wait_until(&format!("the log contains {needle:?}"), WAIT, || async {
        bridge.log_text().contains(needle).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_entries_of_one_cluster_are_refused_naming_both() {
    let (a, _client) = cluster("dup").await;
    let hub = unique_name("hub");
    let config = format!(
        "cluster: {hub}\nclusters:\n- {{name: first, kubeconfig: {k}}}\n- {{name: second, kubeconfig: {k}}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{WORK}]}}\n{}",
        sink_yaml(SinkKind::Nats, &hub),
        k = a.kubeconfig.display(),
    );
    let bridge = Bridge::start(&config);
    let body = readyz_until(&bridge, "/readyz names the refused entry", |s, body| {
        s == 200 && body.contains("the same cluster as")
    })
    .await;
    let named_both = body.contains("cluster second: refused: the same cluster as \"first\"")
        || body.contains("cluster first: refused: the same cluster as \"second\"");
    assert!(named_both, "{body}");
    drop(bridge);
}

/// Creates ConfigMap `name` in `namespace`.
async fn create_cm_in(client: &kube::Client, namespace: &str, name: &str) {
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap_or_else(|e| panic!("create configmap {namespace}/{name}: {e}"));
}

/// The replica holding each watch Lease validly, by Lease name.
async fn holders(hub: &kube::Client, lease_ns: &str, prefix: &str) -> Option<Vec<String>> {
    let members = group_leases(hub, lease_ns, prefix, "member").await?;
    let watches = group_leases(hub, lease_ns, prefix, "watch").await?;
    watches.iter().map(|l| valid_holder(l, &members)).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn replicas_share_the_watches_of_a_fleet_and_take_over_a_killed_one_s() {
    let hub_client = support::kube_client().await;
    let lease_ns = support::unique_namespace(&hub_client, "fleet-leases").await;
    let (a, a_client) = cluster("sha").await;
    let (b, b_client) = cluster("shb").await;
    for client in [&a_client, &b_client] {
        create_namespace(client, "other").await;
    }
    let hub = unique_name("hub");
    let prefix = unique_name("keb");
    let sharding = format!(
        "checkpoint: {{intervalMs: 200}}\nsharding: {{enabled: true, namespace: {lease_ns}, leasePrefix: {prefix}, leaseDurationSecs: 4, renewSecs: 1}}\n"
    );
    let watched = format!("{WORK}, other");
    let config = two_clusters(&hub, (&a, &b), &sharding, &watched, SinkKind::Nats);
    let one = Bridge::start_with_env(&config, &[("POD_NAME", "one")]);
    let mut two = Bridge::start_with_env(&config, &[("POD_NAME", "two")]);
    // Four watches (two clusters, two namespaces each), two each.
    wait_until("four watches held, two by each replica", WAIT, || async {
        let held = holders(&hub_client, &lease_ns, &prefix).await?;
        let by = |r: &str| held.iter().filter(|h| *h == r).count();
        (held.len() == 4 && by("one") == 2 && by("two") == 2).then_some(())
    })
    .await;
    status_lists_both_clusters(&one, [&a.name, &b.name]);
    let mut reader = Reader::nats(&hub).await;
    two.signal("KILL");
    two.wait_exit(Duration::from_secs(10)).await;
    wait_until("the survivor holds all four watches", WAIT, || async {
        let held = holders(&hub_client, &lease_ns, &prefix).await?;
        (held.len() == 4 && held.iter().all(|h| h == "one")).then_some(())
    })
    .await;
    let scopes = [
        (&a, &a_client, WORK),
        (&a, &a_client, "other"),
        (&b, &b_client, WORK),
        (&b, &b_client, "other"),
    ];
    for (_, client, ns) in scopes {
        create_cm_in(client, ns, &format!("after-{ns}")).await;
    }
    let got = reader
        .read_until(WAIT, |got| {
            scopes.iter().all(|(c, _, ns)| {
                got.iter()
                    .any(|e| is(e, &c.name, &format!("after-{ns}")) && e.ext("namespace") == *ns)
            })
        })
        .await;
    for (c, _, ns) in scopes {
        let n = got
            .iter()
            .filter(|e| is(e, &c.name, &format!("after-{ns}")) && e.ext("namespace") == ns)
            .count();
        assert_eq!(n, 1, "{}/{ns}: {n} events:\n{}", c.name, summary(&got));
    }
    drop(one);
    snapshot_resets_one_cluster_only(&config, (&a, &b), &b_client, &mut reader).await;
}

/// `status` on a fleet: its four watches (two per cluster), each held, and both replicas.
fn status_lists_both_clusters(bridge: &Bridge, clusters: [&str; 2]) {
    let path = bridge.dir().join("bridge.yaml");
    let (status, out, err) = run_cli(&["status", "--config", path.to_str().unwrap()]);
    assert!(status.success(), "status failed: {err}");
    assert!(out.contains("4 watches, 2 live replicas"), "{out}");
    for c in clusters {
        let held = out
            .lines()
            .filter(|l| l.starts_with(&format!("{c}/")) && !l.contains("(none)"))
            .count();
        assert_eq!(held, 2, "two held watches of {c}:\n{out}");
    }
}

/// `snapshot` on a fleet needs `--cluster`; with it, only that cluster's watch starts over: the
/// next start lists its objects again, while the other watches resume from their checkpoints.
async fn snapshot_resets_one_cluster_only(
    config: &str,
    (a, b): (&ExtraCluster, &ExtraCluster),
    b_client: &kube::Client,
    reader: &mut Reader,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bridge.yaml");
    std::fs::write(&path, config).unwrap();
    let path = path.to_str().unwrap();
    let args = [
        "snapshot",
        "--reset",
        "--config",
        path,
        "--resource",
        "v1/configmaps",
    ];
    let (status, _, err) = run_cli(&[&args[..], &["--namespace", "other"]].concat());
    assert!(!status.success());
    assert!(
        err.contains("--cluster: this configuration is a fleet"),
        "{err}"
    );
    let only_a = [&args[..], &["--namespace", "other", "--cluster", &a.name]].concat();
    let (status, out, err) = run_cli(&only_a);
    assert!(status.success(), "snapshot failed: {err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.contains(&a.name) && out.contains("other"), "{out}");
    let again = Bridge::start_with_env(config, &[("POD_NAME", "one")]);
    // Four watches start: a's of `other` from nothing (a list of its one object), the others
    // from their checkpoints. (The list's event repeats the version published before, with the
    // same id: JetStream's duplicate window keeps one copy in the stream.)
    let started = |message: &str, cluster: &str, ns: &str| {
        again
            .log_text()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|l| l["message"] == message && l["span"]["namespace"] == ns)
            .filter(|l| l["spans"][0]["cluster"] == cluster)
            .count()
    };
    wait_until("four watches started", WAIT, || async {
        let resumed = [(&a.name, WORK), (&b.name, WORK), (&b.name, "other")]
            .iter()
            .all(|(c, ns)| started("resuming from checkpoint", c, ns) == 1);
        (resumed && started("listed", &a.name, "other") == 1).then_some(())
    })
    .await;
    assert_eq!(started("resuming from checkpoint", &a.name, "other"), 0);
    let listed = again.log_text();
    let listed = listed
        .lines()
        .find(|l| l.contains("\"message\":\"listed\"") && l.contains(&a.name))
        .unwrap();
    assert!(listed.contains("\"objects\":1"), "{listed}");
    create_cm_in(b_client, "other", "later-other").await;
    reader
        .read_until(WAIT, |got| {
            got.iter().any(|e| is(e, &b.name, "later-other"))
        })
        .await;
    drop(again);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kafka_fleet_gives_each_cluster_its_own_transactions_and_topics() {
    let (a, a_client) = cluster("ka").await;
    let (b, b_client) = cluster("kb").await;
    let hub = unique_name("hub");
    let config = two_clusters(&hub, (&a, &b), "", WORK, SinkKind::Kafka);
    let topics: Vec<String> = [&a.name, &b.name]
        .iter()
        .map(|c| format!("k8s.{c}.core.configmaps"))
        .collect();
    let mut reader = Reader::kafka(&topics).await;
    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(2).await;
    create_cm(&a_client, "in-a").await;
    create_cm(&b_client, "in-b").await;
    let deadline = std::time::Instant::now() + WAIT;
    let mut got = Vec::new();
    let both = |got: &[Received]| {
        got.iter().any(|e| is(e, &a.name, "in-a")) && got.iter().any(|e| is(e, &b.name, "in-b"))
    };
    while !both(&got) && std::time::Instant::now() < deadline {
        got.extend(reader.next(Duration::from_millis(500)).await);
    }
    let find = |cluster: &str, name: &str| {
        got.iter()
            .find(|e| is(e, cluster, name))
            .cloned()
            .unwrap_or_else(|| {
                panic!(
                    "no event of {cluster}/{name}; got:\n{}\nlog:\n{}",
                    summary(&got),
                    bridge.log_text()
                )
            })
    };
    let (from_a, from_b) = (find(&a.name, "in-a"), find(&b.name, "in-b"));
    assert_eq!(from_a.destination, topics[0]);
    assert_eq!(from_b.destination, topics[1]);
    // One transactional producer per cluster: a cluster's trouble never holds another's
    // transactions open.
    let producers = metric(&bridge, "kube_event_bridge_kafka_transactional_producers").await;
    assert_eq!(producers, Some(2.0));
    drop(bridge);
}
