//! `weft-bench peers`: the same generator data in Weft, DuckDB and chDB (embedded ClickHouse),
//! the canonical queries on all three, answers checked against each other, times compared.
//!
//! Weft is queried over its HTTP SQL API (Arrow IPC results), the peers in-process through their
//! Python packages (`benches/peers/peers.py`), each query warmed once and then timed as the best
//! of several runs. Timestamps in answers are compared as Unix microseconds (DuckDB keeps
//! microseconds), floats with a relative tolerance of 1e-6.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use arrow::array::{Array, AsArray};
use arrow::datatypes::DataType;
use serde_json::{Value, json};

use crate::generator::{GenConfig, Generator, anomaly};

/// One canonical query in each engine's dialect.
pub struct PeerQuery {
    pub id: &'static str,
    pub what: &'static str,
    pub weft: String,
    pub duckdb: String,
    pub chdb: String,
    /// Whether row order is part of the answer.
    pub ordered: bool,
}

/// The parameters the queries are instantiated with, chosen from the data.
pub struct Params {
    pub trace: String,
    pub version: String,
    pub worker: String,
    pub adapter: String,
    pub t0: u64,
    pub mid: u64,
    pub t1: u64,
}

impl Params {
    /// A trace from the middle of the data, and the dimensions of a generate span of the slow
    /// version with the slow adapter; the window is the data's, in whole seconds.
    ///
    /// Two passes over the generator, holding one request at a time: at 20M spans the whole
    /// set as structures is about 12 GB, which the peers (loaded later in the same run) need.
    pub fn choose(cfg: &GenConfig) -> Self {
        let (mut n, mut first, mut last) = (0usize, None, cfg.start_ns);
        let mut g = Generator::new(cfg.clone());
        while let Some(r) = g.next_request() {
            n += 1;
            first.get_or_insert(r.start_ns);
            last = r.start_ns;
        }
        let first = first.unwrap_or(cfg.start_ns);
        let (mut version, mut worker, mut adapter) = (
            anomaly::SLOW_VERSION.to_owned(),
            "worker-0".to_owned(),
            anomaly::SLOW_ADAPTER.to_owned(),
        );
        let find = |s: &opentelemetry_proto::tonic::trace::v1::Span, key: &str| {
            s.attributes
                .iter()
                .find(|a| a.key == key)
                .and_then(|a| a.value.as_ref())
                .and_then(|v| match &v.value {
                    Some(
                        opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(x),
                    ) => Some(x.clone()),
                    _ => None,
                })
        };
        let mut middle = None;
        let mut found = false;
        let mut g = Generator::new(cfg.clone());
        let mut i = 0usize;
        while let Some(r) = g.next_request() {
            if i == n / 2 {
                middle = Some(r.trace_id);
            }
            if !found
                && i >= n / 3
                && let Some((_, s)) = r.spans.iter().find(|(_, s)| {
                    s.name == "llm.generate"
                        && find(s, "llm.lora_adapter").as_deref() == Some(anomaly::SLOW_ADAPTER)
                })
            {
                version = find(s, "llm.model_version").unwrap_or(version);
                worker = find(s, "worker.id").unwrap_or(worker);
                adapter = find(s, "llm.lora_adapter").unwrap_or(adapter);
                found = true;
            }
            if found && middle.is_some() {
                break;
            }
            i += 1;
        }
        let middle = middle.unwrap_or_default();
        let sec = 1_000_000_000;
        let t0 = first / sec * sec;
        let t1 = (last / sec + 60) * sec;
        let mid = (t0 + (last - first) / 2) / sec * sec;
        Self {
            trace: hex::encode(middle),
            version,
            worker,
            adapter,
            t0,
            mid,
            t1,
        }
    }
}

