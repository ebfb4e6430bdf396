//! The latency histograms of a tenant's spans over a time range ([`crate::heat`]): each block
//! in range answers with the cells it was written with (decoded once, cached), head rows from
//! the rows. Cells are per second: a range whose ends fall inside a second of a block's rows
//! cannot be answered from them, nor can a block written before heat rollups; the caller is
//! told, and asks SQL instead.

use super::*;
use crate::block::writer::col;
use crate::heat::{BlockHeat, HeatRollup, Track};

/// Decoded block heat rollups kept in memory, in bytes.
pub const HEAT_CACHE_BYTES: usize = 64 << 20;

const SECOND: u64 = 1_000_000_000;

impl Store {
    /// Visits the heat cells of the tenant's spans starting in `[start, end)` (either end
    /// open) on `track`, of the operations (service, name) that `keep` accepts:
    /// `cell(second, bucket, count, exemplar)`, a cell possibly more than once (blocks and head
    /// add up). `false`, and nothing visited, when the cells cannot answer exactly.
    pub fn heat_cells(
        &self,
        tenant: &TenantId,
        start: Option<u64>,
        end: Option<u64>,
        track: Track,
        keep: &dyn Fn(&str, &str) -> bool,
        cell: &mut dyn FnMut(u64, i16, u64, &TraceId),
    ) -> Result<bool> {
        let snapshot = self.snapshot(tenant)?;
        let (lo, hi) = snapshot.range(start, end);
        let in_range = snapshot.blocks_in((lo, hi));
        // every block must have cells, and a range end cutting a block must be a whole second
        for (_, meta) in &in_range {
            let cut_low = meta.min_start < lo && !lo.is_multiple_of(SECOND);
            let cut_high = meta.max_start >= hi && !hi.is_multiple_of(SECOND);
            if cut_low || cut_high || meta.column(col::ROLLUP_HEAT).is_none() {
                return Ok(false);
            }
        }
        let mut heats = Vec::with_capacity(in_range.len());
        for (addr, meta) in in_range {
            let heat = self.block_heat(tenant, addr, meta)?;
            if track == Track::ItlBin && !heat.has_bins {
                return Ok(false);
            }
            heats.push((meta, heat));
        }
        for (meta, heat) in heats {
            let wanted: Vec<bool> = heat.ops.iter().map(|(s, n)| keep(s, n)).collect();
            // the seconds in range (the ends are whole seconds where they cut the block)
            let first = if meta.min_start < lo { lo / SECOND } else { 0 };
            let last = if meta.max_start >= hi {
                hi / SECOND
            } else {
                u64::MAX
            };
            if track == Track::ItlBin {
                let none = TraceId([0; 16]);
                for b in &heat.bins {
                    if wanted[b.op as usize] && (first..last).contains(&b.second) {
                        cell(b.second, b.bin, b.count.into(), &none);
                    }
                }
                continue;
            }
            for c in &heat.cells {
                if c.track == track && wanted[c.op as usize] && (first..last).contains(&c.second) {
                    cell(c.second, c.bucket, c.count, &c.exemplar);
                }
            }
        }
        let head = HeatRollup::of_spans(
            snapshot
                .head
                .rows()
                .filter(|s| (lo..hi).contains(&s.start.0)),
        );
        let wanted: Vec<bool> = head.ops.iter().map(|(s, n)| keep(s, n)).collect();
        for c in head.cells() {
            if c.track == track && wanted[c.op as usize] {
                cell(c.second, c.bucket, c.count, &c.exemplar);
            }
        }
        Ok(true)
    }

    /// A block's heat rollup, decoded and cached.
    fn block_heat(
        &self,
        tenant: &TenantId,
        addr: BlockAddr,
        meta: &BlockMeta,
    ) -> Result<Arc<BlockHeat>> {
        self.cached_chunk(
            &self.heats,
            (tenant, addr, meta),
            col::ROLLUP_HEAT,
            "heat rollup",
            HeatRollup::decode,
            BlockHeat::weight,
        )
    }
}
