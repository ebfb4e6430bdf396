//! `weft-bench`: generate LLM-serving telemetry, send it, and measure Weft.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::{Args, Parser, Subcommand};
use hyper::StatusCode;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use weft_bench::client::Client;
use weft_bench::files::{read_otlp, write_otlp, write_parquet};
use weft_bench::generator::{GenConfig, Generator, Profile, batches};

mod logs_bench;
mod metrics_bench;
mod overload;
mod soak;
mod tempo_bench;

#[derive(Parser)]
#[command(name = "weft-bench", about = "Load generator and benchmarks for Weft")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Args, Clone, Debug)]
struct DataArgs {
    /// Spans to generate (about: whole requests are generated).
    #[arg(long, default_value_t = 100_000)]
    spans: usize,
    /// Seed of the data set.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Requests per second of simulated traffic (Poisson arrivals).
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Share of failing requests.
    #[arg(long, default_value_t = 0.03)]
    error_rate: f64,
    /// Leave out the injected anomalies.
    #[arg(long)]
    no_anomalies: bool,
    /// Spans per OTLP message (default: 2000; 512 with the SDK profile, the OpenTelemetry
    /// SDK's batch size).
    #[arg(long)]
    batch_spans: Option<usize>,
    /// The data's shape on the wire: `bench` (whole requests per message) or `sdk` (as the
    /// OpenTelemetry SDK sends it: spans as they end, per process; see the generator).
    #[arg(long, value_enum, default_value_t = Profile::Bench)]
    profile: Profile,
}

