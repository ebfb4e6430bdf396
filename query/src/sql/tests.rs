use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::util::display::{ArrayFormatter, FormatOptions};
use futures::TryStreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use weft_storage::model::*;
use weft_storage::{Store, StoreOptions};

use super::*;

mod logs;
mod request;

const BASE: u64 = 1_700_000_000_000_000_000;

/// Requests shaped like LLM serving: a gateway root, a generate span with the dimensions, and
/// token spans; a few errors, events and links.
fn spans(seed: u64, traces: usize) -> Vec<SpanRecord> {
    let mut rng = StdRng::seed_from_u64(seed);
    let res = |s: &str| {
        Arc::new(Resource {
            attributes: vec![
                KeyValue::new("service.name", Value::Str(s.into())),
                KeyValue::new("host.name", Value::Str(format!("{s}-host"))),
            ],
            ..Default::default()
        })
    };
    let (gateway, engine) = (res("llm-gateway"), res("inference-engine"));
    let scope = Arc::new(Scope {
        name: "weft-test".into(),
        version: "1.0".into(),
        ..Default::default()
    });
    let mut out = Vec::new();
    for t in 0..traces {
        let mut id = [0u8; 16];
        rng.fill(&mut id[..]);
        id[0] |= 1;
        let trace = TraceId(id);
        let base = BASE + t as u64 * 100_000_000;
        let root = SpanId(rng.random::<[u8; 8]>().map(|b| b | 1));
        let generate = SpanId(rng.random::<[u8; 8]>().map(|b| b | 1));
        let version = ["v1", "v2", "v3"][rng.random_range(0..3)];
        let lora = ["none", "sql-lora"][rng.random_range(0..2)];
        let worker = format!("worker-{}", rng.random_range(0..4));
        let error = rng.random_bool(0.1);
        let tokens = rng.random_range(2..12);
        let end = base + 50_000_000 + tokens as u64 * 1_000_000;
        // the provider under its old alias: of the wrong type before the right one, or alone
        let provider = match t % 4 {
            1 => vec![
                KeyValue::new("gen_ai.system", Value::Int(1)),
                KeyValue::new("gen_ai.provider.name", Value::Str("vllm".into())),
            ],
            2 => vec![KeyValue::new("gen_ai.system", Value::Str("sglang".into()))],
            3 => vec![KeyValue::new("gen_ai.provider.name", Value::Int(2))],
            _ => Vec::new(),
        };
        out.push(SpanRecord {
            trace_id: trace,
            span_id: root,
            name: "POST /v1/chat/completions".into(),
            kind: SpanKind::Server,
            start: UnixNanos(base),
            end: UnixNanos(end + 1_000_000),
            attributes: vec![
                KeyValue::new("http.route", Value::Str("/v1/chat/completions".into())),
                KeyValue::new(
                    "http.status_code",
                    Value::Int(if error { 500 } else { 200 }),
                ),
                KeyValue::new("tenant", Value::Str(format!("t{}", t % 3))),
            ],
            status_code: if error {
                StatusCode::Error
            } else {
                StatusCode::Unset
            },
            status_message: if error {
                "upstream failed ✗".into()
            } else {
                String::new()
            },
            resource: gateway.clone(),
            scope: scope.clone(),
            events: if error {
                vec![Event {
                    time: UnixNanos(base + 10),
                    name: "exception".into(),
                    attributes: vec![KeyValue::new(
                        "exception.type",
                        Value::Str("Timeout".into()),
                    )],
                    dropped_attributes_count: 0,
                }]
            } else {
                Vec::new()
            },
            ..Default::default()
        });
        out.push(SpanRecord {
            trace_id: trace,
            span_id: generate,
            parent_span_id: Some(root),
            name: "llm.generate".into(),
            kind: SpanKind::Internal,
            start: UnixNanos(base + 40_000_000),
            end: UnixNanos(end),
            attributes: vec![
                KeyValue::new("llm.model_version", Value::Str(version.into())),
                KeyValue::new("llm.lora_adapter", Value::Str(lora.into())),
                KeyValue::new("worker.id", Value::Str(worker.clone())),
                KeyValue::new("llm.batch_size", Value::Int(rng.random_range(1..5) * 8)),
                KeyValue::new("gen_ai.usage.output_tokens", Value::Int(tokens)),
                KeyValue::new("gen_ai.input.messages", Value::Str("prompt ".repeat(200))),
            ]
            .into_iter()
            .chain(provider)
            .collect(),
            links: if t % 5 == 0 {
                vec![Link {
                    trace_id: trace,
                    span_id: root,
                    trace_state: "k=v".into(),
                    ..Default::default()
                }]
            } else {
                Vec::new()
            },
            resource: engine.clone(),
            scope: scope.clone(),
            ..Default::default()
        });
        for i in 0..tokens {
            let s = base + 50_000_000 + i as u64 * 1_000_000;
            let latency = 900_000 + rng.random_range(0..200_000u64);
            out.push(SpanRecord {
                trace_id: trace,
                span_id: SpanId(rng.random::<[u8; 8]>().map(|b| b | 1)),
                parent_span_id: Some(generate),
                name: "llm.decode.token".into(),
                kind: SpanKind::Internal,
                start: UnixNanos(s),
                end: UnixNanos(s + latency),
                attributes: vec![
                    KeyValue::new("llm.token.index", Value::Int(i)),
                    KeyValue::new("llm.token.latency_ms", Value::Double(latency as f64 / 1e6)),
                ],
                resource: engine.clone(),
                scope: scope.clone(),
                ..Default::default()
            });
        }
    }
    out
}

struct Fixture {
    _dir: tempfile::TempDir,
    engine: SqlEngine,
    spans: Vec<SpanRecord>,
    tenant: TenantId,
}

/// An empty store that writes blocks of at most 400 rows.
fn small_block_store() -> (tempfile::TempDir, Arc<Store>) {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        flush_rows: 400,
        ..Default::default()
    };
    let store = Arc::new(Store::open(dir.path(), opts).unwrap());
    (dir, store)
}

