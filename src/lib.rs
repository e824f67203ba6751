//! kube-event-bridge: watches Kubernetes resources and publishes every change as a CloudEvent
//! to Kafka, NATS JetStream or standard output.
//!
//! The pipeline, one per watched resource and namespace scope:
//! [`watch`] (list, watch, bookmarks, relist and diff) → [`change`] → [`encode`] (CloudEvent) →
//! [`sink`] (publish, await the broker's acknowledgement) → [`pipeline`] (ordered acknowledgement).

pub mod admin;
pub mod allocator;
pub mod asyncapi;
pub mod audit;
pub mod backoff;
pub mod budget;
pub mod change;
pub mod checkpoint;
pub mod config;
pub mod crd;
pub mod discovery;
pub mod encode;
pub mod knative;
pub mod known;
pub mod kubernetes;
pub mod leader;
pub mod payload;
pub mod pipeline;
pub mod rbac;
pub mod runtime;
pub mod schema;
pub mod shard;
pub mod shutdown;
pub mod sink;
pub mod snapshot;
pub mod status;
pub mod stores;
pub mod supervisor;
pub mod tail;
pub mod template;
pub mod throttle;
pub mod watch;
