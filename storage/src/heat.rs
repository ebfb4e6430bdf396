//! Per-block latency histograms by second: what a latency heatmap over time needs (counts by
//! (time step × log2 latency bucket), one exemplar trace per cell), kept so that a heatmap over
//! a long range reads a few kilobytes a block instead of every span.
//!
//! A [`HeatRollup`] holds, for the spans it covers, one cell per (operation, track, second of
//! the start time, log2 bucket of the value in milliseconds): the spans counted and the
//! greatest trace id among them (the exemplar). Tracks: every span's duration
//! ([`Track::Duration`]), and for decode token spans (`llm.decode.token`) the inter-token
//! latency ([`Track::Itl`]: `llm.token.latency_ms` when the span carries it, else its
//! duration). A bucket is `ceil(log2(ms))` (values ≤ 0 in [`ZERO_BUCKET`]), exactly what the
//! SQL heatmap computes, so that steps of whole seconds over ranges of whole seconds are
//! answered exactly. Rollups merge by adding counts and keeping the greater exemplar.
//!
//! A third track, [`Track::ItlBin`], counts decode token latencies by their quantile-sketch
//! bin ([`crate::sketch::bin_of`], 1% relative error) instead of a log2 bucket, without
//! exemplars: what an anomaly scan of decode latency reads its per-step p95 from. Version 1
//! rollups lack it ([`BlockHeat::has_bins`]).
//!
//! A span block keeps the rollup of its rows as a chunk written with the block (see
//! `block::writer`); a block written before keeps none, and a heatmap over it runs on SQL.

use std::sync::OnceLock;

use rustc_hash::FxHashMap as HashMap;

use crate::codec::{Reader, Writer};
use crate::error::{Result, StorageError};
use crate::model::{SpanRecord, TraceId, Value};
use crate::request::dedicated_value;
use crate::rollup::{Op, RowOps};
use crate::schema::DEDICATED;

/// Version of the encoded rollup.
pub const HEAT_VERSION: u8 = 2;

/// The bucket of values that are zero or negative (SQL's heatmap uses the same).
pub const ZERO_BUCKET: i16 = -1075;

/// The name of decode token spans, which carry inter-token latency.
pub const TOKEN_SPAN: &str = "llm.decode.token";

/// The attribute holding a token span's own latency, in ms.
pub const TOKEN_LATENCY: &str = "llm.token.latency_ms";

/// What a cell's value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Track {
    /// The span's duration.
    Duration = 0,
    /// A decode token span's latency.
    Itl = 1,
    /// A decode token span's latency by sketch bin (no exemplar; from version 2).
    ItlBin = 2,
}

impl Track {
    fn from_u8(b: u8) -> Result<Self> {
        match b {
            0 => Ok(Self::Duration),
            1 => Ok(Self::Itl),
            2 => Ok(Self::ItlBin),
            b => Err(StorageError::corrupt(
                "heat rollup",
                format!("track {b} is unknown"),
            )),
        }
    }
}

/// The log2 bucket of a value in ms: `ceil(log2(v))`, or [`ZERO_BUCKET`] when `v ≤ 0`.
pub fn bucket_of(ms: f64) -> i16 {
    if ms > 0.0 {
        ms.log2()
            .ceil()
            .clamp(f64::from(i16::MIN), f64::from(i16::MAX)) as i16
    } else {
        ZERO_BUCKET
    }
}

/// A sketch bin ([`crate::sketch::bin_of`]) as a cell's bucket: bins beyond `i16` (values
/// beyond e^±655 ms) clamp, [`crate::sketch::ZERO_BIN`] is `i16::MIN`.
pub fn bin_bucket(ms: f64) -> i16 {
    match crate::sketch::bin_of(ms) {
        crate::sketch::ZERO_BIN => i16::MIN,
        b => b.clamp(i64::from(i16::MIN) + 1, i64::from(i16::MAX)) as i16,
    }
}

/// The sketch bin of a [`Track::ItlBin`] cell's bucket.
pub fn bucket_bin(bucket: i16) -> i64 {
    match bucket {
        i16::MIN => crate::sketch::ZERO_BIN,
        b => b.into(),
    }
}

/// A token span's latency in ms: its `llm.token.latency_ms` (a double: what the dedicated
/// column holds, and so what SQL reads), else its duration.
pub fn token_latency_ms(span: &SpanRecord) -> f64 {
    match token_latency_column().and_then(|i| dedicated_value(span, i)) {
        Some(Value::Double(v)) => *v,
        _ => span.duration_ns() as f64 / 1e6,
    }
}

/// The dedicated column of [`TOKEN_LATENCY`].
pub fn token_latency_column() -> Option<usize> {
    static COLUMN: OnceLock<Option<usize>> = OnceLock::new();
    *COLUMN.get_or_init(|| DEDICATED.iter().position(|d| d.name == TOKEN_LATENCY))
}

