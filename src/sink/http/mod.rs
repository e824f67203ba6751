//! HTTP: CloudEvents over HTTP (binary or structured mode) to a receiver such as a Knative
//! Broker, a webhook or a cloud function; a 2xx response acknowledges the event. Checkpoints live
//! in files (`checkpoint.directory`).

mod asyncapi;
mod config;
mod error;
mod settings;
mod sink;
mod url;

pub use settings::{Http, HttpConfig, HttpCredentials, K_CA_CERTS, K_CE_OVERRIDES, K_SINK};
pub use sink::{HttpSink, classify, retry_after};
