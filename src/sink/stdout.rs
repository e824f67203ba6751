//! Standard output: one structured CloudEvent per line, written and flushed before the event
//! counts as acknowledged.

use std::io::Write;

use super::{Outcome, Pending, ready};
use crate::encode::Event;

/// The stdout sink.
#[derive(Debug, Default)]
pub struct StdoutSink;

impl StdoutSink {
    /// A sink on the process's standard output.
    pub fn new() -> Self {
        Self
    }

    /// Writes one line (the lock keeps lines of concurrent watches whole).
    pub fn send(&self, event: Event) -> Pending {
        let mut line = event.to_structured_json();
        line.push(b'\n');
        let mut stdout = std::io::stdout().lock();
        let outcome = match stdout.write_all(&line).and_then(|()| stdout.flush()) {
            Ok(()) => Outcome::Acked,
            Err(e) => Outcome::Retry {
                error: e.to_string(),
            },
        };
        ready(event, outcome)
    }

    /// Nothing is buffered.
    pub fn flush(&self) {}
}
