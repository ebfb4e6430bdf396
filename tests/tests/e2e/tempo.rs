//! Tempo's API as Grafana's Tempo data source calls it, against the real binary fed generator
//! data over OTLP/HTTP: every endpoint's response shape checked as the data source's parsers
//! read it (protobuf decoded with `tempopb` message definitions written here from
//! `tempo.proto`, JSON checked for key sets and types), and a battery of TraceQL queries whose
//! answers are compared with SQL written independently over the same data.

use std::collections::{BTreeMap, BTreeSet};

use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, TracesData};
use prost::Message;
use serde_json::Value;
use weft_bench::generator::GenConfig;
use weft_tests::Weft;

use crate::common::*;

const TENANT: &str = "tempo";

fn data() -> GenConfig {
    GenConfig {
        seed: 5,
        spans: 20_000,
        rate: 10.0,
        min_tokens: 8,
        max_tokens: 16,
        ..Default::default()
    }
}

// tempo.proto, as the data source decodes it
#[derive(Clone, PartialEq, Message)]
struct TempoTrace {
    #[prost(message, repeated, tag = "1")]
    resource_spans: Vec<ResourceSpans>,
}
#[derive(Clone, PartialEq, Message)]
struct TraceByIdMetrics {
    #[prost(uint64, tag = "1")]
    inspected_bytes: u64,
}
#[derive(Clone, PartialEq, Message)]
struct TraceByIdResponse {
    #[prost(message, optional, tag = "1")]
    trace: Option<TempoTrace>,
    #[prost(message, optional, tag = "2")]
    metrics: Option<TraceByIdMetrics>,
    #[prost(int32, tag = "3")]
    status: i32,
    #[prost(string, tag = "4")]
    message: String,
}

struct Api<'a> {
    c: &'a Client,
    w: &'a Weft,
}

impl Api<'_> {
    async fn get(&self, path: &str, accept: &str) -> Reply {
        self.c
            .get(
                &format!("{}{path}", self.w.http),
                &[("x-scope-orgid", TENANT), ("accept", accept)],
            )
            .await
            .unwrap()
    }

    async fn json(&self, path: &str) -> Value {
        let r = self.get(path, "application/json").await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        r.json().unwrap()
    }

    async fn sql(&self, query: &str) -> Vec<Value> {
        sql_rows(self.c, self.w, Some(TENANT), query).await
    }

    /// Trace id (32 hex) → matched spans, as TraceQL search answers.
    async fn traceql(&self, q: &str) -> BTreeMap<String, u64> {
        self.traceql_page(q, 10_000).await.into_iter().collect()
    }

    /// The same, newest trace first, for a page of `limit` traces.
    async fn traceql_page(&self, q: &str, limit: usize) -> Vec<(String, u64)> {
        let body = self
            .json(&format!("/api/search?q={}&limit={limit}&spss=3", encode(q)))
            .await;
        let mut out = Vec::new();
        for t in body["traces"].as_array().unwrap() {
            let id = format!("{:0>32}", t["traceID"].as_str().unwrap());
            let matched: u64 = t["spanSets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["matched"].as_u64().unwrap())
                .sum();
            out.push((id, matched));
        }
        out
    }

    /// The same from SQL returning `(trace_id, span_id)` rows.
    async fn sql_matches(&self, select: &str) -> BTreeMap<String, u64> {
        let rows = self
            .sql(&format!(
                "SELECT trace_id, count(*) FROM (SELECT DISTINCT trace_id, span_id FROM ({select}) x) y GROUP BY trace_id"
            ))
            .await;
        rows.iter()
            .map(|r| (r[0].as_str().unwrap().to_owned(), r[1].as_u64().unwrap()))
            .collect()
    }
}

fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object().unwrap().keys().map(String::as_str).collect()
}

fn is_u64_string(v: &Value) -> bool {
    v.as_str().is_some_and(|s| s.parse::<u64>().is_ok())
}

