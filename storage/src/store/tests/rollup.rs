//! Operation rollups and heat rollups against a naive count over the spans: whole blocks
//! (the rollup written with them), blocks a range cuts, head rows, traces split across blocks,
//! merged blocks.

use super::*;
use crate::heat::Track;
use crate::rollup::{Op, OpRollup};
use crate::sketch::RELATIVE_ERROR;

/// Random traces with a gateway span over each generate span, shuffled so that a trace's
/// spans land in several blocks.
fn spans(seed: u64) -> Vec<SpanRecord> {
    let mut spans = random_traces(seed, 120);
    let mut rng = StdRng::seed_from_u64(seed);
    let gateway = Arc::new(Resource {
        attributes: vec![KeyValue::new("service.name", Value::Str("gateway".into()))],
        ..Default::default()
    });
    let roots: Vec<SpanRecord> = spans
        .iter()
        .filter(|s| s.parent_span_id.is_none())
        .cloned()
        .collect();
    for (i, r) in roots.iter().enumerate() {
        if i % 3 == 0 {
            continue; // a generate span that stays a root
        }
        let id = SpanId(rng.random::<[u8; 8]>().map(|b| b | 4));
        let g = spans
            .iter_mut()
            .find(|s| s.trace_id == r.trace_id && s.span_id == r.span_id)
            .unwrap();
        g.parent_span_id = Some(id);
        spans.push(SpanRecord {
            span_id: id,
            // one in four continues a caller's trace: its parent is never sent
            parent_span_id: (i % 4 == 1).then(|| SpanId(rng.random::<[u8; 8]>().map(|b| b | 4))),
            name: "POST /v1/chat".into(),
            start: UnixNanos(r.start.0 - 1_000),
            end: UnixNanos(r.end.0 + 5_000 * (i as u64 % 7)),
            resource: gateway.clone(),
            // half the gateway spans carry a request value (an anchor its children's rows
            // complete theirs from), half carry none (their trace is resolved whole)
            attributes: if i % 2 == 0 {
                vec![KeyValue::new(
                    "gen_ai.provider.name",
                    Value::Str("vllm".into()),
                )]
            } else {
                vec![]
            },
            events: vec![],
            links: vec![],
            status_code: if i % 5 == 0 {
                StatusCode::Error
            } else {
                StatusCode::Unset
            },
            ..r.clone()
        });
    }
    // shuffle by small runs: traces split, token spans mostly together
    let mut runs: Vec<Vec<SpanRecord>> = spans.chunks(7).map(<[_]>::to_vec).collect();
    for i in (1..runs.len()).rev() {
        runs.swap(i, rng.random_range(0..=i));
    }
    runs.concat()
}

fn percentile_cont(sorted: &[f64], q: f64) -> f64 {
    let rank = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (sorted[rank.floor() as usize], sorted[rank.ceil() as usize]);
    lo + (rank - rank.floor()) * (hi - lo)
}

/// Checks a rollup against the spans starting in `[lo, hi)`.
fn assert_agrees(got: &OpRollup, all: &[SpanRecord], lo: u64, hi: u64) {
    let spans: Vec<&SpanRecord> = all
        .iter()
        .filter(|s| (lo..hi).contains(&s.start.0))
        .collect();
    // calls, errors, summed duration, durations
    type Node = (u64, u64, u128, Vec<f64>);
    let mut nodes: BTreeMap<Op, Node> = BTreeMap::new();
    let mut edges: BTreeMap<(Op, Op), u64> = BTreeMap::new();
    let mut roots = 0u128;
    let op = |s: &SpanRecord| (s.service_name().to_owned(), s.name.clone());
    let by_id: HashMap<(TraceId, SpanId), &SpanRecord> = spans
        .iter()
        .map(|s| ((s.trace_id, s.span_id), *s))
        .collect();
    for s in &spans {
        let n = nodes.entry(op(s)).or_default();
        n.0 += 1;
        n.1 += u64::from(s.status_code == StatusCode::Error);
        n.2 += u128::from(s.duration_ns());
        n.3.push(s.duration_ns() as f64);
        match s.parent_span_id {
            None => roots += u128::from(s.duration_ns()),
            Some(p) => {
                if let Some(parent) = by_id.get(&(s.trace_id, p)) {
                    *edges.entry((op(parent), op(s))).or_default() += 1;
                }
            }
        }
    }
    assert!(got.orphans.is_empty());
    assert_eq!(got.roots_ns, roots);
    let got_nodes: BTreeMap<_, _> = got
        .ops
        .iter()
        .zip(&got.nodes)
        .filter(|(_, n)| n.calls > 0)
        .collect();
    assert_eq!(got_nodes.len(), nodes.len());
    for (key, (calls, errors, sum, mut d)) in nodes {
        let n = got_nodes[&key];
        assert_eq!(
            (n.calls, n.errors, n.sum_ns),
            (calls, errors, sum),
            "{key:?}"
        );
        d.sort_by(f64::total_cmp);
        for q in [0.5, 0.99] {
            let want = percentile_cont(&d, q);
            let have = n.durations.quantile(q).unwrap();
            assert!(
                (have - want).abs() <= RELATIVE_ERROR * want + 1e-9,
                "{key:?} q{q}: {have} vs {want}"
            );
        }
    }
    let got_edges: BTreeMap<_, _> = got
        .edges
        .iter()
        .map(|((p, c), e)| {
            (
                (got.ops[*p as usize].clone(), got.ops[*c as usize].clone()),
                e.calls,
            )
        })
        .collect();
    assert_eq!(got_edges, edges);
}

