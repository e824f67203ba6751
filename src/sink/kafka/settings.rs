//! The `sink.kafka` section: its settings as written, their defaults and validation (no
//! property may weaken delivery or replace one the bridge sets), and what the rest of the bridge
//! asks of a Kafka sink: its connection, its plan line, and what `tail` subscribes to.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use futures::future::BoxFuture;
use rdkafka::consumer::{Consumer, StreamConsumer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{KafkaSink, check_brokers, consumer_config};
use crate::config::{
    COMMIT_INTERVAL_MS, CheckpointSupport, ContentMode, Context, ResourceFields, Section, SinkKind,
    SinkSettings, TRANSACTION_TIMEOUT_SECS, parse_section, parse_template,
};
use crate::discovery::ResolvedResource;
use crate::sink::decode::NotCloudEvent;
use crate::sink::{AnySink, Error, Messages, Result, Scope, Settings};
use crate::template::{self, Template, Values};

crate::sink::register!(
    Kafka,
    SinkKind {
        name: "kafka",
        description: "Publish to Apache Kafka.",
        default: false,
        schema: |g| g.subschema_for::<KafkaConfig>(),
        parse: Kafka::parse,
        from_environment: SinkKind::no_environment,
    }
);

/// Kafka sink settings.
#[derive(Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KafkaConfig {
    /// Comma-separated `host:port` list.
    pub bootstrap_servers: String,
    /// Topic template; tokens `{cluster}`, `{group}` (`core` for the core group), `{version}`,
    /// `{resource}`, `{namespace}` (`_` for cluster-scoped objects).
    #[serde(default = "default_topic")]
    pub topic: String,
    /// `binary` (attributes as `ce_` headers) or `structured` (one JSON document).
    #[serde(default)]
    pub content_mode: ContentMode,
    /// Passed to librdkafka as-is (compression, TLS, SASL, ...). Settings that would weaken
    /// delivery (`enable.idempotence`, `acks`) are refused.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// librdkafka properties whose values are read from files at start (mounted Secrets), for
    /// secrets such as `sasl.password`: property name to path. The whole file is the value,
    /// without its trailing line break.
    #[serde(default)]
    pub property_files: BTreeMap<String, PathBuf>,
    /// With checkpoints on, events and checkpoints are written in transactions; the broker
    /// aborts one left open longer than this (`transaction.timeout.ms`). Transactions are
    /// committed at least every `checkpoint.intervalMs`, lists included, so this only matters
    /// while the broker is unreachable (the bridge then aborts and sends again). At most the
    /// broker's `transaction.max.timeout.ms` (default 900).
    #[serde(default = "default_transaction_timeout_secs")]
    #[schemars(range(min = TRANSACTION_TIMEOUT_SECS.min, max = TRANSACTION_TIMEOUT_SECS.max))]
    pub transaction_timeout_secs: u64,
    /// With checkpoints on: the least time between the starts of two transaction commits of one
    /// watch. A watch commits as soon as its previous commit has completed, events are pending
    /// and this much time has passed, each commit carrying the checkpoint of what it holds; a
    /// `read_committed` consumer sees an event once the commit holding it has completed. Larger
    /// values mean fewer, larger transactions and checkpoint writes, and less CPU per event (a
    /// commit costs the same CPU whatever it holds).
    #[serde(default = "default_commit_interval_ms")]
    #[schemars(range(min = COMMIT_INTERVAL_MS.min, max = COMMIT_INTERVAL_MS.max))]
    pub commit_interval_ms: u64,
}

fn default_topic() -> String {
    "k8s.{cluster}.{group}.{resource}".into()
}

/// librdkafka's default.
const fn default_transaction_timeout_secs() -> u64 {
    60
}

/// Events visible to `read_committed` consumers within a few tens of milliseconds, at most
/// twenty commits per second (docs/benchmarks.md, "Figures behind defaults").
const fn default_commit_interval_ms() -> u64 {
    50
}

/// Properties whose values are secrets: shown as `<redacted>` by `Debug`.
const SECRET_PROPERTIES: &[&str] = &[
    "sasl.password",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.config",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl.keystore.password",
];

impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let properties: BTreeMap<&str, &str> = self
            .properties
            .iter()
            .map(|(k, v)| {
                let secret = SECRET_PROPERTIES.contains(&k.as_str())
                    || k.contains("password")
                    || k.contains("secret");
                (k.as_str(), if secret { "<redacted>" } else { v.as_str() })
            })
            .collect();
        f.debug_struct("KafkaConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("topic", &self.topic)
            .field("content_mode", &self.content_mode)
            .field("properties", &properties)
            .field("property_files", &self.property_files)
            .field("transaction_timeout_secs", &self.transaction_timeout_secs)
            .field("commit_interval_ms", &self.commit_interval_ms)
            .finish()
    }
}

/// Properties that must keep the values the delivery guarantees depend on, with the values that
/// keep them (`acks=-1` is librdkafka's other spelling of `all`).
const GUARDED: &[(&str, &[&str])] = &[("enable.idempotence", &["true"]), ("acks", &["all", "-1"])];

/// The sink's properties: none may weaken delivery or replace what the bridge sets itself.
fn check_properties(kafka: &KafkaConfig, errors: &mut Vec<String>) {
    if kafka.bootstrap_servers.trim().is_empty() {
        errors.push("sink.kafka.bootstrapServers: must not be empty".into());
    }
    for (key, accepted) in GUARDED {
        if let Some(v) = kafka.properties.get(*key)
            && !accepted.contains(&v.as_str())
        {
            errors.push(format!(
                "sink.kafka.properties.{key}: {v:?} would weaken delivery; the bridge requires {:?}",
                accepted[0]
            ));
        }
    }
    if kafka
        .properties
        .keys()
        .chain(kafka.property_files.keys())
        .any(|k| k == "transactional.id" || k == "transaction.timeout.ms")
    {
        errors.push(
            "sink.kafka.properties: transactional.id and transaction.timeout.ms are set by the bridge (per watch; sink.kafka.transactionTimeoutSecs)"
                .into(),
        );
    }
    if kafka.properties.contains_key("bootstrap.servers") {
        errors.push(
            "sink.kafka.properties.bootstrap.servers: set sink.kafka.bootstrapServers instead"
                .into(),
        );
    }
    for (key, path) in &kafka.property_files {
        let at = format!("sink.kafka.propertyFiles.{key}");
        if kafka.properties.contains_key(key) {
            errors.push(format!(
                "{at}: also set in sink.kafka.properties; set it in one place"
            ));
        }
        if key == "bootstrap.servers" || GUARDED.iter().any(|(k, _)| k == key) {
            errors.push(format!(
                "{at}: the bridge sets this property itself; it cannot come from a file"
            ));
        }
        if path.as_os_str().is_empty() {
            errors.push(format!("{at}: the path must not be empty"));
        }
    }
}

/// The validated Kafka sink.
#[derive(Debug, Clone)]
pub struct Kafka {
    /// Settings.
    pub config: KafkaConfig,
    /// The parsed topic template.
    pub topic: Template,
}

impl Kafka {
    fn parse(
        section: Section,
        context: &Context<'_>,
        errors: &mut Vec<String>,
    ) -> Option<crate::config::Sink> {
        let config: KafkaConfig = parse_section("kafka", section, errors)?;
        check_properties(&config, errors);
        TRANSACTION_TIMEOUT_SECS.check(
            "sink.kafka.transactionTimeoutSecs",
            config.transaction_timeout_secs,
            errors,
        );
        let commit = config.commit_interval_ms;
        COMMIT_INTERVAL_MS.check("sink.kafka.commitIntervalMs", commit, errors);
        check_names(&config, context, errors);
        let topic = parse_topic("sink.kafka.topic", &config.topic, context.cluster, errors)?;
        Some(Arc::new(Kafka { config, topic }))
    }
}

/// Parses a topic template at `at` (the sink's, or a resource's `topic`): its renderings in
/// cluster `cluster` must be legal Kafka topic names, and `{name}` is refused, as one topic per
/// object does not scale.
fn parse_topic(at: &str, text: &str, cluster: &str, errors: &mut Vec<String>) -> Option<Template> {
    let topic = parse_template(at, text, |t| t.check_topic(cluster), errors)?;
    if topic.uses(template::Token::Name) {
        errors.push(format!(
            "{at}: {{name}} is not allowed here: one topic per object does not scale"
        ));
        return None;
    }
    Some(topic)
}

