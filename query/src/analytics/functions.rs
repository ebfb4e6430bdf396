//! The analytics as SQL table functions, with the HTTP API's parameters as named arguments:
//!
//! ```sql
//! SELECT * FROM heatmap(start => '2025-11-30T00:00:00Z', y => 'itl', step => '10s')
//! SELECT * FROM lineage_dimensions(now() - INTERVAL '1 hour', now(), dims => 'worker.id')
//! ```
//!
//! The first two positional arguments are `start` and `end`; every other one is named
//! (`name => value`; `attr.KEY` names are quoted: `"attr.worker.id" => 'w-7'`). Values may
//! be text, numbers, booleans, timestamps or constant expressions (`now() - INTERVAL '1h'`).
//! The parser takes named arguments only where DataFusion's planner drops them, so they are
//! rewritten before planning into `named_struct('name', value)` ([`rewrite_named_args`]).
//!
//! The result's columns follow from the arguments alone, so planning runs nothing; the
//! capability runs when the scan starts, on a session of its own.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::sql::sqlparser::ast::{
    self, FunctionArg, FunctionArgExpr, TableFactor, VisitMut, VisitorMut,
};
use weft_storage::model::TenantId;

use super::params::Params;
use super::{Answer, CAPABILITIES, own_params};
use crate::sql::SqlEngine;
use crate::sql::columns::timestamp_type;

/// Rewrites `f(name => value)` of the analytics functions into
/// `f(named_struct('name', value))`, which DataFusion's planner passes on.
pub fn rewrite_named_args(statement: &mut ast::Statement) {
    struct Named;
    impl VisitorMut for Named {
        type Break = ();
        fn pre_visit_table_factor(
            &mut self,
            factor: &mut TableFactor,
        ) -> std::ops::ControlFlow<()> {
            if let TableFactor::Table {
                name,
                args: Some(args),
                ..
            } = factor
                && let Some(f) = name.0.last().and_then(|p| p.as_ident())
                && own_params(&f.value.to_ascii_lowercase()).is_some()
            {
                for arg in args.args.iter_mut() {
                    let (name, e) = match arg {
                        FunctionArg::Named {
                            name,
                            arg: FunctionArgExpr::Expr(e),
                            ..
                        } => (name.value.clone(), e.clone()),
                        FunctionArg::ExprNamed {
                            name: ast::Expr::Identifier(name),
                            arg: FunctionArgExpr::Expr(e),
                            ..
                        } => (name.value.clone(), e.clone()),
                        _ => continue,
                    };
                    {
                        let text = format!("named_struct('{}', {e})", name.replace('\'', "''"));
                        let parsed = datafusion::sql::sqlparser::parser::Parser::new(
                            &datafusion::sql::sqlparser::dialect::PostgreSqlDialect {},
                        )
                        .try_with_sql(&text)
                        .and_then(|mut p| p.parse_expr());
                        if let Ok(expr) = parsed {
                            *arg = FunctionArg::Unnamed(FunctionArgExpr::Expr(expr));
                        }
                    }
                }
            }
            std::ops::ControlFlow::Continue(())
        }
    }
    let _ = statement.visit(&mut Named);
}

/// Registers every analytics table function on a session of `tenant`.
pub fn register(ctx: &datafusion::prelude::SessionContext, engine: &SqlEngine, tenant: &TenantId) {
    for (name, _) in CAPABILITIES {
        ctx.register_udtf(
            name,
            Arc::new(Function {
                name,
                engine: engine.clone(),
                tenant: tenant.clone(),
            }),
        );
    }
}

struct Function {
    name: &'static str,
    engine: SqlEngine,
    tenant: TenantId,
}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Function")
            .field("name", &self.name)
            .finish()
    }
}

fn plan_err(m: impl Into<String>) -> DataFusionError {
    DataFusionError::Plan(m.into())
}

