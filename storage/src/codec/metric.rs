//! Metric points in the write-ahead head and in a block's binary columns, and series in the
//! series catalog.
//!
//! A point row is [`POINT_ROW_VERSION`], then series id, time, start time, flags (varints), the
//! value (a kind byte, then its fields: 0 number `f64`; 1 histogram; 2 exponential histogram;
//! 3 summary, see [`Writer::point_value`]) and the exemplars. A series is
//! [`SERIES_VERSION`], then name, kind, temporality, monotonic, unit, labels, description.

use super::{Reader, Writer};
use crate::error::{Result, StorageError};
use crate::model::{
    Exemplar, ExpBuckets, MetricKind, MetricPoint, PointValue, Series, SpanId, Temporality,
    TraceId, UnixNanos,
};

pub const POINT_ROW_VERSION: u8 = 1;
pub const SERIES_VERSION: u8 = 1;

impl Writer {
    pub fn point(&mut self, p: &MetricPoint) {
        self.buf.push(POINT_ROW_VERSION);
        self.u64(p.series.into());
        self.u64(p.time.0);
        self.u64(p.start_time.0);
        self.u64(p.flags.into());
        self.point_value(&p.value);
        self.exemplars(&p.exemplars);
    }

    fn f64(&mut self, v: f64) {
        self.raw(&v.to_le_bytes());
    }

    fn opt_f64(&mut self, v: Option<f64>) {
        match v {
            Some(v) => {
                self.buf.push(1);
                self.f64(v);
            }
            None => self.buf.push(0),
        }
    }

    fn counts(&mut self, counts: &[u64]) {
        self.u64(counts.len() as u64);
        counts.iter().for_each(|c| self.u64(*c));
    }

    /// A point's value (also the `detail` column of exponential histograms and summaries).
    pub fn point_value(&mut self, v: &PointValue) {
        match v {
            PointValue::Number(x) => {
                self.buf.push(0);
                self.f64(*x);
            }
            PointValue::Histogram {
                count,
                sum,
                min,
                max,
                bounds,
                counts,
            } => {
                self.buf.push(1);
                self.u64(*count);
                [*sum, *min, *max].into_iter().for_each(|v| self.opt_f64(v));
                self.u64(bounds.len() as u64);
                bounds.iter().for_each(|b| self.f64(*b));
                self.counts(counts);
            }
            PointValue::Exponential {
                count,
                sum,
                min,
                max,
                scale,
                zero_count,
                zero_threshold,
                positive,
                negative,
            } => {
                self.buf.push(2);
                self.u64(*count);
                [*sum, *min, *max].into_iter().for_each(|v| self.opt_f64(v));
                self.i64((*scale).into());
                self.u64(*zero_count);
                self.f64(*zero_threshold);
                for side in [positive, negative] {
                    self.i64(side.offset.into());
                    self.counts(&side.counts);
                }
            }
            PointValue::Summary {
                count,
                sum,
                quantiles,
            } => {
                self.buf.push(3);
                self.u64(*count);
                self.f64(*sum);
                self.u64(quantiles.len() as u64);
                for (q, v) in quantiles {
                    self.f64(*q);
                    self.f64(*v);
                }
            }
        }
    }

    pub fn exemplars(&mut self, exemplars: &[Exemplar]) {
        self.u64(exemplars.len() as u64);
        for e in exemplars {
            self.u64(e.time.0);
            self.f64(e.value);
            let ids = [
                e.trace_id.as_ref().map(|t| &t.0[..]),
                e.span_id.as_ref().map(|s| &s.0[..]),
            ];
            for id in ids {
                match id {
                    Some(b) => {
                        self.buf.push(1);
                        self.raw(b);
                    }
                    None => self.buf.push(0),
                }
            }
            self.labels(&e.filtered);
        }
    }

    fn labels(&mut self, labels: &[(String, String)]) {
        self.u64(labels.len() as u64);
        for (k, v) in labels {
            self.str(k);
            self.str(v);
        }
    }