#[test]
fn operation_rollups_agree_with_a_naive_count_over_blocks_ranges_head_and_merges() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        merge_idle: Duration::ZERO,
        ..small_opts()
    };
    let store = Store::open(dir.path(), opts).unwrap();
    let t = tenant("a");
    let all = spans(31);
    let (flushed, head) = all.split_at(all.len() - 150);
    for chunk in flushed.chunks(230) {
        store.append(&t, chunk.to_vec()).unwrap();
        store.flush(true).unwrap();
    }
    store.append(&t, head.to_vec()).unwrap();
    assert!(store.blocks(&t).len() >= 5);
    assert!(!store.snapshot(&t).unwrap().splits.is_empty());
    // cuts inside requests: generate spans out of range, some of their tokens in
    let mut generates: Vec<u64> = all
        .iter()
        .filter(|s| s.name == "llm.generate")
        .map(|s| s.start.0)
        .collect();
    generates.sort_unstable();
    let cut = (generates[40] + 300_000_000, generates[80] + 300_000_000);
    let check = |store: &Store| {
        let whole = store.operation_rollup(&t, None, None).unwrap();
        assert!(
            whole.edges.len() >= 2 && whole.ops.len() == 3,
            "{:?}",
            whole.ops
        );
        assert_agrees(&whole, &all, 0, u64::MAX);
        // cached the second time: the same answer
        assert_agrees(
            &store.operation_rollup(&t, None, None).unwrap(),
            &all,
            0,
            u64::MAX,
        );
        let part = store
            .operation_rollup(&t, Some(cut.0), Some(cut.1))
            .unwrap();
        assert_agrees(&part, &all, cut.0, cut.1);
        let open = store.operation_rollup(&t, Some(cut.1), None).unwrap();
        assert_agrees(&open, &all, cut.1, u64::MAX);
    };
    check(&store);
    store.flush(true).unwrap();
    check(&store);
    assert!(store.merge_small_blocks().unwrap());
    check(&store);
    // another tenant sees nothing
    let none = store.operation_rollup(&tenant("b"), None, None).unwrap();
    assert!(none.ops.is_empty() && none.roots_ns == 0);
}

/// Which operations (service, name) a heat check counts.
type Keep = dyn Fn(&str, &str) -> bool;

/// A request row as the naive walk sees it: ids, request values, TTFT.
type WantRequest = (TraceId, SpanId, Vec<Option<String>>, Option<f64>);

/// The values of a request table's tuple.
fn tuple_strings(r: &crate::requests::RequestRollup, tuple: u32) -> Vec<Option<String>> {
    r.tuples[tuple as usize]
        .iter()
        .map(|&v| (v != crate::requests::NONE).then(|| r.terms[v as usize].clone()))
        .collect()
}

/// (second, log2 bucket) → (count, greatest trace id).
type HeatCells = BTreeMap<(u64, i16), (u64, TraceId)>;

fn add_cell(cells: &mut HeatCells, second: u64, bucket: i16, n: u64, ex: TraceId) {
    let c = cells.entry((second, bucket)).or_insert((0, ex));
    c.0 += n;
    c.1 = c.1.max(ex);
}

