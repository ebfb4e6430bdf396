//! Traces split over blocks, and request dimensions resolved over a whole trace.
//!
//! A block resolves the request dimensions of its rows over the rows of the same trace it
//! holds (see [`crate::request`]). When a trace's rows are in more than one block (a flush cut
//! through it, or a child came before its parent and the parent in a later flush), rows of one
//! block may need an ancestor in another. Every flush and merge notes such traces: a trace
//! in two of the blocks it writes, or in a block it writes and in one already stored (the
//! trace-id index, behind its prefix bloom filter, answers that per trace). They are kept as
//! split keys in the meta column family and in memory, handed to readers with each snapshot,
//! so that a reader resolves open rows again over the whole trace only for split traces.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use rocksdb::WriteBatch;

use super::{CF_META, Snapshot, Store};
use crate::block::reader::Rows;
use crate::block::{BlockMeta, BuiltBlock};
use crate::error::Result;
use crate::keys::{self, BlockAddr, Signal};
use crate::model::{SpanId, SpanRecord, TenantId, TraceId, Value};
use crate::request;

/// What resolution needs of some rows: ids, parents and each request dimension's own value
/// (row-major, as indexes into `values`), interned so that a value held by many rows is one.
#[derive(Default)]
struct Links {
    ids: Vec<SpanId>,
    parents: Vec<Option<SpanId>>,
    own: Vec<Option<u32>>,
}

#[derive(Default)]
struct Interner {
    values: Vec<Value>,
    at: HashMap<(usize, String), u32>,
}

impl Interner {
    fn intern(
        &mut self,
        slot: usize,
        term: &str,
        value: impl FnOnce() -> Option<Value>,
    ) -> Option<u32> {
        if let Some(&i) = self.at.get(&(slot, term.to_owned())) {
            return Some(i);
        }
        let v = value()?;
        let i = self.values.len() as u32;
        self.values.push(v);
        self.at.insert((slot, term.to_owned()), i);
        Some(i)
    }
}

/// Reads [`Links`] of some rows of a block: the dimensions' own values from the block's
/// postings of each (which hold exactly the value its column keeps), so no attribute chunk is
/// decoded.
fn block_links(
    reader: &crate::block::BlockReader<'_, super::ChunkFetcher<'_>>,
    rows: &Rows,
    interner: &mut Interner,
) -> Result<Links> {
    use arrow::array::{Array, AsArray};
    let ids = reader.span_ids(rows)?;
    let parents = reader.parent_ids(rows)?;
    let d = request::request_dims().len();
    let mut own = vec![None; ids.len() * d];
    for (slot, &col) in request::request_dims().iter().enumerate() {
        let dim = &crate::schema::DEDICATED[col];
        let terms = reader.postings_terms(dim.name, rows, &arrow::datatypes::DataType::Utf8View)?;
        let terms = terms.as_string_view();
        for i in (0..terms.len()).filter(|&i| !terms.is_null(i)) {
            let term = terms.value(i);
            own[i * d + slot] = interner.intern(slot, term, || match dim.ty {
                crate::schema::ColumnType::Int => term.parse().ok().map(Value::Int),
                _ => Some(Value::Str(term.to_owned())),
            });
        }
    }
    Ok(Links { ids, parents, own })
}

/// Request values of the spans of some traces, resolved over all their rows: each span's
/// values (one per [`request::request_dims`] entry) as indexes into shared values.
#[derive(Debug, Default)]
pub struct TraceRequests {
    values: Vec<Value>,
    /// Looked up once per late row of every query that reads a request column: a fast hash,
    /// seeded per process (the ids are the clients').
    spans: HashMap<(TraceId, SpanId), u32, foldhash::fast::RandomState>,
    slots: Vec<Option<u32>>,
    dims: usize,
}

impl TraceRequests {
    /// A span's value of request dimension `slot`.
    pub fn get(&self, trace: &TraceId, span: &SpanId, slot: usize) -> Option<&Value> {
        self.value(self.row(trace, span)?, slot)
    }

    /// Where a span's values are, for [`Self::value`].
    pub fn row(&self, trace: &TraceId, span: &SpanId) -> Option<usize> {
        self.spans.get(&(*trace, *span)).map(|&r| r as usize)
    }

    /// The value of request dimension `slot` of the span at `row` (see [`Self::row`]).
    pub fn value(&self, row: usize, slot: usize) -> Option<&Value> {
        let v = (*self.slots.get(row * self.dims + slot)?)?;
        self.values.get(v as usize)
    }

    /// A span's values, one per request dimension.
    pub fn of(&self, trace: &TraceId, span: &SpanId) -> Option<Vec<Option<Value>>> {
        self.spans.get(&(*trace, *span))?;
        Some(
            (0..self.dims)
                .map(|s| self.get(trace, span, s).cloned())
                .collect(),
        )
    }

