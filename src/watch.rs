//! One watch of one resource in one namespace scope: list, then watch from the list's
//! resourceVersion with bookmarks, resume from the last resourceVersion after a dropped
//! connection, and on 410 Gone relist and diff against the [`KnownObjects`] index.
//!
//! kube-runtime's `watcher` cannot start from a saved resourceVersion nor expose bookmarks, so
//! this is a small loop over `Api::list` and `Api::watch`. Its output is a stream of [`Item`]s
//! on a bounded channel: a full channel pauses the watch (backpressure, never loss).

use std::time::{Duration, SystemTime};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, ListParams, ObjectMeta, TypeMeta, WatchEvent, WatchParams};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use std::sync::Arc;

use crate::change::ChangeKind;
use crate::pipeline::{Status, count};

/// Why a watch could not go on; each is logged and retried with backoff, never fatal.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server answered 410 Gone: the resourceVersion is older than its watch history.
    #[error("resourceVersion {0} is too old (410 Gone)")]
    Gone(String),
    /// A request failed.
    #[error("{reason} request failed")]
    Request {
        /// `list` or `watch`.
        reason: &'static str,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The watch stream carried an error status.
    #[error("watch error {code} {reason}: {message}")]
    Status {
        /// HTTP-like code.
        code: u16,
        /// Machine-readable reason.
        reason: String,
        /// Message.
        message: String,
    },
    /// The pipeline behind the watch has stopped.
    #[error("the pipeline stopped")]
    Closed,
}

impl Error {
    /// A short, closed-set label for logs and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Gone(_) => "gone",
            Error::Request {
                source: kube::Error::Api(s),
                ..
            } if s.code == 403 => "forbidden",
            Error::Request {
                source: kube::Error::Api(s),
                ..
            } if s.code == 404 => "not_found",
            Error::Request { .. } => "request",
            Error::Status { code: 404, .. } => "not_found",
            Error::Status { .. } => "status",
            Error::Closed => "closed",
        }
    }
}

/// What a watch sends down the pipeline, in order. The pipeline owns the known-object index and
/// classifies what the watch saw, so the index always matches what was sent.
#[derive(Debug)]
pub enum Item {
    /// An event of the live watch.
    Event(ChangeKind, DynamicObject, SystemTime),
    /// A (re)list starts: the listed objects follow.
    ListBegin,
    /// One listed object.
    Listed(DynamicObject, SystemTime),
    /// The list is complete, at this resourceVersion.
    ListEnd(String),
    /// The list failed part-way: nothing may be concluded from what was listed.
    ListAbort,
    /// Nothing changed up to this resourceVersion (a bookmark).
    Progress(String),
}

/// What one watch looks at.
#[derive(Debug, Clone)]
pub struct Target {
    /// The API handle (namespaced or all).
    pub api: Api<DynamicObject>,
    /// `apiVersion` and `kind` to fill in when list items lack them.
    pub types: TypeMeta,
    /// Label selector.
    pub label_selector: Option<String>,
    /// Field selector.
    pub field_selector: Option<String>,
    /// Objects per LIST page.
    pub page_size: u32,
    /// Server-side watch timeout; the watch is then resumed from the last resourceVersion.
    pub watch_timeout_secs: u32,
    /// Told when the API server answers 404: the resource may be gone (a deleted CRD), which a
    /// discovery refresh decides, stopping this watch cleanly.
    pub not_found: Arc<tokio::sync::Notify>,
}

