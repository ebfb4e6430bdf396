//! TraceQL, Tempo's query language, over Weft's spans: [`parse`] reads a query into its
//! [`ast`]; [`compile`] turns each spanset filter into the SQL predicate the `spans` table
//! selects rows by (so time bounds, postings and block pruning apply as in any SQL query);
//! [`eval`] combines the selected spans per trace (`&&`, `||`, `>`, `>>`, `<`, `<<`, `~`),
//! runs the pipeline (`count()`, `avg()`…, `by()`, `select()`, `coalesce()`) and summarises
//! the newest matching traces; [`metrics`] answers TraceQL metrics queries (`rate()`,
//! `quantile_over_time()`…) as series.

pub mod ast;
pub mod compile;
pub mod eval;
pub mod metrics;
pub mod parse;

pub use ast::Query;
pub use eval::{Found, SearchOptions, search};
pub use parse::parse;

use crate::analytics::AnalyticsError;
use crate::sql::SqlError;

#[derive(Debug, thiserror::Error)]
pub enum TraceQlError {
    /// The query is not TraceQL Weft understands; the message names the part.
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Sql(SqlError),
}

impl TraceQlError {
    pub(crate) fn at(pos: usize, msg: impl std::fmt::Display) -> Self {
        TraceQlError::Invalid(format!("TraceQL: {msg} (at character {})", pos + 1))
    }
}

impl From<AnalyticsError> for TraceQlError {
    fn from(e: AnalyticsError) -> Self {
        match e {
            AnalyticsError::Invalid(m) => TraceQlError::Invalid(m),
            AnalyticsError::Sql(e) => TraceQlError::Sql(e),
        }
    }
}

#[cfg(test)]
mod tests;
