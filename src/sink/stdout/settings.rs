//! The `sink.stdout` section (no settings yet), and what the rest of the bridge asks of the
//! standard-output sink. It is the default sink.

use std::sync::Arc;

use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::StdoutSink;
use crate::config::{CheckpointSupport, Context, Section, SinkKind, SinkSettings, parse_section};
use crate::discovery::ResolvedResource;
use crate::sink::{AnySink, Messages, Result, Scope, Settings, no_subscription};

crate::sink::register!(
    Stdout,
    SinkKind {
        name: "stdout",
        description: "Print structured CloudEvents as JSON lines on standard output.",
        default: true,
        schema: |g| g.subschema_for::<StdoutConfig>(),
        parse: Stdout::parse,
        from_environment: SinkKind::no_environment,
    }
);

/// Standard output sink settings (none yet).
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StdoutConfig {}

/// The validated standard-output sink.
#[derive(Debug, Clone, Default)]
pub struct Stdout;

impl Stdout {
    fn parse(
        section: Section,
        _: &Context<'_>,
        errors: &mut Vec<String>,
    ) -> Option<crate::config::Sink> {
        let StdoutConfig {} = parse_section("stdout", section, errors)?;
        Some(Arc::new(Stdout))
    }
}

impl SinkSettings for Stdout {
    fn kind(&self) -> &'static str {
        "stdout"
    }

    /// Files or a bucket when configured; without either, nothing durable (every start lists
    /// and prints every object again), which suits a sink read by a person.
    fn checkpoints(&self) -> CheckpointSupport {
        CheckpointSupport::Apart { required: false }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Settings for Stdout {
    fn connect(&self) -> BoxFuture<'_, Result<Arc<AnySink>>> {
        Box::pin(async move { Ok(Arc::new(StdoutSink::new()) as Arc<AnySink>) })
    }

    fn plan(&self, _: &str, _: &ResolvedResource) -> String {
        "stdout".into()
    }

    fn subscribe<'a>(&'a self, _: &'a [Scope<'a>], _: bool) -> BoxFuture<'a, Result<Messages>> {
        no_subscription("stdout", "the events are on the bridge's standard output")
    }
}
