//! One watch of one resource in one namespace scope: list, then watch from the list's
//! resourceVersion with bookmarks, resume from the last resourceVersion after a dropped
//! connection, and on 410 Gone relist and diff against the [`KnownObjects`] index.
//!
//! kube-runtime's `watcher` cannot start from a saved resourceVersion nor expose bookmarks, so
//! this is a small loop over `Api::list` and `Api::watch`. Its output is a stream of [`Item`]s
//! on a bounded channel: a full channel pauses the watch (backpressure, never loss).
//!
//! A watch that fails the same way again and again never spins: an event that cannot be
//! decoded, or a watch that ends at once without delivering anything, resumes with
//! [`Backoff`], counted in the watch's restarts and logged. A resourceVersion the API server
//! has not reached (its etcd was restored from a backup) is treated like 410 Gone: the API
//! server would otherwise hold the watch open, silently, until its history catches up.

use std::time::{Duration, Instant, SystemTime};

use futures::{Stream, StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, ListParams, ObjectMeta, TypeMeta, WatchEvent, WatchParams};
use kube::core::Status as ApiStatus;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use std::sync::Arc;

use crate::backoff::Backoff;
use crate::budget;
use crate::change::ChangeKind;
use crate::demand::Demand;
use crate::status::{STALL_AFTER, Status, count};

/// Every reason a watch restart is counted under (`kube_event_bridge_watch_restarts_total`).
pub const RESTART_REASONS: [&str; 8] = [
    "gone",
    "too_large",
    "forbidden",
    "not_found",
    "request",
    "status",
    "decode",
    "dropped",
];

/// A watch that stayed open this long, or delivered anything, was healthy: if it then drops, it
/// resumes at once. One that ends sooner with nothing delivered resumes with backoff.
const HEALTHY_WATCH: Duration = Duration::from_secs(10);

/// Why a watch could not go on; each is logged and retried (with backoff, or by relisting),
/// never fatal.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server answered 410 Gone: the resourceVersion is older than its watch history.
    #[error("resourceVersion {0} is too old (410 Gone)")]
    Gone(String),
    /// The API server has not reached the resourceVersion (504 `ResourceVersionTooLarge`): its
    /// etcd was restored from a backup older than the resourceVersion.
    #[error("resourceVersion {rv} is ahead of the API server: {message}")]
    TooLarge {
        /// The resourceVersion asked for.
        rv: String,
        /// The API server's message (`Too large resource version: 2000000000, current: 1234`).
        message: String,
    },
    /// A request failed.
    #[error("{reason} request failed")]
    Request {
        /// `list`, `watch` or `probe`.
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
    /// What the API server sent could not be decoded.
    #[error("cannot decode {what}")]
    Decode {
        /// `a watch event` or `a LIST response`.
        what: &'static str,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The watch ended soon after it was opened without delivering anything.
    #[error("the watch ended at once without delivering anything")]
    Unproductive(#[source] Option<kube::Error>),
    /// The pipeline behind the watch has stopped.
    #[error("the pipeline stopped")]
    Closed,
}

impl Error {
    /// A short, closed-set label for logs and metrics (one of [`RESTART_REASONS`], or `closed`).
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Gone(_) => "gone",
            Error::TooLarge { .. } => "too_large",
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
            Error::Decode { .. } => "decode",
            Error::Unproductive(_) => "dropped",
            Error::Closed => "closed",
        }
    }

    /// The error an error status of the API server stands for, at resourceVersion `rv`: 410
    /// Gone and 504 "Too large resource version" relist; anything else is a [`Error::Status`].
    fn from_status(status: ApiStatus, rv: &str) -> Self {
        if status.code == 410 {
            Error::Gone(rv.to_string())
        } else if is_too_large(&status) {
            Error::TooLarge {
                rv: rv.to_string(),
                message: status.message,
            }
        } else {
            Error::Status {
                code: status.code,
                reason: status.reason,
                message: status.message,
            }
        }
    }
}

/// Whether the API server refused a resourceVersion it has not reached: 504 `Timeout` with the
/// cause `ResourceVersionTooLarge` (`k8s.io/apiserver/pkg/storage.NewTooLargeResourceVersionError`),
/// or, from servers that send no cause, the message client-go's reflector also matches.
fn is_too_large(status: &ApiStatus) -> bool {
    let cause = status.details.as_ref().is_some_and(|d| {
        d.causes
            .iter()
            .any(|c| c.reason == "ResourceVersionTooLarge")
    });
    cause || (status.code == 504 && status.message.contains("Too large resource version"))
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
    /// The resource itself was deleted (its CRD is gone), so every object still known was
    /// deleted; sent last, as the watch stops, with the last resourceVersion reached.
    Vanished(Option<String>),
    /// An item of a snapshot on demand, queued by its walk behind what the watch sent.
    Demand(Demand),
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
    /// Objects per LIST page, at most.
    pub page_size: u32,
    /// Bytes per LIST page, about: after the first page, pages hold as many objects as fit
    /// (a LIST response is held whole in memory while it is decoded).
    pub page_bytes: usize,
    /// Server-side watch timeout; the watch is then resumed from the last resourceVersion.
    pub watch_timeout_secs: u32,
    /// Told when the API server answers 404: the resource may be gone (a deleted CRD), which a
    /// discovery refresh decides, stopping this watch cleanly.
    pub not_found: Arc<tokio::sync::Notify>,
    /// Set before `shutdown` when the resource itself was deleted (its CRD is gone): stopping,
    /// the watch then sends [`Item::Vanished`]. The API server sends its objects' deletes, but
    /// can lose the last ones when it closes the watches on removing the CRD's storage.
    pub resource_deleted: Arc<std::sync::atomic::AtomicBool>,
}

