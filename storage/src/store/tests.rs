use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use roaring::RoaringBitmap;

use super::*;
use crate::model::*;
use crate::schema::{DEDICATED, DIM_NAME, DIM_SERVICE, DIM_STATUS, TRACE_DIM_PREFIX};

fn tenant(name: &str) -> TenantId {
    TenantId::new(name).unwrap()
}

fn small_opts() -> StoreOptions {
    StoreOptions {
        flush_rows: 500,
        ..Default::default()
    }
}

/// Random spans shaped like LLM serving: a generate span with dimensions and token children.
fn random_traces(seed: u64, traces: usize) -> Vec<SpanRecord> {
    let mut rng = StdRng::seed_from_u64(seed);
    let services: Vec<Arc<Resource>> = ["gateway", "engine"]
        .iter()
        .map(|s| {
            Arc::new(Resource {
                attributes: vec![KeyValue::new("service.name", Value::Str(s.to_string()))],
                ..Default::default()
            })
        })
        .collect();
    let scope = Arc::new(Scope {
        name: "test".into(),
        ..Default::default()
    });
    let mut out = Vec::new();
    for t in 0..traces {
        let mut trace = [0u8; 16];
        rng.fill(&mut trace[..]);
        trace[0] |= 1;
        let trace = TraceId(trace);
        let base = 1_700_000_000_000_000_000u64 + t as u64 * 1_000_000_000;
        let root = SpanId(rng.random::<[u8; 8]>().map(|b| b | 1));
        let version = ["v1", "v2", "v3"][rng.random_range(0..3)];
        let worker = format!("worker-{}", rng.random_range(0..4));
        let old = rng.random_bool(0.5);
        out.push(SpanRecord {
            trace_id: trace,
            span_id: root,
            name: "llm.generate".into(),
            kind: SpanKind::Server,
            start: UnixNanos(base),
            end: UnixNanos(base + 900_000_000),
            attributes: vec![
                KeyValue::new("llm.model_version", Value::Str(version.into())),
                KeyValue::new("worker.id", Value::Str(worker.clone())),
                KeyValue::new("llm.batch_size", Value::Int(rng.random_range(1..5) * 8)),
                KeyValue::new(
                    if old {
                        "gen_ai.system"
                    } else {
                        "gen_ai.provider.name"
                    },
                    Value::Str("vllm".into()),
                ),
                KeyValue::new(
                    "gen_ai.response.finish_reasons",
                    Value::Array(vec![Value::Str("stop".into())]),
                ),
                KeyValue::new("http.route", Value::Str("/v1/chat".into())),
                KeyValue::new("gen_ai.input.messages", Value::Str("x".repeat(3000))),
                KeyValue::new(
                    "odd",
                    Value::KvList(vec![KeyValue::new("k", Value::Bytes(vec![1, 2]))]),
                ),
            ],
            status_code: if rng.random_bool(0.1) {
                StatusCode::Error
            } else {
                StatusCode::Unset
            },
            status_message: String::new(),
            events: vec![Event {
                time: UnixNanos(base + 5),
                name: "first_token".into(),
                ..Default::default()
            }],
            links: if t % 3 == 0 {
                vec![Link {
                    trace_id: TraceId([9; 16]),
                    span_id: SpanId([9; 8]),
                    flags: 1,
                    ..Default::default()
                }]
            } else {
                vec![]
            },
            resource: services[1].clone(),
            scope: scope.clone(),
            ..Default::default()
        });
        for i in 0..rng.random_range(1..40) {
            let start = base + 1_000_000 + i * 20_000_000;
            out.push(SpanRecord {
                trace_id: trace,
                span_id: SpanId(rng.random::<[u8; 8]>().map(|b| b | 2)),
                parent_span_id: Some(root),
                name: "llm.decode.token".into(),
                kind: SpanKind::Internal,
                start: UnixNanos(start),
                end: UnixNanos(start + rng.random_range(10_000_000..30_000_000)),
                attributes: vec![
                    KeyValue::new("llm.token.index", Value::Int(i as i64)),
                    KeyValue::new(
                        "llm.token.latency_ms",
                        Value::Double(rng.random_range(10.0..30.0)),
                    ),
                ],
                resource: services[1].clone(),
                scope: scope.clone(),
                ..Default::default()
            });
        }
    }
    out
}

