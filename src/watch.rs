//! One watch of one resource in one namespace scope: list, then watch from the list's
//! resourceVersion with bookmarks, resume from the last resourceVersion after a dropped
//! connection, and on 410 Gone relist and diff against the [`KnownObjects`] index.
//!
//! kube-runtime's `watcher` cannot start from a saved resourceVersion nor expose bookmarks, so
//! this is a small loop over `Api::list` and `Api::watch`. Its output is a stream of [`Item`]s
//! on a bounded channel: a full channel pauses the watch (backpressure, never loss).
//!
//! A list is a streaming list where the API server serves one ([`streaming_list`], whose
//! connection then goes on as the live watch), else a paged LIST ([`list`]), as
//! `kubernetes.initialList` and [`Listing`] decide; the live watch is [`stream`].
//!
//! A watch that fails the same way again and again never spins: an event that cannot be
//! decoded, or a watch that ends at once without delivering anything, resumes with
//! [`Backoff`], counted in the watch's restarts and logged. A resourceVersion the API server
//! has not reached (its etcd was restored from a backup) is treated like 410 Gone: the API
//! server would otherwise hold the watch open, silently, until its history catches up.

use std::sync::Arc;
use std::time::SystemTime;

use kube::api::{Api, DynamicObject, ListParams, TypeMeta};
use kube::core::Status as ApiStatus;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::backoff::Backoff;
use crate::change::ChangeKind;
use crate::status::{STALL_AFTER, Status, count};

#[cfg(test)]
mod fake_api;
#[cfg(test)]
mod fuzz;
mod history;
mod list;
mod stream;
mod streaming_list;

pub use history::History;
use list::list;
use stream::watch;
pub use streaming_list::Listing;
use streaming_list::{Method, stream_list};

/// Every reason a watch restart is counted under (`kube_event_bridge_watch_restarts_total`).
pub const RESTART_REASONS: [&str; 9] = [
    "gone",
    "too_large",
    "forbidden",
    "not_found",
    "request",
    "status",
    "decode",
    "dropped",
    "stream_refused",
];

/// Why a watch spared a request to the API server, as `kube_event_bridge_watch_requests_spared_total`
/// counts it ([`History`]): `gone`, a watch from a resourceVersion another watch of the resource
/// found gone (not made, or withdrawn while it waited for the client-side throttle); `probe`, a
/// probe another watch's fresh answer covered.
pub const SPARED_REASONS: [&str; 2] = ["gone", "probe"];

/// How a list completed, as `kube_event_bridge_lists_completed_total` counts it: a streaming
/// list or a paged LIST.
pub const LIST_METHODS: [&str; 2] = ["stream", "list"];

