//! The store: RocksDB underneath, the write-ahead head on top, immutable blocks after flush.
//!
//! Column families: `head` holds write-ahead batches (synced before an append returns, so that
//! acknowledged means durable; concurrent appends share one fsync through RocksDB's group
//! commit), `meta` the block metas (all loaded at open), `default` the column chunks, trace
//! summaries, postings and the trace-id index. A flush writes a block and deletes the head
//! batches it came from in one atomic write batch, so every row lives in exactly one place.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use roaring::RoaringBitmap;
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor, DB, IteratorMode, Options,
    SliceTransform, WriteBatch, WriteOptions,
};

use crate::block::format::{Compression, decode_postings, decode_traces, encode_traces};
use crate::block::reader::{ChunkSource, MinorityRows, Postings, Rows, TermRuns, TraceRuns};
use crate::block::{BlockMeta, BlockReader, TraceEntry};
use crate::cache::Bounded;
use crate::clock::{Clock, SystemClock};
use crate::error::{Result, StorageError};
use crate::head::{DecodedCache, Head, HeadBatch, HeadSnapshot};
use crate::keys::{self, BlockAddr, Signal};
use crate::model::{LogRecord, MetricPoint, SpanId, SpanRecord, TenantId, TraceId, UnixNanos};
use crate::retention::Retention;
use crate::seal::{self, seal, unseal};
use crate::signal::Row;
use crate::terms::{self, TermFilter};

const CF_HEAD: &str = "head";
const CF_META: &str = "meta";
const CF_DATA: &str = "default";
/// The signal this store's span methods read and write.
const SPANS: Signal = Signal::Spans;

/// Tuning of the store; every field has a server flag.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Flush a tenant's head once it holds this many rows (also the largest block).
    pub flush_rows: usize,
    /// Flush a head once its oldest row is this old.
    pub flush_age: Duration,
    /// Refuse appends (retryably) while this many rows wait for flush.
    pub max_pending_rows: usize,
    /// Memory (their rows as decoded, see [`Row::heap_bytes`], and indexes) that every
    /// tenant's heads may hold together: past
    /// half of it every head is flushed, past it appends are refused (retryably) until
    /// flushes catch up. Many tenants each under their own flush size would otherwise hold a
    /// flush age of traffic in memory. 0: no bound.
    pub max_head_bytes: usize,
    /// Width of a time window; blocks never straddle one.
    pub window: Duration,
    /// RocksDB block cache size.
    pub cache_bytes: usize,
    /// How long rows are kept, per tenant and signal.
    pub retention: Retention,
    /// The wall clock (retention cutoffs).
    pub clock: Arc<dyn Clock>,
    /// A window that received no block for this long has all its small blocks merged.
    pub merge_idle: Duration,
    /// Compression of column chunks (`None`: every value is on disk as it came).
    pub compression: Compression,
    /// How many flushes a trace may be kept back in the head, waiting for the parent of one
    /// of its spans, so that it reaches a block whole (SDKs export children before their
    /// parents); 0 flushes every row at once.
    pub parent_wait_flushes: u8,
    /// Start even when a block meta or head record fails its checksum, leaving it out (and
    /// logging it) instead of refusing to open.
    pub skip_corrupt_blocks: bool,
    /// Refuse writes (retryably) while the data directory's filesystem has less free space
    /// than this, in bytes; 0 never refuses.
    pub min_free_disk: u64,
    /// Tenants the store takes rows for; rows of one more are refused. 0: no limit.
    pub max_tenants: usize,
    /// What head batches held decoded may take, every tenant and signal together; past it
    /// the batches decoded longest ago are held as their encoding (see [`DecodedCache`]).
    pub decoded_head_bytes: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            flush_rows: 131_072,
            flush_age: Duration::from_secs(10),
            max_pending_rows: 524_288,
            max_head_bytes: 1 << 30,
            window: Duration::from_secs(3600),
            cache_bytes: 128 << 20,
            retention: Retention::default(),
            clock: Arc::new(SystemClock),
            merge_idle: Duration::from_secs(60),
            compression: Default::default(),
            parent_wait_flushes: 2,
            skip_corrupt_blocks: false,
            min_free_disk: 256 << 20,
            max_tenants: 10_000,
            decoded_head_bytes: 512 << 20,
        }
    }
}

/// Counters for the server's `/metrics`.
#[derive(Default, Debug)]
pub struct StoreStats {
    /// Writes refused because they would add a tenant past `max_tenants`.
    pub refused_tenants: AtomicU64,
    /// Writes refused because the disk was (nearly) full.
    pub refused_disk_full: AtomicU64,
    /// Writes refused because every tenant's heads together held `max_head_bytes`.
    pub refused_head_budget: AtomicU64,
    /// Block metas and head records left out at open because they failed their checksums.
    pub corrupt_skipped: AtomicU64,
    /// Blocks left out of answers after a query found part of them damaged.
    pub blocks_left_out: AtomicU64,
    pub rows_appended: AtomicU64,
    pub rows_deduplicated: AtomicU64,
    pub appends_refused: AtomicU64,
    pub wal_writes: AtomicU64,
    pub wal_nanos: AtomicU64,
    pub flushes: AtomicU64,
    pub flush_nanos: AtomicU64,
    pub blocks_written: AtomicU64,
    pub block_bytes_written: AtomicU64,
    pub rows_flushed: AtomicU64,
    /// Rows kept back by a flush to wait for a parent (counted once per flush that kept them).
    pub rows_waiting: AtomicU64,
    /// Blocks retired because their window fell out of retention.
    pub blocks_expired: AtomicU64,
    /// Blocks merged into larger ones.
    pub blocks_merged: AtomicU64,
    /// Merges done (each writes one or more blocks in place of several).
    pub merges: AtomicU64,
    /// Retired blocks (merged or expired) whose data was deleted.
    pub blocks_deleted: AtomicU64,
    /// Metric series registered.
    pub series_created: AtomicU64,
    /// Series deleted after retention took their last points.
    pub series_deleted: AtomicU64,
    /// Text index updates that failed (the index catches up at the next update or open).
    pub text_index_errors: AtomicU64,
    /// When the last append was written, in milliseconds since the store opened.
    pub last_append_ms: AtomicU64,
    /// Counters of the background tasks, by name.
    tasks: Mutex<BTreeMap<&'static str, Arc<crate::background::TaskStats>>>,
}

impl StoreStats {
    /// The counters of a background task (made on first use).
    pub fn task(&self, name: &'static str) -> Arc<crate::background::TaskStats> {
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.entry(name).or_default().clone()
    }

    /// Every background task's counters, by name.
    pub fn tasks(&self) -> Vec<(&'static str, Arc<crate::background::TaskStats>)> {
        let tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.iter().map(|(n, s)| (*n, s.clone())).collect()
    }
}

/// A write-ahead write under way. A span it reserved is not yet durable: a request that
/// carries the same span (a client's early retry) waits for this write and is answered only
/// once it is synced, or writes the span itself when this write failed.
#[derive(Default)]
struct InFlight {
    outcome: Mutex<Option<bool>>,
    finished: Condvar,
}

impl InFlight {
    fn finish(&self, durable: bool) {
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(durable);
        self.finished.notify_all();
    }

