//! The operation rollup of a tenant's spans over a time range ([`crate::rollup`]): blocks wholly
//! inside the range answer with the rollup they were written with (decoded once, cached);
//! blocks the range cuts, and blocks written before rollups, are rolled up from their columns
//! (the rows in range alone); head rows from the rows. Children whose parent is elsewhere (the
//! orphans of each part) are joined to their parents last, through the trace-id index: the
//! work grows with the split traces, not with the spans stored.

use super::*;
use crate::block::reader::NO_PARENT;
use crate::block::writer::col;
use crate::model::StatusCode;
use crate::rollup::OpRollup;
use rustc_hash::{FxHashMap, FxHashSet};

/// Decoded block rollups kept in memory, in bytes.
pub const ROLLUP_CACHE_BYTES: usize = 32 << 20;

impl Store {
    /// The operation rollup of the tenant's spans starting in `[start, end)` (either end
    /// open), with every child joined to its parent in range: no orphans are left in it.
    pub fn operation_rollup(
        &self,
        tenant: &TenantId,
        start: Option<u64>,
        end: Option<u64>,
    ) -> Result<OpRollup> {
        let snapshot = self.snapshot(tenant)?;
        let (lo, hi) = snapshot.range(start, end);
        let mut total = OpRollup::default();
        for (addr, meta) in snapshot.blocks.iter() {
            if meta.max_start < lo || meta.min_start >= hi {
                continue;
            }
            let reader = self.block_reader(tenant, *addr, meta);
            if meta.min_start >= lo && meta.max_start < hi {
                let rollup = self.block_rollup(tenant, *addr, &reader)?;
                total.absorb(&rollup);
            } else {
                let starts = reader.ints(col::START, &Rows::All)?;
                let set: RoaringBitmap = starts
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| (lo..hi).contains(&(**s as u64)))
                    .map(|(i, _)| i as u32)
                    .collect();
                if !set.is_empty() {
                    total.absorb(&rollup_of_rows(&reader, &set)?);
                }
            }
        }
        let head: Vec<&SpanRecord> = snapshot
            .head
            .rows()
            .filter(|s| (lo..hi).contains(&s.start.0))
            .collect();
        total.absorb(&OpRollup::of_spans(&head));
        self.join_orphans(tenant, &snapshot, &mut total, lo..hi)?;
        Ok(total)
    }

    /// A whole block's rollup: as written with it, else from its columns; cached decoded.
    fn block_rollup(
        &self,
        tenant: &TenantId,
        addr: BlockAddr,
        reader: &BlockReader<'_, ChunkFetcher<'_>>,
    ) -> Result<Arc<OpRollup>> {
        let key = keys::chunk(tenant, SPANS, addr, col::ROLLUP_OPS);
        if let Some(r) = self.rollups.get(&key) {
            return Ok(r);
        }
        let rollup = match reader.raw_chunk(col::ROLLUP_OPS)? {
            Some(bytes) => OpRollup::decode(&bytes).map_err(|e| {
                self.damaged(tenant, SPANS, addr, "operation rollup", e.to_string())
            })?,
            None => {
                let mut all = RoaringBitmap::new();
                all.insert_range(0..reader.meta.rows);
                rollup_of_rows(reader, &all)?
            }
        };
        let rollup = Arc::new(rollup);
        self.rollups
            .insert(key.clone(), key.len() + rollup.weight(), rollup.clone());
        Ok(rollup)
    }

    /// A block's chunk `column` in its own encoding, decoded once and kept in `cache`
    /// (weighed by `weight`); a chunk missing or not decoding marks the block damaged (`part`
    /// names it).
    pub(super) fn cached_chunk<T>(
        &self,
        cache: &crate::cache::Bounded<Arc<T>>,
        (tenant, addr, meta): (&TenantId, BlockAddr, &BlockMeta),
        column: &str,
        part: &str,
        decode: impl FnOnce(&[u8]) -> Result<T>,
        weight: impl FnOnce(&T) -> usize,
    ) -> Result<Arc<T>> {
        let key = keys::chunk(tenant, SPANS, addr, column);
        if let Some(hit) = cache.get(&key) {
            return Ok(hit);
        }
        let reader = self.block_reader(tenant, addr, meta);
        let bytes = reader
            .raw_chunk(column)?
            .ok_or_else(|| self.damaged(tenant, SPANS, addr, part, "chunk missing"))?;
        let value = Arc::new(
            decode(&bytes).map_err(|e| self.damaged(tenant, SPANS, addr, part, e.to_string()))?,
        );
        cache.insert(key.clone(), key.len() + weight(&value), value.clone());
        Ok(value)
    }

    /// Joins each orphan of `total` to its parent (head rows, or the blocks the trace-id
    /// index names for its trace) when the parent starts in `range`; then clears them.
    fn join_orphans(
        &self,
        tenant: &TenantId,
        snapshot: &Snapshot,
        total: &mut OpRollup,
        range: std::ops::Range<u64>,
    ) -> Result<()> {
        let orphans = std::mem::take(&mut total.orphans);
        if orphans.is_empty() {
            return Ok(());
        }
        let traces: FxHashSet<TraceId> = orphans.iter().map(|o| o.trace).collect();
        // (trace, span id) of each parent wanted → its operation, once found in range
        let mut parents: FxHashMap<(TraceId, SpanId), Option<u32>> = FxHashMap::default();
        parents.reserve(orphans.len());
        for o in &orphans {
            parents.insert((o.trace, o.parent), None);
        }
        for s in snapshot.head.rows() {
            if range.contains(&s.start.0)
                && let Some(slot) = parents.get_mut(&(s.trace_id, s.span_id))
            {
                *slot = Some(total.op(s.service_name(), &s.name));
            }
        }
        let mut per_block: BTreeMap<BlockAddr, Vec<(u32, u32, TraceId)>> = BTreeMap::new();
        for trace in &traces {
            for (addr, e) in self.trace_locations_in(tenant, snapshot, trace)? {
                per_block
                    .entry(addr)
                    .or_default()
                    .push((e.row_start, e.rows, *trace));
            }
        }
        for (addr, mut runs) in per_block {
            let meta = &snapshot.blocks[&addr];
            let reader = self.block_reader(tenant, addr, meta);
            runs.sort_unstable_by_key(|r| r.0);
            let mut set = RoaringBitmap::new();
            for (start, len, _) in &runs {
                set.insert_range(*start..start + len);
            }
            let rows = Rows::Set(set);
            let ids = reader.span_ids(&rows)?;
            let starts = reader.ints(col::START, &rows)?;
            let services = text(&reader, col::SERVICE, &rows)?;
            let names = text(&reader, col::NAME, &rows)?;
            let mut i = 0;
            for (_, len, trace) in runs {
                for _ in 0..len {
                    if range.contains(&(starts[i] as u64))
                        && let Some(slot) = parents.get_mut(&(trace, ids[i]))
                    {
                        *slot = Some(total.op(services.value(i), names.value(i)));
                    }
                    i += 1;
                }
            }
        }
        for o in orphans {
            if let Some(&Some(p)) = parents.get(&(o.trace, o.parent)) {
                total.add_edge(p, o.op, o.duration_ns);
            }
        }
        Ok(())
    }
}

