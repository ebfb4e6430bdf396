//! Per-block request tables: what percentiles of the request signals (TTFT, end-to-end
//! latency, time per output token, tokens/s) and dimension lineage need, kept so that they
//! read a few kilobytes a block instead of every span.
//!
//! A [`RequestRollup`] holds, for the spans it covers:
//! - every *request span* (a `SERVER` span carrying `gen_ai.request.model`: the model server's
//!   span of one request) as a row: trace and span id, start, duration, error, the signals'
//!   sources (`gen_ai.latency.time_to_first_token`, `gen_ai.latency.e2e`,
//!   `gen_ai.latency.time_in_model_decode` in seconds, `gen_ai.usage.output_tokens`) and its
//!   request dimensions (see [`crate::request`]);
//! - the spans counted per tuple of request-dimension values, for spans whose values are
//!   final in the block;
//! - per trace, the spans whose ancestry leaves the block (*open* rows, see
//!   [`crate::request`]) counted per (parent id they leave by, tuple) as the block resolved
//!   them: a reader keeps those counts when the trace has no rows elsewhere; otherwise it fills
//!   the values they lack from the span they leave by;
//! - the *anchors*: every span of the block carrying a request value itself (the generate span,
//!   the request spans), with its tuple and the parent id it leaves by when open. The span an
//!   open row leaves by is, in LLM traces, nearly always one (the token spans' generate span,
//!   the generate span's model client span), so a reader resolves open rows from the anchors of
//!   the blocks alone, and reads a trace's spans only when the chain passes through a span
//!   that carries nothing (or never arrived).
//!
//! Version 1 (no exits, no anchors) is still read: its open rows are resolved whole.
//! Values are the terms the postings hold ([`Value::as_term`]); a tuple has one entry per
//! [`crate::request::request_dims`] slot, [`NONE`] where the span has no value.

use std::sync::OnceLock;

use rustc_hash::FxHashMap as HashMap;

use crate::codec::{Reader, Writer};
use crate::error::{Result, StorageError};
use crate::model::{SpanId, SpanKind, SpanRecord, StatusCode, TraceId, Value};
use crate::request::dedicated_value;
use crate::schema::DEDICATED;

/// Version of the encoded rollup: 2 adds exits and anchors, and writes each trace id once.
pub const REQUESTS_VERSION: u8 = 2;

/// A tuple entry without a value.
pub const NONE: u32 = u32::MAX;

/// The dedicated columns a request row keeps, by name.
const MODEL: &str = "gen_ai.request.model";
const TTFT: &str = "gen_ai.latency.time_to_first_token";
const E2E: &str = "gen_ai.latency.e2e";
const DECODE: &str = "gen_ai.latency.time_in_model_decode";
const OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";

/// The index of a dedicated column (looked up once: the writer asks per row).
fn column(name: &'static str) -> usize {
    static COLUMNS: OnceLock<[usize; 5]> = OnceLock::new();
    const NAMES: [&str; 5] = [MODEL, TTFT, E2E, DECODE, OUTPUT_TOKENS];
    let columns = COLUMNS.get_or_init(|| {
        NAMES.map(|n| {
            DEDICATED
                .iter()
                .position(|d| d.name == n)
                .expect("a dedicated column")
        })
    });
    columns[NAMES
        .iter()
        .position(|n| *n == name)
        .expect("a kept column")]
}

/// A dedicated double column's value of a span, as its column holds it.
fn double(span: &SpanRecord, name: &'static str) -> Option<f64> {
    match dedicated_value(span, column(name)) {
        Some(Value::Double(v)) => Some(*v),
        _ => None,
    }
}

/// Whether a span is a request span: `SERVER` and carrying `gen_ai.request.model` (in its
/// column).
pub fn is_request(span: &SpanRecord) -> bool {
    span.kind == SpanKind::Server && dedicated_value(span, column(MODEL)).is_some()
}

/// Whether two rows' values are the same values (by reference).
pub fn same_refs(a: &[Option<&Value>], b: &[Option<&Value>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| match (x, y) {
            (Some(x), Some(y)) => std::ptr::eq(*x, *y),
            (None, None) => true,
            _ => false,
        })
}

