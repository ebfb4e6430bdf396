//! Request dimensions: the LLM dimensions (model version, LoRA adapter, worker, …) that a
//! request's generate span carries, asked of every span of the request. A span's request value
//! of dimension `D` is its own value of `D`, else its nearest ancestor's that has one, else
//! none. Token spans carry only their own attributes; "decode tokens of model version X on
//! worker Y" needs their generate span's values, and a retried request (two generate spans on
//! two workers in one trace) must give each token the worker of its own attempt.
//!
//! A block resolves its rows over the rows of the same trace it holds and indexes the answer as
//! postings, one dimension `request:D` per dimension (term → rows). A row whose ancestry leaves
//! the block (its parent, or an ancestor's, is not in it) is also in the `request?` postings
//! under [`OPEN_TERM`]: when the trace has rows elsewhere (another block, the head) a reader
//! resolves such rows again over the whole trace ([`crate::Store::resolve_traces`]). Blocks
//! written before request postings existed have no `request?` postings at all.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::model::{SpanId, SpanRecord, Value};
use crate::schema::{ColumnType, DEDICATED, dedicated_for};

/// Prefix of the postings dimension of a request dimension: `request:llm.model_version`.
pub const REQUEST_PREFIX: &str = "request:";
/// Postings dimension marking rows whose ancestry leaves their block.
pub const OPEN_DIM: &str = "request?";
/// The one term of [`OPEN_DIM`].
pub const OPEN_TERM: &str = "open";

/// The dedicated columns that are request dimensions (the indexed ones), in column order.
pub fn request_dims() -> &'static [usize] {
    static DIMS: OnceLock<Vec<usize>> = OnceLock::new();
    DIMS.get_or_init(|| {
        DEDICATED
            .iter()
            .enumerate()
            .filter(|(_, d)| d.indexed)
            .map(|(i, _)| i)
            .collect()
    })
}

/// The postings dimension of request dimension `i` (an index into [`DEDICATED`]).
pub fn request_dim_name(i: usize) -> &'static str {
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        DEDICATED
            .iter()
            .map(|d| format!("{REQUEST_PREFIX}{}", d.name))
            .collect()
    });
    &names[i]
}

/// A span's value of dedicated column `i` as a block stores (and indexes) it: the first value
/// sent under the column's name or alias that has the column's type.
pub fn dedicated_value(r: &SpanRecord, i: usize) -> Option<&Value> {
    r.attributes
        .iter()
        .find(|kv| {
            dedicated_for(&kv.key).is_some_and(|(j, _)| j == i)
                && ColumnType::of(&kv.value) == Some(DEDICATED[i].ty)
        })
        .map(|kv| &kv.value)
}

/// One span's request values, one per [`request_dims`] entry, and whether its ancestry left
/// the spans it was resolved over.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved<'a> {
    pub values: Vec<Option<&'a Value>>,
    pub open: bool,
}

/// Resolves the request values of spans of one trace (in any order) over those spans alone.
/// A parent cycle (hostile input) ends the walk where it closes.
pub fn resolve<'a>(spans: &[&'a SpanRecord]) -> Vec<Resolved<'a>> {
    let dims = request_dims();
    let by_id: HashMap<SpanId, usize> = spans
        .iter()
        .enumerate()
        .map(|(i, s)| (s.span_id, i))
        .collect();
    let mut memo: Vec<Option<Resolved<'a>>> = vec![None; spans.len()];
    let mut on_path = vec![false; spans.len()];
    let mut path = Vec::new();
    for start in 0..spans.len() {
        // walk up to a resolved span, a root, a missing parent or a cycle
        let mut at = start;
        let mut above = loop {
            if let Some(r) = &memo[at] {
                break r.clone();
            }
            path.push(at);
            on_path[at] = true;
            match spans[at].parent_span_id {
                None => {
                    break Resolved {
                        values: vec![None; dims.len()],
                        open: false,
                    };
                }
                Some(p) => match by_id.get(&p) {
                    Some(&next) if !on_path[next] => at = next,
                    Some(_) => {
                        break Resolved {
                            values: vec![None; dims.len()],
                            open: false,
                        };
                    }
                    None => {
                        break Resolved {
                            values: vec![None; dims.len()],
                            open: true,
                        };
                    }
                },
            }
        };
        // then down again, each span taking its own values over its ancestors'
        while let Some(i) = path.pop() {
            on_path[i] = false;
            for (slot, &d) in above.values.iter_mut().zip(dims) {
                if let Some(v) = dedicated_value(spans[i], d) {
                    *slot = Some(v);
                }
            }
            memo[i] = Some(above.clone());
        }
    }
    memo.into_iter()
        .map(|r| r.expect("every span resolved"))
        .collect()
}

#[cfg(test)]
mod tests;
