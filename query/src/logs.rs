//! Log search: the records matching a text query and filters, newest first, a page at a
//! time with a cursor that continues exactly where the page ended; and a trace's records.
//!
//! Blocks are visited newest first (by their latest time) and the visit stops once a full
//! page is in hand and no unvisited block can hold a newer record. Filters on time, service
//! and class narrow the rows of each block through the store's log scan (postings, time) before
//! any record is decoded; the text query is then matched on the decoded records
//! ([`text`]).

pub mod text;

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::Int64Type;
use weft_storage::Store;
use weft_storage::model::{LogRecord, TenantId, TraceId};
use weft_storage::scan::logs::{col, dim};
use weft_storage::store::{LogScan, TextHits};

use crate::error::QueryError;
pub use text::TextQuery;

/// What a log search asks.
#[derive(Clone, Debug, Default)]
pub struct LogSearch {
    pub q: Option<TextQuery>,
    /// Records at or after this time (Unix ns).
    pub start: Option<u64>,
    /// Records before this time (Unix ns).
    pub end: Option<u64>,
    pub service: Option<String>,
    /// The least severity number (`warn` = 13: WARN, ERROR and FATAL records).
    pub min_severity: Option<i32>,
    pub limit: usize,
    pub cursor: Option<LogCursor>,
}

/// A record's place in the newest-first order: time, then observed time, then a digest of its
/// body and ids, all descending. Opaque text to clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LogCursor {
    pub time: u64,
    pub observed: u64,
    pub digest: u64,
}

impl LogCursor {
    pub fn of(l: &LogRecord) -> Self {
        Self::from_parts(
            l.time.0,
            l.observed_time.0,
            l.body_text().as_deref(),
            l.trace_id.as_ref().map(|t| &t.0[..]),
            l.span_id.as_ref().map(|s| &s.0[..]),
        )
    }

    /// The cursor of a record from the columns it is made of (so that a block's records are
    /// ordered before any is decoded whole).
    pub fn from_parts(
        time: u64,
        observed: u64,
        body: Option<&str>,
        trace: Option<&[u8]>,
        span: Option<&[u8]>,
    ) -> Self {
        let mut h = std::hash::DefaultHasher::new();
        (body, trace, span).hash(&mut h);
        Self {
            time,
            observed,
            digest: h.finish(),
        }
    }

    pub fn encode(&self) -> String {
        format!("{:x}-{:x}-{:x}", self.time, self.observed, self.digest)
    }

    pub fn decode(text: &str) -> Result<Self, QueryError> {
        let bad = || QueryError::InvalidParameter {
            param: "cursor",
            detail: format!("{text:?} is not a cursor returned by this API"),
        };
        let mut parts = text.split('-').map(|p| u64::from_str_radix(p, 16));
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(Ok(time)), Some(Ok(observed)), Some(Ok(digest)), None) => Ok(Self {
                time,
                observed,
                digest,
            }),
            _ => Err(bad()),
        }
    }
}

/// A page of records, newest first, and where the next page starts.
#[derive(Debug)]
pub struct LogPage {
    pub logs: Vec<LogRecord>,
    pub next_cursor: Option<LogCursor>,
}

/// Severity names as the least severity number they stand for.
pub fn severity_number(name: &str) -> Option<i32> {
    Some(match name.to_ascii_lowercase().as_str() {
        "trace" => 1,
        "debug" => 5,
        "info" => 9,
        "warn" | "warning" => 13,
        "error" => 17,
        "fatal" => 21,
        n => return n.parse().ok().filter(|n| (1..=24).contains(n)),
    })
}

