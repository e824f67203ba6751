//! The `status` command's report: the configuration's watches, the replica each is assigned to,
//! and who holds its Lease; then the members. Read from the API server alone (no replica is
//! asked), with expiry judged by the wall clock (the Leases' renew times), so it is a view from
//! outside: a replica's own judgement uses its monotonic clock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, ListParams};

use super::assign::assign;
use super::names::{self, Names};
use super::{Error, Result, Settings};
use crate::checkpoint::WatchKey;
use crate::config::Config;
use crate::discovery::ResolvedResource;
use crate::discovery::list_namespaces;
use crate::lease;

/// One watch of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    /// The watch, readable.
    pub watch: String,
    /// Its Lease's name.
    pub lease: String,
    /// The replica the assignment gives it to.
    pub assigned: Option<String>,
    /// Who holds its Lease now (named in it, with a member Lease valid by the wall clock), if
    /// anyone.
    pub holder: Option<String>,
    /// Seconds since the holder's member Lease was renewed.
    pub renewed_secs_ago: Option<u64>,
    /// How many times the Lease changed hands.
    pub transitions: i32,
}

/// The report of `config`'s sharding: one line per watch of `watches` (id → description, as
/// [`desired`] gives them for each cluster), then one per member; `notes` (clusters whose watches
/// could not be listed) come first. `client` reaches the bridge's own cluster, where the Leases
/// are.
pub async fn report(
    config: &Config,
    client: &Client,
    watches: &BTreeMap<String, String>,
    notes: &[String],
) -> Result<String> {
    let settings = Settings::new(&config.sharding, &config.cluster, |name| {
        std::env::var(name).ok()
    });
    let names = Names::new(&settings.prefix);
    let api: Api<Lease> = Api::namespaced(client.clone(), &settings.namespace);
    let leases = api
        .list(&ListParams::default().labels(&names.selector()))
        .await
        .map_err(|source| super::fatal(&settings, source))?;
    let by_name: BTreeMap<String, Lease> = leases
        .items
        .into_iter()
        .filter_map(|l| Some((l.metadata.name.clone()?, l)))
        .collect();
    let members = live_members(&by_name, &names);
    let (rows, held) = rows(watches, &by_name, &names, &members);
    let mut out = String::new();
    for note in notes {
        let _ = writeln!(out, "{note}");
    }
    let _ = writeln!(
        out,
        "leases in namespace {} (prefix {}): {} watches, {} live replicas",
        settings.namespace,
        settings.prefix,
        rows.len(),
        members.len()
    );
    let _ = writeln!(
        out,
        "{:<64} {:<40} {:<32} {:<32} {:>8} {:>5}",
        "WATCH", "LEASE", "ASSIGNED", "HOLDER", "RENEWED", "MOVES"
    );
    for r in &rows {
        let _ = writeln!(
            out,
            "{:<64} {:<40} {:<32} {:<32} {:>8} {:>5}",
            r.watch,
            r.lease,
            r.assigned.as_deref().unwrap_or("-"),
            r.holder.as_deref().unwrap_or("(none)"),
            r.renewed_secs_ago
                .map_or_else(|| "-".into(), |s| format!("{s}s")),
            r.transitions
        );
    }
    let _ = writeln!(out, "{:<32} {:>7}", "REPLICA", "WATCHES");
    for m in &members {
        let _ = writeln!(out, "{m:<32} {:>7}", held.get(m).copied().unwrap_or(0));
    }
    Ok(out)
}

/// Every watch of `resources` (resolved in `cluster`, which `client` reaches) now: id and
/// description.
pub async fn desired(
    cluster: &str,
    client: &Client,
    resources: &[ResolvedResource],
) -> Result<BTreeMap<String, String>> {
    let mut selected: HashMap<String, BTreeSet<String>> = HashMap::new();
    for selector in resources
        .iter()
        .filter_map(|r| r.config.namespace_selector.clone())
    {
        if let std::collections::hash_map::Entry::Vacant(entry) = selected.entry(selector) {
            let found = list_namespaces(client, entry.key())
                .await
                .map_err(|error| Error::NamespaceSelector {
                    selector: entry.key().clone(),
                    error,
                })?;
            entry.insert(found);
        }
    }
    let mut watches = BTreeMap::new();
    for r in resources {
        for scope in r.scopes(&selected) {
            let key = WatchKey::for_scope(cluster, r, scope.as_deref());
            watches.insert(key.id, key.description);
        }
    }
    Ok(watches)
}

