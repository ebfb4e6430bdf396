//! Retention: the blocks of windows that have fallen wholly out of a tenant's retention are
//! retired (see [`super::retire`]): gone from every later snapshot at once, deleted from disk
//! once no reader holds them. Rows of newer windows that are older than the cutoff are hidden
//! by the snapshot ([`Snapshot::cutoff`]).

use super::*;

impl Store {
    /// One round of the retention task: retires the blocks of windows that fell out and
    /// deletes the retired blocks no reader holds. Returns whether it deleted anything.
    pub fn enforce_retention(&self) -> Result<bool> {
        let _one_at_a_time = self.maintenance.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.opts.clock.now();
        let width = self.opts.window.as_nanos().max(1) as u64;
        let expired: Vec<(TenantId, Vec<BlockAddr>)> = {
            let state = self.lock();
            state
                .tenants
                .iter()
                .filter_map(|(tenant, t)| {
                    let cutoff = self.opts.retention.cutoff(tenant, SPANS, now)?;
                    let out: Vec<BlockAddr> = t
                        .blocks
                        .keys()
                        .filter(|a| a.window.saturating_add(width) <= cutoff.0)
                        .copied()
                        .collect();
                    (!out.is_empty()).then(|| (tenant.clone(), out))
                })
                .collect()
        };
        for (tenant, addrs) in &expired {
            let mut batch = WriteBatch::default();
            for addr in addrs {
                self.stage_retire(&mut batch, tenant, *addr);
            }
            self.replace_blocks(tenant, batch, Vec::new(), addrs)?;
            self.stats
                .blocks_expired
                .fetch_add(addrs.len() as u64, Ordering::Relaxed);
            tracing::info!(tenant = %tenant, blocks = addrs.len(), "blocks out of retention retired");
        }
        self.delete_retired()
    }
}
