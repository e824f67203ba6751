//! The control events that frame a snapshot on demand on its watch's topic or subject:
//! `io.kubeeventbridge.snapshot.begin` (the resource, the scope and the expected count) and
//! `io.kubeeventbridge.snapshot.end` (the counts and the result). A consumer that read from a
//! begin marker to its end marker holds the complete state of the scope. Both are structured
//! CloudEvents with deterministic ids, so a marker sent again after a restart is a duplicate.

use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{Outcome, Scope, Tally};
use crate::attribute;
use crate::encode::{DATA_CONTENT_TYPE, ResourceInfo};

/// The `type` of a begin marker.
pub const BEGIN: &str = "io.kubeeventbridge.snapshot.begin";
/// The `type` of an end marker.
pub const END: &str = "io.kubeeventbridge.snapshot.end";

/// The watch a marker is published for.
#[derive(Debug, Clone, Copy)]
pub struct Watch<'a> {
    /// The watch's id, the middle of the marker's id.
    pub id: &'a str,
    /// Its readable description: the marker's `subject`.
    pub description: &'a str,
}

/// The begin marker of `scope` on `watch`, sent at `now`.
pub fn begin(info: &ResourceInfo, scope: &Scope, watch: Watch<'_>, now: OffsetDateTime) -> Vec<u8> {
    let data = json!({
        "snapshotId": &*scope.id,
        "request": scope.request,
        "watch": watch.description,
        "cluster": &*info.cluster,
        "resource": scope.resource,
        "namespace": scope.namespace,
        "labelSelector": scope.label_selector,
        "expected": scope.expected,
        "prune": scope.prune,
    });
    document(info, scope, watch, BEGIN, now, data)
}

/// The end marker of `scope` on `watch` with the totals of the whole snapshot, sent at `now`.
pub fn end(
    info: &ResourceInfo,
    scope: &Scope,
    watch: Watch<'_>,
    total: Tally,
    outcome: &Outcome,
    now: OffsetDateTime,
) -> Vec<u8> {
    let (result, message) = match outcome {
        Outcome::Complete => ("complete", None),
        Outcome::Failed(message) => ("failed", Some(message.as_str())),
    };
    let data = json!({
        "snapshotId": &*scope.id,
        "request": scope.request,
        "watch": watch.description,
        "sent": total.emitted,
        "skipped": total.skipped,
        "pruned": total.pruned,
        "result": result,
        "message": message,
    });
    document(info, scope, watch, END, now, data)
}

/// The id of the marker of type `kind` (begin or end) of snapshot `snapshot` on watch `watch`:
/// `{snapshotid}:{watch id}:begin|end`. It is also the marker's `partitionkey` (the Kafka record
/// key) and its `Nats-Msg-Id`: unique per marker, so that a compacted topic keeps every marker
/// and a marker sent again is a duplicate.
pub fn id(snapshot: &str, watch: &str, kind: &str) -> String {
    let suffix = kind.rsplit('.').next().unwrap_or(kind);
    format!("{snapshot}:{watch}:{suffix}")
}

/// The structured CloudEvent of a marker of type `kind` carrying `data`.
fn document(
    info: &ResourceInfo,
    scope: &Scope,
    watch: Watch<'_>,
    kind: &str,
    now: OffsetDateTime,
    data: Value,
) -> Vec<u8> {
    let id = id(&scope.id, watch.id, kind);
    let mut event = json!({
        (attribute::SPECVERSION): "1.0",
        (attribute::ID): &id,
        (attribute::SOURCE): info.source,
        (attribute::TYPE): kind,
        (attribute::SUBJECT): watch.description,
        (attribute::TIME): now.format(&Rfc3339).unwrap_or_default(),
        (attribute::CLUSTER): &*info.cluster,
        (attribute::APIVERSION): info.api_version,
        (attribute::RESOURCE): info.resource,
        (attribute::PARTITIONKEY): &id,
        (attribute::SNAPSHOTID): &*scope.id,
        (attribute::DATACONTENTTYPE): DATA_CONTENT_TYPE,
        (attribute::DATA): data,
    });
    if let (Some(ns), Value::Object(map)) = (&scope.namespace, &mut event) {
        map.insert(attribute::NAMESPACE.into(), Value::from(ns.as_str()));
    }
    // Strings and integers always serialize.
    serde_json::to_vec(&event).expect("a marker serializes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn scope() -> Scope {
        Scope {
            id: Arc::from("5f0c"),
            request: "bridge/snap-1".into(),
            resource: "v1/configmaps".into(),
            namespace: Some("shop".into()),
            label_selector: Some("app=web".into()),
            expected: Some(42),
            prune: false,
        }
    }

    const WATCH: Watch<'static> = Watch {
        id: "prod.0123456789abcdef",
        description: "v1/configmaps in shop",
    };

    fn parse(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn a_begin_marker_states_the_resource_the_scope_and_the_expected_count() {
        let info = crate::encode::tests::info("", "v1", "ConfigMap", "configmaps", true);
        let doc = parse(&begin(&info, &scope(), WATCH, OffsetDateTime::UNIX_EPOCH));
        assert_eq!(doc["type"], BEGIN);
        assert_eq!(doc["id"], "5f0c:prod.0123456789abcdef:begin");
        assert_eq!(doc["snapshotid"], "5f0c");
        assert_eq!(
            doc["partitionkey"], doc["id"],
            "the record key is the marker's own"
        );
        assert_eq!(doc["namespace"], "shop");
        assert_eq!(doc["source"], info.source.as_str());
        assert_eq!(doc["data"]["expected"], 42);
        assert_eq!(doc["data"]["labelSelector"], "app=web");
        assert_eq!(doc["data"]["resource"], "v1/configmaps");
        assert_eq!(doc["time"], "1970-01-01T00:00:00Z");
    }

    #[test]
    fn an_end_marker_states_the_totals_and_why_it_failed() {
        let info = crate::encode::tests::info("", "v1", "ConfigMap", "configmaps", true);
        let total = Tally {
            emitted: 40,
            skipped: 2,
            pruned: 3,
        };
        let now = OffsetDateTime::UNIX_EPOCH;
        let done = parse(&end(&info, &scope(), WATCH, total, &Outcome::Complete, now));
        assert_eq!(done["type"], END);
        assert_eq!(done["id"], "5f0c:prod.0123456789abcdef:end");
        assert_eq!(
            (
                &done["data"]["sent"],
                &done["data"]["skipped"],
                &done["data"]["pruned"]
            ),
            (&json!(40), &json!(2), &json!(3))
        );
        assert_eq!(done["data"]["result"], "complete");
        assert!(done["data"]["message"].is_null());
        let failed = Outcome::Failed("the request was deleted".into());
        let failed = parse(&end(&info, &scope(), WATCH, total, &failed, now));
        assert_eq!(failed["data"]["result"], "failed");
        assert_eq!(failed["data"]["message"], "the request was deleted");
    }
}
