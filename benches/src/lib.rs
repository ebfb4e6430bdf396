//! Weft's load generator and benchmarks.
//!
//! [`generator`] makes realistic LLM-serving telemetry, deterministic by seed: per request a
//! trace through `llm-gateway`, `tokenizer`, `rag-retriever`, `vector-db`, `inference-engine`
//! and `postprocessor`, with one `llm.decode.token` span per output token, a few percent of
//! errors, Poisson arrivals and optional injected anomalies. The `weft-bench` binary writes it
//! as OTLP request files or Parquet, sends it to a server, and measures ingest and lookups;
//! [`peers`] runs the canonical SQL queries on Weft, DuckDB and chDB over the same data;
//! [`analytics_bench`] asks the analytics endpoints and the peers the same questions;
//! [`logs`] makes the requests' logs; [`metrics`] the fleet's GPU and engine metrics.

pub mod analytics_bench;
pub mod client;
pub mod files;
pub mod generator;
pub mod logs;
pub mod metrics;
pub mod peers;
pub mod pgclient;
