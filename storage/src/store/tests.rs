use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use roaring::RoaringBitmap;

use super::*;
use crate::model::*;
use crate::schema::{DEDICATED, DIM_NAME, DIM_SERVICE, DIM_STATUS};

mod corrupt;
mod logs;
mod metrics;
mod rollup;
mod text;
mod waiting;

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
fn heads_with_no_room_to_keep_rows_decoded_answer_the_same() {
    // every read and flush decodes the head's batches from their encodings
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        decoded_head_bytes: 0,
        ..small_opts()
    };
    let store = Store::open(dir.path(), opts.clone()).unwrap();
    let t = tenant("a");
    let spans = random_traces(3, 40);
    for chunk in spans.chunks(61) {
        store.append(&t, chunk.to_vec()).unwrap();
    }
    assert_eq!(store.decoded_head_bytes(), 0);
    let want = by_trace(&spans);
    for (id, spans) in &want {
        assert_same(&store.trace(&t, id).unwrap(), spans);
    }
    let mut head: Vec<SpanRecord> = store.snapshot(&t).unwrap().head.rows().cloned().collect();
    head.sort_by_key(|s| (s.trace_id, s.span_id));
    let mut all = spans.clone();
    all.sort_by_key(|s| (s.trace_id, s.span_id));
    assert_eq!(head, all);
    // a retry is still known from the encoded head
    let again = store.append(&t, spans[..10].to_vec()).unwrap();
    assert_eq!(again.duplicates, 10);
    drop(store);
    // replayed into encoded batches, then flushed from them
    let store = Store::open(dir.path(), opts).unwrap();
    for (id, spans) in &want {
        assert_same(&store.trace(&t, id).unwrap(), spans);
    }
    store.flush(true).unwrap();
    assert_eq!(store.pending_rows(), 0);
    for (id, spans) in &want {
        assert_same(&store.trace(&t, id).unwrap(), spans);
    }
}