/// A constant argument as text (times as Unix nanoseconds).
fn text_of(name: &str, function: &str, e: &Expr) -> Result<String> {
    let ctx = SimplifyContext::builder()
        .with_schema(Arc::new(DFSchema::empty()))
        .with_current_time()
        .build();
    let folded = ExprSimplifier::new(ctx).simplify(e.clone())?;
    let bad = || {
        plan_err(format!(
            "{function}: argument {name} must be a constant (text, number, boolean or timestamp), not {e}"
        ))
    };
    let Expr::Literal(v, _) = folded else {
        return Err(bad());
    };
    Ok(match v {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::Utf8View(Some(s))
        | ScalarValue::LargeUtf8(Some(s)) => s,
        ScalarValue::Int64(Some(n)) => n.to_string(),
        ScalarValue::Int32(Some(n)) => n.to_string(),
        ScalarValue::UInt64(Some(n)) => n.to_string(),
        ScalarValue::Float64(Some(x)) => x.to_string(),
        ScalarValue::Boolean(Some(b)) => b.to_string(),
        ScalarValue::TimestampNanosecond(Some(n), _) => n.to_string(),
        ScalarValue::TimestampMicrosecond(Some(n), _) => (n * 1_000).to_string(),
        ScalarValue::TimestampMillisecond(Some(n), _) => (n * 1_000_000).to_string(),
        ScalarValue::TimestampSecond(Some(n), _) => (n * 1_000_000_000).to_string(),
        _ => return Err(bad()),
    })
}

impl TableFunctionImpl for Function {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let mut pairs = Vec::new();
        for (i, e) in args.exprs().iter().enumerate() {
            match e {
                Expr::ScalarFunction(f) if f.name() == "named_struct" && f.args.len() == 2 => {
                    let Expr::Literal(ScalarValue::Utf8(Some(key)), _) = &f.args[0] else {
                        return Err(plan_err(format!("{}: bad named argument", self.name)));
                    };
                    pairs.push((key.clone(), text_of(key, self.name, &f.args[1])?));
                }
                Expr::Literal(ScalarValue::Struct(st), _) if st.num_columns() == 1 => {
                    // `named_struct('name', constant)`, folded by the planner
                    let key = st.fields()[0].name().clone();
                    let value = ScalarValue::try_from_array(st.column(0), 0)?;
                    pairs.push((
                        key.clone(),
                        text_of(&key, self.name, &Expr::Literal(value, None))?,
                    ));
                }
                e if i < 2 && pairs.len() == i => {
                    let key = ["start", "end"][i];
                    pairs.push((key.to_owned(), text_of(key, self.name, e)?));
                }
                e => {
                    return Err(plan_err(format!(
                        "{}: argument {e} must be named (name => value); only start and end may come first unnamed",
                        self.name
                    )));
                }
            }
        }
        let own = own_params(self.name).unwrap_or_default();
        let params =
            Params::parse(pairs, own).map_err(|e| plan_err(format!("{}: {e}", self.name)))?;
        let schema = schema_of(self.name, &params);
        Ok(Arc::new(Lazy {
            name: self.name,
            engine: self.engine.clone(),
            tenant: self.tenant.clone(),
            params,
            schema,
        }))
    }
}

/// A capability's answer as a table, run when scanned.
struct Lazy {
    name: &'static str,
    engine: SqlEngine,
    tenant: TenantId,
    params: Params,
    schema: SchemaRef,
}

impl std::fmt::Debug for Lazy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lazy").field("name", &self.name).finish()
    }
}

#[async_trait]
impl TableProvider for Lazy {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let answer = super::run(&self.engine, &self.tenant, self.name, self.params.clone())
            .await
            .map_err(|e| DataFusionError::Execution(format!("{}: {e}", self.name)))?;
        let batch = table_of(self.name, &answer, &self.schema)?;
        Ok(MemorySourceConfig::try_new_exec(
            &[vec![batch]],
            self.schema.clone(),
            projection.cloned(),
        )?)
    }
}

fn f(name: &str, ty: DataType) -> Field {
    Field::new(name, ty, true)
}

fn node_fields() -> Vec<Field> {
    vec![
        f("id", DataType::Utf8),
        f("type", DataType::Utf8),
        f("service", DataType::Utf8),
        f("operation", DataType::Utf8),
        f("calls", DataType::Int64),
        f("errors", DataType::Int64),
        f("error_rate", DataType::Float64),
        f("p50_ms", DataType::Float64),
        f("p99_ms", DataType::Float64),
        f("latency_share", DataType::Float64),
    ]
}

