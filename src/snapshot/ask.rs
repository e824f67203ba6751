//! `kube-event-bridge snapshot`: writes the requests for a snapshot of one resource (one per
//! watch: a resource watched per namespace gets one request per namespace) and, with `--wait`,
//! follows them until they end.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;

use super::record::{self, Phase, Progress};
use super::request;
pub use super::request::Ask;
use super::reset::{self, reach, watched_scopes};
use crate::config::Config;
use crate::kubernetes;

/// Errors of asking for a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The watches could not be resolved.
    #[error(transparent)]
    Scopes(#[from] reset::Error),
    /// The bridge's own cluster could not be reached.
    #[error(transparent)]
    Kubernetes(#[from] kubernetes::Error),
    /// A request could not be written or read.
    #[error("snapshot request in namespace {namespace}: {source}")]
    Request {
        /// The requests' namespace.
        namespace: String,
        /// The API server's answer.
        source: kube::Error,
    },
    /// A request failed.
    #[error("snapshot {name} failed: {message}")]
    Failed {
        /// The request's name.
        name: String,
        /// Why, as the bridge recorded it.
        message: String,
    },
    /// `--wait` ran out of time.
    #[error(
        "snapshot {name} not complete after {secs} s (phase {phase}); is a bridge running this configuration and reading requests in namespace {namespace}?"
    )]
    Timeout {
        /// The request still going on.
        name: String,
        /// Its phase.
        phase: &'static str,
        /// The time waited.
        secs: u64,
        /// The requests' namespace.
        namespace: String,
    },
}

/// The requests written, in the requests' namespace.
pub struct Written {
    /// The requests' namespace.
    pub namespace: String,
    /// Their names.
    pub names: Vec<String>,
    /// A client of the bridge's own cluster, where they are.
    pub client: kube::Client,
}

/// Writes the requests for `ask`, one per watch it covers.
pub async fn ask(config: &Config, ask: &Ask) -> Result<Written, Error> {
    let (member, client) = &reach(config, ask.cluster.as_deref()).await?;
    let namespace = ask.namespace.as_deref();
    let scopes = watched_scopes(member, client, &ask.resource, namespace).await?;
    let mut wanted: Vec<Option<String>> = scopes
        .into_iter()
        .map(|(_, scope)| scope.or_else(|| ask.namespace.clone()))
        .collect();
    wanted.sort();
    wanted.dedup();
    let home = kubernetes::client(&config.kubernetes).await?;
    let requests_ns = config
        .snapshot_requests
        .namespace(|k| std::env::var(k).ok());
    let api: Api<ConfigMap> = Api::namespaced(home.clone(), &requests_ns);
    let mut names = Vec::new();
    for scope in &wanted {
        let cm = request::build(&requests_ns, scope.as_deref(), ask);
        let created = api
            .create(&PostParams::default(), &cm)
            .await
            .map_err(|source| Error::Request {
                namespace: requests_ns.clone(),
                source,
            })?;
        names.push(created.metadata.name.unwrap_or_default());
    }
    Ok(Written {
        namespace: requests_ns,
        names,
        client: home,
    })
}

/// Follows the requests `written` until every one ended, printing their progress as it moves;
/// the first failure, or `timeout`, is an error.
pub async fn wait(written: &Written, timeout: Duration) -> Result<(), Error> {
    let api: Api<ConfigMap> = Api::namespaced(written.client.clone(), &written.namespace);
    let started = Instant::now();
    let mut shown: Vec<Option<Progress>> = vec![None; written.names.len()];
    loop {
        let mut open = None;
        for (name, last) in written.names.iter().zip(shown.iter_mut()) {
            let cm = api.get(name).await.map_err(|source| Error::Request {
                namespace: written.namespace.clone(),
                source,
            })?;
            let progress = record::read(cm.metadata.annotations.as_ref());
            if last.as_ref() != Some(&progress) {
                println!("{}", line(name, &progress));
                *last = Some(progress.clone());
            }
            match progress.phase {
                Phase::Complete => {}
                Phase::Failed => {
                    return Err(Error::Failed {
                        name: name.clone(),
                        message: progress.message.unwrap_or_default(),
                    });
                }
                phase => open = open.or(Some((name.clone(), phase))),
            }
        }
        let Some((name, phase)) = open else {
            return Ok(());
        };
        if started.elapsed() >= timeout {
            return Err(Error::Timeout {
                name,
                phase: phase.as_str(),
                secs: timeout.as_secs(),
                namespace: written.namespace.clone(),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One line of progress.
fn line(name: &str, p: &Progress) -> String {
    let expected = p
        .expected
        .map_or("an unknown number".to_string(), |n| n.to_string());
    let mut text = format!(
        "{name}: {} sent {} skipped {} of {expected} expected",
        p.phase.as_str(),
        p.sent,
        p.skipped,
    );
    if p.pruned > 0 {
        text.push_str(&format!(", pruned {}", p.pruned));
    }
    if let Some(watch) = &p.watch {
        text.push_str(&format!(" ({watch})"));
    }
    if let Some(message) = &p.message {
        text.push_str(&format!(": {message}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_progress_line_names_the_phase_the_counts_and_the_message() {
        let p = Progress {
            phase: Phase::Failed,
            watch: Some("dev/v1/configmaps/*".into()),
            expected: Some(3),
            sent: 2,
            skipped: 1,
            message: Some("cannot list".into()),
            ..Progress::default()
        };
        assert_eq!(
            line("snapshot-x", &p),
            "snapshot-x: Failed sent 2 skipped 1 of 3 expected (dev/v1/configmaps/*): cannot list"
        );
    }
}
