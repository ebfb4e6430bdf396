//! Builds a block from head rows: sorts them, splits attributes into dedicated, dynamic,
//! generic-map and long-value columns, encodes each column chunk, and derives the trace
//! summaries and bitmap postings of the block.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BinaryBuilder, BooleanBuilder, FixedSizeBinaryBuilder, Float64Array, Float64Builder,
    Int8Array, Int64Builder, ListBuilder, StringBuilder,
};
use roaring::RoaringBitmap;

use super::format::{
    BlockMeta, ColumnKind, ColumnMeta, Compression, Enc, PAGE_ROWS, TraceEntry, Transform,
    encode_chunk_with, encode_postings,
};
use crate::codec::Writer;
use crate::error::Result;
use crate::model::{KeyValue, SpanId, SpanRecord, StatusCode, Value};
use crate::request::{self, OPEN_DIM, OPEN_TERM, ParentPlace};
use crate::rollup::{OpRollup, RowOps};
use crate::schema::{
    ColumnType, DEDICATED, DIM_KIND, DIM_NAME, DIM_SERVICE, DIM_STATUS, dedicated_for, is_long,
};
use crate::summary::TraceRoot;

/// Names of the columns every block has.
pub mod col {
    pub const TRACE_ID: &str = "trace_id";
    pub const SPAN_ID: &str = "span_id";
    pub const PARENT_SPAN_ID: &str = "parent_span_id";
    pub const TRACE_STATE: &str = "trace_state";
    pub const FLAGS: &str = "flags";
    pub const NAME: &str = "name";
    pub const KIND: &str = "kind";
    pub const START: &str = "start_time";
    pub const DURATION: &str = "duration_ns";
    pub const STATUS_CODE: &str = "status_code";
    pub const STATUS_MESSAGE: &str = "status_message";
    pub const SERVICE: &str = "service_name";
    pub const RESOURCE: &str = "resource";
    pub const SCOPE: &str = "scope";
    pub const DROPPED_ATTRIBUTES: &str = "dropped_attributes";
    pub const DROPPED_EVENTS: &str = "dropped_events";
    pub const DROPPED_LINKS: &str = "dropped_links";
    pub const EVENTS: &str = "events";
    pub const LINKS: &str = "links";
    pub const ALIAS_MASK: &str = "alias_mask";
    pub const ATTRIBUTES_OTHER: &str = "attributes_other";
    pub const LONG_VALUES: &str = "long_values";
    /// Each row's parent as a place in its trace's run of rows (see `parent_ranks`): lets a
    /// reader name a parent row's span id by its children's parent id (a small dictionary
    /// chunk) instead of the span-id chunk, the block's largest (8 random bytes a row).
    /// Absent from blocks written before it, and from blocks where a trace holds one span id
    /// twice.
    pub const PARENT_RANK: &str = "parent_rank";
    /// The minority rows (see `minority_rows`): their row numbers, absolute start times and
    /// durations, bit-packed. Absent when the block has no dominant span name.
    pub const MINOR_ROWS: &str = "minor_rows";
    pub const MINOR_START: &str = "minor_start";
    pub const MINOR_DURATION: &str = "minor_duration";
    /// The block's operation rollup (see [`crate::rollup`]): not an Arrow chunk but the
    /// rollup's own encoding. Absent from blocks written before it.
    pub const ROLLUP_OPS: &str = "rollup_ops";
    /// The block's latency histograms by second ([`crate::heat`]), its own encoding.
    pub const ROLLUP_HEAT: &str = "rollup_heat";
    /// The block's request rows and span counts by request values ([`crate::requests`]).
    pub const ROLLUP_REQUESTS: &str = "rollup_requests";
    pub const DEDICATED_PREFIX: &str = "d:";
    pub const DYNAMIC_PREFIX: &str = "a:";
}

/// At most this many attribute keys get a dynamic column per block; the rest go to the map.
pub const MAX_DYNAMIC_COLUMNS: usize = 64;

/// A block ready to be written: its meta, column chunks, trace summaries and postings.
pub struct BuiltBlock {
    pub meta: BlockMeta,
    pub chunks: Vec<(String, Vec<u8>)>,
    pub traces: Vec<TraceEntry>,
    pub postings: Vec<(String, Vec<u8>)>,
}

/// A typed Arrow builder for one attribute column.
enum TypedBuilder {
    Str(StringBuilder),
    Int(Int64Builder),
    Double(Float64Builder),
    Bool(BooleanBuilder),
    StrList(ListBuilder<StringBuilder>),
}