fn by_trace(spans: &[SpanRecord]) -> BTreeMap<TraceId, Vec<SpanRecord>> {
    let mut map: BTreeMap<TraceId, Vec<SpanRecord>> = BTreeMap::new();
    for s in spans {
        map.entry(s.trace_id).or_default().push(s.clone());
    }
    for v in map.values_mut() {
        v.sort_by_key(|a| (a.start, a.span_id));
    }
    map
}

/// Equal up to attribute order.
fn assert_same(got: &[SpanRecord], want: &[SpanRecord]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        let mut g = g.clone();
        let mut w = w.clone();
        g.attributes.sort_by(|a, b| a.key.cmp(&b.key));
        w.attributes.sort_by(|a, b| a.key.cmp(&b.key));
        assert_eq!(g, w);
    }
}

#[test]
fn traces_read_back_equal_from_head_and_from_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let t = tenant("a");
    let spans = random_traces(1, 60);
    for chunk in spans.chunks(97) {
        store.append(&t, chunk.to_vec()).unwrap();
    }
    let want = by_trace(&spans);
    for (id, spans) in &want {
        assert_same(&store.trace(&t, id).unwrap(), spans);
    }
    assert!(store.flush(true).unwrap() >= 2, "500-row blocks");
    assert_eq!(store.pending_rows(), 0);
    for (id, spans) in &want {
        assert_same(&store.trace(&t, id).unwrap(), spans);
    }
    assert!(store.trace(&t, &TraceId([0xee; 16])).unwrap().is_empty());
    assert!(
        store
            .trace_locations(&t, &TraceId([0xee; 16]))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_retried_batch_is_stored_once_before_and_after_flush() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let t = tenant("a");
    let spans = random_traces(2, 5);
    let first = store.append(&t, spans.clone()).unwrap();
    assert_eq!(first.stored, spans.len());
    let again = store.append(&t, spans.clone()).unwrap();
    assert_eq!((again.stored, again.duplicates), (0, spans.len()));
    store.flush(true).unwrap();
    let after = store.append(&t, spans.clone()).unwrap();
    assert_eq!(after.stored, 0);
    let id = spans[0].trace_id;
    let n = spans.iter().filter(|s| s.trace_id == id).count();
    assert_eq!(store.trace(&t, &id).unwrap().len(), n);
}

#[test]
fn acknowledged_rows_survive_a_crash_and_flushes_are_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let t = tenant("a");
    let spans = random_traces(3, 30);
    let (flushed, unflushed) = spans.split_at(spans.len() / 2);
    {
        let store = Store::open(dir.path(), small_opts()).unwrap();
        store.append(&t, flushed.to_vec()).unwrap();
        store.flush(true).unwrap();
        store.append(&t, unflushed.to_vec()).unwrap();
        // dropped without close: the second half lives only in the write-ahead head
    }
    let store = Store::open(dir.path(), small_opts()).unwrap();
    assert_eq!(store.pending_rows(), unflushed.len());
    for (id, want) in by_trace(&spans) {
        assert_same(&store.trace(&t, &id).unwrap(), &want);
    }
    store.close().unwrap();
    drop(store);
    let store = Store::open(dir.path(), small_opts()).unwrap();
    assert_eq!(store.pending_rows(), 0);
    let rows: u32 = store.blocks(&t).iter().map(|(_, m)| m.rows).sum();
    assert_eq!(rows as usize, spans.len());
}

#[test]
fn tenants_never_see_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let spans = random_traces(4, 3);
    store.append(&tenant("a"), spans.clone()).unwrap();
    let id = spans[0].trace_id;
    assert!(store.trace(&tenant("b"), &id).unwrap().is_empty());
    store.flush(true).unwrap();
    assert!(store.trace(&tenant("b"), &id).unwrap().is_empty());
    assert!(store.blocks(&tenant("b")).is_empty());
    assert!(!store.trace(&tenant("a"), &id).unwrap().is_empty());
}

