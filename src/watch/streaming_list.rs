//! The streaming list (KEP-3157): a watch with `sendInitialEvents=true` from resourceVersion ""
//! (a consistent read) sends every object as an ADDED event, then a bookmark annotated
//! `k8s.io/initial-events-end: "true"` at the list's resourceVersion, then live events on the
//! same connection. The API server streams the objects one by one instead of holding a page of
//! them in memory. Mapped onto the items of a paged LIST ([`Item::ListBegin`], one
//! [`Item::Listed`] per object, [`Item::ListEnd`]), so the pipeline cannot tell them apart.
//!
//! Where the API server refuses (the `WatchList` feature gate off, a server older than 1.27),
//! `kubernetes.initialList: auto` falls back to the paged LIST; [`Listing`] remembers it for
//! every watch of the resource.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime};

use futures::{Stream, StreamExt, TryStreamExt};
use kube::api::{DynamicObject, TypeMeta, WatchEvent, WatchParams};
use kube::core::Status as ApiStatus;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::list::ListProgress;
use super::stream::{Step, follow, outcome, selected, step};
use super::{Error, Item, Target, send};
use crate::budget;
use crate::change::ChangeKind;
use crate::config::InitialList;
use crate::status::{Status, count};

/// The server-side timeout of a streaming list, whose connection then goes on as the live watch:
/// longer than a watch's, since the list itself must fit in it, and a list paused by the
/// watch's byte budget (a slow broker) can take minutes. It is the API server's default
/// `--min-request-timeout`.
const STREAM_TIMEOUT_SECS: u32 = 1800;

/// One object in this many is measured for the byte count of the progress lines (each is
/// measured again for the watch's budget anyway).
const SAMPLE_EVERY: usize = 16;

/// How a list reads the resource, as `kube_event_bridge_lists_completed_total` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Method {
    /// A streaming list.
    Stream,
    /// A paged LIST.
    List,
}

impl Method {
    /// The label of the method: one of [`super::LIST_METHODS`].
    pub(super) fn label(self) -> &'static str {
        match self {
            Method::Stream => "stream",
            Method::List => "list",
        }
    }
}

/// How the watches of one resource (one per namespace) list it: the `kubernetes.initialList`
/// setting, and whether the API server refused a streaming list of it. Shared by those watches,
/// so that the fallback is logged once per resource, and every later list of the resource,
/// after lost history or in a watch started later, is a paged LIST at once.
#[derive(Debug)]
pub struct Listing {
    /// The resource, as logs name it (`v1/configmaps`).
    resource: String,
    setting: InitialList,
    /// The API server's reason, once it refused.
    refused: OnceLock<String>,
}

impl Listing {
    /// How the watches of `resource` list, per `setting`.
    pub fn new(resource: impl Into<String>, setting: InitialList) -> Self {
        Self {
            resource: resource.into(),
            setting,
            refused: OnceLock::new(),
        }
    }

    /// How the next list reads the resource.
    pub(super) fn method(&self) -> Method {
        method(self.setting, self.refused.get().is_some())
    }

    /// Whether a refused streaming list falls back to a paged LIST (with `auto`), rather than
    /// failing the watch (with `stream`).
    pub(super) fn falls_back(&self) -> bool {
        self.setting == InitialList::Auto
    }

    /// Records that the API server refused a streaming list of the resource, for `reason`, and
    /// counts the fallback in `status`; the first watch of the resource to see it logs it.
    pub(super) fn fall_back(&self, reason: &str, status: &Status) {
        status
            .list_fallbacks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.refused.set(reason.to_string()).is_ok() {
            warn!(
                resource = %self.resource,
                reason,
                "the API server refuses streaming lists: listing this resource in pages instead (kubernetes.initialList: auto)"
            );
        } else {
            debug!(reason, "streaming list refused again: listing in pages");
        }
    }
}

/// The method of a list per the setting, and whether the API server has refused a streaming
/// list of the resource.
fn method(setting: InitialList, refused: bool) -> Method {
    match setting {
        InitialList::List => Method::List,
        InitialList::Stream => Method::Stream,
        InitialList::Auto if refused => Method::List,
        InitialList::Auto => Method::Stream,
    }
}

/// Whether `status`, the API server's answer to a streaming list request, means it does not
/// serve streaming lists: a 400 or 422 naming the parameters. With the `WatchList` feature gate
/// off: 422 "sendInitialEvents is forbidden for watch unless the WatchList feature gate is
/// enabled"; a server older than 1.27 ignores `sendInitialEvents` but forbids
/// `resourceVersionMatch` on a watch. Anything else (403, 404, 429, 5xx) is an ordinary failure.
pub(super) fn is_refusal(status: &ApiStatus) -> bool {
    const NAMES: [&str; 3] = ["sendInitialEvents", "resourceVersionMatch", "WatchList"];
    let named = |text: &str| NAMES.iter().any(|n| text.contains(n));
    let causes = status.details.as_ref().is_some_and(|d| {
        d.causes
            .iter()
            .any(|c| named(&c.field) || named(&c.message))
    });
    matches!(status.code, 400 | 422) && (named(&status.message) || causes)
}

