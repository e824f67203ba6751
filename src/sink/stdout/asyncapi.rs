//! What the AsyncAPI document says of standard output: JSON lines, no headers, no server.

use serde_json::{Map, Value};

use super::Stdout;
use crate::config::ContentMode;
use crate::encode::Event;
use crate::sink::describe::{Attribute, Describe, Headers};

impl Describe for Stdout {
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
        "JSON lines on the bridge's standard output (one structured CloudEvent per line, \
         flushed before the event counts as delivered; logs go to standard error)"
    }

    fn parameter_encoding(&self) -> &'static str {
        "as it is"
    }

    fn delivery(&self) -> &'static str {
        "Each line is written and flushed before the event counts as delivered."
    }

    fn servers(&self, _: &[String]) -> Option<(Value, Map<String, Value>)> {
        None
    }
}
