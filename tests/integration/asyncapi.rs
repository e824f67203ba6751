//! `kube-event-bridge asyncapi` against the real API server (discovery), its output validated by
//! the AsyncAPI project's own parser (`@asyncapi/parser`, installed by `scripts/testenv` and run
//! through `KEB_ASYNCAPI_VALIDATE`): Kafka in binary and structured mode, NATS (JetStream, with
//! credentials) and core NATS structured, per-object templates, standard output. Events the
//! bridge really publishes to Kafka and NATS are then checked against the document's channel
//! addresses and message schemas. The validator is first shown to reject broken documents.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

use crate::harness::{Bridge, Reader, Received, SinkKind, run_cli, sink_yaml};
use crate::support::{env, kube_client, unique_name, unique_namespace};

/// The validator script, or a failure naming how to get it.
fn validator() -> String {
    match std::env::var("KEB_ASYNCAPI_VALIDATE") {
        Ok(path) if Path::new(&path).is_file() => path,
        other => panic!(
            "KEB_ASYNCAPI_VALIDATE is {other:?}: run `scripts/testenv build` and \
             `eval \"$(scripts/testenv env)\"` (it installs @asyncapi/parser with npm)"
        ),
    }
}

/// Runs the validator (`--strict`: warnings fail too) on `document`, with received `messages`
/// when given: (success, output).
pub(crate) fn validate(document: &Path, messages: Option<&Path>) -> (bool, String) {
    let mut command = Command::new(validator());
    command.arg("--strict").arg(document);
    if let Some(m) = messages {
        command.arg("--messages").arg(m);
    }
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run the AsyncAPI validator: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `kube-event-bridge asyncapi` for `config` (JSON), written to `dir`; returns its path and value.
pub(crate) fn generate(dir: &Path, name: &str, config: &str) -> (PathBuf, Value) {
    let config_path = dir.join(format!("{name}.yaml"));
    std::fs::write(&config_path, config).expect("write config");
    let (status, stdout, stderr) = run_cli(&[
        "asyncapi",
        "--config",
        config_path.to_str().expect("a UTF-8 path"),
        "--format",
        "json",
    ]);
    assert!(status.success(), "asyncapi failed for {name}: {stderr}");
    let path = dir.join(format!("{name}.asyncapi.json"));
    std::fs::write(&path, &stdout).expect("write document");
    let doc = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{name}: {e}\n{stdout}"));
    (path, doc)
}

fn assert_valid(path: &Path, messages: Option<&Path>) {
    let (ok, output) = validate(path, messages);
    assert!(ok, "{} is not valid:\n{output}", path.display());
    assert!(output.contains("valid AsyncAPI 3.0.0"), "{output}");
}

#[test]
fn the_validator_rejects_broken_documents() {
    let dir = tempfile::tempdir().expect("temp dir");
    let not_asyncapi = dir.path().join("broken.yaml");
    std::fs::write(
        &not_asyncapi,
        "asyncapi: 3.0.0\ninfo: {title: broken}\nchannels: {c: {address: 1}}\n",
    )
    .unwrap();
    let (ok, output) = validate(&not_asyncapi, None);
    assert!(!ok, "{output}");
    assert!(
        output.contains("must have required property \"version\""),
        "{output}"
    );
    assert!(output.contains("channels.c.address"), "{output}");

    // A well-formed document whose example does not match its message's payload schema.
    let mismatched = dir.path().join("mismatched.yaml");
    std::fs::write(
        &mismatched,
        "asyncapi: 3.0.0\ninfo: {title: t, version: '1'}\nchannels:\n  c:\n    address: c\n    messages:\n      m:\n        payload: {type: object, required: [kind], properties: {kind: {const: ConfigMap}}}\n        examples: [{payload: {kind: Pod}}]\n",
    )
    .unwrap();
    let (ok, output) = validate(&mismatched, None);
    assert!(!ok, "{output}");
    assert!(output.contains("must be equal to constant"), "{output}");
}

/// The configurations documented, with the channel addresses each must produce.
fn configurations(ns: &str) -> Vec<(&'static str, String, Vec<String>)> {
    let e = env();
    let resources = format!(
        "resources:\n\
         - {{apiVersion: v1, resource: ConfigMap, namespaces: [{ns}]}}\n\
         - {{apiVersion: apps/v1, resource: deployments, payload: diff, includePrevious: true, tombstones: true}}\n\
         - {{apiVersion: v1, resource: secrets, payload: reference DESTINATION}}\n\
         - {{apiVersion: v1, resource: nodes, eventFormat: knative}}\n"
    );
    let nats_resources = resources
        .replace(" DESTINATION", ", subject: 'audit.{namespace}.{name}'")
        .replace(", tombstones: true", "");
    let http_resources = resources
        .replace(" DESTINATION", ", url: 'http://audit.example/{namespace}'")
        .replace(", tombstones: true", "");
    let stdout_resources = resources
        .replace(" DESTINATION", "")
        .replace(", tombstones: true", "");
    let resources = resources.replace(
        " DESTINATION",
        ", topic: 'k8s.{cluster}.by-namespace.{namespace}'",
    );
    let kafka = |mode: &str| {
        format!(
            "cluster: dev\n{resources}sink:\n  kafka:\n    bootstrapServers: '{}'\n    contentMode: {mode}\n    properties: {{security.protocol: SASL_PLAINTEXT, sasl.mechanisms: PLAIN, sasl.username: bridge}}\n    propertyFiles: {{sasl.password: /run/secrets/kafka-password}}\n",
            e.kafka_bootstrap
        )
    };
    let kafka_channels = vec![
        "k8s.dev.core.configmaps".to_string(),
        "k8s.dev.apps.deployments".into(),
        "k8s.dev.by-namespace.{namespace}".into(),
        "k8s.dev.core.nodes".into(),
    ];
    let nats_channels = vec![
        format!("k8s.dev.core.configmaps.{ns}.{{name}}"),
        "k8s.dev.apps.deployments.{namespace}.{name}".into(),
        "audit.{namespace}.{name}".into(),
        "k8s.dev.core.nodes._.{name}".into(),
    ];
    let http = |mode: &str, credentials: &str| {
        format!(
            "cluster: dev\n{http_resources}checkpoint: {{directory: /var/lib/keb}}\nsink:\n  http:\n    url: 'https://events.example:8443/k8s/{{cluster}}/{{resource}}/{{namespace}}/{{name}}'\n    contentMode: {mode}\n    credentials: {credentials}\n"
        )
    };
    let http_channels = vec![
        format!("/k8s/dev/configmaps/{ns}/{{name}}"),
        "/k8s/dev/deployments/{namespace}/{name}".into(),
        "/{namespace}".into(),
        "/k8s/dev/nodes/_/{name}".into(),
    ];
    vec![
        (
            "http-binary",
            http("binary", "{bearerTokenFile: /run/secrets/token}"),
            http_channels.clone(),
        ),
        (
            "http-structured",
            http(
                "structured",
                "{user: not-in-the-document, passwordFile: /run/secrets/password}",
            ),
            http_channels,
        ),
        ("kafka-binary", kafka("binary"), kafka_channels.clone()),
        ("kafka-structured", kafka("structured"), kafka_channels),
        (
            "nats-jetstream-binary",
            format!(
                "cluster: dev\n{nats_resources}sink:\n  nats:\n    url: 'nats://bridge:not-in-the-document@127.0.0.1:4222,tls://127.0.0.1:4443'\n    jetstream: {{stream: k8s}}\n    credentials: {{nkeySeedFile: /run/secrets/nkey}}\n"
            ),
            nats_channels.clone(),
        ),
        (
            "nats-core-structured",
            format!(
                "cluster: dev\n{nats_resources}checkpoint: {{enabled: false}}\nsink:\n  nats:\n    url: '{}'\n    contentMode: structured\n",
                e.nats_url
            ),
            nats_channels,
        ),
        (
            "stdout",
            format!("cluster: dev\n{stdout_resources}auditExtensions: false\n"),
            Vec::new(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn documents_of_every_binding_pass_the_asyncapi_parser() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "asyncapi").await;
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, config, addresses) in configurations(&ns) {
        let (path, doc) = generate(dir.path(), name, &config);
        assert_valid(&path, None);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            !text.contains("not-in-the-document"),
            "{name}: a credential leaked"
        );
        let channels = doc["channels"].as_object().expect("channels");
        let mut found: Vec<String> = channels
            .values()
            .filter_map(|c| c["address"].as_str().map(String::from))
            .collect();
        found.sort();
        let mut addresses = addresses;
        addresses.sort();
        assert_eq!(found, addresses, "{name}");
        assert_eq!(
            doc["operations"].as_object().expect("operations").len(),
            channels.len(),
            "{name}: one send operation per channel"
        );
        let headers = &doc["components"]["messages"]["v1.configmaps"]["headers"];
        match name {
            "kafka-binary" => {
                assert_eq!(headers["properties"]["ce_kind"]["const"], "ConfigMap");
                assert_eq!(headers["properties"]["ce_namespace"]["const"], json!(ns));
                assert!(headers["properties"]["ce_clusterid"].is_object());
                assert_eq!(doc["servers"]["kafka"]["protocol"], "kafka");
                let messages = doc["channels"]["k8s.dev.apps.deployments"]["messages"]
                    .as_object()
                    .unwrap();
                assert!(messages.contains_key("apps.v1.deployments.tombstone"));
                // The snapshot markers, whose examples the parser checked against their schema.
                assert!(
                    messages.contains_key("snapshot.begin")
                        && messages.contains_key("snapshot.end")
                );
                assert!(doc["components"]["schemas"]["SnapshotMarker"].is_object());
            }
            "kafka-structured" => assert_eq!(
                headers["properties"]["content-type"]["const"],
                "application/cloudevents+json; charset=utf-8"
            ),
            "nats-jetstream-binary" => {
                assert!(headers["properties"]["Nats-Msg-Id"].is_object());
                assert_eq!(
                    doc["servers"]["nats"]["host"],
                    "127.0.0.1:4222,127.0.0.1:4443"
                );
            }
            "http-binary" => {
                assert_eq!(headers["properties"]["ce-kind"]["const"], "ConfigMap");
                assert_eq!(doc["servers"]["http"]["host"], "events.example:8443");
                assert_eq!(doc["servers"]["http"]["protocol"], "https");
                assert_eq!(doc["servers"]["http-2"]["host"], "audit.example");
                assert_eq!(doc["servers"]["http-2"]["protocol"], "http");
                assert!(doc["components"]["securitySchemes"]["httpBearer"].is_object());
                let secrets = channels
                    .values()
                    .find(|c| c["address"] == "/{namespace}")
                    .expect("the secrets channel");
                assert_eq!(secrets["servers"][0]["$ref"], "#/servers/http-2");
                let op = doc["operations"]
                    .as_object()
                    .unwrap()
                    .values()
                    .next()
                    .unwrap();
                assert_eq!(op["bindings"]["http"]["method"], "POST");
            }
            "http-structured" => {
                assert_eq!(
                    headers["properties"]["Content-Type"]["const"],
                    "application/cloudevents+json; charset=utf-8"
                );
                assert_eq!(
                    doc["components"]["securitySchemes"]["httpBasic"]["scheme"],
                    "basic"
                );
            }
            "stdout" => {
                assert!(doc.get("servers").is_none());
                assert!(channels.values().all(|c| c["address"].is_null()));
                let payload = doc["components"]["messages"]["v1.configmaps"]["payload"].to_string();
                assert!(!payload.contains("clusterid"), "audit off: {payload}");
            }
            _ => {}
        }
    }
}

/// Received events as the validator's JSONL: each checked against message `message`.
pub(crate) fn write_received(
    dir: &Path,
    name: &str,
    message: &str,
    got: &[Received],
    binary: bool,
) -> PathBuf {
    let lines: Vec<String> = got
        .iter()
        .map(|r| {
            let payload = if binary {
                r.data()
            } else {
                serde_json::to_value(&r.event).expect("a CloudEvent serializes")
            };
            json!({"message": message, "headers": r.headers, "payload": payload}).to_string()
        })
        .collect();
    let path = dir.join(format!("{name}.received.jsonl"));
    std::fs::write(&path, lines.join("\n") + "\n").expect("write received");
    path
}

/// Whether `destination` is an instance of the channel `address`: each parameter is one token
/// of `[A-Za-z0-9_-]`.
fn matches_address(address: &str, destination: &str) -> bool {
    let a: Vec<&str> = address.split('.').collect();
    let d: Vec<&str> = destination.split('.').collect();
    a.len() == d.len()
        && a.iter().zip(&d).all(|(a, d)| {
            if a.starts_with("{") && a.ends_with("}") {
                !d.is_empty()
                    && d.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            } else {
                a == d
            }
        })
}

/// Adds, updates and deletes a ConfigMap in `ns` and reads its three events.
async fn churn(client: &kube::Client, ns: &str, reader: &mut Reader) -> Vec<Received> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm = |v: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "documented.cm"}, "data": {"k": v}});
    let apply = PatchParams::apply("keb-asyncapi-test");
    cms.patch("documented.cm", &apply, &Patch::Apply(&cm("1")))
        .await
        .expect("apply");
    cms.patch("documented.cm", &apply, &Patch::Apply(&cm("2")))
        .await
        .expect("apply");
    cms.delete("documented.cm", &DeleteParams::default())
        .await
        .expect("delete");
    reader
        .read_until(Duration::from_secs(60), |got| {
            got.iter().any(|r| r.change() == "deleted")
        })
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn published_events_match_the_documented_channels_and_messages() {
    let client = kube_client().await;
    let ns = unique_namespace(&client, "asyncapi-events").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let resources =
        format!("resources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n");
    for (name, binary) in [("kafka", true), ("nats", true), ("nats-structured", false)] {
        let cluster = unique_name("asyncapi");
        let sink = match name {
            "kafka" => sink_yaml(SinkKind::Kafka, &cluster)
                .replace("{group}.{resource}", "{resource}.{namespace}"),
            "nats" => sink_yaml(SinkKind::Nats, &cluster),
            _ => sink_yaml(SinkKind::Nats, &cluster).replace(
                "    jetstream:",
                "    contentMode: structured\n    jetstream:",
            ),
        };
        let config = format!("cluster: {cluster}\n{resources}{sink}");
        let (path, doc) = generate(dir.path(), name, &config);
        let channel = doc["channels"]
            .as_object()
            .and_then(|c| c.values().next())
            .expect("one channel");
        let address = channel["address"].as_str().expect("an address").to_string();
        let mut bridge = Bridge::start(&config);
        bridge.wait_synced(1).await;
        let mut reader = match name {
            "kafka" => Reader::kafka(std::slice::from_ref(&address)).await,
            _ => Reader::nats(&cluster).await,
        };
        let got = churn(&client, &ns, &mut reader).await;
        assert_eq!(got.len(), 3, "{name}: {got:?}");
        for r in &got {
            assert!(
                matches_address(&address, &r.destination),
                "{name}: {} is not an instance of {address}",
                r.destination
            );
        }
        let received = write_received(dir.path(), name, "v1.configmaps", &got, binary);
        let (ok, output) = validate(&path, Some(&received));
        assert!(
            ok,
            "{name}: received events do not match the document:\n{output}"
        );
        assert!(
            output.contains("3 received messages checked, 0 mismatches"),
            "{output}"
        );
    }
}
