//! Admission and the write: a request takes a share of a bounded in-flight budget (or is told
//! to retry), is decoded and validated off the async runtime, and is answered once its rows
//! are durable. What every signal shares is here (limits, admission, rejection reasons and
//! their counters, the outcome of a request); each signal's decoding and storing is in a
//! module of its own ([`traces`], [`logs`], [`metrics`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use weft_storage::Store;

use crate::error::IngestError;

mod logs;
mod metrics;
mod traces;

/// Limits of the ingest path; each has a server flag.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest request body, compressed or not.
    pub max_body_bytes: usize,
    /// Largest single attribute value.
    pub max_attribute_value_bytes: usize,
    /// Decoded bytes of requests being processed at once; past it, requests get 429.
    pub max_inflight_bytes: usize,
    /// Requests decoded and written at once; admitted requests past it wait their turn.
    pub workers: usize,
    /// Attributes, key length, events and links per row.
    pub shape: crate::otlp::convert::ShapeLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 16 << 20,
            max_attribute_value_bytes: 1 << 20,
            max_inflight_bytes: 256 << 20,
            workers: default_workers(),
            shape: crate::otlp::convert::ShapeLimits {
                attributes: 1024,
                key_bytes: 1024,
                events: 16_384,
                links: 1024,
            },
        }
    }
}

/// Twice the cores and two more: enough writers waiting on a sync for the write-ahead log's
/// group commit to keep the cores busy decoding. Each thread that decodes requests keeps its
/// own allocator pages, which the rows it decoded pin until their head is flushed, so a
/// thread per request in flight (the runtime's blocking pool) costs memory under overload
/// from many tenants and buys no throughput (BENCHMARKS.md, twenty-eighth session).
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()) * 2 + 2
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
    /// More attributes, events or links than the limits allow, or a key too long.
    LimitExceeded,
    /// A metric point whose value cannot be used (no value, NaN sum, bucket counts that do
    /// not match the bounds, no time).
    InvalidPoint,
}

impl RejectReason {
    pub const ALL: [RejectReason; 10] = [
        Self::InvalidId,
        Self::EndBeforeStart,
        Self::InvalidEnum,
        Self::AttributeTooLarge,
        Self::Undecodable,
        Self::TooLarge,
        Self::Overloaded,
        Self::Expired,
        Self::LimitExceeded,
        Self::InvalidPoint,
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
            Self::LimitExceeded => "limit_exceeded",
            Self::InvalidPoint => "invalid_point",
        }
    }
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct IngestStats {
    pub spans_accepted: AtomicU64,
    pub spans_duplicate: AtomicU64,
    pub logs_accepted: AtomicU64,
    pub logs_duplicate: AtomicU64,
    /// Spans and log records refused, indexed like [`RejectReason::ALL`]; whole-request refusals count requests.
    pub rejected: [AtomicU64; RejectReason::ALL.len()],
    /// Log records refused by validation, indexed like [`RejectReason::ALL`] (a request
    /// refused whole counts in `rejected`, whatever its signal).
    pub logs_rejected: [AtomicU64; RejectReason::ALL.len()],
    pub points_accepted: AtomicU64,
    pub points_duplicate: AtomicU64,
    /// Metric points refused by validation, indexed like [`RejectReason::ALL`].
    pub points_rejected: [AtomicU64; RejectReason::ALL.len()],
    /// Redactions made, by rule.
    pub redactions: crate::redact::RedactionStats,
    /// Log bodies that looked structured but did not parse.
    pub log_parse: crate::semantic::ParseStats,
}

impl IngestStats {
    pub fn count_rejected(&self, reason: RejectReason, n: u64) {
        self.rejected[reason.index()].fetch_add(n, Ordering::Relaxed);
    }

    pub fn count_rejected_logs(&self, reason: RejectReason, n: u64) {
        self.logs_rejected[reason.index()].fetch_add(n, Ordering::Relaxed);
    }

    pub fn count_rejected_points(&self, reason: RejectReason, n: u64) {
        self.points_rejected[reason.index()].fetch_add(n, Ordering::Relaxed);
    }
}

impl RejectReason {
    fn index(self) -> usize {
        Self::ALL.iter().position(|r| *r == self).unwrap_or(0)
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
    redaction: crate::redact::RedactionPolicy,
    inflight: Arc<Semaphore>,
    /// Turns of [`Limits::workers`] to decode and write.
    workers: Arc<Semaphore>,
    /// Request bodies being read, in [`BUDGET_UNIT`]s: a fifth of `max_inflight_bytes` (bodies
    /// decode to about four times their size, which `inflight` holds).
    bodies: Arc<Semaphore>,
    /// Metrics derived from the spans this ingester stores (none when off).
    derived: Option<Arc<crate::derived::SpanMetrics>>,
    pub stats: IngestStats,
}

const BUDGET_UNIT: usize = 1024;

impl Ingester {
    pub fn new(store: Arc<Store>, limits: Limits) -> Self {
        let permits = (limits.max_inflight_bytes / BUDGET_UNIT).max(1);
        Self {
            store,
            limits,
            redaction: Default::default(),
            inflight: Arc::new(Semaphore::new(permits)),
            workers: Arc::new(Semaphore::new(limits.workers.max(1))),
            bodies: Arc::new(Semaphore::new((permits / 5).max(1))),
            derived: None,
            stats: IngestStats::default(),
        }
    }