/// One request span.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RequestRow {
    pub trace: TraceId,
    pub span: SpanId,
    pub start_ns: u64,
    pub duration_ns: u64,
    pub error: bool,
    /// Whether its ancestry leaves the block (its values may change, resolved whole).
    pub open: bool,
    /// When open, the parent id it leaves the block by (`None` in version 1 rollups).
    pub exit: Option<SpanId>,
    /// Its request values: an index into its rollup's tuples.
    pub tuple: u32,
    /// Seconds.
    pub ttft: Option<f64>,
    pub e2e: Option<f64>,
    pub decode: Option<f64>,
    pub output_tokens: Option<i64>,
}

impl RequestRow {
    /// The row of a request span whose ancestry leaves its rows by `exit` (when it does).
    pub fn of(span: &SpanRecord, exit: Option<SpanId>, tuple: u32) -> Self {
        Self {
            trace: span.trace_id,
            span: span.span_id,
            start_ns: span.start.0,
            duration_ns: span.duration_ns(),
            error: span.status_code == StatusCode::Error,
            open: exit.is_some(),
            exit,
            tuple,
            ttft: double(span, TTFT),
            e2e: double(span, E2E),
            decode: double(span, DECODE),
            output_tokens: match dedicated_value(span, column(OUTPUT_TOKENS)) {
                Some(Value::Int(v)) => Some(*v),
                _ => None,
            },
        }
    }
}

/// Open spans of one trace sharing the parent id they leave their block by and their tuple.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpenSpans {
    pub trace: TraceId,
    /// `None` in version 1 rollups.
    pub exit: Option<SpanId>,
    pub tuple: u32,
    pub spans: u64,
}

/// A span carrying a request value itself: its tuple as its block resolved it and, when its
/// ancestry leaves the block, the parent id it leaves by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Anchor {
    pub trace: TraceId,
    pub span: SpanId,
    pub tuple: u32,
    pub exit: Option<SpanId>,
}

/// Requests and span counts by request values, of some spans.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestRollup {
    /// The values, each once.
    pub terms: Vec<String>,
    /// Tuples of indexes into `terms` ([`NONE`]: no value), one entry per request dimension.
    pub tuples: Vec<Vec<u32>>,
    /// Spans whose values are final, per tuple.
    pub spans: Vec<u64>,
    /// Open spans.
    pub open: Vec<OpenSpans>,
    pub requests: Vec<RequestRow>,
    pub anchors: Vec<Anchor>,
    term_index: HashMap<String, u32>,
    tuple_index: HashMap<Vec<u32>, u32>,
}

impl RequestRollup {
    /// The index of a term, added when new.
    pub fn term(&mut self, term: &str) -> u32 {
        if self.term_index.len() != self.terms.len() {
            // a decoded rollup has no index until it is added to
            self.term_index = (0..)
                .zip(&self.terms)
                .map(|(i, t)| (t.clone(), i))
                .collect();
        }
        if let Some(&i) = self.term_index.get(term) {
            return i;
        }
        let i = self.terms.len() as u32;
        self.terms.push(term.to_owned());
        self.term_index.insert(term.to_owned(), i);
        i
    }

    /// The index of a tuple of term indexes, added when new.
    pub fn tuple(&mut self, tuple: &[u32]) -> u32 {
        if self.tuple_index.len() != self.tuples.len() {
            self.tuple_index = (0..)
                .zip(&self.tuples)
                .map(|(i, t)| (t.clone(), i))
                .collect();
        }
        if let Some(&i) = self.tuple_index.get(tuple) {
            return i;
        }
        let i = self.tuples.len() as u32;
        self.tuples.push(tuple.to_vec());
        self.spans.push(0);
        self.tuple_index.insert(tuple.to_vec(), i);
        i
    }

    /// The tuple of some values, one per request dimension.
    pub fn tuple_of(&mut self, values: &[Option<&Value>]) -> u32 {
        let ids: Vec<u32> = values
            .iter()
            .map(|v| match v {
                // text is its own term: no copy to look it up
                Some(Value::Str(s)) => self.term(s),
                Some(v) => v.as_term().map_or(NONE, |t| self.term(&t)),
                None => NONE,
            })
            .collect();
        self.tuple(&ids)
    }