fn heat(
    store: &Store,
    t: &TenantId,
    range: (Option<u64>, Option<u64>),
    track: Track,
    keep: &dyn Fn(&str, &str) -> bool,
) -> Option<HeatCells> {
    let mut cells = HeatCells::new();
    let answered = store
        .heat_cells(t, range.0, range.1, track, keep, &mut |s, b, n, ex| {
            add_cell(&mut cells, s, b, n, *ex)
        })
        .unwrap();
    answered.then_some(cells)
}

/// The cells counted from the spans: SQL's heatmap, `ceil(log2(ms))`.
fn naive_heat(
    all: &[SpanRecord],
    range: (Option<u64>, Option<u64>),
    track: Track,
    keep: &dyn Fn(&str, &str) -> bool,
) -> HeatCells {
    let (lo, hi) = (range.0.unwrap_or(0), range.1.unwrap_or(u64::MAX));
    let mut cells = HeatCells::new();
    for s in all {
        if !(lo..hi).contains(&s.start.0) || !keep(s.service_name(), &s.name) {
            continue;
        }
        let duration = s.duration_ns() as f64 / 1e6;
        let v = match track {
            Track::Duration => duration,
            Track::Itl | Track::ItlBin if s.name == "llm.decode.token" => {
                match s.attribute("llm.token.latency_ms") {
                    Some(Value::Double(v)) => *v,
                    _ => duration,
                }
            }
            Track::Itl | Track::ItlBin => continue,
        };
        let (b, exemplar) = match track {
            // the 1% sketch bin, no exemplar
            Track::ItlBin => (
                (v.ln() / crate::sketch::gamma().ln()).ceil() as i16,
                TraceId([0; 16]),
            ),
            _ if v > 0.0 => (v.log2().ceil() as i16, s.trace_id),
            _ => (-1075, s.trace_id),
        };
        add_cell(&mut cells, s.start.0 / 1_000_000_000, b, 1, exemplar);
    }
    cells
}

#[test]
fn heat_rollups_agree_with_a_naive_count_over_blocks_whole_second_ranges_head_and_merges() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        merge_idle: Duration::ZERO,
        ..small_opts()
    };
    let store = Store::open(dir.path(), opts).unwrap();
    let t = tenant("a");
    let mut all = spans(37);
    // a token span without its own latency: its duration counts
    let token = all
        .iter_mut()
        .find(|s| s.name == "llm.decode.token")
        .unwrap();
    token
        .attributes
        .retain(|kv| kv.key != "llm.token.latency_ms");
    let (flushed, head) = all.split_at(all.len() - 150);
    for chunk in flushed.chunks(230) {
        store.append(&t, chunk.to_vec()).unwrap();
        store.flush(true).unwrap();
    }
    store.append(&t, head.to_vec()).unwrap();
    assert!(store.blocks(&t).len() >= 5);
    let mut starts: Vec<u64> = all.iter().map(|s| s.start.0).collect();
    starts.sort_unstable();
    let second = |t: u64| t / 1_000_000_000 * 1_000_000_000;
    let aligned = (
        second(starts[starts.len() / 4]),
        second(starts[starts.len() * 3 / 4]),
    );
    let everything = |_: &str, _: &str| true;
    let engine_tokens = |s: &str, n: &str| s == "engine" && n == "llm.decode.token";
    let generate = |_: &str, n: &str| n == "llm.generate";
    let check = |store: &Store| {
        let ranges = [
            (None, None),
            (Some(aligned.0), Some(aligned.1)),
            (Some(aligned.1), None),
            (None, Some(aligned.0)),
        ];
        let filters: [(Track, &Keep); 5] = [
            (Track::Itl, &everything),
            (Track::ItlBin, &everything),
            (Track::Itl, &engine_tokens),
            (Track::Duration, &everything),
            (Track::Duration, &generate),
        ];
        for range in ranges {
            for (track, keep) in filters {
                let want = naive_heat(&all, range, track, keep);
                assert!(!want.is_empty());
                let got = heat(store, &t, range, track, keep);
                assert_eq!(got.as_ref(), Some(&want), "{range:?} {track:?}");
            }
        }
        // an end inside a second that a block holds rows of: not answered, or answered right
        let inside = (Some(aligned.0 + 1), Some(aligned.1 - 1));
        if let Some(got) = heat(store, &t, inside, Track::Duration, &everything) {
            assert_eq!(got, naive_heat(&all, inside, Track::Duration, &everything));
        }
    };
    check(&store);
    // an end inside a second cuts a block here: not answered from the cells
    assert_eq!(
        heat(
            &store,
            &t,
            (Some(aligned.0 + 1), None),
            Track::Duration,
            &everything
        ),
        None
    );
    store.flush(true).unwrap();
    check(&store);
    assert!(store.merge_small_blocks().unwrap());
    check(&store);
    assert_eq!(
        heat(&store, &tenant("b"), (None, None), Track::Itl, &everything),
        Some(HeatCells::new())
    );
}

