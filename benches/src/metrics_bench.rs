//! `weft-bench metrics`: metric points per second over OTLP/HTTP with durability on, bytes per
//! point on disk against Prometheus's own TSDB for the same points (written as OpenMetrics and
//! turned into blocks by `promtool tsdb create-blocks-from openmetrics`), and a fixed set of
//! `query_range` queries (the whole run, 15 s step) timed on Weft and on a Prometheus serving
//! those blocks, in the same run, with their series counts checked to agree.

use weft_bench::metrics::{MetricConfig, metric_batches, write_openmetrics, write_prometheus_text};

use super::*;

/// The `query_range` set: raw series, aggregations, a rate, ratios, `topk`, a regex selector.
const QUERIES: &[(&str, &str)] = &[
    ("M1 raw", "DCGM_FI_DEV_GPU_UTIL"),
    ("M2 avg by host", "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)"),
    (
        "M3 memory ratio",
        "max by (worker_id) (DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE))",
    ),
    (
        "M4 token rate",
        "sum by (worker_id) (rate(vllm:generation_tokens_total[1m]))",
    ),
    (
        "M5 p99 temp",
        "quantile(0.99, avg_over_time(DCGM_FI_DEV_GPU_TEMP[5m]))",
    ),
    (
        "M6 topk power",
        "topk(5, avg_over_time(DCGM_FI_DEV_POWER_USAGE[5m]))",
    ),
    (
        "M7 one worker",
        r#"{__name__=~"DCGM_FI_DEV_.*", worker_id="w-3"}"#,
    ),
    ("M8 kv pressure", "vllm:kv_cache_usage_perc > 0.95"),
];

fn encode(q: &str) -> String {
    let mut out = String::new();
    for b in q.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Best of `runs` timings of a range query, with the number of series it answered.
async fn time_query(
    client: &Client,
    base: &str,
    q: &str,
    start: u64,
    end: u64,
    runs: usize,
) -> anyhow::Result<(Duration, usize)> {
    let url = format!(
        "{base}/api/v1/query_range?query={}&start={start}&end={end}&step=15",
        encode(q)
    );
    let mut best = Duration::MAX;
    let mut series = 0;
    for _ in 0..runs + 1 {
        let started = Instant::now();
        let reply = client.get(&url, &[]).await?;
        let took = started.elapsed();
        anyhow::ensure!(
            reply.status == StatusCode::OK,
            "{url}: {} {}",
            reply.status,
            reply.text()
        );
        let v: serde_json::Value = serde_json::from_slice(&reply.body)?;
        series = v["data"]["result"].as_array().map_or(0, Vec::len);
        best = best.min(took);
    }
    Ok((best, series))
}

pub(crate) async fn metrics(
    cfg: MetricConfig,
    concurrency: usize,
    weft: Option<PathBuf>,
    runs: usize,
    server_args: Vec<String>,
    keep: Option<PathBuf>,
) -> anyhow::Result<()> {
    let extra: Vec<&str> = server_args.iter().map(String::as_str).collect();
    let bin = weft_binary(weft)?;
    let temp = tempfile::tempdir()?;
    let dir = keep.unwrap_or_else(|| temp.path().join("data"));
    println!(
        "generating {} points: {} series ({} workers x {} GPUs), {} samples each {} s apart (seed {})...",
        cfg.points(),
        cfg.series(),
        cfg.workers,
        cfg.gpus_per_worker,
        cfg.steps,
        cfg.interval_s,
        cfg.seed
    );
    let messages: Vec<(Bytes, usize)> = metric_batches(&cfg)
        .map(|(m, n)| (Bytes::from(m.encode_to_vec()), n))
        .collect();
    let encoded: usize = messages.iter().map(|(b, _)| b.len()).sum();
    let (mut server, _) = start_server(&bin, &dir, &extra).await?;
    let report = send(
        &server.otlp,
        Box::new(messages.into_iter()),
        "/v1/metrics",
        concurrency,
        0.0,
        None,
    )
    .await?;
    let points = report.spans;
    let rss = peak_rss_kib(server.child.id()).unwrap_or(0);
    println!(
        "metric ingest: {points} points ({:.1} MB of OTLP protobuf, {} requests) in {:.2} s: {:.0} points/s ({} retries after 429); server peak RSS {:.1} MiB",
        encoded as f64 / 1e6,
        report.messages,
        report.elapsed.as_secs_f64(),
        points as f64 / report.elapsed.as_secs_f64(),
        report.retries,
        rss as f64 / 1024.0
    );
    terminate(&mut server)?;
    drop(compacted(&dir)?);
    let all_bytes = dir_bytes(&dir);
    // RocksDB's own info logs and option files are not data
    let weft_bytes = all_bytes - logs_bytes(&dir);
    println!(
        "weft on disk after a clean stop and compaction: {weft_bytes} bytes = {:.3} bytes/point ({all_bytes} with RocksDB's LOG and OPTIONS files)",
        weft_bytes as f64 / points as f64
    );

    // the same points in Prometheus's TSDB
    let om = temp.path().join("data.om");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&om)?);
        write_openmetrics(&cfg, &mut f)?;
    }
    let tsdb = temp.path().join("tsdb");
    let started = Instant::now();
    let out = Command::new("promtool")
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&om)
        .arg(&tsdb)
        .output()
        .context("run promtool (Debian package prometheus)")?;
    anyhow::ensure!(
        out.status.success(),
        "promtool: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let prom_bytes = dir_bytes(&tsdb);
    println!(
        "prometheus TSDB blocks (promtool, {:.1} s): {prom_bytes} bytes = {:.3} bytes/point; weft / prometheus = {:.2}",
        started.elapsed().as_secs_f64(),
        prom_bytes as f64 / points as f64,
        weft_bytes as f64 / prom_bytes as f64
    );

    // query_range on both
    let config = temp.path().join("prometheus.yml");
    std::fs::write(&config, "global: {}\n")?;
    let port = free_port()?;
    let mut prom = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", tsdb.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--storage.tsdb.retention.time=100y")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start prometheus")?;
    let prom_url = format!("http://127.0.0.1:{port}");
    let client = Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = client.get(&format!("{prom_url}/-/ready"), &[]).await
            && r.status == StatusCode::OK
        {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "prometheus did not become ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let vm = victoria(&cfg, temp.path(), points).await?;
    let (mut server, _) = start_server(&bin, &dir, &extra).await?;
    let weft_url = format!("{}/prometheus", server.http);
    let start = cfg.start_s;
    let end = cfg.start_s + cfg.steps as u64 * cfg.interval_s;
    println!(
        "query_range over {} s at a 15 s step, best of {runs}:",
        end - start
    );
    let (mut total_w, mut total_p, mut total_v) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for (label, q) in QUERIES {
        let (w, ws) = time_query(&client, &weft_url, q, start, end, runs).await?;
        let (p, ps) = time_query(&client, &prom_url, q, start, end, runs).await?;
        anyhow::ensure!(
            ws == ps,
            "{label}: weft answered {ws} series, prometheus {ps}"
        );
        total_w += w;
        total_p += p;
        let vm_text = match &vm {
            Some(vm) => {
                let (v, vs) = time_query(&client, &vm.url, q, start, end, runs).await?;
                total_v += v;
                format!(
                    "  victoriametrics {:>8.2} ms ({vs} series)",
                    v.as_secs_f64() * 1e3
                )
            }
            None => String::new(),
        };
        println!(
            "  {label:<18} {ws:>5} series  weft {:>8.2} ms  prometheus {:>8.2} ms  ratio {:.2}{vm_text}",
            w.as_secs_f64() * 1e3,
            p.as_secs_f64() * 1e3,
            w.as_secs_f64() / p.as_secs_f64()
        );
    }
    let vm_total = match &vm {
        Some(_) => format!(
            "  victoriametrics {:>8.2} ms (weft / victoriametrics {:.2})",
            total_v.as_secs_f64() * 1e3,
            total_w.as_secs_f64() / total_v.as_secs_f64()
        ),
        None => String::new(),
    };
    println!(
        "  {:<18}        weft {:>8.2} ms  prometheus {:>8.2} ms  ratio {:.2}{vm_total}",
        "total",
        total_w.as_secs_f64() * 1e3,
        total_p.as_secs_f64() * 1e3,
        total_w.as_secs_f64() / total_p.as_secs_f64()
    );
    terminate(&mut server)?;
    let _ = prom.kill();
    let _ = prom.wait();
    if let Some(mut vm) = vm {
        let _ = vm.child.kill();
        let _ = vm.child.wait();
    }
    Ok(())
}

