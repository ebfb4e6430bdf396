//! OTLP spans to storage rows. Each span is checked on its own: an invalid span is rejected and
//! counted, the valid spans of the same request are kept (OTLP's partial success).

use std::sync::Arc;

use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{Span, span};
use weft_storage::model::{self as m, SpanId, SpanRecord, TraceId, UnixNanos};

use super::ExportTraceServiceRequest;
use crate::pipeline::RejectReason;

/// Limits applied to each span.
#[derive(Clone, Copy, Debug, Default)]
pub struct SpanLimits {
    /// Largest accepted attribute value (strings and bytes, summed through arrays and maps).
    pub max_attribute_value_bytes: usize,
    /// The tenant's retention: spans starting before its cutoff are refused (they would never
    /// be readable), with the retention named in the message.
    pub retention: Option<(UnixNanos, std::time::Duration)>,
    /// Counts and key lengths.
    pub shape: ShapeLimits,
}

/// How many attributes, events and links a row may carry, and how long a key may be; a row
/// past one is refused, the limit named in `partial_success`. 0: no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShapeLimits {
    pub attributes: usize,
    pub key_bytes: usize,
    pub events: usize,
    pub links: usize,
}

impl ShapeLimits {
    pub const NONE: Self = Self {
        attributes: 0,
        key_bytes: 0,
        events: 0,
        links: 0,
    };

    /// Refuses `n` items of `what` past `max` (0: no limit), naming the flag.
    fn check(n: usize, max: usize, what: &str, flag: &str) -> Result<(), Problem> {
        if max > 0 && n > max {
            return Err((
                RejectReason::LimitExceeded,
                format!("{n} {what}, above the limit of {max} ({flag})"),
            ));
        }
        Ok(())
    }
}

/// The rows of a request that passed validation, and what happened to the others.
#[derive(Debug)]
pub struct Converted<R = SpanRecord> {
    pub rows: Vec<R>,
    pub rejected: Vec<(RejectReason, usize)>,
    pub first_error: Option<String>,
}

impl<R> Default for Converted<R> {
    fn default() -> Self {
        Self {
            rows: Vec::new(),
            rejected: Vec::new(),
            first_error: None,
        }
    }
}

impl<R> Converted<R> {
    pub fn rejected_count(&self) -> usize {
        self.rejected.iter().map(|(_, n)| n).sum()
    }
    pub(crate) fn reject(&mut self, reason: RejectReason, message: String) {
        match self.rejected.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n += 1,
            None => self.rejected.push((reason, 1)),
        }
        self.first_error.get_or_insert(message);
    }
}

pub fn convert_request(req: ExportTraceServiceRequest, limits: SpanLimits) -> Converted {
    let mut out = Converted::default();
    for (ri, rs) in req.resource_spans.into_iter().enumerate() {
        let resource = Arc::new(resource(rs.resource, rs.schema_url));
        for (si, ss) in rs.scope_spans.into_iter().enumerate() {
            let scope = Arc::new(scope(ss.scope, ss.schema_url));
            for (i, s) in ss.spans.into_iter().enumerate() {
                match span(s, &resource, &scope, limits) {
                    Ok(record) => out.rows.push(record),
                    Err((reason, problem)) => out.reject(
                        reason,
                        format!("span {i} of scope {si} of resource {ri}: {problem}"),
                    ),
                }
            }
        }
    }
    out
}

pub(crate) fn resource(r: Option<Resource>, schema_url: String) -> m::Resource {
    let r = r.unwrap_or_default();
    m::Resource {
        attributes: attributes(r.attributes),
        dropped_attributes_count: r.dropped_attributes_count,
        schema_url,
    }
}

pub(crate) fn scope(s: Option<InstrumentationScope>, schema_url: String) -> m::Scope {
    let s = s.unwrap_or_default();
    m::Scope {
        name: s.name,
        version: s.version,
        attributes: attributes(s.attributes),
        dropped_attributes_count: s.dropped_attributes_count,
        schema_url,
    }
}

pub(crate) type Problem = (RejectReason, String);

