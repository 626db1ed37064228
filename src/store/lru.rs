//! A map with a bound on its size that forgets the least recently used entries first, and
//! of those, the ones its owner marks as cheap to forget (closed breakers) before the others.
//!
//! Built for recipient domains that come and go by the thousand: a lookup hashes its key
//! once; a new key takes the place of the forgotten one, in place in its entry, so a full map
//! allocates nothing for a key of up to 46 bytes; and an entry used again while it is in the
//! newer half of its list stays where it is, so a hit writes no links.

use std::hash::BuildHasher;

use hashbrown::HashTable;

use crate::inline::InlineStr;

const NIL: usize = usize::MAX;

/// An entry, laid out for the churn of new keys: its first cache line holds the key (in
/// place, when it is as short as nearly every domain) with its hash, which a lookup reads;
/// the rest holds its links and value, which a change writes. A new key written over a
/// forgotten one then touches the entry alone, not a buffer elsewhere on the heap.
#[derive(Debug)]
#[repr(C, align(64))]
struct Entry<V> {
    key: Key,
    /// The key's hash, kept so that forgetting the entry, or growing the index, needs no
    /// second hash.
    hash: u64,
    newer: usize,
    older: usize,
    /// Its list's clock when it was linked as the newest.
    linked_at: u64,
    cheap: bool,
    value: V,
}

/// A key of up to 46 bytes in place (with its tag and length, 48 bytes), a longer one shared.
type Key = InlineStr<46>;

/// Two recency lists threaded through one slab: index 0 for entries cheap to forget, 1 for the rest.
#[derive(Debug)]
pub(crate) struct BoundedMap<V> {
    /// Where each entry is, by its key's hash: the table holds entry numbers, and the keys
    /// live once, in the slab. Keys of one hash each have their own place in it.
    index: HashTable<usize>,
    /// Keyed per map, so that no sender can choose domains that collide.
    hasher: foldhash::fast::RandomState,
    slab: Vec<Entry<V>>,
    newest: [usize; 2],
    oldest: [usize; 2],
    /// How many entries each list holds, and how many times each linked a newest entry.
    lengths: [usize; 2],
    clocks: [u64; 2],
    capacity: usize,
}

