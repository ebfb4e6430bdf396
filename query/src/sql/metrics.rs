//! The `metrics` table: a tenant's metric points as of one snapshot, one row per point, with
//! its series' name, type, unit and labels (as a map and as one column per label key).
//!
//! Filters on `time` narrow the points read; equalities and `IN` lists on `metric` and on label
//! columns resolve to series through the catalog's postings before any block is read, and a
//! block is then read only at those series' rows. Every pushed filter is also applied by
//! DataFusion (inexact push-down): the store only narrows what is read.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, RwLock};

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BooleanBuilder, Float64Array, Float64Builder,
    Int64Array, Int64Builder, ListArray, ListBuilder, RecordBatch, RecordBatchOptions,
    StringBuilder, TimestampNanosecondArray,
};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Between, BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::scalar::ScalarValue;
use roaring::RoaringBitmap;
use weft_storage::Store;
use weft_storage::model::{KeyValue, MetricPoint, PointValue, Series, TenantId, Value};
use weft_storage::scan::decode;
use weft_storage::scan::metrics::{col, sources};
use weft_storage::store::{MetricScan, SeriesCatalog, Snapshot};

use super::columns::{downcast, map_column, map_type, storage_err, timestamp_type};
use super::pushdown::{column_of, flip, literal, nanos, or_equalities, text};

/// The fixed columns, each with its type and nullability.
const FIXED: &[(&str, Kind)] = &[
    ("time", Kind::Time),
    ("start_time", Kind::StartTime),
    ("metric", Kind::Text),
    ("type", Kind::Text),
    ("unit", Kind::Text),
    ("temporality", Kind::Text),
    ("monotonic", Kind::Bool),
    ("description", Kind::Text),
    ("series_id", Kind::Int),
    ("value", Kind::Float),
    ("count", Kind::Int),
    ("sum", Kind::Float),
    ("min", Kind::Float),
    ("max", Kind::Float),
    ("bucket_bounds", Kind::Floats),
    ("bucket_counts", Kind::Ints),
    ("quantiles", Kind::Floats),
    ("quantile_values", Kind::Floats),
    ("flags", Kind::Int),
    ("exemplar_trace_id", Kind::Text),
    ("exemplar_span_id", Kind::Text),
    ("exemplar_value", Kind::Float),
    ("labels", Kind::Map),
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Time,
    StartTime,
    Text,
    Bool,
    Int,
    Float,
    Floats,
    Ints,
    Map,
    /// A label's value (NULL where the series has no such label).
    Label,
}

fn data_type(kind: Kind) -> (DataType, bool) {
    match kind {
        Kind::Time => (timestamp_type(), false),
        Kind::StartTime => (timestamp_type(), true),
        Kind::Text | Kind::Label => (DataType::Utf8, true),
        Kind::Bool => (DataType::Boolean, false),
        Kind::Int => (DataType::Int64, true),
        Kind::Float => (DataType::Float64, true),
        Kind::Floats => (floats_type(), true),
        Kind::Ints => (ints_type(), true),
        Kind::Map => (map_type(), false),
    }
}

fn floats_type() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Float64, true)))
}

fn ints_type() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Int64, true)))
}

pub struct MetricsTable {
    store: Arc<Store>,
    tenant: TenantId,
    snapshot: Snapshot<MetricPoint>,
    catalog: Arc<RwLock<SeriesCatalog>>,
    /// Every column (fixed, then one per label key), with its kind.
    columns: Vec<(String, Kind)>,
    schema: SchemaRef,
}

impl fmt::Debug for MetricsTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsTable")
            .field("tenant", &self.tenant)
            .field("blocks", &self.snapshot.blocks.len())
            .finish()
    }
}

impl MetricsTable {
    pub fn new(store: Arc<Store>, tenant: TenantId) -> weft_storage::Result<Self> {
        let snapshot = store.metric_snapshot(&tenant)?;
        let catalog = store.series_catalog(&tenant).unwrap_or_default();
        let mut columns: Vec<(String, Kind)> =
            FIXED.iter().map(|(n, k)| (n.to_string(), *k)).collect();
        {
            let c = catalog.read().unwrap_or_else(|e| e.into_inner());
            // a label named like a fixed column stays in the `labels` map only
            for key in c.labels().keys() {
                if !FIXED.iter().any(|(n, _)| n == key) {
                    columns.push((key.clone(), Kind::Label));
                }
            }
        }
        let schema = Arc::new(Schema::new(
            columns
                .iter()
                .map(|(name, kind)| {
                    let (t, nullable) = data_type(*kind);
                    Field::new(name, t, nullable)
                })
                .collect::<Vec<_>>(),
        ));
        Ok(Self {
            store,
            tenant,
            snapshot,
            catalog,
            columns,
            schema,
        })
    }

