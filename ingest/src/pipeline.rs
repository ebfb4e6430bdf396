//! Admission and the write: a request takes a share of a bounded in-flight budget (or is told
//! to retry), is decoded and validated off the async runtime, and is answered once its spans
//! are durable.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tokio::sync::Semaphore;
use weft_storage::Store;
use weft_storage::keys::Signal;
use weft_storage::model::TenantId;

use crate::error::IngestError;
use crate::otlp::convert::{SpanLimits, convert_request};
use crate::otlp::{self, ExportTraceServiceRequest};

/// Limits of the ingest path; each has a server flag.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest request body, compressed or not.
    pub max_body_bytes: usize,
    /// Largest single attribute value.
    pub max_attribute_value_bytes: usize,
    /// Decoded bytes of requests being processed at once; past it, requests get 429.
    pub max_inflight_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 16 << 20,
            max_attribute_value_bytes: 1 << 20,
            max_inflight_bytes: 256 << 20,
        }
    }
}

/// Why spans were refused, for the answer and for `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    InvalidId,
    EndBeforeStart,
    InvalidEnum,
    AttributeTooLarge,
    Undecodable,
    TooLarge,
    Overloaded,
    Expired,
}

impl RejectReason {
    pub const ALL: [RejectReason; 8] = [
        Self::InvalidId,
        Self::EndBeforeStart,
        Self::InvalidEnum,
        Self::AttributeTooLarge,
        Self::Undecodable,
        Self::TooLarge,
        Self::Overloaded,
        Self::Expired,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidId => "invalid_id",
            Self::EndBeforeStart => "end_before_start",
            Self::InvalidEnum => "invalid_enum",
            Self::AttributeTooLarge => "attribute_too_large",
            Self::Undecodable => "undecodable",
            Self::TooLarge => "too_large",
            Self::Overloaded => "overloaded",
            Self::Expired => "expired",
        }
    }
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct IngestStats {
    pub spans_accepted: AtomicU64,
    pub spans_duplicate: AtomicU64,
    /// Spans refused, indexed like [`RejectReason::ALL`]; whole-request refusals count requests.
    pub rejected: [AtomicU64; 8],
}

impl IngestStats {
    pub fn count_rejected(&self, reason: RejectReason, n: u64) {
        let i = RejectReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.rejected[i].fetch_add(n, Ordering::Relaxed);
    }
}

/// What became of an export request that was taken.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ExportOutcome {
    pub accepted: usize,
    pub duplicates: usize,
    pub rejected: usize,
    pub error_message: Option<String>,
}

/// The wire format of a trace export body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Protobuf,
    Json,
}

pub struct Ingester {
    store: Arc<Store>,
    limits: Limits,
    inflight: Arc<Semaphore>,
    pub stats: IngestStats,
}

const BUDGET_UNIT: usize = 1024;

impl Ingester {
    pub fn new(store: Arc<Store>, limits: Limits) -> Self {
        let permits = (limits.max_inflight_bytes / BUDGET_UNIT).max(1);
        Self {
            store,
            limits,
            inflight: Arc::new(Semaphore::new(permits)),
            stats: IngestStats::default(),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

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

    /// Runs `work` on the blocking pool once the request fits the in-flight budget.
    async fn admitted<F>(
        self: &Arc<Self>,
        cost: usize,
        work: F,
    ) -> Result<ExportOutcome, IngestError>
    where
        F: FnOnce(&Ingester) -> Result<ExportOutcome, IngestError> + Send + 'static,
    {
        // Decoded spans take several times their encoded size.
        let units = (cost.saturating_mul(4) / BUDGET_UNIT)
            .clamp(1, self.limits.max_inflight_bytes / BUDGET_UNIT) as u32;
        let Ok(permit) = self.inflight.clone().try_acquire_many_owned(units) else {
            self.stats.count_rejected(RejectReason::Overloaded, 1);
            return Err(IngestError::Overloaded {
                retry_after_ms: 500,
            });
        };
        let this = Arc::clone(self);
        let result = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work(&this)
        })
        .await
        .map_err(|e| {
            IngestError::Storage(weft_storage::StorageError::Io(std::io::Error::other(
                e.to_string(),
            )))
        })?;
        if let Err(IngestError::Overloaded { .. }) = &result {
            self.stats.count_rejected(RejectReason::Overloaded, 1);
        }
        result
    }

    fn store_request(
        &self,
        tenant: &TenantId,
        req: ExportTraceServiceRequest,
    ) -> Result<ExportOutcome, IngestError> {
        let retention = self.store.options().retention.of(tenant, Signal::Spans);
        let limits = SpanLimits {
            max_attribute_value_bytes: self.limits.max_attribute_value_bytes,
            retention: retention
                .zip(self.store.cutoff(tenant, Signal::Spans))
                .map(|(d, c)| (c, d)),
        };
        let converted = convert_request(req, limits);
        for (reason, n) in &converted.rejected {
            self.stats.count_rejected(*reason, *n as u64);
        }
        let rejected = converted.rejected_count();
        let error_message = converted.first_error;
        let outcome = if converted.spans.is_empty() {
            Default::default()
        } else {
            self.store.append(tenant, converted.spans)?
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