/// A store with several blocks over several time ranges and rows still in the head.
fn fixture() -> Fixture {
    fixture_with(SqlConfig {
        target_partitions: 2,
        ..Default::default()
    })
}

fn fixture_with(config: SqlConfig) -> Fixture {
    let (dir, store) = small_block_store();
    let tenant = TenantId::default_tenant();
    let all = spans(7, 300);
    let (flushed, head) = all.split_at(all.len() - 300);
    for chunk in flushed.chunks(500) {
        store.append(&tenant, chunk.to_vec()).unwrap();
        store.flush(true).unwrap();
    }
    store.append(&tenant, head.to_vec()).unwrap();
    // another tenant that must never show
    store
        .append(&TenantId::new("other").unwrap(), spans(99, 5))
        .unwrap();
    let engine = SqlEngine::new(store, config);
    Fixture {
        _dir: dir,
        engine,
        spans: all,
        tenant,
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Rows as text, in the order the query produced them.
async fn rows(f: &Fixture, sql: &str, pushdown: bool) -> Result<Vec<Vec<String>>, SqlError> {
    let q = f.engine.query_with(&f.tenant, sql, pushdown).await?;
    let batches: Vec<_> = q
        .stream
        .try_collect()
        .await
        .map_err(|e| SqlError::from_datafusion(e, false))?;
    let mut out = Vec::new();
    let opts = FormatOptions::default().with_null("NULL");
    for b in batches {
        let fmts: Vec<_> = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts).unwrap())
            .collect();
        for r in 0..b.num_rows() {
            out.push(fmts.iter().map(|f| f.value(r).to_string()).collect());
        }
    }
    Ok(out)
}

/// Batches' rows as text, one `|`-joined line per row, in order (for the operator tests of
/// the modules beside this one).
pub(super) fn text_rows(batches: &[arrow::array::RecordBatch]) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| {
            (0..b.num_rows()).map(move |r| {
                b.columns()
                    .iter()
                    .map(|c| arrow::util::display::array_value_to_string(c, r).unwrap())
                    .collect::<Vec<_>>()
                    .join("|")
            })
        })
        .collect()
}

