//! The physical scan of Weft's tables: reads the blocks a [`ScanPlan`] chose (newest first,
//! spread over partitions) and the head rows, decoding column chunks on blocking threads.
//!
//! Filters that parent operators push at execution-plan level are of two kinds:
//! - a FilterExec's predicate (pushed before the plan is optimised): the scan applies it to
//!   each block's rows, and the FilterExec goes away. Each block's matching rows then reach the
//!   operator above at once, rather than after a filter has gathered a full batch from many
//!   blocks; that is what lets a TopK's threshold skip blocks early.
//! - a TopK's or a join's dynamic filter (pushed after): checked against each block's time
//!   range before it is read (once the TopK holds n rows newer than a block's newest span,
//!   that block is skipped), never reported as applied, so the parent still enforces it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::{
    Array, ArrayRef, AsArray, RecordBatch, RecordBatchOptions, StringArray, StringViewArray,
    TimestampNanosecondArray, UInt32Array, new_null_array,
};
use arrow::buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{DataType, Field, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::common::pruning::PruningStatistics;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Column, ScalarValue, Statistics};
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::{Column as ColumnExpr, IsNotNullExpr};
use datafusion::physical_expr::utils::{collect_columns, split_conjunction};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_expr_common::physical_expr::snapshot_physical_expr;
use datafusion::physical_optimizer::pruning::PruningPredicateBuilder;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterPushdownPhase, FilterPushdownPropagation, PushedDown,
};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};
use roaring::RoaringBitmap;
use weft_storage::scan::BlockAddr;
use weft_storage::scan::{ParentRows, Rows};

use super::pushdown::{BlockWork, ScanPlan};
use super::tracejoin::Scattered;

mod traces;

pub use traces::MAX_TRACE_IDS;

/// What a table reads: one block's selected rows, or the head's rows, as projected columns.
pub trait ScanSource: Send + Sync + fmt::Debug + 'static {
    fn table(&self) -> &'static str;
    /// The full schema of the table.
    fn schema(&self) -> SchemaRef;
    /// The rows read and the projected columns (no columns when none is projected, as for
    /// `count(*)`).
    fn read_block(&self, work: &BlockWork, projection: &[usize]) -> Result<(usize, Vec<ArrayRef>)>;
    fn read_head(&self, projection: &[usize]) -> Result<Vec<(usize, Vec<ArrayRef>)>>;
    /// Whether a block found damaged is left out of the answer instead of failing it
    /// (`--skip-corrupt-blocks`: the store has then left it out of later snapshots too).
    fn leaves_out_damage(&self) -> bool {
        false
    }
    /// Rows of the head the scan will read (for EXPLAIN).
    fn head_rows(&self) -> usize;
    /// Whether each selected row (of a block or the head) is one output row, so that the
    /// selected counts are the scan's exact row count (not so for a table with a row per
    /// event of a span).
    fn row_per_selected_row(&self) -> bool {
        false
    }
    /// Extra text for EXPLAIN (the pushed filters).
    fn describe(&self) -> String;
    /// Whether the scan may use indexes and apply its parents' filters itself (off only to
    /// check answers against plain plans).
    fn pushdown(&self) -> bool;
    /// Everything that decides what the scan reads (beyond table and projection), complete:
    /// two scans of one query with equal keys return the same rows.
    fn share_key(&self) -> String;
    /// The same read (same filters) over `table`, the same table in a later query's session,
    /// with its blocks and rows chosen again; `None` when this source cannot be rebound.
    fn rescan(
        &self,
        _table: &dyn TableProvider,
    ) -> Result<Option<(Arc<dyn ScanSource>, ScanPlan)>> {
        Ok(None)
    }
    /// The traces of the source's snapshot that do not lie in one block (for trace-local
    /// joins); `None` when this source cannot tell.
    fn scattered_traces(&self) -> Option<Arc<Scattered>> {
        None
    }
    /// Each block's rows of the given traces (ids as hex text), from the trace-id index;
    /// `None` when this source cannot tell.
    fn trace_rows(&self, _ids: &BTreeSet<String>) -> Result<Option<TraceRows>> {
        Ok(None)
    }
    /// Whether a block can name its rows' parents by row ([`ScanSource::parent_rows`]).
    fn knows_parent_rows(&self, _work: &BlockWork) -> bool {
        false
    }
    /// For each of `rows` (ascending) of a block, its trace's run and its parent's row (see
    /// [`weft_storage::scan::BlockView::parent_rows`]); `None` when the block cannot say.
    fn parent_rows(&self, _work: &BlockWork, _rows: &RoaringBitmap) -> Result<Option<ParentRows>> {
        Ok(None)
    }
}

