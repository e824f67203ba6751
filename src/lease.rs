//! Kubernetes Leases (`coordination.k8s.io/v1`): the one module that builds, writes and judges
//! them, for leader election ([`crate::leader`]) and sharding ([`crate::shard`]).
//!
//! - **One clock.** Everything is judged on this process's monotonic clock (`Instant`), which
//!   keeps running while the process is stopped, so a SIGSTOP'd holder notices on waking.
//! - **Expiry by local observation** ([`Seen`]), as client-go judges it: a Lease is held while
//!   it names a holder and its resourceVersion changed within its duration, as observed here.
//!   Its renew time (another machine's wall clock) is never compared with ours.
//! - **Every write is a compare-and-swap** on the resourceVersion ([`write`]): take, renew and
//!   release ([`held_by`], [`released`]) all start from the Lease as read, so two replicas never
//!   both think they won.
//! - **Acting as the holder** ([`Validity`]) ends four fifths of the duration after the last
//!   renewal was sent, before anyone else may judge the Lease expired.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use tokio_util::sync::CancellationToken;

/// The current time as a Lease stores it.
pub(crate) fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// A new Lease with `metadata` (its name, and labels or annotations of the caller's), held by
/// `holder` for `duration`.
pub(crate) fn new(metadata: ObjectMeta, holder: &str, duration: Duration) -> Lease {
    Lease {
        metadata,
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

/// `current` held by `holder` from now on: renewed, or taken (a new acquire time and one more
/// transition when the holder changes, a released Lease included), with `current`'s
/// resourceVersion for the compare-and-swap.
pub(crate) fn held_by(current: &Lease, holder: &str, duration: Duration) -> Lease {
    let mut lease = current.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(holder) {
        // Held before (now, or until a release): another holder takes over, as client-go counts.
        let held = spec
            .holder_identity
            .as_deref()
            .is_some_and(|h| !h.is_empty())
            || spec.acquire_time.is_some();
        spec.acquire_time = Some(now());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + i32::from(held));
        spec.holder_identity = Some(holder.to_string());
    }
    spec.lease_duration_seconds = Some(duration.as_secs() as i32);
    spec.renew_time = Some(now());
    lease
}

/// `current` released: no holder, so any replica may take it at once (a hand-off).
pub(crate) fn released(current: &Lease) -> Lease {
    let mut lease = current.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.renew_time = Some(now());
    lease
}

/// The holder written in `lease`, if any, valid or not.
pub(crate) fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// How long `lease` stays valid without renewal (15 s when unset, like client-go).
pub(crate) fn duration(lease: &Lease) -> Duration {
    let secs = lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .unwrap_or(15)
        .max(1);
    Duration::from_secs(secs as u64)
}

/// How long ago `lease` was renewed by the wall clock, for reports only (never to judge expiry);
/// `None` without a renew time or when it lies in the future.
pub(crate) fn renew_age(lease: &Lease) -> Option<Duration> {
    let renewed = lease.spec.as_ref()?.renew_time.as_ref()?.0;
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(renewed);
    Duration::try_from(age).ok()
}

/// A Lease as this process last saw it, and since when it has not changed.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    /// The Lease.
    pub lease: Lease,
    /// When its resourceVersion last changed, on this process's monotonic clock.
    pub changed_at: Instant,
}

impl Seen {
    /// A Lease seen for the first time at `now`. It is valid for a whole duration from now,
    /// whatever its renew time says (another machine's clock, or ours, may be off by more than a
    /// lease duration: a replica whose clock runs ahead would otherwise see every live Lease as
    /// expired and take it without a hand-off).
    pub(crate) fn first(lease: Lease, now: Instant) -> Self {
        Self {
            lease,
            changed_at: now,
        }
    }

    /// Records `lease`, read at `now`: the clock restarts when its resourceVersion changed.
    pub(crate) fn update(&mut self, lease: Lease, now: Instant) {
        if lease.metadata.resource_version != self.lease.metadata.resource_version {
            self.changed_at = now;
        }
        self.lease = lease;
    }

