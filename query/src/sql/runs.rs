//! Partial aggregation that looks up each run of equal group keys once.
//!
//! A block keeps a trace's spans together in start order, so the keys of a typical dashboard
//! aggregation (service and minute, model version and minute, worker) repeat over long runs of
//! consecutive rows: a generation's decode tokens share all of them. DataFusion's partial
//! aggregation hashes and compares every row's key; at 2M spans that was a quarter of a
//! per-service-per-minute query's CPU. [`CollapseGroupRuns`] replaces each partial
//! `AggregateExec` whose aggregates all have grouped accumulators with a [`RunAggregateExec`]:
//! per batch it finds where any key changes (one vectorised comparison of each key column
//! with itself shifted by a row), interns only the first row of each run with DataFusion's own
//! group-value tables, and gives every row of the run that group. The accumulators, their
//! arguments and filters, the output (group columns, then each aggregate's state) and the
//! final aggregation above are DataFusion's, unchanged.
//!
//! Where runs are short (a batch with more than one run per two rows) the batch's keys are
//! interned row by row, as DataFusion does, and so are the next batches' without looking for
//! runs (a few batches on, it looks again). As DataFusion's partial aggregation does, it emits
//! what it holds early when the query's memory pool refuses more (the final aggregation merges
//! partial states however often they come), and stops aggregating, passing each row on as its
//! own state, when the first rows show almost one group per row.

use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use arrow::array::{
    Array, ArrayRef, AsArray, GenericByteViewArray, Int64Array, RecordBatch, UInt32Array,
};
use arrow::buffer::{Buffer, NullBuffer};
use arrow::compute::kernels::cmp::distinct;
use arrow::compute::take;
use arrow::datatypes::ArrowNativeType;
use arrow::datatypes::{ByteViewType, DataType, Int64Type, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{ScalarValue, Statistics};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::logical_expr::Operator;
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use datafusion::physical_expr::expressions::{BinaryExpr, Literal};
use datafusion::physical_expr::{OrderingRequirements, PhysicalExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::group_values::{GroupValues, new_group_values};
use datafusion::physical_plan::aggregates::order::GroupOrdering;
use datafusion::physical_plan::aggregates::{
    AggregateExec, AggregateMode, aggregate_expressions, evaluate_many,
};
use datafusion::physical_plan::distribution_requirements::InputDistributionRequirements;
use datafusion::physical_plan::execution_plan::{
    CardinalityEffect, ChildrenPropertiesMode, ReplaceChildrenOptions,
};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::{
    ChildStats, DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, RecordBatchStream,
    SendableRecordBatchStream, StatisticsArgs,
};
use futures::{Stream, StreamExt};

/// The physical optimizer rule; see the module documentation.
#[derive(Debug, Default)]
pub struct CollapseGroupRuns;

impl PhysicalOptimizerRule for CollapseGroupRuns {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(agg) = node.downcast_ref::<AggregateExec>() else {
                return Ok(Transformed::no(node));
            };
            if !RunAggregateExec::applies_to(agg) {
                return Ok(Transformed::no(node));
            }
            let agg = Arc::new(agg.clone());
            Ok(Transformed::yes(Arc::new(RunAggregateExec::new(agg))))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "collapse_group_runs"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// A partial `AggregateExec`, executed with each run of equal keys interned once. The
/// aggregate it stands for describes everything but the execution: expressions, schema,
/// properties and statistics.
#[derive(Debug)]
pub struct RunAggregateExec {
    agg: Arc<AggregateExec>,
    metrics: ExecutionPlanMetricsSet,
}

impl RunAggregateExec {
    fn new(agg: Arc<AggregateExec>) -> Self {
        Self {
            agg,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// Whether `agg` is a partial aggregation this operator computes the same way: one
    /// grouping set of at least one key, no limit or dynamic filter, and every aggregate with
    /// a grouped accumulator (no `DISTINCT`).
    ///
    /// The input may be ordered on some or all of the keys (a `UNION ALL` of one branch per
    /// dimension, each with its name as a constant key, is ordered on it): groups go out in
    /// the order their first rows came, early emits included, so the output keeps the order
    /// the aggregate declares. DataFusion's ordered modes emit finished groups sooner; here
    /// they stay until the end or until the memory pool refuses more, as in linear mode.
    fn applies_to(agg: &AggregateExec) -> bool {
        *agg.mode() == AggregateMode::Partial
            && agg.group_expr().is_single()
            && !agg.group_expr().expr().is_empty()
            && agg.limit_options().is_none()
            && agg.dynamic_expressions_produced().is_empty()
            && agg
                .aggr_expr()
                .iter()
                .all(|a| !a.is_distinct() && a.groups_accumulator_supported())
    }
}

impl DisplayAs for RunAggregateExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Agg<'a>(&'a AggregateExec, DisplayFormatType);
        impl fmt::Display for Agg<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt_as(self.1, f)
            }
        }
        let inner = Agg(&self.agg, t).to_string();
        let inner = inner.strip_prefix("AggregateExec: ").unwrap_or(&inner);
        write!(f, "RunAggregateExec: {inner}, key runs interned once")
    }
}

