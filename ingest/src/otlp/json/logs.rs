//! OTLP/JSON of logs: `ExportLogsServiceRequest` decoded with errors naming the exact path.

use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use serde_json::Value as J;

use super::*;
use crate::otlp::logs::ExportLogsServiceRequest;

/// `SeverityNumber`'s names, by number.
const SEVERITIES: &[&str] = &[
    "SEVERITY_NUMBER_UNSPECIFIED",
    "SEVERITY_NUMBER_TRACE",
    "SEVERITY_NUMBER_TRACE2",
    "SEVERITY_NUMBER_TRACE3",
    "SEVERITY_NUMBER_TRACE4",
    "SEVERITY_NUMBER_DEBUG",
    "SEVERITY_NUMBER_DEBUG2",
    "SEVERITY_NUMBER_DEBUG3",
    "SEVERITY_NUMBER_DEBUG4",
    "SEVERITY_NUMBER_INFO",
    "SEVERITY_NUMBER_INFO2",
    "SEVERITY_NUMBER_INFO3",
    "SEVERITY_NUMBER_INFO4",
    "SEVERITY_NUMBER_WARN",
    "SEVERITY_NUMBER_WARN2",
    "SEVERITY_NUMBER_WARN3",
    "SEVERITY_NUMBER_WARN4",
    "SEVERITY_NUMBER_ERROR",
    "SEVERITY_NUMBER_ERROR2",
    "SEVERITY_NUMBER_ERROR3",
    "SEVERITY_NUMBER_ERROR4",
    "SEVERITY_NUMBER_FATAL",
    "SEVERITY_NUMBER_FATAL2",
    "SEVERITY_NUMBER_FATAL3",
    "SEVERITY_NUMBER_FATAL4",
];

fn decode_log(v: &J, path: &Path<'_>) -> R<LogRecord> {
    let o = Obj::new(v, path)?;
    Ok(LogRecord {
        time_unix_nano: o.u64("timeUnixNano", "time_unix_nano")?,
        observed_time_unix_nano: o.u64("observedTimeUnixNano", "observed_time_unix_nano")?,
        severity_number: o.enumeration("severityNumber", SEVERITIES)?,
        severity_text: o.string("severityText", "severity_text")?,
        body: o.object("body", "body", any_value)?,
        attributes: attrs(&o)?,
        dropped_attributes_count: o.u32("droppedAttributesCount", "dropped_attributes_count")?,
        flags: o.u32("flags", "flags")?,
        trace_id: o.hex("traceId", "trace_id")?,
        span_id: o.hex("spanId", "span_id")?,
        event_name: o.string("eventName", "event_name")?,
    })
}

fn decode_scope_logs(v: &J, path: &Path<'_>) -> R<ScopeLogs> {
    let o = Obj::new(v, path)?;
    Ok(ScopeLogs {
        scope: o.object("scope", "scope", decode_scope)?,
        log_records: o.array("logRecords", "log_records", decode_log)?,
        schema_url: o.string("schemaUrl", "schema_url")?,
    })
}

fn decode_resource_logs(v: &J, path: &Path<'_>) -> R<ResourceLogs> {
    let o = Obj::new(v, path)?;
    Ok(ResourceLogs {
        resource: o.object("resource", "resource", decode_resource)?,
        scope_logs: o.array("scopeLogs", "scope_logs", decode_scope_logs)?,
        schema_url: o.string("schemaUrl", "schema_url")?,
    })
}

/// Decodes an OTLP/JSON `ExportLogsServiceRequest`.
pub fn decode_logs_request(bytes: &[u8]) -> Result<ExportLogsServiceRequest, IngestError> {
    let resource_logs = top_array(bytes, "resourceLogs", "resource_logs", decode_resource_logs)?;
    Ok(ExportLogsServiceRequest { resource_logs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_request_decodes_with_names_and_numbers() {
        let doc = br#"{"resourceLogs":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"vllm"}}]},
          "scopeLogs":[{"scope":{"name":"s"},"logRecords":[
            {"timeUnixNano":"1700000000000000000","severityNumber":"SEVERITY_NUMBER_ERROR","severityText":"ERROR",
             "body":{"stringValue":"decode stalled"},"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060708",
             "eventName":"gen_ai.choice"},
            {"observedTimeUnixNano":1700000000000000001,"severityNumber":9}]}]}]}"#;
        let req = decode_logs_request(doc).unwrap();
        let logs = &req.resource_logs[0].scope_logs[0].log_records;
        assert_eq!(logs[0].severity_number, 17);
        assert_eq!(logs[0].trace_id.len(), 16);
        assert_eq!(logs[0].event_name, "gen_ai.choice");
        assert_eq!(logs[1].observed_time_unix_nano, 1_700_000_000_000_000_001);
        assert_eq!(logs[1].severity_number, 9);
    }

    #[test]
    fn a_bad_field_is_named_with_its_path() {
        let doc = br#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"severityText":3}]}]}]}"#;
        let e = decode_logs_request(doc).unwrap_err().to_string();
        assert!(
            e.contains("resourceLogs[0].scopeLogs[0].logRecords[0].severityText"),
            "{e}"
        );
    }
}
