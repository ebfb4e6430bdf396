//! Several exact percentiles of the same values, kept once.
//!
//! A dashboard asks p50, p95 and p99 of one latency together. As three `percentile_cont` calls,
//! each keeps its own copy of every value of every group: three times the memory, three
//! partial states through the repartition, three gathers per group at the end. The
//! [`SharePercentiles`] optimizer rule replaces the calls of one aggregation that read the same
//! float64 values (same argument, same `WITHIN GROUP` ordering, no `FILTER`, no `DISTINCT`) with
//! one [`SharedPercentiles`] call whose answer is a struct of the percentiles, and a projection
//! above that takes each field out under the name the call had. The values are then kept once
//! and each group gathered once; each percentile is selected as `percentile_cont` selects it,
//! so the answers are the same to the bit.

use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array};
use arrow::datatypes::{DataType, Field, FieldRef, Fields};
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::error::{DataFusionError, Result};
use datafusion::functions::core::expr_fn::get_field;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{
    Accumulator, Aggregate, AggregateUDF, AggregateUDFImpl, EmitTo, Expr, ExprSchemable,
    GroupsAccumulator, LogicalPlan, Projection, Signature, Volatility,
};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

use super::percentile::{FastPercentileCont, PercentileGroups};

/// Exact percentiles (each in `[0, 1]`, already flipped for a descending ordering) of float64
/// values, as a struct with one float64 field per percentile. Made only by [`SharePercentiles`].
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SharedPercentiles {
    /// The percentiles' bits (`f64` is neither `Eq` nor `Hash`).
    percentiles: Vec<u64>,
    signature: Signature,
    name: String,
}

impl SharedPercentiles {
    fn new(percentiles: &[f64]) -> Self {
        let shown: Vec<String> = percentiles.iter().map(|p| p.to_string()).collect();
        Self {
            percentiles: percentiles.iter().map(|p| p.to_bits()).collect(),
            signature: Signature::exact(vec![DataType::Float64], Volatility::Immutable),
            name: format!("percentile_cont[{}]", shown.join(", ")),
        }
    }

    fn percentiles(&self) -> Vec<f64> {
        self.percentiles
            .iter()
            .map(|b| f64::from_bits(*b))
            .collect()
    }

    fn fields(&self) -> Fields {
        (0..self.percentiles.len())
            .map(|i| Field::new(format!("p{i}"), DataType::Float64, true))
            .collect()
    }

    fn groups(&self) -> PercentileGroups {
        PercentileGroups::several(self.percentiles(), self.fields())
    }
}

impl AggregateUDFImpl for SharedPercentiles {
    fn name(&self) -> &str {
        &self.name
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Struct(self.fields()))
    }
    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let values = Field::new_list_field(DataType::Float64, true);
        Ok(vec![Arc::new(Field::new(
            format_state_name(args.name, "values"),
            DataType::List(Arc::new(values)),
            true,
        ))])
    }
    fn accumulator(&self, _args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(OneGroup(self.groups())))
    }
    fn groups_accumulator_supported(&self, _args: AccumulatorArgs) -> bool {
        true
    }
    fn create_groups_accumulator(
        &self,
        _args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        Ok(Box::new(self.groups()))
    }
}

/// The ungrouped form: the grouped accumulator with every row in group 0.
#[derive(Debug)]
struct OneGroup(PercentileGroups);

impl OneGroup {
    /// Makes group 0 exist: a state or an answer with no rows taken in is that of one empty
    /// group.
    fn ensure_group(&mut self) -> Result<()> {
        let none: ArrayRef = Arc::new(Float64Array::from(Vec::<f64>::new()));
        self.0.update_batch(&[none], &[], None, 1)
    }
}

impl Accumulator for OneGroup {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let rows = values.first().map_or(0, |v| v.len());
        self.0.update_batch(values, &vec![0; rows], None, 1)
    }
    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let rows = states.first().map_or(0, |v| v.len());
        self.0.merge_batch(states, &vec![0; rows], 1)
    }
    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        self.ensure_group()?;
        let state = self.0.state(EmitTo::All)?;
        state
            .iter()
            .map(|a| ScalarValue::try_from_array(a, 0))
            .collect()
    }
    fn evaluate(&mut self) -> Result<ScalarValue> {
        self.ensure_group()?;
        let answer = self.0.evaluate(EmitTo::All)?;
        ScalarValue::try_from_array(&answer, 0)
    }
    fn size(&self) -> usize {
        size_of::<Self>() + self.0.size()
    }
}

/// Replaces the `percentile_cont` calls of an aggregation that read the same values with one
/// [`SharedPercentiles`] call (see the module's notes).
#[derive(Debug, Default)]
pub struct SharePercentiles;

/// What calls that share their values have in common: the argument and whether the
/// ordering is descending.
type Key = (Expr, bool);