#[test]
fn postings_agree_with_a_naive_scan() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        StoreOptions {
            flush_rows: 100_000,
            ..Default::default()
        },
    )
    .unwrap();
    let t = tenant("a");
    store.append(&t, random_traces(5, 80)).unwrap();
    store.flush(true).unwrap();
    let blocks = store.blocks(&t);
    assert_eq!(blocks.len(), 1);
    let (addr, meta) = &blocks[0];
    let rows = store
        .block_reader(&t, *addr, meta)
        .spans(&Rows::All, false)
        .unwrap();
    let naive = |pred: &dyn Fn(&SpanRecord) -> bool| -> RoaringBitmap {
        rows.iter()
            .enumerate()
            .filter(|(_, s)| pred(s))
            .map(|(i, _)| i as u32)
            .collect()
    };
    for (term, bitmap) in store.dimension(&t, *addr, DIM_SERVICE).unwrap() {
        assert_eq!(bitmap, naive(&|s| s.service_name() == term));
    }
    for (term, bitmap) in store.dimension(&t, *addr, DIM_NAME).unwrap() {
        assert_eq!(bitmap, naive(&|s| s.name == term));
    }
    for (term, bitmap) in store.dimension(&t, *addr, DIM_STATUS).unwrap() {
        assert_eq!(bitmap, naive(&|s| s.status_code.as_str() == term));
    }
    let mut checked = 0;
    for d in DEDICATED.iter().filter(|d| d.indexed) {
        let has = |s: &SpanRecord, term: &str| {
            s.attributes.iter().any(|kv| {
                (kv.key == d.name || Some(kv.key.as_str()) == d.alias)
                    && kv.value.as_term().as_deref() == Some(term)
            })
        };
        for (term, bitmap) in store.dimension(&t, *addr, d.name).unwrap() {
            assert_eq!(bitmap, naive(&|s| has(s, &term)), "{} = {term}", d.name);
            checked += 1;
        }
        for (term, bitmap) in store
            .dimension(&t, *addr, &format!("{TRACE_DIM_PREFIX}{}", d.name))
            .unwrap()
        {
            let traces: HashSet<TraceId> = rows
                .iter()
                .filter(|s| has(s, &term))
                .map(|s| s.trace_id)
                .collect();
            assert_eq!(
                bitmap,
                naive(&|s| traces.contains(&s.trace_id)),
                "trace-level {} = {term}",
                d.name
            );
            checked += 1;
        }
    }
    assert!(checked > 10, "dimensions were indexed: {checked}");
    assert!(
        store
            .postings(&t, *addr, "llm.model_version", "no-such-version")
            .unwrap()
            .is_empty()
    );
}

#[test]
fn backpressure_refuses_instead_of_queueing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        StoreOptions {
            flush_rows: 10,
            max_pending_rows: 50,
            ..Default::default()
        },
    )
    .unwrap();
    let t = tenant("a");
    let spans = random_traces(6, 20);
    let mut refused = false;
    for chunk in spans.chunks(20) {
        match store.append(&t, chunk.to_vec()) {
            Ok(_) => {}
            Err(StorageError::Overloaded { .. }) => refused = true,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(refused, "appends beyond max_pending_rows are refused");
    assert!(store.pending_rows() <= 50 + 20);
    store.flush(true).unwrap();
    assert!(store.append(&t, random_traces(7, 1)).is_ok());
}

#[test]
fn a_latency_that_repeats_the_duration_is_derived_not_stored_and_reads_back_equal() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let t = tenant("a");
    let mut spans = random_traces(8, 5);
    for s in spans.iter_mut().filter(|s| s.name == "llm.decode.token") {
        let ms = crate::block::writer::millis(s.duration_ns() as i64);
        for kv in s
            .attributes
            .iter_mut()
            .filter(|kv| kv.key == "llm.token.latency_ms")
        {
            kv.value = Value::Double(ms);
        }
    }
    store.append(&t, spans.clone()).unwrap();
    store.flush(true).unwrap();
    let (_, meta) = &store.blocks(&t)[0];
    let column = meta.column("d:llm.token.latency_ms").unwrap();
    assert_eq!(
        column.transform,
        crate::block::format::Transform::DurationMillis
    );
    for (id, want) in by_trace(&spans) {
        assert_same(&store.trace(&t, &id).unwrap(), &want);
    }
}

