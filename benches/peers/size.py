"""Bytes on disk per span for peers (DuckDB, chDB) on the generator's Parquet export.

Usage: python benches/peers/size.py data.parquet

The tables are loaded exactly as `weft-bench peers` loads them (see peers.py): DuckDB sorted by
(service_name, name, start_time) and checkpointed; chDB as a MergeTree ordered by (service, span
name, time, trace id), ZSTD(3), Delta on times, a bloom-filter index on trace id, merged to
one part.
"""

import os
import sys
import tempfile

from peers import chdb_engine, duckdb_engine


def main():
    parquet = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as workdir:
        for name, make in (("duckdb", duckdb_engine), ("chdb", chdb_engine)):
            os.makedirs(os.path.join(workdir, name))
            rows, size, _ = make(parquet, os.path.join(workdir, name))
            print(f"{name}: {size} bytes for {rows} spans = {size / rows:.2f} bytes/span")


if __name__ == "__main__":
    main()
