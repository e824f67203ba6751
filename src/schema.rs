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
    /// `live`, `snapshot` (initial state) or `repaired` (found by a relist after lost watch history).
    pub origin: String,
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

/// File names and contents of every schema.
pub fn all() -> [(&'static str, String); 2] {
    [
        ("config.schema.json", config_schema()),
        ("event.schema.json", event_schema()),
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
}
