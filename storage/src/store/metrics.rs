//! Metric series and reading their points.
//!
//! Each tenant has a catalog of series: a series gets the next id the first time a point of it
//! arrives, is written (synced) to the meta column family under `keys::series` before any
//! point that refers to it, and is loaded at open. In memory the catalog maps a series'
//! identity to its id, and holds roaring-bitmap postings from metric names and label pairs to
//! series ids, so that a selector resolves to series without reading a point. Points are read
//! by one scan over a snapshot's blocks and head rows, by time range and series set, to Arrow
//! columns; head rows go through the block's own column builders ([`MetricColumns`]).

use std::sync::RwLock;

use arrow::array::{ArrayRef, RecordBatch};

use super::*;
use crate::block::metrics::{self, MetricColumns, col};
use crate::model::{PointValue, Series, SeriesId};

/// A metric block's points decoded: rows sorted by (series, time), found by series run.
#[derive(Debug)]
pub struct DecodedPoints {
    runs: Arc<Vec<(u32, u32, u32)>>,
    times: arrow::buffer::ScalarBuffer<i64>,
    starts: arrow::buffer::ScalarBuffer<i64>,
    values: arrow::array::Float64Array,
}

impl DecodedPoints {
    fn weight(&self) -> usize {
        self.times.len() * 25 + self.runs.len() * 12
    }

    /// Appends (series, time, start, value) of the given series' points with a value in
    /// `from..=to`, by series then time.
    fn values_into(
        &self,
        series: &RoaringBitmap,
        from: Option<u64>,
        to: Option<u64>,
        out: &mut Vec<(SeriesId, u64, u64, f64)>,
    ) {
        let (Some(first), Some(last)) = (self.runs.first(), self.runs.last()) else {
            return;
        };
        let mut next = 0;
        for s in series.range(first.0..=last.0) {
            next += self.runs[next..].partition_point(|r| r.0 < s);
            let Some(&(id, start, len)) = self.runs.get(next) else {
                return;
            };
            if id != s {
                continue;
            }
            let (start, end) = (start as usize, (start + len) as usize);
            let times = &self.times[start..end];
            let lo = start + from.map_or(0, |f| times.partition_point(|t| (*t as u64) < f));
            let hi = start + to.map_or(times.len(), |e| times.partition_point(|t| *t as u64 <= e));
            for i in lo..hi {
                if arrow::array::Array::is_valid(&self.values, i) {
                    out.push((
                        s,
                        self.times[i] as u64,
                        self.starts[i] as u64,
                        self.values.value(i),
                    ));
                }
            }
        }
    }
}

/// One tenant's series. Ids are given in order; a series whose points have all gone with
/// retention is deleted ([`Store::forget_series`]) and leaves a gap.
#[derive(Debug, Default)]
pub struct SeriesCatalog {
    ids: rustc_hash::FxHashMap<Vec<u8>, SeriesId>,
    series: Vec<Option<Arc<Series>>>,
    /// When each series was last registered or looked up by a writer (store clock, ns): a
    /// series a writer holds the id of is never deleted under it.
    touched: Vec<std::sync::atomic::AtomicU64>,
    names: BTreeMap<String, RoaringBitmap>,
    labels: BTreeMap<String, BTreeMap<String, RoaringBitmap>>,
}

impl SeriesCatalog {
    fn insert(&mut self, id: SeriesId, series: Series, now: u64) -> Result<()> {
        if (id as usize) < self.series.len() {
            return Err(StorageError::corrupt(
                "series catalog",
                format!("series {id} follows {} series", self.series.len()),
            ));
        }
        // gaps are deleted series (at open: they are not in the meta column family)
        while self.series.len() < id as usize {
            self.series.push(None);
            self.touched.push(Default::default());
        }
        self.touched.push(std::sync::atomic::AtomicU64::new(now));
        self.ids.insert(series.identity(), id);
        self.names
            .entry(series.name.clone())
            .or_default()
            .insert(id);
        for (k, v) in &series.labels {
            self.labels
                .entry(k.clone())
                .or_default()
                .entry(v.clone())
                .or_default()
                .insert(id);
        }
        self.series.push(Some(Arc::new(series)));
        Ok(())
    }

