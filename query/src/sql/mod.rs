//! SQL over the store: DataFusion with Weft's tables, per tenant, with limits.
//!
//! Each query gets its own DataFusion session over one snapshot of the tenant's data, with a
//! memory pool of its own (so one greedy query fails alone) and a deadline. Only read-only
//! statements are accepted: queries, `EXPLAIN`, `SHOW`, `DESCRIBE`.

pub mod columns;
pub mod functions;
mod log2bucket;
pub mod logs;
mod metrics;
pub(crate) mod percentile;
mod percentiles;
pub mod pg_catalog;
pub mod plans;
pub mod pushdown;
pub mod request;
pub mod runs;
pub mod scan;
pub mod shared;
pub mod tables;
mod timebin;
pub mod tracejoin;

use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use datafusion::catalog::{
    MemoryCatalogProvider, MemoryCatalogProviderList, SchemaProvider, TableProvider,
};
use datafusion::error::DataFusionError;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::session_state::SessionState;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::prelude::{SQLOptions, SessionConfig, SessionContext};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::Statement;
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use weft_storage::Store;
use weft_storage::model::TenantId;

use tables::{Nested, NestedTable, SpansTable, TableContext, TracesTable};

/// Limits and switches of the SQL engine; each has a server flag.
#[derive(Clone, Debug)]
pub struct SqlConfig {
    /// Memory one query may hold in DataFusion's operators (sorts, joins, aggregations).
    pub memory_limit: usize,
    /// Wall-clock limit of one query, results included.
    pub timeout: Duration,
    pub target_partitions: usize,
    /// Use the store's indexes and time ranges, and compute repeated subplans once (off only
    /// to check answers).
    pub pushdown: bool,
    /// Optimised plans kept for queries sent again with the same text (0 keeps none).
    pub plan_cache: usize,
    /// Context windows (tokens) by model name or name prefix, for the saturation analytics
    /// (over the built-in defaults of common models).
    pub context_windows: std::collections::BTreeMap<String, u64>,
    /// Queries that may run at once, over HTTP and PostgreSQL together; more wait.
    pub max_concurrent: usize,
    /// How long a query waits for a turn before it is refused (503 / SQLSTATE 53300).
    pub queue_wait: Duration,
    /// A join of `spans` with itself on the trace id runs trace by trace when both sides
    /// select more rows than this; with a smaller side the hash join reads the other side's
    /// rows of those traces only, through the trace-id index (see `tracejoin`).
    pub trace_local_join_min_rows: usize,
}

impl Default for SqlConfig {
    fn default() -> Self {
        Self {
            memory_limit: 512 << 20,
            timeout: Duration::from_secs(60),
            target_partitions: std::thread::available_parallelism().map_or(2, |n| n.get()),
            pushdown: true,
            plan_cache: 512,
            context_windows: Default::default(),
            max_concurrent: std::thread::available_parallelism()
                .map_or(4, |n| n.get() * 2)
                .max(4),
            queue_wait: Duration::from_secs(5),
            trace_local_join_min_rows: scan::MAX_TRACE_IDS,
        }
    }
}

/// What went wrong with a statement, and where in its text when known (1-based).
#[derive(Debug, Clone, PartialEq)]
pub struct SqlError {
    pub kind: SqlErrorKind,
    pub message: String,
    pub line: Option<u64>,
    pub column: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlErrorKind {
    /// A statement other than a query: refused.
    NotAQuery,
    /// The text does not parse, or names unknown tables, columns or functions.
    Invalid,
    /// The query exceeded its memory budget.
    ResourcesExhausted,
    /// The query exceeded its time budget.
    Timeout,
    /// The query failed while running, on its own terms (a bad cast, say).
    Execution,
    /// Weft failed (storage, a bug): not the query's fault.
    Internal,
    /// Too many queries are running: retry shortly.
    Busy,
}

impl std::fmt::Display for SqlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SqlError {}

impl SqlError {
    fn new(kind: SqlErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            line: None,
            column: None,
        }
    }