    fn is_label(&self, column: &str) -> bool {
        self.columns
            .iter()
            .any(|(n, k)| n == column && *k == Kind::Label)
    }

    /// What the filters let the store skip; `pushed` is whether each filter narrowed it.
    fn scan_of(&self, filters: &[&Expr]) -> (MetricScan, Vec<bool>) {
        let c = self.catalog.read().unwrap_or_else(|e| e.into_inner());
        let mut scan = MetricScan::default();
        let pushed = filters
            .iter()
            .map(|f| self.narrow(&c, &mut scan, f))
            .collect();
        (scan, pushed)
    }

    fn narrow(&self, c: &SeriesCatalog, scan: &mut MetricScan, e: &Expr) -> bool {
        match e {
            Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::And,
                right,
            }) => {
                let l = self.narrow(c, scan, left);
                self.narrow(c, scan, right) || l
            }
            Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
                if let Some((column, values)) = or_equalities(e) {
                    return self.series_in(c, scan, column, values.into_iter());
                }
                match (
                    column_of(left),
                    literal(right),
                    literal(left),
                    column_of(right),
                ) {
                    (Some(col), Some(v), _, _) => self.compare(c, scan, col, *op, v),
                    (_, _, Some(v), Some(col)) => self.compare(c, scan, col, flip(*op), v),
                    _ => false,
                }
            }
            Expr::Between(Between {
                expr,
                negated: false,
                low,
                high,
            }) => match (column_of(expr), literal(low), literal(high)) {
                (Some(col), Some(lo), Some(hi)) => {
                    let a = self.compare(c, scan, col, Operator::GtEq, lo);
                    self.compare(c, scan, col, Operator::LtEq, hi) || a
                }
                _ => false,
            },
            Expr::InList(list) if !list.negated => {
                self.series_in(c, scan, &list.expr, list.list.iter())
            }
            _ => false,
        }
    }

    /// Narrows the series to those whose `column` is one of `values`.
    fn series_in<'e>(
        &self,
        c: &SeriesCatalog,
        scan: &mut MetricScan,
        column: &Expr,
        values: impl Iterator<Item = &'e Expr>,
    ) -> bool {
        let Some(column) = column_of(column) else {
            return false;
        };
        if column != "metric" && !self.is_label(column) {
            return false;
        }
        let mut set = RoaringBitmap::new();
        for v in values {
            let Some(v) = literal(v).and_then(text) else {
                return false;
            };
            set |= match column {
                "metric" => c.named(&v),
                label => c.with_label(label, &v),
            };
        }
        restrict(scan, set);
        true
    }

    fn compare(
        &self,
        c: &SeriesCatalog,
        scan: &mut MetricScan,
        column: &str,
        op: Operator,
        v: &ScalarValue,
    ) -> bool {
        if column == "time" {
            let Some(t) = nanos(v).map(|n| n.max(0) as u64) else {
                return false;
            };
            match op {
                Operator::Gt | Operator::GtEq => {
                    scan.from = Some(scan.from.map_or(t, |f| f.max(t)))
                }
                Operator::Lt | Operator::LtEq => scan.to = Some(scan.to.map_or(t, |e| e.min(t))),
                Operator::Eq => {
                    scan.from = Some(scan.from.map_or(t, |f| f.max(t)));
                    scan.to = Some(scan.to.map_or(t, |e| e.min(t)));
                }
                _ => return false,
            }
            return true;
        }
        if op != Operator::Eq {
            return false;
        }
        let Some(term) = text(v) else {
            return false;
        };
        let set = match column {
            "metric" => c.named(&term),
            "series_id" => match term.parse::<u32>() {
                Ok(id) => [id].into_iter().collect(),
                Err(_) => return false,
            },
            label if self.is_label(label) => c.with_label(label, &term),
            _ => return false,
        };
        restrict(scan, set);
        true
    }
}

fn restrict(scan: &mut MetricScan, set: RoaringBitmap) {
    scan.series = Some(match scan.series.take() {
        Some(s) => s & set,
        None => set,
    });
}

