//! Who takes part, and who holds what: every replica keeps a member Lease renewed; a member is
//! live while its Lease is (as judged here, [`Seen::holder`]). A watch Lease names its holder
//! and is written only when the watch changes hands; it is held while its holder's member Lease
//! is live, so a replica renews one Lease however many watches it owns.
//!
//! A replica leaving in order marks its member Lease [`LEAVING`](super::names::LEAVING): the
//! others count it out of the assignment at once, while the watches it still holds stay its own
//! until it releases them; then it deletes the Lease. A killed one is counted out, and its
//! watches freed, when its member Lease expires.

use std::collections::BTreeMap;
use std::time::Instant;

use super::names::{MEMBER, Names, ROLE_LABEL, is_leaving};
use crate::lease::Seen;

/// The identities of the live members among `view` (Leases by name) that take watches, sorted;
/// `me` counts unless `leaving`, whatever its Lease says (it may not be written yet).
pub(crate) fn live(view: &BTreeMap<String, Seen>, me: &str, leaving: bool) -> Vec<String> {
    let mut members: Vec<String> = view
        .values()
        .filter(|s| is_member(s) && !is_leaving(s))
        .filter_map(|s| s.holder())
        .filter(|holder| *holder != me)
        .map(str::to_string)
        .collect();
    if !leaving {
        members.push(me.to_string());
    }
    members.sort_unstable();
    members.dedup();
    members
}

/// Who holds the watch Lease `watch`, as judged here: the holder it names while that holder's
/// member Lease is live.
pub(crate) fn watch_holder<'a>(
    view: &'a BTreeMap<String, Seen>,
    names: &Names,
    watch: &'a Seen,
) -> Option<&'a str> {
    let holder = watch.holder_identity()?;
    let member = view.get(&names.member(holder))?;
    (member.holder() == Some(holder)).then_some(holder)
}

/// When the watch Lease `watch` became free, as seen here: released (no holder) since it last
/// changed; since its holder's member Lease expired; since it changed when that member Lease is
/// gone. `None` while it is held.
pub(crate) fn watch_free_since(
    view: &BTreeMap<String, Seen>,
    names: &Names,
    watch: &Seen,
) -> Option<Instant> {
    let Some(holder) = watch.holder_identity() else {
        return Some(watch.changed_at);
    };
    match view.get(&names.member(holder)) {
        Some(member) if member.holder() == Some(holder) => None,
        Some(member) => Some(member.expires_at().max(watch.changed_at)),
        None => Some(watch.changed_at),
    }
}

/// The replicas confirmed gone: the resourceVersion of each one's member Lease as seen here when
/// the API server was found to hold no newer one (`None`: no member Lease, here or there), after
/// it had expired here. The confirmation stands while the view still shows that version: the
/// replica's validity had lapsed when it was read, so any renewal landing later first gives
/// every watch it held up ([`Validity`](crate::lease::Validity)), and from then on the
/// compare-and-swap on each watch Lease settles who takes it. One read per departure instead of
/// one per pass of claims.
#[derive(Debug, Default)]
pub(crate) struct Departures {
    confirmed: BTreeMap<String, Option<String>>,
}

impl Departures {
    /// Whether `holder`, whose member Lease is seen at `seen_rv` (`None`: not seen), was
    /// confirmed gone at that version: otherwise its member Lease must be read first.
    pub(crate) fn confirmed(&self, holder: &str, seen_rv: Option<&str>) -> bool {
        self.confirmed
            .get(holder)
            .is_some_and(|rv| rv.as_deref() == seen_rv)
    }

    /// Records `holder` confirmed gone with its member Lease seen at `seen_rv`.
    pub(crate) fn confirm(&mut self, holder: &str, seen_rv: Option<&str>) {
        self.confirmed
            .insert(holder.to_string(), seen_rv.map(str::to_string));
    }

    /// Forgets the confirmations of replicas whose member Lease is no longer seen at the
    /// version confirmed (renewed, recreated or deleted), as `seen_rv` tells it, and those
    /// without a member Lease (kept for one pass only, so that departed identities do not pile
    /// up).
    pub(crate) fn retain<'a>(&mut self, seen_rv: impl Fn(&str) -> Option<&'a str>) {
        self.confirmed
            .retain(|holder, rv| rv.is_some() && rv.as_deref() == seen_rv(holder));
    }
}

