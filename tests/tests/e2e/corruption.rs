//! Failure on disk, with the real binary: a torn last write-ahead record (power lost
//! mid-write) recovers to the last whole record; bytes flipped in the store's files make the
//! queries that touch them fail with an error naming the block while the server keeps running,
//! and `weft check` lists the damage.

use std::process::Command;

use weft_tests::{Weft, weft_binary};

use crate::common::*;

fn files_with(dir: &std::path::Path, ext: &str) -> Vec<std::path::PathBuf> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    out.sort();
    out
}

/// The largest RocksDB table file of a stopped store.
fn largest_sst(dir: &std::path::Path) -> std::path::PathBuf {
    files_with(dir, "sst")
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .expect("table files after a clean stop")
}

fn check(dir: &std::path::Path) -> (bool, String) {
    let out = Command::new(weft_binary())
        .args(["check", "--data-dir"])
        .arg(dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// A server on a fresh `data` directory that took 20,000 generated spans and stopped cleanly
/// (its blocks written).
async fn stored_and_stopped(args: &[&str]) -> (tempfile::TempDir, Weft, Client) {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Weft::start(&dir.path().join("data"), args);
    let c = Client::new();
    let cfg = weft_bench::generator::GenConfig {
        spans: 20_000,
        seed: 5,
        ..Default::default()
    };
    send_generated(&c, &w, cfg, None).await;
    assert!(w.terminate(), "a clean stop writes the blocks");
    (dir, w, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_last_head_record_recovers_to_the_last_whole_record() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // nothing is flushed: every batch lives in the write-ahead head only
    let mut w = Weft::start(&data, &["--flush-age", "1h"]);
    let c = Client::new();
    for (n, traces) in [(1u64, 3u64), (2, 3), (3, 40)] {
        let spans = (0..traces)
            .flat_map(|t| {
                (0..50u64).map(move |i| {
                    span(
                        &id16(n << 32 | t),
                        n << 32 | t << 8 | i,
                        None,
                        "work",
                        T0 + i,
                        T0 + i + 5,
                    )
                })
            })
            .collect();
        let r = c
            .post(
                &format!("{}/v1/traces", w.otlp),
                &[("content-type", "application/x-protobuf")],
                prost::Message::encode_to_vec(&request("torn", spans)),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    }
    w.kill9();
    // power lost while the last record was written: its tail never reached the disk
    let log = files_with(&data, "log").pop().expect("a RocksDB log");
    let len = std::fs::metadata(&log).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
    f.set_len(len - 200).unwrap();
    drop(f);
    w.restart();
    let rows = sql_rows(&c, &w, None, "SELECT count(*) AS n FROM spans").await;
    assert_eq!(
        rows[0][0], 300,
        "the two whole records, not the torn one: {rows:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_bytes_on_disk_fail_the_queries_naming_the_block_and_check_lists_them() {
    let (dir, mut w, c) = stored_and_stopped(&[]).await;
    let data = dir.path().join("data");
    let (ok, report) = check(&data);
    assert!(ok, "a sound store checks clean: {report}");
    assert!(report.contains("no damage found"), "{report}");

    // a bad disk: bytes flipped every 4 KiB through the middle of the largest table file
    let sst = largest_sst(&data);
    let mut bytes = std::fs::read(&sst).unwrap();
    let n = bytes.len();
    for at in (n / 10..n * 8 / 10).step_by(4096) {
        bytes[at] ^= 0x5a;
    }
    std::fs::write(&sst, bytes).unwrap();

    w.restart();
    let r = c
        .post(
            &format!("{}/api/v1/sql", w.http),
            &[("content-type", "application/json")],
            serde_json::json!({ "query": "SELECT * FROM spans" }).to_string(),
        )
        .await
        .unwrap();
    assert_ne!(r.status, 200, "damaged data must not be served");
    let text = r.text();
    assert!(
        text.contains("corrupt data in spans block") && text.contains("of tenant single-tenant"),
        "{text}"
    );
    // the server keeps running
    let ready = c.get(&format!("{}/ready", w.http), &[]).await.unwrap();
    assert_eq!(ready.status, 200);
    w.kill9();
    let (ok, report) = check(&data);
    assert!(!ok, "check must fail on a damaged store");
    assert!(
        report.contains("DAMAGED") && report.contains("Corruption"),
        "{report}"
    );
}

/// With `--skip-corrupt-blocks` the query that meets a damaged block is answered without it,
/// and every answer of the tenant says so (HTTP SQL: `warnings` and a header; the search API
/// and Prometheus: `warnings`; PostgreSQL: a WARNING notice), consistently from query to
/// query; `/metrics` counts the block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipping_corrupt_blocks_answers_without_the_damaged_block_and_says_so() {
    let (dir, mut w, c) =
        stored_and_stopped(&["--skip-corrupt-blocks", "--flush-rows", "4000"]).await;
    let data = dir.path().join("data");
    w.restart();
    let count = "SELECT count(*) AS n FROM spans";
    let all = sql_rows(&c, &w, None, count).await[0][0].as_u64().unwrap();
    let traces: Vec<String> = sql_rows(&c, &w, None, "SELECT DISTINCT trace_id FROM spans")
        .await
        .iter()
        .map(|r| r[0].as_str().unwrap().to_owned())
        .collect();
    assert!(w.terminate());

    // one byte flipped inside a durations chunk of the largest table file holding one (keys
    // are stored whole; the value follows its key): a bad sector under one RocksDB block holding part of
    // a chunk that every read of a span needs. (The middle of the file may hold a chunk that
    // only some queries read, such as a block's minority start times.)
    // a chunk's key, then its value (a bit-packed chunk begins `WPK1`); a block meta in the
    // meta column family names the column too, but no value of its follows. A table block
    // stores a key's part shared with the key before it once: "duration_ns" follows
    // "dropped_links" (or a dedicated "d:" column), so only "uration_ns" is sure to be there
    let at = |bytes: &[u8]| {
        let key = b"uration_ns";
        (0..bytes.len().saturating_sub(key.len() + 16)).find(|&i| {
            bytes[i..].starts_with(key)
                && bytes[i + key.len()..i + key.len() + 16]
                    .windows(4)
                    .any(|w| w == b"WPK1")
        })
    };
    let mut tables = files_with(&data, "sst");
    tables.sort_by_key(|p| std::cmp::Reverse(std::fs::metadata(p).unwrap().len()));
    let (sst, mut bytes, key) = tables
        .into_iter()
        .find_map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            at(&bytes).map(|key| (p, bytes, key))
        })
        .expect("a durations chunk in a table file");
    bytes[key + 64] ^= 0x5a;
    std::fs::write(&sst, bytes).unwrap();
    w.restart();

    // first by trace id: the read that meets the damage fails, and the request is answered
    // again without the block; every answer from then on says so
    let (mut spans, mut first_warned) = (0, None);
    for (i, id) in traces.iter().enumerate() {
        let r = c
            .get(&format!("{}/api/v1/traces/{id}", w.http), &[])
            .await
            .unwrap();
        assert!(r.status == 200 || r.status == 404, "{id}: {}", r.text());
        if r.status == 404 {
            continue;
        }
        let answer = r.json().unwrap();
        spans += span_count_json(&answer);
        let warned = answer["warnings"].as_array().is_some_and(|w| !w.is_empty());
        assert_eq!(warned, r.headers.contains_key("weft-warning"));
        if warned {
            first_warned.get_or_insert(i);
        } else {
            assert!(
                first_warned.is_none(),
                "{id}: an answer after the damage was found says so"
            );
        }
    }
    assert!(first_warned.is_some(), "a trace read met the damaged block");
    assert!(0 < spans && spans < all, "{spans} of {all} spans");

    let sql = |query: &'static str| {
        let c = &c;
        let w = &w;
        async move {
            c.post(
                &format!("{}/api/v1/sql", w.http),
                &[("content-type", "application/json")],
                serde_json::json!({ "query": query }).to_string(),
            )
            .await
            .unwrap()
        }
    };
    let r = sql("SELECT * FROM spans").await;
    assert_eq!(
        r.status,
        200,
        "answered without the damaged block: {}",
        r.text()
    );
    let answer = r.json().unwrap();
    assert!(answer.get("error").is_none(), "{}", answer["error"]);
    let warnings = answer["warnings"].as_array().expect("warnings").clone();
    assert!(!warnings.is_empty());
    assert!(
        warnings.iter().all(|w| {
            let w = w.as_str().unwrap();
            w.contains("leaves out a damaged spans block")
                && w.contains("corrupt data in spans block")
        }),
        "{warnings:?}"
    );
    let header = r.headers.get("weft-warning").expect("a warning header");
    assert!(
        header.to_str().unwrap().contains("damaged block"),
        "{header:?}"
    );
    let read = answer["rows"].as_array().unwrap().len() as u64;
    assert_eq!(read, spans, "the traces by id held the same spans");
    // every later answer leaves the same block out, whichever columns it reads
    let r = sql("SELECT count(*) AS n FROM spans").await;
    assert_eq!(r.status, 200);
    let answer = r.json().unwrap();
    assert_eq!(answer["rows"][0][0].as_u64(), Some(read));
    assert_eq!(
        answer["warnings"].as_array().map(Vec::len),
        Some(warnings.len())
    );

    // the search API and Prometheus carry the warnings in their JSON
    for path in ["/api/v1/search?limit=5", "/prometheus/api/v1/query?query=1"] {
        let r = c.get(&format!("{}{path}", w.http), &[]).await.unwrap();
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let answer = r.json().unwrap();
        assert_eq!(
            answer["warnings"].as_array().map(Vec::len),
            Some(warnings.len()),
            "{path}: {answer}"
        );
    }

    // PostgreSQL: the rows without the block, and a WARNING notice per block
    let addr = format!("127.0.0.1:{}", w.pg);
    let mut pg = weft_bench::pgclient::PgClient::connect(&addr, "weft")
        .await
        .unwrap();
    assert_eq!(
        pg.query("SELECT span_id FROM spans").await.unwrap() as u64,
        read
    );
    assert_eq!(pg.notices.len(), warnings.len(), "{:?}", pg.notices);
    assert!(
        pg.notices[0].starts_with("01000: this answer leaves out"),
        "{:?}",
        pg.notices
    );

    let metrics = c
        .get(&format!("{}/metrics", w.http), &[])
        .await
        .unwrap()
        .text();
    assert!(
        metrics.contains(&format!("\nweft_damaged_blocks {}\n", warnings.len())),
        "{metrics}"
    );
}

/// Spans in an OTLP/JSON trace.
fn span_count_json(trace: &serde_json::Value) -> u64 {
    let empty = Vec::new();
    let list = |v: &serde_json::Value, k: &str| v[k].as_array().unwrap_or(&empty).clone();
    list(trace, "resourceSpans")
        .iter()
        .flat_map(|r| list(r, "scopeSpans"))
        .map(|s| list(&s, "spans").len() as u64)
        .sum()
}
