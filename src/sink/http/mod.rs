//! HTTP: CloudEvents over HTTP (binary or structured mode) to a receiver such as a Knative
//! Broker, a webhook or a cloud function; a 2xx response acknowledges the event. Checkpoints live
//! in files (`checkpoint.directory`).

mod config;
mod sink;

pub use sink::{HttpSink, classify, retry_after};
