//! Damage is detected, never served: a flipped byte in a column chunk, postings, a block meta
//! or a head record is caught by its checksum, named by block, and listed by `check`.

use super::*;

/// Flips one byte in the middle of the value under `key` in column family `cf`, through
/// RocksDB (as a bad disk or memory would have left it before RocksDB's own checksums).
fn flip(store: &Store, cf: &str, key: &[u8]) {
    let mut value = store.db.get_cf(store.cf(cf), key).unwrap().expect("value");
    let at = value.len() / 2;
    value[at] ^= 0x20;
    store.db.put_cf(store.cf(cf), key, value).unwrap();
}

fn first_key(store: &Store, cf: &str, kind: u8) -> Vec<u8> {
    store
        .db
        .iterator_cf(store.cf(cf), IteratorMode::Start)
        .map(|kv| kv.unwrap().0.to_vec())
        .find(|k| keys::split(k).is_some_and(|p| p.kind == kind))
        .expect("a key of that kind")
}

/// Why the store refuses to open.
fn refused(dir: &std::path::Path) -> String {
    Store::open(dir, small_opts())
        .err()
        .expect("refused")
        .to_string()
}

/// The store opened with `skip_corrupt_blocks`.
fn open_skipping(dir: &std::path::Path) -> Store {
    let opts = StoreOptions {
        skip_corrupt_blocks: true,
        ..small_opts()
    };
    Store::open(dir, opts).unwrap()
}

fn stored(dir: &std::path::Path, traces: usize) -> (TenantId, Vec<SpanRecord>) {
    let t = tenant("a");
    let spans = random_traces(11, traces);
    let store = Store::open(dir, small_opts()).unwrap();
    store.append(&t, spans.clone()).unwrap();
    store.close().unwrap();
    (t, spans)
}

#[test]
fn a_damaged_chunk_fails_the_read_naming_its_block_and_check_lists_it() {
    let dir = tempfile::tempdir().unwrap();
    let (t, spans) = stored(dir.path(), 40);
    assert!(check(dir.path()).unwrap().damaged.is_empty());
    let (block, column) = {
        let store = Store::open(dir.path(), small_opts()).unwrap();
        let key = keys::chunk(&t, Signal::Spans, store.blocks(&t)[0].0, "name");
        flip(&store, CF_DATA, &key);
        store.close().unwrap();
        (store.blocks(&t)[0].0, "name")
    };
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let errors: Vec<String> = by_trace(&spans)
        .keys()
        .filter_map(|id| store.trace(&t, id).err().map(|e| e.to_string()))
        .collect();
    assert!(!errors.is_empty(), "a read of the damaged block must fail");
    let want = format!(
        "spans block {}/{} of tenant a (column {column})",
        block.window, block.block
    );
    assert!(
        errors
            .iter()
            .all(|e| e.contains(&want) && e.contains("checksum mismatch")),
        "{errors:?}"
    );
    // traces in other blocks still read
    let ok = by_trace(&spans)
        .iter()
        .filter(|(id, want)| store.trace(&t, id).is_ok_and(|got| got.len() == want.len()))
        .count();
    assert!(ok > 0, "the undamaged blocks serve");
    drop(store);
    let report = check(dir.path()).unwrap();
    assert_eq!(report.damaged.len(), 1, "{report}");
    assert!(report.damaged[0].contains(&format!("block {}/{}", block.window, block.block)));
    assert!(report.damaged[0].contains("column name"), "{report}");
}

#[test]
fn damaged_postings_trace_summaries_and_metas_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _) = stored(dir.path(), 40);
    {
        let store = Store::open(dir.path(), small_opts()).unwrap();
        flip(&store, CF_DATA, &first_key(&store, CF_DATA, keys::POSTINGS));
        flip(&store, CF_DATA, &first_key(&store, CF_DATA, keys::TRACES));
        flip(&store, CF_META, &first_key(&store, CF_META, keys::META));
        store.close().unwrap();
    }
    let report = check(dir.path()).unwrap();
    assert_eq!(report.damaged.len(), 3, "{report}");
    for part in ["(postings ", "(trace summaries)", "(block meta)"] {
        assert!(
            report.damaged.iter().any(|d| d.contains(part)),
            "{part}: {report}"
        );
    }
    // a damaged meta stops the start, naming the block, unless told to leave it out
    let err = refused(dir.path());
    assert!(
        err.contains("(block meta): checksum mismatch") && err.contains("--skip-corrupt-blocks"),
        "{err}"
    );
    let store = open_skipping(dir.path());
    assert_eq!(store.stats.corrupt_skipped.load(Ordering::Relaxed), 1);
    assert!(!store.blocks(&t).is_empty(), "the other blocks are served");
}

