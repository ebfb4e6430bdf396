//! How a capability runs its queries: through the SQL engine (its tables, index push-down,
//! memory budget), under the call's time budget, and with its rows budget checked first.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float64Type, Int64Type};
use weft_storage::model::TenantId;

use super::params::{Params, Result, invalid};
use crate::sql::{SqlEngine, SqlError, SqlErrorKind};

/// One analytics call: the engine, the tenant, the budgets and whether one was hit.
pub struct Run<'a> {
    pub engine: &'a SqlEngine,
    pub tenant: &'a TenantId,
    deadline: Instant,
    /// Set when a budget stopped the call early.
    pub partial: bool,
}

/// The answer of a query: its batches.
pub struct Rows(pub Vec<RecordBatch>);

impl<'a> Run<'a> {
    pub fn new(engine: &'a SqlEngine, tenant: &'a TenantId, params: &Params) -> Self {
        let limit = params
            .timeout
            .unwrap_or(engine.config().timeout)
            .min(engine.config().timeout);
        Self {
            engine,
            tenant,
            deadline: Instant::now() + limit,
            partial: false,
        }
    }

    /// A call with the engine's own time budget (TraceQL, the Tempo, Jaeger and Loki APIs).
    pub fn plain(engine: &'a SqlEngine, tenant: &'a TenantId) -> Self {
        Self::new(engine, tenant, &Params::default())
    }

    /// The same call for work run beside this one's (its `partial` to be added back with
    /// [`Self::join`]).
    pub fn fork(&self) -> Self {
        Self {
            engine: self.engine,
            tenant: self.tenant,
            deadline: self.deadline,
            partial: false,
        }
    }

    /// Takes back what a [`Self::fork`] found: whether a budget stopped it.
    pub fn join(&mut self, fork: Run<'a>) {
        self.partial |= fork.partial;
    }

    /// Time left of the call's budget.
    pub fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Runs one query to its end, within the time left.
    pub async fn sql(&self, query: &str) -> Result<Rows> {
        let left = self.left();
        if left.is_zero() {
            return Err(SqlError::timeout(Duration::ZERO).into());
        }
        let run = async {
            let stream = self.engine.query(self.tenant, query).await?;
            datafusion::physical_plan::common::collect(stream.stream)
                .await
                .map_err(|e| SqlError::from_datafusion(e, false))
        };
        match tokio::time::timeout(left, run).await {
            Ok(Ok(batches)) => Ok(Rows(batches)),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(SqlError::timeout(left).into()),
        }
    }