impl TypedBuilder {
    fn new(ty: ColumnType) -> Self {
        match ty {
            ColumnType::Str => Self::Str(StringBuilder::new()),
            ColumnType::Int => Self::Int(Int64Builder::new()),
            ColumnType::Double => Self::Double(Float64Builder::new()),
            ColumnType::Bool => Self::Bool(BooleanBuilder::new()),
            ColumnType::StrList => Self::StrList(ListBuilder::new(StringBuilder::new())),
        }
    }

    /// Appends a value of the column's type; false (and nothing appended) for another type.
    fn try_append(&mut self, v: &Value) -> bool {
        match (self, v) {
            (Self::Str(b), Value::Str(s)) => b.append_value(s),
            (Self::Int(b), Value::Int(i)) => b.append_value(*i),
            (Self::Double(b), Value::Double(d)) => b.append_value(*d),
            (Self::Bool(b), Value::Bool(x)) => b.append_value(*x),
            (Self::StrList(b), Value::Array(items))
                if items.iter().all(|i| matches!(i, Value::Str(_))) =>
            {
                for item in items {
                    if let Value::Str(s) = item {
                        b.values().append_value(s);
                    }
                }
                b.append(true);
            }
            _ => return false,
        }
        true
    }

    fn append_nulls(&mut self, n: usize) {
        match self {
            Self::Str(b) => b.append_nulls(n),
            Self::Int(b) => b.append_nulls(n),
            Self::Double(b) => b.append_nulls(n),
            Self::Bool(b) => b.append_nulls(n),
            Self::StrList(b) => b.append_nulls(n),
        }
    }

    fn finish(self) -> (ArrayRef, Enc) {
        match self {
            Self::Str(mut b) => (Arc::new(b.finish()), Enc::Dict),
            // token indexes and counters: delta costs ~0 bits on runs and sequences
            Self::Int(mut b) => (Arc::new(b.finish()), Enc::Delta),
            Self::Double(mut b) => (Arc::new(b.finish()), Enc::Split),
            Self::Bool(mut b) => (Arc::new(b.finish()), Enc::Plain),
            Self::StrList(mut b) => (Arc::new(b.finish()), Enc::Dict),
        }
    }
}

/// An attribute column being filled. Rows without a value are appended as nulls when a later
/// row offers one (or at the end), not one by one: most columns are set on few rows.
struct AttrColumn {
    builder: TypedBuilder,
    /// Rows appended so far, values and nulls.
    rows: usize,
}

impl AttrColumn {
    fn new(ty: ColumnType) -> Self {
        Self {
            builder: TypedBuilder::new(ty),
            rows: 0,
        }
    }

    /// Offers `row`'s value; false (nothing stored) when it is not of the column's type or the
    /// row has a value already (a repeated key in one span keeps its second value in the map).
    fn offer(&mut self, row: usize, v: &Value) -> bool {
        if self.rows > row {
            return false;
        }
        self.builder.append_nulls(row - self.rows);
        self.rows = row;
        if self.builder.try_append(v) {
            self.rows += 1;
            return true;
        }
        false
    }

    /// The column over `rows` rows, and its encoding.
    fn finish(mut self, rows: usize) -> (ArrayRef, Enc) {
        self.builder.append_nulls(rows - self.rows);
        self.builder.finish()
    }
}

/// The dedicated column of each attribute of each row (rows in order, each row's attributes
/// in order), and whether it is named by its alias: looked up once per block.
fn classify(rows: &[&SpanRecord]) -> Vec<Option<(usize, bool)>> {
    rows.iter()
        .flat_map(|r| &r.attributes)
        .map(|kv| dedicated_for(&kv.key))
        .collect()
}

/// Picks the dynamic columns of a block: the most frequent plain attribute keys, typed by
/// their most frequent value type.
fn choose_dynamic(
    rows: &[&SpanRecord],
    classes: &[Option<(usize, bool)>],
) -> Vec<(String, ColumnType)> {
    let mut counts: HashMap<(&str, ColumnType), usize> = HashMap::default();
    for (kv, class) in rows.iter().flat_map(|r| &r.attributes).zip(classes) {
        if class.is_some() || is_long(&kv.key, &kv.value) {
            continue;
        }
        if let Some(ty) = ColumnType::of(&kv.value).filter(|t| *t != ColumnType::StrList) {
            *counts.entry((kv.key.as_str(), ty)).or_default() += 1;
        }
    }
    let mut best: BTreeMap<&str, (usize, ColumnType)> = BTreeMap::new();
    for ((key, ty), n) in counts {
        let e = best.entry(key).or_insert((n, ty));
        if n > e.0 || (n == e.0 && ty.code() < e.1.code()) {
            *e = (n, ty);
        }
    }
    let mut keys: Vec<_> = best.into_iter().collect();
    keys.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(b.0)));
    keys.truncate(MAX_DYNAMIC_COLUMNS);
    keys.into_iter()
        .map(|(k, (_, ty))| (k.to_owned(), ty))
        .collect()
}

