//! The `"request.D"` columns of `spans`: each span's value of an indexed LLM dimension `D` on
//! itself or its nearest ancestor that has one (see `weft_storage::request`).
//!
//! A block answers them from its `request:D` postings, resolved over the rows of each trace it
//! holds. Rows whose ancestry leaves the block are resolved again over the whole trace when the
//! trace has rows elsewhere: in another block (the snapshot's split traces) or in the head. Head
//! rows are resolved per query over the head, and over the whole trace for those whose
//! ancestry leaves it. Blocks written before request postings existed are resolved whole.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::DataType;
use datafusion::error::Result;
use roaring::RoaringBitmap;
use rustc_hash::FxHashMap;
use weft_storage::Store;
use weft_storage::model::{SpanId, SpanRecord, TenantId, TraceId, Value};
use weft_storage::request::{OPEN_DIM, request_dims, resolve};
use weft_storage::requests::same_refs;
use weft_storage::scan::{BlockAddr, BlockMeta, Positions, Rows};
use weft_storage::store::Snapshot;
use weft_storage::store::{ResolvedTraces, TraceRequests};

use super::columns::{storage_err, typed_values, values_column};

/// The slot of dedicated column `i` among the request dimensions.
pub use weft_storage::scan::spans::request_slot as slot;

/// A span's request values, one per dimension.
type SharedValues = Arc<[Option<Value>]>;

/// What one query knows of its snapshot's head for the request columns, computed once when a
/// query first uses them.
#[derive(Debug, Default)]
pub struct HeadRequests {
    /// Every head span's request values (shared by the spans that inherit the same ones).
    values: FxHashMap<(TraceId, SpanId), SharedValues>,
    /// The traces with rows in the head, with those rows as (batch, row) of the snapshot's.
    traces: FxHashMap<TraceId, Vec<(u32, u32)>>,
    /// Each block's open rows of traces with rows elsewhere (see [`late_rows`]).
    late: Mutex<HashMap<BlockAddr, Arc<RoaringBitmap>>>,
    /// Each block's rows with a value of a request dimension (by postings dimension name).
    known: Mutex<HashMap<(BlockAddr, &'static str), Arc<RoaringBitmap>>>,
    /// Traces resolved whole for blocks' late rows, each once per query (a split trace's
    /// blocks all ask for it), each with the resolution that holds it.
    whole: Mutex<ResolvedTraces>,
}

impl HeadRequests {
    /// The request values of a head row.
    pub fn of(&self, r: &SpanRecord) -> Option<&[Option<Value>]> {
        self.values.get(&(r.trace_id, r.span_id)).map(|v| &v[..])
    }

    fn compute(store: &Store, tenant: &TenantId, snapshot: &Snapshot) -> Result<Self> {
        let mut by_trace: FxHashMap<TraceId, Vec<&SpanRecord>> = FxHashMap::default();
        let mut traces: FxHashMap<TraceId, Vec<(u32, u32)>> = FxHashMap::default();
        for (b, batch) in snapshot.head.batches.iter().enumerate() {
            for (i, r) in batch.iter().enumerate() {
                by_trace.entry(r.trace_id).or_default().push(r);
                traces
                    .entry(r.trace_id)
                    .or_default()
                    .push((b as u32, i as u32));
            }
        }
        let rows = snapshot.head.batches.iter().map(|b| b.len()).sum();
        let mut values = FxHashMap::with_capacity_and_hasher(rows, Default::default());
        let mut open = Vec::new();
        for (trace, spans) in &by_trace {
            let resolved = resolve(spans);
            if resolved.iter().any(|r| r.open) || snapshot.splits.contains(trace) {
                open.push(*trace);
                continue;
            }
            // the spans under one span with values share them: their values are the same
            // references, and are copied once
            let mut last: Option<(&[Option<&Value>], SharedValues)> = None;
            for (span, r) in spans.iter().zip(&resolved) {
                let shared = match &last {
                    Some((refs, v)) if same_refs(refs, &r.values) => v.clone(),
                    _ => {
                        let v: SharedValues = r.values.iter().map(|v| v.cloned()).collect();
                        last = Some((&r.values, v.clone()));
                        v
                    }
                };
                values.insert((*trace, span.span_id), shared);
            }
        }
        let head: Vec<&SpanRecord> = open.iter().flat_map(|t| by_trace[t].clone()).collect();
        let whole = store
            .resolve_traces(tenant, snapshot, &open, &head)
            .map_err(storage_err)?;
        for trace in &open {
            for span in &by_trace[trace] {
                if let Some(v) = whole.of(trace, &span.span_id) {
                    values.insert((*trace, span.span_id), v.into());
                }
            }
        }
        Ok(Self {
            values,
            traces,
            late: Default::default(),
            known: Default::default(),
            whole: Default::default(),
        })
    }

