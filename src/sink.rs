//! Where events go. Every sink implements [`Sink`]: `send` hands one event to the broker client in
//! order and returns a [`Pending`] acknowledgement; the pipeline awaits acknowledgements in order,
//! so progress only moves past events the broker has accepted. What differs between sinks is said
//! by capabilities, not by matching on the sink: whether two events of one object may await
//! acknowledgement at once ([`Sink::ordered_in_flight`]), whether events are sent in
//! transactions ([`Sink::transactions`]), where checkpoints live ([`Sink::checkpoints`]) and
//! what a destination needs before new resources publish to it ([`Sink::prepare`]).
//!
//! Broker errors are sorted into [`Outcome::Retry`] (the event is sent again, nothing is lost) and
//! [`Outcome::Rejected`] (the broker refuses it for good: logged with the object's reference,
//! counted, and skipped so it never blocks the objects behind it) in one place per sink.
//!
//! Each sink is a folder (`kafka/`, `nats/`, `http/`, `stdout/`) holding everything about it: its
//! settings with their defaults and validation (`settings.rs`, registered with [`register!`]),
//! its errors, its client and the sink itself, what `tail` subscribes to and what the AsyncAPI
//! document says of it ([`Settings`]). Adding one means such a folder and its `mod` line below;
//! docs/architecture.md walks through it.

pub mod decode;
pub mod describe;
pub mod http;
pub mod kafka;
pub mod nats;
#[cfg(test)]
pub(crate) mod scripted;
pub mod stdout;

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;

use crate::config::{self, SinkSettings};
use crate::discovery::ResolvedResource;
use crate::encode::{Event, ResourceInfo};
use crate::template::Values;

