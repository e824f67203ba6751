//! The `sink.nats` section: its settings as written, their defaults and validation, and what the
//! rest of the bridge asks of a NATS sink: its connection, its plan line, and what `tail`
//! subscribes to.

use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{NatsSink, connect_client};
use crate::config::{
    ACK_TIMEOUT_SECS, CheckpointSupport, ContentMode, Context, DUPLICATE_WINDOW_SECS,
    NatsCredentials, ResourceFields, Section, SinkKind, SinkSettings, is_nats_name, parse_section,
    parse_template,
};
use crate::discovery::ResolvedResource;
use crate::sink::decode::NotCloudEvent;
use crate::sink::{AnySink, Error, Messages, Result, Scope, Settings};
use crate::template::{self, Template};

crate::sink::register!(
    Nats,
    SinkKind {
        name: "nats",
        description: "Publish to NATS (JetStream or core).",
        default: false,
        schema: |g| g.subschema_for::<NatsConfig>(),
        parse: Nats::parse,
        from_environment: SinkKind::no_environment,
    }
);

/// NATS sink settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NatsConfig {
    /// Server URL(s), comma-separated.
    pub url: String,
    /// Subject template; tokens as for Kafka topics plus `{name}`, each made subject-safe.
    #[serde(default = "default_subject")]
    pub subject: String,
    /// JetStream settings; omit for core NATS (no acknowledgement, no deduplication).
    pub jetstream: Option<JetStreamConfig>,
    /// `binary` (attributes as `ce-` headers) or `structured`.
    #[serde(default)]
    pub content_mode: ContentMode,
    /// How to authenticate.
    #[serde(default)]
    pub credentials: NatsCredentials,
}

/// JetStream settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JetStreamConfig {
    /// The stream that captures the subjects.
    pub stream: String,
    /// Create the stream if it does not exist.
    #[serde(default)]
    pub create: bool,
    /// Window in which the server drops a message whose `Nats-Msg-Id` it has seen (used when
    /// creating the stream). Default 2 minutes, the server's own default.
    #[serde(default = "default_duplicate_window_secs")]
    #[schemars(range(min = DUPLICATE_WINDOW_SECS.min, max = DUPLICATE_WINDOW_SECS.max))]
    pub duplicate_window_secs: u64,
    /// How long to wait for one publish acknowledgement before publishing again.
    #[serde(default = "default_ack_timeout_secs")]
    #[schemars(range(min = ACK_TIMEOUT_SECS.min, max = ACK_TIMEOUT_SECS.max))]
    pub ack_timeout_secs: u64,
}

fn default_subject() -> String {
    "k8s.{cluster}.{group}.{resource}.{namespace}.{name}".into()
}

/// The JetStream server default, so a created stream behaves like one made by hand.
const fn default_duplicate_window_secs() -> u64 {
    120
}

/// Long enough for a loaded server, short enough to notice a lost ack quickly.
const fn default_ack_timeout_secs() -> u64 {
    10
}

/// The validated NATS sink.
#[derive(Debug, Clone)]
pub struct Nats {
    /// Settings.
    pub config: NatsConfig,
    /// The parsed subject template.
    pub subject: Template,
}

impl Nats {
    fn parse(
        section: Section,
        context: &Context<'_>,
        errors: &mut Vec<String>,
    ) -> Option<crate::config::Sink> {
        check_names(context, errors);
        let nats: NatsConfig = parse_section("nats", section, errors)?;
        if nats.url.trim().is_empty() {
            errors.push("sink.nats.url: must not be empty".into());
        }
        if let Some(js) = &nats.jetstream {
            if !is_nats_name(&js.stream) {
                errors.push(format!(
                    "sink.nats.jetstream.stream: {:?} must be letters, digits, '_' or '-'",
                    js.stream
                ));
            }
            let at = "sink.nats.jetstream";
            let ack = js.ack_timeout_secs;
            ACK_TIMEOUT_SECS.check(&format!("{at}.ackTimeoutSecs"), ack, errors);
            let window = js.duplicate_window_secs;
            DUPLICATE_WINDOW_SECS.check(&format!("{at}.duplicateWindowSecs"), window, errors);
        }
        nats.credentials.check("sink.nats.credentials", errors);
        let at = "sink.nats.subject";
        let subject = parse_template(at, &nats.subject, Template::check_subject, errors)?;
        Some(Arc::new(Nats {
            config: nats,
            subject,
        }))
    }
}