fn sorted(mut v: Vec<Vec<String>>) -> Vec<Vec<String>> {
    v.sort();
    v
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn pushdown_answers_equal_plain_scans() {
    let f = fixture();
    let some = &f.spans[f.spans.len() / 3];
    let other = &f.spans[f.spans.len() - 5]; // in the head
    let t0 = BASE + 5_000_000_000;
    let t1 = BASE + 12_000_000_000;
    let queries = vec![
        format!("SELECT span_id, name, duration_ns FROM spans WHERE trace_id = '{}'", some.trace_id.to_hex()),
        format!(
            "SELECT span_id, service_name, name FROM spans WHERE trace_id IN ('{}', '{}', 'not-an-id')",
            some.trace_id.to_hex(),
            other.trace_id.to_hex()
        ),
        // joins whose build side names a few traces: the probe side reads only their rows
        format!(
            "WITH t AS (SELECT '{}' AS id UNION ALL SELECT '{}') SELECT s.span_id, s.name FROM spans s JOIN t ON s.trace_id = t.id",
            some.trace_id.to_hex(),
            other.trace_id.to_hex()
        ),
        "SELECT count(*), count(DISTINCT s.trace_id) FROM spans s JOIN (SELECT trace_id, span_id FROM spans WHERE name = 'llm.generate' AND \"llm.model_version\" = 'v1' AND \"worker.id\" = 'worker-2') g ON s.trace_id = g.trace_id WHERE s.parent_span_id = g.span_id OR s.span_id = g.span_id".into(),
        "SELECT g.\"worker.id\", count(*) FROM spans d JOIN spans g ON d.trace_id = g.trace_id AND d.parent_span_id = g.span_id WHERE g.\"llm.lora_adapter\" = 'sql-lora' AND g.\"llm.model_version\" = 'v3' GROUP BY 1".into(),
        "SELECT \"request.worker.id\", \"request.llm.batch_size\", count(*) FROM spans WHERE \"request.llm.model_version\" = 'v1' GROUP BY 1, 2".into(),
        "SELECT \"llm.model_version\", count(*) FROM spans WHERE \"llm.model_version\" = 'v2' GROUP BY 1".into(),
        "SELECT count(*), count(DISTINCT trace_id) FROM spans WHERE \"llm.model_version\" = 'v1' AND \"worker.id\" = 'worker-2' AND \"llm.lora_adapter\" IN ('sql-lora')".into(),
        "SELECT service_name, status_code, count(*) FROM spans WHERE status_code = 'ERROR' GROUP BY 1, 2".into(),
        "SELECT service_name, count(*) FROM spans WHERE kind = 'SERVER' GROUP BY 1".into(),
        "SELECT name, count(*) FROM spans WHERE kind IN ('INTERNAL', 'CLIENT') AND service_name = 'inference-engine' GROUP BY 1".into(),
        // dedicated values sent with the wrong type, or under an alias, in blocks and head
        "SELECT \"gen_ai.provider.name\", count(*), count(DISTINCT trace_id) FROM spans WHERE \"gen_ai.provider.name\" IN ('vllm', 'sglang') GROUP BY 1".into(),
        "SELECT count(*) FROM spans WHERE \"gen_ai.provider.name\" = 'vllm' AND \"llm.batch_size\" IN (8, 24)".into(),
        "SELECT attributes['gen_ai.system'], count(*) FROM spans WHERE \"gen_ai.provider.name\" IS NULL AND name = 'llm.generate' GROUP BY 1".into(),
        "SELECT count(*) FROM spans WHERE \"llm.batch_size\" = 16".into(),
        format!(
            "SELECT count(*), min(start_time), max(end_time) FROM spans WHERE start_time >= to_timestamp_nanos({t0}) AND start_time < to_timestamp_nanos({t1})"
        ),
        format!("SELECT count(*) FROM spans WHERE end_time BETWEEN to_timestamp_nanos({t0}) AND to_timestamp_nanos({t1}) AND name = 'llm.decode.token'"),
        "SELECT span_id, start_time FROM spans ORDER BY start_time DESC, span_id LIMIT 7".into(),
        "SELECT trace_id, span_count, error_count, services, root_name FROM traces ORDER BY start_time DESC LIMIT 5".into(),
        format!("SELECT span_count FROM traces WHERE trace_id = '{}'", some.trace_id.to_hex()),
        "SELECT name, count(*) FROM span_events GROUP BY name".into(),
        "SELECT count(*) FROM span_links WHERE service_name = 'inference-engine'".into(),
        "SELECT attributes['http.route'], count(*) FROM spans WHERE service_name = 'llm-gateway' GROUP BY 1".into(),
        "SELECT \"http.status_code\", tenant, count(*) FROM spans WHERE \"http.status_code\" IS NOT NULL GROUP BY 1, 2".into(),
        "SELECT resource_attributes['host.name'], count(*) FROM spans GROUP BY 1".into(),
        // exact filters (answered by postings alone) on most of a block and on a few rows
        "SELECT count(*), sum(duration_ns) FROM spans WHERE name = 'llm.decode.token'".into(),
        "SELECT name, status_code, count(*) FROM spans WHERE name IN ('POST /v1/chat/completions', 'llm.generate') AND status_code IN ('OK', 'ERROR') GROUP BY 1, 2".into(),
        "SELECT span_id FROM spans WHERE service_name = 'inference-engine' ORDER BY start_time DESC, span_id LIMIT 3".into(),
        "SELECT count(*) FROM spans WHERE name = 'no-such-span'".into(),
        // a short IN list as the optimizer spells it (equalities joined by OR), and an OR of
        // two columns, which no index answers
        "SELECT name, count(*) FROM spans WHERE name = 'llm.generate' OR name = 'llm.decode.token' OR 'llm.prefill' = name GROUP BY 1".into(),
        "SELECT count(*), count(DISTINCT trace_id) FROM spans WHERE \"request.llm.model_version\" = 'v1' AND (name = 'llm.generate' OR name = 'llm.decode.token')".into(),
        "SELECT name, count(*) FROM spans WHERE name = 'llm.generate' OR service_name = 'llm-gateway' GROUP BY 1".into(),
        // filters the scan applies row by row (no index answers them), under a TopK too
        "SELECT span_id, duration_ns FROM spans WHERE duration_ns > 20000000 AND service_name = 'inference-engine' ORDER BY start_time DESC, span_id LIMIT 5".into(),
        "SELECT count(*), sum(duration_ns) FROM spans WHERE \"llm.lora_adapter\" <> 'sql-lora' OR duration_ns < 1000".into(),
        // a few rows of each block, read together into one batch, then filtered
        "SELECT span_id, duration_ns FROM spans WHERE \"worker.id\" = 'worker-2' AND duration_ns % 3 = 0".into(),
        "SELECT name, count(*) FROM span_events WHERE name LIKE '%token%' OR time > to_timestamp_nanos(0) GROUP BY name".into(),
        // partial aggregations over runs of equal keys (a trace's spans lie together)
        "SELECT service_name, CAST(date_bin(INTERVAL '1 minute', start_time) AS BIGINT) / 1000 AS minute_us, count(*), \
         sum(CASE WHEN status_code = 'ERROR' THEN 1 ELSE 0 END), percentile_cont(0.99) WITHIN GROUP (ORDER BY duration_ns) \
         FROM spans GROUP BY 1, 2".into(),
        // several percentiles of the same values, kept once (`percentiles`), over a join
        "SELECT CAST(date_trunc('minute', p.start_time) AS BIGINT) / 1000 AS minute_us, g.\"llm.model_version\" AS version, \
         percentile_cont(0.5) WITHIN GROUP (ORDER BY p.duration_ns) AS p50, percentile_cont(0.95) WITHIN GROUP (ORDER BY p.duration_ns) AS p95, \
         percentile_cont(0.99) WITHIN GROUP (ORDER BY p.duration_ns DESC) AS p99 \
         FROM spans p JOIN spans g ON p.trace_id = g.trace_id WHERE p.name = 'llm.decode.token' AND g.name = 'llm.generate' GROUP BY 1, 2".into(),
        "SELECT \"worker.id\", \"llm.model_version\", count(*), sum(duration_ns) FILTER (WHERE status_code = 'ERROR'), max(start_time) \
         FROM spans GROUP BY 1, 2".into(),
        // counts answered from the scan's exact row count, without reading a row
        "SELECT count(*) FROM spans".into(),
        format!(
            "SELECT count(*) FROM spans WHERE trace_id IN ('{}', '{}') AND name <> 'nothing'",
            some.trace_id.to_hex(),
            other.trace_id.to_hex()
        ),
        // a trace id in capitals equals no stored (lower-case) id
        format!(
            "SELECT count(*) FROM spans WHERE trace_id = '{}' OR trace_id = '{}'",
            some.trace_id.to_hex().to_uppercase(),
            other.trace_id.to_hex()
        ),
        // a common table expression used several times: computed once when optimised
        "WITH g AS (SELECT trace_id, \"llm.model_version\" AS v FROM spans WHERE name = 'llm.generate'), \
         d AS (SELECT trace_id, duration_ns FROM spans WHERE name = 'llm.decode.token'), \
         u AS (SELECT 'v' AS dim, g.v AS value, d.duration_ns > 20000000 AS slow FROM g JOIN d ON g.trace_id = d.trace_id \
               UNION ALL SELECT 'n' AS dim, 'all' AS value, d.duration_ns > 20000000 AS slow FROM g JOIN d ON g.trace_id = d.trace_id), \
         c AS (SELECT dim, value, sum(CASE WHEN slow THEN 1 ELSE 0 END) AS slow_n, count(*) AS n FROM u GROUP BY 1, 2) \
         SELECT c.dim, c.value, c.slow_n, c.n, t.total FROM c JOIN (SELECT dim, sum(n) AS total FROM c GROUP BY dim) t ON c.dim = t.dim".into(),
    ];
    block_on(async {
        for q in &queries {
            let with = rows(&f, q, true)
                .await
                .unwrap_or_else(|e| panic!("{q}: {e}"));
            let without = rows(&f, q, false)
                .await
                .unwrap_or_else(|e| panic!("{q}: {e}"));
            assert_eq!(sorted(with.clone()), sorted(without), "{q}");
            assert!(!with.is_empty(), "{q} returned nothing");
        }
    });
}

#[test]
fn answers_match_the_data() {
    let f = fixture();
    block_on(async {
        // per model version: spans of generate spans, computed independently
        let mut expect: BTreeMap<String, usize> = BTreeMap::new();
        for s in &f.spans {
            if let Some(Value::Str(v)) = s.attribute("llm.model_version") {
                *expect.entry(v.clone()).or_default() += 1;
            }
        }
        let got = rows(&f, "SELECT \"llm.model_version\", count(*) FROM spans WHERE \"llm.model_version\" IS NOT NULL GROUP BY 1 ORDER BY 1", true)
            .await
            .unwrap();
        let want: Vec<Vec<String>> = expect
            .iter()
            .map(|(k, n)| vec![k.clone(), n.to_string()])
            .collect();
        assert_eq!(got, want);

        let total = rows(&f, "SELECT count(*) FROM spans", true).await.unwrap();
        assert_eq!(total, vec![vec![f.spans.len().to_string()]]);

        // one trace, field by field
        let s = &f.spans[1];
        let got = rows(
            &f,
            &format!(
                "SELECT span_id, parent_span_id, kind, status_code, duration_ns, \"llm.model_version\", \"gen_ai.usage.output_tokens\", scope_name, attributes['gen_ai.input.messages'] = repeat('prompt ', 200) FROM spans WHERE span_id = '{}'",
                s.span_id.to_hex()
            ),
            true,
        )
        .await
        .unwrap();
        let version = match s.attribute("llm.model_version") {
            Some(Value::Str(v)) => v.clone(),
            _ => unreachable!(),
        };
        let tokens = match s.attribute("gen_ai.usage.output_tokens") {
            Some(Value::Int(v)) => v.to_string(),
            _ => unreachable!(),
        };
        assert_eq!(
            got,
            vec![vec![
                hex(&s.span_id.0),
                hex(&s.parent_span_id.unwrap().0),
                "INTERNAL".into(),
                "UNSET".into(),
                s.duration_ns().to_string(),
                version,
                tokens,
                "weft-test".into(),
                "true".into(),
            ]]
        );

        // the root has no parent
        let roots = rows(
            &f,
            "SELECT count(*) FROM spans WHERE parent_span_id IS NULL",
            true,
        )
        .await
        .unwrap();
        assert_eq!(roots, vec![vec!["300".to_string()]]);
        // the other tenant never shows
        let others = rows(&f, "SELECT count(*) FROM spans WHERE service_name NOT IN ('llm-gateway', 'inference-engine')", true)
            .await
            .unwrap();
        assert_eq!(others, vec![vec!["0".to_string()]]);
    });
}

/// The answer of a statement (such as `EXPLAIN`) as text, a line per row.
async fn text_of(f: &Fixture, sql: &str, pushdown: bool) -> String {
    rows(f, sql, pushdown)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|r| r.join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn explain_shows_what_was_pushed() {
    let f = fixture();
    let some = &f.spans[10];
    block_on(async {
        let text = text_of(
            &f,
            &format!(
                "EXPLAIN SELECT * FROM spans WHERE trace_id = '{}'",
                some.trace_id.to_hex()
            ),
            true,
        )
        .await;
        assert!(text.contains("trace_id index: 1 id(s)"), "{text}");
        assert!(text.contains("blocks=1/"), "{text}");
        let text = text_of(
            &f,
            "EXPLAIN SELECT span_id FROM spans WHERE \"llm.model_version\" = 'v3'",
            true,
        )
        .await;
        assert!(
            text.contains("postings llm.model_version IN (v3)"),
            "{text}"
        );
        // exact filters only: the postings' row count is the answer, no row is read
        let text = text_of(
            &f,
            &format!(
                "EXPLAIN SELECT count(*) FROM spans WHERE \"llm.model_version\" = 'v3' AND trace_id = '{}'",
                some.trace_id.to_hex()
            ),
            true,
        )
        .await;
        assert!(
            text.contains("PlaceholderRowExec") && !text.contains("WeftScan"),
            "{text}"
        );
        let text = text_of(&f, "EXPLAIN SELECT name FROM spans", true).await;
        assert!(text.contains("projection=[name]"), "{text}");
        // a filter no index answers is applied by the scan, row by row
        let text = text_of(
            &f,
            "EXPLAIN SELECT span_id FROM spans WHERE duration_ns > 5",
            true,
        )
        .await;
        assert!(
            text.contains("filter=[duration_ns@") && !text.contains("FilterExec"),
            "{text}"
        );
        // the few rows each block selects are read together, as one batch
        let text = text_of(
            &f,
            "EXPLAIN ANALYZE SELECT count(DISTINCT trace_id) FROM spans WHERE \"worker.id\" = 'worker-2' AND \"llm.model_version\" = 'v1'",
            true,
        )
        .await;
        let metric = |name: &str| -> usize {
            let at = text
                .find(&format!("{name}="))
                .unwrap_or_else(|| panic!("no {name}:\n{text}"));
            text[at + name.len() + 1..]
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{name}:\n{text}"))
        };
        let read = metric("blocks_read");
        assert!(read > 1, "{text}");
        assert_eq!(metric("blocks_read_together"), read, "{text}");
    });
}

#[test]
fn limits_hold_over_exact_filters() {
    let f = fixture();
    block_on(async {
        for q in [
            "SELECT span_id FROM spans WHERE name = 'llm.decode.token' LIMIT 3",
            "SELECT span_id FROM spans WHERE service_name IN ('inference-engine', 'llm-gateway') LIMIT 5",
        ] {
            let n = q.rsplit(' ').next().unwrap().parse::<usize>().unwrap();
            assert_eq!(rows(&f, q, true).await.unwrap().len(), n, "{q}");
        }
    });
}

#[test]
fn repeated_subplans_are_computed_once() {
    let f = fixture();
    let q = "WITH c AS (SELECT name, count(*) AS n FROM spans WHERE service_name = 'inference-engine' GROUP BY name) \
             SELECT a.name, a.n, b.n FROM c a JOIN c b ON a.name = b.name ORDER BY 1";
    block_on(async {
        let plan = text_of(&f, &format!("EXPLAIN {q}"), true).await;
        assert!(
            plan.contains("SharedExec: id=1, consumers=2"),
            "the CTE should be shared by its two uses:\n{plan}"
        );
        let plain = text_of(&f, &format!("EXPLAIN {q}"), false).await;
        assert!(!plain.contains("SharedExec"), "{plain}");
        // the shared copy reads the blocks once: one scan reports blocks read, the other none
        let analyzed = text_of(&f, &format!("EXPLAIN ANALYZE {q}"), true).await;
        let reads: Vec<&str> = analyzed
            .split("blocks_read=")
            .skip(1)
            .map(|s| s.split([',', ']']).next().unwrap_or_default())
            .collect();
        assert_eq!(reads.len(), 1, "one scan should run:\n{analyzed}");
        assert!(analyzed.contains("(computed once: "), "{analyzed}");
        let with = rows(&f, q, true).await.unwrap();
        assert_eq!(with, rows(&f, q, false).await.unwrap());
        assert!(with.iter().all(|r| r[1] == r[2]), "{with:?}");
        // a volatile function is never shared
        let random = text_of(
            &f,
            "EXPLAIN WITH r AS (SELECT random() AS x, name FROM spans) SELECT * FROM r a JOIN r b ON a.name = b.name",
            true,
        )
        .await;
        assert_eq!(random.matches("random() as x").count(), 2, "{random}");
        let lines: Vec<&str> = random.lines().collect();
        for pair in lines.windows(2) {
            assert!(
                !(pair[0].contains("SharedExec") && pair[1].contains("random()")),
                "{random}"
            );
        }
    });
}

#[test]
fn shared_subplans_that_do_not_fit_run_per_consumer() {
    let f = fixture();
    // enough memory for the query, not for keeping the shared scan's batches
    let engine = SqlEngine::new(
        f.engine.store().clone(),
        SqlConfig {
            memory_limit: 64 << 10,
            target_partitions: 2,
            ..Default::default()
        },
    );
    let q = "WITH d AS (SELECT trace_id, span_id FROM spans) \
             SELECT (SELECT min(trace_id || span_id) FROM d) AS a, (SELECT max(span_id || trace_id) FROM d) AS b";
    block_on(async {
        let run = |pushdown| {
            let engine = engine.clone();
            let tenant = f.tenant.clone();
            async move {
                let out = engine.query_with(&tenant, q, pushdown).await.unwrap();
                let batches: Vec<_> = out.stream.try_collect().await.unwrap();
                arrow::util::pretty::pretty_format_batches(&batches)
                    .unwrap()
                    .to_string()
            }
        };
        assert_eq!(run(true).await, run(false).await);
        // both uses ran their own copy: two scans report blocks read
        let analyzed = engine
            .query(&f.tenant, &format!("EXPLAIN ANALYZE {q}"))
            .await
            .unwrap();
        let batches: Vec<_> = analyzed.stream.try_collect().await.unwrap();
        let text = arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string();
        assert!(text.contains("SharedExec"), "{text}");
        assert_eq!(text.matches("blocks_read=").count(), 2, "{text}");
        assert!(
            text.contains("(too large for the query's memory: each consumer ran its own copy)"),
            "{text}"
        );
    });
}

#[test]
fn only_queries_are_accepted() {
    for sql in [
        "CREATE TABLE x (a int)",
        "INSERT INTO spans VALUES (1)",
        "DELETE FROM spans",
        "COPY spans TO '/tmp/x.csv'",
        "SET datafusion.execution.batch_size = 1",
        "DROP TABLE spans",
    ] {
        let e = check_read_only(sql).unwrap_err();
        assert_eq!(e.kind, SqlErrorKind::NotAQuery, "{sql}");
        assert!(
            e.message.contains("only queries are accepted"),
            "{}",
            e.message
        );
    }
    check_read_only("SELECT 1").unwrap();
    check_read_only("WITH a AS (SELECT 1) SELECT * FROM a").unwrap();
    check_read_only("EXPLAIN SELECT 1").unwrap();
    check_read_only("SHOW TABLES").unwrap();
    let e = check_read_only("SELECT * FROM spans WHERE").unwrap_err();
    assert_eq!(e.kind, SqlErrorKind::Invalid);
    assert_eq!(e.line, Some(1), "{}", e.message);
}

#[test]
fn errors_name_the_problem() {
    let f = fixture();
    block_on(async {
        let e = rows(&f, "SELECT no_such_column FROM spans", true)
            .await
            .unwrap_err();
        assert_eq!(e.kind, SqlErrorKind::Invalid);
        assert!(e.message.contains("no_such_column"), "{}", e.message);
        let e = rows(&f, "SELECT * FROM nowhere", true).await.unwrap_err();
        assert!(e.message.contains("nowhere"), "{}", e.message);
        let v = rows(
            &f,
            "SELECT version(), current_setting('server_version')",
            true,
        )
        .await
        .unwrap();
        assert!(v[0][0].starts_with("PostgreSQL 16"), "{:?}", v);
        assert_eq!(v[0][1], "16.4");
    });
}

#[test]
fn memory_limit_fails_the_query_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), StoreOptions::default()).unwrap());
    let tenant = TenantId::default_tenant();
    store.append(&tenant, spans(3, 400)).unwrap();
    let engine = SqlEngine::new(
        store,
        SqlConfig {
            memory_limit: 64 << 10,
            target_partitions: 2,
            ..Default::default()
        },
    );
    block_on(async {
        let q = engine
            .query(
                &tenant,
                "SELECT trace_id, span_id, array_agg(name) FROM spans GROUP BY 1, 2 ORDER BY 1, 2",
            )
            .await;
        let e = match q {
            Err(e) => e,
            Ok(q) => q
                .stream
                .try_collect::<Vec<_>>()
                .await
                .map_err(|e| SqlError::from_datafusion(e, false))
                .unwrap_err(),
        };
        assert_eq!(e.kind, SqlErrorKind::ResourcesExhausted, "{}", e.message);
        // the engine still answers
        let q = engine
            .query(&tenant, "SELECT count(*) FROM spans")
            .await
            .unwrap();
        let b: Vec<_> = q.stream.try_collect().await.unwrap();
        assert_eq!(b[0].num_rows(), 1);
    });
}

