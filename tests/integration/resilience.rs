//! The bridge survives what a production cluster does to it: a checkpoint ahead of a restored
//! API server, API errors while a follower waits for leadership, and signals at any moment of
//! start-up, which stop it cleanly (exit 0, drained) instead of killing it half-way.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::harness::{Bridge, Proxy, Reader, kubeconfig_via, set_file_checkpoints_rv, summary};
use crate::support::{create_configmaps, kube_client, unique_name, unique_namespace, wait_until};

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": "0"}})).unwrap()
}

/// Stops the bridge with SIGTERM and asserts that it exits 0 after draining.
async fn stop_cleanly(bridge: &mut Bridge) {
    bridge.signal("TERM");
    let status = bridge
        .wait_exit(Duration::from_secs(60))
        .await
        .unwrap_or_else(|| {
            panic!(
                "no exit within 60 s of SIGTERM; log:\n{}",
                bridge.log_text()
            )
        });
    assert!(
        status.success(),
        "exit {status}; log:\n{}",
        bridge.log_text()
    );
    assert_eq!(
        bridge.count_log("shutdown complete"),
        1,
        "{}",
        bridge.log_text()
    );
}

/// After an etcd restore the API server is behind the checkpoint: a watch from the checkpoint's
/// resourceVersion would be accepted and held open, silently, until the new history caught up.
/// The bridge sees the resourceVersion is ahead, relists and publishes what changed.
#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_ahead_of_the_api_server_relists_and_repairs() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "toolarge").await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "cluster: dev\ncheckpoint: {{directory: {}, intervalMs: 100}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink: {{stdout: {{}}}}\n",
        dir.path().display()
    );
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    for name in ["kept", "changed"] {
        cms.create(&pp, &cm(name)).await.unwrap();
    }
    let mut first = Bridge::start(&config);
    first.wait_synced(1).await;
    stop_cleanly(&mut first).await;

    // While the bridge is down: one change, one new object; then the checkpoint is made to be
    // ahead of the API server, as after a restore of etcd from an older backup.
    let changed = cms
        .patch(
            "changed",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": "1"}})),
        )
        .await
        .unwrap();
    let added = cms.create(&pp, &cm("added")).await.unwrap();
    assert_eq!(set_file_checkpoints_rv(dir.path(), "90000000000"), 1);

    let mut second = Bridge::start(&config);
    let mut reader = Reader::stdout(&second);
    let mut events = reader
        .read_until(Duration::from_secs(60), |got| got.len() >= 2)
        .await;
    events.extend(reader.drain(Duration::from_secs(2)).await);
    let got: BTreeSet<(String, String, String, String)> = events
        .iter()
        .map(|r| {
            (
                r.ext("name"),
                r.change().to_string(),
                r.ext("origin"),
                r.ext("resourceversion"),
            )
        })
        .collect();
    let want: BTreeSet<(String, String, String, String)> = [
        ("changed", "modified", changed.metadata.resource_version),
        ("added", "added", added.metadata.resource_version),
    ]
    .into_iter()
    .map(|(n, c, rv)| (n.into(), c.into(), "repaired".into(), rv.unwrap()))
    .collect();
    assert_eq!(
        got,
        want,
        "the relist publishes exactly what changed:\n{}",
        summary(&events)
    );
    assert_eq!(
        second.count_log(
            "resourceVersion is ahead of the API server (etcd restored from a backup?), relisting"
        ),
        1,
        "{}",
        second.log_text()
    );
    assert_eq!(second.count_log("listed"), 1, "{}", second.log_text());
    let address = second.admin_address().await;
    let (_, metrics) = crate::admin::get(&address, "/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("kube_event_bridge_watch_restarts_total{")
                && l.contains("reason=\"too_large\"")
                && l.ends_with(" 1")),
        "{metrics}"
    );
    stop_cleanly(&mut second).await;
}

