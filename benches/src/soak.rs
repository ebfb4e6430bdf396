//! `weft-bench soak --minutes N`: a server started on a fresh data directory takes generated
//! traffic at a steady rate (spans stamped with the wall clock, so flushes, merges and retention
//! run as in production) and a mix of queries (trace by id, native search, SQL over HTTP, SQL
//! over the PostgreSQL wire) for N minutes. Every `--every` it prints the server's RSS, open
//! files, data size, spans acknowledged and refused, and per query kind the count, p50, p99
//! and errors: flat columns are the result.

use std::collections::VecDeque;
use std::sync::Mutex;

use weft_bench::pgclient::PgClient;

use super::*;

pub(crate) struct SoakOpts {
    pub minutes: f64,
    pub spans_per_sec: usize,
    pub every: Duration,
    pub weft: Option<PathBuf>,
    pub retention: String,
}

const KINDS: [&str; 4] = ["by-id", "search", "sql", "pg"];

#[derive(Default)]
struct Window {
    acked: u64,
    refused: u64,
    ingest_errors: u64,
    /// Per query kind: latencies and errors.
    latencies: [Vec<Duration>; 4],
    errors: [u64; 4],
}

pub(crate) fn kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn ms(times: &mut [Duration], q: f64) -> f64 {
    if times.is_empty() {
        return f64::NAN;
    }
    times.sort();
    times[((times.len() as f64 * q) as usize).min(times.len() - 1)].as_secs_f64() * 1e3
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
}

