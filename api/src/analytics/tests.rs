//! The leak scan in-process: a span carrying a raw-prompt header, found by the HTTP API and by
//! the SQL table function; clean data reports nothing.

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

#[tokio::test]
async fn planted_raw_prompt_headers_are_found_by_http_and_sql() {
    let dir = tempfile::tempdir().unwrap();
    let state = test_state(dir.path());
    let otlp = crate::otlp::http::router(state.clone());
    let api = api_router(state);
    let (_, body) = call(
        &api,
        Request::get("/api/v1/leaks").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(body, r#"{"findings":[]}"#, "nothing stored, nothing found");
    let trace = "5b8efff798038103d269b633813fc60c";
    let spans = format!(
        r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"gw"}}}}]}},"scopeSpans":[{{"spans":[{{"traceId":"{trace}","spanId":"eee19b7ec3c1b174","name":"chat","kind":2,"startTimeUnixNano":"1764460800000000000","endTimeUnixNano":"1764460800250000000","attributes":[{{"key":"http.request.header.x-raw-prompt","value":{{"stringValue":"refund me"}}}}]}}]}}]}}]}}"#
    );
    let post = Request::post("/v1/traces")
        .header("content-type", "application/json")
        .body(Body::from(spans))
        .unwrap();
    assert_eq!(call(&otlp, post).await.0, StatusCode::OK);

    let (status, body) = call(
        &api,
        Request::get("/api/v1/leaks?start=2025-11-30T00:00:00Z")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let doc: Value = serde_json::from_str(&body).unwrap();
    let f = &doc["findings"][0];
    assert_eq!(f["kind"], "raw_prompt_header", "{body}");
    assert_eq!(f["service"], "gw");
    assert_eq!(f["carrier"], "http.request.header.x-raw-prompt");
    assert_eq!(f["example_trace_ids"][0], trace);
    // redacted at ingest: the header came in as its hash, still a finding
    assert_eq!(doc["findings"].as_array().unwrap().len(), 1, "{body}");

    let sql = Request::post("/api/v1/sql")
        .header("content-type", "application/json")
        .body(Body::from(
            r#"{"query": "SELECT kind, service, count FROM leaks('2025-11-30T00:00:00Z', '2025-12-01T00:00:00Z')"}"#,
        ))
        .unwrap();
    let (status, body) = call(&api, sql).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains(r#"["raw_prompt_header","gw",1]"#), "{body}");
    let (status, body) = call(
        &api,
        Request::get("/api/v1/leaks?start=soon")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}
