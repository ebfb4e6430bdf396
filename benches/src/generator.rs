//! The generator. Every random choice comes from one seeded RNG, so a seed names a data set.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, any_value,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    ResourceSpans, ScopeSpans, Span, Status, span::SpanKind, status::StatusCode,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, LogNormal};

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenConfig {
    pub seed: u64,
    /// Stop after about this many spans.
    pub spans: usize,
    /// Start of the window, Unix ns.
    pub start_ns: u64,
    /// Requests per second (Poisson arrivals).
    pub rate: f64,
    /// Share of requests that fail.
    pub error_rate: f64,
    /// Inject the documented anomalies.
    pub anomalies: bool,
    pub min_tokens: u32,
    pub max_tokens: u32,
    pub profile: Profile,
}

/// How the data looks on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// Whole requests per message, one resource per service, token latencies equal to
    /// durations: the shape Weft's own benchmarks were tuned on.
    #[default]
    Bench,
    /// As the OpenTelemetry SDK sends it: each process (one per service replica, one per
    /// inference worker) exports its spans as they end, in messages of `batch_spans` (512 by
    /// the SDK's default), so a trace is split across messages and children arrive before
    /// their parents; W3C flags (sampled, parent locality), a trace state now and then, a
    /// remote parent on a quarter of the roots; several resource and scope attributes;
    /// token latencies measured from the previous token (not the span duration).
    Sdk,
}

impl Default for GenConfig {
    fn default() -> Self {
        Self {
            seed: 42,
            spans: 100_000,
            start_ns: 1_764_460_800_000_000_000, // 2025-11-30T00:00:00Z
            rate: 20.0,
            error_rate: 0.03,
            anomalies: true,
            min_tokens: 16,
            max_tokens: 400,
            profile: Profile::Bench,
        }
    }
}

pub const SERVICES: [&str; 6] = [
    "llm-gateway",
    "tokenizer",
    "rag-retriever",
    "vector-db",
    "inference-engine",
    "postprocessor",
];
pub const MODELS: [(&str, &str, f64); 3] = [
    // (model, version, base inter-token latency ms)
    ("llama-3.1-8b", "llama-3.1-8b-2025-10", 18.0),
    ("llama-3.1-70b", "llama-3.1-70b-2025-09", 42.0),
    ("qwen2.5-32b", "qwen2.5-32b-2025-11", 30.0),
];
pub const ADAPTERS: [&str; 4] = ["none", "support-v3", "sql-gen-v1", "summarize-v2"];
pub const KV_STRATEGIES: [&str; 3] = ["paged", "prefix-cache", "fp8-paged"];
pub const WORKERS: usize = 8;
pub const TENANTS: [&str; 5] = ["acme", "globex", "initech", "umbrella", "hooli"];
pub const BATCH_SIZES: [i64; 5] = [1, 4, 8, 16, 32];

/// The injected anomalies: which dimensions they hang on and when they happen.
pub mod anomaly {
    /// Decode slows 4x for this model version with this adapter, in the second quarter.
    pub const SLOW_VERSION: &str = "llama-3.1-70b-2025-09";
    pub const SLOW_ADAPTER: &str = "sql-gen-v1";
    pub const SLOW_FACTOR: f64 = 4.0;
    /// This worker's time to first token about quadruples in the third quarter (its queue
    /// time 6x, its prefill 4x: a worker whose KV cache is full).
    pub const SLOW_WORKER: &str = "worker-3";
    pub const TTFT_FACTOR: f64 = 6.0;
    pub const PREFILL_FACTOR: f64 = 4.0;
}

/// One generated request: its spans with the service that emits each.
pub struct Request {
    pub trace_id: [u8; 16],
    pub start_ns: u64,
    pub spans: Vec<(usize, Span)>,
    /// The inference worker that served it.
    pub worker: usize,
}

pub struct Generator {
    cfg: GenConfig,
    rng: StdRng,
    now: f64,
    emitted: usize,
    requests: usize,
    arrivals: Exp<f64>,
    jitter: LogNormal<f64>,
    /// Rough span count of the whole run, to place anomalies in quarters of it.
    horizon_s: f64,
}

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}
fn s(key: &str, v: impl Into<String>) -> KeyValue {
    kv(key, any_value::Value::StringValue(v.into()))
}
fn i(key: &str, v: i64) -> KeyValue {
    kv(key, any_value::Value::IntValue(v))
}
fn f(key: &str, v: f64) -> KeyValue {
    kv(key, any_value::Value::DoubleValue(v))
}

