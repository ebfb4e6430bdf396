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