impl ExecutionPlan for RunAggregateExec {
    fn name(&self) -> &str {
        "RunAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.agg.properties()
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        self.agg.input_distribution_requirements()
    }

    fn required_input_ordering(&self) -> Vec<Option<OrderingRequirements>> {
        self.agg.required_input_ordering()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        self.agg.maintains_input_order()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.agg.input()]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        self.agg.apply_expressions(f)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let agg = self.agg.clone().replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )?;
        match agg.downcast_ref::<AggregateExec>() {
            Some(agg) if Self::applies_to(agg) => Ok(Arc::new(Self::new(Arc::new(agg.clone())))),
            // new children in an order the aggregate now uses: DataFusion's own stream
            _ => Ok(agg),
        }
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        self.agg.child_stats_requests(partition)
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        self.agg.statistics_from_inputs(input_stats, args)
    }

    fn cardinality_effect(&self) -> CardinalityEffect {
        self.agg.cardinality_effect()
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.agg.input().execute(partition, context.clone())?;
        let agg = &self.agg;
        let group_schema = agg.group_expr().group_schema(&agg.input_schema())?;
        let accumulators = agg
            .aggr_expr()
            .iter()
            .map(|a| a.create_groups_accumulator())
            .collect::<Result<Vec<_>>>()?;
        let options = &context.session_config().options().execution;
        let probe =
            (options.skip_partial_aggregation_probe_ratio_threshold < 1.0).then_some(Probe {
                rows: 0,
                rows_threshold: options.skip_partial_aggregation_probe_rows_threshold,
                ratio_threshold: options.skip_partial_aggregation_probe_ratio_threshold,
            });
        let reservation = MemoryConsumer::new(format!("RunAggregateExec[{partition}]"))
            .register(context.memory_pool());
        let metrics = MetricBuilder::new(&self.metrics);
        Ok(Box::pin(RunAggregateStream {
            schema: agg.schema(),
            input,
            keys: agg
                .group_expr()
                .expr()
                .iter()
                .map(|(e, _)| Key::of(e))
                .collect(),
            arguments: aggregate_expressions(agg.aggr_expr(), agg.mode(), 0)?,
            filters: agg.filter_expr().to_vec(),
            group_values: new_group_values(group_schema, &GroupOrdering::None)?,
            accumulators,
            run_groups: Vec::new(),
            row_groups: Vec::new(),
            reservation,
            batch_size: context.session_config().batch_size().max(1),
            probe,
            skipping: false,
            short_run_batches: 0,
            pending: VecDeque::new(),
            done: false,
            runs: metrics.clone().counter("key_runs", partition),
            skipped_rows: metrics
                .clone()
                .counter("skipped_aggregation_rows", partition),
            early_emits: metrics.clone().counter("early_emits", partition),
            baseline: BaselineMetrics::new(&self.metrics, partition),
        }))
    }
}

/// Whether to stop aggregating: checked after every batch once `rows_threshold` rows are in,
/// as DataFusion's partial aggregation checks it (and with the same settings).
struct Probe {
    rows: usize,
    rows_threshold: usize,
    ratio_threshold: f64,
}

