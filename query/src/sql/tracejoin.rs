//! Trace-local joins: a join between two reads of `spans` whose keys include both sides'
//! trace id (`a.trace_id = b.trace_id`, parent ↔ child with `AND a.parent_span_id =
//! b.span_id`, any further keys and a residual filter), run inside each trace's rows instead
//! of as a hash join over the table.
//!
//! A block holds each of its traces' spans together, so a trace that lies wholly in one
//! block can only meet rows of that block. [`TraceLocalJoinExec`] reads each block's
//! selected rows of both sides together, finds the runs of equal trace ids on each side, and
//! pairs the runs of the same trace (one hash lookup per trace, none per row); within a pair of
//! runs the other keys are compared directly or, for large runs, through a small hash table. A
//! block that only one side selects is not read at all. The rows of traces that do not lie in
//! one block (split over blocks, or with rows in the head) are set aside from every block,
//! joined with both sides' head rows by the last partition to finish, grouped by trace. The
//! scattered traces are the snapshot's split traces and the head's traces.
//!
//! A parent ↔ child join ([`ByRank`]) needs no key compared at all: a block keeps each row's
//! parent as its place in the trace's run, so each child row names its parent's row, and the
//! id columns (the costliest a block has: the span ids are 8 random bytes a row, the ids are
//! read as hex text) are not read unless the join's output or filter uses them.
//!
//! [`TraceLocalJoins`] puts it in place of an inner `HashJoinExec` when each side is a Weft
//! scan of `spans` of the same snapshot under projections and filters only (repartitions and
//! coalescing between them and the join are passed through), when the trace-id keys are the scan's
//! own `trace_id` column, and when both sides are known to select more than a few thousand
//! rows (selected by indexes and time ranges; a scan with other filters knows only an upper
//! bound): a smaller side is better served by the hash join, whose build side reaches the
//! other scan as a list of trace ids that it looks up in the trace-id index. `EXPLAIN` shows it as
//! `TraceLocalJoinExec`. A side whose scan also occurs elsewhere in the plan (a `WITH` table
//! joined in several branches of a `UNION ALL`) keeps the hash join: that scan is then read
//! once and shared by every use. If a later rule gives it children it cannot read block by block, it
//! becomes the hash join it replaced.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array,
};
use arrow::compute::{concat_batches, take, take_record_batch};
use arrow::datatypes::{DataType, SchemaRef};
use arrow::row::{RowConverter, Rows, SortField};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{JoinSide, JoinType, NullEquality, Statistics};
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::projection::{
    EmbeddedProjection, ProjectionExec, try_embed_projection,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::StreamExt;
use roaring::RoaringBitmap;
use rustc_hash::{FxHashMap, FxHashSet};
use weft_storage::model::TraceId;
use weft_storage::scan::{BlockAddr, NO_PARENT, Rows as BlockRows};
use weft_storage::store::Snapshot;

use super::pushdown::BlockWork;
use super::scan::{INLINE_READ_ROWS, WeftScanExec};

/// The traces of one snapshot whose rows do not all lie in one block: split over blocks, or
/// with rows in the head.
#[derive(Debug, Default)]
pub struct Scattered {
    splits: Arc<HashSet<TraceId>>,
    head: HashSet<TraceId>,
    /// The first 8 bytes of every id above: most ids asked about are in neither set, and a
    /// miss here costs one multiply instead of hashing 16 bytes twice.
    prefixes: FxHashSet<u64>,
    /// Identifies the snapshot (its block map), so that two scans are known to share one.
    snapshot: usize,
}

impl Scattered {
    pub fn new(snapshot: &Snapshot) -> Self {
        let head = snapshot
            .head
            .batches
            .iter()
            .flat_map(|b| b.iter().map(|r| r.trace_id))
            .collect::<HashSet<TraceId>>();
        let prefixes = snapshot
            .splits
            .iter()
            .chain(head.iter())
            .map(prefix)
            .collect();
        Self {
            splits: snapshot.splits.clone(),
            head,
            prefixes,
            snapshot: Arc::as_ptr(&snapshot.blocks) as usize,
        }
    }

    fn is_empty(&self) -> bool {
        self.splits.is_empty() && self.head.is_empty()
    }

    /// Whether a stored trace id names a scattered trace.
    fn contains_id(&self, id: &TraceId) -> bool {
        self.prefixes.contains(&prefix(id)) && (self.splits.contains(id) || self.head.contains(id))
    }

    /// Whether a trace id (as the `trace_id` column holds it: hex text) names a scattered
    /// trace; text that is no stored id's form is treated as scattered (it is then joined
    /// with the remainder, which is always right).
    fn contains_hex(&self, hex: &str) -> bool {
        if self.is_empty() {
            return false;
        }
        match TraceId::from_hex(hex) {
            Ok(t) => self.contains_id(&t),
            Err(_) => true,
        }
    }
}

fn prefix(id: &TraceId) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&id.0[..8]);
    u64::from_le_bytes(b)
}

/// The physical optimizer rule; see the module documentation.
#[derive(Debug)]
pub struct TraceLocalJoins {
    /// Each side must select more rows than this (see [`super::SqlConfig`]).
    pub min_side_rows: usize,
}