/// Whether `seen` is a member Lease.
pub(crate) fn is_member(seen: &Seen) -> bool {
    role(seen) == Some(MEMBER)
}

/// The role label of a Lease.
pub(crate) fn role(seen: &Seen) -> Option<&str> {
    seen.lease
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(ROLE_LABEL))
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::names::Names;
    use super::*;

    #[test]
    fn live_members_are_those_renewed_in_time_and_me_unless_leaving() {
        let names = Names::new("p");
        let d = Duration::from_secs(5);
        let now = Instant::now();
        let mut view = BTreeMap::new();
        for who in ["b", "a"] {
            let lease = names.lease(&names.member(who), who, d, None);
            view.insert(names.member(who), Seen::first(lease, now));
        }
        let dead = names.lease(&names.member("z"), "z", d, None);
        view.insert(
            names.member("z"),
            Seen {
                lease: dead,
                changed_at: now.checked_sub(Duration::from_secs(6)).unwrap(),
            },
        );
        let watch = names.lease(&names.watch("w"), "c", d, Some(("w", "w")));
        view.insert(names.watch("w"), Seen::first(watch, now));
        assert_eq!(live(&view, "me", false), ["a", "b", "me"]);
        assert_eq!(live(&view, "a", true), ["b"]);
        // A member leaving is counted out of the assignment at once.
        let leaving = super::super::names::leaving(&view[&names.member("b")].lease);
        view.insert(names.member("b"), Seen::first(leaving, now));
        assert_eq!(live(&view, "me", false), ["a", "me"]);
    }

    #[test]
    fn a_departure_stands_while_the_member_lease_is_seen_at_the_version_confirmed() {
        let mut d = Departures::default();
        assert!(!d.confirmed("a", Some("7")));
        d.confirm("a", Some("7"));
        d.confirm("gone", None);
        assert!(d.confirmed("a", Some("7")));
        assert!(d.confirmed("gone", None));
        // Renewed (or recreated) since: read it again.
        assert!(!d.confirmed("a", Some("8")));
        assert!(!d.confirmed("a", None));
        assert!(!d.confirmed("gone", Some("1")));
        assert!(!d.confirmed("b", Some("7")));
        d.confirm("b", Some("3"));
        d.retain(|holder| match holder {
            "a" => Some("8"),
            _ => Some("3"),
        });
        assert!(!d.confirmed("a", Some("7")));
        assert!(!d.confirmed("gone", None));
        assert!(d.confirmed("b", Some("3")));
    }

    #[test]
    fn a_watch_lease_is_held_while_its_holders_member_lease_is_live() {
        let names = Names::new("p");
        let d = Duration::from_secs(5);
        let now = Instant::now();
        let ago = |secs| now.checked_sub(Duration::from_secs(secs)).unwrap();
        let mut view = BTreeMap::new();
        let member = |who: &str, changed_at| Seen {
            lease: names.lease(&names.member(who), who, d, None),
            changed_at,
        };
        view.insert(names.member("live"), member("live", ago(4)));
        view.insert(names.member("dead"), member("dead", ago(7)));
        // The watch Leases were written long ago: only the member Leases' renewals count.
        let watch = |holder: &str| Seen {
            lease: names.lease(&names.watch(holder), holder, d, Some((holder, holder))),
            changed_at: ago(60),
        };
        let held = watch("live");
        assert_eq!(watch_holder(&view, &names, &held), Some("live"));
        assert_eq!(watch_free_since(&view, &names, &held), None);
        let orphan = watch("dead");
        assert_eq!(watch_holder(&view, &names, &orphan), None);
        assert_eq!(watch_free_since(&view, &names, &orphan), Some(ago(2)));
        let unknown = watch("gone");
        assert_eq!(watch_holder(&view, &names, &unknown), None);
        assert_eq!(watch_free_since(&view, &names, &unknown), Some(ago(60)));
        // A leaving member still holds its watches until it releases them.
        let leaving = super::super::names::leaving(&view[&names.member("live")].lease);
        view.insert(names.member("live"), Seen::first(leaving, now));
        assert_eq!(watch_holder(&view, &names, &held), Some("live"));
        let released = Seen {
            lease: crate::lease::released(&held.lease),
            changed_at: ago(1),
        };
        assert_eq!(watch_holder(&view, &names, &released), None);
        assert_eq!(watch_free_since(&view, &names, &released), Some(ago(1)));
    }
}
