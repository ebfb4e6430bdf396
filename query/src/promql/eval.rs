//! Evaluation: the data of every selector is read once for the whole query, then the
//! expression is evaluated at each step.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use promql_parser::label::Matcher;
use promql_parser::parser::{
    AggregateExpr, AtModifier, BinaryExpr, Expr, LabelModifier, Offset, VectorMatchCardinality,
    VectorSelector,
};

use super::source::{Source, get, insert, is_stale};
use super::{Labels, Loaded, PromError};

/// Prometheus's default lookback delta.
pub const LOOKBACK_MS: i64 = 5 * 60 * 1000;
/// The step of a subquery that names none (Prometheus's default evaluation interval).
pub const DEFAULT_SUBQUERY_STEP_MS: i64 = 60 * 1000;
/// Most points a query may hold in its answer (Prometheus's default `--query.max-samples`).
pub const MAX_SAMPLES: usize = 50_000_000;

/// One sample of an instant vector.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: Arc<Labels>,
    pub v: f64,
    /// The sample's own time (for `timestamp()`).
    pub t: i64,
}

/// One series' samples in a range vector at one step, with the range's ends (ms).
pub(super) struct Window<'a> {
    pub ts: &'a [i64],
    pub vs: &'a [f64],
    pub start: i64,
    pub end: i64,
}

/// What an expression evaluates to at one instant.
#[derive(Clone, Debug)]
pub enum Value {
    Scalar(f64),
    Vector(Vec<Sample>),
    Matrix(Vec<Loaded>),
    Str(String),
}

/// The answer of a query, as the API returns it.
#[derive(Clone, Debug)]
pub enum QueryResult {
    Scalar(i64, f64),
    Str(i64, String),
    /// (labels, time, value).
    Vector(Vec<(Labels, i64, f64)>),
    Matrix(Vec<Loaded>),
}

pub(super) struct Evaluator<'a> {
    source: &'a Source,
    pub(super) start: i64,
    pub(super) end: i64,
    lookback: i64,
    /// Each selector's series, by the selector's address in the parsed expression.
    data: HashMap<usize, Arc<Vec<Loaded>>>,
}

fn key(vs: &VectorSelector) -> usize {
    vs as *const VectorSelector as usize
}

fn ms(d: &Duration) -> i64 {
    d.as_millis() as i64
}

pub(super) fn offset_ms(o: &Option<Offset>) -> i64 {
    match o {
        None => 0,
        Some(Offset::Pos(d)) => ms(d),
        Some(Offset::Neg(d)) => -ms(d),
    }
}

fn system_ms(t: &SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

fn op_name(t: &promql_parser::parser::token::TokenType) -> String {
    t.to_string()
}

/// Parses a query, naming the problem as Prometheus's parser would.
pub fn parse(query: &str) -> Result<Expr, PromError> {
    promql_parser::parser::parse(query).map_err(PromError::bad_data)
}

/// Evaluates `query` at one instant (ms).
pub fn instant_query(source: &Source, query: &str, time: i64) -> Result<QueryResult, PromError> {
    let expr = parse(query)?;
    let mut ev = Evaluator::new(source, time, time);
    ev.load(&expr, time, time)?;
    forget_query_memos();
    let value = ev.eval(&expr, time);
    let answer = instant_answer(&expr, value, time);
    forget_query_memos();
    answer
}

fn instant_answer(
    expr: &Expr,
    value: Result<Value, PromError>,
    time: i64,
) -> Result<QueryResult, PromError> {
    Ok(match value? {
        Value::Scalar(v) => QueryResult::Scalar(time, v),
        Value::Str(s) => QueryResult::Str(time, s),
        Value::Vector(samples) => {
            let mut seen = LabelSet::default();
            if !samples.iter().all(|s| seen.insert(&s.labels)) {
                return Err(PromError::execution(SAME_LABELSET));
            }
            let mut out: Vec<(Labels, i64, f64)> = samples
                .into_iter()
                .map(|s| (Arc::unwrap_or_clone(s.labels), time, s.v))
                .collect();
            if !keeps_order(expr) {
                out.sort_by(|a, b| a.0.cmp(&b.0));
            }
            QueryResult::Vector(out)
        }
        Value::Matrix(m) => QueryResult::Matrix(m),
    })
}

/// Whether the expression's order is its answer's (`sort`, `topk`, …).
fn keeps_order(e: &Expr) -> bool {
    match e {
        Expr::Paren(p) => keeps_order(&p.expr),
        Expr::Call(c) => matches!(c.func.name, "sort" | "sort_desc"),
        Expr::Aggregate(a) => matches!(op_name(&a.op).as_str(), "topk" | "bottomk"),
        _ => false,
    }
}

/// Label sets seen, by hash (collisions told apart by comparing the sets).
#[derive(Default)]
pub(super) struct LabelSet {
    seen: rustc_hash::FxHashMap<u64, Vec<Arc<Labels>>>,
}

impl LabelSet {
    /// Whether `l` is new (and remembers it).
    pub(super) fn insert(&mut self, l: &Arc<Labels>) -> bool {
        let h = memo_hash(0, l, |l| {
            let mut h = rustc_hash::FxHasher::default();
            l.hash(&mut h);
            h.finish()
        });
        let same = self.seen.entry(h).or_default();
        if same.iter().any(|x| x == l) {
            return false;
        }
        same.push(l.clone());
        true
    }
}

const SAME_LABELSET: &str = "vector cannot contain metrics with the same labelset";

/// Evaluates `query` at every step from `start` to `end` (ms).
pub fn range_query(
    source: &Source,
    query: &str,
    start: i64,
    end: i64,
    step: i64,
) -> Result<QueryResult, PromError> {
    if step <= 0 {
        return Err(PromError::bad_data(
            "zero or negative query resolution step widths are not accepted. Try a positive integer",
        ));
    }
    if end < start {
        return Err(PromError::bad_data(
            "end timestamp must not be before start time",
        ));
    }
    if (end - start) / step > 11_000 {
        return Err(PromError::bad_data(
            "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query resolution (?step=XX)",
        ));
    }
    let expr = parse(query)?;
    let kind = expr.value_type();
    if !matches!(
        kind,
        promql_parser::parser::value::ValueType::Vector
            | promql_parser::parser::value::ValueType::Scalar
    ) {
        return Err(PromError::bad_data(format!(
            "invalid expression type \"{kind}\" for range query, must be Scalar or instant Vector"
        )));
    }
    let mut ev = Evaluator::new(source, start, end);
    ev.load(&expr, start, end)?;
    forget_query_memos();
    let answer = ev.evaluate_range(&expr, start, end, step);
    forget_query_memos();
    answer
}

impl Evaluator<'_> {
    /// The expression at every step, gathered into series.
    fn evaluate_range(
        &self,
        expr: &Expr,
        start: i64,
        end: i64,
        step: i64,
    ) -> Result<QueryResult, PromError> {
        let mut series = Accumulator::default();
        let mut samples = 0usize;
        let mut t = start;
        while t <= end {
            let out = match self.eval(expr, t)? {
                Value::Scalar(v) => vec![Sample {
                    labels: Default::default(),
                    v,
                    t,
                }],
                Value::Vector(v) => v,
                _ => return Err(PromError::execution("range query of a matrix")),
            };
            samples += out.len();
            if samples > MAX_SAMPLES {
                return Err(PromError::execution(
                    "query processing would load too many samples into memory in query execution",
                ));
            }
            for s in out {
                // a series given two values at one step: two samples had its labels
                if !series.push(s.labels, t, s.v) {
                    return Err(PromError::execution(SAME_LABELSET));
                }
            }
            t += step;
        }
        Ok(QueryResult::Matrix(series.finish()))
    }
}

