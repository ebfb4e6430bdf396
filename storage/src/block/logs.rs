//! Blocks of log records: the column builders (which also turn head rows into the same Arrow
//! columns a block stores, so that a reader sees one kind of input), the block writer, and
//! the way back to records (for merging).
//!
//! Rows are sorted by (trace id, service, time, observed time), records of no trace first, so
//! that a trace's records are one run of rows, found through the same trace-id index as spans
//! (one entry per trace and block: its first row and row count). Columns ([`col`]): times and numbers as
//! int64 (delta-encoded times, dictionary-encoded small numbers), texts dictionary-encoded (a
//! body column falls back to plain pages by itself when its dictionary grows), the body as
//! text plus `body_value` (the codec's value, only where the body is not a string), ids as
//! fixed-size binary (null when absent), attributes, resource and scope in the codec's binary
//! form. Postings on service, severity text and event name.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BinaryArray, BinaryBuilder, FixedSizeBinaryArray, FixedSizeBinaryBuilder,
    Float64Array, Float64Builder, Int64Array, Int64Builder, ListArray, ListBuilder, StringArray,
    StringBuilder,
};

use super::format::{BlockMeta, Compression, Enc, TraceEntry, encode_core_columns};
use super::reader::{BlockReader, ChunkSource, Rows};
use super::writer::{BuiltBlock, Postings, append_blob};
use crate::codec::{Reader, Writer};
use crate::error::{Result, StorageError};
use crate::model::{LogClass, LogRecord, LogSemantics, SpanId, TraceId, UnixNanos, Value};

/// Column names of a log block.
pub mod col {
    pub const TIME: &str = "time";
    pub const OBSERVED_TIME: &str = "observed_time";
    pub const SEVERITY_NUMBER: &str = "severity_number";
    pub const SEVERITY_TEXT: &str = "severity_text";
    pub const BODY: &str = "body";
    pub const BODY_VALUE: &str = "body_value";
    pub const TRACE_ID: &str = "trace_id";
    pub const SPAN_ID: &str = "span_id";
    pub const SERVICE: &str = "service_name";
    pub const EVENT_NAME: &str = "event_name";
    pub const FLAGS: &str = "flags";
    pub const DROPPED_ATTRIBUTES: &str = "dropped_attributes";
    pub const ATTRIBUTES: &str = "attributes";
    pub const RESOURCE: &str = "resource";
    pub const SCOPE: &str = "scope";
    pub const CLASS: &str = "class";
    pub const MODEL: &str = "llm.model";
    pub const MODEL_VERSION: &str = "llm.model_version";
    pub const GENERATION_STEP: &str = "llm.generation_step";
    pub const FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
    pub const OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    pub const KV_CACHE_HIT_RATE: &str = "llm.kv_cache.hit_rate";
    pub const PREFILL_MS: &str = "llm.prefill_ms";
    pub const DECODE_MS: &str = "llm.decode_ms";
    pub const TOKENS_PER_S: &str = "llm.tokens_per_s";
    pub const WORKER: &str = "worker.id";
    pub const GPU: &str = "gpu.id";

    /// The semantic columns (named as the attributes they come from), in block order.
    pub const SEMANTIC: [&str; 12] = [
        CLASS,
        MODEL,
        MODEL_VERSION,
        GENERATION_STEP,
        FINISH_REASONS,
        OUTPUT_TOKENS,
        KV_CACHE_HIT_RATE,
        PREFILL_MS,
        DECODE_MS,
        TOKENS_PER_S,
        WORKER,
        GPU,
    ];

    /// Every column, in block order.
    pub const ALL: [&str; 27] = [
        TIME,
        OBSERVED_TIME,
        SEVERITY_NUMBER,
        SEVERITY_TEXT,
        BODY,
        BODY_VALUE,
        TRACE_ID,
        SPAN_ID,
        SERVICE,
        EVENT_NAME,
        FLAGS,
        DROPPED_ATTRIBUTES,
        ATTRIBUTES,
        RESOURCE,
        SCOPE,
        CLASS,
        MODEL,
        MODEL_VERSION,
        GENERATION_STEP,
        FINISH_REASONS,
        OUTPUT_TOKENS,
        KV_CACHE_HIT_RATE,
        PREFILL_MS,
        DECODE_MS,
        TOKENS_PER_S,
        WORKER,
        GPU,
    ];
}

