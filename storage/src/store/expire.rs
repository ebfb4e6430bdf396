//! Retention: the blocks whose rows have all fallen out of a tenant's retention (a window that
//! has fallen wholly out) are retired (see [`super::retire`]): gone from every later snapshot
//! at once, deleted from disk once no reader holds them. Rows of newer blocks that are older
//! than the cutoff are hidden by the snapshot ([`Snapshot::cutoff`]).

use super::*;

impl Store {
    /// One round of the retention task: retires the blocks of windows that fell out and
    /// deletes the retired blocks no reader holds. Returns whether it deleted anything.
    pub fn enforce_retention(&self) -> Result<bool> {
        let _one_at_a_time = self.maintenance.lock().unwrap_or_else(|e| e.into_inner());
        self.expire_signal::<SpanRecord>()?;
        self.expire_signal::<LogRecord>()?;
        let metrics = self.expire_signal::<MetricPoint>()?;
        let deleted = self.delete_retired()?;
        // series whose last points went (their blocks' data is deleted above, or still held
        // by a reader: then they go with a later window)
        let now = self.opts.clock.now();
        for tenant in metrics {
            if let Some(cutoff) = self.opts.retention.cutoff(&tenant, Signal::Metrics, now) {
                let gone = self.forget_series(&tenant, cutoff.0)?;
                if gone > 0 {
                    tracing::info!(tenant = %tenant, series = gone, "series out of retention deleted");
                }
            }
        }
        Ok(deleted)
    }

    /// Retires a signal's blocks out of retention; returns the tenants that had any.
    fn expire_signal<R: Lane>(&self) -> Result<Vec<TenantId>> {
        let now = self.opts.clock.now();
        let expired: Vec<(TenantId, Vec<BlockAddr>)> = {
            let state = self.lock();
            R::lanes(&state)
                .iter()
                .filter_map(|(tenant, t)| {
                    let cutoff = self.opts.retention.cutoff(tenant, R::SIGNAL, now)?;
                    // every row of the block is older than the cutoff (its window's bounds
                    // would do, but not if `--block-window` changed since it was written)
                    let mut out: Vec<BlockAddr> = t
                        .blocks
                        .iter()
                        .filter(|(_, meta)| meta.max_start < cutoff.0)
                        .map(|(addr, _)| *addr)
                        .collect();
                    out.extend(Self::damaged_before(&state, tenant, R::SIGNAL, cutoff));
                    (!out.is_empty()).then(|| (tenant.clone(), out))
                })
                .collect()
        };
        for (tenant, addrs) in &expired {
            let mut batch = WriteBatch::default();
            for addr in addrs {
                self.stage_retire(&mut batch, tenant, R::SIGNAL, *addr);
            }
            self.replace_blocks::<R>(tenant, batch, Vec::new(), addrs, HashMap::new())?;
            self.stats
                .blocks_expired
                .fetch_add(addrs.len() as u64, Ordering::Relaxed);
            tracing::info!(tenant = %tenant, signal = R::SIGNAL.name(), blocks = addrs.len(), "blocks out of retention retired");
        }
        Ok(expired.into_iter().map(|(t, _)| t).collect())
    }
}