#[test]
fn gap_encoded_start_times_read_back_across_page_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        StoreOptions {
            flush_rows: 100_000,
            ..Default::default()
        },
    )
    .unwrap();
    let t = tenant("a");
    let spans = random_traces(9, 400);
    assert!(
        spans.len() > 2 * crate::block::format::PAGE_ROWS,
        "several pages: {}",
        spans.len()
    );
    store.append(&t, spans.clone()).unwrap();
    store.flush(true).unwrap();
    for (id, want) in by_trace(&spans) {
        assert_same(&store.trace(&t, &id).unwrap(), &want);
    }
    let (addr, meta) = &store.blocks(&t)[0];
    let reader = store.block_reader(&t, *addr, meta);
    let all = reader.spans(&Rows::All, false).unwrap();
    let every_seventh: RoaringBitmap = (0..meta.rows).step_by(7).collect();
    let picked = reader
        .ints(
            crate::block::writer::col::START,
            &Rows::Set(every_seventh.clone()),
        )
        .unwrap();
    let want: Vec<i64> = every_seventh
        .iter()
        .map(|r| all[r as usize].start.0 as i64)
        .collect();
    assert_eq!(picked, want);
    // sparse sets: each row is rebuilt from its trace's first row or its page's
    let page = crate::block::format::PAGE_ROWS as u32;
    let sparse: Vec<RoaringBitmap> = vec![
        (0..meta.rows).filter(|r| r % 97 == 5).collect(),
        [page - 1, page, page + 1, meta.rows - 1]
            .into_iter()
            .collect(),
        (0..meta.rows).step_by(1000).collect(),
        // several rows of each trace, each rebuilt from the one before it
        (0..meta.rows)
            .filter(|r| r % 13 < 3 || r % 29 == 0)
            .collect(),
    ];
    for set in sparse {
        let (starts, durations) = reader.times(&Rows::Set(set.clone())).unwrap();
        let want: (Vec<i64>, Vec<i64>) = set
            .iter()
            .map(|r| {
                let s = &all[r as usize];
                (s.start.0 as i64, s.duration_ns() as i64)
            })
            .unzip();
        assert_eq!((starts, durations), want, "rows {set:?}");
    }
    let unaligned = reader
        .ints(crate::block::writer::col::START, &Rows::Range(5000, 300))
        .unwrap();
    let want: Vec<i64> = all[5000..5300].iter().map(|s| s.start.0 as i64).collect();
    assert_eq!(unaligned, want);
}

#[test]
fn indexed_strings_read_from_postings_match_their_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let t = tenant("a");
    let mut spans = random_traces(11, 300);
    // a repeated key: the column and its postings keep the first value only
    spans[0].attributes.push(KeyValue::new(
        "llm.model_version",
        Value::Str("second".into()),
    ));
    store.append(&t, spans).unwrap();
    store.flush(true).unwrap();
    let (addr, meta) = &store.blocks(&t)[0];
    let reader = store.block_reader(&t, *addr, meta);
    let name = format!(
        "{}llm.model_version",
        crate::block::writer::col::DEDICATED_PREFIX
    );
    for set in [
        (0..meta.rows)
            .filter(|r| r % 97 < 3)
            .collect::<RoaringBitmap>(),
        [0u32, 1, meta.rows - 1].into_iter().collect(),
    ] {
        let from_postings = reader
            .indexed_strings("llm.model_version", &set)
            .unwrap()
            .expect("a few rows of an indexed column");
        let from_chunk = reader
            .column(&name, &Rows::Set(set.clone()))
            .unwrap()
            .unwrap();
        let from_chunk = arrow::compute::cast(&from_chunk, from_postings.data_type()).unwrap();
        assert_eq!(from_postings.as_ref(), from_chunk.as_ref(), "rows {set:?}");
    }
    let none = reader.indexed_strings("llm.model_version", &RoaringBitmap::new());
    assert_eq!(none.unwrap().unwrap().len(), 0);
    // most of the block: left to the chunk
    let most: RoaringBitmap = (0..meta.rows).collect();
    assert!(
        reader
            .indexed_strings("llm.model_version", &most)
            .unwrap()
            .is_none()
    );
}
