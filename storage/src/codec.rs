//! A compact binary codec for rows and nested values, used by the write-ahead entries and by the
//! binary columns of a block (resource, scope, events, links, attribute maps).
//!
//! Layout: unsigned integers are LEB128 varints, signed ones zigzag varints, strings and byte
//! strings a varint length then the bytes, fixed ids their raw bytes, f64 eight little-endian
//! bytes. A value is a tag byte (0 empty, 1 str, 2 bool, 3 int, 4 double, 5 bytes, 6 array,
//! 7 kvlist) then its payload. A span row is written field by field in [`Writer::span`]'s
//! order, preceded by [`SPAN_ROW_VERSION`].
//!
//! A write-ahead batch of spans ([`encode_spans`]) is, since batch version 2, `0` (no count
//! of version 1 is zero) then [`SPAN_BATCH_VERSION`], the batch's distinct resources and
//! scopes (a count, then each), the span count, and each span's row (row version 2: the
//! fields of version 1 up to the status message) followed by the indexes of its resource and
//! scope. An exporter's resource (17 attributes from a Kubernetes pod, say) is written once
//! per batch instead of once per span. Version 1 batches (a count, then rows of version 1,
//! each with its resource and scope) are still read.

use std::sync::Arc;

use crate::error::{Result, StorageError};
use crate::model::*;

mod log;
mod metric;
pub use log::{decode_logs, encode_logs};
pub use metric::{decode_points, decode_series, encode_points, encode_series};

pub const SPAN_ROW_VERSION: u8 = 2;
/// The write-ahead span batch layout written now (see the module doc).
pub const SPAN_BATCH_VERSION: u8 = 2;

#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn u64(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }
    pub fn i64(&mut self, v: i64) {
        self.u64(((v << 1) ^ (v >> 63)) as u64);
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.buf.extend_from_slice(b);
    }
    pub fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    pub fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
    pub fn value(&mut self, v: &Value) {
        match v {
            Value::Empty => self.buf.push(0),
            Value::Str(s) => {
                self.buf.push(1);
                self.str(s)
            }
            Value::Bool(b) => {
                self.buf.push(2);
                self.buf.push(*b as u8)
            }
            Value::Int(i) => {
                self.buf.push(3);
                self.i64(*i)
            }
            Value::Double(d) => {
                self.buf.push(4);
                self.raw(&d.to_le_bytes())
            }
            Value::Bytes(b) => {
                self.buf.push(5);
                self.bytes(b)
            }
            Value::Array(a) => {
                self.buf.push(6);
                self.u64(a.len() as u64);
                a.iter().for_each(|v| self.value(v));
            }
            Value::KvList(kv) => {
                self.buf.push(7);
                self.attrs(kv);
            }
        }
    }
    pub fn attrs(&mut self, kvs: &[KeyValue]) {
        self.u64(kvs.len() as u64);
        for kv in kvs {
            self.str(&kv.key);
            self.value(&kv.value);
        }
    }
    pub fn resource(&mut self, r: &Resource) {
        self.attrs(&r.attributes);
        self.u64(r.dropped_attributes_count.into());
        self.str(&r.schema_url);
    }
    pub fn scope(&mut self, s: &Scope) {
        self.str(&s.name);
        self.str(&s.version);
        self.attrs(&s.attributes);
        self.u64(s.dropped_attributes_count.into());
        self.str(&s.schema_url);
    }
    pub fn events(&mut self, events: &[Event]) {
        self.u64(events.len() as u64);
        for e in events {
            self.u64(e.time.0);
            self.str(&e.name);
            self.attrs(&e.attributes);
            self.u64(e.dropped_attributes_count.into());
        }
    }
    pub fn links(&mut self, links: &[Link]) {
        self.u64(links.len() as u64);
        for l in links {
            self.raw(&l.trace_id.0);
            self.raw(&l.span_id.0);
            self.str(&l.trace_state);
            self.attrs(&l.attributes);
            self.u64(l.dropped_attributes_count.into());
            self.u64(l.flags.into());
        }
    }
    /// A span's own fields (no resource or scope), for the write-ahead path.
    pub fn span(&mut self, s: &SpanRecord) {
        self.buf.push(SPAN_ROW_VERSION);
        self.raw(&s.trace_id.0);
        self.raw(&s.span_id.0);
        self.raw(&s.parent_span_id.unwrap_or_default().0);
        self.str(&s.trace_state);
        self.u64(s.flags.into());
        self.str(&s.name);
        self.buf.push(s.kind as u8);
        self.u64(s.start.0);
        self.u64(s.end.0);
        self.attrs(&s.attributes);
        self.u64(s.dropped_attributes_count.into());
        self.events(&s.events);
        self.u64(s.dropped_events_count.into());
        self.links(&s.links);
        self.u64(s.dropped_links_count.into());
        self.buf.push(s.status_code as u8);
        self.str(&s.status_message);
    }
}

pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn short() -> StorageError {
    StorageError::corrupt("encoded row", "unexpected end of data")
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }
    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }
    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let rest = self.buf.get(self.pos..).unwrap_or_default();
        self.pos = self.buf.len();
        rest
    }
    pub fn u8(&mut self) -> Result<u8> {
        let b = *self.buf.get(self.pos).ok_or_else(short)?;
        self.pos += 1;
        Ok(b)
    }
    pub fn u64(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(StorageError::corrupt("encoded row", "varint too long"))
    }
    pub fn u32(&mut self) -> Result<u32> {
        u32::try_from(self.u64()?).map_err(|_| StorageError::corrupt("encoded row", "u32 overflow"))
    }
    pub fn i64(&mut self) -> Result<i64> {
        let v = self.u64()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }
    pub fn raw(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).ok_or_else(short)?;
        let out = self.buf.get(self.pos..end).ok_or_else(short)?;
        self.pos = end;
        Ok(out)
    }
    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u64()? as usize;
        self.raw(n)
    }
    pub fn string(&mut self) -> Result<String> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| StorageError::corrupt("encoded row", "bad utf-8"))
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.raw(N)?.try_into().expect("length checked"))
    }
    pub fn value(&mut self) -> Result<Value> {
        Ok(match self.u8()? {
            0 => Value::Empty,
            1 => Value::Str(self.string()?),
            2 => Value::Bool(self.u8()? != 0),
            3 => Value::Int(self.i64()?),
            4 => Value::Double(f64::from_le_bytes(self.array()?)),
            5 => Value::Bytes(self.bytes()?.to_vec()),
            6 => {
                let n = self.u64()? as usize;
                let mut out = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    out.push(self.value()?);
                }
                Value::Array(out)
            }
            7 => Value::KvList(self.attrs()?),
            t => return Err(StorageError::corrupt("encoded value", format!("tag {t}"))),
        })
    }
    pub fn attrs(&mut self) -> Result<Vec<KeyValue>> {
        let n = self.u64()? as usize;
        let mut out = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            let key = self.string()?;
            out.push(KeyValue {
                key,
                value: self.value()?,
            });
        }
        Ok(out)
    }
    pub fn resource(&mut self) -> Result<Resource> {
        Ok(Resource {
            attributes: self.attrs()?,
            dropped_attributes_count: self.u32()?,
            schema_url: self.string()?,
        })
    }
    pub fn scope(&mut self) -> Result<Scope> {
        Ok(Scope {
            name: self.string()?,
            version: self.string()?,
            attributes: self.attrs()?,
            dropped_attributes_count: self.u32()?,
            schema_url: self.string()?,
        })
    }
    pub fn events(&mut self) -> Result<Vec<Event>> {
        let n = self.u64()? as usize;
        let mut out = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            out.push(Event {
                time: UnixNanos(self.u64()?),
                name: self.string()?,
                attributes: self.attrs()?,
                dropped_attributes_count: self.u32()?,
            });
        }
        Ok(out)
    }
    pub fn links(&mut self) -> Result<Vec<Link>> {
        let n = self.u64()? as usize;
        let mut out = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            out.push(Link {
                trace_id: TraceId(self.array()?),
                span_id: SpanId(self.array()?),
                trace_state: self.string()?,
                attributes: self.attrs()?,
                dropped_attributes_count: self.u32()?,
                flags: self.u32()?,
            });
        }
        Ok(out)
    }
    /// A span row of `version` (1: with its resource and scope; 2: without, given here).
    fn span_row(
        &mut self,
        version: u8,
        shared: Option<(Arc<Resource>, Arc<Scope>)>,
    ) -> Result<SpanRecord> {
        let found = self.u8()?;
        if found != version {
            return Err(StorageError::UnsupportedVersion {
                what: "span row",
                found,
                supported: version,
            });
        }
        let trace_id = TraceId(self.array()?);
        let span_id = SpanId(self.array()?);
        let parent = SpanId(self.array()?);
        let mut span = SpanRecord {
            trace_id,
            span_id,
            parent_span_id: (!parent.is_zero()).then_some(parent),
            trace_state: self.string()?,
            flags: self.u32()?,
            name: self.string()?,
            kind: SpanKind::from_u8(self.u8()?),
            start: UnixNanos(self.u64()?),
            end: UnixNanos(self.u64()?),
            attributes: self.attrs()?,
            dropped_attributes_count: self.u32()?,
            events: self.events()?,
            dropped_events_count: self.u32()?,
            links: self.links()?,
            dropped_links_count: self.u32()?,
            status_code: StatusCode::from_u8(self.u8()?),
            status_message: self.string()?,
            ..Default::default()
        };
        (span.resource, span.scope) = match shared {
            Some(shared) => shared,
            None => (Arc::new(self.resource()?), Arc::new(self.scope()?)),
        };
        Ok(span)
    }
}