/// Samples gathered step by step into series, found by the hash of their labels.
#[derive(Default)]
struct Accumulator {
    index: rustc_hash::FxHashMap<u64, Vec<usize>>,
    /// Series by the address of a label set seen at an earlier step (a selector's series
    /// hands the same set at every step), the sets kept alive so that no address is reused.
    by_address: rustc_hash::FxHashMap<usize, usize>,
    owners: Vec<Arc<Labels>>,
    series: Vec<Loaded>,
}

impl Accumulator {
    /// Adds a sample; false when its series already has one at `t`.
    fn push(&mut self, labels: Arc<Labels>, t: i64, v: f64) -> bool {
        let address = Arc::as_ptr(&labels) as usize;
        if let Some(&i) = self.by_address.get(&address) {
            return self.add(i, t, v);
        }
        // only a set held elsewhere too (a selector's, a memo's) comes back at later steps;
        // one made for this step alone is not worth keeping alive
        let shared = Arc::strong_count(&labels) > 1;
        if shared {
            self.owners.push(labels.clone());
        }
        let mut h = rustc_hash::FxHasher::default();
        labels.hash(&mut h);
        let same = self.index.entry(h.finish()).or_default();
        let i = match same
            .iter()
            .copied()
            .find(|&i| self.series[i].labels == labels)
        {
            Some(i) => i,
            None => {
                self.series.push(Loaded {
                    labels,
                    ..Default::default()
                });
                same.push(self.series.len() - 1);
                self.series.len() - 1
            }
        };
        if shared {
            self.by_address.insert(address, i);
        }
        self.add(i, t, v)
    }

    fn add(&mut self, i: usize, t: i64, v: f64) -> bool {
        let s = &mut self.series[i];
        if s.ts.last() == Some(&t) {
            return false;
        }
        s.ts.push(t);
        s.vs.push(v);
        true
    }

    /// The series, sorted by labels.
    fn finish(mut self) -> Vec<Loaded> {
        self.series.sort_by(|a, b| a.labels.cmp(&b.labels));
        self.series
    }
}

impl<'a> Evaluator<'a> {
    pub(super) fn new(source: &'a Source, start: i64, end: i64) -> Self {
        Self {
            source,
            start,
            end,
            lookback: LOOKBACK_MS,
            data: HashMap::new(),
        }
    }

    /// The time an `@` modifier fixes (`None` without one).
    pub(super) fn at_time(&self, at: &Option<AtModifier>) -> Option<i64> {
        match at {
            None => None,
            Some(AtModifier::Start) => Some(self.start),
            Some(AtModifier::End) => Some(self.end),
            Some(AtModifier::At(t)) => Some(system_ms(t)),
        }
    }

