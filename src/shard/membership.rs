//! Who takes part: every replica keeps a member Lease renewed; a member is live while its Lease
//! is (as judged here, [`Seen::holder`]). A replica leaving in order deletes its member Lease
//! first, so the others count it out at once; a killed one is counted out when its Lease expires.

use std::collections::BTreeMap;

use super::lease::{MEMBER, ROLE_LABEL, Seen};

/// The identities of the live members among `view` (Leases by name), sorted; `me` counts unless
/// `leaving`, whatever its Lease says (it may not be written yet).
pub(crate) fn live(view: &BTreeMap<String, Seen>, me: &str, leaving: bool) -> Vec<String> {
    let mut members: Vec<String> = view
        .values()
        .filter(|s| is_member(s))
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

    use super::super::lease::Names;
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
    }
}