    /// Whether the write made its spans durable, once it is over.
    fn wait(&self) -> bool {
        let mut outcome = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(durable) = *outcome {
                return durable;
            }
            outcome = self
                .finished
                .wait(outcome)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// What a request's rows are, against what the tenant holds: new ones it reserved (and must
/// write), ones another request is writing (to wait for), and ones already durable.
struct Reserved<R: Row> {
    fresh: Vec<R>,
    /// The identities of `fresh`, computed once (a log record's is a digest of all of it).
    fresh_ids: Vec<R::Id>,
    waits: Vec<(Arc<InFlight>, Vec<R>)>,
    seq: u64,
}

/// One tenant's rows of one signal.
struct TenantState<R: Row> {
    head: Head<R>,
    /// Rows reserved by write-ahead writes under way, each with its write.
    in_flight: rustc_hash::FxHashMap<R::Id, Arc<InFlight>>,
    /// Rows replayed from the write-ahead at open and not flushed since: they do not count
    /// against `max_pending_rows`, so that a restart near the limit does not refuse every
    /// write until they are flushed (they are due at once).
    replayed: usize,
    /// Their bytes (see [`Head::bytes`]).
    replayed_bytes: usize,
    /// The head being turned into blocks: still readable until its blocks are visible.
    frozen: Option<Arc<Head<R>>>,
    /// Row identities of the last flushed head, so a retry arriving just after a flush is
    /// still stored once.
    recent: rustc_hash::FxHashSet<R::Id>,
    /// When `recent` was taken (it is dropped once the tenant has been idle for
    /// [`crate::background::RECENT_KEEP`]: an idle tenant does not hold its last head's
    /// identities for ever).
    recent_at: Option<Instant>,
    /// Copy-on-write, so a reader's snapshot is one reference count.
    blocks: Arc<BTreeMap<BlockAddr, Arc<BlockMeta>>>,
    /// When each window last received a flushed block (windows still being written are
    /// merged tier by tier; idle ones whole).
    last_write: BTreeMap<u64, Instant>,
}

impl<R: Row> Default for TenantState<R> {
    fn default() -> Self {
        Self {
            head: Head::default(),
            in_flight: Default::default(),
            replayed: 0,
            replayed_bytes: 0,
            frozen: None,
            recent: Default::default(),
            recent_at: None,
            blocks: Default::default(),
            last_write: BTreeMap::new(),
        }
    }
}

/// A consistent view of one tenant: the blocks and the unflushed rows as of one instant. A row
/// is in exactly one of them, whatever flush is under way.
#[derive(Clone)]
pub struct Snapshot<R = SpanRecord> {
    pub blocks: Arc<BTreeMap<BlockAddr, Arc<BlockMeta>>>,
    pub head: HeadSnapshot<R>,
    /// The tenant's retention cutoff when the snapshot was taken: no row starting before it
    /// may be returned. Blocks wholly older and head rows older are already left out; a block
    /// that [`Self::straddles`] it must have its rows narrowed ([`Store::live_rows`]).
    pub cutoff: Option<UnixNanos>,
    /// Traces whose span rows are in more than one block (see [`crate::request`]).
    pub splits: Arc<HashSet<TraceId>>,
}

impl<R> Default for Snapshot<R> {
    fn default() -> Self {
        Self {
            blocks: Default::default(),
            head: HeadSnapshot::default(),
            cutoff: None,
            splits: Default::default(),
        }
    }
}

impl<R> Snapshot<R> {
    /// Whether some rows of a block are older than the cutoff (and some not).
    pub fn straddles(&self, meta: &BlockMeta) -> bool {
        self.cutoff.is_some_and(|c| meta.min_start < c.0)
    }

    /// A time range `[start, end)` (either end open) as the rows it may return: `(lo, hi)`,
    /// the start no earlier than the cutoff.
    pub fn range(&self, start: Option<u64>, end: Option<u64>) -> (u64, u64) {
        let lo = start.unwrap_or(0).max(self.cutoff.map_or(0, |c| c.0));
        (lo, end.unwrap_or(u64::MAX))
    }

    /// The blocks with rows starting in `[lo, hi)`, by address.
    pub fn blocks_in(&self, (lo, hi): (u64, u64)) -> Vec<(BlockAddr, &Arc<BlockMeta>)> {
        self.blocks
            .iter()
            .filter(|(_, m)| m.max_start >= lo && m.min_start < hi)
            .map(|(a, m)| (*a, m))
            .collect()
    }
}

impl<R: Row> TenantState<R> {
    /// Puts a head whose flush failed back in front of the head (its rows are still in the
    /// write-ahead), so that they stay readable and are flushed again.
    fn unfreeze(&mut self, head: &Head<R>) {
        let mut restored = Head {
            batches: head.batches.clone(),
            by_trace: head.by_trace.clone(),
            wal_keys: head.wal_keys.clone(),
            rows: head.rows,
            since: (head.rows > 0).then(Instant::now),
            min_start: head.min_start,
            ..Head::default()
        };
        let newer = std::mem::take(&mut self.head);
        let offset = restored.batches.len() as u32;
        for (trace, at) in newer.by_trace {
            let to = restored.by_trace.entry(trace).or_default();
            to.extend(at.into_iter().map(|(b, i)| (b + offset, i)));
        }
        restored.batches.extend(newer.batches);
        restored.wal_keys.extend(newer.wal_keys);
        restored.rows += newer.rows;
        restored.min_start = restored.min_start.min(newer.min_start);
        if newer.rows > 0 {
            restored.since.get_or_insert_with(Instant::now);
        }
        restored.bytes = head.bytes + newer.bytes;
        restored.seen = head.seen.union(&newer.seen).copied().collect();
        restored.waited = head.waited.clone();
        for (trace, n) in newer.waited {
            let w = restored.waited.entry(trace).or_default();
            *w = (*w).max(n);
        }
        self.head = restored;
        self.frozen = None;
    }

    fn pending_rows(&self) -> usize {
        self.head.rows + self.frozen.as_ref().map_or(0, |f| f.rows)
    }
    /// Bytes of the pending rows that count against the store-wide head budget.
    fn admitted_bytes(&self) -> usize {
        (self.head.bytes + self.frozen.as_ref().map_or(0, |f| f.bytes))
            .saturating_sub(self.replayed_bytes)
    }
    /// Pending rows that count against `max_pending_rows`.
    fn admitted_rows(&self) -> usize {
        self.pending_rows().saturating_sub(self.replayed)
    }
    /// Whether a row is durable in the head, the head being flushed or the last flushed one.
    fn is_known(&self, key: &R::Id) -> bool {
        self.head.seen.contains(key)
            || self.recent.contains(key)
            || self.frozen.as_ref().is_some_and(|f| f.seen.contains(key))
    }
}

/// Blocks a flush wrote.
type Written = Vec<(BlockAddr, Arc<BlockMeta>)>;

/// Text documents of new blocks, by window and block.
type TextDocs = BTreeMap<u64, HashMap<u64, Vec<tantivy::TantivyDocument>>>;

/// Text documents waiting for the index task: by (tenant, window), the documents of the
/// window's new blocks, and how many documents are kept in all.
#[derive(Default)]
struct PendingText {
    windows: BTreeMap<(TenantId, u64), HashMap<u64, Vec<tantivy::TantivyDocument>>>,
    docs: usize,
}

/// The most documents kept for the index task; beyond it they are dropped and the task reads
/// the blocks back (memory stays bounded when indexing falls behind ingest).
const PENDING_TEXT_DOCS: usize = 50_000;

/// What a flush of one head did.
struct Flushed<R> {
    written: Written,
    kept: Option<Kept<R>>,
    text: TextDocs,
}

/// W3C trace flags (OTLP span flags bits 8 and 9): whether the parent is remote is known, and
/// it is.
const REMOTE_PARENT: u32 = 0x300;

/// Rows a flush kept back in the head, waiting for a parent: written again to the write-ahead
/// under `wal_key` in the flush's own batch.
struct Kept<R> {
    wal_key: Vec<u8>,
    rows: Vec<R>,
    /// Each kept trace with the number of flushes it has now waited.
    waited: Vec<(TraceId, u8)>,
}

/// Each signal's tenants.
#[derive(Default)]
struct State {
    spans: HashMap<TenantId, TenantState<SpanRecord>>,
    logs: HashMap<TenantId, TenantState<LogRecord>>,
    metrics: HashMap<TenantId, TenantState<MetricPoint>>,
    /// Blocks merged or out of retention, deleted once no reader holds them.
    retired: Vec<retire::Retired>,
    /// Per tenant, the traces whose span rows are in more than one block.
    splits: HashMap<TenantId, Arc<HashSet<TraceId>>>,
    /// Blocks left out because they are damaged (see [`damage`]).
    damaged: damage::Damaged,
    next_seq: u64,
    next_block: u64,
}

impl State {
    /// Whether the tenant has rows (or had, in this process) of any signal.
    fn knows(&self, tenant: &TenantId) -> bool {
        self.spans.contains_key(tenant)
            || self.logs.contains_key(tenant)
            || self.metrics.contains_key(tenant)
    }

    /// Bytes every tenant's heads hold (see [`Head::bytes`]), of every signal, replayed rows
    /// aside.
    fn head_bytes(&self) -> usize {
        fn sum<R: Row>(lanes: &HashMap<TenantId, TenantState<R>>) -> usize {
            lanes.values().map(TenantState::admitted_bytes).sum()
        }
        sum(&self.spans) + sum(&self.logs) + sum(&self.metrics)
    }

    /// Tenants with rows of any signal.
    fn tenant_count(&self) -> usize {
        let mut all: HashSet<&TenantId> = self.spans.keys().collect();
        all.extend(self.logs.keys());
        all.extend(self.metrics.keys());
        all.len()
    }
}

pub struct Store {
    db: DB,
    path: PathBuf,
    opts: StoreOptions,
    state: Mutex<State>,
    flush_lock: Mutex<()>,
    /// Merging and retention, one at a time (both retire blocks).
    maintenance: Mutex<()>,
    sync: WriteOptions,
    closed: AtomicBool,
    /// When the store opened (the clock of `last_append_ms`).
    opened: Instant,
    /// Whether the memtables were flushed since the last append (see [`Self::release_idle`]).
    idle_flushed: AtomicBool,
    /// Parsed footers of column chunks, by chunk key.
    footers: Bounded<ArrowReaderMetadata>,
    /// Free space of the data directory (writes refused under `min_free_disk`).
    pub disk: crate::disk::DiskGuard,
    /// Column chunks recently read, by key, weighed in bytes: a repeated query decodes from
    /// memory instead of copying chunks out of RocksDB again.
    chunks: Bounded<Bytes>,
    /// Decoded postings by key, weighed by their encoded bytes.
    postings: Bounded<Arc<Vec<(String, RoaringBitmap)>>>,
    /// Trace runs of blocks, by block key (from the blocks' trace summaries).
    trace_runs: Bounded<Arc<TraceRuns>>,
    /// Term runs of postings dimensions (see [`TermRuns`]), by postings key, weighed in bytes.
    term_runs: Bounded<Option<Arc<TermRuns>>>,
    /// Span blocks' minority rows decoded (see [`MinorityRows`]), by chunk key, weighed in
    /// bytes: every read of a few request rows asks which rows they are.
    minority_rows: Bounded<Arc<MinorityRows>>,
    /// Each metric block's series runs (series id, first row, rows), by block key.
    series_runs: Bounded<Arc<Vec<(u32, u32, u32)>>>,
    /// Metric blocks' times, start times and values decoded, by block key, weighed in bytes:
    /// PromQL reads the same few blocks at every query and step.
    metric_points: Bounded<Arc<metrics::DecodedPoints>>,
    /// Rows of blocks matching term filters, by block and filter, weighed in bytes.
    matches: Bounded<Arc<RoaringBitmap>>,
    /// Span blocks' operation rollups decoded (see [`crate::rollup`]), by chunk key.
    rollups: Bounded<Arc<crate::rollup::OpRollup>>,
    /// Span blocks' latency histograms decoded (see [`crate::heat`]), by chunk key.
    heats: Bounded<Arc<crate::heat::BlockHeat>>,
    /// Which head batches are held decoded (the others are held encoded).
    decoded_heads: Arc<DecodedCache>,
    /// Span blocks' request rollups decoded (see [`crate::requests`]), by chunk key.
    request_rollups: Bounded<Arc<crate::requests::RequestRollup>>,
    /// Split traces' request values, resolved over the current blocks.
    resolved: request::ResolvedSplits,
    pub stats: StoreStats,
    /// Full text over log records (see [`crate::text`]).
    text: crate::text::TextIndex,
    /// Windows whose text index is behind their blocks since a flush, with the documents of
    /// their new blocks while they are few enough to keep (see [`Store::index_pending`]).
    text_pending: Mutex<PendingText>,
    /// Each tenant's metric series (see [`metrics`]).
    series: metrics::Catalogs,
    /// Tests leave the text index behind the blocks here (a crash before its commit).
    #[cfg(test)]
    pub(crate) test_skip_text: AtomicBool,
    #[cfg(test)]
    test_write_hook: Mutex<Option<WriteHook>>,
    #[cfg(test)]
    test_flush_hook: Mutex<Option<FlushHook>>,
}

#[cfg(test)]
type FlushHook = Arc<dyn Fn(&TenantId) + Send + Sync>;

#[cfg(test)]
type WriteHook = Arc<dyn Fn(usize) -> Result<()> + Send + Sync>;

/// Column-chunk footers kept in memory (a few KiB each).
const FOOTER_CACHE_ENTRIES: usize = 16_384;
/// Bytes of column chunks kept in memory.
pub const CHUNK_CACHE_BYTES: usize = 128 << 20;
/// Encoded bytes of the postings kept decoded in memory.
pub const POSTINGS_CACHE_BYTES: usize = 64 << 20;
/// Bytes of decoded metric points (see [`metrics::DecodedPoints`]) kept in memory.
pub const METRIC_POINTS_CACHE_BYTES: usize = 64 << 20;
/// Blocks whose trace runs are kept in memory (20 bytes a trace).
const TRACE_RUNS_CACHE_ENTRIES: usize = 4_096;
/// Bytes of term runs (see [`TermRuns`]) kept in memory.
const TERM_RUNS_CACHE_BYTES: usize = 32 << 20;
/// Bytes of matching rows (see [`Store::rows_matching`]) kept in memory.
pub const MATCHES_CACHE_BYTES: usize = 32 << 20;

/// What an append did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AppendOutcome {
    pub stored: usize,
    pub duplicates: usize,
}

fn trace_prefix(key: &[u8]) -> &[u8] {
    keys::trace_id_prefix_len(key).map_or(key, |n| &key[..n])
}

fn in_trace_domain(key: &[u8]) -> bool {
    keys::trace_id_prefix_len(key).is_some()
}

impl Store {
    pub fn open(path: impl AsRef<Path>, opts: StoreOptions) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let decoded_head_bytes = opts.decoded_head_bytes;
        std::fs::create_dir_all(&path)?;
        let mut db_opts = Options::default();
        db_opts.create_if_missing(true);
        db_opts.create_missing_column_families(true);
        db_opts.set_max_background_jobs(2);
        db_opts.set_bytes_per_sync(1 << 20);
        db_opts.enable_statistics();
        let cache = Cache::new_lru_cache(opts.cache_bytes);
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&cache);
        table.set_bloom_filter(10.0, false);
        table.set_cache_index_and_filter_blocks(true);
        let mut data = Options::default();
        data.set_block_based_table_factory(&table);
        data.set_prefix_extractor(SliceTransform::create(
            "weft.trace_id.v2",
            trace_prefix,
            Some(in_trace_domain),
        ));
        data.set_memtable_prefix_bloom_ratio(0.05);
        let mut head = Options::default();
        head.set_write_buffer_size(64 << 20);
        // a head batch is deleted once its block is written; files that are mostly such
        // deletions are compacted away by RocksDB on its own, with the batches they delete
        head.add_compact_on_deletion_collector_factory(64, 32, 0.5);
        let cfs = vec![
            ColumnFamilyDescriptor::new(CF_DATA, data),
            ColumnFamilyDescriptor::new(CF_META, Options::default()),
            ColumnFamilyDescriptor::new(CF_HEAD, head),
        ];
        let db = DB::open_cf_descriptors(&db_opts, &path, cfs)?;
        let mut sync = WriteOptions::default();
        sync.set_sync(true);
        let text = crate::text::TextIndex::open(path.join("text"))?;
        let disk = crate::disk::DiskGuard::new(path.clone(), opts.min_free_disk);
        let store = Self {
            db,
            path,
            opts,
            state: Mutex::new(State::default()),
            flush_lock: Mutex::new(()),
            maintenance: Mutex::new(()),
            sync,
            closed: AtomicBool::new(false),
            opened: Instant::now(),
            idle_flushed: AtomicBool::new(true),
            footers: Bounded::new(FOOTER_CACHE_ENTRIES),
            disk,
            chunks: Bounded::new(CHUNK_CACHE_BYTES),
            postings: Bounded::new(POSTINGS_CACHE_BYTES),
            trace_runs: Bounded::new(TRACE_RUNS_CACHE_ENTRIES),
            term_runs: Bounded::new(TERM_RUNS_CACHE_BYTES),
            minority_rows: Bounded::new(TERM_RUNS_CACHE_BYTES),
            series_runs: Bounded::new(TRACE_RUNS_CACHE_ENTRIES),
            metric_points: Bounded::new(METRIC_POINTS_CACHE_BYTES),
            matches: Bounded::new(MATCHES_CACHE_BYTES),
            rollups: Bounded::new(rollup::ROLLUP_CACHE_BYTES),
            heats: Bounded::new(heat::HEAT_CACHE_BYTES),
            decoded_heads: Arc::new(DecodedCache::new(decoded_head_bytes)),
            request_rollups: Bounded::new(requests::REQUESTS_CACHE_BYTES),
            resolved: Default::default(),
            stats: StoreStats::default(),
            text,
            text_pending: Default::default(),
            series: Default::default(),
            #[cfg(test)]
            test_skip_text: AtomicBool::new(false),
            #[cfg(test)]
            test_write_hook: Mutex::new(None),
            #[cfg(test)]
            test_flush_hook: Mutex::new(None),
        };
        store.recover()?;
        store.sync_all_text()?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn options(&self) -> &StoreOptions {
        &self.opts
    }