/// Encodes a batch of spans as one write-ahead value (batch version 2, see the module doc).
pub fn encode_spans(spans: &[SpanRecord]) -> Vec<u8> {
    let mut resources: Vec<&Arc<Resource>> = Vec::new();
    let mut scopes: Vec<&Arc<Scope>> = Vec::new();
    let mut resource_at: rustc_hash::FxHashMap<*const Resource, u64> = Default::default();
    let mut scope_at: rustc_hash::FxHashMap<*const Scope, u64> = Default::default();
    let indexes: Vec<(u64, u64)> = spans
        .iter()
        .map(|s| {
            let r = *resource_at
                .entry(Arc::as_ptr(&s.resource))
                .or_insert_with(|| {
                    resources.push(&s.resource);
                    resources.len() as u64 - 1
                });
            let c = *scope_at.entry(Arc::as_ptr(&s.scope)).or_insert_with(|| {
                scopes.push(&s.scope);
                scopes.len() as u64 - 1
            });
            (r, c)
        })
        .collect();
    let mut w = Writer::default();
    w.u64(0);
    w.buf.push(SPAN_BATCH_VERSION);
    w.u64(resources.len() as u64);
    resources.iter().for_each(|r| w.resource(r));
    w.u64(scopes.len() as u64);
    scopes.iter().for_each(|c| w.scope(c));
    w.u64(spans.len() as u64);
    for (s, (r, c)) in spans.iter().zip(indexes) {
        w.span(s);
        w.u64(r);
        w.u64(c);
    }
    w.buf
}

