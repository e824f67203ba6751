//! JSON Schemas of the configuration and of the events, generated from the Rust types; the files
//! in `schemas/` are checked against this output by a test, so they cannot drift.

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::ConfigFile;

/// A published event in structured mode (in binary mode the same attributes travel as headers and
/// `data` is the body).
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "kube-event-bridge event", extend("$id" = "https://kube-event-bridge.dev/schemas/event/v1"))]
pub struct EventEnvelope {
    /// Always `1.0`.
    pub specversion: String,
    /// `{uid}:{resourceVersion}:{added|modified|deleted}`: deterministic, so a re-sent event keeps its id.
    /// An event of a snapshot on demand: `{uid}:{resourceVersion}:{snapshotid}`.
    pub id: String,
    /// `/k8s/{cluster}/apis/{group}/{version}/{resource}` (`/k8s/{cluster}/api/v1/{resource}` for
    /// core); the API server's URL with `eventFormat: knative`.
    pub source: String,
    /// `io.kubeeventbridge.object.added`, `.modified` or `.deleted` (Knative format:
    /// `dev.knative.apiserver.resource.add|update|delete` or `dev.knative.apiserver.ref.*`).
    #[serde(rename = "type")]
    pub event_type: String,
    /// `namespace/name`, or `name` for cluster-scoped objects (Knative format:
    /// `/apis/{apiVersion}/namespaces/{namespace}/{collection}/{name}`).
    pub subject: String,
    /// When the bridge observed the change (RFC 3339).
    pub time: String,
    /// The schema of `data` (omitted in Knative format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataschema: Option<String>,
    /// Always `application/json`.
    pub datacontenttype: String,
    /// The cluster's name: the configured `cluster`, or in a fleet the name of the member the
    /// object lives in (its `clusters[]` entry, or the cluster its kubeconfig Secret names).
    pub cluster: String,
    /// The object's apiVersion.
    pub apiversion: String,
    /// The object's kind.
    pub kind: String,
    /// The plural resource name.
    pub resource: String,
    /// The namespace; absent for cluster-scoped objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
    /// The object's uid.
    pub uid: String,
    /// The resourceVersion of this change (for a delete: the deletion's).
    pub resourceversion: String,
    /// The resourceVersion zero-padded to 20 digits: sorts as a string.
    pub sequence: String,
    /// The Kafka record key: the uid, or `namespace/name` with `key: namespacedName`.
    pub partitionkey: String,
    /// `live`, `snapshot` (initial state, or a snapshot on demand: then with `snapshotid`) or
    /// `repaired` (found by a relist after lost watch history).
    pub origin: String,
    /// The snapshot on demand the event belongs to: its request's uid, as in the snapshot's
    /// begin and end markers (`schemas/snapshot-marker.schema.json`); absent on every other
    /// event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshotid: Option<String>,
    /// What `data` carries: `full`, `reference` or `diff`.
    pub payload: String,
    /// `true` when the event was cut down to a reference because it exceeded the broker's
    /// message size; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<String>,
    /// Who made the change: the field manager of the newest `metadata.managedFields` entry
    /// (`kubectl-client-side-apply`, `kube-controller-manager`); on a tie of `time` an `Update`
    /// entry wins over an `Apply`, then the entry listed last. Absent when the object has no
    /// managedFields (repaired deletes) or with `auditExtensions: false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manager: Option<String>,
    /// The operation of that entry: `Apply` (server-side apply) or `Update`; absent with
    /// `manager`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^(Apply|Update)$"))]
    pub operation: Option<String>,
    /// The uid of the cluster's `kube-system` namespace, which stays the same when the cluster
    /// is renamed; absent with `auditExtensions: false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusterid: Option<String>,
    /// The W3C `traceparent` of the event's span (the CloudEvents distributed-tracing
    /// extension): `00-{trace id}-{span id}-{flags}`. A child of the trace context the object's
    /// annotation names (`tracing.k8s.io/traceparent` by default: same trace id, that span as
    /// parent), otherwise a new trace per change; flags `01` when the trace is recorded.
    #[schemars(regex(pattern = "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"))]
    pub traceparent: String,
    /// The W3C `tracestate` of the object's annotation (`tracing.k8s.io/tracestate` by
    /// default), carried as received; absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
    /// `full`: the object as the API server sent it, with `metadata.managedFields` and the
    /// last-applied annotation stripped and Secret values (and configured pointers) redacted by
    /// default; a repaired delete carries only apiVersion, kind and metadata (name, namespace,
    /// uid, resourceVersion). `reference`: apiVersion, kind, namespace, name, uid,
    /// resourceVersion (Knative format: apiVersion, kind, name, namespace). `diff`:
    /// `{"object", "patch" (RFC 6902, null when the previous version is unknown), "previous"?}`.
    pub data: serde_json::Value,
}