impl Generator {
    pub fn new(cfg: GenConfig) -> Self {
        let avg_spans_per_request = 7.0 + (cfg.min_tokens + cfg.max_tokens) as f64 / 2.0;
        let horizon_s = cfg.spans as f64 / avg_spans_per_request / cfg.rate;
        Self {
            rng: StdRng::seed_from_u64(cfg.seed),
            arrivals: Exp::new(cfg.rate).expect("positive rate"),
            jitter: LogNormal::new(0.0, 0.18).expect("valid lognormal"),
            now: 0.0,
            emitted: 0,
            requests: 0,
            horizon_s,
            cfg,
        }
    }

    pub fn config(&self) -> &GenConfig {
        &self.cfg
    }

    /// Quarter `q` (0 to 3) of the run in data time, Unix ns: the injected anomalies' windows
    /// (requests arriving in it).
    pub fn quarter_ns(&self, q: u32) -> (u64, u64) {
        let at = |f: f64| self.cfg.start_ns + (f * self.horizon_s * 1e9) as u64;
        (at(f64::from(q) * 0.25), at(f64::from(q + 1) * 0.25))
    }

    fn id<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        while out.iter().all(|b| *b == 0) {
            self.rng.fill(&mut out[..]);
        }
        out
    }

    fn ms(&mut self, lo: f64, hi: f64) -> u64 {
        (self.rng.random_range(lo..hi) * 1e6) as u64
    }

    fn in_quarter(&self, q: u32, t: f64) -> bool {
        let frac = t / self.horizon_s.max(1e-9);
        frac >= f64::from(q) * 0.25 && frac < f64::from(q + 1) * 0.25
    }

    /// The next request, or `None` once the span budget is spent.
    pub fn next_request(&mut self) -> Option<Request> {
        if self.emitted >= self.cfg.spans {
            return None;
        }
        self.now += self.arrivals.sample(&mut self.rng);
        let t0 = self.cfg.start_ns + (self.now * 1e9) as u64;
        let trace_id: [u8; 16] = self.id();
        let req_no = self.requests;
        self.requests += 1;

        let (model, version, base_itl) = MODELS[self.rng.random_range(0..MODELS.len())];
        let adapter = ADAPTERS[self.rng.random_range(0..ADAPTERS.len())];
        let kv_strategy = KV_STRATEGIES[self.rng.random_range(0..KV_STRATEGIES.len())];
        let worker_n = self.rng.random_range(0..WORKERS);
        let worker = format!("worker-{worker_n}");
        let gpu = format!("gpu-{}", worker_n * 2 + self.rng.random_range(0..2));
        let batch = BATCH_SIZES[self.rng.random_range(0..BATCH_SIZES.len())];
        let tenant = TENANTS[self.rng.random_range(0..TENANTS.len())];
        let input_tokens = self.rng.random_range(40..3000i64);
        let output_tokens = i64::from(
            self.rng
                .random_range(self.cfg.min_tokens..=self.cfg.max_tokens),
        );
        let failed = self.rng.random_bool(self.cfg.error_rate);
        let old_names = req_no % 2 == 1; // half the fleet runs an older instrumentation

        let slow_decode = self.cfg.anomalies
            && version == anomaly::SLOW_VERSION
            && adapter == anomaly::SLOW_ADAPTER
            && self.in_quarter(1, self.now);
        let slow_ttft =
            self.cfg.anomalies && worker == anomaly::SLOW_WORKER && self.in_quarter(2, self.now);
        let itl_ms = base_itl
            * (1.0 + batch as f64 / 32.0)
            * if slow_decode {
                anomaly::SLOW_FACTOR
            } else {
                1.0
            };
        let queue_ns = self.ms(1.0, 25.0)
            * if slow_ttft {
                anomaly::TTFT_FACTOR as u64
            } else {
                1
            };

        let mut spans: Vec<(usize, Span)> = Vec::with_capacity(output_tokens as usize + 8);
        let root_id: [u8; 8] = self.id();
        let mut t = t0 + self.ms(0.2, 1.0);

        // tokenizer
        let tok_dur = self.ms(1.0, 6.0);
        let tok = self.span(
            trace_id,
            root_id,
            "tokenize",
            SpanKind::Server,
            t,
            t + tok_dur,
            vec![i("gen_ai.usage.input_tokens", input_tokens)],
        );
        spans.push((1, tok));
        t += tok_dur + self.ms(0.1, 0.5);

        // retrieval -> vector search
        let ret_id: [u8; 8] = self.id();
        let vs_dur = self.ms(4.0, 40.0);
        let ret_dur = vs_dur + self.ms(2.0, 10.0);
        let documents = self.rng.random_range(3..12);
        let ret = make_span(
            trace_id,
            ret_id,
            root_id,
            "retrieval docs-index",
            SpanKind::Client,
            t,
            t + ret_dur,
            vec![
                s("gen_ai.operation.name", "retrieval"),
                s("gen_ai.data_source.id", "docs-index"),
                i("retrieval.documents", documents),
            ],
        );
        spans.push((2, ret));
        let (vs_start, vs_end) = (t + self.ms(0.5, 1.5), t + ret_dur - self.ms(0.2, 1.0));
        let vs = self.span(
            trace_id,
            ret_id,
            "vector.search",
            SpanKind::Server,
            vs_start,
            vs_end,
            vec![
                s("db.system.name", "qdrant"),
                s("db.collection.name", "docs"),
                i("db.vector.top_k", 8),
            ],
        );
        spans.push((3, vs));
        t += ret_dur + self.ms(0.1, 0.5);

        // generation
        let prefill_ns = (input_tokens as f64
            * self.rng.random_range(0.05..0.12)
            * 1e6
            * if slow_ttft {
                anomaly::PREFILL_FACTOR
            } else {
                1.0
            }) as u64;
        let tokens_done = if failed {
            output_tokens / 3
        } else {
            output_tokens
        };
        let mut token_times = Vec::with_capacity(tokens_done as usize);
        let mut tt = t + queue_ns + prefill_ns;
        for _ in 0..tokens_done {
            let d = (itl_ms * self.jitter.sample(&mut self.rng) * 1e6) as u64;
            token_times.push((tt, tt + d));
            tt += d + self.rng.random_range(20_000..120_000);
        }
        let gen_end = tt + self.ms(0.2, 1.0);
        let chat_id: [u8; 8] = self.id();
        let gen_id: [u8; 8] = self.id();
        let finish = if failed {
            "error"
        } else if output_tokens == i64::from(self.cfg.max_tokens) {
            "length"
        } else {
            "stop"
        };
        let usage = |n: &str| -> String {
            match (old_names, n) {
                (true, "in") => "gen_ai.usage.prompt_tokens",
                (true, _) => "gen_ai.usage.completion_tokens",
                (false, "in") => "gen_ai.usage.input_tokens",
                (false, _) => "gen_ai.usage.output_tokens",
            }
            .into()
        };
        let provider_key = if old_names {
            "gen_ai.system"
        } else {
            "gen_ai.provider.name"
        };
        let chat_end = gen_end + self.ms(0.1, 0.4);
        let conversation = format!("conv-{:06}", self.rng.random_range(0..50_000));
        let mut chat = make_span(
            trace_id,
            chat_id,
            root_id,
            &format!("chat {model}"),
            SpanKind::Client,
            t,
            chat_end,
            vec![
                s("gen_ai.operation.name", "chat"),
                s(provider_key, "vllm"),
                s("gen_ai.request.model", model),
                s("gen_ai.response.model", model),
                i(&usage("in"), input_tokens),
                i(&usage("out"), tokens_done),
                kv(
                    "gen_ai.response.finish_reasons",
                    any_value::Value::ArrayValue(ArrayValue {
                        values: vec![AnyValue {
                            value: Some(any_value::Value::StringValue(finish.into())),
                        }],
                    }),
                ),
                s("gen_ai.conversation.id", conversation),
                f("gen_ai.request.temperature", 0.7),
                i("gen_ai.request.max_tokens", i64::from(self.cfg.max_tokens)),
            ],
        );
        let ttft_s =
            (queue_ns + prefill_ns + token_times.first().map_or(0, |(a, b)| b - a)) as f64 / 1e9;
        let gen_start = t + self.ms(0.05, 0.2);
        let mut generate = make_span(
            trace_id,
            gen_id,
            chat_id,
            "llm.generate",
            SpanKind::Server,
            gen_start,
            gen_end,
            vec![
                s("gen_ai.operation.name", "chat"),
                s("gen_ai.request.model", model),
                s("llm.model_version", version),
                s("llm.lora_adapter", adapter),
                s("llm.kv_cache_strategy", kv_strategy),
                i("llm.batch_size", batch),
                s("worker.id", worker.clone()),
                s("gpu.id", gpu),
                s("tenant.id", tenant),
                i(&usage("in"), input_tokens),
                i(&usage("out"), tokens_done),
                f("gen_ai.latency.time_in_queue", queue_ns as f64 / 1e9),
                f("gen_ai.latency.time_to_first_token", ttft_s),
                f(
                    "gen_ai.latency.time_in_model_prefill",
                    prefill_ns as f64 / 1e9,
                ),
                f(
                    "gen_ai.latency.time_in_model_decode",
                    (gen_end - t - queue_ns - prefill_ns) as f64 / 1e9,
                ),
                f("gen_ai.latency.e2e", (gen_end - t) as f64 / 1e9),
            ],
        );
        if failed {
            let message = "CUDA out of memory while allocating KV cache blocks";
            generate.status = Some(Status {
                code: StatusCode::Error as i32,
                message: message.into(),
            });
            chat.status = Some(Status {
                code: StatusCode::Error as i32,
                message: "upstream inference failed".into(),
            });
        }
        let prefill = self.span(
            trace_id,
            gen_id,
            "llm.prefill",
            SpanKind::Internal,
            t + queue_ns,
            t + queue_ns + prefill_ns,
            vec![i("gen_ai.usage.input_tokens", input_tokens)],
        );
        spans.push((0, chat));
        spans.push((4, generate));
        spans.push((4, prefill));
        let sdk = self.cfg.profile == Profile::Sdk;
        let mut previous = t + queue_ns + prefill_ns;
        for (n, (a, b)) in token_times.into_iter().enumerate() {
            // the SDK profile's engine measures from the previous token's emission
            let latency = if sdk { b - previous } else { b - a };
            previous = b;
            let tok = self.span(
                trace_id,
                gen_id,
                "llm.decode.token",
                SpanKind::Internal,
                a,
                b,
                vec![
                    i("llm.token.index", n as i64),
                    f("llm.token.latency_ms", latency as f64 / 1e6),
                ],
            );
            spans.push((4, tok));
        }
        t = gen_end + self.ms(0.3, 1.0);

        // postprocess
        let pp_dur = self.ms(0.5, 4.0);
        if !failed {
            let pp = self.span(
                trace_id,
                root_id,
                "postprocess",
                SpanKind::Internal,
                t,
                t + pp_dur,
                vec![s("postprocess.filters", "pii,toxicity")],
            );
            spans.push((5, pp));
        }
        let end = t + pp_dur + self.ms(0.2, 1.0);
        let mut root = make_span(
            trace_id,
            root_id,
            [0; 8],
            "POST /v1/chat/completions",
            SpanKind::Server,
            t0,
            end,
            vec![
                s("http.request.method", "POST"),
                s("http.route", "/v1/chat/completions"),
                i("http.response.status_code", if failed { 500 } else { 200 }),
                s("tenant.id", tenant),
                s("gen_ai.request.model", model),
            ],
        );
        if failed {
            root.status = Some(Status {
                code: StatusCode::Error as i32,
                message: "HTTP 500".into(),
            });
        }
        spans.insert(0, (0, root));
        if sdk {
            self.sdk_flags(&mut spans);
        }
        self.emitted += spans.len();
        Some(Request {
            trace_id,
            start_ns: t0,
            spans,
            worker: worker_n,
        })
    }

    /// W3C flags as an SDK sets them: sampled, and whether the parent is remote known
    /// (0x100) and set (0x200) where the parent is in another process (another service) or
    /// a root continues a caller's trace; a trace state now and then.
    fn sdk_flags(&mut self, spans: &mut [(usize, Span)]) {
        let remote_root = self.rng.random_bool(0.25);
        let state = self.rng.random_bool(0.1);
        let caller: [u8; 8] = self.id();
        let service_of: std::collections::HashMap<Vec<u8>, usize> = spans
            .iter()
            .map(|(svc, s)| (s.span_id.clone(), *svc))
            .collect();
        for (svc, span) in spans.iter_mut() {
            let remote = service_of
                .get(&span.parent_span_id)
                .is_some_and(|parent| parent != svc);
            span.flags = if remote { 0x301 } else { 0x101 };
            if state {
                span.trace_state = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE".into();
            }
            if span.parent_span_id.is_empty() && remote_root {
                span.parent_span_id = caller.to_vec();
                span.flags = 0x301;
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn span(
        &mut self,
        trace: [u8; 16],
        parent: [u8; 8],
        name: &str,
        kind: SpanKind,
        start: u64,
        end: u64,
        attributes: Vec<KeyValue>,
    ) -> Span {
        let id: [u8; 8] = self.id();
        make_span(trace, id, parent, name, kind, start, end, attributes)
    }
}

#[allow(clippy::too_many_arguments)]
fn make_span(
    trace: [u8; 16],
    id: [u8; 8],
    parent: [u8; 8],
    name: &str,
    kind: SpanKind,
    start: u64,
    end: u64,
    attributes: Vec<KeyValue>,
) -> Span {
    Span {
        trace_id: trace.to_vec(),
        span_id: id.to_vec(),
        parent_span_id: if parent == [0; 8] {
            Vec::new()
        } else {
            parent.to_vec()
        },
        name: name.into(),
        kind: kind as i32,
        start_time_unix_nano: start,
        end_time_unix_nano: end.max(start),
        attributes,
        status: Some(Status::default()),
        ..Default::default()
    }
}

fn resource(service: &str) -> Resource {
    Resource {
        attributes: vec![
            s("service.name", service),
            s("service.version", "1.4.2"),
            s("deployment.environment.name", "prod"),
            s("host.name", format!("{service}-host")),
        ],
        ..Default::default()
    }
}

/// The resource of one process of the SDK profile: a service replica or inference worker.
fn sdk_resource(service: &str, instance: usize) -> Resource {
    let pod = format!("{service}-{instance}-7d9f8");
    Resource {
        attributes: vec![
            s("service.name", service),
            s("service.version", "1.4.2"),
            s("service.instance.id", format!("{pod}-{instance:04x}")),
            s("service.namespace", "llm-serving"),
            s("deployment.environment.name", "prod"),
            s("host.name", format!("node-{}", instance % 3)),
            s("k8s.namespace.name", "llm-serving"),
            s("k8s.pod.name", pod),
            s("k8s.node.name", format!("node-{}", instance % 3)),
            s("cloud.provider", "aws"),
            s("cloud.region", "us-east-1"),
            i("process.pid", 4000 + instance as i64),
            s("process.runtime.name", "cpython"),
            s("process.runtime.version", "3.12.7"),
            s("telemetry.sdk.name", "opentelemetry"),
            s("telemetry.sdk.language", "python"),
            s("telemetry.sdk.version", "1.38.0"),
        ],
        ..Default::default()
    }
}

/// The instrumentation scope of a service in the SDK profile.
fn sdk_scope(service: usize) -> InstrumentationScope {
    let (name, version) = match SERVICES[service] {
        "llm-gateway" => ("opentelemetry.instrumentation.fastapi", "0.59b0"),
        "inference-engine" => ("vllm.tracing", "0.11.0"),
        "vector-db" => ("qdrant.tracing", "1.15.1"),
        _ => ("opentelemetry.instrumentation.httpx", "0.59b0"),
    };
    InstrumentationScope {
        name: name.into(),
        version: version.into(),
        attributes: vec![s("library.kind", "auto")],
        ..Default::default()
    }
}

/// The SDK profile's exporters: one per process, each sending its spans as they end, in
/// messages of `batch_spans`. Spans wait in end order until no later request can end before
/// them.
pub struct SdkBatcher {
    batch_spans: usize,
    /// Spans by end time, with the process that emits each.
    ended: std::collections::BinaryHeap<std::cmp::Reverse<Ended>>,
    queues: std::collections::BTreeMap<(usize, usize), Vec<Span>>,
    seq: u64,
    ready: std::collections::VecDeque<ExportTraceServiceRequest>,
}

/// A span waiting for its end to come, ordered by end time, then arrival.
pub struct Ended {
    end: u64,
    seq: u64,
    process: (usize, usize),
    span: Span,
}

impl PartialEq for Ended {
    fn eq(&self, other: &Self) -> bool {
        (self.end, self.seq) == (other.end, other.seq)
    }
}
impl Eq for Ended {}
impl PartialOrd for Ended {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ended {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.end, self.seq).cmp(&(other.end, other.seq))
    }
}

impl SdkBatcher {
    pub fn new(batch_spans: usize) -> Self {
        Self {
            batch_spans: batch_spans.max(1),
            ended: Default::default(),
            queues: Default::default(),
            seq: 0,
            ready: Default::default(),
        }
    }

    /// Adds a request; messages become ready as spans that ended before it fill them.
    pub fn push(&mut self, req: Request) {
        // nothing generated later ends before this request starts
        self.release(req.start_ns);
        let replica = usize::from(req.trace_id[0] % 2);
        for (svc, span) in req.spans {
            let instance = if SERVICES[svc] == "inference-engine" {
                req.worker
            } else {
                replica
            };
            self.seq += 1;
            self.ended.push(std::cmp::Reverse(Ended {
                end: span.end_time_unix_nano,
                seq: self.seq,
                process: (svc, instance),
                span,
            }));
        }
    }

    fn release(&mut self, until: u64) {
        while self.ended.peek().is_some_and(|e| e.0.end <= until) {
            let e = self.ended.pop().expect("peeked").0;
            let queue = self.queues.entry(e.process).or_default();
            queue.push(e.span);
            if queue.len() >= self.batch_spans {
                let spans = std::mem::take(queue);
                self.ready.push_back(sdk_message(e.process, spans));
            }
        }
    }

    pub fn next_ready(&mut self) -> Option<ExportTraceServiceRequest> {
        self.ready.pop_front()
    }

    /// Everything still held, as the exporters' last messages at shutdown.
    pub fn finish(&mut self) -> Option<ExportTraceServiceRequest> {
        self.release(u64::MAX);
        if let Some(m) = self.ready.pop_front() {
            return Some(m);
        }
        let (&process, _) = self.queues.iter().find(|(_, q)| !q.is_empty())?;
        let spans = std::mem::take(self.queues.get_mut(&process).expect("found"));
        Some(sdk_message(process, spans))
    }
}

fn sdk_message((svc, instance): (usize, usize), spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(sdk_resource(SERVICES[svc], instance)),
            scope_spans: vec![ScopeSpans {
                scope: Some(sdk_scope(svc)),
                spans,
                schema_url: "https://opentelemetry.io/schemas/1.37.0".into(),
            }],
            schema_url: "https://opentelemetry.io/schemas/1.37.0".into(),
        }],
    }
}