/// `n` values standing for a column that is not read: nulls where the field allows them,
/// else empty text; `None` for other types.
fn placeholder(field: &Field, n: usize) -> Option<ArrayRef> {
    if field.is_nullable() {
        return Some(new_null_array(field.data_type(), n));
    }
    match field.data_type() {
        DataType::Utf8 => Some(std::sync::Arc::new(StringArray::new(
            OffsetBuffer::new_zeroed(n),
            Buffer::from_vec(Vec::<u8>::new()),
            None,
        ))),
        DataType::Utf8View => Some(std::sync::Arc::new(StringViewArray::new(
            ScalarBuffer::from(vec![0u128; n]),
            Vec::new(),
            None,
        ))),
        _ => None,
    }
}

/// Rows of some traces, per block.
pub type TraceRows = HashMap<BlockAddr, RoaringBitmap>;

#[derive(Clone, Copy, Debug)]
enum Work {
    Head,
    Block(usize),
}

#[derive(Clone, Debug)]
pub struct WeftScanExec {
    source: Arc<dyn ScanSource>,
    plan: Arc<ScanPlan>,
    projection: Vec<usize>,
    schema: SchemaRef,
    partitions: Vec<Vec<Work>>,
    limit: Option<usize>,
    /// Predicates of a parent FilterExec, applied to every row the scan emits.
    row_filters: Vec<Arc<dyn PhysicalExpr>>,
    /// Dynamic filters pushed by parent operators, checked per block against its time range.
    parent_filters: Vec<Arc<dyn PhysicalExpr>>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl WeftScanExec {
    pub fn new(
        source: Arc<dyn ScanSource>,
        plan: ScanPlan,
        projection: Option<&Vec<usize>>,
        limit: Option<usize>,
        target_partitions: usize,
    ) -> Result<Self> {
        let full = source.schema();
        let projection: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..full.fields().len()).collect(),
        };
        let schema = Arc::new(full.project(&projection)?);
        let small = plan.rows_selected.saturating_add(source.head_rows() as u64) <= SMALL_SCAN_ROWS
            && plan.blocks.len() <= SMALL_SCAN_BLOCKS;
        let works = 1 + plan.blocks.len();
        // a scan of few rows in few blocks (an index-served lookup) is one partition:
        // splitting it buys no parallelism and costs the plan a merge or a repartition (a few
        // rows from each of many blocks still gain from reading blocks two at a time)
        let n = if small {
            1
        } else {
            target_partitions.clamp(1, works)
        };
        Self::with_partitions(source, plan, projection, schema, limit, n)
    }

    fn with_partitions(
        source: Arc<dyn ScanSource>,
        plan: ScanPlan,
        projection: Vec<usize>,
        schema: SchemaRef,
        limit: Option<usize>,
        n: usize,
    ) -> Result<Self> {
        let mut works = vec![Work::Head];
        works.extend((0..plan.blocks.len()).map(Work::Block));
        let mut partitions = vec![Vec::new(); n];
        for (i, w) in works.into_iter().enumerate() {
            partitions[i % n].push(w);
        }
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(n),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self {
            source,
            plan: Arc::new(plan),
            projection,
            schema,
            partitions,
            limit,
            row_filters: Vec::new(),
            parent_filters: Vec::new(),
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// The same scan over the table of a later query's session (its own snapshot): the same
    /// filters, projection, limit and partition count (the plan above was built for it), the
    /// blocks and rows chosen again. `None` when the table has changed schema or its scans
    /// cannot be rebound. Dynamic filters are not carried over (a rebound plan has none: see
    /// `plans`).
    pub fn rebind(&self, table: &dyn TableProvider) -> Result<Option<Self>> {
        let Some((source, plan)) = self.source.rescan(table)? else {
            return Ok(None);
        };
        if source.schema() != self.source.schema() {
            return Ok(None);
        }
        let mut scan = Self::with_partitions(
            source,
            plan,
            self.projection.clone(),
            self.schema.clone(),
            self.limit,
            self.partitions.len(),
        )?;
        scan.row_filters = self.row_filters.clone();
        Ok(Some(scan))
    }

    /// The table read.
    pub fn table(&self) -> &'static str {
        self.source.table()
    }

    /// The blocks the scan reads, newest first, each with the rows it selects.
    pub(super) fn blocks(&self) -> &[BlockWork] {
        &self.plan.blocks
    }

    /// The most rows the scan emits (exact when index-answered filters alone select them).
    pub(super) fn rows_selected(&self) -> usize {
        self.rows_of(None)
    }

    /// Whether [`Self::rows_selected`] is near what the scan emits: it applies no row filter
    /// but on the time columns (whose bounds already chose the blocks) and `IS NOT NULL` on the
    /// ids (every span has its ids; only a root lacks a parent: children joined to their
    /// parents often say `parent_span_id IS NOT NULL`).
    pub(super) fn rows_known(&self) -> bool {
        self.row_filters
            .iter()
            .flat_map(|f| split_conjunction(f))
            .all(|f| {
                if let Some(e) = f.downcast_ref::<IsNotNullExpr>()
                    && let Some(c) = e.arg().downcast_ref::<ColumnExpr>()
                    && matches!(c.name(), "trace_id" | "span_id" | "parent_span_id")
                {
                    return true;
                }
                let columns = collect_columns(f);
                !columns.is_empty()
                    && columns
                        .iter()
                        .all(|c| matches!(c.name(), "start_time" | "end_time"))
            })
    }

    pub(super) fn limit(&self) -> Option<usize> {
        self.limit
    }

    /// The traces of the scan's snapshot that do not lie in one block.
    pub(super) fn scattered(&self) -> Option<Arc<Scattered>> {
        self.source.scattered_traces()
    }

    /// One block's selected rows (those of `work`), projected and through the row filters.
    pub(super) fn read_block_batch(&self, work: &BlockWork) -> Result<RecordBatch> {
        let (rows, columns) = self.source.read_block(work, &self.projection)?;
        self.apply_row_filters(RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )?)
    }

    /// [`Self::read_block_batch`] with the block's row number of each output row, and with
    /// the projected columns at `skip` (positions in the output) left unread: each is a
    /// placeholder of its type (empty or null values). Positions a row filter reads, or whose
    /// type has no placeholder, are read all the same.
    pub(super) fn read_block_numbered(
        &self,
        work: &BlockWork,
        skip: &[usize],
    ) -> Result<(RecordBatch, UInt32Array)> {
        let filtered: HashSet<usize> = self
            .row_filters
            .iter()
            .flat_map(|f| collect_columns(f).into_iter().map(|c| c.index()))
            .collect();
        let schema = self.schema.clone();
        let skip: Vec<usize> = skip
            .iter()
            .copied()
            .filter(|i| !filtered.contains(i) && *i < self.projection.len())
            .filter(|&i| placeholder(schema.field(i), 0).is_some())
            .collect();
        let read: Vec<usize> = (0..self.projection.len())
            .filter(|i| !skip.contains(i))
            .map(|i| self.projection[i])
            .collect();
        let (n, columns) = self.source.read_block(work, &read)?;
        let mut columns = columns.into_iter();
        let mut all = Vec::with_capacity(self.projection.len());
        for i in 0..self.projection.len() {
            match skip.contains(&i) {
                true => all.push(placeholder(schema.field(i), n).ok_or_else(|| {
                    DataFusionError::Internal("no placeholder for a column".into())
                })?),
                false => all.push(columns.next().ok_or_else(|| {
                    DataFusionError::Internal("a scan read fewer columns than asked".into())
                })?),
            }
        }
        let batch = RecordBatch::try_new_with_options(
            schema,
            all,
            &RecordBatchOptions::new().with_row_count(Some(n)),
        )?;
        let mut rows = UInt32Array::from_iter_values(work.rows.iter(work.meta.rows));
        if rows.len() != n {
            return Err(DataFusionError::Internal(format!(
                "a block read gave {n} rows for {} asked",
                rows.len()
            )));
        }
        let batch = self.filter_rows(batch, Some(&mut rows))?;
        Ok((batch, rows))
    }

    /// See [`ScanSource::knows_parent_rows`].
    pub(super) fn knows_parent_rows(&self, work: &BlockWork) -> bool {
        self.source.knows_parent_rows(work)
    }

    /// See [`ScanSource::parent_rows`].
    pub(super) fn parent_rows(
        &self,
        work: &BlockWork,
        rows: &RoaringBitmap,
    ) -> Result<Option<ParentRows>> {
        self.source.parent_rows(work, rows)
    }

    /// The head's selected rows, projected and through the row filters.
    pub(super) fn read_head_batches(&self) -> Result<Vec<RecordBatch>> {
        self.source
            .read_head(&self.projection)?
            .into_iter()
            .map(|(rows, columns)| {
                self.apply_row_filters(RecordBatch::try_new_with_options(
                    self.schema.clone(),
                    columns,
                    &RecordBatchOptions::new().with_row_count(Some(rows)),
                )?)
            })
            .collect()
    }

    /// Whether parent operators pushed dynamic filters into this scan.
    pub fn has_parent_filters(&self) -> bool {
        !self.parent_filters.is_empty()
    }

    /// What decides this scan's output: equal keys within one query mean equal rows (dynamic
    /// filters are left out: they only skip blocks, and shared scans drop them).
    pub fn share_key(&self) -> String {
        format!(
            "WeftScan table={} projection={:?} limit={:?} filter=[{}] {}",
            self.source.table(),
            self.projection,
            self.limit,
            self.row_filters_text(),
            self.source.share_key()
        )
    }

    fn row_filters_text(&self) -> String {
        self.row_filters
            .iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    /// A batch's rows that pass the row filters.
    fn apply_row_filters(&self, batch: RecordBatch) -> Result<RecordBatch> {
        self.filter_rows(batch, None)
    }

    /// [`Self::apply_row_filters`], keeping `numbers` (one per row of the batch) in step.
    fn filter_rows(
        &self,
        batch: RecordBatch,
        mut numbers: Option<&mut UInt32Array>,
    ) -> Result<RecordBatch> {
        let mut batch = batch;
        for f in &self.row_filters {
            if batch.num_rows() == 0 {
                break;
            }
            let keep = f.evaluate(&batch)?.into_array(batch.num_rows())?;
            let keep = keep.as_boolean_opt().ok_or_else(|| {
                DataFusionError::Internal(format!("filter {f} is not a boolean expression"))
            })?;
            batch = filter_record_batch(&batch, keep)?;
            if let Some(n) = numbers.as_deref_mut() {
                *n = arrow::compute::filter(n, keep)?.as_primitive().clone();
            }
        }
        Ok(batch)
    }

    /// The same scan without the dynamic filters parent operators pushed (for a scan whose
    /// output several consumers share, so that no one consumer's filter decides what all see);
    /// its row filters stay, being part of what it returns.
    pub fn without_parent_filters(&self) -> Self {
        let mut s = self.clone();
        s.parent_filters.clear();
        s.metrics = ExecutionPlanMetricsSet::new();
        s
    }

    /// Rows a partition (or the whole scan) will read: postings and the trace-id index make
    /// this exact for the filters they answer, and an upper bound for the others.
    fn rows_of(&self, partition: Option<usize>) -> usize {
        let rows = |w: &Work| self.rows_in(*w);
        match partition {
            Some(p) => self
                .partitions
                .get(p)
                .map_or(0, |ws| ws.iter().map(rows).sum()),
            None => self.partitions.iter().flatten().map(rows).sum(),
        }
    }

    /// Rows one piece of work selects (the head's, or a block's).
    fn rows_in(&self, work: Work) -> usize {
        match work {
            Work::Head => self.source.head_rows(),
            Work::Block(i) => {
                let b = &self.plan.blocks[i];
                b.rows.len(b.meta.rows)
            }
        }
    }

    /// A partition's work in groups read together: runs of consecutive pieces that each
    /// select fewer than `batch_size` rows, up to `batch_size` rows a group; any other piece
    /// alone. A group is one hand-off to a blocking thread (or none, when it is a few rows),
    /// and one batch: an index-served scan of a store of big blocks (a few thousand rows
    /// from each) pays neither per block.
    fn small_groups(&self, works: Vec<Work>, batch_size: usize) -> Vec<Vec<Work>> {
        let mut groups: Vec<Vec<Work>> = Vec::new();
        let mut rows = 0;
        let mut open = false;
        for w in works {
            let n = self.rows_in(w);
            if n >= batch_size {
                groups.push(vec![w]);
                open = false;
                continue;
            }
            match groups.last_mut() {
                Some(g) if open && rows + n <= batch_size => {
                    g.push(w);
                    rows += n;
                }
                _ => {
                    groups.push(vec![w]);
                    rows = n;
                    open = true;
                }
            }
        }
        groups
    }

    /// Each block's rows of the traces the parents' dynamic filters name, once they name a
    /// few (a join's build side is then complete); kept for the rest of the stream.
    fn trace_rows(&self, known: &Mutex<Option<Arc<TraceRows>>>) -> Result<Option<Arc<TraceRows>>> {
        if self.parent_filters.is_empty() || !self.source.pushdown() {
            return Ok(None);
        }
        let mut known = known.lock().unwrap_or_else(|e| e.into_inner());
        if known.is_none()
            && let Some(ids) = traces::filtered_trace_ids(&self.parent_filters)
        {
            *known = self.source.trace_rows(&ids)?.map(Arc::new);
        }
        Ok(known.clone())
    }

    /// Whether a block may hold rows passing the dynamic filters, judged on its time range
    /// (the row filters' time bounds already chose the blocks: see `Pushdown`).
    fn may_match(filters: &[Arc<dyn PhysicalExpr>], schema: &SchemaRef, work: &BlockWork) -> bool {
        let stats = BlockStats(work);
        filters.iter().all(|f| {
            let Ok(current) = snapshot_physical_expr(f.clone()) else {
                return true;
            };
            let Ok(predicate) = PruningPredicateBuilder::new()
                .with_file_schema(schema.clone())
                .try_build(current)
            else {
                return true;
            };
            predicate
                .prune(&stats)
                .map_or(true, |keep| keep.first().copied().unwrap_or(true))
        })
    }
}

