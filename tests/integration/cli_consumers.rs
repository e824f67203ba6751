//! The kcat and nats CLI one-liners of docs/consumers.md ("From the command line"), read from the
//! doc and run as written against events the bridge published to the real Kafka and NATS: only
//! the doc's example names (`my-cluster`, `KUBE_EVENTS`, namespace `shop`) are replaced by the
//! test's own. A doc command that stops working, or shows something else, fails here.
//!
//! kcat comes from `KEB_KCAT`, the nats CLI from `KEB_NATS_CLI` (both built by `scripts/testenv`);
//! without them the tests fail.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::{Bridge, SinkKind, sink_yaml, stream_name};
use crate::support::{self, kube_client, unique_name, unique_namespace, wait_until};

/// The section of docs/consumers.md whose `sh` blocks are tested here.
const SECTION: &str = "## From the command line: kcat and the nats CLI";

/// The one-line commands of the section's `sh` blocks, in the doc's order.
fn doc_commands() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/consumers.md");
    let doc = std::fs::read_to_string(&path).expect("read docs/consumers.md");
    let start = doc
        .find(SECTION)
        .unwrap_or_else(|| panic!("docs/consumers.md has no section {SECTION:?}"));
    let body = &doc[start + SECTION.len()..];
    let body = &body[..body.find("\n## ").unwrap_or(body.len())];
    let commands: Vec<String> = body
        .split("```sh\n")
        .skip(1)
        .map(|block| {
            let block = &block[..block.find("```").expect("a closed block")];
            let lines: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty()).collect();
            assert_eq!(lines.len(), 1, "one command per block: {block}");
            lines[0].to_string()
        })
        .collect();
    assert_eq!(commands.len(), 4, "the section's commands: {commands:#?}");
    commands
}

/// The doc's command whose text contains `marker`, with its example names replaced.
fn doc_command(marker: &str, names: &[(&str, &str)]) -> String {
    let mut found: Vec<String> = doc_commands()
        .into_iter()
        .filter(|c| c.contains(marker))
        .collect();
    assert_eq!(found.len(), 1, "one doc command with {marker:?}: {found:?}");
    let mut command = found.remove(0);
    for (example, ours) in names {
        command = command.replace(example, ours);
    }
    command
}

/// A directory holding `kcat` and `nats`, links to the tools `scripts/testenv` built, to put
/// first on PATH so that the doc's commands run unchanged.
fn tools_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, var) in [("kcat", "KEB_KCAT"), ("nats", "KEB_NATS_CLI")] {
        let path = match std::env::var(var) {
            Ok(p) if Path::new(&p).is_file() => PathBuf::from(p),
            Ok(p) => panic!(
                "{name} is not available ({var}={p} does not exist): run `scripts/testenv up` \
                 (it builds it) and load its variables"
            ),
            Err(_) => panic!(
                "{name} is not available ({var} is not set): run `scripts/testenv up` and load \
                 its variables (`eval \"$(scripts/testenv env)\"`)"
            ),
        };
        std::os::unix::fs::symlink(&path, dir.path().join(name)).expect("link a tool");
    }
    dir
}

/// `bash -c command` with the tools first on PATH and the test environment's variables.
fn shell(tools: &Path, command: &str) -> Command {
    let path = format!(
        "{}:{}",
        tools.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut shell = Command::new("bash");
    shell
        .args(["-o", "pipefail", "-c", command])
        .env("PATH", path)
        .env("KAFKA_BOOTSTRAP_SERVERS", support::env().kafka_bootstrap)
        .env("NATS_URL", support::env().nats_url);
    shell
}

/// Runs a command that exits (kcat's): its standard output, or a panic with its error.
fn run(tools: &Path, command: &str) -> String {
    let out = shell(tools, command)
        .output()
        .unwrap_or_else(|e| panic!("cannot run bash: {e}"));
    assert!(
        out.status.success(),
        "{command} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a command that follows (nats subscribe) until its output satisfies `done`, then stops
/// it; panics with what it printed after a minute.
async fn follow(tools: &Path, command: &str, done: impl Fn(&str) -> bool) -> String {
    let mut child = shell(tools, &format!("exec {command}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command}: {e}"));
    let printed = Arc::new(Mutex::new(String::new()));
    let stdout = child.stdout.take().expect("stdout");
    let sink = printed.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let mut printed = sink.lock().unwrap();
            printed.push_str(&line);
            printed.push('\n');
        }
    });
    let result = wait_until(command, Duration::from_secs(60), || {
        let printed = printed.lock().unwrap().clone();
        if let Some(status) = child.try_wait().expect("child status") {
            panic!("{command} exited ({status}) while following:\n{printed}");
        }
        let finished = done(&printed).then_some(printed);
        async move { finished }
    })
    .await;
    child.kill().expect("stop the command");
    let status = child.wait().expect("wait for the command");
    assert!(!status.success(), "stopped by a signal");
    reader.join().expect("reader");
    result
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": "0"}})).unwrap()
}

/// What the bridge was shown: ConfigMaps `a`, `b`, `c` created, `a` modified, `b` deleted. Uid
/// and resourceVersion of each, after those changes (`b`: before its delete).
struct Changes {
    namespace: String,
    objects: BTreeMap<String, (String, String)>,
}

