//! Reading log records: one scan over a snapshot's blocks and head rows, by time range and
//! postings terms, to Arrow columns. Head rows go through the same column builders a block is
//! written with ([`LogColumns`]), so a reader sees one kind of batch whichever it came from.

use arrow::array::{ArrayRef, AsArray, RecordBatch};

use super::*;
use crate::block::logs::{self, LogColumns, col, dim};

/// What a log scan reads: a time range (inclusive, Unix nanoseconds), the postings terms a
/// row must have (one of the terms of every dimension given), and the columns to return.
#[derive(Clone, Debug, Default)]
pub struct LogScan {
    pub from: Option<u64>,
    pub to: Option<u64>,
    /// (dimension of [`dim`], terms).
    pub terms: Vec<(&'static str, Vec<String>)>,
    /// Columns of [`col::ALL`] to return; all of them when empty.
    pub columns: Vec<&'static str>,
    /// Rows a text query matches, from the text index: a block it holds is read at those rows
    /// only.
    pub text: Option<std::sync::Arc<TextHits>>,
    /// The text query itself, as a test of a body: when given, every row returned passes it.
    /// It is run on the rows the index does not answer exactly (head rows, blocks the index
    /// does not hold, and a block's hits when they are a superset); without it the caller
    /// checks what it reads.
    pub body: Option<BodyTest>,
    /// Return batches without columns (their row counts only): `count(*)`.
    pub rows_only: bool,
}

/// A test of a record's body text (a record without a body fails it).
#[derive(Clone)]
pub struct BodyTest(pub std::sync::Arc<dyn Fn(&str) -> bool + Send + Sync>);

impl std::fmt::Debug for BodyTest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BodyTest")
    }
}

/// What the text index answered for a query: the blocks it holds and their matching rows.
#[derive(Clone, Debug, Default)]
pub struct TextHits {
    pub indexed: std::collections::HashSet<u64>,
    pub rows: HashMap<u64, RoaringBitmap>,
    /// Whether the rows are exactly those the query matches (else a superset).
    pub exact: bool,
}

impl TextHits {
    /// The matching rows of a block, `None` when the index does not hold it.
    pub fn of(&self, block: u64) -> Option<RoaringBitmap> {
        self.indexed
            .contains(&block)
            .then(|| self.rows.get(&block).cloned().unwrap_or_default())
    }
}

impl LogScan {
    fn in_range(&self, t: u64) -> bool {
        self.from.is_none_or(|f| t >= f) && self.to.is_none_or(|e| t <= e)
    }

    fn overlaps(&self, meta: &BlockMeta) -> bool {
        self.from.is_none_or(|f| meta.max_start >= f) && self.to.is_none_or(|e| meta.min_start <= e)
    }

    fn covers(&self, meta: &BlockMeta) -> bool {
        self.in_range(meta.min_start) && self.in_range(meta.max_start)
    }

    fn columns(&self) -> Vec<&'static str> {
        if self.columns.is_empty() {
            col::ALL.to_vec()
        } else {
            self.columns.clone()
        }
    }

    /// Whether a record (of the head) passes the scan's time range and terms.
    pub fn matches_row(&self, l: &LogRecord) -> bool {
        self.in_range(l.time.0)
            && self.terms.iter().all(|(d, terms)| {
                let s = &l.semantics;
                let value = match *d {
                    dim::SERVICE => Some(l.service_name()),
                    dim::SEVERITY => Some(l.severity_text.as_str()),
                    dim::EVENT_NAME => Some(l.event_name.as_str()),
                    dim::CLASS => Some(s.class.as_str()),
                    dim::MODEL => s.model.as_deref(),
                    dim::MODEL_VERSION => s.model_version.as_deref(),
                    dim::WORKER => s.worker.as_deref(),
                    dim::GPU => s.gpu.as_deref(),
                    _ => return true,
                };
                value.is_some_and(|v| terms.iter().any(|t| t == v))
            })
    }
}

