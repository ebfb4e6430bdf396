//! The context-leak scan: where prompts travel that they should not, from the spans and log
//! records of a time range. Findings, ranked by risk then count:
//!
//! - `raw_prompt_header`: a raw-prompt or user-history header (`http.request.header.x-raw-prompt`,
//!   `…x-user-history`) on a span or log record, redacted (its `.hash`) or not;
//! - `prompt_fanout`: one prompt hash (`llm.prompt.hash` or a content key's `.hash`) in the rows
//!   of more services than a request path needs (a gateway and a model server: more than two);
//! - `long_text_attribute`: long free text (at least 200 characters, 20 spaces) in an attribute
//!   of a service that is not a model server (one whose spans carry no `gen_ai.*` request
//!   attributes);
//! - `repeated_prompt_hash`: one prompt hash repeated in five or more rows of one trace (a
//!   streaming response copying the system prompt's hash into every chunk);
//! - `unredacted_content`: a content attribute kept verbatim (content capture on).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use weft_storage::Store;
use weft_storage::model::{KeyValue, TenantId, TraceId, Value};
use weft_storage::scan::Rows;
use weft_storage::schema::CONTENT_KEYS;
use weft_storage::store::LogScan;

use crate::error::QueryError;

/// One finding.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    pub kind: &'static str,
    pub service: String,
    /// The attribute that carries it.
    pub carrier: String,
    pub count: u64,
    /// Up to five traces where it was seen.
    pub example_trace_ids: Vec<String>,
    /// 0 to 1.
    pub risk: f64,
}

const RAW_HEADERS: &[&str] = &[
    "http.request.header.x-raw-prompt",
    "http.request.header.x-user-history",
];
const FANOUT_SERVICES: usize = 2;
const REPEATS: u64 = 5;

/// A row of either signal as the scan sees it.
struct Row<'a> {
    service: &'a str,
    trace: Option<TraceId>,
    attributes: &'a [KeyValue],
}

#[derive(Default)]
struct Tally {
    count: u64,
    traces: BTreeSet<String>,
}

impl Tally {
    fn add(&mut self, trace: Option<TraceId>) {
        self.count += 1;
        if let Some(t) = trace
            && self.traces.len() < 5
        {
            self.traces.insert(t.to_hex());
        }
    }
}

#[derive(Default)]
struct Scan {
    /// (kind, service, carrier) -> tally
    found: BTreeMap<(&'static str, String, String), Tally>,
    /// prompt hash -> (carrier, services, tally)
    hashes: HashMap<String, (String, BTreeSet<String>, Tally)>,
    /// (trace, hash) -> (service, carrier, rows)
    per_trace: HashMap<(TraceId, String), (String, String, u64)>,
    /// services whose spans carry GenAI request attributes
    model_servers: BTreeSet<String>,
    /// long free text seen, by (service, key), judged once model servers are known
    long_text: BTreeMap<(String, String), Tally>,
}

fn prompt_hash_key(key: &str) -> bool {
    key == "llm.prompt.hash"
        || key
            .strip_suffix(".hash")
            .is_some_and(|base| CONTENT_KEYS.contains(&base))
}

fn free_text(v: &Value) -> bool {
    matches!(v, Value::Str(s) if s.len() >= 200 && s.matches(' ').count() >= 20)
}

impl Scan {
    fn row(&mut self, r: Row<'_>) {
        for kv in r.attributes {
            let key = kv.key.as_str();
            let base = key
                .strip_suffix(".hash")
                .or_else(|| key.strip_suffix(".length"))
                .unwrap_or(key);
            let mut note = |kind| {
                self.found
                    .entry((kind, r.service.to_owned(), base.to_owned()))
                    .or_default()
                    .add(r.trace)
            };
            if RAW_HEADERS.contains(&base) && !key.ends_with(".length") {
                note("raw_prompt_header");
            }
            if CONTENT_KEYS.contains(&key) {
                note("unredacted_content");
            }
            if key.starts_with("gen_ai.request.") || key == "gen_ai.operation.name" {
                self.model_servers.insert(r.service.to_owned());
            }
            if prompt_hash_key(key)
                && let Value::Str(hash) = &kv.value
            {
                let e = self
                    .hashes
                    .entry(hash.clone())
                    .or_insert_with(|| (base.to_owned(), BTreeSet::new(), Tally::default()));
                e.1.insert(r.service.to_owned());
                e.2.add(r.trace);
                if let Some(t) = r.trace {
                    let rows = self
                        .per_trace
                        .entry((t, hash.clone()))
                        .or_insert_with(|| (r.service.to_owned(), base.to_owned(), 0));
                    rows.2 += 1;
                }
            }
            if !CONTENT_KEYS.contains(&key) && free_text(&kv.value) {
                self.long_text
                    .entry((r.service.to_owned(), key.to_owned()))
                    .or_default()
                    .add(r.trace);
            }
        }
    }

