//! The GPU collector: samples each GPU of the host through a [`Gpus`] source (NVML, loaded at
//! run time, in [`nvml`]; a recorded fake GPU in tests) and turns the samples into OTLP metric
//! points and XID events into OTLP log records, labelled with the GPU's index (`gpu.id`),
//! UUID, name and the host, so that they join spans by `gpu.id` / `host.name`.
//!
//! Metric names are NVML's (`nvml.*`, units as NVML gives them); the canonical vocabulary
//! (`gpu.utilization`, `gpu.memory.used`, …) answers with them in PromQL.

pub mod nvml;

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

/// What one sample of one GPU read; a field NVML does not support on this GPU is `None`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuSample {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// Percent of time a kernel ran / device memory was read or written.
    pub sm_utilization: Option<f64>,
    pub memory_utilization: Option<f64>,
    /// Bytes.
    pub memory_used: Option<u64>,
    pub memory_free: Option<u64>,
    pub memory_total: Option<u64>,
    /// Degrees Celsius.
    pub temperature: Option<f64>,
    /// Milliwatts.
    pub power_usage: Option<f64>,
    pub power_limit: Option<f64>,
    /// MHz.
    pub sm_clock: Option<f64>,
    pub memory_clock: Option<f64>,
    /// KB/s over the last 20 ms NVML samples.
    pub pcie_tx: Option<f64>,
    pub pcie_rx: Option<f64>,
    /// Volatile ECC error counts.
    pub ecc_corrected: Option<u64>,
    pub ecc_uncorrected: Option<u64>,
    /// NVML's clock throttle reason bits.
    pub throttle_reasons: Option<u64>,
    /// (pid, process name, bytes of GPU memory).
    pub processes: Vec<(u32, String, u64)>,
}

/// A critical XID error reported by the driver.
#[derive(Clone, Debug, PartialEq)]
pub struct XidEvent {
    pub index: u32,
    pub uuid: String,
    pub xid: u64,
    /// Unix nanoseconds.
    pub time: u64,
}

/// Why the collector cannot run.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no NVIDIA driver or NVML library on this host ({0}); the GPU collector is off")]
    Unavailable(String),
    #[error("NVML: {0}")]
    Nvml(String),
}

/// Where samples come from.
pub trait Gpus: Send {
    /// One sample of every GPU.
    fn sample(&mut self) -> Result<Vec<GpuSample>, GpuError>;
    /// XID events since the last call.
    fn events(&mut self) -> Vec<XidEvent>;
}

/// A recorded GPU: replays its samples in turn (the last one repeats), then its events once.
pub struct RecordedGpus {
    samples: Vec<Vec<GpuSample>>,
    next: usize,
    events: Vec<XidEvent>,
}

impl RecordedGpus {
    pub fn new(samples: Vec<Vec<GpuSample>>, events: Vec<XidEvent>) -> Self {
        Self {
            samples,
            next: 0,
            events,
        }
    }
}

impl Gpus for RecordedGpus {
    fn sample(&mut self) -> Result<Vec<GpuSample>, GpuError> {
        let i = self.next.min(self.samples.len().saturating_sub(1));
        self.next += 1;
        Ok(self.samples.get(i).cloned().unwrap_or_default())
    }
    fn events(&mut self) -> Vec<XidEvent> {
        std::mem::take(&mut self.events)
    }
}

