//! Tag names and values for Grafana's TraceQL editor and search form:
//! `GET /api/v2/search/tags?scope=&start=&end=&limit=&q=` → `{"scopes": [{"name", "tags"}]}`,
//! `GET /api/v2/search/tag/{tag}/values?q=&start=&end=&limit=` → `{"tagValues": [{"type",
//! "value"}]}`, and the v1 forms (`{"tagNames": [...]}`, `{"tagValues": [...]}`).
//!
//! Names come from the newest spans of the range (a sample of [`SAMPLE`] spans: the dedicated
//! columns that have values, and the keys of the attribute maps); values are the most frequent
//! first. `q` (a TraceQL spanset filter) narrows the values to spans it matches.

use std::collections::BTreeSet;

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use serde_json::{Value, json};
use weft_query::analytics::exec::{Rows, Run};
use weft_query::analytics::params::{ident, ts};
use weft_query::traceql::ast::{Field, Intrinsic, Scope, Spanset};
use weft_query::traceql::compile::{column, needs_traces, predicate};
use weft_query::traceql::parse::field_of;
use weft_storage::schema::{ColumnType, DEDICATED};

use super::{TempoError, range};
use crate::state::{SharedState, Tenant};
use crate::traces::search::{Form, form_pairs};

/// Spans whose attribute keys make the tag list.
const SAMPLE: usize = 10_000;
const DEFAULT_LIMIT: usize = 1000;

struct Params {
    scope: Option<String>,
    q: Option<String>,
    start: Option<u64>,
    end: Option<u64>,
    limit: usize,
}

fn params(raw: Option<&str>) -> Result<Params, TempoError> {
    let form = Form::parse(raw).map_err(TempoError::bad)?;
    let get = |k: &str| form.get(k);
    let (start, end) = range(get("start"), get("end"), true)?;
    let limit = match get("limit")
        .or(get("maxTagsPerScope"))
        .or(get("maxTagValues"))
    {
        None => DEFAULT_LIMIT,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| TempoError::bad(format!("invalid limit {v:?}")))?,
    };
    let scope = get("scope").map(str::to_owned);
    if let Some(s) = &scope
        && !["span", "resource", "intrinsic", "none", "all"].contains(&s.as_str())
    {
        return Err(TempoError::bad(format!(
            "invalid scope {s:?}: expected span, resource, intrinsic or none"
        )));
    }
    Ok(Params {
        scope,
        q: get("q").map(str::to_owned),
        start,
        end,
        limit,
    })
}

fn range_conds(p: &Params) -> Vec<String> {
    let mut c = Vec::new();
    if let Some(s) = p.start {
        c.push(format!("s.start_time >= {}", ts(s)));
    }
    if let Some(e) = p.end {
        c.push(format!("s.start_time < {}", ts(e)));
    }
    c
}

/// The tag names of each scope.
async fn scopes(
    state: &SharedState,
    tenant: &weft_storage::model::TenantId,
    p: &Params,
) -> Result<Vec<(&'static str, Vec<String>)>, TempoError> {
    let run = Run::plain(&state.sql, tenant);
    let conds = range_conds(p);
    let filter = if conds.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conds.join(" AND "))
    };
    let sample = |cols: &str| {
        format!("SELECT {cols} FROM spans s{filter} ORDER BY s.start_time DESC LIMIT {SAMPLE}")
    };
    let keys = |rows: &Rows| -> Vec<String> {
        rows.strings(0)
            .into_iter()
            .flatten()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    let want = |s: &str| {
        p.scope
            .as_deref()
            .is_none_or(|x| x == s || x == "all" || x == "none")
    };
    let mut out = Vec::new();
    if want("resource") {
        let rows = run
            .sql(&format!(
                "SELECT DISTINCT unnest(map_keys(resource_attributes)) FROM ({})",
                sample("s.resource_attributes")
            ))
            .await?;
        let mut tags = keys(&rows);
        if !tags.iter().any(|t| t == "service.name") {
            tags.push("service.name".into());
        }
        tags.sort();
        tags.truncate(p.limit);
        out.push(("resource", tags));
    }
    if want("span") {
        let rows = run
            .sql(&format!(
                "SELECT DISTINCT unnest(map_keys(attributes)) FROM ({})",
                sample("s.attributes")
            ))
            .await?;
        let mut tags: BTreeSet<String> = keys(&rows).into_iter().collect();
        let counts: Vec<String> = DEDICATED
            .iter()
            .map(|d| format!("count(s.{})", ident(d.name)))
            .collect();
        let dedicated_cols: Vec<String> = DEDICATED
            .iter()
            .map(|d| format!("s.{}", ident(d.name)))
            .collect();
        let rows = run
            .sql(&format!(
                "SELECT {} FROM ({}) s",
                counts.join(", "),
                sample(&dedicated_cols.join(", "))
            ))
            .await?;
        for (i, d) in DEDICATED.iter().enumerate() {
            if rows.i64(i).first().copied().flatten().unwrap_or(0) > 0 {
                tags.insert(d.name.to_owned());
            }
        }
        out.push(("span", tags.into_iter().take(p.limit).collect()));
    }
    if want("intrinsic") {
        let mut tags: Vec<String> = Intrinsic::ALL
            .iter()
            .flat_map(|(_, names)| names.iter().map(|n| n.to_string()))
            .collect();
        tags.sort();
        out.push(("intrinsic", tags));
    }
    Ok(out)
}

