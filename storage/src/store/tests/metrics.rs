//! Metric series and points on the shared engine: stable series ids, the same head, flush,
//! merge and retention as spans and logs.

use arrow::array::{AsArray, Float64Array};
use arrow::datatypes::Int64Type;

use super::*;
use crate::block::metrics::col;

const T0: u64 = 1_700_000_000_000_000_000;
const STEP: u64 = 10_000_000_000;

fn gauge(name: &str, gpu: &str, worker: &str) -> Series {
    Series {
        name: name.into(),
        kind: MetricKind::Gauge,
        unit: "%".into(),
        labels: vec![
            ("gpu.id".into(), gpu.into()),
            ("worker.id".into(), worker.into()),
        ],
        ..Default::default()
    }
}

fn histogram() -> Series {
    Series {
        name: "gen_ai.server.time_to_first_token".into(),
        kind: MetricKind::Histogram,
        unit: "s".into(),
        temporality: Temporality::Cumulative,
        labels: vec![("gen_ai.request.model".into(), "llama".into())],
        ..Default::default()
    }
}

/// Every point of the given series, `n` samples each, 10 s apart.
fn points(ids: &[SeriesId], n: u64) -> Vec<MetricPoint> {
    let mut out = Vec::new();
    for &id in ids {
        for i in 0..n {
            out.push(MetricPoint {
                series: id,
                time: UnixNanos(T0 + i * STEP),
                start_time: UnixNanos(T0),
                value: match id {
                    0 => PointValue::Histogram {
                        count: i,
                        sum: Some(i as f64 * 0.5),
                        min: None,
                        max: None,
                        bounds: vec![0.1, 1.0],
                        counts: vec![i / 2, i - i / 2, 0],
                    },
                    _ => PointValue::Number(f64::from(id) * 1000.0 + i as f64),
                },
                ..Default::default()
            });
        }
    }
    out
}

