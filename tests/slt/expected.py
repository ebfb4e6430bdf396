"""Fills the expected results of the .slt files here by running each query in DuckDB over the
generator's Parquet export of the same data (an engine independent of Weft's).

Usage: python tests/slt/expected.py data.parquet
  (data.parquet from `weft-bench generate --seed 7 --spans 12000 --rate 5 --parquet data.parquet`)
"""

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


def fill(path: pathlib.Path, con) -> None:
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
    path.write_text("\n".join(out) + "\n")


def main():
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute(f"CREATE VIEW spans AS SELECT * FROM read_parquet('{sys.argv[1]}')")
    for f in sorted(pathlib.Path(__file__).parent.glob("*.slt")):
        fill(f, con)
        print(f"filled {f}")


if __name__ == "__main__":
    main()