/// Runs the watch until `shutdown` or until the pipeline closes, starting from
/// `resource_version` (a checkpoint) or, if `None`, with a list. Stopped because its resource
/// was deleted ([`Target::resource_deleted`]), it sends [`Item::Vanished`] last.
pub async fn run(
    target: Target,
    resource_version: Option<String>,
    tx: mpsc::Sender<Item>,
    shutdown: CancellationToken,
    status: Arc<Status>,
) {
    let mut backoff = Backoff::default();
    let mut failing_since: Option<std::time::Instant> = None;
    let mut resume = Resume::from_checkpoint(resource_version);
    loop {
        let attempt = async {
            match resume.action() {
                Action::List => list(&target, &tx).await.map(|rv| {
                    resume.position = Some(rv);
                    false
                }),
                Action::Verify(rv) => {
                    probe(&target, &rv).await?;
                    watch(&target, &tx, &rv, &mut resume.position).await
                }
                Action::Watch(rv) => watch(&target, &tx, &rv, &mut resume.position).await,
            }
        };
        let ended = tokio::select! {
            () = shutdown.cancelled() => break,
            r = attempt => r,
        };
        let error = match resume.after(ended) {
            Effect::Next => {
                backoff.reset();
                failing_since = None;
                continue;
            }
            Effect::Stop => return,
            Effect::Relist(error) => {
                count(&status.restarts, error.reason());
                relisting(&error);
                continue;
            }
            Effect::Retry(error) => error,
        };
        count(&status.restarts, error.reason());
        let delay = backoff.next_delay();
        // A watch that keeps failing (an event it cannot decode, no RBAC, an unreachable API
        // server) is retried for ever, and after STALL_AFTER fails readiness naming the cause.
        let since = *failing_since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() >= STALL_AFTER
            && status.set_watch_stall(&format!(
                "{} ({error}: {})",
                error.reason(),
                error_cause(&error)
            ))
        {
            error!(error = %error, reason = error.reason(), "watch stalled: it keeps failing; retrying until the cause is fixed");
        }
        if error.reason() == "not_found" {
            info!(
                error = %error,
                retry_in_ms = delay.as_millis() as u64,
                "resource not found: asking discovery whether it is gone"
            );
            target.not_found.notify_one();
        } else {
            warn!(
                error = %error,
                cause = error_cause(&error),
                reason = error.reason(),
                retry_in_ms = delay.as_millis() as u64,
                "watch failed"
            );
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(delay) => {}
        }
    }
    if target
        .resource_deleted
        .load(std::sync::atomic::Ordering::Acquire)
    {
        info!("the resource was deleted: publishing the deletion of every object still known");
        // The pipeline only closes by failing, when nothing more can be published anyway.
        let _ = send(&tx, Item::Vanished(resume.position)).await;
    }
}

/// Logs why the watch lists again.
fn relisting(error: &Error) {
    match error {
        Error::TooLarge { rv, message } => warn!(
            rv = %rv,
            error = %message,
            "resourceVersion is ahead of the API server (etcd restored from a backup?), relisting"
        ),
        Error::Gone(rv) => info!(rv = %rv, "watch history lost, relisting"),
        other => info!(error = %other, "relisting"),
    }
}

/// Where the watch resumes from between two attempts, and whether the API server must first
/// show it has reached that point: kube-runtime's watcher in miniature, its rules in
/// [`Resume::action`] and [`Resume::after`], tested without I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Resume {
    /// The resourceVersion reached: of the list, of the last event or bookmark. `None`: list.
    position: Option<String>,
    /// Whether the API server must first show it has reached `position`: one from a
    /// checkpoint, or after a watch that dropped or delivered nothing (it may have been
    /// restored from a backup meanwhile, and would then hold the watch open, silently).
    verify: bool,
}

/// What the next attempt does.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    /// List, and publish what the list finds.
    List,
    /// Check that the API server has reached this resourceVersion, then watch from it.
    Verify(String),
    /// Watch from this resourceVersion.
    Watch(String),
}

/// What happens before the next attempt.
#[derive(Debug)]
enum Effect {
    /// The attempt went well: the next follows at once, the backoff starts over.
    Next,
    /// The pipeline is gone: the watch ends.
    Stop,
    /// The resourceVersion is gone or ahead of the API server: list again at once.
    Relist(Error),
    /// The attempt failed: the next follows after a backoff.
    Retry(Error),
}

impl Resume {
    /// From a checkpoint's resourceVersion, verified first; without one, a list.
    fn from_checkpoint(resource_version: Option<String>) -> Self {
        let verify = resource_version.is_some();
        Self {
            position: resource_version,
            verify,
        }
    }

    /// The next attempt.
    fn action(&self) -> Action {
        match &self.position {
            None => Action::List,
            Some(rv) if self.verify => Action::Verify(rv.clone()),
            Some(rv) => Action::Watch(rv.clone()),
        }
    }

    /// How `ended` (a list or watch that went well, `suspect` when a watch dropped or delivered
    /// nothing; or its error) changes the state, and what happens next. After any failure the
    /// position is verified before it is watched again.
    fn after(&mut self, ended: Result<bool, Error>) -> Effect {
        match ended {
            Ok(suspect) => {
                self.verify = suspect;
                Effect::Next
            }
            Err(Error::Closed) => Effect::Stop,
            Err(error @ (Error::Gone(_) | Error::TooLarge { .. })) => {
                self.verify = true;
                self.position = None;
                Effect::Relist(error)
            }
            Err(error) => {
                self.verify = true;
                Effect::Retry(error)
            }
        }
    }
}

/// The chain of causes under `error`, `a: b`, for the log.
fn error_cause(error: &Error) -> String {
    let mut out = Vec::new();
    let mut source = std::error::Error::source(error);
    while let Some(s) = source {
        out.push(s.to_string());
        source = s.source();
    }
    out.join(": ")
}

/// Checks that the API server has reached `rv`. A watch from a resourceVersion it has not reached
/// is accepted and then held open, silently, until its history catches up, so the watch itself
/// cannot tell. The current resourceVersion (a consistent LIST of one object's metadata) can:
/// when `rv` is ahead of it, the answer is what a LIST `NotOlderThan` `rv` would give after
/// a 3-second wait, 504 "Too large resource version". Opaque (non-numeric) resourceVersions
/// cannot be compared and are trusted.
async fn probe(target: &Target, rv: &str) -> Result<(), Error> {
    let Ok(wanted) = rv.parse::<u64>() else {
        return Ok(());
    };
    let page = target
        .api
        .list_metadata(&ListParams::default().limit(1))
        .await
        .map_err(|source| Error::Request {
            reason: "probe",
            source,
        })?;
    let current = page.metadata.resource_version.unwrap_or_default();
    match current.parse::<u64>() {
        Ok(current) if current < wanted => Err(Error::TooLarge {
            rv: rv.to_string(),
            message: format!("Too large resource version: {wanted}, current: {current}"),
        }),
        _ => Ok(()),
    }
}

