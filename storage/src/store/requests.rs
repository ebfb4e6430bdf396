//! The request table of a tenant's spans over a time range ([`crate::requests`]): each block
//! in range adds the request rows and span counts it was written with (decoded once, cached),
//! the head its rows. Open rows (their ancestry leaves their block or the head) keep the values
//! their part resolved when their trace has no rows elsewhere. Otherwise the values they lack
//! come from the span they leave by, found among the blocks' anchors (the spans carrying
//! request values: their tuple, and where they leave their own block by), one hop after the
//! other; a span that no row of the trace holds (a caller's span, never sent) ends the chain.
//! A trace whose chain passes through a span carrying nothing (or whose rows are in a version
//! 1 block, without exits) is resolved whole, as the `"request.D"` columns are, so that the
//! answer is theirs.

use super::*;
use crate::block::writer::col;
use crate::model::Value;
use crate::request::{self, OPEN_DIM};
use crate::requests::{NONE, RequestRollup, RequestRow};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeSet;

/// Decoded block request rollups kept in memory, in bytes.
pub const REQUESTS_CACHE_BYTES: usize = 64 << 20;

/// Anchor hops an open row's values may take before its trace is resolved whole instead (a
/// longer chain of spans carrying values is a parent cycle).
const MAX_HOPS: usize = 64;

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

/// What an open row stands for.
#[derive(Clone, Copy)]
enum Part {
    /// Open spans of a block: counted.
    Spans(BlockAddr, u64),
    /// A request row of a block.
    Request(RequestRow),
    /// A head row, with its request row when it is one `keep` keeps.
    Head(usize, Option<RequestRow>),
}

/// An open row whose trace has rows elsewhere: its tuple (the total's) lacks values that the
/// span it leaves by may fill.
struct Open {
    trace: TraceId,
    exit: Option<SpanId>,
    tuple: u32,
    part: Part,
}

/// A block's rollup with its terms and tuples mapped into the total's when first used (tuples
/// projected on the asked slots).
struct Mapped {
    rollup: Arc<RequestRollup>,
    /// The total's term of each of the block's terms ([`UNMAPPED`] until first used).
    terms: Vec<u32>,
    /// The total's tuple of each of the block's tuples ([`NONE`] until first used).
    tuples: Vec<u32>,
    /// With one slot asked for, the total's tuple of each of the block's terms (the last
    /// entry: no value): blocks hold hundreds of tuples that differ in slots not asked for.
    by_term: Vec<u32>,
    /// A projected tuple being looked up.
    scratch: Vec<u32>,
}

/// A block term not yet mapped into the total's.
const UNMAPPED: u32 = NONE - 1;

impl Mapped {
    fn new(rollup: Arc<RequestRollup>) -> Self {
        Self {
            terms: vec![UNMAPPED; rollup.terms.len()],
            tuples: vec![NONE; rollup.tuples.len()],
            by_term: Vec::new(),
            rollup,
            scratch: Vec::new(),
        }
    }

    /// The total's term of the block's term `v` ([`NONE`] stays itself).
    fn term(&mut self, total: &mut RequestRollup, v: u32) -> u32 {
        if v == NONE {
            return NONE;
        }
        let term = &mut self.terms[v as usize];
        if *term == UNMAPPED {
            *term = total.term(&self.rollup.terms[v as usize]);
        }
        *term
    }

    /// The total's tuple of the block's tuple `i`.
    fn global(&mut self, total: &mut RequestRollup, slots: &[usize], i: u32) -> u32 {
        let mapped = self.tuples[i as usize];
        if mapped != NONE {
            return mapped;
        }
        let tuple = if let [slot] = slots {
            let v = self.rollup.tuples[i as usize][*slot];
            if self.by_term.is_empty() {
                self.by_term = vec![NONE; self.rollup.terms.len() + 1];
            }
            let at = if v == NONE {
                self.rollup.terms.len()
            } else {
                v as usize
            };
            if self.by_term[at] == NONE {
                let term = self.term(total, v);
                self.by_term[at] = total.tuple(&[term]);
            }
            self.by_term[at]
        } else {
            let mut scratch = std::mem::take(&mut self.scratch);
            scratch.clear();
            for &s in slots {
                let v = self.rollup.tuples[i as usize][s];
                scratch.push(self.term(total, v));
            }
            let tuple = total.tuple(&scratch);
            self.scratch = scratch;
            tuple
        };
        self.tuples[i as usize] = tuple;
        tuple
    }
}