struct RunAggregateStream {
    schema: SchemaRef,
    input: SendableRecordBatchStream,
    keys: Vec<Key>,
    arguments: Vec<Vec<Arc<dyn PhysicalExpr>>>,
    filters: Vec<Option<Arc<dyn PhysicalExpr>>>,
    group_values: Box<dyn GroupValues>,
    accumulators: Vec<Box<dyn GroupsAccumulator>>,
    /// Per batch: the group of each run's first row, and every row's group.
    run_groups: Vec<usize>,
    row_groups: Vec<usize>,
    reservation: MemoryReservation,
    batch_size: usize,
    probe: Option<Probe>,
    /// Past the probe with almost a group per row: rows go out as their own states.
    skipping: bool,
    /// Batches still to intern row by row without looking for runs (see [`SHORT_RUN_PAUSE`]).
    short_run_batches: u32,
    pending: VecDeque<RecordBatch>,
    done: bool,
    runs: Count,
    skipped_rows: Count,
    early_emits: Count,
    baseline: BaselineMetrics,
}

/// After a batch whose runs were short (a key that changes on nearly every row, such as a
/// latency bucket), the next this many batches are interned row by row without the search for
/// runs, which would cost a tenth of the aggregation to find none; the batch after them looks
/// again (a key's runs may lengthen further into the input).
const SHORT_RUN_PAUSE: u32 = 15;

impl RunAggregateStream {
    fn aggregate(&mut self, batch: &RecordBatch) -> Result<()> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(());
        }
        let keys = self.evaluate_keys(batch)?;
        if self.short_run_batches > 0 {
            // runs were short just before: row by row, without looking for them
            self.short_run_batches -= 1;
            self.runs.add(rows);
            self.group_values.intern(&keys, &mut self.row_groups)?;
            return self.accumulate(batch, rows);
        }
        let changes = key_changes(&keys, rows)?;
        let runs = runs_of(&changes);
        self.runs.add(runs.len());
        if runs.len() * 2 <= rows {
            let starts = UInt32Array::from_iter_values(runs.iter().map(|r| r.start as u32));
            let heads = keys
                .iter()
                .map(|k| take(k.as_ref(), &starts, None))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            self.group_values.intern(&heads, &mut self.run_groups)?;
            self.row_groups.clear();
            for (run, &group) in runs.iter().zip(&self.run_groups) {
                self.row_groups
                    .extend(std::iter::repeat_n(group, run.end - run.start));
            }
        } else {
            self.short_run_batches = SHORT_RUN_PAUSE;
            self.group_values.intern(&keys, &mut self.row_groups)?;
        }
        self.accumulate(batch, rows)
    }

    /// Every row of `batch` into its group (`row_groups`), then the probe.
    fn accumulate(&mut self, batch: &RecordBatch, rows: usize) -> Result<()> {
        let groups = self.group_values.len();
        let arguments = evaluate_many(&self.arguments, batch)?;
        for ((acc, values), filter) in self
            .accumulators
            .iter_mut()
            .zip(&arguments)
            .zip(&self.filters)
        {
            let filter = filter_rows(filter, batch)?;
            acc.update_batch(
                values,
                &self.row_groups,
                filter.as_ref().map(|f| f.as_boolean()),
                groups,
            )?;
        }
        if let Some(probe) = &mut self.probe {
            probe.rows += rows;
            if probe.rows >= probe.rows_threshold
                && groups as f64 / probe.rows as f64 > probe.ratio_threshold
            {
                self.probe = None;
                self.skipping = true;
                self.emit()?;
            }
        }
        if self.reservation.try_resize(self.held()).is_err() {
            // the pool is full: what is held goes on to the final aggregation now
            self.early_emits.add(1);
            self.emit()?;
        }
        Ok(())
    }

    fn evaluate_keys(&self, batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
        self.keys.iter().map(|k| k.evaluate(batch)).collect()
    }

    /// A batch past the probe: each row its own partial state.
    fn pass_on(&mut self, batch: &RecordBatch) -> Result<()> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(());
        }
        let mut columns = self.evaluate_keys(batch)?;
        let arguments = evaluate_many(&self.arguments, batch)?;
        for ((acc, values), filter) in self.accumulators.iter().zip(&arguments).zip(&self.filters) {
            let filter = filter_rows(filter, batch)?;
            columns.extend(acc.convert_to_state(values, filter.as_ref().map(|f| f.as_boolean()))?);
        }
        self.skipped_rows.add(rows);
        self.pending
            .push_back(RecordBatch::try_new(self.schema.clone(), columns)?);
        Ok(())
    }

    /// Every group held so far, as partial states in batches of the session's size.
    fn emit(&mut self) -> Result<()> {
        if self.group_values.is_empty() {
            return Ok(());
        }
        let mut columns = self.group_values.emit(EmitTo::All)?;
        for acc in &mut self.accumulators {
            columns.extend(acc.state(EmitTo::All)?);
        }
        self.group_values.clear_shrink(self.batch_size);
        let batch = RecordBatch::try_new(self.schema.clone(), columns)?;
        let mut offset = 0;
        while offset < batch.num_rows() {
            let len = self.batch_size.min(batch.num_rows() - offset);
            self.pending.push_back(batch.slice(offset, len));
            offset += len;
        }
        // what the states hold now lives in the batches on their way out
        let _ = self.reservation.try_resize(self.held());
        Ok(())
    }

    fn held(&self) -> usize {
        self.group_values.size()
            + self.accumulators.iter().map(|a| a.size()).sum::<usize>()
            + (self.row_groups.capacity() + self.run_groups.capacity()) * size_of::<usize>()
    }

    fn next_batch(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<RecordBatch>>> {
        loop {
            if let Some(batch) = self.pending.pop_front() {
                return Poll::Ready(Some(Ok(batch)));
            }
            if self.done {
                return Poll::Ready(None);
            }
            let polled = ready!(self.input.poll_next_unpin(cx));
            let elapsed = self.baseline.elapsed_compute().clone();
            let _timer = elapsed.timer();
            let step = match polled {
                Some(Ok(batch)) if self.skipping => self.pass_on(&batch),
                Some(Ok(batch)) => self.aggregate(&batch),
                Some(Err(e)) => Err(e),
                None => {
                    self.done = true;
                    let emitted = self.emit();
                    self.reservation.free();
                    emitted
                }
            };
            if let Err(e) = step {
                self.done = true;
                self.pending.clear();
                self.reservation.free();
                return Poll::Ready(Some(Err(e)));
            }
        }
    }
}