#[test]
fn heads_keep_few_rows_decoded_and_count_them_decoded_against_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        decoded_head_bytes: 64 << 10,
        ..small_opts()
    };
    let store = Store::open(dir.path(), opts).unwrap();
    let t = tenant("a");
    let spans = random_traces(4, 40);
    let decoded: usize = spans.iter().map(Row::heap_bytes).sum();
    for chunk in spans.chunks(50) {
        store.append(&t, chunk.to_vec()).unwrap();
    }
    // the budget counts what a flush will decode, however little the head keeps decoded
    let counted = store.head_bytes();
    assert!(
        counted >= decoded,
        "the head counts {counted} bytes, its rows decoded take {decoded}"
    );
    assert!(store.decoded_head_bytes() <= 64 << 10);
    // reading everything decodes every batch, and the cache stays within its budget
    let n = store.snapshot(&t).unwrap().head.rows().count();
    assert_eq!(n, spans.len());
    assert!(store.decoded_head_bytes() <= 64 << 10);
    store.flush(true).unwrap();
    assert_eq!(store.head_bytes(), 0);
    assert_eq!(
        store.decoded_head_bytes(),
        0,
        "flushed batches leave nothing decoded"
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
    let kinds = store.dimension(&t, *addr, crate::schema::DIM_KIND).unwrap();
    assert!(kinds.len() >= 2, "span kinds indexed");
    for (term, bitmap) in kinds {
        assert_eq!(bitmap, naive(&|s| s.kind.as_str() == term));
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
        // request postings: the value on the row or its nearest ancestor in the block
        let i = DEDICATED.iter().position(|x| x.name == d.name).unwrap();
        let nearest = |at: &SpanRecord| -> Option<String> {
            let mut cur = at;
            loop {
                if let Some(v) = crate::request::dedicated_value(cur, i) {
                    return v.as_term();
                }
                let parent = cur.parent_span_id?;
                cur = rows
                    .iter()
                    .find(|s| s.trace_id == at.trace_id && s.span_id == parent)?;
            }
        };
        let request = store
            .dimension(&t, *addr, crate::request::request_dim_name(i))
            .unwrap();
        for (term, bitmap) in &request {
            assert_eq!(
                *bitmap,
                naive(&|s| nearest(s).as_deref() == Some(term)),
                "request {} = {term}",
                d.name
            );
            checked += 1;
        }
        assert_eq!(
            request.iter().map(|(_, b)| b.len()).sum::<u64>(),
            rows.iter().filter(|s| nearest(s).is_some()).count() as u64
        );
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

/// Many tenants, each far under its flush size, hold a flush age of traffic between them:
/// the heads of all tenants are bounded together. Past half the budget every head is due;
/// past all of it appends are refused (retryably) until a flush has emptied them.
#[test]
fn the_heads_of_all_tenants_share_one_budget() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        StoreOptions {
            flush_rows: 100_000,
            flush_age: Duration::from_secs(3600),
            max_head_bytes: 1 << 20,
            ..Default::default()
        },
    )
    .unwrap();
    let (mut accepted, mut refused) = (0usize, None);
    for i in 0..1000 {
        let t = tenant(&format!("t{i}"));
        match store.append(&t, random_traces(i, 2)) {
            Ok(_) => accepted += 1,
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
        if accepted == 1 {
            assert!(!store.flush_due(), "one small head is not due");
        }
    }
    let err = refused.expect("appends past the budget are refused");
    assert!(
        matches!(err, StorageError::HeadsFull { max, .. } if max == 1 << 20),
        "{err}"
    );
    assert!(err.to_string().contains("--head-memory"), "{err}");
    assert!(accepted > 1, "{accepted}");
    assert!(
        !store.lock().knows(&tenant(&format!("t{accepted}"))),
        "a refused write leaves no tenant behind"
    );
    let held = store.lock().head_bytes();
    assert!((1 << 20..2 << 20).contains(&held), "{held}");
    assert_eq!(store.stats.refused_head_budget.load(Ordering::Relaxed), 1);
    // every head is due now, though none is old or big
    assert!(store.flush_due());
    store.flush(false).unwrap();
    assert_eq!(store.pending_rows(), 0, "every head flushed");
    assert_eq!(store.lock().head_bytes(), 0);
    assert!(!store.flush_due());
    assert!(store.append(&tenant("late"), random_traces(1, 2)).is_ok());
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
fn a_latency_in_whole_nanoseconds_is_stored_after_the_duration_and_reads_back_equal() {
    use crate::block::format::Transform;
    let mut spans = random_traces(9, 5);
    // measured from the previous token: the duration plus a gap, whole nanoseconds in ms
    for (i, s) in spans
        .iter_mut()
        .filter(|s| s.name == "llm.decode.token")
        .enumerate()
    {
        let ns = s.duration_ns() as i64 + 20_000 + (i as i64 * 7919) % 100_000;
        for kv in s
            .attributes
            .iter_mut()
            .filter(|kv| kv.key == "llm.token.latency_ms")
        {
            kv.value = Value::Double(crate::block::writer::millis(ns));
        }
    }
    let written = |spans: &[SpanRecord]| {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), small_opts()).unwrap();
        let t = tenant("a");
        store.append(&t, spans.to_vec()).unwrap();
        store.flush(true).unwrap();
        let (_, meta) = &store.blocks(&t)[0];
        let transform = meta.column("d:llm.token.latency_ms").unwrap().transform;
        for (id, want) in by_trace(spans) {
            assert_same(&store.trace(&t, &id).unwrap(), &want);
        }
        transform
    };
    assert_eq!(written(&spans), Transform::MillisAfterDuration);
    // one value that is not whole nanoseconds keeps the floats as they are
    let odd = spans
        .iter_mut()
        .find(|s| s.name == "llm.decode.token")
        .unwrap();
    for kv in odd
        .attributes
        .iter_mut()
        .filter(|kv| kv.key == "llm.token.latency_ms")
    {
        kv.value = Value::Double(1.234_567_891_234_5);
    }
    assert_eq!(written(&spans), Transform::None);
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
        assert_eq!((starts.to_vec(), durations.to_vec()), want, "rows {set:?}");
    }
    let unaligned = reader
        .ints(crate::block::writer::col::START, &Rows::Range(5000, 300))
        .unwrap();
    let want: Vec<i64> = all[5000..5300].iter().map(|s| s.start.0 as i64).collect();
    assert_eq!(unaligned.to_vec(), want);
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

