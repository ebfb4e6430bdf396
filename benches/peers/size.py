"""Bytes on disk per span for peers (DuckDB, chDB) on the generator's Parquet export.

Usage: python benches/peers/size.py data.parquet

DuckDB: a table sorted by (service_name, name, start_time), checkpointed; the database file's
size. chDB (embedded ClickHouse): a MergeTree ordered as ClickHouse trace stores order spans
(service, span name, time, trace id), ZSTD(3) on every column and Delta on times, merged to
one part; the active parts' bytes on disk.
"""

import os
import sys
import tempfile


def duckdb_bytes(parquet: str, workdir: str) -> tuple[int, int]:
    import duckdb

    path = os.path.join(workdir, "spans.duckdb")
    con = duckdb.connect(path)
    con.execute("CREATE TABLE spans AS SELECT * FROM read_parquet(?) ORDER BY service_name, name, start_time", [parquet])
    rows = con.execute("SELECT count(*) FROM spans").fetchone()[0]
    con.execute("CHECKPOINT")
    con.close()
    return rows, os.path.getsize(path) + (os.path.getsize(path + ".wal") if os.path.exists(path + ".wal") else 0)


def chdb_bytes(parquet: str, workdir: str) -> tuple[int, int]:
    from chdb import session

    s = session.Session(os.path.join(workdir, "chdb"))
    described = s.query(f"DESCRIBE file('{parquet}', Parquet)", "TabSeparatedRaw").bytes().decode()
    columns = []
    for line in described.strip().splitlines():
        name, ty = line.split("\t")[:2]
        if name in ("service_name", "name", "start_time", "trace_id"):
            ty = ty.replace("Nullable(", "").rstrip(")") if ty.startswith("Nullable(") else ty
        codec = "CODEC(Delta, ZSTD(3))" if "DateTime64" in ty or name == "duration_ns" else "CODEC(ZSTD(3))"
        columns.append(f"`{name}` {ty} {codec}")
    s.query("CREATE DATABASE IF NOT EXISTS bench")
    s.query(f"CREATE TABLE bench.spans ({', '.join(columns)}) ENGINE = MergeTree ORDER BY (service_name, name, start_time, trace_id)")
    s.query(f"INSERT INTO bench.spans SELECT * FROM file('{parquet}', Parquet)")
    s.query("OPTIMIZE TABLE bench.spans FINAL")
    rows = int(s.query("SELECT count() FROM bench.spans", "CSV").bytes().decode().strip())
    size = int(s.query("SELECT sum(bytes_on_disk) FROM system.parts WHERE database = 'bench' AND table = 'spans' AND active", "CSV").bytes().decode().strip())
    return rows, size


def main():
    parquet = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as workdir:
        for name, measure in (("duckdb", duckdb_bytes), ("chdb", chdb_bytes)):
            rows, size = measure(parquet, workdir)
            print(f"{name}: {size} bytes for {rows} spans = {size / rows:.2f} bytes/span")


if __name__ == "__main__":
    main()
