//! What the API server is known to hold of one resource's history, learned by any of the
//! resource's watches (one per namespace) and shared by them all, so that a thousand watches
//! resuming together (after the API server restarted, or from their checkpoints) do not each ask
//! what one of them has already found out.
//!
//! - **Gone:** a watch answered 410 Gone from resourceVersion `g` means every resourceVersion of
//!   the resource up to `g` is gone too: a watch cache's window and etcd's compaction only move
//!   forward. A sibling resuming from such a resourceVersion relists at once, and one whose watch
//!   request still waits for the client-side throttle withdraws it (the request is never sent).
//! - **Reached:** one probe of the API server's current resourceVersion (`super::probe`) at a
//!   time, whose answer stands for [`REACHED_FRESH`]: a sibling resuming from a resourceVersion
//!   it covers needs no probe of its own.
//!
//! resourceVersions are compared as integers (comparable resourceVersions, KEP-5504, stable in
//! Kubernetes 1.35, within one resource); one that is not an integer is never found gone nor
//! reached, so its watch asks for itself. The API server's resourceVersions going backwards
//! (etcd restored from a backup: a resourceVersion found ahead of it, or a list older than what
//! was found gone) forgets everything learned.
//!
//! Behind a load balancer over several API servers, each with a watch cache of its own, one
//! server's 410 can make a sibling relist where another server would have let it resume. The
//! relist repairs every difference (as after any 410); what is lost is the intermediate versions
//! of objects that changed more than once meanwhile, which the sibling's own request, sent to the
//! first server, would have lost as well.

use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::debug;

use super::Error;
use crate::status::{Status, count};

/// How long a probe's answer stands for the resource's other watches: about as long as a watch
/// resuming from a checkpoint waits between its own probe and its watch request when the
/// client-side throttle is busy.
pub(super) const REACHED_FRESH: Duration = Duration::from_secs(10);

/// One resource's known history: see the module's documentation.
#[derive(Debug)]
pub struct History {
    /// The newest resourceVersion the API server answered 410 Gone for.
    gone: watch::Sender<Option<u64>>,
    /// The API server's current resourceVersion as a probe last found it, and when.
    reached: Mutex<Option<Probed>>,
    /// Held while a watch of the resource probes: one probe at a time.
    probing: tokio::sync::Mutex<()>,
}

/// A probe's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Probed {
    current: u64,
    at: Instant,
}

impl Default for History {
    fn default() -> Self {
        Self {
            gone: watch::Sender::new(None),
            reached: Mutex::new(None),
            probing: tokio::sync::Mutex::new(()),
        }
    }
}

/// The error of a watch from `rv`, which another watch of the resource found gone, counting the
/// request it spared in `status`.
pub(super) fn spared_gone(rv: &str, status: &Status) -> Error {
    count(&status.spared, "gone");
    Error::Gone {
        rv: rv.to_string(),
        kept_from: None,
    }
}

/// The resourceVersion as an integer, if it is one.
fn number(rv: &str) -> Option<u64> {
    rv.parse().ok()
}

/// Whether `rv` is gone, `gone` being the newest resourceVersion found gone.
fn covers(gone: Option<u64>, rv: &str) -> bool {
    matches!((gone, number(rv)), (Some(g), Some(v)) if v <= g)
}

/// Whether `probed` shows the API server has reached `wanted` at `now`.
fn reaches(probed: Option<Probed>, wanted: u64, now: Instant) -> bool {
    probed
        .is_some_and(|p| wanted <= p.current && now.saturating_duration_since(p.at) < REACHED_FRESH)
}

impl History {
    /// Whether the API server is known to have lost `rv`.
    pub(super) fn is_gone(&self, rv: &str) -> bool {
        covers(*self.gone.borrow(), rv)
    }

