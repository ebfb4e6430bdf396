//! The parameters every analytics capability takes, from an HTTP query string or from the
//! arguments of its SQL table function, and the span filter they make.
//!
//! Common: `start`, `end` (RFC 3339 or Unix ns), `service`, `name`, `attr.KEY=VALUE`
//! (repeatable: a span matches when it, or the request it belongs to, carries the value),
//! and the budgets `max_rows_scanned` and `timeout`. Each capability names the other keys it
//! takes; any other key is refused with the list of those it knows.

use std::time::Duration;

use weft_storage::schema::{ColumnType, DEDICATED};

use crate::time::{parse_duration, parse_time};

/// What went wrong in an analytics call.
#[derive(Debug, Clone, PartialEq)]
pub enum AnalyticsError {
    /// A parameter the caller can fix; the message names it.
    Invalid(String),
    /// The SQL the capability runs failed.
    Sql(crate::sql::SqlError),
}

impl std::fmt::Display for AnalyticsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Invalid(m) => f.write_str(m),
            Self::Sql(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for AnalyticsError {}

impl From<crate::sql::SqlError> for AnalyticsError {
    fn from(e: crate::sql::SqlError) -> Self {
        Self::Sql(e)
    }
}

pub type Result<T> = std::result::Result<T, AnalyticsError>;

pub fn invalid(m: impl Into<String>) -> AnalyticsError {
    AnalyticsError::Invalid(m.into())
}

/// The keys every capability takes.
pub const COMMON: &[&str] = &[
    "start",
    "end",
    "service",
    "name",
    "attr.KEY",
    "max_rows_scanned",
    "timeout",
];

/// Parsed parameters: the common ones typed, the capability's own kept as text.
#[derive(Clone, Debug, Default)]
pub struct Params {
    pub start: Option<u64>,
    pub end: Option<u64>,
    pub service: Option<String>,
    pub name: Option<String>,
    /// `attr.KEY=VALUE` pairs, in the order given.
    pub attrs: Vec<(String, String)>,
    /// Stop (and say `partial`) rather than read more rows than this.
    pub max_rows_scanned: Option<u64>,
    /// Stop (and say `partial`) rather than run longer than this.
    pub timeout: Option<Duration>,
    own: Vec<(String, String)>,
}

impl Params {
    /// Reads `(key, value)` pairs; `own` are the keys of the capability beside [`COMMON`].
    pub fn parse(pairs: impl IntoIterator<Item = (String, String)>, own: &[&str]) -> Result<Self> {
        let mut p = Params::default();
        for (key, value) in pairs {
            let time = || parse_time(&value).map_err(|e| invalid(format!("{key}: {e}")));
            match key.as_str() {
                "start" => p.start = Some(time()?),
                "end" => p.end = Some(time()?),
                "service" => p.service = Some(value),
                "name" => p.name = Some(value),
                "max_rows_scanned" => {
                    p.max_rows_scanned = Some(value.trim().parse().map_err(|_| {
                        invalid(format!("max_rows_scanned: {value:?} is not a row count"))
                    })?)
                }
                "timeout" => {
                    p.timeout =
                        Some(parse_duration(&value).map_err(|e| invalid(format!("timeout: {e}")))?)
                }
                k if k.starts_with("attr.") && k.len() > 5 => {
                    p.attrs.push((k[5..].to_owned(), value));
                }
                k if own.contains(&k) => {
                    if p.own.iter().any(|(o, _)| o == k) {
                        return Err(invalid(format!("{k}: given twice")));
                    }
                    p.own.push((key, value));
                }
                k => {
                    let mut known: Vec<&str> = COMMON.to_vec();
                    known.extend_from_slice(own);
                    return Err(invalid(format!(
                        "{k}: unknown parameter (known: {})",
                        known.join(", ")
                    )));
                }
            }
        }
        if let (Some(s), Some(e)) = (p.start, p.end)
            && e <= s
        {
            return Err(invalid("end: must be after start"));
        }
        Ok(p)
    }

    /// The capability's own parameter `key`, as given.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.own
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A duration parameter (`10s`, `1m`), at least one millisecond.
    pub fn duration(&self, key: &str) -> Result<Option<Duration>> {
        self.get(key)
            .map(|v| {
                let d = parse_duration(v).map_err(|e| invalid(format!("{key}: {e}")))?;
                if d < Duration::from_millis(1) {
                    return Err(invalid(format!("{key}: must be at least 1ms")));
                }
                Ok(d)
            })
            .transpose()
    }

    /// A number parameter.
    pub fn number(&self, key: &str) -> Result<Option<f64>> {
        self.get(key)
            .map(|v| {
                v.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| invalid(format!("{key}: {v:?} is not a number")))
            })
            .transpose()
    }

    /// A comma-separated list parameter (empty items dropped).
    pub fn list(&self, key: &str) -> Option<Vec<String>> {
        self.get(key).map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
    }

    /// A comma-separated list parameter, or `default` when not given.
    pub fn list_or(&self, key: &str, default: &[&str]) -> Vec<String> {
        self.list(key)
            .unwrap_or_else(|| default.iter().map(|d| (*d).to_owned()).collect())
    }

    /// A boolean parameter (`true`, `false`, `1`, `0`).
    pub fn flag(&self, key: &str) -> Result<bool> {
        match self.get(key).map(str::trim) {
            None | Some("false" | "0") => Ok(false),
            Some("true" | "1" | "") => Ok(true),
            Some(v) => Err(invalid(format!("{key}: {v:?} is not true or false"))),
        }
    }
}

