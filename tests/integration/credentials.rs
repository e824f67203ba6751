//! Credentials end to end: a rotating service-account token read from a kubeconfig's `tokenFile`,
//! and a Kafka SASL password read from a file (`sink.kafka.propertyFiles`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cloudevents::AttributesReader;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde_json::json;

use crate::harness::{Bridge, Proxy, Reader, kubeconfig_via, run_cli};
use crate::support::{env, kafka_sasl, kube_client, unique_name, unique_namespace, wait_until};

fn create<K>(name: &str, manifest: serde_json::Value) -> K
where
    K: serde::de::DeserializeOwned,
{
    serde_json::from_value(manifest).unwrap_or_else(|e| panic!("{name} manifest: {e}"))
}

/// A ServiceAccount `bridge` in `ns` that may get, list and watch ConfigMaps there, and two
/// Secrets its tokens are bound to (deleting one revokes the tokens bound to it).
async fn service_account(client: &kube::Client, ns: &str) {
    let pp = PostParams::default();
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&pp, &create("sa", json!({"metadata": {"name": "bridge"}})))
        .await
        .unwrap();
    Api::<Role>::namespaced(client.clone(), ns)
        .create(
            &pp,
            &create(
                "role",
                json!({
                    "metadata": {"name": "bridge"},
                    "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}],
                }),
            ),
        )
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(
            &pp,
            &create(
                "binding",
                json!({
                    "metadata": {"name": "bridge"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "bridge"},
                    "subjects": [{"kind": "ServiceAccount", "name": "bridge", "namespace": ns}],
                }),
            ),
        )
        .await
        .unwrap();
    for name in ["token-a", "token-b"] {
        Api::<Secret>::namespaced(client.clone(), ns)
            .create(&pp, &create("secret", json!({"metadata": {"name": name}})))
            .await
            .unwrap();
    }
}

/// A token of `bridge` from the TokenRequest API (what `kubectl create token` and the kubelet
/// use), bound to the Secret `secret`.
async fn token(client: &kube::Client, ns: &str, secret: &str) -> String {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let uid = secrets.get(secret).await.unwrap().metadata.uid.unwrap();
    let request: TokenRequest = create(
        "token request",
        json!({"spec": {
            "audiences": [],
            "expirationSeconds": 3600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Secret", "name": secret, "uid": uid},
        }}),
    );
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request("bridge", &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .expect("token request status")
        .token
}

/// The test kubeconfig with its server at `port` (the proxy), or unchanged, and `user` as its
/// credentials instead of the admin certificate.
fn kubeconfig_with_user(dir: &Path, port: Option<u16>, user: serde_json::Value) -> PathBuf {
    let source = match port {
        Some(port) => kubeconfig_via(port, dir).0,
        None => PathBuf::from(env().kubeconfig),
    };
    let mut doc: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(source).unwrap()).unwrap();
    doc["users"][0]["user"] = user;
    let path = dir.join(format!("kubeconfig-{}", unique_name("user")));
    std::fs::write(&path, serde_json::to_string(&doc).unwrap()).unwrap();
    path
}

/// Writes `token` into `path` the way the kubelet updates a projected token: a new file renamed
/// over the old one. No trailing newline: kube-client sends the file's content as it is.
fn write_token(path: &Path, token: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, token).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Whether `token` is still accepted by the API server.
async fn token_accepted(dir: &Path, ns: &str, token: &str) -> bool {
    let path = kubeconfig_with_user(dir, None, json!({"token": token}));
    let kubeconfig = Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    match Api::<ConfigMap>::namespaced(client, ns)
        .list(&Default::default())
        .await
    {
        Ok(_) => true,
        Err(kube::Error::Api(status)) if status.code == 401 => false,
        Err(e) => panic!("unexpected error checking a token: {e}"),
    }
}

fn named<'a>(name: &'a str) -> impl Fn(&[crate::harness::Received]) -> bool + 'a {
    move |got| {
        got.iter().any(|r| {
            r.event
                .subject()
                .is_some_and(|s| s.ends_with(&format!("/{name}")))
        })
    }
}

