//! OTLP/JSON (the protobuf JSON mapping with OTLP's exceptions): ids as hex strings, 64-bit
//! integers as decimal strings or numbers, enums as integers (names also accepted), field
//! names in lowerCamelCase (the original snake_case also accepted), unknown fields ignored.
//!
//! Decoding walks a `serde_json::Value` so that an error names the exact place in the
//! document (`resourceSpans[0].scopeSpans[0].spans[3].startTimeUnixNano: ...`).

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList, any_value,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span};
use serde_json::{Map, Value as J};

use super::ExportTraceServiceRequest;
use crate::error::IngestError;

/// Where in the document a value is, for error messages; costs nothing unless printed.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root,
    Field(&'a Path<'a>, &'static str),
    Index(&'a Path<'a>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Field(Path::Root, name) => f.write_str(name),
            Path::Field(p, name) => write!(f, "{p}.{name}"),
            Path::Index(p, i) => write!(f, "{p}[{i}]"),
        }
    }
}

type R<T> = Result<T, String>;

fn err<T>(path: &Path<'_>, msg: impl fmt::Display) -> R<T> {
    let place = path.to_string();
    Err(if place.is_empty() {
        msg.to_string()
    } else {
        format!("{place}: {msg}")
    })
}

fn kind_of(v: &J) -> &'static str {
    match v {
        J::Null => "null",
        J::Bool(_) => "a boolean",
        J::Number(_) => "a number",
        J::String(_) => "a string",
        J::Array(_) => "an array",
        J::Object(_) => "an object",
    }
}

/// A JSON object with lookups that accept both spellings of a field.
struct Obj<'a, 'p> {
    map: &'a Map<String, J>,
    path: &'p Path<'p>,
}

impl<'a, 'p> Obj<'a, 'p> {
    fn new(v: &'a J, path: &'p Path<'p>) -> R<Self> {
        match v {
            J::Object(map) => Ok(Self { map, path }),
            other => err(
                path,
                format_args!("expected an object, got {}", kind_of(other)),
            ),
        }
    }

    fn get(&self, camel: &'static str, snake: &'static str) -> Option<(&'a J, &'static str)> {
        let found = self.map.get(camel).map(|v| (v, camel));
        found
            .or_else(|| self.map.get(snake).map(|v| (v, snake)))
            .filter(|(v, _)| !v.is_null())
    }

    fn string(&self, camel: &'static str, snake: &'static str) -> R<String> {
        match self.get(camel, snake) {
            None => Ok(String::new()),
            Some((J::String(s), _)) => Ok(s.clone()),
            Some((other, name)) => err(
                &Path::Field(self.path, name),
                format_args!("expected a string, got {}", kind_of(other)),
            ),
        }
    }

    fn u64(&self, camel: &'static str, snake: &'static str) -> R<u64> {
        match self.get(camel, snake) {
            None => Ok(0),
            Some((v, name)) => uint(v, &Path::Field(self.path, name)),
        }
    }

    fn u32(&self, camel: &'static str, snake: &'static str) -> R<u32> {
        let v = self.u64(camel, snake)?;
        u32::try_from(v).or_else(|_| {
            err(
                &Path::Field(self.path, camel),
                format_args!("{v} does not fit in 32 bits"),
            )
        })
    }

    fn enumeration(&self, camel: &'static str, names: &[&str]) -> R<i32> {
        match self.get(camel, camel) {
            None => Ok(0),
            Some((J::String(s), _)) if names.contains(&s.as_str()) => {
                Ok(names.iter().position(|n| n == s).unwrap_or(0) as i32)
            }
            Some((v, name)) => {
                let path = Path::Field(self.path, name);
                let n = uint(v, &path)?;
                i32::try_from(n)
                    .or_else(|_| err(&path, format_args!("enum value {n} out of range")))
            }
        }
    }

    fn hex(&self, camel: &'static str, snake: &'static str) -> R<Vec<u8>> {
        match self.get(camel, snake) {
            None => Ok(Vec::new()),
            Some((J::String(s), name)) => hex::decode(s).or_else(|_| {
                err(
                    &Path::Field(self.path, name),
                    format_args!("{s:?} is not a hex string"),
                )
            }),
            Some((other, name)) => err(
                &Path::Field(self.path, name),
                format_args!("expected a hex string, got {}", kind_of(other)),
            ),
        }
    }

    fn array<T>(
        &self,
        camel: &'static str,
        snake: &'static str,
        each: impl Fn(&J, &Path<'_>) -> R<T>,
    ) -> R<Vec<T>> {
        match self.get(camel, snake) {
            None => Ok(Vec::new()),
            Some((J::Array(items), name)) => {
                let field = Path::Field(self.path, name);
                items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| each(v, &Path::Index(&field, i)))
                    .collect()
            }
            Some((other, name)) => err(
                &Path::Field(self.path, name),
                format_args!("expected an array, got {}", kind_of(other)),
            ),
        }
    }