/// Errors of connecting to or preparing a sink.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A sink kind could not connect or prepare its client (its folder's own error).
    #[error(transparent)]
    Setup(Box<dyn std::error::Error + Send + Sync>),
    /// A secret file (a password, token, nkey seed or property value) could not be read.
    #[error(transparent)]
    Secret(#[from] crate::secret::Error),
    /// An out-of-band message ([`Sink::send_raw`]) was not published.
    #[error("cannot publish to {destination}")]
    Publish {
        /// The topic, subject or stream.
        destination: String,
        /// The broker client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A sink kind's settings type was not registered with [`register!`].
    #[error("sink {kind}: its settings type is not registered (register_sink!)")]
    Unregistered {
        /// The kind.
        kind: &'static str,
    },
    /// The sink has nothing `tail` could subscribe to.
    #[error("sink is {kind}: {reason}")]
    NoSubscription {
        /// The kind.
        kind: &'static str,
        /// Where its events are instead.
        reason: &'static str,
    },
    /// A subscription for `tail` failed.
    #[error("{kind}: cannot subscribe: {reason}")]
    Subscribe {
        /// The kind.
        kind: &'static str,
        /// The client's report.
        reason: String,
    },
    /// A newer producer with the same transactional id exists: this instance must stop.
    #[error("producer fenced by a newer instance with the same transactional id")]
    Fenced,
    /// Another watch sharing the open transaction voided it (a failed delivery of its own, or it
    /// stopped with events in it): its events must be sent again after
    /// [`Transactions::recover`], at once (nothing is wrong with this watch or the broker).
    #[error("transaction aborted by another watch sharing it")]
    TransactionAborted,
    /// The broker or client failed; the open transaction did not commit. Its events must be sent
    /// again after [`Transactions::recover`].
    #[error("{sink} transaction failed")]
    Transaction {
        /// The sink's name.
        sink: &'static str,
        /// The broker client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the broker said about one event.
#[derive(Debug)]
pub enum Outcome {
    /// Stored by the broker.
    Acked,
    /// Refused for good; `reason` is a closed-set label (`too_large`, `not_authorized`, ...).
    Rejected {
        /// Closed-set label for logs and metrics.
        reason: &'static str,
        /// The broker's message.
        error: String,
    },
    /// Refused for a reason that holds for every event of the destination until an operator
    /// fixes it (authorization, a missing or invalid topic): skipping would lose data, so the
    /// event is sent again after a pause and the watch reports itself stalled meanwhile.
    Blocked {
        /// Closed-set label for logs, metrics and readiness (`not_authorized`, ...).
        reason: &'static str,
        /// The broker's message.
        error: String,
    },
    /// The producer can never publish again (fenced by a newer instance): the watch must stop.
    Fatal {
        /// The broker's message.
        error: String,
    },
    /// Not stored: the transaction it was sent in was aborted, because another event of it
    /// failed. Sent again at once in the next transaction; not a failure of its own.
    Aborted,
    /// Not stored this time; sending again is safe (the id deduplicates).
    Retry {
        /// The broker's message.
        error: String,
    },
}

/// An event with its outcome.
#[derive(Debug)]
pub struct Delivered {
    /// The event, returned so a retry can send it again.
    pub event: Event,
    /// The outcome.
    pub outcome: Outcome,
}

/// An acknowledgement still to come.
pub type Pending = BoxFuture<'static, Delivered>;

fn ready(event: Event, outcome: Outcome) -> Pending {
    Box::pin(std::future::ready(Delivered { event, outcome }))
}

/// A sink: where the pipelines of every watch send their events.
///
/// Methods that wait return boxed futures so that pipelines can hold any sink as
/// `Arc<dyn Sink>` ([`AnySink`]).
pub trait Sink: std::fmt::Debug + Send + Sync {
    /// A short name for logs and metrics (`kafka`, `nats`, `stdout`).
    fn name(&self) -> &'static str;

    /// Hands `event` to the broker client. Called in order; the returned acknowledgements may be
    /// awaited concurrently.
    fn send(&self, event: Event) -> BoxFuture<'_, Pending>;

    /// Publishes one out-of-band message (a heartbeat, a structured CloudEvent) to
    /// `destination` under `key` and waits for it to be handed over (in a transaction: sent
    /// within the open one).
    fn send_raw<'a>(
        &'a self,
        destination: &'a str,
        key: &'a str,
        payload: Vec<u8>,
    ) -> BoxFuture<'a, Result<()>>;

    /// Publishes one out-of-band message that belongs to the watch's stream (a snapshot's
    /// marker) to `destination` under `key`, and waits until the broker acknowledged it as it
    /// does events (JetStream: stored); [`Sink::send_raw`] by default.
    fn send_in_stream<'a>(
        &'a self,
        destination: &'a str,
        key: &'a str,
        payload: Vec<u8>,
    ) -> BoxFuture<'a, Result<()>> {
        self.send_raw(destination, key, payload)
    }

    /// Where a message about a whole watch goes, beside its events (a snapshot's markers): the
    /// resource's destination rendered for `values` (no object name); `None` when it depends
    /// on the object (`{name}`, or `{namespace}` without one in `values`).
    fn watch_destination(&self, info: &ResourceInfo, values: &Values<'_>) -> Option<String> {
        let _ = (info, values);
        None
    }

    /// What this sink can do for a destination compacted by record key (a snapshot's `prune`);
    /// `None` when its destinations keep no keys.
    fn compaction(&self) -> Option<&dyn Compaction> {
        None
    }

    /// Waits until everything handed over is acknowledged, or `timeout`.
    fn flush(&self, timeout: Duration) -> BoxFuture<'_, ()>;

    /// Whether two events of one object may be awaiting acknowledgement at once without risking
    /// their order (a client that retries on its own may reorder them; then the pipeline keeps
    /// one per object in flight).
    fn ordered_in_flight(&self) -> bool {
        true
    }

    /// The transactions events are sent in, when they are committed together with the
    /// checkpoint: a failed delivery then voids the whole open transaction.
    fn transactions(&self) -> Option<&dyn Transactions> {
        None
    }

    /// Where the checkpoints of this sink's watches live.
    fn checkpoints(&self) -> Checkpoints<'_> {
        Checkpoints::Directory
    }

    /// Prepares the destinations of `resources` before their watches start (at start and for
    /// resources discovered later); nothing by default.
    fn prepare<'a>(
        &'a self,
        cluster: &'a str,
        resources: &'a [ResolvedResource],
    ) -> BoxFuture<'a, Result<()>> {
        let _ = (cluster, resources);
        Box::pin(std::future::ready(Ok(())))
    }
}

/// Any sink, as the supervisor and the pipelines hold it (`Arc<AnySink>`).
pub type AnySink = dyn Sink;