    /// Records `lease` read at `now` into `seen`, the first sighting or a later one.
    pub(crate) fn record(seen: &mut Option<Seen>, lease: Lease, now: Instant) -> &Seen {
        match seen {
            Some(s) => s.update(lease, now),
            None => *seen = Some(Seen::first(lease, now)),
        }
        seen.as_ref().expect("just recorded")
    }

    /// The holder while the Lease is valid: set, and changed within its duration.
    pub(crate) fn holder(&self) -> Option<&str> {
        let holder = self.holder_identity()?;
        (self.changed_at.elapsed() < duration(&self.lease)).then_some(holder)
    }

    /// When the Lease expires or expired, as seen here: one duration after it last changed.
    pub(crate) fn expires_at(&self) -> Instant {
        self.changed_at + duration(&self.lease)
    }

    /// The holder written in the Lease, valid or not.
    pub(crate) fn holder_identity(&self) -> Option<&str> {
        holder(&self.lease)
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

/// Whether a failed write lost a race: another writer changed the Lease first (409), or deleted
/// it (404 on a replace).
fn lost_race(error: &kube::Error, replacing: bool) -> bool {
    matches!(error, kube::Error::Api(e) if e.code == 409 || (replacing && e.code == 404))
}

/// Writes `lease` over the stored one (compare-and-swap on its resourceVersion), or creates it
/// when it has none. `Ok(None)` when another writer got there first; a create refused with 404
/// (the namespace is missing) is an error.
pub(crate) async fn write(api: &Api<Lease>, lease: &Lease) -> kube::Result<Option<Lease>> {
    let name = lease.metadata.name.clone().unwrap_or_default();
    let replacing = lease.metadata.resource_version.is_some();
    let written = if replacing {
        api.replace(&name, &PostParams::default(), lease).await
    } else {
        api.create(&PostParams::default(), lease).await
    };
    match written {
        Ok(lease) => Ok(Some(lease)),
        Err(e) if lost_race(&e, replacing) => Ok(None),
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
        Err(e) if lost_race(&e, true) => {}
        // During an API server outage every Lease of the process fails alike, and the outage is
        // reported where it stalls something: one line per Lease would flood the log.
        Err(e) if is_transient(&e) => {
            tracing::debug!(lease = %name, error = %e, "cannot delete lease; it expires instead")
        }
        Err(e) => {
            tracing::warn!(lease = %name, error = %e, "cannot delete lease; it expires instead")
        }
    }
}

/// Whether a failed Lease request may succeed when repeated: server errors, throttling,
/// timeouts and connection errors heal; refusals of this request or identity do not.
pub(crate) fn is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(s) => matches!(s.code, 408 | 429 | 500..=599),
        kube::Error::HyperError(_)
        | kube::Error::Service(_)
        | kube::Error::ReadEvents(_)
        | kube::Error::SerdeError(_)
        | kube::Error::FromUtf8(_)
        | kube::Error::Auth(_) => true,
        _ => false,
    }
}

/// Whether this process may act as a Lease's holder (a leader, the owner of a shard's watch),
/// answered from the monotonic clock alone; cancelled when the Lease is lost.
#[derive(Debug, Clone)]
pub struct Validity {
    lost: CancellationToken,
    epoch: Instant,
    valid_until_ms: Arc<AtomicU64>,
}