pub(crate) async fn soak(opts: SoakOpts) -> anyhow::Result<()> {
    let bin = weft_binary(opts.weft)?;
    let dir = tempfile::tempdir()?;
    let (mut server, _) = start_server(&bin, dir.path(), &["--retention", &opts.retention]).await?;
    let pid = server.child.id();
    let window = Arc::new(Mutex::new(Window::default()));
    let recent: Arc<Mutex<VecDeque<String>>> = Default::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    println!(
        "soak: {} min, {} spans/s, retention {}, queries: {} in turn, 4 a second",
        opts.minutes,
        opts.spans_per_sec,
        opts.retention,
        KINDS.join(", ")
    );

    // ingest: each second, a fresh second of traffic stamped now
    let ingest = {
        let (window, recent, stop, otlp) = (
            window.clone(),
            recent.clone(),
            stop.clone(),
            server.otlp.clone(),
        );
        let per_sec = opts.spans_per_sec;
        tokio::spawn(async move {
            let client = Client::new();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut second = 0u64;
            while !stop.load(Ordering::Acquire) {
                tick.tick().await;
                second += 1;
                let cfg = GenConfig {
                    seed: 0x50a4 ^ second,
                    spans: per_sec,
                    start_ns: now_ns(),
                    rate: 200.0,
                    ..Default::default()
                };
                for message in batches(cfg, 2000) {
                    let spans: u64 = message
                        .resource_spans
                        .iter()
                        .flat_map(|r| &r.scope_spans)
                        .map(|s| s.spans.len() as u64)
                        .sum();
                    let id = message
                        .resource_spans
                        .first()
                        .and_then(|r| r.scope_spans.first())
                        .and_then(|s| s.spans.first())
                        .map(|s| hex::encode(&s.trace_id));
                    let reply = client
                        .post(
                            &format!("{otlp}/v1/traces"),
                            &[("content-type", "application/x-protobuf")],
                            message.encode_to_vec(),
                        )
                        .await;
                    let mut w = window.lock().unwrap();
                    match reply {
                        Ok(r) if r.status == StatusCode::OK => {
                            w.acked += spans;
                            if let Some(id) = id {
                                let mut recent = recent.lock().unwrap();
                                recent.push_back(id);
                                if recent.len() > 1000 {
                                    recent.pop_front();
                                }
                            }
                        }
                        Ok(r) if r.status == StatusCode::TOO_MANY_REQUESTS => w.refused += spans,
                        _ => w.ingest_errors += 1,
                    }
                }
            }
        })
    };

    // queries: one kind after another, four a second
    let queries = {
        let (window, recent, stop) = (window.clone(), recent.clone(), stop.clone());
        let (http, pg) = (server.http.clone(), server.pg.clone());
        tokio::spawn(async move {
            let client = Client::new();
            let mut pg_client: Option<PgClient> = None;
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            let mut n = 0usize;
            while !stop.load(Ordering::Acquire) {
                tick.tick().await;
                let kind = n % KINDS.len();
                n += 1;
                let started = Instant::now();
                let ok = match kind {
                    0 => {
                        let id = recent.lock().unwrap().front().cloned();
                        match id {
                            None => continue,
                            Some(id) => client
                                .get(&format!("{http}/api/v1/traces/{id}"), &[])
                                .await
                                .is_ok_and(|r| r.status == StatusCode::OK),
                        }
                    }
                    1 => client
                        .get(
                            &format!(
                                "{http}/api/v1/search?service=inference-engine&name=llm.generate&min_duration=1s&limit=20"
                            ),
                            &[],
                        )
                        .await
                        .is_ok_and(|r| r.status == StatusCode::OK),
                    2 => {
                        let body = serde_json::json!({
                            "query": "SELECT \"llm.model_version\" AS v, count(*) AS n, \
                                      approx_percentile_cont(duration_ns, 0.99) AS p99 \
                                      FROM spans WHERE start_time > now() - interval '5 minutes' \
                                      AND name = 'llm.generate' GROUP BY 1 ORDER BY 2 DESC"
                        });
                        client
                            .post(
                                &format!("{http}/api/v1/sql"),
                                &[("content-type", "application/json")],
                                body.to_string(),
                            )
                            .await
                            .is_ok_and(|r| r.status == StatusCode::OK)
                    }
                    _ => {
                        if pg_client.is_none() {
                            pg_client = PgClient::connect(&pg, "weft").await.ok();
                        }
                        match pg_client.as_mut() {
                            None => false,
                            Some(c) => {
                                let r = c
                                    .query(
                                        "SELECT service_name, count(*) FROM spans \
                                         WHERE start_time > now() - interval '1 minute' GROUP BY 1",
                                    )
                                    .await;
                                if r.is_err() {
                                    pg_client = None;
                                }
                                r.is_ok()
                            }
                        }
                    }
                };
                let took = started.elapsed();
                let mut w = window.lock().unwrap();
                if ok {
                    w.latencies[kind].push(took);
                } else {
                    w.errors[kind] += 1;
                }
            }
        })
    };

    println!(
        "{:>6} {:>8} {:>6} {:>9} {:>9} {:>7} {:>7}  {}",
        "min",
        "RSS MiB",
        "files",
        "data MiB",
        "spans/s",
        "refused",
        "errors",
        KINDS
            .iter()
            .map(|k| format!("{k:>8} n p50/p99 ms err"))
            .collect::<Vec<_>>()
            .join("  ")
    );
    let started = Instant::now();
    let total = Duration::from_secs_f64(opts.minutes * 60.0);
    let mut rss = Vec::new();
    while started.elapsed() < total {
        tokio::time::sleep(opts.every.min(total - started.elapsed())).await;
        let mut w = std::mem::take(&mut *window.lock().unwrap());
        let secs = opts.every.as_secs_f64();
        let rss_mib = kib(pid, "VmRSS:") as f64 / 1024.0;
        rss.push(rss_mib);
        let kinds: Vec<String> = (0..KINDS.len())
            .map(|k| {
                let n = w.latencies[k].len();
                let (p50, p99) = (ms(&mut w.latencies[k], 0.5), ms(&mut w.latencies[k], 0.99));
                format!("{n:>5} {p50:>6.1}/{p99:<7.1} {:>3}", w.errors[k])
            })
            .collect();
        println!(
            "{:>6.1} {:>8.0} {:>6} {:>9.1} {:>9.0} {:>7} {:>7}  {}",
            started.elapsed().as_secs_f64() / 60.0,
            rss_mib,
            open_files(pid),
            dir_bytes(dir.path()) as f64 / (1 << 20) as f64,
            w.acked as f64 / secs,
            w.refused,
            w.ingest_errors,
            kinds.join("  ")
        );
    }
    stop.store(true, Ordering::Release);
    let _ = ingest.await;
    let _ = queries.await;
    let half = rss.len() / 2;
    if half > 0 {
        let max = |v: &[f64]| v.iter().cloned().fold(f64::MIN, f64::max);
        println!(
            "RSS: first half max {:.0} MiB, second half max {:.0} MiB, peak (VmHWM) {:.0} MiB",
            max(&rss[..half]),
            max(&rss[half..]),
            kib(pid, "VmHWM:") as f64 / 1024.0
        );
    }
    terminate(&mut server)?;
    println!("server stopped cleanly");
    Ok(())
}
