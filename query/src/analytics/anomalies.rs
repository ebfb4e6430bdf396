//! Anomaly scans with attribution: `GET /api/v1/anomalies?signal=…&step=1m&sensitivity=&dims=`
//! and `anomalies(…)`.
//!
//! Each signal becomes a series of one statistic per step: the p95 of a latency signal (from
//! sketch bins, [`super::sketch`]), the share of request spans in error, requests per second,
//! or a metric's value (through PromQL, per series). A step is anomalous when it stands more
//! than `sensitivity` (default 5) robust deviations from the series' median (1.4826 × MAD,
//! floored at 5% of the median and, for rates, at the binomial noise); consecutive anomalous
//! steps make one window.
//!
//! Attribution compares, per window, the units (spans or requests) that are anomalous (over
//! the baseline statistic; in error; or simply present, for throughput) with every unit
//! outside the windows: for each value of each dimension and each pair of dimensions, its
//! `lift` (its share among the anomalous over its share in the baseline) and its
//! `share_of_excess` (of the latency above the baseline median, of the errors, of the
//! requests). Candidates with at least 10% of the anomalous units are ranked by
//! `share_of_excess × ln(lift)`. Dimensions: the indexed LLM dimensions (every span of a
//! request carries its request's values), the service, and for request-level signals every
//! string attribute of the request spans with 2 to 1,000 values in the range; `dims=` narrows.
//!
//! Incidents of different signals whose windows overlap and that point at the same entity
//! (the same label or top attribution value, e.g. one worker) are one incident: the strongest
//! signal leads, the others are its `co_signals`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::{Value, json};
use weft_storage::Store;

use super::exec::{Run, steps};
use super::frame::Frame;
use super::params::{Groups, Params, Result, dim_expr, groups, ident, inherited, invalid, ts};
use super::percentiles::json_number;
use super::signals::{REQUEST_SPANS, SpanSignal, span_signal};
use super::sketch::{Sketch, bin_sql};

pub const PARAMS: &[&str] = &["signal", "step", "sensitivity", "dims"];

/// The signals scanned when none is named.
pub const DEFAULT_SIGNALS: &[&str] = &[
    "decode_latency",
    "ttft",
    "e2e_latency",
    "error_rate",
    "throughput",
    "gpu_memory",
    "gpu_util",
    "kv_cache",
];

/// The dimensions attribution looks at by default, besides request attributes.
pub const DEFAULT_DIMS: &[&str] = &[
    "llm.model_version",
    "llm.lora_adapter",
    "llm.kv_cache_strategy",
    "llm.batch_size",
    "worker.id",
    "gpu.id",
    "service.name",
];

const DEFAULT_SENSITIVITY: f64 = 5.0;
/// Least share of the anomalous units a candidate cause must hold.
const MIN_SUPPORT: f64 = 0.1;
const MAX_ATTRIBUTION: usize = 10;

