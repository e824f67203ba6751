//! What the AsyncAPI document says of the HTTP sink: one POST per event, `ce-` headers, and a
//! server per origin of the URLs, with its security.

use serde_json::{Map, Value, json};

use super::{Http, HttpConfig};
use crate::config::ContentMode;
use crate::encode::Event;
use crate::sink::describe::{
    Attribute, Describe, HTTP_BINDING_VERSION, Headers, add_security, host_of, marker_headers,
    origin_server_id, prefixed,
};

impl Describe for Http {
    fn spec_url(&self) -> &'static str {
        "https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/bindings/http-protocol-binding.md"
    }

    fn content_mode(&self) -> ContentMode {
        self.config.content_mode
    }

    fn headers(&self, attributes: &[Attribute], example: &Event) -> Option<Headers> {
        let mut headers = prefixed(
            self.config.content_mode,
            ("Content-Type", "The content type of the request body."),
            ("ce-", "$message.header#/ce-id"),
            attributes,
            example,
        );
        // HTTP adds its own headers (Host, Content-Length, Authorization), and
        // `sink.http.extensions` adds `ce-` headers of their own.
        headers.schema["additionalProperties"] = json!(true);
        Some(headers)
    }

    /// HTTP adds its own headers (Host, Content-Length, Authorization).
    fn marker_headers(&self, _id: &str) -> Option<Headers> {
        Some(marker_headers("Content-Type", true))
    }

    fn channel_kind(&self) -> &'static str {
        "HTTP POST to the path"
    }

    fn parameter_encoding(&self) -> &'static str {
        "percent-encoded but for `[A-Za-z0-9._~-]`"
    }

    fn servers_by_origin(&self) -> bool {
        true
    }

    fn delivery(&self) -> &'static str {
        "Each event is one POST; a 2xx response acknowledges it. 5xx, 429, timeouts and \
         connection errors are retried with the same id (honouring Retry-After)."
    }

    fn operation_bindings(&self) -> Option<Value> {
        Some(json!({"http": {"method": "POST", "bindingVersion": HTTP_BINDING_VERSION}}))
    }

    fn servers(&self, origins: &[String]) -> Option<(Value, Map<String, Value>)> {
        Some(servers(&self.config, origins))
    }
}

fn servers(config: &HttpConfig, origins: &[String]) -> (Value, Map<String, Value>) {
    let c = &config.credentials;
    let mut schemes = Map::new();
    if c.bearer_token_file.is_some() {
        schemes.insert(
            "httpBearer".into(),
            json!({"type": "http", "scheme": "bearer",
                   "description": "A bearer token read from a file (sink.http.credentials.bearerTokenFile)."}),
        );
    }
    if c.user.is_some() {
        schemes.insert(
            "httpBasic".into(),
            json!({"type": "http", "scheme": "basic",
                   "description": "A user (sink.http.credentials.user) and a password read from a file."}),
        );
    }
    if c.tls_cert_file.is_some() {
        schemes.insert(
            "httpTlsClientCertificate".into(),
            json!({"type": "X509", "description": "A TLS client certificate and key read from files."}),
        );
    }
    let mut servers = Map::new();
    for (index, origin) in origins.iter().enumerate() {
        let scheme = origin
            .split_once("://")
            .map_or("http", |(scheme, _)| scheme);
        let mut server = json!({
            "host": host_of(origin).0,
            "protocol": scheme,
            "title": "HTTP receiver",
            "description": format!(
                "The receiver events are POSTed to ({scheme}), one request per event. A channel's \
                 address is the path of its URL on this server{}.",
                if c.tls_ca_file.is_some() { "; its certificate is checked against sink.http.credentials.tlsCaFile" } else { "" }
            ),
        });
        add_security(&mut server, &schemes);
        servers.insert(origin_server_id("http", index), server);
    }
    (Value::Object(servers), schemes)
}