/// A column of values shared by many rows (resources, scopes: one per exporting process),
/// built as a dictionary: each distinct value (told apart by its `Arc`, then by its encoding)
/// encoded and kept once, a key per row. Copying a resource's encoding into every row cost
/// more than the rest of a block's build on SDK-shaped data (17 resource attributes).
#[derive(Default)]
struct SharedBlobs {
    by_ptr: HashMap<*const (), i32>,
    by_value: HashMap<Vec<u8>, i32>,
    values: Vec<Vec<u8>>,
    keys: Vec<i32>,
}

impl SharedBlobs {
    fn push(&mut self, ptr: *const (), encode: impl FnOnce(&mut Writer)) {
        let key = match self.by_ptr.get(&ptr) {
            Some(&k) => k,
            None => {
                let mut w = Writer::default();
                encode(&mut w);
                let next = self.values.len() as i32;
                let k = *self.by_value.entry(w.buf.clone()).or_insert(next);
                if k == next {
                    self.values.push(w.buf);
                }
                self.by_ptr.insert(ptr, k);
                k
            }
        };
        self.keys.push(key);
    }

    fn finish(self) -> Result<ArrayRef> {
        let values = arrow::array::BinaryArray::from_iter_values(self.values.iter());
        let keys = arrow::array::Int32Array::from(self.keys);
        Ok(Arc::new(arrow::array::DictionaryArray::try_new(
            keys,
            Arc::new(values),
        )?))
    }
}

/// The postings being built: dimension -> term -> rows.
#[derive(Default)]
pub(super) struct Postings(BTreeMap<String, BTreeMap<String, RoaringBitmap>>);

impl Postings {
    pub(super) fn add(&mut self, dim: &str, term: &str, row: u32) {
        // The common case (a known dimension and term) allocates nothing.
        if let Some(rows) = self.0.get_mut(dim).and_then(|terms| terms.get_mut(term)) {
            rows.insert(row);
            return;
        }
        self.0
            .entry(dim.to_owned())
            .or_default()
            .entry(term.to_owned())
            .or_default()
            .insert(row);
    }
    fn add_range(&mut self, dim: String, term: String, rows: std::ops::Range<u32>) {
        self.0
            .entry(dim)
            .or_default()
            .entry(term)
            .or_default()
            .insert_range(rows);
    }
    pub(super) fn encode(self, compression: Compression) -> Result<Vec<(String, Vec<u8>)>> {
        self.0
            .into_iter()
            .map(|(dim, terms)| {
                let terms: Vec<_> = terms.into_iter().collect();
                Ok((dim, encode_postings(&terms, compression)?))
            })
            .collect()
    }
}

/// Sorts `rows` by (trace, start, span) and builds the block, compressed where it pays.
#[cfg(test)]
pub fn build_block(rows: Vec<&SpanRecord>) -> Result<BuiltBlock> {
    build_block_with(rows, Compression::Zstd)
}

