//! The recorder sink: every event is kept, as its structured JSON, under its channel in this
//! process's memory, and acknowledged at once.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use kube_event_bridge::encode::Event;
use kube_event_bridge::sink::{Delivered, Outcome, Pending, Result, Sink};

/// The events of every channel, in the order they were sent.
static CHANNELS: LazyLock<Mutex<HashMap<String, Vec<Vec<u8>>>>> = LazyLock::new(Mutex::default);

/// The events recorded under `channel` so far.
pub fn recorded(channel: &str) -> Vec<Vec<u8>> {
    let channels = CHANNELS.lock().expect("recorder lock");
    channels.get(channel).cloned().unwrap_or_default()
}

/// A sink keeping its events under one channel.
#[derive(Debug)]
pub struct RecorderSink {
    channel: String,
}

impl RecorderSink {
    /// A sink recording under `channel`.
    pub fn new(channel: &str) -> Self {
        Self {
            channel: channel.to_string(),
        }
    }

    fn record(&self, line: Vec<u8>) {
        let mut channels = CHANNELS.lock().expect("recorder lock");
        channels.entry(self.channel.clone()).or_default().push(line);
    }
}

impl Sink for RecorderSink {
    fn name(&self) -> &'static str {
        "recorder"
    }

    fn send(&self, event: Event) -> BoxFuture<'_, Pending> {
        self.record(event.to_structured_json());
        let delivered = Delivered {
            event,
            outcome: Outcome::Acked,
        };
        let pending: Pending = Box::pin(std::future::ready(delivered));
        Box::pin(std::future::ready(pending))
    }

    /// Heartbeats are not events of the channel: kept apart, under `<channel>.<destination>`.
    fn send_raw<'a>(
        &'a self,
        destination: &'a str,
        _key: &'a str,
        payload: Vec<u8>,
    ) -> BoxFuture<'a, Result<()>> {
        let mut channels = CHANNELS.lock().expect("recorder lock");
        let key = format!("{}.{destination}", self.channel);
        channels.entry(key).or_default().push(payload);
        Box::pin(std::future::ready(Ok(())))
    }

    /// Nothing is buffered.
    fn flush(&self, _timeout: Duration) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
}
