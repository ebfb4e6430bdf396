//! The `tempopb` messages the trace-by-id API answers with, as prost types (field numbers as in
//! Tempo's `tempo.proto`). `Trace` is wire-identical to OTLP's `TracesData`.

use opentelemetry_proto::tonic::trace::v1::ResourceSpans;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Trace {
    #[prost(message, repeated, tag = "1")]
    pub resource_spans: Vec<ResourceSpans>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TraceByIdMetrics {
    #[prost(uint64, tag = "1")]
    pub inspected_bytes: u64,
}

/// `PartialStatus`: 0 `COMPLETE`, 1 `PARTIAL`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TraceByIdResponse {
    #[prost(message, optional, tag = "1")]
    pub trace: Option<Trace>,
    #[prost(message, optional, tag = "2")]
    pub metrics: Option<TraceByIdMetrics>,
    #[prost(int32, tag = "3")]
    pub status: i32,
    #[prost(string, tag = "4")]
    pub message: String,
}
