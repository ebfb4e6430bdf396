//! OTLP/JSON of traces: `ExportTraceServiceRequest` decoded with errors naming the exact path,
//! and encoded for reads (trace by id, and the Tempo and Jaeger APIs to come).

use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span};
use serde_json::Value as J;

use super::*;
use crate::otlp::ExportTraceServiceRequest;

const KINDS: &[&str] = &[
    "SPAN_KIND_UNSPECIFIED",
    "SPAN_KIND_INTERNAL",
    "SPAN_KIND_SERVER",
    "SPAN_KIND_CLIENT",
    "SPAN_KIND_PRODUCER",
    "SPAN_KIND_CONSUMER",
];
const STATUS: &[&str] = &["STATUS_CODE_UNSET", "STATUS_CODE_OK", "STATUS_CODE_ERROR"];

fn decode_span(v: &J, path: &Path<'_>) -> R<Span> {
    let o = Obj::new(v, path)?;
    Ok(Span {
        trace_id: o.hex("traceId", "trace_id")?,
        span_id: o.hex("spanId", "span_id")?,
        trace_state: o.string("traceState", "trace_state")?,
        parent_span_id: o.hex("parentSpanId", "parent_span_id")?,
        flags: o.u32("flags", "flags")?,
        name: o.string("name", "name")?,
        kind: o.enumeration("kind", KINDS)?,
        start_time_unix_nano: o.u64("startTimeUnixNano", "start_time_unix_nano")?,
        end_time_unix_nano: o.u64("endTimeUnixNano", "end_time_unix_nano")?,
        attributes: attrs(&o)?,
        dropped_attributes_count: o.u32("droppedAttributesCount", "dropped_attributes_count")?,
        events: o.array("events", "events", |v, p| {
            let e = Obj::new(v, p)?;
            Ok(span::Event {
                time_unix_nano: e.u64("timeUnixNano", "time_unix_nano")?,
                name: e.string("name", "name")?,
                attributes: attrs(&e)?,
                dropped_attributes_count: e
                    .u32("droppedAttributesCount", "dropped_attributes_count")?,
            })
        })?,
        dropped_events_count: o.u32("droppedEventsCount", "dropped_events_count")?,
        links: o.array("links", "links", |v, p| {
            let l = Obj::new(v, p)?;
            Ok(span::Link {
                trace_id: l.hex("traceId", "trace_id")?,
                span_id: l.hex("spanId", "span_id")?,
                trace_state: l.string("traceState", "trace_state")?,
                attributes: attrs(&l)?,
                dropped_attributes_count: l
                    .u32("droppedAttributesCount", "dropped_attributes_count")?,
                flags: l.u32("flags", "flags")?,
            })
        })?,
        dropped_links_count: o.u32("droppedLinksCount", "dropped_links_count")?,
        status: o.object("status", "status", |v, p| {
            let s = Obj::new(v, p)?;
            Ok(Status {
                message: s.string("message", "message")?,
                code: s.enumeration("code", STATUS)?,
            })
        })?,
    })
}

fn decode_scope_spans(v: &J, path: &Path<'_>) -> R<ScopeSpans> {
    let o = Obj::new(v, path)?;
    Ok(ScopeSpans {
        scope: o.object("scope", "scope", decode_scope)?,
        spans: o.array("spans", "spans", decode_span)?,
        schema_url: o.string("schemaUrl", "schema_url")?,
    })
}

fn decode_resource_spans(v: &J, path: &Path<'_>) -> R<ResourceSpans> {
    let o = Obj::new(v, path)?;
    Ok(ResourceSpans {
        resource: o.object("resource", "resource", decode_resource)?,
        scope_spans: o.array("scopeSpans", "scope_spans", decode_scope_spans)?,
        schema_url: o.string("schemaUrl", "schema_url")?,
    })
}

/// Decodes an OTLP/JSON `ExportTraceServiceRequest`.
pub fn decode_request(bytes: &[u8]) -> Result<ExportTraceServiceRequest, IngestError> {
    let resource_spans = top_array(
        bytes,
        "resourceSpans",
        "resource_spans",
        decode_resource_spans,
    )?;
    Ok(ExportTraceServiceRequest { resource_spans })
}

impl Out {
    fn span(&mut self, s: &Span) {
        self.raw("{");
        self.key(true, "traceId");
        self.str(&hex::encode(&s.trace_id));
        self.key(false, "spanId");
        self.str(&hex::encode(&s.span_id));
        if !s.parent_span_id.is_empty() {
            self.key(false, "parentSpanId");
            self.str(&hex::encode(&s.parent_span_id));
        }
        if !s.trace_state.is_empty() {
            self.key(false, "traceState");
            self.str(&s.trace_state);
        }
        if s.flags != 0 {
            self.key(false, "flags");
            self.num(s.flags);
        }
        self.key(false, "name");
        self.str(&s.name);
        self.key(false, "kind");
        self.num(s.kind);
        self.uint_str(false, "startTimeUnixNano", s.start_time_unix_nano);
        self.uint_str(false, "endTimeUnixNano", s.end_time_unix_nano);
        self.key(false, "attributes");
        self.attrs(&s.attributes);
        for (name, n) in [
            ("droppedAttributesCount", s.dropped_attributes_count),
            ("droppedEventsCount", s.dropped_events_count),
            ("droppedLinksCount", s.dropped_links_count),
        ] {
            if n != 0 {
                self.key(false, name);
                self.num(n);
            }
        }
        if !s.events.is_empty() {
            self.key(false, "events");
            self.list(&s.events, |o, e| {
                o.raw("{");
                o.uint_str(true, "timeUnixNano", e.time_unix_nano);
                o.key(false, "name");
                o.str(&e.name);
                o.key(false, "attributes");
                o.attrs(&e.attributes);
                o.key(false, "droppedAttributesCount");
                o.num(e.dropped_attributes_count);
                o.raw("}");
            });
        }
        if !s.links.is_empty() {
            self.key(false, "links");
            self.list(&s.links, |o, l| {
                o.raw("{");
                o.key(true, "traceId");
                o.str(&hex::encode(&l.trace_id));
                o.key(false, "spanId");
                o.str(&hex::encode(&l.span_id));
                o.key(false, "traceState");
                o.str(&l.trace_state);
                o.key(false, "attributes");
                o.attrs(&l.attributes);
                o.key(false, "droppedAttributesCount");
                o.num(l.dropped_attributes_count);
                o.key(false, "flags");
                o.num(l.flags);
                o.raw("}");
            });
        }
        self.key(false, "status");
        match &s.status {
            Some(st) => {
                self.raw("{\"code\":");
                self.num(st.code);
                self.raw(",\"message\":");
                self.str(&st.message);
                self.raw("}");
            }
            None => self.raw("{}"),
        }
        self.raw("}");
    }
}