    /// The rollup of a block's rows: sorted by trace, `traces` their runs (first row, rows),
    /// `values` each row's resolved request values (row-major, one per request dimension),
    /// `exits` the parent id each row's ancestry leaves the block by (`None`: it does not) and
    /// `carriers` whether a row carries a request value itself.
    pub fn of_block(
        rows: &[&SpanRecord],
        traces: impl Iterator<Item = (u32, u32)>,
        values: &[Option<&Value>],
        exits: &[Option<SpanId>],
        carriers: &[bool],
    ) -> Self {
        let d = crate::request::request_dims().len();
        let mut r = Self::default();
        // a trace's token spans inherit one ancestor's values: the same references as the
        // row before, whose tuple they take without a lookup
        let mut last: Option<(&[Option<&Value>], u32)> = None;
        for (start, len) in traces {
            let Some(first) = rows.get(start as usize) else {
                continue;
            };
            let trace = first.trace_id;
            let at = r.open.len();
            for row in start as usize..(start + len) as usize {
                let own = &values[row * d..(row + 1) * d];
                let tuple = match last {
                    Some((prev, tuple)) if same_refs(prev, own) => tuple,
                    _ => r.tuple_of(own),
                };
                last = Some((own, tuple));
                let exit = exits[row];
                if exit.is_some() {
                    match r.open[at..]
                        .iter_mut()
                        .find(|o| o.tuple == tuple && o.exit == exit)
                    {
                        Some(o) => o.spans += 1,
                        None => r.open.push(OpenSpans {
                            trace,
                            exit,
                            tuple,
                            spans: 1,
                        }),
                    }
                } else {
                    r.spans[tuple as usize] += 1;
                }
                if carriers[row] {
                    r.anchors.push(Anchor {
                        trace,
                        span: rows[row].span_id,
                        tuple,
                        exit,
                    });
                }
                if is_request(rows[row]) {
                    r.requests.push(RequestRow::of(rows[row], exit, tuple));
                }
            }
        }
        r
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.buf.push(REQUESTS_VERSION);
        w.u64(self.terms.len() as u64);
        for t in &self.terms {
            w.str(t);
        }
        let d = self.tuples.first().map_or(0, Vec::len);
        w.u64(d as u64);
        w.u64(self.tuples.len() as u64);
        for (tuple, spans) in self.tuples.iter().zip(&self.spans) {
            for &v in tuple {
                // NONE as 0, terms from 1
                w.u64(if v == NONE { 0 } else { u64::from(v) + 1 });
            }
            w.u64(*spans);
        }
        // each trace id once (a request's trace is its anchors' and open rows' too), then
        // referred to by its place
        let mut traces: HashMap<TraceId, u64> = HashMap::default();
        let order: Vec<TraceId> = (self.open.iter().map(|o| o.trace))
            .chain(self.requests.iter().map(|q| q.trace))
            .chain(self.anchors.iter().map(|a| a.trace))
            .filter(|t| {
                let next = traces.len() as u64;
                *traces.entry(*t).or_insert(next) == next
            })
            .collect();
        w.u64(order.len() as u64);
        for t in &order {
            w.raw(&t.0);
        }
        let opt_id = |w: &mut Writer, v: Option<SpanId>| match v {
            Some(id) => {
                w.buf.push(1);
                w.raw(&id.0);
            }
            None => w.buf.push(0),
        };
        w.u64(self.open.len() as u64);
        for o in &self.open {
            w.u64(traces[&o.trace]);
            opt_id(&mut w, o.exit);
            w.u64(o.tuple.into());
            w.u64(o.spans);
        }
        w.u64(self.requests.len() as u64);
        let opt_f = |w: &mut Writer, v: Option<f64>| match v {
            Some(v) => {
                w.buf.push(1);
                w.raw(&v.to_le_bytes());
            }
            None => w.buf.push(0),
        };
        for q in &self.requests {
            w.u64(traces[&q.trace]);
            w.raw(&q.span.0);
            w.u64(q.start_ns);
            w.u64(q.duration_ns);
            w.buf.push(u8::from(q.error) | (u8::from(q.open) << 1));
            opt_id(&mut w, q.exit);
            w.u64(q.tuple.into());
            opt_f(&mut w, q.ttft);
            opt_f(&mut w, q.e2e);
            opt_f(&mut w, q.decode);
            match q.output_tokens {
                Some(v) => {
                    w.buf.push(1);
                    w.i64(v);
                }
                None => w.buf.push(0),
            }
        }
        w.u64(self.anchors.len() as u64);
        for a in &self.anchors {
            w.u64(traces[&a.trace]);
            w.raw(&a.span.0);
            opt_id(&mut w, a.exit);
            w.u64(a.tuple.into());
        }
        w.buf
    }

