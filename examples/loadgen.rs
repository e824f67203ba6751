//! Load generator for `scripts/bench`: creates or patches ConfigMaps in one namespace with bounded
//! concurrency, through the `KUBECONFIG` cluster.
//!
//! `loadgen create <namespace> <count> <bytes>` / `loadgen patch <namespace> <count>`.

use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (verb, ns, count) = (
        args[1].as_str(),
        args[2].as_str(),
        args[3].parse::<usize>()?,
    );
    let client = kube::Client::try_default().await?;
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let start = Instant::now();
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let payload = "x".repeat(args.get(4).map(|b| b.parse()).transpose()?.unwrap_or(1024));
    let results: Vec<_> = futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            let payload = payload.clone();
            async move {
                let name = format!("cm-{i:06}");
                if verb == "create" {
                    let cm: ConfigMap = serde_json::from_value(serde_json::json!({"metadata": {"name": name, "labels": {"app": "bench"}}, "data": {"payload": payload}}))?;
                    api.create(&PostParams::default(), &cm).await.map(|_| ())
                } else {
                    // A fresh value per run, so every patch is a real change (a no-op patch makes no event).
                    let patch = Patch::Merge(serde_json::json!({"data": {"n": format!("{i}-{run}")}}));
                    api.patch(&name, &PatchParams::default(), &patch).await.map(|_| ())
                }
                .map_err(anyhow::Error::from)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    eprintln!(
        "{verb} {count} in {:.1}s ({failed} failed)",
        start.elapsed().as_secs_f64()
    );
    anyhow::ensure!(failed == 0, "{failed} requests failed");
    Ok(())
}
