//! The OTLP receivers: HTTP (`POST /v1/traces`, protobuf or JSON) and gRPC
//! (`TraceService/Export`). Both hand requests to the ingester and answer per the OTLP
//! specification: partial success for invalid spans, retryable refusals when saturated.

pub mod admit;
pub mod grpc;
pub mod http;
mod status;