#[test]
fn a_retry_of_spans_being_written_is_answered_only_once_they_are_durable() {
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc;
    let dir = tempfile::tempdir().unwrap();
    let t = tenant("a");
    let spans = random_traces(21, 3);
    let (entered_tx, entered) = mpsc::channel::<()>();
    let (release, release_rx) = mpsc::channel::<()>();
    let entered_tx = Mutex::new(entered_tx);
    let release_rx = Mutex::new(release_rx);
    let calls = AtomicUsize::new(0);
    {
        let store = Arc::new(Store::open(dir.path(), small_opts()).unwrap());
        // the first write-ahead write (the first sender's) waits, then fails as a full disk would
        *store.test_write_hook.lock().unwrap() = Some(Arc::new(move |_: usize| {
            if calls.fetch_add(1, Ordering::SeqCst) > 0 {
                return Ok(());
            }
            entered_tx.lock().unwrap().send(()).unwrap();
            release_rx.lock().unwrap().recv().unwrap();
            Err(StorageError::corrupt(
                "injected",
                "write-ahead write failed",
            ))
        }));
        let first = {
            let (store, t, spans) = (store.clone(), t.clone(), spans.clone());
            std::thread::spawn(move || store.append(&t, spans))
        };
        entered.recv().unwrap();
        let retry = {
            let (store, t, spans) = (store.clone(), t.clone(), spans.clone());
            std::thread::spawn(move || store.append(&t, spans))
        };
        // let the retry find its spans reserved by the first write (it must wait for it)
        std::thread::sleep(Duration::from_millis(200));
        release.send(()).unwrap();
        assert!(first.join().unwrap().is_err(), "the first write failed");
        let answered = retry.join().unwrap().unwrap();
        assert_eq!(
            answered.stored,
            spans.len(),
            "the retry wrote what the failed write held"
        );
        // dropped without close: what the retry acknowledged must be in the write-ahead head
    }
    let store = Store::open(dir.path(), small_opts()).unwrap();
    for (id, want) in by_trace(&spans) {
        assert_same(&store.trace(&t, &id).unwrap(), &want);
    }
}

#[test]
fn concurrent_senders_of_the_same_batches_store_each_span_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), small_opts()).unwrap());
    let t = tenant("a");
    let spans = random_traces(22, 40);
    let senders: Vec<_> = (0..4)
        .map(|_| {
            let (store, t, spans) = (store.clone(), t.clone(), spans.clone());
            std::thread::spawn(move || {
                for chunk in spans.chunks(37) {
                    store.append(&t, chunk.to_vec()).unwrap();
                }
            })
        })
        .collect();
    for s in senders {
        s.join().unwrap();
    }
    assert_eq!(store.pending_rows(), spans.len());
    store.close().unwrap();
    let rows: u32 = store.blocks(&t).iter().map(|(_, m)| m.rows).sum();
    assert_eq!(rows as usize, spans.len());
}

#[test]
fn a_restart_near_the_pending_limit_still_takes_writes() {
    let dir = tempfile::tempdir().unwrap();
    let t = tenant("a");
    let before = random_traces(23, 4);
    let after = random_traces(24, 4);
    assert!(after.len() > 5);
    let opts = StoreOptions {
        flush_rows: 1_000_000,
        max_pending_rows: before.len() + 5,
        ..Default::default()
    };
    {
        let store = Store::open(dir.path(), opts.clone()).unwrap();
        store.append(&t, before.clone()).unwrap();
        // killed: the rows live only in the write-ahead head
    }
    let store = Store::open(dir.path(), opts).unwrap();
    assert_eq!(store.pending_rows(), before.len());
    assert!(store.flush_due(), "replayed rows are flushed at once");
    let outcome = store.append(&t, after.clone()).unwrap();
    assert_eq!(outcome.stored, after.len());
}