fn rfc3339(ns: u64) -> String {
    let t =
        chrono::DateTime::from_timestamp((ns / 1_000_000_000) as i64, (ns % 1_000_000_000) as u32)
            .unwrap_or_default();
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A whole-second timestamp literal in DuckDB's dialect.
pub fn duck_ts(ns: u64) -> String {
    let t = chrono::DateTime::from_timestamp((ns / 1_000_000_000) as i64, 0).unwrap_or_default();
    format!("TIMESTAMPTZ '{}'", t.format("%Y-%m-%d %H:%M:%S+00"))
}

/// A timestamp in ClickHouse's dialect.
pub fn ch_ts(ns: u64) -> String {
    format!("fromUnixTimestamp64Nano(toInt64({ns}), 'UTC')")
}

/// The canonical queries of the issue (Q7, log text, comes with the logs issue).
pub fn queries(p: &Params) -> Vec<PeerQuery> {
    let (w0, wm, w1) = (rfc3339(p.t0), rfc3339(p.mid), rfc3339(p.t1));
    let (d0, dm, d1) = (duck_ts(p.t0), duck_ts(p.mid), duck_ts(p.t1));
    let (c0, cm, c1) = (ch_ts(p.t0), ch_ts(p.mid), ch_ts(p.t1));
    let (trace, version, worker, adapter) = (&p.trace, &p.version, &p.worker, &p.adapter);
    // Q8 in three formulations: dimensions joined from the generate span, read from the
    // request columns (Weft only), and "slow" as over the range's p99 from a CTE
    #[derive(Clone, Copy, PartialEq)]
    enum Q8 {
        Join,
        Request,
        P99,
    }
    let q8 = |us: &str, t0: &str, t1: &str, q: char, form: Q8| {
        // share of each dimension value among slow decode spans vs all decode spans, by lift
        let dims = [
            ("llm.model_version", false),
            ("llm.lora_adapter", false),
            ("worker.id", false),
            ("llm.kv_cache_strategy", false),
            ("llm.batch_size", true),
        ];
        let cast = |c: &str, int: bool| {
            let col = match form {
                Q8::Request => format!("d.{q}request.{c}{q}"),
                _ => format!("g.{q}{c}{q}"),
            };
            if !int {
                col
            } else if us == "ch" {
                format!("toString({col})")
            } else {
                format!("CAST({col} AS VARCHAR)")
            }
        };
        let slow = match form {
            Q8::P99 => "d.duration_ns > (SELECT p99 FROM p)",
            _ => "d.duration_ns > 100000000",
        };
        let from = match form {
            Q8::Request => "d",
            _ => "g JOIN d ON g.trace_id = d.trace_id",
        };
        let arms: Vec<String> = dims
            .iter()
            .map(|(c, int)| {
                format!(
                    "SELECT '{c}' AS dimension, {} AS value, {slow} AS slow FROM {from}",
                    cast(c, *int)
                )
            })
            .collect();
        let d_cols = match form {
            Q8::Request => dims
                .iter()
                .map(|(c, _)| format!("{q}request.{c}{q}, "))
                .collect::<String>(),
            _ => String::new(),
        };
        let decode =
            format!("name = 'llm.decode.token' AND start_time >= {t0} AND start_time < {t1}");
        let p99 = match us {
            "ch" => "quantileExactInclusive(0.99)(duration_ns)",
            "duck" => "quantile_cont(duration_ns, 0.99)",
            _ => "percentile_cont(0.99) WITHIN GROUP (ORDER BY duration_ns)",
        };
        let p = match form {
            Q8::P99 => format!("p AS (SELECT {p99} AS p99 FROM spans WHERE {decode}), "),
            _ => String::new(),
        };
        format!(
            "WITH {p}g AS (SELECT trace_id, {q}llm.model_version{q}, {q}llm.lora_adapter{q}, {q}worker.id{q}, {q}llm.kv_cache_strategy{q}, {q}llm.batch_size{q} FROM spans WHERE name = 'llm.generate'), \
             d AS (SELECT trace_id, {d_cols}duration_ns FROM spans WHERE {decode}), \
             v AS ({}), \
             c AS (SELECT dimension, value, sum(CASE WHEN slow THEN 1 ELSE 0 END) AS slow_n, count(*) AS all_n FROM v GROUP BY dimension, value), \
             t AS (SELECT dimension, sum(slow_n) AS slow_t, sum(all_n) AS all_t FROM c GROUP BY dimension) \
             SELECT c.dimension, c.value, c.slow_n, c.all_n, round((c.slow_n * 1.0 / t.slow_t) / (c.all_n * 1.0 / t.all_t), 6) AS lift \
             FROM c JOIN t ON c.dimension = t.dimension WHERE t.slow_t > 0 ORDER BY lift DESC, c.dimension, c.value",
            arms.join(" UNION ALL ")
        )
    };
    let queries = vec![
        PeerQuery {
            id: "Q1",
            what: "all spans of one trace by id",
            weft: format!("SELECT span_id, name, CAST(start_time AS BIGINT) / 1000 AS start_us, duration_ns FROM spans WHERE trace_id = '{trace}' ORDER BY start_us, span_id"),
            duckdb: format!("SELECT span_id, name, epoch_us(start_time) AS start_us, duration_ns FROM spans WHERE trace_id = '{trace}' ORDER BY start_us, span_id"),
            chdb: format!("SELECT span_id, name, toUnixTimestamp64Micro(start_time) AS start_us, duration_ns FROM spans WHERE trace_id = '{trace}' ORDER BY start_us, span_id"),
            ordered: true,
        },
        PeerQuery {
            id: "Q2",
            what: "20 newest inference-engine spans of one model version over 2 s, first half",
            weft: format!("SELECT trace_id, CAST(start_time AS BIGINT) / 1000 AS start_us, duration_ns FROM spans WHERE service_name = 'inference-engine' AND \"llm.model_version\" = '{version}' AND duration_ns > 2000000000 AND start_time >= '{w0}' AND start_time < '{wm}' ORDER BY start_time DESC LIMIT 20"),
            duckdb: format!("SELECT trace_id, epoch_us(start_time) AS start_us, duration_ns FROM spans WHERE service_name = 'inference-engine' AND \"llm.model_version\" = '{version}' AND duration_ns > 2000000000 AND start_time >= {d0} AND start_time < {dm} ORDER BY start_time DESC LIMIT 20"),
            chdb: format!("SELECT trace_id, toUnixTimestamp64Micro(start_time) AS start_us, duration_ns FROM spans WHERE service_name = 'inference-engine' AND `llm.model_version` = '{version}' AND duration_ns > 2000000000 AND start_time >= {c0} AND start_time < {cm} ORDER BY start_time DESC LIMIT 20"),
            ordered: true,
        },
        PeerQuery {
            id: "Q3",
            what: "decode spans by (10 s bucket, floor(log2(latency us)))",
            weft: "SELECT CAST(date_bin(INTERVAL '10 seconds', start_time) AS BIGINT) / 1000 AS bucket_us, CAST(floor(log2(duration_ns / 1000.0)) AS BIGINT) AS lat, count(*) AS n FROM spans WHERE name = 'llm.decode.token' GROUP BY 1, 2 ORDER BY 1, 2".into(),
            duckdb: "SELECT epoch_us(time_bucket(INTERVAL '10 seconds', start_time)) AS bucket_us, CAST(floor(log2(duration_ns / 1000.0)) AS BIGINT) AS lat, count(*) AS n FROM spans WHERE name = 'llm.decode.token' GROUP BY 1, 2 ORDER BY 1, 2".into(),
            chdb: "SELECT intDiv(toUnixTimestamp64Micro(start_time), 10000000) * 10000000 AS bucket_us, toInt64(floor(log2(duration_ns / 1000.0))) AS lat, count() AS n FROM spans WHERE name = 'llm.decode.token' GROUP BY bucket_us, lat ORDER BY bucket_us, lat".into(),
            ordered: true,
        },
        PeerQuery {
            id: "Q4",
            what: "p50/p95/p99 of llm.prefill duration by model version per minute",
            weft: "SELECT CAST(date_trunc('minute', p.start_time) AS BIGINT) / 1000 AS minute_us, g.\"llm.model_version\" AS version, percentile_cont(0.5) WITHIN GROUP (ORDER BY p.duration_ns) AS p50, percentile_cont(0.95) WITHIN GROUP (ORDER BY p.duration_ns) AS p95, percentile_cont(0.99) WITHIN GROUP (ORDER BY p.duration_ns) AS p99 FROM spans p JOIN spans g ON p.trace_id = g.trace_id WHERE p.name = 'llm.prefill' AND g.name = 'llm.generate' GROUP BY 1, 2 ORDER BY 1, 2".into(),
            duckdb: "SELECT epoch_us(date_trunc('minute', p.start_time)) AS minute_us, g.\"llm.model_version\" AS version, quantile_cont(p.duration_ns, 0.5) AS p50, quantile_cont(p.duration_ns, 0.95) AS p95, quantile_cont(p.duration_ns, 0.99) AS p99 FROM spans p JOIN spans g ON p.trace_id = g.trace_id WHERE p.name = 'llm.prefill' AND g.name = 'llm.generate' GROUP BY 1, 2 ORDER BY 1, 2".into(),
            chdb: "SELECT toInt64(toUnixTimestamp(toStartOfMinute(p.start_time))) * 1000000 AS minute_us, g.`llm.model_version` AS version, quantileExactInclusive(0.5)(p.duration_ns) AS p50, quantileExactInclusive(0.95)(p.duration_ns) AS p95, quantileExactInclusive(0.99)(p.duration_ns) AS p99 FROM spans p JOIN spans g ON p.trace_id = g.trace_id WHERE p.name = 'llm.prefill' AND g.name = 'llm.generate' GROUP BY minute_us, version ORDER BY minute_us, version".into(),
            ordered: true,
        },
        PeerQuery {
            id: "Q5",
            what: "per service per minute: requests, errors, p99 duration",
            weft: "SELECT service_name, CAST(date_bin(INTERVAL '1 minute', start_time) AS BIGINT) / 1000 AS minute_us, count(*) AS requests, sum(CASE WHEN status_code = 'ERROR' THEN 1 ELSE 0 END) AS errors, percentile_cont(0.99) WITHIN GROUP (ORDER BY duration_ns) AS p99 FROM spans GROUP BY 1, 2 ORDER BY 1, 2".into(),
            duckdb: "SELECT service_name, epoch_us(date_trunc('minute', start_time)) AS minute_us, count(*) AS requests, sum(CASE WHEN status_code = 'ERROR' THEN 1 ELSE 0 END) AS errors, quantile_cont(duration_ns, 0.99) AS p99 FROM spans GROUP BY 1, 2 ORDER BY 1, 2".into(),
            chdb: "SELECT service_name, toInt64(toUnixTimestamp(toStartOfMinute(start_time))) * 1000000 AS minute_us, count() AS requests, countIf(status_code = 'ERROR') AS errors, quantileExactInclusive(0.99)(duration_ns) AS p99 FROM spans GROUP BY service_name, minute_us ORDER BY service_name, minute_us".into(),
            ordered: true,
        },
        PeerQuery {
            id: "Q6",
            what: "spans and distinct traces of one (model version, worker, LoRA adapter)",
            weft: format!("SELECT count(*) AS spans, count(DISTINCT trace_id) AS traces FROM spans WHERE \"llm.model_version\" = '{version}' AND \"worker.id\" = '{worker}' AND \"llm.lora_adapter\" = '{adapter}'"),
            duckdb: format!("SELECT count(*) AS spans, count(DISTINCT trace_id) AS traces FROM spans WHERE \"llm.model_version\" = '{version}' AND \"worker.id\" = '{worker}' AND \"llm.lora_adapter\" = '{adapter}'"),
            chdb: format!("SELECT count() AS spans, uniqExact(trace_id) AS traces FROM spans WHERE `llm.model_version` = '{version}' AND `worker.id` = '{worker}' AND `llm.lora_adapter` = '{adapter}'"),
            ordered: true,
        },
        PeerQuery {
            id: "Q8",
            what: "dimension values among slow (>100 ms) vs all decode spans, by lift",
            weft: q8("weft", &format!("'{w0}'"), &format!("'{w1}'"), '"', Q8::Join),
            duckdb: q8("duck", &d0, &d1, '"', Q8::Join),
            chdb: q8("ch", &c0, &c1, '`', Q8::Join),
            ordered: false,
        },
    ];
    let (s0, sm) = (p.t0 / 1_000_000_000, p.mid / 1_000_000_000);
    // generate, prefill and decode spans of one dimension set, as a join to the generate span
    let lineage = |count: &str, traces: &str, q: char| {
        format!(
            "SELECT {count} AS spans, {traces} AS traces FROM spans s JOIN (SELECT trace_id, span_id FROM spans WHERE name = 'llm.generate' AND {q}llm.model_version{q} = '{version}' AND {q}worker.id{q} = '{worker}' AND {q}llm.lora_adapter{q} = '{adapter}') g ON s.trace_id = g.trace_id WHERE (s.span_id = g.span_id OR s.parent_span_id = g.span_id) AND s.name IN ('llm.generate', 'llm.prefill', 'llm.decode.token')"
        )
    };
    let more = vec![
        PeerQuery {
            id: "Q1b",
            what: "Q1 with a time range and IN",
            weft: format!("SELECT span_id, name, CAST(start_time AS BIGINT) / 1000 AS start_us, duration_ns FROM spans WHERE trace_id IN ('{trace}') AND start_time >= '{w0}' AND start_time < '{w1}' ORDER BY start_us, span_id"),
            duckdb: format!("SELECT span_id, name, epoch_us(start_time) AS start_us, duration_ns FROM spans WHERE trace_id IN ('{trace}') AND start_time >= {d0} AND start_time < {d1} ORDER BY start_us, span_id"),
            chdb: format!("SELECT span_id, name, toUnixTimestamp64Micro(start_time) AS start_us, duration_ns FROM spans WHERE trace_id IN ('{trace}') AND start_time >= {c0} AND start_time < {c1} ORDER BY start_us, span_id"),
            ordered: true,
        },
        PeerQuery {
            id: "Q1c",
            what: "Q1 as a join to a CTE holding the id",
            weft: format!("WITH t AS (SELECT '{trace}' AS id) SELECT s.span_id, s.name, CAST(s.start_time AS BIGINT) / 1000 AS start_us, s.duration_ns FROM spans s JOIN t ON s.trace_id = t.id ORDER BY start_us, span_id"),
            duckdb: format!("WITH t AS (SELECT '{trace}' AS id) SELECT s.span_id, s.name, epoch_us(s.start_time) AS start_us, s.duration_ns FROM spans s JOIN t ON s.trace_id = t.id ORDER BY start_us, span_id"),
            chdb: format!("WITH t AS (SELECT '{trace}' AS id) SELECT s.span_id, s.name, toUnixTimestamp64Micro(s.start_time) AS start_us, s.duration_ns FROM spans s JOIN t ON s.trace_id = t.id ORDER BY start_us, span_id"),
            ordered: true,
        },
        PeerQuery {
            id: "Q2b",
            what: "Q2 with a kind filter and to_timestamp bounds",
            weft: format!("SELECT trace_id, CAST(start_time AS BIGINT) / 1000 AS start_us, duration_ns FROM spans WHERE service_name = 'inference-engine' AND kind = 'SERVER' AND \"llm.model_version\" = '{version}' AND duration_ns > 2000000000 AND start_time >= to_timestamp({s0}) AND start_time < to_timestamp({sm}) ORDER BY start_time DESC LIMIT 20"),
            duckdb: format!("SELECT trace_id, epoch_us(start_time) AS start_us, duration_ns FROM spans WHERE service_name = 'inference-engine' AND kind = 'SERVER' AND \"llm.model_version\" = '{version}' AND duration_ns > 2000000000 AND start_time >= to_timestamp({s0}) AND start_time < to_timestamp({sm}) ORDER BY start_time DESC LIMIT 20"),
            chdb: format!("SELECT trace_id, toUnixTimestamp64Micro(start_time) AS start_us, duration_ns FROM spans WHERE service_name = 'inference-engine' AND kind = 'SERVER' AND `llm.model_version` = '{version}' AND duration_ns > 2000000000 AND start_time >= {c0} AND start_time < {cm} ORDER BY start_time DESC LIMIT 20"),
            ordered: true,
        },
        PeerQuery {
            id: "Q2c",
            what: "Q2 on generate spans by their request column",
            weft: format!("SELECT trace_id, CAST(start_time AS BIGINT) / 1000 AS start_us, duration_ns FROM spans WHERE name = 'llm.generate' AND \"request.llm.model_version\" = '{version}' AND duration_ns > 2000000000 AND start_time >= '{w0}' AND start_time < '{wm}' ORDER BY start_time DESC LIMIT 20"),
            duckdb: format!("SELECT trace_id, epoch_us(start_time) AS start_us, duration_ns FROM spans WHERE name = 'llm.generate' AND \"llm.model_version\" = '{version}' AND duration_ns > 2000000000 AND start_time >= {d0} AND start_time < {dm} ORDER BY start_time DESC LIMIT 20"),
            chdb: format!("SELECT trace_id, toUnixTimestamp64Micro(start_time) AS start_us, duration_ns FROM spans WHERE name = 'llm.generate' AND `llm.model_version` = '{version}' AND duration_ns > 2000000000 AND start_time >= {c0} AND start_time < {cm} ORDER BY start_time DESC LIMIT 20"),
            ordered: true,
        },
        PeerQuery {
            id: "Q3b",
            what: "Q3 with time buckets by integer division of the epoch",
            weft: "SELECT CAST(start_time AS BIGINT) / 10000000000 * 10000000 AS bucket_us, CAST(floor(log2(duration_ns / 1000.0)) AS BIGINT) AS lat, count(*) AS n FROM spans WHERE name = 'llm.decode.token' GROUP BY 1, 2 ORDER BY 1, 2".into(),
            duckdb: "SELECT epoch_us(start_time) // 10000000 * 10000000 AS bucket_us, CAST(floor(log2(duration_ns / 1000.0)) AS BIGINT) AS lat, count(*) AS n FROM spans WHERE name = 'llm.decode.token' GROUP BY 1, 2 ORDER BY 1, 2".into(),
            chdb: "SELECT intDiv(toUnixTimestamp64Micro(start_time), 10000000) * 10000000 AS bucket_us, toInt64(floor(log2(duration_ns / 1000.0))) AS lat, count() AS n FROM spans WHERE name = 'llm.decode.token' GROUP BY bucket_us, lat ORDER BY bucket_us, lat".into(),
            ordered: true,
        },
        PeerQuery {
            id: "Q3c",
            what: "Q3 with to_timestamp arithmetic and a kind filter",
            weft: "SELECT CAST(to_timestamp(floor(extract(epoch FROM start_time) / 10) * 10) AS BIGINT) / 1000 AS bucket_us, CAST(floor(log2(duration_ns / 1000.0)) AS BIGINT) AS lat, count(*) AS n FROM spans WHERE name = 'llm.decode.token' AND kind = 'INTERNAL' GROUP BY 1, 2 ORDER BY 1, 2".into(),
            duckdb: "SELECT epoch_us(to_timestamp(floor(epoch(start_time) / 10) * 10)) AS bucket_us, CAST(floor(log2(duration_ns / 1000.0)) AS BIGINT) AS lat, count(*) AS n FROM spans WHERE name = 'llm.decode.token' AND kind = 'INTERNAL' GROUP BY 1, 2 ORDER BY 1, 2".into(),
            chdb: "SELECT toInt64(floor(toUnixTimestamp64Micro(start_time) / 10000000)) * 10000000 AS bucket_us, toInt64(floor(log2(duration_ns / 1000.0))) AS lat, count() AS n FROM spans WHERE name = 'llm.decode.token' AND kind = 'INTERNAL' GROUP BY bucket_us, lat ORDER BY bucket_us, lat".into(),
            ordered: true,
        },
        PeerQuery {
            id: "Q4b",
            what: "Q4 joined to the parent generate span by span id",
            weft: "SELECT CAST(date_trunc('minute', p.start_time) AS BIGINT) / 1000 AS minute_us, g.\"llm.model_version\" AS version, percentile_cont(0.5) WITHIN GROUP (ORDER BY p.duration_ns) AS p50, percentile_cont(0.95) WITHIN GROUP (ORDER BY p.duration_ns) AS p95, percentile_cont(0.99) WITHIN GROUP (ORDER BY p.duration_ns) AS p99 FROM spans p JOIN spans g ON p.trace_id = g.trace_id AND p.parent_span_id = g.span_id WHERE p.name = 'llm.prefill' AND g.name = 'llm.generate' GROUP BY 1, 2 ORDER BY 1, 2".into(),
            duckdb: "SELECT epoch_us(date_trunc('minute', p.start_time)) AS minute_us, g.\"llm.model_version\" AS version, quantile_cont(p.duration_ns, 0.5) AS p50, quantile_cont(p.duration_ns, 0.95) AS p95, quantile_cont(p.duration_ns, 0.99) AS p99 FROM spans p JOIN spans g ON p.trace_id = g.trace_id AND p.parent_span_id = g.span_id WHERE p.name = 'llm.prefill' AND g.name = 'llm.generate' GROUP BY 1, 2 ORDER BY 1, 2".into(),
            chdb: "SELECT toInt64(toUnixTimestamp(toStartOfMinute(p.start_time))) * 1000000 AS minute_us, g.`llm.model_version` AS version, quantileExactInclusive(0.5)(p.duration_ns) AS p50, quantileExactInclusive(0.95)(p.duration_ns) AS p95, quantileExactInclusive(0.99)(p.duration_ns) AS p99 FROM spans p JOIN spans g ON p.trace_id = g.trace_id AND p.parent_span_id = g.span_id WHERE p.name = 'llm.prefill' AND g.name = 'llm.generate' GROUP BY minute_us, version ORDER BY minute_us, version".into(),
            ordered: true,
        },
        PeerQuery {
            id: "Q4c",
            what: "Q4 with the version from the request column (peers: the join)",
            weft: "SELECT CAST(date_trunc('minute', start_time) AS BIGINT) / 1000 AS minute_us, \"request.llm.model_version\" AS version, percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ns) AS p50, percentile_cont(0.95) WITHIN GROUP (ORDER BY duration_ns) AS p95, percentile_cont(0.99) WITHIN GROUP (ORDER BY duration_ns) AS p99 FROM spans WHERE name = 'llm.prefill' GROUP BY 1, 2 ORDER BY 1, 2".into(),
            duckdb: "SELECT epoch_us(date_trunc('minute', p.start_time)) AS minute_us, g.\"llm.model_version\" AS version, quantile_cont(p.duration_ns, 0.5) AS p50, quantile_cont(p.duration_ns, 0.95) AS p95, quantile_cont(p.duration_ns, 0.99) AS p99 FROM spans p JOIN spans g ON p.trace_id = g.trace_id WHERE p.name = 'llm.prefill' AND g.name = 'llm.generate' GROUP BY 1, 2 ORDER BY 1, 2".into(),
            chdb: "SELECT toInt64(toUnixTimestamp(toStartOfMinute(p.start_time))) * 1000000 AS minute_us, g.`llm.model_version` AS version, quantileExactInclusive(0.5)(p.duration_ns) AS p50, quantileExactInclusive(0.95)(p.duration_ns) AS p95, quantileExactInclusive(0.99)(p.duration_ns) AS p99 FROM spans p JOIN spans g ON p.trace_id = g.trace_id WHERE p.name = 'llm.prefill' AND g.name = 'llm.generate' GROUP BY minute_us, version ORDER BY minute_us, version".into(),
            ordered: true,
        },
        PeerQuery {
            id: "Q5b",
            what: "Q5 over SERVER spans",
            weft: "SELECT service_name, CAST(date_bin(INTERVAL '1 minute', start_time) AS BIGINT) / 1000 AS minute_us, count(*) AS requests, sum(CASE WHEN status_code = 'ERROR' THEN 1 ELSE 0 END) AS errors, percentile_cont(0.99) WITHIN GROUP (ORDER BY duration_ns) AS p99 FROM spans WHERE kind = 'SERVER' GROUP BY 1, 2 ORDER BY 1, 2".into(),
            duckdb: "SELECT service_name, epoch_us(date_trunc('minute', start_time)) AS minute_us, count(*) AS requests, sum(CASE WHEN status_code = 'ERROR' THEN 1 ELSE 0 END) AS errors, quantile_cont(duration_ns, 0.99) AS p99 FROM spans WHERE kind = 'SERVER' GROUP BY 1, 2 ORDER BY 1, 2".into(),
            chdb: "SELECT service_name, toInt64(toUnixTimestamp(toStartOfMinute(start_time))) * 1000000 AS minute_us, count() AS requests, countIf(status_code = 'ERROR') AS errors, quantileExactInclusive(0.99)(duration_ns) AS p99 FROM spans WHERE kind = 'SERVER' GROUP BY service_name, minute_us ORDER BY service_name, minute_us".into(),
            ordered: true,
        },
        PeerQuery {
            id: "Q5c",
            what: "Q5 with minutes by integer division of the epoch",
            weft: "SELECT service_name, CAST(start_time AS BIGINT) / 60000000000 * 60000000 AS minute_us, count(*) AS requests, sum(CASE WHEN status_code = 'ERROR' THEN 1 ELSE 0 END) AS errors, percentile_cont(0.99) WITHIN GROUP (ORDER BY duration_ns) AS p99 FROM spans GROUP BY 1, 2 ORDER BY 1, 2".into(),
            duckdb: "SELECT service_name, epoch_us(start_time) // 60000000 * 60000000 AS minute_us, count(*) AS requests, sum(CASE WHEN status_code = 'ERROR' THEN 1 ELSE 0 END) AS errors, quantile_cont(duration_ns, 0.99) AS p99 FROM spans GROUP BY 1, 2 ORDER BY 1, 2".into(),
            chdb: "SELECT service_name, intDiv(toUnixTimestamp64Micro(start_time), 60000000) * 60000000 AS minute_us, count() AS requests, countIf(status_code = 'ERROR') AS errors, quantileExactInclusive(0.99)(duration_ns) AS p99 FROM spans GROUP BY service_name, minute_us ORDER BY service_name, minute_us".into(),
            ordered: true,
        },
        PeerQuery {
            id: "Q6b",
            what: "generate, prefill and decode spans of the dimension set, by request columns (peers: a join)",
            weft: format!("SELECT count(*) AS spans, count(DISTINCT trace_id) AS traces FROM spans WHERE \"request.llm.model_version\" = '{version}' AND \"request.worker.id\" = '{worker}' AND \"request.llm.lora_adapter\" = '{adapter}' AND name IN ('llm.generate', 'llm.prefill', 'llm.decode.token')"),
            duckdb: lineage("count(*)", "count(DISTINCT s.trace_id)", '"'),
            chdb: lineage("count()", "uniqExact(s.trace_id)", '`'),
            ordered: true,
        },
        PeerQuery {
            id: "Q6c",
            what: "Q6b as a join to the generate span, on every engine",
            weft: lineage("count(*)", "count(DISTINCT s.trace_id)", '"'),
            duckdb: lineage("count(*)", "count(DISTINCT s.trace_id)", '"'),
            chdb: lineage("count()", "uniqExact(s.trace_id)", '`'),
            ordered: true,
        },
        PeerQuery {
            id: "Q8b",
            what: "Q8 with the dimensions from the request columns (peers: the join)",
            weft: q8("weft", &format!("'{w0}'"), &format!("'{w1}'"), '"', Q8::Request),
            duckdb: q8("duck", &d0, &d1, '"', Q8::Join),
            chdb: q8("ch", &c0, &c1, '`', Q8::Join),
            ordered: false,
        },
        PeerQuery {
            id: "Q8c",
            what: "Q8 with slow as over the range's p99, from a CTE",
            weft: q8("weft", &format!("'{w0}'"), &format!("'{w1}'"), '"', Q8::P99),
            duckdb: q8("duck", &d0, &d1, '"', Q8::P99),
            chdb: q8("ch", &c0, &c1, '`', Q8::P99),
            ordered: false,
        },
    ];
    let mut all = Vec::new();
    for q in queries {
        let id = q.id;
        all.push(q);
        all.extend(
            more.iter()
                .filter(|m| m.id.starts_with(id) && m.id.len() == 3)
                .map(|m| PeerQuery {
                    id: m.id,
                    what: m.what,
                    weft: m.weft.clone(),
                    duckdb: m.duckdb.clone(),
                    chdb: m.chdb.clone(),
                    ordered: m.ordered,
                }),
        );
    }
    all
}

/// Answers as JSON values: strings, integers, floats; NULL as null.
/// Q7 of the logs issue: counting log records by their words in a time range (the middle
/// 80% of the data's time), `refund` alone and with the phrase "charged twice". Weft asks its
/// text index; DuckDB matches a regular expression (after a substring test); chDB asks
/// `hasToken`, which its token bloom-filter index on the body answers (the OpenTelemetry
/// ClickHouse exporter's logs schema), then a regular expression for the phrase. The words
/// are lower-case in the data and free of `_`, where ClickHouse's tokens differ from Weft's.
pub fn log_queries(first_ns: u64, last_ns: u64) -> Vec<PeerQuery> {
    let span = last_ns.saturating_sub(first_ns);
    let (t0, t1) = (first_ns + span / 10, first_ns + span * 9 / 10);
    // whole seconds: the peers' literals are written in seconds
    let (t0, t1) = (
        t0 / 1_000_000_000 * 1_000_000_000,
        t1 / 1_000_000_000 * 1_000_000_000,
    );
    let (w0, w1) = (rfc3339(t0), rfc3339(t1));
    let (d0, d1) = (duck_ts(t0), duck_ts(t1));
    let (c0, c1) = (ch_ts(t0), ch_ts(t1));
    vec![
        PeerQuery {
            id: "Q7",
            what: "logs containing a word, in a time range",
            weft: format!(
                "SELECT count(*) AS n FROM logs WHERE matches(body, 'refund') AND time >= '{w0}' AND time < '{w1}'"
            ),
            duckdb: format!(
                "SELECT count(*) AS n FROM logs WHERE contains(body, 'refund') AND regexp_matches(body, '\\brefund\\b') AND time >= {d0} AND time < {d1}"
            ),
            chdb: format!(
                "SELECT count() AS n FROM logs WHERE hasToken(body, 'refund') AND time >= {c0} AND time < {c1}"
            ),
            ordered: false,
        },
        PeerQuery {
            id: "Q7b",
            what: "logs containing a word and a phrase, in a time range",
            weft: format!(
                "SELECT count(*) AS n FROM logs WHERE matches(body, 'refund AND \"charged twice\"') AND time >= '{w0}' AND time < '{w1}'"
            ),
            duckdb: format!(
                "SELECT count(*) AS n FROM logs WHERE contains(body, 'refund') AND contains(body, 'twice') AND regexp_matches(body, '\\brefund\\b') AND regexp_matches(body, '\\bcharged\\W+twice\\b') AND time >= {d0} AND time < {d1}"
            ),
            chdb: format!(
                "SELECT count() AS n FROM logs WHERE hasToken(body, 'refund') AND hasToken(body, 'charged') AND hasToken(body, 'twice') AND match(body, '\\\\bcharged\\\\W+twice\\\\b') AND time >= {c0} AND time < {c1}"
            ),
            ordered: false,
        },
    ]
}

fn batches_to_rows(batches: &[arrow::array::RecordBatch]) -> anyhow::Result<Vec<Vec<Value>>> {
    let mut rows = Vec::new();
    for b in batches {
        for r in 0..b.num_rows() {
            let mut row = Vec::with_capacity(b.num_columns());
            for c in b.columns() {
                if c.is_null(r) {
                    row.push(Value::Null);
                    continue;
                }
                let c = match c.data_type() {
                    DataType::Int8
                    | DataType::Int16
                    | DataType::Int32
                    | DataType::UInt8
                    | DataType::UInt16
                    | DataType::UInt32
                    | DataType::UInt64 => arrow::compute::cast(c, &DataType::Int64)?,
                    DataType::Float32 | DataType::Decimal128(_, _) => {
                        arrow::compute::cast(c, &DataType::Float64)?
                    }
                    DataType::LargeUtf8 | DataType::Utf8View | DataType::Dictionary(_, _) => {
                        arrow::compute::cast(c, &DataType::Utf8)?
                    }
                    _ => c.clone(),
                };
                row.push(match c.data_type() {
                    DataType::Int64 => {
                        json!(c.as_primitive::<arrow::datatypes::Int64Type>().value(r))
                    }
                    DataType::Float64 => {
                        json!(c.as_primitive::<arrow::datatypes::Float64Type>().value(r))
                    }
                    DataType::Utf8 => json!(c.as_string::<i32>().value(r)),
                    DataType::Boolean => json!(c.as_boolean().value(r)),
                    other => bail!("unexpected result type {other}"),
                });
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

/// Integers exactly; floats to a relative 1e-6 (the engines' continuous percentiles differ
/// in the eighth significant digit).
fn same_value(a: &Value, b: &Value) -> bool {
    same_value_within(a, b, 1e-6, 0.0)
}

/// Integers exactly; floats to `relative` of the larger, plus `absolute`.
pub fn same_value_within(a: &Value, b: &Value, relative: f64, absolute: f64) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_i64() && y.is_i64() => x == y,
        _ => match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => {
                x == y || (x - y).abs() <= relative * x.abs().max(y.abs()) + absolute
            }
            _ => a == b,
        },
    }
}

fn same_rows(a: &[Vec<Value>], b: &[Vec<Value>], ordered: bool) -> bool {
    let key = |r: &Vec<Value>| {
        r.iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join("\u{1}")
    };
    let sort = |rows: &[Vec<Value>]| {
        let mut v = rows.to_vec();
        if !ordered {
            v.sort_by_key(key);
        }
        v
    };
    let (a, b) = (sort(a), sort(b));
    a.len() == b.len()
        && a.iter()
            .zip(&b)
            .all(|(x, y)| x.len() == y.len() && x.iter().zip(y).all(|(u, v)| same_value(u, v)))
}

/// Weft's answer to one query: best HTTP (Arrow IPC) time, best PostgreSQL-wire time, rows.
pub struct WeftResult {
    pub http_ms: f64,
    pub pg_ms: f64,
    pub rows: Vec<Vec<Value>>,
}

/// Runs the queries on Weft over HTTP (Arrow IPC) and over the PostgreSQL wire protocol
/// (simple query, text results), one run of each in turn: best of `runs` after one warm-up.
pub async fn run_weft(
    http: &str,
    pg: &str,
    queries: &[PeerQuery],
    runs: usize,
) -> anyhow::Result<BTreeMap<&'static str, WeftResult>> {
    let client = crate::client::Client::new();
    let mut pg = crate::pgclient::PgClient::connect(pg, "weft").await?;
    let mut out = BTreeMap::new();
    for q in queries {
        let (mut best, mut pg_best) = (f64::MAX, f64::MAX);
        let mut rows = Vec::new();
        // HTTP and PostgreSQL runs alternate, so that a slower spell of this shared machine
        // weighs on both alike
        for i in 0..=runs {
            let started = Instant::now();
            let reply = client
                .post(
                    &format!("{http}/api/v1/sql"),
                    &[("content-type", "application/json")],
                    json!({"query": q.weft, "format": "arrow"}).to_string(),
                )
                .await?;
            if reply.status != hyper::StatusCode::OK {
                bail!("{}: {} {}", q.id, reply.status, reply.text());
            }
            let reader = arrow::ipc::reader::StreamReader::try_new(
                std::io::Cursor::new(reply.body.to_vec()),
                None,
            )?;
            let batches = reader.collect::<Result<Vec<_>, _>>()?;
            let took = started.elapsed().as_secs_f64() * 1e3;
            rows = batches_to_rows(&batches)?;

            let started = Instant::now();
            let n = pg
                .query(&q.weft)
                .await
                .with_context(|| format!("{} over PostgreSQL", q.id))?;
            let pg_took = started.elapsed().as_secs_f64() * 1e3;
            anyhow::ensure!(
                n == rows.len(),
                "{}: {} rows over PostgreSQL, {} over HTTP",
                q.id,
                n,
                rows.len()
            );
            if i > 0 {
                best = best.min(took);
                pg_best = pg_best.min(pg_took);
            }
        }
        out.insert(
            q.id,
            WeftResult {
                http_ms: best,
                pg_ms: pg_best,
                rows,
            },
        );
    }
    Ok(out)
}

/// Prints Weft's time per query (and its SQL text with `sql`), a line each.
pub fn print_weft(queries: &[PeerQuery], results: &BTreeMap<&'static str, WeftResult>, sql: bool) {
    for q in queries {
        let r = &results[q.id];
        println!(
            "weft {:<4} {:>6} rows  http {:>9.2} ms  pg {:>9.2} ms  {}",
            q.id,
            r.rows.len(),
            r.http_ms,
            r.pg_ms,
            q.what
        );
        if sql {
            println!("     {}", q.weft);
        }
    }
}

/// Runs `benches/peers/peers.py` and reads its JSON answer.
/// Runs the queries on DuckDB and chDB over `parquet` loaded as `table` (`spans` or `logs`).
pub fn run_peers(
    python: &Path,
    parquet: &Path,
    table: &str,
    queries: &[PeerQuery],
    runs: usize,
    workdir: &Path,
) -> anyhow::Result<Value> {
    let spec: Vec<Value> = queries
        .iter()
        .map(|q| json!({"id": q.id, "duckdb": q.duckdb, "chdb": q.chdb}))
        .collect();
    let spec_path = workdir.join("queries.json");
    std::fs::write(&spec_path, serde_json::to_vec(&spec)?)?;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("peers/peers.py");
    let out = std::process::Command::new(python)
        .arg(&script)
        .arg(parquet)
        .arg(&spec_path)
        .arg(runs.to_string())
        .arg(workdir)
        .arg(table)
        // its progress (load times, each query as it finishes) shows as it happens
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("run {} {}", python.display(), script.display()))?;
    if !out.status.success() {
        bail!("peers.py failed ({}): see its messages above", out.status);
    }
    serde_json::from_slice(&out.stdout).context("peers.py output")
}