/// [`build_block`] with the given chunk compression.
pub fn build_block_with(
    mut rows: Vec<&SpanRecord>,
    compression: Compression,
) -> Result<BuiltBlock> {
    rows.sort_by_key(|s| (s.trace_id, s.start, s.span_id));
    let classes = classify(&rows);
    let dynamic = choose_dynamic(&rows, &classes);
    let dynamic_index: HashMap<&str, usize> = dynamic
        .iter()
        .enumerate()
        .map(|(i, (k, _))| (k.as_str(), i))
        .collect();
    let mut dedicated: Vec<AttrColumn> = DEDICATED.iter().map(|d| AttrColumn::new(d.ty)).collect();
    let mut dynamic_cols: Vec<AttrColumn> =
        dynamic.iter().map(|(_, ty)| AttrColumn::new(*ty)).collect();

    let n = rows.len();
    let mut trace_ids = FixedSizeBinaryBuilder::with_capacity(n, 16);
    let mut span_ids = FixedSizeBinaryBuilder::with_capacity(n, 8);
    let mut parents = FixedSizeBinaryBuilder::with_capacity(n, 8);
    let mut trace_state = StringBuilder::new();
    let mut names = StringBuilder::new();
    let mut services = StringBuilder::new();
    let mut status_message = StringBuilder::new();
    let mut resources = SharedBlobs::default();
    let mut scopes = SharedBlobs::default();
    let mut events = BinaryBuilder::new();
    let mut links = BinaryBuilder::new();
    let mut other = BinaryBuilder::new();
    let mut long = BinaryBuilder::new();
    let int_cols = 9;
    let mut ints: Vec<Int64Builder> = (0..int_cols)
        .map(|_| Int64Builder::with_capacity(n))
        .collect();
    let mut postings = Postings::default();
    // each row's own values of the request dimensions, row-major
    let d = request::request_dims().len();
    let mut request_values: Vec<Option<&Value>> = vec![None; n * d];
    let mut classes = classes.into_iter();
    let row_ops = RowOps::of(&rows);
    // each token span's latency as the heat rollup reads it, found here with its column
    let itl_column = crate::heat::token_latency_column();
    let mut heat = crate::heat::RowHeat::new(&row_ops);

    let (mut min_start, mut max_start, mut max_end) = (u64::MAX, 0, 0);
    for (row, span) in rows.iter().enumerate() {
        let row = row as u32;
        min_start = min_start.min(span.start.0);
        max_start = max_start.max(span.start.0);
        max_end = max_end.max(span.end.0);
        trace_ids.append_value(span.trace_id.0)?;
        span_ids.append_value(span.span_id.0)?;
        match span.parent_span_id {
            Some(p) => parents.append_value(p.0)?,
            None => parents.append_null(),
        }
        trace_state.append_value(&span.trace_state);
        names.append_value(&span.name);
        let op = row_ops.of_row[row as usize];
        let service = row_ops.ops[op as usize].0.as_str();
        services.append_value(service);
        status_message.append_value(&span.status_message);
        resources.push(Arc::as_ptr(&span.resource).cast(), |w| {
            w.resource(&span.resource)
        });
        scopes.push(Arc::as_ptr(&span.scope).cast(), |w| w.scope(&span.scope));
        append_blob(&mut events, span.events.is_empty(), |w| {
            w.events(&span.events)
        });
        append_blob(&mut links, span.links.is_empty(), |w| w.links(&span.links));

        let mut itl = None;
        let mut alias_mask = 0i64;
        let mut rest: Vec<&KeyValue> = Vec::new();
        let mut longs: Vec<&KeyValue> = Vec::new();
        for kv in &span.attributes {
            let class = classes.next().flatten();
            if let (Some((i, _)), Value::Double(v)) = (class, &kv.value)
                && Some(i) == itl_column
            {
                itl.get_or_insert(*v);
            }
            if let Some((i, _)) = class
                && let Some(slot) = request::request_slot(i, &kv.value)
            {
                request_values[row as usize * d + slot].get_or_insert(&kv.value);
            }
            if let Some((i, via_alias)) = class
                && dedicated[i].offer(row as usize, &kv.value)
            {
                if via_alias {
                    alias_mask |= 1 << i;
                }
                if DEDICATED[i].indexed
                    && let Some(term) = kv.value.as_term()
                {
                    postings.add(DEDICATED[i].name, &term, row);
                }
                continue;
            }
            if is_long(&kv.key, &kv.value) {
                longs.push(kv);
            } else if !dynamic_index
                .get(kv.key.as_str())
                .is_some_and(|&i| dynamic_cols[i].offer(row as usize, &kv.value))
            {
                rest.push(kv);
            }
        }
        append_blob(&mut other, rest.is_empty(), |w| write_kv_refs(w, &rest));
        append_blob(&mut long, longs.is_empty(), |w| write_kv_refs(w, &longs));

        let values = [
            span.flags as i64,
            span.kind as i64,
            start_gap(&rows, row as usize),
            span.duration_ns() as i64,
            span.status_code as i64,
            span.dropped_attributes_count as i64,
            span.dropped_events_count as i64,
            span.dropped_links_count as i64,
            alias_mask,
        ];
        for (b, v) in ints.iter_mut().zip(values) {
            b.append_value(v);
        }
        heat.add(op, span, itl);
        postings.add(DIM_SERVICE, service, row);
        postings.add(DIM_NAME, &span.name, row);
        postings.add(DIM_STATUS, span.status_code.as_str(), row);
        postings.add(DIM_KIND, span.kind.as_str(), row);
    }

    let traces = trace_entries(&rows);
    let (places, unique) = parent_places(&rows, &traces);
    let (exits, carriers) =
        add_request_postings(&mut postings, &rows, &traces, &places, &mut request_values);

    let mut ints = ints
        .into_iter()
        .map(|mut b| Arc::new(b.finish()) as ArrayRef);
    let mut next_int = || ints.next().expect("int column");
    let core: Vec<(&str, ArrayRef, Enc)> = vec![
        (col::TRACE_ID, Arc::new(trace_ids.finish()), Enc::Dict),
        (col::SPAN_ID, Arc::new(span_ids.finish()), Enc::Plain),
        (col::PARENT_SPAN_ID, Arc::new(parents.finish()), Enc::Dict),
        (col::TRACE_STATE, Arc::new(trace_state.finish()), Enc::Dict),
        (col::FLAGS, next_int(), Enc::Dict),
        (col::KIND, next_int(), Enc::Dict),
        // gaps after the previous end (see start_gap) and durations: small but unsorted, read
        // by nearly every query, often one row of many: bit-packed per page, each value
        // readable alone (byte-stream-split + zstd was as small but decoded whole pages)
        (col::START, next_int(), Enc::Packed),
        (col::DURATION, next_int(), Enc::Packed),
        (col::STATUS_CODE, next_int(), Enc::Dict),
        (col::DROPPED_ATTRIBUTES, next_int(), Enc::Dict),
        (col::DROPPED_EVENTS, next_int(), Enc::Dict),
        (col::DROPPED_LINKS, next_int(), Enc::Dict),
        (col::ALIAS_MASK, next_int(), Enc::Dict),
        (col::NAME, Arc::new(names.finish()), Enc::Dict),
        (col::SERVICE, Arc::new(services.finish()), Enc::Dict),
        (
            col::STATUS_MESSAGE,
            Arc::new(status_message.finish()),
            Enc::Dict,
        ),
        (col::RESOURCE, resources.finish()?, Enc::Dict),
        (col::SCOPE, scopes.finish()?, Enc::Dict),
        (col::EVENTS, Arc::new(events.finish()), Enc::Plain),
        (col::LINKS, Arc::new(links.finish()), Enc::Plain),
        (col::ATTRIBUTES_OTHER, Arc::new(other.finish()), Enc::Plain),
        (col::LONG_VALUES, Arc::new(long.finish()), Enc::Plain),
    ];

    let durations: Vec<i64> = rows.iter().map(|s| s.duration_ns() as i64).collect();
    let minor = minority_rows(&postings, n);
    let mut columns = Vec::new();
    let mut chunks = Vec::new();
    let mut push = |name: String, ty, kind, array: ArrayRef, enc| -> Result<()> {
        if kind != ColumnKind::Core && array.null_count() == array.len() {
            return Ok(()); // absent attribute: no chunk at all
        }
        let (array, enc, transform) = match derive_from_duration(&array, &durations) {
            Some(presence) => (presence, Enc::Dict, Transform::DurationMillis),
            None if let Some(after) = millis_after_duration(&array, &durations) => {
                (after, Enc::Delta, Transform::MillisAfterDuration)
            }
            None if kind == ColumnKind::Core && name == col::START => {
                (array, enc, Transform::GapAfterPreviousEnd)
            }
            None => (array, enc, Transform::None),
        };
        // parent ranks are runs already, a few bytes a trace: zstd would save some of those
        // and cost a codec (zstd contexts) at every read
        let compression = match name.as_str() {
            col::PARENT_RANK => Compression::None,
            _ => compression,
        };
        // an attribute set on minority rows alone is kept over those rows alone
        let (array, minority) = match &minor {
            Some(at) if kind != ColumnKind::Core && only_at(&array, at) => {
                (arrow::compute::take(&array, at, None)?, true)
            }
            _ => (array, false),
        };
        let bytes = encode_chunk_with(&array, enc, compression)?;
        columns.push(ColumnMeta {
            name: name.clone(),
            ty,
            kind,
            transform,
            minority,
            bytes: bytes.len() as u64,
        });
        chunks.push((name, bytes));
        Ok(())
    };
    for (name, array, enc) in core {
        push(name.to_owned(), None, ColumnKind::Core, array, enc)?;
    }
    if let Some(ranks) = parent_ranks(&places, unique) {
        // constant over a trace's token spans (all children of one span): runs, a few bytes
        let ranks = Arc::new(arrow::array::Int64Array::from(ranks));
        push(
            col::PARENT_RANK.into(),
            None,
            ColumnKind::Core,
            ranks,
            Enc::Dict,
        )?;
    }
    if let Some(minor) = &minor {
        let ints = |f: &dyn Fn(u32) -> i64| -> ArrayRef {
            Arc::new(arrow::array::Int64Array::from_iter_values(
                minor.values().iter().map(|&r| f(r)),
            ))
        };
        let times: [(&str, ArrayRef); 3] = [
            (col::MINOR_ROWS, ints(&|r| i64::from(r))),
            (col::MINOR_START, ints(&|r| rows[r as usize].start.0 as i64)),
            (col::MINOR_DURATION, ints(&|r| durations[r as usize])),
        ];
        for (name, array) in times {
            push(name.into(), None, ColumnKind::Core, array, Enc::Packed)?;
        }
    }
    for (d, c) in DEDICATED.iter().zip(dedicated) {
        let (array, enc) = c.finish(n);
        let name = format!("{}{}", col::DEDICATED_PREFIX, d.name);
        push(name, Some(d.ty), ColumnKind::Dedicated, array, enc)?;
    }
    for ((key, ty), c) in dynamic.iter().zip(dynamic_cols) {
        let (array, enc) = c.finish(n);
        let name = format!("{}{}", col::DYNAMIC_PREFIX, key);
        push(name, Some(*ty), ColumnKind::Dynamic, array, enc)?;
    }

    let runs = traces.iter().map(|t| (t.row_start, t.rows));
    let ops = OpRollup::of_block(&rows, &row_ops, runs, &places).encode();
    let heat = heat.finish().encode();
    let requests = crate::requests::RequestRollup::of_block(
        &rows,
        traces.iter().map(|t| (t.row_start, t.rows)),
        &request_values,
        &exits,
        &carriers,
    )
    .encode();
    for (name, rollup) in [
        (col::ROLLUP_OPS, ops),
        (col::ROLLUP_HEAT, heat),
        (col::ROLLUP_REQUESTS, requests),
    ] {
        let rollup = super::format::pack_rollup(rollup, compression);
        columns.push(ColumnMeta {
            name: name.into(),
            ty: None,
            kind: ColumnKind::Core,
            transform: Transform::None,
            minority: false,
            bytes: rollup.len() as u64,
        });
        chunks.push((name.into(), rollup));
    }

    let meta = BlockMeta {
        rows: n as u32,
        min_start,
        max_start,
        max_end,
        columns,
    };
    Ok(BuiltBlock {
        meta,
        chunks,
        traces,
        postings: postings.encode(compression)?,
    })
}