#[async_trait]
impl TableProvider for MetricsTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
    fn table_type(&self) -> TableType {
        TableType::Base
    }
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        let (_, pushed) = self.scan_of(filters);
        Ok(pushed
            .into_iter()
            .map(|p| match p {
                true => TableProviderFilterPushDown::Inexact,
                false => TableProviderFilterPushDown::Unsupported,
            })
            .collect())
    }
    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let wanted: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..self.columns.len()).collect(),
        };
        let (mut scan, _) = self.scan_of(&filters.iter().collect::<Vec<_>>());
        let mut stored = BTreeSet::new();
        for i in &wanted {
            let (name, _) = &self.columns[*i];
            stored.extend(sources(name).iter().copied());
        }
        scan.columns = stored.into_iter().collect();
        let (store, tenant, snapshot) = (
            self.store.clone(),
            self.tenant.clone(),
            self.snapshot.clone(),
        );
        let read = tokio::task::spawn_blocking(move || {
            store
                .scan_metrics(&tenant, &snapshot, &scan)
                .map_err(|e| DataFusionError::External(Box::new(e)))
        })
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))??;
        let projected = Arc::new(self.schema.project(&wanted)?);
        let catalog = self.catalog.read().unwrap_or_else(|e| e.into_inner());
        let batches = read
            .iter()
            .map(|b| self.to_sql(&catalog, b, &wanted, &projected))
            .collect::<Result<Vec<_>>>()?;
        Ok(MemorySourceConfig::try_new_exec(
            &[batches],
            projected,
            None,
        )?)
    }
}

