//! Traces sent over both transports and in both encodings read back equal, field by field.

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::common::v1::{ArrayValue, KeyValueList, any_value::Value as V};
use opentelemetry_proto::tonic::trace::v1::Status;
use opentelemetry_proto::tonic::trace::v1::span::{Event, Link};
use tonic::codec::CompressionEncoding;
use weft_tests::Weft;

use crate::common::*;

fn rich_trace(
    trace: &[u8],
) -> opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest {
    let mut root = span(
        trace,
        1,
        None,
        "POST /v1/chat/completions",
        T0,
        T0 + 2_000_000_000,
    );
    root.attributes = vec![
        sattr("http.route", "/v1/chat/completions"),
        attr("http.response.status_code", V::IntValue(200)),
        sattr("gen_ai.system", "vllm"),
        attr("gen_ai.usage.prompt_tokens", V::IntValue(812)),
        attr("gen_ai.usage.output_tokens", V::IntValue(64)),
        sattr("llm.model_version", "llama-3.1-70b-2025-09"),
        attr("llm.batch_size", V::IntValue(16)),
        attr("gen_ai.latency.time_to_first_token", V::DoubleValue(0.325)),
        attr(
            "gen_ai.response.finish_reasons",
            V::ArrayValue(ArrayValue {
                values: vec![opentelemetry_proto::tonic::common::v1::AnyValue {
                    value: Some(V::StringValue("stop".into())),
                }],
            }),
        ),
        sattr(
            "gen_ai.input.messages",
            &format!(
                "[{{\"role\":\"user\",\"content\":\"{}\"}}]",
                "why is the sky blue? ".repeat(200)
            ),
        ),
        attr("flag", V::BoolValue(true)),
        attr("blob", V::BytesValue(vec![0, 1, 2, 255])),
        attr(
            "nested",
            V::KvlistValue(KeyValueList {
                values: vec![sattr("inner", "x")],
            }),
        ),
        attr(
            "mixed",
            V::ArrayValue(ArrayValue {
                values: vec![opentelemetry_proto::tonic::common::v1::AnyValue {
                    value: Some(V::IntValue(1)),
                }],
            }),
        ),
    ];
    root.trace_state = "vendor=1".into();
    root.flags = 0x101;
    root.dropped_attributes_count = 3;
    root.dropped_events_count = 1;
    root.dropped_links_count = 2;
    root.events = vec![Event {
        time_unix_nano: T0 + 5,
        name: "first_token".into(),
        attributes: vec![sattr("k", "v")],
        dropped_attributes_count: 1,
    }];
    root.links = vec![Link {
        trace_id: id16(999),
        span_id: id8(999),
        trace_state: "a=b".into(),
        attributes: vec![sattr("link", "1")],
        dropped_attributes_count: 0,
        flags: 1,
    }];
    root.status = Some(Status {
        code: 2,
        message: "upstream failed".into(),
    });
    let mut tokens = Vec::new();
    for i in 0..50u64 {
        let mut t = span(
            trace,
            100 + i,
            Some(1),
            "llm.decode.token",
            T0 + 400_000_000 + i * 25_000_000,
            T0 + 420_000_000 + i * 25_000_000,
        );
        t.kind = 1;
        t.attributes = vec![
            attr("llm.token.index", V::IntValue(i as i64)),
            attr(
                "llm.token.latency_ms",
                V::DoubleValue(20.0 + i as f64 / 10.0),
            ),
        ];
        tokens.push(t);
    }
    let mut req = request("inference-engine", vec![root]);
    req.resource_spans.push(
        request("inference-engine-tokens", tokens)
            .resource_spans
            .remove(0),
    );
    req
}

/// Content capture on: these tests read back what they sent, prompts included (redaction has
/// tests of its own).
const CAPTURE: &[&str] = &["--capture-content", "true"];

