//! Taking blocks out of the store (merged into others, or out of retention) without pulling
//! them from under a reader: one atomic write deletes a block's meta and writes its grave (so
//! that after a restart it is not read again), and the in-memory block list drops it at once,
//! so no later snapshot sees it. Its data (column chunks, postings, trace summaries, trace-id
//! index entries) and cached entries are deleted once no reader holds it any more (the
//! retired list holds the last reference to its meta), together with the grave; then the
//! deleted key ranges are compacted, so that the disk space is given back. Graves found at
//! open are deleted then.

use std::collections::HashSet;

use super::*;

/// A block out of its tenant's list, waiting until no reader holds it.
pub(super) type Retired = (TenantId, Signal, BlockAddr, Arc<BlockMeta>);
/// A block whose data is to be deleted.
pub(super) type Dead = (TenantId, Signal, BlockAddr);

impl Store {
    /// Adds to `batch` what takes a block out of the store for good: its meta goes, its grave
    /// comes.
    pub(super) fn stage_retire(
        &self,
        batch: &mut WriteBatch,
        tenant: &TenantId,
        signal: Signal,
        addr: BlockAddr,
    ) {
        let meta = self.cf(CF_META);
        batch.delete_cf(meta, keys::block_key(tenant, signal, keys::META, addr));
        batch.put_cf(meta, keys::block_key(tenant, signal, keys::GRAVE, addr), []);
    }

    /// Writes `batch` (which stages the retirement of `out`, and whatever replaces them), then
    /// swaps the tenant's block list under one lock: `new` in, `out` retired. A snapshot holds
    /// the list before or after, never a mix.
    pub(super) fn replace_blocks<R: Lane>(
        &self,
        tenant: &TenantId,
        batch: WriteBatch,
        new: Vec<(BlockAddr, Arc<BlockMeta>)>,
        out: &[BlockAddr],
        mut text: HashMap<u64, Vec<tantivy::TantivyDocument>>,
    ) -> Result<()> {
        self.db.write_opt(batch, &self.sync)?;
        let mut state = self.lock();
        let windows: std::collections::BTreeSet<u64> = new
            .iter()
            .map(|(a, _)| a.window)
            .chain(out.iter().map(|a| a.window))
            .collect();
        let t = R::lanes_mut(&mut state).entry(tenant.clone()).or_default();
        let blocks = Arc::make_mut(&mut t.blocks);
        blocks.extend(new);
        let mut gone: Vec<Retired> = out
            .iter()
            .filter_map(|addr| Some((tenant.clone(), R::SIGNAL, *addr, blocks.remove(addr)?)))
            .collect();
        // damaged blocks out of retention (see [`super::damage`])
        gone.extend(
            Self::undamage(&mut state, tenant, R::SIGNAL, out)
                .into_iter()
                .map(|(addr, meta)| (tenant.clone(), R::SIGNAL, addr, meta)),
        );
        state.retired.extend(gone);
        drop(state);
        if R::SIGNAL == Signal::Logs {
            for window in windows {
                self.sync_text(tenant, window, &mut text);
            }
        }
        Ok(())
    }

    /// Deletes the data of the retired blocks that only the retired list still holds.
    /// Returns whether it deleted anything.
    pub(super) fn delete_retired(&self) -> Result<bool> {
        let dead: Vec<Dead> = {
            let mut state = self.lock();
            let (dead, held): (Vec<Retired>, Vec<Retired>) = std::mem::take(&mut state.retired)
                .into_iter()
                .partition(|(_, _, _, meta)| Arc::strong_count(meta) == 1);
            state.retired = held;
            dead.into_iter().map(|(t, s, a, _)| (t, s, a)).collect()
        };
        if dead.is_empty() {
            return Ok(false);
        }
        if let Err(e) = self.delete_blocks(&dead) {
            // their graves stay: deleted again next round, or at the next open
            tracing::warn!(error = %e, blocks = dead.len(), "deleting retired blocks failed");
            return Err(e);
        }
        self.stats
            .blocks_deleted
            .fetch_add(dead.len() as u64, Ordering::Relaxed);
        Ok(true)
    }

