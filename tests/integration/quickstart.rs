//! The quickstart of docs/deploy.md ("Quickstart: a real cluster"), read from the doc and run as
//! written against the test environment, with only its example names replaced: the image pushed
//! to the registry of `scripts/testenv` by `scripts/image --push`, the chart installed by
//! `helm install` with `examples/quickstart-values.yaml`, a ConfigMap made with `kubectl`, and the
//! event seen by `kube-event-bridge tail`.
//!
//! The test environment has no kubelet, so the test does what the pod would: it pulls the image
//! back from the registry by the reference the Deployment names, and runs from its root filesystem
//! the bridge (the image's command) and the `tail` of the doc's `kubectl exec`, with the
//! ConfigMap the chart installed mounted where the chart mounts it. The image comes from
//! `KEB_IMAGE_DIR`; helm, kubectl and regctl from `KEB_HELM`, `KEB_KUBECTL` and `KEB_REGCTL`, the
//! registry from `KEB_REGISTRY` (all set by `scripts/testenv` and `scripts/test`); without them
//! the test fails.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;

use crate::harness::stream_name;
use crate::image::{
    Image, configuration_directory, output, registry_get, required, running_in_image,
    start_from_image, testenv_tool,
};
use crate::support::{self, kube_client, unique_name, unique_namespace, wait_until};

const SECTION: &str = "## Quickstart: a real cluster";
const END: &str = "### How the quickstart is tested";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The commands of the section's `sh` blocks, one a line, in the doc's order.
fn doc_commands() -> Vec<String> {
    let doc = std::fs::read_to_string(repo().join("docs/deploy.md")).expect("read docs/deploy.md");
    let start = doc
        .find(SECTION)
        .unwrap_or_else(|| panic!("docs/deploy.md has no section {SECTION:?}"));
    let body = &doc[start..];
    let body = &body[..body.find(END).expect("the section's test notes")];
    let mut commands = Vec::new();
    let mut in_block = false;
    for line in body.lines().map(str::trim) {
        match line {
            "```sh" => in_block = true,
            "```" => in_block = false,
            "" => {}
            command if in_block => commands.push(command.to_string()),
            _ => {}
        }
    }
    commands
}

/// The doc's one command starting with `start`.
fn command(commands: &[String], start: &str) -> String {
    let found: Vec<&String> = commands.iter().filter(|c| c.starts_with(start)).collect();
    assert_eq!(
        found.len(),
        1,
        "one doc command starting {start:?}: {commands:#?}"
    );
    found[0].clone()
}

/// A directory holding `helm` and `kubectl`, links to those of `scripts/testenv`, to put first
/// on PATH.
fn tools_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, var) in [("helm", "KEB_HELM"), ("kubectl", "KEB_KUBECTL")] {
        std::os::unix::fs::symlink(testenv_tool(var), dir.path().join(name)).expect("link");
    }
    dir
}

/// Runs `script` with bash (`-e -o pipefail`) in the repository, the tools first on PATH.
fn bash(tools: &Path, script: &str) -> String {
    let path = format!(
        "{}:{}",
        tools.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    output(
        Command::new("bash")
            .args(["-e", "-o", "pipefail", "-c", script])
            .current_dir(repo())
            .env("PATH", path),
    )
}

/// Collects what `from` prints, line by line, in a thread of its own.
fn collect(from: impl std::io::Read + Send + 'static) -> Arc<Mutex<String>> {
    let collected = Arc::new(Mutex::new(String::new()));
    let sink = collected.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            let mut collected = sink.lock().unwrap();
            collected.push_str(&line);
            collected.push('\n');
        }
    });
    collected
}

