//! The walk of one snapshot on demand, on the replica running its watch: count the objects,
//! queue the begin marker, then read the resource one LIST page (a chunk) at a time, queueing
//! each object beside the watch's items (taken only when none waits) and waiting until the pipeline has decided the chunk
//! and the broker has acknowledged it before recording the progress and reading the next. At
//! most one chunk is ever queued, so a snapshot of any size holds bounded memory, and live
//! events keep flowing between its chunks.
//!
//! The progress recorded on the request ([`super::record`]) is where a restart or a new owner
//! of the watch resumes: after the last acknowledged chunk, with the counts so far. A continue
//! token that expired meanwhile (the API server keeps them about five minutes) resumes from the
//! token the API server offers with its refusal, at a newer resourceVersion: each object is
//! still decided on its own against the stream, so the snapshot stays correct.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use tokio::sync::oneshot;
use tracing::{info, warn};

use super::prune::Prune;
use super::record::{self, Phase, Progress};
use super::request::Request;
use crate::backoff::Backoff;
use crate::demand::{Demand, Outcome, Scope, Tally};
use crate::supervisor::DemandPort;

/// Failed attempts at one API call, or at publishing a marker, before the snapshot fails.
const ATTEMPTS: u32 = 6;

/// Keys the pipeline compares with its index at a time when pruning (each comparison walks the
/// whole index once).
const PRUNE_CHUNK: usize = 5_000;

/// Why a walk stopped before its end.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The watch stopped here (a hand-off, a shutdown): its next owner resumes the walk.
    #[error("the watch stopped on this replica")]
    Stopped,
    /// A LIST kept failing.
    #[error("cannot list {resource}: {source}")]
    List {
        /// The resource.
        resource: String,
        /// The last failure.
        source: kube::Error,
    },
    /// The progress could not be recorded on the request.
    #[error("cannot record the progress on ConfigMap {name}: {source}")]
    Record {
        /// The request.
        name: String,
        /// The last failure.
        source: kube::Error,
    },
    /// The pipeline could not publish a marker or tombstones.
    #[error("{0}")]
    Marker(String),
    /// The keys to prune could not be read.
    #[error("{0}")]
    Prune(String),
}

/// One walk: what it reads, where it queues, where it records.
#[derive(Debug)]
pub struct Walk {
    /// The watch serving the request.
    pub port: DemandPort,
    /// Whether the watch covers every namespace (a namespace in the request then narrows it).
    pub cluster_wide: bool,
    /// The request.
    pub request: Request,
    /// The requests' namespace, where the progress is recorded.
    pub requests: Api<ConfigMap>,
    /// The progress recorded so far.
    pub progress: Progress,
    /// What it prunes once every object was decided (`prune: true`).
    pub prune: Option<Prune>,
    /// Where the objects decided are counted.
    pub admin: Arc<crate::admin::State>,
}

impl Walk {
    /// Runs the walk to its end, or until the watch stops here; returns the phase reached
    /// (`Running` when it stopped before its end: the next owner resumes it).
    pub async fn run(mut self) -> Phase {
        let stopped = self.port.stopped.clone();
        let walked = tokio::select! {
            () = stopped.cancelled() => Err(Error::Stopped),
            walked = self.walk() => walked,
        };
        match walked {
            Ok(()) => Phase::Complete,
            Err(Error::Stopped) => {
                info!(request = %self.request.name, "snapshot paused: its watch stopped here; the next owner resumes it");
                Phase::Running
            }
            Err(error) => self.fail(&error).await,
        }
    }

    async fn walk(&mut self) -> Result<(), Error> {
        self.progress.phase = Phase::Running;
        self.progress.watch = Some(self.port.key.description.clone());
        if !self.progress.begun {
            self.progress.expected = self.count().await?;
            let scope = self.scope();
            self.deliver(|| Demand::Begin(scope.clone())).await?;
            self.progress.begun = true;
            self.record().await?;
        }
        let scope = self.scope();
        loop {
            let page = self.chunk().await?;
            let observed = SystemTime::now();
            for mut object in page.items {
                object
                    .types
                    .get_or_insert_with(|| self.port.target.types.clone());
                self.queue(Demand::Listed(scope.clone(), Box::new(object), observed))
                    .await?;
            }
            let tally = self.mark().await?;
            self.count_in(tally);
            self.progress.continue_token = page.metadata.continue_.filter(|c| !c.is_empty());
            if self.progress.continue_token.is_none() {
                break;
            }
            self.record().await?;
        }
        if let Some(prune) = self.prune.clone() {
            self.prune(&scope, &prune).await?;
        }
        let total = self.total();
        self.deliver(|| Demand::End(scope.clone(), total, Outcome::Complete))
            .await?;
        self.progress.phase = Phase::Complete;
        self.progress.message = None;
        info!(request = %self.request.name, sent = total.emitted, skipped = total.skipped, pruned = total.pruned, "snapshot complete");
        self.record().await
    }

