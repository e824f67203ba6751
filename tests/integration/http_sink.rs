//! The HTTP sink end to end: the real bridge against the real API server, posting to receivers in
//! the test process that parse every request with the CloudEvents SDK (`receiver.rs`). Binary and
//! structured mode, per-object order under concurrency, Knative's shape and `K_SINK`, receivers
//! that fail intermittently, are down for a while, refuse an event or every event, TLS with a
//! custom CA, and credentials read from files.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cloudevents::AttributesReader;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::admin::get;
use crate::harness::{Bridge, Reader, Received, summary};
use crate::receiver::{Receiver, Reply};
use crate::stalls::{sample, wait_recovered, wait_stalled};
use crate::support::{env, kube_client, unique_name, unique_namespace, wait_until};

const WAIT: Duration = Duration::from_secs(120);

fn cm(name: &str, v: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": v}})).unwrap()
}

/// A bridge config for configmaps of `ns`, posting as `sink` says; checkpoints in `dir`.
fn config(cluster: &str, ns: &str, dir: &std::path::Path, sink: &str) -> String {
    format!(
        "cluster: {cluster}\ncheckpoint: {{intervalMs: 200, directory: \"{}\"}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink:\n  http:\n{sink}",
        dir.display()
    )
}

/// What every test here starts from: a client, a fresh namespace, a cluster name and a
/// directory for checkpoints and credential files.
async fn scene(prefix: &str) -> (kube::Client, String, String, tempfile::TempDir) {
    let client = kube_client().await;
    let ns = unique_namespace(&client, prefix).await;
    (client, ns, unique_name("c"), tempfile::tempdir().unwrap())
}

fn reader(receiver: &Receiver) -> Reader {
    Reader::Http(receiver.clone(), 0)
}

/// Per object (name), the resourceVersions in arrival order.
fn versions(events: &[Received]) -> BTreeMap<String, Vec<u64>> {
    let mut m: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in events {
        m.entry(r.ext("name")).or_default().push(r.rv());
    }
    m
}

/// Creates `objects` ConfigMaps and updates each `updates` times; returns every resourceVersion
/// the API server gave each object, in order.
async fn churn(cms: &Api<ConfigMap>, objects: usize, updates: usize) -> BTreeMap<String, Vec<u64>> {
    let mut want: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let rv = |c: &ConfigMap| {
        c.metadata
            .resource_version
            .as_deref()
            .unwrap()
            .parse()
            .unwrap()
    };
    for i in 0..objects {
        let name = format!("o{i}");
        let c = cms
            .create(&PostParams::default(), &cm(&name, "0"))
            .await
            .unwrap();
        want.entry(name).or_default().push(rv(&c));
    }
    for u in 1..=updates {
        for i in 0..objects {
            let name = format!("o{i}");
            let patch = Patch::Merge(json!({"data": {"v": u.to_string()}}));
            let c = cms
                .patch(&name, &PatchParams::default(), &patch)
                .await
                .unwrap();
            want.get_mut(&name).unwrap().push(rv(&c));
        }
    }
    want
}

/// Binary mode with a URL per resource (a template): attributes in `ce-` headers, the object as
/// the body, parsed by the SDK; posted to the path the template renders.
#[tokio::test(flavor = "multi_thread")]
async fn http_binary_mode_posts_to_the_rendered_url() {
    let (client, ns, cluster, dir) = scene("httpbin").await;
    let receiver = Receiver::start();
    let sink = format!(
        "    url: \"{}{{resource}}/{{namespace}}?name={{name}}\"\n",
        receiver.url()
    );
    let mut bridge = Bridge::start(&config(&cluster, &ns, dir.path(), &sink));
    bridge.wait_synced(1).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let created = cms
        .create(&PostParams::default(), &cm("a.b", "1"))
        .await
        .unwrap();
    cms.delete("a.b", &DeleteParams::default()).await.unwrap();
    let events = reader(&receiver)
        .read_until(WAIT, |got| got.len() >= 2)
        .await;
    let uid = created.metadata.uid.unwrap();
    let added = &events[0];
    assert_eq!(added.change(), "added", "{}", summary(&events));
    assert_eq!(events[1].change(), "deleted", "{}", summary(&events));
    assert_eq!(added.destination, format!("/configmaps/{ns}?name=a.b"));
    assert_eq!(added.headers["content-type"], "application/json");
    assert_eq!(added.headers["ce-specversion"], "1.0");
    assert_eq!(added.headers["ce-subject"], format!("{ns}/a.b"));
    let rv = created.metadata.resource_version.unwrap();
    assert_eq!(added.event.id(), format!("{uid}:{rv}:added"));
    assert_eq!(added.ext("sequence"), format!("{rv:0>20}"));
    assert_eq!(added.ext("cluster"), cluster);
    assert_eq!(added.data()["data"]["v"], "1");
    assert!(
        receiver
            .seen()
            .iter()
            .all(|s| s.content_type == "application/json"),
        "binary mode"
    );
    drop(bridge);
}