    /// Takes a series out: its id stays unused.
    fn remove(&mut self, id: SeriesId) -> Option<Arc<Series>> {
        let series = self.series.get_mut(id as usize)?.take()?;
        self.ids.remove(&series.identity());
        if let Some(ids) = self.names.get_mut(&series.name) {
            ids.remove(id);
            if ids.is_empty() {
                self.names.remove(&series.name);
            }
        }
        for (k, v) in &series.labels {
            if let Some(values) = self.labels.get_mut(k) {
                if let Some(ids) = values.get_mut(v) {
                    ids.remove(id);
                    if ids.is_empty() {
                        values.remove(v);
                    }
                }
                if values.is_empty() {
                    self.labels.remove(k);
                }
            }
        }
        Some(series)
    }

    fn touch(&self, id: SeriesId, now: u64) {
        if let Some(t) = self.touched.get(id as usize) {
            t.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// One past the highest series id given (deleted series included).
    pub fn len(&self) -> usize {
        self.series.len()
    }

    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    /// How many series there are (deleted ones left out).
    pub fn live(&self) -> usize {
        self.ids.len()
    }

    /// A series by id (`None`: never given, or deleted).
    pub fn get(&self, id: SeriesId) -> Option<&Arc<Series>> {
        self.series.get(id as usize)?.as_ref()
    }

    /// Metric names with their series.
    pub fn names(&self) -> &BTreeMap<String, RoaringBitmap> {
        &self.names
    }

    /// The series of a metric name.
    pub fn named(&self, name: &str) -> RoaringBitmap {
        self.names.get(name).cloned().unwrap_or_default()
    }

    /// Label keys, each with its values and their series.
    pub fn labels(&self) -> &BTreeMap<String, BTreeMap<String, RoaringBitmap>> {
        &self.labels
    }

    /// The series having a label with that value.
    pub fn with_label(&self, key: &str, value: &str) -> RoaringBitmap {
        self.labels
            .get(key)
            .and_then(|values| values.get(value))
            .cloned()
            .unwrap_or_default()
    }
}

/// Every tenant's catalog.
#[derive(Default)]
pub(crate) struct Catalogs {
    tenants: Mutex<HashMap<TenantId, Arc<RwLock<SeriesCatalog>>>>,
    /// Registrations of new series, one at a time (ids are given in order).
    registering: Mutex<()>,
}

impl Catalogs {
    fn of(&self, tenant: &TenantId) -> Arc<RwLock<SeriesCatalog>> {
        let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        tenants.entry(tenant.clone()).or_default().clone()
    }

    fn get(&self, tenant: &TenantId) -> Option<Arc<RwLock<SeriesCatalog>>> {
        let tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        tenants.get(tenant).cloned()
    }

    /// A series read from the meta column family at open.
    pub(crate) fn load(
        &self,
        tenant: TenantId,
        id: SeriesId,
        series: Series,
        now: u64,
    ) -> Result<()> {
        let catalog = self.of(&tenant);
        let mut catalog = catalog.write().unwrap_or_else(|e| e.into_inner());
        catalog.insert(id, series, now)
    }
}

/// What a metric scan reads: a time range (inclusive, Unix nanoseconds), the series (all when
/// `None`) and the columns of [`col::ALL`] to return (all when empty; `series` and `time`
/// always come first).
#[derive(Clone, Debug, Default)]
pub struct MetricScan {
    pub from: Option<u64>,
    pub to: Option<u64>,
    pub series: Option<RoaringBitmap>,
    pub columns: Vec<&'static str>,
}

impl MetricScan {
    fn in_range(&self, t: u64) -> bool {
        self.from.is_none_or(|f| t >= f) && self.to.is_none_or(|e| t <= e)
    }

    fn overlaps(&self, meta: &BlockMeta) -> bool {
        self.from.is_none_or(|f| meta.max_start >= f) && self.to.is_none_or(|e| meta.min_start <= e)
    }

    fn covers(&self, meta: &BlockMeta) -> bool {
        self.in_range(meta.min_start) && self.in_range(meta.max_start)
    }

    /// The columns returned, `series` and `time` first.
    pub fn columns(&self) -> Vec<&'static str> {
        let mut out = vec![col::SERIES, col::TIME];
        let asked: &[&'static str] = if self.columns.is_empty() {
            &col::ALL
        } else {
            &self.columns
        };
        for c in asked {
            if !out.contains(c) {
                out.push(c);
            }
        }
        out
    }

    fn matches(&self, p: &MetricPoint) -> bool {
        self.in_range(p.time.0) && self.series.as_ref().is_none_or(|s| s.contains(p.series))
    }
}

impl Store {
    /// A metric block's runs of rows of one series, (series, first row, rows), read once per
    /// block, then kept: blocks are immutable.
    fn series_runs_of(
        &self,
        tenant: &TenantId,
        addr: BlockAddr,
        meta: &BlockMeta,
    ) -> Result<Arc<Vec<(u32, u32, u32)>>> {
        let key = keys::block_key(tenant, Signal::Metrics, keys::META, addr);
        if let Some(runs) = self.series_runs.get(&key) {
            return Ok(runs);
        }
        let ids = self
            .reader_of(tenant, Signal::Metrics, addr, meta)
            .ints(col::SERIES, &Rows::All)?;
        let mut runs: Vec<(u32, u32, u32)> = Vec::new();
        for (row, id) in ids.iter().enumerate() {
            match runs.last_mut() {
                Some(last) if last.0 == *id as u32 => last.2 += 1,
                _ => runs.push((*id as u32, row as u32, 1)),
            }
        }
        let runs = Arc::new(runs);
        self.series_runs.insert(key, 1, runs.clone());
        Ok(runs)
    }

