//! The known-object index: for every watched object only what a relist diff needs
//! (uid, resourceVersion, namespace, name), never the object itself.
//!
//! After a watch loses its history (410 Gone) the bridge lists again and diffs the listing against
//! this index, as kubert's `index.rs` does: keys known before but absent from the listing are
//! deletions. The index is split into [`BUCKETS`] buckets by uid so that a checkpoint rewrites
//! only the buckets that changed; namespaces are interned.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// Number of buckets; a checkpoint stores each bucket as one record, so 100,000 objects make
/// records of about 30 KB.
pub const BUCKETS: usize = 256;

/// What the index remembers of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The last resourceVersion seen.
    pub resource_version: Box<str>,
    /// Namespace, `None` for cluster-scoped objects.
    pub namespace: Option<Arc<str>>,
    /// Name.
    pub name: Box<str>,
    /// Content digest of the last version published or compared ([`crate::payload::digest`]);
    /// 0 when unknown.
    pub digest: u64,
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
    /// A known uid with another resourceVersion but the same content digest: only noise
    /// changed (resourceVersion, managedFields, ignored paths), nothing to publish.
    Touched,
}

/// Errors of decoding a stored bucket.
#[derive(Debug, thiserror::Error)]
#[error("bucket line {line}: expected `uid resourceVersion namespace|- name [digest]`")]
pub struct DecodeError {
    /// 1-based line number.
    pub line: usize,
}

type Bucket = HashMap<Box<str>, Entry>;

/// uid -> [`Entry`] for one watch.
#[derive(Debug)]
pub struct KnownObjects {
    buckets: Vec<Bucket>,
    namespaces: HashSet<Arc<str>>,
    dirty: BTreeSet<usize>,
    /// Entries known before a relist and not listed yet.
    relisting: Option<Vec<Bucket>>,
}

impl Default for KnownObjects {
    fn default() -> Self {
        Self {
            buckets: vec![Bucket::new(); BUCKETS],
            namespaces: HashSet::new(),
            dirty: BTreeSet::new(),
            relisting: None,
        }
    }
}

/// The bucket of a uid: FNV-1a, stable across versions and platforms (it is persisted).
pub fn bucket_of(uid: &str) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in uid.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % BUCKETS as u64) as usize
}

impl KnownObjects {
    /// Number of known objects.
    pub fn len(&self) -> usize {
        self.buckets.iter().map(HashMap::len).sum()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.buckets.iter().all(HashMap::is_empty)
    }

    /// The entry for `uid`.
    pub fn get(&self, uid: &str) -> Option<&Entry> {
        self.buckets[bucket_of(uid)].get(uid)
    }

    /// Records an object seen at `resource_version` with content `digest` (0: not computed) and
    /// says how it relates to what was known (during a relist: to what was known before the
    /// relist). A touched entry takes the new resourceVersion without dirtying its bucket: the
    /// stored digest still describes it, so noise never costs a checkpoint write.
    pub fn observe(
        &mut self,
        uid: &str,
        resource_version: &str,
        namespace: Option<&str>,
        name: &str,
        digest: u64,
    ) -> Seen {
        let b = bucket_of(uid);
        if let Some(previous) = self.relisting.as_mut()
            && let Some((key, entry)) = previous[b].remove_entry(uid)
        {
            self.buckets[b].insert(key, entry);
        }
        if let Some(entry) = self.buckets[b].get_mut(uid) {
            if &*entry.resource_version == resource_version {
                return Seen::Unchanged;
            }
            entry.resource_version = resource_version.into();
            if digest != 0 && entry.digest == digest {
                return Seen::Touched;
            }
            entry.digest = digest;
            self.dirty.insert(b);
            return Seen::Changed;
        }
        let namespace = namespace.map(|ns| self.intern(ns));
        self.buckets[b].insert(
            uid.into(),
            Entry {
                resource_version: resource_version.into(),
                namespace,
                name: name.into(),
                digest,
            },
        );
        self.dirty.insert(b);
        Seen::New
    }

    /// Forgets a deleted object; returns what was known of it.
    pub fn remove(&mut self, uid: &str) -> Option<Entry> {
        let b = bucket_of(uid);
        let removed = self.buckets[b].remove(uid);
        if removed.is_some() {
            self.dirty.insert(b);
        }
        removed
    }

