//! Distributed tracing: every event carries the W3C Trace Context of its own span (the
//! CloudEvents distributed-tracing extension, `traceparent` and `tracestate`), a child of the
//! context an object's annotation names, or the root of a new trace ([`context`]); and, when the
//! standard `OTEL_*` variables ask for it, the bridge exports its spans of each event (`read`,
//! `publish`, `ack`) over OTLP ([`export`]; the pipeline makes them, `pipeline::spans`). Export is off by default, and then no
//! span is created per event.

pub mod context;
pub mod export;

pub use context::{Parent, TraceContext};