/// A control event framing a snapshot on demand on its watch's topic, subject or URL:
/// `io.kubeeventbridge.snapshot.begin` before the snapshot's first object,
/// `io.kubeeventbridge.snapshot.end` after its last. Always a structured-mode document
/// (`application/cloudevents+json`), whatever the sink's content mode; its id is its Kafka
/// record key, so a compacted topic keeps every marker. A consumer that read from a begin marker to its end marker with `result`
/// `complete` holds the complete state of the snapshot's scope (docs/events.md, "Snapshots on
/// demand").
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(
    title = "kube-event-bridge snapshot marker",
    extend("$id" = "https://kube-event-bridge.dev/schemas/snapshot-marker/v1")
)]
pub struct SnapshotMarker {
    /// Always `1.0`.
    pub specversion: String,
    /// `{snapshotid}:{watch id}:begin` or `{snapshotid}:{watch id}:end`: deterministic, so a
    /// marker sent again after a restart is a duplicate.
    pub id: String,
    /// The resource's path, as on its object events (`/k8s/{cluster}/api/v1/configmaps`).
    pub source: String,
    /// Which marker.
    #[serde(rename = "type")]
    pub marker_type: MarkerType,
    /// The watch's readable description (`v1/configmaps in shop`).
    pub subject: String,
    /// When the bridge sent the marker (RFC 3339).
    pub time: String,
    /// The cluster the snapshot reads, as the `cluster` of its object events.
    pub cluster: String,
    /// The resource's apiVersion.
    pub apiversion: String,
    /// The plural resource name.
    pub resource: String,
    /// The namespace the snapshot is limited to; absent when it covers every namespace of the
    /// watch (or the resource is cluster-scoped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The marker's `id` again: its Kafka record key, unique per marker.
    pub partitionkey: String,
    /// The snapshot's id: the uid of its request, also the `snapshotid` of its object events.
    pub snapshotid: String,
    /// Always `application/json`.
    pub datacontenttype: String,
    /// What the snapshot covers (begin) or how it ended (end).
    pub data: MarkerData,
}

/// The `type` of a snapshot marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum MarkerType {
    /// The snapshot begins: its objects follow.
    #[serde(rename = "io.kubeeventbridge.snapshot.begin")]
    Begin,
    /// The snapshot ended, completely or not (`data.result`).
    #[serde(rename = "io.kubeeventbridge.snapshot.end")]
    End,
}

/// The `data` of a begin or an end marker.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum MarkerData {
    /// Of a begin marker.
    Begin(BeginData),
    /// Of an end marker.
    End(EndData),
}

/// The `data` of a begin marker: what the snapshot covers.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BeginData {
    /// The snapshot's id (the `snapshotid` attribute).
    pub snapshot_id: String,
    /// The request: `namespace/name` of its ConfigMap.
    pub request: String,
    /// The watch's readable description (the `subject` attribute).
    pub watch: String,
    /// The cluster.
    pub cluster: String,
    /// `apiVersion/plural`, as configured (`v1/configmaps`, `apps/v1/deployments`).
    pub resource: String,
    /// The namespace the snapshot is limited to, or `null`.
    pub namespace: Option<String>,
    /// The label selector the snapshot is limited to (beside the watch's own), or `null`.
    pub label_selector: Option<String>,
    /// How many objects the API server reported when the snapshot began (an estimate: objects
    /// come and go while it runs); `null` when it gave no count, as for a list narrowed by a
    /// selector (a label selector, or a namespace within a cluster-wide watch).
    #[schemars(required)]
    pub expected: Option<u64>,
    /// Whether the snapshot also publishes a tombstone for every key the compacted topic holds
    /// for an object the cluster no longer has (Kafka, before the end marker).
    pub prune: bool,
}

/// The `data` of an end marker: how the snapshot ended.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EndData {
    /// The snapshot's id (the `snapshotid` attribute).
    pub snapshot_id: String,
    /// The request: `namespace/name` of its ConfigMap.
    pub request: String,
    /// The watch's readable description (the `subject` attribute).
    pub watch: String,
    /// Objects published with `origin: snapshot` and this `snapshotid`.
    pub sent: u64,
    /// Objects read but not published: a newer state, or the object's delete, was published
    /// after the begin marker.
    pub skipped: u64,
    /// Tombstones published for keys the compacted topic held for objects the cluster no longer
    /// has (`prune`; 0 otherwise).
    pub pruned: u64,
    /// `complete`: the events from the begin marker to this one hold the scope's complete
    /// state. `failed`: they do not.
    pub result: MarkerResult,
    /// Why the snapshot failed; `null` when complete.
    pub message: Option<String>,
}

