//! The Server Objects and security schemes of the sink. Only names, types and where a
//! credential comes from are described: never a password, token, key or the user of a URL.

use serde_json::{Map, Value, json};

use crate::config::{KafkaConfig, NatsConfig, Sink};

/// The `servers` object and the security schemes it refers to; `None` for standard output.
pub(super) fn servers(sink: &Sink) -> Option<(Value, Map<String, Value>)> {
    match sink {
        Sink::Kafka { config, .. } => Some(kafka(config)),
        Sink::Nats { config, .. } => Some(nats(config)),
        Sink::Stdout => None,
    }
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