/// A Lease in `ns` held by someone else for an hour.
async fn held_lease(client: &kube::Client, ns: &str) -> String {
    let name = unique_name("lease");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600},
    }))
    .unwrap();
    Api::<Lease>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
    name
}

/// Replicas keep their checkpoints where all of them reach them: the test environment's NATS.
fn follower_config(ns: &str, lease: &str, _dir: &std::path::Path, kubernetes: &str) -> String {
    elected_config(ns, lease, 4, kubernetes)
}

/// A configuration electing a leader through Lease `lease` of `lease_secs` (renewed every
/// second), its checkpoints in the test environment's NATS.
fn elected_config(ns: &str, lease: &str, lease_secs: u64, kubernetes: &str) -> String {
    format!(
        "cluster: dev\n{kubernetes}checkpoint: {{nats: {{url: \"{}\"}}}}\nleaderElection: {{enabled: true, namespace: {ns}, leaseName: {lease}, leaseDurationSecs: {lease_secs}, retryPeriodSecs: 1}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink: {{stdout: {{}}}}\n",
        crate::support::env().nats_url
    )
}

/// A follower whose API server goes away while it waits keeps waiting, warns, and takes the
/// Lease once the API server is back and the Lease free.
#[tokio::test(flavor = "multi_thread")]
async fn a_follower_survives_api_errors_while_it_waits() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "follower").await;
    let lease = held_lease(&client, &ns).await;
    let dir = tempfile::tempdir().unwrap();
    let (_, upstream) = kubeconfig_via(0, dir.path());
    let proxy = Proxy::start(upstream).await;
    let (kubeconfig, _) = kubeconfig_via(proxy.port, dir.path());
    let config = follower_config(
        &ns,
        &lease,
        dir.path(),
        &format!("kubernetes: {{kubeconfig: {}}}\n", kubeconfig.display()),
    );
    let mut bridge = Bridge::start(&config);
    bridge.wait_log("waiting for leadership").await;

    proxy.pause(true);
    wait_until(
        "the follower has retried three failed Lease requests",
        Duration::from_secs(60),
        || async {
            (bridge.count_log("lease request failed while waiting for leadership, retrying") >= 3)
                .then_some(())
        },
    )
    .await;
    assert!(
        bridge.wait_exit(Duration::from_millis(200)).await.is_none(),
        "the follower exited on a transient error; log:\n{}",
        bridge.log_text()
    );
    assert_eq!(bridge.count_log("leadership acquired"), 0);

    proxy.pause(false);
    Api::<Lease>::namespaced(client.clone(), &ns)
        .delete(&lease, &DeleteParams::default())
        .await
        .unwrap();
    bridge.wait_log("leadership acquired").await;
    bridge.wait_synced(1).await;
    stop_cleanly(&mut bridge).await;
}

/// A leader stopped cleanly hands its Lease over: once it has drained it clears the holder, and
/// the follower takes the Lease at its next attempt instead of after the Lease's duration (a
/// minute here, longer than the test waits).
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_stopped_cleanly_hands_its_lease_to_the_follower() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "handoff").await;
    let lease = unique_name("keb-handoff");
    let config = elected_config(&ns, &lease, 60, "");
    let mut leader = Bridge::start(&config);
    leader.wait_log("leadership acquired").await;
    leader.wait_synced(1).await;
    let mut follower = Bridge::start(&config);
    follower.wait_log("waiting for leadership").await;

    stop_cleanly(&mut leader).await;
    assert_eq!(
        leader.count_log("leadership released"),
        1,
        "{}",
        leader.log_text()
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    wait_until(
        "the follower holds the Lease",
        Duration::from_secs(30),
        || async {
            let held = leases.get(&lease).await.ok()?;
            let spec = held.spec?;
            (spec.holder_identity.is_some_and(|h| !h.is_empty())
                && follower.count_log("leadership acquired") == 1)
                .then_some(())
        },
    )
    .await;
    // It goes on from the checkpoint the leader saved as it drained.
    follower.wait_log("resuming from checkpoint").await;
    stop_cleanly(&mut follower).await;
}

