//! `weft-bench overload --minutes N`: a server on a fresh data directory, with an ingest memory
//! budget and a tenant limit, is offered more spans than it can take (by default about twice
//! what this machine ingests) from many tenants at once, while slow clients trickle their
//! bodies in. Every `--every` it prints RSS, what was offered, acknowledged and refused, and
//! any answer that is neither; at the end it stops sending, waits for the heads to be flushed,
//! and counts every tenant's spans through SQL against what that tenant had acknowledged.
//!
//! What must hold: RSS stays under the budgets the server was given (the ingest budget plus
//! the fixed caches and the SQL memory limit), every refusal is a retryable 429, and every
//! acknowledged span is there afterwards (no more than acknowledged either, except spans of
//! requests whose answer was lost on the way).

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

pub(crate) struct OverloadOpts {
    pub minutes: f64,
    pub tenants: usize,
    pub spans_per_sec: usize,
    pub slow_clients: usize,
    pub ingest_memory: usize,
    pub senders: usize,
    pub every: Duration,
    pub weft: Option<PathBuf>,
}

/// Spans in one request.
const BATCH_SPANS: usize = 1000;

#[derive(Default)]
struct Tally {
    offered: u64,
    acked: u64,
    refused: u64,
    /// Answers that are neither 200 nor a retryable refusal, by status.
    other: HashMap<String, u64>,
    /// Spans of requests whose answer never came (the connection failed): they may or may not
    /// be stored.
    unknown: u64,
    slow_done: u64,
    slow_refused: u64,
}

/// What the whole run saw.
#[derive(Default)]
struct Totals {
    acked: u64,
    refused: u64,
    unknown: u64,
    other: HashMap<String, u64>,
}

impl Totals {
    fn add(&mut self, w: &Tally) {
        self.acked += w.acked;
        self.refused += w.refused;
        self.unknown += w.unknown;
        for (k, v) in &w.other {
            *self.other.entry(k.clone()).or_default() += v;
        }
    }
}

/// One encoded request whose trace ids all start with the same 8 bytes, at known offsets:
/// each send writes a fresh prefix there, so that every request carries new spans (a resent
/// span would be taken as a retry and stored once).
struct Template {
    body: Vec<u8>,
    offsets: Vec<usize>,
}

impl Template {
    fn new(seed: u64) -> Self {
        const MARK: [u8; 8] = [0xa7, 0x51, 0x3c, 0xe2, 0x09, 0xd4, 0x6b, 0x8f];
        let cfg = GenConfig {
            seed,
            spans: BATCH_SPANS,
            ..Default::default()
        };
        let mut message = ExportTraceServiceRequest::default();
        for m in batches(cfg, BATCH_SPANS) {
            message.resource_spans.extend(m.resource_spans);
        }
        for rs in &mut message.resource_spans {
            for ss in &mut rs.scope_spans {
                for s in &mut ss.spans {
                    s.trace_id[..8].copy_from_slice(&MARK);
                    for l in &mut s.links {
                        l.trace_id[..8].copy_from_slice(&MARK);
                    }
                }
            }
        }
        let body = message.encode_to_vec();
        let offsets = body
            .windows(8)
            .enumerate()
            .filter(|(_, w)| *w == MARK)
            .map(|(i, _)| i)
            .collect();
        Self { body, offsets }
    }

    fn spans(&self) -> u64 {
        let m = ExportTraceServiceRequest::decode(self.body.as_slice()).unwrap_or_default();
        spans_in(&m) as u64
    }

    /// The request with trace ids starting with `prefix`.
    fn with(&self, prefix: u64) -> Vec<u8> {
        let mut body = self.body.clone();
        for &at in &self.offsets {
            body[at..at + 8].copy_from_slice(&prefix.to_be_bytes());
        }
        body
    }
}

fn tenant(i: usize) -> String {
    format!("t{i:04}")
}