/// Lists through a watch, then follows the same connection as the live watch, keeping
/// `position` at the list's resourceVersion, then at the last one sent. The list is of a state
/// at least as new as `from` (`resourceVersionMatch=NotOlderThan`); without it, a consistent
/// read. Returns what a watch returns ([`super::stream::watch`]); [`Error::StreamRefused`] when
/// the API server does not serve streaming lists (nothing was sent then). An error the API
/// server answers before any object (a consistent read its watch cache could not serve in
/// time) is no list begun; a failure after the list began sends [`Item::ListAbort`], as a
/// failed paged LIST does.
pub(super) async fn stream_list(
    target: &Target,
    tx: &mpsc::Sender<Item>,
    status: &Status,
    position: &mut Option<String>,
    from: Option<&str>,
) -> Result<bool, Error> {
    let params = selected(WatchParams::streaming_lists(), target).timeout(STREAM_TIMEOUT_SECS);
    let opened = Instant::now();
    let from = from.unwrap_or_default();
    let stream = target
        .api
        .watch(&params, from)
        .await
        .map_err(|source| match source {
            kube::Error::Api(s) if is_refusal(&s) => Error::StreamRefused(kube::Error::Api(s)),
            source => Error::Request {
                reason: "watch",
                source,
            },
        })?;
    debug!(from, "streaming list");
    let mut stream = std::pin::pin!(stream.into_stream().peekable());
    if let Some(Ok(WatchEvent::Error(_))) = stream.as_mut().peek().await
        && let Some(answer) = stream.next().await
        && let Err(error) = step(answer, from)
    {
        return Err(error);
    }
    send(tx, Item::ListBegin).await?;
    let (rv, listed) = match objects(&mut stream, &target.types, tx, from).await {
        Ok(end) => end,
        Err(error) => {
            send(tx, Item::ListAbort).await?;
            return Err(error);
        }
    };
    send(tx, Item::ListEnd(rv.clone())).await?;
    count(&status.lists, Method::Stream.label());
    target.history.listed(&rv);
    // The connection goes on as the live watch, from the list's resourceVersion.
    debug!(rv, "watching");
    *position = Some(rv);
    let mut ended = follow(stream, &target.types, tx, position).await?;
    ended.delivered += listed + 1;
    outcome(ended, opened)
}

