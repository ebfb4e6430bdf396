//! Fuzzing with proptest: no query text makes a reader panic: the trace and log search
//! parameters, the log text language, SQL's front end (parse and the read-only check), and the
//! analytics parameters. A long run: `PROPTEST_CASES=10000000 cargo test --release --workspace
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
    #![proptest_config(ProptestConfig::with_cases(2000))]

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
}
