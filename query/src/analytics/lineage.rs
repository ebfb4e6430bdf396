//! Lineage graphs in the shape of Grafana's node graph (`nodes` with `id`, `title`,
//! `subtitle`, `mainstat`, `secondarystat`, `arc__*`; `edges` with `id`, `source`, `target`).
//!
//! - [`operations`]: nodes are (service, operation) with calls, errors, p50 / p99 and share of
//!   end-to-end latency (the node's summed duration over the summed duration of the root spans
//!   in the same range); edges are parent → child calls; `level=service` folds operations
//!   into services (calls inside one service are not edges then).
//! - [`dimensions`]: which values of which dimensions served the requests, with counts and
//!   latency, from the request columns (the inherited postings).
//! - [`request`]: the path of one request (or of every request of a prompt hash or a
//!   conversation): its operations, the model version, worker and GPU that served it, its
//!   token spans, its log records and the traces its spans link to.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::exec::Run;
use super::params::{Groups, Params, Result, dim_exprs, groups, inherited, invalid, lit};
use super::percentiles::json_number;
use super::signals::REQUEST_SPANS;
use crate::sql::percentile::of_sorted;

pub const OPERATION_PARAMS: &[&str] = &["level", "exact"];
pub const DIMENSION_PARAMS: &[&str] = &["dims"];
pub const REQUEST_PARAMS: &[&str] = &["trace_id", "prompt_hash", "conversation_id"];

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub id: String,
    pub kind: &'static str,
    pub title: String,
    pub subtitle: String,
    pub calls: u64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub latency_share: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Edge {
    pub source: String,
    pub target: String,
    pub calls: u64,
    pub p99_ms: f64,
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Graph {
    pub nodes: Vec<Node>,
    pub edges: Vec<Edge>,
    pub partial: bool,
    /// The relative error of the percentiles when they come from sketches; `None` when exact.
    pub relative_error: Option<f64>,
}

impl Node {
    /// A node with nothing counted yet.
    fn new(id: String, kind: &'static str, title: String, subtitle: String) -> Self {
        Self {
            id,
            kind,
            title,
            subtitle,
            calls: 0,
            errors: 0,
            p50_ms: 0.0,
            p99_ms: 0.0,
            latency_share: 0.0,
        }
    }
}

fn node_id(service: &str, operation: Option<&str>) -> String {
    match operation {
        Some(o) => format!("{service}/{o}"),
        None => service.to_owned(),
    }
}

/// The operation (or service) graph of the spans the parameters select.
pub async fn operations(run: &mut Run<'_>, mut p: Params) -> Result<Graph> {
    let services = match p.get("level").unwrap_or("operation") {
        "operation" => false,
        "service" => true,
        l => {
            return Err(invalid(format!(
                "level: {l:?} is not a level (use operation or service)"
            )));
        }
    };
    run.fit_rows(&mut p).await?;
    if !p.flag("exact")? && p.attrs.is_empty() {
        return operations_of_rollups(run, &p, services).await;
    }
    let filter = p.where_clause(&[])?;
    let (key, key_c, key_p) = if services {
        (
            "service_name, '' AS operation",
            "c.service_name, '' AS child_operation",
            "p.service_name, '' AS parent_operation",
        )
    } else {
        (
            "service_name, name",
            "c.service_name, c.name",
            "p.service_name, p.name",
        )
    };
    let nodes_q = format!(
        "SELECT {key}, count(*), sum(CASE WHEN status_code = 'ERROR' THEN 1 ELSE 0 END), \
         percentile_cont(duration_ns, 0.5), percentile_cont(duration_ns, 0.99), \
         sum(CAST(duration_ns AS DOUBLE)) FROM spans {filter} GROUP BY 1, 2"
    );
    // roots and parents: any service and operation, in the same range and requests
    let mut any_op = p.clone();
    any_op.service = None;
    any_op.name = None;
    let roots_q = format!(
        "SELECT sum(CAST(duration_ns AS DOUBLE)) FROM spans {}",
        any_op.where_clause(&["parent_span_id IS NULL".into()])?
    );
    // edges: each child with its parent in the same trace (a root has no parent to match;
    // the join leaves it out, and a side filtered only by time is joined trace by trace)
    let child_filter = p.where_clause(&[])?;
    let parent_filter = any_op.where_clause(&[])?;
    let columns = if services {
        "service_name"
    } else {
        "service_name, name"
    };
    let edges_q = format!(
        "WITH c AS (SELECT trace_id, parent_span_id, {columns}, duration_ns FROM spans {child_filter}), \
         p AS (SELECT trace_id, span_id, {columns} FROM spans {parent_filter}) \
         SELECT {key_p}, {key_c}, count(*), percentile_cont(c.duration_ns, 0.99) \
         FROM c JOIN p ON c.trace_id = p.trace_id AND c.parent_span_id = p.span_id \
         {same} GROUP BY 1, 2, 3, 4",
        same = if services {
            "WHERE c.service_name <> p.service_name"
        } else {
            ""
        }
    );
    let mut graph = Graph::default();
    let Some(nodes) = run.sql_or_partial(&nodes_q).await? else {
        graph.partial = true;
        return Ok(graph);
    };
    let roots = run
        .sql_or_partial(&roots_q)
        .await?
        .and_then(|r| r.f64(0).first().copied().flatten())
        .unwrap_or(0.0);
    let (svc, op, calls, errors, p50, p99, total) = (
        nodes.strings(0),
        nodes.strings(1),
        nodes.i64(2),
        nodes.i64(3),
        nodes.f64(4),
        nodes.f64(5),
        nodes.f64(6),
    );
    for i in 0..nodes.len() {
        let service = svc[i].clone().unwrap_or_default();
        let operation = op[i].clone().unwrap_or_default();
        graph.nodes.push(Node {
            id: node_id(&service, (!services).then_some(operation.as_str())),
            kind: if services { "service" } else { "operation" },
            title: service,
            subtitle: operation,
            calls: calls[i].unwrap_or(0) as u64,
            errors: errors[i].unwrap_or(0) as u64,
            p50_ms: p50[i].unwrap_or(0.0) / 1e6,
            p99_ms: p99[i].unwrap_or(0.0) / 1e6,
            latency_share: if roots > 0.0 {
                total[i].unwrap_or(0.0) / roots
            } else {
                0.0
            },
        });
    }
    if let Some(edges) = run.sql_or_partial(&edges_q).await? {
        let (ps, po, cs, co, n, p99) = (
            edges.strings(0),
            edges.strings(1),
            edges.strings(2),
            edges.strings(3),
            edges.i64(4),
            edges.f64(5),
        );
        for i in 0..edges.len() {
            let id = |s: &Option<String>, o: &Option<String>| {
                node_id(
                    s.as_deref().unwrap_or_default(),
                    (!services).then_some(o.as_deref().unwrap_or_default()),
                )
            };
            graph.edges.push(Edge {
                source: id(&ps[i], &po[i]),
                target: id(&cs[i], &co[i]),
                calls: n[i].unwrap_or(0) as u64,
                p99_ms: p99[i].unwrap_or(0.0) / 1e6,
            });
        }
    }
    graph.nodes.sort_by(|a, b| a.id.cmp(&b.id));
    graph
        .edges
        .sort_by(|a, b| (&a.source, &a.target).cmp(&(&b.source, &b.target)));
    graph.partial = run.partial;
    Ok(graph)
}

/// The operation graph from the blocks' operation rollups (per-block counts and duration
/// sketches, see `weft_storage::rollup`): percentiles within the sketches' relative error, the
/// rest exact; cost by blocks, not by spans. Filters by service and operation apply to the
/// nodes and to the child side of edges, as in SQL.
async fn operations_of_rollups(run: &mut Run<'_>, p: &Params, services: bool) -> Result<Graph> {
    use weft_storage::rollup::{EdgeStats, NodeStats};
    use weft_storage::sketch::{RELATIVE_ERROR, Sketch};
    let store = run.engine.store().clone();
    let tenant = run.tenant.clone();
    let (start, end) = (p.start, p.end);
    let work = tokio::task::spawn_blocking(move || store.operation_rollup(&tenant, start, end));
    let rollup = match tokio::time::timeout(run.left(), work).await {
        Err(_) => {
            return Ok(Graph {
                partial: true,
                relative_error: Some(RELATIVE_ERROR),
                ..Graph::default()
            });
        }
        Ok(joined) => joined
            .map_err(|e| crate::sql::SqlError::internal(format!("operation rollup: {e}")))?
            .map_err(|e| crate::sql::SqlError::internal(e.to_string()))?,
    };
    let keep = |(service, name): &(String, String)| {
        p.service.as_deref().is_none_or(|s| s == service)
            && p.name.as_deref().is_none_or(|n| n == name)
    };
    let id_of =
        |(service, name): &(String, String)| node_id(service, (!services).then_some(name.as_str()));
    // by node id: title, subtitle, the node's stats summed over its operations
    let mut nodes: BTreeMap<String, (String, String, NodeStats)> = BTreeMap::new();
    for (op, n) in rollup.ops.iter().zip(&rollup.nodes) {
        if !keep(op) || n.calls == 0 {
            continue;
        }
        let subtitle = if services {
            String::new()
        } else {
            op.1.clone()
        };
        nodes
            .entry(id_of(op))
            .or_insert_with(|| (op.0.clone(), subtitle, NodeStats::default()))
            .2
            .merge(n);
    }
    let roots = rollup.roots_ns as f64;
    let ms = |s: &Sketch, q: f64| s.quantile(q).unwrap_or(0.0) / 1e6;
    let mut graph = Graph {
        relative_error: Some(RELATIVE_ERROR),
        ..Graph::default()
    };
    for (id, (title, subtitle, a)) in nodes {
        graph.nodes.push(Node {
            id,
            kind: if services { "service" } else { "operation" },
            p50_ms: ms(&a.durations, 0.5),
            p99_ms: ms(&a.durations, 0.99),
            latency_share: if roots > 0.0 {
                a.sum_ns as f64 / roots
            } else {
                0.0
            },
            title,
            subtitle,
            calls: a.calls,
            errors: a.errors,
        });
    }
    let mut edges: BTreeMap<(String, String), EdgeStats> = BTreeMap::new();
    for (&(parent, child), e) in &rollup.edges {
        let (parent, child) = (&rollup.ops[parent as usize], &rollup.ops[child as usize]);
        if !keep(child) || (services && parent.0 == child.0) {
            continue;
        }
        edges
            .entry((id_of(parent), id_of(child)))
            .or_default()
            .merge(e);
    }
    for ((source, target), e) in edges {
        graph.edges.push(Edge {
            source,
            target,
            calls: e.calls,
            p99_ms: ms(&e.durations, 0.99),
        });
    }
    graph.partial = run.partial;
    Ok(graph)
}

impl Graph {
    pub fn to_json(&self) -> Value {
        let nodes: Vec<Value> = self
            .nodes
            .iter()
            .map(|n| {
                let ok = if n.calls > 0 {
                    1.0 - n.errors as f64 / n.calls as f64
                } else {
                    1.0
                };
                json!({
                    "id": n.id,
                    "type": n.kind,
                    "title": n.title,
                    "subtitle": n.subtitle,
                    "mainstat": n.calls,
                    "secondarystat": json_number(n.p99_ms),
                    "arc__ok": ok,
                    "arc__errors": 1.0 - ok,
                    "calls": n.calls,
                    "errors": n.errors,
                    "p50_ms": json_number(n.p50_ms),
                    "p99_ms": json_number(n.p99_ms),
                    "error_rate": 1.0 - ok,
                    "latency_share": json_number(n.latency_share),
                })
            })
            .collect();
        let edges: Vec<Value> = self
            .edges
            .iter()
            .map(|e| {
                json!({
                    "id": format!("{}->{}", e.source, e.target),
                    "source": e.source,
                    "target": e.target,
                    "mainstat": e.calls,
                    "secondarystat": json_number(e.p99_ms),
                    "calls": e.calls,
                    "p99_ms": json_number(e.p99_ms),
                })
            })
            .collect();
        let mut out = json!({"nodes": nodes, "edges": edges, "partial": self.partial});
        if let Some(e) = self.relative_error {
            out["relative_error"] = json!(e);
        }
        out
    }
}

/// One combination of dimension values and what it served.
#[derive(Clone, Debug, PartialEq)]
pub struct DimensionRow {
    pub values: Vec<Option<String>>,
    pub requests: u64,
    pub spans: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub error_rate: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Dimensions {
    pub dims: Vec<String>,
    pub rows: Vec<DimensionRow>,
    pub partial: bool,
}

/// The default dimensions of dimension lineage.
pub const DEFAULT_DIMS: &[&str] = &[
    "llm.model_version",
    "llm.lora_adapter",
    "llm.kv_cache_strategy",
    "worker.id",
    "gpu.id",
];

/// Which combinations of `dims` served the selected requests: requests (traces with a request
/// span of the combination), spans (every span of those requests, the decode tokens too),
/// p50 / p99 and error rate of the request spans. The indexed LLM dimensions are read from
/// the request columns (a token span counts under its own request's values); other
/// attributes are those of the request span.
pub async fn dimensions(run: &mut Run<'_>, mut p: Params) -> Result<Dimensions> {
    let dims = p.list_or("dims", DEFAULT_DIMS);
    if dims.is_empty() || dims.len() > 8 {
        return Err(invalid("dims: name one to eight dimensions"));
    }
    run.fit_rows(&mut p).await?;
    if let Some(rows) = dimensions_of_requests(run, &p, &dims).await? {
        return Ok(Dimensions {
            dims,
            rows,
            partial: run.partial,
        });
    }
    let all_inherited = dims.iter().all(|d| inherited(d));
    let exprs = dim_exprs(&dims);
    let Groups { select: cols, keys } = groups(&exprs);
    // the grouping columns lead the answer
    let keys = keys.trim_start_matches(", ");
    let request = format!("({REQUEST_SPANS})");
    let query = if all_inherited {
        // every span of a request carries the request's values: the spans counted by their
        // request columns alone (no per-row trace id), the requests over the request spans,
        // the two joined by group
        let any: Vec<String> = exprs.iter().map(|e| format!("{e} IS NOT NULL")).collect();
        let any = format!("({})", any.join(" OR "));
        let filter = p.where_clause(std::slice::from_ref(&any))?;
        let req_filter = p.where_clause(&[any, request.clone()])?;
        let on: Vec<String> = (0..exprs.len())
            .map(|i| format!("(s.g{i} IS NOT DISTINCT FROM r.g{i})"))
            .collect();
        let s_keys: Vec<String> = (0..exprs.len()).map(|i| format!("s.g{i}")).collect();
        format!(
            "WITH s AS (SELECT {keys}, count(*) AS n FROM (SELECT {} FROM spans {filter}) GROUP BY {keys}), \
             r AS (SELECT {keys}, count(DISTINCT trace_id) AS requests, \
             percentile_cont(duration_ns, 0.5) AS p50, percentile_cont(duration_ns, 0.99) AS p99, \
             sum(CASE WHEN status_code = 'ERROR' THEN 1 ELSE 0 END) AS errors, count(*) AS reqs \
             FROM (SELECT trace_id{cols}, duration_ns, status_code FROM spans {req_filter}) GROUP BY {keys}) \
             SELECT {}, COALESCE(r.requests, 0), s.n, r.p50, r.p99, COALESCE(r.errors, 0), COALESCE(r.reqs, 0) \
             FROM s LEFT JOIN r ON {}",
            cols.trim_start_matches(", "),
            s_keys.join(", "),
            on.join(" AND ")
        )
    } else {
        // attributes of the request span: the request spans, and the spans of their traces
        let filter = p.where_clause(std::slice::from_ref(&request))?;
        let all = p.where_clause(&["trace_id IN (SELECT trace_id FROM r)".into()])?;
        format!(
            "WITH r AS (SELECT trace_id{cols}, duration_ns, status_code FROM spans {filter}), \
             n AS (SELECT trace_id, count(*) AS n FROM spans {all} GROUP BY trace_id) \
             SELECT {keys}, count(DISTINCT r.trace_id), CAST(sum(COALESCE(n.n, 0)) AS BIGINT), \
             percentile_cont(duration_ns, 0.5), percentile_cont(duration_ns, 0.99), \
             sum(CASE WHEN status_code = 'ERROR' THEN 1 ELSE 0 END), count(*) \
             FROM r LEFT JOIN n ON r.trace_id = n.trace_id GROUP BY {keys}"
        )
    };
    let Some(rows) = run.sql_or_partial(&query).await? else {
        return Ok(Dimensions {
            dims,
            rows: Vec::new(),
            partial: true,
        });
    };
    let values: Vec<Vec<Option<String>>> = (0..dims.len()).map(|i| rows.strings(i)).collect();
    let k = dims.len();
    let (requests, spans, p50, p99, errors, reqs) = (
        rows.i64(k),
        rows.i64(k + 1),
        rows.f64(k + 2),
        rows.f64(k + 3),
        rows.i64(k + 4),
        rows.i64(k + 5),
    );
    let mut out: Vec<DimensionRow> = (0..rows.len())
        .map(|i| {
            let r = reqs[i].unwrap_or(0);
            DimensionRow {
                values: values.iter().map(|c| c[i].clone()).collect(),
                requests: requests[i].unwrap_or(0) as u64,
                spans: spans[i].unwrap_or(0) as u64,
                p50_ms: p50[i].map_or(f64::NAN, |v| v / 1e6),
                p99_ms: p99[i].map_or(f64::NAN, |v| v / 1e6),
                error_rate: if r > 0 {
                    errors[i].unwrap_or(0) as f64 / r as f64
                } else {
                    0.0
                },
            }
        })
        .collect();
    out.sort_by(|a, b| b.requests.cmp(&a.requests).then(a.values.cmp(&b.values)));
    Ok(Dimensions {
        dims,
        rows: out,
        partial: run.partial,
    })
}

/// Dimension lineage over request dimensions alone, from the blocks' request tables
/// (`weft_storage::requests`): the same rows as the SQL, percentiles exact. `None` when the
/// tables cannot answer (another dimension, a `service` or `name` filter, an `attr.` filter on
/// anything but a request dimension, a range end inside a block).
async fn dimensions_of_requests(
    run: &mut Run<'_>,
    p: &Params,
    dims: &[String],
) -> Result<Option<Vec<DimensionRow>>> {
    let Some(t) = super::requests::table(run, p, true, dims, |_| true).await? else {
        return Ok(None);
    };
    // rows with none of the dimensions belong to no combination
    let key = |tuple: u32| -> Option<Vec<Option<&str>>> {
        let k = t.key(tuple);
        k.iter().any(Option::is_some).then_some(k)
    };
    #[derive(Default)]
    struct Group<'a> {
        spans: u64,
        traces: std::collections::HashSet<&'a weft_storage::model::TraceId>,
        durations: Vec<f64>,
        errors: u64,
    }
    let mut groups: BTreeMap<Vec<Option<&str>>, Group<'_>> = BTreeMap::new();
    for (tuple, n) in t.rollup.spans.iter().enumerate() {
        if *n == 0 || !t.passes(tuple as u32) {
            continue;
        }
        if let Some(k) = key(tuple as u32) {
            groups.entry(k).or_default().spans += n;
        }
    }
    for q in &t.rollup.requests {
        if !t.passes(q.tuple) {
            continue;
        }
        if let Some(g) = key(q.tuple).and_then(|k| groups.get_mut(&k)) {
            g.traces.insert(&q.trace);
            g.durations.push(q.duration_ns as f64);
            g.errors += u64::from(q.error);
        }
    }
    let mut out: Vec<DimensionRow> = groups
        .into_iter()
        .map(|(k, mut g)| {
            g.durations.sort_by(f64::total_cmp);
            let reqs = g.durations.len();
            DimensionRow {
                values: k.into_iter().map(|v| v.map(str::to_owned)).collect(),
                requests: g.traces.len() as u64,
                spans: g.spans,
                p50_ms: of_sorted(&g.durations, 0.5) / 1e6,
                p99_ms: of_sorted(&g.durations, 0.99) / 1e6,
                error_rate: if reqs > 0 {
                    g.errors as f64 / reqs as f64
                } else {
                    0.0
                },
            }
        })
        .collect();
    out.sort_by(|a, b| b.requests.cmp(&a.requests).then(a.values.cmp(&b.values)));
    Ok(Some(out))
}

impl Dimensions {
    pub fn to_json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                let mut m = serde_json::Map::new();
                for (d, v) in self.dims.iter().zip(&r.values) {
                    m.insert(d.clone(), json!(v));
                }
                m.insert("requests".into(), json!(r.requests));
                m.insert("spans".into(), json!(r.spans));
                m.insert("p50_ms".into(), json_number(r.p50_ms));
                m.insert("p99_ms".into(), json_number(r.p99_ms));
                m.insert("error_rate".into(), json!(r.error_rate));
                Value::Object(m)
            })
            .collect();
        json!({"dims": self.dims, "rows": rows, "partial": self.partial})
    }
}

