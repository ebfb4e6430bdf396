"""The PostgreSQL endpoint through real drivers: psycopg (text results; extended protocol with
server-side parameters, and the simple protocol through a client-side-binding cursor) and
asyncpg (binary results). NULLs, unicode, timestamps with zones, empty results, errors before
and after rows, concurrent connections."""

import asyncio
import datetime as dt
import json
import urllib.request

import asyncpg
import psycopg
import pytest

T0 = 1_764_460_800_000_000_000  # 2025-11-30T00:00:00Z
TRACE = "5eed" + "00" * 13 + "01"
UNICODE = "décodage · トークン · 🚀"


def span(i: int, name: str, attrs: list, parent: str | None = None, status: int = 0):
    s = {
        "traceId": TRACE,
        "spanId": f"{i + 1:016x}",
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(T0 + i * 1_000_000),
        "endTimeUnixNano": str(T0 + i * 1_000_000 + 500_000 + i),
        "attributes": attrs,
        "status": {"code": status, "message": "✗ failed" if status == 2 else ""},
    }
    if parent:
        s["parentSpanId"] = parent
    return s


def load(weft) -> None:
    spans = [span(0, "POST /v1/chat", [{"key": "http.route", "value": {"stringValue": "/v1/chat"}}])]
    spans.append(span(1, "llm.generate", [
        {"key": "llm.model_version", "value": {"stringValue": "v1"}},
        {"key": "llm.batch_size", "value": {"intValue": "8"}},
        {"key": "gen_ai.response.finish_reasons", "value": {"arrayValue": {"values": [{"stringValue": "stop"}]}}},
    ], parent=f"{1:016x}", status=2))
    for i in range(2, 40):
        spans.append(span(i, UNICODE, [
            {"key": "llm.token.index", "value": {"intValue": str(i - 2)}},
            {"key": "llm.token.latency_ms", "value": {"doubleValue": 1.5}},
        ], parent=f"{2:016x}"))
    body = {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "inference-engine"}}]},
        "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}],
    }]}
    req = urllib.request.Request(
        f"http://127.0.0.1:{weft.otlp_port}/v1/traces",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req) as r:
        assert r.status == 200


def test_psycopg_text_results_extended_and_simple_protocols(weft):
    load(weft)
    with psycopg.connect(host="127.0.0.1", port=weft.pg_port, dbname="weft", user="anyone") as conn:
        # psycopg opens a transaction (BEGIN) first: accepted as a no-op on a read-only store
        cur = conn.execute(
            'SELECT name, status_code, status_message, "llm.model_version", "llm.batch_size", '
            '"gen_ai.response.finish_reasons", start_time, duration_ns '
            "FROM spans WHERE trace_id = %s ORDER BY start_time",
            (TRACE,),
        )
        rows = cur.fetchall()
        assert len(rows) == 40
        root, generate, token = rows[0], rows[1], rows[2]
        assert root[0] == "POST /v1/chat" and root[3] is None and root[4] is None
        assert generate[1:6] == ("ERROR", "✗ failed", "v1", 8, ["stop"])
        assert token[0] == UNICODE
        assert root[6] == dt.datetime(2025, 11, 30, tzinfo=dt.timezone.utc)
        assert root[6].utcoffset() == dt.timedelta(0)
        assert token[7] == 500_002
        conn.commit()

        # a timestamp parameter given in another zone
        plus2 = dt.timezone(dt.timedelta(hours=2))
        since = dt.datetime(2025, 11, 30, 2, 0, 0, 10_000, tzinfo=plus2)  # = 00:00:00.010 UTC
        n = conn.execute("SELECT count(*) FROM spans WHERE start_time >= %s", (since,)).fetchone()[0]
        assert n == 30

        # empty result: columns described, no rows
        cur = conn.execute("SELECT trace_id, name FROM spans WHERE trace_id = %s", ("0" * 32,))
        assert cur.fetchall() == []
        assert [d.name for d in cur.description] == ["trace_id", "name"]

        # an error names the problem; the connection goes on after a rollback
        with pytest.raises(psycopg.errors.Error, match="nope"):
            conn.execute("SELECT nope FROM spans")
        conn.rollback()
        assert conn.execute("SELECT 1").fetchone() == (1,)
        with pytest.raises(psycopg.errors.Error, match="only queries are accepted"):
            conn.execute("DELETE FROM spans")
        conn.rollback()

    # the simple query protocol (client-side binding), several statements in one string
    with psycopg.connect(host="127.0.0.1", port=weft.pg_port, dbname="postgres", autocommit=True,
                         cursor_factory=psycopg.ClientCursor) as conn:
        cur = conn.execute("SELECT count(*) FROM spans WHERE name = %s", (UNICODE,))
        assert cur.fetchone() == (38,)
        cur = conn.execute("SET application_name = 'grafana'; SELECT current_setting('server_version')")
        assert cur.statusmessage == "SET"
        assert cur.nextset()
        assert cur.fetchone() == ("16.4",)
        assert conn.execute("SHOW TimeZone").fetchone() == ("UTC",)
        # sent again, a text is answered from its kept plan (not parsed again); errors are
        # never kept
        for _ in range(3):
            cur = conn.execute("SELECT count(*) AS n, min(name) AS first FROM spans WHERE name = 'llm.generate'")
            assert cur.fetchall() == [(1, "llm.generate")]
            assert [d.name for d in cur.description] == ["n", "first"]
        for _ in range(2):
            with pytest.raises(psycopg.errors.Error, match="nope"):
                conn.execute("SELECT nope FROM spans")