/// Per row, whether its key may differ from the row before's (the first row's always does).
///
/// A row is flagged wherever its key is not the same to the bit (or, for strings, the same
/// bytes) as the previous row's. Equal keys with different bits (`0.0` and `-0.0`) only split
/// a run in two: both runs are interned and get the same group.
pub(super) fn key_changes(keys: &[ArrayRef], rows: usize) -> Result<Vec<bool>> {
    let mut changed = vec![false; rows];
    if rows == 0 {
        return Ok(changed);
    }
    changed[0] = true;
    for key in keys {
        let nulls = key.logical_nulls().filter(|n| n.null_count() > 0);
        let nulls = nulls.as_ref();
        match (key.data_type(), key.data_type().primitive_width()) {
            (DataType::Utf8View, _) => views(&mut changed, nulls, key.as_string_view()),
            (DataType::BinaryView, _) => views(&mut changed, nulls, key.as_binary_view()),
            (_, Some(width @ (1 | 2 | 4 | 8))) => {
                // fixed-width values, one buffer of them (16-byte ones, whose buffers need not
                // be aligned for u128, take arrow's comparison below)
                let data = key.to_data();
                let (buffer, offset) = (&data.buffers()[0], data.offset());
                match width {
                    1 => bits::<u8>(&mut changed, nulls, buffer, offset),
                    2 => bits::<u16>(&mut changed, nulls, buffer, offset),
                    4 => bits::<u32>(&mut changed, nulls, buffer, offset),
                    _ => bits::<u64>(&mut changed, nulls, buffer, offset),
                }
            }
            _ => {
                // other types: arrow's comparison, which compares nulls too
                let differs = distinct(&key.slice(1, rows - 1), &key.slice(0, rows - 1))?;
                for (i, d) in differs.values().iter().enumerate() {
                    changed[i + 1] |= d;
                }
            }
        }
    }
    Ok(changed)
}

/// Flags row `i` where `differs(i)` says its value is not the previous row's, or where one of
/// the two is null and the other not (two nulls are the same key).
fn mark(changed: &mut [bool], nulls: Option<&NullBuffer>, differs: impl Fn(usize) -> bool) {
    match nulls {
        None => {
            for (i, c) in changed.iter_mut().enumerate().skip(1) {
                *c |= differs(i);
            }
        }
        Some(nulls) => {
            for (i, c) in changed.iter_mut().enumerate().skip(1) {
                *c |= match (nulls.is_valid(i), nulls.is_valid(i - 1)) {
                    (true, true) => differs(i),
                    (a, b) => a != b,
                };
            }
        }
    }
}

