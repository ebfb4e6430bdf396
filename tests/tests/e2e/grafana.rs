//! The shipped Grafana set-up: every panel query of the "LLM serving" dashboard, run against
//! the real binary fed generator spans and GPU metrics, as Grafana would send it (PostgreSQL
//! panels over the PostgreSQL wire with Grafana's time macros expanded, Prometheus panels
//! through the Prometheus API, Tempo panels through Tempo's search), must return data; every
//! data source a panel names is provisioned.

use prost::Message;
use serde_json::Value;
use weft_bench::generator::GenConfig;
use weft_bench::logs::{LogConfig, log_batches};
use weft_bench::metrics::{MetricConfig, metric_batches};
use weft_bench::pgclient::PgClient;
use weft_tests::Weft;

use crate::common::*;

const FROM: &str = "2025-11-30T00:00:00Z";
const TO: &str = "2025-11-30T01:00:00Z";
const FROM_S: u64 = 1_764_460_800;

fn grafana_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("grafana")
}

/// Grafana's PostgreSQL macros for the dashboard's range, as its macro engine writes them.
fn expand(sql: &str) -> String {
    let mut out = sql
        .replace("$__timeFrom()", &format!("'{FROM}'"))
        .replace("$__timeTo()", &format!("'{TO}'"));
    while let Some(at) = out.find("$__timeFilter(") {
        let rest = &out[at + "$__timeFilter(".len()..];
        let close = rest.find(')').unwrap();
        let column = rest[..close].to_owned();
        out = format!(
            "{}{column} BETWEEN '{FROM}' AND '{TO}'{}",
            &out[..at],
            &rest[close + 1..]
        );
    }
    assert!(
        !out.contains("$__"),
        "a macro the test does not expand: {out}"
    );
    out
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The Loki data source: health check, labels, values, log queries as Grafana sends them
/// (nanosecond `start`/`end`, `limit`, `direction`), and the trace-to-logs query the Tempo
/// data source is provisioned with.
async fn loki(c: &Client, w: &Weft, datasources: &str) {
    let get = |path: String| async move {
        let r = c.get(&format!("{}/loki{path}", w.http), &[]).await.unwrap();
        (r.status.as_u16(), r.json().unwrap_or(Value::Null), r.text())
    };
    let (s, health, _) = get("/api/v1/query?query=vector(1)%2Bvector(1)".into()).await;
    assert_eq!(s, 200);
    assert_eq!(health["data"]["result"][0]["value"][1], "2", "{health}");
    let (_, labels, _) = get("/api/v1/labels".into()).await;
    let labels: Vec<&str> = labels["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert!(
        labels.contains(&"service_name") && labels.contains(&"trace_id"),
        "{labels:?}"
    );
    let (_, services, _) = get("/api/v1/label/service_name/values".into()).await;
    let service = services["data"][0].as_str().unwrap().to_owned();
    let range = format!("start={FROM_S}000000000&end={}000000000", FROM_S + 3600);
    let count = |q: String| async move { sql_rows(c, w, None, &q).await[0][0].as_u64().unwrap() };
    // a service's newest records, newest first, at most `limit`
    let (s, body, text) = get(format!(
        "/api/v1/query_range?query={}&{range}&limit=50&direction=backward",
        encode(&format!("{{service_name=\"{service}\"}}"))
    ))
    .await;
    assert_eq!(s, 200, "{text}");
    assert_eq!(body["data"]["resultType"], "streams");
    let mut times: Vec<u64> = Vec::new();
    for stream in body["data"]["result"].as_array().unwrap() {
        assert_eq!(stream["stream"]["service_name"], service.as_str());
        for v in stream["values"].as_array().unwrap() {
            times.push(v[0].as_str().unwrap().parse().unwrap());
            assert!(v[1].is_string());
        }
    }
    let want = count(format!(
        "SELECT count(*) FROM logs WHERE service_name = '{service}'"
    ))
    .await;
    assert_eq!(times.len() as u64, want.min(50));
    // the trace-to-logs query, as provisioned, for a trace that has records
    let template = datasources
        .lines()
        .find_map(|l| l.trim().strip_prefix("query: '"))
        .and_then(|q| q.strip_suffix('\''))
        .unwrap()
        .replace("$${__span.traceId}", "TRACE");
    let trace = sql_rows(
        c,
        w,
        None,
        "SELECT trace_id FROM logs WHERE trace_id IS NOT NULL LIMIT 1",
    )
    .await[0][0]
        .as_str()
        .unwrap()
        .to_owned();
    let (s, body, text) = get(format!(
        "/api/v1/query_range?query={}&{range}&limit=1000",
        encode(&template.replace("TRACE", &trace))
    ))
    .await;
    assert_eq!(s, 200, "{text}");
    let lines: usize = body["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|st| {
            assert_eq!(st["stream"]["trace_id"], trace.as_str());
            st["values"].as_array().unwrap().len()
        })
        .sum();
    let want = count(format!(
        "SELECT count(*) FROM logs WHERE trace_id = '{trace}'"
    ))
    .await;
    assert!(want > 0);
    assert_eq!(lines as u64, want);
    // a line filter, and a metric query refused by name
    let (s, body, _) = get(format!(
        "/api/v1/query_range?query={}&{range}&limit=5000",
        encode(&format!("{{service_name=\"{service}\"}} |= \"a\""))
    ))
    .await;
    assert_eq!(s, 200);
    let filtered: usize = body["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|st| st["values"].as_array().unwrap().len())
        .sum();
    let want = count(format!(
        "SELECT count(*) FROM logs WHERE service_name = '{service}' AND strpos(body, 'a') > 0"
    ))
    .await;
    assert_eq!(filtered as u64, want.min(5000));
    let (s, _, text) = get(format!(
        "/api/v1/query_range?query={}&{range}",
        encode("rate({a=\"b\"}[1m])")
    ))
    .await;
    assert_eq!(s, 400);
    assert!(text.contains("stream selector"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_panel_returns_data() {
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(grafana_dir().join("dashboards/llm-serving.json")).unwrap(),
    )
    .unwrap();
    let datasources =
        std::fs::read_to_string(grafana_dir().join("provisioning/datasources/weft.yaml")).unwrap();
    for uid in [
        "weft-tempo",
        "weft-jaeger",
        "weft-prometheus",
        "weft-postgres",
        "weft-loki",
    ] {
        assert!(
            datasources.contains(&format!("uid: {uid}")),
            "{uid} not provisioned"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let w = Weft::start(dir.path(), &[]);
    let c = Client::new();
    let spans = GenConfig {
        seed: 9,
        spans: 30_000,
        rate: 10.0,
        min_tokens: 8,
        max_tokens: 16,
        ..Default::default()
    };
    send_generated(&c, &w, spans, None).await;
    let metrics = MetricConfig {
        workers: 4,
        gpus_per_worker: 2,
        steps: 360,
        ..Default::default()
    };
    for (m, _) in metric_batches(&metrics) {
        let r = c
            .post(
                &format!("{}/v1/metrics", w.otlp),
                &[("content-type", "application/x-protobuf")],
                m.encode_to_vec(),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }

    for m in log_batches(LogConfig {
        records: 6000,
        ..Default::default()
    }) {
        let r = c
            .post(
                &format!("{}/v1/logs", w.otlp),
                &[("content-type", "application/x-protobuf")],
                m.encode_to_vec(),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    loki(&c, &w, &datasources).await;

    let mut pg = PgClient::connect(&format!("127.0.0.1:{}", w.pg), "weft")
        .await
        .unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 8);
    for panel in panels {
        let title = panel["title"].as_str().unwrap();
        for target in panel["targets"].as_array().unwrap() {
            let uid = target["datasource"]["uid"].as_str().unwrap();
            assert!(
                datasources.contains(&format!("uid: {uid}")),
                "{title}: {uid}"
            );
            let rows = match uid {
                "weft-postgres" => {
                    let sql = expand(target["rawSql"].as_str().unwrap());
                    pg.query(&sql)
                        .await
                        .unwrap_or_else(|e| panic!("{title}: {sql}: {e}"))
                }
                "weft-prometheus" => {
                    let expr = target["expr"].as_str().unwrap();
                    let r = c
                        .get(
                            &format!(
                                "{}/prometheus/api/v1/query_range?query={}&start={FROM_S}&end={}&step=60",
                                w.http,
                                encode(expr),
                                FROM_S + 3600
                            ),
                            &[],
                        )
                        .await
                        .unwrap();
                    assert_eq!(r.status, 200, "{title}: {}", r.text());
                    let body = r.json().unwrap();
                    body["data"]["result"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|s| s["values"].as_array().unwrap().len())
                        .sum()
                }
                "weft-tempo" => {
                    let q = target["query"].as_str().unwrap();
                    let r = c
                        .get(
                            &format!(
                                "{}/api/search?q={}&limit={}&spss={}&start={FROM_S}&end={}",
                                w.http,
                                encode(q),
                                target["limit"],
                                target["spss"],
                                FROM_S + 3600
                            ),
                            &[],
                        )
                        .await
                        .unwrap();
                    assert_eq!(r.status, 200, "{title}: {}", r.text());
                    r.json().unwrap()["traces"].as_array().unwrap().len()
                }
                other => panic!("{title}: unknown data source {other}"),
            };
            assert!(rows > 0, "{title} ({uid}) returned no data");
        }
    }
}
