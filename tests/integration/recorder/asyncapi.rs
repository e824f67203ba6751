//! What the AsyncAPI document says of the recorder sink: one structured event per entry, no
//! headers, no server.

use kube_event_bridge::config::ContentMode;
use kube_event_bridge::encode::Event;
use kube_event_bridge::sink::describe::{Attribute, Describe, Headers};
use serde_json::{Map, Value};

use super::settings::Recorder;

impl Describe for Recorder {
    fn spec_url(&self) -> &'static str {
        "https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/formats/json-format.md"
    }

    fn content_mode(&self) -> ContentMode {
        ContentMode::Structured
    }

    fn bare(&self) -> bool {
        true
    }

    fn headers(&self, _: &[Attribute], _: &Event) -> Option<Headers> {
        None
    }

    fn channel_kind(&self) -> &'static str {
        "Entries of an in-memory recorder channel"
    }

    fn parameter_encoding(&self) -> &'static str {
        "as it is"
    }

    fn delivery(&self) -> &'static str {
        "Each event is kept in memory before it counts as delivered."
    }

    fn servers(&self, _: &[String]) -> Option<(Value, Map<String, Value>)> {
        None
    }
}
