//! The Prometheus HTTP API under `/prometheus` on the query port, as Grafana's Prometheus data
//! source calls it (`http://host:3200/prometheus`): `query`, `query_range` (GET and form
//! POST), `labels`, `label/{name}/values`, `series`, `metadata`, `query_exemplars`,
//! `status/buildinfo`, with Prometheus's envelopes (`{"status":"success","data":…}`;
//! `{"status":"error","errorType":…,"error":…}` with 400 for bad data, 422 for execution
//! errors), values as strings and times as float seconds. The tenant is `X-Scope-OrgID`, as
//! on every surface.

use std::collections::{BTreeMap, BTreeSet};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use promql_parser::label::Matcher;
use promql_parser::parser::Expr;
use serde_json::{Map, Value, json};
use weft_query::promql::eval::selector_matchers;
use weft_query::promql::{
    ErrorKind, Labels, PromError, QueryResult, Source, instant_query, range_query,
};

use crate::state::{SharedState, Tenant, blocking};
use crate::traces::search::form_pairs;

pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/prometheus/api/v1/query", get(query).post(query))
        .route(
            "/prometheus/api/v1/query_range",
            get(query_range).post(query_range),
        )
        .route("/prometheus/api/v1/labels", get(labels).post(labels))
        .route("/prometheus/api/v1/label/{name}/values", get(label_values))
        .route("/prometheus/api/v1/series", get(series).post(series))
        .route("/prometheus/api/v1/metadata", get(metadata))
        .route(
            "/prometheus/api/v1/query_exemplars",
            get(exemplars).post(exemplars),
        )
        .route("/prometheus/api/v1/status/buildinfo", get(buildinfo))
}

/// What a handler answers: a JSON value, or JSON text already written (query results, whose
/// points are written straight into one buffer).
enum Data {
    Json(Value),
    Raw(String),
}

/// The answer of a handler: data in the success envelope, or an error in Prometheus's.
struct Answer(Result<Data, PromError>);

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let (status, body) = match self.0 {
            Ok(Data::Raw(data)) => {
                let mut body = String::with_capacity(data.len() + 32);
                body.push_str(r#"{"status":"success","data":"#);
                body.push_str(&data);
                body.push('}');
                return (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/json")],
                    body,
                )
                    .into_response();
            }
            Ok(Data::Json(data)) => (StatusCode::OK, json!({"status": "success", "data": data})),
            Err(e) => {
                let status = match e.kind {
                    ErrorKind::BadData => StatusCode::BAD_REQUEST,
                    ErrorKind::Execution => StatusCode::UNPROCESSABLE_ENTITY,
                    ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
                };
                (
                    status,
                    json!({"status": "error", "errorType": e.error_type(), "error": e.message}),
                )
            }
        };
        (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response()
    }
}

/// The parameters of a request: the query string and, for a form POST, the body.
struct Params(Vec<(String, String)>);

impl<S: Send + Sync> FromRequest<S> for Params {
    type Rejection = Answer;

    async fn from_request(req: Request, state: &S) -> Result<Self, Answer> {
        let query = req.uri().query().map(str::to_owned);
        let body = Bytes::from_request(req, state)
            .await
            .map_err(|e| Answer(Err(PromError::bad_data(e.to_string()))))?;
        Params::of(query, &body).map_err(|e| Answer(Err(e)))
    }
}

impl Params {
    fn of(query: Option<String>, body: &[u8]) -> Result<Self, PromError> {
        let bad = |e: crate::error::ApiError| PromError::bad_data(e.to_string());
        let mut pairs = form_pairs(query.as_deref().unwrap_or("")).map_err(bad)?;
        if !body.is_empty() {
            let text = std::str::from_utf8(body)
                .map_err(|_| PromError::bad_data("request body is not UTF-8"))?;
            pairs.extend(form_pairs(text).map_err(bad)?);
        }
        Ok(Self(pairs))
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn all(&self, key: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    fn time(&self, key: &str, default: i64) -> Result<i64, PromError> {
        match self.get(key) {
            None | Some("") => Ok(default),
            Some(v) => parse_time(v)
                .map_err(|e| PromError::bad_data(format!("invalid parameter \"{key}\": {e}"))),
        }
    }
}

fn now_ms() -> i64 {
    (crate::time::now() / 1_000_000) as i64
}

/// Prometheus's `time` parameter: Unix seconds (fractions allowed) or RFC 3339.
pub fn parse_time(v: &str) -> Result<i64, String> {
    if let Ok(secs) = v.parse::<f64>() {
        if !secs.is_finite() {
            return Err(format!("cannot parse {v:?} to a valid timestamp"));
        }
        return Ok((secs * 1000.0).round() as i64);
    }
    crate::time::parse_rfc3339(v)
        .map(|ns| (ns / 1_000_000) as i64)
        .ok_or_else(|| format!("cannot parse {v:?} to a valid timestamp"))
}

/// Prometheus's duration parameter: seconds (fractions allowed) or a duration such as `15s`,
/// `1m30s`, `1h` (Grafana sends `1m0s`); in milliseconds.
pub fn parse_duration(v: &str) -> Result<i64, String> {
    if let Ok(secs) = v.parse::<f64>() {
        if !secs.is_finite() || secs < 0.0 {
            return Err(format!("cannot parse {v:?} to a valid duration"));
        }
        return Ok((secs * 1000.0).round() as i64);
    }
    let mut total = 0i64;
    let mut rest = v;
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!("cannot parse {v:?} to a valid duration"));
        }
        let n: i64 = rest[..digits]
            .parse()
            .map_err(|_| format!("cannot parse {v:?} to a valid duration"))?;
        rest = &rest[digits..];
        let unit = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let ms = match &rest[..unit] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 7 * 86_400_000,
            "y" => 365 * 86_400_000,
            _ => return Err(format!("cannot parse {v:?} to a valid duration")),
        };
        total += n * ms;
        rest = &rest[unit..];
    }
    Ok(total)
}

