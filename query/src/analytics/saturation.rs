//! Context-window saturation: request spans whose input tokens reach 80% and 95% of their
//! model's context window, by model and any dimensions (`by=`).
//! `GET /api/v1/saturation?by=llm.lora_adapter` and `saturation(…)`.
//!
//! A model's window is the configured one (`[context_windows]` in the TOML file: the exact
//! model name, else its longest configured prefix), else a default of the common families;
//! a model with neither is listed with `context_window` null and no counts over it.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::exec::Run;
use super::params::{Groups, Params, Result, dim_exprs, groups, lit};
use super::signals::REQUEST_SPANS;

pub const PARAMS: &[&str] = &["by"];

/// Context windows of common model families (tokens), by name prefix.
pub const DEFAULT_WINDOWS: &[(&str, u64)] = &[
    ("llama-3.1", 131_072),
    ("llama-3.2", 131_072),
    ("llama-3.3", 131_072),
    ("llama-3", 8_192),
    ("llama-2", 4_096),
    ("meta-llama/llama-3.1", 131_072),
    ("meta-llama/meta-llama-3.1", 131_072),
    ("qwen2.5", 32_768),
    ("qwen/qwen2.5", 32_768),
    ("qwen3", 32_768),
    ("mistral-7b", 32_768),
    ("mixtral", 32_768),
    ("gemma-2", 8_192),
    ("gemma-3", 131_072),
    ("phi-3-mini", 4_096),
    ("deepseek-v3", 131_072),
    ("deepseek-r1", 131_072),
    ("gpt-4o", 128_000),
    ("gpt-4.1", 1_047_576),
    ("claude", 200_000),
];

/// The context window of `model`: configured first, then the defaults; exact name, else the
/// longest prefix.
pub fn window_of(model: &str, configured: &BTreeMap<String, u64>) -> Option<u64> {
    let m = model.to_ascii_lowercase();
    let best = |pairs: &mut dyn Iterator<Item = (String, u64)>| {
        pairs
            .filter(|(k, _)| m.starts_with(k.as_str()))
            .max_by_key(|(k, _)| k.len())
            .map(|(_, v)| v)
    };
    best(&mut configured.iter().map(|(k, v)| (k.to_ascii_lowercase(), *v)))
        .or_else(|| best(&mut DEFAULT_WINDOWS.iter().map(|(k, v)| ((*k).to_owned(), *v))))
}

#[derive(Clone, Debug, PartialEq)]
pub struct SaturationRow {
    pub model: String,
    pub labels: Vec<Option<String>>,
    pub context_window: Option<u64>,
    pub requests: u64,
    pub at_80: u64,
    pub at_95: u64,
    pub max_input_tokens: i64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Saturation {
    pub dims: Vec<String>,
    pub rows: Vec<SaturationRow>,
    pub partial: bool,
}

pub async fn saturation(
    run: &mut Run<'_>,
    mut p: Params,
    windows: &BTreeMap<String, u64>,
) -> Result<Saturation> {
    let dims = p.list_or("by", &[]);
    run.fit_rows(&mut p).await?;
    let filter = p.where_clause(&[
        format!("({REQUEST_SPANS})"),
        "\"gen_ai.usage.input_tokens\" IS NOT NULL".into(),
    ])?;
    let models = run
        .sql(&format!(
            "SELECT DISTINCT \"gen_ai.request.model\" FROM spans {filter}"
        ))
        .await?;
    let mut arms = String::new();
    for m in models.strings(0).into_iter().flatten() {
        if let Some(w) = window_of(&m, windows) {
            arms.push_str(&format!(" WHEN {} THEN {w}", lit(&m)));
        }
    }
    let window = if arms.is_empty() {
        "CAST(NULL AS BIGINT)".to_owned()
    } else {
        format!("CASE \"gen_ai.request.model\"{arms} END")
    };
    let Groups { select: cols, keys } = groups(&dim_exprs(&dims));
    let query = format!(
        "SELECT m{keys}, max(w), count(*), \
         sum(CASE WHEN tokens >= 0.8 * w THEN 1 ELSE 0 END), \
         sum(CASE WHEN tokens >= 0.95 * w THEN 1 ELSE 0 END), max(tokens) \
         FROM (SELECT \"gen_ai.request.model\" AS m{cols}, {window} AS w, \
         CAST(\"gen_ai.usage.input_tokens\" AS BIGINT) AS tokens FROM spans {filter}) \
         GROUP BY m{keys} ORDER BY m{keys}"
    );
    let Some(rows) = run.sql_or_partial(&query).await? else {
        return Ok(Saturation {
            dims,
            rows: Vec::new(),
            partial: true,
        });
    };
    let k = dims.len();
    let model = rows.strings(0);
    let labels: Vec<Vec<Option<String>>> = (0..k).map(|i| rows.strings(1 + i)).collect();
    let (w, n, a80, a95, max) = (
        rows.i64(1 + k),
        rows.i64(2 + k),
        rows.i64(3 + k),
        rows.i64(4 + k),
        rows.i64(5 + k),
    );
    let out = (0..rows.len())
        .map(|i| SaturationRow {
            model: model[i].clone().unwrap_or_default(),
            labels: labels.iter().map(|c| c[i].clone()).collect(),
            context_window: w[i].map(|w| w as u64),
            requests: n[i].unwrap_or(0) as u64,
            at_80: a80[i].unwrap_or(0) as u64,
            at_95: a95[i].unwrap_or(0) as u64,
            max_input_tokens: max[i].unwrap_or(0),
        })
        .collect();
    Ok(Saturation {
        dims,
        rows: out,
        partial: run.partial,
    })
}

impl Saturation {
    pub fn to_json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                let mut m = serde_json::Map::new();
                m.insert("model".into(), json!(r.model));
                for (d, v) in self.dims.iter().zip(&r.labels) {
                    m.insert(d.clone(), json!(v));
                }
                m.insert("context_window".into(), json!(r.context_window));
                m.insert("requests".into(), json!(r.requests));
                m.insert("at_80".into(), json!(r.at_80));
                m.insert("at_95".into(), json!(r.at_95));
                m.insert("max_input_tokens".into(), json!(r.max_input_tokens));
                Value::Object(m)
            })
            .collect();
        json!({"rows": rows, "partial": self.partial})
    }
}
