//! A small in-memory cache of values derived from immutable data (block chunks, footers,
//! postings, trace runs): keys name immutable bytes, so entries never go stale. It is bounded
//! by a total weight (entries or bytes). An insert that would exceed it first evicts about
//! half the entries not read since the last eviction, every other one in the map's (hash)
//! order, a different half each time; entries read since keep their place once more. A read
//! of more than the cache holds (a column over every block, bigger than the cache) then finds
//! part of what it read the time before, where emptying the whole cache (as this cache did
//! before) would find none, and entries other queries left behind go a half at a time.

use std::sync::Mutex;

use rustc_hash::FxHashMap;

pub struct Bounded<V> {
    limit: usize,
    inner: Mutex<Entries<V>>,
}

/// The entries with their weights, and the total weight held.
struct Entries<V> {
    weight: usize,
    /// Evictions so far (which half of the entries the next one takes).
    evictions: usize,
    // keys are short byte strings (tenant, block, column) looked up on every block read: a
    // fast hash, not a DoS-resistant one (they are not chosen by clients)
    map: FxHashMap<Vec<u8>, Entry<V>>,
}

struct Entry<V> {
    weight: usize,
    /// Read since the last eviction.
    used: bool,
    value: V,
}

impl<V> Entries<V> {
    /// Makes room for `weight` under `limit` (see the module comment).
    fn evict(&mut self, weight: usize, limit: usize) {
        let parity = self.evictions % 2;
        self.evictions += 1;
        let mut i = 0;
        let mut freed = 0;
        self.map.retain(|_, e| {
            if std::mem::take(&mut e.used) {
                return true;
            }
            i += 1;
            if i % 2 == parity {
                return true;
            }
            freed += e.weight;
            false
        });
        self.weight -= freed;
        if self.weight + weight > limit {
            let mut freed = 0;
            let over = self.weight + weight - limit;
            self.map.retain(|_, e| {
                if freed >= over {
                    return true;
                }
                freed += e.weight;
                false
            });
            self.weight -= freed;
        }
    }
}

impl<V: Clone> Bounded<V> {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            inner: Mutex::new(Entries {
                weight: 0,
                evictions: 0,
                map: FxHashMap::default(),
            }),
        }
    }

    pub fn get(&self, key: &[u8]) -> Option<V> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.map.get_mut(key).map(|e| {
            e.used = true;
            e.value.clone()
        })
    }

    pub fn insert(&self, key: Vec<u8>, weight: usize, value: V) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.weight + weight > self.limit {
            inner.evict(weight.min(self.limit), self.limit);
        }
        inner.weight += weight;
        let entry = Entry {
            weight,
            used: false,
            value,
        };
        if let Some(old) = inner.map.insert(key, entry) {
            inner.weight -= old.weight;
        }
    }

    /// Keeps only the entries whose key passes `keep` (entries of deleted data).
    pub fn retain(&self, keep: impl Fn(&[u8]) -> bool) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut dropped = 0;
        inner.map.retain(|k, e| {
            let kept = keep(k);
            if !kept {
                dropped += e.weight;
            }
            kept
        });
        inner.weight -= dropped;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cyclic read of more than the cache holds keeps finding part of it, and the weight
    /// never passes the limit.
    #[test]
    fn a_read_bigger_than_the_cache_still_hits() {
        let cache: Bounded<u32> = Bounded::new(100);
        let mut hits = 0;
        for pass in 0..3 {
            for k in 0u32..150 {
                let key = k.to_le_bytes().to_vec();
                match cache.get(&key) {
                    Some(v) => {
                        assert_eq!(v, k);
                        if pass > 0 {
                            hits += 1;
                        }
                    }
                    None => cache.insert(key, 1, k),
                }
                let inner = cache.inner.lock().unwrap();
                assert!(inner.weight <= 100, "weight {}", inner.weight);
                assert_eq!(inner.weight, inner.map.len());
            }
        }
        assert!(
            hits > 30,
            "{hits} hits in two passes of 150 over a cache of 100"
        );
    }

    /// Entries read since the last eviction outlive those left by earlier reads: a working set
    /// that fits is soon wholly in the cache again after a bigger read passed through.
    #[test]
    fn a_working_set_outlives_what_others_left() {
        let cache: Bounded<u32> = Bounded::new(100);
        // another query's entries fill the cache
        for k in 1000u32..1100 {
            cache.insert(k.to_le_bytes().to_vec(), 1, k);
        }
        let pass = |cache: &Bounded<u32>| {
            let mut misses = 0;
            for k in 0u32..60 {
                let key = k.to_le_bytes().to_vec();
                if cache.get(&key).is_none() {
                    misses += 1;
                    cache.insert(key, 1, k);
                }
            }
            misses
        };
        assert_eq!(pass(&cache), 60);
        let later: Vec<usize> = (0..4).map(|_| pass(&cache)).collect();
        assert_eq!(*later.last().unwrap(), 0, "misses per pass: {later:?}");
    }
}