/// The columns of a capability's table, from its parameters alone.
fn schema_of(name: &str, p: &Params) -> SchemaRef {
    let utf8 =
        |names: Vec<String>| -> Vec<Field> { names.iter().map(|n| f(n, DataType::Utf8)).collect() };
    let fields: Vec<Field> = match name {
        "lineage_operations" | "lineage_request" => node_fields(),
        "lineage_edges" => vec![
            f("source", DataType::Utf8),
            f("target", DataType::Utf8),
            f("calls", DataType::Int64),
            f("p99_ms", DataType::Float64),
        ],
        "lineage_dimensions" => {
            let mut v = utf8(p.list_or("dims", super::lineage::DEFAULT_DIMS));
            v.extend([
                f("requests", DataType::Int64),
                f("spans", DataType::Int64),
                f("p50_ms", DataType::Float64),
                f("p99_ms", DataType::Float64),
                f("error_rate", DataType::Float64),
            ]);
            v
        }
        "heatmap" => {
            let mut v = vec![if p.get("x") == Some("token_index") {
                f("token_index", DataType::Int64)
            } else {
                f("time", timestamp_type())
            }];
            v.extend(utf8(p.list_or("by", &[])));
            v.extend([
                f("y_upper_bound", DataType::Float64),
                f("count", DataType::Int64),
                f("exemplar_trace_id", DataType::Utf8),
            ]);
            v
        }
        "percentiles" => {
            let mut v = vec![f("time", timestamp_type())];
            v.extend(utf8(p.list_or("by", &[])));
            v.extend([
                f("quantile", DataType::Float64),
                f("value", DataType::Float64),
            ]);
            v
        }
        "anomalies" => vec![
            f("start_time", timestamp_type()),
            f("end_time", timestamp_type()),
            f("signal", DataType::Utf8),
            f("labels", DataType::Utf8),
            f("score", DataType::Float64),
            f("peak", DataType::Float64),
            f("baseline", DataType::Float64),
            f("cause_dimension", DataType::Utf8),
            f("cause_value", DataType::Utf8),
            f("lift", DataType::Float64),
            f("share_of_excess", DataType::Float64),
            f("co_signals", DataType::Utf8),
        ],
        "drift" => vec![
            f("js_divergence", DataType::Float64),
            f("kl_divergence", DataType::Float64),
            f("a_count", DataType::Int64),
            f("b_count", DataType::Int64),
            f("buckets_moved", DataType::Utf8),
        ],
        _ => {
            // saturation
            let mut v = vec![f("model", DataType::Utf8)];
            v.extend(utf8(p.list_or("by", &[])));
            v.extend([
                f("context_window", DataType::Int64),
                f("requests", DataType::Int64),
                f("at_80", DataType::Int64),
                f("at_95", DataType::Int64),
                f("max_input_tokens", DataType::Int64),
            ]);
            v
        }
    };
    Arc::new(Schema::new(fields))
}

type Row = Vec<ScalarValue>;

fn s(v: impl Into<String>) -> ScalarValue {
    ScalarValue::Utf8(Some(v.into()))
}
fn so(v: &Option<String>) -> ScalarValue {
    ScalarValue::Utf8(v.clone())
}
fn i(v: u64) -> ScalarValue {
    ScalarValue::Int64(Some(v as i64))
}
fn x(v: f64) -> ScalarValue {
    ScalarValue::Float64(v.is_finite().then_some(v))
}
fn t(ns: i64) -> ScalarValue {
    ScalarValue::TimestampNanosecond(Some(ns), Some("UTC".into()))
}

