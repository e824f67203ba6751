//! What the AsyncAPI document says of a sink ([`Describe`]), implemented in each sink's folder
//! (`asyncapi.rs`), and the pieces those descriptions share: the headers of a message, and the
//! servers' security. Only names, types and where a credential comes from are described: never a
//! password, token, key or the user of a URL.

use serde_json::{Map, Value, json};

use crate::config::{ContentMode, RecordKey};
use crate::encode::{self, Event};

/// The Kafka bindings' version (AsyncAPI bindings repository).
pub const KAFKA_BINDING_VERSION: &str = "0.5.0";

/// The HTTP bindings' version (AsyncAPI bindings repository).
pub const HTTP_BINDING_VERSION: &str = "0.3.0";

/// An attribute as the message headers describe it: name, JSON Schema, and whether every event
/// has it.
pub type Attribute = (String, Value, bool);

/// What the AsyncAPI document says of a sink.
pub trait Describe {
    /// The CloudEvents protocol binding or format the messages follow (a URL).
    fn spec_url(&self) -> &'static str;

    /// How events are encoded.
    fn content_mode(&self) -> ContentMode;

    /// Whether messages are one structured document without headers (standard output).
    fn bare(&self) -> bool {
        false
    }

    /// The headers of one message; `attributes` are those of binary mode (empty in
    /// structured mode), `example` the example event.
    fn headers(&self, attributes: &[Attribute], example: &Event) -> Option<Headers>;

    /// The message bindings (Kafka's record key).
    fn message_bindings(&self, key: RecordKey) -> Option<Value> {
        let _ = key;
        None
    }

    /// The headers of a snapshot's begin or end marker `id`: a structured-mode document whatever
    /// [`Describe::content_mode`] says, so its content-type header (none on standard output),
    /// and what the transport keys on the marker's id.
    fn marker_headers(&self, id: &str) -> Option<Headers> {
        let _ = id;
        None
    }

    /// The tokens a snapshot's markers take in an address that names the object: for
    /// `{name}`, and for `{namespace}` when the snapshot covers every namespace. `None`: such an
    /// address carries no markers (the snapshot fails).
    fn marker_tokens(&self) -> Option<(&'static str, &'static str)> {
        None
    }

    /// The message bindings of a snapshot's markers (Kafka's record key: the marker's id).
    fn marker_bindings(&self) -> Option<Value> {
        None
    }

    /// Whether a delete may be followed by a tombstone record.
    fn tombstones(&self) -> bool {
        false
    }

    /// What a channel is (`Kafka topic`), for its description.
    fn channel_kind(&self) -> &'static str;

    /// A sentence added to every channel's description.
    fn channel_note(&self) -> Option<String> {
        None
    }

    /// The channel bindings of a fixed address.
    fn channel_bindings(&self, address: &str) -> Option<Value> {
        let _ = address;
        None
    }

    /// How `{namespace}` and `{name}` are made safe in an address.
    fn parameter_encoding(&self) -> &'static str;

    /// Whether addresses are NATS subjects (their parameters are whole tokens).
    fn subject_addresses(&self) -> bool {
        false
    }

    /// Whether each origin of the channel addresses is a server of its own, the addresses being
    /// paths on it (HTTP).
    fn servers_by_origin(&self) -> bool {
        false
    }

    /// The delivery guarantee, for the `send` operations.
    fn delivery(&self) -> &'static str;

    /// The operation bindings.
    fn operation_bindings(&self) -> Option<Value> {
        None
    }

    /// The `servers` object and the security schemes it refers to; `origins` are the distinct
    /// origins of the addresses when [`Describe::servers_by_origin`].
    fn servers(&self, origins: &[String]) -> Option<(Value, Map<String, Value>)>;
}

/// What a binding's headers look like for one message.
pub struct Headers {
    /// The headers' JSON Schema.
    pub schema: Value,
    /// The example event's headers, as published.
    pub example: Value,
    /// Where the event id is: a runtime expression.
    pub id_location: &'static str,
}

/// The content type of a message's payload.
pub fn content_type(mode: ContentMode) -> &'static str {
    match mode {
        ContentMode::Structured => encode::STRUCTURED_CONTENT_TYPE,
        ContentMode::Binary => encode::DATA_CONTENT_TYPE,
    }
}

/// Where the event id is in structured mode.
pub const STRUCTURED_ID: &str = "$message.payload#/id";

/// The headers schema: `fixed` headers (name, value) first, then one header per attribute named
/// `prefix` + attribute; every header is a string and no other header is sent.
pub fn headers_schema(
    fixed: &[(&str, &str, &str)],
    prefix: &str,
    attributes: &[Attribute],
) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for (name, value, description) in fixed {
        properties.insert(
            name.to_string(),
            json!({"type": "string", "const": value, "description": description}),
        );
        required.push(json!(name));
    }
    for (name, schema, always) in attributes {
        let header = format!("{prefix}{name}");
        if *always {
            required.push(json!(header));
        }
        properties.insert(header, schema.clone());
    }
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// The headers of a binding whose binary mode sends one `prefix` + attribute header per
/// attribute beside a content-type header (Kafka's `ce_`, HTTP's `ce-`): `content` is that
/// header's name and description, `id` the prefix and where the id header is.
pub fn prefixed(
    mode: ContentMode,
    (content_header, what): (&'static str, &'static str),
    (prefix, id_header): (&'static str, &'static str),
    attributes: &[Attribute],
    example: &Event,
) -> Headers {
    let (structured, content_type) = (mode == ContentMode::Structured, content_type(mode));
    let mut values = Map::new();
    values.insert(content_header.into(), json!(content_type));
    if !structured {
        for (name, value) in example.attributes() {
            values.insert(format!("{prefix}{name}"), json!(value));
        }
    }
    Headers {
        schema: headers_schema(&[(content_header, content_type, what)], prefix, attributes),
        example: Value::Object(values),
        id_location: if structured { STRUCTURED_ID } else { id_header },
    }
}

/// The headers of a snapshot marker: `content_header` with the structured content type, and
/// `others` (headers the transport adds, HTTP's) allowed or not.
pub fn marker_headers(content_header: &'static str, others: bool) -> Headers {
    let mut schema = headers_schema(
        &[(
            content_header,
            encode::STRUCTURED_CONTENT_TYPE,
            "A marker is always a structured-mode CloudEvent.",
        )],
        "",
        &[],
    );
    schema["additionalProperties"] = json!(others);
    Headers {
        schema,
        example: json!({content_header: encode::STRUCTURED_CONTENT_TYPE}),
        id_location: STRUCTURED_ID,
    }
}

/// The id of the server of the `index`th origin (`http`, `http-2`, `http-3`...).
pub fn origin_server_id(kind: &str, index: usize) -> String {
    if index == 0 {
        kind.into()
    } else {
        format!("{kind}-{}", index + 1)
    }
}

/// `host:port` of a URL without its scheme and credentials, and whether it had credentials.
pub fn host_of(url: &str) -> (String, bool) {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.split('/').next().unwrap_or(rest);
    match rest.rsplit_once('@') {
        Some((_, host)) => (host.to_string(), true),
        None => (rest.to_string(), false),
    }
}

/// Refers `server` to every scheme of `schemes`.
pub fn add_security(server: &mut Value, schemes: &Map<String, Value>) {
    if !schemes.is_empty() {
        server["security"] = schemes
            .keys()
            .map(|id| json!({"$ref": format!("#/components/securitySchemes/{id}")}))
            .collect();
    }
}