/// One cell: the spans of one operation and track that started in one second with values
/// in one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cell {
    pub op: u32,
    pub track: Track,
    /// Unix seconds of the spans' start.
    pub second: u64,
    pub bucket: i16,
    pub count: u64,
    /// The greatest trace id among the spans.
    pub exemplar: TraceId,
}

type Key = (u32, Track, u64, i16);

/// Per track, the cell being counted and its count and exemplar so far.
type Runs = [Option<(Key, u64, TraceId)>; 3];

/// Builds the rollup of a block's rows as they are visited in order (the block writer's
/// pass over its rows: each row's fields are read there once).
pub struct RowHeat {
    rollup: HeatRollup,
    runs: Runs,
    /// Per operation, whether its spans are decode token spans.
    token: Vec<bool>,
}

impl RowHeat {
    pub fn new(row_ops: &RowOps) -> Self {
        let mut rollup = HeatRollup::default();
        for op in &row_ops.ops {
            rollup.op_owned(op.clone());
        }
        let token = row_ops
            .ops
            .iter()
            .map(|(_, name)| name == TOKEN_SPAN)
            .collect();
        Self {
            rollup,
            runs: Runs::default(),
            token,
        }
    }

    /// Counts the next row, of operation `op`, whose `llm.token.latency_ms` (as
    /// [`token_latency_ms`] finds it) is `itl`.
    pub fn add(&mut self, op: u32, s: &SpanRecord, itl: Option<f64>) {
        let token = self.token[op as usize];
        let ms = || itl.unwrap_or_else(|| s.duration_ns() as f64 / 1e6);
        self.rollup
            .add_span(&mut self.runs, op, s, token.then_some(ms));
    }

    pub fn finish(mut self) -> HeatRollup {
        self.rollup.end_runs(self.runs);
        self.rollup
    }
}

/// The cells of some spans.
#[derive(Clone, Debug, Default)]
pub struct HeatRollup {
    /// The operations, in the order first seen.
    pub ops: Vec<Op>,
    cells: HashMap<Key, (u64, TraceId)>,
    index: HashMap<Op, u32>,
}

impl HeatRollup {
    fn op(&mut self, service: &str, name: &str) -> u32 {
        // few operations: found without building the key
        if self.ops.len() <= 16
            && let Some(i) = self.ops.iter().position(|(s, n)| s == service && n == name)
        {
            return i as u32;
        }
        self.op_owned((service.to_owned(), name.to_owned()))
    }

    fn op_owned(&mut self, op: Op) -> u32 {
        if let Some(&i) = self.index.get(&op) {
            return i;
        }
        let i = self.ops.len() as u32;
        self.index.insert(op.clone(), i);
        self.ops.push(op);
        i
    }

    fn add(&mut self, key: Key, count: u64, exemplar: TraceId) {
        let cell = self.cells.entry(key).or_insert((0, exemplar));
        cell.0 += count;
        if exemplar > cell.1 {
            cell.1 = exemplar;
        }
    }

    /// Counts one span of operation `op`, with `itl` its token latency when a token span.
    fn add_span(
        &mut self,
        runs: &mut Runs,
        op: u32,
        s: &SpanRecord,
        itl: Option<impl FnOnce() -> f64>,
    ) {
        let second = s.start.0 / 1_000_000_000;
        let ms = s.duration_ns() as f64 / 1e6;
        self.count(
            runs,
            (op, Track::Duration, second, bucket_of(ms)),
            s.trace_id,
        );
        if let Some(itl) = itl {
            let itl = itl();
            self.count(runs, (op, Track::Itl, second, bucket_of(itl)), s.trace_id);
            let key = (op, Track::ItlBin, second, bin_bucket(itl));
            self.count(runs, key, TraceId([0; 16]));
        }
    }

    /// Counts one span into the cell `key`: a trace's token spans fall in few cells, so each
    /// track's last cell is counted apart and added to the map when another comes.
    fn count(&mut self, runs: &mut Runs, key: Key, exemplar: TraceId) {
        let run = &mut runs[key.1 as usize];
        match run {
            Some((k, n, e)) if *k == key => {
                *n += 1;
                *e = (*e).max(exemplar);
            }
            _ => {
                if let Some((k, n, e)) = run.replace((key, 1, exemplar)) {
                    self.add(k, n, e);
                }
            }
        }
    }

    fn end_runs(&mut self, runs: Runs) {
        for (k, n, e) in runs.into_iter().flatten() {
            self.add(k, n, e);
        }
    }

