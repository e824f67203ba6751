//! Snapshots on demand: a consumer that joins late asks for the current state of one watch's
//! objects while the bridge runs, without restarting it and without holding live events back.
//!
//! The request is a ConfigMap labelled [`request::LABEL`] in the bridge's namespace, so that
//! Kubernetes RBAC decides who may ask ([`request`]); `kube-event-bridge snapshot` writes one
//! ([`ask`]). The replica running the watch it names ([`requests`]) walks the resource in
//! chunks ([`walk`]) and queues what it reads behind the watch's own items; the pipeline decides
//! each object against the stream ([`crate::demand`]). Progress is written back on the request
//! ([`record`]) once the broker has acknowledged it, so a restart or a hand-off of the watch
//! resumes the walk where it stood. `snapshot --reset` keeps the older way: it deletes the
//! checkpoints ([`reset`]).

pub mod ask;
pub mod prune;
pub mod record;
pub mod request;
pub mod requests;
pub mod reset;
pub mod walk;

pub use reset::{Error, Result, reset_checkpoints};