fn text(k: &str, v: impl Into<String>) -> KeyValue {
    KeyValue {
        key: k.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

fn resource(host: &str) -> Resource {
    Resource {
        attributes: vec![
            text("service.name", "weft-gpu-agent"),
            text("host.name", host),
        ],
        ..Default::default()
    }
}

fn gpu_labels(index: u32, uuid: &str, name: &str) -> Vec<KeyValue> {
    vec![
        text("gpu.id", index.to_string()),
        text("gpu.uuid", uuid),
        text("gpu.model", name),
    ]
}

/// The samples as one OTLP metrics request, every point at `time` (Unix ns).
pub fn metrics_request(
    samples: &[GpuSample],
    host: &str,
    time: u64,
) -> ExportMetricsServiceRequest {
    // (name, unit, monotonic counter?) -> points
    let mut metrics: Vec<(&'static str, &'static str, bool, Vec<NumberDataPoint>)> = Vec::new();
    let mut push =
        |name: &'static str, unit: &'static str, counter: bool, attrs: Vec<KeyValue>, v: f64| {
            let point = NumberDataPoint {
                attributes: attrs,
                time_unix_nano: time,
                value: Some(number_data_point::Value::AsDouble(v)),
                ..Default::default()
            };
            match metrics.iter_mut().find(|m| m.0 == name) {
                Some(m) => m.3.push(point),
                None => metrics.push((name, unit, counter, vec![point])),
            }
        };
    for s in samples {
        let labels = gpu_labels(s.index, &s.uuid, &s.name);
        let gauges: [(&'static str, &'static str, Option<f64>); 13] = [
            ("nvml.gpu.utilization", "%", s.sm_utilization),
            ("nvml.memory.utilization", "%", s.memory_utilization),
            ("nvml.memory.used", "By", s.memory_used.map(|v| v as f64)),
            ("nvml.memory.free", "By", s.memory_free.map(|v| v as f64)),
            ("nvml.memory.total", "By", s.memory_total.map(|v| v as f64)),
            ("nvml.temperature", "Cel", s.temperature),
            ("nvml.power.usage", "mW", s.power_usage),
            ("nvml.power.limit", "mW", s.power_limit),
            ("nvml.clock.sm", "MHz", s.sm_clock),
            ("nvml.clock.memory", "MHz", s.memory_clock),
            ("nvml.pcie.tx", "KiBy/s", s.pcie_tx),
            ("nvml.pcie.rx", "KiBy/s", s.pcie_rx),
            (
                "nvml.throttle_reasons",
                "",
                s.throttle_reasons.map(|v| v as f64),
            ),
        ];
        for (name, unit, v) in gauges {
            if let Some(v) = v {
                push(name, unit, false, labels.clone(), v);
            }
        }
        for (name, v) in [
            ("nvml.ecc.corrected", s.ecc_corrected),
            ("nvml.ecc.uncorrected", s.ecc_uncorrected),
        ] {
            if let Some(v) = v {
                push(name, "", true, labels.clone(), v as f64);
            }
        }
        for (pid, process, bytes) in &s.processes {
            let mut attrs = labels.clone();
            attrs.push(text("process.pid", pid.to_string()));
            attrs.push(text("process.executable.name", process.clone()));
            push(
                "nvml.process.memory.used",
                "By",
                false,
                attrs,
                *bytes as f64,
            );
        }
    }
    let metrics = metrics
        .into_iter()
        .map(|(name, unit, counter, data_points)| Metric {
            name: name.to_owned(),
            unit: unit.to_owned(),
            data: Some(if counter {
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
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(resource(host)),
            scope_metrics: vec![ScopeMetrics {
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// XID events as OTLP log records (ERROR, event `gpu.xid`).
pub fn events_request(events: &[XidEvent], host: &str) -> ExportLogsServiceRequest {
    let records = events
        .iter()
        .map(|e| {
            let mut attrs = gpu_labels(e.index, &e.uuid, "");
            attrs.retain(|kv| kv.key != "gpu.model");
            attrs.push(KeyValue {
                key: "gpu.xid".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::IntValue(e.xid as i64)),
                }),
                ..Default::default()
            });
            LogRecord {
                time_unix_nano: e.time,
                observed_time_unix_nano: e.time,
                severity_number: 17,
                severity_text: "ERROR".into(),
                body: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(format!(
                        "XID {} on GPU {} ({})",
                        e.xid, e.index, e.uuid
                    ))),
                }),
                attributes: attrs,
                event_name: "gpu.xid".into(),
                ..Default::default()
            }
        })
        .collect();
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(resource(host)),
            scope_logs: vec![ScopeLogs {
                log_records: records,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// This host's name (`host.name`).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
mod tests;
