//! The Leases of sharding: their names, labels and annotations (what a Lease stands for, and a
//! member that is leaving). Building, writing and judging a Lease is [`crate::lease`]'s.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::ObjectMeta;

use crate::known::stable_hash;
use crate::lease::{self, Seen};

/// Label naming the group of Leases of one configuration (a hash of the prefix).
pub(crate) const GROUP_LABEL: &str = "kube-event-bridge/shard-group";
/// Label saying what a Lease stands for: [`MEMBER`] or [`WATCH`].
pub(crate) const ROLE_LABEL: &str = "kube-event-bridge/shard-role";
/// A replica's membership.
pub(crate) const MEMBER: &str = "member";
/// One watch's ownership.
pub(crate) const WATCH: &str = "watch";
/// Annotation of a watch Lease: the watch's id.
pub(crate) const WATCH_ID: &str = "kube-event-bridge/watch-id";
/// Annotation of a watch Lease: the watch, readable.
pub(crate) const WATCH_DESCRIPTION: &str = "kube-event-bridge/watch";
/// Annotation of a member Lease: the replica is leaving (it gives its watches up, then deletes
/// the Lease). The others count it out of the assignment at once, while the watch Leases it
/// still holds stay valid until it releases them.
pub(crate) const LEAVING: &str = "kube-event-bridge/leaving";

/// The names of the Leases of one configuration.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    prefix: String,
}

impl Names {
    /// Names under `prefix`.
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
        }
    }

    /// The label selector of every Lease of this group.
    pub(crate) fn selector(&self) -> String {
        format!("{GROUP_LABEL}={}", self.group())
    }

    fn group(&self) -> String {
        format!("{:016x}", stable_hash(self.prefix.as_bytes()))
    }

    /// The member Lease of replica `identity`.
    pub(crate) fn member(&self, identity: &str) -> String {
        format!(
            "{}-m-{:016x}",
            self.prefix,
            stable_hash(identity.as_bytes())
        )
    }

    /// The Lease of the watch `id`.
    pub(crate) fn watch(&self, id: &str) -> String {
        format!("{}-w-{:016x}", self.prefix, stable_hash(id.as_bytes()))
    }

    /// A new Lease named `name`, held by `holder`, for `duration`; a watch Lease carries the
    /// watch's id and description.
    pub(crate) fn lease(
        &self,
        name: &str,
        holder: &str,
        duration: Duration,
        watch: Option<(&str, &str)>,
    ) -> Lease {
        let role = if watch.is_some() { WATCH } else { MEMBER };
        let labels = [
            (GROUP_LABEL.to_string(), self.group()),
            (ROLE_LABEL.to_string(), role.to_string()),
        ];
        let annotations = watch.map(|(id, description)| {
            [
                (WATCH_ID.to_string(), id.to_string()),
                (WATCH_DESCRIPTION.to_string(), description.to_string()),
            ]
            .into_iter()
            .collect()
        });
        let metadata = ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels.into_iter().collect()),
            annotations,
            ..Default::default()
        };
        lease::new(metadata, holder, duration)
    }
}

/// `current` marked as the member Lease of a replica that is leaving ([`LEAVING`]).
pub(crate) fn leaving(current: &Lease) -> Lease {
    let mut lease = current.clone();
    lease
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(LEAVING.to_string(), "true".to_string());
    lease
}

/// Whether `seen` is the member Lease of a replica that is leaving ([`LEAVING`]).
pub(crate) fn is_leaving(seen: &Seen) -> bool {
    seen.lease
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(LEAVING))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names {
        Names::new("kube-event-bridge-dev")
    }

    #[test]
    fn lease_names_are_valid_and_stable() {
        let n = names();
        let member = n.member("keb-7d9f-1");
        let watch = n.watch("dev.0123456789abcdef");
        assert_eq!(member, n.member("keb-7d9f-1"));
        assert_ne!(watch, n.watch("dev.0123456789abcdee"));
        for name in [&member, &watch] {
            assert!(name.starts_with("kube-event-bridge-dev-"), "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{name}"
            );
        }
        assert_eq!(watch.len(), "kube-event-bridge-dev".len() + 19);
        assert!(n.selector().starts_with("kube-event-bridge/shard-group="));
    }
}
