//! The columns of the `spans` table and how each is built from a block or from head rows.
//!
//! Fixed columns come first, then one per dedicated LLM attribute (named exactly as the
//! attribute), then one per dynamic attribute key present in the tenant's data, then the
//! `attributes` and `resource_attributes` maps that answer for any key.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::block::BlockMeta;
use crate::block::format::ColumnKind;
use crate::block::reader::{BlockReader, ChunkSource, Rows};
use crate::block::writer::col;
use crate::error::{Result, StorageError};
use crate::keys::BlockAddr;
use crate::model::{KeyValue, SpanKind, SpanRecord, StatusCode, TraceId, Value};
use crate::request::{dedicated_value, request_dim_name, request_dims};
use crate::schema::{
    ColumnType, DEDICATED, DIM_KIND, DIM_NAME, DIM_SERVICE, DIM_STATUS, dedicated_for,
};
use crate::store::Snapshot;
use arrow::array::{
    Array, ArrayRef, FixedSizeBinaryArray, Int64Array, StringArray, StringViewArray,
    TimestampNanosecondArray, UInt32Array,
};
use arrow::buffer::{OffsetBuffer, ScalarBuffer};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use super::arrays::{
    HEX_PAIRS, hex_column, map_column, map_type, sql_type, timestamp_type, typed_values,
    values_column,
};

/// Dynamic columns offered per tenant at most; any other key is still in `attributes`.
pub const MAX_DYNAMIC_COLUMNS: usize = 256;

/// Where a column of the `spans` table comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum SpanCol {
    TraceId,
    SpanId,
    ParentSpanId,
    ServiceName,
    Name,
    Kind,
    StatusCode,
    StatusMessage,
    StartTime,
    EndTime,
    DurationNs,
    TraceState,
    Flags,
    ScopeName,
    ScopeVersion,
    /// Index into [`DEDICATED`].
    Dedicated(usize),
    /// `"request.D"`: dedicated column `D` (an index into [`DEDICATED`]) on the span or its
    /// nearest ancestor (see [`crate::request`]).
    Request(usize),
    /// A dynamic attribute key and the SQL type it is offered as.
    Dynamic(String, DataType),
    Attributes,
    ResourceAttributes,
}

impl SpanCol {
    /// The postings dimension of a column indexed by roaring bitmaps.
    pub fn dimension(&self) -> Option<&'static str> {
        match self {
            SpanCol::ServiceName => Some(DIM_SERVICE),
            SpanCol::Name => Some(DIM_NAME),
            SpanCol::StatusCode => Some(DIM_STATUS),
            SpanCol::Kind => Some(DIM_KIND),
            SpanCol::Dedicated(i) if DEDICATED[*i].indexed => Some(DEDICATED[*i].name),
            SpanCol::Request(i) => Some(request_dim_name(*i)),
            _ => None,
        }
    }
}

/// The columns of a tenant's `spans` table as of a snapshot.
#[derive(Clone, Debug)]
pub struct SpanColumns {
    pub cols: Vec<SpanCol>,
    pub schema: SchemaRef,
}

const FIXED: &[(&str, SpanCol)] = &[
    ("trace_id", SpanCol::TraceId),
    ("span_id", SpanCol::SpanId),
    ("parent_span_id", SpanCol::ParentSpanId),
    ("service_name", SpanCol::ServiceName),
    ("name", SpanCol::Name),
    ("kind", SpanCol::Kind),
    ("status_code", SpanCol::StatusCode),
    ("status_message", SpanCol::StatusMessage),
    ("start_time", SpanCol::StartTime),
    ("end_time", SpanCol::EndTime),
    ("duration_ns", SpanCol::DurationNs),
    ("trace_state", SpanCol::TraceState),
    ("flags", SpanCol::Flags),
    ("scope_name", SpanCol::ScopeName),
    ("scope_version", SpanCol::ScopeVersion),
];

