//! OTLP: protobuf and JSON decoding, normalisation to the storage model (with validation), and
//! the way back (storage model to OTLP) for read APIs. Traces are at the top of this module;
//! logs in [`logs`], metrics in [`metrics`].

pub mod convert;
pub mod export;
pub mod json;
pub mod logs;
pub mod metrics;

pub use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};

use crate::error::IngestError;

/// Decodes an `ExportTraceServiceRequest` from protobuf bytes.
pub fn decode_protobuf(bytes: &[u8]) -> Result<ExportTraceServiceRequest, IngestError> {
    prost::Message::decode(bytes).map_err(|e| IngestError::Undecodable {
        format: "protobuf",
        detail: e.to_string(),
    })
}
