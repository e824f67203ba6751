//! NATS: JetStream publishes wait for the stream's acknowledgement and carry `Nats-Msg-Id` = event
//! id, so the server drops a duplicate within its window. Core NATS (no `jetstream` section) is
//! fire-and-forget: at most once. Checkpoints live in a JetStream key-value bucket.

mod asyncapi;
mod config;
mod error;
mod settings;
mod sink;

pub use config::connect_client;
pub use settings::{JetStreamConfig, Nats, NatsConfig, decode};
pub use sink::{NatsSink, captures, classify, message};
