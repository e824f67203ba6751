//! The tasks a run of the bridge spawns beside its watches and pipelines (which the supervisor
//! owns in a `JoinSet`): the admin server and its connections, the leader's renewals, the shard
//! coordinator and its Lease watch, the CRD and namespace followers, the queue budgets'
//! forwarders, the allocator's cache flushes. Every one is tracked: [`Tasks::close`] stops those
//! still running and waits until each has ended, so that none outlives the run that started it
//! (a test, or one of several bridges in a process), and a task that panics is logged by name.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, warn};

/// The tracked tasks of one run (cheap to clone: every clone spawns into the same set).
#[derive(Debug, Clone, Default)]
pub struct Tasks {
    tracker: TaskTracker,
    closing: CancellationToken,
}

impl Tasks {
    /// Spawns `work`, named `name` in the log. It runs until it ends by itself, or until
    /// [`Tasks::close`] stops it: then its handle gives `None`, as it does when it panicked.
    pub fn spawn<F>(&self, name: &'static str, work: F) -> JoinHandle<Option<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let closing = self.closing.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                biased;
                () = closing.cancelled() => {
                    debug!(task = name, "task stopped: its run is closing");
                    None
                }
                done = AssertUnwindSafe(work).catch_unwind() => match done {
                    Ok(done) => Some(done),
                    Err(panic) => {
                        error!(task = name, panic = panic_message(&*panic), "task panicked");
                        None
                    }
                },
            }
        })
    }

    /// Spawns nothing more, stops every task still running at its next await, and waits up to
    /// `within` for each to end. Returns whether all did (a task blocking its thread would not).
    pub async fn close(&self, within: Duration) -> bool {
        self.tracker.close();
        self.closing.cancel();
        let ended = tokio::time::timeout(within, self.tracker.wait())
            .await
            .is_ok();
        if !ended {
            warn!(
                tasks = self.tracker.len(),
                within_ms = within.as_millis() as u64,
                "tasks still running after the run closed"
            );
        }
        ended
    }

    /// How many tasks are running.
    pub fn len(&self) -> usize {
        self.tracker.len()
    }

    /// Whether no task is running.
    pub fn is_empty(&self) -> bool {
        self.tracker.is_empty()
    }
}

/// The message a panic was raised with, when it is text.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not text)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_ends_by_itself_gives_its_output() {
        let tasks = Tasks::default();
        assert_eq!(tasks.spawn("seven", async { 7 }).await.unwrap(), Some(7));
        assert!(tasks.close(Duration::from_secs(1)).await);
    }

    #[tokio::test]
    async fn closing_stops_the_tasks_that_would_run_for_ever_and_waits_for_them() {
        let tasks = Tasks::default();
        let (dropped_tx, dropped) = tokio::sync::oneshot::channel::<()>();
        let forever = tasks.spawn("forever", async move {
            let _dropped_when_stopped = dropped_tx;
            std::future::pending::<()>().await
        });
        tokio::task::yield_now().await;
        assert_eq!(tasks.len(), 1);
        assert!(tasks.close(Duration::from_secs(1)).await);
        assert!(tasks.is_empty());
        // The work was dropped (its sender with it), and the handle says it did not finish.
        assert!(dropped.await.is_err());
        assert_eq!(forever.await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_task_spawned_after_closing_is_stopped_at_once() {
        let tasks = Tasks::default();
        assert!(tasks.close(Duration::from_secs(1)).await);
        let late = tasks.spawn("late", std::future::pending::<()>());
        assert_eq!(late.await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_panicking_task_is_logged_by_name_and_ends_without_output() {
        let tasks = Tasks::default();
        let panicked = tasks.spawn("doomed", async { panic!("boom") });
        assert_eq!(panicked.await.unwrap(), None::<()>);
        assert!(tasks.close(Duration::from_secs(1)).await);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn closing_reports_a_task_that_does_not_end_in_time() {
        let tasks = Tasks::default();
        let (started_tx, started) = tokio::sync::oneshot::channel();
        // A task blocking its thread never reaches its next await while it blocks.
        tasks.spawn("stuck", async move {
            let _ = started_tx.send(());
            std::thread::sleep(Duration::from_millis(500));
        });
        started.await.unwrap();
        assert!(!tasks.close(Duration::from_millis(20)).await);
        assert_eq!(tasks.len(), 1);
        assert!(tasks.close(Duration::from_secs(10)).await);
    }

    #[test]
    fn panic_messages_are_read_from_str_and_string() {
        assert_eq!(panic_message(&"static"), "static");
        assert_eq!(panic_message(&String::from("owned")), "owned");
        assert_eq!(panic_message(&7u8), "(not text)");
    }
}
