//! OTLP metrics: protobuf decoding and normalisation to series and points. Each data point is
//! checked on its own: an invalid one is rejected and counted, the valid points of the same
//! request are kept (OTLP's partial success).
//!
//! A point's series is its metric's name, type, unit and temporality with its labels: the
//! point's attributes over its resource's attributes (all but `telemetry.*`, `process.*` and
//! `os.*`, which describe the exporter rather than what is measured). Label values are text
//! (numbers and booleans printed, arrays and maps as JSON), as Prometheus has them.

use std::collections::HashMap;

use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Exemplar as OtlpExemplar, ExponentialHistogramDataPoint, Gauge,
    HistogramDataPoint, Metric, NumberDataPoint, Sum, SummaryDataPoint, exemplar, metric,
    number_data_point,
};
use weft_storage::model::{
    Exemplar, ExpBuckets, MetricKind, MetricPoint, PointValue, Series, Temporality, UnixNanos,
};

pub use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};

use super::convert::{Problem, SpanLimits, check_retention, check_sizes, span_id, trace_id, value};
use crate::error::IngestError;
use crate::pipeline::RejectReason;

/// Prometheus's stale marker: a point flagged "no recorded value" is stored as this NaN.
pub const STALE_NAN: u64 = 0x7ff0_0000_0000_0002;
/// OTLP `DataPointFlags.FLAG_NO_RECORDED_VALUE`.
const NO_RECORDED_VALUE: u32 = 1;
/// Exponential histogram scales OTLP allows.
const SCALES: std::ops::RangeInclusive<i32> = -10..=20;

/// Decodes an `ExportMetricsServiceRequest` from protobuf bytes.
pub fn decode_protobuf(bytes: &[u8]) -> Result<ExportMetricsServiceRequest, IngestError> {
    prost::Message::decode(bytes).map_err(|e| IngestError::Undecodable {
        format: "protobuf",
        detail: e.to_string(),
    })
}

/// The valid points of a request, each with the index of its series in `series` (each
/// distinct series once), and what happened to the others.
#[derive(Debug, Default)]
pub struct ConvertedMetrics {
    pub series: Vec<Series>,
    pub points: Vec<(usize, MetricPoint)>,
    pub rejected: Vec<(RejectReason, usize)>,
    pub first_error: Option<String>,
}

impl ConvertedMetrics {
    pub fn rejected_count(&self) -> usize {
        self.rejected.iter().map(|(_, n)| n).sum()
    }

    fn reject(&mut self, reason: RejectReason, n: usize, message: String) {
        match self.rejected.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, c)) => *c += n,
            None => self.rejected.push((reason, n)),
        }
        self.first_error.get_or_insert(message);
    }
}

/// Whether a resource attribute becomes a label of every series of the resource.
fn promoted(key: &str) -> bool {
    !["telemetry.", "process.", "os."]
        .iter()
        .any(|p| key.starts_with(p))
}

fn text(kv: KeyValue) -> Option<(String, String)> {
    let v = value(kv.value?).text()?;
    Some((kv.key, v))
}

/// Labels sorted by key, the later of two equal keys winning.
fn labels(base: &[(String, String)], attributes: Vec<KeyValue>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = base.to_vec();
    for (k, v) in attributes.into_iter().filter_map(text) {
        match out.binary_search_by(|(x, _)| x.as_str().cmp(&k)) {
            Ok(i) => out[i].1 = v,
            Err(i) => out.insert(i, (k, v)),
        }
    }
    out
}

struct Shape<'a> {
    name: &'a str,
    unit: &'a str,
    description: &'a str,
    kind: MetricKind,
    temporality: Temporality,
    monotonic: bool,
}

/// What every point of a request needs: the series seen so far.
#[derive(Default)]
struct Builder {
    out: ConvertedMetrics,
    index: HashMap<Vec<u8>, usize>,
    /// Series already seen in this request by (resource, metric, point attributes) as sent:
    /// the points of one series repeat its attributes, and finding them here skips building,
    /// sorting and encoding its labels again.
    seen: rustc_hash::FxHashMap<u64, Vec<(Vec<KeyValue>, usize)>>,
    /// The resource (index in the request) whose metrics are being read.
    resource: usize,
}

