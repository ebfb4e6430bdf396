//! Optimised logical plans kept for the next query with the same text.
//!
//! Dashboards, Grafana panels and PostgreSQL clients send the same statements again and
//! again; parsing, binding and DataFusion's logical optimizer cost about a third of a small
//! indexed query's time. A plan is kept per (tenant, push-down, text) once optimised, and a
//! later query takes it with each table scan bound again to the table of its own session (its
//! own snapshot): physical planning, where the scans choose their blocks and indexes, runs
//! for every query as before.
//!
//! A plan is kept only when nothing in it may differ from one run to the next: no function
//! that is not immutable (`now()`, `random()`, `current_setting`, which the optimizer would
//! fold into constants), no parameter, no `EXPLAIN`. A kept plan is used only while every
//! table it reads has the schema it was planned with: a new dynamic attribute column, or one
//! gone, plans the text again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use datafusion::catalog::TableProvider;
use datafusion::common::TableReference;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::provider_as_source;
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan, TableSource, Volatility};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::limit::{GlobalLimitExec, LocalLimitExec};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::prelude::SessionContext;
use weft_storage::model::TenantId;

use super::runs::RunAggregateExec;
use super::scan::WeftScanExec;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    tenant: TenantId,
    pushdown: bool,
    text: String,
}

impl Key {
    fn new(tenant: &TenantId, pushdown: bool, text: &str) -> Self {
        Self {
            tenant: tenant.clone(),
            pushdown,
            text: text.to_owned(),
        }
    }
}

/// Where the physical plan of a kept logical plan is kept, once it is known to be reusable
/// (see [`keepable`]): a template that each later query rebuilds with its own scans.
pub type Slot = Arc<Mutex<Option<Arc<dyn ExecutionPlan>>>>;

struct Entry {
    plan: LogicalPlan,
    physical: Slot,
    /// The cache's clock when the entry was last used (the least recent goes first).
    used: u64,
}

/// Optimised plans by tenant and text, at most `capacity` of them.
pub struct PlanCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    clock: u64,
}

impl PlanCache {
    /// A cache of at most `capacity` plans (0 keeps none).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // a panic while holding the lock leaves only plans, each whole
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a plan of this text is kept (it may still be dropped when taken, if a table it
    /// reads changed schema): a caller can skip setting up a session for nothing.
    pub fn holds(&self, tenant: &TenantId, pushdown: bool, text: &str) -> bool {
        self.capacity > 0
            && self
                .lock()
                .entries
                .contains_key(&Key::new(tenant, pushdown, text))
    }

    /// Whether the plan of this text is kept with its physical plan.
    #[cfg(test)]
    pub fn holds_physical(&self, tenant: &TenantId, pushdown: bool, text: &str) -> bool {
        self.lock()
            .entries
            .get(&Key::new(tenant, pushdown, text))
            .is_some_and(|e| {
                e.physical
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .is_some()
            })
    }

    fn get(&self, key: &Key) -> Option<(LogicalPlan, Slot)> {
        if self.capacity == 0 {
            return None;
        }
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        inner.entries.get_mut(key).map(|e| {
            e.used = now;
            (e.plan.clone(), e.physical.clone())
        })
    }

    fn put(&self, key: Key, plan: LogicalPlan) -> Option<Slot> {
        if self.capacity == 0 {
            return None;
        }
        let mut inner = self.lock();
        inner.clock += 1;
        let used = inner.clock;
        if inner.entries.len() >= self.capacity {
            let oldest = inner
                .entries
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                inner.entries.remove(&oldest);
            }
        }
        let physical = Slot::default();
        inner.entries.insert(
            key,
            Entry {
                plan,
                physical: physical.clone(),
                used,
            },
        );
        Some(physical)
    }

    /// The kept plan of this text, its scans bound to the tables of `ctx`; `None` when there
    /// is none, or when a table it reads changed its schema (the plan is then dropped).
    pub async fn take(
        &self,
        ctx: &SessionContext,
        tenant: &TenantId,
        pushdown: bool,
        text: &str,
    ) -> Result<Option<(LogicalPlan, Slot)>> {
        let key = Key::new(tenant, pushdown, text);
        let Some((plan, physical)) = self.get(&key) else {
            return Ok(None);
        };
        let rebound = rebind(plan, ctx).await?;
        if rebound.is_none() {
            self.lock().entries.remove(&key);
        }
        Ok(rebound.map(|plan| (plan, physical)))
    }

    /// Keeps an optimised plan of this text, if `analysed` (the plan before optimisation)
    /// may be reused; the slot for its physical plan when it was kept.
    pub fn keep(
        &self,
        tenant: &TenantId,
        pushdown: bool,
        text: &str,
        analysed: &LogicalPlan,
        optimised: &LogicalPlan,
    ) -> Option<Slot> {
        if reusable(analysed) {
            self.put(Key::new(tenant, pushdown, text), optimised.clone())
        } else {
            None
        }
    }
}

