//! The `sink` section: exactly one member, named after a sink kind. Every kind lives in its own
//! folder under `src/sink/` and registers itself there ([`SinkKind`], collected at link time by
//! `inventory`): this module never names one. A kind brings its settings as written (serde types
//! with their defaults), their validation, and what the rest of the configuration needs to know
//! of it ([`SinkSettings`]). Without a `sink` section, a kind may take its settings from the
//! process environment (Knative's `K_SINK`), else the default kind applies.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

use super::environment::Environment;
use crate::template::Template;

/// One kind of sink, registered by its folder with `inventory::submit!`.
pub struct SinkKind {
    /// Its key in the `sink` section (`kafka`), and its name in logs and metrics.
    pub name: &'static str,
    /// What it does, for the configuration's schema.
    pub description: &'static str,
    /// The kind used when the file names none and no kind takes the environment.
    pub default: bool,
    /// The JSON Schema of its section.
    pub schema: fn(&mut SchemaGenerator) -> Schema,
    /// Validates its section; problems are pushed to `errors`, each naming its path.
    pub parse: fn(Section, &Context<'_>, &mut Vec<String>) -> Option<Sink>,
    /// Its settings from the process environment, when the file has no `sink` section and the
    /// environment asks for this kind.
    pub from_environment: fn(&Environment, &Context<'_>, &mut Vec<String>) -> Option<Sink>,
}

inventory::collect!(SinkKind);

/// The section of one sink kind as written, a generic value until its kind deserializes it
/// ([`parse_section`]).
pub type Section = serde_json::Value;

impl SinkKind {
    /// Never configured from the environment.
    pub fn no_environment(_: &Environment, _: &Context<'_>, _: &mut Vec<String>) -> Option<Sink> {
        None
    }

    /// Every registered kind, by name.
    pub fn all() -> Vec<&'static SinkKind> {
        let mut kinds: Vec<&SinkKind> = inventory::iter::<SinkKind>.into_iter().collect();
        kinds.sort_by_key(|k| k.name);
        kinds
    }
}

/// Deserializes the section of sink kind `kind` into its settings type; a problem names its
/// path under `sink.<kind>`.
pub fn parse_section<T: serde::de::DeserializeOwned>(
    kind: &str,
    section: Section,
    errors: &mut Vec<String>,
) -> Option<T> {
    serde_path_to_error::deserialize(section)
        .map_err(|e| {
            let path = e.path().to_string();
            let at = if path == "." {
                format!("sink.{kind}")
            } else {
                format!("sink.{kind}.{path}")
            };
            errors.push(format!("{at}: {}", e.into_inner()));
        })
        .ok()
}

/// What a kind's validation may consult besides its own section: the names it is given as
/// they are, and the numbers its own must agree with.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The cluster's name (`{cluster}` in destination names).
    pub cluster: &'a str,
    /// The heartbeat destination (`{cluster}` replaced), when heartbeats are on.
    pub heartbeat: Option<&'a str>,
    /// The checkpoint settings, when checkpoints are on.
    pub checkpoint: Option<Checkpointing<'a>>,
}

/// The checkpoint settings a sink kind's validation sees.
#[derive(Debug, Clone, Copy)]
pub struct Checkpointing<'a> {
    /// `checkpoint.intervalMs`.
    pub interval_ms: u64,
    /// `checkpoint.kafkaTopic`.
    pub kafka_topic: &'a str,
    /// `checkpoint.natsBucket`.
    pub nats_bucket: &'a str,
}

/// The validated sink, as the configuration holds it.
pub type Sink = Arc<dyn SinkSettings>;

/// What the configuration knows of a validated sink, whatever its kind.
pub trait SinkSettings: fmt::Debug + Send + Sync + Any {
    /// The kind's name (`kafka`).
    fn kind(&self) -> &'static str;

    /// The template events go to (a topic, subject or URL); `None` when there is none.
    fn destination(&self) -> Option<&Template> {
        None
    }

    /// The fields of a `resources[]` entry this kind reads.
    fn resource_fields(&self) -> ResourceFields {
        ResourceFields::default()
    }

    /// Parses the text of a `resources[]` entry's replacement of the destination template (the
    /// field [`ResourceFields::destination`] names, at `at`), by the rules of this kind's
    /// destinations in cluster `cluster`, pushing what is wrong onto `errors`. Called only for
    /// kinds that name such a field.
    fn parse_destination(
        &self,
        at: &str,
        text: &str,
        cluster: &str,
        errors: &mut Vec<String>,
    ) -> Option<Template> {
        let _ = (text, cluster);
        errors.push(format!(
            "{at}: the {} sink has no destination to replace",
            self.kind()
        ));
        None
    }

