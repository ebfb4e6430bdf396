//! The one read path from storage to a query engine.
//!
//! A reader takes a tenant's snapshot ([`crate::store::Snapshot`]), picks blocks by their
//! statistics ([`BlockMeta`]: time range, row count, columns) and postings, and reads the rows
//! it wants as Arrow arrays: span blocks through a [`BlockView`], whose columns
//! ([`spans::read_block`]) are the ones head rows are built into ([`spans::read_rows`]); log and
//! metric blocks through the store's `scan_logs` / `scan_metrics`, whose columns are named by
//! [`logs::COLUMNS`] and [`metrics::sources`]. How a block is laid out (chunk keys, column
//! names, encodings, the record codec) stays inside this crate: a reader never sees it.

pub mod arrays;
pub mod logs;
pub mod metrics;
pub mod spans;

use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::buffer::ScalarBuffer;
use arrow::datatypes::DataType;
use roaring::RoaringBitmap;

use crate::block::BlockReader;
use crate::block::writer::col;
use crate::error::{Result, StorageError};
use crate::model::{Event, KeyValue, Link, SpanId, SpanRecord, TenantId, TraceId, Value};
use crate::schema::{DEDICATED, dedicated_for};
use crate::store::{ChunkFetcher, Store};

pub use crate::block::format::{BlockMeta, TraceEntry};
pub use crate::block::reader::{NO_PARENT, ParentRows, Positions, Rows, TraceRuns};
pub use crate::keys::BlockAddr;

/// One span block of a tenant, read column by column for the rows asked (decoded chunks and
/// their footers come from the store's caches).
pub struct BlockView<'m> {
    reader: BlockReader<'m, ChunkFetcher<'m>>,
}

impl Store {
    /// A view of one span block of a snapshot.
    pub fn block_view<'m>(
        &'m self,
        tenant: &TenantId,
        addr: BlockAddr,
        meta: &'m BlockMeta,
    ) -> BlockView<'m> {
        BlockView {
            reader: self.block_reader(tenant, addr, meta),
        }
    }
}

