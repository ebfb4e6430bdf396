//! Storage rows back to OTLP: spans grouped under their resource and scope.

use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList, any_value,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span};
use weft_storage::model::{self as m, SpanRecord};

use super::ExportTraceServiceRequest;

/// Spans of one resource, by scope.
type ResourceGroup<'a> = (&'a m::Resource, Vec<(&'a m::Scope, Vec<Span>)>);

/// Builds an OTLP message from spans, grouping spans that share a resource and a scope.
pub fn to_request(spans: &[SpanRecord]) -> ExportTraceServiceRequest {
    let mut groups: Vec<ResourceGroup<'_>> = Vec::new();
    for s in spans {
        let gi = match groups.iter().position(|(r, _)| *r == &*s.resource) {
            Some(i) => i,
            None => {
                groups.push((&s.resource, Vec::new()));
                groups.len() - 1
            }
        };
        let scopes = &mut groups[gi].1;
        let si = match scopes.iter().position(|(sc, _)| *sc == &*s.scope) {
            Some(i) => i,
            None => {
                scopes.push((&s.scope, Vec::new()));
                scopes.len() - 1
            }
        };
        scopes[si].1.push(span(s));
    }
    ExportTraceServiceRequest {
        resource_spans: groups
            .into_iter()
            .map(|(r, scopes)| ResourceSpans {
                resource: Some(Resource {
                    attributes: attributes(&r.attributes),
                    dropped_attributes_count: r.dropped_attributes_count,
                    entity_refs: Vec::new(),
                }),
                schema_url: r.schema_url.clone(),
                scope_spans: scopes
                    .into_iter()
                    .map(|(sc, spans)| ScopeSpans {
                        scope: Some(InstrumentationScope {
                            name: sc.name.clone(),
                            version: sc.version.clone(),
                            attributes: attributes(&sc.attributes),
                            dropped_attributes_count: sc.dropped_attributes_count,
                        }),
                        schema_url: sc.schema_url.clone(),
                        spans,
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn span(s: &SpanRecord) -> Span {
    Span {
        trace_id: s.trace_id.0.to_vec(),
        span_id: s.span_id.0.to_vec(),
        trace_state: s.trace_state.clone(),
        parent_span_id: s.parent_span_id.map(|p| p.0.to_vec()).unwrap_or_default(),
        flags: s.flags,
        name: s.name.clone(),
        kind: s.kind as i32,
        start_time_unix_nano: s.start.0,
        end_time_unix_nano: s.end.0,
        attributes: attributes(&s.attributes),
        dropped_attributes_count: s.dropped_attributes_count,
        events: s
            .events
            .iter()
            .map(|e| span::Event {
                time_unix_nano: e.time.0,
                name: e.name.clone(),
                attributes: attributes(&e.attributes),
                dropped_attributes_count: e.dropped_attributes_count,
            })
            .collect(),
        dropped_events_count: s.dropped_events_count,
        links: s
            .links
            .iter()
            .map(|l| span::Link {
                trace_id: l.trace_id.0.to_vec(),
                span_id: l.span_id.0.to_vec(),
                trace_state: l.trace_state.clone(),
                attributes: attributes(&l.attributes),
                dropped_attributes_count: l.dropped_attributes_count,
                flags: l.flags,
            })
            .collect(),
        dropped_links_count: s.dropped_links_count,
        status: Some(Status {
            message: s.status_message.clone(),
            code: s.status_code as i32,
        }),
    }
}

pub fn attributes(kvs: &[m::KeyValue]) -> Vec<KeyValue> {
    kvs.iter()
        .map(|kv| KeyValue {
            key: kv.key.clone(),
            value: Some(value(&kv.value)),
            ..Default::default()
        })
        .collect()
}

fn value(v: &m::Value) -> AnyValue {
    use any_value::Value as V;
    AnyValue {
        value: match v {
            m::Value::Empty => None,
            m::Value::Str(s) => Some(V::StringValue(s.clone())),
            m::Value::Bool(b) => Some(V::BoolValue(*b)),
            m::Value::Int(i) => Some(V::IntValue(*i)),
            m::Value::Double(d) => Some(V::DoubleValue(*d)),
            m::Value::Bytes(b) => Some(V::BytesValue(b.clone())),
            m::Value::Array(a) => Some(V::ArrayValue(ArrayValue {
                values: a.iter().map(value).collect(),
            })),
            m::Value::KvList(kv) => Some(V::KvlistValue(KeyValueList {
                values: attributes(kv),
            })),
        },
    }
}
