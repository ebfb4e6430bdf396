//! The storage data model: spans as Weft keeps them, independent of any wire format.
//!
//! Ids and units are newtypes. A [`SpanRecord`] carries everything OTLP can say about a span
//! (resource, scope, events, links, trace state, flags, dropped counts, status) so that a trace
//! read back equals what was sent, up to ordering.

use std::fmt;
use std::sync::Arc;

use crate::error::{Result, StorageError};

mod log;
mod metric;
pub use log::{LogClass, LogRecord, LogSemantics};
pub use metric::{
    Exemplar, ExpBuckets, MetricKind, MetricPoint, PointValue, Series, SeriesId, Temporality,
};

/// The tenant a row belongs to; the first component of every key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(String);

impl TenantId {
    /// The tenant used when a request names none.
    pub const DEFAULT: &'static str = "single-tenant";
    const MAX_LEN: usize = 128;

    /// Validates a tenant name: 1 to 128 characters of `[A-Za-z0-9_.-]`.
    pub fn new(name: &str) -> Result<Self> {
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
        if name.is_empty() || name.len() > Self::MAX_LEN || !name.chars().all(ok_char) {
            return Err(StorageError::InvalidTenant {
                name: name.chars().take(Self::MAX_LEN).collect(),
            });
        }
        Ok(Self(name.to_owned()))
    }

    pub fn default_tenant() -> Self {
        Self(Self::DEFAULT.to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A 16-byte trace id; all zeros is invalid.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct TraceId(pub [u8; 16]);

/// An 8-byte span id; all zeros is invalid.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct SpanId(pub [u8; 8]);

/// Each byte's value as a hex digit (either case), 0xff for any other byte.
const HEX_DIGIT: [u8; 256] = {
    let mut t = [0xffu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

macro_rules! hex_id {
    ($t:ident, $n:expr, $what:expr) => {
        impl $t {
            pub fn from_slice(bytes: &[u8]) -> Option<Self> {
                <[u8; $n]>::try_from(bytes).ok().map(Self)
            }
            /// Parses lower- or upper-case hex of exactly the right length.
            pub fn from_hex(text: &str) -> Result<Self> {
                let b = text.as_bytes();
                if b.len() == 2 * $n {
                    // a table look-up per digit (joins parse a trace id per run of rows)
                    let mut out = [0u8; $n];
                    let mut bad = 0u8;
                    for (o, pair) in out.iter_mut().zip(b.chunks_exact(2)) {
                        let (hi, lo) = (HEX_DIGIT[pair[0] as usize], HEX_DIGIT[pair[1] as usize]);
                        bad |= hi | lo;
                        *o = (hi << 4) | (lo & 0x0f);
                    }
                    if bad & 0xf0 == 0 {
                        return Ok(Self(out));
                    }
                }
                Err(StorageError::InvalidId {
                    what: $what,
                    value: text.chars().take(64).collect(),
                })
            }
            pub fn to_hex(&self) -> String {
                hex::encode(self.0)
            }
            pub fn is_zero(&self) -> bool {
                self.0.iter().all(|b| *b == 0)
            }
        }
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.to_hex())
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.to_hex())
            }
        }
    };
}
hex_id!(TraceId, 16, "trace id");
hex_id!(SpanId, 8, "span id");

/// Nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct UnixNanos(pub u64);

/// An attribute value, as rich as OTLP's `AnyValue`.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum Value {
    #[default]
    Empty,
    Str(String),
    Bool(bool),
    Int(i64),
    Double(f64),
    Bytes(Vec<u8>),
    Array(Vec<Value>),
    KvList(Vec<KeyValue>),
}

impl Value {
    /// Approximate stored size, used for limits and for the long-value decision.
    pub fn byte_len(&self) -> usize {
        match self {
            Value::Empty | Value::Bool(_) => 1,
            Value::Int(_) | Value::Double(_) => 8,
            Value::Str(s) => s.len(),
            Value::Bytes(b) => b.len(),
            Value::Array(a) => a.iter().map(Value::byte_len).sum(),
            Value::KvList(kv) => kv.iter().map(|kv| kv.key.len() + kv.value.byte_len()).sum(),
        }
    }

    /// An attribute value as map text: strings as they are, numbers and bools as SQL would print
    /// them, arrays and maps as JSON.
    pub fn text(&self) -> Option<String> {
        Some(match self {
            Value::Empty => return None,
            Value::Str(s) => s.clone(),
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::Double(d) => d.to_string(),
            Value::Bytes(b) => hex::encode(b),
            other => other.json(),
        })
    }

