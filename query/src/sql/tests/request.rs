//! The `"request.D"` columns against a naive ancestor walk over every stored span: retried
//! requests (two generate spans on two workers), children stored before their parents (in an
//! earlier block, or in a block while the parent is in the head), traces whose root has a
//! remote parent; with and without push-down, before and after a restart.

use super::*;

/// Traces shaped as an engine sends them: a root, one or two generate attempts, tokens. Each
/// entry is (arrival group, span): spans of group 0 are flushed first, group 1 next, group 2
/// stays in the head.
fn traces(seed: u64) -> Vec<(u8, SpanRecord)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let engine = Arc::new(Resource {
        attributes: vec![KeyValue::new("service.name", Value::Str("engine".into()))],
        ..Default::default()
    });
    let mut out = Vec::new();
    for t in 0..60u64 {
        let mut id = [0u8; 16];
        rng.fill(&mut id[..]);
        let trace = TraceId(id);
        let base = BASE + t * 1_000_000_000;
        let new_id = |rng: &mut StdRng| SpanId(rng.random::<[u8; 8]>().map(|b| b | 1));
        let span = |id, parent, name: &str, at: u64, attrs: Vec<KeyValue>| SpanRecord {
            trace_id: trace,
            span_id: id,
            parent_span_id: parent,
            name: name.into(),
            kind: SpanKind::Internal,
            start: UnixNanos(base + at),
            end: UnixNanos(base + at + 1_000),
            attributes: attrs,
            resource: engine.clone(),
            ..Default::default()
        };
        let root = new_id(&mut rng);
        // a root continued from a caller Weft never sees, now and then
        let remote = (t % 7 == 0).then(|| new_id(&mut rng));
        let shape = t % 5; // 0: plain, 1: retry, 2: tokens flushed before their generate span,
        // 3: tokens flushed while the generate span stays in the head, 4: all in the head
        let (root_group, gen_group, token_group) = match shape {
            2 => (1, 1, 0),
            3 => (2, 2, 0),
            4 => (2, 2, 2),
            _ => (0, 0, 0),
        };
        out.push((
            root_group,
            span(
                root,
                remote,
                "POST /v1/chat/completions",
                0,
                vec![KeyValue::new(
                    "llm.model_version",
                    Value::Str(format!("v{}", t % 3)),
                )],
            ),
        ));
        let attempts = if shape == 1 { 2 } else { 1 };
        for a in 0..attempts {
            let generate = new_id(&mut rng);
            let worker = format!("w-{}", (t + a * 6) % 8);
            out.push((
                gen_group,
                span(
                    generate,
                    Some(root),
                    "llm.generate",
                    10 + a * 500,
                    vec![
                        KeyValue::new("worker.id", Value::Str(worker)),
                        KeyValue::new("llm.batch_size", Value::Int(8 * (1 + (t % 4) as i64))),
                        KeyValue::new("llm.lora_adapter", Value::Str("sql-lora".into())),
                    ],
                ),
            ));
            for k in 0..rng.random_range(2..6) {
                let mut attrs = vec![KeyValue::new("llm.token.index", Value::Int(k))];
                if k == 0 && t % 11 == 0 {
                    // a token that says otherwise: its own value wins
                    attrs.push(KeyValue::new("worker.id", Value::Str("w-own".into())));
                }
                out.push((
                    token_group,
                    span(
                        new_id(&mut rng),
                        Some(generate),
                        "llm.decode",
                        20 + a * 500 + k as u64 * 10,
                        attrs,
                    ),
                ));
            }
        }
    }
    out
}

/// The nearest value of `key` on a span or its ancestors, one step at a time.
fn naive(all: &[SpanRecord], span: &SpanRecord, key: &str) -> String {
    let mut cur = span;
    loop {
        if let Some(v) = cur.attribute(key) {
            return match v {
                Value::Str(s) => s.clone(),
                Value::Int(i) => i.to_string(),
                _ => unreachable!(),
            };
        }
        let Some(parent) = cur.parent_span_id else {
            return "NULL".into();
        };
        match all
            .iter()
            .find(|s| s.trace_id == cur.trace_id && s.span_id == parent)
        {
            Some(p) => cur = p,
            None => return "NULL".into(),
        }
    }
}