/// A retention as its configuration would say it (`30d`, `12h`, `90s`).
fn human_duration(d: std::time::Duration) -> String {
    let secs = d.as_secs();
    match secs {
        s if s > 0 && s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s > 0 && s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s > 0 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

pub(crate) fn trace_id(bytes: &[u8], field: &str) -> Result<TraceId, Problem> {
    let id = TraceId::from_slice(bytes).ok_or_else(|| {
        (
            RejectReason::InvalidId,
            format!("{field} must be 16 bytes, got {}", bytes.len()),
        )
    })?;
    if id.is_zero() {
        return Err((RejectReason::InvalidId, format!("{field} is all zeros")));
    }
    Ok(id)
}

pub(crate) fn span_id(bytes: &[u8], field: &str) -> Result<SpanId, Problem> {
    let id = SpanId::from_slice(bytes).ok_or_else(|| {
        (
            RejectReason::InvalidId,
            format!("{field} must be 8 bytes, got {}", bytes.len()),
        )
    })?;
    if id.is_zero() {
        return Err((RejectReason::InvalidId, format!("{field} is all zeros")));
    }
    Ok(id)
}

fn span(
    s: Span,
    resource: &Arc<m::Resource>,
    scope: &Arc<m::Scope>,
    limits: SpanLimits,
) -> Result<SpanRecord, Problem> {
    let trace = trace_id(&s.trace_id, "trace_id")?;
    let id = span_id(&s.span_id, "span_id")?;
    let parent = match s.parent_span_id.len() {
        0 => None,
        _ if s.parent_span_id.iter().all(|b| *b == 0) => None,
        _ => Some(span_id(&s.parent_span_id, "parent_span_id")?),
    };
    if s.end_time_unix_nano < s.start_time_unix_nano {
        return Err((
            RejectReason::EndBeforeStart,
            "end_time_unix_nano is before start_time_unix_nano".to_owned(),
        ));
    }
    check_retention(s.start_time_unix_nano, "start_time_unix_nano", limits)?;
    let kind = u8::try_from(s.kind)
        .ok()
        .filter(|k| *k <= 5)
        .ok_or_else(|| {
            (
                RejectReason::InvalidEnum,
                format!("kind {} is not a SpanKind (0 to 5)", s.kind),
            )
        })?;
    let status = s.status.unwrap_or_default();
    let code = u8::try_from(status.code)
        .ok()
        .filter(|c| *c <= 2)
        .ok_or_else(|| {
            (
                RejectReason::InvalidEnum,
                format!("status.code {} is not a StatusCode (0 to 2)", status.code),
            )
        })?;
    let check = |kvs: &[KeyValue], field: &str| check_sizes(kvs, field, limits);
    let shape = limits.shape;
    ShapeLimits::check(s.events.len(), shape.events, "events", "--max-span-events")?;
    ShapeLimits::check(s.links.len(), shape.links, "links", "--max-span-links")?;
    check(&s.attributes, "attribute")?;
    for e in &s.events {
        check(&e.attributes, "event attribute")?;
    }
    for l in &s.links {
        check(&l.attributes, "link attribute")?;
    }
    let links = s
        .links
        .into_iter()
        .enumerate()
        .map(|(i, l)| link(l).map_err(|(r, p)| (r, format!("link {i}: {p}"))))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(SpanRecord {
        trace_id: trace,
        span_id: id,
        parent_span_id: parent,
        trace_state: s.trace_state,
        flags: s.flags,
        name: s.name,
        kind: m::SpanKind::from_u8(kind),
        start: UnixNanos(s.start_time_unix_nano),
        end: UnixNanos(s.end_time_unix_nano),
        attributes: attributes(s.attributes),
        dropped_attributes_count: s.dropped_attributes_count,
        events: s.events.into_iter().map(event).collect(),
        dropped_events_count: s.dropped_events_count,
        links,
        dropped_links_count: s.dropped_links_count,
        status_code: m::StatusCode::from_u8(code),
        status_message: status.message,
        resource: resource.clone(),
        scope: scope.clone(),
    })
}

fn event(e: span::Event) -> m::Event {
    m::Event {
        time: UnixNanos(e.time_unix_nano),
        name: e.name,
        attributes: attributes(e.attributes),
        dropped_attributes_count: e.dropped_attributes_count,
    }
}

fn link(l: span::Link) -> Result<m::Link, Problem> {
    Ok(m::Link {
        trace_id: trace_id(&l.trace_id, "trace_id")?,
        span_id: span_id(&l.span_id, "span_id")?,
        trace_state: l.trace_state,
        attributes: attributes(l.attributes),
        dropped_attributes_count: l.dropped_attributes_count,
        flags: l.flags,
    })
}

/// Refuses a row whose time is older than the tenant's retention cutoff.
pub(crate) fn check_retention(time: u64, field: &str, limits: SpanLimits) -> Result<(), Problem> {
    match limits.retention {
        Some((cutoff, kept)) if time < cutoff.0 => Err((
            RejectReason::Expired,
            format!(
                "{field} is older than the tenant's retention of {}",
                human_duration(kept)
            ),
        )),
        _ => Ok(()),
    }
}

/// Refuses attributes with a value above the size limit, naming the key.
pub(crate) fn check_sizes(
    kvs: &[KeyValue],
    field: &str,
    limits: SpanLimits,
) -> Result<(), Problem> {
    let shape = limits.shape;
    ShapeLimits::check(
        kvs.len(),
        shape.attributes,
        &format!("{field}s"),
        "--max-attributes",
    )?;
    for kv in kvs {
        if shape.key_bytes > 0 && kv.key.len() > shape.key_bytes {
            return Err((
                RejectReason::LimitExceeded,
                format!(
                    "{field} key of {} bytes (starting {:?}), above the limit of {} bytes (--max-attribute-key-bytes)",
                    kv.key.len(),
                    kv.key.chars().take(32).collect::<String>(),
                    shape.key_bytes
                ),
            ));
        }
        let size = kv.value.as_ref().map_or(0, value_bytes);
        if size > limits.max_attribute_value_bytes {
            return Err((
                RejectReason::AttributeTooLarge,
                format!(
                    "{field} {:?} is {size} bytes, above the limit of {} bytes",
                    kv.key, limits.max_attribute_value_bytes
                ),
            ));
        }
    }
    Ok(())
}

pub(crate) fn value_bytes(v: &AnyValue) -> usize {
    match &v.value {
        Some(any_value::Value::StringValue(s)) => s.len(),
        Some(any_value::Value::BytesValue(b)) => b.len(),
        Some(any_value::Value::ArrayValue(a)) => a.values.iter().map(value_bytes).sum(),
        Some(any_value::Value::KvlistValue(kv)) => kv
            .values
            .iter()
            .map(|kv| kv.key.len() + kv.value.as_ref().map_or(0, value_bytes))
            .sum(),
        _ => 8,
    }
}

pub fn attributes(kvs: Vec<KeyValue>) -> Vec<m::KeyValue> {
    kvs.into_iter()
        .map(|kv| m::KeyValue {
            key: kv.key,
            value: kv.value.map(value).unwrap_or_default(),
        })
        .collect()
}

pub(crate) fn value(v: AnyValue) -> m::Value {
    use any_value::Value as V;
    match v.value {
        None => m::Value::Empty,
        Some(V::StringValue(s)) => m::Value::Str(s),
        Some(V::BoolValue(b)) => m::Value::Bool(b),
        Some(V::IntValue(i)) => m::Value::Int(i),
        Some(V::DoubleValue(d)) => m::Value::Double(d),
        Some(V::BytesValue(b)) => m::Value::Bytes(b),
        Some(V::ArrayValue(a)) => m::Value::Array(a.values.into_iter().map(value).collect()),
        Some(V::KvlistValue(kv)) => m::Value::KvList(attributes(kv.values)),
        // Reserved for OTLP profiles' string tables; never valid in traces.
        Some(V::StringValueStrindex(_)) => m::Value::Empty,
    }
}