impl Store {
    /// Every log record of a trace (head and blocks), oldest first, through the trace-id
    /// index (a prefix bloom filter answers "none here" without reading data).
    pub fn trace_logs(&self, tenant: &TenantId, trace: &TraceId) -> Result<Vec<LogRecord>> {
        let snapshot = self.log_snapshot(tenant)?;
        let cutoff = snapshot.cutoff.map_or(0, |c| c.0);
        let mut out: Vec<LogRecord> = snapshot
            .head
            .rows()
            .filter(|l| l.trace_id == Some(*trace))
            .cloned()
            .collect();
        for (addr, entry) in self.trace_locations_of(tenant, Signal::Logs, trace)? {
            let Some(meta) = snapshot.blocks.get(&addr) else {
                continue;
            };
            let reader = self.reader_of(tenant, Signal::Logs, addr, meta);
            out.extend(logs::read(
                &reader,
                &Rows::Range(entry.row_start, entry.rows),
            )?);
        }
        out.retain(|l| l.time.0 >= cutoff);
        out.sort_by_key(|l| (l.time, l.observed_time));
        Ok(out)
    }

    /// The log rows of a snapshot that a scan asks for, one batch per block (and one for the
    /// head), with the scan's columns under their block names.
    pub fn scan_logs(
        &self,
        tenant: &TenantId,
        snapshot: &Snapshot<LogRecord>,
        scan: &LogScan,
    ) -> Result<Vec<RecordBatch>> {
        let columns = scan.columns();
        let mut out = Vec::new();
        for (addr, meta) in snapshot.blocks.iter() {
            if let Some((_, columns)) =
                self.block_log_columns(tenant, snapshot, *addr, meta, scan)?
            {
                out.push(columns);
            }
        }
        let mut head: Vec<&LogRecord> = snapshot
            .head
            .rows()
            .filter(|l| {
                scan.matches_row(l)
                    && scan
                        .body
                        .as_ref()
                        .is_none_or(|t| l.body_text().is_some_and(|b| (t.0)(&b)))
            })
            .collect();
        if scan.rows_only {
            if !head.is_empty() {
                out.push(rows_only(head.len())?);
            }
        } else if !head.is_empty() {
            logs::sort(&mut head);
            let mut builders = LogColumns::with_capacity(head.len());
            head.iter().for_each(|l| builders.push(l));
            let arrays = builders
                .finish()
                .into_iter()
                .filter(|(name, _, _)| columns.contains(name))
                .map(|(name, array, _)| (name, array));
            let mut arrays: Vec<(&str, ArrayRef)> = arrays.collect();
            arrays.sort_by_key(|(name, _)| columns.iter().position(|c| c == name));
            out.push(batch(
                &columns,
                arrays.into_iter().map(|(_, a)| a).collect(),
            )?);
        }
        Ok(out)
    }

    /// Whole records of one block of a snapshot that pass a scan's time range and terms.
    pub fn block_logs(
        &self,
        tenant: &TenantId,
        snapshot: &Snapshot<LogRecord>,
        addr: BlockAddr,
        meta: &BlockMeta,
        scan: &LogScan,
    ) -> Result<Vec<LogRecord>> {
        if !scan.overlaps(meta) {
            return Ok(Vec::new());
        }
        match self.log_rows(tenant, snapshot, addr, meta, scan)? {
            Some(rows) => logs::read(&self.reader_of(tenant, Signal::Logs, addr, meta), &rows),
            None => Ok(Vec::new()),
        }
    }

