//! Objects published past the last checkpoint by a bridge that then dies, deleted while the API
//! server's history is lost: whoever resumes must still publish their deletes. Sinks whose
//! events are not stored with the checkpoint (NATS, HTTP) announce such objects before sending
//! them; without that, the relist after the 410 did not show them and the index did not know
//! them, so consumers kept them for ever (found by the fault campaign, `lost-delete`).

use std::time::Duration;

use kube::api::{DeleteParams, PostParams};

use crate::harness::{Bridge, Reader, SinkKind, checkpoint_extra, summary};
use crate::{EXCLUSIVE, GoneScene, cm, testenv};

pub async fn published_past_the_checkpoint(sink: SinkKind) {
    let _guard = EXCLUSIVE.lock().await;
    let scene = GoneScene::new(sink, "past").await;
    let cluster = &scene.cluster;
    // The starting point is saved at once, the next checkpoint 10 s later: the object created
    // and read meanwhile is published past the checkpoint when the bridge is killed.
    let config = format!(
        "{}checkpoint: {{intervalMs: 10000{}}}\n",
        scene.config,
        checkpoint_extra(sink, cluster)
    );
    let mut bridge = Bridge::start(&config);
    let topics = vec![format!("k8s.{cluster}.core.configmaps")];
    let mut reader = Reader::for_sink(sink, cluster, &topics, &bridge).await;
    bridge.wait_synced(1).await;
    reader
        .read_until(Duration::from_secs(30), |got| got.len() == 4)
        .await;
    let fresh = scene
        .cms
        .create(&PostParams::default(), &cm("fresh", "1"))
        .await
        .unwrap();
    let uid = fresh.metadata.uid.clone().unwrap();
    let added = reader
        .read_until(Duration::from_secs(30), |got| {
            got.iter().any(|r| r.ext("uid") == uid)
        })
        .await;
    assert!(
        added
            .iter()
            .any(|r| r.ext("uid") == uid && r.change() == "added"),
        "{}",
        summary(&added)
    );
    bridge.signal("KILL");
    bridge
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("killed");
    scene
        .cms
        .delete("fresh", &DeleteParams::default())
        .await
        .unwrap();
    // The checkpoint's resourceVersion is gone once the API server restarts (410).
    testenv("stop", "kube-apiserver");
    testenv("start", "kube-apiserver");
    let bridge = Bridge::start(&config);
    let events = reader
        .read_until(Duration::from_secs(90), |got| {
            got.iter()
                .any(|r| r.ext("uid") == uid && r.change() == "deleted")
        })
        .await;
    let delete = events
        .iter()
        .find(|r| r.ext("uid") == uid && r.change() == "deleted");
    assert!(
        delete.is_some_and(|d| d.ext("origin") == "repaired"),
        "the delete of the object published past the checkpoint arrives, repaired:\n{}\nlog:\n{}",
        summary(&events),
        bridge.log_text()
    );
    assert!(
        bridge.count_log("watch history lost, relisting") >= 1,
        "the resumed watch met 410"
    );
    assert_eq!(
        bridge.count_log(
            "objects announced past the checkpoint: carried until the watch names them again"
        ),
        1,
        "the object was announced, not saved"
    );
    if sink == SinkKind::Http {
        let dir = std::env::temp_dir().join(format!("keb-checkpoints-{cluster}"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
