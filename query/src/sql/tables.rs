//! The tables of a tenant: `spans`, `span_events`, `span_links` and `traces`, each a DataFusion
//! `TableProvider` over one snapshot of the store (blocks plus head rows as of one instant).

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, OnceLock};

use arrow::array::{
    ArrayRef, AsArray, Int64Array, ListBuilder, MapBuilder, RecordBatch, StringArray,
    StringBuilder, TimestampNanosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use roaring::RoaringBitmap;
use weft_storage::Store;
use weft_storage::model::{Event, Link, SpanRecord, TenantId, TraceId};
use weft_storage::scan::{BlockAddr, BlockMeta, ParentRows, Rows};
use weft_storage::store::Snapshot;
use weft_storage::summary::{SummaryBuilder, TraceSummary};

use super::columns::{SpanCol, SpanColumns, list_type, map_type, storage_err, timestamp_type};
use super::pushdown::{BlockWork, LateRows, Pushdown, ScanPlan};
use super::request::{self, HeadRequests, RequestCell};
use super::scan::{ScanSource, TraceRows, WeftScanExec};
use super::tracejoin::Scattered;

/// What every table of one query reads: the store, the tenant and one snapshot.
#[derive(Clone)]
pub struct TableContext {
    pub store: Arc<Store>,
    pub tenant: TenantId,
    pub snapshot: Snapshot,
    /// Push-down on (the default) or off (to check answers against a plain scan).
    pub pushdown: bool,
    /// The head's request values, computed when a query first uses a request column.
    pub requests: Arc<RequestCell>,
    /// The snapshot's traces that do not lie in one block, computed when a trace-local join
    /// first asks.
    pub scattered: Arc<std::sync::OnceLock<Arc<Scattered>>>,
}

impl TableContext {
    fn head_requests(&self) -> Result<Arc<HeadRequests>> {
        self.requests.get(&self.store, &self.tenant, &self.snapshot)
    }
}

impl fmt::Debug for TableContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TableContext")
            .field("tenant", &self.tenant)
            .field("blocks", &self.snapshot.blocks.len())
            .field("pushdown", &self.pushdown)
            .finish()
    }
}

/// The fixed `spans` columns (no dynamic ones): enough to analyse filters on the columns the
/// other tables share with `spans`. Built once.
fn fixed_spans_columns() -> &'static SpanColumns {
    static FIXED: std::sync::OnceLock<SpanColumns> = std::sync::OnceLock::new();
    FIXED.get_or_init(|| SpanColumns::with_dynamic(Default::default()))
}

/// Filters that only use `shared` columns, which mean the same as on `spans`.
fn shared_filters(filters: &[Expr], shared: &[&str]) -> Vec<Expr> {
    filters
        .iter()
        .filter(|f| uses_only(f, shared))
        .cloned()
        .collect()
}

fn uses_only(f: &Expr, shared: &[&str]) -> bool {
    f.column_refs()
        .iter()
        .all(|c| shared.contains(&c.name.as_str()))
}

/// Push-down answer for a table whose `shared` columns mean the same as on `spans`.
fn shared_pushdown(
    ctx: &TableContext,
    filters: &[&Expr],
    shared: &[&str],
) -> Vec<TableProviderFilterPushDown> {
    filters
        .iter()
        .map(|f| {
            if ctx.pushdown && uses_only(f, shared) && Pushdown::supports(fixed_spans_columns(), f)
            {
                TableProviderFilterPushDown::Inexact
            } else {
                TableProviderFilterPushDown::Unsupported
            }
        })
        .collect()
}

/// Head rows passing the pushed filters, as (batch, row) indexes into the snapshot.
fn head_rows(ctx: &TableContext, p: &Pushdown) -> Result<Vec<(u32, u32)>> {
    let requests = match ctx.pushdown && p.uses_requests() {
        true => Some(ctx.head_requests()?),
        false => None,
    };
    let mut out = Vec::new();
    for (b, batch) in ctx.snapshot.head.batches.iter().enumerate() {
        for (i, r) in batch.iter().enumerate() {
            if !ctx.pushdown || p.row_matches(r, requests.as_deref()) {
                out.push((b as u32, i as u32));
            }
        }
    }
    Ok(out)
}