/// Postings dimensions of log blocks.
pub mod dim {
    pub const SERVICE: &str = "service.name";
    pub const SEVERITY: &str = "severity_text";
    pub const EVENT_NAME: &str = "event.name";
    pub const CLASS: &str = "class";
    pub const MODEL: &str = "llm.model";
    pub const MODEL_VERSION: &str = "llm.model_version";
    pub const WORKER: &str = "worker.id";
    pub const GPU: &str = "gpu.id";
}

/// Builders of every log column, filled row by row.
pub struct LogColumns {
    ints: [Int64Builder; 5],
    severity_text: StringBuilder,
    body: StringBuilder,
    body_value: BinaryBuilder,
    trace_id: FixedSizeBinaryBuilder,
    span_id: FixedSizeBinaryBuilder,
    service: StringBuilder,
    event_name: StringBuilder,
    attributes: BinaryBuilder,
    resource: BinaryBuilder,
    scope: BinaryBuilder,
    /// class, model, model version, worker, gpu
    texts: [StringBuilder; 5],
    /// generation step, output tokens
    counts: [Int64Builder; 2],
    /// kv-cache hit rate, prefill ms, decode ms, tokens/s
    floats: [Float64Builder; 4],
    finish_reasons: ListBuilder<StringBuilder>,
    /// The last resource and scope written, by address, with their encoding: records of one
    /// request share them.
    last_resource: Option<(*const (), Vec<u8>)>,
    last_scope: Option<(*const (), Vec<u8>)>,
}

impl LogColumns {
    pub fn with_capacity(n: usize) -> Self {
        Self {
            ints: std::array::from_fn(|_| Int64Builder::with_capacity(n)),
            severity_text: StringBuilder::new(),
            body: StringBuilder::new(),
            body_value: BinaryBuilder::new(),
            trace_id: FixedSizeBinaryBuilder::with_capacity(n, 16),
            span_id: FixedSizeBinaryBuilder::with_capacity(n, 8),
            service: StringBuilder::new(),
            event_name: StringBuilder::new(),
            attributes: BinaryBuilder::new(),
            resource: BinaryBuilder::new(),
            scope: BinaryBuilder::new(),
            texts: std::array::from_fn(|_| StringBuilder::new()),
            counts: std::array::from_fn(|_| Int64Builder::with_capacity(n)),
            floats: std::array::from_fn(|_| Float64Builder::with_capacity(n)),
            finish_reasons: ListBuilder::new(StringBuilder::new()),
            last_resource: None,
            last_scope: None,
        }
    }

    pub fn push(&mut self, l: &LogRecord) {
        let ints = [
            l.time.0 as i64,
            l.observed_time.0 as i64,
            l.severity_number.into(),
            l.flags.into(),
            l.dropped_attributes_count.into(),
        ];
        for (b, v) in self.ints.iter_mut().zip(ints) {
            b.append_value(v);
        }
        self.severity_text.append_value(&l.severity_text);
        match &l.body {
            Value::Empty => {
                self.body.append_null();
                self.body_value.append_null();
            }
            Value::Str(s) => {
                self.body.append_value(s);
                self.body_value.append_null();
            }
            other => {
                self.body.append_value(other.json());
                let mut w = Writer::default();
                w.value(other);
                self.body_value.append_value(&w.buf);
            }
        }
        append_id(&mut self.trace_id, l.trace_id.as_ref().map(|t| &t.0[..]));
        append_id(&mut self.span_id, l.span_id.as_ref().map(|s| &s.0[..]));
        self.service.append_value(l.service_name());
        self.event_name.append_value(&l.event_name);
        append_blob(&mut self.attributes, l.attributes.is_empty(), |w| {
            w.attrs(&l.attributes)
        });
        let resource = shared(&mut self.last_resource, &l.resource, |w, r| w.resource(r));
        self.resource.append_value(resource);
        let scope = shared(&mut self.last_scope, &l.scope, |w, s| w.scope(s));
        self.scope.append_value(scope);
        let s = &l.semantics;
        self.texts[0].append_value(s.class.as_str());
        for (b, v) in
            self.texts[1..]
                .iter_mut()
                .zip([&s.model, &s.model_version, &s.worker, &s.gpu])
        {
            b.append_option(v.as_deref());
        }
        for (b, v) in self
            .counts
            .iter_mut()
            .zip([s.generation_step, s.output_tokens])
        {
            b.append_option(v);
        }
        let floats = [
            s.kv_cache_hit_rate,
            s.prefill_ms,
            s.decode_ms,
            s.tokens_per_s,
        ];
        for (b, v) in self.floats.iter_mut().zip(floats) {
            b.append_option(v);
        }
        match &s.finish_reasons {
            Some(reasons) => {
                reasons
                    .iter()
                    .for_each(|r| self.finish_reasons.values().append_value(r));
                self.finish_reasons.append(true);
            }
            None => self.finish_reasons.append(false),
        }
    }