    /// Deletes blocks' data, graves and cached entries, then the split keys of traces one
    /// block at most holds now, then compacts their key ranges.
    pub(super) fn delete_blocks(&self, dead: &[Dead]) -> Result<()> {
        let data = self.cf(CF_DATA);
        let meta = self.cf(CF_META);
        let mut batch = WriteBatch::default();
        let mut split: Vec<(&TenantId, TraceId)> = Vec::new();
        for (tenant, signal, addr) in dead {
            let (signal, addr) = (*signal, *addr);
            let known = match signal {
                Signal::Spans => self.lock().splits.get(tenant).cloned(),
                _ => None,
            };
            for entry in self
                .block_traces_in(tenant, signal, addr)
                .unwrap_or_default()
            {
                batch.delete_cf(data, keys::trace_id(tenant, signal, &entry.trace_id, addr));
                if known.as_ref().is_some_and(|k| k.contains(&entry.trace_id)) {
                    split.push((tenant, entry.trace_id));
                }
            }
            for kind in [keys::CHUNK, keys::POSTINGS] {
                let from = keys::block_key(tenant, signal, kind, addr);
                batch.delete_range_cf(data, from.clone(), keys::prefix_end(&from));
            }
            batch.delete_cf(data, keys::block_key(tenant, signal, keys::TRACES, addr));
            batch.delete_cf(meta, keys::block_key(tenant, signal, keys::META, addr));
            batch.delete_cf(meta, keys::block_key(tenant, signal, keys::GRAVE, addr));
        }
        self.db.write_opt(batch, &self.sync)?;
        self.forget_cached(dead);
        self.forget_splits(split)?;
        self.compact_deleted(dead);
        Ok(())
    }

    /// Deletes the split keys of those traces that one block at most holds now: their other
    /// blocks went with retention, or were merged into the one that holds the whole trace now
    /// (a query resolves the request values of a split trace's rows over all its blocks, each
    /// time: a merged trace kept split would cost that for nothing). Under the flush lock: a
    /// flush decides which split keys to write from the known ones and the trace-id index.
    fn forget_splits(&self, mut split: Vec<(&TenantId, TraceId)>) -> Result<()> {
        if split.is_empty() {
            return Ok(());
        }
        split.sort_unstable();
        split.dedup();
        let _no_flush = self.flush_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut gone: Vec<(&TenantId, TraceId)> = Vec::new();
        for (tenant, trace) in split {
            if self
                .trace_locations_of(tenant, Signal::Spans, &trace)?
                .len()
                <= 1
            {
                gone.push((tenant, trace));
            }
        }
        if gone.is_empty() {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        for (tenant, trace) in &gone {
            batch.delete_cf(
                self.cf(CF_META),
                keys::split_trace(tenant, Signal::Spans, trace),
            );
        }
        self.db.write_opt(batch, &self.sync)?;
        let mut state = self.lock();
        for (tenant, trace) in gone {
            if let Some(known) = state.splits.get_mut(tenant) {
                Arc::make_mut(known).remove(&trace);
            }
        }
        Ok(())
    }

    /// Drops every cached entry of deleted blocks (each cache key starts with the block's
    /// key: tenant, signal, kind, window, block).
    fn forget_cached(&self, dead: &[Dead]) {
        let gone: HashSet<(&str, Signal, BlockAddr)> = dead
            .iter()
            .map(|(t, signal, addr)| (t.as_str(), *signal, *addr))
            .collect();
        let live = |key: &[u8]| {
            keys::split(key)
                .and_then(|p| Some((p.tenant, p.signal, keys::read_addr(p.rest)?)))
                .is_none_or(|k| !gone.contains(&k))
        };
        self.footers.retain(live);
        self.chunks.retain(live);
        self.postings.retain(live);
        self.trace_runs.retain(live);
        self.term_runs.retain(live);
        self.minority_rows.retain(live);
        self.series_runs.retain(live);
        self.metric_points.retain(live);
        self.matches.retain(live);
        self.rollups.retain(live);
        self.heats.retain(live);
        self.request_rollups.retain(live);
        let tenants: HashSet<&TenantId> = dead.iter().map(|(t, _, _)| t).collect();
        self.resolved.forget(|t| tenants.contains(t));
    }

    /// Compacts the key ranges deleted blocks occupied, per tenant and kind, so that their
    /// bytes leave the disk now rather than whenever RocksDB would get to them.
    fn compact_deleted(&self, dead: &[Dead]) {
        // memtables first: until they are flushed, RocksDB keeps the write-ahead files that
        // hold the deleted rows (and the head batches they came from) on disk
        if let Err(e) = self.flush_memtables() {
            tracing::warn!(error = %e, "memtable flush after a deletion failed");
        }
        let mut ranges: BTreeMap<(&TenantId, Signal), (BlockAddr, BlockAddr)> = BTreeMap::new();
        for (tenant, signal, addr) in dead {
            let e = ranges.entry((tenant, *signal)).or_insert((*addr, *addr));
            e.0 = e.0.min(*addr);
            e.1 = e.1.max(*addr);
        }
        for ((tenant, signal), (first, last)) in ranges {
            for (cf, kind) in [
                (CF_DATA, keys::CHUNK),
                (CF_DATA, keys::POSTINGS),
                (CF_DATA, keys::TRACES),
                (CF_META, keys::META),
            ] {
                let from = keys::block_key(tenant, signal, kind, first);
                let to = keys::prefix_end(&keys::block_key(tenant, signal, kind, last));
                self.db
                    .compact_range_cf(self.cf(cf), Some(&from[..]), Some(&to[..]));
            }
        }
    }
}
