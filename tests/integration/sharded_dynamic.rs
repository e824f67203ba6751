//! Watches that come and go while three replicas share them (`sharding`): a CRD matched by a
//! wildcard and namespaces gaining or losing a selector's label are assigned like the watches
//! known at the start, each run by exactly one replica at a time, fairly spread; a watch no
//! longer desired stops where it ran and its Lease is left without holder. Every event arrives
//! once.

use std::collections::BTreeMap;
use std::time::Duration;

use cloudevents::AttributesReader;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::dynamic::{create_cm, create_object, labelled_namespace, watches};
use crate::harness::{Bridge, Reader, Received, SinkKind, run_cli, sink_yaml, summary};
use crate::sharding::{group_leases, valid_holder};
use crate::support::{create_crd, kube_client, unique_name, unique_namespace, wait_until};

const WAIT: Duration = Duration::from_secs(90);

/// The replicas, named by their `POD_NAME`, and where the sharding Leases live.
struct Replicas {
    client: kube::Client,
    lease_ns: String,
    prefix: String,
    bridges: Vec<(String, Bridge)>,
}

impl Replicas {
    /// Waits until the replicas together run exactly `expected` (resource, namespace) watches,
    /// each on one replica only, ⌊W/R⌋ or ⌈W/R⌉ per replica, and exactly those watches' Leases
    /// have a valid holder.
    async fn wait_spread(&self, expected: &[(&str, &str)]) -> BTreeMap<String, usize> {
        let mut want: Vec<(String, String)> = expected
            .iter()
            .map(|(r, n)| (r.to_string(), n.to_string()))
            .collect();
        want.sort();
        let (w, r) = (want.len(), self.bridges.len());
        let (low, high) = (w / r, w.div_ceil(r));
        wait_until(
            &format!("{r} replicas run {want:?} once each, {low} or {high} per replica"),
            WAIT,
            || async {
                let mut running = Vec::new();
                let mut per_replica = BTreeMap::new();
                for (name, bridge) in &self.bridges {
                    let owned = watches(bridge).await;
                    per_replica.insert(name.clone(), owned.len());
                    running.extend(owned);
                }
                running.sort();
                let fair = per_replica.values().all(|n| *n == low || *n == high);
                let held = self.held_leases().await?;
                (running == want && fair && held == w).then_some(per_replica)
            },
        )
        .await
    }

    /// `kube-event-bridge status --config` lists `watches` watches, each with a holder, and three
    /// live replicas; the replicas' `kube_event_bridge_shard_watches_owned` add up to `watches`.
    async fn check_status_and_metrics(&self, watches: usize) {
        let config = self.bridges[0].1.dir().join("bridge.yaml");
        let config = config.to_str().unwrap();
        let (status, out, err) = run_cli(&["status", "--config", config]);
        assert!(status.success(), "status failed: {err}");
        assert!(
            out.contains(&format!("{watches} watches, 3 live replicas")),
            "{out}"
        );
        let held = out
            .lines()
            .filter(|l| ["r0-", "r1-", "r2-"].iter().any(|r| l.contains(r)))
            .filter(|l| !l.contains("(none)"))
            .count();
        // One line per held watch, plus the three replica lines.
        assert_eq!(held, watches + 3, "{out}");
        let mut owned = 0.0;
        for (_, bridge) in &self.bridges {
            let address = bridge.admin_address().await;
            let (_, body) = crate::admin::get(&address, "/metrics").await;
            owned += body
                .lines()
                .find_map(|l| l.strip_prefix("kube_event_bridge_shard_watches_owned "))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no shard_watches_owned in /metrics:\n{body}"));
        }
        assert_eq!(owned as usize, watches, "watches owned over the replicas");
    }

    /// How many watch Leases of this group have a valid holder.
    async fn held_leases(&self) -> Option<usize> {
        let members = group_leases(&self.client, &self.lease_ns, &self.prefix, "member").await?;
        let leases = group_leases(&self.client, &self.lease_ns, &self.prefix, "watch").await?;
        Some(
            leases
                .iter()
                .filter(|l| valid_holder(l, &members).is_some())
                .count(),
        )
    }

    /// The descriptions of this group's watch Leases (annotation `kube-event-bridge/watch`).
    async fn watch_leases(&self) -> Option<Vec<String>> {
        let leases = group_leases(&self.client, &self.lease_ns, &self.prefix, "watch").await?;
        let described = leases.iter().filter_map(|l| {
            let annotations = l.metadata.annotations.as_ref()?;
            annotations.get("kube-event-bridge/watch").cloned()
        });
        Some(described.collect())
    }
}