/// Runs the watch until `shutdown` or until the pipeline closes, starting from
/// `resource_version` (a checkpoint) or, if `None`, with a list.
pub async fn run(
    target: Target,
    mut resource_version: Option<String>,
    tx: mpsc::Sender<Item>,
    shutdown: CancellationToken,
    status: Arc<Status>,
) {
    let mut backoff = Backoff::default();
    loop {
        let step = async {
            match resource_version.clone() {
                None => list(&target, &tx)
                    .await
                    .map(|rv| resource_version = Some(rv)),
                Some(rv) => watch(&target, &tx, &rv, &mut resource_version).await,
            }
        };
        let result = tokio::select! {
            () = shutdown.cancelled() => return,
            r = step => r,
        };
        match result {
            Ok(()) => backoff.reset(),
            Err(Error::Closed) => return,
            Err(Error::Gone(rv)) => {
                count(&status.restarts, "gone");
                info!(rv = %rv, "watch history lost, relisting");
                resource_version = None;
            }
            Err(error) if error.reason() == "not_found" => {
                count(&status.restarts, error.reason());
                let delay = backoff.next_delay();
                info!(
                    error = %error,
                    retry_in_ms = delay.as_millis() as u64,
                    "resource not found: asking discovery whether it is gone"
                );
                target.not_found.notify_one();
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(delay) => {}
                }
            }
            Err(error) => {
                count(&status.restarts, error.reason());
                let delay = backoff.next_delay();
                warn!(
                    error = %error,
                    reason = error.reason(),
                    retry_in_ms = delay.as_millis() as u64,
                    "watch failed"
                );
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Lists every object (paginated, consistent read) and sends them between `ListBegin` and
/// `ListEnd`; returns the list's resourceVersion.
async fn list(target: &Target, tx: &mpsc::Sender<Item>) -> Result<String, Error> {
    let mut params = ListParams::default().limit(target.page_size);
    if let Some(l) = &target.label_selector {
        params = params.labels(l);
    }
    if let Some(f) = &target.field_selector {
        params = params.fields(f);
    }
    send(tx, Item::ListBegin).await?;
    let mut count = 0usize;
    let list_rv = loop {
        let page = match target.api.list(&params).await {
            Ok(page) => page,
            Err(source) => {
                send(tx, Item::ListAbort).await?;
                return Err(Error::Request {
                    reason: "list",
                    source,
                });
            }
        };
        let observed = SystemTime::now();
        for mut object in page.items {
            object.types.get_or_insert_with(|| target.types.clone());
            send(tx, Item::Listed(object, observed)).await?;
            count += 1;
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break page.metadata.resource_version.unwrap_or_default(),
        }
    };
    info!(rv = %list_rv, objects = count, "listed");
    send(tx, Item::ListEnd(list_rv.clone())).await?;
    Ok(list_rv)
}

async fn send(tx: &mpsc::Sender<Item>, item: Item) -> Result<(), Error> {
    tx.send(item).await.map_err(|_| Error::Closed)
}

/// Watches from `rv` until the stream ends (server timeout, dropped connection) or fails,
/// keeping `position` at the last resourceVersion sent.
async fn watch(
    target: &Target,
    tx: &mpsc::Sender<Item>,
    rv: &str,
    position: &mut Option<String>,
) -> Result<(), Error> {
    let mut params = WatchParams::default().timeout(target.watch_timeout_secs);
    if let Some(l) = &target.label_selector {
        params = params.labels(l);
    }
    if let Some(f) = &target.field_selector {
        params = params.fields(f);
    }
    let stream = target
        .api
        .watch(&params, rv)
        .await
        .map_err(|source| match source {
            kube::Error::Api(s) if s.code == 410 => Error::Gone(rv.to_string()),
            source => Error::Request {
                reason: "watch",
                source,
            },
        })?;
    debug!(rv, "watching");
    let mut stream = std::pin::pin!(stream.into_stream());
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(e) => e,
            Err(source) => {
                // A dropped connection: resume from the last resourceVersion.
                debug!(error = %source, "watch stream ended with an error");
                return Ok(());
            }
        };
        let observed = SystemTime::now();
        let (kind, mut object) = match event {
            WatchEvent::Added(o) => (ChangeKind::Added, o),
            WatchEvent::Modified(o) => (ChangeKind::Modified, o),
            WatchEvent::Deleted(o) => (ChangeKind::Deleted, o),
            WatchEvent::Bookmark(b) => {
                *position = Some(b.metadata.resource_version.clone());
                send(tx, Item::Progress(b.metadata.resource_version)).await?;
                continue;
            }
            WatchEvent::Error(s) if s.code == 410 => {
                return Err(Error::Gone(position.clone().unwrap_or_default()));
            }
            WatchEvent::Error(s) => {
                return Err(Error::Status {
                    code: s.code,
                    reason: s.reason,
                    message: s.message,
                });
            }
        };
        let Some((_, rv)) = ids(&object.metadata) else {
            continue;
        };
        *position = Some(rv.to_string());
        object.types.get_or_insert_with(|| target.types.clone());
        send(tx, Item::Event(kind, object, observed)).await?;
    }
    Ok(())
}

fn ids(meta: &ObjectMeta) -> Option<(&str, &str)> {
    match (meta.uid.as_deref(), meta.resource_version.as_deref()) {
        (Some(uid), Some(rv)) => Some((uid, rv)),
        _ => {
            warn!(
                name = meta.name.as_deref().unwrap_or_default(),
                "object without uid or resourceVersion skipped"
            );
            None
        }
    }
}

/// Exponential backoff from 250 ms to 30 s with jitter, so many watches failing together (an API
/// server restart) do not come back in lockstep.
#[derive(Debug, Default)]
pub struct Backoff {
    attempt: u32,
}

impl Backoff {
    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let base_ms = 250u64.saturating_mul(1 << self.attempt.min(7)).min(30_000);
        self.attempt = self.attempt.saturating_add(1);
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let jitter = u64::from(nanos) % (base_ms / 4 + 1);
        Duration::from_millis(base_ms - base_ms / 8 + jitter)
    }

    /// Back to the shortest delay after a success.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        let mut b = Backoff::default();
        let first = b.next_delay();
        assert!(
            first >= Duration::from_millis(218) && first <= Duration::from_millis(300),
            "{first:?}"
        );
        for _ in 0..20 {
            b.next_delay();
        }
        let capped = b.next_delay();
        assert!(
            capped <= Duration::from_millis(30_000 + 7_500)
                && capped >= Duration::from_millis(26_000),
            "{capped:?}"
        );
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(300));
    }
}
