//! Fuzzing with proptest: no query text makes a reader panic: the trace and log search
//! parameters, the log text language, SQL's front end (parse and the read-only check), the
//! analytics parameters, and PostgreSQL frontend messages (the frame check, then pgwire's
//! decoders on what passes, as a connection runs them). A long run: `PROPTEST_CASES=10000000 cargo test --release --workspace
//! --lib -- no_panics` (docs/testing.md).

use proptest::prelude::*;

/// Query strings of `key=value` pairs with the keys the readers know and odd values.
fn query_string() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("service"),
        Just("name"),
        Just("attr.llm.model_version"),
        Just("min_duration"),
        Just("max_duration"),
        Just("start"),
        Just("end"),
        Just("limit"),
        Just("cursor"),
        Just("q"),
        Just("severity"),
        Just("trace_id"),
        Just("step"),
        Just("signal"),
        Just("by"),
        Just("buckets"),
    ];
    let value = prop_oneof![
        "\\PC{0,24}",
        "[0-9]{0,30}(ms|s|h|ns|µs)?",
        "%[0-9A-Fa-f]{0,2}\\PC{0,4}",
        "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{0,12})?(Z|[+-][0-9]{2}:[0-9]{2}|\\PC)",
    ];
    prop::collection::vec((key, value), 0..6).prop_map(|pairs| {
        pairs
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&")
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(weft_storage::fuzz_cases(2000)))]

    #[test]
    fn no_panics_from_search_parameters(q in query_string()) {
        let _ = crate::traces::search::parse_request(&q);
        let _ = crate::logs::search::parse_request(&q);
        if let Ok(pairs) = crate::traces::search::form_pairs(&q) {
            for name in ["heatmap", "percentiles", "anomalies", "lineage_operations"] {
                let own = weft_query::analytics::own_params(name).unwrap_or(&[]);
                let _ = weft_query::analytics::Params::parse(pairs.clone(), own);
            }
        }
    }

    #[test]
    fn no_panics_from_log_text_queries(q in "[a-z\"():*\\- ]{0,40}|\\PC{0,40}") {
        let _ = weft_query::logs::TextQuery::parse(&q);
    }

    #[test]
    fn no_panics_from_sql_text(q in "(SELECT|FROM|WHERE|spans|\\(|\\)|,|'|\"|--|/\\*|\\*|=|\\$[0-9]{1,12}| |[a-z_]{1,8}|[0-9]{1,20}|::|;){0,30}") {
        if let Ok(statements) = weft_query::sql::parse(&q) {
            for s in &statements {
                let _ = weft_query::sql::check_statement(s);
            }
        }
        let _ = weft_query::sql::check_read_only(&q);
    }

    #[test]
    fn no_panics_from_postgresql_messages(
        startup in prop::bool::weighted(0.9),
        messages in prop::collection::vec(pg_message(), 0..6),
        cut in prop::option::weighted(0.2, 0usize..400),
    ) {
        let mut bytes = Vec::new();
        if startup {
            bytes = crate::sql::wire::tests::startup();
        }
        for m in messages {
            bytes.extend_from_slice(&m);
        }
        if let Some(cut) = cut {
            bytes.truncate(cut);
        }
        let _ = crate::sql::wire::tests::through(&bytes);
    }
}

/// One frontend message: a known type byte (or any), a body of fields as messages have them
/// (strings, counts, integers, raw bytes), and a length that is right or lies.
fn pg_message() -> impl Strategy<Value = Vec<u8>> {
    let field = prop_oneof![
        "[a-zA-Z0-9 $]{0,12}".prop_map(|s| {
            let mut b = s.into_bytes();
            b.push(0);
            b
        }),
        (0u16..8).prop_map(|n| n.to_be_bytes().to_vec()),
        any::<u16>().prop_map(|n| n.to_be_bytes().to_vec()),
        (-2i32..16).prop_map(|n| n.to_be_bytes().to_vec()),
        any::<i32>().prop_map(|n| n.to_be_bytes().to_vec()),
        prop::collection::vec(any::<u8>(), 0..8),
    ];
    let tag = prop_oneof![prop::sample::select(b"QPBCDEHSXdcfp".to_vec()), any::<u8>(),];
    let length = prop_oneof![
        4 => Just(None),
        1 => any::<i32>().prop_map(Some),
        1 => (-3i32..3).prop_map(Some),
    ];
    (tag, prop::collection::vec(field, 0..7), length).prop_map(|(tag, fields, length)| {
        let body: Vec<u8> = fields.concat();
        let right = body.len() as i32 + 4;
        let len = length.map_or(right, |lie| right.wrapping_add(lie));
        let mut m = vec![tag];
        m.extend_from_slice(&len.to_be_bytes());
        m.extend_from_slice(&body);
        m
    })
}
