"""The OpenTelemetry Python SDK exporting over HTTPS and over gRPC with TLS, with and without a
client certificate, to a Weft started with --tls-cert / --tls-key (and --tls-client-ca), using a
CA the test makes (tests/pki/make.sh); the spans are read back over HTTPS."""

import json
import ssl
import subprocess
import urllib.request

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export import SpanExportResult

from conftest import ROOT, Weft


@pytest.fixture(autouse=True)
def no_ca_bundle_override(monkeypatch):
    # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override the CA file the exporter sets on
    # its session (psf/requests#3829): without this the SDK's certificate_file would be ignored
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    subprocess.run(["bash", str(ROOT / "tests/pki/make.sh"), str(d)], check=True)
    return d


def localhost(url):
    # the server certificate names localhost and 127.0.0.1; the SDK is pointed at the name
    return url.replace("127.0.0.1", "localhost")


def export(exporter, service):
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    results = []

    class Recording(SimpleSpanProcessor):
        def on_end(self, span):
            results.append(exporter.export([span]))

    provider.add_span_processor(Recording(exporter))
    with provider.get_tracer("weft-tls").start_as_current_span(f"{service} work"):
        pass
    provider.shutdown()
    return results


def sql(weft, context, query):
    req = urllib.request.Request(
        f"{localhost(weft.http)}/api/v1/sql",
        data=json.dumps({"query": query}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, context=context, timeout=30) as r:
        return json.load(r)["rows"]


def test_sdk_exports_over_https_and_grpc_tls(tmp_path, pki):
    weft = Weft(tmp_path / "data", ("--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key")))
    try:
        ca = str(pki / "ca.pem")
        http = HttpExporter(endpoint=f"{localhost(weft.otlp_http)}/v1/traces", certificate_file=ca)
        assert export(http, "tls-http") == [SpanExportResult.SUCCESS]
        creds = grpc.ssl_channel_credentials(root_certificates=open(ca, "rb").read())
        grpc_exp = GrpcExporter(endpoint=f"localhost:{weft.grpc_port}", credentials=creds)
        assert export(grpc_exp, "tls-grpc") == [SpanExportResult.SUCCESS]

        context = ssl.create_default_context(cafile=ca)
        rows = sql(weft, context, "SELECT service_name, name FROM spans ORDER BY service_name")
        assert rows == [["tls-grpc", "tls-grpc work"], ["tls-http", "tls-http work"]]
        # a client that does not trust the CA is refused by its own verification
        with pytest.raises(urllib.error.URLError):
            sql(weft, ssl.create_default_context(), "SELECT 1")
        # an exporter without TLS gets nothing through
        plain = GrpcExporter(endpoint=f"localhost:{weft.grpc_port}", insecure=True, timeout=3)
        assert export(plain, "tls-plain") != [SpanExportResult.SUCCESS]
    finally:
        weft.stop()


def test_sdk_exports_with_a_client_certificate(tmp_path, pki):
    weft = Weft(
        tmp_path / "data",
        (
            "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
            "--tls-client-ca", str(pki / "ca.pem"),
        ),
    )
    try:
        ca, cert, key = str(pki / "ca.pem"), str(pki / "client.pem"), str(pki / "client.key")
        http = HttpExporter(
            endpoint=f"{localhost(weft.otlp_http)}/v1/traces",
            certificate_file=ca, client_certificate_file=cert, client_key_file=key,
        )
        assert export(http, "mtls-http") == [SpanExportResult.SUCCESS]
        creds = grpc.ssl_channel_credentials(
            root_certificates=open(ca, "rb").read(),
            private_key=open(key, "rb").read(),
            certificate_chain=open(cert, "rb").read(),
        )
        assert export(GrpcExporter(endpoint=f"localhost:{weft.grpc_port}", credentials=creds), "mtls-grpc") == [
            SpanExportResult.SUCCESS
        ]
        # without a client certificate: refused
        anonymous = GrpcExporter(
            endpoint=f"localhost:{weft.grpc_port}",
            credentials=grpc.ssl_channel_credentials(root_certificates=open(ca, "rb").read()),
            timeout=3,
        )
        assert export(anonymous, "anonymous") != [SpanExportResult.SUCCESS]

        context = ssl.create_default_context(cafile=ca)
        context.load_cert_chain(cert, key)
        rows = sql(weft, context, "SELECT service_name FROM spans ORDER BY service_name")
        assert rows == [["mtls-grpc"], ["mtls-http"]]
    finally:
        weft.stop()
