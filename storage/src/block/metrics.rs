//! Blocks of metric points: one window's points of many series, sorted by (series, time) so
//! that a series is one run of rows, found from the `series` column alone.
//!
//! Columns ([`col`]): series id, time and start time as int64 with Parquet's delta binary
//! packing (a run of regularly sampled times has one delta, so after the page's minimum delta
//! is taken away each time costs no bits: delta-of-delta in effect; a series boundary costs one
//! wide delta); the value dictionary-encoded (Parquet falls back to plain pages when a page's
//! values do not repeat) then zstd, chosen by measurement against byte-stream-split, plain and
//! Gorilla's XOR (`size_probe` below; figures in BENCHMARKS.md): gauges are mostly rounded
//! values that repeat; sum, min and max byte-stream-split then zstd; counts as
//! delta-packed int64; explicit bucket bounds and counts as lists (bounds dictionary-encoded:
//! a series repeats them at every point); exponential histograms and summaries in the codec's
//! binary form (`detail`); exemplars likewise, null where a point has none. A column with
//! nothing but nulls costs a few bytes.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BinaryArray, BinaryBuilder, Float64Array, Float64Builder, Int64Array,
    Int64Builder, ListArray, ListBuilder,
};

use super::format::{BlockMeta, Compression, Enc, encode_core_columns};
use super::reader::{BlockReader, ChunkSource, Rows, downcast};
use super::writer::BuiltBlock;
use crate::codec::{Reader, Writer};
use crate::error::{Result, StorageError};
use crate::model::{MetricPoint, PointValue, UnixNanos};

/// Column names of a metric block.
pub mod col {
    pub const SERIES: &str = "series";
    pub const TIME: &str = "time";
    pub const START_TIME: &str = "start_time";
    pub const FLAGS: &str = "flags";
    pub const VALUE: &str = "value";
    pub const COUNT: &str = "count";
    pub const SUM: &str = "sum";
    pub const MIN: &str = "min";
    pub const MAX: &str = "max";
    pub const BOUNDS: &str = "bucket_bounds";
    pub const COUNTS: &str = "bucket_counts";
    pub const DETAIL: &str = "detail";
    pub const EXEMPLARS: &str = "exemplars";

    /// Every column, in block order.
    pub const ALL: [&str; 13] = [
        SERIES, TIME, START_TIME, FLAGS, VALUE, COUNT, SUM, MIN, MAX, BOUNDS, COUNTS, DETAIL,
        EXEMPLARS,
    ];
}

/// Builders of every metric column, filled point by point.
pub struct MetricColumns {
    /// series, time, start time, flags
    ints: [Int64Builder; 4],
    value: Float64Builder,
    count: Int64Builder,
    /// sum, min, max
    floats: [Float64Builder; 3],
    bounds: ListBuilder<Float64Builder>,
    counts: ListBuilder<Int64Builder>,
    detail: BinaryBuilder,
    exemplars: BinaryBuilder,
}

impl MetricColumns {
    pub fn with_capacity(n: usize) -> Self {
        Self {
            ints: std::array::from_fn(|_| Int64Builder::with_capacity(n)),
            value: Float64Builder::with_capacity(n),
            count: Int64Builder::with_capacity(n),
            floats: std::array::from_fn(|_| Float64Builder::with_capacity(n)),
            bounds: ListBuilder::new(Float64Builder::new()),
            counts: ListBuilder::new(Int64Builder::new()),
            detail: BinaryBuilder::new(),
            exemplars: BinaryBuilder::new(),
        }
    }

    pub fn push(&mut self, p: &MetricPoint) {
        let ints = [
            i64::from(p.series),
            p.time.0 as i64,
            p.start_time.0 as i64,
            i64::from(p.flags),
        ];
        for (b, v) in self.ints.iter_mut().zip(ints) {
            b.append_value(v);
        }
        let v = &p.value;
        match v {
            PointValue::Number(x) => self.value.append_value(*x),
            _ => self.value.append_null(),
        }
        self.count.append_option(v.count().map(|c| c as i64));
        let (min, max) = match v {
            PointValue::Histogram { min, max, .. } | PointValue::Exponential { min, max, .. } => {
                (*min, *max)
            }
            _ => (None, None),
        };
        for (b, x) in self.floats.iter_mut().zip([v.sum(), min, max]) {
            b.append_option(x);
        }
        match v {
            PointValue::Histogram { bounds, counts, .. } => {
                self.bounds.values().append_slice(bounds);
                self.bounds.append(true);
                counts
                    .iter()
                    .for_each(|c| self.counts.values().append_value(*c as i64));
                self.counts.append(true);
            }
            _ => {
                self.bounds.append(false);
                self.counts.append(false);
            }
        }
        match v {
            PointValue::Exponential { .. } | PointValue::Summary { .. } => {
                let mut w = Writer::default();
                w.point_value(v);
                self.detail.append_value(&w.buf);
            }
            _ => self.detail.append_null(),
        }
        if p.exemplars.is_empty() {
            self.exemplars.append_null();
        } else {
            let mut w = Writer::default();
            w.exemplars(&p.exemplars);
            self.exemplars.append_value(&w.buf);
        }
    }