/// A kubeconfig `tokenFile` is read again after rotation: the bridge keeps publishing after its
/// first token is revoked and the file holds a new one.
///
/// Timing: kube-client (5.0, `client/auth/mod.rs`, `TokenFile`) reads the file when the client is
/// built and caches the token for 60 s, reloading it on the first request made once fewer than
/// 10 s of that are left, i.e. 50 s after the last read. A watch is one long request, so the
/// bridge makes no request at all until something breaks a watch (every 290 s at the latest).
/// The test therefore rotates and revokes at once, waits until the cached copy is at least 50 s
/// old (measured from the sync, which comes after the client was built), then cuts every
/// connection through a proxy: the watch's next request must read the new token. The waiting is
/// the mechanism's own 50 s; nothing shorter can prove a reload.
#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_token_file_is_read_again_and_events_keep_flowing() {
    const TOKEN_CACHE: Duration = Duration::from_secs(50);
    let client = kube_client().await;
    let ns = unique_namespace(&client, "token-rotation").await;
    service_account(&client, &ns).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    let first = token(&client, &ns, "token-a").await;
    write_token(&token_file, &first);

    let (_, upstream) = kubeconfig_via(0, dir.path());
    let proxy = Proxy::start(upstream).await;
    let kubeconfig = kubeconfig_with_user(
        dir.path(),
        Some(proxy.port),
        json!({"tokenFile": token_file.display().to_string()}),
    );
    let config = format!(
        "cluster: dev\nkubernetes: {{kubeconfig: {}}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink: {{stdout: {{}}}}\n",
        kubeconfig.display()
    );
    let mut bridge = Bridge::start(&config);
    let mut reader = Reader::stdout(&bridge);
    bridge.wait_synced(1).await;
    let token_read_by = Instant::now();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let cm = |name: &str| -> ConfigMap { create("cm", json!({"metadata": {"name": name}})) };
    cms.create(&PostParams::default(), &cm("with-first-token"))
        .await
        .unwrap();
    reader
        .read_until(Duration::from_secs(30), named("with-first-token"))
        .await;

    // Rotate: the file gets a new token, and the first one is revoked by deleting its Secret.
    write_token(&token_file, &token(&client, &ns, "token-b").await);
    Api::<Secret>::namespaced(client.clone(), &ns)
        .delete("token-a", &DeleteParams::default())
        .await
        .unwrap();
    wait_until(
        "the first token is revoked",
        Duration::from_secs(30),
        || async { (!token_accepted(dir.path(), &ns, &first).await).then_some(()) },
    )
    .await;

    let cached_for = token_read_by.elapsed();
    tokio::time::sleep((TOKEN_CACHE + Duration::from_secs(2)).saturating_sub(cached_for)).await;
    let watches_before = bridge.count_log("watching");
    proxy.cut_all();
    wait_until(
        "the watch is re-established with the new token",
        Duration::from_secs(30),
        || async { (bridge.count_log("watching") > watches_before).then_some(()) },
    )
    .await;
    cms.create(&PostParams::default(), &cm("with-second-token"))
        .await
        .unwrap();
    reader
        .read_until(Duration::from_secs(30), named("with-second-token"))
        .await;
    let log = bridge.log_text();
    assert_eq!(
        bridge.count_log("listed"),
        1,
        "the watch resumed without a relist; log:\n{log}"
    );
    assert!(
        !log.contains("401") && !log.contains("Unauthorized"),
        "the revoked token was sent after the rotation; log:\n{log}"
    );
}

/// `sink.kafka.propertyFiles`: the SASL password comes from a file, and the bridge authenticates
/// to Kafka's SASL listener with it. An unreadable file stops the start, naming field and path.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_sasl_password_is_read_from_a_file() {
    let sasl = kafka_sasl();
    // The listener really checks the password: a wrong one gets no metadata.
    let wrong: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &sasl.bootstrap)
        .set("security.protocol", "sasl_plaintext")
        .set("sasl.mechanism", "PLAIN")
        .set("sasl.username", &sasl.username)
        .set("sasl.password", "not-the-password")
        .create()
        .unwrap();
    let refused =
        tokio::task::spawn_blocking(move || wrong.fetch_metadata(None, Duration::from_secs(10)))
            .await
            .unwrap();
    assert!(refused.is_err(), "a wrong password was accepted");

    let client = kube_client().await;
    let ns = unique_namespace(&client, "kafka-sasl").await;
    let cluster = unique_name("sasl");
    let topic = format!("k8s.{cluster}.core.configmaps");
    let mut reader = Reader::kafka(std::slice::from_ref(&topic)).await;
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("password");
    // As `kubectl create secret generic --from-file` stores a file written by `echo`.
    std::fs::write(&password_file, format!("{}\n", sasl.password)).unwrap();
    let config = |password_file: &Path| {
        format!(
            "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink:\n  kafka:\n    bootstrapServers: \"{}\"\n    properties: {{security.protocol: sasl_plaintext, sasl.mechanism: PLAIN, sasl.username: {}}}\n    propertyFiles: {{sasl.password: {}}}\nadmin: {{address: \"127.0.0.1:0\"}}\n",
            sasl.bootstrap,
            sasl.username,
            password_file.display()
        )
    };

    let mut bridge = Bridge::start(&config(&password_file));
    bridge.wait_synced(1).await;
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &create("cm", json!({"metadata": {"name": "over-sasl"}})),
        )
        .await
        .unwrap();
    reader
        .read_until(Duration::from_secs(30), named("over-sasl"))
        .await;
    assert!(
        !bridge.log_text().contains(&sasl.password),
        "the password appears in the log"
    );

    let missing = dir.path().join("missing-password");
    let config_path = dir.path().join("missing.yaml");
    std::fs::write(&config_path, config(&missing)).unwrap();
    let (status, _, stderr) = run_cli(&["run", "--config", config_path.to_str().unwrap()]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "error: sink.kafka.propertyFiles.sasl.password: cannot read {}: No such file",
            missing.display()
        )),
        "{stderr}"
    );
}