#[test]
fn a_damaged_head_record_is_refused_or_left_out_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let t = tenant("a");
    let spans = random_traces(12, 10);
    {
        let store = Store::open(dir.path(), small_opts()).unwrap();
        store.append(&t, spans[..20].to_vec()).unwrap();
        store.append(&t, spans[20..].to_vec()).unwrap();
        // dropped without close: both batches live only in the head
    }
    {
        let db = DB::open_cf(&Options::default(), dir.path(), [CF_DATA, CF_META, CF_HEAD]).unwrap();
        let key = db
            .iterator_cf(db.cf_handle(CF_HEAD).unwrap(), IteratorMode::Start)
            .next()
            .unwrap()
            .unwrap()
            .0;
        let cf = db.cf_handle(CF_HEAD).unwrap();
        let mut value = db.get_cf(cf, &key).unwrap().unwrap();
        let at = value.len() / 2;
        value[at] ^= 1;
        db.put_cf(cf, &key, value).unwrap();
    }
    let report = check(dir.path()).unwrap();
    assert_eq!(report.damaged.len(), 1, "{report}");
    assert!(report.damaged[0].contains("head record"), "{report}");
    let err = refused(dir.path());
    assert!(
        err.contains("head record") && err.contains("--skip-corrupt-blocks"),
        "{err}"
    );
    let store = open_skipping(dir.path());
    assert_eq!(
        store.pending_rows(),
        spans.len() - 20,
        "the second batch replayed"
    );
}

/// With `skip_corrupt_blocks` the query that finds a damaged chunk fails, naming it, and the
/// block leaves every later snapshot whole (other columns of it are no longer read either),
/// is listed as damaged, and goes when retention takes its window.
#[test]
fn left_out_on_request_a_damaged_block_stays_out_until_retention_takes_it() {
    use crate::clock::ManualClock;
    const H: u64 = 3_600_000_000_000;
    let t0 = 1_000 * H;
    let clock = Arc::new(ManualClock::new(UnixNanos(t0)));
    let t = tenant("a");
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        skip_corrupt_blocks: true,
        ..two_hours_for(&t, clock.clone())
    };
    let (old, new) = {
        let store = Store::open(dir.path(), opts.clone()).unwrap();
        // window 0 holds traces 1 and 2, window 1 trace 3
        for (trace, at) in [(1u8, t0), (2, t0 + 10), (3, t0 + H + 10)] {
            let spans = (0..20).map(|i| span_at(trace, i, at + i)).collect();
            store.append(&t, spans).unwrap();
        }
        store.close().unwrap();
        let blocks = store.blocks(&t);
        assert_eq!(blocks.len(), 2, "{blocks:?}");
        flip(
            &store,
            CF_DATA,
            &keys::chunk(&t, Signal::Spans, blocks[0].0, "name"),
        );
        (blocks[0].0, blocks[1].0)
    };
    let store = Store::open(dir.path(), opts).unwrap();
    assert!(store.damaged_blocks(&t).is_empty(), "found only when read");
    let err = store.trace(&t, &TraceId([1; 16])).unwrap_err().to_string();
    assert!(
        err.contains(&format!("block {}/{}", old.window, old.block)) && err.contains("column name"),
        "{err}"
    );
    let damaged = store.damaged_blocks(&t);
    assert_eq!(damaged.len(), 1);
    assert_eq!((damaged[0].signal, damaged[0].addr), (Signal::Spans, old));
    assert_eq!(damaged[0].error, err);
    assert_eq!(store.damaged_count(&t), 1);
    assert_eq!(store.damaged_count(&tenant("b")), 0);
    assert_eq!(store.stats.blocks_left_out.load(Ordering::Relaxed), 1);
    // asked again, the answer leaves the block out: no rows of trace 1 or 2, trace 3 whole
    assert_eq!(store.trace(&t, &TraceId([1; 16])).unwrap().len(), 0);
    assert_eq!(store.trace(&t, &TraceId([2; 16])).unwrap().len(), 0);
    assert_eq!(store.trace(&t, &TraceId([3; 16])).unwrap().len(), 20);
    let snapshot = store.snapshot(&t).unwrap();
    assert_eq!(
        snapshot.blocks.keys().copied().collect::<Vec<_>>(),
        vec![new]
    );
    drop(snapshot);
    // a second find of the same damage changes nothing
    let _ = store.damaged(&t, Signal::Spans, old, "column name", "again");
    assert_eq!(store.damaged_count(&t), 1);

    // 3.5 hours on, window 0 falls out of retention: the damaged block goes from disk too
    clock.set(UnixNanos(t0 + 3 * H + H / 2));
    store.enforce_retention().unwrap();
    store.enforce_retention().unwrap();
    assert_eq!(store.damaged_count(&t), 0);
    assert_eq!(
        keys_in_window(&store, &t, old.window),
        0,
        "its data is deleted"
    );
    drop(store);
    assert!(check(dir.path()).unwrap().damaged.is_empty());
}

/// A block whose meta failed at open is listed as damaged (its rows are unknown, so it stays
/// listed until it is dealt with by hand).
#[test]
fn a_block_left_out_at_open_is_listed_as_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _) = stored(dir.path(), 40);
    {
        let store = Store::open(dir.path(), small_opts()).unwrap();
        flip(&store, CF_META, &first_key(&store, CF_META, keys::META));
        store.close().unwrap();
    }
    let store = open_skipping(dir.path());
    let damaged = store.damaged_blocks(&t);
    assert_eq!(damaged.len(), 1);
    assert!(damaged[0].error.contains("(block meta)"), "{}", damaged[0]);
    assert_eq!(store.damaged_total(), 1);
}