/// SIGTERM while a follower waits for a held Lease ends the wait: exit 0, nothing to drain.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_while_a_follower_waits_exits_cleanly() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "followerterm").await;
    let lease = held_lease(&client, &ns).await;
    let dir = tempfile::tempdir().unwrap();
    let mut bridge = Bridge::start(&follower_config(&ns, &lease, dir.path(), ""));
    bridge.wait_log("waiting for leadership").await;
    stop_cleanly(&mut bridge).await;
    assert_eq!(
        bridge.count_log("stopped before start-up finished: nothing to drain"),
        1,
        "{}",
        bridge.log_text()
    );
    assert_eq!(bridge.count_log("leadership acquired"), 0);
}

/// A follower whose identity may not touch the Lease fails at once, saying which Lease and which
/// RBAC it needs: waiting would not heal that.
#[tokio::test(flavor = "multi_thread")]
async fn a_follower_without_lease_rights_fails_naming_the_rbac_it_needs() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "forbidden").await;
    let dir = tempfile::tempdir().unwrap();
    // The test identity may impersonate; the bridge acts as a user no RBAC grants anything.
    let text = std::fs::read_to_string(crate::support::env().kubeconfig).unwrap();
    let mut kubeconfig: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    kubeconfig["users"][0]["user"]["as"] = "keb-without-lease-rights".into();
    let path = dir.path().join("kubeconfig-without-lease-rights");
    std::fs::write(&path, kubeconfig.to_string()).unwrap();
    let config = follower_config(
        &ns,
        "keb-lease",
        dir.path(),
        &format!("kubernetes: {{kubeconfig: {}}}\n", path.display()),
    );
    let mut bridge = Bridge::start(&config);
    let status = bridge
        .wait_exit(Duration::from_secs(60))
        .await
        .unwrap_or_else(|| panic!("no exit within 60 s; log:\n{}", bridge.log_text()));
    assert!(!status.success());
    let log = bridge.log_text();
    let want = format!(
        "error: lease {ns}/keb-lease: forbidden: the bridge's ServiceAccount needs get, create and update on leases.coordination.k8s.io in namespace {ns}"
    );
    assert!(log.contains(&want), "{want}\nnot in:\n{log}");
    assert_eq!(
        bridge.count_log("lease request failed while waiting for leadership, retrying"),
        0,
        "a refusal is not retried:\n{log}"
    );
}

/// A TCP proxy that holds every connection, unanswered, until released: an API server that is
/// slow to answer during the bridge's start.
struct Gate {
    port: u16,
    open: watch::Sender<bool>,
}

impl Gate {
    async fn start(upstream: String) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (open, opened) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let (upstream, mut opened) = (upstream.clone(), opened.clone());
                tokio::spawn(async move {
                    if opened.wait_for(|open| *open).await.is_err() {
                        return;
                    }
                    if let Ok(mut server) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Gate { port, open }
    }

    fn release(&self) {
        let _ = self.open.send(true);
    }
}

/// SIGTERM while the bridge is still starting (its API server slow to answer discovery) lets the
/// start finish, then drains: exit 0, with the drain logged.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_start_finishes_the_start_and_drains() {
    let (mut bridge, gate, _dir) = terminated_during_start("startterm", "").await;
    assert_eq!(
        bridge.count_log("bridge started"),
        0,
        "{}",
        bridge.log_text()
    );
    gate.release();
    let status = bridge
        .wait_exit(Duration::from_secs(60))
        .await
        .unwrap_or_else(|| panic!("no exit within 60 s; log:\n{}", bridge.log_text()));
    assert!(
        status.success(),
        "exit {status}; log:\n{}",
        bridge.log_text()
    );
    for line in [
        "bridge started",
        "shutting down: stopping watches, draining in-flight events",
        "shutdown complete",
    ] {
        assert_eq!(
            bridge.count_log(line),
            1,
            "{line}; log:\n{}",
            bridge.log_text()
        );
    }
}

