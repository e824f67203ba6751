//! The deployment artefacts against the real API server: the plain manifests under
//! `deploy/manifests` pass a server-side dry run; their RBAC, and the RBAC rendered by
//! `kube_event_bridge::rbac`, grant the service account exactly the configured reads (proved with
//! `kubectl auth can-i --as=system:serviceaccount:...`); the Helm chart renders every documented
//! values file, lints, agrees with `src/rbac.rs` and matches the committed manifests; the
//! Dockerfile and docker-compose.yml are checked structurally (no Docker engine runs here).
//!
//! kubectl comes from `KEB_KUBECTL`, helm from `KEB_HELM` (both set by `scripts/testenv`) or
//! `helm` on PATH. A test that needs a missing tool fails, in CI or not.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube_event_bridge::config::ConfigFile;
use kube_event_bridge::discovery::{self, ResolvedResource};
use kube_event_bridge::rbac::{self, Grants, Permissions};
use kube_event_bridge::sink::kafka::Kafka;
use kube_event_bridge::sink::nats::Nats;
use serde_json::Value;

use crate::support::{self, create_crd, kube_client, unique_name, unique_namespace, wait_until};

/// The release name and namespace `deploy/render.sh` renders the plain manifests with.
const RENDER_RELEASE: &str = "kube-event-bridge";
const RENDER_NAMESPACE: &str = "kube-event-bridge";
/// The documented values files, besides the chart's own values.yaml.
const CI_VALUES: [&str; 4] = [
    "ci/kafka-values.yaml",
    "ci/nats-leader-election-values.yaml",
    "ci/kafka-sasl-values.yaml",
    "ci/kafka-sharding-values.yaml",
];
/// How long RBAC changes may take to reach the API server's authorizer.
const RBAC_SETTLE: Duration = Duration::from_secs(30);

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    repo().join("deploy/helm/kube-event-bridge")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

// ------------------------------------------------------------------ tools

/// A tool the test needs is missing: the test fails (a test that cannot run never passes).
fn missing_tool(what: &str, how: &str) -> ! {
    panic!(
        "{what} is not available ({how}): run `scripts/testenv up` (it builds kubectl, helm and helm-docs) \
         and load its variables (`eval \"$(scripts/testenv env)\"`)"
    )
}

fn kubectl() -> String {
    match support::env().kubectl {
        Some(k) if Path::new(&k).is_file() => k,
        Some(k) => missing_tool("kubectl", &format!("KEB_KUBECTL={k} does not exist")),
        None => missing_tool("kubectl", "KEB_KUBECTL is not set"),
    }
}

pub(crate) fn helm() -> String {
    if let Some(h) = std::env::var("KEB_HELM")
        .ok()
        .filter(|h| !h.trim().is_empty())
    {
        if Path::new(&h).is_file() {
            return h;
        }
        missing_tool("helm", &format!("KEB_HELM={h} does not exist"));
    }
    on_path("helm")
        .unwrap_or_else(|| missing_tool("helm", "KEB_HELM is not set and no helm on PATH"))
}

fn on_path(name: &str) -> Option<String> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
}

/// The result of a command that ran to completion.
struct Output {
    success: bool,
    stdout: String,
    stderr: String,
}

async fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Output {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.unwrap_or("").as_bytes())
        .await
        .expect("write stdin");
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{program} {args:?} did not finish within 120 s"))
        .expect("wait for command");
    Output {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs a command that must succeed and returns its standard output.
async fn ok(program: &str, args: &[&str], stdin: Option<&str>) -> String {
    let out = run(program, args, stdin).await;
    assert!(
        out.success,
        "{program} {} failed:\n{}\n{}",
        args.join(" "),
        out.stderr,
        out.stdout
    );
    out.stdout
}

/// `kubectl --kubeconfig $KUBECONFIG ARGS` that must succeed.
async fn kube(kubectl: &str, args: &[&str], stdin: Option<&str>) -> String {
    let kubeconfig = support::env().kubeconfig;
    let mut all = vec!["--kubeconfig", kubeconfig.as_str()];
    all.extend_from_slice(args);
    ok(kubectl, &all, stdin).await
}

// ------------------------------------------------------------------ YAML documents

fn documents(text: &str) -> Vec<Value> {
    serde_saphyr::from_str_multiple::<Value, Vec<Value>>(text)
        .unwrap_or_else(|e| panic!("invalid YAML: {e}\n{text}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

fn to_yaml(docs: &[Value]) -> String {
    docs.iter()
        .map(|d| format!("---\n{}", serde_saphyr::to_string(d).expect("YAML")))
        .collect()
}

fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or("")
}

fn name(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or("")
}

/// A YAML sequence as strings (see [`str_of`]).
fn strings(v: &Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(str_of).collect()
}

fn str_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Moves rendered manifests from `from` (the namespace they were rendered for) to `to`: every
/// object's namespace, every subject's namespace, and the names that carry the namespace
/// (`kube-event-bridge:<namespace>:<service account>` roles and bindings).
fn move_namespace(docs: &mut [Value], from: &str, to: &str) {
    let old_prefix = format!("kube-event-bridge:{from}:");
    let new_prefix = format!("kube-event-bridge:{to}:");
    let rename = |v: &mut Value| {
        if let Some(s) = v.as_str()
            && let Some(rest) = s.strip_prefix(&old_prefix)
        {
            *v = Value::String(format!("{new_prefix}{rest}"));
        }
    };
    for doc in docs {
        if let Some(meta) = doc.get_mut("metadata") {
            if meta.get("namespace").and_then(Value::as_str) == Some(from) {
                meta["namespace"] = Value::String(to.into());
            }
            if let Some(n) = meta.get_mut("name") {
                rename(n);
            }
        }
        if let Some(n) = doc.get_mut("roleRef").and_then(|r| r.get_mut("name")) {
            rename(n);
        }
        if let Some(subjects) = doc.get_mut("subjects").and_then(Value::as_array_mut) {
            for s in subjects {
                if s.get("namespace").and_then(Value::as_str) == Some(from) {
                    s["namespace"] = Value::String(to.into());
                }
            }
        }
    }
}

/// The bridge configuration a chart rendering puts into its ConfigMap, validated by the
/// bridge's own rules.
fn chart_config(docs: &[Value]) -> kube_event_bridge::config::Config {
    let cm = docs
        .iter()
        .find(|d| kind(d) == "ConfigMap")
        .expect("a ConfigMap");
    let text = cm["data"]["config.yaml"]
        .as_str()
        .expect("data.config.yaml");
    ConfigFile::parse(text)
        .and_then(ConfigFile::validate)
        .unwrap_or_else(|e| panic!("the chart's config is not valid for the bridge: {e}\n{text}"))
}

/// The watch grants of rendered RBAC objects named `role_name`, as [`Permissions`]; every rule
/// must carry exactly the watch verbs. Leader-election objects are left out.
fn rendered_permissions(docs: &[Value], role_name: &str) -> Permissions {
    let mut out = Permissions::default();
    for doc in docs {
        let target = match kind(doc) {
            "ClusterRole" => &mut out.cluster,
            "Role" if name(doc) == role_name => {
                let ns = doc["metadata"]["namespace"]
                    .as_str()
                    .expect("Role namespace");
                out.namespaced.entry(ns.to_string()).or_default()
            }
            _ => continue,
        };
        assert_eq!(
            name(doc),
            role_name,
            "{}",
            to_yaml(std::slice::from_ref(doc))
        );
        for rule in doc["rules"].as_array().expect("rules") {
            let verbs: Vec<String> = rule["verbs"]
                .as_array()
                .expect("verbs")
                .iter()
                .map(str_of)
                .collect();
            assert_eq!(
                verbs,
                rbac::WATCH_VERBS,
                "{}",
                to_yaml(std::slice::from_ref(doc))
            );
            for group in rule["apiGroups"].as_array().expect("apiGroups") {
                let plurals = target.entry(str_of(group)).or_default();
                for r in rule["resources"].as_array().expect("resources") {
                    plurals.insert(str_of(r));
                }
            }
        }
    }
    out
}

// ------------------------------------------------------------------ can-i

/// Where a `kubectl auth can-i` question applies.
#[derive(Debug, Clone, Copy)]
enum Scope<'a> {
    /// In one namespace.
    In(&'a str),
    /// In every namespace (`--all-namespaces`), or a cluster-scoped resource.
    Everywhere,
}

/// One question and the answer the RBAC must give.
#[derive(Debug, Clone)]
struct Check<'a> {
    verb: &'a str,
    resource: String,
    scope: Scope<'a>,
    allowed: bool,
}

fn check<'a>(verb: &'a str, resource: &str, scope: Scope<'a>, allowed: bool) -> Check<'a> {
    Check {
        verb,
        resource: resource.to_string(),
        scope,
        allowed,
    }
}

/// Every watch verb on `resource` in `scope`, allowed or not; `get` always refused (the bridge
/// lists and watches, it never reads a single object).
fn reads<'a>(resource: &str, scope: Scope<'a>, allowed: bool) -> Vec<Check<'a>> {
    rbac::WATCH_VERBS
        .iter()
        .map(|v| check(v, resource, scope, allowed))
        .chain([check("get", resource, scope, false)])
        .collect()
}