    pub fn series(&mut self, s: &Series) {
        self.buf.push(SERIES_VERSION);
        self.str(&s.name);
        self.raw(&[s.kind as u8, s.temporality as u8, s.monotonic as u8]);
        self.str(&s.unit);
        self.labels(&s.labels);
        self.str(&s.description);
    }
}

fn corrupt(detail: impl Into<String>) -> StorageError {
    StorageError::corrupt("metric point", detail)
}

impl Reader<'_> {
    pub fn point(&mut self) -> Result<MetricPoint> {
        let version = self.u8()?;
        if version != POINT_ROW_VERSION {
            return Err(StorageError::UnsupportedVersion {
                what: "metric point row",
                found: version,
                supported: POINT_ROW_VERSION,
            });
        }
        Ok(MetricPoint {
            series: self.u32()?,
            time: UnixNanos(self.u64()?),
            start_time: UnixNanos(self.u64()?),
            flags: self.u32()?,
            value: self.point_value()?,
            exemplars: self.exemplars()?,
        })
    }

    fn f64(&mut self) -> Result<f64> {
        Ok(f64::from_le_bytes(self.array()?))
    }

    fn opt_f64(&mut self) -> Result<Option<f64>> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.f64()?)),
            b => Err(corrupt(format!("presence byte {b}"))),
        }
    }

    fn counts(&mut self) -> Result<Vec<u64>> {
        let n = self.u64()? as usize;
        let mut out = Vec::with_capacity(n.min(4096));
        for _ in 0..n {
            out.push(self.u64()?);
        }
        Ok(out)
    }

    fn i32(&mut self) -> Result<i32> {
        i32::try_from(self.i64()?).map_err(|_| corrupt("i32 out of range"))
    }

    pub fn point_value(&mut self) -> Result<PointValue> {
        Ok(match self.u8()? {
            0 => PointValue::Number(self.f64()?),
            1 => {
                let count = self.u64()?;
                let (sum, min, max) = (self.opt_f64()?, self.opt_f64()?, self.opt_f64()?);
                let n = self.u64()? as usize;
                let mut bounds = Vec::with_capacity(n.min(4096));
                for _ in 0..n {
                    bounds.push(self.f64()?);
                }
                PointValue::Histogram {
                    count,
                    sum,
                    min,
                    max,
                    bounds,
                    counts: self.counts()?,
                }
            }
            2 => {
                let count = self.u64()?;
                let (sum, min, max) = (self.opt_f64()?, self.opt_f64()?, self.opt_f64()?);
                let scale = self.i32()?;
                let zero_count = self.u64()?;
                let zero_threshold = self.f64()?;
                let positive = ExpBuckets {
                    offset: self.i32()?,
                    counts: self.counts()?,
                };
                let negative = ExpBuckets {
                    offset: self.i32()?,
                    counts: self.counts()?,
                };
                PointValue::Exponential {
                    count,
                    sum,
                    min,
                    max,
                    scale,
                    zero_count,
                    zero_threshold,
                    positive,
                    negative,
                }
            }
            3 => {
                let count = self.u64()?;
                let sum = self.f64()?;
                let n = self.u64()? as usize;
                let mut quantiles = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    quantiles.push((self.f64()?, self.f64()?));
                }
                PointValue::Summary {
                    count,
                    sum,
                    quantiles,
                }
            }
            k => return Err(corrupt(format!("value kind {k}"))),
        })
    }

    pub fn exemplars(&mut self) -> Result<Vec<Exemplar>> {
        let n = self.u64()? as usize;
        let mut out = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            let time = UnixNanos(self.u64()?);
            let value = self.f64()?;
            let trace_id = match self.u8()? {
                0 => None,
                _ => Some(TraceId(self.array()?)),
            };
            let span_id = match self.u8()? {
                0 => None,
                _ => Some(SpanId(self.array()?)),
            };
            out.push(Exemplar {
                time,
                value,
                trace_id,
                span_id,
                filtered: self.labels()?,
            });
        }
        Ok(out)
    }

    fn labels(&mut self) -> Result<Vec<(String, String)>> {
        let n = self.u64()? as usize;
        let mut out = Vec::with_capacity(n.min(256));
        for _ in 0..n {
            out.push((self.string()?, self.string()?));
        }
        Ok(out)
    }

    pub fn series(&mut self) -> Result<Series> {
        let version = self.u8()?;
        if version != SERIES_VERSION {
            return Err(StorageError::UnsupportedVersion {
                what: "metric series",
                found: version,
                supported: SERIES_VERSION,
            });
        }
        let name = self.string()?;
        let kind = MetricKind::from_u8(self.u8()?).ok_or_else(|| corrupt("metric kind"))?;
        let temporality = Temporality::from_u8(self.u8()?).ok_or_else(|| corrupt("temporality"))?;
        let monotonic = self.u8()? != 0;
        Ok(Series {
            name,
            kind,
            temporality,
            monotonic,
            unit: self.string()?,
            labels: self.labels()?,
            description: self.string()?,
        })
    }
}