pub async fn tags_v2(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, TempoError> {
    let p = params(raw.as_deref())?;
    let scopes = scopes(&state, &tenant, &p).await?;
    Ok(Json(json!({
        "scopes": scopes
            .into_iter()
            .map(|(name, tags)| json!({"name": name, "tags": tags}))
            .collect::<Vec<_>>(),
        "metrics": super::one_job(),
    })))
}

pub async fn tags_v1(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, TempoError> {
    let mut p = params(raw.as_deref())?;
    p.scope = p.scope.filter(|s| s != "intrinsic");
    let mut names: BTreeSet<String> = BTreeSet::new();
    for (scope, tags) in scopes(&state, &tenant, &p).await? {
        if scope != "intrinsic" {
            names.extend(tags);
        }
    }
    Ok(Json(json!({ "tagNames": names })))
}

/// A tag as Tempo's clients name it: scoped, unscoped (a v1 tag), or an intrinsic; percent-
/// decoded a second time when an older Grafana encoded it twice.
fn tag_field(tag: &str) -> Result<Field, TempoError> {
    let mut tag = tag.to_owned();
    if tag.contains('%')
        && let Ok(pairs) = form_pairs(&format!("t={tag}"))
        && let Some((_, v)) = pairs.into_iter().next()
    {
        tag = v;
    }
    field_of(&tag)
        .or_else(|_| field_of(&format!(".{tag}")))
        .map_err(|e| TempoError::bad(format!("invalid tag {tag:?}: {e}")))
}

/// The values of a tag, most frequent first, typed as Tempo types them.
async fn values(
    state: &SharedState,
    tenant: &weft_storage::model::TenantId,
    tag: &str,
    p: &Params,
) -> Result<Vec<(&'static str, String)>, TempoError> {
    let field = tag_field(tag)?;
    match &field {
        Field::Intrinsic(Intrinsic::Status) => {
            return Ok(["error", "ok", "unset"]
                .map(|v| ("keyword", v.to_owned()))
                .into());
        }
        Field::Intrinsic(Intrinsic::Kind) => {
            return Ok([
                "unspecified",
                "internal",
                "client",
                "server",
                "producer",
                "consumer",
            ]
            .map(|v| ("keyword", v.to_owned()))
            .into());
        }
        Field::Intrinsic(Intrinsic::Duration | Intrinsic::TraceDuration) => return Ok(vec![]),
        _ => {}
    }
    let Some(col) = column(&field) else {
        let (table, col) = match &field {
            Field::Intrinsic(Intrinsic::EventName) => ("span_events", "name"),
            _ => ("span_links", "linked_trace_id"),
        };
        let run = Run::plain(&state.sql, tenant);
        let rows = run
            .sql(&format!(
                "SELECT {col}, count(*) FROM {table} GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT {}",
                p.limit
            ))
            .await?;
        return Ok(rows
            .strings(0)
            .into_iter()
            .flatten()
            .map(|v| ("string", v))
            .collect());
    };
    let mut conds = range_conds(p);
    let mut join = false;
    // a query that narrows the values: only a spanset filter Weft can read (Grafana sends
    // the editor's text, often unfinished; anything else is ignored, as Tempo does)
    if let Some(q) = &p.q
        && let Ok(query) = weft_query::traceql::parse(q)
        && query.pipeline.stages.is_empty()
        && let Spanset::Filter(Some(e)) = &query.pipeline.source
    {
        join = needs_traces(e);
        conds.push(predicate(e));
    }
    if matches!(&field, Field::Intrinsic(i) if i.is_trace_level()) {
        join = true;
    }
    conds.push(format!("{} IS NOT NULL", col.sql));
    let sql = format!(
        "SELECT CAST({} AS VARCHAR), count(*) FROM spans s{} WHERE {} GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT {}",
        col.sql,
        if join {
            " JOIN traces t ON t.trace_id = s.trace_id"
        } else {
            ""
        },
        conds.join(" AND "),
        p.limit
    );
    let run = Run::plain(&state.sql, tenant);
    let rows = run.sql(&sql).await?;
    let ty = match (&field, col.ty) {
        (Field::Attr(Scope::Resource, _), _) => "string",
        (_, ColumnType::Int) => "int",
        (_, ColumnType::Double) => "float",
        (_, ColumnType::Bool) => "bool",
        _ => "string",
    };
    Ok(rows
        .strings(0)
        .into_iter()
        .flatten()
        .map(|v| (ty, v))
        .collect())
}

pub async fn values_v2(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    Path(tag): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, TempoError> {
    let p = params(raw.as_deref())?;
    let values = values(&state, &tenant, &tag, &p).await?;
    Ok(Json(json!({
        "tagValues": values
            .into_iter()
            .map(|(t, v)| json!({"type": t, "value": v}))
            .collect::<Vec<_>>(),
        "metrics": super::one_job(),
    })))
}

pub async fn values_v1(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    Path(tag): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, TempoError> {
    let p = params(raw.as_deref())?;
    let values = values(&state, &tenant, &tag, &p).await?;
    Ok(Json(json!({
        "tagValues": values.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
    })))
}
