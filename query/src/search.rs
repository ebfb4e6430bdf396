//! Trace search: traces having one span that matches every filter, newest trace first.

use std::collections::{BinaryHeap, HashMap, HashSet};

use roaring::RoaringBitmap;
use weft_storage::Store;
use weft_storage::model::{SpanRecord, TenantId, TraceId, Value};
use weft_storage::scan::{BlockView, Rows, TraceEntry};
use weft_storage::schema::{DEDICATED, DIM_NAME, DIM_SERVICE, dedicated_for};
use weft_storage::store::Snapshot;
use weft_storage::summary::SummaryBuilder;

use crate::error::QueryError;
use crate::sql::pushdown::{BlockWork, Pushdown, ScanPlan};

/// Filters of a search; all of them must hold on one span of a trace.
#[derive(Clone, Debug, Default)]
pub struct SearchRequest {
    pub service: Option<String>,
    pub name: Option<String>,
    pub attributes: Vec<(String, String)>,
    pub min_duration_ns: Option<u64>,
    pub max_duration_ns: Option<u64>,
    /// The matching span starts at or after this time (Unix ns).
    pub start: Option<u64>,
    /// The matching span starts before this time (Unix ns).
    pub end: Option<u64>,
    pub limit: usize,
    pub cursor: Option<Cursor>,
}

/// Where a page ended: the last trace's (start time, id). Opaque text to clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    pub start: u64,
    pub trace_id: TraceId,
}

