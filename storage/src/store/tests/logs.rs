//! Log records on the shared engine: the same head, flush, merge and retention as spans.

use std::collections::HashSet;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Int64Type;

use super::*;
use crate::block::logs::{self as log_block, col, dim};

const T0: u64 = 1_700_000_000_000_000_000;

/// Log records of a few services and severities, some tied to a trace, some with a
/// structured body, some with nothing but a time.
pub(super) fn random_logs(seed: u64, n: usize) -> Vec<LogRecord> {
    let mut rng = StdRng::seed_from_u64(seed);
    let services: Vec<Arc<Resource>> = ["gateway", "vllm", "retriever"]
        .iter()
        .map(|s| {
            Arc::new(Resource {
                attributes: vec![KeyValue::new("service.name", Value::Str(s.to_string()))],
                ..Default::default()
            })
        })
        .collect();
    let scope = Arc::new(Scope {
        name: "vllm.logger".into(),
        ..Default::default()
    });
    (0..n)
        .map(|i| {
            let severity = [(9, "INFO"), (13, "WARN"), (17, "ERROR")][rng.random_range(0..3)];
            let body = match rng.random_range(0..4) {
                0 => Value::Empty,
                1 => Value::KvList(vec![KeyValue::new(
                    "prefill_ms",
                    Value::Double(rng.random_range(1.0..50.0)),
                )]),
                _ => Value::Str(format!(
                    "request {i} decode step {}",
                    rng.random_range(0..9)
                )),
            };
            LogRecord {
                time: UnixNanos(T0 + i as u64 * 1_000_000 + rng.random_range(0..1000)),
                observed_time: UnixNanos(T0 + i as u64 * 1_000_000 + 5_000),
                severity_number: severity.0,
                severity_text: severity.1.into(),
                body,
                attributes: match rng.random_bool(0.7) {
                    true => vec![KeyValue::new(
                        "worker.id",
                        Value::Str(format!("w-{}", rng.random_range(0..4))),
                    )],
                    false => Vec::new(),
                },
                trace_id: rng
                    .random_bool(0.6)
                    .then(|| TraceId(rng.random::<[u8; 16]>().map(|b| b | 1))),
                span_id: rng
                    .random_bool(0.5)
                    .then(|| SpanId(rng.random::<[u8; 8]>().map(|b| b | 1))),
                event_name: ["", "gen_ai.choice", "gen_ai.user.message"][rng.random_range(0..3)]
                    .into(),
                resource: services[rng.random_range(0..3)].clone(),
                scope: scope.clone(),
                semantics: LogSemantics {
                    class: LogClass::ALL[rng.random_range(0..5)],
                    model: rng.random_bool(0.5).then(|| "llama-3.1-8b".into()),
                    generation_step: rng.random_bool(0.5).then(|| rng.random_range(0..500)),
                    finish_reasons: rng
                        .random_bool(0.3)
                        .then(|| vec!["stop".into(), "length".into()]),
                    prefill_ms: rng.random_bool(0.5).then(|| rng.random_range(1.0..90.0)),
                    gpu: rng
                        .random_bool(0.5)
                        .then(|| format!("GPU-{}", rng.random_range(0..8))),
                    ..Default::default()
                },
                ..Default::default()
            }
        })
        .collect()
}

/// Every log record of a tenant, whole, from its blocks and head (sorted for comparison).
fn all_logs(store: &Store, t: &TenantId) -> Vec<LogRecord> {
    let snapshot = store.log_snapshot(t).unwrap();
    let mut out: Vec<LogRecord> = snapshot.head.rows().cloned().collect();
    for (addr, meta) in snapshot.blocks.iter() {
        let reader = store.reader_of(t, Signal::Logs, *addr, meta);
        out.extend(log_block::read(&reader, &Rows::All).unwrap());
    }
    out.sort_by_key(|l| (l.time, l.digest()));
    out
}

