//! The trace API in-process (`tower::ServiceExt::oneshot`, no sockets): answers, errors, the
//! tenant extractor and the per-route latency histogram.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
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
    Request::get(uri).body(Body::empty()).unwrap()
}

#[tokio::test]
async fn trace_by_id_and_search_answer_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let state = test_state(dir.path());
    let otlp = crate::otlp::http::router(state.clone());
    let api = api_router(state);
    let trace = "5b8efff798038103d269b633813fc60c";
    let body = format!(
        r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"gw"}}}}]}},"scopeSpans":[{{"spans":[{{"traceId":"{trace}","spanId":"eee19b7ec3c1b174","name":"chat","kind":2,"startTimeUnixNano":"1764460800000000000","endTimeUnixNano":"1764460800250000000"}}]}}]}}]}}"#
    );
    let post = Request::post("/v1/traces")
        .header("content-type", "application/json")
        .header("x-scope-orgid", "acme")
        .body(Body::from(body))
        .unwrap();
    let (status, _) = call(&otlp, post).await;
    assert_eq!(status, StatusCode::OK);

    let mut req = get(&format!("/api/v1/traces/{trace}"));
    req.headers_mut()
        .insert("x-scope-orgid", "acme".parse().unwrap());
    let (status, body) = call(&api, req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("eee19b7ec3c1b174"), "{body}");
    // another tenant does not see it; a bad tenant name or id is a 400 naming the problem
    let (status, _) = call(&api, get(&format!("/api/v1/traces/{trace}"))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let mut req = get(&format!("/api/v1/traces/{trace}"));
    req.headers_mut()
        .insert("x-scope-orgid", "bad tenant".parse().unwrap());
    let (status, body) = call(&api, req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("X-Scope-OrgID"), "{body}");
    let (status, body) = call(&api, get("/api/v1/traces/xyz")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("32 hex characters"), "{body}");

    let mut req = get("/api/v1/search?service=gw");
    req.headers_mut()
        .insert("x-scope-orgid", "acme".parse().unwrap());
    let (status, body) = call(&api, req).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains(trace), "{body}");
    let (status, body) = call(&api, get("/api/v1/search?min_duration=soon")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // one latency histogram, labelled by route
    let (_, metrics) = call(&api, get("/metrics")).await;
    for route in [
        "GET /api/v1/traces/{trace_id}",
        "GET /api/v1/search",
        "POST /v1/traces",
    ] {
        assert!(
            metrics.contains(&format!(
                "weft_request_duration_seconds_count{{route=\"{route}\"}}"
            )),
            "{route}: {metrics}"
        );
    }
}
