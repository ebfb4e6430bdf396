//! Property tests of the persisted formats against naive models: the head codec round-trips any
//! spans; a block built from any spans reads back the same spans; its postings hold exactly the
//! rows a linear scan finds.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use proptest::collection::vec;
use proptest::prelude::*;
use roaring::RoaringBitmap;

use super::BlockReader;
use super::format::decode_postings;
use super::reader::{ChunkSource, Postings, Rows, TraceRuns};
use super::writer::build_block;
use crate::codec::{decode_spans, encode_spans};
use crate::error::Result;
use crate::model::*;
use crate::schema::DIM_NAME;

/// A built block held in memory, read as the store reads one.
struct Mem {
    chunks: HashMap<String, Bytes>,
    postings: HashMap<String, Arc<Postings>>,
    runs: Arc<TraceRuns>,
}

impl ChunkSource for Mem {
    fn chunk(&self, column: &str) -> Result<Option<Bytes>> {
        Ok(self.chunks.get(column).cloned())
    }
    fn trace_runs(&self) -> Result<Option<Arc<TraceRuns>>> {
        Ok(Some(self.runs.clone()))
    }
    fn postings(&self, dim: &str) -> Result<Option<Arc<Postings>>> {
        Ok(Some(self.postings.get(dim).cloned().unwrap_or_default()))
    }
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        "[a-z]{0,6}".prop_map(Value::Str),
        any::<i64>().prop_map(Value::Int),
        (-1e6f64..1e6).prop_map(Value::Double),
        any::<bool>().prop_map(Value::Bool),
    ]
}

fn span() -> impl Strategy<Value = SpanRecord> {
    (
        (0u8..4, 1u64..u64::MAX, any::<bool>()),
        (0usize..3, 0u64..10_000_000_000, 0u64..2_000_000_000),
        (
            proptest::option::of(prop_oneof![Just("v1"), Just("v2")]),
            proptest::option::of(0i64..500),
            vec(("[a-c]{1,2}", value()), 0..3),
        ),
    )
        .prop_map(
            |((trace, id, root), (name, start, duration), (version, token, extra))| {
                let mut attributes: Vec<KeyValue> = extra
                    .into_iter()
                    .map(|(k, v)| KeyValue::new(format!("x.{k}"), v))
                    .collect();
                attributes.dedup_by(|a, b| a.key == b.key);
                if let Some(v) = version {
                    attributes.push(KeyValue::new("llm.model_version", Value::Str(v.into())));
                }
                if let Some(t) = token {
                    attributes.push(KeyValue::new("llm.token.index", Value::Int(t)));
                }
                SpanRecord {
                    trace_id: TraceId([trace + 1; 16]),
                    span_id: SpanId(id.to_be_bytes()),
                    parent_span_id: (!root).then_some(SpanId([7; 8])),
                    name: ["llm.generate", "llm.decode.token", "tokenize"][name].into(),
                    start: UnixNanos(1_700_000_000_000_000_000 + start),
                    end: UnixNanos(1_700_000_000_000_000_000 + start + duration),
                    attributes,
                    ..Default::default()
                }
            },
        )
}

/// Distinct spans in block order (trace, start, span id).
fn block_order(mut spans: Vec<SpanRecord>) -> Vec<SpanRecord> {
    spans.sort_by_key(|s| (s.trace_id, s.start, s.span_id));
    spans.dedup_by_key(|s| (s.trace_id, s.span_id));
    for s in &mut spans {
        s.attributes.sort_by(|a, b| a.key.cmp(&b.key));
    }
    spans
}

fn memory_block(spans: &[SpanRecord]) -> (super::BlockMeta, Mem) {
    let built = build_block(spans.iter().collect()).unwrap();
    let mem = Mem {
        chunks: built
            .chunks
            .into_iter()
            .map(|(c, b)| (c, Bytes::from(b)))
            .collect(),
        postings: built
            .postings
            .iter()
            .map(|(d, b)| (d.clone(), Arc::new(decode_postings(b).unwrap())))
            .collect(),
        runs: Arc::new(TraceRuns::new(
            built
                .traces
                .iter()
                .map(|t| (t.row_start, t.trace_id))
                .collect(),
        )),
    };
    (built.meta, mem)
}

