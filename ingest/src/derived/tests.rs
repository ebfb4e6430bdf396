//! Derived metrics against values computed from the spans themselves.

use std::sync::Arc;

use weft_storage::model::{KeyValue, Resource};
use weft_storage::{Store, StoreOptions};

use super::*;

const T0: u64 = 1_700_000_000_000_000_000;

fn resource(service: &str) -> Arc<Resource> {
    Arc::new(Resource {
        attributes: vec![KeyValue::new("service.name", Value::Str(service.into()))],
        ..Default::default()
    })
}

fn span(
    trace: u8,
    id: u8,
    parent: Option<u8>,
    service: &str,
    name: &str,
    kind: SpanKind,
    ms: u64,
) -> SpanRecord {
    SpanRecord {
        trace_id: TraceId([trace; 16]),
        span_id: SpanId([id; 8]),
        parent_span_id: parent.map(|p| SpanId([p; 8])),
        name: name.into(),
        kind,
        start: UnixNanos(T0),
        end: UnixNanos(T0 + ms * 1_000_000),
        resource: resource(service),
        ..Default::default()
    }
}

/// One request: gateway CLIENT → engine SERVER `llm.generate` with dimensions, a prefill and
/// `tokens` decode spans.
fn request(trace: u8, worker: &str, tokens: u8, failed: bool) -> Vec<SpanRecord> {
    let mut client = span(
        trace,
        1,
        None,
        "gateway",
        "chat llama",
        SpanKind::Client,
        900,
    );
    if failed {
        client.status_code = StatusCode::Error;
    }
    let mut generate = span(
        trace,
        2,
        Some(1),
        "engine",
        "llm.generate",
        SpanKind::Server,
        800,
    );
    generate.attributes = vec![
        KeyValue::new("llm.model_version", Value::Str("v1.3".into())),
        KeyValue::new("worker.id", Value::Str(worker.into())),
        KeyValue::new("gen_ai.usage.output_tokens", Value::Int(i64::from(tokens))),
        KeyValue::new("gen_ai.usage.input_tokens", Value::Int(100)),
    ];
    let prefill = span(
        trace,
        3,
        Some(2),
        "engine",
        "llm.prefill",
        SpanKind::Internal,
        200,
    );
    let mut out = vec![client, generate, prefill];
    for i in 0..tokens {
        let mut t = span(
            trace,
            10 + i,
            Some(2),
            "engine",
            "llm.decode.token",
            SpanKind::Internal,
            20,
        );
        t.attributes = vec![KeyValue::new("llm.token.latency_ms", Value::Double(25.0))];
        out.push(t);
    }
    out
}

