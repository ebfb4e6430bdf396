//! Which filters of a query the store can use, and what they select: time bounds that skip
//! blocks, trace ids answered by the trace-id index, and equalities on indexed dimensions
//! answered by roaring-bitmap postings. A filter the store answers exactly (see
//! [`Pushdown::exact`]) is not applied again; any other pushed filter is (`Inexact`), so that
//! push-down only ever narrows what is read.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{Between, BinaryExpr, Expr, Operator, expr::InList};
use roaring::RoaringBitmap;
use weft_storage::Store;
use weft_storage::model::{SpanRecord, TenantId, TraceId, Value};
use weft_storage::request::REQUEST_PREFIX;
use weft_storage::scan::{BlockAddr, BlockMeta, Rows};
use weft_storage::schema::{ColumnType, DEDICATED, DIM_KIND, DIM_NAME, DIM_SERVICE, DIM_STATUS};
use weft_storage::store::Snapshot;
use weft_storage::terms::TermFilter;

use super::columns::{SpanCol, SpanColumns, dedicated_value};
use super::request::HeadRequests;

/// What selecting rows by request columns needs beyond a block's postings: the rows whose
/// request values must be resolved over their whole trace (see [`super::request::late_rows`]).
pub trait LateRows {
    /// The rows of a block whose values of the request dimensions `dims` (postings dimension
    /// names) its postings cannot give.
    fn late(
        &self,
        addr: BlockAddr,
        meta: &BlockMeta,
        dims: &[&'static str],
    ) -> datafusion::error::Result<RoaringBitmap>;
    /// Those of `rows` (late rows of the block) whose request values, resolved over their
    /// whole traces, pass the pushed request filters.
    fn passing(
        &self,
        addr: BlockAddr,
        meta: &BlockMeta,
        rows: &RoaringBitmap,
    ) -> datafusion::error::Result<RoaringBitmap>;
}

/// What a query's filters let the store skip. Bounds are inclusive, in Unix nanoseconds.
#[derive(Clone, Debug, Default)]
pub struct Pushdown {
    pub start_min: Option<i64>,
    pub start_max: Option<i64>,
    pub end_min: Option<i64>,
    pub end_max: Option<i64>,
    /// Rows must belong to one of these traces (intersected over filters).
    pub trace_ids: Option<Vec<TraceId>>,
    /// Per postings dimension, the terms one of which a row must have.
    pub dims: BTreeMap<&'static str, Vec<String>>,
    /// Postings dimensions of which a row must have some term: `IS NOT NULL` on an indexed
    /// dedicated column (every value its column holds is in its postings).
    pub present: std::collections::BTreeSet<&'static str>,
    /// A filter that no row can pass (an impossible trace id, say).
    pub nothing: bool,
}

pub(super) fn column_of(e: &Expr) -> Option<&str> {
    match e {
        Expr::Column(c) => Some(c.name.as_str()),
        Expr::Cast(c) => column_of(&c.expr),
        Expr::TryCast(c) => column_of(&c.expr),
        _ => None,
    }
}

/// `c = v1 OR c = v2 OR …` (how an optimizer spells a short `IN` list) as the column side
/// and the values, when every branch compares the same column with a literal.
pub(super) fn or_equalities(e: &Expr) -> Option<(&Expr, Vec<&Expr>)> {
    fn walk<'e>(e: &'e Expr, column: &mut Option<&'e Expr>, values: &mut Vec<&'e Expr>) -> bool {
        match e {
            Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::Or,
                right,
            }) => walk(left, column, values) && walk(right, column, values),
            Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::Eq,
                right,
            }) => {
                let (c, v) = match (literal(left), literal(right)) {
                    (None, Some(_)) => (left.as_ref(), right.as_ref()),
                    (Some(_), None) => (right.as_ref(), left.as_ref()),
                    _ => return false,
                };
                if column.is_some_and(|known| known != c) {
                    return false;
                }
                *column = Some(c);
                values.push(v);
                true
            }
            _ => false,
        }
    }
    if !matches!(
        e,
        Expr::BinaryExpr(BinaryExpr {
            op: Operator::Or,
            ..
        })
    ) {
        return None;
    }
    let mut column = None;
    let mut values = Vec::new();
    (walk(e, &mut column, &mut values) && column.is_some()).then(|| (column.unwrap(), values))
}