    pub fn traces(&self) -> impl Iterator<Item = TraceId> + '_ {
        self.spans.keys().map(|(t, _)| *t)
    }

    /// Bytes held, roughly (map entries, slots, values).
    fn weight(&self) -> usize {
        let values: usize = self
            .values
            .iter()
            .map(|v| {
                std::mem::size_of::<Value>()
                    + match v {
                        Value::Str(s) => s.len(),
                        _ => 0,
                    }
            })
            .sum();
        self.spans.capacity() * 48 + self.slots.capacity() * 8 + values
    }
}

/// Bytes of resolved split traces kept across queries (see [`ResolvedSplits`]).
const RESOLVED_CACHE_BYTES: usize = 32 << 20;

/// Split traces resolved over a tenant's blocks, kept across queries. Blocks never change
/// once written, so a trace with no rows in the head resolves the same way for as long as the
/// tenant's block set is the same; each tenant's entry holds the set it was resolved over
/// (its `Arc`, so a flush, merge or deletion makes a new set, never changes this one) and
/// serves only snapshots of that very set.
#[derive(Default)]
pub(super) struct ResolvedSplits(Mutex<ResolvedInner>);

#[derive(Default)]
struct ResolvedInner {
    weight: usize,
    tenants: HashMap<TenantId, Resolved>,
}

struct Resolved {
    blocks: Arc<BTreeMap<BlockAddr, Arc<BlockMeta>>>,
    traces: HashMap<TraceId, Arc<TraceRequests>, foldhash::fast::RandomState>,
    weight: usize,
}

impl ResolvedSplits {
    fn lock(&self) -> std::sync::MutexGuard<'_, ResolvedInner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops the entries of some tenants (their blocks are being deleted).
    pub(super) fn forget(&self, gone: impl Fn(&TenantId) -> bool) {
        let mut inner = self.lock();
        let mut dropped = 0;
        inner.tenants.retain(|t, r| {
            let kept = !gone(t);
            if !kept {
                dropped += r.weight;
            }
            kept
        });
        inner.weight -= dropped;
    }
}

/// Traces' resolutions, by trace (several traces may share one).
pub type ResolvedTraces = HashMap<TraceId, Arc<TraceRequests>, foldhash::fast::RandomState>;

/// The traces of the blocks one flush or merge writes, and those found split.
#[derive(Default)]
pub(super) struct SplitNotes {
    seen: HashSet<TraceId>,
    found: Vec<TraceId>,
}

impl Store {
    /// [`Self::resolve_traces`] of traces that have no rows in the snapshot's head (the
    /// caller's to know), kept across queries while the tenant's block set stays the same.
    pub fn resolve_stored_traces(
        &self,
        tenant: &TenantId,
        snapshot: &Snapshot,
        traces: &[TraceId],
    ) -> Result<ResolvedTraces> {
        let mut out = ResolvedTraces::default();
        let mut missing = Vec::new();
        {
            let cache = self.resolved.lock();
            let same = cache
                .tenants
                .get(tenant)
                .filter(|r| Arc::ptr_eq(&r.blocks, &snapshot.blocks));
            for t in traces {
                match same.and_then(|r| r.traces.get(t)) {
                    Some(hit) => {
                        out.insert(*t, hit.clone());
                    }
                    None => missing.push(*t),
                }
            }
        }
        if missing.is_empty() {
            return Ok(out);
        }
        let resolved = Arc::new(self.resolve_traces(tenant, snapshot, &missing, &[])?);
        for t in &missing {
            out.insert(*t, resolved.clone());
        }
        let weight = resolved.weight();
        if weight <= RESOLVED_CACHE_BYTES / 4 {
            let mut cache = self.resolved.lock();
            if cache.weight + weight > RESOLVED_CACHE_BYTES {
                cache.tenants.clear(); // crude but bounded
                cache.weight = 0;
            }
            let stale = cache
                .tenants
                .get(tenant)
                .is_some_and(|r| !Arc::ptr_eq(&r.blocks, &snapshot.blocks));
            if stale && let Some(old) = cache.tenants.remove(tenant) {
                cache.weight -= old.weight;
            }
            let entry = cache
                .tenants
                .entry(tenant.clone())
                .or_insert_with(|| Resolved {
                    blocks: snapshot.blocks.clone(),
                    traces: Default::default(),
                    weight: 0,
                });
            entry.weight += weight;
            for t in missing {
                entry.traces.insert(t, resolved.clone());
            }
            cache.weight += weight;
        }
        Ok(out)
    }