/// A block's rows are mostly one span name where a trace carries a span per decoded token;
/// the other rows (requests, calls, prefill: a few in a hundred) are what RED metrics, request
/// percentiles and joins to a request read, one row in dozens on every page. Their start times
/// are gap-encoded among the tokens' and cost a walk from their trace's first row each, so a
/// block also keeps them apart, absolute: these are the rows outside a name that holds at least
/// this share of a block of at least [`MINORITY_MIN_ROWS`] rows.
pub const DOMINANT_SHARE: f64 = 0.8;
pub const MINORITY_MIN_ROWS: usize = 1024;

/// Whether every row holding a value of `array` is one of the rows `at`.
fn only_at(array: &ArrayRef, at: &arrow::array::UInt32Array) -> bool {
    let held = array.len() - array.logical_null_count();
    let nulls = array.logical_nulls();
    let held_at = at
        .values()
        .iter()
        .filter(|&&r| nulls.as_ref().is_none_or(|n| n.is_valid(r as usize)))
        .count();
    held_at == held
}

/// The rows outside the block's dominant span name, ascending, from the block's name
/// postings (each name's rows); `None` when no name dominates.
fn minority_rows(postings: &Postings, rows: usize) -> Option<arrow::array::UInt32Array> {
    if rows < MINORITY_MIN_ROWS {
        return None;
    }
    let names = postings.0.get(DIM_NAME)?;
    let (_, dominant) = names
        .iter()
        .max_by_key(|(name, held)| (held.len(), *name))?;
    let n = dominant.len() as usize;
    if (n as f64) < DOMINANT_SHARE * rows as f64 || n == rows {
        return None;
    }
    let mut minority = RoaringBitmap::new();
    minority.insert_range(0..rows as u32);
    minority -= dominant;
    Some(minority.iter().collect())
}