    /// Every column with its encoding, in [`col::ALL`]'s order.
    pub fn finish(mut self) -> Vec<(&'static str, ArrayRef, Enc)> {
        let mut ints = self
            .ints
            .iter_mut()
            .map(|b| Arc::new(b.finish()) as ArrayRef);
        let mut int = || ints.next().expect("four int columns");
        let mut floats = self
            .floats
            .iter_mut()
            .map(|b| Arc::new(b.finish()) as ArrayRef);
        let mut float = || floats.next().expect("three float columns");
        vec![
            (col::SERIES, int(), Enc::Delta),
            (col::TIME, int(), Enc::Delta),
            (col::START_TIME, int(), Enc::Delta),
            (col::FLAGS, int(), Enc::Dict),
            (col::VALUE, Arc::new(self.value.finish()), Enc::Dict),
            (col::COUNT, Arc::new(self.count.finish()), Enc::Delta),
            (col::SUM, float(), Enc::Split),
            (col::MIN, float(), Enc::Split),
            (col::MAX, float(), Enc::Split),
            (col::BOUNDS, Arc::new(self.bounds.finish()), Enc::Dict),
            (col::COUNTS, Arc::new(self.counts.finish()), Enc::Delta),
            (col::DETAIL, Arc::new(self.detail.finish()), Enc::Plain),
            (
                col::EXEMPLARS,
                Arc::new(self.exemplars.finish()),
                Enc::Plain,
            ),
        ]
    }
}

/// The block order of points: by series, then time. Points of one series at one time (a
/// retry that reached two blocks) are told apart by nothing else; readers keep the first.
pub fn sort(rows: &mut [&MetricPoint]) {
    rows.sort_by_key(|p| (p.series, p.time));
}

/// Sorts points and builds a block of them; a point repeated (same series and time) is kept
/// once.
pub fn build(mut rows: Vec<&MetricPoint>, compression: Compression) -> Result<BuiltBlock> {
    sort(&mut rows);
    rows.dedup_by_key(|p| (p.series, p.time));
    let mut columns = MetricColumns::with_capacity(rows.len());
    rows.iter().for_each(|p| columns.push(p));
    let (min, max) = rows.iter().fold((u64::MAX, 0), |(lo, hi), p| {
        (lo.min(p.time.0), hi.max(p.time.0))
    });
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
        traces: Vec::new(),
        postings: Vec::new(),
    })
}

