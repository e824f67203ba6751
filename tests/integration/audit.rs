//! The audit extensions end to end against the real API server: `manager` and `operation` name
//! the newest writer in `managedFields` (a server-side apply, then a merge patch by another
//! field manager, then the apply again), `clusterid` is the uid of namespace `kube-system`, and
//! with `auditExtensions: false` all three are absent. A bridge whose RBAC is exactly
//! `rbac::render`'s output for its configuration reads the cluster id (a stdout sink without
//! checkpoints: only the extension needs it); without that grant it refuses to start.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube_event_bridge::config::ConfigFile;
use kube_event_bridge::{discovery, rbac};
use serde_json::json;

use crate::harness::{Bridge, Reader, Received};
use crate::support::{env, kube_client, unique_namespace, wait_until};

const APPLIER: &str = "keb-audit-apply";
const UPDATER: &str = "keb-audit-update";
const WAIT: Duration = Duration::from_secs(60);

async fn cluster_uid(client: &kube::Client) -> String {
    Api::<Namespace>::all(client.clone())
        .get("kube-system")
        .await
        .expect("namespace kube-system")
        .metadata
        .uid
        .expect("a uid")
}

fn stdout_config(ns: &str, extra: &str) -> String {
    format!(
        "cluster: dev\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink: {{stdout: {{}}}}\n{extra}"
    )
}

/// Server-side applies ConfigMap `name` with `data` as field manager [`APPLIER`]; returns its
/// resourceVersion.
async fn apply(cms: &Api<ConfigMap>, name: &str, data: serde_json::Value) -> String {
    let cm =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data});
    cms.patch(name, &PatchParams::apply(APPLIER), &Patch::Apply(&cm))
        .await
        .expect("server-side apply")
        .metadata
        .resource_version
        .expect("a resourceVersion")
}

/// Reads until the event of `change` at `rv` arrives and returns it.
async fn event_at(reader: &mut Reader, change: &str, rv: &str) -> Received {
    let got = reader
        .read_until(WAIT, |got| {
            got.iter()
                .any(|r| r.change() == change && r.ext("resourceversion") == rv)
        })
        .await;
    got.into_iter()
        .find(|r| r.change() == change && r.ext("resourceversion") == rv)
        .expect("the event read_until waited for")
}

/// `(manager, operation, clusterid)`, "" for an absent extension.
fn audit(r: &Received) -> (String, String, String) {
    (r.ext("manager"), r.ext("operation"), r.ext("clusterid"))
}

fn expected(manager: &str, operation: &str, uid: &str) -> (String, String, String) {
    (manager.into(), operation.into(), uid.into())
}

/// Waits until the clock's second has passed the `time` of `manager`'s managedFields entry, so
/// that the next write by another manager gets a strictly newer `time` (one-second precision).
async fn wait_past_entry(cms: &Api<ConfigMap>, name: &str, manager: &str) {
    let cm = cms.get(name).await.expect("the ConfigMap");
    let entry = cm
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .find(|e| e.manager.as_deref() == Some(manager))
        .unwrap_or_else(|| panic!("no managedFields entry of {manager}"));
    let written = entry.time.expect("a time").0.as_second();
    wait_until(
        "the clock passes the second of the last write",
        Duration::from_secs(5),
        || async move {
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .expect("after the epoch")
                .as_secs() as i64;
            (now > written).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_extensions_name_the_newest_writer_and_the_cluster() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "audit").await;
    let uid = cluster_uid(&client).await;
    let mut on = Bridge::start(&stdout_config(&ns, ""));
    let mut off = Bridge::start(&stdout_config(&ns, "auditExtensions: false\n"));
    on.wait_synced(1).await;
    off.wait_synced(1).await;
    let mut reader = Reader::stdout(&on);
    let mut plain = Reader::stdout(&off);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);

    // A server-side apply creates the object.
    let rv = apply(&cms, "audited", json!({"a": "1"})).await;
    let added = event_at(&mut reader, "added", &rv).await;
    assert_eq!(audit(&added), expected(APPLIER, "Apply", &uid));
    assert!(added.data()["metadata"].get("managedFields").is_none());
    let without = event_at(&mut plain, "added", &rv).await;
    assert_eq!(
        audit(&without),
        expected("", "", ""),
        "auditExtensions: false"
    );

    // A merge patch by another field manager: an Update entry, newer or (same second) winning
    // the tie.
    let params = PatchParams {
        field_manager: Some(UPDATER.into()),
        ..PatchParams::default()
    };
    let patched = cms
        .patch(
            "audited",
            &params,
            &Patch::Merge(json!({"data": {"b": "2"}})),
        )
        .await
        .expect("merge patch");
    let rv = patched
        .metadata
        .resource_version
        .expect("a resourceVersion");
    let modified = event_at(&mut reader, "modified", &rv).await;
    assert_eq!(audit(&modified), expected(UPDATER, "Update", &uid));
    let without = event_at(&mut plain, "modified", &rv).await;
    assert_eq!(
        audit(&without),
        expected("", "", ""),
        "auditExtensions: false"
    );

    // The applier writes again, in a later second: its Apply entry is now the newest.
    wait_past_entry(&cms, "audited", UPDATER).await;
    let rv = apply(&cms, "audited", json!({"a": "3"})).await;
    let reapplied = event_at(&mut reader, "modified", &rv).await;
    assert_eq!(audit(&reapplied), expected(APPLIER, "Apply", &uid));

    // A delete names the last writer before it.
    cms.delete("audited", &DeleteParams::default())
        .await
        .expect("delete");
    let deleted = reader
        .read_until(WAIT, |got| got.iter().any(|r| r.change() == "deleted"))
        .await
        .into_iter()
        .find(|r| r.change() == "deleted")
        .expect("a delete");
    assert_eq!(audit(&deleted), expected(APPLIER, "Apply", &uid));
    let deleted = plain
        .read_until(WAIT, |got| got.iter().any(|r| r.change() == "deleted"))
        .await
        .into_iter()
        .find(|r| r.change() == "deleted")
        .expect("a delete");
    assert_eq!(
        audit(&deleted),
        expected("", "", ""),
        "auditExtensions: false"
    );
}