impl SpanColumns {
    /// Discovers the dynamic columns of a snapshot: every dynamic attribute key of its blocks
    /// and head rows, typed by what was stored (mixed ints and doubles become float64, any
    /// other mix text).
    ///
    /// Every query sets up its tables from a fresh snapshot, which mostly holds the same block
    /// map and head batches as the last one (both are shared and replaced, never changed):
    /// the columns of a snapshot seen before come from a memo, with the same schema.
    pub fn discover(snapshot: &Snapshot) -> Arc<Self> {
        struct Seen {
            // weak references keep the allocations, so the addresses are not reused while held
            blocks: Weak<BTreeMap<BlockAddr, Arc<BlockMeta>>>,
            head: Vec<Weak<Vec<SpanRecord>>>,
            columns: Arc<SpanColumns>,
        }
        impl Seen {
            fn is(&self, s: &Snapshot) -> bool {
                std::ptr::eq(self.blocks.as_ptr(), Arc::as_ptr(&s.blocks))
                    && self.head.len() == s.head.batches.len()
                    && self
                        .head
                        .iter()
                        .zip(&s.head.batches)
                        .all(|(w, b)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(b)))
            }
        }
        // a few snapshots per tenant at a time; dropped data leaves dead entries, cleared when full
        const SEEN: usize = 64;
        static MEMO: OnceLock<Mutex<Vec<Seen>>> = OnceLock::new();
        let memo = MEMO.get_or_init(Default::default);
        if let Some(seen) = memo
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|seen| seen.is(snapshot))
        {
            return seen.columns.clone();
        }
        let columns = Arc::new(Self::discover_keys(snapshot));
        let mut memo = memo.lock().unwrap_or_else(|e| e.into_inner());
        if memo.len() >= SEEN {
            memo.retain(|s| s.blocks.strong_count() > 0);
            if memo.len() >= SEEN {
                memo.remove(0);
            }
        }
        memo.push(Seen {
            blocks: Arc::downgrade(&snapshot.blocks),
            head: snapshot.head.batches.iter().map(Arc::downgrade).collect(),
            columns: columns.clone(),
        });
        columns
    }

    fn discover_keys(snapshot: &Snapshot) -> Self {
        let mut keys: BTreeMap<String, Vec<ColumnType>> = BTreeMap::new();
        let mut offer = |key: &str, ty: ColumnType| {
            let types = keys.entry(key.to_owned()).or_default();
            if !types.contains(&ty) {
                types.push(ty);
            }
        };
        for meta in snapshot.blocks.values() {
            for c in &meta.columns {
                if c.kind == ColumnKind::Dynamic
                    && let Some(ty) = c.ty
                {
                    offer(&c.name[col::DYNAMIC_PREFIX.len()..], ty);
                }
            }
        }
        for batch in &snapshot.head.batches {
            for (key, ty) in batch_keys(batch).iter() {
                offer(key, *ty);
            }
        }
        Self::with_dynamic(keys)
    }

    pub fn with_dynamic(keys: BTreeMap<String, Vec<ColumnType>>) -> Self {
        let mut fields = Vec::new();
        let mut cols = Vec::new();
        for (name, c) in FIXED {
            let (ty, nullable) = match c {
                SpanCol::StartTime | SpanCol::EndTime => (timestamp_type(), false),
                SpanCol::DurationNs | SpanCol::Flags => (DataType::Int64, false),
                SpanCol::ParentSpanId => (DataType::Utf8, true),
                // few distinct values, grouped and compared by most queries: string views, which
                // point into one copy of each value (or hold it inline) instead of copying it
                // per row
                SpanCol::ServiceName | SpanCol::Name | SpanCol::Kind | SpanCol::StatusCode => {
                    (DataType::Utf8View, false)
                }
                _ => (DataType::Utf8, false),
            };
            fields.push(Field::new(*name, ty, nullable));
            cols.push(c.clone());
        }
        for (i, d) in DEDICATED.iter().enumerate() {
            // an indexed text dimension (model version, adapter, worker, …) has few distinct
            // values and is grouped, joined and compared by most queries: string views, as the
            // core columns above
            let ty = if d.indexed && d.ty == ColumnType::Str {
                DataType::Utf8View
            } else {
                sql_type(d.ty)
            };
            fields.push(Field::new(d.name, ty, true));
            cols.push(SpanCol::Dedicated(i));
        }
        for &i in request_dims() {
            let d = &DEDICATED[i];
            let ty = match d.ty {
                ColumnType::Str => DataType::Utf8View,
                other => sql_type(other),
            };
            fields.push(Field::new(request_column(i), ty, true));
            cols.push(SpanCol::Request(i));
        }
        let taken = |k: &str| {
            FIXED.iter().any(|(n, _)| *n == k)
                || dedicated_for(k).is_some()
                || k.strip_prefix(REQUEST_COLUMN_PREFIX)
                    .and_then(dedicated_for)
                    .is_some()
                || k == "attributes"
                || k == "resource_attributes"
        };
        for (key, types) in keys
            .into_iter()
            .filter(|(k, _)| !taken(k))
            .take(MAX_DYNAMIC_COLUMNS)
        {
            let ty = match types.as_slice() {
                [one] => sql_type(*one),
                _ if types
                    .iter()
                    .all(|t| matches!(t, ColumnType::Int | ColumnType::Double)) =>
                {
                    DataType::Float64
                }
                _ => DataType::Utf8,
            };
            fields.push(Field::new(&key, ty.clone(), true));
            cols.push(SpanCol::Dynamic(key, ty));
        }
        fields.push(Field::new("attributes", map_type(), false));
        cols.push(SpanCol::Attributes);
        fields.push(Field::new("resource_attributes", map_type(), false));
        cols.push(SpanCol::ResourceAttributes);
        Self {
            cols,
            schema: Arc::new(Schema::new(fields)),
        }
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.schema.index_of(name).ok()
    }
}