fn sorted(mut logs: Vec<LogRecord>) -> Vec<LogRecord> {
    logs.sort_by_key(|l| (l.time, l.digest()));
    logs
}

fn scanned_rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::num_rows).sum()
}

#[test]
fn log_records_read_back_equal_from_the_head_from_blocks_and_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let t = tenant("a");
    let logs = random_logs(1, 1_200);
    {
        let store = Store::open(dir.path(), small_opts()).unwrap();
        store.append_logs(&t, logs[..700].to_vec()).unwrap();
        assert_eq!(all_logs(&store, &t), sorted(logs[..700].to_vec()), "head");
        store.flush(true).unwrap();
        assert!(store.log_snapshot(&t).unwrap().head.rows().next().is_none());
        assert_eq!(all_logs(&store, &t), sorted(logs[..700].to_vec()), "blocks");
        store.append_logs(&t, logs[700..].to_vec()).unwrap();
        // dropped without a flush: the rest is only in the write-ahead head
    }
    let store = Store::open(dir.path(), small_opts()).unwrap();
    assert_eq!(all_logs(&store, &t), sorted(logs.clone()), "replayed");
    store.flush(true).unwrap();
    assert_eq!(all_logs(&store, &t), sorted(logs), "flushed after replay");
    assert!(
        store.snapshot(&t).unwrap().blocks.is_empty(),
        "no span blocks"
    );
}

#[test]
fn a_retried_log_batch_is_stored_once_before_and_after_flush() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let t = tenant("a");
    let logs = random_logs(2, 300);
    assert_eq!(store.append_logs(&t, logs.clone()).unwrap().stored, 300);
    let again = store.append_logs(&t, logs.clone()).unwrap();
    assert_eq!((again.stored, again.duplicates), (0, 300));
    store.flush(true).unwrap();
    let after_flush = store.append_logs(&t, logs.clone()).unwrap();
    assert_eq!((after_flush.stored, after_flush.duplicates), (0, 300));
    assert_eq!(all_logs(&store, &t).len(), 300);
    // an idle tenant keeps its last head's identities only for a while
    let held = |store: &Store| store.lock().logs[&t].recent.len();
    assert_eq!(held(&store), 300);
    assert!(!store.release_recent(Duration::from_secs(3600)));
    assert_eq!(held(&store), 300);
    assert!(store.release_recent(Duration::ZERO));
    assert_eq!(held(&store), 0);
    // a record that differs in one field is another record
    let mut changed = logs[0].clone();
    changed.severity_text = "FATAL".into();
    assert_eq!(store.append_logs(&t, vec![changed]).unwrap().stored, 1);
}

#[test]
fn a_log_scan_by_time_and_terms_agrees_with_a_naive_filter() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let t = tenant("a");
    let logs = random_logs(3, 2_000);
    store.append_logs(&t, logs[..1_500].to_vec()).unwrap();
    store.flush(true).unwrap();
    store.append_logs(&t, logs[1_500..].to_vec()).unwrap();
    let snapshot = store.log_snapshot(&t).unwrap();
    assert!(!snapshot.blocks.is_empty() && snapshot.head.rows().next().is_some());
    let (from, to) = (T0 + 300 * 1_000_000, T0 + 1_700 * 1_000_000);
    type Terms = Vec<(&'static str, Vec<String>)>;
    let cases: Vec<(Option<u64>, Option<u64>, Terms)> = vec![
        (None, None, vec![]),
        (Some(from), Some(to), vec![]),
        (None, None, vec![(dim::SERVICE, vec!["vllm".into()])]),
        (
            Some(from),
            None,
            vec![
                (dim::SEVERITY, vec!["ERROR".into(), "WARN".into()]),
                (dim::EVENT_NAME, vec!["gen_ai.choice".into()]),
            ],
        ),
        (None, None, vec![(dim::SERVICE, vec!["nobody".into()])]),
    ];
    for (from, to, terms) in cases {
        let scan = LogScan {
            from,
            to,
            terms: terms.clone(),
            columns: vec![col::TIME, col::SERVICE],
            ..Default::default()
        };
        let batches = store.scan_logs(&t, &snapshot, &scan).unwrap();
        let mut got: Vec<i64> = batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        got.sort();
        let mut want: Vec<i64> = logs
            .iter()
            .filter(|l| from.is_none_or(|f| l.time.0 >= f) && to.is_none_or(|e| l.time.0 <= e))
            .filter(|l| {
                terms.iter().all(|(d, ts)| {
                    let v = match *d {
                        dim::SERVICE => l.service_name(),
                        dim::SEVERITY => &l.severity_text,
                        _ => &l.event_name,
                    };
                    ts.iter().any(|t| t == v)
                })
            })
            .map(|l| l.time.0 as i64)
            .collect();
        want.sort();
        assert_eq!(got, want, "from {from:?} to {to:?} terms {terms:?}");
    }
}

