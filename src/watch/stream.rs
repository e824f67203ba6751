//! The live watch: a watch from a resourceVersion, each of its events classified ([`step`]) and
//! sent down the pipeline ([`follow`]) until the stream ends or fails.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use futures::{Stream, StreamExt, TryStreamExt};
use kube::api::{DynamicObject, ObjectMeta, TypeMeta, WatchEvent, WatchParams};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::history::spared_gone;
use super::{Error, Item, Target, is_too_large, send};
use crate::change::ChangeKind;
use crate::status::Status;

/// A watch that stayed open this long, or delivered anything, was healthy: if it then drops, it
/// resumes at once. One that ends sooner with nothing delivered resumes with backoff.
const HEALTHY_WATCH: Duration = Duration::from_secs(10);

/// Watches from `rv` until the stream ends (server timeout, dropped connection) or fails,
/// keeping `position` at the last resourceVersion sent. Returns whether the API server's
/// position is suspect (the connection dropped, or nothing arrived) and must be verified before
/// the next watch; a watch that ended at once with nothing delivered is an
/// [`Error::Unproductive`].
pub(super) async fn watch(
    target: &Target,
    tx: &mpsc::Sender<Item>,
    status: &Status,
    rv: &str,
    position: &mut Option<String>,
) -> Result<bool, Error> {
    let params = selected(WatchParams::default(), target).timeout(target.watch_timeout_secs);
    let opened = Instant::now();
    // A request still waiting for the client-side throttle is withdrawn (never sent) once a
    // sibling watch finds `rv` gone: it could only be answered 410.
    let answer = tokio::select! {
        answer = target.api.watch(&params, rv) => answer,
        () = target.history.gone(rv) => return Err(spared_gone(rv, status)),
    };
    let stream = answer.map_err(|source| match source {
        kube::Error::Api(s) if s.code == 410 || is_too_large(&s) => Error::from_status(*s, rv),
        source => Error::Request {
            reason: "watch",
            source,
        },
    })?;
    debug!(rv, "watching");
    let ended = follow(stream.into_stream(), &target.types, tx, position).await?;
    outcome(ended, opened)
}

/// `params` with the target's label and field selectors.
pub(super) fn selected(mut params: WatchParams, target: &Target) -> WatchParams {
    if let Some(l) = &target.label_selector {
        params = params.labels(l);
    }
    if let Some(f) = &target.field_selector {
        params = params.fields(f);
    }
    params
}

/// What a watch opened at `opened` that `ended` returns: whether the API server's position is
/// suspect, or [`Error::Unproductive`] when it ended at once with nothing delivered.
pub(super) fn outcome(ended: Ended, opened: Instant) -> Result<bool, Error> {
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
pub(super) struct Ended {
    /// Items sent down the pipeline.
    pub(super) delivered: usize,
    /// The connection error that ended it, `None` if the server ended it.
    pub(super) dropped: Option<kube::Error>,
}

/// Sends the events of one watch stream down the pipeline until it ends.
pub(super) async fn follow(
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
                Item::Event(kind, Box::new(object), SystemTime::now())
            }
            // An end of initial events is only expected after a streaming list's objects.
            Step::Progress(rv) | Step::End(rv) => {
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
pub(super) enum Step {
    /// Send this change; the watch is then at this resourceVersion.
    Event(ChangeKind, DynamicObject, String),
    /// Nothing changed up to this resourceVersion (a bookmark).
    Progress(String),
    /// The bookmark that ends a streaming list's objects, at the list's resourceVersion.
    End(String),
    /// Nothing to do (an object without identity, logged).
    Skip,
    /// The connection dropped: resume from the last resourceVersion.
    Dropped(kube::Error),
}

/// Classifies one item of a watch stream, the watch being at `position`: kube-client yields a
/// line it cannot decode as `SerdeError`, an error status sent instead of an event as `Api`,
/// and a broken connection as `ReadEvents` (or another transport error).
pub(super) fn step(
    event: Result<WatchEvent<DynamicObject>, kube::Error>,
    position: &str,
) -> Result<Step, Error> {
    let (kind, object) = match event {
        Ok(WatchEvent::Added(o)) => (ChangeKind::Added, o),
        Ok(WatchEvent::Modified(o)) => (ChangeKind::Modified, o),
        Ok(WatchEvent::Deleted(o)) => (ChangeKind::Deleted, o),
        Ok(WatchEvent::Bookmark(b)) if ends_initial_events(&b.metadata.annotations) => {
            return Ok(Step::End(b.metadata.resource_version));
        }
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

/// The annotation of the bookmark that ends a streaming list's objects.
pub(super) const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Whether a bookmark with `annotations` ends a streaming list's objects.
pub(super) fn ends_initial_events(annotations: &BTreeMap<String, String>) -> bool {
    annotations
        .get(INITIAL_EVENTS_END)
        .is_some_and(|v| v == "true")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::watch::fake_api::{cm_event, status, too_large_status};

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
            Err(Error::Gone { rv, .. }) => assert_eq!(rv, "8"),
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
            // Asked for no resourceVersion (a consistent list): the watch cache's lag.
            let lagging = step(Ok(WatchEvent::Error(s.clone())), "");
            assert!(matches!(lagging, Err(Error::Lagging { .. })), "{lagging:?}");
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
}