    /// The snapshot's head rows of some traces.
    fn head_rows<'s>(&self, snapshot: &'s Snapshot, traces: &[TraceId]) -> Vec<&'s SpanRecord> {
        traces
            .iter()
            .filter_map(|t| self.traces.get(t))
            .flatten()
            .map(|&(b, i)| &snapshot.head.batches[b as usize][i as usize])
            .collect()
    }

    /// The given traces resolved over all their rows, each resolved once per query.
    fn whole(
        &self,
        store: &Store,
        tenant: &TenantId,
        snapshot: &Snapshot,
        traces: &[TraceId],
    ) -> Result<ResolvedTraces> {
        let missing: Vec<TraceId> = {
            let known = self.whole.lock().unwrap_or_else(|e| e.into_inner());
            traces
                .iter()
                .filter(|t| !known.contains_key(t))
                .copied()
                .collect()
        };
        if !missing.is_empty() {
            // traces without head rows resolve over blocks alone: kept across queries
            let (in_head, stored): (Vec<TraceId>, Vec<TraceId>) = missing
                .into_iter()
                .partition(|t| self.traces.contains_key(t));
            let stored = store
                .resolve_stored_traces(tenant, snapshot, &stored)
                .map_err(storage_err)?;
            let with_head = if in_head.is_empty() {
                None
            } else {
                Some(Arc::new(
                    store
                        .resolve_traces(
                            tenant,
                            snapshot,
                            &in_head,
                            &self.head_rows(snapshot, &in_head),
                        )
                        .map_err(storage_err)?,
                ))
            };
            let mut known = self.whole.lock().unwrap_or_else(|e| e.into_inner());
            for (t, r) in stored {
                known.entry(t).or_insert(r);
            }
            if let Some(resolved) = with_head {
                for t in in_head {
                    known.entry(t).or_insert_with(|| resolved.clone());
                }
            }
        }
        let known = self.whole.lock().unwrap_or_else(|e| e.into_inner());
        Ok(traces
            .iter()
            .filter_map(|t| known.get(t).map(|s| (*t, s.clone())))
            .collect())
    }
}

/// The head's request values, computed at most once per query.
#[derive(Debug, Default)]
pub struct RequestCell(OnceLock<Arc<HeadRequests>>);

impl RequestCell {
    pub fn get(
        &self,
        store: &Store,
        tenant: &TenantId,
        snapshot: &Snapshot,
    ) -> Result<Arc<HeadRequests>> {
        if let Some(h) = self.0.get() {
            return Ok(h.clone());
        }
        let computed = Arc::new(HeadRequests::compute(store, tenant, snapshot)?);
        Ok(self.0.get_or_init(|| computed).clone())
    }
}

/// Rows of a block whose values of the request dimensions `dims` (postings dimension names,
/// `request:D`) its postings cannot give: open rows of traces with rows elsewhere that lack a
/// value of one of `dims` (a value found before the ancestry left the block is the nearest
/// ancestor's, final), or every row of a block written without request postings. Kept per
/// query and block: the scan's planning and each read of the block ask for them.
pub fn late_rows(
    store: &Store,
    tenant: &TenantId,
    snapshot: &Snapshot,
    head: &HeadRequests,
    addr: BlockAddr,
    meta: &BlockMeta,
    dims: &[&'static str],
) -> Result<RoaringBitmap> {
    let open = cached(&head.late, addr, || {
        find_late_rows(store, tenant, snapshot, head, addr, meta)
    })?;
    let mut late = open.as_ref().clone();
    if late.is_empty() {
        return Ok(late);
    }
    let mut all_known: Option<RoaringBitmap> = None;
    for &dim in dims {
        let known = known_rows(store, tenant, head, addr, dim)?;
        all_known = Some(match all_known {
            Some(k) => k & known.as_ref(),
            None => known.as_ref().clone(),
        });
    }
    if let Some(known) = all_known {
        late -= known;
    }
    Ok(late)
}

/// The rows of a block with some value of request dimension `dim` (its postings' union).
fn known_rows(
    store: &Store,
    tenant: &TenantId,
    head: &HeadRequests,
    addr: BlockAddr,
    dim: &'static str,
) -> Result<Arc<RoaringBitmap>> {
    cached(&head.known, (addr, dim), || {
        let postings = store
            .dimension_shared(tenant, addr, dim)
            .map_err(storage_err)?;
        let mut known = RoaringBitmap::new();
        for (_, rows) in postings.iter() {
            known |= rows;
        }
        Ok(known)
    })
}

/// A per-query cache's bitmap for `key`, computed on first use.
fn cached<K: std::hash::Hash + Eq>(
    cache: &Mutex<HashMap<K, Arc<RoaringBitmap>>>,
    key: K,
    compute: impl FnOnce() -> Result<RoaringBitmap>,
) -> Result<Arc<RoaringBitmap>> {
    if let Some(hit) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(hit.clone());
    }
    let computed = Arc::new(compute()?);
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, computed.clone());
    Ok(computed)
}

