//! What a log record means for an LLM request: its class (`prompt_input`, `inference_metrics`,
//! `response_output`, `error`, `other`) and the typed fields LLM servers log (model, version,
//! generation step, finish reasons, output tokens, kv-cache hit rate, prefill and decode
//! times, tokens/s, worker, GPU), taken from the attributes first, then from the body in
//! whatever form it came: structured, JSON text, `key=value` pairs, or the one-line
//! `[PROMPT] … [RESPONSE] … [LOGITS] {…}` form split into its segments. It runs after
//! redaction, so it sees (and copies into typed columns) only what may be stored. What cannot
//! be parsed is kept as it came and counted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value as J;
use weft_storage::model::{KeyValue, LogClass, LogRecord, LogSemantics, Value};

/// A semantic field and the keys it is found under (attribute names, then the snake_case
/// names servers print).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Field {
    Model,
    ModelVersion,
    GenerationStep,
    FinishReasons,
    OutputTokens,
    KvCacheHitRate,
    PrefillMs,
    DecodeMs,
    TokensPerS,
    Worker,
    Gpu,
}

const KEYS: &[(Field, &[&str])] = &[
    (
        Field::Model,
        &[
            "llm.model",
            "gen_ai.response.model",
            "gen_ai.request.model",
            "model",
        ],
    ),
    (Field::ModelVersion, &["llm.model_version", "model_version"]),
    (
        Field::GenerationStep,
        &["llm.generation_step", "generation_step", "step"],
    ),
    (
        Field::FinishReasons,
        &[
            "gen_ai.response.finish_reasons",
            "finish_reasons",
            "finish_reason",
        ],
    ),
    (
        Field::OutputTokens,
        &[
            "gen_ai.usage.output_tokens",
            "gen_ai.usage.completion_tokens",
            "output_tokens",
            "completion_tokens",
        ],
    ),
    (
        Field::KvCacheHitRate,
        &[
            "llm.kv_cache.hit_rate",
            "kv_cache_hit_rate",
            "cache_hit_rate",
        ],
    ),
    (Field::PrefillMs, &["llm.prefill_ms", "prefill_ms"]),
    (Field::DecodeMs, &["llm.decode_ms", "decode_ms"]),
    (
        Field::TokensPerS,
        &["llm.tokens_per_s", "tokens_per_s", "tokens_per_second"],
    ),
    (Field::Worker, &["worker.id", "worker_id", "worker"]),
    (Field::Gpu, &["gpu.id", "gpu_id", "gpu"]),
];

fn field_of(key: &str) -> Option<Field> {
    static INDEX: std::sync::OnceLock<HashMap<&'static str, Field>> = std::sync::OnceLock::new();
    let index = INDEX.get_or_init(|| {
        KEYS.iter()
            .flat_map(|(f, keys)| keys.iter().map(move |k| (*k, *f)))
            .collect()
    });
    index.get(key).copied()
}

/// Records whose body could not be parsed (kept as they came).
#[derive(Debug, Default)]
pub struct ParseStats {
    pub failures: AtomicU64,
}

/// Parses every record's semantics in place.
pub fn annotate(logs: &mut [LogRecord], stats: &ParseStats) {
    let mut failures = 0;
    for l in logs {
        let (semantics, failed) = parse(l);
        l.semantics = semantics;
        failures += u64::from(failed);
    }
    if failures > 0 {
        stats.failures.fetch_add(failures, Ordering::Relaxed);
    }
}

/// A record's semantics, and whether part of its body looked structured but did not parse.
pub fn parse(l: &LogRecord) -> (LogSemantics, bool) {
    let mut found = Found::default();
    for kv in &l.attributes {
        found.offer(&kv.key, &kv.value);
    }
    let mut markers = Vec::new();
    let body_failed = match &l.body {
        Value::KvList(kvs) => {
            offer_all(&mut found, kvs);
            false
        }
        Value::Str(text) => body_text(text, &mut found, &mut markers),
        _ => false,
    };
    let failed = found.failed || body_failed;
    let class = class_of(l, &markers, &found);
    (found.into_semantics(class), failed)
}

