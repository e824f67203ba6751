//! Shared helpers for the integration tests: environment variables, clients for the
//! kube-apiserver, Kafka and NATS of the local test environment, unique names, polling,
//! CRDs and Kafka topics, and extra clusters ([`ExtraCluster`]).
//!
//! Every helper panics with a descriptive message instead of returning an error: a test that
//! cannot reach its environment must fail loudly, never pass silently.

// Each test module uses only some of these helpers.
#![allow(dead_code)]

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::StreamConsumer;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use serde_json::json;

/// The version under which [`create_crd`] serves its custom resources.
pub const CRD_VERSION: &str = "v1";

/// Connection details of the test environment, read from the variables that
/// `scripts/testenv up` prints (and writes to `~/.cache/kube-event-bridge/run/env`).
#[derive(Debug, Clone)]
pub struct Env {
    /// Path of the kubeconfig for the kube-apiserver (`KUBECONFIG`).
    pub kubeconfig: String,
    /// Kafka `bootstrap.servers` (`KAFKA_BOOTSTRAP_SERVERS`).
    pub kafka_bootstrap: String,
    /// NATS server URL (`NATS_URL`).
    pub nats_url: String,
    /// Path of a kubectl matching the apiserver (`KEB_KUBECTL`), if set.
    pub kubectl: Option<String>,
}

/// Reads the test environment from `KUBECONFIG`, `KAFKA_BOOTSTRAP_SERVERS`, `NATS_URL` and
/// optionally `KEB_KUBECTL`; panics naming the first missing (or empty) required variable.
pub fn env() -> Env {
    Env {
        kubeconfig: required_var("KUBECONFIG"),
        kafka_bootstrap: required_var("KAFKA_BOOTSTRAP_SERVERS"),
        nats_url: required_var("NATS_URL"),
        kubectl: std::env::var("KEB_KUBECTL")
            .ok()
            .filter(|v| !v.trim().is_empty()),
    }
}

/// Kafka's SASL_PLAINTEXT listener of the test environment (PLAIN mechanism) and its one user.
#[derive(Debug, Clone)]
pub struct KafkaSasl {
    /// `bootstrap.servers` of the SASL listener (`KAFKA_SASL_BOOTSTRAP_SERVERS`).
    pub bootstrap: String,
    /// The user (`KAFKA_SASL_USERNAME`).
    pub username: String,
    /// Its password (`KAFKA_SASL_PASSWORD`).
    pub password: String,
}

/// Reads the SASL listener's variables; panics naming the first missing one.
pub fn kafka_sasl() -> KafkaSasl {
    KafkaSasl {
        bootstrap: required_var("KAFKA_SASL_BOOTSTRAP_SERVERS"),
        username: required_var("KAFKA_SASL_USERNAME"),
        password: required_var("KAFKA_SASL_PASSWORD"),
    }
}

/// Kafka's SASL_SSL listener of the test environment (SCRAM-SHA-512, a certificate signed by the
/// environment's CA) and its one user.
#[derive(Debug, Clone)]
pub struct KafkaScram {
    /// `bootstrap.servers` of the SASL_SSL listener (`KAFKA_SCRAM_BOOTSTRAP_SERVERS`).
    pub bootstrap: String,
    /// The user (`KAFKA_SCRAM_USERNAME`).
    pub username: String,
    /// Its password (`KAFKA_SCRAM_PASSWORD`).
    pub password: String,
}

/// Reads the SASL_SSL listener's variables; panics naming the first missing one.
pub fn kafka_scram() -> KafkaScram {
    KafkaScram {
        bootstrap: required_var("KAFKA_SCRAM_BOOTSTRAP_SERVERS"),
        username: required_var("KAFKA_SCRAM_USERNAME"),
        password: required_var("KAFKA_SCRAM_PASSWORD"),
    }
}

/// The NATS servers of the test environment that require TLS and authentication, their
/// credentials, and credentials no server accepts.
#[derive(Debug, Clone)]
pub struct NatsSecure {
    /// The server with one nkey user (`NATS_TLS_URL`).
    pub nkey_url: String,
    /// That user's seed (`NATS_NKEY_SEED_FILE`).
    pub nkey_seed_file: String,
    /// A valid seed the server does not know (`NATS_NKEY_UNKNOWN_SEED_FILE`).
    pub unknown_seed_file: String,
    /// The server in operator (JWT) mode (`NATS_JWT_URL`).
    pub jwt_url: String,
    /// A user's `.creds` file for it (`NATS_CREDS_FILE`).
    pub creds_file: String,
    /// A `.creds` file of an account the operator never signed (`NATS_UNKNOWN_CREDS_FILE`).
    pub unknown_creds_file: String,
}

