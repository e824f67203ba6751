//! The Leases of sharding: their names and labels, what one says (holder, expiry as observed
//! here), and the requests that create, take, renew and release one. Every write is a
//! compare-and-swap on the Lease's resourceVersion, so two replicas never both think they won.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};

use crate::known::stable_hash;

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
        Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(labels.into_iter().collect()),
                annotations,
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.to_string()),
                lease_duration_seconds: Some(duration.as_secs() as i32),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        }
    }
}

/// The current time as a Lease stores it.
pub(crate) fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// A Lease as this replica last saw it, and since when it has not changed.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    /// The Lease.
    pub lease: Lease,
    /// When its resourceVersion last changed, on this replica's monotonic clock.
    pub changed_at: Instant,
}

impl Seen {
    /// A Lease seen for the first time at `now`. Its expiry is judged from local time only, as
    /// client-go does: it is valid for a whole duration from now, whatever its renew time says
    /// (another machine's clock, or ours, may be off by more than a lease duration: a replica
    /// whose clock runs ahead would otherwise see every live Lease as expired and take it
    /// without a hand-off).
    pub(crate) fn first(lease: Lease, now: Instant) -> Self {
        Self {
            lease,
            changed_at: now,
        }
    }

    /// Records `lease`, newer than what was seen: the clock restarts when it changed.
    pub(crate) fn update(&mut self, lease: Lease, now: Instant) {
        if lease.metadata.resource_version != self.lease.metadata.resource_version {
            self.changed_at = now;
        }
        self.lease = lease;
    }

    /// The holder while the Lease is valid: set, and renewed within its duration.
    pub(crate) fn holder(&self) -> Option<&str> {
        let holder = self.holder_identity()?;
        (self.changed_at.elapsed() < lease_duration(&self.lease)).then_some(holder)
    }

    /// When the Lease expires or expired, as seen here: one duration after it last changed.
    pub(crate) fn expires_at(&self) -> Instant {
        self.changed_at + lease_duration(&self.lease)
    }

    /// Whether the Lease is a member Lease of a replica that is leaving.
    pub(crate) fn is_leaving(&self) -> bool {
        self.lease
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(LEAVING))
    }

    /// The holder written in the Lease, valid or not.
    pub(crate) fn holder_identity(&self) -> Option<&str> {
        let spec = self.lease.spec.as_ref()?;
        spec.holder_identity.as_deref().filter(|h| !h.is_empty())
    }

    /// When the Lease became free as seen here: released (no holder) since it last changed, or
    /// expired one duration after it last changed; `None` while it is held.
    pub(crate) fn free_since(&self) -> Option<Instant> {
        match self.holder_identity() {
            None => Some(self.changed_at),
            Some(_) if self.holder().is_none() => Some(self.changed_at),
            Some(_) => None,
        }
    }
}

/// How long `lease` stays valid without renewal (15 s when unset, like client-go).
pub(crate) fn lease_duration(lease: &Lease) -> Duration {
    let secs = lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .unwrap_or(15)
        .max(1);
    Duration::from_secs(secs as u64)
}

/// How long ago `lease` was renewed, by the wall clock; `None` without a renew time or when it
/// lies in the future.
pub(crate) fn renew_age(lease: &Lease) -> Option<Duration> {
    let renewed = lease.spec.as_ref()?.renew_time.as_ref()?.0;
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(renewed);
    Duration::try_from(age).ok()
}

/// `current` held by `holder` from now on: renewed, or taken (a new acquire time and one more
/// transition when the holder changes), with `current`'s resourceVersion for the
/// compare-and-swap.
pub(crate) fn held_by(current: &Lease, holder: &str, duration: Duration) -> Lease {
    let mut lease = current.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(holder) {
        spec.acquire_time = Some(now());
        let before = spec.holder_identity.as_deref().unwrap_or_default();
        spec.lease_transitions =
            Some(spec.lease_transitions.unwrap_or(0) + i32::from(!before.is_empty()));
        spec.holder_identity = Some(holder.to_string());
    }
    spec.lease_duration_seconds = Some(duration.as_secs() as i32);
    spec.renew_time = Some(now());
    lease
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

/// The holder written in `lease`, if any.
pub(crate) fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// `current` released: no holder, so any replica may take it at once.
pub(crate) fn released(current: &Lease) -> Lease {
    let mut lease = current.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.renew_time = Some(now());
    lease
}

/// Whether an error says another writer got there first (409) or the Lease is gone (404).
pub(crate) fn lost_race(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(e) if e.code == 409 || e.code == 404)
}

