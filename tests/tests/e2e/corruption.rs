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
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut w = Weft::start(&data, &[]);
    let c = Client::new();
    let cfg = weft_bench::generator::GenConfig {
        spans: 20_000,
        seed: 5,
        ..Default::default()
    };
    send_generated(&c, &w, cfg, None).await;
    assert!(w.terminate(), "a clean stop writes the blocks");
    let (ok, report) = check(&data);
    assert!(ok, "a sound store checks clean: {report}");
    assert!(report.contains("no damage found"), "{report}");

    // a bad disk: bytes flipped every 4 KiB through the middle of the largest table file
    let sst = files_with(&data, "sst")
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .expect("table files after a clean stop");
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