impl DataArgs {
    fn config(&self) -> GenConfig {
        GenConfig {
            seed: self.seed,
            spans: self.spans,
            rate: self.rate,
            error_rate: self.error_rate,
            anomalies: !self.no_anomalies,
            profile: self.profile,
            ..Default::default()
        }
    }
    fn batch_spans(&self) -> usize {
        self.batch_spans.unwrap_or(match self.profile {
            Profile::Bench => 2000,
            Profile::Sdk => 512,
        })
    }
    fn encoded(&self) -> Vec<Bytes> {
        batches(self.config(), self.batch_spans())
            .map(|m| Bytes::from(m.encode_to_vec()))
            .collect()
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Write generated data as an OTLP request file and/or Parquet.
    Generate {
        #[command(flatten)]
        data: DataArgs,
        /// OTLP request file to write.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Parquet file of the same spans, for peers.
        #[arg(long)]
        parquet: Option<PathBuf>,
    },
    /// Send data (generated, or from --file) to a running server over OTLP/HTTP protobuf.
    Send {
        #[command(flatten)]
        data: DataArgs,
        #[arg(long)]
        file: Option<PathBuf>,
        /// OTLP/HTTP base URL.
        #[arg(long, default_value = "http://127.0.0.1:4318")]
        target: String,
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
        /// Spans per second to aim for (0: as fast as the server takes them).
        #[arg(long, default_value_t = 0.0)]
        rate_limit: f64,
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Start a server, send N spans, report spans/s, peak RSS, restart time and bytes per span.
    Ingest {
        #[command(flatten)]
        data: DataArgs,
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
        /// The weft binary (default: next to this one).
        #[arg(long)]
        weft: Option<PathBuf>,
        /// Keep the data directory here instead of a temporary one.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Also kill -9 the server after ingest and time the restart.
        #[arg(long)]
        crash_restart: bool,
        /// Then measure trace-by-id latency over this many random traces (0: skip).
        #[arg(long, default_value_t = 1000)]
        lookups: usize,
        /// Then wait this long with no traffic and report the data directory as `du` sees it
        /// (0: skip).
        #[arg(long, default_value_t = 60)]
        idle_secs: u64,
        /// Extra `weft serve` arguments, e.g. --server-arg=--flush-age=1h (repeatable).
        #[arg(long, allow_hyphen_values = true)]
        server_arg: Vec<String>,
    },
    /// Start a server, send N log records, report records/s, peak RSS, bytes per record and
    /// the latency of one-term log searches (a newest-first page of 20).
    IngestLogs {
        /// Log records to generate (whole requests: a few more).
        #[arg(long, default_value_t = 1_000_000)]
        records: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Records per OTLP message.
        #[arg(long, default_value_t = 2000)]
        batch: usize,
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
        /// The weft binary (default: next to this one).
        #[arg(long)]
        weft: Option<PathBuf>,
        /// Searches to time after ingest (0: skip).
        #[arg(long, default_value_t = 50)]
        searches: usize,
        /// Extra `weft serve` arguments (repeatable).
        #[arg(long, allow_hyphen_values = true)]
        server_arg: Vec<String>,
    },
    /// Start a server, send the fleet's GPU and engine metrics, report points/s, peak RSS and
    /// bytes per point against Prometheus's TSDB, and time a query_range set on both.
    Metrics {
        #[arg(long, default_value_t = 16)]
        workers: usize,
        #[arg(long, default_value_t = 8)]
        gpus: usize,
        /// Samples per series (10 s apart).
        #[arg(long, default_value_t = 360)]
        steps: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Points per OTLP request.
        #[arg(long, default_value_t = 10_000)]
        batch: usize,
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
        /// Timed runs per query, after one warm-up; the best is reported.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// The weft binary (default: next to this one).
        #[arg(long)]
        weft: Option<PathBuf>,
        /// Extra `weft serve` arguments (repeatable).
        #[arg(long, allow_hyphen_values = true)]
        server_arg: Vec<String>,
        /// Keep Weft's data directory here (to query or profile it afterwards).
        #[arg(long)]
        keep: Option<PathBuf>,
    },
    /// Load the same data into Weft, DuckDB and chDB, run the canonical queries on all three,
    /// check that the answers agree, and compare times and bytes per span.
    Peers {
        #[command(flatten)]
        data: DataArgs,
        /// The weft binary (default: next to this one).
        #[arg(long)]
        weft: Option<PathBuf>,
        /// Python with duckdb and chdb installed (benches/peers/requirements.txt).
        #[arg(long, default_value = ".venv/bin/python")]
        python: PathBuf,
        /// Timed runs per query, after one warm-up; the best is reported.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
        /// Also compare log search (Q7) on this many generated log records (0: skip; with
        /// `--spans 0` only the logs are compared).
        #[arg(long, default_value_t = 0)]
        logs: usize,
    },
    /// The LLM analytics endpoints (operation graph, heatmap, percentiles, dimension lineage,
    /// anomaly scans) on generated data, the same questions asked of DuckDB and chDB in SQL,
    /// answers compared, times as ratios.
    Analytics {
        #[command(flatten)]
        data: DataArgs,
        /// The weft binary (default: next to this one).
        #[arg(long)]
        weft: Option<PathBuf>,
        /// Python with duckdb and chdb installed (benches/peers/requirements.txt).
        #[arg(long, default_value = ".venv/bin/python")]
        python: PathBuf,
        /// Timed runs per question, after one warm-up; the best is reported.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
    },
    /// The canonical peer queries against a running Weft holding the generated data (same
    /// --spans/--seed), Weft only: times over HTTP and PostgreSQL wire, for profiling.
    Queries {
        #[command(flatten)]
        data: DataArgs,
        #[arg(long, default_value = "http://127.0.0.1:3200")]
        target: String,
        #[arg(long, default_value = "127.0.0.1:5433")]
        pg: String,
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Only these queries, e.g. --only Q2 --only Q4.
        #[arg(long)]
        only: Vec<String>,
        /// Print each query's SQL.
        #[arg(long)]
        print: bool,
    },
    /// Trace-by-id latency percentiles against a running server holding the generated data.
    Lookup {
        #[command(flatten)]
        data: DataArgs,
        #[arg(long, default_value = "http://127.0.0.1:3200")]
        target: String,
        #[arg(long, default_value_t = 1000)]
        samples: usize,
    },
    /// Tempo's API against a running server holding the generated data: trace by id through
    /// /api/v2/traces and TraceQL searches, each next to the SQL selecting the same spans.
    Tempo {
        #[command(flatten)]
        data: DataArgs,
        #[arg(long, default_value = "http://127.0.0.1:3200")]
        target: String,
        /// Trace-by-id lookups to time.
        #[arg(long, default_value_t = 1000)]
        samples: usize,
        /// Timed runs per search, after one warm-up.
        #[arg(long, default_value_t = 10)]
        runs: usize,
    },
    /// A long run: a server on a fresh data directory takes steady ingest (spans stamped now)
    /// and a mix of queries (by id, search, SQL over HTTP, PostgreSQL) for N minutes; prints
    /// RSS, open files, data size, ingest and per-kind latencies and errors every interval.
    Soak {
        #[arg(long, default_value_t = 30.0)]
        minutes: f64,
        /// Spans sent each second.
        #[arg(long, default_value_t = 10_000)]
        spans_per_sec: usize,
        /// Seconds between report lines.
        #[arg(long, default_value_t = 60)]
        every: u64,
        /// The server's retention (expiry runs during the soak when it is shorter than it).
        #[arg(long, default_value = "10m")]
        retention: String,
        /// The weft binary (default: next to this one).
        #[arg(long)]
        weft: Option<PathBuf>,
    },
    /// Overload: more spans offered than the server takes, from many tenants, with slow
    /// clients; prints RSS and answers over time, then checks every acknowledged span is
    /// stored (see `benches/src/overload.rs`).
    Overload {
        #[arg(long, default_value_t = 10.0)]
        minutes: f64,
        #[arg(long, default_value_t = 1000)]
        tenants: usize,
        /// Spans offered each second (about twice what this machine ingests).
        #[arg(long, default_value_t = 400_000)]
        spans_per_sec: usize,
        /// Concurrent senders sharing the offered rate.
        #[arg(long, default_value_t = 64)]
        senders: usize,
        /// Clients that write their bodies at 4 KiB a second.
        #[arg(long, default_value_t = 50)]
        slow_clients: usize,
        /// The server's --ingest-memory, in bytes.
        #[arg(long, default_value_t = 256 << 20)]
        ingest_memory: usize,
        /// Seconds between report lines.
        #[arg(long, default_value_t = 30)]
        every: u64,
        #[arg(long)]
        weft: Option<PathBuf>,
    },
    /// Compact a stopped server's store (a full RocksDB compaction), as `peers` does before
    /// its queries, so that a store can be queried in the same state by hand
    Compact {
        #[arg(long)]
        data_dir: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Cmd::Compact { data_dir } => {
            compacted(&data_dir)?;
            println!("compacted {}", data_dir.display());
            Ok(())
        }
        Cmd::Generate { data, out, parquet } => generate(&data, out, parquet),
        Cmd::Send {
            data,
            file,
            target,
            concurrency,
            rate_limit,
            tenant,
        } => {
            let messages = match file {
                Some(f) => outbox(read_otlp(&f)?),
                None => streamed(&data),
            };
            let report = rt.block_on(send(
                &target,
                messages,
                "/v1/traces",
                concurrency,
                rate_limit,
                tenant.as_deref(),
            ))?;
            println!("{report}");
            Ok(())
        }
        Cmd::Ingest {
            data,
            concurrency,
            weft,
            data_dir,
            crash_restart,
            lookups,
            idle_secs,
            server_arg,
        } => {
            let opts = IngestOpts {
                concurrency,
                weft,
                data_dir,
                crash_restart,
                lookups,
                idle_secs,
                server_args: server_arg,
            };
            rt.block_on(ingest(data, opts))
        }
        Cmd::Peers {
            data,
            weft,
            python,
            runs,
            concurrency,
            logs,
        } => rt.block_on(async {
            if data.spans > 0 {
                peers(&data, weft.clone(), &python, runs, concurrency).await?;
            }
            if logs > 0 {
                logs_bench::peers_logs(logs, data.seed, weft, &python, runs, concurrency).await?;
            }
            Ok(())
        }),
        Cmd::Analytics {
            data,
            weft,
            python,
            runs,
            concurrency,
        } => rt.block_on(analytics(&data, weft, &python, runs, concurrency)),
        Cmd::Metrics {
            workers,
            gpus,
            steps,
            seed,
            batch,
            concurrency,
            runs,
            weft,
            server_arg,
            keep,
        } => {
            let cfg = weft_bench::metrics::MetricConfig {
                seed,
                workers,
                gpus_per_worker: gpus,
                steps,
                batch_points: batch,
                ..Default::default()
            };
            rt.block_on(metrics_bench::metrics(
                cfg,
                concurrency,
                weft,
                runs,
                server_arg,
                keep,
            ))
        }
        Cmd::IngestLogs {
            records,
            seed,
            batch,
            concurrency,
            weft,
            searches,
            server_arg,
        } => {
            let cfg = weft_bench::logs::LogConfig {
                seed,
                records,
                batch,
                ..Default::default()
            };
            rt.block_on(logs_bench::ingest_logs(
                cfg,
                concurrency,
                weft,
                searches,
                server_arg,
            ))
        }
        Cmd::Queries {
            data,
            target,
            pg,
            runs,
            only,
            print,
        } => {
            let params = weft_bench::peers::Params::choose(&data.config());
            let queries: Vec<_> = weft_bench::peers::queries(&params)
                .into_iter()
                .filter(|q| only.is_empty() || only.iter().any(|o| o == q.id))
                .collect();
            let results = rt.block_on(weft_bench::peers::run_weft(&target, &pg, &queries, runs))?;
            weft_bench::peers::print_weft(&queries, &results, print);
            Ok(())
        }
        Cmd::Tempo {
            data,
            target,
            samples,
            runs,
        } => {
            let ids = trace_ids(&data.config(), samples);
            rt.block_on(tempo_bench::tempo(&target, &ids, runs))
        }
        Cmd::Overload {
            minutes,
            tenants,
            spans_per_sec,
            senders,
            slow_clients,
            ingest_memory,
            every,
            weft,
        } => rt.block_on(overload::overload(overload::OverloadOpts {
            minutes,
            tenants,
            spans_per_sec,
            slow_clients,
            ingest_memory,
            senders: senders.max(1),
            every: Duration::from_secs(every.max(1)),
            weft,
        })),
        Cmd::Soak {
            minutes,
            spans_per_sec,
            every,
            retention,
            weft,
        } => rt.block_on(soak::soak(soak::SoakOpts {
            minutes,
            spans_per_sec,
            every: Duration::from_secs(every.max(1)),
            weft,
            retention,
        })),
        Cmd::Lookup {
            data,
            target,
            samples,
        } => {
            let ids = trace_ids(&data.config(), samples);
            let report = rt.block_on(lookup(&target, &ids))?;
            println!("{report}");
            Ok(())
        }
    }
}

fn generate(data: &DataArgs, out: Option<PathBuf>, parquet: Option<PathBuf>) -> anyhow::Result<()> {
    if out.is_none() && parquet.is_none() {
        bail!("nothing to write: give --out FILE and/or --parquet FILE");
    }
    if let Some(out) = out {
        let n = write_otlp(&out, batches(data.config(), data.batch_spans()))?;
        println!("wrote {n} OTLP messages to {}", out.display());
    }
    if let Some(p) = parquet {
        let rows = write_parquet(&p, batches(data.config(), data.batch_spans()))?;
        println!("wrote {rows} spans to {}", p.display());
    }
    Ok(())
}

struct SendReport {
    spans: usize,
    messages: usize,
    retries: usize,
    elapsed: Duration,
}

impl std::fmt::Display for SendReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sent {} spans in {} messages in {:.2} s: {:.0} spans/s accepted ({} retries after 429)",
            self.spans,
            self.messages,
            self.elapsed.as_secs_f64(),
            self.spans as f64 / self.elapsed.as_secs_f64(),
            self.retries
        )
    }
}

