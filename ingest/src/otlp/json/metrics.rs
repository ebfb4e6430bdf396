//! OTLP/JSON of metrics: `ExportMetricsServiceRequest` decoded with errors naming the exact
//! path. A metric's data is whichever of `gauge`, `sum`, `histogram`, `exponentialHistogram`,
//! `summary` it has; a point's value `asDouble` or `asInt`.

use opentelemetry_proto::tonic::metrics::v1::{
    Exemplar, ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram,
    HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, Summary,
    SummaryDataPoint, exemplar, exponential_histogram_data_point, metric, number_data_point,
    summary_data_point,
};
use serde_json::Value as J;

use super::*;
use crate::otlp::metrics::ExportMetricsServiceRequest;

const TEMPORALITIES: &[&str] = &[
    "AGGREGATION_TEMPORALITY_UNSPECIFIED",
    "AGGREGATION_TEMPORALITY_DELTA",
    "AGGREGATION_TEMPORALITY_CUMULATIVE",
];

impl Obj<'_, '_> {
    fn f64(&self, camel: &'static str, snake: &'static str) -> R<Option<f64>> {
        match self.get(camel, snake) {
            None => Ok(None),
            Some((v, name)) => double(v, &Path::Field(self.path, name)).map(Some),
        }
    }

    fn i32(&self, camel: &'static str, snake: &'static str) -> R<i32> {
        match self.get(camel, snake) {
            None => Ok(0),
            Some((v, name)) => {
                let path = Path::Field(self.path, name);
                let n = int(v, &path)?;
                i32::try_from(n)
                    .or_else(|_| err(&path, format_args!("{n} does not fit in 32 bits")))
            }
        }
    }

    fn bool(&self, camel: &'static str, snake: &'static str) -> R<bool> {
        match self.get(camel, snake) {
            None => Ok(false),
            Some((J::Bool(b), _)) => Ok(*b),
            Some((other, name)) => err(
                &Path::Field(self.path, name),
                format_args!("expected a boolean, got {}", kind_of(other)),
            ),
        }
    }

    /// `asDouble` / `asInt`, whichever is present.
    fn number(&self) -> R<Option<(bool, f64, i64)>> {
        if let Some(v) = self.f64("asDouble", "as_double")? {
            return Ok(Some((true, v, 0)));
        }
        match self.get("asInt", "as_int") {
            None => Ok(None),
            Some((v, name)) => Ok(Some((false, 0.0, int(v, &Path::Field(self.path, name))?))),
        }
    }
}

fn exemplar(v: &J, path: &Path<'_>) -> R<Exemplar> {
    let o = Obj::new(v, path)?;
    Ok(Exemplar {
        filtered_attributes: o.array("filteredAttributes", "filtered_attributes", key_value)?,
        time_unix_nano: o.u64("timeUnixNano", "time_unix_nano")?,
        span_id: o.hex("spanId", "span_id")?,
        trace_id: o.hex("traceId", "trace_id")?,
        value: o.number()?.map(|(double, d, i)| match double {
            true => exemplar::Value::AsDouble(d),
            false => exemplar::Value::AsInt(i),
        }),
    })
}

fn number_point(v: &J, path: &Path<'_>) -> R<NumberDataPoint> {
    let o = Obj::new(v, path)?;
    Ok(NumberDataPoint {
        attributes: attrs(&o)?,
        start_time_unix_nano: o.u64("startTimeUnixNano", "start_time_unix_nano")?,
        time_unix_nano: o.u64("timeUnixNano", "time_unix_nano")?,
        exemplars: o.array("exemplars", "exemplars", exemplar)?,
        flags: o.u32("flags", "flags")?,
        value: o.number()?.map(|(double, d, i)| match double {
            true => number_data_point::Value::AsDouble(d),
            false => number_data_point::Value::AsInt(i),
        }),
    })
}

fn histogram_point(v: &J, path: &Path<'_>) -> R<HistogramDataPoint> {
    let o = Obj::new(v, path)?;
    Ok(HistogramDataPoint {
        attributes: attrs(&o)?,
        start_time_unix_nano: o.u64("startTimeUnixNano", "start_time_unix_nano")?,
        time_unix_nano: o.u64("timeUnixNano", "time_unix_nano")?,
        count: o.u64("count", "count")?,
        sum: o.f64("sum", "sum")?,
        bucket_counts: o.array("bucketCounts", "bucket_counts", uint)?,
        explicit_bounds: o.array("explicitBounds", "explicit_bounds", double)?,
        exemplars: o.array("exemplars", "exemplars", exemplar)?,
        flags: o.u32("flags", "flags")?,
        min: o.f64("min", "min")?,
        max: o.f64("max", "max")?,
    })
}