    /// Weft failed (a storage error), not the query.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(SqlErrorKind::Internal, message)
    }

    pub fn timeout(limit: Duration) -> Self {
        Self::new(
            SqlErrorKind::Timeout,
            format!(
                "query cancelled: it ran longer than the {} s limit (--sql-timeout)",
                limit.as_secs_f64()
            ),
        )
    }

    /// Classifies a DataFusion error and finds the position it names, if any.
    pub fn from_datafusion(e: DataFusionError, planning: bool) -> Self {
        let mut line = None;
        let mut column = None;
        if let Some(d) = e.diagnostic()
            && let Some(span) = d.span
        {
            line = Some(span.start.line);
            column = Some(span.start.column);
        }
        let root = e.find_root();
        let kind = match root {
            DataFusionError::ResourcesExhausted(_) => SqlErrorKind::ResourcesExhausted,
            DataFusionError::SQL(..)
            | DataFusionError::Plan(_)
            | DataFusionError::SchemaError(..) => SqlErrorKind::Invalid,
            DataFusionError::NotImplemented(_) if planning => SqlErrorKind::Invalid,
            DataFusionError::Internal(_)
            | DataFusionError::External(_)
            | DataFusionError::IoError(_) => SqlErrorKind::Internal,
            _ if planning => SqlErrorKind::Invalid,
            _ => SqlErrorKind::Execution,
        };
        let message = match root {
            DataFusionError::ResourcesExhausted(m) => {
                format!("query needs more memory than its limit (--sql-memory-limit): {m}")
            }
            _ => e.strip_backtrace(),
        };
        if line.is_none() {
            (line, column) = position_in(&message);
        }
        Self {
            kind,
            message,
            line,
            column,
        }
    }
}