fn head_records<'a>(ctx: &'a TableContext, rows: &[(u32, u32)]) -> Vec<&'a SpanRecord> {
    rows.iter()
        .map(|&(b, i)| &ctx.snapshot.head.batches[b as usize][i as usize])
        .collect()
}

// ---------------------------------------------------------------------------------------
// spans

#[derive(Debug)]
pub struct SpansTable {
    ctx: TableContext,
    columns: Arc<SpanColumns>,
}

impl SpansTable {
    pub fn new(ctx: TableContext) -> Self {
        let columns = SpanColumns::discover(&ctx.snapshot);
        Self { ctx, columns }
    }

    /// A read of this table's snapshot with `pushdown`: the blocks and rows it selects, and
    /// the source that reads them.
    fn source(&self, pushdown: Pushdown) -> Result<(Arc<dyn ScanSource>, ScanPlan)> {
        let ctx = &self.ctx;
        let late = Late {
            ctx,
            filters: request::slot_filters(&pushdown),
        };
        let plan = ScanPlan::build_with(
            &ctx.store,
            &ctx.tenant,
            &ctx.snapshot,
            &pushdown,
            ctx.pushdown,
            Some(&late),
        )?;
        let head = head_rows(&self.ctx, &pushdown)?;
        let source = SpansSource {
            ctx: self.ctx.clone(),
            columns: self.columns.clone(),
            pushdown,
            head,
        };
        Ok((Arc::new(source), plan))
    }
}

/// Late rows of blocks for a scan of `spans` (see [`LateRows`]).
struct Late<'a> {
    ctx: &'a TableContext,
    /// The pushed request filters, as (request slot, terms).
    filters: Vec<(usize, Vec<String>)>,
}

impl LateRows for Late<'_> {
    fn late(
        &self,
        addr: BlockAddr,
        meta: &BlockMeta,
        dims: &[&'static str],
    ) -> Result<RoaringBitmap> {
        let ctx = self.ctx;
        let head = ctx.head_requests()?;
        request::late_rows(
            &ctx.store,
            &ctx.tenant,
            &ctx.snapshot,
            &head,
            addr,
            meta,
            dims,
        )
    }

    fn passing(
        &self,
        addr: BlockAddr,
        meta: &BlockMeta,
        rows: &RoaringBitmap,
    ) -> Result<RoaringBitmap> {
        let ctx = self.ctx;
        let head = ctx.head_requests()?;
        request::late_rows_passing(
            &ctx.store,
            &ctx.tenant,
            &ctx.snapshot,
            &head,
            (addr, meta),
            rows,
            &self.filters,
        )
    }
}

#[derive(Debug)]
struct SpansSource {
    ctx: TableContext,
    columns: Arc<SpanColumns>,
    pushdown: Pushdown,
    head: Vec<(u32, u32)>,
}

