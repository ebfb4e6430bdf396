#!/usr/bin/env bash
# Installs what building and testing Weft needs, when it is missing: clang and libclang (RocksDB's
# bindings), mold (a fast linker), psql (the PostgreSQL client the SQL tests drive), Prometheus
# and promtool (the PromQL answers are checked against a real Prometheus), and a Python
# virtual environment with the OpenTelemetry SDK, psycopg, asyncpg and pytest for the client tests. Safe to run again: it only installs what is absent.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v clang >/dev/null 2>&1 || need_apt+=(clang)
command -v mold >/dev/null 2>&1 || need_apt+=(mold)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
if [ "${1:-}" = "--python" ]; then
  command -v psql >/dev/null 2>&1 || need_apt+=(postgresql-client)
  command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
fi
if ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 && ! ls /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1; then
  need_apt+=(libclang-dev)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ "${1:-}" = "--python" ]; then
  if [ ! -x .venv/bin/pytest ] || ! .venv/bin/python -c "import opentelemetry.exporter.otlp.proto.grpc, psycopg, asyncpg, duckdb" 2>/dev/null; then
    echo "setup: creating .venv with the OpenTelemetry SDK, psycopg, asyncpg and pytest"
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -r tests/python/requirements.txt
  fi
fi
