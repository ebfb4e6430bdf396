//! Weft's ingest path: OTLP decoding (protobuf and JSON, gzip), normalisation of OTLP spans to
//! the storage model with validation and limits, and the pipeline that admits a request
//! (bounded in-flight memory) and makes it durable in the store.
//!
//! It does not serve sockets (the receivers live in `weft-api`'s `otlp` module) and does not
//! read data back; it only turns bytes on the wire into stored rows, or into a precise error.

pub mod body;
pub mod derived;
pub mod error;
pub mod gpu;
pub mod otlp;
pub mod pipeline;
pub mod redact;
pub mod semantic;

#[cfg(test)]
mod fuzz;

pub use error::IngestError;
pub use pipeline::{ExportOutcome, Format, Ingester, Limits, RejectReason};