/// A hash of a point's series as sent (`None` for attribute values not worth hashing, which
/// take the full path).
fn sent_hash(resource: usize, shape: &Shape<'_>, attrs: &[KeyValue]) -> Option<u64> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    resource.hash(&mut h);
    shape.name.hash(&mut h);
    shape.unit.hash(&mut h);
    (shape.kind as u8, shape.temporality as u8, shape.monotonic).hash(&mut h);
    for kv in attrs {
        kv.key.hash(&mut h);
        match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(V::StringValue(s)) => s.hash(&mut h),
            Some(V::IntValue(i)) => i.hash(&mut h),
            Some(V::BoolValue(b)) => b.hash(&mut h),
            Some(V::DoubleValue(d)) => d.to_bits().hash(&mut h),
            None => 0u8.hash(&mut h),
            Some(_) => return None,
        }
    }
    Some(h.finish())
}

impl Builder {
    fn series(&mut self, shape: &Shape<'_>, labels: Vec<(String, String)>) -> usize {
        let series = Series {
            name: shape.name.to_owned(),
            kind: shape.kind,
            unit: shape.unit.to_owned(),
            temporality: shape.temporality,
            monotonic: shape.monotonic,
            labels,
            description: shape.description.to_owned(),
        };
        let identity = series.identity();
        if let Some(i) = self.index.get(&identity) {
            return *i;
        }
        let i = self.out.series.len();
        self.out.series.push(series);
        self.index.insert(identity, i);
        i
    }
}

/// The fields every OTLP data point type has (a summary point has no exemplars).
macro_rules! common {
    ($p:ident) => {
        common!($p, $p.exemplars)
    };
    ($p:ident, $exemplars:expr) => {
        Common {
            attributes: $p.attributes,
            start: $p.start_time_unix_nano,
            time: $p.time_unix_nano,
            flags: $p.flags,
            exemplars: $exemplars,
        }
    };
}

/// A point's common fields, checked.
struct Common {
    attributes: Vec<KeyValue>,
    start: u64,
    time: u64,
    flags: u32,
    exemplars: Vec<OtlpExemplar>,
}

fn check_common(c: &Common, limits: SpanLimits) -> Result<Vec<Exemplar>, Problem> {
    if c.time == 0 {
        return Err((
            RejectReason::InvalidPoint,
            "time_unix_nano is zero".to_owned(),
        ));
    }
    if c.start > c.time {
        return Err((
            RejectReason::EndBeforeStart,
            format!(
                "start_time_unix_nano {} is after time_unix_nano {}",
                c.start, c.time
            ),
        ));
    }
    check_retention(c.time, "time_unix_nano", limits)?;
    check_sizes(&c.attributes, "attribute", limits)?;
    c.exemplars
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let at = |p: Problem| (p.0, format!("exemplar {i}: {}", p.1));
            let trace = match e.trace_id.len() {
                0 => None,
                _ => Some(trace_id(&e.trace_id, "trace_id").map_err(at)?),
            };
            let span = match e.span_id.len() {
                0 => None,
                _ => Some(span_id(&e.span_id, "span_id").map_err(at)?),
            };
            Ok(Exemplar {
                time: UnixNanos(e.time_unix_nano),
                value: match e.value {
                    Some(exemplar::Value::AsDouble(d)) => d,
                    Some(exemplar::Value::AsInt(i)) => i as f64,
                    None => f64::NAN,
                },
                trace_id: trace,
                span_id: span,
                filtered: e
                    .filtered_attributes
                    .iter()
                    .cloned()
                    .filter_map(text)
                    .collect(),
            })
        })
        .collect()
}

fn number(p: &NumberDataPoint) -> Result<PointValue, Problem> {
    if p.flags & NO_RECORDED_VALUE != 0 {
        return Ok(PointValue::Number(f64::from_bits(STALE_NAN)));
    }
    match p.value {
        Some(number_data_point::Value::AsDouble(d)) => Ok(PointValue::Number(d)),
        Some(number_data_point::Value::AsInt(i)) => Ok(PointValue::Number(i as f64)),
        None => Err((
            RejectReason::InvalidPoint,
            "no value (as_double or as_int)".to_owned(),
        )),
    }
}

fn not_nan(v: Option<f64>, field: &str) -> Result<(), Problem> {
    match v {
        Some(x) if x.is_nan() => Err((RejectReason::InvalidPoint, format!("{field} is NaN"))),
        _ => Ok(()),
    }
}

