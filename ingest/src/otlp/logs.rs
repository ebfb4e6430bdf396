//! OTLP logs: protobuf decoding and normalisation to the storage model. Each record is checked
//! on its own: an invalid one is rejected and counted, the valid records of the same request
//! are kept (OTLP's partial success). A record with no body and no attributes is kept.

use std::sync::Arc;

use opentelemetry_proto::tonic::logs::v1::LogRecord as OtlpLog;
use weft_storage::model::{self as m, LogRecord, UnixNanos};

pub use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};

use super::convert::{
    Converted, Problem, SpanLimits, attributes, check_retention, check_sizes, resource, scope,
    span_id, trace_id, value,
};
use crate::error::IngestError;
use crate::pipeline::RejectReason;

/// Decodes an `ExportLogsServiceRequest` from protobuf bytes.
pub fn decode_protobuf(bytes: &[u8]) -> Result<ExportLogsServiceRequest, IngestError> {
    prost::Message::decode(bytes).map_err(|e| IngestError::Undecodable {
        format: "protobuf",
        detail: e.to_string(),
    })
}

/// The valid records of a request as storage rows. A record's time falls back to its
/// observed time and the other way round; `now` stands in for a record that has neither.
pub fn convert_request(
    req: ExportLogsServiceRequest,
    limits: SpanLimits,
    now: UnixNanos,
) -> Converted<LogRecord> {
    let mut out = Converted::default();
    for (ri, rl) in req.resource_logs.into_iter().enumerate() {
        let resource = Arc::new(resource(rl.resource, rl.schema_url));
        for (si, sl) in rl.scope_logs.into_iter().enumerate() {
            let scope = Arc::new(scope(sl.scope, sl.schema_url));
            for (i, l) in sl.log_records.into_iter().enumerate() {
                match log(l, &resource, &scope, limits, now) {
                    Ok(record) => out.rows.push(record),
                    Err((reason, problem)) => out.reject(
                        reason,
                        format!("log record {i} of scope {si} of resource {ri}: {problem}"),
                    ),
                }
            }
        }
    }
    out
}

fn log(
    l: OtlpLog,
    resource: &Arc<m::Resource>,
    scope: &Arc<m::Scope>,
    limits: SpanLimits,
    now: UnixNanos,
) -> Result<LogRecord, Problem> {
    let trace = match l.trace_id.len() {
        0 => None,
        16 if l.trace_id.iter().all(|b| *b == 0) => None,
        _ => Some(trace_id(&l.trace_id, "trace_id")?),
    };
    let span = match l.span_id.len() {
        0 => None,
        8 if l.span_id.iter().all(|b| *b == 0) => None,
        _ => Some(span_id(&l.span_id, "span_id")?),
    };
    if !(0..=24).contains(&l.severity_number) {
        return Err((
            RejectReason::InvalidEnum,
            format!(
                "severity_number {} is not a SeverityNumber (0 to 24)",
                l.severity_number
            ),
        ));
    }
    // each time stands in for the other when it is missing; `now` only when both are (a
    // record's identity includes its times, so a retry of a record with a time is the same
    // record, and one with neither cannot be told from a new one)
    let (time, observed) = match (l.time_unix_nano, l.observed_time_unix_nano) {
        (0, 0) => (now.0, now.0),
        (0, o) => (o, o),
        (t, 0) => (t, t),
        (t, o) => (t, o),
    };
    check_retention(time, "time_unix_nano", limits)?;
    check_sizes(&l.attributes, "attribute", limits)?;
    if let Some(body) = &l.body {
        let size = super::convert::value_bytes(body);
        if size > limits.max_attribute_value_bytes {
            return Err((
                RejectReason::AttributeTooLarge,
                format!(
                    "body is {size} bytes, above the limit of {} bytes",
                    limits.max_attribute_value_bytes
                ),
            ));
        }
    }
    Ok(LogRecord {
        time: UnixNanos(time),
        observed_time: UnixNanos(observed),
        severity_number: l.severity_number,
        severity_text: l.severity_text,
        body: l.body.map(value).unwrap_or_default(),
        attributes: attributes(l.attributes),
        dropped_attributes_count: l.dropped_attributes_count,
        flags: l.flags,
        trace_id: trace,
        span_id: span,
        event_name: l.event_name,
        resource: resource.clone(),
        scope: scope.clone(),
        // parsed after redaction (see `crate::semantic`)
        semantics: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::logs::v1::{ResourceLogs, ScopeLogs};

    fn request(logs: Vec<OtlpLog>) -> ExportLogsServiceRequest {
        ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs {
                    log_records: logs,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    const LIMITS: SpanLimits = SpanLimits {
        max_attribute_value_bytes: 1024,
        retention: None,
        shape: crate::otlp::convert::ShapeLimits::NONE,
    };

    #[test]
    fn a_record_with_a_bad_id_is_rejected_alone() {
        let good = OtlpLog {
            time_unix_nano: 5,
            ..Default::default()
        };
        let bad = OtlpLog {
            trace_id: vec![1; 15],
            ..Default::default()
        };
        let out = convert_request(request(vec![good, bad]), LIMITS, UnixNanos(9));
        assert_eq!(out.rows.len(), 1);
        assert_eq!(out.rejected, vec![(RejectReason::InvalidId, 1)]);
        let msg = out.first_error.unwrap();
        assert!(
            msg.contains("log record 1") && msg.contains("trace_id must be 16 bytes"),
            "{msg}"
        );
    }

    #[test]
    fn an_empty_record_is_kept_and_timed_by_what_is_known() {
        let out = convert_request(
            request(vec![
                OtlpLog::default(),
                OtlpLog {
                    observed_time_unix_nano: 7,
                    ..Default::default()
                },
            ]),
            LIMITS,
            UnixNanos(9),
        );
        assert_eq!(out.rows.len(), 2);
        assert_eq!(
            (out.rows[0].time, out.rows[0].observed_time),
            (UnixNanos(9), UnixNanos(9))
        );
        assert_eq!(
            (out.rows[1].time, out.rows[1].observed_time),
            (UnixNanos(7), UnixNanos(7))
        );
        assert_eq!(out.rows[0].body, m::Value::Empty);
    }
}
