"""Logs sent by the official OpenTelemetry Python SDK (its bridge from Python's `logging`), over
OTLP/HTTP and OTLP/gRPC, read back with SQL through the PostgreSQL endpoint and joined to the
spans they were logged under; and OTLP/JSON log exports with a record that must be refused
alone."""

import json
import logging
import urllib.request

import psycopg
import pytest
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor


def exporters(weft, transport, tenant):
    if transport == "http":
        headers = {"X-Scope-OrgID": tenant}
        return (HttpSpanExporter(endpoint=f"{weft.otlp_http}/v1/traces", headers=headers),
                HttpLogExporter(endpoint=f"{weft.otlp_http}/v1/logs", headers=headers))
    headers = (("x-scope-orgid", tenant),)
    return (GrpcSpanExporter(endpoint=weft.otlp_grpc, insecure=True, headers=headers),
            GrpcLogExporter(endpoint=weft.otlp_grpc, insecure=True, headers=headers))


def sql(weft, tenant, query, params=()):
    with psycopg.connect(host="127.0.0.1", port=weft.pg_port, dbname=tenant, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_sdk_logs_are_stored_and_join_the_spans_they_were_logged_under(weft, transport):
    tenant = f"logs-{transport}"
    span_exporter, log_exporter = exporters(weft, transport, tenant)
    resource = Resource.create({"service.name": f"py-engine-{transport}"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(log_exporter))
    log = logging.getLogger(f"weft.e2e.{transport}")
    log.propagate = False
    log.setLevel(logging.INFO)
    handler = LoggingHandler(level=logging.INFO, logger_provider=logger_provider)
    log.addHandler(handler)
    tracer = tracer_provider.get_tracer("weft-e2e")
    with tracer.start_as_current_span("llm.generate") as generate:
        log.info("prefill done prefill_ms=12.5 kv_cache_hit_rate=0.82", extra={"worker.id": "w-7"})
        log.error("KV cache exhausted · décodage")
    log.warning("no request in flight")
    tracer_provider.force_flush()
    logger_provider.force_flush()
    log.removeHandler(handler)
    tracer_provider.shutdown()
    logger_provider.shutdown()

    trace_id = format(generate.get_span_context().trace_id, "032x")
    span_id = format(generate.get_span_context().span_id, "016x")
    rows = sql(weft, tenant,
               "SELECT severity_text, severity_number, body, trace_id, span_id, service_name, "
               "attributes['worker.id'], scope_name, class, \"llm.prefill_ms\", \"llm.kv_cache.hit_rate\", "
               "\"worker.id\" FROM logs ORDER BY time")
    assert len(rows) == 3, rows
    info, error, warning = rows
    assert info[:6] == ("INFO", 9, "prefill done prefill_ms=12.5 kv_cache_hit_rate=0.82",
                        trace_id, span_id, f"py-engine-{transport}")
    assert info[6] == "w-7"
    assert info[7] == f"weft.e2e.{transport}"
    # parsed from the body and attributes into typed columns
    assert info[8:] == ("inference_metrics", 12.5, 0.82, "w-7")
    assert error[8] == "error" and warning[8] == "other"
    assert error[:3] == ("ERROR", 17, "KV cache exhausted · décodage")
    assert warning[0] == "WARN" and warning[3] is None and warning[4] is None
    joined = sql(weft, tenant,
                 "SELECT s.name, l.severity_text FROM logs l JOIN spans s "
                 "ON l.trace_id = s.trace_id AND l.span_id = s.span_id ORDER BY l.time")
    assert joined == [("llm.generate", "INFO"), ("llm.generate", "ERROR")]
    # another tenant sees none of them
    assert sql(weft, "someone-else", "SELECT count(*) FROM logs") == [(0,)]


def post_logs(weft, body, tenant="json-logs"):
    req = urllib.request.Request(
        f"{weft.otlp_http}/v1/logs",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "X-Scope-OrgID": tenant},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
        return json.loads(r.read())


def test_a_json_log_export_refuses_a_bad_record_alone_and_keeps_an_empty_one(weft):
    records = [
        {"timeUnixNano": "1764460800000000000", "severityNumber": "SEVERITY_NUMBER_WARN",
         "severityText": "WARN", "body": {"kvlistValue": {"values": [
             {"key": "prefill_ms", "value": {"doubleValue": 12.5}}]}},
         "eventName": "vllm.inference.metrics"},
        {"timeUnixNano": "1764460800000000001", "traceId": "abcd", "body": {"stringValue": "bad id"}},
        {"observedTimeUnixNano": "1764460800000000002"},
    ]
    body = {"resourceLogs": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "vllm"}}]},
        "scopeLogs": [{"scope": {"name": "vllm.engine"}, "logRecords": records}],
    }]}
    answer = post_logs(weft, body)
    partial = answer["partialSuccess"]
    assert partial["rejectedLogRecords"] == "1"
    assert "log record 1 of scope 0 of resource 0: trace_id must be 16 bytes" in partial["errorMessage"]
    # the same export again (a client's retry) stores nothing twice
    post_logs(weft, body)
    rows = sql(weft, "json-logs",
               "SELECT body, event_name, severity_number, time = observed_time FROM logs ORDER BY time")
    assert rows == [('{"prefill_ms":12.5}', "vllm.inference.metrics", 13, True), (None, "", 0, True)]
    with urllib.request.urlopen(f"{weft.http}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert "weft_logs_accepted_total 2" in metrics
    assert "weft_logs_duplicate_total 2" in metrics
    assert 'weft_logs_rejected_total{reason="invalid_id"} 2' in metrics