/// Whole points of the given rows of a metric block.
pub fn read<S: ChunkSource>(reader: &BlockReader<'_, S>, rows: &Rows) -> Result<Vec<MetricPoint>> {
    let get = |name: &'static str| reader.required(name, rows);
    const INTS: [&str; 4] = [col::SERIES, col::TIME, col::START_TIME, col::FLAGS];
    let ints: Vec<ArrayRef> = INTS.into_iter().map(get).collect::<Result<_>>()?;
    let ints: Vec<&Int64Array> = ints
        .iter()
        .zip(INTS)
        .map(|(a, name)| downcast(a, name))
        .collect::<Result<_>>()?;
    let value = get(col::VALUE)?;
    let value = downcast::<Float64Array>(&value, col::VALUE)?;
    let count = get(col::COUNT)?;
    let count = downcast::<Int64Array>(&count, col::COUNT)?;
    const FLOATS: [&str; 3] = [col::SUM, col::MIN, col::MAX];
    let floats: Vec<ArrayRef> = FLOATS.into_iter().map(get).collect::<Result<_>>()?;
    let floats: Vec<&Float64Array> = floats
        .iter()
        .zip(FLOATS)
        .map(|(a, name)| downcast(a, name))
        .collect::<Result<_>>()?;
    let (bounds, counts) = (get(col::BOUNDS)?, get(col::COUNTS)?);
    let (bounds, counts) = (
        downcast::<ListArray>(&bounds, col::BOUNDS)?,
        downcast::<ListArray>(&counts, col::COUNTS)?,
    );
    let (detail, exemplars) = (get(col::DETAIL)?, get(col::EXEMPLARS)?);
    let (detail, exemplars) = (
        downcast::<BinaryArray>(&detail, col::DETAIL)?,
        downcast::<BinaryArray>(&exemplars, col::EXEMPLARS)?,
    );
    let float = |a: &Float64Array, i: usize| a.is_valid(i).then(|| a.value(i));
    let mut out = Vec::with_capacity(ints[0].len());
    for i in 0..ints[0].len() {
        let value = if value.is_valid(i) {
            PointValue::Number(value.value(i))
        } else if detail.is_valid(i) {
            Reader::new(detail.value(i)).point_value()?
        } else if bounds.is_valid(i) {
            let b = bounds.value(i);
            let c = counts.value(i);
            PointValue::Histogram {
                count: count.value(i) as u64,
                sum: float(floats[0], i),
                min: float(floats[1], i),
                max: float(floats[2], i),
                bounds: downcast::<Float64Array>(&b, col::BOUNDS)?.values().to_vec(),
                counts: downcast::<Int64Array>(&c, col::COUNTS)?
                    .values()
                    .iter()
                    .map(|c| *c as u64)
                    .collect(),
            }
        } else {
            return Err(StorageError::corrupt(
                "metric block",
                "a point with no value",
            ));
        };
        out.push(MetricPoint {
            series: ints[0].value(i) as u32,
            time: UnixNanos(ints[1].value(i) as u64),
            start_time: UnixNanos(ints[2].value(i) as u64),
            flags: ints[3].value(i) as u32,
            value,
            exemplars: match exemplars.is_valid(i) {
                true => Reader::new(exemplars.value(i)).exemplars()?,
                false => Vec::new(),
            },
        });
    }
    Ok(out)
}

#[cfg(test)]
mod size_probe {
    //! Values of GPU gauges, series after series as a block holds them, encoded the ways the
    //! metrics issue asks to choose between: byte-stream-split (what blocks use), plain and
    //! dictionary Parquet, each with zstd where it pays, and Gorilla's XOR.
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::block::format::encode_chunk_with;

    /// Gorilla's XOR encoding (Pelkonen et al. 2015), in bits.
    fn xor_bits(values: &[f64]) -> usize {
        let mut bits = 64;
        let (mut prev, mut lead, mut trail) = (values[0].to_bits(), 64u32, 64u32);
        for v in &values[1..] {
            let x = v.to_bits() ^ prev;
            prev = v.to_bits();
            if x == 0 {
                bits += 1;
                continue;
            }
            let (l, t) = (x.leading_zeros().min(31), x.trailing_zeros());
            if lead <= l && trail <= t && lead < 64 {
                bits += 2 + (64 - lead - trail) as usize;
            } else {
                bits += 2 + 5 + 6 + (64 - l - t) as usize;
                (lead, trail) = (l, t);
            }
        }
        bits
    }

    #[test]
    #[ignore = "prints encoded sizes of candidate value encodings; run by hand"]
    fn probe() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut values = Vec::new();
        let mut series_starts = vec![0];
        for series in 0..1024 {
            let mut load: f64 = rng.random_range(0.3..0.9);
            for _ in 0..360 {
                load = (load + rng.random_range(-0.05..0.05)).clamp(0.0, 1.0);
                values.push(match series % 8 {
                    0 => (load * 100.0).round(),
                    1 => (81_559.0 * (0.55 + 0.25 * load)).round(),
                    2 => (81_559.0 * (0.45 - 0.25 * load)).round(),
                    3 => (40.0 + 35.0 * load).round(),
                    4 => ((120.0 + 560.0 * load) * 1000.0).round() / 1000.0,
                    5 => 1980.0,
                    6 => 2619.0,
                    _ => (load * 0.7 * 1e4).round() / 1e4,
                });
            }
            series_starts.push(values.len());
        }
        let array: ArrayRef = Arc::new(Float64Array::from(values.clone()));
        for enc in [Enc::Split, Enc::Plain, Enc::Dict] {
            let bytes = encode_chunk_with(&array, enc, Compression::Zstd)
                .unwrap()
                .len();
            println!(
                "{enc:?} (+ zstd where it pays): {:.3} bytes/value",
                bytes as f64 / values.len() as f64
            );
        }
        let xor: usize = series_starts
            .windows(2)
            .map(|w| xor_bits(&values[w[0]..w[1]]))
            .sum();
        println!(
            "Gorilla XOR per series: {:.3} bytes/value",
            xor as f64 / 8.0 / values.len() as f64
        );
    }
}
