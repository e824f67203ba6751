//! Kafka: one idempotent producer (`acks=all`), record key = partition key (the object's uid), so
//! every change of an object lands in one partition, in order. Checkpoints live in a compacted
//! topic, written in the transactions of the watches' events.

mod asyncapi;
mod compaction;
mod config;
mod error;
mod group;
mod producer;
mod reads;
mod recovery;
mod settings;
mod sink;

pub use config::{check_brokers, consumer_config, producer_config};
pub use group::{CommitError, PRODUCERS};
pub use reads::{Latest, SharedReads};
pub use settings::{Kafka, KafkaConfig, decode, topic_pattern};
pub use sink::{KafkaSink, Sharing, WatchSinks, classify};