/// The heartbeat destination is a subject and the checkpoint bucket a bucket name, as they are.
fn check_names(context: &Context<'_>, errors: &mut Vec<String>) {
    if let Some(Err(e)) = context.heartbeat.map(template::check_subject_name) {
        errors.push(format!("heartbeat.destination: {e}"));
    }
    if let Some(bucket) = context.checkpoint.map(|c| c.nats_bucket)
        && !is_nats_name(bucket)
    {
        errors.push(format!(
            "checkpoint.natsBucket: {bucket:?} must be letters, digits, '_' or '-'"
        ));
    }
}

impl SinkSettings for Nats {
    fn kind(&self) -> &'static str {
        "nats"
    }

    fn destination(&self) -> Option<&Template> {
        Some(&self.subject)
    }

    fn resource_fields(&self) -> ResourceFields {
        ResourceFields {
            destination: Some("subject"),
            keys: false,
        }
    }

    /// A resource's `subject`: its renderings must be legal NATS subjects.
    fn parse_destination(
        &self,
        at: &str,
        text: &str,
        _: &str,
        errors: &mut Vec<String>,
    ) -> Option<Template> {
        parse_template(at, text, Template::check_subject, errors)
    }

    fn checkpoints(&self) -> CheckpointSupport {
        match self.config.jetstream {
            Some(_) => CheckpointSupport::Own,
            None => CheckpointSupport::Unsupported(
                "core NATS has no acknowledgements to checkpoint; set sink.nats.jetstream",
            ),
        }
    }

    fn secret_files(&self) -> Vec<PathBuf> {
        self.config.credentials.files()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Settings for Nats {
    fn connect(&self) -> BoxFuture<'_, Result<Arc<AnySink>>> {
        Box::pin(async move {
            let sink = NatsSink::connect(&self.config, self.subject.clone()).await?;
            Ok(Arc::new(sink) as Arc<AnySink>)
        })
    }

    fn plan(&self, cluster: &str, r: &ResolvedResource) -> String {
        let values = r.template_values(cluster);
        let filter = r.destination(&self.subject).subject_filter(&values);
        format!("nats subject {filter}")
    }

    fn subscribe<'a>(
        &'a self,
        scopes: &'a [Scope<'a>],
        _from_beginning: bool,
    ) -> BoxFuture<'a, Result<Messages>> {
        Box::pin(async move {
            let failed = |reason: String| Error::Subscribe {
                kind: "nats",
                reason,
            };
            let client = connect_client(&self.config.url, &self.config.credentials).await?;
            let mut subscriptions = futures::stream::SelectAll::new();
            for filter in subject_filters(&self.subject, scopes) {
                let subscription = client
                    .subscribe(filter)
                    .await
                    .map_err(|e| failed(e.to_string()))?;
                subscriptions.push(subscription);
            }
            let messages = subscriptions.map(|m| decode(&m).map_err(|e| e.to_string()));
            Ok(messages.boxed())
        })
    }
}

/// The subject filters covering the resources of every scope, each message matched by one
/// only: a subscription receives its own copy of every message it matches, so a filter another
/// one covers (the same, or narrower than a cluster wildcard) is left out.
fn subject_filters(subject: &Template, scopes: &[Scope<'_>]) -> Vec<String> {
    let mut all: Vec<String> = Vec::new();
    for scope in scopes {
        for r in scope.resources {
            let template = r.destination(subject);
            let filter = match scope.cluster {
                Some(cluster) => template.subject_filter(&r.template_values(cluster)),
                None => template.subject_filter_any_cluster(&r.template_values("")),
            };
            if !all.contains(&filter) {
                all.push(filter);
            }
        }
    }
    let kept: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(i, f)| {
            !all.iter()
                .enumerate()
                .any(|(j, other)| j != *i && covers(other, f) && !covers(f, other))
        })
        .map(|(_, f)| f.clone())
        .collect();
    kept
}

