//! Reads rows of a block back: decodes only the column chunks asked for, and of those only the
//! pages holding the selected rows, then puts spans back together losslessly.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BooleanArray, FixedSizeBinaryArray, Float64Array,
    Int64Array, ListArray, StringArray, StringViewArray, UInt32Array,
};
use arrow::buffer::ScalarBuffer;
use arrow::datatypes::DataType;
use bytes::Bytes;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, RowSelection, RowSelector};
use roaring::RoaringBitmap;

use super::format::{
    BlockMeta, ColumnKind, PAGE_ROWS, Transform, as_string_views, decode_chunk_with, load_metadata,
};
use super::packed;
use super::writer::{col, millis};
use crate::codec::Reader;
use crate::error::{Result, StorageError};
use crate::model::*;
use crate::schema::{ColumnType, DEDICATED, DIM_KIND, DIM_NAME, DIM_SERVICE, DIM_STATUS};

/// Rows of a block to read.
#[derive(Clone, Debug)]
pub enum Rows {
    All,
    Range(u32, u32),
    Set(RoaringBitmap),
}

impl Rows {
    /// The rows of `self` that are in `keep`.
    pub fn intersect(&self, keep: &RoaringBitmap) -> RoaringBitmap {
        match self {
            Rows::All => keep.clone(),
            Rows::Range(start, len) => {
                let mut range = RoaringBitmap::new();
                range.insert_range(*start..start + len);
                range & keep
            }
            Rows::Set(set) => set & keep,
        }
    }

    fn selection(&self, total: u32) -> Option<RowSelection> {
        match self {
            Rows::All => None,
            Rows::Range(start, len) => Some(RowSelection::from(vec![
                RowSelector::skip(*start as usize),
                RowSelector::select(*len as usize),
                RowSelector::skip(total.saturating_sub(start + len) as usize),
            ])),
            Rows::Set(set) => {
                // runs of consecutive rows become one selector each
                let mut sel = Vec::new();
                let mut at = 0u32;
                let mut run: Option<(u32, u32)> = None;
                for row in set.iter().filter(|r| *r < total) {
                    match &mut run {
                        Some((_, end)) if *end == row => *end += 1,
                        _ => {
                            if let Some((start, end)) = run.take() {
                                if start > at {
                                    sel.push(RowSelector::skip((start - at) as usize));
                                }
                                sel.push(RowSelector::select((end - start) as usize));
                                at = end;
                            }
                            run = Some((row, row + 1));
                        }
                    }
                }
                if let Some((start, end)) = run {
                    if start > at {
                        sel.push(RowSelector::skip((start - at) as usize));
                    }
                    sel.push(RowSelector::select((end - start) as usize));
                    at = end;
                }
                sel.push(RowSelector::skip(total.saturating_sub(at) as usize));
                Some(RowSelection::from(sel))
            }
        }
    }

    /// The row numbers, ascending, of a block of `total` rows.
    pub fn iter(&self, total: u32) -> Box<dyn Iterator<Item = u32> + '_> {
        match self {
            Rows::All => Box::new(0..total),
            Rows::Range(start, len) => Box::new(*start..start + len),
            Rows::Set(set) => Box::new(set.iter()),
        }
    }

    pub fn len(&self, total: u32) -> usize {
        match self {
            Rows::All => total as usize,
            Rows::Range(_, len) => *len as usize,
            Rows::Set(s) => s.len() as usize,
        }
    }
}

/// Fetches a column chunk's bytes by column name.
pub trait ChunkSource {
    fn chunk(&self, column: &str) -> Result<Option<Bytes>>;
    /// A chunk's parsed footer, if the source keeps them.
    fn metadata(&self, _column: &str) -> Option<ArrowReaderMetadata> {
        None
    }
    /// Offers a chunk's parsed footer for keeping.
    fn remember(&self, _column: &str, _metadata: &ArrowReaderMetadata) {}
    /// The block's trace runs (from its trace summaries), if the source has them: start times
    /// are rebuilt and trace ids read from them instead of from the trace-id chunk.
    fn trace_runs(&self) -> Result<Option<Arc<TraceRuns>>> {
        Ok(None)
    }
    /// Every term of one of the block's postings dimensions with its rows, if the source has
    /// them: a few rows of an indexed string column are then read from its postings.
    fn postings(&self, _dim: &str) -> Result<Option<Arc<Postings>>> {
        Ok(None)
    }
    /// The block's minority rows decoded, if the source keeps them decoded (sources that do
    /// override this; the reader then decodes its chunk itself).
    fn minority_rows(&self) -> Result<Option<Arc<MinorityRows>>> {
        Ok(None)
    }
    /// The runs of terms of one of the block's postings dimensions (see [`TermRuns`]), if its
    /// rows hold one term each; sources that keep them override this to build them once.
    fn term_runs(&self, dim: &str) -> Result<Option<Arc<TermRuns>>> {
        Ok(self
            .postings(dim)?
            .and_then(|p| TermRuns::of(&p))
            .map(Arc::new))
    }
}

/// Where each row of a row set is in it: a table over the set's span when the set is dense
/// there, else its rows in order, searched (a bitmap's own `rank` walks its containers per row).
pub enum Positions {
    Dense { first: u32, at: Vec<u32> },
    Sparse(Vec<u32>),
}

impl Positions {
    pub fn of(set: &RoaringBitmap) -> Self {
        let (first, last) = (set.min().unwrap_or(0), set.max().unwrap_or(0));
        let span = u64::from(last - first) + 1;
        if set.len() * 8 >= span {
            let mut at = vec![0u32; span as usize];
            for (i, row) in set.iter().enumerate() {
                at[(row - first) as usize] = i as u32;
            }
            Self::Dense { first, at }
        } else {
            Self::Sparse(set.iter().collect())
        }
    }

    /// The position of a row of the set.
    pub fn of_row(&self, row: u32) -> usize {
        match self {
            Self::Dense { first, at } => at[(row - first) as usize] as usize,
            Self::Sparse(rows) => rows.partition_point(|&r| r < row),
        }
    }
}

/// One dimension's postings of a block: each term with its rows.
pub type Postings = Vec<(String, RoaringBitmap)>;

/// Most terms a dimension may have for [`BlockReader::indexed_strings`] to answer from it:
/// each term costs an intersection with the asked rows.
const INDEXED_READ_TERMS: usize = 64;

/// The runs of rows of one trace in a block (rows are sorted by trace): the first row of each
/// run, ascending, and its trace id.
#[derive(Debug, Default)]
pub struct TraceRuns {
    pub starts: Vec<u32>,
    pub ids: Vec<TraceId>,
}

impl TraceRuns {
    pub fn new(mut runs: Vec<(u32, TraceId)>) -> Self {
        runs.sort_unstable_by_key(|r| r.0);
        let (starts, ids) = runs.into_iter().unzip();
        Self { starts, ids }
    }

    /// The run index of each of the given rows (ascending).
    pub fn runs_of(&self, rows: impl Iterator<Item = u32>) -> Vec<u32> {
        run_of_each(&self.starts, rows)
            .map(|(_, run)| run as u32)
            .collect()
    }
}

/// What [`BlockReader::parent_rows`] gives a row whose parent is not in the block.
pub const NO_PARENT: u32 = u32::MAX;

/// Where some rows of a block sit among its traces (see [`BlockReader::parent_rows`]).
pub struct ParentRows {
    pub runs: Arc<TraceRuns>,
    /// Each row's run (an index into `runs`).
    pub of_run: Vec<u32>,
    /// Each row's parent row, or [`NO_PARENT`].
    pub parents: Vec<u32>,
}

/// Each of `rows` (ascending) with the index of the last of `starts` (ascending) at or before
/// it (0 when none is): the next start is checked first (rows read in full), then the rest is
/// searched (a few rows picked out of thousands of runs by an index).
fn run_of_each<'s>(
    starts: &'s [u32],
    rows: impl Iterator<Item = u32> + 's,
) -> impl Iterator<Item = (u32, usize)> + 's {
    let mut run = 0usize;
    rows.map(move |row| {
        if starts.get(run + 1).is_some_and(|&s| s <= row) {
            run = gallop(starts, run + 1, |&s| s <= row) - 1;
        }
        (row, run)
    })
}