    /// Starts a relist: objects then fed to [`KnownObjects::observe`] are compared with what was
    /// known before; [`KnownObjects::finish_relist`] returns the objects that vanished.
    pub fn begin_relist(&mut self) {
        self.abort_relist();
        let previous = std::mem::replace(&mut self.buckets, vec![Bucket::new(); BUCKETS]);
        self.relisting = Some(previous);
    }

    /// Ends a relist: every object known before but not listed, as (uid, entry), sorted by uid so
    /// synthetic deletes come out in a stable order. They are removed from the index.
    pub fn finish_relist(&mut self) -> Vec<(Box<str>, Entry)> {
        let Some(previous) = self.relisting.take() else {
            return Vec::new();
        };
        let mut gone: Vec<(Box<str>, Entry)> = Vec::new();
        for (b, bucket) in previous.into_iter().enumerate() {
            if !bucket.is_empty() {
                self.dirty.insert(b);
                gone.extend(bucket);
            }
        }
        gone.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        gone
    }

    /// Abandons a relist (a failed page): entries not reached are kept, so nothing is deleted
    /// without a complete listing.
    pub fn abort_relist(&mut self) {
        if let Some(previous) = self.relisting.take() {
            for (b, bucket) in previous.into_iter().enumerate() {
                for (uid, entry) in bucket {
                    self.buckets[b].entry(uid).or_insert(entry);
                }
            }
        }
    }

    /// Buckets changed since the last [`KnownObjects::take_dirty`].
    pub fn take_dirty(&mut self) -> BTreeSet<usize> {
        std::mem::take(&mut self.dirty)
    }

    /// Marks every bucket changed (a first checkpoint writes them all).
    pub fn mark_all_dirty(&mut self) {
        self.dirty = (0..BUCKETS).collect();
    }

    /// One bucket as text: a line `uid resourceVersion namespace|- name [digest]` per object
    /// (the digest in hex when known), sorted. Names, namespaces, uids and resourceVersions never
    /// contain spaces or newlines.
    pub fn encode_bucket(&self, b: usize) -> String {
        let mut lines: Vec<String> = self.buckets[b]
            .iter()
            .map(|(uid, e)| {
                let mut line = format!(
                    "{uid} {} {} {}",
                    e.resource_version,
                    e.namespace.as_deref().unwrap_or("-"),
                    e.name
                );
                if e.digest != 0 {
                    line.push_str(&format!(" {:x}", e.digest));
                }
                line
            })
            .collect();
        lines.sort_unstable();
        let mut out = lines.join("\n");
        if !out.is_empty() {
            out.push('\n');
        }
        out
    }

