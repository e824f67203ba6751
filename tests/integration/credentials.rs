//! Credentials end to end: a rotating service-account token read from a kubeconfig's `tokenFile`,
//! a Kafka SASL password read from a file (`sink.kafka.propertyFiles`), and the brokers as
//! production clusters run them: Kafka over TLS with SCRAM-SHA-512, NATS over TLS with an nkey or a
//! `.creds` file. A wrong credential or an untrusted certificate stops the start with an error
//! naming the field, the server and its reason, and no secret ever reaches the log.

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

use crate::harness::{Bridge, Proxy, Reader, kubeconfig_via, run_cli, stream_name};
use crate::support::{
    env, kafka_sasl, kafka_scram, kube_client, nats_secure, testenv_cas, unique_name,
    unique_namespace, wait_until,
};

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
        serde_saphyr::from_str(&std::fs::read_to_string(source).unwrap()).unwrap();
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
        // The service account may read ConfigMaps of `ns` only: no `clusterid`, which needs `get`
        // on namespace kube-system, and snapshot requests read from `ns` (a request refused by
        // RBAC elsewhere would be retried with the revoked token until the file is read again).
        "cluster: dev\nkubernetes: {{kubeconfig: {}}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink: {{stdout: {{}}}}\nauditExtensions: false\nsnapshotRequests: {{namespace: {ns}}}\n",
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
    let refused: Vec<&str> = log.lines().filter(|l| names_a_refusal(l)).collect();
    assert!(
        refused.is_empty(),
        "the revoked token was sent after the rotation: {refused:#?}; log:\n{log}"
    );
}

/// Whether a JSON log line reports the API server refusing a credential: `Unauthorized`, or
/// `401` standing alone. The timestamp is left out, and so are digits inside longer numbers or
/// names (a timestamp's `.740106`, a port `34012`, a duration `0.401`, a namespace suffix
/// `4401a`).
fn names_a_refusal(line: &str) -> bool {
    let mut fields: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
    if let Some(map) = fields.as_object_mut() {
        map.remove("timestamp");
    }
    let text = if fields.is_null() {
        line.to_string()
    } else {
        fields.to_string()
    };
    text.contains("Unauthorized")
        || text.match_indices("401").any(|(at, _)| {
            let alone = |c: Option<char>| !c.is_some_and(|c| c.is_ascii_alphanumeric());
            let before = text[..at].chars().next_back();
            alone(before) && before != Some('.') && alone(text[at + 3..].chars().next())
        })
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

/// Runs `kube-event-bridge run` on `config`, which must be refused at start: exit code 1 with
/// `expected` in its log (standard error), which is returned.
fn refused_at_start(dir: &Path, config: &str, expected: &str) -> String {
    let path = dir.join(format!("{}.yaml", unique_name("config")));
    std::fs::write(&path, config).unwrap();
    let (status, _, log) = run_cli(&["run", "--config", path.to_str().unwrap()]);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains(expected), "expected {expected:?} in:\n{log}");
    log
}

/// Creates the ConfigMap `name` in `ns`.
async fn create_config_map(client: &kube::Client, ns: &str, name: &str) {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &create("cm", json!({"metadata": {"name": name}})),
        )
        .await
        .unwrap();
}

/// The `sink.kafka` section for the SASL_SSL listener: SCRAM-SHA-512, the password from
/// `password_file`, the brokers' certificate checked against `ca`, and `extra` properties.
fn kafka_scram_config(
    cluster: &str,
    ns: &str,
    password_file: &Path,
    ca: &str,
    extra: &str,
) -> String {
    let scram = kafka_scram();
    format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink:\n  kafka:\n    bootstrapServers: \"{}\"\n    properties: {{security.protocol: sasl_ssl, sasl.mechanism: SCRAM-SHA-512, sasl.username: {}, ssl.ca.location: \"{ca}\"{extra}}}\n    propertyFiles: {{sasl.password: {}}}\nadmin: {{address: \"127.0.0.1:0\"}}\n",
        scram.bootstrap,
        scram.username,
        password_file.display()
    )
}