/// A second signal abandons the drain: the process exits at once with 130 (what shells report
/// for an interrupt), without waiting for the start it interrupted or the grace period.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_signal_exits_at_once_with_130() {
    // The gate is never released: the start waits on the API server as long as the test lasts.
    let (mut bridge, _gate, _dir) =
        terminated_during_start("secondsignal", "delivery: {shutdownGraceSecs: 600}\n").await;
    bridge.signal("INT");
    let status = bridge
        .wait_exit(Duration::from_secs(30))
        .await
        .unwrap_or_else(|| {
            panic!(
                "no exit within 30 s of the second signal; log:\n{}",
                bridge.log_text()
            )
        });
    assert_eq!(status.code(), Some(130), "log:\n{}", bridge.log_text());
    assert_eq!(
        bridge.count_log("second signal: exiting without draining"),
        1,
        "{}",
        bridge.log_text()
    );
    assert_eq!(bridge.count_log("shutdown complete"), 0);
}

/// A bridge whose start waits on the API server behind a gate (closed), sent SIGTERM during
/// that start; `extra` is added to its configuration. The tempdir holds its kubeconfig.
async fn terminated_during_start(prefix: &str, extra: &str) -> (Bridge, Gate, tempfile::TempDir) {
    let client = kube_client().await;
    let ns = unique_namespace(&client, prefix).await;
    let dir = tempfile::tempdir().unwrap();
    let (_, upstream) = kubeconfig_via(0, dir.path());
    let gate = Gate::start(upstream).await;
    let (kubeconfig, _) = kubeconfig_via(gate.port, dir.path());
    let config = format!(
        "cluster: dev\nkubernetes: {{kubeconfig: {}}}\n{extra}resources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink: {{stdout: {{}}}}\n",
        kubeconfig.display()
    );
    let bridge = Bridge::start(&config);
    bridge.admin_address().await;
    bridge.signal("TERM");
    bridge
        .wait_log("signal during start-up: finishing the start, then draining")
        .await;
    (bridge, gate, dir)
}

/// SIGTERM while a large initial list is being published drains and exits 0; the next start
/// publishes whatever the first did not: no object is lost.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_a_large_initial_list_drains_and_loses_nothing() {
    const OBJECTS: usize = 1200;
    let client = kube_client().await;
    let ns = unique_namespace(&client, "listterm").await;
    let names: BTreeSet<String> = (0..OBJECTS).map(|i| format!("o{i:04}")).collect();
    create_configmaps(&client, &ns, names.iter().cloned()).await;
    let dir = tempfile::tempdir().unwrap();
    let config = |kubernetes: &str| {
        format!(
            "cluster: dev\n{kubernetes}checkpoint: {{directory: {}}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink: {{stdout: {{}}}}\n",
            dir.path().display()
        )
    };
    // One request every 2 s: the list's three pages of 500 arrive seconds apart (a paged LIST:
    // a streaming list is one request, over before the signal).
    let mut first = Bridge::start(&config(
        "kubernetes: {qps: 0.5, burst: 1, initialList: list}\n",
    ));
    let mut reader = Reader::stdout(&first);
    let mut seen = reader
        .read_until(Duration::from_secs(60), |got| !got.is_empty())
        .await;
    stop_cleanly(&mut first).await;
    assert_eq!(
        first.count_log("initial state published"),
        0,
        "the signal came after the list; log:\n{}",
        first.log_text()
    );
    assert_eq!(
        first.count_log("shutting down: stopping watches, draining in-flight events"),
        1
    );
    seen.extend(reader.drain(Duration::from_millis(500)).await);
    let published_first = seen.len();
    assert!(published_first < OBJECTS, "{published_first}");

    let mut second = Bridge::start(&config(""));
    let mut reader = Reader::stdout(&second);
    let names_seen = |events: &[crate::harness::Received]| -> BTreeSet<String> {
        events.iter().map(|r| r.ext("name")).collect()
    };
    let first_names = names_seen(&seen);
    let rest = reader
        .read_until(Duration::from_secs(120), |got| {
            let mut all = first_names.clone();
            all.extend(names_seen(got));
            all == names
        })
        .await;
    assert!(!rest.is_empty());
    second.wait_synced(1).await;
    stop_cleanly(&mut second).await;
}