/// The postings dimension name of each request slot.
pub fn slot_dim(slot: usize) -> &'static str {
    weft_storage::request::request_dim_name(request_dims()[slot])
}

fn find_late_rows(
    store: &Store,
    tenant: &TenantId,
    snapshot: &Snapshot,
    head: &HeadRequests,
    addr: BlockAddr,
    meta: &BlockMeta,
) -> Result<RoaringBitmap> {
    let err = storage_err;
    let open = store
        .dimension_shared(tenant, addr, OPEN_DIM)
        .map_err(err)?;
    let Some((_, open)) = open.first() else {
        let mut all = RoaringBitmap::new();
        all.insert_range(0..meta.rows);
        return Ok(all);
    };
    if open.is_empty() || (snapshot.splits.is_empty() && head.traces.is_empty()) {
        return Ok(RoaringBitmap::new());
    }
    let reader = store.block_view(tenant, addr, meta);
    let Some(runs) = reader.trace_runs().map_err(err)? else {
        return Ok(open.clone());
    };
    let mut late = RoaringBitmap::new();
    for (i, (start, id)) in runs.starts.iter().zip(&runs.ids).enumerate() {
        if snapshot.splits.contains(id) || head.traces.contains_key(id) {
            let end = runs.starts.get(i + 1).copied().unwrap_or(meta.rows);
            late.insert_range(*start..end);
        }
    }
    Ok(late & open)
}

/// The request filters of a push-down as (request slot, terms).
pub fn slot_filters(p: &super::pushdown::Pushdown) -> Vec<(usize, Vec<String>)> {
    (0..request_dims().len())
        .filter_map(|slot| Some((slot, p.dims.get(slot_dim(slot))?.clone())))
        .collect()
}

/// The span and trace ids of some rows of a block, and their traces resolved whole (each
/// trace once per query, see [`HeadRequests::whole`]).
fn resolved_rows(
    store: &Store,
    tenant: &TenantId,
    snapshot: &Snapshot,
    head: &HeadRequests,
    (addr, meta): (BlockAddr, &BlockMeta),
    rows: &RoaringBitmap,
) -> Result<(Vec<SpanId>, Vec<TraceId>, ResolvedTraces)> {
    let reader = store.block_view(tenant, addr, meta);
    let picked = Rows::Set(rows.clone());
    let spans = reader.span_ids(&picked).map_err(storage_err)?;
    let traces = reader.trace_ids(&picked).map_err(storage_err)?;
    let unique: Vec<TraceId> = traces
        .iter()
        .copied()
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let whole = head.whole(store, tenant, snapshot, &unique)?;
    Ok((spans, traces, whole))
}

/// Those of `rows`, late rows of a block (see [`late_rows`]), whose request values resolved
/// over their whole trace pass every filter of `filters` (request slot, terms).
pub fn late_rows_passing(
    store: &Store,
    tenant: &TenantId,
    snapshot: &Snapshot,
    head: &HeadRequests,
    (addr, meta): (BlockAddr, &BlockMeta),
    rows: &RoaringBitmap,
    filters: &[(usize, Vec<String>)],
) -> Result<RoaringBitmap> {
    let (spans, traces, whole) = resolved_rows(store, tenant, snapshot, head, (addr, meta), rows)?;
    let mut passing = RoaringBitmap::new();
    for ((row, span), trace) in rows.iter().zip(&spans).zip(&traces) {
        let Some(t) = whole.get(trace) else { continue };
        let Some(at) = t.row(trace, span) else {
            continue;
        };
        let pass = filters.iter().all(|(slot, terms)| {
            t.value(at, *slot)
                .and_then(Value::as_term)
                .is_some_and(|v| terms.contains(&v))
        });
        if pass {
            passing.insert(row);
        }
    }
    Ok(passing)
}

