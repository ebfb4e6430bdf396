//! Search answers equal a naive computation over the generated data, in the head and in
//! blocks, and cursors page through them exactly.

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::Value;
use weft_bench::generator::{GenConfig, batches};
use weft_tests::Weft;

use crate::common::*;

#[derive(Debug, Clone, PartialEq)]
struct Expected {
    trace_id: String,
    start: u64,
    duration: u64,
    spans: u64,
    errors: u64,
    root: String,
}

fn str_attr(s: &Span, key: &str) -> Option<String> {
    s.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| match &v.value {
            Some(V::StringValue(x)) => Some(x.clone()),
            _ => None,
        })
}

/// Newest-first traces having one span that satisfies `pred`, computed from the data itself.
fn naive(all: &[(String, Span)], pred: impl Fn(&str, &Span) -> bool) -> Vec<Expected> {
    let mut traces: BTreeMap<Vec<u8>, Vec<&(String, Span)>> = BTreeMap::new();
    for item in all {
        traces
            .entry(item.1.trace_id.clone())
            .or_default()
            .push(item);
    }
    let mut out: Vec<Expected> = traces
        .into_iter()
        .filter(|(_, spans)| spans.iter().any(|(svc, s)| pred(svc, s)))
        .map(|(id, spans)| {
            let start = spans
                .iter()
                .map(|(_, s)| s.start_time_unix_nano)
                .min()
                .unwrap();
            let end = spans
                .iter()
                .map(|(_, s)| s.end_time_unix_nano)
                .max()
                .unwrap();
            let root = spans
                .iter()
                .find(|(_, s)| s.parent_span_id.is_empty())
                .map(|(_, s)| s.name.clone())
                .unwrap_or_default();
            Expected {
                trace_id: hex::encode(id),
                start,
                duration: end - start,
                spans: spans.len() as u64,
                errors: spans
                    .iter()
                    .filter(|(_, s)| s.status.as_ref().is_some_and(|st| st.code == 2))
                    .count() as u64,
                root,
            }
        })
        .collect();
    out.sort_by(|a, b| (b.start, &b.trace_id).cmp(&(a.start, &a.trace_id)));
    out
}

fn got(doc: &Value) -> Vec<Expected> {
    doc["traces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| Expected {
            trace_id: t["trace_id"].as_str().unwrap().to_owned(),
            start: t["start_time_unix_nano"].as_str().unwrap().parse().unwrap(),
            duration: t["duration_ns"].as_u64().unwrap(),
            spans: t["span_count"].as_u64().unwrap(),
            errors: t["error_count"].as_u64().unwrap(),
            root: t["root_name"].as_str().unwrap().to_owned(),
        })
        .collect()
}

async fn all_pages(c: &Client, w: &Weft, query: &str, page: usize) -> Vec<Expected> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let q = match &cursor {
            Some(cur) => format!("{query}&limit={page}&cursor={cur}"),
            None => format!("{query}&limit={page}"),
        };
        let doc = search(c, w, &q, None).await;
        let items = got(&doc);
        assert!(items.len() <= page);
        out.extend(items);
        match doc["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return out,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn search_matches_a_naive_scan_in_head_and_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Weft::start(dir.path(), &["--flush-rows", "4000"]);
    let c = Client::new();
    let cfg = GenConfig {
        seed: 7,
        spans: 12_000,
        rate: 5.0,
        ..Default::default()
    };
    let mut all: Vec<(String, Span)> = Vec::new();
    for m in batches(cfg, 1500) {
        for rs in &m.resource_spans {
            let svc = rs.resource.as_ref().unwrap().attributes[0]
                .value
                .as_ref()
                .map(|v| match &v.value {
                    Some(V::StringValue(s)) => s.clone(),
                    _ => String::new(),
                });
            for s in rs.scope_spans.iter().flat_map(|ss| &ss.spans) {
                all.push((svc.clone().unwrap(), s.clone()));
            }
        }
        let r = c
            .post(
                &format!("{}/v1/traces", w.otlp),
                &[("content-type", "application/x-protobuf")],
                m.encode_to_vec(),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    }
    let version = "llama-3.1-70b-2025-09";
    // the middle of the request arrivals
    let arrivals = || {
        all.iter()
            .filter(|(_, s)| s.name == "tokenize")
            .map(|(_, s)| s.start_time_unix_nano)
    };
    let (first, last) = (arrivals().min().unwrap(), arrivals().max().unwrap());
    let mid = first + (last - first) / 2;
    let cases: Vec<(String, Vec<Expected>)> = vec![
        (
            "service=inference-engine".into(),
            naive(&all, |svc, _| svc == "inference-engine"),
        ),
        (
            format!("service=inference-engine&attr.llm.model_version={version}&min_duration=2s"),
            naive(&all, |svc, s| {
                svc == "inference-engine"
                    && str_attr(s, "llm.model_version").as_deref() == Some(version)
                    && s.end_time_unix_nano - s.start_time_unix_nano >= 2_000_000_000
            }),
        ),
        (
            "name=llm.generate&attr.worker.id=worker-3&max_duration=3s".into(),
            naive(&all, |_, s| {
                s.name == "llm.generate"
                    && str_attr(s, "worker.id").as_deref() == Some("worker-3")
                    && s.end_time_unix_nano - s.start_time_unix_nano <= 3_000_000_000
            }),
        ),
        // both generations of a GenAI name find both kinds of span
        (
            "attr.gen_ai.system=vllm".into(),
            naive(&all, |_, s| {
                str_attr(s, "gen_ai.system")
                    .or_else(|| str_attr(s, "gen_ai.provider.name"))
                    .as_deref()
                    == Some("vllm")
            }),
        ),
        (
            "attr.tenant.id=acme&attr.http.route=/v1/chat/completions".into(),
            naive(&all, |_, s| {
                str_attr(s, "tenant.id").as_deref() == Some("acme")
                    && str_attr(s, "http.route").as_deref() == Some("/v1/chat/completions")
            }),
        ),
        (
            format!("name=llm.prefill&end={mid}"),
            naive(&all, |_, s| {
                s.name == "llm.prefill" && s.start_time_unix_nano < mid
            }),
        ),
        (
            format!("name=tokenize&start={mid}"),
            naive(&all, |_, s| {
                s.name == "tokenize" && s.start_time_unix_nano >= mid
            }),
        ),
        ("name=no-such-span".into(), vec![]),
    ];
    for phase in ["head", "blocks"] {
        for (query, want) in &cases {
            assert!(
                query.contains("no-such") || !want.is_empty(),
                "case {query} selects something"
            );
            let doc = search(&c, &w, &format!("{query}&limit=1000"), None).await;
            assert_eq!(&got(&doc), want, "{phase}: {query}");
            let paged = all_pages(&c, &w, query, 7).await;
            assert_eq!(&paged, want, "{phase}: {query} paged by 7");
        }
        let again = search(&c, &w, "service=inference-engine&limit=5", None).await;
        assert_eq!(
            again,
            search(&c, &w, "service=inference-engine&limit=5", None).await,
            "deterministic"
        );
        assert!(w.terminate());
        w.restart();
    }
}
