//! An anomaly scan of decode latency (`decode_latency`, `itl`) without materialising token
//! spans: what the SQL path computes from every token span, answered from the blocks'
//! pre-aggregates and postings so that its cost grows with the anomalous windows' rows, not
//! with the range's.
//!
//! - **Series**: the per-step sketch of token latencies is the sum of the blocks' heat cells
//!   of [`Track::ItlBin`] (token spans counted per second and 1% sketch bin), with the same
//!   bins the SQL series counts, so the same p95 per step. Steps and range ends must be whole
//!   seconds where they cut a block's rows.
//! - **Attribution**: rows of the windows are read (start, latency) to find the anomalous ones
//!   and their excess; they are split by the postings of each dimension in turn (`request:D`,
//!   the service's) into bitmaps of rows sharing all values, each counted once; late rows (see
//!   [`late_rows`]) take values resolved over their whole trace, one by one. The baseline
//!   (token spans outside the windows) is never read row by row: for each candidate value and
//!   pair of values (those holding at least 10% of some window's anomalous units, all that
//!   ranking looks at) it is the size of an intersection of bitmaps per block. Head rows are
//!   counted from the rows.
//!
//! Both decline (the caller asks SQL) with `service`, `name` or `attr.` filters, and the
//! attribution with a dimension other than the service or a request dimension.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use roaring::RoaringBitmap;
use weft_storage::Store;
use weft_storage::heat::{TOKEN_SPAN, Track, bucket_bin, token_latency_ms};
use weft_storage::model::{TenantId, Value};
use weft_storage::request::{request_dim_name, request_dims};
use weft_storage::scan::{BlockAddr, BlockMeta, Rows};
use weft_storage::schema::{DIM_NAME, DIM_SERVICE};
use weft_storage::sketch::Sketch;
use weft_storage::store::Snapshot;

use super::anomalies::{Candidates, Tallies};
use super::exec::Run;
use super::params::{Params, Result};
use super::requests::slot;
use crate::sql::request::{HeadRequests, RequestCell, late_rows, late_terms};

const SECOND: u64 = 1_000_000_000;

/// Whether the call's filters let the pre-aggregates answer.
pub fn applies(p: &Params) -> bool {
    p.service.is_none() && p.name.is_none() && p.attrs.is_empty()
}

/// The sketch of decode token latencies (ms) per step (the step's start, as `date_bin` puts
/// it), from the blocks' heat cells; `None` when they cannot answer.
pub async fn series(
    run: &mut Run<'_>,
    p: &Params,
    step: u64,
) -> Result<Option<BTreeMap<u64, Sketch>>> {
    if !applies(p) || !step.is_multiple_of(SECOND) {
        return Ok(None);
    }
    let store = run.engine.store().clone();
    let tenant = run.tenant.clone();
    let (start, end) = (p.start, p.end);
    let work = move || {
        let mut cells: rustc_hash::FxHashMap<(u64, i16), u64> = Default::default();
        let keep = |_: &str, n: &str| n == TOKEN_SPAN;
        let answered = store.heat_cells(
            &tenant,
            start,
            end,
            Track::ItlBin,
            &keep,
            &mut |second, bucket, n, _| {
                *cells
                    .entry((second * SECOND / step * step, bucket))
                    .or_default() += n;
            },
        )?;
        let mut steps: BTreeMap<u64, Sketch> = BTreeMap::new();
        for ((t, bucket), n) in cells {
            steps.entry(t).or_default().add(bucket_bin(bucket), n);
        }
        Ok::<_, weft_storage::StorageError>(answered.then_some(steps))
    };
    Ok(run
        .blocking("decode latency series", work)
        .await?
        .unwrap_or_else(|| Some(BTreeMap::new())))
}

/// A dimension attribution can read from postings.
#[derive(Clone, Copy, Debug)]
enum Dim {
    /// The span's own service.
    Service,
    /// A request dimension (its slot), inherited from the request.
    Request(usize),
}

impl Dim {
    fn of(name: &str) -> Option<Self> {
        match name {
            "service" | "service.name" | "service_name" => Some(Self::Service),
            d => slot(d).map(Self::Request),
        }
    }

    fn postings(self) -> &'static str {
        match self {
            Self::Service => DIM_SERVICE,
            Self::Request(s) => request_dim_name(request_dims()[s]),
        }
    }
}

