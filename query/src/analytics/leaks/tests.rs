use std::sync::Arc;

use weft_storage::StoreOptions;
use weft_storage::model::{LogRecord, Resource, SpanId, SpanRecord, UnixNanos};

use super::*;

const T0: u64 = 1_764_460_800_000_000_000;

fn resource(service: &str) -> Arc<Resource> {
    Arc::new(Resource {
        attributes: vec![KeyValue::new("service.name", Value::Str(service.into()))],
        ..Default::default()
    })
}

fn span(trace: u8, id: u64, service: &str, attributes: Vec<KeyValue>) -> SpanRecord {
    SpanRecord {
        trace_id: TraceId([trace; 16]),
        span_id: SpanId((id + 1).to_be_bytes()),
        name: "op".into(),
        start: UnixNanos(T0 + id),
        end: UnixNanos(T0 + id + 10),
        attributes,
        resource: resource(service),
        ..Default::default()
    }
}

fn s(key: &str, v: &str) -> KeyValue {
    KeyValue::new(key, Value::Str(v.into()))
}

/// A clean request: gateway, retriever, model server (with GenAI attributes and the prompt's
/// hash, as redaction leaves it), a log of the model server with the same hash.
fn clean(trace: u8) -> (Vec<SpanRecord>, Vec<LogRecord>) {
    let hash = s("gen_ai.input.messages.hash", "ab12cd34ef56ab78");
    let spans = vec![
        span(
            trace,
            1,
            "gateway",
            vec![s("http.route", "/v1/chat"), hash.clone()],
        ),
        span(trace, 2, "retriever", vec![s("db.system", "qdrant")]),
        span(
            trace,
            3,
            "vllm",
            vec![
                s("gen_ai.request.model", "llama"),
                hash.clone(),
                s("note", &"word ".repeat(60)),
            ],
        ),
    ];
    let logs = vec![LogRecord {
        time: UnixNanos(T0 + 4),
        observed_time: UnixNanos(T0 + 4),
        trace_id: Some(TraceId([trace; 16])),
        attributes: vec![hash],
        resource: resource("vllm"),
        ..Default::default()
    }];
    (spans, logs)
}

fn findings(spans: Vec<SpanRecord>, logs: Vec<LogRecord>) -> Vec<Finding> {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let t = TenantId::new("a").unwrap();
    let (flushed, head) = spans.split_at(spans.len() / 2);
    store.append(&t, flushed.to_vec()).unwrap();
    store.flush(true).unwrap();
    store.append(&t, head.to_vec()).unwrap();
    if !logs.is_empty() {
        store.append_logs(&t, logs).unwrap();
    }
    scan(&store, &t, None, None).unwrap()
}

#[test]
fn clean_data_reports_nothing() {
    let (spans, logs) = clean(1);
    assert_eq!(findings(spans, logs), Vec::new());
}

#[test]
fn each_kind_is_found_where_it_was_planted() {
    type Plant = Box<dyn Fn(&mut Vec<SpanRecord>, &mut Vec<LogRecord>)>;
    let planted: Vec<(&str, Plant)> = vec![
        (
            "raw_prompt_header",
            Box::new(|spans, _| {
                spans[0]
                    .attributes
                    .push(s("http.request.header.x-raw-prompt.hash", "ff00"));
            }),
        ),
        (
            "unredacted_content",
            Box::new(|spans, _| spans[2].attributes.push(s("gen_ai.prompt", "tell me"))),
        ),
        (
            "long_text_attribute",
            Box::new(|spans, _| {
                spans[1]
                    .attributes
                    .push(s("retrieval.query", &"what is my refund ".repeat(20)));
            }),
        ),
        (
            "prompt_fanout",
            Box::new(|spans, _| {
                spans[1]
                    .attributes
                    .push(s("gen_ai.input.messages.hash", "ab12cd34ef56ab78"));
            }),
        ),
        (
            "repeated_prompt_hash",
            Box::new(|spans, _| {
                for i in 0..6 {
                    spans.push(span(1, 10 + i, "vllm", vec![s("llm.prompt.hash", "5y5")]));
                }
            }),
        ),
    ];
    for (kind, plant) in planted {
        let (mut spans, mut logs) = clean(1);
        plant(&mut spans, &mut logs);
        let found = findings(spans, logs);
        assert_eq!(found.len(), 1, "{kind}: {found:?}");
        let f = &found[0];
        assert_eq!(f.kind, kind);
        assert_eq!(
            f.example_trace_ids,
            vec![TraceId([1; 16]).to_hex()],
            "{kind}"
        );
        assert!(f.count >= 1 && f.risk > 0.0 && f.risk <= 1.0);
    }
}