/// Whether every subject `narrow` matches, `wide` matches too (`*` is one token, `>` the rest).
fn covers(wide: &str, narrow: &str) -> bool {
    let (mut w, mut n) = (wide.split('.'), narrow.split('.'));
    loop {
        match (w.next(), n.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(t)) if t != ">" => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Decodes a NATS message as the NATS sink writes it (`ce-` headers in binary mode).
pub fn decode(m: &async_nats::Message) -> std::result::Result<cloudevents::Event, NotCloudEvent> {
    let mut pairs = Vec::new();
    if let Some(h) = &m.headers {
        for (name, values) in h.iter() {
            if let Some(v) = values.first() {
                pairs.push((name.as_ref(), v.as_str()));
            }
        }
    }
    crate::sink::decode::decode(pairs, &m.payload, "ce-")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigFile, invalid};

    #[test]
    fn a_filter_covers_what_its_wildcards_match() {
        assert!(covers("k8s.*.core.pods.*.*", "k8s.east.core.pods.*.*"));
        assert!(covers("k8s.>", "k8s.east.core.pods.a.b"));
        assert!(covers("a.b", "a.b"));
        assert!(!covers("k8s.east.core.pods.*.*", "k8s.*.core.pods.*.*"));
        assert!(!covers("k8s.*.core.pods", "k8s.east.core.pods.a"));
        assert!(!covers("k8s.*", "k8s.>"));
    }

    #[test]
    fn each_message_is_matched_by_one_filter_only() {
        let yaml = "cluster: hub\n\
            clusters: [{name: hub}, {name: east, kubeconfig: /k}]\n\
            clusterSecrets: {namespace: fleet}\n\
            resources:\n\
            - {apiVersion: v1, resource: configmaps}\n\
            - {apiVersion: v1, resource: secrets, subject: 'audit.{namespace}.{name}'}\n\
            sink: {nats: {url: 'nats://x', jetstream: {stream: s}}}\n";
        let cfg = ConfigFile::parse(yaml).unwrap().validate().unwrap();
        let Nats { subject, .. } = cfg.sink.as_any().downcast_ref().expect("a nats sink");
        let rs: Vec<ResolvedResource> = cfg
            .resources
            .iter()
            .zip([("ConfigMap", "configmaps"), ("Secret", "secrets")])
            .map(|(r, (kind, plural))| ResolvedResource {
                api: kube::core::ApiResource::from_gvk_with_plural(
                    &kube::core::GroupVersionKind::gvk("", "v1", kind),
                    plural,
                ),
                config: r.clone(),
                namespaced: true,
            })
            .collect();
        let named = |cluster| Scope {
            cluster: Some(cluster),
            resources: &rs,
        };
        assert_eq!(
            subject_filters(subject, &[named("hub"), named("east")]),
            [
                "k8s.hub.core.configmaps.*.*",
                "audit.*.*",
                "k8s.east.core.configmaps.*.*"
            ]
        );
        let any = Scope {
            cluster: None,
            resources: &rs,
        };
        assert_eq!(
            subject_filters(subject, &[named("hub"), named("east"), any]),
            ["audit.*.*", "k8s.*.core.configmaps.*.*"]
        );
    }

    #[test]
    fn subjects_the_sink_and_each_resource_name_are_checked() {
        let resources = "resources:\n- {apiVersion: v1, resource: pods}\n- {apiVersion: v1, resource: configmaps}\n- {apiVersion: v1, resource: secrets, subject: 'OVERRIDE'}\n";
        let nats = "sink: {nats: {url: 'nats://x', subject: 'SUBJECT', jetstream: {stream: s}}}";
        // A resource's subject is checked by the sink's rules once the sink itself is valid.
        let e = invalid(&format!(
            "cluster: dev\n{}{}\n",
            resources.replace("OVERRIDE", "audit..{name}"),
            nats.replace("SUBJECT", "k8s.{name}")
        ));
        assert!(
            e.contains("resources[2].subject: \"audit..{name}\" has an empty token"),
            "{e}"
        );
        for (subject, needle) in [
            (
                "k8s.*.{name}",
                "\"k8s.*.\" contains '*': NATS subjects cannot",
            ),
            ("k8s.>", "contains '>'"),
            ("k8s {name}", "contains ' '"),
            ("{cluster}.", "has an empty token"),
        ] {
            let e = invalid(&format!(
                "cluster: dev\nresources: [{{apiVersion: v1, resource: pods}}]\n{}\n",
                nats.replace("SUBJECT", subject)
            ));
            assert!(e.contains("sink.nats.subject: "), "{e}");
            assert!(e.contains(needle), "{subject}: {e}");
        }
    }

    #[test]
    fn a_destination_field_the_sink_does_not_read_is_refused_naming_its_own() {
        let e = invalid(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods, topic: t}]\nsink: {nats: {url: 'nats://x', jetstream: {stream: s}}}\n",
        );
        assert!(
            e.contains("resources[0].topic: the nats sink does not read it; use subject"),
            "{e}"
        );
    }
}
