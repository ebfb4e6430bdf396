//! OTLP/JSON (the protobuf JSON mapping with OTLP's exceptions): ids as hex strings, 64-bit
//! integers as decimal strings or numbers, enums as integers (names also accepted), field
//! names in lowerCamelCase (the original snake_case also accepted), unknown fields ignored.
//!
//! Decoding walks a `serde_json::Value` so that an error names the exact place in the
//! document (`resourceSpans[0].scopeSpans[0].spans[3].startTimeUnixNano: ...`).
//!
//! This module holds what every signal shares (paths, typed field access, any-values and
//! attributes, the writer); each signal's messages are in a module of their own
//! ([`traces`], [`logs`], [`metrics`]).

mod logs;
mod metrics;
mod traces;

pub use logs::decode_logs_request;
pub use metrics::decode_metrics_request;
pub use traces::{decode_request, encode_request};

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList, any_value,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use serde_json::{Map, Value as J};

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

/// The top-level array of an export request document (`resourceSpans`, `resourceLogs`), each
/// element decoded by `each`.
fn top_array<T>(
    bytes: &[u8],
    camel: &'static str,
    snake: &'static str,
    each: impl Fn(&J, &Path<'_>) -> R<T>,
) -> Result<Vec<T>, IngestError> {
    let undecodable = |detail: String| IngestError::Undecodable {
        format: "OTLP/JSON",
        detail,
    };
    let doc: J = serde_json::from_slice(bytes).map_err(|e| undecodable(e.to_string()))?;
    let root = Path::Root;
    let o = Obj::new(&doc, &root).map_err(undecodable)?;
    o.array(camel, snake, each).map_err(undecodable)
}

fn decode_scope(v: &J, path: &Path<'_>) -> R<InstrumentationScope> {
    let s = Obj::new(v, path)?;
    Ok(InstrumentationScope {
        name: s.string("name", "name")?,
        version: s.string("version", "version")?,
        attributes: attrs(&s)?,
        dropped_attributes_count: s.u32("droppedAttributesCount", "dropped_attributes_count")?,
    })
}

fn decode_resource(v: &J, path: &Path<'_>) -> R<Resource> {
    let r = Obj::new(v, path)?;
    Ok(Resource {
        attributes: attrs(&r)?,
        dropped_attributes_count: r.u32("droppedAttributesCount", "dropped_attributes_count")?,
        entity_refs: Vec::new(),
    })
}

fn attrs(o: &Obj<'_, '_>) -> R<Vec<KeyValue>> {
    o.array("attributes", "attributes", key_value)
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
}
