//! Retention as a user sees it: spans older than the tenant's retention are refused at ingest,
//! and rows that fall out of it are gone at once from every read path (trace by id, search,
//! SQL), including the older half of a trace that straddles the cutoff.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message;
use serde_json::json;
use weft_tests::Weft;

use crate::common::*;

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_out_of_retention_are_refused_and_never_read() {
    let dir = tempfile::tempdir().unwrap();
    let w = Weft::start(dir.path(), &["--retention", "8s", "--flush-age", "200ms"]);
    let c = Client::new();
    let now = now_ns();
    let (straddling, old, ancient) = (id16(1), id16(2), id16(3));
    let spans = vec![
        span(
            &straddling,
            1,
            None,
            "root",
            now - 1_000_000_000,
            now + 60_000_000_000,
        ),
        span(
            &straddling,
            2,
            Some(1),
            "late",
            now + 60_000_000_000,
            now + 61_000_000_000,
        ),
        span(&old, 3, None, "old", now - 1_000_000_000, now - 900_000_000),
        span(
            &ancient,
            4,
            None,
            "ancient",
            now - 3_600_000_000_000,
            now - 3_500_000_000_000,
        ),
    ];
    let r = post_proto(&c, &w, &request("ret", spans), None).await;
    assert_eq!(r.status, 200);
    let partial = ExportTraceServiceResponse::decode(&r.body[..])
        .unwrap()
        .partial_success
        .expect("the span older than retention is refused");
    assert_eq!(partial.rejected_spans, 1);
    assert!(
        partial
            .error_message
            .contains("older than the tenant's retention of 8s"),
        "{}",
        partial.error_message
    );
    assert!(get_trace_proto(&c, &w, &old, None).await.is_some());

    // once the cutoff (now - 8 s) has passed the spans that started a second before `now`
    let fall_out = Duration::from_nanos(now + 7_500_000_000 - now_ns().min(now + 7_500_000_000));
    tokio::time::sleep(fall_out).await;
    assert!(get_trace_proto(&c, &w, &old, None).await.is_none());
    let kept = flatten(&get_trace_proto(&c, &w, &straddling, None).await.unwrap());
    assert_eq!(kept.len(), 1, "the straddling trace keeps its newer span");
    assert_eq!(kept[0].1.name, "late");
    let found = search(&c, &w, "service=ret", None).await;
    let traces = found["traces"].as_array().unwrap();
    assert_eq!(traces.len(), 1, "{found}");
    assert_eq!(traces[0]["trace_id"], hex::encode(&straddling));
    assert_eq!(traces[0]["span_count"], 1);
    assert_eq!(
        search(&c, &w, "name=old", None).await["traces"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    // the same through SQL, from the head and (after a flush) from blocks
    for _ in 0..2 {
        for (query, want) in [
            (
                "SELECT count(*) FROM spans WHERE service_name = 'ret'",
                json!(1),
            ),
            ("SELECT count(*) FROM spans WHERE name = 'old'", json!(0)),
            (
                // one trace, of one span
                "SELECT count(*) * 10 + max(span_count) FROM traces",
                json!(11),
            ),
        ] {
            let r = c
                .post(
                    &format!("{}/api/v1/sql", w.http),
                    &[("content-type", "application/json")],
                    json!({ "query": query }).to_string(),
                )
                .await
                .unwrap();
            assert_eq!(r.status, 200, "{query}: {}", r.text());
            let doc = r.json().unwrap();
            assert_eq!(doc["rows"][0][0], want, "{query}: {doc}");
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
}