#[test]
fn a_failed_flush_of_one_tenant_leaves_every_head_readable_and_flushable() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let data: Vec<(TenantId, Vec<SpanRecord>)> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, n)| (tenant(n), random_traces(30 + i as u64, 3)))
        .collect();
    for (t, spans) in &data {
        store.append(t, spans.clone()).unwrap();
    }
    *store.test_flush_hook.lock().unwrap() = Some(Arc::new(|t: &TenantId| {
        assert_ne!(t.as_str(), "b", "injected panic in b's flush");
    }));
    let err = store.flush(true).unwrap_err();
    assert!(matches!(err, StorageError::Panicked { .. }), "{err}");
    assert_eq!(store.pending_rows(), data[1].1.len(), "only b's rows wait");
    assert!(store.blocks(&tenant("b")).is_empty());
    for (t, spans) in &data {
        assert!(!store.blocks(t).is_empty() || t.as_str() == "b");
        for (id, want) in by_trace(spans) {
            assert_same(&store.trace(t, &id).unwrap(), &want);
        }
    }
    *store.test_flush_hook.lock().unwrap() = None;
    store.flush(true).unwrap();
    assert_eq!(store.pending_rows(), 0);
    let (b, spans) = &data[1];
    let rows: u32 = store.blocks(b).iter().map(|(_, m)| m.rows).sum();
    assert_eq!(rows as usize, spans.len());
}

#[test]
fn background_tasks_are_retried_after_failures_and_panics_and_counted() {
    use crate::background::{Background, Task};
    use std::sync::atomic::AtomicUsize;
    static ROUNDS: AtomicUsize = AtomicUsize::new(0);
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), small_opts()).unwrap());
    let flaky = Task {
        name: "flaky",
        every: Duration::from_millis(1),
        round: |_| match ROUNDS.fetch_add(1, Ordering::SeqCst) {
            0 => Err(StorageError::corrupt("injected", "first round fails")),
            1 => panic!("second round panics"),
            _ => Ok(true),
        },
    };
    let background = Background::start(store.clone(), &[flaky]);
    let stats = store.stats.task("flaky");
    let deadline = Instant::now() + Duration::from_secs(30);
    while stats.runs.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    background.stop();
    assert_eq!(stats.failures.load(Ordering::SeqCst), 1);
    assert_eq!(stats.panics.load(Ordering::SeqCst), 1);
    assert!(
        stats.runs.load(Ordering::SeqCst) >= 1,
        "it went on after both"
    );
}

#[test]
fn the_store_flushes_due_heads_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        Store::open(
            dir.path(),
            StoreOptions {
                flush_age: Duration::from_millis(50),
                ..small_opts()
            },
        )
        .unwrap(),
    );
    let background = store.start_background();
    store.append(&tenant("a"), random_traces(40, 2)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.pending_rows() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    background.stop();
    assert_eq!(store.pending_rows(), 0);
    assert!(store.stats.task("flush").runs.load(Ordering::SeqCst) >= 1);
}

#[path = "fixture.rs"]
mod fixture;

fn span_at(trace: u8, id: u64, start: u64) -> SpanRecord {
    SpanRecord {
        trace_id: TraceId([trace; 16]),
        span_id: SpanId((id | 1 << 56).to_be_bytes()),
        name: "op".into(),
        start: UnixNanos(start),
        end: UnixNanos(start + 1_000),
        ..Default::default()
    }
}

/// Keys of a tenant's blocks in a window, in every column family (the format key aside).
fn keys_in_window(store: &Store, tenant: &TenantId, window: u64) -> usize {
    let mut n = 0;
    for cf in [CF_DATA, CF_META, CF_HEAD] {
        for item in store.db.iterator_cf(store.cf(cf), IteratorMode::Start) {
            let (key, _) = item.unwrap();
            let Some(p) = keys::split(&key) else { continue };
            let rest = if p.kind == keys::TRACE_ID {
                &p.rest[16..]
            } else {
                p.rest
            };
            if p.tenant == tenant.as_str()
                && p.kind != keys::HEAD
                && keys::read_u64(rest) == Some(window)
            {
                n += 1;
            }
        }
    }
    n
}

/// Small-store options where `tenant` keeps two hours of data, by `clock`.
fn two_hours_for(tenant: &TenantId, clock: Arc<crate::clock::ManualClock>) -> StoreOptions {
    use crate::retention::{Retention, RetentionRule};
    StoreOptions {
        retention: Retention {
            tenants: [(
                tenant.clone(),
                RetentionRule {
                    all: Some(Duration::from_secs(2 * 3600)),
                    ..Default::default()
                },
            )]
            .into(),
            ..Default::default()
        },
        clock,
        ..small_opts()
    }
}