/// The dynamic attribute keys (and value types) of one head batch, computed once per batch:
/// batches are immutable, and every query over the head would otherwise walk all its rows.
fn batch_keys(batch: &Arc<Vec<SpanRecord>>) -> Arc<Vec<(String, ColumnType)>> {
    type Cache = HashMap<usize, (Weak<Vec<SpanRecord>>, Arc<Vec<(String, ColumnType)>>)>;
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = Arc::as_ptr(batch) as usize;
    if let Some((weak, keys)) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key)
        && weak.upgrade().is_some_and(|b| Arc::ptr_eq(&b, batch))
    {
        return keys.clone();
    }
    let mut found: Vec<(String, ColumnType)> = Vec::new();
    for span in batch.iter() {
        for kv in &span.attributes {
            if dedicated_for(&kv.key).is_some() || crate::schema::is_long(&kv.key, &kv.value) {
                continue;
            }
            // as in blocks: lists of strings stay in the generic map unless dedicated
            if let Some(ty) = ColumnType::of(&kv.value).filter(|t| *t != ColumnType::StrList)
                && !found.iter().any(|(k, t)| *k == kv.key && *t == ty)
            {
                found.push((kv.key.clone(), ty));
            }
        }
    }
    let keys = Arc::new(found);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if cache.len() >= 4096 {
        cache.retain(|_, (weak, _)| weak.strong_count() > 0);
    }
    cache.insert(key, (Arc::downgrade(batch), keys.clone()));
    keys
}

fn kind_str(kind: SpanKind) -> &'static str {
    kind.as_str()
}

/// Trace ids as lower-case hex strings, one per row, given each row's index into `ids`
/// (ascending: a trace's rows are one run). Only the ids of the rows asked for are encoded,
/// each once: a few selected rows of a block do not pay for its thousands of traces.
fn hex_runs(ids: &[TraceId], runs: &[u32]) -> ArrayRef {
    let mut values = Vec::with_capacity(runs.len() * 32);
    let mut last: Option<(u32, [u8; 32])> = None;
    for &r in runs {
        let text = match last {
            Some((run, text)) if run == r => text,
            _ => {
                let mut text = [0u8; 32];
                for (j, byte) in ids[r as usize].0.iter().enumerate() {
                    text[2 * j..2 * j + 2].copy_from_slice(&HEX_PAIRS[*byte as usize]);
                }
                last = Some((r, text));
                text
            }
        };
        values.extend_from_slice(&text);
    }
    let offsets = OffsetBuffer::from_lengths(std::iter::repeat_n(32, runs.len()));
    // hex digits are ASCII: the UTF-8 check cannot fail
    Arc::new(StringArray::new(offsets, values.into(), None))
}

fn conform(array: ArrayRef, ty: &DataType) -> Result<ArrayRef> {
    if array.data_type() == ty {
        Ok(array)
    } else {
        Ok(cast(&array, ty)?)
    }
}