/// What attribution asks: the windows, the latency over which a token span is anomalous and
/// the baseline's middle (excess is measured above it).
pub struct Ask {
    pub windows: Vec<(u64, u64)>,
    pub threshold: f64,
    pub mid: f64,
}

/// The tallies of decode latency attribution over `dims` (see the module); `None` when the
/// postings cannot answer.
pub async fn tallies(
    run: &mut Run<'_>,
    p: &Params,
    dims: &[String],
    ask: Ask,
) -> Result<Option<Tallies>> {
    let parsed: Option<Vec<Dim>> = dims.iter().map(|d| Dim::of(d)).collect();
    let (Some(parsed), true) = (parsed, applies(p) && !dims.is_empty()) else {
        return Ok(None);
    };
    let store = run.engine.store().clone();
    let tenant = run.tenant.clone();
    let (start, end) = (p.start, p.end);
    let windows = ask.windows.len();
    let work = move || {
        let snapshot = store.snapshot(&tenant).map_err(err)?;
        let (lo, hi) = snapshot.range(start, end);
        let head = RequestCell::default().get(&store, &tenant, &snapshot)?;
        let scan = Scan {
            store: &store,
            tenant: &tenant,
            snapshot: &snapshot,
            head: &head,
            dims: &parsed,
            ask: &ask,
            range: (lo, hi),
        };
        scan.run().map(Some)
    };
    Ok(run
        .blocking("decode latency attribution", work)
        .await?
        // out of time: the windows stand, without causes
        .unwrap_or_else(|| Some(Tallies::new(dims.len(), windows))))
}

/// One attribution's reading of a snapshot.
struct Scan<'a> {
    store: &'a Arc<Store>,
    tenant: &'a TenantId,
    snapshot: &'a Snapshot,
    head: &'a HeadRequests,
    dims: &'a [Dim],
    ask: &'a Ask,
    range: (u64, u64),
}

/// A block's token rows in range, split: those outside every window (the baseline) and the
/// anomalous ones with their window and excess.
struct BlockRows {
    baseline: RoaringBitmap,
    anomalous: Vec<(u32, usize, f64)>,
}

type Res<T> = datafusion::error::Result<T>;

/// No value of a dimension, in a tuple of term ids.
const NONE: u32 = u32::MAX;

/// Terms met, as ids: rows' tuples are ids until they are counted.
#[derive(Default)]
struct Terms {
    terms: Vec<String>,
    ids: rustc_hash::FxHashMap<String, u32>,
}

impl Terms {
    fn id(&mut self, term: &str) -> u32 {
        if let Some(&i) = self.ids.get(term) {
            return i;
        }
        let i = self.terms.len() as u32;
        self.terms.push(term.to_owned());
        self.ids.insert(term.to_owned(), i);
        i
    }

    fn tuple(&self, ids: &[u32]) -> Vec<Option<String>> {
        ids.iter()
            .map(|&i| (i != NONE).then(|| self.terms[i as usize].clone()))
            .collect()
    }
}

fn err(e: weft_storage::StorageError) -> datafusion::error::DataFusionError {
    crate::sql::columns::storage_err(e)
}

