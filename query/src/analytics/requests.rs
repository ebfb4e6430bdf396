//! What the capabilities over request spans share when they answer from the blocks' request
//! tables (`weft_storage::requests`) instead of SQL: which parameters the tables can answer
//! (request dimensions for groups and `attr.` filters), and the table itself, read off the
//! runtime's threads under the call's time budget.

use weft_storage::requests::{NONE, RequestRollup};
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

/// Whether a tuple of the table passes the filters (the tuple's entries after the grouping
/// dimensions' hold the filters' slots, in order; see [`table`]).
pub fn passes(table: &RequestRollup, tuple: u32, dims: usize, filters: &[(usize, String)]) -> bool {
    let t = &table.tuples[tuple as usize];
    filters.iter().enumerate().all(|(i, (_, term))| {
        let v = t[dims + i];
        v != NONE && table.terms[v as usize] == *term
    })
}

/// The value of the `i`th grouping dimension in a tuple, if any.
pub fn value(table: &RequestRollup, tuple: u32, i: usize) -> Option<&str> {
    let v = table.tuples[tuple as usize][i];
    (v != NONE).then(|| table.terms[v as usize].as_str())
}

/// The request table over the call's range (`spans`: with span counts), its tuples holding
/// the values of the grouping slots `dims` then of the filters' slots. `Ok(None)` when the
/// tables cannot answer it (the caller asks SQL); a spent time budget marks the call partial
/// and answers an empty table.
pub async fn table(
    run: &mut Run<'_>,
    p: &Params,
    spans: bool,
    dims: &[usize],
    filters: &[(usize, String)],
) -> Result<Option<RequestTable>> {
    let store = run.engine.store().clone();
    let tenant = run.tenant.clone();
    let (start, end) = (p.start, p.end);
    let slots: Vec<usize> = dims
        .iter()
        .chain(filters.iter().map(|(s, _)| s))
        .copied()
        .collect();
    let work = tokio::task::spawn_blocking(move || {
        store.request_table(&tenant, start, end, spans, &slots)
    });
    match tokio::time::timeout(run.left(), work).await {
        Err(_) => {
            run.partial = true;
            Ok(Some(RequestTable::default()))
        }
        Ok(joined) => Ok(joined
            .map_err(|e| crate::sql::SqlError::internal(format!("request table: {e}")))?
            .map_err(|e| crate::sql::SqlError::internal(e.to_string()))?),
    }
}