pub(super) fn literal(e: &Expr) -> Option<&ScalarValue> {
    match e {
        Expr::Literal(v, _) => Some(v),
        _ => None,
    }
}

/// A timestamp literal in Unix nanoseconds.
pub(super) fn nanos(v: &ScalarValue) -> Option<i64> {
    match v {
        ScalarValue::TimestampNanosecond(Some(n), _) => Some(*n),
        ScalarValue::TimestampMicrosecond(Some(n), _) => n.checked_mul(1_000),
        ScalarValue::TimestampMillisecond(Some(n), _) => n.checked_mul(1_000_000),
        ScalarValue::TimestampSecond(Some(n), _) => n.checked_mul(1_000_000_000),
        _ => None,
    }
}

pub(super) fn text(v: &ScalarValue) -> Option<String> {
    match v {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => Some(s.clone()),
        ScalarValue::Dictionary(_, inner) => text(inner),
        _ => None,
    }
}

/// A literal as the postings term of a dimension of the given column.
fn term(c: &SpanCol, v: &ScalarValue) -> Option<String> {
    match c {
        SpanCol::Dedicated(i) | SpanCol::Request(i) if DEDICATED[*i].ty == ColumnType::Int => {
            match v {
                ScalarValue::Int64(Some(n)) => Some(n.to_string()),
                ScalarValue::Int32(Some(n)) => Some(n.to_string()),
                ScalarValue::Int16(Some(n)) => Some(n.to_string()),
                ScalarValue::Int8(Some(n)) => Some(n.to_string()),
                ScalarValue::UInt32(Some(n)) => Some(n.to_string()),
                _ => None,
            }
        }
        _ => text(v),
    }
}

pub(super) fn flip(op: Operator) -> Operator {
    match op {
        Operator::Lt => Operator::Gt,
        Operator::LtEq => Operator::GtEq,
        Operator::Gt => Operator::Lt,
        Operator::GtEq => Operator::LtEq,
        o => o,
    }
}

impl Pushdown {
    /// Whether the store can use a filter (it is then reported `Inexact`).
    pub fn supports(columns: &SpanColumns, e: &Expr) -> bool {
        let mut p = Pushdown::default();
        p.add(columns, e)
    }