/// Kafka over TLS with SCRAM-SHA-512, the password from a file: events arrive, verified against
/// the environment's CA. A wrong password stops the start naming the fields, the brokers and
/// their reason, and neither password appears in the log.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_sasl_ssl_scram_sha_512_with_a_password_file() {
    let scram = kafka_scram();
    let (ca, _) = testenv_cas();
    let client = kube_client().await;
    let ns = unique_namespace(&client, "kafka-scram").await;
    let cluster = unique_name("scram");
    let topic = format!("k8s.{cluster}.core.configmaps");
    let mut reader = Reader::kafka(std::slice::from_ref(&topic)).await;
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, format!("{}\n", scram.password)).unwrap();

    let mut bridge = Bridge::start(&kafka_scram_config(&cluster, &ns, &password_file, &ca, ""));
    bridge.wait_synced(1).await;
    create_config_map(&client, &ns, "over-sasl-ssl").await;
    reader
        .read_until(Duration::from_secs(30), named("over-sasl-ssl"))
        .await;
    let log = bridge.log_text();
    assert!(
        !log.contains(&scram.password),
        "the password appears in the log"
    );
    drop(bridge);

    let wrong = unique_name("wrong-scram-password");
    let wrong_file = dir.path().join("wrong-password");
    std::fs::write(&wrong_file, &wrong).unwrap();
    let expected = format!(
        "error: sink.kafka.properties.sasl.username, sink.kafka.propertyFiles.sasl.password: the brokers at {} refused the credentials: ",
        scram.bootstrap
    );
    let log = refused_at_start(
        dir.path(),
        &kafka_scram_config(&cluster, &ns, &wrong_file, &ca, ""),
        &expected,
    );
    assert!(
        log.contains("Authentication failed") && log.contains("SCRAM-SHA-512"),
        "the brokers' reason is missing:\n{log}"
    );
    assert!(
        !log.contains(&wrong),
        "the wrong password appears in the log"
    );
    assert!(
        !log.contains(&scram.password),
        "the password appears in the log"
    );
}

/// The brokers' certificate is verified: a CA that did not sign it is refused at start, naming
/// `ssl.ca.location` and the TLS failure. Verification goes off only when a property says so,
/// and then a warning names that property.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_tls_refuses_a_ca_that_did_not_sign_the_brokers_certificate() {
    let scram = kafka_scram();
    let (_, other_ca) = testenv_cas();
    let client = kube_client().await;
    let ns = unique_namespace(&client, "kafka-tls-ca").await;
    let cluster = unique_name("tlsca");
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, &scram.password).unwrap();

    let expected = format!(
        "error: sink.kafka.properties.ssl.ca.location: the brokers at {} could not complete the TLS handshake: ",
        scram.bootstrap
    );
    let log = refused_at_start(
        dir.path(),
        &kafka_scram_config(&cluster, &ns, &password_file, &other_ca, ""),
        &expected,
    );
    assert!(
        log.contains("certificate verify failed"),
        "the TLS reason is missing:\n{log}"
    );

    let topic = format!("k8s.{cluster}.core.configmaps");
    let mut reader = Reader::kafka(std::slice::from_ref(&topic)).await;
    let unverified = kafka_scram_config(
        &cluster,
        &ns,
        &password_file,
        &other_ca,
        ", enable.ssl.certificate.verification: \"false\"",
    );
    let mut bridge = Bridge::start(&unverified);
    bridge
        .wait_log("kafka tls certificate verification is turned off: the brokers' identity is not checked")
        .await;
    bridge.wait_synced(1).await;
    create_config_map(&client, &ns, "unverified").await;
    reader
        .read_until(Duration::from_secs(30), named("unverified"))
        .await;
    let warning = bridge
        .log_text()
        .lines()
        .find(|l| l.contains("verification is turned off"))
        .map(str::to_string)
        .unwrap();
    assert!(
        warning.contains("\"level\":\"WARN\"")
            && warning.contains("\"property\":\"enable.ssl.certificate.verification\""),
        "{warning}"
    );
}

/// A bridge config publishing the ConfigMaps of `ns` to JetStream at `url` with `credentials`
/// (a flow mapping's inside).
fn nats_secure_config(cluster: &str, ns: &str, url: &str, credentials: &str) -> String {
    format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink:\n  nats:\n    url: \"{url}\"\n    subject: \"k8s.{{cluster}}.{{group}}.{{resource}}.{{namespace}}.{{name}}\"\n    jetstream: {{stream: \"{}\", create: true}}\n    credentials: {{{credentials}}}\n",
        stream_name(cluster)
    )
}

/// The secret parts of a `.creds` file: the JWT and the seed lines.
fn creds_secrets(path: &str) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with("---") && !l.starts_with('*') && !l.contains(' ')
        })
        .map(str::to_string)
        .collect()
}