impl BlockView<'_> {
    /// Columns of the `spans` table (`projection` indexes `columns`) for some rows.
    pub fn columns(
        &self,
        rows: &Rows,
        columns: &spans::SpanColumns,
        projection: &[usize],
    ) -> Result<Vec<ArrayRef>> {
        spans::read_block(&self.reader, rows, columns, projection)
    }

    /// The runs of rows of each trace (rows are sorted by trace).
    pub fn trace_runs(&self) -> Result<Option<Arc<TraceRuns>>> {
        self.reader.trace_runs()
    }

    /// Whether the block keeps its rows' parents as ranks (see [`Self::parent_rows`]).
    pub fn has_parent_ranks(&self) -> bool {
        self.reader.meta.column(col::PARENT_RANK).is_some()
    }

    /// Each of `rows`' trace run and parent row in the block (see
    /// [`BlockReader::parent_rows`]); `None` when the block cannot say.
    pub fn parent_rows(&self, rows: &RoaringBitmap) -> Result<Option<ParentRows>> {
        self.reader.parent_rows(rows)
    }

    pub fn trace_ids(&self, rows: &Rows) -> Result<Vec<TraceId>> {
        self.reader.trace_ids(rows)
    }

    pub fn span_ids(&self, rows: &Rows) -> Result<Vec<SpanId>> {
        self.reader.span_ids(rows)
    }

    /// Start times (Unix nanoseconds).
    pub fn starts(&self, rows: &Rows) -> Result<ScalarBuffer<i64>> {
        self.reader.ints(col::START, rows)
    }

    /// Durations (nanoseconds).
    pub fn durations(&self, rows: &Rows) -> Result<ScalarBuffer<i64>> {
        self.reader.ints(col::DURATION, rows)
    }

    /// Service names as a text column.
    pub fn services(&self, rows: &Rows) -> Result<ArrayRef> {
        self.text(col::SERVICE, rows)
    }

    /// Span names as a text column.
    pub fn names(&self, rows: &Rows) -> Result<ArrayRef> {
        self.text(col::NAME, rows)
    }

    fn text(&self, column: &'static str, rows: &Rows) -> Result<ArrayRef> {
        let a = self
            .reader
            .column(column, rows)?
            .ok_or_else(|| StorageError::corrupt("span block", format!("no {column} column")))?;
        Ok(arrow::compute::cast(&a, &DataType::Utf8)?)
    }

    pub fn events(&self, rows: &Rows) -> Result<Vec<Vec<Event>>> {
        self.reader.events(rows)
    }

    pub fn links(&self, rows: &Rows) -> Result<Vec<Vec<Link>>> {
        self.reader.links(rows)
    }

    /// Whole spans (`with_long`: with the long attribute values kept apart, such as content).
    pub fn spans(&self, rows: &Rows, with_long: bool) -> Result<Vec<SpanRecord>> {
        self.reader.spans(rows, with_long)
    }

    /// The doubles of dedicated column `key` (a `Double` one) as the block keeps them: a
    /// value sent with another type is not there (what the `spans` table's column reads).
    pub fn dedicated_doubles(&self, key: &str, rows: &Rows) -> Result<Option<Vec<Option<f64>>>> {
        use arrow::array::{Array, AsArray};
        let Some((i, _)) = dedicated_for(key) else {
            return Ok(None);
        };
        let name = format!("{}{}", col::DEDICATED_PREFIX, DEDICATED[i].name);
        let Some(a) = self.reader.column(&name, rows)? else {
            return Ok(None);
        };
        let Some(a) = a.as_primitive_opt::<arrow::datatypes::Float64Type>() else {
            return Ok(None);
        };
        Ok(Some(
            (0..a.len())
                .map(|j| a.is_valid(j).then(|| a.value(j)))
                .collect(),
        ))
    }

    /// The value of attribute `key` of each row, wherever the block keeps it (its dedicated or
    /// dynamic column, or the map of other attributes).
    pub fn attribute(&self, key: &str, rows: &Rows) -> Result<Vec<Option<Value>>> {
        let n = rows.len(self.reader.meta.rows);
        let typed = match dedicated_for(key) {
            Some((i, _)) => format!("{}{}", col::DEDICATED_PREFIX, DEDICATED[i].name),
            None => format!("{}{}", col::DYNAMIC_PREFIX, key),
        };
        let mut out = self
            .reader
            .attribute_values(&typed, rows)?
            .unwrap_or_else(|| vec![None; n]);
        if let Some(blobs) = self.reader.blobs(col::ATTRIBUTES_OTHER, rows)? {
            for (slot, blob) in out.iter_mut().zip(blobs) {
                if slot.is_some() {
                    continue;
                }
                if let Some(blob) = blob {
                    *slot = crate::codec::Reader::new(&blob)
                        .attrs()?
                        .into_iter()
                        .find(|kv| kv.key == key)
                        .map(|kv| kv.value);
                }
            }
        }
        Ok(out)
    }
}

/// Stored record parts of logs and metrics, as they come out of a scan's binary columns.
pub mod decode {
    use super::*;
    use crate::model::{Exemplar, PointValue, Resource, Scope};

    pub fn attributes(blob: &[u8]) -> Result<Vec<KeyValue>> {
        crate::codec::Reader::new(blob).attrs()
    }

    pub fn scope(blob: &[u8]) -> Result<Scope> {
        crate::codec::Reader::new(blob).scope()
    }

    pub fn resource(blob: &[u8]) -> Result<Resource> {
        crate::codec::Reader::new(blob).resource()
    }

    pub fn point_value(blob: &[u8]) -> Result<PointValue> {
        crate::codec::Reader::new(blob).point_value()
    }

    pub fn exemplars(blob: &[u8]) -> Result<Vec<Exemplar>> {
        crate::codec::Reader::new(blob).exemplars()
    }
}