#[test]
fn kept_plans_read_each_query_s_own_snapshot() {
    let f = fixture();
    let count = |sql: &'static str| {
        let f = &f;
        async move { rows(f, sql, true).await.unwrap() }
    };
    block_on(async {
        let by_version = "SELECT count(*) FROM spans WHERE \"llm.model_version\" = 'v2'";
        let first = count(by_version).await;
        assert_eq!(f.engine.plans().len(), 1, "the plan is kept");
        assert!(f.engine.plans().holds(&f.tenant, true, by_version));
        assert!(!f.engine.plans().holds(&f.tenant, false, by_version));
        assert_eq!(
            count(by_version).await,
            first,
            "the kept plan answers the same"
        );
        assert_eq!(f.engine.plans().len(), 1);

        // more rows of the same shape, and a new attribute key (a new dynamic column)
        let mut more = spans(11, 40);
        let added_v2 = more
            .iter()
            .filter(|s| {
                s.attributes
                    .iter()
                    .any(|kv| kv.key == "llm.model_version" && kv.value == Value::Str("v2".into()))
            })
            .count();
        assert!(added_v2 > 0);
        more[0]
            .attributes
            .push(KeyValue::new("tenant.tier", Value::Str("gold".into())));
        f.engine.store().append(&f.tenant, more).unwrap();
        let want: usize = first[0][0].parse::<usize>().unwrap() + added_v2;
        assert_eq!(
            count(by_version).await,
            vec![vec![want.to_string()]],
            "a kept plan reads the snapshot of the query that takes it"
        );
        // nothing that may change between runs is kept
        let kept = f.engine.plans().len();
        let clock = "SELECT CAST(now() AS BIGINT), count(*) FROM spans";
        let a = count(clock).await;
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = count(clock).await;
        assert_ne!(a[0][0], b[0][0], "now() is the time of each query");
        count("EXPLAIN SELECT count(*) FROM spans").await;
        assert!(rows(&f, "SELECT nope FROM spans", true).await.is_err());
        assert_eq!(f.engine.plans().len(), kept);

        // a column whose schema changed is planned again rather than read through a stale plan
        let columns = "SELECT * FROM spans LIMIT 1";
        let before = rows(&f, columns, true).await.unwrap()[0].len();
        let mut wider = spans(13, 1);
        wider[0]
            .attributes
            .push(KeyValue::new("region.zone", Value::Str("eu-1".into())));
        f.engine.store().append(&f.tenant, wider).unwrap();
        let after = rows(&f, columns, true).await.unwrap()[0].len();
        assert_eq!(after, before + 1, "the new dynamic column shows");
    });
}

