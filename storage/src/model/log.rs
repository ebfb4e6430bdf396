//! A log record as Weft keeps it: everything OTLP says about it, so that a record read back
//! equals what was sent.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::{KeyValue, Resource, Scope, SpanId, TraceId, UnixNanos, Value};

/// One log record.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct LogRecord {
    /// When the event happened; OTLP's `observed_time` when the sender left it zero.
    pub time: UnixNanos,
    pub observed_time: UnixNanos,
    /// OTLP severity number (0 unspecified, 1–24 TRACE to FATAL4).
    pub severity_number: i32,
    pub severity_text: String,
    pub body: Value,
    pub attributes: Vec<KeyValue>,
    pub dropped_attributes_count: u32,
    pub flags: u32,
    pub trace_id: Option<TraceId>,
    pub span_id: Option<SpanId>,
    pub event_name: String,
    pub resource: Arc<Resource>,
    pub scope: Arc<Scope>,
    /// What the record means for an LLM request, parsed at ingest.
    pub semantics: LogSemantics,
}

/// What a log record is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
#[repr(u8)]
pub enum LogClass {
    #[default]
    Other = 0,
    PromptInput = 1,
    InferenceMetrics = 2,
    ResponseOutput = 3,
    Error = 4,
}

impl LogClass {
    pub const ALL: [LogClass; 5] = [
        Self::Other,
        Self::PromptInput,
        Self::InferenceMetrics,
        Self::ResponseOutput,
        Self::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Other => "other",
            Self::PromptInput => "prompt_input",
            Self::InferenceMetrics => "inference_metrics",
            Self::ResponseOutput => "response_output",
            Self::Error => "error",
        }
    }

    pub fn from_u8(v: u8) -> Self {
        Self::ALL
            .into_iter()
            .find(|c| *c as u8 == v)
            .unwrap_or_default()
    }
}

/// The typed fields of a log record, from its attributes or its body, whatever form the body
/// took (JSON, `key=value`, the one-line `[PROMPT] … [LOGITS] {…}` form).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct LogSemantics {
    pub class: LogClass,
    pub model: Option<String>,
    pub model_version: Option<String>,
    pub generation_step: Option<i64>,
    pub finish_reasons: Option<Vec<String>>,
    pub output_tokens: Option<i64>,
    pub kv_cache_hit_rate: Option<f64>,
    pub prefill_ms: Option<f64>,
    pub decode_ms: Option<f64>,
    pub tokens_per_s: Option<f64>,
    pub worker: Option<String>,
    pub gpu: Option<String>,
}

impl LogRecord {
    pub fn service_name(&self) -> &str {
        self.resource.service_name()
    }

    /// The body as text: a string as it is, a structured body as JSON, none as `None`.
    pub fn body_text(&self) -> Option<String> {
        match &self.body {
            Value::Empty => None,
            Value::Str(s) => Some(s.clone()),
            other => Some(other.json()),
        }
    }

    /// An identity of the record: its time and a digest of everything else, so that a
    /// client's retry of a batch is stored once. OTLP gives log records no id; two records
    /// equal in every field at the same nanosecond are the same record.
    pub fn digest(&self) -> (u64, u64) {
        // SipHash with fixed keys: stable across restarts (the head's seen set is rebuilt
        // from the write-ahead), unlike a randomly keyed hasher
        #[allow(deprecated)]
        let mut h = std::hash::SipHasher::new();
        let mut w = crate::codec::Writer::default();
        w.log(self);
        w.buf.hash(&mut h);
        (self.time.0, h.finish())
    }
}
