//! The `logs` table: a tenant's log records as of one snapshot, read through the store's log
//! scan with the projection, the time range on `time` and the postings terms (service,
//! severity text, event name) pushed down. Every pushed filter is also applied by DataFusion
//! (inexact push-down): the store only narrows what is read.

use std::fmt;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, FixedSizeBinaryArray, RecordBatch, StringBuilder,
    TimestampNanosecondArray,
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
use weft_storage::Store;
use weft_storage::model::{KeyValue, LogRecord, TenantId};
use weft_storage::scan::decode;
use weft_storage::scan::logs::{COLUMNS, INDEXED, col};
use weft_storage::store::{BodyTest, LogScan, Snapshot};

use super::columns::{
    downcast, hex_column, list_type, map_column, map_type, storage_err, timestamp_type,
};
use super::pushdown::{column_of, flip, literal, nanos, text};
use crate::logs::TextQuery;

fn schema() -> SchemaRef {
    let ty = |name: &str| match name {
        "time" | "observed_time" => (timestamp_type(), false),
        "severity_number" => (DataType::Int32, false),
        "flags" => (DataType::Int64, false),
        "body" | "trace_id" | "span_id" | "llm.model" | "llm.model_version" | "worker.id"
        | "gpu.id" => (DataType::Utf8, true),
        "llm.generation_step" | "gen_ai.usage.output_tokens" => (DataType::Int64, true),
        "llm.kv_cache.hit_rate" | "llm.prefill_ms" | "llm.decode_ms" | "llm.tokens_per_s" => {
            (DataType::Float64, true)
        }
        "gen_ai.response.finish_reasons" => (list_type(), true),
        "attributes" | "resource_attributes" => (map_type(), false),
        _ => (DataType::Utf8, false),
    };
    Arc::new(Schema::new(
        COLUMNS
            .iter()
            .map(|(name, _)| {
                let (t, nullable) = ty(name);
                Field::new(*name, t, nullable)
            })
            .collect::<Vec<_>>(),
    ))
}

pub struct LogsTable {
    store: Arc<Store>,
    tenant: TenantId,
    snapshot: Snapshot<LogRecord>,
    schema: SchemaRef,
}

impl fmt::Debug for LogsTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogsTable")
            .field("tenant", &self.tenant)
            .field("blocks", &self.snapshot.blocks.len())
            .finish()
    }
}

impl LogsTable {
    pub fn new(store: Arc<Store>, tenant: TenantId) -> weft_storage::Result<Self> {
        let snapshot = store.log_snapshot(&tenant)?;
        Ok(Self {
            store,
            tenant,
            snapshot,
            schema: schema(),
        })
    }
}

/// What the filters let the store skip.
fn scan_of(filters: &[Expr]) -> LogScan {
    let mut scan = LogScan::default();
    for f in filters {
        narrow(&mut scan, f);
    }
    scan
}

/// How a filter is pushed: a text query and a time comparison with a timestamp literal are
/// applied by the scan to every row it returns (exact), so that DataFusion need not read the
/// body or the time again (`count(*)` under `matches()` alone reads no row of an indexed
/// block); postings terms only narrow what is read.
fn pushdown(e: &Expr) -> TableProviderFilterPushDown {
    if text_query(e).is_some() || exact_time(e) {
        TableProviderFilterPushDown::Exact
    } else if narrow(&mut LogScan::default(), e) {
        TableProviderFilterPushDown::Inexact
    } else {
        TableProviderFilterPushDown::Unsupported
    }
}

/// Whether a filter compares the `time` column (not a cast of it) with timestamp literals
/// after the epoch, which [`compare`] turns into an inclusive range exactly.
fn exact_time(e: &Expr) -> bool {
    let stamp = |v: &Expr| {
        literal(v).is_some_and(|v| {
            matches!(
                v,
                ScalarValue::TimestampNanosecond(..)
                    | ScalarValue::TimestampMicrosecond(..)
                    | ScalarValue::TimestampMillisecond(..)
                    | ScalarValue::TimestampSecond(..)
            ) && nanos(v).is_some_and(|n| n >= 1)
        })
    };
    // the column itself: a cast (to seconds, say) would compare other values
    let time = |c: &Expr| matches!(c, Expr::Column(col) if col.name == "time");
    match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            matches!(
                op,
                Operator::Gt | Operator::GtEq | Operator::Lt | Operator::LtEq | Operator::Eq
            ) && ((time(left) && stamp(right)) || (stamp(left) && time(right)))
        }
        Expr::Between(Between {
            expr,
            negated: false,
            low,
            high,
        }) => time(expr) && stamp(low) && stamp(high),
        _ => false,
    }
}