/// Structured mode: one `application/cloudevents+json` document per request, with the
/// configured extensions.
#[tokio::test(flavor = "multi_thread")]
async fn http_structured_mode_carries_extensions() {
    let (client, ns, cluster, dir) = scene("httpstr").await;
    let receiver = Receiver::start();
    let sink = format!(
        "    url: \"{}\"\n    contentMode: structured\n    extensions: {{team: payments}}\n",
        receiver.url()
    );
    let bridge = Bridge::start(&config(&cluster, &ns, dir.path(), &sink));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    cms.create(&PostParams::default(), &cm("s", "1"))
        .await
        .unwrap();
    let events = reader(&receiver)
        .read_until(WAIT, |got| !got.is_empty())
        .await;
    let e = &events[0];
    assert_eq!(e.ext("team"), "payments");
    assert_eq!(e.ext("name"), "s");
    assert_eq!(e.data()["data"]["v"], "1");
    let seen = receiver.seen();
    assert!(
        seen[0]
            .content_type
            .starts_with("application/cloudevents+json"),
        "{seen:?}"
    );
    assert!(
        !e.headers.contains_key("ce-id"),
        "no ce- headers in structured mode"
    );
    drop(bridge);
}

/// Many objects changing at once while the receiver answers slowly: requests overlap across
/// objects (never more than `maxInFlight`), and each object's events arrive in order.
#[tokio::test(flavor = "multi_thread")]
async fn http_keeps_order_per_object_under_concurrency() {
    let (client, ns, cluster, dir) = scene("httpord").await;
    let receiver = Receiver::start();
    let mut n = 0u64;
    receiver.script(move |_| {
        n += 1;
        Reply::Slow(Duration::from_millis(n * 7 % 40))
    });
    let sink = format!("    url: \"{}\"\n    maxInFlight: 4\n", receiver.url());
    let mut bridge = Bridge::start(&config(&cluster, &ns, dir.path(), &sink));
    bridge.wait_synced(1).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let want = churn(&cms, 12, 5).await;
    let total: usize = want.values().map(Vec::len).sum();
    let events = reader(&receiver)
        .read_until(WAIT, |got| got.len() >= total)
        .await;
    assert_eq!(versions(&events), want, "{}", summary(&events));
    let most = receiver.max_in_flight();
    assert!(
        (2..=4).contains(&most),
        "requests overlapped across objects, within maxInFlight: {most}"
    );
    drop(bridge);
}