    /// The rows of a metric block holding the given series, from the block's series runs.
    fn rows_of_series(
        &self,
        tenant: &TenantId,
        addr: BlockAddr,
        meta: &BlockMeta,
        series: &RoaringBitmap,
    ) -> Result<RoaringBitmap> {
        let runs = self.series_runs_of(tenant, addr, meta)?;
        let mut out = RoaringBitmap::new();
        let (Some(first), Some(last)) = (runs.first(), runs.last()) else {
            return Ok(out);
        };
        for s in series.range(first.0..=last.0) {
            let i = runs.partition_point(|r| r.0 < s);
            if let Some(&(id, start, len)) = runs.get(i)
                && id == s
            {
                out.insert_range(start..start + len);
            }
        }
        Ok(out)
    }

    /// The ids of series (given in the order of `series`), registering the new ones: they are
    /// written, synced, before this returns, so that a point referring to them is never
    /// durable without them.
    pub fn register_series(&self, tenant: &TenantId, series: &[Series]) -> Result<Vec<SeriesId>> {
        debug_assert!(
            series
                .iter()
                .all(|s| s.labels.windows(2).all(|w| w[0].0 < w[1].0)),
            "series labels must be sorted by key, keys unique"
        );
        let catalog = self.series.of(tenant);
        let identities: Vec<Vec<u8>> = series.iter().map(Series::identity).collect();
        let now = self.opts.clock.now().0;
        let lookup = |c: &SeriesCatalog| -> Vec<Option<SeriesId>> {
            identities
                .iter()
                .map(|i| {
                    let id = c.ids.get(i).copied();
                    id.inspect(|id| c.touch(*id, now))
                })
                .collect()
        };
        let found = lookup(&catalog.read().unwrap_or_else(|e| e.into_inner()));
        if found.iter().all(Option::is_some) {
            return Ok(found.into_iter().flatten().collect());
        }
        let _one_at_a_time = self
            .series
            .registering
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut found = lookup(&catalog.read().unwrap_or_else(|e| e.into_inner()));
        let mut next = catalog.read().unwrap_or_else(|e| e.into_inner()).len() as u64;
        let mut fresh: Vec<(SeriesId, Series)> = Vec::new();
        let mut batch = WriteBatch::default();
        let mut assigned: rustc_hash::FxHashMap<&[u8], SeriesId> = Default::default();
        for (i, s) in series.iter().enumerate() {
            if found[i].is_some() {
                continue;
            }
            if let Some(id) = assigned.get(identities[i].as_slice()) {
                found[i] = Some(*id);
                continue;
            }
            let id = SeriesId::try_from(next).map_err(|_| StorageError::TooManySeries {
                tenant: tenant.to_string(),
            })?;
            next += 1;
            batch.put_cf(
                self.cf(CF_META),
                keys::series(tenant, id),
                crate::codec::encode_series(s),
            );
            assigned.insert(&identities[i], id);
            fresh.push((id, s.clone()));
            found[i] = Some(id);
        }
        self.db.write_opt(batch, &self.sync)?;
        let mut c = catalog.write().unwrap_or_else(|e| e.into_inner());
        for (id, s) in fresh {
            c.insert(id, s, now)?;
        }
        self.stats
            .series_created
            .fetch_add(assigned.len() as u64, Ordering::Relaxed);
        Ok(found.into_iter().flatten().collect())
    }