fn spans_in(m: &ExportTraceServiceRequest) -> usize {
    m.resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .map(|s| s.spans.len())
        .sum()
}

fn span_count(message: &Bytes) -> usize {
    ExportTraceServiceRequest::decode(&message[..]).map_or(0, |m| spans_in(&m))
}

/// Messages to send with the spans each holds, pulled one at a time by the sending tasks.
type Outbox = Box<dyn Iterator<Item = (Bytes, usize)> + Send>;

/// Pre-encoded messages (the ingest measurement leaves encoding out of the timed part).
fn outbox(messages: Vec<Bytes>) -> Outbox {
    let counts: Vec<usize> = messages.iter().map(span_count).collect();
    Box::new(messages.into_iter().zip(counts))
}

/// Messages generated and encoded as they are sent: memory stays at a few batches whatever the
/// data size (at 20M spans the encoded set alone is several GB, which the peer run cannot spare).
fn streamed(data: &DataArgs) -> Outbox {
    Box::new(
        batches(data.config(), data.batch_spans())
            .map(|m| (Bytes::from(m.encode_to_vec()), spans_in(&m))),
    )
}

/// What the sending tasks share: the messages left, and how many (and how many spans) were
/// taken before.
struct Sending {
    messages: Outbox,
    sent: usize,
    spans_sent: usize,
}