/// Seconds as Prometheus writes a sample time: a number, fractional only when it must be.
fn seconds(ms: i64) -> Value {
    if ms % 1000 == 0 {
        json!(ms / 1000)
    } else {
        json!(ms as f64 / 1000.0)
    }
}

fn write_seconds(out: &mut String, ms: i64) {
    use std::fmt::Write;
    if ms % 1000 == 0 {
        push_int(out, ms / 1000);
    } else {
        let _ = write!(out, "{}", ms as f64 / 1000.0);
    }
}

/// An integer in decimal (what `{}` writes), without the formatting machinery: answers are
/// mostly integer timestamps and values.
fn push_int(out: &mut String, i: i64) {
    let mut digits = [0u8; 20];
    let mut n = i.unsigned_abs();
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if i < 0 {
        out.push('-');
    }
    out.extend(digits[at..].iter().map(|&d| d as char));
}

/// A sample value as Prometheus writes it.
fn number(v: f64) -> String {
    let mut out = String::new();
    write_number(&mut out, v);
    out
}

fn write_number(out: &mut String, v: f64) {
    use std::fmt::Write;
    if v.is_nan() {
        out.push_str("NaN");
    } else if v == f64::INFINITY {
        out.push_str("+Inf");
    } else if v == f64::NEG_INFINITY {
        out.push_str("-Inf");
    } else if v.fract() == 0.0 && v.abs() < 1e15 && !(v == 0.0 && v.is_sign_negative()) {
        push_int(out, v as i64);
    } else {
        let _ = write!(out, "{v}");
    }
}

fn write_string(out: &mut String, s: &str) {
    out.push_str(&serde_json::to_string(s).expect("a string serialises"));
}

fn labels_json(labels: &Labels) -> Value {
    Value::Object(
        labels
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect::<Map<_, _>>(),
    )
}

fn write_labels(out: &mut String, labels: &Labels) {
    out.push('{');
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(out, k);
        out.push(':');
        write_string(out, v);
    }
    out.push('}');
}

/// `[time, "value"]`.
fn write_point(out: &mut String, t: i64, v: f64) {
    out.push('[');
    write_seconds(out, t);
    out.push_str(",\"");
    write_number(out, v);
    out.push_str("\"]");
}

