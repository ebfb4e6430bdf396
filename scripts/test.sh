#!/usr/bin/env bash
# Runs the whole test suite: Rust unit and end-to-end tests (the real binary, real clients),
# then the OpenTelemetry Python SDK client tests. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --python
if [ -z "${CARGO_TARGET_DIR:-}" ] && [ -d "$HOME/.cache/weft-target" ]; then
  export CARGO_TARGET_DIR="$HOME/.cache/weft-target"
fi
target="${CARGO_TARGET_DIR:-$PWD/target}"

# The end-to-end tests start the weft binary: build it (with the same feature unification as
# `cargo test --workspace`, so nothing is compiled twice), then all tests.
cargo build --workspace --bins
cargo test --workspace --no-fail-fast -- --test-threads "${WEFT_TEST_THREADS:-2}"

WEFT_BIN="$target/debug/weft" .venv/bin/pytest -q tests/python