#[tokio::test(flavor = "multi_thread")]
async fn the_quickstart_pushes_installs_and_tails_a_change() {
    let commands = doc_commands();
    let image = Image::load();
    let registry = required("KEB_REGISTRY", "`scripts/testenv up` starts the registry");
    let tools = tools_dir();
    let client = kube_client().await;
    let release_ns = unique_namespace(&client, "quickstart").await;
    // The namespace the values watch, made by the test (`default` is shared by every test).
    let watched = unique_namespace(&client, "quickstart-default").await;
    let stream = stream_name(&unique_name("quickstart"));
    let cm_api = Api::<ConfigMap>::namespaced(client.clone(), &watched);

    // Every command of the doc is either run below or named here as not run.
    for line in &commands {
        let run = [
            "DIGEST=$(scripts/image --push",
            "helm install",
            "kubectl exec",
            "kubectl create configmap",
        ];
        let not_run = [
            // scripts/test built the image (`--profile release`) before the tests.
            "scripts/image\0",
            // Tested by integration::image::the_image_archive_names_the_image_and_holds_its_blobs.
            "scripts/image --archive",
            // No container engine, no kind or minikube cluster here.
            "kind load",
            "minikube image load",
            // No kubelet: the Deployment never rolls out here.
            "kubectl rollout status",
        ];
        let known = run.iter().any(|s| line.starts_with(s))
            || not_run.iter().any(|s| format!("{line}\0").starts_with(s));
        assert!(
            known,
            "a quickstart command the test neither runs nor names: {line}"
        );
    }

    // The values, with the test's namespace and stream.
    let values = std::fs::read_to_string(repo().join("examples/quickstart-values.yaml"))
        .expect("read the quickstart values");
    assert!(values.contains("namespaces: [default]") && values.contains("stream: KUBE_EVENTS"));
    // A cluster name of its own too: a stream captures every namespace of a cluster's resource.
    let cluster = unique_name("quickstart");
    let values = values
        .replace("config:\n", &format!("config:\n  cluster: {cluster}\n"))
        .replace("namespaces: [default]", &format!("namespaces: [{watched}]"))
        .replace("stream: KUBE_EVENTS", &format!("stream: {stream}"));
    let values_file = tools.path().join("quickstart-values.yaml");
    std::fs::write(&values_file, values).expect("write the values");

    // Push and install, in one shell as a user types them (DIGEST carries over).
    let push = command(&commands, "DIGEST=$(scripts/image --push").replace(
        "scripts/image --push",
        &format!("scripts/image --image-dir {} --push", image.dir.display()),
    );
    let install = command(&commands, "helm install")
        .replace(
            "--namespace kube-event-bridge",
            &format!("--namespace {release_ns}"),
        )
        .replace(
            "examples/quickstart-values.yaml",
            values_file.to_str().expect("UTF-8"),
        )
        .replace("nats://nats.nats.svc:4222", &support::env().nats_url);
    let script =
        format!("{push}\n{install}\necho \"$DIGEST\"\n").replace("registry.example.com", &registry);
    let printed = bash(tools.path(), &script);
    assert!(
        printed.trim_end().ends_with(&image.digest),
        "DIGEST is the image's: {printed}"
    );
    let uninstall = format!("helm uninstall kube-event-bridge --namespace {release_ns}");

    // What the chart installed: the image by digest, which the registry serves.
    let deployment = Api::<Deployment>::namespaced(client.clone(), &release_ns)
        .get("kube-event-bridge")
        .await
        .expect("the chart's Deployment");
    let pod = deployment
        .spec
        .expect("spec")
        .template
        .spec
        .expect("pod spec");
    let reference = pod.containers[0].image.clone().expect("an image");
    let repository = format!("{registry}/platform/kube-event-bridge");
    assert_eq!(reference, format!("{repository}@{}", image.digest));
    let (status, headers, _) = registry_get(
        &registry,
        &format!("/v2/platform/kube-event-bridge/manifests/{}", image.digest),
        "application/vnd.oci.image.manifest.v1+json",
    );
    assert_eq!(status, 200, "the registry serves {reference}: {headers:?}");
    let config_map = pod
        .volumes
        .unwrap_or_default()
        .into_iter()
        .find_map(|v| v.config_map.map(|c| c.name))
        .expect("the configuration's ConfigMap volume");
    let config = Api::<ConfigMap>::namespaced(client.clone(), &release_ns)
        .get(&config_map)
        .await
        .expect("the chart's ConfigMap")
        .data
        .expect("data")
        .remove("config.yaml")
        .expect("config.yaml");

    // The pod, as the kubelet would run it: the image pulled by the Deployment's reference.
    let pulled = tempfile::tempdir().expect("temp dir");
    output(Command::new(testenv_tool("KEB_REGCTL")).args([
        "--host",
        &format!("reg={registry},tls=disabled"),
        "image",
        "copy",
        &reference,
        &format!("ocidir://{}/oci:pulled", pulled.path().display()),
    ]));
    let pulled = Image::in_dir(pulled.path().to_path_buf());
    assert_eq!(pulled.digest, image.digest);
    let rootfs = pulled.unpack();
    let rootfs = rootfs.path().join("rootfs");
    let mut bridge = start_from_image(&pulled, &rootfs, &config, Vec::new());
    bridge.wait_synced(1).await;

    // `kubectl exec ... -- kube-event-bridge tail ...`: the part after `--`, in the container.
    let exec = command(&commands, "kubectl exec");
    let (_, tail) = exec
        .split_once(" -- ")
        .expect("kubectl exec ... -- command");
    let tail: Vec<String> = tail.split_whitespace().map(str::to_string).collect();
    let tail_dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(tail_dir.path().join("bridge.yaml"), &config).expect("write the config");
    let kubeconfig = std::fs::read(support::env().kubeconfig).expect("read the kubeconfig");
    configuration_directory(
        tail_dir.path(),
        pulled.user(),
        &[("kubeconfig", kubeconfig)],
    );
    let mut tail = running_in_image(
        &pulled,
        &rootfs,
        tail_dir.path(),
        &[("KUBECONFIG", "/etc/kube-event-bridge/kubeconfig")],
        &tail,
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("start tail");
    let printed = collect(tail.stdout.take().expect("stdout"));
    let errors = collect(tail.stderr.take().expect("stderr"));
    let mut printed_line = |what: &str, expected: String| {
        let what = what.to_string();
        let printed = printed.clone();
        let errors = errors.clone();
        let exited = tail.try_wait().expect("tail's status");
        async move {
            let printed = printed.lock().unwrap().clone();
            if let Some(status) = exited {
                let errors = errors.lock().unwrap().clone();
                panic!("tail exited ({status}) before {what}; it printed:\n{printed}\n{errors}");
            }
            // tail pads the change to a column: compare words.
            printed
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .find(|l| l.contains(&expected))
        }
    };
    // tail's NATS subscriptions are core ones: it sees what is published once it has subscribed,
    // which it does not announce. Changes of other ConfigMaps tell when it has.
    let mut probe = 0;
    wait_until("tail subscribed", Duration::from_secs(60), || {
        probe += 1;
        let name = format!("probe-{probe}");
        let made = cm_api.clone();
        let seen = printed_line(
            "subscribing",
            format!(" added v1/ConfigMap {watched}/probe-"),
        );
        async move {
            let cm = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))
                .expect("a ConfigMap");
            made.create(&Default::default(), &cm)
                .await
                .expect("create a probe");
            tokio::time::sleep(Duration::from_secs(1)).await;
            seen.await
        }
    })
    .await;

    let create = command(&commands, "kubectl create configmap")
        .replace("--namespace default", &format!("--namespace {watched}"));
    bash(tools.path(), &create);
    let expected = format!(" added v1/ConfigMap {watched}/hello ");
    let line = wait_until("tail prints the change", Duration::from_secs(60), || {
        printed_line("the change", expected.clone())
    })
    .await;
    assert!(line.contains("origin=live"), "{line}");

    tail.kill().expect("stop tail");
    tail.wait().expect("tail exits");
    drop(bridge);
    bash(tools.path(), &uninstall);
}