    fn findings(self) -> Vec<Finding> {
        let mut out = Vec::new();
        let finding = |kind, service: String, carrier: String, t: Tally, risk| Finding {
            kind,
            service,
            carrier,
            count: t.count,
            example_trace_ids: t.traces.into_iter().collect(),
            risk,
        };
        for ((kind, service, carrier), t) in self.found {
            let risk = match kind {
                "raw_prompt_header" => 0.9,
                _ => 0.7,
            };
            out.push(finding(kind, service, carrier, t, risk));
        }
        for ((service, key), t) in self.long_text {
            if !self.model_servers.contains(&service) {
                out.push(finding("long_text_attribute", service, key, t, 0.6));
            }
        }
        for (carrier, services, t) in self.hashes.into_values() {
            if services.len() > FANOUT_SERVICES {
                let risk = (0.5 + 0.1 * (services.len() - FANOUT_SERVICES) as f64).min(0.9);
                let service = services.into_iter().collect::<Vec<_>>().join(", ");
                out.push(finding("prompt_fanout", service, carrier, t, risk));
            }
        }
        let mut repeated: BTreeMap<(String, String), Tally> = BTreeMap::new();
        for ((trace, _), (service, carrier, rows)) in self.per_trace {
            if rows >= REPEATS {
                let t = repeated.entry((service, carrier)).or_default();
                t.count += rows;
                if t.traces.len() < 5 {
                    t.traces.insert(trace.to_hex());
                }
            }
        }
        for ((service, carrier), t) in repeated {
            out.push(finding("repeated_prompt_hash", service, carrier, t, 0.4));
        }
        out.sort_by(|a, b| {
            b.risk
                .total_cmp(&a.risk)
                .then(b.count.cmp(&a.count))
                .then(a.kind.cmp(b.kind))
                .then(a.service.cmp(&b.service))
        });
        out
    }
}

/// The findings of a tenant's spans and log records whose time is in `[start, end)` (Unix
/// nanoseconds; either open).
pub fn scan(
    store: &Store,
    tenant: &TenantId,
    start: Option<u64>,
    end: Option<u64>,
) -> Result<Vec<Finding>, QueryError> {
    let in_range = |t: u64| start.is_none_or(|s| t >= s) && end.is_none_or(|e| t < e);
    let mut scan = Scan::default();
    let spans = store.snapshot(tenant)?;
    let mut visit = |s: &weft_storage::model::SpanRecord| {
        if in_range(s.start.0) {
            scan.row(Row {
                service: s.service_name(),
                trace: Some(s.trace_id),
                attributes: &s.attributes,
            });
            for e in &s.events {
                scan.row(Row {
                    service: s.service_name(),
                    trace: Some(s.trace_id),
                    attributes: &e.attributes,
                });
            }
        }
    };
    spans.head.rows().for_each(&mut visit);
    for (addr, meta) in spans.blocks.iter() {
        let overlaps =
            start.is_none_or(|s| meta.max_start >= s) && end.is_none_or(|e| meta.min_start < e);
        if overlaps {
            let rows = store
                .block_view(tenant, *addr, meta)
                .spans(&Rows::All, true)?;
            rows.iter().for_each(&mut visit);
        }
    }
    let logs = store.log_snapshot(tenant)?;
    let window = LogScan {
        from: start,
        to: end.map(|e| e.saturating_sub(1)),
        ..Default::default()
    };
    let mut records: Vec<_> = logs
        .head
        .rows()
        .filter(|l| window.matches_row(l))
        .cloned()
        .collect();
    for (addr, meta) in logs.blocks.iter() {
        records.extend(store.block_logs(tenant, &logs, *addr, meta, &window)?);
    }
    for l in &records {
        scan.row(Row {
            service: l.service_name(),
            trace: l.trace_id,
            attributes: &l.attributes,
        });
    }
    Ok(scan.findings())
}

#[cfg(test)]
mod tests;

/// The SQL table function `leaks(start, end)` (start and end as timestamps, RFC 3339 text or
/// Unix nanoseconds; `leaks()` scans everything): one row per finding, ranked.
pub struct LeaksFunction {
    pub store: std::sync::Arc<Store>,
    pub tenant: TenantId,
}

impl std::fmt::Debug for LeaksFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaksFunction")
            .field("tenant", &self.tenant)
            .finish()
    }
}