    pub fn decode(buf: &[u8]) -> Result<Self> {
        let buf = &*crate::block::format::unpack_rollup(buf, "request rollup")?;
        let corrupt = |m: String| StorageError::corrupt("request rollup", m);
        let mut r = Reader::new(buf);
        let version = r.u8()?;
        if !(1..=REQUESTS_VERSION).contains(&version) {
            return Err(corrupt(format!(
                "version {version}, this build reads {REQUESTS_VERSION}"
            )));
        }
        let mut out = Self::default();
        // pushed as they come, without the indexes (a reader maps them; `term` and `tuple`
        // build the indexes if the rollup is ever added to)
        let n_terms = r.u64()?;
        for _ in 0..n_terms {
            out.terms.push(r.string()?);
        }
        let d = r.u64()? as usize;
        if d > 64 {
            return Err(corrupt(format!("{d} dimensions")));
        }
        let n_tuples = r.u64()?;
        for _ in 0..n_tuples {
            let mut tuple = vec![NONE; d];
            for slot in tuple.iter_mut() {
                let v = r.u64()?;
                *slot = match v {
                    0 => NONE,
                    v if v <= n_terms => (v - 1) as u32,
                    v => return Err(corrupt(format!("term {v} of {n_terms}"))),
                };
            }
            out.tuples.push(tuple);
            out.spans.push(r.u64()?);
        }
        let tuple_id = |r: &mut Reader| -> Result<u32> {
            let t = r.u64()?;
            if t >= n_tuples {
                return Err(corrupt(format!("tuple {t} of {n_tuples}")));
            }
            Ok(t as u32)
        };
        // from version 2: the trace ids once, referred to by their place; exits
        let mut traces: Vec<TraceId> = Vec::new();
        if version >= 2 {
            for _ in 0..r.u64()? {
                traces.push(TraceId(r.raw(16)?.try_into().expect("16 bytes")));
            }
        }
        let trace_id = |r: &mut Reader| -> Result<TraceId> {
            if version < 2 {
                return Ok(TraceId(r.raw(16)?.try_into().expect("16 bytes")));
            }
            let at = r.u64()?;
            traces
                .get(at as usize)
                .copied()
                .ok_or_else(|| corrupt(format!("trace {at} of {}", traces.len())))
        };
        let opt_id = |r: &mut Reader| -> Result<Option<SpanId>> {
            if version < 2 {
                return Ok(None);
            }
            Ok(match r.u8()? {
                0 => None,
                _ => Some(SpanId(r.raw(8)?.try_into().expect("8 bytes"))),
            })
        };
        for _ in 0..r.u64()? {
            let trace = trace_id(&mut r)?;
            let exit = opt_id(&mut r)?;
            let tuple = tuple_id(&mut r)?;
            let spans = r.u64()?;
            out.open.push(OpenSpans {
                trace,
                exit,
                tuple,
                spans,
            });
        }
        let opt_f = |r: &mut Reader| -> Result<Option<f64>> {
            Ok(match r.u8()? {
                0 => None,
                _ => Some(f64::from_le_bytes(r.raw(8)?.try_into().expect("8 bytes"))),
            })
        };
        for _ in 0..r.u64()? {
            let trace = trace_id(&mut r)?;
            let span = SpanId(r.raw(8)?.try_into().expect("8 bytes"));
            let start_ns = r.u64()?;
            let duration_ns = r.u64()?;
            let flags = r.u8()?;
            let exit = opt_id(&mut r)?;
            let tuple = tuple_id(&mut r)?;
            let ttft = opt_f(&mut r)?;
            let e2e = opt_f(&mut r)?;
            let decode = opt_f(&mut r)?;
            let output_tokens = match r.u8()? {
                0 => None,
                _ => Some(r.i64()?),
            };
            out.requests.push(RequestRow {
                trace,
                span,
                start_ns,
                duration_ns,
                error: flags & 1 != 0,
                open: flags & 2 != 0,
                exit,
                tuple,
                ttft,
                e2e,
                decode,
                output_tokens,
            });
        }
        if version >= 2 {
            for _ in 0..r.u64()? {
                let trace = trace_id(&mut r)?;
                let span = SpanId(r.raw(8)?.try_into().expect("8 bytes"));
                let exit = opt_id(&mut r)?;
                let tuple = tuple_id(&mut r)?;
                out.anchors.push(Anchor {
                    trace,
                    span,
                    tuple,
                    exit,
                });
            }
        }
        Ok(out)
    }