/// Finds "Line: L, Column: C" in a parser message.
fn position_in(message: &str) -> (Option<u64>, Option<u64>) {
    let Some(at) = message.rfind("Line: ") else {
        return (None, None);
    };
    let rest = &message[at + 6..];
    let line: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let Some(c) = rest.find("Column: ") else {
        return (line.parse().ok(), None);
    };
    let column: String = rest[c + 8..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    (line.parse().ok(), column.parse().ok())
}

/// A running query: its result schema and its batches.
pub struct QueryStream {
    pub schema: SchemaRef,
    pub stream: SendableRecordBatchStream,
}

/// The SQL engine of one store.
#[derive(Clone)]
pub struct SqlEngine {
    store: Arc<Store>,
    config: SqlConfig,
    /// Configuration, built-in and PostgreSQL functions and optimizer rules, built once; each
    /// query's session starts from it with its own catalog and memory pool.
    template: Arc<SessionState>,
    /// The same without Weft's own optimizer rule (for queries with push-down disabled, the
    /// plain plans every optimisation is checked against).
    plain: Arc<SessionState>,
    plans: Arc<plans::PlanCache>,
    /// Turns to run: `max_concurrent` permits.
    turns: Arc<tokio::sync::Semaphore>,
}

impl SqlEngine {
    pub fn new(store: Arc<Store>, config: SqlConfig) -> Self {
        let template = |share: bool| {
            let mut session = SessionConfig::new()
                .with_information_schema(true)
                .with_create_default_catalog_and_schema(false)
                .with_default_catalog_and_schema("weft", "public")
                .with_target_partitions(config.target_partitions.max(1));
            session.options_mut().sql_parser.dialect = datafusion::config::Dialect::PostgreSQL;
            session.options_mut().sql_parser.collect_spans = true;
            session.options_mut().execution.time_zone = Some("UTC".into());
            // Weft's scans report upper bounds of their rows (exact when nothing filters them):
            // a small one is not worth splitting over partitions (a repartition would also
            // read it all ahead, before a TopK above could skip its blocks)
            session
                .options_mut()
                .execution
                .use_row_number_estimates_to_optimize_partitioning = true;
            // a join's build side of up to a few thousand trace ids reaches the probe side's
            // scan as a list, which the scan looks up in the trace-id index (see `scan.rs`)
            session
                .options_mut()
                .optimizer
                .hash_join_inlist_pushdown_max_distinct_values = scan::MAX_TRACE_IDS;
            let mut builder = SessionStateBuilder::new()
                .with_config(session)
                .with_default_features();
            if share {
                builder = builder.with_optimizer_rule(Arc::new(percentiles::SharePercentiles));
                // runs first: shared subtrees are fingerprinted as they will execute
                // trace-local joins go in before DataFusion lays out partitions and
                // repartitions, so that the operators above are planned for their output
                let mut rules = PhysicalOptimizer::new().rules;
                let at = rules
                    .iter()
                    .position(|r| r.name() == "EnsureRequirements")
                    .unwrap_or(rules.len());
                rules.insert(
                    at,
                    Arc::new(tracejoin::TraceLocalJoins {
                        min_side_rows: config.trace_local_join_min_rows,
                    }),
                );
                builder = builder
                    .with_physical_optimizer_rules(rules)
                    .with_physical_optimizer_rule(Arc::new(runs::CollapseGroupRuns))
                    .with_physical_optimizer_rule(Arc::new(shared::ShareRepeatedSubplans));
            }
            let ctx = SessionContext::new_with_state(builder.build());
            functions::register(&ctx);
            pg_catalog::register(&ctx);
            Arc::new(ctx.state())
        };
        Self {
            store,
            template: template(true),
            plain: template(false),
            plans: Arc::new(plans::PlanCache::new(config.plan_cache)),
            turns: Arc::new(tokio::sync::Semaphore::new(config.max_concurrent.max(1))),
            config,
        }
    }

    pub fn config(&self) -> &SqlConfig {
        &self.config
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The optimised plans kept for queries sent again.
    pub fn plans(&self) -> &plans::PlanCache {
        &self.plans
    }

    /// A DataFusion session for one query of one tenant: its tables over one snapshot, the
    /// PostgreSQL catalog describing them, Weft's functions, and a memory pool of its own.
    pub fn session(&self, tenant: &TenantId) -> Result<Session, SqlError> {
        self.session_with(tenant, self.config.pushdown)
    }

    pub fn session_with(&self, tenant: &TenantId, pushdown: bool) -> Result<Session, SqlError> {
        let df = |e| SqlError::from_datafusion(e, true);
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_limit(self.config.memory_limit, 1.0)
            .build_arc()
            .map_err(df)?;
        // a copy of the template (no function is built or registered again) with a catalog
        // of its own; the runtime (memory pool) is given to the query's task context
        let mut state = if pushdown {
            self.template.as_ref().clone()
        } else {
            self.plain.as_ref().clone()
        };
        state.register_catalog_list(Arc::new(MemoryCatalogProviderList::new()));
        // the query's start: `now()` folds to it when the plan is optimised
        state.mark_start_execution();
        let ctx = SessionContext::new_with_state(state);
        let table_ctx = TableContext {
            store: self.store.clone(),
            tenant: tenant.clone(),
            snapshot: self
                .store
                .snapshot(tenant)
                .map_err(|e| SqlError::internal(e.to_string()))?,
            pushdown,
            requests: Default::default(),
            scattered: Default::default(),
        };
        let tables: Vec<(&'static str, Arc<dyn TableProvider>)> = vec![
            ("spans", Arc::new(SpansTable::new(table_ctx.clone()))),
            (
                "span_events",
                Arc::new(NestedTable::new(table_ctx.clone(), Nested::Events)),
            ),
            (
                "span_links",
                Arc::new(NestedTable::new(table_ctx.clone(), Nested::Links)),
            ),
            ("traces", Arc::new(TracesTable::new(table_ctx))),
            (
                "logs",
                Arc::new(
                    logs::LogsTable::new(self.store.clone(), tenant.clone())
                        .map_err(|e| SqlError::internal(e.to_string()))?,
                ),
            ),
            (
                "metrics",
                Arc::new(
                    metrics::MetricsTable::new(self.store.clone(), tenant.clone())
                        .map_err(|e| SqlError::internal(e.to_string()))?,
                ),
            ),
        ];
        let described = pg_catalog::CatalogTables(
            tables
                .iter()
                .enumerate()
                .map(|(i, (n, t))| {
                    (
                        pg_catalog::FIRST_TABLE_OID + i as i64,
                        n.to_string(),
                        t.schema(),
                    )
                })
                .collect(),
        );
        let catalog = MemoryCatalogProvider::new();
        let public = datafusion::catalog::MemorySchemaProvider::new();
        for (name, t) in tables {
            public.register_table(name.to_owned(), t).map_err(df)?;
        }
        datafusion::catalog::CatalogProvider::register_schema(&catalog, "public", Arc::new(public))
            .map_err(df)?;
        let pg = pg_catalog::PgCatalog::new(described.clone(), functions::database_name(tenant));
        datafusion::catalog::CatalogProvider::register_schema(&catalog, "pg_catalog", Arc::new(pg))
            .map_err(df)?;
        ctx.register_catalog("weft", Arc::new(catalog));
        functions::register_tenant(&ctx, tenant);
        ctx.register_udtf(
            "leaks",
            Arc::new(crate::analytics::leaks::LeaksFunction {
                store: self.store.clone(),
                tenant: tenant.clone(),
            }),
        );
        crate::analytics::functions::register(&ctx, self, tenant);
        Ok(Session {
            ctx,
            runtime,
            turns: self.turns.clone(),
            max_concurrent: self.config.max_concurrent.max(1),
            queue_wait: self.config.queue_wait,
            tables: described,
            plans: self.plans.clone(),
            tenant: tenant.clone(),
            pushdown,
        })
    }

    /// Checks that a statement only reads, then plans it and starts it.
    pub async fn query(&self, tenant: &TenantId, sql: &str) -> Result<QueryStream, SqlError> {
        self.query_with(tenant, sql, self.config.pushdown).await
    }

    pub async fn query_with(
        &self,
        tenant: &TenantId,
        sql: &str,
        pushdown: bool,
    ) -> Result<QueryStream, SqlError> {
        let session = self.session_with(tenant, pushdown)?;
        let plan = session.prepare(sql, || parse_one(sql)).await?;
        session.execute_optimised(plan).await
    }
}

/// An optimised plan ready to start, and where its physical plan is kept when its text's
/// plan is (see [`plans::Slot`]).
pub struct Prepared {
    pub plan: LogicalPlan,
    physical: Option<plans::Slot>,
}

impl From<LogicalPlan> for Prepared {
    fn from(plan: LogicalPlan) -> Self {
        Self {
            plan,
            physical: None,
        }
    }
}

/// One query's DataFusion session.
pub struct Session {
    pub ctx: SessionContext,
    /// The query's own runtime: its memory pool and spill files.
    runtime: Arc<RuntimeEnv>,
    /// The engine's turns to run (see [`SqlConfig::max_concurrent`]).
    turns: Arc<tokio::sync::Semaphore>,
    max_concurrent: usize,
    queue_wait: Duration,
    tables: pg_catalog::CatalogTables,
    plans: Arc<plans::PlanCache>,
    tenant: TenantId,
    pushdown: bool,
}

impl Session {
    /// Plans a read-only statement (PostgreSQL-only syntax rewritten first).
    pub async fn plan(&self, mut statement: Statement) -> Result<LogicalPlan, SqlError> {
        check_statement(&statement)?;
        pg_catalog::rewrite(&mut statement, &self.tables);
        crate::analytics::functions::rewrite_named_args(&mut statement);
        let plan = self
            .ctx
            .state()
            .statement_to_plan(DFStatement::Statement(Box::new(statement)))
            .await
            .map_err(|e| SqlError::from_datafusion(e, true))?;
        SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false)
            .verify_plan(&plan)
            .map_err(|e| SqlError::new(SqlErrorKind::NotAQuery, e.strip_backtrace()))?;
        Ok(plan)
    }

    /// The optimised plan of the statement whose text is `text`: the one kept from an
    /// earlier query of the same text when there is one (its scans bound to this session's
    /// tables), else `statement()` planned and optimised now, and kept when it may be reused.
    pub async fn prepare(
        &self,
        text: &str,
        statement: impl FnOnce() -> Result<Statement, SqlError>,
    ) -> Result<Prepared, SqlError> {
        if let Some(prepared) = self.kept(text).await? {
            return Ok(prepared);
        }
        let analysed = self.plan(statement()?).await?;
        let optimised = self.optimise(&analysed)?;
        let physical = self
            .plans
            .keep(&self.tenant, self.pushdown, text, &analysed, &optimised);
        Ok(Prepared {
            plan: optimised,
            physical,
        })
    }

    /// The optimised plan kept from an earlier query of this text, bound to this session's
    /// tables, if there is one.
    pub async fn kept(&self, text: &str) -> Result<Option<Prepared>, SqlError> {
        Ok(self
            .plans
            .take(&self.ctx, &self.tenant, self.pushdown, text)
            .await
            .map_err(|e| SqlError::from_datafusion(e, true))?
            .map(|(plan, physical)| Prepared {
                plan,
                physical: Some(physical),
            }))
    }

    /// Runs DataFusion's logical optimizer over a plan from [`Session::plan`].
    pub fn optimise(&self, plan: &LogicalPlan) -> Result<LogicalPlan, SqlError> {
        self.ctx
            .state_ref()
            .read()
            .optimize(plan)
            .map_err(|e| SqlError::from_datafusion(e, false))
    }

    /// Starts an optimised plan: physical planning (where the scans choose their blocks from
    /// this session's snapshot), then execution. A plan kept with a reusable physical plan
    /// rebuilds that one instead, its scans choosing their blocks from this session's
    /// snapshot as well.
    pub async fn execute_optimised(
        &self,
        prepared: impl Into<Prepared>,
    ) -> Result<QueryStream, SqlError> {
        // a turn, held until the result stream is dropped (read to its end or abandoned)
        let turn = match tokio::time::timeout(self.queue_wait, self.turns.clone().acquire_owned())
            .await
        {
            Ok(Ok(turn)) => turn,
            _ => {
                return Err(SqlError::new(
                    SqlErrorKind::Busy,
                    format!(
                        "{} SQL queries are running, the most allowed (--sql-max-concurrent), and none finished within {:?}: retry shortly",
                        self.max_concurrent, self.queue_wait
                    ),
                ));
            }
        };
        let Prepared {
            plan,
            physical: slot,
        } = prepared.into();
        let df = |e| SqlError::from_datafusion(e, false);
        let schema = Arc::new(plan.schema().as_arrow().clone());
        let template = slot
            .as_ref()
            .and_then(|s| s.lock().unwrap_or_else(|e| e.into_inner()).clone());
        let rebuilt = match &template {
            Some(t) => plans::rebuild(t, &self.ctx).await.map_err(df)?,
            None => None,
        };
        let physical = match rebuilt {
            Some(p) => p,
            None => {
                let state = self.ctx.state();
                let p = state
                    .query_planner()
                    .create_physical_plan(&plan, &state)
                    .await
                    .map_err(df)?;
                if let Some(slot) = &slot
                    && template.is_none()
                    && plans::keepable(&p, &plan)
                {
                    *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(p.clone());
                }
                p
            }
        };
        // from the session's own state (a rebuilt plan needs no copy of it)
        let task = TaskContext::from(&*self.ctx.state_ref().read());
        let task = Arc::new(task.with_runtime(self.runtime.clone()));
        let stream = datafusion::physical_plan::execute_stream(physical, task)
            .map_err(|e| SqlError::from_datafusion(e, false))?;
        let held = stream.map(move |batch| {
            let _turn = &turn;
            batch
        });
        let stream = Box::pin(
            datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema.clone(), held),
        );
        Ok(QueryStream { schema, stream })
    }
}

