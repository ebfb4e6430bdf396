//! The log signal's columns as a scan names them: [`LogScan`](crate::store::LogScan) takes
//! [`col`] names and [`dim`] postings dimensions; [`COLUMNS`] and [`INDEXED`] say which of them
//! make each column of the `logs` table.

pub use crate::block::logs::{col, dim};

/// The SQL columns, each with the stored column it is made from.
pub const COLUMNS: &[(&str, &str)] = &[
    ("time", col::TIME),
    ("observed_time", col::OBSERVED_TIME),
    ("severity_number", col::SEVERITY_NUMBER),
    ("severity_text", col::SEVERITY_TEXT),
    ("body", col::BODY),
    ("trace_id", col::TRACE_ID),
    ("span_id", col::SPAN_ID),
    ("service_name", col::SERVICE),
    ("event_name", col::EVENT_NAME),
    ("class", col::CLASS),
    ("llm.model", col::MODEL),
    ("llm.model_version", col::MODEL_VERSION),
    ("llm.generation_step", col::GENERATION_STEP),
    ("gen_ai.response.finish_reasons", col::FINISH_REASONS),
    ("gen_ai.usage.output_tokens", col::OUTPUT_TOKENS),
    ("llm.kv_cache.hit_rate", col::KV_CACHE_HIT_RATE),
    ("llm.prefill_ms", col::PREFILL_MS),
    ("llm.decode_ms", col::DECODE_MS),
    ("llm.tokens_per_s", col::TOKENS_PER_S),
    ("worker.id", col::WORKER),
    ("gpu.id", col::GPU),
    ("scope_name", col::SCOPE),
    ("flags", col::FLAGS),
    ("attributes", col::ATTRIBUTES),
    ("resource_attributes", col::RESOURCE),
];

/// Columns whose equality filters are answered by postings, with their dimension.
pub const INDEXED: &[(&str, &str)] = &[
    ("service_name", dim::SERVICE),
    ("severity_text", dim::SEVERITY),
    ("event_name", dim::EVENT_NAME),
    ("class", dim::CLASS),
    ("llm.model", dim::MODEL),
    ("llm.model_version", dim::MODEL_VERSION),
    ("worker.id", dim::WORKER),
    ("gpu.id", dim::GPU),
];
