//! Metrics derived from spans at ingest, so that they cost nothing at query time. Each span is
//! counted once: the store hands over only the spans a request made durable itself
//! ([`weft_storage::Store::append_observed`]), never a client's retry.
//!
//! - **Span metrics**, named as Tempo's metrics generator names them: per service, span name,
//!   kind and status, `traces_spanmetrics_calls_total` and the latency histogram
//!   `traces_spanmetrics_latency_{bucket,count,sum}` (seconds).
//! - **Service graph**: a CLIENT (or PRODUCER) span and its SERVER (or CONSUMER) child in
//!   another service make an edge: `traces_service_graph_request_total{client, server}`,
//!   `…_request_failed_total` (either side an error), and the server and client latency
//!   histograms `…_request_server_seconds_*`, `…_request_client_seconds_*`. The two sides may
//!   arrive in different requests: an unpaired side waits up to [`EDGE_WAIT`].
//! - **LLM serving**, per model, model version, LoRA adapter and worker (with the service):
//!   `gen_ai.server.request.duration`, `gen_ai.server.time_to_first_token` (vLLM's
//!   `gen_ai.latency.time_to_first_token`, else the end of the request's `llm.prefill` span),
//!   `gen_ai.server.time_per_output_token`, `gen_ai.client.token.usage` (input and output), and
//!   `llm.inter_token_latency` from `llm.decode.token` spans (their `llm.token.latency_ms`, else
//!   their duration), with the dimensions of the request span they descend from.
//!
//! Values are cumulative from the process start (a restart is a counter reset, which `rate`
//! handles); [`SpanMetrics::flush`] writes one point per series every interval, histogram
//! points carrying the last trace that fell in them as exemplar.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use weft_storage::Store;
use weft_storage::model::{
    Exemplar, MetricKind, MetricPoint, PointValue, Series, SpanId, SpanKind, SpanRecord,
    StatusCode, Temporality, TenantId, TraceId, UnixNanos, Value,
};

/// How long one side of a service-graph edge waits for the other.
pub const EDGE_WAIT: Duration = Duration::from_secs(30);
/// Unpaired edge sides kept per tenant at most (the oldest go first).
const MAX_PENDING_EDGES: usize = 100_000;
/// Unpaired edge sides kept across all tenants at most (each holds a service name: a thousand
/// tenants at the bound of one would hold gigabytes); past it, the tenants holding the most
/// lose theirs.
const MAX_PENDING_EDGES_TOTAL: usize = 1_000_000;

/// Tempo's default span-metrics latency buckets (seconds).
const LATENCY_BUCKETS: &[f64] = &[
    0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096, 8.192,
    16.384,
];
/// The GenAI conventions' advised buckets.
const REQUEST_BUCKETS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
const TPOT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];
const ITL_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0,
];
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
];

/// The request dimensions an LLM series is labelled with (those the span carries).
const LLM_DIMS: &[&str] = &[
    "gen_ai.request.model",
    "llm.model_version",
    "llm.lora_adapter",
    "worker.id",
    "gpu.id",
];

#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    exemplar: Option<(TraceId, SpanId, f64, u64)>,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            exemplar: None,
        }
    }

    fn observe(&mut self, v: f64, span: &SpanRecord) {
        let i = self.bounds.partition_point(|b| *b < v);
        self.counts[i] += 1;
        self.sum += v;
        self.exemplar = Some((span.trace_id, span.span_id, v, span.end.0));
    }
}

#[derive(Debug)]
enum State {
    Counter(f64),
    Histogram(Histogram),
}

#[derive(Debug)]
struct Derived {
    series: Series,
    state: State,
    /// Changed since the last flush.
    dirty: bool,
}

/// One side of a service-graph edge waiting for the other.
#[derive(Debug)]
struct Side {
    service: String,
    duration_s: f64,
    failed: bool,
    at: Instant,
}

#[derive(Debug, Default)]
struct TenantMetrics {
    /// Each series' place in `series`, by its identity ([`Series::identity`]).
    places: HashMap<Vec<u8>, usize>,
    series: Vec<Derived>,
    /// The places of the span-metrics series (calls, latency) of each service, span name, kind
    /// and status seen: a span finds its two series without building their labels again.
    span_series: HashMap<String, HashMap<String, SpanSeries>>,
    /// Client sides by (trace, span id); server sides by (trace, parent span id).
    clients: HashMap<(TraceId, SpanId), Side>,
    servers: HashMap<(TraceId, SpanId), Side>,
}