/// `matches(body, '…')` as the text query it runs (body-only queries; the function refuses
/// others).
fn text_query(e: &Expr) -> Option<TextQuery> {
    let Expr::ScalarFunction(f) = e else {
        return None;
    };
    if f.name() != "matches" || f.args.len() != 2 || column_of(&f.args[0]) != Some("body") {
        return None;
    }
    let q = literal(&f.args[1]).and_then(text)?;
    TextQuery::parse(&q).ok().filter(TextQuery::body_only)
}

/// The text queries among a scan's filters (and their conjuncts), as one.
fn text_queries(filters: &[Expr]) -> Option<TextQuery> {
    fn walk(e: &Expr, out: &mut Vec<TextQuery>) {
        if let Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::And,
            right,
        }) = e
        {
            walk(left, out);
            walk(right, out);
        } else if let Some(q) = text_query(e) {
            out.push(q);
        }
    }
    let mut all = Vec::new();
    for f in filters {
        walk(f, &mut all);
    }
    match all.len() {
        0 => None,
        1 => all.pop(),
        _ => Some(TextQuery::And(all)),
    }
}

/// Narrows the scan by one conjunct; whether it could.
fn narrow(scan: &mut LogScan, e: &Expr) -> bool {
    match e {
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::And,
            right,
        }) => {
            let l = narrow(scan, left);
            narrow(scan, right) || l
        }
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            match (
                column_of(left),
                literal(right),
                literal(left),
                column_of(right),
            ) {
                (Some(c), Some(v), _, _) => compare(scan, c, *op, v),
                (_, _, Some(v), Some(c)) => compare(scan, c, flip(*op), v),
                _ => false,
            }
        }
        Expr::Between(Between {
            expr,
            negated: false,
            low,
            high,
        }) => match (column_of(expr), literal(low), literal(high)) {
            (Some(c), Some(lo), Some(hi)) => {
                let a = compare(scan, c, Operator::GtEq, lo);
                compare(scan, c, Operator::LtEq, hi) || a
            }
            _ => false,
        },
        Expr::InList(list) if !list.negated => {
            let Some(d) = column_of(&list.expr).and_then(dimension) else {
                return false;
            };
            let terms: Option<Vec<String>> = list
                .list
                .iter()
                .map(|e| literal(e).and_then(text))
                .collect();
            terms.is_some_and(|terms| {
                scan.terms.push((d, terms));
                true
            })
        }
        _ => false,
    }
}

fn dimension(column: &str) -> Option<&'static str> {
    INDEXED.iter().find(|(c, _)| *c == column).map(|(_, d)| *d)
}

fn compare(scan: &mut LogScan, c: &str, op: Operator, v: &ScalarValue) -> bool {
    if c == "time" {
        let Some(t) = nanos(v).map(|n| n.max(0) as u64) else {
            return false;
        };
        match op {
            Operator::Gt | Operator::GtEq => {
                let t = if op == Operator::Gt { t + 1 } else { t };
                scan.from = Some(scan.from.map_or(t, |f| f.max(t)))
            }
            Operator::Lt | Operator::LtEq => {
                let t = if op == Operator::Lt {
                    t.saturating_sub(1)
                } else {
                    t
                };
                scan.to = Some(scan.to.map_or(t, |e| e.min(t)))
            }
            Operator::Eq => {
                scan.from = Some(scan.from.map_or(t, |f| f.max(t)));
                scan.to = Some(scan.to.map_or(t, |e| e.min(t)));
            }
            _ => return false,
        }
        return true;
    }
    match (dimension(c), op, text(v)) {
        (Some(d), Operator::Eq, Some(term)) => {
            scan.terms.push((d, vec![term]));
            true
        }
        _ => false,
    }
}