    /// Reads every selector's data for the evaluation times `[lo, hi]` of `e`.
    pub(super) fn load(&mut self, e: &Expr, lo: i64, hi: i64) -> Result<(), PromError> {
        match e {
            Expr::VectorSelector(vs) => self.load_selector(vs, lo, hi, self.lookback),
            Expr::MatrixSelector(m) => self.load_selector(&m.vs, lo, hi, ms(&m.range)),
            Expr::Subquery(sq) => {
                let (lo, hi) = self.at_time(&sq.at).map_or((lo, hi), |a| (a, a));
                let off = offset_ms(&sq.offset);
                self.load(&sq.expr, lo - off - ms(&sq.range), hi - off)
            }
            Expr::Aggregate(a) => {
                if let Some(p) = &a.param {
                    self.load(p, lo, hi)?;
                }
                self.load(&a.expr, lo, hi)
            }
            Expr::Unary(u) => self.load(&u.expr, lo, hi),
            Expr::Binary(b) => {
                self.load(&b.lhs, lo, hi)?;
                self.load(&b.rhs, lo, hi)
            }
            Expr::Paren(p) => self.load(&p.expr, lo, hi),
            Expr::Call(c) => {
                for a in &c.args.args {
                    self.load(a, lo, hi)?;
                }
                Ok(())
            }
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => Ok(()),
        }
    }

    fn load_selector(
        &mut self,
        vs: &VectorSelector,
        lo: i64,
        hi: i64,
        back: i64,
    ) -> Result<(), PromError> {
        let (lo, hi) = self.at_time(&vs.at).map_or((lo, hi), |a| (a, a));
        let off = offset_ms(&vs.offset);
        let matchers = selector_matchers(vs);
        let refs: Vec<&Matcher> = matchers.iter().collect();
        let loaded = self.source.select(&refs, lo - off - back, hi - off)?;
        // each selector node is loaded once, with the widest window any evaluation of it needs
        self.data.insert(key(vs), Arc::new(loaded));
        Ok(())
    }

    /// The time a selector reads at when evaluated at `ts`.
    fn ref_time(&self, vs: &VectorSelector, ts: i64) -> i64 {
        self.at_time(&vs.at).unwrap_or(ts) - offset_ms(&vs.offset)
    }

    fn series_of(&self, vs: &VectorSelector) -> Arc<Vec<Loaded>> {
        self.data.get(&key(vs)).cloned().unwrap_or_default()
    }

    pub(super) fn eval(&self, e: &Expr, ts: i64) -> Result<Value, PromError> {
        match e {
            Expr::NumberLiteral(n) => Ok(Value::Scalar(n.val)),
            Expr::StringLiteral(s) => Ok(Value::Str(s.val.clone())),
            Expr::Paren(p) => self.eval(&p.expr, ts),
            Expr::Unary(u) => match self.eval(&u.expr, ts)? {
                Value::Scalar(v) => Ok(Value::Scalar(-v)),
                Value::Vector(v) => Ok(Value::Vector(
                    v.into_iter()
                        .map(|mut s| {
                            drop_name(&mut s.labels);
                            s.v = -s.v;
                            s
                        })
                        .collect(),
                )),
                _ => Err(PromError::bad_data("unary minus of a non-numeric value")),
            },
            Expr::VectorSelector(vs) => Ok(Value::Vector(self.instant(vs, ts))),
            Expr::MatrixSelector(m) => {
                let t = self.ref_time(&m.vs, ts);
                Ok(Value::Matrix(self.range(&m.vs, t - ms(&m.range), t)))
            }
            Expr::Subquery(sq) => {
                let at = self.at_time(&sq.at).unwrap_or(ts);
                let end = at - offset_ms(&sq.offset);
                let begin = end - ms(&sq.range);
                let step = sq.step.as_ref().map_or(DEFAULT_SUBQUERY_STEP_MS, ms).max(1);
                let mut t = step * begin.div_euclid(step);
                if t < begin {
                    t += step;
                }
                let mut series = Accumulator::default();
                while t <= end {
                    let samples = match self.eval(&sq.expr, t)? {
                        Value::Scalar(v) => vec![Sample {
                            labels: Default::default(),
                            v,
                            t,
                        }],
                        Value::Vector(v) => v,
                        _ => return Err(PromError::bad_data("subquery of a non-vector")),
                    };
                    for s in samples {
                        if !series.push(s.labels, t, s.v) {
                            return Err(PromError::execution(SAME_LABELSET));
                        }
                    }
                    t += step;
                }
                Ok(Value::Matrix(series.finish()))
            }
            Expr::Call(c) => super::functions::call(self, c, ts),
            Expr::Aggregate(a) => self.aggregate(a, ts),
            Expr::Binary(b) => self.binary(b, ts),
            Expr::Extension(_) => Err(PromError::bad_data("unsupported expression")),
        }
    }