pub(crate) async fn overload(opts: OverloadOpts) -> anyhow::Result<()> {
    let bin = weft_binary(opts.weft.clone())?;
    let dir = tempfile::tempdir()?;
    let budget = opts.ingest_memory.to_string();
    let max_tenants = opts.tenants.to_string();
    let (mut server, _) = start_server(
        &bin,
        dir.path(),
        &["--ingest-memory", &budget, "--max-tenants", &max_tenants],
    )
    .await?;
    let pid = server.child.id();
    let template = Arc::new(Template::new(0x0ad));
    let batch_spans = template.spans();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let acked: Arc<Vec<std::sync::atomic::AtomicU64>> =
        Arc::new((0..opts.tenants).map(|_| Default::default()).collect());
    let next_prefix = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    println!(
        "overload: {} min, {} spans/s offered by {} senders over {} tenants, {} slow clients, --ingest-memory {} MiB",
        opts.minutes,
        opts.spans_per_sec,
        opts.senders,
        opts.tenants,
        opts.slow_clients,
        opts.ingest_memory >> 20
    );

    // senders: each sends its share of the offered rate, to tenants in turn
    let per_sender = opts.spans_per_sec as f64 / opts.senders as f64 / batch_spans as f64;
    let mut tasks = Vec::new();
    let shared = (tally, acked, next_prefix, stop, template);
    for s in 0..opts.senders {
        let (tally, acked, next_prefix, stop, template) = shared.clone();
        let url = format!("{}/v1/traces", server.otlp);
        let tenants = opts.tenants;
        tasks.push(tokio::spawn(async move {
            let client = Client::new();
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_sender));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n = s;
            while !stop.load(Ordering::Acquire) {
                tick.tick().await;
                let t = n % tenants;
                n += opts_step(tenants);
                let body = template.with(next_prefix.fetch_add(1, Ordering::Relaxed));
                let name = tenant(t);
                let headers = [
                    ("content-type", "application/x-protobuf"),
                    ("x-scope-orgid", name.as_str()),
                ];
                let reply = client.post(&url, &headers, body).await;
                let mut w = tally.lock().unwrap();
                w.offered += batch_spans;
                match reply {
                    Ok(r) if r.status == StatusCode::OK => {
                        w.acked += batch_spans;
                        acked[t].fetch_add(batch_spans, Ordering::Relaxed);
                    }
                    Ok(r) if r.status == StatusCode::TOO_MANY_REQUESTS => {
                        w.refused += batch_spans;
                    }
                    Ok(r) => *w.other.entry(r.status.to_string()).or_default() += 1,
                    Err(_) => w.unknown += batch_spans,
                }
            }
        }));
    }

    // slow clients: a request whose body comes in at 4 KiB a second
    for s in 0..opts.slow_clients {
        let (tally, acked, next_prefix, stop, template) = shared.clone();
        let addr = server.otlp.trim_start_matches("http://").to_owned();
        let tenants = opts.tenants;
        tasks.push(tokio::spawn(async move {
            let mut n = s;
            while !stop.load(Ordering::Acquire) {
                let t = (n * 7919) % tenants;
                n += 1;
                let body = template.with(next_prefix.fetch_add(1, Ordering::Relaxed));
                let status = slow_request(&addr, &tenant(t), &body, &stop).await;
                let mut w = tally.lock().unwrap();
                match status {
                    Some(200) => {
                        w.slow_done += 1;
                        w.acked += batch_spans;
                        acked[t].fetch_add(batch_spans, Ordering::Relaxed);
                    }
                    Some(429) => w.slow_refused += 1,
                    Some(code) => *w.other.entry(format!("slow {code}")).or_default() += 1,
                    None => w.unknown += batch_spans,
                }
            }
        }));
    }

    let (tally, acked, _, stop, _) = shared;
    println!(
        "{:>6} {:>8} {:>10} {:>10} {:>10} {:>7} {:>7}  other",
        "min", "RSS MiB", "offered/s", "acked/s", "refused/s", "slow ok", "slow 429"
    );
    let started = Instant::now();
    let total = Duration::from_secs_f64(opts.minutes * 60.0);
    let mut peak_rss = 0f64;
    let mut totals = Totals::default();
    while started.elapsed() < total {
        let window = opts.every.min(total - started.elapsed());
        tokio::time::sleep(window).await;
        let w = std::mem::take(&mut *tally.lock().unwrap());
        let secs = window.as_secs_f64();
        let rss = soak::kib(pid, "VmRSS:") as f64 / 1024.0;
        peak_rss = peak_rss.max(rss);
        totals.add(&w);
        println!(
            "{:>6.1} {:>8.0} {:>10.0} {:>10.0} {:>10.0} {:>7} {:>7}  {:?}",
            started.elapsed().as_secs_f64() / 60.0,
            rss,
            w.offered as f64 / secs,
            w.acked as f64 / secs,
            w.refused as f64 / secs,
            w.slow_done,
            w.slow_refused,
            w.other
        );
    }
    stop.store(true, Ordering::Release);
    for t in tasks {
        let _ = t.await;
    }
    totals.add(&std::mem::take(&mut *tally.lock().unwrap()));
    let Totals {
        acked: acked_total,
        refused: refused_total,
        unknown: unknown_total,
        other: other_total,
    } = &totals;
    println!(
        "RSS: peak sampled {peak_rss:.0} MiB, VmHWM {:.0} MiB; acknowledged {acked_total} spans, refused (429) {refused_total}, answer lost {unknown_total}, other answers {other_total:?}",
        soak::kib(pid, "VmHWM:") as f64 / 1024.0
    );

    // every acknowledged span, through SQL, tenant by tenant (count(*) counts rows as stored:
    // a span kept twice would show)
    let client = Client::new();
    let (mut missing, mut extra, mut tenants_short) = (0u64, 0u64, 0usize);
    for (t, want) in acked.iter().enumerate() {
        let want = want.load(Ordering::Relaxed);
        let name = tenant(t);
        let body = serde_json::json!({ "query": "SELECT count(*) FROM spans" });
        let reply = client
            .post(
                &format!("{}/api/v1/sql", server.http),
                &[
                    ("content-type", "application/json"),
                    ("x-scope-orgid", &name),
                ],
                body.to_string(),
            )
            .await?;
        let got = match reply.status {
            StatusCode::OK => reply.json()?["rows"][0][0].as_u64().unwrap_or(0),
            s => bail!("counting tenant {name}: {s}: {}", reply.text()),
        };
        if got < want {
            missing += want - got;
            tenants_short += 1;
        } else {
            extra += got - want;
        }
    }
    println!(
        "after: {missing} acknowledged spans missing ({tenants_short} tenants short), {extra} stored beyond the acknowledged (answer lost: {unknown_total})"
    );
    terminate(&mut server)?;
    println!("server stopped cleanly");
    anyhow::ensure!(missing == 0, "acknowledged spans missing");
    Ok(())
}