    fn cf(&self, name: &str) -> &ColumnFamily {
        self.db
            .cf_handle(name)
            .expect("column family opened at start")
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checks the store's format version, writing it when the store is new. A store of
    /// another key layout is refused (there is no migration from the layout before signals).
    fn check_format(&self) -> Result<()> {
        let meta = self.cf(CF_META);
        match self.db.get_cf(meta, keys::FORMAT)? {
            Some(v) => match v.first() {
                Some(&found) if found == keys::KEY_VERSION => Ok(()),
                found => Err(StorageError::UnsupportedVersion {
                    what: "store key layout",
                    found: found.copied().unwrap_or(0),
                    supported: keys::KEY_VERSION,
                }),
            },
            None => {
                let empty = [CF_META, CF_HEAD, CF_DATA].iter().all(|cf| {
                    self.db
                        .iterator_cf(self.cf(cf), IteratorMode::Start)
                        .next()
                        .is_none()
                });
                if !empty {
                    return Err(StorageError::UnsupportedVersion {
                        what: "store key layout (a store written before signals)",
                        found: 1,
                        supported: keys::KEY_VERSION,
                    });
                }
                Ok(self
                    .db
                    .put_cf_opt(meta, keys::FORMAT, [keys::KEY_VERSION], &self.sync)?)
            }
        }
    }

    /// Loads block metas and replays the write-ahead heads.
    fn recover(&self) -> Result<()> {
        self.check_format()?;
        let mut state = self.lock();
        let mut graves = Vec::new();
        for item in self.db.iterator_cf(self.cf(CF_META), IteratorMode::Start) {
            let (key, value) = item?;
            if *key == *keys::FORMAT {
                continue;
            }
            let parts = keys::split(&key)
                .ok_or_else(|| StorageError::corrupt("meta key", hex::encode(&key)))?;
            if parts.kind == keys::SPLIT {
                let trace = <[u8; 16]>::try_from(parts.rest)
                    .map_err(|_| StorageError::corrupt("split key", hex::encode(&key)))?;
                let tenant = TenantId::new(parts.tenant)?;
                Arc::make_mut(state.splits.entry(tenant).or_default()).insert(TraceId(trace));
                continue;
            }
            if parts.kind == keys::SERIES {
                let id = <[u8; 4]>::try_from(parts.rest)
                    .map_err(|_| StorageError::corrupt("series key", hex::encode(&key)))?;
                let series = crate::codec::decode_series(&value)?;
                self.series.load(
                    TenantId::new(parts.tenant)?,
                    u32::from_be_bytes(id),
                    series,
                    self.opts.clock.now().0,
                )?;
                continue;
            }
            let addr = keys::read_addr(parts.rest)
                .ok_or_else(|| StorageError::corrupt("meta key", hex::encode(&key)))?;
            let tenant = TenantId::new(parts.tenant)?;
            state.next_block = state.next_block.max(addr.block + 1);
            if parts.kind == keys::GRAVE {
                graves.push((tenant, parts.signal, addr));
                continue;
            }
            let meta = match unseal(&value)
                .map_err(|e| e.to_owned())
                .and_then(|v| BlockMeta::decode(v).map_err(|e| e.to_string()))
                .map_err(|e| {
                    let e = format!("{e}; start with --skip-corrupt-blocks to serve without it");
                    seal::damaged(&tenant, parts.signal, addr, "block meta", e)
                }) {
                Ok(meta) => Arc::new(meta),
                Err(e) if self.opts.skip_corrupt_blocks => {
                    tracing::error!(error = %e, "block left out (--skip-corrupt-blocks)");
                    self.stats.corrupt_skipped.fetch_add(1, Ordering::Relaxed);
                    Self::note_damaged_meta(&mut state, &tenant, parts.signal, addr, &e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            match parts.signal {
                Signal::Spans => SpanRecord::insert_block(&mut state, tenant, addr, meta),
                Signal::Logs => LogRecord::insert_block(&mut state, tenant, addr, meta),
                Signal::Metrics => MetricPoint::insert_block(&mut state, tenant, addr, meta),
            }
        }
        let now = Instant::now();
        for item in self.db.iterator_cf(self.cf(CF_HEAD), IteratorMode::Start) {
            let (key, value) = item?;
            let parts = keys::split(&key)
                .ok_or_else(|| StorageError::corrupt("head key", hex::encode(&key)))?;
            let seq = keys::read_u64(parts.rest)
                .ok_or_else(|| StorageError::corrupt("head key", hex::encode(&key)))?;
            let tenant = TenantId::new(parts.tenant)?;
            let value = match unseal(&value) {
                Ok(v) => v,
                Err(e) => {
                    let e = StorageError::corrupt(
                        "head record",
                        format!(
                            "{} record {seq} of tenant {tenant}: {e}; start with --skip-corrupt-blocks to leave it out (its rows are lost)",
                            parts.signal.name()
                        ),
                    );
                    if !self.opts.skip_corrupt_blocks {
                        return Err(e);
                    }
                    tracing::error!(error = %e, "head record left out (--skip-corrupt-blocks)");
                    self.stats.corrupt_skipped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            };
            match parts.signal {
                Signal::Spans => {
                    SpanRecord::replay(&mut state, &self.decoded_heads, tenant, &key, value, now)?
                }
                Signal::Logs => {
                    LogRecord::replay(&mut state, &self.decoded_heads, tenant, &key, value, now)?
                }
                Signal::Metrics => {
                    MetricPoint::replay(&mut state, &self.decoded_heads, tenant, &key, value, now)?
                }
            }
            state.next_seq = state.next_seq.max(seq + 1);
        }
        let due = now.checked_sub(self.opts.flush_age).unwrap_or(now);
        let replayed = SpanRecord::after_replay(&mut state, due)
            + LogRecord::after_replay(&mut state, due)
            + MetricPoint::after_replay(&mut state, due);
        let blocks = self.block_count_in(&state);
        drop(state);
        if !graves.is_empty() {
            // blocks merged or expired before the process stopped, their data not yet deleted
            self.delete_blocks(&graves)?;
        }
        tracing::info!(
            replayed_rows = replayed,
            blocks,
            graves = graves.len(),
            "store recovered"
        );
        Ok(())
    }

    /// Makes spans durable and visible; returns once they are synced to the write-ahead log.
    /// Spans already durable (a client's retry) are skipped and counted as duplicates; spans
    /// that another request is writing right now are waited for, so that the answer is given
    /// only once every span of the request is durable, whichever request wrote it.
    pub fn append(&self, tenant: &TenantId, spans: Vec<SpanRecord>) -> Result<AppendOutcome> {
        self.append_rows(tenant, spans, |_| {})
    }

    /// [`Self::append`], handing `written` each batch of spans this call made durable (not
    /// those another request wrote, nor duplicates): what is derived from spans at ingest
    /// counts each span once, however often a client sends it.
    pub fn append_observed(
        &self,
        tenant: &TenantId,
        spans: Vec<SpanRecord>,
        written: impl FnMut(&[SpanRecord]),
    ) -> Result<AppendOutcome> {
        self.append_rows(tenant, spans, written)
    }

    /// [`Self::append`] for log records (a record equal in every field to one already held,
    /// at the same nanosecond, is a retry and is stored once).
    pub fn append_logs(&self, tenant: &TenantId, logs: Vec<LogRecord>) -> Result<AppendOutcome> {
        self.append_rows(tenant, logs, |_| {})
    }

    fn append_rows<R: Lane>(
        &self,
        tenant: &TenantId,
        rows: Vec<R>,
        mut written: impl FnMut(&[R]),
    ) -> Result<AppendOutcome> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StorageError::ShuttingDown);
        }
        let total = rows.len();
        let mut stored = 0;
        let mut rows = rows;
        loop {
            let reserved = self.reserve(tenant, rows)?;
            stored += reserved.fresh.len();
            if !reserved.fresh.is_empty() {
                let durable =
                    self.write_ahead(tenant, reserved.seq, reserved.fresh, reserved.fresh_ids)?;
                written(&durable);
            }
            // a write that failed left its rows unreserved: this request writes them
            rows = reserved
                .waits
                .into_iter()
                .filter(|(write, _)| !write.wait())
                .flat_map(|(_, rows)| rows)
                .collect();
            if rows.is_empty() {
                break;
            }
        }
        let outcome = AppendOutcome {
            stored,
            duplicates: total - stored,
        };
        self.stats
            .rows_deduplicated
            .fetch_add(outcome.duplicates as u64, Ordering::Relaxed);
        Ok(outcome)
    }

    /// Sorts a request's rows into new (reserved for this request's write), being written by
    /// another request, and durable already; refuses when the tenant's head is full.
    fn reserve<R: Lane>(&self, tenant: &TenantId, rows: Vec<R>) -> Result<Reserved<R>> {
        if let Err(e) = self.disk.check() {
            self.stats.refused_disk_full.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        let total = rows.len();
        let stored = R::stored_ids(self, tenant, &rows)?;
        let mut state = self.lock();
        let max = self.opts.max_tenants;
        if max > 0 && !state.knows(tenant) && state.tenant_count() >= max {
            self.stats.refused_tenants.fetch_add(1, Ordering::Relaxed);
            return Err(StorageError::TooManyTenants { max });
        }
        // before the tenant's entry is made: a refused write leaves nothing behind
        let (held, max_held) = (state.head_bytes(), self.opts.max_head_bytes);
        if max_held > 0 && held >= max_held {
            self.stats.appends_refused.fetch_add(1, Ordering::Relaxed);
            self.stats
                .refused_head_budget
                .fetch_add(1, Ordering::Relaxed);
            return Err(StorageError::HeadsFull {
                bytes: held,
                max: max_held,
            });
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        let t = R::lanes_mut(&mut state).entry(tenant.clone()).or_default();
        let pending = t.admitted_rows();
        if pending + total > self.opts.max_pending_rows && pending > 0 {
            self.stats.appends_refused.fetch_add(1, Ordering::Relaxed);
            return Err(StorageError::Overloaded {
                pending_rows: pending,
                retry_after_ms: 1000,
            });
        }
        let mine = Arc::new(InFlight::default());
        let mut reserved = Reserved {
            fresh: Vec::with_capacity(total),
            fresh_ids: Vec::with_capacity(total),
            waits: Vec::new(),
            seq,
        };
        for row in rows {
            let id = row.id();
            if stored.contains(&id) || t.is_known(&id) {
                continue;
            }
            match t.in_flight.entry(id) {
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(mine.clone());
                    reserved.fresh.push(row);
                    reserved.fresh_ids.push(id);
                }
                // twice in this request: its first copy is written with the rest
                std::collections::hash_map::Entry::Occupied(w) if Arc::ptr_eq(w.get(), &mine) => {}
                std::collections::hash_map::Entry::Occupied(w) => {
                    let write = w.get();
                    match reserved
                        .waits
                        .iter_mut()
                        .find(|(x, _)| Arc::ptr_eq(x, write))
                    {
                        Some((_, rows)) => rows.push(row),
                        None => reserved.waits.push((write.clone(), vec![row])),
                    }
                }
            }
        }
        Ok(reserved)
    }

    /// Writes reserved rows to the write-ahead head (synced), then makes them visible and
    /// releases their reservation, waking the requests that wait for them.
    fn write_ahead<R: Lane>(
        &self,
        tenant: &TenantId,
        seq: u64,
        fresh: Vec<R>,
        ids: Vec<R::Id>,
    ) -> Result<Arc<Vec<R>>> {
        let key = keys::head(tenant, R::SIGNAL, seq);
        let started = Instant::now();
        let encoded = R::encode_rows(&fresh);
        let payload = encoded.len();
        let value = seal(encoded);
        let decoded = decoded_bytes(&fresh);
        let bytes = budgeted_bytes(decoded, fresh.len());
        let written = self.write_hook(fresh.len()).and_then(|()| {
            Ok(self
                .db
                .put_cf_opt(self.cf(CF_HEAD), &key, &value, &self.sync)?)
        });
        let written = written.map_err(|e| match e {
            StorageError::RocksDb(e) if crate::disk::is_out_of_space(&e) => {
                self.stats.refused_disk_full.fetch_add(1, Ordering::Relaxed);
                StorageError::DiskFull {
                    free: self.disk.free_bytes(),
                    min_free: self.opts.min_free_disk,
                }
            }
            e => e,
        });
        self.stats.wal_writes.fetch_add(1, Ordering::Relaxed);
        self.stats
            .wal_nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let durable = written.is_ok();
        let fresh = Arc::new(fresh);
        // made before the lock: keeping the rows decoded may drop older batches' rows
        let batch = durable.then(|| {
            HeadBatch::new(
                fresh.clone(),
                Some(&value[..payload]),
                decoded,
                &self.decoded_heads,
            )
        });
        let mut state = self.lock();
        let t = R::lanes_mut(&mut state).entry(tenant.clone()).or_default();
        let mut write = None;
        for id in ids {
            if durable {
                t.head.seen.insert(id);
            }
            write = t.in_flight.remove(&id).or(write);
        }
        if let Some(batch) = batch {
            self.stats
                .rows_appended
                .fetch_add(fresh.len() as u64, Ordering::Relaxed);
            self.stats
                .last_append_ms
                .store(self.opened.elapsed().as_millis() as u64, Ordering::Relaxed);
            self.idle_flushed.store(false, Ordering::Release);
            t.head.push(key, batch, &fresh, Instant::now(), bytes);
        }
        drop(state);
        if let Some(write) = write {
            write.finish(durable);
        }
        written.map(|()| fresh)
    }

    #[cfg(not(test))]
    fn write_hook(&self, _: usize) -> Result<()> {
        Ok(())
    }

    /// Tests make a write-ahead write wait or fail here.
    #[cfg(test)]
    fn write_hook(&self, rows: usize) -> Result<()> {
        let hook = self.test_write_hook.lock().unwrap().clone();
        hook.map_or(Ok(()), |h| h(rows))
    }

    /// Identities of the given spans that blocks already hold (a retry of a batch that was
    /// flushed since). The trace-id index's prefix bloom filter makes this nearly free for
    /// traces never seen before; for known traces only the span-id pages of their rows are read.
    fn stored_span_ids(
        &self,
        tenant: &TenantId,
        spans: &[SpanRecord],
    ) -> Result<rustc_hash::FxHashSet<(TraceId, SpanId)>> {
        // each trace's span start times: a stored copy of a span lies within its block's
        // entry of the trace, so an entry no start falls in is not read (spans of a trace
        // arriving over several requests, as SDKs send them, are new, not retries)
        let mut traces: rustc_hash::FxHashMap<TraceId, Vec<u64>> = Default::default();
        for s in spans {
            traces.entry(s.trace_id).or_default().push(s.start.0);
        }
        let mut out = rustc_hash::FxHashSet::default();
        let blocks = {
            let state = self.lock();
            match state.spans.get(tenant) {
                Some(t) if !t.blocks.is_empty() => t.blocks.clone(),
                _ => return Ok(out),
            }
        };
        for (trace, starts) in traces {
            for (addr, entry) in self.trace_locations(tenant, &trace)? {
                let Some(meta) = blocks.get(&addr) else {
                    continue;
                };
                if !starts
                    .iter()
                    .any(|s| (entry.min_start..=entry.max_end).contains(s))
                {
                    continue;
                }
                let reader = self.block_reader(tenant, addr, meta);
                let ids = reader.span_ids(&Rows::Range(entry.row_start, entry.rows))?;
                out.extend(ids.into_iter().map(|id| (trace, id)));
            }
        }
        Ok(out)
    }

    /// Whether any tenant's head (of any signal) is due for a flush.
    pub fn flush_due(&self) -> bool {
        let state = self.lock();
        self.heads_pressed(&state)
            || state.spans.values().any(|t| self.head_due(&t.head))
            || state.logs.values().any(|t| self.head_due(&t.head))
            || state.metrics.values().any(|t| self.head_due(&t.head))
    }

    /// Whether the heads hold half of `max_head_bytes`: every head is then due.
    fn heads_pressed(&self, state: &State) -> bool {
        let max = self.opts.max_head_bytes;
        max > 0 && state.head_bytes() * 2 >= max
    }

    fn head_due<R: Row>(&self, head: &Head<R>) -> bool {
        head.rows >= self.opts.flush_rows
            || head
                .since
                .is_some_and(|s| s.elapsed() >= self.opts.flush_age)
    }

    /// Turns due heads (all non-empty heads when `force`) of every signal into blocks.
    pub fn flush(&self, force: bool) -> Result<usize> {
        let _one_at_a_time = self.flush_lock.lock().unwrap_or_else(|e| e.into_inner());
        let spans = self.flush_signal::<SpanRecord>(force);
        let logs = self.flush_signal::<LogRecord>(force);
        let metrics = self.flush_signal::<MetricPoint>(force);
        Ok(spans? + logs? + metrics?)
    }

    /// Flushes the due heads of one signal.
    fn flush_signal<R: Lane>(&self, force: bool) -> Result<usize> {
        let frozen: Vec<(TenantId, Arc<Head<R>>)> = {
            let mut state = self.lock();
            let pressed = self.heads_pressed(&state);
            R::lanes_mut(&mut state)
                .iter_mut()
                .filter(|(_, t)| !t.head.is_empty() && (force || pressed || self.head_due(&t.head)))
                .map(|(tenant, t)| {
                    let head = Arc::new(std::mem::take(&mut t.head));
                    t.frozen = Some(head.clone());
                    (tenant.clone(), head)
                })
                .collect()
        };
        let mut blocks = 0;
        let mut first_error = None;
        let mut texts = Vec::new();
        // every frozen head is either turned into blocks or put back in front of its tenant's
        // head, whatever happens to another tenant's flush (an error or a panic)
        for (tenant, head) in frozen {
            let result = catch_unwind(AssertUnwindSafe(|| self.flush_head(&tenant, &head, force)))
                .unwrap_or_else(|panic| {
                    Err(StorageError::Panicked {
                        what: format!("flush of tenant {tenant}"),
                        message: crate::background::panic_message(&panic),
                    })
                });
            let mut state = self.lock();
            let t = R::lanes_mut(&mut state).entry(tenant.clone()).or_default();
            match result {
                Ok(Flushed {
                    written,
                    kept,
                    text,
                }) => {
                    blocks += written.len();
                    texts.push((tenant.clone(), text));
                    if let Some(kept) = kept {
                        t.head.seen.extend(kept.rows.iter().map(Row::id));
                        let rows = Arc::new(kept.rows);
                        let decoded = decoded_bytes(&rows);
                        let bytes = budgeted_bytes(decoded, rows.len());
                        // rarely over the decoded budget: encoded again then
                        let batch =
                            HeadBatch::new(rows.clone(), None, decoded, &self.decoded_heads);
                        t.head
                            .push(kept.wal_key, batch, &rows, Instant::now(), bytes);
                        for (trace, n) in kept.waited {
                            let w = t.head.waited.entry(trace).or_default();
                            *w = (*w).max(n);
                        }
                    }
                    let now = Instant::now();
                    t.last_write
                        .retain(|_, at| at.elapsed() < 2 * self.opts.merge_idle);
                    for (addr, _) in &written {
                        t.last_write.insert(addr.window, now);
                    }
                    Arc::make_mut(&mut t.blocks).extend(written);
                    t.frozen = None;
                    // the frozen head's identities become `recent`: moved, not copied, once
                    // nothing else holds the head (readers hold its batches, not the head)
                    t.recent = match Arc::try_unwrap(head) {
                        Ok(head) => head.seen,
                        Err(head) => head.seen.clone(),
                    };
                    t.recent_at = Some(now);
                    // the first head flushed after open held every replayed row
                    t.replayed = 0;
                    t.replayed_bytes = 0;
                }
                Err(e) => {
                    tracing::error!(tenant = %tenant, signal = R::SIGNAL.name(), error = %e, rows = head.rows, "flush failed; the rows stay in the write-ahead head");
                    t.unfreeze(&head);
                    first_error.get_or_insert(e);
                }
            }
        }
        // the new blocks are visible: their text follows, from the index task (so that a
        // flush never waits on the index's merges; readers match the records of blocks the
        // index does not hold yet), at once when forced (a close, or a caller that wants
        // everything settled)
        self.queue_text(texts);
        if force {
            self.index_pending();
        }
        first_error.map_or(Ok(blocks), Err)
    }

    /// Brings a window's text index up to the tenant's log blocks in it (documents of new
    /// blocks taken from `fresh` when there, else read back from the blocks). Failures are logged
    /// and counted, never returned: RocksDB is the source of truth and readers fall back on
    /// matching records for blocks the index does not hold.
    pub(crate) fn sync_text(
        &self,
        tenant: &TenantId,
        window: u64,
        fresh: &mut HashMap<u64, Vec<tantivy::TantivyDocument>>,
    ) {
        #[cfg(test)]
        if self.test_skip_text.load(Ordering::SeqCst) {
            return;
        }
        let blocks: BTreeMap<u64, (BlockAddr, Arc<BlockMeta>)> = {
            let state = self.lock();
            state
                .logs
                .get(tenant)
                .map(|t| {
                    t.blocks
                        .iter()
                        .filter(|(a, _)| a.window == window)
                        .map(|(a, m)| (a.block, (*a, m.clone())))
                        .collect()
                })
                .unwrap_or_default()
        };
        let ids: std::collections::BTreeSet<u64> = blocks.keys().copied().collect();
        let fields = self.text.fields();
        let result = self.text.sync(tenant, window, &ids, |b| {
            if let Some(docs) = fresh.remove(&b) {
                return Ok(docs);
            }
            let (addr, meta) = &blocks[&b];
            let rows = crate::block::logs::read(
                &self.reader_of(tenant, Signal::Logs, *addr, meta),
                &Rows::All,
            )?;
            Ok(rows
                .iter()
                .enumerate()
                .map(|(i, l)| fields.doc(l, b, i as u32))
                .collect())
        });
        if let Err(e) = result {
            self.stats.text_index_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(tenant = %tenant, window, error = %e, "text index update failed");
        }
    }

    /// Hands the documents of newly flushed log blocks to the index task ([`PendingText`]).
    fn queue_text(&self, texts: Vec<(TenantId, TextDocs)>) {
        if texts.is_empty() {
            return;
        }
        let mut pending = self.text_pending.lock().unwrap_or_else(|e| e.into_inner());
        for (tenant, text) in texts {
            for (window, docs) in text {
                pending.docs += docs.values().map(Vec::len).sum::<usize>();
                pending
                    .windows
                    .entry((tenant.clone(), window))
                    .or_default()
                    .extend(docs);
            }
        }
        if pending.docs > PENDING_TEXT_DOCS {
            // kept no more: the task reads those blocks back
            pending.windows.values_mut().for_each(HashMap::clear);
            pending.docs = 0;
        }
    }

    /// Brings the text index of every window flushed since the last call up to its blocks (a
    /// failure is counted and mended by the next update of the window, or at open); whether
    /// there was any.
    pub fn index_pending(&self) -> bool {
        let windows = {
            let mut pending = self.text_pending.lock().unwrap_or_else(|e| e.into_inner());
            pending.docs = 0;
            std::mem::take(&mut pending.windows)
        };
        let any = !windows.is_empty();
        for ((tenant, window), mut docs) in windows {
            self.sync_text(&tenant, window, &mut docs);
        }
        any
    }

    /// The index task's backlog: windows behind their blocks, documents kept for them.
    pub fn text_backlog(&self) -> (usize, usize) {
        let pending = self.text_pending.lock().unwrap_or_else(|e| e.into_inner());
        (pending.windows.len(), pending.docs)
    }

    /// Brings every window's text index up to its log blocks (at open: a crash may have
    /// come between a block's commit and its index's).
    pub(crate) fn sync_all_text(&self) -> Result<()> {
        let mut windows: std::collections::BTreeSet<(TenantId, u64)> =
            self.text.on_disk()?.into_iter().collect();
        {
            let state = self.lock();
            for (tenant, t) in &state.logs {
                windows.extend(t.blocks.keys().map(|a| (tenant.clone(), a.window)));
            }
        }
        for (tenant, window) in windows {
            self.sync_text(&tenant, window, &mut HashMap::new());
        }
        Ok(())
    }

    /// Rebuilds every text index of a stopped store from its log blocks; returns how many
    /// windows it indexed.
    pub fn rebuild_text(path: impl AsRef<Path>, opts: StoreOptions) -> Result<usize> {
        let text = path.as_ref().join("text");
        if text.exists() {
            std::fs::remove_dir_all(&text)?;
        }
        let store = Self::open(path, opts)?;
        let windows = store.text.on_disk()?.len();
        store.close()?;
        Ok(windows)
    }

    /// What a window's text index answers now, for a reader (`None`: no index).
    pub fn text_view(
        &self,
        tenant: &TenantId,
        window: u64,
    ) -> Result<Option<crate::text::WindowView>> {
        self.text.view(tenant, window)
    }

    /// The text index's schema fields, to build queries.
    pub fn text_fields(&self) -> &crate::text::TextFields {
        self.text.fields()
    }

    /// Turns a frozen head into blocks, except the traces kept back to wait for a parent
    /// (not when `force`d), which are written again to the write-ahead in the same batch.
    fn flush_head<R: Lane>(
        &self,
        tenant: &TenantId,
        head: &Head<R>,
        force: bool,
    ) -> Result<Flushed<R>> {
        #[cfg(test)]
        {
            let hook = self.test_flush_hook.lock().unwrap().clone();
            if let Some(hook) = hook {
                hook(tenant);
            }
        }
        let started = Instant::now();
        let decoded = head.decoded()?;
        let window_ns = self.opts.window.as_nanos().max(1) as u64;
        let waiting = if force || self.opts.parent_wait_flushes == 0 {
            Default::default()
        } else {
            let splits = self.lock().splits.get(tenant).cloned().unwrap_or_default();
            R::waiting_for_parent(head, &decoded, &splits, self.opts.parent_wait_flushes)
        };
        let mut kept_rows = Vec::new();
        let mut by_window: BTreeMap<u64, Vec<&R>> = BTreeMap::new();
        for row in decoded.iter().flat_map(|b| b.iter()) {
            if !waiting.is_empty() && row.trace_id().is_some_and(|t| waiting.contains(&t)) {
                kept_rows.push(row.clone());
                continue;
            }
            let window = row.time().0 / window_ns * window_ns;
            by_window.entry(window).or_default().push(row);
        }
        let mut batch = WriteBatch::default();
        let mut written = Vec::new();
        let mut rows = 0u64;
        let mut splits = request::SplitNotes::default();
        let mut text: TextDocs = BTreeMap::new();
        for (window, in_window) in by_window {
            for part in R::split(in_window, self.opts.flush_rows) {
                let addr = BlockAddr {
                    window,
                    block: self.next_block_id(),
                };
                rows += part.len() as u64;
                if let Some(docs) = R::text_docs(self.text.fields(), &part, addr.block) {
                    text.entry(window).or_default().insert(addr.block, docs);
                }
                let built = R::build_block(part, self.opts.compression)?;
                self.note_splits(tenant, R::SIGNAL, &built, &mut splits, true)?;
                self.stage_block(&mut batch, tenant, R::SIGNAL, addr, &built)?;
                self.stats
                    .block_bytes_written
                    .fetch_add(built.meta.total_bytes(), Ordering::Relaxed);
                written.push((addr, Arc::new(built.meta)));
            }
        }
        for key in &head.wal_keys {
            batch.delete_cf(self.cf(CF_HEAD), key);
        }
        let kept = (!kept_rows.is_empty()).then(|| {
            let seq = {
                let mut state = self.lock();
                state.next_seq += 1;
                state.next_seq - 1
            };
            let wal_key = keys::head(tenant, R::SIGNAL, seq);
            batch.put_cf(self.cf(CF_HEAD), &wal_key, seal(R::encode_rows(&kept_rows)));
            self.stats
                .rows_waiting
                .fetch_add(kept_rows.len() as u64, Ordering::Relaxed);
            Kept {
                wal_key,
                rows: kept_rows,
                waited: waiting
                    .into_iter()
                    .map(|t| (t, head.waited.get(&t).copied().unwrap_or(0) + 1))
                    .collect(),
            }
        });
        let splits = self.stage_splits(&mut batch, tenant, splits);
        self.db.write_opt(batch, &self.sync)?;
        self.remember_splits(tenant, splits);
        self.stats.flushes.fetch_add(1, Ordering::Relaxed);
        self.stats
            .blocks_written
            .fetch_add(written.len() as u64, Ordering::Relaxed);
        self.stats.rows_flushed.fetch_add(rows, Ordering::Relaxed);
        self.stats
            .flush_nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        tracing::debug!(tenant = %tenant, signal = R::SIGNAL.name(), blocks = written.len(), rows, kept = kept.as_ref().map_or(0, |k| k.rows.len()), "head flushed");
        Ok(Flushed {
            written,
            kept,
            text,
        })
    }

    fn next_block_id(&self) -> u64 {
        let mut state = self.lock();
        state.next_block += 1;
        state.next_block - 1
    }

    fn stage_block(
        &self,
        batch: &mut WriteBatch,
        tenant: &TenantId,
        signal: Signal,
        addr: BlockAddr,
        built: &crate::block::BuiltBlock,
    ) -> Result<()> {
        let data = self.cf(CF_DATA);
        for (column, bytes) in &built.chunks {
            batch.put_cf(
                data,
                keys::chunk(tenant, signal, addr, column),
                seal(bytes.to_vec()),
            );
        }
        for (dim, bytes) in &built.postings {
            batch.put_cf(
                data,
                keys::postings(tenant, signal, addr, dim),
                seal(bytes.to_vec()),
            );
        }
        batch.put_cf(
            data,
            keys::block_key(tenant, signal, keys::TRACES, addr),
            seal(encode_traces(&built.traces, self.opts.compression)),
        );
        for entry in &built.traces {
            let key = keys::trace_id(tenant, signal, &entry.trace_id, addr);
            // one entry: compression would not pay, and a flush writes one per trace
            let summary = encode_traces(std::slice::from_ref(entry), Compression::None);
            batch.put_cf(data, key, seal(summary));
        }
        batch.put_cf(
            self.cf(CF_META),
            keys::block_key(tenant, signal, keys::META, addr),
            seal(built.meta.encode()),
        );
        Ok(())
    }

    /// Every stored span of a trace (head and blocks), each once, ordered by start time.
    pub fn trace(&self, tenant: &TenantId, trace: &TraceId) -> Result<Vec<SpanRecord>> {
        Ok(self.trace_limited(tenant, trace, 0)?.0)
    }

    /// The earliest `max` spans of a trace (0: every span), each once, ordered by start time,
    /// and, when the trace has more, how many spans the trace-id index counts for it. The work
    /// is bounded too: a block's rows of a trace are in start order, so no more than `max` of
    /// them are decoded per block.
    pub fn trace_limited(
        &self,
        tenant: &TenantId,
        trace: &TraceId,
        max: usize,
    ) -> Result<(Vec<SpanRecord>, Option<usize>)> {
        let (spans, blocks) = {
            let state = self.lock();
            let Some(t) = state.spans.get(tenant) else {
                return Ok((Vec::new(), None));
            };
            let mut at = t.head.trace(trace);
            if let Some(f) = &t.frozen {
                at.extend(f.trace(trace));
            }
            (at, t.blocks.clone())
        };
        let mut spans = crate::head::rows_at(&spans)?;
        let mut located = self.trace_locations(tenant, trace)?;
        located.retain(|(addr, _)| blocks.contains_key(addr));
        let indexed = spans.len() + located.iter().map(|(_, e)| e.rows as usize).sum::<usize>();
        let bounded = max > 0 && indexed > max;
        let mut skipped = false;
        for (addr, entry) in located {
            let rows = if bounded {
                entry.rows.min(max as u32)
            } else {
                entry.rows
            };
            skipped |= rows < entry.rows;
            let reader = self.block_reader(tenant, addr, &blocks[&addr]);
            spans.extend(reader.spans(&Rows::Range(entry.row_start, rows), true)?);
        }
        let cutoff = self.cutoff(tenant, SPANS).unwrap_or_default();
        let mut seen = HashSet::new();
        spans.retain(|s| s.start >= cutoff && seen.insert(s.span_id));
        spans.sort_by_key(|s| (s.start, s.span_id));
        if bounded && (skipped || spans.len() > max) {
            spans.truncate(max);
            return Ok((spans, Some(indexed)));
        }
        Ok((spans, None))
    }

    /// Where a trace's rows are: one entry per block of the snapshot, from the trace-id index
    /// (a prefix bloom filter answers "not here" without reading data).
    pub fn trace_locations_in(
        &self,
        tenant: &TenantId,
        snapshot: &Snapshot,
        trace: &TraceId,
    ) -> Result<Vec<(BlockAddr, TraceEntry)>> {
        let mut found = self.trace_locations(tenant, trace)?;
        found.retain(|(addr, _)| snapshot.blocks.contains_key(addr));
        Ok(found)
    }

    /// Every trace-id index entry of a trace, including those of a block whose flush is
    /// committing right now; readers want [`Self::trace_locations_in`].
    fn trace_locations(
        &self,
        tenant: &TenantId,
        trace: &TraceId,
    ) -> Result<Vec<(BlockAddr, TraceEntry)>> {
        self.trace_locations_of(tenant, SPANS, trace)
    }

    /// [`Self::trace_locations`] in the blocks of any signal that indexes trace ids.
    fn trace_locations_of(
        &self,
        tenant: &TenantId,
        signal: Signal,
        trace: &TraceId,
    ) -> Result<Vec<(BlockAddr, TraceEntry)>> {
        let prefix = keys::trace_id_prefix(tenant, signal, trace);
        let mut out = Vec::new();
        for item in self.db.prefix_iterator_cf(self.cf(CF_DATA), &prefix) {
            let (key, value) = item?;
            if !key.starts_with(&prefix) {
                break;
            }
            let addr = keys::read_addr(&key[prefix.len()..])
                .ok_or_else(|| StorageError::corrupt("trace-id key", hex::encode(&key)))?;
            let value = unseal(&value)
                .map_err(|e| self.damaged(tenant, signal, addr, "trace-id entry", e))?;
            let mut entries = decode_traces(value)?;
            let entry = entries
                .pop()
                .ok_or_else(|| StorageError::corrupt("trace-id entry", "empty"))?;
            out.push((addr, entry));
        }
        Ok(out)
    }

    /// The blocks of a tenant, oldest first.
    pub fn blocks(&self, tenant: &TenantId) -> Vec<(BlockAddr, Arc<BlockMeta>)> {
        let cutoff = self.cutoff(tenant, SPANS).map_or(0, |c| c.0);
        let state = self.lock();
        state
            .spans
            .get(tenant)
            .into_iter()
            .flat_map(|t| t.blocks.iter())
            .filter(|(_, m)| m.max_start >= cutoff)
            .map(|(a, m)| (*a, m.clone()))
            .collect()
    }

    /// The span blocks and the unflushed spans (head and the head being flushed) of a
    /// tenant, as of one instant. Queries that read both go through one snapshot, so no row
    /// shows twice.
    pub fn snapshot(&self, tenant: &TenantId) -> Result<Snapshot> {
        self.snapshot_of(tenant)
    }

    /// [`Self::snapshot`] of a tenant's log records.
    pub fn log_snapshot(&self, tenant: &TenantId) -> Result<Snapshot<LogRecord>> {
        self.snapshot_of(tenant)
    }

    fn snapshot_of<R: Lane>(&self, tenant: &TenantId) -> Result<Snapshot<R>> {
        let cutoff = self.cutoff(tenant, R::SIGNAL);
        let (blocks, head, head_min, splits) = {
            let state = self.lock();
            let Some(t) = R::lanes(&state).get(tenant) else {
                return Ok(Snapshot {
                    cutoff,
                    ..Default::default()
                });
            };
            let splits = match R::SIGNAL {
                Signal::Spans => state.splits.get(tenant).cloned().unwrap_or_default(),
                _ => Default::default(),
            };
            let mut batches = t.head.batches.clone();
            let mut head_min = t.head.min_start;
            if let Some(f) = &t.frozen {
                batches.extend(f.batches.iter().cloned());
                head_min = head_min.min(f.min_start);
            }
            (t.blocks.clone(), batches, head_min, splits)
        };
        // decoded outside the lock
        let mut head = HeadSnapshot {
            batches: head.iter().map(|b| b.rows()).collect::<Result<Vec<_>>>()?,
        };
        let Some(c) = cutoff else {
            return Ok(Snapshot {
                blocks,
                head,
                cutoff,
                splits,
            });
        };
        let blocks = if blocks.values().any(|m| m.max_start < c.0) {
            Arc::new(
                blocks
                    .iter()
                    .filter(|(_, m)| m.max_start >= c.0)
                    .map(|(a, m)| (*a, m.clone()))
                    .collect(),
            )
        } else {
            blocks
        };
        if head_min < c.0 {
            head.batches = head
                .batches
                .into_iter()
                .map(|b| Arc::new(b.iter().filter(|r| r.time() >= c).cloned().collect()))
                .collect();
        }
        Ok(Snapshot {
            blocks,
            head,
            cutoff,
            splits,
        })
    }

    /// The oldest start time a read of a tenant's signal may return now; `None` when the
    /// tenant keeps everything.
    pub fn cutoff(&self, tenant: &TenantId, signal: Signal) -> Option<UnixNanos> {
        self.opts
            .retention
            .cutoff(tenant, signal, self.opts.clock.now())
    }

    /// The rows of a block that a snapshot may return: `None` when all of them (the block does
    /// not straddle the retention cutoff), else those starting at or after it.
    pub fn live_rows(
        &self,
        tenant: &TenantId,
        snapshot: &Snapshot,
        addr: BlockAddr,
        meta: &BlockMeta,
    ) -> Result<Option<RoaringBitmap>> {
        let Some(cutoff) = snapshot.cutoff.filter(|_| snapshot.straddles(meta)) else {
            return Ok(None);
        };
        let starts = self
            .block_reader(tenant, addr, meta)
            .ints(crate::block::writer::col::START, &Rows::All)?;
        Ok(Some(
            (0..meta.rows)
                .zip(starts.iter())
                .filter(|(_, s)| **s as u64 >= cutoff.0)
                .map(|(r, _)| r)
                .collect(),
        ))
    }

    /// A reader of one span block.
    pub(crate) fn block_reader<'m>(
        &'m self,
        tenant: &TenantId,
        addr: BlockAddr,
        meta: &'m BlockMeta,
    ) -> BlockReader<'m, ChunkFetcher<'m>> {
        self.reader_of(tenant, SPANS, addr, meta)
    }

    /// A reader of one block of any signal.
    pub(crate) fn reader_of<'m>(
        &'m self,
        tenant: &TenantId,
        signal: Signal,
        addr: BlockAddr,
        meta: &'m BlockMeta,
    ) -> BlockReader<'m, ChunkFetcher<'m>> {
        BlockReader::new(
            meta,
            ChunkFetcher {
                store: self,
                tenant: tenant.clone(),
                signal,
                addr,
            },
        )
    }

    /// The per-trace summaries of a block.
    pub fn block_traces(&self, tenant: &TenantId, addr: BlockAddr) -> Result<Vec<TraceEntry>> {
        self.block_traces_in(tenant, SPANS, addr)
    }

    fn block_traces_in(
        &self,
        tenant: &TenantId,
        signal: Signal,
        addr: BlockAddr,
    ) -> Result<Vec<TraceEntry>> {
        let key = keys::block_key(tenant, signal, keys::TRACES, addr);
        let damaged = |e: String| self.damaged(tenant, signal, addr, "trace summaries", e);
        match self
            .db
            .get_pinned_cf(self.cf(CF_DATA), key)
            .map_err(|e| read_error(e, damaged))?
        {
            Some(v) => decode_traces(unseal(&v).map_err(damaged)?),
            None => Err(damaged("missing".into())),
        }
    }

    /// Rows of a block whose `dim` equals `term` (see [`crate::schema`] for the dimensions;
    /// prefix a dedicated dimension with `trace:` for every row of the traces having it).
    pub fn postings(
        &self,
        tenant: &TenantId,
        addr: BlockAddr,
        dim: &str,
        term: &str,
    ) -> Result<RoaringBitmap> {
        Ok(self
            .dimension_shared(tenant, addr, dim)?
            .iter()
            .find(|(t, _)| t == term)
            .map(|(_, rows)| rows.clone())
            .unwrap_or_default())
    }

    /// Every term of one dimension of a block with its rows.
    pub fn dimension(
        &self,
        tenant: &TenantId,
        addr: BlockAddr,
        dim: &str,
    ) -> Result<Vec<(String, RoaringBitmap)>> {
        Ok(self.dimension_shared(tenant, addr, dim)?.as_ref().clone())
    }

    /// [`Self::dimension`], decoded once and kept (postings of immutable blocks never change;
    /// the cache holds at most [`POSTINGS_CACHE_BYTES`] of decoded postings, as serialised).
    pub fn dimension_shared(
        &self,
        tenant: &TenantId,
        addr: BlockAddr,
        dim: &str,
    ) -> Result<Arc<Vec<(String, RoaringBitmap)>>> {
        self.dimension_in(tenant, SPANS, addr, dim)
    }

    /// [`Self::dimension_shared`] of a block of any signal.
    pub fn dimension_in(
        &self,
        tenant: &TenantId,
        signal: Signal,
        addr: BlockAddr,
        dim: &str,
    ) -> Result<Arc<Vec<(String, RoaringBitmap)>>> {
        let key = keys::postings(tenant, signal, addr, dim);
        if let Some(d) = self.postings.get(&key) {
            return Ok(d);
        }
        let damaged = |e: String| self.damaged(tenant, signal, addr, format!("postings {dim}"), e);
        let (bytes, decoded) = match self
            .db
            .get_pinned_cf(self.cf(CF_DATA), &key)
            .map_err(|e| read_error(e, damaged))?
        {
            Some(v) => {
                let terms = decode_postings(unseal(&v).map_err(damaged)?)?;
                // what the decoded bitmaps hold, not the stored value (compressed)
                let held = terms
                    .iter()
                    .map(|(term, rows)| term.len() + rows.serialized_size())
                    .sum();
                (held, Arc::new(terms))
            }
            None => (0, Arc::new(Vec::new())),
        };
        self.postings.insert(key, bytes, decoded.clone());
        Ok(decoded)
    }

    /// Rows of a block that hold, for every dimension of `filter`, one of its terms: its
    /// postings, intersected smallest first. Kept per block and filter, as a repeated query (a
    /// dashboard's refresh) asks the same of the same immutable blocks; a new block is looked
    /// up once. The query-condition cache of other column stores, on postings instead of
    /// granules. Exact for every block: one written before span kind was indexed answers kind
    /// from its column.
    pub fn rows_matching(
        &self,
        tenant: &TenantId,
        addr: BlockAddr,
        meta: &BlockMeta,
        filter: &TermFilter,
    ) -> Result<Arc<RoaringBitmap>> {
        let mut key = keys::postings(tenant, SPANS, addr, "");
        key.extend_from_slice(filter.text());
        if let Some(found) = self.matches.get(&key) {
            return Ok(found);
        }
        let mut postings = Vec::with_capacity(filter.dims().len());
        for (dim, _) in filter.dims() {
            let mut p = self.dimension_shared(tenant, addr, dim)?;
            if p.is_empty() && dim == crate::schema::DIM_KIND {
                p = Arc::new(self.kind_postings(tenant, addr, meta)?);
            }
            postings.push(p);
        }
        let sets = filter
            .dims()
            .iter()
            .zip(&postings)
            .map(|((_, terms), postings)| terms::rows_with_any(postings, terms))
            .collect();
        let found = Arc::new(terms::intersect(sets, meta.rows));
        let weight = key.len() + found.serialized_size() + 64;
        self.matches.insert(key, weight, found.clone());
        Ok(found)
    }

    /// The span-kind postings of a block written before span kind was indexed, built from
    /// its kind column.
    fn kind_postings(
        &self,
        tenant: &TenantId,
        addr: BlockAddr,
        meta: &BlockMeta,
    ) -> Result<Vec<(String, RoaringBitmap)>> {
        let codes = self
            .block_reader(tenant, addr, meta)
            .ints(crate::block::writer::col::KIND, &Rows::All)?;
        let mut by_kind: BTreeMap<&'static str, RoaringBitmap> = BTreeMap::new();
        for (row, &code) in codes.iter().enumerate() {
            let kind = crate::model::SpanKind::from_u8(code as u8).as_str();
            by_kind.entry(kind).or_default().insert(row as u32);
        }
        Ok(by_kind
            .into_iter()
            .map(|(k, rows)| (k.to_owned(), rows))
            .collect())
    }

    /// Compacts every column family (after a bulk load, before measuring size).
    pub fn compact(&self) {
        for cf in [CF_DATA, CF_META, CF_HEAD] {
            self.db
                .compact_range_cf(self.cf(cf), None::<&[u8]>, None::<&[u8]>);
        }
    }

    /// A database-wide RocksDB integer property (such as the shared block cache's usage),
    /// read once rather than summed over column families.
    pub fn rocksdb_db_property(&self, name: &str) -> u64 {
        self.db.property_int_value(name).ok().flatten().unwrap_or(0)
    }

    /// A per-column-family RocksDB integer property summed over the column families.
    pub fn rocksdb_property(&self, name: &str) -> u64 {
        [CF_DATA, CF_META, CF_HEAD]
            .iter()
            .filter_map(|cf| {
                self.db
                    .property_int_value_cf(self.cf(cf), name)
                    .ok()
                    .flatten()
            })
            .sum()
    }

    /// Once writes have stopped for `after` and every head is in blocks, flushes RocksDB's
    /// memtables, so that its write-ahead files (which hold every batch since the last memtable
    /// flush) are released and the data directory holds the data, not a second copy of it.
    /// Returns whether it flushed.
    pub fn release_idle(&self, after: Duration) -> Result<bool> {
        let last = self.stats.last_append_ms.load(Ordering::Relaxed);
        let idle = self.opened.elapsed().as_millis() as u64 >= last + after.as_millis() as u64;
        if !idle || self.idle_flushed.load(Ordering::Acquire) || self.pending_rows() > 0 {
            return Ok(false);
        }
        self.flush_memtables()?;
        // unless an append came in meanwhile (it cleared the flag and must be flushed too)
        if self.stats.last_append_ms.load(Ordering::Relaxed) == last {
            self.idle_flushed.store(true, Ordering::Release);
        }
        Ok(true)
    }

    /// Drops the last flushed head's row identities of every tenant whose head has stayed empty
    /// for `keep` since that flush (a retry that late is no longer "just after a flush");
    /// whether any went.
    pub fn release_recent(&self, keep: Duration) -> bool {
        fn lane<R: Row>(lanes: &mut HashMap<TenantId, TenantState<R>>, keep: Duration) -> bool {
            let mut any = false;
            for t in lanes.values_mut() {
                if t.head.is_empty()
                    && t.frozen.is_none()
                    && t.recent_at.is_some_and(|at| at.elapsed() >= keep)
                {
                    t.recent = Default::default();
                    t.recent_at = None;
                    any = true;
                }
            }
            any
        }
        let mut state = self.lock();
        let spans = lane(&mut state.spans, keep);
        let logs = lane(&mut state.logs, keep);
        lane(&mut state.metrics, keep) || spans || logs
    }

    /// Flushes every column family's memtable: RocksDB keeps a write-ahead file until all of
    /// them are flushed (`DB::flush` alone flushes only the default one).
    fn flush_memtables(&self) -> Result<()> {
        for cf in [CF_DATA, CF_META, CF_HEAD] {
            self.db.flush_cf(self.cf(cf))?;
        }
        Ok(())
    }

    /// Rows of every signal not yet in blocks.
    pub fn pending_rows(&self) -> usize {
        let state = self.lock();
        let spans: usize = state.spans.values().map(TenantState::pending_rows).sum();
        spans
            + state
                .logs
                .values()
                .map(TenantState::pending_rows)
                .sum::<usize>()
    }

    /// Bytes of head rows kept decoded (see [`DecodedCache`]).
    pub fn decoded_head_bytes(&self) -> usize {
        self.decoded_heads.held()
    }

    /// Bytes the heads of every tenant and signal count against the head budget (their rows
    /// as decoded, and their indexes), replayed rows included.
    pub fn head_bytes(&self) -> usize {
        fn sum<R: Row>(lanes: &HashMap<TenantId, TenantState<R>>) -> usize {
            lanes
                .values()
                .map(|t| t.head.bytes + t.frozen.as_ref().map_or(0, |f| f.bytes))
                .sum()
        }
        let state = self.lock();
        sum(&state.spans) + sum(&state.logs) + sum(&state.metrics)
    }

    /// Blocks of every signal.
    pub fn block_count(&self) -> usize {
        self.block_count_in(&self.lock())
    }

    fn block_count_in(&self, state: &State) -> usize {
        let spans: usize = state.spans.values().map(|t| t.blocks.len()).sum();
        spans
            + state.logs.values().map(|t| t.blocks.len()).sum::<usize>()
            + state
                .metrics
                .values()
                .map(|t| t.blocks.len())
                .sum::<usize>()
    }

    /// Stops accepting appends and flushes everything held in memory.
    pub fn close(&self) -> Result<()> {
        self.closed.store(true, Ordering::Release);
        self.flush(true)?;
        // the data directory after a clean stop should hold the data, not its write-ahead copy
        self.flush_memtables()?;
        // the head is empty now, but its files still hold every batch written since the last
        // compaction (a put flushed before its delete): compacting it drops them all
        self.db
            .compact_range_cf(self.cf(CF_HEAD), None::<&[u8]>, None::<&[u8]>);
        Ok(())
    }
}

/// A signal's place in the store's state, and what its rows need of the store. Private: the
/// public API names each signal's rows.
trait Lane: Row {
    fn lanes(state: &State) -> &HashMap<TenantId, TenantState<Self>>;
    fn lanes_mut(state: &mut State) -> &mut HashMap<TenantId, TenantState<Self>>;
    /// Identities of `rows` that blocks already hold (a retry of a batch flushed since the
    /// last flush but one); a signal without a row index answers from the heads alone.
    fn stored_ids(
        _store: &Store,
        _tenant: &TenantId,
        _rows: &[Self],
    ) -> Result<rustc_hash::FxHashSet<Self::Id>> {
        Ok(Default::default())
    }