pub fn search_logs(
    store: &Store,
    tenant: &TenantId,
    req: &LogSearch,
) -> Result<LogPage, QueryError> {
    let snapshot = store.log_snapshot(tenant)?;
    let scan = LogScan {
        from: req.start,
        to: req.end.map(|e| e.saturating_sub(1)),
        terms: req
            .service
            .iter()
            .map(|s| (dim::SERVICE, vec![s.clone()]))
            .collect(),
        columns: PICK_COLUMNS.to_vec(),
        ..Default::default()
    };
    // the text index is asked one window at a time, as the walk reaches it: a page is most
    // often settled within the newest window
    let query = match &req.q {
        Some(q) => Some(q.to_tantivy(store.text_fields())?),
        None => None,
    };
    let exact = req.q.as_ref().is_some_and(TextQuery::index_exact);
    let mut windows: HashMap<u64, Option<std::sync::Arc<TextHits>>> = HashMap::new();
    let keep = |l: &LogRecord| {
        req.min_severity.is_none_or(|m| l.severity_number >= m)
            && req.cursor.is_none_or(|c| LogCursor::of(l) < c)
            && req
                .q
                .as_ref()
                .is_none_or(|q| q.matches(l, &text::words(&text::body_text(l))))
    };
    let mut found: Vec<(LogCursor, Found)> = snapshot
        .head
        .rows()
        .filter(|l| scan.matches_row(l) && keep(l))
        .map(|l| (LogCursor::of(l), Found::Record(Box::new(l.clone()))))
        .collect();
    let mut blocks: Vec<_> = snapshot.blocks.iter().collect();
    blocks.sort_by_key(|(_, meta)| Reverse(meta.max_start));
    let limit = req.limit.max(1);
    // one record past the page tells whether there is a next page
    let need = limit + 1;
    let body_only = req.q.as_ref().is_none_or(TextQuery::body_only);
    for (b, (addr, meta)) in blocks.iter().enumerate() {
        if found.len() >= need {
            found.sort_by_key(|(c, _)| Reverse(*c));
            found.truncate(need);
            // no record of this block (or an older one) can be newer than the last one kept
            if found[need - 1].0.time > meta.max_start {
                break;
            }
        }
        if req.cursor.is_some_and(|c| meta.min_start > c.time) {
            continue; // every record of the block is on earlier pages
        }
        let in_window;
        let scan = match &query {
            Some(query) => {
                let hits = match windows.get(&addr.window) {
                    Some(hits) => hits.clone(),
                    None => {
                        let mut hits = TextHits {
                            exact,
                            ..Default::default()
                        };
                        let any =
                            add_window(store, tenant, addr.window, query.as_ref(), &mut hits)?;
                        let hits = any.then(|| std::sync::Arc::new(hits));
                        windows.insert(addr.window, hits.clone());
                        hits
                    }
                };
                in_window = LogScan {
                    text: hits,
                    ..scan.clone()
                };
                &in_window
            }
            None => &scan,
        };
        if body_only {
            if let Some((rows, columns)) =
                store.block_log_columns(tenant, &snapshot, **addr, meta, scan)?
            {
                pick_rows(req, b, &rows, &columns, &mut found)?;
            }
        } else {
            for l in store.block_logs(tenant, &snapshot, **addr, meta, scan)? {
                if keep(&l) {
                    found.push((LogCursor::of(&l), Found::Record(Box::new(l))));
                }
            }
        }
    }
    found.sort_by_key(|(c, _)| Reverse(*c));
    let more = found.len() > limit;
    found.truncate(limit);
    let next_cursor = more.then(|| found.last().map(|(c, _)| *c)).flatten();
    // only the page's records are decoded whole, a block at a time
    let mut wanted: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    for (_, f) in &found {
        if let Found::Row(b, row) = f {
            wanted.entry(*b).or_default().push(*row);
        }
    }
    let mut decoded: HashMap<(usize, u32), LogRecord> = HashMap::new();
    for (b, mut rows) in wanted {
        rows.sort_unstable();
        let (addr, meta) = blocks[b];
        let records = store.block_log_rows(tenant, *addr, meta, &rows)?;
        decoded.extend(rows.into_iter().map(|r| (b, r)).zip(records));
    }
    let logs = found
        .into_iter()
        .filter_map(|(_, f)| match f {
            Found::Record(l) => Some(*l),
            Found::Row(b, row) => decoded.remove(&(b, row)),
        })
        .collect();
    Ok(LogPage { logs, next_cursor })
}