    /// The rows of one block a scan reads (ascending) with the scan's columns of those rows:
    /// a reader picks rows from columns before decoding whole records
    /// ([`Self::block_log_rows`]). `None` when no row passes.
    pub fn block_log_columns(
        &self,
        tenant: &TenantId,
        snapshot: &Snapshot<LogRecord>,
        addr: BlockAddr,
        meta: &BlockMeta,
        scan: &LogScan,
    ) -> Result<Option<(Vec<u32>, RecordBatch)>> {
        if !scan.overlaps(meta) {
            return Ok(None);
        }
        let Some(mut rows) = self.log_rows(tenant, snapshot, addr, meta, scan)? else {
            return Ok(None);
        };
        let reader = self.reader_of(tenant, Signal::Logs, addr, meta);
        if let Some(test) = &scan.body {
            let answered = scan
                .text
                .as_ref()
                .is_some_and(|h| h.exact && h.indexed.contains(&addr.block));
            if !answered {
                let bodies = reader.required(col::BODY, &rows)?;
                let bodies = bodies
                    .as_string_opt::<i32>()
                    .ok_or_else(|| StorageError::corrupt("log body column", "not text"))?;
                let kept: RoaringBitmap = rows
                    .iter(meta.rows)
                    .zip(bodies.iter())
                    .filter(|(_, b)| b.is_some_and(|b| (test.0)(b)))
                    .map(|(r, _)| r)
                    .collect();
                if kept.is_empty() {
                    return Ok(None);
                }
                rows = Rows::Set(kept);
            }
        }
        if scan.rows_only {
            let ids: Vec<u32> = rows.iter(meta.rows).collect();
            let n = ids.len();
            return Ok(Some((ids, rows_only(n)?)));
        }
        let columns = scan.columns();
        let arrays = columns
            .iter()
            .map(|c| reader.required(c, &rows))
            .collect::<Result<Vec<_>>>()?;
        let ids = rows.iter(meta.rows).collect();
        Ok(Some((ids, batch(&columns, arrays)?)))
    }

    /// Whole records of some rows of a block, in row order.
    pub fn block_log_rows(
        &self,
        tenant: &TenantId,
        addr: BlockAddr,
        meta: &BlockMeta,
        rows: &[u32],
    ) -> Result<Vec<LogRecord>> {
        let set: RoaringBitmap = rows.iter().copied().collect();
        logs::read(
            &self.reader_of(tenant, Signal::Logs, addr, meta),
            &Rows::Set(set),
        )
    }

    /// The rows of a log block a scan reads: `None` when none.
    fn log_rows(
        &self,
        tenant: &TenantId,
        snapshot: &Snapshot<LogRecord>,
        addr: BlockAddr,
        meta: &BlockMeta,
        scan: &LogScan,
    ) -> Result<Option<Rows>> {
        let mut sets = Vec::new();
        if let Some(hits) = scan.text.as_ref().and_then(|h| h.of(addr.block)) {
            sets.push(hits);
        }
        for (d, terms) in &scan.terms {
            let postings = self.dimension_in(tenant, Signal::Logs, addr, d)?;
            sets.push(terms::rows_with_any(&postings, terms).into_owned());
        }
        let mut rows = (!sets.is_empty()).then(|| {
            terms::intersect(
                sets.into_iter().map(std::borrow::Cow::Owned).collect(),
                meta.rows,
            )
        });
        let by_time = !scan.covers(meta) || snapshot.straddles(meta);
        if by_time {
            let cutoff = snapshot.cutoff.map_or(0, |c| c.0);
            let times = self
                .reader_of(tenant, Signal::Logs, addr, meta)
                .ints(col::TIME, &Rows::All)?;
            let live: RoaringBitmap = (0..meta.rows)
                .zip(times.iter())
                .filter(|(_, t)| **t as u64 >= cutoff && scan.in_range(**t as u64))
                .map(|(r, _)| r)
                .collect();
            rows = Some(match rows {
                Some(r) => r & live,
                None => live,
            });
        }
        Ok(match rows {
            None => Some(Rows::All),
            Some(r) if r.is_empty() => None,
            Some(r) if r.len() == u64::from(meta.rows) => Some(Rows::All),
            Some(r) => Some(Rows::Set(r)),
        })
    }
}

/// A batch of `n` rows and no columns.
fn rows_only(n: usize) -> Result<RecordBatch> {
    RecordBatch::try_new_with_options(
        std::sync::Arc::new(arrow::datatypes::Schema::empty()),
        Vec::new(),
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(n)),
    )
    .map_err(|e| StorageError::corrupt("log columns", e.to_string()))
}

fn batch(columns: &[&'static str], arrays: Vec<ArrayRef>) -> Result<RecordBatch> {
    RecordBatch::try_from_iter(columns.iter().copied().zip(arrays))
        .map_err(|e| StorageError::corrupt("log columns", e.to_string()))
}
