//! Per-block pre-aggregates of spans by operation: what an operation graph (nodes are
//! (service, operation), edges parent → child calls) needs, kept so that a graph over a long
//! range reads a few kilobytes a block instead of every span.
//!
//! An [`OpRollup`] holds, for the spans it covers: per operation the calls, errors, summed
//! duration and a duration sketch ([`crate::sketch`], relative error 1%); per (parent
//! operation, child operation) the calls and a sketch of the children's durations, for every
//! child whose parent is among the same spans; the summed duration of the root spans; and the
//! *orphans*, children whose parent is not among them (another block, the head), kept with
//! their trace and parent id so that a reader joins them to their parents wherever those are
//! ([`crate::store::Store::operation_rollup`]). Rollups merge by adding.
//!
//! A span block keeps the rollup of its rows as a chunk written with the block (see
//! `block::writer`); a block written before keeps none, and a reader computes it from the
//! block's columns.

use rustc_hash::FxHashMap as HashMap;

use crate::codec::{Reader, Writer};
use crate::error::{Result, StorageError};
use crate::model::{SpanId, SpanRecord, StatusCode, TraceId};
use crate::request::ParentPlace;
use crate::sketch::Sketch;

/// Version of the encoded rollup.
pub const ROLLUP_VERSION: u8 = 1;

/// A (service, operation) pair: an operation.
pub type Op = (String, String);

#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeStats {
    pub calls: u64,
    pub errors: u64,
    /// Summed duration, ns (exact, whatever the order of merging).
    pub sum_ns: u128,
    pub durations: Sketch,
}

impl NodeStats {
    /// Adds another's counts and sketch.
    pub fn merge(&mut self, other: &NodeStats) {
        self.calls += other.calls;
        self.errors += other.errors;
        self.sum_ns += other.sum_ns;
        self.durations.merge(&other.durations);
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct EdgeStats {
    pub calls: u64,
    /// The children's durations.
    pub durations: Sketch,
}

impl EdgeStats {
    /// Adds another's calls and sketch.
    pub fn merge(&mut self, other: &EdgeStats) {
        self.calls += other.calls;
        self.durations.merge(&other.durations);
    }
}

/// A child span whose parent is not among the spans of its rollup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Orphan {
    pub trace: TraceId,
    pub parent: SpanId,
    /// Its operation, an index into [`OpRollup::ops`].
    pub op: u32,
    pub duration_ns: u64,
}

/// Each row's operation, numbered in the order first seen: looked up once a row for all of a
/// block's rollups (a row's service name is a search of its resource's attributes).
#[derive(Clone, Debug, Default)]
pub struct RowOps {
    pub ops: Vec<Op>,
    /// Per row, its index into `ops`.
    pub of_row: Vec<u32>,
}

impl RowOps {
    pub fn of(rows: &[&SpanRecord]) -> Self {
        let mut ops: Vec<Op> = Vec::new();
        let mut index: HashMap<(&str, &str), u32> = HashMap::default();
        let mut of_row = Vec::with_capacity(rows.len());
        // rows share few resources (one per exporting process) and come in runs of one
        // operation (a trace's token spans)
        let mut service: Option<(*const crate::model::Resource, &str)> = None;
        let mut last: Option<(&str, &str, u32)> = None;
        for s in rows {
            let ptr = std::sync::Arc::as_ptr(&s.resource);
            let svc = match service {
                Some((p, name)) if std::ptr::eq(p, ptr) => name,
                _ => {
                    let name = s.service_name();
                    service = Some((ptr, name));
                    name
                }
            };
            let op = match last {
                Some((ls, ln, op)) if std::ptr::eq(ls, svc) && ln == s.name => op,
                _ => {
                    let next = ops.len() as u32;
                    let op = *index.entry((svc, s.name.as_str())).or_insert(next);
                    if op == next {
                        ops.push((svc.to_owned(), s.name.clone()));
                    }
                    op
                }
            };
            last = Some((svc, &s.name, op));
            of_row.push(op);
        }
        Self { ops, of_row }
    }
}

/// Operation nodes, edges, roots and orphans of some spans.
#[derive(Clone, Debug, Default)]
pub struct OpRollup {
    /// The operations, in the order first seen; `nodes[i]` is `ops[i]`'s.
    pub ops: Vec<Op>,
    pub nodes: Vec<NodeStats>,
    /// (parent op, child op) → stats.
    pub edges: HashMap<(u32, u32), EdgeStats>,
    /// Summed duration of the root spans (no parent id), ns.
    pub roots_ns: u128,
    pub orphans: Vec<Orphan>,
    index: HashMap<Op, u32>,
    last: Option<u32>,
}

impl OpRollup {
    /// The index of an operation, added when new.
    pub fn op(&mut self, service: &str, name: &str) -> u32 {
        // rows of one operation come in runs (a trace's token spans): the last one first,
        // without building the key
        if let Some(&last) = self.last.as_ref()
            && let (s, n) = &self.ops[last as usize]
            && s == service
            && n == name
        {
            return last;
        }
        let i = self.op_owned((service.to_owned(), name.to_owned()));
        self.last = Some(i);
        i
    }

