//! A small in-memory cache of values derived from immutable data (block chunks, footers,
//! postings, trace runs): keys name immutable bytes, so entries never go stale. It is bounded
//! by a total weight (entries or bytes) and simply emptied when an insert would exceed it.

use std::sync::Mutex;

use rustc_hash::FxHashMap;

pub struct Bounded<V> {
    limit: usize,
    inner: Mutex<Entries<V>>,
}

/// The entries with their weights, and the total weight held.
struct Entries<V> {
    weight: usize,
    // keys are short byte strings (tenant, block, column) looked up on every block read: a
    // fast hash, not a DoS-resistant one (they are not chosen by clients)
    map: FxHashMap<Vec<u8>, (usize, V)>,
}

impl<V: Clone> Bounded<V> {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            inner: Mutex::new(Entries {
                weight: 0,
                map: FxHashMap::default(),
            }),
        }
    }

    pub fn get(&self, key: &[u8]) -> Option<V> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.map.get(key).map(|(_, v)| v.clone())
    }

    pub fn insert(&self, key: Vec<u8>, weight: usize, value: V) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.weight + weight > self.limit {
            inner.map.clear(); // crude but bounded
            inner.weight = 0;
        }
        inner.weight += weight;
        if let Some((old, _)) = inner.map.insert(key, (weight, value)) {
            inner.weight -= old;
        }
    }

    /// Keeps only the entries whose key passes `keep` (entries of deleted data).
    pub fn retain(&self, keep: impl Fn(&[u8]) -> bool) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut dropped = 0;
        inner.map.retain(|k, (w, _)| {
            let kept = keep(k);
            if !kept {
                dropped += *w;
            }
            kept
        });
        inner.weight -= dropped;
    }
}