#[async_trait]
impl TableProvider for LogsTable {
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
        Ok(filters.iter().map(|f| pushdown(f)).collect())
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
            None => (0..COLUMNS.len()).collect(),
        };
        let mut scan = scan_of(filters);
        // nothing projected (`count(*)`): row counts only
        scan.rows_only = wanted.is_empty();
        scan.columns = vec![col::TIME];
        for i in &wanted {
            if !scan.columns.contains(&COLUMNS[*i].1) {
                scan.columns.push(COLUMNS[*i].1);
            }
        }
        let (store, tenant, snapshot) = (
            self.store.clone(),
            self.tenant.clone(),
            self.snapshot.clone(),
        );
        let text = text_queries(filters);
        let stored = tokio::task::spawn_blocking(move || {
            // rows of indexed blocks the text index does not match are not read, and the
            // scan applies the query to the rest (the filter is exact)
            if let Some(q) = text {
                scan.text = crate::logs::text_hits(&store, &tenant, &snapshot, &scan, &q)
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
                scan.body = Some(BodyTest(Arc::new(move |b| q.matches_body(b))));
            }
            store
                .scan_logs(&tenant, &snapshot, &scan)
                .map_err(|e| DataFusionError::External(Box::new(e)))
        })
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))??;
        let projected = Arc::new(self.schema.project(&wanted)?);
        let batches = stored
            .iter()
            .map(|b| to_sql(b, &wanted, &projected))
            .collect::<Result<Vec<_>>>()?;
        Ok(MemorySourceConfig::try_new_exec(
            &[batches],
            projected,
            None,
        )?)
    }
}

/// A stored batch as the table's projected columns.
fn to_sql(stored: &RecordBatch, wanted: &[usize], schema: &SchemaRef) -> Result<RecordBatch> {
    let get = |name: &str| -> Result<&ArrayRef> {
        stored
            .column_by_name(name)
            .ok_or_else(|| DataFusionError::Internal(format!("log column {name} not read")))
    };
    let mut columns = Vec::with_capacity(wanted.len());
    for i in wanted {
        let (name, source) = COLUMNS[*i];
        let a = get(source)?;
        columns.push(match name {
            "time" | "observed_time" => {
                let values = a.as_primitive::<Int64Type>().values().clone();
                Arc::new(TimestampNanosecondArray::new(values, None).with_timezone("UTC"))
                    as ArrayRef
            }
            "severity_number" => cast(a, &DataType::Int32)?,
            // the list's item field as the schema names it, whatever the chunk called it
            "gen_ai.response.finish_reasons" => cast(a, &list_type())?,
            "trace_id" | "span_id" => hex_column(downcast::<FixedSizeBinaryArray>(a, "log")?),
            "scope_name" => blob_texts(downcast(a, "log")?, |b| Ok(decode::scope(b)?.name))?,
            "attributes" => blob_maps(downcast(a, "log")?, decode::attributes)?,
            "resource_attributes" => {
                blob_maps(downcast(a, "log")?, |b| Ok(decode::resource(b)?.attributes))?
            }
            _ => a.clone(),
        });
    }
    let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(stored.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &options,
    )?)
}

/// A text decoded from each blob, each distinct run decoded once (rows of one request share
/// their resource and scope).
fn blob_texts(
    a: &BinaryArray,
    read: impl Fn(&[u8]) -> weft_storage::Result<String>,
) -> Result<ArrayRef> {
    let mut b = StringBuilder::new();
    let mut last: Option<(&[u8], String)> = None;
    for i in 0..a.len() {
        let bytes = a.value(i);
        if last.as_ref().is_none_or(|(l, _)| *l != bytes) {
            last = Some((bytes, read(bytes).map_err(storage_err)?));
        }
        b.append_value(&last.as_ref().expect("set above").1);
    }
    Ok(Arc::new(b.finish()))
}

/// A map (attribute key to text) decoded from each blob; a null blob is an empty map.
fn blob_maps(
    a: &BinaryArray,
    read: impl Fn(&[u8]) -> weft_storage::Result<Vec<KeyValue>>,
) -> Result<ArrayRef> {
    let rows = (0..a.len())
        .map(|i| match a.is_valid(i) {
            true => read(a.value(i)),
            false => Ok(Vec::new()),
        })
        .collect::<weft_storage::Result<Vec<_>>>()
        .map_err(storage_err)?;
    map_column(rows.iter().map(Vec::as_slice)).map_err(storage_err)
}
