//! The commands on a fleet (issue 31), against the test environment's API server (the bridge's
//! own cluster, the hub) and extra clusters (`support::ExtraCluster`):
//!
//! - `rbac --cluster` of a member, applied there: SubjectAccessReviews as the bridge's
//!   ServiceAccount answer what it needs (and nothing more), and a bridge holding only that
//!   ServiceAccount's token for the member publishes its objects; `rbac` of the hub grants the
//!   Leases and the kubeconfig Secrets in their one namespace; a cluster a kubeconfig Secret
//!   names is resolved through it;
//! - `check-config --cluster` plans each configured cluster, names one that cannot be reached and
//!   fails; `--only` checks one, also a Secret's;
//! - `tail` follows the configured clusters and, through a wildcard, those of the Secrets (NATS
//!   and Kafka), printing each event's cluster; `--cluster` follows one;
//! - `asyncapi` of a fleet passes the AsyncAPI parser, and the events the bridge publishes from a
//!   configured cluster and from a Secret's match their messages.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::config::Kubeconfig;
use serde_json::{Value, json};

use crate::access_review::{Access, apply, assert_reviews};
use crate::asyncapi::{generate, validate, write_received};
use crate::harness::{Bridge, Reader, Received, SinkKind, bin, run_cli, sink_yaml};
use crate::support::{ExtraCluster, env, kube_client, unique_name, unique_namespace, wait_until};

/// How long a step that waits for the bridge or `tail` may take.
const STEP: Duration = Duration::from_secs(90);

/// Writes `text` to `dir/name` and returns the path as a string.
fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a file");
    path.to_str().expect("a UTF-8 path").to_string()
}

/// The start of a configuration whose own cluster, `hub`, is the test environment's.
fn hub(name: &str) -> String {
    format!(
        "cluster: {name}\nkubernetes: {{kubeconfig: {}}}\n",
        env().kubeconfig
    )
}

/// Creates the namespace `name` in the cluster `client` reaches.
async fn namespace(client: &kube::Client, name: &str) {
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("a Namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("cannot create namespace {name}: {e}"));
}

/// Creates the ServiceAccount `namespace/name`.
async fn service_account(client: &kube::Client, namespace: &str, name: &str) {
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..ObjectMeta::default()
                },
                ..ServiceAccount::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("cannot create ServiceAccount {namespace}/{name}: {e}"));
}

/// Cluster API's kubeconfig Secret of `cluster` in `namespace` of the hub: `<cluster>-kubeconfig`,
/// key `value`.
async fn kubeconfig_secret(hub: &kube::Client, namespace: &str, cluster: &str, kubeconfig: &str) {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(format!("{cluster}-kubeconfig")),
            ..ObjectMeta::default()
        },
        data: Some(
            [(
                "value".to_string(),
                ByteString(kubeconfig.as_bytes().to_vec()),
            )]
            .into(),
        ),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(hub.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("cannot create Secret {namespace}/{cluster}-kubeconfig: {e}"));
}

/// Creates ConfigMap `namespace/name`.
async fn config_map(client: &kube::Client, namespace: &str, name: &str) {
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}}))
            .expect("a ConfigMap");
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap_or_else(|e| panic!("cannot create ConfigMap {namespace}/{name}: {e}"));
}

