//! Malformed and hostile input gets the documented answer and leaves the server healthy.

use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
use prost::Message;
use weft_tests::Weft;

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_get_clear_answers_and_the_server_stays_healthy() {
    let dir = tempfile::tempdir().unwrap();
    let w = Weft::start(
        dir.path(),
        &[
            "--max-body-bytes",
            "1000000",
            "--max-attribute-value-bytes",
            "10000",
        ],
    );
    let c = Client::new();
    let url = format!("{}/v1/traces", w.otlp);
    let proto = [("content-type", "application/x-protobuf")];
    let json = [("content-type", "application/json")];

    let good = request(
        "svc",
        (0..20)
            .map(|i| span(&id16(1), i + 1, None, "s", T0, T0 + 1))
            .collect(),
    );
    let encoded = good.encode_to_vec();
    let r = c
        .post(&url, &proto, encoded[..encoded.len() - 7].to_vec())
        .await
        .unwrap();
    assert_eq!(r.status, 400, "truncated protobuf");
    assert_eq!(r.content_type, "application/x-protobuf");
    let status = weft_status(&r.body);
    assert!(status.contains("undecodable protobuf body"), "{status}");

    let r = c
        .post(
            &url,
            &json,
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":12}]}]}]}"#,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    let msg = r.json().unwrap()["message"].as_str().unwrap().to_owned();
    assert!(
        msg.contains(
            "resourceSpans[0].scopeSpans[0].spans[0].traceId: expected a hex string, got a number"
        ),
        "{msg}"
    );
    let r = c.post(&url, &json, "{not json").await.unwrap();
    assert_eq!(r.status, 400);

    let r = c
        .post(&url, &[("content-type", "text/plain")], "hello")
        .await
        .unwrap();
    assert_eq!(r.status, 415);
    let r = c.post(&url, &proto, vec![0u8; 1_000_001]).await.unwrap();
    assert_eq!(r.status, 413);
    let r = c
        .post(
            &url,
            &[
                ("content-type", "application/x-protobuf"),
                ("content-encoding", "gzip"),
            ],
            "not gzip",
        )
        .await
        .unwrap();
    assert_eq!(r.status, 400);

    // invalid spans: partial success naming the first problem, valid ones kept
    let trace = id16(2);
    let mut spans = vec![span(&trace, 1, None, "ok", T0, T0 + 5)];
    let mut short_id = span(&trace, 2, None, "short", T0, T0 + 5);
    short_id.span_id = vec![1, 2, 3];
    spans.push(short_id);
    spans.push(span(&[0; 16], 3, None, "zero", T0, T0 + 5));
    spans.push(span(&trace, 4, None, "backwards", T0 + 5, T0));
    let mut huge = span(&trace, 5, None, "huge", T0, T0 + 5);
    huge.attributes.push(attr(
        "gen_ai.input.messages",
        V::StringValue("x".repeat(20_000)),
    ));
    spans.push(huge);
    let r = post_proto(&c, &w, &request("svc", spans), None).await;
    assert_eq!(r.status, 200);
    let resp =
        opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse::decode(
            &r.body[..],
        )
        .unwrap();
    let partial = resp.partial_success.unwrap();
    assert_eq!(partial.rejected_spans, 4);
    assert_eq!(
        partial.error_message,
        "span 1 of scope 0 of resource 0: span_id must be 8 bytes, got 3"
    );
    let got = get_trace_proto(&c, &w, &trace, None).await.unwrap();
    assert_eq!(flatten(&got).len(), 1);

    // the same answers over JSON
    let r = c.post(&url, &json, r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"00000000000000000000000000000000","spanId":"0102030405060708","name":"z"}]}]}]}"#).await.unwrap();
    assert_eq!(r.status, 200);
    let doc = r.json().unwrap();
    assert_eq!(doc["partialSuccess"]["rejectedSpans"], "1");
    assert!(
        doc["partialSuccess"]["errorMessage"]
            .as_str()
            .unwrap()
            .contains("trace_id is all zeros")
    );

    // reads: bad and unknown ids
    let r = c
        .get(&format!("{}/api/v1/traces/xyz", w.http), &[])
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    assert!(
        r.json().unwrap()["error"]
            .as_str()
            .unwrap()
            .contains("32 hex")
    );
    let r = c
        .get(
            &format!("{}/api/v1/traces/{}", w.http, "ab".repeat(16)),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    assert!(
        r.json().unwrap()["error"]
            .as_str()
            .unwrap()
            .contains("not found")
    );
    let r = c
        .get(&format!("{}/api/v1/search?min_duration=quick", w.http), &[])
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    assert!(
        r.json().unwrap()["error"]
            .as_str()
            .unwrap()
            .starts_with("min_duration:")
    );

    let r = c.get(&format!("{}/ready", w.http), &[]).await.unwrap();
    assert_eq!(r.status, 200, "still healthy");
    assert_eq!(
        post_proto(&c, &w, &good, None).await.status,
        200,
        "still ingesting"
    );
}