pub fn encode_points(points: &[MetricPoint]) -> Vec<u8> {
    let mut w = Writer::default();
    w.u64(points.len() as u64);
    points.iter().for_each(|p| w.point(p));
    w.buf
}

pub fn decode_points(buf: &[u8]) -> Result<Vec<MetricPoint>> {
    let mut r = Reader::new(buf);
    let n = r.u64()? as usize;
    let mut out = Vec::with_capacity(n.min(1 << 20));
    for _ in 0..n {
        out.push(r.point()?);
    }
    Ok(out)
}

pub fn encode_series(s: &Series) -> Vec<u8> {
    let mut w = Writer::default();
    w.series(s);
    w.buf
}

pub fn decode_series(buf: &[u8]) -> Result<Series> {
    Reader::new(buf).series()
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample_points() -> Vec<MetricPoint> {
        vec![
            MetricPoint {
                series: 3,
                time: UnixNanos(1_700_000_000_000_000_000),
                start_time: UnixNanos(1_699_999_000_000_000_000),
                value: PointValue::Number(97.5),
                flags: 0,
                exemplars: vec![Exemplar {
                    time: UnixNanos(1_700_000_000_000_000_000),
                    value: 0.25,
                    trace_id: Some(TraceId([7; 16])),
                    span_id: Some(SpanId([8; 8])),
                    filtered: vec![("tenant".into(), "a".into())],
                }],
            },
            MetricPoint {
                series: 4,
                time: UnixNanos(5),
                value: PointValue::Histogram {
                    count: 6,
                    sum: Some(1.5),
                    min: None,
                    max: Some(0.9),
                    bounds: vec![0.1, 0.5],
                    counts: vec![1, 2, 3],
                },
                ..Default::default()
            },
            MetricPoint {
                series: 5,
                time: UnixNanos(6),
                value: PointValue::Exponential {
                    count: 3,
                    sum: None,
                    min: None,
                    max: None,
                    scale: -2,
                    zero_count: 1,
                    zero_threshold: 0.0,
                    positive: ExpBuckets {
                        offset: -1,
                        counts: vec![1, 1],
                    },
                    negative: ExpBuckets::default(),
                },
                flags: 1,
                ..Default::default()
            },
            MetricPoint {
                series: 6,
                time: UnixNanos(7),
                value: PointValue::Summary {
                    count: 10,
                    sum: 4.0,
                    quantiles: vec![(0.5, 0.3), (0.99, 1.2)],
                },
                ..Default::default()
            },
        ]
    }

    #[test]
    fn points_round_trip_and_truncations_are_errors() {
        let points = sample_points();
        let bytes = encode_points(&points);
        assert_eq!(decode_points(&bytes).unwrap(), points);
        for n in 0..bytes.len() {
            assert!(decode_points(&bytes[..n]).is_err(), "prefix {n}");
        }
    }

    #[test]
    fn series_round_trips() {
        let s = Series {
            name: "gpu.memory.used".into(),
            kind: MetricKind::Sum,
            unit: "By".into(),
            temporality: Temporality::Cumulative,
            monotonic: true,
            labels: vec![
                ("gpu.id".into(), "0".into()),
                ("worker.id".into(), "w-7".into()),
            ],
            description: "bytes".into(),
        };
        assert_eq!(decode_series(&encode_series(&s)).unwrap(), s);
    }
}
