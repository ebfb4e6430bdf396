//! `weft-bench tempo`: Tempo's API against a running server holding the generated data (same
//! `--spans` / `--seed`): trace by id through `/api/v2/traces/{id}` (protobuf, as Grafana asks
//! for it) and TraceQL searches through `/api/search` (a page of 20, three spans per spanset),
//! each next to the SQL that selects the same spans, so the cost of TraceQL over the shared row
//! selection shows as a ratio.

use super::*;

/// TraceQL searches and the SQL selecting the same spans.
pub(crate) const SEARCHES: &[(&str, &str, &str)] = &[
    (
        "T1 model version, slow",
        r#"{ span.llm.model_version = "llama-3.1-70b-2025-09" && duration > 2s }"#,
        "SELECT trace_id, span_id FROM spans WHERE \"llm.model_version\" = 'llama-3.1-70b-2025-09' AND duration_ns > 2000000000 ORDER BY start_time DESC LIMIT 60",
    ),
    (
        "T2 service errors",
        r#"{ resource.service.name = "inference-engine" && status = error }"#,
        "SELECT trace_id, span_id FROM spans WHERE service_name = 'inference-engine' AND status_code = 'ERROR' ORDER BY start_time DESC LIMIT 60",
    ),
    (
        "T3 slow generate under a client span",
        r#"{ kind = client } > { name = "llm.generate" && duration > 3s }"#,
        "SELECT trace_id, span_id FROM spans WHERE name = 'llm.generate' AND duration_ns > 3000000000 ORDER BY start_time DESC LIMIT 60",
    ),
    (
        "T4 adapter and worker, two spansets",
        r#"{ span.llm.lora_adapter = "sql-gen-v1" } && { span.worker.id = "worker-3" && status = error }"#,
        "SELECT trace_id, span_id FROM spans WHERE \"llm.lora_adapter\" = 'sql-gen-v1' AND \"worker.id\" = 'worker-3' AND status_code = 'ERROR' ORDER BY start_time DESC LIMIT 60",
    ),
    (
        "T5 no answer (generate is never a server's child)",
        r#"{ kind = server } > { name = "llm.generate" && duration > 3s }"#,
        "SELECT trace_id, span_id FROM spans WHERE name = 'llm.generate' AND duration_ns > 3000000000 ORDER BY start_time DESC LIMIT 60",
    ),
    (
        "T6 every span",
        "{ }",
        "SELECT trace_id, span_id FROM spans ORDER BY start_time DESC LIMIT 60",
    ),
];

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

fn percentile(times: &mut [Duration], q: f64) -> f64 {
    times.sort();
    times[((times.len() as f64 * q) as usize).min(times.len() - 1)].as_secs_f64() * 1e3
}

pub(crate) async fn tempo(target: &str, ids: &[String], runs: usize) -> anyhow::Result<()> {
    let client = Client::new();
    let base = target.trim_end_matches('/');
    let mut times = Vec::with_capacity(ids.len());
    for id in ids {
        let started = Instant::now();
        let reply = client
            .get(
                &format!("{base}/api/v2/traces/{id}"),
                &[("accept", "application/protobuf")],
            )
            .await?;
        times.push(started.elapsed());
        if reply.status != StatusCode::OK {
            bail!("trace {id}: {} {}", reply.status, reply.text());
        }
    }
    println!(
        "trace by id, /api/v2/traces (protobuf), {} lookups: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms",
        times.len(),
        percentile(&mut times, 0.5),
        percentile(&mut times, 0.9),
        percentile(&mut times, 0.99)
    );
    println!("| search | TraceQL p50 ms | SQL p50 ms | ratio | traces |");
    println!("|---|---|---|---|---|");
    for (name, q, sql) in SEARCHES {
        let url = format!("{base}/api/search?q={}&limit=20&spss=3", encode(q));
        let mut traceql = Vec::new();
        let mut found = 0;
        for i in 0..=runs {
            let started = Instant::now();
            let reply = client.get(&url, &[]).await?;
            if i > 0 {
                traceql.push(started.elapsed());
            }
            if reply.status != StatusCode::OK {
                bail!("{name}: {} {}", reply.status, reply.text());
            }
            found = reply.json()?["traces"].as_array().map_or(0, Vec::len);
        }
        let mut plain = Vec::new();
        let body = serde_json::json!({ "query": sql }).to_string();
        for i in 0..=runs {
            let started = Instant::now();
            let reply = client
                .post(
                    &format!("{base}/api/v1/sql"),
                    &[("content-type", "application/json")],
                    body.clone(),
                )
                .await?;
            if i > 0 {
                plain.push(started.elapsed());
            }
            if reply.status != StatusCode::OK {
                bail!("{name} SQL: {} {}", reply.status, reply.text());
            }
        }
        let (t, s) = (percentile(&mut traceql, 0.5), percentile(&mut plain, 0.5));
        println!("| {name} | {t:.1} | {s:.1} | {:.2} | {found} |", t / s);
    }
    Ok(())
}
