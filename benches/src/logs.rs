//! LLM-serving logs, deterministic by seed: per request, the records a platform team sees from
//! a gateway and an inference server — the prompt (as a GenAI content event or in the one-line
//! `[PROMPT] … [RESPONSE] … [LOGITS] {…}` form), the inference metrics as `key=value` pairs, the
//! response (a `gen_ai.choice` event with a JSON body), a few errors — tied to the request's
//! trace and span ids, with bodies from a varied vocabulary and personal data planted in a few
//! prompts (which redaction must remove).

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::resource::v1::Resource;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Words prompts and responses are made of.
const WORDS: &[&str] = &[
    "account",
    "refund",
    "charged",
    "twice",
    "order",
    "shipping",
    "delivery",
    "invoice",
    "password",
    "reset",
    "login",
    "subscription",
    "cancel",
    "upgrade",
    "plan",
    "billing",
    "error",
    "timeout",
    "latency",
    "model",
    "summarize",
    "translate",
    "document",
    "contract",
    "policy",
    "warranty",
    "return",
    "exchange",
    "discount",
    "coupon",
    "payment",
    "card",
    "declined",
    "address",
    "update",
    "email",
    "phone",
    "support",
    "agent",
    "escalate",
    "urgent",
    "please",
    "help",
    "why",
    "when",
    "how",
    "what",
    "where",
    "status",
    "tracking",
    "package",
    "missing",
    "damaged",
    "replacement",
    "credit",
    "balance",
    "statement",
    "question",
    "answer",
    "explain",
    "difference",
    "between",
    "compare",
    "recommend",
    "product",
    "feature",
    "bug",
    "crash",
    "install",
    "configure",
    "api",
    "key",
    "quota",
    "limit",
    "rate",
    "token",
    "context",
    "window",
    "retrieval",
    "search",
    "vector",
    "index",
    "embedding",
    "cluster",
    "node",
    "gpu",
    "memory",
    "cache",
    "batch",
    "queue",
    "schedule",
    "deploy",
    "rollback",
    "version",
    "adapter",
    "fine",
    "tune",
    "dataset",
    "evaluation",
    "accuracy",
    "hallucination",
    "citation",
    "source",
    "report",
    "draft",
    "email",
    "reply",
    "meeting",
    "agenda",
    "notes",
    "action",
    "items",
    "deadline",
    "budget",
    "forecast",
];
const MODELS: &[(&str, &str)] = &[
    ("llama-3.1-8b", "2025-10"),
    ("llama-3.1-70b", "2025-09"),
    ("qwen2.5-32b", "2025-11"),
    ("mistral-7b", "2025-08"),
];
/// Personal data planted in prompts, in warnings and in attributes (redaction must remove
/// every one of them before disk unless a tenant turns it off).
pub const PLANTED: &[&str] = &[
    "jane.doe@example.com",
    "+1 415-555-0132",
    "4539 1488 0343 6467",
    "sk-proj-abcdefghijklmnop1234",
    "203.0.113.77",
    "AKIAPLANTEDKEY000000",
];

/// The context leaks planted in a few requests (the kinds the leak scan reports).
pub const PLANTED_LEAKS: &[&str] = &["raw_prompt_header", "prompt_fanout", "repeated_prompt_hash"];

/// The service that copies prompts where they should not go (a `prompt_fanout` leak).
pub const LEAK_SERVICE: &str = "analytics-sink";

/// What to generate.
#[derive(Clone, Debug)]
pub struct LogConfig {
    pub seed: u64,
    /// Records to generate (whole requests: a few more).
    pub records: usize,
    /// Requests per second of simulated traffic.
    pub rate: f64,
    pub start_ns: u64,
    /// Records per export message.
    pub batch: usize,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            seed: 42,
            records: 100_000,
            rate: 200.0,
            start_ns: 1_764_460_800_000_000_000,
            batch: 2000,
        }
    }
}

fn attr(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(text(value)),
        ..Default::default()
    }
}

fn text(value: &str) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(value.into())),
    }
}

struct Gen {
    rng: StdRng,
    cfg: LogConfig,
    request: u64,
    emitted: usize,
}