fn offer_all(found: &mut Found, kvs: &[KeyValue]) {
    for kv in kvs {
        found.offer(&kv.key, &kv.value);
    }
}

/// Reads a text body: JSON, the one-line marked form, or `key=value` pairs. Returns whether
/// something that looked structured failed to parse.
fn body_text(text: &str, found: &mut Found, markers: &mut Vec<String>) -> bool {
    let trimmed = text.trim();
    if trimmed.starts_with('{') {
        return json_object(trimmed, found);
    }
    let mut failed = false;
    for (marker, segment) in segments(trimmed) {
        if let Some(m) = marker {
            markers.push(m.to_owned());
        }
        let segment = segment.trim();
        if segment.starts_with('{') {
            failed |= json_object(segment, found);
        } else if marker.is_none_or(|m| !matches!(m, "PROMPT" | "RESPONSE" | "COMPLETION")) {
            key_values(segment, found);
        }
    }
    failed
}

/// Fields of a JSON object; true when it is not one.
fn json_object(text: &str, found: &mut Found) -> bool {
    match serde_json::from_str::<J>(text) {
        Ok(J::Object(map)) => {
            for (k, v) in &map {
                found.offer(k, &json_value(v));
            }
            false
        }
        _ => true,
    }
}

fn json_value(v: &J) -> Value {
    match v {
        J::String(s) => Value::Str(s.clone()),
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => n
            .as_i64()
            .map(Value::Int)
            .or_else(|| n.as_f64().map(Value::Double))
            .unwrap_or_default(),
        J::Array(items) => Value::Array(items.iter().map(json_value).collect()),
        J::Object(_) | J::Null => Value::Empty,
    }
}

/// `key=value` pairs separated by spaces or commas (values may be quoted).
fn key_values(text: &str, found: &mut Found) {
    for token in text.split([' ', ',', ';', '\t']) {
        let Some((k, v)) = token.split_once('=') else {
            continue;
        };
        let v = v.trim_matches(|c| c == '"' || c == '\'');
        if !k.is_empty() && !v.is_empty() {
            found.offer(k, &Value::Str(v.to_owned()));
        }
    }
}

/// The line cut at `[UPPERCASE]` markers: (marker, text after it); text before the first
/// marker has none.
fn segments(text: &str) -> Vec<(Option<&str>, &str)> {
    let mut out = Vec::new();
    let mut marker = None;
    let mut rest = text;
    loop {
        match next_marker(rest) {
            Some((at, name, end)) => {
                if at > 0 || marker.is_some() {
                    out.push((marker, &rest[..at]));
                }
                marker = Some(name);
                rest = &rest[end..];
            }
            None => {
                out.push((marker, rest));
                return out;
            }
        }
    }
}

/// The next `[UPPERCASE]` marker: where it starts, its name, where it ends.
fn next_marker(text: &str) -> Option<(usize, &str, usize)> {
    text.match_indices('[').find_map(|(i, _)| {
        let tail = &text[i + 1..];
        let end = tail.find(']')?;
        let name = &tail[..end];
        (end > 1 && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')).then_some((
            i,
            name,
            i + end + 2,
        ))
    })
}