/// The transactions of a sink whose events are committed together with the checkpoint. One
/// transaction is open at any time; a failed delivery voids it, and everything sent in it since
/// the last commit must be sent again after [`Transactions::recover`].
pub trait Transactions: Send + Sync {
    /// Resolves once a delivery failed inside the open transaction; never otherwise. Stays
    /// resolved until [`Transactions::settled_voided`].
    fn voided(&self) -> BoxFuture<'_, ()>;

    /// Every delivery of the aborted transaction has settled: lowers the signal of
    /// [`Transactions::voided`].
    fn settled_voided(&self);

    /// Aborts the open transaction (its deliveries settle) and opens a new one. Fails with
    /// [`Error::Fenced`] when another instance took over, and with [`Error::Transaction`] while
    /// the broker cannot be reached (call again later).
    fn recover(&self) -> BoxFuture<'_, Result<()>>;

    /// Commits the open transaction as it is (events only, the checkpoint stays where it was)
    /// and opens the next.
    fn commit(&self) -> BoxFuture<'_, Result<()>>;

    /// Resolves while another watch sharing the open transaction, in which this one sent, waits
    /// for this one to commit (its commit is then due: the transaction commits once every watch
    /// that sent in it has saved its checkpoint into it).
    fn requested(&self) -> BoxFuture<'_, ()>;

    /// A commit is due and waits for what is in flight: sends what the producer holds now
    /// instead of after its batching delay (`linger.ms`), without waiting for it here.
    fn send_now(&self);

    /// The least time between the starts of two commits of a watch that is not listing: its
    /// transactions commit on this cadence, each carrying the checkpoint, independently of the
    /// checkpoint interval.
    fn commit_interval(&self) -> Duration;
}

/// The records of a compacted destination that a snapshot of one watch may prune: the events of
/// the objects of one cluster's resource, in one namespace when given, as their CloudEvents
/// attributes say (records of other resources or clusters sharing the destination, and the
/// snapshots' markers, are never theirs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The `cluster` attribute.
    pub cluster: String,
    /// The `apiversion` attribute.
    pub api_version: String,
    /// The `resource` attribute.
    pub resource: String,
    /// The `namespace` attribute, when the snapshot is limited to one.
    pub namespace: Option<String>,
}

impl Owner {
    /// Whether the record whose attribute `name` is `attribute(name)` is the event of one of
    /// these objects: it names an object (`uid`), and this cluster, resource and namespace.
    pub fn owns<'a>(&self, attribute: impl Fn(&str) -> Option<&'a str>) -> bool {
        use crate::attribute::{APIVERSION, CLUSTER, NAMESPACE, RESOURCE, UID};
        attribute(UID).is_some()
            && attribute(CLUSTER) == Some(self.cluster.as_str())
            && attribute(APIVERSION) == Some(self.api_version.as_str())
            && attribute(RESOURCE) == Some(self.resource.as_str())
            && self
                .namespace
                .as_deref()
                .is_none_or(|ns| attribute(NAMESPACE) == Some(ns))
    }
}

/// A sink whose destinations are compacted by record key (Kafka with `cleanup.policy=compact`):
/// a snapshot can tombstone the keys of objects the cluster no longer has, so that the
/// destination converges to the cluster's state.
pub trait Compaction: Send + Sync {
    /// The keys `destination` holds for `owner`: those whose latest record, read up to the end
    /// of every partition as it was when called (committed records only), is an event of one of
    /// `owner`'s objects (not a tombstone, not another's record).
    fn held_keys<'a>(
        &'a self,
        destination: &'a str,
        owner: &'a Owner,
    ) -> BoxFuture<'a, Result<Vec<String>>>;

    /// Publishes a tombstone (the key, no value) for each of `keys` to `destination` in the
    /// watch's stream (in a transaction: the open one), and waits until the broker
    /// acknowledged them all.
    fn tombstones<'a>(
        &'a self,
        destination: &'a str,
        keys: &'a [String],
    ) -> BoxFuture<'a, Result<()>>;
}