/// Lists every object (paginated, consistent read) and sends them between `ListBegin` and
/// `ListEnd`; returns the list's resourceVersion.
async fn list(target: &Target, tx: &mpsc::Sender<Item>) -> Result<String, Error> {
    // Object sizes are unknown until the first page: it is kept small.
    let mut params = ListParams::default().limit(target.page_size.min(FIRST_PAGE));
    if let Some(l) = &target.label_selector {
        params = params.labels(l);
    }
    if let Some(f) = &target.field_selector {
        params = params.fields(f);
    }
    send(tx, Item::ListBegin).await?;
    let mut progress = ListProgress::new(Instant::now());
    let list_rv = loop {
        let page = match target.api.list(&params).await {
            Ok(page) => page,
            Err(source) => {
                send(tx, Item::ListAbort).await?;
                return Err(match source {
                    kube::Error::SerdeError(_) => Error::Decode {
                        what: "a LIST response",
                        source,
                    },
                    source => Error::Request {
                        reason: "list",
                        source,
                    },
                });
            }
        };
        let observed = SystemTime::now();
        let average = average_size(&page.items);
        let listed = page.items.len();
        for mut object in page.items {
            object.types.get_or_insert_with(|| target.types.clone());
            send(tx, Item::Listed(object, observed)).await?;
        }
        if let Some(p) = progress.page(listed, listed * average, Instant::now()) {
            info!(
                objects = p.objects,
                bytes = p.bytes,
                objects_per_sec = p.per_sec,
                "listing"
            );
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => {
                params = params.continue_token(&token);
                params.limit = Some(page_limit(target, average));
            }
            None => break page.metadata.resource_version.unwrap_or_default(),
        }
    };
    let total = progress.total(Instant::now());
    info!(
        rv = %list_rv,
        objects = total.objects,
        bytes = total.bytes,
        objects_per_sec = total.per_sec,
        secs = total.secs,
        "listed"
    );
    send(tx, Item::ListEnd(list_rv.clone())).await?;
    Ok(list_rv)
}

/// How often a long LIST logs how far it has come.
const LIST_PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// How far a LIST has come: objects and (estimated) bytes so far.
#[derive(Debug, Clone, Copy)]
struct ListProgress {
    started: Instant,
    reported: Instant,
    objects: usize,
    bytes: usize,
}

/// A progress line: totals so far, the time since the LIST began and the rate over it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ProgressLine {
    objects: usize,
    bytes: usize,
    per_sec: u64,
    secs: f64,
}

impl ListProgress {
    fn new(now: Instant) -> Self {
        Self {
            started: now,
            reported: now,
            objects: 0,
            bytes: 0,
        }
    }

    /// Counts a page of `objects` (about `bytes`) taken at `now`; a line to log when
    /// [`LIST_PROGRESS_EVERY`] has passed since the LIST began or the last line.
    fn page(&mut self, objects: usize, bytes: usize, now: Instant) -> Option<ProgressLine> {
        self.objects += objects;
        self.bytes += bytes;
        if now.duration_since(self.reported) < LIST_PROGRESS_EVERY {
            return None;
        }
        self.reported = now;
        Some(self.total(now))
    }

    /// The totals at `now`, for a progress line or the line of the LIST's end.
    fn total(&self, now: Instant) -> ProgressLine {
        let secs = now.duration_since(self.started).as_secs_f64();
        ProgressLine {
            objects: self.objects,
            bytes: self.bytes,
            per_sec: (self.objects as f64 / secs.max(f64::EPSILON)) as u64,
            secs,
        }
    }
}

async fn send(tx: &mpsc::Sender<Item>, item: Item) -> Result<(), Error> {
    tx.send(item).await.map_err(|_| Error::Closed)
}

/// Watches from `rv` until the stream ends (server timeout, dropped connection) or fails,
/// keeping `position` at the last resourceVersion sent. Returns whether the API server's
/// position is suspect (the connection dropped, or nothing arrived) and must be verified before
/// the next watch; a watch that ended at once with nothing delivered is an
/// [`Error::Unproductive`].
async fn watch(
    target: &Target,
    tx: &mpsc::Sender<Item>,
    rv: &str,
    position: &mut Option<String>,
) -> Result<bool, Error> {
    let mut params = WatchParams::default().timeout(target.watch_timeout_secs);
    if let Some(l) = &target.label_selector {
        params = params.labels(l);
    }
    if let Some(f) = &target.field_selector {
        params = params.fields(f);
    }
    let opened = Instant::now();
    let stream = target
        .api
        .watch(&params, rv)
        .await
        .map_err(|source| match source {
            kube::Error::Api(s) if s.code == 410 || is_too_large(&s) => Error::from_status(*s, rv),
            source => Error::Request {
                reason: "watch",
                source,
            },
        })?;
    debug!(rv, "watching");
    let ended = follow(stream.into_stream(), &target.types, tx, position).await?;
    let healthy = ended.delivered > 0 || opened.elapsed() >= HEALTHY_WATCH;
    match ended.dropped {
        _ if !healthy => Err(Error::Unproductive(ended.dropped)),
        Some(error) => {
            debug!(error = %error, "watch connection dropped, resuming");
            Ok(true)
        }
        None => Ok(ended.delivered == 0),
    }
}

/// How a watch stream ended without failing.
#[derive(Debug)]
struct Ended {
    /// Items sent down the pipeline.
    delivered: usize,
    /// The connection error that ended it, `None` if the server ended it.
    dropped: Option<kube::Error>,
}

/// Sends the events of one watch stream down the pipeline until it ends.
async fn follow(
    stream: impl Stream<Item = Result<WatchEvent<DynamicObject>, kube::Error>>,
    types: &TypeMeta,
    tx: &mpsc::Sender<Item>,
    position: &mut Option<String>,
) -> Result<Ended, Error> {
    let mut stream = std::pin::pin!(stream);
    let mut delivered = 0;
    while let Some(event) = stream.next().await {
        let item = match step(event, position.as_deref().unwrap_or_default())? {
            Step::Event(kind, mut object, rv) => {
                *position = Some(rv);
                object.types.get_or_insert_with(|| types.clone());
                Item::Event(kind, object, SystemTime::now())
            }
            Step::Progress(rv) => {
                *position = Some(rv.clone());
                Item::Progress(rv)
            }
            Step::Skip => continue,
            Step::Dropped(error) => {
                return Ok(Ended {
                    delivered,
                    dropped: Some(error),
                });
            }
        };
        send(tx, item).await?;
        delivered += 1;
    }
    Ok(Ended {
        delivered,
        dropped: None,
    })
}

/// What one item of a watch stream asks for.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "one value at a time, its object moved on at once"
)]
enum Step {
    /// Send this change; the watch is then at this resourceVersion.
    Event(ChangeKind, DynamicObject, String),
    /// Nothing changed up to this resourceVersion (a bookmark).
    Progress(String),
    /// Nothing to do (an object without identity, logged).
    Skip,
    /// The connection dropped: resume from the last resourceVersion.
    Dropped(kube::Error),
}