/// Senders step through the tenants by a stride coprime with their count, so that each sender
/// reaches every tenant.
fn opts_step(tenants: usize) -> usize {
    (1..)
        .map(|k| 64 * k + 1)
        .find(|s| gcd(*s, tenants) == 1)
        .unwrap_or(1)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// One request over a raw connection, its body written 4 KiB a second; the answer's status,
/// or `None` when the connection failed before one came.
async fn slow_request(
    addr: &str,
    tenant: &str,
    body: &[u8],
    stop: &std::sync::atomic::AtomicBool,
) -> Option<u16> {
    let mut conn = tokio::net::TcpStream::connect(addr).await.ok()?;
    let head = format!(
        "POST /v1/traces HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/x-protobuf\r\nx-scope-orgid: {tenant}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.ok()?;
    let mut reply = Vec::new();
    for chunk in body.chunks(4096) {
        if stop.load(Ordering::Acquire) {
            return None;
        }
        if conn.write_all(chunk).await.is_err() {
            // refused before the body was read: the answer may be there
            break;
        }
        // an early answer (a refusal before the body) ends the request
        let mut buf = [0u8; 512];
        match tokio::time::timeout(Duration::from_secs(1), conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                reply.extend_from_slice(&buf[..n]);
                break;
            }
            Err(_) => {}
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(30), conn.read_to_end(&mut reply)).await;
    let text = String::from_utf8_lossy(&reply);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|s| s.get(..3))
        .and_then(|s| s.parse().ok())
}