impl MetricsTable {
    /// A stored batch as the table's projected columns.
    fn to_sql(
        &self,
        catalog: &SeriesCatalog,
        stored: &RecordBatch,
        wanted: &[usize],
        schema: &SchemaRef,
    ) -> Result<RecordBatch> {
        let get = |name: &str| -> Result<&ArrayRef> {
            stored
                .column_by_name(name)
                .ok_or_else(|| DataFusionError::Internal(format!("metric column {name} not read")))
        };
        let n = stored.num_rows();
        let ids = get(col::SERIES)?.as_primitive::<Int64Type>();
        // the rows' series, each run looked up once
        let mut series: Vec<Arc<Series>> = Vec::with_capacity(n);
        let mut last: Option<(i64, Arc<Series>)> = None;
        for i in 0..n {
            let id = ids.value(i);
            if last.as_ref().is_none_or(|(l, _)| *l != id) {
                let s = catalog.get(id as u32).cloned().ok_or_else(|| {
                    DataFusionError::Internal(format!("metric series {id} is not in the catalog"))
                })?;
                last = Some((id, s));
            }
            series.push(last.as_ref().expect("set above").1.clone());
        }
        let details = || -> Result<Vec<Option<PointValue>>> {
            let a = downcast::<BinaryArray>(get(col::DETAIL)?, "metric")?;
            (0..n)
                .map(|i| {
                    a.is_valid(i)
                        .then(|| decode::point_value(a.value(i)))
                        .transpose()
                        .map_err(storage_err)
                })
                .collect()
        };
        let first_exemplars = || -> Result<Vec<Option<weft_storage::model::Exemplar>>> {
            let a = downcast::<BinaryArray>(get(col::EXEMPLARS)?, "metric")?;
            (0..n)
                .map(|i| {
                    Ok(match a.is_valid(i) {
                        true => decode::exemplars(a.value(i))
                            .map_err(storage_err)?
                            .into_iter()
                            .next(),
                        false => None,
                    })
                })
                .collect()
        };
        let texts = |f: &dyn Fn(&Series) -> Option<String>| -> ArrayRef {
            let mut b = StringBuilder::with_capacity(n, n * 8);
            series.iter().for_each(|s| b.append_option(f(s)));
            Arc::new(b.finish())
        };
        let mut columns = Vec::with_capacity(wanted.len());
        for i in wanted {
            let (name, kind) = &self.columns[*i];
            let array: ArrayRef = match (name.as_str(), *kind) {
                (_, Kind::Label) => texts(&|s| s.label(name).map(str::to_owned)),
                ("time", _) => {
                    let values = get(col::TIME)?.as_primitive::<Int64Type>().values().clone();
                    Arc::new(TimestampNanosecondArray::new(values, None).with_timezone("UTC"))
                }
                ("start_time", _) => {
                    let a = get(col::START_TIME)?.as_primitive::<Int64Type>();
                    let values: TimestampNanosecondArray =
                        a.iter().map(|v| v.filter(|t| *t != 0)).collect();
                    Arc::new(values.with_timezone("UTC"))
                }
                ("metric", _) => texts(&|s| Some(s.name.clone())),
                ("type", _) => texts(&|s| Some(s.kind.as_str().to_owned())),
                ("unit", _) => texts(&|s| Some(s.unit.clone())),
                ("temporality", _) => texts(&|s| Some(s.temporality.as_str().to_owned())),
                ("description", _) => texts(&|s| Some(s.description.clone())),
                ("monotonic", _) => {
                    let mut b = BooleanBuilder::with_capacity(n);
                    series.iter().for_each(|s| b.append_value(s.monotonic));
                    Arc::new(b.finish())
                }
                ("series_id", _) => Arc::new(Int64Array::from(ids.values().to_vec())),
                ("value", _) => get(col::VALUE)?.clone(),
                ("count", _) => get(col::COUNT)?.clone(),
                ("sum", _) => get(col::SUM)?.clone(),
                ("min", _) => get(col::MIN)?.clone(),
                ("max", _) => get(col::MAX)?.clone(),
                ("flags", _) => get(col::FLAGS)?.clone(),
                ("bucket_bounds", _) => {
                    let stored = cast(get(col::BOUNDS)?, &floats_type())?;
                    let stored = downcast::<ListArray>(&stored, "metric")?;
                    let details = details()?;
                    let mut b = ListBuilder::new(Float64Builder::new());
                    for (i, d) in details.iter().enumerate() {
                        if stored.is_valid(i) {
                            let v = stored.value(i);
                            b.values()
                                .append_slice(downcast::<Float64Array>(&v, "metric")?.values());
                            b.append(true);
                        } else if let Some((bounds, _)) = d.as_ref().and_then(PointValue::buckets) {
                            b.values().append_slice(&bounds);
                            b.append(true);
                        } else {
                            b.append(false);
                        }
                    }
                    Arc::new(b.finish())
                }
                ("bucket_counts", _) => {
                    let stored = cast(get(col::COUNTS)?, &ints_type())?;
                    let stored = downcast::<ListArray>(&stored, "metric")?;
                    let details = details()?;
                    let mut b = ListBuilder::new(Int64Builder::new());
                    for (i, d) in details.iter().enumerate() {
                        if stored.is_valid(i) {
                            let v = stored.value(i);
                            b.values()
                                .append_slice(downcast::<Int64Array>(&v, "metric")?.values());
                            b.append(true);
                        } else if let Some((_, counts)) = d.as_ref().and_then(PointValue::buckets) {
                            counts
                                .iter()
                                .for_each(|c| b.values().append_value(*c as i64));
                            b.append(true);
                        } else {
                            b.append(false);
                        }
                    }
                    Arc::new(b.finish())
                }
                ("quantiles" | "quantile_values", _) => {
                    let values = name == "quantile_values";
                    let mut b = ListBuilder::new(Float64Builder::new());
                    for d in details()? {
                        match d {
                            Some(PointValue::Summary { quantiles, .. }) => {
                                for (q, v) in quantiles {
                                    b.values().append_value(if values { v } else { q });
                                }
                                b.append(true);
                            }
                            _ => b.append(false),
                        }
                    }
                    Arc::new(b.finish())
                }
                ("exemplar_trace_id" | "exemplar_span_id", _) => {
                    let trace = name == "exemplar_trace_id";
                    let mut b = StringBuilder::new();
                    for e in first_exemplars()? {
                        b.append_option(e.and_then(|e| match trace {
                            true => e.trace_id.map(|t| t.to_hex()),
                            false => e.span_id.map(|s| s.to_hex()),
                        }));
                    }
                    Arc::new(b.finish())
                }
                ("exemplar_value", _) => {
                    let mut b = Float64Builder::new();
                    for e in first_exemplars()? {
                        b.append_option(e.map(|e| e.value));
                    }
                    Arc::new(b.finish())
                }
                ("labels", _) => {
                    // each run of one series' rows shares one decoded label list
                    let mut lists: Vec<Arc<Vec<KeyValue>>> = Vec::with_capacity(n);
                    for (i, s) in series.iter().enumerate() {
                        if i > 0 && Arc::ptr_eq(s, &series[i - 1]) {
                            lists.push(lists[i - 1].clone());
                            continue;
                        }
                        lists.push(Arc::new(
                            s.labels
                                .iter()
                                .map(|(k, v)| KeyValue::new(k.clone(), Value::Str(v.clone())))
                                .collect(),
                        ));
                    }
                    map_column(lists.iter().map(|l| l.as_slice())).map_err(storage_err)?
                }
                (other, _) => {
                    return Err(DataFusionError::Internal(format!(
                        "metrics column {other} has no reader"
                    )));
                }
            };
            columns.push(array);
        }
        let options = RecordBatchOptions::new().with_row_count(Some(n));
        Ok(RecordBatch::try_new_with_options(
            schema.clone(),
            columns,
            &options,
        )?)
    }
}
