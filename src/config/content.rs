//! How a CloudEvent is laid out on the wire, for every sink that has a choice (CloudEvents'
//! binary and structured content modes).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a CloudEvent is laid out on the wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ContentMode {
    /// Attributes in headers, the object alone in the body.
    #[default]
    Binary,
    /// The whole event as one `application/cloudevents+json` document.
    Structured,
}
