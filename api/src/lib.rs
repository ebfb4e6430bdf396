//! The `weft` server: configuration, the OTLP receivers (HTTP and gRPC), the query API
//! (native JSON, SQL over HTTP and the PostgreSQL wire protocol, the Prometheus, Tempo and
//! Jaeger APIs),
//! health and self-metrics, and the process lifecycle.
//!
//! It holds no storage or query logic of its own: it wires `weft-ingest`, `weft-query` and
//! `weft-storage` to sockets, and maps their errors to statuses in one place (`error`).

pub mod analytics;
pub mod auth;
pub mod config;
pub mod damage;
pub mod error;
pub mod gpu;
pub mod jaeger;
pub mod logs;
pub mod loki;
pub mod metrics;
pub mod otlp;
pub mod prometheus;
pub mod server;
pub mod sql;
pub mod state;
pub mod tempo;
pub mod time;
pub mod tls;
pub mod traces;

#[cfg(test)]
mod fuzz;