def test_asyncpg_binary_results_errors_and_concurrency(weft):
    load(weft)

    async def main():
        conn = await asyncpg.connect(host="127.0.0.1", port=weft.pg_port, database="weft", user="u")
        try:
            rows = await conn.fetch(
                'SELECT span_id, parent_span_id, "llm.token.index", "llm.token.latency_ms", '
                '"gen_ai.response.finish_reasons", start_time, end_time, name '
                "FROM spans WHERE trace_id = $1 ORDER BY start_time",
                TRACE,
            )
            assert len(rows) == 40
            root, generate, token = rows[0], rows[1], rows[2]
            assert root["parent_span_id"] is None and root["llm.token.index"] is None
            assert generate["gen_ai.response.finish_reasons"] == ["stop"]
            assert token["llm.token.index"] == 0 and token["llm.token.latency_ms"] == 1.5
            assert token["name"] == UNICODE
            assert root["start_time"] == dt.datetime(2025, 11, 30, tzinfo=dt.timezone.utc)
            assert (token["end_time"] - token["start_time"]) == dt.timedelta(microseconds=500)
            # typed parameters, binary on the wire
            n = await conn.fetchval('SELECT count(*) FROM spans WHERE "llm.token.index" >= $1', 30)
            assert n == 8
            since = dt.datetime(2025, 11, 30, 1, 0, 0, 20_000, tzinfo=dt.timezone(dt.timedelta(hours=1)))
            n = await conn.fetchval("SELECT count(*) FROM spans WHERE start_time >= $1", since)
            assert n == 20
            assert await conn.fetch("SELECT name FROM spans WHERE trace_id = $1", "f" * 32) == []
            # an error before any row, then one after rows were produced (a cast that fails
            # on a later row): both raise, and the connection keeps working
            with pytest.raises(asyncpg.PostgresError, match="nope"):
                await conn.fetch("SELECT nope FROM spans")
            with pytest.raises(asyncpg.PostgresError):
                await conn.fetch(
                    "SELECT CAST(CASE WHEN \"llm.token.index\" < 30 OR \"llm.token.index\" IS NULL "
                    "THEN '1' ELSE 'x' END AS BIGINT) FROM spans"
                )
            assert await conn.fetchval("SELECT 41 + 1") == 42
        finally:
            await conn.close()

        # concurrent connections, each with its own query
        async def one(i):
            c = await asyncpg.connect(host="127.0.0.1", port=weft.pg_port, database="weft", user="u")
            try:
                return await c.fetchval('SELECT count(*) FROM spans WHERE "llm.token.index" >= $1', i)
            finally:
                await c.close()

        got = await asyncio.gather(*(one(i) for i in range(8)))
        assert got == [38 - i for i in range(8)]

    asyncio.run(main())


def test_tenants_are_databases(weft):
    load(weft)
    with psycopg.connect(host="127.0.0.1", port=weft.pg_port, dbname="another-tenant", autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM spans").fetchone() == (0,)
    with pytest.raises(psycopg.OperationalError, match="not a valid tenant"):
        psycopg.connect(host="127.0.0.1", port=weft.pg_port, dbname="bad tenant!", connect_timeout=5)


def test_a_huge_placeholder_number_is_refused_and_the_server_keeps_serving(weft):
    """A Parse of `$1000000000` once allocated a slot per placeholder number and killed the
    server; it is refused with PostgreSQL's parameter limit."""

    async def main():
        conn = await asyncpg.connect(host="127.0.0.1", port=weft.pg_port, database="weft", user="u")
        for sql in ("SELECT $1000000000::bigint", "SELECT $65536::bigint AS x"):
            with pytest.raises(asyncpg.PostgresError) as err:
                await conn.prepare(sql)
            assert err.value.sqlstate == "54000", err.value
            assert "at most 65535 parameters" in str(err.value)
        # the limit itself is allowed; and the connection and the server still answer
        assert await conn.fetchval("SELECT 1 + 1") == 2
        await conn.close()
        other = await asyncpg.connect(host="127.0.0.1", port=weft.pg_port, database="weft", user="u")
        assert await other.fetchval("SELECT count(*) FROM spans WHERE name = $1", "none") == 0
        await other.close()

    asyncio.run(main())
    assert weft.proc.poll() is None, "the server died"