    /// Where this kind can keep checkpoints.
    fn checkpoints(&self) -> CheckpointSupport;

    /// The files this kind reads its secrets from (mounted Secrets).
    fn secret_files(&self) -> Vec<std::path::PathBuf> {
        Vec::new()
    }

    /// For the sink layer, which knows the concrete type.
    fn as_any(&self) -> &dyn Any;
}

/// The per-resource fields a sink kind reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResourceFields {
    /// The entry's field that replaces the sink's destination template (`topic`).
    pub destination: Option<&'static str>,
    /// Whether `key` and `tombstones` apply (records with keys).
    pub keys: bool,
}

/// Where a sink kind can keep checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointSupport {
    /// In its own broker (named by `checkpoint.<field>`); no other store may be set.
    Own,
    /// Apart, in `checkpoint.directory` or `checkpoint.nats`; `required` when keeping none is
    /// not allowed (the kind has no other way to resume).
    Apart {
        /// Whether a store must be set while checkpoints are enabled.
        required: bool,
    },
    /// Nowhere, for this reason (`checkpoint.enabled: false` is then required).
    Unsupported(&'static str),
}

/// The `sink` section as written: one member, named after a kind.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(transparent)]
pub struct SinkConfig(pub BTreeMap<String, Section>);

impl JsonSchema for SinkConfig {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "SinkConfig".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        // A member without a value (`stdout:`) is an empty section.
        let properties: serde_json::Map<String, serde_json::Value> = SinkKind::all()
            .into_iter()
            .map(|k| {
                let schema = serde_json::json!({
                    "description": k.description,
                    "anyOf": [(k.schema)(generator).to_value(), {"type": "null"}],
                });
                (k.name.to_string(), schema)
            })
            .collect();
        schemars::json_schema!({
            "description": "The sink section: exactly one of its members.",
            "type": "object",
            "properties": properties,
            "additionalProperties": false,
            "maxProperties": 1,
        })
    }
}

/// The validated sink of `file`: its one member, else a kind the environment asks for, else
/// the default kind.
pub(super) fn validate_sink(
    section: &SinkConfig,
    context: &Context<'_>,
    env: &Environment,
    errors: &mut Vec<String>,
) -> Option<Sink> {
    let kinds = SinkKind::all();
    let names = || kinds.iter().map(|k| k.name).collect::<Vec<_>>().join(", ");
    let mut members = section.0.iter();
    match (members.next(), members.next()) {
        (Some(_), Some(_)) => {
            errors.push(format!("sink: exactly one of {} may be set", names()));
            None
        }
        (Some((name, section)), None) => {
            let Some(kind) = kinds.iter().find(|k| k.name == name) else {
                errors.push(format!(
                    "sink.{name}: unknown sink; one of {} may be set",
                    names()
                ));
                return None;
            };
            // `stdout: ` with nothing after it is an empty section.
            let section = match section {
                Section::Null => Section::Object(Default::default()),
                other => other.clone(),
            };
            (kind.parse)(section, context, errors)
        }
        (None, _) => {
            let before = errors.len();
            for kind in &kinds {
                let found = (kind.from_environment)(env, context, errors);
                if found.is_some() || errors.len() > before {
                    return found;
                }
            }
            let kind = kinds.iter().find(|k| k.default)?;
            let empty = Section::Object(Default::default());
            (kind.parse)(empty, context, errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::invalid;

    #[test]
    fn two_sinks_are_refused() {
        let e = invalid(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nsink: {stdout: {}, nats: {url: 'nats://x'}}\n",
        );
        assert!(
            e.contains("sink: exactly one of http, kafka, nats, stdout may be set"),
            "{e}"
        );
    }

    #[test]
    fn an_unknown_sink_and_an_unknown_field_are_named() {
        let e = invalid(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nsink: {kafak: {}}\n",
        );
        assert!(
            e.contains("sink.kafak: unknown sink; one of http, kafka, nats, stdout"),
            "{e}"
        );
        let e = invalid(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nsink: {nats: {url: 'nats://x', jetstream: {stram: s}}}\n",
        );
        assert!(
            e.contains("sink.nats.jetstream.stram: unknown field `stram`"),
            "{e}"
        );
    }
}
