//! The Prometheus series a selector chooses, and their samples.
//!
//! A stored series shows as one or more Prometheus series: a gauge or sum as its translated
//! name ([`super::names`]); a histogram as `_bucket` series (one per upper bound `le`, counts
//! cumulative, `+Inf` last), `_count` and `_sum`; an exponential histogram as `_count` and
//! `_sum`; a summary as one series per `quantile` plus `_count` and `_sum`. The original OTLP
//! name is accepted in place of the translated base name (`{"gpu.memory.used"}`), and a label
//! matcher may name a label by its original key (`{"worker.id"="w-7"}`). Selection first
//! narrows stored series with the catalog's postings (names and label equalities), then reads
//! only those series' points in the time range, then checks every matcher on the shown labels.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use promql_parser::label::{MatchOp, Matcher};
use roaring::RoaringBitmap;
use weft_storage::Store;
use weft_storage::model::{
    MetricKind, MetricPoint, PointValue, Series, SeriesId, Temporality, TenantId,
};
use weft_storage::store::{SeriesCatalog, Snapshot};

use super::names::{label_name, series_name};
use super::{Labels, PromError};

/// Prometheus's stale marker.
pub const STALE_NAN: u64 = 0x7ff0_0000_0000_0002;

pub fn is_stale(v: f64) -> bool {
    v.to_bits() == STALE_NAN
}

/// One shown series with its samples (milliseconds, ascending).
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    pub labels: Arc<Labels>,
    pub ts: Vec<i64>,
    pub vs: Vec<f64>,
}

/// What a query reads: one tenant's series and points as of one snapshot.
pub struct Source {
    store: Arc<Store>,
    tenant: TenantId,
    snapshot: Snapshot<MetricPoint>,
    catalog: Arc<RwLock<SeriesCatalog>>,
}

/// A shown series' labels with its exemplars: (exemplar labels, value, time ms).
pub type SeriesExemplars = (Labels, Vec<(Labels, f64, i64)>);

/// The parts of a series that show, each with its shown name.
pub(super) type Shown = Vec<(Part, String)>;

/// A stored series that may show, with the parts of it whose shown name passes, and for a
/// series shown under a canonical name ([`super::vocabulary`]), the factor to its unit.
pub(super) type Candidate = (SeriesId, Arc<Series>, Vec<(Part, String)>, Option<f64>);

/// Which part of a stored series' points a shown series is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Part {
    Value,
    Buckets,
    Count,
    Sum,
    Quantiles,
}

fn parts(kind: MetricKind) -> &'static [(Part, &'static str)] {
    match kind {
        MetricKind::Gauge | MetricKind::Sum => &[(Part::Value, "")],
        MetricKind::Histogram => &[
            (Part::Buckets, "_bucket"),
            (Part::Count, "_count"),
            (Part::Sum, "_sum"),
        ],
        MetricKind::ExponentialHistogram => &[(Part::Count, "_count"), (Part::Sum, "_sum")],
        MetricKind::Summary => &[
            (Part::Quantiles, ""),
            (Part::Count, "_count"),
            (Part::Sum, "_sum"),
        ],
    }
}

/// A float as Prometheus prints a label value (`le`, `quantile`).
pub fn format_float(v: f64) -> String {
    if v == f64::INFINITY {
        "+Inf".to_owned()
    } else if v == f64::NEG_INFINITY {
        "-Inf".to_owned()
    } else if v.is_nan() {
        "NaN".to_owned()
    } else {
        format!("{v}")
    }
}

impl Source {
    pub fn new(store: Arc<Store>, tenant: TenantId) -> weft_storage::Result<Self> {
        let snapshot = store.metric_snapshot(&tenant)?;
        let catalog = store.series_catalog(&tenant).unwrap_or_default();
        Ok(Self {
            store,
            tenant,
            snapshot,
            catalog,
        })
    }