/// The anchors of some traces: (trace, span) → the total's tuple and the parent id it leaves
/// its block by; `None` when a span id is held twice with different values (its trace is then
/// resolved whole).
#[derive(Default)]
struct Anchors(FxHashMap<(TraceId, SpanId), Option<AnchorTo>>);

/// Where an anchor leads: its tuple (the total's) and the parent id it leaves its block by.
type AnchorTo = (u32, Option<SpanId>);

/// What one read of a request table shares: the tenant, its snapshot, the head's rows (and
/// those of each trace) and the asked slots.
#[derive(Clone, Copy)]
struct Reading<'a> {
    tenant: &'a TenantId,
    snapshot: &'a Snapshot,
    head: &'a [&'a SpanRecord],
    head_traces: &'a FxHashMap<TraceId, Vec<usize>>,
    slots: &'a [usize],
}

impl Anchors {
    fn add(&mut self, trace: TraceId, span: SpanId, tuple: u32, exit: Option<SpanId>) {
        let entry = self.0.entry((trace, span)).or_insert(Some((tuple, exit)));
        if *entry != Some((tuple, exit)) {
            *entry = None;
        }
    }

    /// Adds a block's anchors of the traces in `wanted`.
    fn add_block(
        &mut self,
        block: &mut Mapped,
        total: &mut RequestRollup,
        slots: &[usize],
        wanted: &FxHashSet<TraceId>,
    ) {
        let rollup = block.rollup.clone();
        for a in rollup.anchors.iter().filter(|a| wanted.contains(&a.trace)) {
            let tuple = block.global(total, slots, a.tuple);
            self.add(a.trace, a.span, tuple, a.exit);
        }
    }