    /// Deletes the series of a tenant that no block (live, or retired and still read) and no
    /// head row holds a point of, and that no writer has used since `cutoff` (the tenant's
    /// retention cutoff): after retention took their last points, the catalog does not keep
    /// them (nor their names and label values in listings). Returns how many went.
    pub(super) fn forget_series(&self, tenant: &TenantId, cutoff: u64) -> Result<usize> {
        let Some(catalog) = self.series.get(tenant) else {
            return Ok(0);
        };
        let (blocks, head) = {
            let state = self.lock();
            let mut blocks: Vec<(BlockAddr, Arc<BlockMeta>)> = Vec::new();
            let mut head = Vec::new();
            if let Some(t) = state.metrics.get(tenant) {
                blocks.extend(t.blocks.iter().map(|(a, m)| (*a, m.clone())));
                let frozen = t.frozen.iter().flat_map(|f| f.batches.iter());
                head.extend(t.head.batches.iter().chain(frozen).cloned());
            }
            blocks.extend(
                state
                    .retired
                    .iter()
                    .filter(|(t, s, _, _)| t == tenant && *s == Signal::Metrics)
                    .map(|(_, _, a, m)| (*a, m.clone())),
            );
            (blocks, head)
        };
        let mut held = RoaringBitmap::new();
        for batch in &head {
            held.extend(batch.rows()?.iter().map(|p| p.series));
        }
        for (addr, meta) in &blocks {
            held.extend(
                self.series_runs_of(tenant, *addr, meta)?
                    .iter()
                    .map(|r| r.0),
            );
        }
        let _no_registration = self
            .series
            .registering
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut c = catalog.write().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<SeriesId> = (0..c.len() as SeriesId)
            .filter(|id| {
                c.get(*id).is_some()
                    && !held.contains(*id)
                    && c.touched[*id as usize].load(Ordering::Relaxed) < cutoff
            })
            .collect();
        if gone.is_empty() {
            return Ok(0);
        }
        let mut batch = WriteBatch::default();
        for id in &gone {
            batch.delete_cf(self.cf(CF_META), keys::series(tenant, *id));
        }
        self.db.write_opt(batch, &self.sync)?;
        for id in &gone {
            c.remove(*id);
        }
        self.stats
            .series_deleted
            .fetch_add(gone.len() as u64, Ordering::Relaxed);
        Ok(gone.len())
    }

    /// A tenant's series catalog (`None`: the tenant has no series).
    pub fn series_catalog(&self, tenant: &TenantId) -> Option<Arc<RwLock<SeriesCatalog>>> {
        self.series.get(tenant)
    }

    /// [`Self::append`] for metric points of registered series (a point of a series at an
    /// instant already held is a retry and is stored once).
    pub fn append_points(
        &self,
        tenant: &TenantId,
        points: Vec<MetricPoint>,
    ) -> Result<AppendOutcome> {
        self.append_rows(tenant, points, |_| {})
    }

    /// [`Self::snapshot`] of a tenant's metric points.
    pub fn metric_snapshot(&self, tenant: &TenantId) -> Result<Snapshot<MetricPoint>> {
        self.snapshot_of(tenant)
    }

