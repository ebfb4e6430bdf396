//! OTLP/gRPC: `opentelemetry.proto.collector.trace.v1.TraceService/Export`,
//! `opentelemetry.proto.collector.logs.v1.LogsService/Export` and
//! `opentelemetry.proto.collector.metrics.v1.MetricsService/Export`, gzip accepted.

use std::sync::Arc;
use std::time::Instant;

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use prost::Message;
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};
use weft_ingest::IngestError;
use weft_ingest::otlp::logs::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use weft_ingest::otlp::metrics::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use weft_ingest::otlp::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};

use super::status::{RpcStatus, retry_info};
use crate::error::Class;
use crate::state::{AppState, TENANT_HEADER, tenant_from};
use weft_storage::model::TenantId;

pub struct TraceReceiver {
    state: Arc<AppState>,
}

pub struct LogReceiver {
    state: Arc<AppState>,
}

pub fn logs_service(state: Arc<AppState>) -> LogsServiceServer<LogReceiver> {
    let limit = state.ingester.limits().max_body_bytes;
    LogsServiceServer::new(LogReceiver { state })
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(limit)
}

pub struct MetricReceiver {
    state: Arc<AppState>,
}

pub fn metrics_service(state: Arc<AppState>) -> MetricsServiceServer<MetricReceiver> {
    let limit = state.ingester.limits().max_body_bytes;
    MetricsServiceServer::new(MetricReceiver { state })
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(limit)
}

fn tenant_of<T>(request: &Request<T>) -> Result<TenantId, Status> {
    let tenant_value = request
        .metadata()
        .get(TENANT_HEADER)
        .map(|v| v.to_str().unwrap_or("\u{fffd}"));
    tenant_from(tenant_value).map_err(Status::invalid_argument)
}

pub fn service(state: Arc<AppState>) -> TraceServiceServer<TraceReceiver> {
    let limit = state.ingester.limits().max_body_bytes;
    TraceServiceServer::new(TraceReceiver { state })
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(limit)
}

pub(crate) fn to_status(e: &IngestError) -> Status {
    let class = Class::of_ingest(e);
    if class == Class::Internal {
        tracing::error!(error = %e, "otlp/grpc export failed");
    }
    let code = class.grpc_code();
    match class {
        Class::Retry(ms) => {
            let details = RpcStatus {
                code: code as i32,
                message: e.to_string(),
                details: vec![retry_info(ms)],
            };
            Status::with_details(code, e.to_string(), details.encode_to_vec().into())
        }
        _ => Status::new(code, e.to_string()),
    }
}

#[tonic::async_trait]
impl TraceService for TraceReceiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let started = Instant::now();
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let size = req.encoded_len();
        let result = self.state.ingester.export(tenant, req, size).await;
        self.state
            .requests
            .observe("grpc TraceService/Export", started.elapsed());
        let outcome = result.map_err(|e| to_status(&e))?;
        let partial_success = (outcome.rejected > 0).then(|| ExportTracePartialSuccess {
            rejected_spans: outcome.rejected as i64,
            error_message: outcome.error_message.unwrap_or_default(),
        });
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success,
        }))
    }
}

#[tonic::async_trait]
impl LogsService for LogReceiver {
    async fn export(
        &self,
        request: Request<ExportLogsServiceRequest>,
    ) -> Result<Response<ExportLogsServiceResponse>, Status> {
        let started = Instant::now();
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let size = req.encoded_len();
        let result = self.state.ingester.export_logs(tenant, req, size).await;
        self.state
            .requests
            .observe("grpc LogsService/Export", started.elapsed());
        let outcome = result.map_err(|e| to_status(&e))?;
        let partial_success = (outcome.rejected > 0).then(|| ExportLogsPartialSuccess {
            rejected_log_records: outcome.rejected as i64,
            error_message: outcome.error_message.unwrap_or_default(),
        });
        Ok(Response::new(ExportLogsServiceResponse { partial_success }))
    }
}

#[tonic::async_trait]
impl MetricsService for MetricReceiver {
    async fn export(
        &self,
        request: Request<ExportMetricsServiceRequest>,
    ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        let started = Instant::now();
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let size = req.encoded_len();
        let result = self.state.ingester.export_metrics(tenant, req, size).await;
        self.state
            .requests
            .observe("grpc MetricsService/Export", started.elapsed());
        let outcome = result.map_err(|e| to_status(&e))?;
        let partial_success = (outcome.rejected > 0).then(|| ExportMetricsPartialSuccess {
            rejected_data_points: outcome.rejected as i64,
            error_message: outcome.error_message.unwrap_or_default(),
        });
        Ok(Response::new(ExportMetricsServiceResponse {
            partial_success,
        }))
    }
}