impl Scan<'_> {
    fn window_of(&self, t: u64) -> Option<usize> {
        self.ask
            .windows
            .iter()
            .position(|(s, e)| (*s..*e).contains(&t))
    }

    fn run(&self) -> Res<Tallies> {
        let (lo, hi) = self.range;
        let mut t = Tallies::new(self.dims.len(), self.ask.windows.len());
        let blocks: Vec<(BlockAddr, &BlockMeta)> = self
            .snapshot
            .blocks_in((lo, hi))
            .into_iter()
            .map(|(a, m)| (a, m.as_ref()))
            .collect();
        // the windows' rows first: the anomalous units (counted per window and tuple), and so
        // the candidates
        let mut terms = Terms::default();
        let mut groups: Vec<rustc_hash::FxHashMap<Vec<u32>, (f64, f64)>> =
            vec![Default::default(); self.ask.windows.len()];
        let mut read: Vec<BlockRows> = Vec::with_capacity(blocks.len());
        for &(addr, meta) in &blocks {
            let rows = self.block_rows(addr, meta)?;
            if !rows.anomalous.is_empty() {
                self.count_anomalous(addr, meta, &rows.anomalous, &mut terms, &mut groups)?;
            }
            read.push(rows);
        }
        for (w, groups) in groups.into_iter().enumerate() {
            for (tuple, (units, excess)) in groups {
                t.anomalous_of(w, &terms.tuple(&tuple), units, excess);
            }
        }
        // head rows of the baseline, counted by their values (rows of a request share them)
        let mut head_baseline: HashMap<Vec<Option<String>>, f64> = HashMap::new();
        for r in self.snapshot.head.rows() {
            if r.name != TOKEN_SPAN || !(lo..hi).contains(&r.start.0) {
                continue;
            }
            let values = self.head.of(r);
            let tuple: Vec<Option<String>> = self
                .dims
                .iter()
                .map(|d| match d {
                    Dim::Service => Some(r.service_name().to_owned()),
                    Dim::Request(s) => values
                        .and_then(|v| v.get(*s))
                        .and_then(Option::as_ref)
                        .and_then(Value::as_term),
                })
                .collect();
            match self.window_of(r.start.0) {
                Some(w) => {
                    let v = token_latency_ms(r);
                    if v > self.ask.threshold {
                        t.anomalous_of(w, &tuple, 1.0, v - self.ask.mid);
                    }
                }
                None => *head_baseline.entry(tuple).or_default() += 1.0,
            }
        }
        // the baseline of the candidates alone
        let candidates = t.candidates();
        for (tuple, units) in &head_baseline {
            t.baseline_of(&candidates, tuple, *units);
        }
        for ((addr, meta), rows) in blocks.into_iter().zip(read) {
            self.block_baseline(&mut t, &candidates, addr, meta, rows.baseline, &mut terms)?;
        }
        Ok(t)
    }

    /// The block's token rows in range, read row by row only where the range or a window
    /// cuts the block.
    fn block_rows(&self, addr: BlockAddr, meta: &BlockMeta) -> Res<BlockRows> {
        let (lo, hi) = self.range;
        let names = self
            .store
            .dimension_shared(self.tenant, addr, DIM_NAME)
            .map_err(err)?;
        let Some((_, tokens)) = names.iter().find(|(n, _)| n == TOKEN_SPAN) else {
            return Ok(BlockRows {
                baseline: RoaringBitmap::new(),
                anomalous: Vec::new(),
            });
        };
        let cut = meta.min_start < lo || meta.max_start >= hi;
        let windowed = self
            .ask
            .windows
            .iter()
            .any(|(s, e)| meta.max_start >= *s && meta.min_start < *e);
        if !cut && !windowed {
            return Ok(BlockRows {
                baseline: tokens.clone(),
                anomalous: Vec::new(),
            });
        }
        let view = self.store.block_view(self.tenant, addr, meta);
        // a block wholly inside one window needs no start times
        let inside = self
            .ask
            .windows
            .iter()
            .position(|(s, e)| meta.min_start >= *s && meta.max_start < *e);
        let mut in_window: Vec<(u32, usize)> = Vec::new();
        let baseline = match inside {
            Some(w) if !cut => {
                in_window.extend(tokens.iter().map(|row| (row, w)));
                RoaringBitmap::new()
            }
            _ => {
                // rows out of the range or in a window are not the baseline
                let mut left_out = Vec::new();
                let starts = view.starts(&Rows::Set(tokens.clone())).map_err(err)?;
                for (row, &start) in tokens.iter().zip(starts.iter()) {
                    let start = start as u64;
                    if !(lo..hi).contains(&start) {
                        left_out.push(row);
                        continue;
                    }
                    if let Some(w) = self.window_of(start) {
                        in_window.push((row, w));
                        left_out.push(row);
                    }
                }
                tokens - RoaringBitmap::from_sorted_iter(left_out).expect("rows ascend")
            }
        };
        let mut anomalous = Vec::new();
        if !in_window.is_empty() {
            let set = RoaringBitmap::from_sorted_iter(in_window.iter().map(|r| r.0))
                .expect("rows ascend");
            let rows = Rows::Set(set);
            let own = view
                .dedicated_doubles(weft_storage::heat::TOKEN_LATENCY, &rows)
                .map_err(err)?;
            let durations = view.durations(&rows).map_err(err)?;
            for (i, ((row, w), d)) in in_window.into_iter().zip(durations.iter()).enumerate() {
                let v = match own.as_ref().and_then(|o| o[i]) {
                    Some(v) => v,
                    None => *d as f64 / 1e6,
                };
                if v > self.ask.threshold {
                    anomalous.push((row, w, v - self.ask.mid));
                }
            }
        }
        Ok(BlockRows {
            baseline,
            anomalous,
        })
    }

    /// Adds a block's anomalous rows (row, window, excess; rows ascending) to the units and
    /// excess by window and tuple: late rows one by one, the others split by each dimension's
    /// postings in turn, so that the rows sharing a tuple are one bitmap, counted once.
    fn count_anomalous(
        &self,
        addr: BlockAddr,
        meta: &BlockMeta,
        anomalous: &[(u32, usize, f64)],
        terms: &mut Terms,
        groups: &mut [rustc_hash::FxHashMap<Vec<u32>, (f64, f64)>],
    ) -> Res<()> {
        let mut add =
            |w: usize, tuple: &[u32], units: f64, excess: f64| match groups[w].get_mut(tuple) {
                Some(g) => {
                    g.0 += units;
                    g.1 += excess;
                }
                None => {
                    groups[w].insert(tuple.to_vec(), (units, excess));
                }
            };
        let mut excess = vec![0.0; meta.rows as usize];
        let mut by_window = vec![Vec::new(); self.ask.windows.len()];
        for &(row, w, ex) in anomalous {
            excess[row as usize] = ex;
            by_window[w].push(row);
        }
        let all =
            RoaringBitmap::from_sorted_iter(anomalous.iter().map(|r| r.0)).expect("rows ascend");
        let late = self.late(addr, meta)? & &all;
        if !late.is_empty() {
            let d = self.dims.len();
            let tuples = self.late_tuples(addr, meta, &late, terms)?;
            let window: rustc_hash::FxHashMap<u32, usize> = anomalous
                .iter()
                .filter(|r| late.contains(r.0))
                .map(|r| (r.0, r.1))
                .collect();
            for (row, tuple) in late.iter().zip(tuples.chunks(d.max(1))) {
                add(window[&row], &tuple[..d], 1.0, excess[row as usize]);
            }
        }
        let mut postings = Vec::with_capacity(self.dims.len());
        for dim in self.dims {
            let p = self
                .store
                .dimension_shared(self.tenant, addr, dim.postings())
                .map_err(err)?;
            let ids: Vec<u32> = p.iter().map(|(t, _)| terms.id(t)).collect();
            postings.push((p, ids));
        }
        for (w, rows) in by_window.into_iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let settled = RoaringBitmap::from_sorted_iter(rows).expect("rows ascend") - &late;
            // depth-first: (rows, depth, the tuple so far)
            let mut stack = vec![(settled, Vec::with_capacity(self.dims.len()))];
            while let Some((rows, prefix)) = stack.pop() {
                let depth = prefix.len();
                if depth == self.dims.len() {
                    let sum: f64 = rows.iter().map(|r| excess[r as usize]).sum();
                    add(w, &prefix, rows.len() as f64, sum);
                    continue;
                }
                let (sets, ids) = &postings[depth];
                let mut rest = rows.clone();
                for ((_, set), id) in sets.iter().zip(ids) {
                    // of the rows left: a row holds one value of a dimension
                    let part = &rest & set;
                    if part.is_empty() {
                        continue;
                    }
                    rest -= &part;
                    let mut next = prefix.clone();
                    next.push(*id);
                    stack.push((part, next));
                }
                if !rest.is_empty() {
                    let mut next = prefix;
                    next.push(NONE);
                    stack.push((rest, next));
                }
            }
        }
        Ok(())
    }

    /// The postings dimension names of the request dimensions asked.
    fn request_postings(&self) -> Vec<&'static str> {
        self.dims
            .iter()
            .filter(|d| matches!(d, Dim::Request(_)))
            .map(|d| d.postings())
            .collect()
    }

    /// The late rows of a block for the dimensions asked (none without request dimensions).
    fn late(&self, addr: BlockAddr, meta: &BlockMeta) -> Res<RoaringBitmap> {
        let dims = self.request_postings();
        if dims.is_empty() {
            return Ok(RoaringBitmap::new());
        }
        late_rows(
            self.store,
            self.tenant,
            self.snapshot,
            self.head,
            addr,
            meta,
            &dims,
        )
    }

    /// Each of some late rows' values of the dimensions asked (rows ascending), as term ids:
    /// row `i`'s at `i · dims ..`; the service from the postings, request dimensions resolved
    /// over the whole trace.
    fn late_tuples(
        &self,
        addr: BlockAddr,
        meta: &BlockMeta,
        rows: &RoaringBitmap,
        terms: &mut Terms,
    ) -> Res<Vec<u32>> {
        let d = self.dims.len();
        let mut out = vec![NONE; rows.len() as usize * d];
        let mut slots: Vec<(usize, usize)> = Vec::new();
        for (i, dim) in self.dims.iter().enumerate() {
            match dim {
                Dim::Request(s) => slots.push((i, *s)),
                Dim::Service => {
                    let postings = self
                        .store
                        .dimension_shared(self.tenant, addr, dim.postings())
                        .map_err(err)?;
                    for (term, set) in postings.iter() {
                        let id = terms.id(term);
                        for row in (set & rows).iter() {
                            out[(rows.rank(row) - 1) as usize * d + i] = id;
                        }
                    }
                }
            }
        }
        if !slots.is_empty() {
            let only: Vec<usize> = slots.iter().map(|(_, s)| *s).collect();
            let found = late_terms(
                self.store,
                self.tenant,
                self.snapshot,
                self.head,
                (addr, meta),
                rows,
                &only,
            )?;
            for (at, found) in found.into_iter().enumerate() {
                for ((i, _), term) in slots.iter().zip(found) {
                    out[at * d + *i] = term.map_or(NONE, |t| terms.id(&t));
                }
            }
        }
        Ok(out)
    }

    /// Adds a block's baseline rows to the candidates' baseline: settled rows by the sizes of
    /// bitmap intersections, late rows one by one.
    fn block_baseline(
        &self,
        t: &mut Tallies,
        candidates: &[Candidates],
        addr: BlockAddr,
        meta: &BlockMeta,
        mut baseline: RoaringBitmap,
        terms: &mut Terms,
    ) -> Res<()> {
        if baseline.is_empty() {
            return Ok(());
        }
        if candidates.iter().all(|c| c.is_empty()) {
            t.total_baseline += baseline.len() as f64;
            return Ok(());
        }
        let late = self.late(addr, meta)? & &baseline;
        if !late.is_empty() {
            let tuples = self.late_tuples(addr, meta, &late, terms)?;
            for tuple in tuples.chunks(self.dims.len().max(1)) {
                t.baseline_of(candidates, &terms.tuple(tuple), 1.0);
            }
            baseline -= late;
        }
        t.total_baseline += baseline.len() as f64;
        // each candidate value's baseline rows, kept for the pairs that start with it
        let mut postings = Vec::with_capacity(self.dims.len());
        for dim in self.dims {
            postings.push(
                self.store
                    .dimension_shared(self.tenant, addr, dim.postings())
                    .map_err(err)?,
            );
        }
        let find = |d: usize, term: &str| -> Option<&RoaringBitmap> {
            postings[d]
                .iter()
                .find(|(t, _)| t == term)
                .map(|(_, set)| set)
        };
        let mut singles: BTreeMap<(usize, &str), RoaringBitmap> = BTreeMap::new();
        for (s, set) in t.sets.iter().enumerate() {
            if set.len() != 1 {
                continue;
            }
            for key in &candidates[s] {
                let rows = find(set[0], &key[0]).map_or_else(RoaringBitmap::new, |p| p & &baseline);
                *t.baseline[s].entry(key.clone()).or_default() += rows.len() as f64;
                singles.insert((set[0], key[0].as_str()), rows);
            }
        }
        for (s, set) in t.sets.iter().enumerate() {
            if set.len() != 2 {
                continue;
            }
            for key in &candidates[s] {
                let n = match (
                    singles.get(&(set[0], key[0].as_str())),
                    find(set[1], &key[1]),
                ) {
                    (Some(first), Some(second)) => first.intersection_len(second),
                    _ => 0,
                };
                *t.baseline[s].entry(key.clone()).or_default() += n as f64;
            }
        }
        Ok(())
    }
}