    /// Runs a query whose answer may be left out when the time budget runs out: `None` then,
    /// and the call is marked partial.
    pub async fn sql_or_partial(&mut self, query: &str) -> Result<Option<Rows>> {
        match self.sql(query).await {
            Ok(r) => Ok(Some(r)),
            Err(super::AnalyticsError::Sql(e)) if e.kind == SqlErrorKind::Timeout => {
                self.partial = true;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Runs storage work (reading blocks' rollups or postings) off the runtime's threads
    /// within the time left: `Ok(None)` when the budget ran out first (the call is marked
    /// partial; the work finishes unobserved), `what` naming it in errors.
    pub async fn blocking<T: Send + 'static, E: std::fmt::Display + Send + 'static>(
        &mut self,
        what: &str,
        work: impl FnOnce() -> std::result::Result<T, E> + Send + 'static,
    ) -> Result<Option<T>> {
        match tokio::time::timeout(self.left(), tokio::task::spawn_blocking(work)).await {
            Err(_) => {
                self.partial = true;
                Ok(None)
            }
            Ok(joined) => Ok(Some(
                joined
                    .map_err(|e| SqlError::internal(format!("{what}: {e}")))?
                    .map_err(|e| SqlError::internal(format!("{what}: {e}")))?,
            )),
        }
    }

    /// Applies the rows budget: when more than `max_rows_scanned` spans match the parameters,
    /// moves the start later so that about that many (the newest) remain, and marks the call
    /// partial. Needs a range: an open one is closed on the data's own.
    pub async fn fit_rows(&mut self, params: &mut Params) -> Result<()> {
        let Some(max) = params.max_rows_scanned else {
            return Ok(());
        };
        let rows = self
            .sql(&format!(
                "SELECT count(*), CAST(min(start_time) AS BIGINT), CAST(max(start_time) AS BIGINT) FROM spans {}",
                params.where_clause(&[])?
            ))
            .await?;
        let (count, lo, hi) = (
            rows.i64(0).first().copied().flatten().unwrap_or(0) as u64,
            rows.i64(1).first().copied().flatten(),
            rows.i64(2).first().copied().flatten(),
        );
        if count <= max {
            return Ok(());
        }
        let (Some(lo), Some(hi)) = (lo, hi) else {
            return Ok(());
        };
        let start = params.start.unwrap_or(lo as u64);
        let end = params.end.unwrap_or(hi as u64 + 1);
        let keep = (end - start) as f64 * max as f64 / count as f64;
        params.start = Some(end - keep.max(1.0) as u64);
        params.end = Some(end);
        self.partial = true;
        Ok(())
    }
}

impl Rows {
    pub fn len(&self) -> usize {
        self.0.iter().map(RecordBatch::num_rows).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn column(&self, i: usize, to: &DataType) -> Vec<ArrayRef> {
        self.0
            .iter()
            .map(|b| {
                let c = b.column(i);
                if c.data_type() == to {
                    c.clone()
                } else {
                    arrow::compute::cast(c, to)
                        .unwrap_or_else(|_| arrow::array::new_null_array(to, c.len()))
                }
            })
            .collect()
    }

    /// Column `i` as text (NULL as `None`).
    pub fn strings(&self, i: usize) -> Vec<Option<String>> {
        let mut out = Vec::with_capacity(self.len());
        for a in self.column(i, &DataType::Utf8) {
            let a = a.as_string::<i32>();
            out.extend((0..a.len()).map(|j| a.is_valid(j).then(|| a.value(j).to_owned())));
        }
        out
    }

    /// The distinct label sets of the columns after `first` (one per dimension, NULL left
    /// out), and each row's index among them: a set is built once, not once per row.
    pub fn label_ids(
        &self,
        first: usize,
        dims: &[String],
    ) -> (Vec<BTreeMap<String, String>>, Vec<usize>) {
        let columns: Vec<Vec<Option<String>>> =
            (0..dims.len()).map(|i| self.strings(first + i)).collect();
        let mut sets = Vec::new();
        let mut index: std::collections::HashMap<Vec<Option<&str>>, usize> = Default::default();
        let ids = (0..self.len())
            .map(|row| {
                let key: Vec<Option<&str>> = columns.iter().map(|c| c[row].as_deref()).collect();
                *index.entry(key).or_insert_with(|| {
                    sets.push(
                        dims.iter()
                            .zip(&columns)
                            .filter_map(|(d, c)| c[row].clone().map(|v| (d.clone(), v)))
                            .collect(),
                    );
                    sets.len() - 1
                })
            })
            .collect();
        (sets, ids)
    }

    /// Each row's labels from the columns after `first`, one per dimension (NULL left out).
    pub fn labels(&self, first: usize, dims: &[String]) -> Vec<BTreeMap<String, String>> {
        let (sets, ids) = self.label_ids(first, dims);
        ids.into_iter().map(|i| sets[i].clone()).collect()
    }

    /// Column `i` as floats.
    pub fn f64(&self, i: usize) -> Vec<Option<f64>> {
        let mut out = Vec::with_capacity(self.len());
        for a in self.column(i, &DataType::Float64) {
            let a = a.as_primitive::<Float64Type>();
            out.extend((0..a.len()).map(|j| a.is_valid(j).then(|| a.value(j))));
        }
        out
    }

    /// Column `i` as integers (timestamps as their nanoseconds).
    pub fn i64(&self, i: usize) -> Vec<Option<i64>> {
        let mut out = Vec::with_capacity(self.len());
        for a in self.column(i, &DataType::Int64) {
            let a = a.as_primitive::<Int64Type>();
            out.extend((0..a.len()).map(|j| a.is_valid(j).then(|| a.value(j))));
        }
        out
    }
}

/// A step of at least one millisecond, as whole nanoseconds, with a cap on how many steps a
/// range may hold (`what` names the parameter).
pub fn steps(start: u64, end: u64, step: Duration, what: &str) -> Result<u64> {
    let step_ns = step.as_nanos() as u64;
    let n = end.saturating_sub(start).div_ceil(step_ns.max(1));
    if n > 11_000 {
        return Err(invalid(format!(
            "{what}: {n} steps in the range; at most 11000 (make the step longer)"
        )));
    }
    Ok(step_ns)
}