/// A transaction is committed at every checkpoint, so it must outlast two intervals; the
/// heartbeat destination and the checkpoint topic are topic names as they are.
fn check_names(config: &KafkaConfig, context: &Context<'_>, errors: &mut Vec<String>) {
    if let Some(checkpoint) = context.checkpoint {
        let timeout = config.transaction_timeout_secs;
        let interval = checkpoint.interval_ms;
        if interval.saturating_mul(2) > timeout.saturating_mul(1000) {
            errors.push(format!(
                "sink.kafka.transactionTimeoutSecs: {timeout} s must be at least twice checkpoint.intervalMs ({interval} ms): a transaction is committed at every checkpoint"
            ));
        }
        if let Err(e) = template::check_topic_name(checkpoint.kafka_topic) {
            errors.push(format!("checkpoint.kafkaTopic: {e}"));
        }
    }
    if let Some(Err(e)) = context.heartbeat.map(template::check_topic_name) {
        errors.push(format!("heartbeat.destination: {e}"));
    }
}

impl SinkSettings for Kafka {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    fn destination(&self) -> Option<&Template> {
        Some(&self.topic)
    }

    fn resource_fields(&self) -> ResourceFields {
        ResourceFields {
            destination: Some("topic"),
            keys: true,
        }
    }

    fn parse_destination(
        &self,
        at: &str,
        text: &str,
        cluster: &str,
        errors: &mut Vec<String>,
    ) -> Option<Template> {
        parse_topic(at, text, cluster, errors)
    }

    fn checkpoints(&self) -> CheckpointSupport {
        CheckpointSupport::Own
    }

    /// The `propertyFiles`, and the files librdkafka reads (`ssl.ca.location`, ...).
    fn secret_files(&self) -> Vec<PathBuf> {
        let locations = self.config.properties.iter();
        let locations = locations.filter(|(k, _)| k.ends_with(".location"));
        let locations = locations.map(|(_, v)| PathBuf::from(v));
        let files = self.config.property_files.values().cloned();
        locations.chain(files).collect()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Settings for Kafka {
    fn connect(&self) -> BoxFuture<'_, Result<Arc<AnySink>>> {
        Box::pin(async move {
            check_brokers(&self.config).await?;
            let sink = KafkaSink::new(&self.config, self.topic.clone())?;
            Ok(Arc::new(sink) as Arc<AnySink>)
        })
    }

    fn plan(&self, cluster: &str, r: &ResolvedResource) -> String {
        let topic = r.destination(&self.topic);
        if topic.per_object() {
            format!("kafka topic {topic} (per namespace)")
        } else {
            let values = r.template_values(cluster);
            format!("kafka topic {}", topic.render_topic(&values))
        }
    }

    fn subscribe<'a>(
        &'a self,
        scopes: &'a [Scope<'a>],
        from_beginning: bool,
    ) -> BoxFuture<'a, Result<Messages>> {
        Box::pin(async move {
            let failed = |e: rdkafka::error::KafkaError| Error::Subscribe {
                kind: "kafka",
                reason: e.to_string(),
            };
            let mut c = consumer_config(&self.config)?;
            c.set(
                "group.id",
                format!("kube-event-bridge-tail-{}", std::process::id()),
            )
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set(
                "auto.offset.reset",
                if from_beginning { "earliest" } else { "latest" },
            );
            if scopes.iter().any(|s| s.cluster.is_none()) {
                // The topics of a cluster whose Secret appears while tailing are matched by
                // the pattern once librdkafka refreshes its metadata: soon, rather than after
                // its default 5 minutes.
                c.set(
                    "topic.metadata.refresh.interval.ms",
                    NEW_TOPICS_REFRESH_MS.to_string(),
                );
            }
            let consumer: StreamConsumer = c.create().map_err(failed)?;
            let pattern = topic_pattern(&self.topic, scopes);
            consumer.subscribe(&[pattern.as_str()]).map_err(failed)?;
            let messages = futures::stream::unfold(consumer, |consumer| async move {
                let decoded = match consumer.recv().await {
                    Ok(m) => decode(&m).map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                Some((decoded, consumer))
            });
            Ok(messages.boxed())
        })
    }
}

/// How often `tail` refreshes the topic list when its pattern has a cluster wildcard.
const NEW_TOPICS_REFRESH_MS: u32 = 10_000;