#[test]
fn kept_physical_plans_rebuild_their_scans_over_each_snapshot() {
    let f = fixture();
    block_on(async {
        let plans = f.engine.plans();
        let held = |sql: &str| plans.holds_physical(&f.tenant, true, sql);
        // an aggregate over an index-served scan: its physical plan is kept and rebuilt
        let by_worker = "SELECT \"worker.id\", count(*), count(DISTINCT trace_id) FROM spans \
                         WHERE \"llm.model_version\" = 'v2' GROUP BY 1 ORDER BY 1";
        let first = rows(&f, by_worker, true).await.unwrap();
        assert!(held(by_worker), "the physical plan is kept");
        assert_eq!(rows(&f, by_worker, true).await.unwrap(), first);
        assert_eq!(rows(&f, by_worker, false).await.unwrap(), first);

        // new rows in the head, then in new blocks: each run reads its own snapshot
        f.engine.store().append(&f.tenant, spans(21, 30)).unwrap();
        let plain = rows(&f, by_worker, false).await.unwrap();
        assert_ne!(plain, first, "the new rows change the answer");
        assert_eq!(rows(&f, by_worker, true).await.unwrap(), plain);
        f.engine.store().flush(true).unwrap();
        f.engine.store().append(&f.tenant, spans(22, 30)).unwrap();
        f.engine.store().flush(true).unwrap();
        let plain = rows(&f, by_worker, false).await.unwrap();
        assert_eq!(rows(&f, by_worker, true).await.unwrap(), plain);
        assert!(held(by_worker));

        // a grouped aggregation over every block, its first stage collapsing key runs: kept
        // too, and each run's copy reads its own snapshot
        let per_minute = "SELECT service_name, CAST(date_bin(INTERVAL '1 minute', start_time) AS BIGINT) / 1000, \
                          count(*), sum(duration_ns) FROM spans GROUP BY 1, 2 ORDER BY 1, 2";
        // (enough rows that the scan is split over partitions, the aggregation in two stages)
        f.engine.store().append(&f.tenant, spans(24, 1200)).unwrap();
        f.engine.store().flush(true).unwrap();
        let explain = text_of(&f, &format!("EXPLAIN {per_minute}"), true).await;
        assert!(explain.contains("RunAggregateExec"), "{explain}");
        let first = rows(&f, per_minute, true).await.unwrap();
        assert!(held(per_minute), "the physical plan is kept");
        assert_eq!(first, rows(&f, per_minute, false).await.unwrap());
        f.engine.store().append(&f.tenant, spans(25, 30)).unwrap();
        let plain = rows(&f, per_minute, false).await.unwrap();
        assert_ne!(plain, first, "the new rows change the answer");
        assert_eq!(rows(&f, per_minute, true).await.unwrap(), plain);

        // operators wired by dynamic filters (a TopK, a join) are planned every time
        let newest = "SELECT span_id FROM spans ORDER BY start_time DESC, span_id LIMIT 3";
        let joined = "SELECT count(*) FROM spans a JOIN spans b ON a.trace_id = b.trace_id \
                      WHERE a.name = 'POST /v1/chat/completions' AND b.name = 'llm.generate'";
        for sql in [newest, joined] {
            let once = rows(&f, sql, true).await.unwrap();
            assert!(
                plans.holds(&f.tenant, true, sql),
                "{sql}: the logical plan is kept"
            );
            assert!(!held(sql), "{sql}: the physical plan is not");
            f.engine.store().append(&f.tenant, spans(23, 5)).unwrap();
            assert_eq!(
                rows(&f, sql, true).await.unwrap(),
                rows(&f, sql, false).await.unwrap(),
                "{sql}"
            );
            assert!(!once.is_empty());
        }
    });
}