    /// Every column with its encoding, in [`col::ALL`]'s order.
    pub fn finish(mut self) -> Vec<(&'static str, ArrayRef, Enc)> {
        let mut ints = self
            .ints
            .iter_mut()
            .map(|b| Arc::new(b.finish()) as ArrayRef);
        let mut int = || ints.next().expect("five int columns");
        vec![
            (col::TIME, int(), Enc::Delta),
            (col::OBSERVED_TIME, int(), Enc::Delta),
            (col::SEVERITY_NUMBER, int(), Enc::Dict),
            (
                col::SEVERITY_TEXT,
                Arc::new(self.severity_text.finish()),
                Enc::Dict,
            ),
            (col::BODY, Arc::new(self.body.finish()), Enc::Dict),
            (
                col::BODY_VALUE,
                Arc::new(self.body_value.finish()),
                Enc::Plain,
            ),
            (col::TRACE_ID, Arc::new(self.trace_id.finish()), Enc::Dict),
            (col::SPAN_ID, Arc::new(self.span_id.finish()), Enc::Plain),
            (col::SERVICE, Arc::new(self.service.finish()), Enc::Dict),
            (
                col::EVENT_NAME,
                Arc::new(self.event_name.finish()),
                Enc::Dict,
            ),
            (col::FLAGS, int(), Enc::Dict),
            (col::DROPPED_ATTRIBUTES, int(), Enc::Dict),
            (
                col::ATTRIBUTES,
                Arc::new(self.attributes.finish()),
                Enc::Plain,
            ),
            (col::RESOURCE, Arc::new(self.resource.finish()), Enc::Dict),
            (col::SCOPE, Arc::new(self.scope.finish()), Enc::Dict),
            (col::CLASS, text(&mut self.texts[0]), Enc::Dict),
            (col::MODEL, text(&mut self.texts[1]), Enc::Dict),
            (col::MODEL_VERSION, text(&mut self.texts[2]), Enc::Dict),
            (
                col::GENERATION_STEP,
                Arc::new(self.counts[0].finish()),
                Enc::Delta,
            ),
            (
                col::FINISH_REASONS,
                Arc::new(self.finish_reasons.finish()),
                Enc::Dict,
            ),
            (
                col::OUTPUT_TOKENS,
                Arc::new(self.counts[1].finish()),
                Enc::Delta,
            ),
            (
                col::KV_CACHE_HIT_RATE,
                Arc::new(self.floats[0].finish()),
                Enc::Split,
            ),
            (
                col::PREFILL_MS,
                Arc::new(self.floats[1].finish()),
                Enc::Split,
            ),
            (
                col::DECODE_MS,
                Arc::new(self.floats[2].finish()),
                Enc::Split,
            ),
            (
                col::TOKENS_PER_S,
                Arc::new(self.floats[3].finish()),
                Enc::Split,
            ),
            (col::WORKER, text(&mut self.texts[3]), Enc::Dict),
            (col::GPU, text(&mut self.texts[4]), Enc::Dict),
        ]
    }
}

fn text(b: &mut StringBuilder) -> ArrayRef {
    Arc::new(b.finish())
}

fn append_id(b: &mut FixedSizeBinaryBuilder, id: Option<&[u8]>) {
    match id {
        Some(bytes) => b.append_value(bytes).expect("id of the builder's width"),
        None => b.append_null(),
    }
}

/// The encoding of a shared value, re-encoded only when it is not the last one seen.
fn shared<'c, T>(
    last: &'c mut Option<(*const (), Vec<u8>)>,
    value: &Arc<T>,
    write: impl FnOnce(&mut Writer, &T),
) -> &'c [u8] {
    let ptr = Arc::as_ptr(value) as *const ();
    if last.as_ref().is_none_or(|(p, _)| *p != ptr) {
        let mut w = Writer::default();
        write(&mut w, value);
        *last = Some((ptr, w.buf));
    }
    &last.as_ref().expect("set above").1
}

