//! Fair assignment of watches to replicas, computed by every replica alone from the same inputs
//! (the live members and the desired watches), so that replicas agree without talking.
//!
//! With R members and W watches every member gets ⌊W/R⌋ or ⌈W/R⌉ watches. Which member gets
//! which watch follows rendezvous hashing bounded by those capacities: each watch goes to the
//! member ranking it highest that still has room, so a member joining or leaving moves a few
//! watches rather than reshuffling them all.

use std::collections::BTreeMap;

use crate::known::stable_hash;

/// The owner of every watch in `watches` among `members` (each list in any order, duplicates
/// ignored); empty when there are no members.
pub(crate) fn assign<'a>(members: &'a [String], watches: &[String]) -> BTreeMap<String, &'a str> {
    let mut members: Vec<&str> = members.iter().map(String::as_str).collect();
    members.sort_unstable();
    members.dedup();
    let mut watches: Vec<&str> = watches.iter().map(String::as_str).collect();
    watches.sort_unstable();
    watches.dedup();
    let mut owners = BTreeMap::new();
    if members.is_empty() {
        return owners;
    }
    let (base, extra) = (watches.len() / members.len(), watches.len() % members.len());
    // The members that take one more: the first `extra` by their own hash, so that which ones do
    // does not depend on how the names sort.
    let mut by_hash = members.clone();
    by_hash.sort_unstable_by_key(|m| (stable_hash(m.as_bytes()), *m));
    let mut room: BTreeMap<&str, usize> = by_hash
        .iter()
        .enumerate()
        .map(|(i, m)| (*m, base + usize::from(i < extra)))
        .collect();
    // Watches in hash order, so that no watch name range is always served first.
    watches.sort_unstable_by_key(|w| (stable_hash(w.as_bytes()), *w));
    for watch in watches {
        let best = members
            .iter()
            .filter(|m| room[**m] > 0)
            .max_by_key(|m| (score(m, watch), **m))
            .copied();
        if let Some(member) = best {
            *room.entry(member).or_default() -= 1;
            owners.insert(watch.to_string(), member);
        }
    }
    owners
}

/// How much `member` wants `watch` (rendezvous hashing).
fn score(member: &str, watch: &str) -> u64 {
    let mut bytes = Vec::with_capacity(member.len() + watch.len() + 1);
    bytes.extend_from_slice(member.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(watch.as_bytes());
    // FNV's last bytes weigh little in its high bits: mix them (splitmix64's finalizer).
    let mut z = stable_hash(&bytes);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}")).collect()
    }

    fn counts<'a>(owners: &BTreeMap<String, &'a str>) -> BTreeMap<&'a str, usize> {
        let mut counts = BTreeMap::new();
        for m in owners.values() {
            *counts.entry(*m).or_default() += 1;
        }
        counts
    }

    #[test]
    fn every_member_owns_the_floor_or_the_ceiling_of_its_share() {
        for r in 1..=7 {
            for w in 0..=40 {
                let members = names("replica-", r);
                let watches = names("cluster.watch", w);
                let owners = assign(&members, &watches);
                assert_eq!(owners.len(), w, "every watch has one owner (r={r} w={w})");
                let counts = counts(&owners);
                for m in &members {
                    let n = counts.get(m.as_str()).copied().unwrap_or(0);
                    assert!(
                        n == w / r || n == w.div_ceil(r),
                        "r={r} w={w}: {m} owns {n}"
                    );
                }
            }
        }
    }

    #[test]
    fn replicas_agree_whatever_order_they_list_in() {
        let members = names("pod-", 4);
        let watches = names("w", 13);
        let mut reversed_members = members.clone();
        reversed_members.reverse();
        let mut shuffled = watches.clone();
        shuffled.rotate_left(5);
        shuffled.push(watches[0].clone());
        assert_eq!(
            assign(&members, &watches),
            assign(&reversed_members, &shuffled)
        );
    }

    #[test]
    fn a_member_joining_takes_its_share_and_most_watches_stay() {
        let watches = names("cluster.w", 12);
        let (three, four) = (names("pod-", 3), names("pod-", 4));
        let before = assign(&three, &watches);
        let after = assign(&four, &watches);
        let moved = watches.iter().filter(|w| before[*w] != after[*w]).count();
        let joined = counts(&after)["pod-3"];
        assert_eq!(joined, 3);
        // Rendezvous hashing moves the new member's share and, through the capacities, a
        // few more; a modulo assignment would move nine of twelve here.
        assert!(moved < watches.len() / 2 + 1, "{moved} of 12 moved");
    }

    #[test]
    fn no_member_no_owner() {
        assert!(assign(&[], &names("w", 3)).is_empty());
    }
}
