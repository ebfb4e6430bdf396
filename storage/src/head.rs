//! The head: rows acknowledged since the last flush, kept in memory (and in the write-ahead
//! column family) and queryable at once. One head per tenant and signal.
//!
//! A head batch is held either decoded or as its write-ahead encoding (several times smaller
//! than its rows, and one allocation instead of several small ones per row, which a thousand
//! tenants' interleaved writes would otherwise scatter over the allocator's pages), never both.
//! Batches stay decoded while a [`DecodedCache`], whose byte budget every tenant and signal
//! share, has room for them; past it the batches kept longest are encoded again (encoding is
//! several times cheaper than decoding), and read or flushed by decoding them. One busy
//! tenant's head thus stays decoded, while a thousand tenants' heads do not.

use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use crate::error::Result;
use crate::model::{SpanRecord, TraceId};
use crate::signal::Row;

/// A batch whose decoded rows the cache can give up.
trait Encodable: Send + Sync {
    fn encode(&self);
}

/// Which head batches are held decoded, the oldest encoded again once they hold more than the
/// budget. Shared by every tenant and signal of a store.
pub struct DecodedCache {
    budget: usize,
    inner: Mutex<CacheInner>,
}

#[derive(Default)]
struct CacheInner {
    held: usize,
    /// By the batch's address: the batch and what its decoded rows take.
    entries: FxHashMap<usize, (Weak<dyn Encodable>, usize)>,
    /// Addresses in the order they were kept (an address forgotten since is skipped).
    order: VecDeque<usize>,
}