/// Fixed-width values compared as unsigned integers of their width (to the bit).
fn bits<T: ArrowNativeType + Eq>(
    changed: &mut [bool],
    nulls: Option<&NullBuffer>,
    buffer: &Buffer,
    offset: usize,
) {
    let values = &buffer.typed_data::<T>()[offset..];
    mark(changed, nulls, |i| values[i] != values[i - 1]);
}

fn views<T: ByteViewType + ?Sized>(
    changed: &mut [bool],
    nulls: Option<&NullBuffer>,
    array: &GenericByteViewArray<T>,
) {
    let raw = array.views();
    // equal views are equal values (the same inline bytes, or the same bytes of the same
    // buffer); unequal ones may still hold equal bytes
    mark(changed, nulls, |i| {
        raw[i] != raw[i - 1] && {
            let (a, b): (&[u8], &[u8]) = (array.value(i).as_ref(), array.value(i - 1).as_ref());
            a != b
        }
    });
}

/// Each run's rows, from the flags of [`key_changes`].
pub(super) fn runs_of(changed: &[bool]) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    let mut start = 0;
    for (i, &c) in changed.iter().enumerate().skip(1) {
        if c {
            runs.push(start..i);
            start = i;
        }
    }
    if !changed.is_empty() {
        runs.push(start..changed.len());
    }
    runs
}

/// An aggregate's `FILTER (WHERE …)`, evaluated over a batch.
fn filter_rows(
    filter: &Option<Arc<dyn PhysicalExpr>>,
    batch: &RecordBatch,
) -> Result<Option<ArrayRef>> {
    filter
        .as_ref()
        .map(|f| f.evaluate(batch)?.into_array(batch.num_rows()))
        .transpose()
}

/// A group key expression (of the one grouping set `applies_to` admits).
enum Key {
    Expr(Arc<dyn PhysicalExpr>),
    /// `dividend / divisor` over int64 with a literal divisor other than 0 and -1 (so no row
    /// can fail or overflow), as time buckets are written (`CAST(date_bin(…) AS BIGINT) /
    /// 1000`), optionally times a literal (`CAST(start_time AS BIGINT) / 60000000000 *
    /// 60000000`): the key is computed once per run of equal dividends, not per row.
    DivideBy {
        whole: Arc<dyn PhysicalExpr>,
        dividend: Arc<dyn PhysicalExpr>,
        divisor: i64,
        multiplier: Option<i64>,
    },
}

impl Key {
    fn of(expr: &Arc<dyn PhysicalExpr>) -> Self {
        fn int_literal(e: &Arc<dyn PhysicalExpr>) -> Option<i64> {
            match e.downcast_ref::<Literal>()?.value() {
                ScalarValue::Int64(Some(v)) => Some(*v),
                _ => None,
            }
        }
        fn division(e: &Arc<dyn PhysicalExpr>) -> Option<(Arc<dyn PhysicalExpr>, i64)> {
            let binary = e.downcast_ref::<BinaryExpr>()?;
            let divisor = int_literal(binary.right())?;
            (*binary.op() == Operator::Divide && divisor != 0 && divisor != -1)
                .then(|| (binary.left().clone(), divisor))
        }
        if let Some((dividend, divisor)) = division(expr) {
            return Self::DivideBy {
                whole: expr.clone(),
                dividend,
                divisor,
                multiplier: None,
            };
        }
        if let Some(binary) = expr.downcast_ref::<BinaryExpr>()
            && *binary.op() == Operator::Multiply
            && let Some(multiplier) = int_literal(binary.right())
            && let Some((dividend, divisor)) = division(binary.left())
        {
            return Self::DivideBy {
                whole: expr.clone(),
                dividend,
                divisor,
                multiplier: Some(multiplier),
            };
        }
        Self::Expr(expr.clone())
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ArrayRef> {
        match self {
            Self::Expr(e) => e.evaluate(batch)?.into_array(batch.num_rows()),
            Self::DivideBy {
                whole,
                dividend,
                divisor,
                multiplier,
            } => {
                let dividend = dividend.evaluate(batch)?.into_array(batch.num_rows())?;
                let Some(values) = dividend.as_primitive_opt::<Int64Type>() else {
                    // not int64 after all: DataFusion's own arithmetic
                    return whole.evaluate(batch)?.into_array(batch.num_rows());
                };
                let key = |v: i64| match multiplier {
                    None => Some(v / divisor),
                    Some(m) => (v / divisor).checked_mul(*m),
                };
                let mut last: Option<(i64, i64)> = None;
                let mut keys = Vec::with_capacity(values.len());
                for &v in values.values() {
                    if last.is_none_or(|(l, _)| l != v) {
                        // an overflowing product: DataFusion's own arithmetic answers for the
                        // batch, as without this path
                        let Some(k) = key(v) else {
                            return whole.evaluate(batch)?.into_array(batch.num_rows());
                        };
                        last = Some((v, k));
                    }
                    keys.push(last.expect("set above").1);
                }
                Ok(Arc::new(Int64Array::new(
                    keys.into(),
                    values.nulls().cloned(),
                )))
            }
        }
    }
}

impl Stream for RunAggregateStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let poll = self.next_batch(cx);
        self.baseline.record_poll(poll)
    }
}