/// Packs requests into OTLP messages of about `batch_spans` spans, grouped by service.
pub struct Batcher {
    batch_spans: usize,
    pending: Vec<Vec<Span>>,
    count: usize,
}

impl Batcher {
    pub fn new(batch_spans: usize) -> Self {
        Self {
            batch_spans,
            pending: vec![Vec::new(); SERVICES.len()],
            count: 0,
        }
    }

    /// Adds a request; returns a full message when one is ready.
    pub fn push(&mut self, req: Request) -> Option<ExportTraceServiceRequest> {
        for (svc, span) in req.spans {
            self.pending[svc].push(span);
            self.count += 1;
        }
        (self.count >= self.batch_spans).then(|| self.take())
    }

    /// The remaining spans, if any.
    pub fn finish(&mut self) -> Option<ExportTraceServiceRequest> {
        (self.count > 0).then(|| self.take())
    }

    fn take(&mut self) -> ExportTraceServiceRequest {
        self.count = 0;
        let resource_spans = self
            .pending
            .iter_mut()
            .enumerate()
            .filter(|(_, spans)| !spans.is_empty())
            .map(|(svc, spans)| ResourceSpans {
                resource: Some(resource(SERVICES[svc])),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "weft-bench".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    spans: std::mem::take(spans),
                    schema_url: String::new(),
                }],
                schema_url: "https://opentelemetry.io/schemas/1.37.0".into(),
            })
            .collect();
        ExportTraceServiceRequest { resource_spans }
    }
}