/// Each atom: a TraceQL field expression and the SQL predicate that says the same.
const ATOMS: &[(&str, &str)] = &[
    (r#"name = "llm.generate""#, "name = 'llm.generate'"),
    (r#"name = "llm.prefill""#, "name = 'llm.prefill'"),
    (
        r#"name != "llm.decode.token""#,
        "name <> 'llm.decode.token'",
    ),
    (r#"name =~ "chat.*""#, "name LIKE 'chat%'"),
    (
        r#"resource.service.name = "llm-gateway""#,
        "service_name = 'llm-gateway'",
    ),
    (
        r#"resource.service.name = "inference-engine""#,
        "service_name = 'inference-engine'",
    ),
    (
        r#".service.name = "rag-retriever""#,
        "service_name = 'rag-retriever'",
    ),
    ("kind = server", "kind = 'SERVER'"),
    ("kind = client", "kind = 'CLIENT'"),
    ("status = error", "status_code = 'ERROR'"),
    ("status != error", "status_code <> 'ERROR'"),
    ("duration > 500ms", "duration_ns > 500000000"),
    ("duration < 30ms", "duration_ns < 30000000"),
    (
        r#"span.llm.model_version = "llama-3.1-8b-2025-10""#,
        "\"llm.model_version\" = 'llama-3.1-8b-2025-10'",
    ),
    (
        r#"span.llm.lora_adapter = "sql-gen-v1""#,
        "\"llm.lora_adapter\" = 'sql-gen-v1'",
    ),
    (
        r#"span.worker.id =~ "worker-[12]""#,
        "\"worker.id\" IN ('worker-1', 'worker-2')",
    ),
    ("span.llm.batch_size >= 16", "\"llm.batch_size\" >= 16"),
    (
        "span.http.response.status_code = 500",
        "attributes['http.response.status_code'] = '500'",
    ),
    (
        r#".gen_ai.request.model = "qwen2.5-32b""#,
        "\"gen_ai.request.model\" = 'qwen2.5-32b'",
    ),
    (
        r#"resource.host.name = "tokenizer-host""#,
        "resource_attributes['host.name'] = 'tokenizer-host'",
    ),
    ("span.llm.token.index < 3", "\"llm.token.index\" < 3"),
    (
        "span.gen_ai.latency.time_to_first_token > 0.3",
        "\"gen_ai.latency.time_to_first_token\" > 0.3",
    ),
    (
        r#"span.llm.kv_cache_strategy != "paged""#,
        "\"llm.kv_cache_strategy\" <> 'paged'",
    ),
    (
        r#"resource.host.name =~ "llm-.*""#,
        "resource_attributes['host.name'] LIKE 'llm-%'",
    ),
    (
        r#"!(resource.service.name = "inference-engine")"#,
        "service_name <> 'inference-engine'",
    ),
    (
        r#"span.tenant.id != nil"#,
        "attributes['tenant.id'] IS NOT NULL",
    ),
];

fn atom(i: usize) -> (&'static str, String) {
    (ATOMS[i].0, format!("({})", ATOMS[i].1))
}

/// TraceQL queries and the SQL (rows of matched `trace_id, span_id`) that answers each.
fn battery() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let spans = |p: &str| format!("SELECT trace_id, span_id FROM spans WHERE {p}");
    // one condition
    for i in 0..ATOMS.len() {
        let (q, p) = atom(i);
        out.push((format!("{{ {q} }}"), spans(&p)));
    }
    out.push(("{ }".into(), spans("TRUE")));
    // two conditions on one span
    for (a, b) in [
        (0, 13),
        (7, 4),
        (11, 5),
        (9, 4),
        (1, 12),
        (20, 5),
        (16, 14),
        (3, 18),
    ] {
        let ((qa, pa), (qb, pb)) = (atom(a), atom(b));
        out.push((
            format!("{{ {qa} && {qb} }}"),
            spans(&format!("{pa} AND {pb}")),
        ));
    }
    for (a, b) in [(1, 9), (12, 19), (4, 6), (11, 17)] {
        let ((qa, pa), (qb, pb)) = (atom(a), atom(b));
        out.push((
            format!("{{ {qa} || {qb} }}"),
            spans(&format!("{pa} OR {pb}")),
        ));
    }
    // two spansets in one trace: the spans of both
    for (a, b) in [(9, 0), (13, 14), (4, 11), (19, 21), (10, 6), (15, 17)] {
        let ((qa, pa), (qb, pb)) = (atom(a), atom(b));
        out.push((
            format!("{{ {qa} }} && {{ {qb} }}"),
            format!(
                "{} AND trace_id IN (SELECT trace_id FROM spans WHERE {pa}) AND trace_id IN (SELECT trace_id FROM spans WHERE {pb})",
                spans(&format!("({pa} OR {pb})"))
            ),
        ));
    }
    for (a, b) in [(9, 1), (14, 23)] {
        let ((qa, pa), (qb, pb)) = (atom(a), atom(b));
        out.push((
            format!("{{ {qa} }} || {{ {qb} }}"),
            spans(&format!("{pa} OR {pb}")),
        ));
    }
    // structure: child, parent, sibling, descendant, ancestor
    let pair = |a: usize, b: usize| {
        let ((qa, pa), (qb, pb)) = (atom(a), atom(b));
        (qa, qb, pa, pb)
    };
    for (a, b) in [(8, 0), (4, 3), (0, 20), (5, 1)] {
        let (qa, qb, pa, pb) = pair(a, b);
        out.push((
            format!("{{ {qa} }} > {{ {qb} }}"),
            format!(
                "SELECT r.trace_id, r.span_id FROM (SELECT * FROM spans WHERE {pb}) r JOIN (SELECT trace_id, span_id FROM spans WHERE {pa}) l ON l.trace_id = r.trace_id AND l.span_id = r.parent_span_id"
            ),
        ));
    }
    for (a, b) in [(0, 8), (20, 0)] {
        let (qa, qb, pa, pb) = pair(a, b);
        out.push((
            format!("{{ {qa} }} < {{ {qb} }}"),
            format!(
                "SELECT r.trace_id, r.span_id FROM (SELECT * FROM spans WHERE {pb}) r JOIN (SELECT trace_id, parent_span_id FROM spans WHERE {pa}) l ON l.trace_id = r.trace_id AND l.parent_span_id = r.span_id"
            ),
        ));
    }
    for (a, b) in [(1, 20), (20, 1), (5, 2)] {
        let (qa, qb, pa, pb) = pair(a, b);
        out.push((
            format!("{{ {qa} }} ~ {{ {qb} }}"),
            format!(
                "SELECT r.trace_id, r.span_id FROM (SELECT * FROM spans WHERE {pb}) r JOIN (SELECT trace_id, span_id, parent_span_id FROM spans WHERE {pa}) l ON l.trace_id = r.trace_id AND l.parent_span_id = r.parent_span_id AND l.span_id <> r.span_id"
            ),
        ));
    }
    // descendants: the generator's traces are at most five levels deep
    let ancestors = "SELECT s.trace_id, s.span_id, a1.span_id AS a1, a2.span_id AS a2, a3.span_id AS a3, a4.span_id AS a4 FROM spans s \
        LEFT JOIN spans a1 ON a1.trace_id = s.trace_id AND a1.span_id = s.parent_span_id \
        LEFT JOIN spans a2 ON a2.trace_id = s.trace_id AND a2.span_id = a1.parent_span_id \
        LEFT JOIN spans a3 ON a3.trace_id = s.trace_id AND a3.span_id = a2.parent_span_id \
        LEFT JOIN spans a4 ON a4.trace_id = s.trace_id AND a4.span_id = a3.parent_span_id";
    for (a, b) in [(4, 20), (8, 1), (7, 1)] {
        let (qa, qb, pa, pb) = pair(a, b);
        out.push((
            format!("{{ {qa} }} >> {{ {qb} }}"),
            format!(
                "SELECT x.trace_id, x.span_id FROM ({ancestors}) x JOIN (SELECT trace_id, span_id FROM spans WHERE {pa}) l ON l.trace_id = x.trace_id AND l.span_id IN (x.a1, x.a2, x.a3, x.a4) WHERE x.span_id IN (SELECT span_id FROM spans WHERE {pb})"
            ),
        ));
    }
    for (a, b) in [(20, 4), (1, 8)] {
        let (qa, qb, pa, pb) = pair(a, b);
        out.push((
            format!("{{ {qa} }} << {{ {qb} }}"),
            format!(
                "SELECT r.trace_id, r.span_id FROM (SELECT * FROM spans WHERE {pb}) r JOIN ({ancestors}) x ON x.trace_id = r.trace_id AND r.span_id IN (x.a1, x.a2, x.a3, x.a4) WHERE x.span_id IN (SELECT span_id FROM spans WHERE {pa})"
            ),
        ));
    }
    // pipelines
    for (a, n) in [(5, 15), (10, 15), (4, 1)] {
        let (q, p) = atom(a);
        out.push((
            format!("{{ {q} }} | count() > {n}"),
            format!(
                "{} AND trace_id IN (SELECT trace_id FROM spans WHERE {p} GROUP BY trace_id HAVING count(*) > {n})",
                spans(&p)
            ),
        ));
    }
    for (a, d) in [(20, "25ms"), (0, "1s")] {
        let (q, p) = atom(a);
        let ns = if d == "25ms" {
            25_000_000
        } else {
            1_000_000_000
        };
        out.push((
            format!("{{ {q} }} | avg(duration) > {d}"),
            format!(
                "{} AND trace_id IN (SELECT trace_id FROM spans WHERE {p} GROUP BY trace_id HAVING avg(duration_ns) > {ns})",
                spans(&p)
            ),
        ));
    }
    out.push((
        r#"{ name = "llm.decode.token" } | max(span.llm.token.index) >= 15"#.into(),
        "SELECT trace_id, span_id FROM spans WHERE name = 'llm.decode.token' AND trace_id IN (SELECT trace_id FROM spans WHERE name = 'llm.decode.token' GROUP BY trace_id HAVING max(\"llm.token.index\") >= 15)".into(),
    ));
    // trace-level intrinsics
    out.push((
        r#"{ trace:duration > 1s && name = "llm.generate" }"#.into(),
        "SELECT s.trace_id, s.span_id FROM spans s JOIN traces t ON t.trace_id = s.trace_id WHERE t.duration_ns > 1000000000 AND s.name = 'llm.generate'".into(),
    ));
    out.push((
        r#"{ trace:rootService = "llm-gateway" && status = error }"#.into(),
        "SELECT s.trace_id, s.span_id FROM spans s JOIN traces t ON t.trace_id = s.trace_id WHERE t.root_service = 'llm-gateway' AND s.status_code = 'ERROR'".into(),
    ));
    out.push((
        r#"({ status = error } | count() > 1) && { span.llm.lora_adapter = "none" }"#.into(),
        "SELECT trace_id, span_id FROM spans WHERE (status_code = 'ERROR' AND trace_id IN (SELECT trace_id FROM spans WHERE status_code = 'ERROR' GROUP BY trace_id HAVING count(*) > 1) OR \"llm.lora_adapter\" = 'none') AND trace_id IN (SELECT trace_id FROM spans WHERE status_code = 'ERROR' GROUP BY trace_id HAVING count(*) > 1) AND trace_id IN (SELECT trace_id FROM spans WHERE \"llm.lora_adapter\" = 'none')".into(),
    ));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tempo_api_answers_grafana_and_traceql_agrees_with_sql() {
    let dir = tempfile::tempdir().unwrap();
    let w = Weft::start(dir.path(), &[]);
    let c = Client::new();
    send_generated(&c, &w, data(), Some(TENANT)).await;
    let api = Api { c: &c, w: &w };

    // echo and build info
    let r = api.get("/api/echo", "*/*").await;
    assert_eq!((r.status.as_u16(), r.text().as_str()), (200, "echo"));
    let info = api.json("/api/status/buildinfo").await;
    assert_eq!(
        keys(&info),
        BTreeSet::from([
            "version",
            "revision",
            "branch",
            "buildUser",
            "buildDate",
            "goVersion"
        ])
    );
    let version = info["version"].as_str().unwrap();
    assert_eq!(
        version
            .split('.')
            .filter(|p| p.parse::<u64>().is_ok())
            .count(),
        3,
        "{version}"
    );

    // trace by id: a trace with a leading zero nibble, asked by its short id too
    let rows = api
        .sql("SELECT trace_id, count(*) FROM spans GROUP BY trace_id ORDER BY trace_id LIMIT 1")
        .await;
    let (id, count) = (
        rows[0][0].as_str().unwrap().to_owned(),
        rows[0][1].as_u64().unwrap(),
    );
    let short = id.trim_start_matches('0');
    for path in [format!("/api/traces/{id}"), format!("/api/traces/{short}")] {
        let r = api.get(&path, "application/protobuf").await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let data = TracesData::decode(r.body.clone()).unwrap();
        assert_eq!(span_count(&data.resource_spans) as u64, count, "{path}");
    }
    let r = api
        .get(&format!("/api/v2/traces/{short}"), "application/protobuf")
        .await;
    assert_eq!(r.status, 200);
    let v2 = TraceByIdResponse::decode(r.body.clone()).unwrap();
    assert_eq!(v2.status, 0);
    assert_eq!(span_count(&v2.trace.unwrap().resource_spans) as u64, count);
    let j = api.json(&format!("/api/v2/traces/{id}")).await;
    assert!(j["trace"]["resourceSpans"].is_array(), "{j}");
    let j = api.json(&format!("/api/traces/{id}")).await;
    assert!(j["resourceSpans"].is_array(), "{j}");
    let unknown = "1234567890abcdef1234567890abcdef";
    assert_eq!(
        api.get(&format!("/api/traces/{unknown}"), "application/protobuf")
            .await
            .status,
        404
    );
    assert_eq!(
        api.get(&format!("/api/v2/traces/{unknown}"), "application/protobuf")
            .await
            .status,
        404
    );
    let bad = api.get("/api/traces/not-hex", "application/protobuf").await;
    assert_eq!(bad.status, 400);
    assert!(bad.text().contains("hex"), "{}", bad.text());
    // a range the trace is not in: not found
    assert_eq!(
        api.get(
            &format!("/api/traces/{id}?start=1000&end=2000"),
            "application/protobuf"
        )
        .await
        .status,
        404
    );

    // search: the shapes Grafana's parsers take
    let body = api
        .json(&format!(
            "/api/search?q={}&limit=5&spss=2&start=1764460000&end=1764470000",
            encode(r#"{ name = "llm.generate" && duration > 100ms }"#)
        ))
        .await;
    assert_eq!(keys(&body), BTreeSet::from(["traces", "metrics"]));
    let traces = body["traces"].as_array().unwrap();
    assert_eq!(traces.len(), 5, "{body}");
    let mut last = u64::MAX;
    for t in traces {
        let k = keys(t);
        for required in [
            "traceID",
            "rootServiceName",
            "rootTraceName",
            "startTimeUnixNano",
            "durationMs",
            "spanSet",
            "spanSets",
        ] {
            assert!(k.contains(required), "{required} missing: {t}");
        }
        assert!(
            k.iter().all(|k| [
                "traceID",
                "rootServiceName",
                "rootTraceName",
                "startTimeUnixNano",
                "durationMs",
                "spanSet",
                "spanSets",
                "serviceStats"
            ]
            .contains(k)),
            "{t}"
        );
        assert!(!t["traceID"].as_str().unwrap().starts_with('0'));
        assert!(is_u64_string(&t["startTimeUnixNano"]));
        assert!(t["durationMs"].is_u64());
        let start: u64 = t["startTimeUnixNano"].as_str().unwrap().parse().unwrap();
        assert!(start <= last, "newest first");
        last = start;
        assert_eq!(t["rootServiceName"], "llm-gateway");
        for set in t["spanSets"].as_array().unwrap() {
            assert!(
                keys(set)
                    .iter()
                    .all(|k| ["spans", "matched", "attributes"].contains(k))
            );
            assert!(set["matched"].is_u64());
            for s in set["spans"].as_array().unwrap() {
                assert_eq!(
                    keys(s),
                    BTreeSet::from([
                        "spanID",
                        "name",
                        "startTimeUnixNano",
                        "durationNanos",
                        "attributes"
                    ])
                );
                assert_eq!(s["spanID"].as_str().unwrap().len(), 16);
                assert_eq!(s["name"], "llm.generate");
                assert!(
                    is_u64_string(&s["startTimeUnixNano"]) && is_u64_string(&s["durationNanos"])
                );
                let d: u64 = s["durationNanos"].as_str().unwrap().parse().unwrap();
                assert!(d > 100_000_000);
                for a in s["attributes"].as_array().unwrap() {
                    assert!(a["key"].is_string() && a["value"].is_object(), "{a}");
                }
            }
        }
    }
    let m = &body["metrics"];
    assert!(m["inspectedTraces"].is_u64() && is_u64_string(&m["inspectedBytes"]));
    assert!(m["completedJobs"].is_u64() && m["totalJobs"].is_u64());

    // legacy search by tags and durations
    let legacy = api
        .json("/api/search?tags=service.name%3Dinference-engine%20name%3Dllm.generate&minDuration=100ms&limit=3")
        .await;
    assert_eq!(legacy["traces"].as_array().unwrap().len(), 3, "{legacy}");
    // by(): one spanset per value, labelled
    let by = api
        .json(&format!(
            "/api/search?q={}&limit=3",
            encode(r#"{ } | by(resource.service.name)"#)
        ))
        .await;
    for t in by["traces"].as_array().unwrap() {
        let sets = t["spanSets"].as_array().unwrap();
        assert!(sets.len() >= 3, "{t}");
        for s in sets {
            assert_eq!(s["attributes"][0]["key"], "service.name", "{s}");
        }
    }
    // bad TraceQL: a 400 naming the part
    let r = api
        .get(
            &format!("/api/search?q={}", encode("{ } | topk(3)")),
            "application/json",
        )
        .await;
    assert_eq!(r.status, 400);
    assert!(r.text().contains("topk"), "{}", r.text());

    // tags and values
    let tags = api
        .json("/api/v2/search/tags?start=1764460000&end=1764470000")
        .await;
    let scopes: BTreeMap<&str, Vec<&str>> = tags["scopes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap(),
                s["tags"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_str().unwrap())
                    .collect(),
            )
        })
        .collect();
    assert!(scopes["resource"].contains(&"service.name"), "{tags}");
    assert!(scopes["resource"].contains(&"host.name"), "{tags}");
    assert!(scopes["span"].contains(&"llm.model_version"), "{tags}");
    assert!(scopes["span"].contains(&"http.route"), "{tags}");
    assert!(scopes["intrinsic"].contains(&"duration"), "{tags}");
    let only = api.json("/api/v2/search/tags?scope=resource").await;
    assert_eq!(only["scopes"].as_array().unwrap().len(), 1);
    let v1 = api.json("/api/search/tags").await;
    assert!(
        v1["tagNames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "llm.lora_adapter")
    );

    let values = api
        .json("/api/v2/search/tag/resource.service.name/values")
        .await;
    let services: BTreeSet<&str> = values["tagValues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            assert_eq!(v["type"], "string");
            v["value"].as_str().unwrap()
        })
        .collect();
    assert_eq!(services.len(), 6, "{values}");
    let batch = api
        .json("/api/v2/search/tag/span.llm.batch_size/values")
        .await;
    assert!(
        batch["tagValues"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["type"] == "int"),
        "{batch}"
    );
    let status = api.json("/api/v2/search/tag/status/values").await;
    assert!(
        status["tagValues"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["type"] == "keyword")
    );
    // twice encoded (older Grafana), and narrowed by a query
    let narrowed = api
        .json(&format!(
            "/api/v2/search/tag/span.llm.model_version/values?q={}",
            encode(r#"{ span.gen_ai.request.model = "qwen2.5-32b" }"#)
        ))
        .await;
    assert_eq!(
        narrowed["tagValues"].as_array().unwrap().len(),
        1,
        "{narrowed}"
    );
    let twice = api
        .json("/api/v2/search/tag/resource%252Eservice%252Ename/values")
        .await;
    assert_eq!(twice["tagValues"].as_array().unwrap().len(), 6, "{twice}");
    let v1 = api.json("/api/search/tag/service.name/values").await;
    assert_eq!(v1["tagValues"].as_array().unwrap().len(), 6, "{v1}");

    // TraceQL metrics: counts per step agree with SQL
    let (start_s, end_s) = (1_764_460_800u64, 1_764_460_800u64 + 3600);
    let range = api
        .json(&format!(
            "/api/metrics/query_range?q={}&start={start_s}&end={end_s}&step=600s",
            encode(r#"{ name = "llm.generate" } | count_over_time() by (span.llm.lora_adapter)"#)
        ))
        .await;
    let series = range["series"].as_array().unwrap();
    assert_eq!(series.len(), 4, "{range}");
    let sql_counts = api
        .sql("SELECT \"llm.lora_adapter\", count(*) FROM spans WHERE name = 'llm.generate' GROUP BY 1")
        .await;
    for s in series {
        let label = &s["labels"][0];
        assert_eq!(label["key"], "span.llm.lora_adapter");
        let adapter = label["value"]["stringValue"].as_str().unwrap();
        let total: f64 = s["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                assert!(is_u64_string(&x["timestampMs"]));
                x["value"].as_f64().unwrap()
            })
            .sum();
        let want = sql_counts.iter().find(|r| r[0] == adapter).unwrap()[1]
            .as_f64()
            .unwrap();
        assert_eq!(total, want, "{adapter}");
        for e in s["exemplars"].as_array().unwrap() {
            assert_eq!(e["labels"][0]["key"], "trace:id");
            assert!(is_u64_string(&e["timestampMs"]));
        }
    }
    let q = api
        .json(&format!(
            "/api/metrics/query_range?q={}&start={start_s}&end={end_s}&step=60s",
            encode(r#"{ name = "llm.decode.token" } | quantile_over_time(duration, .5, .99)"#)
        ))
        .await;
    let ps: Vec<f64> = q["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s["labels"]
                .as_array()
                .unwrap()
                .iter()
                .find(|l| l["key"] == "p")
                .unwrap()["value"]["doubleValue"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert_eq!(ps, vec![0.5, 0.99], "{q}");
    let rate = api
        .json(&format!(
            "/api/metrics/query?q={}&start={start_s}&end={end_s}",
            encode(r#"{ status = error } | rate()"#)
        ))
        .await;
    let errors = api
        .sql("SELECT count(*) FROM spans WHERE status_code = 'ERROR'")
        .await[0][0]
        .as_f64()
        .unwrap();
    let got = rate["series"][0]["value"].as_f64().unwrap();
    assert!((got - errors / 3600.0).abs() < 1e-9, "{rate} vs {errors}");
    let hist = api
        .json(&format!(
            "/api/metrics/query_range?q={}&start={start_s}&end={end_s}&step=600s",
            encode(r#"{ name = "llm.generate" } | histogram_over_time(duration)"#)
        ))
        .await;
    assert!(
        hist["series"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["labels"][0]["key"] == "__bucket"),
        "{hist}"
    );

    // Jaeger, under /jaeger: the envelope, services, operations, search, trace, dependencies
    let envelope = |v: &Value| {
        assert_eq!(
            keys(v),
            BTreeSet::from(["data", "total", "limit", "offset", "errors"]),
            "{v}"
        );
        assert!(v["errors"].is_null(), "{v}");
    };
    let services = api.json("/jaeger/api/services").await;
    envelope(&services);
    assert_eq!(services["data"].as_array().unwrap().len(), 6, "{services}");
    assert_eq!(services["total"], 6);
    let ops = api
        .json("/jaeger/api/services/inference-engine/operations")
        .await;
    envelope(&ops);
    let names: BTreeSet<&str> = ops["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["llm.decode.token", "llm.generate", "llm.prefill"])
    );
    let ops = api
        .json("/jaeger/api/operations?service=inference-engine&spanKind=server")
        .await;
    assert_eq!(
        ops["data"],
        serde_json::json!([{"name": "llm.generate", "spanKind": "server"}])
    );
    let found = api
        .json(&format!(
            "/jaeger/api/traces?service=inference-engine&operation=llm.generate&tags={}&minDuration=100ms&limit=4&start=1764460800000000&end=1764464400000000",
            encode(r#"{"llm.lora_adapter":"sql-gen-v1","error":"true"}"#)
        ))
        .await;
    envelope(&found);
    let traces = found["data"].as_array().unwrap();
    let want = api
        .sql("SELECT count(DISTINCT trace_id) FROM spans WHERE service_name = 'inference-engine' AND name = 'llm.generate' AND \"llm.lora_adapter\" = 'sql-gen-v1' AND status_code = 'ERROR' AND duration_ns >= 100000000")
        .await[0][0]
        .as_u64()
        .unwrap();
    assert_eq!(traces.len() as u64, want.min(4), "{found}");
    assert!(want > 0);
    for t in traces {
        assert_eq!(
            keys(t),
            BTreeSet::from(["traceID", "spans", "processes", "warnings"])
        );
        let generate = t["spans"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["operationName"] == "llm.generate")
            .unwrap();
        assert_eq!(
            keys(generate),
            BTreeSet::from([
                "traceID",
                "spanID",
                "operationName",
                "references",
                "startTime",
                "duration",
                "tags",
                "logs",
                "processID",
                "warnings",
                "flags"
            ])
        );
        assert!(
            generate["startTime"].is_u64() && generate["duration"].as_u64().unwrap() >= 100_000
        );
        assert_eq!(generate["references"][0]["refType"], "CHILD_OF");
        let tags: BTreeMap<&str, &Value> = generate["tags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["key"].as_str().unwrap(), t))
            .collect();
        assert_eq!(tags["llm.lora_adapter"]["value"], "sql-gen-v1");
        assert_eq!(tags["llm.batch_size"]["type"], "int64");
        assert_eq!(tags["error"]["value"], true);
        let process = &t["processes"][generate["processID"].as_str().unwrap()];
        assert_eq!(process["serviceName"], "inference-engine");
    }
    let one = api.json(&format!("/jaeger/api/traces/{short}")).await;
    envelope(&one);
    assert_eq!(
        one["data"][0]["spans"].as_array().unwrap().len() as u64,
        count
    );
    let missing = api
        .get(&format!("/jaeger/api/traces/{unknown}"), "application/json")
        .await;
    assert_eq!(missing.status, 404);
    let body = missing.json().unwrap();
    assert!(
        body["data"].is_null() && body["errors"][0]["code"] == 404,
        "{body}"
    );
    let bad = api
        .get(
            "/jaeger/api/traces?service=x&limit=zero",
            "application/json",
        )
        .await;
    assert_eq!(bad.status, 400);
    assert!(
        bad.json().unwrap()["errors"][0]["msg"]
            .as_str()
            .unwrap()
            .contains("limit")
    );
    let deps = api
        .json("/jaeger/api/dependencies?endTs=1764464400000&lookback=3600000")
        .await;
    envelope(&deps);
    let edges: BTreeMap<(String, String), u64> = deps["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                (
                    d["parent"].as_str().unwrap().to_owned(),
                    d["child"].as_str().unwrap().to_owned(),
                ),
                d["callCount"].as_u64().unwrap(),
            )
        })
        .collect();
    let generates = api
        .sql("SELECT count(*) FROM spans WHERE name = 'llm.generate'")
        .await[0][0]
        .as_u64()
        .unwrap();
    assert_eq!(
        edges[&("llm-gateway".to_owned(), "inference-engine".to_owned())],
        generates,
        "{deps}"
    );

    // the battery: TraceQL and SQL agree on which traces match and how many spans each
    let battery = battery();
    assert!(battery.len() >= 60, "{} queries", battery.len());
    for (q, sql) in &battery {
        let got = api.traceql(q).await;
        let want = api.sql_matches(sql).await;
        assert!(
            !want.is_empty() || q.contains("trace:duration"),
            "{q}: SQL finds nothing, a weak case"
        );
        assert_eq!(got, want, "{q}\nSQL: {sql}");
        // a short page: the newest traces of the whole answer, by start then id
        if !want.is_empty() {
            let list: Vec<String> = want.keys().map(|t| format!("'{t}'")).collect();
            let newest: Vec<(String, u64)> = api
                .sql(&format!(
                    "SELECT trace_id FROM traces WHERE trace_id IN ({}) ORDER BY start_time DESC, trace_id DESC LIMIT 5",
                    list.join(", ")
                ))
                .await
                .iter()
                .map(|r| {
                    let id = r[0].as_str().unwrap().to_owned();
                    let matched = want[&id];
                    (id, matched)
                })
                .collect();
            assert_eq!(
                api.traceql_page(q, 5).await,
                newest,
                "{q}: the newest page of 5"
            );
        }
    }
}

/// A trace larger than `--max-trace-spans` comes back cut to its earliest spans and flagged:
/// a header on the native API and Tempo's v1, `status: PARTIAL` with a message on Tempo's v2
/// (JSON and protobuf), a warning on Jaeger's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_past_max_trace_spans_is_cut_and_flagged_on_every_surface() {
    let dir = tempfile::tempdir().unwrap();
    let w = Weft::start(dir.path(), &["--max-trace-spans", "10"]);
    let c = Client::new();
    let trace = id16(0xabc);
    let spans = (0..25u64)
        .map(|i| {
            span(
                &trace,
                i + 1,
                None,
                "step",
                T0 + i * 1000,
                T0 + i * 1000 + 10,
            )
        })
        .collect();
    let r = post_proto(&c, &w, &request("big", spans), None).await;
    assert_eq!(r.status, 200);
    let hex = hex::encode(&trace);
    let get = |path: String, accept: &'static str| {
        let c = &c;
        async move { c.get(&path, &[("accept", accept)]).await.unwrap() }
    };

    let native = get(
        format!("{}/api/v1/traces/{hex}", w.http),
        "application/json",
    )
    .await;
    assert_eq!(native.headers["weft-trace-truncated"], "25");
    let doc = native.json().unwrap();
    let names = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(names, 10);

    let v1 = get(format!("{}/api/traces/{hex}", w.http), "application/json").await;
    assert_eq!(v1.headers["weft-trace-truncated"], "25");

    let v2 = get(
        format!("{}/api/v2/traces/{hex}", w.http),
        "application/json",
    )
    .await;
    let doc = v2.json().unwrap();
    assert_eq!(doc["status"], "PARTIAL");
    assert!(
        doc["message"]
            .as_str()
            .unwrap()
            .contains("first 10 of 25 spans"),
        "{doc}"
    );
    let v2 = get(
        format!("{}/api/v2/traces/{hex}", w.http),
        "application/protobuf",
    )
    .await;
    let decoded = TraceByIdResponse::decode(v2.body).unwrap();
    assert_eq!(decoded.status, 1);
    assert_eq!(span_count(&decoded.trace.unwrap().resource_spans), 10);

    let jaeger = get(
        format!("{}/jaeger/api/traces/{hex}", w.http),
        "application/json",
    )
    .await;
    let doc = jaeger.json().unwrap();
    assert_eq!(doc["data"][0]["spans"].as_array().unwrap().len(), 10);
    assert!(
        doc["data"][0]["warnings"][0]
            .as_str()
            .unwrap()
            .contains("--max-trace-spans")
    );
}