/// The start time as stored: the gap after the previous row's end within a trace (tens of
/// microseconds between tokens, where the absolute time costs four bytes), absolute on the
/// first row of each trace and of each page, so that any page decodes on its own.
fn start_gap(rows: &[&SpanRecord], i: usize) -> i64 {
    let span = rows[i];
    match i.checked_sub(1).map(|p| rows[p]) {
        Some(prev) if !i.is_multiple_of(PAGE_ROWS) && prev.trace_id == span.trace_id => {
            span.start.0 as i64 - prev.end.0 as i64
        }
        _ => span.start.0 as i64,
    }
}

/// When a float column is the span duration in milliseconds wherever it is set, returns the
/// column's presence alone (see [`Transform::DurationMillis`]).
fn derive_from_duration(array: &ArrayRef, durations: &[i64]) -> Option<ArrayRef> {
    let floats = array.as_any().downcast_ref::<Float64Array>()?;
    let derived = floats
        .iter()
        .zip(durations)
        .all(|(v, d)| v.is_none_or(|v| v.to_bits() == millis(*d).to_bits()));
    derived
        .then(|| Arc::new(floats.iter().map(|v| v.map(|_| 0i8)).collect::<Int8Array>()) as ArrayRef)
}

/// When a float column holds whole nanoseconds in milliseconds wherever it is set, returns
/// them less each row's duration (see [`Transform::MillisAfterDuration`]).
fn millis_after_duration(array: &ArrayRef, durations: &[i64]) -> Option<ArrayRef> {
    let floats = array.as_any().downcast_ref::<Float64Array>()?;
    let mut out = arrow::array::Int64Builder::with_capacity(floats.len());
    for (v, d) in floats.iter().zip(durations) {
        match v {
            None => out.append_null(),
            Some(v) => {
                let scaled = v * 1e6;
                // whole, in range, and back to the same float bit for bit
                if !scaled.is_finite() || scaled.abs() >= 9e15 {
                    return None;
                }
                let n = scaled.round() as i64;
                if millis(n).to_bits() != v.to_bits() {
                    return None;
                }
                out.append_value(n - d);
            }
        }
    }
    Some(Arc::new(out.finish()))
}

