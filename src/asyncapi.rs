//! The `asyncapi` command: an [AsyncAPI 3.0.0](https://www.asyncapi.com/docs/reference/specification/v3.0.0)
//! document of what a configuration publishes, after discovery resolved its resources (as the
//! `rbac` command does):
//!
//! - **servers**: the Kafka bootstrap servers, the NATS URLs (credentials in a URL removed) or,
//!   for the HTTP sink, one server per origin its URLs post to; the protocol (`kafka`,
//!   `kafka-secure`, `nats`, `http`, `https`) and the security schemes by name and type, never a
//!   secret ([`server`]); the stdout sink has no server;
//! - **channels**: one per distinct topic, subject or URL (HTTP: its path, on its server). A
//!   template's per-watch tokens are rendered; its per-object tokens (`{namespace}`, `{name}`)
//!   stay in the address as parameters, described (and listed, for fixed namespaces). Several
//!   resources sharing a topic share its channel;
//! - **operations**: one `send` per channel, with every message of the channel;
//! - **messages**: one per resource ([`message`]): the CloudEvents headers of the binding (Kafka
//!   `ce_*` record headers, NATS and HTTP `ce-*` headers, `Nats-Msg-Id`) in binary mode, or the
//!   structured event; the payload schema (the event JSON Schema of `schemas/event.schema.json`,
//!   embedded under `components.schemas`, narrowed to the resource); the Kafka key as the message
//!   binding's key; an example built by the bridge's own encoder; Kafka tombstones when on.

mod message;
mod server;

use serde_json::{Map, Value, json};

use crate::config::{Config, ContentMode, Sink};
use crate::discovery::ResolvedResource;
use crate::encode::{self, Event, ResourceInfo};
use crate::template::Template;

