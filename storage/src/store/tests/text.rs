//! The text index beside the log blocks: it answers what a naive word match answers, follows
//! flushes, merges and expiry, and catches up at open after a crash before its commit.

use std::collections::BTreeSet;

use tantivy::Term;
use tantivy::query::{PhraseQuery, Query, TermQuery};
use tantivy::schema::IndexRecordOption;

use super::logs::random_logs;
use super::*;
use crate::text::tokenizer::tokens;

/// Every block row whose `field` has all of `words` in a row (naively, over decoded records).
fn naive(store: &Store, t: &TenantId, field: &str, words: &[&str]) -> BTreeSet<(u64, u32)> {
    let snapshot = store.log_snapshot(t).unwrap();
    let mut out = BTreeSet::new();
    for (addr, meta) in snapshot.blocks.iter() {
        let reader = store.reader_of(t, Signal::Logs, *addr, meta);
        for (row, l) in crate::block::logs::read(&reader, &Rows::All)
            .unwrap()
            .iter()
            .enumerate()
        {
            let text = match field {
                "body" => l.body_text().unwrap_or_default(),
                "class" => l.semantics.class.as_str().to_owned(),
                _ => unreachable!(),
            };
            let have: Vec<String> = tokens(&text, field != "body")
                .into_iter()
                .map(|t| t.text)
                .collect();
            if have.windows(words.len()).any(|w| w == words) {
                out.insert((addr.block, row as u32));
            }
        }
    }
    out
}

fn indexed(store: &Store, t: &TenantId, query: &dyn Query) -> BTreeSet<(u64, u32)> {
    let snapshot = store.log_snapshot(t).unwrap();
    let windows: BTreeSet<u64> = snapshot.blocks.keys().map(|a| a.window).collect();
    let mut out = BTreeSet::new();
    for w in windows {
        let view = store.text_view(t, w).unwrap().expect("an index per window");
        let ids: BTreeSet<u64> = snapshot
            .blocks
            .keys()
            .filter(|a| a.window == w)
            .map(|a| a.block)
            .collect();
        assert_eq!(
            *view.blocks, ids,
            "the index holds exactly the window's blocks"
        );
        for (block, rows) in view.hits(query).unwrap() {
            out.extend(rows.iter().map(|r| (block, r)));
        }
    }
    out
}

fn check(store: &Store, t: &TenantId) {
    let f = store.text_fields();
    let term = |field: &str, w: &str| -> Box<dyn Query> {
        Box::new(TermQuery::new(
            Term::from_field_text(f.field(field).unwrap(), w),
            IndexRecordOption::Basic,
        ))
    };
    for (field, words) in [
        ("body", vec!["decode"]),
        ("body", vec!["request"]),
        ("body", vec!["step", "3"]),
        ("body", vec!["prefill_ms"]),
        ("class", vec!["prompt_input"]),
        ("class", vec!["inference_metrics"]),
    ] {
        let query: Box<dyn Query> = if words.len() == 1 {
            term(field, words[0])
        } else {
            Box::new(PhraseQuery::new(
                words
                    .iter()
                    .map(|w| Term::from_field_text(f.field(field).unwrap(), w))
                    .collect(),
            ))
        };
        let want = naive(store, t, field, &words);
        assert!(!want.is_empty(), "{field}: {words:?} matches something");
        assert_eq!(
            indexed(store, t, query.as_ref()),
            want,
            "{field}: {words:?}"
        );
    }
}

#[test]
fn the_text_index_answers_what_the_records_say_through_flushes_merges_restarts_and_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let t = tenant("a");
    let opts = StoreOptions {
        flush_rows: 300,
        ..Default::default()
    };
    {
        let store = Store::open(dir.path(), opts.clone()).unwrap();
        for chunk in random_logs(5, 2000).chunks(400) {
            store.append_logs(&t, chunk.to_vec()).unwrap();
            store.flush(true).unwrap();
        }
        check(&store, &t);
        // a flush that is not forced leaves the index to the index task
        let blocks = |store: &Store| -> BTreeSet<BlockAddr> {
            let snapshot = store.log_snapshot(&t).unwrap();
            snapshot.blocks.keys().copied().collect()
        };
        let before = blocks(&store);
        store.append_logs(&t, random_logs(7, 400)).unwrap();
        assert!(store.flush(false).unwrap() > 0);
        let after = blocks(&store);
        let new: Vec<&BlockAddr> = after.difference(&before).collect();
        assert!(!new.is_empty());
        for addr in &new {
            let view = store.text_view(&t, addr.window).unwrap();
            assert!(
                view.is_none_or(|v| !v.blocks.contains(&addr.block)),
                "indexed by the flush"
            );
        }
        let (windows, docs) = store.text_backlog();
        assert!(
            windows >= 1 && docs == 400,
            "{windows} windows, {docs} documents"
        );
        assert!(store.index_pending());
        assert!(!store.index_pending(), "nothing left");
        assert_eq!(store.text_backlog(), (0, 0));
        check(&store, &t);
        // merged blocks: the index follows
        while store.merge_small_blocks().unwrap() {}
        check(&store, &t);
        // a crash after blocks were committed and before their index was: the next open
        // brings the index up to the blocks
        store.test_skip_text.store(true, Ordering::SeqCst);
        store.append_logs(&t, random_logs(6, 500)).unwrap();
        store.flush(true).unwrap();
        let snapshot = store.log_snapshot(&t).unwrap();
        let (addr, _) = snapshot.blocks.iter().next_back().unwrap();
        let view = store.text_view(&t, addr.window).unwrap().unwrap();
        assert!(!view.blocks.contains(&addr.block), "not indexed yet");
    }
    let store = Store::open(dir.path(), opts.clone()).unwrap();
    check(&store, &t);
    drop(store);
    // a lost index is rebuilt whole
    std::fs::remove_dir_all(dir.path().join("text")).unwrap();
    assert!(Store::rebuild_text(dir.path(), opts.clone()).unwrap() >= 1);
    let store = Store::open(dir.path(), opts).unwrap();
    check(&store, &t);
}
