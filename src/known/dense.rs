//! A map from packed uids to values, dense: the entries in one vector, found through a hash
//! table of their 4-byte positions in it.
//!
//! A hash table of the entries themselves keeps between an eighth and over half of its slots
//! empty, each as large as an entry, and the allocator rounds the table up to its size class on
//! top of that. Here the empty slots are 4 bytes each, and the vector grows one allocator size
//! class at a time (a quarter or less), using the whole of each, and is fitted to its entries
//! when a list ends, so the entries take little more than their own size (docs/benchmarks.md,
//! "Where the bytes per watched object go").

use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

/// A packed uid: the 16 bytes of a UUID.
pub(super) type Uuid = [u8; 16];

/// Entries keyed by packed uid; see the module's documentation.
#[derive(Debug, Clone)]
pub(super) struct Dense<V> {
    entries: Vec<(Uuid, V)>,
    /// Positions in `entries`, by the hash of their key.
    positions: HashTable<u32>,
}

impl<V> Default for Dense<V> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            positions: HashTable::new(),
        }
    }
}

/// The hash of a key. Keyed per process, like `std`'s maps: uids are made by the API server, but
/// nothing here relies on that.
fn hash(key: &Uuid) -> u64 {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    KEYS.get_or_init(RandomState::new).hash_one(key)
}

/// The size class jemalloc serves an allocation of `bytes` from: multiples of 16 up to 128
/// bytes, then four classes for every doubling (2,560, 3,072, 3,584 and 4,096 above 2,048).
/// Other allocators round differently; a capacity chosen by it is then merely a little off.
fn size_class(bytes: usize) -> usize {
    if bytes <= 128 {
        return bytes.next_multiple_of(16);
    }
    let lg = usize::BITS - 1 - (bytes - 1).leading_zeros();
    bytes.next_multiple_of(1 << (lg - 2))
}

/// The capacity that holds at least `n` entries of `size` bytes and fills its size class.
fn fitted(n: usize, size: usize) -> usize {
    if n == 0 || size == 0 {
        return n;
    }
    size_class(n * size) / size
}

impl<V> Dense<V> {
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn position(&self, key: &Uuid) -> Option<usize> {
        let entries = &self.entries;
        self.positions
            .find(hash(key), |&p| entries[p as usize].0 == *key)
            .map(|&p| p as usize)
    }

    pub(super) fn get(&self, key: &Uuid) -> Option<&V> {
        self.position(key).map(|p| &self.entries[p].1)
    }

    pub(super) fn get_mut(&mut self, key: &Uuid) -> Option<&mut V> {
        self.position(key).map(|p| &mut self.entries[p].1)
    }

    /// Inserts `value` unless `key` is there; says whether it was inserted.
    pub(super) fn insert_new(&mut self, key: Uuid, value: V) -> bool {
        let at = u32::try_from(self.entries.len()).expect("fewer than 2^32 objects in a bucket");
        let entries = &self.entries;
        // One probe both finds the key and places its position (a table that grows rehashes
        // only the positions already in it, whose entries exist).
        match self.positions.entry(
            hash(&key),
            |&p| entries[p as usize].0 == key,
            |&p| hash(&entries[p as usize].0),
        ) {
            Entry::Occupied(_) => return false,
            Entry::Vacant(vacant) => {
                vacant.insert(at);
            }
        }
        if self.entries.len() == self.entries.capacity() {
            let capacity = fitted(self.entries.len() + 1, size_of::<(Uuid, V)>());
            self.entries.reserve_exact(capacity - self.entries.len());
        }
        self.entries.push((key, value));
        true
    }

