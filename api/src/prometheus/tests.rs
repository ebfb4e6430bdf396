//! The Prometheus API in-process: an OTLP/JSON metrics export, then the endpoints Grafana's
//! Prometheus data source calls, with their envelopes and encodings.

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::server::api_router;
use crate::state::test_state;

async fn call(router: &axum::Router, req: Request<Body>) -> (StatusCode, Value) {
    let response = router.clone().oneshot(req).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap())
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri)
        .header("x-scope-orgid", "acme")
        .body(Body::empty())
        .unwrap()
}

const T0: u64 = 1_764_460_800; // seconds

fn export() -> String {
    let gauge_points: Vec<Value> = (0..20)
        .flat_map(|i| {
            ["0", "1"].map(|gpu| {
                json!({"timeUnixNano": ((T0 + i * 15) * 1_000_000_000).to_string(),
                       "asDouble": if gpu == "0" { 50.0 + i as f64 } else { 10.0 },
                       "attributes": [{"key": "gpu.id", "value": {"stringValue": gpu}}]})
            })
        })
        .collect();
    let counter_points: Vec<Value> = (0..20)
        .map(|i| {
            json!({"timeUnixNano": ((T0 + i * 15) * 1_000_000_000).to_string(),
                   "startTimeUnixNano": (T0 * 1_000_000_000).to_string(), "asInt": (i * 30).to_string(),
                   "exemplars": [{"timeUnixNano": ((T0 + i * 15) * 1_000_000_000).to_string(), "asDouble": 1.0,
                                  "traceId": "5b8efff798038103d269b633813fc60c"}]})
        })
        .collect();
    json!({"resourceMetrics": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "vllm"}},
        {"key": "worker.id", "value": {"stringValue": "w-7"}}]},
      "scopeMetrics": [{"metrics": [
        {"name": "gpu.utilization", "unit": "%", "description": "SM utilisation", "gauge": {"dataPoints": gauge_points}},
        {"name": "vllm.requests", "unit": "{request}", "sum": {"aggregationTemporality": 2, "isMonotonic": true, "dataPoints": counter_points}}
      ]}]}]})
    .to_string()
}

