//! `weft-bench analytics`: each LLM analytics capability called as a dashboard calls it (the
//! HTTP endpoint under `/api/v1/`), the same question asked of DuckDB and chDB in SQL where
//! SQL can express it, answers compared, times reported as ratios.
//!
//! Weft's JSON answer is turned into rows of the peers' shape. Counts must agree exactly,
//! floats to a relative 1e-6, except where a question states a tolerance per column: the
//! percentiles endpoint and the operation graph answer from DDSketch bins (within 1% of
//! `percentile_cont`).
//! The anomaly scan has no SQL equivalent (it finds the windows itself); it is timed next to
//! the peers' attribution by lift over the whole range (Q8 of `weft-bench peers`), without
//! comparing answers.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::peers::{Params, PeerQuery, ch_ts, duck_ts, same_value_within};

/// Turns Weft's JSON answer into rows.
type ToRows = fn(&Value) -> anyhow::Result<Vec<Vec<Value>>>;

pub struct Question {
    pub id: &'static str,
    pub what: &'static str,
    /// Path and query after `/api/v1/`.
    pub weft: String,
    /// `None`: timed only.
    pub rows: Option<ToRows>,
    pub duckdb: String,
    pub chdb: String,
    /// Relative tolerance of each column (columns past the end: 1e-6).
    pub tolerance: &'static [f64],
}

fn array<'a>(v: &'a Value, key: &str) -> anyhow::Result<&'a Vec<Value>> {
    v[key]
        .as_array()
        .with_context(|| format!("answer has no array {key:?}: {v}"))
}

fn graph_rows(v: &Value) -> anyhow::Result<Vec<Vec<Value>>> {
    let mut rows = Vec::new();
    for n in array(v, "nodes")? {
        rows.push(vec![
            json!("node"),
            n["id"].clone(),
            json!(""),
            n["calls"].clone(),
            n["errors"].clone(),
            n["p50_ms"].clone(),
            n["p99_ms"].clone(),
        ]);
    }
    for e in array(v, "edges")? {
        rows.push(vec![
            json!("edge"),
            e["source"].clone(),
            e["target"].clone(),
            e["calls"].clone(),
            json!(0),
            json!(0.0),
            e["p99_ms"].clone(),
        ]);
    }
    Ok(rows)
}

fn heatmap_rows(v: &Value) -> anyhow::Result<Vec<Vec<Value>>> {
    let (x, bounds) = (array(v, "x")?, array(v, "y_upper_bounds")?);
    let (counts, exemplars) = (array(v, "counts")?, array(v, "exemplars")?);
    let mut rows = Vec::new();
    for (i, xi) in x.iter().enumerate() {
        for (j, bound) in bounds.iter().enumerate() {
            let n = counts[i][j].as_u64().unwrap_or(0);
            if n == 0 {
                continue;
            }
            let b = match bound.as_f64() {
                Some(b) if b > 0.0 => b.log2().round() as i64,
                _ => -1075,
            };
            rows.push(vec![
                json!(xi.as_i64().unwrap_or(0) / 1000),
                json!(b),
                json!(n),
                exemplars[i][j].clone(),
            ]);
        }
    }
    Ok(rows)
}

fn percentile_rows(v: &Value) -> anyhow::Result<Vec<Vec<Value>>> {
    let mut rows = Vec::new();
    for s in array(v, "series")? {
        let version = s["labels"]["llm.model_version"].clone();
        for p in s["points"].as_array().into_iter().flatten() {
            let mut row = vec![json!(p[0].as_i64().unwrap_or(0) / 1000), version.clone()];
            row.extend(["0.5", "0.9", "0.99"].iter().map(|q| p[1][*q].clone()));
            rows.push(row);
        }
    }
    Ok(rows)
}

fn dimension_rows(v: &Value) -> anyhow::Result<Vec<Vec<Value>>> {
    Ok(array(v, "rows")?
        .iter()
        .map(|r| {
            [
                "llm.model_version",
                "llm.lora_adapter",
                "worker.id",
                "requests",
                "spans",
                "p50_ms",
                "p99_ms",
                "error_rate",
            ]
            .iter()
            .map(|k| r[*k].clone())
            .collect()
        })
        .collect())
}

