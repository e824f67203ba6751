//! `kube-event-bridge tail`: subscribes where the configuration publishes and prints each event
//! readably. Messages are decoded into `cloudevents::Event` (binary or structured mode) by the
//! functions here, which the integration tests use as their consumer too.

use std::collections::BTreeMap;
use std::time::Duration;

use cloudevents::{AttributesReader, Data, Event, EventBuilder, EventBuilderV10};
use futures::StreamExt;
use percent_encoding::percent_decode_str;
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Headers;

use crate::attribute;
use crate::config::{Config, Sink};
use crate::discovery::{self, ResolvedResource};
use crate::kubernetes;
use crate::sink::kafka::consumer_config;
use crate::template::{Template, Values};

/// Errors of tailing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A message could not be decoded as a CloudEvent.
    #[error("not a CloudEvent: {0}")]
    Decode(String),
    /// The sink is standard output: nothing to subscribe to.
    #[error("sink is stdout: the events are on the bridge's standard output")]
    Stdout,
    /// The sink is an HTTP receiver: nothing to subscribe to.
    #[error("sink is http: the events are posted to its receiver (sink.http.url)")]
    Http,
    /// Kafka failed.
    #[error("kafka")]
    Kafka(#[source] rdkafka::error::KafkaError),
    /// NATS failed.
    #[error("nats: {0}")]
    Nats(String),
    /// The Kafka client settings could not be prepared (a property file is unreadable).
    #[error(transparent)]
    Sink(#[from] crate::sink::Error),
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

/// Decodes a binary-mode or structured-mode message. `headers` are (name, value) pairs;
/// `prefix` is `ce_` (Kafka) or `ce-` (NATS, whose values are percent-encoded).
pub fn decode<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    body: &[u8],
    prefix: &str,
) -> Result<Event, Error> {
    let mut attrs = BTreeMap::new();
    let mut content_type = None;
    for (name, value) in headers {
        if name.eq_ignore_ascii_case("content-type") {
            content_type = Some(value.to_string());
        } else if let Some(attr) = name.strip_prefix(prefix) {
            let value = if prefix == "ce-" {
                percent_decode_str(value).decode_utf8_lossy().into_owned()
            } else {
                value.to_string()
            };
            attrs.insert(attr.to_ascii_lowercase(), value);
        }
    }
    if content_type
        .as_deref()
        .is_some_and(|c| c.starts_with("application/cloudevents+json"))
    {
        return serde_json::from_slice(body).map_err(|e| Error::Decode(e.to_string()));
    }
    let mut take = |k: &str| {
        attrs
            .remove(k)
            .ok_or_else(|| Error::Decode(format!("missing attribute {k}")))
    };
    let mut b = EventBuilderV10::new()
        .id(take(attribute::ID)?)
        .source(take(attribute::SOURCE)?)
        .ty(take(attribute::TYPE)?);
    if let Ok(s) = take(attribute::SUBJECT) {
        b = b.subject(s);
    }
    if let Ok(t) = take(attribute::TIME) {
        b = b.time(t);
    }
    let schema = take(attribute::DATASCHEMA).ok();
    take(attribute::SPECVERSION)?;
    for (k, v) in attrs {
        b = b.extension(&k, v);
    }
    let data: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| Error::Decode(format!("data is not JSON: {e}")))?;
    let ct = content_type.unwrap_or_else(|| "application/json".into());
    b = match schema {
        Some(s) => b.data_with_schema(ct, s, data),
        None => b.data(ct, data),
    };
    b.build().map_err(|e| Error::Decode(e.to_string()))
}

/// Decodes a Kafka record.
pub fn decode_kafka<M: Message>(m: &M) -> Result<Event, Error> {
    let mut pairs = Vec::new();
    if let Some(h) = m.headers() {
        for header in h.iter() {
            pairs.push((
                header.key,
                header
                    .value
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .unwrap_or_default(),
            ));
        }
    }
    decode(pairs, m.payload().unwrap_or_default(), "ce_")
}

/// Decodes a NATS message.
pub fn decode_nats(m: &async_nats::Message) -> Result<Event, Error> {
    let mut pairs = Vec::new();
    if let Some(h) = &m.headers {
        for (name, values) in h.iter() {
            if let Some(v) = values.first() {
                pairs.push((name.as_ref(), v.as_str()));
            }
        }
    }
    decode(pairs, &m.payload, "ce-")
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
    let mut seen = 0u64;
    let mut print = |e: Result<Event, Error>| {
        match e {
            Ok(e) => println!("{}", format(&e, options.verbose)),
            Err(e) => eprintln!("skipped message: {e}"),
        }
        seen += 1;
        options.limit.is_some_and(|l| seen >= l)
    };
    let idle = options.idle_timeout.unwrap_or(Duration::MAX);
    match &config.sink {
        Sink::Stdout => Err(Error::Stdout),
        Sink::Http { .. } => Err(Error::Http),
        Sink::Kafka { config: k, topic } => {
            let mut c = consumer_config(k)?;
            c.set(
                "group.id",
                format!("kube-event-bridge-tail-{}", std::process::id()),
            )
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set(
                "auto.offset.reset",
                if options.from_beginning {
                    "earliest"
                } else {
                    "latest"
                },
            );
            let consumer: StreamConsumer = c.create().map_err(Error::Kafka)?;
            let pattern = topic_pattern(topic, &config.cluster, &resources);
            consumer
                .subscribe(&[pattern.as_str()])
                .map_err(Error::Kafka)?;
            let mut stream = consumer.stream();
            while let Ok(Some(m)) = tokio::time::timeout(idle, stream.next()).await {
                let m = m.map_err(Error::Kafka)?;
                if print(decode_kafka(&m)) {
                    break;
                }
            }
            Ok(())
        }
        Sink::Nats { config: n, subject } => {
            let client = async_nats::connect(n.url.as_str())
                .await
                .map_err(|e| Error::Nats(e.to_string()))?;
            let filters: Vec<String> = resources
                .iter()
                .map(|r| {
                    r.destination(subject)
                        .subject_filter(&r.template_values(&config.cluster))
                })
                .collect();
            let mut subs = futures::stream::SelectAll::new();
            for f in filters {
                subs.push(
                    client
                        .subscribe(f)
                        .await
                        .map_err(|e| Error::Nats(e.to_string()))?,
                );
            }
            while let Ok(Some(m)) = tokio::time::timeout(idle, subs.next()).await {
                if print(decode_nats(&m)) {
                    break;
                }
            }
            Ok(())
        }
    }
}

/// A librdkafka subscription regex (`^...`) matching every topic the template yields for the
/// resources.
pub fn topic_pattern(topic: &Template, cluster: &str, resources: &[ResolvedResource]) -> String {
    // A marker that survives topic rendering unchanged, then becomes the namespace pattern.
    const NS: &str = "KEBNAMESPACEMARKER";
    let alternatives: Vec<String> = resources
        .iter()
        .map(|r| {
            let rendered = r.destination(topic).render_topic(&Values {
                namespace: Some(NS),
                ..r.template_values(cluster)
            });
            rendered
                .split(NS)
                .map(regex_escape)
                .collect::<Vec<_>>()
                .join("[A-Za-z0-9_-]+")
        })
        .collect();
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
