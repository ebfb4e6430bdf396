//! The `logs` table: answers against values computed from the records themselves, with and
//! without push-down, over blocks and head rows, and joined to `spans`.

use super::*;

/// Log records of the fixture's requests: one per span of every third trace (so that they
/// join), plus records tied to no trace, one with a structured body.
fn logs_of(spans: &[SpanRecord]) -> Vec<LogRecord> {
    let resource = |s: &str| {
        Arc::new(Resource {
            attributes: vec![KeyValue::new("service.name", Value::Str(s.into()))],
            ..Default::default()
        })
    };
    let (engine, gateway) = (resource("inference-engine"), resource("llm-gateway"));
    let scope = Arc::new(Scope {
        name: "engine.logger".into(),
        ..Default::default()
    });
    let mut out: Vec<LogRecord> = spans
        .iter()
        .enumerate()
        .filter(|(i, s)| s.trace_id.0[1] % 3 == 0 && i % 2 == 0)
        .map(|(i, s)| LogRecord {
            time: s.start,
            observed_time: UnixNanos(s.start.0 + 10),
            severity_number: if i % 5 == 0 { 17 } else { 9 },
            severity_text: if i % 5 == 0 { "ERROR" } else { "INFO" }.into(),
            body: Value::Str(format!("{} step {i}", s.name)),
            attributes: vec![KeyValue::new(
                "worker.id",
                Value::Str(format!("w-{}", i % 4)),
            )],
            trace_id: Some(s.trace_id),
            span_id: Some(s.span_id),
            resource: if i % 3 == 0 {
                gateway.clone()
            } else {
                engine.clone()
            },
            scope: scope.clone(),
            ..Default::default()
        })
        .collect();
    out.push(LogRecord {
        time: UnixNanos(BASE + 5),
        observed_time: UnixNanos(BASE + 6),
        body: Value::KvList(vec![KeyValue::new("prefill_ms", Value::Double(12.5))]),
        event_name: "gen_ai.choice".into(),
        resource: engine.clone(),
        scope: scope.clone(),
        ..Default::default()
    });
    out.push(LogRecord {
        time: UnixNanos(BASE + 7),
        observed_time: UnixNanos(BASE + 7),
        resource: engine,
        scope,
        ..Default::default()
    });
    out
}

fn log_fixture() -> (Fixture, Vec<LogRecord>) {
    let f = fixture();
    let logs = logs_of(&f.spans);
    let store = f.engine.store();
    let (flushed, head) = logs.split_at(logs.len() * 2 / 3);
    for chunk in flushed.chunks(150) {
        store.append_logs(&f.tenant, chunk.to_vec()).unwrap();
        store.flush(true).unwrap();
    }
    store.append_logs(&f.tenant, head.to_vec()).unwrap();
    store
        .append_logs(&TenantId::new("other").unwrap(), logs[..10].to_vec())
        .unwrap();
    (f, logs)
}

async fn one(f: &Fixture, sql: &str, pushdown: bool) -> String {
    let rows = rows(f, sql, pushdown)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    assert_eq!(rows.len(), 1, "{sql}");
    rows[0].join("|")
}

#[test]
fn the_logs_table_answers_from_blocks_and_head_and_joins_spans() {
    let (f, logs) = log_fixture();
    let from = BASE + 100 * 100_000_000;
    let errors_of_engine_since = logs
        .iter()
        .filter(|l| l.service_name() == "inference-engine" && l.severity_text == "ERROR")
        .filter(|l| l.time.0 >= from)
        .count();
    let tied = logs.iter().filter(|l| l.span_id.is_some()).count();
    let w1 = logs
        .iter()
        .filter(|l| {
            l.attributes
                .iter()
                .any(|kv| kv.value == Value::Str("w-1".into()))
        })
        .count();
    let since = format!("to_timestamp_nanos({from})");
    let decode_or_post = logs
        .iter()
        .filter(|l| matches!(&l.body, Value::Str(b) if b.starts_with("llm.decode.token") || b.starts_with("POST")))
        .count();
    let cases = vec![
        (
            "SELECT count(*) FROM logs".to_owned(),
            logs.len().to_string(),
        ),
        (
            format!(
                "SELECT count(*) FROM logs WHERE service_name = 'inference-engine' \
                 AND severity_text IN ('ERROR') AND time >= {since}"
            ),
            errors_of_engine_since.to_string(),
        ),
        (
            "SELECT count(*) FROM logs l JOIN spans s \
             ON l.trace_id = s.trace_id AND l.span_id = s.span_id"
                .to_owned(),
            tied.to_string(),
        ),
        (
            "SELECT count(*) FROM logs WHERE attributes['worker.id'] = 'w-1'".to_owned(),
            w1.to_string(),
        ),
        (
            "SELECT body, trace_id IS NULL, event_name, scope_name, severity_number \
             FROM logs WHERE event_name = 'gen_ai.choice'"
                .to_owned(),
            r#"{"prefill_ms":12.5}|true|gen_ai.choice|engine.logger|0"#.to_owned(),
        ),
        (
            "SELECT count(*) FROM logs WHERE body IS NULL".to_owned(),
            "1".to_owned(),
        ),
        (
            "SELECT count(*) FROM logs WHERE matches(body, 'step AND (llm.decode.token OR \"POST v1\") AND NOT prefill*')"
                .to_owned(),
            decode_or_post.to_string(),
        ),
    ];
    for pushdown in [true, false] {
        for (sql, want) in &cases {
            assert_eq!(
                block_on(one(&f, sql, pushdown)),
                *want,
                "{sql} (pushdown {pushdown})"
            );
        }
    }
    let first = &logs[0];
    let sql = format!(
        "SELECT trace_id, span_id, time, resource_attributes['service.name'] FROM logs \
         WHERE trace_id = '{}' AND span_id = '{}'",
        first.trace_id.unwrap(),
        first.span_id.unwrap()
    );
    let got = block_on(one(&f, &sql, true));
    assert!(
        got.starts_with(&format!(
            "{}|{}|",
            first.trace_id.unwrap(),
            first.span_id.unwrap()
        )) && got.ends_with(first.service_name()),
        "{got}"
    );
}

