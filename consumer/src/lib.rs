//! A store of the current Kubernetes objects, fed by the events
//! [kube-event-bridge](https://github.com/kube-event-bridge) publishes to Kafka or NATS
//! JetStream: like kube-runtime's reflector, without the API server.
//!
//! A [`Writer`] applies the event contract (docs/consumers.md) to every record: duplicates
//! (same id) and stale versions (a `sequence` not newer than the store's for that uid) are
//! dropped, deletes and Kafka tombstones remove objects, a recreated object (same name, new
//! uid) replaces the old one, truncated and reference events keep the identity and version and
//! flag the body as missing ([`Body::Missing`]). Objects are kept per cluster (the `cluster`
//! attribute), so one store can follow a fleet: the objects of two clusters with the same
//! namespace and name are two objects, and deletes, tombstones and the memory of deleted uids
//! apply within their cluster. A [`Store`] reads it: get by [`ObjectKey`] (cluster, resource,
//! namespace, name) or by cluster and uid, list, view one cluster ([`Store::cluster`]), and
//! [`Store::wait_until_ready`] once reading caught up with what was published when it started. A subscription ([`kafka::Subscription`], [`nats::Subscription`]) reads the
//! topics or the stream and yields a stream of [`Change`]s.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use futures::StreamExt;
//! use kube_event_bridge_consumer::{Change, ObjectKey, Writer, kafka::Subscription};
//!
//! let mut client = rdkafka::ClientConfig::new();
//! client.set("bootstrap.servers", "127.0.0.1:9092");
//! let writer = Writer::new();
//! let store = writer.store();
//! let mut changes = Subscription::new(client, ["state.prod.configmaps"])
//!     .reflect(writer)
//!     .await?;
//! while let Some(change) = changes.next().await {
//!     match change? {
//!         Change::Applied { object, .. } => println!("now {} at {}", object.key, object.resource_version),
//!         Change::Deleted { object, .. } => println!("gone {}", object.key),
//!         Change::CaughtUp => println!("{} objects", store.len()),
//!         Change::SnapshotComplete { id, pruned, .. } => println!("snapshot {id}: {pruned} stale objects removed"),
//!     }
//! }
//! let web = store.get(&ObjectKey::namespaced("prod", "configmaps", "shop", "web"));
//! let prod = store.cluster("prod").len();
//! # Ok(())
//! # }
//! ```

#[cfg(any(feature = "kafka", feature = "nats"))]
mod bootstrap;
pub mod event;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;
mod reflect;
mod store;

pub use event::{
    ChangeType, Event, Marker, MarkerKind, Message, Origin, Payload, Record, SnapshotResult,
};
pub use reflect::{Input, reflect};
pub use store::{
    Body, CLOCK_MARGIN_MS, Change, ClusterView, DEFAULT_FORGOTTEN_CAPACITY, DeleteCause,
    MissingBody, Object, ObjectKey, Outcome, Store, Writer,
};