fn weft_status(body: &[u8]) -> String {
    #[derive(Clone, PartialEq, prost::Message)]
    struct RpcStatus {
        #[prost(int32, tag = "1")]
        code: i32,
        #[prost(string, tag = "2")]
        message: String,
    }
    RpcStatus::decode(body)
        .map(|s| s.message)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_saturated_write_path_answers_429_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let w = Weft::start(
        dir.path(),
        &[
            "--flush-rows",
            "1000",
            "--max-pending-rows",
            "1000",
            "--flush-age",
            "1h",
        ],
    );
    let c = Client::new();
    let first = request(
        "svc",
        (0..900)
            .map(|i| span(&id16(3), i + 1, None, "s", T0, T0 + 1))
            .collect(),
    );
    assert_eq!(post_proto(&c, &w, &first, None).await.status, 200);
    let second = request(
        "svc",
        (0..200)
            .map(|i| span(&id16(4), i + 1, None, "s", T0, T0 + 1))
            .collect(),
    );
    let r = post_proto(&c, &w, &second, None).await;
    assert_eq!(r.status, 429);
    assert!(r.retry_after.is_some(), "Retry-After is set");
    let mut client = opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient::connect(w.grpc.clone()).await.unwrap();
    let status = client.export(second.clone()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(
        !status.details().is_empty(),
        "RetryInfo is attached so OTLP clients retry"
    );
    let metrics = metrics(&c, &w).await;
    assert!(
        metrics.contains("weft_spans_rejected_total{reason=\"overloaded\"} 2"),
        "{metrics}"
    );
}

/// The PostgreSQL wire fed garbage: random bytes before start-up, random frames after a valid
/// start-up (every message type, lengths that lie), connections dropped mid-message. The
/// server keeps serving (`/ready` answers and a fresh connection runs a query) and nothing
/// panics (`weft_panics_total` stays 0): frames are checked before pgwire's decoders, which
/// trust the lengths inside a message. A `Parse` cut short is answered FATAL 08P01.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_postgresql_messages_never_bring_the_server_down() {
    use rand::{Rng, SeedableRng};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let dir = tempfile::tempdir().unwrap();
    let w = Weft::start(dir.path(), &[]);
    let addr = format!("127.0.0.1:{}", w.pg);
    let mut rng = rand::rngs::StdRng::seed_from_u64(26);
    let startup = {
        let mut body = 196_608i32.to_be_bytes().to_vec();
        for (k, v) in [("user", "fuzz"), ("database", "weft")] {
            body.extend_from_slice(k.as_bytes());
            body.push(0);
            body.extend_from_slice(v.as_bytes());
            body.push(0);
        }
        body.push(0);
        let mut msg = ((body.len() + 4) as i32).to_be_bytes().to_vec();
        msg.extend_from_slice(&body);
        msg
    };
    for round in 0..300 {
        let Ok(mut s) = tokio::net::TcpStream::connect(&addr).await else {
            panic!("round {round}: the server stopped accepting");
        };
        let mut out = Vec::new();
        if round % 3 != 0 {
            out.extend_from_slice(&startup);
        }
        for _ in 0..rng.random_range(1..6) {
            let tag = *b"QPBEDSCHXFdcfp"
                .get(rng.random_range(0..14))
                .unwrap_or(&b'Q');
            let len: usize = rng.random_range(0..64);
            let mut body: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            if rng.random_bool(0.3) {
                body.extend_from_slice(b"SELECT $1000000000\0");
            }
            out.push(tag);
            // a length that is right, or lies
            let claimed = match rng.random_range(0..4) {
                0 => rng.random::<i32>(),
                _ => (body.len() + 4) as i32,
            };
            out.extend_from_slice(&claimed.to_be_bytes());
            out.extend_from_slice(&body);
        }
        if round % 5 == 0 {
            out.truncate(rng.random_range(0..out.len().max(1)));
        }
        let _ = s.write_all(&out).await;
        let mut sink = vec![0u8; 4096];
        let _ = tokio::time::timeout(std::time::Duration::from_millis(20), s.read(&mut sink)).await;
    }
    // a Parse whose parameter count announces type OIDs the frame does not hold
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut out = startup.clone();
    out.extend_from_slice(b"P\0\0\0\x10\0SELECT 1\0\0\x05");
    s.write_all(&out).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        s.read_to_end(&mut answer),
    )
    .await;
    let text = String::from_utf8_lossy(&answer);
    assert!(
        text.contains("08P01") && text.contains("Parse"),
        "no FATAL 08P01 naming the Parse: {text:?}"
    );

    let c = Client::new();
    let ready = c.get(&format!("{}/ready", w.http), &[]).await.unwrap();
    assert_eq!(ready.status, 200);
    let mut pg = weft_bench::pgclient::PgClient::connect(&addr, "weft")
        .await
        .unwrap();
    assert_eq!(pg.query("SELECT 1").await.unwrap(), 1);
    let metrics = metrics(&c, &w).await;
    assert!(metrics.contains("\nweft_panics_total 0\n"), "{metrics}");
}