impl Validity {
    /// A validity not renewed yet (invalid until [`Validity::renewed`]).
    pub(crate) fn unrenewed() -> Self {
        Self {
            lost: CancellationToken::new(),
            epoch: Instant::now(),
            valid_until_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    /// A validity that shares this one's renewals (it lapses when this one does, and a renewal
    /// extends both) but can also be lost on its own: sharding gives one to each watch it holds,
    /// all renewed through the replica's member Lease.
    pub(crate) fn child(&self) -> Self {
        Self {
            lost: self.lost.child_token(),
            epoch: self.epoch,
            valid_until_ms: self.valid_until_ms.clone(),
        }
    }

    /// Ends the validity at once (the Lease was taken over or released).
    pub(crate) fn lose(&self) {
        self.lost.cancel();
    }

    /// Resolves when the validity is lost.
    pub async fn lost(&self) {
        self.lost.cancelled().await;
    }

    /// Whether this process may still act as the holder: its last renewal is recent enough.
    pub fn is_valid(&self) -> bool {
        !self.lost.is_cancelled()
            && (self.epoch.elapsed().as_millis() as u64)
                < self.valid_until_ms.load(Ordering::Relaxed)
    }

    /// Records a renewal sent at `at`: valid until four fifths of `lease_duration` later.
    pub(crate) fn renewed(&self, lease_duration: Duration, at: Instant) {
        // A safety margin of a fifth of the lease: stop acting before anyone may take over.
        let until = at.duration_since(self.epoch) + lease_duration.mul_f32(0.8);
        self.valid_until_ms
            .store(until.as_millis() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, secs: u64) -> Lease {
        let metadata = ObjectMeta {
            name: Some("l".into()),
            ..Default::default()
        };
        new(metadata, holder, Duration::from_secs(secs))
    }

    #[test]
    fn a_child_validity_lapses_and_renews_with_its_parent_and_is_lost_alone() {
        let member = Validity::unrenewed();
        let (a, b) = (member.child(), member.child());
        assert!(!a.is_valid(), "nothing renewed yet");
        member.renewed(Duration::from_secs(10), Instant::now());
        assert!(a.is_valid() && b.is_valid());
        a.lose();
        assert!(!a.is_valid() && b.is_valid() && member.is_valid());
        // Four fifths of a short lease later, every child lapses with the parent.
        member.renewed(Duration::from_millis(20), Instant::now());
        std::thread::sleep(Duration::from_millis(30));
        assert!(!b.is_valid() && !member.is_valid());
    }

    #[test]
    fn taking_counts_a_transition_renewing_does_not_releasing_frees() {
        let d = Duration::from_secs(10);
        let mut lease = lease("a", 10);
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
        // Taking a released Lease is a transition too (a hand-off), as client-go counts it.
        let again = held_by(&free, "c", d);
        assert_eq!(again.spec.unwrap().lease_transitions, Some(2));
        // A Lease never held (no holder, no acquire time) is taken without one.
        let mut blank = taken.clone();
        let spec = blank.spec.as_mut().unwrap();
        (
            spec.holder_identity,
            spec.acquire_time,
            spec.lease_transitions,
        ) = (None, None, None);
        assert_eq!(
            held_by(&blank, "a", d).spec.unwrap().lease_transitions,
            Some(0)
        );
    }

    #[test]
    fn a_lease_renewed_long_ago_by_the_wall_clock_is_valid_when_first_seen() {
        let mut lease = lease("a", 2);
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
        let lease = lease("a", 2);
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
        let mut seen = Some(old.clone());
        Seen::record(&mut seen, lease.clone(), Instant::now());
        assert_eq!(seen.as_ref().unwrap().holder(), None);
        let mut newer = lease;
        newer.metadata.resource_version = Some("9".into());
        assert_eq!(
            Seen::record(&mut seen, newer, Instant::now()).holder(),
            Some("a")
        );
    }

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            serde_json::from_value(serde_json::json!({"code": code, "message": "m"})).unwrap(),
        ))
    }

    #[test]
    fn a_race_is_a_conflict_or_a_lease_deleted_under_a_replace_never_a_missing_namespace() {
        assert!(lost_race(&api(409), false) && lost_race(&api(409), true));
        assert!(lost_race(&api(404), true), "deleted since it was read");
        assert!(!lost_race(&api(404), false), "a create's 404: no namespace");
        assert!(!lost_race(&api(403), true));
    }

    #[test]
    fn server_errors_throttling_and_broken_connections_are_transient() {
        for code in [408, 429, 500, 502, 503, 504] {
            assert!(is_transient(&api(code)), "{code}");
        }
        let reset = std::io::Error::other("connection reset");
        assert!(is_transient(&kube::Error::ReadEvents(reset)));
        assert!(is_transient(&kube::Error::Service(
            "connection refused".into()
        )));
        for code in [400, 401, 403, 404, 422] {
            assert!(!is_transient(&api(code)), "{code}");
        }
        assert!(!is_transient(&kube::Error::TlsRequired));
    }
}
