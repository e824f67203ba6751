//! Reading a JetStream stream written by the bridge: an ordered consumer over the whole stream
//! (or some of its subjects), caught up once nothing is pending or the stream's last message
//! at start was read.

use async_nats::jetstream::{self, consumer::DeliverPolicy, consumer::pull::OrderedConfig};
use futures::{Stream, StreamExt, stream};

use crate::event::{self, Binding, Record};
use crate::reflect::{Input, reflect};
use crate::store::{Change, Writer};

/// Errors of a NATS subscription.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The stream could not be read (it does not exist, or the server is unreachable).
    #[error("cannot read JetStream stream {stream}")]
    Stream {
        /// The stream.
        stream: String,
        /// The client's error.
        #[source]
        source: async_nats::Error,
    },
    /// The ordered consumer could not be created or read.
    #[error("consumer of JetStream stream {stream} failed")]
    Consumer {
        /// The stream.
        stream: String,
        /// The client's error.
        #[source]
        source: async_nats::Error,
    },
    /// A message is not an event of the bridge; it is skipped.
    #[error("message {stream}#{sequence} on {subject} is not an event of the bridge")]
    Decode {
        /// The stream.
        stream: String,
        /// Its stream sequence (0 if unknown).
        sequence: u64,
        /// Its subject.
        subject: String,
        /// What is wrong.
        #[source]
        source: event::Error,
    },
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A JetStream stream to read, and optionally which of its subjects.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use futures::StreamExt;
/// use kube_event_bridge_consumer::{Writer, nats::Subscription};
///
/// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
/// let writer = Writer::new();
/// let store = writer.store();
/// let changes = Subscription::new(async_nats::jetstream::new(client), "KUBE_EVENTS")
///     .filter_subjects(["k8s.prod.core.configmaps.>"])
///     .reflect(writer)
///     .await?;
/// tokio::spawn(changes.for_each(|_| async {}));
/// store.wait_until_ready().await;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Subscription {
    context: jetstream::Context,
    stream: String,
    filter_subjects: Vec<String>,
}

impl Subscription {
    /// Reads every message of `stream`.
    pub fn new(context: jetstream::Context, stream: impl Into<String>) -> Self {
        Subscription {
            context,
            stream: stream.into(),
            filter_subjects: Vec::new(),
        }
    }

    /// Reads only these subjects (wildcards allowed) of the stream.
    pub fn filter_subjects(
        mut self,
        subjects: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.filter_subjects = subjects.into_iter().map(Into::into).collect();
        self
    }

    /// Starts reading and applies every message to `writer`'s store; the stream yields the
    /// changes and must be polled for the store to fill.
    pub async fn reflect(
        self,
        writer: Writer,
    ) -> Result<impl Stream<Item = Result<Change>> + Send + 'static> {
        Ok(reflect(writer, self.start().await?))
    }

    /// Starts reading from the first message. The stream yields each message, then
    /// [`Input::CaughtUp`] once the consumer has nothing pending, or read the last message the
    /// stream held at start.
    pub async fn start(self) -> Result<impl Stream<Item = Result<Input>> + Send + 'static> {
        let name = self.stream.clone();
        let stream_error = |source: async_nats::Error| Error::Stream {
            stream: name.clone(),
            source,
        };
        let mut js_stream = self
            .context
            .get_stream(&self.stream)
            .await
            .map_err(|e| stream_error(e.into()))?;
        let last_at_start = js_stream
            .info()
            .await
            .map_err(|e| stream_error(e.into()))?
            .state
            .last_sequence;
        let consumer_error = |source: async_nats::Error| Error::Consumer {
            stream: name.clone(),
            source,
        };
        let consumer = js_stream
            .create_consumer(OrderedConfig {
                filter_subjects: self.filter_subjects.clone(),
                deliver_policy: DeliverPolicy::All,
                ..OrderedConfig::default()
            })
            .await
            .map_err(|e| consumer_error(e.into()))?;
        let pending_at_start = consumer.cached_info().num_pending;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| consumer_error(e.into()))?;
        tracing::debug!(stream = %name, pending = pending_at_start, last_sequence = last_at_start, "reading stream");
        let mut caught_up = pending_at_start == 0;
        let first = caught_up.then_some(Ok(Input::CaughtUp));
        let rest = messages.flat_map(move |message| {
            let mut out = Vec::with_capacity(2);
            match message {
                Ok(message) => {
                    let (sequence, pending) = message
                        .info()
                        .map_or((0, 1), |i| (i.stream_sequence, i.pending));
                    out.push(decode(&name, sequence, &message.message).map(Input::Record));
                    if !caught_up && (pending == 0 || sequence >= last_at_start) {
                        caught_up = true;
                        out.push(Ok(Input::CaughtUp));
                    }
                }
                Err(source) => out.push(Err(Error::Consumer {
                    stream: name.clone(),
                    source: source.into(),
                })),
            }
            stream::iter(out)
        });
        Ok(stream::iter(first).chain(rest))
    }
}

/// Decodes one message.
fn decode(stream: &str, sequence: u64, message: &async_nats::Message) -> Result<Record> {
    let headers: Vec<(&str, &[u8])> = message
        .headers
        .iter()
        .flat_map(|h| h.iter())
        .filter_map(|(name, values)| Some((name.as_ref(), values.first()?.as_str().as_bytes())))
        .collect();
    let event = event::decode(Binding::Nats, headers, &message.payload).map_err(|source| {
        Error::Decode {
            stream: stream.into(),
            sequence,
            subject: message.subject.to_string(),
            source,
        }
    })?;
    Ok(Record::Event {
        destination: message.subject.to_string(),
        event: Box::new(event),
    })
}
