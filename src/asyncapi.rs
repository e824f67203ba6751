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
//!   binding's key; an example built by the bridge's own encoder; Kafka tombstones when on;
//! - **snapshot markers**: on every channel whose address names no object, the begin and end
//!   markers of a snapshot on demand ([`marker`]): structured CloudEvents described by
//!   `schemas/snapshot-marker.schema.json` (embedded as `components.schemas.SnapshotMarker`),
//!   Kafka's key the watch's id.

mod marker;
mod message;
mod server;

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::config::{Config, ContentMode};
use crate::discovery::ResolvedResource;
use crate::encode::{self, Event, ResourceInfo};
use crate::sink::describe::{self, Describe, Headers};

/// Errors of building the document.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The example event of a resource could not be encoded.
    #[error("cannot encode the example event")]
    Encode(#[source] encode::Error),
    /// An example payload is not JSON.
    #[error("the example payload is not JSON")]
    Example(#[source] serde_json::Error),
    /// The sink's kind is not registered with the sink layer.
    #[error(transparent)]
    Sink(#[from] crate::sink::Error),
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The AsyncAPI version of the document.
pub const ASYNCAPI_VERSION: &str = "3.0.0";

/// Where the embedded event schema lives in the document.
const EVENT_SCHEMA_REF: &str = "#/components/schemas/CloudEvent";

/// How events travel: what the sink says of itself.
#[derive(Clone, Copy)]
struct Binding<'a> {
    sink: &'a dyn Describe,
}

impl Binding<'_> {
    fn stdout(&self) -> bool {
        self.sink.bare()
    }

    fn structured(&self) -> bool {
        self.sink.content_mode() == ContentMode::Structured
    }

    /// The content type of a message's payload.
    fn content_type(&self) -> &'static str {
        describe::content_type(self.sink.content_mode())
    }

    /// The headers of one message (none on standard output).
    fn headers(&self, attributes: &[describe::Attribute], example: &Event) -> Option<Headers> {
        let attributes = if self.structured() {
            &[][..]
        } else {
            attributes
        };
        self.sink.headers(attributes, example)
    }

    /// The message bindings (Kafka's record key).
    fn message_bindings(&self, key: crate::config::RecordKey) -> Option<Value> {
        self.sink.message_bindings(key)
    }
}

/// One cluster a document describes, with its resources as discovery resolved them there.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    /// Its name; `None` for every cluster of the kubeconfig Secrets, whose names are known only
    /// to the running bridge: `{cluster}` is then a parameter of the channel addresses.
    pub cluster: Option<&'a str>,
    /// Its resources.
    pub resources: &'a [ResolvedResource],
    /// Its API server's URL (the `source` of Knative-format events); unused for `None`.
    pub api_server: &'a str,
}

/// The AsyncAPI document of `config`, whose resources discovery resolved to `resources`;
/// `api_server` is the API server's URL (the `source` of Knative-format events). For a fleet,
/// see [`fleet_document`].
pub fn document(
    config: &Config,
    resources: &[ResolvedResource],
    api_server: &str,
) -> Result<Value> {
    fleet_document(
        config,
        &[Member {
            cluster: Some(&config.cluster),
            resources,
            api_server,
        }],
    )
}

