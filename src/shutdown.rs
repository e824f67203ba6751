//! Shutdown signals: the first SIGTERM or SIGINT asks for a clean shutdown (stop the watches,
//! drain what is in flight, save the last checkpoints); a second one exits at once.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// Errors of installing the signal handlers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A signal handler could not be installed.
    #[error("cannot listen for signals")]
    Signals(#[source] std::io::Error),
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The exit code of the second signal, which does not wait for the drain.
const ABORT_EXIT_CODE: i32 = 130;

/// Installs the SIGTERM and SIGINT handlers. The returned token is cancelled by the first
/// signal (shut down cleanly); a second signal exits at once without draining.
pub fn listen() -> Result<CancellationToken> {
    let mut term = signal(SignalKind::terminate()).map_err(Error::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(Error::Signals)?;
    let stop = CancellationToken::new();
    let first = stop.clone();
    tokio::spawn(async move {
        for second in [false, true] {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            if second {
                error!(signal = name, "second signal: exiting without draining");
                std::process::exit(ABORT_EXIT_CODE);
            }
            info!(signal = name, "signal received");
            first.cancel();
        }
    });
    Ok(stop)
}