impl<V> BoundedMap<V> {
    pub(crate) fn new(capacity: usize) -> Self {
        BoundedMap {
            index: HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
            slab: Vec::new(),
            newest: [NIL; 2],
            oldest: [NIL; 2],
            lengths: [0; 2],
            clocks: [0; 2],
            capacity: capacity.max(1),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.slab.len()
    }

    /// Runs `f` on the entry for `key`, made with `make` if missing, and marks it recently
    /// used. `is_cheap` says, after `f`, whether the entry may be forgotten first.
    pub(crate) fn with<R>(
        &mut self,
        key: &str,
        make: impl FnOnce() -> V,
        is_cheap: impl Fn(&V) -> bool,
        f: impl FnOnce(&mut V) -> R,
    ) -> R {
        let at = match self.find(key) {
            Ok(at) => at,
            Err(hash) => self.insert(key, hash, make),
        };
        self.use_entry(at, is_cheap, f)
    }

    /// Runs `f` on the entry for `key` and marks it recently used, if there is one; a
    /// missing key is not added.
    pub(crate) fn with_existing<R>(
        &mut self,
        key: &str,
        is_cheap: impl Fn(&V) -> bool,
        f: impl FnOnce(&mut V) -> R,
    ) -> Option<R> {
        let at = self.find(key).ok()?;
        Some(self.use_entry(at, is_cheap, f))
    }

    /// Runs `f` on the entry at `at` and marks it recently used.
    ///
    /// An entry already in the newer half of its list is left in place: it is not the next
    /// to be forgotten, and moving it would write to three entries on every hit.
    #[inline(always)]
    fn use_entry<R>(
        &mut self,
        at: usize,
        is_cheap: impl Fn(&V) -> bool,
        f: impl FnOnce(&mut V) -> R,
    ) -> R {
        let result = f(&mut self.slab[at].value);
        let cheap = is_cheap(&self.slab[at].value);
        let entry = &self.slab[at];
        let list = usize::from(!entry.cheap);
        let links_since = self.clocks[list] - entry.linked_at;
        let in_newer_half = links_since < (self.lengths[list] / 2) as u64;
        if entry.cheap != cheap || (self.newest[list] != at && !in_newer_half) {
            self.unlink(at);
            self.slab[at].cheap = cheap;
            self.link_newest(at);
        }
        result
    }

    /// Runs `f` on the entry for `key` if there is one, without changing its recency.
    pub(crate) fn peek_mut<R>(&mut self, key: &str, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let at = self.find(key).ok()?;
        Some(f(&mut self.slab[at].value))
    }

    /// Runs `f` on every entry, oldest first or not: in no promised order, recency unchanged.
    pub(crate) fn for_each_mut(&mut self, mut f: impl FnMut(&str, &mut V)) {
        for entry in &mut self.slab {
            f(entry.key.as_str(), &mut entry.value);
        }
    }

    /// Where `key` is, or its hash if it is missing. The newest entry of each list is
    /// compared first, which spares hashing the key when one key takes most of the traffic
    /// and when a result is recorded for the key just decided on.
    fn find(&self, key: &str) -> Result<usize, u64> {
        for newest in self.newest {
            if newest != NIL && self.slab[newest].key.is(key) {
                return Ok(newest);
            }
        }
        let hash = self.hasher.hash_one(key);
        self.lookup(key, hash).ok_or(hash)
    }

    /// Where `key`, whose hash is `hash`, is in the index.
    fn lookup(&self, key: &str, hash: u64) -> Option<usize> {
        let slab = &self.slab;
        self.index.find(hash, |&at| slab[at].key.is(key)).copied()
    }

    /// Puts a new entry in a free place, or in the place of the oldest entry when full, and
    /// links it as the newest of the cheap list.
    /// The value is made in its place, not moved there.
    fn insert(&mut self, key: &str, hash: u64, make: impl FnOnce() -> V) -> usize {
        let at = if self.slab.len() < self.capacity {
            self.slab.push(Entry {
                key: Key::new(key),
                hash,
                newer: NIL,
                older: NIL,
                linked_at: 0,
                cheap: true,
                value: make(),
            });
            self.slab.len() - 1
        } else {
            // Made before the map changes, so that nothing is left half done if it panics.
            let value = make();
            let victim = if self.oldest[0] != NIL {
                self.oldest[0]
            } else {
                self.oldest[1]
            };
            self.unlink(victim);
            self.unindex(victim);
            let entry = &mut self.slab[victim];
            // The new key takes the forgotten one's place in the entry itself.
            entry.key.set(key);
            entry.hash = hash;
            entry.value = value;
            entry.cheap = true;
            victim
        };
        // The key is known to be missing: no comparison with the others of its hash.
        let slab = &self.slab;
        self.index.insert_unique(hash, at, |&at| slab[at].hash);
        self.link_newest(at);
        at
    }

    /// Takes the entry at `at` out of the index: found by its number among those of its
    /// hash, without reading their keys.
    fn unindex(&mut self, at: usize) {
        if let Ok(place) = self
            .index
            .find_entry(self.slab[at].hash, |&other| other == at)
        {
            place.remove();
        }
    }

    fn unlink(&mut self, at: usize) {
        let list = usize::from(!self.slab[at].cheap);
        let (newer, older) = (self.slab[at].newer, self.slab[at].older);
        match newer {
            NIL => self.newest[list] = older,
            n => self.slab[n].older = older,
        }
        match older {
            NIL => self.oldest[list] = newer,
            o => self.slab[o].newer = newer,
        }
        self.slab[at].newer = NIL;
        self.slab[at].older = NIL;
        self.lengths[list] -= 1;
    }

    fn link_newest(&mut self, at: usize) {
        let list = usize::from(!self.slab[at].cheap);
        let previous = self.newest[list];
        self.clocks[list] += 1;
        let entry = &mut self.slab[at];
        entry.older = previous;
        entry.newer = NIL;
        entry.linked_at = self.clocks[list];
        match previous {
            NIL => self.oldest[list] = at,
            p => self.slab[p].newer = at,
        }
        self.newest[list] = at;
        self.lengths[list] += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(map: &mut BoundedMap<u32>, key: &str, value: u32) {
        map.with(key, || value, |v| *v == 0, |v| *v = value);
    }

    #[test]
    fn least_recently_used_entry_is_forgotten_when_full() {
        let mut map = BoundedMap::new(2);
        touch(&mut map, "a", 0);
        touch(&mut map, "b", 0);
        touch(&mut map, "a", 0);
        touch(&mut map, "c", 0);
        assert_eq!(map.len(), 2);
        assert!(map.peek_mut("b", |_| ()).is_none());
        assert!(map.peek_mut("a", |_| ()).is_some());
    }

    #[test]
    fn cheap_entries_are_forgotten_before_older_dear_ones() {
        let mut map = BoundedMap::new(2);
        touch(&mut map, "open", 1);
        touch(&mut map, "closed", 0);
        touch(&mut map, "new", 0);
        assert!(map.peek_mut("open", |_| ()).is_some());
        assert!(map.peek_mut("closed", |_| ()).is_none());
    }

    #[test]
    fn dear_entries_are_forgotten_when_nothing_else_is_left() {
        let mut map = BoundedMap::new(2);
        touch(&mut map, "a", 1);
        touch(&mut map, "b", 1);
        touch(&mut map, "c", 1);
        assert_eq!(map.len(), 2);
        assert!(map.peek_mut("a", |_| ()).is_none());
    }

    #[test]
    fn keys_of_one_hash_are_found_and_forgotten_one_by_one() {
        let mut map = BoundedMap::new(8);
        let slots: Vec<usize> = ["a", "b", "c"]
            .iter()
            .map(|key| map.insert(key, 7, || 0u32))
            .collect();
        let found = |map: &BoundedMap<u32>| {
            ["a", "b", "c"]
                .iter()
                .map(|key| map.lookup(key, 7))
                .collect::<Vec<_>>()
        };
        let [a, b, c] = [slots[0], slots[1], slots[2]];
        assert_eq!(found(&map), [Some(a), Some(b), Some(c)]);
        assert_eq!(map.lookup("d", 7), None, "a missing key of the same hash");
        map.unindex(b);
        assert_eq!(found(&map), [Some(a), None, Some(c)]);
        map.unindex(c);
        assert_eq!(found(&map), [Some(a), None, None]);
        map.unindex(a);
        assert!(map.index.is_empty());
    }

    #[test]
    fn a_hit_in_the_newer_half_moves_nothing_and_the_oldest_still_goes_first() {
        let mut map = BoundedMap::new(8);
        for key in ["a", "b", "c", "d", "e", "f", "g", "h"] {
            touch(&mut map, key, 0);
        }
        let before = map.slab[map.find("g").unwrap_or(NIL)].linked_at;
        touch(&mut map, "g", 0);
        assert_eq!(map.slab[map.find("g").unwrap_or(NIL)].linked_at, before);
        // "b" is in the older half: a hit makes it the newest, so "a" goes first, then "c".
        touch(&mut map, "b", 0);
        touch(&mut map, "new1", 0);
        touch(&mut map, "new2", 0);
        assert!(map.peek_mut("a", |_| ()).is_none());
        assert!(map.peek_mut("c", |_| ()).is_none());
        assert!(map.peek_mut("b", |_| ()).is_some());
        assert!(map.peek_mut("g", |_| ()).is_some());
    }

    #[test]
    fn a_hit_in_the_older_half_makes_the_entry_the_newest_however_long_the_list() {
        let mut map = BoundedMap::new(100);
        for i in 0..100 {
            touch(&mut map, &format!("k{i}"), 0);
        }
        // Linked 31st of 100: 69 links ago, in the older half.
        touch(&mut map, "k30", 0);
        for i in 0..31 {
            touch(&mut map, &format!("new{i}"), 0);
        }
        assert!(map.peek_mut("k30", |_| ()).is_some(), "used again, so kept");
        assert!(
            map.peek_mut("k31", |_| ()).is_none(),
            "the oldest went first"
        );
        assert!(map.peek_mut("k29", |_| ()).is_none());
    }

    #[test]
    fn a_hit_in_the_older_half_after_many_keys_were_forgotten_still_makes_the_entry_the_newest() {
        let mut map = BoundedMap::new(100);
        for i in 0..200 {
            touch(&mut map, &format!("k{i}"), 0);
        }
        // k100 to k199 are left, each linked once; k129 was linked 70 links ago.
        touch(&mut map, "k129", 0);
        for i in 0..30 {
            touch(&mut map, &format!("new{i}"), 0);
        }
        assert!(
            map.peek_mut("k129", |_| ()).is_some(),
            "used again, so kept"
        );
        assert!(
            map.peek_mut("k130", |_| ()).is_none(),
            "the oldest went first"
        );
    }

    #[test]
    fn a_million_keys_stay_within_the_bound() {
        let mut map = BoundedMap::new(1000);
        for i in 0..1_000_000u32 {
            touch(&mut map, &format!("d{i}.example"), i % 7);
        }
        assert_eq!(map.len(), 1000);
        assert_eq!(map.slab.len(), 1000);
    }
}