impl Gen {
    fn sentence(&mut self, lo: usize, hi: usize) -> String {
        let n = self.rng.random_range(lo..hi);
        let mut words: Vec<&str> = (0..n)
            .map(|_| WORDS[self.rng.random_range(0..WORDS.len())])
            .collect();
        if self.rng.random_bool(0.02) {
            words.push(PLANTED[self.rng.random_range(0..PLANTED.len())]);
        }
        words.join(" ")
    }

    /// The records of one request: (service index, record).
    fn request(&mut self) -> Vec<(usize, LogRecord)> {
        let t0 = self.cfg.start_ns + (self.request as f64 / self.cfg.rate * 1e9) as u64;
        self.request += 1;
        let trace: [u8; 16] = self.rng.random();
        let span: [u8; 8] = self.rng.random();
        let (model, version) = MODELS[self.rng.random_range(0..MODELS.len())];
        let worker = format!("worker-{}", self.rng.random_range(0..8));
        let gpu = format!("gpu-{}", self.rng.random_range(0..16));
        let record =
            |at: u64, severity: i32, body: String, event: &str, attributes: Vec<KeyValue>| {
                LogRecord {
                    time_unix_nano: at,
                    observed_time_unix_nano: at + 1_000,
                    severity_number: severity,
                    severity_text: match severity {
                        17 => "ERROR",
                        13 => "WARN",
                        _ => "INFO",
                    }
                    .into(),
                    body: Some(text(&body)),
                    attributes,
                    trace_id: trace.to_vec(),
                    span_id: span.to_vec(),
                    event_name: event.into(),
                    ..Default::default()
                }
            };
        let prompt = self.sentence(6, 40);
        let answer = self.sentence(10, 60);
        let prefill = self.rng.random_range(5.0..120.0f64);
        let decode = self.rng.random_range(80.0..4000.0f64);
        let tokens = self.rng.random_range(16..800);
        let mut out = Vec::with_capacity(5);
        if self.rng.random_bool(0.5) {
            out.push((
                0,
                record(t0, 9, prompt.clone(), "gen_ai.user.message", vec![]),
            ));
        } else {
            out.push((
                0,
                record(
                    t0,
                    9,
                    format!("[PROMPT] {prompt}"),
                    "",
                    vec![attr("http.route", "/v1/chat/completions")],
                ),
            ));
        }
        let metrics = format!(
            "request done model={model} model_version={version} step={tokens} prefill_ms={prefill:.2} decode_ms={decode:.1} kv_cache_hit_rate={:.2} tokens_per_s={:.1} worker={worker} gpu={gpu}",
            self.rng.random_range(0.0..1.0f64),
            tokens as f64 / decode * 1000.0
        );
        let done = t0 + ((prefill + decode) * 1e6) as u64;
        out.push((1, record(done, 9, metrics, "", vec![])));
        // the prompt's hash, as a gateway logs it
        let hash = {
            use sha2::Digest;
            hex::encode(&sha2::Sha256::digest(prompt.as_bytes())[..8])
        };
        out[0].1.attributes.push(attr("llm.prompt.hash", &hash));
        if self.rng.random_bool(0.5) {
            let body = format!(
                r#"{{"finish_reason":"stop","model":"{model}","message":{{"content":"{answer}"}}}}"#
            );
            out.push((1, record(done + 500, 9, body, "gen_ai.choice", vec![])));
        } else {
            let body = format!(
                r#"[PROMPT] {prompt} [RESPONSE] {answer} [LOGITS] {{"q":{:.2},"step":{tokens}}}"#,
                self.rng.random_range(0.0..1.0f64)
            );
            out.push((1, record(done + 500, 9, body, "", vec![])));
        }
        if self.rng.random_bool(0.03) {
            let body =
                format!("CUDA out of memory on {gpu} while allocating KV cache blocks for {model}");
            out.push((
                1,
                record(
                    done + 700,
                    17,
                    body,
                    "",
                    vec![attr("exception.type", "torch.OutOfMemoryError")],
                ),
            ));
        }
        if self.rng.random_bool(0.1) {
            let mut body = format!(
                "slow request: queue wait {:.0} ms on {worker}",
                self.rng.random_range(200.0..3000.0f64)
            );
            if self.rng.random_bool(0.3) {
                body.push_str(&format!(" for {} from {}", PLANTED[0], PLANTED[4]));
            }
            out.push((0, record(done + 900, 13, body, "", vec![])));
        }
        if self.rng.random_bool(0.01) {
            // personal data outside any prompt: in a warning's text and in attributes
            let body = format!(
                "rejected api key {} for {}; retry with key {}",
                PLANTED[3], PLANTED[0], PLANTED[5]
            );
            let attributes = vec![
                attr("enduser.phone", PLANTED[1]),
                attr("payment.note", &format!("card {}", PLANTED[2])),
                attr("client.address", PLANTED[4]),
            ];
            out.push((0, record(done + 950, 13, body, "", attributes)));
        }
        if self.rng.random_bool(0.005) {
            match PLANTED_LEAKS[self.rng.random_range(0..PLANTED_LEAKS.len())] {
                "raw_prompt_header" => out[0]
                    .1
                    .attributes
                    .push(attr("http.request.header.x-raw-prompt", &prompt)),
                "prompt_fanout" => {
                    out[1].1.attributes.push(attr("llm.prompt.hash", &hash));
                    let body = format!("exported prompt {hash} to the analytics warehouse");
                    let attributes = vec![attr("llm.prompt.hash", &hash)];
                    out.push((2, record(done + 1_000, 9, body, "", attributes)));
                }
                _ => {
                    for chunk in 0..6 {
                        let body = format!("stream chunk {chunk}");
                        let attributes = vec![attr("llm.prompt.hash", &hash)];
                        out.push((1, record(done + 10 * chunk, 9, body, "", attributes)));
                    }
                }
            }
        }
        out
    }
}