/// `matches()` and `time` comparisons are applied by the scan itself (exact push-down): the
/// same counts as DataFusion evaluating every filter, for each kind of text query (some the
/// index answers exactly, some it over-answers) and each form of time bound, over indexed
/// blocks and head rows; and `count(*)` under them plans no filter and reads no column.
#[test]
fn text_and_time_filters_are_exact_in_the_scan() {
    let (f, logs) = log_fixture();
    let mid = logs[logs.len() / 2].time.0;
    let late = logs[logs.len() * 5 / 6].time.0;
    let queries = [
        "step",
        "STEP AND llm",
        "post OR prefill*",
        "\"decode token step\"",
        "\"token step\" OR post",
        "step AND \"decode token\" AND llm*",
        "(\"token step\" AND llm) OR post",
        "\"step decode\"",
        "NOT step",
        "llm AND NOT \"post v1\"",
        "nosuchword",
    ];
    let ranges = [
        String::new(),
        format!(" AND time > to_timestamp_nanos({mid})"),
        format!(" AND time >= to_timestamp_nanos({mid}) AND time < to_timestamp_nanos({late})"),
        format!(" AND time BETWEEN to_timestamp_nanos({mid}) AND to_timestamp_nanos({late})"),
        format!(" AND time <= to_timestamp_nanos({mid})"),
        format!(" AND time = to_timestamp_nanos({mid})"),
        format!(
            " AND CAST(time AS TIMESTAMP(0)) > to_timestamp_seconds({})",
            mid / 1_000_000_000
        ),
    ];
    for q in queries {
        for range in &ranges {
            let sql = format!("SELECT count(*) FROM logs WHERE matches(body, '{q}'){range}");
            let pushed = block_on(one(&f, &sql, true));
            let naive = block_on(one(&f, &sql, false));
            assert_eq!(pushed, naive, "{sql}");
        }
    }
    // the answer is not empty: the test would not notice rows lost by every path alike
    let sql = format!(
        "SELECT count(*) FROM logs WHERE matches(body, 'step') AND time > to_timestamp_nanos({mid})"
    );
    let want = logs
        .iter()
        .filter(|l| l.time.0 > mid && matches!(&l.body, Value::Str(b) if b.contains(" step ")))
        .count();
    assert!(want > 10);
    assert_eq!(block_on(one(&f, &sql, true)), want.to_string());
    let plan = block_on(rows(&f, &format!("EXPLAIN {sql}"), true))
        .unwrap()
        .concat()
        .join("\n");
    let physical = plan.split("physical_plan").nth(1).unwrap_or_default();
    assert!(!physical.contains("FilterExec"), "{plan}");
    assert!(!physical.contains("matches"), "{plan}");
    assert!(plan.contains("full_filters"), "{plan}");
}

#[test]
fn semantic_columns_are_typed_and_indexed() {
    let (f, _) = log_fixture();
    let store = f.engine.store();
    let tenant = TenantId::new("semantic").unwrap();
    let metrics = |i: i64, worker: &str| LogRecord {
        time: UnixNanos(BASE + i as u64),
        observed_time: UnixNanos(BASE + i as u64),
        semantics: LogSemantics {
            class: LogClass::InferenceMetrics,
            model: Some("llama-3.1-8b".into()),
            prefill_ms: Some(10.0 + i as f64),
            finish_reasons: Some(vec!["stop".into()]),
            output_tokens: Some(i),
            worker: Some(worker.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let logs: Vec<LogRecord> = (0..10)
        .map(|i| metrics(i, if i < 4 { "w-1" } else { "w-2" }))
        .collect();
    store.append_logs(&tenant, logs[..6].to_vec()).unwrap();
    store.flush(true).unwrap();
    store.append_logs(&tenant, logs[6..].to_vec()).unwrap();
    let q = |sql: &str| {
        let f = Fixture {
            _dir: tempfile::tempdir().unwrap(),
            engine: SqlEngine::new(store.clone(), SqlConfig::default()),
            spans: Vec::new(),
            tenant: tenant.clone(),
        };
        block_on(one(&f, sql, true))
    };
    assert_eq!(
        q(
            r#"SELECT count(*), sum("llm.prefill_ms"), max("gen_ai.usage.output_tokens") FROM logs WHERE "worker.id" = 'w-2' AND class = 'inference_metrics'"#
        ),
        "6|99.0|9"
    );
    assert_eq!(
        q(
            r#"SELECT "gen_ai.response.finish_reasons", "llm.model", "gpu.id" IS NULL FROM logs LIMIT 1"#
        ),
        "[stop]|llama-3.1-8b|true"
    );
}