/// Errors of building the document.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The example event of a resource could not be encoded.
    #[error("cannot encode the example event")]
    Encode(#[source] encode::Error),
    /// An example payload is not JSON.
    #[error("the example payload is not JSON")]
    Example(#[source] serde_json::Error),
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The AsyncAPI version of the document.
pub const ASYNCAPI_VERSION: &str = "3.0.0";

/// Where the embedded event schema lives in the document.
const EVENT_SCHEMA_REF: &str = "#/components/schemas/CloudEvent";

/// The Kafka bindings' version (AsyncAPI bindings repository).
const KAFKA_BINDING_VERSION: &str = "0.5.0";

/// The HTTP bindings' version (AsyncAPI bindings repository).
const HTTP_BINDING_VERSION: &str = "0.3.0";

/// How events travel: the sink and its content mode.
#[derive(Debug, Clone)]
struct Binding {
    sink: SinkKind,
    mode: ContentMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SinkKind {
    Kafka,
    Nats { jetstream: bool },
    Http,
    Stdout,
}

impl Binding {
    fn new(sink: &Sink) -> Self {
        match sink {
            Sink::Kafka { config, .. } => Binding {
                sink: SinkKind::Kafka,
                mode: config.content_mode,
            },
            Sink::Nats { config, .. } => Binding {
                sink: SinkKind::Nats {
                    jetstream: config.jetstream.is_some(),
                },
                mode: config.content_mode,
            },
            Sink::Http { config, .. } => Binding {
                sink: SinkKind::Http,
                mode: config.content_mode,
            },
            Sink::Stdout => Binding {
                sink: SinkKind::Stdout,
                mode: ContentMode::Structured,
            },
        }
    }

    fn stdout(&self) -> bool {
        self.sink == SinkKind::Stdout
    }

    /// The CloudEvents protocol binding this follows.
    fn spec_url(&self) -> &'static str {
        match self.sink {
            SinkKind::Kafka => {
                "https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/bindings/kafka-protocol-binding.md"
            }
            SinkKind::Nats { .. } => {
                "https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/bindings/nats-protocol-binding.md"
            }
            SinkKind::Http => {
                "https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/bindings/http-protocol-binding.md"
            }
            SinkKind::Stdout => {
                "https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/formats/json-format.md"
            }
        }
    }

    fn structured(&self) -> bool {
        self.mode == ContentMode::Structured
    }

    /// The content type of a message's payload.
    fn content_type(&self) -> &'static str {
        if self.structured() {
            encode::STRUCTURED_CONTENT_TYPE
        } else {
            encode::DATA_CONTENT_TYPE
        }
    }

    /// The headers of one message (none on standard output).
    fn headers(
        &self,
        attributes: &[(String, Value, bool)],
        example: &Event,
    ) -> Option<message::Headers> {
        let (structured, content_type) = (self.structured(), self.content_type());
        let attributes = if structured { &[][..] } else { attributes };
        match self.sink {
            SinkKind::Stdout => None,
            SinkKind::Http => {
                let mut headers = self.prefixed(
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
            SinkKind::Kafka => Some(self.prefixed(
                ("content-type", "The content type of the record value."),
                ("ce_", "$message.header#/ce_id"),
                attributes,
                example,
            )),
            SinkKind::Nats { jetstream } => {
                let fixed = [(
                    "Content-Type",
                    content_type,
                    "The content type of the payload.",
                )];
                let (headers, _) = crate::sink::nats::message(example, self.mode, jetstream);
                let values: Map<String, Value> = headers
                    .iter()
                    .filter_map(|(k, v)| Some((k.to_string(), json!(v.first()?.as_str()))))
                    .collect();
                let mut schema = message::headers_schema(&fixed, "ce-", attributes);
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
                Some(message::Headers {
                    schema,
                    example: Value::Object(values),
                    id_location: if structured {
                        "$message.payload#/id"
                    } else {
                        "$message.header#/ce-id"
                    },
                })
            }
        }
    }

    /// The headers of a binding whose binary mode sends one `prefix` + attribute header per
    /// attribute beside a content-type header (Kafka's `ce_`, HTTP's `ce-`): `content` is that
    /// header's name and description, `id` the prefix and where the id header is.
    fn prefixed(
        &self,
        (content_header, what): (&'static str, &'static str),
        (prefix, id_header): (&'static str, &'static str),
        attributes: &[(String, Value, bool)],
        example: &Event,
    ) -> message::Headers {
        let (structured, content_type) = (self.structured(), self.content_type());
        let mut values = Map::new();
        values.insert(content_header.into(), json!(content_type));
        if !structured {
            for (name, value) in example.attributes() {
                values.insert(format!("{prefix}{name}"), json!(value));
            }
        }
        message::Headers {
            schema: message::headers_schema(
                &[(content_header, content_type, what)],
                prefix,
                attributes,
            ),
            example: Value::Object(values),
            id_location: if structured {
                "$message.payload#/id"
            } else {
                id_header
            },
        }
    }

    /// The message bindings: Kafka's record key.
    fn message_bindings(&self, key: crate::config::RecordKey) -> Option<Value> {
        (self.sink == SinkKind::Kafka).then(|| {
            json!({"kafka": {
                "key": {"type": "string", "description": message::key_description(key)},
                "bindingVersion": KAFKA_BINDING_VERSION,
            }})
        })
    }
}

/// The AsyncAPI document of `config`, whose resources discovery resolved to `resources`;
/// `api_server` is the API server's URL (the `source` of Knative-format events).
pub fn document(
    config: &Config,
    resources: &[ResolvedResource],
    api_server: &str,
) -> Result<Value> {
    let binding = Binding::new(&config.sink);
    let event_schema: Value =
        serde_json::from_str(&crate::schema::event_schema()).expect("the event schema is JSON");
    let descriptions = event_schema["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let trait_ref = "#/components/messageTraits/CloudEvent";
    let mut channels = Map::new();
    let mut operations = Map::new();
    let mut messages = Map::new();
    let groups = group_by_address(config, resources);
    let origins = server::Origins::of(
        groups.iter().filter_map(|(a, _)| a.as_deref()),
        &config.sink,
    );
    for (address, members) in groups {
        let (server_id, address) = origins.split(address);
        let id = unique_id(
            &channels,
            &address.clone().unwrap_or_else(|| "stdout".into()),
        );
        let mut channel_messages = Map::new();
        for r in &members {
            let mut info = ResourceInfo::new(&config.cluster, r, api_server);
            if config.audit_extensions {
                info = info.with_audit(message::example_cluster_id());
            }
            let tombstones = info.tombstones && binding.sink == SinkKind::Kafka;
            let name = unique_id(&messages, &message_id(r));
            let m = message::message(&binding, r, info, &descriptions, trait_ref)?;
            messages.insert(name.clone(), m);
            channel_messages.insert(
                name.clone(),
                json!({"$ref": format!("#/components/messages/{name}")}),
            );
            if tombstones {
                let tomb = format!("{name}.tombstone");
                messages.insert(tomb.clone(), message::tombstone(r));
                channel_messages.insert(
                    tomb.clone(),
                    json!({"$ref": format!("#/components/messages/{tomb}")}),
                );
            }
        }
        let refs: Vec<Value> = channel_messages
            .keys()
            .map(|m| json!({"$ref": format!("#/channels/{id}/messages/{m}")}))
            .collect();
        let mut channel = channel(
            &binding,
            config,
            address.as_deref(),
            &members,
            channel_messages,
        );
        if let Some(server_id) = server_id {
            channel["servers"] = json!([{"$ref": format!("#/servers/{server_id}")}]);
        }
        channels.insert(id.clone(), channel);
        operations.insert(format!("send.{id}"), operation(&binding, config, &id, refs));
    }
    let mut components = json!({
        "schemas": {"CloudEvent": embedded(event_schema)},
        "messages": messages,
        "messageTraits": {"CloudEvent": {
            "externalDocs": {
                "description": "The CloudEvents binding these messages follow",
                "url": binding.spec_url(),
            },
            "tags": [{"name": "cloudevents"}, {"name": "kubernetes"}],
        }},
    });
    let mut doc = json!({
        "asyncapi": ASYNCAPI_VERSION,
        "info": info(config),
        "defaultContentType": encode::DATA_CONTENT_TYPE,
    });
    if let Some((servers, schemes)) = server::servers(&config.sink, &origins) {
        doc["servers"] = servers;
        if !schemes.is_empty() {
            components["securitySchemes"] = Value::Object(schemes);
        }
    }
    doc["channels"] = Value::Object(channels);
    doc["operations"] = Value::Object(operations);
    doc["components"] = components;
    Ok(doc)
}

fn info(config: &Config) -> Value {
    json!({
        "title": format!("kube-event-bridge: cluster {}", config.cluster),
        "version": env!("CARGO_PKG_VERSION"),
        "description": format!(
            "Every add, update and delete of the watched Kubernetes resources of cluster `{}`, \
             published by kube-event-bridge as a CloudEvent 1.0. Per object, events arrive in the \
             order the API server made the changes; an event may arrive twice with the same `id` \
             (deduplicate by `id`, keep state by `uid`, compare `sequence` within a uid). \
             Generated by `kube-event-bridge asyncapi` from the configuration, its resources \
             resolved through the API server's discovery.",
            config.cluster
        ),
        "license": {"name": "Apache-2.0", "url": "https://www.apache.org/licenses/LICENSE-2.0"},
        "externalDocs": {
            "description": "The event JSON Schema (schemas/event.schema.json)",
            "url": encode::DATA_SCHEMA,
        },
    })
}

/// The event schema as an AsyncAPI Schema Object: the dialect and id keywords removed (the
/// document's own dialect applies; the `$id` is kept as the description's link).
fn embedded(mut schema: Value) -> Value {
    if let Some(map) = schema.as_object_mut() {
        map.remove("$schema");
        if let Some(id) = map.remove("$id") {
            map.insert(
                "externalDocs".into(),
                json!({"description": "schemas/event.schema.json", "url": id}),
            );
        }
    }
    schema
}

/// The template a resource's events go to, for the configured sink.
fn template<'a>(config: &'a Config, r: &'a ResolvedResource) -> Option<&'a Template> {
    match &config.sink {
        Sink::Kafka { topic, .. } => Some(r.destination(topic)),
        Sink::Nats { subject, .. } => Some(r.destination(subject)),
        Sink::Http { url, .. } => Some(r.destination(url)),
        Sink::Stdout => None,
    }
}

/// Resources grouped by channel address (`None`: standard output), in configuration order.
fn group_by_address<'a>(
    config: &'a Config,
    resources: &'a [ResolvedResource],
) -> Vec<(Option<String>, Vec<&'a ResolvedResource>)> {
    let mut groups: Vec<(Option<String>, Vec<&ResolvedResource>)> = Vec::new();
    for r in resources {
        let mut values = r.template_values(&config.cluster);
        if let (true, Some([namespace])) = (r.namespaced, r.config.namespaces.as_deref()) {
            values.namespace = Some(namespace);
        }
        let address = template(config, r).map(|t| {
            t.address(
                &values,
                matches!(config.sink, Sink::Nats { .. }),
                namespace_parameter(r),
            )
        });
        match groups.iter_mut().find(|(a, _)| *a == address) {
            Some((_, members)) => members.push(r),
            None => groups.push((address, vec![r])),
        }
    }
    groups
}

/// Whether `{namespace}` varies per object (a namespaced resource not watched in exactly one
/// namespace). Otherwise it renders as that namespace, or `_` for cluster-scoped resources.
fn namespace_parameter(r: &ResolvedResource) -> bool {
    r.namespaced
        && r.config
            .namespaces
            .as_ref()
            .is_none_or(|list| list.len() != 1)
}

/// `v1.configmaps`, `apps.v1.deployments`.
fn message_id(r: &ResolvedResource) -> String {
    let id = if r.api.group.is_empty() {
        format!("{}.{}", r.api.version, r.api.plural)
    } else {
        format!("{}.{}.{}", r.api.group, r.api.version, r.api.plural)
    };
    safe_id(&id)
}

/// Component and channel keys may hold letters, digits, `.`, `_` and `-`.
fn safe_id(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `base` made a safe key, with `-2`, `-3`... when `taken` already holds it.
fn unique_id(taken: &Map<String, Value>, base: &str) -> String {
    let base = safe_id(base);
    let mut id = base.clone();
    let mut n = 1;
    while taken.contains_key(&id) {
        n += 1;
        id = format!("{base}-{n}");
    }
    id
}

/// The Channel Object of one address.
fn channel(
    binding: &Binding,
    config: &Config,
    address: Option<&str>,
    members: &[&ResolvedResource],
    messages: Map<String, Value>,
) -> Value {
    let labels: Vec<String> = members.iter().map(|r| r.label()).collect();
    let what = if binding.stdout() {
        "JSON lines on the bridge's standard output (one structured CloudEvent per line, \
         flushed before the event counts as delivered; logs go to standard error)"
            .to_string()
    } else if binding.sink == SinkKind::Kafka {
        "Kafka topic".to_string()
    } else if binding.sink == SinkKind::Http {
        "HTTP POST to the path".to_string()
    } else {
        "NATS subject".to_string()
    };
    let mut channel = json!({
        "address": address,
        "title": labels.join(", "),
        "description": format!("{what}: the changes of {}.", labels.join(", ")),
        "messages": messages,
    });
    if let Some(address) = address {
        let parameters = parameters(address, binding, members);
        if !parameters.is_empty() {
            channel["parameters"] = Value::Object(parameters);
        }
        if binding.sink == SinkKind::Kafka && !templated(address) {
            channel["bindings"] = json!({"kafka": {
                "topic": address,
                "bindingVersion": KAFKA_BINDING_VERSION,
            }});
        }
    }
    if let Sink::Nats { config: nats, .. } = &config.sink
        && let Some(js) = &nats.jetstream
    {
        channel["description"] = json!(format!(
            "{} Captured by JetStream stream `{}` (duplicate window {} s).",
            channel["description"].as_str().unwrap_or_default(),
            js.stream,
            js.duplicate_window_secs
        ));
    }
    channel
}

/// Whether an address has parameters (a per-object template).
fn templated(address: &str) -> bool {
    address.contains("{namespace}") || address.contains("{name}")
}

/// The parameters of a templated address: `{namespace}` and `{name}`.
fn parameters(
    address: &str,
    binding: &Binding,
    members: &[&ResolvedResource],
) -> Map<String, Value> {
    let safe = if binding.sink == SinkKind::Http {
        "percent-encoded but for `[A-Za-z0-9._~-]`"
    } else if binding.sink == SinkKind::Kafka {
        "characters outside `[A-Za-z0-9._-]` replaced by `_`"
    } else {
        "characters outside `[A-Za-z0-9_-]` (including `.`, `*`, `>`) replaced by `_`, so that \
         it is exactly one subject token"
    };
    let mut out = Map::new();
    if address.contains("{namespace}") {
        let mut p = json!({"description": format!(
            "The object's namespace, {safe}; `_` for cluster-scoped objects."
        )});
        let fixed: Option<Vec<String>> = members.iter().try_fold(Vec::new(), |mut all, r| {
            all.extend(r.config.namespaces.clone()?);
            Some(all)
        });
        if let Some(mut namespaces) = fixed {
            namespaces.sort();
            namespaces.dedup();
            p["enum"] = json!(namespaces);
        }
        out.insert("namespace".into(), p);
    }
    if address.contains("{name}") {
        out.insert(
            "name".into(),
            json!({"description": format!(
                "The object's name, {safe}. Different names can share a subject: identify \
                 objects by the `uid` (or `namespace` and `name`) attribute."
            )}),
        );
    }
    out
}

/// The `send` operation of one channel.
fn operation(binding: &Binding, config: &Config, channel: &str, messages: Vec<Value>) -> Value {
    let delivery = match binding.sink {
        SinkKind::Kafka => {
            "Idempotent producer with acks=all; with checkpoints, events are \
                            written in transactions: read with isolation.level=read_committed."
        }
        SinkKind::Nats { jetstream: true } => {
            "Each publish waits for JetStream's \
                                               acknowledgement; a retry keeps the Nats-Msg-Id."
        }
        SinkKind::Nats { jetstream: false } => "Core NATS: at most once, no acknowledgement.",
        SinkKind::Http => {
            "Each event is one POST; a 2xx response acknowledges it. 5xx, 429, timeouts and \
             connection errors are retried with the same id (honouring Retry-After)."
        }
        SinkKind::Stdout => {
            "Each line is written and flushed before the event counts as delivered."
        }
    };
    let mut op = json!({
        "action": "send",
        "channel": {"$ref": format!("#/channels/{channel}")},
        "title": "Publish object changes",
        "summary": "The bridge publishes every add, update and delete of the channel's resources.",
        "description": format!(
            "Per object, in the order the API server made the changes; no order across objects. \
             Duplicates keep their id. {delivery}"
        ),
        "messages": messages,
    });
    if binding.sink == SinkKind::Http {
        op["bindings"] =
            json!({"http": {"method": "POST", "bindingVersion": HTTP_BINDING_VERSION}});
    }
    if let Sink::Kafka { config: kafka, .. } = &config.sink {
        let client_id = kafka
            .properties
            .get("client.id")
            .map_or("kube-event-bridge", String::as_str);
        op["bindings"] = json!({"kafka": {
            "clientId": {"type": "string", "enum": [client_id]},
            "bindingVersion": KAFKA_BINDING_VERSION,
        }});
    }
    op
}

/// Keys shown first, in this order, in every object of the printed document; the others follow
/// alphabetically.
const KEY_ORDER: &[&str] = &[
    "asyncapi",
    "info",
    "defaultContentType",
    "servers",
    "channels",
    "operations",
    "components",
    "address",
    "action",
    "channel",
    "host",
    "protocol",
    "name",
    "title",
    "version",
    "summary",
    "description",
    "type",
    "const",
    "contentType",
    "headers",
    "payload",
];

/// The document as YAML or JSON text, its keys in a readable order (see [`KEY_ORDER`]).
pub fn render(document: &Value, json: bool) -> String {
    let ordered = ordered(document);
    if json {
        serde_json::to_string_pretty(&ordered).expect("a document serializes") + "\n"
    } else {
        serde_yaml_ng::to_string(&ordered).expect("a document serializes")
    }
}

fn ordered(value: &Value) -> serde_yaml_ng::Value {
    match value {
        Value::Object(map) => {
            let rank = |k: &str| KEY_ORDER.iter().position(|o| *o == k).unwrap_or(usize::MAX);
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)));
            let mut out = serde_yaml_ng::Mapping::new();
            for k in keys {
                out.insert(serde_yaml_ng::Value::String(k.clone()), ordered(&map[k]));
            }
            serde_yaml_ng::Value::Mapping(out)
        }
        Value::Array(items) => serde_yaml_ng::Value::Sequence(items.iter().map(ordered).collect()),
        other => serde_yaml_ng::to_value(other).expect("a JSON scalar is YAML"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigFile;
    use kube::core::{ApiResource, GroupVersionKind};

    /// A config's resources resolved by hand: `(kind, plural, namespaced)` per entry.
    fn resolved(yaml: &str, api: &[(&str, &str, bool)]) -> (Config, Vec<ResolvedResource>) {
        let cfg = ConfigFile::parse(yaml).unwrap().validate().unwrap();
        let rs = cfg
            .resources
            .iter()
            .zip(api)
            .map(|(r, (kind, plural, namespaced))| ResolvedResource {
                api: ApiResource::from_gvk_with_plural(
                    &GroupVersionKind::gvk(&r.group, &r.version, kind),
                    plural,
                ),
                config: r.clone(),
                namespaced: *namespaced,
            })
            .collect();
        (cfg, rs)
    }

    fn doc(yaml: &str, api: &[(&str, &str, bool)]) -> Value {
        let (cfg, rs) = resolved(yaml, api);
        document(&cfg, &rs, "https://127.0.0.1:6443").unwrap()
    }

    const RESOURCES: &str = "resources:\n\
        - {apiVersion: v1, resource: configmaps, namespaces: [shop, web]}\n\
        - {apiVersion: v1, resource: secrets, namespaces: [vault], payload: reference}\n\
        - {apiVersion: v1, resource: nodes, tombstones: true, key: namespacedName}\n";
    /// [`RESOURCES`] without the Kafka-only settings.
    fn not_kafka() -> String {
        RESOURCES.replace(", tombstones: true, key: namespacedName", "")
    }

    const API: &[(&str, &str, bool)] = &[
        ("ConfigMap", "configmaps", true),
        ("Secret", "secrets", true),
        ("Node", "nodes", false),
    ];

    #[test]
    fn kafka_topics_are_channels_and_headers_are_the_encoders_attributes() {
        let yaml = format!(
            "cluster: dev\n{RESOURCES}sink: {{kafka: {{bootstrapServers: 'a:9092,b:9092', topic: 'k8s.{{cluster}}.all'}}}}\n"
        );
        let d = doc(&yaml, API);
        let channels = d["channels"].as_object().unwrap();
        assert_eq!(channels.len(), 1, "one shared topic, one channel");
        let channel = &channels["k8s.dev.all"];
        assert_eq!(channel["address"], "k8s.dev.all");
        assert_eq!(channel["bindings"]["kafka"]["topic"], "k8s.dev.all");
        let names: Vec<&String> = channel["messages"].as_object().unwrap().keys().collect();
        assert_eq!(
            names,
            [
                "v1.configmaps",
                "v1.nodes",
                "v1.nodes.tombstone",
                "v1.secrets"
            ]
        );
        let op = &d["operations"]["send.k8s.dev.all"];
        assert_eq!(op["action"], "send");
        assert_eq!(op["messages"].as_array().unwrap().len(), 4);

        let m = &d["components"]["messages"]["v1.configmaps"];
        let headers = m["headers"]["properties"].as_object().unwrap();
        let mut expected = vec!["content-type".to_string()];
        // Every attribute the encoder sets, plus those only some events carry.
        for name in [
            "specversion",
            "id",
            "source",
            "type",
            "subject",
            "time",
            "dataschema",
            "cluster",
            "apiversion",
            "kind",
            "resource",
            "namespace",
            "name",
            "uid",
            "resourceversion",
            "sequence",
            "partitionkey",
            "origin",
            "payload",
            "truncated",
            "manager",
            "operation",
            "clusterid",
        ] {
            expected.push(format!("ce_{name}"));
        }
        let mut found: Vec<String> = headers.keys().cloned().collect();
        found.sort();
        expected.sort();
        assert_eq!(found, expected);
        assert_eq!(headers["ce_namespace"]["enum"], json!(["shop", "web"]));
        assert_eq!(headers["ce_source"]["const"], "/k8s/dev/api/v1/configmaps");
        let required = m["headers"]["required"].as_array().unwrap();
        assert!(required.contains(&json!("ce_clusterid")));
        assert!(
            !required.contains(&json!("ce_manager")) && !required.contains(&json!("ce_truncated"))
        );
        assert_eq!(m["correlationId"]["location"], "$message.header#/ce_id");
        assert!(
            m["bindings"]["kafka"]["key"]["description"]
                .as_str()
                .unwrap()
                .contains("uid")
        );
        let nodes = &d["components"]["messages"]["v1.nodes"];
        assert!(
            nodes["headers"]["properties"].get("ce_namespace").is_none(),
            "cluster-scoped"
        );
        assert!(
            nodes["bindings"]["kafka"]["key"]["description"]
                .as_str()
                .unwrap()
                .contains("namespace/name")
        );
        assert_eq!(d["servers"]["kafka"]["host"], "a:9092,b:9092");
        assert!(
            d["components"]["schemas"]["CloudEvent"]
                .get("$schema")
                .is_none()
        );
    }

    #[test]
    fn per_object_templates_become_parameters() {
        let yaml = format!(
            "cluster: dev\n{}sink: {{nats: {{url: 'nats://u:hunter2@n1:4222', jetstream: {{stream: k8s}}}}}}\n",
            not_kafka()
        );
        let d = doc(&yaml, API);
        let addresses: Vec<&str> = d["channels"]
            .as_object()
            .unwrap()
            .values()
            .map(|c| c["address"].as_str().unwrap())
            .collect();
        assert_eq!(
            addresses,
            [
                "k8s.dev.core.configmaps.{namespace}.{name}",
                "k8s.dev.core.nodes._.{name}",
                "k8s.dev.core.secrets.vault.{name}",
            ]
        );
        let cm = &d["channels"]["k8s.dev.core.configmaps._namespace_._name_"];
        assert_eq!(
            cm["parameters"]["namespace"]["enum"],
            json!(["shop", "web"])
        );
        assert!(cm["parameters"]["name"]["description"].is_string());
        let text = d.to_string();
        assert!(!text.contains("hunter2"), "no credential from the URL");
        assert_eq!(d["servers"]["nats"]["host"], "n1:4222");
        let headers = &d["components"]["messages"]["v1.configmaps"]["headers"]["properties"];
        assert!(headers["Nats-Msg-Id"].is_object() && headers["ce-id"].is_object());
        assert!(
            d["components"]["messages"]
                .get("v1.nodes.tombstone")
                .is_none(),
            "Kafka only"
        );
    }

    #[test]
    fn structured_stdout_and_audit_off() {
        let yaml = format!("cluster: dev\n{}auditExtensions: false\n", not_kafka());
        let d = doc(&yaml, API);
        assert!(d.get("servers").is_none());
        let channel = &d["channels"]["stdout"];
        assert!(channel["address"].is_null());
        let m = &d["components"]["messages"]["v1.configmaps"];
        assert!(m.get("headers").is_none());
        assert_eq!(m["payload"]["allOf"][0]["$ref"], EVENT_SCHEMA_REF);
        let props = &m["payload"]["allOf"][1]["properties"];
        assert_eq!(props["kind"]["const"], "ConfigMap");
        assert!(props.get("clusterid").is_none() && props.get("manager").is_none());
        assert_eq!(m["examples"][0]["payload"]["kind"], "ConfigMap");
        let text = render(&d, false);
        assert!(text.starts_with("asyncapi: 3.0.0\ninfo:"), "{text}");
    }

    #[test]
    fn an_http_urls_query_string_never_appears() {
        let yaml = format!(
            "cluster: dev\n{}sink: {{http: {{url: 'https://hooks.example.com/k8s/{{resource}}?code=hunter2'}}}}\ncheckpoint: {{directory: /d}}\n",
            not_kafka()
        );
        let text = doc(&yaml, API).to_string();
        assert!(text.contains("/k8s/"), "{text}");
        assert!(
            !text.contains("hunter2") && !text.contains("code="),
            "{text}"
        );
    }

    #[test]
    fn security_schemes_name_the_mechanism_never_the_secret() {
        let yaml = format!(
            "cluster: dev\n{RESOURCES}sink: {{kafka: {{bootstrapServers: 'a:9093', properties: {{security.protocol: SASL_SSL, sasl.mechanisms: SCRAM-SHA-512, sasl.username: bridge, sasl.password: hunter2}}}}}}\n"
        );
        let d = doc(&yaml, API);
        assert_eq!(d["servers"]["kafka"]["protocol"], "kafka-secure");
        assert_eq!(
            d["components"]["securitySchemes"]["kafkaSaslScramSha512"]["type"],
            "scramSha512"
        );
        let text = d.to_string();
        assert!(
            !text.contains("hunter2") && !text.contains("\"bridge\""),
            "{text}"
        );
    }
}
