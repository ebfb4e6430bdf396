use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;
pub use weft_bench::client::{Client, Reply};

pub fn attr(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }
}

pub fn sattr(key: &str, v: &str) -> KeyValue {
    attr(key, any_value::Value::StringValue(v.into()))
}

pub fn id16(n: u64) -> Vec<u8> {
    let mut v = vec![0xab; 8];
    v.extend_from_slice(&n.to_be_bytes());
    v
}

pub fn id8(n: u64) -> Vec<u8> {
    (n | 1 << 60).to_be_bytes().to_vec()
}

pub const T0: u64 = 1_764_460_800_000_000_000;

pub fn span(trace: &[u8], id: u64, parent: Option<u64>, name: &str, start: u64, end: u64) -> Span {
    Span {
        trace_id: trace.to_vec(),
        span_id: id8(id),
        parent_span_id: parent.map(id8).unwrap_or_default(),
        name: name.into(),
        kind: 2,
        start_time_unix_nano: start,
        end_time_unix_nano: end,
        status: Some(Status::default()),
        ..Default::default()
    }
}

pub fn request(service: &str, spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![sattr("service.name", service)],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "e2e".into(),
                    version: "1".into(),
                    ..Default::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

pub async fn post_proto(
    c: &Client,
    w: &weft_tests::Weft,
    req: &ExportTraceServiceRequest,
    tenant: Option<&str>,
) -> Reply {
    let mut headers = vec![("content-type", "application/x-protobuf")];
    if let Some(t) = tenant {
        headers.push(("x-scope-orgid", t));
    }
    c.post(
        &format!("{}/v1/traces", w.otlp),
        &headers,
        Bytes::from(req.encode_to_vec()),
    )
    .await
    .unwrap()
}

pub async fn get_trace_proto(
    c: &Client,
    w: &weft_tests::Weft,
    trace: &[u8],
    tenant: Option<&str>,
) -> Option<ExportTraceServiceRequest> {
    let mut headers = vec![("accept", "application/x-protobuf")];
    if let Some(t) = tenant {
        headers.push(("x-scope-orgid", t));
    }
    let r = c
        .get(
            &format!("{}/api/v1/traces/{}", w.http, hex::encode(trace)),
            &headers,
        )
        .await
        .unwrap();
    match r.status.as_u16() {
        200 => Some(ExportTraceServiceRequest::decode(&r.body[..]).unwrap()),
        404 => None,
        s => panic!("trace read answered {s}: {}", r.text()),
    }
}

/// All spans of a message with their service, attributes sorted by key, ordered by span id.
pub fn flatten(req: &ExportTraceServiceRequest) -> Vec<(String, Span)> {
    let mut out = Vec::new();
    for rs in &req.resource_spans {
        let service = rs
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
            .and_then(|a| a.value.as_ref())
            .map(|v| format!("{v:?}"))
            .unwrap_or_default();
        for ss in &rs.scope_spans {
            for s in &ss.spans {
                let mut s = s.clone();
                s.attributes.sort_by(|a, b| a.key.cmp(&b.key));
                out.push((service.clone(), s));
            }
        }
    }
    out.sort_by(|a, b| a.1.span_id.cmp(&b.1.span_id));
    out
}

pub async fn search(
    c: &Client,
    w: &weft_tests::Weft,
    query: &str,
    tenant: Option<&str>,
) -> serde_json::Value {
    let headers: Vec<(&str, &str)> = tenant
        .map(|t| vec![("x-scope-orgid", t)])
        .unwrap_or_default();
    let r = c
        .get(&format!("{}/api/v1/search?{query}", w.http), &headers)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "search {query}: {}", r.text());
    r.json().unwrap()
}

pub async fn metrics(c: &Client, w: &weft_tests::Weft) -> String {
    c.get(&format!("{}/metrics", w.http), &[])
        .await
        .unwrap()
        .text()
}

/// Sends generated traces over OTLP/HTTP protobuf (2,000-span messages), each acknowledged.
pub async fn send_generated(
    c: &Client,
    w: &weft_tests::Weft,
    cfg: weft_bench::generator::GenConfig,
    tenant: Option<&str>,
) {
    let mut headers = vec![("content-type", "application/x-protobuf")];
    headers.extend(tenant.map(|t| ("x-scope-orgid", t)));
    for m in weft_bench::generator::batches(cfg, 2000) {
        let r = c
            .post(
                &format!("{}/v1/traces", w.otlp),
                &headers,
                m.encode_to_vec(),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
}

/// The rows of a SQL query over HTTP (JSON), which must succeed.
pub async fn sql_rows(
    c: &Client,
    w: &weft_tests::Weft,
    tenant: Option<&str>,
    query: &str,
) -> Vec<serde_json::Value> {
    let mut headers = vec![("content-type", "application/json")];
    headers.extend(tenant.map(|t| ("x-scope-orgid", t)));
    let r = c
        .post(
            &format!("{}/api/v1/sql", w.http),
            &headers,
            serde_json::json!({ "query": query }).to_string(),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{query}: {}", r.text());
    r.json().unwrap()["rows"].as_array().unwrap().clone()
}

/// How many spans OTLP resource spans hold.
pub fn span_count(resource_spans: &[ResourceSpans]) -> usize {
    resource_spans
        .iter()
        .flat_map(|rs| &rs.scope_spans)
        .map(|ss| ss.spans.len())
        .sum()
}
