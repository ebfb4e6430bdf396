//! The metric signal's columns as a scan names them: [`MetricScan`](crate::store::MetricScan)
//! returns [`col`] columns; [`sources`] says which of them make each column of the `metrics`
//! table (the series' own columns, name, type, unit and labels, come from the series catalog).

pub use crate::block::metrics::col;

/// The stored columns a column of the `metrics` table is made from (none for the columns the
/// series catalog answers).
pub fn sources(name: &str) -> &'static [&'static str] {
    match name {
        "start_time" => &[col::START_TIME],
        "value" => &[col::VALUE],
        "count" => &[col::COUNT],
        "sum" => &[col::SUM],
        "min" => &[col::MIN],
        "max" => &[col::MAX],
        "bucket_bounds" => &[col::BOUNDS, col::DETAIL],
        "bucket_counts" => &[col::COUNTS, col::DETAIL],
        "quantiles" | "quantile_values" => &[col::DETAIL],
        "flags" => &[col::FLAGS],
        "exemplar_trace_id" | "exemplar_span_id" | "exemplar_value" => &[col::EXEMPLARS],
        _ => &[],
    }
}