fn histogram(p: &HistogramDataPoint) -> Result<PointValue, Problem> {
    let invalid = |m: String| Err((RejectReason::InvalidPoint, m));
    not_nan(p.sum, "sum")?;
    if p.explicit_bounds.iter().any(|b| b.is_nan()) {
        return invalid("explicit_bounds holds NaN".to_owned());
    }
    if p.explicit_bounds.windows(2).any(|w| w[0] >= w[1]) {
        return invalid("explicit_bounds are not strictly increasing".to_owned());
    }
    if !p.bucket_counts.is_empty() {
        if p.bucket_counts.len() != p.explicit_bounds.len() + 1 {
            return invalid(format!(
                "{} bucket_counts for {} explicit_bounds (there must be one more count than bounds)",
                p.bucket_counts.len(),
                p.explicit_bounds.len()
            ));
        }
        let total: u64 = p.bucket_counts.iter().fold(0, |a, c| a.saturating_add(*c));
        if total != p.count {
            return invalid(format!(
                "bucket_counts add up to {total}, not to count {}",
                p.count
            ));
        }
    }
    Ok(PointValue::Histogram {
        count: p.count,
        sum: p.sum,
        min: p.min,
        max: p.max,
        bounds: p.explicit_bounds.clone(),
        counts: p.bucket_counts.clone(),
    })
}

fn exponential(p: &ExponentialHistogramDataPoint) -> Result<PointValue, Problem> {
    let invalid = |m: String| Err((RejectReason::InvalidPoint, m));
    not_nan(p.sum, "sum")?;
    if !SCALES.contains(&p.scale) {
        return invalid(format!("scale {} is outside -10 to 20", p.scale));
    }
    if p.zero_threshold.is_nan() || p.zero_threshold < 0.0 {
        return invalid(format!(
            "zero_threshold {} is not a non-negative number",
            p.zero_threshold
        ));
    }
    let side = |b: &Option<
        opentelemetry_proto::tonic::metrics::v1::exponential_histogram_data_point::Buckets,
    >| {
        b.as_ref().map_or_else(ExpBuckets::default, |b| ExpBuckets {
            offset: b.offset,
            counts: b.bucket_counts.clone(),
        })
    };
    let (positive, negative) = (side(&p.positive), side(&p.negative));
    let total = positive
        .counts
        .iter()
        .chain(&negative.counts)
        .fold(p.zero_count, |a, c| a.saturating_add(*c));
    if total != p.count {
        return invalid(format!(
            "zero_count and bucket counts add up to {total}, not to count {}",
            p.count
        ));
    }
    Ok(PointValue::Exponential {
        count: p.count,
        sum: p.sum,
        min: p.min,
        max: p.max,
        scale: p.scale,
        zero_count: p.zero_count,
        zero_threshold: p.zero_threshold,
        positive,
        negative,
    })
}

fn summary(p: &SummaryDataPoint) -> Result<PointValue, Problem> {
    not_nan(Some(p.sum), "sum")?;
    let mut quantiles = Vec::with_capacity(p.quantile_values.len());
    for q in &p.quantile_values {
        if !(0.0..=1.0).contains(&q.quantile) {
            return Err((
                RejectReason::InvalidPoint,
                format!("quantile {} is outside 0 to 1", q.quantile),
            ));
        }
        quantiles.push((q.quantile, q.value));
    }
    quantiles.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(PointValue::Summary {
        count: p.count,
        sum: p.sum,
        quantiles,
    })
}

fn temporality(t: i32) -> Result<Temporality, Problem> {
    match AggregationTemporality::try_from(t) {
        Ok(AggregationTemporality::Delta) => Ok(Temporality::Delta),
        Ok(AggregationTemporality::Cumulative) => Ok(Temporality::Cumulative),
        _ => Err((
            RejectReason::InvalidEnum,
            format!("aggregation_temporality {t} is not DELTA (1) or CUMULATIVE (2)"),
        )),
    }
}

/// The valid points of a request with their series.
pub fn convert_request(req: ExportMetricsServiceRequest, limits: SpanLimits) -> ConvertedMetrics {
    let mut b = Builder::default();
    for (ri, rm) in req.resource_metrics.into_iter().enumerate() {
        let resource = rm.resource.map(|r| r.attributes).unwrap_or_default();
        let base = labels(
            &[],
            resource
                .into_iter()
                .filter(|kv| promoted(&kv.key))
                .collect(),
        );
        for (si, sm) in rm.scope_metrics.into_iter().enumerate() {
            for (mi, m) in sm.metrics.into_iter().enumerate() {
                let place = format!("metric {mi} ({:?}) of scope {si} of resource {ri}", m.name);
                b.resource = ri;
                metric_points(&mut b, &base, m, limits, &place);
            }
        }
    }
    b.out
}