/// The YAML documents of `kube-event-bridge rbac` output, without its comments.
fn documents(rendered: &str) -> Vec<Value> {
    serde_saphyr::from_str_multiple::<Value, Vec<Value>>(rendered)
        .expect("rendered YAML")
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// Runs `kube-event-bridge rbac` and returns its output; panics with its error otherwise.
fn rbac(args: &[&str]) -> String {
    let (status, stdout, stderr) = run_cli(&[&["rbac"], args].concat());
    assert!(status.success(), "rbac {args:?} failed: {stderr}");
    stdout
}

/// A kubeconfig reaching `cluster` with a ServiceAccount token instead of its admin
/// certificate.
fn token_kubeconfig(cluster: &ExtraCluster, token: &str) -> String {
    let admin = Kubeconfig::from_yaml(&cluster.kubeconfig_text).expect("a kubeconfig");
    let ca = admin.clusters[0]
        .cluster
        .as_ref()
        .and_then(|c| c.certificate_authority_data.clone())
        .expect("the kubeconfig embeds its CA");
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: '{}', certificate-authority-data: '{ca}'}}\n\
         users:\n- name: bridge\n  user: {{token: '{token}'}}\ncontexts:\n- name: bridge\n  context: {{cluster: c, user: bridge}}\n\
         current-context: bridge\n",
        cluster.url
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn rbac_of_a_member_lets_the_bridge_watch_what_it_watches_there_and_nothing_more() {
    let hub_client = kube_client().await;
    let east = ExtraCluster::add("rbac-east").await;
    let east_client = east.client().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (hub_name, east_name) = (unique_name("hub"), unique_name("east"));
    // The bridge runs in `home` of the hub, and is a ServiceAccount of the same name in east.
    let home = unique_namespace(&hub_client, "rbac-home").await;
    namespace(&east_client, &home).await;
    let shop = unique_namespace(&east_client, "rbac-shop").await;
    let other = unique_namespace(&east_client, "rbac-other").await;
    let fleet = unique_namespace(&hub_client, "rbac-fleet").await;
    let sa = "bridge";
    service_account(&east_client, &home, sa).await;
    let resources = format!(
        "resources:\n\
         - {{apiVersion: v1, resource: configmaps}}\n\
         - {{apiVersion: apps/v1, resource: Deployment, namespaces: [{shop}], clusters: [{east_name}]}}\n\
         - {{apiVersion: v1, resource: pods, clusters: [{hub_name}]}}\n"
    );
    let config = format!(
        "{}leaderElection: {{enabled: true}}\nclusters:\n- {{name: {hub_name}}}\n- {{name: {east_name}, kubeconfig: {}}}\n\
         clusterSecrets: {{namespace: {fleet}}}\n{resources}",
        hub(&hub_name),
        east.kubeconfig.display()
    );
    let path = write(dir.path(), "fleet.yaml", &config);
    let common = [
        "--config",
        &path,
        "--service-account",
        sa,
        "--namespace",
        &home,
    ];

    let rendered = rbac(&[&common[..], &["--cluster", &east_name]].concat());
    assert!(
        rendered.starts_with(&format!(
            "# Cluster {east_name} of the fleet; apply it there."
        )),
        "{rendered}"
    );
    assert!(
        !rendered.contains("leases") && !rendered.contains("secrets"),
        "a member gets no Lease nor Secret:\n{rendered}"
    );
    apply(&east_client, &rendered).await;
    let mut questions = Vec::new();
    for verb in ["list", "watch"] {
        questions.push(Access::new(verb, "", "configmaps", None).allowed());
        questions.push(Access::new(verb, "apps", "deployments", Some(&shop)).allowed());
        questions.push(Access::new(verb, "apps", "deployments", Some(&other)));
        questions.push(Access::new(verb, "apps", "deployments", None));
        // Watched in the hub only.
        questions.push(Access::new(verb, "", "pods", None));
        questions.push(Access::new(verb, "", "secrets", Some(&other)));
    }
    questions.push(
        Access::new("get", "", "namespaces", Some("kube-system"))
            .named("kube-system")
            .allowed(),
    );
    questions.push(Access::new("get", "", "configmaps", Some(&other)).named("x"));
    questions.push(Access::new("create", "", "configmaps", Some(&other)));
    for verb in ["get", "create", "update", "list"] {
        questions.push(Access::new(
            verb,
            "coordination.k8s.io",
            "leases",
            Some(&home),
        ));
    }
    assert_reviews(&east_client, &home, sa, &questions).await;

    // The bridge with nothing but that ServiceAccount's token for east publishes east's objects.
    let token = Api::<ServiceAccount>::namespaced(east_client.clone(), &home)
        .create_token_request(
            sa,
            &PostParams::default(),
            &TokenRequest {
                spec: TokenRequestSpec {
                    audiences: Vec::new(),
                    expiration_seconds: Some(3600),
                    ..TokenRequestSpec::default()
                },
                ..TokenRequest::default()
            },
        )
        .await
        .expect("a token for the bridge's ServiceAccount")
        .status
        .expect("a token")
        .token;
    let kubeconfig = write(
        dir.path(),
        "east-token.kubeconfig",
        &token_kubeconfig(&east, &token),
    );
    let watched = unique_name("watched");
    config_map(&east_client, &other, &watched).await;
    // Namespaces the hub barely uses, so that its snapshot stays small.
    let run = format!(
        "{}clusters:\n- {{name: {hub_name}}}\n- {{name: {east_name}, kubeconfig: {kubeconfig}}}\n\
         resources:\n\
         - {{apiVersion: v1, resource: configmaps, namespaces: [{other}]}}\n\
         - {{apiVersion: apps/v1, resource: Deployment, namespaces: [{shop}], clusters: [{east_name}]}}\n\
         checkpoint: {{enabled: false}}\n",
        hub(&hub_name)
    );
    let bridge = Bridge::start(&run);
    let mut reader = Reader::stdout(&bridge);
    let got = reader
        .read_until(STEP, |got| {
            got.iter()
                .any(|r| r.ext("cluster") == east_name && r.ext("name") == watched)
        })
        .await;
    let east_events: Vec<&Received> = got
        .iter()
        .filter(|r| r.ext("cluster") == east_name)
        .collect();
    assert!(
        east_events.iter().all(|r| r.ext("clusterid").len() == 36),
        "east's identity was read: {:?}",
        east_events.first().map(|r| r.ext("clusterid"))
    );
    let log = bridge.log_text();
    assert!(
        !log.contains("Forbidden") && !log.contains("forbidden"),
        "{log}"
    );
    drop(bridge);

    // The hub: its resources, the Leases at home, the kubeconfig Secrets in their namespace.
    service_account(&hub_client, &home, sa).await;
    let own = rbac(&common);
    assert_eq!(
        rbac(&[&common[..], &["--cluster", &hub_name]].concat()),
        own
    );
    apply(&hub_client, &own).await;
    let mut questions = Vec::new();
    for verb in ["list", "watch"] {
        questions.push(Access::new(verb, "", "configmaps", None).allowed());
        questions.push(Access::new(verb, "", "pods", None).allowed());
        questions.push(Access::new(verb, "apps", "deployments", None));
        questions.push(Access::new(verb, "", "secrets", Some(&fleet)).allowed());
        questions.push(Access::new(verb, "", "secrets", Some(&home)));
        questions.push(Access::new(verb, "", "secrets", None));
    }
    questions.push(
        Access::new("get", "", "secrets", Some(&fleet))
            .named("x-kubeconfig")
            .allowed(),
    );
    for verb in ["create", "update", "delete"] {
        questions.push(Access::new(verb, "", "secrets", Some(&fleet)));
    }
    for verb in ["get", "create", "update"] {
        questions.push(Access::new(verb, "coordination.k8s.io", "leases", Some(&home)).allowed());
    }
    questions.push(Access::new(
        "list",
        "coordination.k8s.io",
        "leases",
        Some(&home),
    ));
    questions.push(Access::new(
        "get",
        "coordination.k8s.io",
        "leases",
        Some(&fleet),
    ));
    questions.push(
        Access::new("get", "", "namespaces", Some("kube-system"))
            .named("kube-system")
            .allowed(),
    );
    assert_reviews(&hub_client, &home, sa, &questions).await;

    // A cluster a kubeconfig Secret names is resolved through it: east again, as `later`.
    let later = unique_name("later");
    kubeconfig_secret(&hub_client, &fleet, &later, &east.kubeconfig_text).await;
    let by_secret = config
        .replace(
            &format!(
                "- {{name: {east_name}, kubeconfig: {}}}\n",
                east.kubeconfig.display()
            ),
            "",
        )
        .replace(&east_name, &later);
    let path = write(dir.path(), "secrets.yaml", &by_secret);
    let common = [
        "--config",
        &path,
        "--service-account",
        sa,
        "--namespace",
        &home,
    ];
    let from_secret = rbac(&[&common[..], &["--cluster", &later]].concat());
    assert_eq!(
        documents(&from_secret),
        documents(&rendered),
        "{from_secret}"
    );
    let refused = |cluster: &str| {
        let (status, _, stderr) =
            run_cli(&[&["rbac"][..], &common[..], &["--cluster", cluster]].concat());
        assert!(!status.success(), "rbac --cluster {cluster} succeeded");
        stderr
    };
    let stderr = refused("missing-1");
    assert!(
        stderr.contains(&format!(
            "cluster missing-1: no kubeconfig Secret in namespace {fleet} names it"
        )),
        "{stderr}"
    );
    let stderr = refused("Not_A_Label");
    assert!(
        stderr.contains("\"Not_A_Label\" is not listed in clusters[] and is not a DNS label"),
        "{stderr}"
    );

    let name = kube_event_bridge::rbac::role_name(sa, &home);
    let dp = DeleteParams::default();
    let _ = Api::<ClusterRoleBinding>::all(hub_client.clone())
        .delete(&name, &dp)
        .await;
    let _ = Api::<ClusterRole>::all(hub_client.clone())
        .delete(&name, &dp)
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn check_config_plans_each_cluster_and_names_the_one_it_cannot_reach() {
    let hub_client = kube_client().await;
    let east = ExtraCluster::add("check-east").await;
    let west = ExtraCluster::add("check-west").await;
    west.stop().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (hub_name, east_name, west_name) =
        (unique_name("hub"), unique_name("east"), unique_name("west"));
    let fleet = unique_namespace(&hub_client, "check-fleet").await;
    let later = unique_name("later");
    kubeconfig_secret(&hub_client, &fleet, &later, &east.kubeconfig_text).await;
    let config = format!(
        "{}clusters:\n- {{name: {hub_name}}}\n- {{name: {east_name}, kubeconfig: {}}}\n- {{name: {west_name}, kubeconfig: {}}}\n\
         clusterSecrets: {{namespace: {fleet}}}\n\
         resources:\n\
         - {{apiVersion: v1, resource: configmaps, namespaces: [shop]}}\n\
         - {{apiVersion: apps/v1, resource: deployments, clusters: [{east_name}, {later}]}}\n\
         - {{apiVersion: v1, resource: pods, clusters: [{hub_name}, {west_name}]}}\n\
         - {{apiVersion: nowhere.example.com/v1, resource: widgets, clusters: [{east_name}]}}\n\
         sink: {{kafka: {{bootstrapServers: 'x:1', topic: 'k8s.{{cluster}}.{{resource}}'}}}}\n",
        hub(&hub_name),
        east.kubeconfig.display(),
        west.kubeconfig.display(),
    );
    let path = write(dir.path(), "fleet.yaml", &config);

    let (status, stdout, stderr) = run_cli(&["check-config", "--cluster", &path]);
    assert!(
        !status.success(),
        "an unreachable cluster fails the check:\n{stdout}"
    );
    assert!(
        stderr.contains(&format!("cannot reach cluster {west_name} (see above)")),
        "{stderr}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let section = |name: &str| -> Vec<&str> {
        let start = lines
            .iter()
            .position(|l| l.starts_with(&format!("cluster {name} (")))
            .unwrap_or_else(|| panic!("no section of {name}:\n{stdout}"));
        lines[start + 1..]
            .iter()
            .take_while(|l| l.starts_with("  "))
            .copied()
            .collect()
    };
    assert!(
        lines[0].ends_with(&format!(
            "valid; plan for the fleet's clusters {hub_name}, {east_name}, {west_name}:"
        )),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("cluster {hub_name} (the bridge's own cluster):")));
    let hub_plan = section(&hub_name);
    assert_eq!(hub_plan.len(), 2, "{stdout}");
    assert!(
        hub_plan[0].contains("v1/configmaps kind=ConfigMap scope=Namespaced namespaces=shop")
            && hub_plan[0].ends_with(&format!("-> kafka topic k8s.{hub_name}.configmaps")),
        "{stdout}"
    );
    assert!(
        hub_plan[1].starts_with("  v1/pods kind=Pod")
            && hub_plan[1].ends_with(&format!("-> kafka topic k8s.{hub_name}.pods")),
        "{stdout}"
    );
    let east_plan = section(&east_name);
    assert_eq!(east_plan.len(), 3, "{stdout}");
    assert!(
        east_plan[0].ends_with(&format!("-> kafka topic k8s.{east_name}.configmaps")),
        "{stdout}"
    );
    assert!(
        east_plan[1].starts_with("  apps/v1/deployments kind=Deployment")
            && east_plan[1].ends_with(&format!("-> kafka topic k8s.{east_name}.deployments")),
        "{stdout}"
    );
    assert!(
        east_plan[2].starts_with(
            "  not watched here: resources[3].apiVersion: nowhere.example.com/v1 is not served"
        ),
        "{stdout}"
    );
    let west_plan = section(&west_name);
    assert_eq!(west_plan.len(), 1, "{stdout}");
    assert!(
        west_plan[0].starts_with(&format!("  cannot reach: cluster {west_name}")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "clusters from kubeconfig Secrets in namespace {fleet}: resolved when the bridge runs; each watches resources[0], resources[1]"
        )),
        "{stdout}"
    );
    assert!(
        !stdout.contains("client-key-data") && !stdout.contains("BEGIN"),
        "{stdout}"
    );

    // One cluster at a time: a reachable one passes, the stopped one fails naming it.
    let (status, stdout, stderr) = run_cli(&["check-config", "--only", &east_name, &path]);
    assert!(status.success(), "{stderr}");
    assert!(
        stdout.contains(&format!("plan for the fleet's cluster {east_name}:")),
        "{stdout}"
    );
    assert!(
        !stdout.contains(&hub_name) && !stdout.contains("kubeconfig Secrets"),
        "{stdout}"
    );
    let (status, _, stderr) = run_cli(&["check-config", "--only", &west_name, &path]);
    assert!(!status.success());
    assert!(
        stderr.contains(&format!("cannot reach cluster {west_name}")),
        "{stderr}"
    );
    // A Secret's cluster, reached through its kubeconfig: east again.
    let (status, stdout, stderr) = run_cli(&["check-config", "--only", &later, &path]);
    assert!(status.success(), "{stderr}");
    assert!(
        stdout.contains(&format!(
            "cluster {later} (kubeconfig Secret in namespace {fleet}):"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("-> kafka topic k8s.{later}.deployments")),
        "{stdout}"
    );
    let (status, _, stderr) = run_cli(&["check-config", "--only", "Nope_1", &path]);
    assert!(!status.success());
    assert!(
        stderr.contains("\"Nope_1\" is not listed in clusters[]"),
        "{stderr}"
    );

    // Without a fleet, --only names the one cluster.
    let single = write(
        dir.path(),
        "single.yaml",
        &format!(
            "{}resources: [{{apiVersion: v1, resource: configmaps}}]\n",
            hub(&hub_name)
        ),
    );
    let (status, stdout, stderr) = run_cli(&["check-config", "--only", &hub_name, &single]);
    assert!(status.success(), "{stderr}");
    assert!(
        stdout.contains(&format!("valid; plan for cluster {hub_name}:")),
        "{stdout}"
    );
    let (status, _, stderr) = run_cli(&["check-config", "--only", "prod", &single]);
    assert!(!status.success());
    assert!(
        stderr.contains(&format!(
            "cluster \"prod\" is not a cluster of this configuration ({hub_name})"
        )),
        "{stderr}"
    );
}