    fn object<T>(
        &self,
        camel: &'static str,
        snake: &'static str,
        f: impl Fn(&J, &Path<'_>) -> R<T>,
    ) -> R<Option<T>> {
        match self.get(camel, snake) {
            None => Ok(None),
            Some((v, name)) => f(v, &Path::Field(self.path, name)).map(Some),
        }
    }
}

fn uint(v: &J, path: &Path<'_>) -> R<u64> {
    match v {
        J::Number(n) => n.as_u64().map_or_else(
            || err(path, format_args!("{n} is not a non-negative integer")),
            Ok,
        ),
        J::String(s) => s
            .parse()
            .or_else(|_| err(path, format_args!("{s:?} is not a non-negative integer"))),
        other => err(
            path,
            format_args!(
                "expected an integer or a decimal string, got {}",
                kind_of(other)
            ),
        ),
    }
}

fn int(v: &J, path: &Path<'_>) -> R<i64> {
    match v {
        J::Number(n) => n.as_i64().map_or_else(
            || err(path, format_args!("{n} is not a 64-bit integer")),
            Ok,
        ),
        J::String(s) => s
            .parse()
            .or_else(|_| err(path, format_args!("{s:?} is not a 64-bit integer"))),
        other => err(
            path,
            format_args!(
                "expected an integer or a decimal string, got {}",
                kind_of(other)
            ),
        ),
    }
}

fn double(v: &J, path: &Path<'_>) -> R<f64> {
    match v {
        J::Number(n) => n.as_f64().map_or_else(|| err(path, "not a number"), Ok),
        J::String(s) => match s.as_str() {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            _ => s
                .parse()
                .or_else(|_| err(path, format_args!("{s:?} is not a number"))),
        },
        other => err(
            path,
            format_args!("expected a number, got {}", kind_of(other)),
        ),
    }
}

fn any_value(v: &J, path: &Path<'_>) -> R<AnyValue> {
    use any_value::Value as V;
    let o = Obj::new(v, path)?;
    let value = if let Some((v, name)) = o.get("stringValue", "string_value") {
        let p = Path::Field(path, name);
        match v {
            J::String(s) => Some(V::StringValue(s.clone())),
            other => {
                return err(
                    &p,
                    format_args!("expected a string, got {}", kind_of(other)),
                );
            }
        }
    } else if let Some((v, name)) = o.get("boolValue", "bool_value") {
        match v {
            J::Bool(b) => Some(V::BoolValue(*b)),
            other => {
                return err(
                    &Path::Field(path, name),
                    format_args!("expected a boolean, got {}", kind_of(other)),
                );
            }
        }
    } else if let Some((v, name)) = o.get("intValue", "int_value") {
        Some(V::IntValue(int(v, &Path::Field(path, name))?))
    } else if let Some((v, name)) = o.get("doubleValue", "double_value") {
        Some(V::DoubleValue(double(v, &Path::Field(path, name))?))
    } else if let Some((v, name)) = o.get("bytesValue", "bytes_value") {
        let p = Path::Field(path, name);
        match v {
            J::String(s) => Some(V::BytesValue(
                BASE64.decode(s).or_else(|_| err(&p, "not valid base64"))?,
            )),
            other => {
                return err(
                    &p,
                    format_args!("expected a base64 string, got {}", kind_of(other)),
                );
            }
        }
    } else if let Some(a) = o.object("arrayValue", "array_value", |v, p| {
        Obj::new(v, p)?.array("values", "values", any_value)
    })? {
        Some(V::ArrayValue(ArrayValue { values: a }))
    } else {
        o.object("kvlistValue", "kvlist_value", |v, p| {
            Obj::new(v, p)?.array("values", "values", key_value)
        })?
        .map(|values| V::KvlistValue(KeyValueList { values }))
    };
    Ok(AnyValue { value })
}

fn key_value(v: &J, path: &Path<'_>) -> R<KeyValue> {
    let o = Obj::new(v, path)?;
    Ok(KeyValue {
        key: o.string("key", "key")?,
        value: o.object("value", "value", any_value)?,
        ..Default::default()
    })
}

fn attrs(o: &Obj<'_, '_>) -> R<Vec<KeyValue>> {
    o.array("attributes", "attributes", key_value)
}

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
        scope: o.object("scope", "scope", |v, p| {
            let s = Obj::new(v, p)?;
            Ok(InstrumentationScope {
                name: s.string("name", "name")?,
                version: s.string("version", "version")?,
                attributes: attrs(&s)?,
                dropped_attributes_count: s
                    .u32("droppedAttributesCount", "dropped_attributes_count")?,
            })
        })?,
        spans: o.array("spans", "spans", decode_span)?,
        schema_url: o.string("schemaUrl", "schema_url")?,
    })
}