/// No `sink` section, `K_SINK` and `K_CE_OVERRIDES` set as Knative's SinkBinding sets them, and
/// `eventFormat: knative`: ApiServerSource's types (`resource.*`, `ref.*` for references), source
/// and subject, with the bridge's id and extensions kept.
#[tokio::test(flavor = "multi_thread")]
async fn http_knative_drop_in_from_k_sink() {
    let (client, ns, cluster, dir) = scene("httpkn").await;
    let receiver = Receiver::start();
    let config = format!(
        "cluster: {cluster}\neventFormat: knative\ncheckpoint: {{directory: \"{}\"}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n- {{apiVersion: v1, resource: secrets, namespaces: [{ns}], payload: reference}}\n",
        dir.path().display()
    );
    let url = receiver.url();
    let mut bridge = Bridge::start_with_env(
        &config,
        &[
            ("K_SINK", url.as_str()),
            (
                "K_CE_OVERRIDES",
                r#"{"extensions": {"sinkbinding": "yes"}}"#,
            ),
        ],
    );
    bridge.wait_synced(2).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let c = cms
        .create(&PostParams::default(), &cm("k", "1"))
        .await
        .unwrap();
    let patch = Patch::Merge(json!({"data": {"v": "2"}}));
    cms.patch("k", &PatchParams::default(), &patch)
        .await
        .unwrap();
    cms.delete("k", &DeleteParams::default()).await.unwrap();
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "s"}, "stringData": {"x": "y"}}))
            .unwrap();
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let events = reader(&receiver)
        .read_until(WAIT, |got| got.len() >= 4)
        .await;
    let types: BTreeSet<(&str, String)> = events
        .iter()
        .map(|r| (r.event.ty(), r.ext("name")))
        .collect();
    let want: BTreeSet<(&str, String)> = [
        ("dev.knative.apiserver.resource.add", "k"),
        ("dev.knative.apiserver.resource.update", "k"),
        ("dev.knative.apiserver.resource.delete", "k"),
        ("dev.knative.apiserver.ref.add", "s"),
    ]
    .into_iter()
    .map(|(t, n)| (t, n.to_string()))
    .collect();
    assert_eq!(types, want, "{}", summary(&events));
    let kubeconfig = kube::config::Kubeconfig::read_from(env().kubeconfig).unwrap();
    let server = kubeconfig.clusters[0]
        .cluster
        .as_ref()
        .unwrap()
        .server
        .clone()
        .unwrap();
    let e = events.iter().find(|r| r.ext("name") == "k").unwrap();
    assert_eq!(e.event.source().to_string(), server.trim_end_matches('/'));
    let subject = format!("/apis/v1/namespaces/{ns}/configmaps/k");
    assert_eq!(e.event.subject(), Some(subject.as_str()));
    let uid = c.metadata.uid.unwrap();
    let rv = c.metadata.resource_version.unwrap();
    assert_eq!(e.event.id(), format!("{uid}:{rv}:added"), "the bridge's id");
    assert_eq!(e.ext("sinkbinding"), "yes");
    assert_eq!(e.ext("sequence"), format!("{rv:0>20}"));
    assert_eq!(e.data()["metadata"]["name"], "k");
    let s = events.iter().find(|r| r.ext("name") == "s").unwrap();
    assert_eq!(
        s.data(),
        json!({"apiVersion": "v1", "kind": "Secret", "name": "s", "namespace": ns})
    );
}

/// A receiver that fails often: 503 with `Retry-After`, 429, dropped connections, a timeout.
/// Every event arrives once, with its id unchanged, each object's events in order.
#[tokio::test(flavor = "multi_thread")]
async fn http_intermittent_failures_lose_nothing() {
    let (client, ns, cluster, dir) = scene("httpflaky").await;
    let receiver = Receiver::start();
    let mut n = 0usize;
    receiver.script(move |seen| {
        n += 1;
        if seen.attempt > 0 {
            return Reply::Accept;
        }
        match n % 5 {
            0 => Reply::RetryAfter(503, "1".into()),
            1 => Reply::Status(429),
            2 => Reply::Drop,
            3 if n % 15 == 3 => Reply::Slow(Duration::from_secs(3)),
            _ => Reply::Accept,
        }
    });
    let sink = format!("    url: \"{}\"\n    timeoutSecs: 1\n", receiver.url());
    let mut bridge = Bridge::start(&config(&cluster, &ns, dir.path(), &sink));
    bridge.wait_synced(1).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let want = churn(&cms, 8, 4).await;
    let total: usize = want.values().map(Vec::len).sum();
    let mut got = Vec::new();
    wait_until("every change accepted", WAIT, || {
        let accepted = receiver.accepted();
        let ids: BTreeSet<String> = accepted.iter().map(|r| r.event.id().to_string()).collect();
        got = accepted;
        async move { (ids.len() >= total).then_some(()) }
    })
    .await;
    // A request that timed out on the bridge's side may still have been accepted: a duplicate
    // with the same id, which consumers drop. Deduplicated, order per object holds.
    let mut first = BTreeSet::new();
    let unique: Vec<Received> = got
        .into_iter()
        .filter(|r| first.insert(r.event.id().to_string()))
        .collect();
    assert_eq!(versions(&unique), want, "{}", summary(&unique));
    let seen = receiver.seen();
    let failed: BTreeSet<&str> = seen
        .iter()
        .filter(|s| !matches!(s.reply, Some(Reply::Accept)))
        .map(|s| s.id.as_str())
        .collect();
    assert!(!failed.is_empty());
    for id in &failed {
        assert!(
            first.contains(*id),
            "a refused event is sent again with the same id: {id}"
        );
    }
    let metrics = get(&bridge.admin_address().await, "/metrics").await.1;
    let retried = sample(
        &metrics,
        "kube_event_bridge_publish_failures_total",
        "reason=\"retried\"",
    );
    assert!(retried.unwrap_or(0.0) >= failed.len() as f64, "{metrics}");
    drop(bridge);
}