/// Reads the given columns of some rows of a block.
pub fn read_block<S: ChunkSource>(
    reader: &BlockReader<'_, S>,
    rows: &Rows,
    columns: &SpanColumns,
    projection: &[usize],
) -> Result<Vec<ArrayRef>> {
    let meta: &BlockMeta = reader.meta;
    let n = rows.len(meta.rows);
    // shared with the decoded chunks: the start, end and duration columns copy nothing
    let mut starts: Option<ScalarBuffer<i64>> = None;
    let mut durations: Option<ScalarBuffer<i64>> = None;
    let mut other: Option<Vec<Option<Vec<KeyValue>>>> = None;
    let mut out = Vec::with_capacity(projection.len());
    for &p in projection {
        let field = columns.schema.field(p);
        let array: ArrayRef = match &columns.cols[p] {
            SpanCol::TraceId if let Some(runs) = reader.trace_runs()? => {
                // from the block's trace runs: the trace-id chunk is not decoded
                hex_runs(&runs.ids, &runs.runs_of(rows.iter(meta.rows)))
            }
            SpanCol::TraceId | SpanCol::SpanId | SpanCol::ParentSpanId => {
                let name = match &columns.cols[p] {
                    SpanCol::TraceId => col::TRACE_ID,
                    SpanCol::SpanId => col::SPAN_ID,
                    _ => col::PARENT_SPAN_ID,
                };
                let a = match &columns.cols[p] {
                    SpanCol::SpanId => reader.span_id_column(rows)?,
                    _ => required(reader, name, rows)?,
                };
                let a = a
                    .as_any()
                    .downcast_ref::<FixedSizeBinaryArray>()
                    .ok_or_else(|| {
                        StorageError::corrupt("span block", format!("{name}: unexpected type"))
                    })?;
                hex_column(a)
            }
            SpanCol::ServiceName => core_views(reader, DIM_SERVICE, col::SERVICE, rows)?,
            SpanCol::Name => core_views(reader, DIM_NAME, col::NAME, rows)?,
            SpanCol::StatusMessage => conform(
                required(reader, col::STATUS_MESSAGE, rows)?,
                &DataType::Utf8,
            )?,
            SpanCol::TraceState => {
                conform(required(reader, col::TRACE_STATE, rows)?, &DataType::Utf8)?
            }
            // a few scattered rows (the SERVER spans of a block) from the postings: a chunk
            // of codes decodes page by page, with a skip and a read for each selected row
            SpanCol::Kind | SpanCol::StatusCode
                if let Some(names) = reader.indexed_strings_of(
                    match &columns.cols[p] {
                        SpanCol::Kind => DIM_KIND,
                        _ => DIM_STATUS,
                    },
                    rows,
                )? =>
            {
                conform(names, &DataType::Utf8View)?
            }
            SpanCol::Kind => {
                static NAMES: OnceLock<StringViewArray> = OnceLock::new();
                let codes = reader.ints(col::KIND, rows)?;
                code_names(&NAMES, |k| kind_str(SpanKind::from_u8(k)), &codes)?
            }
            SpanCol::StatusCode => {
                static NAMES: OnceLock<StringViewArray> = OnceLock::new();
                let codes = reader.ints(col::STATUS_CODE, rows)?;
                code_names(&NAMES, |c| StatusCode::from_u8(c).as_str(), &codes)?
            }
            SpanCol::Flags => Arc::new(Int64Array::new(reader.ints(col::FLAGS, rows)?, None)),
            SpanCol::StartTime | SpanCol::EndTime | SpanCol::DurationNs => {
                if starts.is_none() && columns.cols[p] != SpanCol::DurationNs {
                    let (st, du) = reader.times(rows)?;
                    starts = Some(st);
                    durations = Some(du);
                }
                if durations.is_none() && columns.cols[p] != SpanCol::StartTime {
                    durations = Some(reader.ints(col::DURATION, rows)?);
                }
                match &columns.cols[p] {
                    SpanCol::StartTime => Arc::new(
                        TimestampNanosecondArray::new(starts.clone().unwrap_or_default(), None)
                            .with_timezone("UTC"),
                    ),
                    SpanCol::EndTime => {
                        let (st, du) = (
                            starts.as_deref().unwrap_or_default(),
                            durations.as_deref().unwrap_or_default(),
                        );
                        Arc::new(
                            TimestampNanosecondArray::from_iter_values(
                                st.iter().zip(du).map(|(a, b)| a + b),
                            )
                            .with_timezone("UTC"),
                        )
                    }
                    _ => Arc::new(Int64Array::new(durations.clone().unwrap_or_default(), None)),
                }
            }
            SpanCol::ScopeName | SpanCol::ScopeVersion => {
                let scopes = reader.scopes(rows)?;
                let name = columns.cols[p] == SpanCol::ScopeName;
                Arc::new(StringArray::from_iter_values(scopes.iter().map(|sc| {
                    if name {
                        sc.name.clone()
                    } else {
                        sc.version.clone()
                    }
                })))
            }
            SpanCol::Dedicated(i) if field.data_type() == &DataType::Utf8View => {
                // an indexed text dimension (see `with_dynamic`)
                let d = &DEDICATED[*i];
                let name = format!("{}{}", col::DEDICATED_PREFIX, d.name);
                indexed_views(reader, d.name, &name, rows)?
                    .unwrap_or_else(|| arrow::array::new_null_array(field.data_type(), n))
            }
            SpanCol::Request(i) => {
                // from the block's postings; rows whose ancestor is elsewhere are fixed by
                // the caller (the query crate's request columns)
                reader.postings_terms(request_dim_name(*i), rows, field.data_type())?
            }
            SpanCol::Dedicated(i) => {
                let name = format!("{}{}", col::DEDICATED_PREFIX, DEDICATED[*i].name);
                match reader.attribute_array(&name, rows)? {
                    Some((_, a)) => conform(a, field.data_type())?,
                    None => arrow::array::new_null_array(field.data_type(), n),
                }
            }
            SpanCol::Dynamic(key, ty) => {
                let name = format!("{}{}", col::DYNAMIC_PREFIX, key);
                let typed = match reader.attribute_array(&name, rows)? {
                    Some((_, a)) => conform(a, ty)?,
                    None => arrow::array::new_null_array(ty, n),
                };
                // Rows whose value did not fit the block's typed column sit in the generic map.
                if other.is_none() {
                    other = Some(other_attributes(reader, rows)?);
                }
                let rest = other.as_ref().expect("just set");
                if rest.iter().all(Option::is_none) {
                    typed
                } else {
                    let typed_values = typed_values(&typed);
                    values_column(
                        ty,
                        typed_values.into_iter().zip(rest).map(|(v, kvs)| {
                            v.or_else(|| {
                                kvs.as_ref()?
                                    .iter()
                                    .find(|kv| kv.key == *key)
                                    .map(|kv| kv.value.clone())
                            })
                        }),
                    )
                }
            }
            SpanCol::Attributes => {
                let attrs = reader.row_attributes(rows, true)?;
                map_column(attrs.iter().map(Vec::as_slice))?
            }
            SpanCol::ResourceAttributes => {
                let res = reader.resources(rows)?;
                map_column(res.iter().map(|r| r.attributes.as_slice()))?
            }
        };
        out.push(array);
    }
    Ok(out)
}