fn buckets(v: &J, path: &Path<'_>) -> R<exponential_histogram_data_point::Buckets> {
    let o = Obj::new(v, path)?;
    Ok(exponential_histogram_data_point::Buckets {
        offset: o.i32("offset", "offset")?,
        bucket_counts: o.array("bucketCounts", "bucket_counts", uint)?,
    })
}

fn exponential_point(v: &J, path: &Path<'_>) -> R<ExponentialHistogramDataPoint> {
    let o = Obj::new(v, path)?;
    Ok(ExponentialHistogramDataPoint {
        attributes: attrs(&o)?,
        start_time_unix_nano: o.u64("startTimeUnixNano", "start_time_unix_nano")?,
        time_unix_nano: o.u64("timeUnixNano", "time_unix_nano")?,
        count: o.u64("count", "count")?,
        sum: o.f64("sum", "sum")?,
        scale: o.i32("scale", "scale")?,
        zero_count: o.u64("zeroCount", "zero_count")?,
        positive: o.object("positive", "positive", buckets)?,
        negative: o.object("negative", "negative", buckets)?,
        flags: o.u32("flags", "flags")?,
        exemplars: o.array("exemplars", "exemplars", exemplar)?,
        min: o.f64("min", "min")?,
        max: o.f64("max", "max")?,
        zero_threshold: o.f64("zeroThreshold", "zero_threshold")?.unwrap_or(0.0),
    })
}

fn quantile(v: &J, path: &Path<'_>) -> R<summary_data_point::ValueAtQuantile> {
    let o = Obj::new(v, path)?;
    Ok(summary_data_point::ValueAtQuantile {
        quantile: o.f64("quantile", "quantile")?.unwrap_or(0.0),
        value: o.f64("value", "value")?.unwrap_or(0.0),
    })
}

fn summary_point(v: &J, path: &Path<'_>) -> R<SummaryDataPoint> {
    let o = Obj::new(v, path)?;
    Ok(SummaryDataPoint {
        attributes: attrs(&o)?,
        start_time_unix_nano: o.u64("startTimeUnixNano", "start_time_unix_nano")?,
        time_unix_nano: o.u64("timeUnixNano", "time_unix_nano")?,
        count: o.u64("count", "count")?,
        sum: o.f64("sum", "sum")?.unwrap_or(0.0),
        quantile_values: o.array("quantileValues", "quantile_values", quantile)?,
        flags: o.u32("flags", "flags")?,
    })
}

fn decode_metric(v: &J, path: &Path<'_>) -> R<Metric> {
    let o = Obj::new(v, path)?;
    let temporality =
        |v: &J, p: &Path<'_>| Obj::new(v, p)?.enumeration("aggregationTemporality", TEMPORALITIES);
    let data = if let Some(g) = o.object("gauge", "gauge", |v, p| {
        Obj::new(v, p)?.array("dataPoints", "data_points", number_point)
    })? {
        Some(metric::Data::Gauge(Gauge { data_points: g }))
    } else if let Some(s) = o.object("sum", "sum", |v, p| {
        let s = Obj::new(v, p)?;
        Ok(Sum {
            data_points: s.array("dataPoints", "data_points", number_point)?,
            aggregation_temporality: temporality(v, p)?,
            is_monotonic: s.bool("isMonotonic", "is_monotonic")?,
        })
    })? {
        Some(metric::Data::Sum(s))
    } else if let Some(h) = o.object("histogram", "histogram", |v, p| {
        Ok(Histogram {
            data_points: Obj::new(v, p)?.array("dataPoints", "data_points", histogram_point)?,
            aggregation_temporality: temporality(v, p)?,
        })
    })? {
        Some(metric::Data::Histogram(h))
    } else if let Some(h) = o.object("exponentialHistogram", "exponential_histogram", |v, p| {
        Ok(ExponentialHistogram {
            data_points: Obj::new(v, p)?.array("dataPoints", "data_points", exponential_point)?,
            aggregation_temporality: temporality(v, p)?,
        })
    })? {
        Some(metric::Data::ExponentialHistogram(h))
    } else {
        o.object("summary", "summary", |v, p| {
            Ok(Summary {
                data_points: Obj::new(v, p)?.array("dataPoints", "data_points", summary_point)?,
            })
        })?
        .map(metric::Data::Summary)
    };
    Ok(Metric {
        name: o.string("name", "name")?,
        description: o.string("description", "description")?,
        unit: o.string("unit", "unit")?,
        metadata: o.array("metadata", "metadata", key_value)?,
        data,
    })
}