/// Encodes a message as OTLP/JSON (`{"resourceSpans": [...]}`), the shape Tempo and the
/// OpenTelemetry Collector's file exporter use.
pub fn encode_request(req: &ExportTraceServiceRequest) -> Vec<u8> {
    let mut o = Out(Vec::with_capacity(4096));
    o.raw("{\"resourceSpans\":");
    o.list(&req.resource_spans, |o, rs| {
        o.raw("{\"resource\":");
        match &rs.resource {
            Some(r) => {
                o.raw("{\"attributes\":");
                o.attrs(&r.attributes);
                o.raw(",\"droppedAttributesCount\":");
                o.num(r.dropped_attributes_count);
                o.raw("}");
            }
            None => o.raw("{}"),
        }
        o.raw(",\"scopeSpans\":");
        o.list(&rs.scope_spans, |o, ss| {
            o.raw("{\"scope\":");
            match &ss.scope {
                Some(sc) => {
                    o.raw("{\"name\":");
                    o.str(&sc.name);
                    o.raw(",\"version\":");
                    o.str(&sc.version);
                    o.raw(",\"attributes\":");
                    o.attrs(&sc.attributes);
                    o.raw(",\"droppedAttributesCount\":");
                    o.num(sc.dropped_attributes_count);
                    o.raw("}");
                }
                None => o.raw("{}"),
            }
            o.raw(",\"spans\":");
            o.list(&ss.spans, |o, s| o.span(s));
            o.raw(",\"schemaUrl\":");
            o.str(&ss.schema_url);
            o.raw("}");
        });
        o.raw(",\"schemaUrl\":");
        o.str(&rs.schema_url);
        o.raw("}");
    });
    o.raw("}");
    o.0
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"svc"}}]},
      "scopeSpans":[{"scope":{"name":"s","version":"1"},"spans":[{
        "traceId":"5B8EFFF798038103D269B633813FC60C","spanId":"EEE19B7EC3C1B174","parentSpanId":"",
        "name":"chat llama","kind":3,"startTimeUnixNano":"1544712660000000000","endTimeUnixNano":1544712661000000000,
        "attributes":[{"key":"gen_ai.usage.input_tokens","value":{"intValue":"42"}},
                      {"key":"d","value":{"doubleValue":"NaN"}},
                      {"key":"b","value":{"bytesValue":"AAE="}},
                      {"key":"arr","value":{"arrayValue":{"values":[{"boolValue":true}]}}}],
        "status":{"code":"STATUS_CODE_ERROR","message":"bad"},
        "unknownField": {"ignored": true}}]}]}]}"#;

    #[test]
    fn decodes_the_specification_shapes() {
        let req = decode_request(SAMPLE.as_bytes()).unwrap();
        let span = &req.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(
            hex::encode(&span.trace_id),
            "5b8efff798038103d269b633813fc60c"
        );
        assert_eq!(span.start_time_unix_nano, 1_544_712_660_000_000_000);
        assert_eq!(span.end_time_unix_nano, 1_544_712_661_000_000_000);
        assert_eq!(span.kind, 3);
        assert_eq!(span.status.as_ref().unwrap().code, 2);
        assert_eq!(span.attributes.len(), 4);
        let encoded = encode_request(&req);
        let _: J = serde_json::from_slice(&encoded).expect("valid JSON");
        let again = decode_request(&encoded).unwrap();
        // (NaN != NaN, so compare encodings rather than messages)
        assert_eq!(encode_request(&again), encoded);
        assert!(
            String::from_utf8(encoded)
                .unwrap()
                .contains(r#""doubleValue":"NaN""#)
        );
        assert_eq!(
            again.resource_spans[0].scope_spans[0].spans[0].attributes[0],
            span.attributes[0]
        );
    }

    #[test]
    fn wrong_types_name_the_path() {
        let bad = SAMPLE.replace(
            r#""startTimeUnixNano":"1544712660000000000""#,
            r#""startTimeUnixNano":{"x":1}"#,
        );
        let e = decode_request(bad.as_bytes()).unwrap_err().to_string();
        assert!(
            e.contains("resourceSpans[0].scopeSpans[0].spans[0].startTimeUnixNano"),
            "{e}"
        );
        let e = decode_request(br#"{"resourceSpans": 3}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("resourceSpans: expected an array, got a number"),
            "{e}"
        );
        let e = decode_request(br#"[1]"#).unwrap_err().to_string();
        assert!(e.contains("expected an object"), "{e}");
        let e = decode_request(b"{\"resourceSpans\":[")
            .unwrap_err()
            .to_string();
        assert!(e.contains("OTLP/JSON"), "{e}");
    }
}
