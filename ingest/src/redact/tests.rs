use std::sync::Arc;

use weft_storage::model::{Event, Resource, UnixNanos};

use super::*;

fn redact_text(r: &Redaction, text: &str) -> String {
    let mut log = LogRecord {
        body: Value::Str(text.into()),
        ..Default::default()
    };
    r.logs(std::slice::from_mut(&mut log), &RedactionStats::default());
    match log.body {
        Value::Str(s) => s,
        other => panic!("{other:?}"),
    }
}

#[test]
fn personal_data_becomes_typed_placeholders() {
    let r = Redaction::default();
    let cases = [
        ("mail jane.doe+ai@example.co.uk now", "mail <email> now"),
        (
            "call +1 415-555-0132 or (415) 555-0199",
            "call <phone> or <phone>",
        ),
        ("card 4111 1111 1111 1111 ok", "card <card> ok"),
        ("card 4111111111111111.", "card <card>."),
        (
            "key sk-proj-abcdefghijklmnop1234 and AKIAIOSFODNN7EXAMPLE",
            "key <api_key> and <api_key>",
        ),
        (
            "Authorization: Bearer eyJhbGciOi.J9x-y_z",
            "Authorization: <bearer_token>",
        ),
        (
            "from 10.1.2.3 and 2001:db8::8a2e:370:7334 and ::1",
            "from <ip> and <ip> and <ip>",
        ),
    ];
    for (text, want) in cases {
        assert_eq!(redact_text(&r, text), want, "{text}");
    }
}

#[test]
fn ordinary_values_are_left_alone() {
    let r = Redaction::default();
    for text in [
        "llama-3.1-8b-2025-10",
        "/v1/chat/completions",
        "decode step 12 took 20.5 ms at 12:30:45",
        "version 1.2.3 of worker-7",
        "4111 1111 1111 1112", // fails the Luhn check
        "2026-12-03T11:52:10Z",
        "trace 5b8efff798038103d269b633813fc60c",
        "at 1764460800 (1764460800000000000 ns)",
    ] {
        assert_eq!(redact_text(&r, text), text);
    }
}

#[test]
fn content_attributes_become_a_hash_and_a_length_unless_captured() {
    let stats = RedactionStats::default();
    let span = |key: &str| SpanRecord {
        attributes: vec![
            KeyValue::new(key, Value::Str("tell me about refunds".into())),
            KeyValue::new("llm.model_version", Value::Str("v1".into())),
        ],
        events: vec![Event {
            time: UnixNanos(1),
            attributes: vec![KeyValue::new("gen_ai.prompt", Value::Str("hi".into()))],
            ..Default::default()
        }],
        resource: Arc::new(Resource::default()),
        ..Default::default()
    };
    let mut spans = vec![span("gen_ai.input.messages"), span("app.secret_prompt")];
    let policy = Redaction {
        content_keys: vec!["app.secret_prompt".into()],
        ..Default::default()
    };
    policy.spans(&mut spans, &stats);
    for s in &spans {
        let keys: Vec<&str> = s.attributes.iter().map(|kv| kv.key.as_str()).collect();
        assert!(
            keys.iter()
                .all(|k| !k.ends_with("messages") && *k != "app.secret_prompt"),
            "{keys:?}"
        );
        assert!(
            keys.iter().any(|k| k.ends_with(".hash"))
                && keys.iter().any(|k| k.ends_with(".length"))
        );
        assert_eq!(s.events[0].attributes[0].key, "gen_ai.prompt.hash");
    }
    let hash = |s: &SpanRecord| s.attributes[0].value.clone();
    assert_eq!(hash(&spans[0]), hash(&spans[1]), "same text, same hash");
    assert_eq!(spans[0].attributes[1].value, Value::Int(21));
    assert_eq!(stats.snapshot()["content"], 4);

    let mut kept = vec![span("gen_ai.input.messages")];
    let capture = Redaction {
        capture_content: true,
        ..Default::default()
    };
    capture.spans(&mut kept, &stats);
    assert_eq!(kept[0].attributes[0].key, "gen_ai.input.messages");
}

#[test]
fn configured_patterns_apply_and_are_counted_by_name() {
    let stats = RedactionStats::default();
    let r = Redaction {
        pii: Some(PiiRules::with_patterns(vec![
            pattern("employee_id", r"EMP-\d{6}").unwrap(),
        ])),
        ..Default::default()
    };
    let mut logs = vec![LogRecord {
        body: Value::KvList(vec![KeyValue::new(
            "user",
            Value::Str("EMP-123456 <a@b.io>".into()),
        )]),
        attributes: vec![KeyValue::new(
            "n",
            Value::Array(vec![Value::Str("EMP-000001".into())]),
        )],
        ..Default::default()
    }];
    r.logs(&mut logs, &stats);
    assert_eq!(
        logs[0].body,
        Value::KvList(vec![KeyValue::new(
            "user",
            Value::Str("<employee_id> <<email>>".into())
        )])
    );
    assert_eq!(
        logs[0].attributes[0].value,
        Value::Array(vec![Value::Str("<employee_id>".into())])
    );
    let counts = stats.snapshot();
    assert_eq!((counts["employee_id"], counts["email"]), (2, 1));
    assert!(pattern("bad name", "x").is_err());
    assert!(pattern("empty", "a*").is_err());
    assert!(pattern("broken", "(").is_err());
}

#[test]
fn content_in_log_bodies_is_replaced_unless_captured() {
    let stats = RedactionStats::default();
    let r = Redaction::default();
    let one_line = "[PROMPT] refund me now [RESPONSE] sure thing [LOGITS] {\"q\":0.82}";
    let mut logs = vec![
        LogRecord {
            body: Value::Str(one_line.into()),
            ..Default::default()
        },
        LogRecord {
            event_name: "gen_ai.user.message".into(),
            body: Value::KvList(vec![KeyValue::new("content", Value::Str("hello".into()))]),
            ..Default::default()
        },
    ];
    r.logs(&mut logs, &stats);
    let want = format!(
        "[PROMPT] <content hash={} length=13> [RESPONSE] <content hash={} length=10> [LOGITS] {{\"q\":0.82}}",
        super::hash16("refund me now"),
        super::hash16("sure thing")
    );
    assert_eq!(logs[0].body, Value::Str(want));
    assert_eq!(
        logs[1].body,
        Value::Str(format!(
            "<content hash={} length=19>",
            super::hash16(r#"{"content":"hello"}"#)
        ))
    );
    assert_eq!(stats.snapshot()["content"], 3);
    let mut kept = vec![LogRecord {
        body: Value::Str(one_line.into()),
        ..Default::default()
    }];
    let capture = Redaction {
        capture_content: true,
        ..Default::default()
    };
    capture.logs(&mut kept, &stats);
    assert_eq!(kept[0].body, Value::Str(one_line.into()));
}
