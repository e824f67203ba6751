//! The `sink.recorder` section, validated, and what the bridge asks of the sink beyond its
//! events: its connection, its plan line and what `tail` subscribes to.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use kube_event_bridge::config::{self, CheckpointSupport, Context, SinkKind, SinkSettings};
use kube_event_bridge::discovery::ResolvedResource;
use kube_event_bridge::sink::{AnySink, Messages, Result, Scope, Settings};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::sink::{RecorderSink, recorded};

kube_event_bridge::register_sink!(
    Recorder,
    SinkKind {
        name: "recorder",
        description: "Keep every event in memory (tests only).",
        default: false,
        schema: |g| g.subschema_for::<RecorderConfig>(),
        parse: Recorder::parse,
        from_environment: SinkKind::no_environment,
    }
);

/// Recorder sink settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RecorderConfig {
    /// The channel events are kept under: lowercase letters, digits and `-`.
    pub channel: String,
}

/// The validated recorder sink.
#[derive(Debug, Clone)]
pub struct Recorder {
    /// Settings.
    pub config: RecorderConfig,
}

impl Recorder {
    fn parse(
        section: config::Section,
        _: &Context<'_>,
        errors: &mut Vec<String>,
    ) -> Option<config::Sink> {
        let config: RecorderConfig = config::parse_section("recorder", section, errors)?;
        let valid = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
        if config.channel.is_empty() || !config.channel.chars().all(valid) {
            errors.push(format!(
                "sink.recorder.channel: {:?} must be lowercase letters, digits or '-'",
                config.channel
            ));
            return None;
        }
        Some(Arc::new(Recorder { config }))
    }
}

impl SinkSettings for Recorder {
    fn kind(&self) -> &'static str {
        "recorder"
    }

    fn checkpoints(&self) -> CheckpointSupport {
        CheckpointSupport::Apart { required: false }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Settings for Recorder {
    fn connect(&self) -> BoxFuture<'_, Result<Arc<AnySink>>> {
        let sink = RecorderSink::new(&self.config.channel);
        Box::pin(async move { Ok(Arc::new(sink) as Arc<AnySink>) })
    }

    fn plan(&self, _: &str, _: &ResolvedResource) -> String {
        format!("recorder channel {}", self.config.channel)
    }

    /// Every event of the channel from now on (or from the first), polled.
    fn subscribe<'a>(
        &'a self,
        _: &'a [Scope<'a>],
        from_beginning: bool,
    ) -> BoxFuture<'a, Result<Messages>> {
        let channel = self.config.channel.clone();
        let start = if from_beginning {
            0
        } else {
            recorded(&channel).len()
        };
        let messages = futures::stream::unfold(start, move |next| {
            let channel = channel.clone();
            async move {
                loop {
                    if let Some(line) = recorded(&channel).get(next) {
                        let event = serde_json::from_slice(line).map_err(|e| e.to_string());
                        return Some((event, next + 1));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        });
        Box::pin(async move { Ok(messages.boxed()) })
    }
}
