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
        for trace in &wanted {
            for (addr, entry) in self.trace_locations_in(tenant, snapshot, trace)? {
                let Some(meta) = snapshot.blocks.get(&addr) else {
                    continue;
                };
                let reader = self.block_reader(tenant, addr, meta);
                rows.entry(*trace)
                    .or_default()
                    .extend(reader.spans(&Rows::Range(entry.row_start, entry.rows), false)?);
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