impl ScanSource for SpansSource {
    fn table(&self) -> &'static str {
        "spans"
    }
    fn schema(&self) -> SchemaRef {
        self.columns.schema.clone()
    }
    fn leaves_out_damage(&self) -> bool {
        self.ctx.store.options().skip_corrupt_blocks
    }

    fn read_block(&self, work: &BlockWork, projection: &[usize]) -> Result<(usize, Vec<ArrayRef>)> {
        let view = self
            .ctx
            .store
            .block_view(&self.ctx.tenant, work.addr, &work.meta);
        let n = work.rows.len(work.meta.rows);
        let mut arrays = view
            .columns(&work.rows, &self.columns, projection)
            .map_err(storage_err)?;
        let mut requests: Vec<(usize, &mut ArrayRef)> = projection
            .iter()
            .zip(arrays.iter_mut())
            .filter_map(|(&p, a)| match self.columns.cols[p] {
                SpanCol::Request(i) => Some((request::slot(i), a)),
                _ => None,
            })
            .collect();
        if !requests.is_empty() {
            let ctx = &self.ctx;
            let head = ctx.head_requests()?;
            request::fix_block(
                &ctx.store,
                &ctx.tenant,
                &ctx.snapshot,
                &head,
                work.addr,
                &work.meta,
                &work.rows,
                &mut requests,
            )?;
        }
        Ok((n, arrays))
    }
    fn read_head(&self, projection: &[usize]) -> Result<Vec<(usize, Vec<ArrayRef>)>> {
        if self.head.is_empty() {
            return Ok(Vec::new());
        }
        let rows = head_records(&self.ctx, &self.head);
        let uses_requests = projection
            .iter()
            .any(|&p| matches!(self.columns.cols[p], SpanCol::Request(_)));
        let requests = match uses_requests {
            true => Some(self.ctx.head_requests()?),
            false => None,
        };
        let of_request = |r: &SpanRecord| requests.as_deref().and_then(|h| h.of(r));
        Ok(vec![(
            rows.len(),
            weft_storage::scan::spans::read_rows(
                &rows,
                &self.columns,
                projection,
                requests.is_some().then_some(&of_request),
            )
            .map_err(storage_err)?,
        )])
    }
    fn head_rows(&self) -> usize {
        self.head.len()
    }
    fn row_per_selected_row(&self) -> bool {
        true
    }
    fn pushdown(&self) -> bool {
        self.ctx.pushdown
    }
    fn describe(&self) -> String {
        if self.ctx.pushdown {
            self.pushdown.to_string()
        } else {
            "push-down disabled".into()
        }
    }
    fn share_key(&self) -> String {
        format!("pushdown={} {:?}", self.ctx.pushdown, self.pushdown)
    }
    fn scattered_traces(&self) -> Option<Arc<Scattered>> {
        let ctx = &self.ctx;
        Some(
            ctx.scattered
                .get_or_init(|| Arc::new(Scattered::new(&ctx.snapshot)))
                .clone(),
        )
    }
    fn knows_parent_rows(&self, work: &BlockWork) -> bool {
        self.ctx
            .store
            .block_view(&self.ctx.tenant, work.addr, &work.meta)
            .has_parent_ranks()
    }
    fn parent_rows(&self, work: &BlockWork, rows: &RoaringBitmap) -> Result<Option<ParentRows>> {
        self.ctx
            .store
            .block_view(&self.ctx.tenant, work.addr, &work.meta)
            .parent_rows(rows)
            .map_err(storage_err)
    }
    fn trace_rows(&self, ids: &BTreeSet<String>) -> Result<Option<TraceRows>> {
        let ctx = &self.ctx;
        let mut out = TraceRows::new();
        for id in ids {
            // text that is not a stored id's form names no trace
            let Ok(trace) = TraceId::from_hex(id) else {
                continue;
            };
            for (addr, entry) in ctx
                .store
                .trace_locations_in(&ctx.tenant, &ctx.snapshot, &trace)
                .map_err(storage_err)?
            {
                out.entry(addr)
                    .or_default()
                    .insert_range(entry.row_start..entry.row_start + entry.rows);
            }
        }
        Ok(Some(out))
    }
    fn rescan(&self, table: &dyn TableProvider) -> Result<Option<(Arc<dyn ScanSource>, ScanPlan)>> {
        let Some(table) = table.downcast_ref::<SpansTable>() else {
            return Ok(None);
        };
        // a changed schema is refused by the caller (`WeftScanExec::rebind`)
        if table.ctx.pushdown != self.ctx.pushdown {
            return Ok(None);
        }
        table.source(self.pushdown.clone()).map(Some)
    }
}