pub fn decode_spans(buf: &[u8]) -> Result<Vec<SpanRecord>> {
    let mut r = Reader::new(buf);
    let n = r.u64()? as usize;
    if n > 0 || r.is_empty() {
        // batch version 1: a count, then rows of version 1
        let mut out = Vec::with_capacity(n.min(1 << 20));
        for _ in 0..n {
            out.push(r.span_row(1, None)?);
        }
        return Ok(out);
    }
    let version = r.u8()?;
    if version != SPAN_BATCH_VERSION {
        return Err(StorageError::UnsupportedVersion {
            what: "span batch",
            found: version,
            supported: SPAN_BATCH_VERSION,
        });
    }
    let resources = (0..r.u64()?)
        .map(|_| r.resource().map(Arc::new))
        .collect::<Result<Vec<_>>>()?;
    let scopes = (0..r.u64()?)
        .map(|_| r.scope().map(Arc::new))
        .collect::<Result<Vec<_>>>()?;
    let n = r.u64()? as usize;
    let mut out = Vec::with_capacity(n.min(1 << 20));
    for _ in 0..n {
        // the shared values are picked after the row: parse it with placeholders first
        let mut span = r.span_row(SPAN_ROW_VERSION, Some(Default::default()))?;
        let bad = || StorageError::corrupt("span batch", "resource or scope index out of range");
        span.resource = resources.get(r.u64()? as usize).ok_or_else(bad)?.clone();
        span.scope = scopes.get(r.u64()? as usize).ok_or_else(bad)?.clone();
        out.push(span);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample_span() -> SpanRecord {
        SpanRecord {
            trace_id: TraceId([1; 16]),
            span_id: SpanId([2; 8]),
            parent_span_id: Some(SpanId([3; 8])),
            trace_state: "k=v".into(),
            flags: 1,
            name: "llm.decode.token".into(),
            kind: SpanKind::Internal,
            start: UnixNanos(1_700_000_000_000_000_000),
            end: UnixNanos(1_700_000_000_025_000_000),
            attributes: vec![
                KeyValue::new("llm.token.index", Value::Int(-7)),
                KeyValue::new(
                    "x",
                    Value::Array(vec![Value::Double(1.5), Value::Bool(true)]),
                ),
                KeyValue::new(
                    "m",
                    Value::KvList(vec![KeyValue::new("b", Value::Bytes(vec![0, 1]))]),
                ),
            ],
            dropped_attributes_count: 2,
            events: vec![Event {
                time: UnixNanos(5),
                name: "e".into(),
                attributes: vec![],
                dropped_attributes_count: 1,
            }],
            dropped_events_count: 3,
            links: vec![Link {
                trace_id: TraceId([9; 16]),
                span_id: SpanId([8; 8]),
                trace_state: "a=b".into(),
                attributes: vec![KeyValue::new("l", Value::Empty)],
                dropped_attributes_count: 0,
                flags: 256,
            }],
            dropped_links_count: 4,
            status_code: StatusCode::Error,
            status_message: "boom".into(),
            resource: Arc::new(Resource {
                attributes: vec![KeyValue::new("service.name", Value::Str("svc".into()))],
                dropped_attributes_count: 0,
                schema_url: "https://x".into(),
            }),
            scope: Arc::new(Scope {
                name: "scope".into(),
                version: "1".into(),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn batches_of_version_1_are_still_read() {
        // a count, then rows of version 1 with their resource and scope, as written before
        let span = sample_span();
        let mut w = Writer::default();
        w.u64(2);
        for _ in 0..2 {
            let mut row = Writer::default();
            row.span(&span);
            row.buf[0] = 1;
            w.buf.extend(row.buf);
            w.resource(&span.resource);
            w.scope(&span.scope);
        }
        assert_eq!(decode_spans(&w.buf).unwrap(), vec![span.clone(), span]);
    }

    #[test]
    fn a_batch_writes_each_resource_once() {
        let spans = vec![sample_span(); 50];
        let one = encode_spans(&spans[..1]).len();
        let resource = {
            let mut w = Writer::default();
            w.resource(&spans[0].resource);
            w.buf.len()
        };
        assert!(encode_spans(&spans).len() < one + 49 * (one - resource));
        assert_eq!(decode_spans(&encode_spans(&spans)).unwrap(), spans);
    }

    #[test]
    fn span_round_trips() {
        let spans = vec![sample_span(), SpanRecord::default()];
        let decoded = decode_spans(&encode_spans(&spans)).unwrap();
        assert_eq!(decoded, spans);
    }

    #[test]
    fn truncated_input_is_an_error_not_a_panic() {
        let enc = encode_spans(&[sample_span()]);
        // (one byte, `0`, is an empty batch of version 1)
        for cut in (0..enc.len()).filter(|&c| c != 1) {
            assert!(decode_spans(&enc[..cut]).is_err(), "cut at {cut}");
        }
    }
}