fn decode_resource_spans(v: &J, path: &Path<'_>) -> R<ResourceSpans> {
    let o = Obj::new(v, path)?;
    Ok(ResourceSpans {
        resource: o.object("resource", "resource", |v, p| {
            let r = Obj::new(v, p)?;
            Ok(Resource {
                attributes: attrs(&r)?,
                dropped_attributes_count: r
                    .u32("droppedAttributesCount", "dropped_attributes_count")?,
                entity_refs: Vec::new(),
            })
        })?,
        scope_spans: o.array("scopeSpans", "scope_spans", decode_scope_spans)?,
        schema_url: o.string("schemaUrl", "schema_url")?,
    })
}

/// Decodes an OTLP/JSON `ExportTraceServiceRequest`.
pub fn decode_request(bytes: &[u8]) -> Result<ExportTraceServiceRequest, IngestError> {
    let undecodable = |detail: String| IngestError::Undecodable {
        format: "OTLP/JSON",
        detail,
    };
    let doc: J = serde_json::from_slice(bytes).map_err(|e| undecodable(e.to_string()))?;
    let root = Path::Root;
    let o = Obj::new(&doc, &root).map_err(undecodable)?;
    let resource_spans = o
        .array("resourceSpans", "resource_spans", decode_resource_spans)
        .map_err(undecodable)?;
    Ok(ExportTraceServiceRequest { resource_spans })
}

/// Writes OTLP/JSON straight into a buffer: no intermediate document, since a trace read
/// encodes hundreds of spans and building a `serde_json::Value` tree costs more than the read.
struct Out(Vec<u8>);

impl Out {
    fn raw(&mut self, s: &str) {
        self.0.extend_from_slice(s.as_bytes());
    }
    fn str(&mut self, s: &str) {
        serde_json::to_writer(&mut self.0, s).expect("writing to a Vec cannot fail");
    }
    fn num(&mut self, n: impl fmt::Display) {
        use std::io::Write;
        let _ = write!(self.0, "{n}");
    }
    /// `"key":` with a leading comma unless first.
    fn key(&mut self, first: bool, key: &str) {
        if !first {
            self.raw(",");
        }
        self.str(key);
        self.raw(":");
    }
    fn list<T>(&mut self, items: &[T], mut each: impl FnMut(&mut Self, &T)) {
        self.raw("[");
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                self.raw(",");
            }
            each(self, item);
        }
        self.raw("]");
    }

    fn value(&mut self, v: &AnyValue) {
        use any_value::Value as V;
        match &v.value {
            None => self.raw("{}"),
            Some(V::StringValue(s)) => {
                self.raw("{\"stringValue\":");
                self.str(s);
                self.raw("}");
            }
            Some(V::BoolValue(b)) => self.raw(if *b {
                "{\"boolValue\":true}"
            } else {
                "{\"boolValue\":false}"
            }),
            Some(V::IntValue(i)) => {
                self.raw("{\"intValue\":\"");
                self.num(i);
                self.raw("\"}");
            }
            Some(V::DoubleValue(d)) => {
                self.raw("{\"doubleValue\":");
                if d.is_finite() {
                    serde_json::to_writer(&mut self.0, d).expect("finite float");
                } else {
                    self.str(if d.is_nan() {
                        "NaN"
                    } else if *d > 0.0 {
                        "Infinity"
                    } else {
                        "-Infinity"
                    });
                }
                self.raw("}");
            }
            Some(V::BytesValue(b)) => {
                self.raw("{\"bytesValue\":");
                self.str(&BASE64.encode(b));
                self.raw("}");
            }
            Some(V::ArrayValue(a)) => {
                self.raw("{\"arrayValue\":{\"values\":");
                self.list(&a.values, |o, v| o.value(v));
                self.raw("}}");
            }
            Some(V::KvlistValue(kv)) => {
                self.raw("{\"kvlistValue\":{\"values\":");
                self.attrs(&kv.values);
                self.raw("}}");
            }
            Some(V::StringValueStrindex(i)) => {
                self.raw("{\"stringValueStrindex\":");
                self.num(i);
                self.raw("}");
            }
        }
    }

    fn attrs(&mut self, kvs: &[KeyValue]) {
        self.list(kvs, |o, kv| {
            o.raw("{\"key\":");
            o.str(&kv.key);
            o.raw(",\"value\":");
            match &kv.value {
                Some(v) => o.value(v),
                None => o.raw("{}"),
            }
            o.raw("}");
        });
    }

    fn uint_str(&mut self, first: bool, key: &str, v: u64) {
        self.key(first, key);
        self.raw("\"");
        self.num(v);
        self.raw("\"");
    }

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
