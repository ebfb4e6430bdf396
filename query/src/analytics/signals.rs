//! The latency and throughput signals of LLM serving as SQL over `spans`: which spans carry
//! a signal and the value each gives, in milliseconds (or tokens per second).
//!
//! - `ttft`: `gen_ai.latency.time_to_first_token` of request spans;
//! - `itl` (also `decode_latency`): a decode token span's latency, `llm.token.latency_ms`
//!   when it carries one, else its duration;
//! - `tpot`: time per output token of a request, its decode time over its output tokens;
//! - `e2e` (also `e2e_latency`): a request span's `gen_ai.latency.e2e`, else its duration;
//! - `tokens_per_s`: a request's output tokens over its decode time;
//! - `duration`: any span's duration;
//! - `span:NAME`: the duration of spans named `NAME`;
//! - any numeric column of `spans` (`"llm.batch_size"`, `"gen_ai.usage.input_tokens"`).
//!
//! A request span is one carrying `gen_ai.request.model` with kind `SERVER` (the model
//! server's span of the request: vLLM's `llm_request`, the generator's `llm.generate`).

use super::params::{Result, ident, invalid, lit};

/// The condition that picks request spans.
pub const REQUEST_SPANS: &str = "\"gen_ai.request.model\" IS NOT NULL AND kind = 'SERVER'";
/// The condition that picks decode token spans.
pub const TOKEN_SPANS: &str = "name = 'llm.decode.token'";

/// One signal: the spans that carry it and the value each gives.
#[derive(Clone, Debug)]
pub struct SpanSignal {
    pub name: String,
    /// SQL condition picking the spans.
    pub condition: String,
    /// SQL expression of the value (NULL when a span has none).
    pub value: String,
    pub unit: &'static str,
    /// Whether one span is one request (the units attribution counts).
    pub per_request: bool,
}

fn ms_of_seconds(col: &str) -> String {
    format!("CAST({} AS DOUBLE) * 1000.0", ident(col))
}

const DURATION_MS: &str = "CAST(duration_ns AS DOUBLE) / 1e6";

/// The signal named `name` (see the module's list).
pub fn span_signal(name: &str) -> Result<SpanSignal> {
    let s = |condition: String, value: String, unit, per_request| SpanSignal {
        name: name.to_owned(),
        condition,
        value,
        unit,
        per_request,
    };
    Ok(match name {
        "ttft" => s(
            REQUEST_SPANS.into(),
            ms_of_seconds("gen_ai.latency.time_to_first_token"),
            "ms",
            true,
        ),
        "itl" | "decode_latency" => s(
            TOKEN_SPANS.into(),
            format!("COALESCE(CAST(\"llm.token.latency_ms\" AS DOUBLE), {DURATION_MS})"),
            "ms",
            false,
        ),
        "tpot" => s(
            REQUEST_SPANS.into(),
            "CAST(\"gen_ai.latency.time_in_model_decode\" AS DOUBLE) * 1000.0 / \
             CAST(NULLIF(\"gen_ai.usage.output_tokens\", 0) AS DOUBLE)"
                .into(),
            "ms",
            true,
        ),
        "e2e" | "e2e_latency" => s(
            REQUEST_SPANS.into(),
            format!(
                "COALESCE({}, {DURATION_MS})",
                ms_of_seconds("gen_ai.latency.e2e")
            ),
            "ms",
            true,
        ),
        "tokens_per_s" => s(
            REQUEST_SPANS.into(),
            "CAST(\"gen_ai.usage.output_tokens\" AS DOUBLE) / \
             NULLIF(CAST(\"gen_ai.latency.time_in_model_decode\" AS DOUBLE), 0.0)"
                .into(),
            "tokens/s",
            true,
        ),
        "duration" => s("TRUE".into(), DURATION_MS.into(), "ms", false),
        n if n.starts_with("span:") && n.len() > 5 => s(
            format!("name = {}", lit(&n[5..])),
            DURATION_MS.into(),
            "ms",
            false,
        ),
        // a column: an attribute key (`llm.batch_size`) or a column name with `_`
        n if n.contains(['.', '_'])
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) =>
        {
            s(
                "TRUE".into(),
                format!("CAST({} AS DOUBLE)", ident(n)),
                "",
                false,
            )
        }
        n => {
            return Err(invalid(format!(
                "{n:?} is not a signal: use ttft, itl, tpot, e2e, tokens_per_s, duration, span:NAME or a numeric column"
            )));
        }
    })
}