fn bound(e: &datafusion::logical_expr::Expr) -> datafusion::error::Result<Option<u64>> {
    use datafusion::logical_expr::Expr;
    use datafusion::scalar::ScalarValue as S;
    let bad = || {
        datafusion::error::DataFusionError::Plan(format!(
            "leaks(start, end): {e} is not a time (a timestamp, RFC 3339 text or Unix nanoseconds)"
        ))
    };
    let Expr::Literal(v, _) = e else {
        return Err(bad());
    };
    let nanos = match v {
        S::Null => return Ok(None),
        S::Int64(Some(n)) => *n,
        S::TimestampNanosecond(Some(n), _) => *n,
        S::TimestampMicrosecond(Some(n), _) => n * 1_000,
        S::TimestampMillisecond(Some(n), _) => n * 1_000_000,
        S::TimestampSecond(Some(n), _) => n * 1_000_000_000,
        S::Utf8(Some(t)) | S::Utf8View(Some(t)) | S::LargeUtf8(Some(t)) => {
            arrow::compute::kernels::cast_utils::string_to_timestamp_nanos(t).map_err(|_| bad())?
        }
        _ => return Err(bad()),
    };
    Ok(Some(nanos.max(0) as u64))
}

impl datafusion::catalog::TableFunctionImpl for LeaksFunction {
    fn call_with_args(
        &self,
        args: datafusion::catalog::TableFunctionArgs,
    ) -> datafusion::error::Result<std::sync::Arc<dyn datafusion::catalog::TableProvider>> {
        use std::sync::Arc;

        use arrow::array::{
            ArrayRef, Float64Array, ListBuilder, StringArray, StringBuilder, UInt64Array,
        };
        use arrow::datatypes::{DataType, Field, Schema};

        let exprs = args.exprs();
        if exprs.len() > 2 {
            return Err(datafusion::error::DataFusionError::Plan(
                "leaks(start, end) takes at most two arguments".into(),
            ));
        }
        let start = exprs.first().map(bound).transpose()?.flatten();
        let end = exprs.get(1).map(bound).transpose()?.flatten();
        let found = scan(&self.store, &self.tenant, start, end)
            .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
        let mut traces = ListBuilder::new(StringBuilder::new());
        for f in &found {
            f.example_trace_ids
                .iter()
                .for_each(|t| traces.values().append_value(t));
            traces.append(true);
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(found.iter().map(|f| f.kind))),
            Arc::new(StringArray::from_iter_values(
                found.iter().map(|f| f.service.as_str()),
            )),
            Arc::new(StringArray::from_iter_values(
                found.iter().map(|f| f.carrier.as_str()),
            )),
            Arc::new(UInt64Array::from_iter_values(found.iter().map(|f| f.count))),
            Arc::new(traces.finish()),
            Arc::new(Float64Array::from_iter_values(found.iter().map(|f| f.risk))),
        ];
        let schema = Arc::new(Schema::new(vec![
            Field::new("kind", DataType::Utf8, false),
            Field::new("service", DataType::Utf8, false),
            Field::new("carrier", DataType::Utf8, false),
            Field::new("count", DataType::UInt64, false),
            Field::new("example_trace_ids", crate::sql::columns::list_type(), true),
            Field::new("risk", DataType::Float64, false),
        ]));
        let batch = arrow::array::RecordBatch::try_new(schema.clone(), columns)?;
        Ok(Arc::new(datafusion::datasource::MemTable::try_new(
            schema,
            vec![vec![batch]],
        )?))
    }
}