/// A span's request values found by walking its ancestors one at a time, as terms.
fn naive_values(all: &[SpanRecord], span: &SpanRecord) -> Vec<Option<String>> {
    crate::request::request_dims()
        .iter()
        .map(|&col| {
            let mut cur = span;
            loop {
                if let Some(v) = crate::request::dedicated_value(cur, col) {
                    return v.as_term();
                }
                let parent = cur.parent_span_id?;
                cur = all
                    .iter()
                    .find(|s| s.trace_id == cur.trace_id && s.span_id == parent)?;
            }
        })
        .collect()
}

#[test]
fn request_tables_agree_with_a_naive_ancestor_walk_over_blocks_head_and_merges() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        merge_idle: Duration::ZERO,
        ..small_opts()
    };
    let store = Store::open(dir.path(), opts).unwrap();
    let t = tenant("a");
    let mut all = spans(41);
    // two generate spans in three are request spans (a model asked, a TTFT measured)
    for (i, s) in all
        .iter_mut()
        .filter(|s| s.name == "llm.generate")
        .enumerate()
    {
        if i % 3 != 0 {
            s.attributes.push(KeyValue::new(
                "gen_ai.request.model",
                Value::Str("m".into()),
            ));
            s.attributes.push(KeyValue::new(
                "gen_ai.latency.time_to_first_token",
                Value::Double(i as f64 / 100.0),
            ));
        }
    }
    let (flushed, head) = all.split_at(all.len() - 150);
    for chunk in flushed.chunks(230) {
        store.append(&t, chunk.to_vec()).unwrap();
        store.flush(true).unwrap();
    }
    store.append(&t, head.to_vec()).unwrap();
    assert!(!store.snapshot(&t).unwrap().splits.is_empty());
    type Counts = BTreeMap<Vec<Option<String>>, u64>;
    let mut want_spans = Counts::new();
    let mut want_requests: Vec<WantRequest> = Vec::new();
    for s in &all {
        let v = naive_values(&all, s);
        *want_spans.entry(v.clone()).or_default() += 1;
        if crate::requests::is_request(s) {
            let ttft = match s.attribute("gen_ai.latency.time_to_first_token") {
                Some(Value::Double(x)) => Some(*x),
                _ => None,
            };
            want_requests.push((s.trace_id, s.span_id, v, ttft));
        }
    }
    want_requests.sort_by_key(|a| (a.0, a.1));
    assert!(want_requests.len() > 50);
    let every: Vec<usize> = (0..crate::request::request_dims().len()).collect();
    let check = |store: &Store| {
        // every slot: the tuples as written; one slot: rows sharing it share a tuple
        let one = store
            .request_table(&t, None, None, true, &[every.len() - 1])
            .unwrap()
            .unwrap();
        assert_eq!(one.rollup.tuples.iter().map(Vec::len).max(), Some(1));
        assert_eq!(one.rollup.spans.iter().sum::<u64>(), all.len() as u64);
        let table = store
            .request_table(&t, None, None, true, &every)
            .unwrap()
            .expect("answered");
        let r = &table.rollup;
        let strings = |tuple: u32| tuple_strings(r, tuple);
        let mut got = Counts::new();
        for (i, n) in r.spans.iter().enumerate() {
            if *n > 0 {
                *got.entry(strings(i as u32)).or_default() += n;
            }
        }
        assert_eq!(got, want_spans);
        let mut requests: Vec<_> = r
            .requests
            .iter()
            .map(|q| (q.trace, q.span, strings(q.tuple), q.ttft))
            .collect();
        requests.sort_by_key(|a| (a.0, a.1));
        assert_eq!(requests, want_requests);
        // request rows alone over a range cutting blocks: those starting in it
        let mut starts: Vec<u64> = all.iter().map(|s| s.start.0).collect();
        starts.sort_unstable();
        let (lo, hi) = (starts[starts.len() / 3], starts[starts.len() * 2 / 3]);
        let part = store
            .request_table(&t, Some(lo), Some(hi), false, &every)
            .unwrap()
            .expect("answered");
        let in_range: Vec<WantRequest> = want_requests
            .iter()
            .filter(|q| {
                let s = all
                    .iter()
                    .find(|s| s.span_id == q.1 && s.trace_id == q.0)
                    .unwrap();
                (lo..hi).contains(&s.start.0)
            })
            .cloned()
            .collect();
        let r = &part.rollup;
        let mut got: Vec<WantRequest> = r
            .requests
            .iter()
            .map(|q| (q.trace, q.span, tuple_strings(r, q.tuple), q.ttft))
            .collect();
        got.sort_by_key(|a| (a.0, a.1));
        assert_eq!(got, in_range);
        // with span counts, a range end inside a block is declined
        assert!(
            store
                .request_table(&t, Some(lo), Some(hi), true, &every)
                .unwrap()
                .is_none()
        );
    };
    check(&store);
    store.flush(true).unwrap();
    check(&store);
    assert!(store.merge_small_blocks().unwrap());
    check(&store);
}