    /// The newest sample of each series at or before the selector's time, within the
    /// lookback delta, unless it is a stale marker.
    fn instant(&self, vs: &VectorSelector, ts: i64) -> Vec<Sample> {
        let t = self.ref_time(vs, ts);
        let mut out = Vec::with_capacity(self.series_of(vs).len());
        for s in self.series_of(vs).iter() {
            let i = s.ts.partition_point(|&x| x <= t);
            if i == 0 {
                continue;
            }
            let (st, v) = (s.ts[i - 1], s.vs[i - 1]);
            if st < t - self.lookback || is_stale(v) {
                continue;
            }
            out.push(Sample {
                labels: s.labels.clone(),
                v,
                t: st,
            });
        }
        out
    }

    /// The samples of each series in `[from, to]`, stale markers left out.
    pub(super) fn range(&self, vs: &VectorSelector, from: i64, to: i64) -> Vec<Loaded> {
        let mut out = Vec::new();
        self.each_window(vs, from, to, |labels, w| {
            out.push(Loaded {
                labels: labels.clone(),
                ts: w.ts.to_vec(),
                vs: w.vs.to_vec(),
            })
        });
        out
    }

    /// What [`Self::range`] gives for a range selector at `ts`, handed to `f` series by
    /// series as borrowed slices.
    pub(super) fn windows(
        &self,
        m: &promql_parser::parser::MatrixSelector,
        ts: i64,
        f: impl FnMut(&Arc<Labels>, &Window),
    ) {
        let to = self.ref_time(&m.vs, ts);
        self.each_window(&m.vs, to - ms(&m.range), to, f)
    }

    /// Each series' samples in `[from, to]` with a sample there, stale markers left out (the
    /// window is copied only where it holds one).
    fn each_window(
        &self,
        vs: &VectorSelector,
        from: i64,
        to: i64,
        mut f: impl FnMut(&Arc<Labels>, &Window),
    ) {
        for s in self.series_of(vs).iter() {
            let lo = s.ts.partition_point(|&x| x < from);
            let hi = s.ts.partition_point(|&x| x <= to);
            let (ts, vs) = (&s.ts[lo..hi], &s.vs[lo..hi]);
            let window = |ts, vs| Window {
                ts,
                vs,
                start: from,
                end: to,
            };
            if vs.iter().any(|v| is_stale(*v)) {
                let (ts, vs): (Vec<i64>, Vec<f64>) = ts
                    .iter()
                    .zip(vs)
                    .filter(|(_, v)| !is_stale(**v))
                    .map(|(t, v)| (*t, *v))
                    .unzip();
                if !ts.is_empty() {
                    f(&s.labels, &window(&ts, &vs));
                }
            } else if !ts.is_empty() {
                f(&s.labels, &window(ts, vs));
            }
        }
    }

    pub(super) fn scalar(&self, e: &Expr, ts: i64) -> Result<f64, PromError> {
        match self.eval(e, ts)? {
            Value::Scalar(v) => Ok(v),
            _ => Err(PromError::bad_data("expected a scalar")),
        }
    }

    pub(super) fn vector(&self, e: &Expr, ts: i64) -> Result<Vec<Sample>, PromError> {
        match self.eval(e, ts)? {
            Value::Vector(v) => Ok(v),
            _ => Err(PromError::bad_data("expected an instant vector")),
        }
    }