#[async_trait]
impl TableProvider for SpansTable {
    fn schema(&self) -> SchemaRef {
        self.columns.schema.clone()
    }
    fn table_type(&self) -> TableType {
        TableType::Base
    }
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| {
                if self.ctx.pushdown && Pushdown::exact(&self.columns, f) {
                    TableProviderFilterPushDown::Exact
                } else if self.ctx.pushdown && Pushdown::supports(&self.columns, f) {
                    TableProviderFilterPushDown::Inexact
                } else {
                    TableProviderFilterPushDown::Unsupported
                }
            })
            .collect())
    }
    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let (source, plan) = self.source(Pushdown::from_filters(&self.columns, filters))?;
        Ok(Arc::new(WeftScanExec::new(
            source,
            plan,
            projection,
            limit,
            state.config().target_partitions(),
        )?))
    }
}

// ---------------------------------------------------------------------------------------
// span_events and span_links: one row per event / link, with the span they belong to

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Nested {
    Events,
    Links,
}

#[derive(Debug)]
pub struct NestedTable {
    ctx: TableContext,
    kind: Nested,
    schema: SchemaRef,
}

impl NestedTable {
    pub fn new(ctx: TableContext, kind: Nested) -> Self {
        // the same for every query: built once
        static EVENTS: OnceLock<SchemaRef> = OnceLock::new();
        static LINKS: OnceLock<SchemaRef> = OnceLock::new();
        let cell = match kind {
            Nested::Events => &EVENTS,
            Nested::Links => &LINKS,
        };
        let schema = cell.get_or_init(|| Self::schema_of(kind)).clone();
        Self { ctx, kind, schema }
    }

    fn schema_of(kind: Nested) -> SchemaRef {
        let common = [
            Field::new("trace_id", DataType::Utf8, false),
            Field::new("span_id", DataType::Utf8, false),
            Field::new("service_name", DataType::Utf8, false),
            Field::new("span_name", DataType::Utf8, false),
        ];
        let own = match kind {
            Nested::Events => vec![
                Field::new("time", timestamp_type(), false),
                Field::new("name", DataType::Utf8, false),
                Field::new("attributes", map_type(), false),
                Field::new("dropped_attributes_count", DataType::Int64, false),
            ],
            Nested::Links => vec![
                Field::new("linked_trace_id", DataType::Utf8, false),
                Field::new("linked_span_id", DataType::Utf8, false),
                Field::new("trace_state", DataType::Utf8, false),
                Field::new("flags", DataType::Int64, false),
                Field::new("attributes", map_type(), false),
                Field::new("dropped_attributes_count", DataType::Int64, false),
            ],
        };
        Arc::new(Schema::new(
            common.into_iter().chain(own).collect::<Vec<_>>(),
        ))
    }
}

/// The columns `span_events` and `span_links` share with `spans`.
const NESTED_SHARED: &[&str] = &["trace_id", "service_name"];

#[derive(Debug)]
struct NestedSource {
    ctx: TableContext,
    kind: Nested,
    schema: SchemaRef,
    pushdown: Pushdown,
    head: Vec<(u32, u32)>,
}

struct SpanSide<'a> {
    trace: String,
    span: String,
    service: &'a str,
    name: &'a str,
}