    /// Records the failure and, when the pipeline still runs, publishes a failed end marker.
    async fn fail(&mut self, error: &Error) -> Phase {
        let message = error.to_string();
        warn!(request = %self.request.name, error = %message, "snapshot failed");
        if self.progress.begun {
            let (scope, total) = (self.scope(), self.total());
            let failed = || Demand::End(scope.clone(), total, Outcome::Failed(message.clone()));
            let _ = self.deliver(failed).await;
        }
        self.progress.phase = Phase::Failed;
        self.progress.message = Some(message);
        if let Err(e) = self.record().await {
            warn!(request = %self.request.name, error = %e, "snapshot failure not recorded");
        }
        Phase::Failed
    }

    /// Adds what the pipeline did since the last mark to the progress and the metrics.
    fn count_in(&mut self, tally: Tally) {
        let counted = &self.admin.snapshots.objects;
        counted[0].fetch_add(tally.emitted, Ordering::Relaxed);
        counted[1].fetch_add(tally.skipped, Ordering::Relaxed);
        counted[2].fetch_add(tally.pruned, Ordering::Relaxed);
        self.progress.sent += tally.emitted;
        self.progress.skipped += tally.skipped;
        self.progress.pruned += tally.pruned;
    }

    /// Reads the keys the destination holds for the scope and has the pipeline tombstone those
    /// its index does not hold, [`PRUNE_CHUNK`] keys at a time.
    async fn prune(&mut self, scope: &Arc<Scope>, prune: &Prune) -> Result<(), Error> {
        let Some(compaction) = self.port.sink.compaction() else {
            return Err(Error::Prune(format!(
                "the {} sink keeps no keys",
                self.port.sink.name()
            )));
        };
        let keys = compaction
            .held_keys(&prune.destination, &prune.owner)
            .await
            .map_err(|e| {
                let cause =
                    std::error::Error::source(&e).map_or_else(|| e.to_string(), |c| c.to_string());
                Error::Prune(format!(
                    "cannot read the keys of {}: {cause}",
                    prune.destination
                ))
            })?;
        info!(request = %self.request.name, destination = %prune.destination, keys = keys.len(), "snapshot compares the keys the destination holds with the cluster's objects");
        for chunk in keys.chunks(PRUNE_CHUNK) {
            let tally = self
                .deliver(|| Demand::Prune(scope.clone(), chunk.to_vec()))
                .await?;
            self.count_in(tally);
        }
        Ok(())
    }

    fn total(&self) -> Tally {
        Tally {
            emitted: self.progress.sent,
            skipped: self.progress.skipped,
            pruned: self.progress.pruned,
        }
    }

    fn scope(&self) -> Arc<Scope> {
        Arc::new(Scope {
            id: self.request.id.clone(),
            request: self.request.name.clone(),
            resource: self.request.resource.clone(),
            namespace: self.request.namespace.clone(),
            label_selector: self.request.label_selector.clone(),
            expected: self.progress.expected,
            prune: self.prune.is_some(),
        })
    }

    /// The LIST parameters: the watch's selectors, the request's on top.
    fn params(&self, limit: u32) -> ListParams {
        let target = &self.port.target;
        let namespace = self
            .request
            .namespace
            .as_ref()
            .filter(|_| self.cluster_wide)
            .map(|ns| format!("metadata.namespace={ns}"));
        let mut params = ListParams::default().limit(limit);
        if let Some(labels) = join(&[&target.label_selector, &self.request.label_selector]) {
            params = params.labels(&labels);
        }
        if let Some(fields) = join(&[&target.field_selector, &namespace]) {
            params = params.fields(&fields);
        }
        params
    }

    /// How many objects the snapshot covers now: one object's page and the count of the rest;
    /// `None` when the API server does not say (it gives no count for a list narrowed by a
    /// selector).
    async fn count(&self) -> Result<Option<u64>, Error> {
        let params = self.params(1);
        let page = self
            .retry(|| self.port.target.api.list_metadata(&params))
            .await?;
        let more = page
            .metadata
            .continue_
            .as_deref()
            .is_some_and(|c| !c.is_empty());
        Ok(count(
            page.items.len(),
            more,
            page.metadata.remaining_item_count,
        ))
    }

    /// The next chunk. An expired continue token is replaced by the one the API server offers
    /// with its refusal (inconsistent, at a newer resourceVersion); without one, the walk starts
    /// over.
    async fn chunk(&mut self) -> Result<kube::core::ObjectList<kube::api::DynamicObject>, Error> {
        loop {
            let mut params = self.params(self.request.chunk);
            if let Some(token) = &self.progress.continue_token {
                params = params.continue_token(token);
            }
            match self.port.target.api.list(&params).await {
                Ok(page) => return Ok(page),
                Err(kube::Error::Api(status))
                    if status.code == 410 && self.progress.continue_token.is_some() =>
                {
                    let offered = status
                        .metadata
                        .and_then(|m| m.continue_)
                        .filter(|c| !c.is_empty());
                    warn!(request = %self.request.name, resumes = offered.is_some(), "snapshot continue token expired");
                    if offered.is_none() {
                        self.progress.restarts += 1;
                    }
                    self.progress.continue_token = offered;
                }
                Err(_) => {
                    return self.retry(|| self.port.target.api.list(&params)).await;
                }
            }
        }
    }