/// The rows of a snapshot's blocks that a text query matches, from the text index of each
/// window with blocks that the scan's time range reaches (`None` when no such window has an
/// index).
pub fn text_hits(
    store: &Store,
    tenant: &TenantId,
    snapshot: &weft_storage::store::Snapshot<LogRecord>,
    scan: &LogScan,
    q: &TextQuery,
) -> Result<Option<std::sync::Arc<TextHits>>, QueryError> {
    let windows: std::collections::BTreeSet<u64> = snapshot
        .blocks
        .iter()
        .filter(|(_, m)| {
            scan.from.is_none_or(|f| m.max_start >= f) && scan.to.is_none_or(|t| m.min_start <= t)
        })
        .map(|(a, _)| a.window)
        .collect();
    let query = q.to_tantivy(store.text_fields())?;
    let mut hits = TextHits {
        exact: q.index_exact(),
        ..Default::default()
    };
    let mut any = false;
    for window in windows {
        any |= add_window(store, tenant, window, query.as_ref(), &mut hits)?;
    }
    Ok(any.then(|| std::sync::Arc::new(hits)))
}

/// Adds a window's hits of a query and its indexed blocks; whether the window has an index.
fn add_window(
    store: &Store,
    tenant: &TenantId,
    window: u64,
    query: &dyn tantivy::query::Query,
    hits: &mut TextHits,
) -> Result<bool, QueryError> {
    let Some(view) = store.text_view(tenant, window)? else {
        return Ok(false);
    };
    hits.rows.extend(view.hits(query)?);
    hits.indexed.extend(view.blocks.iter().copied());
    Ok(true)
}

/// The columns a block's rows are picked by before any is decoded whole.
const PICK_COLUMNS: [&str; 6] = [
    col::TIME,
    col::OBSERVED_TIME,
    col::SEVERITY_NUMBER,
    col::BODY,
    col::TRACE_ID,
    col::SPAN_ID,
];

/// A record kept for the page: whole (from the head), or a row of the `b`th block visited.
enum Found {
    Record(Box<LogRecord>),
    Row(usize, u32),
}

/// The rows of one block (given by their columns) that pass the search, as cursors.
fn pick_rows(
    req: &LogSearch,
    b: usize,
    rows: &[u32],
    columns: &RecordBatch,
    found: &mut Vec<(LogCursor, Found)>,
) -> Result<(), QueryError> {
    let column = |i: usize| columns.column(i);
    let bad = || QueryError::InvalidParameter {
        param: "logs",
        detail: "a log block column has an unexpected type".into(),
    };
    let time = column(0).as_primitive_opt::<Int64Type>().ok_or_else(bad)?;
    let observed = column(1).as_primitive_opt::<Int64Type>().ok_or_else(bad)?;
    let severity = column(2).as_primitive_opt::<Int64Type>().ok_or_else(bad)?;
    let body = column(3).as_string_opt::<i32>().ok_or_else(bad)?;
    let trace = column(4).as_fixed_size_binary_opt().ok_or_else(bad)?;
    let span = column(5).as_fixed_size_binary_opt().ok_or_else(bad)?;
    for (i, row) in rows.iter().enumerate() {
        if req
            .min_severity
            .is_some_and(|m| severity.value(i) < i64::from(m))
        {
            continue;
        }
        let text = body.is_valid(i).then(|| body.value(i));
        // the query first: most rows fail it, and need no cursor
        if req
            .q
            .as_ref()
            .is_some_and(|q| !q.matches_body(text.unwrap_or("")))
        {
            continue;
        }
        let cursor = LogCursor::from_parts(
            time.value(i) as u64,
            observed.value(i) as u64,
            text,
            trace.is_valid(i).then(|| trace.value(i)),
            span.is_valid(i).then(|| span.value(i)),
        );
        if req.cursor.is_some_and(|c| cursor >= c) {
            continue;
        }
        found.push((cursor, Found::Row(b, *row)));
    }
    Ok(())
}

/// Every record of a trace, oldest first.
pub fn trace_logs(
    store: &Store,
    tenant: &TenantId,
    trace: &TraceId,
) -> Result<Vec<LogRecord>, QueryError> {
    Ok(store.trace_logs(tenant, trace)?)
}

#[cfg(test)]
mod tests;
