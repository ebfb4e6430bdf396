//! The log API in-process: a JSON log export, then search pages, a trace's records and errors.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

use crate::server::api_router;
use crate::state::test_state;

async fn call(router: &axum::Router, req: Request<Body>) -> (StatusCode, String) {
    let response = router.clone().oneshot(req).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri)
        .header("x-scope-orgid", "acme")
        .body(Body::empty())
        .unwrap()
}

const TRACE: &str = "5b8efff798038103d269b633813fc60c";

fn record(i: u64) -> String {
    let trace = if i.is_multiple_of(2) {
        format!(r#","traceId":"{TRACE}""#)
    } else {
        String::new()
    };
    let body = if i.is_multiple_of(3) {
        "customer charged twice, refund issued"
    } else {
        "decode step prefill_ms=12"
    };
    format!(
        r#"{{"timeUnixNano":"{}","severityNumber":{},"body":{{"stringValue":"{body} #{i}"}}{trace}}}"#,
        1_764_460_800_000_000_000u64 + i * 1_000_000,
        if i.is_multiple_of(4) { 17 } else { 9 }
    )
}

#[tokio::test]
async fn log_search_pages_and_a_trace_s_logs_answer_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let state = test_state(dir.path());
    let otlp = crate::otlp::http::router(state.clone());
    let api = api_router(state);
    let records: Vec<String> = (0..10).map(record).collect();
    let body = format!(
        r#"{{"resourceLogs":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"vllm"}}}}]}},"scopeLogs":[{{"logRecords":[{}]}}]}}]}}"#,
        records.join(",")
    );
    let post = Request::post("/v1/logs")
        .header("content-type", "application/json")
        .header("x-scope-orgid", "acme")
        .body(Body::from(body))
        .unwrap();
    let (status, body) = call(&otlp, post).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "{}"));

    // "refund" is in records 0, 3, 6, 9: newest first, two pages of 2
    let (status, body) = call(&api, get("/api/v1/logs/search?q=refund&limit=2")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let page: Value = serde_json::from_str(&body).unwrap();
    let bodies = |page: &Value| -> Vec<String> {
        page["logs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["body"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(
        bodies(&page)[0].ends_with("#9") && bodies(&page)[1].ends_with("#6"),
        "{body}"
    );
    let cursor = page["next_cursor"].as_str().unwrap();
    let (_, body) = call(
        &api,
        get(&format!(
            "/api/v1/logs/search?q=refund&limit=2&cursor={cursor}"
        )),
    )
    .await;
    let page: Value = serde_json::from_str(&body).unwrap();
    assert!(
        bodies(&page)[0].ends_with("#3") && bodies(&page)[1].ends_with("#0"),
        "{body}"
    );
    assert!(page["next_cursor"].is_null(), "{body}");
    let first = &page["logs"][1];
    assert_eq!(first["severity_text"], "");
    assert_eq!(first["severity_number"], 17);
    assert_eq!(first["trace_id"], TRACE);
    assert_eq!(first["service_name"], "vllm");
    assert_eq!(first["class"], "error");

    let (_, body) = call(&api, get("/api/v1/logs/search?severity=error&q=decode")).await;
    let page: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        page["logs"].as_array().unwrap().len(),
        2,
        "records 4 and 8: {body}"
    );

    let (status, body) = call(&api, get(&format!("/api/v1/traces/{TRACE}/logs"))).await;
    assert_eq!(status, StatusCode::OK);
    let logs: Value = serde_json::from_str(&body).unwrap();
    let logs = logs["logs"].as_array().unwrap();
    assert_eq!(logs.len(), 5);
    assert!(
        logs[0]["body"].as_str().unwrap().ends_with("#0"),
        "oldest first: {body}"
    );

    for (uri, says) in [
        ("/api/v1/logs/search?q=%22open", "closing quote"),
        ("/api/v1/logs/search?severity=loud", "severity"),
        ("/api/v1/logs/search?cursor=zz", "cursor"),
        ("/api/v1/logs/search?colour=red", "colour"),
        ("/api/v1/traces/abc/logs", "32 hex"),
    ] {
        let (status, body) = call(&api, get(uri)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}");
        assert!(body.contains(says), "{uri}: {body}");
    }
}