/// Writes `lease` over the stored one (compare-and-swap on its resourceVersion), or creates it
/// when it has none. `Ok(None)` when another writer got there first.
pub(crate) async fn write(api: &Api<Lease>, lease: &Lease) -> kube::Result<Option<Lease>> {
    let name = lease.metadata.name.clone().unwrap_or_default();
    let written = if lease.metadata.resource_version.is_some() {
        api.replace(&name, &PostParams::default(), lease).await
    } else {
        api.create(&PostParams::default(), lease).await
    };
    match written {
        Ok(lease) => Ok(Some(lease)),
        Err(e) if lost_race(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Deletes the Lease `name` if it still has `resource_version`.
pub(crate) async fn delete(api: &Api<Lease>, name: &str, resource_version: Option<String>) {
    let mut params = DeleteParams::default();
    if let Some(rv) = resource_version {
        params = params.preconditions(kube::api::Preconditions {
            resource_version: Some(rv),
            uid: None,
        });
    }
    match api.delete(name, &params).await {
        Ok(_) => {}
        Err(e) if lost_race(&e) => {}
        Err(e) => {
            tracing::warn!(lease = %name, error = %e, "cannot delete lease; it expires instead")
        }
    }
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

    #[test]
    fn taking_counts_a_transition_renewing_does_not_releasing_frees() {
        let n = names();
        let d = Duration::from_secs(10);
        let mut lease = n.lease("l", "a", d, Some(("dev.1", "dev/v1/configmaps/x")));
        lease.metadata.resource_version = Some("5".into());
        let renewed = held_by(&lease, "a", d);
        let spec = renewed.spec.as_ref().unwrap();
        assert_eq!(spec.lease_transitions, Some(0));
        assert_eq!(renewed.metadata.resource_version.as_deref(), Some("5"));
        let taken = held_by(&lease, "b", d);
        let spec = taken.spec.as_ref().unwrap();
        assert_eq!(
            (spec.holder_identity.as_deref(), spec.lease_transitions),
            (Some("b"), Some(1))
        );
        let free = released(&taken);
        let seen = Seen::first(free.clone(), Instant::now());
        assert_eq!(seen.holder(), None);
        assert!(seen.free_since().is_some());
        // Taking a released Lease is not a transition from a holder.
        let again = held_by(&free, "c", d);
        assert_eq!(again.spec.unwrap().lease_transitions, Some(1));
    }

    #[test]
    fn a_lease_renewed_long_ago_by_the_wall_clock_is_valid_when_first_seen() {
        let n = names();
        let mut lease = n.lease("l", "a", Duration::from_secs(2), None);
        // Its holder's clock, or ours, is off by an hour.
        let hour_ago =
            k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_hours(1);
        lease.spec.as_mut().unwrap().renew_time = Some(MicroTime(hour_ago));
        let seen = Seen::first(lease, Instant::now());
        assert_eq!(seen.holder(), Some("a"), "judged by local observation only");
        assert_eq!(seen.free_since(), None);
    }

    #[test]
    fn a_lease_expires_when_unchanged_for_its_duration() {
        let n = names();
        let lease = n.lease("l", "a", Duration::from_secs(2), None);
        let t0 = Instant::now();
        let fresh = Seen::first(lease.clone(), t0);
        assert_eq!(fresh.holder(), Some("a"));
        assert_eq!(fresh.free_since(), None);
        let old = Seen {
            lease: lease.clone(),
            changed_at: t0.checked_sub(Duration::from_secs(3)).unwrap(),
        };
        assert_eq!(old.holder(), None);
        assert_eq!(old.holder_identity(), Some("a"));
        assert!(old.free_since().is_some());
        // A new resourceVersion restarts the clock; the same one does not.
        let mut seen = old.clone();
        seen.update(lease.clone(), Instant::now());
        assert_eq!(seen.holder(), None);
        let mut newer = lease;
        newer.metadata.resource_version = Some("9".into());
        seen.update(newer, Instant::now());
        assert_eq!(seen.holder(), Some("a"));
    }
}