    /// Completes once the API server is known to have lost `rv`; never for a resourceVersion
    /// that is not an integer.
    pub(super) async fn gone(&self, rv: &str) {
        let mut found = self.gone.subscribe();
        if found.wait_for(|gone| covers(*gone, rv)).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The API server answered 410 Gone for `rv`, saying it still serves resourceVersions from
    /// `kept_from` on, if it said.
    pub(super) fn lost(&self, rv: &str, kept_from: Option<u64>) {
        let before_kept = kept_from.and_then(|k| k.checked_sub(1));
        let Some(v) = number(rv).max(before_kept) else {
            return;
        };
        self.gone.send_if_modified(|gone| {
            let newer = gone.is_none_or(|g| v > g);
            if newer {
                *gone = Some(v);
            }
            newer
        });
    }

    /// A list of the resource completed at `rv`: older than what was found gone, the API
    /// server's resourceVersions went backwards, and what was learned is forgotten.
    pub(super) fn listed(&self, rv: &str) {
        if self.is_gone(rv) {
            debug!(
                rv,
                "a list older than a resourceVersion found gone: forgetting the resource's history"
            );
            self.forget();
        }
    }

    /// A watch found a resourceVersion ahead of the API server (etcd restored from a backup):
    /// what was learned is forgotten.
    pub(super) fn ahead(&self) {
        self.forget();
    }

    fn forget(&self) {
        self.gone.send_replace(None);
        *self.reached.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Checks that the API server still holds `rv` and has reached it, before a watch resumes
    /// from it: [`Error::Gone`] where a sibling found it gone; else through `probe` (the API
    /// server's current resourceVersion, `None` when it is not an integer), one at a time, unless
    /// a fresh answer of another watch's covers `rv`. A resourceVersion that is not an integer is
    /// not checked. Spared requests are counted in `status`.
    pub(super) async fn verify<P, F>(
        &self,
        rv: &str,
        status: &Status,
        probe: P,
    ) -> Result<(), Error>
    where
        P: FnOnce() -> F,
        F: Future<Output = Result<Option<u64>, Error>>,
    {
        let Some(wanted) = number(rv) else {
            return Ok(());
        };
        let gone = || spared_gone(rv, status);
        if self.is_gone(rv) {
            return Err(gone());
        }
        let _turn = tokio::select! {
            turn = self.probing.lock() => turn,
            () = self.gone(rv) => return Err(gone()),
        };
        let known = *self.reached.lock().unwrap_or_else(PoisonError::into_inner);
        if reaches(known, wanted, Instant::now()) {
            count(&status.spared, "probe");
            return Ok(());
        }
        let current = tokio::select! {
            current = probe() => current?,
            () = self.gone(rv) => return Err(gone()),
        };
        let Some(current) = current else {
            return Ok(());
        };
        *self.reached.lock().unwrap_or_else(PoisonError::into_inner) = Some(Probed {
            current,
            at: Instant::now(),
        });
        if current < wanted {
            self.ahead();
            return Err(Error::TooLarge {
                rv: rv.to_string(),
                message: format!("Too large resource version: {wanted}, current: {current}"),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn a_resource_version_is_gone_up_to_the_newest_found_gone() {
        let history = History::default();
        assert!(!history.is_gone("5"));
        history.lost("10", None);
        history.lost("7", None);
        assert!(history.is_gone("10") && history.is_gone("3") && !history.is_gone("11"));
        assert!(!history.is_gone("opaque"));
        history.lost("opaque", None);
        assert!(
            history.is_gone("10"),
            "an opaque resourceVersion changes nothing"
        );
    }

    #[test]
    fn what_the_api_server_still_serves_bounds_what_is_gone() {
        let history = History::default();
        history.lost("10", Some(90));
        assert!(history.is_gone("89") && !history.is_gone("90"));
        history.lost("95", Some(90));
        assert!(
            history.is_gone("95"),
            "the resourceVersion asked for is gone in any case"
        );
        let other = History::default();
        other.lost("opaque", Some(5));
        assert!(
            other.is_gone("4") && !other.is_gone("5"),
            "said by the API server alone"
        );
    }

    #[test]
    fn a_list_older_than_what_was_found_gone_forgets_it() {
        let history = History::default();
        history.lost("100", None);
        history.listed("150");
        assert!(
            history.is_gone("100"),
            "a newer list is what a relist gives"
        );
        history.listed("40");
        assert!(!history.is_gone("30"), "resourceVersions went backwards");
    }

    #[test]
    fn a_probes_answer_covers_what_it_reached_while_fresh() {
        let at = Instant::now();
        let probed = Some(Probed { current: 50, at });
        assert!(reaches(probed, 50, at) && reaches(probed, 7, at + Duration::from_secs(9)));
        assert!(!reaches(probed, 51, at));
        assert!(!reaches(probed, 7, at + REACHED_FRESH));
        assert!(!reaches(None, 7, at));
    }

    fn spared(status: &Status, reason: &str) -> u64 {
        status
            .spared
            .lock()
            .unwrap()
            .get(reason)
            .copied()
            .unwrap_or(0)
    }

    /// A probe that counts its calls and answers `current`.
    fn counted(
        calls: &Arc<AtomicUsize>,
        current: Option<u64>,
    ) -> impl FnOnce() -> std::future::Ready<Result<Option<u64>, Error>> {
        let calls = calls.clone();
        move || {
            calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(current))
        }
    }

    #[tokio::test]
    async fn one_probe_answers_for_the_watches_it_covers() {
        let (history, status) = (History::default(), Status::default());
        let calls = Arc::new(AtomicUsize::new(0));
        for rv in ["40", "50", "12"] {
            history
                .verify(rv, &status, counted(&calls, Some(50)))
                .await
                .unwrap();
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(spared(&status, "probe"), 2);
        let ahead = history
            .verify("60", &status, counted(&calls, Some(55)))
            .await;
        assert!(matches!(ahead, Err(Error::TooLarge { .. })), "{ahead:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 2, "60 is not covered: probed");
        history
            .verify("abc", &status, counted(&calls, Some(55)))
            .await
            .unwrap();
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "an opaque resourceVersion is trusted"
        );
    }

    #[tokio::test]
    async fn a_resource_version_found_ahead_forgets_what_was_found_gone() {
        let (history, status) = (History::default(), Status::default());
        history.lost("30", None);
        let calls = Arc::new(AtomicUsize::new(0));
        let ahead = history
            .verify("40", &status, counted(&calls, Some(35)))
            .await;
        assert!(matches!(ahead, Err(Error::TooLarge { .. })), "{ahead:?}");
        assert!(!history.is_gone("30"));
        history
            .verify("20", &status, counted(&calls, Some(35)))
            .await
            .unwrap();
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "the answer ahead was forgotten too"
        );
    }

    #[tokio::test]
    async fn a_resource_version_found_gone_needs_no_probe() {
        let (history, status) = (History::default(), Status::default());
        history.lost("30", None);
        let calls = Arc::new(AtomicUsize::new(0));
        let answer = history
            .verify("30", &status, counted(&calls, Some(99)))
            .await;
        assert!(matches!(answer, Err(Error::Gone { rv, .. }) if rv == "30"));
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        assert_eq!(spared(&status, "gone"), 1);
    }

    #[tokio::test]
    async fn a_watch_waiting_to_probe_relists_once_its_resource_version_is_found_gone() {
        let history = Arc::new(History::default());
        let turn = history.probing.lock().await;
        let waiting = tokio::spawn({
            let history = history.clone();
            async move {
                history
                    .verify("20", &Status::default(), std::future::pending)
                    .await
            }
        });
        tokio::task::yield_now().await;
        history.lost("25", None);
        let answer = waiting.await.unwrap();
        assert!(
            matches!(&answer, Err(Error::Gone { rv, .. }) if rv == "20"),
            "{answer:?}"
        );
        drop(turn);
    }

    #[tokio::test]
    async fn gone_completes_when_a_sibling_finds_the_resource_version_gone() {
        let history = Arc::new(History::default());
        let waiter = tokio::spawn({
            let history = history.clone();
            async move { history.gone("20").await }
        });
        history.lost("15", None);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        history.lost("20", None);
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("told")
            .unwrap();
    }
}