/// Why a watch could not go on; each is logged and retried (with backoff, or by relisting),
/// never fatal.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server answered 410 Gone: the resourceVersion is older than its watch history.
    #[error("resourceVersion {rv} is too old (410 Gone)")]
    Gone {
        /// The resourceVersion asked for.
        rv: String,
        /// The oldest resourceVersion the API server still serves, where its message says
        /// (`too old resource version: 10 (90)`: 90).
        kept_from: Option<u64>,
    },
    /// The API server has not reached the resourceVersion (504 `ResourceVersionTooLarge`): its
    /// etcd was restored from a backup older than the resourceVersion.
    #[error("resourceVersion {rv} is ahead of the API server: {message}")]
    TooLarge {
        /// The resourceVersion asked for.
        rv: String,
        /// The API server's message (`Too large resource version: 2000000000, current: 1234`).
        message: String,
    },
    /// A consistent list (no resourceVersion asked for) the API server's watch cache could not
    /// serve: it had not caught up with etcd's latest revision within the API server's wait
    /// (3 s, the same 504 `ResourceVersionTooLarge`), as when it has just started under load.
    #[error("the API server's watch cache lags etcd: {message}")]
    Lagging {
        /// The API server's message (`Too large resource version: 448346, current: 448345`).
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
    /// The API server does not serve streaming lists (`kubernetes.initialList: stream`; with
    /// `auto` the watch lists in pages instead).
    #[error("the API server refuses streaming lists")]
    StreamRefused(#[source] kube::Error),
    /// A streaming list's connection ended before its last object.
    #[error("the streaming list ended before its last object")]
    ListCut(#[source] Option<kube::Error>),
    /// The pipeline behind the watch has stopped.
    #[error("the pipeline stopped")]
    Closed,
}

impl Error {
    /// A short, closed-set label for logs and metrics (one of [`RESTART_REASONS`], or `closed`).
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Gone { .. } => "gone",
            Error::TooLarge { .. } | Error::Lagging { .. } => "too_large",
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
            Error::Unproductive(_) | Error::ListCut(_) => "dropped",
            Error::StreamRefused(_) => "stream_refused",
            Error::Closed => "closed",
        }
    }

    /// The error an error status of the API server stands for, at resourceVersion `rv`: 410
    /// Gone and 504 "Too large resource version" relist (without `rv`, a consistent read, the
    /// latter is the watch cache's lag: [`Error::Lagging`]); anything else is a
    /// [`Error::Status`].
    fn from_status(status: ApiStatus, rv: &str) -> Self {
        if status.code == 410 {
            Error::Gone {
                rv: rv.to_string(),
                kept_from: kept_from(&status.message),
            }
        } else if is_too_large(&status) {
            if rv.is_empty() {
                Error::Lagging {
                    message: status.message,
                }
            } else {
                Error::TooLarge {
                    rv: rv.to_string(),
                    message: status.message,
                }
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
/// classifies what the watch saw, so the index always matches what was sent. Objects are boxed:
/// items wait in channels whose blocks hold 32 items each and stay allocated after a list.
#[derive(Debug)]
pub enum Item {
    /// An event of the live watch.
    Event(ChangeKind, Box<DynamicObject>, SystemTime),
    /// A (re)list starts: the listed objects follow.
    ListBegin,
    /// One listed object.
    Listed(Box<DynamicObject>, SystemTime),
    /// The list is complete, at this resourceVersion.
    ListEnd(String),
    /// The list failed part-way: nothing may be concluded from what was listed.
    ListAbort,
    /// Nothing changed up to this resourceVersion (a bookmark).
    Progress(String),
    /// The resource itself was deleted (its CRD is gone), so every object still known was
    /// deleted; sent last, as the watch stops, with the last resourceVersion reached.
    Vanished(Option<String>),
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
    /// How the resource is listed: shared by its watches.
    pub listing: Arc<Listing>,
    /// What the API server is known to hold of the resource's history: shared by its watches.
    pub history: Arc<History>,
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
                Action::List(from) => {
                    read_state(&target, &tx, &status, &mut resume.position, from.as_deref()).await
                }
                Action::Verify(rv) => {
                    target
                        .history
                        .verify(&rv, &status, || probe(&target))
                        .await?;
                    watch(&target, &tx, &status, &rv, &mut resume.position).await
                }
                Action::Watch(rv) => watch(&target, &tx, &status, &rv, &mut resume.position).await,
            }
        };
        let ended = tokio::select! {
            () = shutdown.cancelled() => break,
            r = attempt => r,
        };
        learn(&target.history, &ended);
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

/// Lists the resource, keeping `position` at the list's resourceVersion: by a streaming list
/// that goes on as the live watch (it returns what a watch returns), or a paged LIST (the watch
/// follows in the next attempt). A refused streaming list falls back to the paged LIST with
/// `kubernetes.initialList: auto`. A streaming list lists a state at least as new as `from`; a
/// paged LIST reads the latest.
async fn read_state(
    target: &Target,
    tx: &mpsc::Sender<Item>,
    status: &Status,
    position: &mut Option<String>,
    from: Option<&str>,
) -> Result<bool, Error> {
    if target.listing.method() == Method::Stream {
        match stream_list(target, tx, status, position, from).await {
            Err(Error::StreamRefused(refusal)) if target.listing.falls_back() => {
                target.listing.fall_back(&api_message(&refusal), status);
            }
            other => return other,
        }
    }
    let rv = list(target, tx).await?;
    count(&status.lists, Method::List.label());
    target.history.listed(&rv);
    *position = Some(rv);
    Ok(false)
}

/// The API server's message in `error`, or the error itself.
fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
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
        Error::Gone { rv, .. } => info!(rv = %rv, "watch history lost, relisting"),
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
    /// The resourceVersion a 410 found gone: the next list is of a state at least that new
    /// (`NotOlderThan`), which the API server's watch cache serves at once. A consistent read
    /// (`None`) waits for the cache to reach etcd's latest revision, and an API server just
    /// restarted under load can fail that after 3 s (docs/benchmarks.md, "The 410 repair
    /// without consistent reads").
    floor: Option<String>,
}

/// What the next attempt does.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    /// List a state at least as new as this resourceVersion (`None`: the latest, a consistent
    /// read), and publish what the list finds.
    List(Option<String>),
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
            floor: None,
        }
    }

    /// The next attempt.
    fn action(&self) -> Action {
        match &self.position {
            None => Action::List(self.floor.clone()),
            Some(rv) if self.verify => Action::Verify(rv.clone()),
            Some(rv) => Action::Watch(rv.clone()),
        }
    }

    /// How `ended` (a list or watch that went well, `suspect` when a watch dropped or delivered
    /// nothing; or its error) changes the state, and what happens next. After any failure the
    /// position is verified before it is watched again. A watch's 410 has the list that follows
    /// start from the resourceVersion found gone; a list's own 410, or a resourceVersion ahead
    /// of the API server, from its latest. A consistent list the watch cache could not serve in
    /// time is the API server's own lag: retried as a failed request is, after a backoff, and
    /// named by readiness if it lasts.
    fn after(&mut self, ended: Result<bool, Error>) -> Effect {
        match ended {
            Ok(suspect) => {
                self.verify = suspect;
                self.floor = None;
                Effect::Next
            }
            Err(Error::Closed) => Effect::Stop,
            Err(error @ (Error::Gone { .. } | Error::TooLarge { .. })) => {
                self.floor = match &error {
                    Error::Gone { rv, .. } if self.position.is_some() && !rv.is_empty() => {
                        Some(rv.clone())
                    }
                    _ => None,
                };
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

/// The oldest resourceVersion the API server still serves, as the message of its 410 says: the
/// watch cache's `too old resource version: 10 (90)` means everything before 90 is gone (older
/// servers print the oldest they hold, newer ones the one before it: before either, everything is
/// gone). `None` for any other message (etcd's own: `The resourceVersion for the provided watch
/// is too old.`).
fn kept_from(message: &str) -> Option<u64> {
    let rest = message.strip_prefix("too old resource version: ")?;
    let (_, kept) = rest.split_once(" (")?;
    kept.strip_suffix(')')?.parse().ok()
}

/// What an attempt's end tells the resource's other watches: a resourceVersion found gone, or
/// one found ahead of the API server.
fn learn(history: &History, ended: &Result<bool, Error>) {
    match ended {
        Err(Error::Gone { rv, kept_from }) => history.lost(rv, *kept_from),
        Err(Error::TooLarge { .. }) => history.ahead(),
        _ => {}
    }
}

/// The API server's current resourceVersion (a consistent LIST of one object's metadata), for
/// [`History::verify`]; `None` when it is not an integer. A watch from a resourceVersion the
/// API server has not reached is accepted and then held open, silently, until its history
/// catches up, so the watch itself cannot tell; when the resourceVersion is ahead of the current
/// one, the answer is what a LIST `NotOlderThan` it would give after a 3-second wait, 504 "Too
/// large resource version".
async fn probe(target: &Target) -> Result<Option<u64>, Error> {
    let page = target
        .api
        .list_metadata(&ListParams::default().limit(1))
        .await
        .map_err(|source| Error::Request {
            reason: "probe",
            source,
        })?;
    let current = page.metadata.resource_version.unwrap_or_default();
    Ok(current.parse().ok())
}

async fn send(tx: &mpsc::Sender<Item>, item: Item) -> Result<(), Error> {
    tx.send(item).await.map_err(|_| Error::Closed)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::config::InitialList;
    use crate::watch::fake_api::{
        fake_api, fake_api_with, restarts, target, targets, too_large_status,
    };
    use crate::watch::list::FIRST_PAGE;

    #[test]
    fn a_checkpoint_is_verified_before_it_is_watched_and_a_list_is_watched_at_once() {
        let mut resume = Resume::from_checkpoint(Some("7".into()));
        assert_eq!(resume.action(), Action::Verify("7".into()));
        assert!(matches!(resume.after(Ok(false)), Effect::Next));
        assert_eq!(resume.action(), Action::Watch("7".into()));
        let mut fresh = Resume::from_checkpoint(None);
        assert_eq!(fresh.action(), Action::List(None));
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

    fn gone(rv: &str) -> Error {
        Error::Gone {
            rv: rv.into(),
            kept_from: None,
        }
    }

    fn too_large(rv: &str) -> Error {
        Error::TooLarge {
            rv: rv.into(),
            message: "too large".into(),
        }
    }

    #[test]
    fn a_lost_or_future_resource_version_lists_again_and_a_closed_pipeline_stops() {
        let mut resume = Resume::from_checkpoint(Some("5".into()));
        assert!(matches!(resume.after(Err(gone("5"))), Effect::Relist(_)));
        assert_eq!(
            resume.action(),
            Action::List(Some("5".into())),
            "after a watch's 410, a state at least as new as what was found gone"
        );
        let mut resume = Resume::from_checkpoint(Some("5".into()));
        assert!(matches!(
            resume.after(Err(too_large("5"))),
            Effect::Relist(_)
        ));
        assert_eq!(
            resume.action(),
            Action::List(None),
            "ahead of the API server: its latest state"
        );
        let mut resume = Resume::from_checkpoint(Some("5".into()));
        assert!(matches!(resume.after(Err(Error::Closed)), Effect::Stop));
    }

    #[test]
    fn a_list_from_a_lost_resource_version_retries_from_it_and_once_listed_forgets_it() {
        let mut resume = Resume::from_checkpoint(Some("5".into()));
        resume.after(Err(gone("5")));
        // The list's request fails: the next list starts from the same point.
        let failed = resume.after(Err(Error::Unproductive(None)));
        assert!(matches!(failed, Effect::Retry(_)));
        assert_eq!(resume.action(), Action::List(Some("5".into())));
        // Answered 410 itself, or found ahead of the API server: the next list reads the latest.
        for error in [gone("5"), too_large("5")] {
            let mut resume = Resume::from_checkpoint(Some("5".into()));
            resume.after(Err(gone("5")));
            assert!(matches!(resume.after(Err(error)), Effect::Relist(_)));
            assert_eq!(resume.action(), Action::List(None));
        }
        // A consistent list the watch cache could not serve in time: tried again after a
        // backoff, as it was.
        let mut consistent = Resume::from_checkpoint(None);
        let lag = consistent.after(Err(Error::Lagging {
            message: "Too large resource version: 9, current: 8".into(),
        }));
        assert!(
            matches!(lag, Effect::Retry(Error::Lagging { .. })),
            "{lag:?}"
        );
        assert_eq!(consistent.action(), Action::List(None));
        // Listed, then watched from the list: a later 410 starts from that watch's point.
        resume.position = Some("9".into());
        assert!(matches!(resume.after(Ok(false)), Effect::Next));
        assert_eq!(resume.action(), Action::Watch("9".into()));
        resume.after(Err(gone("12")));
        assert_eq!(resume.action(), Action::List(Some("12".into())));
    }

    #[test]
    fn a_410_says_which_resource_versions_the_api_server_still_serves() {
        assert_eq!(kept_from("too old resource version: 10 (90)"), Some(90));
        for other in [
            "The resourceVersion for the provided watch is too old.",
            "too old resource version: 10",
            "too old resource version: 10 (x)",
            "",
        ] {
            assert_eq!(kept_from(other), None, "{other}");
        }
        let status: ApiStatus = serde_json::from_value(serde_json::json!({
            "status": "Failure", "message": "too old resource version: 10 (90)",
            "reason": "Expired", "code": 410,
        }))
        .unwrap();
        let error = Error::from_status(status, "10");
        assert!(
            matches!(&error, Error::Gone { rv, kept_from: Some(90) } if rv == "10"),
            "{error:?}"
        );
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
        let requests = targets(&seen);
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

    /// Watches resuming together from a resourceVersion the API server has lost (its restart
    /// emptied its watch cache) ask what one of them finds out: one probe, one watch answered 410
    /// Gone, then a list each; the other watch requests, waiting for the client-side throttle,
    /// are never sent.
    #[tokio::test]
    async fn watches_resuming_together_from_a_lost_resource_version_ask_once() {
        const WATCHES: usize = 6;
        let gone = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 10 (90)","reason":"Expired","code":410}}"#;
        let throttle = crate::throttle::ThrottleLayer::new(
            4.0,
            1,
            Arc::new(crate::throttle::Counters::default()),
        );
        let (client, seen) = fake_api_with(
            move |target| match target {
                t if t.contains("watch=true") && t.contains("resourceVersion=10") => {
                    (200, format!("{gone}\n"))
                }
                t if t.contains("watch=true") => (200, String::new()),
                _ => (200, EMPTY_LIST.replace("\"5\"", "\"100\"")),
            },
            Some(throttle),
        )
        .await;
        let history = Arc::new(History::default());
        let stop = CancellationToken::new();
        let mut tasks = Vec::new();
        let mut receivers = Vec::new();
        for _ in 0..WATCHES {
            let (tx, rx) = mpsc::channel(8);
            let mut t = target(client.clone());
            t.history = history.clone();
            tasks.push(tokio::spawn(run(
                t,
                Some("10".into()),
                tx,
                stop.clone(),
                Arc::default(),
            )));
            receivers.push(rx);
        }
        for rx in &mut receivers {
            loop {
                let item = tokio::time::timeout(Duration::from_secs(60), rx.recv())
                    .await
                    .expect("a relist within 60 s")
                    .expect("the watch runs");
                if matches!(&item, Item::ListEnd(rv) if rv == "100") {
                    break;
                }
            }
        }
        stop.cancel();
        for task in tasks {
            task.await.unwrap();
        }
        let requests = targets(&seen);
        let count = |what: &dyn Fn(&String) -> bool| requests.iter().filter(|t| what(t)).count();
        assert_eq!(
            count(&|t| t.contains("limit=1&") || t.ends_with("limit=1")),
            1,
            "one probe: {requests:?}"
        );
        assert_eq!(
            count(&|t| t.contains("watch=true") && t.contains("resourceVersion=10")),
            1,
            "one watch answered 410: {requests:?}"
        );
        assert_eq!(
            count(&|t| t.contains(&format!("limit={FIRST_PAGE}"))),
            WATCHES,
            "{requests:?}"
        );
        assert!(
            history.is_gone("89") && !history.is_gone("90"),
            "as the 410 said"
        );
    }

    /// The body of a streaming list of ConfigMap `a` at resourceVersion 10, with its end
    /// bookmark, then a live change of `a`.
    const STREAMED: &str = concat!(
        r#"{"type":"ADDED","object":{"metadata":{"name":"a","namespace":"ns","uid":"u-a","resourceVersion":"7"}}}"#,
        "\n",
        r#"{"type":"BOOKMARK","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"resourceVersion":"10","annotations":{"k8s.io/initial-events-end":"true"}}}}"#,
        "\n",
        r#"{"type":"MODIFIED","object":{"metadata":{"name":"a","namespace":"ns","uid":"u-a","resourceVersion":"11"}}}"#,
        "\n",
    );

    /// What kube-apiserver 1.35 answers a streaming list with the `WatchList` gate off.
    const GATE_OFF: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled","reason":"Invalid","code":422}"#;

    const LIST_OF_A: &str = r#"{"apiVersion":"v1","kind":"List","metadata":{"resourceVersion":"10"},"items":[
        {"metadata":{"name":"a","namespace":"ns","uid":"u-a","resourceVersion":"7"}}]}"#;

    /// Runs a fresh watch listing per `setting` against an API server that serves streaming
    /// lists or not, until `until` holds for the items received; returns them, the requests and
    /// the watch's status.
    async fn listing_with(
        listing: Arc<Listing>,
        streams: bool,
        until: impl Fn(&[Item]) -> bool,
    ) -> (Vec<Item>, Vec<String>, Arc<Status>) {
        let answer = move |target: &str| {
            let streaming = target.contains("sendInitialEvents=true");
            match (streaming, streams) {
                (true, true) => (200, STREAMED.to_string()),
                (true, false) => (422, GATE_OFF.to_string()),
                _ if target.contains("watch=true") => (200, String::new()),
                _ => (200, LIST_OF_A.to_string()),
            }
        };
        run_until(answer, listing, Arc::default(), None, until).await
    }

    /// Runs a watch of a resource listed per `listing`, with `history`, from `checkpoint`,
    /// against an API server answering per `answer`, until `until` holds for the items
    /// received (60 s at most); returns them, the requests and the watch's status.
    async fn run_until(
        answer: impl Fn(&str) -> (u16, String) + Send + Sync + 'static,
        listing: Arc<Listing>,
        history: Arc<History>,
        checkpoint: Option<&str>,
        until: impl Fn(&[Item]) -> bool,
    ) -> (Vec<Item>, Vec<String>, Arc<Status>) {
        let (client, seen) = fake_api(answer).await;
        let (tx, mut rx) = mpsc::channel(8);
        let status = Arc::new(Status::default());
        let stop = CancellationToken::new();
        let mut t = target(client);
        t.listing = listing;
        t.history = history;
        let task = tokio::spawn(run(
            t,
            checkpoint.map(String::from),
            tx,
            stop.clone(),
            status.clone(),
        ));
        let mut items = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !until(&items) {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, rx.recv()).await {
                Ok(Some(item)) => items.push(item),
                Ok(None) => panic!("the watch stopped: {items:?}"),
                Err(_) => panic!("60 s without the expected items: {items:?}"),
            }
        }
        stop.cancel();
        task.await.unwrap();
        (items, targets(&seen), status)
    }

    fn listed(status: &Status, method: &str) -> u64 {
        status
            .lists
            .lock()
            .unwrap()
            .get(method)
            .copied()
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn a_streaming_list_is_a_list_then_the_live_watch_on_the_same_connection() {
        let listing = Arc::new(Listing::new("v1/configmaps", InitialList::Auto));
        let live = |items: &[Item]| matches!(items.last(), Some(Item::Event(..)));
        let (items, requests, status) = listing_with(listing, true, live).await;
        let items: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
        assert!(items[0].starts_with("ListBegin"), "{items:?}");
        assert!(
            items[1].starts_with("Listed") && items[1].contains("\"7\""),
            "{items:?}"
        );
        assert_eq!(items[2], format!("{:?}", Item::ListEnd("10".into())));
        assert!(items[3].starts_with("Event(Modified") && items[3].contains("\"11\""));
        assert_eq!(items.len(), 4);
        // A consistent read: resourceVersion "" with NotOlderThan, bookmarks on.
        let first = &requests[0];
        for param in [
            "watch=true",
            "sendInitialEvents=true",
            "resourceVersionMatch=NotOlderThan",
            "allowWatchBookmarks=true",
        ] {
            assert!(first.contains(param), "{param}: {first}");
        }
        assert!(first.ends_with("resourceVersion="), "{first}");
        assert!(
            !requests.iter().any(|r| !r.contains("watch=true")),
            "no LIST: {requests:?}"
        );
        assert_eq!((listed(&status, "stream"), listed(&status, "list")), (1, 0));
        assert_eq!(
            status
                .list_fallbacks
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
    }

    /// Runs a streaming watch from `checkpoint` against an API server answering per `answer`
    /// until the live change after [`STREAMED`]'s list; returns the items, the requests and the
    /// watch's status.
    async fn streaming_until_live(
        answer: impl Fn(&str) -> (u16, String) + Send + Sync + 'static,
        checkpoint: Option<&str>,
        history: Arc<History>,
    ) -> (Vec<Item>, Vec<String>, Arc<Status>) {
        let listing = Arc::new(Listing::new("v1/configmaps", InitialList::Stream));
        let live = |items: &[Item]| matches!(items.last(), Some(Item::Event(..)));
        run_until(answer, listing, history, checkpoint, live).await
    }

    /// After a watch's 410, the streaming list asks for a state at least as new as the
    /// resourceVersion found gone, which the watch cache serves at once, not for a consistent
    /// read, which it serves once it has caught up with etcd.
    #[tokio::test]
    async fn a_streaming_list_after_a_410_starts_from_what_was_found_gone() {
        let gone = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 10 (90)","reason":"Expired","code":410}}"#;
        let answer = move |target: &str| match target {
            t if t.contains("sendInitialEvents=true") => (200, STREAMED.to_string()),
            t if t.contains("watch=true") => (200, format!("{gone}\n")),
            _ => (200, EMPTY_LIST.replace("\"5\"", "\"100\"")),
        };
        let (items, requests, status) =
            streaming_until_live(answer, Some("10"), Arc::default()).await;
        let streamed: Vec<&String> = requests
            .iter()
            .filter(|t| t.contains("sendInitialEvents=true"))
            .collect();
        assert_eq!(streamed.len(), 1, "{requests:?}");
        assert!(
            streamed[0].contains("resourceVersion=10&")
                || streamed[0].ends_with("resourceVersion=10"),
            "NotOlderThan the resourceVersion found gone: {}",
            streamed[0]
        );
        assert!(streamed[0].contains("resourceVersionMatch=NotOlderThan"));
        assert!(matches!(items[0], Item::ListBegin), "{items:?}");
        assert_eq!(restarts(&status, "gone"), 1, "{:?}", status.restarts);
    }

    /// A consistent streaming list the watch cache could not serve in time (504 "Too large
    /// resource version" as the stream's first event, what an API server just restarted under
    /// load answers) begins no list, forgets nothing of the resource's history, and is asked
    /// again after a backoff.
    #[tokio::test]
    async fn a_consistent_list_the_watch_cache_could_not_serve_in_time_is_asked_again() {
        let lagging = format!(
            "{{\"type\":\"ERROR\",\"object\":{}}}\n",
            too_large_status(true)
        );
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = asked.clone();
        let answer = move |target: &str| {
            if !target.contains("sendInitialEvents=true") {
                return (200, String::new());
            }
            match counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                0 => (200, lagging.clone()),
                _ => (200, STREAMED.to_string()),
            }
        };
        let history = Arc::new(History::default());
        history.lost("5", None);
        let (items, requests, status) = streaming_until_live(answer, None, history.clone()).await;
        let items: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
        assert!(items[0].starts_with("ListBegin"), "{items:?}");
        assert_eq!(
            items.iter().filter(|i| i.starts_with("ListBegin")).count(),
            1,
            "one list begun, none aborted: {items:?}"
        );
        assert!(
            !items.iter().any(|i| i.starts_with("ListAbort")),
            "{items:?}"
        );
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert!(
            requests
                .iter()
                .all(|t| t.ends_with("resourceVersion=") || !t.contains("sendInitialEvents")),
            "both consistent reads: {requests:?}"
        );
        assert_eq!(restarts(&status, "too_large"), 1, "{:?}", status.restarts);
        assert!(history.is_gone("5"), "the history is kept");
    }

    #[tokio::test]
    async fn auto_lists_in_pages_where_streaming_lists_are_refused_and_remembers_it() {
        let listing = Arc::new(Listing::new("v1/configmaps", InitialList::Auto));
        let ended = |items: &[Item]| matches!(items.last(), Some(Item::ListEnd(_)));
        let (items, requests, status) = listing_with(listing.clone(), false, ended).await;
        let items: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
        assert_eq!(items.len(), 3, "one list, not a begun stream: {items:?}");
        assert!(items[0].starts_with("ListBegin") && items[1].starts_with("Listed"));
        assert!(
            requests[0].contains("sendInitialEvents=true"),
            "{requests:?}"
        );
        assert!(
            requests[1].contains(&format!("limit={FIRST_PAGE}")),
            "{requests:?}"
        );
        assert_eq!(
            status
                .list_fallbacks
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        assert_eq!((listed(&status, "stream"), listed(&status, "list")), (0, 1));
        assert_eq!(restarts(&status, "stream_refused"), 0, "no failure");
        // Another watch of the resource (or a relist) lists in pages at once.
        let (_, requests, status) = listing_with(listing, false, ended).await;
        assert!(
            !requests.iter().any(|r| r.contains("sendInitialEvents")),
            "{requests:?}"
        );
        assert_eq!(
            status
                .list_fallbacks
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
    }

    #[tokio::test]
    async fn stream_fails_the_watch_where_streaming_lists_are_refused() {
        let (client, seen) = fake_api(|target| {
            if target.contains("sendInitialEvents=true") {
                (422, GATE_OFF.to_string())
            } else {
                (200, LIST_OF_A.to_string())
            }
        })
        .await;
        let (tx, mut rx) = mpsc::channel(8);
        let status = Arc::new(Status::default());
        let stop = CancellationToken::new();
        let mut t = target(client);
        t.listing = Arc::new(Listing::new("v1/configmaps", InitialList::Stream));
        let task = tokio::spawn(run(t, None, tx, stop.clone(), status.clone()));
        let deadline = Instant::now() + Duration::from_secs(60);
        while seen.lock().unwrap().len() < 3 {
            assert!(
                Instant::now() < deadline,
                "only {:?} in 60 s",
                seen.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.cancel();
        task.await.unwrap();
        assert!(rx.try_recv().is_err(), "nothing reaches the pipeline");
        let requests = seen.lock().unwrap();
        assert!(
            requests
                .iter()
                .all(|(_, r)| r.contains("sendInitialEvents=true")),
            "{requests:?}"
        );
        assert!(
            restarts(&status, "stream_refused") >= 2,
            "{:?}",
            status.restarts
        );
        assert_eq!(
            status
                .list_fallbacks
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
    }
}