#[test]
fn small_log_blocks_are_merged_and_windows_out_of_retention_deleted() {
    use crate::clock::ManualClock;
    use crate::retention::{Retention, RetentionRule};
    const H: u64 = 3_600_000_000_000;
    let t0 = 1_000 * H;
    let clock = Arc::new(ManualClock::new(UnixNanos(t0)));
    let dir = tempfile::tempdir().unwrap();
    let t = tenant("a");
    let store = Store::open(
        dir.path(),
        StoreOptions {
            merge_idle: Duration::ZERO,
            retention: Retention {
                default: RetentionRule {
                    by_signal: [(Signal::Logs, Duration::from_secs(2 * 3600))].into(),
                    ..Default::default()
                },
                ..Default::default()
            },
            clock: clock.clone(),
            ..small_opts()
        },
    )
    .unwrap();
    // window 0 and window 1, each written in many small flushes
    let mut logs = random_logs(4, 600);
    for (i, l) in logs.iter_mut().enumerate() {
        l.time = UnixNanos(t0 + (i as u64 % 2) * H + i as u64);
    }
    for chunk in logs.chunks(30) {
        store.append_logs(&t, chunk.to_vec()).unwrap();
        store.flush(true).unwrap();
    }
    // spans of the same tenant are kept forever: retention is per signal
    store.append(&t, vec![super::span_at(1, 1, t0)]).unwrap();
    store.flush(true).unwrap();
    let before = store.log_snapshot(&t).unwrap().blocks.len();
    assert!(before >= 20, "{before} small blocks");
    assert!(store.merge_small_blocks().unwrap());
    let merged = store.log_snapshot(&t).unwrap().blocks;
    let windows: HashSet<u64> = merged.keys().map(|a| a.window).collect();
    assert_eq!(
        (merged.len(), windows.len()),
        (2, 2),
        "one block per window"
    );
    assert_eq!(all_logs(&store, &t), sorted(logs.clone()));
    // window 0 falls out: hidden at once, deleted by the retention task
    clock.set(UnixNanos(t0 + 2 * H + H / 2));
    let snapshot = store.log_snapshot(&t).unwrap();
    let seen = scanned_rows(&store.scan_logs(&t, &snapshot, &LogScan::default()).unwrap());
    assert_eq!(seen, 300, "only window 1 is readable");
    assert!(store.text_view(&t, t0).unwrap().is_some());
    store.enforce_retention().unwrap();
    assert_eq!(store.log_snapshot(&t).unwrap().blocks.len(), 1);
    // the window's text index went with its blocks; the other one holds its merged block
    assert!(store.text_view(&t, t0).unwrap().is_none());
    let view = store.text_view(&t, t0 + H).unwrap().unwrap();
    assert_eq!(view.blocks.len(), 1);
    assert_eq!(
        store.snapshot(&t).unwrap().blocks.len(),
        1,
        "the span block stays"
    );
    let left = all_logs(&store, &t);
    assert!(left.iter().all(|l| l.time.0 >= t0 + H) && left.len() == 300);
}
