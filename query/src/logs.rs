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
use std::hash::{Hash, Hasher};

use weft_storage::Store;
use weft_storage::block::logs::dim;
use weft_storage::model::{LogRecord, TenantId, TraceId};
use weft_storage::store::LogScan;

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
/// content, all descending. Opaque text to clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LogCursor {
    pub time: u64,
    pub observed: u64,
    pub digest: u64,
}

impl LogCursor {
    pub fn of(l: &LogRecord) -> Self {
        let mut h = std::hash::DefaultHasher::new();
        l.digest().hash(&mut h);
        Self {
            time: l.time.0,
            observed: l.observed_time.0,
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
    let snapshot = store.log_snapshot(tenant);
    let scan = LogScan {
        from: req.start,
        to: req.end.map(|e| e.saturating_sub(1)),
        terms: req
            .service
            .iter()
            .map(|s| (dim::SERVICE, vec![s.clone()]))
            .collect(),
        columns: Vec::new(),
    };
    let keep = |l: &LogRecord| {
        req.min_severity.is_none_or(|m| l.severity_number >= m)
            && req.cursor.is_none_or(|c| LogCursor::of(l) < c)
            && req
                .q
                .as_ref()
                .is_none_or(|q| q.matches(l, &text::words(&text::body_text(l))))
    };
    let mut found: Vec<(LogCursor, LogRecord)> = snapshot
        .head
        .rows()
        .filter(|l| scan.matches_row(l) && keep(l))
        .map(|l| (LogCursor::of(l), l.clone()))
        .collect();
    let mut blocks: Vec<_> = snapshot.blocks.iter().collect();
    blocks.sort_by_key(|(_, meta)| Reverse(meta.max_start));
    let limit = req.limit.max(1);
    // one record past the page tells whether there is a next page
    let need = limit + 1;
    for (addr, meta) in blocks {
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
        for l in store.block_logs(tenant, &snapshot, *addr, meta, &scan)? {
            if keep(&l) {
                found.push((LogCursor::of(&l), l));
            }
        }
    }
    found.sort_by_key(|(c, _)| Reverse(*c));
    let more = found.len() > limit;
    found.truncate(limit);
    let next_cursor = more.then(|| found.last().map(|(c, _)| *c)).flatten();
    Ok(LogPage {
        logs: found.into_iter().map(|(_, l)| l).collect(),
        next_cursor,
    })
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