/// Reads the secure NATS servers' variables; panics naming the first missing one.
pub fn nats_secure() -> NatsSecure {
    NatsSecure {
        nkey_url: required_var("NATS_TLS_URL"),
        nkey_seed_file: required_var("NATS_NKEY_SEED_FILE"),
        unknown_seed_file: required_var("NATS_NKEY_UNKNOWN_SEED_FILE"),
        jwt_url: required_var("NATS_JWT_URL"),
        creds_file: required_var("NATS_CREDS_FILE"),
        unknown_creds_file: required_var("NATS_UNKNOWN_CREDS_FILE"),
    }
}

/// The CA that signed the certificates of the environment's TLS listeners (`KEB_TESTENV_CA`),
/// and a CA that signed none of them (`KEB_TESTENV_OTHER_CA`).
pub fn testenv_cas() -> (String, String) {
    (
        required_var("KEB_TESTENV_CA"),
        required_var("KEB_TESTENV_OTHER_CA"),
    )
}

/// The value of a required variable, or a panic explaining how to provide it.
fn required_var(name: &str) -> String {
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => value,
        Ok(_) => panic!("{}", missing_var_message(name, "is empty", in_ci())),
        Err(std::env::VarError::NotPresent) => {
            panic!("{}", missing_var_message(name, "is not set", in_ci()))
        }
        Err(std::env::VarError::NotUnicode(_)) => {
            panic!(
                "{}",
                missing_var_message(name, "is not valid UTF-8", in_ci())
            )
        }
    }
}

/// Whether the tests run in CI (where the job, not a developer, provides the environment).
fn in_ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// The panic message for a missing variable; outside CI it says how to start the environment.
fn missing_var_message(name: &str, problem: &str, ci: bool) -> String {
    let mut message = format!(
        "{name} {problem}: the integration tests need the test environment \
         (etcd + kube-apiserver, Kafka, NATS JetStream)"
    );
    if ci {
        message.push_str("; the CI job must start it and export its variables before `cargo test`");
    } else {
        message.push_str(
            ". Start it with `scripts/testenv up`, then load its variables with \
             `. ~/.cache/kube-event-bridge/run/env` before `cargo test --test integration`, \
             or just use `scripts/test`",
        );
    }
    message
}

/// A kube client for the test apiserver, built from the kubeconfig file named by
/// `KUBECONFIG` (explicitly, without kube's config inference).
pub async fn kube_client() -> kube::Client {
    let path = env().kubeconfig;
    let kubeconfig = Kubeconfig::read_from(&path).unwrap_or_else(|e| {
        panic!("cannot read KUBECONFIG={path}: {e} (is the test environment up? `scripts/testenv status`)")
    });
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("invalid kubeconfig {path}: {e}"));
    kube::Client::try_from(config)
        .unwrap_or_else(|e| panic!("cannot build a kube client from {path}: {e}"))
}

/// One more Kubernetes cluster in the test environment (`scripts/testenv cluster add`): another
/// kube-apiserver on the environment's etcd under an etcd prefix of its own, so a brand-new cluster
/// with its own namespaces and uids, trusting the environment's CA and admin certificate.
/// Removed (`scripts/testenv cluster remove`) when dropped.
///
/// The environment is the one whose variables the test has: its state directory is the one of
/// `KEB_TESTENV_FILE`.
#[derive(Debug)]
pub struct ExtraCluster {
    /// Its name in the environment: the prefix given to [`ExtraCluster::add`] and a unique suffix.
    pub name: String,
    /// Its kubeconfig file (`KEB_CLUSTER_<NAME>_KUBECONFIG`).
    pub kubeconfig: PathBuf,
    /// The kubeconfig's text: self-contained (the CA and the credential as data, no file paths),
    /// fit for the `value` key of a Cluster API kubeconfig Secret.
    pub kubeconfig_text: String,
    /// Its API server's URL (`KEB_CLUSTER_<NAME>_URL`), `https://127.0.0.1:<port>`.
    pub url: String,
}

