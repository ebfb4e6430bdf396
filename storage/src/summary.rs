//! A trace's summary, computed here for every reader (search, the `traces` table): the root is
//! the earliest span without a parent (ties by span id), the start the earliest start, the end
//! the latest end, with span and error counts. It is built from the trace's entries in block
//! trace summaries (each block's part of the trace, summarised when the block was written) and
//! from single spans (head rows; rows of a block that straddles a retention cutoff), in any
//! order: the result is the same.

use crate::block::TraceEntry;
use crate::model::{SpanId, SpanRecord, StatusCode, TraceId};

/// The root span of a trace (or of a block's part of it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRoot {
    pub start: u64,
    pub span_id: SpanId,
    pub service: String,
    pub name: String,
}

impl TraceRoot {
    fn of(span: &SpanRecord) -> Self {
        Self {
            start: span.start.0,
            span_id: span.span_id,
            service: span.service_name().to_owned(),
            name: span.name.clone(),
        }
    }

    fn precedes(&self, other: &TraceRoot) -> bool {
        (self.start, self.span_id) < (other.start, other.span_id)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceSummary {
    pub trace_id: TraceId,
    pub root: Option<TraceRoot>,
    pub start: u64,
    pub end: u64,
    pub spans: u64,
    pub errors: u64,
}

impl TraceSummary {
    pub fn duration_ns(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// Accumulates a trace's parts into its summary.
#[derive(Clone, Debug, Default)]
pub struct SummaryBuilder {
    start: Option<u64>,
    end: u64,
    spans: u64,
    errors: u64,
    root: Option<TraceRoot>,
}

impl SummaryBuilder {
    pub fn add_entry(&mut self, e: &TraceEntry) {
        self.add(e.min_start, e.max_end, e.rows.into(), e.errors.into());
        if let Some(r) = &e.root {
            self.offer_root(r);
        }
    }

    pub fn add_span(&mut self, s: &SpanRecord) {
        self.add(
            s.start.0,
            s.end.0,
            1,
            u64::from(s.status_code == StatusCode::Error),
        );
        if s.parent_span_id.is_none() {
            let root = TraceRoot::of(s);
            if self.root.as_ref().is_none_or(|r| root.precedes(r)) {
                self.root = Some(root);
            }
        }
    }

    fn offer_root(&mut self, root: &TraceRoot) {
        if self.root.as_ref().is_none_or(|r| root.precedes(r)) {
            self.root = Some(root.clone());
        }
    }

    fn add(&mut self, start: u64, end: u64, spans: u64, errors: u64) {
        self.start = Some(self.start.map_or(start, |s| s.min(start)));
        self.end = self.end.max(end);
        self.spans += spans;
        self.errors += errors;
    }

    /// The summary, or `None` when nothing was added.
    pub fn finish(self, trace_id: TraceId) -> Option<TraceSummary> {
        Some(TraceSummary {
            trace_id,
            root: self.root,
            start: self.start?,
            end: self.end,
            spans: self.spans,
            errors: self.errors,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::UnixNanos;

    fn span(id: u8, parent: bool, start: u64) -> SpanRecord {
        SpanRecord {
            span_id: SpanId([id; 8]),
            parent_span_id: parent.then_some(SpanId([9; 8])),
            name: format!("s{id}"),
            start: UnixNanos(start),
            end: UnixNanos(start + 10),
            ..Default::default()
        }
    }

    #[test]
    fn the_earliest_root_wins_ties_by_span_id_in_any_order() {
        let spans = [
            span(3, false, 5),
            span(2, false, 5),
            span(1, true, 1),
            span(4, false, 9),
        ];
        let mut orders = vec![spans.to_vec()];
        orders.push(spans.iter().rev().cloned().collect());
        for order in orders {
            let mut b = SummaryBuilder::default();
            for s in &order {
                b.add_span(s);
            }
            let sum = b.finish(TraceId([1; 16])).unwrap();
            assert_eq!(sum.root.unwrap().name, "s2");
            assert_eq!((sum.start, sum.end, sum.spans), (1, 19, 4));
        }
        let mut none = SummaryBuilder::default();
        none.add_span(&span(1, true, 1));
        assert_eq!(none.finish(TraceId([1; 16])).unwrap().root, None);
        assert_eq!(SummaryBuilder::default().finish(TraceId([1; 16])), None);
    }
}