#[tokio::test]
async fn grafana_s_calls_answer_like_prometheus() {
    let dir = tempfile::tempdir().unwrap();
    let state = test_state(dir.path());
    let otlp = crate::otlp::http::router(state.clone());
    let req = Request::post("/v1/metrics")
        .header(header::CONTENT_TYPE, "application/json")
        .header("x-scope-orgid", "acme")
        .body(Body::from(export()))
        .unwrap();
    let response = otlp.oneshot(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let api = api_router(state);
    let end = T0 + 19 * 15;

    let (s, v) = call(
        &api,
        get(&format!(
            "/prometheus/api/v1/query?query=gpu_utilization_percent&time={end}"
        )),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "success");
    assert_eq!(v["data"]["resultType"], "vector");
    let result = v["data"]["result"].as_array().unwrap();
    assert_eq!(result.len(), 2);
    assert_eq!(
        result[0]["metric"],
        json!({"__name__": "gpu_utilization_percent", "gpu_id": "0", "service_name": "vllm", "worker_id": "w-7"})
    );
    assert_eq!(result[0]["value"], json!([end, "69"]));

    // form POST, Grafana's step spelling, fractional times
    let form = format!(
        "query=sum+by+(worker_id)+(rate(vllm_requests_total[1m]))&start={}.5&end={end}&step=1m0s",
        T0 + 60
    );
    let req = Request::post("/prometheus/api/v1/query_range")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header("x-scope-orgid", "acme")
        .body(Body::from(form))
        .unwrap();
    let (s, v) = call(&api, req).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["resultType"], "matrix");
    let series = &v["data"]["result"][0];
    assert_eq!(series["metric"], json!({"worker_id": "w-7"}));
    let values = series["values"].as_array().unwrap();
    assert_eq!(values.len(), 4);
    assert_eq!(values[0], json!([(T0 + 60) as f64 + 0.5, "2"]));

    let (_, v) = call(&api, get("/prometheus/api/v1/labels")).await;
    let labels: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert_eq!(
        labels,
        vec!["__name__", "gpu_id", "service_name", "worker_id"]
    );
    let (_, v) = call(&api, get("/prometheus/api/v1/label/__name__/values")).await;
    assert_eq!(
        v["data"],
        json!(["gpu_utilization_percent", "vllm_requests_total"])
    );
    let (_, v) = call(&api, get(&format!("/prometheus/api/v1/label/gpu_id/values?match[]=gpu_utilization_percent&start={T0}&end={end}"))).await;
    assert_eq!(v["data"], json!(["0", "1"]));
    let (_, v) = call(
        &api,
        get(&format!(
            "/prometheus/api/v1/series?match[]=%7Bgpu_id%3D%221%22%7D&start={T0}&end={end}"
        )),
    )
    .await;
    assert_eq!(
        v["data"],
        json!([{"__name__": "gpu_utilization_percent", "gpu_id": "1", "service_name": "vllm", "worker_id": "w-7"}])
    );
    let (_, v) = call(&api, get("/prometheus/api/v1/metadata")).await;
    assert_eq!(
        v["data"]["gpu_utilization_percent"],
        json!([{"type": "gauge", "help": "SM utilisation", "unit": "percent"}])
    );
    assert_eq!(v["data"]["vllm_requests_total"][0]["type"], "counter");
    let (_, v) = call(
        &api,
        get(&format!(
            "/prometheus/api/v1/query_exemplars?query=vllm_requests_total&start={}&end={}",
            T0 + 30,
            T0 + 45
        )),
    )
    .await;
    let ex = v["data"][0]["exemplars"].as_array().unwrap();
    assert_eq!(ex.len(), 2);
    assert_eq!(
        ex[0]["labels"]["trace_id"],
        "5b8efff798038103d269b633813fc60c"
    );
    assert_eq!(ex[0]["timestamp"], json!(T0 + 30));
    let (s, v) = call(&api, get("/prometheus/api/v1/status/buildinfo")).await;
    assert_eq!(s, StatusCode::OK);
    assert!(v["data"]["version"].as_str().unwrap().starts_with('2'));

    // errors in Prometheus's envelope
    let (s, v) = call(&api, get("/prometheus/api/v1/query?query=sum(")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(v["status"], "error");
    assert_eq!(v["errorType"], "bad_data");
    let (s, v) = call(
        &api,
        get(&format!(
            "/prometheus/api/v1/query_range?query=up&start={end}&end={T0}&step=15"
        )),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, _) = call(&api, get("/prometheus/api/v1/series")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
}

/// Values and times are written as `{}` writes them (Go's shortest 'f' format, which
/// Prometheus uses, agrees with it), the integer shortcut included.
#[test]
fn numbers_are_written_as_display_writes_them() {
    for v in [
        0.0,
        -0.0,
        1.0,
        -1.0,
        58.0,
        0.5,
        -2.25,
        1e15 - 1.0,
        1e15,
        -1e15,
        1e21,
        123_456_789.0,
        f64::MAX,
        f64::MIN_POSITIVE,
        i64::MIN as f64,
    ] {
        assert_eq!(super::number(v), format!("{v}"), "{v:?}");
    }
    for ms in [
        0i64,
        1_000,
        -1_000,
        1_764_460_815_000,
        1_500,
        -1_500,
        i64::MIN / 1000 * 1000,
    ] {
        let mut out = String::new();
        super::write_seconds(&mut out, ms);
        let want = if ms % 1000 == 0 {
            format!("{}", ms / 1000)
        } else {
            format!("{}", ms as f64 / 1000.0)
        };
        assert_eq!(out, want, "{ms}");
    }
}
