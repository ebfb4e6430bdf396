//! Metric series and their points as Weft keeps them.
//!
//! A [`Series`] is what identifies a time series: the metric name, its type, unit and
//! temporality, and its labels (the point's attributes over the promoted resource
//! attributes, see the ingest crate). Each series of a tenant gets a stable [`SeriesId`] the
//! first time it is seen; points carry that id, not the labels.

use super::{SpanId, TraceId, UnixNanos};

/// A tenant's id of a series, given in order of first appearance and never reused.
pub type SeriesId = u32;

/// The OTLP type of a metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
#[repr(u8)]
pub enum MetricKind {
    #[default]
    Gauge = 0,
    Sum = 1,
    Histogram = 2,
    ExponentialHistogram = 3,
    Summary = 4,
}

impl MetricKind {
    pub const ALL: [MetricKind; 5] = [
        Self::Gauge,
        Self::Sum,
        Self::Histogram,
        Self::ExponentialHistogram,
        Self::Summary,
    ];

    /// The name SQL shows (`type` column).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gauge => "gauge",
            Self::Sum => "sum",
            Self::Histogram => "histogram",
            Self::ExponentialHistogram => "exponential_histogram",
            Self::Summary => "summary",
        }
    }

    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u8 == v)
    }
}

/// How a sum or histogram aggregates over time (OTLP `AggregationTemporality`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
#[repr(u8)]
pub enum Temporality {
    /// Gauges and summaries.
    #[default]
    Unspecified = 0,
    Delta = 1,
    Cumulative = 2,
}

impl Temporality {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Delta => "delta",
            Self::Cumulative => "cumulative",
        }
    }

    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Unspecified),
            1 => Some(Self::Delta),
            2 => Some(Self::Cumulative),
            _ => None,
        }
    }
}

/// What identifies a series, with what describes it.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Series {
    pub name: String,
    pub kind: MetricKind,
    pub unit: String,
    pub temporality: Temporality,
    /// Whether a sum only grows (OTLP `is_monotonic`).
    pub monotonic: bool,
    /// Label keys and values, sorted by key, keys unique.
    pub labels: Vec<(String, String)>,
    /// Not part of the identity: the first description seen.
    pub description: String,
}

impl Series {
    /// The bytes that identify the series (everything but the description).
    pub fn identity(&self) -> Vec<u8> {
        let mut w = crate::codec::Writer::default();
        w.str(&self.name);
        w.raw(&[
            self.kind as u8,
            self.temporality as u8,
            self.monotonic as u8,
        ]);
        w.str(&self.unit);
        w.u64(self.labels.len() as u64);
        for (k, v) in &self.labels {
            w.str(k);
            w.str(v);
        }
        w.buf
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .map(|i| self.labels[i].1.as_str())
    }
}

/// A sampled measurement linked to a trace (OTLP `Exemplar`).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Exemplar {
    pub time: UnixNanos,
    pub value: f64,
    pub trace_id: Option<TraceId>,
    pub span_id: Option<SpanId>,
    /// The attributes the aggregation dropped, as label pairs.
    pub filtered: Vec<(String, String)>,
}

/// One side of an exponential histogram's buckets.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ExpBuckets {
    pub offset: i32,
    pub counts: Vec<u64>,
}

/// What a point measured.
#[derive(Clone, Debug, PartialEq)]
pub enum PointValue {
    /// A gauge or sum value (integers as floats, as Prometheus keeps them).
    Number(f64),
    Histogram {
        count: u64,
        sum: Option<f64>,
        min: Option<f64>,
        max: Option<f64>,
        /// Upper bounds, ascending; `counts` has one more entry (the `+Inf` bucket).
        bounds: Vec<f64>,
        counts: Vec<u64>,
    },
    Exponential {
        count: u64,
        sum: Option<f64>,
        min: Option<f64>,
        max: Option<f64>,
        scale: i32,
        zero_count: u64,
        zero_threshold: f64,
        positive: ExpBuckets,
        negative: ExpBuckets,
    },
    Summary {
        count: u64,
        sum: f64,
        /// (quantile, value), quantiles ascending.
        quantiles: Vec<(f64, f64)>,
    },
}

impl Default for PointValue {
    fn default() -> Self {
        Self::Number(0.0)
    }
}

impl PointValue {
    /// The number of observations of a histogram or summary.
    pub fn count(&self) -> Option<u64> {
        match self {
            Self::Number(_) => None,
            Self::Histogram { count, .. }
            | Self::Exponential { count, .. }
            | Self::Summary { count, .. } => Some(*count),
        }
    }

    pub fn sum(&self) -> Option<f64> {
        match self {
            Self::Number(_) => None,
            Self::Histogram { sum, .. } | Self::Exponential { sum, .. } => *sum,
            Self::Summary { sum, .. } => Some(*sum),
        }
    }

    /// Bucket upper bounds and per-bucket counts, as explicit buckets: an exponential
    /// histogram's buckets are given by their upper bounds (`base^(index+1)`, base
    /// `2^(2^-scale)`), the zero bucket's bound being its threshold; a summary has none.
    pub fn buckets(&self) -> Option<(Vec<f64>, Vec<u64>)> {
        match self {
            Self::Histogram { bounds, counts, .. } => Some((bounds.clone(), counts.clone())),
            Self::Exponential {
                scale,
                zero_count,
                zero_threshold,
                positive,
                negative,
                ..
            } => {
                let base = 2f64.powf(2f64.powi(-scale));
                let mut bounds = Vec::new();
                let mut counts = Vec::new();
                // negative buckets, most negative first: bucket i holds (-base^(i+1), -base^i]
                for (i, c) in negative.counts.iter().enumerate().rev() {
                    let index = negative.offset + i as i32;
                    bounds.push(-base.powi(index));
                    counts.push(*c);
                }
                bounds.push(*zero_threshold);
                counts.push(*zero_count);
                for (i, c) in positive.counts.iter().enumerate() {
                    let index = positive.offset + i as i32;
                    bounds.push(base.powi(index + 1));
                    counts.push(*c);
                }
                // the last bound is the +Inf bucket's lower edge: explicit buckets keep one
                // more count than bounds
                counts.push(0);
                Some((bounds, counts))
            }
            Self::Summary { .. } | Self::Number(_) => None,
        }
    }
}

/// One point of a series.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct MetricPoint {
    pub series: SeriesId,
    pub time: UnixNanos,
    /// When the cumulative (or delta) interval began; zero when not given.
    pub start_time: UnixNanos,
    pub value: PointValue,
    /// OTLP `DataPointFlags` (bit 0: no recorded value, Prometheus's stale marker).
    pub flags: u32,
    pub exemplars: Vec<Exemplar>,
}
