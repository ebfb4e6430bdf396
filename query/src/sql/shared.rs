//! Computing a repeated subplan once.
//!
//! DataFusion inlines every reference to a common table expression, so a query that uses a CTE
//! twice (or five times, as a `UNION ALL` over dimensions does) plans, reads and aggregates it
//! that many times. [`ShareRepeatedSubplans`] runs after DataFusion's own physical optimizer,
//! finds subtrees that occur more than once (same operators, same expressions, scans of the
//! same snapshot with the same push-down) and replaces every occurrence with a [`SharedExec`]:
//! the first consumer to ask for any partition runs one copy, all its partitions at once, and
//! keeps their batches; every consumer reads those batches.
//!
//! Only subtrees whose leaves are all Weft scans are shared (two scans with equal keys read
//! the same rows of the query's one snapshot), never ones that evaluate volatile functions.
//! The kept batches are counted against the query's memory pool; when they would not all fit,
//! each consumer runs its own copy for every partition, as without sharing. Scans inside a
//! shared subtree drop the dynamic filters parent operators pushed into them (a TopK's or a
//! join's), which only skip blocks: one consumer's filter must not decide what the others see.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::{
    Array, DictionaryArray, Int32Array, RecordBatch, RecordBatchOptions, UInt32Array,
};
use arrow::compute::{cast, take};
use arrow::datatypes::{DataType, Int32Type, Schema, SchemaRef};
use datafusion::common::Statistics;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::execution_plan::{
    ChildrenPropertiesMode, ReplaceChildrenOptions, reset_plan_states,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildStats, DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
    SendableRecordBatchStream, StatisticsArgs, displayable,
};
use futures::{StreamExt, TryStreamExt};
use tokio::sync::OnceCell;

use super::runs::{key_changes, runs_of};
use super::scan::WeftScanExec;
use super::tracejoin::TraceLocalJoinExec;

/// Function names whose value changes from call to call: subtrees using them are not shared.
const VOLATILE: &[&str] = &["random(", "uuid("];

/// The physical optimizer rule; see the module documentation.
#[derive(Debug, Default)]
pub struct ShareRepeatedSubplans;

impl PhysicalOptimizerRule for ShareRepeatedSubplans {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let mut keys = HashMap::new();
        let mut counts = HashMap::new();
        fingerprint(&plan, &mut keys, &mut counts);
        if !counts.values().any(|&n| n > 1) {
            return Ok(plan);
        }
        let mut states = HashMap::new();
        share(plan, &keys, &counts, 1, &mut states)
    }

    fn name(&self) -> &str {
        "share_repeated_subplans"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

fn node_id(plan: &Arc<dyn ExecutionPlan>) -> usize {
    Arc::as_ptr(plan) as *const () as usize
}

/// A subtree's key, when it may be shared: the operators' own descriptions, nested as the
/// tree is. Every subtree is counted, including those under a node that is not shareable.
fn fingerprint(
    plan: &Arc<dyn ExecutionPlan>,
    keys: &mut HashMap<usize, String>,
    counts: &mut HashMap<String, usize>,
) -> Option<String> {
    // a trace-local join reads its children's scans block by block, never runs them: they are
    // part of its key, not subtrees to share
    let (mut own_keys, mut own_counts) = (HashMap::new(), HashMap::new());
    let (keys_below, counts_below) = match plan.is::<TraceLocalJoinExec>() {
        true => (&mut own_keys, &mut own_counts),
        false => (&mut *keys, &mut *counts),
    };
    let children: Vec<Option<String>> = plan
        .children()
        .into_iter()
        .map(|c| fingerprint(c, keys_below, counts_below))
        .collect();
    let mut key = if let Some(scan) = plan.downcast_ref::<WeftScanExec>() {
        scan.share_key()
    } else {
        if children.is_empty() || plan.is::<SharedExec>() {
            return None; // a leaf other than a Weft scan: its data is not identified
        }
        displayable(plan.as_ref()).one_line().to_string()
    };
    if VOLATILE.iter().any(|v| key.contains(v)) {
        return None; // a scan's row filter too
    }
    for child in children {
        key.push('(');
        key.push_str(&child?);
        key.push(')');
    }
    *counts.entry(key.clone()).or_default() += 1;
    keys.insert(node_id(plan), key.clone());
    Some(key)
}

/// Replaces repeated subtrees with consumers of one shared copy. The first occurrence is
/// rewritten (its own repeated parts shared in turn, when they repeat more often than it
/// does) and runs; later occurrences keep their original subtree, run only as a fallback.
fn share(
    plan: Arc<dyn ExecutionPlan>,
    keys: &HashMap<usize, String>,
    counts: &HashMap<String, usize>,
    min_count: usize,
    states: &mut HashMap<String, Arc<SharedState>>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let key = keys
        .get(&node_id(&plan))
        .filter(|k| counts.get(*k).is_some_and(|&n| n > min_count.max(1)))
        .cloned();
    if let Some(state) = key.as_ref().and_then(|k| states.get(k)) {
        state.consumers.fetch_add(1, Ordering::Relaxed);
        return Ok(Arc::new(SharedExec::new(plan, state.clone())));
    }
    let inner_min = key.as_ref().map_or(min_count, |k| counts[k]);
    let children: Vec<Arc<dyn ExecutionPlan>> = match plan.is::<TraceLocalJoinExec>() {
        true => Vec::new(), // see `fingerprint`
        false => plan.children().into_iter().cloned().collect(),
    };
    let mut changed = false;
    let mut new_children = Vec::with_capacity(children.len());
    for child in children {
        let shared = share(child.clone(), keys, counts, inner_min, states)?;
        changed |= !Arc::ptr_eq(&shared, &child);
        new_children.push(shared);
    }
    let node = if changed {
        plan.replace_children(
            new_children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )?
    } else {
        plan
    };
    let Some(key) = key else {
        return Ok(node);
    };
    let node = without_parent_filters(node)?;
    let state = Arc::new(SharedState::new(node.clone(), states.len() + 1)?);
    states.insert(key, state.clone());
    Ok(Arc::new(SharedExec::new(node, state)))
}

/// The subtree with every Weft scan's parent filters dropped.
fn without_parent_filters(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        if let Some(scan) = node.downcast_ref::<WeftScanExec>() {
            let stripped: Arc<dyn ExecutionPlan> = Arc::new(scan.without_parent_filters());
            return Ok(Transformed::yes(stripped));
        }
        Ok(Transformed::no(node))
    })
    .map(|t| t.data)
}

