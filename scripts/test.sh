#!/usr/bin/env bash
# Runs the whole test suite: formatting and lints, Rust unit and end-to-end tests (the real
# binary, real clients), the OpenTelemetry Python SDK client tests, and a check that the
# sqllogictest answers are still DuckDB's. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --python
if [ -z "${CARGO_TARGET_DIR:-}" ] && [ -d "$HOME/.cache/weft-target" ]; then
  export CARGO_TARGET_DIR="$HOME/.cache/weft-target"
fi
target="${CARGO_TARGET_DIR:-$PWD/target}"

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings

# The end-to-end tests start the weft binary: build it (with the same feature unification as
# `cargo test --workspace`, so nothing is compiled twice), then all tests.
cargo build --workspace --bins
cargo test --workspace --no-fail-fast -- --test-threads "${WEFT_TEST_THREADS:-2}"

WEFT_BIN="$target/debug/weft" .venv/bin/pytest -q tests/python

# The sqllogictest answers are DuckDB's: check that they still are, on the same generated data.
slt_data="$(mktemp -d)"
trap 'rm -rf "$slt_data"' EXIT
"$target/debug/weft-bench" generate --seed 7 --spans 12000 --rate 5 --parquet "$slt_data/data.parquet" >/dev/null
.venv/bin/python tests/slt/expected.py --check "$slt_data/data.parquet"