async fn send(
    target: &str,
    messages: Outbox,
    path: &str,
    concurrency: usize,
    rate_limit: f64,
    tenant: Option<&str>,
) -> anyhow::Result<SendReport> {
    let source = Arc::new(std::sync::Mutex::new(Sending {
        messages,
        sent: 0,
        spans_sent: 0,
    }));
    let retries = Arc::new(AtomicUsize::new(0));
    let url = format!("{}{path}", target.trim_end_matches('/'));
    let client = Client::new();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (source, retries, url, client) =
            (source.clone(), retries.clone(), url.clone(), client.clone());
        let tenant = tenant.map(str::to_owned);
        tasks.push(tokio::spawn(async move {
            loop {
                let (body, before) = {
                    let mut s = source.lock().expect("outbox lock");
                    let Some((body, spans)) = s.messages.next() else {
                        return Ok::<_, anyhow::Error>(());
                    };
                    let before = s.spans_sent;
                    s.sent += 1;
                    s.spans_sent += spans;
                    (body, before)
                };
                if rate_limit > 0.0 {
                    let due = Duration::from_secs_f64(before as f64 / rate_limit);
                    tokio::time::sleep_until((started + due).into()).await;
                }
                let mut headers = vec![("content-type", "application/x-protobuf")];
                if let Some(t) = &tenant {
                    headers.push(("x-scope-orgid", t.as_str()));
                }
                let deadline = Instant::now() + Duration::from_secs(120);
                loop {
                    let reply = client.post(&url, &headers, body.clone()).await?;
                    match reply.status {
                        StatusCode::OK => break,
                        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
                            if Instant::now() < deadline =>
                        {
                            retries.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        s => bail!("server answered {s}: {}", reply.text()),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let s = source.lock().expect("outbox lock");
    Ok(SendReport {
        spans: s.spans_sent,
        messages: s.sent,
        retries: retries.load(Ordering::Relaxed),
        elapsed: started.elapsed(),
    })
}

/// Trace ids of `n` requests spread over the data set.
fn trace_ids(cfg: &GenConfig, n: usize) -> Vec<String> {
    let mut generator = Generator::new(cfg.clone());
    let mut all = Vec::new();
    while let Some(r) = generator.next_request() {
        all.push(hex::encode(r.trace_id));
    }
    let step = (all.len() / n.max(1)).max(1);
    all.into_iter().step_by(step).take(n).collect()
}

async fn lookup(target: &str, ids: &[String]) -> anyhow::Result<String> {
    let client = Client::new();
    let mut times = Vec::with_capacity(ids.len());
    for id in ids {
        let started = Instant::now();
        let reply = client
            .get(
                &format!("{}/api/v1/traces/{id}", target.trim_end_matches('/')),
                &[],
            )
            .await?;
        times.push(started.elapsed());
        if reply.status != StatusCode::OK {
            bail!("trace {id}: {} {}", reply.status, reply.text());
        }
    }
    times.sort();
    let p = |q: f64| {
        times[((times.len() as f64 * q) as usize).min(times.len() - 1)].as_secs_f64() * 1e3
    };
    Ok(format!(
        "trace by id over HTTP, {} lookups: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        times.len(),
        p(0.5),
        p(0.9),
        p(0.99),
        p(1.0)
    ))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

struct Server {
    child: Child,
    http: String,
    otlp: String,
    /// PostgreSQL wire address, host:port.
    pg: String,
}

/// A run that stops on an error must not leave its server running (it would load the
/// machine for every later measurement): a server not terminated is killed.
impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn weft_binary(explicit: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let path = match explicit {
        Some(p) => p,
        None => std::env::current_exe()?.with_file_name("weft"),
    };
    anyhow::ensure!(
        path.exists(),
        "weft binary not found at {} (build it, or pass --weft)",
        path.display()
    );
    Ok(path)
}

async fn start_server(
    bin: &Path,
    dir: &Path,
    extra: &[&str],
) -> anyhow::Result<(Server, Duration)> {
    let (grpc, otlp, http, pg) = (free_port()?, free_port()?, free_port()?, free_port()?);
    let started = Instant::now();
    let child = Command::new(bin)
        .arg("serve")
        .arg("--data-dir")
        .arg(dir)
        .args([
            "--otlp-grpc-listen",
            &format!("127.0.0.1:{grpc}"),
            "--otlp-http-listen",
            &format!("127.0.0.1:{otlp}"),
            "--http-listen",
            &format!("127.0.0.1:{http}"),
            "--pg-listen",
            &format!("127.0.0.1:{pg}"),
        ])
        .args(extra)
        .env("WEFT_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .context("start weft")?;
    let server = Server {
        child,
        http: format!("http://127.0.0.1:{http}"),
        otlp: format!("http://127.0.0.1:{otlp}"),
        pg: format!("127.0.0.1:{pg}"),
    };
    let client = Client::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Ok(r) = client.get(&format!("{}/ready", server.http), &[]).await
            && r.status == StatusCode::OK
        {
            return Ok((server, started.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("weft did not become ready in 120 s")
}

fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let meta = e.metadata();
            match meta {
                Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                Ok(m) => m.len(),
                Err(_) => 0,
            }
        })
        .sum()
}

fn terminate(server: &mut Server) -> anyhow::Result<()> {
    Command::new("kill")
        .arg("-TERM")
        .arg(server.child.id().to_string())
        .status()?;
    let status = server.child.wait()?;
    anyhow::ensure!(status.success(), "weft exited with {status}");
    Ok(())
}

struct IngestOpts {
    concurrency: usize,
    weft: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    crash_restart: bool,
    lookups: usize,
    idle_secs: u64,
    server_args: Vec<String>,
}

async fn ingest(data: DataArgs, opts: IngestOpts) -> anyhow::Result<()> {
    let IngestOpts {
        concurrency,
        weft,
        data_dir,
        crash_restart,
        lookups,
        idle_secs,
        server_args,
    } = opts;
    let extra: Vec<&str> = server_args.iter().map(String::as_str).collect();
    let bin = weft_binary(weft)?;
    let temp = tempfile::tempdir()?;
    let dir = data_dir.unwrap_or_else(|| temp.path().join("data"));
    println!("generating {} spans (seed {})...", data.spans, data.seed);
    let messages = data.encoded();
    let token_spans = batches(data.config(), data.batch_spans())
        .flat_map(|m| m.resource_spans)
        .flat_map(|r| r.scope_spans)
        .flat_map(|s| s.spans)
        .filter(|s| s.name == "llm.decode.token")
        .count();

    let (mut server, _) = start_server(&bin, &dir, &extra).await?;
    let report = send(
        &server.otlp,
        outbox(messages),
        "/v1/traces",
        concurrency,
        0.0,
        None,
    )
    .await?;
    let pid = server.child.id();
    let rss = peak_rss_kib(pid).unwrap_or(0);
    let spans = report.spans;
    println!("ingest: {report}");
    println!(
        "server peak RSS during ingest: {:.1} MiB",
        rss as f64 / 1024.0
    );

    if crash_restart {
        server.child.kill()?;
        server.child.wait()?;
        let (restarted, took) = start_server(&bin, &dir, &extra).await?;
        let metrics = Client::new()
            .get(&format!("{}/metrics", restarted.http), &[])
            .await?
            .text();
        let replayed = metrics
            .lines()
            .find_map(|l| l.strip_prefix("weft_head_rows "))
            .unwrap_or("?")
            .to_owned();
        println!(
            "restart after kill -9: ready in {:.2} s, {replayed} write-ahead rows replayed",
            took.as_secs_f64()
        );
        server = restarted;
    }
    if lookups > 0 {
        let ids = trace_ids(&data.config(), lookups);
        println!("{}", lookup(&server.http, &ids).await?);
    }
    if idle_secs > 0 {
        tokio::time::sleep(std::time::Duration::from_secs(idle_secs)).await;
        let idle = dir_bytes(&dir);
        println!(
            "on disk {idle_secs} s after the last request, server running (as du sees it): {idle} bytes = {:.2} bytes/span",
            idle as f64 / spans as f64
        );
    }
    terminate(&mut server)?;
    let after_stop = dir_bytes(&dir);
    println!(
        "on disk right after a clean stop (as du sees it): {after_stop} bytes = {:.2} bytes/span",
        after_stop as f64 / spans as f64
    );

    let store = compacted(&dir)?;
    let blocks = store.blocks(&weft_storage::model::TenantId::default_tenant());
    drop(store);
    let total = dir_bytes(&dir);
    let mut by_column: std::collections::BTreeMap<String, u64> = Default::default();
    for (_, meta) in &blocks {
        for c in &meta.columns {
            let key = if c.name.starts_with("a:") {
                "a:* (dynamic)".to_string()
            } else {
                c.name.clone()
            };
            *by_column.entry(key).or_default() += c.bytes;
        }
    }
    let chunk_bytes: u64 = by_column.values().sum();
    println!(
        "on disk after flush + compaction: {total} bytes for {spans} spans ({token_spans} token spans) = {:.2} bytes/span (column chunks {:.2} bytes/span, indexes and RocksDB overhead the rest)",
        total as f64 / spans as f64,
        chunk_bytes as f64 / spans as f64
    );
    let mut columns: Vec<_> = by_column.into_iter().collect();
    columns.sort_by_key(|c| std::cmp::Reverse(c.1));
    for (name, bytes) in columns.iter().take(15) {
        println!(
            "  {name:<40} {:>8.3} bytes/span",
            *bytes as f64 / spans as f64
        );
    }
    Ok(())
}

/// A stopped server's store, opened and fully compacted (the state sizes and peer queries are
/// measured in).
fn compacted(dir: &Path) -> anyhow::Result<weft_storage::Store> {
    let store = weft_storage::Store::open(dir, Default::default())?;
    store.compact();
    Ok(store)
}

/// Generated spans written to Parquet (the peers' copy) and sent to a fresh Weft server, in
/// a temporary directory that lives as long as this.
struct SpanData {
    _temp: tempfile::TempDir,
    /// Weft's data directory.
    dir: PathBuf,
    parquet: PathBuf,
    rows: usize,
    server: Server,
}

impl SpanData {
    async fn load(data: &DataArgs, bin: &Path, concurrency: usize) -> anyhow::Result<Self> {
        let temp = tempfile::tempdir()?;
        let dir = temp.path().join("weft");
        let parquet = temp.path().join("spans.parquet");
        println!("generating {} spans (seed {})...", data.spans, data.seed);
        let rows = write_parquet(&parquet, batches(data.config(), data.batch_spans()))?;
        let (server, _) = start_server(bin, &dir, &[]).await?;
        let report = send(
            &server.otlp,
            streamed(data),
            "/v1/traces",
            concurrency,
            0.0,
            None,
        )
        .await?;
        println!("weft ingest (encoding while sending): {report}");
        Ok(Self {
            _temp: temp,
            dir,
            parquet,
            rows,
            server,
        })
    }
}

async fn peers(
    data: &DataArgs,
    weft: Option<PathBuf>,
    python: &Path,
    runs: usize,
    concurrency: usize,
) -> anyhow::Result<()> {
    let bin = weft_binary(weft)?;
    let SpanData {
        _temp,
        dir,
        parquet,
        rows,
        server,
    } = SpanData::load(data, &bin, concurrency).await?;
    let params = weft_bench::peers::Params::choose(&data.config());
    let run = PeerRun {
        bin: &bin,
        dir: &dir,
        server_args: &[],
        parquet: &parquet,
        table: "spans",
        unit: "span",
        rows,
        python,
        runs,
    };
    let summary = format!(
        "{rows} spans; trace {}, version {}, worker {}, adapter {}",
        params.trace, params.version, params.worker, params.adapter
    );
    run.compare(server, &weft_bench::peers::queries(&params), &summary)
        .await
}

/// What a side-by-side run compares, once the data is in Weft and in a Parquet file.
struct PeerRun<'a> {
    bin: &'a Path,
    /// Weft's data directory.
    dir: &'a Path,
    server_args: &'a [&'a str],
    parquet: &'a Path,
    /// The peers' table (`spans` or `logs`), and what one of its rows is called.
    table: &'a str,
    unit: &'a str,
    rows: usize,
    python: &'a Path,
    runs: usize,
}

impl PeerRun<'_> {
    /// Stops the server that received the data, measures its compacted store, runs the
    /// queries on Weft (restarted), then on DuckDB and chDB, and reports; an error when any
    /// answer differs.
    async fn compare(
        &self,
        mut server: Server,
        queries: &[weft_bench::peers::PeerQuery],
        summary: &str,
    ) -> anyhow::Result<()> {
        terminate(&mut server)?;
        drop(compacted(self.dir)?);
        let weft_bytes = dir_bytes(self.dir) as f64 / self.rows as f64;
        let (mut server, _) = start_server(self.bin, self.dir, self.server_args).await?;
        println!(
            "running {} queries on weft ({} runs each after a warm-up)...",
            queries.len(),
            self.runs
        );
        let weft_results =
            weft_bench::peers::run_weft(&server.http, &server.pg, queries, self.runs).await?;
        terminate(&mut server)?;
        // Weft's figures first: the peers can take long on large data
        weft_bench::peers::print_weft(queries, &weft_results, false);
        println!("loading duckdb and chdb and running the same queries...");
        let work = self.parquet.with_extension("peers");
        std::fs::create_dir_all(&work)?;
        let peers = weft_bench::peers::run_peers(
            self.python,
            self.parquet,
            self.table,
            queries,
            self.runs,
            &work,
        )?;
        println!("{summary}");
        let agree =
            weft_bench::peers::report(queries, &weft_results, &peers, weft_bytes, self.unit);
        anyhow::ensure!(agree, "answers differ between engines (see above)");
        Ok(())
    }
}

/// `weft-bench analytics`: the data in Weft and in Parquet, the analytics questions asked of
/// Weft's endpoints (server restarted on the compacted store) and of the peers in SQL.
async fn analytics(
    data: &DataArgs,
    weft: Option<PathBuf>,
    python: &Path,
    runs: usize,
    concurrency: usize,
) -> anyhow::Result<()> {
    use weft_bench::analytics_bench as a;
    let bin = weft_binary(weft)?;
    let SpanData {
        _temp,
        dir,
        parquet,
        rows,
        mut server,
    } = SpanData::load(data, &bin, concurrency).await?;
    terminate(&mut server)?;
    drop(compacted(&dir)?);
    let params = weft_bench::peers::Params::choose(&data.config());
    let questions = a::questions(&params);
    let (mut server, _) = start_server(&bin, &dir, &[]).await?;
    println!(
        "asking weft {} questions ({runs} runs each after a warm-up)...",
        questions.len()
    );
    let weft_answers = a::run_weft(&server.http, &questions, runs).await?;
    terminate(&mut server)?;
    for q in &questions {
        let w = &weft_answers[q.id];
        println!(
            "weft {:<4} {:>7} rows  {:>9.2} ms{}  {}",
            q.id,
            w.rows.as_ref().map_or(0, Vec::len),
            w.ms,
            if w.partial { " (partial)" } else { "" },
            q.what
        );
        if let Some(found) = &w.found {
            println!("     {found}");
        }
    }
    println!("loading duckdb and chdb and asking the same questions...");
    let work = parquet.with_extension("peers");
    std::fs::create_dir_all(&work)?;
    let peers = weft_bench::peers::run_peers(
        python,
        &parquet,
        "spans",
        &a::peer_queries(&questions),
        runs,
        &work,
    )?;
    println!("{rows} spans, range {}..{} ns", params.t0, params.t1);
    let agree = a::report(&questions, &weft_answers, &peers);
    anyhow::ensure!(agree, "answers differ between engines (see above)");
    Ok(())
}