impl Cursor {
    pub fn encode(&self) -> String {
        format!("{:x}-{}", self.start, self.trace_id.to_hex())
    }
    pub fn decode(text: &str) -> Result<Self, QueryError> {
        let bad = || QueryError::InvalidParameter {
            param: "cursor",
            detail: format!("{text:?} is not a cursor returned by this API"),
        };
        let (start, trace) = text.split_once('-').ok_or_else(bad)?;
        Ok(Self {
            start: u64::from_str_radix(start, 16).map_err(|_| bad())?,
            trace_id: TraceId::from_hex(trace).map_err(|_| bad())?,
        })
    }
    /// Whether a trace sorts after this cursor (newest first, then by id descending).
    fn is_before(&self, start: u64, id: &TraceId) -> bool {
        (start, *id) < (self.start, self.trace_id)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceSummary {
    pub trace_id: TraceId,
    pub root_service: String,
    pub root_name: String,
    pub start_time: u64,
    pub duration_ns: u64,
    pub span_count: u64,
    pub error_count: u64,
}

#[derive(Clone, Debug, Default)]
pub struct SearchPage {
    pub traces: Vec<TraceSummary>,
    pub next_cursor: Option<String>,
}

pub fn search(
    store: &Store,
    tenant: &TenantId,
    req: &SearchRequest,
) -> Result<SearchPage, QueryError> {
    let snapshot = store.snapshot(tenant)?;
    // blocks and rows are chosen as SQL's push-down chooses them (time bounds, postings,
    // retention); what no index answers is checked here on the rows left
    let pushdown = pushdown_of(req);
    let plan = ScanPlan::build(store, tenant, &snapshot, &pushdown, true)?;
    let limit = req.limit.max(1);
    // one more than the page, to know whether another page follows
    let want = limit + 1;

    // Newest first, reading no more than the page needs. Each candidate trace carries an upper
    // bound of its start (a trace starts no later than any of its spans: the matched head span,
    // or its first row in the block where it matched); blocks are read newest first. Once the
    // page's last trace starts after every bound not yet looked at (candidates and unread
    // blocks), nothing left can enter the page.
    let mut candidates: BinaryHeap<(u64, TraceId)> = BinaryHeap::new();
    let mut head_bounds: HashMap<TraceId, u64> = HashMap::new();
    for span in snapshot.head.rows().filter(|s| span_matches(s, req)) {
        let bound = head_bounds.entry(span.trace_id).or_insert(u64::MAX);
        *bound = (*bound).min(span.start.0);
    }
    candidates.extend(head_bounds.into_iter().map(|(t, b)| (b, t)));
    let mut blocks: Vec<&BlockWork> = plan.blocks.iter().collect();
    blocks.sort_by_key(|w| std::cmp::Reverse(w.meta.max_start));
    let mut blocks = blocks.into_iter().peekable();
    let mut seen: HashSet<TraceId> = HashSet::new();
    // the best `want` traces so far, worst on top
    let mut page: BinaryHeap<std::cmp::Reverse<(u64, TraceId)>> = BinaryHeap::new();
    let mut found: HashMap<TraceId, TraceSummary> = HashMap::new();
    loop {
        let next_block = blocks.peek().map(|w| w.meta.max_start);
        let next_candidate = candidates.peek().map(|(b, _)| *b);
        let frontier = match (next_block, next_candidate) {
            (None, None) => break,
            (a, b) => a.max(b).unwrap_or(0),
        };
        if page.len() >= want
            && page
                .peek()
                .is_some_and(|std::cmp::Reverse((start, _))| *start > frontier)
        {
            break;
        }
        if next_candidate.is_some() && next_candidate >= next_block {
            let Some((_, trace)) = candidates.pop() else {
                break;
            };
            if !seen.insert(trace) {
                continue;
            }
            let Some(summary) = summarize(store, tenant, &trace, &snapshot)? else {
                continue;
            };
            if req
                .cursor
                .is_some_and(|c| !c.is_before(summary.start_time, &summary.trace_id))
            {
                continue;
            }
            page.push(std::cmp::Reverse((summary.start_time, summary.trace_id)));
            found.insert(summary.trace_id, summary);
            if page.len() > want
                && let Some(std::cmp::Reverse((_, out))) = page.pop()
            {
                found.remove(&out);
            }
            continue;
        }
        let Some(work) = blocks.next() else {
            break;
        };
        let rows = matching_rows(store, tenant, work, req)?;
        if rows.is_empty() {
            continue;
        }
        let traces = store.block_traces(tenant, work.addr)?;
        for i in entries_of_rows(&traces, &rows) {
            let entry = &traces[i];
            if !seen.contains(&entry.trace_id) {
                candidates.push((entry.min_start, entry.trace_id));
            }
        }
    }
    let mut summaries: Vec<TraceSummary> = found.into_values().collect();
    summaries.sort_by_key(|s| std::cmp::Reverse((s.start_time, s.trace_id)));
    let next_cursor = (summaries.len() > limit).then(|| {
        let last = &summaries[limit - 1];
        Cursor {
            start: last.start_time,
            trace_id: last.trace_id,
        }
        .encode()
    });
    summaries.truncate(limit);
    Ok(SearchPage {
        traces: summaries,
        next_cursor,
    })
}

/// The filters of a search that the store's indexes and block bounds answer.
fn pushdown_of(req: &SearchRequest) -> Pushdown {
    let mut p = Pushdown {
        start_min: req.start.map(|s| s as i64),
        start_max: req.end.map(|e| e as i64 - 1),
        ..Default::default()
    };
    let mut term = |dim: &'static str, value: &str| {
        let terms = p.dims.entry(dim).or_default();
        if terms.is_empty() {
            terms.push(value.to_owned());
        } else if !terms.iter().any(|t| t == value) {
            // two different values of one dimension on one span: nothing matches
            p.nothing = true;
        }
    };
    if let Some(service) = &req.service {
        term(DIM_SERVICE, service);
    }
    if let Some(name) = &req.name {
        term(DIM_NAME, name);
    }
    for (key, value) in &req.attributes {
        if let Some((i, _)) = dedicated_for(key)
            && DEDICATED[i].indexed
        {
            term(DEDICATED[i].name, value);
        }
    }
    p
}

/// Rows of one block (among those the scan plan chose) where a single span satisfies every
/// filter: the plan's rows answer the indexed ones; the others decode only their column, only
/// for rows still in the running.
fn matching_rows(
    store: &Store,
    tenant: &TenantId,
    work: &BlockWork,
    req: &SearchRequest,
) -> Result<RoaringBitmap, QueryError> {
    let meta = &work.meta;
    let mut rows = match &work.rows {
        Rows::All => RoaringBitmap::from_iter(0..meta.rows),
        Rows::Range(start, len) => RoaringBitmap::from_iter(*start..start + len),
        Rows::Set(set) => set.clone(),
    };
    let unindexed = req
        .attributes
        .iter()
        .filter(|(key, _)| dedicated_for(key).is_none_or(|(i, _)| !DEDICATED[i].indexed));
    let reader = store.block_view(tenant, work.addr, meta);
    for (key, value) in unindexed {
        if rows.is_empty() {
            break;
        }
        rows = attribute_rows(&reader, key, value, &rows)?;
    }
    let time_filtered = req.start.is_some_and(|s| meta.min_start < s)
        || req.end.is_some_and(|e| meta.max_start >= e);
    if time_filtered && !rows.is_empty() {
        let starts = reader.starts(&Rows::Set(rows.clone()))?;
        rows = keep(&rows, &starts, |t| {
            req.start.is_none_or(|s| t as u64 >= s) && req.end.is_none_or(|e| (t as u64) < e)
        });
    }
    if (req.min_duration_ns.is_some() || req.max_duration_ns.is_some()) && !rows.is_empty() {
        let durations = reader.durations(&Rows::Set(rows.clone()))?;
        rows = keep(&rows, &durations, |d| duration_ok(d as u64, req));
    }
    Ok(rows)
}

fn keep(rows: &RoaringBitmap, values: &[i64], pred: impl Fn(i64) -> bool) -> RoaringBitmap {
    rows.iter()
        .zip(values)
        .filter(|(_, v)| pred(**v))
        .map(|(r, _)| r)
        .collect()
}

fn duration_ok(d: u64, req: &SearchRequest) -> bool {
    req.min_duration_ns.is_none_or(|m| d >= m) && req.max_duration_ns.is_none_or(|m| d <= m)
}

/// Rows among `rows` whose attribute `key` equals `value`, wherever the block keeps it.
fn attribute_rows(
    reader: &BlockView<'_>,
    key: &str,
    value: &str,
    rows: &RoaringBitmap,
) -> Result<RoaringBitmap, QueryError> {
    let values = reader.attribute(key, &Rows::Set(rows.clone()))?;
    Ok(rows
        .iter()
        .zip(values)
        .filter(|(_, v)| v.as_ref().is_some_and(|v| value_matches(v, value)))
        .map(|(r, _)| r)
        .collect())
}

fn value_matches(v: &Value, text: &str) -> bool {
    match v {
        Value::Double(d) => text.parse::<f64>().is_ok_and(|t| t == *d),
        other => other.as_term().is_some_and(|t| t == text),
    }
}

/// Trace ids of the traces owning `rows` (trace entries are sorted by row).
/// Indexes of the block's trace entries holding any of `rows`.
fn entries_of_rows(traces: &[TraceEntry], rows: &RoaringBitmap) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    for row in rows {
        let i = traces.partition_point(|t| t.row_start + t.rows <= row);
        if i < traces.len() && out.last() != Some(&i) {
            out.push(i);
        }
    }
    out
}

