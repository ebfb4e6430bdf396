//! Redaction at ingest, before a row reaches the write-ahead head (so before anything touches
//! disk), per tenant:
//!
//! - **content attributes** (prompts, completions, system instructions, raw-prompt headers, and
//!   configured keys) on spans, span events and log records are replaced by `<key>.hash` (the
//!   first 16 hex digits of the SHA-256 of the value's text) and `<key>.length` (its length in
//!   bytes), unless the tenant captures content;
//! - **personal data** in log bodies and string attribute values (span, event, link and log
//!   attributes; not resource or scope attributes, which describe the sender) is replaced by
//!   typed placeholders (`<email>`, `<phone>`, `<card>`, `<api_key>`, `<bearer_token>`, `<ip>`,
//!   and `<NAME>` for a configured pattern), on by default; each replacement is counted per
//!   rule. The rules are in [`rules`];
//! - **content in log bodies**, unless the tenant captures content: the body of a GenAI content
//!   event (`gen_ai.user.message`, `gen_ai.choice`, …) and the `[PROMPT]` / `[RESPONSE]`
//!   segments of the one-line form some servers print become
//!   `<content hash=… length=…>` (the same hash and length as a content attribute).

mod rules;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use regex::Regex;
use sha2::{Digest, Sha256};
use weft_storage::model::{KeyValue, LogRecord, SpanRecord, TenantId, Value};

pub use rules::{PiiRules, RuleError};

/// Content attributes redacted unless a tenant captures content.
pub use weft_storage::schema::CONTENT_KEYS;

/// Log events whose body is a prompt or a completion.
pub const CONTENT_EVENTS: &[&str] = &[
    "gen_ai.client.inference.operation.details",
    "gen_ai.user.message",
    "gen_ai.system.message",
    "gen_ai.assistant.message",
    "gen_ai.tool.message",
    "gen_ai.choice",
];

/// Markers of the one-line form whose segment (up to the next `[MARKER]`) is content.
const CONTENT_MARKERS: &[&str] = &["[PROMPT]", "[RESPONSE]", "[COMPLETION]"];

/// One tenant's redaction.
#[derive(Clone, Debug)]
pub struct Redaction {
    /// Keep content attributes as they came.
    pub capture_content: bool,
    /// Content keys besides [`CONTENT_KEYS`].
    pub content_keys: Vec<String>,
    /// Personal-data rules; `None` turns personal-data redaction off.
    pub pii: Option<PiiRules>,
}

impl Default for Redaction {
    fn default() -> Self {
        Self {
            capture_content: false,
            content_keys: Vec::new(),
            pii: Some(PiiRules::builtin()),
        }
    }
}

/// Every tenant's redaction: a default and per-tenant overrides.
#[derive(Clone, Debug, Default)]
pub struct RedactionPolicy {
    pub default: Redaction,
    pub tenants: HashMap<TenantId, Redaction>,
}

impl RedactionPolicy {
    pub fn of(&self, tenant: &TenantId) -> &Redaction {
        self.tenants.get(tenant).unwrap_or(&self.default)
    }
}

/// Replacements made, by rule (`content` for content attributes), for `/metrics`.
#[derive(Debug, Default)]
pub struct RedactionStats(Mutex<BTreeMap<String, u64>>);

impl RedactionStats {
    fn add(&self, counts: Counts) {
        if counts.0.is_empty() {
            return;
        }
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for (rule, n) in counts.0 {
            *all.entry(rule.to_owned()).or_default() += n;
        }
    }

    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Replacements counted while one request is redacted, added to the stats once.
#[derive(Default)]
pub(crate) struct Counts<'r>(BTreeMap<&'r str, u64>);

impl<'r> Counts<'r> {
    fn bump(&mut self, rule: &'r str, n: u64) {
        *self.0.entry(rule).or_default() += n;
    }
}

impl Redaction {
    fn is_content(&self, key: &str) -> bool {
        !self.capture_content
            && (CONTENT_KEYS.contains(&key) || self.content_keys.iter().any(|k| k == key))
    }

    /// Redacts spans in place (attributes, event and link attributes).
    pub fn spans(&self, spans: &mut [SpanRecord], stats: &RedactionStats) {
        let mut counts = Counts::default();
        for s in spans {
            self.attributes(&mut s.attributes, &mut counts);
            for e in &mut s.events {
                self.attributes(&mut e.attributes, &mut counts);
            }
            for l in &mut s.links {
                self.attributes(&mut l.attributes, &mut counts);
            }
        }
        stats.add(counts);
    }