fn decode_scope_metrics(v: &J, path: &Path<'_>) -> R<ScopeMetrics> {
    let o = Obj::new(v, path)?;
    Ok(ScopeMetrics {
        scope: o.object("scope", "scope", decode_scope)?,
        metrics: o.array("metrics", "metrics", decode_metric)?,
        schema_url: o.string("schemaUrl", "schema_url")?,
    })
}

fn decode_resource_metrics(v: &J, path: &Path<'_>) -> R<ResourceMetrics> {
    let o = Obj::new(v, path)?;
    Ok(ResourceMetrics {
        resource: o.object("resource", "resource", decode_resource)?,
        scope_metrics: o.array("scopeMetrics", "scope_metrics", decode_scope_metrics)?,
        schema_url: o.string("schemaUrl", "schema_url")?,
    })
}

/// Decodes an OTLP/JSON `ExportMetricsServiceRequest`.
pub fn decode_metrics_request(bytes: &[u8]) -> Result<ExportMetricsServiceRequest, IngestError> {
    let resource_metrics = top_array(
        bytes,
        "resourceMetrics",
        "resource_metrics",
        decode_resource_metrics,
    )?;
    Ok(ExportMetricsServiceRequest { resource_metrics })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_type_decodes() {
        let doc = br#"{"resourceMetrics":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"vllm"}}]},
          "scopeMetrics":[{"scope":{"name":"s"},"metrics":[
            {"name":"gpu.utilization","unit":"1","gauge":{"dataPoints":[{"timeUnixNano":"5","asDouble":0.5,
               "attributes":[{"key":"gpu.id","value":{"stringValue":"0"}}]}]}},
            {"name":"requests","sum":{"aggregationTemporality":"AGGREGATION_TEMPORALITY_CUMULATIVE","isMonotonic":true,
               "dataPoints":[{"timeUnixNano":6,"asInt":"42","exemplars":[{"traceId":"0102030405060708090a0b0c0d0e0f10","asDouble":1.5}]}]}},
            {"name":"ttft","histogram":{"aggregationTemporality":2,"dataPoints":[{"timeUnixNano":"7","count":"3","sum":0.9,
               "bucketCounts":["1","2","0"],"explicitBounds":[0.1,1]}]}},
            {"name":"itl","exponentialHistogram":{"aggregationTemporality":1,"dataPoints":[{"timeUnixNano":"8","count":"2","scale":-1,
               "zeroCount":"1","positive":{"offset":-2,"bucketCounts":["1"]}}]}},
            {"name":"latency","summary":{"dataPoints":[{"timeUnixNano":"9","count":"4","sum":"NaN",
               "quantileValues":[{"quantile":0.5,"value":0.2}]}]}}]}]}]}"#;
        let req = decode_metrics_request(doc).unwrap();
        let m = &req.resource_metrics[0].scope_metrics[0].metrics;
        assert_eq!(m.len(), 5);
        let Some(metric::Data::Sum(s)) = &m[1].data else {
            panic!("{:?}", m[1].data)
        };
        assert_eq!((s.aggregation_temporality, s.is_monotonic), (2, true));
        assert_eq!(
            s.data_points[0].value,
            Some(number_data_point::Value::AsInt(42))
        );
        assert_eq!(s.data_points[0].exemplars[0].trace_id.len(), 16);
        let Some(metric::Data::ExponentialHistogram(e)) = &m[3].data else {
            panic!()
        };
        assert_eq!(e.data_points[0].scale, -1);
        assert_eq!(e.data_points[0].positive.as_ref().unwrap().offset, -2);
        let Some(metric::Data::Summary(s)) = &m[4].data else {
            panic!()
        };
        assert!(s.data_points[0].sum.is_nan());
    }

    #[test]
    fn a_bad_field_is_named_with_its_path() {
        let doc = br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"x","gauge":{"dataPoints":[{"asDouble":"lots"}]}}]}]}]}"#;
        let e = decode_metrics_request(doc).unwrap_err().to_string();
        assert!(
            e.contains(
                "resourceMetrics[0].scopeMetrics[0].metrics[0].gauge.dataPoints[0].asDouble"
            ),
            "{e}"
        );
    }
}