    /// The value as JSON text (bytes as a hex string, non-finite floats as null).
    pub fn json(&self) -> String {
        fn go(v: &Value, out: &mut String) {
            match v {
                Value::Empty => out.push_str("null"),
                Value::Str(s) => {
                    out.push('"');
                    for c in s.chars() {
                        match c {
                            '"' => out.push_str("\\\""),
                            '\\' => out.push_str("\\\\"),
                            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                            c => out.push(c),
                        }
                    }
                    out.push('"');
                }
                Value::Bool(b) => out.push_str(&b.to_string()),
                Value::Int(i) => out.push_str(&i.to_string()),
                Value::Double(d) if d.is_finite() => out.push_str(&d.to_string()),
                Value::Double(_) => out.push_str("null"),
                Value::Bytes(b) => go(&Value::Str(hex::encode(b)), out),
                Value::Array(items) => {
                    out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        go(item, out);
                    }
                    out.push(']');
                }
                Value::KvList(kvs) => {
                    out.push('{');
                    for (i, kv) in kvs.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        go(&Value::Str(kv.key.clone()), out);
                        out.push(':');
                        go(&kv.value, out);
                    }
                    out.push('}');
                }
            }
        }
        let mut out = String::new();
        go(self, &mut out);
        out
    }

    /// The value as an index term (strings, ints and bools only).
    pub fn as_term(&self) -> Option<String> {
        match self {
            Value::Str(s) => Some(s.clone()),
            Value::Int(i) => Some(i.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct KeyValue {
    pub key: String,
    pub value: Value,
}

impl KeyValue {
    pub fn new(key: impl Into<String>, value: Value) -> Self {
        Self {
            key: key.into(),
            value,
        }
    }
}

/// The entity that produced telemetry (`service.name` and friends).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Resource {
    pub attributes: Vec<KeyValue>,
    pub dropped_attributes_count: u32,
    pub schema_url: String,
}

impl Resource {
    /// `service.name`, or OTLP's documented fallback.
    pub fn service_name(&self) -> &str {
        self.attributes
            .iter()
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| match &kv.value {
                Value::Str(s) => Some(s.as_str()),
                _ => None,
            })
            .unwrap_or("unknown_service")
    }
}

/// The instrumentation scope that emitted a span.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Scope {
    pub name: String,
    pub version: String,
    pub attributes: Vec<KeyValue>,
    pub dropped_attributes_count: u32,
    pub schema_url: String,
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Event {
    pub time: UnixNanos,
    pub name: String,
    pub attributes: Vec<KeyValue>,
    pub dropped_attributes_count: u32,
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Link {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub trace_state: String,
    pub attributes: Vec<KeyValue>,
    pub dropped_attributes_count: u32,
    pub flags: u32,
}

/// OTLP span kinds, with their wire numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum SpanKind {
    #[default]
    Unspecified = 0,
    Internal = 1,
    Server = 2,
    Client = 3,
    Producer = 4,
    Consumer = 5,
}

impl SpanKind {
    pub fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Internal,
            2 => Self::Server,
            3 => Self::Client,
            4 => Self::Producer,
            5 => Self::Consumer,
            _ => Self::Unspecified,
        }
    }

    /// The kind's name as SQL shows it (and postings index it); OTLP lets receivers treat
    /// UNSPECIFIED as INTERNAL.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Server => "SERVER",
            Self::Client => "CLIENT",
            Self::Producer => "PRODUCER",
            Self::Consumer => "CONSUMER",
            Self::Internal | Self::Unspecified => "INTERNAL",
        }
    }
}

/// OTLP status codes, with their wire numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum StatusCode {
    #[default]
    Unset = 0,
    Ok = 1,
    Error = 2,
}

impl StatusCode {
    pub fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Ok,
            2 => Self::Error,
            _ => Self::Unset,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unset => "UNSET",
            Self::Ok => "OK",
            Self::Error => "ERROR",
        }
    }
}

/// One span with everything needed to give it back losslessly.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct SpanRecord {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub parent_span_id: Option<SpanId>,
    pub trace_state: String,
    pub flags: u32,
    pub name: String,
    pub kind: SpanKind,
    pub start: UnixNanos,
    pub end: UnixNanos,
    pub attributes: Vec<KeyValue>,
    pub dropped_attributes_count: u32,
    pub events: Vec<Event>,
    pub dropped_events_count: u32,
    pub links: Vec<Link>,
    pub dropped_links_count: u32,
    pub status_code: StatusCode,
    pub status_message: String,
    pub resource: Arc<Resource>,
    pub scope: Arc<Scope>,
}

impl SpanRecord {
    pub fn duration_ns(&self) -> u64 {
        self.end.0.saturating_sub(self.start.0)
    }
    pub fn service_name(&self) -> &str {
        self.resource.service_name()
    }
    pub fn attribute(&self, key: &str) -> Option<&Value> {
        self.attributes
            .iter()
            .find(|kv| kv.key == key)
            .map(|kv| &kv.value)
    }
}

#[cfg(test)]
mod hex_tests {
    use super::*;

    #[test]
    fn ids_parse_from_hex_of_either_case_and_nothing_else() {
        let id = TraceId([
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54,
            0x32, 0x10,
        ]);
        assert_eq!(TraceId::from_hex(&id.to_hex()).unwrap(), id);
        assert_eq!(
            TraceId::from_hex("0123456789ABCDEFFEDCBA9876543210").unwrap(),
            id
        );
        for bad in [
            "",
            "0123456789abcdeffedcba987654321",
            "0123456789abcdeffedcba98765432100",
            "0123456789abcdeffedcba987654321g",
            "g123456789abcdeffedcba9876543210",
            "0123456789abcdeffedcba98765432 0",
            "0123456789abcdeffedcba98765432é",
        ] {
            assert!(TraceId::from_hex(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            SpanId::from_hex("00000000000000ff").unwrap(),
            SpanId([0, 0, 0, 0, 0, 0, 0, 0xff])
        );
        assert!(SpanId::from_hex("00000000000000fz").is_err());
    }
}