#[derive(Clone, Debug, PartialEq)]
pub struct Cause {
    pub dimension: String,
    pub value: String,
    pub lift: f64,
    pub share_of_excess: f64,
    score: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CoSignal {
    pub signal: String,
    pub labels: BTreeMap<String, String>,
    pub peak: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Incident {
    pub start_ns: u64,
    pub end_ns: u64,
    pub signal: String,
    pub labels: BTreeMap<String, String>,
    pub score: f64,
    pub peak: f64,
    pub baseline: f64,
    pub attribution: Vec<Cause>,
    pub co_signals: Vec<CoSignal>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Anomalies {
    pub incidents: Vec<Incident>,
    pub partial: bool,
}

/// One step of a series: its start, statistic and unit count.
#[derive(Clone, Copy, Debug)]
struct Point {
    t: u64,
    v: f64,
    n: f64,
}

/// A window of anomalous steps: [start, end), its peak score and value.
#[derive(Clone, Debug)]
struct Window {
    start: u64,
    end: u64,
    score: f64,
    peak: f64,
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

enum Kind {
    Latency,
    Rate,
    Count,
    Level,
}

/// The anomalous windows of a series, and its baseline (median). `spread` is, for a latency
/// series, the width of the 93rd to 97th percentile of all its values: a step's p95 from `n`
/// values is only known to about `sqrt(0.95 · 0.05 / n) / 0.04` of it, and a step must stand
/// out by more than that noise too.
fn detect(
    points: &[Point],
    step: u64,
    sensitivity: f64,
    kind: &Kind,
    spread: f64,
) -> (Vec<Window>, f64) {
    let min_n = match kind {
        Kind::Latency => 20.0,
        Kind::Rate => 20.0,
        Kind::Count | Kind::Level => 0.0,
    };
    // throughput's first and last steps are cut by the range: left out
    let usable: Vec<&Point> = points
        .iter()
        .enumerate()
        .filter(|(i, p)| {
            p.n >= min_n && !(matches!(kind, Kind::Count) && (*i == 0 || *i + 1 == points.len()))
        })
        .map(|(_, p)| p)
        .collect();
    if usable.len() < 6 {
        return (Vec::new(), 0.0);
    }
    let mut vals: Vec<f64> = usable.iter().map(|p| p.v).collect();
    let m = median(&mut vals);
    let mut dev: Vec<f64> = usable.iter().map(|p| (p.v - m).abs()).collect();
    let mad = median(&mut dev) * 1.4826;
    let scored: Vec<(u64, f64, f64)> = usable
        .iter()
        .map(|p| {
            let mut scale = mad.max(0.05 * m.abs()).max(1e-9);
            if matches!(kind, Kind::Rate) {
                scale = scale.max((m.max(1.0 / p.n) * (1.0 - m).max(0.0) / p.n).sqrt());
            }
            if matches!(kind, Kind::Latency) {
                scale = scale.max((0.95 * 0.05 / p.n).sqrt() / 0.04 * spread);
            }
            if matches!(kind, Kind::Level) {
                scale = scale.max(0.02 * m.abs().max(1.0));
            }
            let z = (p.v - m) / scale;
            (
                p.t,
                if matches!(kind, Kind::Count) {
                    z.abs()
                } else {
                    z
                },
                p.v,
            )
        })
        .collect();
    // a window opens at a step over the sensitivity and holds while steps stay over half of
    // it (a step of noise inside an anomaly does not split it in two)
    let mut windows: Vec<Window> = Vec::new();
    for (i, (_, z, v)) in scored.iter().enumerate() {
        if *z <= sensitivity {
            continue;
        }
        let (mut lo, mut hi) = (i, i);
        while lo > 0 && scored[lo - 1].1 > sensitivity / 2.0 {
            lo -= 1;
        }
        while hi + 1 < scored.len() && scored[hi + 1].1 > sensitivity / 2.0 {
            hi += 1;
        }
        let (start, end) = (scored[lo].0, scored[hi].0 + step);
        match windows.last_mut() {
            // overlapping, adjacent, or one quiet step apart: one window
            Some(w) if start <= w.end + step => {
                w.end = w.end.max(end);
                if *z > w.score {
                    w.score = *z;
                    w.peak = *v;
                }
            }
            _ => windows.push(Window {
                start,
                end,
                score: *z,
                peak: *v,
            }),
        }
    }
    (windows, m)
}

pub async fn anomalies(run: &mut Run<'_>, mut p: Params, store: Arc<Store>) -> Result<Anomalies> {
    let signals: Vec<String> = match p.get("signal") {
        Some(s) => s.split(',').map(|s| s.trim().to_owned()).collect(),
        None => DEFAULT_SIGNALS.iter().map(|s| (*s).to_owned()).collect(),
    };
    let sensitivity = p.number("sensitivity")?.unwrap_or(DEFAULT_SENSITIVITY);
    if sensitivity <= 0.0 {
        return Err(invalid("sensitivity: must be above 0"));
    }
    run.fit_rows(&mut p).await?;
    // the range: as given, else the spans' own
    if p.start.is_none() || p.end.is_none() {
        let r = run
            .sql(&format!(
                "SELECT CAST(min(start_time) AS BIGINT), CAST(max(start_time) AS BIGINT) FROM spans {}",
                p.where_clause(&[])?
            ))
            .await?;
        let (lo, hi) = (r.i64(0)[0], r.i64(1)[0]);
        let (Some(lo), Some(hi)) = (lo, hi) else {
            return Ok(Anomalies {
                incidents: Vec::new(),
                partial: run.partial,
            });
        };
        p.start.get_or_insert(lo as u64);
        p.end.get_or_insert(hi as u64 + 1);
    }
    let (start, end) = (p.start.unwrap_or(0), p.end.unwrap_or(0));
    let step = match p.duration("step")? {
        Some(s) => s,
        // a fortieth of the range in whole seconds (what the blocks' per-second cells answer)
        None => std::time::Duration::from_secs(((end - start) / 40 / 1_000_000_000).max(1)),
    };
    let step_ns = steps(start, end, step, "step")?;
    let dims = p.list_or("dims", DEFAULT_DIMS);
    // the request signals' spans are read once, for all of them
    let mut frames = Frames {
        signals: signals
            .iter()
            .filter_map(|s| spec_of(s).ok())
            .filter(|(spec, _)| spec.per_request)
            .map(|(spec, _)| spec)
            .collect(),
        state: None,
    };
    // decode latency reads the blocks (off the runtime's threads) while the request spans
    // are read through SQL: the two biggest parts of a scan of every signal, side by side
    let mut decoded = None;
    if !frames.signals.is_empty()
        && let Some(decode) = signals
            .iter()
            .find(|s| matches!(s.as_str(), "itl" | "decode_latency"))
    {
        let mut fork = run.fork();
        let mut none = Frames {
            signals: Vec::new(),
            state: None,
        };
        let (read, found) = tokio::join!(
            frames.get(&mut fork, &p, &dims),
            span_incidents(run, &p, decode, step_ns, sensitivity, &dims, &mut none)
        );
        read?;
        run.join(fork);
        decoded = Some((decode.clone(), found?));
    }
    let mut incidents = Vec::new();
    for signal in &signals {
        if run.left().is_zero() {
            run.partial = true;
            break;
        }
        if let Some((_, found)) = decoded.take_if(|(s, _)| s == signal) {
            incidents.extend(found);
            continue;
        }
        let found = match signal.as_str() {
            "gpu_memory" | "gpu_util" | "kv_cache" => {
                metric_incidents(run, &p, &store, signal, step_ns, sensitivity)?
            }
            s if s.starts_with("metric:") => {
                metric_incidents(run, &p, &store, signal, step_ns, sensitivity)?
            }
            _ => {
                let frames = &mut frames;
                span_incidents(run, &p, signal, step_ns, sensitivity, &dims, frames).await?
            }
        };
        incidents.extend(found);
    }
    Ok(Anomalies {
        incidents: merge(incidents),
        partial: run.partial,
    })
}

/// The request spans of a scan's request signals, read when the first one is scanned, with
/// the dimensions they are attributed to (the asked ones, and by default the request spans'
/// low-cardinality attributes).
struct Frames {
    signals: Vec<SpanSignal>,
    /// `Some(None)`: the time budget ran out reading them.
    state: Option<Option<(Frame, Vec<String>)>>,
}

impl Frames {
    async fn get(
        &mut self,
        run: &mut Run<'_>,
        p: &Params,
        dims: &[String],
    ) -> Result<Option<&(Frame, Vec<String>)>> {
        if self.state.is_none() {
            // by default, read every candidate request attribute with the rest and keep those
            // with 2 to 1,000 values among the request spans (counted exactly)
            let mut all = dims.to_vec();
            if p.get("dims").is_none() {
                for a in attribute_candidates(run).await? {
                    if !all.contains(&a) {
                        all.push(a);
                    }
                }
            }
            let frame = Frame::load(run, p, &self.signals, &all).await?;
            self.state = Some(frame.map(|f| {
                let keep: Vec<usize> = (0..all.len())
                    .filter(|&d| d < dims.len() || (2..=1000).contains(&f.distinct(d)))
                    .collect();
                let names = keep.iter().map(|&d| all[d].clone()).collect();
                (f.project(&keep), names)
            }));
        }
        Ok(self.state.as_ref().and_then(Option::as_ref))
    }
}

/// A span signal's specification and the kind of its series.
fn spec_of(signal: &str) -> Result<(SpanSignal, Kind)> {
    Ok(match signal {
        "error_rate" | "throughput" => (
            SpanSignal {
                name: signal.to_owned(),
                condition: REQUEST_SPANS.into(),
                value: "CASE WHEN status_code = 'ERROR' THEN 1.0 ELSE 0.0 END".into(),
                unit: "",
                per_request: true,
            },
            if signal == "error_rate" {
                Kind::Rate
            } else {
                Kind::Count
            },
        ),
        s => (span_signal(s)?, Kind::Latency),
    })
}

/// The incidents of a span signal (latency, `error_rate`, `throughput`).
async fn span_incidents(
    run: &mut Run<'_>,
    p: &Params,
    signal: &str,
    step_ns: u64,
    sensitivity: f64,
    dims: &[String],
    frames: &mut Frames,
) -> Result<Vec<Incident>> {
    let (spec, kind) = spec_of(signal)?;
    let decode = matches!(signal, "itl" | "decode_latency");
    let mut points: BTreeMap<u64, Point> = BTreeMap::new();
    let mut sketches: BTreeMap<u64, Sketch> = BTreeMap::new();
    let mut overall = Sketch::default();
    let from_rollups = if decode {
        super::decode::series(run, p, step_ns).await?
    } else {
        None
    };
    if spec.per_request {
        let Some((frame, _)) = frames.get(run, p, dims).await? else {
            return Ok(Vec::new());
        };
        let latency = matches!(kind, Kind::Latency);
        for (t, s) in frame.series(&spec.name, step_ns, latency) {
            if latency {
                overall.merge(&s.sketch);
                sketches.insert(t, s.sketch);
            } else {
                let v = point_value(&kind, s.n, s.sum, step_ns);
                points.insert(t, Point { t, v, n: s.n });
            }
        }
    } else if let Some(steps) = from_rollups {
        sketches = steps;
        for s in sketches.values() {
            overall.merge(s);
        }
    } else if !series_of_sql(
        run,
        p,
        &spec,
        &kind,
        step_ns,
        &mut sketches,
        &mut overall,
        &mut points,
    )
    .await?
    {
        return Ok(Vec::new());
    }
    for (t, s) in &sketches {
        points.insert(
            *t,
            Point {
                t: *t,
                v: s.quantile(0.95).unwrap_or(0.0),
                n: s.count() as f64,
            },
        );
    }
    // every step of the range, empty ones as zero (a stop is a throughput anomaly)
    let first = p.start.unwrap_or(0) / step_ns * step_ns;
    let mut all = Vec::new();
    let mut t = first;
    while t < p.end.unwrap_or(0) {
        all.push(
            points
                .get(&t)
                .copied()
                .unwrap_or(Point { t, v: 0.0, n: 0.0 }),
        );
        t += step_ns;
    }
    let spread = overall.quantile(0.97).unwrap_or(0.0) - overall.quantile(0.93).unwrap_or(0.0);
    let (windows, baseline) = detect(&all, step_ns, sensitivity, &kind, spread);
    if windows.is_empty() {
        return Ok(Vec::new());
    }
    // the baseline's middle value: excess is measured above it
    let mid = match kind {
        Kind::Latency => {
            let mut base = Sketch::default();
            for (t, s) in &sketches {
                if !windows.iter().any(|w| *t >= w.start && *t < w.end) {
                    base.merge(s);
                }
            }
            base.quantile(0.5).unwrap_or(0.0)
        }
        _ => 0.0,
    };
    let from_postings = if decode {
        let ask = super::decode::Ask {
            windows: windows.iter().map(|w| (w.start, w.end)).collect(),
            threshold: baseline,
            mid,
        };
        super::decode::tallies(run, p, dims, ask).await?
    } else {
        None
    };
    let causes = match (
        from_postings,
        frames.state.as_ref().and_then(Option::as_ref),
    ) {
        (Some(t), _) => rank(&t, dims),
        (None, Some((frame, all))) if spec.per_request => {
            let w: Vec<(u64, u64)> = windows.iter().map(|w| (w.start, w.end)).collect();
            frame_causes(frame, all, &spec, &kind, &w, baseline, mid)
        }
        _ => attribute(run, p, &spec, &kind, &windows, baseline, mid, dims).await?,
    };
    Ok(windows
        .iter()
        .zip(causes)
        .map(|(w, attribution)| Incident {
            start_ns: w.start,
            end_ns: w.end,
            signal: signal.to_owned(),
            labels: BTreeMap::new(),
            score: w.score,
            peak: w.peak,
            baseline,
            attribution,
            co_signals: Vec::new(),
        })
        .collect())
}

/// The causes of a request signal's windows from its frame: anomalous requests are those
/// over `threshold` (latency), in error (rate) or any (count), as [`attribute`] counts them.
fn frame_causes(
    frame: &Frame,
    dims: &[String],
    spec: &SpanSignal,
    kind: &Kind,
    windows: &[(u64, u64)],
    threshold: f64,
    mid: f64,
) -> Vec<Vec<Cause>> {
    let t = match kind {
        Kind::Latency => frame.tallies(&spec.name, windows, |v| v > threshold, |v| v - mid),
        Kind::Rate => frame.tallies(&spec.name, windows, |v| v > 0.5, |_| 1.0),
        _ => frame.tallies(&spec.name, windows, |_| true, |_| 1.0),
    };
    rank(&t, dims)
}

/// A rate's or count's step value from its rows and summed values: the share in error, or
/// rows per second.
fn point_value(kind: &Kind, n: f64, sum: f64, step_ns: u64) -> f64 {
    match kind {
        Kind::Rate => sum / n.max(1.0),
        _ => n / (step_ns as f64 / 1e9),
    }
}

/// The series of a span signal in SQL: per step, a latency signal's sketch (into `sketches`
/// and `overall`), or a rate's or count's point (into `points`). `false` when the time budget
/// ran out first.
#[allow(clippy::too_many_arguments)]
async fn series_of_sql(
    run: &mut Run<'_>,
    p: &Params,
    spec: &SpanSignal,
    kind: &Kind,
    step_ns: u64,
    sketches: &mut BTreeMap<u64, Sketch>,
    overall: &mut Sketch,
    points: &mut BTreeMap<u64, Point>,
) -> Result<bool> {
    let filter = p.where_clause(&[format!("({})", spec.condition)])?;
    let t = format!(
        "CAST(date_bin(INTERVAL '{} milliseconds', start_time) AS BIGINT)",
        step_ns / 1_000_000
    );
    let series_q = match kind {
        Kind::Latency => format!(
            "SELECT t, {} AS k, count(*) FROM (SELECT {t} AS t, {} AS v FROM spans {filter}) \
             WHERE v IS NOT NULL GROUP BY t, k",
            bin_sql("v"),
            spec.value
        ),
        _ => format!(
            "SELECT {t} AS t, count(*), sum({}) FROM spans {filter} GROUP BY 1",
            spec.value
        ),
    };
    let Some(rows) = run.sql_or_partial(&series_q).await? else {
        return Ok(false);
    };
    let times = rows.i64(0);
    match kind {
        Kind::Latency => {
            let (k, n) = (rows.i64(1), rows.i64(2));
            for i in 0..rows.len() {
                let t = times[i].unwrap_or(0) as u64;
                let (k, n) = (k[i].unwrap_or(0), n[i].unwrap_or(0) as u64);
                sketches.entry(t).or_default().add(k, n);
                overall.add(k, n);
            }
        }
        _ => {
            let (n, e) = (rows.f64(1), rows.f64(2));
            for i in 0..rows.len() {
                let t = times[i].unwrap_or(0) as u64;
                let (n, e) = (n[i].unwrap_or(0.0), e[i].unwrap_or(0.0));
                let v = point_value(kind, n, e, step_ns);
                points.insert(t, Point { t, v, n });
            }
        }
    }
    Ok(true)
}

/// String attributes of request spans with 2 to 1,000 values in the range.
async fn request_attributes(run: &Run<'_>, p: &Params) -> Result<Vec<String>> {
    let candidates = attribute_candidates(run).await?;
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let counts: Vec<String> = candidates
        .iter()
        .map(|c| format!("approx_distinct({})", ident(c)))
        .collect();
    let r = run
        .sql(&format!(
            "SELECT {} FROM spans {}",
            counts.join(", "),
            p.where_clause(&[format!("({REQUEST_SPANS})")])?
        ))
        .await?;
    Ok(candidates
        .into_iter()
        .enumerate()
        .filter(|(i, _)| {
            let n = r.i64(*i).first().copied().flatten().unwrap_or(0);
            (2..=1000).contains(&n)
        })
        .map(|(_, c)| c)
        .collect())
}

/// The text columns of `spans` that may be request attributes (at most 64): not a fixed
/// column, an inherited dimension or a hash.
async fn attribute_candidates(run: &Run<'_>) -> Result<Vec<String>> {
    let cols = run
        .sql(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'spans' \
             AND data_type = 'Utf8' ORDER BY ordinal_position",
        )
        .await?;
    const FIXED: &[&str] = &[
        "trace_id",
        "span_id",
        "parent_span_id",
        "service_name",
        "name",
        "kind",
        "status_code",
        "status_message",
        "trace_state",
        "scope_name",
        "scope_version",
        "gen_ai.conversation.id",
    ];
    let candidates: Vec<String> = cols
        .strings(0)
        .into_iter()
        .flatten()
        .filter(|c| {
            !FIXED.contains(&c.as_str())
                && !c.starts_with("request.")
                && !inherited(c)
                && !c.ends_with(".hash")
        })
        .take(64)
        .collect();
    Ok(candidates)
}

#[allow(clippy::too_many_arguments)]
async fn attribute(
    run: &mut Run<'_>,
    p: &Params,
    spec: &SpanSignal,
    kind: &Kind,
    windows: &[Window],
    threshold: f64,
    mid: f64,
    dims: &[String],
) -> Result<Vec<Vec<Cause>>> {
    let mut dims: Vec<String> = dims.to_vec();
    if spec.per_request && p.get("dims").is_none() {
        for a in request_attributes(run, p).await? {
            if !dims.contains(&a) {
                dims.push(a);
            }
        }
    }
    let exprs: Vec<String> = dims
        .iter()
        .map(|d| {
            if spec.per_request && !inherited(d) {
                ident(d)
            } else {
                dim_expr(d)
            }
        })
        .collect();
    let arms: String = windows
        .iter()
        .enumerate()
        .map(|(i, w)| {
            format!(
                " WHEN start_time >= {} AND start_time < {} THEN {}",
                ts(w.start),
                ts(w.end),
                i + 1
            )
        })
        .collect();
    let (hit, excess) = match kind {
        Kind::Latency => (format!("v > {threshold:?}"), format!("v - {mid:?}")),
        Kind::Rate => ("v > 0.5".to_owned(), "1.0".to_owned()),
        _ => ("TRUE".to_owned(), "1.0".to_owned()),
    };
    let cast: Vec<String> = exprs
        .iter()
        .map(|e| format!("CAST({e} AS VARCHAR)"))
        .collect();
    let Groups { select: cols, keys } = groups(&cast);
    let query = format!(
        "SELECT w{keys}, count(*), sum(CASE WHEN w > 0 AND {hit} THEN 1 ELSE 0 END), \
         sum(CASE WHEN w > 0 AND {hit} THEN {excess} ELSE 0.0 END) FROM \
         (SELECT CASE{arms} ELSE 0 END AS w{cols}, {} AS v FROM spans {}) \
         WHERE v IS NOT NULL GROUP BY w{keys}",
        spec.value,
        p.where_clause(&[format!("({})", spec.condition)])?
    );
    let Some(rows) = run.sql_or_partial(&query).await? else {
        return Ok(vec![Vec::new(); windows.len()]);
    };
    let k = dims.len();
    let w = rows.i64(0);
    let values: Vec<Vec<Option<String>>> = (0..k).map(|i| rows.strings(1 + i)).collect();
    let (n, a, ex) = (rows.f64(1 + k), rows.f64(2 + k), rows.f64(3 + k));
    let mut t = Tallies::new(k, windows.len());
    let tuple =
        |row: usize| -> Vec<Option<String>> { values.iter().map(|v| v[row].clone()).collect() };
    // the windows' groups first, then the baseline of the candidates they make
    for row in 0..rows.len() {
        if let Some(win) = w[row].filter(|w| *w > 0) {
            let (a, ex) = (a[row].unwrap_or(0.0), ex[row].unwrap_or(0.0));
            t.anomalous_of(win as usize - 1, &tuple(row), a, ex);
        }
    }
    let candidates = t.candidates();
    for row in 0..rows.len() {
        if w[row] == Some(0) {
            t.baseline_of(&candidates, &tuple(row), n[row].unwrap_or(0.0));
        }
    }
    Ok(rank(&t, &dims))
}

/// What attribution ranks, per window: the anomalous units and their excess by the values of
/// each candidate set of dimensions (each one and each pair), and the baseline units by the
/// same keys.
#[derive(Clone, Debug, Default)]
pub struct Tallies {
    /// The sets: dimension indexes, single ones first.
    pub sets: Vec<Vec<usize>>,
    pub windows: Vec<WindowTally>,
    /// Baseline units by set and values (a key with none here has none).
    pub baseline: Vec<BTreeMap<Vec<String>, f64>>,
    pub total_baseline: f64,
}

/// The keys of one set that ranking may look at.
pub type Candidates = BTreeSet<Vec<String>>;

#[derive(Clone, Debug, Default)]
pub struct WindowTally {
    /// (anomalous units, excess) by set and values.
    pub by: Vec<BTreeMap<Vec<String>, (f64, f64)>>,
    pub anomalous: f64,
    pub excess: f64,
}

impl Tallies {
    pub fn new(dims: usize, windows: usize) -> Self {
        let mut sets: Vec<Vec<usize>> = (0..dims).map(|i| vec![i]).collect();
        for i in 0..dims {
            for j in i + 1..dims {
                sets.push(vec![i, j]);
            }
        }
        Self {
            windows: vec![
                WindowTally {
                    by: vec![BTreeMap::new(); sets.len()],
                    ..Default::default()
                };
                windows
            ],
            baseline: vec![BTreeMap::new(); sets.len()],
            sets,
            total_baseline: 0.0,
        }
    }

    /// A set's key in a tuple of values (one per dimension): `None` when one is missing.
    pub fn key(set: &[usize], tuple: &[Option<String>]) -> Option<Vec<String>> {
        set.iter().map(|d| tuple[*d].clone()).collect()
    }

    /// Counts `units` anomalous units with `excess` of values `tuple` in window `w`.
    pub fn anomalous_of(&mut self, w: usize, tuple: &[Option<String>], units: f64, excess: f64) {
        let win = &mut self.windows[w];
        win.anomalous += units;
        win.excess += excess;
        for (s, set) in self.sets.iter().enumerate() {
            if let Some(key) = Self::key(set, tuple) {
                let e = win.by[s].entry(key).or_default();
                e.0 += units;
                e.1 += excess;
            }
        }
    }

    /// Counts `units` baseline units of values `tuple`, by the keys among `candidates` (see
    /// [`Self::candidates`]: all that ranking looks up) alone.
    pub fn baseline_of(&mut self, candidates: &[Candidates], tuple: &[Option<String>], units: f64) {
        self.total_baseline += units;
        // a set's key can be a candidate only when each of its values is one (sets of one
        // dimension come first, in dimension order)
        let single: Vec<bool> = tuple
            .iter()
            .enumerate()
            .map(|(d, v)| {
                v.as_ref()
                    .is_some_and(|v| candidates[d].contains(std::slice::from_ref(v)))
            })
            .collect();
        for (s, set) in self.sets.iter().enumerate() {
            if !set.iter().all(|d| single[*d]) {
                continue;
            }
            if let Some(key) = Self::key(set, tuple)
                && candidates[s].contains(&key)
            {
                *self.baseline[s].entry(key).or_default() += units;
            }
        }
    }

    /// The keys that [`rank`] may look at, by set: those holding at least [`MIN_SUPPORT`] of
    /// some window's anomalous units (a pair's keys only when both its values are such).
    pub fn candidates(&self) -> Vec<Candidates> {
        let mut out = vec![BTreeSet::new(); self.sets.len()];
        for win in &self.windows {
            if win.anomalous <= 0.0 {
                continue;
            }
            for (s, by) in win.by.iter().enumerate() {
                for (key, (a, _)) in by {
                    if *a / win.anomalous >= MIN_SUPPORT {
                        out[s].insert(key.clone());
                    }
                }
            }
        }
        out
    }
}

/// The causes of each window, best first: candidates holding at least [`MIN_SUPPORT`] of the
/// window's anomalous units, over-represented (lift above 1), ranked by
/// `share_of_excess × ln(lift)`.
pub(super) fn rank(t: &Tallies, dims: &[String]) -> Vec<Vec<Cause>> {
    let mut out = Vec::new();
    for win in &t.windows {
        let (total_a, total_ex, total_b) = (win.anomalous, win.excess, t.total_baseline);
        let base = |s: usize, key: &[String]| t.baseline[s].get(key).copied().unwrap_or(0.0);
        let mut causes = Vec::new();
        if total_a > 0.0 {
            for (s, set) in t.sets.iter().enumerate() {
                for (key, (va, vex)) in &win.by[s] {
                    if *va / total_a < MIN_SUPPORT {
                        continue;
                    }
                    let vb = base(s, key);
                    // a pair that counts what one of its values alone counts says nothing more
                    if set.len() == 2
                        && set.iter().zip(key).any(|(d, v)| {
                            win.by[*d]
                                .get(std::slice::from_ref(v))
                                .is_some_and(|(a1, _)| {
                                    *a1 == *va && base(*d, std::slice::from_ref(v)) == vb
                                })
                        })
                    {
                        continue;
                    }
                    let lift = (va / total_a) / ((vb + 1.0) / (total_b + 1.0));
                    let share = if total_ex > 0.0 {
                        (vex / total_ex).clamp(0.0, 1.0)
                    } else {
                        va / total_a
                    };
                    if lift <= 1.0 {
                        continue;
                    }
                    causes.push(Cause {
                        dimension: set
                            .iter()
                            .map(|d| dims[*d].as_str())
                            .collect::<Vec<_>>()
                            .join(","),
                        value: key.join(","),
                        lift,
                        share_of_excess: share,
                        score: share * lift.ln(),
                    });
                }
            }
        }
        causes.sort_by(|x, y| {
            y.score
                .total_cmp(&x.score)
                .then(x.dimension.len().cmp(&y.dimension.len()))
        });
        causes.truncate(MAX_ATTRIBUTION);
        out.push(causes);
    }
    out
}

/// The PromQL expression of a metric signal.
fn metric_expr(signal: &str) -> String {
    match signal {
        "gpu_memory" => {
            "gpu_memory_used_bytes / (gpu_memory_used_bytes + gpu_memory_free_bytes)".into()
        }
        "gpu_util" => "gpu_utilization_ratio".into(),
        "kv_cache" => "llm_kv_cache_usage_ratio".into(),
        s => s.trim_start_matches("metric:").to_owned(),
    }
}

/// The incidents of a metric signal, per series.
fn metric_incidents(
    run: &mut Run<'_>,
    p: &Params,
    store: &Arc<Store>,
    signal: &str,
    step_ns: u64,
    sensitivity: f64,
) -> Result<Vec<Incident>> {
    use crate::promql::eval::{QueryResult, range_query};
    let source = crate::promql::source::Source::new(store.clone(), run.tenant.clone())
        .map_err(|e| crate::sql::SqlError::internal(e.to_string()))?;
    let (start, end) = (p.start.unwrap_or(0), p.end.unwrap_or(0));
    let step_ms = (step_ns / 1_000_000).max(1) as i64;
    let result = range_query(
        &source,
        &metric_expr(signal),
        (start / 1_000_000) as i64,
        (end / 1_000_000) as i64,
        step_ms,
    )
    .map_err(|e| invalid(format!("signal {signal}: {}", e.message)))?;
    let QueryResult::Matrix(series) = result else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for s in series {
        let points: Vec<Point> =
            s.ts.iter()
                .zip(&s.vs)
                .filter(|(_, v)| v.is_finite())
                .map(|(t, v)| Point {
                    t: (*t as u64) * 1_000_000,
                    v: *v,
                    n: 1.0,
                })
                .collect();
        let (windows, baseline) = detect(&points, step_ns, sensitivity, &Kind::Level, 0.0);
        let labels: BTreeMap<String, String> = s
            .labels
            .iter()
            .filter(|(k, _)| k != "__name__")
            .cloned()
            .collect();
        for w in windows {
            out.push(Incident {
                start_ns: w.start,
                end_ns: w.end,
                signal: signal.to_owned(),
                labels: labels.clone(),
                score: w.score,
                peak: w.peak,
                baseline,
                attribution: labels
                    .iter()
                    .map(|(k, v)| Cause {
                        dimension: k.clone(),
                        value: v.clone(),
                        lift: f64::NAN,
                        share_of_excess: 1.0,
                        score: 0.0,
                    })
                    .collect(),
                co_signals: Vec::new(),
            });
        }
    }
    Ok(out)
}

/// The (dimension, value) pairs an incident points at, names as Prometheus spells them.
fn entities(i: &Incident) -> BTreeSet<(String, String)> {
    let norm = |d: &str| d.replace(['.', '-'], "_");
    let mut out: BTreeSet<(String, String)> =
        i.labels.iter().map(|(k, v)| (norm(k), v.clone())).collect();
    if let Some(top) = i.attribution.first() {
        for (d, v) in top.dimension.split(',').zip(top.value.split(',')) {
            out.insert((norm(d), v.to_owned()));
        }
    }
    out
}

/// Incidents of different signals that overlap in time and share an entity become one.
fn merge(mut incidents: Vec<Incident>) -> Vec<Incident> {
    incidents.sort_by(|a, b| b.score.total_cmp(&a.score));
    let mut out: Vec<Incident> = Vec::new();
    'next: for i in incidents {
        let ents = entities(&i);
        for o in out.iter_mut() {
            let overlap = i.start_ns < o.end_ns && o.start_ns < i.end_ns;
            let same = (i.labels.is_empty() && o.labels.is_empty() && i.attribution.is_empty())
                || !entities(o).is_disjoint(&ents);
            if overlap && same && o.signal != i.signal {
                match o
                    .co_signals
                    .iter_mut()
                    .find(|c| c.signal == i.signal && c.labels == i.labels)
                {
                    Some(c) => c.peak = c.peak.max(i.peak),
                    None => o.co_signals.push(CoSignal {
                        signal: i.signal.clone(),
                        labels: i.labels.clone(),
                        peak: i.peak,
                    }),
                }
                o.start_ns = o.start_ns.min(i.start_ns);
                o.end_ns = o.end_ns.max(i.end_ns);
                continue 'next;
            }
        }
        out.push(i);
    }
    out.sort_by(|a, b| {
        a.start_ns
            .cmp(&b.start_ns)
            .then(b.score.total_cmp(&a.score))
    });
    out
}

impl Anomalies {
    pub fn to_json(&self) -> Value {
        let incidents: Vec<Value> = self
            .incidents
            .iter()
            .map(|i| {
                json!({
                    "start_ns": i.start_ns,
                    "end_ns": i.end_ns,
                    "signal": i.signal,
                    "labels": i.labels,
                    "score": json_number(i.score),
                    "peak": json_number(i.peak),
                    "baseline": json_number(i.baseline),
                    "attribution": i.attribution.iter().map(|c| json!({
                        "dimension": c.dimension,
                        "value": c.value,
                        "lift": json_number(c.lift),
                        "share_of_excess": json_number(c.share_of_excess),
                    })).collect::<Vec<_>>(),
                    "co_signals": i.co_signals.iter().map(|c| json!({
                        "signal": c.signal,
                        "labels": c.labels,
                        "peak": json_number(c.peak),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({"incidents": incidents, "partial": self.partial})
    }
}

/// Decode latency attribution both ways, SQL first, then postings (`None` when they decline):
/// what tests compare.
#[cfg(test)]
pub(crate) async fn decode_attributions(
    run: &mut Run<'_>,
    p: &Params,
    windows: &[(u64, u64)],
    threshold: f64,
    mid: f64,
    dims: &[String],
) -> Result<(Vec<Vec<Cause>>, Option<Vec<Vec<Cause>>>)> {
    let spec = span_signal("itl")?;
    let ws = test_windows(windows);
    let sql = attribute(run, p, &spec, &Kind::Latency, &ws, threshold, mid, dims).await?;
    let ask = super::decode::Ask {
        windows: windows.to_vec(),
        threshold,
        mid,
    };
    let fast = super::decode::tallies(run, p, dims, ask)
        .await?
        .map(|t| rank(&t, dims));
    Ok((sql, fast))
}

/// Decode latency sketches per step both ways, SQL first, then heat rollups.
#[cfg(test)]
pub(crate) async fn decode_series(
    run: &mut Run<'_>,
    p: &Params,
    step: u64,
) -> Result<(BTreeMap<u64, Sketch>, Option<BTreeMap<u64, Sketch>>)> {
    let spec = span_signal("itl")?;
    let (mut sketches, mut overall, mut points) = Default::default();
    series_of_sql(
        run,
        p,
        &spec,
        &Kind::Latency,
        step,
        &mut sketches,
        &mut overall,
        &mut points,
    )
    .await?;
    Ok((sketches, super::decode::series(run, p, step).await?))
}

/// A request signal's attribution both ways, SQL first, then from the frame: what tests
/// compare.
#[cfg(test)]
pub(crate) async fn request_attributions(
    run: &mut Run<'_>,
    p: &Params,
    signal: &str,
    windows: &[(u64, u64)],
    threshold: f64,
    mid: f64,
    dims: &[String],
) -> Result<(Vec<Vec<Cause>>, Vec<Vec<Cause>>)> {
    let (spec, kind) = spec_of(signal)?;
    let ws = test_windows(windows);
    let sql = attribute(run, p, &spec, &kind, &ws, threshold, mid, dims).await?;
    let mut frames = test_frames();
    let (frame, all) = frames.get(run, p, dims).await?.expect("within the budget");
    Ok((
        sql,
        frame_causes(frame, all, &spec, &kind, windows, threshold, mid),
    ))
}

/// A request signal's series both ways, SQL first, then from the frame: per step the sketch
/// (latency) or the rows and summed values.
#[cfg(test)]
pub(crate) async fn request_series(
    run: &mut Run<'_>,
    p: &Params,
    signal: &str,
    step: u64,
) -> Result<(Vec<(u64, Sketch, f64)>, Vec<(u64, Sketch, f64)>)> {
    let (spec, kind) = spec_of(signal)?;
    let (mut sketches, mut overall, mut points) = Default::default();
    series_of_sql(
        run,
        p,
        &spec,
        &kind,
        step,
        &mut sketches,
        &mut overall,
        &mut points,
    )
    .await?;
    let mut sql: Vec<(u64, Sketch, f64)> = sketches
        .into_iter()
        .map(|(t, s)| (t, s, 0.0))
        .chain(points.into_values().map(|p| (p.t, Sketch::default(), p.v)))
        .collect();
    sql.sort_by_key(|x| x.0);
    let mut frames = test_frames();
    let (frame, _) = frames.get(run, p, &[]).await?.expect("within the budget");
    let latency = matches!(kind, Kind::Latency);
    let mut got: Vec<(u64, Sketch, f64)> = frame
        .series(&spec.name, step, latency)
        .into_iter()
        .map(|(t, s)| {
            let v = match kind {
                Kind::Latency => 0.0,
                _ => point_value(&kind, s.n, s.sum, step),
            };
            (t, s.sketch, v)
        })
        .collect();
    got.sort_by_key(|x| x.0);
    Ok((sql, got))
}

/// Frames of every request signal, as a scan of the default signals reads them.
#[cfg(test)]
fn test_frames() -> Frames {
    Frames {
        signals: ["ttft", "e2e_latency", "error_rate", "throughput", "tpot"]
            .into_iter()
            .map(|s| spec_of(s).expect("a signal").0)
            .collect(),
        state: None,
    }
}

/// Windows as detection would make them, for the test hooks.
#[cfg(test)]
fn test_windows(windows: &[(u64, u64)]) -> Vec<Window> {
    windows
        .iter()
        .map(|&(start, end)| Window {
            start,
            end,
            score: 0.0,
            peak: 0.0,
        })
        .collect()
}