/// A token of service account `sa` in `ns` (TokenRequest API).
async fn token(client: &kube::Client, ns: &str, sa: &str) -> String {
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))
            .expect("token request");
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .expect("a token")
        .status
        .expect("token request status")
        .token
}

/// A copy of the test kubeconfig that authenticates with `token`.
fn kubeconfig_with_token(dir: &std::path::Path, token: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(env().kubeconfig).expect("read kubeconfig");
    let mut doc: serde_json::Value = serde_saphyr::from_str(&text).expect("parse kubeconfig");
    doc["users"][0]["user"] = json!({"token": token});
    let path = dir.join("kubeconfig-service-account");
    std::fs::write(&path, doc.to_string()).expect("write kubeconfig");
    path
}

/// A client for `kubeconfig`.
async fn client_for(kubeconfig: &std::path::Path) -> kube::Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("client config");
    kube::Client::try_from(config).expect("client")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bridge_with_exactly_the_rendered_rbac_reads_the_cluster_id() {
    let client = kube_client().await;
    let home = unique_namespace(&client, "audit-rbac").await;
    let sa = "bridge";
    let sa_object: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": sa}})).expect("service account");
    Api::<ServiceAccount>::namespaced(client.clone(), &home)
        .create(&PostParams::default(), &sa_object)
        .await
        .expect("create the service account");
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = kubeconfig_with_token(dir.path(), &token(&client, &home, sa).await);
    let yaml = stdout_config(
        &home,
        &format!("kubernetes: {{kubeconfig: {}}}\n", kubeconfig.display()),
    );
    let config = ConfigFile::parse(&yaml)
        .and_then(ConfigFile::validate)
        .expect("a valid configuration");
    assert!(
        !config.keeps_checkpoints() && config.reads_cluster_identity(),
        "only the audit extensions need the cluster identity here"
    );
    let resolved = discovery::resolve(&client, &config.resources)
        .await
        .expect("discovery");

    // Without the kube-system grant, the bridge cannot read the cluster id and refuses to start.
    crate::access_review::apply(&client, &rbac::render(&resolved, sa, &home, None, false)).await;
    let as_bridge = client_for(&kubeconfig).await;
    let cms: Api<ConfigMap> = Api::namespaced(as_bridge.clone(), &home);
    wait_until("the account may list configmaps", WAIT, || async {
        cms.list(&Default::default()).await.ok().map(|_| ())
    })
    .await;
    let mut refused = Bridge::start(&yaml);
    let status = refused
        .wait_exit(WAIT)
        .await
        .expect("the bridge exits without the grant");
    assert!(!status.success());
    assert!(
        refused
            .log_text()
            .contains("cannot read the uid of namespace kube-system"),
        "{}",
        refused.log_text()
    );

    // With exactly the rendered RBAC (which now includes the grant), it starts and says which
    // cluster it is.
    let rendered = rbac::render(&resolved, sa, &home, None, config.reads_cluster_identity());
    let identity = rbac::identity_role_name(sa, &home);
    let without_identity: Vec<&str> = rendered
        .split("---\n")
        .skip(1)
        .filter(|doc| !doc.contains(&identity))
        .collect();
    let first = rbac::render(&resolved, sa, &home, None, false);
    assert_eq!(
        without_identity,
        first.split("---\n").skip(1).collect::<Vec<_>>(),
        "the rendering is the first one plus the identity grant:\n{rendered}"
    );
    let only_identity: String = rendered
        .split("---\n")
        .filter(|doc| doc.contains(&identity))
        .map(|doc| format!("---\n{doc}"))
        .collect();
    crate::access_review::apply(&client, &only_identity).await;
    let namespaces: Api<Namespace> = Api::all(as_bridge);
    wait_until(
        "the account may get namespace kube-system",
        WAIT,
        || async { namespaces.get("kube-system").await.ok().map(|_| ()) },
    )
    .await;
    let mut bridge = Bridge::start(&yaml);
    bridge.wait_synced(1).await;
    let mut reader = Reader::stdout(&bridge);
    let admin_cms: Api<ConfigMap> = Api::namespaced(client.clone(), &home);
    let rv = apply(&admin_cms, "identified", json!({"k": "v"})).await;
    let added = event_at(&mut reader, "added", &rv).await;
    assert_eq!(
        audit(&added),
        expected(APPLIER, "Apply", &cluster_uid(&client).await)
    );
}
