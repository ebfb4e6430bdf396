//! End-to-end tests: the real `weft` binary, real OTLP clients, real HTTP reads.

mod analytics;
mod auth;
mod common;
mod corruption;
mod crash;
mod diskfull;
mod gpu;
mod grafana;
mod hostile;
mod ingest;
mod logs;
mod retention;
mod search;
mod sql;
mod tempo;
mod tls;