impl ExtraCluster {
    /// Adds and starts a cluster named `unique_name(prefix)` and waits until it is ready and its
    /// `kube-system` and `default` namespaces exist; panics with the script's output if it fails.
    pub async fn add(prefix: &str) -> ExtraCluster {
        Self::add_with_gates(prefix, None).await
    }

    /// As [`ExtraCluster::add`], its API server started with `--feature-gates GATES`
    /// (`WatchList=false`).
    pub async fn add_with_gates(prefix: &str, gates: Option<&str>) -> ExtraCluster {
        let name = unique_name(prefix);
        let mut args = vec!["add", name.as_str()];
        if let Some(gates) = gates {
            args.extend(["--feature-gates", gates]);
        }
        let stdout = testenv_cluster(&args).await;
        // From here on a panic removes the cluster again (Drop).
        let mut cluster = ExtraCluster {
            name,
            kubeconfig: PathBuf::new(),
            kubeconfig_text: String::new(),
            url: String::new(),
        };
        let var = cluster_variable(&cluster.name);
        cluster.kubeconfig = export_value(&stdout, &format!("{var}_KUBECONFIG")).into();
        cluster.url = export_value(&stdout, &format!("{var}_URL"));
        cluster.kubeconfig_text =
            std::fs::read_to_string(&cluster.kubeconfig).unwrap_or_else(|e| {
                panic!(
                    "cannot read the kubeconfig of cluster {} at {}: {e}",
                    cluster.name,
                    cluster.kubeconfig.display()
                )
            });
        cluster
    }

    /// Stops its API server (`scripts/testenv cluster stop`); its data stays in etcd.
    pub async fn stop(&self) {
        testenv_cluster(&["stop", &self.name]).await;
    }

    /// Starts it again on the same port over the same etcd prefix (the same cluster, same uids),
    /// and waits until it is ready (`scripts/testenv cluster start`).
    pub async fn start(&self) {
        testenv_cluster(&["start", &self.name]).await;
    }

    /// `scripts/testenv cluster VERB` on it: `pause` (SIGSTOP: it holds its sockets and answers
    /// nothing), `resume`, or `kill` (SIGKILL; [`ExtraCluster::start`] brings it back).
    pub async fn signal(&self, verb: &str) {
        testenv_cluster(&[verb, &self.name]).await;
    }

    /// A kube client built from [`ExtraCluster::kubeconfig_text`] alone.
    pub async fn client(&self) -> kube::Client {
        let name = &self.name;
        let kubeconfig = Kubeconfig::from_yaml(&self.kubeconfig_text)
            .unwrap_or_else(|e| panic!("the kubeconfig of cluster {name} does not parse: {e}"));
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .unwrap_or_else(|e| panic!("the kubeconfig of cluster {name} is invalid: {e}"));
        kube::Client::try_from(config)
            .unwrap_or_else(|e| panic!("cannot build a kube client for cluster {name}: {e}"))
    }
}

impl Drop for ExtraCluster {
    fn drop(&mut self) {
        let args = ["cluster", "remove", self.name.as_str()];
        let problem = match testenv_command(&args).stdin(Stdio::null()).output() {
            Ok(output) if output.status.success() => return,
            Ok(output) => format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
            Err(e) => e.to_string(),
        };
        let message = format!("scripts/testenv {} failed: {problem}", args.join(" "));
        if std::thread::panicking() {
            eprintln!("{message}");
        } else {
            panic!("{message}");
        }
    }
}

/// `scripts/testenv ARGS` of this checkout, for the environment whose variables the test has
/// (`KEB_TESTENV_DIR` is the directory of `KEB_TESTENV_FILE`).
fn testenv_command(args: &[&str]) -> Command {
    let env_file = PathBuf::from(required_var("KEB_TESTENV_FILE"));
    let dir = env_file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or_else(|| panic!("KEB_TESTENV_FILE={} has no directory", env_file.display()));
    let mut command = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/testenv"));
    command.args(args).env("KEB_TESTENV_DIR", dir);
    command
}

