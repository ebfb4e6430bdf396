//! TraceQL search: each spanset filter selects its spans through SQL (the row selection every
//! query shares), then spansets are combined per trace (`&&`, `||`, the structural operators),
//! the pipeline runs over them, and the newest matching traces are summarised.
//!
//! Order is deterministic: traces newest first by their start, then by id (descending);
//! spans inside a spanset newest first, then by id.

use std::collections::{BTreeMap, HashMap, HashSet};

use weft_storage::schema::ColumnType;

use super::TraceQlError;
use super::ast::*;
use super::compile::{self, column, predicate};
use crate::analytics::exec::{Rows, Run};
use crate::analytics::params::lit;

/// The most spans one spanset filter reads (newest first); past it the answer is marked
/// partial.
pub const MAX_SPANS_PER_FILTER: usize = 200_000;
/// Trace ids per `IN (…)` list (the store looks them up in its trace-id index).
const ID_CHUNK: usize = 1000;
/// A spanset found in at most this many traces restricts the other side of `&&` or a
/// structural operator to them.
const RESTRICT_MAX: usize = 4000;

/// What a search asks beside the query.
#[derive(Clone, Debug)]
pub struct SearchOptions {
    /// Spans starting at or after (Unix ns).
    pub start: Option<u64>,
    /// Spans starting before (Unix ns).
    pub end: Option<u64>,
    /// Traces to return.
    pub limit: usize,
    /// Spans per spanset to return.
    pub spss: usize,
    pub max_spans: usize,
}

impl Default for SearchOptions {
    fn default() -> Self {
        Self {
            start: None,
            end: None,
            limit: 20,
            spss: 3,
            max_spans: MAX_SPANS_PER_FILTER,
        }
    }
}

