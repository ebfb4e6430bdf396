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

#[tokio::test]
async fn a_trace_s_gpus_answer_with_their_series_over_its_time() {
    use weft_ingest::Format;
    use weft_storage::model::TenantId;
    let dir = tempfile::tempdir().unwrap();
    let state = test_state(dir.path());
    let t0: u64 = 1_764_460_800_000_000_000;
    let trace = "5b8efff798038103d269b633813fc60c";
    let spans = format!(
        r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"vllm"}}}}]}},
        "scopeSpans":[{{"spans":[{{"traceId":"{trace}","spanId":"eee19b7ec3c1b174","name":"llm.generate","kind":2,
        "startTimeUnixNano":"{}","endTimeUnixNano":"{}","attributes":[
          {{"key":"worker.id","value":{{"stringValue":"w-7"}}}},{{"key":"gpu.id","value":{{"stringValue":"0"}}}}]}}]}}]}}]}}"#,
        t0,
        t0 + 2_000_000_000
    );
    let tenant = TenantId::default_tenant();
    state
        .ingester
        .export_bytes(tenant.clone(), spans.into(), Format::Json)
        .await
        .unwrap();
    // DCGM utilisation for three GPUs every 10 s around the trace, and vLLM's KV cache usage
    let mut points = String::new();
    let mut kv = String::new();
    for (worker, gpu) in [("w-7", "0"), ("w-7", "1"), ("w-8", "0")] {
        for i in 0..30u64 {
            let t = t0 - 120_000_000_000 + i * 10_000_000_000;
            points.push_str(&format!(
                r#"{{"timeUnixNano":"{t}","asDouble":{},"attributes":[{{"key":"worker.id","value":{{"stringValue":"{worker}"}}}},{{"key":"gpu","value":{{"stringValue":"{gpu}"}}}}]}},"#,
                50 + i
            ));
            if gpu == "0" {
                kv.push_str(&format!(
                    r#"{{"timeUnixNano":"{t}","asDouble":0.97,"attributes":[{{"key":"worker.id","value":{{"stringValue":"{worker}"}}}}]}},"#
                ));
            }
        }
    }
    points.pop();
    kv.pop();
    let metrics = format!(
        r#"{{"resourceMetrics":[{{"scopeMetrics":[{{"metrics":[
          {{"name":"DCGM_FI_DEV_GPU_UTIL","gauge":{{"dataPoints":[{points}]}}}},
          {{"name":"vllm:kv_cache_usage_perc","gauge":{{"dataPoints":[{kv}]}}}}]}}]}}]}}"#
    );
    let out = state
        .ingester
        .export_metrics_bytes(tenant, metrics.into(), Format::Json)
        .await
        .unwrap();
    assert_eq!(out.rejected, 0, "{:?}", out.error_message);
    let api = api_router(state);
    let v = get(&api, &format!("/api/v1/traces/{trace}/gpu?margin=30s")).await;
    let series = v["series"].as_array().unwrap();
    let names: Vec<(&str, &str)> = series
        .iter()
        .map(|s| {
            (
                s["metric"].as_str().unwrap(),
                s["labels"]["worker_id"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        names,
        vec![("gpu.utilization", "w-7"), ("llm.kv_cache.usage", "w-7")]
    );
    assert_eq!(series[0]["labels"]["gpu_id"], "0");
    // the trace's 2 s plus 30 s either side: samples at -30 .. +30 s, 10 s apart
    let points = series[0]["points"].as_array().unwrap();
    assert_eq!(points.len(), 7, "{points:?}");
    assert_eq!(points[3][0].as_u64().unwrap(), t0);
    assert!((points[3][1].as_f64().unwrap() - 0.62).abs() < 1e-9);

    // the same join in SQL (the README's)
    let sql = format!(
        r#"SELECT m.metric, count(*) AS n FROM metrics m JOIN (
             SELECT "worker.id" AS w, "gpu.id" AS g, min(start_time) AS s, max(end_time) AS e
             FROM spans WHERE trace_id = '{trace}' AND "worker.id" IS NOT NULL GROUP BY 1, 2) t
           ON m."worker.id" = t.w AND (m.gpu = t.g OR m.gpu IS NULL)
           WHERE m.time BETWEEN t.s - INTERVAL '30 seconds' AND t.e + INTERVAL '30 seconds'
             AND m.metric IN ('DCGM_FI_DEV_GPU_UTIL', 'vllm:kv_cache_usage_perc')
           GROUP BY 1 ORDER BY 1"#
    );
    let body = serde_json::json!({"query": sql}).to_string();
    let response = api
        .clone()
        .oneshot(
            Request::post("/api/v1/sql")
                .header("content-type", "application/json")
                .body(Body::from(body))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        v["rows"],
        serde_json::json!([["DCGM_FI_DEV_GPU_UTIL", 7], ["vllm:kv_cache_usage_perc", 7]])
    );
}
