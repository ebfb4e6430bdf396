//! The resolution against a naive model: walk each span's ancestors one by one.

use std::sync::Arc;

use proptest::collection::vec;
use proptest::prelude::*;

use super::*;
use crate::model::{KeyValue, Resource, Scope, SpanKind, StatusCode, TraceId, UnixNanos};

fn span(id: u64, parent: Option<u64>, attrs: &[(&str, Value)]) -> SpanRecord {
    SpanRecord {
        trace_id: TraceId([7; 16]),
        span_id: SpanId(id.to_be_bytes()),
        parent_span_id: parent.map(|p| SpanId(p.to_be_bytes())),
        trace_state: String::new(),
        flags: 0,
        name: format!("s{id}"),
        kind: SpanKind::Internal,
        start: UnixNanos(id),
        end: UnixNanos(id + 1),
        attributes: attrs
            .iter()
            .map(|(k, v)| KeyValue {
                key: (*k).to_owned(),
                value: v.clone(),
            })
            .collect(),
        dropped_attributes_count: 0,
        events: Vec::new(),
        dropped_events_count: 0,
        links: Vec::new(),
        dropped_links_count: 0,
        status_code: StatusCode::Unset,
        status_message: String::new(),
        resource: Arc::new(Resource::default()),
        scope: Arc::new(Scope::default()),
    }
}

/// The nearest value of dedicated column `d` on a span or its ancestors, one step at a time.
fn naive(spans: &[&SpanRecord], at: usize, d: usize) -> Option<Value> {
    let mut cur = spans[at];
    for _ in 0..=spans.len() {
        if let Some(v) = dedicated_value(cur, d) {
            return Some(v.clone());
        }
        let parent = cur.parent_span_id?;
        cur = spans.iter().find(|s| s.span_id == parent)?;
    }
    None
}

fn position(d: &str) -> usize {
    DEDICATED.iter().position(|x| x.name == d).unwrap()
}

#[test]
fn a_retry_gives_each_token_its_own_attempt() {
    let v = |s: &str| Value::Str(s.into());
    let spans = [
        span(1, None, &[("llm.model_version", v("v1"))]),
        span(2, Some(1), &[("worker.id", v("w-1"))]),
        span(3, Some(2), &[("llm.token.index", Value::Int(0))]),
        span(4, Some(1), &[("worker.id", v("w-7"))]),
        span(5, Some(4), &[]),
        span(6, Some(99), &[]),
        span(7, Some(6), &[]),
    ];
    let refs: Vec<&SpanRecord> = spans.iter().collect();
    let resolved = resolve(&refs);
    let slot = |d: &str| {
        request_dims()
            .iter()
            .position(|&i| i == position(d))
            .unwrap()
    };
    let (worker, version) = (slot("worker.id"), slot("llm.model_version"));
    assert_eq!(resolved[2].values[worker], Some(&v("w-1")));
    assert_eq!(resolved[4].values[worker], Some(&v("w-7")));
    assert_eq!(resolved[4].values[version], Some(&v("v1")));
    assert!(!resolved[4].open);
    assert_eq!(resolved[5].values[worker], None);
    assert!(resolved[5].open, "its parent is not among the spans");
    // the span left by is the parent of the topmost ancestor among them
    let missing = Some(SpanId(99u64.to_be_bytes()));
    assert_eq!((resolved[5].exit, resolved[6].exit), (missing, missing));
    assert!(resolved[6].open);
    assert_eq!(resolved[4].exit, None);
}

#[test]
fn a_parent_cycle_ends_the_walk() {
    let spans = [
        span(1, Some(2), &[("worker.id", Value::Str("w".into()))]),
        span(2, Some(1), &[]),
    ];
    let refs: Vec<&SpanRecord> = spans.iter().collect();
    let resolved = resolve(&refs);
    assert_eq!(resolved.len(), 2);
    assert!(resolved.iter().all(|r| !r.open));
}

proptest! {
    #[test]
    fn resolution_matches_a_naive_walk(
        tree in vec((0usize..40, 0u8..3, 0u8..3, 0u8..3, any::<u16>()), 1..40)
    ) {
        let dims = ["llm.model_version", "worker.id", "llm.batch_size"];
        let spans: Vec<SpanRecord> = tree
            .iter()
            .enumerate()
            .map(|(i, &(parent, kind, a, b, _))| {
                // parent: none, an earlier span (so no cycle), or one that is not there
                let parent = match kind {
                    0 => None,
                    1 => Some((parent % (i + 1)) as u64),
                    _ => Some(1000 + parent as u64),
                };
                let mut attrs = Vec::new();
                if a > 0 {
                    attrs.push((dims[0], Value::Str(format!("v{a}"))));
                }
                if b == 1 {
                    attrs.push((dims[1], Value::Str(format!("w{b}"))));
                }
                if b == 2 {
                    // the wrong type is not the column's value
                    attrs.push((dims[2], Value::Str("eight".into())));
                    attrs.push((dims[2], Value::Int(8)));
                }
                span(i as u64 + 1, parent.filter(|&p| p != i as u64 + 1), &attrs)
            })
            .collect();
        // in any order: children often arrive before their parents
        let mut refs: Vec<&SpanRecord> = spans.iter().collect();
        refs.sort_by_key(|s| tree[s.start.0 as usize - 1].4);
        let resolved = resolve(&refs);
        for (at, r) in resolved.iter().enumerate() {
            for (slot, &d) in request_dims().iter().enumerate() {
                prop_assert_eq!(r.values[slot].cloned(), naive(&refs, at, d));
            }
        }
    }
}