#[test]
fn retention_hides_old_rows_at_once_and_deletes_windows_that_fell_out() {
    use crate::clock::ManualClock;
    const H: u64 = 3_600_000_000_000;
    let t0 = 1_000 * H; // a window boundary
    let clock = Arc::new(ManualClock::new(UnixNanos(t0)));
    let a = tenant("a");
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), two_hours_for(&a, clock.clone())).unwrap();
    // window 0: traces 1 and 2; window 1: trace 6, then trace 3, which the cutoff will
    // split; window 2: trace 4
    let mut spans: Vec<SpanRecord> = (0..50).map(|i| span_at(1, i, t0 + i * 1_000_000)).collect();
    spans.extend((0..50).map(|i| span_at(2, i, t0 + H / 2 + i)));
    spans.extend((0..10).map(|i| span_at(6, i, t0 + H + 10 + i)));
    spans.extend((0..10).map(|i| span_at(3, i, t0 + H + H / 2 - 5 + i)));
    spans.extend((0..10).map(|i| span_at(4, i, t0 + 2 * H + i)));
    store.append(&a, spans.clone()).unwrap();
    // another tenant with the same data keeps everything
    let b = tenant("b");
    store.append(&b, spans.clone()).unwrap();
    store.flush(true).unwrap();
    // rows in the head older than the cutoff are hidden too
    store.append(&a, vec![span_at(5, 1, t0 + 10)]).unwrap();
    store.db.flush().unwrap();
    store.compact();
    let bytes_before = store.rocksdb_property("rocksdb.live-sst-files-size");
    // a query that took its snapshot before window 0 fell out
    let earlier = store.snapshot(&a).unwrap();

    // 3.5 hours later the cutoff is t0 + 1.5h, inside trace 3
    let cutoff = t0 + H + H / 2;
    clock.set(UnixNanos(t0 + 3 * H + H / 2));
    assert_eq!(store.trace(&a, &TraceId([1; 16])).unwrap().len(), 0);
    assert_eq!(store.trace(&a, &TraceId([6; 16])).unwrap().len(), 0);
    assert_eq!(store.trace(&a, &TraceId([5; 16])).unwrap().len(), 0);
    let straddling = store.trace(&a, &TraceId([3; 16])).unwrap();
    assert_eq!(straddling.len(), 5, "only the spans at or after the cutoff");
    assert!(straddling.iter().all(|s| s.start.0 >= cutoff));
    assert_eq!(store.trace(&b, &TraceId([1; 16])).unwrap().len(), 50);
    let snap = store.snapshot(&a).unwrap();
    assert_eq!(snap.cutoff, Some(UnixNanos(cutoff)));
    assert!(snap.head.rows().all(|s| s.start.0 >= cutoff));
    let mut live = 0u64;
    for (addr, meta) in snap.blocks.iter() {
        assert!(addr.window > t0, "no block of window 0 is read");
        live += store
            .live_rows(&a, &snap, *addr, meta)
            .unwrap()
            .map_or(u64::from(meta.rows), |r| r.len());
    }
    assert_eq!(live, 15, "trace 3's newer half and trace 4");
    drop(snap);

    // window 0 ends at t0 + 1h, before the cutoff: it has fallen out, but a reader holds it
    store.enforce_retention().unwrap();
    assert!(
        keys_in_window(&store, &a, t0) > 0,
        "kept while a reader holds it"
    );
    assert_eq!(earlier.blocks.keys().filter(|a| a.window == t0).count(), 1);
    drop(earlier);
    assert!(store.enforce_retention().unwrap());
    assert_eq!(keys_in_window(&store, &a, t0), 0, "window 0 is gone");
    assert!(keys_in_window(&store, &a, t0 + H) > 0);
    assert!(keys_in_window(&store, &b, t0) > 0, "b keeps everything");
    assert!(store.stats.blocks_expired.load(Ordering::Relaxed) >= 1);
    let bytes_after = store.rocksdb_property("rocksdb.live-sst-files-size");
    assert!(bytes_after < bytes_before, "{bytes_after} < {bytes_before}");
    // the straddling trace still reads its newer half; after a restart too
    assert_eq!(store.trace(&a, &TraceId([3; 16])).unwrap().len(), 5);
    drop(store);
    let store = Store::open(
        dir.path(),
        StoreOptions {
            clock,
            ..small_opts()
        },
    )
    .unwrap();
    assert!(store.blocks(&a).iter().all(|(addr, _)| addr.window > t0));
    assert_eq!(store.trace(&b, &TraceId([1; 16])).unwrap().len(), 50);
}