    /// Derives span metrics, the service graph and LLM latency metrics from stored spans
    /// (written by [`Self::flush_derived`]).
    pub fn with_span_metrics(mut self) -> Self {
        self.derived = Some(Arc::new(crate::derived::SpanMetrics::new(
            self.store.options().clock.now(),
        )));
        self
    }

    /// Writes the derived metrics accumulated so far; returns how many points it wrote.
    pub fn flush_derived(&self) -> Result<usize, IngestError> {
        match &self.derived {
            Some(d) => Ok(d.flush(&self.store, self.store.options().clock.now())?),
            None => Ok(0),
        }
    }

    /// Redacts each tenant's rows as `policy` says (the default redacts content attributes
    /// and personal data).
    pub fn with_redaction(mut self, policy: crate::redact::RedactionPolicy) -> Self {
        self.redaction = policy;
        self
    }

    /// What each row of a tenant's signal is checked against: the value size limit and the
    /// tenant's retention cutoff for the signal.
    pub(crate) fn row_limits(
        &self,
        tenant: &weft_storage::model::TenantId,
        signal: weft_storage::Signal,
    ) -> crate::otlp::convert::SpanLimits {
        let retention = self.store.options().retention.of(tenant, signal);
        crate::otlp::convert::SpanLimits {
            max_attribute_value_bytes: self.limits.max_attribute_value_bytes,
            shape: self.limits.shape,
            retention: retention
                .zip(self.store.cutoff(tenant, signal))
                .map(|(d, c)| (c, d)),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// A share of the body budget for `bytes` of a request body about to be read (its
    /// Content-Length, or what has streamed in so far), added to `held`; a retryable refusal
    /// when the budget, shared by every tenant, is in use.
    pub fn admit_body(
        &self,
        held: &mut Option<OwnedSemaphorePermit>,
        bytes: usize,
    ) -> Result<(), IngestError> {
        let want = bytes.div_ceil(BUDGET_UNIT).max(1);
        let have = held.as_ref().map_or(0, |p| p.num_permits());
        if want <= have {
            return Ok(());
        }
        let max = self.limits.max_inflight_bytes / BUDGET_UNIT / 5;
        let more = (want - have).min(max.max(1).saturating_sub(have).max(1)) as u32;
        match self.bodies.clone().try_acquire_many_owned(more) {
            Ok(p) => {
                match held {
                    Some(h) => h.merge(p),
                    None => *held = Some(p),
                }
                Ok(())
            }
            Err(_) => {
                self.stats.count_rejected(RejectReason::Overloaded, 1);
                Err(IngestError::Overloaded {
                    retry_after_ms: 500,
                })
            }
        }
    }

    /// Runs `work` on the blocking pool once the request fits the in-flight budget (refused
    /// when it does not) and one of the [`Limits::workers`] is free (waited for).
    pub(crate) async fn admitted<F>(
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
        let turn = Arc::clone(&self.workers)
            .acquire_owned()
            .await
            .expect("the workers' semaphore is never closed");
        let this = Arc::clone(self);
        let result = tokio::task::spawn_blocking(move || {
            let _permits = (permit, turn);
            work(&this)
        })
        .await
        .map_err(|e| {
            IngestError::Storage(weft_storage::StorageError::Io(std::io::Error::other(
                e.to_string(),
            )))
        })?;
        if let Err(
            IngestError::Overloaded { .. }
            | IngestError::Storage(weft_storage::StorageError::HeadsFull { .. }),
        ) = &result
        {
            self.stats.count_rejected(RejectReason::Overloaded, 1);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;
    use weft_storage::StoreOptions;

    /// Admitted requests past `workers` wait their turn (none refused), and no more than
    /// `workers` are decoded and written at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn admitted_requests_past_the_workers_wait_their_turn() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path(), StoreOptions::default()).unwrap());
        let limits = Limits {
            workers: 2,
            ..Limits::default()
        };
        let ingester = Arc::new(Ingester::new(store, limits));
        let (running, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (ingester, running, peak) = (ingester.clone(), running.clone(), peak.clone());
                tokio::spawn(async move {
                    ingester
                        .admitted(1000, move |_| {
                            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                            peak.fetch_max(now, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(20));
                            running.fetch_sub(1, Ordering::SeqCst);
                            Ok(ExportOutcome::default())
                        })
                        .await
                })
            })
            .collect();
        for t in tasks {
            t.await
                .unwrap()
                .expect("waits for a worker, is not refused");
        }
        let peak = peak.load(Ordering::SeqCst);
        assert!((1..=2).contains(&peak), "{peak} requests at once");
    }
}
