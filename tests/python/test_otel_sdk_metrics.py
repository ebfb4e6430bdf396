"""Metrics sent by the official OpenTelemetry Python SDK (observable gauges, counters, up-down
counters, explicit and exponential histograms; cumulative and delta temporality) over OTLP/HTTP
and OTLP/gRPC, read back with SQL through the PostgreSQL endpoint; and OTLP/JSON metric exports
with points that must be refused alone."""

import json
import time
import urllib.error
import urllib.parse
import urllib.request

import psycopg
import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider, UpDownCounter
from opentelemetry.sdk.metrics.export import AggregationTemporality, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource


def sql(weft, tenant, query, params=()):
    with psycopg.connect(host="127.0.0.1", port=weft.pg_port, dbname=tenant, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def exporter(weft, transport, tenant, delta):
    temporality = {}
    if delta:
        temporality = {Counter: AggregationTemporality.DELTA, Histogram: AggregationTemporality.DELTA}
    if transport == "http":
        return HttpMetricExporter(endpoint=f"{weft.otlp_http}/v1/metrics",
                                  headers={"X-Scope-OrgID": tenant},
                                  preferred_temporality=temporality)
    return GrpcMetricExporter(endpoint=weft.otlp_grpc, insecure=True,
                              headers=(("x-scope-orgid", tenant),),
                              preferred_temporality=temporality)


@pytest.mark.parametrize("transport,delta", [("http", False), ("grpc", True)])
def test_sdk_metrics_of_every_instrument_are_stored(weft, transport, delta):
    tenant = f"metrics-{transport}"
    reader = PeriodicExportingMetricReader(exporter(weft, transport, tenant, delta),
                                           export_interval_millis=3_600_000)
    provider = MeterProvider(
        resource=Resource.create({"service.name": "vllm", "host.name": "node-1"}),
        metric_readers=[reader],
        views=[View(instrument_name="gen_ai.server.time_per_output_token",
                    aggregation=ExponentialBucketHistogramAggregation(max_size=20))],
    )
    meter = provider.get_meter("weft-e2e")
    memory = {"0": 70.5e9, "1": 12.25e9}
    meter.create_observable_gauge(
        "gpu.memory.used", unit="By", description="GPU memory in use",
        callbacks=[lambda _: [Observation(v, {"gpu.id": g, "worker.id": "w-7"}) for g, v in memory.items()]])
    requests = meter.create_counter("vllm.requests", unit="{request}")
    running = meter.create_up_down_counter("vllm.num_requests_running")
    ttft = meter.create_histogram("gen_ai.server.time_to_first_token", unit="s")
    tpot = meter.create_histogram("gen_ai.server.time_per_output_token", unit="s")
    for v in [0.05, 0.2, 0.3, 1.5, 7.0]:
        ttft.record(v, {"gen_ai.request.model": "llama-3.1-8b"})
    for v in [0.01, 0.02, 0.04]:
        tpot.record(v)
    requests.add(3, {"lora": "sql-lora"})
    requests.add(4, {"lora": "sql-lora"})
    running.add(5)
    running.add(-2)
    # one collection and export, at shutdown
    provider.shutdown()

    rows = sql(weft, tenant,
               "SELECT \"gpu.id\", value, unit, type, \"worker.id\", \"service.name\", \"host.name\", "
               "labels['gpu.id'], description FROM metrics WHERE metric = 'gpu.memory.used' ORDER BY 1")
    assert rows == [
        ("0", 70.5e9, "By", "gauge", "w-7", "vllm", "node-1", "0", "GPU memory in use"),
        ("1", 12.25e9, "By", "gauge", "w-7", "vllm", "node-1", "1", "GPU memory in use"),
    ], rows
    # no exporter detail became a label
    keys = sql(weft, tenant, "SELECT DISTINCT map_keys(labels) FROM metrics WHERE metric = 'vllm.requests'")
    assert keys == [(["host.name", "lora", "service.instance.id", "service.name"],)], keys

    counter = sql(weft, tenant,
                  "SELECT value, temporality, monotonic, lora, start_time IS NOT NULL "
                  "FROM metrics WHERE metric = 'vllm.requests'")
    temporality = "delta" if delta else "cumulative"
    assert counter == [(7.0, temporality, True, "sql-lora", True)], counter
    updown = sql(weft, tenant,
                 "SELECT value, type, monotonic FROM metrics WHERE metric = 'vllm.num_requests_running'")
    assert updown == [(3.0, "sum", False)], updown

    hist = sql(weft, tenant,
               "SELECT count, sum, min, max, bucket_bounds, bucket_counts, type, \"gen_ai.request.model\" "
               "FROM metrics WHERE metric = 'gen_ai.server.time_to_first_token'")
    assert len(hist) == 1, hist
    count, total, lo, hi, bounds, counts, kind, model = hist[0]
    assert (count, kind, model) == (5, "histogram", "llama-3.1-8b")
    assert total == pytest.approx(9.05) and (lo, hi) == (0.05, 7.0)
    # the SDK's default bounds, one more count than bounds
    assert bounds[:4] == [0.0, 5.0, 10.0, 25.0] and len(counts) == len(bounds) + 1
    assert sum(counts) == 5 and counts[1] == 4 and counts[2] == 1

    exp = sql(weft, tenant,
              "SELECT count, type, bucket_bounds, bucket_counts FROM metrics "
              "WHERE metric = 'gen_ai.server.time_per_output_token'")
    assert len(exp) == 1, exp
    count, kind, bounds, counts = exp[0]
    assert (count, kind) == (3, "exponential_histogram")
    assert sum(counts) == 3
    # each value falls in the bucket whose upper bound is the first at or above it
    for v in [0.01, 0.02, 0.04]:
        i = next(i for i, b in enumerate(bounds) if b >= v * (1 - 1e-9))
        assert counts[i] >= 1, (v, bounds, counts)


def post_json(weft, tenant, doc):
    req = urllib.request.Request(f"{weft.otlp_http}/v1/metrics", data=json.dumps(doc).encode(),
                                 headers={"Content-Type": "application/json", "X-Scope-OrgID": tenant})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_json_metric_exports_reject_bad_points_alone(weft):
    tenant = "metrics-json"
    good = {"timeUnixNano": "1700000000000000000", "asDouble": 0.97,
            "attributes": [{"key": "gpu.id", "value": {"stringValue": "0"}}],
            "exemplars": [{"timeUnixNano": "1700000000000000000", "asDouble": 0.97,
                           "traceId": "0102030405060708090a0b0c0d0e0f10", "spanId": "0102030405060708"}]}
    doc = {"resourceMetrics": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "dcgm"}}]},
           "scopeMetrics": [{"metrics": [
               {"name": "gpu.utilization", "unit": "1", "gauge": {"dataPoints": [good, {"timeUnixNano": "1700000000000000000"}]}},
               {"name": "ttft", "histogram": {"aggregationTemporality": 2, "dataPoints": [
                   {"timeUnixNano": "1700000000000000000", "count": "3", "bucketCounts": ["1", "1"], "explicitBounds": [0.1, 1.0]}]}},
               {"name": "requests", "sum": {"isMonotonic": True, "dataPoints": [{"timeUnixNano": "1700000000000000000", "asInt": "4"}]}},
           ]}]}]}
    status, body = post_json(weft, tenant, doc)
    assert status == 200, body
    partial = body["partialSuccess"]
    assert partial["rejectedDataPoints"] == "3", body
    assert "no value" in partial["errorMessage"], body
    rows = sql(weft, tenant, "SELECT metric, value, exemplar_trace_id, exemplar_span_id, exemplar_value, "
                             "\"gpu.id\" FROM metrics")
    assert rows == [("gpu.utilization", 0.97, "0102030405060708090a0b0c0d0e0f10", "0102030405060708", 0.97, "0")], rows
    # a retry of the same export stores nothing twice
    status, body = post_json(weft, tenant, doc)
    assert status == 200
    assert sql(weft, tenant, "SELECT count(*) FROM metrics") == [(1,)]
    # a document that is not OTLP/JSON is refused whole, naming the place
    status, body = post_json(weft, tenant, {"resourceMetrics": [{"scopeMetrics": [{"metrics": [
        {"name": "x", "gauge": {"dataPoints": [{"asDouble": "lots"}]}}]}]}]})
    assert status == 400 and "dataPoints[0].asDouble" in body["message"], body


