//! What the engine needs to know about a signal's rows, said once per signal: how a row is
//! identified (so that a retried batch is stored once), which time places it in a window and
//! under retention, how rows go to the write-ahead head and back, and how a block of them is
//! built and read back (for merging). Everything else (the head, group commit, flush by size
//! and age, block metas, postings, caches, merging, retention) is written once, in
//! [`crate::store`], for every signal.

use std::fmt::Debug;
use std::hash::Hash;

use crate::block::format::Compression;
use crate::block::{BlockReader, BuiltBlock, reader::Rows};
use crate::error::Result;
use crate::keys::Signal;
use crate::model::{
    Event, KeyValue, Link, LogRecord, MetricPoint, SeriesId, SpanId, SpanRecord, TraceId,
    UnixNanos, Value,
};
use crate::store::ChunkFetcher;

/// A row of a signal.
pub trait Row: Clone + Send + Sync + 'static {
    const SIGNAL: Signal;
    /// What makes two rows the same row (a client's retry).
    type Id: Copy + Eq + Hash + Debug + Send + Sync + 'static;

    fn id(&self) -> Self::Id;
    /// The time that places the row in a window and under retention.
    fn time(&self) -> UnixNanos;
    /// The trace the row belongs to, if any (the head's trace index).
    fn trace_id(&self) -> Option<TraceId>;
    /// Rows as one write-ahead value.
    fn encode_rows(rows: &[Self]) -> Vec<u8>;
    fn decode_rows(bytes: &[u8]) -> Result<Vec<Self>>;
    /// Sorts rows in the signal's block order and builds a block of them.
    fn build_block(rows: Vec<&Self>, compression: Compression) -> Result<BuiltBlock>;
    /// Every row of a block, for merging it into another.
    fn read_block(reader: &BlockReader<'_, ChunkFetcher<'_>>) -> Result<Vec<Self>>;
    /// About what the row holds in memory (its own size and what it owns on the heap; shared
    /// resources and scopes not counted): what the heads' budget counts.
    fn heap_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
    }
    /// Splits rows into parts of about `max` rows, one block each.
    fn split(rows: Vec<&Self>, max: usize) -> Vec<Vec<&Self>> {
        rows.chunks(max.max(1)).map(<[_]>::to_vec).collect()
    }
}

impl Row for SpanRecord {
    const SIGNAL: Signal = Signal::Spans;
    type Id = (TraceId, SpanId);

    fn id(&self) -> Self::Id {
        (self.trace_id, self.span_id)
    }
    fn time(&self) -> UnixNanos {
        self.start
    }
    fn trace_id(&self) -> Option<TraceId> {
        Some(self.trace_id)
    }
    fn encode_rows(rows: &[Self]) -> Vec<u8> {
        crate::codec::encode_spans(rows)
    }
    fn decode_rows(bytes: &[u8]) -> Result<Vec<Self>> {
        crate::codec::decode_spans(bytes)
    }
    fn build_block(rows: Vec<&Self>, compression: Compression) -> Result<BuiltBlock> {
        crate::block::writer::build_block_with(rows, compression)
    }
    fn read_block(reader: &BlockReader<'_, ChunkFetcher<'_>>) -> Result<Vec<Self>> {
        reader.spans(&Rows::All, true)
    }
    fn heap_bytes(&self) -> usize {
        let events: usize = self
            .events
            .iter()
            .map(|e| string_bytes(&e.name) + attribute_bytes(&e.attributes))
            .sum();
        let links: usize = self
            .links
            .iter()
            .map(|l| string_bytes(&l.trace_state) + attribute_bytes(&l.attributes))
            .sum();
        std::mem::size_of::<Self>()
            + string_bytes(&self.trace_state)
            + string_bytes(&self.name)
            + string_bytes(&self.status_message)
            + attribute_bytes(&self.attributes)
            + slots::<Event>(self.events.capacity())
            + events
            + slots::<Link>(self.links.capacity())
            + links
    }
    /// Never splits a trace unless a single trace alone exceeds `max`: a trace read by id
    /// then touches as few blocks as possible.
    fn split(mut rows: Vec<&Self>, max: usize) -> Vec<Vec<&Self>> {
        if rows.len() <= max {
            return vec![rows];
        }
        rows.sort_by_key(|s| (s.trace_id, s.start));
        let mut parts = Vec::new();
        let mut current: Vec<&Self> = Vec::new();
        for span in rows {
            let boundary = current.last().is_some_and(|l| l.trace_id != span.trace_id);
            if current.len() >= max && (boundary || current.len() >= 2 * max) {
                parts.push(std::mem::take(&mut current));
            }
            current.push(span);
        }
        parts.push(current);
        parts
    }
}

impl Row for LogRecord {
    const SIGNAL: Signal = Signal::Logs;
    type Id = (u64, u64);