/// Where the checkpoints of a sink's watches live.
#[derive(Debug)]
pub enum Checkpoints<'a> {
    /// Files in `checkpoint.directory`.
    Directory,
    /// A key-value bucket (`checkpoint.natsBucket`) of this JetStream.
    NatsBucket(&'a async_nats::jetstream::Context),
    /// A compacted topic (`checkpoint.kafkaTopic`), written in the transactions of the
    /// watches' events: the watches share a transactional producer, or with sharding each has
    /// its own ([`kafka::WatchSinks::for_watch`]).
    KafkaTopic(Box<kafka::WatchSinks>),
    /// Nowhere: this sink cannot keep checkpoints, for the reason given.
    Unsupported(&'static str),
}

/// What a sink kind does with its validated settings, beyond what the configuration knows of
/// them ([`SinkSettings`]): implemented by the settings type in each sink's folder.
pub trait Settings: SinkSettings + describe::Describe {
    /// Connects to the sink. Destinations are prepared per resource, when their watches start
    /// ([`Sink::prepare`]).
    fn connect(&self) -> BoxFuture<'_, Result<Arc<AnySink>>>;

    /// Where the events of `r` go, as `check-config --cluster` prints it
    /// (`kafka topic k8s.dev.core.pods`).
    fn plan(&self, cluster: &str, r: &ResolvedResource) -> String;

    /// Subscribes where the events of each scope's resources are published, for `tail`: every
    /// message decoded as a CloudEvent, or why it could not be, each at most once however many
    /// scopes share its destination. Fails with [`Error::NoSubscription`] when the sink has
    /// nothing to subscribe to.
    fn subscribe<'a>(
        &'a self,
        scopes: &'a [Scope<'a>],
        from_beginning: bool,
    ) -> BoxFuture<'a, Result<Messages>>;
}

/// What `tail` follows in one cluster: its name, or every cluster discovered from kubeconfig
/// Secrets, and the resources watched there.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// The cluster; `None` for every cluster of the kubeconfig Secrets, whose names are known
    /// only to the running bridge: the `{cluster}` token then matches any name, where the
    /// broker allows a wildcard (a NATS subject token, a Kafka topic regex).
    pub cluster: Option<&'a str>,
    /// The resources, as discovery resolved them.
    pub resources: &'a [ResolvedResource],
}

/// [`Settings::subscribe`] of a sink with nothing to subscribe to: its events are at `reason`.
pub fn no_subscription(
    kind: &'static str,
    reason: &'static str,
) -> BoxFuture<'static, Result<Messages>> {
    Box::pin(std::future::ready(Err(Error::NoSubscription {
        kind,
        reason,
    })))
}

/// The messages of a subscription, each decoded as a CloudEvent or why it is not one.
pub type Messages = BoxStream<'static, std::result::Result<cloudevents::Event, String>>;

/// How a sink kind's settings type is found from the configuration's [`config::Sink`].
pub struct Registered {
    cast: fn(&dyn Any) -> Option<&dyn Settings>,
}

inventory::collect!(Registered);

impl Registered {
    /// The registration of settings type `T`.
    pub const fn of<T: Settings>() -> Self {
        Self { cast: cast::<T> }
    }
}

fn cast<T: Settings>(settings: &dyn Any) -> Option<&dyn Settings> {
    settings.downcast_ref::<T>().map(|t| t as &dyn Settings)
}

/// Registers a sink kind: its [`config::SinkKind`] (name, schema, validation) and its settings
/// type, which implements [`Settings`]. The one line a sink's folder adds outside itself is its
/// `mod` line in `sink.rs`.
#[macro_export]
macro_rules! register_sink {
    ($settings:ty, $kind:expr) => {
        ::inventory::submit!($kind);
        ::inventory::submit!($crate::sink::Registered::of::<$settings>());
    };
}
pub use register_sink as register;

/// What the sink kind of `sink` does with it.
pub fn settings(sink: &config::Sink) -> Result<&dyn Settings> {
    inventory::iter::<Registered>
        .into_iter()
        .find_map(|r| (r.cast)(sink.as_any()))
        .ok_or(Error::Unregistered { kind: sink.kind() })
}

/// Connects to the configured sink. Destinations are prepared per resource, when their watches
/// start ([`Sink::prepare`]).
pub async fn connect(sink: &config::Sink) -> Result<Arc<AnySink>> {
    settings(sink)?.connect().await
}
