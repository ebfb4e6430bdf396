//! Damaged blocks left out (`skip_corrupt_blocks`): a block whose meta fails its checksum at
//! open, or any part of which (a column chunk, postings, trace summaries, a trace-id entry)
//! fails its checksum when a query reads it, leaves the tenant's block list at once, so every
//! later snapshot answers without it, whichever part a later query reads (one query never
//! counts a block's rows while another leaves them out). The block stays on disk until
//! retention takes its window (`weft check` lists it); the list is kept in memory only, so a
//! restart finds the damage again at the first read. Without the option, damage fails the
//! query that touches it and the block stays.

use super::*;

/// A block left out of every answer because part of it is damaged.
#[derive(Clone, Debug)]
pub struct DamagedBlock {
    pub signal: Signal,
    pub addr: BlockAddr,
    /// What was found, naming the block and the damaged part.
    pub error: String,
}

/// What the store keeps of a damaged block.
pub(super) struct Damage {
    error: String,
    /// Its meta, when that was sound (retention retires the block by it).
    meta: Option<Arc<BlockMeta>>,
}

impl std::fmt::Display for DamagedBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.error)
    }
}

/// Each tenant's damaged blocks, by signal and address.
pub(super) type Damaged = HashMap<TenantId, BTreeMap<(Signal, BlockAddr), Damage>>;

impl Store {
    /// The error for a damaged part of a block; with `skip_corrupt_blocks` the block is also
    /// left out of every later snapshot (the caller's query still fails: it may hold rows
    /// of the block already; answering again leaves it out).
    pub(super) fn damaged(
        &self,
        tenant: &TenantId,
        signal: Signal,
        addr: BlockAddr,
        part: impl Into<String>,
        detail: impl Into<String>,
    ) -> StorageError {
        let e = seal::damaged(tenant, signal, addr, part, detail);
        if self.opts.skip_corrupt_blocks {
            self.leave_out(tenant, signal, addr, &e);
        }
        e
    }

    /// Takes a block out of its tenant's list and records why.
    fn leave_out(&self, tenant: &TenantId, signal: Signal, addr: BlockAddr, e: &StorageError) {
        let mut state = self.lock();
        let state = &mut *state;
        let known = state
            .damaged
            .get(tenant)
            .is_some_and(|d| d.contains_key(&(signal, addr)));
        if known {
            return;
        }
        let meta = match signal {
            Signal::Spans => take_block::<SpanRecord>(state, tenant, addr),
            Signal::Logs => take_block::<LogRecord>(state, tenant, addr),
            Signal::Metrics => take_block::<MetricPoint>(state, tenant, addr),
        };
        if meta.is_none() {
            // merged or retired meanwhile: nothing is left to leave out
            return;
        }
        tracing::error!(error = %e, "damaged block left out of every answer (--skip-corrupt-blocks)");
        self.stats.blocks_left_out.fetch_add(1, Ordering::Relaxed);
        let damage = Damage {
            error: e.to_string(),
            meta,
        };
        state
            .damaged
            .entry(tenant.clone())
            .or_default()
            .insert((signal, addr), damage);
    }

    /// Records a block whose meta failed its checksum at open (it never entered the list).
    pub(super) fn note_damaged_meta(
        state: &mut State,
        tenant: &TenantId,
        signal: Signal,
        addr: BlockAddr,
        e: &StorageError,
    ) {
        let damage = Damage {
            error: e.to_string(),
            meta: None,
        };
        state
            .damaged
            .entry(tenant.clone())
            .or_default()
            .insert((signal, addr), damage);
    }

    /// The blocks of a tenant that answers leave out because they are damaged (any signal).
    pub fn damaged_blocks(&self, tenant: &TenantId) -> Vec<DamagedBlock> {
        self.lock()
            .damaged
            .get(tenant)
            .map(|d| {
                d.iter()
                    .map(|(&(signal, addr), b)| DamagedBlock {
                        signal,
                        addr,
                        error: b.error.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// How many blocks of a tenant are left out as damaged: a query that failed while this
    /// grew met a damaged block, and answers without it when asked again.
    pub fn damaged_count(&self, tenant: &TenantId) -> usize {
        self.lock().damaged.get(tenant).map_or(0, BTreeMap::len)
    }

    /// Damaged blocks left out, over all tenants.
    pub fn damaged_total(&self) -> usize {
        self.lock().damaged.values().map(BTreeMap::len).sum()
    }

    /// A signal's damaged blocks of a tenant whose rows are all older than `cutoff`: retention
    /// retires them with the others ([`Self::replace_blocks`] takes them off this list).
    pub(super) fn damaged_before(
        state: &State,
        tenant: &TenantId,
        signal: Signal,
        cutoff: UnixNanos,
    ) -> Vec<BlockAddr> {
        state.damaged.get(tenant).map_or_else(Vec::new, |d| {
            d.iter()
                .filter(|((s, _), b)| {
                    *s == signal && b.meta.as_ref().is_some_and(|m| m.max_start < cutoff.0)
                })
                .map(|((_, addr), _)| *addr)
                .collect()
        })
    }

    /// Takes blocks off a tenant's damaged list, with their metas.
    pub(super) fn undamage(
        state: &mut State,
        tenant: &TenantId,
        signal: Signal,
        addrs: &[BlockAddr],
    ) -> Vec<(BlockAddr, Arc<BlockMeta>)> {
        let Some(d) = state.damaged.get_mut(tenant) else {
            return Vec::new();
        };
        let gone = addrs
            .iter()
            .filter_map(|a| Some((*a, d.remove(&(signal, *a))?.meta?)))
            .collect();
        if d.is_empty() {
            state.damaged.remove(tenant);
        }
        gone
    }
}

fn take_block<R: Lane>(
    state: &mut State,
    tenant: &TenantId,
    addr: BlockAddr,
) -> Option<Arc<BlockMeta>> {
    let t = R::lanes_mut(state).get_mut(tenant)?;
    if !t.blocks.contains_key(&addr) {
        return None;
    }
    Arc::make_mut(&mut t.blocks).remove(&addr)
}