/// The places of the calls and latency series of a service's span name, by kind and status.
type SpanSeries = Vec<(SpanKind, StatusCode, usize, usize)>;

/// Within one batch, the inter-token latency series of the decode tokens under one request
/// span (by its trace and span id) and of one service: a request's tokens find their series
/// without building its labels again.
type TokenSeries<'a> = HashMap<(TraceId, SpanId), (&'a str, usize)>;

/// Past `max` unpaired edge sides across all tenants, the tenants holding the most drop theirs
/// until the rest is under it (their edges still waiting are not counted; every other tenant's
/// are).
fn bound_pending_total(tenants: &mut HashMap<TenantId, TenantMetrics>, max: usize) {
    let mut total: usize = tenants.values().map(TenantMetrics::pending).sum();
    if total <= max {
        return;
    }
    let mut by_size: Vec<&mut TenantMetrics> = tenants.values_mut().collect();
    by_size.sort_unstable_by_key(|t| std::cmp::Reverse(t.pending()));
    for t in by_size {
        if total <= max {
            break;
        }
        total -= t.pending();
        t.clients.clear();
        t.servers.clear();
    }
}

/// Derived metrics of every tenant, accumulated between flushes.
#[derive(Debug)]
pub struct SpanMetrics {
    tenants: Mutex<HashMap<TenantId, TenantMetrics>>,
    /// When the cumulative series began (the process start).
    started: UnixNanos,
    /// Unpaired edge sides kept across all tenants at most.
    max_pending: usize,
}

impl SpanMetrics {
    pub fn new(started: UnixNanos) -> Self {
        Self {
            tenants: Mutex::new(HashMap::new()),
            started,
            max_pending: MAX_PENDING_EDGES_TOTAL,
        }
    }

    /// Takes spans made durable by one request.
    pub fn observe(&self, tenant: &TenantId, spans: &[SpanRecord]) {
        let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        let t = tenants.entry(tenant.clone()).or_default();
        let by_id: ById<'_> = spans.iter().map(|s| ((s.trace_id, s.span_id), s)).collect();
        // each request's prefill end, by (trace, its parent)
        let prefills: HashMap<(TraceId, SpanId), u64> = spans
            .iter()
            .filter(|s| s.name == "llm.prefill")
            .filter_map(|s| Some(((s.trace_id, s.parent_span_id?), s.end.0)))
            .collect();
        let now = Instant::now();
        let mut tokens = TokenSeries::new();
        for s in spans {
            t.span_metrics(s);
            t.service_graph(s, now);
            t.llm(s, &by_id, &prefills, &mut tokens);
        }
        bound_pending_total(&mut tenants, self.max_pending);
    }

    /// Writes one point per series changed since the last flush (cumulative values at `now`),
    /// and forgets edge sides that waited too long. Returns how many points it wrote.
    pub fn flush(&self, store: &Store, now: UnixNanos) -> weft_storage::Result<usize> {
        let batches: Vec<(TenantId, Vec<Series>, Vec<MetricPoint>)> = {
            let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
            let expired = |side: &Side| side.at.elapsed() < EDGE_WAIT;
            tenants
                .iter_mut()
                .map(|(tenant, t)| {
                    t.clients.retain(|_, s| expired(s));
                    t.servers.retain(|_, s| expired(s));
                    let mut series = Vec::new();
                    let mut points = Vec::new();
                    for d in t.series.iter_mut().filter(|d| d.dirty) {
                        d.dirty = false;
                        let (value, exemplars) = match &d.state {
                            State::Counter(c) => (PointValue::Number(*c), Vec::new()),
                            State::Histogram(h) => (
                                PointValue::Histogram {
                                    count: h.counts.iter().sum(),
                                    sum: Some(h.sum),
                                    min: None,
                                    max: None,
                                    bounds: h.bounds.to_vec(),
                                    counts: h.counts.clone(),
                                },
                                h.exemplar
                                    .iter()
                                    .map(|(trace, span, v, t)| Exemplar {
                                        time: UnixNanos(*t),
                                        value: *v,
                                        trace_id: Some(*trace),
                                        span_id: Some(*span),
                                        filtered: Vec::new(),
                                    })
                                    .collect(),
                            ),
                        };
                        points.push(MetricPoint {
                            series: series.len() as u32,
                            time: now,
                            start_time: self.started,
                            value,
                            flags: 0,
                            exemplars,
                        });
                        series.push(d.series.clone());
                    }
                    (tenant.clone(), series, points)
                })
                .filter(|(_, s, _)| !s.is_empty())
                .collect()
        };
        let mut written = 0;
        for (tenant, series, mut points) in batches {
            let ids = store.register_series(&tenant, &series)?;
            for p in &mut points {
                p.series = ids[p.series as usize];
            }
            written += store.append_points(&tenant, points)?.stored;
        }
        Ok(written)
    }
}