/// A port free on 127.0.0.1 now.
async fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

/// Runs the bridge in this process until its admin server at `address` says ready.
async fn run_until_ready(
    config: &str,
    address: &str,
) -> (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<kube_event_bridge::runtime::Result<()>>,
) {
    let config = kube_event_bridge::config::ConfigFile::parse(config)
        .and_then(kube_event_bridge::config::ConfigFile::validate)
        .expect("a valid configuration");
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(kube_event_bridge::runtime::run(config, stop.clone()));
    // Ready as the leader: a follower waiting for the Lease is ready too, before the Lease
    // exists (seen once under load in CI: the Lease was not there yet to take over).
    wait_until(
        "the bridge is ready and leads",
        Duration::from_secs(60),
        || async {
            let ready = matches!(
                crate::admin::try_get(address, "/readyz").await,
                Ok((200, _))
            );
            let leads = crate::admin::try_get(address, "/metrics")
                .await
                .is_ok_and(|(_, body)| body.lines().any(|l| l == "kube_event_bridge_leader 1"));
            (ready && leads).then_some(())
        },
    )
    .await;
    (stop, run)
}

/// Whether nothing listens at `address` any more.
async fn closed(address: &str) -> bool {
    TcpStream::connect(address).await.is_err()
}

/// A run of the bridge in a process that goes on (a test, one of several bridges) leaves no
/// task behind when it ends, cleanly or by a failure: its admin server stops listening and its
/// leader Lease is renewed no more.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_that_ends_leaves_no_task_behind() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "tasks").await;
    let lease = unique_name("lease");
    let address = format!("127.0.0.1:{}", free_port().await);
    let config = format!(
        "cluster: dev\nkubernetes: {{kubeconfig: '{}'}}\nadmin: {{address: '{address}'}}\ncheckpoint: {{nats: {{url: \"{}\"}}}}\nleaderElection: {{enabled: true, namespace: {ns}, leaseName: {lease}, leaseDurationSecs: 4, retryPeriodSecs: 1}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink: {{recorder: {{channel: {}}}}}\n",
        crate::support::env().kubeconfig,
        crate::support::env().nats_url,
        unique_name("tasks"),
    );

    // A clean stop.
    let (stop, run) = run_until_ready(&config, &address).await;
    stop.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(60), run).await;
    ended.expect("the run ends").unwrap().expect("a clean stop");
    assert!(closed(&address).await, "the admin server outlived its run");

    // Leadership lost: the run fails, and still takes its tasks with it.
    let (_stop, run) = run_until_ready(&config, &address).await;
    let leases = Api::<Lease>::namespaced(client.clone(), &ns);
    let taken = json!({"spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600}});
    leases
        .patch(&lease, &PatchParams::default(), &Patch::Merge(&taken))
        .await
        .expect("take the Lease over");
    let ended = tokio::time::timeout(Duration::from_secs(60), run).await;
    let failure = ended
        .expect("the run ends")
        .unwrap()
        .expect_err("a failure");
    assert!(
        matches!(failure, kube_event_bridge::runtime::Error::LeadershipLost),
        "{failure}"
    );
    assert!(closed(&address).await, "the admin server outlived its run");
    let before = leases.get(&lease).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = leases.get(&lease).await.unwrap();
    assert_eq!(
        before.metadata.resource_version, after.metadata.resource_version,
        "the Lease was written after the run ended: {after:?}"
    );
}