/// The AsyncAPI document of `config` publishing the events of `members`: in a fleet, the
/// channels of every cluster (its name rendered into `{cluster}`, or kept as a parameter for
/// the clusters of kubeconfig Secrets), and one message per cluster and resource, named
/// `<cluster>.<resource>` (`discovered.<resource>` for the Secrets' clusters).
pub fn fleet_document(config: &Config, members: &[Member<'_>]) -> Result<Value> {
    let settings = crate::sink::settings(&config.sink)?;
    let binding = Binding { sink: settings };
    let event_schema: Value =
        serde_json::from_str(&crate::schema::event_schema()).expect("the event schema is JSON");
    let descriptions = event_schema["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let groups = group_by_address(config, binding, members);
    let origins = server::Origins::of(
        groups.iter().filter_map(|(a, _)| a.as_deref()),
        config.sink.kind(),
        binding.sink,
    );
    let mut parts = Parts::default();
    for (address, published) in groups {
        let (server_id, address) = origins.split(address);
        let group = Group {
            server_id,
            address,
            published,
        };
        parts.add_channel(config, binding, &descriptions, group)?;
    }
    let mut components = components(binding, event_schema, parts.markers);
    components["messages"] = Value::Object(parts.messages);
    let mut doc = json!({
        "asyncapi": ASYNCAPI_VERSION,
        "info": info(config, members),
        "defaultContentType": encode::DATA_CONTENT_TYPE,
    });
    if let Some((servers, schemes)) = server::servers(binding.sink, &origins) {
        doc["servers"] = servers;
        if !schemes.is_empty() {
            components["securitySchemes"] = Value::Object(schemes);
        }
    }
    doc["channels"] = Value::Object(parts.channels);
    doc["operations"] = Value::Object(parts.operations);
    doc["components"] = components;
    Ok(doc)
}

/// Where the message trait every message refers to lives.
const TRAIT_REF: &str = "#/components/messageTraits/CloudEvent";

/// The resources published to one address, and the server it is on (HTTP).
struct Group<'a> {
    server_id: Option<String>,
    address: Option<String>,
    published: Vec<(Member<'a>, &'a ResolvedResource)>,
}

/// The channels, operations and messages of a document, as they are built.
#[derive(Default)]
struct Parts {
    channels: Map<String, Value>,
    operations: Map<String, Value>,
    messages: Map<String, Value>,
    /// Whether the snapshot markers' messages are among `messages`.
    markers: bool,
}

impl Parts {
    /// Adds the channel of `group`, its `send` operation and its messages.
    fn add_channel(
        &mut self,
        config: &Config,
        binding: Binding<'_>,
        descriptions: &Map<String, Value>,
        group: Group<'_>,
    ) -> Result<()> {
        let Group {
            server_id,
            address,
            published,
        } = group;
        let id = unique_id(
            &self.channels,
            &address.clone().unwrap_or_else(|| config.sink.kind().into()),
        );
        let mut channel_messages = Map::new();
        for (member, r) in &published {
            self.add_resource(
                config,
                binding,
                descriptions,
                (*member, *r),
                &mut channel_messages,
            )?;
        }
        if let Some((member, r)) = published.first()
            && marker::carried_by(&binding, address.as_deref())
        {
            self.add_markers(config, binding, (*member, *r), &mut channel_messages)?;
        }
        let refs: Vec<Value> = channel_messages
            .keys()
            .map(|m| json!({"$ref": format!("#/channels/{id}/messages/{m}")}))
            .collect();
        let resources: Vec<&ResolvedResource> = published.iter().map(|(_, r)| *r).collect();
        let mut channel = channel(
            config,
            binding,
            address.as_deref(),
            &resources,
            channel_messages,
        );
        if let Some(server_id) = server_id {
            channel["servers"] = json!([{"$ref": format!("#/servers/{server_id}")}]);
        }
        self.channels.insert(id.clone(), channel);
        self.operations
            .insert(format!("send.{id}"), operation(binding, &id, refs));
        Ok(())
    }

    /// Adds the message of one member's resource (and its tombstone) to the components and to
    /// `channel_messages`.
    fn add_resource(
        &mut self,
        config: &Config,
        binding: Binding<'_>,
        descriptions: &Map<String, Value>,
        (member, r): (Member<'_>, &ResolvedResource),
        channel_messages: &mut Map<String, Value>,
    ) -> Result<()> {
        let info = resource_info(config, member, r);
        let tombstones = info.tombstones && binding.sink.tombstones();
        let base = match (config.fleet.is_fleet(), member.cluster) {
            (false, _) => message_id(r),
            (true, Some(name)) => format!("{name}.{}", message_id(r)),
            (true, None) => format!("{DISCOVERED_ID}.{}", message_id(r)),
        };
        let name = unique_id(&self.messages, &base);
        let discovered = member.cluster.is_none();
        let m = message::message(&binding, r, info, discovered, descriptions, TRAIT_REF)?;
        self.messages.insert(name.clone(), m);
        channel_messages.insert(name.clone(), component_ref(&name));
        if tombstones {
            let tomb = format!("{name}.tombstone");
            self.messages.insert(tomb.clone(), message::tombstone(r));
            channel_messages.insert(tomb.clone(), component_ref(&tomb));
        }
        Ok(())
    }

    /// Adds the snapshot markers to `channel_messages`, and once to the components, their
    /// examples those of a snapshot of `r`.
    fn add_markers(
        &mut self,
        config: &Config,
        binding: Binding<'_>,
        (member, r): (Member<'_>, &ResolvedResource),
        channel_messages: &mut Map<String, Value>,
    ) -> Result<()> {
        if !self.markers {
            let info = resource_info(config, member, r);
            for (id, m) in marker::messages(&binding, &info, r, TRAIT_REF)? {
                self.messages.insert(id.into(), m);
            }
            self.markers = true;
        }
        for id in [marker::BEGIN_ID, marker::END_ID] {
            channel_messages.insert(id.into(), component_ref(id));
        }
        Ok(())
    }
}

/// A reference to the component message `name`.
fn component_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/messages/{name}")})
}

/// The events' shared part of `member`'s resource `r`, as in the examples.
fn resource_info(config: &Config, member: Member<'_>, r: &ResolvedResource) -> ResourceInfo {
    let (cluster, api_server) = match member.cluster {
        Some(name) => (name, member.api_server),
        None => (
            message::EXAMPLE_DISCOVERED_CLUSTER,
            message::EXAMPLE_DISCOVERED_API_SERVER,
        ),
    };
    let info = ResourceInfo::new(cluster, r, api_server);
    if config.audit_extensions {
        info.with_audit(message::example_cluster_id())
    } else {
        info
    }
}

/// The `components` object but its messages: the schemas (the event's, and the markers' when
/// `markers`) and the message trait.
fn components(binding: Binding<'_>, event_schema: Value, markers: bool) -> Value {
    let mut schemas = Map::new();
    schemas.insert(
        "CloudEvent".into(),
        embedded(event_schema, "schemas/event.schema.json"),
    );
    if markers {
        schemas.insert("SnapshotMarker".into(), marker::schema());
    }
    json!({
        "schemas": schemas,
        "messageTraits": {"CloudEvent": {
            "externalDocs": {
                "description": "The CloudEvents binding these messages follow",
                "url": binding.sink.spec_url(),
            },
            "tags": [{"name": "cloudevents"}, {"name": "kubernetes"}],
        }},
    })
}

/// The message ids of the clusters of kubeconfig Secrets start with this.
const DISCOVERED_ID: &str = "discovered";

fn info(config: &Config, members: &[Member<'_>]) -> Value {
    let (title, whose) = if config.fleet.is_fleet() {
        let named: Vec<String> = members
            .iter()
            .filter_map(|m| m.cluster)
            .map(|c| format!("`{c}`"))
            .collect();
        let mut whose = match named.len() {
            0 => String::new(),
            1 => format!("cluster {}", named[0]),
            _ => format!("clusters {}", named.join(", ")),
        };
        if let Some(s) = &config.fleet.secrets {
            if !whose.is_empty() {
                whose.push_str(" and ");
            }
            whose.push_str(&format!(
                "every cluster discovered from a kubeconfig Secret in namespace `{}`",
                s.namespace
            ));
        }
        let whose =
            format!("{whose}; each event's `cluster` attribute names the cluster it comes from");
        (
            format!("kube-event-bridge: fleet of {}", config.cluster),
            whose,
        )
    } else {
        (
            format!("kube-event-bridge: cluster {}", config.cluster),
            format!("cluster `{}`", config.cluster),
        )
    };
    json!({
        "title": title,
        "version": env!("CARGO_PKG_VERSION"),
        "description": format!(
            "Every add, update and delete of the watched Kubernetes resources of {whose}, \
             published by kube-event-bridge as a CloudEvent 1.0. Per object, events arrive in the \
             order the API server made the changes; an event may arrive twice with the same `id` \
             (deduplicate by `id`, keep state by `uid`, compare `sequence` within a uid). \
             Generated by `kube-event-bridge asyncapi` from the configuration, its resources \
             resolved through the API server's discovery."
        ),
        "license": {"name": "Apache-2.0", "url": "https://www.apache.org/licenses/LICENSE-2.0"},
        "externalDocs": {
            "description": "The event JSON Schema (schemas/event.schema.json)",
            "url": encode::DATA_SCHEMA,
        },
    })
}

/// A JSON Schema of `schemas/` (`file`) as an AsyncAPI Schema Object: the dialect and id
/// keywords removed (the document's own dialect applies; the `$id` is kept as the description's
/// link).
fn embedded(mut schema: Value, file: &str) -> Value {
    if let Some(map) = schema.as_object_mut() {
        map.remove("$schema");
        if let Some(id) = map.remove("$id") {
            map.insert(
                "externalDocs".into(),
                json!({"description": file, "url": id}),
            );
        }
    }
    schema
}

/// The resources of each member, with their member, grouped by channel address (`None`:
/// standard output), in member then configuration order.
type Groups<'a> = Vec<(Option<String>, Vec<(Member<'a>, &'a ResolvedResource)>)>;

fn group_by_address<'a>(
    config: &'a Config,
    binding: Binding<'_>,
    members: &[Member<'a>],
) -> Groups<'a> {
    let mut groups: Groups<'a> = Vec::new();
    for member in members {
        for r in member.resources {
            let mut values = r.template_values(member.cluster.unwrap_or(&config.cluster));
            if let (true, Some([namespace])) = (r.namespaced, r.config.namespaces.as_deref()) {
                values.namespace = Some(namespace);
            }
            let address = config.sink.destination().map(|t| {
                r.destination(t).address(
                    &values,
                    binding.sink.subject_addresses(),
                    namespace_parameter(r),
                    member.cluster.is_none(),
                )
            });
            match groups.iter_mut().find(|(a, _)| *a == address) {
                Some((_, published)) => published.push((*member, r)),
                None => groups.push((address, vec![(*member, r)])),
            }
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
    config: &Config,
    binding: Binding<'_>,
    address: Option<&str>,
    members: &[&ResolvedResource],
    messages: Map<String, Value>,
) -> Value {
    let labels: Vec<String> = members.iter().map(|r| r.label()).collect();
    let mut description = format!(
        "{}: the changes of {}.",
        binding.sink.channel_kind(),
        labels.join(", ")
    );
    if let Some(note) = binding.sink.channel_note() {
        description = format!("{description} {note}");
    }
    let mut channel = json!({
        "address": address,
        "title": labels.join(", "),
        "description": description,
        "messages": messages,
    });
    if let Some(address) = address {
        let parameters = parameters(config, address, binding, members);
        if !parameters.is_empty() {
            channel["parameters"] = Value::Object(parameters);
        }
        if let Some(bindings) = binding.sink.channel_bindings(address) {
            channel["bindings"] = bindings;
        }
    }
    channel
}

/// The parameters of a templated address: `{cluster}` (the clusters of kubeconfig Secrets),
/// `{namespace}` and `{name}`.
fn parameters(
    config: &Config,
    address: &str,
    binding: Binding<'_>,
    members: &[&ResolvedResource],
) -> Map<String, Value> {
    let safe = binding.sink.parameter_encoding();
    let mut out = Map::new();
    if address.contains("{cluster}") {
        let secrets = config.fleet.secrets.as_ref().map_or(String::new(), |s| {
            format!(" in namespace `{}`", s.namespace)
        });
        out.insert(
            "cluster".into(),
            json!({
                "description": format!(
                    "The name of a cluster discovered from a kubeconfig Secret{secrets} (a DNS \
                     label: the Secret's name without `-kubeconfig`, or its \
                     `cluster.x-k8s.io/cluster-name` label), the `cluster` attribute of its \
                     events. The clusters listed in the configuration have channels of their own."
                ),
                "examples": [message::EXAMPLE_DISCOVERED_CLUSTER],
            }),
        );
    }
    if address.contains("{namespace}") {
        let all = binding
            .sink
            .marker_tokens()
            .map_or(String::new(), |(_, all)| {
                format!(" `{all}` on the markers of a snapshot of every namespace.")
            });
        let mut p = json!({"description": format!(
            "The object's namespace, {safe}; `_` for cluster-scoped objects.{all}"
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
        let watch = binding
            .sink
            .marker_tokens()
            .map_or(String::new(), |(watch, _)| {
                format!(" `{watch}` (no object's name) on a snapshot's begin and end markers.")
            });
        out.insert(
            "name".into(),
            json!({"description": format!(
                "The object's name, {safe}. Different names can share a subject: identify \
                 objects by the `uid` (or `namespace` and `name`) attribute.{watch}"
            )}),
        );
    }
    out
}

/// The `send` operation of one channel.
fn operation(binding: Binding<'_>, channel: &str, messages: Vec<Value>) -> Value {
    let mut op = json!({
        "action": "send",
        "channel": {"$ref": format!("#/channels/{channel}")},
        "title": "Publish object changes",
        "summary": "The bridge publishes every add, update and delete of the channel's resources.",
        "description": format!(
            "Per object, in the order the API server made the changes; no order across objects. \
             Duplicates keep their id. {}",
            binding.sink.delivery()
        ),
        "messages": messages,
    });
    if let Some(bindings) = binding.sink.operation_bindings() {
        op["bindings"] = bindings;
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
    let ordered = Ordered(document);
    if json {
        serde_json::to_string_pretty(&ordered).expect("a document serializes") + "\n"
    } else {
        serde_saphyr::to_string(&ordered).expect("a document serializes")
    }
}

/// A JSON value serialized with the keys of each object in [`KEY_ORDER`], then by name.
struct Ordered<'a>(&'a Value);

impl Serialize for Ordered<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self.0 {
            Value::Object(map) => {
                let rank = |k: &str| KEY_ORDER.iter().position(|o| *o == k).unwrap_or(usize::MAX);
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)));
                let mut out = serializer.serialize_map(Some(keys.len()))?;
                for k in keys {
                    out.serialize_entry(k, &Ordered(&map[k]))?;
                }
                out.end()
            }
            Value::Array(items) => {
                let mut out = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    out.serialize_element(&Ordered(item))?;
                }
                out.end()
            }
            scalar => scalar.serialize(serializer),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigFile;
    use crate::demand::marker::{BEGIN, END};
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
    fn the_yaml_and_json_renderings_read_back_as_the_document() {
        for sink in [
            "sink: {kafka: {bootstrapServers: 'a:9092', topic: 'k8s.{cluster}.{resource}'}}\n",
            "sink: {nats: {url: 'nats://x', jetstream: {stream: s}}}\n",
            "sink: {http: {url: 'https://hooks.example.com/k8s/{resource}'}}\ncheckpoint: {directory: /d}\n",
        ] {
            let resources = if sink.contains("kafka") {
                RESOURCES.to_string()
            } else {
                not_kafka()
            };
            let d = doc(&format!("cluster: dev\n{resources}{sink}"), API);
            let yaml: Value = serde_saphyr::from_str(&render(&d, false)).unwrap();
            assert_eq!(yaml, d, "{sink}");
            let json: Value = serde_json::from_str(&render(&d, true)).unwrap();
            assert_eq!(json, d, "{sink}");
        }
    }

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
                "snapshot.begin",
                "snapshot.end",
                "v1.configmaps",
                "v1.nodes",
                "v1.nodes.tombstone",
                "v1.secrets"
            ]
        );
        let op = &d["operations"]["send.k8s.dev.all"];
        assert_eq!(op["action"], "send");
        assert_eq!(op["messages"].as_array().unwrap().len(), 6);

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
            "snapshotid",
            "payload",
            "truncated",
            "manager",
            "operation",
            "clusterid",
            "traceparent",
            "tracestate",
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
        assert!(required.contains(&json!("ce_traceparent")));
        assert!(
            !required.contains(&json!("ce_manager")) && !required.contains(&json!("ce_truncated"))
        );
        assert!(!required.contains(&json!("ce_tracestate")));
        assert!(!required.contains(&json!("ce_snapshotid")));
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
    fn snapshot_markers_are_on_every_channel_whose_address_names_no_object() {
        let kafka = doc(
            &format!(
                "cluster: dev\n{RESOURCES}sink: {{kafka: {{bootstrapServers: 'a:9092', topic: 'k8s.{{cluster}}.{{resource}}'}}}}\n"
            ),
            API,
        );
        for channel in kafka["channels"].as_object().unwrap().values() {
            let messages = channel["messages"].as_object().unwrap();
            assert!(
                messages.contains_key(marker::BEGIN_ID) && messages.contains_key(marker::END_ID),
                "{channel}"
            );
        }
        let messages = &kafka["components"]["messages"];
        for (id, kind) in [(marker::BEGIN_ID, BEGIN), (marker::END_ID, END)] {
            let m = &messages[id];
            assert_eq!(m["payload"]["allOf"][0]["$ref"], marker::SCHEMA_REF);
            assert_eq!(
                m["payload"]["allOf"][1]["properties"]["type"]["const"],
                kind
            );
            assert_eq!(
                m["headers"]["properties"]["content-type"]["const"],
                encode::STRUCTURED_CONTENT_TYPE,
                "structured whatever the content mode"
            );
            let key = m["bindings"]["kafka"]["key"]["description"]
                .as_str()
                .unwrap();
            assert!(key.contains("marker's id"), "{key}");
            let example = &m["examples"][0]["payload"];
            assert_eq!(example["type"], kind);
            let parsed: crate::schema::SnapshotMarker = serde_json::from_value(example.clone())
                .unwrap_or_else(|e| panic!("{id}: the example is not a marker: {e}"));
            assert_eq!(parsed.snapshotid, example["snapshotid"]);
        }
        let schema = kafka["components"]["schemas"]["SnapshotMarker"].to_string();
        assert!(
            !schema.contains("$ref") && !schema.contains("$defs"),
            "self-contained: {schema}"
        );

        let nats = doc(
            &format!(
                "cluster: dev\n{}sink: {{nats: {{url: 'nats://x', jetstream: {{stream: s}}}}}}\n",
                not_kafka()
            ),
            API,
        );
        // Every subject names its object, and the markers take `_watch` (and `_all`) there.
        let begin = &nats["components"]["messages"][marker::BEGIN_ID];
        let headers = &begin["headers"]["properties"];
        assert!(headers["Nats-Msg-Id"].is_object(), "{begin}");
        assert_eq!(
            begin["examples"][0]["headers"]["Nats-Msg-Id"], begin["examples"][0]["payload"]["id"],
            "a marker's Nats-Msg-Id is its id"
        );
        assert!(nats["components"]["schemas"]["SnapshotMarker"].is_object());
        for channel in nats["channels"].as_object().unwrap().values() {
            assert!(channel["messages"][marker::END_ID].is_object(), "{channel}");
            let name = channel["parameters"]["name"]["description"]
                .as_str()
                .unwrap();
            assert!(name.contains("`_watch`"), "{name}");
        }

        let stdout = doc(&format!("cluster: dev\n{}", not_kafka()), API);
        let m = &stdout["components"]["messages"][marker::END_ID];
        assert!(m.get("headers").is_none(), "{m}");
        assert_eq!(m["examples"][0]["payload"]["data"]["result"], "complete");
        assert!(stdout["channels"]["stdout"]["messages"][marker::END_ID].is_object());
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
        assert!(text.starts_with("asyncapi: \"3.0.0\"\ninfo:"), "{text}");
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

    const FLEET: &str = "cluster: hub\n\
        clusters: [{name: hub}, {name: east, kubeconfig: /k/east}]\n\
        clusterSecrets: {namespace: fleet}\n\
        resources:\n\
        - {apiVersion: v1, resource: configmaps}\n\
        - {apiVersion: v1, resource: pods, clusters: [east]}\n";

    /// A fleet's document: hub's configmaps, east's configmaps and pods, the Secrets' clusters'
    /// configmaps.
    fn fleet_doc(sink: &str) -> Value {
        let yaml = format!("{FLEET}{sink}");
        let (cfg, rs) = resolved(
            &yaml,
            &[("ConfigMap", "configmaps", true), ("Pod", "pods", true)],
        );
        let hub = vec![rs[0].clone()];
        let discovered = vec![rs[0].clone()];
        let members = [
            Member {
                cluster: Some("hub"),
                resources: &hub,
                api_server: "https://hub:6443",
            },
            Member {
                cluster: Some("east"),
                resources: &rs,
                api_server: "https://east:6443",
            },
            Member {
                cluster: None,
                resources: &discovered,
                api_server: "",
            },
        ];
        fleet_document(&cfg, &members).unwrap()
    }

    #[test]
    fn a_fleet_has_each_cluster_s_channels_and_a_cluster_parameter_for_the_secrets() {
        let d = fleet_doc(
            "sink: {kafka: {bootstrapServers: 'a:9092', topic: 'k8s.{cluster}.{resource}'}}\n",
        );
        let addresses: Vec<&str> = d["channels"]
            .as_object()
            .unwrap()
            .values()
            .map(|c| c["address"].as_str().unwrap())
            .collect();
        assert_eq!(
            addresses,
            [
                "k8s.{cluster}.configmaps",
                "k8s.east.configmaps",
                "k8s.east.pods",
                "k8s.hub.configmaps",
            ]
        );
        let any = &d["channels"]["k8s._cluster_.configmaps"];
        let parameter = &any["parameters"]["cluster"];
        assert!(
            parameter["description"]
                .as_str()
                .unwrap()
                .contains("kubeconfig Secret in namespace `fleet`"),
            "{parameter}"
        );
        assert!(any.get("bindings").is_none(), "no one topic to bind: {any}");
        let messages = d["components"]["messages"].as_object().unwrap();
        let names: Vec<&String> = messages.keys().collect();
        assert_eq!(
            names,
            [
                "discovered.v1.configmaps",
                "east.v1.configmaps",
                "east.v1.pods",
                "hub.v1.configmaps",
                "snapshot.begin",
                "snapshot.end"
            ]
        );
        let east = &messages["east.v1.configmaps"]["headers"]["properties"];
        assert_eq!(east["ce_cluster"]["const"], "east");
        assert_eq!(east["ce_source"]["const"], "/k8s/east/api/v1/configmaps");
        assert!(
            east["ce_cluster"]["description"]
                .as_str()
                .unwrap()
                .contains("in a fleet the name of the member"),
            "{}",
            east["ce_cluster"]
        );
        let discovered = &messages["discovered.v1.configmaps"];
        let headers = &discovered["headers"]["properties"];
        assert!(headers["ce_cluster"].get("const").is_none());
        assert_eq!(
            headers["ce_cluster"]["pattern"],
            "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
        );
        assert_eq!(
            headers["ce_source"]["pattern"],
            "^/k8s/[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/api/v1/configmaps$"
        );
        let example = &discovered["examples"][0]["headers"];
        assert_eq!(example["ce_cluster"], "workload-1");
        assert!(
            discovered["summary"]
                .as_str()
                .unwrap()
                .contains("in a cluster discovered from a kubeconfig Secret"),
            "{}",
            discovered["summary"]
        );
        let info = d["info"]["description"].as_str().unwrap();
        assert!(
            info.contains("clusters `hub`, `east` and every cluster discovered from a kubeconfig Secret in namespace `fleet`"),
            "{info}"
        );
        assert_eq!(d["info"]["title"], "kube-event-bridge: fleet of hub");
        let yaml: Value = serde_saphyr::from_str(&render(&d, false)).unwrap();
        assert_eq!(yaml, d);
    }

    #[test]
    fn a_destination_without_the_cluster_is_one_channel_with_every_cluster_s_messages() {
        let d = fleet_doc(
            "sink: {nats: {url: 'nats://x', subject: 'k8s.{resource}.{namespace}.{name}', jetstream: {stream: s}}}\n",
        );
        let channels = d["channels"].as_object().unwrap();
        let addresses: Vec<&str> = channels
            .values()
            .map(|c| c["address"].as_str().unwrap())
            .collect();
        assert_eq!(
            addresses,
            [
                "k8s.configmaps.{namespace}.{name}",
                "k8s.pods.{namespace}.{name}"
            ]
        );
        let cm = &channels["k8s.configmaps._namespace_._name_"];
        let names: Vec<&String> = cm["messages"].as_object().unwrap().keys().collect();
        assert_eq!(
            names,
            [
                "discovered.v1.configmaps",
                "east.v1.configmaps",
                "hub.v1.configmaps",
                marker::BEGIN_ID,
                marker::END_ID,
            ]
        );
        assert!(cm["parameters"].get("cluster").is_none());
    }

    #[test]
    fn knative_sources_of_the_secrets_clusters_are_any_url() {
        let yaml = format!(
            "{}sink: {{nats: {{url: 'nats://x', jetstream: {{stream: s}}}}}}\neventFormat: knative\n",
            FLEET
        );
        let (cfg, rs) = resolved(
            &yaml,
            &[("ConfigMap", "configmaps", true), ("Pod", "pods", true)],
        );
        let d = fleet_document(
            &cfg,
            &[Member {
                cluster: None,
                resources: &rs[..1],
                api_server: "",
            }],
        )
        .unwrap();
        let headers =
            &d["components"]["messages"]["discovered.v1.configmaps"]["headers"]["properties"];
        assert!(
            headers["ce-source"].get("const").is_none(),
            "{}",
            headers["ce-source"]
        );
        assert!(
            headers["ce-source"].get("pattern").is_none(),
            "{}",
            headers["ce-source"]
        );
    }
}