fn counter_series(name: &str, labels: Vec<(String, String)>) -> Series {
    Series {
        name: name.to_owned(),
        kind: MetricKind::Sum,
        temporality: Temporality::Cumulative,
        monotonic: true,
        labels,
        ..Default::default()
    }
}

fn histogram_series(name: &str, unit: &str, labels: Vec<(String, String)>) -> Series {
    Series {
        name: name.to_owned(),
        kind: MetricKind::Histogram,
        unit: unit.to_owned(),
        temporality: Temporality::Cumulative,
        labels,
        ..Default::default()
    }
}

/// The spans of one request by (trace, span id).
type ById<'a> = HashMap<(TraceId, SpanId), &'a SpanRecord>;

fn sorted(mut labels: Vec<(String, String)>) -> Vec<(String, String)> {
    labels.sort();
    labels.dedup_by(|a, b| a.0 == b.0);
    labels
}

fn kind_label(k: SpanKind) -> &'static str {
    match k {
        SpanKind::Server => "SPAN_KIND_SERVER",
        SpanKind::Client => "SPAN_KIND_CLIENT",
        SpanKind::Producer => "SPAN_KIND_PRODUCER",
        SpanKind::Consumer => "SPAN_KIND_CONSUMER",
        SpanKind::Internal => "SPAN_KIND_INTERNAL",
        SpanKind::Unspecified => "SPAN_KIND_UNSPECIFIED",
    }
}

fn status_label(s: StatusCode) -> &'static str {
    match s {
        StatusCode::Unset => "STATUS_CODE_UNSET",
        StatusCode::Ok => "STATUS_CODE_OK",
        StatusCode::Error => "STATUS_CODE_ERROR",
    }
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Int(i) => Some(*i as f64),
        Value::Double(d) => Some(*d),
        Value::Str(s) => s.parse().ok(),
        _ => None,
    }
}

fn attr_number(s: &SpanRecord, keys: &[&str]) -> Option<f64> {
    keys.iter().find_map(|k| s.attribute(k).and_then(number))
}

impl TenantMetrics {
    /// The place of a series, added (with its state from `make`) when new.
    fn place(&mut self, series: Series, make: impl FnOnce() -> State) -> usize {
        let key = series.identity();
        if let Some(&i) = self.places.get(&key) {
            return i;
        }
        self.series.push(Derived {
            series,
            state: make(),
            dirty: true,
        });
        self.places.insert(key, self.series.len() - 1);
        self.series.len() - 1
    }

    fn count(&mut self, name: &str, labels: Vec<(String, String)>, by: f64) {
        let i = self.place(counter_series(name, labels), || State::Counter(0.0));
        self.add_at(i, by);
    }

    fn add_at(&mut self, i: usize, by: f64) {
        let d = &mut self.series[i];
        d.dirty = true;
        if let State::Counter(c) = &mut d.state {
            *c += by;
        }
    }

    /// Observes `v` in a histogram series; returns its place (none when `v` is not a
    /// duration or count: negative or not finite).
    fn observe(
        &mut self,
        name: &str,
        unit: &str,
        labels: Vec<(String, String)>,
        bounds: &'static [f64],
        v: f64,
        span: &SpanRecord,
    ) -> Option<usize> {
        if !v.is_finite() || v < 0.0 {
            return None;
        }
        let series = histogram_series(name, unit, labels);
        let i = self.place(series, || State::Histogram(Histogram::new(bounds)));
        self.observe_at(i, v, span);
        Some(i)
    }

