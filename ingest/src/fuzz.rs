//! Fuzzing with proptest: no input makes the OTLP decoders (protobuf, JSON, gzip bodies) or the
//! conversion to storage rows panic, whatever its bytes, ids, times or attribute values. Each run
//! of the test suite tries a few thousand inputs per target; a long run is
//! `PROPTEST_CASES=10000000 cargo test --release --workspace --lib -- no_panics` (docs/testing.md).

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, KeyValue, KeyValueList, any_value,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span};
use proptest::prelude::*;
use prost::Message;
use weft_storage::model::UnixNanos;

use crate::body::{Encoding, decode};
use crate::otlp::convert::{SpanLimits, convert_request};
use crate::otlp::json::{decode_logs_request, decode_metrics_request, decode_request};

fn limits() -> SpanLimits {
    SpanLimits {
        max_attribute_value_bytes: 4096,
        retention: None,
        shape: crate::otlp::convert::ShapeLimits::NONE,
    }
}

fn any_value() -> impl Strategy<Value = AnyValue> {
    let leaf = prop_oneof![
        "\\PC{0,20}".prop_map(any_value::Value::StringValue),
        any::<i64>().prop_map(any_value::Value::IntValue),
        any::<f64>().prop_map(any_value::Value::DoubleValue),
        any::<bool>().prop_map(any_value::Value::BoolValue),
        prop::collection::vec(any::<u8>(), 0..40).prop_map(any_value::Value::BytesValue),
    ]
    .prop_map(|v| AnyValue { value: Some(v) });
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|values| AnyValue {
                value: Some(any_value::Value::ArrayValue(ArrayValue { values }))
            }),
            prop::collection::vec(("\\PC{0,8}", inner), 0..4).prop_map(|kvs| AnyValue {
                value: Some(any_value::Value::KvlistValue(KeyValueList {
                    values: kvs
                        .into_iter()
                        .map(|(key, v)| KeyValue {
                            key,
                            value: Some(v),
                            ..Default::default()
                        })
                        .collect(),
                }))
            }),
        ]
    })
}

fn attributes() -> impl Strategy<Value = Vec<KeyValue>> {
    let key = prop_oneof![
        Just("service.name".to_string()),
        Just("llm.model_version".to_string()),
        Just("gen_ai.usage.input_tokens".to_string()),
        Just("llm.token.index".to_string()),
        Just("gen_ai.input.messages".to_string()),
        Just("worker.id".to_string()),
        "\\PC{0,12}",
    ];
    prop::collection::vec((key, prop::option::of(any_value())), 0..6).prop_map(|kvs| {
        kvs.into_iter()
            .map(|(key, value)| KeyValue {
                key,
                value,
                ..Default::default()
            })
            .collect()
    })
}

fn spans() -> impl Strategy<Value = ExportTraceServiceRequest> {
    let span = (
        prop::collection::vec(any::<u8>(), 0..20),
        prop::collection::vec(any::<u8>(), 0..10),
        prop::collection::vec(any::<u8>(), 0..10),
        "\\PC{0,12}",
        -2i32..8,
        any::<u64>(),
        any::<u64>(),
        attributes(),
        -1i32..4,
    )
        .prop_map(
            |(trace_id, span_id, parent_span_id, name, kind, start, end, attributes, code)| Span {
                trace_id,
                span_id,
                parent_span_id,
                name,
                kind,
                start_time_unix_nano: start,
                end_time_unix_nano: end,
                attributes,
                events: vec![span::Event {
                    time_unix_nano: start,
                    name: "e".into(),
                    ..Default::default()
                }],
                status: Some(Status {
                    code,
                    message: String::new(),
                }),
                ..Default::default()
            },
        );
    (attributes(), prop::collection::vec(span, 0..4)).prop_map(|(resource, spans)| {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: resource,
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(weft_storage::fuzz_cases(1000)))]

    #[test]
    fn no_panics_from_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(req) = crate::otlp::decode_protobuf(&bytes) {
            let _ = convert_request(req, limits());
        }
        if let Ok(req) = crate::otlp::logs::decode_protobuf(&bytes) {
            let _ = crate::otlp::logs::convert_request(req, limits(), UnixNanos(1));
        }
        if let Ok(req) = crate::otlp::metrics::decode_protobuf(&bytes) {
            let _ = crate::otlp::metrics::convert_request(req, limits());
        }
        let _ = decode(bytes::Bytes::from(bytes.clone()), Encoding::Gzip, 1 << 16);
        let _ = decode_request(&bytes);
        let _ = decode_logs_request(&bytes);
        let _ = decode_metrics_request(&bytes);
    }

    #[test]
    fn no_panics_from_odd_spans(req in spans()) {
        let bytes = req.encode_to_vec();
        let decoded = crate::otlp::decode_protobuf(&bytes).unwrap();
        let _ = convert_request(decoded, limits());
        // the same through OTLP/JSON
        let json = crate::otlp::json::encode_request(&req);
        if let Ok(again) = decode_request(&json) {
            let _ = convert_request(again, limits());
        }
    }

    #[test]
    fn no_panics_from_json_like_text(text in "[\\[\\]{}\",:0-9a-zA-Z.\\-eE \\\\u]{0,200}") {
        let _ = decode_request(text.as_bytes());
        let _ = decode_logs_request(text.as_bytes());
        let _ = decode_metrics_request(text.as_bytes());
        let wrapped = format!("{{\"resourceSpans\":[{{\"scopeSpans\":[{{\"spans\":[{text}]}}]}}]}}");
        if let Ok(req) = decode_request(wrapped.as_bytes()) {
            let _ = convert_request(req, limits());
        }
    }
}