    /// What the rollup takes in memory, about (decoded: without indexes).
    pub fn weight(&self) -> usize {
        let indexed = |n: usize| if n == 0 { 1 } else { 2 };
        let terms: usize =
            self.terms.iter().map(|t| 48 + t.len()).sum::<usize>() * indexed(self.term_index.len());
        let tuples: usize = self.tuples.iter().map(|t| 32 + 4 * t.len()).sum::<usize>()
            * indexed(self.tuple_index.len())
            + 8 * self.spans.len();
        128 + terms
            + tuples
            + self.open.len() * std::mem::size_of::<OpenSpans>()
            + self.requests.len() * std::mem::size_of::<RequestRow>()
            + self.anchors.len() * std::mem::size_of::<Anchor>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{KeyValue, UnixNanos};

    #[test]
    fn request_rows_and_span_counts_read_back_as_written() {
        let generate = SpanRecord {
            trace_id: TraceId([1; 16]),
            span_id: SpanId([1; 8]),
            name: "llm.generate".into(),
            kind: SpanKind::Server,
            start: UnixNanos(5_000),
            end: UnixNanos(9_000),
            status_code: StatusCode::Error,
            attributes: vec![
                KeyValue::new(MODEL, Value::Str("m".into())),
                KeyValue::new(TTFT, Value::Double(0.25)),
                KeyValue::new("gen_ai.usage.completion_tokens", Value::Int(7)),
            ],
            ..Default::default()
        };
        let token = SpanRecord {
            span_id: SpanId([2; 8]),
            parent_span_id: Some(SpanId([1; 8])),
            name: "llm.decode.token".into(),
            kind: SpanKind::Internal,
            attributes: vec![],
            ..generate.clone()
        };
        let other = SpanRecord {
            trace_id: TraceId([2; 16]),
            span_id: SpanId([3; 8]),
            parent_span_id: Some(SpanId([9; 8])),
            ..token.clone()
        };
        let rows = [&generate, &token, &other];
        let d = crate::request::request_dims().len();
        let v1 = Value::Str("v1".into());
        let mut values: Vec<Option<&Value>> = vec![None; 3 * d];
        values[0] = Some(&v1);
        values[d] = Some(&v1);
        let exit = Some(SpanId([9; 8]));
        let r = RequestRollup::of_block(
            &rows,
            [(0, 2), (2, 1)].into_iter(),
            &values,
            &[None, None, exit],
            &[true, false, false],
        );
        assert_eq!(r.tuples.len(), 2);
        assert_eq!(r.spans, vec![2, 0]);
        let open = OpenSpans {
            trace: TraceId([2; 16]),
            exit,
            tuple: 1,
            spans: 1,
        };
        assert_eq!(r.open, vec![open]);
        let anchor = Anchor {
            trace: TraceId([1; 16]),
            span: SpanId([1; 8]),
            tuple: 0,
            exit: None,
        };
        assert_eq!(r.anchors, vec![anchor]);
        assert_eq!(r.requests.len(), 1);
        let q = r.requests[0];
        assert_eq!(
            (q.ttft, q.output_tokens, q.error, q.open),
            (Some(0.25), Some(7), true, false)
        );
        assert_eq!(q.e2e, None);
        let back = RequestRollup::decode(&r.encode()).unwrap();
        assert_eq!(back.terms, r.terms);
        assert_eq!(back.tuples, r.tuples);
        assert_eq!(back.spans, r.spans);
        assert_eq!(back.open, r.open);
        assert_eq!(back.requests, r.requests);
        assert_eq!(back.anchors, r.anchors);
        // decoded without indexes: adding to it finds what it holds
        let mut back = back;
        assert_eq!(back.tuple(&r.tuples[1]), 1);
        assert_eq!(back.term(&r.terms[0]), 0);
        assert_eq!(
            (back.tuples.len(), back.terms.len()),
            (r.tuples.len(), r.terms.len())
        );
        assert!(RequestRollup::decode(&[9]).is_err());
        // version 1: no trace table, exits or anchors (here without open rows or requests,
        // so its bytes are version 2's less two of its four closing zero counts)
        let mut spans_only = RequestRollup::default();
        let t = spans_only.tuple_of(&values[..d]);
        spans_only.spans[t as usize] = 3;
        let mut v1 = spans_only.encode();
        assert_eq!(v1[v1.len() - 5..], [3, 0, 0, 0, 0]);
        v1.truncate(v1.len() - 2);
        v1[0] = 1;
        assert_eq!(RequestRollup::decode(&v1).unwrap().spans, vec![3]);
        assert!(RequestRollup::decode(&r.encode()[..20]).is_err());
    }
}