/// What running the shared copy gave.
enum Outcome {
    /// Every partition's batches, each until every consumer has taken it.
    Kept {
        partitions: Vec<KeptPartition>,
        reservation: Mutex<MemoryReservation>,
        /// Batches kept, for EXPLAIN ANALYZE.
        batches: usize,
    },
    /// The batches would not fit in the query's memory: consumers run their own copies.
    TooLarge,
}

struct KeptPartition {
    batches: Mutex<Option<Vec<RecordBatch>>>,
    bytes: usize,
    /// Consumers that have not read the partition yet.
    waiting: AtomicUsize,
}

impl Outcome {
    /// One consumer's read of a partition: the batches, dropped (and their memory released)
    /// after the last consumer's read; `None` when they were never kept.
    fn take(&self, partition: usize) -> Option<Vec<RecordBatch>> {
        let Outcome::Kept {
            partitions,
            reservation,
            ..
        } = self
        else {
            return None;
        };
        let p = partitions.get(partition)?;
        let mut kept = p.batches.lock().unwrap_or_else(|e| e.into_inner());
        let out = kept.clone();
        if p.waiting.fetch_sub(1, Ordering::AcqRel) <= 1 && kept.take().is_some() {
            reservation
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .shrink(p.bytes);
        }
        out
    }
}

type Cell = OnceCell<std::result::Result<Arc<Outcome>, Arc<DataFusionError>>>;

struct SharedState {
    id: usize,
    consumers: AtomicUsize,
    /// The copy that runs: one of its own, never a consumer's fallback, since a plan's
    /// partitions may not run twice (a repartition's channels are used once).
    plan: Arc<dyn ExecutionPlan>,
    outcome: Cell,
}

impl SharedState {
    fn new(plan: Arc<dyn ExecutionPlan>, id: usize) -> Result<Self> {
        Ok(Self {
            id,
            consumers: AtomicUsize::new(1),
            plan: reset_plan_states(plan)?,
            outcome: OnceCell::new(),
        })
    }