    fn aggregate(&self, a: &AggregateExpr, ts: i64) -> Result<Value, PromError> {
        let op = op_name(&a.op);
        let op = op.as_str();
        let samples = self.vector(&a.expr, ts)?;
        let param = match &a.param {
            Some(p) => Some(self.eval(p, ts)?),
            None => None,
        };
        let grouping = |labels: &Labels| -> Labels {
            match &a.modifier {
                None => Labels::new(),
                Some(LabelModifier::Include(ls)) => labels
                    .iter()
                    .filter(|(k, _)| ls.labels.iter().any(|l| l == k))
                    .cloned()
                    .collect(),
                Some(LabelModifier::Exclude(ls)) => labels
                    .iter()
                    .filter(|(k, _)| k != "__name__" && !ls.labels.iter().any(|l| l == k))
                    .cloned()
                    .collect(),
            }
        };
        if op == "count_values" {
            let Some(Value::Str(label)) = param else {
                return Err(PromError::bad_data("count_values needs a label name"));
            };
            let mut groups: BTreeMap<Labels, f64> = BTreeMap::new();
            for s in &samples {
                let mut g = grouping(&s.labels);
                insert(&mut g, label.clone(), super::source::format_float(s.v));
                *groups.entry(g).or_default() += 1.0;
            }
            return Ok(Value::Vector(
                groups
                    .into_iter()
                    .map(|(labels, v)| Sample {
                        labels: Arc::new(labels),
                        v,
                        t: ts,
                    })
                    .collect(),
            ));
        }
        // each sample's group, found by the address of its label set when that set lives on
        // across steps (a selector's, a memo's), else by the group's labels; a group's label
        // set is one `Arc` for the whole query, so that gathering steps into series finds it
        // by address too
        let node = a as *const AggregateExpr as usize;
        let mut groups: Vec<(Arc<Labels>, Vec<Sample>)> = Vec::new();
        GROUPS.with(|m| {
            let mut m = m.borrow_mut();
            let memo = m.entry(node).or_default();
            // the same series in the same order as at the last step: the same groups
            if let Some(last) = memo
                .last
                .as_ref()
                .filter(|l| same_series(&l.inputs, &samples))
            {
                groups = last
                    .groups
                    .iter()
                    .map(|g| (g.clone(), Vec::new()))
                    .collect();
                for (s, g) in samples.into_iter().zip(&last.assign) {
                    groups[*g].1.push(s);
                }
                return;
            }
            let mut index: rustc_hash::FxHashMap<usize, usize> = Default::default();
            let inputs: Vec<Arc<Labels>> = samples.iter().map(|s| s.labels.clone()).collect();
            let mut assign = Vec::with_capacity(samples.len());
            for s in samples {
                let address = Arc::as_ptr(&s.labels) as usize;
                let group = match memo.by_address.get(&address) {
                    Some((_, g)) => g.clone(),
                    None => {
                        let labels = grouping(&s.labels);
                        let g = match memo.by_labels.get(&labels) {
                            Some(g) => g.clone(),
                            None => {
                                let g = Arc::new(labels.clone());
                                memo.by_labels.insert(labels, g.clone());
                                g
                            }
                        };
                        if Arc::strong_count(&s.labels) > 1 {
                            memo.by_address
                                .insert(address, (s.labels.clone(), g.clone()));
                        }
                        g
                    }
                };
                match index.entry(Arc::as_ptr(&group) as usize) {
                    std::collections::hash_map::Entry::Occupied(e) => {
                        assign.push(*e.get());
                        groups[*e.get()].1.push(s)
                    }
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(groups.len());
                        assign.push(groups.len());
                        groups.push((group, vec![s]));
                    }
                }
            }
            memo.last = Some(LastGroups {
                inputs,
                assign,
                groups: groups.iter().map(|(g, _)| g.clone()).collect(),
            });
        });
        let number = |p: &Option<Value>| match p {
            Some(Value::Scalar(v)) => Ok(*v),
            _ => Err(PromError::bad_data(format!(
                "{op} needs a scalar parameter"
            ))),
        };
        let mut out = Vec::new();
        for (labels, group) in groups {
            let values: Vec<f64> = group.iter().map(|s| s.v).collect();
            let n = values.len() as f64;
            let one = |v: f64| Sample {
                labels: labels.clone(),
                v,
                t: ts,
            };
            match op {
                "sum" => out.push(one(values.iter().sum())),
                "avg" => out.push(one(mean(&values))),
                "min" => out
                    .push(one(values.iter().copied().fold(f64::NAN, |a, b| {
                        if a.is_nan() || b < a { b } else { a }
                    }))),
                "max" => out
                    .push(one(values.iter().copied().fold(f64::NAN, |a, b| {
                        if a.is_nan() || b > a { b } else { a }
                    }))),
                "count" => out.push(one(n)),
                "group" => out.push(one(1.0)),
                "stddev" => out.push(one(variance(&values).sqrt())),
                "stdvar" => out.push(one(variance(&values))),
                "quantile" => out.push(one(quantile(number(&param)?, values))),
                "topk" | "bottomk" => {
                    let k = number(&param)?;
                    if k < 1.0 {
                        continue;
                    }
                    let mut g = group;
                    // NaN last either way
                    g.sort_by(|a, b| {
                        let (x, y) = (a.v, b.v);
                        match (x.is_nan(), y.is_nan()) {
                            (true, true) => std::cmp::Ordering::Equal,
                            (true, false) => std::cmp::Ordering::Greater,
                            (false, true) => std::cmp::Ordering::Less,
                            _ if op == "topk" => y.total_cmp(&x),
                            _ => x.total_cmp(&y),
                        }
                    });
                    g.truncate(k.min(g.len() as f64) as usize);
                    for mut s in g {
                        s.t = ts;
                        out.push(s);
                    }
                }
                other => {
                    return Err(PromError::bad_data(format!(
                        "aggregation {other} is not supported"
                    )));
                }
            }
        }
        Ok(Value::Vector(out))
    }

    fn binary(&self, b: &BinaryExpr, ts: i64) -> Result<Value, PromError> {
        let op = op_name(&b.op);
        let op = op.as_str();
        let return_bool = b.return_bool();
        let lhs = self.eval(&b.lhs, ts)?;
        let rhs = self.eval(&b.rhs, ts)?;
        let comparison = is_comparison(op);
        match (lhs, rhs) {
            (Value::Scalar(x), Value::Scalar(y)) => {
                let v = apply(op, x, y);
                if comparison {
                    if !return_bool {
                        return Err(PromError::bad_data(
                            "comparisons between scalars must use BOOL modifier",
                        ));
                    }
                    return Ok(Value::Scalar(if v.1 { 1.0 } else { 0.0 }));
                }
                Ok(Value::Scalar(v.0))
            }
            (Value::Vector(v), Value::Scalar(y)) => Ok(Value::Vector(scalar_op(
                op,
                v,
                y,
                false,
                comparison,
                return_bool,
            ))),
            (Value::Scalar(x), Value::Vector(v)) => Ok(Value::Vector(scalar_op(
                op,
                v,
                x,
                true,
                comparison,
                return_bool,
            ))),
            (Value::Vector(l), Value::Vector(r)) => self.vector_op(b, op, l, r, ts),
            _ => Err(PromError::bad_data(format!(
                "binary expression {op} must have numeric operands"
            ))),
        }
    }

    fn vector_op(
        &self,
        b: &BinaryExpr,
        op: &str,
        lhs: Vec<Sample>,
        rhs: Vec<Sample>,
        ts: i64,
    ) -> Result<Value, PromError> {
        let modifier = b.modifier.as_ref();
        let matching = modifier.and_then(|m| m.matching.as_ref());
        let card = modifier.map_or(&VectorMatchCardinality::OneToOne, |m| &m.card);
        let in_signature = |k: &str| -> bool {
            match matching {
                Some(LabelModifier::Include(ls)) => ls.labels.iter().any(|x| x == k),
                Some(LabelModifier::Exclude(ls)) => {
                    k != "__name__" && !ls.labels.iter().any(|x| x == k)
                }
                None => k != "__name__",
            }
        };
        let node = b as *const BinaryExpr as usize;
        let sig_hash = |l: &Arc<Labels>| -> u64 {
            memo_hash(node, l, |l| {
                let mut h = rustc_hash::FxHasher::default();
                for (k, v) in l.iter().filter(|(k, _)| in_signature(k)) {
                    k.hash(&mut h);
                    v.hash(&mut h);
                }
                h.finish()
            })
        };
        let sig_eq = |a: &Labels, b: &Labels| {
            a.iter()
                .filter(|(k, _)| in_signature(k))
                .eq(b.iter().filter(|(k, _)| in_signature(k)))
        };
        // samples of a side by signature hash (equal hashes are told apart by `sig_eq`)
        let index = |side: &[Sample]| -> rustc_hash::FxHashMap<u64, Vec<usize>> {
            let mut map: rustc_hash::FxHashMap<u64, Vec<usize>> =
                rustc_hash::FxHashMap::with_capacity_and_hasher(side.len(), Default::default());
            for (i, s) in side.iter().enumerate() {
                map.entry(sig_hash(&s.labels)).or_default().push(i);
            }
            map
        };
        let find =
            |map: &rustc_hash::FxHashMap<u64, Vec<usize>>, side: &[Sample], l: &Arc<Labels>| {
                map.get(&sig_hash(l))
                    .and_then(|c| c.iter().copied().find(|&i| sig_eq(&side[i].labels, l)))
            };
        match op {
            "and" | "unless" => {
                let right = index(&rhs);
                let keep_matched = op == "and";
                return Ok(Value::Vector(
                    lhs.into_iter()
                        .filter(|s| find(&right, &rhs, &s.labels).is_some() == keep_matched)
                        .collect(),
                ));
            }
            "or" => {
                let left = index(&lhs);
                let extra: Vec<Sample> = rhs
                    .into_iter()
                    .filter(|s| find(&left, &lhs, &s.labels).is_none())
                    .collect();
                let mut out = lhs;
                out.extend(extra);
                return Ok(Value::Vector(out));
            }
            _ => {}
        }
        let comparison = is_comparison(op);
        let return_bool = b.return_bool();
        // the "one" side, by signature
        let (one, many, swapped) = match card {
            VectorMatchCardinality::OneToMany(_) => (lhs, rhs, true),
            _ => (rhs, lhs, false),
        };
        let one_to_one = matches!(card, VectorMatchCardinality::OneToOne);
        // the value of a matched pair, and whether the pair is kept
        let pair_value = |m: &Sample, o: &Sample| -> Option<f64> {
            let (l, r) = if swapped { (o, m) } else { (m, o) };
            let (v, keep) = apply(op, l.v, r.v);
            if comparison && !return_bool && !keep {
                return None;
            }
            Some(match (comparison, return_bool) {
                (true, true) => f64::from(u8::from(keep)),
                (true, false) => l.v,
                _ => v,
            })
        };
        // the pairs found at an earlier step hold while both sides are the same series in
        // the same order (a selector's series at every step where each has a sample)
        let node = b as *const BinaryExpr as usize;
        let planned = PLANS.with(|plans| {
            let plans = plans.borrow();
            let plan = plans.get(&node).filter(|p| p.fits(&one, &many))?;
            Some(
                plan.pairs
                    .iter()
                    .filter_map(|(mi, oi, labels)| {
                        let v = pair_value(&many[*mi], &one[*oi])?;
                        Some(Sample {
                            labels: labels.clone(),
                            v,
                            t: ts,
                        })
                    })
                    .collect::<Vec<_>>(),
            )
        });
        if let Some(out) = planned {
            return Ok(Value::Vector(out));
        }
        let ones = index(&one);
        if ones.values().any(|c| {
            c.iter().enumerate().any(|(j, &x)| {
                c[..j]
                    .iter()
                    .any(|&y| sig_eq(&one[x].labels, &one[y].labels))
            })
        }) {
            let side = if swapped { "left" } else { "right" };
            return Err(PromError::execution(format!(
                "found duplicate series for the match group on the {side} hand-side of the operation; many-to-many matching not allowed: matching labels must be unique on one side"
            )));
        }
        let include: &[String] = match card {
            VectorMatchCardinality::ManyToOne(ls) | VectorMatchCardinality::OneToMany(ls) => {
                &ls.labels
            }
            _ => &[],
        };
        // every matched pair with its answer's labels (which do not depend on the values)
        let mut pairs: Vec<(usize, usize, Arc<Labels>)> = Vec::new();
        for (mi, m) in many.iter().enumerate() {
            let Some(oi) = find(&ones, &one, &m.labels) else {
                continue;
            };
            let o = &one[oi];
            let mut labels = m.labels.clone();
            if one_to_one {
                match matching {
                    Some(LabelModifier::Include(ls)) => {
                        Arc::make_mut(&mut labels).retain(|(k, _)| ls.labels.iter().any(|x| x == k))
                    }
                    Some(LabelModifier::Exclude(ls)) => Arc::make_mut(&mut labels)
                        .retain(|(k, _)| !ls.labels.iter().any(|x| x == k)),
                    None => {}
                }
            }
            if drops_name(op) || (comparison && return_bool) {
                drop_name(&mut labels);
            }
            for name in include {
                match get(&o.labels, name) {
                    Some(v) => insert(Arc::make_mut(&mut labels), name.clone(), v.to_owned()),
                    None => Arc::make_mut(&mut labels).retain(|(k, _)| k != name),
                }
            }
            pairs.push((mi, oi, labels));
        }
        let mut out = Vec::new();
        let mut seen = LabelSet::default();
        for (mi, oi, labels) in &pairs {
            let Some(v) = pair_value(&many[*mi], &one[*oi]) else {
                continue;
            };
            if one_to_one && !seen.insert(labels) {
                return Err(PromError::execution(
                    "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)",
                ));
            }
            out.push(Sample {
                labels: labels.clone(),
                v,
                t: ts,
            });
        }
        // a plan may skip the check of repeated labels only where no two pairs share them,
        // whichever pairs a comparison keeps
        let mut all = LabelSet::default();
        if !one_to_one || pairs.iter().all(|(_, _, l)| all.insert(l)) {
            PLANS.with(|plans| {
                plans.borrow_mut().insert(
                    node,
                    Plan {
                        one: one.iter().map(|s| s.labels.clone()).collect(),
                        many: many.iter().map(|s| s.labels.clone()).collect(),
                        pairs,
                    },
                )
            });
        }
        Ok(Value::Vector(out))
    }
}

