//! Weft's own metrics in the Prometheus text format: ingest outcomes, request latency per
//! route (one histogram, labelled), write-ahead and flush timings, background tasks, blocks,
//! and RocksDB's figures.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;

use crate::state::SharedState;

use weft_ingest::{Ingester, RejectReason};
use weft_storage::{Store, TaskStats};

const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// A latency histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_nanos
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (b, c) in BUCKETS.iter().zip(&self.counts) {
            cumulative += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {}",
            self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
}

/// Request latency by route: `METHOD /path/{param}` for HTTP (until the answer's head is
/// sent), `grpc SERVICE/METHOD`, `pgwire query`.
#[derive(Debug, Default)]
pub struct RequestMetrics {
    routes: Mutex<BTreeMap<String, Arc<Histogram>>>,
    /// TLS handshakes that failed or ran out of time (the TLS listeners count them).
    pub tls_handshake_failures: Arc<AtomicU64>,
}

impl RequestMetrics {
    /// Request metrics that report the TLS listeners' handshake failures from `counter`.
    pub fn with_tls_counter(counter: Arc<AtomicU64>) -> Self {
        Self {
            routes: Mutex::default(),
            tls_handshake_failures: counter,
        }
    }

    pub fn observe(&self, route: &str, d: Duration) {
        let h = {
            let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
            match routes.get(route) {
                Some(h) => h.clone(),
                None => routes.entry(route.to_owned()).or_default().clone(),
            }
        };
        h.observe(d);
    }

    fn render(&self, out: &mut String) {
        let routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        for (route, h) in routes.iter() {
            let route = route.replace('\\', "\\\\").replace('"', "\\\"");
            h.render(
                out,
                "weft_request_duration_seconds",
                &format!("route=\"{route}\""),
            );
        }
    }
}

/// Middleware timing every matched HTTP route into [`RequestMetrics`].
pub async fn track_latency(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| format!("{} {}", req.method(), p.as_str()));
    let started = Instant::now();
    let response = next.run(req).await;
    if let Some(route) = route {
        state.requests.observe(&route, started.elapsed());
    }
    response
}

/// Panics anywhere in the process since start (a connection's or request's task, a background
/// task): none is expected, whatever a client sends. Counted by the hook [`count_panics`]
/// installs.
static PANICS: AtomicU64 = AtomicU64::new(0);

/// Counts every panic in `weft_panics_total`, then reports it as the default hook does.
pub fn count_panics() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::Relaxed);
        report(info);
    }));
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
    );
}