/// Scans selecting at most this many rows (at most one batch) from at most this many blocks
/// run as one partition.
const SMALL_SCAN_ROWS: u64 = 8192;
const SMALL_SCAN_BLOCKS: usize = 32;

/// A piece of work read on its own (a trace-local join's pair of blocks) with at most this
/// many selected rows is read on its own task rather than on a blocking thread; a scan's
/// groups go by its batch size (see `small_groups`).
pub(super) const INLINE_READ_ROWS: usize = 1024;

/// A copy of a column that holds much more memory than its rows use (a few rows decoded
/// from pages whose buffers come along), so that operators keeping batches (a join's build
/// side, a shared subplan) are charged for the rows, not the pages.
fn compact(array: ArrayRef) -> Result<ArrayRef> {
    let used = array.to_data().get_slice_memory_size()?;
    if array.get_array_memory_size() <= 2 * used + 64 * 1024 {
        return Ok(array);
    }
    let all = arrow::array::UInt32Array::from_iter_values(0..array.len() as u32);
    Ok(arrow::compute::take(array.as_ref(), &all, None)?)
}

/// Several pieces' columns as one piece (the same columns, rows one after another).
fn concat_pieces(pieces: Vec<(usize, Vec<ArrayRef>)>) -> Result<(usize, Vec<ArrayRef>)> {
    let rows = pieces.iter().map(|p| p.0).sum();
    let width = pieces.first().map_or(0, |p| p.1.len());
    let columns = (0..width)
        .map(|c| {
            let parts: Vec<&dyn Array> = pieces.iter().map(|p| p.1[c].as_ref()).collect();
            Ok(arrow::compute::concat(&parts)?)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((rows, columns))
}

/// Whether an expression reads the start or end time (the only columns [`BlockStats`] knows).
fn on_time_columns(e: &Arc<dyn PhysicalExpr>) -> bool {
    collect_columns(e)
        .iter()
        .any(|c| matches!(c.name(), "start_time" | "end_time"))
}

/// A block's time range as pruning statistics (one container).
struct BlockStats<'a>(&'a BlockWork);

impl PruningStatistics for BlockStats<'_> {
    fn min_values(&self, column: &Column) -> Option<ArrayRef> {
        let m = &self.0.meta;
        match column.name.as_str() {
            "start_time" | "end_time" => Some(ts(m.min_start)),
            _ => None,
        }
    }
    fn max_values(&self, column: &Column) -> Option<ArrayRef> {
        let m = &self.0.meta;
        match column.name.as_str() {
            "start_time" => Some(ts(m.max_start)),
            "end_time" => Some(ts(m.max_end)),
            _ => None,
        }
    }
    fn num_containers(&self) -> usize {
        1
    }
    fn null_counts(&self, column: &Column) -> Option<ArrayRef> {
        match column.name.as_str() {
            "start_time" | "end_time" => {
                Some(Arc::new(arrow::array::UInt64Array::from(vec![0u64])))
            }
            _ => None,
        }
    }
    fn row_counts(&self) -> Option<ArrayRef> {
        Some(Arc::new(arrow::array::UInt64Array::from(vec![u64::from(
            self.0.meta.rows,
        )])))
    }
    fn contained(
        &self,
        _column: &Column,
        _values: &std::collections::HashSet<ScalarValue>,
    ) -> Option<arrow::array::BooleanArray> {
        None
    }
}

