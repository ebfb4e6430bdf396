"""Traces sent by the official OpenTelemetry Python SDK, over OTLP/HTTP and OTLP/gRPC, read
back through Weft's API and compared field by field with what the SDK recorded."""

import base64
import hashlib
import json
import urllib.parse
import urllib.request

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode


def make_exporter(weft, transport, tenant):
    if transport == "http":
        return HttpExporter(endpoint=f"{weft.otlp_http}/v1/traces", headers={"X-Scope-OrgID": tenant})
    return GrpcExporter(endpoint=weft.otlp_grpc, insecure=True, headers=(("x-scope-orgid", tenant),))


def emit(weft, transport, tenant):
    """Emits one LLM request trace; returns the spans as the SDK finished them."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": f"py-gateway-{transport}", "deployment.environment.name": "test"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.add_span_processor(BatchSpanProcessor(make_exporter(weft, transport, tenant)))
    tracer = provider.get_tracer("weft-e2e", "1.2.3")
    with tracer.start_as_current_span("warmup") as other:
        pass
    with tracer.start_as_current_span("POST /v1/chat/completions", kind=SpanKind.SERVER, attributes={
        "http.route": "/v1/chat/completions", "http.response.status_code": 200, "ratio": 0.25, "cached": True,
        "tags": ["a", "b"], "counts": [1, 2, 3],
    }) as root:
        root.add_event("request.received", {"bytes": 812})
        with tracer.start_as_current_span("chat llama-3.1-8b", kind=SpanKind.CLIENT, links=[Link(other.get_span_context(), {"why": "retry-of"})], attributes={
            "gen_ai.operation.name": "chat", "gen_ai.system": "vllm", "gen_ai.request.model": "llama-3.1-8b",
            "gen_ai.usage.prompt_tokens": 812, "gen_ai.usage.output_tokens": 20,
            "gen_ai.response.finish_reasons": ["stop"], "llm.model_version": "llama-3.1-8b-2025-10",
            "llm.lora_adapter": "support-v3", "llm.batch_size": 8, "worker.id": "worker-1",
            "gen_ai.input.messages": json.dumps([{"role": "user", "content": "hello " * 400}]),
        }) as chat:
            for i in range(20):
                with tracer.start_as_current_span("llm.decode.token", attributes={"llm.token.index": i, "llm.token.latency_ms": 20.5 + i}):
                    pass
            chat.set_status(Status(StatusCode.ERROR, "KV cache exhausted"))
    provider.force_flush()
    provider.shutdown()
    return memory.get_finished_spans()


def otlp_value(v):
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, str):
        return {"stringValue": v}
    if isinstance(v, (tuple, list)):
        return {"arrayValue": {"values": [otlp_value(x) for x in v]}}
    raise TypeError(v)


def attrs(mapping):
    return sorted(({"key": k, "value": otlp_value(v)} for k, v in mapping.items()), key=lambda a: a["key"])


def redacted(mapping):
    """The attributes as Weft stores them by default: a content attribute (a prompt) becomes
    the first 16 hex digits of its SHA-256 and its length in bytes."""
    out = {}
    for k, v in mapping.items():
        if k == "gen_ai.input.messages":
            out[f"{k}.hash"] = hashlib.sha256(v.encode()).hexdigest()[:16]
            out[f"{k}.length"] = len(v.encode())
        else:
            out[k] = v
    return out


def get(url, tenant):
    req = urllib.request.Request(url, headers={"X-Scope-OrgID": tenant})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_sdk_spans_read_back_field_by_field(weft, transport):
    tenant = f"py-{transport}"
    finished = emit(weft, transport, tenant)
    trace_id = format(finished[-1].context.trace_id, "032x")
    doc = get(f"{weft.http}/api/v1/traces/{trace_id}", tenant)
    stored = {}
    for rs in doc["resourceSpans"]:
        resource = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                stored[s["spanId"]] = (resource, ss["scope"], s)
    sent = [s for s in finished if s.context.trace_id == finished[-1].context.trace_id]
    assert len(stored) == len(sent) == 22
    for span in sent:
        resource, scope, got = stored[format(span.context.span_id, "016x")]
        assert resource == {a["key"]: a["value"] for a in attrs(dict(span.resource.attributes))}
        assert scope["name"] == "weft-e2e" and scope["version"] == "1.2.3"
        assert got["traceId"] == trace_id
        assert got["name"] == span.name
        assert got["kind"] == span.kind.value + 1  # the SDK counts from INTERNAL = 0
        assert int(got["startTimeUnixNano"]) == span.start_time
        assert int(got["endTimeUnixNano"]) == span.end_time
        assert got.get("parentSpanId", "") == (format(span.parent.span_id, "016x") if span.parent else "")
        assert sorted(got["attributes"], key=lambda a: a["key"]) == attrs(redacted(dict(span.attributes)))
        assert got["status"]["code"] == span.status.status_code.value
        assert got["status"].get("message", "") == (span.status.description or "")
        # The exporter sends the span's is-remote context bits (HAS_IS_REMOTE, IS_REMOTE) in
        # `flags`; they come back as sent.
        assert got.get("flags", 0) & 0x300 == 0x100
        assert [(e["name"], int(e["timeUnixNano"]), sorted(e["attributes"], key=lambda a: a["key"])) for e in got.get("events", [])] == \
            [(e.name, e.timestamp, attrs(dict(e.attributes))) for e in span.events]
        assert [(l["traceId"], l["spanId"], sorted(l["attributes"], key=lambda a: a["key"])) for l in got.get("links", [])] == \
            [(format(l.context.trace_id, "032x"), format(l.context.span_id, "016x"), attrs(dict(l.attributes))) for l in span.links]

    found = get(f"{weft.http}/api/v1/search?attr.llm.model_version=llama-3.1-8b-2025-10&name=chat+llama-3.1-8b", tenant)
    assert [t["trace_id"] for t in found["traces"]] == [trace_id]
    summary = found["traces"][0]
    assert summary["root_name"] == "POST /v1/chat/completions"
    assert summary["root_service"] == f"py-gateway-{transport}"
    assert summary["span_count"] == 22 and summary["error_count"] == 1
    # another tenant sees nothing
    assert get(f"{weft.http}/api/v1/search?name=llm.decode.token", "someone-else")["traces"] == []


def test_sdk_spans_read_back_through_tempo_and_jaeger(weft):
    """The same SDK trace read through the APIs Grafana's Tempo and Jaeger data sources use."""
    tenant = "py-grafana"
    finished = emit(weft, "http", tenant)
    trace_id = format(finished[-1].context.trace_id, "032x")
    sent = {format(s.context.span_id, "016x"): s for s in finished if s.context.trace_id == finished[-1].context.trace_id}

    # Tempo: the trace as OTLP (v1) and inside TraceByIDResponse (v2), the short id accepted
    for path, unwrap in [("/api/traces/", lambda d: d), ("/api/v2/traces/", lambda d: d["trace"])]:
        doc = unwrap(get(f"{weft.http}{path}{trace_id.lstrip('0')}", tenant))
        got = {s["spanId"]: s for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]}
        assert set(got) == set(sent)
        for sid, span in sent.items():
            assert got[sid]["name"] == span.name
            assert int(got[sid]["startTimeUnixNano"]) == span.start_time
            assert int(got[sid]["endTimeUnixNano"]) == span.end_time

    # Tempo search with TraceQL finds the errored chat span by its model version
    q = urllib.parse.quote('{ span.llm.model_version = "llama-3.1-8b-2025-10" && status = error }')
    found = get(f"{weft.http}/api/search?q={q}", tenant)
    assert [t["traceID"] for t in found["traces"]] == [trace_id.lstrip("0")]
    (chat,) = [s for s in sent.values() if s.name.startswith("chat")]
    match = found["traces"][0]["spanSets"][0]
    assert match["matched"] == 1
    assert match["spans"][0]["spanID"] == format(chat.context.span_id, "016x")
    assert match["spans"][0]["durationNanos"] == str(chat.end_time - chat.start_time)
    assert found["traces"][0]["rootServiceName"] == "py-gateway-http"

    # Jaeger: microseconds, references from parents and links, typed tags, processes
    doc = get(f"{weft.http}/jaeger/api/traces/{trace_id}", tenant)
    assert doc["errors"] is None and doc["total"] == 1
    (trace,) = doc["data"]
    assert {s["spanID"] for s in trace["spans"]} == set(sent)
    for s in trace["spans"]:
        span = sent[s["spanID"]]
        assert s["operationName"] == span.name
        assert s["startTime"] == span.start_time // 1000
        assert s["duration"] == (span.end_time - span.start_time) // 1000
        refs = [(r["refType"], r["spanID"]) for r in s["references"]]
        if span.parent:
            assert ("CHILD_OF", format(span.parent.span_id, "016x")) in refs
        for link in span.links:
            assert ("FOLLOWS_FROM", format(link.context.span_id, "016x")) in refs
        assert trace["processes"][s["processID"]]["serviceName"] == "py-gateway-http"
    chat_tags = {t["key"]: t for t in next(s for s in trace["spans"] if s["operationName"].startswith("chat"))["tags"]}
    assert chat_tags["llm.batch_size"] == {"key": "llm.batch_size", "type": "int64", "value": 8}
    assert chat_tags["error"]["value"] is True
    assert chat_tags["span.kind"]["value"] == "client"
    services = get(f"{weft.http}/jaeger/api/services", tenant)
    assert services["data"] == ["py-gateway-http"]
    search = get(f"{weft.http}/jaeger/api/traces?service=py-gateway-http&tags=" + urllib.parse.quote('{"error":"true"}'), tenant)
    assert [t["traceID"] for t in search["data"]] == [trace_id]
