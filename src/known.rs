//! The known-object index: for every watched object only what a relist diff needs
//! (uid, resourceVersion, namespace, name), never the object itself.
//!
//! After a watch loses its history (410 Gone) the bridge lists again and diffs the listing against
//! this index, as kubert's `index.rs` does: keys known before but absent from the listing are
//! deletions. Namespaces are interned, so an entry costs about 150 bytes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// What the index remembers of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The last resourceVersion seen.
    pub resource_version: Box<str>,
    /// Namespace, `None` for cluster-scoped objects.
    pub namespace: Option<Arc<str>>,
    /// Name.
    pub name: Box<str>,
}

/// How an observed object relates to what the index knew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// A uid the index did not know.
    New,
    /// A known uid with another resourceVersion.
    Changed,
    /// A known uid at the same resourceVersion: nothing to publish.
    Unchanged,
}

/// uid -> [`Entry`] for one watch.
#[derive(Debug, Default)]
pub struct KnownObjects {
    entries: HashMap<Box<str>, Entry>,
    namespaces: HashSet<Arc<str>>,
}

impl KnownObjects {
    /// Number of known objects.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry for `uid`.
    pub fn get(&self, uid: &str) -> Option<&Entry> {
        self.entries.get(uid)
    }

    /// Records an object seen at `resource_version` and says how it relates to what was known.
    pub fn observe(
        &mut self,
        uid: &str,
        resource_version: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Seen {
        if let Some(entry) = self.entries.get_mut(uid) {
            if &*entry.resource_version == resource_version {
                return Seen::Unchanged;
            }
            entry.resource_version = resource_version.into();
            return Seen::Changed;
        }
        let namespace = namespace.map(|ns| self.intern(ns));
        self.entries.insert(
            uid.into(),
            Entry {
                resource_version: resource_version.into(),
                namespace,
                name: name.into(),
            },
        );
        Seen::New
    }

    /// Forgets a deleted object; returns what was known of it.
    pub fn remove(&mut self, uid: &str) -> Option<Entry> {
        self.entries.remove(uid)
    }

    /// Starts a relist: the listing is fed to [`Relist::observe`], then [`Relist::finish`] returns
    /// the objects that vanished.
    pub fn relist(&mut self) -> Relist<'_> {
        let previous = std::mem::take(&mut self.entries);
        Relist {
            index: self,
            previous: Some(previous),
        }
    }

    fn intern(&mut self, ns: &str) -> Arc<str> {
        if let Some(found) = self.namespaces.get(ns) {
            return found.clone();
        }
        let arc: Arc<str> = ns.into();
        self.namespaces.insert(arc.clone());
        arc
    }
}

/// A relist in progress; see [`KnownObjects::relist`].
#[derive(Debug)]
pub struct Relist<'a> {
    index: &'a mut KnownObjects,
    /// Entries known before the relist and not listed yet; `None` once finished.
    previous: Option<HashMap<Box<str>, Entry>>,
}

impl Relist<'_> {
    /// Records one listed object and says how it relates to what was known before the relist.
    pub fn observe(
        &mut self,
        uid: &str,
        resource_version: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Seen {
        match self.previous.as_mut().and_then(|p| p.remove_entry(uid)) {
            Some((key, mut entry)) => {
                let seen = if &*entry.resource_version == resource_version {
                    Seen::Unchanged
                } else {
                    entry.resource_version = resource_version.into();
                    Seen::Changed
                };
                self.index.entries.insert(key, entry);
                seen
            }
            None => self.index.observe(uid, resource_version, namespace, name),
        }
    }

    /// Ends the relist: every object known before but not listed, as (uid, entry), sorted by uid so
    /// synthetic deletes come out in a stable order.
    pub fn finish(mut self) -> Vec<(Box<str>, Entry)> {
        let mut gone: Vec<_> = self
            .previous
            .take()
            .unwrap_or_default()
            .into_iter()
            .collect();
        gone.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        gone
    }
}

impl Drop for Relist<'_> {
    /// An abandoned relist (a failed page) keeps what it did not reach: nothing is deleted
    /// without a complete listing.
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            for (uid, entry) in previous {
                self.index.entries.entry(uid).or_insert(entry);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observe_classifies_and_interns() {
        let mut k = KnownObjects::default();
        assert_eq!(k.observe("u1", "1", Some("ns"), "a"), Seen::New);
        assert_eq!(k.observe("u1", "1", Some("ns"), "a"), Seen::Unchanged);
        assert_eq!(k.observe("u1", "2", Some("ns"), "a"), Seen::Changed);
        assert_eq!(k.observe("u2", "3", Some("ns"), "b"), Seen::New);
        let (a, b) = (k.get("u1").unwrap(), k.get("u2").unwrap());
        assert!(Arc::ptr_eq(
            a.namespace.as_ref().unwrap(),
            b.namespace.as_ref().unwrap()
        ));
        assert_eq!(k.remove("u1").unwrap().resource_version.as_ref(), "2");
        assert_eq!(k.len(), 1);
    }

    #[test]
    fn relist_diff_finds_new_changed_unchanged_and_gone() {
        let mut k = KnownObjects::default();
        k.observe("same", "1", Some("ns"), "same");
        k.observe("changed", "2", Some("ns"), "changed");
        k.observe("gone", "3", Some("ns"), "gone");
        k.observe("recreated-old", "4", Some("ns"), "x");

        let mut r = k.relist();
        assert_eq!(r.observe("same", "1", Some("ns"), "same"), Seen::Unchanged);
        assert_eq!(
            r.observe("changed", "9", Some("ns"), "changed"),
            Seen::Changed
        );
        assert_eq!(r.observe("recreated-new", "10", Some("ns"), "x"), Seen::New);
        let gone = r.finish();
        let gone: Vec<_> = gone
            .iter()
            .map(|(uid, e)| (&**uid, &*e.resource_version))
            .collect();
        assert_eq!(gone, vec![("gone", "3"), ("recreated-old", "4")]);

        assert_eq!(k.len(), 3);
        assert_eq!(&*k.get("changed").unwrap().resource_version, "9");
        assert!(k.get("gone").is_none());
    }

    #[test]
    fn abandoned_relist_deletes_nothing() {
        let mut k = KnownObjects::default();
        k.observe("a", "1", None, "a");
        k.observe("b", "2", None, "b");
        {
            let mut r = k.relist();
            assert_eq!(r.observe("a", "5", None, "a"), Seen::Changed);
        }
        assert_eq!(k.len(), 2);
        assert_eq!(&*k.get("a").unwrap().resource_version, "5");
        assert_eq!(&*k.get("b").unwrap().resource_version, "2");
    }
}
