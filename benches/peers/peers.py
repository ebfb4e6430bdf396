"""The peers' side of `weft-bench peers`: loads the generator's Parquet export into DuckDB and
into chDB (embedded ClickHouse), runs the canonical queries, and prints one JSON document with,
per engine, bytes on disk per span and, per query, the best time of N runs (after one warm-up)
and the rows.

Usage: python benches/peers/peers.py data.parquet queries.json RUNS WORKDIR [spans|logs]

DuckDB: a table sorted by (service_name, name, start_time), checkpointed. chDB: a MergeTree
ordered as ClickHouse trace stores order spans (service, span name, time, trace id), ZSTD(3) on
every column, Delta on times, and a bloom-filter skip index on trace_id (as the OpenTelemetry
ClickHouse exporter's schema has), merged to one part.

Logs (the fifth argument `logs`): DuckDB sorted by time; chDB ordered by (service, time) with
the exporter's token bloom filter on the body (`tokenbf_v1(32768, 3, 0)`, granularity 8).
"""

import datetime as dt
import decimal
import json
import os
import sys
import time


def norm(v):
    if isinstance(v, (dt.datetime, dt.date)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return float(v)
    return v


def timed(run, runs):
    rows = run()  # warm-up
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        rows = run()
        best = min(best, (time.perf_counter() - t) * 1e3)
    return best, rows


def duckdb_engine(parquet, workdir, table):
    import duckdb

    path = os.path.join(workdir, f"{table}.duckdb")
    con = duckdb.connect(path)
    con.execute("SET TimeZone = 'UTC'")
    order = "service_name, name, start_time" if table == "spans" else "time"
    con.execute(
        f"CREATE TABLE {table} AS SELECT * FROM read_parquet(?) ORDER BY {order}",
        [parquet],
    )
    rows = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    con.execute("CHECKPOINT")
    size = os.path.getsize(path) + (os.path.getsize(path + ".wal") if os.path.exists(path + ".wal") else 0)

    def run(sql):
        return [[norm(v) for v in r] for r in con.execute(sql).fetchall()]

    return rows, size, run, con.close


def chdb_engine(parquet, workdir, table):
    from chdb import session

    s = session.Session(os.path.join(workdir, "chdb"))
    described = s.query(f"DESCRIBE file('{parquet}', Parquet)", "TabSeparatedRaw").bytes().decode()
    columns = []
    keys = ("service_name", "name", "start_time", "trace_id") if table == "spans" else ("service_name", "time")
    # a token bloom filter takes no Nullable column (the exporter's Body is a plain String)
    plain = keys + (("body",) if table == "logs" else ())
    for line in described.strip().splitlines():
        name, ty = line.split("\t")[:2]
        if name in plain:
            ty = ty.replace("Nullable(", "").rstrip(")") if ty.startswith("Nullable(") else ty
        codec = "CODEC(Delta, ZSTD(3))" if "DateTime64" in ty or name == "duration_ns" else "CODEC(ZSTD(3))"
        columns.append(f"`{name}` {ty} {codec}")
    columns.append("INDEX idx_trace_id trace_id TYPE bloom_filter(0.001) GRANULARITY 1")
    if table == "logs":
        columns.append("INDEX idx_body body TYPE tokenbf_v1(32768, 3, 0) GRANULARITY 8")
    s.query("CREATE DATABASE IF NOT EXISTS bench")
    s.query(
        f"CREATE TABLE bench.{table} ({', '.join(columns)}) ENGINE = MergeTree "
        f"ORDER BY ({', '.join(keys)})"
    )
    s.query(f"INSERT INTO bench.{table} SELECT * FROM file('{parquet}', Parquet)")
    s.query(f"OPTIMIZE TABLE bench.{table} FINAL")
    rows = int(s.query(f"SELECT count() FROM bench.{table}", "CSV").bytes().decode().strip())
    size = int(
        s.query(
            f"SELECT sum(bytes_on_disk) FROM system.parts WHERE database = 'bench' AND table = '{table}' AND active",
            "CSV",
        ).bytes().decode().strip()
    )
    s.query("USE bench")

    def run(sql):
        out = s.query(sql + " SETTINGS output_format_json_quote_64bit_integers = 0, session_timezone = 'UTC'", "JSONCompact")
        text = out.bytes().decode()
        # chDB may answer a large result as several documents, one after another
        rows, at, decoder = [], 0, json.JSONDecoder()
        while text[at:].strip():
            at = len(text) - len(text[at:].lstrip())
            doc, at = decoder.raw_decode(text, at)
            rows.extend(doc.get("data", []))
        return [[norm(v) for v in r] for r in rows]

    return rows, size, run, s.close


def main():
    parquet, spec, runs, workdir = os.path.abspath(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    table = sys.argv[5] if len(sys.argv) > 5 else "spans"
    queries = json.load(open(spec))
    result = {}
    engines = [("duckdb", duckdb_engine), ("chdb", chdb_engine)]
    only = os.environ.get("WEFT_PEERS_ENGINES")  # e.g. "duckdb": run only these
    if only:
        engines = [(e, m) for e, m in engines if e in only.split(",")]
    for engine, make in engines:
        os.makedirs(os.path.join(workdir, engine), exist_ok=True)
        t = time.perf_counter()
        rows, size, run, close = make(parquet, os.path.join(workdir, engine), table)
        print(f"{engine}: loaded {rows} rows in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        out = {"rows": rows, "bytes": size, "bytes_per_span": size / rows, "queries": {}}
        for q in queries:
            try:
                ms, got = timed(lambda: run(q[engine]), runs)
                out["queries"][q["id"]] = {"ms": ms, "rows": got}
                print(f"{engine} {q['id']}: {ms:.2f} ms, {len(got)} rows", file=sys.stderr, flush=True)
            except Exception as e:  # report, do not hide: the comparison shows it
                out["queries"][q["id"]] = {"ms": None, "rows": [], "error": str(e)}
                print(f"{engine} {q['id']}: {e}", file=sys.stderr)
        result[engine] = out
        # one engine at a time: DuckDB's buffer pool (80% of RAM by default) must not stay
        # resident while chDB loads, or a 20M-span run swaps and times both badly
        close()
        del run, close
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