    /// The rollup of some spans.
    pub fn of_spans<'a>(spans: impl IntoIterator<Item = &'a SpanRecord>) -> Self {
        let mut r = Self::default();
        let mut runs = Runs::default();
        let mut last: Option<(&str, &str, u32)> = None;
        for s in spans {
            // rows of one operation come in runs: the last one's index without a lookup
            let op = match last {
                Some((service, name, op)) if service == s.service_name() && name == s.name => op,
                _ => r.op(s.service_name(), &s.name),
            };
            last = Some((s.service_name(), &s.name, op));
            let token = (s.name == TOKEN_SPAN).then_some(|| token_latency_ms(s));
            r.add_span(&mut runs, op, s, token);
        }
        r.end_runs(runs);
        r
    }

    /// Adds `other` into `self`.
    pub fn absorb(&mut self, other: &HeatRollup) {
        let map: Vec<u32> = other.ops.iter().map(|o| self.op_owned(o.clone())).collect();
        for (&(op, track, second, bucket), &(count, exemplar)) in &other.cells {
            self.add((map[op as usize], track, second, bucket), count, exemplar);
        }
    }

    /// The cells, sorted by (operation, track, second, bucket).
    pub fn cells(&self) -> Vec<Cell> {
        let mut out: Vec<Cell> = self
            .cells
            .iter()
            .map(|(&(op, track, second, bucket), &(count, exemplar))| Cell {
                op,
                track,
                second,
                bucket,
                count,
                exemplar,
            })
            .collect();
        out.sort_unstable_by_key(|c| (c.op, c.track, c.second, c.bucket));
        out
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.buf.push(HEAT_VERSION);
        w.u64(self.ops.len() as u64);
        for (service, name) in &self.ops {
            w.str(service);
            w.str(name);
        }
        let cells = self.cells();
        let base = cells.iter().map(|c| c.second).min().unwrap_or(0);
        w.u64(base);
        w.u64(cells.len() as u64);
        for c in &cells {
            w.u64(c.op.into());
            w.buf.push(c.track as u8);
            w.u64(c.second - base);
            w.i64(c.bucket.into());
            w.u64(c.count);
            if c.track != Track::ItlBin {
                w.raw(&c.exemplar.0);
            }
        }
        w.buf
    }

    /// The cells of an encoded rollup with its operations (sorted as [`Self::cells`]).
    pub fn decode(buf: &[u8]) -> Result<BlockHeat> {
        let buf = &*crate::block::format::unpack_rollup(buf, "heat rollup")?;
        let corrupt = |m: String| StorageError::corrupt("heat rollup", m);
        let mut r = Reader::new(buf);
        let version = r.u8()?;
        if !(1..=HEAT_VERSION).contains(&version) {
            return Err(corrupt(format!(
                "version {version}, this build reads {HEAT_VERSION}"
            )));
        }
        let n_ops = r.u64()?;
        let mut ops = Vec::with_capacity(n_ops.min(1 << 16) as usize);
        for _ in 0..n_ops {
            ops.push((r.string()?, r.string()?));
        }
        let base = r.u64()?;
        let n = r.u64()?;
        let mut cells = Vec::with_capacity(n.min(1 << 20) as usize);
        let mut bins = Vec::new();
        for _ in 0..n {
            let op = r.u64()?;
            if op >= n_ops {
                return Err(corrupt(format!("operation {op} of {n_ops}")));
            }
            let track = Track::from_u8(r.u8()?)?;
            let second = base
                .checked_add(r.u64()?)
                .ok_or_else(|| corrupt("second out of range".into()))?;
            let bucket =
                i16::try_from(r.i64()?).map_err(|_| corrupt("bucket out of range".into()))?;
            let count = r.u64()?;
            if track == Track::ItlBin {
                bins.push(BinCell {
                    second,
                    op: op as u32,
                    count: u32::try_from(count)
                        .map_err(|_| corrupt("count out of range".into()))?,
                    bin: bucket,
                });
                continue;
            }
            let exemplar = TraceId(r.raw(16)?.try_into().expect("16 bytes"));
            cells.push(Cell {
                op: op as u32,
                track,
                second,
                bucket,
                count,
                exemplar,
            });
        }
        Ok(BlockHeat {
            ops,
            cells,
            bins,
            has_bins: version >= 2,
        })
    }
}

/// A [`Track::ItlBin`] cell, kept apart (no exemplar, and a heatmap never reads them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BinCell {
    pub second: u64,
    pub op: u32,
    pub count: u32,
    /// As [`bin_bucket`] writes it.
    pub bin: i16,
}

/// A block's decoded rollup: its operations and cells.
#[derive(Debug, Default)]
pub struct BlockHeat {
    pub ops: Vec<Op>,
    /// The duration and inter-token latency cells.
    pub cells: Vec<Cell>,
    /// The sketch-bin cells.
    pub bins: Vec<BinCell>,
    /// Whether it counts [`Track::ItlBin`] (version 2 on).
    pub has_bins: bool,
}