fn required<S: ChunkSource>(
    reader: &BlockReader<'_, S>,
    name: &str,
    rows: &Rows,
) -> Result<ArrayRef> {
    reader.column(name, rows)?.ok_or_else(|| {
        StorageError::corrupt("span block", format!("block lacks core column {name}"))
    })
}

/// A string column indexed by postings (`service_name`, `name`, an indexed LLM dimension) as
/// string views: a few rows (a trace's run, a lookup's scattered rows) from the block's postings
/// of it, so the column's chunk is not decompressed and decoded for them; otherwise straight
/// from its dictionary pages. `None` when the block has no such column.
fn indexed_views<S: ChunkSource>(
    reader: &BlockReader<'_, S>,
    dim: &str,
    name: &str,
    rows: &Rows,
) -> Result<Option<ArrayRef>> {
    let array = match reader.indexed_strings_of(dim, rows)? {
        Some(a) => Some(a),
        None => reader.string_views(name, rows)?,
    };
    array.map(|a| conform(a, &DataType::Utf8View)).transpose()
}

/// A core string column (every block has it) as string views: see [`indexed_views`].
fn core_views<S: ChunkSource>(
    reader: &BlockReader<'_, S>,
    dim: &str,
    name: &str,
    rows: &Rows,
) -> Result<ArrayRef> {
    indexed_views(reader, dim, name, rows)?.ok_or_else(|| {
        StorageError::corrupt("span block", format!("block lacks core column {name}"))
    })
}

/// The position of dedicated column `i` among the request dimensions.
pub fn request_slot(i: usize) -> usize {
    request_dims()
        .iter()
        .position(|&d| d == i)
        .expect("a request dimension")
}

/// Prefix of the request columns' names.
pub const REQUEST_COLUMN_PREFIX: &str = "request.";

/// The name of the request column of dedicated column `i`: `request.llm.model_version`.
pub fn request_column(i: usize) -> String {
    format!("{REQUEST_COLUMN_PREFIX}{}", DEDICATED[i].name)
}