/// Three replicas with a wildcard over `*.{suffix}` in one namespace and ConfigMaps of the
/// namespaces labelled `{label}={value}`: a CRD created, a namespace labelled, another
/// unlabelled and the CRD deleted while they run.
#[tokio::test(flavor = "multi_thread")]
async fn sharded_replicas_follow_crds_and_labelled_namespaces() {
    let client = kube_client().await;
    let lease_ns = unique_namespace(&client, "shard-leases").await;
    let wild = unique_namespace(&client, "wild").await;
    let label = "team.keb.dev/stream";
    let value = unique_name("v");
    let a = labelled_namespace(&client, label, Some(&value)).await;
    let b = labelled_namespace(&client, label, Some(&value)).await;
    let c = labelled_namespace(&client, label, None).await;
    create_cm(&client, &c, "c-before").await;
    let suffix = format!("{}.keb.dev", unique_name("s"));
    let (cluster, prefix) = (unique_name("c"), unique_name("keb"));
    let config = format!(
        "cluster: {cluster}\ncheckpoint: {{intervalMs: 200}}\nsharding: {{enabled: true, namespace: {lease_ns}, leasePrefix: {prefix}, leaseDurationSecs: 4, renewSecs: 1}}\nresources:\n- {{apiVersion: \"*.{suffix}/*\", resource: \"*\", namespaces: [{wild}]}}\n- {{apiVersion: v1, resource: configmaps, namespaceSelector: \"{label}={value}\"}}\n{}",
        sink_yaml(SinkKind::Nats, &cluster)
    );
    let bridges = ["r0", "r1", "r2"]
        .map(|name| {
            let bridge = Bridge::start_with_env(&config, &[("POD_NAME", name)]);
            (name.to_string(), bridge)
        })
        .into();
    let replicas = Replicas {
        client: client.clone(),
        lease_ns,
        prefix,
        bridges,
    };
    let cm = "v1/configmaps";
    replicas.wait_spread(&[(cm, &a), (cm, &b)]).await;
    let mut reader = Reader::nats(&cluster).await;
    let mut events = Vec::new();

    // A CRD created at run time: its watch lands on one replica, its objects flow.
    let things = format!("a.{suffix}");
    create_crd(&client, &things, "Thing", "things", "Namespaced").await;
    let thing_watch = format!("{things}/v1/things");
    replicas
        .wait_spread(&[(cm, &a), (cm, &b), (&thing_watch, &wild)])
        .await;
    create_object(&client, &things, "Thing", "things", &wild, "t1").await;
    events.extend(read_name(&mut reader, "t1", "added").await);

    // A namespace gaining the label: its existing objects arrive as a snapshot.
    label_namespace(&client, &c, label, Some(&value)).await;
    let spread = replicas
        .wait_spread(&[(cm, &a), (cm, &b), (cm, &c), (&thing_watch, &wild)])
        .await;
    eprintln!("four watches over three replicas: {spread:?}");
    replicas.check_status_and_metrics(4).await;
    let got = read_name(&mut reader, "c-before", "added").await;
    let snapshot = got.iter().find(|r| r.ext("name") == "c-before").unwrap();
    assert_eq!(snapshot.ext("origin"), "snapshot", "{}", summary(&got));
    events.extend(got);

    // A namespace losing it: its watch stops wherever it ran, nothing of it flows after.
    label_namespace(&client, &a, label, None).await;
    replicas
        .wait_spread(&[(cm, &b), (cm, &c), (&thing_watch, &wild)])
        .await;
    create_cm(&client, &a, "a-after").await;
    create_cm(&client, &b, "b-after").await;
    events.extend(read_name(&mut reader, "b-after", "added").await);

    // The CRD deleted: its watch publishes the deletion of its object, then stops.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete(&format!("things.{things}"), &DeleteParams::default())
        .await
        .unwrap();
    events.extend(read_name(&mut reader, "t1", "deleted").await);
    replicas.wait_spread(&[(cm, &b), (cm, &c)]).await;
    events.extend(reader.drain(Duration::from_secs(2)).await);

    // The Leases of the watches gone (namespace a's, the Things') are deleted five lease
    // durations after their release; the others stay.
    let leases = wait_until(
        "the Leases of the watches gone are deleted",
        WAIT,
        || async {
            let leases = replicas.watch_leases().await?;
            let gone = |ns: &str| !leases.iter().any(|w| w.contains(&format!("/{ns}?")));
            (leases.len() == 2 && gone(&a) && gone(&wild)).then_some(leases)
        },
    )
    .await;
    eprintln!("watch leases left: {leases:?}");
    assert!(
        events.iter().all(|r| r.ext("name") != "a-after"),
        "a namespace that lost the label still flows: {}",
        summary(&events)
    );
    let mut ids = BTreeMap::<String, usize>::new();
    for e in &events {
        *ids.entry(e.event.id().to_string()).or_default() += 1;
    }
    let twice: Vec<_> = ids.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "published twice: {twice:?}");
    // Live, or repaired when the API server dropped it closing the watch: one delete either way.
    let t1_deleted = events
        .iter()
        .filter(|r| r.ext("name") == "t1" && r.change() == "deleted")
        .count();
    assert_eq!(t1_deleted, 1, "{}", summary(&events));
    for (name, bridge) in &replicas.bridges {
        let log = bridge.log_text();
        assert!(
            !log.contains("\"message\":\"watch failed\""),
            "{name}: a watch failed instead of stopping or moving:\n{log}"
        );
    }
}

/// Reads until an event for the object `name` with `change` arrives; returns what was read.
async fn read_name(reader: &mut Reader, name: &str, change: &str) -> Vec<Received> {
    reader
        .read_until(WAIT, |got| {
            got.iter()
                .any(|r| r.ext("name") == name && r.change() == change)
        })
        .await
}

/// Sets (or with `None` removes) `label` on namespace `ns`.
async fn label_namespace(client: &kube::Client, ns: &str, label: &str, value: Option<&str>) {
    Api::<Namespace>::all(client.clone())
        .patch(
            ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {label: value}}})),
        )
        .await
        .unwrap();
}
