//! Load generator for `scripts/bench`: creates or patches ConfigMaps with bounded concurrency,
//! through the `KUBECONFIG` cluster.
//!
//! `loadgen create <namespace> <count> <bytes>` / `loadgen patch <namespace> <count>` work in one
//! namespace; `loadgen spread <prefix> <namespaces> <count> <bytes>` creates the namespaces
//! `<prefix>-0000`… labelled `kube-event-bridge-bench=<prefix>` and `<count>` ConfigMaps in each.
//! `loadgen churn <prefix> <namespaces> <count> <rate> <seconds>` patches the ConfigMaps of such
//! a spread at a steady `rate` per second for `seconds`, round robin over the namespaces and
//! their objects, and prints the patches made and the rate reached.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryFutureExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, Patch, PatchParams, PostParams};

const USAGE: &str = "usage: loadgen create NAMESPACE COUNT [BYTES] | patch NAMESPACE COUNT | \
                     spread PREFIX NAMESPACES COUNT [BYTES] | churn PREFIX NAMESPACES COUNT RATE SECONDS";

/// Requests in flight at most.
const CONCURRENCY: usize = 32;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let needed = match args.get(1).map(String::as_str) {
        Some("create" | "patch") => 4,
        Some("spread") => 5,
        Some("churn") => 7,
        _ => usize::MAX,
    };
    if args.len() < needed {
        anyhow::bail!("{USAGE}");
    }
    let (verb, target) = (args[1].as_str(), args[2].as_str());
    let client = kube::Client::try_default().await?;
    let start = Instant::now();
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    if verb == "churn" {
        let numbers: Vec<u64> = args[3..7]
            .iter()
            .map(|a| a.parse())
            .collect::<Result<_, _>>()?;
        return churn(
            &client,
            target,
            [numbers[0], numbers[1]],
            numbers[2],
            numbers[3],
            run,
        )
        .await;
    }
    let (namespaces, count, bytes) = if verb == "spread" {
        let namespaces: usize = args[3].parse()?;
        let names: Vec<String> = (0..namespaces)
            .map(|i| format!("{target}-{i:04}"))
            .collect();
        create_namespaces(&client, target, &names).await?;
        (names, args[4].parse::<usize>()?, args.get(5))
    } else {
        (vec![target.to_owned()], args[3].parse()?, args.get(4))
    };
    let payload = "x".repeat(bytes.map(|b| b.parse()).transpose()?.unwrap_or(1024));
    let requests = namespaces
        .iter()
        .flat_map(|ns| (0..count).map(move |i| (ns.clone(), i)));
    let results: Vec<_> = futures::stream::iter(requests)
        .map(|(ns, i)| {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
            let payload = payload.clone();
            async move {
                let name = format!("cm-{i:06}");
                if verb == "patch" {
                    // A fresh value per run, so every patch is a real change (a no-op patch makes no event).
                    let patch = Patch::Merge(serde_json::json!({"data": {"n": format!("{i}-{run}")}}));
                    api.patch(&name, &PatchParams::default(), &patch).await.map(|_| ())
                } else {
                    let cm: ConfigMap = serde_json::from_value(serde_json::json!({"metadata": {"name": name, "labels": {"app": "bench"}}, "data": {"payload": payload}}))?;
                    api.create(&PostParams::default(), &cm).await.map(|_| ())
                }
                .map_err(anyhow::Error::from)
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    eprintln!(
        "{verb} {} in {:.1}s ({failed} failed)",
        results.len(),
        start.elapsed().as_secs_f64()
    );
    anyhow::ensure!(failed == 0, "{failed} requests failed");
    Ok(())
}

/// Creates `names`, each labelled `kube-event-bridge-bench=<prefix>`.
async fn create_namespaces(
    client: &kube::Client,
    prefix: &str,
    names: &[String],
) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    futures::stream::iter(names)
        .map(|name| {
            let ns: Namespace = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": {"kube-event-bridge-bench": prefix}}
            }))
            .expect("a namespace");
            let api = api.clone();
            async move { api.create(&PostParams::default(), &ns).map_ok(|_| ()).await }
        })
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<(), _>>()?;
    Ok(())
}

/// Patches the spread `<prefix>-NNNN`/`cm-NNNNNN` (`namespaces` x `count`) at `rate` per second
/// for `seconds`: the i-th patch starts no earlier than i / rate after the start, round robin
/// over the namespaces first, so every watch sees the same share.
async fn churn(
    client: &kube::Client,
    prefix: &str,
    [namespaces, count]: [u64; 2],
    rate: u64,
    seconds: u64,
    run: u128,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        namespaces > 0 && count > 0 && rate > 0,
        "churn: namespaces, count and rate must be positive"
    );
    let total = rate * seconds;
    let start = tokio::time::Instant::now();
    let results: Vec<_> = futures::stream::iter(0..total)
        .then(|i| async move {
            tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate as f64)).await;
            i
        })
        .map(|i| {
            let ns = format!("{prefix}-{:04}", i % namespaces);
            let name = format!("cm-{:06}", (i / namespaces) % count);
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
            let patch = Patch::Merge(serde_json::json!({"data": {"n": format!("{i}-{run}")}}));
            async move {
                api.patch(&name, &PatchParams::default(), &patch)
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(CONCURRENCY * 8)
        .collect()
        .await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{{\"patches\": {}, \"failed\": {failed}, \"seconds\": {secs:.3}, \"rate\": {:.1}}}",
        results.len(),
        results.len() as f64 / secs
    );
    anyhow::ensure!(failed == 0, "{failed} patches failed");
    Ok(())
}
