//! The two messages that frame a snapshot on demand on a channel: its begin and end markers
//! (`io.kubeeventbridge.snapshot.begin|end`, [`crate::demand::marker`]). Both are structured
//! CloudEvents whatever the sink's content mode, described by the marker JSON Schema of
//! `schemas/snapshot-marker.schema.json` (embedded under `components.schemas`, its subschemas
//! inlined), with an example the bridge's own marker encoder writes.

use std::sync::Arc;

use serde_json::{Value, json};
use time::OffsetDateTime;

use crate::checkpoint::WatchKey;
use crate::demand::marker::{self, Watch};
use crate::demand::{Outcome, Scope, Tally};
use crate::discovery::ResolvedResource;
use crate::encode::{ResourceInfo, STRUCTURED_CONTENT_TYPE};

use super::{Binding, Error, Result};

/// Where the embedded marker schema lives in the document.
pub(super) const SCHEMA_REF: &str = "#/components/schemas/SnapshotMarker";
/// The component ids of the two messages.
pub(super) const BEGIN_ID: &str = "snapshot.begin";
pub(super) const END_ID: &str = "snapshot.end";

/// The example snapshot's id (a request's uid) and request.
const EXAMPLE_SNAPSHOT_ID: &str = "5f0c8d2a-7e41-4b9a-9c3e-1d2f3a4b5c6d";
const EXAMPLE_REQUEST: &str = "kube-event-bridge/snapshot-web";

/// Whether a snapshot's markers go to a channel at `address` (`None`: standard output) of
/// `binding`: one whose address names no object, or any address of a sink whose markers take
/// tokens of their own for the object's name (NATS: `_watch`). A channel with a `{namespace}`
/// parameter and no such tokens gets them for snapshots limited to a namespace only; the bridge
/// publishes no marker, and the snapshot fails, when the watch's destination depends on the
/// object.
pub(super) fn carried_by(binding: &Binding, address: Option<&str>) -> bool {
    binding.sink.marker_tokens().is_some() || address.is_none_or(|a| !a.contains("{name}"))
}

/// The marker JSON Schema as an AsyncAPI Schema Object: self-contained (no `$defs`), without the
/// dialect and id keywords.
pub(super) fn schema() -> Value {
    super::embedded(
        crate::schema::snapshot_marker_schema_inlined(),
        "schemas/snapshot-marker.schema.json",
    )
}

/// The begin and end messages, with examples of a snapshot of `r` whose events are `info`'s:
/// (component id, Message Object) each.
pub(super) fn messages(
    binding: &Binding,
    info: &ResourceInfo,
    r: &ResolvedResource,
    trait_ref: &str,
) -> Result<[(&'static str, Value); 2]> {
    let namespace = r.namespaced.then(|| {
        r.config
            .namespaces
            .as_ref()
            .and_then(|list| list.first().cloned())
            .unwrap_or_else(|| "shop".into())
    });
    let key = WatchKey::for_scope(&info.cluster, r, namespace.as_deref());
    let scope = Scope {
        id: Arc::from(EXAMPLE_SNAPSHOT_ID),
        request: EXAMPLE_REQUEST.into(),
        resource: format!("{}/{}", r.api.api_version, r.api.plural),
        namespace,
        label_selector: None,
        expected: Some(42),
        prune: false,
    };
    let watch = Watch {
        id: &key.id,
        description: &key.description,
    };
    let now = OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(1_763_733_807);
    let total = Tally {
        emitted: 41,
        skipped: 1,
        pruned: 0,
    };
    let begin = marker::begin(info, &scope, watch, now);
    let end = marker::end(info, &scope, watch, total, &Outcome::Complete, now);
    Ok([
        (BEGIN_ID, message(binding, Kind::Begin, &begin, trait_ref)?),
        (END_ID, message(binding, Kind::End, &end, trait_ref)?),
    ])
}

/// Which marker.
#[derive(Clone, Copy)]
enum Kind {
    Begin,
    End,
}

impl Kind {
    fn event_type(self) -> &'static str {
        match self {
            Kind::Begin => marker::BEGIN,
            Kind::End => marker::END,
        }
    }

    /// The `data` members only this marker has.
    fn required(self) -> &'static [&'static str] {
        match self {
            Kind::Begin => &["cluster", "resource", "expected"],
            Kind::End => &["sent", "skipped", "result"],
        }
    }
}

/// One marker's Message Object, `example` its encoded example.
fn message(binding: &Binding, kind: Kind, example: &[u8], trait_ref: &str) -> Result<Value> {
    let example: Value = serde_json::from_slice(example).map_err(Error::Example)?;
    let (name, title, summary) = match kind {
        Kind::Begin => (
            "SnapshotBegin",
            "Snapshot begin marker",
            "A snapshot on demand of this channel's resource begins: its objects follow, as \
             `added` events with `origin: snapshot` and its `snapshotid`. Published before the \
             snapshot reads any object; the scope and the expected count are in `data`.",
        ),
        Kind::End => (
            "SnapshotEnd",
            "Snapshot end marker",
            "A snapshot on demand ended. With `data.result: complete`, the events read from its \
             begin marker to here hold the complete state of its scope; `failed`: they do not.",
        ),
    };
    let mut message = json!({
        "name": name,
        "title": title,
        "summary": summary,
        "contentType": STRUCTURED_CONTENT_TYPE,
        "traits": [{"$ref": trait_ref}],
        "payload": {"allOf": [
            {"$ref": SCHEMA_REF},
            {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "const": kind.event_type()},
                    "data": {"type": "object", "required": kind.required()},
                },
            },
        ]},
        "correlationId": {
            "description": "The CloudEvents `id`: `{snapshotid}:{watch id}:begin|end`.",
            "location": super::describe::STRUCTURED_ID,
        },
    });
    let mut example = json!({"name": name, "summary": "As published.", "payload": example});
    let id = example["payload"]["id"].as_str().unwrap_or_default();
    if let Some(headers) = binding.sink.marker_headers(id) {
        message["headers"] = headers.schema;
        example["headers"] = headers.example;
    }
    message["examples"] = json!([example]);
    if let Some(bindings) = binding.sink.marker_bindings() {
        message["bindings"] = bindings;
    }
    Ok(message)
}