    /// The text documents of a new block's rows (`None`: a signal without full text).
    fn text_docs(
        _fields: &crate::text::TextFields,
        _rows: &[&Self],
        _block: u64,
    ) -> Option<Vec<tantivy::TantivyDocument>> {
        None
    }

    /// Traces of a head that a flush keeps back, waiting for the parent of one of their rows
    /// (none for a signal without parent links).
    fn waiting_for_parent(
        _head: &Head<Self>,
        _rows: &[Arc<Vec<Self>>],
        _splits: &HashSet<TraceId>,
        _max_waits: u8,
    ) -> rustc_hash::FxHashSet<TraceId> {
        Default::default()
    }

    fn insert_block(state: &mut State, tenant: TenantId, addr: BlockAddr, meta: Arc<BlockMeta>) {
        let t = Self::lanes_mut(state).entry(tenant).or_default();
        Arc::make_mut(&mut t.blocks).insert(addr, meta);
    }

    fn replay(
        state: &mut State,
        cache: &Arc<DecodedCache>,
        tenant: TenantId,
        key: &[u8],
        value: &[u8],
        now: Instant,
    ) -> Result<()> {
        let rows = Arc::new(Self::decode_rows(value)?);
        let t = Self::lanes_mut(state).entry(tenant).or_default();
        t.head.seen.extend(rows.iter().map(Row::id));
        let decoded = decoded_bytes(&rows);
        let batch = HeadBatch::new(rows.clone(), Some(value), decoded, cache);
        let bytes = budgeted_bytes(decoded, rows.len());
        t.head.push(key.to_vec(), batch, &rows, now, bytes);
        Ok(())
    }