impl NestedSource {
    fn build(
        &self,
        spans: Vec<SpanSide<'_>>,
        events: Vec<Vec<Event>>,
        links: Vec<Vec<Link>>,
        projection: &[usize],
    ) -> Result<(usize, Vec<ArrayRef>)> {
        let mut trace = StringBuilder::new();
        let mut span = StringBuilder::new();
        let mut service = StringBuilder::new();
        let mut span_name = StringBuilder::new();
        let mut a = Vec::<i64>::new(); // time or flags
        let mut s1 = StringBuilder::new(); // name or linked trace
        let mut s2 = StringBuilder::new(); // linked span
        let mut s3 = StringBuilder::new(); // trace state
        let mut attrs = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
        let mut dropped = Vec::<i64>::new();
        for (i, sp) in spans.iter().enumerate() {
            let mut push_side = || {
                trace.append_value(&sp.trace);
                span.append_value(&sp.span);
                service.append_value(sp.service);
                span_name.append_value(sp.name);
            };
            match self.kind {
                Nested::Events => {
                    for e in &events[i] {
                        push_side();
                        a.push(e.time.0 as i64);
                        s1.append_value(&e.name);
                        for kv in &e.attributes {
                            attrs.keys().append_value(&kv.key);
                            attrs.values().append_option(kv.value.text());
                        }
                        attrs.append(true)?;
                        dropped.push(i64::from(e.dropped_attributes_count));
                    }
                }
                Nested::Links => {
                    for l in &links[i] {
                        push_side();
                        s1.append_value(l.trace_id.to_hex());
                        s2.append_value(l.span_id.to_hex());
                        s3.append_value(&l.trace_state);
                        a.push(i64::from(l.flags));
                        for kv in &l.attributes {
                            attrs.keys().append_value(&kv.key);
                            attrs.values().append_option(kv.value.text());
                        }
                        attrs.append(true)?;
                        dropped.push(i64::from(l.dropped_attributes_count));
                    }
                }
            }
        }
        let mut all: Vec<ArrayRef> = vec![
            Arc::new(trace.finish()),
            Arc::new(span.finish()),
            Arc::new(service.finish()),
            Arc::new(span_name.finish()),
        ];
        match self.kind {
            Nested::Events => {
                all.push(Arc::new(
                    TimestampNanosecondArray::from(a).with_timezone("UTC"),
                ));
                all.push(Arc::new(s1.finish()));
                all.push(Arc::new(attrs.finish()));
            }
            Nested::Links => {
                all.push(Arc::new(s1.finish()));
                all.push(Arc::new(s2.finish()));
                all.push(Arc::new(s3.finish()));
                all.push(Arc::new(Int64Array::from(a)));
                all.push(Arc::new(attrs.finish()));
            }
        }
        all.push(Arc::new(Int64Array::from(dropped)));
        Ok((
            all[0].len(),
            projection.iter().map(|&p| all[p].clone()).collect(),
        ))
    }
}

impl ScanSource for NestedSource {
    fn table(&self) -> &'static str {
        match self.kind {
            Nested::Events => "span_events",
            Nested::Links => "span_links",
        }
    }
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
    fn read_block(&self, work: &BlockWork, projection: &[usize]) -> Result<(usize, Vec<ArrayRef>)> {
        let r = self
            .ctx
            .store
            .block_view(&self.ctx.tenant, work.addr, &work.meta);
        let (events, links) = match self.kind {
            Nested::Events => (r.events(&work.rows).map_err(storage_err)?, Vec::new()),
            Nested::Links => (Vec::new(), r.links(&work.rows).map_err(storage_err)?),
        };
        let any = events.iter().any(|e| !e.is_empty()) || links.iter().any(|l| !l.is_empty());
        if !any {
            return self.build(Vec::new(), events, links, projection);
        }
        let traces = r.trace_ids(&work.rows).map_err(storage_err)?;
        let spans = r.span_ids(&work.rows).map_err(storage_err)?;
        let services = r.services(&work.rows).map_err(storage_err)?;
        let names = r.names(&work.rows).map_err(storage_err)?;
        let (services, names) = (services.as_string::<i32>(), names.as_string::<i32>());
        let sides = (0..traces.len())
            .map(|i| SpanSide {
                trace: traces[i].to_hex(),
                span: spans[i].to_hex(),
                service: services.value(i),
                name: names.value(i),
            })
            .collect();
        self.build(sides, events, links, projection)
    }
    fn read_head(&self, projection: &[usize]) -> Result<Vec<(usize, Vec<ArrayRef>)>> {
        let rows = head_records(&self.ctx, &self.head);
        let sides = rows
            .iter()
            .map(|r| SpanSide {
                trace: r.trace_id.to_hex(),
                span: r.span_id.to_hex(),
                service: r.service_name(),
                name: &r.name,
            })
            .collect();
        let events = rows.iter().map(|r| r.events.clone()).collect();
        let links = rows.iter().map(|r| r.links.clone()).collect();
        Ok(vec![self.build(sides, events, links, projection)?])
    }
    fn head_rows(&self) -> usize {
        self.head.len()
    }
    fn pushdown(&self) -> bool {
        self.ctx.pushdown
    }
    fn describe(&self) -> String {
        if self.ctx.pushdown {
            self.pushdown.to_string()
        } else {
            "push-down disabled".into()
        }
    }
    fn share_key(&self) -> String {
        format!("pushdown={} {:?}", self.ctx.pushdown, self.pushdown)
    }
}

