//! OTLP names as Prometheus shows them, as Prometheus's own OTLP translation does by default
//! (`UnderscoreEscapingWithSuffixes`): characters outside `[a-zA-Z0-9:]` become `_` (runs
//! collapsed), the unit becomes a suffix (`By` → `_bytes`, `s` → `_seconds`, `By/s` →
//! `_bytes_per_second`; annotations in braces such as `{request}` are dropped), a monotonic
//! sum gets `_total`, a gauge of unit `1` gets `_ratio`. Label keys: invalid characters become
//! `_` (runs collapsed), a leading digit gets `key_`.

use weft_storage::model::{MetricKind, Series};

fn unit_name(unit: &str) -> &str {
    match unit {
        "d" => "days",
        "h" => "hours",
        "min" => "minutes",
        "s" => "seconds",
        "ms" => "milliseconds",
        "us" => "microseconds",
        "ns" => "nanoseconds",
        "By" => "bytes",
        "KiBy" => "kibibytes",
        "MiBy" => "mebibytes",
        "GiBy" => "gibibytes",
        "TiBy" => "tibibytes",
        "KBy" => "kilobytes",
        "MBy" => "megabytes",
        "GBy" => "gigabytes",
        "TBy" => "terabytes",
        "m" => "meters",
        "V" => "volts",
        "A" => "amperes",
        "J" => "joules",
        "W" => "watts",
        "g" => "grams",
        "Cel" => "celsius",
        "Hz" => "hertz",
        "1" => "",
        "%" => "percent",
        other => other,
    }
}

fn per_unit_name(unit: &str) -> &str {
    match unit {
        "s" => "second",
        "m" => "minute",
        "h" => "hour",
        "d" => "day",
        "w" => "week",
        "mo" => "month",
        "y" => "year",
        other => other,
    }
}

fn valid_metric_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == ':'
}

/// Words of a name: runs of valid characters (so `_` and every invalid character split).
fn tokens(name: &str) -> Vec<String> {
    name.split(|c: char| !valid_metric_char(c))
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A unit part with invalid characters as `_`, runs collapsed, no leading `_`.
fn clean_unit(unit: &str) -> String {
    let mapped: String = unit
        .chars()
        .map(|c| if valid_metric_char(c) { c } else { '_' })
        .collect();
    let mut out = String::with_capacity(mapped.len());
    for c in mapped.chars() {
        if c == '_' && out.ends_with('_') {
            continue;
        }
        out.push(c);
    }
    out.trim_start_matches('_').to_owned()
}

/// The main and per-unit suffixes of a unit (`By/s` → (`bytes`, `per_second`)).
fn unit_suffixes(unit: &str) -> (String, String) {
    let mut parts = unit.splitn(2, '/');
    let main = parts.next().unwrap_or("").trim();
    let main = match main.is_empty() || main.contains(['{', '}']) {
        true => String::new(),
        false => unit_name(main).to_owned(),
    };
    let per = match parts.next().map(str::trim) {
        Some(p) if !p.is_empty() && !p.contains(['{', '}']) => format!("per_{}", per_unit_name(p)),
        _ => String::new(),
    };
    (main, per)
}

/// The Prometheus name of a series' metric (without `_bucket`, `_count`, `_sum`).
pub fn metric_name(name: &str, unit: &str, kind: MetricKind, monotonic: bool) -> String {
    let mut words = tokens(name);
    let (main, per) = unit_suffixes(unit);
    let mut main = clean_unit(&main);
    let mut per = clean_unit(&per);
    if words.contains(&main) {
        main.clear();
    }
    if per == "per_" {
        per.clear();
    } else {
        per = per.trim_end_matches('_').to_owned();
        if words.contains(&per) {
            per.clear();
        }
    }
    if !per.is_empty() {
        main = main.trim_end_matches('_').to_owned();
    }
    if !main.is_empty() {
        words.push(main);
    }
    if !per.is_empty() {
        words.push(per);
    }
    if kind == MetricKind::Sum && monotonic {
        words.retain(|w| w != "total");
        words.push("total".to_owned());
    }
    if unit == "1" && kind == MetricKind::Gauge {
        words.retain(|w| w != "ratio");
        words.push("ratio".to_owned());
    }
    let out = words.join("_");
    match out.chars().next() {
        Some(c) if c.is_ascii_digit() => format!("_{out}"),
        _ => out,
    }
}

/// The Prometheus name of a series.
pub fn series_name(s: &Series) -> String {
    metric_name(&s.name, &s.unit, s.kind, s.monotonic)
}

/// A unit as Prometheus's metadata shows it (`By` → `bytes`, `By/s` → `bytes_per_second`).
pub fn unit_suffix(unit: &str) -> String {
    let (main, per) = unit_suffixes(unit);
    let (main, per) = (clean_unit(&main), clean_unit(&per));
    let joined = match (main.is_empty(), per.is_empty()) {
        (false, false) => format!("{main}_{per}"),
        (false, true) => main,
        _ => per,
    };
    joined.trim_matches('_').to_owned()
}

/// A label key as Prometheus shows it.
pub fn label_name(key: &str) -> String {
    if key.starts_with("__") && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return key.to_owned();
    }
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '_' {
            c
        } else {
            '_'
        };
        if c == '_' && out.ends_with('_') {
            continue;
        }
        out.push(c);
    }
    match out.chars().next() {
        Some(c) if c.is_ascii_digit() => format!("key_{out}"),
        _ => out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_otlp_translation() {
        let m = |n, u, k, mono| metric_name(n, u, k, mono);
        assert_eq!(
            m("gpu.memory.used", "By", MetricKind::Gauge, false),
            "gpu_memory_used_bytes"
        );
        assert_eq!(
            m(
                "http.server.request.duration",
                "s",
                MetricKind::Histogram,
                false
            ),
            "http_server_request_duration_seconds"
        );
        assert_eq!(
            m("vllm.requests", "{request}", MetricKind::Sum, true),
            "vllm_requests_total"
        );
        assert_eq!(
            m("requests.total", "1", MetricKind::Sum, true),
            "requests_total"
        );
        assert_eq!(
            m("gpu.utilization", "1", MetricKind::Gauge, false),
            "gpu_utilization_ratio"
        );
        assert_eq!(
            m("net.io", "By/s", MetricKind::Gauge, false),
            "net_io_bytes_per_second"
        );
        assert_eq!(
            m("vllm:kv_cache_usage_perc", "", MetricKind::Gauge, false),
            "vllm:kv_cache_usage_perc"
        );
        assert_eq!(
            m("DCGM_FI_DEV_GPU_UTIL", "", MetricKind::Gauge, false),
            "DCGM_FI_DEV_GPU_UTIL"
        );
        assert_eq!(m("2xx", "", MetricKind::Gauge, false), "_2xx");
        assert_eq!(
            m("latency_seconds", "s", MetricKind::Gauge, false),
            "latency_seconds"
        );
        assert_eq!(label_name("worker.id"), "worker_id");
        assert_eq!(label_name("gen_ai..model"), "gen_ai_model");
        assert_eq!(label_name("9lives"), "key_9lives");
        assert_eq!(label_name("__name__"), "__name__");
    }
}
