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

use std::sync::OnceLock;

use rustc_hash::FxHashMap;

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

/// Whether a span carries a request value itself (then it is an anchor of its block's request
/// rollup, [`crate::requests`]).
pub fn carries(span: &SpanRecord) -> bool {
    span.attributes.iter().any(|kv| {
        dedicated_for(&kv.key).is_some_and(|(col, _)| request_slot(col, &kv.value).is_some())
    })
}

/// One span's request values, one per [`request_dims`] entry, and whether its ancestry left
/// the spans it was resolved over: then `exit` is the parent id it left by (the parent of its
/// topmost ancestor among them), the span whose values fill the ones it lacks.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved<'a> {
    pub values: Vec<Option<&'a Value>>,
    pub open: bool,
    pub exit: Option<SpanId>,
}

/// Resolves the request values of spans of one trace (in any order) over those spans alone.
/// A parent cycle (hostile input) ends the walk where it closes.
pub fn resolve<'a>(spans: &[&'a SpanRecord]) -> Vec<Resolved<'a>> {
    let ids: Vec<SpanId> = spans.iter().map(|s| s.span_id).collect();
    let parents: Vec<Option<SpanId>> = spans.iter().map(|s| s.parent_span_id).collect();
    resolve_with(spans, &parent_places(&ids, &parents).0)
}

/// [`resolve`], given where each span's parent is among them ([`parent_places`]).
pub fn resolve_with<'a>(spans: &[&'a SpanRecord], places: &[ParentPlace]) -> Vec<Resolved<'a>> {
    let d = request_dims().len();
    // each span's own values, one pass over its attributes
    let mut values: Vec<Option<&'a Value>> = vec![None; spans.len() * d];
    for (i, span) in spans.iter().enumerate() {
        for kv in &span.attributes {
            if let Some((col, _)) = dedicated_for(&kv.key)
                && let Some(slot) = request_slot(col, &kv.value)
                && values[i * d + slot].is_none()
            {
                values[i * d + slot] = Some(&kv.value);
            }
        }
    }
    let exits = resolve_places(places, &mut values, d);
    values
        .chunks(d.max(1))
        .zip(exits)
        .map(|(v, exit)| Resolved {
            values: v.to_vec(),
            open: exit.is_some(),
            exit: exit.and_then(|top| spans[top as usize].parent_span_id),
        })
        .take(spans.len())
        .collect()
}

/// Where a span's parent is among the spans it is resolved over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParentPlace {
    /// It has no parent.
    Root,
    /// Its parent is the span at this place.
    At(u32),
    /// Its parent is not among them: its ancestry leaves them.
    Missing,
}

/// Each span's [`ParentPlace`] among `ids` (a span id held twice names its last holder), and
/// whether every id is held once.
pub fn parent_places(ids: &[SpanId], parents: &[Option<SpanId>]) -> (Vec<ParentPlace>, bool) {
    let by_id: FxHashMap<SpanId, u32> = ids
        .iter()
        .enumerate()
        .map(|(i, s)| (*s, i as u32))
        .collect();
    let places = parents
        .iter()
        .map(|p| match p.map(|p| by_id.get(&p)) {
            None => ParentPlace::Root,
            Some(Some(&at)) => ParentPlace::At(at),
            Some(None) => ParentPlace::Missing,
        })
        .collect();
    (places, by_id.len() == ids.len())
}

/// The resolution itself, over spans given as ids, parents and `d` own values each (`values`,
/// row-major, any copyable value or reference to one): fills each span's missing values from
/// its nearest ancestor's and returns whether each span's ancestry left the spans given.
pub fn resolve_links<T: Copy>(
    ids: &[SpanId],
    parents: &[Option<SpanId>],
    values: &mut [Option<T>],
    d: usize,
) -> Vec<bool> {
    resolve_places(&parent_places(ids, parents).0, values, d)
        .into_iter()
        .map(|exit| exit.is_some())
        .collect()
}

/// [`resolve_links`] over the spans' parent places; for each span whose ancestry leaves them,
/// the place of its topmost ancestor among them (whose parent is missing; the span itself
/// when its own parent is), `None` for the others.
pub fn resolve_places<T: Copy>(
    parents: &[ParentPlace],
    values: &mut [Option<T>],
    d: usize,
) -> Vec<Option<u32>> {
    let n = parents.len();
    const TODO: u8 = 0;
    const ON_PATH: u8 = 1;
    const DONE: u8 = 2;
    let mut state = vec![TODO; n];
    let mut exit: Vec<Option<u32>> = vec![None; n];
    let mut path: Vec<usize> = Vec::new();
    for start in 0..n {
        // walk up to a resolved span, a root, a missing parent or a cycle
        let mut at = start;
        let above: Option<usize> = loop {
            if state[at] == DONE {
                break Some(at);
            }
            path.push(at);
            state[at] = ON_PATH;
            match parents[at] {
                ParentPlace::At(next) if state[next as usize] != ON_PATH => at = next as usize,
                ParentPlace::Missing => {
                    exit[at] = Some(at as u32);
                    break None;
                }
                // a root, or a cycle closing
                _ => break None,
            }
        };
        // then down again, each span taking its ancestors' values where it has none
        let mut above = above;
        while let Some(i) = path.pop() {
            if let Some(a) = above {
                exit[i] = exit[a];
                for slot in 0..d {
                    if values[i * d + slot].is_none() {
                        values[i * d + slot] = values[a * d + slot];
                    }
                }
            }
            state[i] = DONE;
            above = Some(i);
        }
    }
    exit
}

/// The slot among [`request_dims`] that a value of dedicated column `col` fills: `col` is a
/// request dimension and the value is of its type. A span's own value of a dimension is the
/// first of its attributes that fills the dimension's slot.
pub fn request_slot(col: usize, value: &Value) -> Option<usize> {
    slot_of(col).filter(|_| ColumnType::of(value) == Some(DEDICATED[col].ty))
}

/// The slot among [`request_dims`] of dedicated column `col`, if it is one.
fn slot_of(col: usize) -> Option<usize> {
    static SLOTS: OnceLock<Vec<Option<usize>>> = OnceLock::new();
    SLOTS.get_or_init(|| {
        (0..DEDICATED.len())
            .map(|c| request_dims().iter().position(|&d| d == c))
            .collect()
    })[col]
}

#[cfg(test)]
mod tests;