/// Classifies one item of a watch stream, the watch being at `position`: kube-client yields a
/// line it cannot decode as `SerdeError`, an error status sent instead of an event as `Api`,
/// and a broken connection as `ReadEvents` (or another transport error).
fn step(
    event: Result<WatchEvent<DynamicObject>, kube::Error>,
    position: &str,
) -> Result<Step, Error> {
    let (kind, object) = match event {
        Ok(WatchEvent::Added(o)) => (ChangeKind::Added, o),
        Ok(WatchEvent::Modified(o)) => (ChangeKind::Modified, o),
        Ok(WatchEvent::Deleted(o)) => (ChangeKind::Deleted, o),
        Ok(WatchEvent::Bookmark(b)) => return Ok(Step::Progress(b.metadata.resource_version)),
        Ok(WatchEvent::Error(s)) => return Err(Error::from_status(*s, position)),
        // kube-client decodes a line that is no watch event as a status, if it is a JSON object:
        // one without a code is no status either.
        Err(kube::Error::Api(s)) if s.code == 0 => {
            return Err(undecodable(kube::Error::SerdeError(
                serde::de::Error::custom(
                    "a JSON object that is neither a watch event of this resource nor a status",
                ),
            )));
        }
        Err(kube::Error::Api(s)) => return Err(Error::from_status(*s, position)),
        Err(e @ (kube::Error::SerdeError(_) | kube::Error::LinesCodecMaxLineLengthExceeded)) => {
            return Err(undecodable(e));
        }
        Err(e) => return Ok(Step::Dropped(e)),
    };
    let Some((_, rv)) = ids(&object.metadata) else {
        return Ok(Step::Skip);
    };
    let rv = rv.to_string();
    Ok(Step::Event(kind, object, rv))
}

fn undecodable(source: kube::Error) -> Error {
    Error::Decode {
        what: "a watch event",
        source,
    }
}

/// Objects on the first LIST page, before their sizes are known.
const FIRST_PAGE: u32 = 100;

/// Objects on the next LIST page: as many as fit `target.page_bytes` at the last page's average
/// object size, between 1 and `target.page_size`.
fn page_limit(target: &Target, average: usize) -> u32 {
    if average == 0 {
        return target.page_size;
    }
    u32::try_from(target.page_bytes / average)
        .unwrap_or(u32::MAX)
        .clamp(1, target.page_size)
}