/// A binary operator's matched pairs at one step: (sample of the "many" side, sample of the
/// "one" side, the answer's labels), for the series the two sides had then.
struct Plan {
    one: Vec<Arc<Labels>>,
    many: Vec<Arc<Labels>>,
    pairs: Vec<(usize, usize, Arc<Labels>)>,
}

impl Plan {
    /// Whether the sides are the same series, in the same order, as the plan's.
    fn fits(&self, one: &[Sample], many: &[Sample]) -> bool {
        same_series(&self.one, one) && same_series(&self.many, many)
    }
}

/// Whether the samples carry the very label sets kept from an earlier step, in that order.
fn same_series(kept: &[Arc<Labels>], samples: &[Sample]) -> bool {
    kept.len() == samples.len()
        && kept
            .iter()
            .zip(samples)
            .all(|(k, s)| Arc::ptr_eq(k, &s.labels))
}

thread_local! {
    /// Each binary operator's last plan, by the address of its node in the parsed expression.
    static PLANS: std::cell::RefCell<rustc_hash::FxHashMap<usize, Plan>> = Default::default();
}

/// The matchers of a selector, its name among them.
pub fn selector_matchers(vs: &VectorSelector) -> Vec<Matcher> {
    let mut out = vs.matchers.matchers.clone();
    if let Some(name) = &vs.name
        && !out.iter().any(|m| m.name == "__name__")
    {
        out.push(Matcher::new(
            promql_parser::label::MatchOp::Equal,
            "__name__",
            name,
        ));
    }
    out
}

