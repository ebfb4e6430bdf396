//! The frozen store fixtures: a small store written by each format version, committed under
//! `storage/tests/fixtures/`, that every later version must still read (tantivy's habit). The
//! spans are made by arithmetic (no random generator whose sequence could change), and neither
//! they nor a committed fixture are ever edited: a new format version adds a new fixture.
//!
//! To write the fixture of the current version (once, when a version is introduced):
//! `WEFT_WRITE_FIXTURE=1 cargo test -p weft-storage write_store_fixture -- --ignored`.
//! Log records came after `store-v2` was written: `store-v2-logs` holds the first log blocks and
//! log write-ahead entries (`write_logs_fixture`), under the same key version.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;

fn fixture_dir(version: u8) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/store-v{version}"))
}

/// One LLM request: a generate span with its dimensions and `tokens` decode spans.
fn request(n: u64, tokens: u64) -> Vec<SpanRecord> {
    let engine = Arc::new(Resource {
        attributes: vec![KeyValue::new("service.name", Value::Str("engine".into()))],
        ..Default::default()
    });
    let scope = Arc::new(Scope {
        name: "fixture".into(),
        version: "1".into(),
        ..Default::default()
    });
    let mut trace = [0u8; 16];
    trace[0] = 0xf1;
    trace[8..].copy_from_slice(&n.to_be_bytes());
    let trace = TraceId(trace);
    let root = SpanId(((n << 32) | 1).to_be_bytes());
    let base = 1_764_460_800_000_000_000 + n * 3_000_000_000;
    let mut out = vec![SpanRecord {
        trace_id: trace,
        span_id: root,
        name: "llm.generate".into(),
        kind: SpanKind::Server,
        start: UnixNanos(base),
        end: UnixNanos(base + 900_000_000 + n * 7),
        attributes: vec![
            KeyValue::new("llm.model_version", Value::Str(format!("v{}", n % 2))),
            KeyValue::new("worker.id", Value::Str(format!("worker-{}", n % 3))),
            KeyValue::new("llm.batch_size", Value::Int(8 * (n as i64 % 4 + 1))),
            KeyValue::new("http.route", Value::Str("/v1/chat".into())),
            KeyValue::new("gen_ai.input.messages", Value::Str("hello ".repeat(100))),
        ],
        status_code: if n % 4 == 3 {
            StatusCode::Error
        } else {
            StatusCode::Unset
        },
        status_message: if n % 4 == 3 {
            "oom".into()
        } else {
            String::new()
        },
        events: vec![Event {
            time: UnixNanos(base + 5),
            name: "first_token".into(),
            ..Default::default()
        }],
        resource: engine.clone(),
        scope: scope.clone(),
        ..Default::default()
    }];
    for i in 0..tokens {
        let start = base + 1_000_000 + i * 20_000_000;
        out.push(SpanRecord {
            trace_id: trace,
            span_id: SpanId(((n << 32) | (i + 2)).to_be_bytes()),
            parent_span_id: Some(root),
            name: "llm.decode.token".into(),
            kind: SpanKind::Internal,
            start: UnixNanos(start),
            end: UnixNanos(start + 10_000_000 + (i * 7919 % 5_000_000)),
            attributes: vec![
                KeyValue::new("llm.token.index", Value::Int(i as i64)),
                KeyValue::new("llm.token.latency_ms", Value::Double(10.0 + i as f64 / 4.0)),
            ],
            resource: engine.clone(),
            scope: scope.clone(),
            ..Default::default()
        });
    }
    out
}

/// What the fixture holds: (tenant, spans flushed into blocks, spans left in the head).
fn contents() -> Vec<(TenantId, Vec<SpanRecord>, Vec<SpanRecord>)> {
    let a = TenantId::new("fixture-a").unwrap();
    let b = TenantId::new("fixture-b").unwrap();
    vec![
        (
            a,
            (0..4).flat_map(|n| request(n, 6)).collect(),
            request(4, 3),
        ),
        (b, request(10, 12), Vec::new()),
    ]
}

