//! The log signal's export: decode (protobuf or JSON), validate each record, store the valid
//! ones, answer with what was accepted, deduplicated and rejected.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use weft_storage::Signal;
use weft_storage::model::TenantId;

use super::{ExportOutcome, Format, Ingester, RejectReason};
use crate::error::IngestError;
use crate::otlp::logs::{self, ExportLogsServiceRequest};

impl Ingester {
    /// Decodes, validates and stores an encoded (already decompressed) logs export body.
    pub async fn export_logs_bytes(
        self: &Arc<Self>,
        tenant: TenantId,
        body: Bytes,
        format: Format,
    ) -> Result<ExportOutcome, IngestError> {
        self.admitted(body.len(), move |this| {
            let req = match format {
                Format::Protobuf => logs::decode_protobuf(&body),
                Format::Json => crate::otlp::json::decode_logs_request(&body),
            };
            let req =
                req.inspect_err(|_| this.stats.count_rejected(RejectReason::Undecodable, 1))?;
            this.store_logs(&tenant, req)
        })
        .await
    }

    /// Validates and stores an already decoded logs request (the gRPC path).
    pub async fn export_logs(
        self: &Arc<Self>,
        tenant: TenantId,
        req: ExportLogsServiceRequest,
        encoded_len: usize,
    ) -> Result<ExportOutcome, IngestError> {
        self.admitted(encoded_len, move |this| this.store_logs(&tenant, req))
            .await
    }

    fn store_logs(
        &self,
        tenant: &TenantId,
        req: ExportLogsServiceRequest,
    ) -> Result<ExportOutcome, IngestError> {
        let limits = self.row_limits(tenant, Signal::Logs);
        let now = self.store.options().clock.now();
        let mut converted = logs::convert_request(req, limits, now);
        // before the write-ahead head: nothing unredacted reaches the disk
        self.redaction
            .of(tenant)
            .logs(&mut converted.rows, &self.stats.redactions);
        crate::semantic::annotate(&mut converted.rows, &self.stats.log_parse);
        for (reason, n) in &converted.rejected {
            self.stats.count_rejected_logs(*reason, *n as u64);
        }
        let rejected = converted.rejected_count();
        let error_message = converted.first_error;
        let outcome = if converted.rows.is_empty() {
            Default::default()
        } else {
            self.store.append_logs(tenant, converted.rows)?
        };
        self.stats
            .logs_accepted
            .fetch_add(outcome.stored as u64, Ordering::Relaxed);
        self.stats
            .logs_duplicate
            .fetch_add(outcome.duplicates as u64, Ordering::Relaxed);
        Ok(ExportOutcome {
            accepted: outcome.stored,
            duplicates: outcome.duplicates,
            rejected,
            error_message,
        })
    }
}