/// Runs `scripts/testenv cluster ARGS` to completion and returns its standard output; panics with
/// its standard error if it fails.
async fn testenv_cluster(args: &[&str]) -> String {
    let args = [&["cluster"], args].concat();
    let mut command = tokio::process::Command::from(testenv_command(&args));
    let output = command
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run scripts/testenv {}: {e}", args.join(" ")));
    assert!(
        output.status.success(),
        "scripts/testenv {} failed ({}):\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap_or_else(|e| panic!("scripts/testenv {} printed no UTF-8: {e}", args.join(" ")))
}

/// The prefix of the variables `scripts/testenv cluster add` prints for cluster `name`.
fn cluster_variable(name: &str) -> String {
    format!(
        "KEB_CLUSTER_{}",
        name.to_ascii_uppercase().replace('-', "_")
    )
}

/// The value of `export VAR=value` in `stdout`, or a panic naming `var`.
fn export_value(stdout: &str, var: &str) -> String {
    let prefix = format!("export {var}=");
    stdout
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .filter(|value| !value.is_empty())
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("scripts/testenv printed no {var}; its output:\n{stdout}"))
}

/// A name unique to this run: `prefix` lowercased and reduced to `[a-z0-9-]`, then `-` and a
/// random hex suffix plus a process-wide counter. The result is a valid DNS-1123 label
/// (at most 63 characters, starts and ends with an alphanumeric), so it also works as a
/// Kafka topic, JetStream stream, KV bucket or NATS subject token.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let suffix = format!("{:08x}{count}", random_u64() as u32);

    let cleaned: String = prefix
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let max_prefix = 63 - 1 - suffix.len();
    let trimmed: String = cleaned
        .trim_start_matches('-')
        .chars()
        .take(max_prefix)
        .collect();
    let trimmed = trimmed.trim_end_matches('-');
    let prefix = if trimmed.is_empty() { "t" } else { trimmed };
    format!("{prefix}-{suffix}")
}

/// 64 random bits from std's randomly keyed hasher, mixed with the clock, pid and a counter.
fn random_u64() -> u64 {
    static SALT: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(SALT.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    hasher.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}

/// Creates a fresh namespace named `unique_name(prefix)` and returns its name. Namespaces are
/// never deleted: without controllers beside the bare apiserver they would never finish
/// terminating, so every test works in namespaces of its own.
pub async fn unique_namespace(client: &kube::Client, prefix: &str) -> String {
    let name = unique_name(prefix);
    let namespace: Namespace = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": { "test.kube-event-bridge.dev/integration": "true" },
        }
    }))
    .expect("namespace manifest");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap_or_else(|e| panic!("cannot create namespace {name}: {e}"));
    name
}

/// Creates a ConfigMap `{"v": "0"}` for each of `names` in `ns`, 32 requests at a time.
pub async fn create_configmaps(
    client: &kube::Client,
    ns: &str,
    names: impl Iterator<Item = String>,
) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let pp = PostParams::default();
    futures::stream::iter(names)
        .map(|name| {
            let (cms, pp) = (&cms, &pp);
            async move {
                let object = json!({"metadata": {"name": name}, "data": {"v": "0"}});
                let object: ConfigMap = serde_json::from_value(object).expect("ConfigMap");
                cms.create(pp, &object)
                    .await
                    .unwrap_or_else(|e| panic!("create {ns}/{name}: {e}"))
            }
        })
        .buffer_unordered(32)
        .for_each(|_| async {})
        .await;
}

/// Polls `f` until it returns `Some(value)` and returns that value, starting at 20 ms between
/// attempts and backing off to 500 ms. Panics naming `what` if `timeout` passes first
/// (including when a single attempt hangs).
pub async fn wait_until<F, Fut, T>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    let mut attempts = 0u32;
    let poll = async {
        let mut delay = Duration::from_millis(20);
        loop {
            attempts += 1;
            if let Some(value) = f().await {
                return value;
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(500));
        }
    };
    match tokio::time::timeout(timeout, poll).await {
        Ok(value) => value,
        Err(_) => panic!(
            "timed out after {:?} ({attempts} attempts) waiting until {what}",
            start.elapsed()
        ),
    }
}