impl DecodedCache {
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            inner: Mutex::default(),
        }
    }

    /// Bytes of the decoded rows held now.
    pub fn held(&self) -> usize {
        self.lock().held
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether there is room for `bytes` more (always for a batch the cache cannot hold at
    /// all: it is encoded at once).
    fn admit(&self, key: usize, batch: Weak<dyn Encodable>, bytes: usize) -> bool {
        if bytes > self.budget {
            return false;
        }
        let evicted = {
            let mut inner = self.lock();
            if inner.entries.insert(key, (batch, bytes)).is_some() {
                return true;
            }
            inner.held += bytes;
            inner.order.push_back(key);
            let mut evicted = Vec::new();
            while inner.held > self.budget {
                let Some(oldest) = inner.order.pop_front() else {
                    break;
                };
                if let Some((batch, bytes)) = inner.entries.remove(&oldest) {
                    inner.held -= bytes;
                    evicted.push(batch);
                }
            }
            // forgotten addresses leave stale entries in `order`; bound them
            if inner.order.len() > 2 * inner.entries.len() + 64 {
                let CacheInner { entries, order, .. } = &mut *inner;
                order.retain(|k| entries.contains_key(k));
            }
            evicted
        };
        // encoded outside the cache's lock
        for batch in evicted {
            if let Some(batch) = batch.upgrade() {
                batch.encode();
            }
        }
        true
    }

    fn holds(&self, key: usize) -> bool {
        self.lock().entries.contains_key(&key)
    }

    fn forget(&self, key: usize) {
        let mut inner = self.lock();
        if let Some((_, bytes)) = inner.entries.remove(&key) {
            inner.held -= bytes;
        }
    }
}

enum Held<R> {
    Decoded(Arc<Vec<R>>),
    /// The rows' encoding, and the rows while a reader still holds them (so that readers at
    /// the same time share one copy).
    Encoded(Vec<u8>, Weak<Vec<R>>),
}

/// One write-ahead batch of a head.
pub struct HeadBatch<R: Row> {
    held: Mutex<Held<R>>,
    rows: usize,
    /// What the decoded rows take in memory (see `Row::heap_bytes`).
    decoded_bytes: usize,
    cache: Arc<DecodedCache>,
    /// This batch, as the cache refers to it.
    me: Weak<HeadBatch<R>>,
}

impl<R: Row> HeadBatch<R> {
    /// A batch of `rows`, kept decoded while `cache` has room, else as `encoding` (their
    /// encoding; `None`: encode them if needed).
    pub fn new(
        rows: Arc<Vec<R>>,
        encoding: Option<&[u8]>,
        decoded_bytes: usize,
        cache: &Arc<DecodedCache>,
    ) -> Arc<Self> {
        let n = rows.len();
        let batch = Arc::new_cyclic(|me| Self {
            held: Mutex::new(Held::Decoded(rows)),
            rows: n,
            decoded_bytes,
            cache: cache.clone(),
            me: me.clone(),
        });
        let me: Weak<dyn Encodable> = batch.me.clone();
        if !cache.admit(batch.key(), me, decoded_bytes) {
            let mut held = batch.lock();
            if let Held::Decoded(rows) = &*held {
                let bytes = encoding.map_or_else(|| R::encode_rows(rows), <[u8]>::to_vec);
                *held = Held::Encoded(bytes, Arc::downgrade(rows));
            }
        }
        batch
    }

    fn key(&self) -> usize {
        self.me.as_ptr() as *const () as usize
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held<R>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// The batch's rows: decoded already, or decoded now (and kept decoded while the cache
    /// has room).
    pub fn rows(&self) -> Result<Arc<Vec<R>>> {
        let rows = {
            let mut held = self.lock();
            match &mut *held {
                Held::Decoded(rows) => return Ok(rows.clone()),
                Held::Encoded(bytes, shared) => match shared.upgrade() {
                    Some(rows) => rows,
                    None => {
                        let rows = Arc::new(R::decode_rows(bytes)?);
                        *shared = Arc::downgrade(&rows);
                        rows
                    }
                },
            }
        };
        let me: Weak<dyn Encodable> = self.me.clone();
        if self.cache.admit(self.key(), me, self.decoded_bytes) {
            let mut held = self.lock();
            // encoded again meanwhile by an eviction: stays so
            if matches!(&*held, Held::Encoded(..)) && self.cache.holds(self.key()) {
                *held = Held::Decoded(rows.clone());
            }
        }
        Ok(rows)
    }
}

impl<R: Row> Encodable for HeadBatch<R> {
    fn encode(&self) {
        let mut held = self.lock();
        if let Held::Decoded(rows) = &*held {
            let bytes = R::encode_rows(rows);
            *held = Held::Encoded(bytes, Arc::downgrade(rows));
        }
    }
}

impl<R: Row> Drop for HeadBatch<R> {
    fn drop(&mut self) {
        self.cache.forget(self.key());
    }
}

/// Accepted rows of one tenant and signal, in the batches they arrived in.
pub struct Head<R: Row> {
    pub batches: Vec<Arc<HeadBatch<R>>>,
    /// (batch, row) of each trace's rows.
    pub by_trace: FxHashMap<TraceId, Vec<(u32, u32)>>,
    /// Write-ahead keys of the batches, deleted when the head becomes a block.
    pub wal_keys: Vec<Vec<u8>>,
    /// Row identities held or reserved by this head, so that a retried batch is stored once.
    /// (Fx hashing: ids are random already, and SipHash showed at 4.6% of ingest CPU.)
    pub seen: FxHashSet<R::Id>,
    pub rows: usize,
    /// Its rows as decoded (see `Row::heap_bytes`, whether a batch is held decoded or not: a
    /// flush decodes them all) and its indexes: what the store-wide head budget counts.
    pub bytes: usize,
    pub since: Option<Instant>,
    /// The earliest time of its rows (`u64::MAX` when empty), so that a read under a
    /// retention cutoff filters the head only when some row is older.
    pub min_start: u64,
    /// Traces kept back from earlier flushes to wait for a parent, with how many flushes
    /// each has waited (see `StoreOptions::parent_wait_flushes`).
    pub waited: FxHashMap<TraceId, u8>,
}

impl<R: Row> Default for Head<R> {
    fn default() -> Self {
        Self {
            batches: Vec::new(),
            by_trace: FxHashMap::default(),
            wal_keys: Vec::new(),
            seen: FxHashSet::default(),
            rows: 0,
            bytes: 0,
            since: None,
            min_start: u64::MAX,
            waited: FxHashMap::default(),
        }
    }
}

impl<R: Row> Head<R> {
    /// Adds a batch written ahead under `wal_key` (`rows` are its rows) as `bytes` bytes.
    pub fn push(
        &mut self,
        wal_key: Vec<u8>,
        batch: Arc<HeadBatch<R>>,
        rows: &[R],
        now: Instant,
        bytes: usize,
    ) {
        let b = self.batches.len() as u32;
        for (i, row) in rows.iter().enumerate() {
            if let Some(trace) = row.trace_id() {
                self.by_trace.entry(trace).or_default().push((b, i as u32));
            }
            self.min_start = self.min_start.min(row.time().0);
        }
        self.rows += batch.len();
        self.bytes += bytes;
        self.since.get_or_insert(now);
        self.wal_keys.push(wal_key);
        self.batches.push(batch);
    }

    /// Every batch's rows, decoded.
    pub fn decoded(&self) -> Result<Vec<Arc<Vec<R>>>> {
        self.batches.iter().map(|b| b.rows()).collect()
    }

    /// Where a trace's rows are: their batches (shared, so that they are decoded outside the
    /// store's lock) and row numbers.
    pub fn trace(&self, trace: &TraceId) -> Vec<(Arc<HeadBatch<R>>, u32)> {
        self.by_trace
            .get(trace)
            .into_iter()
            .flatten()
            .map(|&(b, i)| (self.batches[b as usize].clone(), i))
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }
}

/// The rows at `at` (see [`Head::trace`]), each batch decoded once.
pub fn rows_at<R: Row>(at: &[(Arc<HeadBatch<R>>, u32)]) -> Result<Vec<R>> {
    let mut out = Vec::with_capacity(at.len());
    let mut last: Option<&Arc<HeadBatch<R>>> = None;
    let mut rows = Arc::default();
    for (batch, i) in at {
        if !last.is_some_and(|b| Arc::ptr_eq(b, batch)) {
            rows = batch.rows()?;
            last = Some(batch);
        }
        out.push(rows[*i as usize].clone());
    }
    Ok(out)
}

/// A cheap, consistent view of a tenant's unflushed rows for a read.
#[derive(Clone)]
pub struct HeadSnapshot<R = SpanRecord> {
    pub batches: Vec<Arc<Vec<R>>>,
}

impl<R> Default for HeadSnapshot<R> {
    fn default() -> Self {
        Self {
            batches: Vec::new(),
        }
    }
}

impl<R> HeadSnapshot<R> {
    pub fn rows(&self) -> impl Iterator<Item = &R> {
        self.batches.iter().flat_map(|b| b.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LogRecord, UnixNanos, Value};

    fn batch(cache: &Arc<DecodedCache>, n: u64) -> (Arc<HeadBatch<LogRecord>>, Vec<LogRecord>) {
        let rows: Vec<LogRecord> = (0..n)
            .map(|i| LogRecord {
                time: UnixNanos(1_000 + i),
                body: Value::Str(format!("record {i}")),
                ..Default::default()
            })
            .collect();
        (
            HeadBatch::new(Arc::new(rows.clone()), None, 1_000, cache),
            rows,
        )
    }

    fn decoded(b: &HeadBatch<LogRecord>) -> bool {
        matches!(&*b.lock(), Held::Decoded(_))
    }

    #[test]
    fn the_oldest_batches_are_encoded_first_and_decode_back_equal() {
        let cache = Arc::new(DecodedCache::new(2_500));
        let (a, rows_a) = batch(&cache, 3);
        let (b, _) = batch(&cache, 4);
        assert_eq!(cache.held(), 2_000);
        let (c, rows_c) = batch(&cache, 5);
        assert_eq!(cache.held(), 2_000);
        assert!(!decoded(&a) && decoded(&b) && decoded(&c));
        assert_eq!(*a.rows().unwrap(), rows_a);
        // decoding a kept it decoded, and encoded b
        assert_eq!(cache.held(), 2_000);
        assert!(decoded(&a) && !decoded(&b) && decoded(&c));
        let held_c = c.rows().unwrap();
        assert_eq!(*held_c, rows_c);
        drop(b);
        drop(c);
        assert_eq!(cache.held(), 1_000, "a dropped batch leaves the cache");
        assert_eq!(*held_c, rows_c);
        drop(a);
        assert_eq!(cache.held(), 0);
    }

    #[test]
    fn readers_share_the_rows_of_an_encoded_batch_and_none_fit_a_zero_budget() {
        let cache = Arc::new(DecodedCache::new(0));
        let (a, rows) = batch(&cache, 2);
        assert!(!decoded(&a));
        let first = a.rows().unwrap();
        assert!(
            Arc::ptr_eq(&first, &a.rows().unwrap()),
            "one copy while it is held"
        );
        drop(first);
        assert_eq!(*a.rows().unwrap(), rows, "decoded again");
        assert_eq!(cache.held(), 0);
    }
}
