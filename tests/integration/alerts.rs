//! The alert rules of `deploy/monitoring` pass Prometheus's own tool: `promtool check rules`,
//! and `promtool test rules` against their unit tests (`prometheus-rules.test.yaml`: the leader
//! rule under leader election, with two installations and with sharding; stalls, corrupt
//! checkpoints, checkpoints behind, shards left without an owner).
//!
//! The chart's PrometheusRule (`metrics.prometheusRule`) holds the same rules, passing promtool
//! too, with each `runbook_url` under the configured base.
//!
//! A live `/metrics` scrape passes `promtool check metrics` (the Prometheus text format, served
//! to a scraper that does not ask for OpenMetrics; OpenMetrics to one that does).
//!
//! promtool comes from `KEB_PROMTOOL`, helm as the deploy tests find it (`scripts/testenv`
//! builds both from the Go module proxy); without them the tests fail.

use std::path::{Path, PathBuf};
use std::process::Command;

fn promtool() -> String {
    match std::env::var("KEB_PROMTOOL") {
        Ok(p) if Path::new(&p).is_file() => p,
        Ok(p) => panic!(
            "promtool is not available (KEB_PROMTOOL={p} does not exist): run `scripts/testenv up` \
             (it builds promtool) and load its variables"
        ),
        Err(_) => panic!(
            "promtool is not available (KEB_PROMTOOL is not set): run `scripts/testenv up` (it \
             builds promtool) and load its variables (`eval \"$(scripts/testenv env)\"`)"
        ),
    }
}

fn monitoring() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/monitoring")
}

/// Runs promtool with `args` in deploy/monitoring; panics with its output unless it succeeds.
fn promtool_ok(args: &[&str]) -> String {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(monitoring())
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn alert_rules_pass_promtool_and_their_unit_tests() {
    let checked = promtool_ok(&["check", "rules", "prometheus-rules.yaml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool_ok(&["test", "rules", "prometheus-rules.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// Every rule names its section of docs/runbook.md, and that section exists.
#[test]
fn every_alert_has_a_runbook_section() {
    let rules = std::fs::read_to_string(monitoring().join("prometheus-rules.yaml")).unwrap();
    let runbook =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/runbook.md"))
            .unwrap();
    let parsed: serde_json::Value = serde_saphyr::from_str(&rules).expect("rules are YAML");
    let list = parsed["groups"][0]["rules"].as_array().expect("rules");
    for rule in list {
        let name = rule["alert"].as_str().expect("an alert name");
        let url = rule["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} has no runbook_url"));
        assert_eq!(
            url,
            format!("docs/runbook.md#{}", name.to_lowercase()),
            "{name}"
        );
        assert!(
            runbook.contains(&format!("\n## {name}\n")),
            "docs/runbook.md has no section {name}"
        );
    }
}

/// The PrometheusRule the chart renders passes `promtool check rules`, and its runbook links
/// start with `metrics.prometheusRule.runbookBaseUrl`.
#[test]
fn the_charts_prometheus_rule_passes_promtool() {
    let helm = crate::deploy::helm();
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/helm/kube-event-bridge");
    let out = Command::new(helm)
        .args(["template", "keb"])
        .arg(&chart)
        .args([
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--set",
            "metrics.prometheusRule.runbookBaseUrl=https://docs.example.com/keb/",
            "--show-only",
            "templates/prometheusrule.yaml",
        ])
        .output()
        .expect("run helm");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered: serde_json::Value = serde_saphyr::from_slice(&out.stdout).expect("YAML");
    assert_eq!(rendered["kind"], "PrometheusRule");
    let spec = serde_saphyr::to_string(&rendered["spec"]).unwrap();
    assert!(
        spec.contains(
            "runbook_url: https://docs.example.com/keb/docs/runbook.md#kubeeventbridgenoleader"
        ),
        "{spec}"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yaml");
    std::fs::write(&file, spec).unwrap();
    let checked = promtool_ok(&["check", "rules", file.to_str().unwrap()]);
    assert!(checked.contains("SUCCESS: 12 rules found"), "{checked}");
}

/// A live scrape of a running bridge passes `promtool check metrics` (no lint problem), and a
/// scraper asking for OpenMetrics gets it.
#[tokio::test(flavor = "multi_thread")]
async fn a_live_metrics_scrape_passes_promtool_check_metrics() {
    use crate::harness::{Bridge, SinkKind, sink_yaml};
    let client = crate::support::kube_client().await;
    let ns = crate::support::unique_namespace(&client, "scrape").await;
    let cluster = crate::support::unique_name("c");
    let config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n{}",
        sink_yaml(SinkKind::Stdout, &cluster)
    );
    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(1).await;
    let url = format!("http://{}/metrics", bridge.admin_address().await);
    kube_event_bridge::tls::install_crypto_provider();
    let text = reqwest::get(&url).await.unwrap();
    assert_eq!(
        text.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let body = text.text().await.unwrap();
    let mut check = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run promtool");
    use std::io::Write;
    check
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}\n{body}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let openmetrics = reqwest::Client::new()
        .get(&url)
        .header("accept", "application/openmetrics-text;version=1.0.0")
        .send()
        .await
        .unwrap();
    assert_eq!(
        openmetrics.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(openmetrics.text().await.unwrap().ends_with("# EOF\n"));
}
