#!/usr/bin/env bash
# Builds Weft (release) and starts it on its embedded default: data in ./weft-data, OTLP on
# 127.0.0.1:4317 (gRPC) and :4318 (HTTP), query API and UI on 127.0.0.1:3200.
# Extra arguments go to `weft serve` (see `weft serve --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if [ -z "${CARGO_TARGET_DIR:-}" ] && [ -d "$HOME/.cache/weft-target" ]; then
  export CARGO_TARGET_DIR="$HOME/.cache/weft-target"
fi
cargo build --release --workspace --bins
exec "${CARGO_TARGET_DIR:-target}/release/weft" serve "$@"