/// Creates the CRD `<plural>.<group>` for `kind` with one version ([`CRD_VERSION`]) whose
/// schema accepts anything under `spec` and `status` (`x-kubernetes-preserve-unknown-fields`),
/// then waits until it is `Established`, discovery serves it, a LIST of it succeeds and the
/// apiserver no longer holds creates of it (2 s after Established, see below).
/// `scope` is `"Namespaced"` or `"Cluster"`. Creating a CRD that already exists is fine.
pub async fn create_crd(client: &kube::Client, group: &str, kind: &str, plural: &str, scope: &str) {
    assert!(
        matches!(scope, "Namespaced" | "Cluster"),
        "create_crd: scope must be \"Namespaced\" or \"Cluster\", not {scope:?}"
    );
    let name = format!("{plural}.{group}");
    let open_object = json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true });
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "group": group,
            "scope": scope,
            "names": {
                "kind": kind,
                "listKind": format!("{kind}List"),
                "plural": plural,
                "singular": kind.to_ascii_lowercase(),
            },
            "versions": [{
                "name": CRD_VERSION,
                "served": true,
                "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": { "spec": open_object, "status": open_object },
                }},
            }],
        }
    }))
    .expect("CRD manifest");

    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.is_already_exists() => {}
        Err(e) => panic!("cannot create CRD {name}: {e}"),
    }

    let timeout = Duration::from_secs(30);
    let established = wait_until(&format!("CRD {name} is Established"), timeout, || async {
        let crd = crds.get_opt(&name).await.ok().flatten()?;
        let conditions = crd.status?.conditions?;
        let established = conditions
            .into_iter()
            .find(|c| c.type_ == "Established" && c.status == "True")?;
        Some(established.last_transition_time)
    })
    .await;

    let gvk = GroupVersionKind::gvk(group, CRD_VERSION, kind);
    let resource: ApiResource =
        wait_until(&format!("discovery serves {name}"), timeout, || async {
            let (resource, _) = kube::discovery::pinned_kind(client, &gvk).await.ok()?;
            (resource.plural == plural).then_some(resource)
        })
        .await;

    let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
    wait_until(&format!("{name} can be listed"), timeout, || async {
        api.list(&ListParams::default().limit(1))
            .await
            .ok()
            .map(drop)
    })
    .await;

    // kube-apiserver holds every create of a custom resource for 2 s while its CRD became
    // Established less than 2 s ago (apiextensions-apiserver customresource_handler.go,
    // "justCreated"): wait that window out here so a test's first create is not delayed.
    if let Some(established) = established {
        let established_ms = established.0.as_millisecond();
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let remaining_ms = (CRD_CREATE_HOLD.as_millis() as i64) - (now_ms - established_ms);
        if remaining_ms > 0 {
            tokio::time::sleep(Duration::from_millis(remaining_ms as u64)).await;
        }
    }
}

/// How long after its CRD became Established kube-apiserver holds creates of a custom
/// resource (2 s), plus a margin.
const CRD_CREATE_HOLD: Duration = Duration::from_millis(2_100);

/// A Kafka client configuration with `bootstrap.servers` from `KAFKA_BOOTSTRAP_SERVERS`.
pub fn kafka_config() -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", env().kafka_bootstrap);
    config
}

/// A consumer in `group` that reads only committed records from the earliest offset and never
/// commits on its own (`read_committed`, `earliest`, `enable.auto.commit=false`).
pub fn kafka_consumer(group: &str) -> StreamConsumer {
    kafka_config()
        .set("group.id", group)
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap_or_else(|e| panic!("cannot create a Kafka consumer in group {group}: {e}"))
}