/// The questions over the data's range `[t0, t1)`.
pub fn questions(p: &Params) -> Vec<Question> {
    let (t0, t1) = (p.t0, p.t1);
    let range = format!("start={t0}&end={t1}");
    let (d0, d1) = (duck_ts(t0), duck_ts(t1));
    let (c0, c1) = (ch_ts(t0), ch_ts(t1));
    let d_range = |a: &str| format!("{a}start_time >= {d0} AND {a}start_time < {d1}");
    let c_range = |a: &str| format!("{a}start_time >= {c0} AND {a}start_time < {c1}");
    let graph = |range: &dyn Fn(&str) -> String, id: &dyn Fn(&str) -> String, ch: bool| {
        let (errors, q50, q99) = if ch {
            (
                "countIf(status_code = 'ERROR')",
                "quantileExactInclusive(0.5)(duration_ns)",
                "quantileExactInclusive(0.99)(c.duration_ns)",
            )
        } else {
            (
                "sum(CASE WHEN status_code = 'ERROR' THEN 1 ELSE 0 END)",
                "quantile_cont(duration_ns, 0.5)",
                "quantile_cont(c.duration_ns, 0.99)",
            )
        };
        let q99_nodes = q99.replace("c.", "");
        format!(
            "SELECT 'node' AS kind, {} AS source, '' AS target, count(*) AS calls, {errors} AS errors, {q50} / 1e6 AS p50, {q99_nodes} / 1e6 AS p99 FROM spans WHERE {} GROUP BY 1, 2, 3 \
             UNION ALL \
             SELECT 'edge' AS kind, {} AS source, {} AS target, count(*) AS calls, 0 AS errors, 0.0 AS p50, {q99} / 1e6 AS p99 \
             FROM spans c JOIN spans p ON c.trace_id = p.trace_id AND c.parent_span_id = p.span_id WHERE {} AND {} GROUP BY 1, 2, 3",
            id(""),
            range(""),
            id("p."),
            id("c."),
            range("c."),
            range("p."),
        )
    };
    let heatmap = |bucket: &str, range: String, ch: bool| {
        let (bin, count) = if ch {
            ("if(v > 0, toInt64(ceil(log2(v))), -1075)", "count()")
        } else {
            (
                "CASE WHEN v > 0 THEN CAST(ceil(log2(v)) AS BIGINT) ELSE -1075 END",
                "count(*)",
            )
        };
        // ClickHouse's CAST to a non-Nullable type fails on NULL: the column is a double
        let latency = if ch {
            "\"llm.token.latency_ms\""
        } else {
            "CAST(\"llm.token.latency_ms\" AS DOUBLE)"
        };
        format!(
            "SELECT {bucket} AS x, {bin} AS b, {count} AS n, max(trace_id) AS exemplar FROM \
             (SELECT start_time, trace_id, COALESCE({latency}, duration_ns / 1e6) AS v FROM spans WHERE name = 'llm.decode.token' AND {range}) \
             WHERE v IS NOT NULL GROUP BY x, b"
        )
    };
    let percentiles = |bucket: &str, range: String, ch: bool| {
        let q = |q: f64| {
            if ch {
                format!("quantileExactInclusive({q})(v)")
            } else {
                format!("quantile_cont(v, {q})")
            }
        };
        let ttft = if ch {
            "\"gen_ai.latency.time_to_first_token\""
        } else {
            "CAST(\"gen_ai.latency.time_to_first_token\" AS DOUBLE)"
        };
        format!(
            "SELECT {bucket} AS t, version, {}, {}, {} FROM \
             (SELECT start_time, \"llm.model_version\" AS version, {ttft} * 1000.0 AS v FROM spans \
              WHERE \"gen_ai.request.model\" IS NOT NULL AND kind = 'SERVER' AND {range}) \
             WHERE v IS NOT NULL GROUP BY t, version",
            q(0.5),
            q(0.9),
            q(0.99)
        )
    };
    let dimensions = |range: &dyn Fn(&str) -> String, ch: bool| {
        let (q50, q99, distinct) = if ch {
            (
                "quantileExactInclusive(0.5)(duration_ns)",
                "quantileExactInclusive(0.99)(duration_ns)",
                "uniqExact(g.trace_id)",
            )
        } else {
            (
                "quantile_cont(duration_ns, 0.5)",
                "quantile_cont(duration_ns, 0.99)",
                "count(DISTINCT g.trace_id)",
            )
        };
        format!(
            "WITH g AS (SELECT trace_id, span_id, \"llm.model_version\" AS v, \"llm.lora_adapter\" AS a, \"worker.id\" AS w, duration_ns, status_code FROM spans WHERE name = 'llm.generate' AND {}), \
             c AS (SELECT trace_id, parent_span_id, count(*) AS n FROM spans WHERE name IN ('llm.prefill', 'llm.decode.token') AND {} GROUP BY trace_id, parent_span_id) \
             SELECT v, a, w, {distinct} AS requests, count(*) + CAST(COALESCE(sum(c.n), 0) AS BIGINT) AS spans, {q50} / 1e6 AS p50, {q99} / 1e6 AS p99, \
             avg(CASE WHEN status_code = 'ERROR' THEN 1.0 ELSE 0.0 END) AS error_rate \
             FROM g LEFT JOIN c ON c.trace_id = g.trace_id AND c.parent_span_id = g.span_id GROUP BY v, a, w",
            range(""),
            range(""),
        )
    };
    let duck_id = |a: &str| format!("{a}service_name || '/' || {a}name");
    let ch_id = |a: &str| format!("concat({a}service_name, '/', {a}name)");
    let q8 = crate::peers::queries(p)
        .into_iter()
        .find(|q| q.id == "Q8")
        .expect("peers define Q8");
    let duck_percentiles = percentiles(
        "epoch_us(time_bucket(INTERVAL '60 seconds', start_time))",
        d_range(""),
        false,
    );
    let ch_percentiles = percentiles(
        "intDiv(toUnixTimestamp64Micro(start_time), 60000000) * 60000000",
        c_range(""),
        true,
    );
    // ClickHouse reads the double-quoted identifiers as identifiers, like the others
    vec![
        Question {
            id: "A1",
            what: "operation graph: nodes (calls, errors, p50, p99) and parent → child edges",
            weft: format!("lineage/operations?{range}"),
            rows: Some(graph_rows),
            duckdb: graph(&d_range, &duck_id, false),
            chdb: graph(&c_range, &ch_id, true),
            // p50 and p99 from the blocks' sketches
            tolerance: &[0.0, 0.0, 0.0, 0.0, 0.0, 0.01, 0.01],
        },
        Question {
            id: "A1x",
            what: "A1 exact (exact=true)",
            weft: format!("lineage/operations?{range}&exact=true"),
            rows: Some(graph_rows),
            duckdb: graph(&d_range, &duck_id, false),
            chdb: graph(&c_range, &ch_id, true),
            tolerance: &[],
        },
        Question {
            id: "A2",
            what: "heatmap of decode token latency: 10 s × log2 ms, one exemplar trace per cell",
            weft: format!("heatmap?{range}&y=itl&step=10s"),
            rows: Some(heatmap_rows),
            duckdb: heatmap(
                "epoch_us(time_bucket(INTERVAL '10 seconds', start_time))",
                d_range(""),
                false,
            ),
            chdb: heatmap(
                "intDiv(toUnixTimestamp64Micro(start_time), 10000000) * 10000000",
                c_range(""),
                true,
            ),
            tolerance: &[],
        },
        Question {
            id: "A3",
            what: "TTFT p50/p90/p99 per minute by model version (sketches, within 1%)",
            weft: format!(
                "percentiles?{range}&signal=ttft&by=llm.model_version&step=60s&q=0.5,0.9,0.99"
            ),
            rows: Some(percentile_rows),
            duckdb: duck_percentiles.clone(),
            chdb: ch_percentiles.clone(),
            tolerance: &[0.0, 0.0, 0.01, 0.01, 0.01],
        },
        Question {
            id: "A3x",
            what: "A3 exact (exact=true)",
            weft: format!(
                "percentiles?{range}&signal=ttft&by=llm.model_version&step=60s&q=0.5,0.9,0.99&exact=true"
            ),
            rows: Some(percentile_rows),
            duckdb: duck_percentiles.clone(),
            chdb: ch_percentiles.clone(),
            tolerance: &[],
        },
        Question {
            id: "A4",
            what: "dimension lineage: model version × LoRA adapter × worker: requests, spans, p50, p99, error rate",
            weft: format!(
                "lineage/dimensions?{range}&dims=llm.model_version,llm.lora_adapter,worker.id"
            ),
            rows: Some(dimension_rows),
            duckdb: dimensions(&d_range, false),
            chdb: dimensions(&c_range, true),
            tolerance: &[],
        },
        Question {
            id: "A5",
            what: "anomaly scan of decode latency with attribution (peers: Q8, attribution by lift over the range; times only)",
            weft: format!("anomalies?{range}&signal=itl&step=1m"),
            rows: None,
            duckdb: q8.duckdb.clone(),
            chdb: q8.chdb.clone(),
            tolerance: &[],
        },
        Question {
            id: "A6",
            what: "anomaly scan of every default signal, co-occurring incidents merged (peers: Q8; times only)",
            weft: format!("anomalies?{range}&step=1m"),
            rows: None,
            duckdb: q8.duckdb,
            chdb: q8.chdb,
            tolerance: &[],
        },
    ]
}