/// The lineage of one request, or of every request of one prompt hash or conversation.
pub async fn request(run: &mut Run<'_>, p: Params) -> Result<Graph> {
    let given: Vec<(&str, &str)> = REQUEST_PARAMS
        .iter()
        .filter_map(|k| p.get(k).map(|v| (*k, v)))
        .collect();
    let [(which, value)] = given[..] else {
        return Err(invalid(
            "name exactly one of trace_id, prompt_hash, conversation_id",
        ));
    };
    let time = p.time_condition("start_time");
    let and_time = |c: String| {
        let mut all = time.clone();
        all.push(c);
        all.join(" AND ")
    };
    let traces: Vec<String> = match which {
        "trace_id" => {
            let t = value.trim().to_ascii_lowercase();
            if t.len() != 32 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid(format!("trace_id: {value:?} is not 32 hex digits")));
            }
            vec![t]
        }
        _ => {
            let column = if which == "prompt_hash" {
                "attributes['llm.prompt.hash']"
            } else {
                "\"gen_ai.conversation.id\""
            };
            let mut q = format!(
                "SELECT DISTINCT trace_id FROM spans WHERE {}",
                and_time(format!("{column} = {}", lit(value)))
            );
            if which == "prompt_hash" {
                let mut lt = p.time_condition("time");
                lt.push(format!("attributes['llm.prompt.hash'] = {}", lit(value)));
                lt.push("trace_id IS NOT NULL".into());
                q = format!(
                    "{q} UNION SELECT DISTINCT trace_id FROM logs WHERE {}",
                    lt.join(" AND ")
                );
            }
            let rows = run.sql(&format!("{q} LIMIT 1000")).await?;
            let mut t: Vec<String> = rows.strings(0).into_iter().flatten().collect();
            t.sort();
            t
        }
    };
    let mut graph = Graph::default();
    if traces.is_empty() {
        return Ok(graph);
    }
    let list: Vec<String> = traces.iter().map(|t| lit(t)).collect();
    let list = list.join(", ");
    let spans = run
        .sql(&format!(
            "SELECT trace_id, span_id, parent_span_id, service_name, name, duration_ns, status_code, \
             \"llm.model_version\", \"worker.id\", \"gpu.id\", \"llm.token.index\" IS NOT NULL \
             FROM spans WHERE trace_id IN ({list})"
        ))
        .await?;
    let (tid, sid, pid, svc, name, dur, status, version, worker, gpu, token) = (
        spans.strings(0),
        spans.strings(1),
        spans.strings(2),
        spans.strings(3),
        spans.strings(4),
        spans.i64(5),
        spans.strings(6),
        spans.strings(7),
        spans.strings(8),
        spans.strings(9),
        spans.strings(10),
    );
    // each span's node: its operation, or for token spans one `tokens` node per parent
    let mut node_of: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
    let mut edges: BTreeMap<(String, String), (u64, f64)> = BTreeMap::new();
    let is_token = |i: usize| token[i].as_deref() == Some("true");
    let parent_op = |i: usize| -> Option<(String, String)> {
        pid[i]
            .clone()
            .map(|pp| (tid[i].clone().unwrap_or_default(), pp))
    };
    let mut durations: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut add = |nodes: &mut BTreeMap<String, Node>,
                   id: String,
                   kind: &'static str,
                   title: String,
                   subtitle: String,
                   ms: f64,
                   error: bool| {
        let n = nodes
            .entry(id.clone())
            .or_insert_with(|| Node::new(id, kind, title, subtitle));
        n.calls += 1;
        n.errors += u64::from(error);
        durations.entry(n.id.clone()).or_default().push(ms);
    };
    for i in 0..spans.len() {
        let service = svc[i].clone().unwrap_or_default();
        let op = name[i].clone().unwrap_or_default();
        let ms = dur[i].unwrap_or(0) as f64 / 1e6;
        let error = status[i].as_deref() == Some("ERROR");
        let id = if is_token(i) {
            let parent = pid[i].clone().unwrap_or_default();
            let id = format!("tokens:{}", &parent);
            add(&mut nodes, id.clone(), "tokens", service, op, ms, error);
            id
        } else {
            let id = node_id(&service, Some(&op));
            add(
                &mut nodes,
                id.clone(),
                "operation",
                service.clone(),
                op,
                ms,
                error,
            );
            // the service above its operations
            edges
                .entry((service.clone(), id.clone()))
                .or_insert((0, 0.0))
                .0 += 1;
            nodes.entry(service.clone()).or_insert_with(|| {
                Node::new(service.clone(), "service", service.clone(), String::new())
            });
            id
        };
        node_of.insert(
            (
                tid[i].clone().unwrap_or_default(),
                sid[i].clone().unwrap_or_default(),
            ),
            id.clone(),
        );
        for (kind, v) in [
            ("model_version", &version[i]),
            ("worker", &worker[i]),
            ("gpu", &gpu[i]),
        ] {
            if let Some(v) = v {
                let vid = format!("{kind}:{v}");
                nodes
                    .entry(vid.clone())
                    .or_insert_with(|| {
                        Node::new(vid.clone(), kind, v.clone(), kind.replace('_', " "))
                    })
                    .calls += 1;
                edges.entry((id.clone(), vid)).or_insert((0, 0.0)).0 += 1;
            }
        }
    }
    for i in 0..spans.len() {
        let Some(parent) = parent_op(i) else { continue };
        let (Some(from), Some(to)) = (
            node_of.get(&parent),
            node_of.get(&(
                tid[i].clone().unwrap_or_default(),
                sid[i].clone().unwrap_or_default(),
            )),
        ) else {
            continue;
        };
        let ms = dur[i].unwrap_or(0) as f64 / 1e6;
        let e = edges.entry((from.clone(), to.clone())).or_insert((0, 0.0));
        e.0 += 1;
        e.1 = e.1.max(ms);
    }
    // log records of the requests, by class, under the operation of their span
    let logs = run
        .sql(&format!(
            "SELECT trace_id, span_id, class, count(*) FROM logs WHERE trace_id IN ({list}) GROUP BY 1, 2, 3"
        ))
        .await?;
    let (lt, ls, lc, ln) = (
        logs.strings(0),
        logs.strings(1),
        logs.strings(2),
        logs.i64(3),
    );
    for i in 0..logs.len() {
        let class = lc[i].clone().unwrap_or_else(|| "other".into());
        let owner = ls[i].clone().and_then(|s| {
            node_of
                .get(&(lt[i].clone().unwrap_or_default(), s))
                .cloned()
        });
        let id = format!("log:{class}:{}", owner.clone().unwrap_or_default());
        let n = nodes
            .entry(id.clone())
            .or_insert_with(|| Node::new(id.clone(), "log", class.clone(), "log records".into()));
        n.calls += ln[i].unwrap_or(0) as u64;
        if let Some(o) = owner {
            edges.entry((o, id)).or_insert((0, 0.0)).0 += ln[i].unwrap_or(0) as u64;
        }
    }
    // span links to other traces
    let links = run
        .sql(&format!(
            "SELECT trace_id, span_id, linked_trace_id FROM span_links WHERE trace_id IN ({list})"
        ))
        .await?;
    let (kt, ks, kl) = (links.strings(0), links.strings(1), links.strings(2));
    let ours: BTreeSet<&String> = traces.iter().collect();
    for i in 0..links.len() {
        let Some(linked) = kl[i].clone() else {
            continue;
        };
        let id = if ours.contains(&linked) {
            // a link between two requests of the answer: the linked trace's root
            format!("trace:{linked}")
        } else {
            format!("linked_trace:{linked}")
        };
        let n = nodes.entry(id.clone()).or_insert_with(|| {
            Node::new(
                id.clone(),
                "linked_trace",
                linked.clone(),
                "linked trace".into(),
            )
        });
        n.calls += 1;
        if let Some(from) = ks[i].clone().and_then(|s| {
            node_of
                .get(&(kt[i].clone().unwrap_or_default(), s))
                .cloned()
        }) {
            edges.entry((from, id)).or_insert((0, 0.0)).0 += 1;
        }
    }
    for n in nodes.values_mut() {
        if let Some(d) = durations.get_mut(&n.id) {
            d.sort_by(f64::total_cmp);
            let at = |q: f64| d[((d.len() - 1) as f64 * q).round() as usize];
            (n.p50_ms, n.p99_ms) = (at(0.5), at(0.99));
        }
    }
    graph.nodes = nodes.into_values().collect();
    graph.edges = edges
        .into_iter()
        .map(|((source, target), (calls, p99))| Edge {
            source,
            target,
            calls,
            p99_ms: p99,
        })
        .collect();
    Ok(graph)
}