    /// The points of a snapshot that a scan asks for, one batch per block (and one for the
    /// head), each sorted by series and time, with the scan's columns under their block names.
    pub fn scan_metrics(
        &self,
        tenant: &TenantId,
        snapshot: &Snapshot<MetricPoint>,
        scan: &MetricScan,
    ) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for (addr, meta) in snapshot.blocks.iter() {
            if let Some(batch) = self.block_metric_columns(tenant, snapshot, *addr, meta, scan)? {
                out.push(batch);
            }
        }
        if let Some(head) = self.head_metric_columns(snapshot, scan)? {
            out.push(head);
        }
        Ok(out)
    }

    /// The head rows of a snapshot that a scan asks for, as one batch.
    pub fn head_metric_columns(
        &self,
        snapshot: &Snapshot<MetricPoint>,
        scan: &MetricScan,
    ) -> Result<Option<RecordBatch>> {
        let mut head: Vec<&MetricPoint> =
            snapshot.head.rows().filter(|p| scan.matches(p)).collect();
        if head.is_empty() {
            return Ok(None);
        }
        metrics::sort(&mut head);
        head.dedup_by_key(|p| (p.series, p.time));
        let columns = scan.columns();
        let mut builders = MetricColumns::with_capacity(head.len());
        head.iter().for_each(|p| builders.push(p));
        let mut arrays: Vec<(&str, ArrayRef)> = builders
            .finish()
            .into_iter()
            .filter(|(name, _, _)| columns.contains(name))
            .map(|(name, array, _)| (name, array))
            .collect();
        arrays.sort_by_key(|(name, _)| columns.iter().position(|c| c == name));
        batch(&columns, arrays.into_iter().map(|(_, a)| a).collect()).map(Some)
    }

    /// The scan's columns of the rows of one block that it reads; `None` when none.
    pub fn block_metric_columns(
        &self,
        tenant: &TenantId,
        snapshot: &Snapshot<MetricPoint>,
        addr: BlockAddr,
        meta: &BlockMeta,
        scan: &MetricScan,
    ) -> Result<Option<RecordBatch>> {
        if !scan.overlaps(meta) {
            return Ok(None);
        }
        let reader = self.reader_of(tenant, Signal::Metrics, addr, meta);
        let mut rows: Option<RoaringBitmap> = None;
        if let Some(series) = &scan.series {
            rows = Some(self.rows_of_series(tenant, addr, meta, series)?);
        }
        if !scan.covers(meta) || snapshot.straddles(meta) {
            let cutoff = snapshot.cutoff.map_or(0, |c| c.0);
            let within = rows.clone().map_or(Rows::All, Rows::Set);
            let times = reader.ints(col::TIME, &within)?;
            let candidates: Vec<u32> = match &within {
                Rows::Set(s) => s.iter().collect(),
                _ => (0..meta.rows).collect(),
            };
            rows = Some(
                candidates
                    .into_iter()
                    .zip(times.iter())
                    .filter(|(_, t)| **t as u64 >= cutoff && scan.in_range(**t as u64))
                    .map(|(r, _)| r)
                    .collect(),
            );
        }
        let rows = match rows {
            None => Rows::All,
            Some(r) if r.is_empty() => return Ok(None),
            Some(r) if r.len() == u64::from(meta.rows) => Rows::All,
            Some(r) => Rows::Set(r),
        };
        let columns = scan.columns();
        let arrays = columns
            .iter()
            .map(|c| reader.required(c, &rows))
            .collect::<Result<Vec<_>>>()?;
        batch(&columns, arrays).map(Some)
    }