/// A query's result as the `data` member, written straight into one buffer.
fn result_json(r: QueryResult) -> Data {
    let mut out = String::new();
    match r {
        QueryResult::Scalar(t, v) => {
            out.push_str(r#"{"resultType":"scalar","result":"#);
            write_point(&mut out, t, v);
        }
        QueryResult::Str(t, s) => {
            out.push_str(r#"{"resultType":"string","result":["#);
            write_seconds(&mut out, t);
            out.push(',');
            write_string(&mut out, &s);
            out.push(']');
        }
        QueryResult::Vector(v) => {
            out.push_str(r#"{"resultType":"vector","result":["#);
            for (i, (l, t, v)) in v.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(r#"{"metric":"#);
                write_labels(&mut out, l);
                out.push_str(r#","value":"#);
                write_point(&mut out, *t, *v);
                out.push('}');
            }
            out.push(']');
        }
        QueryResult::Matrix(m) => {
            let points: usize = m.iter().map(|l| l.ts.len()).sum();
            out.reserve(points * 24 + m.len() * 128);
            out.push_str(r#"{"resultType":"matrix","result":["#);
            for (i, l) in m.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(r#"{"metric":"#);
                write_labels(&mut out, &l.labels);
                out.push_str(r#","values":["#);
                for (j, (t, v)) in l.ts.iter().zip(&l.vs).enumerate() {
                    if j > 0 {
                        out.push(',');
                    }
                    write_point(&mut out, *t, *v);
                }
                out.push_str("]}");
            }
            out.push(']');
        }
    }
    out.push('}');
    Data::Raw(out)
}

async fn run(
    state: SharedState,
    tenant: weft_storage::model::TenantId,
    work: impl FnOnce(&Source) -> Result<Value, PromError> + Send + 'static,
) -> Answer {
    run_data(state, tenant, move |s| work(s).map(Data::Json)).await
}

async fn run_data(
    state: SharedState,
    tenant: weft_storage::model::TenantId,
    work: impl FnOnce(&Source) -> Result<Data, PromError> + Send + 'static,
) -> Answer {
    let store = state.store.clone();
    let result = blocking(move || {
        let source = Source::new(store, tenant).map_err(|e| PromError::internal(e.to_string()))?;
        work(&source)
    })
    .await;
    Answer(result.unwrap_or_else(|e| Err(PromError::internal(e.to_string()))))
}

async fn query(State(state): State<SharedState>, Tenant(tenant): Tenant, params: Params) -> Answer {
    let Some(expr) = params.get("query").map(str::to_owned) else {
        return Answer(Err(PromError::bad_data(
            "invalid parameter \"query\": query is empty",
        )));
    };
    let time = match params.time("time", now_ms()) {
        Ok(t) => t,
        Err(e) => return Answer(Err(e)),
    };
    run_data(state, tenant, move |s| {
        instant_query(s, &expr, time).map(result_json)
    })
    .await
}

async fn query_range(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    params: Params,
) -> Answer {
    let parsed = (|| {
        let expr = params
            .get("query")
            .ok_or_else(|| PromError::bad_data("invalid parameter \"query\": query is empty"))?
            .to_owned();
        let need = |k: &str| {
            params
                .get(k)
                .ok_or_else(|| PromError::bad_data(format!("invalid parameter \"{k}\": missing")))
        };
        let start = parse_time(need("start")?)
            .map_err(|e| PromError::bad_data(format!("invalid parameter \"start\": {e}")))?;
        let end = parse_time(need("end")?)
            .map_err(|e| PromError::bad_data(format!("invalid parameter \"end\": {e}")))?;
        let step = parse_duration(need("step")?)
            .map_err(|e| PromError::bad_data(format!("invalid parameter \"step\": {e}")))?;
        Ok::<_, PromError>((expr, start, end, step))
    })();
    let (expr, start, end, step) = match parsed {
        Ok(p) => p,
        Err(e) => return Answer(Err(e)),
    };
    run_data(state, tenant, move |s| {
        range_query(s, &expr, start, end, step).map(result_json)
    })
    .await
}

/// The matchers of each `match[]` selector.
fn selectors(params: &Params) -> Result<Vec<Vec<Matcher>>, PromError> {
    params
        .all("match[]")
        .into_iter()
        .map(|m| match promql_parser::parser::parse(m) {
            Ok(Expr::VectorSelector(vs)) => Ok(selector_matchers(&vs)),
            Ok(_) => Err(PromError::bad_data(format!(
                "invalid parameter \"match[]\": {m:?} is not a series selector"
            ))),
            Err(e) => Err(PromError::bad_data(format!(
                "invalid parameter \"match[]\": {e}"
            ))),
        })
        .collect()
}

/// The label sets of the series the request's `match[]` selectors choose in its time range
/// (every series when it has none).
fn label_sets(source: &Source, params: &Params) -> Result<Vec<Labels>, PromError> {
    let matchers = selectors(params)?;
    let start = params.time("start", 0)?;
    let end = params.time("end", now_ms())?;
    if matchers.is_empty() {
        return source.all_label_sets(start, end);
    }
    let mut out = BTreeSet::new();
    for m in &matchers {
        let refs: Vec<&Matcher> = m.iter().collect();
        for l in source.select(&refs, start, end)? {
            out.insert(l.labels);
        }
    }
    Ok(out
        .into_iter()
        .map(std::sync::Arc::unwrap_or_clone)
        .collect())
}

fn limit(params: &Params) -> Result<Option<usize>, PromError> {
    match params.get("limit") {
        None | Some("") | Some("0") => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|_| PromError::bad_data(format!("invalid parameter \"limit\": {v:?}"))),
    }
}

async fn labels(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    params: Params,
) -> Answer {
    run(state, tenant, move |s| {
        let names: BTreeSet<String> = label_sets(s, &params)?
            .into_iter()
            .flat_map(|l| l.into_iter().map(|(k, _)| k))
            .collect();
        let mut names: Vec<String> = names.into_iter().collect();
        if let Some(n) = limit(&params)? {
            names.truncate(n);
        }
        Ok(json!(names))
    })
    .await
}

async fn label_values(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    Path(name): Path<String>,
    params: Params,
) -> Answer {
    // Prometheus 3 escapes a UTF-8 label name in the path as `U__` + hex escapes
    let name = unescape_label(&name);
    run(state, tenant, move |s| {
        let values: BTreeSet<String> = label_sets(s, &params)?
            .into_iter()
            .filter_map(|l| l.into_iter().find(|(k, _)| *k == name).map(|(_, v)| v))
            .collect();
        let mut values: Vec<String> = values.into_iter().collect();
        if let Some(n) = limit(&params)? {
            values.truncate(n);
        }
        Ok(json!(values))
    })
    .await
}

/// `U__worker_2e_id` → `worker.id` (Prometheus's value encoding of label names in paths).
fn unescape_label(name: &str) -> String {
    let Some(rest) = name.strip_prefix("U__") else {
        return name.to_owned();
    };
    let mut out = String::new();
    let mut chars = rest.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '_' {
            out.push(c);
            continue;
        }
        let hex: String = chars.by_ref().take_while(|c| *c != '_').collect();
        match u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32) {
            Some(decoded) if !hex.is_empty() => out.push(decoded),
            _ => out.push('_'),
        }
    }
    out
}

async fn series(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    params: Params,
) -> Answer {
    if params.all("match[]").is_empty() {
        return Answer(Err(PromError::bad_data("no match[] parameter provided")));
    }
    run(state, tenant, move |s| {
        let mut sets = label_sets(s, &params)?;
        if let Some(n) = limit(&params)? {
            sets.truncate(n);
        }
        Ok(Value::Array(sets.iter().map(labels_json).collect()))
    })
    .await
}

async fn metadata(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    params: Params,
) -> Answer {
    run(state, tenant, move |s| {
        let wanted = params.get("metric").map(str::to_owned);
        let mut out: BTreeMap<String, Value> = BTreeMap::new();
        for (name, (kind, help, unit)) in s.metadata() {
            if wanted.as_ref().is_some_and(|w| *w != name) {
                continue;
            }
            out.insert(name, json!([{"type": kind, "help": help, "unit": unit}]));
        }
        if let Some(n) = limit(&params)? {
            let keys: Vec<String> = out.keys().skip(n).cloned().collect();
            keys.iter().for_each(|k| {
                out.remove(k);
            });
        }
        Ok(json!(out))
    })
    .await
}

async fn exemplars(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    params: Params,
) -> Answer {
    run(state, tenant, move |s| {
        let query = params
            .get("query")
            .ok_or_else(|| PromError::bad_data("invalid parameter \"query\": query is empty"))?;
        let expr = promql_parser::parser::parse(query).map_err(PromError::bad_data)?;
        let start = params.time("start", 0)?;
        let end = params.time("end", now_ms())?;
        let mut out = Vec::new();
        for m in selectors_of(&expr) {
            let refs: Vec<&Matcher> = m.iter().collect();
            for (labels, found) in s.exemplars(&refs, start, end)? {
                let exemplars: Vec<Value> = found
                    .iter()
                    .filter(|(_, _, t)| (start..=end).contains(t))
                    .map(|(l, v, t)| {
                        json!({"labels": labels_json(l), "value": number(*v), "timestamp": seconds(*t)})
                    })
                    .collect();
                if !exemplars.is_empty() {
                    out.push(json!({"seriesLabels": labels_json(&labels), "exemplars": exemplars}));
                }
            }
        }
        Ok(Value::Array(out))
    })
    .await
}

/// The matchers of every selector of an expression.
fn selectors_of(e: &Expr) -> Vec<Vec<Matcher>> {
    let mut out = Vec::new();
    fn walk(e: &Expr, out: &mut Vec<Vec<Matcher>>) {
        match e {
            Expr::VectorSelector(vs) => out.push(selector_matchers(vs)),
            Expr::MatrixSelector(ms) => out.push(selector_matchers(&ms.vs)),
            Expr::Aggregate(a) => walk(&a.expr, out),
            Expr::Unary(u) => walk(&u.expr, out),
            Expr::Binary(b) => {
                walk(&b.lhs, out);
                walk(&b.rhs, out);
            }
            Expr::Paren(p) => walk(&p.expr, out),
            Expr::Subquery(s) => walk(&s.expr, out),
            Expr::Call(c) => c.args.args.iter().for_each(|a| walk(a, out)),
            _ => {}
        }
    }
    walk(e, &mut out);
    out
}

async fn buildinfo() -> Answer {
    Answer(Ok(Data::Json(json!({
        "version": "2.42.0",
        "revision": env!("CARGO_PKG_VERSION"),
        "branch": "weft",
        "buildUser": "weft",
        "buildDate": "",
        "goVersion": "none (weft, Rust)",
    }))))
}

#[cfg(test)]
mod tests;
