//! The collector's OTLP shape from a recorded GPU.

use opentelemetry_proto::tonic::metrics::v1::metric;

use super::*;

pub(crate) fn recorded() -> RecordedGpus {
    let gpu = |index: u32, used: u64| GpuSample {
        index,
        uuid: format!("GPU-{index}"),
        name: "NVIDIA H200".into(),
        sm_utilization: Some(97.0),
        memory_utilization: Some(40.0),
        memory_used: Some(used),
        memory_free: Some(150_000_000_000 - used),
        memory_total: Some(150_000_000_000),
        temperature: Some(71.0),
        power_usage: Some(612_000.0),
        power_limit: Some(700_000.0),
        sm_clock: Some(1980.0),
        memory_clock: Some(3201.0),
        pcie_tx: None,
        pcie_rx: None,
        ecc_corrected: Some(0),
        ecc_uncorrected: Some(0),
        throttle_reasons: Some(4),
        processes: vec![(4242, "vllm".into(), used - 1_000_000)],
    };
    RecordedGpus::new(
        vec![vec![gpu(0, 140_000_000_000), gpu(1, 20_000_000_000)]],
        vec![XidEvent {
            index: 1,
            uuid: "GPU-1".into(),
            xid: 79,
            time: 1_700_000_000_000_000_000,
        }],
    )
}

#[test]
fn samples_become_labelled_points_and_xids_become_error_records() {
    let mut gpus = recorded();
    let samples = gpus.sample().unwrap();
    let req = metrics_request(&samples, "node-7", 5);
    let rm = &req.resource_metrics[0];
    let host = &rm.resource.as_ref().unwrap().attributes;
    assert!(host.iter().any(|kv| kv.key == "host.name"));
    let metrics = &rm.scope_metrics[0].metrics;
    let used = metrics
        .iter()
        .find(|m| m.name == "nvml.memory.used")
        .unwrap();
    assert_eq!(used.unit, "By");
    let Some(metric::Data::Gauge(g)) = &used.data else {
        panic!()
    };
    assert_eq!(g.data_points.len(), 2);
    let keys: Vec<&str> = g.data_points[0]
        .attributes
        .iter()
        .map(|kv| kv.key.as_str())
        .collect();
    assert_eq!(keys, vec!["gpu.id", "gpu.uuid", "gpu.model"]);
    // unsupported fields are left out, not zero
    assert!(!metrics.iter().any(|m| m.name == "nvml.pcie.tx"));
    let ecc = metrics
        .iter()
        .find(|m| m.name == "nvml.ecc.uncorrected")
        .unwrap();
    assert!(matches!(ecc.data, Some(metric::Data::Sum(ref s)) if s.is_monotonic));
    let procs = metrics
        .iter()
        .find(|m| m.name == "nvml.process.memory.used")
        .unwrap();
    let Some(metric::Data::Gauge(p)) = &procs.data else {
        panic!()
    };
    assert!(
        p.data_points[0]
            .attributes
            .iter()
            .any(|kv| kv.key == "process.executable.name")
    );
    let logs = events_request(&gpus.events(), "node-7");
    let record = &logs.resource_logs[0].scope_logs[0].log_records[0];
    assert_eq!(
        (record.severity_number, record.event_name.as_str()),
        (17, "gpu.xid")
    );
    // events are handed over once
    assert!(gpus.events().is_empty());
}

#[test]
fn without_a_driver_the_collector_says_so() {
    // this machine has no NVIDIA driver: opening NVML must fail with the clear error, not panic
    if std::path::Path::new("/proc/driver/nvidia").exists() {
        return;
    }
    match nvml::NvmlGpus::open() {
        Err(GpuError::Unavailable(m)) => assert!(!m.is_empty()),
        Err(other) => panic!("expected Unavailable, got {other}"),
        Ok(_) => panic!("NVML opened without a driver"),
    }
}
