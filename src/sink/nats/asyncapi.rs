//! What the AsyncAPI document says of the NATS sink: subjects, `ce-` headers and
//! `Nats-Msg-Id`, the JetStream stream, and the servers with their security.

use serde_json::{Map, Value, json};

use super::sink::{ALL_NAMESPACES, WATCH_NAME};
use super::{Nats, NatsConfig, message};
use crate::config::ContentMode;
use crate::encode::Event;
use crate::sink::describe::{
    Attribute, Describe, Headers, STRUCTURED_ID, add_security, content_type, headers_schema,
    host_of, marker_headers,
};

impl Describe for Nats {
    fn spec_url(&self) -> &'static str {
        "https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/bindings/nats-protocol-binding.md"
    }

    fn content_mode(&self) -> ContentMode {
        self.config.content_mode
    }

    fn headers(&self, attributes: &[Attribute], example: &Event) -> Option<Headers> {
        let mode = self.config.content_mode;
        let jetstream = self.config.jetstream.is_some();
        let fixed = [(
            "Content-Type",
            content_type(mode),
            "The content type of the payload.",
        )];
        let (headers, _) = message(example, mode, jetstream);
        let values: Map<String, Value> = headers
            .iter()
            .filter_map(|(k, v)| Some((k.to_string(), json!(v.first()?.as_str()))))
            .collect();
        let mut schema = headers_schema(&fixed, "ce-", attributes);
        if jetstream {
            schema["properties"]["Nats-Msg-Id"] = json!({
                "type": "string",
                "description": "The event id: JetStream drops a message whose \
                                Nats-Msg-Id it stored within the stream's duplicate window.",
            });
            schema["required"]
                .as_array_mut()
                .expect("required is a list")
                .push(json!("Nats-Msg-Id"));
        }
        Some(Headers {
            schema,
            example: Value::Object(values),
            id_location: match mode {
                ContentMode::Structured => STRUCTURED_ID,
                ContentMode::Binary => "$message.header#/ce-id",
            },
        })
    }

    /// With JetStream, `Nats-Msg-Id` is the marker's `id`: a marker sent again within the
    /// duplicate window is dropped.
    fn marker_headers(&self, id: &str) -> Option<Headers> {
        let mut headers = marker_headers("Content-Type", false);
        if self.config.jetstream.is_some() {
            headers.schema["properties"]["Nats-Msg-Id"] = json!({
                "type": "string",
                "description": "The marker's id: JetStream drops a marker sent again within \
                                the stream's duplicate window.",
            });
            headers.example["Nats-Msg-Id"] = json!(id);
        }
        Some(headers)
    }

    /// A watch's messages take `_watch` for the object's name, `_all` for a namespace the
    /// watch does not have.
    fn marker_tokens(&self) -> Option<(&'static str, &'static str)> {
        Some((WATCH_NAME, ALL_NAMESPACES))
    }

    fn channel_kind(&self) -> &'static str {
        "NATS subject"
    }

    fn channel_note(&self) -> Option<String> {
        let js = self.config.jetstream.as_ref()?;
        Some(format!(
            "Captured by JetStream stream `{}` (duplicate window {} s).",
            js.stream, js.duplicate_window_secs
        ))
    }

    fn parameter_encoding(&self) -> &'static str {
        "characters outside `[A-Za-z0-9_-]` (including `.`, `*`, `>`) replaced by `_`, so that \
         it is exactly one subject token"
    }

    fn subject_addresses(&self) -> bool {
        true
    }

    fn delivery(&self) -> &'static str {
        match self.config.jetstream {
            Some(_) => {
                "Each publish waits for JetStream's acknowledgement; a retry keeps the Nats-Msg-Id."
            }
            None => "Core NATS: at most once, no acknowledgement.",
        }
    }

    fn servers(&self, _: &[String]) -> Option<(Value, Map<String, Value>)> {
        Some(servers(&self.config))
    }
}

fn servers(config: &NatsConfig) -> (Value, Map<String, Value>) {
    let c = &config.credentials;
    let urls: Vec<&str> = config.url.split(',').map(str::trim).collect();
    let mut wanted = Vec::new();
    if c.user.is_some() {
        wanted.push((
            "natsUserPassword",
            "userPassword",
            "A user (sink.nats.credentials.user) and a password read from a file.",
        ));
    }
    if urls.iter().any(|u| host_of(u).1) {
        wanted.push((
            "natsUrlUserPassword",
            "userPassword",
            "A user and password in the server URL.",
        ));
    }
    if c.token_file.is_some() {
        wanted.push(("natsToken", "apiKey", "A token read from a file (sink.nats.credentials.tokenFile), sent as the connection's auth_token."));
    }
    if c.nkey_seed_file.is_some() {
        wanted.push((
            "natsNkey",
            "asymmetricEncryption",
            "An nkey: the server's nonce signed with a seed read from a file.",
        ));
    }
    if c.creds_file.is_some() {
        wanted.push((
            "natsCredsFile",
            "asymmetricEncryption",
            "A user JWT and its nkey seed read from a .creds file (operator mode).",
        ));
    }
    if c.tls_cert_file.is_some() {
        wanted.push((
            "natsTlsClientCertificate",
            "X509",
            "A TLS client certificate and key read from files.",
        ));
    }
    let mut schemes = Map::new();
    for (id, kind, description) in wanted {
        let mut scheme = json!({"type": kind, "description": description});
        if kind == "apiKey" {
            scheme["in"] = json!("password");
        }
        schemes.insert(id.into(), scheme);
    }
    let tls = c.tls_ca_file.is_some()
        || c.tls_cert_file.is_some()
        || urls.iter().any(|u| u.starts_with("tls://"));
    let hosts: Vec<String> = urls.iter().map(|u| host_of(u).0).collect();
    let mode = match &config.jetstream {
        Some(js) => format!("JetStream stream `{}`", js.stream),
        None => "core NATS (no acknowledgement, at most once)".to_string(),
    };
    let mut server = json!({
        "host": hosts.join(","),
        "protocol": "nats",
        "title": "NATS",
        "description": format!(
            "The NATS servers (comma-separated){}; {mode}.",
            if tls { ", over TLS" } else { "" }
        ),
    });
    add_security(&mut server, &schemes);
    (json!({"nats": server}), schemes)
}
