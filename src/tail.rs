//! `kube-event-bridge tail`: subscribes where the configuration publishes (each sink says where,
//! [`crate::sink::Settings::subscribe`]) and prints each event readably. The decoders are the
//! sinks' own, which the integration tests use as their consumer too.

use std::time::Duration;

use cloudevents::{AttributesReader, Data, Event};
use futures::StreamExt;

use crate::attribute;
use crate::config::Config;
use crate::discovery;
use crate::kubernetes;
use crate::sink;

pub use crate::sink::decode::{NotCloudEvent, decode};
pub use crate::sink::kafka::{decode as decode_kafka, topic_pattern};
pub use crate::sink::nats::decode as decode_nats;

/// Errors of tailing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The sink has nothing to subscribe to, or the subscription failed.
    #[error(transparent)]
    Sink(#[from] sink::Error),
    /// The Kubernetes client could not be built.
    #[error(transparent)]
    Kubernetes(#[from] kubernetes::Error),
    /// Discovery failed.
    #[error(transparent)]
    Discovery(#[from] discovery::Error),
}

/// How to tail.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Print objects too.
    pub verbose: bool,
    /// Start at the oldest retained event.
    pub from_beginning: bool,
    /// Stop after this many events.
    pub limit: Option<u64>,
    /// Stop after this long without an event.
    pub idle_timeout: Option<Duration>,
}

/// One readable line: time, change, subject, resourceVersion, origin, id; with `verbose`, the
/// object follows, indented.
pub fn format(e: &Event, verbose: bool) -> String {
    let ext = |k: &str| e.extension(k).map(|v| v.to_string()).unwrap_or_default();
    let change = e.ty().rsplit('.').next().unwrap_or_default();
    let time = e.time().map(|t| t.to_rfc3339()).unwrap_or_default();
    let mut line = format!(
        "{time} {change:<8} {}/{} {} rv={} origin={} id={}",
        ext(attribute::APIVERSION),
        ext(attribute::KIND),
        e.subject().unwrap_or_default(),
        ext(attribute::RESOURCEVERSION),
        ext(attribute::ORIGIN),
        e.id()
    );
    if verbose && let Some(Data::Json(v)) = e.data() {
        let pretty = serde_json::to_string_pretty(v).unwrap_or_default();
        for l in pretty.lines() {
            line.push_str("\n    ");
            line.push_str(l);
        }
    }
    line
}

/// Subscribes where `config` publishes and prints events until the limit or idle timeout.
pub async fn run(config: &Config, options: Options) -> Result<(), Error> {
    let client = kubernetes::client(&config.kubernetes).await?;
    let resources = discovery::resolve(&client, &config.resources).await?;
    let settings = sink::settings(&config.sink)?;
    let mut messages = settings
        .subscribe(&config.cluster, &resources, options.from_beginning)
        .await?;
    let idle = options.idle_timeout.unwrap_or(Duration::MAX);
    let mut seen = 0u64;
    while let Ok(Some(message)) = tokio::time::timeout(idle, messages.next()).await {
        match message {
            Ok(e) => println!("{}", format(&e, options.verbose)),
            Err(e) => eprintln!("skipped message: {e}"),
        }
        seen += 1;
        if options.limit.is_some_and(|l| seen >= l) {
            break;
        }
    }
    Ok(())
}