    /// The stored series that may show as a series the matchers choose, each with the parts
    /// of it whose shown name passes the name matchers.
    pub(super) fn candidates(&self, matchers: &[&Matcher]) -> Vec<Candidate> {
        let c = self.catalog.read().unwrap_or_else(|e| e.into_inner());
        let mut set: Option<RoaringBitmap> = None;
        for m in matchers {
            // `le` and `quantile` are in the points, not the catalog
            let from_points = matches!(m.name.as_str(), "le" | "quantile");
            if m.name == "__name__" || from_points || m.op != MatchOp::Equal || m.value.is_empty() {
                continue;
            }
            let mut found = RoaringBitmap::new();
            for (key, values) in c.labels() {
                if (*key == m.name || label_name(key) == m.name)
                    && let Some(s) = values.get(&m.value)
                {
                    found |= s;
                }
            }
            set = Some(match set {
                Some(s) => s & found,
                None => found,
            });
        }
        let names: Vec<&&Matcher> = matchers.iter().filter(|m| m.name == "__name__").collect();
        let mut out = Vec::new();
        // the parts a (name, unit, kind, monotonic) shows and that pass the name matchers,
        // worked out once for all the series that share them
        let mut parts_of: HashMap<(&str, MetricKind, bool), Shown> = HashMap::new();
        let pass = |n: &str| names.iter().all(|m| m.is_match(n));
        for (name, ids) in c.names() {
            parts_of.clear();
            let ids = match &set {
                Some(s) => ids & s,
                None => ids.clone(),
            };
            for id in ids.iter() {
                let Some(series) = c.get(id) else { continue };
                let key = (series.unit.as_str(), series.kind, series.monotonic);
                let chosen = parts_of.entry(key).or_insert_with(|| {
                    let base = series_name(series);
                    let mut chosen = Vec::new();
                    for (part, suffix) in parts(series.kind) {
                        let shown = format!("{base}{suffix}");
                        let original = format!("{name}{suffix}");
                        // addressed by its OTLP name, a series shows under the translated one
                        if pass(&shown) || (original != shown && pass(&original)) {
                            chosen.push((*part, shown));
                        }
                    }
                    chosen
                });
                if !chosen.is_empty() {
                    out.push((id, series.clone(), chosen.clone(), None));
                }
            }
        }
        // canonical names: their sources' series, whatever exporter wrote them (label
        // matchers are checked on the canonical labels afterwards)
        for canonical in super::vocabulary::CANONICAL {
            let shown =
                super::names::metric_name(canonical.name, canonical.unit, MetricKind::Gauge, false);
            if names.is_empty() || !(pass(&shown) || pass(canonical.name)) {
                continue;
            }
            for (source, factor) in canonical.sources {
                for id in c.named(source).iter() {
                    let Some(series) = c.get(id) else { continue };
                    if !matches!(series.kind, MetricKind::Gauge | MetricKind::Sum) {
                        continue;
                    }
                    out.push((
                        id,
                        series.clone(),
                        vec![(Part::Value, shown.clone())],
                        Some(*factor),
                    ));
                }
            }
        }
        out
    }

    /// Whole points of some series in `[from, to]` (ms).
    fn points(
        &self,
        from: i64,
        to: i64,
        series: &RoaringBitmap,
    ) -> Result<Vec<MetricPoint>, PromError> {
        let (from_ns, to_ns) = nanos(from, to);
        self.store
            .metric_points(&self.tenant, &self.snapshot, from_ns, to_ns, Some(series))
            .map_err(internal)
    }

