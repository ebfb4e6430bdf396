//! `GET /api/v1/search`: traces having a span that matches every filter, newest first.
//!
//! Parameters: `service`, `name`, `attr.KEY=VALUE` (repeatable), `min_duration` /
//! `max_duration` (`250ms`, `2s`), `start` / `end` (RFC 3339 or Unix nanoseconds),
//! `limit` (1 to 1000, default 20), `cursor` (the `next_cursor` of the previous page).

use axum::Json;
use axum::extract::{RawQuery, State};
use serde_json::{Value, json};
use weft_query::search::Cursor;
use weft_query::{SearchRequest, search as run_search};

use crate::error::ApiError;
use crate::state::{SharedState, Tenant, blocking};
use crate::time::{format_rfc3339, parse_duration, parse_time};

const MAX_LIMIT: usize = 1000;

pub(crate) fn bad(param: &str, detail: impl std::fmt::Display) -> ApiError {
    ApiError::BadRequest(format!("{param}: {detail}"))
}

/// A page size: 1 to [`MAX_LIMIT`].
pub(crate) fn parse_limit(key: &str, value: &str) -> Result<usize, ApiError> {
    let n: usize = value
        .parse()
        .map_err(|_| bad(key, format!("{value:?} is not a number")))?;
    if n == 0 || n > MAX_LIMIT {
        return Err(bad(key, format!("must be between 1 and {MAX_LIMIT}")));
    }
    Ok(n)
}

pub fn parse_request(query: &str) -> Result<SearchRequest, ApiError> {
    let mut req = SearchRequest {
        limit: 20,
        ..Default::default()
    };
    for (key, value) in form_pairs(query)? {
        match key.as_str() {
            "service" => req.service = Some(value),
            "name" => req.name = Some(value),
            "min_duration" => {
                req.min_duration_ns =
                    Some(parse_duration(&value).map_err(|e| bad(&key, e))?.as_nanos() as u64)
            }
            "max_duration" => {
                req.max_duration_ns =
                    Some(parse_duration(&value).map_err(|e| bad(&key, e))?.as_nanos() as u64)
            }
            "start" => req.start = Some(parse_time(&value).map_err(|e| bad(&key, e))?),
            "end" => req.end = Some(parse_time(&value).map_err(|e| bad(&key, e))?),
            "limit" => req.limit = parse_limit(&key, &value)?,
            "cursor" => req.cursor = Some(Cursor::decode(&value)?),
            k if k.starts_with("attr.") && k.len() > 5 => {
                req.attributes.push((k[5..].to_owned(), value))
            }
            k => {
                return Err(bad(
                    k,
                    "unknown parameter (use service, name, attr.KEY, min_duration, max_duration, start, end, limit, cursor)",
                ));
            }
        }
    }
    if let (Some(s), Some(e)) = (req.start, req.end)
        && e <= s
    {
        return Err(bad("end", "must be after start"));
    }
    Ok(req)
}

/// A query string's parameters, for surfaces that read each by name (Tempo, Jaeger, Loki): an
/// empty value counts as absent, as those APIs treat it.
pub(crate) struct Form(Vec<(String, String)>);

impl Form {
    /// Parses the query string; a bad percent-encoding is a message naming it.
    pub(crate) fn parse(raw: Option<&str>) -> Result<Self, String> {
        form_pairs(raw.unwrap_or(""))
            .map(Self)
            .map_err(|e| e.to_string())
    }

    /// The first non-empty value of `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }
}

/// `application/x-www-form-urlencoded` pairs, percent- and plus-decoded.
pub(crate) fn form_pairs(query: &str) -> Result<Vec<(String, String)>, ApiError> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((decode(k)?, decode(v)?))
        })
        .collect()
}

fn decode(s: &str) -> Result<String, ApiError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = s
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                out.push(hex.ok_or_else(|| {
                    ApiError::BadRequest(format!("bad percent-encoding in {s:?}"))
                })?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| ApiError::BadRequest(format!("{s:?} is not UTF-8")))
}

pub async fn search(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let req = parse_request(query.as_deref().unwrap_or(""))?;
    let store = state.store.clone();
    let page = blocking(move || run_search(&store, &tenant, &req)).await??;
    let traces: Vec<Value> = page
        .traces
        .iter()
        .map(|t| {
            json!({
                "trace_id": t.trace_id.to_hex(),
                "root_service": t.root_service,
                "root_name": t.root_name,
                "start_time": format_rfc3339(t.start_time),
                "start_time_unix_nano": t.start_time.to_string(),
                "duration_ns": t.duration_ns,
                "span_count": t.span_count,
                "error_count": t.error_count,
            })
        })
        .collect();
    Ok(Json(
        json!({ "traces": traces, "next_cursor": page.next_cursor }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_parameter() {
        let r = parse_request("service=inference-engine&name=llm.generate&attr.llm.model_version=v2%2B1&min_duration=250ms&max_duration=2s&start=2026-11-30T00:00:00Z&end=2026-12-01T01:00:00%2B01:00&limit=5").unwrap();
        assert_eq!(r.service.as_deref(), Some("inference-engine"));
        assert_eq!(
            r.attributes,
            vec![("llm.model_version".to_string(), "v2+1".to_string())]
        );
        assert_eq!(r.min_duration_ns, Some(250_000_000));
        assert_eq!(r.max_duration_ns, Some(2_000_000_000));
        assert_eq!(r.limit, 5);
    }

    #[test]
    fn bad_parameters_are_named() {
        for (q, param) in [
            ("limit=0", "limit"),
            ("min_duration=fast", "min_duration"),
            ("start=soon", "start"),
            ("color=red", "color"),
            ("cursor=zz", "cursor"),
        ] {
            let e = parse_request(q).unwrap_err().to_string();
            assert!(e.contains(param), "{q}: {e}");
        }
    }
}