/// What writes must be refused on a resource the bridge reads.
fn no_writes<'a>(resource: &str, scope: Scope<'a>) -> Vec<Check<'a>> {
    ["create", "update", "patch", "delete", "deletecollection"]
        .iter()
        .map(|v| check(v, resource, scope, false))
        .collect()
}

async fn can_i(kubectl: &str, user: &str, c: &Check<'_>) -> bool {
    let kubeconfig = support::env().kubeconfig;
    let as_user = format!("--as={user}");
    let mut args = vec![
        "--kubeconfig",
        kubeconfig.as_str(),
        "auth",
        "can-i",
        c.verb,
        c.resource.as_str(),
        as_user.as_str(),
    ];
    match c.scope {
        Scope::In(ns) => args.extend(["--namespace", ns]),
        Scope::Everywhere => args.push("--all-namespaces"),
    }
    let out = run(kubectl, &args, None).await;
    match out.stdout.lines().next().map(str::trim) {
        Some("yes") => true,
        Some("no") => false,
        _ => panic!(
            "kubectl {} answered neither yes nor no:\n{}\n{}",
            args.join(" "),
            out.stdout,
            out.stderr
        ),
    }
}

/// Waits until every allowed check is allowed (RBAC reaches the authorizer through informers),
/// then asserts every check's answer.
async fn assert_can_i(kubectl: &str, user: &str, checks: &[Check<'_>]) {
    wait_until(
        &format!("{user} is granted what its RBAC grants"),
        RBAC_SETTLE,
        || async {
            for c in checks.iter().filter(|c| c.allowed) {
                if !can_i(kubectl, user, c).await {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    let mut wrong = Vec::new();
    for c in checks {
        let answer = can_i(kubectl, user, c).await;
        if answer != c.allowed {
            wrong.push(format!(
                "{} {} in {:?}: {} (expected {})",
                c.verb,
                c.resource,
                c.scope,
                if answer { "allowed" } else { "denied" },
                if c.allowed { "allowed" } else { "denied" }
            ));
        }
    }
    assert!(wrong.is_empty(), "{user}:\n  {}", wrong.join("\n  "));
}

/// Rules every authenticated user has (system:basic-user and system:discovery): never the bridge's.
const BASIC_USER_RESOURCES: [&str; 3] = [
    "selfsubjectaccessreviews.authorization.k8s.io",
    "selfsubjectrulesreviews.authorization.k8s.io",
    "selfsubjectreviews.authentication.k8s.io",
];

/// `kubectl auth can-i --list` in `namespace`: resource → verbs, without the rules every
/// authenticated user has and without non-resource URLs.
async fn listed_rules(kubectl: &str, user: &str, namespace: &str) -> BTreeMap<String, String> {
    let as_user = format!("--as={user}");
    let out = kube(
        kubectl,
        &[
            "auth",
            "can-i",
            "--list",
            "--namespace",
            namespace,
            &as_user,
        ],
        None,
    )
    .await;
    let mut rules = BTreeMap::new();
    for line in out.lines().skip(1) {
        let resource = line.split_whitespace().next().unwrap_or("");
        if resource.is_empty() || resource.starts_with('[') {
            continue; // a non-resource URL
        }
        if BASIC_USER_RESOURCES.contains(&resource) {
            continue;
        }
        let verbs = line
            .rsplit_once('[')
            .map(|(_, v)| v.trim_end().trim_end_matches(']').to_string())
            .unwrap_or_default();
        rules.insert(resource.to_string(), verbs);
    }
    rules
}

/// Waits until `can-i --list` in `namespace` shows exactly `expected` (resource → verbs).
async fn assert_listed(kubectl: &str, user: &str, namespace: &str, expected: &[(&str, &str)]) {
    let expected: BTreeMap<String, String> = expected
        .iter()
        .map(|(r, v)| (r.to_string(), v.to_string()))
        .collect();
    let mut last = BTreeMap::new();
    let settled = tokio::time::timeout(RBAC_SETTLE, async {
        loop {
            last = listed_rules(kubectl, user, namespace).await;
            if last == expected {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        settled.is_ok(),
        "{user} in {namespace}: can-i --list shows {last:#?}, expected exactly {expected:#?}"
    );
}

async fn create_service_account(kubectl: &str, namespace: &str, name: &str) {
    kube(
        kubectl,
        &["create", "serviceaccount", name, "--namespace", namespace],
        None,
    )
    .await;
}

/// Deletes the cluster-scoped objects a test created (namespaced ones stay in its namespaces).
async fn delete_cluster_objects(kubectl: &str, name: &str) {
    let kubeconfig = support::env().kubeconfig;
    let _ = run(
        kubectl,
        &[
            "--kubeconfig",
            &kubeconfig,
            "delete",
            "clusterrole,clusterrolebinding",
            name,
            "--ignore-not-found",
        ],
        None,
    )
    .await;
}

fn sa_user(namespace: &str, sa: &str) -> String {
    format!("system:serviceaccount:{namespace}:{sa}")
}

// ------------------------------------------------------------------ (a) plain manifests

fn plain_manifests() -> Vec<Value> {
    let path = repo().join("deploy/manifests/kube-event-bridge.yaml");
    let docs = documents(&read(&path));
    assert!(!docs.is_empty(), "{} is empty", path.display());
    docs
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_manifests_pass_a_server_side_dry_run() {
    let kubectl = kubectl();
    let client = kube_client().await;
    let namespace = unique_namespace(&client, "deploy-dry-run").await;
    let mut docs = plain_manifests();
    move_namespace(&mut docs, RENDER_NAMESPACE, &namespace);
    let kinds: BTreeSet<&str> = docs.iter().map(kind).collect();
    for k in [
        "ServiceAccount",
        "ConfigMap",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    ] {
        assert!(
            kinds.contains(k),
            "no {k} in the plain manifests: {kinds:?}"
        );
    }
    let out = kube(
        &kubectl,
        &["apply", "--dry-run=server", "--output=name", "-f", "-"],
        Some(&to_yaml(&docs)),
    )
    .await;
    assert_eq!(
        out.lines().count(),
        docs.len(),
        "every object passes the dry run:\n{out}"
    );

    // The Deployment as the brief asks: hardened, probed, bounded.
    let deployment = docs.iter().find(|d| kind(d) == "Deployment").unwrap();
    let spec = &deployment["spec"]["template"]["spec"];
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        spec["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let container = &spec["containers"][0];
    let sc = &container["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"][0], "ALL");
    assert_eq!(container["ports"][0]["containerPort"], 8080);
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/livez");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    for key in ["requests", "limits"] {
        for res in ["cpu", "memory"] {
            assert!(
                !container["resources"][key][res].is_null(),
                "resources.{key}.{res}"
            );
        }
    }
    assert_eq!(
        spec["serviceAccountName"],
        docs.iter().find(|d| kind(d) == "ServiceAccount").unwrap()["metadata"]["name"]
    );
    chart_config(&docs);
}

// ------------------------------------------------------------------ (b) their RBAC, for real

#[tokio::test(flavor = "multi_thread")]
async fn plain_manifests_grant_exactly_the_configured_reads() {
    let kubectl = kubectl();
    let client = kube_client().await;
    let namespace = unique_namespace(&client, "deploy-rbac").await;
    let other = unique_namespace(&client, "deploy-rbac-other").await;
    let mut docs = plain_manifests();
    move_namespace(&mut docs, RENDER_NAMESPACE, &namespace);
    let rbac_docs: Vec<Value> = docs
        .iter()
        .filter(|d| {
            matches!(
                kind(d),
                "ServiceAccount" | "ClusterRole" | "ClusterRoleBinding" | "Role" | "RoleBinding"
            )
        })
        .cloned()
        .collect();
    kube(&kubectl, &["apply", "-f", "-"], Some(&to_yaml(&rbac_docs))).await;

    // The default values watch configmaps in every namespace and the cluster's Namespaces.
    let config = chart_config(&docs);
    let watched: BTreeSet<&str> = config
        .resources
        .iter()
        .map(|r| r.resource.as_str())
        .collect();
    assert_eq!(watched, BTreeSet::from(["configmaps", "Namespace"]));
    let sa = docs.iter().find(|d| kind(d) == "ServiceAccount").unwrap();
    let user = sa_user(&namespace, name(sa));
    let mut checks = Vec::new();
    for scope in [Scope::In(&namespace), Scope::In(&other), Scope::Everywhere] {
        checks.extend(reads("configmaps", scope, true));
        checks.extend(no_writes("configmaps", scope));
        checks.extend(reads("secrets", scope, false));
        checks.extend(reads("pods", scope, false));
        checks.extend(reads("deployments.apps", scope, false));
        checks.extend(reads("leases.coordination.k8s.io", scope, false));
        checks.extend(reads("roles.rbac.authorization.k8s.io", scope, false));
    }
    checks.extend(reads("namespaces", Scope::Everywhere, true));
    checks.extend(no_writes("namespaces", Scope::Everywhere));
    checks.extend(reads("nodes", Scope::Everywhere, false));
    checks.extend(reads(
        "clusterroles.rbac.authorization.k8s.io",
        Scope::Everywhere,
        false,
    ));
    checks.push(check(
        "impersonate",
        "serviceaccounts",
        Scope::In(&namespace),
        false,
    ));
    // Snapshot requests: the bridge also gets and patches ConfigMaps in its own namespace alone.
    for c in checks.iter_mut().filter(|c| {
        c.resource == "configmaps"
            && matches!(c.scope, Scope::In(ns) if ns == namespace)
            && matches!(c.verb, "get" | "patch")
    }) {
        c.allowed = true;
    }
    assert_can_i(&kubectl, &user, &checks).await;
    assert_listed(
        &kubectl,
        &user,
        &other,
        &[("configmaps", "list watch"), ("namespaces", "list watch")],
    )
    .await;
    delete_cluster_objects(&kubectl, &rbac::role_name(name(sa), &namespace)).await;
}

// ------------------------------------------------------------------ (c) the Helm chart

/// `helm template` of the chart with `values` (chart defaults when `None`).
async fn helm_template(helm: &str, release: &str, namespace: &str, values: Option<&str>) -> String {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let mut args = vec!["template", release, chart, "--namespace", namespace];
    let values_path;
    if let Some(v) = values {
        values_path = chart_path(v);
        args.extend(["--values", values_path.as_str()]);
    }
    ok(helm, &args, None).await
}

fn chart_path(relative: &str) -> String {
    chart().join(relative).display().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn helm_lint_passes_for_every_documented_values_file() {
    let helm = helm();
    let chart = chart().display().to_string();
    ok(&helm, &["lint", "--strict", &chart], None).await;
    for values in CI_VALUES {
        ok(
            &helm,
            &["lint", "--strict", &chart, "--values", &chart_path(values)],
            None,
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_manifests_are_the_chart_rendered_with_default_values() {
    let helm = helm();
    let rendered = helm_template(&helm, RENDER_RELEASE, RENDER_NAMESPACE, None).await;
    let committed = read(&repo().join("deploy/manifests/kube-event-bridge.yaml"));
    assert!(
        committed.starts_with("# Generated by deploy/render.sh"),
        "deploy/manifests/kube-event-bridge.yaml lost its header"
    );
    assert!(
        committed.ends_with(&rendered),
        "deploy/manifests/kube-event-bridge.yaml is stale: run deploy/render.sh\n--- helm template:\n{rendered}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn helm_renders_every_documented_values_file_with_the_rbac_src_rbac_computes() {
    let helm = helm();
    let kubectl = kubectl();
    let client = kube_client().await;
    // ci/nats-leader-election-values.yaml watches the demo's CronTab custom resource.
    create_crd(
        &client,
        "stable.example.com",
        "CronTab",
        "crontabs",
        "Namespaced",
    )
    .await;
    let namespace = unique_namespace(&client, "deploy-helm").await;
    let release = "keb";
    for values in std::iter::once(None).chain(CI_VALUES.map(Some)) {
        let what = values.unwrap_or("values.yaml");
        let docs = documents(&helm_template(&helm, release, &namespace, values).await);
        let config = chart_config(&docs);
        let leader_election = values == Some(CI_VALUES[1]);
        let sharding = values == Some(CI_VALUES[3]);
        assert_eq!(config.sharding.enabled, sharding, "{what}");

        // The chart's RBAC is what src/rbac.rs computes from the same config through discovery.
        let resolved = discovery::resolve(&client, &config.resources)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let sa = docs
            .iter()
            .find(|d| kind(d) == "ServiceAccount")
            .map(|d| name(d).to_string())
            .unwrap();
        let role = rbac::role_name(&sa, &namespace);
        assert_eq!(
            rendered_permissions(&docs, &role),
            rbac::permissions(&resolved),
            "{what}: chart RBAC differs from src/rbac.rs"
        );
        let identity = docs
            .iter()
            .find(|d| kind(d) == "Role" && name(d) == rbac::identity_role_name(&sa, &namespace));
        assert_eq!(
            identity.is_some(),
            config.reads_cluster_identity(),
            "{what}: the Role reading namespace kube-system comes with kept checkpoints"
        );
        if let Some(identity) = identity {
            assert_eq!(
                identity["metadata"]["namespace"].as_str(),
                Some(rbac::IDENTITY_NAMESPACE)
            );
            assert_eq!(
                identity["rules"][0]["resourceNames"][0],
                rbac::IDENTITY_NAMESPACE
            );
            assert_eq!(strings(&identity["rules"][0]["verbs"]), ["get"]);
        }
        let lease_role = rbac::lease_role_name(&sa, &namespace);
        let lease = docs
            .iter()
            .find(|d| kind(d) == "Role" && name(d) == lease_role);
        assert_eq!(
            lease.is_some(),
            leader_election || sharding,
            "{what}: Lease Role"
        );
        if let Some(lease) = lease {
            assert_eq!(
                lease["metadata"]["namespace"].as_str(),
                Some(namespace.as_str())
            );
            assert_eq!(lease["rules"][0]["apiGroups"][0], rbac::LEASE_GROUP);
            assert_eq!(lease["rules"][0]["resources"][0], "leases");
            let verbs: Vec<String> = strings(&lease["rules"][0]["verbs"]);
            if sharding {
                assert_eq!(verbs, rbac::SHARDING_LEASE_VERBS, "{what}");
            } else {
                assert_eq!(verbs, rbac::LEASE_VERBS, "{what}");
            }
        }

        // Snapshot requests: read and patched in the release's namespace (the default), alone.
        let requests_role = rbac::snapshot_requests_role_name(&sa, &namespace);
        let requests = docs
            .iter()
            .find(|d| kind(d) == "Role" && name(d) == requests_role);
        let wanted = rbac::snapshot_requests(&config, &namespace);
        assert_eq!(
            requests.and_then(|r| r["metadata"]["namespace"].as_str()),
            wanted.as_deref(),
            "{what}: snapshot requests Role"
        );
        if let Some(requests) = requests {
            assert_eq!(requests["rules"][0]["resources"][0], "configmaps");
            assert_eq!(
                strings(&requests["rules"][0]["verbs"]),
                rbac::SNAPSHOT_REQUEST_VERBS,
                "{what}"
            );
        }

        let deployment = docs.iter().find(|d| kind(d) == "Deployment").unwrap();
        let replicas = match (leader_election, sharding) {
            (true, _) => 2,
            (_, true) => 4,
            _ => 1,
        };
        assert_eq!(deployment["spec"]["replicas"], replicas, "{what}");
        // Several replicas are spread over nodes.
        let spread = &deployment["spec"]["template"]["spec"]["topologySpreadConstraints"];
        assert_eq!(
            !spread.is_null(),
            sharding || leader_election,
            "{what}: topology spread"
        );
        if sharding || leader_election {
            assert_eq!(spread[0]["topologyKey"], "kubernetes.io/hostname");
            let selector = &spread[0]["labelSelector"]["matchLabels"];
            let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
            for (k, v) in selector.as_object().unwrap() {
                assert_eq!(
                    &pod_labels[k], v,
                    "{what}: the spread selects the bridge's pods"
                );
            }
        }
        assert_eq!(
            deployment["metadata"]["labels"]["app.kubernetes.io/managed-by"], "Helm",
            "{what}"
        );
        // Unready but publishing, then draining, then 5 s to exit.
        assert_eq!(
            deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"].as_u64(),
            Some(config.admin.shutdown_delay_secs + config.delivery.shutdown_grace_secs + 5),
            "{what}"
        );
        let pdb = docs
            .iter()
            .find(|d| kind(d) == "PodDisruptionBudget")
            .unwrap();
        // A standby for leader election; a majority of the four sharded replicas.
        let min_available = match (leader_election, sharding) {
            (true, _) => Some(1),
            (_, true) => Some(3),
            _ => None,
        };
        assert_eq!(
            pdb["spec"]["minAvailable"].as_u64(),
            min_available,
            "{what}"
        );

        // Broker credentials are files from Secrets, never values in the ConfigMap.
        let spec = &deployment["spec"]["template"]["spec"];
        let secret_mounts: BTreeMap<String, String> = spec["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| {
                spec["volumes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v["name"] == m["name"] && !v["secret"]["secretName"].is_null())
            })
            .map(|m| (str_of(&m["name"]), str_of(&m["mountPath"])))
            .collect();
        let credential_files: Vec<String> = config
            .sink
            .secret_files()
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        for file in &credential_files {
            assert!(
                secret_mounts
                    .values()
                    .any(|m| file.starts_with(&format!("{m}/"))),
                "{what}: {file} is not in a mounted Secret ({secret_mounts:?})"
            );
        }
        assert_eq!(
            credential_files.is_empty(),
            secret_mounts.is_empty(),
            "{what}: {credential_files:?} {secret_mounts:?}"
        );

        // The API server accepts every object (the Prometheus Operator's CRDs are not installed
        // here; the PrometheusRule's rules pass promtool in `alerts`).
        let mut objects: Vec<Value> = docs
            .iter()
            .filter(|d| !matches!(kind(d), "ServiceMonitor" | "PrometheusRule"))
            .cloned()
            .collect();
        let extra: BTreeSet<String> = objects
            .iter()
            .filter_map(|d| d["metadata"]["namespace"].as_str())
            .filter(|ns| *ns != namespace)
            .map(String::from)
            .collect();
        // Values files name fixed namespaces (team-a): stand them in by fresh ones.
        for ns in extra {
            let fresh = unique_namespace(&client, &ns).await;
            for d in &mut objects {
                if d["metadata"]["namespace"].as_str() == Some(ns.as_str()) {
                    d["metadata"]["namespace"] = Value::String(fresh.clone());
                }
            }
        }
        kube(
            &kubectl,
            &["apply", "--dry-run=server", "-f", "-"],
            Some(&to_yaml(&objects)),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn helm_refuses_inline_secrets_unmounted_files_two_sinks_bad_keys_loopback_admin() {
    let helm = helm();
    let chart = chart().display().to_string();
    let kafka = chart_path(CI_VALUES[0]);
    let nats = chart_path(CI_VALUES[1]);
    let sasl = chart_path(CI_VALUES[2]);
    let cases: [(&[&str], &str); 14] = [
        (
            &[
                "--values",
                &kafka,
                "--set",
                "config.sink.kafka.properties.sasl\\.password=x",
            ],
            "would write a secret into the ConfigMap",
        ),
        (
            &["--values", &nats, "--set", "secretMounts=null"],
            "is not under any secretMounts[].mountPath",
        ),
        (
            &[
                "--values",
                &sasl,
                "--set",
                "config.sink.kafka.propertyFiles.sasl\\.password=/etc/elsewhere/password",
            ],
            "config.sink.kafka.propertyFiles.sasl.password: /etc/elsewhere/password is not under any secretMounts[].mountPath",
        ),
        // The config schema refuses a second sink first; the chart's own check stays behind it.
        (
            &["--values", &kafka, "--set-json", "config.sink.stdout={}"],
            "at '/config/sink': maxProperties: got 2, want 1",
        ),
        (
            &[
                "--skip-schema-validation",
                "--values",
                &kafka,
                "--set-json",
                "config.sink.stdout={}",
            ],
            "set exactly one sink",
        ),
        (
            &["--set", "config.resources[0].lables=x"],
            "additional properties 'lables' not allowed",
        ),
        // Every value has a schema: a misspelled one is refused, not ignored.
        (
            &["--set", "resourcse.limits.cpu=2"],
            "additional properties 'resourcse' not allowed",
        ),
        (
            &["--set", "metrics.serviceMonitor.intervall=1m"],
            "additional properties 'intervall' not allowed",
        ),
        (&["--set", "image.digest=latest"], "image/digest"),
        (
            &[
                "--skip-schema-validation",
                "--set",
                "config.admin.address=127.0.0.1:8080",
            ],
            "is a loopback address",
        ),
        // A wildcard is never granted as "*": the chart needs the resources listed.
        (
            &["--values", &nats, "--set", "rbac.wildcardResources=null"],
            "config.resources[2] (apiVersion apps/*, resource \"*\") is a wildcard: the chart cannot ask discovery",
        ),
        (
            &[
                "--skip-schema-validation",
                "--values",
                &nats,
                "--set-json",
                "rbac.wildcardResources={\"apps\":[\"*\"]}",
            ],
            "rbac.wildcardResources.apps: \"*\" is not the plural name of a resource",
        ),
        (
            &[
                "--skip-schema-validation",
                "--values",
                &nats,
                "--set-json",
                "rbac.wildcardResources={\"apps\":[\"deployments/scale\"]}",
            ],
            "rbac.wildcardResources.apps: \"deployments/scale\" is not the plural name of a resource",
        ),
        (
            &["--values", &nats, "--set", "rbac.plurals.CronTab=*"],
            "config.resources[1].resource: \"CronTab\" resolves to \"*\"",
        ),
    ];
    for (extra, message) in cases {
        let mut args = vec!["template", "keb", chart.as_str()];
        args.extend_from_slice(extra);
        let out = run(&helm, &args, None).await;
        assert!(!out.success, "helm {args:?} rendered:\n{}", out.stdout);
        assert!(
            out.stderr.contains(message),
            "helm {args:?}: {}",
            out.stderr
        );
    }
}

/// The chart's README is what helm-docs generates from values.yaml now (its values table, from
/// the `# --` comments).
#[tokio::test(flavor = "multi_thread")]
async fn chart_readme_is_generated_from_the_values() {
    let helm_docs = match std::env::var("KEB_HELM_DOCS") {
        Ok(h) if Path::new(&h).is_file() => h,
        Ok(h) => missing_tool("helm-docs", &format!("KEB_HELM_DOCS={h} does not exist")),
        Err(_) => missing_tool("helm-docs", "KEB_HELM_DOCS is not set"),
    };
    let root = repo().join("deploy/helm").display().to_string();
    let generated = ok(
        &helm_docs,
        &[
            "--chart-search-root",
            &root,
            "--skip-version-footer",
            "--log-level",
            "warning",
            "--dry-run",
        ],
        None,
    )
    .await;
    assert_eq!(
        generated.trim_end(),
        read(&chart().join("README.md")).trim_end(),
        "deploy/helm/kube-event-bridge/README.md is stale: run deploy/render.sh"
    );
}

/// The chart ships the alert rules and the dashboard of deploy/monitoring as they are.
#[test]
fn chart_monitoring_files_are_those_of_deploy_monitoring() {
    for file in ["prometheus-rules.yaml", "grafana-dashboard.json"] {
        assert_eq!(
            read(&chart().join("files").join(file)),
            read(&repo().join("deploy/monitoring").join(file)),
            "the chart's files/{file} is stale: run deploy/render.sh"
        );
    }
}

/// Every value of values.yaml (and of its nested maps the chart reads) has a schema.
#[test]
fn chart_values_schema_names_every_value() {
    let values: Value = serde_saphyr::from_str(&read(&chart().join("values.yaml"))).unwrap();
    let schema: serde_json::Value =
        serde_json::from_str(&read(&chart().join("values.schema.json"))).unwrap();
    assert_eq!(schema["additionalProperties"], false);
    for key in values.as_object().expect("a map").keys() {
        assert!(
            schema["properties"].get(key).is_some(),
            "values.yaml's {key} has no schema: add it in deploy/render.sh"
        );
    }
}

#[test]
fn chart_values_schema_embeds_the_config_schema_and_versions_match() {
    let config: serde_json::Value =
        serde_json::from_str(&read(&repo().join("schemas/config.schema.json"))).unwrap();
    let values: serde_json::Value =
        serde_json::from_str(&read(&chart().join("values.schema.json"))).unwrap();
    let defs = values["$defs"].as_object().expect("$defs");
    let mut root = config.as_object().unwrap().clone();
    let config_defs = root.remove("$defs").unwrap();
    root.remove("$schema");
    assert_eq!(values["properties"]["config"]["$ref"], "#/$defs/ConfigFile");
    assert_eq!(
        defs["ConfigFile"],
        serde_json::Value::Object(root),
        "values.schema.json is stale: run deploy/render.sh"
    );
    for (k, v) in config_defs.as_object().unwrap() {
        assert_eq!(&defs[k], v, "$defs.{k} is stale: run deploy/render.sh");
    }

    let chart_yaml: Value = serde_saphyr::from_str(&read(&chart().join("Chart.yaml"))).unwrap();
    assert_eq!(
        chart_yaml["appVersion"].as_str(),
        Some(env!("CARGO_PKG_VERSION")),
        "Chart.yaml appVersion must be the crate's version"
    );
}

// ------------------------------------------------------------------ (d) Dockerfile, compose

/// The Dockerfile's instructions, continuation lines joined, comments dropped.
pub(crate) fn dockerfile() -> Vec<(String, String)> {
    let text = read(&repo().join("Dockerfile"));
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                let (op, args) = current.split_once(' ').unwrap_or((&current, ""));
                out.push((op.to_ascii_uppercase(), args.trim().to_string()));
                current.clear();
            }
        }
    }
    out
}

/// Debian packages providing each shared library the release binary links, beyond the base image.
const RUNTIME_LIBRARIES: [(&str, &str); 8] = [
    ("libssl.so", "libssl3t64"),
    ("libcrypto.so", "libssl3t64"),
    ("libz.so", "zlib1g"),
    ("libgcc_s.so", "libgcc-s1"),
    ("libc.so", "libc6"),
    ("libm.so", "libc6"),
    ("ld-linux", "libc6"),
    ("linux-vdso.so", "kernel"),
];
/// Packages every debian:*-slim image has.
const DEBIAN_BASE: [&str; 3] = ["libc6", "libgcc-s1", "kernel"];

#[tokio::test(flavor = "multi_thread")]
async fn dockerfile_builds_in_rust_and_runs_the_binary_alone_as_non_root() {
    let ins = dockerfile();
    let froms: Vec<usize> = (0..ins.len()).filter(|&i| ins[i].0 == "FROM").collect();
    assert!(froms.len() >= 2, "a multi-stage build: {ins:?}");
    let builder = &ins[froms[0]].1;
    assert!(
        builder.starts_with("rust:") && builder.ends_with("AS builder"),
        "builder stage: {builder}"
    );
    let runtime: Vec<&(String, String)> = ins[*froms.last().unwrap()..].iter().collect();
    let base = &runtime[0].1;
    assert!(
        base.starts_with("debian:") && base.contains("-slim"),
        "runtime base: {base}"
    );
    // Only the binary comes from the builder.
    let copies: Vec<&str> = runtime
        .iter()
        .filter(|(op, _)| op == "COPY")
        .map(|(_, a)| a.as_str())
        .collect();
    assert_eq!(
        copies,
        ["--from=builder /usr/local/bin/kube-event-bridge /usr/local/bin/kube-event-bridge"]
    );
    let user = runtime
        .iter()
        .rev()
        .find(|(op, _)| op == "USER")
        .map(|(_, a)| a.clone())
        .expect("a USER in the runtime stage");
    let uid: u32 = user
        .split(':')
        .next()
        .unwrap()
        .parse()
        .expect("a numeric USER");
    assert_ne!(uid, 0, "USER must not be root");
    let chart_values: Value = serde_saphyr::from_str(&read(&chart().join("values.yaml"))).unwrap();
    assert_eq!(
        chart_values["podSecurityContext"]["runAsUser"].as_u64(),
        Some(u64::from(uid)),
        "the chart runs the image's user"
    );
    let entrypoint = &runtime.iter().find(|(op, _)| op == "ENTRYPOINT").unwrap().1;
    assert_eq!(entrypoint, "[\"/usr/local/bin/kube-event-bridge\"]");
    let builds: Vec<&str> = ins
        .iter()
        .filter(|(op, a)| op == "RUN" && a.contains("cargo build"))
        .map(|(_, a)| a.as_str())
        .collect();
    assert!(
        builds.len() == 1 && builds[0].contains("--locked"),
        "{builds:?}"
    );
    assert_optimized_build(builds[0]);

    // The runtime stage installs a package for every library the binary links.
    let installed: BTreeSet<&str> = runtime
        .iter()
        .filter(|(op, a)| op == "RUN" && a.contains("apt-get install"))
        .flat_map(|(_, a)| a.split_whitespace())
        .collect();
    assert!(installed.contains("ca-certificates"), "{installed:?}");
    let ldd = run("ldd", &[env!("CARGO_BIN_EXE_kube-event-bridge")], None).await;
    assert!(ldd.success, "ldd: {}", ldd.stderr);
    for line in ldd.stdout.lines() {
        let lib = line.split_whitespace().next().unwrap_or("");
        let lib = lib.rsplit('/').next().unwrap();
        let package = RUNTIME_LIBRARIES
            .iter()
            .find(|(prefix, _)| lib.starts_with(prefix))
            .map(|(_, p)| *p)
            .unwrap_or_else(|| {
                panic!("the binary links {lib}: add its package to the Dockerfile's runtime stage and to RUNTIME_LIBRARIES")
            });
        assert!(
            DEBIAN_BASE.contains(&package) || installed.contains(package),
            "the binary links {lib} from {package}, which the runtime stage does not install"
        );
    }

    // The build context is an allow-list holding every target Cargo.toml declares.
    let ignore = read(&repo().join(".dockerignore"));
    let patterns: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(patterns.first(), Some(&"*"), "{patterns:?}");
    for needed in ["!Cargo.toml", "!Cargo.lock", "!src", "!tests", "!benches"] {
        assert!(
            patterns.contains(&needed),
            "{needed} missing from .dockerignore"
        );
    }
    let mut copied = BTreeSet::new();
    for (_, args) in ins
        .iter()
        .filter(|(op, a)| op == "COPY" && !a.starts_with("--from"))
    {
        let sources: Vec<&str> = args.split_whitespace().collect();
        for source in &sources[..sources.len() - 1] {
            assert!(
                patterns.contains(&format!("!{source}").as_str()),
                "COPY {source} is not in the build context"
            );
            copied.insert(*source);
        }
    }
    // Everything that changes what cargo builds reaches the builder: the link settings
    // (build.rs) and the allocator's compiled-in configuration (.cargo/config.toml), without
    // which the image's bridge would not be the one measured.
    for input in ["Cargo.toml", "Cargo.lock", "build.rs", ".cargo", "src"] {
        assert!(
            repo().join(input).exists(),
            "{input} is not in the repository"
        );
        assert!(
            copied.contains(input),
            "the Dockerfile does not copy {input} into the builder"
        );
    }

    if let Some(hadolint) = on_path("hadolint") {
        let path = repo().join("Dockerfile").display().to_string();
        let out = run(&hadolint, &[&path], None).await;
        assert!(out.success, "hadolint:\n{}{}", out.stdout, out.stderr);
    }
}

/// The image's build is optimised: `--release`, or `--profile P` where Cargo.toml's
/// `[profile.P]` inherits from release; and it installs the binary from that profile's directory.
fn assert_optimized_build(build: &str) {
    let words: Vec<&str> = build.split_whitespace().collect();
    let profile = match words.iter().position(|w| *w == "--profile") {
        Some(i) => {
            let name = words.get(i + 1).expect("a profile name after --profile");
            let manifest = read(&repo().join("Cargo.toml"));
            let section = manifest
                .split(&format!("[profile.{name}]"))
                .nth(1)
                .unwrap_or_else(|| {
                    panic!(
                        "the Dockerfile builds profile {name}, which Cargo.toml does not declare"
                    )
                });
            let section = section.split("\n[").next().unwrap();
            assert!(
                section.contains("inherits = \"release\""),
                "profile {name} must inherit from release: {section}"
            );
            (*name).to_string()
        }
        None => {
            assert!(words.contains(&"--release"), "an optimised build: {build}");
            "release".to_string()
        }
    };
    let binary = format!("target/{profile}/kube-event-bridge");
    assert!(
        build.contains(&binary),
        "the build installs {binary}: {build}"
    );
}

#[test]
fn docker_compose_runs_kafka_kraft_nats_jetstream_and_the_bridge() {
    let compose: Value = serde_saphyr::from_str(&read(&repo().join("docker-compose.yml")))
        .expect("docker-compose.yml parses");
    let services = compose["services"].as_object().expect("services");
    let names: BTreeSet<String> = services.keys().cloned().collect();
    assert_eq!(
        names,
        BTreeSet::from(["bridge", "kafka", "nats"].map(String::from))
    );

    let kafka = &compose["services"]["kafka"];
    assert!(str_of(&kafka["image"]).starts_with("apache/kafka:"));
    let env = &kafka["environment"];
    assert_eq!(
        env["KAFKA_PROCESS_ROLES"], "broker,controller",
        "KRaft, one combined node"
    );
    assert!(env.get("KAFKA_ZOOKEEPER_CONNECT").is_none());
    assert_eq!(
        env["KAFKA_ADVERTISED_LISTENERS"],
        "PLAINTEXT://localhost:9092"
    );
    let kafka_ports: Vec<String> = strings(&kafka["ports"]);
    assert!(
        kafka_ports.iter().any(|p| p.ends_with(":9092:9092")),
        "{kafka_ports:?}"
    );

    let nats = &compose["services"]["nats"];
    assert!(str_of(&nats["image"]).starts_with("nats:"));
    let command: Vec<String> = strings(&nats["command"]);
    assert!(
        command.iter().any(|a| a == "--jetstream" || a == "-js"),
        "JetStream enabled: {command:?}"
    );
    let nats_ports: Vec<String> = strings(&nats["ports"]);
    assert!(
        nats_ports.iter().any(|p| p.ends_with(":4222:4222")),
        "{nats_ports:?}"
    );

    let volumes = compose["volumes"].as_object().expect("named volumes");
    for service in [kafka, nats] {
        assert!(!service["healthcheck"]["test"].is_null(), "a healthcheck");
        for v in service["volumes"].as_array().unwrap() {
            let source = str_of(v).split(':').next().unwrap().to_string();
            assert!(
                volumes.contains_key(source.as_str()),
                "volume {source} is declared"
            );
        }
    }

    let bridge = &compose["services"]["bridge"];
    assert_eq!(bridge["build"]["context"], ".");
    assert!(
        repo()
            .join(str_of(&bridge["build"]["dockerfile"]))
            .is_file()
    );
    assert_eq!(
        bridge["network_mode"], "host",
        "reaches a kubeconfig's 127.0.0.1 server"
    );
    for dep in ["kafka", "nats"] {
        assert_eq!(bridge["depends_on"][dep]["condition"], "service_healthy");
    }
    let command: Vec<String> = strings(&bridge["command"]);
    let config_target = command
        .iter()
        .skip_while(|a| *a != "--config")
        .nth(1)
        .expect("run --config FILE")
        .clone();
    let kubeconfig_target = str_of(&bridge["environment"]["KUBECONFIG"]);
    let mounts: Vec<(String, String, String)> = bridge["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let v = str_of(v);
            // "${VAR:-${HOME}/x}:/target:ro": split off the target and mode from the right.
            let mut parts = v.rsplitn(3, ':');
            let mode = parts.next().unwrap().to_string();
            let target = parts.next().unwrap().to_string();
            (parts.next().unwrap().to_string(), target, mode)
        })
        .collect();
    let kubeconfig = mounts
        .iter()
        .find(|(_, t, _)| *t == kubeconfig_target)
        .expect("the kubeconfig is mounted where KUBECONFIG points");
    assert_eq!(kubeconfig.2, "ro");
    assert!(kubeconfig.0.contains("/.kube/config"), "{kubeconfig:?}");
    let config = mounts
        .iter()
        .find(|(_, t, _)| *t == config_target)
        .expect("the config file is mounted");
    assert_eq!(config.2, "ro");

    // Each selectable bridge config exists, is valid, and points at the compose brokers.
    for sink in ["kafka", "nats"] {
        let source = config
            .0
            .replace("${KEB_SINK:-kafka}", sink)
            .trim_start_matches("./")
            .to_string();
        let cfg = ConfigFile::parse(&read(&repo().join(&source)))
            .and_then(ConfigFile::validate)
            .unwrap_or_else(|e| panic!("{source}: {e}"));
        let settings = cfg.sink.as_any();
        match (
            settings.downcast_ref::<Kafka>(),
            settings.downcast_ref::<Nats>(),
            sink,
        ) {
            (Some(kafka), _, "kafka") => {
                assert_eq!(kafka.config.bootstrap_servers, "localhost:9092")
            }
            (_, Some(nats), "nats") => {
                assert_eq!(nats.config.url, "nats://localhost:4222");
                assert!(nats.config.jetstream.is_some(), "JetStream");
            }
            _ => panic!("{source}: sink {}", cfg.sink.kind()),
        }
    }
}

// ------------------------------------------------------------------ (e) src/rbac.rs, for real

/// Resolves `yaml`'s resources through discovery and applies `rbac::render` for `sa` in
/// `home` (creating the service account first); returns the rendering.
async fn apply_rendered_rbac(
    kubectl: &str,
    client: &kube::Client,
    yaml: &str,
    sa: &str,
    home: &str,
) -> (Vec<ResolvedResource>, String) {
    let config = ConfigFile::parse(yaml)
        .and_then(ConfigFile::validate)
        .unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    let resolved = discovery::resolve(client, &config.resources)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let election = &config.leader_election;
    let lease_namespace = election
        .enabled
        .then(|| election.namespace.as_deref().unwrap_or(home));
    let rendered = rbac::render(
        &resolved,
        sa,
        home,
        lease_namespace,
        config.reads_cluster_identity(),
    );
    create_service_account(kubectl, home, sa).await;
    kube(kubectl, &["apply", "-f", "-"], Some(&rendered)).await;
    (resolved, rendered)
}

#[tokio::test(flavor = "multi_thread")]
async fn rendered_rbac_with_fixed_namespaces_grants_reads_only_there() {
    let kubectl = kubectl();
    let client = kube_client().await;
    let home = unique_namespace(&client, "rbac-fixed-home").await;
    let a = unique_namespace(&client, "rbac-fixed-a").await;
    let b = unique_namespace(&client, "rbac-fixed-b").await;
    let elsewhere = unique_namespace(&client, "rbac-fixed-elsewhere").await;
    // Kinds, not plurals: discovery resolves them and the rules name the plurals.
    let yaml = format!(
        "cluster: dev\nleaderElection: {{enabled: true}}\ncheckpoint: {{nats: {{url: \"nats://127.0.0.1:4222\"}}}}\n\
         resources:\n\
         - {{apiVersion: v1, resource: ConfigMap, namespaces: [{a}]}}\n\
         - {{apiVersion: v1, resource: Secret, namespaces: [{a}]}}\n\
         - {{apiVersion: apps/v1, resource: Deployment, namespaces: [{a}, {b}]}}\n"
    );
    let sa = "bridge";
    let (_, rendered) = apply_rendered_rbac(&kubectl, &client, &yaml, sa, &home).await;
    let docs = documents(&rendered);
    assert!(
        docs.iter().all(|d| !kind(d).starts_with("Cluster")),
        "fixed namespaces need no cluster role:\n{rendered}"
    );

    let user = sa_user(&home, sa);
    let (a, b, home_s, elsewhere_s) = (a.as_str(), b.as_str(), home.as_str(), elsewhere.as_str());
    let mut checks = Vec::new();
    checks.extend(reads("configmaps", Scope::In(a), true));
    checks.extend(reads("secrets", Scope::In(a), true));
    checks.extend(reads("deployments.apps", Scope::In(a), true));
    checks.extend(reads("deployments.apps", Scope::In(b), true));
    checks.extend(reads("configmaps", Scope::In(b), false));
    checks.extend(reads("secrets", Scope::In(b), false));
    for scope in [Scope::In(elsewhere_s), Scope::In(home_s), Scope::Everywhere] {
        checks.extend(reads("configmaps", scope, false));
        checks.extend(reads("secrets", scope, false));
        checks.extend(reads("deployments.apps", scope, false));
    }
    for scope in [Scope::In(a), Scope::In(b)] {
        checks.extend(no_writes("configmaps", scope));
        checks.extend(no_writes("secrets", scope));
        checks.extend(no_writes("deployments.apps", scope));
        checks.extend(reads("pods", scope, false));
        checks.extend(reads("leases.coordination.k8s.io", scope, false));
    }
    checks.extend(reads("namespaces", Scope::Everywhere, false));
    // Leader election: get, create, update on Leases at home, nothing more.
    for verb in rbac::LEASE_VERBS {
        checks.push(check(
            verb,
            "leases.coordination.k8s.io",
            Scope::In(home_s),
            true,
        ));
    }
    for verb in ["list", "watch", "delete", "patch"] {
        checks.push(check(
            verb,
            "leases.coordination.k8s.io",
            Scope::In(home_s),
            false,
        ));
    }
    checks.push(check(
        "get",
        "leases.coordination.k8s.io",
        Scope::Everywhere,
        false,
    ));
    assert_can_i(&kubectl, &user, &checks).await;

    let read_verbs = "list watch";
    assert_listed(
        &kubectl,
        &user,
        a,
        &[
            ("configmaps", read_verbs),
            ("secrets", read_verbs),
            ("deployments.apps", read_verbs),
        ],
    )
    .await;
    assert_listed(&kubectl, &user, b, &[("deployments.apps", read_verbs)]).await;
    assert_listed(
        &kubectl,
        &user,
        home_s,
        &[("leases.coordination.k8s.io", "get create update")],
    )
    .await;
    assert_listed(&kubectl, &user, elsewhere_s, &[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rendered_rbac_without_fixed_namespaces_uses_a_cluster_role_for_those_only() {
    let kubectl = kubectl();
    let client = kube_client().await;
    let group = format!("{}.test.kube-event-bridge.dev", unique_name("rbac"));
    create_crd(&client, &group, "Gadget", "gadgets", "Namespaced").await;
    let home = unique_namespace(&client, "rbac-cluster-home").await;
    let vault = unique_namespace(&client, "rbac-cluster-vault").await;
    let other = unique_namespace(&client, "rbac-cluster-other").await;
    let yaml = format!(
        "cluster: dev\nresources:\n\
         - {{apiVersion: v1, resource: ConfigMap}}\n\
         - {{apiVersion: v1, resource: namespaces}}\n\
         - {{apiVersion: {group}/v1, resource: Gadget}}\n\
         - {{apiVersion: v1, resource: Secret, namespaces: [{vault}]}}\n"
    );
    let sa = "bridge";
    let (resolved, rendered) = apply_rendered_rbac(&kubectl, &client, &yaml, sa, &home).await;
    assert!(
        resolved.iter().any(|r| r.api.plural == "gadgets"),
        "{resolved:?}"
    );
    let kinds: Vec<String> = documents(&rendered)
        .iter()
        .map(|d| {
            format!(
                "{} {}",
                kind(d),
                d["metadata"]["namespace"].as_str().unwrap_or("-")
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "ClusterRole -".to_string(),
            "ClusterRoleBinding -".into(),
            format!("Role {vault}"),
            format!("RoleBinding {vault}"),
            "Role kube-system".into(),
            "RoleBinding kube-system".into(),
        ],
        "leader election is off: no Lease Role; the audit extensions (on by default) read the \
         cluster id\n{rendered}"
    );

    let user = sa_user(&home, sa);
    let gadgets = format!("gadgets.{group}");
    let mut checks = Vec::new();
    for scope in [
        Scope::In(home.as_str()),
        Scope::In(vault.as_str()),
        Scope::In(other.as_str()),
        Scope::Everywhere,
    ] {
        checks.extend(reads("configmaps", scope, true));
        checks.extend(reads(&gadgets, scope, true));
        checks.extend(no_writes("configmaps", scope));
        checks.extend(no_writes(&gadgets, scope));
        checks.extend(reads("pods", scope, false));
        checks.extend(reads("serviceaccounts", scope, false));
    }
    checks.extend(reads("namespaces", Scope::Everywhere, true));
    checks.extend(no_writes("namespaces", Scope::Everywhere));
    // The Secret stays readable in its one namespace, not through the cluster role.
    checks.extend(reads("secrets", Scope::In(vault.as_str()), true));
    checks.extend(no_writes("secrets", Scope::In(vault.as_str())));
    for scope in [
        Scope::In(home.as_str()),
        Scope::In(other.as_str()),
        Scope::Everywhere,
    ] {
        checks.extend(reads("secrets", scope, false));
    }
    checks.extend(reads("leases.coordination.k8s.io", Scope::In(&home), false));
    checks.extend(no_writes("leases.coordination.k8s.io", Scope::In(&home)));
    assert_can_i(&kubectl, &user, &checks).await;

    let read_verbs = "list watch";
    let cluster_wide = [
        ("configmaps", read_verbs),
        ("namespaces", read_verbs),
        (gadgets.as_str(), read_verbs),
    ];
    assert_listed(&kubectl, &user, &other, &cluster_wide).await;
    let mut in_vault = cluster_wide.to_vec();
    in_vault.push(("secrets", read_verbs));
    assert_listed(&kubectl, &user, &vault, &in_vault).await;
    delete_cluster_objects(&kubectl, &rbac::role_name(sa, &home)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docs_show_the_rbac_rendered_for_the_stdout_example() {
    let client = kube_client().await;
    let config = ConfigFile::load(&repo().join("examples/stdout.yaml"))
        .and_then(ConfigFile::validate)
        .unwrap();
    let resolved = discovery::resolve(&client, &config.resources)
        .await
        .unwrap();
    // What the `rbac` command prints: the resources, the identity and the snapshot requests.
    let needs = rbac::needs(&config, None, "kube-event-bridge");
    let rendered = rbac::render_needs(&resolved, "kube-event-bridge", "kube-event-bridge", &needs);
    let docs = read(&repo().join("docs/deploy.md"));
    assert!(
        docs.contains(&rendered),
        "docs/deploy.md must show `kube-event-bridge rbac --config examples/stdout.yaml \\
         --service-account kube-event-bridge --namespace kube-event-bridge`:\n{rendered}"
    );
}

#[test]
fn permissions_of_hand_resolved_resources_match_grants() {
    // A pure check that the test's own RBAC reading agrees with src/rbac.rs on a rendering.
    use kube::core::{ApiResource, GroupVersionKind};
    let config = ConfigFile::parse(
        "cluster: dev\nresources:\n- {apiVersion: v1, resource: ConfigMap, namespaces: [a]}\n- {apiVersion: v1, resource: namespaces}\n",
    )
    .and_then(ConfigFile::validate)
    .unwrap();
    let resolved: Vec<ResolvedResource> = config
        .resources
        .into_iter()
        .zip([
            ("ConfigMap", "configmaps", true),
            ("Namespace", "namespaces", false),
        ])
        .map(|(r, (k, p, namespaced))| ResolvedResource {
            api: ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", k), p),
            config: r,
            namespaced,
        })
        .collect();
    let docs = documents(&rbac::render(&resolved, "sa", "ns", None, false));
    let grants =
        |g: &str, p: &str| -> Grants { [(g.to_string(), BTreeSet::from([p.to_string()]))].into() };
    assert_eq!(
        rendered_permissions(&docs, &rbac::role_name("sa", "ns")),
        Permissions {
            cluster: grants("", "namespaces"),
            namespaced: [("a".to_string(), grants("", "configmaps"))].into(),
        }
    );
}