/// Whether the optimised form of this plan gives the same answer in every later run over the
/// same tables: no parameter, no function that is not immutable (the optimizer folds `now()`
/// into the time of planning), no `EXPLAIN` (whose text is made while optimising).
fn reusable(plan: &LogicalPlan) -> bool {
    if matches!(
        plan,
        LogicalPlan::Explain(_)
            | LogicalPlan::Analyze(_)
            | LogicalPlan::Statement(_)
            | LogicalPlan::Ddl(_)
            | LogicalPlan::Dml(_)
            | LogicalPlan::Copy(_)
            | LogicalPlan::DescribeTable(_)
    ) {
        return false;
    }
    let mut fixed = true;
    // a walk stops at the first expression that may change between runs
    let _ = plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            e.apply(|e| {
                fixed = match e {
                    Expr::ScalarFunction(f) => {
                        f.func.signature().volatility == Volatility::Immutable
                    }
                    Expr::Placeholder(_) => false,
                    _ => true,
                };
                Ok(if fixed {
                    TreeNodeRecursion::Continue
                } else {
                    TreeNodeRecursion::Stop
                })
            })
        })
    });
    fixed
}

/// The plan with each scan reading the table of the same name in `ctx`; `None` when one of
/// them is gone or has another schema.
async fn rebind(plan: LogicalPlan, ctx: &SessionContext) -> Result<Option<LogicalPlan>> {
    let mut scanned = Vec::new();
    plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            scanned.push((scan.table_name.clone(), scan.source.schema()));
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    let mut sources: HashMap<TableReference, Arc<dyn TableSource>> = HashMap::new();
    for (name, schema) in scanned {
        if sources.contains_key(&name) {
            continue;
        }
        let Ok(provider) = ctx.table_provider(name.clone()).await else {
            return Ok(None);
        };
        if provider.schema() != schema {
            return Ok(None);
        }
        sources.insert(name, provider_as_source(provider));
    }
    plan.transform_up_with_subqueries(|node| match node {
        LogicalPlan::TableScan(mut scan) => {
            scan.source = Arc::clone(&sources[&scan.table_name]);
            Ok(Transformed::yes(LogicalPlan::TableScan(scan)))
        }
        other => Ok(Transformed::no(other)),
    })
    .map(|t| Some(t.data))
}

/// Whether a physical plan of `logical` may be kept and rebuilt for later queries (see
/// [`rebuild`]): every operator is one whose only state is reset when rebuilt, every table
/// is read by a scan that can be bound again (none folded into a constant from statistics,
/// as `count(*)` can be), and no operator pushed a dynamic filter (a TopK's or a join's,
/// wired between operators when the plan is optimised).
pub fn keepable(physical: &Arc<dyn ExecutionPlan>, logical: &LogicalPlan) -> bool {
    let mut tables = 0usize;
    let _ = logical.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(_) = node {
            tables += 1;
        }
        Ok(TreeNodeRecursion::Continue)
    });
    let mut scans = 0usize;
    let mut simple = true;
    let _ = physical.apply(|node| {
        let node = node.as_ref();
        simple = if let Some(scan) = node.downcast_ref::<WeftScanExec>() {
            scans += 1;
            !scan.has_parent_filters()
        } else if let Some(sort) = node.downcast_ref::<SortExec>() {
            sort.fetch().is_none()
        } else {
            node.is::<ProjectionExec>()
                || node.is::<FilterExec>()
                || node.is::<AggregateExec>()
                || node.is::<RunAggregateExec>()
                || node.is::<CoalescePartitionsExec>()
                || node.is::<RepartitionExec>()
                || node.is::<SortPreservingMergeExec>()
                || node.is::<CooperativeExec>()
                || node.is::<GlobalLimitExec>()
                || node.is::<LocalLimitExec>()
        };
        Ok(if simple {
            TreeNodeRecursion::Continue
        } else {
            TreeNodeRecursion::Stop
        })
    });
    simple && scans > 0 && scans == tables
}

/// A plan accepted by [`keepable`] rebuilt for the query of `ctx`: each scan bound to the
/// table of the same name in its session (its snapshot: the blocks and rows chosen again),
/// every other operator copied with fresh state. `None` when a table is gone or changed
/// schema. Skips physical planning and the physical optimizer, which for a small indexed
/// query cost as much as running it.
pub async fn rebuild(
    template: &Arc<dyn ExecutionPlan>,
    ctx: &SessionContext,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let mut names = Vec::new();
    template.apply(|node| {
        if let Some(scan) = node.downcast_ref::<WeftScanExec>()
            && !names.contains(&scan.table())
        {
            names.push(scan.table());
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    let mut tables = Vec::with_capacity(names.len());
    for name in names {
        let Ok(provider) = ctx.table_provider(name).await else {
            return Ok(None);
        };
        tables.push((name, provider));
    }
    copy(template, &tables)
}

fn copy(
    node: &Arc<dyn ExecutionPlan>,
    tables: &[(&str, Arc<dyn TableProvider>)],
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if let Some(scan) = node.downcast_ref::<WeftScanExec>() {
        let Some((_, table)) = tables.iter().find(|(n, _)| *n == scan.table()) else {
            return Ok(None);
        };
        return Ok(scan
            .rebind(table.as_ref())?
            .map(|s| Arc::new(s) as Arc<dyn ExecutionPlan>));
    }
    let mut children = Vec::new();
    for child in node.children() {
        match copy(child, tables)? {
            Some(c) => children.push(c),
            None => return Ok(None),
        }
    }
    // the rebound scans have the properties the plan was optimised with (same schema and
    // partition count): nothing above is recomputed, only its state made new
    let copied = Arc::clone(node).replace_children(
        children,
        ReplaceChildrenOptions::new(ChildrenPropertiesMode::Keep),
    )?;
    Ok(Some(copied.reset_state()?))
}