/// The block order of log rows.
pub fn sort(rows: &mut [&LogRecord]) {
    rows.sort_by(|a, b| {
        (a.trace_id, a.service_name(), a.time, a.observed_time).cmp(&(
            b.trace_id,
            b.service_name(),
            b.time,
            b.observed_time,
        ))
    });
}

/// One trace-id index entry per run of a trace's rows (rows sorted by [`sort`]).
fn trace_entries(rows: &[&LogRecord]) -> Vec<TraceEntry> {
    let mut out: Vec<TraceEntry> = Vec::new();
    for (i, l) in rows.iter().enumerate() {
        let Some(trace) = l.trace_id else {
            continue;
        };
        if out.last().is_none_or(|e| e.trace_id != trace) {
            out.push(TraceEntry {
                trace_id: trace,
                row_start: i as u32,
                rows: 0,
                min_start: l.time.0,
                max_end: 0,
                errors: 0,
                root: None,
            });
        }
        let e = out.last_mut().expect("entry pushed");
        e.rows += 1;
        e.min_start = e.min_start.min(l.time.0);
        e.max_end = e.max_end.max(l.time.0);
        e.errors += u32::from(l.severity_number >= 17);
    }
    out
}

/// Sorts rows and builds a block of them.
pub fn build(mut rows: Vec<&LogRecord>, compression: Compression) -> Result<BuiltBlock> {
    sort(&mut rows);
    let mut columns = LogColumns::with_capacity(rows.len());
    let mut postings = Postings::default();
    for (row, l) in rows.iter().enumerate() {
        columns.push(l);
        let row = row as u32;
        postings.add(dim::SERVICE, l.service_name(), row);
        postings.add(dim::SEVERITY, &l.severity_text, row);
        postings.add(dim::EVENT_NAME, &l.event_name, row);
        let s = &l.semantics;
        postings.add(dim::CLASS, s.class.as_str(), row);
        let dims = [
            (dim::MODEL, &s.model),
            (dim::MODEL_VERSION, &s.model_version),
            (dim::WORKER, &s.worker),
            (dim::GPU, &s.gpu),
        ];
        for (d, v) in dims {
            if let Some(v) = v {
                postings.add(d, v, row);
            }
        }
    }
    let times = rows.iter().map(|l| l.time.0);
    let (min, max) = times.fold((u64::MAX, 0), |(lo, hi), t| (lo.min(t), hi.max(t)));
    let (metas, chunks) = encode_core_columns(columns.finish(), compression)?;
    Ok(BuiltBlock {
        meta: BlockMeta {
            rows: rows.len() as u32,
            min_start: min,
            max_start: max,
            max_end: max,
            columns: metas,
        },
        chunks,
        traces: trace_entries(&rows),
        postings: postings.encode(compression)?,
    })
}

/// Whole records of the given rows of a log block.
pub fn read<S: ChunkSource>(reader: &BlockReader<'_, S>, rows: &Rows) -> Result<Vec<LogRecord>> {
    let get = |name: &'static str| reader.required(name, rows);
    let ints: Vec<ArrayRef> = [
        col::TIME,
        col::OBSERVED_TIME,
        col::SEVERITY_NUMBER,
        col::FLAGS,
        col::DROPPED_ATTRIBUTES,
    ]
    .into_iter()
    .map(get)
    .collect::<Result<_>>()?;
    let ints: Vec<&Int64Array> = ints
        .iter()
        .map(|a| downcast::<Int64Array>(a))
        .collect::<Result<_>>()?;
    let (severity, body, body_value) = (
        get(col::SEVERITY_TEXT)?,
        get(col::BODY)?,
        get(col::BODY_VALUE)?,
    );
    let (trace, span, event) = (
        get(col::TRACE_ID)?,
        get(col::SPAN_ID)?,
        get(col::EVENT_NAME)?,
    );
    let attributes = get(col::ATTRIBUTES)?;
    let (severity, body, event) = (
        downcast::<StringArray>(&severity)?,
        downcast::<StringArray>(&body)?,
        downcast::<StringArray>(&event)?,
    );
    let (body_value, attributes) = (
        downcast::<BinaryArray>(&body_value)?,
        downcast::<BinaryArray>(&attributes)?,
    );
    let (trace, span) = (
        downcast::<FixedSizeBinaryArray>(&trace)?,
        downcast::<FixedSizeBinaryArray>(&span)?,
    );
    let resources = reader.resources(rows)?;
    let scopes = reader.scopes(rows)?;
    let semantics = read_semantics(reader, rows, resources.len())?;
    let mut out = Vec::with_capacity(resources.len());
    for i in 0..resources.len() {
        let body = if body_value.is_valid(i) {
            Reader::new(body_value.value(i)).value()?
        } else if body.is_valid(i) {
            Value::Str(body.value(i).to_owned())
        } else {
            Value::Empty
        };
        out.push(LogRecord {
            time: UnixNanos(ints[0].value(i) as u64),
            observed_time: UnixNanos(ints[1].value(i) as u64),
            severity_number: ints[2].value(i) as i32,
            severity_text: severity.value(i).to_owned(),
            body,
            attributes: match attributes.is_valid(i) {
                true => Reader::new(attributes.value(i)).attrs()?,
                false => Vec::new(),
            },
            dropped_attributes_count: ints[4].value(i) as u32,
            flags: ints[3].value(i) as u32,
            trace_id: trace
                .is_valid(i)
                .then(|| TraceId::from_slice(trace.value(i)))
                .flatten(),
            span_id: span
                .is_valid(i)
                .then(|| SpanId::from_slice(span.value(i)))
                .flatten(),
            event_name: event.value(i).to_owned(),
            resource: resources[i].clone(),
            scope: scopes[i].clone(),
            semantics: semantics[i].clone(),
        });
    }
    Ok(out)
}