/// The terms of request slots `slots` of some late rows of a block (see [`late_rows`]),
/// resolved over their whole trace: one vector per row of `rows` (ascending), one term per slot.
pub fn late_terms(
    store: &Store,
    tenant: &TenantId,
    snapshot: &Snapshot,
    head: &HeadRequests,
    (addr, meta): (BlockAddr, &BlockMeta),
    rows: &RoaringBitmap,
    slots: &[usize],
) -> Result<Vec<Vec<Option<String>>>> {
    let (spans, traces, whole) = resolved_rows(store, tenant, snapshot, head, (addr, meta), rows)?;
    Ok(spans
        .iter()
        .zip(&traces)
        .map(|(span, trace)| {
            let at = whole
                .get(trace)
                .and_then(|t| Some((t.as_ref(), t.row(trace, span)?)));
            slots
                .iter()
                .map(|&slot| {
                    at.and_then(|(t, row)| t.value(row, slot))
                        .and_then(Value::as_term)
                })
                .collect()
        })
        .collect())
}

/// Replaces the request columns' values of a block's late rows (see [`late_rows`]) by their
/// values resolved over the whole trace. `columns` are `(slot, array)` pairs aligned to `rows`.
#[allow(clippy::too_many_arguments)]
pub fn fix_block(
    store: &Store,
    tenant: &TenantId,
    snapshot: &Snapshot,
    head: &HeadRequests,
    addr: BlockAddr,
    meta: &BlockMeta,
    rows: &Rows,
    columns: &mut [(usize, &mut ArrayRef)],
) -> Result<()> {
    let dims: Vec<&'static str> = columns.iter().map(|(slot, _)| slot_dim(*slot)).collect();
    let late = late_rows(store, tenant, snapshot, head, addr, meta, &dims)?;
    let late = rows.intersect(&late);
    if late.is_empty() {
        return Ok(());
    }
    let (spans, traces, whole) = resolved_rows(store, tenant, snapshot, head, (addr, meta), &late)?;
    let positions = match rows {
        Rows::Set(set) => Some(Positions::of(set)),
        _ => None,
    };
    let position = |row: u32| -> usize {
        match (rows, &positions) {
            (Rows::Range(start, _), _) => (row - start) as usize,
            (_, Some(p)) => p.of_row(row),
            _ => row as usize,
        }
    };
    // each late row's place among its trace's resolved values, looked up once for every column
    let mut found: Vec<(usize, Option<(&TraceRequests, usize)>)> = late
        .iter()
        .zip(&spans)
        .zip(&traces)
        .map(|((row, span), trace)| {
            let at = whole
                .get(trace)
                .and_then(|t| Some((t.as_ref(), t.row(trace, span)?)));
            (position(row), at)
        })
        .collect();
    found.sort_unstable_by_key(|p| p.0);
    for (slot, array) in columns.iter_mut() {
        let patch: Vec<(usize, Option<&Value>)> = found
            .iter()
            .map(|(at, f)| (*at, f.and_then(|(t, row)| t.value(row, *slot))))
            .collect();
        **array = patched(array, &patch);
    }
    Ok(())
}

/// A request column with the values at some positions (ascending) replaced; the others are
/// copied as they are (text as views of the same bytes), not rebuilt from values.
fn patched(a: &ArrayRef, patch: &[(usize, Option<&Value>)]) -> ArrayRef {
    let mut next = patch.iter().peekable();
    match a.data_type() {
        DataType::Int64 => {
            let ints = a.as_primitive::<arrow::datatypes::Int64Type>();
            let mut b = arrow::array::Int64Builder::with_capacity(a.len());
            for i in 0..a.len() {
                match next.next_if(|p| p.0 == i) {
                    Some((_, Some(Value::Int(n)))) => b.append_value(*n),
                    Some(_) => b.append_null(),
                    None => b.append_option(ints.is_valid(i).then(|| ints.value(i))),
                }
            }
            Arc::new(b.finish())
        }
        DataType::Utf8View => {
            let texts = a.as_string_view();
            let mut b = arrow::array::StringViewBuilder::with_capacity(a.len());
            for i in 0..a.len() {
                match next.next_if(|p| p.0 == i) {
                    Some((_, v)) => b.append_option(v.and_then(|v| v.text())),
                    None => b.append_option(texts.is_valid(i).then(|| texts.value(i))),
                }
            }
            Arc::new(b.finish())
        }
        // not a request column's type: rebuilt from values
        other => {
            let mut values = typed_values(a);
            for (at, v) in patch {
                values[*at] = v.cloned();
            }
            values_column(other, values.into_iter())
        }
    }
}