#[test]
fn series_get_stable_ids_and_points_survive_flush_restart_and_retry() {
    let dir = tempfile::tempdir().unwrap();
    let t = tenant("acme");
    let series = vec![
        histogram(),
        gauge("gpu.utilization", "0", "w-1"),
        gauge("gpu.utilization", "1", "w-1"),
        gauge("gpu.memory.used", "0", "w-1"),
    ];
    let written = points(&[0, 1, 2, 3], 50);
    {
        let store = Store::open(dir.path(), small_opts()).unwrap();
        let ids = store.register_series(&t, &series).unwrap();
        assert_eq!(ids, vec![0, 1, 2, 3]);
        // the same series again (and twice in one call) get the same ids
        let again = store
            .register_series(
                &t,
                &[series[2].clone(), series[2].clone(), series[0].clone()],
            )
            .unwrap();
        assert_eq!(again, vec![2, 2, 0]);
        let out = store.append_points(&t, written[..120].to_vec()).unwrap();
        assert_eq!(out.stored, 120);
        store.flush(true).unwrap();
        let out = store.append_points(&t, written.clone()).unwrap();
        assert_eq!((out.stored, out.duplicates), (80, 120));
        // a tenant's series are its own
        assert_eq!(
            store
                .register_series(&tenant("other"), &series[1..2])
                .unwrap(),
            vec![0]
        );
    }
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let catalog = store.series_catalog(&t).unwrap();
    {
        let c = catalog.read().unwrap();
        assert_eq!(c.len(), 4);
        assert_eq!(
            c.named("gpu.utilization").iter().collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(
            c.with_label("gpu.id", "0").iter().collect::<Vec<_>>(),
            vec![1, 3]
        );
        assert_eq!(c.get(0).unwrap().as_ref(), &series[0]);
    }
    // a new series after the restart takes the next id
    let id = store
        .register_series(&t, &[gauge("gpu.utilization", "2", "w-2")])
        .unwrap();
    assert_eq!(id, vec![4]);
    // replayed head points and block points read back whole
    let snapshot = store.metric_snapshot(&t).unwrap();
    let all = store
        .metric_points(&t, &snapshot, None, None, None)
        .unwrap();
    let mut expected = written.clone();
    expected.sort_by_key(|p| (p.series, p.time));
    assert_eq!(all, expected);
    store.flush(true).unwrap();
    let snapshot = store.metric_snapshot(&t).unwrap();
    assert_eq!(
        store
            .metric_points(&t, &snapshot, None, None, None)
            .unwrap(),
        expected
    );
    // a scan of some series in a time range reads those rows only
    let scan = MetricScan {
        from: Some(T0 + 10 * STEP),
        to: Some(T0 + 19 * STEP),
        series: Some([2u32, 3].into_iter().collect()),
        columns: vec![col::VALUE],
    };
    let batches = store.scan_metrics(&t, &snapshot, &scan).unwrap();
    let mut got = Vec::new();
    for b in &batches {
        assert_eq!(
            b.schema()
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>(),
            vec!["series", "time", "value"]
        );
        let s = b.column(0).as_primitive::<Int64Type>();
        let v = b.column(2).as_any().downcast_ref::<Float64Array>().unwrap();
        got.extend((0..b.num_rows()).map(|i| (s.value(i), v.value(i))));
    }
    got.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let want: Vec<(i64, f64)> = [2i64, 3]
        .iter()
        .flat_map(|&s| (10..20).map(move |i| (s, s as f64 * 1000.0 + i as f64)))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn metric_blocks_merge_and_expire_like_every_signal() {
    use crate::clock::ManualClock;
    use crate::retention::{Retention, RetentionRule};
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(UnixNanos(T0)));
    let t = tenant("acme");
    let store = Store::open(
        dir.path(),
        StoreOptions {
            merge_idle: Duration::ZERO,
            clock: clock.clone(),
            retention: Retention {
                default: RetentionRule {
                    all: Some(Duration::from_secs(3600)),
                    ..Default::default()
                },
                ..Default::default()
            },
            ..small_opts()
        },
    )
    .unwrap();
    let ids = store
        .register_series(&t, &[gauge("a", "0", "w"), gauge("b", "0", "w")])
        .unwrap();
    let written = points(&ids, 30);
    for chunk in written.chunks(10) {
        store.append_points(&t, chunk.to_vec()).unwrap();
        store.flush(true).unwrap();
    }
    let before = store.metric_snapshot(&t).unwrap().blocks.len();
    assert!(before >= 6, "{before} blocks");
    while store.merge_small_blocks().unwrap() {}
    let snapshot = store.metric_snapshot(&t).unwrap();
    assert!(snapshot.blocks.len() < before);
    let mut expected = written.clone();
    expected.sort_by_key(|p| (p.series, p.time));
    assert_eq!(
        store
            .metric_points(&t, &snapshot, None, None, None)
            .unwrap(),
        expected
    );
    // two hours later every point is out of retention
    clock.set(UnixNanos(T0 + 2 * 3600 * 1_000_000_000 + 30 * STEP));
    store.enforce_retention().unwrap();
    let snapshot = store.metric_snapshot(&t).unwrap();
    assert!(snapshot.blocks.is_empty());
    assert!(
        store
            .metric_points(&t, &snapshot, None, None, None)
            .unwrap()
            .is_empty()
    );
}

/// A series goes once retention has taken its last point (from the catalog, its name and
/// label values, and the meta column family), and one with points left stays, under its id;
/// after a restart too. A series a writer used since the cutoff stays, and a deleted series
/// that comes back gets a new id.
#[test]
fn series_go_with_their_last_points() {
    use crate::clock::ManualClock;
    use crate::retention::{Retention, RetentionRule};
    const H: u64 = 3600 * 1_000_000_000;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(UnixNanos(T0)));
    let t = tenant("acme");
    let opts = StoreOptions {
        clock: clock.clone(),
        retention: Retention {
            default: RetentionRule {
                all: Some(Duration::from_secs(2 * 3600)),
                ..Default::default()
            },
            ..Default::default()
        },
        ..small_opts()
    };
    let store = Store::open(dir.path(), opts.clone()).unwrap();
    let (old, kept) = (
        gauge("gpu_util", "0", "w-old"),
        gauge("gpu_util", "1", "w-1"),
    );
    let ids = store
        .register_series(&t, &[old.clone(), kept.clone()])
        .unwrap();
    let point = |series: SeriesId, time: u64| MetricPoint {
        series,
        time: UnixNanos(time),
        value: PointValue::Number(1.0),
        ..Default::default()
    };
    store
        .append_points(&t, vec![point(ids[0], T0), point(ids[1], T0)])
        .unwrap();
    store.flush(true).unwrap();
    // the kept series has a point three hours later, the old one none
    clock.set(UnixNanos(T0 + 3 * H));
    assert_eq!(
        store
            .register_series(&t, std::slice::from_ref(&kept))
            .unwrap(),
        vec![ids[1]]
    );
    store
        .append_points(&t, vec![point(ids[1], T0 + 3 * H)])
        .unwrap();
    store.flush(true).unwrap();
    clock.set(UnixNanos(T0 + 3 * H + H / 2));
    store.enforce_retention().unwrap();
    store.enforce_retention().unwrap();
    let catalog = |store: &Store| {
        let c = store.series_catalog(&t).unwrap();
        let c = c.read().unwrap();
        (
            c.get(ids[0]).is_some(),
            c.get(ids[1]).is_some(),
            c.with_label("worker.id", "w-old").len(),
            c.labels()["worker.id"].len(),
            c.named("gpu_util").len(),
            c.live(),
        )
    };
    assert_eq!(catalog(&store), (false, true, 0, 1, 1, 1));
    assert_eq!(store.stats.series_deleted.load(Ordering::Relaxed), 1);
    drop(store);
    let store = Store::open(dir.path(), opts).unwrap();
    assert_eq!(catalog(&store), (false, true, 0, 1, 1, 1));
    // it comes back: a new id, and its points read back
    let back = store.register_series(&t, &[old]).unwrap()[0];
    assert!(back > ids[1]);
    store
        .append_points(&t, vec![point(back, T0 + 3 * H + H / 2)])
        .unwrap();
    let snapshot = store.metric_snapshot(&t).unwrap();
    let got = store
        .metric_points(&t, &snapshot, None, None, None)
        .unwrap();
    assert_eq!(
        got.iter().map(|p| p.series).collect::<Vec<_>>(),
        vec![ids[1], back]
    );
}