/// NATS over TLS with an nkey seed from a file: events arrive. A seed the server does not know is
/// refused at start naming `nkeySeedFile`, the server and its reason; a CA that did not sign the
/// server's certificate is refused naming `tlsCaFile`. No seed appears in any log.
#[tokio::test(flavor = "multi_thread")]
async fn nats_tls_with_an_nkey_seed_file() {
    let nats = nats_secure();
    let (ca, other_ca) = testenv_cas();
    let client = kube_client().await;
    let ns = unique_namespace(&client, "nats-nkey").await;
    let cluster = unique_name("nkey");
    let credentials =
        |seed: &str, ca: &str| format!("nkeySeedFile: \"{seed}\", tlsCaFile: \"{ca}\"");

    let mut bridge = Bridge::start(&nats_secure_config(
        &cluster,
        &ns,
        &nats.nkey_url,
        &credentials(&nats.nkey_seed_file, &ca),
    ));
    bridge.wait_synced(1).await;
    let seed = std::fs::read_to_string(&nats.nkey_seed_file).unwrap();
    let reader_client = async_nats::ConnectOptions::with_nkey(seed.trim().to_string())
        .add_root_certificates(PathBuf::from(&ca))
        .connect(&nats.nkey_url)
        .await
        .expect("the test connects with the nkey");
    let mut reader = Reader::nats_via(reader_client, &cluster).await;
    create_config_map(&client, &ns, "over-nkey").await;
    reader
        .read_until(Duration::from_secs(30), named("over-nkey"))
        .await;
    assert!(
        !bridge.log_text().contains(seed.trim()),
        "the seed appears in the log"
    );
    drop(bridge);

    let dir = tempfile::tempdir().unwrap();
    let unknown = std::fs::read_to_string(&nats.unknown_seed_file).unwrap();
    let expected = format!(
        "error: sink.nats.credentials.nkeySeedFile: the server at {} refused the credentials: authorization violation",
        nats.nkey_url
    );
    let log = refused_at_start(
        dir.path(),
        &nats_secure_config(
            &cluster,
            &ns,
            &nats.nkey_url,
            &credentials(&nats.unknown_seed_file, &ca),
        ),
        &expected,
    );
    assert!(
        !log.contains(unknown.trim()) && !log.contains(seed.trim()),
        "a seed appears in the log"
    );

    let expected = format!(
        "error: sink.nats.credentials.tlsCaFile: the server at {} could not complete the TLS handshake: ",
        nats.nkey_url
    );
    let log = refused_at_start(
        dir.path(),
        &nats_secure_config(
            &cluster,
            &ns,
            &nats.nkey_url,
            &credentials(&nats.nkey_seed_file, &other_ca),
        ),
        &expected,
    );
    assert!(
        log.contains("UnknownIssuer"),
        "the TLS reason is missing:\n{log}"
    );
}

/// NATS over TLS in operator (JWT) mode with a `.creds` file: events arrive. The `.creds` of an
/// account the operator never signed is refused at start naming `credsFile`, and neither the
/// JWTs nor the seeds appear in any log.
#[tokio::test(flavor = "multi_thread")]
async fn nats_tls_with_a_creds_file() {
    let nats = nats_secure();
    let (ca, _) = testenv_cas();
    let client = kube_client().await;
    let ns = unique_namespace(&client, "nats-creds").await;
    let cluster = unique_name("creds");
    let credentials = |creds: &str| format!("credsFile: \"{creds}\", tlsCaFile: \"{ca}\"");
    let mut secrets = creds_secrets(&nats.creds_file);
    secrets.extend(creds_secrets(&nats.unknown_creds_file));
    assert_eq!(secrets.len(), 4, "two JWTs and two seeds: {secrets:?}");

    let mut bridge = Bridge::start(&nats_secure_config(
        &cluster,
        &ns,
        &nats.jwt_url,
        &credentials(&nats.creds_file),
    ));
    bridge.wait_synced(1).await;
    let reader_client = async_nats::ConnectOptions::with_credentials_file(&nats.creds_file)
        .await
        .expect("the test reads the creds file")
        .add_root_certificates(PathBuf::from(&ca))
        .connect(&nats.jwt_url)
        .await
        .expect("the test connects with the creds file");
    let mut reader = Reader::nats_via(reader_client, &cluster).await;
    create_config_map(&client, &ns, "over-creds").await;
    reader
        .read_until(Duration::from_secs(30), named("over-creds"))
        .await;
    let log = bridge.log_text();
    assert!(
        secrets.iter().all(|s| !log.contains(s.as_str())),
        "a JWT or seed appears in the log"
    );
    drop(bridge);

    let dir = tempfile::tempdir().unwrap();
    let expected = format!(
        "error: sink.nats.credentials.credsFile: the server at {} refused the credentials: authorization violation",
        nats.jwt_url
    );
    let log = refused_at_start(
        dir.path(),
        &nats_secure_config(
            &cluster,
            &ns,
            &nats.jwt_url,
            &credentials(&nats.unknown_creds_file),
        ),
        &expected,
    );
    assert!(
        secrets.iter().all(|s| !log.contains(s.as_str())),
        "a JWT or seed appears in the log"
    );
}

#[cfg(test)]
mod tests {
    use super::names_a_refusal;

    #[test]
    fn a_refusal_is_named_and_digits_inside_other_numbers_are_not() {
        let line = |message: &str| {
            serde_json::json!({
                "timestamp": "2026-11-25T13:35:43.740106Z",
                "message": message,
                "address": "127.0.0.1:34012",
                "elapsed": 0.401,
                "span": {"namespace": "token-rotation-fb8a4401a"},
            })
            .to_string()
        };
        assert!(!names_a_refusal(&line("watching")));
        assert!(names_a_refusal(&line("list failed: Unauthorized")));
        assert!(names_a_refusal(&line("ErrorResponse { code: 401 }")));
        assert!(names_a_refusal("not json: HTTP 401"));
    }
}