/// The semantic fields of the given rows.
fn read_semantics<S: ChunkSource>(
    reader: &BlockReader<'_, S>,
    rows: &Rows,
    n: usize,
) -> Result<Vec<LogSemantics>> {
    let get = |name: &'static str| reader.required(name, rows);
    let texts: Vec<ArrayRef> = [
        col::CLASS,
        col::MODEL,
        col::MODEL_VERSION,
        col::WORKER,
        col::GPU,
    ]
    .into_iter()
    .map(get)
    .collect::<Result<_>>()?;
    let texts: Vec<&StringArray> = texts.iter().map(downcast).collect::<Result<_>>()?;
    let counts: Vec<ArrayRef> = [col::GENERATION_STEP, col::OUTPUT_TOKENS]
        .into_iter()
        .map(get)
        .collect::<Result<_>>()?;
    let counts: Vec<&Int64Array> = counts.iter().map(downcast).collect::<Result<_>>()?;
    let floats: Vec<ArrayRef> = [
        col::KV_CACHE_HIT_RATE,
        col::PREFILL_MS,
        col::DECODE_MS,
        col::TOKENS_PER_S,
    ]
    .into_iter()
    .map(get)
    .collect::<Result<_>>()?;
    let floats: Vec<&Float64Array> = floats.iter().map(downcast).collect::<Result<_>>()?;
    let reasons = get(col::FINISH_REASONS)?;
    let reasons = downcast::<ListArray>(&reasons)?;
    let text = |a: &StringArray, i: usize| a.is_valid(i).then(|| a.value(i).to_owned());
    let int = |a: &Int64Array, i: usize| a.is_valid(i).then(|| a.value(i));
    let float = |a: &Float64Array, i: usize| a.is_valid(i).then(|| a.value(i));
    (0..n)
        .map(|i| {
            let finish_reasons = match reasons.is_valid(i) {
                true => {
                    let list = reasons.value(i);
                    let list = downcast::<StringArray>(&list)?;
                    Some(
                        list.iter()
                            .map(|v| v.unwrap_or_default().to_owned())
                            .collect(),
                    )
                }
                false => None,
            };
            let class = texts[0].value(i);
            Ok(LogSemantics {
                class: LogClass::ALL
                    .into_iter()
                    .find(|c| c.as_str() == class)
                    .unwrap_or_default(),
                model: text(texts[1], i),
                model_version: text(texts[2], i),
                worker: text(texts[3], i),
                gpu: text(texts[4], i),
                generation_step: int(counts[0], i),
                output_tokens: int(counts[1], i),
                kv_cache_hit_rate: float(floats[0], i),
                prefill_ms: float(floats[1], i),
                decode_ms: float(floats[2], i),
                tokens_per_s: float(floats[3], i),
                finish_reasons,
            })
        })
        .collect()
}

fn downcast<T: 'static>(a: &ArrayRef) -> Result<&T> {
    a.as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| StorageError::corrupt("log block", "column of an unexpected type"))
}