    /// Runs every partition of the shared copy, each on a task of its own, and keeps all
    /// their batches, or none: whether they fit is decided for the whole copy, so that every
    /// consumer reads either the shared partitions or its own copy's, never a mix (a
    /// repartition need not send the same rows to the same partition twice).
    async fn run(&self, context: Arc<TaskContext>) -> Result<Outcome> {
        let reservation = Arc::new(Mutex::new(
            MemoryConsumer::new(format!("SharedExec[{}]", self.id)).register(context.memory_pool()),
        ));
        let too_large = Arc::new(AtomicBool::new(false));
        let n = self.plan.properties().partitioning.partition_count();
        let tasks: Vec<_> = (0..n)
            .map(|partition| {
                let plan = self.plan.clone();
                let context = context.clone();
                let reservation = reservation.clone();
                let too_large = too_large.clone();
                SpawnedTask::spawn(async move {
                    let mut stream = plan.execute(partition, context)?;
                    let mut batches = Vec::new();
                    let mut total = 0;
                    while let Some(batch) = stream.next().await {
                        if too_large.load(Ordering::Relaxed) {
                            return Ok(None);
                        }
                        let batch = pack(batch?)?;
                        // the batch's own share of its buffers (scans hand out slices of
                        // larger arrays)
                        let bytes: usize = batch
                            .columns()
                            .iter()
                            .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0))
                            .sum();
                        let grown = reservation
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .try_grow(bytes);
                        if grown.is_err() {
                            too_large.store(true, Ordering::Relaxed);
                            return Ok(None);
                        }
                        total += bytes;
                        batches.push(batch);
                    }
                    Ok::<_, DataFusionError>(Some((batches, total)))
                })
            })
            .collect();
        let consumers = self.consumers.load(Ordering::Relaxed);
        let mut partitions = Vec::with_capacity(n);
        let mut kept_batches = 0;
        for task in tasks {
            let kept = task
                .join_unwind()
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))??;
            if let Some((batches, bytes)) = kept {
                kept_batches += batches.len();
                partitions.push(KeptPartition {
                    batches: Mutex::new(Some(batches)),
                    bytes,
                    waiting: AtomicUsize::new(consumers),
                });
            }
        }
        if too_large.load(Ordering::Relaxed) {
            return Ok(Outcome::TooLarge);
        }
        let reservation = Arc::try_unwrap(reservation)
            .map_err(|_| DataFusionError::Internal("SharedExec: a partition still runs".into()))?;
        Ok(Outcome::Kept {
            partitions,
            reservation,
            batches: kept_batches,
        })
    }
}

/// Text columns whose values come in runs (a trace's id over its spans' rows) are kept with
/// each run's value once and a key per row: the decode side of a join over trace ids takes
/// about a third of the memory, and more of it fits in the query's budget.
fn pack(batch: RecordBatch) -> Result<RecordBatch> {
    let rows = batch.num_rows();
    if rows < PACK_MIN_ROWS {
        return Ok(batch);
    }
    let mut columns = batch.columns().to_vec();
    let mut packed = false;
    for column in columns.iter_mut() {
        if column.data_type() != &DataType::Utf8 || column.null_count() > 0 {
            continue;
        }
        let runs = runs_of(&key_changes(std::slice::from_ref(column), rows)?);
        if runs.len() * PACK_ROWS_PER_RUN > rows {
            continue; // runs too short to pay
        }
        let starts = UInt32Array::from_iter_values(runs.iter().map(|r| r.start as u32));
        let keys = Int32Array::from_iter_values(
            runs.iter()
                .enumerate()
                .flat_map(|(k, r)| std::iter::repeat_n(k as i32, r.len())),
        );
        let values = take(column.as_ref(), &starts, None)?;
        *column = Arc::new(DictionaryArray::<Int32Type>::try_new(keys, values)?);
        packed = true;
    }
    if !packed {
        return Ok(batch);
    }
    let fields: Vec<_> = batch
        .schema()
        .fields()
        .iter()
        .zip(&columns)
        .map(|(f, c)| f.as_ref().clone().with_data_type(c.data_type().clone()))
        .collect();
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// A kept batch as the subtree made it (see [`pack`]).
fn unpack(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    if batch.schema().fields() == schema.fields() {
        return Ok(batch);
    }
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(c.clone())
            } else {
                Ok(cast(c, f.data_type())?)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )?)
}

/// Batches shorter than this are kept as they are.
const PACK_MIN_ROWS: usize = 256;
/// A text column is packed when its runs are this many rows long on average, or longer.
const PACK_ROWS_PER_RUN: usize = 4;

/// One consumer of a shared subtree. Its child is its own copy of the subtree (shown by
/// EXPLAIN, run only when the shared batches would not fit in memory).
pub struct SharedExec {
    input: Arc<dyn ExecutionPlan>,
    state: Arc<SharedState>,
}

impl SharedExec {
    fn new(input: Arc<dyn ExecutionPlan>, state: Arc<SharedState>) -> Self {
        Self { input, state }
    }
}