#[test]
#[ignore = "writes the fixture of the current format version; run once per new version"]
fn write_store_fixture() {
    if std::env::var_os("WEFT_WRITE_FIXTURE").is_none() {
        return;
    }
    let dir = fixture_dir(keys::KEY_VERSION);
    assert!(
        !dir.exists(),
        "fixtures are never rewritten: {}",
        dir.display()
    );
    let store = Store::open(&dir, StoreOptions::default()).unwrap();
    for (tenant, flushed, _) in contents() {
        store.append(&tenant, flushed).unwrap();
    }
    store.flush(true).unwrap();
    for (tenant, _, head) in contents() {
        if !head.is_empty() {
            store.append(&tenant, head).unwrap();
        }
    }
    // everything into SST files (no RocksDB log to replay), the head left unflushed
    for cf in [CF_DATA, CF_META, CF_HEAD] {
        store.db.flush_cf(store.cf(cf)).unwrap();
    }
    drop(store);
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("LOG") || name == "LOCK" {
            std::fs::remove_file(path).unwrap();
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
}

#[test]
fn the_store_fixture_of_every_version_reads_back() {
    for version in [2u8] {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(&fixture_dir(version), dir.path());
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let mut pending = 0;
        for (tenant, flushed, head) in contents() {
            pending += head.len();
            let rows: u32 = store.blocks(&tenant).iter().map(|(_, m)| m.rows).sum();
            assert_eq!(
                rows as usize,
                flushed.len(),
                "v{version} {tenant}: block rows"
            );
            let all: Vec<SpanRecord> = flushed.iter().chain(&head).cloned().collect();
            for (id, want) in by_trace(&all) {
                assert_same(&store.trace(&tenant, &id).unwrap(), &want);
            }
            let mut v1 = RoaringBitmap::new();
            for (addr, _) in store.blocks(&tenant) {
                v1 |= store
                    .postings(&tenant, addr, "llm.model_version", "v1")
                    .unwrap();
            }
            let want = flushed
                .iter()
                .filter(|s| s.attribute("llm.model_version") == Some(&Value::Str("v1".into())))
                .count();
            assert_eq!(v1.len() as usize, want, "v{version} {tenant}: postings");
            // a dimension indexed since (span kind) is answered from its column, exactly
            let server = [String::from("SERVER")];
            let kind = crate::terms::TermFilter::new([(crate::schema::DIM_KIND, &server[..])]);
            for (addr, meta) in store.blocks(&tenant) {
                let rows = store.rows_matching(&tenant, addr, &meta, &kind).unwrap();
                let servers = store
                    .block_reader(&tenant, addr, &meta)
                    .spans(&Rows::All, false)
                    .unwrap()
                    .iter()
                    .filter(|s| s.kind == SpanKind::Server)
                    .count();
                assert_eq!(rows.len() as usize, servers, "v{version}: span kind");
            }
            // blocks written before operation rollups are rolled up from their columns
            let got = store.operation_rollup(&tenant, None, None).unwrap();
            let want = crate::rollup::OpRollup::of_spans(&all.iter().collect::<Vec<_>>());
            assert!(got.orphans.is_empty());
            assert_eq!(got.roots_ns, want.roots_ns, "v{version}: roots");
            for (op, n) in want.ops.iter().zip(&want.nodes) {
                let i = got.ops.iter().position(|o| o == op).unwrap();
                assert_eq!(got.nodes[i].calls, n.calls, "v{version}: {op:?}");
                assert_eq!(got.nodes[i].sum_ns, n.sum_ns, "v{version}: {op:?}");
            }
            let calls =
                |r: &crate::rollup::OpRollup| -> u64 { r.edges.values().map(|e| e.calls).sum() };
            assert_eq!(calls(&got), calls(&want), "v{version}: edges");
        }
        assert_eq!(store.pending_rows(), pending, "v{version}: head replayed");
        // and it goes on taking writes and flushing after the old data
        let more = request(99, 2);
        store.append(&contents()[1].0, more.clone()).unwrap();
        store.close().unwrap();
    }
}

fn logs_fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-v2-logs")
}

