//! The spans of one event, exported over OTLP ([`crate::trace::export`]):
//!
//! ```text
//! read     the pipeline takes the change, encodes it and hands it to the sink; its span id is
//! │        the event's traceparent, its parent the object's annotation (or none: a new trace)
//! ├─ publish   the sink's send (Kafka: queued in the producer; NATS, HTTP: the request written)
//! └─ ack       from the handoff to the broker's acknowledgement; attribute `outcome`
//! ```
//!
//! While export is off every function here returns [`Span::none`] or its input unchanged
//! after one atomic load: nothing is allocated per event.

use std::str::FromStr;

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
};
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::encode::Event;
use crate::sink::{Outcome, Pending};
use crate::trace::export::{TARGET, exporting};

/// The event's `read` span, started before it is encoded; [`Span::none`] unless exporting.
pub fn read() -> Span {
    if !exporting() {
        return Span::none();
    }
    tracing::info_span!(
        target: TARGET,
        parent: None,
        "read",
        cloudevents.event_id = Empty,
        cloudevents.event_source = Empty,
        cloudevents.event_type = Empty,
        cloudevents.event_subject = Empty,
    )
}

/// Parents `read` on the object's trace context and gives the event `read`'s ids, so the
/// `traceparent` consumers see is the span the receiver got.
pub fn adopt(read: &Span, event: &mut Event) {
    if read.is_disabled() {
        return;
    }
    read.record("cloudevents.event_id", event.id.as_str());
    read.record("cloudevents.event_source", event.info.source.as_str());
    read.record("cloudevents.event_type", event.event_type());
    read.record("cloudevents.event_subject", event.subject.as_str());
    if let Some(parent) = event.trace.parent() {
        let flags = match parent.sampled {
            true => TraceFlags::SAMPLED,
            false => TraceFlags::NOT_SAMPLED,
        };
        let state = event.trace.tracestate().map(TraceState::from_str);
        let remote = SpanContext::new(
            TraceId::from_bytes(parent.trace_id),
            SpanId::from_bytes(parent.span_id),
            flags,
            true,
            state.and_then(Result::ok).unwrap_or_default(),
        );
        // Fails only when the exporter's layer is absent, which `exporting` rules out.
        let _ = read.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
    }
    let context = read.context();
    let span = context.span();
    let recorded = span.span_context();
    if recorded.is_valid() {
        event.trace.recorded_as(
            recorded.trace_id().to_bytes(),
            recorded.span_id().to_bytes(),
            recorded.is_sampled(),
        );
    }
}

/// The `publish` span, a child of `read`.
pub fn publish(read: &Span) -> Span {
    if read.is_disabled() {
        return Span::none();
    }
    tracing::info_span!(target: TARGET, parent: read, "publish", otel.kind = "producer")
}

/// `pending` with an `ack` span, a child of `read`, from now to the broker's answer.
pub fn acknowledged(pending: Pending, read: &Span) -> Pending {
    if read.is_disabled() {
        return pending;
    }
    let ack = tracing::info_span!(target: TARGET, parent: read, "ack", outcome = Empty);
    Box::pin(async move {
        let delivered = pending.await;
        ack.record("outcome", outcome(&delivered.outcome));
        delivered
    })
}

/// The `outcome` attribute of an `ack` span.
fn outcome(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Acked => "acked",
        Outcome::Rejected { .. } => "rejected",
        Outcome::Blocked { .. } => "blocked",
        Outcome::Fatal { .. } => "fatal",
        Outcome::Aborted => "aborted",
        Outcome::Retry { .. } => "retry",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::Delivered;

    #[test]
    fn while_export_is_off_no_span_is_made_and_the_acknowledgement_passes_through() {
        let read = read();
        assert!(read.is_none());
        assert!(publish(&read).is_none());
        let pending: Pending = Box::pin(std::future::pending::<Delivered>());
        let before = (&*pending as *const (dyn Future<Output = Delivered> + Send)).cast::<()>();
        let passed = acknowledged(pending, &read);
        let after = (&*passed as *const (dyn Future<Output = Delivered> + Send)).cast::<()>();
        assert_eq!(before, after, "the same box, not a wrapper");
    }
}
