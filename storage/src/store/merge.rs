//! Merging small blocks. A flush every 10 s under a trickle of traffic makes many small blocks
//! per window, and every query pays per block. Blocks of one tenant and window smaller than half
//! the target (`flush_rows`) are merged in the background into blocks near the target, rows in
//! the block sort order, postings and trace-id index rebuilt by the block writer. While a
//! window still receives blocks, only blocks of one size tier (powers of four) are merged, four
//! or more at a time, so that a row is rewritten a few times at most; once a window has been
//! idle for `merge_idle`, all its small blocks are merged, which leaves at most a few blocks.
//!
//! The new blocks and the retirement of the old ones (their metas deleted, their graves
//! written) are one atomic write, and the in-memory block list swaps them under one lock: a
//! snapshot holds either the old blocks or the new ones, never both, never neither. The old
//! blocks' data is deleted once no reader holds them ([`super::retire`]).

use super::*;

/// Blocks of one window to merge into one or a few.
type Group = Vec<(BlockAddr, Arc<BlockMeta>)>;

/// Blocks of one tier hold between 4^t and 4^(t+1) thousand rows or so.
fn tier(rows: u32) -> u32 {
    (rows / 1024).max(1).ilog(4)
}

/// Consecutive groups of `blocks` of at most `target` rows each, of two blocks or more.
fn groups(blocks: Group, target: usize) -> Vec<Group> {
    let mut out = Vec::new();
    let mut current: Group = Vec::new();
    let mut rows = 0usize;
    for b in blocks {
        let n = b.1.rows as usize;
        if rows + n > target && !current.is_empty() {
            out.push(std::mem::take(&mut current));
            rows = 0;
        }
        rows += n;
        current.push(b);
    }
    out.push(current);
    out.retain(|g| g.len() >= 2);
    out
}

impl Store {
    /// One round of the merge task: merges small blocks where the policy above says so, then
    /// deletes retired blocks no reader holds. Returns whether it did anything.
    pub fn merge_small_blocks(&self) -> Result<bool> {
        let _one_at_a_time = self.maintenance.lock().unwrap_or_else(|e| e.into_inner());
        let spans = self.merge_signal::<SpanRecord>()?;
        let logs = self.merge_signal::<LogRecord>()?;
        let metrics = self.merge_signal::<MetricPoint>()?;
        Ok(self.delete_retired()? || spans || logs || metrics)
    }

    fn merge_signal<R: Lane>(&self) -> Result<bool> {
        let plans = self.merge_plans::<R>();
        let worked = !plans.is_empty();
        for (tenant, group) in plans {
            self.merge_group::<R>(&tenant, group)?;
        }
        Ok(worked)
    }

    /// What to merge now: per tenant, groups of small blocks of one window.
    fn merge_plans<R: Lane>(&self) -> Vec<(TenantId, Group)> {
        let target = self.opts.flush_rows;
        let state = self.lock();
        let mut plans = Vec::new();
        for (tenant, t) in R::lanes(&state) {
            let mut windows: BTreeMap<u64, Group> = BTreeMap::new();
            for (addr, meta) in t.blocks.iter() {
                if (meta.rows as usize) < target / 2 {
                    windows
                        .entry(addr.window)
                        .or_default()
                        .push((*addr, meta.clone()));
                }
            }
            for (window, small) in windows {
                let idle = t
                    .last_write
                    .get(&window)
                    .is_none_or(|at| at.elapsed() >= self.opts.merge_idle);
                let chosen = if idle {
                    small
                } else {
                    let mut tiers: BTreeMap<u32, Vec<_>> = BTreeMap::new();
                    for b in small {
                        tiers.entry(tier(b.1.rows)).or_default().push(b);
                    }
                    tiers
                        .into_values()
                        .filter(|t| t.len() >= 4)
                        .flatten()
                        .collect()
                };
                for group in groups(chosen, target) {
                    plans.push((tenant.clone(), group));
                }
            }
        }
        plans
    }

    /// Rewrites a group of blocks of one window as blocks near the target size.
    fn merge_group<R: Lane>(
        &self,
        tenant: &TenantId,
        group: Vec<(BlockAddr, Arc<BlockMeta>)>,
    ) -> Result<()> {
        let mut rows = Vec::new();
        for (addr, meta) in &group {
            rows.extend(R::read_block(&self.reader_of(
                tenant,
                R::SIGNAL,
                *addr,
                meta,
            ))?);
        }
        let window = group[0].0.window;
        let mut batch = WriteBatch::default();
        let mut written = Vec::new();
        let mut splits = super::request::SplitNotes::default();
        let mut text = HashMap::new();
        for part in R::split(rows.iter().collect(), self.opts.flush_rows) {
            let addr = BlockAddr {
                window,
                block: self.next_block_id(),
            };
            if let Some(docs) = R::text_docs(self.text.fields(), &part, addr.block) {
                text.insert(addr.block, docs);
            }
            let built = R::build_block(part, self.opts.compression)?;
            self.note_splits(tenant, R::SIGNAL, &built, &mut splits, false)?;
            self.stage_block(&mut batch, tenant, R::SIGNAL, addr, &built)?;
            written.push((addr, Arc::new(built.meta)));
        }
        let splits = self.stage_splits(&mut batch, tenant, splits);
        for (addr, _) in &group {
            self.stage_retire(&mut batch, tenant, R::SIGNAL, *addr);
        }
        let new_blocks = written.len();
        let out: Vec<BlockAddr> = group.iter().map(|(addr, _)| *addr).collect();
        self.replace_blocks::<R>(tenant, batch, written, &out, text)?;
        self.remember_splits(tenant, splits);
        self.stats.merges.fetch_add(1, Ordering::Relaxed);
        self.stats
            .blocks_merged
            .fetch_add(group.len() as u64, Ordering::Relaxed);
        tracing::debug!(tenant = %tenant, signal = R::SIGNAL.name(), window, merged = group.len(), into = new_blocks, rows = rows.len(), "blocks merged");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_and_groups() {
        assert_eq!(tier(10), 0);
        assert_eq!(tier(4096), 1);
        assert_eq!(tier(20_000), 2);
        let meta = |rows| {
            Arc::new(BlockMeta {
                rows,
                min_start: 0,
                max_start: 0,
                max_end: 0,
                columns: Vec::new(),
            })
        };
        let blocks = (0..7)
            .map(|b| {
                (
                    BlockAddr {
                        window: 0,
                        block: b,
                    },
                    meta(40),
                )
            })
            .collect();
        let g = groups(blocks, 100);
        assert_eq!(g.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 2, 2]);
    }
}