    /// Whether the scan answers a filter exactly, so DataFusion need not re-check it (nor read
    /// its column): `=` / `IN` on service name, span name, status code, kind and the indexed dedicated
    /// columns of text or integer type, whose postings hold exactly the rows whose column has
    /// each value, in blocks and head alike (see [`Self::row_matches`]). A dedicated value of
    /// another type is neither in the column nor in the postings. Trace ids too: the trace-id
    /// index is keyed by the whole id and gives each block's run of the trace's rows, and a
    /// text that is not 32 lower-case hex digits (the only form stored) selects nothing.
    pub fn exact(columns: &SpanColumns, e: &Expr) -> bool {
        fn plain_column(e: &Expr) -> Option<&str> {
            match e {
                Expr::Column(c) => Some(c.name.as_str()),
                // a cast between string types keeps equality
                Expr::Cast(c)
                    if matches!(
                        c.field.data_type(),
                        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                    ) =>
                {
                    plain_column(&c.expr)
                }
                _ => None,
            }
        }
        // the column, when its postings answer equality exactly
        let exact_col = |c: &str| {
            let c = &columns.cols[columns.index_of(c)?];
            let exact = match c {
                SpanCol::ServiceName
                | SpanCol::Name
                | SpanCol::StatusCode
                | SpanCol::Kind
                | SpanCol::TraceId => true,
                SpanCol::Dedicated(i) => {
                    let d = &DEDICATED[*i];
                    d.indexed && matches!(d.ty, ColumnType::Str | ColumnType::Int)
                }
                // inherited postings give the rows whose value is final in their block, and
                // the scan resolves the others over their trace before selecting them (see
                // `ScanPlan::build_with`); the head's rows are matched on resolved values
                SpanCol::Request(i) => {
                    matches!(DEDICATED[*i].ty, ColumnType::Str | ColumnType::Int)
                }
                _ => false,
            };
            exact.then_some(c)
        };
        // every value a literal of the column's own kind (text for text, integer for integer)
        fn values_fit<'e>(c: &SpanCol, values: impl IntoIterator<Item = &'e Expr>) -> bool {
            values.into_iter().all(|v| {
                literal(v).is_some_and(|v| match c {
                    SpanCol::Dedicated(i) | SpanCol::Request(i)
                        if DEDICATED[*i].ty == ColumnType::Int =>
                    {
                        term(c, v).is_some()
                    }
                    _ => text(v).is_some(),
                })
            })
        }
        match e {
            Expr::IsNotNull(inner) => present_dim(columns, inner).is_some(),
            Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::Eq,
                right,
            }) => match (plain_column(left), plain_column(right)) {
                (Some(c), None) => exact_col(c).is_some_and(|c| values_fit(c, [right.as_ref()])),
                (None, Some(c)) => exact_col(c).is_some_and(|c| values_fit(c, [left.as_ref()])),
                _ => false,
            },
            Expr::InList(InList {
                expr,
                list,
                negated: false,
            }) => plain_column(expr)
                .and_then(exact_col)
                .is_some_and(|c| values_fit(c, list)),
            _ => or_equalities(e).is_some_and(|(expr, list)| {
                plain_column(expr)
                    .and_then(exact_col)
                    .is_some_and(|c| values_fit(c, list))
            }),
        }
    }

    pub fn from_filters(columns: &SpanColumns, filters: &[Expr]) -> Self {
        let mut p = Pushdown::default();
        for f in filters {
            p.add(columns, f);
        }
        p
    }

    fn add(&mut self, columns: &SpanColumns, e: &Expr) -> bool {
        match e {
            Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::And,
                right,
            }) => {
                let l = self.add(columns, left);
                let r = self.add(columns, right);
                l || r
            }
            Expr::BinaryExpr(BinaryExpr {
                op: Operator::Or, ..
            }) => {
                let Some((expr, list)) = or_equalities(e) else {
                    return false;
                };
                let Some(c) = column_of(expr) else {
                    return false;
                };
                let Some(values) = list.into_iter().map(literal).collect::<Option<Vec<_>>>() else {
                    return false;
                };
                self.one_of(columns, c, &values)
            }
            Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
                if let (Some(c), Some(v)) = (column_of(left), literal(right)) {
                    self.compare(columns, c, *op, v)
                } else if let (Some(v), Some(c)) = (literal(left), column_of(right)) {
                    self.compare(columns, c, flip(*op), v)
                } else {
                    false
                }
            }
            Expr::IsNotNull(inner) => match present_dim(columns, inner) {
                Some(dim) => {
                    self.present.insert(dim);
                    true
                }
                None => false,
            },
            Expr::Between(Between {
                expr,
                negated: false,
                low,
                high,
            }) => match (column_of(expr), literal(low), literal(high)) {
                (Some(c), Some(lo), Some(hi)) => {
                    let a = self.compare(columns, c, Operator::GtEq, lo);
                    let b = self.compare(columns, c, Operator::LtEq, hi);
                    a || b
                }
                _ => false,
            },
            Expr::InList(InList {
                expr,
                list,
                negated: false,
            }) => {
                let Some(c) = column_of(expr) else {
                    return false;
                };
                let Some(values) = list.iter().map(literal).collect::<Option<Vec<_>>>() else {
                    return false;
                };
                self.one_of(columns, c, &values)
            }
            _ => false,
        }
    }

    fn compare(&mut self, columns: &SpanColumns, c: &str, op: Operator, v: &ScalarValue) -> bool {
        let Some(idx) = columns.index_of(c) else {
            return false;
        };
        let col = &columns.cols[idx];
        match col {
            SpanCol::StartTime | SpanCol::EndTime => {
                let Some(n) = nanos(v) else { return false };
                let (min, max) = if *col == SpanCol::StartTime {
                    (&mut self.start_min, &mut self.start_max)
                } else {
                    (&mut self.end_min, &mut self.end_max)
                };
                let tighten_min =
                    |m: &mut Option<i64>, n: i64| *m = Some(m.map_or(n, |x| x.max(n)));
                let tighten_max =
                    |m: &mut Option<i64>, n: i64| *m = Some(m.map_or(n, |x| x.min(n)));
                match op {
                    Operator::Eq => {
                        tighten_min(min, n);
                        tighten_max(max, n);
                    }
                    Operator::Gt => tighten_min(min, n.saturating_add(1)),
                    Operator::GtEq => tighten_min(min, n),
                    Operator::Lt => tighten_max(max, n.saturating_sub(1)),
                    Operator::LtEq => tighten_max(max, n),
                    _ => return false,
                }
                true
            }
            _ if op == Operator::Eq => self.one_of(columns, c, &[v]),
            _ => false,
        }
    }

    fn one_of(&mut self, columns: &SpanColumns, c: &str, values: &[&ScalarValue]) -> bool {
        let Some(idx) = columns.index_of(c) else {
            return false;
        };
        let col = &columns.cols[idx];
        if *col == SpanCol::TraceId {
            let Some(texts) = values.iter().map(|v| text(v)).collect::<Option<Vec<_>>>() else {
                return false;
            };
            // An id that is not 32 lower-case hex digits equals no stored trace id.
            let ids: Vec<TraceId> = texts
                .iter()
                .filter(|t| {
                    t.len() == 32
                        && t.bytes()
                            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                })
                .filter_map(|t| TraceId::from_hex(t).ok())
                .collect();
            self.trace_ids = Some(match self.trace_ids.take() {
                None => ids,
                Some(prev) => prev.into_iter().filter(|t| ids.contains(t)).collect(),
            });
            return true;
        }
        let Some(dim) = col.dimension() else {
            return false;
        };
        let Some(terms) = values
            .iter()
            .map(|v| term(col, v))
            .collect::<Option<Vec<_>>>()
        else {
            return false;
        };
        let entry = self.dims.entry(dim);
        match entry {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(terms);
            }
            std::collections::btree_map::Entry::Occupied(mut o) => {
                o.get_mut().retain(|t| terms.contains(t));
            }
        }
        true
    }

    /// Whether a block's time range can hold matching rows.
    pub fn block_in_range(&self, meta: &BlockMeta) -> bool {
        let (min_start, max_start, max_end) = (
            meta.min_start as i64,
            meta.max_start as i64,
            meta.max_end as i64,
        );
        !(self.start_min.is_some_and(|m| m > max_start)
            || self.start_max.is_some_and(|m| m < min_start)
            || self.end_min.is_some_and(|m| m > max_end)
            || self.end_max.is_some_and(|m| m < min_start))
    }

    /// Whether a head row passes the pushed filters (`requests`: the head's request values,
    /// needed when a request column is filtered).
    pub fn row_matches(&self, r: &SpanRecord, requests: Option<&HeadRequests>) -> bool {
        let (start, end) = (r.start.0 as i64, (r.start.0 + r.duration_ns()) as i64);
        if self.start_min.is_some_and(|m| start < m)
            || self.start_max.is_some_and(|m| start > m)
            || self.end_min.is_some_and(|m| end < m)
            || self.end_max.is_some_and(|m| end > m)
        {
            return false;
        }
        if let Some(ids) = &self.trace_ids
            && !ids.contains(&r.trace_id)
        {
            return false;
        }
        self.dims.iter().all(|(dim, terms)| {
            let have: Option<String> = match *dim {
                DIM_SERVICE => Some(r.service_name().to_owned()),
                DIM_NAME => Some(r.name.clone()),
                DIM_STATUS => Some(r.status_code.as_str().to_owned()),
                DIM_KIND => Some(r.kind.as_str().to_owned()),
                d if d.starts_with(REQUEST_PREFIX) => {
                    let i = DEDICATED
                        .iter()
                        .position(|x| x.name == &d[REQUEST_PREFIX.len()..]);
                    let values = requests.and_then(|h| h.of(r));
                    i.zip(values)
                        .and_then(|(i, v)| v[super::request::slot(i)].as_ref())
                        .and_then(Value::as_term)
                }
                d => DEDICATED
                    .iter()
                    .position(|x| x.name == d)
                    .and_then(|i| dedicated_value(r, i))
                    .and_then(|v| v.as_term()),
            };
            have.is_some_and(|h| terms.contains(&h))
        }) && self.present.iter().all(|dim| {
            DEDICATED
                .iter()
                .position(|x| x.name == *dim)
                .and_then(|i| dedicated_value(r, i))
                .is_some()
        })
    }

    pub fn uses_index(&self) -> bool {
        self.trace_ids.is_some() || !self.dims.is_empty() || !self.present.is_empty()
    }

    /// Whether a request column is filtered.
    pub fn uses_requests(&self) -> bool {
        self.dims.keys().any(|d| d.starts_with(REQUEST_PREFIX))
    }
}

