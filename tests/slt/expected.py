"""Fills the expected results of the .slt files here by running each query in DuckDB over the
generator's Parquet export of the same data (an engine independent of Weft's).

Usage: python tests/slt/expected.py [--check] data.parquet
  (data.parquet from `weft-bench generate --seed 7 --spans 12000 --rate 5 --parquet data.parquet`)
With --check, nothing is written: it fails (listing the differences) when a file's expected
results are not what DuckDB answers, so the answers cannot drift (the test command runs it).
"""

import difflib

import pathlib
import sys

import duckdb


def text(v) -> str:
    if v is None:
        return "NULL"
    if v == "":
        return "(empty)"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def fill(path: pathlib.Path, con) -> str:
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        if not line.startswith("query "):
            continue
        previous = out[-2] if len(out) > 1 else ""
        duck = previous[len("# duckdb: "):] if previous.startswith("# duckdb: ") else None
        sql = []
        while i < len(lines) and lines[i] != "----":
            sql.append(lines[i])
            out.append(lines[i])
            i += 1
        out.append("----")
        i += 1
        while i < len(lines) and lines[i].strip() != "":  # old results
            i += 1
        rows = con.execute(duck or "\n".join(sql)).fetchall()
        for r in rows:
            out.append(" ".join(text(v) for v in r))
    return "\n".join(out) + "\n"


def main():
    args = sys.argv[1:]
    check = "--check" in args
    parquet = [a for a in args if a != "--check"][0]
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute(f"CREATE VIEW spans AS SELECT * FROM read_parquet('{parquet}')")
    stale = False
    for f in sorted(pathlib.Path(__file__).parent.glob("*.slt")):
        want = fill(f, con)
        if not check:
            f.write_text(want)
            print(f"filled {f}")
        elif want != f.read_text():
            stale = True
            diff = difflib.unified_diff(
                f.read_text().splitlines(), want.splitlines(), str(f), "duckdb", lineterm=""
            )
            print("\n".join(diff))
    if stale:
        sys.exit(f"expected results differ from DuckDB's: run python {sys.argv[0]} {parquet}")
    if check:
        print("sqllogictest answers agree with DuckDB")


if __name__ == "__main__":
    main()