fn resource(service: &str) -> Resource {
    Resource {
        attributes: vec![attr("service.name", service)],
        ..Default::default()
    }
}

/// Export messages of about `cfg.batch` records each, until `cfg.records` are generated.
pub fn log_batches(cfg: LogConfig) -> impl Iterator<Item = ExportLogsServiceRequest> {
    let mut g = Gen {
        rng: StdRng::seed_from_u64(cfg.seed),
        cfg,
        request: 0,
        emitted: 0,
    };
    std::iter::from_fn(move || {
        if g.emitted >= g.cfg.records {
            return None;
        }
        let mut by_service: [Vec<LogRecord>; 3] = [Vec::new(), Vec::new(), Vec::new()];
        let mut n = 0;
        while n < g.cfg.batch && g.emitted < g.cfg.records {
            for (service, record) in g.request() {
                by_service[service].push(record);
                n += 1;
                g.emitted += 1;
            }
        }
        let [gateway, engine, sink] = by_service;
        Some(ExportLogsServiceRequest {
            resource_logs: [
                ("llm-gateway", gateway),
                ("inference-engine", engine),
                (LEAK_SERVICE, sink),
            ]
            .into_iter()
            .filter(|(_, records)| !records.is_empty())
            .map(|(service, records)| ResourceLogs {
                resource: Some(resource(service)),
                scope_logs: vec![ScopeLogs {
                    scope: Some(InstrumentationScope {
                        name: format!("{service}.logger"),
                        ..Default::default()
                    }),
                    log_records: records,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            })
            .collect(),
        })
    })
}

/// Records in a message.
pub fn records_in(m: &ExportLogsServiceRequest) -> usize {
    m.resource_logs
        .iter()
        .flat_map(|r| &r.scope_logs)
        .map(|s| s.log_records.len())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_logs_and_the_budget_is_kept() {
        let cfg = LogConfig {
            records: 5_000,
            batch: 700,
            ..Default::default()
        };
        let a: Vec<_> = log_batches(cfg.clone()).collect();
        let b: Vec<_> = log_batches(cfg).collect();
        assert_eq!(a, b);
        let n: usize = a.iter().map(records_in).sum();
        assert!((5_000..5_010).contains(&n), "{n}");
    }
}