/// A typed attribute value of an answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Val {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl Val {
    fn number(&self) -> Option<f64> {
        match self {
            Val::Int(i) => Some(*i as f64),
            Val::Float(f) => Some(*f),
            Val::Str(s) => s.parse().ok(),
            Val::Bool(_) => None,
        }
    }

    fn key(&self) -> String {
        match self {
            Val::Str(s) => format!("s{s}"),
            Val::Int(i) => format!("i{i}"),
            Val::Float(f) => format!("f{f}"),
            Val::Bool(b) => format!("b{b}"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct FoundSpan {
    pub span_id: String,
    pub name: String,
    pub start: i64,
    pub duration_ns: i64,
    pub attributes: Vec<(String, Val)>,
}

#[derive(Clone, Debug)]
pub struct FoundSpanSet {
    pub spans: Vec<FoundSpan>,
    pub matched: usize,
    /// The `by()` values that made this spanset.
    pub attributes: Vec<(String, Val)>,
}

#[derive(Clone, Debug)]
pub struct FoundTrace {
    pub trace_id: String,
    pub root_service: Option<String>,
    pub root_name: Option<String>,
    pub start: i64,
    pub duration_ns: i64,
    pub span_sets: Vec<FoundSpanSet>,
}

#[derive(Clone, Debug, Default)]
pub struct Found {
    pub traces: Vec<FoundTrace>,
    /// Traces that had a matching spanset.
    pub inspected_traces: usize,
    /// Spans the filters selected.
    pub inspected_spans: usize,
    /// A limit cut the answer short (see [`MAX_SPANS_PER_FILTER`], the time budget).
    pub partial: bool,
}

/// One selected span: its identity, timing and the values of the fields the query returns.
struct Row {
    trace: String,
    span: String,
    parent: Option<String>,
    name: String,
    start: i64,
    duration: i64,
    extra: Vec<Option<Val>>,
}

/// A spanset of one trace: row indexes and the `by()` labels that made it.
#[derive(Clone, Debug, Default)]
struct Group {
    rows: Vec<usize>,
    labels: Vec<(String, Val)>,
}

/// Spans per trace (one spanset each).
type Sets = HashMap<String, Vec<usize>>;
/// Spansets per trace (a pipeline may split a trace's spans).
type Groups = HashMap<String, Vec<Group>>;

struct Eval<'r, 'a> {
    run: &'r mut Run<'a>,
    opts: &'r SearchOptions,
    /// The fields every selected row carries a value of.
    fields: Vec<Field>,
    rows: Vec<Row>,
    index: HashMap<(String, String), usize>,
    /// Parents of the spans of traces seen by a structural operator.
    tree: HashMap<String, HashMap<String, Option<String>>>,
    /// Only these traces are read (looked up in the trace-id index), when set.
    restrict: Option<Vec<String>>,
    partial: bool,
}

/// Runs a TraceQL search (a query without a metrics function).
pub async fn search(
    run: &mut Run<'_>,
    query: &Query,
    opts: &SearchOptions,
) -> Result<Found, TraceQlError> {
    if query.metrics.is_some() {
        return Err(TraceQlError::Invalid(
            "a metrics query (rate(), …_over_time()) is answered by /api/metrics/query_range, not search".into(),
        ));
    }
    let service = Field::Attr(Scope::Resource, "service.name".into());
    let mut e = Eval::new(run, opts, &query.pipeline, &[service]);
    let found = e
        .newest_first(driver(&query.pipeline.source).as_ref(), &query.pipeline)
        .await?;
    Ok(Found {
        inspected_spans: e.rows.len(),
        partial: e.partial,
        ..found
    })
}

/// A filter every trace the spanset matches has a span of (`None`: any span): the right-hand
/// side of `&&` and of the structural operators (their answers are right-hand spans), either
/// side of `||`.
fn driver(s: &Spanset) -> Option<FieldExpr> {
    match s {
        Spanset::Filter(e) => e.clone(),
        Spanset::Pipeline(p) => driver(&p.source),
        Spanset::Binary(a, SetOp::Or, b) => match (driver(a), driver(b)) {
            (Some(x), Some(y)) => Some(FieldExpr::Or(Box::new(x), Box::new(y))),
            _ => None,
        },
        Spanset::Binary(_, _, b) => driver(b),
    }
}

/// The attribute fields a query names (filters, aggregates, `by`, `select`), in order of first
/// mention; they come back on the spans returned, as Tempo returns them.
fn collect_fields(p: &Pipeline, out: &mut Vec<Field>) {
    fn push(out: &mut Vec<Field>, f: &Field) {
        if column(f).is_some() && !out.contains(f) {
            out.push(f.clone());
        }
    }
    fn expr(e: &FieldExpr, out: &mut Vec<Field>) {
        match e {
            FieldExpr::Cmp(f, ..) => {
                if matches!(f, Field::Attr(..)) {
                    push(out, f)
                }
            }
            FieldExpr::And(a, b) | FieldExpr::Or(a, b) => {
                expr(a, out);
                expr(b, out);
            }
            FieldExpr::Not(a) => expr(a, out),
            FieldExpr::Const(_) => {}
        }
    }
    fn spanset(s: &Spanset, out: &mut Vec<Field>) {
        match s {
            Spanset::Filter(Some(e)) => expr(e, out),
            Spanset::Filter(None) => {}
            Spanset::Binary(a, _, b) => {
                spanset(a, out);
                spanset(b, out);
            }
            Spanset::Pipeline(p) => collect_fields(p, out),
        }
    }
    spanset(&p.source, out);
    for stage in &p.stages {
        match stage {
            Stage::Filter(Some(e)) => expr(e, out),
            Stage::Aggregate(
                Aggregate::Avg(f) | Aggregate::Min(f) | Aggregate::Max(f) | Aggregate::Sum(f),
                ..,
            ) => push(out, f),
            Stage::By(fs) | Stage::Select(fs) => fs.iter().for_each(|f| push(out, f)),
            _ => {}
        }
    }
}

/// The label Tempo gives a field in answers (`http.status_code`, `service.name`, `status`).
pub fn label(f: &Field) -> String {
    match f {
        Field::Attr(_, k) => k.clone(),
        Field::Intrinsic(i) => i.tag_name().to_owned(),
    }
}

impl<'r, 'a> Eval<'r, 'a> {
    /// An evaluation whose rows carry the fields `pipeline` names, then `extra`.
    fn new(
        run: &'r mut Run<'a>,
        opts: &'r SearchOptions,
        pipeline: &Pipeline,
        extra: &[Field],
    ) -> Self {
        let mut fields = Vec::new();
        collect_fields(pipeline, &mut fields);
        for f in extra {
            if column(f).is_some() && !fields.contains(f) {
                fields.push(f.clone());
            }
        }
        Eval {
            run,
            opts,
            fields,
            rows: Vec::new(),
            index: HashMap::new(),
            tree: HashMap::new(),
            restrict: None,
            partial: false,
        }
    }
}

impl Eval<'_, '_> {
    fn pipeline<'s>(
        &'s mut self,
        p: &'s Pipeline,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Groups, TraceQlError>> + Send + 's>> {
        Box::pin(async move {
            let sets = self.spanset(&p.source).await?;
            let mut groups: Groups = sets
                .into_iter()
                .map(|(t, rows)| {
                    (
                        t,
                        vec![Group {
                            rows,
                            labels: vec![],
                        }],
                    )
                })
                .collect();
            for stage in &p.stages {
                groups = self.stage(stage, groups).await?;
            }
            Ok(groups)
        })
    }

    fn spanset<'s>(
        &'s mut self,
        s: &'s Spanset,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Sets, TraceQlError>> + Send + 's>> {
        Box::pin(async move {
            match s {
                Spanset::Filter(e) => {
                    let restrict = self.restrict.clone();
                    self.filter(e.as_ref(), restrict.as_deref()).await
                }
                Spanset::Pipeline(p) => {
                    let groups = self.pipeline(p).await?;
                    Ok(flatten(groups))
                }
                Spanset::Binary(a, SetOp::Or, b) => {
                    let left = self.spanset(a).await?;
                    let right = self.spanset(b).await?;
                    self.combine(left, SetOp::Or, right).await
                }
                Spanset::Binary(a, op, b) => {
                    // both sides must hold in a trace: read the side with fewer spans first,
                    // then the other only in the traces it found (trace-id index lookups)
                    let left_first = match (a.as_ref(), b.as_ref()) {
                        // inside a few traces either order is cheap
                        _ if self.restrict.is_some() => true,
                        (Spanset::Filter(ea), Spanset::Filter(eb)) => {
                            self.count(ea.as_ref()).await? <= self.count(eb.as_ref()).await?
                        }
                        _ => true,
                    };
                    let (x, y) = if left_first { (a, b) } else { (b, a) };
                    let first = self.spanset(x).await?;
                    if first.is_empty() {
                        return Ok(Sets::new());
                    }
                    let saved = self.restrict.clone();
                    if first.len() <= RESTRICT_MAX {
                        let mut ids: Vec<String> = first.keys().cloned().collect();
                        ids.sort_unstable();
                        self.restrict = Some(ids);
                    }
                    let second = self.spanset(y).await;
                    self.restrict = saved;
                    let second = second?;
                    let (left, right) = if left_first {
                        (first, second)
                    } else {
                        (second, first)
                    };
                    self.combine(left, *op, right).await
                }
            }
        })
    }

    /// How many spans a filter selects (from the postings where they answer).
    async fn count(&mut self, e: Option<&FieldExpr>) -> Result<u64, TraceQlError> {
        let (join, conds) = self.conditions(e, None);
        let rows = self
            .run
            .sql(&format!("SELECT count(*) FROM spans s{join} WHERE {conds}"))
            .await?;
        Ok(rows.i64(0).first().copied().flatten().unwrap_or(0) as u64)
    }

    /// The join and the `WHERE` conditions of a filter (the time range, the traces asked for).
    fn conditions(&self, e: Option<&FieldExpr>, also: Option<&str>) -> (&'static str, String) {
        let mut conds = vec!["TRUE".to_owned()];
        if let Some(s) = self.opts.start {
            conds.push(format!(
                "s.start_time >= {}",
                crate::analytics::params::ts(s)
            ));
        }
        if let Some(end) = self.opts.end {
            conds.push(format!(
                "s.start_time < {}",
                crate::analytics::params::ts(end)
            ));
        }
        if let Some(a) = also {
            conds.push(a.to_owned());
        }
        if let Some(e) = e {
            conds.push(predicate(e));
        }
        let join = if e.is_some_and(compile::needs_traces) {
            " JOIN traces t ON t.trace_id = s.trace_id"
        } else {
            ""
        };
        (join, conds.join(" AND "))
    }

    /// A search, newest first without reading every match: the newest `k` spans matching the
    /// query's [`driver`] name the candidate traces; summarised (from the trace-id index) and
    /// taken newest start first, they are evaluated exactly (the whole pipeline, in those
    /// traces only) in growing batches until a page qualifies. A trace that is not a candidate
    /// has all its matches at or before the oldest span read, so it starts no later: the page
    /// is exact once its last trace starts after that; otherwise `k` grows.
    async fn newest_first(
        &mut self,
        filter: Option<&FieldExpr>,
        pipeline: &Pipeline,
    ) -> Result<Found, TraceQlError> {
        let limit = self.opts.limit.max(1);
        let mut k = (limit * 16).max(256).min(self.opts.max_spans);
        // after a first round: every match since this start (the page's last trace's)
        let mut since: Option<i64> = None;
        // traces evaluated in an earlier round, and whether they qualified
        let mut done: HashMap<String, Option<Vec<Group>>> = HashMap::new();
        let mut evaluated = 0;
        loop {
            let bound = since.map(|t| format!("s.start_time >= {}", ts_ns(t)));
            let (join, conds) = self.conditions(filter, bound.as_deref());
            let cap = if since.is_some() {
                self.opts.max_spans
            } else {
                k
            };
            let rows = self
                .run
                .sql(&format!(
                    "SELECT trace_id, count(*), CAST(min(st) AS BIGINT) FROM (SELECT s.trace_id, s.start_time AS st FROM spans s{join} WHERE {conds} ORDER BY s.start_time DESC LIMIT {cap}) m GROUP BY trace_id"
                ))
                .await?;
            let read: i64 = rows.i64(1).iter().flatten().sum();
            let capped = read as usize >= cap;
            // every trace not among the candidates has its matches at or before this
            let cutoff = rows.i64(2).into_iter().flatten().min().unwrap_or(i64::MIN);
            let ids: Vec<String> = rows.strings(0).into_iter().flatten().collect();
            if ids.len() > RESTRICT_MAX {
                // too many traces to look up one by one: evaluate the query once over all
                let groups = self.pipeline(pipeline).await?;
                let ids: Vec<String> = groups.keys().cloned().collect();
                let mut summaries = self.summaries(&ids).await?;
                return Ok(self.found(&mut summaries, groups, ids.len()));
            }
            // candidates newest start first; evaluated exactly in growing batches until a
            // page of them qualifies
            let mut candidates = self.summaries(&ids).await?;
            candidates.sort_unstable_by(|a, b| (b.start, &b.trace).cmp(&(a.start, &a.trace)));
            let mut kept: Vec<Summary> = Vec::new();
            let mut size = (limit * 2).max(16);
            let mut rest = candidates;
            while kept.len() < limit && !rest.is_empty() {
                let tail = rest.split_off(size.min(rest.len()));
                let chunk = std::mem::replace(&mut rest, tail);
                size = (size * 2).min(RESTRICT_MAX);
                let new: Vec<String> = chunk
                    .iter()
                    .filter(|s| !done.contains_key(&s.trace))
                    .map(|s| s.trace.clone())
                    .collect();
                if !new.is_empty() {
                    evaluated += new.len();
                    self.restrict = Some(new.clone());
                    let found = self.pipeline(pipeline).await;
                    self.restrict = None;
                    let mut found = found?;
                    for t in new {
                        let g = found.remove(&t);
                        done.insert(t, g);
                    }
                }
                kept.extend(chunk.into_iter().filter(|s| done[&s.trace].is_some()));
            }
            let exact = !capped || (kept.len() >= limit && kept[limit - 1].start > cutoff);
            if exact || (since.is_some() || k >= self.opts.max_spans) {
                if !exact {
                    self.partial = true;
                }
                kept.truncate(limit);
                let groups: Groups = kept
                    .iter()
                    .filter_map(|s| Some((s.trace.clone(), done.get_mut(&s.trace)?.take()?)))
                    .collect();
                return Ok(self.found(&mut kept, groups, evaluated));
            }
            if kept.len() >= limit {
                // read back to the page's last trace start: then the page is exact
                since = Some(kept[limit - 1].start);
            } else if kept.is_empty() {
                // nothing qualified: a rare answer, read every match at once
                k = self.opts.max_spans;
            } else {
                k = (k * 8).min(self.opts.max_spans);
            }
        }
    }

    /// The spans matching a filter, per trace; only in `traces` when given.
    async fn filter(
        &mut self,
        e: Option<&FieldExpr>,
        traces: Option<&[String]>,
    ) -> Result<Sets, TraceQlError> {
        let mut sets = Sets::new();
        match traces {
            None => self.select(e, None, &mut sets).await?,
            Some(ids) => {
                for chunk in ids.chunks(ID_CHUNK) {
                    let list = chunk.iter().map(|t| lit(t)).collect::<Vec<_>>().join(", ");
                    self.select(e, Some(&format!("s.trace_id IN ({list})")), &mut sets)
                        .await?;
                }
            }
        }
        for rows in sets.values_mut() {
            rows.sort_unstable();
            rows.dedup();
        }
        Ok(sets)
    }

    async fn select(
        &mut self,
        e: Option<&FieldExpr>,
        also: Option<&str>,
        sets: &mut Sets,
    ) -> Result<(), TraceQlError> {
        let (join, conds) = self.conditions(e, also);
        let extra: String = self
            .fields
            .iter()
            .enumerate()
            .map(|(i, f)| {
                format!(
                    ", CAST({} AS VARCHAR) AS f{i}",
                    column(f).expect("fields have columns").sql
                )
            })
            .collect();
        let cap = self.opts.max_spans;
        let sql = format!(
            "SELECT s.trace_id, s.span_id, s.parent_span_id, s.name, CAST(s.start_time AS BIGINT) AS st, s.duration_ns{extra} FROM spans s{join} WHERE {conds} ORDER BY s.start_time DESC, s.span_id DESC LIMIT {}",
            cap + 1
        );
        let rows = self.run.sql(&sql).await?;
        if rows.len() > cap {
            self.partial = true;
        }
        self.absorb(&rows, cap, sets);
        Ok(())
    }

    /// Adds selected rows to the arena (once per span) and to `sets`.
    fn absorb(&mut self, rows: &Rows, cap: usize, sets: &mut Sets) {
        let trace = rows.strings(0);
        let span = rows.strings(1);
        let parent = rows.strings(2);
        let name = rows.strings(3);
        let start = rows.i64(4);
        let duration = rows.i64(5);
        let extra: Vec<Vec<Option<String>>> = (0..self.fields.len())
            .map(|i| rows.strings(6 + i))
            .collect();
        let types: Vec<ColumnType> = self
            .fields
            .iter()
            .map(|f| column(f).expect("fields have columns").ty)
            .collect();
        for i in 0..trace.len().min(cap) {
            let (Some(t), Some(s)) = (&trace[i], &span[i]) else {
                continue;
            };
            let key = (t.clone(), s.clone());
            let idx = match self.index.get(&key) {
                Some(&idx) => idx,
                None => {
                    let idx = self.rows.len();
                    self.rows.push(Row {
                        trace: t.clone(),
                        span: s.clone(),
                        parent: parent[i].clone().filter(|p| !p.is_empty()),
                        name: name[i].clone().unwrap_or_default(),
                        start: start[i].unwrap_or(0),
                        duration: duration[i].unwrap_or(0),
                        extra: extra
                            .iter()
                            .zip(&types)
                            .zip(&self.fields)
                            .map(|((c, ty), f)| c[i].as_deref().map(|v| typed(f, *ty, v)))
                            .collect(),
                    });
                    self.index.insert(key, idx);
                    idx
                }
            };
            sets.entry(t.clone()).or_default().push(idx);
        }
    }

    async fn combine(&mut self, left: Sets, op: SetOp, right: Sets) -> Result<Sets, TraceQlError> {
        let mut out = Sets::new();
        match op {
            SetOp::Or => {
                out = left;
                for (t, rows) in right {
                    let e = out.entry(t).or_default();
                    e.extend(rows);
                    e.sort_unstable();
                    e.dedup();
                }
            }
            SetOp::And => {
                for (t, mut rows) in left {
                    if let Some(r) = right.get(&t) {
                        rows.extend(r);
                        rows.sort_unstable();
                        rows.dedup();
                        out.insert(t, rows);
                    }
                }
            }
            SetOp::Child | SetOp::Parent | SetOp::Sibling => {
                for (t, l) in &left {
                    let Some(r) = right.get(t) else { continue };
                    let lspans: HashSet<&str> =
                        l.iter().map(|&i| self.rows[i].span.as_str()).collect();
                    let lparents: HashSet<&str> = l
                        .iter()
                        .filter_map(|&i| self.rows[i].parent.as_deref())
                        .collect();
                    let keep: Vec<usize> = r
                        .iter()
                        .copied()
                        .filter(|&i| {
                            let row = &self.rows[i];
                            match op {
                                SetOp::Child => {
                                    row.parent.as_deref().is_some_and(|p| lspans.contains(p))
                                }
                                SetOp::Parent => lparents.contains(row.span.as_str()),
                                _ => row.parent.as_deref().is_some_and(|p| {
                                    l.iter().any(|&j| {
                                        j != i && self.rows[j].parent.as_deref() == Some(p)
                                    })
                                }),
                            }
                        })
                        .collect();
                    if !keep.is_empty() {
                        out.insert(t.clone(), keep);
                    }
                }
            }
            SetOp::Descendant | SetOp::Ancestor => {
                let both: Vec<String> = left
                    .keys()
                    .filter(|t| right.contains_key(*t))
                    .cloned()
                    .collect();
                self.load_trees(&both).await?;
                for t in &both {
                    let tree = &self.tree[t];
                    let l = &left[t];
                    let lspans: HashSet<&str> =
                        l.iter().map(|&i| self.rows[i].span.as_str()).collect();
                    // the ancestors of every left-hand span (for `<<`)
                    let mut lancestors: HashSet<&str> = HashSet::new();
                    if op == SetOp::Ancestor {
                        for &i in l {
                            for a in ancestors(tree, &self.rows[i].span) {
                                lancestors.insert(a);
                            }
                        }
                    }
                    let keep: Vec<usize> = right[t]
                        .iter()
                        .copied()
                        .filter(|&i| {
                            let span = &self.rows[i].span;
                            if op == SetOp::Descendant {
                                ancestors(tree, span).any(|a| lspans.contains(a))
                            } else {
                                lancestors.contains(span.as_str())
                            }
                        })
                        .collect();
                    if !keep.is_empty() {
                        out.insert(t.clone(), keep);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Loads the parent links of whole traces (two ids per span, from the trace-id index).
    async fn load_trees(&mut self, traces: &[String]) -> Result<(), TraceQlError> {
        let missing: Vec<&String> = traces
            .iter()
            .filter(|t| !self.tree.contains_key(*t))
            .collect();
        for chunk in missing.chunks(ID_CHUNK) {
            let list = chunk.iter().map(|t| lit(t)).collect::<Vec<_>>().join(", ");
            let rows = self
                .run
                .sql(&format!(
                    "SELECT trace_id, span_id, parent_span_id FROM spans WHERE trace_id IN ({list})"
                ))
                .await?;
            let (t, s, p) = (rows.strings(0), rows.strings(1), rows.strings(2));
            for i in 0..t.len() {
                if let (Some(t), Some(s)) = (&t[i], &s[i]) {
                    self.tree
                        .entry(t.clone())
                        .or_default()
                        .insert(s.clone(), p[i].clone().filter(|p| !p.is_empty()));
                }
            }
            for t in chunk {
                self.tree.entry((*t).clone()).or_default();
            }
        }
        Ok(())
    }

    async fn stage(&mut self, stage: &Stage, groups: Groups) -> Result<Groups, TraceQlError> {
        Ok(match stage {
            Stage::Filter(e) => {
                let traces: Vec<String> = groups.keys().cloned().collect();
                let matching = self.filter(e.as_ref(), Some(&traces)).await?;
                let mut out = Groups::new();
                for (t, gs) in groups {
                    let Some(m) = matching.get(&t) else { continue };
                    let m: HashSet<usize> = m.iter().copied().collect();
                    let kept: Vec<Group> = gs
                        .into_iter()
                        .map(|g| Group {
                            rows: g.rows.into_iter().filter(|r| m.contains(r)).collect(),
                            labels: g.labels,
                        })
                        .filter(|g| !g.rows.is_empty())
                        .collect();
                    if !kept.is_empty() {
                        out.insert(t, kept);
                    }
                }
                out
            }
            Stage::Aggregate(agg, op, value) => {
                let mut out = Groups::new();
                for (t, gs) in groups {
                    let kept: Vec<Group> = gs
                        .into_iter()
                        .filter(|g| self.aggregate(agg, g).is_some_and(|a| op.holds(a, *value)))
                        .collect();
                    if !kept.is_empty() {
                        out.insert(t, kept);
                    }
                }
                out
            }
            Stage::By(fields) => {
                let mut out = Groups::new();
                for (t, gs) in groups {
                    let mut split: Vec<Group> = Vec::new();
                    for g in gs {
                        let mut parts: BTreeMap<String, Group> = BTreeMap::new();
                        for &r in &g.rows {
                            let values: Vec<(String, Val)> = fields
                                .iter()
                                .filter_map(|f| self.value(r, f).map(|v| (label(f), v)))
                                .collect();
                            if values.is_empty() {
                                continue;
                            }
                            let key: String = values
                                .iter()
                                .map(|(_, v)| v.key())
                                .collect::<Vec<_>>()
                                .join("\u{1}");
                            let part = parts.entry(key).or_insert_with(|| Group {
                                rows: vec![],
                                labels: g.labels.iter().cloned().chain(values.clone()).collect(),
                            });
                            part.rows.push(r);
                        }
                        split.extend(parts.into_values());
                    }
                    if !split.is_empty() {
                        out.insert(t, split);
                    }
                }
                out
            }
            Stage::Select(_) => groups,
            Stage::Coalesce => flatten(groups)
                .into_iter()
                .map(|(t, rows)| {
                    (
                        t,
                        vec![Group {
                            rows,
                            labels: vec![],
                        }],
                    )
                })
                .collect(),
        })
    }

    fn value(&self, row: usize, f: &Field) -> Option<Val> {
        let r = &self.rows[row];
        match f {
            Field::Intrinsic(Intrinsic::Duration) => Some(Val::Int(r.duration)),
            Field::Intrinsic(Intrinsic::Name) => Some(Val::Str(r.name.clone())),
            _ => {
                let i = self.fields.iter().position(|x| x == f)?;
                r.extra[i].clone()
            }
        }
    }

    fn aggregate(&self, agg: &Aggregate, g: &Group) -> Option<f64> {
        let values = |f: &Field| -> Vec<f64> {
            g.rows
                .iter()
                .filter_map(|&r| self.value(r, f).and_then(|v| v.number()))
                .collect()
        };
        match agg {
            Aggregate::Count => Some(g.rows.len() as f64),
            Aggregate::Avg(f) => {
                let v = values(f);
                (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
            }
            Aggregate::Sum(f) => {
                let v = values(f);
                (!v.is_empty()).then(|| v.iter().sum())
            }
            Aggregate::Min(f) => values(f).into_iter().reduce(f64::min),
            Aggregate::Max(f) => values(f).into_iter().reduce(f64::max),
        }
    }

    /// The summaries of traces (root, start, duration), from the trace-id index.
    async fn summaries(&mut self, ids: &[String]) -> Result<Vec<Summary>, TraceQlError> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(ID_CHUNK) {
            let list = chunk.iter().map(|t| lit(t)).collect::<Vec<_>>().join(", ");
            let rows = self
                .run
                .sql(&format!(
                    "SELECT trace_id, root_service, root_name, CAST(start_time AS BIGINT), duration_ns FROM traces WHERE trace_id IN ({list})"
                ))
                .await?;
            let (ids, svc, name, start, dur) = (
                rows.strings(0),
                rows.strings(1),
                rows.strings(2),
                rows.i64(3),
                rows.i64(4),
            );
            for i in 0..ids.len() {
                let Some(id) = ids[i].clone() else { continue };
                out.push(Summary {
                    trace: id,
                    root_service: svc[i].clone(),
                    root_name: name[i].clone(),
                    start: start[i].unwrap_or(0),
                    duration: dur[i].unwrap_or(0),
                });
            }
        }
        Ok(out)
    }

    /// The newest `limit` traces of `summaries` with their spansets.
    fn found(&self, summaries: &mut Vec<Summary>, mut groups: Groups, inspected: usize) -> Found {
        summaries.sort_unstable_by(|a, b| (b.start, &b.trace).cmp(&(a.start, &a.trace)));
        summaries.truncate(self.opts.limit.max(1));
        let traces = summaries
            .drain(..)
            .map(|s| {
                let gs = groups.remove(&s.trace).unwrap_or_default();
                FoundTrace {
                    span_sets: gs.into_iter().map(|g| self.span_set(g)).collect(),
                    trace_id: s.trace,
                    root_service: s.root_service,
                    root_name: s.root_name,
                    start: s.start,
                    duration_ns: s.duration,
                }
            })
            .collect();
        Found {
            traces,
            inspected_traces: inspected,
            inspected_spans: 0,
            partial: false,
        }
    }

    fn span_set(&self, g: Group) -> FoundSpanSet {
        let mut rows = g.rows;
        rows.sort_unstable_by(|&a, &b| {
            let (a, b) = (&self.rows[a], &self.rows[b]);
            (b.start, &b.span).cmp(&(a.start, &a.span))
        });
        let matched = rows.len();
        let spans = rows
            .iter()
            .take(self.opts.spss)
            .map(|&r| {
                let row = &self.rows[r];
                FoundSpan {
                    span_id: row.span.clone(),
                    name: row.name.clone(),
                    start: row.start,
                    duration_ns: row.duration,
                    attributes: self
                        .fields
                        .iter()
                        .zip(&row.extra)
                        .filter_map(|(f, v)| v.clone().map(|v| (label(f), v)))
                        .collect(),
                }
            })
            .collect();
        FoundSpanSet {
            spans,
            matched,
            attributes: g.labels,
        }
    }
}

/// A Unix-ns time as an SQL timestamp literal.
fn ts_ns(t: i64) -> String {
    crate::analytics::params::ts(t.max(0) as u64)
}

struct Summary {
    trace: String,
    root_service: Option<String>,
    root_name: Option<String>,
    start: i64,
    duration: i64,
}

fn flatten(groups: Groups) -> Sets {
    groups
        .into_iter()
        .map(|(t, gs)| {
            let mut rows: Vec<usize> = gs.into_iter().flat_map(|g| g.rows).collect();
            rows.sort_unstable();
            rows.dedup();
            (t, rows)
        })
        .collect()
}

/// The ancestors of a span, nearest first (stops at a cycle or a missing parent).
fn ancestors<'t>(
    tree: &'t HashMap<String, Option<String>>,
    span: &str,
) -> impl Iterator<Item = &'t str> {
    let mut seen = 0usize;
    let mut cur = tree.get(span).and_then(|p| p.as_deref());
    std::iter::from_fn(move || {
        let now = cur?;
        seen += 1;
        if seen > tree.len() {
            return None;
        }
        cur = tree.get(now).and_then(|p| p.as_deref());
        Some(now)
    })
}

/// A stored value as the type its column has (status and kind as TraceQL spells them).
pub(super) fn typed(f: &Field, ty: ColumnType, v: &str) -> Val {
    if matches!(f, Field::Intrinsic(Intrinsic::Status | Intrinsic::Kind)) {
        return Val::Str(v.to_lowercase());
    }
    match ty {
        ColumnType::Int => v
            .parse()
            .map(Val::Int)
            .unwrap_or_else(|_| Val::Str(v.into())),
        ColumnType::Double => v
            .parse()
            .map(Val::Float)
            .unwrap_or_else(|_| Val::Str(v.into())),
        ColumnType::Bool => Val::Bool(v == "true"),
        _ => Val::Str(v.to_owned()),
    }
}

/// A span a metrics query counts: its trace, start, duration and the values of `fields`.
pub struct Matched {
    pub trace: String,
    pub start: i64,
    pub duration: i64,
    pub values: Vec<Option<Val>>,
}

/// Every span the pipeline of `query` keeps (up to the options' cap, then partial), with the
/// values of `fields`.
pub async fn matched_spans(
    run: &mut Run<'_>,
    pipeline: &Pipeline,
    opts: &SearchOptions,
    fields: &[Field],
) -> Result<(Vec<Matched>, bool), TraceQlError> {
    let mut e = Eval::new(run, opts, pipeline, fields);
    let groups = e.pipeline(pipeline).await?;
    let mut out = Vec::new();
    for rows in flatten(groups).into_values() {
        for r in rows {
            out.push(Matched {
                trace: e.rows[r].trace.clone(),
                start: e.rows[r].start,
                duration: e.rows[r].duration,
                values: fields.iter().map(|f| e.value(r, f)).collect(),
            });
        }
    }
    Ok((out, e.partial))
}