/// The live members by the wall clock: renewed within their duration.
fn live_members(leases: &BTreeMap<String, Lease>, names: &Names) -> Vec<String> {
    let mut members: Vec<String> = leases
        .values()
        .filter(|l| {
            l.metadata
                .labels
                .as_ref()
                .and_then(|m| m.get(names::ROLE_LABEL))
                .is_some_and(|r| r == names::MEMBER)
        })
        .filter(|l| valid(l))
        .filter_map(|l| super::holder(l).map(str::to_string))
        .filter(|m| leases.contains_key(&names.member(m)))
        .collect();
    members.sort_unstable();
    members
}

/// Whether `l` has a holder renewed within its duration, by the wall clock.
fn valid(l: &Lease) -> bool {
    super::holder(l).is_some() && lease::renew_age(l).is_some_and(|age| age < lease::duration(l))
}

/// One row per watch, and how many watches each holder holds.
fn rows(
    watches: &BTreeMap<String, String>,
    leases: &BTreeMap<String, Lease>,
    names: &Names,
    members: &[String],
) -> (Vec<LeaseRow>, BTreeMap<String, usize>) {
    let ids: Vec<String> = watches.keys().cloned().collect();
    let owners = assign(members, &ids);
    let mut held: BTreeMap<String, usize> = BTreeMap::new();
    let rows = watches
        .iter()
        .map(|(id, description)| {
            let name = names.watch(id);
            let l = leases.get(&name);
            // A watch Lease is held while its holder's member Lease is valid.
            let member = l
                .and_then(|l| super::holder(l))
                .and_then(|h| leases.get(&names.member(h)));
            let holder = member
                .filter(|m| valid(m))
                .and_then(|m| super::holder(m).map(str::to_string));
            if let Some(h) = &holder {
                *held.entry(h.clone()).or_default() += 1;
            }
            LeaseRow {
                watch: description.clone(),
                lease: name,
                assigned: owners.get(id).map(|m| m.to_string()),
                holder,
                renewed_secs_ago: member
                    .and_then(lease::renew_age)
                    .map(|d: Duration| d.as_secs()),
                transitions: l
                    .and_then(|l| l.spec.as_ref()?.lease_transitions)
                    .unwrap_or(0),
            }
        })
        .collect();
    (rows, held)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_name_the_assignee_and_the_valid_holder() {
        let names = Names::new("p");
        let d = Duration::from_secs(10);
        let mut leases = BTreeMap::new();
        for m in ["a", "b"] {
            leases.insert(names.member(m), names.lease(&names.member(m), m, d, None));
        }
        let held = names.lease(&names.watch("w1"), "b", d, Some(("w1", "dev/v1/x/ns1")));
        leases.insert(names.watch("w1"), held);
        // Named in a watch Lease, but without a member Lease: held by nobody.
        let orphan = names.lease(&names.watch("w2"), "z", d, Some(("w2", "dev/v1/x/ns2")));
        leases.insert(names.watch("w2"), orphan);
        let watches: BTreeMap<String, String> = [("w1", "dev/v1/x/ns1"), ("w2", "dev/v1/x/ns2")]
            .into_iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let members = live_members(&leases, &names);
        assert_eq!(members, ["a", "b"]);
        let (rows, held) = rows(&watches, &leases, &names, &members);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].holder.as_deref(), Some("b"));
        assert_eq!(rows[1].holder, None);
        assert!(rows.iter().all(|r| r.assigned.is_some()));
        assert_ne!(rows[0].assigned, rows[1].assigned, "one watch each");
        assert_eq!(held.get("b"), Some(&1));
    }
}
