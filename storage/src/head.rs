//! The head: rows acknowledged since the last flush, kept in memory (and in the write-ahead
//! column family) and queryable at once. One head per tenant and signal.
//!
//! A head batch is held as its write-ahead encoding (several times smaller than its decoded
//! rows, and one allocation instead of several small ones per row, which a thousand tenants'
//! interleaved writes would otherwise scatter over the allocator's pages), and decoded for
//! reads and flushes. The decoded forms of the batches written or
//! read last are kept in a [`DecodedCache`] whose byte budget every tenant and signal share,
//! so that a live query over a busy head does not decode it again each time, while a thousand
//! tenants' heads do not hold a thousand tenants' decoded rows.

use rustc_hash::{FxHashMap, FxHashSet};
use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use crate::error::Result;
use crate::model::{SpanRecord, TraceId};
use crate::signal::Row;

/// Decoded head batches kept for reads and flushes, the oldest dropped first once they hold
/// more than the budget. Shared by every tenant and signal of a store.
pub struct DecodedCache {
    budget: usize,
    inner: Mutex<CacheInner>,
}

#[derive(Default)]
struct CacheInner {
    held: usize,
    /// By the address of the decoded rows' allocation: the rows and their bytes.
    entries: FxHashMap<usize, (Arc<dyn Any + Send + Sync>, usize)>,
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

    /// Bytes of the decoded rows kept now.
    pub fn held(&self) -> usize {
        self.lock().held
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn keep<R: Row>(&self, rows: &Arc<Vec<R>>, bytes: usize) {
        if bytes > self.budget {
            return;
        }
        let key = address(rows);
        let mut inner = self.lock();
        let erased: Arc<dyn Any + Send + Sync> = rows.clone();
        if inner.entries.insert(key, (erased, bytes)).is_some() {
            return;
        }
        inner.held += bytes;
        inner.order.push_back(key);
        // evicted rows are dropped after the lock is released: a large batch's rows take a
        // while to free
        let mut evicted = Vec::new();
        while inner.held > self.budget {
            let Some(oldest) = inner.order.pop_front() else {
                break;
            };
            if let Some((rows, bytes)) = inner.entries.remove(&oldest) {
                inner.held -= bytes;
                evicted.push(rows);
            }
        }
        // forgotten addresses leave stale entries in `order`; bound them
        if inner.order.len() > 2 * inner.entries.len() + 64 {
            let CacheInner { entries, order, .. } = &mut *inner;
            order.retain(|k| entries.contains_key(k));
        }
        drop(inner);
        drop(evicted);
    }

    fn forget(&self, key: usize) {
        let removed = {
            let mut inner = self.lock();
            let removed = inner.entries.remove(&key);
            if let Some((_, bytes)) = &removed {
                inner.held -= bytes;
            }
            removed
        };
        drop(removed);
    }
}

fn address<T>(rows: &Arc<T>) -> usize {
    Arc::as_ptr(rows) as *const () as usize
}

/// One write-ahead batch of a head: its encoding, and its decoded rows while a reader or the
/// cache holds them.
pub struct HeadBatch<R: Row> {
    encoded: Vec<u8>,
    /// The encoding's length within `encoded` (which may end with the write-ahead trailer).
    payload: usize,
    rows: usize,
    /// What the decoded rows take in memory (see `Row::heap_bytes`).
    decoded_bytes: usize,
    decoded: Mutex<Weak<Vec<R>>>,
    cache: Arc<DecodedCache>,
}

impl<R: Row> HeadBatch<R> {
    /// A batch of `rows`, encoded as the first `payload` bytes of `encoded`; the rows stay
    /// decoded in `cache` while it has room.
    pub fn new(
        mut encoded: Vec<u8>,
        payload: usize,
        rows: &Arc<Vec<R>>,
        decoded_bytes: usize,
        cache: &Arc<DecodedCache>,
    ) -> Arc<Self> {
        encoded.shrink_to_fit();
        cache.keep(rows, decoded_bytes);
        Arc::new(Self {
            encoded,
            payload,
            rows: rows.len(),
            decoded_bytes,
            decoded: Mutex::new(Arc::downgrade(rows)),
            cache: cache.clone(),
        })
    }

    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Bytes of the encoding held.
    pub fn encoded_bytes(&self) -> usize {
        self.encoded.capacity()
    }

    /// The batch's rows: those a reader or the cache holds, or decoded again (and kept in the
    /// cache while it has room).
    pub fn rows(&self) -> Result<Arc<Vec<R>>> {
        let mut decoded = self.decoded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(rows) = decoded.upgrade() {
            return Ok(rows);
        }
        let rows = Arc::new(R::decode_rows(&self.encoded[..self.payload])?);
        *decoded = Arc::downgrade(&rows);
        drop(decoded);
        self.cache.keep(&rows, self.decoded_bytes);
        Ok(rows)
    }
}

impl<R: Row> Drop for HeadBatch<R> {
    fn drop(&mut self) {
        let decoded = self.decoded.get_mut().unwrap_or_else(|e| e.into_inner());
        // the weak reference keeps the address from being reused while it is looked up
        self.cache.forget(decoded.as_ptr() as *const () as usize);
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
    /// What its batches take in memory (their encodings and the head's indexes): what the
    /// store-wide head budget counts.
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
        let encoded = LogRecord::encode_rows(&rows);
        let len = encoded.len();
        let decoded = Arc::new(rows.clone());
        (HeadBatch::new(encoded, len, &decoded, 1_000, cache), rows)
    }

    #[test]
    fn the_oldest_decoded_batches_go_first_and_come_back_equal() {
        let cache = Arc::new(DecodedCache::new(2_500));
        let (a, rows_a) = batch(&cache, 3);
        let (b, _) = batch(&cache, 4);
        assert_eq!(cache.held(), 2_000);
        let (c, rows_c) = batch(&cache, 5);
        // a was evicted, b and c are kept
        assert_eq!(cache.held(), 2_000);
        assert_eq!(*a.rows().unwrap(), rows_a);
        // decoding a again kept it and evicted b
        assert_eq!(cache.held(), 2_000);
        let held_c = c.rows().unwrap();
        assert_eq!(*held_c, rows_c);
        drop(b);
        drop(c);
        // c's rows are still held by a reader, but the cache forgot them with their batch
        assert_eq!(cache.held(), 1_000);
        assert_eq!(*held_c, rows_c);
        drop(a);
        assert_eq!(cache.held(), 0);
    }

    #[test]
    fn a_reader_keeps_evicted_rows_shared_until_it_lets_go() {
        let cache = Arc::new(DecodedCache::new(1_000));
        let (a, _) = batch(&cache, 2);
        let first = a.rows().unwrap();
        let (_b, _) = batch(&cache, 2);
        // evicted from the cache, but the reader's copy is the one handed out again
        assert!(Arc::ptr_eq(&first, &a.rows().unwrap()));
        drop(first);
        assert_eq!(a.rows().unwrap().len(), 2, "decoded again");
    }
}