fn ts(n: u64) -> ArrayRef {
    Arc::new(TimestampNanosecondArray::from(vec![n as i64]).with_timezone("UTC"))
}

impl DisplayAs for WeftScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        let p = &self.plan;
        write!(
            f,
            "WeftScan: table={}, projection=[{}], blocks={}/{} (pruned: {} by time, {} by index), rows={} from blocks + {} from head",
            self.source.table(),
            names.join(", "),
            p.blocks.len(),
            p.blocks_total,
            p.blocks_pruned_by_time,
            p.blocks_pruned_by_index,
            p.rows_selected,
            self.source.head_rows(),
        )?;
        let pushed = self.source.describe();
        if !pushed.is_empty() {
            write!(f, ", pushed=[{pushed}]")?;
        }
        if let Some(l) = self.limit {
            write!(f, ", limit={l}")?;
        }
        if !self.row_filters.is_empty() {
            write!(f, ", filter=[{}]", self.row_filters_text())?;
        }
        if !self.parent_filters.is_empty() {
            write!(
                f,
                ", block pruning by {} parent filter(s)",
                self.parent_filters.len()
            )?;
        }
        Ok(())
    }
}

impl ExecutionPlan for WeftScanExec {
    fn name(&self) -> &str {
        "WeftScan"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        for e in self.row_filters.iter().chain(&self.parent_filters) {
            if f(e)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal("WeftScan has no children".into()))
        }
    }

    fn handle_child_pushdown_result(
        &self,
        phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        _config: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        let filters: Vec<_> = child_pushdown_result
            .parent_filters
            .into_iter()
            .map(|f| f.filter)
            .collect();
        let n = filters.len();
        if n == 0 {
            return Ok(FilterPushdownPropagation {
                filters: Vec::new(),
                updated_node: None,
            });
        }
        let mut node = self.clone();
        // before optimisation, a FilterExec's predicates: applied here, row by row; after, the
        // dynamic filters of TopKs and joins: used to skip blocks, enforced by their owners
        let applied = phase == FilterPushdownPhase::Pre && self.source.pushdown();
        if applied {
            node.row_filters.extend(filters);
        } else {
            node.parent_filters.extend(filters);
        }
        let outcome = if applied {
            PushedDown::Yes
        } else {
            PushedDown::No
        };
        Ok(FilterPushdownPropagation {
            filters: vec![outcome; n],
            updated_node: Some(Arc::new(node)),
        })
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn partition_statistics(&self, partition: Option<usize>) -> Result<Arc<Statistics>> {
        let mut stats = Statistics::new_unknown(&self.schema);
        // The scan emits every row it selected: exact unless a limit, a row filter or a
        // parent's dynamic filter may drop some (filters DataFusion re-checks drop rows above
        // the scan, not in it).
        // Lets the planner put the small side of a join on the build side, and leave a scan
        // of a few rows unsplit.
        let rows = self.rows_of(partition);
        stats.num_rows = if self.source.row_per_selected_row()
            && self.limit.is_none()
            && self.row_filters.is_empty()
            && self.parent_filters.is_empty()
        {
            Precision::Exact(rows)
        } else {
            Precision::Inexact(rows)
        };
        Ok(Arc::new(stats))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let works = self.partitions.get(partition).cloned().unwrap_or_default();
        let batch_size = context.session_config().batch_size().max(1);
        let emitted = Arc::new(AtomicUsize::new(0));
        let skipped =
            MetricBuilder::new(&self.metrics).global_counter("blocks_skipped_by_parent_filters");
        let read = MetricBuilder::new(&self.metrics).global_counter("blocks_read");
        let rows_read = MetricBuilder::new(&self.metrics).global_counter("rows_read");
        let together = MetricBuilder::new(&self.metrics).global_counter("blocks_read_together");
        // only a filter on the time columns can skip a block (its time range is all a block's
        // statistics hold): a join's filter on trace ids, rebuilt as a pruning predicate for
        // every block, would never skip one
        let pruning: Arc<[Arc<dyn PhysicalExpr>]> = self
            .parent_filters
            .iter()
            .filter(|f| on_time_columns(f))
            .cloned()
            .collect();
        // Without a parent's dynamic filter or a limit (both judged block by block), the
        // few selected rows of consecutive blocks (an index-served scan) are read together
        // and go up as one batch: a batch per block costs more to build, filter and gather
        // than its few rows cost to read.
        let groups = if self.parent_filters.is_empty() && self.limit.is_none() {
            self.small_groups(works, batch_size)
        } else {
            works.into_iter().map(|w| vec![w]).collect()
        };
        let this = Arc::new(self.clone());
        let schema = self.schema.clone();
        // a join's filter naming a few trace ids: each block's rows of those traces, once known
        let by_trace: Arc<Mutex<Option<Arc<TraceRows>>>> = Arc::default();
        let stream = futures::stream::iter(groups)
            .then(move |group| {
                let this = this.clone();
                let by_trace = by_trace.clone();
                let pruning = pruning.clone();
                let emitted = emitted.clone();
                let (skipped, read, rows_read) = (skipped.clone(), read.clone(), rows_read.clone());
                let together = together.clone();
                async move {
                    if this
                        .limit
                        .is_some_and(|l| emitted.load(Ordering::Relaxed) >= l)
                    {
                        return Ok(Vec::new());
                    }
                    let mut reads = Vec::new();
                    let mut selected_rows = 0;
                    for work in group {
                        if let Work::Block(i) = work
                            && !pruning.is_empty()
                            && !Self::may_match(&pruning, &this.schema, &this.plan.blocks[i])
                        {
                            skipped.add(1);
                            continue;
                        }
                        // only the rows of the traces a join's filter names
                        let mut narrowed = None;
                        if let Work::Block(i) = work
                            && let Some(by_trace) = this.trace_rows(&by_trace)?
                        {
                            let b = &this.plan.blocks[i];
                            let rows = by_trace
                                .get(&b.addr)
                                .map(|keep| b.rows.intersect(keep))
                                .unwrap_or_default();
                            if rows.is_empty() {
                                skipped.add(1);
                                continue;
                            }
                            narrowed = Some(BlockWork {
                                rows: Rows::Set(rows),
                                ..b.clone()
                            });
                        }
                        // nothing selected (as in an empty head): nothing to read
                        let selected = match &narrowed {
                            Some(b) => b.rows.len(b.meta.rows),
                            None => this.rows_in(work),
                        };
                        if selected == 0 {
                            continue;
                        }
                        selected_rows += selected;
                        reads.push((work, narrowed));
                    }
                    let blocks = reads
                        .iter()
                        .filter(|(w, _)| matches!(w, Work::Block(_)))
                        .count();
                    let t = this.clone();
                    let decode = move || -> Result<Vec<(usize, Vec<ArrayRef>)>> {
                        let mut pieces = Vec::new();
                        for (work, narrowed) in &reads {
                            let block = match (work, narrowed) {
                                (Work::Head, _) => {
                                    pieces.extend(t.source.read_head(&t.projection)?);
                                    continue;
                                }
                                (Work::Block(_), Some(b)) => b,
                                (Work::Block(i), None) => &t.plan.blocks[*i],
                            };
                            match t.source.read_block(block, &t.projection) {
                                Ok(piece) => pieces.push(piece),
                                // a block read whole or not at all: left out of this answer
                                // as of every later one
                                Err(e) if t.source.leaves_out_damage() && is_damage(&e) => {}
                                Err(e) => return Err(e),
                            }
                        }
                        Ok(pieces)
                    };
                    // Fewer rows than a batch (an index-served query's rows of a few blocks,
                    // or of the head) read in about the time an operator takes over a batch:
                    // on the scan's own task, as operators run. Handing each such read to a
                    // blocking thread and back costs wake-ups on both sides, which on a
                    // machine of few cores made a selective scan half as slow again.
                    let mut pieces = if selected_rows < batch_size {
                        decode()?
                    } else {
                        tokio::task::spawn_blocking(decode)
                            .await
                            .map_err(|e| DataFusionError::External(Box::new(e)))??
                    };
                    read.add(blocks);
                    if pieces.len() > 1 && pieces.iter().map(|p| p.0).sum::<usize>() <= batch_size {
                        pieces = vec![concat_pieces(pieces)?];
                        together.add(blocks);
                    }
                    let mut batches = Vec::new();
                    for (rows, cols) in pieces {
                        rows_read.add(rows);
                        let batch = this.apply_row_filters(RecordBatch::try_new_with_options(
                            this.schema.clone(),
                            cols,
                            &RecordBatchOptions::new().with_row_count(Some(rows)),
                        )?)?;
                        let rows = batch.num_rows();
                        let cols = batch
                            .columns()
                            .iter()
                            .cloned()
                            .map(compact)
                            .collect::<Result<Vec<_>>>()?;
                        let batch = RecordBatch::try_new_with_options(
                            this.schema.clone(),
                            cols,
                            &RecordBatchOptions::new().with_row_count(Some(rows)),
                        )?;
                        let mut at = 0;
                        while at < rows {
                            let len = batch_size.min(rows - at);
                            batches.push(batch.slice(at, len));
                            at += len;
                        }
                        emitted.fetch_add(rows, Ordering::Relaxed);
                    }
                    Ok::<_, DataFusionError>(batches)
                }
            })
            .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
            .try_flatten();
        // Without a parent's dynamic filter, whose threshold moves batch by batch, the few
        // rows of many blocks (an index-served scan) go up as one batch: operators above pay
        // a fixed cost per batch, which a few rows do not cover. Under a join's filter they
        // go up block by block, each batch through the join and the aggregation above while
        // it is in cache (gathered into full batches, a join's probe side measured slower; see
        // BENCHMARKS.md).
        if self.parent_filters.is_empty() {
            let stream = Gathered {
                inner: Box::pin(stream),
                schema: schema.clone(),
                target: batch_size,
                held: Vec::new(),
                held_rows: 0,
                next: None,
                done: false,
            };
            return Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)));
        }
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// Batches of at most this many rows are gathered into batches of the session's batch size.
const GATHER_ROWS: usize = INLINE_READ_ROWS;