/// A duration in nanoseconds as milliseconds, the one formula writer and reader share.
pub fn millis(duration_ns: i64) -> f64 {
    duration_ns as f64 / 1e6
}

pub(super) fn append_blob(b: &mut BinaryBuilder, empty: bool, write: impl FnOnce(&mut Writer)) {
    if empty {
        b.append_null();
    } else {
        let mut w = Writer::default();
        write(&mut w);
        b.append_value(&w.buf);
    }
}

fn write_kv_refs(w: &mut Writer, kvs: &[&KeyValue]) {
    w.u64(kvs.len() as u64);
    for kv in kvs {
        w.str(&kv.key);
        w.value(&kv.value);
    }
}

/// Where each row's parent is in its trace's run of rows (the rows in order), and whether no
/// trace holds one span id twice.
fn parent_places(rows: &[&SpanRecord], traces: &[TraceEntry]) -> (Vec<ParentPlace>, bool) {
    let mut places = Vec::with_capacity(rows.len());
    let mut unique = true;
    for t in traces {
        let spans = &rows[t.row_start as usize..(t.row_start + t.rows) as usize];
        let ids: Vec<SpanId> = spans.iter().map(|s| s.span_id).collect();
        let parents: Vec<Option<SpanId>> = spans.iter().map(|s| s.parent_span_id).collect();
        let (of_trace, once) = request::parent_places(&ids, &parents);
        places.extend(of_trace);
        unique &= once;
    }
    (places, unique)
}

/// Each row's parent as its place in its trace's run of rows plus one; 0 when it has no parent
/// or its parent is not among those rows. `None` when a trace holds one span id twice: a place
/// would then not name the one row a parent id joins to.
fn parent_ranks(places: &[ParentPlace], unique: bool) -> Option<Vec<i64>> {
    unique.then(|| {
        places
            .iter()
            .map(|p| match p {
                ParentPlace::At(place) => i64::from(*place) + 1,
                ParentPlace::Root | ParentPlace::Missing => 0,
            })
            .collect()
    })
}