#[test]
fn request_tables_complete_open_rows_from_a_block_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let t = tenant("a");
    let span =
        |trace: u8, id: u8, parent: Option<u8>, start: u64, attrs: Vec<KeyValue>| SpanRecord {
            trace_id: TraceId([trace; 16]),
            span_id: SpanId([id; 8]),
            parent_span_id: parent.map(|p| SpanId([p; 8])),
            name: format!("s{id}"),
            kind: SpanKind::Server,
            start: UnixNanos(start),
            end: UnixNanos(start + 10),
            attributes: attrs,
            ..Default::default()
        };
    let s = |k: &str, v: &str| KeyValue::new(k, Value::Str(v.into()));
    let request = || vec![s("gen_ai.request.model", "m"), s("worker.id", "w-7")];
    // trace 3: the gateway span carries the provider, in a block of its own long before the
    // rest, and continues a caller's trace (its parent, span 9, is never sent)
    let gateway = span(
        3,
        1,
        Some(9),
        1_000,
        vec![s("gen_ai.provider.name", "vllm")],
    );
    let generate = span(3, 2, Some(1), 1_000_000, request());
    let token = span(3, 3, Some(2), 1_000_100, vec![]);
    // trace 4: between the generate span and the gateway a span carrying nothing (the chain
    // passes through it: the trace is resolved whole)
    let gateway4 = span(4, 1, None, 1_000, vec![s("gen_ai.provider.name", "vllm")]);
    let middle = span(4, 5, Some(1), 1_001, vec![]);
    let generate4 = span(4, 2, Some(5), 1_000_000, request());
    store.append(&t, vec![gateway, gateway4, middle]).unwrap();
    store.flush(true).unwrap();
    store
        .append(&t, vec![generate, token.clone(), generate4])
        .unwrap();
    store.flush(true).unwrap();
    let dims = crate::request::request_dims();
    let slot = |name: &str| {
        dims.iter()
            .position(|&c| crate::schema::DEDICATED[c].name == name)
            .unwrap()
    };
    // no span carries a model version: every chain goes up to its end
    let slots = [
        slot("gen_ai.provider.name"),
        slot("worker.id"),
        slot("llm.model_version"),
    ];
    let want = vec![Some("vllm".to_owned()), Some("w-7".to_owned()), None];
    let counted = |r: &crate::requests::RequestRollup| -> Vec<(Vec<Option<String>>, u64)> {
        (0..r.tuples.len())
            .filter(|&i| r.spans[i] > 0)
            .map(|i| (tuple_strings(r, i as u32), r.spans[i]))
            .collect()
    };
    for spans in [false, true] {
        let table = store
            .request_table(&t, Some(500_000), None, spans, &slots)
            .unwrap()
            .expect("answered");
        let r = &table.rollup;
        assert_eq!(r.requests.len(), 2);
        for q in &r.requests {
            assert_eq!(tuple_strings(r, q.tuple), want);
        }
        if spans {
            assert_eq!(counted(r), vec![(want.clone(), 3)]);
        }
    }
    // the same through the head: the token span's values from the blocks' anchors
    let late = SpanRecord {
        span_id: SpanId([4; 8]),
        ..token
    };
    store.append(&t, vec![late]).unwrap();
    let table = store
        .request_table(&t, Some(500_000), None, true, &slots)
        .unwrap()
        .expect("answered");
    assert_eq!(counted(&table.rollup), vec![(want, 4)]);
}
