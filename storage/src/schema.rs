//! The well-known LLM-serving attributes that get typed, dedicated columns, the alias table that
//! maps both generations of GenAI names onto them, and the keys whose values are kept in the
//! long-value column.

use rustc_hash::FxHashMap as HashMap;
use std::sync::OnceLock;

use crate::model::Value;

/// The type of a dedicated or dynamic column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ColumnType {
    Str,
    Int,
    Double,
    Bool,
    StrList,
}

impl ColumnType {
    pub fn of(value: &Value) -> Option<Self> {
        match value {
            Value::Str(_) => Some(Self::Str),
            Value::Int(_) => Some(Self::Int),
            Value::Double(_) => Some(Self::Double),
            Value::Bool(_) => Some(Self::Bool),
            Value::Array(items) if items.iter().all(|v| matches!(v, Value::Str(_))) => {
                Some(Self::StrList)
            }
            _ => None,
        }
    }
    pub fn code(self) -> u8 {
        self as u8
    }
    pub fn from_code(code: u8) -> Option<Self> {
        [
            Self::Str,
            Self::Int,
            Self::Double,
            Self::Bool,
            Self::StrList,
        ]
        .into_iter()
        .find(|t| t.code() == code)
    }
}

/// A dedicated column: canonical attribute name, type, the older name it also accepts, and
/// whether it is a lineage dimension indexed by bitmap postings.
#[derive(Debug)]
pub struct Dedicated {
    pub name: &'static str,
    pub ty: ColumnType,
    pub alias: Option<&'static str>,
    pub indexed: bool,
    /// Set on the generate span but asked of every span of the request: also indexed per trace.
    pub inherited: bool,
}

const fn col(name: &'static str, ty: ColumnType, indexed: bool, inherited: bool) -> Dedicated {
    Dedicated {
        name,
        ty,
        alias: None,
        indexed,
        inherited,
    }
}

const fn aliased(
    name: &'static str,
    ty: ColumnType,
    alias: &'static str,
    indexed: bool,
) -> Dedicated {
    Dedicated {
        name,
        ty,
        alias: Some(alias),
        indexed,
        inherited: indexed,
    }
}

use ColumnType::*;

/// The dedicated columns, in column order. Append only: a block stores column indexes.
pub const DEDICATED: &[Dedicated] = &[
    col("gen_ai.operation.name", Str, true, false),
    aliased("gen_ai.provider.name", Str, "gen_ai.system", true),
    col("gen_ai.request.model", Str, true, true),
    col("gen_ai.response.model", Str, true, true),
    aliased(
        "gen_ai.usage.input_tokens",
        Int,
        "gen_ai.usage.prompt_tokens",
        false,
    ),
    aliased(
        "gen_ai.usage.output_tokens",
        Int,
        "gen_ai.usage.completion_tokens",
        false,
    ),
    col("gen_ai.response.finish_reasons", StrList, false, false),
    col("gen_ai.conversation.id", Str, false, false),
    col("gen_ai.latency.time_in_queue", Double, false, false),
    col("gen_ai.latency.time_to_first_token", Double, false, false),
    col("gen_ai.latency.time_in_model_prefill", Double, false, false),
    col("gen_ai.latency.time_in_model_decode", Double, false, false),
    col("gen_ai.latency.e2e", Double, false, false),
    col("llm.token.index", Int, false, false),
    col("llm.token.latency_ms", Double, false, false),
    col("llm.model_version", Str, true, true),
    col("llm.lora_adapter", Str, true, true),
    col("llm.kv_cache_strategy", Str, true, true),
    col("llm.batch_size", Int, true, true),
    col("worker.id", Str, true, true),
    col("gpu.id", Str, true, true),
];

/// Finds the dedicated column for an attribute key; the bool says whether the old alias was used.
pub fn dedicated_for(key: &str) -> Option<(usize, bool)> {
    static INDEX: OnceLock<HashMap<&'static str, (usize, bool)>> = OnceLock::new();
    let index = INDEX.get_or_init(|| {
        let mut m = HashMap::default();
        for (i, d) in DEDICATED.iter().enumerate() {
            m.insert(d.name, (i, false));
            if let Some(alias) = d.alias {
                m.insert(alias, (i, true));
            }
        }
        m
    });
    index.get(key).copied()
}

/// Keys whose values are prompts, completions or other content: always in the long-value column.
pub const LONG_KEYS: &[&str] = &[
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.definitions",
    "gen_ai.prompt",
    "gen_ai.completion",
];

/// Attributes that carry a prompt or a completion: redacted at ingest unless a tenant captures
/// content, and looked for by the context-leak scan.
pub const CONTENT_KEYS: &[&str] = &[
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.prompt",
    "gen_ai.completion",
    "llm.prompts",
    "llm.completions",
    "http.request.header.x-raw-prompt",
    "http.request.header.x-user-history",
];

/// Values longer than this go to the long-value column whatever their key.
pub const LONG_VALUE_BYTES: usize = 1024;

pub fn is_long(key: &str, value: &Value) -> bool {
    LONG_KEYS.contains(&key) || value.byte_len() > LONG_VALUE_BYTES
}

/// Span-level dimensions indexed by postings besides the dedicated ones.
pub const DIM_SERVICE: &str = "service.name";
pub const DIM_NAME: &str = "span.name";
pub const DIM_STATUS: &str = "status.code";
pub const DIM_KIND: &str = "span.kind";

/// Prefix of a trace-level (inherited) posting: rows of every trace having that value.
pub const TRACE_DIM_PREFIX: &str = "trace:";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_generations_map_to_one_column() {
        let (new, old) = (
            dedicated_for("gen_ai.provider.name"),
            dedicated_for("gen_ai.system"),
        );
        assert_eq!(new, Some((1, false)));
        assert_eq!(old, Some((1, true)));
        assert_eq!(
            dedicated_for("gen_ai.usage.completion_tokens").map(|d| d.0),
            dedicated_for("gen_ai.usage.output_tokens").map(|d| d.0)
        );
        assert_eq!(dedicated_for("http.route"), None);
    }
}