/// Postings alone, for reading a postings dimension's terms.
struct OnlyPostings(Arc<Postings>);

impl ChunkSource for OnlyPostings {
    fn chunk(&self, _column: &str) -> Result<Option<Bytes>> {
        Ok(None)
    }
    fn postings(&self, _dim: &str) -> Result<Option<Arc<Postings>>> {
        Ok(Some(self.0.clone()))
    }
}

/// Up to 15 traces of up to 60 spans each, span ids drawn so that now and then a trace holds
/// one id twice, each span's parent an earlier span of its trace, a foreign id, or none.
fn trees() -> impl Strategy<Value = Vec<SpanRecord>> {
    vec(
        vec((1u64..60_000, 0u8..4, any::<prop::sample::Index>()), 1..60),
        1..16,
    )
    .prop_map(|traces| {
        let mut spans: Vec<SpanRecord> = Vec::new();
        for (t, trace) in traces.into_iter().enumerate() {
            let first = spans.len();
            for (i, (id, parent, pick)) in trace.into_iter().enumerate() {
                let parent_span_id = match parent {
                    0 => None,
                    1 => Some(SpanId([0xee; 8])),
                    _ if i == 0 => None,
                    _ => Some(spans[first + pick.index(i)].span_id),
                };
                spans.push(SpanRecord {
                    trace_id: TraceId([t as u8 + 1; 16]),
                    span_id: SpanId(id.to_be_bytes()),
                    parent_span_id,
                    name: "s".into(),
                    start: UnixNanos(1_700_000_000_000_000_000 + i as u64 * 1_000),
                    end: UnixNanos(1_700_000_000_000_000_000 + i as u64 * 1_000 + 500),
                    ..Default::default()
                });
            }
        }
        spans
    })
}

