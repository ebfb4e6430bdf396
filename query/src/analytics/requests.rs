//! What the capabilities over request spans share when they answer from the blocks' request
//! tables (`weft_storage::requests`) instead of SQL: which parameters the tables can answer
//! (request dimensions for groups and `attr.` filters), and the table itself, read off the
//! runtime's threads under the call's time budget.

use weft_storage::requests::{NONE, RequestRollup, RequestRow};
use weft_storage::schema::DEDICATED;
use weft_storage::store::RequestTable;

use super::exec::Run;
use super::params::{Params, Result};

/// The slot of a request dimension (by its name or alias) among the tables' tuples.
pub fn slot(dim: &str) -> Option<usize> {
    let col = DEDICATED
        .iter()
        .position(|d| d.indexed && (d.name == dim || d.alias == Some(dim)))?;
    weft_storage::request::request_dims()
        .iter()
        .position(|&c| c == col)
}

/// The `attr.` filters as (slot, term) when every one names a request dimension with a value
/// written as its term is (an integer as its digits); `None` otherwise.
pub fn attr_filters(p: &Params) -> Option<Vec<(usize, String)>> {
    p.attrs
        .iter()
        .map(|(k, v)| {
            let slot = slot(k)?;
            let col = weft_storage::request::request_dims()[slot];
            let term = match DEDICATED[col].ty {
                weft_storage::schema::ColumnType::Int => v.trim().parse::<i64>().ok()?.to_string(),
                _ => v.clone(),
            };
            Some((slot, term))
        })
        .collect()
}

/// A request table read for one call: its tuples hold the values of the grouping
/// dimensions, then of the `attr.` filters' slots.
pub struct Table {
    pub rollup: RequestRollup,
    /// How many grouping dimensions lead each tuple.
    dims: usize,
    filters: Vec<(usize, String)>,
}

impl Table {
    /// Whether a tuple passes the call's `attr.` filters.
    pub fn passes(&self, tuple: u32) -> bool {
        let t = &self.rollup.tuples[tuple as usize];
        self.filters.iter().enumerate().all(|(i, (_, term))| {
            let v = t[self.dims + i];
            v != NONE && self.rollup.terms[v as usize] == *term
        })
    }

    /// The value of the `i`th grouping dimension in a tuple, if any.
    pub fn value(&self, tuple: u32, i: usize) -> Option<&str> {
        let v = self.rollup.tuples[tuple as usize][i];
        (v != NONE).then(|| self.rollup.terms[v as usize].as_str())
    }

    /// The values of every grouping dimension in a tuple.
    pub fn key(&self, tuple: u32) -> Vec<Option<&str>> {
        (0..self.dims).map(|i| self.value(tuple, i)).collect()
    }
}

/// The request table over the call's range (`spans`: with span counts) grouped by `dims`,
/// with the request rows `keep` keeps.
/// `Ok(None)` when the tables cannot answer the call (the caller asks SQL): a dimension that
/// is not a request dimension, a `service` or `name` filter, an `attr.` filter on anything
/// but a request dimension, or a part the store declines. A spent time budget marks the call
/// partial and answers an empty table.
pub async fn table(
    run: &mut Run<'_>,
    p: &Params,
    spans: bool,
    dims: &[String],
    keep: impl Fn(&RequestRow) -> bool + Send + 'static,
) -> Result<Option<Table>> {
    let slots: Option<Vec<usize>> = dims.iter().map(|d| slot(d)).collect();
    let (Some(mut slots), Some(filters)) = (slots, attr_filters(p)) else {
        return Ok(None);
    };
    if p.service.is_some() || p.name.is_some() {
        return Ok(None);
    }
    slots.extend(filters.iter().map(|(s, _)| *s));
    let store = run.engine.store().clone();
    let tenant = run.tenant.clone();
    let (start, end) = (p.start, p.end);
    let read = run
        .blocking("request table", move || {
            store.request_table_of(&tenant, (start, end), spans, &slots, keep)
        })
        .await?
        .unwrap_or_else(|| Some(RequestTable::default()));
    Ok(read.map(|t| Table {
        rollup: t.rollup,
        dims: dims.len(),
        filters,
    }))
}
