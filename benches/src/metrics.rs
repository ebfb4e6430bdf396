//! GPU and serving-engine metrics of an LLM fleet, deterministic by seed: per worker and GPU
//! every 10 s the DCGM exporter's gauges (utilisation, framebuffer used and free, temperature,
//! power, SM and memory clocks, tensor-pipe activity; labels `gpu`, `UUID`, `modelName`,
//! `Hostname`, `worker.id`), and per worker vLLM's engine metrics (`vllm:num_requests_running`,
//! `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`, and the counter
//! `vllm:generation_tokens`). Load follows a daily-ish wave per worker; the injected anomaly
//! puts one worker under memory pressure (framebuffer near 97%, KV cache near full, a growing
//! queue) for the second half of the run.
//!
//! The same points come out as OTLP requests ([`metric_batches`]) and as OpenMetrics text
//! ([`write_openmetrics`], for `promtool tsdb create-blocks-from openmetrics`).

use std::collections::BTreeMap;
use std::io::Write;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, metric, number_data_point,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Clone, Debug)]
pub struct MetricConfig {
    pub seed: u64,
    pub workers: usize,
    pub gpus_per_worker: usize,
    /// Seconds between samples.
    pub interval_s: u64,
    /// Samples per series.
    pub steps: usize,
    /// First sample, Unix seconds.
    pub start_s: u64,
    /// Points per OTLP request (whole steps of one worker).
    pub batch_points: usize,
}

impl Default for MetricConfig {
    fn default() -> Self {
        Self {
            seed: 42,
            workers: 16,
            gpus_per_worker: 8,
            interval_s: 10,
            steps: 360,
            start_s: 1_764_460_800,
            batch_points: 10_000,
        }
    }
}

/// The DCGM gauges, per GPU.
pub const GPU_GAUGES: &[&str] = &[
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
];
/// The engine gauges, per worker.
pub const ENGINE_GAUGES: &[&str] = &[
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
];
/// The engine counter, per worker.
pub const ENGINE_COUNTER: &str = "vllm:generation_tokens";
/// A GPU's framebuffer (MiB, an H100's 80 GB).
const FB_MIB: f64 = 81_559.0;

impl MetricConfig {
    pub fn series(&self) -> usize {
        self.workers * (self.gpus_per_worker * GPU_GAUGES.len() + ENGINE_GAUGES.len() + 1)
    }

    pub fn points(&self) -> usize {
        self.series() * self.steps
    }

    fn anomalous(&self, worker: usize, step: usize) -> bool {
        worker == 3 && step >= self.steps / 2
    }
}

/// One sample: (metric, labels in Prometheus spelling, value, time ms).
pub struct Sample {
    pub metric: &'static str,
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
    pub time_ms: u64,
}

/// Every sample of one worker at one step, in a fixed order.
fn worker_samples(
    cfg: &MetricConfig,
    worker: usize,
    step: usize,
    rng: &mut StdRng,
    tokens: &mut f64,
) -> Vec<Sample> {
    let t = (cfg.start_s + step as u64 * cfg.interval_s) * 1000 + rng.random_range(0..50);
    let phase = (step as f64 / cfg.steps as f64 * std::f64::consts::TAU + worker as f64).sin();
    let load = (0.6 + 0.3 * phase + rng.random_range(-0.05..0.05)).clamp(0.0, 1.0);
    let pressure = cfg.anomalous(worker, step);
    let host = format!("node-{worker:02}");
    let worker_id = format!("w-{worker}");
    let mut out = Vec::with_capacity(cfg.gpus_per_worker * GPU_GAUGES.len() + 4);
    for gpu in 0..cfg.gpus_per_worker {
        let labels = vec![
            ("gpu", gpu.to_string()),
            (
                "UUID",
                format!("GPU-{worker:04x}{gpu:04x}-5a3c-4e1b-9f7d-0c2e8a6b1d4f"),
            ),
            ("modelName", "NVIDIA H100 80GB HBM3".to_owned()),
            ("Hostname", host.clone()),
            ("worker_id", worker_id.clone()),
        ];
        let util = (load * 100.0 + rng.random_range(-3.0..3.0))
            .clamp(0.0, 100.0)
            .round();
        let used = if pressure {
            FB_MIB * rng.random_range(0.965..0.975)
        } else {
            FB_MIB * (0.55 + 0.25 * load)
        }
        .round();
        let values = [
            util,
            used,
            FB_MIB - used,
            (40.0 + 35.0 * load + rng.random_range(-1.0..1.0)).round(),
            ((120.0 + 560.0 * load + rng.random_range(-10.0..10.0)) * 1000.0).round() / 1000.0,
            if util > 5.0 { 1980.0 } else { 345.0 },
            2619.0,
            ((load * 0.7 + rng.random_range(-0.02..0.02)).clamp(0.0, 1.0) * 1e4).round() / 1e4,
        ];
        for (metric, value) in GPU_GAUGES.iter().zip(values) {
            out.push(Sample {
                metric,
                labels: labels.clone(),
                value,
                time_ms: t,
            });
        }
    }
    let engine = vec![
        ("model_name", "llama-3.1-8b".to_owned()),
        ("worker_id", worker_id),
    ];
    let running = (load * 48.0).round();
    let waiting = if pressure {
        (step - cfg.steps / 2) as f64 * 0.5
    } else {
        (load * 4.0).floor()
    };
    let kv = if pressure {
        0.99
    } else {
        (load * 0.8 * 1e4).round() / 1e4
    };
    *tokens += (running * cfg.interval_s as f64 * 40.0).round();
    for (metric, value) in ENGINE_GAUGES.iter().zip([running, waiting, kv]) {
        out.push(Sample {
            metric,
            labels: engine.clone(),
            value,
            time_ms: t,
        });
    }
    out.push(Sample {
        metric: ENGINE_COUNTER,
        labels: engine,
        value: *tokens,
        time_ms: t,
    });
    out
}