    fn id(&self) -> Self::Id {
        self.digest()
    }
    fn time(&self) -> UnixNanos {
        self.time
    }
    fn trace_id(&self) -> Option<TraceId> {
        self.trace_id
    }
    fn encode_rows(rows: &[Self]) -> Vec<u8> {
        crate::codec::encode_logs(rows)
    }
    fn decode_rows(bytes: &[u8]) -> Result<Vec<Self>> {
        crate::codec::decode_logs(bytes)
    }
    fn build_block(rows: Vec<&Self>, compression: Compression) -> Result<BuiltBlock> {
        crate::block::logs::build(rows, compression)
    }
    fn read_block(reader: &BlockReader<'_, ChunkFetcher<'_>>) -> Result<Vec<Self>> {
        crate::block::logs::read(reader, &Rows::All)
    }
    fn heap_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + string_bytes(&self.severity_text)
            + string_bytes(&self.event_name)
            + value_bytes(&self.body)
            + attribute_bytes(&self.attributes)
    }
}

impl Row for MetricPoint {
    const SIGNAL: Signal = Signal::Metrics;
    /// One value per series and instant, as Prometheus has it.
    type Id = (SeriesId, u64);

    fn id(&self) -> Self::Id {
        (self.series, self.time.0)
    }
    fn time(&self) -> UnixNanos {
        self.time
    }
    fn trace_id(&self) -> Option<TraceId> {
        None
    }
    fn encode_rows(rows: &[Self]) -> Vec<u8> {
        crate::codec::encode_points(rows)
    }
    fn decode_rows(bytes: &[u8]) -> Result<Vec<Self>> {
        crate::codec::decode_points(bytes)
    }
    fn build_block(rows: Vec<&Self>, compression: Compression) -> Result<BuiltBlock> {
        crate::block::metrics::build(rows, compression)
    }
    fn read_block(reader: &BlockReader<'_, ChunkFetcher<'_>>) -> Result<Vec<Self>> {
        crate::block::metrics::read(reader, &Rows::All)
    }
    fn heap_bytes(&self) -> usize {
        let buckets = self
            .value
            .buckets()
            .map_or(0, |(b, c)| 8 * (b.len() + c.len()));
        let exemplars: usize = self
            .exemplars
            .iter()
            .map(|e| {
                std::mem::size_of_val(e)
                    + e.filtered
                        .iter()
                        .map(|(k, v)| 48 + k.len() + v.len())
                        .sum::<usize>()
            })
            .sum();
        std::mem::size_of::<Self>() + buckets + exemplars
    }
}

/// What the allocator keeps for one allocation beyond what was asked (size classes, headers).
const ALLOCATION: usize = 16;

/// A heap allocation of `capacity` slots of `T` (none when empty).
fn slots<T>(capacity: usize) -> usize {
    match capacity * std::mem::size_of::<T>() {
        0 => 0,
        n => n + ALLOCATION,
    }
}

fn string_bytes(s: &str) -> usize {
    slots::<u8>(s.len())
}

/// What attributes hold in memory: their slots and their keys' and values' bytes.
fn attribute_bytes(attributes: &Vec<KeyValue>) -> usize {
    slots::<KeyValue>(attributes.capacity())
        + attributes
            .iter()
            .map(|kv| string_bytes(&kv.key) + value_bytes(&kv.value))
            .sum::<usize>()
}

/// The heap bytes of a value (arrays and maps count their slots too).
fn value_bytes(v: &Value) -> usize {
    match v {
        Value::Str(s) => string_bytes(s),
        Value::Bytes(b) => slots::<u8>(b.capacity()),
        Value::Array(a) => slots::<Value>(a.capacity()) + a.iter().map(value_bytes).sum::<usize>(),
        Value::KvList(kvs) => attribute_bytes(kvs),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rows_memory_counts_what_it_owns() {
        let bare = SpanRecord::default();
        assert_eq!(bare.heap_bytes(), std::mem::size_of::<SpanRecord>());
        let mut span = SpanRecord {
            name: "llm.generate".into(),
            ..Default::default()
        };
        span.attributes
            .push(KeyValue::new("prompt", Value::Str("x".repeat(1000))));
        let attribute = std::mem::size_of::<KeyValue>() + "prompt".len() + 1000;
        assert!(span.heap_bytes() >= bare.heap_bytes() + "llm.generate".len() + attribute);
        // the attribute vector has room for four, as `push` leaves it
        let room = 4 * std::mem::size_of::<KeyValue>() + 100;
        assert!(span.heap_bytes() <= bare.heap_bytes() + attribute + room);
        let log = LogRecord {
            body: Value::Str("y".repeat(5000)),
            ..Default::default()
        };
        assert!(log.heap_bytes() >= std::mem::size_of::<LogRecord>() + 5000);
    }
}