    /// Marks replayed rows as such and due at once; returns how many there are.
    fn after_replay(state: &mut State, due: Instant) -> usize {
        let mut total = 0;
        for t in Self::lanes_mut(state).values_mut() {
            t.replayed = t.head.rows;
            t.replayed_bytes = t.head.bytes;
            if t.replayed > 0 {
                t.head.since = Some(due);
            }
            total += t.replayed;
        }
        total
    }
}

impl Lane for SpanRecord {
    fn lanes(state: &State) -> &HashMap<TenantId, TenantState<Self>> {
        &state.spans
    }
    fn lanes_mut(state: &mut State) -> &mut HashMap<TenantId, TenantState<Self>> {
        &mut state.spans
    }
    fn stored_ids(
        store: &Store,
        tenant: &TenantId,
        rows: &[Self],
    ) -> Result<rustc_hash::FxHashSet<Self::Id>> {
        store.stored_span_ids(tenant, rows)
    }
    /// A trace waits while a span's parent is missing from the head (its request values are
    /// not known yet) and not flagged remote, unless it already waited `max_waits` flushes or already has rows in
    /// two blocks (waiting would not make it whole).
    fn waiting_for_parent(
        head: &Head<Self>,
        batches: &[Arc<Vec<Self>>],
        splits: &HashSet<TraceId>,
        max_waits: u8,
    ) -> rustc_hash::FxHashSet<TraceId> {
        let mut out = rustc_hash::FxHashSet::default();
        let mut ids = rustc_hash::FxHashSet::default();
        for (trace, rows) in &head.by_trace {
            if head.waited.get(trace).is_some_and(|&n| n >= max_waits) || splits.contains(trace) {
                continue;
            }
            let row = |&(b, i): &(u32, u32)| &batches[b as usize][i as usize];
            ids.clear();
            ids.extend(rows.iter().map(|r| row(r).span_id));
            // a parent the span says is remote (W3C flags: is-remote known and set) is in
            // another process, whose exporter may send it much later or never
            if rows.iter().any(|r| {
                let r = row(r);
                r.flags & REMOTE_PARENT != REMOTE_PARENT
                    && r.parent_span_id.is_some_and(|p| !ids.contains(&p))
            }) {
                out.insert(*trace);
            }
        }
        out
    }
}

impl Lane for LogRecord {
    fn lanes(state: &State) -> &HashMap<TenantId, TenantState<Self>> {
        &state.logs
    }
    /// In block row order: the block sorts its rows as [`crate::block::logs::sort`] does.
    fn text_docs(
        fields: &crate::text::TextFields,
        rows: &[&Self],
        block: u64,
    ) -> Option<Vec<tantivy::TantivyDocument>> {
        let mut sorted = rows.to_vec();
        crate::block::logs::sort(&mut sorted);
        Some(
            sorted
                .iter()
                .enumerate()
                .map(|(i, l)| fields.doc(l, block, i as u32))
                .collect(),
        )
    }
    fn lanes_mut(state: &mut State) -> &mut HashMap<TenantId, TenantState<Self>> {
        &mut state.logs
    }
}

impl Lane for MetricPoint {
    fn lanes(state: &State) -> &HashMap<TenantId, TenantState<Self>> {
        &state.metrics
    }
    fn lanes_mut(state: &mut State) -> &mut HashMap<TenantId, TenantState<Self>> {
        &mut state.metrics
    }
}

/// What rows take in a head: their own memory and their places in its indexes (the identity
/// set and the trace index, at their load factors), and in the write-ahead column family's
/// memtable until RocksDB flushes it.
/// What the decoded rows of a batch take in memory.
fn decoded_bytes<R: Row>(rows: &[R]) -> usize {
    rows.iter().map(Row::heap_bytes).sum()
}

/// What the head budget counts for a batch of `rows` rows whose decoded rows take `decoded`
/// bytes: the rows decoded (a flush decodes them all, whatever the head holds meanwhile) and
/// their share of the head's indexes (trace positions, identities).
fn budgeted_bytes(decoded: usize, rows: usize) -> usize {
    const INDEXED: usize = 160;
    decoded + rows * INDEXED
}

/// A RocksDB read error, named for the block part it was reading when RocksDB found its own
/// checksums wrong.
fn read_error(e: rocksdb::Error, damaged: impl FnOnce(String) -> StorageError) -> StorageError {
    if e.kind() == rocksdb::ErrorKind::Corruption {
        damaged(e.to_string())
    } else {
        e.into()
    }
}

/// Reads column chunks of one block from RocksDB.
pub struct ChunkFetcher<'a> {
    store: &'a Store,
    tenant: TenantId,
    signal: Signal,
    addr: BlockAddr,
}