    fn op_owned(&mut self, op: Op) -> u32 {
        if let Some(&i) = self.index.get(&op) {
            return i;
        }
        let i = self.ops.len() as u32;
        self.index.insert(op.clone(), i);
        self.ops.push(op);
        self.nodes.push(NodeStats::default());
        i
    }

    /// Counts one span of operation `op`.
    pub fn add_span(&mut self, op: u32, error: bool, duration_ns: u64, root: bool) {
        let n = &mut self.nodes[op as usize];
        n.calls += 1;
        n.errors += u64::from(error);
        n.sum_ns += u128::from(duration_ns);
        n.durations.insert(duration_ns as f64);
        if root {
            self.roots_ns += u128::from(duration_ns);
        }
    }

    /// Counts one parent → child call (the child's duration).
    pub fn add_edge(&mut self, parent: u32, child: u32, duration_ns: u64) {
        let e = self.edges.entry((parent, child)).or_default();
        e.calls += 1;
        e.durations.insert(duration_ns as f64);
    }

    /// Adds `other` into `self` (its operations mapped onto this one's).
    pub fn absorb(&mut self, other: &OpRollup) {
        let map: Vec<u32> = other.ops.iter().map(|o| self.op_owned(o.clone())).collect();
        for (i, n) in other.nodes.iter().enumerate() {
            self.nodes[map[i] as usize].merge(n);
        }
        for (&(p, c), e) in &other.edges {
            self.edges
                .entry((map[p as usize], map[c as usize]))
                .or_default()
                .merge(e);
        }
        self.roots_ns += other.roots_ns;
        self.orphans.extend(other.orphans.iter().map(|o| Orphan {
            op: map[o.op as usize],
            ..*o
        }));
    }

    /// What the rollup takes in memory, about.
    pub fn weight(&self) -> usize {
        let ops: usize = self.ops.iter().map(|(s, n)| 64 + s.len() + n.len()).sum();
        let nodes: usize = self.nodes.iter().map(|n| 48 + n.durations.weight()).sum();
        let edges: usize = self.edges.values().map(|e| 24 + e.durations.weight()).sum();
        128 + ops * 2 + nodes + edges + self.orphans.len() * std::mem::size_of::<Orphan>()
    }