    fn observe_at(&mut self, i: usize, v: f64, span: &SpanRecord) {
        if !v.is_finite() || v < 0.0 {
            return;
        }
        let d = &mut self.series[i];
        d.dirty = true;
        if let State::Histogram(h) = &mut d.state {
            h.observe(v, span);
        }
    }

    fn span_metrics(&mut self, s: &SpanRecord) {
        let seconds = s.duration_ns() as f64 / 1e9;
        let known = self
            .span_series
            .get(s.service_name())
            .and_then(|names| names.get(&s.name))
            .and_then(|keys| {
                keys.iter()
                    .find(|(kind, status, _, _)| *kind == s.kind && *status == s.status_code)
            });
        if let Some(&(_, _, calls, latency)) = known {
            self.add_at(calls, 1.0);
            self.observe_at(latency, seconds, s);
            return;
        }
        let labels = sorted(vec![
            ("service".into(), s.service_name().to_owned()),
            ("span_name".into(), s.name.clone()),
            ("span_kind".into(), kind_label(s.kind).to_owned()),
            ("status_code".into(), status_label(s.status_code).to_owned()),
        ]);
        let calls = self.place(
            counter_series("traces_spanmetrics_calls", labels.clone()),
            || State::Counter(0.0),
        );
        // no unit: Tempo's names carry none (`traces_spanmetrics_latency_bucket`)
        let latency = self.place(
            histogram_series("traces_spanmetrics_latency", "", labels),
            || State::Histogram(Histogram::new(LATENCY_BUCKETS)),
        );
        self.add_at(calls, 1.0);
        self.observe_at(latency, seconds, s);
        self.span_series
            .entry(s.service_name().to_owned())
            .or_default()
            .entry(s.name.clone())
            .or_default()
            .push((s.kind, s.status_code, calls, latency));
    }

    fn service_graph(&mut self, s: &SpanRecord, now: Instant) {
        let side = |s: &SpanRecord| Side {
            service: s.service_name().to_owned(),
            duration_s: s.duration_ns() as f64 / 1e9,
            failed: s.status_code == StatusCode::Error,
            at: now,
        };
        match s.kind {
            SpanKind::Client | SpanKind::Producer => {
                let key = (s.trace_id, s.span_id);
                match self.servers.remove(&key) {
                    Some(server) => self.edge(side(s), server, s),
                    None => {
                        self.bound_pending();
                        self.clients.insert(key, side(s));
                    }
                }
            }
            SpanKind::Server | SpanKind::Consumer => {
                let Some(parent) = s.parent_span_id else {
                    return;
                };
                let key = (s.trace_id, parent);
                match self.clients.remove(&key) {
                    Some(client) => self.edge(client, side(s), s),
                    None => {
                        self.bound_pending();
                        self.servers.insert(key, side(s));
                    }
                }
            }
            _ => {}
        }
    }

    fn pending(&self) -> usize {
        self.clients.len() + self.servers.len()
    }

    fn bound_pending(&mut self) {
        if self.clients.len() + self.servers.len() >= MAX_PENDING_EDGES {
            self.clients.clear();
            self.servers.clear();
        }
    }

    fn edge(&mut self, client: Side, server: Side, span: &SpanRecord) {
        let labels = sorted(vec![
            ("client".into(), client.service.clone()),
            ("server".into(), server.service.clone()),
        ]);
        self.count("traces_service_graph_request", labels.clone(), 1.0);
        if client.failed || server.failed {
            self.count("traces_service_graph_request_failed", labels.clone(), 1.0);
        }
        self.observe(
            "traces_service_graph_request_server_seconds",
            "",
            labels.clone(),
            LATENCY_BUCKETS,
            server.duration_s,
            span,
        );
        self.observe(
            "traces_service_graph_request_client_seconds",
            "",
            labels,
            LATENCY_BUCKETS,
            client.duration_s,
            span,
        );
    }

