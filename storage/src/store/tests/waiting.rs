//! Traces kept in the head while a span's parent is missing, so that they reach a block whole.

use super::*;

fn opts() -> StoreOptions {
    StoreOptions {
        // every flush is due
        flush_age: Duration::ZERO,
        ..small_opts()
    }
}

/// The generate spans (roots) and the token spans of `spans`.
fn roots_and_children(spans: &[SpanRecord]) -> (Vec<SpanRecord>, Vec<SpanRecord>) {
    spans
        .iter()
        .cloned()
        .partition(|s| s.parent_span_id.is_none())
}

fn locations(store: &Store, t: &TenantId, trace: &TraceId) -> usize {
    store
        .trace_locations_in(t, &store.snapshot(t).unwrap(), trace)
        .unwrap()
        .len()
}

#[test]
fn children_sent_before_their_parent_wait_for_it_and_reach_one_block() {
    let dir = tempfile::tempdir().unwrap();
    let t = tenant("a");
    let spans = random_traces(7, 30);
    let expected = by_trace(&spans);
    let (roots, children) = roots_and_children(&spans);
    {
        let store = Store::open(dir.path(), opts()).unwrap();
        store.append(&t, children.clone()).unwrap();
        assert_eq!(store.flush(false).unwrap(), 0, "every trace waits");
        assert_eq!(store.pending_rows(), children.len());
        assert_eq!(
            store.stats.rows_waiting.load(Ordering::Relaxed),
            children.len() as u64
        );
        for (trace, want) in &expected {
            let want: Vec<_> = want
                .iter()
                .filter(|s| s.parent_span_id.is_some())
                .cloned()
                .collect();
            assert_same(&store.trace(&t, trace).unwrap(), &want);
        }
    }
    // the kept rows were written to the write-ahead again: a restart finds them
    let store = Store::open(dir.path(), opts()).unwrap();
    assert_eq!(store.pending_rows(), children.len());
    store.append(&t, roots).unwrap();
    assert!(store.flush(false).unwrap() > 0);
    assert_eq!(store.pending_rows(), 0);
    for (trace, want) in &expected {
        assert_same(&store.trace(&t, trace).unwrap(), want);
        assert_eq!(locations(&store, &t, trace), 1, "one block holds the trace");
    }
    assert!(store.snapshot(&t).unwrap().splits.is_empty());
    // a retry of a kept span is still stored once
    let again = store.append(&t, children[..5].to_vec()).unwrap();
    assert_eq!(again.duplicates, 5);
}

#[test]
fn a_parent_that_never_comes_is_waited_for_a_bounded_number_of_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let t = tenant("a");
    let spans = random_traces(8, 20);
    let (roots, children) = roots_and_children(&spans);
    let store = Store::open(dir.path(), opts()).unwrap();
    // whole traces go at once, orphans wait
    let whole: Vec<SpanRecord> = spans[..]
        .iter()
        .filter(|s| s.trace_id == roots[0].trace_id)
        .cloned()
        .collect();
    let orphans: Vec<SpanRecord> = children
        .iter()
        .filter(|s| s.trace_id != roots[0].trace_id)
        .cloned()
        .collect();
    store.append(&t, whole.clone()).unwrap();
    store.append(&t, orphans.clone()).unwrap();
    let waits = store.options().parent_wait_flushes as usize;
    assert_eq!(waits, 2);
    assert_eq!(store.flush(false).unwrap(), 1);
    assert_eq!(store.pending_rows(), orphans.len());
    for _ in 1..waits {
        assert_eq!(store.flush(false).unwrap(), 0);
        assert_eq!(store.pending_rows(), orphans.len());
    }
    assert!(store.flush(false).unwrap() > 0);
    assert_eq!(store.pending_rows(), 0);
    assert_eq!(
        store.stats.rows_waiting.load(Ordering::Relaxed),
        (waits * orphans.len()) as u64
    );
    let mut all = whole;
    all.extend(orphans);
    for (trace, want) in by_trace(&all) {
        assert_same(&store.trace(&t, &trace).unwrap(), &want);
    }
}

#[test]
fn a_forced_flush_no_wait_or_a_remote_parent_keeps_nothing_back() {
    let spans = random_traces(9, 10);
    let (_, children) = roots_and_children(&spans);
    let t = tenant("a");
    let mut remote = children.clone();
    for s in &mut remote {
        s.flags = 0x301; // sampled; the parent is remote (in another process)
    }
    for (force, waits, children) in [
        (true, 2, &children),
        (false, 0, &children),
        (false, 2, &remote),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(
            dir.path(),
            StoreOptions {
                parent_wait_flushes: waits,
                ..opts()
            },
        )
        .unwrap();
        store.append(&t, children.clone()).unwrap();
        assert!(store.flush(force).unwrap() > 0);
        assert_eq!(store.pending_rows(), 0);
    }
}