impl RecordBatchStream for RunAggregateStream {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int64Array, StringViewArray};
    use arrow::datatypes::{Field, Schema};
    use datafusion::datasource::MemTable;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::execution::runtime_env::RuntimeEnvBuilder;
    use datafusion::prelude::{SessionConfig, SessionContext};

    /// Rows in runs of equal keys (as a block's trace keeps them), with null keys and values,
    /// long and short strings, and float keys that are equal with different bits.
    fn table(partitions: usize, rows_each: usize) -> MemTable {
        let schema = Arc::new(Schema::new(vec![
            Field::new("i", DataType::Int64, false),
            Field::new("a", DataType::Utf8View, true),
            Field::new("b", DataType::Int64, true),
            Field::new("c", DataType::Float64, false),
            Field::new("v", DataType::Float64, true),
        ]));
        let parts = (0..partitions)
            .map(|p| {
                (0..rows_each)
                    .step_by(1000)
                    .map(|from| {
                        let ids: Vec<i64> = (from..(from + 1000).min(rows_each))
                            .map(|r| (p * rows_each + r) as i64)
                            .collect();
                        let a =
                            StringViewArray::from_iter(ids.iter().map(|&i| match (i / 37) % 6 {
                                0 => None,
                                1 => Some("short".to_owned()),
                                n => Some(format!("a-service-name-longer-than-twelve-{n}")),
                            }));
                        let b = Int64Array::from_iter(
                            ids.iter()
                                .map(|&i| ((i / 100) % 17 != 3).then_some((i / 100) % 13)),
                        );
                        let c = Float64Array::from_iter_values(ids.iter().map(|&i| {
                            match (i / 50) % 4 {
                                0 => 0.0,
                                1 => -0.0,
                                2 => f64::NAN,
                                _ => 1.5,
                            }
                        }));
                        let v = Float64Array::from_iter(
                            ids.iter()
                                .map(|&i| (i % 11 != 0).then_some((i * 7919 % 1000) as f64)),
                        );
                        RecordBatch::try_new(
                            schema.clone(),
                            vec![
                                Arc::new(Int64Array::from(ids)),
                                Arc::new(a),
                                Arc::new(b),
                                Arc::new(c),
                                Arc::new(v),
                            ],
                        )
                        .unwrap()
                    })
                    .collect()
            })
            .collect();
        MemTable::try_new(schema, parts).unwrap()
    }

    /// The query's rows (sorted, as text) and its `EXPLAIN ANALYZE`, with or without the rule.
    async fn run(sql: &str, runs: bool, settings: &[&str], memory: usize) -> (Vec<String>, String) {
        let mut builder = SessionStateBuilder::new()
            .with_config(
                SessionConfig::new()
                    .with_target_partitions(3)
                    .with_batch_size(512),
            )
            .with_runtime_env(
                RuntimeEnvBuilder::new()
                    .with_memory_limit(memory, 1.0)
                    .build_arc()
                    .unwrap(),
            )
            .with_default_features();
        if runs {
            builder = builder.with_physical_optimizer_rule(Arc::new(CollapseGroupRuns));
        }
        let ctx = SessionContext::new_with_state(builder.build());
        super::super::functions::register(&ctx);
        ctx.register_table("t", Arc::new(table(3, 20_000))).unwrap();
        for s in settings {
            ctx.sql(s).await.unwrap().collect().await.unwrap();
        }
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let mut rows = super::super::tests::text_rows(&batches);
        rows.sort();
        let explain = ctx
            .sql(&format!("EXPLAIN ANALYZE {sql}"))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let plan = arrow::util::pretty::pretty_format_batches(&explain)
            .unwrap()
            .to_string();
        (rows, plan)
    }

    fn metric(plan: &str, name: &str) -> usize {
        let at = plan
            .find(&format!("{name}="))
            .unwrap_or_else(|| panic!("{name} in {plan}"));
        let digits: String = plan[at + name.len() + 1..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        digits.parse().unwrap()
    }

    #[tokio::test]
    async fn answers_equal_datafusion_s_partial_aggregation() {
        let queries = [
            "SELECT a, b, count(*), sum(v), avg(v), min(v), max(i), \
             percentile_cont(0.9) WITHIN GROUP (ORDER BY v), count(v) FILTER (WHERE v > 500) \
             FROM t GROUP BY a, b",
            "SELECT c, count(*), sum(v) FROM t GROUP BY c",
            // aggregates whose arguments carry an ordering
            "SELECT a, first_value(v ORDER BY i DESC), last_value(b ORDER BY i) FROM t GROUP BY a",
            "SELECT a, count(*) FROM t WHERE i % 3 = 0 GROUP BY a",
            // a key that changes on every row: interned row by row
            "SELECT i % 7919, count(*), min(a) FROM t GROUP BY 1",
            // int64 keys divided by a literal: negative dividends truncate toward zero, nulls
            // stay null, and -1 (which can overflow) is left to DataFusion's division
            "SELECT (i - 30000) / 7, b / 2, count(*) FROM t GROUP BY 1, 2",
            "SELECT (i / 100 - 300) / -3, i / -1 % 2, count(*) FROM t GROUP BY 1, 2",
            // a quotient times a literal (minutes written by integer division of the epoch),
            // and a product that overflows (DataFusion's own arithmetic answers)
            "SELECT (i - 30000) / 7 * 5, b / 2 * -3, count(*) FROM t GROUP BY 1, 2",
            "SELECT i / 3 * 4611686018427387904, count(*) FROM t GROUP BY 1",
            // runs short at first (interned row by row, then without looking for runs for a
            // few batches), long after
            "SELECT CASE WHEN i % 20000 < 9000 THEN i ELSE i / 1000 END, count(*), sum(v) \
             FROM t GROUP BY 1",
        ];
        for q in queries {
            let (plain, before) = run(q, false, &[], usize::MAX).await;
            let (with, after) = run(q, true, &[], usize::MAX).await;
            assert!(!before.contains("RunAggregateExec"), "{before}");
            assert!(after.contains("RunAggregateExec"), "{after}");
            assert!(!plain.is_empty(), "{q}");
            assert_eq!(with, plain, "{q}");
        }
        // runs were found: far fewer than rows for the (a, b) grouping
        let (_, plan) = run(queries[0], true, &[], usize::MAX).await;
        assert!(metric(&plan, "key_runs") < 60_000 / 20, "{plan}");
    }

    #[tokio::test]
    async fn ordered_inputs_keep_their_order() {
        // one branch per dimension, the dimension a constant key (input partly sorted)
        let union = "SELECT k, b, count(*), sum(v) FROM \
             (SELECT 'x' AS k, b, v FROM t UNION ALL SELECT 'y' AS k, b, v FROM t UNION ALL SELECT 'z' AS k, a AS b, v FROM t) \
             GROUP BY k, b";
        // in one partition, the final aggregation reads the partial one's output as it comes
        let one = ["SET datafusion.execution.target_partitions = 1"];
        let queries: [(&str, &[&str]); 4] = [
            (union, &[]),
            (union, &one),
            // input sorted on every key, or on the first
            (
                "SELECT a, b, count(*), max(v) FROM (SELECT a, b, v FROM t ORDER BY a, b LIMIT 1000000) GROUP BY a, b",
                &[],
            ),
            (
                "SELECT a, c, count(*) FROM (SELECT a, c FROM t ORDER BY a LIMIT 1000000) GROUP BY a, c",
                &[],
            ),
        ];
        for (q, settings) in queries {
            let (plain, before) = run(q, false, settings, usize::MAX).await;
            let (with, after) = run(q, true, settings, usize::MAX).await;
            assert!(
                before.contains("mode=Partial") && before.contains("Sorted"),
                "{before}"
            );
            assert!(after.contains("RunAggregateExec"), "{after}");
            assert!(!plain.is_empty(), "{q}");
            assert_eq!(with, plain, "{q}");
        }
    }

    #[tokio::test]
    async fn distinct_and_ordered_aggregates_stay_with_datafusion() {
        let q = "SELECT a, array_agg(b ORDER BY i DESC), count(DISTINCT b) FROM t GROUP BY a";
        let (plain, _) = run(q, false, &[], usize::MAX).await;
        let (with, plan) = run(q, true, &[], usize::MAX).await;
        assert_eq!(with, plain);
        assert!(!plan.contains("RunAggregateExec"), "{plan}");
    }

    #[tokio::test]
    async fn almost_a_group_per_row_passes_rows_on_as_states() {
        let q = "SELECT i, count(*), sum(v), percentile_cont(0.5) WITHIN GROUP (ORDER BY v) \
                 FROM t GROUP BY i";
        let settings = [
            "SET datafusion.execution.skip_partial_aggregation_probe_rows_threshold = 1000",
            "SET datafusion.execution.skip_partial_aggregation_probe_ratio_threshold = 0.5",
        ];
        let (plain, _) = run(q, false, &settings, usize::MAX).await;
        let (with, plan) = run(q, true, &settings, usize::MAX).await;
        assert_eq!(with.len(), 60_000);
        assert_eq!(with, plain);
        assert!(metric(&plan, "skipped_aggregation_rows") > 0, "{plan}");
    }

    #[tokio::test]
    async fn a_full_memory_pool_emits_partial_states_early() {
        let ctx = SessionContext::new_with_state(
            SessionStateBuilder::new()
                .with_config(
                    SessionConfig::new()
                        .with_target_partitions(3)
                        .with_batch_size(512),
                )
                .with_default_features()
                .with_physical_optimizer_rule(Arc::new(CollapseGroupRuns))
                .build(),
        );
        ctx.register_table("t", Arc::new(table(3, 20_000))).unwrap();
        let plan = ctx
            .sql("SELECT i % 20000, count(*), sum(v) FROM t GROUP BY 1")
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let mut partial = None;
        plan.apply(|node| {
            if node.is::<RunAggregateExec>() {
                partial = Some(node.clone());
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
        let partial = partial.expect("a RunAggregateExec");
        // the partial aggregation alone, in a pool far smaller than its 20,000 groups
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_limit(64 << 10, 1.0)
            .build_arc()
            .unwrap();
        let task = Arc::new(TaskContext::default().with_runtime(runtime));
        let mut counts = std::collections::HashMap::<i64, i64>::new();
        let mut states = 0;
        for p in 0..partial.properties().partitioning.partition_count() {
            let mut stream = partial.execute(p, task.clone()).unwrap();
            while let Some(batch) = stream.next().await {
                let batch = batch.unwrap();
                states += batch.num_rows();
                let keys = batch
                    .column(0)
                    .as_primitive::<arrow::datatypes::Int64Type>();
                let n = batch
                    .column(1)
                    .as_primitive::<arrow::datatypes::Int64Type>();
                for r in 0..batch.num_rows() {
                    *counts.entry(keys.value(r)).or_default() += n.value(r);
                }
            }
        }
        let metrics = partial.metrics().unwrap();
        let early = metrics
            .iter()
            .filter(|m| m.value().name() == "early_emits")
            .map(|m| m.value().as_usize())
            .sum::<usize>();
        assert!(early > 0, "no early emit");
        // states of one key came out more than once, and nothing was lost
        assert!(states > 20_000, "{states} states");
        assert_eq!(counts.len(), 20_000);
        assert!(counts.values().all(|&n| n == 3), "counts other than 3");
    }
}
