//! The request table of a tenant's spans over a time range ([`crate::requests`]): each block
//! in range adds the request rows and span counts it was written with (decoded once, cached),
//! the head its rows. Open rows (their ancestry leaves their block or the head) keep the values
//! their part resolved when their trace has no rows elsewhere; traces with rows elsewhere are
//! resolved whole, as the `"request.D"` columns are, so that the answer is theirs.

use super::*;
use crate::block::writer::col;
use crate::model::Value;
use crate::request::{self, OPEN_DIM};
use crate::requests::{NONE, RequestRollup, RequestRow};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeSet;

/// Decoded block request rollups kept in memory, in bytes.
pub const REQUESTS_CACHE_BYTES: usize = 32 << 20;

/// Request rows and span counts by request values over a range; every tuple index is into
/// `rollup.tuples`, every value resolved over its whole trace.
#[derive(Debug, Default)]
pub struct RequestTable {
    /// Terms, tuples, span counts per tuple (when asked for) and the request rows.
    pub rollup: RequestRollup,
}

/// Work left for when the traces that need it are resolved whole.
#[derive(Default)]
struct Pending {
    traces: FxHashSet<TraceId>,
    /// Block open rows of such traces to count: (block, trace).
    open: BTreeSet<(BlockAddr, TraceId)>,
    /// Request rows whose values change with the resolution.
    requests: Vec<RequestRow>,
    /// Head rows in range of such traces.
    head: Vec<usize>,
}

impl Store {
    /// The request rows of the tenant's spans starting in `[start, end)` (either end open)
    /// and, with `spans`, the spans counted per tuple of request values; tuples hold the
    /// values of request dimension slots `slots` alone, in that order (so that rows differing
    /// in other dimensions share one). `None` when the rollups cannot answer: a block written
    /// before them, or (with `spans`) a range end inside a block.
    pub fn request_table(
        &self,
        tenant: &TenantId,
        start: Option<u64>,
        end: Option<u64>,
        spans: bool,
        slots: &[usize],
    ) -> Result<Option<RequestTable>> {
        let snapshot = self.snapshot(tenant);
        let (lo, hi) = snapshot.range(start, end);
        let in_range = snapshot.blocks_in((lo, hi));
        for (_, meta) in &in_range {
            let cut = meta.min_start < lo || meta.max_start >= hi;
            if meta.column(col::ROLLUP_REQUESTS).is_none() || (spans && cut) {
                return Ok(None);
            }
        }
        // the head, resolved per trace over its rows
        let head: Vec<&SpanRecord> = snapshot.head.rows().collect();
        let mut head_traces: FxHashMap<TraceId, Vec<usize>> = FxHashMap::default();
        for (i, s) in head.iter().enumerate() {
            head_traces.entry(s.trace_id).or_default().push(i);
        }
        let elsewhere = |t: &TraceId| snapshot.splits.contains(t) || head_traces.contains_key(t);
        let mut total = RequestRollup::default();
        let mut pending = Pending::default();
        for (addr, meta) in in_range {
            let block = self.block_requests(tenant, addr, meta)?;
            // the block's terms and tuples as the total's, each mapped when first used
            let terms: Vec<u32> = block.terms.iter().map(|t| total.term(t)).collect();
            let mut tuples = vec![NONE; block.tuples.len()];
            let mut mapped = Vec::new();
            let mut global = |total: &mut RequestRollup, i: u32| -> u32 {
                let slot = &mut tuples[i as usize];
                if *slot == NONE {
                    mapped.clear();
                    let tuple = &block.tuples[i as usize];
                    mapped.extend(slots.iter().map(|&s| match tuple[s] {
                        NONE => NONE,
                        v => terms[v as usize],
                    }));
                    *slot = total.tuple(&mapped);
                }
                *slot
            };
            if spans {
                for (i, n) in block.spans.iter().enumerate() {
                    if *n > 0 {
                        let g = global(&mut total, i as u32);
                        total.spans[g as usize] += n;
                    }
                }
                // an open row with a value of every slot has its final values (the nearest
                // ancestor holding one is in the block); a trace elsewhere with an open row
                // lacking one is resolved whole, all its open rows here counted then
                let mut whole: FxHashSet<TraceId> = FxHashSet::default();
                for (trace, tuple, _) in &block.open {
                    let g = global(&mut total, *tuple);
                    if total.tuples[g as usize].contains(&NONE) && elsewhere(trace) {
                        whole.insert(*trace);
                    }
                }
                for (trace, tuple, n) in &block.open {
                    if whole.contains(trace) {
                        pending.traces.insert(*trace);
                        pending.open.insert((addr, *trace));
                    } else {
                        let g = global(&mut total, *tuple);
                        total.spans[g as usize] += n;
                    }
                }
            }
            for q in &block.requests {
                if !(lo..hi).contains(&q.start_ns) {
                    continue;
                }
                let tuple = global(&mut total, q.tuple);
                if q.open && total.tuples[tuple as usize].contains(&NONE) && elsewhere(&q.trace) {
                    pending.traces.insert(q.trace);
                    pending.requests.push(*q);
                } else {
                    total.requests.push(RequestRow { tuple, ..*q });
                }
            }
        }
        for (trace, rows) in &head_traces {
            let spans_of: Vec<&SpanRecord> = rows.iter().map(|&i| head[i]).collect();
            let resolved = request::resolve(&spans_of);
            let whole = snapshot.splits.contains(trace) || resolved.iter().any(|r| r.open);
            for (&i, r) in rows.iter().zip(resolved) {
                let s = head[i];
                if !(lo..hi).contains(&s.start.0) {
                    continue;
                }
                if whole {
                    pending.traces.insert(*trace);
                    pending.head.push(i);
                    continue;
                }
                let values: Vec<Option<&Value>> = slots.iter().map(|&s| r.values[s]).collect();
                let tuple = total.tuple_of(&values);
                if spans {
                    total.spans[tuple as usize] += 1;
                }
                if crate::requests::is_request(s) {
                    total.requests.push(RequestRow::of(s, false, tuple));
                }
            }
        }
        if !pending.traces.is_empty() {
            let head = (&head[..], &head_traces);
            self.resolve_pending(tenant, &snapshot, head, pending, slots, &mut total)?;
        }
        Ok(Some(RequestTable { rollup: total }))
    }