    /// The (series, time, start time, value) of the number points (gauges and sums) of some
    /// series in a time range, sorted by series and time, each (series, time) once. Blocks
    /// are read through their decoded points ([`DecodedPoints`], cached), each series' rows
    /// found by its run and narrowed to the range by binary search.
    pub fn metric_values(
        &self,
        tenant: &TenantId,
        snapshot: &Snapshot<MetricPoint>,
        from: Option<u64>,
        to: Option<u64>,
        series: &RoaringBitmap,
    ) -> Result<Vec<(SeriesId, u64, u64, f64)>> {
        // what blocks and head points are in range and of the series
        let scan = MetricScan {
            from,
            to,
            series: Some(series.clone()),
            columns: Vec::new(),
        };
        let mut out = Vec::new();
        for (addr, meta) in snapshot.blocks.iter() {
            if scan.overlaps(meta) {
                let points = self.decoded_points(tenant, *addr, meta)?;
                points.values_into(series, from, to, &mut out);
            }
        }
        // head points as they are (the sort below orders them with the blocks')
        for p in snapshot.head.rows().filter(|p| scan.matches(p)) {
            if let PointValue::Number(v) = p.value {
                out.push((p.series, p.time.0, p.start_time.0, v));
            }
        }
        let cutoff = snapshot.cutoff.map_or(0, |c| c.0);
        out.retain(|p| p.1 >= cutoff);
        if !out.is_sorted_by(|a, b| (a.0, a.1) < (b.0, b.1)) {
            out.sort_by_key(|p| (p.0, p.1));
            out.dedup_by_key(|p| (p.0, p.1));
        }
        Ok(out)
    }

    /// A metric block's points decoded whole, read once per block while the cache keeps them.
    fn decoded_points(
        &self,
        tenant: &TenantId,
        addr: BlockAddr,
        meta: &BlockMeta,
    ) -> Result<Arc<DecodedPoints>> {
        let key = keys::block_key(tenant, Signal::Metrics, keys::META, addr);
        if let Some(points) = self.metric_points.get(&key) {
            return Ok(points);
        }
        let runs = self.series_runs_of(tenant, addr, meta)?;
        let reader = self.reader_of(tenant, Signal::Metrics, addr, meta);
        let times = reader.ints(col::TIME, &Rows::All)?;
        let starts = reader.ints(col::START_TIME, &Rows::All)?;
        let values = reader
            .required(col::VALUE, &Rows::All)?
            .as_any()
            .downcast_ref::<arrow::array::Float64Array>()
            .cloned()
            .ok_or_else(|| StorageError::corrupt("metric block", "value column type"))?;
        let rows = meta.rows as usize;
        if times.len() != rows || starts.len() != rows || values.len() != rows {
            return Err(StorageError::corrupt(
                "metric block",
                format!("{rows} rows but columns of other lengths"),
            ));
        }
        let points = Arc::new(DecodedPoints {
            runs,
            times,
            starts,
            values,
        });
        self.metric_points
            .insert(key, points.weight(), points.clone());
        Ok(points)
    }

    /// Whole points of a snapshot in a time range, of the given series (all when `None`),
    /// sorted by series and time, each (series, time) once.
    pub fn metric_points(
        &self,
        tenant: &TenantId,
        snapshot: &Snapshot<MetricPoint>,
        from: Option<u64>,
        to: Option<u64>,
        series: Option<&RoaringBitmap>,
    ) -> Result<Vec<MetricPoint>> {
        let scan = MetricScan {
            from,
            to,
            series: series.cloned(),
            columns: Vec::new(),
        };
        let mut out: Vec<MetricPoint> = snapshot
            .head
            .rows()
            .filter(|p| scan.matches(p))
            .cloned()
            .collect();
        for (addr, meta) in snapshot.blocks.iter() {
            if !scan.overlaps(meta) {
                continue;
            }
            let reader = self.reader_of(tenant, Signal::Metrics, *addr, meta);
            let rows = match series {
                Some(s) => Rows::Set(self.rows_of_series(tenant, *addr, meta, s)?),
                None => Rows::All,
            };
            if matches!(&rows, Rows::Set(s) if s.is_empty()) {
                continue;
            }
            out.extend(
                metrics::read(&reader, &rows)?
                    .into_iter()
                    .filter(|p| scan.matches(p)),
            );
        }
        let cutoff = snapshot.cutoff.map_or(0, |c| c.0);
        out.retain(|p| p.time.0 >= cutoff);
        out.sort_by_key(|p| (p.series, p.time));
        out.dedup_by_key(|p| (p.series, p.time));
        Ok(out)
    }
}

fn batch(columns: &[&'static str], arrays: Vec<ArrayRef>) -> Result<RecordBatch> {
    RecordBatch::try_from_iter(columns.iter().copied().zip(arrays))
        .map_err(|e| StorageError::corrupt("metric columns", e.to_string()))
}
