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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rocksdb::WriteBatch;

use super::{CF_META, Snapshot, Store};
use crate::block::BuiltBlock;
use crate::block::reader::Rows;
use crate::error::Result;
use crate::keys::{self, Signal};
use crate::model::{SpanId, SpanRecord, TenantId, TraceId, Value};
use crate::request;

/// What resolution needs of some rows of a block, as spans: ids, parents and the request
/// dimensions' own values, these from the block's postings of each dimension (which hold
/// exactly the value its column keeps), so no attribute chunk is decoded.
fn lineage_rows(
    reader: &crate::block::BlockReader<'_, super::ChunkFetcher<'_>>,
    rows: &Rows,
) -> Result<Vec<SpanRecord>> {
    use arrow::array::{Array, AsArray};
    let ids = reader.span_ids(rows)?;
    let parents = reader.parent_ids(rows)?;
    let mut out: Vec<SpanRecord> = ids
        .into_iter()
        .zip(parents)
        .map(|(span_id, parent_span_id)| SpanRecord {
            span_id,
            parent_span_id,
            ..Default::default()
        })
        .collect();
    for &d in request::request_dims() {
        let dim = &crate::schema::DEDICATED[d];
        let terms = reader.postings_terms(dim.name, rows)?;
        let terms = terms.as_string::<i32>();
        for (span, i) in out.iter_mut().zip(0..terms.len()) {
            if terms.is_null(i) {
                continue;
            }
            let term = terms.value(i);
            let value = match dim.ty {
                crate::schema::ColumnType::Int => match term.parse() {
                    Ok(n) => Value::Int(n),
                    Err(_) => continue,
                },
                _ => Value::Str(term.to_owned()),
            };
            span.attributes
                .push(crate::model::KeyValue::new(dim.name, value));
        }
    }
    Ok(out)
}

/// The traces of the blocks one flush or merge writes, and those found split.
#[derive(Default)]
pub(super) struct SplitNotes {
    seen: HashSet<TraceId>,
    found: Vec<TraceId>,
}

/// Each span's request values (one per [`request::request_dims`] entry), by trace and span.
pub type TraceRequests = HashMap<(TraceId, SpanId), Vec<Option<Value>>>;

impl Store {
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
    /// trace's rows in the snapshot: its blocks (through the trace-id index) and the head.
    pub fn resolve_traces(
        &self,
        tenant: &TenantId,
        snapshot: &Snapshot,
        traces: &[TraceId],
    ) -> Result<TraceRequests> {
        let wanted: HashSet<TraceId> = traces.iter().copied().collect();
        let mut rows: HashMap<TraceId, Vec<SpanRecord>> = HashMap::new();
        for span in snapshot.head.rows() {
            if wanted.contains(&span.trace_id) {
                rows.entry(span.trace_id).or_default().push(span.clone());
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
            let mut read = lineage_rows(&reader, &Rows::Set(set))?.into_iter();
            for (trace, _, n) in runs {
                let spans = rows.entry(trace).or_default();
                for mut span in read.by_ref().take(n as usize) {
                    span.trace_id = trace;
                    spans.push(span);
                }
            }
        }
        let mut out = TraceRequests::new();
        for (trace, spans) in &rows {
            let refs: Vec<&SpanRecord> = spans.iter().collect();
            for (span, resolved) in refs.iter().zip(request::resolve(&refs)) {
                let values = resolved.values.into_iter().map(|v| v.cloned()).collect();
                out.insert((*trace, span.span_id), values);
            }
        }
        Ok(out)
    }
}
