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

use datafusion::common::TableReference;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::provider_as_source;
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan, TableSource, Volatility};
use datafusion::prelude::SessionContext;
use weft_storage::model::TenantId;

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

struct Entry {
    plan: LogicalPlan,
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

    fn get(&self, key: &Key) -> Option<LogicalPlan> {
        if self.capacity == 0 {
            return None;
        }
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        inner.entries.get_mut(key).map(|e| {
            e.used = now;
            e.plan.clone()
        })
    }

    fn put(&self, key: Key, plan: LogicalPlan) {
        if self.capacity == 0 {
            return;
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
        inner.entries.insert(key, Entry { plan, used });
    }

    /// The kept plan of this text, its scans bound to the tables of `ctx`; `None` when there
    /// is none, or when a table it reads changed its schema (the plan is then dropped).
    pub async fn take(
        &self,
        ctx: &SessionContext,
        tenant: &TenantId,
        pushdown: bool,
        text: &str,
    ) -> Result<Option<LogicalPlan>> {
        let key = Key::new(tenant, pushdown, text);
        let Some(plan) = self.get(&key) else {
            return Ok(None);
        };
        let rebound = rebind(plan, ctx).await?;
        if rebound.is_none() {
            self.lock().entries.remove(&key);
        }
        Ok(rebound)
    }

    /// Keeps an optimised plan of this text, if `analysed` (the plan before optimisation)
    /// may be reused.
    pub fn keep(
        &self,
        tenant: &TenantId,
        pushdown: bool,
        text: &str,
        analysed: &LogicalPlan,
        optimised: &LogicalPlan,
    ) {
        if reusable(analysed) {
            self.put(Key::new(tenant, pushdown, text), optimised.clone());
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