/// The questions in the shape `peers.py` runs.
pub fn peer_queries(questions: &[Question]) -> Vec<PeerQuery> {
    questions
        .iter()
        .map(|q| PeerQuery {
            id: q.id,
            what: q.what,
            weft: String::new(),
            duckdb: q.duckdb.clone(),
            chdb: q.chdb.clone(),
            ordered: false,
        })
        .collect()
}

pub struct WeftAnswer {
    pub ms: f64,
    pub rows: Option<Vec<Vec<Value>>>,
    pub partial: bool,
    /// What an anomaly scan found: incidents, and the first one's window and first cause.
    pub found: Option<String>,
}

fn incidents_found(answer: &Value) -> Option<String> {
    let incidents = answer["incidents"].as_array()?;
    let first = incidents.first().map_or(String::new(), |i| {
        let cause = &i["attribution"][0];
        format!(
            "; first: {} {}..{} ns, cause {}={} (lift {})",
            i["signal"].as_str().unwrap_or("?"),
            i["start_ns"],
            i["end_ns"],
            cause["dimension"].as_str().unwrap_or("-"),
            cause["value"].as_str().unwrap_or("-"),
            cause["lift"]
        )
    });
    Some(format!("{} incidents{first}", incidents.len()))
}

/// Calls each endpoint once to warm up, then `runs` times; the best time.
pub async fn run_weft(
    http: &str,
    questions: &[Question],
    runs: usize,
) -> anyhow::Result<BTreeMap<&'static str, WeftAnswer>> {
    let client = crate::client::Client::new();
    let mut out = BTreeMap::new();
    for q in questions {
        let mut best = f64::MAX;
        let mut answer = Value::Null;
        for i in 0..=runs {
            let started = Instant::now();
            let reply = client
                .get(&format!("{http}/api/v1/{}", q.weft), &[])
                .await?;
            let took = started.elapsed().as_secs_f64() * 1e3;
            if reply.status != hyper::StatusCode::OK {
                bail!("{}: {} {}", q.id, reply.status, reply.text());
            }
            answer = reply.json()?;
            if i > 0 {
                best = best.min(took);
            }
        }
        let rows = q.rows.map(|f| f(&answer)).transpose()?;
        let partial = answer["partial"].as_bool().unwrap_or(false);
        out.insert(
            q.id,
            WeftAnswer {
                ms: best,
                rows,
                partial,
                found: incidents_found(&answer),
            },
        );
    }
    Ok(out)
}