/// A capability's answer as rows of [`schema_of`]'s columns.
fn table_of(name: &str, answer: &Answer, schema: &SchemaRef) -> Result<RecordBatch> {
    let mut rows: Vec<Row> = Vec::new();
    match answer {
        Answer::Graph(g) if name == "lineage_edges" => {
            for e in &g.edges {
                rows.push(vec![s(&e.source), s(&e.target), i(e.calls), x(e.p99_ms)]);
            }
        }
        Answer::Graph(g) => {
            for n in &g.nodes {
                rows.push(vec![
                    s(&n.id),
                    s(n.kind),
                    s(&n.title),
                    s(&n.subtitle),
                    i(n.calls),
                    i(n.errors),
                    x(if n.calls > 0 {
                        n.errors as f64 / n.calls as f64
                    } else {
                        0.0
                    }),
                    x(n.p50_ms),
                    x(n.p99_ms),
                    x(n.latency_share),
                ]);
            }
        }
        Answer::Dimensions(d) => {
            for r in &d.rows {
                let mut row: Row = r.values.iter().map(so).collect();
                row.extend([
                    i(r.requests),
                    i(r.spans),
                    x(r.p50_ms),
                    x(r.p99_ms),
                    x(r.error_rate),
                ]);
                rows.push(row);
            }
        }
        Answer::Heatmap(h) => {
            let grids: Vec<&super::heatmap::Grid> = if h.groups.is_empty() {
                vec![&h.total]
            } else {
                h.groups.iter().collect()
            };
            let by = schema.fields().len() - 4;
            for g in grids {
                for (xi, xv) in h.x.iter().enumerate() {
                    for (yj, ub) in h.y_upper_bounds.iter().enumerate() {
                        let n = g.counts[xi][yj];
                        if n == 0 {
                            continue;
                        }
                        let mut row = vec![if h.x_axis == "time" {
                            t(*xv)
                        } else {
                            ScalarValue::Int64(Some(*xv))
                        }];
                        for field in schema.fields().iter().skip(1).take(by) {
                            row.push(so(&g.labels.get(field.name()).cloned()));
                        }
                        row.extend([ScalarValue::Float64(*ub), i(n), so(&g.exemplars[xi][yj])]);
                        rows.push(row);
                    }
                }
            }
        }
        Answer::Percentiles(p) => {
            let by = schema.fields().len() - 3;
            for series in &p.series {
                for (time, vals) in &series.points {
                    for (q, v) in p.quantiles.iter().zip(vals) {
                        let mut row = vec![t(*time)];
                        for field in schema.fields().iter().skip(1).take(by) {
                            row.push(so(&series.labels.get(field.name()).cloned()));
                        }
                        row.extend([x(*q), x(*v)]);
                        rows.push(row);
                    }
                }
            }
        }
        Answer::Anomalies(a) => {
            for inc in &a.incidents {
                let top = inc.attribution.first();
                rows.push(vec![
                    t(inc.start_ns as i64),
                    t(inc.end_ns as i64),
                    s(&inc.signal),
                    s(serde_json::to_string(&inc.labels).unwrap_or_default()),
                    x(inc.score),
                    x(inc.peak),
                    x(inc.baseline),
                    so(&top.map(|c| c.dimension.clone())),
                    so(&top.map(|c| c.value.clone())),
                    x(top.map_or(f64::NAN, |c| c.lift)),
                    x(top.map_or(f64::NAN, |c| c.share_of_excess)),
                    s(inc
                        .co_signals
                        .iter()
                        .map(|c| c.signal.as_str())
                        .collect::<Vec<_>>()
                        .join(",")),
                ]);
            }
        }
        Answer::Drift(d) => {
            rows.push(vec![
                x(d.js_divergence),
                x(d.kl_divergence),
                i(d.a_count),
                i(d.b_count),
                s(d.to_json()["buckets_moved"].to_string()),
            ]);
        }
        Answer::Saturation(sat) => {
            for r in &sat.rows {
                let mut row = vec![s(&r.model)];
                row.extend(r.labels.iter().map(so));
                row.extend([
                    ScalarValue::Int64(r.context_window.map(|w| w as i64)),
                    i(r.requests),
                    i(r.at_80),
                    i(r.at_95),
                    ScalarValue::Int64(Some(r.max_input_tokens)),
                ]);
                rows.push(row);
            }
        }
    }
    let columns = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(c, field)| {
            if rows.is_empty() {
                return Ok(arrow::array::new_empty_array(field.data_type()));
            }
            ScalarValue::iter_to_array(rows.iter().map(|r| r[c].clone()))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn named_arguments_become_named_structs() {
        let mut s = crate::sql::parse_one(
            "SELECT * FROM heatmap('2025-11-30T00:00:00Z', y => 'itl', \"attr.worker.id\" => 'w-7')",
        )
        .unwrap();
        super::rewrite_named_args(&mut s);
        assert_eq!(
            s.to_string(),
            "SELECT * FROM heatmap('2025-11-30T00:00:00Z', named_struct('y', 'itl'), named_struct('attr.worker.id', 'w-7'))"
        );
    }
}