#[tokio::test(flavor = "multi_thread")]
async fn protobuf_over_http_reads_back_equal_before_and_after_flush() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Weft::start(dir.path(), CAPTURE);
    let c = Client::new();
    let trace = id16(1);
    let sent = rich_trace(&trace);
    let r = post_proto(&c, &w, &sent, None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.content_type, "application/x-protobuf");
    let got = get_trace_proto(&c, &w, &trace, None)
        .await
        .expect("trace is queryable at once");
    assert_eq!(flatten(&got), flatten(&sent));
    // a clean shutdown flushes the head into blocks; the trace then comes from columns
    assert!(w.terminate());
    w.restart();
    let got = get_trace_proto(&c, &w, &trace, None)
        .await
        .expect("trace after restart");
    assert_eq!(flatten(&got), flatten(&sent));
    let metrics = metrics(&c, &w).await;
    assert!(
        metrics.contains("weft_head_rows 0"),
        "flushed on SIGTERM:\n{metrics}"
    );
    for name in [
        "weft_spans_accepted_total",
        "weft_spans_rejected_total{reason=\"invalid_id\"}",
        "weft_request_duration_seconds_bucket{route=\"GET /api/v1/traces/{trace_id}\"",
        "weft_background_runs_total{task=\"flush\"}",
        "weft_background_failures_total{task=\"merge\"} 0",
        "weft_background_panics_total{task=\"retention\"} 0",
        "weft_blocks_expired_total",
        "weft_merges_total",
        "weft_wal_writes_total",
        "weft_flush_seconds_sum",
        "weft_blocks ",
        "weft_rocksdb_live_sst_bytes",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn json_over_http_with_gzip_reads_back_as_otlp_json() {
    let dir = tempfile::tempdir().unwrap();
    let w = Weft::start(dir.path(), CAPTURE);
    let c = Client::new();
    let body = serde_json::json!({"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "llm-gateway"}}]},
        "scopeSpans": [{"scope": {"name": "curl"}, "spans": [
            {"traceId": "5B8EFFF798038103D269B633813FC60C", "spanId": "EEE19B7EC3C1B174", "name": "chat llama", "kind": 3,
             "startTimeUnixNano": "1764460800000000000", "endTimeUnixNano": 1764460800250000000u64,
             "attributes": [{"key": "gen_ai.usage.completion_tokens", "value": {"intValue": "42"}}, {"key": "ratio", "value": {"doubleValue": 0.5}}],
             "status": {"code": 1}}]}]}]});
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, body.to_string().as_bytes()).unwrap();
    let r = c
        .post(
            &format!("{}/v1/traces", w.otlp),
            &[
                ("content-type", "application/json"),
                ("content-encoding", "gzip"),
            ],
            gz.finish().unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.content_type, "application/json");
    let r = c
        .get(
            &format!("{}/api/v1/traces/5b8efff798038103d269b633813fc60c", w.http),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let doc = r.json().unwrap();
    let s = &doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
    assert_eq!(s["traceId"], "5b8efff798038103d269b633813fc60c");
    assert_eq!(s["spanId"], "eee19b7ec3c1b174");
    assert_eq!(s["startTimeUnixNano"], "1764460800000000000");
    assert_eq!(s["endTimeUnixNano"], "1764460800250000000");
    assert_eq!(s["kind"], 3);
    assert_eq!(s["status"]["code"], 1);
    let attrs = s["attributes"].as_array().unwrap();
    assert!(attrs.iter().any(|a| a["key"] == "gen_ai.usage.completion_tokens" && a["value"]["intValue"] == "42"), "{attrs:?}");
    assert!(
        attrs
            .iter()
            .any(|a| a["key"] == "ratio" && a["value"]["doubleValue"] == 0.5)
    );
    assert_eq!(
        doc["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"],
        "llm-gateway"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_with_gzip_and_tenant_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let w = Weft::start(dir.path(), CAPTURE);
    let c = Client::new();
    let mut client = TraceServiceClient::connect(w.grpc.clone())
        .await
        .unwrap()
        .send_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Gzip);
    let trace = id16(7);
    let sent = rich_trace(&trace);
    let mut req = tonic::Request::new(sent.clone());
    req.metadata_mut()
        .insert("x-scope-orgid", "team-a".parse().unwrap());
    let resp = client.export(req).await.unwrap().into_inner();
    assert_eq!(resp.partial_success, None);
    let got = get_trace_proto(&c, &w, &trace, Some("team-a"))
        .await
        .expect("tenant team-a sees it");
    assert_eq!(flatten(&got), flatten(&sent));
    assert!(
        get_trace_proto(&c, &w, &trace, None).await.is_none(),
        "the default tenant does not"
    );
    assert!(
        get_trace_proto(&c, &w, &trace, Some("team-b"))
            .await
            .is_none(),
        "nor does team-b"
    );
    let found = search(&c, &w, "service=inference-engine", Some("team-b")).await;
    assert_eq!(found["traces"].as_array().unwrap().len(), 0);
    let found = search(&c, &w, "service=inference-engine", Some("team-a")).await;
    assert_eq!(found["traces"].as_array().unwrap().len(), 1);

    // invalid spans get partial success over gRPC too
    let mut bad = request("svc", vec![span(&trace, 5000, None, "x", T0 + 10, T0)]);
    bad.resource_spans[0].scope_spans[0]
        .spans
        .push(span(&trace, 5001, None, "ok", T0, T0 + 10));
    let resp = client.export(bad).await.unwrap().into_inner();
    let partial = resp.partial_success.expect("partial success");
    assert_eq!(partial.rejected_spans, 1);
    assert!(
        partial.error_message.contains(
            "span 0 of scope 0 of resource 0: end_time_unix_nano is before start_time_unix_nano"
        ),
        "{}",
        partial.error_message
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_span_trace_and_retried_batches_are_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Weft::start(dir.path(), &["--flush-rows", "3000"]);
    let c = Client::new();
    let trace = id16(10_000);
    let mut batches = Vec::new();
    for b in 0..5u64 {
        let spans = (0..2000u64).map(|i| {
            let n = b * 2000 + i;
            span(
                &trace,
                10 + n,
                if n == 0 { None } else { Some(10) },
                if n == 0 { "root" } else { "llm.decode.token" },
                T0 + n * 1000,
                T0 + n * 1000 + 900,
            )
        });
        batches.push(request("inference-engine", spans.collect()));
    }
    for b in &batches {
        assert_eq!(post_proto(&c, &w, b, None).await.status, 200);
    }
    // a client retry of an already acknowledged batch, before and after a restart
    assert_eq!(post_proto(&c, &w, &batches[2], None).await.status, 200);
    let got = get_trace_proto(&c, &w, &trace, None).await.unwrap();
    assert_eq!(flatten(&got).len(), 10_000);
    assert!(w.terminate());
    w.restart();
    assert_eq!(post_proto(&c, &w, &batches[4], None).await.status, 200);
    let got = get_trace_proto(&c, &w, &trace, None).await.unwrap();
    let spans = flatten(&got);
    assert_eq!(spans.len(), 10_000);
    let found = search(&c, &w, "name=root", None).await;
    assert_eq!(found["traces"][0]["span_count"], 10_000);
    assert_eq!(found["traces"][0]["root_name"], "root");
}

/// One tenant too many: 429 naming `--max-tenants` (with `Retry-After`); the tenants already
/// known go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_past_max_tenants_is_refused_with_the_limit_named() {
    let dir = tempfile::tempdir().unwrap();
    let w = Weft::start(dir.path(), &["--max-tenants", "1"]);
    let c = Client::new();
    let body = |n: u64| {
        prost::Message::encode_to_vec(&request(
            "tenants",
            vec![span(&id16(n), n, None, "w", T0, T0 + 1)],
        ))
    };
    let send = |tenant: &'static str, n: u64| {
        let (c, url) = (&c, format!("{}/v1/traces", w.otlp));
        async move {
            c.post(
                &url,
                &[
                    ("content-type", "application/x-protobuf"),
                    ("x-scope-orgid", tenant),
                ],
                body(n),
            )
            .await
            .unwrap()
        }
    };
    assert_eq!(send("acme", 1).await.status, 200);
    let refused = send("globex", 2).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert!(
        refused.text().contains("--max-tenants"),
        "{}",
        refused.text()
    );
    assert!(refused.retry_after.is_some());
    assert_eq!(send("acme", 3).await.status, 200);
}