/// A call the rule can share: its argument, its ordering's direction and its percentile.
fn shareable(e: &Expr, input: &DFSchema) -> Option<(Expr, bool, f64)> {
    let e = match e {
        Expr::Alias(a) => a.expr.as_ref(),
        e => e,
    };
    let Expr::AggregateFunction(AggregateFunction { func, params }) = e else {
        return None;
    };
    if !func.inner().is::<FastPercentileCont>() {
        return None;
    }
    if params.distinct
        || params.filter.is_some()
        || params.null_treatment.is_some()
        || params.args.len() != 2
        || params.order_by.len() > 1
    {
        return None;
    }
    let Expr::Literal(ScalarValue::Float64(Some(p)), _) = &params.args[1] else {
        return None;
    };
    if !(0.0..=1.0).contains(p) || params.args[0].get_type(input).ok()? != DataType::Float64 {
        return None;
    }
    let descending = params.order_by.first().is_some_and(|s| !s.asc);
    Some((params.args[0].clone(), descending, *p))
}

impl OptimizerRule for SharePercentiles {
    fn name(&self) -> &str {
        "share_percentiles"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Aggregate(agg) = &plan else {
            return Ok(Transformed::no(plan));
        };
        // grouping sets add a grouping id to the aggregation's columns: left as they are
        if agg
            .group_expr
            .iter()
            .any(|e| matches!(e, Expr::GroupingSet(_)))
        {
            return Ok(Transformed::no(plan));
        }
        let input = agg.input.schema();
        // the calls on each (argument, direction), in the order they come
        let mut sets: Vec<(Key, Vec<(usize, f64)>)> = Vec::new();
        for (i, e) in agg.aggr_expr.iter().enumerate() {
            if let Some((arg, descending, p)) = shareable(e, input) {
                let p = if descending { 1.0 - p } else { p };
                match sets
                    .iter_mut()
                    .find(|(k, _)| k.0 == arg && k.1 == descending)
                {
                    Some((_, calls)) => calls.push((i, p)),
                    None => sets.push(((arg, descending), vec![(i, p)])),
                }
            }
        }
        sets.retain(|(_, calls)| calls.len() > 1);
        if sets.is_empty() {
            return Ok(Transformed::no(plan));
        }
        // each shared call's set and its field in that set's answer
        let mut shared_at = vec![None; agg.aggr_expr.len()];
        for (n, (_, calls)) in sets.iter().enumerate() {
            for (field, (i, _)) in calls.iter().enumerate() {
                shared_at[*i] = Some((n, field));
            }
        }
        // the new aggregation: the calls not shared, then one call per set
        let mut aggr_expr: Vec<Expr> = agg
            .aggr_expr
            .iter()
            .zip(&shared_at)
            .filter(|(_, at)| at.is_none())
            .map(|(e, _)| e.clone())
            .collect();
        let names: Vec<String> = (0..sets.len())
            .map(|n| format!("__weft_percentiles_{n}"))
            .collect();
        for (((arg, _), calls), name) in sets.iter().zip(&names) {
            let percentiles: Vec<f64> = calls.iter().map(|(_, p)| *p).collect();
            let udaf = Arc::new(AggregateUDF::from(SharedPercentiles::new(&percentiles)));
            aggr_expr.push(
                Expr::AggregateFunction(AggregateFunction::new_udf(
                    udaf,
                    vec![arg.clone()],
                    false,
                    None,
                    vec![],
                    None,
                ))
                .alias(name),
            );
        }
        let new_agg = LogicalPlan::Aggregate(Aggregate::try_new(
            agg.input.clone(),
            agg.group_expr.clone(),
            aggr_expr,
        )?);
        // the projection back to the aggregation's own columns, in its order and names
        let groups = agg.group_expr.len();
        let columns = new_agg.schema().columns();
        let mut kept = groups;
        let mut exprs = Vec::with_capacity(agg.schema.fields().len());
        for (i, (qualifier, field)) in agg.schema.iter().enumerate() {
            let expr = if i < groups {
                Expr::Column(columns[i].clone())
            } else if let Some((n, at)) = shared_at[i - groups] {
                get_field(
                    Expr::Column(datafusion::common::Column::from_name(&names[n])),
                    format!("p{at}"),
                )
                .alias_qualified(qualifier.cloned(), field.name())
            } else {
                let column = Expr::Column(columns[kept].clone());
                kept += 1;
                column.alias_qualified(qualifier.cloned(), field.name())
            };
            exprs.push(expr);
        }
        let projection = Projection::try_new(exprs, Arc::new(new_agg))?;
        if projection.schema.fields().len() != agg.schema.fields().len()
            || projection
                .schema
                .iter()
                .zip(agg.schema.iter())
                .any(|(a, b)| {
                    a.0 != b.0 || a.1.name() != b.1.name() || a.1.data_type() != b.1.data_type()
                })
        {
            return Err(DataFusionError::Internal(format!(
                "share_percentiles: the projection's schema {} is not the aggregation's {}",
                projection.schema, agg.schema
            )));
        }
        Ok(Transformed::yes(LogicalPlan::Projection(projection)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::Schema;
    use datafusion::datasource::MemTable;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::prelude::{SessionConfig, SessionContext};

    /// Groups of durations with nulls, over two partitions.
    fn table() -> MemTable {
        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Utf8, true),
            Field::new("d", DataType::Int64, true),
            Field::new("f", DataType::Float64, true),
        ]));
        let part = |from: i64| {
            let ids: Vec<i64> = (from..from + 5_000).collect();
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(StringArray::from_iter(
                        ids.iter()
                            .map(|i| (i % 7 != 0).then(|| format!("g{}", i % 5))),
                    )),
                    Arc::new(Int64Array::from_iter(
                        ids.iter()
                            .map(|i| (i % 13 != 0).then_some(i * 7919 % 10_007)),
                    )),
                    Arc::new(Float64Array::from_iter(
                        ids.iter()
                            .map(|i| (i % 3 != 0).then_some((i * 31 % 997) as f64 / 3.0)),
                    )),
                ],
            )
            .unwrap()
        };
        MemTable::try_new(schema.clone(), vec![vec![part(0)], vec![part(5_000)]]).unwrap()
    }

    /// The answer's rows as text, in order, and the optimised logical plan.
    async fn run(sql: &str, shared: bool) -> (Vec<String>, String) {
        let mut config = SessionConfig::new().with_target_partitions(2);
        config.options_mut().sql_parser.dialect = datafusion::config::Dialect::PostgreSQL;
        let mut builder = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features();
        if shared {
            builder = builder.with_optimizer_rule(Arc::new(SharePercentiles));
        }
        let ctx = SessionContext::new_with_state(builder.build());
        super::super::functions::register(&ctx);
        ctx.register_table("t", Arc::new(table())).unwrap();
        let df = ctx.sql(sql).await.unwrap();
        let plan = df
            .clone()
            .into_optimized_plan()
            .unwrap()
            .display_indent()
            .to_string();
        let batches = df.collect().await.unwrap();
        (super::super::tests::text_rows(&batches), plan)
    }

    #[tokio::test]
    async fn shared_percentiles_answer_as_separate_calls() {
        let queries = [
            // grouped, ascending and descending, beside other aggregates, names kept
            "SELECT g, percentile_cont(0.5) WITHIN GROUP (ORDER BY d) AS p50, count(*) AS n, \
             percentile_cont(0.95) WITHIN GROUP (ORDER BY d), max(d), \
             percentile_cont(0.99) WITHIN GROUP (ORDER BY d) AS p99, \
             percentile_cont(0.9) WITHIN GROUP (ORDER BY d DESC) AS d90, \
             percentile_cont(0.25) WITHIN GROUP (ORDER BY d DESC) AS d25, \
             percentile_cont(0.5) WITHIN GROUP (ORDER BY f) AS f50, \
             percentile_cont(0.75) WITHIN GROUP (ORDER BY f) AS f75 \
             FROM t GROUP BY g ORDER BY g",
            // ungrouped, with an empty input
            "SELECT percentile_cont(0.1) WITHIN GROUP (ORDER BY d), percentile_cont(0.9) WITHIN GROUP (ORDER BY d) FROM t",
            "SELECT percentile_cont(0.1) WITHIN GROUP (ORDER BY d) AS a, percentile_cont(0.9) WITHIN GROUP (ORDER BY d) AS b FROM t WHERE d < 0",
            // groups with no values (all null) and an expression over the answers
            "SELECT g, percentile_cont(0.5) WITHIN GROUP (ORDER BY CASE WHEN g = 'g1' THEN NULL ELSE d END) AS a, \
             percentile_cont(0.99) WITHIN GROUP (ORDER BY CASE WHEN g = 'g1' THEN NULL ELSE d END) - 1 AS b \
             FROM t GROUP BY g HAVING percentile_cont(0.5) WITHIN GROUP (ORDER BY CASE WHEN g = 'g1' THEN NULL ELSE d END) IS NULL OR count(*) > 0 ORDER BY g",
        ];
        for q in queries {
            let (want, plain) = run(q, false).await;
            let (got, plan) = run(q, true).await;
            assert_eq!(got, want, "{q}\n{plan}");
            assert!(!plain.contains("percentile_cont["), "{plain}");
            assert!(plan.contains("percentile_cont["), "not shared: {q}\n{plan}");
        }
        // one call, a FILTER or DISTINCT: left to percentile_cont
        for q in [
            "SELECT g, percentile_cont(0.5) WITHIN GROUP (ORDER BY d) FROM t GROUP BY g ORDER BY g",
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d) FILTER (WHERE f > 1), percentile_cont(0.9) WITHIN GROUP (ORDER BY d) FROM t",
        ] {
            let (want, _) = run(q, false).await;
            let (got, plan) = run(q, true).await;
            assert_eq!(got, want, "{q}");
            assert!(!plan.contains("percentile_cont["), "{plan}");
        }
    }
}
