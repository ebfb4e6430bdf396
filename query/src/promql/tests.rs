//! PromQL over a real store: series written through the catalog, evaluated as Prometheus
//! would (the differential battery against a real Prometheus is in the tests crate).

use std::sync::Arc;

use weft_storage::model::{MetricKind, MetricPoint, PointValue, Series, TenantId, UnixNanos};
use weft_storage::{Store, StoreOptions};

use super::*;

const T0: i64 = 1_700_000_000_000;

fn store_with(series: &[(Series, Vec<(i64, PointValue)>)]) -> (tempfile::TempDir, Source) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), StoreOptions::default()).unwrap());
    let t = TenantId::new("t").unwrap();
    let defs: Vec<Series> = series.iter().map(|(s, _)| s.clone()).collect();
    let ids = store.register_series(&t, &defs).unwrap();
    let mut points = Vec::new();
    for ((_, samples), id) in series.iter().zip(ids) {
        for (ms, v) in samples {
            points.push(MetricPoint {
                series: id,
                time: UnixNanos(*ms as u64 * 1_000_000),
                value: v.clone(),
                ..Default::default()
            });
        }
    }
    store.append_points(&t, points).unwrap();
    (dir, Source::new(store, t).unwrap())
}

fn gauge(name: &str, labels: &[(&str, &str)], unit: &str, kind: MetricKind) -> Series {
    let mut labels = labels.to_vec();
    labels.sort();
    Series {
        name: name.into(),
        kind,
        unit: unit.into(),
        monotonic: kind == MetricKind::Sum,
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

fn every_15s(n: i64, f: impl Fn(i64) -> f64) -> Vec<(i64, PointValue)> {
    (0..n)
        .map(|i| (T0 + i * 15_000, PointValue::Number(f(i))))
        .collect()
}

fn vector(r: QueryResult) -> Vec<(Labels, f64)> {
    match r {
        QueryResult::Vector(v) => v.into_iter().map(|(l, _, v)| (l, v)).collect(),
        other => panic!("{other:?}"),
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    let mut l: Labels = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.sort();
    l
}

#[test]
fn selectors_rates_and_aggregations_answer_as_prometheus() {
    let (_d, src) = store_with(&[
        (
            gauge(
                "gpu.memory.used",
                &[("worker.id", "w-1"), ("gpu.id", "0")],
                "By",
                MetricKind::Gauge,
            ),
            every_15s(40, |i| 1000.0 + i as f64),
        ),
        (
            gauge(
                "gpu.memory.used",
                &[("worker.id", "w-2"), ("gpu.id", "0")],
                "By",
                MetricKind::Gauge,
            ),
            every_15s(40, |i| 2000.0 + i as f64),
        ),
        (
            gauge(
                "vllm.requests",
                &[("worker.id", "w-1")],
                "{request}",
                MetricKind::Sum,
            ),
            // a counter reset at sample 20
            every_15s(40, |i| {
                if i < 20 {
                    10.0 * i as f64
                } else {
                    5.0 * (i - 20) as f64
                }
            }),
        ),
    ]);
    let at = T0 + 39 * 15_000;
    let v = vector(instant_query(&src, "gpu_memory_used_bytes", at).unwrap());
    assert_eq!(v.len(), 2);
    assert_eq!(
        v[0].0,
        labels(&[
            ("__name__", "gpu_memory_used_bytes"),
            ("gpu_id", "0"),
            ("worker_id", "w-1")
        ])
    );
    assert_eq!(v[0].1, 1039.0);
    // the OTLP names address the same series
    let q = vector(instant_query(&src, r#"{"gpu.memory.used", "worker.id"="w-2"}"#, at).unwrap());
    assert_eq!(
        q,
        vec![(
            labels(&[
                ("__name__", "gpu_memory_used_bytes"),
                ("gpu_id", "0"),
                ("worker_id", "w-2")
            ]),
            2039.0
        )]
    );
    let s = vector(instant_query(&src, "sum by (gpu_id) (gpu_memory_used_bytes)", at).unwrap());
    assert_eq!(s, vec![(labels(&[("gpu_id", "0")]), 3078.0)]);
    // 5 minutes after the last sample, a selector finds nothing
    let late = vector(instant_query(&src, "gpu_memory_used_bytes", at + 5 * 60_000 + 1).unwrap());
    assert!(late.is_empty());
    // increase over a reset: 10/sample before, 5/sample after
    let r = vector(instant_query(&src, "increase(vllm_requests_total[5m])", at).unwrap());
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].0, labels(&[("worker_id", "w-1")]));
    // 21 samples in [at-5m, at] (both ends included): 190, then a reset to 0, then 19 steps
    // of 5: 95, and the samples span the whole range (no extrapolation)
    let expected = 95.0;
    assert!((r[0].1 - expected).abs() < 1e-9, "{} vs {expected}", r[0].1);
    let m = range_query(
        &src,
        "rate(vllm_requests_total[1m])",
        T0 + 60_000,
        at,
        60_000,
    )
    .unwrap();
    let QueryResult::Matrix(m) = m else { panic!() };
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].ts.len(), 9);
    assert!((m[0].vs[0] - 10.0 / 15.0).abs() < 1e-9, "{:?}", m[0].vs);
    // binary matching with group_left
    let j = vector(
        instant_query(
            &src,
            "gpu_memory_used_bytes * on (worker_id) group_left vllm_requests_total",
            at,
        )
        .unwrap(),
    );
    assert_eq!(j.len(), 1);
    assert_eq!(j[0].1, 1039.0 * 95.0);
    let e = instant_query(&src, "sum(", at).unwrap_err();
    assert_eq!(e.kind, ErrorKind::BadData);
}

#[test]
fn histograms_show_as_buckets_and_quantiles_interpolate() {
    let hist = |count: u64, counts: Vec<u64>| PointValue::Histogram {
        count,
        sum: Some(count as f64 * 0.3),
        min: None,
        max: None,
        bounds: vec![0.1, 0.5, 1.0],
        counts,
    };
    let (_d, src) = store_with(&[(
        Series {
            name: "gen_ai.server.time_to_first_token".into(),
            kind: MetricKind::Histogram,
            unit: "s".into(),
            labels: vec![("model".into(), "llama".into())],
            ..Default::default()
        },
        vec![(T0, hist(10, vec![2, 6, 2, 0]))],
    )]);
    let b = vector(
        instant_query(&src, "gen_ai_server_time_to_first_token_seconds_bucket", T0).unwrap(),
    );
    let les: Vec<(&str, f64)> = b
        .iter()
        .map(|(l, v)| (source::get(l, "le").unwrap(), *v))
        .collect();
    assert_eq!(
        les,
        vec![("+Inf", 10.0), ("0.1", 2.0), ("0.5", 8.0), ("1", 10.0)]
    );
    let q = vector(
        instant_query(
            &src,
            "histogram_quantile(0.5, gen_ai_server_time_to_first_token_seconds_bucket)",
            T0,
        )
        .unwrap(),
    );
    // rank 5 falls in (0.1, 0.5] holding ranks 2..8
    assert_eq!(q[0].0, labels(&[("model", "llama")]));
    assert!((q[0].1 - (0.1 + 0.4 * 3.0 / 6.0)).abs() < 1e-12);
    let c =
        vector(instant_query(&src, "gen_ai_server_time_to_first_token_seconds_count", T0).unwrap());
    assert_eq!(c[0].1, 10.0);
}

#[test]
fn exporters_answer_to_one_canonical_vocabulary() {
    let dcgm = |gpu: &str| {
        let mut labels = vec![
            ("Hostname".to_string(), "node-1".to_string()),
            ("gpu".to_string(), gpu.to_string()),
            ("worker.id".to_string(), "w-1".to_string()),
        ];
        labels.sort();
        Series {
            name: "DCGM_FI_DEV_GPU_UTIL".into(),
            labels,
            ..Default::default()
        }
    };
    let otel = Series {
        name: "hw.gpu.utilization".into(),
        unit: "1".into(),
        labels: vec![
            ("gpu.id".into(), "0".into()),
            ("host.name".into(), "node-2".into()),
        ],
        ..Default::default()
    };
    let (_d, src) = store_with(&[
        (dcgm("0"), every_15s(4, |_| 97.0)),
        (dcgm("1"), every_15s(4, |_| 50.0)),
        (otel, every_15s(4, |_| 0.25)),
    ]);
    let at = T0 + 3 * 15_000;
    let v = vector(instant_query(&src, "gpu_utilization_ratio", at).unwrap());
    assert_eq!(
        v,
        vec![
            (
                labels(&[
                    ("__name__", "gpu_utilization_ratio"),
                    ("gpu_id", "0"),
                    ("host_name", "node-1"),
                    ("worker_id", "w-1")
                ]),
                0.97
            ),
            (
                labels(&[
                    ("__name__", "gpu_utilization_ratio"),
                    ("gpu_id", "0"),
                    ("host_name", "node-2")
                ]),
                0.25
            ),
            (
                labels(&[
                    ("__name__", "gpu_utilization_ratio"),
                    ("gpu_id", "1"),
                    ("host_name", "node-1"),
                    ("worker_id", "w-1")
                ]),
                0.5
            ),
        ]
    );
    // canonical labels select; the source names and labels still answer as sent
    let hot = vector(
        instant_query(
            &src,
            r#"max by (host_name) (gpu_utilization_ratio{gpu_id="0"})"#,
            at,
        )
        .unwrap(),
    );
    assert_eq!(hot.len(), 2);
    let raw = vector(instant_query(&src, r#"DCGM_FI_DEV_GPU_UTIL{gpu="1"}"#, at).unwrap());
    assert_eq!(raw.len(), 1);
    assert_eq!(raw[0].1, 50.0);
}

#[test]
fn a_counter_restart_is_seen_by_its_start_time_even_when_the_value_did_not_fall() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), StoreOptions::default()).unwrap());
    let t = TenantId::new("t").unwrap();
    let series = Series {
        name: "vllm.requests".into(),
        kind: MetricKind::Sum,
        monotonic: true,
        temporality: weft_storage::model::Temporality::Cumulative,
        ..Default::default()
    };
    let id = store.register_series(&t, &[series]).unwrap()[0];
    let ms = |m: i64| UnixNanos(m as u64 * 1_000_000);
    // 100, 200, 300 counted since T0; the process restarts at T0+50 s and counts 350, 400
    let points = [
        (15, 0, 100.0),
        (30, 0, 200.0),
        (45, 0, 300.0),
        (60, 50, 350.0),
        (75, 50, 400.0),
    ]
    .into_iter()
    .map(|(s, start, v)| MetricPoint {
        series: id,
        time: ms(T0 + s * 1000),
        start_time: ms(T0 + start * 1000),
        value: PointValue::Number(v),
        ..Default::default()
    })
    .collect();
    store.append_points(&t, points).unwrap();
    let src = Source::new(store, t).unwrap();
    let at = T0 + 75_000;
    let resets = vector(instant_query(&src, "resets(vllm_requests_total[2m])", at).unwrap());
    assert_eq!(resets[0].1, 1.0);
    // (300 - 100) before the restart, 400 after it
    let QueryResult::Matrix(m) = instant_query(&src, "vllm_requests_total[2m]", at).unwrap() else {
        panic!()
    };
    assert_eq!(m[0].vs, vec![100.0, 200.0, 300.0, 0.0, 350.0, 400.0]);
    assert_eq!(m[0].ts[3], T0 + 50_000);
}

