//! Functions that SQL clients expect of a PostgreSQL-speaking server: `version()`,
//! `current_setting(name)`, `current_database()`, `current_schema()`, `current_user`.

use std::sync::Arc;

use arrow::array::{Array, StringArray};
use arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{ColumnarValue, Volatility, create_udf};
use datafusion::prelude::SessionContext;
use weft_storage::model::TenantId;

/// The PostgreSQL version Weft presents itself as to clients that branch on it.
pub const PG_VERSION: &str = "16.4";
pub const PG_VERSION_NUM: &str = "160004";

pub fn version_string() -> String {
    format!(
        "PostgreSQL {PG_VERSION} (Weft {}, a trace database for LLM serving; SQL by Apache DataFusion) on x86_64-pc-linux-gnu, 64-bit",
        env!("CARGO_PKG_VERSION")
    )
}

/// The value of a run-time setting as `current_setting` and `SHOW` report it.
pub fn setting(name: &str) -> Option<&'static str> {
    Some(match name.to_ascii_lowercase().as_str() {
        "server_version" => PG_VERSION,
        "server_version_num" => PG_VERSION_NUM,
        "timezone" => "UTC",
        "datestyle" => "ISO, MDY",
        "intervalstyle" => "postgres",
        "client_encoding" | "server_encoding" => "UTF8",
        "standard_conforming_strings" => "on",
        "integer_datetimes" => "on",
        "search_path" => "public",
        "max_identifier_length" => "63",
        "is_superuser" => "off",
        "application_name" => "",
        "transaction_isolation" | "default_transaction_isolation" => "read committed",
        "transaction_read_only" | "default_transaction_read_only" => "on",
        "lc_collate" | "lc_ctype" => "C.UTF-8",
        "statement_timeout" | "lock_timeout" | "idle_in_transaction_session_timeout" => "0",
        "extra_float_digits" => "1",
        _ => return None,
    })
}

/// The database name a tenant is reached under.
pub fn database_name(tenant: &TenantId) -> String {
    if *tenant == TenantId::default_tenant() {
        "weft".to_owned()
    } else {
        tenant.as_str().to_owned()
    }
}

fn constant(name: &str, value: String) -> datafusion::logical_expr::ScalarUDF {
    create_udf(
        name,
        vec![],
        DataType::Utf8,
        Volatility::Stable,
        Arc::new(move |_args: &[ColumnarValue]| {
            Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(
                value.clone(),
            ))))
        }),
    )
}

/// The tenant's own functions (registered per query).
pub fn register_tenant(ctx: &SessionContext, tenant: &TenantId) {
    ctx.register_udf(constant("current_database", database_name(tenant)));
}

/// `matches(text, query)`: whether a text (a log body) matches a text query of the log
/// search language ([`crate::logs::text`]); only body terms, phrases, prefixes and their
/// `AND` / `OR` / `NOT` (field filters are columns in SQL: `WHERE class = …`).
fn matches_udf() -> datafusion::logical_expr::ScalarUDF {
    use crate::logs::text::{TextQuery, words};
    create_udf(
        "matches",
        vec![DataType::Utf8, DataType::Utf8],
        DataType::Boolean,
        Volatility::Immutable,
        Arc::new(|args: &[ColumnarValue]| {
            let query = match &args[1] {
                ColumnarValue::Scalar(
                    ScalarValue::Utf8(Some(q))
                    | ScalarValue::LargeUtf8(Some(q))
                    | ScalarValue::Utf8View(Some(q)),
                ) => q.clone(),
                _ => {
                    return Err(DataFusionError::Plan(
                        "matches(text, query): the query must be a text literal".into(),
                    ));
                }
            };
            let q = TextQuery::parse(&query)
                .map_err(|e| DataFusionError::Plan(format!("matches(): {e}")))?;
            if !q.body_only() {
                return Err(DataFusionError::Plan(
                    "matches(): field filters (class:, service:, …) are columns in SQL; use WHERE class = '…'".into(),
                ));
            }
            let test = |text: Option<&str>| text.map(|t| q.matches(&Default::default(), &words(t)));
            match &args[0] {
                ColumnarValue::Scalar(v) => {
                    let text = match v {
                        ScalarValue::Utf8(t)
                        | ScalarValue::LargeUtf8(t)
                        | ScalarValue::Utf8View(t) => t.clone(),
                        _ => None,
                    };
                    Ok(ColumnarValue::Scalar(ScalarValue::Boolean(test(
                        text.as_deref(),
                    ))))
                }
                ColumnarValue::Array(a) => {
                    let a = arrow::compute::cast(a, &DataType::Utf8)?;
                    let a = a.as_any().downcast_ref::<StringArray>().ok_or_else(|| {
                        DataFusionError::Internal("matches: expected text".into())
                    })?;
                    let out: arrow::array::BooleanArray = a.iter().map(test).collect();
                    Ok(ColumnarValue::Array(Arc::new(out)))
                }
            }
        }),
    )
}

/// The functions every session has (registered once, in the engine's template session).
pub fn register(ctx: &SessionContext) {
    ctx.register_udf(matches_udf());
    // replaces DataFusion's own, under the same names (see `percentile`)
    ctx.register_udaf(super::percentile::percentile_cont());
    ctx.register_udf(super::timebin::date_bin());
    ctx.register_udf(super::log2bucket::floor());
    ctx.register_udf(constant("version", version_string()));
    ctx.register_udf(constant("current_schema", "public".to_owned()));
    ctx.register_udf(constant("current_user", "weft".to_owned()));
    ctx.register_udf(constant("session_user", "weft".to_owned()));
    ctx.register_udf(create_udf(
        "current_setting",
        vec![DataType::Utf8],
        DataType::Utf8,
        Volatility::Stable,
        Arc::new(|args: &[ColumnarValue]| {
            let lookup = |name: &str| {
                setting(name).map(str::to_owned).ok_or_else(|| {
                    DataFusionError::Execution(format!(
                        "unrecognized configuration parameter \"{name}\""
                    ))
                })
            };
            match &args[0] {
                ColumnarValue::Scalar(v) => {
                    let name = match v {
                        ScalarValue::Utf8(Some(s))
                        | ScalarValue::LargeUtf8(Some(s))
                        | ScalarValue::Utf8View(Some(s)) => s.clone(),
                        _ => return Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None))),
                    };
                    Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(lookup(
                        &name,
                    )?))))
                }
                ColumnarValue::Array(a) => {
                    let a = arrow::compute::cast(a, &DataType::Utf8)?;
                    let a = a.as_any().downcast_ref::<StringArray>().ok_or_else(|| {
                        DataFusionError::Internal("current_setting: expected text".into())
                    })?;
                    let out = (0..a.len())
                        .map(|i| {
                            if a.is_null(i) {
                                Ok(None)
                            } else {
                                lookup(a.value(i)).map(Some)
                            }
                        })
                        .collect::<Result<StringArray, _>>()?;
                    Ok(ColumnarValue::Array(Arc::new(out)))
                }
            }
        }),
    ));
}