    /// Notes the traces of a span block about to be written; with `check_index`, also those
    /// that stored blocks already hold (a merge rewrites blocks whose splits are noted).
    pub(super) fn note_splits(
        &self,
        tenant: &TenantId,
        signal: Signal,
        built: &BuiltBlock,
        notes: &mut SplitNotes,
        check_index: bool,
    ) -> Result<()> {
        if signal != Signal::Spans {
            return Ok(());
        }
        for entry in &built.traces {
            let id = entry.trace_id;
            let split = !notes.seen.insert(id)
                || (check_index && !self.trace_locations(tenant, &id)?.is_empty());
            if split {
                notes.found.push(id);
            }
        }
        Ok(())
    }

    /// Stages the split keys of traces not known to be split yet; returns those traces, to
    /// be remembered once the batch is written.
    pub(super) fn stage_splits(
        &self,
        batch: &mut WriteBatch,
        tenant: &TenantId,
        notes: SplitNotes,
    ) -> Vec<TraceId> {
        let known = self.lock().splits.get(tenant).cloned().unwrap_or_default();
        let mut new: Vec<TraceId> = notes
            .found
            .into_iter()
            .filter(|t| !known.contains(t))
            .collect();
        new.sort_unstable();
        new.dedup();
        for trace in &new {
            batch.put_cf(
                self.cf(CF_META),
                keys::split_trace(tenant, Signal::Spans, trace),
                [],
            );
        }
        new
    }

    /// Makes written split keys visible to later snapshots.
    pub(super) fn remember_splits(&self, tenant: &TenantId, traces: Vec<TraceId>) {
        if traces.is_empty() {
            return;
        }
        let mut state = self.lock();
        let splits = state.splits.entry(tenant.clone()).or_default();
        Arc::make_mut(splits).extend(traces);
    }

    /// The request values of every span of the given traces, resolved over all of each
    /// trace's rows in the snapshot: its blocks (through the trace-id index) and `head`, the
    /// snapshot's head rows of those traces (the caller has them grouped by trace already).
    pub fn resolve_traces(
        &self,
        tenant: &TenantId,
        snapshot: &Snapshot,
        traces: &[TraceId],
        head: &[&SpanRecord],
    ) -> Result<TraceRequests> {
        let wanted: HashSet<TraceId> = traces.iter().copied().collect();
        let d = request::request_dims().len();
        let mut interner = Interner::default();
        let mut links: HashMap<TraceId, Links> = HashMap::new();
        for span in head {
            if wanted.contains(&span.trace_id) {
                let l = links.entry(span.trace_id).or_default();
                l.ids.push(span.span_id);
                l.parents.push(span.parent_span_id);
                for (slot, &col) in request::request_dims().iter().enumerate() {
                    let v = request::dedicated_value(span, col);
                    l.own.push(v.and_then(|v| {
                        let term = v.as_term()?;
                        interner.intern(slot, &term, || Some(v.clone()))
                    }));
                }
            }
        }
        // each block's rows of the wanted traces, read together
        let mut by_block: HashMap<crate::keys::BlockAddr, Vec<(TraceId, u32, u32)>> =
            HashMap::new();
        for trace in &wanted {
            for (addr, entry) in self.trace_locations_in(tenant, snapshot, trace)? {
                by_block
                    .entry(addr)
                    .or_default()
                    .push((*trace, entry.row_start, entry.rows));
            }
        }
        for (addr, mut runs) in by_block {
            let Some(meta) = snapshot.blocks.get(&addr) else {
                continue;
            };
            runs.sort_unstable_by_key(|r| r.1);
            let mut set = roaring::RoaringBitmap::new();
            for (_, start, n) in &runs {
                set.insert_range(*start..start + n);
            }
            let reader = self.block_reader(tenant, addr, meta);
            let read = block_links(&reader, &Rows::Set(set), &mut interner)?;
            let mut at = 0usize;
            for (trace, _, n) in runs {
                let n = n as usize;
                let l = links.entry(trace).or_default();
                l.ids.extend_from_slice(&read.ids[at..at + n]);
                l.parents.extend_from_slice(&read.parents[at..at + n]);
                l.own.extend_from_slice(&read.own[at * d..(at + n) * d]);
                at += n;
            }
        }
        let mut out = TraceRequests {
            dims: d,
            ..Default::default()
        };
        for (trace, mut l) in links {
            request::resolve_links(&l.ids, &l.parents, &mut l.own, d);
            let first = out.slots.len() / d.max(1);
            for (i, id) in l.ids.into_iter().enumerate() {
                out.spans.insert((trace, id), (first + i) as u32);
            }
            out.slots.extend(l.own);
        }
        out.values = interner.values;
        Ok(out)
    }
}