/// A librdkafka subscription regex (`^...`) matching every topic the template yields for the
/// resources of each scope; a scope of every cluster (`cluster: None`) matches any DNS label
/// where the topic has `{cluster}`.
pub fn topic_pattern(topic: &Template, scopes: &[Scope<'_>]) -> String {
    // Markers that survive topic rendering unchanged, then become the namespace and cluster
    // patterns.
    const NS: &str = "KEBNAMESPACEMARKER";
    const CLUSTER: &str = "KEBCLUSTERMARKER";
    let mut alternatives: Vec<String> = Vec::new();
    for scope in scopes {
        for r in scope.resources {
            let rendered = r.destination(topic).render_topic(&Values {
                namespace: Some(NS),
                ..r.template_values(scope.cluster.unwrap_or(CLUSTER))
            });
            let alternative = rendered
                .split(NS)
                .map(|part| {
                    part.split(CLUSTER)
                        .map(regex_escape)
                        .collect::<Vec<_>>()
                        .join("[a-z0-9-]+")
                })
                .collect::<Vec<_>>()
                .join("[A-Za-z0-9_-]+");
            if !alternatives.contains(&alternative) {
                alternatives.push(alternative);
            }
        }
    }
    format!("^({})$", alternatives.join("|"))
}

fn regex_escape(s: &str) -> String {
    s.chars().fold(String::new(), |mut out, c| {
        if !c.is_ascii_alphanumeric() && c != '_' {
            out.push('\\');
        }
        out.push(c);
        out
    })
}

/// Decodes a Kafka record as the Kafka sink writes it (`ce_` headers in binary mode).
pub fn decode<M: rdkafka::Message>(
    m: &M,
) -> std::result::Result<cloudevents::Event, NotCloudEvent> {
    use rdkafka::message::Headers;
    let mut pairs = Vec::new();
    if let Some(h) = m.headers() {
        for header in h.iter() {
            let value = header.value.and_then(|v| std::str::from_utf8(v).ok());
            pairs.push((header.key, value.unwrap_or_default()));
        }
    }
    crate::sink::decode::decode(pairs, m.payload().unwrap_or_default(), "ce_")
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::{ConfigFile, invalid};

    #[test]
    fn topics_the_sink_and_each_resource_name_are_checked() {
        let kafka = "sink: {kafka: {bootstrapServers: 'x:1', topic: 'TOPIC'}}";
        let resources = "resources:\n- {apiVersion: v1, resource: pods}\n- {apiVersion: v1, resource: configmaps}\n- {apiVersion: v1, resource: secrets, topic: 'OVERRIDE'}\n";
        // A resource's topic is checked by the sink's rules once the sink itself is valid.
        let e = invalid(&format!(
            "cluster: dev\n{}{}\n",
            resources.replace("OVERRIDE", "cm/{resource}"),
            kafka.replace("TOPIC", "k8s.{resource}")
        ));
        assert!(
            e.contains("resources[2].topic: \"cm/\" contains '/'"),
            "{e}"
        );
        let e = invalid(&format!(
            "cluster: dev\n{}{}\n",
            resources.replace("OVERRIDE", "cm.{name}"),
            kafka.replace("TOPIC", "k8s.{resource}")
        ));
        assert!(
            e.contains("resources[2].topic: {name} is not allowed here: one topic per object"),
            "{e}"
        );
        for (topic, needle) in [
            (
                "k8s events.{resource}",
                "sink.kafka.topic: \"k8s events.\" contains ' ': a Kafka topic name",
            ),
            (
                "..",
                "sink.kafka.topic: \"..\" is not a legal Kafka topic name",
            ),
            (
                &format!("{}{{cluster}}", "t".repeat(247)),
                "sink.kafka.topic: renders to at least 250 characters",
            ),
            ("k8s.{name}", "sink.kafka.topic: {name} is not allowed here"),
        ] {
            let e = invalid(&format!(
                "cluster: dev\nresources: [{{apiVersion: v1, resource: pods}}]\n{}\n",
                kafka.replace("TOPIC", topic)
            ));
            assert!(e.contains(needle), "{e}");
        }
    }

    #[test]
    fn kafka_guarded_properties_are_refused() {
        let e = invalid(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nsink:\n  kafka:\n    bootstrapServers: x:1\n    properties: {acks: \"1\"}\n",
        );
        assert!(e.contains("sink.kafka.properties.acks"), "{e}");
    }

    #[test]
    fn kafka_property_files_are_checked_and_debug_shows_no_secret() {
        let base = "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nsink:\n  kafka:\n    bootstrapServers: x:1\n";
        let cfg = ConfigFile::parse(&format!(
            "{base}    properties: {{sasl.username: bridge, ssl.key.password: hunter2}}\n    propertyFiles: {{sasl.password: /etc/kafka/password}}\n"
        ))
        .unwrap()
        .validate()
        .unwrap();
        let Kafka { config, .. } = cfg.sink.as_any().downcast_ref().expect("a kafka sink");
        assert_eq!(
            config.property_files["sasl.password"],
            Path::new("/etc/kafka/password")
        );
        let debug = format!("{cfg:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(
            debug.contains("\"ssl.key.password\": \"<redacted>\""),
            "{debug}"
        );
        assert!(debug.contains("\"sasl.username\": \"bridge\""), "{debug}");
        assert!(debug.contains("/etc/kafka/password"), "{debug}");

        let e = invalid(&format!(
            "{base}    properties: {{sasl.password: x}}\n    propertyFiles: {{sasl.password: /p, acks: /a, bootstrap.servers: /b, sasl.username: ''}}\n"
        ));
        for needle in [
            "sink.kafka.propertyFiles.sasl.password: also set in sink.kafka.properties",
            "sink.kafka.propertyFiles.acks: the bridge sets this property itself",
            "sink.kafka.propertyFiles.bootstrap.servers: the bridge sets this property itself",
            "sink.kafka.propertyFiles.sasl.username: the path must not be empty",
        ] {
            assert!(e.contains(needle), "missing {needle:?} in {e}");
        }
    }

    #[test]
    fn acks_minus_one_is_all() {
        ConfigFile::parse(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nsink:\n  kafka:\n    bootstrapServers: x:1\n    properties: {acks: \"-1\"}\n",
        )
        .unwrap()
        .validate()
        .unwrap();
    }

    /// A config's resources resolved by hand as `(kind, plural)` of the core group, namespaced.
    fn resolved(yaml: &str, api: &[(&str, &str)]) -> Vec<ResolvedResource> {
        let cfg = ConfigFile::parse(yaml).unwrap().validate().unwrap();
        cfg.resources
            .into_iter()
            .zip(api)
            .map(|(r, (kind, plural))| ResolvedResource {
                api: kube::core::ApiResource::from_gvk_with_plural(
                    &kube::core::GroupVersionKind::gvk(&r.group, &r.version, kind),
                    plural,
                ),
                config: r,
                namespaced: true,
            })
            .collect()
    }

    #[test]
    fn the_pattern_covers_each_cluster_and_any_cluster_of_the_secrets_once() {
        let yaml = "cluster: hub\n\
            clusters: [{name: hub}, {name: east, kubeconfig: /k}]\n\
            clusterSecrets: {namespace: fleet}\n\
            resources:\n\
            - {apiVersion: v1, resource: configmaps}\n\
            - {apiVersion: v1, resource: secrets, topic: 'audit.{namespace}'}\n\
            sink: {kafka: {bootstrapServers: 'x:1', topic: 'k8s.{cluster}.{resource}'}}\n";
        let cfg = ConfigFile::parse(yaml).unwrap().validate().unwrap();
        let Kafka { topic, .. } = cfg.sink.as_any().downcast_ref().expect("a kafka sink");
        let rs = resolved(yaml, &[("ConfigMap", "configmaps"), ("Secret", "secrets")]);
        let scopes = [
            Scope {
                cluster: Some("hub"),
                resources: &rs,
            },
            Scope {
                cluster: Some("east"),
                resources: &rs,
            },
            Scope {
                cluster: None,
                resources: &rs,
            },
        ];
        let pattern = topic_pattern(topic, &scopes);
        assert_eq!(
            pattern,
            "^(k8s\\.hub\\.configmaps|audit\\.[A-Za-z0-9_-]+|k8s\\.east\\.configmaps|k8s\\.[a-z0-9-]+\\.configmaps)$",
            "a topic without {{cluster}} is one alternative for every cluster"
        );
        let single = topic_pattern(topic, &scopes[..1]);
        assert_eq!(single, "^(k8s\\.hub\\.configmaps|audit\\.[A-Za-z0-9_-]+)$");
    }

    #[test]
    fn bad_topic_token_is_named() {
        let e = invalid(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nsink: {kafka: {bootstrapServers: 'x:1', topic: 'k8s.{clutser}'}}\n",
        );
        assert!(
            e.contains("sink.kafka.topic: unknown token {clutser}"),
            "{e}"
        );
    }
}