/// `metric_values` (decoded blocks, found by series run and binary search) against a naive
/// filter of whole points: series that span several blocks, points sent out of order across
/// flushes, head points, histogram points (no value), inclusive range ends, cached reads.
#[test]
fn metric_values_agree_with_whole_points() {
    let dir = tempfile::tempdir().unwrap();
    let t = tenant("acme");
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let series = vec![
        histogram(),
        gauge("gpu.utilization", "0", "w-1"),
        gauge("gpu.utilization", "1", "w-1"),
        gauge("gpu.memory.used", "0", "w-1"),
        gauge("gpu.memory.used", "1", "w-2"),
    ];
    store.register_series(&t, &series).unwrap();
    let written = points(&[0, 1, 2, 3, 4], 300);
    // odd samples first, then even ones: every series' times interleave across blocks
    let (odd, even): (Vec<_>, Vec<_>) = written
        .iter()
        .cloned()
        .partition(|p| (p.time.0 - T0) / STEP % 2 == 1);
    store.append_points(&t, odd).unwrap();
    store.flush(true).unwrap();
    let (blocks, head): (Vec<_>, Vec<_>) =
        even.into_iter().partition(|p| p.time.0 < T0 + 250 * STEP);
    store.append_points(&t, blocks).unwrap();
    store.flush(true).unwrap();
    store.append_points(&t, head).unwrap();
    let snapshot = store.metric_snapshot(&t).unwrap();
    assert!(
        snapshot.blocks.len() >= 4,
        "{} blocks",
        snapshot.blocks.len()
    );
    let naive = |from: Option<u64>, to: Option<u64>, ids: &RoaringBitmap| {
        let mut out: Vec<(SeriesId, u64, u64, f64)> = written
            .iter()
            .filter(|p| ids.contains(p.series))
            .filter(|p| from.is_none_or(|f| p.time.0 >= f) && to.is_none_or(|e| p.time.0 <= e))
            .filter_map(|p| match p.value {
                PointValue::Number(v) => Some((p.series, p.time.0, p.start_time.0, v)),
                _ => None,
            })
            .collect();
        out.sort_by_key(|p| (p.0, p.1));
        out
    };
    let ranges = [
        (None, None),
        (Some(T0 + 7 * STEP), Some(T0 + 7 * STEP)),
        (Some(T0 + 13 * STEP + 1), Some(T0 + 260 * STEP)),
        (Some(T0 + 240 * STEP), None),
        (None, Some(T0 + 3 * STEP)),
        (Some(T0 + 400 * STEP), None),
    ];
    let sets: [&[u32]; 4] = [&[0, 1, 2, 3, 4], &[2], &[0, 3, 9], &[4, 1]];
    for _ in 0..2 {
        for (from, to) in ranges {
            for ids in sets {
                let ids: RoaringBitmap = ids.iter().copied().collect();
                let got = store.metric_values(&t, &snapshot, from, to, &ids).unwrap();
                assert_eq!(got, naive(from, to, &ids), "{from:?}..{to:?} of {ids:?}");
            }
        }
    }
}