    /// The span itself or its nearest ancestor in the batch (at most 8 up) that carries any
    /// LLM dimension.
    fn carrier<'a>(s: &'a SpanRecord, by_id: &ById<'a>) -> Option<&'a SpanRecord> {
        let mut current = s;
        for _ in 0..8 {
            let carries = LLM_DIMS
                .iter()
                .any(|k| current.attribute(k).is_some_and(|v| *v != Value::Empty));
            if carries {
                return Some(current);
            }
            current = by_id.get(&(current.trace_id, current.parent_span_id?))?;
        }
        None
    }

    /// The labels of `s`'s LLM series: the dimensions of its carrier, and `s`'s service.
    fn labels(s: &SpanRecord, carrier: &SpanRecord) -> Vec<(String, String)> {
        let mut labels: Vec<(String, String)> = LLM_DIMS
            .iter()
            .filter_map(|k| {
                carrier
                    .attribute(k)
                    .and_then(Value::text)
                    .map(|v| (k.to_string(), v))
            })
            .collect();
        labels.push(("service.name".into(), s.service_name().to_owned()));
        sorted(labels)
    }

    /// The LLM dimensions of a span, from it or the nearest ancestor in the batch that has any.
    fn dims(s: &SpanRecord, by_id: &ById<'_>) -> Option<Vec<(String, String)>> {
        Some(Self::labels(s, Self::carrier(s, by_id)?))
    }

    fn llm<'a>(
        &mut self,
        s: &'a SpanRecord,
        by_id: &ById<'a>,
        prefills: &HashMap<(TraceId, SpanId), u64>,
        tokens: &mut TokenSeries<'a>,
    ) {
        let decode_token = s.name == "llm.decode.token" || s.attribute("llm.token.index").is_some();
        if decode_token {
            let Some(carrier) = Self::carrier(s, by_id) else {
                return;
            };
            let latency = attr_number(s, &["llm.token.latency_ms"])
                .map(|ms| ms / 1000.0)
                .unwrap_or(s.duration_ns() as f64 / 1e9);
            let key = (carrier.trace_id, carrier.span_id);
            match tokens.get(&key) {
                Some(&(service, i)) if service == s.service_name() => {
                    self.observe_at(i, latency, s);
                }
                _ => {
                    let labels = Self::labels(s, carrier);
                    let placed = self.observe(
                        "llm.inter_token_latency",
                        "s",
                        labels,
                        ITL_BUCKETS,
                        latency,
                        s,
                    );
                    if let Some(i) = placed {
                        tokens.insert(key, (s.service_name(), i));
                    }
                }
            }
            return;
        }
        let request = s.name == "llm.generate"
            || s.name == "llm_request"
            || s.attribute("gen_ai.latency.time_to_first_token").is_some();
        if !request {
            return;
        }
        let Some(labels) = Self::dims(s, by_id) else {
            return;
        };
        let duration = s.duration_ns() as f64 / 1e9;
        self.observe(
            "gen_ai.server.request.duration",
            "s",
            labels.clone(),
            REQUEST_BUCKETS,
            duration,
            s,
        );
        let ttft = attr_number(s, &["gen_ai.latency.time_to_first_token"]).or_else(|| {
            prefills
                .get(&(s.trace_id, s.span_id))
                .map(|end| end.saturating_sub(s.start.0) as f64 / 1e9)
        });
        if let Some(ttft) = ttft {
            self.observe(
                "gen_ai.server.time_to_first_token",
                "s",
                labels.clone(),
                TTFT_BUCKETS,
                ttft,
                s,
            );
        }
        let output = attr_number(
            s,
            &[
                "gen_ai.usage.output_tokens",
                "gen_ai.usage.completion_tokens",
            ],
        );
        let input = attr_number(
            s,
            &["gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"],
        );
        if let (Some(ttft), Some(out)) = (ttft, output)
            && out > 1.0
        {
            self.observe(
                "gen_ai.server.time_per_output_token",
                "s",
                labels.clone(),
                TPOT_BUCKETS,
                (duration - ttft).max(0.0) / (out - 1.0),
                s,
            );
        }
        for (kind, n) in [("input", input), ("output", output)] {
            if let Some(n) = n {
                let mut l = labels.clone();
                l.push(("gen_ai.token.type".into(), kind.into()));
                self.observe(
                    "gen_ai.client.token.usage",
                    "{token}",
                    sorted(l),
                    TOKEN_BUCKETS,
                    n,
                    s,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