    /// Every shown series the matchers choose, with its samples in `[from, to]` (ms).
    pub fn select(
        &self,
        matchers: &[&Matcher],
        from: i64,
        to: i64,
    ) -> Result<Vec<Loaded>, PromError> {
        if matchers.iter().all(|m| m.is_match("")) {
            return Err(PromError::bad_data(
                "vector selector must contain at least one non-empty matcher",
            ));
        }
        let candidates = self.candidates(matchers);
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        // numbers (gauges, sums) read three columns; histograms and summaries whole points
        let (mut numbers, mut detailed) = (RoaringBitmap::new(), RoaringBitmap::new());
        for (id, series, _, _) in &candidates {
            match series.kind {
                MetricKind::Gauge | MetricKind::Sum => numbers.insert(*id),
                _ => detailed.insert(*id),
            };
        }
        let (from_ns, to_ns) = (
            Some(from.max(0) as u64 * 1_000_000),
            Some(to.max(0) as u64 * 1_000_000 + 999_999),
        );
        let internal = |e: weft_storage::StorageError| PromError::internal(e.to_string());
        let values = match numbers.is_empty() {
            true => Vec::new(),
            false => self
                .store
                .metric_values(&self.tenant, &self.snapshot, from_ns, to_ns, &numbers)
                .map_err(internal)?,
        };
        let points = match detailed.is_empty() {
            true => Vec::new(),
            false => self
                .store
                .metric_points(
                    &self.tenant,
                    &self.snapshot,
                    from_ns,
                    to_ns,
                    Some(&detailed),
                )
                .map_err(internal)?,
        };
        let mut value_runs: HashMap<SeriesId, std::ops::Range<usize>> = HashMap::new();
        let mut start = 0;
        for i in 1..=values.len() {
            if i == values.len() || values[i].0 != values[start].0 {
                value_runs.insert(values[start].0, start..i);
                start = i;
            }
        }
        let mut by_series: HashMap<SeriesId, Vec<&MetricPoint>> = HashMap::new();
        for p in &points {
            by_series.entry(p.series).or_default().push(p);
        }
        let mut out = Vec::new();
        for (id, series, chosen, factor) in candidates {
            let numbers_of = value_runs.get(&id).map(|r| &values[r.clone()]);
            let points = by_series.get(&id);
            if numbers_of.is_none() && points.is_none() {
                continue;
            }
            let base: Labels = match factor {
                Some(_) => canonical_labels(&series),
                None => shown_labels(&series),
            };
            for (part, name) in chosen {
                let expanded = match (numbers_of, points) {
                    (Some(values), _) => {
                        let monotonic = series.kind == MetricKind::Sum && series.monotonic;
                        let mut l = number_series(
                            values,
                            monotonic && series.temporality == Temporality::Cumulative,
                        );
                        if series.kind == MetricKind::Sum
                            && series.temporality == Temporality::Delta
                        {
                            accumulate(&mut l);
                        }
                        vec![l]
                    }
                    (None, Some(points)) => expand(part, points),
                    (None, None) => Vec::new(),
                };
                for mut loaded in expanded {
                    if let Some(f) = factor.filter(|f| *f != 1.0) {
                        loaded
                            .vs
                            .iter_mut()
                            .filter(|v| !is_stale(**v))
                            .for_each(|v| *v *= f);
                    }
                    let mut labels = base.clone();
                    for (k, v) in loaded.labels.iter() {
                        insert(&mut labels, k.clone(), v.clone());
                    }
                    insert(&mut labels, "__name__".to_owned(), name.clone());
                    loaded.labels = Arc::new(labels);
                    // names were checked on the candidates (shown or OTLP name)
                    let ok = matchers.iter().filter(|m| m.name != "__name__").all(|m| {
                        let value = get(&loaded.labels, &m.name)
                            .or_else(|| series.label(&m.name))
                            .unwrap_or("");
                        m.is_match(value)
                    });
                    if ok && !loaded.ts.is_empty() {
                        out.push(loaded);
                    }
                }
            }
        }
        out.sort_by(|a, b| a.labels.cmp(&b.labels));
        Ok(out)
    }