/// Prints the comparison and returns whether every answer agreed.
pub fn report(
    queries: &[PeerQuery],
    weft: &BTreeMap<&'static str, WeftResult>,
    peers: &Value,
    weft_bytes_per_span: f64,
    unit: &str,
) -> bool {
    let mut all_agree = true;
    let h = [
        "q",
        "rows",
        "weft ms",
        "duckdb ms",
        "chdb ms",
        "weft/best",
        "pg ms",
        "pg/http",
        "what",
    ];
    println!(
        "{:<4} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}  agree  {}",
        h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8]
    );
    for q in queries {
        let r = &weft[q.id];
        let (w_ms, w_rows) = (&r.http_ms, &r.rows);
        let peer = |engine: &str| -> (f64, Vec<Vec<Value>>) {
            let e = &peers[engine]["queries"][q.id];
            let rows = e["rows"]
                .as_array()
                .map(|r| {
                    r.iter()
                        .map(|row| row.as_array().cloned().unwrap_or_default())
                        .collect()
                })
                .unwrap_or_default();
            (e["ms"].as_f64().unwrap_or(f64::NAN), rows)
        };
        let (d_ms, d_rows) = peer("duckdb");
        let (c_ms, c_rows) = peer("chdb");
        // an engine left out (WEFT_PEERS_ENGINES) has no answer to compare, nor a time
        let ran = |engine: &str| !peers[engine]["queries"].is_null();
        let agree = (!ran("duckdb") || same_rows(w_rows, &d_rows, q.ordered))
            && (!ran("chdb") || same_rows(w_rows, &c_rows, q.ordered))
            && (ran("duckdb") || ran("chdb"));
        all_agree &= agree;
        let best = d_ms.min(c_ms); // min ignores the NaN of an engine left out
        println!(
            "{:<4} {:>7} {:>10.2} {:>10.2} {:>10.2} {:>10.3} {:>10.2} {:>8.3}  {:<5}  {}",
            q.id,
            w_rows.len(),
            w_ms,
            d_ms,
            c_ms,
            w_ms / best,
            r.pg_ms,
            r.pg_ms / w_ms,
            if agree { "yes" } else { "NO" },
            q.what
        );
        if !agree {
            let show = |rows: &Vec<Vec<Value>>| {
                rows.iter()
                    .take(3)
                    .map(|r| Value::Array(r.clone()).to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            println!(
                "     weft:   {} rows: {}",
                w_rows.len(),
                show(&w_rows.to_vec())
            );
            println!("     duckdb: {} rows: {}", d_rows.len(), show(&d_rows));
            println!("     chdb:   {} rows: {}", c_rows.len(), show(&c_rows));
        }
    }
    println!(
        "bytes on disk per {unit}: weft {:.2}, duckdb {:.2}, chdb {:.2}",
        weft_bytes_per_span,
        peers["duckdb"]["bytes_per_span"]
            .as_f64()
            .unwrap_or(f64::NAN),
        peers["chdb"]["bytes_per_span"].as_f64().unwrap_or(f64::NAN)
    );
    all_agree
}