/// Bodies are admitted before they are read: a slow client holding most of the body budget
/// (`--ingest-memory`, a fifth of it for bodies) makes the next request's declared length a
/// retryable 429 at once, before its body is read, and an OTLP/gRPC export RESOURCE_EXHAUSTED
/// as its message streams in; once the slow body is in, the budget returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_admitted_by_declared_length_before_they_are_read() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    // 5 MiB: bodies being read may hold 1 MiB
    let w = Weft::start(dir.path(), &["--ingest-memory", "5242880"]);
    let addr = w.otlp.trim_start_matches("http://").to_owned();
    let body = prost::Message::encode_to_vec(&request(
        "slow",
        vec![span(&id16(7), 7, None, "w", T0, T0 + 1)],
    ));
    // a slow client: declares 900 KiB, sends a little
    let declared = 900 << 10;
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        slow,
        "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: {declared}\r\n\r\n"
    )
    .unwrap();
    slow.write_all(&body).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));

    let c = Client::new();
    let headers = [("content-type", "application/x-protobuf")];
    let url = format!("{}/v1/traces", w.otlp);
    let big = vec![0u8; 300 << 10];
    let r = c.post(&url, &headers, big).await.unwrap();
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(r.retry_after.is_some());
    // a gRPC export too: its message is refused as it streams in, before tonic has read it
    // (admitted by its size only after decoding, it would be taken)
    let many = request(
        "grpc",
        (0..6000)
            .map(|i| span(&id16(9), i + 1, None, "a-span-name", T0, T0 + 1))
            .collect(),
    );
    assert!(prost::Message::encoded_len(&many) > 300 << 10);
    let mut grpc = TraceServiceClient::connect(w.grpc.clone()).await.unwrap();
    let status = grpc.export(many).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(!status.details().is_empty(), "with RetryInfo");

    // the slow body arrives (padded with a field the decoder skips: unknown field 15, bytes)
    let pad = declared - body.len();
    let l = pad - 4; // a three-byte length: 16 KiB <= l < 2 MiB
    let mut rest = vec![
        (15 << 3) | 2,
        (l & 0x7f) as u8 | 0x80,
        ((l >> 7) & 0x7f) as u8 | 0x80,
        (l >> 14) as u8,
    ];
    rest.resize(pad, 0);
    slow.write_all(&rest).unwrap();
    let mut answer = [0u8; 12];
    slow.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");
    drop(slow);
    let r = c
        .post(
            &url,
            &headers,
            prost::Message::encode_to_vec(&request(
                "after",
                vec![span(&id16(8), 8, None, "w", T0, T0 + 1)],
            )),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Attribute count, key length, events and links per span are limited: a span past one is
/// refused alone, and `partial_success` names the limit and its flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_past_the_shape_limits_are_refused_alone_and_the_limit_named() {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
    use prost::Message;
    let dir = tempfile::tempdir().unwrap();
    let w = Weft::start(
        dir.path(),
        &[
            "--max-attributes",
            "2",
            "--max-attribute-key-bytes",
            "16",
            "--max-span-events",
            "1",
            "--max-span-links",
            "1",
        ],
    );
    let c = Client::new();
    let trace = id16(0x51);
    let mut spans: Vec<_> = (0..5u64)
        .map(|i| span(&trace, i + 1, None, "s", T0, T0 + 10))
        .collect();
    spans[1].attributes = vec![sattr("a", "1"), sattr("b", "2"), sattr("c", "3")];
    spans[2].attributes = vec![sattr("a-key-longer-than-sixteen-bytes", "1")];
    spans[3].events = vec![Event::default(), Event::default()];
    spans[4].links = vec![
        Link {
            trace_id: trace.clone(),
            span_id: id8(1),
            ..Default::default()
        };
        2
    ];
    let expect = [
        "3 attributes, above the limit of 2 (--max-attributes)",
        "above the limit of 16 bytes (--max-attribute-key-bytes)",
        "2 events, above the limit of 1 (--max-span-events)",
        "2 links, above the limit of 1 (--max-span-links)",
    ];
    for (i, message) in expect.iter().enumerate() {
        let one = vec![spans[0].clone(), spans[i + 1].clone()];
        let r = post_proto(&c, &w, &request("shape", one), None).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let resp = ExportTraceServiceResponse::decode(r.body).unwrap();
        let partial = resp.partial_success.expect("partial success");
        assert_eq!(partial.rejected_spans, 1);
        assert!(
            partial.error_message.contains(message),
            "{}",
            partial.error_message
        );
    }
    let rows = sql_rows(&c, &w, None, "SELECT count(*) FROM spans").await;
    assert_eq!(rows[0][0], 1, "the valid span, stored once");
}