/// The average JSON size of `items`, from at most 16 of them spread over the page: sizing a page
/// needs an average, and each object is measured again for the watch's budget anyway.
fn average_size(items: &[DynamicObject]) -> usize {
    let step = items.len().div_ceil(16).max(1);
    let sample: Vec<usize> = items
        .iter()
        .step_by(step)
        .map(budget::object_size)
        .collect();
    match sample.len() {
        0 => 0,
        n => sample.iter().sum::<usize>().div_ceil(n),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_verified_before_it_is_watched_and_a_list_is_watched_at_once() {
        let mut resume = Resume::from_checkpoint(Some("7".into()));
        assert_eq!(resume.action(), Action::Verify("7".into()));
        assert!(matches!(resume.after(Ok(false)), Effect::Next));
        assert_eq!(resume.action(), Action::Watch("7".into()));
        let mut fresh = Resume::from_checkpoint(None);
        assert_eq!(fresh.action(), Action::List);
        fresh.position = Some("9".into());
        assert!(matches!(fresh.after(Ok(false)), Effect::Next));
        assert_eq!(fresh.action(), Action::Watch("9".into()));
    }

    #[test]
    fn a_watch_that_dropped_or_delivered_nothing_and_any_failure_verify_first() {
        let mut resume = Resume::from_checkpoint(None);
        resume.position = Some("5".into());
        assert!(matches!(resume.after(Ok(true)), Effect::Next));
        assert_eq!(resume.action(), Action::Verify("5".into()));
        resume.verify = false;
        let failed = resume.after(Err(Error::Unproductive(None)));
        assert!(matches!(failed, Effect::Retry(Error::Unproductive(None))));
        assert_eq!(
            resume.action(),
            Action::Verify("5".into()),
            "the position is kept"
        );
    }

    #[test]
    fn a_lost_or_future_resource_version_lists_again_and_a_closed_pipeline_stops() {
        for error in [
            Error::Gone("5".into()),
            Error::TooLarge {
                rv: "5".into(),
                message: "too large".into(),
            },
        ] {
            let mut resume = Resume::from_checkpoint(Some("5".into()));
            assert!(matches!(resume.after(Err(error)), Effect::Relist(_)));
            assert_eq!(resume.action(), Action::List);
        }
        let mut resume = Resume::from_checkpoint(Some("5".into()));
        assert!(matches!(resume.after(Err(Error::Closed)), Effect::Stop));
    }

    #[test]
    fn a_long_list_reports_its_progress_every_ten_seconds_with_its_totals_and_rate() {
        let t0 = Instant::now();
        let mut p = ListProgress::new(t0);
        let at = |secs| t0 + Duration::from_secs(secs);
        assert_eq!(p.page(500, 500_000, at(4)), None, "too soon");
        assert_eq!(
            p.page(500, 500_000, at(10)),
            Some(ProgressLine {
                objects: 1_000,
                bytes: 1_000_000,
                per_sec: 100,
                secs: 10.0,
            })
        );
        assert_eq!(
            p.page(1_000, 1_000_000, at(19)),
            None,
            "ten seconds after the last line"
        );
        let line = p.page(1_000, 1_000_000, at(20)).expect("a line");
        assert_eq!(
            (line.objects, line.bytes, line.per_sec),
            (3_000, 3_000_000, 150)
        );
        // The end's line has the totals whenever the last progress line was.
        assert_eq!(p.page(500, 500_000, at(21)), None);
        let end = p.total(at(25));
        assert_eq!(
            (end.objects, end.bytes, end.per_sec, end.secs),
            (3_500, 3_500_000, 140, 25.0)
        );
    }

    #[test]
    fn a_short_list_logs_no_progress_only_its_totals() {
        let t0 = Instant::now();
        let mut p = ListProgress::new(t0);
        assert_eq!(p.page(100, 10_000, t0 + Duration::from_millis(200)), None);
        assert_eq!(p.page(0, 0, t0 + Duration::from_millis(300)), None);
        let end = p.total(t0 + Duration::from_millis(500));
        assert_eq!((end.objects, end.bytes, end.per_sec), (100, 10_000, 200));
        // A LIST ending the instant it began has no rate to divide by zero.
        assert_eq!(ListProgress::new(t0).total(t0).per_sec, 0);
    }

    #[tokio::test]
    async fn pages_hold_what_fits_their_bytes_at_the_average_size() {
        let object = |bytes: usize| -> DynamicObject {
            serde_json::from_value(
                json!({"metadata": {"name": "x"}, "data": {"b": "x".repeat(bytes)}}),
            )
            .unwrap()
        };
        let items: Vec<DynamicObject> = (0..100).map(|_| object(1_000)).collect();
        let average = average_size(&items);
        assert_eq!(
            average,
            budget::serialized_size(&items[0]),
            "sampled, same size"
        );
        assert_eq!(average_size(&[]), 0);
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap()))
                .unwrap();
        let mut t = target(client);
        t.page_bytes = 16 * average;
        assert_eq!(page_limit(&t, average), 16);
        assert_eq!(
            page_limit(&t, 0),
            t.page_size,
            "nothing measured: the largest page"
        );
        assert_eq!(page_limit(&t, usize::MAX), 1, "at least one object");
    }
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::discovery::ApiResource;
    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// The status kube-apiserver sends for a resourceVersion it has not reached
    /// (`storage.NewTooLargeResourceVersionError`).
    fn too_large_status(with_cause: bool) -> serde_json::Value {
        let mut status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Timeout: Too large resource version: 999999999, current: 1234",
            "reason": "Timeout", "code": 504,
            "details": {"retryAfterSeconds": 1},
        });
        if with_cause {
            status["details"]["causes"] = json!([{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]);
        }
        status
    }

    fn status(value: serde_json::Value) -> Box<ApiStatus> {
        Box::new(serde_json::from_value(value).unwrap())
    }

    fn cm_event(kind: &str, name: &str, rv: &str) -> WatchEvent<DynamicObject> {
        serde_json::from_value(json!({"type": kind, "object": {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "resourceVersion": rv},
        }}))
        .unwrap()
    }

    #[test]
    fn stream_items_are_classified() {
        let reason = |r: Result<Step, Error>| r.map(|s| format!("{s:?}")).unwrap_err().reason();
        assert!(matches!(
            step(Ok(cm_event("ADDED", "a", "7")), "5"),
            Ok(Step::Event(ChangeKind::Added, _, rv)) if rv == "7"
        ));
        assert!(matches!(
            step(Ok(cm_event("DELETED", "a", "8")), "7"),
            Ok(Step::Event(ChangeKind::Deleted, _, _))
        ));
        let bookmark = serde_json::from_value(json!({"type": "BOOKMARK", "object": {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"resourceVersion": "9"}}}))
        .unwrap();
        assert!(matches!(step(Ok(bookmark), "8"), Ok(Step::Progress(rv)) if rv == "9"));
        let anonymous =
            serde_json::from_value(json!({"type": "ADDED", "object": {"metadata": {"name": "x"}}}))
                .unwrap();
        assert!(matches!(step(Ok(anonymous), "8"), Ok(Step::Skip)));

        let dropped = kube::Error::ReadEvents(std::io::Error::other("connection reset"));
        assert!(matches!(step(Err(dropped), "8"), Ok(Step::Dropped(_))));
        let garbage = serde_json::from_str::<serde_json::Value>("{not json").unwrap_err();
        assert_eq!(
            reason(step(Err(kube::Error::SerdeError(garbage)), "8")),
            "decode"
        );
        // kube-client turns any JSON object that is no watch event into a code-less status.
        let not_an_event = status(json!({"type": "ADDED", "object": {"metadata": {"uid": 7}}}));
        assert_eq!(
            reason(step(Err(kube::Error::Api(not_an_event)), "8")),
            "decode"
        );

        let gone = status(
            json!({"code": 410, "reason": "Expired", "message": "too old resource version: 8 (90)"}),
        );
        match step(Ok(WatchEvent::Error(gone)), "8") {
            Err(Error::Gone(rv)) => assert_eq!(rv, "8"),
            other => panic!("{other:?}"),
        }
        for with_cause in [true, false] {
            let s = status(too_large_status(with_cause));
            match step(Ok(WatchEvent::Error(s.clone())), "999999999") {
                Err(Error::TooLarge { rv, message }) => {
                    assert_eq!(rv, "999999999");
                    assert!(message.contains("current: 1234"), "{message}");
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(
                reason(step(Err(kube::Error::Api(s)), "999999999")),
                "too_large"
            );
        }
        // A 504 that is an ordinary timeout is no reason to relist.
        let timeout =
            status(json!({"code": 504, "reason": "Timeout", "message": "request timed out"}));
        assert_eq!(reason(step(Ok(WatchEvent::Error(timeout)), "8")), "status");
    }

    #[tokio::test]
    async fn follow_sends_until_an_undecodable_event_and_keeps_the_last_position() {
        let garbage = serde_json::from_str::<serde_json::Value>("]").unwrap_err();
        let stream = futures::stream::iter([
            Ok(cm_event("ADDED", "a", "7")),
            Ok(cm_event("MODIFIED", "a", "8")),
            Err(kube::Error::SerdeError(garbage)),
            Ok(cm_event("MODIFIED", "a", "9")),
        ]);
        let (tx, mut rx) = mpsc::channel(8);
        let mut position = Some("5".to_string());
        let types = TypeMeta {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
        };
        let error = follow(stream, &types, &tx, &mut position)
            .await
            .unwrap_err();
        assert_eq!(error.reason(), "decode", "{error}");
        assert_eq!(
            position.as_deref(),
            Some("8"),
            "resumes after the last good event"
        );
        drop(tx);
        let mut sent = Vec::new();
        while let Some(Item::Event(kind, o, _)) = rx.recv().await {
            sent.push((kind, o.metadata.resource_version.unwrap()));
        }
        assert_eq!(
            sent,
            [
                (ChangeKind::Added, "7".into()),
                (ChangeKind::Modified, "8".into())
            ]
        );
    }

    #[tokio::test]
    async fn follow_reports_a_dropped_connection_after_what_it_delivered() {
        let stream = futures::stream::iter([
            Ok(cm_event("ADDED", "a", "7")),
            Err(kube::Error::ReadEvents(std::io::Error::other("reset"))),
        ]);
        let (tx, _rx) = mpsc::channel(8);
        let mut position = None;
        let types = TypeMeta::default();
        let ended = follow(stream, &types, &tx, &mut position).await.unwrap();
        assert_eq!(ended.delivered, 1);
        assert!(ended.dropped.is_some());
        assert_eq!(position.as_deref(), Some("7"));
    }

    /// Requests a stand-in API server received: when, and the request line's target.
    type Seen = Arc<Mutex<Vec<(Instant, String)>>>;

    /// A stand-in API server on loopback (plain HTTP/1.1, one request per connection) answering
    /// each request with `answer(path and query)`: (status code, body).
    async fn fake_api(
        answer: impl Fn(&str) -> (u16, String) + Send + Sync + 'static,
    ) -> (kube::Client, Seen) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen: Seen = Arc::default();
        let (answer, log) = (Arc::new(answer), seen.clone());
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (answer, log) = (answer.clone(), log.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head);
                    let target = head.split(' ').nth(1).unwrap_or_default().to_string();
                    log.lock().unwrap().push((Instant::now(), target.clone()));
                    let (code, body) = answer(&target);
                    let response = format!(
                        "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = conn.write_all(response.as_bytes()).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        let mut config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
        // kube-client retries 429, 503 and 504 up to 15 times on its own: seen here, that would
        // only slow the tests down.
        config.default_retry = false;
        (kube::Client::try_from(config).unwrap(), seen)
    }

    fn target(client: kube::Client) -> Target {
        let resource = ApiResource::erase::<ConfigMap>(&());
        Target {
            api: Api::namespaced_with(client, "ns", &resource),
            types: TypeMeta {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
            },
            label_selector: None,
            field_selector: None,
            page_size: 500,
            page_bytes: 16 << 20,
            watch_timeout_secs: 290,
            not_found: Arc::default(),
            resource_deleted: Arc::default(),
        }
    }

    fn restarts(status: &Status, reason: &str) -> u64 {
        status
            .restarts
            .lock()
            .unwrap()
            .get(reason)
            .copied()
            .unwrap_or(0)
    }

    const EMPTY_LIST: &str =
        r#"{"apiVersion":"v1","kind":"List","metadata":{"resourceVersion":"5"},"items":[]}"#;

    /// Runs a watch from resourceVersion 5 against an API server answering every watch with
    /// `watch_body`, until it has watched `watches` times; returns the watch requests' times and
    /// the watch's status.
    async fn watch_failing_with(
        watch_body: &'static str,
        watches: usize,
    ) -> (Vec<Instant>, Arc<Status>) {
        let (client, seen) = fake_api(move |target| {
            if target.contains("watch=true") {
                (200, watch_body.to_string())
            } else {
                (200, EMPTY_LIST.to_string())
            }
        })
        .await;
        let (tx, mut rx) = mpsc::channel(8);
        let status = Arc::new(Status::default());
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(
            target(client),
            Some("5".into()),
            tx,
            stop.clone(),
            status.clone(),
        ));
        let watch_times = || -> Vec<Instant> {
            seen.lock()
                .unwrap()
                .iter()
                .filter(|(_, t)| t.contains("watch=true"))
                .map(|(at, _)| *at)
                .collect()
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while watch_times().len() < watches {
            assert!(
                Instant::now() < deadline,
                "only {} watches in 60 s",
                watch_times().len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.cancel();
        task.await.unwrap();
        assert!(rx.try_recv().is_err(), "nothing reaches the pipeline");
        (watch_times(), status)
    }

    /// Each retry waits at least the backoff's shortest delay for its attempt (250 ms,
    /// doubling): the watch does not spin.
    fn assert_backs_off(times: &[Instant]) {
        for (i, pair) in times.windows(2).enumerate() {
            let least = Duration::from_millis(250) * (1 << i);
            let gap = pair[1] - pair[0];
            assert!(
                gap >= least,
                "retry {} came after {gap:?}, before {least:?}",
                i + 1
            );
        }
    }

    #[tokio::test]
    async fn an_undecodable_event_is_retried_with_backoff_and_counted() {
        let (times, status) = watch_failing_with(
            "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"uid\":7}}}\n",
            4,
        )
        .await;
        assert_backs_off(&times);
        assert!(restarts(&status, "decode") >= 3, "{:?}", status.restarts);
    }

    #[tokio::test]
    async fn a_watch_that_ends_at_once_with_nothing_is_retried_with_backoff() {
        let (times, status) = watch_failing_with("", 4).await;
        assert_backs_off(&times);
        assert!(restarts(&status, "dropped") >= 3, "{:?}", status.restarts);
    }

    #[tokio::test]
    async fn stopped_because_its_resource_was_deleted_it_says_so_last() {
        let (client, _) = fake_api(|target| {
            if target.contains("watch=true") && target.contains("resourceVersion=5") {
                let event = r#"{"type":"ADDED","object":{"metadata":{"name":"a","namespace":"ns","uid":"u-a","resourceVersion":"7"}}}"#;
                (200, format!("{event}\n"))
            } else if target.contains("watch=true") {
                (200, String::new())
            } else {
                (200, EMPTY_LIST.replace("\"5\"", "\"100\""))
            }
        })
        .await;
        let (tx, mut rx) = mpsc::channel(8);
        let stop = CancellationToken::new();
        let target = target(client);
        let deleted = target.resource_deleted.clone();
        let task = tokio::spawn(run(
            target,
            Some("5".into()),
            tx,
            stop.clone(),
            Arc::default(),
        ));
        assert!(matches!(rx.recv().await, Some(Item::Event(..))));
        deleted.store(true, std::sync::atomic::Ordering::Release);
        stop.cancel();
        task.await.unwrap();
        let mut rest = Vec::new();
        while let Some(item) = rx.recv().await {
            rest.push(format!("{item:?}"));
        }
        assert_eq!(rest, [format!("{:?}", Item::Vanished(Some("7".into())))]);
    }

    /// A resourceVersion the API server has not reached relists, whether the probe, the watch
    /// request or the watch stream finds out.
    async fn too_large_relists(where_: &'static str, with_cause: bool) {
        let too_large = too_large_status(with_cause).to_string();
        let start = if where_ == "probe" {
            "999999999"
        } else {
            "1250"
        };
        let (client, seen) = fake_api(move |target| {
            let watch = target.contains("watch=true");
            let from_start = target.contains(&format!("resourceVersion={start}&"))
                || target.ends_with(&format!("resourceVersion={start}"));
            match (where_, watch && from_start) {
                ("request", true) => (504, too_large.clone()),
                ("stream", true) => (200, format!("{{\"type\":\"ERROR\",\"object\":{too_large}}}\n")),
                _ if watch => (200, String::new()),
                _ => (200, r#"{"apiVersion":"v1","kind":"List","metadata":{"resourceVersion":"1300"},"items":[
                    {"metadata":{"name":"a","namespace":"ns","uid":"u-a","resourceVersion":"1200"}}]}"#.to_string()),
            }
        })
        .await;
        let (tx, mut rx) = mpsc::channel(8);
        let status = Arc::new(Status::default());
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(
            target(client),
            Some(start.into()),
            tx,
            stop.clone(),
            status.clone(),
        ));
        let mut items = Vec::new();
        while !matches!(items.last(), Some(Item::ListEnd(_))) {
            let item = tokio::time::timeout(Duration::from_secs(60), rx.recv())
                .await
                .expect("a relist within 60 s")
                .expect("the watch runs");
            items.push(item);
        }
        stop.cancel();
        task.await.unwrap();
        assert!(matches!(items[0], Item::ListBegin), "{items:?}");
        assert!(matches!(&items[1], Item::Listed(o, _) if o.metadata.name.as_deref() == Some("a")));
        assert!(
            matches!(&items[2], Item::ListEnd(rv) if rv == "1300"),
            "{items:?}"
        );
        assert_eq!(restarts(&status, "too_large"), 1, "{:?}", status.restarts);
        let requests: Vec<String> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, t)| t.clone())
            .collect();
        let relist = requests
            .iter()
            .position(|t| t.contains(&format!("limit={FIRST_PAGE}")))
            .unwrap();
        let watched: Vec<&String> = requests[..relist]
            .iter()
            .filter(|t| t.contains("watch=true"))
            .collect();
        match where_ {
            "probe" => assert!(
                watched.is_empty(),
                "no watch from a resourceVersion ahead: {requests:?}"
            ),
            _ => assert_eq!(watched.len(), 1, "{requests:?}"),
        }
    }

    #[tokio::test]
    async fn a_resource_version_ahead_of_the_api_server_relists() {
        too_large_relists("probe", true).await;
    }

    #[tokio::test]
    async fn a_too_large_answer_to_the_watch_relists() {
        too_large_relists("request", true).await;
        too_large_relists("request", false).await;
        too_large_relists("stream", true).await;
    }
}

