//! Integration tests against the real local environment (etcd + kube-apiserver, Kafka, NATS
//! JetStream, an OTLP receiver) started by `scripts/testenv up`; see `support::env` for the variables they need.

mod access_review;
mod admin;
mod alerts;
mod asyncapi;
mod audit;
mod behaviour;
mod bridge;
mod checkpoint;
mod cli_consumers;
mod cli_fleet;
mod components;
mod consumer;
mod consumer_snapshot;
mod credentials;
mod deploy;
mod dynamic;
mod fleet;
mod fleet_env;
mod harness;
mod http_sink;
mod image;
mod languages;
mod memory;
mod quickstart;
mod receiver;
mod recorder;
mod resilience;
mod shaping;
mod sharded_dynamic;
mod sharding;
mod stalls;
mod store_check;
mod support;
mod tracing;
mod transactions;