    /// The rollup of a block's rows: sorted by trace, `traces` their runs (first row, rows),
    /// `places` each row's parent within its run.
    pub fn of_block(
        rows: &[&SpanRecord],
        row_ops: &RowOps,
        traces: impl Iterator<Item = (u32, u32)>,
        places: &[ParentPlace],
    ) -> Self {
        let mut r = OpRollup::default();
        for op in &row_ops.ops {
            r.op_owned(op.clone());
        }
        let ops = &row_ops.of_row;
        // a trace's token spans are children of one span: their edge is the last one
        let mut edges: Vec<((u32, u32), EdgeStats)> = Vec::new();
        let mut edge_index: HashMap<(u32, u32), usize> = HashMap::default();
        let mut last_edge: Option<((u32, u32), usize)> = None;
        for (start, len) in traces {
            for row in start..start + len {
                let s = rows[row as usize];
                let op = ops[row as usize];
                let d = s.duration_ns();
                r.add_span(
                    op,
                    s.status_code == StatusCode::Error,
                    d,
                    s.parent_span_id.is_none(),
                );
                match (places[row as usize], s.parent_span_id) {
                    (ParentPlace::At(p), _) => {
                        let key = (ops[(start + p) as usize], op);
                        let at = match last_edge {
                            Some((k, at)) if k == key => at,
                            _ => *edge_index.entry(key).or_insert_with(|| {
                                edges.push((key, EdgeStats::default()));
                                edges.len() - 1
                            }),
                        };
                        last_edge = Some((key, at));
                        let e = &mut edges[at].1;
                        e.calls += 1;
                        e.durations.insert(d as f64);
                    }
                    (ParentPlace::Missing, Some(parent)) => r.orphans.push(Orphan {
                        trace: s.trace_id,
                        parent,
                        op,
                        duration_ns: d,
                    }),
                    _ => {}
                }
            }
        }
        r.edges = edges.into_iter().collect();
        r
    }

    /// The rollup of spans in any order (head rows): parents found by (trace, span id).
    pub fn of_spans(spans: &[&SpanRecord]) -> Self {
        let mut r = OpRollup::default();
        let mut by_id: HashMap<(TraceId, SpanId), u32> = HashMap::default();
        for s in spans {
            let op = r.op(s.service_name(), &s.name);
            by_id.insert((s.trace_id, s.span_id), op);
        }
        for s in spans {
            let op = by_id[&(s.trace_id, s.span_id)];
            let d = s.duration_ns();
            r.add_span(
                op,
                s.status_code == StatusCode::Error,
                d,
                s.parent_span_id.is_none(),
            );
            if let Some(parent) = s.parent_span_id {
                match by_id.get(&(s.trace_id, parent)) {
                    Some(&p) => r.add_edge(p, op, d),
                    None => r.orphans.push(Orphan {
                        trace: s.trace_id,
                        parent,
                        op,
                        duration_ns: d,
                    }),
                }
            }
        }
        r
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.buf.push(ROLLUP_VERSION);
        w.u64(self.ops.len() as u64);
        for ((service, name), n) in self.ops.iter().zip(&self.nodes) {
            w.str(service);
            w.str(name);
            w.u64(n.calls);
            w.u64(n.errors);
            write_u128(&mut w, n.sum_ns);
            n.durations.encode(&mut w);
        }
        let mut edges: Vec<_> = self.edges.iter().collect();
        edges.sort_by_key(|(k, _)| **k);
        w.u64(edges.len() as u64);
        for ((p, c), e) in edges {
            w.u64((*p).into());
            w.u64((*c).into());
            w.u64(e.calls);
            e.durations.encode(&mut w);
        }
        write_u128(&mut w, self.roots_ns);
        w.u64(self.orphans.len() as u64);
        for o in &self.orphans {
            w.raw(&o.trace.0);
            w.raw(&o.parent.0);
            w.u64(o.op.into());
            w.u64(o.duration_ns);
        }
        w.buf
    }