fn class_of(l: &LogRecord, markers: &[String], found: &Found) -> LogClass {
    let event = match l.attributes.iter().find(|kv| kv.key == "event.name") {
        Some(KeyValue {
            value: Value::Str(name),
            ..
        }) if l.event_name.is_empty() => name.as_str(),
        _ => l.event_name.as_str(),
    };
    let has = |key: &str| {
        l.attributes
            .iter()
            .any(|kv| kv.key == key || kv.key.strip_suffix(".hash") == Some(key))
    };
    match event {
        "gen_ai.user.message" | "gen_ai.system.message" | "gen_ai.tool.message" => {
            return LogClass::PromptInput;
        }
        "gen_ai.choice" | "gen_ai.assistant.message" => return LogClass::ResponseOutput,
        "gen_ai.client.inference.operation.details" => {
            return match has("gen_ai.output.messages") {
                true => LogClass::ResponseOutput,
                false => LogClass::PromptInput,
            };
        }
        e if e.contains("metrics") || e.contains("stats") => return LogClass::InferenceMetrics,
        _ => {}
    }
    let error_text = matches!(
        l.severity_text.to_ascii_uppercase().as_str(),
        "ERROR" | "FATAL" | "CRITICAL"
    );
    if l.severity_number >= 17 || (l.severity_number == 0 && error_text) {
        return LogClass::Error;
    }
    let marked = |m: &str| markers.iter().any(|x| x == m);
    if marked("RESPONSE") || marked("COMPLETION") {
        return LogClass::ResponseOutput;
    }
    if marked("PROMPT") {
        return LogClass::PromptInput;
    }
    if found.has_metrics() {
        return LogClass::InferenceMetrics;
    }
    LogClass::Other
}

/// Fields found so far (the first source of each wins).
#[derive(Default)]
struct Found {
    s: LogSemantics,
    failed: bool,
}

impl Found {
    fn offer(&mut self, key: &str, v: &Value) {
        let Some(field) = field_of(key) else {
            return;
        };
        let s = &mut self.s;
        let ok = match field {
            Field::Model => set_text(&mut s.model, v),
            Field::ModelVersion => set_text(&mut s.model_version, v),
            Field::Worker => set_text(&mut s.worker, v),
            Field::Gpu => set_text(&mut s.gpu, v),
            Field::GenerationStep => set_int(&mut s.generation_step, v),
            Field::OutputTokens => set_int(&mut s.output_tokens, v),
            Field::KvCacheHitRate => set_float(&mut s.kv_cache_hit_rate, v),
            Field::PrefillMs => set_float(&mut s.prefill_ms, v),
            Field::DecodeMs => set_float(&mut s.decode_ms, v),
            Field::TokensPerS => set_float(&mut s.tokens_per_s, v),
            Field::FinishReasons => set_reasons(&mut s.finish_reasons, v),
        };
        self.failed |= !ok;
    }

    fn has_metrics(&self) -> bool {
        let s = &self.s;
        s.prefill_ms.is_some()
            || s.decode_ms.is_some()
            || s.tokens_per_s.is_some()
            || s.kv_cache_hit_rate.is_some()
            || s.output_tokens.is_some()
            || s.generation_step.is_some()
    }

    fn into_semantics(self, class: LogClass) -> LogSemantics {
        LogSemantics { class, ..self.s }
    }
}

/// Each setter keeps the first value found; false when the value has the wrong shape.
fn set_text(slot: &mut Option<String>, v: &Value) -> bool {
    let text = match v {
        Value::Str(s) if !s.is_empty() => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => return false,
    };
    slot.get_or_insert(text);
    true
}

fn set_int(slot: &mut Option<i64>, v: &Value) -> bool {
    let n = match v {
        Value::Int(i) => Some(*i),
        Value::Double(d) if d.fract() == 0.0 && d.is_finite() => Some(*d as i64),
        Value::Str(s) => s.trim().parse().ok(),
        _ => None,
    };
    n.map(|n| *slot.get_or_insert(n)).is_some()
}

fn set_float(slot: &mut Option<f64>, v: &Value) -> bool {
    let n = match v {
        Value::Double(d) => Some(*d),
        Value::Int(i) => Some(*i as f64),
        Value::Str(s) => s.trim().trim_end_matches("ms").parse().ok(),
        _ => None,
    };
    n.filter(|n: &f64| n.is_finite())
        .map(|n| *slot.get_or_insert(n))
        .is_some()
}

fn set_reasons(slot: &mut Option<Vec<String>>, v: &Value) -> bool {
    let reasons = match v {
        Value::Str(s) => s.split(',').map(|r| r.trim().to_owned()).collect(),
        Value::Array(items) => items.iter().filter_map(Value::text).collect(),
        _ => return false,
    };
    slot.get_or_insert(reasons);
    true
}

#[cfg(test)]
mod tests;
