//! The consumer library through an API server restart: the bridge's watch history is gone
//! (410), it relists and publishes repaired differences; a store fed by the broker ends equal to
//! a LIST from the API server, and so does a new store reading from the beginning.

use std::time::Duration;

use kube_event_bridge_consumer::{ObjectKey, Origin};

use crate::harness::{Bridge, SinkKind};
use crate::store_check::{LiveStore, assert_new_store_rebuilds, wait_store_equals_list};
use crate::support::{self, kube_client};
use crate::{EXCLUSIVE, GoneScene};

/// How long a store may take to reflect what the API server holds (a restart included).
const CONVERGE: Duration = Duration::from_secs(180);

/// Objects changed, deleted, recreated and added while the bridge cannot see the API server,
/// which then restarts: the store follows the repaired events to the LIST's state.
pub async fn store_after_gone_repair(sink: SinkKind) {
    let _guard = EXCLUSIVE.lock().await;
    let scene = GoneScene::new(sink, "consumer-gone").await;
    let (cluster, config, ns) = (&scene.cluster, &scene.config, &scene.ns);
    let client = kube_client().await;
    // Kafka: the default topic, keyed by uid.
    let topics = vec![format!("k8s.{cluster}.core.configmaps")];
    if sink == SinkKind::Kafka {
        support::create_topic(&topics[0], 3).await;
    }
    let mut bridge = Bridge::start(config);
    bridge.wait_synced(1).await;
    let live = LiveStore::open(sink, cluster, &topics).await;
    wait_store_equals_list(&live, &client, ns, CONVERGE).await;

    scene.change_unseen_then_restart().await;

    let client = kube_client().await;
    let state = wait_store_equals_list(&live, &client, ns, CONVERGE).await;
    live.assert_no_errors();
    assert_eq!(
        state.keys().map(String::as_str).collect::<Vec<_>>(),
        ["added", "changed", "recreated", "same"]
    );
    assert!(
        bridge.count_log("watch history lost, relisting") >= 1,
        "the bridge must have relisted after 410:\n{}",
        bridge.log_text()
    );
    for name in ["added", "changed", "recreated"] {
        let object = live
            .store
            .get(&ObjectKey::namespaced(cluster, "configmaps", ns, name))
            .unwrap();
        assert_eq!(object.origin, Origin::Repaired, "{name}");
    }

    // A new store from the beginning, once caught up, holds the same state.
    bridge.signal("TERM");
    assert!(bridge.wait_exit(Duration::from_secs(30)).await.is_some());
    assert_new_store_rebuilds(sink, cluster, &topics, ns, &state, CONVERGE).await;
}