/// Blocks of 500 to 3,600 rows: traces of a few request spans (random names, times,
/// durations and request attributes) and a run of token spans (a token index each, and now
/// and then a model version), the tokens most often at least four rows in five.
fn token_blocks() -> impl Strategy<Value = Vec<SpanRecord>> {
    type Request = (usize, u64, u64, Option<&'static str>, Option<f64>);
    vec(
        (
            vec(
                (
                    0usize..4,
                    0u64..5_000_000_000,
                    0u64..3_000_000_000,
                    proptest::option::of(prop_oneof![Just("v1"), Just("v2")]),
                    proptest::option::of(0.0f64..3.0),
                ),
                1..12,
            ),
            60usize..260,
            0u64..1_000_000,
            prop::option::weighted(0.1, Just("v3")),
        ),
        8..14,
    )
    .prop_map(|traces| {
        let mut spans = Vec::new();
        let base = 1_700_000_000_000_000_000u64;
        for (t, (requests, tokens, gap, token_version)) in traces.into_iter().enumerate() {
            let trace_id = TraceId([t as u8 + 1; 16]);
            let mut id = 0u64;
            let mut next = |spans: &mut Vec<SpanRecord>,
                            (name, start, d, version, ttft): Request,
                            token: Option<i64>| {
                id += 1;
                let mut attributes = Vec::new();
                if let Some(v) = version {
                    attributes.push(KeyValue::new("llm.model_version", Value::Str(v.into())));
                }
                if let Some(s) = ttft {
                    attributes.push(KeyValue::new(
                        "gen_ai.latency.time_to_first_token",
                        Value::Double(s),
                    ));
                    attributes.push(KeyValue::new("x.request", Value::Int(id as i64)));
                }
                if let Some(i) = token {
                    attributes.push(KeyValue::new("llm.token.index", Value::Int(i)));
                }
                spans.push(SpanRecord {
                    trace_id,
                    span_id: SpanId(((t as u64) << 32 | id).to_be_bytes()),
                    parent_span_id: (id > 1).then_some(SpanId([9; 8])),
                    name: ["gen", "prefill", "call", "tok"][name].into(),
                    start: UnixNanos(base + start),
                    end: UnixNanos(base + start + d),
                    attributes,
                    ..Default::default()
                });
            };
            for request in requests {
                next(&mut spans, request, None);
            }
            for i in 0..tokens as u64 {
                let (start, d) = (2_000_000_000 + i * (30_000 + gap), 20_000 + gap);
                let version = token_version.filter(|_| i == 7);
                next(&mut spans, (3, start, d, version, None), Some(i as i64));
            }
        }
        block_order(spans)
    })
}

/// Rows in runs of 1 to 40, each run holding one of a few terms or none.
fn runs_of_terms() -> impl Strategy<Value = Vec<Option<u8>>> {
    vec((1usize..40, prop::option::weighted(0.8, 0u8..6)), 1..60)
        .prop_map(|runs| runs.into_iter().flat_map(|(n, t)| vec![t; n]).collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn postings_terms_give_each_row_its_term(
        held in runs_of_terms(),
        pick in vec(any::<bool>(), 0..2_400),
        range in (0u32..2_400, 0u32..2_400),
    ) {
        let total = held.len() as u32;
        let mut by_term: std::collections::BTreeMap<u8, RoaringBitmap> = Default::default();
        for (row, t) in held.iter().enumerate() {
            if let Some(t) = t {
                by_term.entry(*t).or_default().insert(row as u32);
            }
        }
        let postings: Postings = by_term
            .into_iter()
            .map(|(t, rows)| (format!("t{t}"), rows))
            .collect();
        let meta = crate::block::BlockMeta {
            rows: total,
            min_start: 0,
            max_start: 0,
            max_end: 0,
            columns: Vec::new(),
        };
        let reader = BlockReader::new(&meta, OnlyPostings(Arc::new(postings)));
        let set: RoaringBitmap = (0..total).filter(|&r| pick.get(r as usize) == Some(&true)).collect();
        let (start, len) = (range.0 % total, range.1 % total);
        let len = len.min(total - start);
        for rows in [Rows::All, Rows::Range(start, len), Rows::Set(set)] {
            let got = reader
                .postings_terms("d", &rows, &arrow::datatypes::DataType::Utf8)
                .unwrap();
            let got = got.as_any().downcast_ref::<arrow::array::StringArray>().unwrap();
            let got: Vec<Option<String>> = got.iter().map(|v| v.map(str::to_owned)).collect();
            let want: Vec<Option<String>> = rows
                .iter(total)
                .map(|r| held[r as usize].map(|t| format!("t{t}")))
                .collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn the_head_codec_round_trips_any_spans(spans in vec(span(), 0..40)) {
        prop_assert_eq!(decode_spans(&encode_spans(&spans)).unwrap(), spans);
    }

    #[test]
    fn a_block_reads_back_the_spans_it_was_built_from(spans in vec(span(), 1..150)) {
        let want = block_order(spans);
        let (meta, mem) = memory_block(&want);
        let reader = BlockReader::new(&meta, mem);
        let mut got = reader.spans(&Rows::All, true).unwrap();
        for s in &mut got {
            s.attributes.sort_by(|a, b| a.key.cmp(&b.key));
        }
        prop_assert_eq!(got, want);
    }

    #[test]
    fn span_ids_read_through_children_are_the_span_ids(
        spans in trees(),
        pick in vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let rows: Vec<SpanRecord> = {
            let mut rows = spans;
            rows.sort_by_key(|s| (s.trace_id, s.start, s.span_id));
            rows
        };
        let (meta, mem) = memory_block(&rows);
        // a few rows: at most an eighth of the block
        let set: RoaringBitmap = pick
            .iter()
            .take(rows.len() / 8)
            .map(|i| i.index(rows.len()) as u32)
            .collect();
        prop_assume!(!set.is_empty());
        let reader = BlockReader::new(&meta, mem);
        let want = reader
            .column(super::writer::col::SPAN_ID, &Rows::Set(set.clone()))
            .unwrap()
            .unwrap();
        let got = reader.span_id_column(&Rows::Set(set.clone())).unwrap();
        prop_assert_eq!(got.to_data(), want.to_data());
        // read without the span-id chunk whenever every row asked is a parent in its trace
        // and no trace holds an id twice (the writer then keeps parent ranks)
        let trace_of = |s: &SpanRecord| {
            let trace = s.trace_id;
            rows.iter().filter(move |o| o.trace_id == trace)
        };
        let unique = rows.iter().all(|s| trace_of(s).filter(|o| o.span_id == s.span_id).count() == 1);
        let parents = set.iter().all(|r| {
            let s = &rows[r as usize];
            trace_of(s).any(|o| o.parent_span_id == Some(s.span_id))
        });
        prop_assert_eq!(meta.column(super::writer::col::PARENT_RANK).is_some(), unique);
        if unique && parents {
            let (_, mut without) = memory_block(&rows);
            without.chunks.remove(super::writer::col::SPAN_ID);
            let got = BlockReader::new(&meta, without)
                .span_id_column(&Rows::Set(set))
                .unwrap();
            prop_assert_eq!(got.to_data(), want.to_data());
        }
    }

    #[test]
    fn times_of_any_rows_are_the_spans_times(
        rows in token_blocks(),
        pick in vec(any::<prop::sample::Index>(), 1..300),
        mixed in vec(any::<prop::sample::Index>(), 1..40),
    ) {
        use super::writer::{DOMINANT_SHARE, MINORITY_MIN_ROWS, col};
        let (meta, mem) = memory_block(&rows);
        let minor: Vec<u32> = (0..rows.len() as u32)
            .filter(|&r| rows[r as usize].name != "tok")
            .collect();
        let dominant = rows.len() >= MINORITY_MIN_ROWS
            && (rows.len() - minor.len()) as f64 >= DOMINANT_SHARE * rows.len() as f64;
        prop_assert_eq!(meta.column(col::MINOR_ROWS).is_some(), dominant && !minor.is_empty());
        let reader = BlockReader::new(&meta, mem);
        let of_minority: RoaringBitmap = if minor.is_empty() {
            RoaringBitmap::new()
        } else {
            pick.iter().map(|i| minor[i.index(minor.len())]).collect()
        };
        let any_rows: RoaringBitmap = mixed.iter().map(|i| i.index(rows.len()) as u32).collect();
        for set in [of_minority, any_rows] {
            let (starts, durations) = reader.times(&Rows::Set(set.clone())).unwrap();
            let want: Vec<(i64, i64)> = set
                .iter()
                .map(|r| {
                    let s = &rows[r as usize];
                    (s.start.0 as i64, s.duration_ns() as i64)
                })
                .collect();
            let got: Vec<(i64, i64)> = starts.iter().copied().zip(durations.iter().copied()).collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn columns_kept_over_minority_rows_read_back(
        rows in token_blocks(),
        pick in vec(any::<prop::sample::Index>(), 1..300),
        range in (any::<prop::sample::Index>(), 0u32..3_000),
    ) {
        use super::writer::col;
        let (meta, mem) = memory_block(&rows);
        let reader = BlockReader::new(&meta, mem);
        // whole spans, every attribute where it was
        let mut got = reader.spans(&Rows::All, true).unwrap();
        for s in &mut got {
            s.attributes.sort_by(|a, b| a.key.cmp(&b.key));
        }
        prop_assert_eq!(&got, &rows);
        // an attribute on request spans alone is kept over the minority rows, when the block
        // has them; one that a token also holds (v3) is not
        let minority = meta.column(col::MINOR_ROWS).is_some();
        let on_tokens = |key: &str| {
            rows.iter()
                .any(|s| s.name == "tok" && s.attribute(key).is_some())
        };
        let version = format!("{}llm.model_version", col::DEDICATED_PREFIX);
        if let Some(c) = meta.column(&version) {
            prop_assert_eq!(c.minority, minority && !on_tokens("llm.model_version"));
        }
        if let Some(c) = meta.column(&format!("{}x.request", col::DYNAMIC_PREFIX)) {
            prop_assert_eq!(c.minority, minority && !on_tokens("x.request"));
        }
        let ttft = format!("{}gen_ai.latency.time_to_first_token", col::DEDICATED_PREFIX);
        let set: RoaringBitmap = pick.iter().map(|i| i.index(rows.len()) as u32).collect();
        let start = range.0.index(rows.len()) as u32;
        let len = range.1.min(rows.len() as u32 - start);
        // request rows only (each found by a walk), any rows (by rank), a range (maybe empty), all
        let requests: Vec<u32> = (0..rows.len() as u32)
            .filter(|&r| rows[r as usize].name != "tok")
            .collect();
        let of_requests: RoaringBitmap = pick
            .iter()
            .filter(|_| !requests.is_empty())
            .map(|i| requests[i.index(requests.len())])
            .collect();
        // token rows only: no asked row holds a value
        let of_tokens: RoaringBitmap = pick
            .iter()
            .map(|i| i.index(rows.len()) as u32)
            .filter(|&r| rows[r as usize].name == "tok")
            .collect();
        for asked in [
            Rows::Set(of_requests),
            Rows::Set(of_tokens),
            Rows::Set(set),
            Rows::Range(start, len),
            Rows::All,
        ] {
            let want: Vec<Option<String>> = asked
                .iter(rows.len() as u32)
                .map(|r| match rows[r as usize].attribute("llm.model_version") {
                    Some(Value::Str(v)) => Some(v.clone()),
                    _ => None,
                })
                .collect();
            let got = reader.column(&version, &asked).unwrap();
            let got: Vec<Option<String>> = match got {
                Some(a) => {
                    let a = arrow::compute::cast(&a, &arrow::datatypes::DataType::Utf8).unwrap();
                    let a = a.as_any().downcast_ref::<arrow::array::StringArray>().unwrap();
                    a.iter().map(|v| v.map(str::to_owned)).collect()
                }
                None => vec![None; want.len()],
            };
            prop_assert_eq!(got, want);
            let want: Vec<Option<Value>> = asked
                .iter(rows.len() as u32)
                .map(|r| rows[r as usize].attribute("gen_ai.latency.time_to_first_token").cloned())
                .collect();
            let got = reader
                .attribute_values(&ttft, &asked)
                .unwrap()
                .unwrap_or_else(|| vec![None; want.len()]);
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn postings_hold_exactly_the_rows_a_scan_finds(spans in vec(span(), 1..150)) {
        let rows = block_order(spans);
        let (_, mem) = memory_block(&rows);
        let scan = |pick: &dyn Fn(&SpanRecord) -> Option<String>| {
            let mut m: HashMap<String, RoaringBitmap> = HashMap::new();
            for (i, s) in rows.iter().enumerate() {
                if let Some(term) = pick(s) {
                    m.entry(term).or_default().insert(i as u32);
                }
            }
            m
        };
        let by_name = scan(&|s| Some(s.name.clone()));
        let by_version = scan(&|s| match s.attribute("llm.model_version") {
            Some(Value::Str(v)) => Some(v.clone()),
            _ => None,
        });
        for (dim, naive) in [(DIM_NAME, by_name), ("llm.model_version", by_version)] {
            let indexed: HashMap<String, RoaringBitmap> = mem
                .postings
                .get(dim)
                .map(|p| p.iter().cloned().collect())
                .unwrap_or_default();
            prop_assert_eq!(indexed, naive, "{}", dim);
        }
    }
}
