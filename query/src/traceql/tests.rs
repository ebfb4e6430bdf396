use super::ast::*;
use super::parse;

#[test]
fn parses_the_supported_subset() {
    for q in [
        "{ }",
        "{}",
        r#"{ span.llm.model_version = "v1.3.1" && duration > 2s }"#,
        r#"{ resource.service.name = "llm-gateway" } >> { name = "llm.decode.token" }"#,
        r#"{ .http.status_code >= 500 || status = error }"#,
        r#"{ kind = server } && { span.gen_ai.request.model =~ "llama.*" }"#,
        r#"{ trace:duration > 1.5s && trace:rootService = "gw" }"#,
        r#"{ name = "a" } > { name = "b" } ~ { name = "c" }"#,
        r#"{ } | count() > 3"#,
        r#"{ } | avg(duration) > 100ms | by(resource.service.name) | select(span.worker.id)"#,
        r#"{ event:name = "exception" }"#,
        r#"{ link:traceID = "abc" }"#,
        r#"{ span:id = "0102030405060708" && trace:id = "ff" }"#,
        r#"({ } | count() > 2) && { status = error }"#,
        r#"{ } | rate() by (resource.service.name)"#,
        r#"{ name = "x" } | quantile_over_time(duration, .5, 0.99) by (span.llm.model_version)"#,
        r#"{ } | histogram_over_time(duration)"#,
        r#"{ !(status = error) && span.x != nil }"#,
        r#"{ span."name with spaces" = "v" }"#,
        r#"{ } with (most_recent=true)"#,
        r#"{ name = "x" } | rate() with (sample=true, exemplars=5)"#,
        r#"{ statusMessage = "boom" && span.llm.batch_size <= 16 && span.f = 1.5 && span.b = true }"#,
    ] {
        parse(q).unwrap_or_else(|e| panic!("{q}: {e}"));
    }
}

#[test]
fn reads_what_the_query_says() {
    let q = parse(r#"{ span.llm.model_version = "v1.3.1" && duration > 2s }"#).unwrap();
    assert_eq!(
        q.pipeline.source,
        Spanset::Filter(Some(FieldExpr::And(
            Box::new(FieldExpr::Cmp(
                Field::Attr(Scope::Span, "llm.model_version".into()),
                CmpOp::Eq,
                Literal::Str("v1.3.1".into())
            )),
            Box::new(FieldExpr::Cmp(
                Field::Intrinsic(Intrinsic::Duration),
                CmpOp::Gt,
                Literal::Duration(2_000_000_000)
            )),
        )))
    );
    // `||` binds looser than `&&`, which binds looser than structural operators
    let q = parse("{ name = \"a\" } || { name = \"b\" } && { name = \"c\" } > { name = \"d\" }")
        .unwrap();
    let Spanset::Binary(_, SetOp::Or, right) = q.pipeline.source else {
        panic!("or at the top")
    };
    let Spanset::Binary(_, SetOp::And, right) = *right else {
        panic!("and below")
    };
    assert!(matches!(*right, Spanset::Binary(_, SetOp::Child, _)));
    assert_eq!(
        super::parse::parse_duration("1h30m"),
        Some(5_400_000_000_000)
    );
    assert_eq!(super::parse::parse_duration("1.5ms"), Some(1_500_000));
}

#[test]
fn errors_name_the_unsupported_part() {
    for (q, part) in [
        ("{ span.x = }", "value"),
        ("{ foo = 1 }", "span.foo"),
        ("{ name > 3 }", "name"),
        ("{ duration = \"x\" }", "duration"),
        ("{ } | topk(3)", "topk"),
        ("{ instrumentation.x = 1 }", "instrumentation"),
        ("{ a:b = 1 }", "a:b"),
        ("{ status = ok", "`}`"),
        ("{ } !> { }", "negated"),
        ("{ span.x =~ \"(\" }", "regular expression"),
        ("", "empty"),
        ("{ name = \"x\" } | rate() | count() > 1", "last stage"),
        ("{ } | quantile_over_time(duration, 2)", "between 0 and 1"),
        (
            &format!("{}{{ }}{}", "(".repeat(100_000), ")".repeat(100_000)),
            "nested",
        ),
        (
            &format!("{{ {}name = \"x\" }}", "!".repeat(100_000)),
            "nested",
        ),
        (
            &format!("{{ {} }}", vec!["name = \"x\""; 100_000].join(" && ")),
            "conditions",
        ),
        (&vec!["{ }"; 100_000].join(" && "), "spansets"),
        (&format!("{{ }}{}", " | { }".repeat(100_000)), "stages"),
    ] {
        let e = parse(q).unwrap_err().to_string();
        assert!(e.contains(part), "{q}: {e}");
    }
}

mod no_panics {
    use proptest::prelude::*;

    use super::super::parse;
    use super::super::parse::parse_duration;

    /// Text made of TraceQL's own pieces, so that most inputs get deep into the parser.
    fn traceql_like() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("{".to_string()),
            Just("}".to_string()),
            Just("(".to_string()),
            Just(")".to_string()),
            Just("|".to_string()),
            Just(",".to_string()),
            Just("&&".to_string()),
            Just("||".to_string()),
            Just("!".to_string()),
            Just(">>".to_string()),
            Just("<<".to_string()),
            Just("~".to_string()),
            Just("=~".to_string()),
            Just("!=".to_string()),
            Just(">=".to_string()),
            Just("=".to_string()),
            Just("<".to_string()),
            Just("\"".to_string()),
            Just("`".to_string()),
            Just("\\".to_string()),
            Just("span.".to_string()),
            Just("resource.".to_string()),
            Just(".".to_string()),
            Just("duration".to_string()),
            Just("status".to_string()),
            Just("trace:rootService".to_string()),
            Just("error".to_string()),
            Just("nil".to_string()),
            Just("count()".to_string()),
            Just("avg".to_string()),
            Just("by".to_string()),
            Just("select".to_string()),
            Just("rate()".to_string()),
            Just("quantile_over_time".to_string()),
            Just("with".to_string()),
            Just("µs".to_string()),
            "[0-9]{1,25}(\\.[0-9]{0,5})?(ns|us|ms|s|m|h|µs)?",
            "\\PC{0,4}",
            " ",
        ];
        prop::collection::vec(piece, 0..24).prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(weft_storage::fuzz_cases(3000)))]

        #[test]
        fn the_parser_never_panics(q in traceql_like()) {
            let _ = parse(&q);
        }

        #[test]
        fn arbitrary_text_never_panics(q in "\\PC{0,64}") {
            let _ = parse(&q);
            let _ = parse_duration(&q);
        }
    }
}