fn rows_in(store: &Store, t: &TenantId) -> usize {
    store.blocks(t).iter().map(|(_, m)| m.rows as usize).sum()
}

#[test]
fn small_blocks_of_a_window_are_merged_and_every_read_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        merge_idle: Duration::ZERO,
        ..small_opts()
    };
    let store = Store::open(dir.path(), opts.clone()).unwrap();
    let t = tenant("a");
    let spans = random_traces(50, 60);
    for chunk in spans.chunks(40) {
        store.append(&t, chunk.to_vec()).unwrap();
        store.flush(true).unwrap();
    }
    let before = store.blocks(&t).len();
    assert!(before >= 20, "{before} small blocks");
    let keys_before = store.rocksdb_property("rocksdb.estimate-num-keys");
    let split_before = store.snapshot(&t).unwrap().splits.len();
    assert!(split_before > 0);
    assert!(store.merge_small_blocks().unwrap());
    let after = store.blocks(&t);
    // a trace is split exactly when more than one block holds it: merged whole, it is not
    let split_after = store.snapshot(&t).unwrap().splits.clone();
    assert!(split_after.len() < split_before);
    for id in by_trace(&spans).keys() {
        let blocks = store.trace_locations(&t, id).unwrap().len();
        assert_eq!(split_after.contains(id), blocks > 1, "{blocks} blocks");
    }
    let windows: HashSet<u64> = after.iter().map(|(a, _)| a.window).collect();
    assert!(
        after.len() <= windows.len() * (spans.len() / 500 + 2),
        "{} blocks in {} windows",
        after.len(),
        windows.len()
    );
    assert_eq!(rows_in(&store, &t), spans.len());
    for (id, want) in by_trace(&spans) {
        assert_same(&store.trace(&t, &id).unwrap(), &want);
    }
    // postings of the merged blocks agree with the data
    let mut v1 = 0;
    for (addr, _) in &after {
        v1 += store
            .postings(&t, *addr, "llm.model_version", "v1")
            .unwrap()
            .len();
    }
    let want = spans
        .iter()
        .filter(|s| s.attribute("llm.model_version") == Some(&Value::Str("v1".into())))
        .count();
    assert_eq!(v1 as usize, want);
    assert_eq!(
        store.stats.blocks_merged.load(Ordering::Relaxed) as usize,
        before
    );
    assert!(store.stats.blocks_deleted.load(Ordering::Relaxed) as usize >= before);
    store.db.flush().unwrap();
    store.compact();
    assert!(store.rocksdb_property("rocksdb.estimate-num-keys") < keys_before);
    // nothing more to merge; and the merged store reads the same after a restart
    assert!(!store.merge_small_blocks().unwrap());
    drop(store);
    let store = Store::open(dir.path(), opts).unwrap();
    assert_eq!(store.blocks(&t).len(), after.len());
    for (id, want) in by_trace(&spans) {
        assert_same(&store.trace(&t, &id).unwrap(), &want);
    }
}

#[test]
fn a_window_still_written_merges_one_size_tier_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        StoreOptions {
            merge_idle: Duration::from_secs(3600),
            ..small_opts()
        },
    )
    .unwrap();
    let t = tenant("a");
    let spans = random_traces(51, 12);
    let chunks: Vec<&[SpanRecord]> = spans.chunks(spans.len().div_ceil(3)).collect();
    for chunk in &chunks {
        store.append(&t, chunk.to_vec()).unwrap();
        store.flush(true).unwrap();
    }
    assert_eq!(store.blocks(&t).len(), 3);
    assert!(!store.merge_small_blocks().unwrap(), "three of a tier wait");
    store.append(&t, random_traces(52, 2)).unwrap();
    store.flush(true).unwrap();
    assert!(store.merge_small_blocks().unwrap(), "four of a tier merge");
    assert!(store.blocks(&t).len() < 4);
}