/// The first index at or after `from` where `before` stops holding (it holds on a prefix of
/// `items[from..]`), found by probing 1, 2, 4, … ahead and then searching the last step: the
/// cost grows with the distance moved, so a walk over ascending rows costs what it skips, not
/// a search of the whole rest at every row.
fn gallop<T>(items: &[T], from: usize, before: impl Fn(&T) -> bool) -> usize {
    let (mut lo, mut step) = (from, 1usize);
    while lo + step <= items.len() && before(&items[lo + step - 1]) {
        lo += step;
        step *= 2;
    }
    let hi = (lo + step).min(items.len());
    lo + items[lo..hi].partition_point(before)
}

/// Which term of one postings dimension each row of a block holds, as runs of rows sorted by
/// their first row: a dimension's value of many rows is then found by one walk over the rows,
/// not by intersecting every term's rows with them (a cost that grows with the terms and, on
/// bigger blocks, with the rows of each). Request dimensions come in long runs (a request's
/// spans are consecutive rows and share its values), so this is a few runs per trace.
#[derive(Debug, Default)]
pub struct TermRuns {
    starts: Vec<u32>,
    /// One past the last row of each run.
    ends: Vec<u32>,
    terms: Vec<u32>,
}

impl TermRuns {
    /// The runs of `postings`; `None` when two terms claim one row (a dimension holding several
    /// values per row), which runs cannot say.
    pub fn of(postings: &Postings) -> Option<Self> {
        let mut runs: Vec<(u32, u32, u32)> = Vec::new();
        for (t, (_, rows)) in postings.iter().enumerate() {
            let mut current: Option<(u32, u32)> = None;
            for row in rows {
                current = match current {
                    Some((start, end)) if end == row => Some((start, row + 1)),
                    Some((start, end)) => {
                        runs.push((start, end, t as u32));
                        Some((row, row + 1))
                    }
                    None => Some((row, row + 1)),
                };
            }
            if let Some((start, end)) = current {
                runs.push((start, end, t as u32));
            }
        }
        runs.sort_unstable_by_key(|r| r.0);
        if runs.windows(2).any(|w| w[0].1 > w[1].0) {
            return None;
        }
        let mut out = Self {
            starts: Vec::with_capacity(runs.len()),
            ends: Vec::with_capacity(runs.len()),
            terms: Vec::with_capacity(runs.len()),
        };
        for (start, end, term) in runs {
            out.starts.push(start);
            out.ends.push(end);
            out.terms.push(term);
        }
        Some(out)
    }

    /// Bytes held, for a cache's weight.
    pub fn weight(&self) -> usize {
        self.starts.len() * 12 + 64
    }

    /// The term of each of `rows` (ascending), given to `put` with the row's position; rows
    /// holding none are left out.
    fn terms_of(&self, rows: impl Iterator<Item = u32>, mut put: impl FnMut(usize, u32)) {
        for (at, (row, run)) in run_of_each(&self.starts, rows).enumerate() {
            if self.starts.get(run).is_some_and(|&s| s <= row) && row < self.ends[run] {
                put(at, self.terms[run]);
            }
        }
    }
}

pub struct BlockReader<'a, S: ChunkSource> {
    pub meta: &'a BlockMeta,
    source: S,
    /// The filter of the first dense row set read (a reader mostly reads one row set).
    mask: std::sync::OnceLock<(RoaringBitmap, BooleanArray)>,
    /// The block's minority rows (its `minor_rows` chunk), once read: listed and as a set.
    minority: std::sync::OnceLock<Arc<MinorityRows>>,
}

/// A block's minority rows (see the writer's `minority_rows`): ascending, and as a set.
#[derive(Debug)]
pub struct MinorityRows {
    pub listed: Vec<i64>,
    pub set: RoaringBitmap,
}

impl MinorityRows {
    /// Decoded from the block's `minor_rows` chunk.
    pub fn of_chunk(bytes: &[u8]) -> Result<Self> {
        let listed = packed::Packed::parse(bytes)?.all()?;
        let set = RoaringBitmap::from_sorted_iter(listed.iter().map(|&r| r as u32))
            .map_err(|e| StorageError::corrupt("block", format!("minority rows: {e}")))?;
        Ok(Self { listed, set })
    }

    /// Bytes held, for a cache's budget.
    pub fn weight(&self) -> usize {
        self.listed.len() * 8 + self.set.serialized_size()
    }
}

