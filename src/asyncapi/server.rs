//! The Server Objects and security schemes of the sink. Only names, types and where a
//! credential comes from are described: never a password, token, key or the user of a URL.

use serde_json::{Map, Value, json};

use crate::config::{HttpConfig, KafkaConfig, NatsConfig, Sink};

/// The `servers` object and the security schemes it refers to; `None` for standard output.
/// An HTTP sink has one server per origin its URLs post to (`origins`).
pub(super) fn servers(sink: &Sink, origins: &Origins) -> Option<(Value, Map<String, Value>)> {
    match sink {
        Sink::Kafka { config, .. } => Some(kafka(config)),
        Sink::Nats { config, .. } => Some(nats(config)),
        Sink::Http { config, .. } => Some(http(config, origins)),
        Sink::Stdout => None,
    }
}

/// The origins (`scheme://host:port`) of an HTTP sink's channel addresses, each a server: a
/// channel's address is then its URL's path, relative to its server. Empty for other sinks.
#[derive(Debug, Default)]
pub(super) struct Origins(Vec<String>);

impl Origins {
    /// The distinct origins of `addresses`, in order, when `sink` is an HTTP sink.
    pub(super) fn of<'a>(addresses: impl Iterator<Item = &'a str>, sink: &Sink) -> Self {
        let mut origins = Vec::new();
        if matches!(sink, Sink::Http { .. }) {
            for a in addresses {
                let origin = split_url(a).0.to_string();
                if !origins.contains(&origin) {
                    origins.push(origin);
                }
            }
        }
        Origins(origins)
    }

    /// An address as its server's id (HTTP only) and the address relative to it.
    pub(super) fn split(&self, address: Option<String>) -> (Option<String>, Option<String>) {
        match address {
            Some(a) if !self.0.is_empty() => {
                let (origin, path) = split_url(&a);
                let index = self.0.iter().position(|o| o == origin).unwrap_or(0);
                // The query string may hold a key: it never appears in the document.
                let path = path.split(['?', '#']).next().unwrap_or(path);
                (Some(server_id(index)), Some(path.to_string()))
            }
            other => (None, other),
        }
    }
}

/// `http`, `http-2`, `http-3`...
fn server_id(index: usize) -> String {
    if index == 0 {
        "http".into()
    } else {
        format!("http-{}", index + 1)
    }
}

/// `https://host:port/path?q` as (`https://host:port`, `/path?q`).
fn split_url(url: &str) -> (&str, &str) {
    let start = url.find("://").map_or(0, |i| i + 3);
    match url[start..].find('/') {
        Some(i) => url.split_at(start + i),
        None => (url, "/"),
    }
}

fn http(config: &HttpConfig, origins: &Origins) -> (Value, Map<String, Value>) {
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
    for (index, origin) in origins.0.iter().enumerate() {
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
        servers.insert(server_id(index), server);
    }
    (Value::Object(servers), schemes)
}

fn kafka(config: &KafkaConfig) -> (Value, Map<String, Value>) {
    let property = |name: &str| config.properties.get(name).map(|v| v.to_ascii_lowercase());
    let protocol = property("security.protocol").unwrap_or_else(|| "plaintext".into());
    let tls = matches!(protocol.as_str(), "ssl" | "sasl_ssl");
    let mut schemes = Map::new();
    if protocol.starts_with("sasl") {
        let mechanism = config
            .properties
            .get("sasl.mechanisms")
            .or_else(|| config.properties.get("sasl.mechanism"))
            .map_or("GSSAPI", String::as_str);
        let from_file = |name: &str| config.property_files.contains_key(name);
        let secret = if from_file("sasl.password") {
            "the password read from a file (sink.kafka.propertyFiles)"
        } else {
            "the password set in sink.kafka.properties"
        };
        let (id, scheme) = match mechanism.to_ascii_uppercase().as_str() {
            "PLAIN" => ("kafkaSaslPlain", json!({"type": "plain"})),
            "SCRAM-SHA-256" => ("kafkaSaslScramSha256", json!({"type": "scramSha256"})),
            "SCRAM-SHA-512" => ("kafkaSaslScramSha512", json!({"type": "scramSha512"})),
            "OAUTHBEARER" => (
                "kafkaSaslOauthbearer",
                json!({"type": "oauth2", "flows": {"clientCredentials": {
                    "tokenUrl": config
                        .properties
                        .get("sasl.oauthbearer.token.endpoint.url")
                        .map_or("https://oauth.invalid/token", String::as_str),
                    "availableScopes": {},
                }}}),
            ),
            _ => ("kafkaSaslGssapi", json!({"type": "gssapi"})),
        };
        let mut scheme = scheme;
        scheme["description"] = json!(format!(
            "SASL {mechanism} over {protocol}: the user from sasl.username with {secret}."
        ));
        schemes.insert(id.into(), scheme);
    }
    if [
        "ssl.certificate.location",
        "ssl.certificate.pem",
        "ssl.keystore.location",
    ]
    .iter()
    .any(|p| config.properties.contains_key(*p) || config.property_files.contains_key(*p))
    {
        schemes.insert(
            "kafkaTlsClientCertificate".into(),
            json!({"type": "X509", "description": "A TLS client certificate (librdkafka ssl.* properties)."}),
        );
    }
    let mut server = json!({
        "host": config.bootstrap_servers.split(',').map(str::trim).collect::<Vec<_>>().join(","),
        "protocol": if tls { "kafka-secure" } else { "kafka" },
        "title": "Kafka",
        "description": format!(
            "The bootstrap servers (comma-separated, as librdkafka takes them), security.protocol \
             {protocol}. The bridge does not create topics."
        ),
        "bindings": {"kafka": {"bindingVersion": super::KAFKA_BINDING_VERSION}},
    });
    add_security(&mut server, &schemes);
    (json!({"kafka": server}), schemes)
}

fn nats(config: &NatsConfig) -> (Value, Map<String, Value>) {
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

/// `host:port` of a NATS URL without its scheme and credentials, and whether it had credentials.
fn host_of(url: &str) -> (String, bool) {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.split('/').next().unwrap_or(rest);
    match rest.rsplit_once('@') {
        Some((_, host)) => (host.to_string(), true),
        None => (rest.to_string(), false),
    }
}

fn add_security(server: &mut Value, schemes: &Map<String, Value>) {
    if !schemes.is_empty() {
        server["security"] = schemes
            .keys()
            .map(|id| json!({"$ref": format!("#/components/securitySchemes/{id}")}))
            .collect();
    }
}