#[test]
fn span_metrics_service_graph_and_llm_latencies_match_the_spans() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let t = TenantId::new("acme").unwrap();
    let metrics = SpanMetrics::new(UnixNanos(T0 - 1));
    let mut all = Vec::new();
    for trace in 1..=4u8 {
        all.extend(request(
            trace,
            if trace % 2 == 0 { "w-2" } else { "w-1" },
            5,
            trace == 3,
        ));
    }
    // a token of trace 1 recorded by another service: its series has that service, not the
    // one the request's other tokens found first
    let mut sidecar = span(
        1,
        99,
        Some(2),
        "sidecar",
        "llm.decode.token",
        SpanKind::Internal,
        20,
    );
    sidecar.attributes = vec![KeyValue::new("llm.token.latency_ms", Value::Double(40.0))];
    all.push(sidecar);
    // the client side of trace 4 arrives in a later request than its server side
    let late: Vec<SpanRecord> = all
        .iter()
        .filter(|s| s.trace_id.0[0] == 4 && s.kind == SpanKind::Client)
        .cloned()
        .collect();
    all.retain(|s| !(s.trace_id.0[0] == 4 && s.kind == SpanKind::Client));
    let first = store
        .append_observed(&t, all.clone(), |s| metrics.observe(&t, s))
        .unwrap();
    assert_eq!(first.stored, all.len());
    // a retry of the same spans is stored and counted once
    let retry = store
        .append_observed(&t, all.clone(), |s| metrics.observe(&t, s))
        .unwrap();
    assert_eq!(retry.stored, 0);
    store
        .append_observed(&t, late, |s| metrics.observe(&t, s))
        .unwrap();
    let written = metrics
        .flush(&store, UnixNanos(T0 + 60_000_000_000))
        .unwrap();
    assert!(written > 0);

    let catalog = store.series_catalog(&t).unwrap();
    let c = catalog.read().unwrap();
    let snapshot = store.metric_snapshot(&t).unwrap();
    let points = store
        .metric_points(&t, &snapshot, None, None, None)
        .unwrap();
    let find = |name: &str, labels: &[(&str, &str)]| -> &PointValue {
        let p = points
            .iter()
            .find(|p| {
                let s = c.get(p.series).unwrap();
                s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(*v))
            })
            .unwrap_or_else(|| panic!("no {name} {labels:?}"));
        &p.value
    };
    // calls: 4 generate spans, 20 decode tokens
    let calls = find(
        "traces_spanmetrics_calls",
        &[
            ("service", "engine"),
            ("span_name", "llm.decode.token"),
            ("span_kind", "SPAN_KIND_INTERNAL"),
        ],
    );
    assert_eq!(calls, &PointValue::Number(20.0));
    let PointValue::Histogram {
        count, sum, counts, ..
    } = find(
        "traces_spanmetrics_latency",
        &[("service", "engine"), ("span_name", "llm.generate")],
    )
    else {
        panic!()
    };
    assert_eq!(*count, 4);
    assert!((sum.unwrap() - 3.2).abs() < 1e-9);
    // 0.8 s falls in (0.512, 1.024]
    assert_eq!(
        counts[LATENCY_BUCKETS.iter().position(|b| *b == 1.024).unwrap()],
        4
    );
    // the service graph paired all four edges, one failed
    let edges = find(
        "traces_service_graph_request",
        &[("client", "gateway"), ("server", "engine")],
    );
    assert_eq!(edges, &PointValue::Number(4.0));
    assert_eq!(
        find(
            "traces_service_graph_request_failed",
            &[("client", "gateway")]
        ),
        &PointValue::Number(1.0)
    );
    // LLM: TTFT from the prefill's end (0.2 s), TPOT (0.8 - 0.2) / 4, per worker
    let PointValue::Histogram { count, sum, .. } = find(
        "gen_ai.server.time_to_first_token",
        &[("worker.id", "w-1"), ("llm.model_version", "v1.3")],
    ) else {
        panic!()
    };
    assert_eq!((*count, (sum.unwrap() * 1e9).round() / 1e9), (2, 0.4));
    let PointValue::Histogram { sum, .. } = find(
        "gen_ai.server.time_per_output_token",
        &[("worker.id", "w-2")],
    ) else {
        panic!()
    };
    assert!((sum.unwrap() - 2.0 * 0.15).abs() < 1e-9);
    // inter-token latency from the tokens' own attribute, with their request's dimensions
    let PointValue::Histogram { count, sum, .. } = find(
        "llm.inter_token_latency",
        &[("worker.id", "w-1"), ("service.name", "engine")],
    ) else {
        panic!()
    };
    assert_eq!(*count, 10);
    assert!((sum.unwrap() - 0.25).abs() < 1e-9);
    let PointValue::Histogram { count, sum, .. } = find(
        "llm.inter_token_latency",
        &[("worker.id", "w-1"), ("service.name", "sidecar")],
    ) else {
        panic!()
    };
    assert_eq!((*count, *sum), (1, Some(0.04)));
    let PointValue::Histogram { sum, .. } = find(
        "gen_ai.client.token.usage",
        &[("gen_ai.token.type", "input"), ("worker.id", "w-2")],
    ) else {
        panic!()
    };
    assert_eq!(*sum, Some(200.0));
    // histogram points carry a real trace as exemplar
    let with_exemplar = points.iter().find(|p| !p.exemplars.is_empty()).unwrap();
    assert!(with_exemplar.exemplars[0].trace_id.is_some());
}

#[test]
fn unpaired_edge_sides_are_bounded_across_tenants() {
    let metrics = SpanMetrics {
        max_pending: 5,
        ..SpanMetrics::new(UnixNanos(T0))
    };
    let (a, b) = (TenantId::new("a").unwrap(), TenantId::new("b").unwrap());
    // client spans whose server side has not come: each waits as an unpaired side
    let clients = |trace: u8, n: u8| -> Vec<SpanRecord> {
        (1..=n)
            .map(|id| span(trace, id, None, "gateway", "call", SpanKind::Client, 5))
            .collect()
    };
    let pending = |t: &TenantId| metrics.tenants.lock().unwrap()[t].pending();
    metrics.observe(&a, &clients(1, 4));
    metrics.observe(&b, &clients(2, 1));
    assert_eq!(
        (pending(&a), pending(&b)),
        (4, 1),
        "under the bound: all kept"
    );
    metrics.observe(&b, &clients(3, 1));
    // six past a bound of five: the tenant holding the most (a) drops its sides
    assert_eq!((pending(&a), pending(&b)), (0, 2));
    // b's sides still pair with their servers; a's no longer make an edge
    let server = |trace: u8, parent: u8| {
        vec![span(
            trace,
            9,
            Some(parent),
            "engine",
            "serve",
            SpanKind::Server,
            4,
        )]
    };
    metrics.observe(&b, &server(2, 1));
    metrics.observe(&a, &server(1, 1));
    assert_eq!(
        pending(&b),
        1,
        "a server side paired with its waiting client"
    );
    assert_eq!(
        pending(&a),
        1,
        "a server side whose client was dropped waits alone"
    );
}