fn metric_points(
    b: &mut Builder,
    base: &[(String, String)],
    m: Metric,
    limits: SpanLimits,
    place: &str,
) {
    let count = match &m.data {
        None => 1,
        Some(metric::Data::Gauge(g)) => g.data_points.len(),
        Some(metric::Data::Sum(s)) => s.data_points.len(),
        Some(metric::Data::Histogram(h)) => h.data_points.len(),
        Some(metric::Data::ExponentialHistogram(h)) => h.data_points.len(),
        Some(metric::Data::Summary(s)) => s.data_points.len(),
    };
    if m.name.is_empty() {
        b.out.reject(
            RejectReason::InvalidPoint,
            count,
            format!("{place}: the metric has no name"),
        );
        return;
    }
    let (kind, temporality, monotonic) = match &m.data {
        None => {
            b.out.reject(
                RejectReason::InvalidPoint,
                1,
                format!("{place}: the metric has no data (gauge, sum, histogram, exponential_histogram or summary)"),
            );
            return;
        }
        Some(metric::Data::Gauge(_)) => (MetricKind::Gauge, Ok(Temporality::Unspecified), false),
        Some(metric::Data::Sum(s)) => (
            MetricKind::Sum,
            temporality(s.aggregation_temporality),
            s.is_monotonic,
        ),
        Some(metric::Data::Histogram(h)) => (
            MetricKind::Histogram,
            temporality(h.aggregation_temporality),
            false,
        ),
        Some(metric::Data::ExponentialHistogram(h)) => (
            MetricKind::ExponentialHistogram,
            temporality(h.aggregation_temporality),
            false,
        ),
        Some(metric::Data::Summary(_)) => {
            (MetricKind::Summary, Ok(Temporality::Unspecified), false)
        }
    };
    let temporality = match temporality {
        Ok(t) => t,
        Err((reason, problem)) => {
            b.out.reject(reason, count, format!("{place}: {problem}"));
            return;
        }
    };
    let shape = Shape {
        name: &m.name,
        unit: &m.unit,
        description: &m.description,
        kind,
        temporality,
        monotonic,
    };
    let push = |b: &mut Builder, i: usize, common: Common, value: Result<PointValue, Problem>| {
        let checked = value.and_then(|v| check_common(&common, limits).map(|e| (v, e)));
        match checked {
            Ok((value, exemplars)) => {
                let key = sent_hash(b.resource, &shape, &common.attributes);
                let known = key.and_then(|k| {
                    b.seen.get(&k).and_then(|same| {
                        same.iter()
                            .find(|(attrs, _)| *attrs == common.attributes)
                            .map(|(_, i)| *i)
                    })
                });
                let series = match known {
                    Some(i) => i,
                    None => {
                        let attrs = key.map(|_| common.attributes.clone());
                        let i = b.series(&shape, labels(base, common.attributes));
                        if let (Some(k), Some(attrs)) = (key, attrs) {
                            b.seen.entry(k).or_default().push((attrs, i));
                        }
                        i
                    }
                };
                b.out.points.push((
                    series,
                    MetricPoint {
                        series: 0,
                        time: UnixNanos(common.time),
                        start_time: UnixNanos(common.start),
                        value,
                        flags: common.flags,
                        exemplars,
                    },
                ));
            }
            Err((reason, problem)) => {
                b.out
                    .reject(reason, 1, format!("point {i} of {place}: {problem}"))
            }
        }
    };
    match m.data {
        Some(metric::Data::Gauge(Gauge { data_points }))
        | Some(metric::Data::Sum(Sum { data_points, .. })) => {
            for (i, p) in data_points.into_iter().enumerate() {
                let v = number(&p);
                push(b, i, common!(p), v);
            }
        }
        Some(metric::Data::Histogram(h)) => {
            for (i, p) in h.data_points.into_iter().enumerate() {
                let v = histogram(&p);
                push(b, i, common!(p), v);
            }
        }
        Some(metric::Data::ExponentialHistogram(h)) => {
            for (i, p) in h.data_points.into_iter().enumerate() {
                let v = exponential(&p);
                push(b, i, common!(p), v);
            }
        }
        Some(metric::Data::Summary(s)) => {
            for (i, p) in s.data_points.into_iter().enumerate() {
                let v = summary(&p);
                push(b, i, common!(p, Vec::new()), v);
            }
        }
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
    use opentelemetry_proto::tonic::metrics::v1::{
        Gauge, Histogram, ResourceMetrics, ScopeMetrics, Sum,
    };
    use opentelemetry_proto::tonic::resource::v1::Resource;

    fn kv(k: &str, v: &str) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(v.into())),
            }),
            ..Default::default()
        }
    }

    fn request(metrics: Vec<Metric>) -> ExportMetricsServiceRequest {
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(Resource {
                    attributes: vec![
                        kv("service.name", "vllm"),
                        kv("telemetry.sdk.version", "1.2"),
                        kv("worker.id", "w-1"),
                    ],
                    ..Default::default()
                }),
                scope_metrics: vec![ScopeMetrics {
                    metrics,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    const LIMITS: SpanLimits = SpanLimits {
        max_attribute_value_bytes: 1024,
        retention: None,
        shape: crate::otlp::convert::ShapeLimits::NONE,
    };

    fn gauge_point(time: u64, value: f64, attrs: Vec<KeyValue>) -> NumberDataPoint {
        NumberDataPoint {
            attributes: attrs,
            time_unix_nano: time,
            value: Some(number_data_point::Value::AsDouble(value)),
            ..Default::default()
        }
    }

    #[test]
    fn points_share_series_and_labels_merge_resource_and_point() {
        let out = convert_request(
            request(vec![Metric {
                name: "gpu.utilization".into(),
                unit: "1".into(),
                data: Some(metric::Data::Gauge(Gauge {
                    data_points: vec![
                        gauge_point(5, 0.5, vec![kv("gpu.id", "0")]),
                        gauge_point(6, 0.6, vec![kv("gpu.id", "0")]),
                        gauge_point(5, 0.7, vec![kv("gpu.id", "1"), kv("worker.id", "w-2")]),
                    ],
                })),
                ..Default::default()
            }]),
            LIMITS,
        );
        assert_eq!(out.rejected_count(), 0, "{:?}", out.first_error);
        assert_eq!(out.series.len(), 2);
        assert_eq!(
            out.series[0].labels,
            vec![
                ("gpu.id".to_owned(), "0".to_owned()),
                ("service.name".to_owned(), "vllm".to_owned()),
                ("worker.id".to_owned(), "w-1".to_owned()),
            ]
        );
        // the point's attribute wins over the resource's
        assert_eq!(out.series[1].label("worker.id"), Some("w-2"));
        let idx: Vec<usize> = out.points.iter().map(|(s, _)| *s).collect();
        assert_eq!(idx, vec![0, 0, 1]);
    }

    #[test]
    fn invalid_points_are_rejected_alone_with_their_reason() {
        let bad_hist = HistogramDataPoint {
            time_unix_nano: 5,
            count: 3,
            bucket_counts: vec![1, 2],
            explicit_bounds: vec![0.1, 1.0],
            ..Default::default()
        };
        let good_hist = HistogramDataPoint {
            time_unix_nano: 5,
            count: 3,
            bucket_counts: vec![1, 2, 0],
            explicit_bounds: vec![0.1, 1.0],
            ..Default::default()
        };
        let nan_hist = HistogramDataPoint {
            time_unix_nano: 5,
            sum: Some(f64::NAN),
            ..Default::default()
        };
        let out = convert_request(
            request(vec![
                Metric {
                    name: "ttft".into(),
                    data: Some(metric::Data::Histogram(Histogram {
                        data_points: vec![bad_hist, good_hist, nan_hist],
                        aggregation_temporality: 2,
                    })),
                    ..Default::default()
                },
                Metric {
                    name: "requests".into(),
                    data: Some(metric::Data::Sum(Sum {
                        data_points: vec![gauge_point(5, 1.0, vec![]), gauge_point(6, 2.0, vec![])],
                        aggregation_temporality: 0,
                        is_monotonic: true,
                    })),
                    ..Default::default()
                },
                Metric {
                    name: "no_value".into(),
                    data: Some(metric::Data::Gauge(Gauge {
                        data_points: vec![NumberDataPoint {
                            time_unix_nano: 5,
                            ..Default::default()
                        }],
                    })),
                    ..Default::default()
                },
            ]),
            LIMITS,
        );
        assert_eq!(out.points.len(), 1);
        assert_eq!(out.rejected_count(), 5);
        assert!(out.rejected.contains(&(RejectReason::InvalidEnum, 2)));
        let msg = out.first_error.unwrap();
        assert!(
            msg.contains("point 0 of metric 0 (\"ttft\")")
                && msg.contains("2 bucket_counts for 2 explicit_bounds"),
            "{msg}"
        );
    }

    #[test]
    fn a_point_with_no_recorded_value_is_a_stale_marker() {
        let out = convert_request(
            request(vec![Metric {
                name: "gpu.utilization".into(),
                data: Some(metric::Data::Gauge(Gauge {
                    data_points: vec![NumberDataPoint {
                        time_unix_nano: 5,
                        flags: 1,
                        ..Default::default()
                    }],
                })),
                ..Default::default()
            }]),
            LIMITS,
        );
        let PointValue::Number(v) = out.points[0].1.value else {
            panic!()
        };
        assert_eq!(v.to_bits(), STALE_NAN);
    }
}