fn same_value(a: &Value, b: &Value, tolerance: f64) -> bool {
    same_value_within(a, b, tolerance.max(1e-6), 1e-9)
}

/// Rows compared as sets: ordered by the columns that must match exactly (every column when
/// the question states no tolerance), then compared column by column.
fn same_rows(a: &[Vec<Value>], b: &[Vec<Value>], tolerance: &[f64]) -> bool {
    let exact = |i: usize| tolerance.is_empty() || tolerance.get(i) == Some(&0.0);
    let key = |r: &Vec<Value>| {
        r.iter()
            .enumerate()
            .filter(|(i, _)| exact(*i))
            .map(|(_, v)| match v.as_f64() {
                // 3 and 3.0 sort alike
                Some(f) if v.is_number() => format!("{f:e}"),
                _ => v.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\u{1}")
    };
    let sorted = |rows: &[Vec<Value>]| {
        let mut v = rows.to_vec();
        v.sort_by_key(key);
        v
    };
    let (a, b) = (sorted(a), sorted(b));
    a.len() == b.len()
        && a.iter().zip(&b).all(|(x, y)| {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .enumerate()
                    .all(|(i, (u, v))| same_value(u, v, tolerance.get(i).copied().unwrap_or(1e-6)))
        })
}

/// Prints the comparison; whether every compared answer agreed.
pub fn report(
    questions: &[Question],
    weft: &BTreeMap<&'static str, WeftAnswer>,
    peers: &Value,
) -> bool {
    let mut all_agree = true;
    println!(
        "{:<4} {:>7} {:>10} {:>10} {:>10} {:>10}  agree  what",
        "q", "rows", "weft ms", "duckdb ms", "chdb ms", "weft/best"
    );
    for q in questions {
        let w = &weft[q.id];
        let peer = |engine: &str| -> (f64, Option<Vec<Vec<Value>>>) {
            let e = &peers[engine]["queries"][q.id];
            if let Some(error) = e["error"].as_str() {
                // not compared: the engine could not answer (shown, so that its SQL is mended)
                println!("     {engine} {}: {error}", q.id);
                return (f64::NAN, None);
            }
            let rows = e["rows"].as_array().map(|r| {
                r.iter()
                    .map(|row| row.as_array().cloned().unwrap_or_default())
                    .collect()
            });
            (e["ms"].as_f64().unwrap_or(f64::NAN), rows)
        };
        let (d_ms, d_rows) = peer("duckdb");
        let (c_ms, c_rows) = peer("chdb");
        let agree = match &w.rows {
            None => "-",
            Some(rows) => {
                let check = |other: &Option<Vec<Vec<Value>>>| {
                    other
                        .as_ref()
                        .is_none_or(|o| same_rows(rows, o, q.tolerance))
                };
                let compared = d_rows.is_some() || c_rows.is_some();
                if compared && !w.partial && check(&d_rows) && check(&c_rows) {
                    "yes"
                } else {
                    all_agree = false;
                    "NO"
                }
            }
        };
        let best = d_ms.min(c_ms);
        println!(
            "{:<4} {:>7} {:>10.2} {:>10.2} {:>10.2} {:>10.3}  {:<5}  {}",
            q.id,
            w.rows.as_ref().map_or(0, Vec::len),
            w.ms,
            d_ms,
            c_ms,
            w.ms / best,
            agree,
            q.what
        );
        if agree == "NO" {
            let show = |rows: &Option<Vec<Vec<Value>>>| {
                rows.as_ref().map_or("-".into(), |rows| {
                    let mut r = rows.clone();
                    r.sort_by_key(|x| Value::Array(x.clone()).to_string());
                    format!(
                        "{} rows: {}",
                        r.len(),
                        r.iter()
                            .take(3)
                            .map(|x| Value::Array(x.clone()).to_string())
                            .collect::<Vec<_>>()
                            .join(" ")
                    )
                })
            };
            println!(
                "     weft:   {}{}",
                show(&w.rows),
                if w.partial { " (partial)" } else { "" }
            );
            println!("     duckdb: {}", show(&d_rows));
            println!("     chdb:   {}", show(&c_rows));
        }
    }
    all_agree
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_agree_within_each_column_s_tolerance() {
        let a = vec![vec![json!("x"), json!(3), json!(100.0)]];
        let near = vec![vec![json!("x"), json!(3), json!(104.0)]];
        let far = vec![vec![json!("x"), json!(3), json!(106.0)]];
        let tol = &[0.0, 0.0, 0.05];
        assert!(same_rows(&a, &near, tol));
        assert!(!same_rows(&a, &far, tol));
        assert!(!same_rows(&a, &near, &[]));
        let count = vec![vec![json!("x"), json!(4), json!(100.0)]];
        assert!(!same_rows(&a, &count, tol));
    }

    #[test]
    fn a_heatmap_answer_becomes_its_nonzero_cells() {
        let v = json!({"x": [10_000_000_000i64, 20_000_000_000i64], "y_upper_bounds": [0.0, 1.0, 2.0],
            "counts": [[1, 0, 2], [0, 3, 0]], "exemplars": [["a", null, "b"], [null, "c", null]]});
        let rows = heatmap_rows(&v).unwrap();
        assert_eq!(
            rows,
            vec![
                vec![json!(10_000_000), json!(-1075), json!(1), json!("a")],
                vec![json!(10_000_000), json!(1), json!(2), json!("b")],
                vec![json!(20_000_000), json!(0), json!(3), json!("c")],
            ]
        );
    }
}
