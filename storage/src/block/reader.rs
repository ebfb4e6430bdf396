//! Reads rows of a block back: decodes only the column chunks asked for, and of those only the
//! pages holding the selected rows, then puts spans back together losslessly.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BooleanArray, FixedSizeBinaryArray, Float64Array,
    Int64Array, ListArray, StringArray,
};
use bytes::Bytes;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, RowSelection, RowSelector};
use roaring::RoaringBitmap;

use super::format::{BlockMeta, ColumnKind, PAGE_ROWS, Transform, decode_chunk_with};
use super::writer::{col, millis};
use crate::codec::Reader;
use crate::error::{Result, StorageError};
use crate::model::*;
use crate::schema::{ColumnType, DEDICATED};

/// Rows of a block to read.
#[derive(Clone, Debug)]
pub enum Rows {
    All,
    Range(u32, u32),
    Set(RoaringBitmap),
}

impl Rows {
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
}

pub struct BlockReader<'a, S: ChunkSource> {
    pub meta: &'a BlockMeta,
    source: S,
}

fn downcast<'b, T: 'static>(a: &'b ArrayRef, column: &str) -> Result<&'b T> {
    a.as_any().downcast_ref::<T>().ok_or_else(|| {
        StorageError::corrupt(
            "column chunk",
            format!("{column}: unexpected type {}", a.data_type()),
        )
    })
}

impl<'a, S: ChunkSource> BlockReader<'a, S> {
    pub fn new(meta: &'a BlockMeta, source: S) -> Self {
        Self { meta, source }
    }

    /// Decodes one column for the given rows; `None` when the block has no such column.
    pub fn column(&self, name: &str, rows: &Rows) -> Result<Option<ArrayRef>> {
        if self.meta.column(name).is_none() {
            return Ok(None);
        }
        let bytes = self.source.chunk(name)?.ok_or_else(|| {
            StorageError::corrupt("block", format!("column chunk {name} missing"))
        })?;
        let cached = self.source.metadata(name);
        let known = cached.is_some();
        let (array, metadata) = decode_chunk_with(bytes, rows.selection(self.meta.rows), cached)?;
        if !known {
            self.source.remember(name, &metadata);
        }
        if array.len() != rows.len(self.meta.rows) {
            return Err(StorageError::corrupt(
                "column chunk",
                format!("{name}: wrong row count"),
            ));
        }
        Ok(Some(array))
    }

    fn required(&self, name: &str, rows: &Rows) -> Result<ArrayRef> {
        self.column(name, rows)?
            .ok_or_else(|| StorageError::corrupt("block", format!("core column {name} missing")))
    }

    /// Trace ids of the given rows.
    pub fn trace_ids(&self, rows: &Rows) -> Result<Vec<TraceId>> {
        let a = self.required(col::TRACE_ID, rows)?;
        let a = downcast::<FixedSizeBinaryArray>(&a, col::TRACE_ID)?;
        Ok(a.iter()
            .map(|v| TraceId::from_slice(v.unwrap_or_default()).unwrap_or_default())
            .collect())
    }

    /// Span ids of the given rows.
    pub fn span_ids(&self, rows: &Rows) -> Result<Vec<SpanId>> {
        let a = self.required(col::SPAN_ID, rows)?;
        let a = downcast::<FixedSizeBinaryArray>(&a, col::SPAN_ID)?;
        Ok(a.iter()
            .map(|v| SpanId::from_slice(v.unwrap_or_default()).unwrap_or_default())
            .collect())
    }

    /// An int64 core column (start time, duration, …).
    pub fn ints(&self, name: &str, rows: &Rows) -> Result<Vec<i64>> {
        let gaps = self
            .meta
            .column(name)
            .is_some_and(|c| c.transform == Transform::GapAfterPreviousEnd);
        if gaps {
            return self.starts(rows);
        }
        self.raw_ints(name, rows)
    }

    fn raw_ints(&self, name: &str, rows: &Rows) -> Result<Vec<i64>> {
        let a = self.required(name, rows)?;
        Ok(downcast::<Int64Array>(&a, name)?.values().to_vec())
    }

    /// Absolute start times from gap-encoded ones (see [`Transform::GapAfterPreviousEnd`]): a
    /// range is widened back to its page's first row, which holds an absolute time.
    fn starts(&self, rows: &Rows) -> Result<Vec<i64>> {
        match rows {
            Rows::All => self.rebuild_starts(&Rows::All),
            Rows::Range(start, len) => {
                let back = start % PAGE_ROWS as u32;
                let all = self.rebuild_starts(&Rows::Range(start - back, len + back))?;
                Ok(all[back as usize..].to_vec())
            }
            Rows::Set(set) => {
                // Rebuild only the pages holding selected rows (each page starts absolute),
                // unless they are most of the block.
                let page = PAGE_ROWS as u32;
                let mut pages: Vec<u32> = set.iter().map(|r| r / page).collect();
                pages.dedup();
                let total_pages = self.meta.rows.div_ceil(page).max(1);
                if pages.len() as u32 * 2 > total_pages {
                    let all = self.rebuild_starts(&Rows::All)?;
                    return Ok(set
                        .iter()
                        .filter_map(|r| all.get(r as usize).copied())
                        .collect());
                }
                let mut out = Vec::with_capacity(set.len() as usize);
                let mut rows = set.iter().peekable();
                for p in pages {
                    let first = p * page;
                    let len = page.min(self.meta.rows.saturating_sub(first));
                    let starts = self.rebuild_starts(&Rows::Range(first, len))?;
                    while let Some(&r) = rows.peek() {
                        if r / page != p {
                            break;
                        }
                        out.extend(starts.get((r - first) as usize).copied());
                        rows.next();
                    }
                }
                Ok(out)
            }
        }
    }

    /// `rows` must begin on a page boundary.
    fn rebuild_starts(&self, rows: &Rows) -> Result<Vec<i64>> {
        let gaps = self.raw_ints(col::START, rows)?;
        let durations = self.raw_ints(col::DURATION, rows)?;
        let traces = self.trace_ids(rows)?;
        let first = match rows {
            Rows::Range(start, _) => *start as usize,
            _ => 0,
        };
        let mut out = Vec::with_capacity(gaps.len());
        for i in 0..gaps.len() {
            let absolute =
                (first + i).is_multiple_of(PAGE_ROWS) || i == 0 || traces[i] != traces[i - 1];
            let start = if absolute {
                gaps[i]
            } else {
                out[i - 1] + durations[i - 1] + gaps[i]
            };
            out.push(start);
        }
        Ok(out)
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
        let derived = self.derived(meta.transform, rows, None)?;
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
    ) -> Result<Option<Vec<f64>>> {
        Ok(match transform {
            Transform::None | Transform::GapAfterPreviousEnd => None,
            Transform::DurationMillis => {
                let owned;
                let durations = match durations {
                    Some(d) => d,
                    None => {
                        owned = self.ints(col::DURATION, rows)?;
                        &owned
                    }
                };
                Some(durations.iter().map(|d| millis(*d)).collect())
            }
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
        Ok(Some(match self.derived(meta.transform, rows, None)? {
            Some(values) => {
                let floats: Float64Array = values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| array.is_valid(i).then_some(*v))
                    .collect();
                (ty, Arc::new(floats) as ArrayRef)
            }
            None => (ty, array),
        }))
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
            out.push(AttrColumn {
                key: key.to_owned(),
                dedicated,
                ty: c.ty.ok_or_else(|| {
                    StorageError::corrupt("block meta", format!("{} has no type", c.name))
                })?,
                array,
                derived: self.derived(c.transform, rows, Some(durations))?,
            });
        }
        Ok(out)
    }
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