/// Creates topic `name` with `partitions` partitions (replication factor 1: the test broker is
/// alone) and waits until every partition has a leader. A topic that already exists is fine.
pub async fn create_topic(name: &str, partitions: i32) {
    let admin: Arc<AdminClient<DefaultClientContext>> = Arc::new(
        kafka_config()
            .create()
            .unwrap_or_else(|e| panic!("cannot create a Kafka admin client: {e}")),
    );
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    // A broker a fault test just restarted may answer late on a loaded machine: a request that
    // timed out is made again (an existing topic counts as created), three attempts at most.
    let timed_out = |code: RDKafkaErrorCode| {
        matches!(
            code,
            RDKafkaErrorCode::OperationTimedOut | RDKafkaErrorCode::RequestTimedOut
        )
    };
    for attempt in 1..=3 {
        let last = attempt == 3;
        let outcome = match admin.create_topics([&topic], &options).await {
            Ok(results) => results.into_iter().try_for_each(|result| match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => Ok(()),
                Err((_, code)) => Err(code),
            }),
            // A whole request that timed out is `AdminOp`, whose code `rdkafka_error_code`
            // does not give.
            Err(KafkaError::AdminOp(code)) => Err(code),
            Err(e) => Err(e
                .rdkafka_error_code()
                .unwrap_or_else(|| panic!("cannot create Kafka topic {name}: {e}"))),
        };
        match outcome {
            Ok(()) => break,
            Err(code) if timed_out(code) && !last => {
                eprintln!(
                    "creating Kafka topic {name} timed out (attempt {attempt}): trying again"
                );
            }
            Err(code) => panic!("cannot create Kafka topic {name}: {code}"),
        }
    }

    let what = format!("Kafka topic {name} has {partitions} partitions with leaders");
    wait_until(&what, Duration::from_secs(30), || {
        let admin = Arc::clone(&admin);
        let name = name.to_owned();
        async move {
            tokio::task::spawn_blocking(move || {
                let metadata = admin
                    .inner()
                    .fetch_metadata(Some(&name), Duration::from_secs(5))
                    .ok()?;
                let topic = metadata.topics().iter().find(|t| t.name() == name)?;
                let ready = topic.error().is_none()
                    && topic.partitions().len() == partitions as usize
                    && topic
                        .partitions()
                        .iter()
                        .all(|p| p.error().is_none() && p.leader() >= 0);
                ready.then_some(())
            })
            .await
            .expect("metadata task")
        }
    })
    .await;
}

/// A NATS client connected to `NATS_URL`.
pub async fn nats_client() -> async_nats::Client {
    let url = env().nats_url;
    async_nats::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to NATS at {url}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_variable_message_names_it_and_says_how_to_start_outside_ci() {
        let local = missing_var_message("NATS_URL", "is not set", false);
        assert!(local.starts_with("NATS_URL is not set"), "{local}");
        assert!(local.contains("scripts/testenv up"), "{local}");
        assert!(
            local.contains(". ~/.cache/kube-event-bridge/run/env"),
            "{local}"
        );
        assert!(local.contains("scripts/test`"), "{local}");

        let ci = missing_var_message("KUBECONFIG", "is empty", true);
        assert!(ci.starts_with("KUBECONFIG is empty"), "{ci}");
        assert!(!ci.contains("scripts/testenv up"), "{ci}");
    }

    #[test]
    fn a_clusters_exports_are_found_by_its_variable_prefix() {
        let stdout = "export KEB_CLUSTER_FLEET_A_1F2E3D4C0_KUBECONFIG=/s/clusters/fleet-a-1f2e3d4c0/kubeconfig\n\
                      export KEB_CLUSTER_FLEET_A_1F2E3D4C0_URL=https://127.0.0.1:40001\n";
        let var = cluster_variable("fleet-a-1f2e3d4c0");
        assert_eq!(var, "KEB_CLUSTER_FLEET_A_1F2E3D4C0");
        assert_eq!(
            export_value(stdout, &format!("{var}_KUBECONFIG")),
            "/s/clusters/fleet-a-1f2e3d4c0/kubeconfig"
        );
        assert_eq!(
            export_value(stdout, &format!("{var}_URL")),
            "https://127.0.0.1:40001"
        );
    }

    #[test]
    #[should_panic(expected = "printed no KEB_CLUSTER_B_URL")]
    fn a_missing_export_is_named() {
        export_value(
            "export KEB_CLUSTER_A_URL=https://127.0.0.1:1\n",
            "KEB_CLUSTER_B_URL",
        );
    }

    #[test]
    fn unique_names_are_distinct_dns_labels() {
        let long = "X".repeat(100);
        let names: Vec<String> = ["Kube Watch", "--a--", "", &long, "ns_1.2"]
            .iter()
            .flat_map(|p| [unique_name(p), unique_name(p)])
            .collect();
        for name in &names {
            assert!(name.len() <= 63, "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{name}"
            );
            assert!(!name.starts_with('-') && !name.ends_with('-'), "{name}");
        }
        let distinct: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
    }
}
