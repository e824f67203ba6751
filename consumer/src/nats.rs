//! Reading a JetStream stream written by the bridge: an ordered consumer over the whole stream
//! (or some of its subjects), from its first message or, with
//! [`Subscription::from_latest_snapshot`], from the begin marker of the latest completed
//! snapshot on demand; caught up once nothing is pending or the stream's last message at start
//! was read. One stream is read in the order it was published: records are applied in reading
//! order ([`Input::Record`]).

use async_nats::jetstream::{self, consumer::DeliverPolicy, consumer::pull::OrderedConfig};
use futures::{Stream, StreamExt, stream};

use crate::event::{self, Binding, Record};
use crate::reflect::{Input, reflect};
use crate::store::{Change, Writer};

mod bootstrap;

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
    bootstrap: bool,
}

impl Subscription {
    /// Reads every message of `stream`.
    pub fn new(context: jetstream::Context, stream: impl Into<String>) -> Self {
        Subscription {
            context,
            stream: stream.into(),
            filter_subjects: Vec::new(),
            bootstrap: false,
        }
    }

    /// Starts at the begin marker of the latest completed snapshot on demand among the
    /// subjects read, instead of the first message, skipping what precedes it. Once the end
    /// marker is read, the store holds the complete state of the snapshot's scope
    /// ([`Change::SnapshotComplete`]). When the subjects carry markers of several watches, it
    /// starts at the earliest begin marker among each watch's latest completed snapshot;
    /// without a completed snapshot it reads from the first message, with a warning.
    ///
    /// ```no_run
    /// # async fn example(js: async_nats::jetstream::Context) -> Result<(), Box<dyn std::error::Error>> {
    /// use kube_event_bridge_consumer::{Writer, nats::Subscription};
    /// let changes = Subscription::new(js, "KUBE_EVENTS")
    ///     .filter_subjects(["k8s.prod.configmaps"])
    ///     .from_latest_snapshot()
    ///     .reflect(Writer::new())
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_latest_snapshot(mut self) -> Self {
        self.bootstrap = true;
        self
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
        let deliver_policy = match self.bootstrap {
            true => bootstrap::start(&js_stream, &self.filter_subjects, last_at_start)
                .await
                .map_err(consumer_error)?
                .map_or(DeliverPolicy::All, |start_sequence| {
                    DeliverPolicy::ByStartSequence { start_sequence }
                }),
            false => DeliverPolicy::All,
        };
        let consumer = js_stream
            .create_consumer(OrderedConfig {
                filter_subjects: self.filter_subjects.clone(),
                deliver_policy,
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

/// Decodes one message: an object event or a snapshot marker.
fn decode(stream: &str, sequence: u64, message: &async_nats::Message) -> Result<Record> {
    let headers: Vec<(&str, &[u8])> = message
        .headers
        .iter()
        .flat_map(|h| h.iter())
        .filter_map(|(name, values)| Some((name.as_ref(), values.first()?.as_str().as_bytes())))
        .collect();
    let decoded =
        event::decode_message(Binding::Nats, headers, &message.payload).map_err(|source| {
            Error::Decode {
                stream: stream.into(),
                sequence,
                subject: message.subject.to_string(),
                source,
            }
        })?;
    Ok(Record::of(message.subject.to_string(), decoded))
}