/// Generates the whole data set as OTLP messages of about `batch_spans` spans.
pub fn batches(
    cfg: GenConfig,
    batch_spans: usize,
) -> impl Iterator<Item = ExportTraceServiceRequest> {
    let sdk = cfg.profile == Profile::Sdk;
    let mut generator = Generator::new(cfg);
    let mut batcher = Batcher::new(batch_spans);
    let mut exporters = SdkBatcher::new(batch_spans);
    let mut done = false;
    std::iter::from_fn(move || {
        if sdk {
            loop {
                if let Some(m) = exporters.next_ready() {
                    return Some(m);
                }
                match generator.next_request() {
                    Some(req) => exporters.push(req),
                    None => return exporters.finish(),
                }
            }
        }
        while !done {
            match generator.next_request() {
                Some(req) => {
                    if let Some(b) = batcher.push(req) {
                        return Some(b);
                    }
                }
                None => done = true,
            }
        }
        batcher.finish()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_data_and_budget_respected() {
        let cfg = GenConfig {
            spans: 5_000,
            ..Default::default()
        };
        let a: Vec<_> = batches(cfg.clone(), 2000).collect();
        let b: Vec<_> = batches(cfg, 2000).collect();
        assert_eq!(a, b);
        let total: usize = a
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        assert!((5_000..5_000 + 420).contains(&total), "{total}");
        let tokens = a
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
            .filter(|s| s.name == "llm.decode.token")
            .count();
        assert!(
            tokens * 10 > total * 8,
            "token spans dominate: {tokens} of {total}"
        );
    }

    #[test]
    fn the_sdk_profile_splits_traces_and_sends_children_first() {
        let cfg = GenConfig {
            spans: 20_000,
            profile: Profile::Sdk,
            ..Default::default()
        };
        let messages: Vec<_> = batches(cfg.clone(), 512).collect();
        assert_eq!(messages, batches(cfg, 512).collect::<Vec<_>>());
        let mut seen = std::collections::HashMap::new(); // span id -> message
        let mut total = 0;
        for (m, msg) in messages.iter().enumerate() {
            assert_eq!(msg.resource_spans.len(), 1, "one process per message");
            let spans = &msg.resource_spans[0].scope_spans[0].spans;
            assert!(spans.len() <= 512);
            total += spans.len();
            for s in spans {
                seen.insert(s.span_id.clone(), m);
                assert_eq!(s.flags & 0x1ff, 0x101, "sampled, locality known");
            }
        }
        assert!((20_000..20_420).contains(&total), "{total}");
        let all: Vec<_> = messages
            .iter()
            .flat_map(|m| &m.resource_spans[0].scope_spans[0].spans)
            .collect();
        // children sent before their parents, in an earlier message
        let early = all
            .iter()
            .filter(|s| {
                seen.get(&s.parent_span_id)
                    .is_some_and(|p| *p > seen[&s.span_id])
            })
            .count();
        assert!(early > 100, "{early} spans sent before their parents");
        // roots continued from a caller that Weft never sees
        let remote = all.iter().filter(|s| s.flags == 0x301).count();
        assert!(remote > 0);
        // token latencies measured from the previous token, not the span
        let differ = all
            .iter()
            .filter(|s| s.name == "llm.decode.token")
            .filter(|s| {
                s.attributes.iter().any(|a| {
                    a.key == "llm.token.latency_ms"
                        && a.value.as_ref().and_then(|v| v.value.as_ref())
                            != Some(&any_value::Value::DoubleValue(
                                (s.end_time_unix_nano - s.start_time_unix_nano) as f64 / 1e6,
                            ))
                })
            })
            .count();
        assert!(differ > 1000, "{differ}");
    }
}
