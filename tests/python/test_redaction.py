"""Redaction before disk: spans and logs full of planted personal data and prompts go into a
server that compresses nothing (`--compression none`), so that a byte search of its data
directory means something. For a tenant with default redaction, no planted value may be found
in any file of the data directory, nor through SQL or the trace API; a tenant that turned
redaction off (in the TOML file) shows that the search does find what is stored."""

import hashlib
import json
import pathlib
import urllib.request

import psycopg

from conftest import Weft

T0 = 1_764_460_800_000_000_000
PROMPT = "my account 88213 was charged twice, please refund"
PLANTED = [
    "jane.doe.planted@example.com",
    "+44 20 7946 0958",
    "4539 1488 0343 6467",  # passes the Luhn check
    "sk-proj-PLANTEDabcdefghijklmnop",
    "AKIAPLANTED000000000",
    "Bearer eyPLANTED.token-value",
    "203.0.113.77",
    "2001:db8:77::9",
    PROMPT,
]


def attr(key, value):
    return {"key": key, "value": {"stringValue": value}}


def export(weft, tenant, path, body):
    req = urllib.request.Request(
        f"{weft.otlp_http}{path}", data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "X-Scope-OrgID": tenant},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200 and "partialSuccess" not in json.loads(r.read())


def plant(weft, tenant, trace):
    resource = {"attributes": [attr("service.name", "llm-gateway")]}
    span = {
        "traceId": trace, "spanId": "00000000000000a1", "name": "POST /v1/chat/completions",
        "kind": 2, "startTimeUnixNano": str(T0), "endTimeUnixNano": str(T0 + 5_000_000),
        "attributes": [
            attr("gen_ai.input.messages", json.dumps([{"role": "user", "content": PROMPT}])),
            attr("http.request.header.x-raw-prompt", PROMPT),
            attr("user.contact", f"{PLANTED[0]} / {PLANTED[1]}"),
            attr("payment.note", f"card {PLANTED[2]}"),
            attr("client.address", PLANTED[6]),
        ],
        "events": [{"timeUnixNano": str(T0 + 1), "name": "auth",
                    "attributes": [attr("http.request.header.authorization", PLANTED[5])]}],
    }
    export(weft, tenant, "/v1/traces", {"resourceSpans": [{
        "resource": resource, "scopeSpans": [{"spans": [span]}]}]})
    logs = [
        {"timeUnixNano": str(T0 + 2), "severityText": "INFO", "traceId": trace, "spanId": "00000000000000a1",
         "body": {"stringValue": f"[PROMPT] {PROMPT} from {PLANTED[0]} key={PLANTED[3]}"}},
        {"timeUnixNano": str(T0 + 3), "severityText": "WARN",
         "body": {"kvlistValue": {"values": [attr("aws", PLANTED[4]), attr("peer", PLANTED[7])]}},
         "attributes": [attr("llm.prompts", PROMPT)]},
    ]
    export(weft, tenant, "/v1/logs", {"resourceLogs": [{
        "resource": resource, "scopeLogs": [{"logRecords": logs}]}]})


def read_paths(weft, tenant, trace):
    """Everything the read paths give back for the tenant, as one text."""
    with psycopg.connect(host="127.0.0.1", port=weft.pg_port, dbname=tenant, autocommit=True) as c:
        spans = c.execute("SELECT * FROM spans").fetchall()
        events = c.execute("SELECT * FROM span_events").fetchall()
        logs = c.execute("SELECT * FROM logs").fetchall()
    req = urllib.request.Request(f"{weft.http}/api/v1/traces/{trace}", headers={"X-Scope-OrgID": tenant})
    with urllib.request.urlopen(req, timeout=10) as r:
        doc = r.read().decode()
    return repr(spans) + repr(events) + repr(logs) + doc


def found_on_disk(data_dir: pathlib.Path, values):
    blobs = [p.read_bytes() for p in data_dir.rglob("*") if p.is_file()]
    return {v for v in values if any(v.encode() in b for b in blobs)}


def test_planted_personal_data_and_prompts_never_reach_the_disk_or_a_read(tmp_path):
    config = tmp_path / "weft.toml"
    config.write_text('[tenants.open.redaction]\ncapture_content = true\nredact_pii = false\n')
    data = tmp_path / "data"
    weft = Weft(data, ("--compression", "none", "--config", str(config)))
    clean, open_trace = "5eed0000000000000000000000000001", "5eed0000000000000000000000000002"
    try:
        plant(weft, "clean", clean)
        plant(weft, "open", open_trace)
        text = read_paths(weft, "clean", clean)
        assert not [v for v in PLANTED if v in text], text
        for placeholder in ["<email>", "<phone>", "<card>", "<api_key>", "<bearer_token>", "<ip>"]:
            assert placeholder in text, placeholder
        prompt = json.dumps([{"role": "user", "content": PROMPT}])
        assert hashlib.sha256(prompt.encode()).hexdigest()[:16] in text
        assert all(v in read_paths(weft, "open", open_trace) for v in PLANTED)
        with urllib.request.urlopen(f"{weft.http}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert 'weft_redactions_total{rule="email"} 1' in metrics  # the other one is inside a [PROMPT] segment
        assert 'weft_redactions_total{rule="content"} 4' in metrics
    finally:
        weft.stop()  # a clean stop flushes every head into blocks
    # only the tenant that keeps everything has the planted values on disk
    assert found_on_disk(data, PLANTED) == set(PLANTED)
    # and they are in its blocks: nothing of the clean tenant's is, wherever it was written
    weft = Weft(data, ("--compression", "none", "--config", str(config), "--redact-pii", "true"))
    try:
        assert not [v for v in PLANTED if v in read_paths(weft, "clean", clean)]
    finally:
        weft.stop()


def test_the_clean_tenant_alone_leaves_no_planted_value_on_disk(tmp_path):
    data = tmp_path / "data"
    weft = Weft(data, ("--compression", "none"))
    trace = "5eed0000000000000000000000000003"
    try:
        plant(weft, "clean", trace)
        # still in the write-ahead head (RocksDB's write-ahead log and memtables)
        assert found_on_disk(data, PLANTED) == set()
    finally:
        weft.stop()
    assert found_on_disk(data, PLANTED) == set()