#[async_trait]
impl TableProvider for NestedTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
    fn table_type(&self) -> TableType {
        TableType::Base
    }
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(shared_pushdown(&self.ctx, filters, NESTED_SHARED))
    }
    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let shared = shared_filters(filters, NESTED_SHARED);
        let pushdown = Pushdown::from_filters(fixed_spans_columns(), &shared);
        let plan = ScanPlan::build(
            &self.ctx.store,
            &self.ctx.tenant,
            &self.ctx.snapshot,
            &pushdown,
            self.ctx.pushdown,
        )?;
        let head = head_rows(&self.ctx, &pushdown)?;
        let source = NestedSource {
            ctx: self.ctx.clone(),
            kind: self.kind,
            schema: self.schema.clone(),
            pushdown,
            head,
        };
        Ok(Arc::new(WeftScanExec::new(
            Arc::new(source),
            plan,
            projection,
            limit,
            state.config().target_partitions(),
        )?))
    }
}

// ---------------------------------------------------------------------------------------
// traces: one row per trace, merged over every block and the head

#[derive(Debug)]
pub struct TracesTable {
    ctx: TableContext,
    schema: SchemaRef,
}

impl TracesTable {
    pub fn new(ctx: TableContext) -> Self {
        let schema = Arc::new(Schema::new(vec![
            Field::new("trace_id", DataType::Utf8, false),
            Field::new("root_service", DataType::Utf8, true),
            Field::new("root_name", DataType::Utf8, true),
            Field::new("start_time", timestamp_type(), false),
            Field::new("end_time", timestamp_type(), false),
            Field::new("duration_ns", DataType::Int64, false),
            Field::new("span_count", DataType::Int64, false),
            Field::new("error_count", DataType::Int64, false),
            Field::new("services", list_type(), false),
        ]));
        Self { ctx, schema }
    }
}

/// Adds one span to its trace's aggregate.
fn merge_span(aggs: &mut HashMap<TraceId, TraceAgg>, r: &SpanRecord, want_services: bool) {
    let a = aggs.entry(r.trace_id).or_default();
    a.summary.add_span(r);
    if want_services && !a.services.contains(r.service_name()) {
        a.services.insert(r.service_name().to_owned());
    }
}

/// A trace's summary (built as every reader builds it) and, when asked for, its services.
#[derive(Default)]
struct TraceAgg {
    summary: SummaryBuilder,
    services: BTreeSet<String>,
}