/// The rows of one block a scan reads.
#[derive(Clone, Debug)]
pub struct BlockWork {
    pub addr: BlockAddr,
    pub meta: std::sync::Arc<BlockMeta>,
    pub rows: Rows,
}

/// What the store's side of a scan will read, with the counts EXPLAIN shows.
#[derive(Clone, Debug, Default)]
pub struct ScanPlan {
    pub blocks: Vec<BlockWork>,
    pub blocks_total: usize,
    pub blocks_pruned_by_time: usize,
    pub blocks_pruned_by_index: usize,
    pub rows_selected: u64,
}

impl ScanPlan {
    /// Chooses blocks and rows: time bounds first (block metas, in memory), then the trace-id
    /// index, then postings, intersected before any column is read. Newest blocks first.
    pub fn build(
        store: &Store,
        tenant: &TenantId,
        snapshot: &Snapshot,
        p: &Pushdown,
        use_pushdown: bool,
    ) -> datafusion::error::Result<Self> {
        Self::build_with(store, tenant, snapshot, p, use_pushdown, None)
    }

    /// [`Self::build`]; with a request column filtered, `late` gives the rows of a block whose
    /// request values its postings cannot give (see [`super::request::late_rows`]) and which of
    /// them pass once resolved over their trace: those are selected with the rows the postings
    /// select, so that the selection is exact.
    pub fn build_with(
        store: &Store,
        tenant: &TenantId,
        snapshot: &Snapshot,
        p: &Pushdown,
        use_pushdown: bool,
        late: Option<&dyn LateRows>,
    ) -> datafusion::error::Result<Self> {
        let err = |e: weft_storage::StorageError| {
            datafusion::error::DataFusionError::External(Box::new(e))
        };
        let mut plan = ScanPlan {
            blocks_total: snapshot.blocks.len(),
            ..Default::default()
        };
        if use_pushdown && p.nothing {
            plan.blocks_pruned_by_index = plan.blocks_total;
            return Ok(plan);
        }
        let mut traces: BTreeMap<BlockAddr, RoaringBitmap> = BTreeMap::new();
        if use_pushdown && let Some(ids) = &p.trace_ids {
            for id in ids {
                for (addr, entry) in store
                    .trace_locations_in(tenant, snapshot, id)
                    .map_err(err)?
                {
                    traces
                        .entry(addr)
                        .or_default()
                        .insert_range(entry.row_start..entry.row_start + entry.rows);
                }
            }
        }
        let terms = (use_pushdown && !p.dims.is_empty())
            .then(|| TermFilter::new(p.dims.iter().map(|(d, terms)| (*d, terms.as_slice()))));
        // the filter without its request columns, for rows resolved late
        let late = late.filter(|_| use_pushdown && p.uses_requests());
        let request_dims: Vec<&'static str> = p
            .dims
            .keys()
            .filter(|d| d.starts_with(REQUEST_PREFIX))
            .copied()
            .collect();
        let others = late.map(|_| {
            TermFilter::new(
                p.dims
                    .iter()
                    .filter(|(d, _)| !d.starts_with(REQUEST_PREFIX))
                    .map(|(d, terms)| (*d, terms.as_slice())),
            )
        });
        for (addr, meta) in snapshot.blocks.iter() {
            if use_pushdown && !p.block_in_range(meta) {
                plan.blocks_pruned_by_time += 1;
                continue;
            }
            let mut selected: Option<RoaringBitmap> = None;
            if use_pushdown && p.trace_ids.is_some() {
                selected = Some(traces.get(addr).cloned().unwrap_or_default());
            }
            if let Some(filter) = &terms
                && !selected.as_ref().is_some_and(RoaringBitmap::is_empty)
            {
                let mut matching = store
                    .rows_matching(tenant, *addr, meta, filter)
                    .map_err(err)?;
                if let (Some(late), Some(others)) = (late, &others) {
                    let mut rows = late.late(*addr, meta, &request_dims)?;
                    if !rows.is_empty() {
                        let others = store
                            .rows_matching(tenant, *addr, meta, others)
                            .map_err(err)?;
                        rows &= others.as_ref();
                        if let Some(s) = &selected {
                            rows &= s;
                        }
                    }
                    if !rows.is_empty() {
                        let passing = late.passing(*addr, meta, &rows)?;
                        if !passing.is_empty() {
                            matching = Arc::new(matching.as_ref() | &passing);
                        }
                    }
                }
                selected = Some(match selected {
                    Some(s) => s & matching.as_ref(),
                    None => matching.as_ref().clone(),
                });
            }
            if use_pushdown {
                for dim in &p.present {
                    if selected.as_ref().is_some_and(RoaringBitmap::is_empty) {
                        break;
                    }
                    let postings = store.dimension_shared(tenant, *addr, dim).map_err(err)?;
                    let mut any = RoaringBitmap::new();
                    for (_, rows) in postings.iter() {
                        any |= rows;
                    }
                    selected = Some(match selected {
                        Some(s) => s & any,
                        None => any,
                    });
                }
            }
            // rows older than the tenant's retention are never read, whatever the push-down
            if let Some(live) = store
                .live_rows(tenant, snapshot, *addr, meta)
                .map_err(err)?
            {
                selected = Some(match selected {
                    Some(s) => s & live,
                    None => live,
                });
            }
            let rows = match selected {
                None => Rows::All,
                Some(s) if s.is_empty() => {
                    plan.blocks_pruned_by_index += 1;
                    continue;
                }
                // a set of most of the block stays a set: the reader decodes such a set whole
                // and filters it, and the rows must be exact (see `Pushdown::exact`)
                Some(s) if s.len() == u64::from(meta.rows) => Rows::All,
                Some(s) => {
                    let (lo, hi) = (s.min().unwrap_or(0), s.max().unwrap_or(0));
                    if u64::from(hi - lo + 1) == s.len() {
                        Rows::Range(lo, hi - lo + 1)
                    } else {
                        Rows::Set(s)
                    }
                }
            };
            plan.rows_selected += rows.len(meta.rows) as u64;
            plan.blocks.push(BlockWork {
                addr: *addr,
                meta: meta.clone(),
                rows,
            });
        }
        plan.blocks
            .sort_by_key(|b| std::cmp::Reverse(b.meta.max_start));
        Ok(plan)
    }
}