/// Label sets by address: (the set, the set without its name).
type Unnamed = rustc_hash::FxHashMap<usize, (Arc<Labels>, Arc<Labels>)>;

thread_local! {
    /// A query's label sets without their name, by the address of the set they came from
    /// (kept alive here, so that the address is not reused): a series' name is dropped once
    /// per query, not once per step.
    static UNNAMED: std::cell::RefCell<Unnamed> = Default::default();
}

/// An aggregation's groups over a query: by the address of a sample's label set (kept alive
/// here, so that the address is not reused), and by the group's labels.
#[derive(Default)]
struct Groups {
    by_address: rustc_hash::FxHashMap<usize, (Arc<Labels>, Arc<Labels>)>,
    by_labels: HashMap<Labels, Arc<Labels>>,
    /// The last step's samples' label sets (kept alive), each one's group and the groups.
    last: Option<LastGroups>,
}

struct LastGroups {
    inputs: Vec<Arc<Labels>>,
    assign: Vec<usize>,
    groups: Vec<Arc<Labels>>,
}

thread_local! {
    /// Each aggregation's groups (by the address of its node in the parsed expression), so
    /// that a sample's group is worked out once per query, not once per step.
    static GROUPS: std::cell::RefCell<rustc_hash::FxHashMap<usize, Groups>> = Default::default();
}

/// Hashes of label sets by (what is hashed, the set's address), the sets kept alive.
type Hashes = rustc_hash::FxHashMap<(usize, usize), (Arc<Labels>, u64)>;