pub fn render(requests: &RequestMetrics, ingester: &Ingester, store: &Store) -> String {
    let mut out = String::with_capacity(8192);
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let i = &ingester.stats;
    counter(
        &mut out,
        "weft_panics_total",
        "Panics in any thread since start (a bug: none is expected, whatever a client sends).",
        load(&PANICS),
    );
    counter(
        &mut out,
        "weft_tls_handshake_failures_total",
        "TLS handshakes that failed (no or a refused client certificate, plain text on a TLS port, a client that gave up) or took longer than 10 s.",
        load(&requests.tls_handshake_failures),
    );
    counter(
        &mut out,
        "weft_spans_accepted_total",
        "Spans stored.",
        load(&i.spans_accepted),
    );
    counter(
        &mut out,
        "weft_spans_duplicate_total",
        "Spans skipped because they were already stored (client retries).",
        load(&i.spans_duplicate),
    );
    out.push_str("# HELP weft_spans_rejected_total Spans refused, by reason (whole-request refusals count one per request).\n# TYPE weft_spans_rejected_total counter\n");
    for (reason, n) in RejectReason::ALL.iter().zip(&i.rejected) {
        let _ = writeln!(
            out,
            "weft_spans_rejected_total{{reason=\"{}\"}} {}",
            reason.as_str(),
            load(n)
        );
    }
    counter(
        &mut out,
        "weft_logs_accepted_total",
        "Log records stored.",
        load(&i.logs_accepted),
    );
    counter(
        &mut out,
        "weft_logs_duplicate_total",
        "Log records skipped because they were already stored (client retries).",
        load(&i.logs_duplicate),
    );
    out.push_str("# HELP weft_logs_rejected_total Log records refused by validation, by reason.\n# TYPE weft_logs_rejected_total counter\n");
    for (reason, n) in RejectReason::ALL.iter().zip(&i.logs_rejected) {
        let _ = writeln!(
            out,
            "weft_logs_rejected_total{{reason=\"{}\"}} {}",
            reason.as_str(),
            load(n)
        );
    }
    counter(
        &mut out,
        "weft_metric_points_accepted_total",
        "Metric points stored.",
        load(&i.points_accepted),
    );
    counter(
        &mut out,
        "weft_metric_points_duplicate_total",
        "Metric points skipped because their series already had a point at that instant (client retries).",
        load(&i.points_duplicate),
    );
    out.push_str("# HELP weft_metric_points_rejected_total Metric points refused by validation, by reason.\n# TYPE weft_metric_points_rejected_total counter\n");
    for (reason, n) in RejectReason::ALL.iter().zip(&i.points_rejected) {
        let _ = writeln!(
            out,
            "weft_metric_points_rejected_total{{reason=\"{}\"}} {}",
            reason.as_str(),
            load(n)
        );
    }
    counter(
        &mut out,
        "weft_log_parse_failures_total",
        "Log records whose body looked structured but did not parse (kept as they came).",
        load(&i.log_parse.failures),
    );
    out.push_str("# HELP weft_redactions_total Values redacted at ingest, by rule (content: a content attribute or log body segment replaced by its hash and length).\n# TYPE weft_redactions_total counter\n");
    for (rule, n) in i.redactions.snapshot() {
        let _ = writeln!(out, "weft_redactions_total{{rule=\"{rule}\"}} {n}");
    }
    out.push_str("# HELP weft_request_duration_seconds Request latency by route.\n# TYPE weft_request_duration_seconds histogram\n");
    requests.render(&mut out);
    let s = &store.stats;
    counter(
        &mut out,
        "weft_wal_writes_total",
        "Synced write-ahead writes.",
        load(&s.wal_writes),
    );
    counter(
        &mut out,
        "weft_wal_write_seconds_total",
        "Time spent in synced write-ahead writes.",
        load(&s.wal_nanos) / 1_000_000_000,
    );
    gauge(
        &mut out,
        "weft_wal_write_seconds_sum",
        "Time spent in synced write-ahead writes, fractional.",
        load(&s.wal_nanos) as f64 / 1e9,
    );
    counter(
        &mut out,
        "weft_flushes_total",
        "Head flushes into blocks.",
        load(&s.flushes),
    );
    gauge(
        &mut out,
        "weft_flush_seconds_sum",
        "Time spent flushing.",
        load(&s.flush_nanos) as f64 / 1e9,
    );
    counter(
        &mut out,
        "weft_rows_flushed_total",
        "Rows written into blocks.",
        load(&s.rows_flushed),
    );
    counter(
        &mut out,
        "weft_text_index_errors_total",
        "Log text index updates that failed (mended by the next update or at start).",
        load(&s.text_index_errors),
    );
    let (windows, docs) = store.text_backlog();
    gauge(
        &mut out,
        "weft_text_index_backlog_windows",
        "Log windows whose text index is behind their flushed blocks (the index task catches up; searches match those blocks' records meanwhile).",
        windows as f64,
    );
    gauge(
        &mut out,
        "weft_text_index_backlog_documents",
        "Documents of flushed log blocks kept in memory for the index task.",
        docs as f64,
    );
    counter(
        &mut out,
        "weft_rows_waiting_for_parent_total",
        "Rows a flush kept in the head to wait for a missing parent (once per flush).",
        load(&s.rows_waiting),
    );
    counter(
        &mut out,
        "weft_metric_series_created_total",
        "Metric series registered (each series once, on its first point).",
        load(&s.series_created),
    );
    counter(
        &mut out,
        "weft_metric_series_deleted_total",
        "Metric series deleted once retention took their last points.",
        load(&s.series_deleted),
    );
    counter(
        &mut out,
        "weft_writes_refused_disk_full_total",
        "Writes refused (507 / RESOURCE_EXHAUSTED) because the data directory's filesystem had less free space than --min-free-disk.",
        load(&s.refused_disk_full),
    );
    counter(
        &mut out,
        "weft_writes_refused_tenants_total",
        "Writes refused because they would add a tenant past --max-tenants.",
        load(&s.refused_tenants),
    );
    gauge(
        &mut out,
        "weft_disk_free_bytes",
        "Free bytes on the data directory's filesystem (for an unprivileged writer).",
        store.disk.free_bytes() as f64,
    );
    counter(
        &mut out,
        "weft_corrupt_skipped_total",
        "Block metas and head records left out at start because they failed their checksums (--skip-corrupt-blocks).",
        load(&s.corrupt_skipped),
    );
    counter(
        &mut out,
        "weft_head_budget_refusals_total",
        "Writes refused because the heads of all tenants held the --head-memory bytes they may hold waiting for flush.",
        load(&s.refused_head_budget),
    );
    counter(
        &mut out,
        "weft_blocks_left_out_total",
        "Blocks left out of answers after a query found part of them damaged (--skip-corrupt-blocks).",
        load(&s.blocks_left_out),
    );
    gauge(
        &mut out,
        "weft_damaged_blocks",
        "Damaged blocks answers leave out now (--skip-corrupt-blocks; gone when retention takes their window).",
        store.damaged_total() as f64,
    );
    counter(
        &mut out,
        "weft_blocks_written_total",
        "Blocks written.",
        load(&s.blocks_written),
    );
    counter(
        &mut out,
        "weft_block_bytes_written_total",
        "Encoded column-chunk bytes written.",
        load(&s.block_bytes_written),
    );
    counter(
        &mut out,
        "weft_blocks_expired_total",
        "Blocks deleted because their window fell out of retention.",
        load(&s.blocks_expired),
    );
    counter(
        &mut out,
        "weft_merges_total",
        "Merges of small blocks into larger ones.",
        load(&s.merges),
    );
    counter(
        &mut out,
        "weft_blocks_merged_total",
        "Small blocks merged into larger ones.",
        load(&s.blocks_merged),
    );
    counter(
        &mut out,
        "weft_blocks_deleted_total",
        "Merged or expired blocks whose data was deleted (once no query read them).",
        load(&s.blocks_deleted),
    );
    counter(
        &mut out,
        "weft_appends_refused_total",
        "Appends refused because too many rows waited for flush.",
        load(&s.appends_refused),
    );
    render_tasks(&mut out, store);
    gauge(
        &mut out,
        "weft_blocks",
        "Blocks in the store.",
        store.block_count() as f64,
    );
    gauge(
        &mut out,
        "weft_head_rows",
        "Rows acknowledged but not yet in a block.",
        store.pending_rows() as f64,
    );
    gauge(
        &mut out,
        "weft_head_bytes",
        "Bytes the rows not yet in blocks count against --head-memory (as decoded, with their indexes).",
        store.head_bytes() as f64,
    );
    gauge(
        &mut out,
        "weft_head_decoded_bytes",
        "Bytes of head rows held decoded (the others are held as their write-ahead encoding).",
        store.decoded_head_bytes() as f64,
    );
    for (name, prop, help) in [
        (
            "weft_rocksdb_live_sst_bytes",
            "rocksdb.live-sst-files-size",
            "Bytes of live SST files.",
        ),
        (
            "weft_rocksdb_memtable_bytes",
            "rocksdb.cur-size-all-mem-tables",
            "Bytes in memtables.",
        ),
        (
            "weft_rocksdb_estimated_keys",
            "rocksdb.estimate-num-keys",
            "Estimated number of keys.",
        ),
        (
            "weft_rocksdb_pending_compaction_bytes",
            "rocksdb.estimate-pending-compaction-bytes",
            "Bytes compaction still has to rewrite.",
        ),
        (
            "weft_rocksdb_running_compactions",
            "rocksdb.num-running-compactions",
            "Compactions running.",
        ),
    ] {
        gauge(&mut out, name, help, store.rocksdb_property(prop) as f64);
    }
    gauge(
        &mut out,
        "weft_rocksdb_block_cache_bytes",
        "Bytes in the block cache (shared by all column families).",
        store.rocksdb_db_property("rocksdb.block-cache-usage") as f64,
    );
    out
}

/// The store's background tasks: rounds that did work, failures and panics, by task.
fn render_tasks(out: &mut String, store: &Store) {
    let tasks = store.stats.tasks();
    for (name, help, pick) in [
        (
            "weft_background_runs_total",
            "Background task rounds that did work.",
            (|t: &TaskStats| &t.runs) as fn(&TaskStats) -> &AtomicU64,
        ),
        (
            "weft_background_failures_total",
            "Background task rounds that failed (retried with back-off).",
            |t: &TaskStats| &t.failures,
        ),
        (
            "weft_background_panics_total",
            "Background task rounds that panicked (retried with back-off).",
            |t: &TaskStats| &t.panics,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (task, stats) in &tasks {
            let _ = writeln!(
                out,
                "{name}{{task=\"{task}\"}} {}",
                pick(stats).load(Ordering::Relaxed)
            );
        }
    }
}
