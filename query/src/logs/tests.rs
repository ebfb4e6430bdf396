use std::sync::Arc;

use weft_storage::StoreOptions;
use weft_storage::model::{KeyValue, LogClass, LogSemantics, Resource, UnixNanos, Value};

use super::*;

const T0: u64 = 1_700_000_000_000_000_000;

fn logs() -> Vec<LogRecord> {
    let res = |s: &str| {
        Arc::new(Resource {
            attributes: vec![KeyValue::new("service.name", Value::Str(s.into()))],
            ..Default::default()
        })
    };
    let (a, b) = (res("vllm"), res("gateway"));
    (0..300u64)
        .map(|i| LogRecord {
            // some records share a time: the order must still be total and stable
            time: UnixNanos(T0 + (i / 3) * 1_000_000 + (i % 7) * 3_600_000_000_000 / 7),
            observed_time: UnixNanos(T0),
            severity_number: [9, 13, 17][(i % 3) as usize],
            body: Value::Str(match i % 4 {
                0 => format!("customer charged twice for order {i}, refund issued"),
                1 => format!("decode step {i} prefill_ms=12"),
                2 => "refunded".to_owned(),
                _ => format!("request {i} done"),
            }),
            trace_id: (i % 5 == 0).then(|| TraceId([(i % 3) as u8 + 1; 16])),
            resource: if i % 2 == 0 { a.clone() } else { b.clone() },
            semantics: LogSemantics {
                class: if i % 4 == 1 {
                    LogClass::InferenceMetrics
                } else {
                    LogClass::Other
                },
                ..Default::default()
            },
            ..Default::default()
        })
        .collect()
}

fn store_with(logs: &[LogRecord]) -> (tempfile::TempDir, Store, TenantId) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        StoreOptions {
            flush_rows: 64,
            ..Default::default()
        },
    )
    .unwrap();
    let t = TenantId::new("a").unwrap();
    for chunk in logs[..240].chunks(80) {
        store.append_logs(&t, chunk.to_vec()).unwrap();
        store.flush(true).unwrap();
    }
    store.append_logs(&t, logs[240..].to_vec()).unwrap();
    (dir, store, t)
}

/// Every page of a search, concatenated.
fn all_pages(store: &Store, t: &TenantId, mut req: LogSearch) -> Vec<LogRecord> {
    let mut out = Vec::new();
    loop {
        let page = search_logs(store, t, &req).unwrap();
        assert!(page.logs.len() <= req.limit);
        out.extend(page.logs);
        match page.next_cursor {
            Some(c) => req.cursor = Some(c),
            None => return out,
        }
    }
}

#[test]
fn pages_are_newest_first_and_continue_exactly_where_they_ended() {
    let logs = logs();
    let (_dir, store, t) = store_with(&logs);
    type Wanted = Box<dyn Fn(&LogRecord) -> bool>;
    let cases: Vec<(LogSearch, Wanted)> = vec![
        (LogSearch::default(), Box::new(|_| true)),
        (
            LogSearch {
                q: Some(TextQuery::parse(r#"refund* AND NOT "charged twice""#).unwrap()),
                ..Default::default()
            },
            Box::new(|l| matches!(&l.body, Value::Str(s) if s == "refunded")),
        ),
        (
            LogSearch {
                service: Some("vllm".into()),
                min_severity: Some(13),
                start: Some(T0 + 3_600_000_000_000 / 7),
                end: Some(T0 + 5 * 3_600_000_000_000 / 7),
                ..Default::default()
            },
            Box::new(|l| {
                l.service_name() == "vllm"
                    && l.severity_number >= 13
                    && l.time.0 >= T0 + 3_600_000_000_000 / 7
                    && l.time.0 < T0 + 5 * 3_600_000_000_000 / 7
            }),
        ),
        // phrases, OR, NOT and a prefix through the text index (blocks) and the head
        (
            LogSearch {
                q: Some(TextQuery::parse(r#""charged twice" OR prefill_ms"#).unwrap()),
                ..Default::default()
            },
            Box::new(
                |l| matches!(&l.body, Value::Str(s) if s.contains("charged twice") || s.contains("prefill_ms")),
            ),
        ),
        (
            LogSearch {
                q: Some(TextQuery::parse("step -refunded -done").unwrap()),
                ..Default::default()
            },
            Box::new(|l| matches!(&l.body, Value::Str(s) if s.starts_with("decode step"))),
        ),
        (
            LogSearch {
                q: Some(TextQuery::parse("class:inference* AND NOT decode").unwrap()),
                ..Default::default()
            },
            Box::new(|_| false),
        ),
        (
            LogSearch {
                q: Some(TextQuery::parse("class:inference_metrics").unwrap()),
                ..Default::default()
            },
            Box::new(|l| l.semantics.class == LogClass::InferenceMetrics),
        ),
    ];
    for (req, want) in cases {
        let mut expected: Vec<&LogRecord> = logs.iter().filter(|l| want(l)).collect();
        expected.sort_by_key(|l| Reverse(LogCursor::of(l)));
        for limit in [7, 1000] {
            let got = all_pages(
                &store,
                &t,
                LogSearch {
                    limit,
                    ..req.clone()
                },
            );
            let got: Vec<&LogRecord> = got.iter().collect();
            assert_eq!(got.len(), expected.len(), "{req:?} limit {limit}");
            assert!(got.iter().zip(&expected).all(|(a, b)| a == b), "{req:?}");
        }
    }
}

#[test]
fn a_trace_s_records_come_from_head_and_blocks_oldest_first() {
    let logs = logs();
    let (_dir, store, t) = store_with(&logs);
    let trace = TraceId([2; 16]);
    let got = trace_logs(&store, &t, &trace).unwrap();
    let mut want: Vec<&LogRecord> = logs.iter().filter(|l| l.trace_id == Some(trace)).collect();
    want.sort_by_key(|l| (l.time, l.observed_time));
    assert_eq!(got.len(), want.len());
    assert!(got.iter().zip(&want).all(|(a, b)| a == *b));
    assert!(
        trace_logs(&store, &t, &TraceId([9; 16]))
            .unwrap()
            .is_empty()
    );
}