#[test]
fn merges_under_concurrent_reads_show_each_row_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        Store::open(
            dir.path(),
            StoreOptions {
                merge_idle: Duration::ZERO,
                ..small_opts()
            },
        )
        .unwrap(),
    );
    let t = tenant("a");
    let spans = random_traces(53, 40);
    let expected = by_trace(&spans);
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (store, t, stop, expected) =
                (store.clone(), t.clone(), stop.clone(), expected.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(Ordering::Acquire) {
                    for (id, want) in &expected {
                        let got = store.trace(&t, id).unwrap();
                        // a trace is read whole or (before its batch is appended) not at all
                        assert!(got.is_empty() || got.len() == want.len(), "{id:?}");
                        if !got.is_empty() {
                            assert_same(&got, want);
                        }
                    }
                    let snap = store.snapshot(&t).unwrap();
                    let rows: usize = snap.blocks.values().map(|m| m.rows as usize).sum();
                    assert!(rows + snap.head.rows().count() <= spans_len(&expected));
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let traces: Vec<&Vec<SpanRecord>> = expected.values().collect();
    for two in traces.chunks(2) {
        store
            .append(&t, two.iter().flat_map(|v| v.iter().cloned()).collect())
            .unwrap();
        store.flush(true).unwrap();
        store.merge_small_blocks().unwrap();
    }
    store.merge_small_blocks().unwrap();
    stop.store(true, Ordering::Release);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    assert_eq!(rows_in(&store, &t), spans.len());
    for (id, want) in &expected {
        assert_same(&store.trace(&t, id).unwrap(), want);
    }
}

fn spans_len(expected: &BTreeMap<TraceId, Vec<SpanRecord>>) -> usize {
    expected.values().map(Vec::len).sum()
}

#[test]
fn blocks_merged_before_a_crash_are_deleted_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        merge_idle: Duration::ZERO,
        ..small_opts()
    };
    let t = tenant("a");
    let spans = random_traces(54, 20);
    let merged_blocks;
    {
        let store = Store::open(dir.path(), opts.clone()).unwrap();
        for chunk in spans.chunks(spans.len().div_ceil(5)) {
            store.append(&t, chunk.to_vec()).unwrap();
            store.flush(true).unwrap();
        }
        let reader = store.snapshot(&t).unwrap(); // holds the old blocks: their data stays
        store.merge_small_blocks().unwrap();
        merged_blocks = store.blocks(&t).len();
        assert_eq!(store.lock().retired.len(), 5);
        drop(reader);
        // the process dies before the retention or merge task deletes them
    }
    let store = Store::open(dir.path(), opts).unwrap();
    assert_eq!(store.blocks(&t).len(), merged_blocks);
    assert_eq!(rows_in(&store, &t), spans.len());
    let graves = store
        .db
        .iterator_cf(store.cf(CF_META), IteratorMode::Start)
        .filter(|i| keys::split(&i.as_ref().unwrap().0).is_some_and(|p| p.kind == keys::GRAVE))
        .count();
    assert_eq!(
        graves, 0,
        "graves are deleted with their blocks' data at open"
    );
    for (id, want) in by_trace(&spans) {
        assert_same(&store.trace(&t, &id).unwrap(), &want);
    }
}

#[test]
fn rows_of_a_tenant_past_max_tenants_are_refused_and_known_tenants_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let opts = || StoreOptions {
        max_tenants: 2,
        ..small_opts()
    };
    let spans = random_traces(21, 2);
    {
        let store = Store::open(dir.path(), opts()).unwrap();
        store.append(&tenant("a"), spans.clone()).unwrap();
        store.append(&tenant("b"), spans.clone()).unwrap();
        let err = store.append(&tenant("c"), spans.clone()).unwrap_err();
        assert!(
            matches!(err, StorageError::TooManyTenants { max: 2 }),
            "{err}"
        );
        assert!(err.to_string().contains("--max-tenants"));
        assert_eq!(store.stats.refused_tenants.load(Ordering::Relaxed), 1);
        store.append(&tenant("a"), random_traces(22, 1)).unwrap();
        store.close().unwrap();
    }
    // the tenants of the blocks count after a restart
    let store = Store::open(dir.path(), opts()).unwrap();
    assert!(store.append(&tenant("c"), spans.clone()).is_err());
    store.append(&tenant("b"), random_traces(23, 1)).unwrap();
}