    /// Loads one bucket's text (replacing what the index held for that bucket).
    pub fn decode_bucket(&mut self, b: usize, text: &str) -> Result<(), DecodeError> {
        let mut bucket = Bucket::new();
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.is_empty()) {
            let mut parts = line.split(' ');
            let (Some(uid), Some(rv), Some(ns), Some(name), digest, None) = (
                parts.next(),
                parts.next(),
                parts.next(),
                parts.next(),
                parts.next(),
                parts.next(),
            ) else {
                return Err(DecodeError { line: i + 1 });
            };
            let digest = match digest {
                None => 0,
                Some(hex) => {
                    u64::from_str_radix(hex, 16).map_err(|_| DecodeError { line: i + 1 })?
                }
            };
            let namespace = (ns != "-").then(|| self.intern(ns));
            bucket.insert(
                uid.into(),
                Entry {
                    resource_version: rv.into(),
                    namespace,
                    name: name.into(),
                    digest,
                },
            );
        }
        self.buckets[b] = bucket;
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observe_classifies_and_interns() {
        let mut k = KnownObjects::default();
        assert_eq!(k.observe("u1", "1", Some("ns"), "a", 0), Seen::New);
        assert_eq!(k.observe("u1", "1", Some("ns"), "a", 0), Seen::Unchanged);
        assert_eq!(k.observe("u1", "2", Some("ns"), "a", 0), Seen::Changed);
        assert_eq!(k.observe("u2", "3", Some("ns"), "b", 0), Seen::New);
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
        k.observe("same", "1", Some("ns"), "same", 0);
        k.observe("changed", "2", Some("ns"), "changed", 0);
        k.observe("gone", "3", Some("ns"), "gone", 0);
        k.observe("recreated-old", "4", Some("ns"), "x", 0);

        k.begin_relist();
        assert_eq!(
            k.observe("same", "1", Some("ns"), "same", 0),
            Seen::Unchanged
        );
        assert_eq!(
            k.observe("changed", "9", Some("ns"), "changed", 0),
            Seen::Changed
        );
        assert_eq!(
            k.observe("recreated-new", "10", Some("ns"), "x", 0),
            Seen::New
        );
        let gone = k.finish_relist();
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
    fn same_digest_is_touched_and_costs_no_checkpoint_write() {
        let mut k = KnownObjects::default();
        assert_eq!(k.observe("u", "1", None, "a", 7), Seen::New);
        k.take_dirty();
        assert_eq!(k.observe("u", "2", None, "a", 7), Seen::Touched);
        assert!(k.take_dirty().is_empty());
        assert_eq!(&*k.get("u").unwrap().resource_version, "2");
        assert_eq!(k.observe("u", "3", None, "a", 8), Seen::Changed);
        assert_eq!(
            k.observe("u", "4", None, "a", 0),
            Seen::Changed,
            "0 is unknown"
        );
        let text = k.encode_bucket(bucket_of("u"));
        let mut back = KnownObjects::default();
        back.decode_bucket(bucket_of("u"), &text).unwrap();
        assert_eq!(back.get("u"), k.get("u"));
        back.decode_bucket(bucket_of("u"), "u 1 - a 1f\n").unwrap();
        assert_eq!(back.get("u").unwrap().digest, 0x1f);
        back.decode_bucket(bucket_of("v"), "v 2 ns b\n").unwrap();
        assert_eq!(
            back.get("v").unwrap().digest,
            0,
            "checkpoints written before digests load"
        );
        assert!(back.decode_bucket(0, "u 1 - a zz\n").is_err());
    }

    #[test]
    fn abandoned_relist_deletes_nothing() {
        let mut k = KnownObjects::default();
        k.observe("a", "1", None, "a", 0);
        k.observe("b", "2", None, "b", 0);
        k.begin_relist();
        assert_eq!(k.observe("a", "5", None, "a", 0), Seen::Changed);
        k.abort_relist();
        assert_eq!(k.len(), 2);
        assert_eq!(&*k.get("a").unwrap().resource_version, "5");
        assert_eq!(&*k.get("b").unwrap().resource_version, "2");
    }

    #[test]
    fn buckets_round_trip_and_track_changes() {
        let mut k = KnownObjects::default();
        for i in 0..1000 {
            k.observe(
                &format!("uid-{i}"),
                &i.to_string(),
                (i % 2 == 0).then_some("ns"),
                &format!("n{i}"),
                0,
            );
        }
        assert!(
            k.take_dirty().len() > 200,
            "1000 uids spread over the buckets"
        );
        k.observe("uid-7", "99", None, "n7", 0);
        assert_eq!(k.take_dirty(), BTreeSet::from([bucket_of("uid-7")]));

        let mut copy = KnownObjects::default();
        for b in 0..BUCKETS {
            copy.decode_bucket(b, &k.encode_bucket(b)).unwrap();
        }
        assert_eq!(copy.len(), 1000);
        assert_eq!(copy.get("uid-7"), k.get("uid-7"));
        assert_eq!(copy.get("uid-8").unwrap().namespace.as_deref(), Some("ns"));
        assert!(copy.get("uid-9").unwrap().namespace.is_none());
        assert!(copy.decode_bucket(0, "only three fields").is_err());
    }

    #[test]
    fn a_hundred_thousand_objects_fit_in_broker_sized_records() {
        let mut k = KnownObjects::default();
        for i in 0..100_000u32 {
            let uid = format!("{:08x}-2fa1-11d2-883f-{:012x}", i, u64::from(i) * 7919);
            k.observe(
                &uid,
                &format!("{}", 1_000_000 + i),
                Some("team-platform-production"),
                &format!("deployment-config-{i:06}"),
                0,
            );
        }
        let largest = (0..BUCKETS)
            .map(|b| k.encode_bucket(b).len())
            .max()
            .unwrap();
        let total: usize = (0..BUCKETS).map(|b| k.encode_bucket(b).len()).sum();
        // Kafka's default message.max.bytes and NATS's default max_payload are about 1 MB.
        assert!(largest < 64 * 1024, "largest bucket record {largest} bytes");
        assert!(total < 12 * 1024 * 1024, "whole index {total} bytes");
    }
}