/// Grouping columns over SQL expressions: `select` adds `, EXPR AS gN` to a projection,
/// `keys` adds `, gN` to a projection or a `GROUP BY` over it.
pub struct Groups {
    pub select: String,
    pub keys: String,
}

pub fn groups(exprs: &[String]) -> Groups {
    Groups {
        select: exprs
            .iter()
            .enumerate()
            .map(|(i, e)| format!(", {e} AS g{i}"))
            .collect(),
        keys: (0..exprs.len()).map(|i| format!(", g{i}")).collect(),
    }
}

/// The SQL of each dimension ([`dim_expr`]).
pub fn dim_exprs(dims: &[String]) -> Vec<String> {
    dims.iter().map(|d| dim_expr(d)).collect()
}

/// A string as an SQL literal.
pub fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A name as an SQL identifier.
pub fn ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// A Unix-ns time as an SQL timestamp literal.
pub fn ts(nanos: u64) -> String {
    lit(&crate::time::format_rfc3339(nanos))
}

/// The type of dedicated column `key` when it is an indexed request dimension.
pub fn request_dim(key: &str) -> Option<ColumnType> {
    DEDICATED
        .iter()
        .find(|d| d.indexed && (d.name == key || d.alias == Some(key)))
        .map(|d| d.ty)
}

/// A value of a column of type `ty` as an SQL literal, or an error naming `what`.
fn typed(ty: ColumnType, value: &str, what: &str) -> Result<String> {
    match ty {
        ColumnType::Int => value
            .trim()
            .parse::<i64>()
            .map(|n| n.to_string())
            .map_err(|_| invalid(format!("{what}: {value:?} is not an integer"))),
        ColumnType::Double => value
            .trim()
            .parse::<f64>()
            .map(|n| format!("{n:?}"))
            .map_err(|_| invalid(format!("{what}: {value:?} is not a number"))),
        _ => Ok(lit(value)),
    }
}

/// How a dimension (an attribute key, or `service`) reads in SQL for every span of a request:
/// the request column of an indexed LLM dimension (the span's or its nearest ancestor's
/// value), `service_name`, `name`, else the span's own attribute.
pub fn dim_expr(key: &str) -> String {
    match key {
        "service" | "service.name" | "service_name" => "service_name".into(),
        "name" | "span.name" => "name".into(),
        k if request_dim(k).is_some() => {
            let d = DEDICATED
                .iter()
                .find(|d| d.name == k || d.alias == Some(k))
                .map_or(k, |d| d.name);
            ident(&format!("request.{d}"))
        }
        k => format!("attributes[{}]", lit(k)),
    }
}