impl PhysicalOptimizerRule for TraceLocalJoins {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let partitions = config.execution.target_partitions.max(1);
        let mut scans: HashMap<String, usize> = HashMap::new();
        plan.apply(|node| {
            if let Some(scan) = node.downcast_ref::<WeftScanExec>() {
                *scans.entry(scan.share_key()).or_default() += 1;
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        plan.transform_up(|node| {
            let Some(join) = node.downcast_ref::<HashJoinExec>() else {
                return Ok(Transformed::no(node));
            };
            // a copy of its own (a hash join cannot be cloned)
            let Ok(join) = join.builder().build() else {
                return Ok(Transformed::no(node));
            };
            let join = Arc::new(join);
            let decline = Decline {
                min_side_rows: self.min_side_rows,
                scans: &scans,
            };
            match TraceLocalJoinExec::try_new(join, partitions, Some(decline))? {
                Some(local) => Ok(Transformed::yes(Arc::new(local) as Arc<dyn ExecutionPlan>)),
                None => Ok(Transformed::no(node)),
            }
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "trace_local_joins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// What makes the rule keep a hash join (see [`TraceLocalJoinExec::try_new`]).
struct Decline<'a> {
    min_side_rows: usize,
    /// How often each scan (by its share key) occurs in the plan.
    scans: &'a HashMap<String, usize>,
}

/// An operator between a side's scan and the join, applied to each batch the scan reads.
#[derive(Debug, Clone)]
enum Step {
    Project(Arc<ProjectionExec>),
    Filter(Arc<FilterExec>),
}

impl Step {
    fn apply(&self, batch: RecordBatch) -> Result<RecordBatch> {
        Ok(self.apply_keeping(batch)?.0)
    }

    /// The step applied, with which rows a filter kept.
    fn apply_keeping(&self, batch: RecordBatch) -> Result<(RecordBatch, Option<BooleanArray>)> {
        match self {
            Step::Project(p) => {
                let n = batch.num_rows();
                let columns = p
                    .expr()
                    .iter()
                    .map(|e| e.expr.evaluate(&batch)?.into_array(n))
                    .collect::<Result<Vec<_>>>()?;
                let batch = RecordBatch::try_new_with_options(
                    p.schema(),
                    columns,
                    &RecordBatchOptions::new().with_row_count(Some(n)),
                )?;
                Ok((batch, None))
            }
            Step::Filter(f) => {
                let keep = f
                    .predicate()
                    .evaluate(&batch)?
                    .into_array(batch.num_rows())?;
                let keep = keep.as_boolean_opt().ok_or_else(|| {
                    DataFusionError::Internal("filter is not a boolean expression".into())
                })?;
                let kept = arrow::compute::filter_record_batch(&batch, keep)?;
                let kept = match f.projection() {
                    Some(p) => kept.project(p)?,
                    None => kept,
                };
                Ok((kept, Some(keep.clone())))
            }
        }
    }
}

/// Operators between a side's scan and the join that change neither rows nor columns.
const PASSED_THROUGH: &[&str] = &[
    "RepartitionExec",
    "CoalesceBatchesExec",
    "CoalescePartitionsExec",
    "CooperativeExec",
];

/// One side of the join: a scan and the steps above it.
#[derive(Debug, Clone)]
struct Side {
    scan: Arc<WeftScanExec>,
    /// Bottom up.
    steps: Vec<Step>,
    /// The join's input as planned (its child, shown under it; what a hash join would run).
    plan: Arc<dyn ExecutionPlan>,
}

impl Side {
    /// A side made of a Weft scan of `spans` under projections and filters (repartitions and
    /// coalescing are passed through: the join reads the scan block by block).
    fn of(plan: &Arc<dyn ExecutionPlan>) -> Option<Self> {
        let mut above = Vec::new();
        let mut node = plan.clone();
        loop {
            if let Some(scan) = node.downcast_ref::<WeftScanExec>() {
                if scan.table() != "spans" || scan.limit().is_some() {
                    return None;
                }
                above.reverse();
                return Some(Self {
                    scan: Arc::new(scan.clone()),
                    steps: above,
                    plan: plan.clone(),
                });
            }
            if node.fetch().is_some() {
                return None;
            }
            let next = if let Some(p) = node.downcast_ref::<ProjectionExec>() {
                above.push(Step::Project(Arc::new(p.clone())));
                p.input().clone()
            } else if let Some(f) = node.downcast_ref::<FilterExec>() {
                above.push(Step::Filter(Arc::new(f.clone())));
                f.input().clone()
            } else if PASSED_THROUGH.contains(&node.name()) && node.children().len() == 1 {
                node.children()[0].clone()
            } else {
                return None;
            };
            node = next;
        }
    }

    /// Whether the scan's row count is near the side's (see [`WeftScanExec::rows_known`]).
    fn rows_known(&self) -> bool {
        self.scan.rows_known() && !self.steps.iter().any(|s| matches!(s, Step::Filter(_)))
    }

    /// The scan's output position of `key`, an expression over the side's output, when it is
    /// a column of the scan carried up unchanged through the steps.
    fn scan_column(&self, key: &Arc<dyn PhysicalExpr>) -> Option<usize> {
        let mut index = key.downcast_ref::<Column>().map(|c| c.index())?;
        for step in self.steps.iter().rev() {
            match step {
                Step::Project(p) => {
                    index = p
                        .expr()
                        .get(index)
                        .and_then(|e| e.expr.downcast_ref::<Column>())?
                        .index();
                }
                Step::Filter(f) => {
                    if let Some(p) = f.projection() {
                        index = *p.get(index)?;
                    }
                }
            }
        }
        (index < self.scan.schema().fields().len()).then_some(index)
    }

    /// Whether `key` is the scan's text column `name` (see [`Self::scan_column`]).
    fn is_column(&self, key: &Arc<dyn PhysicalExpr>, name: &str) -> bool {
        let schema = self.scan.schema();
        self.scan_column(key).is_some_and(|i| {
            schema.field(i).name() == name
                && matches!(
                    schema.field(i).data_type(),
                    DataType::Utf8 | DataType::Utf8View
                )
        })
    }

    /// Whether `key` is the scan's `trace_id` column carried up unchanged.
    fn is_trace_id(&self, key: &Arc<dyn PhysicalExpr>) -> bool {
        self.is_column(key, "trace_id")
    }

    /// Which of `candidates` (the scan's output positions) nothing reads but the join's keys:
    /// not the steps, nor the join's filter or output (`used`: positions of the side's
    /// output; `None` when the join outputs every column).
    fn unread(&self, used: Option<HashSet<usize>>, candidates: &[usize]) -> Vec<usize> {
        // the scan's output positions read above it; `None` when a position is not one the
        // steps know (then nothing is left unread)
        let read = || -> Option<HashSet<usize>> {
            let mut used = used?;
            for step in self.steps.iter().rev() {
                used = match step {
                    Step::Project(p) => used
                        .iter()
                        .map(|&i| p.expr().get(i).map(|e| collect_columns(&e.expr)))
                        .collect::<Option<Vec<_>>>()?
                        .into_iter()
                        .flatten()
                        .map(|c| c.index())
                        .collect(),
                    Step::Filter(f) => {
                        let mut below = match f.projection() {
                            Some(p) => used
                                .iter()
                                .map(|&i| p.get(i).copied())
                                .collect::<Option<HashSet<_>>>()?,
                            None => used,
                        };
                        below.extend(collect_columns(f.predicate()).iter().map(|c| c.index()));
                        below
                    }
                };
            }
            Some(used)
        };
        match read() {
            Some(used) => candidates
                .iter()
                .copied()
                .filter(|c| !used.contains(c))
                .collect(),
            None => Vec::new(),
        }
    }

    /// A batch of the scan's rows carried through the steps.
    fn finish(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let mut batch = batch;
        for step in &self.steps {
            batch = step.apply(batch)?;
        }
        Ok(batch)
    }

    fn read_block(&self, work: &BlockWork) -> Result<RecordBatch> {
        self.finish(self.scan.read_block_batch(work)?)
    }

    /// A block's rows through the steps with each one's row number in the block, the scan's
    /// columns at `skip` left unread (see [`WeftScanExec::read_block_numbered`]).
    fn read_numbered(
        &self,
        work: &BlockWork,
        skip: &[usize],
    ) -> Result<(RecordBatch, UInt32Array)> {
        let (mut batch, mut rows) = self.scan.read_block_numbered(work, skip)?;
        for step in &self.steps {
            let (next, keep) = step.apply_keeping(batch)?;
            if let Some(keep) = keep {
                rows = arrow::compute::filter(&rows, &keep)?.as_primitive().clone();
            }
            batch = next;
        }
        Ok((batch, rows))
    }

    fn read_head(&self) -> Result<Vec<RecordBatch>> {
        self.scan
            .read_head_batches()?
            .into_iter()
            .map(|b| self.finish(b))
            .collect()
    }
}

/// A parent ↔ child join (`child.parent_span_id = parent.span_id` besides the trace ids, no
/// other key): a block that keeps its rows' parents as ranks pairs each child row with its
/// parent's row directly (see [`Joiner::block_by_rank`]), reading neither side's ids.
#[derive(Debug, Clone)]
struct ByRank {
    child: JoinSide,
    /// Each side's scan output positions left unread: the id columns only the keys read.
    left_skip: Vec<usize>,
    right_skip: Vec<usize>,
}

impl ByRank {
    fn of(join: &HashJoinExec, left: &Side, right: &Side, trace_key: usize) -> Option<Self> {
        if join.on.len() != 2 {
            return None;
        }
        let (l, r) = &join.on[1 - trace_key];
        let child = if left.is_column(l, "parent_span_id") && right.is_column(r, "span_id") {
            JoinSide::Left
        } else if left.is_column(l, "span_id") && right.is_column(r, "parent_span_id") {
            JoinSide::Right
        } else {
            return None;
        };
        let n_left = join.left.schema().fields().len();
        // the side's output positions the join's output and filter read
        let used = |side: JoinSide| -> Option<HashSet<usize>> {
            let projection = join.projection.as_ref()?;
            let mut used: HashSet<usize> = projection
                .iter()
                .filter_map(|&c| match side {
                    JoinSide::Left => (c < n_left).then_some(c),
                    _ => c.checked_sub(n_left),
                })
                .collect();
            if let Some(f) = &join.filter {
                used.extend(
                    f.column_indices()
                        .iter()
                        .filter(|c| c.side == side)
                        .map(|c| c.index),
                );
            }
            Some(used)
        };
        let (lt, rt) = &join.on[trace_key];
        let left_keys: Vec<usize> = [lt, l].iter().filter_map(|k| left.scan_column(k)).collect();
        let right_keys: Vec<usize> = [rt, r]
            .iter()
            .filter_map(|k| right.scan_column(k))
            .collect();
        Some(Self {
            child,
            left_skip: left.unread(used(JoinSide::Left), &left_keys),
            right_skip: right.unread(used(JoinSide::Right), &right_keys),
        })
    }
}

/// A block's place in each side's list of blocks.
#[derive(Debug, Clone, Copy)]
struct Pair {
    left: Option<usize>,
    right: Option<usize>,
}

/// What the partitions of one execution share: the scattered traces' rows, and how many
/// partitions have finished reading their blocks.
#[derive(Debug, Default)]
struct RunState {
    left: Mutex<Vec<RecordBatch>>,
    right: Mutex<Vec<RecordBatch>>,
    /// The set-aside rows' memory, registered by the first partition to run.
    reservation: Mutex<Option<MemoryReservation>>,
    finished: AtomicUsize,
}

impl RunState {
    /// Counts `batch` against the query's memory and keeps it for the remainder.
    fn keep(&self, batch: RecordBatch, to: &Mutex<Vec<RecordBatch>>) -> Result<()> {
        if let Some(r) = lock(&self.reservation).as_ref() {
            r.try_grow(batch.get_array_memory_size())?;
        }
        lock(to).push(batch);
        Ok(())
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct TraceLocalJoinExec {
    /// The join this stands for (its expressions, schema; run as it is when the children
    /// given later are not scans).
    join: Arc<HashJoinExec>,
    left: Side,
    right: Side,
    /// Index of the trace-id pair in the join's keys.
    trace_key: usize,
    by_rank: Option<ByRank>,
    scattered: Arc<Scattered>,
    partitions: Vec<Vec<Pair>>,
    properties: Arc<PlanProperties>,
    state: Arc<RunState>,
    metrics: ExecutionPlanMetricsSet,
}

impl TraceLocalJoinExec {
    /// The trace-local form of `join`, when it has one (see the module documentation);
    /// With `decline` (the rule), a side that is small or may be, or whose scan occurs
    /// elsewhere in the plan, keeps the hash join, and there are at most as many partitions as
    /// blocks; without (the same join given new children), exactly `partitions` partitions.
    fn try_new(
        join: Arc<HashJoinExec>,
        partitions: usize,
        decline: Option<Decline<'_>>,
    ) -> Result<Option<Self>> {
        if join.join_type != JoinType::Inner || join.fetch().is_some() {
            return Ok(None);
        }
        let (Some(left), Some(right)) = (Side::of(&join.left), Side::of(&join.right)) else {
            return Ok(None);
        };
        let Some(trace_key) = join
            .on
            .iter()
            .position(|(l, r)| left.is_trace_id(l) && right.is_trace_id(r))
        else {
            return Ok(None);
        };
        // the other keys are compared as arrow rows: both sides must have the same types
        for (l, r) in &join.on {
            if l.data_type(&left.plan.schema())? != r.data_type(&right.plan.schema())? {
                return Ok(None);
            }
        }
        if let Some(d) = &decline {
            // a side of few rows (or of rows a filter may make few: the scans know only upper
            // bounds then) is the hash join's build side, and the other scan reads only its
            // traces
            if [&left, &right]
                .iter()
                .any(|s| s.scan.rows_selected() <= d.min_side_rows || !s.rows_known())
            {
                return Ok(None);
            }
            // scans that occur more than once (a CTE used by several joins) are read once and
            // shared (see `shared`): a trace-local join would read its own copy instead
            let (l, r) = (left.scan.share_key(), right.scan.share_key());
            let own = if l == r { 2 } else { 1 };
            if [&l, &r]
                .iter()
                .any(|k| d.scans.get(*k).is_some_and(|&n| n > own))
            {
                return Ok(None);
            }
        }
        let (Some(scattered), Some(other)) = (left.scan.scattered(), right.scan.scattered()) else {
            return Ok(None);
        };
        if scattered.snapshot != other.snapshot {
            return Ok(None);
        }
        // blocks in the order the scans read them (newest first), each side's index
        let mut at: HashMap<BlockAddr, usize> = HashMap::new();
        let mut pairs: Vec<Pair> = Vec::new();
        for (i, b) in left.scan.blocks().iter().enumerate() {
            at.insert(b.addr, pairs.len());
            pairs.push(Pair {
                left: Some(i),
                right: None,
            });
        }
        for (i, b) in right.scan.blocks().iter().enumerate() {
            match at.get(&b.addr) {
                Some(&p) => pairs[p].right = Some(i),
                None => pairs.push(Pair {
                    left: None,
                    right: Some(i),
                }),
            }
        }
        // a block only one side reads can only hold that side's rows of scattered traces
        if scattered.is_empty() {
            pairs.retain(|p| p.left.is_some() && p.right.is_some());
        }
        let n = match decline {
            None => partitions.max(1),
            Some(_) => partitions.clamp(1, pairs.len().max(1)),
        };
        let mut spread = vec![Vec::new(); n];
        for (i, p) in pairs.into_iter().enumerate() {
            spread[i % n].push(p);
        }
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(join.schema()),
            Partitioning::UnknownPartitioning(n),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        let by_rank = ByRank::of(&join, &left, &right, trace_key);
        Ok(Some(Self {
            join,
            left,
            right,
            trace_key,
            by_rank,
            scattered,
            partitions: spread,
            properties,
            state: Arc::default(),
            metrics: ExecutionPlanMetricsSet::new(),
        }))
    }

    fn keys(&self, side: JoinSide) -> Vec<Arc<dyn PhysicalExpr>> {
        self.join
            .on
            .iter()
            .map(|(l, r)| match side {
                JoinSide::Left => l.clone(),
                _ => r.clone(),
            })
            .collect()
    }
}

impl EmbeddedProjection for TraceLocalJoinExec {
    fn with_projection(&self, projection: Option<Vec<usize>>) -> Result<Self> {
        let join = Arc::new(self.join.with_projection(projection)?);
        Self::try_new(join, self.partitions.len(), None)?.ok_or_else(|| {
            DataFusionError::Internal("a trace-local join with a projection is not one".into())
        })
    }
}

impl DisplayAs for TraceLocalJoinExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on: Vec<String> = self
            .join
            .on
            .iter()
            .map(|(l, r)| format!("({l}, {r})"))
            .collect();
        write!(f, "TraceLocalJoinExec: on=[{}]", on.join(", "))?;
        if let Some(filter) = &self.join.filter {
            write!(f, ", filter={}", filter.expression())?;
        }
        if let Some(p) = &self.join.projection {
            write!(f, ", projection={:?}", p.as_ref())?;
        }
        let both = self.partitions.iter().flatten();
        let (mut paired, mut alone) = (0, 0);
        for p in both {
            match (p.left, p.right) {
                (Some(_), Some(_)) => paired += 1,
                _ => alone += 1,
            }
        }
        write!(
            f,
            ", blocks={paired} read by both sides, {alone} by one, scattered traces={}",
            self.scattered.splits.len() + self.scattered.head.len()
        )?;
        if let Some(r) = &self.by_rank {
            let unread = r.left_skip.len() + r.right_skip.len();
            write!(
                f,
                ", children paired by parent rank ({unread} id columns unread)"
            )?;
        }
        Ok(())
    }
}

impl ExecutionPlan for TraceLocalJoinExec {
    fn name(&self) -> &str {
        "TraceLocalJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.left.plan, &self.right.plan]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        // the scans are read block by block, whatever partitions are put above them
        vec![false, false]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        self.join.apply_expressions(f)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [left, right]: [Arc<dyn ExecutionPlan>; 2] = children.try_into().map_err(|_| {
            DataFusionError::Internal("TraceLocalJoinExec takes two children".into())
        })?;
        let join = Arc::new(
            self.join
                .builder()
                .with_new_children(vec![left, right])?
                .build()?,
        );
        let partitions = self.partitions.len();
        match Self::try_new(join.clone(), partitions, None)? {
            Some(local) => Ok(Arc::new(local)),
            // children it cannot read block by block (shared ones, say): the hash join
            None => Ok(join),
        }
    }

    fn partition_statistics(&self, _partition: Option<usize>) -> Result<Arc<Statistics>> {
        Ok(Arc::new(Statistics::new_unknown(&self.schema())))
    }

    /// A projection above takes the columns it reads from the join's output (as a hash join
    /// does): the columns nobody reads are then known, and ids only the keys read go unread
    /// (see [`ByRank`]).
    fn try_swapping_with_projection(
        &self,
        projection: &ProjectionExec,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if self.join.projection.is_some() {
            return Ok(None);
        }
        try_embed_projection(projection, self)
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let pairs = self.partitions.get(partition).cloned().ok_or_else(|| {
            DataFusionError::Internal(format!("TraceLocalJoinExec: no partition {partition}"))
        })?;
        let batch_size = context.session_config().batch_size().max(1);
        let join = Arc::new(Joiner::new(self)?);
        lock(&self.state.reservation).get_or_insert_with(|| {
            MemoryConsumer::new("TraceLocalJoinExec").register(context.memory_pool())
        });
        let metrics = Metrics {
            joined: MetricBuilder::new(&self.metrics).global_counter("blocks_joined"),
            alone: MetricBuilder::new(&self.metrics).global_counter("blocks_read_by_one_side"),
            scattered: MetricBuilder::new(&self.metrics).global_counter("scattered_rows"),
            output: MetricBuilder::new(&self.metrics).output_rows(partition),
            compute: MetricBuilder::new(&self.metrics).elapsed_compute(partition),
        };
        let state = self.state.clone();
        let total = self.partitions.len();
        let schema = self.schema();
        let head = partition == 0;
        let blocks = {
            let (join, metrics, state) = (join.clone(), metrics.clone(), state.clone());
            futures::stream::iter(pairs).then(move |pair| {
                let (join, metrics, state) = (join.clone(), metrics.clone(), state.clone());
                async move {
                    // a few rows (an index-served read) cost less than the hand-off to a
                    // blocking thread
                    let inline = join.selected(pair) <= INLINE_READ_ROWS;
                    let work = move || join.block(pair, &state, &metrics);
                    if inline {
                        return work();
                    }
                    tokio::task::spawn_blocking(work)
                        .await
                        .map_err(|e| DataFusionError::External(Box::new(e)))?
                }
            })
        };
        let rest = futures::stream::once(async move {
            if head {
                for b in join.left.read_head()? {
                    metrics.scattered.add(b.num_rows());
                    state.keep(b, &state.left)?;
                }
                for b in join.right.read_head()? {
                    metrics.scattered.add(b.num_rows());
                    state.keep(b, &state.right)?;
                }
            }
            // the last partition to finish its blocks joins the rows set aside by all
            if state.finished.fetch_add(1, Ordering::AcqRel) + 1 < total {
                return Ok(Vec::new());
            }
            let l = std::mem::take(&mut *lock(&state.left));
            let r = std::mem::take(&mut *lock(&state.right));
            let out = tokio::task::spawn_blocking(move || join.remainder(l, r, &metrics))
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
            if let Some(r) = lock(&state.reservation).as_mut() {
                r.free();
            }
            out
        });
        let stream = blocks.chain(rest).flat_map(
            move |out: Result<Vec<RecordBatch>>| -> futures::stream::Iter<
                std::vec::IntoIter<Result<RecordBatch>>,
            > {
                let pieces: Vec<Result<RecordBatch>> = match out {
                    Err(e) => vec![Err(e)],
                    Ok(batches) => batches
                        .into_iter()
                        .flat_map(|b| {
                            let n = b.num_rows();
                            (0..n.div_ceil(batch_size))
                                .map(move |i| {
                                    Ok(b.slice(i * batch_size, batch_size.min(n - i * batch_size)))
                                })
                                .collect::<Vec<_>>()
                        })
                        .collect(),
                };
                futures::stream::iter(pieces)
            },
        );
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Clone)]
struct Metrics {
    joined: datafusion::physical_plan::metrics::Count,
    alone: datafusion::physical_plan::metrics::Count,
    scattered: datafusion::physical_plan::metrics::Count,
    output: datafusion::physical_plan::metrics::Count,
    compute: datafusion::physical_plan::metrics::Time,
}

/// No further run (see [`Runs`]).
const NONE: u32 = u32::MAX;

/// One side's runs of a block (see [`Joiner::runs`]).
#[derive(Default)]
struct Runs<'a> {
    runs: Vec<Range<u32>>,
    first: FxHashMap<&'a str, u32>,
    next: Vec<u32>,
}

/// The join's work on batches, shared by a partition's tasks.
struct Joiner {
    left: Side,
    right: Side,
    left_keys: Vec<Arc<dyn PhysicalExpr>>,
    right_keys: Vec<Arc<dyn PhysicalExpr>>,
    trace_key: usize,
    by_rank: Option<ByRank>,
    scattered: Arc<Scattered>,
    join: Arc<HashJoinExec>,
    schema: SchemaRef,
}

/// A side's batch with what the join needs of it: the trace ids, the other keys as
/// comparable rows, and which rows have no null key.
struct Keyed {
    batch: RecordBatch,
    traces: ArrayRef,
    others: Option<Rows>,
    valid: Vec<bool>,
}

impl Keyed {
    fn trace(&self, i: usize) -> &str {
        match self.traces.data_type() {
            DataType::Utf8View => self.traces.as_string_view().value(i),
            _ => self.traces.as_string::<i32>().value(i),
        }
    }
}

impl Joiner {
    fn new(exec: &TraceLocalJoinExec) -> Result<Self> {
        Ok(Self {
            left: exec.left.clone(),
            right: exec.right.clone(),
            left_keys: exec.keys(JoinSide::Left),
            right_keys: exec.keys(JoinSide::Right),
            trace_key: exec.trace_key,
            by_rank: exec.by_rank.clone(),
            scattered: exec.scattered.clone(),
            join: exec.join.clone(),
            schema: exec.schema(),
        })
    }

    /// Rows the larger side selects in a block (each side's read is what a scan reads inline
    /// or on a blocking thread).
    fn selected(&self, pair: Pair) -> usize {
        let rows = |side: &Side, i: Option<usize>| {
            i.map_or(0, |i| {
                let w = &side.scan.blocks()[i];
                w.rows.len(w.meta.rows)
            })
        };
        rows(&self.left, pair.left).max(rows(&self.right, pair.right))
    }

    fn keyed(&self, batch: RecordBatch, keys: &[Arc<dyn PhysicalExpr>]) -> Result<Keyed> {
        let n = batch.num_rows();
        let arrays = keys
            .iter()
            .map(|k| k.evaluate(&batch)?.into_array(n))
            .collect::<Result<Vec<_>>>()?;
        let traces = arrays[self.trace_key].clone();
        let others: Vec<ArrayRef> = arrays
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != self.trace_key)
            .map(|(_, a)| a.clone())
            .collect();
        let nulls_match = self.join.null_equality == NullEquality::NullEqualsNull;
        let mut valid = vec![true; n];
        for (i, a) in arrays.iter().enumerate() {
            // a null trace id never matches; other keys as the join says
            if i != self.trace_key && nulls_match {
                continue;
            }
            if let Some(nulls) = a.logical_nulls() {
                for (v, ok) in valid.iter_mut().zip(nulls.iter()) {
                    *v &= ok;
                }
            }
        }
        let others = if others.is_empty() {
            None
        } else {
            let converter = RowConverter::new(
                others
                    .iter()
                    .map(|a| SortField::new(a.data_type().clone()))
                    .collect(),
            )?;
            Some(converter.convert_columns(&others)?)
        };
        Ok(Keyed {
            batch,
            traces,
            others,
            valid,
        })
    }

    /// Calls `f` with each run of equal trace ids of a block's side whose trace lies in the
    /// block; the rows of scattered traces go to `aside`.
    fn local_runs<'a>(
        &self,
        k: &'a Keyed,
        aside: &mut Vec<u32>,
        mut f: impl FnMut(&'a str, Range<usize>),
    ) {
        let n = k.batch.num_rows();
        let mut start = 0;
        while start < n {
            let t = k.trace(start);
            let mut end = start + 1;
            while end < n && k.trace(end) == t {
                end += 1;
            }
            if self.scattered.contains_hex(t) {
                aside.extend(start as u32..end as u32);
            } else {
                f(t, start..end);
            }
            start = end;
        }
    }

    /// A side's local runs, and each trace's first run; `next` links a trace's further runs
    /// (a block keeps a trace's rows together, so there are none unless a block breaks that
    /// habit).
    fn runs<'a>(&self, k: &'a Keyed, aside: &mut Vec<u32>) -> Runs<'a> {
        let mut out = Runs::default();
        self.local_runs(k, aside, |t, rows| {
            let at = out.runs.len() as u32;
            out.runs.push(rows.start as u32..rows.end as u32);
            out.next.push(NONE);
            if let Some(first) = out.first.insert(t, at) {
                // the new run goes first, the earlier ones after it
                out.next[at as usize] = first;
            }
        });
        out
    }

    /// Pairs of rows of one trace whose other keys are equal.
    fn pair(l: &Keyed, r: &Keyed, ls: &[u32], rs: &[u32], out: &mut (Vec<u32>, Vec<u32>)) {
        let Some((lo, ro)) = l.others.as_ref().zip(r.others.as_ref()) else {
            for &i in ls.iter().filter(|&&i| l.valid[i as usize]) {
                for &j in rs.iter().filter(|&&j| r.valid[j as usize]) {
                    out.0.push(i);
                    out.1.push(j);
                }
            }
            return;
        };
        if ls.len() * rs.len() <= 256 {
            for &i in ls.iter().filter(|&&i| l.valid[i as usize]) {
                let a = lo.row(i as usize);
                for &j in rs.iter().filter(|&&j| r.valid[j as usize]) {
                    if a == ro.row(j as usize) {
                        out.0.push(i);
                        out.1.push(j);
                    }
                }
            }
            return;
        }
        let mut by_key: FxHashMap<&[u8], Vec<u32>> = FxHashMap::default();
        for &i in ls.iter().filter(|&&i| l.valid[i as usize]) {
            by_key.entry(lo.row(i as usize).data()).or_default().push(i);
        }
        for &j in rs.iter().filter(|&&j| r.valid[j as usize]) {
            if let Some(is) = by_key.get(ro.row(j as usize).data()) {
                for &i in is {
                    out.0.push(i);
                    out.1.push(j);
                }
            }
        }
    }

    /// The output rows of pairs (left row, right row): the join's filter applied, then its
    /// projection.
    fn output(
        &self,
        l: &RecordBatch,
        r: &RecordBatch,
        pairs: (Vec<u32>, Vec<u32>),
    ) -> Result<RecordBatch> {
        let (mut li, mut ri) = (UInt32Array::from(pairs.0), UInt32Array::from(pairs.1));
        if let Some(filter) = &self.join.filter
            && !li.is_empty()
        {
            let columns = filter
                .column_indices()
                .iter()
                .map(|c| match c.side {
                    JoinSide::Left => take(l.column(c.index), &li, None),
                    _ => take(r.column(c.index), &ri, None),
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let n = li.len();
            let batch = RecordBatch::try_new_with_options(
                filter.schema().clone(),
                columns,
                &RecordBatchOptions::new().with_row_count(Some(n)),
            )?;
            let keep = filter.expression().evaluate(&batch)?.into_array(n)?;
            let keep: BooleanArray = match keep.as_boolean_opt() {
                // NULL is not true
                Some(k) if k.null_count() > 0 => arrow::compute::prep_null_mask_filter(k),
                Some(k) => k.clone(),
                None => {
                    return Err(DataFusionError::Internal(
                        "join filter is not a boolean expression".into(),
                    ));
                }
            };
            li = arrow::compute::filter(&li, &keep)?.as_primitive().clone();
            ri = arrow::compute::filter(&ri, &keep)?.as_primitive().clone();
        }
        let n_left = l.num_columns();
        let all: Vec<usize> = (0..n_left + r.num_columns()).collect();
        let wanted: &[usize] = match &self.join.projection {
            Some(p) => p,
            None => &all,
        };
        let columns = wanted
            .iter()
            .map(|&c| {
                if c < n_left {
                    take(l.column(c), &li, None)
                } else {
                    take(r.column(c - n_left), &ri, None)
                }
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(li.len())),
        )?)
    }

    /// One block: both sides' rows of its own traces joined, the scattered traces' rows set
    /// aside.
    fn block(&self, pair: Pair, state: &RunState, metrics: &Metrics) -> Result<Vec<RecordBatch>> {
        let _timer = metrics.compute.timer();
        if let (Some(rank), Some(li), Some(ri)) = (&self.by_rank, pair.left, pair.right) {
            let (lw, rw) = (&self.left.scan.blocks()[li], &self.right.scan.blocks()[ri]);
            let child = match rank.child {
                JoinSide::Left => (&self.left, lw),
                _ => (&self.right, rw),
            };
            let any = |w: &BlockWork| w.rows.len(w.meta.rows) > 0;
            if any(lw)
                && any(rw)
                && child.0.scan.knows_parent_rows(child.1)
                && let Some(out) = self.block_by_rank(rank, lw, rw, state, metrics)?
            {
                return Ok(out);
            }
        }
        let read = |side: &Side, i: Option<usize>| -> Result<Option<RecordBatch>> {
            let Some(i) = i else { return Ok(None) };
            let work = &side.scan.blocks()[i];
            if work.rows.len(work.meta.rows) == 0 {
                return Ok(None);
            }
            side.read_block(work).map(Some)
        };
        let (l, r) = (read(&self.left, pair.left)?, read(&self.right, pair.right)?);
        let (l, r) = match (l, r) {
            (Some(l), Some(r)) => {
                metrics.joined.add(1);
                (
                    self.keyed(l, &self.left_keys)?,
                    self.keyed(r, &self.right_keys)?,
                )
            }
            (l, r) => {
                // one side only: its rows of scattered traces may meet the other's elsewhere
                metrics.alone.add(1);
                let sides = [
                    (l, &self.left_keys, &state.left),
                    (r, &self.right_keys, &state.right),
                ];
                for (batch, keys, to) in sides {
                    if let Some(batch) = batch {
                        let k = self.keyed(batch, keys)?;
                        let mut aside = Vec::new();
                        self.local_runs(&k, &mut aside, |_, _| {});
                        self.set_aside(&k, aside, state, to, metrics)?;
                    }
                }
                return Ok(Vec::new());
            }
        };
        let (mut l_aside, mut r_aside) = (Vec::new(), Vec::new());
        let l_runs = self.runs(&l, &mut l_aside);
        let mut pairs = (Vec::new(), Vec::new());
        let rows: Vec<u32> = (0..l.batch.num_rows().max(r.batch.num_rows()) as u32).collect();
        self.local_runs(&r, &mut r_aside, |t, rs| {
            let mut run = l_runs.first.get(t).copied().unwrap_or(NONE);
            while run != NONE {
                let ls = &l_runs.runs[run as usize];
                let ls = &rows[ls.start as usize..ls.end as usize];
                Self::pair(&l, &r, ls, &rows[rs.clone()], &mut pairs);
                run = l_runs.next[run as usize];
            }
        });
        self.set_aside(&l, l_aside, state, &state.left, metrics)?;
        self.set_aside(&r, r_aside, state, &state.right, metrics)?;
        let out = self.output(&l.batch, &r.batch, pairs)?;
        metrics.output.add(out.num_rows());
        Ok(vec![out])
    }

    /// One block of a parent ↔ child join, paired by the block's parent ranks: each child
    /// row names its parent's row, looked up among the parent side's rows (both in row
    /// order); the rows of scattered traces are read again with their ids and set aside.
    /// `None` when the block cannot name its rows' parents after all.
    fn block_by_rank(
        &self,
        rank: &ByRank,
        lw: &BlockWork,
        rw: &BlockWork,
        state: &RunState,
        metrics: &Metrics,
    ) -> Result<Option<Vec<RecordBatch>>> {
        let (l, l_rows) = self.left.read_numbered(lw, &rank.left_skip)?;
        let (r, r_rows) = self.right.read_numbered(rw, &rank.right_skip)?;
        let (child, c_rows, c_work, p_rows) = match rank.child {
            JoinSide::Left => (&self.left, &l_rows, lw, &r_rows),
            _ => (&self.right, &r_rows, rw, &l_rows),
        };
        // the work's own set when no filter dropped a row (as when postings chose them)
        let set = match &c_work.rows {
            BlockRows::Set(set) if set.len() == c_rows.len() as u64 => set.clone(),
            _ => RoaringBitmap::from_sorted_iter(c_rows.values().iter().copied())
                .map_err(|e| DataFusionError::Internal(format!("block rows out of order: {e}")))?,
        };
        let Some(lineage) = child.scan.parent_rows(c_work, &set)? else {
            return Ok(None);
        };
        if lineage.parents.len() != c_rows.len() {
            return Err(DataFusionError::Internal(
                "parent rows of a block: not the rows asked for".into(),
            ));
        }
        metrics.joined.add(1);
        let runs = &lineage.runs;
        let scattered = |run: usize| {
            !self.scattered.is_empty()
                && runs
                    .ids
                    .get(run)
                    .is_some_and(|t| self.scattered.contains_id(t))
        };
        let parents = p_rows.values();
        let (mut c_pairs, mut p_pairs) = (Vec::new(), Vec::new());
        let (mut c_aside, mut p_aside) = (RoaringBitmap::new(), RoaringBitmap::new());
        let mut last = (u32::MAX, false);
        for (i, (&run, &parent)) in lineage.of_run.iter().zip(&lineage.parents).enumerate() {
            if run != last.0 {
                last = (run, scattered(run as usize));
            }
            if last.1 {
                c_aside.insert(c_rows.value(i));
            } else if parent != NO_PARENT
                && let Ok(j) = parents.binary_search(&parent)
            {
                c_pairs.push(i as u32);
                p_pairs.push(j as u32);
            }
        }
        if !self.scattered.is_empty() {
            let mut run = 0usize;
            for &row in parents.iter() {
                while runs.starts.get(run + 1).is_some_and(|&s| s <= row) {
                    run += 1;
                }
                if scattered(run) {
                    p_aside.insert(row);
                }
            }
        }
        let (l_aside, r_aside, pairs) = match rank.child {
            JoinSide::Left => (c_aside, p_aside, (c_pairs, p_pairs)),
            _ => (p_aside, c_aside, (p_pairs, c_pairs)),
        };
        for (side, work, aside, keys, to) in [
            (&self.left, lw, l_aside, &self.left_keys, &state.left),
            (&self.right, rw, r_aside, &self.right_keys, &state.right),
        ] {
            if aside.is_empty() {
                continue;
            }
            let work = BlockWork {
                rows: BlockRows::Set(aside),
                ..work.clone()
            };
            let k = self.keyed(side.read_block(&work)?, keys)?;
            let all = (0..k.batch.num_rows() as u32).collect();
            self.set_aside(&k, all, state, to, metrics)?;
        }
        let out = self.output(&l, &r, pairs)?;
        metrics.output.add(out.num_rows());
        Ok(Some(vec![out]))
    }

    fn set_aside(
        &self,
        k: &Keyed,
        rows: Vec<u32>,
        state: &RunState,
        to: &Mutex<Vec<RecordBatch>>,
        metrics: &Metrics,
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        metrics.scattered.add(rows.len());
        let batch = take_record_batch(&k.batch, &UInt32Array::from(rows))?;
        state.keep(batch, to)
    }

    /// The scattered traces' rows of both sides (from every block and the head), joined
    /// trace by trace.
    fn remainder(
        &self,
        l: Vec<RecordBatch>,
        r: Vec<RecordBatch>,
        metrics: &Metrics,
    ) -> Result<Vec<RecordBatch>> {
        let _timer = metrics.compute.timer();
        if l.is_empty() || r.is_empty() {
            return Ok(Vec::new());
        }
        let l = concat_batches(&l[0].schema(), &l)?;
        let r = concat_batches(&r[0].schema(), &r)?;
        let (l, r) = (
            self.keyed(l, &self.left_keys)?,
            self.keyed(r, &self.right_keys)?,
        );
        let mut by_trace: FxHashMap<&str, Vec<u32>> = FxHashMap::default();
        for i in 0..l.batch.num_rows() {
            by_trace.entry(l.trace(i)).or_default().push(i as u32);
        }
        let mut r_by_trace: FxHashMap<&str, Vec<u32>> = FxHashMap::default();
        for j in 0..r.batch.num_rows() {
            r_by_trace.entry(r.trace(j)).or_default().push(j as u32);
        }
        let mut pairs = (Vec::new(), Vec::new());
        for (t, rs) in &r_by_trace {
            if let Some(ls) = by_trace.get(t) {
                Self::pair(&l, &r, ls, rs, &mut pairs);
            }
        }
        let out = self.output(&l.batch, &r.batch, pairs)?;
        metrics.output.add(out.num_rows());
        Ok(vec![out])
    }
}
