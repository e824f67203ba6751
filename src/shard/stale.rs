//! Leases nobody needs any more: the member Lease of a replica that was killed (it could not
//! delete its own) and the free Lease of a watch no longer desired (a namespace left a
//! selector, a CRD was deleted). Left alone they would pile up over the life of a cluster.
//!
//! A Lease counts as stale only well after it became free, so that a replica paused for a
//! while or a moment when replicas see different desired watches does not cost a Lease: a
//! member Lease unchanged for [`MEMBER_GRACE`] lease durations (expired for two), a watch
//! Lease [`WATCH_GRACE`] lease durations after it was released or its holder's member Lease
//! expired ([`watch_free_since`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::membership::{role, watch_free_since};
use super::names::{Names, WATCH};
use crate::lease::Seen;

/// Lease durations a member Lease stays unchanged before it is deleted.
pub(crate) const MEMBER_GRACE: u32 = 3;
/// Lease durations a free watch Lease of an undesired watch stays.
pub(crate) const WATCH_GRACE: u32 = 5;

/// The stale Leases of `view` (by name) with the resourceVersion seen, for a delete conditional
/// on it; `desired` holds the names of the watch Leases of the desired watches, which stay.
pub(crate) fn leases(
    view: &BTreeMap<String, Seen>,
    names: &Names,
    desired: &BTreeSet<String>,
    lease_duration: Duration,
) -> Vec<(String, Option<String>)> {
    view.iter()
        .filter(|(name, seen)| {
            let (free_since, grace) = match role(seen) {
                Some(WATCH) if desired.contains(*name) => return false,
                Some(WATCH) => (watch_free_since(view, names, seen), WATCH_GRACE),
                _ => (seen.free_since(), MEMBER_GRACE),
            };
            free_since.is_some_and(|t| t.elapsed() >= lease_duration * grace)
        })
        .map(|(name, seen)| (name.clone(), seen.lease.metadata.resource_version.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::names::Names;
    use super::*;
    use crate::lease::released;

    #[test]
    fn only_long_free_members_and_undesired_watches_are_stale() {
        let names = Names::new("p");
        let d = Duration::from_secs(2);
        let now = Instant::now();
        let ago = |secs| now.checked_sub(Duration::from_secs(secs)).unwrap();
        let member = |who: &str, changed_at| {
            let mut lease = names.lease(&names.member(who), who, d, None);
            lease.metadata.resource_version = Some(format!("{who}1"));
            Seen { lease, changed_at }
        };
        let watch = |id: &str, changed_at, free: bool| {
            let lease = names.lease(&names.watch(id), "a", d, Some((id, id)));
            let lease = if free { released(&lease) } else { lease };
            Seen { lease, changed_at }
        };
        let mut view = BTreeMap::new();
        // Live, expired for a moment only, and gone for long.
        view.insert(names.member("live"), member("live", now));
        view.insert(names.member("late"), member("late", ago(5)));
        view.insert(names.member("gone"), member("gone", ago(7)));
        // Held; released but desired; released and undesired, recently and for long; expired
        // and undesired for long.
        view.insert(names.watch("held"), watch("held", ago(60), false));
        view.insert(names.watch("kept"), watch("kept", ago(60), true));
        view.insert(names.watch("recent"), watch("recent", ago(9), true));
        view.insert(names.watch("old"), watch("old", ago(11), true));
        view.insert(names.watch("dead"), watch("dead", ago(60), false));
        // Undesired, written long ago, but its holder's member Lease is live: still held.
        let running = names.lease(&names.watch("running"), "live", d, Some(("r", "r")));
        view.insert(
            names.watch("running"),
            Seen {
                lease: running,
                changed_at: ago(60),
            },
        );
        let desired = [names.watch("held"), names.watch("kept")].into();
        let mut stale: Vec<String> = leases(&view, &names, &desired, d)
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        stale.sort();
        let mut expected = vec![
            names.member("gone"),
            names.watch("old"),
            names.watch("dead"),
        ];
        expected.sort();
        assert_eq!(stale, expected);
        let gone = leases(&view, &names, &desired, d)
            .into_iter()
            .find(|(name, _)| *name == names.member("gone"));
        assert_eq!(gone.and_then(|(_, rv)| rv).as_deref(), Some("gone1"));
    }
}