/// Whether a dimension is known on every span of a request (no per-span attribute lookup).
pub fn inherited(key: &str) -> bool {
    matches!(
        key,
        "service" | "service.name" | "service_name" | "name" | "span.name"
    ) || request_dim(key).is_some()
}

impl Params {
    /// The time range's SQL condition on `column` (empty when open).
    pub fn time_condition(&self, column: &str) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(s) = self.start {
            out.push(format!("{column} >= {}", ts(s)));
        }
        if let Some(e) = self.end {
            out.push(format!("{column} < {}", ts(e)));
        }
        out
    }

    /// The SQL conditions on `spans` the common parameters make (AND-ed by the caller). An
    /// `attr.KEY` of an indexed LLM dimension compares its request column (the span's or its
    /// nearest ancestor's value, from the postings); any other key matches the spans of the
    /// traces in which some span carries it.
    pub fn span_conditions(&self) -> Result<Vec<String>> {
        let mut out = self.time_condition("start_time");
        if let Some(s) = &self.service {
            out.push(format!("service_name = {}", lit(s)));
        }
        if let Some(n) = &self.name {
            out.push(format!("name = {}", lit(n)));
        }
        out.extend(self.attr_conditions()?);
        Ok(out)
    }

    /// The `attr.KEY` conditions alone.
    pub fn attr_conditions(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for (key, value) in &self.attrs {
            let what = format!("attr.{key}");
            if let Some(ty) = request_dim(key) {
                out.push(format!("{} = {}", dim_expr(key), typed(ty, value, &what)?));
            } else if matches!(key.as_str(), "service.name" | "service") {
                out.push(format!("service_name = {}", lit(value)));
            } else {
                let mut inner = self.time_condition("start_time");
                inner.push(format!("attributes[{}] = {}", lit(key), lit(value)));
                out.push(format!(
                    "trace_id IN (SELECT trace_id FROM spans WHERE {})",
                    inner.join(" AND ")
                ));
            }
        }
        Ok(out)
    }

    /// `WHERE …` of the common parameters and `extra` conditions (empty when none).
    pub fn where_clause(&self, extra: &[String]) -> Result<String> {
        let mut all = self.span_conditions()?;
        all.extend(extra.iter().cloned());
        Ok(if all.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", all.join(" AND "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn common_parameters_make_conditions() {
        let p = Params::parse(
            pairs(&[
                ("start", "2025-11-30T00:00:00Z"),
                ("service", "o'brien"),
                ("attr.llm.model_version", "v1"),
                ("attr.llm.batch_size", "8"),
                ("attr.tenant.id", "acme"),
                ("step", "10s"),
            ]),
            &["step"],
        )
        .unwrap();
        let c = p.span_conditions().unwrap();
        assert_eq!(c[0], "start_time >= '2025-11-30T00:00:00.000000000Z'");
        assert_eq!(c[1], "service_name = 'o''brien'");
        assert_eq!(c[2], "\"request.llm.model_version\" = 'v1'");
        assert_eq!(c[3], "\"request.llm.batch_size\" = 8");
        assert!(c[4].starts_with("trace_id IN (SELECT trace_id FROM spans WHERE start_time"));
        assert!(c[4].ends_with("attributes['tenant.id'] = 'acme')"));
        assert_eq!(p.duration("step").unwrap(), Some(Duration::from_secs(10)));
    }

    #[test]
    fn bad_parameters_are_named() {
        let e = Params::parse(pairs(&[("stp", "10s")]), &["step"]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("stp: unknown parameter (known: start"),
            "{e}"
        );
        assert!(e.to_string().contains("step"), "{e}");
        let e = Params::parse(pairs(&[("start", "soon")]), &[]).unwrap_err();
        assert!(e.to_string().starts_with("start: "), "{e}");
        let p = Params::parse(pairs(&[("attr.llm.batch_size", "big")]), &[]).unwrap();
        let e = p.span_conditions().unwrap_err();
        assert_eq!(
            e.to_string(),
            "attr.llm.batch_size: \"big\" is not an integer"
        );
        let e = Params::parse(
            pairs(&[
                ("start", "2025-11-30T01:00:00Z"),
                ("end", "2025-11-30T00:00:00Z"),
            ]),
            &[],
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "end: must be after start");
    }
}