/// Runs a bridge with `config` (its `{ns}` replaced by a fresh namespace) through [`Changes`];
/// the bridge keeps running until dropped.
async fn changes_through_a_bridge(config: impl Fn(&str) -> String) -> (Bridge, Changes) {
    let client = kube_client().await;
    let namespace = unique_namespace(&client, "cli").await;
    let mut bridge = Bridge::start(&config(&namespace));
    bridge.wait_synced(1).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let mut objects = BTreeMap::new();
    for name in ["a", "b", "c"] {
        let made = cms.create(&PostParams::default(), &cm(name)).await.unwrap();
        let meta = made.metadata;
        objects.insert(
            name.to_string(),
            (meta.uid.unwrap(), meta.resource_version.unwrap()),
        );
    }
    let patch = Patch::Merge(json!({"data": {"v": "1"}}));
    let patched = cms
        .patch("a", &PatchParams::default(), &patch)
        .await
        .unwrap();
    objects.get_mut("a").unwrap().1 = patched.metadata.resource_version.unwrap();
    cms.delete("b", &DeleteParams::default()).await.unwrap();
    (bridge, Changes { namespace, objects })
}

#[tokio::test(flavor = "multi_thread")]
async fn kcat_reads_a_topic_from_the_start_with_keys_and_headers() {
    let tools = tools_dir();
    let cluster = unique_name("cli");
    support::create_topic(&format!("k8s.{cluster}.core.configmaps"), 3).await;
    let (bridge, changes) = changes_through_a_bridge(|ns| {
        format!(
            "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}",
            sink_yaml(SinkKind::Kafka, &cluster)
        )
    })
    .await;
    let command = doc_command("-f 'partition", &[("my-cluster", &cluster)]);
    let (a, b, c) = (
        &changes.objects["a"],
        &changes.objects["b"],
        &changes.objects["c"],
    );
    let printed = wait_until(
        "kcat shows the five events",
        Duration::from_secs(60),
        || {
            let printed = run(tools.path(), &command);
            async move { (printed.matches("partition ").count() >= 5).then_some(printed) }
        },
    )
    .await;
    assert_eq!(printed.matches("partition ").count(), 5, "{printed}");
    for (uid, _) in [a, b, c] {
        assert!(
            printed.contains(&format!("key {uid}\n")),
            "{uid}: {printed}"
        );
    }
    for id in [
        format!("ce_id={}:{}:modified", a.0, a.1),
        format!("ce_id={}:{}:added", c.0, c.1),
        format!("ce_id={}:", b.0),
        "ce_type=io.kubeeventbridge.object.deleted".to_string(),
    ] {
        assert!(printed.contains(&id), "{id}: {printed}");
    }
    assert!(
        printed.contains(&format!("\"namespace\":\"{}\"", changes.namespace)),
        "the bodies are the objects: {printed}"
    );
    drop(bridge);
}

#[tokio::test(flavor = "multi_thread")]
async fn kcat_lists_the_objects_a_compacted_topic_holds() {
    let tools = tools_dir();
    let cluster = unique_name("cli");
    // Created plainly: what the doc's command shows does not depend on compaction having run.
    support::create_topic(&format!("state.{cluster}.configmaps"), 3).await;
    let (bridge, changes) = changes_through_a_bridge(|ns| {
        format!(
            "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}], \
             topic: \"state.{{cluster}}.{{resource}}\", key: namespacedName, tombstones: true}}\n{}",
            sink_yaml(SinkKind::Kafka, &cluster)
        )
    })
    .await;
    let command = doc_command("awk", &[("my-cluster", &cluster)]);
    let ns = &changes.namespace;
    let expected = format!("{ns}/a\n{ns}/c\n");
    let printed = wait_until(
        "kcat lists the objects that exist",
        Duration::from_secs(60),
        || {
            let printed = run(tools.path(), &command);
            let expected = expected.clone();
            async move { (printed == expected).then_some(printed) }
        },
    )
    .await;
    assert_eq!(printed, expected);
    drop(bridge);
}

/// The messages natscli printed (one `Received JetStream message` line each).
fn received(printed: &str) -> usize {
    printed.matches("Received JetStream message").count()
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_cli_follows_a_subject_and_shows_the_last_event_of_each_object() {
    let tools = tools_dir();
    let cluster = unique_name("cli");
    let (bridge, changes) = changes_through_a_bridge(|ns| {
        format!(
            "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}",
            sink_yaml(SinkKind::Nats, &cluster)
        )
    })
    .await;
    let names = [
        ("my-cluster", cluster.as_str()),
        ("KUBE_EVENTS", &stream_name(&cluster)),
        ("shop", changes.namespace.as_str()),
    ];
    let (a, b, c) = (
        &changes.objects["a"],
        &changes.objects["b"],
        &changes.objects["c"],
    );

    // Every event from the stream's start, then a new one as it comes.
    let all = doc_command("--all", &names);
    let printed = follow(tools.path(), &all, |p| received(p) >= 5).await;
    assert_eq!(received(&printed), 5, "{printed}");
    for id in [
        format!("{}:{}:modified", a.0, a.1),
        format!("{}:{}:added", c.0, c.1),
        format!("{}:", b.0),
    ] {
        assert!(printed.contains(&id), "{id}: {printed}");
    }

    // The last event of each object: a modified, b deleted, c added.
    let last = doc_command("--last-per-subject", &names);
    let printed = follow(tools.path(), &last, |p| received(p) >= 3).await;
    assert_eq!(received(&printed), 3, "{printed}");
    for id in [
        format!("{}:{}:modified", a.0, a.1),
        format!("{}:{}:added", c.0, c.1),
    ] {
        assert!(printed.contains(&id), "{id}: {printed}");
    }
    assert!(
        printed.contains("io.kubeeventbridge.object.deleted"),
        "b's last event is its delete: {printed}"
    );
    drop(bridge);
}
