//! Shutdown signals: the first SIGTERM or SIGINT asks for a clean shutdown (stop the watches,
//! drain what is in flight, save the last checkpoints); a second one abandons the drain, and
//! `main` returns at once with exit code [`ABORT_EXIT_CODE`] (as kubert's `Shutdown::signaled`
//! does), instead of a task ending the process under everyone's feet.

use std::convert::Infallible;
use std::future::Future;

use futures::{Stream, StreamExt};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// Errors of the signal handlers and of the work they stop.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A signal handler could not be installed.
    #[error("cannot listen for signals")]
    Signals(#[source] std::io::Error),
    /// A second signal came before the drain finished (logged when it came).
    #[error("aborted by a second signal")]
    Aborted,
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The exit code after a second signal, whichever it was: 128 + SIGINT, what shells report for
/// an interrupted command.
pub const ABORT_EXIT_CODE: u8 = 130;

/// Where the process is, as far as signals go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No signal yet.
    Running,
    /// One signal: draining.
    Draining,
    /// Two signals: the drain is abandoned.
    Aborted,
}

/// What a signal does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    /// Start the clean shutdown.
    Drain,
    /// Abandon it.
    Abort,
    /// Nothing more to do.
    None,
}

/// The state after one more signal, and what that signal does.
fn step(state: State) -> (State, Effect) {
    match state {
        State::Running => (State::Draining, Effect::Drain),
        State::Draining => (State::Aborted, Effect::Abort),
        State::Aborted => (State::Aborted, Effect::None),
    }
}

/// The signals' verdicts, handed to the rest of the process.
#[derive(Debug, Clone, Default)]
pub struct Signals {
    /// Cancelled by the first signal.
    drain: CancellationToken,
    /// Cancelled by the second signal.
    abort: CancellationToken,
}

impl Signals {
    /// Cancelled by the first signal: stop the watches, drain, save the last checkpoints.
    pub fn drain(&self) -> CancellationToken {
        self.drain.clone()
    }

    /// Runs `work` (which drains when [`Signals::drain`] is cancelled) while following
    /// `signals` (their names) through [`step`], to its end, unless a second signal abandons it
    /// first: then [`Error::Aborted`], and `work` is dropped. Nothing outlives the call.
    async fn run<T>(
        &self,
        signals: impl Stream<Item = &'static str>,
        work: impl Future<Output = T>,
    ) -> Result<T> {
        let follow = async {
            self.follow(signals).await;
            std::future::pending::<Infallible>().await
        };
        tokio::select! {
            biased;
            () = self.abort.cancelled() => Err(Error::Aborted),
            done = work => Ok(done),
            never = follow => match never {},
        }
    }

    /// Follows `signals` through [`step`] until the second one (or their end).
    async fn follow(&self, signals: impl Stream<Item = &'static str>) {
        let mut signals = std::pin::pin!(signals);
        let mut state = State::Running;
        while state != State::Aborted
            && let Some(signal) = signals.next().await
        {
            let (next, effect) = step(state);
            state = next;
            match effect {
                Effect::Drain => {
                    info!(signal, "signal received");
                    self.drain.cancel();
                }
                Effect::Abort => {
                    error!(signal, "second signal: exiting without draining");
                    self.abort.cancel();
                }
                Effect::None => {}
            }
        }
    }
}

/// Installs the SIGTERM and SIGINT handlers, then runs `work` with the token the first signal
/// cancels (stop the watches, drain, save the last checkpoints) to its end, unless a second
/// signal comes first: then [`Error::Aborted`] at once, and `work` is dropped. Signals are
/// followed within this call, on no task of their own.
pub async fn until_aborted<T, F>(work: impl FnOnce(CancellationToken) -> F) -> Result<T>
where
    F: Future<Output = T>,
{
    let term = signal(SignalKind::terminate()).map_err(Error::Signals)?;
    let int = signal(SignalKind::interrupt()).map_err(Error::Signals)?;
    let names = futures::stream::unfold((term, int), |(mut term, mut int)| async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        Some((name, (term, int)))
    });
    let signals = Signals::default();
    signals.run(names, work(signals.drain())).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_signal_drains_the_second_aborts() {
        for (state, next, effect) in [
            (State::Running, State::Draining, Effect::Drain),
            (State::Draining, State::Aborted, Effect::Abort),
            (State::Aborted, State::Aborted, Effect::None),
        ] {
            assert_eq!(step(state), (next, effect), "{state:?}");
        }
    }

    #[tokio::test]
    async fn one_signal_drains_and_the_work_ends_normally() {
        let signals = Signals::default();
        // The work sees the drain and finishes: its own result comes back.
        let drain = signals.drain();
        let ran = signals
            .run(futures::stream::iter(["SIGTERM"]), async move {
                drain.cancelled().await;
                "drained"
            })
            .await;
        assert!(matches!(ran, Ok("drained")), "{ran:?}");
    }

    #[tokio::test]
    async fn a_second_signal_abandons_the_drain() {
        let signals = Signals::default();
        let names = futures::stream::iter(["SIGTERM", "SIGINT", "SIGTERM"]);
        let ran = signals.run(names, std::future::pending::<()>()).await;
        assert!(matches!(ran, Err(Error::Aborted)), "{ran:?}");
        assert!(signals.drain().is_cancelled());
    }

    #[tokio::test]
    async fn without_signals_the_work_runs_to_its_end() {
        let signals = Signals::default();
        let ran = signals.run(futures::stream::empty(), async { 7 }).await;
        assert!(matches!(ran, Ok(7)));
        assert!(!signals.drain().is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn signals_that_end_leave_the_work_running() {
        let signals = Signals::default();
        let work = async {
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
            "done"
        };
        let ran = signals.run(futures::stream::iter(["SIGTERM"]), work).await;
        assert!(matches!(ran, Ok("done")), "{ran:?}");
    }
}
