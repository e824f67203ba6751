//! What the bridge knows of CustomResourceDefinitions. With a wildcard entry it follows them
//! (metadata only): every change asks for a discovery refresh, and the CRDs deleted (or being
//! deleted) are remembered.
//!
//! A watch stops when discovery no longer serves its resource. Two causes look the same there:
//! - the CRD was deleted: all its objects are gone;
//! - a version is no longer served, or an aggregated API is unavailable: the objects still exist.
//!
//! Only the first must publish the deletion of the objects the watch still knows. The API server
//! usually sends those deletes itself, but it closes the watches when it removes a deleted CRD's
//! storage, and the last deletes can be lost then. [`Lifecycle`] gives the positive evidence
//! that tells the two apart.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ObjectMeta, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::warn;

/// The name of the CRD that would serve `plural` in `group`; `None` for the core group, which
/// no CRD serves.
pub fn name(group: &str, plural: &str) -> Option<String> {
    (!group.is_empty()).then(|| format!("{plural}.{group}"))
}

/// The CRDs seen, and those seen deleted or terminating since the bridge started following them.
#[derive(Debug, Default)]
pub struct Lifecycle {
    /// Every CRD seen existing, terminating or not.
    present: BTreeSet<String>,
    /// The names of the (re)list in progress.
    listing: Option<BTreeSet<String>>,
    /// Deleted or terminating, and not created again since.
    deleted: BTreeSet<String>,
}

/// The followed CRDs, shared with the supervisor.
pub type Shared = Arc<Mutex<Lifecycle>>;

impl Lifecycle {
    /// Whether the CRD `name` was seen deleted or terminating, and not created again since.
    pub fn was_deleted(&self, name: &str) -> bool {
        self.deleted.contains(name)
    }

    /// A CRD seen by the watch (created or changed).
    pub fn applied(&mut self, name: &str, terminating: bool) {
        self.present.insert(name.to_string());
        self.mark(name, terminating);
    }

    /// A CRD seen deleted by the watch.
    pub fn removed(&mut self, name: &str) {
        self.present.remove(name);
        self.deleted.insert(name.to_string());
    }

    /// A (re)list starts.
    pub fn list_begin(&mut self) {
        self.listing = Some(BTreeSet::new());
    }

    /// A CRD listed.
    pub fn listed(&mut self, name: &str, terminating: bool) {
        self.listing
            .get_or_insert_with(BTreeSet::new)
            .insert(name.to_string());
        self.mark(name, terminating);
    }

    /// A (re)list completed: a CRD seen before and not listed was deleted meanwhile.
    pub fn list_end(&mut self) {
        let listed = self.listing.take().unwrap_or_default();
        self.deleted
            .extend(self.present.difference(&listed).cloned());
        self.present = listed;
    }

    fn mark(&mut self, name: &str, terminating: bool) {
        if terminating {
            self.deleted.insert(name.to_string());
        } else {
            self.deleted.remove(name);
        }
    }
}

/// Follows the CRDs into `crds`, asking for a discovery refresh (`refresh`) on every change
/// after the first listing, and again two seconds later (a new CRD is served a moment after it
/// is created).
pub async fn follow(client: Client, refresh: Arc<Notify>, crds: Shared) {
    let api: Api<PartialObjectMeta<CustomResourceDefinition>> = Api::all(client);
    let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
    let mut listed = false;
    // The second refresh after a change, when one is due.
    let mut again: Option<Instant> = None;
    loop {
        let second_refresh = tokio::time::sleep_until(again.unwrap_or_else(Instant::now));
        let event = tokio::select! {
            event = stream.next() => match event {
                Some(event) => event,
                None => return,
            },
            () = second_refresh, if again.is_some() => {
                again = None;
                refresh.notify_one();
                continue;
            }
        };
        let lifecycle = || crds.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            Ok(Event::Init) => lifecycle().list_begin(),
            Ok(Event::InitApply(crd)) => {
                let (name, terminating) = identity(&crd.metadata);
                lifecycle().listed(name, terminating);
            }
            Ok(Event::InitDone) => {
                lifecycle().list_end();
                if listed {
                    refresh.notify_one();
                }
                listed = true;
            }
            Ok(Event::Apply(crd)) => {
                let (name, terminating) = identity(&crd.metadata);
                lifecycle().applied(name, terminating);
                again = Some(changed(&refresh));
            }
            Ok(Event::Delete(crd)) => {
                lifecycle().removed(identity(&crd.metadata).0);
                again = Some(changed(&refresh));
            }
            Err(e) => {
                warn!(error = %e, "CustomResourceDefinition watch failed (CRDs are still found by the periodic discovery refresh)");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    }
}

/// A CRD's name, and whether it is being deleted.
fn identity(meta: &ObjectMeta) -> (&str, bool) {
    (
        meta.name.as_deref().unwrap_or_default(),
        meta.deletion_timestamp.is_some(),
    )
}

/// Asks for a discovery refresh now; returns when to ask again (a new CRD is served a moment
/// after it is created).
fn changed(refresh: &Notify) -> Instant {
    refresh.notify_one();
    Instant::now() + Duration::from_secs(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A complete (re)list of `names`, none terminating.
    fn list(crds: &mut Lifecycle, names: &[&str]) {
        crds.list_begin();
        for name in names {
            crds.listed(name, false);
        }
        crds.list_end();
    }

    #[test]
    fn names_a_crd_only_outside_the_core_group() {
        assert_eq!(
            name("a.keb.dev", "things").as_deref(),
            Some("things.a.keb.dev")
        );
        assert_eq!(name("", "configmaps"), None);
    }

    #[test]
    fn a_crd_deleted_or_terminating_is_remembered_until_created_again() {
        let mut crds = Lifecycle::default();
        list(&mut crds, &["things.a.dev", "gadgets.a.dev"]);
        assert!(!crds.was_deleted("things.a.dev"));

        crds.applied("things.a.dev", true);
        assert!(crds.was_deleted("things.a.dev"), "terminating");
        crds.removed("things.a.dev");
        assert!(crds.was_deleted("things.a.dev"), "deleted");
        assert!(!crds.was_deleted("gadgets.a.dev"));

        crds.applied("things.a.dev", false);
        assert!(!crds.was_deleted("things.a.dev"), "created again");
    }

    #[test]
    fn a_crd_missing_from_a_relist_was_deleted_meanwhile() {
        let mut crds = Lifecycle::default();
        list(&mut crds, &["things.a.dev", "gadgets.a.dev"]);
        list(&mut crds, &["gadgets.a.dev"]);
        assert!(crds.was_deleted("things.a.dev"));
        assert!(!crds.was_deleted("gadgets.a.dev"));
        // Never seen: an aggregated API's resource, or a CRD not followed. No evidence.
        assert!(!crds.was_deleted("metrics.example.dev"));
    }

    #[test]
    fn nothing_is_deleted_before_the_first_listing_completes() {
        let mut crds = Lifecycle::default();
        list(&mut crds, &[]);
        assert!(!crds.was_deleted("things.a.dev"));
    }
}
