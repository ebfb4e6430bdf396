//! Operation rollups against a naive count over the spans: whole blocks (the rollup written
//! with them), blocks a range cuts, head rows, traces split across blocks, merged blocks.

use super::*;
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
            parent_span_id: None,
            name: "POST /v1/chat".into(),
            start: UnixNanos(r.start.0 - 1_000),
            end: UnixNanos(r.end.0 + 5_000 * (i as u64 % 7)),
            resource: gateway.clone(),
            attributes: vec![],
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
    assert!(!store.snapshot(&t).splits.is_empty());
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
