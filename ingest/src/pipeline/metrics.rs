//! The metric signal's export: decode (protobuf or JSON), validate each point, register the
//! request's new series, store the valid points, answer with what was accepted, deduplicated
//! and rejected.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use weft_storage::Signal;
use weft_storage::model::TenantId;

use super::{ExportOutcome, Format, Ingester, RejectReason};
use crate::error::IngestError;
use crate::otlp::metrics::{self, ExportMetricsServiceRequest};

impl Ingester {
    /// Decodes, validates and stores an encoded (already decompressed) metrics export body.
    pub async fn export_metrics_bytes(
        self: &Arc<Self>,
        tenant: TenantId,
        body: Bytes,
        format: Format,
    ) -> Result<ExportOutcome, IngestError> {
        self.admitted(body.len(), move |this| {
            let req = match format {
                Format::Protobuf => metrics::decode_protobuf(&body),
                Format::Json => crate::otlp::json::decode_metrics_request(&body),
            };
            let req =
                req.inspect_err(|_| this.stats.count_rejected(RejectReason::Undecodable, 1))?;
            this.store_metrics(&tenant, req)
        })
        .await
    }

    /// Validates and stores an already decoded metrics request (the gRPC path).
    pub async fn export_metrics(
        self: &Arc<Self>,
        tenant: TenantId,
        req: ExportMetricsServiceRequest,
        encoded_len: usize,
    ) -> Result<ExportOutcome, IngestError> {
        self.admitted(encoded_len, move |this| this.store_metrics(&tenant, req))
            .await
    }

    fn store_metrics(
        &self,
        tenant: &TenantId,
        req: ExportMetricsServiceRequest,
    ) -> Result<ExportOutcome, IngestError> {
        let limits = self.row_limits(tenant, Signal::Metrics);
        let converted = metrics::convert_request(req, limits);
        for (reason, n) in &converted.rejected {
            self.stats.count_rejected_points(*reason, *n as u64);
        }
        let rejected = converted.rejected_count();
        let outcome = if converted.points.is_empty() {
            Default::default()
        } else {
            let ids = self.store.register_series(tenant, &converted.series)?;
            let points = converted
                .points
                .into_iter()
                .map(|(i, mut p)| {
                    p.series = ids[i];
                    p
                })
                .collect();
            self.store.append_points(tenant, points)?
        };
        self.stats
            .points_accepted
            .fetch_add(outcome.stored as u64, Ordering::Relaxed);
        self.stats
            .points_duplicate
            .fetch_add(outcome.duplicates as u64, Ordering::Relaxed);
        Ok(ExportOutcome {
            accepted: outcome.stored,
            duplicates: outcome.duplicates,
            rejected,
            error_message: converted.first_error,
        })
    }
}