fn store_of(dir: &std::path::Path, groups: &[(u8, SpanRecord)], tenant: &TenantId) -> Arc<Store> {
    let store = Arc::new(Store::open(dir, StoreOptions::default()).unwrap());
    for g in 0..3 {
        let rows: Vec<SpanRecord> = groups
            .iter()
            .filter(|(k, _)| *k == g)
            .map(|(_, s)| s.clone())
            .collect();
        store.append(tenant, rows).unwrap();
        if g < 2 {
            store.flush(true).unwrap();
        }
    }
    store
}

fn fixture_of(dir: tempfile::TempDir, store: Arc<Store>, all: Vec<SpanRecord>) -> Fixture {
    let engine = SqlEngine::new(
        store,
        SqlConfig {
            target_partitions: 2,
            ..Default::default()
        },
    );
    Fixture {
        _dir: dir,
        engine,
        spans: all,
        tenant: TenantId::default_tenant(),
    }
}

fn check(f: &Fixture) {
    let all = &f.spans;
    let expected: Vec<Vec<String>> = all
        .iter()
        .map(|s| {
            vec![
                s.span_id.to_hex(),
                naive(all, s, "worker.id"),
                naive(all, s, "llm.model_version"),
                naive(all, s, "llm.batch_size"),
            ]
        })
        .collect();
    let sql = r#"SELECT span_id, "request.worker.id", "request.llm.model_version",
        "request.llm.batch_size" FROM spans"#;
    for pushdown in [true, false] {
        let got = block_on(rows(f, sql, pushdown)).unwrap();
        assert_eq!(sorted(got), sorted(expected.clone()), "pushdown {pushdown}");
    }
    // IS NOT NULL on an indexed column is answered by its postings (blocks and head alike),
    // so late rows of other spans are not resolved; the request values are still exact
    let mut want: Vec<Vec<String>> = all
        .iter()
        .filter(|s| s.attribute("worker.id").is_some())
        .map(|s| vec![s.span_id.to_hex(), naive(all, s, "llm.model_version")])
        .collect();
    want.sort();
    assert!(!want.is_empty() && want.len() < all.len());
    let sql =
        r#"SELECT span_id, "request.llm.model_version" FROM spans WHERE "worker.id" IS NOT NULL"#;
    for pushdown in [true, false] {
        let got = sorted(block_on(rows(f, sql, pushdown)).unwrap());
        assert_eq!(got, want, "IS NOT NULL, pushdown {pushdown}");
    }
    let count =
        r#"SELECT count(*) FROM spans WHERE "worker.id" IS NOT NULL AND name = 'llm.generate'"#;
    let generates = all
        .iter()
        .filter(|s| s.attribute("worker.id").is_some() && s.name == "llm.generate")
        .count();
    assert!(generates > 0);
    let got = block_on(rows(f, count, true)).unwrap();
    assert_eq!(got, vec![vec![generates.to_string()]], "{count}");
    // filters on request columns select exactly the spans the walk finds
    let cases = [
        (r#""request.worker.id" = 'w-7'"#, ("worker.id", vec!["w-7"])),
        (
            r#""request.worker.id" IN ('w-1', 'w-own')"#,
            ("worker.id", vec!["w-1", "w-own"]),
        ),
        (
            r#""request.llm.model_version" = 'v2'"#,
            ("llm.model_version", vec!["v2"]),
        ),
        (
            r#""request.llm.batch_size" = 16"#,
            ("llm.batch_size", vec!["16"]),
        ),
    ];
    for (filter, (key, values)) in cases {
        let mut want: Vec<Vec<String>> = all
            .iter()
            .filter(|s| values.contains(&naive(all, s, key).as_str()))
            .filter(|s| s.name == "llm.decode")
            .map(|s| vec![s.span_id.to_hex()])
            .collect();
        want.sort();
        assert!(!want.is_empty(), "{filter} selects something");
        let sql = format!("SELECT span_id FROM spans WHERE {filter} AND name = 'llm.decode'");
        for pushdown in [true, false] {
            let got = sorted(block_on(rows(f, &sql, pushdown)).unwrap());
            assert_eq!(got, want, "{filter}, pushdown {pushdown}");
        }
        let count = format!("SELECT count(*) FROM spans WHERE {filter} AND name = 'llm.decode'");
        let got = block_on(rows(f, &count, true)).unwrap();
        assert_eq!(got, vec![vec![want.len().to_string()]], "{count}");
    }
}

#[test]
fn request_columns_match_a_naive_ancestor_walk() {
    let tenant = TenantId::default_tenant();
    let groups = traces(3);
    let all: Vec<SpanRecord> = groups.iter().map(|(_, s)| s.clone()).collect();
    let dir = tempfile::tempdir().unwrap();
    let store = store_of(dir.path(), &groups, &tenant);
    assert!(store.blocks(&tenant).len() >= 2);
    let f = fixture_of(dir, store, all.clone());
    check(&f);

    // after a restart (the head replayed, the split traces read back), then with every row
    // in blocks
    let Fixture {
        _dir: dir, engine, ..
    } = f;
    drop(engine);
    let store = Arc::new(Store::open(dir.path(), StoreOptions::default()).unwrap());
    let f = fixture_of(dir, store.clone(), all.clone());
    check(&f);
    store.flush(true).unwrap();
    check(&f);

    // a token arriving late under a generate span stored blocks ago: the split traces resolved
    // for the queries above (kept across queries) are resolved again over the new blocks
    let late: Vec<SpanRecord> = groups
        .iter()
        .filter(|(g, s)| *g == 1 && s.name == "llm.generate")
        .map(|(_, s)| SpanRecord {
            span_id: SpanId([0x5a; 8]),
            parent_span_id: Some(s.span_id),
            name: "llm.decode".into(),
            start: UnixNanos(s.start.0 + 400),
            end: UnixNanos(s.start.0 + 500),
            attributes: vec![KeyValue::new("llm.token.index", Value::Int(99))],
            ..s.clone()
        })
        .collect();
    assert!(!late.is_empty());
    store.append(&tenant, late.clone()).unwrap();
    store.flush(true).unwrap();
    let mut all = all;
    all.extend(late);
    let Fixture {
        _dir: dir, engine, ..
    } = f;
    let f = Fixture {
        _dir: dir,
        engine,
        spans: all,
        tenant,
    };
    check(&f);
}

#[test]
fn explain_shows_request_postings() {
    let tenant = TenantId::default_tenant();
    let groups = traces(4);
    let all: Vec<SpanRecord> = groups.iter().map(|(_, s)| s.clone()).collect();
    let dir = tempfile::tempdir().unwrap();
    let store = store_of(dir.path(), &groups, &tenant);
    let f = fixture_of(dir, store, all);
    let plan = block_on(text_of(
        &f,
        r#"EXPLAIN SELECT span_id FROM spans WHERE "request.worker.id" = 'w-3'"#,
        true,
    ));
    assert!(
        plan.contains("postings request:worker.id IN (w-3)"),
        "{plan}"
    );
    // the postings and the late rows resolved at planning select exactly: no filter is left
    // to apply, so the request column is not read
    assert!(!plan.contains("filter=["), "{plan}");
    assert!(!plan.contains("projection=[span_id, request"), "{plan}");
    let plan = block_on(text_of(
        &f,
        r#"EXPLAIN SELECT span_id FROM spans WHERE "worker.id" IS NOT NULL"#,
        true,
    ));
    assert!(plan.contains("postings worker.id present"), "{plan}");
    assert!(!plan.contains("filter=["), "{plan}");
}

/// The traces above with decode token spans as engines name them, each with its own latency
/// (some without: their duration counts): slow (40–60 ms) for worker `w-3` between seconds
/// 20 and 30, 1–5 ms otherwise.
fn token_traces(seed: u64) -> Vec<(u8, SpanRecord)> {
    use weft_storage::heat::{TOKEN_LATENCY, TOKEN_SPAN};
    let groups = traces(seed);
    let all: Vec<SpanRecord> = groups.iter().map(|(_, s)| s.clone()).collect();
    let mut rng = StdRng::seed_from_u64(seed + 1);
    groups
        .iter()
        .map(|(g, s)| {
            let mut s = s.clone();
            if s.name == "llm.decode" {
                s.name = TOKEN_SPAN.into();
                let second = (s.start.0 - BASE) / 1_000_000_000;
                let slow = (20..30).contains(&second) && naive(&all, &s, "worker.id") == "w-3";
                let ms = if slow {
                    rng.random_range(40.0..60.0)
                } else {
                    rng.random_range(1.0..5.0)
                };
                if !rng.random_bool(0.1) {
                    s.attributes
                        .push(KeyValue::new(TOKEN_LATENCY, Value::Double(ms)));
                }
            }
            (*g, s)
        })
        .collect()
}

#[test]
fn decode_anomaly_series_and_attribution_from_rollups_and_postings_match_sql() {
    use crate::analytics::anomalies::{decode_attributions, decode_series};
    use crate::analytics::exec::Run;
    use crate::analytics::params::Params;
    let tenant = TenantId::default_tenant();
    let groups = token_traces(5);
    let all: Vec<SpanRecord> = groups.iter().map(|(_, s)| s.clone()).collect();
    let dir = tempfile::tempdir().unwrap();
    let store = store_of(dir.path(), &groups, &tenant);
    assert!(store.blocks(&tenant).len() >= 2);
    let f = fixture_of(dir, store.clone(), all);
    let s = 1_000_000_000;
    let dims: Vec<String> = [
        "llm.model_version",
        "worker.id",
        "llm.batch_size",
        "service.name",
        "llm.lora_adapter",
    ]
    .map(String::from)
    .to_vec();
    let params = |start: Option<u64>, end: Option<u64>| {
        let mut p = Params::default();
        (p.start, p.end) = (start, end);
        p
    };
    let check = |f: &Fixture| {
        block_on(async {
            let mut run = Run::plain(&f.engine, &f.tenant);
            // the series: per 10 s step, the same bins (whole-second ranges alone)
            for (range, answered) in [
                ((None, None), true),
                ((Some(BASE + 10 * s), Some(BASE + 50 * s)), true),
                ((Some(BASE + 10 * s + 1), None), false),
            ] {
                let (sql, fast) = decode_series(&mut run, &params(range.0, range.1), 10 * s)
                    .await
                    .unwrap();
                assert!(!sql.is_empty());
                if answered {
                    assert_eq!(fast, Some(sql), "{range:?}");
                } else {
                    assert!(fast.is_none_or(|f| f == sql), "{range:?}");
                }
            }
            // attribution: windows whole, cut, and one with nothing slow
            let windows = [
                (BASE + 20 * s, BASE + 30 * s),
                (BASE + 40 * s + s / 2, BASE + 45 * s),
            ];
            for range in [
                (None, None),
                (Some(BASE + 15 * s + s / 3), Some(BASE + 50 * s + 7)),
            ] {
                let (sql, fast) = decode_attributions(
                    &mut run,
                    &params(range.0, range.1),
                    &windows,
                    10.0,
                    3.0,
                    &dims,
                )
                .await
                .unwrap();
                // the slow worker is among the first window's causes, the second has none
                assert!(
                    sql[0]
                        .iter()
                        .any(|c| c.value.split(',').any(|v| v == "w-3")),
                    "{sql:?}"
                );
                assert!(sql[1].is_empty(), "{sql:?}");
                let fast = fast.expect("postings answer");
                assert_eq!(fast.len(), sql.len());
                for (a, b) in fast.iter().zip(&sql) {
                    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
                    for (x, y) in a.iter().zip(b) {
                        assert_eq!((&x.dimension, &x.value), (&y.dimension, &y.value));
                        assert!((x.lift - y.lift).abs() <= 1e-9 * y.lift, "{x:?} vs {y:?}");
                        assert!((x.share_of_excess - y.share_of_excess).abs() <= 1e-9);
                    }
                }
            }
        })
    };
    check(&f);
    // with every row in blocks
    store.flush(true).unwrap();
    check(&f);
}

/// [`token_traces`] whose generate spans are request spans (SERVER, with a model), each with
/// a time to first token (slow for worker `w-3` between seconds 20 and 30), an end-to-end
/// latency now and then, an error now and then, and a tenant attribute.
fn request_traces(seed: u64) -> Vec<(u8, SpanRecord)> {
    let groups = token_traces(seed);
    let mut rng = StdRng::seed_from_u64(seed + 2);
    // the decode attributes from a generator of their own (the others' draws unchanged)
    let mut decode = StdRng::seed_from_u64(seed + 3);
    groups
        .into_iter()
        .map(|(g, mut s)| {
            if s.name == "llm.generate" {
                let second = (s.start.0 - BASE) / 1_000_000_000;
                let worker = s.attribute("worker.id").cloned();
                let slow = (20..30).contains(&second) && worker == Some(Value::Str("w-3".into()));
                s.kind = SpanKind::Server;
                let ttft = if slow {
                    0.5
                } else {
                    rng.random_range(0.01..0.05)
                };
                s.attributes.extend([
                    KeyValue::new("gen_ai.request.model", Value::Str("m".into())),
                    KeyValue::new("gen_ai.latency.time_to_first_token", Value::Double(ttft)),
                    KeyValue::new(
                        "tenant.id",
                        Value::Str(format!("t{}", rng.random_range(0..3))),
                    ),
                ]);
                if rng.random_bool(0.5) {
                    s.attributes.push(KeyValue::new(
                        "gen_ai.latency.e2e",
                        Value::Double(ttft + rng.random_range(0.1..0.3)),
                    ));
                }
                if slow || rng.random_bool(0.1) {
                    s.status_code = StatusCode::Error;
                }
                // decode time and output tokens (none, or zero tokens, now and then)
                if decode.random_bool(0.8) {
                    s.attributes.extend([
                        KeyValue::new(
                            "gen_ai.latency.time_in_model_decode",
                            Value::Double(decode.random_range(0.0..2.0)),
                        ),
                        KeyValue::new(
                            "gen_ai.usage.output_tokens",
                            Value::Int(decode.random_range(0..300)),
                        ),
                    ]);
                }
            }
            (g, s)
        })
        .collect()
}

#[test]
fn request_anomaly_series_and_attribution_from_one_read_match_sql() {
    use crate::analytics::anomalies::{request_attributions, request_series};
    use crate::analytics::exec::Run;
    use crate::analytics::params::Params;
    let tenant = TenantId::default_tenant();
    let groups = request_traces(7);
    let all: Vec<SpanRecord> = groups.iter().map(|(_, s)| s.clone()).collect();
    let dir = tempfile::tempdir().unwrap();
    let store = store_of(dir.path(), &groups, &tenant);
    let f = fixture_of(dir, store, all);
    let s = 1_000_000_000;
    let dims: Vec<String> = ["llm.model_version", "worker.id", "service.name"]
        .map(String::from)
        .to_vec();
    block_on(async {
        let mut run = Run::plain(&f.engine, &f.tenant);
        let windows = [
            (BASE + 20 * s, BASE + 30 * s),
            (BASE + 45 * s, BASE + 50 * s),
        ];
        for range in [(None, None), (Some(BASE + 15 * s + 7), Some(BASE + 55 * s))] {
            let mut p = Params::default();
            (p.start, p.end) = range;
            for (signal, threshold, mid) in [
                ("ttft", 100.0, 30.0),
                ("e2e_latency", 300.0, 200.0),
                ("error_rate", 0.5, 0.0),
                ("throughput", 0.0, 0.0),
            ] {
                let (sql, frame) = request_series(&mut run, &p, signal, 10 * s).await.unwrap();
                assert!(!sql.is_empty(), "{signal}");
                assert_eq!(frame.len(), sql.len(), "{signal}");
                for (a, b) in frame.iter().zip(&sql) {
                    assert_eq!((a.0, &a.1), (b.0, &b.1), "{signal}");
                    assert!((a.2 - b.2).abs() <= 1e-9, "{signal}: {a:?} vs {b:?}");
                }
                let (sql, frame) =
                    request_attributions(&mut run, &p, signal, &windows, threshold, mid, &dims)
                        .await
                        .unwrap();
                if signal != "throughput" {
                    // the slow worker, and the tenant attribute read by default
                    assert!(
                        sql[0]
                            .iter()
                            .any(|c| c.value.split(',').any(|v| v == "w-3")),
                        "{signal}: {sql:?}"
                    );
                }
                assert!(
                    sql.iter()
                        .flatten()
                        .any(|c| c.dimension.contains("tenant.id")),
                    "{signal}: {sql:?}"
                );
                assert_eq!(frame.len(), sql.len());
                for (a, b) in frame.iter().zip(&sql) {
                    assert_eq!(a.len(), b.len(), "{signal}: {a:?} vs {b:?}");
                    for (x, y) in a.iter().zip(b) {
                        assert_eq!((&x.dimension, &x.value), (&y.dimension, &y.value));
                        assert!((x.lift - y.lift).abs() <= 1e-9 * y.lift, "{x:?} vs {y:?}");
                        assert!((x.share_of_excess - y.share_of_excess).abs() <= 1e-9);
                    }
                }
            }
        }
    });
}

#[test]
fn request_percentiles_from_request_tables_match_sql() {
    use crate::analytics::exec::Run;
    use crate::analytics::params::Params;
    use crate::analytics::percentiles::both_answers;
    let tenant = TenantId::default_tenant();
    let groups = request_traces(11);
    let all: Vec<SpanRecord> = groups.iter().map(|(_, s)| s.clone()).collect();
    let dir = tempfile::tempdir().unwrap();
    let store = store_of(dir.path(), &groups, &tenant);
    let f = fixture_of(dir, store, all);
    let s = 1_000_000_000;
    block_on(async {
        let mut run = Run::plain(&f.engine, &f.tenant);
        for range in [(None, None), (Some(BASE + 15 * s + 7), Some(BASE + 55 * s))] {
            for signal in ["ttft", "e2e", "tpot", "tokens_per_s"] {
                for exact in ["false", "true"] {
                    for by in ["llm.model_version,worker.id", ""] {
                        let pairs = [
                            ("signal", signal),
                            ("by", by),
                            ("step", "10s"),
                            ("q", "0.5,0.9,0.99"),
                            ("exact", exact),
                        ];
                        let pairs = pairs
                            .iter()
                            .filter(|(_, v)| !v.is_empty())
                            .map(|(k, v)| (k.to_string(), v.to_string()));
                        let mut p =
                            Params::parse(pairs, crate::analytics::percentiles::PARAMS).unwrap();
                        (p.start, p.end) = range;
                        let what = format!("{signal} exact={exact} by={by} {range:?}");
                        let (sql, tables) = both_answers(&mut run, p).await.unwrap();
                        let tables = tables.unwrap_or_else(|| panic!("{what}: tables declined"));
                        assert!(!sql.is_empty(), "{what}");
                        assert_eq!(tables.len(), sql.len(), "{what}");
                        for (a, b) in tables.iter().zip(&sql) {
                            assert_eq!(a.labels, b.labels, "{what}");
                            assert_eq!(a.points.len(), b.points.len(), "{what}: {a:?}");
                            for (x, y) in a.points.iter().zip(&b.points) {
                                assert_eq!(x.0, y.0, "{what}");
                                for (u, v) in x.1.iter().zip(&y.1) {
                                    assert!(
                                        (u - v).abs() <= 1e-9 * v.abs(),
                                        "{what}: {x:?} vs {y:?}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    });
}