/// Every sample, by worker then step (a worker's samples are written in time order), in
/// groups of up to `steps` steps of one worker.
pub fn sample_groups(cfg: &MetricConfig, steps: usize) -> impl Iterator<Item = Vec<Sample>> + '_ {
    let steps = steps.max(1);
    (0..cfg.workers).flat_map(move |worker| {
        let mut rng = StdRng::seed_from_u64(cfg.seed ^ (worker as u64 * 0x9e37_79b9));
        let mut tokens = 0.0;
        (0..cfg.steps).step_by(steps).map(move |first| {
            (first..(first + steps).min(cfg.steps))
                .flat_map(|step| worker_samples(cfg, worker, step, &mut rng, &mut tokens))
                .collect()
        })
    })
}

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.to_owned())),
        }),
        ..Default::default()
    }
}

/// The samples as OTLP requests of about `batch_points` points each (whole steps of one
/// worker); labels named as OTLP has them (`worker.id`).
pub fn metric_batches(
    cfg: &MetricConfig,
) -> impl Iterator<Item = (ExportMetricsServiceRequest, usize)> + '_ {
    let per_step = cfg.series() / cfg.workers;
    let steps_per_batch = (cfg.batch_points / per_step).max(1);
    sample_groups(cfg, steps_per_batch).map(move |group| {
        let mut by_metric: Vec<(&'static str, Vec<NumberDataPoint>)> = Vec::new();
        let mut points = 0;
        for s in &group {
            let point = NumberDataPoint {
                attributes: s
                    .labels
                    .iter()
                    .map(|(k, v)| kv(if *k == "worker_id" { "worker.id" } else { k }, v))
                    .collect(),
                time_unix_nano: s.time_ms * 1_000_000,
                start_time_unix_nano: if s.metric == ENGINE_COUNTER {
                    cfg.start_s * 1_000_000_000
                } else {
                    0
                },
                value: Some(number_data_point::Value::AsDouble(s.value)),
                ..Default::default()
            };
            points += 1;
            match by_metric.iter_mut().find(|(m, _)| *m == s.metric) {
                Some((_, v)) => v.push(point),
                None => by_metric.push((s.metric, vec![point])),
            }
        }
        let metrics = by_metric
            .into_iter()
            .map(|(name, data_points)| Metric {
                name: name.to_owned(),
                data: Some(if name == ENGINE_COUNTER {
                    metric::Data::Sum(Sum {
                        data_points,
                        aggregation_temporality: 2,
                        is_monotonic: true,
                    })
                } else {
                    metric::Data::Gauge(Gauge { data_points })
                }),
                ..Default::default()
            })
            .collect();
        (
            ExportMetricsServiceRequest {
                resource_metrics: vec![ResourceMetrics {
                    scope_metrics: vec![ScopeMetrics {
                        metrics,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
            },
            points,
        )
    })
}

/// Each series' (labels text) samples (time ms, value).
type SeriesPoints = BTreeMap<String, Vec<(u64, f64)>>;

/// The samples as OpenMetrics text, one family after another, each series in time order.
pub fn write_openmetrics(cfg: &MetricConfig, out: &mut impl Write) -> std::io::Result<()> {
    write_exposition(cfg, out, true)
}

/// The samples as Prometheus's text exposition format (timestamps in milliseconds, no `# EOF`),
/// as VictoriaMetrics' `/api/v1/import/prometheus` takes them.
pub fn write_prometheus_text(cfg: &MetricConfig, out: &mut impl Write) -> std::io::Result<()> {
    write_exposition(cfg, out, false)
}

fn write_exposition(
    cfg: &MetricConfig,
    out: &mut impl Write,
    openmetrics: bool,
) -> std::io::Result<()> {
    // family -> series (labels text) -> samples
    let mut families: BTreeMap<&'static str, SeriesPoints> = Default::default();
    for group in sample_groups(cfg, 64) {
        for s in group {
            let mut labels: Vec<(&str, &str)> =
                s.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            labels.sort();
            let text = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{v}\""))
                .collect::<Vec<_>>()
                .join(",");
            families
                .entry(s.metric)
                .or_default()
                .entry(text)
                .or_default()
                .push((s.time_ms, s.value));
        }
    }
    for (metric, series) in families {
        let (family, sample_name) = if metric == ENGINE_COUNTER {
            (metric.to_owned(), format!("{metric}_total"))
        } else {
            (metric.to_owned(), metric.to_owned())
        };
        let kind = if metric == ENGINE_COUNTER {
            "counter"
        } else {
            "gauge"
        };
        writeln!(out, "# TYPE {family} {kind}")?;
        for (labels, points) in series {
            for (t, v) in points {
                if openmetrics {
                    writeln!(
                        out,
                        "{sample_name}{{{labels}}} {v} {}.{:03}",
                        t / 1000,
                        t % 1000
                    )?;
                } else {
                    writeln!(out, "{sample_name}{{{labels}}} {v} {t}")?;
                }
            }
        }
    }
    if openmetrics {
        writeln!(out, "# EOF")?;
    }
    Ok(())
}
