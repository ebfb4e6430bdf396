//! LLM analytics over the store: lineage graphs ([`lineage`]), heatmaps ([`heatmap`]),
//! percentiles ([`percentiles`]), anomaly scans with attribution ([`anomalies`]), drift
//! ([`drift`]), context-window saturation ([`saturation`]) and the context-leak scan
//! ([`leaks`]).
//!
//! Each capability takes the same parameters from an HTTP query string or from its SQL table
//! function's arguments ([`params`]), runs its scans as SQL over the tenant's tables (so
//! every index push-down, the request columns and the memory budget apply; only aggregates
//! such as sketch bins leave the scan) and answers one structure, which [`Answer::to_json`]
//! gives to the HTTP API and [`functions`] to SQL.

pub mod anomalies;
pub mod decode;
pub mod drift;
pub mod exec;
pub mod frame;
pub mod functions;
pub mod heatmap;
pub mod leaks;
pub mod lineage;
pub mod params;
pub mod percentiles;
pub mod requests;
pub mod saturation;
pub mod signals;
pub use weft_storage::sketch;

use serde_json::Value;
use weft_storage::model::TenantId;

pub use params::{AnalyticsError, Params};

use crate::sql::SqlEngine;

/// The capabilities, by the name of their HTTP path and SQL table function.
pub const CAPABILITIES: &[(&str, &[&str])] = &[
    ("lineage_operations", lineage::OPERATION_PARAMS),
    ("lineage_edges", lineage::OPERATION_PARAMS),
    ("lineage_request", lineage::REQUEST_PARAMS),
    ("lineage_dimensions", lineage::DIMENSION_PARAMS),
    ("heatmap", heatmap::PARAMS),
    ("percentiles", percentiles::PARAMS),
    ("anomalies", anomalies::PARAMS),
    ("drift", drift::PARAMS),
    ("saturation", saturation::PARAMS),
];

/// The parameters capability `name` takes beside the common ones.
pub fn own_params(name: &str) -> Option<&'static [&'static str]> {
    CAPABILITIES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, p)| *p)
}

/// What a capability answered.
pub enum Answer {
    Graph(lineage::Graph),
    Dimensions(lineage::Dimensions),
    Heatmap(heatmap::Heatmap),
    Percentiles(percentiles::Percentiles),
    Anomalies(anomalies::Anomalies),
    Drift(drift::Drift),
    Saturation(saturation::Saturation),
}

impl Answer {
    pub fn to_json(&self) -> Value {
        match self {
            Self::Graph(g) => g.to_json(),
            Self::Dimensions(d) => d.to_json(),
            Self::Heatmap(h) => h.to_json(),
            Self::Percentiles(p) => p.to_json(),
            Self::Anomalies(a) => a.to_json(),
            Self::Drift(d) => d.to_json(),
            Self::Saturation(s) => s.to_json(),
        }
    }
}

/// Parses `pairs` for capability `name` and runs it for `tenant`.
pub async fn answer(
    engine: &SqlEngine,
    tenant: &TenantId,
    name: &str,
    pairs: Vec<(String, String)>,
) -> Result<Answer, AnalyticsError> {
    let own = own_params(name)
        .ok_or_else(|| params::invalid(format!("{name}: no such analytics capability")))?;
    let p = Params::parse(pairs, own)?;
    run(engine, tenant, name, p).await
}

/// Runs capability `name` with parsed parameters.
pub async fn run(
    engine: &SqlEngine,
    tenant: &TenantId,
    name: &str,
    p: Params,
) -> Result<Answer, AnalyticsError> {
    let mut r = exec::Run::new(engine, tenant, &p);
    Ok(match name {
        "lineage_operations" | "lineage_edges" => {
            Answer::Graph(lineage::operations(&mut r, p).await?)
        }
        "lineage_request" => Answer::Graph(lineage::request(&mut r, p).await?),
        "lineage_dimensions" => Answer::Dimensions(lineage::dimensions(&mut r, p).await?),
        "heatmap" => Answer::Heatmap(heatmap::heatmap(&mut r, p).await?),
        "percentiles" => Answer::Percentiles(percentiles::percentiles(&mut r, p).await?),
        "anomalies" => {
            let store = engine.store().clone();
            Answer::Anomalies(anomalies::anomalies(&mut r, p, store).await?)
        }
        "drift" => Answer::Drift(drift::drift(&mut r, p).await?),
        "saturation" => {
            let windows = engine.config().context_windows.clone();
            Answer::Saturation(saturation::saturation(&mut r, p, &windows).await?)
        }
        n => {
            return Err(params::invalid(format!(
                "{n}: no such analytics capability"
            )));
        }
    })
}