/// A text column of some rows as string views.
fn text(
    reader: &BlockReader<'_, ChunkFetcher<'_>>,
    column: &str,
    rows: &Rows,
) -> Result<arrow::array::StringViewArray> {
    use arrow::array::AsArray;
    let a = reader
        .string_views(column, rows)?
        .ok_or_else(|| StorageError::corrupt("span block", format!("no {column} column")))?;
    let a = arrow::compute::cast(&a, &arrow::datatypes::DataType::Utf8View)?;
    Ok(a.as_string_view().clone())
}

/// The rollup of some rows of a block, from its columns: a child whose parent is a row of
/// the block outside `set` (out of range) makes no edge; one whose parent is not in the block
/// is an orphan.
fn rollup_of_rows(
    reader: &BlockReader<'_, ChunkFetcher<'_>>,
    set: &RoaringBitmap,
) -> Result<OpRollup> {
    let Some(places) = reader.parent_rows(set)? else {
        // no parent ranks (a trace holds one span id twice, or an old block): the spans,
        // read once; parents in the block but out of range are no edge
        let all = reader.spans(&Rows::All, false)?;
        let (chosen, rest): (Vec<(usize, &SpanRecord)>, Vec<_>) = all
            .iter()
            .enumerate()
            .partition(|(i, _)| set.contains(*i as u32));
        let chosen: Vec<&SpanRecord> = chosen.into_iter().map(|(_, s)| s).collect();
        let mut r = OpRollup::of_spans(&chosen);
        let held: FxHashSet<(TraceId, SpanId)> =
            rest.iter().map(|(_, s)| (s.trace_id, s.span_id)).collect();
        r.orphans.retain(|o| !held.contains(&(o.trace, o.parent)));
        return Ok(r);
    };
    let rows = Rows::Set(set.clone());
    let durations = reader.ints(col::DURATION, &rows)?;
    let status = reader.ints(col::STATUS_CODE, &rows)?;
    let services = text(reader, col::SERVICE, &rows)?;
    let names = text(reader, col::NAME, &rows)?;
    let mut r = OpRollup::default();
    let ops: Vec<u32> = (0..set.len() as usize)
        .map(|i| r.op(services.value(i), names.value(i)))
        .collect();
    // rows without a parent row here: roots, or children of a span elsewhere
    let mut away = RoaringBitmap::new();
    for (row, parent) in set.iter().zip(&places.parents) {
        if *parent == NO_PARENT {
            away.insert(row);
        }
    }
    let parent_ids = if away.is_empty() {
        Vec::new()
    } else {
        reader.parent_ids(&Rows::Set(away.clone()))?
    };
    let mut away_at = away.iter().zip(parent_ids).peekable();
    for (i, row) in set.iter().enumerate() {
        let (op, d) = (ops[i], durations[i] as u64);
        let parent_id = match away_at.peek() {
            Some((r, _)) if *r == row => away_at.next().and_then(|(_, p)| p),
            _ => None,
        };
        let parent_row = places.parents[i];
        let root = parent_row == NO_PARENT && parent_id.is_none();
        r.add_span(op, status[i] == StatusCode::Error as i64, d, root);
        if parent_row != NO_PARENT {
            if set.contains(parent_row) {
                r.add_edge(ops[set.rank(parent_row) as usize - 1], op, d);
            }
        } else if let Some(parent) = parent_id {
            r.orphans.push(crate::rollup::Orphan {
                trace: places.runs.ids[places.of_run[i] as usize],
                parent,
                op,
                duration_ns: d,
            });
        }
    }
    Ok(r)
}