impl fmt::Debug for SharedExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedExec({})", self.state.id)
    }
}

impl DisplayAs for SharedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SharedExec: id={}, consumers={} ",
            self.state.id,
            self.state.consumers.load(Ordering::Relaxed)
        )?;
        // once it ran (EXPLAIN ANALYZE), what happened
        match self.state.outcome.get() {
            None => write!(
                f,
                "(computed once if its batches fit in the query's memory)"
            ),
            Some(Ok(outcome)) => match outcome.as_ref() {
                Outcome::Kept {
                    partitions,
                    batches,
                    ..
                } => {
                    let bytes: usize = partitions.iter().map(|p| p.bytes).sum();
                    write!(
                        f,
                        "(computed once: {batches} batches, {:.1} MiB kept)",
                        bytes as f64 / (1 << 20) as f64
                    )
                }
                Outcome::TooLarge => write!(
                    f,
                    "(too large for the query's memory: each consumer ran its own copy)"
                ),
            },
            Some(Err(_)) => write!(f, "(failed)"),
        }
    }
}

impl ExecutionPlan for SharedExec {
    fn name(&self) -> &str {
        "SharedExec"
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.pop() {
            Some(input) if children.is_empty() => {
                Ok(Arc::new(Self::new(input, self.state.clone())))
            }
            _ => Err(DataFusionError::Internal(
                "SharedExec takes exactly one child".into(),
            )),
        }
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(partition)]
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        Ok(input_stats
            .first()
            .cloned()
            .unwrap_or_else(|| Arc::new(Statistics::new_unknown(&self.schema()))))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let state = self.state.clone();
        let own = self.input.clone();
        let schema = self.input.schema();
        if partition >= self.input.properties().partitioning.partition_count() {
            return Err(DataFusionError::Internal(format!(
                "SharedExec: no partition {partition}"
            )));
        }
        let stream = futures::stream::once(async move {
            let outcome = state
                .outcome
                .get_or_init(|| async {
                    state
                        .run(context.clone())
                        .await
                        .map(Arc::new)
                        .map_err(Arc::new)
                })
                .await
                .clone()
                .map_err(DataFusionError::Shared)?;
            let batches: SendableRecordBatchStream = match outcome.take(partition) {
                Some(batches) => {
                    let schema = own.schema();
                    Box::pin(RecordBatchStreamAdapter::new(
                        own.schema(),
                        futures::stream::iter(batches.into_iter().map(move |b| unpack(b, &schema))),
                    ))
                }
                None => own.execute(partition, context)?,
            };
            Ok::<_, DataFusionError>(batches)
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::Field;

    use super::*;

    fn batch(ids: Vec<Option<String>>) -> RecordBatch {
        let n = ids.len() as i64;
        let schema = Arc::new(Schema::new(vec![
            Field::new("trace_id", DataType::Utf8, true),
            Field::new("d", DataType::Int64, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(ids)),
                Arc::new(Int64Array::from_iter_values(0..n)),
            ],
        )
        .unwrap()
    }

    #[test]
    fn text_in_runs_is_kept_packed_and_read_back_the_same() {
        // runs of 5 or 6 rows, each value coming back after 96 others
        let ids: Vec<Option<String>> = (0..2_000)
            .map(|i: usize| Some(format!("{:032x}", (i * 7 / 37) % 97)))
            .collect();
        let b = batch(ids);
        let packed = pack(b.clone()).unwrap();
        assert!(matches!(
            packed.column(0).data_type(),
            DataType::Dictionary(..)
        ));
        let size = |b: &RecordBatch| -> usize {
            b.columns()
                .iter()
                .map(|c| c.to_data().get_slice_memory_size().unwrap())
                .sum()
        };
        assert!(
            size(&packed) * 2 < size(&b),
            "{} {}",
            size(&packed),
            size(&b)
        );
        assert_eq!(unpack(packed, &b.schema()).unwrap(), b);
        // a value per row, nulls, or a short batch: kept as they are
        let distinct = batch((0..2_000).map(|i| Some(format!("{i:032x}"))).collect());
        let with_null = batch(
            (0..2_000)
                .map(|i| (i != 7).then(|| format!("{:032x}", i / 50)))
                .collect(),
        );
        let short = batch((0..100).map(|i| Some(format!("{:032x}", i / 50))).collect());
        for b in [distinct, with_null, short] {
            let kept = pack(b.clone()).unwrap();
            assert_eq!(kept, b);
            assert_eq!(unpack(kept, &b.schema()).unwrap(), b);
        }
    }
}