fn span_matches(s: &SpanRecord, req: &SearchRequest) -> bool {
    req.service.as_ref().is_none_or(|v| s.service_name() == v)
        && req.name.as_ref().is_none_or(|v| &s.name == v)
        && req.start.is_none_or(|t| s.start.0 >= t)
        && req.end.is_none_or(|t| s.start.0 < t)
        && duration_ok(s.duration_ns(), req)
        && req
            .attributes
            .iter()
            .all(|(k, v)| attribute_matches(s, k, v))
}

/// Matches an attribute by its name or by the other generation of its GenAI name.
fn attribute_matches(s: &SpanRecord, key: &str, value: &str) -> bool {
    let canonical = dedicated_for(key).map(|(i, _)| i);
    s.attributes.iter().any(|kv| {
        let same_key = kv.key == key
            || (canonical.is_some() && dedicated_for(&kv.key).map(|(i, _)| i) == canonical);
        same_key && value_matches(&kv.value, value)
    })
}

/// A trace's summary from the per-block trace entries and the head.
fn summarize(
    store: &Store,
    tenant: &TenantId,
    trace: &TraceId,
    snapshot: &Snapshot,
) -> Result<Option<TraceSummary>, QueryError> {
    let mut acc = SummaryBuilder::default();
    let entries = store.trace_locations_in(tenant, snapshot, trace)?;
    if let Some(cutoff) = snapshot.cutoff
        && entries.iter().any(|(_, e)| e.min_start < cutoff.0)
    {
        // some of its spans are out of retention: summarise the ones still kept
        for s in store.trace(tenant, trace)? {
            acc.add_span(&s);
        }
        return Ok(acc.finish(*trace).map(TraceSummary::from));
    }
    for (_, entry) in &entries {
        acc.add_entry(entry);
    }
    let mut seen: HashMap<_, ()> = HashMap::new();
    for s in snapshot.head.rows().filter(|s| s.trace_id == *trace) {
        if seen.insert(s.span_id, ()).is_some() {
            continue;
        }
        acc.add_span(s);
    }
    Ok(acc.finish(*trace).map(TraceSummary::from))
}

impl From<weft_storage::summary::TraceSummary> for TraceSummary {
    fn from(s: weft_storage::summary::TraceSummary) -> Self {
        let duration_ns = s.duration_ns();
        let (root_service, root_name) = s.root.map(|r| (r.service, r.name)).unwrap_or_default();
        Self {
            trace_id: s.trace_id,
            root_service,
            root_name,
            start_time: s.start,
            duration_ns,
            span_count: s.spans,
            error_count: s.errors,
        }
    }
}