impl fmt::Display for Pushdown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.start_min.is_some() || self.start_max.is_some() {
            parts.push(format!(
                "start_time in [{}, {}]",
                bound(self.start_min),
                bound(self.start_max)
            ));
        }
        if self.end_min.is_some() || self.end_max.is_some() {
            parts.push(format!(
                "end_time in [{}, {}]",
                bound(self.end_min),
                bound(self.end_max)
            ));
        }
        if let Some(ids) = &self.trace_ids {
            parts.push(format!("trace_id index: {} id(s)", ids.len()));
        }
        for (dim, terms) in &self.dims {
            parts.push(format!("postings {dim} IN ({})", terms.join(", ")));
        }
        for dim in &self.present {
            parts.push(format!("postings {dim} present"));
        }
        write!(f, "{}", parts.join(", "))
    }
}

/// The postings dimension of `e` when it is an indexed dedicated column of text or integer
/// type: its postings hold every row whose column has a value (values of another type are in
/// neither), so `e IS NOT NULL` is the union of its postings.
fn present_dim(columns: &SpanColumns, e: &Expr) -> Option<&'static str> {
    let Expr::Column(c) = e else {
        return None;
    };
    match &columns.cols[columns.index_of(c.name.as_str())?] {
        SpanCol::Dedicated(i)
            if DEDICATED[*i].indexed
                && matches!(DEDICATED[*i].ty, ColumnType::Str | ColumnType::Int) =>
        {
            Some(DEDICATED[*i].name)
        }
        _ => None,
    }
}

fn bound(b: Option<i64>) -> String {
    b.map_or_else(|| "..".to_owned(), |n| n.to_string())
}
