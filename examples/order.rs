//! Order check for `scripts/bench snapshot`: reads every message of a JetStream stream under a
//! subject filter, from its first to the last one stored when the check began, and checks per
//! object (`ce-uid`) that its `ce-resourceversion`, as an integer, never goes down from one event
//! to the next, across live events and snapshot-on-demand events. An event at the same
//! resourceVersion as the object's previous one (a snapshot repeating the newest version) is not
//! a step back; it is counted in `repeats`.
//!
//! `order nats <url> <stream> <subject-filter>`
//!
//! Prints one JSON line: messages read, object events by `origin`, begin and end markers (and
//! the end markers' `result`s), objects seen, steps back (`backwards`, with a few examples) and
//! repeats.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    use async_nats::jetstream::consumer::{DeliverPolicy, pull::OrderedConfig};
    let args: Vec<String> = std::env::args().collect();
    let usage = "order nats <url> <stream> <subject-filter>";
    anyhow::ensure!(args.len() == 5 && args[1] == "nats", usage);
    let (url, stream, filter) = (&args[2], &args[3], &args[4]);
    let client = async_nats::connect(url).await?;
    let js = async_nats::jetstream::new(client);
    let mut stream = js.get_stream(stream).await?;
    let last = stream.info().await?.state.last_sequence;
    let consumer = stream
        .create_consumer(OrderedConfig {
            filter_subject: filter.clone(),
            deliver_policy: DeliverPolicy::All,
            ..OrderedConfig::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    // uid → (resourceVersion, origin) of its last event.
    let mut objects: HashMap<String, (u64, String)> = HashMap::new();
    let mut origins: HashMap<String, u64> = HashMap::new();
    let mut results: HashMap<String, u64> = HashMap::new();
    let (mut read, mut begins, mut ends, mut repeats, mut backwards) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut examples = Vec::new();
    let mut complete = last == 0;
    while !complete {
        let Ok(next) = tokio::time::timeout(Duration::from_secs(15), messages.next()).await else {
            break;
        };
        let message = next
            .context("the consumer ended")?
            .map_err(|e| anyhow::anyhow!(e))?;
        read += 1;
        let info = message.info().map_err(|e| anyhow::anyhow!(e))?;
        complete = info.stream_sequence >= last || info.pending == 0;
        let header = |name: &str| {
            message
                .headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_string())
        };
        let (Some(uid), Some(version)) = (header("ce-uid"), header("ce-resourceversion")) else {
            // A marker (structured mode, no object headers).
            let marker: serde_json::Value = serde_json::from_slice(&message.payload)?;
            match marker["type"].as_str() {
                Some("io.kubeeventbridge.snapshot.begin") => begins += 1,
                Some("io.kubeeventbridge.snapshot.end") => {
                    ends += 1;
                    let result = marker["data"]["result"].as_str().unwrap_or("?");
                    *results.entry(result.to_string()).or_default() += 1;
                }
                _ => {}
            }
            continue;
        };
        let origin = header("ce-origin").unwrap_or_default();
        *origins.entry(origin.clone()).or_default() += 1;
        let version: u64 = version
            .parse()
            .with_context(|| format!("resourceVersion {version:?} of {uid}"))?;
        match objects.get_mut(&uid) {
            Some((last, last_origin)) => {
                if version < *last {
                    backwards += 1;
                    if examples.len() < 10 {
                        examples.push(format!(
                            "{uid}: {last} ({last_origin}) then {version} ({origin}) at stream sequence {}",
                            info.stream_sequence
                        ));
                    }
                } else {
                    repeats += u64::from(version == *last);
                    *last = version;
                    *last_origin = origin;
                }
            }
            None => {
                objects.insert(uid, (version, origin));
            }
        }
    }
    let figures = serde_json::json!({
        "messages": read,
        "complete": complete,
        "origins": origins,
        "begin_markers": begins,
        "end_markers": ends,
        "end_results": results,
        "objects": objects.len(),
        "backwards": backwards,
        "repeats": repeats,
        "examples": examples,
    });
    println!("{figures}");
    Ok(())
}
