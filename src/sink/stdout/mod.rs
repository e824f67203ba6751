//! Standard output: one structured CloudEvent per line, written and flushed before the event
//! counts as acknowledged. Checkpoints live in files (`checkpoint.directory`).

mod asyncapi;
mod settings;

use std::io::Write;
use std::time::Duration;

use futures::future::BoxFuture;

use super::{Error, Outcome, Pending, Result, Sink, ready};
use crate::encode::{Event, ResourceInfo};
use crate::template::Values;
pub use settings::{Stdout, StdoutConfig};

/// The stdout sink.
#[derive(Debug, Default)]
pub struct StdoutSink;

impl StdoutSink {
    /// A sink on the process's standard output.
    pub fn new() -> Self {
        Self
    }

    /// Writes `parts` as one line and flushes (the lock keeps lines of concurrent watches
    /// whole).
    fn write_line(parts: &[&[u8]]) -> std::io::Result<()> {
        let mut stdout = std::io::stdout().lock();
        for part in parts {
            stdout.write_all(part)?;
        }
        stdout.flush()
    }
}

impl Sink for StdoutSink {
    fn name(&self) -> &'static str {
        "stdout"
    }

    fn send(&self, event: Event) -> BoxFuture<'_, Pending> {
        let mut line = event.to_structured_json();
        line.push(b'\n');
        let outcome = match Self::write_line(&[&line]) {
            Ok(()) => Outcome::Acked,
            Err(e) => Outcome::Retry {
                error: e.to_string(),
            },
        };
        Box::pin(std::future::ready(ready(event, outcome)))
    }

    fn send_raw<'a>(
        &'a self,
        destination: &'a str,
        _key: &'a str,
        payload: Vec<u8>,
    ) -> BoxFuture<'a, Result<()>> {
        let written = Self::write_line(&[&payload, b"\n"]).map_err(|e| Error::Publish {
            destination: destination.to_string(),
            source: Box::new(e),
        });
        Box::pin(std::future::ready(written))
    }

    /// Everything goes to standard output.
    fn watch_destination(&self, _info: &ResourceInfo, _values: &Values<'_>) -> Option<String> {
        Some("stdout".to_string())
    }

    /// Nothing is buffered.
    fn flush(&self, _timeout: Duration) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
}