    pub fn decode(buf: &[u8]) -> Result<Self> {
        let buf = &*crate::block::format::unpack_rollup(buf, "operation rollup")?;
        let mut r = Reader::new(buf);
        let version = r.u8()?;
        if version != ROLLUP_VERSION {
            return Err(StorageError::corrupt(
                "operation rollup",
                format!("version {version}, this build reads {ROLLUP_VERSION}"),
            ));
        }
        let mut out = OpRollup::default();
        let ops = r.u64()?;
        for _ in 0..ops {
            let op = (r.string()?, r.string()?);
            let i = out.op_owned(op);
            let n = &mut out.nodes[i as usize];
            n.calls = r.u64()?;
            n.errors = r.u64()?;
            n.sum_ns = read_u128(&mut r)?;
            n.durations = Sketch::decode(&mut r)?;
        }
        let op = |r: &mut Reader| -> Result<u32> {
            let i = r.u64()?;
            if i >= ops {
                return Err(StorageError::corrupt(
                    "operation rollup",
                    format!("operation {i} of {ops}"),
                ));
            }
            Ok(i as u32)
        };
        for _ in 0..r.u64()? {
            let key = (op(&mut r)?, op(&mut r)?);
            let calls = r.u64()?;
            let durations = Sketch::decode(&mut r)?;
            out.edges.insert(key, EdgeStats { calls, durations });
        }
        out.roots_ns = read_u128(&mut r)?;
        for _ in 0..r.u64()? {
            let trace = TraceId(r.raw(16)?.try_into().expect("16 bytes"));
            let parent = SpanId(r.raw(8)?.try_into().expect("8 bytes"));
            out.orphans.push(Orphan {
                trace,
                parent,
                op: op(&mut r)?,
                duration_ns: r.u64()?,
            });
        }
        Ok(out)
    }
}

fn write_u128(w: &mut Writer, v: u128) {
    w.u64((v >> 64) as u64);
    w.u64(v as u64);
}

fn read_u128(r: &mut Reader) -> Result<u128> {
    Ok((u128::from(r.u64()?) << 64) | u128::from(r.u64()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::UnixNanos;

    fn span(trace: u8, id: u8, parent: Option<u8>, name: &str, d: u64) -> SpanRecord {
        SpanRecord {
            trace_id: TraceId([trace; 16]),
            span_id: SpanId([id; 8]),
            parent_span_id: parent.map(|p| SpanId([p; 8])),
            name: name.into(),
            start: UnixNanos(1_000),
            end: UnixNanos(1_000 + d),
            status_code: if d > 50 {
                StatusCode::Error
            } else {
                StatusCode::Unset
            },
            ..Default::default()
        }
    }

    #[test]
    fn spans_roll_up_and_read_back_as_written() {
        let spans = [
            span(1, 1, None, "root", 100),
            span(1, 2, Some(1), "call", 40),
            span(1, 3, Some(2), "leaf", 10),
            span(1, 4, Some(9), "leaf", 20),
            span(2, 1, None, "root", 60),
        ];
        let all: Vec<&SpanRecord> = spans.iter().collect();
        let r = OpRollup::of_spans(&all);
        assert_eq!(r.ops.len(), 3);
        let root = r.ops.iter().position(|o| o.1 == "root").unwrap();
        let leaf = r.ops.iter().position(|o| o.1 == "leaf").unwrap() as u32;
        assert_eq!(r.nodes[root].calls, 2);
        assert_eq!(r.nodes[root].errors, 2);
        assert_eq!(r.nodes[root].sum_ns, 160);
        assert_eq!(r.roots_ns, 160);
        assert_eq!(r.edges.len(), 2);
        assert_eq!(
            r.orphans,
            vec![Orphan {
                trace: TraceId([1; 16]),
                parent: SpanId([9; 8]),
                op: leaf,
                duration_ns: 20
            }]
        );
        let back = OpRollup::decode(&r.encode()).unwrap();
        assert_eq!(back.ops, r.ops);
        assert_eq!(back.nodes, r.nodes);
        assert_eq!(back.edges, r.edges);
        assert_eq!(back.orphans, r.orphans);
        // merging two halves is the rollup of the whole, orphans aside
        let mut halves = OpRollup::of_spans(&all[3..]);
        halves.absorb(&OpRollup::of_spans(&all[..3]));
        assert_eq!(halves.roots_ns, r.roots_ns);
        let calls = |x: &OpRollup, name: &str| {
            let i = x.ops.iter().position(|o| o.1 == name).unwrap();
            (x.nodes[i].calls, x.nodes[i].sum_ns)
        };
        for name in ["root", "call", "leaf"] {
            assert_eq!(calls(&halves, name), calls(&r, name));
        }
        assert!(OpRollup::decode(&[9]).is_err());
    }
}