/// Log records made by arithmetic: a prompt, a metrics record (typed fields) and a response of
/// each request, some without a trace, one with a structured body.
fn log_records() -> Vec<LogRecord> {
    let vllm = Arc::new(Resource {
        attributes: vec![KeyValue::new("service.name", Value::Str("vllm".into()))],
        ..Default::default()
    });
    let scope = Arc::new(Scope {
        name: "fixture.logs".into(),
        ..Default::default()
    });
    let mut out = Vec::new();
    for n in 0..30u64 {
        let mut trace = [0u8; 16];
        trace[0] = 0xf2;
        trace[8..].copy_from_slice(&n.to_be_bytes());
        let base = 1_764_460_800_000_000_000 + n * 1_000_000_000;
        let record = |i: u64, severity: i32, body: Value, class: LogClass| LogRecord {
            time: UnixNanos(base + i * 1_000_000),
            observed_time: UnixNanos(base + i * 1_000_000 + 7),
            severity_number: severity,
            severity_text: if severity >= 17 { "ERROR" } else { "INFO" }.into(),
            body,
            attributes: vec![KeyValue::new(
                "worker.id",
                Value::Str(format!("w-{}", n % 3)),
            )],
            trace_id: (n % 5 != 4).then_some(TraceId(trace)),
            span_id: (n % 5 != 4).then_some(SpanId((n + 1).to_be_bytes())),
            event_name: if i == 2 {
                "gen_ai.choice".into()
            } else {
                String::new()
            },
            resource: vllm.clone(),
            scope: scope.clone(),
            semantics: LogSemantics {
                class,
                model: (i == 1).then(|| "llama-3.1-8b".into()),
                prefill_ms: (i == 1).then_some(10.0 + n as f64),
                finish_reasons: (i == 2).then(|| vec!["stop".into()]),
                ..Default::default()
            },
            ..Default::default()
        };
        out.push(record(
            0,
            9,
            Value::Str(format!("[PROMPT] <content hash={n:016x} length=12>")),
            LogClass::PromptInput,
        ));
        out.push(record(
            1,
            if n % 7 == 6 { 17 } else { 9 },
            Value::Str(format!("done prefill_ms={}", 10 + n)),
            LogClass::InferenceMetrics,
        ));
        out.push(record(
            2,
            9,
            Value::KvList(vec![KeyValue::new(
                "finish_reason",
                Value::Str("stop".into()),
            )]),
            LogClass::ResponseOutput,
        ));
    }
    out
}

#[test]
#[ignore = "writes the log fixture; run once, when log blocks were introduced"]
fn write_logs_fixture() {
    if std::env::var_os("WEFT_WRITE_FIXTURE").is_none() {
        return;
    }
    let dir = logs_fixture_dir();
    assert!(
        !dir.exists(),
        "fixtures are never rewritten: {}",
        dir.display()
    );
    let store = Store::open(&dir, StoreOptions::default()).unwrap();
    let tenant = TenantId::new("fixture-logs").unwrap();
    let logs = log_records();
    store.append_logs(&tenant, logs[..60].to_vec()).unwrap();
    store.flush(true).unwrap();
    store.append_logs(&tenant, logs[60..].to_vec()).unwrap();
    for cf in [CF_DATA, CF_META, CF_HEAD] {
        store.db.flush_cf(store.cf(cf)).unwrap();
    }
    drop(store);
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("LOG") || name == "LOCK" {
            std::fs::remove_file(path).unwrap();
        }
    }
}

#[test]
fn the_log_fixture_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&logs_fixture_dir(), dir.path());
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let tenant = TenantId::new("fixture-logs").unwrap();
    let logs = log_records();
    let snapshot = store.log_snapshot(&tenant).unwrap();
    let rows: u32 = snapshot.blocks.values().map(|m| m.rows).sum();
    assert_eq!(rows, 60, "block rows");
    assert_eq!(store.pending_rows(), logs.len() - 60, "head replayed");
    let mut got: Vec<LogRecord> = snapshot.head.rows().cloned().collect();
    for (addr, meta) in snapshot.blocks.iter() {
        got.extend(
            store
                .block_logs(&tenant, &snapshot, *addr, meta, &LogScan::default())
                .unwrap(),
        );
    }
    got.sort_by_key(|l| (l.time, l.observed_time));
    assert_eq!(got, logs);
    let trace = logs[3].trace_id.unwrap();
    let want: Vec<&LogRecord> = logs.iter().filter(|l| l.trace_id == Some(trace)).collect();
    let found = store.trace_logs(&tenant, &trace).unwrap();
    assert_eq!(found.iter().collect::<Vec<_>>(), want);
    store.append_logs(&tenant, vec![logs[0].clone()]).unwrap();
    store.close().unwrap();
}