/// How a snapshot ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MarkerResult {
    /// Every object of the scope was read and decided.
    Complete,
    /// The snapshot stopped before: the state is not complete.
    Failed,
}

/// The configuration schema as pretty JSON.
pub fn config_schema() -> String {
    let schema = schemars::schema_for!(ConfigFile);
    serde_json::to_string_pretty(&schema).expect("schema serializes") + "\n"
}

/// The event schema as pretty JSON.
pub fn event_schema() -> String {
    let schema = schemars::schema_for!(EventEnvelope);
    serde_json::to_string_pretty(&schema).expect("schema serializes") + "\n"
}

/// The snapshot marker schema as pretty JSON.
pub fn snapshot_marker_schema() -> String {
    let schema = schemars::schema_for!(SnapshotMarker);
    serde_json::to_string_pretty(&schema).expect("schema serializes") + "\n"
}

/// The snapshot marker schema with every subschema inlined (no `$defs`), for documents that
/// embed it (AsyncAPI), where `#/$defs/...` would point into the wrong document.
pub fn snapshot_marker_schema_inlined() -> serde_json::Value {
    let schema = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| s.inline_subschemas = true)
        .into_generator()
        .into_root_schema_for::<SnapshotMarker>();
    schema.to_value()
}

/// File names and contents of every schema.
pub fn all() -> [(&'static str, String); 3] {
    [
        ("config.schema.json", config_schema()),
        ("event.schema.json", event_schema()),
        ("snapshot-marker.schema.json", snapshot_marker_schema()),
    ]
}

/// Writes every schema into `dir`.
pub fn write_all(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, text) in all() {
        std::fs::write(dir.join(name), text)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_in_repo_are_in_sync() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
        for (name, text) in all() {
            let on_disk = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
            assert!(
                on_disk == text,
                "schemas/{name} is stale: run `cargo run -- schema --dir schemas`"
            );
        }
    }

    fn markers() -> (Vec<u8>, Vec<u8>) {
        use crate::demand::marker::{self, Watch};
        use crate::demand::{Outcome, Scope, Tally};
        let info = crate::encode::tests::info("apps", "v1", "Deployment", "deployments", true);
        let scope = Scope {
            id: "9a1e".into(),
            request: "bridge/snap-2".into(),
            resource: "apps/v1/deployments".into(),
            namespace: None,
            label_selector: None,
            expected: None,
            prune: true,
        };
        let watch = Watch {
            id: "dev.00aa",
            description: "apps/v1/deployments",
        };
        let now = time::OffsetDateTime::UNIX_EPOCH;
        let tally = Tally {
            emitted: 2,
            skipped: 1,
            pruned: 4,
        };
        let failed = Outcome::Failed("the request was deleted".into());
        (
            marker::begin(&info, &scope, watch, now),
            marker::end(&info, &scope, watch, tally, &failed, now),
        )
    }

    #[test]
    fn the_markers_the_bridge_sends_read_back_as_the_marker_schema_s_type() {
        let (begin, end) = markers();
        let begin: SnapshotMarker = serde_json::from_slice(&begin).expect("a begin marker");
        assert_eq!(begin.marker_type, MarkerType::Begin);
        assert_eq!(
            begin.namespace, None,
            "no namespace: the attribute is absent"
        );
        let MarkerData::Begin(data) = &begin.data else {
            panic!("begin data: {:?}", begin.data);
        };
        assert_eq!(
            (data.expected, data.label_selector.as_deref(), data.prune),
            (None, None, true),
            "an unknown count is null"
        );
        let end: SnapshotMarker = serde_json::from_slice(&end).expect("an end marker");
        assert_eq!(end.marker_type, MarkerType::End);
        let MarkerData::End(data) = &end.data else {
            panic!("end data: {:?}", end.data);
        };
        assert_eq!(data.result, MarkerResult::Failed);
        assert_eq!(data.message.as_deref(), Some("the request was deleted"));
        assert_eq!((data.sent, data.skipped, data.pruned), (2, 1, 4));
    }

    #[test]
    fn begin_and_end_data_exclude_each_other() {
        let schema: serde_json::Value = serde_json::from_str(&snapshot_marker_schema()).unwrap();
        let defs = &schema["$defs"];
        for name in ["BeginData", "EndData"] {
            assert_eq!(defs[name]["additionalProperties"], false, "{name}");
        }
        let begin_required = defs["BeginData"]["required"].as_array().unwrap();
        assert!(begin_required.contains(&serde_json::json!("expected")));
        assert_eq!(
            defs["BeginData"]["properties"]["namespace"]["type"],
            serde_json::json!(["string", "null"]),
            "null when the snapshot is not limited to a namespace"
        );
        let end_required = defs["EndData"]["required"].as_array().unwrap();
        assert!(end_required.contains(&serde_json::json!("result")));
    }
}