/// A scan's batches with the small ones gathered: each batch of at most [`GATHER_ROWS`] rows
/// waits for more until together they would pass `target` rows, a larger batch comes (which
/// then follows them, the order kept) or the scan ends.
struct Gathered {
    inner: std::pin::Pin<Box<dyn futures::Stream<Item = Result<RecordBatch>> + Send>>,
    schema: SchemaRef,
    target: usize,
    held: Vec<RecordBatch>,
    held_rows: usize,
    /// A large batch that comes out after the gathered ones.
    next: Option<RecordBatch>,
    done: bool,
}

impl Gathered {
    fn release(&mut self) -> Result<RecordBatch> {
        let mut batches = std::mem::take(&mut self.held);
        self.held_rows = 0;
        if batches.len() == 1
            && let Some(one) = batches.pop()
        {
            return Ok(one);
        }
        Ok(arrow::compute::concat_batches(&self.schema, &batches)?)
    }
}

impl futures::Stream for Gathered {
    type Item = Result<RecordBatch>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        loop {
            if let Some(b) = self.next.take() {
                return Poll::Ready(Some(Ok(b)));
            }
            if self.done {
                if self.held.is_empty() {
                    return Poll::Ready(None);
                }
                return Poll::Ready(Some(self.release()));
            }
            match self.inner.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => self.done = true,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(b))) if b.num_rows() > GATHER_ROWS => {
                    if self.held.is_empty() {
                        return Poll::Ready(Some(Ok(b)));
                    }
                    self.next = Some(b);
                    return Poll::Ready(Some(self.release()));
                }
                Poll::Ready(Some(Ok(b))) => {
                    let n = b.num_rows();
                    if self.held_rows + n > self.target {
                        let out = self.release();
                        self.held_rows = n;
                        self.held.push(b);
                        return Poll::Ready(Some(out));
                    }
                    self.held_rows += n;
                    self.held.push(b);
                    if self.held_rows == self.target {
                        return Poll::Ready(Some(self.release()));
                    }
                }
            }
        }
    }
}

/// Whether a query failed on a damaged block.
fn is_damage(e: &DataFusionError) -> bool {
    match e {
        DataFusionError::External(e) => e
            .downcast_ref::<weft_storage::StorageError>()
            .is_some_and(|e| matches!(e, weft_storage::StorageError::CorruptBlock { .. })),
        DataFusionError::Context(_, e) => is_damage(e),
        DataFusionError::Shared(e) => is_damage(e),
        _ => false,
    }
}