/// `kube-event-bridge tail` running on `config`, its output in files; killed when dropped.
struct Tail {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Tail {
    fn start(dir: &Path, config: &str, args: &[&str]) -> Tail {
        let name = unique_name("tail");
        let stdout = dir.join(format!("{name}.out"));
        let stderr = dir.join(format!("{name}.err"));
        let child = Command::new(bin())
            .args(["tail", "--config", config])
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("start tail");
        Tail {
            child,
            stdout,
            stderr,
        }
    }

    /// Its lines so far, each with its words joined by one space (tail pads the change).
    fn lines(&mut self) -> Vec<String> {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "tail exited ({status}): {}{}",
                std::fs::read_to_string(&self.stdout).unwrap_or_default(),
                std::fs::read_to_string(&self.stderr).unwrap_or_default()
            );
        }
        std::fs::read_to_string(&self.stdout)
            .unwrap_or_default()
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect()
    }

    fn printed(&mut self, needle: &str) -> bool {
        self.lines().iter().any(|l| l.contains(needle))
    }
}

impl Drop for Tail {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Creates ConfigMaps `probe-N` in `namespace` until `tail` prints one as `added` in `cluster`:
/// tail's NATS subscriptions see what is published once they are made, which it does not
/// announce.
async fn until_subscribed(tail: &mut Tail, client: &kube::Client, cluster: &str, namespace: &str) {
    let mut probe = 0;
    wait_until(
        &format!("tail prints the probes of {cluster}"),
        STEP,
        || {
            probe += 1;
            let name = format!("probe-{probe}");
            let client = client.clone();
            let seen = tail.printed(&format!(" added {cluster} v1/ConfigMap {namespace}/probe-"));
            async move {
                if seen {
                    return Some(());
                }
                config_map(&client, namespace, &name).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
                None
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tail_and_asyncapi_cover_the_configured_clusters_and_those_of_the_secrets() {
    let hub_client = kube_client().await;
    let east = ExtraCluster::add("tail-east").await;
    let east_client = east.client().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let hub_name = unique_name("hub");
    // East joins through a Secret, as `later`.
    let later = unique_name("later");
    let fleet = unique_namespace(&hub_client, "tail-fleet").await;
    kubeconfig_secret(&hub_client, &fleet, &later, &east.kubeconfig_text).await;
    let ns = unique_namespace(&hub_client, "tail").await;
    namespace(&east_client, &ns).await;
    let config = format!(
        "{}clusters: [{{name: {hub_name}}}]\nclusterSecrets: {{namespace: {fleet}}}\n\
         resources: [{{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}]\n{}",
        hub(&hub_name),
        sink_yaml(SinkKind::Nats, &hub_name)
    );
    let path = write(dir.path(), "fleet.yaml", &config);

    // The document: the hub's channel, and one with a {cluster} parameter for the Secrets'.
    let (document, doc) = generate(dir.path(), "fleet", &config);
    let (ok, output) = validate(&document, None);
    assert!(ok, "{output}");
    let mut addresses: Vec<&str> = doc["channels"]
        .as_object()
        .expect("channels")
        .values()
        .map(|c| c["address"].as_str().expect("an address"))
        .collect();
    addresses.sort();
    let mut expected = vec![
        format!("k8s.{hub_name}.core.configmaps.{ns}.{{name}}"),
        format!("k8s.{{cluster}}.core.configmaps.{ns}.{{name}}"),
    ];
    expected.sort();
    assert_eq!(addresses, expected);

    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(2).await;
    let mut all = Tail::start(dir.path(), &path, &[]);
    let mut one = Tail::start(dir.path(), &path, &["--cluster", &later]);
    until_subscribed(&mut all, &hub_client, &hub_name, &ns).await;
    until_subscribed(&mut all, &east_client, &later, &ns).await;
    until_subscribed(&mut one, &east_client, &later, &ns).await;
    let (in_hub, in_east) = (unique_name("in-hub"), unique_name("in-east"));
    config_map(&hub_client, &ns, &in_hub).await;
    config_map(&east_client, &ns, &in_east).await;
    wait_until("tail prints both clusters' changes", STEP, || {
        let done = all.printed(&format!(" added {hub_name} v1/ConfigMap {ns}/{in_hub} "))
            && all.printed(&format!(" added {later} v1/ConfigMap {ns}/{in_east} "))
            && one.printed(&format!(" added {later} v1/ConfigMap {ns}/{in_east} "));
        async move { done.then_some(()) }
    })
    .await;
    assert!(
        one.lines()
            .iter()
            .all(|l| l.contains(&format!(" {later} v1/"))),
        "tail --cluster {later} printed another cluster's events:\n{}",
        one.lines().join("\n")
    );
    drop((all, one));

    // What the bridge published matches the document: each cluster's events their message.
    let mut reader = Reader::nats(&hub_name).await;
    let got = reader
        .read_until(STEP, |got| {
            [&in_hub, &in_east]
                .iter()
                .all(|n| got.iter().any(|r| r.ext("name") == **n))
        })
        .await;
    let of = |cluster: &str| -> Vec<Received> {
        got.iter()
            .filter(|r| r.ext("cluster") == cluster)
            .cloned()
            .collect()
    };
    let hub_message = format!("{hub_name}.v1.configmaps");
    for (cluster, message) in [
        (&hub_name, hub_message.as_str()),
        (&later, "discovered.v1.configmaps"),
    ] {
        let events = of(cluster);
        assert!(!events.is_empty(), "no event of {cluster}");
        let received = write_received(dir.path(), cluster, message, &events, true);
        let (ok, output) = validate(&document, Some(&received));
        assert!(ok, "{cluster}'s events do not match {message}:\n{output}");
        assert!(output.contains(", 0 mismatches"), "{output}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tail_on_kafka_follows_a_secret_s_cluster_through_a_topic_pattern() {
    let hub_client = kube_client().await;
    let east = ExtraCluster::add("tail-kafka-east").await;
    let east_client = east.client().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let hub_name = unique_name("hub");
    let later = unique_name("later");
    let fleet = unique_namespace(&hub_client, "tail-kafka-fleet").await;
    kubeconfig_secret(&hub_client, &fleet, &later, &east.kubeconfig_text).await;
    let ns = unique_namespace(&hub_client, "tail-kafka").await;
    namespace(&east_client, &ns).await;
    let config = format!(
        "{}clusters: [{{name: {hub_name}}}]\nclusterSecrets: {{namespace: {fleet}}}\n\
         resources: [{{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}]\n{}",
        hub(&hub_name),
        sink_yaml(SinkKind::Kafka, &hub_name)
    );
    let path = write(dir.path(), "fleet.yaml", &config);
    let (in_hub, in_east) = (unique_name("in-hub"), unique_name("in-east"));
    config_map(&hub_client, &ns, &in_hub).await;
    config_map(&east_client, &ns, &in_east).await;
    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(2).await;
    let topics = [
        format!("k8s.{hub_name}.core.configmaps"),
        format!("k8s.{later}.core.configmaps"),
    ];
    // Both topics hold their snapshot once a reader sees it.
    let mut reader = Reader::kafka(&topics).await;
    reader
        .read_until(STEP, |got| {
            [&in_hub, &in_east]
                .iter()
                .all(|n| got.iter().any(|r| r.ext("name") == **n))
        })
        .await;
    let mut all = Tail::start(dir.path(), &path, &["--from-beginning"]);
    let mut one = Tail::start(
        dir.path(),
        &path,
        &["--from-beginning", "--cluster", &later],
    );
    wait_until("tail prints both clusters' snapshots", STEP, || {
        let done = all.printed(&format!(" added {hub_name} v1/ConfigMap {ns}/{in_hub} "))
            && all.printed(&format!(" added {later} v1/ConfigMap {ns}/{in_east} "))
            && one.printed(&format!(" added {later} v1/ConfigMap {ns}/{in_east} "));
        async move { done.then_some(()) }
    })
    .await;
    assert!(
        !one.printed(&in_hub),
        "tail --cluster {later} printed the hub's event:\n{}",
        one.lines().join("\n")
    );
}