    /// Calls `call` (a LIST) until it succeeds, at most [`ATTEMPTS`] times with backoff.
    async fn retry<T, F>(&self, call: impl Fn() -> F) -> Result<T, Error>
    where
        F: std::future::Future<Output = Result<T, kube::Error>>,
    {
        let failing = "snapshot LIST failed, retrying";
        attempts(&self.request.name, failing, Duration::MAX, call)
            .await
            .map_err(|source| Error::List {
                resource: self.request.resource.clone(),
                source,
            })
    }

    /// Queues `demand` for the watch's pipeline, beside the watch's items.
    async fn queue(&self, demand: Demand) -> Result<(), Error> {
        let queue = self.port.queue.upgrade().ok_or(Error::Stopped)?;
        queue.send(demand).await.map_err(|_| Error::Stopped)
    }

    /// Queues the demand `make` makes and waits until the broker acknowledged it (a marker,
    /// tombstones); one the broker refused, or lost in an aborted transaction, is queued again,
    /// at most [`ATTEMPTS`] times with backoff (a marker sent again is a duplicate under its own
    /// id, a tombstone sent again changes nothing).
    async fn deliver(&self, make: impl Fn() -> Demand) -> Result<Tally, Error> {
        let mut backoff = Backoff::default();
        let mut attempt = 1;
        loop {
            self.queue(make()).await?;
            match self.mark().await {
                Err(Error::Marker(why)) if attempt < ATTEMPTS => {
                    warn!(request = %self.request.name, error = %why, "snapshot marker or tombstones not published, sending again");
                    tokio::time::sleep(backoff.next_delay().min(Duration::from_secs(5))).await;
                    attempt += 1;
                }
                marked => return marked,
            }
        }
    }

    /// Waits until the pipeline decided everything queued and the broker acknowledged it.
    async fn mark(&self) -> Result<Tally, Error> {
        let (tx, rx) = oneshot::channel();
        self.queue(Demand::Mark(self.request.id.clone(), tx))
            .await?;
        match rx.await {
            Ok(Ok(tally)) => Ok(tally),
            Ok(Err(why)) => Err(Error::Marker(why)),
            Err(_) => Err(Error::Stopped),
        }
    }

    /// Records the progress on the request, retrying a failed patch.
    async fn record(&self) -> Result<(), Error> {
        let patch = Patch::Merge(record::patch(&self.progress));
        let (api, name) = (&self.requests, &self.request.name);
        let failing = "snapshot progress not recorded, retrying";
        let (cap, params) = (Duration::from_secs(5), PatchParams::default());
        attempts(name, failing, cap, || api.patch(name, &params, &patch))
            .await
            .map(drop)
            .map_err(|source| Error::Record {
                name: name.clone(),
                source,
            })
    }
}

/// Calls `call` until it succeeds, at most [`ATTEMPTS`] times, logging each failure with
/// `failing` and waiting a backoff (at most `cap`) before the next; the last failure if none
/// succeeded.
async fn attempts<T, F>(
    request: &str,
    failing: &str,
    cap: Duration,
    call: impl Fn() -> F,
) -> Result<T, kube::Error>
where
    F: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut backoff = Backoff::default();
    let mut attempt = 1;
    loop {
        match call().await {
            Ok(value) => return Ok(value),
            Err(e) if attempt >= ATTEMPTS => return Err(e),
            Err(e) => {
                warn!(request = %request, error = %e, "{failing}");
                tokio::time::sleep(backoff.next_delay().min(cap)).await;
                attempt += 1;
            }
        }
    }
}

/// The count of a LIST of one object: `items`, and the `remaining` count the API server gave
/// when there are `more`; `None` when it gave none.
fn count(items: usize, more: bool, remaining: Option<i64>) -> Option<u64> {
    match (more, remaining) {
        (false, _) => Some(items as u64),
        (true, Some(rest)) => Some(items as u64 + rest.max(0) as u64),
        (true, None) => None,
    }
}

/// The selectors that are set, joined with commas (each a conjunction).
fn join(selectors: &[&Option<String>]) -> Option<String> {
    let set: Vec<&str> = selectors
        .iter()
        .filter_map(|s| s.as_deref())
        .filter(|s| !s.is_empty())
        .collect();
    (!set.is_empty()).then(|| set.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_are_joined_as_a_conjunction() {
        let watch = Some("app=web".to_string());
        let asked = Some("tier in (a,b)".to_string());
        assert_eq!(
            join(&[&watch, &asked]).as_deref(),
            Some("app=web,tier in (a,b)")
        );
        assert_eq!(join(&[&None, &asked]).as_deref(), Some("tier in (a,b)"));
        assert_eq!(join(&[&None, &Some(String::new())]), None);
    }

    #[test]
    fn the_count_is_unknown_when_the_api_server_gives_none() {
        assert_eq!(count(1, true, Some(41)), Some(42));
        assert_eq!(count(1, false, None), Some(1));
        assert_eq!(count(0, false, None), Some(0));
        assert_eq!(
            count(1, true, None),
            None,
            "a selected list has no remainingItemCount"
        );
    }
}