thread_local! {
    /// Hashes of label sets that live on across steps (a selector's, a memo's), by what is
    /// hashed (0: the whole set; a binary operator's node: its matching signature) and the
    /// set's address: a series is hashed once per query, not once per step.
    static HASHES: std::cell::RefCell<Hashes> = Default::default();
}

/// `hash(l)`, remembered for the rest of the query when `l` is held elsewhere too (a set made
/// for one step alone is hashed each time and not kept alive).
fn memo_hash(what: usize, l: &Arc<Labels>, hash: impl Fn(&Labels) -> u64) -> u64 {
    if Arc::strong_count(l) == 1 {
        return hash(l);
    }
    let key = (what, Arc::as_ptr(l) as usize);
    HASHES.with(|m| {
        let mut m = m.borrow_mut();
        if let Some((_, h)) = m.get(&key) {
            return *h;
        }
        let h = hash(l);
        m.insert(key, (l.clone(), h));
        h
    })
}

/// Forgets the memos (unnamed label sets, groups, hashes, plans) of the query that ran before
/// on this thread.
fn forget_query_memos() {
    UNNAMED.with(|m| m.borrow_mut().clear());
    GROUPS.with(|m| m.borrow_mut().clear());
    HASHES.with(|m| m.borrow_mut().clear());
    PLANS.with(|m| m.borrow_mut().clear());
}

pub(super) fn drop_name(labels: &mut Arc<Labels>) {
    if !labels.iter().any(|(k, _)| k == "__name__") {
        return;
    }
    let key = Arc::as_ptr(labels) as usize;
    UNNAMED.with(|m| {
        let mut m = m.borrow_mut();
        if let Some((_, unnamed)) = m.get(&key) {
            *labels = unnamed.clone();
            return;
        }
        let mut unnamed = (**labels).clone();
        unnamed.retain(|(k, _)| k != "__name__");
        let unnamed = Arc::new(unnamed);
        m.insert(key, (labels.clone(), unnamed.clone()));
        *labels = unnamed;
    });
}

/// Arithmetic drops the metric name (Prometheus 2 keeps it for `atan2`).
fn drops_name(op: &str) -> bool {
    matches!(op, "+" | "-" | "*" | "/" | "%" | "^")
}

fn is_comparison(op: &str) -> bool {
    matches!(op, "==" | "!=" | ">" | "<" | ">=" | "<=")
}

/// The result of an arithmetic operator, and whether a comparison holds.
fn apply(op: &str, x: f64, y: f64) -> (f64, bool) {
    match op {
        "+" => (x + y, true),
        "-" => (x - y, true),
        "*" => (x * y, true),
        "/" => (x / y, true),
        "%" => (x % y, true),
        "^" => (x.powf(y), true),
        "atan2" => (x.atan2(y), true),
        "==" => (x, x == y),
        "!=" => (x, x != y),
        ">" => (x, x > y),
        "<" => (x, x < y),
        ">=" => (x, x >= y),
        "<=" => (x, x <= y),
        _ => (f64::NAN, false),
    }
}

/// A vector and a scalar (`scalar_left`: the scalar is the left operand).
fn scalar_op(
    op: &str,
    v: Vec<Sample>,
    y: f64,
    scalar_left: bool,
    comparison: bool,
    return_bool: bool,
) -> Vec<Sample> {
    let mut out = Vec::with_capacity(v.len());
    for mut s in v {
        let (l, r) = if scalar_left { (y, s.v) } else { (s.v, y) };
        let (value, keep) = apply(op, l, r);
        if comparison {
            if return_bool {
                s.v = if keep { 1.0 } else { 0.0 };
                drop_name(&mut s.labels);
            } else if !keep {
                continue;
            } else {
                // the vector's value passes through
                s.v = if scalar_left { r } else { l };
            }
        } else {
            s.v = value;
            if drops_name(op) {
                drop_name(&mut s.labels);
            }
        }
        out.push(s);
    }
    out
}

pub(super) fn mean(values: &[f64]) -> f64 {
    let mut mean = 0.0f64;
    for (i, v) in values.iter().enumerate() {
        let n = (i + 1) as f64;
        if mean.is_infinite() {
            if v.is_infinite() && (mean > 0.0) == (*v > 0.0) {
                continue;
            }
            if !v.is_infinite() && !v.is_nan() {
                continue;
            }
        }
        mean += v / n - mean / n;
    }
    mean
}

pub(super) fn variance(values: &[f64]) -> f64 {
    let (mut count, mut mean, mut m2) = (0.0, 0.0, 0.0);
    for v in values {
        count += 1.0;
        let delta = v - mean;
        mean += delta / count;
        m2 += delta * (v - mean);
    }
    m2 / count
}

/// Prometheus's quantile: linear interpolation between the closest ranks.
pub(super) fn quantile(q: f64, mut values: Vec<f64>) -> f64 {
    if values.is_empty() || q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len() as f64;
    let rank = q * (n - 1.0);
    let lower = rank.floor().max(0.0);
    let upper = (lower + 1.0).min(n - 1.0);
    let weight = rank - rank.floor();
    values[lower as usize] * (1.0 - weight) + values[upper as usize] * weight
}