/// Parses SQL text (PostgreSQL dialect) into statements, with the error's position.
pub fn parse(sql: &str) -> Result<Vec<Statement>, SqlError> {
    datafusion::sql::sqlparser::parser::Parser::parse_sql(&PostgreSqlDialect {}, sql).map_err(|e| {
        let message = format!("syntax error: {e}");
        let (mut line, mut column) = position_in(&message);
        if line.is_none() && message.contains("found: EOF") {
            // the end of the text
            let last = sql.trim_end().lines().last().unwrap_or_default();
            line = Some(sql.trim_end().lines().count().max(1) as u64);
            column = Some(last.chars().count() as u64 + 1);
        }
        SqlError {
            kind: SqlErrorKind::Invalid,
            message,
            line,
            column,
        }
    })
}

/// Parses exactly one statement.
pub fn parse_one(sql: &str) -> Result<Statement, SqlError> {
    let mut statements = parse(sql)?;
    if statements.len() != 1 {
        return Err(SqlError::new(
            SqlErrorKind::Invalid,
            format!("expected exactly one statement, found {}", statements.len()),
        ));
    }
    Ok(statements.remove(0))
}

/// Refuses anything but a single read-only statement, naming what was sent.
pub fn check_read_only(sql: &str) -> Result<(), SqlError> {
    check_statement(&parse_one(sql)?)
}

/// Refuses statements other than queries, naming what was sent.
pub fn check_statement(statement: &Statement) -> Result<(), SqlError> {
    match statement {
        Statement::Query(_)
        | Statement::Explain { .. }
        | Statement::ExplainTable { .. }
        | Statement::ShowTables { .. }
        | Statement::ShowColumns { .. }
        | Statement::ShowVariable { .. } => Ok(()),
        other => {
            let text = other.to_string();
            let head: String = text
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ")
                .to_uppercase();
            Err(SqlError::new(
                SqlErrorKind::NotAQuery,
                format!(
                    "only queries are accepted (SELECT, WITH, VALUES, EXPLAIN, SHOW, DESCRIBE); this is a {head} statement"
                ),
            ))
        }
    }
}

pub const TABLES: &[&str] = &["spans", "span_events", "span_links", "traces"];

#[cfg(test)]
mod tests;
