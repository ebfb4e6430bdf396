//! The trace signal's export: decode (protobuf or JSON), validate each span, store the valid
//! ones, answer with what was accepted, deduplicated and rejected.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use weft_storage::Signal;
use weft_storage::model::TenantId;

use super::{ExportOutcome, Format, Ingester, RejectReason};
use crate::error::IngestError;
use crate::otlp::convert::convert_request;
use crate::otlp::{self, ExportTraceServiceRequest};

impl Ingester {
    /// Decodes, validates and stores an encoded (already decompressed) export body.
    pub async fn export_bytes(
        self: &Arc<Self>,
        tenant: TenantId,
        body: Bytes,
        format: Format,
    ) -> Result<ExportOutcome, IngestError> {
        let cost = body.len();
        self.admitted(cost, move |this| {
            let req = match format {
                Format::Protobuf => otlp::decode_protobuf(&body),
                Format::Json => otlp::json::decode_request(&body),
            };
            let req =
                req.inspect_err(|_| this.stats.count_rejected(RejectReason::Undecodable, 1))?;
            this.store_request(&tenant, req)
        })
        .await
    }

    /// Validates and stores an already decoded request (the gRPC path).
    pub async fn export(
        self: &Arc<Self>,
        tenant: TenantId,
        req: ExportTraceServiceRequest,
        encoded_len: usize,
    ) -> Result<ExportOutcome, IngestError> {
        self.admitted(encoded_len, move |this| this.store_request(&tenant, req))
            .await
    }

    fn store_request(
        &self,
        tenant: &TenantId,
        req: ExportTraceServiceRequest,
    ) -> Result<ExportOutcome, IngestError> {
        let limits = self.row_limits(tenant, Signal::Spans);
        let mut converted = convert_request(req, limits);
        // before the write-ahead head: nothing unredacted reaches the disk
        self.redaction
            .of(tenant)
            .spans(&mut converted.rows, &self.stats.redactions);
        for (reason, n) in &converted.rejected {
            self.stats.count_rejected(*reason, *n as u64);
        }
        let rejected = converted.rejected_count();
        let error_message = converted.first_error;
        let outcome = if converted.rows.is_empty() {
            Default::default()
        } else {
            match &self.derived {
                Some(d) => self
                    .store
                    .append_observed(tenant, converted.rows, |spans| d.observe(tenant, spans))?,
                None => self.store.append(tenant, converted.rows)?,
            }
        };
        self.stats
            .spans_accepted
            .fetch_add(outcome.stored as u64, Ordering::Relaxed);
        self.stats
            .spans_duplicate
            .fetch_add(outcome.duplicates as u64, Ordering::Relaxed);
        Ok(ExportOutcome {
            accepted: outcome.stored,
            duplicates: outcome.duplicates,
            rejected,
            error_message,
        })
    }
}