    /// The label sets of every stored series as shown, one per part: what label and series
    /// listings answer when no selector narrows them. Only histograms and summaries have
    /// their points read, in `[from, to]` (ms): their `le` and `quantile` labels are in the
    /// points.
    pub fn all_label_sets(&self, from: i64, to: i64) -> Result<Vec<Labels>, PromError> {
        let mut out = Vec::new();
        let mut detailed = RoaringBitmap::new();
        {
            let c = self.catalog.read().unwrap_or_else(|e| e.into_inner());
            for id in 0..c.len() as u32 {
                let Some(series) = c.get(id) else { continue };
                let base = series_name(series);
                let labels = shown_labels(series);
                for (part, suffix) in parts(series.kind) {
                    if matches!(part, Part::Buckets | Part::Quantiles) {
                        detailed.insert(id);
                        continue;
                    }
                    let mut l = labels.clone();
                    insert(&mut l, "__name__".to_owned(), format!("{base}{suffix}"));
                    out.push(l);
                }
            }
        }
        {
            // the canonical names their sources answer to
            let c = self.catalog.read().unwrap_or_else(|e| e.into_inner());
            for canonical in super::vocabulary::CANONICAL {
                let shown = super::names::metric_name(
                    canonical.name,
                    canonical.unit,
                    MetricKind::Gauge,
                    false,
                );
                for (source, _) in canonical.sources {
                    for id in c.named(source).iter() {
                        let Some(series) = c.get(id) else { continue };
                        let mut l = canonical_labels(series);
                        insert(&mut l, "__name__".to_owned(), shown.clone());
                        out.push(l);
                    }
                }
            }
        }
        if !detailed.is_empty() {
            let points = self.points(from, to, &detailed)?;
            let c = self.catalog.read().unwrap_or_else(|e| e.into_inner());
            for id in detailed.iter() {
                let Some(series) = c.get(id) else { continue };
                let mine: Vec<&MetricPoint> = points.iter().filter(|p| p.series == id).collect();
                for (part, suffix) in parts(series.kind) {
                    if !matches!(part, Part::Buckets | Part::Quantiles) {
                        continue;
                    }
                    for loaded in expand(*part, &mine) {
                        let mut l = shown_labels(series);
                        for (k, v) in loaded.labels.iter() {
                            insert(&mut l, k.clone(), v.clone());
                        }
                        insert(
                            &mut l,
                            "__name__".to_owned(),
                            format!("{}{suffix}", series_name(series)),
                        );
                        out.push(l);
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Each shown metric name with its Prometheus type, help and unit.
    pub fn metadata(&self) -> BTreeMap<String, (&'static str, String, String)> {
        let c = self.catalog.read().unwrap_or_else(|e| e.into_inner());
        let mut out = BTreeMap::new();
        for id in 0..c.len() as u32 {
            let Some(s) = c.get(id) else { continue };
            let kind = match s.kind {
                MetricKind::Gauge => "gauge",
                MetricKind::Sum if s.monotonic => "counter",
                MetricKind::Sum => "gauge",
                MetricKind::Histogram | MetricKind::ExponentialHistogram => "histogram",
                MetricKind::Summary => "summary",
            };
            out.entry(series_name(s)).or_insert_with(|| {
                (
                    kind,
                    s.description.clone(),
                    super::names::unit_suffix(&s.unit),
                )
            });
        }
        out
    }

    /// Exemplars of the series the matchers choose in `[from, to]` (ms): (shown labels of the
    /// series, [(exemplar labels, value, time ms)]).
    pub fn exemplars(
        &self,
        matchers: &[&Matcher],
        from: i64,
        to: i64,
    ) -> Result<Vec<SeriesExemplars>, PromError> {
        let candidates = self.candidates(matchers);
        let ids: RoaringBitmap = candidates.iter().map(|(id, _, _, _)| *id).collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let points = self.points(from, to, &ids)?;
        let mut out = Vec::new();
        for (id, series, chosen, _) in candidates {
            let mut found = Vec::new();
            for p in points.iter().filter(|p| p.series == id) {
                for e in &p.exemplars {
                    let mut labels = Labels::new();
                    for (k, v) in &e.filtered {
                        insert(&mut labels, label_name(k), v.clone());
                    }
                    if let Some(t) = e.trace_id {
                        insert(&mut labels, "trace_id".to_owned(), t.to_hex());
                    }
                    if let Some(s) = e.span_id {
                        insert(&mut labels, "span_id".to_owned(), s.to_hex());
                    }
                    let t = if e.time.0 == 0 { p.time.0 } else { e.time.0 };
                    found.push((labels, e.value, (t / 1_000_000) as i64));
                }
            }
            if found.is_empty() {
                continue;
            }
            let mut labels = shown_labels(&series);
            let name = chosen.first().map(|(_, n)| n.clone()).unwrap_or_default();
            insert(&mut labels, "__name__".to_owned(), name);
            out.push((labels, found));
        }
        Ok(out)
    }
}

/// A series' labels under the canonical keys ([`super::vocabulary::LABELS`]), shown.
fn canonical_labels(series: &Series) -> Labels {
    let mut out = Labels::new();
    for (k, v) in &series.labels {
        insert(
            &mut out,
            label_name(super::vocabulary::canonical_label(k)),
            v.clone(),
        );
    }
    out
}

/// A series' labels under their shown names.
pub fn shown_labels(series: &Series) -> Labels {
    let mut out = Labels::new();
    for (k, v) in &series.labels {
        insert(&mut out, label_name(k), v.clone());
    }
    out
}

/// A millisecond range as the store's inclusive nanosecond bounds.
fn nanos(from: i64, to: i64) -> (Option<u64>, Option<u64>) {
    (
        Some(from.max(0) as u64 * 1_000_000),
        Some(to.max(0) as u64 * 1_000_000 + 999_999),
    )
}

fn internal(e: weft_storage::StorageError) -> PromError {
    PromError::internal(e.to_string())
}

pub fn get<'l>(labels: &'l Labels, name: &str) -> Option<&'l str> {
    labels
        .binary_search_by(|(k, _)| k.as_str().cmp(name))
        .ok()
        .map(|i| labels[i].1.as_str())
}

pub fn insert(labels: &mut Labels, k: String, v: String) {
    match labels.binary_search_by(|(x, _)| x.as_str().cmp(&k)) {
        Ok(i) => labels[i].1 = v,
        Err(i) => labels.insert(i, (k, v)),
    }
}

/// A delta sum shown as Prometheus keeps sums, cumulative: each point the running total of
/// the deltas read (from the start of the queried range), so that `rate` and `increase` work.
fn accumulate(l: &mut Loaded) {
    let mut total = 0.0;
    for v in l.vs.iter_mut().filter(|v| !is_stale(**v)) {
        total += *v;
        *v = total;
    }
}

/// A number series' samples in milliseconds (two points in one millisecond: the last). For a
/// cumulative counter, a start time that moves past the previous point is a reset even when the
/// value did not fall (the process restarted and counted past its old value): a zero at the new
/// start time makes `rate` and `increase` see it, as Prometheus's created-timestamp zero
/// ingestion does.
fn number_series(values: &[(SeriesId, u64, u64, f64)], counter: bool) -> Loaded {
    let mut l = Loaded {
        ts: Vec::with_capacity(values.len()),
        vs: Vec::with_capacity(values.len()),
        ..Default::default()
    };
    let mut previous: Option<(u64, u64)> = None;
    for (_, t, start, v) in values {
        if counter
            && let Some((prev_time, prev_start)) = previous
            && *start > prev_start
            && *start > prev_time
            && *start < *t
        {
            let zero = (start / 1_000_000) as i64;
            if l.ts.last().is_none_or(|last| *last < zero) {
                l.ts.push(zero);
                l.vs.push(0.0);
            }
        }
        previous = Some((*t, *start));
        let ms = (t / 1_000_000) as i64;
        if l.ts.last() == Some(&ms) {
            *l.vs.last_mut().expect("a value per time") = *v;
            continue;
        }
        l.ts.push(ms);
        l.vs.push(*v);
    }
    l
}

/// The shown series of one part of a stored series' points (each with only the labels the
/// part adds: `le`, `quantile`).
fn expand(part: Part, points: &[&MetricPoint]) -> Vec<Loaded> {
    let ms = |p: &MetricPoint| (p.time.0 / 1_000_000) as i64;
    let single = |f: &dyn Fn(&PointValue) -> Option<f64>| {
        let mut l = Loaded::default();
        for p in points {
            if let Some(v) = f(&p.value) {
                l.ts.push(ms(p));
                l.vs.push(v);
            }
        }
        vec![l]
    };
    match part {
        Part::Value => single(&|v| match v {
            PointValue::Number(x) => Some(*x),
            _ => None,
        }),
        Part::Count => single(&|v| v.count().map(|c| c as f64)),
        Part::Sum => single(&PointValue::sum),
        Part::Buckets => {
            let mut by_le: BTreeMap<String, (f64, Loaded)> = BTreeMap::new();
            for p in points {
                let PointValue::Histogram { bounds, counts, .. } = &p.value else {
                    continue;
                };
                let mut cumulative = 0u64;
                for (i, c) in counts.iter().enumerate() {
                    cumulative += c;
                    let le = bounds.get(i).copied().unwrap_or(f64::INFINITY);
                    let entry = by_le
                        .entry(format_float(le))
                        .or_insert_with(|| (le, Loaded::default()));
                    entry.1.ts.push(ms(p));
                    entry.1.vs.push(cumulative as f64);
                }
            }
            by_le
                .into_iter()
                .map(|(le, (_, mut l))| {
                    l.labels = Arc::new(vec![("le".to_owned(), le)]);
                    l
                })
                .collect()
        }
        Part::Quantiles => {
            let mut by_q: BTreeMap<String, Loaded> = BTreeMap::new();
            for p in points {
                let PointValue::Summary { quantiles, .. } = &p.value else {
                    continue;
                };
                for (q, v) in quantiles {
                    let entry = by_q.entry(format_float(*q)).or_default();
                    entry.ts.push(ms(p));
                    entry.vs.push(*v);
                }
            }
            by_q.into_iter()
                .map(|(q, mut l)| {
                    l.labels = Arc::new(vec![("quantile".to_owned(), q)]);
                    l
                })
                .collect()
        }
    }
}