/// One entry per trace run of the sorted rows.
fn trace_entries(rows: &[&SpanRecord]) -> Vec<TraceEntry> {
    let mut out: Vec<TraceEntry> = Vec::new();
    for (i, span) in rows.iter().enumerate() {
        let new_trace = out.last().is_none_or(|e| e.trace_id != span.trace_id);
        if new_trace {
            out.push(TraceEntry {
                trace_id: span.trace_id,
                row_start: i as u32,
                rows: 0,
                min_start: span.start.0,
                max_end: 0,
                errors: 0,
                root: None,
            });
        }
        let e = out.last_mut().expect("entry pushed");
        e.rows += 1;
        e.min_start = e.min_start.min(span.start.0);
        e.max_end = e.max_end.max(span.end.0);
        e.errors += u32::from(span.status_code == StatusCode::Error);
        // rows are sorted by (trace, start, span id): the first root is the earliest
        if span.parent_span_id.is_none() && e.root.is_none() {
            e.root = Some(TraceRoot {
                start: span.start.0,
                span_id: span.span_id,
                service: span.service_name().to_owned(),
                name: span.name.clone(),
            });
        }
    }
    out
}

/// Each row's request dimensions (see [`crate::request`]), resolved over the rows of its
/// trace in this block, as postings: runs of rows holding one value are added as ranges.
/// Rows whose ancestry leaves the block are marked open; the open postings are written even
/// when empty, which tells a reader the block has request postings. Returns, per row, the
/// parent id its ancestry leaves the block by (when it does) and whether it carries a request
/// value itself.
fn add_request_postings(
    postings: &mut Postings,
    rows: &[&SpanRecord],
    traces: &[TraceEntry],
    places: &[ParentPlace],
    values: &mut [Option<&Value>],
) -> (Vec<Option<SpanId>>, Vec<bool>) {
    let dims = request::request_dims();
    let d = dims.len();
    // per dimension, the run being extended: its term and first row, and the value last seen
    // (a row whose value is that same one, inherited from the same ancestor, extends the run
    // without its term being made again)
    let mut runs: Vec<Option<(String, u32)>> = vec![None; d];
    let mut last: Vec<Option<&Value>> = vec![None; d];
    let mut open: Option<u32> = None;
    let mut exits = Vec::with_capacity(places.len());
    let mut carriers = Vec::with_capacity(places.len());
    let end_run = |postings: &mut Postings, d: usize, run: Option<(String, u32)>, end: u32| {
        if let Some((term, first)) = run {
            postings.add_range(request::request_dim_name(d).to_owned(), term, first..end);
        }
    };
    for t in traces {
        let run = t.row_start as usize..(t.row_start + t.rows) as usize;
        let in_run = &mut values[run.start * d..run.end * d];
        carriers.extend(
            in_run
                .chunks(d.max(1))
                .map(|v| v.iter().any(Option::is_some)),
        );
        let here = request::resolve_places(&places[run.clone()], in_run, d);
        for (i, top) in run.clone().zip(here) {
            let exit = top.and_then(|top| rows[run.start + top as usize].parent_span_id);
            exits.push(exit);
            let is_open = top.is_some();
            let row = i as u32;
            for (slot, &dim) in dims.iter().enumerate() {
                let value = values[i * d + slot];
                let same = match (value, last[slot]) {
                    (Some(a), Some(b)) => std::ptr::eq(a, b),
                    (None, None) => true,
                    _ => false,
                };
                if same {
                    continue;
                }
                last[slot] = value;
                let term = value.and_then(Value::as_term);
                if runs[slot].as_ref().map(|(t, _)| t) != term.as_ref() {
                    end_run(postings, dim, runs[slot].take(), row);
                    runs[slot] = term.map(|t| (t, row));
                }
            }
            match (is_open, open) {
                (true, None) => open = Some(row),
                (false, Some(first)) => {
                    postings.add_range(OPEN_DIM.into(), OPEN_TERM.into(), first..row);
                    open = None;
                }
                _ => {}
            }
        }
    }
    let rows = traces.last().map_or(0, |t| t.row_start + t.rows);
    for (slot, &dim) in dims.iter().enumerate() {
        end_run(postings, dim, runs[slot].take(), rows);
    }
    if let Some(first) = open {
        postings.add_range(OPEN_DIM.into(), OPEN_TERM.into(), first..rows);
    }
    postings
        .0
        .entry(OPEN_DIM.into())
        .or_default()
        .entry(OPEN_TERM.into())
        .or_default();
    (exits, carriers)
}
