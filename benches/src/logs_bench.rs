//! `weft-bench ingest-logs`: log records per second over OTLP/HTTP with parsing, redaction
//! and durability on, the server's peak memory, bytes per record on disk, and the latency of
//! one-term log searches (a newest-first page of 20) once the records are in blocks.

use weft_bench::logs::{LogConfig, log_batches, records_in};

use super::*;

/// Words searched for (each in a few percent of the records).
const TERMS: &[&str] = &[
    "refund",
    "invoice",
    "timeout",
    "cache",
    "warranty",
    "upgrade",
    "embedding",
    "deadline",
    "hallucination",
    "quota",
];

pub(crate) async fn ingest_logs(
    cfg: LogConfig,
    concurrency: usize,
    weft: Option<PathBuf>,
    searches: usize,
    server_args: Vec<String>,
) -> anyhow::Result<()> {
    let extra: Vec<&str> = server_args.iter().map(String::as_str).collect();
    let bin = weft_binary(weft)?;
    let temp = tempfile::tempdir()?;
    let dir = temp.path().join("data");
    println!(
        "generating {} log records (seed {})...",
        cfg.records, cfg.seed
    );
    let messages: Vec<(Bytes, usize)> = log_batches(cfg)
        .map(|m| (Bytes::from(m.encode_to_vec()), records_in(&m)))
        .collect();
    let encoded: usize = messages.iter().map(|(b, _)| b.len()).sum();
    let (mut server, _) = start_server(&bin, &dir, &extra).await?;
    let report = send(
        &server.otlp,
        Box::new(messages.into_iter()),
        "/v1/logs",
        concurrency,
        0.0,
        None,
    )
    .await?;
    let records = report.spans;
    let rss = peak_rss_kib(server.child.id()).unwrap_or(0);
    println!(
        "log ingest: sent {records} records ({:.1} MB of OTLP protobuf) in {:.2} s: {:.0} records/s, {:.1} MB/s ({} retries after 429)",
        encoded as f64 / 1e6,
        report.elapsed.as_secs_f64(),
        records as f64 / report.elapsed.as_secs_f64(),
        encoded as f64 / 1e6 / report.elapsed.as_secs_f64(),
        report.retries
    );
    println!(
        "server peak RSS during ingest: {:.1} MiB",
        rss as f64 / 1024.0
    );
    // a clean stop flushes every record into blocks; searches then read blocks only
    terminate(&mut server)?;
    let after_stop = dir_bytes(&dir);
    println!(
        "on disk right after a clean stop: {after_stop} bytes = {:.1} bytes/record",
        after_stop as f64 / records as f64
    );
    let text = dir_bytes(&dir.join("text"));
    println!(
        "of which the text index: {text} bytes = {:.1} bytes/record",
        text as f64 / records as f64
    );
    let (mut server, _) = start_server(&bin, &dir, &extra).await?;
    if searches > 0 {
        let client = Client::new();
        let mut times = Vec::with_capacity(searches);
        for i in 0..searches {
            let term = TERMS[i % TERMS.len()];
            let url = format!("{}/api/v1/logs/search?q={term}&limit=20", server.http);
            let started = Instant::now();
            let reply = client.get(&url, &[]).await?;
            times.push(started.elapsed());
            anyhow::ensure!(reply.status == StatusCode::OK, "search: {}", reply.text());
        }
        times.sort();
        let p = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
        println!(
            "one-term log search, newest-first page of 20 ({searches} searches over {} terms): p50 {:.1} ms, p99 {:.1} ms",
            TERMS.len(),
            p(0.5).as_secs_f64() * 1e3,
            p(0.99).as_secs_f64() * 1e3
        );
    }
    terminate(&mut server)?;
    drop(compacted(&dir)?);
    let total = dir_bytes(&dir);
    println!(
        "on disk after compaction: {total} bytes = {:.1} bytes/record (OTLP protobuf: {:.1} bytes/record)",
        total as f64 / records as f64,
        encoded as f64 / records as f64
    );
    Ok(())
}

/// `weft-bench peers --logs N`: the same generated log records in Weft, DuckDB and chDB, and
/// Q7 (records containing a word, and a word and a phrase, in a time range) on all three. The
/// server keeps content and personal data as they came (`--capture-content true
/// --redact-pii false`), so that it holds the same text as the peers' copy.
pub(crate) async fn peers_logs(
    records: usize,
    seed: u64,
    weft: Option<PathBuf>,
    python: &Path,
    runs: usize,
    concurrency: usize,
) -> anyhow::Result<()> {
    let bin = weft_binary(weft)?;
    let temp = tempfile::tempdir()?;
    let dir = temp.path().join("weft");
    let parquet = temp.path().join("logs.parquet");
    let cfg = LogConfig {
        seed,
        records,
        ..Default::default()
    };
    println!("generating {records} log records (seed {seed})...");
    let (rows, first, last) =
        weft_bench::files::write_logs_parquet(&parquet, log_batches(cfg.clone()))?;
    let args = ["--capture-content", "true", "--redact-pii", "false"];
    let (server, _) = start_server(&bin, &dir, &args).await?;
    let messages: Outbox =
        Box::new(log_batches(cfg).map(|m| (Bytes::from(m.encode_to_vec()), records_in(&m))));
    let report = send(&server.otlp, messages, "/v1/logs", concurrency, 0.0, None).await?;
    println!("weft log ingest (encoding while sending): {report}");
    let run = PeerRun {
        bin: &bin,
        dir: &dir,
        server_args: &args,
        parquet: &parquet,
        table: "logs",
        unit: "record",
        rows,
        python,
        runs,
    };
    let queries = weft_bench::peers::log_queries(first, last);
    run.compare(server, &queries, &format!("{rows} log records"))
        .await
}
