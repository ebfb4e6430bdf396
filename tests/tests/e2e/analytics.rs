//! The LLM analytics end to end: generator data with its injected anomalies sent over
//! OTLP/HTTP to the real binary, every capability asked over HTTP and as a SQL table function,
//! answers checked against values computed directly from the generated spans.

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::Value;
use weft_bench::generator::{GenConfig, Generator, anomaly, batches};
use weft_tests::Weft;

use crate::common::*;

const STEP_NS: u64 = 10_000_000_000;

fn data(anomalies: bool) -> GenConfig {
    GenConfig {
        seed: 11,
        spans: 100_000,
        rate: 10.0,
        min_tokens: 8,
        max_tokens: 16,
        anomalies,
        ..Default::default()
    }
}

async fn load(c: &Client, w: &Weft, cfg: GenConfig, tenant: &str) {
    for m in batches(cfg, 2000) {
        let r = c
            .post(
                &format!("{}/v1/traces", w.otlp),
                &[
                    ("content-type", "application/x-protobuf"),
                    ("x-scope-orgid", tenant),
                ],
                m.encode_to_vec(),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
}

async fn rows(c: &Client, w: &Weft, query: &str) -> Vec<Value> {
    let r = c
        .post(
            &format!("{}/api/v1/sql", w.http),
            &[
                ("content-type", "application/json"),
                ("x-scope-orgid", "fleet"),
            ],
            serde_json::json!({ "query": query }).to_string(),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{query}: {}", r.text());
    r.json().unwrap()["rows"].as_array().unwrap().clone()
}

async fn get(c: &Client, w: &Weft, path: &str, tenant: &str) -> (u16, Value) {
    let r = c
        .get(
            &format!("{}/api/v1/{path}", w.http),
            &[("x-scope-orgid", tenant)],
        )
        .await
        .unwrap();
    (r.status.as_u16(), r.json().unwrap_or(Value::Null))
}

async fn ok(c: &Client, w: &Weft, path: &str, tenant: &str) -> Value {
    let (status, body) = get(c, w, path, tenant).await;
    assert_eq!(status, 200, "{path}: {body}");
    body
}

fn attr<'a>(s: &'a Span, key: &str) -> Option<&'a any_value::Value> {
    s.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn text(s: &Span, key: &str) -> Option<String> {
    match attr(s, key) {
        Some(any_value::Value::StringValue(v)) => Some(v.clone()),
        _ => None,
    }
}

fn number(s: &Span, key: &str) -> Option<f64> {
    match attr(s, key) {
        Some(any_value::Value::DoubleValue(v)) => Some(*v),
        Some(any_value::Value::IntValue(v)) => Some(*v as f64),
        _ => None,
    }
}

/// What the generated data says directly.
#[derive(Default)]
struct Truth {
    /// (service, span name) -> spans
    operations: BTreeMap<(String, String), u64>,
    /// (service, span name) -> span durations (ns)
    durations: BTreeMap<(String, String), Vec<f64>>,
    /// summed duration of the root spans (ns)
    roots_ns: f64,
    decode_tokens: u64,
    /// (10 s step, log2 bucket of the token latency in ms) -> tokens
    itl_cells: BTreeMap<(u64, i64), u64>,
    /// (model version, adapter, worker) -> (requests, spans of the generate subtree)
    dims: BTreeMap<(String, String, String), (u64, u64)>,
    /// model -> time-to-first-token values (ms)
    ttft: BTreeMap<String, Vec<f64>>,
    /// input tokens of every generate span, by model
    input_tokens: BTreeMap<String, Vec<f64>>,
    quarters: Vec<(u64, u64)>,
}

fn truth(cfg: GenConfig) -> Truth {
    let mut g = Generator::new(cfg);
    let mut t = Truth {
        quarters: (0..4).map(|q| g.quarter_ns(q)).collect(),
        ..Default::default()
    };
    while let Some(req) = g.next_request() {
        let generate = req
            .spans
            .iter()
            .find(|(_, s)| s.name == "llm.generate")
            .map(|(_, s)| s.clone())
            .unwrap();
        let key = (
            text(&generate, "llm.model_version").unwrap(),
            text(&generate, "llm.lora_adapter").unwrap(),
            text(&generate, "worker.id").unwrap(),
        );
        let model = text(&generate, "gen_ai.request.model").unwrap();
        let e = t.dims.entry(key).or_default();
        e.0 += 1;
        for (service, s) in &req.spans {
            let service = weft_bench::generator::SERVICES[*service].to_owned();
            let ns = (s.end_time_unix_nano - s.start_time_unix_nano) as f64;
            if s.parent_span_id.iter().all(|b| *b == 0) {
                t.roots_ns += ns;
            }
            t.durations
                .entry((service.clone(), s.name.clone()))
                .or_default()
                .push(ns);
            *t.operations.entry((service, s.name.clone())).or_default() += 1;
            if s.span_id == generate.span_id || s.parent_span_id == generate.span_id {
                e.1 += 1;
            }
            if s.name == "llm.decode.token" {
                t.decode_tokens += 1;
                let ms = number(s, "llm.token.latency_ms").unwrap();
                let cell = (
                    s.start_time_unix_nano / STEP_NS * STEP_NS,
                    ms.log2().ceil() as i64,
                );
                *t.itl_cells.entry(cell).or_default() += 1;
            }
        }
        t.ttft
            .entry(model.clone())
            .or_default()
            .push(number(&generate, "gen_ai.latency.time_to_first_token").unwrap() * 1000.0);
        let input = number(&generate, "gen_ai.usage.input_tokens")
            .or_else(|| number(&generate, "gen_ai.usage.prompt_tokens"))
            .unwrap();
        t.input_tokens.entry(model).or_default().push(input);
    }
    t
}

/// The `calls` of a graph's nodes or edges, by id, in the answer's order.
fn calls_by_id(g: &serde_json::Value, what: &str) -> Vec<(String, u64)> {
    g[what]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["id"].as_str().unwrap().to_owned(),
                e["calls"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// PostgreSQL's `percentile_cont` of sorted values.
fn percentile_cont(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analytics_answer_from_the_data_and_find_the_injected_anomalies() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("weft.toml");
    std::fs::write(
        &config,
        "[context_windows]\n\"llama-3.1-8b\" = 2500\n\"qwen2.5\" = 3000\n",
    )
    .unwrap();
    let w = Weft::start(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let c = Client::new();
    load(&c, &w, data(true), "fleet").await;
    load(&c, &w, data(false), "clean").await;
    let t = truth(data(true));

    // operation graph: every (service, operation) with its calls; token spans under generate;
    // from the blocks' rollups (percentiles within 1%), and exact on request (from SQL)
    let exact = ok(&c, &w, "lineage/operations?exact=true", "fleet").await;
    let g = ok(&c, &w, "lineage/operations", "fleet").await;
    assert_eq!(g["relative_error"], 0.01, "{g}");
    assert!(exact.get("relative_error").is_none(), "{exact}");
    for (g, tolerance) in [(&exact, 1e-6), (&g, 0.01)] {
        let nodes = g["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), t.operations.len(), "{g}");
        for ((service, name), calls) in &t.operations {
            let n = nodes
                .iter()
                .find(|n| n["title"] == service.as_str() && n["subtitle"] == name.as_str())
                .unwrap_or_else(|| panic!("no node {service}/{name}"));
            assert_eq!(n["calls"], *calls, "{n}");
            assert_eq!(n["mainstat"], *calls);
            // percentiles, and the node's share of the roots' summed duration
            let mut d = t.durations[&(service.clone(), name.clone())].clone();
            d.sort_by(f64::total_cmp);
            for (key, q) in [("p50_ms", 0.5), ("p99_ms", 0.99)] {
                let want = percentile_cont(&d, q) / 1e6;
                let got = n[key].as_f64().unwrap();
                assert!(
                    (got - want).abs() <= tolerance * want,
                    "{service}/{name} {key}: {got} vs {want}"
                );
            }
            let share = d.iter().sum::<f64>() / t.roots_ns;
            let got = n["latency_share"].as_f64().unwrap();
            assert!(
                (got - share).abs() <= 1e-6 * share,
                "{service}/{name}: share {got} vs {share}"
            );
        }
        // the same edges both ways
        assert_eq!(calls_by_id(g, "edges"), calls_by_id(&exact, "edges"));
    }
    let edge = g["edges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["target"] == "inference-engine/llm.decode.token")
        .unwrap();
    assert_eq!(edge["source"], "inference-engine/llm.generate");
    assert_eq!(edge["calls"], t.decode_tokens);
    let services = ok(&c, &w, "lineage/operations?level=service", "fleet").await;
    assert_eq!(services["nodes"].as_array().unwrap().len(), 6, "{services}");
    assert!(
        services["edges"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["source"] != e["target"]),
        "{services}"
    );
    let services_exact = ok(
        &c,
        &w,
        "lineage/operations?level=service&exact=true",
        "fleet",
    )
    .await;
    for what in ["nodes", "edges"] {
        assert_eq!(
            calls_by_id(&services, what),
            calls_by_id(&services_exact, what),
            "{what}"
        );
    }

    // dimension lineage: requests and every span of their generate subtrees, per combination
    let d = ok(
        &c,
        &w,
        "lineage/dimensions?dims=llm.model_version,llm.lora_adapter,worker.id",
        "fleet",
    )
    .await;
    let drows = d["rows"].as_array().unwrap();
    assert_eq!(drows.len(), t.dims.len());
    for ((version, adapter, worker), (requests, spans)) in &t.dims {
        let r = drows
            .iter()
            .find(|r| {
                r["llm.model_version"] == version.as_str()
                    && r["llm.lora_adapter"] == adapter.as_str()
                    && r["worker.id"] == worker.as_str()
            })
            .unwrap();
        assert_eq!(r["requests"], *requests, "{r}");
        assert_eq!(r["spans"], *spans, "{r}");
    }
    // narrowed by an inherited dimension: only that worker's rows
    let d7 = ok(
        &c,
        &w,
        "lineage/dimensions?dims=llm.model_version&attr.worker.id=worker-7",
        "fleet",
    )
    .await;
    let want: u64 = t
        .dims
        .iter()
        .filter(|((_, _, wk), _)| wk == "worker-7")
        .map(|(_, (r, _))| r)
        .sum();
    let got: u64 = d7["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["requests"].as_u64().unwrap())
        .sum();
    assert_eq!(got, want, "{d7}");

    // heatmap of decode token latency: every cell as counted from the data
    let h = ok(&c, &w, "heatmap?y=itl&step=10s", "fleet").await;
    let xs: Vec<u64> = h["x"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    let bounds: Vec<f64> = h["y_upper_bounds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_f64().unwrap())
        .collect();
    let mut seen = BTreeMap::new();
    for (i, row) in h["counts"].as_array().unwrap().iter().enumerate() {
        for (j, n) in row.as_array().unwrap().iter().enumerate() {
            let n = n.as_u64().unwrap();
            if n > 0 {
                seen.insert((xs[i], bounds[j].log2().round() as i64), n);
                assert!(h["exemplars"][i][j].is_string());
            }
        }
    }
    assert_eq!(seen, t.itl_cells);
    // the same cells from SQL (a group asks it): the per-block heat rollups answer exactly
    let hs = ok(&c, &w, "heatmap?y=itl&step=10s&by=service", "fleet").await;
    assert_eq!(hs["x"], h["x"]);
    assert_eq!(hs["y_upper_bounds"], h["y_upper_bounds"]);
    assert_eq!(hs["counts"], h["counts"]);
    if hs["groups"].as_array().unwrap().len() == 1 {
        assert_eq!(hs["exemplars"], h["exemplars"]);
    }
    // the same as a SQL table function
    let sq = rows(
        &c,
        &w,
        "SELECT sum(count) FROM heatmap(y => 'itl', step => '10s')",
    )
    .await;
    assert_eq!(sq[0][0], t.decode_tokens, "{sq:?}");
    // by token position
    let hp = ok(&c, &w, "heatmap?x=token_index", "fleet").await;
    assert_eq!(hp["x"][0], 0);
    assert_eq!(hp["x_axis"], "token_index");

    // percentiles: exact equals percentile_cont of the data; sketches within 1%
    let p = ok(
        &c,
        &w,
        "percentiles?signal=ttft&by=gen_ai.request.model&step=1h&q=0.5,0.99&exact=true",
        "fleet",
    )
    .await;
    let ps = ok(
        &c,
        &w,
        "percentiles?signal=ttft&by=gen_ai.request.model&step=1h&q=0.5,0.99",
        "fleet",
    )
    .await;
    assert_eq!(ps["relative_error"], 0.01);
    for (model, values) in &t.ttft {
        let mut v = values.clone();
        v.sort_by(f64::total_cmp);
        let find = |doc: &Value| -> Value {
            doc["series"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["labels"]["gen_ai.request.model"] == model.as_str())
                .unwrap()["points"][0][1]
                .clone()
        };
        let (exact, sketch) = (find(&p), find(&ps));
        for q in [0.5, 0.99] {
            let want = percentile_cont(&v, q);
            let key = format!("{q}");
            let e = exact[&key].as_f64().unwrap();
            assert!(
                (e - want).abs() < 1e-6 * want,
                "{model} q{q}: {e} vs {want}"
            );
            let s = sketch[&key].as_f64().unwrap();
            // interpolated as percentile_cont, from bins each within 1%
            assert!(
                (s - want).abs() <= 0.01 * want + 1e-9,
                "{model} q{q}: sketch {s} vs exact {want} (over 1%)"
            );
        }
    }

    // saturation against the configured windows (8b: 2,500 tokens; qwen2.5 by prefix: 3,000)
    let s = ok(&c, &w, "saturation", "fleet").await;
    for (model, window) in [("llama-3.1-8b", 2500.0), ("qwen2.5-32b", 3000.0)] {
        let inputs = &t.input_tokens[model];
        let row = s["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["model"] == model)
            .unwrap();
        let at = |f: f64| inputs.iter().filter(|x| **x >= f * window).count() as u64;
        assert_eq!(row["requests"], inputs.len() as u64);
        assert_eq!(row["at_80"], at(0.8), "{row}");
        assert_eq!(row["at_95"], at(0.95), "{row}");
    }

    // drift: the slow adapter's decode against the rest of the same model
    let dr = ok(
        &c,
        &w,
        "drift?signal=itl&cohort=llm.model_version&a=llama-3.1-8b-2025-10&b=llama-3.1-70b-2025-09",
        "fleet",
    )
    .await;
    let js = dr["js_divergence"].as_f64().unwrap();
    assert!(js > 0.5 && js <= 1.0, "{dr}");
    let same = ok(
        &c,
        &w,
        "drift?signal=ttft&cohort=llm.model_version&a=llama-3.1-8b-2025-10&b=llama-3.1-8b-2025-10",
        "fleet",
    )
    .await;
    assert_eq!(same["js_divergence"], 0.0, "{same}");

    // anomalies: both injected windows, their causes first
    let a = ok(&c, &w, "anomalies?step=10s", "fleet").await;
    let incidents = a["incidents"].as_array().unwrap();
    let has = |i: &Value, signal: &str| {
        i["signal"] == signal
            || i["co_signals"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["signal"] == signal)
    };
    let near = |a: &Value, b: u64| a.as_u64().unwrap().abs_diff(b) <= STEP_NS;
    let decode = incidents
        .iter()
        .find(|i| has(i, "decode_latency"))
        .unwrap_or_else(|| panic!("no decode incident: {a}"));
    assert!(
        near(&decode["start_ns"], t.quarters[1].0) && near(&decode["end_ns"], t.quarters[1].1),
        "decode window {:?}: {decode}",
        t.quarters[1]
    );
    assert_eq!(
        decode["attribution"][0]["dimension"], "llm.model_version,llm.lora_adapter",
        "{decode}"
    );
    assert_eq!(
        decode["attribution"][0]["value"],
        format!("{},{}", anomaly::SLOW_VERSION, anomaly::SLOW_ADAPTER)
    );
    let ttft = incidents
        .iter()
        .find(|i| has(i, "ttft"))
        .unwrap_or_else(|| panic!("no ttft incident: {a}"));
    assert!(
        near(&ttft["start_ns"], t.quarters[2].0) && near(&ttft["end_ns"], t.quarters[2].1),
        "ttft window {:?}: {ttft}",
        t.quarters[2]
    );
    let cause = &ttft["attribution"][0];
    assert_eq!(cause["dimension"], "worker.id", "{ttft}");
    assert_eq!(cause["value"], anomaly::SLOW_WORKER);
    assert!(cause["lift"].as_f64().unwrap() > 3.0, "{cause}");
    // the same scan in SQL
    let sa = rows(
        &c,
        &w,
        "SELECT signal, cause_dimension, cause_value FROM anomalies(signal => 'ttft', step => '10s')",
    )
    .await;
    assert_eq!(sa.len(), 1, "{sa:?}");
    assert_eq!(sa[0][2], anomaly::SLOW_WORKER);
    // a run of the same size without anomalies has none
    let clean = ok(&c, &w, "anomalies?step=10s", "clean").await;
    assert_eq!(clean["incidents"], serde_json::json!([]), "{clean}");

    // request lineage of one trace: its operations, model version, worker, GPU and tokens
    let trace = hex::encode(
        batches(data(true), 2000).next().unwrap().resource_spans[0].scope_spans[0].spans[0]
            .trace_id
            .clone(),
    );
    let r = ok(
        &c,
        &w,
        &format!("lineage/request?trace_id={trace}"),
        "fleet",
    )
    .await;
    let types: std::collections::BTreeSet<&str> = r["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["type"].as_str().unwrap())
        .collect();
    for ty in [
        "service",
        "operation",
        "model_version",
        "worker",
        "gpu",
        "tokens",
    ] {
        assert!(types.contains(ty), "{ty} missing: {r}");
    }

    // bad parameters are named
    let (status, body) = get(&c, &w, "heatmap?bukets=log2", "fleet").await;
    assert_eq!(status, 400);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("bukets: unknown parameter"),
        "{body}"
    );
    let (status, body) = get(&c, &w, "percentiles?signal=speed", "fleet").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("not a signal"),
        "{body}"
    );
}