/// The receiver is down (connections refused) long enough for the watch to report itself
/// stalled; once it is back, every change made meanwhile arrives and `/readyz` recovers.
/// One receiver per namespace; one answers 429 with `Retry-After: 120` for ever while 300
/// objects wait for it: the other receiver still gets its changes at once (a request waiting out
/// its origin's `Retry-After` holds no request slot), and the bridge stops within its grace.
#[tokio::test(flavor = "multi_thread")]
async fn http_one_receivers_retry_after_never_starves_another() {
    let (client, slow_ns, cluster, dir) = scene("httpslow").await;
    let ok_ns = unique_namespace(&client, "httpok").await;
    let (slow, ok) = (Receiver::start(), Receiver::start());
    slow.script(|_| Reply::RetryAfter(429, "120".into()));
    let config = format!(
        "cluster: {cluster}\ncheckpoint: {{intervalMs: 200, directory: \"{}\"}}\ndelivery: {{shutdownGraceSecs: 5}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{slow_ns}], url: \"{}\"}}\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ok_ns}], url: \"{}\"}}\nsink:\n  http:\n    url: \"{}\"\n    maxInFlight: 16\n",
        dir.path().display(),
        slow.url(),
        ok.url(),
        ok.url(),
    );
    let mut bridge = Bridge::start(&config);
    bridge.wait_synced(2).await;
    let slow_cms: Api<ConfigMap> = Api::namespaced(client.clone(), &slow_ns);
    for i in 0..300 {
        slow_cms
            .create(&PostParams::default(), &cm(&format!("s{i}"), "0"))
            .await
            .unwrap();
    }
    // Once it answered with its Retry-After, every request to it waits for two minutes.
    wait_until("the slow receiver is refusing", WAIT, || {
        let n = slow.seen().len();
        async move { (n >= 1).then_some(()) }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ok_cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ok_ns);
    let started = std::time::Instant::now();
    let want = churn(&ok_cms, 5, 3).await;
    let total: usize = want.values().map(Vec::len).sum();
    wait_until(
        "every change for the healthy receiver accepted",
        Duration::from_secs(20),
        || {
            let ids: BTreeSet<String> = ok
                .accepted()
                .iter()
                .map(|r| r.event.id().to_string())
                .collect();
            async move { (ids.len() >= total).then_some(()) }
        },
    )
    .await;
    eprintln!(
        "healthy receiver: {total} changes in {:.1}s beside a receiver holding 300 objects off",
        started.elapsed().as_secs_f64()
    );
    // Events still waiting for the held receiver are published again after a restart: the
    // bridge stops at the end of its grace (5 s), saying so, and exits non-zero.
    bridge.signal("TERM");
    bridge
        .wait_exit(Duration::from_secs(15))
        .await
        .expect("the bridge stops within its grace period");
    assert_eq!(
        bridge.count_log(
            "grace period over with events still in flight; they will be published again after restart"
        ),
        1
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn http_receiver_down_for_a_while() {
    let (client, ns, cluster, dir) = scene("httpdown").await;
    let mut receiver = Receiver::start();
    let sink = format!("    url: \"{}\"\n", receiver.url());
    let mut bridge = Bridge::start(&config(&cluster, &ns, dir.path(), &sink));
    bridge.wait_synced(1).await;
    let address = bridge.admin_address().await;
    receiver.stop();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let want = churn(&cms, 5, 2).await;
    let metrics = wait_stalled(&bridge, &address, "publish_failing").await;
    assert!(
        sample(
            &metrics,
            "kube_event_bridge_publish_failures_total",
            "reason=\"retried\""
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{metrics}"
    );
    assert!(receiver.accepted().is_empty());
    receiver.resume();
    wait_recovered(&bridge, &address).await;
    let total: usize = want.values().map(Vec::len).sum();
    let events = reader(&receiver)
        .read_until(WAIT, |got| got.len() >= total)
        .await;
    assert_eq!(versions(&events), want, "{}", summary(&events));
}

/// A 400 refuses one event for good: counted, logged with the object, skipped, and the objects
/// behind it arrive. A 401 refuses every event: the watch stalls (`not_authorized`) and
/// resumes, losing nothing, once the receiver accepts again.
#[tokio::test(flavor = "multi_thread")]
async fn http_400_is_skipped_and_401_blocks_until_fixed() {
    let (client, ns, cluster, dir) = scene("http4xx").await;
    let receiver = Receiver::start();
    let sink = format!("    url: \"{}?name={{name}}\"\n", receiver.url());
    receiver.script(|seen| {
        if seen.path.ends_with("name=bad") {
            Reply::Status(400)
        } else {
            Reply::Accept
        }
    });
    let mut bridge = Bridge::start(&config(&cluster, &ns, dir.path(), &sink));
    bridge.wait_synced(1).await;
    let address = bridge.admin_address().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    let bad = cms.create(&pp, &cm("bad", "1")).await.unwrap();
    cms.create(&pp, &cm("good", "1")).await.unwrap();
    let mut reader = reader(&receiver);
    let events = reader.read_until(WAIT, |got| !got.is_empty()).await;
    assert_eq!(events[0].ext("name"), "good", "{}", summary(&events));
    bridge
        .wait_log("broker refused event for good, skipped")
        .await;
    let refused = bridge
        .log_text()
        .lines()
        .find(|l| l.contains("broker refused event for good, skipped"))
        .unwrap()
        .to_string();
    assert!(
        refused.contains(&format!("{ns}/bad {}", bad.metadata.uid.unwrap())),
        "{refused}"
    );
    assert!(refused.contains("\"reason\":\"invalid\""), "{refused}");

    receiver.script(|_| Reply::Status(401));
    cms.create(&pp, &cm("later", "1")).await.unwrap();
    let metrics = wait_stalled(&bridge, &address, "not_authorized").await;
    assert!(
        sample(
            &metrics,
            "kube_event_bridge_publish_failures_total",
            "reason=\"invalid\""
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{metrics}"
    );
    receiver.script(|_| Reply::Accept);
    wait_recovered(&bridge, &address).await;
    let events = reader.read_until(WAIT, |got| !got.is_empty()).await;
    assert_eq!(events[0].ext("name"), "later", "{}", summary(&events));
}

/// HTTPS with the environment's CA (the receiver serves the brokers' certificate for
/// 127.0.0.1), a bearer token from a file, re-read after the receiver refuses a rotated one;
/// the token never shows in the log.
#[tokio::test(flavor = "multi_thread")]
async fn http_tls_with_a_custom_ca_and_a_rotated_bearer_token() {
    let (ca, _) = crate::support::testenv_cas();
    let receiver = Receiver::start_https();
    let (client, ns, cluster, dir) = scene("httptls").await;
    let token = dir.path().join("token");
    std::fs::write(&token, "first-s3cret\n").unwrap();
    let accepted_token =
        std::sync::Arc::new(std::sync::Mutex::new("Bearer first-s3cret".to_string()));
    let expected = accepted_token.clone();
    receiver.script(move |seen| {
        if seen.authorization.as_deref() == Some(expected.lock().unwrap().as_str()) {
            Reply::Accept
        } else {
            Reply::Status(401)
        }
    });
    let sink = format!(
        "    url: \"{}\"\n    credentials: {{tlsCaFile: \"{ca}\", bearerTokenFile: \"{}\"}}\n",
        receiver.url(),
        token.display()
    );
    let bridge = Bridge::start(&config(&cluster, &ns, dir.path(), &sink));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    cms.create(&pp, &cm("one", "1")).await.unwrap();
    let mut reader = reader(&receiver);
    let events = reader.read_until(WAIT, |got| !got.is_empty()).await;
    assert!(receiver.url().starts_with("https://"));
    assert_eq!(events[0].ext("name"), "one");

    // The Secret rotates: the receiver only takes the new token from now on.
    std::fs::write(&token, "second-s3cret\n").unwrap();
    *accepted_token.lock().unwrap() = "Bearer second-s3cret".into();
    cms.create(&pp, &cm("two", "1")).await.unwrap();
    let events = reader.read_until(WAIT, |got| !got.is_empty()).await;
    assert_eq!(events[0].ext("name"), "two");
    let log = bridge.log_text();
    assert!(!log.contains("s3cret"), "{log}");
}

/// `K_SINK` naming an HTTPS receiver whose certificate a private CA signed, and that CA in
/// `K_CA_CERTS` (PEM, as Knative's SinkBinding injects it): the bridge trusts it besides the
/// public roots and delivers.
#[tokio::test(flavor = "multi_thread")]
async fn http_k_sink_over_https_trusts_k_ca_certs() {
    let (ca, _) = crate::support::testenv_cas();
    let receiver = Receiver::start_https();
    let (client, ns, cluster, dir) = scene("httpkca").await;
    let config = format!(
        "cluster: {cluster}\ncheckpoint: {{directory: \"{}\"}}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n",
        dir.path().display()
    );
    let url = receiver.url();
    assert!(url.starts_with("https://"), "{url}");
    let pem = std::fs::read_to_string(&ca).unwrap();
    let bridge = Bridge::start_with_env(&config, &[("K_SINK", url.as_str()), ("K_CA_CERTS", &pem)]);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    cms.create(&PostParams::default(), &cm("one", "1"))
        .await
        .unwrap();
    let events = reader(&receiver)
        .read_until(WAIT, |got| !got.is_empty())
        .await;
    assert_eq!(events[0].ext("name"), "one", "{}", summary(&events));
    drop(bridge);
}

/// A receiver whose certificate the configured CA did not sign is refused: nothing is accepted
/// and the watch reports failing publishes instead of skipping events.
#[tokio::test(flavor = "multi_thread")]
async fn http_tls_refuses_a_receiver_the_ca_did_not_sign() {
    let (_, other_ca) = crate::support::testenv_cas();
    let receiver = Receiver::start_https();
    let (client, ns, cluster, dir) = scene("httptlsno").await;
    let sink = format!(
        "    url: \"{}\"\n    credentials: {{tlsCaFile: \"{other_ca}\"}}\n",
        receiver.url()
    );
    let mut bridge = Bridge::start(&config(&cluster, &ns, dir.path(), &sink));
    bridge.wait_synced(1).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    cms.create(&PostParams::default(), &cm("x", "1"))
        .await
        .unwrap();
    bridge.wait_log("publish failed, retrying").await;
    let line = bridge
        .log_text()
        .lines()
        .find(|l| l.contains("publish failed, retrying"))
        .unwrap()
        .to_string();
    assert!(line.to_lowercase().contains("certificate"), "{line}");
    assert!(receiver.accepted().is_empty());
}

/// Basic credentials: the user from the config, the password from a file; never in the log.
#[tokio::test(flavor = "multi_thread")]
async fn http_basic_credentials_from_a_file() {
    let receiver = Receiver::start();
    let (client, ns, cluster, dir) = scene("httpbasic").await;
    let password = dir.path().join("password");
    std::fs::write(&password, "pa55-s3cret\n").unwrap();
    // "bridge:pa55-s3cret" in base64.
    let expected = "Basic YnJpZGdlOnBhNTUtczNjcmV0";
    receiver.script(move |seen| {
        if seen.authorization.as_deref() == Some(expected) {
            Reply::Accept
        } else {
            Reply::Status(403)
        }
    });
    let sink = format!(
        "    url: \"{}\"\n    credentials: {{user: bridge, passwordFile: \"{}\"}}\n",
        receiver.url(),
        password.display()
    );
    let bridge = Bridge::start(&config(&cluster, &ns, dir.path(), &sink));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    cms.create(&PostParams::default(), &cm("b", "1"))
        .await
        .unwrap();
    let events = reader(&receiver)
        .read_until(WAIT, |got| !got.is_empty())
        .await;
    assert_eq!(events[0].ext("name"), "b");
    let log = bridge.log_text();
    assert!(
        !log.contains("s3cret") && !log.contains("YnJpZGdl"),
        "{log}"
    );
}