impl TracesTable {
    fn collect(
        &self,
        trace_filter: Option<&Vec<TraceId>>,
        want_services: bool,
    ) -> Result<RecordBatch> {
        let ctx = &self.ctx;
        let mut aggs: HashMap<TraceId, TraceAgg> = HashMap::new();
        // looked up once per trace entry of every block read, and per head row
        let wanted: Option<std::collections::HashSet<TraceId>> =
            trace_filter.map(|ids| ids.iter().copied().collect());
        let pushdown = Pushdown {
            trace_ids: trace_filter.cloned(),
            ..Default::default()
        };
        let plan = ScanPlan::build(
            &ctx.store,
            &ctx.tenant,
            &ctx.snapshot,
            &pushdown,
            ctx.pushdown,
        )?;
        for work in &plan.blocks {
            let entries = ctx
                .store
                .block_traces(&ctx.tenant, work.addr)
                .map_err(storage_err)?;
            let services = if want_services {
                let r = ctx.store.block_view(&ctx.tenant, work.addr, &work.meta);
                Some(r.services(&Rows::All).map_err(storage_err)?)
            } else {
                None
            };
            let cutoff = ctx
                .snapshot
                .cutoff
                .filter(|_| ctx.snapshot.straddles(&work.meta));
            for e in entries {
                if ctx.pushdown
                    && wanted
                        .as_ref()
                        .is_some_and(|ids| !ids.contains(&e.trace_id))
                {
                    continue;
                }
                if let Some(cutoff) = cutoff.filter(|c| e.min_start < c.0) {
                    // some of its spans are out of retention: count the ones still kept
                    let r = ctx.store.block_view(&ctx.tenant, work.addr, &work.meta);
                    let kept = r
                        .spans(&Rows::Range(e.row_start, e.rows), false)
                        .map_err(storage_err)?;
                    for span in kept.iter().filter(|s| s.start >= cutoff) {
                        merge_span(&mut aggs, span, want_services);
                    }
                    continue;
                }
                let a = aggs.entry(e.trace_id).or_default();
                a.summary.add_entry(&e);
                if let Some(s) = &services {
                    let s = s.as_string::<i32>();
                    for row in e.row_start..e.row_start + e.rows {
                        if !a.services.contains(s.value(row as usize)) {
                            a.services.insert(s.value(row as usize).to_owned());
                        }
                    }
                }
            }
        }
        for r in ctx.snapshot.head.rows() {
            if ctx.pushdown
                && wanted
                    .as_ref()
                    .is_some_and(|ids| !ids.contains(&r.trace_id))
            {
                continue;
            }
            merge_span(&mut aggs, r, want_services);
        }
        let mut ids: Vec<(TraceSummary, BTreeSet<String>)> = aggs
            .into_iter()
            .filter_map(|(id, a)| Some((a.summary.finish(id)?, a.services)))
            .collect();
        ids.sort_by_key(|(t, _)| (std::cmp::Reverse(t.start), t.trace_id));
        let mut services = ListBuilder::new(StringBuilder::new());
        for (_, names) in &ids {
            for s in names {
                services.values().append_value(s);
            }
            services.append(true);
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|(t, _)| t.trace_id.to_hex()),
            )),
            Arc::new(
                ids.iter()
                    .map(|(t, _)| t.root.as_ref().map(|r| r.service.clone()))
                    .collect::<StringArray>(),
            ),
            Arc::new(
                ids.iter()
                    .map(|(t, _)| t.root.as_ref().map(|r| r.name.clone()))
                    .collect::<StringArray>(),
            ),
            Arc::new(
                TimestampNanosecondArray::from_iter_values(ids.iter().map(|(t, _)| t.start as i64))
                    .with_timezone("UTC"),
            ),
            Arc::new(
                TimestampNanosecondArray::from_iter_values(ids.iter().map(|(t, _)| t.end as i64))
                    .with_timezone("UTC"),
            ),
            Arc::new(Int64Array::from_iter_values(
                ids.iter().map(|(t, _)| t.duration_ns() as i64),
            )),
            Arc::new(Int64Array::from_iter_values(
                ids.iter().map(|(t, _)| t.spans as i64),
            )),
            Arc::new(Int64Array::from_iter_values(
                ids.iter().map(|(t, _)| t.errors as i64),
            )),
            Arc::new(services.finish()),
        ];
        // services is declared with the shared list type; cast covers builder naming
        let columns = columns
            .into_iter()
            .zip(self.schema.fields())
            .map(|(c, f)| {
                if c.data_type() == f.data_type() {
                    Ok(c)
                } else {
                    arrow::compute::cast(&c, f.data_type())
                }
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }
}

#[async_trait]
impl TableProvider for TracesTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
    fn table_type(&self) -> TableType {
        TableType::Base
    }
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(shared_pushdown(&self.ctx, filters, &["trace_id"]))
    }
    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let trace_only = shared_filters(filters, &["trace_id"]);
        let pushdown = Pushdown::from_filters(fixed_spans_columns(), &trace_only);
        let want_services = projection.is_none_or(|p| p.contains(&8));
        let batch = self.collect(pushdown.trace_ids.as_ref(), want_services)?;
        let exec = MemorySourceConfig::try_new_exec(
            &[vec![batch]],
            self.schema.clone(),
            projection.cloned(),
        )?;
        Ok(exec)
    }
}