pub(crate) fn downcast<'b, T: 'static>(a: &'b ArrayRef, column: &str) -> Result<&'b T> {
    a.as_any().downcast_ref::<T>().ok_or_else(|| {
        StorageError::corrupt(
            "column chunk",
            format!("{column}: unexpected type {}", a.data_type()),
        )
    })
}

impl<'a, S: ChunkSource> BlockReader<'a, S> {
    pub fn new(meta: &'a BlockMeta, source: S) -> Self {
        Self {
            meta,
            source,
            mask: std::sync::OnceLock::new(),
            minority: std::sync::OnceLock::new(),
        }
    }

    /// A chunk as stored (one that is not an Arrow column, such as the block's rollup).
    pub fn raw_chunk(&self, name: &str) -> Result<Option<Bytes>> {
        self.source.chunk(name)
    }

    /// Decodes one column for the given rows; `None` when the block has no such column.
    pub fn column(&self, name: &str, rows: &Rows) -> Result<Option<ArrayRef>> {
        self.column_with(name, rows, None, false)
    }

    /// A string column as string views (see [`as_string_views`]).
    pub fn string_views(&self, name: &str, rows: &Rows) -> Result<Option<ArrayRef>> {
        self.column_with(name, rows, None, true)
    }

    /// `listed`: the rows of a `Rows::Set`, listed by a caller that walks them several times
    /// (a bit-packed chunk reads them from the list rather than the bitmap).
    fn column_with(
        &self,
        name: &str,
        rows: &Rows,
        listed: Option<&[u32]>,
        views: bool,
    ) -> Result<Option<ArrayRef>> {
        let Some(column) = self.meta.column(name) else {
            return Ok(None);
        };
        if column.minority {
            return self.minority_column(name, rows, views).map(Some);
        }
        let bytes = self.required_chunk(name)?;
        if packed::is_packed(&bytes) {
            return self.packed(name, &bytes, rows, listed).map(Some);
        }
        let metadata = self.parquet_metadata(name, &bytes, views)?;
        // A set of most of the block: decoding it whole and filtering beats a selection of
        // thousands of short runs.
        let dense = match rows {
            Rows::Set(set) => set.len() * 2 > u64::from(self.meta.rows),
            _ => false,
        };
        let selection = if dense {
            None
        } else {
            rows.selection(self.meta.rows)
        };
        let (mut array, _) = decode_chunk_with(bytes, selection, Some(metadata))?;
        if let (true, Rows::Set(set)) = (dense, rows) {
            let mask = self.mask_of(set);
            if mask.len() == array.len() {
                array = arrow::compute::filter(&array, &mask)?;
            }
        }
        if array.len() != rows.len(self.meta.rows) {
            return Err(StorageError::corrupt(
                "column chunk",
                format!("{name}: wrong row count"),
            ));
        }
        Ok(Some(array))
    }

    /// A chunk the block's meta names; its absence is corruption.
    fn required_chunk(&self, name: &str) -> Result<Bytes> {
        self.source
            .chunk(name)?
            .ok_or_else(|| StorageError::corrupt("block", format!("column chunk {name} missing")))
    }

    /// A Parquet chunk's footer, parsed once and kept by the source where it keeps them
    /// (`views`: text columns read as string views).
    fn parquet_metadata(
        &self,
        name: &str,
        bytes: &Bytes,
        views: bool,
    ) -> Result<ArrowReaderMetadata> {
        let metadata = match self.source.metadata(name) {
            Some(m) => m,
            None => {
                let m = load_metadata(bytes)?;
                self.source.remember(name, &m);
                m
            }
        };
        if views {
            as_string_views(&metadata)
        } else {
            Ok(metadata)
        }
    }

    /// The block's minority rows, ascending (see the writer's `minority_rows`), and as a set.
    fn minority(&self) -> Result<&MinorityRows> {
        if let Some(m) = self.minority.get() {
            return Ok(m);
        }
        let rows = match self.source.minority_rows()? {
            Some(rows) => rows,
            None => Arc::new(MinorityRows::of_chunk(
                &self.required_chunk(col::MINOR_ROWS)?,
            )?),
        };
        Ok(self.minority.get_or_init(|| rows))
    }

    /// Each of `rows`' place among the minority rows, `None` for a row that is not one: only
    /// the asked rows that are minority rows are visited (a scan of token rows visits none).
    fn minority_places(&self, rows: &Rows) -> Result<Vec<Option<u32>>> {
        let MinorityRows { listed, set } = self.minority()?;
        let mut places = vec![None; rows.len(self.meta.rows)];
        let hits = rows.intersect(set);
        // each hit's place among the minority rows: a walk, as both ascend
        let mut at = 0usize;
        let mut place_of = |row: u32| {
            at = gallop(listed, at, |&r| r < i64::from(row));
            Some(at as u32)
        };
        match rows {
            Rows::All => hits.iter().for_each(|r| places[r as usize] = place_of(r)),
            Rows::Range(start, _) => hits
                .iter()
                .for_each(|r| places[(r - start) as usize] = place_of(r)),
            // a few hits among many rows: each found by its rank in the set
            Rows::Set(asked) if hits.len() * 16 < asked.len() => hits
                .iter()
                .for_each(|r| places[(asked.rank(r) - 1) as usize] = place_of(r)),
            Rows::Set(asked) => {
                let mut hits = hits.iter().peekable();
                for (i, row) in asked.iter().enumerate() {
                    if hits.next_if_eq(&row).is_some() {
                        places[i] = place_of(row);
                    }
                }
            }
        }
        Ok(places)
    }

    /// A column kept over the minority rows alone (see [`ColumnMeta::minority`]): the asked
    /// rows that are minority rows read their places in the chunk, the others are null.
    fn minority_column(&self, name: &str, rows: &Rows, views: bool) -> Result<ArrayRef> {
        let places = self.minority_places(rows)?;
        let total = self.minority()?.listed.len() as u32;
        let bytes = self.required_chunk(name)?;
        let metadata = self.parquet_metadata(name, &bytes, views)?;
        let wanted = RoaringBitmap::from_sorted_iter(places.iter().flatten().copied())
            .map_err(|e| StorageError::corrupt("block", format!("minority places: {e}")))?;
        if wanted.is_empty() {
            // no asked row holds a value (token rows only, or no rows)
            let field = metadata.schema().fields().first().cloned().ok_or_else(|| {
                StorageError::corrupt("column chunk", format!("{name}: no column"))
            })?;
            return Ok(arrow::array::new_null_array(
                field.data_type(),
                places.len(),
            ));
        }
        let dense = wanted.len() * 2 > u64::from(total);
        let (selection, picks): (Option<RowSelection>, UInt32Array) = if dense {
            // decoded whole: each asked row takes its place
            (None, places.iter().copied().collect())
        } else {
            // decoded for the wanted places only, in order: the k-th place held is value k
            let mut k = 0u32;
            let picks = places
                .iter()
                .map(|p| {
                    p.map(|_| {
                        k += 1;
                        k - 1
                    })
                })
                .collect();
            (Rows::Set(wanted.clone()).selection(total), picks)
        };
        let (array, _) = decode_chunk_with(bytes, selection, Some(metadata))?;
        let expect = if dense {
            total as usize
        } else {
            wanted.len() as usize
        };
        if array.len() != expect {
            return Err(StorageError::corrupt(
                "column chunk",
                format!("{name}: {} rows for {expect} minority rows", array.len()),
            ));
        }
        Ok(arrow::compute::take(&array, &picks, None)?)
    }

    /// The given rows of a bit-packed chunk: a few rows are read one by one, most of the
    /// block whole and then picked.
    fn packed(
        &self,
        name: &str,
        bytes: &[u8],
        rows: &Rows,
        listed: Option<&[u32]>,
    ) -> Result<ArrayRef> {
        let chunk = packed::Packed::parse(bytes)?;
        let total = self.meta.rows;
        if chunk.rows() != total {
            return Err(StorageError::corrupt(
                "column chunk",
                format!("{name}: {} rows in a block of {total}", chunk.rows()),
            ));
        }
        let values = match (rows, listed) {
            (Rows::All, _) => chunk.all()?,
            (Rows::Range(start, len), _) => chunk.pick(*start..start + len)?,
            (Rows::Set(set), Some(list)) => pick_packed(&chunk, list.iter().copied(), set.len())?,
            (Rows::Set(set), None) => pick_packed(&chunk, set.iter(), set.len())?,
        };
        if values.len() != rows.len(total) {
            return Err(StorageError::corrupt(
                "column chunk",
                format!("{name}: wrong row count"),
            ));
        }
        Ok(Arc::new(Int64Array::from(values)))
    }

    /// A filter keeping the rows of a dense set, built once per reader for its first set.
    fn mask_of(&self, set: &RoaringBitmap) -> BooleanArray {
        let build = || {
            // walk the smaller side: set the kept rows, or clear the left-out ones
            let total = self.meta.rows;
            let mut keep;
            if set.len() * 2 > u64::from(total) {
                let mut left_out = RoaringBitmap::new();
                left_out.insert_range(0..total);
                left_out -= set;
                keep = vec![true; total as usize];
                for r in &left_out {
                    keep[r as usize] = false;
                }
            } else {
                keep = vec![false; total as usize];
                for r in set.iter().filter(|r| *r < total) {
                    keep[r as usize] = true;
                }
            }
            (set.clone(), BooleanArray::from(keep))
        };
        let cached = self.mask.get_or_init(build);
        if &cached.0 == set {
            cached.1.clone()
        } else {
            build().1
        }
    }

    /// A column the block must have; its absence is corruption.
    pub(crate) fn required(&self, name: &str, rows: &Rows) -> Result<ArrayRef> {
        self.required_listed(name, rows, None)
    }

    fn required_listed(&self, name: &str, rows: &Rows, listed: Option<&[u32]>) -> Result<ArrayRef> {
        self.column_with(name, rows, listed, false)?
            .ok_or_else(|| StorageError::corrupt("block", format!("core column {name} missing")))
    }

    /// The block's trace runs, when the source has its summaries.
    pub fn trace_runs(&self) -> Result<Option<Arc<TraceRuns>>> {
        self.source.trace_runs()
    }

    /// Trace ids of the given rows.
    pub fn trace_ids(&self, rows: &Rows) -> Result<Vec<TraceId>> {
        let a = self.required(col::TRACE_ID, rows)?;
        let a = downcast::<FixedSizeBinaryArray>(&a, col::TRACE_ID)?;
        Ok(a.iter()
            .map(|v| TraceId::from_slice(v.unwrap_or_default()).unwrap_or_default())
            .collect())
    }

    /// The span-id column of the given rows. A few rows that each have a child in their
    /// trace's rows (generate spans, with their prefill and token spans) are read from a child's
    /// parent id: the parent chunk is a small dictionary, the span-id chunk 8 random bytes a row,
    /// the block's largest, read whole from the store for any row of it.
    pub fn span_id_column(&self, rows: &Rows) -> Result<ArrayRef> {
        if let Rows::Set(set) = rows
            && self.few(set.len())
            && let Some(children) = self.a_child_of_each(set)?
        {
            // children ascending for the read, then put back in the asked rows' order
            let mut order: Vec<(u32, u32)> = children
                .iter()
                .enumerate()
                .map(|(i, &c)| (c, i as u32))
                .collect();
            order.sort_unstable();
            let read: RoaringBitmap = order.iter().map(|(c, _)| *c).collect();
            let parents = self.required(col::PARENT_SPAN_ID, &Rows::Set(read))?;
            let mut at = vec![0u32; children.len()];
            for (position, (_, asked)) in order.iter().enumerate() {
                at[*asked as usize] = position as u32;
            }
            return Ok(arrow::compute::take(
                &parents,
                &UInt32Array::from(at),
                None,
            )?);
        }
        self.required(col::SPAN_ID, rows)
    }

    /// For each of `set` (ascending), a row of its trace in this block whose parent it is, by
    /// the block's parent ranks (see [`col::PARENT_RANK`]); `None` when the block has no ranks
    /// or trace runs, or when some row of `set` has no child here.
    fn a_child_of_each(&self, set: &RoaringBitmap) -> Result<Option<Vec<u32>>> {
        if self.meta.column(col::PARENT_RANK).is_none() {
            return Ok(None);
        }
        let Some(runs) = self.source.trace_runs()? else {
            return Ok(None);
        };
        let total = self.meta.rows;
        // the runs of the asked rows (ascending, each once), and where each begins among the
        // ranks read: only their pages are decoded
        let mut runs_read: Vec<(u32, u32, usize)> = Vec::new();
        let mut of_row = Vec::with_capacity(set.len() as usize);
        let mut read = RoaringBitmap::new();
        for (row, run) in run_of_each(&runs.starts, set.iter()) {
            let start = runs.starts.get(run).copied().unwrap_or(0);
            let end = runs
                .starts
                .get(run + 1)
                .copied()
                .unwrap_or(total)
                .min(total);
            if runs_read.last().is_none_or(|r| r.0 != start) {
                let at = runs_read.last().map_or(0, |r| r.2 + (r.1 - r.0) as usize);
                runs_read.push((start, end, at));
                read.insert_range(start..end);
            }
            of_row.push((row, runs_read.len() - 1));
        }
        let (rows, ranks) = self.parent_ranks(&read)?;
        let mut children = Vec::with_capacity(set.len() as usize);
        for (row, run) in of_row {
            let (start, end, at) = runs_read[run];
            // where row `r` of this run is among the ranks read
            let place = |r: u32| match rows {
                Rows::All => r as usize,
                _ => at + (r - start) as usize,
            };
            let rank = i64::from(row - start) + 1;
            // children start after their parent: look there first
            let child = (row + 1..end)
                .chain(start..row)
                .find(|&c| ranks[place(c)] == rank);
            match child {
                Some(c) => children.push(c),
                None => return Ok(None),
            }
        }
        Ok(Some(children))
    }

    /// The parent ranks of `set`'s rows, with the rows read: the whole block when `set` is
    /// most of it (a run-length chunk decodes whole for less than a selection of many runs).
    fn parent_ranks(&self, set: &RoaringBitmap) -> Result<(Rows, ScalarBuffer<i64>)> {
        let total = self.meta.rows;
        let rows = if set.len() * 2 > u64::from(total) {
            Rows::All
        } else {
            Rows::Set(set.clone())
        };
        let ranks = self.raw_ints(col::PARENT_RANK, &rows)?;
        if ranks.len() as u64 != rows.len(total) as u64 {
            return Err(StorageError::corrupt(
                "block",
                format!("{}: not the rows asked for", col::PARENT_RANK),
            ));
        }
        Ok((rows, ranks))
    }

    /// For each of `set` (ascending), the run of its trace (an index into the block's
    /// [`TraceRuns`]) and its parent's row in this block ([`NO_PARENT`] for a root or a parent
    /// not among its trace's rows here), from the block's parent ranks: a join of children to
    /// parents within a block needs neither span-id column. `None` when the block has no ranks
    /// (written before them, or a trace holds one span id twice) or no trace runs.
    pub fn parent_rows(&self, set: &RoaringBitmap) -> Result<Option<ParentRows>> {
        if self.meta.column(col::PARENT_RANK).is_none() {
            return Ok(None);
        }
        let Some(runs) = self.source.trace_runs()? else {
            return Ok(None);
        };
        let total = self.meta.rows;
        let (rows, ranks) = self.parent_ranks(set)?;
        let n = set.len() as usize;
        let (mut of_run, mut parents) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for (i, (row, run)) in run_of_each(&runs.starts, set.iter()).enumerate() {
            let rank = match rows {
                Rows::All => ranks[row as usize],
                _ => ranks[i],
            };
            let start = runs.starts.get(run).copied().unwrap_or(0);
            let parent = match u32::try_from(rank) {
                Ok(r) if r > 0 && start + r - 1 < total => start + r - 1,
                _ => NO_PARENT,
            };
            of_run.push(run as u32);
            parents.push(parent);
        }
        Ok(Some(ParentRows {
            runs,
            of_run,
            parents,
        }))
    }

    /// Span ids of the given rows.
    pub fn span_ids(&self, rows: &Rows) -> Result<Vec<SpanId>> {
        let a = self.span_id_column(rows)?;
        let a = downcast::<FixedSizeBinaryArray>(&a, col::SPAN_ID)?;
        Ok(a.iter()
            .map(|v| SpanId::from_slice(v.unwrap_or_default()).unwrap_or_default())
            .collect())
    }

    /// Each row's parent span id (`None` for a root).
    pub fn parent_ids(&self, rows: &Rows) -> Result<Vec<Option<SpanId>>> {
        let a = self.required(col::PARENT_SPAN_ID, rows)?;
        let a = downcast::<FixedSizeBinaryArray>(&a, col::PARENT_SPAN_ID)?;
        Ok(a.iter().map(|v| v.and_then(SpanId::from_slice)).collect())
    }

    /// An int64 core column (start time, duration, …).
    pub fn ints(&self, name: &str, rows: &Rows) -> Result<ScalarBuffer<i64>> {
        let gaps = self
            .meta
            .column(name)
            .is_some_and(|c| c.transform == Transform::GapAfterPreviousEnd);
        if gaps {
            return Ok(self.times(rows)?.0);
        }
        self.raw_ints(name, rows)
    }

    fn raw_ints(&self, name: &str, rows: &Rows) -> Result<ScalarBuffer<i64>> {
        let a = self.required(name, rows)?;
        Ok(downcast::<Int64Array>(&a, name)?.values().clone())
    }

    /// Absolute start times and durations of the given rows, each chunk decoded once. Start
    /// times are stored as gaps (see [`Transform::GapAfterPreviousEnd`]); every page and every
    /// trace run begins with an absolute time, so the rows are widened to whole pages (or the
    /// whole block when those pages are most of it), rebuilt, and the asked rows picked out.
    /// The buffers are shared with the decoded chunks where they can be (no copy).
    pub fn times(&self, rows: &Rows) -> Result<(ScalarBuffer<i64>, ScalarBuffer<i64>)> {
        let gap_encoded = self
            .meta
            .column(col::START)
            .is_some_and(|c| c.transform == Transform::GapAfterPreviousEnd);
        if !gap_encoded {
            return Ok((
                self.raw_ints(col::START, rows)?,
                self.raw_ints(col::DURATION, rows)?,
            ));
        }
        if let Some(times) = self.minority_times(rows)? {
            return Ok(times);
        }
        let page = PAGE_ROWS as u32;
        let total = self.meta.rows;
        let runs = self.source.trace_runs()?;
        if let (Rows::Set(set), Some(runs)) = (rows, &runs)
            && set.len() * 2 <= u64::from(total)
            && let Some((starts, durations)) = self.sparse_times(set, &runs.starts)?
        {
            return Ok((starts.into(), durations.into()));
        }
        let widened = match rows {
            Rows::All => Rows::All,
            Rows::Range(start, len) => {
                let back = start % page;
                Rows::Range(start - back, len + back)
            }
            // most of the block: all of it
            Rows::Set(set) if set.len() * 2 > u64::from(total) => Rows::All,
            Rows::Set(set) => {
                // each row back to its trace's first row or its page's, whichever is later
                // (its page's when the trace runs are unknown)
                let run_starts = runs.as_ref().map_or(&[][..], |r| &r.starts[..]);
                let whole = back_to_absolute(set, run_starts, page);
                if whole.len() * 2 > u64::from(total) {
                    Rows::All
                } else {
                    Rows::Set(whole)
                }
            }
        };
        // a sparse widened set is walked several times below: once as a roaring bitmap, then
        // as a plain list
        let list: Option<Vec<u32>> = match &widened {
            Rows::Set(whole) => Some(whole.iter().collect()),
            _ => None,
        };
        let gaps = self.required_listed(col::START, &widened, list.as_deref())?;
        let gaps = downcast::<Int64Array>(&gaps, col::START)?.values();
        let durations = self.required_listed(col::DURATION, &widened, list.as_deref())?;
        let durations = downcast::<Int64Array>(&durations, col::DURATION)?.values();
        let starts = match runs {
            // trace runs from the block's summaries: no trace id is decoded
            Some(runs) => {
                let (starts, mut next) = (&runs.starts, 0usize);
                let run_start = |_, row| {
                    while next < starts.len() && starts[next] < row {
                        next += 1;
                    }
                    next < starts.len() && starts[next] == row
                };
                match &widened {
                    Rows::All => rebuild_starts(0..total, gaps, durations, run_start),
                    Rows::Range(from, len) => {
                        rebuild_starts(*from..from + len, gaps, durations, run_start)
                    }
                    Rows::Set(_) => {
                        rebuild_starts(list.iter().flatten().copied(), gaps, durations, run_start)
                    }
                }
            }
            None => {
                let trace_ids = self.required(col::TRACE_ID, &widened)?;
                let ids = downcast::<FixedSizeBinaryArray>(&trace_ids, col::TRACE_ID)?;
                rebuild_starts(widened.iter(total), gaps, durations, |i, _| {
                    i == 0 || ids.value(i) != ids.value(i - 1)
                })
            }
        };
        let set = match (rows, &widened) {
            (Rows::All, _) => return Ok((starts.into(), durations.clone())),
            (Rows::Range(start, len), Rows::Range(from, _)) => {
                let (at, len) = ((start - from) as usize, *len as usize);
                return Ok((
                    ScalarBuffer::from(starts).slice(at, len),
                    durations.slice(at, len),
                ));
            }
            (Rows::Set(set), Rows::All) => {
                let mask = self.mask_of(set);
                let pick = |v: Int64Array| -> Result<ScalarBuffer<i64>> {
                    let kept = arrow::compute::filter(&v, &mask)?;
                    Ok(downcast::<Int64Array>(&kept, col::START)?.values().clone())
                };
                return Ok((
                    pick(Int64Array::from(starts))?,
                    pick(Int64Array::new(durations.clone(), None))?,
                ));
            }
            (Rows::Set(set), Rows::Set(_)) => set,
            _ => unreachable!("rows are widened to the same kind"),
        };
        // positions of the asked rows among the widened ones (a subset, both ascending)
        let whole = list.as_deref().unwrap_or_default();
        let mut out = (
            Vec::with_capacity(set.len() as usize),
            Vec::with_capacity(set.len() as usize),
        );
        let mut asked = set.iter().peekable();
        for (i, &row) in whole.iter().enumerate() {
            if asked.peek() == Some(&row) {
                out.0.push(starts[i]);
                out.1.push(durations[i]);
                asked.next();
            }
        }
        Ok((out.0.into(), out.1.into()))
    }

    /// Start times and durations of rows that are all minority rows (see the writer's
    /// `minority_rows`), read from the block's absolute copy of theirs: no gap is walked.
    /// `None` when the block keeps no such copy or a row is not among them.
    fn minority_times(
        &self,
        rows: &Rows,
    ) -> Result<Option<(ScalarBuffer<i64>, ScalarBuffer<i64>)>> {
        let Rows::Set(set) = rows else {
            return Ok(None);
        };
        if set.is_empty() || self.meta.column(col::MINOR_ROWS).is_none() {
            return Ok(None);
        }
        let MinorityRows {
            listed,
            set: minority,
        } = self.minority()?;
        if !set.is_subset(minority) {
            return Ok(None);
        }
        let places = self.minority_places(rows)?;
        let read = |name: &str| -> Result<Vec<i64>> {
            let bytes = self.required_chunk(name)?;
            let values = packed::Packed::parse(&bytes)?;
            if values.rows() as usize != listed.len() {
                return Err(StorageError::corrupt(
                    "column chunk",
                    format!(
                        "{name}: {} rows for {} minority rows",
                        values.rows(),
                        listed.len()
                    ),
                ));
            }
            values.pick(places.iter().flatten().copied())
        };
        Ok(Some((
            read(col::MINOR_START)?.into(),
            read(col::MINOR_DURATION)?.into(),
        )))
    }

    /// Start times and durations of a few rows of a block whose two chunks are bit-packed:
    /// each row's start is rebuilt from the first row of its trace run or page (whichever is
    /// later), or from the row asked before it when that lies between, reading only those
    /// rows' gaps and durations. `None` when a chunk is not bit-packed, or when the rows to
    /// read on the way are more than half the block.
    fn sparse_times(
        &self,
        set: &RoaringBitmap,
        run_starts: &[u32],
    ) -> Result<Option<(Vec<i64>, Vec<i64>)>> {
        let (gaps, durations) = (
            self.required_chunk(col::START)?,
            self.required_chunk(col::DURATION)?,
        );
        if !packed::is_packed(&gaps) || !packed::is_packed(&durations) {
            return Ok(None);
        }
        let (gaps, durations) = (
            packed::Packed::parse(&gaps)?,
            packed::Packed::parse(&durations)?,
        );
        let total = self.meta.rows;
        if gaps.rows() != total || durations.rows() != total {
            return Err(StorageError::corrupt(
                "column chunk",
                format!("start or duration: not {total} rows"),
            ));
        }
        let reads = sparse_reads(set, run_starts);
        // Each read rebuilds its row from the row holding an absolute time: rows deep inside
        // long trace runs (a merged block holds whole traces) read many rows each. Past half
        // the block's rows in all, the block decoded whole, in order, costs less.
        let volume: u64 = reads.iter().map(|r| u64::from(r.row + 1 - r.from)).sum();
        if volume * 2 > u64::from(total) {
            return Ok(None);
        }
        let (mut gap_cursor, mut duration_cursor) = (gaps.cursor(), durations.cursor());
        let (mut gap_ahead, mut duration_ahead) = (gaps.cursor(), durations.cursor());
        let (mut gap_run, mut duration_run) = (Vec::new(), Vec::new());
        let mut gap_places = Vec::with_capacity(2 * TOUCH_AHEAD);
        let mut duration_places = Vec::with_capacity(2 * TOUCH_AHEAD);
        let (mut starts, mut out_durations) = (
            Vec::with_capacity(reads.len()),
            Vec::with_capacity(reads.len()),
        );
        let mut end = 0i64;
        for (j, read) in reads.iter().enumerate() {
            if j % TOUCH_AHEAD == 0 {
                gap_places.clear();
                duration_places.clear();
                for r in reads[j..].iter().take(TOUCH_AHEAD) {
                    gap_ahead.locate(r.from, &mut gap_places);
                    gap_ahead.locate(r.row, &mut gap_places);
                    duration_ahead.locate(r.from, &mut duration_places);
                    duration_ahead.locate(r.row, &mut duration_places);
                }
                std::hint::black_box(gaps.touch(&gap_places) ^ durations.touch(&duration_places));
            }
            gap_run.clear();
            duration_run.clear();
            gap_cursor.range(read.from, read.row + 1, &mut gap_run)?;
            duration_cursor.range(read.from, read.row + 1, &mut duration_run)?;
            let mut start = 0;
            for (i, (&gap, &duration)) in gap_run.iter().zip(&duration_run).enumerate() {
                start = if i == 0 && !read.after_previous {
                    gap
                } else {
                    end.wrapping_add(gap)
                };
                end = start.wrapping_add(duration);
            }
            starts.push(start);
            out_durations.push(*duration_run.last().expect("the row itself was read"));
        }
        Ok(Some((starts, out_durations)))
    }

    /// An attribute column's values for the given rows; `None` when the block lacks it.
    pub fn attribute_values(&self, name: &str, rows: &Rows) -> Result<Option<Vec<Option<Value>>>> {
        let Some(meta) = self.meta.column(name) else {
            return Ok(None);
        };
        let ty = meta
            .ty
            .ok_or_else(|| StorageError::corrupt("block meta", format!("{name} has no type")))?;
        let Some(array) = self.column(name, rows)? else {
            return Ok(None);
        };
        let derived = self.derived(meta.transform, rows, None, &array)?;
        let c = AttrColumn {
            key: String::new(),
            dedicated: None,
            ty,
            array,
            derived,
        };
        Ok(Some((0..c.array.len()).map(|i| c.value(i)).collect()))
    }

    /// The values a transformed column stands for, for the given rows.
    fn derived(
        &self,
        transform: Transform,
        rows: &Rows,
        durations: Option<&[i64]>,
        array: &ArrayRef,
    ) -> Result<Option<Vec<f64>>> {
        let owned;
        let durations = match (transform, durations) {
            (Transform::None | Transform::GapAfterPreviousEnd, _) => return Ok(None),
            (_, Some(d)) => d,
            (_, None) => {
                owned = self.ints(col::DURATION, rows)?;
                &owned
            }
        };
        Ok(match transform {
            Transform::DurationMillis => Some(durations.iter().map(|d| millis(*d)).collect()),
            Transform::MillisAfterDuration => {
                let after = array
                    .as_any()
                    .downcast_ref::<arrow::array::Int64Array>()
                    .ok_or_else(|| {
                        StorageError::corrupt("column chunk", "millis after duration: not int64")
                    })?;
                Some(
                    after
                        .values()
                        .iter()
                        .zip(durations)
                        .map(|(n, d)| millis(n.wrapping_add(*d)))
                        .collect(),
                )
            }
            Transform::None | Transform::GapAfterPreviousEnd => None,
        })
    }

    /// A binary column's values for the given rows; `None` when the block lacks it.
    pub fn blobs(&self, name: &str, rows: &Rows) -> Result<Option<Vec<Option<Vec<u8>>>>> {
        let Some(array) = self.column(name, rows)? else {
            return Ok(None);
        };
        let a = downcast::<BinaryArray>(&array, name)?;
        Ok(Some(a.iter().map(|v| v.map(<[u8]>::to_vec)).collect()))
    }

    /// An attribute column (`d:` dedicated or `a:` dynamic) as Arrow, with its type; a
    /// transformed column comes back as the values it stands for. `None` when the block lacks it.
    pub fn attribute_array(
        &self,
        name: &str,
        rows: &Rows,
    ) -> Result<Option<(ColumnType, ArrayRef)>> {
        let Some(meta) = self.meta.column(name) else {
            return Ok(None);
        };
        let ty = meta
            .ty
            .ok_or_else(|| StorageError::corrupt("block meta", format!("{name} has no type")))?;
        let Some(array) = self.column(name, rows)? else {
            return Ok(None);
        };
        Ok(Some(
            match self.derived(meta.transform, rows, None, &array)? {
                Some(values) => {
                    let floats: Float64Array = values
                        .iter()
                        .enumerate()
                        .map(|(i, v)| array.is_valid(i).then_some(*v))
                        .collect();
                    (ty, Arc::new(floats) as ArrayRef)
                }
                None => (ty, array),
            },
        ))
    }

    /// Whether `rows` are few enough (an eighth of the block at most) to be read from postings.
    fn few(&self, rows: u64) -> bool {
        rows * 8 <= u64::from(self.meta.rows)
    }

    /// [`Self::indexed_strings`] for any row selection: a range (a trace's run) as its set.
    pub fn indexed_strings_of(&self, dim: &str, rows: &Rows) -> Result<Option<ArrayRef>> {
        match rows {
            Rows::Set(set) => self.indexed_strings(dim, set),
            Rows::Range(start, len) if self.few(u64::from(*len)) => {
                let mut set = RoaringBitmap::new();
                set.insert_range(*start..start + len);
                self.indexed_strings(dim, &set)
            }
            Rows::Range(..) | Rows::All => Ok(None),
        }
    }

    /// The values of string column `dim` (indexed by postings: a dedicated one, or the core
    /// service, name and status) for a few rows, as string views, read from the block's
    /// postings of it instead of its chunk: each row is in the rows of the term it holds, or
    /// of none when it holds none (the writer indexes exactly the value the column keeps). `None` when the source has
    /// no postings, the rows are not few, or the dimension has too many terms for this to pay.
    pub fn indexed_strings(&self, dim: &str, set: &RoaringBitmap) -> Result<Option<ArrayRef>> {
        if !self.few(set.len()) {
            return Ok(None);
        }
        let Some(postings) = self.source.postings(dim)? else {
            return Ok(None);
        };
        if postings.len() > INDEXED_READ_TERMS {
            return Ok(None);
        }
        let column = format!("{}{dim}", col::DEDICATED_PREFIX);
        let core = [DIM_SERVICE, DIM_NAME, DIM_STATUS, DIM_KIND].contains(&dim);
        if postings.is_empty() && (core || self.meta.column(&column).is_some()) {
            // values but no postings: a block written before `dim` was indexed (every row has
            // a service, a name, a status and a kind, so their postings are never empty
            // otherwise)
            return Ok(None);
        }
        let keys: UInt32Array = match self.source.term_runs(dim)? {
            // one term a row: a walk over the rows and the dimension's runs (built once per
            // block and kept), no intersection per term and no sort
            Some(runs) => {
                let mut keys = vec![None; set.len() as usize];
                runs.terms_of(set.iter(), |at, t| keys[at] = Some(t));
                keys.into_iter().collect()
            }
            None => {
                let mut held: Vec<(u32, u32)> = Vec::with_capacity(set.len() as usize);
                for (t, (_, rows)) in postings.iter().enumerate() {
                    held.extend((rows & set).iter().map(|row| (row, t as u32)));
                }
                held.sort_unstable();
                let mut held = held.into_iter().peekable();
                set.iter()
                    .map(|row| held.next_if(|(r, _)| *r == row).map(|(_, t)| t))
                    .collect()
            }
        };
        // views: each row copies a 16-byte view of its term, not the term's text
        let terms = StringViewArray::from_iter_values(postings.iter().map(|(t, _)| t.as_str()));
        Ok(Some(arrow::compute::take(&terms, &keys, None)?))
    }

    /// The term each of `rows` holds in postings dimension `dim` (null where it holds none),
    /// as type `ty` (text as string views): for dimensions that only postings keep, such as the
    /// request dimensions. The terms are converted once and each row takes its term's value
    /// (a view, not a copy of the text).
    pub fn postings_terms(&self, dim: &str, rows: &Rows, ty: &DataType) -> Result<ArrayRef> {
        let n = rows.len(self.meta.rows);
        let postings = self.source.postings(dim)?.unwrap_or_default();
        let mut keys: Vec<Option<u32>> = vec![None; n];
        match self.source.term_runs(dim)? {
            Some(runs) => {
                let put = |at: usize, t: u32| keys[at] = Some(t);
                match rows {
                    Rows::All => runs.terms_of(0..self.meta.rows, put),
                    Rows::Range(start, len) => runs.terms_of(*start..start + len, put),
                    Rows::Set(set) => runs.terms_of(set.iter(), put),
                }
            }
            // several terms on a row: each term's rows, the last term a row is in winning
            None => {
                let positions = match rows {
                    Rows::Set(set) => Some(Positions::of(set)),
                    _ => None,
                };
                for (t, (_, held)) in postings.iter().enumerate() {
                    for r in &rows.intersect(held) {
                        let at = match (rows, &positions) {
                            (Rows::Range(start, _), _) => (r - start) as usize,
                            (_, Some(p)) => p.of_row(r),
                            _ => r as usize,
                        };
                        keys[at] = Some(t as u32);
                    }
                }
            }
        }
        let terms = StringViewArray::from_iter_values(postings.iter().map(|(t, _)| t.as_str()));
        let terms = arrow::compute::cast(&terms, ty)?;
        Ok(arrow::compute::take(
            &terms,
            &UInt32Array::from(keys),
            None,
        )?)
    }

    /// Every attribute of each row (typed columns, the generic map, and long values when asked
    /// for), under the name each was sent with.
    pub fn row_attributes(&self, rows: &Rows, with_long: bool) -> Result<Vec<Vec<KeyValue>>> {
        let durations = self.ints(col::DURATION, rows)?;
        let alias = self.ints(col::ALIAS_MASK, rows)?;
        let attr_cols = self.attribute_columns(rows, &durations)?;
        let other = self.required(col::ATTRIBUTES_OTHER, rows)?;
        let other = downcast::<BinaryArray>(&other, col::ATTRIBUTES_OTHER)?;
        let long = if with_long {
            Some(self.required(col::LONG_VALUES, rows)?)
        } else {
            None
        };
        let long = long
            .as_ref()
            .map(|l| downcast::<BinaryArray>(l, col::LONG_VALUES))
            .transpose()?;
        (0..durations.len())
            .map(|i| collect_attributes(&attr_cols, alias[i], [Some(other), long], i))
            .collect()
    }

    /// The events of each row.
    pub fn events(&self, rows: &Rows) -> Result<Vec<Vec<Event>>> {
        let a = self.required(col::EVENTS, rows)?;
        let a = downcast::<BinaryArray>(&a, col::EVENTS)?;
        (0..a.len())
            .map(|i| blob_or_default(a, i, |r| r.events()))
            .collect()
    }

    /// The links of each row.
    pub fn links(&self, rows: &Rows) -> Result<Vec<Vec<Link>>> {
        let a = self.required(col::LINKS, rows)?;
        let a = downcast::<BinaryArray>(&a, col::LINKS)?;
        (0..a.len())
            .map(|i| blob_or_default(a, i, |r| r.links()))
            .collect()
    }

    /// The resource of each row (each distinct one decoded once).
    pub fn resources(&self, rows: &Rows) -> Result<Vec<Arc<Resource>>> {
        let a = self.required(col::RESOURCE, rows)?;
        let a = downcast::<BinaryArray>(&a, col::RESOURCE)?;
        let mut shared = SharedDecoder::default();
        (0..a.len()).map(|i| shared.resource(a.value(i))).collect()
    }

    /// The instrumentation scope of each row (each distinct one decoded once).
    pub fn scopes(&self, rows: &Rows) -> Result<Vec<Arc<Scope>>> {
        let a = self.required(col::SCOPE, rows)?;
        let a = downcast::<BinaryArray>(&a, col::SCOPE)?;
        let mut shared = SharedDecoder::default();
        (0..a.len()).map(|i| shared.scope(a.value(i))).collect()
    }

    /// Whole spans for the given rows; long values only when asked for.
    #[allow(clippy::needless_range_loop)] // one row index across many columns
    pub fn spans(&self, rows: &Rows, with_long: bool) -> Result<Vec<SpanRecord>> {
        let get = |name: &str| self.required(name, rows);
        let trace_ids = get(col::TRACE_ID)?;
        let span_ids = get(col::SPAN_ID)?;
        let parents = get(col::PARENT_SPAN_ID)?;
        let trace_state = get(col::TRACE_STATE)?;
        let names = get(col::NAME)?;
        let status_message = get(col::STATUS_MESSAGE)?;
        let resources = get(col::RESOURCE)?;
        let scopes = get(col::SCOPE)?;
        let events = get(col::EVENTS)?;
        let links = get(col::LINKS)?;
        let other = get(col::ATTRIBUTES_OTHER)?;
        let long = if with_long {
            Some(get(col::LONG_VALUES)?)
        } else {
            None
        };
        let int_names = [
            col::FLAGS,
            col::KIND,
            col::START,
            col::DURATION,
            col::STATUS_CODE,
            col::DROPPED_ATTRIBUTES,
            col::DROPPED_EVENTS,
            col::DROPPED_LINKS,
            col::ALIAS_MASK,
        ];
        let ints = int_names
            .iter()
            .map(|n| self.ints(n, rows))
            .collect::<Result<Vec<_>>>()?;
        let attr_cols = self.attribute_columns(rows, &ints[3])?;

        let trace_ids = downcast::<FixedSizeBinaryArray>(&trace_ids, col::TRACE_ID)?;
        let span_ids = downcast::<FixedSizeBinaryArray>(&span_ids, col::SPAN_ID)?;
        let parents = downcast::<FixedSizeBinaryArray>(&parents, col::PARENT_SPAN_ID)?;
        let trace_state = downcast::<StringArray>(&trace_state, col::TRACE_STATE)?;
        let names = downcast::<StringArray>(&names, col::NAME)?;
        let status_message = downcast::<StringArray>(&status_message, col::STATUS_MESSAGE)?;
        let resources = downcast::<BinaryArray>(&resources, col::RESOURCE)?;
        let scopes = downcast::<BinaryArray>(&scopes, col::SCOPE)?;
        let events = downcast::<BinaryArray>(&events, col::EVENTS)?;
        let links = downcast::<BinaryArray>(&links, col::LINKS)?;
        let other = downcast::<BinaryArray>(&other, col::ATTRIBUTES_OTHER)?;
        let long = long
            .as_ref()
            .map(|l| downcast::<BinaryArray>(l, col::LONG_VALUES))
            .transpose()?;

        let mut shared = SharedDecoder::default();
        let mut out = Vec::with_capacity(trace_ids.len());
        for i in 0..trace_ids.len() {
            let attributes = collect_attributes(&attr_cols, ints[8][i], [Some(other), long], i)?;
            let start = ints[2][i] as u64;
            out.push(SpanRecord {
                trace_id: TraceId::from_slice(trace_ids.value(i)).unwrap_or_default(),
                span_id: SpanId::from_slice(span_ids.value(i)).unwrap_or_default(),
                parent_span_id: parents
                    .is_valid(i)
                    .then(|| SpanId::from_slice(parents.value(i)).unwrap_or_default()),
                trace_state: trace_state.value(i).to_owned(),
                flags: ints[0][i] as u32,
                name: names.value(i).to_owned(),
                kind: SpanKind::from_u8(ints[1][i] as u8),
                start: UnixNanos(start),
                end: UnixNanos(start + ints[3][i] as u64),
                attributes,
                dropped_attributes_count: ints[5][i] as u32,
                events: blob_or_default(events, i, |r| r.events())?,
                dropped_events_count: ints[6][i] as u32,
                links: blob_or_default(links, i, |r| r.links())?,
                dropped_links_count: ints[7][i] as u32,
                status_code: StatusCode::from_u8(ints[4][i] as u8),
                status_message: status_message.value(i).to_owned(),
                resource: shared.resource(resources.value(i))?,
                scope: shared.scope(scopes.value(i))?,
            });
        }
        Ok(out)
    }

    fn attribute_columns(&self, rows: &Rows, durations: &[i64]) -> Result<Vec<AttrColumn>> {
        let mut out = Vec::new();
        for c in &self.meta.columns {
            let (key, dedicated) = match c.kind {
                ColumnKind::Core => continue,
                ColumnKind::Dedicated => {
                    let key = &c.name[col::DEDICATED_PREFIX.len()..];
                    (key, DEDICATED.iter().position(|d| d.name == key))
                }
                ColumnKind::Dynamic => (&c.name[col::DYNAMIC_PREFIX.len()..], None),
            };
            let Some(array) = self.column(&c.name, rows)? else {
                continue;
            };
            let derived = self.derived(c.transform, rows, Some(durations), &array)?;
            out.push(AttrColumn {
                key: key.to_owned(),
                dedicated,
                ty: c.ty.ok_or_else(|| {
                    StorageError::corrupt("block meta", format!("{} has no type", c.name))
                })?,
                array,
                derived,
            });
        }
        Ok(out)
    }
}

/// The given rows (ascending, `n` of them) of a bit-packed chunk: read one by one when few,
/// else the chunk decoded whole and picked.
fn pick_packed(
    chunk: &packed::Packed,
    rows: impl Iterator<Item = u32>,
    n: u64,
) -> Result<Vec<i64>> {
    if n * 4 > u64::from(chunk.rows()) {
        let all = chunk.all()?;
        Ok(rows.filter_map(|r| all.get(r as usize).copied()).collect())
    } else {
        chunk.pick(rows)
    }
}

/// Rows read ahead of use in [`BlockReader::sparse_times`]: enough loads in flight to hide
/// memory latency, few enough that the touched lines are still cached when read.
const TOUCH_AHEAD: usize = 32;

/// What [`BlockReader::sparse_times`] reads for one asked row.
struct SparseRead {
    /// The asked row.
    row: u32,
    /// The first row read: the latest row at or before `row` holding an absolute time (the
    /// first of its trace run or page), or the row after the previous asked row when that lies
    /// between.
    from: u32,
    /// Whether `from` continues from the previous asked row's end.
    after_previous: bool,
}

/// The reads rebuilding the start times of `set` (ascending) from gaps, given the first rows
/// of the block's trace runs (ascending).
fn sparse_reads(set: &RoaringBitmap, run_starts: &[u32]) -> Vec<SparseRead> {
    let mut reads: Vec<SparseRead> = Vec::with_capacity(set.len() as usize);
    for (row, absolute) in with_absolute(set, run_starts, PAGE_ROWS as u32) {
        let read = match reads.last() {
            Some(previous) if previous.row >= absolute => SparseRead {
                row,
                from: previous.row + 1,
                after_previous: true,
            },
            _ => SparseRead {
                row,
                from: absolute,
                after_previous: false,
            },
        };
        reads.push(read);
    }
    reads
}

/// Each row of `set` (ascending) with the latest row at or before it holding an absolute
/// start time: the first of its trace run (`run_starts`, ascending) or of its page.
fn with_absolute<'s>(
    set: &'s RoaringBitmap,
    run_starts: &'s [u32],
    page: u32,
) -> impl Iterator<Item = (u32, u32)> + 's {
    let mut run = 0usize;
    set.iter().map(move |row| {
        while run + 1 < run_starts.len() && run_starts[run + 1] <= row {
            run += 1;
        }
        let run_start = run_starts
            .get(run)
            .copied()
            .filter(|s| *s <= row)
            .unwrap_or(0);
        (row, run_start.max(row - row % page))
    })
}