    /// Removes `key`'s entry: the last entry takes its place in the vector.
    pub(super) fn remove(&mut self, key: &Uuid) -> Option<V> {
        let entries = &self.entries;
        let (at, _) = self
            .positions
            .find_entry(hash(key), |&p| entries[p as usize].0 == *key)
            .ok()?
            .remove();
        let at = at as usize;
        let last = self.entries.len() - 1;
        let (_, value) = self.entries.swap_remove(at);
        if at != last {
            let moved = hash(&self.entries[at].0);
            let slot = self
                .positions
                .find_mut(moved, |&p| p as usize == last)
                .expect("every entry has its position");
            *slot = at as u32;
        }
        if self.entries.len() < self.entries.capacity() / 2 {
            let len = self.entries.len();
            self.entries
                .shrink_to(fitted(len + len / 4, size_of::<(Uuid, V)>()));
        }
        Some(value)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&Uuid, &V)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, v)| v)
    }

    /// Gives back the room the vector grew by beyond the size class of its entries (a list
    /// ends: the bucket is as large as it will be for a while).
    pub(super) fn fit(&mut self) {
        let capacity = fitted(self.entries.len(), size_of::<(Uuid, V)>());
        if self.entries.capacity() > capacity {
            self.entries.shrink_to(capacity);
        }
    }
}

impl<V> IntoIterator for Dense<V> {
    type Item = (Uuid, V);
    type IntoIter = std::vec::IntoIter<(Uuid, V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn key(n: u32) -> Uuid {
        let mut k = [0; 16];
        k[..4].copy_from_slice(&n.to_le_bytes());
        k[15] = 7;
        k
    }

    /// The same operations on a `Dense` and on a `HashMap` leave the same entries, whatever
    /// order inserts and removals come in (removals move the last entry into the gap).
    #[test]
    fn behaves_as_a_map_through_inserts_and_removals() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(34);
        let (mut dense, mut map) = (Dense::default(), HashMap::new());
        for step in 0..20_000u32 {
            let k = key(rng.random_range(0..500));
            match rng.random_range(0..4) {
                0 => assert_eq!(dense.remove(&k), map.remove(&k), "step {step}"),
                1 => {
                    if let Some(v) = dense.get_mut(&k) {
                        *v += 1;
                    }
                    if let Some(v) = map.get_mut(&k) {
                        *v += 1;
                    }
                }
                _ => {
                    let inserted = dense.insert_new(k, step);
                    assert_eq!(inserted, !map.contains_key(&k), "step {step}");
                    map.entry(k).or_insert(step);
                }
            }
            assert_eq!(dense.len(), map.len());
            assert_eq!(dense.get(&k), map.get(&k), "step {step}");
        }
        let mut all: Vec<_> = dense.iter().map(|(k, v)| (*k, *v)).collect();
        all.sort();
        let mut expected: Vec<_> = map.into_iter().collect();
        expected.sort();
        assert_eq!(all, expected);
        dense.fit();
        for (k, v) in &expected {
            assert_eq!(dense.get(k), Some(v));
        }
    }

    #[test]
    fn size_classes_are_jemallocs() {
        let classes: Vec<usize> = [1, 16, 17, 128, 129, 160, 161, 2048, 2049, 2808, 4096, 4097]
            .into_iter()
            .map(size_class)
            .collect();
        assert_eq!(
            classes,
            [16, 16, 32, 128, 160, 160, 192, 2048, 2560, 3072, 4096, 5120]
        );
    }

    #[test]
    fn the_entries_take_little_more_than_their_own_size() {
        // 72 bytes, as the index's entries.
        let mut dense = Dense::default();
        for n in 0..39 {
            assert!(dense.insert_new(key(n), [0u8; 56]));
        }
        // 39 entries: 2,808 bytes, in the 3,072-byte class, which holds 42.
        assert_eq!(dense.entries.capacity(), 42);
        dense.fit();
        assert_eq!(dense.entries.capacity(), 42);
        // Emptied, it gives the space back.
        for n in 0..39 {
            assert!(dense.remove(&key(n)).is_some());
        }
        assert!(dense.is_empty());
        assert!(
            dense.entries.capacity() <= 2,
            "{}",
            dense.entries.capacity()
        );
    }
}