#[test]
fn delta_sums_show_cumulative_so_rates_work() {
    let (_d, src) = store_with(&[(
        Series {
            name: "tokens".into(),
            kind: MetricKind::Sum,
            monotonic: true,
            temporality: weft_storage::model::Temporality::Delta,
            ..Default::default()
        },
        every_15s(9, |_| 30.0),
    )]);
    let at = T0 + 8 * 15_000;
    let v = vector(instant_query(&src, "tokens_total", at).unwrap());
    assert_eq!(v[0].1, 270.0);
    // 30 per 15 s over the two minutes the samples span
    let r = vector(instant_query(&src, "rate(tokens_total[2m])", at).unwrap());
    assert!((r[0].1 - 2.0).abs() < 1e-9, "{r:?}");
}

/// A range query's answer at each step is the instant query's at that time, while binary
/// operators reuse their pairs and aggregations their groups across steps: kept pairs that change with the values, a series
/// that disappears part-way, and a repeated answer label set that only some steps keep (the
/// range query must then fail at the step that keeps two, as Prometheus does).
#[test]
fn range_steps_answer_as_instant_queries_while_pairs_are_reused() {
    let g = |name: &str, labels: &[(&str, &str)]| gauge(name, labels, "", MetricKind::Gauge);
    let (_dir, src) = store_with(&[
        (
            g("a", &[("k", "1"), ("j", "x")]),
            every_15s(120, |i| i as f64),
        ),
        (
            g("a", &[("k", "2"), ("j", "x")]),
            every_15s(120, |i| 100.0 - i as f64),
        ),
        (g("b", &[("j", "x")]), every_15s(120, |_| 50.0)),
        (
            g("c", &[("j", "x"), ("w", "1")]),
            every_15s(40, |i| (i % 7) as f64),
        ),
        (
            g("d", &[("j", "x"), ("w", "1")]),
            every_15s(120, |i| (i * 2 % 11) as f64),
        ),
    ]);
    let (start, end) = (T0, T0 + 119 * 15_000);
    for q in [
        "a > ignoring (k) b",
        "d - c",
        "d > bool c",
        "d > c",
        "sum by (j) (a) / on (j) group_left b",
        "a / ignoring (k) group_left b",
        "sum by (j) (a)",
        "topk(1, a)",
        "max by (w) (d - c)",
        "count without (k) (a > 40)",
        "sum by (k) (a > 40)",
        "quantile(0.5, a) + sum(b)",
    ] {
        for step in [15_000, 60_000, 37_000] {
            let QueryResult::Matrix(m) = range_query(&src, q, start, end, step).unwrap() else {
                panic!("{q}: not a matrix");
            };
            let mut t = start;
            while t <= end {
                let mut got: Vec<(Labels, f64)> = m
                    .iter()
                    .filter_map(|l| {
                        let i = l.ts.iter().position(|x| *x == t)?;
                        Some(((*l.labels).clone(), l.vs[i]))
                    })
                    .collect();
                got.sort_by(|a, b| a.0.cmp(&b.0));
                let mut want = vector(instant_query(&src, q, t).unwrap());
                want.sort_by(|a, b| a.0.cmp(&b.0));
                assert_eq!(got, want, "{q} at step {t} (step {step})");
                t += step;
            }
        }
    }
    // a[k=1] and a[k=2] both exceed 40 for i in 41..=59 only: both answers are {__name__="a",
    // j="x"} there
    let err = range_query(&src, "a > ignoring (k) (b - 10)", start, end, 15_000).unwrap_err();
    assert!(format!("{err:?}").contains("multiple matches"), "{err:?}");
    let fine = range_query(
        &src,
        "a > ignoring (k) (b - 10)",
        start,
        T0 + 40 * 15_000,
        15_000,
    );
    assert!(fine.is_ok(), "{fine:?}");
}