/// Absolute start times from gaps: a row starts at its gap when it is the first of the rows,
/// of a page, or of a trace run (`run_start(i, row)`), else at the gap after the previous row's
/// end.
fn rebuild_starts(
    rows: impl Iterator<Item = u32>,
    gaps: &[i64],
    durations: &[i64],
    mut run_start: impl FnMut(usize, u32) -> bool,
) -> Vec<i64> {
    let page = PAGE_ROWS as u32;
    let mut starts = Vec::with_capacity(gaps.len());
    let mut prev_end = 0i64;
    for ((i, row), (&gap, &duration)) in rows.enumerate().zip(gaps.iter().zip(durations)) {
        let start = if i == 0 || row % page == 0 || run_start(i, row) {
            gap
        } else {
            prev_end + gap
        };
        prev_end = start + duration;
        starts.push(start);
    }
    starts
}

/// The rows whose start times rebuild those of `set`: each row back to the first row of its
/// trace run (`run_starts`, ascending) or of its page, whichever is later, since both hold an
/// absolute time and every row after them a gap.
fn back_to_absolute(set: &RoaringBitmap, run_starts: &[u32], page: u32) -> RoaringBitmap {
    let mut whole = RoaringBitmap::new();
    let mut open: Option<(u32, u32)> = None;
    for (row, from) in with_absolute(set, run_starts, page) {
        // grow the open range while the next one touches it
        match &mut open {
            Some((_, to)) if from <= *to + 1 => *to = row,
            _ => {
                if let Some((a, b)) = open.replace((from, row)) {
                    whole.insert_range(a..=b);
                }
            }
        }
    }
    if let Some((a, b)) = open {
        whole.insert_range(a..=b);
    }
    whole
}