    /// Counts the pending rows with their traces resolved whole.
    fn resolve_pending(
        &self,
        tenant: &TenantId,
        snapshot: &Snapshot,
        (head, head_traces): (&[&SpanRecord], &FxHashMap<TraceId, Vec<usize>>),
        pending: Pending,
        slots: &[usize],
        total: &mut RequestRollup,
    ) -> Result<()> {
        let (with_head, stored): (Vec<TraceId>, Vec<TraceId>) = pending
            .traces
            .iter()
            .copied()
            .partition(|t| head_traces.contains_key(t));
        let stored = self.resolve_stored_traces(tenant, snapshot, &stored)?;
        let head_rows: Vec<&SpanRecord> = with_head
            .iter()
            .flat_map(|t| head_traces[t].iter().map(|&i| head[i]))
            .collect();
        let in_head = self.resolve_traces(tenant, snapshot, &with_head, &head_rows)?;
        let values_of = |trace: &TraceId, span: &SpanId| -> Option<Vec<Option<Value>>> {
            match stored.get(trace) {
                Some(r) => r.of(trace, span),
                None => in_head.of(trace, span),
            }
        };
        let tuple_of = |total: &mut RequestRollup, trace: &TraceId, span: &SpanId| {
            let values = values_of(trace, span).unwrap_or_default();
            let refs: Vec<Option<&Value>> = slots
                .iter()
                .map(|&i| values.get(i).and_then(Option::as_ref))
                .collect();
            total.tuple_of(&refs)
        };
        for q in &pending.requests {
            let tuple = tuple_of(total, &q.trace, &q.span);
            total.requests.push(RequestRow { tuple, ..*q });
        }
        for &i in &pending.head {
            let s = head[i];
            let tuple = tuple_of(total, &s.trace_id, &s.span_id);
            total.spans[tuple as usize] += 1;
            if crate::requests::is_request(s) {
                total.requests.push(RequestRow::of(s, true, tuple));
            }
        }
        // the open rows of each block of those traces, counted by their resolved values
        let mut by_block: BTreeMap<BlockAddr, Vec<TraceId>> = BTreeMap::new();
        for (addr, trace) in pending.open {
            by_block.entry(addr).or_default().push(trace);
        }
        for (addr, traces) in by_block {
            let Some(meta) = snapshot.blocks.get(&addr) else {
                continue;
            };
            let wanted: FxHashSet<TraceId> = traces.iter().copied().collect();
            let mut set = RoaringBitmap::new();
            let mut runs: Vec<(u32, u32, TraceId)> = Vec::new();
            for trace in &wanted {
                for (a, e) in self.trace_locations_in(tenant, snapshot, trace)? {
                    if a == addr {
                        runs.push((e.row_start, e.rows, *trace));
                    }
                }
            }
            runs.sort_unstable_by_key(|r| r.0);
            for (start, n, _) in &runs {
                set.insert_range(*start..start + n);
            }
            let open = self.dimension_shared(tenant, addr, OPEN_DIM)?;
            let open_rows = open
                .first()
                .map(|(_, rows)| rows.clone())
                .unwrap_or_default();
            set &= &open_rows;
            if set.is_empty() {
                continue;
            }
            let reader = self.block_reader(tenant, addr, meta);
            let rows = Rows::Set(set.clone());
            let ids = reader.span_ids(&rows)?;
            let mut run = runs.iter().peekable();
            for (row, id) in set.iter().zip(ids) {
                while run.peek().is_some_and(|(start, n, _)| row >= start + n) {
                    run.next();
                }
                let Some((_, _, trace)) = run.peek() else {
                    break;
                };
                let tuple = tuple_of(total, trace, &id);
                total.spans[tuple as usize] += 1;
            }
        }
        Ok(())
    }

    /// A block's request rollup, decoded and cached.
    fn block_requests(
        &self,
        tenant: &TenantId,
        addr: BlockAddr,
        meta: &BlockMeta,
    ) -> Result<Arc<RequestRollup>> {
        self.cached_chunk(
            &self.request_rollups,
            (tenant, addr, meta),
            col::ROLLUP_REQUESTS,
            "request rollup",
            RequestRollup::decode,
            RequestRollup::weight,
        )
    }
}