/// A VictoriaMetrics serving the same points.
struct Victoria {
    child: Child,
    url: String,
}

/// Starts Debian's VictoriaMetrics on an empty directory, imports the points (Prometheus text,
/// millisecond timestamps) and reports its bytes per point; `None` when it is not installed.
async fn victoria(
    cfg: &MetricConfig,
    temp: &Path,
    points: usize,
) -> anyhow::Result<Option<Victoria>> {
    let Ok(bin) = which("victoria-metrics") else {
        println!("victoria-metrics not installed (Debian package victoria-metrics): left out");
        return Ok(None);
    };
    let data = temp.join("vm");
    let port = free_port()?;
    let child = Command::new(bin)
        .arg(format!("-storageDataPath={}", data.display()))
        .arg(format!("-httpListenAddr=127.0.0.1:{port}"))
        .arg("-retentionPeriod=100y")
        .arg("-search.latencyOffset=0s")
        // its rollup result cache would answer the timed runs from memory
        .arg("-search.disableCache")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start victoria-metrics")?;
    let url = format!("http://127.0.0.1:{port}");
    let client = Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = client.get(&format!("{url}/health"), &[]).await
            && r.status == StatusCode::OK
        {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "victoria-metrics did not become ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut text = Vec::new();
    write_prometheus_text(cfg, &mut text)?;
    let started = Instant::now();
    let reply = client
        .post(
            &format!("{url}/api/v1/import/prometheus"),
            &[("content-type", "text/plain")],
            Bytes::from(text),
        )
        .await?;
    anyhow::ensure!(
        reply.status.is_success(),
        "victoria-metrics import: {} {}",
        reply.status,
        reply.text()
    );
    client
        .get(&format!("{url}/internal/force_flush"), &[])
        .await?;
    let took = started.elapsed();
    // parts are written and merged in the background: measure once the size settles
    let mut bytes = dir_bytes(&data);
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = dir_bytes(&data);
        if now == bytes {
            break;
        }
        bytes = now;
    }
    println!(
        "victoriametrics (import {:.2} s): {bytes} bytes = {:.3} bytes/point",
        took.as_secs_f64(),
        bytes as f64 / points as f64
    );
    Ok(Some(Victoria { child, url }))
}

/// Bytes of RocksDB's info logs and option files in a store directory.
fn logs_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("LOG") || name.starts_with("OPTIONS")
        })
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

fn which(name: &str) -> anyhow::Result<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow::anyhow!("{name} not found"))
}