/// One row's attributes from the typed columns and the blob columns.
fn collect_attributes(
    attr_cols: &[AttrColumn],
    alias_mask: i64,
    blobs: [Option<&BinaryArray>; 2],
    i: usize,
) -> Result<Vec<KeyValue>> {
    let mut attributes = Vec::new();
    for c in attr_cols {
        if let Some(v) = c.value(i) {
            let key = match (
                c.dedicated,
                alias_mask & (1 << c.dedicated.unwrap_or(0)) != 0,
            ) {
                (Some(d), true) => DEDICATED[d].alias.unwrap_or(DEDICATED[d].name),
                _ => c.key.as_str(),
            };
            attributes.push(KeyValue::new(key, v));
        }
    }
    for blob in blobs.into_iter().flatten() {
        if blob.is_valid(i) {
            attributes.extend(Reader::new(blob.value(i)).attrs()?);
        }
    }
    Ok(attributes)
}

fn blob_or_default<T: Default>(
    a: &BinaryArray,
    i: usize,
    read: impl FnOnce(&mut Reader<'_>) -> Result<T>,
) -> Result<T> {
    if a.is_valid(i) {
        read(&mut Reader::new(a.value(i)))
    } else {
        Ok(T::default())
    }
}

struct AttrColumn {
    key: String,
    dedicated: Option<usize>,
    ty: ColumnType,
    array: ArrayRef,
    /// Values of a transformed column (the chunk then only says where they are present).
    derived: Option<Vec<f64>>,
}

impl AttrColumn {
    fn value(&self, i: usize) -> Option<Value> {
        if self.array.is_null(i) {
            return None;
        }
        if let Some(derived) = &self.derived {
            return Some(Value::Double(derived[i]));
        }
        let a = &self.array;
        Some(match self.ty {
            ColumnType::Str => Value::Str(
                a.as_any()
                    .downcast_ref::<StringArray>()?
                    .value(i)
                    .to_owned(),
            ),
            ColumnType::Int => Value::Int(a.as_any().downcast_ref::<Int64Array>()?.value(i)),
            ColumnType::Double => {
                Value::Double(a.as_any().downcast_ref::<Float64Array>()?.value(i))
            }
            ColumnType::Bool => Value::Bool(a.as_any().downcast_ref::<BooleanArray>()?.value(i)),
            ColumnType::StrList => {
                let list = a.as_any().downcast_ref::<ListArray>()?.value(i);
                let strings = list.as_string::<i32>();
                Value::Array(
                    strings
                        .iter()
                        .map(|s| Value::Str(s.unwrap_or_default().to_owned()))
                        .collect(),
                )
            }
        })
    }
}

/// Decodes each distinct resource and scope once and shares it between the rows.
#[derive(Default)]
struct SharedDecoder {
    resource: Option<(Vec<u8>, Arc<Resource>)>,
    scope: Option<(Vec<u8>, Arc<Scope>)>,
}

impl SharedDecoder {
    fn resource(&mut self, bytes: &[u8]) -> Result<Arc<Resource>> {
        if let Some((b, r)) = &self.resource
            && b == bytes
        {
            return Ok(r.clone());
        }
        let r = Arc::new(Reader::new(bytes).resource()?);
        self.resource = Some((bytes.to_vec(), r.clone()));
        Ok(r)
    }
    fn scope(&mut self, bytes: &[u8]) -> Result<Arc<Scope>> {
        if let Some((b, s)) = &self.scope
            && b == bytes
        {
            return Ok(s.clone());
        }
        let s = Arc::new(Reader::new(bytes).scope()?);
        self.scope = Some((bytes.to_vec(), s.clone()));
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::TraceRuns;
    use crate::model::TraceId;

    /// The run of each row, found by walking every run.
    fn walked(starts: &[u32], row: u32) -> u32 {
        (starts.iter().rposition(|&s| s <= row).unwrap_or(0)) as u32
    }

    #[test]
    fn runs_of_rows_dense_and_sparse() {
        // runs of 1 to 7 rows, over 2,000 rows
        let mut starts = Vec::new();
        let mut at = 0u32;
        while at < 2_000 {
            starts.push(at);
            at += 1 + (at * 7 + 3) % 7;
        }
        let runs = TraceRuns::new(
            starts
                .iter()
                .map(|&s| (s, TraceId([s as u8; 16])))
                .collect(),
        );
        for step in [1u32, 2, 3, 5, 17, 64, 333, 1999] {
            let rows: Vec<u32> = (0..2_000).step_by(step as usize).collect();
            let expect: Vec<u32> = rows.iter().map(|&r| walked(&starts, r)).collect();
            assert_eq!(
                runs.runs_of(rows.iter().copied()),
                expect,
                "every {step}th row"
            );
        }
        assert!(runs.runs_of(std::iter::empty()).is_empty());
    }

    #[test]
    fn gallop_finds_the_partition_point_from_any_place() {
        let items: Vec<u32> = (0..300).map(|i| i * 3 / 2).collect();
        for from in 0..=items.len() {
            for bound in 0..460 {
                let want = from + items[from..].partition_point(|&v| v < bound);
                assert_eq!(
                    super::gallop(&items, from, |&v| v < bound),
                    want,
                    "{from} {bound}"
                );
            }
        }
        assert_eq!(super::gallop::<u32>(&[], 0, |_| true), 0);
    }
}
