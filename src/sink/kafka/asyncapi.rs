//! What the AsyncAPI document says of the Kafka sink: topics, `ce_` headers, the record key,
//! tombstones, and the brokers with their security.

use serde_json::{Map, Value, json};

use super::{Kafka, KafkaConfig};
use crate::config::{ContentMode, RecordKey};
use crate::encode::Event;
use crate::sink::describe::{
    Attribute, Describe, Headers, KAFKA_BINDING_VERSION, add_security, marker_headers, prefixed,
};

impl Describe for Kafka {
    fn spec_url(&self) -> &'static str {
        "https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/bindings/kafka-protocol-binding.md"
    }

    fn content_mode(&self) -> ContentMode {
        self.config.content_mode
    }

    fn headers(&self, attributes: &[Attribute], example: &Event) -> Option<Headers> {
        Some(prefixed(
            self.config.content_mode,
            ("content-type", "The content type of the record value."),
            ("ce_", "$message.header#/ce_id"),
            attributes,
            example,
        ))
    }

    fn message_bindings(&self, key: RecordKey) -> Option<Value> {
        Some(json!({"kafka": {
            "key": {"type": "string", "description": key_description(key)},
            "bindingVersion": KAFKA_BINDING_VERSION,
        }}))
    }

    fn marker_headers(&self, _id: &str) -> Option<Headers> {
        Some(marker_headers("content-type", false))
    }

    fn marker_bindings(&self) -> Option<Value> {
        Some(json!({"kafka": {
            "key": {
                "type": "string",
                "description": "The marker's id (also its `partitionkey`): unique per marker, \
                                so that compaction keeps every marker of every snapshot.",
            },
            "bindingVersion": KAFKA_BINDING_VERSION,
        }}))
    }

    fn tombstones(&self) -> bool {
        true
    }

    fn channel_kind(&self) -> &'static str {
        "Kafka topic"
    }

    fn channel_bindings(&self, address: &str) -> Option<Value> {
        // A parameter (`{namespace}`, `{name}`, `{cluster}`): no one topic to bind.
        let templated = address.contains('{');
        (!templated).then(|| {
            json!({"kafka": {
                "topic": address,
                "bindingVersion": KAFKA_BINDING_VERSION,
            }})
        })
    }

    fn parameter_encoding(&self) -> &'static str {
        "characters outside `[A-Za-z0-9._-]` replaced by `_`"
    }

    fn delivery(&self) -> &'static str {
        "Idempotent producer with acks=all; with checkpoints, events are written in \
         transactions: read with isolation.level=read_committed."
    }

    fn operation_bindings(&self) -> Option<Value> {
        let client_id = self
            .config
            .properties
            .get("client.id")
            .map_or("kube-event-bridge", String::as_str);
        Some(json!({"kafka": {
            "clientId": {"type": "string", "enum": [client_id]},
            "bindingVersion": KAFKA_BINDING_VERSION,
        }}))
    }

    fn servers(&self, _: &[String]) -> Option<(Value, Map<String, Value>)> {
        Some(servers(&self.config))
    }
}

/// Whether the resource keys records by name.
fn key_description(key: RecordKey) -> &'static str {
    match key {
        RecordKey::Uid => {
            "The object's uid (the `partitionkey` extension): every change of an \
             object lands in one partition, in order."
        }
        RecordKey::NamespacedName => {
            "`namespace/name`, or `name` for cluster-scoped objects (the \
             `partitionkey` extension): every change of an object lands \
             in one partition, in order."
        }
    }
}

fn servers(config: &KafkaConfig) -> (Value, Map<String, Value>) {
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
        "bindings": {"kafka": {"bindingVersion": KAFKA_BINDING_VERSION}},
    });
    add_security(&mut server, &schemes);
    (json!({"kafka": server}), schemes)
}