/// A trace's split key (it has rows in several blocks) goes when retention has taken every
/// block that holds the trace but one, and stays while two are left; after a restart too.
#[test]
fn split_keys_go_with_the_last_block_of_their_trace() {
    use crate::clock::ManualClock;
    const H: u64 = 3_600_000_000_000;
    let t0 = 1_000 * H;
    let clock = Arc::new(ManualClock::new(UnixNanos(t0)));
    let a = tenant("a");
    let dir = tempfile::tempdir().unwrap();
    let opts = two_hours_for(&a, clock.clone());
    let store = Store::open(dir.path(), opts.clone()).unwrap();
    // trace 1: two blocks of window 0; trace 2: a block of window 0 and two of window 2;
    // trace 3: a block of window 0 and one of window 2
    for batch in [
        vec![
            span_at(1, 1, t0 + 10),
            span_at(2, 1, t0 + 20),
            span_at(3, 1, t0 + 25),
        ],
        vec![span_at(1, 2, t0 + 30)],
        vec![
            span_at(2, 2, t0 + 2 * H + 10),
            span_at(3, 2, t0 + 2 * H + 15),
        ],
        vec![span_at(2, 3, t0 + 2 * H + 20)],
    ] {
        store.append(&a, batch).unwrap();
        store.flush(true).unwrap();
    }
    let split = |store: &Store| -> Vec<u8> {
        let mut ids: Vec<u8> = store
            .snapshot(&a)
            .unwrap()
            .splits
            .iter()
            .map(|t| t.0[0])
            .collect();
        ids.sort_unstable();
        ids
    };
    let split_keys = |store: &Store| -> usize {
        store
            .db
            .iterator_cf(store.cf(CF_META), rocksdb::IteratorMode::Start)
            .filter(|i| keys::split(&i.as_ref().unwrap().0).is_some_and(|p| p.kind == keys::SPLIT))
            .count()
    };
    assert_eq!(split(&store), vec![1, 2, 3]);
    assert_eq!(split_keys(&store), 3);
    // window 0 falls out: trace 1 has no block left, trace 2 two, trace 3 one
    clock.set(UnixNanos(t0 + 3 * H + H / 2));
    store.enforce_retention().unwrap();
    store.enforce_retention().unwrap();
    assert_eq!(store.trace(&a, &TraceId([2; 16])).unwrap().len(), 2);
    assert_eq!(store.trace(&a, &TraceId([3; 16])).unwrap().len(), 1);
    assert_eq!(split(&store), vec![2]);
    assert_eq!(split_keys(&store), 1);
    drop(store);
    let store = Store::open(dir.path(), opts).unwrap();
    assert_eq!(split(&store), vec![2]);
}

/// A trace cut at `max` spans is its earliest `max`, flagged with the count the index holds,
/// whether its rows are in one block (more than `max` of them: only `max` are decoded), in
/// several, or partly in the head; with no limit, or one it does not reach, every span.
#[test]
fn a_trace_read_with_a_limit_is_its_earliest_spans_and_says_how_many_there_are() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let t = tenant("limit");
    let base = 1_700_000_000_000_000_000u64;
    // ids descend as starts ascend: the order is by start, not by id
    let at = |i: u64| span_at(7, 1_000 - i, base + i * 10);
    store.append(&t, (0..15).rev().map(at).collect()).unwrap();
    store.flush(true).unwrap();
    let trace = TraceId([7; 16]);
    let all = store.trace(&t, &trace).unwrap();
    assert_eq!(all.len(), 15);
    let (cut, total) = store.trace_limited(&t, &trace, 10).unwrap();
    assert_eq!(total, Some(15));
    assert_eq!(cut, all[..10]);
    assert_eq!(
        store.trace_limited(&t, &trace, 15).unwrap(),
        (all.clone(), None)
    );
    assert_eq!(store.trace_limited(&t, &trace, 0).unwrap(), (all, None));

    // a second block, then the head
    store.append(&t, (15..20).map(at).collect()).unwrap();
    store.flush(true).unwrap();
    store.append(&t, (20..24).map(at).collect()).unwrap();
    let all = store.trace(&t, &trace).unwrap();
    assert_eq!(all.len(), 24);
    for max in [1, 5, 10, 16, 23] {
        let (cut, total) = store.trace_limited(&t, &trace, max).unwrap();
        assert_eq!(total, Some(24), "max {max}");
        assert_eq!(cut, all[..max], "max {max}");
    }
    assert_eq!(store.trace_limited(&t, &trace, 24).unwrap(), (all, None));
}