    /// Redacts log records in place (attributes and body).
    pub fn logs(&self, logs: &mut [LogRecord], stats: &RedactionStats) {
        let mut counts = Counts::default();
        for l in logs {
            self.attributes(&mut l.attributes, &mut counts);
            if !self.capture_content {
                content_body(l, &mut counts);
            }
            self.value(&mut l.body, &mut counts);
        }
        stats.add(counts);
    }

    fn attributes<'r>(&'r self, kvs: &mut Vec<KeyValue>, counts: &mut Counts<'r>) {
        if kvs.iter().any(|kv| self.is_content(&kv.key)) {
            let old = std::mem::take(kvs);
            for kv in old {
                if self.is_content(&kv.key) {
                    kvs.extend(fingerprint(&kv));
                    counts.bump("content", 1);
                } else {
                    kvs.push(kv);
                }
            }
        }
        for kv in kvs {
            self.value(&mut kv.value, counts);
        }
    }

    fn value<'r>(&'r self, v: &mut Value, counts: &mut Counts<'r>) {
        let Some(rules) = &self.pii else {
            return;
        };
        match v {
            Value::Str(s) => {
                if let Some(clean) = rules.redact(s, counts) {
                    *s = clean;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|i| self.value(i, counts)),
            Value::KvList(kvs) => kvs
                .iter_mut()
                .for_each(|kv| self.value(&mut kv.value, counts)),
            _ => {}
        }
    }
}

/// The first 16 hex digits of the SHA-256 of a text.
fn hash16(text: &str) -> String {
    hex::encode(&Sha256::digest(text.as_bytes())[..8])
}

/// `<key>.hash` and `<key>.length` in place of a content attribute.
fn fingerprint(kv: &KeyValue) -> [KeyValue; 2] {
    let text = match &kv.value {
        Value::Str(s) => s.clone(),
        other => other.text().unwrap_or_default(),
    };
    [
        KeyValue::new(format!("{}.hash", kv.key), Value::Str(hash16(&text))),
        KeyValue::new(format!("{}.length", kv.key), Value::Int(text.len() as i64)),
    ]
}

fn content_placeholder(text: &str) -> String {
    format!("<content hash={} length={}>", hash16(text), text.len())
}

/// Replaces the content a log body carries: all of it for a GenAI content event, the
/// marked segments of a one-line body.
fn content_body(l: &mut LogRecord, counts: &mut Counts<'_>) {
    let event = l.attributes.iter().find(|kv| kv.key == "event.name");
    let event = match event.map(|kv| &kv.value) {
        Some(Value::Str(name)) if l.event_name.is_empty() => name.as_str(),
        _ => l.event_name.as_str(),
    };
    if CONTENT_EVENTS.contains(&event) && l.body != Value::Empty {
        let text = match &l.body {
            Value::Str(s) => s.clone(),
            other => other.json(),
        };
        l.body = Value::Str(content_placeholder(&text));
        counts.bump("content", 1);
        return;
    }
    if let Value::Str(text) = &mut l.body
        && let Some((clean, n)) = marked_segments(text)
    {
        *text = clean;
        counts.bump("content", n);
    }
}

/// A one-line body with the segment after each content marker replaced; `None` when it has
/// no marker. A segment runs to the next `[UPPERCASE]` marker or the end of the line.
fn marked_segments(text: &str) -> Option<(String, u64)> {
    if !CONTENT_MARKERS.iter().any(|m| text.contains(m)) {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut n = 0;
    while let Some((at, marker)) = CONTENT_MARKERS
        .iter()
        .filter_map(|m| rest.find(m).map(|i| (i, *m)))
        .min_by_key(|(i, _)| *i)
    {
        out.push_str(&rest[..at + marker.len()]);
        let body = &rest[at + marker.len()..];
        let end = next_marker(body).unwrap_or(body.len());
        let segment = body[..end].trim();
        if !segment.is_empty() {
            out.push(' ');
            out.push_str(&content_placeholder(segment));
            out.push_str(if end < body.len() { " " } else { "" });
            n += 1;
        }
        rest = &body[end..];
    }
    out.push_str(rest);
    Some((out, n))
}

/// Where the next `[UPPERCASE]` marker starts.
fn next_marker(text: &str) -> Option<usize> {
    text.match_indices('[').map(|(i, _)| i).find(|&i| {
        let tail = &text[i + 1..];
        tail.find(']').is_some_and(|end| {
            end > 1
                && tail[..end]
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_')
        })
    })
}

/// A configured pattern: its name (the placeholder is `<name>`) and its regex.
pub fn pattern(name: &str, regex: &str) -> Result<(String, Regex), RuleError> {
    rules::pattern(name, regex)
}

#[cfg(test)]
mod tests;