/// Watch events as the API server streams them, and anything else a connection may carry: every
/// line goes through kube-client's decoding (`Client::request_events`), [`step`], then what the
/// bridge does with a decoded object (digest, encoding for several resource configurations,
/// rendering destinations). Nothing may panic.
#[cfg(test)]
mod fuzz {
    use std::collections::BTreeMap;

    use kube::discovery::ApiResource;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;
    use crate::change::{Change, Origin};
    use crate::discovery::ResolvedResource;
    use crate::encode::{self, ResourceInfo};
    use crate::payload::{self, Pointer};
    use crate::template::Template;

    /// What kube-client yields for one line of a watch response: the event; a status for any
    /// other JSON object; a decoding error; nothing for an incomplete line. kube-client's
    /// `LinesCodec` reports a line that is not UTF-8 as an I/O error, and strips one `\r`.
    fn decode_line(line: &[u8]) -> Option<Result<WatchEvent<DynamicObject>, kube::Error>> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let line = match std::str::from_utf8(line) {
            Ok(line) => line,
            Err(e) => {
                let io = std::io::Error::new(std::io::ErrorKind::InvalidData, e);
                return Some(Err(kube::Error::ReadEvents(io)));
            }
        };
        match serde_json::from_str::<WatchEvent<DynamicObject>>(line) {
            Ok(event) => Some(Ok(event)),
            Err(e) if e.is_eof() => None,
            Err(e) => Some(match serde_json::from_str::<ApiStatus>(line) {
                Ok(status) => Err(kube::Error::Api(Box::new(status))),
                Err(_) => Err(kube::Error::SerdeError(e)),
            }),
        }
    }

    /// Resource configurations covering every payload mode, Secret redaction, redaction and
    /// ignore pointers, both event formats and both record keys.
    fn infos() -> Vec<Arc<ResourceInfo>> {
        [
            ("configmaps", "ConfigMap", ""),
            (
                "configmaps",
                "ConfigMap",
                ", payload: diff, includePrevious: true, ignorePaths: [/data/x, /metadata/labels/a~1b, /spec/0], redact: [/data/password, /metadata/annotations/tok, /spec/items/1]",
            ),
            ("secrets", "Secret", ""),
            ("configmaps", "ConfigMap", ", payload: reference, key: namespacedName"),
            (
                "configmaps",
                "ConfigMap",
                ", eventFormat: knative, stripManagedFields: false, stripLastApplied: false, tombstones: true, key: namespacedName",
            ),
        ]
        .into_iter()
        .map(|(plural, kind, extra)| {
            let yaml = format!(
                "cluster: dev\nresources: [{{apiVersion: v1, resource: {plural}{extra}}}]\nsink: {{kafka: {{bootstrapServers: 'x:1'}}}}\n"
            );
            let config = crate::config::ConfigFile::parse(&yaml)
                .and_then(crate::config::ConfigFile::validate)
                .unwrap_or_else(|e| panic!("{yaml}: {e}"));
            let resolved = ResolvedResource {
                config: config.resources[0].clone(),
                api: ApiResource {
                    group: String::new(),
                    version: "v1".into(),
                    api_version: "v1".into(),
                    kind: kind.into(),
                    plural: plural.into(),
                },
                namespaced: true,
            };
            Arc::new(ResourceInfo::new("dev", &resolved, "https://127.0.0.1:6443"))
        })
        .collect()
    }

    /// What the bridge does with one line; returns whether it produced a change.
    fn handle(line: &[u8], infos: &[Arc<ResourceInfo>]) -> bool {
        let Some(decoded) = decode_line(line) else {
            return false;
        };
        let Ok(Step::Event(kind, mut object, rv)) = step(decoded, "1") else {
            return false;
        };
        assert_eq!(
            object.metadata.resource_version.as_deref(),
            Some(rv.as_str())
        );
        let uid = object.metadata.uid.clone().expect("an event has a uid");
        object.types.get_or_insert_with(|| TypeMeta {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
        });
        let before = serde_json::to_value(&object).expect("a decoded object serializes");
        let ignore: Vec<Pointer> = ["/data/x", "/metadata/labels/a", "/spec/0", "/status"]
            .iter()
            .map(|p| Pointer::parse(p).unwrap())
            .collect();
        let mut scratch = Vec::new();
        let digest = payload::digest(&mut object, &ignore, &mut scratch);
        assert_eq!(
            serde_json::to_value(&object).unwrap(),
            before,
            "digest restores the object"
        );
        assert_eq!(digest, payload::digest(&mut object, &ignore, &mut scratch));
        assert_ne!(digest, 0);
        for info in infos {
            let change = Change {
                kind,
                origin: Origin::Live,
                object: object.clone(),
                observed: SystemTime::now(),
            };
            let previous = serde_json::to_vec(&json!({"metadata": {"name": "before"}})).unwrap();
            match encode::encode(info, change, Some(&previous)) {
                Ok(encoded) => {
                    let mut event = encoded.event;
                    assert_eq!(event.id, encode::event_id(&uid, &rv, kind));
                    let structured: Value = serde_json::from_slice(&event.to_structured_json())
                        .expect("the structured event is JSON");
                    assert_eq!(structured["id"], event.id.as_str());
                    let _ = event.reference();
                    for template in ["k8s.{cluster}.{group}.{resource}.{namespace}", "x.{name}"] {
                        let t = Template::parse(template).unwrap();
                        let _ = t.render_topic(&event.template_values());
                        let _ = t.render_subject(&event.template_values());
                    }
                    event.truncate();
                    serde_json::from_slice::<Value>(&event.to_structured_json())
                        .expect("the truncated event is JSON");
                }
                Err(e) => assert!(
                    object.metadata.name.as_deref().is_none_or(str::is_empty),
                    "only a nameless object cannot be encoded: {e}"
                ),
            }
        }
        true
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::sample::select(vec![
                "",
                "a",
                "web",
                "read only",
                "0",
                "1",
                "18446744073709551616",
                "-1",
                "ns/x",
                "~1",
                "/",
                "\u{0}",
                "ü",
                "\u{202e}",
                "a\nb",
                "\"",
                "\\",
            ])
            .prop_map(String::from),
            prop::collection::vec(any::<char>(), 0..12).prop_map(String::from_iter),
        ]
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::sample::select(vec![
                "metadata",
                "name",
                "namespace",
                "uid",
                "resourceVersion",
                "generation",
                "labels",
                "annotations",
                "managedFields",
                "apiVersion",
                "kind",
                "type",
                "object",
                "data",
                "stringData",
                "spec",
                "status",
                "items",
                "password",
                "tok",
                "x",
                "a/b",
                "kubectl.kubernetes.io/last-applied-configuration",
            ])
            .prop_map(String::from),
            text(),
        ]
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
                .map(Value::Number)),
            text().prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(key(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A string field as the API server sends it, or now and then any JSON at all.
    fn field() -> impl Strategy<Value = Option<Value>> {
        prop_oneof![
            14 => text().prop_map(|t| Some(Value::from(t))),
            1 => Just(None),
            1 => json().prop_map(Some),
        ]
    }

    fn string_map() -> impl Strategy<Value = Value> {
        prop_oneof![
            8 => prop::collection::btree_map(key(), text(), 0..4)
                .prop_map(|m| json!(m)),
            1 => json(),
        ]
    }

    /// A watch event shaped like the API server's, with arbitrary content where it allows any,
    /// and now and then a field of the wrong type or an unknown event type.
    fn event() -> impl Strategy<Value = Value> {
        let kind = prop_oneof![
            8 => prop::sample::select(vec!["ADDED", "MODIFIED", "DELETED"]),
            1 => prop::sample::select(vec!["BOOKMARK", "ERROR", "added", "SYNC"]),
        ];
        let meta = (
            field(),
            field(),
            field(),
            field(),
            string_map(),
            string_map(),
            json(),
            json(),
        );
        let body = prop::collection::btree_map(key(), json(), 0..5);
        (kind, meta, body).prop_map(|(kind, meta, body)| {
            let (name, namespace, uid, rv, labels, annotations, managed, generation) = meta;
            let mut metadata = BTreeMap::new();
            for (k, v) in [
                ("name", name),
                ("namespace", namespace),
                ("uid", uid),
                ("resourceVersion", rv),
            ] {
                if let Some(v) = v {
                    metadata.insert(k.to_string(), v);
                }
            }
            metadata.insert("labels".into(), labels);
            metadata.insert("annotations".into(), annotations);
            if managed.is_array() {
                metadata.insert("managedFields".into(), managed);
            }
            if generation.is_i64() {
                metadata.insert("generation".into(), generation);
            }
            let mut object: serde_json::Map<String, Value> = body.into_iter().collect();
            object.insert("apiVersion".into(), "v1".into());
            object.insert("metadata".into(), json!(metadata));
            json!({"type": kind, "object": object})
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let infos = infos();
            for line in bytes.split(|b| *b == b'\n') {
                handle(line, &infos);
            }
        }

        #[test]
        fn arbitrary_json_lines_never_panic(values in prop::collection::vec(json(), 1..4)) {
            let infos = infos();
            for v in values {
                handle(v.to_string().as_bytes(), &infos);
            }
        }

        #[test]
        fn watch_events_never_panic(e in event(), cut in any::<prop::sample::Index>()) {
            let infos = infos();
            let line = e.to_string();
            handle(line.as_bytes(), &infos);
            // The same line cut short, as a dropped connection leaves it.
            handle(&line.as_bytes()[..cut.index(line.len() + 1)], &infos);
        }
    }

    /// The generator reaches the encoder: a good share of its events become changes.
    #[test]
    fn generated_events_reach_the_encoder() {
        use proptest::strategy::ValueTree;
        let infos = infos();
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let strategy = event();
        let handled = (0..200)
            .filter(|_| {
                let line = strategy
                    .new_tree(&mut runner)
                    .unwrap()
                    .current()
                    .to_string();
                handle(line.as_bytes(), &infos)
            })
            .count();
        assert!(
            handled >= 20,
            "only {handled} of 200 generated events were changes"
        );
    }

    #[test]
    fn a_secret_with_odd_values_is_handled() {
        let infos = infos();
        let line = json!({"type": "MODIFIED", "object": {"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "read only", "namespace": "ns", "uid": "u", "resourceVersion": "18446744073709551616",
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "data": {"password": "c2VjcmV0"}, "spec": [1, {"x": null}]}})
        .to_string();
        assert!(handle(line.as_bytes(), &infos));
        // Duplicate keys (the generators cannot make them): kept or refused, never a panic.
        let duplicate = br#"{"type":"ADDED","object":{"metadata":{"name":"a","uid":"u","resourceVersion":"1","name":"b"},"data":{},"data":[]}}"#;
        handle(duplicate, &infos);
    }
}