impl ChunkSource for ChunkFetcher<'_> {
    fn metadata(&self, column: &str) -> Option<ArrowReaderMetadata> {
        self.store
            .footers
            .get(&keys::chunk(&self.tenant, self.signal, self.addr, column))
    }

    fn remember(&self, column: &str, metadata: &ArrowReaderMetadata) {
        let key = keys::chunk(&self.tenant, self.signal, self.addr, column);
        self.store.footers.insert(key, 1, metadata.clone());
    }

    fn trace_runs(&self) -> Result<Option<Arc<TraceRuns>>> {
        let key = keys::block_key(&self.tenant, SPANS, keys::TRACES, self.addr);
        if let Some(runs) = self.store.trace_runs.get(&key) {
            return Ok(Some(runs));
        }
        let entries = self
            .store
            .block_traces_in(&self.tenant, self.signal, self.addr)?;
        let runs = Arc::new(TraceRuns::new(
            entries.iter().map(|t| (t.row_start, t.trace_id)).collect(),
        ));
        self.store.trace_runs.insert(key, 1, runs.clone());
        Ok(Some(runs))
    }

    fn postings(&self, dim: &str) -> Result<Option<Arc<Postings>>> {
        self.store
            .dimension_in(&self.tenant, self.signal, self.addr, dim)
            .map(Some)
    }

    fn term_runs(&self, dim: &str) -> Result<Option<Arc<TermRuns>>> {
        let key = keys::postings(&self.tenant, self.signal, self.addr, dim);
        if let Some(runs) = self.store.term_runs.get(&key) {
            return Ok(runs);
        }
        let postings = self
            .store
            .dimension_in(&self.tenant, self.signal, self.addr, dim)?;
        let runs = TermRuns::of(&postings).map(Arc::new);
        let weight = key.len() + runs.as_ref().map_or(64, |r| r.weight());
        self.store.term_runs.insert(key, weight, runs.clone());
        Ok(runs)
    }

    fn minority_rows(&self) -> Result<Option<Arc<MinorityRows>>> {
        let key = keys::chunk(
            &self.tenant,
            self.signal,
            self.addr,
            crate::block::writer::col::MINOR_ROWS,
        );
        if let Some(rows) = self.store.minority_rows.get(&key) {
            return Ok(Some(rows));
        }
        let Some(bytes) = self.chunk(crate::block::writer::col::MINOR_ROWS)? else {
            return Ok(None);
        };
        let rows = Arc::new(MinorityRows::of_chunk(&bytes)?);
        self.store
            .minority_rows
            .insert(key.clone(), key.len() + rows.weight(), rows.clone());
        Ok(Some(rows))
    }

    fn chunk(&self, column: &str) -> Result<Option<Bytes>> {
        let key = keys::chunk(&self.tenant, self.signal, self.addr, column);
        if let Some(bytes) = self.store.chunks.get(&key) {
            return Ok(Some(bytes));
        }
        let damaged = |e: String| {
            self.store.damaged(
                &self.tenant,
                self.signal,
                self.addr,
                format!("column {column}"),
                e,
            )
        };
        let Some(bytes) = self
            .store
            .db
            .get_cf(self.store.cf(CF_DATA), &key)
            .map_err(|e| read_error(e, damaged))?
            .map(Bytes::from)
        else {
            return Ok(None);
        };
        let len = unseal(&bytes).map_err(damaged)?.len();
        let bytes = bytes.slice(..len);
        // a chunk larger than an eighth of the cache would empty it too often
        if bytes.len() <= CHUNK_CACHE_BYTES / 8 {
            self.store.chunks.insert(key, bytes.len(), bytes.clone());
        }
        Ok(Some(bytes))
    }
}

mod check;
mod damage;
mod expire;
mod heat;
mod logs;
mod merge;
mod metrics;
mod request;
mod requests;
mod retire;
mod rollup;

pub use check::{CheckReport, check};
pub use damage::DamagedBlock;
pub use request::{ResolvedTraces, TraceRequests};
pub use requests::RequestTable;

pub use logs::{BodyTest, LogScan, TextHits};
pub use metrics::{MetricScan, SeriesCatalog};
#[cfg(test)]
mod tests;