/// Sends a streaming list's objects as [`Item::Listed`] until the bookmark that ends them;
/// returns the list's resourceVersion and how many objects it sent. The connection ending first
/// is an [`Error::ListCut`].
async fn objects(
    stream: &mut (impl Stream<Item = Result<WatchEvent<DynamicObject>, kube::Error>> + Unpin),
    types: &TypeMeta,
    tx: &mpsc::Sender<Item>,
    from: &str,
) -> Result<(String, usize), Error> {
    let mut progress = ListProgress::new(Method::Stream.label(), Instant::now());
    let mut sampled = 0;
    let mut listed = 0;
    while let Some(event) = stream.next().await {
        let mut object = match step(event, from)? {
            // The API server sends none (KEP-3157): an object deleted while listed is absent.
            Step::Event(ChangeKind::Deleted, _, rv) => {
                warn!(rv, "a deletion among a streaming list's objects ignored");
                continue;
            }
            Step::Event(_, object, _) => object,
            Step::End(rv) => {
                progress.listed(&rv);
                return Ok((rv, listed));
            }
            Step::Progress(_) | Step::Skip => continue,
            Step::Dropped(error) => return Err(Error::ListCut(Some(error))),
        };
        if listed % SAMPLE_EVERY == 0 {
            sampled = budget::object_size(&object);
        }
        object.types.get_or_insert_with(|| types.clone());
        send(tx, Item::Listed(Box::new(object), SystemTime::now())).await?;
        listed += 1;
        progress.count(1, sampled);
    }
    Err(Error::ListCut(None))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::stream::{INITIAL_EVENTS_END, ends_initial_events};
    use super::*;
    use crate::watch::fake_api::{cm_event, status};
    use std::collections::BTreeMap;

    #[test]
    fn the_method_follows_the_setting_and_auto_lists_in_pages_once_refused() {
        for (setting, refused, expected) in [
            (InitialList::Auto, false, Method::Stream),
            (InitialList::Auto, true, Method::List),
            (InitialList::Stream, false, Method::Stream),
            (InitialList::Stream, true, Method::Stream),
            (InitialList::List, false, Method::List),
            (InitialList::List, true, Method::List),
        ] {
            assert_eq!(method(setting, refused), expected, "{setting:?} {refused}");
        }
    }

    #[test]
    fn the_first_refusal_of_a_resource_is_remembered_for_all_its_watches() {
        let listing = Listing::new("v1/configmaps", InitialList::Auto);
        assert!(listing.falls_back());
        assert_eq!(listing.method(), Method::Stream);
        let (a, b) = (Status::default(), Status::default());
        listing.fall_back("WatchList off", &a);
        listing.fall_back("again", &b);
        assert_eq!(listing.method(), Method::List);
        assert_eq!(
            listing.refused.get().map(String::as_str),
            Some("WatchList off")
        );
        for s in [&a, &b] {
            assert_eq!(
                s.list_fallbacks.load(std::sync::atomic::Ordering::Relaxed),
                1
            );
        }
        assert!(!Listing::new("v1/pods", InitialList::Stream).falls_back());
    }

    #[test]
    fn a_refusal_is_a_400_or_422_naming_the_streaming_list_parameters() {
        // kube-apiserver 1.35 with --feature-gates WatchList=false.
        let gate_off = status(json!({"code": 422, "reason": "Invalid",
            "message": "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
            "details": {"kind": "ListOptions", "group": "meta.k8s.io", "causes": [{"reason": "FieldValueForbidden",
                "message": "Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled", "field": "sendInitialEvents"}]}}));
        assert!(is_refusal(&gate_off));
        // A server older than 1.27.
        let old = status(json!({"code": 422, "reason": "Invalid",
            "message": "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch"}));
        assert!(is_refusal(&old));
        let by_cause = status(
            json!({"code": 400, "reason": "BadRequest", "message": "invalid request",
            "details": {"causes": [{"field": "sendInitialEvents", "message": "unsupported"}]}}),
        );
        assert!(is_refusal(&by_cause));
        for other in [
            json!({"code": 403, "reason": "Forbidden", "message": "configmaps is forbidden: User \"x\" cannot watch resource \"configmaps\""}),
            json!({"code": 404, "reason": "NotFound", "message": "the server could not find the requested resource"}),
            json!({"code": 429, "reason": "TooManyRequests", "message": "storage is (re)initializing"}),
            json!({"code": 500, "reason": "InternalError", "message": "sendInitialEvents: etcd timed out"}),
            json!({"code": 400, "reason": "BadRequest", "message": "unable to parse labelSelector"}),
        ] {
            assert!(!is_refusal(&status(other.clone())), "{other}");
        }
    }

    #[test]
    fn only_a_bookmark_annotated_true_ends_the_initial_events() {
        let annotations = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(ends_initial_events(&annotations(&[(
            INITIAL_EVENTS_END,
            "true"
        )])));
        assert!(!ends_initial_events(&annotations(&[(
            INITIAL_EVENTS_END,
            "false"
        )])));
        assert!(!ends_initial_events(&annotations(&[])));
        assert!(!ends_initial_events(&annotations(&[("other", "true")])));
    }

    fn bookmark(rv: &str, end: bool) -> WatchEvent<DynamicObject> {
        let annotations = if end {
            json!({INITIAL_EVENTS_END: "true"})
        } else {
            json!({})
        };
        serde_json::from_value(
            json!({"type": "BOOKMARK", "object": {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"resourceVersion": rv, "annotations": annotations}}}),
        )
        .unwrap()
    }

    /// What [`objects`] sends and returns for `events`.
    async fn list_of(
        events: Vec<Result<WatchEvent<DynamicObject>, kube::Error>>,
    ) -> (Vec<String>, Result<(String, usize), Error>) {
        let (tx, mut rx) = mpsc::channel(16);
        let mut stream = futures::stream::iter(events);
        let ended = objects(&mut stream, &TypeMeta::default(), &tx, "").await;
        drop(tx);
        let mut sent = Vec::new();
        while let Some(item) = rx.recv().await {
            match item {
                Item::Listed(o, _) => sent.push(o.metadata.name.unwrap()),
                other => panic!("{other:?}"),
            }
        }
        (sent, ended)
    }

    #[tokio::test]
    async fn the_objects_are_listed_until_the_end_bookmark_at_its_resource_version() {
        let (sent, ended) = list_of(vec![
            Ok(cm_event("ADDED", "a", "3")),
            Ok(bookmark("4", false)),
            Ok(cm_event("ADDED", "b", "5")),
            Ok(cm_event("DELETED", "c", "6")),
            Ok(bookmark("9", true)),
            Ok(cm_event("MODIFIED", "a", "10")),
        ])
        .await;
        assert_eq!(sent, ["a", "b"]);
        assert_eq!(ended.unwrap(), ("9".to_string(), 2));
    }

    #[tokio::test]
    async fn a_list_cut_short_or_failing_is_an_error_after_what_it_sent() {
        let (sent, ended) = list_of(vec![Ok(cm_event("ADDED", "a", "3"))]).await;
        assert_eq!(sent, ["a"]);
        let error = ended.unwrap_err();
        assert!(matches!(error, Error::ListCut(None)), "{error}");
        assert_eq!(error.reason(), "dropped");
        let reset = kube::Error::ReadEvents(std::io::Error::other("connection reset"));
        let (_, ended) = list_of(vec![Ok(cm_event("ADDED", "a", "3")), Err(reset)]).await;
        assert!(matches!(ended, Err(Error::ListCut(Some(_)))));
        let expired = status(json!({"code": 500, "reason": "InternalError", "message": "etcd"}));
        let (_, ended) = list_of(vec![Ok(WatchEvent::Error(expired))]).await;
        assert_eq!(ended.unwrap_err().reason(), "status");
    }
}
