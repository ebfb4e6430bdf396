use super::*;

fn record(body: Value, attributes: Vec<KeyValue>) -> LogRecord {
    LogRecord {
        body,
        attributes,
        ..Default::default()
    }
}

fn s(text: &str) -> Value {
    Value::Str(text.into())
}

#[test]
fn key_value_bodies_give_typed_metrics() {
    let (sem, failed) = parse(&record(
        s(
            "step done prefill_ms=12.5 decode_ms=340 kv_cache_hit_rate=0.82 tokens_per_s=41.2 worker=w-7",
        ),
        vec![],
    ));
    assert!(!failed);
    assert_eq!(sem.class, LogClass::InferenceMetrics);
    assert_eq!(
        (
            sem.prefill_ms,
            sem.decode_ms,
            sem.kv_cache_hit_rate,
            sem.tokens_per_s
        ),
        (Some(12.5), Some(340.0), Some(0.82), Some(41.2))
    );
    assert_eq!(sem.worker.as_deref(), Some("w-7"));
}

#[test]
fn json_bodies_and_attributes_agree_and_attributes_win() {
    let (sem, failed) = parse(&record(
        s(
            r#"{"model": "llama-3.1-8b", "model_version": "2025-10", "finish_reason": "length", "completion_tokens": 64, "gpu_id": "GPU-3"}"#,
        ),
        vec![KeyValue::new("gen_ai.request.model", s("from-attribute"))],
    ));
    assert!(!failed);
    assert_eq!(sem.model.as_deref(), Some("from-attribute"));
    assert_eq!(sem.model_version.as_deref(), Some("2025-10"));
    assert_eq!(sem.finish_reasons, Some(vec!["length".to_owned()]));
    assert_eq!(sem.output_tokens, Some(64));
    assert_eq!(sem.gpu.as_deref(), Some("GPU-3"));
    assert_eq!(sem.class, LogClass::InferenceMetrics);
}

#[test]
fn the_one_line_form_is_split_into_its_segments() {
    let (sem, failed) = parse(&record(
        s(
            r#"[PROMPT] what is 2+2 step=9 [RESPONSE] 4 [LOGITS] {"q":0.82,"kv_cache_hit_rate":0.5,"step":3}"#,
        ),
        vec![],
    ));
    assert!(!failed);
    assert_eq!(sem.class, LogClass::ResponseOutput);
    // the prompt's text is not read for fields; the logits segment is
    assert_eq!(
        (sem.generation_step, sem.kv_cache_hit_rate),
        (Some(3), Some(0.5))
    );
    let (prompt, _) = parse(&record(s("[PROMPT] <content hash=ab length=3>"), vec![]));
    assert_eq!(prompt.class, LogClass::PromptInput);
}

#[test]
fn classes_come_from_events_then_severity_then_the_body() {
    let event = |name: &str| LogRecord {
        event_name: name.into(),
        ..Default::default()
    };
    assert_eq!(
        parse(&event("gen_ai.user.message")).0.class,
        LogClass::PromptInput
    );
    assert_eq!(
        parse(&event("gen_ai.choice")).0.class,
        LogClass::ResponseOutput
    );
    assert_eq!(
        parse(&event("vllm.inference.metrics")).0.class,
        LogClass::InferenceMetrics
    );
    let mut details = event("gen_ai.client.inference.operation.details");
    assert_eq!(parse(&details).0.class, LogClass::PromptInput);
    details
        .attributes
        .push(KeyValue::new("gen_ai.output.messages.hash", s("ab")));
    assert_eq!(parse(&details).0.class, LogClass::ResponseOutput);
    let by_attribute = record(
        s("x"),
        vec![KeyValue::new("event.name", s("gen_ai.system.message"))],
    );
    assert_eq!(parse(&by_attribute).0.class, LogClass::PromptInput);
    let error = LogRecord {
        severity_number: 17,
        body: s("KV cache exhausted prefill_ms=3"),
        ..Default::default()
    };
    assert_eq!(parse(&error).0.class, LogClass::Error);
    let text_error = LogRecord {
        severity_text: "error".into(),
        ..Default::default()
    };
    assert_eq!(parse(&text_error).0.class, LogClass::Error);
    assert_eq!(
        parse(&record(s("server started"), vec![])).0.class,
        LogClass::Other
    );
}

#[test]
fn what_does_not_parse_is_kept_and_counted() {
    let stats = ParseStats::default();
    let mut logs = vec![
        record(s(r#"{"prefill_ms": 12.5,"#), vec![]),
        record(s("prefill_ms=fast"), vec![]),
        record(s("all good"), vec![]),
    ];
    annotate(&mut logs, &stats);
    assert_eq!(stats.failures.load(Ordering::Relaxed), 2);
    assert_eq!(logs[0].body, s(r#"{"prefill_ms": 12.5,"#));
    assert_eq!(logs[1].semantics.prefill_ms, None);
    assert_eq!(logs[2].semantics.class, LogClass::Other);
}
