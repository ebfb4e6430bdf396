//! The collector end to end with a recorded fake GPU: samples stored through the ingester,
//! answered by PromQL under the NVML names and the canonical vocabulary, XIDs as log records.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use weft_ingest::gpu::{GpuSample, Gpus, RecordedGpus, XidEvent};

use super::collect_local;
use crate::server::api_router;
use crate::state::test_state;

fn fake() -> Box<dyn Gpus> {
    let gpu = |index: u32, used: u64| GpuSample {
        index,
        uuid: format!("GPU-{index}"),
        name: "NVIDIA H200".into(),
        sm_utilization: Some(if index == 0 { 97.0 } else { 12.0 }),
        memory_used: Some(used),
        memory_free: Some(150_000_000_000 - used),
        memory_total: Some(150_000_000_000),
        temperature: Some(71.0),
        power_usage: Some(612_000.0),
        processes: vec![(4242, "vllm".into(), used)],
        ..Default::default()
    };
    Box::new(RecordedGpus::new(
        vec![vec![gpu(0, 145_500_000_000), gpu(1, 20_000_000_000)]],
        vec![XidEvent {
            index: 0,
            uuid: "GPU-0".into(),
            xid: 79,
            time: crate::time::now(),
        }],
    ))
}

async fn get(router: &axum::Router, uri: &str) -> Value {
    let response = router
        .clone()
        .oneshot(Request::get(uri).body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test]
async fn a_recorded_gpu_is_sampled_stored_and_queried() {
    let dir = tempfile::tempdir().unwrap();
    let state = test_state(dir.path());
    let gpus = Arc::new(Mutex::new(fake()));
    let stored = collect_local(&state, &gpus, "node-7").await.unwrap();
    assert!(stored >= 12, "{stored} points");
    let api = api_router(state.clone());
    let v = get(
        &api,
        "/prometheus/api/v1/query?query=gpu_memory_used_bytes%7Bgpu_id%3D%220%22%7D",
    )
    .await;
    let r = &v["data"]["result"][0];
    assert_eq!(r["metric"]["host_name"], "node-7");
    assert_eq!(r["metric"]["gpu_uuid"], "GPU-0");
    assert_eq!(r["value"][1], "145500000000");
    let v = get(&api, "/prometheus/api/v1/query?query=gpu_power_usage_watts").await;
    assert_eq!(v["data"]["result"][0]["value"][1], "612");
    let v = get(
        &api,
        "/prometheus/api/v1/query?query=gpu_utilization_ratio+%3E+0.9",
    )
    .await;
    assert_eq!(v["data"]["result"].as_array().unwrap().len(), 1);
    let v = get(
        &api,
        "/prometheus/api/v1/query?query=nvml_process_memory_used_bytes",
    )
    .await;
    assert_eq!(
        v["data"]["result"][0]["metric"]["process_executable_name"],
        "vllm"
    );
    // the XID is a log record, found by its words
    let logs = get(&api, "/api/v1/logs/search?q=XID").await;
    assert_eq!(logs["logs"][0]["event_name"], "gpu.xid");
    assert_eq!(logs["logs"][0]["severity_text"], "ERROR");
}