impl BlockHeat {
    pub fn weight(&self) -> usize {
        let ops: usize = self.ops.iter().map(|(s, n)| 64 + s.len() + n.len()).sum();
        64 + ops
            + self.cells.len() * std::mem::size_of::<Cell>()
            + self.bins.len() * std::mem::size_of::<BinCell>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{KeyValue, SpanId, UnixNanos};

    fn span(trace: u8, name: &str, start_s: u64, d_ns: u64, latency: Option<f64>) -> SpanRecord {
        SpanRecord {
            trace_id: TraceId([trace; 16]),
            span_id: SpanId([trace; 8]),
            name: name.into(),
            start: UnixNanos(start_s * 1_000_000_000 + 7),
            end: UnixNanos(start_s * 1_000_000_000 + 7 + d_ns),
            attributes: latency
                .map(|v| {
                    vec![KeyValue {
                        key: TOKEN_LATENCY.into(),
                        value: Value::Double(v),
                    }]
                })
                .unwrap_or_default(),
            ..Default::default()
        }
    }

    #[test]
    fn buckets_are_the_sql_heatmaps() {
        assert_eq!(bucket_of(1.0), 0);
        assert_eq!(bucket_of(1.5), 1);
        assert_eq!(bucket_of(2.0), 1);
        assert_eq!(bucket_of(0.3), -1);
        assert_eq!(bucket_of(0.0), ZERO_BUCKET);
        assert_eq!(bucket_of(-3.0), ZERO_BUCKET);
    }

    #[test]
    fn spans_count_per_second_and_bucket_and_read_back_as_written() {
        let spans = [
            span(1, TOKEN_SPAN, 10, 3_000_000, Some(0.7)),
            span(2, TOKEN_SPAN, 10, 3_500_000, None),
            span(3, "llm.generate", 11, 900_000_000, None),
        ];
        let r = HeatRollup::of_spans(&spans);
        let cells = r.cells();
        let find = |track, second, bucket| {
            cells
                .iter()
                .find(|c| c.track == track && c.second == second && c.bucket == bucket)
                .map(|c| (c.count, c.exemplar.0[0]))
        };
        // both token spans last 3–3.5 ms: bucket 2; their latencies 0.7 and 3.5 ms
        assert_eq!(find(Track::Duration, 10, 2), Some((2, 2)));
        assert_eq!(find(Track::Itl, 10, 0), Some((1, 1)));
        assert_eq!(find(Track::Itl, 10, 2), Some((1, 2)));
        assert_eq!(find(Track::Duration, 11, 10), Some((1, 3)));
        assert_eq!(find(Track::Itl, 11, 10), None);
        let back = HeatRollup::decode(&r.encode()).unwrap();
        assert!(back.has_bins);
        assert_eq!(back.ops, r.ops);
        let (bins, rest): (Vec<Cell>, Vec<Cell>) =
            cells.iter().partition(|c| c.track == Track::ItlBin);
        assert_eq!(back.cells, rest);
        let read: Vec<(u64, i16, u64)> = back
            .bins
            .iter()
            .map(|b| (b.second, b.bin, u64::from(b.count)))
            .collect();
        let written: Vec<(u64, i16, u64)> =
            bins.iter().map(|c| (c.second, c.bucket, c.count)).collect();
        assert_eq!(read, written);
        // the bins: 0.7 and 3.5 ms, no exemplar
        let bins: Vec<(i64, u64, TraceId)> = cells
            .iter()
            .filter(|c| c.track == Track::ItlBin)
            .map(|c| (bucket_bin(c.bucket), c.count, c.exemplar))
            .collect();
        let zero = TraceId([0; 16]);
        let mut want = vec![
            (crate::sketch::bin_of(0.7), 1, zero),
            (crate::sketch::bin_of(3.5), 1, zero),
        ];
        want.sort();
        assert_eq!(bins, want);
        assert_eq!(bucket_bin(bin_bucket(0.0)), crate::sketch::ZERO_BIN);
        assert_eq!(bucket_bin(bin_bucket(-1.0)), crate::sketch::ZERO_BIN);
        assert_eq!(bucket_bin(bin_bucket(1e300)), i64::from(i16::MAX));
        // merging halves is the rollup of the whole
        let mut halves = HeatRollup::of_spans(&spans[2..]);
        halves.absorb(&HeatRollup::of_spans(&spans[..2]));
        // the cells by operation name, in one order
        let named = |r: &HeatRollup| {
            let mut v: Vec<_> = r
                .cells()
                .into_iter()
                .map(|c| {
                    let op = r.ops[c.op as usize].clone();
                    (op, c.track, c.second, c.bucket, c.count, c.exemplar)
                })
                .collect();
            v.sort_by(|x, y| format!("{x:?}").cmp(&format!("{y:?}")));
            v
        };
        assert_eq!(named(&halves), named(&r));
        assert!(HeatRollup::decode(&[9]).is_err());
    }
}