fn other_attributes<S: ChunkSource>(
    reader: &BlockReader<'_, S>,
    rows: &Rows,
) -> Result<Vec<Option<Vec<KeyValue>>>> {
    let blobs = reader
        .blobs(col::ATTRIBUTES_OTHER, rows)?
        .unwrap_or_default();
    blobs
        .into_iter()
        .map(|b| b.map(|b| crate::codec::Reader::new(&b).attrs()).transpose())
        .collect()
}

/// The names of stored one-byte codes (span kind, status code), as string views gathered
/// from the 256 possible names (built once into `names`): each row copies a 16-byte view (the
/// names are short enough to sit inside it) instead of appending its text.
fn code_names(
    names: &OnceLock<StringViewArray>,
    name_of: fn(u8) -> &'static str,
    codes: &[i64],
) -> Result<ArrayRef> {
    let names = names.get_or_init(|| StringViewArray::from_iter_values((0..=u8::MAX).map(name_of)));
    let at = UInt32Array::from_iter_values(codes.iter().map(|c| u32::from(*c as u8)));
    Ok(arrow::compute::take(names, &at, None)?)
}

/// The request values of a head row (by request slot), where the caller resolved them.
pub type RequestValues<'a> = &'a dyn Fn(&SpanRecord) -> Option<&'a [Option<Value>]>;

/// Builds the given columns from head rows (`requests`: their request values, needed when a
/// request column is projected).
pub fn read_rows(
    rows: &[&SpanRecord],
    columns: &SpanColumns,
    projection: &[usize],
    requests: Option<RequestValues<'_>>,
) -> Result<Vec<ArrayRef>> {
    let hex = |f: &dyn Fn(&SpanRecord) -> Option<String>| -> ArrayRef {
        Arc::new(rows.iter().map(|r| f(r)).collect::<StringArray>())
    };
    let strs = |f: &dyn Fn(&SpanRecord) -> &str| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| f(r))))
    };
    let views = |f: &dyn Fn(&SpanRecord) -> &str| -> ArrayRef {
        Arc::new(StringViewArray::from_iter_values(rows.iter().map(|r| f(r))))
    };
    let mut out = Vec::with_capacity(projection.len());
    for &p in projection {
        let field = columns.schema.field(p);
        let array: ArrayRef = match &columns.cols[p] {
            SpanCol::TraceId => hex(&|r| Some(r.trace_id.to_hex())),
            SpanCol::SpanId => hex(&|r| Some(r.span_id.to_hex())),
            SpanCol::ParentSpanId => hex(&|r| r.parent_span_id.map(|p| p.to_hex())),
            SpanCol::ServiceName => views(&|r| r.service_name()),
            SpanCol::Name => views(&|r| &r.name),
            SpanCol::Kind => views(&|r| kind_str(r.kind)),
            SpanCol::StatusCode => views(&|r| r.status_code.as_str()),
            SpanCol::StatusMessage => strs(&|r| &r.status_message),
            SpanCol::TraceState => strs(&|r| &r.trace_state),
            SpanCol::ScopeName => strs(&|r| &r.scope.name),
            SpanCol::ScopeVersion => strs(&|r| &r.scope.version),
            SpanCol::StartTime => Arc::new(
                TimestampNanosecondArray::from_iter_values(rows.iter().map(|r| r.start.0 as i64))
                    .with_timezone("UTC"),
            ),
            SpanCol::EndTime => Arc::new(
                TimestampNanosecondArray::from_iter_values(
                    rows.iter().map(|r| (r.start.0 + r.duration_ns()) as i64),
                )
                .with_timezone("UTC"),
            ),
            SpanCol::DurationNs => Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|r| r.duration_ns() as i64),
            )),
            SpanCol::Flags => Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|r| r.flags as i64),
            )),
            SpanCol::Dedicated(i) => values_column(
                field.data_type(),
                rows.iter().map(|r| dedicated_value(r, *i).cloned()),
            ),
            SpanCol::Request(i) => {
                let slot = request_slot(*i);
                values_column(
                    field.data_type(),
                    rows.iter()
                        .map(|r| requests.and_then(|h| h(r)).and_then(|v| v[slot].clone())),
                )
            }
            SpanCol::Dynamic(key, ty) => {
                values_column(ty, rows.iter().map(|r| r.attribute(key).cloned()))
            }
            SpanCol::Attributes => map_column(rows.iter().map(|r| r.attributes.as_slice()))?,
            SpanCol::ResourceAttributes => {
                map_column(rows.iter().map(|r| r.resource.attributes.as_slice()))?
            }
        };
        out.push(array);
    }
    Ok(out)
}