def test_span_metrics_are_derived_from_sdk_spans_and_served_to_promql(tmp_path):
    from conftest import Weft
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import SpanKind

    weft = Weft(tmp_path / "data", ("--span-metrics-interval", "1s"))
    try:
        def provider(service):
            p = TracerProvider(resource=Resource.create({"service.name": service}))
            p.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{weft.otlp_http}/v1/traces")))
            return p
        gateway, engine = provider("gateway"), provider("engine")
        from opentelemetry import context, trace
        for i in range(3):
            with gateway.get_tracer("t").start_as_current_span("chat llama", kind=SpanKind.CLIENT) as client:
                ctx = trace.set_span_in_context(client)
                with engine.get_tracer("t").start_as_current_span(
                        "llm.generate", kind=SpanKind.SERVER, context=ctx,
                        attributes={"llm.model_version": "v1.3", "worker.id": "w-7",
                                    "gen_ai.latency.time_to_first_token": 0.05,
                                    "gen_ai.usage.output_tokens": 11}):
                    pass
        context.attach(context.Context())
        gateway.shutdown()
        engine.shutdown()

        def promql(q):
            url = f"{weft.http}/prometheus/api/v1/query?" + urllib.parse.urlencode({"query": q})
            with urllib.request.urlopen(url) as r:
                return json.loads(r.read())["data"]["result"]

        deadline = time.time() + 20
        while time.time() < deadline:
            calls = promql('sum by (service, span_kind) (traces_spanmetrics_calls_total)')
            edges = promql('traces_service_graph_request_total')
            ttft = promql('gen_ai_server_time_to_first_token_seconds_count')
            if len(calls) == 2 and edges and ttft:
                break
            time.sleep(0.5)
        got = {(c["metric"]["service"], c["metric"]["span_kind"]): c["value"][1] for c in calls}
        assert got == {("gateway", "SPAN_KIND_CLIENT"): "3", ("engine", "SPAN_KIND_SERVER"): "3"}, calls
        assert [(e["metric"]["client"], e["metric"]["server"], e["value"][1]) for e in edges] == \
            [("gateway", "engine", "3")], edges
        assert ttft[0]["metric"]["llm_model_version"] == "v1.3" and ttft[0]["value"][1] == "3", ttft
        q = promql('histogram_quantile(0.5, sum by (le) (traces_spanmetrics_latency_bucket{span_name="llm.generate"}))')
        assert 0 < float(q[0]["value"][1]) < 0.01, q
    finally:
        weft.stop()
