//! A map with a bound on its size that forgets the least recently used entries first, and
//! of those, the ones its owner marks as cheap to forget (closed breakers) before the others.

use std::collections::HashMap;

const NIL: usize = usize::MAX;

#[derive(Debug)]
struct Entry<V> {
    key: Box<str>,
    value: V,
    cheap: bool,
    newer: usize,
    older: usize,
}

/// Two recency lists threaded through one slab: index 0 for entries cheap to forget, 1 for the rest.
#[derive(Debug)]
pub(crate) struct BoundedMap<V> {
    index: HashMap<Box<str>, usize>,
    slab: Vec<Entry<V>>,
    newest: [usize; 2],
    oldest: [usize; 2],
    capacity: usize,
}

impl<V> BoundedMap<V> {
    pub(crate) fn new(capacity: usize) -> Self {
        BoundedMap {
            index: HashMap::new(),
            slab: Vec::new(),
            newest: [NIL; 2],
            oldest: [NIL; 2],
            capacity: capacity.max(1),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// Runs `f` on the entry for `key`, made with `make` if missing, and marks it most
    /// recently used. `is_cheap` says, after `f`, whether the entry may be forgotten first.
    pub(crate) fn with<R>(
        &mut self,
        key: &str,
        make: impl FnOnce() -> V,
        is_cheap: impl Fn(&V) -> bool,
        f: impl FnOnce(&mut V) -> R,
    ) -> R {
        let at = match self.find(key) {
            Some(at) => at,
            None => self.insert(key, make()),
        };
        let result = f(&mut self.slab[at].value);
        let cheap = is_cheap(&self.slab[at].value);
        let entry = &self.slab[at];
        // A key used again and again (one breaker per transport) is already the newest of its
        // list: leave the links alone.
        if entry.cheap != cheap || self.newest[usize::from(!cheap)] != at {
            self.unlink(at);
            self.slab[at].cheap = cheap;
            self.link_newest(at);
        }
        result
    }

    /// Runs `f` on the entry for `key` if there is one, without changing its recency.
    pub(crate) fn peek_mut<R>(&mut self, key: &str, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let at = self.find(key)?;
        Some(f(&mut self.slab[at].value))
    }

    /// Where `key` is. The newest entry of each list is compared first, which spares hashing
    /// the key when one key takes most of the traffic.
    /// Runs `f` on every entry, oldest first or not: in no promised order, recency unchanged.
    pub(crate) fn for_each_mut(&mut self, mut f: impl FnMut(&str, &mut V)) {
        for entry in &mut self.slab {
            f(&entry.key, &mut entry.value);
        }
    }

    fn find(&self, key: &str) -> Option<usize> {
        for newest in self.newest {
            if newest != NIL && *self.slab[newest].key == *key {
                return Some(newest);
            }
        }
        self.index.get(key).copied()
    }

    /// Puts a new entry in a free place, forgetting the oldest entry when full, and links it
    /// as the newest of the cheap list.
    fn insert(&mut self, key: &str, value: V) -> usize {
        let entry = Entry {
            key: key.into(),
            value,
            cheap: true,
            newer: NIL,
            older: NIL,
        };
        let at = if self.index.len() < self.capacity {
            self.slab.push(entry);
            let at = self.slab.len() - 1;
            self.index.insert(key.into(), at);
            at
        } else {
            let victim = if self.oldest[0] != NIL {
                self.oldest[0]
            } else {
                self.oldest[1]
            };
            self.unlink(victim);
            self.index.remove(&self.slab[victim].key);
            self.slab[victim] = entry;
            self.index.insert(key.into(), victim);
            victim
        };
        self.link_newest(at);
        at
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
    }

    fn link_newest(&mut self, at: usize) {
        let list = usize::from(!self.slab[at].cheap);
        let previous = self.newest[list];
        self.slab[at].older = previous;
        self.slab[at].newer = NIL;
        match previous {
            NIL => self.oldest[list] = at,
            p => self.slab[p].newer = at,
        }
        self.newest[list] = at;
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
    fn a_million_keys_stay_within_the_bound() {
        let mut map = BoundedMap::new(1000);
        for i in 0..1_000_000u32 {
            touch(&mut map, &format!("d{i}.example"), i % 7);
        }
        assert_eq!(map.len(), 1000);
        assert_eq!(map.slab.len(), 1000);
    }
}