/// A span of the summary test: `root` spans have no parent.
fn summary_span(trace: u8, id: u8, root: bool, name: &str, start: u64) -> SpanRecord {
    SpanRecord {
        trace_id: TraceId([trace; 16]),
        span_id: SpanId([id; 8]),
        parent_span_id: (!root).then_some(SpanId([0xee; 8])),
        name: name.into(),
        start: UnixNanos(BASE + start),
        end: UnixNanos(BASE + start + 1_000 + u64::from(id)),
        status_code: if id.is_multiple_of(3) {
            StatusCode::Error
        } else {
            StatusCode::Unset
        },
        resource: Arc::new(Resource {
            attributes: vec![KeyValue::new(
                "service.name",
                Value::Str(format!("svc-{id}")),
            )],
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn search_and_the_traces_table_agree_on_every_trace() {
    let (dir, store) = small_block_store();
    let tenant = TenantId::default_tenant();
    // trace 0xa1: two roots, the later one flushed first; 0xa2: no root, split between a block
    // and the head; 0xa3: two roots starting together (the smaller span id wins)
    let first = vec![
        summary_span(0xa1, 1, true, "late-root", 100),
        summary_span(0xa2, 2, false, "orphan", 10),
        summary_span(0xa3, 9, true, "tie-9", 40),
    ];
    let second = vec![
        summary_span(0xa1, 3, true, "early-root", 50),
        summary_span(0xa3, 4, true, "tie-4", 40),
    ];
    let head = vec![
        summary_span(0xa1, 5, false, "child", 20),
        summary_span(0xa2, 6, false, "orphan-2", 5),
    ];
    let generated = spans(11, 120);
    let (flushed, unflushed) = generated.split_at(generated.len() - 100);
    for part in [first, second, flushed.to_vec()] {
        store.append(&tenant, part).unwrap();
        store.flush(true).unwrap();
    }
    store.append(&tenant, head).unwrap();
    store.append(&tenant, unflushed.to_vec()).unwrap();

    let found = crate::search(
        &store,
        &tenant,
        &crate::SearchRequest {
            limit: 1000,
            ..Default::default()
        },
    )
    .unwrap();
    let from_search: Vec<Vec<String>> = found
        .traces
        .iter()
        .map(|t| {
            vec![
                t.trace_id.to_hex(),
                t.root_service.clone(),
                t.root_name.clone(),
                t.start_time.to_string(),
                t.duration_ns.to_string(),
                t.span_count.to_string(),
                t.error_count.to_string(),
            ]
        })
        .collect();
    let engine = SqlEngine::new(store.clone(), SqlConfig::default());
    let f = Fixture {
        _dir: dir,
        engine,
        spans: generated,
        tenant,
    };
    let from_sql = block_on(rows(
        &f,
        "SELECT trace_id, coalesce(root_service, ''), coalesce(root_name, ''), \
         CAST(start_time AS BIGINT) AS start_ns, duration_ns, span_count, error_count FROM traces \
         ORDER BY start_time DESC, trace_id DESC",
        true,
    ))
    .unwrap();
    assert_eq!(from_search.len(), 123);
    assert_eq!(from_search, from_sql);
    let row = |id: u8| {
        from_sql
            .iter()
            .find(|r| r[0] == hex(&[id; 16]))
            .unwrap()
            .clone()
    };
    assert_eq!(row(0xa1)[2], "early-root");
    assert_eq!(row(0xa1)[5], "3");
    assert_eq!(row(0xa2)[1], "", "no root");
    assert_eq!(row(0xa2)[3], (BASE + 5).to_string());
    assert_eq!(row(0xa3)[2], "tie-4");
}

#[test]
fn a_join_naming_a_few_traces_reads_only_their_rows() {
    let f = fixture();
    let some = &f.spans[f.spans.len() / 3];
    let trace = some.trace_id.to_hex();
    let spans = f
        .spans
        .iter()
        .filter(|s| s.trace_id == some.trace_id)
        .count();
    let sql = format!(
        "EXPLAIN ANALYZE WITH t AS (SELECT '{trace}' AS id) SELECT s.span_id FROM spans s JOIN t ON s.trace_id = t.id"
    );
    let plan = block_on(text_of(&f, &sql, true));
    // "rows_read=2.57 K" or "rows_read=12"
    let metric = plan
        .split("rows_read=")
        .nth(1)
        .and_then(|r| r.split([',', ']']).next())
        .unwrap_or_else(|| panic!("no rows_read in {plan}"));
    let read = match metric.split_once(' ') {
        Some((n, "K")) => n.parse::<f64>().unwrap() * 1e3,
        Some((n, "M")) => n.parse::<f64>().unwrap() * 1e6,
        _ => metric.parse::<f64>().unwrap(),
    } as usize;
    // the trace's rows in blocks, not every block's rows (head rows are read as they are)
    assert!(
        read <= spans + 300,
        "{read} rows read for a trace of {spans}: {plan}"
    );
    let got = block_on(rows(
        &f,
        &format!("WITH t AS (SELECT '{trace}' AS id) SELECT count(*) FROM spans s JOIN t ON s.trace_id = t.id"),
        true,
    ))
    .unwrap();
    assert_eq!(got, vec![vec![spans.to_string()]]);
}

#[test]
fn trace_local_joins_answer_as_datafusion_s_hash_join() {
    let f = fixture_with(SqlConfig {
        target_partitions: 2,
        trace_local_join_min_rows: 0,
        ..Default::default()
    });
    let queries = [
        // parent and child
        "SELECT c.span_id, p.span_id, c.name, p.name FROM spans c JOIN spans p ON c.trace_id = p.trace_id AND c.parent_span_id = p.span_id",
        // the same, the other way round, with a residual filter
        "SELECT c.span_id, p.name FROM spans p JOIN spans c ON p.trace_id = c.trace_id AND p.span_id = c.parent_span_id AND c.start_time >= p.start_time",
        // same trace, both sides filtered, a dimension from the other side
        "SELECT d.span_id, g.\"llm.model_version\", d.duration_ns FROM spans d JOIN spans g ON d.trace_id = g.trace_id WHERE g.name = 'llm.generate' AND d.name = 'llm.decode.token'",
        // every pair of a trace's spans, aggregated
        "SELECT a.name, b.name, count(*) AS n FROM spans a JOIN spans b ON a.trace_id = b.trace_id GROUP BY 1, 2",
        // a subquery that renames the keys, and an OR over them after the join
        "SELECT s.span_id, g.sid FROM spans s JOIN (SELECT trace_id AS t, span_id AS sid FROM spans WHERE name = 'llm.generate') g ON s.trace_id = g.t WHERE s.span_id = g.sid OR s.parent_span_id = g.sid",
        // a time range on one side only: blocks only it reads still give their split traces
        "SELECT a.span_id, b.span_id FROM spans a JOIN spans b ON a.trace_id = b.trace_id AND a.parent_span_id = b.span_id WHERE a.start_time < '2023-11-14T22:13:40Z'",
        // children that have a parent, to their parents (an id's IS NOT NULL narrows nothing
        // the join would keep)
        "SELECT p.name, c.name, count(*) FROM spans c JOIN spans p ON c.trace_id = p.trace_id AND c.parent_span_id = p.span_id WHERE c.parent_span_id IS NOT NULL AND c.start_time >= '2023-11-14T00:00:00Z' GROUP BY 1, 2",
        // a parent's dimension over its children, no id in the output (read by rank alone)
        "SELECT g.\"llm.model_version\", c.name, count(*), sum(c.duration_ns) FROM spans c JOIN spans g ON c.trace_id = g.trace_id AND c.parent_span_id = g.span_id WHERE g.name = 'llm.generate' GROUP BY 1, 2",
        // the same the other way round, ids of one side in the output
        "SELECT c.span_id, g.duration_ns - c.duration_ns FROM spans g JOIN spans c ON g.span_id = c.parent_span_id AND g.trace_id = c.trace_id WHERE g.name = 'llm.generate' AND c.name IN ('llm.prefill', 'llm.decode.token')",
    ];
    for sql in queries {
        let plan = block_on(text_of(&f, &format!("EXPLAIN {sql}"), true));
        assert!(plan.contains("TraceLocalJoinExec"), "{sql}: {plan}");
        assert!(!plan.contains("HashJoinExec"), "{sql}: {plan}");
        let got = sorted(block_on(rows(&f, sql, true)).unwrap());
        let want = sorted(block_on(rows(&f, sql, false)).unwrap());
        assert!(!want.is_empty(), "{sql}");
        assert_eq!(got.len(), want.len(), "{sql}");
        assert_eq!(got, want, "{sql}");
    }
    // parent ↔ child joins pair rows by the blocks' parent ranks, and read no id that only the
    // keys use
    for (i, unread) in [(0, 3), (1, 4), (7, 4), (8, 4)] {
        let plan = block_on(text_of(&f, &format!("EXPLAIN {}", queries[i]), true));
        let said = format!("paired by parent rank ({unread} id columns unread)");
        assert!(plan.contains(&said), "{said}: {plan}");
    }
    // the fixture has traces over two blocks and traces with rows in the head
    let plan = block_on(text_of(&f, &format!("EXPLAIN {}", queries[0]), true));
    let scattered: usize = plan
        .split("scattered traces=")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{plan}"));
    assert!(scattered > 0, "{plan}");
    // a side whose scan is also read elsewhere (a CTE joined in two branches) keeps the hash
    // join, the scan read once and shared
    let sql = "WITH d AS (SELECT trace_id, duration_ns FROM spans WHERE name = 'llm.decode.token') SELECT v, count(*) FROM (SELECT g.name AS v FROM spans g JOIN d ON g.trace_id = d.trace_id UNION ALL SELECT g.kind AS v FROM spans g JOIN d ON g.trace_id = d.trace_id) GROUP BY v";
    let plan = block_on(text_of(&f, &format!("EXPLAIN {sql}"), true));
    assert!(
        plan.contains("HashJoinExec") && plan.contains("SharedExec"),
        "{plan}"
    );
    assert!(!plan.contains("TraceLocalJoinExec"), "{plan}");
    assert_eq!(
        sorted(block_on(rows(&f, sql, true)).unwrap()),
        sorted(block_on(rows(&f, sql, false)).unwrap())
    );
    // so does a side that a filter other than on time may make small (a scan knows only an
    // upper bound of its rows then)
    let sql = "SELECT count(*) FROM spans c JOIN spans p ON c.trace_id = p.trace_id WHERE p.duration_ns > 60000000";
    let plan = block_on(text_of(&f, &format!("EXPLAIN {sql}"), true));
    assert!(plan.contains("HashJoinExec"), "{plan}");
    // a small side keeps the hash join, whose build side narrows the other scan's rows
    let sql = "SELECT count(*) FROM spans c JOIN spans p ON c.trace_id = p.trace_id AND c.parent_span_id = p.span_id";
    let plan = block_on(text_of(&fixture(), &format!("EXPLAIN {sql}"), true));
    assert!(plan.contains("HashJoinExec"), "{plan}");
}
