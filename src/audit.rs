//! Who made a change, for audit pipelines: the field manager and operation of the newest
//! `metadata.managedFields` entry, read before the payload strips `managedFields`.
//!
//! The rule ([`author`]):
//!
//! - the newest entry by `time` wins; an entry without `time` counts as older than every entry
//!   with one;
//! - `time` has one-second precision, so two writes in the same second tie: an `Update` entry
//!   then wins over an `Apply` entry (a controller's update usually reacts to an apply, rarely
//!   the reverse), and between entries of the same operation the one the API server lists last
//!   wins (it sorts entries of one operation by time, then manager name);
//! - entries for a subresource (`subresource: status`, `scale`) count like the others: a status
//!   write is a change of the object and produces an event, so its writer is who made it;
//! - entries without a manager name are ignored; without any entry left (no `managedFields`,
//!   a repaired delete, which carries only a reference), there is no author and the `manager`
//!   and `operation` extensions are absent, never empty.
//!
//! `managedFields` records writes, not deletions: a delete event names who last wrote the object.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

/// The operation of a `managedFields` entry, as the API server names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    /// A server-side apply (`PATCH` with `application/apply-patch+yaml`).
    Apply,
    /// Any other write: create, update, or a JSON, merge or strategic merge patch.
    Update,
}

impl Operation {
    /// The value of the `operation` extension.
    pub const fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text {
            "Apply" => Some(Operation::Apply),
            "Update" => Some(Operation::Update),
            _ => None,
        }
    }
}

/// Who made the newest write of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Author {
    /// The field manager (`kubectl-client-side-apply`, `kube-controller-manager`).
    pub manager: String,
    /// Its operation; `None` for an operation this bridge does not know.
    pub operation: Option<Operation>,
}

/// The author of the newest entry of `entries` (see the [module](self) for the rule), or `None`
/// when no entry names a manager.
pub fn author(entries: &[ManagedFieldsEntry]) -> Option<Author> {
    entries
        .iter()
        .enumerate()
        .filter_map(|(index, entry)| {
            let manager = entry.manager.as_deref().filter(|m| !m.is_empty())?;
            let operation = entry.operation.as_deref().and_then(Operation::parse);
            let time = entry.time.as_ref().map(|t| t.0);
            Some(((time, operation, index), manager, operation))
        })
        .max_by_key(|(key, _, _)| *key)
        .map(|(_, manager, operation)| Author {
            manager: manager.to_string(),
            operation,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn entry(manager: &str, operation: &str, time: Option<&str>) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            time: time.map(|t| Time(t.parse().unwrap())),
            api_version: Some("v1".into()),
            fields_type: Some("FieldsV1".into()),
            ..Default::default()
        }
    }

    fn status(mut e: ManagedFieldsEntry) -> ManagedFieldsEntry {
        e.subresource = Some("status".into());
        e
    }

    fn who(entries: &[ManagedFieldsEntry]) -> Option<(String, Option<&'static str>)> {
        author(entries).map(|a| (a.manager, a.operation.map(Operation::as_str)))
    }

    fn named(manager: &str, operation: &'static str) -> Option<(String, Option<&'static str>)> {
        Some((manager.to_string(), Some(operation)))
    }

    #[test]
    fn the_newest_entry_wins_wherever_it_is_listed() {
        let entries = [
            entry("kubectl", "Apply", Some("2025-11-21T14:03:27Z")),
            entry(
                "kube-controller-manager",
                "Update",
                Some("2025-11-21T14:03:20Z"),
            ),
            entry("helm", "Update", Some("2025-11-21T14:03:25Z")),
        ];
        assert_eq!(who(&entries), named("kubectl", "Apply"));
        let mut reversed = entries.clone();
        reversed.reverse();
        assert_eq!(who(&reversed), named("kubectl", "Apply"));
    }

    #[test]
    fn on_a_tie_update_wins_then_the_last_listed() {
        let t = Some("2025-11-21T14:03:27Z");
        // The API server's order: Apply entries first, then Update, each by time then manager.
        let entries = [
            entry("kubectl", "Apply", t),
            entry("a-controller", "Update", t),
            entry("b-controller", "Update", t),
        ];
        assert_eq!(who(&entries), named("b-controller", "Update"));
        // Update wins over Apply even when the Apply is listed last.
        let entries = [entry("ctl", "Update", t), entry("kubectl", "Apply", t)];
        assert_eq!(who(&entries), named("ctl", "Update"));
        let entries = [entry("x", "Apply", t), entry("y", "Apply", t)];
        assert_eq!(who(&entries), named("y", "Apply"));
    }

    #[test]
    fn entries_without_time_are_the_oldest() {
        let entries = [
            entry("timed", "Update", Some("2000-01-01T00:00:00Z")),
            entry("untimed", "Apply", None),
        ];
        assert_eq!(who(&entries), named("timed", "Update"));
        assert_eq!(
            who(&[entry("untimed", "Apply", None)]),
            named("untimed", "Apply")
        );
    }

    #[test]
    fn status_subresource_entries_count() {
        let entries = [
            entry("kubectl", "Apply", Some("2025-11-21T14:03:20Z")),
            status(entry(
                "kube-controller-manager",
                "Update",
                Some("2025-11-21T14:03:21Z"),
            )),
        ];
        assert_eq!(who(&entries), named("kube-controller-manager", "Update"));
    }

    #[test]
    fn no_manager_means_no_author() {
        assert_eq!(who(&[]), None);
        let mut nameless = entry("", "Update", Some("2025-11-21T14:03:27Z"));
        assert_eq!(who(std::slice::from_ref(&nameless)), None);
        nameless.manager = None;
        let entries = [
            entry("kubectl", "Apply", Some("2025-11-21T14:03:20Z")),
            nameless,
        ];
        assert_eq!(
            who(&entries),
            named("kubectl", "Apply"),
            "a nameless entry never hides a named one"
        );
    }

    #[test]
    fn an_unknown_operation_names_the_manager_alone() {
        let entries = [entry("future", "Merge", Some("2025-11-21T14:03:27Z"))];
        assert_eq!(who(&entries), Some(("future".to_string(), None)));
    }
}
