//! Reading back what the sinks publish: a message in binary or structured mode decoded into a
//! `cloudevents::Event`, for `tail` and for the tests' consumers.

use std::collections::BTreeMap;

use cloudevents::{Event, EventBuilder, EventBuilderV10};
use percent_encoding::percent_decode_str;

use crate::attribute;

/// A message that is not a CloudEvent, and why.
#[derive(Debug, thiserror::Error)]
#[error("not a CloudEvent: {0}")]
pub struct NotCloudEvent(pub String);

/// Decodes a binary-mode or structured-mode message. `headers` are (name, value) pairs;
/// `prefix` is `ce_` (Kafka) or `ce-` (NATS, whose values are percent-encoded).
pub fn decode<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    body: &[u8],
    prefix: &str,
) -> Result<Event, NotCloudEvent> {
    let mut attrs = BTreeMap::new();
    let mut content_type = None;
    for (name, value) in headers {
        if name.eq_ignore_ascii_case("content-type") {
            content_type = Some(value.to_string());
        } else if let Some(attr) = name.strip_prefix(prefix) {
            let value = if prefix == "ce-" {
                percent_decode_str(value).decode_utf8_lossy().into_owned()
            } else {
                value.to_string()
            };
            attrs.insert(attr.to_ascii_lowercase(), value);
        }
    }
    if content_type
        .as_deref()
        .is_some_and(|c| c.starts_with("application/cloudevents+json"))
    {
        return serde_json::from_slice(body).map_err(|e| NotCloudEvent(e.to_string()));
    }
    let mut take = |k: &str| {
        attrs
            .remove(k)
            .ok_or_else(|| NotCloudEvent(format!("missing attribute {k}")))
    };
    let mut b = EventBuilderV10::new()
        .id(take(attribute::ID)?)
        .source(take(attribute::SOURCE)?)
        .ty(take(attribute::TYPE)?);
    if let Ok(s) = take(attribute::SUBJECT) {
        b = b.subject(s);
    }
    if let Ok(t) = take(attribute::TIME) {
        b = b.time(t);
    }
    let schema = take(attribute::DATASCHEMA).ok();
    take(attribute::SPECVERSION)?;
    for (k, v) in attrs {
        b = b.extension(&k, v);
    }
    let data: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| NotCloudEvent(format!("data is not JSON: {e}")))?;
    let ct = content_type.unwrap_or_else(|| "application/json".into());
    b = match schema {
        Some(s) => b.data_with_schema(ct, s, data),
        None => b.data(ct, data),
    };
    b.build().map_err(|e| NotCloudEvent(e.to_string()))
}