    /// An open row's tuple with the values it lacks taken from the span it leaves by, and so
    /// on up; a span in `absent` (no row of its trace holds it) ends the chain with the values
    /// found so far. `Err(Some(span))` when a span on the way is no anchor (it may be a span
    /// carrying nothing, or missing), `Err(None)` when the chain cannot be followed (a
    /// version 1 rollup, a span id held twice, a chain that does not end).
    fn finish(
        &self,
        total: &mut RequestRollup,
        absent: &FxHashSet<(TraceId, SpanId)>,
        trace: TraceId,
        mut exit: Option<SpanId>,
        tuple: u32,
    ) -> std::result::Result<u32, Option<SpanId>> {
        let mut values = total.tuples[tuple as usize].clone();
        for _ in 0..MAX_HOPS {
            if !values.contains(&NONE) {
                return Ok(total.tuple(&values));
            }
            let at = exit.ok_or(None)?;
            let (above, next) = match self.0.get(&(trace, at)) {
                Some(anchor) => anchor.ok_or(None)?,
                None if absent.contains(&(trace, at)) => return Ok(total.tuple(&values)),
                None => return Err(Some(at)),
            };
            for (v, a) in values.iter_mut().zip(&total.tuples[above as usize]) {
                if *v == NONE {
                    *v = *a;
                }
            }
            if next.is_none() {
                return Ok(total.tuple(&values));
            }
            exit = next;
        }
        Err(None)
    }
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
        self.request_table_of(tenant, (start, end), spans, slots, |_| true)
    }

    /// [`Self::request_table`] with only the request rows that `keep` keeps (a percentile of
    /// TTFT has no use for rows without one, and their values need not be resolved); `keep`
    /// judges a row by its own fields, not by its tuple.
    pub fn request_table_of(
        &self,
        tenant: &TenantId,
        (start, end): (Option<u64>, Option<u64>),
        spans: bool,
        slots: &[usize],
        keep: impl Fn(&RequestRow) -> bool,
    ) -> Result<Option<RequestTable>> {
        let snapshot = self.snapshot(tenant)?;
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
        let lacks =
            |total: &RequestRollup, tuple: u32| total.tuples[tuple as usize].contains(&NONE);
        let mut opens: Vec<Open> = Vec::new();
        let mut blocks: Vec<(BlockAddr, Mapped)> = Vec::with_capacity(in_range.len());
        let rollups = in_range
            .into_iter()
            .map(|(addr, meta)| Ok((addr, self.block_requests(tenant, addr, meta)?)))
            .collect::<Result<Vec<_>>>()?;
        // copied rows read faster afterwards than rows read in place in their blocks (measured)
        total
            .requests
            .reserve(rollups.iter().map(|(_, r)| r.requests.len()).sum());
        for (addr, rollup) in rollups {
            let mut block = Mapped::new(rollup.clone());
            if spans {
                for (i, n) in rollup.spans.iter().enumerate() {
                    if *n > 0 {
                        let g = block.global(&mut total, slots, i as u32);
                        total.spans[g as usize] += n;
                    }
                }
                // an open row with a value of every slot has its final values (the nearest
                // ancestor holding one is in the block); a trace elsewhere with an open row
                // lacking one has all its open rows here completed (or resolved whole)
                let mut unsettled: FxHashSet<TraceId> = FxHashSet::default();
                for o in &rollup.open {
                    let g = block.global(&mut total, slots, o.tuple);
                    if lacks(&total, g) && elsewhere(&o.trace) {
                        unsettled.insert(o.trace);
                    }
                }
                for o in &rollup.open {
                    let tuple = block.global(&mut total, slots, o.tuple);
                    if unsettled.contains(&o.trace) {
                        opens.push(Open {
                            trace: o.trace,
                            exit: o.exit,
                            tuple,
                            part: Part::Spans(addr, o.spans),
                        });
                    } else {
                        total.spans[tuple as usize] += o.spans;
                    }
                }
            }
            for q in &rollup.requests {
                if !(lo..hi).contains(&q.start_ns) || !keep(q) {
                    continue;
                }
                let tuple = block.global(&mut total, slots, q.tuple);
                let q = RequestRow { tuple, ..*q };
                if q.open && lacks(&total, tuple) && elsewhere(&q.trace) {
                    opens.push(Open {
                        trace: q.trace,
                        exit: q.exit,
                        tuple,
                        part: Part::Request(q),
                    });
                } else {
                    total.requests.push(q);
                }
            }
            blocks.push((addr, block));
        }
        let mut head_anchors = Vec::new();
        for (trace, rows) in &head_traces {
            let spans_of: Vec<&SpanRecord> = rows.iter().map(|&i| head[i]).collect();
            // an open head row may leave by a span in a block (whether the trace has rows in
            // one is not known here): its chain is followed as a block's rows' is
            let resolved = request::resolve(&spans_of);
            for (&i, r) in rows.iter().zip(resolved) {
                let s = head[i];
                let carries = request::carries(s);
                // `keep` looks at a row's own values, not its tuple (set below)
                let request = crate::requests::is_request(s)
                    .then(|| RequestRow::of(s, r.exit, NONE))
                    .filter(&keep);
                let counted = (lo..hi).contains(&s.start.0) && (spans || request.is_some());
                if !carries && !counted {
                    continue;
                }
                let values: Vec<Option<&Value>> = slots.iter().map(|&s| r.values[s]).collect();
                let tuple = total.tuple_of(&values);
                if carries {
                    head_anchors.push((*trace, s.span_id, tuple, r.exit));
                }
                if !counted {
                    continue;
                }
                let request = request.map(|q| RequestRow { tuple, ..q });
                if r.open && lacks(&total, tuple) {
                    opens.push(Open {
                        trace: *trace,
                        exit: r.exit,
                        tuple,
                        part: Part::Head(i, request),
                    });
                    continue;
                }
                if spans {
                    total.spans[tuple as usize] += 1;
                }
                total.requests.extend(request);
            }
        }
        let reading = Reading {
            tenant,
            snapshot: &snapshot,
            head: &head,
            head_traces: &head_traces,
            slots,
        };
        let mut pending = Pending::default();
        if !opens.is_empty() {
            let finished =
                self.finish_opens(&reading, &mut blocks, head_anchors, &opens, &mut total)?;
            for (o, f) in opens.iter().zip(finished) {
                let Some(tuple) = f else {
                    pending.traces.insert(o.trace);
                    match o.part {
                        Part::Spans(addr, _) => {
                            pending.open.insert((addr, o.trace));
                        }
                        Part::Request(q) => pending.requests.push(q),
                        Part::Head(i, _) => pending.head.push(i),
                    }
                    continue;
                };
                match o.part {
                    Part::Spans(_, n) => total.spans[tuple as usize] += n,
                    Part::Request(q) => total.requests.push(RequestRow { tuple, ..q }),
                    Part::Head(_, request) => {
                        if spans {
                            total.spans[tuple as usize] += 1;
                        }
                        total
                            .requests
                            .extend(request.map(|q| RequestRow { tuple, ..q }));
                    }
                }
            }
        }
        if !pending.traces.is_empty() {
            self.resolve_pending(&reading, pending, &keep, &mut total)?;
        }
        Ok(Some(RequestTable { rollup: total }))
    }

    /// The final tuple of each open row from the anchors of the blocks in range and of the
    /// head, then of the traces' blocks out of range, then with the spans that no row holds
    /// left out; `None` for every row of a trace whose chain passes through a span that
    /// carries nothing (its trace is resolved whole).
    fn finish_opens(
        &self,
        reading: &Reading<'_>,
        blocks: &mut [(BlockAddr, Mapped)],
        head_anchors: Vec<(TraceId, SpanId, u32, Option<SpanId>)>,
        opens: &[Open],
        total: &mut RequestRollup,
    ) -> Result<Vec<Option<u32>>> {
        let Reading {
            tenant,
            snapshot,
            head,
            head_traces,
            slots,
        } = *reading;
        let wanted: FxHashSet<TraceId> = opens.iter().map(|o| o.trace).collect();
        let mut anchors = Anchors::default();
        for (_, block) in blocks.iter_mut() {
            anchors.add_block(block, total, slots, &wanted);
        }
        for (trace, span, tuple, exit) in head_anchors {
            if wanted.contains(&trace) {
                anchors.add(trace, span, tuple, exit);
            }
        }
        let mut absent: FxHashSet<(TraceId, SpanId)> = FxHashSet::default();
        let mut finished: Vec<std::result::Result<u32, Option<SpanId>>> = opens
            .iter()
            .map(|o| anchors.finish(total, &absent, o.trace, o.exit, o.tuple))
            .collect();
        let missing = |finished: &[std::result::Result<u32, Option<SpanId>>]| {
            let mut out: FxHashMap<TraceId, FxHashSet<SpanId>> = FxHashMap::default();
            for (o, f) in opens.iter().zip(finished) {
                if let Err(Some(span)) = f {
                    out.entry(o.trace).or_default().insert(*span);
                }
            }
            out
        };
        let retry = |finished: &mut [std::result::Result<u32, Option<SpanId>>],
                     anchors: &Anchors,
                     absent: &FxHashSet<(TraceId, SpanId)>,
                     total: &mut RequestRollup| {
            for (o, f) in opens.iter().zip(finished.iter_mut()) {
                if matches!(f, Err(Some(_))) {
                    *f = anchors.finish(total, absent, o.trace, o.exit, o.tuple);
                }
            }
        };
        // a chain may pass through a block out of range: the anchors of the other blocks of
        // the traces left
        let left = missing(&finished);
        let mut locations: FxHashMap<TraceId, Vec<(BlockAddr, TraceEntry)>> = FxHashMap::default();
        if !left.is_empty() {
            let read: FxHashSet<BlockAddr> = blocks.iter().map(|(a, _)| *a).collect();
            let mut others: BTreeSet<BlockAddr> = BTreeSet::new();
            for trace in left.keys() {
                let at = self.trace_locations_in(tenant, snapshot, trace)?;
                others.extend(at.iter().map(|(a, _)| *a).filter(|a| !read.contains(a)));
                locations.insert(*trace, at);
            }
            let traces: FxHashSet<TraceId> = left.keys().copied().collect();
            for addr in others {
                let Some(meta) = snapshot.blocks.get(&addr) else {
                    continue;
                };
                if meta.column(col::ROLLUP_REQUESTS).is_none() {
                    continue;
                }
                let mut block = Mapped::new(self.block_requests(tenant, addr, meta)?);
                anchors.add_block(&mut block, total, slots, &traces);
            }
            retry(&mut finished, &anchors, &absent, total);
        }
        // a span that no row of its trace holds (a caller's span in a service that sends
        // nothing: common for the root) ends the chain; told apart from a span carrying
        // nothing by the span ids of the trace's rows
        let left = missing(&finished);
        if !left.is_empty() {
            let mut present: FxHashSet<(TraceId, SpanId)> = FxHashSet::default();
            let mut by_block: BTreeMap<BlockAddr, Vec<(u32, u32, TraceId)>> = BTreeMap::new();
            for trace in left.keys() {
                let at = match locations.remove(trace) {
                    Some(at) => at,
                    None => self.trace_locations_in(tenant, snapshot, trace)?,
                };
                for (addr, e) in at {
                    by_block
                        .entry(addr)
                        .or_default()
                        .push((e.row_start, e.rows, *trace));
                }
                for &i in head_traces.get(trace).into_iter().flatten() {
                    present.insert((*trace, head[i].span_id));
                }
            }
            for (addr, mut runs) in by_block {
                let Some(meta) = snapshot.blocks.get(&addr) else {
                    continue;
                };
                runs.sort_unstable_by_key(|r| r.0);
                let mut set = RoaringBitmap::new();
                for (start, n, _) in &runs {
                    set.insert_range(*start..start + n);
                }
                let ids = self
                    .block_reader(tenant, addr, meta)
                    .span_ids(&Rows::Set(set))?;
                let mut ids = ids.into_iter();
                for (_, n, trace) in &runs {
                    for id in ids.by_ref().take(*n as usize) {
                        if left[trace].contains(&id) {
                            present.insert((*trace, id));
                        }
                    }
                }
            }
            for (trace, spans) in &left {
                absent.extend(
                    spans
                        .iter()
                        .filter(|s| !present.contains(&(*trace, **s)))
                        .map(|s| (*trace, *s)),
                );
            }
            retry(&mut finished, &anchors, &absent, total);
        }
        // a trace with any row left unfinished is resolved whole, every part of it
        let whole: FxHashSet<TraceId> = opens
            .iter()
            .zip(&finished)
            .filter(|(_, f)| f.is_err())
            .map(|(o, _)| o.trace)
            .collect();
        Ok(opens
            .iter()
            .zip(finished)
            .map(|(o, f)| f.ok().filter(|_| !whole.contains(&o.trace)))
            .collect())
    }

    /// Counts the pending rows with their traces resolved whole.
    fn resolve_pending(
        &self,
        reading: &Reading<'_>,
        pending: Pending,
        keep: &dyn Fn(&RequestRow) -> bool,
        total: &mut RequestRollup,
    ) -> Result<()> {
        let Reading {
            tenant,
            snapshot,
            head,
            head_traces,
            slots,
        } = *reading;
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
            let request = crate::requests::is_request(s)
                .then(|| RequestRow::of(s, None, tuple))
                .filter(|q| keep(q));
            total.requests.extend(request);
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
