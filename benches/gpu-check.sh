#!/usr/bin/env bash
# Runs the real NVML collector for 30 s on a machine with NVIDIA GPUs and checks the series:
# every GPU that nvidia-smi lists answers gpu_utilization_ratio, gpu_memory_used_bytes,
# gpu_temperature_celsius and gpu_power_usage_watts through the Prometheus API, with values in
# range, and `weft gpu-agent` sends one sample to the same server. Usage: benches/gpu-check.sh
# [path/to/weft] (default: target/release/weft, built when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-${CARGO_TARGET_DIR:-target}/release/weft}"
[ -x "$bin" ] || cargo build --release --bin weft
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
[ "$gpus" -gt 0 ] || { echo "gpu-check: nvidia-smi lists no GPU"; exit 1; }
dir=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
"$bin" serve --data-dir "$dir" --gpu --gpu-interval 2s \
  --otlp-grpc-listen 127.0.0.1:14317 --otlp-http-listen 127.0.0.1:14318 \
  --http-listen 127.0.0.1:13200 --pg-listen 127.0.0.1:15433 &
pid=$!
for _ in $(seq 60); do curl -sf localhost:13200/ready >/dev/null && break; sleep 0.5; done
sleep 30
"$bin" gpu-agent --target http://127.0.0.1:14318 --tenant agent --samples 1
q() { curl -sf "localhost:13200/prometheus/api/v1/query" --data-urlencode "query=$1" -H "X-Scope-OrgID: ${2:-single-tenant}"; }
python3 - "$gpus" "$(q gpu_utilization_ratio)" "$(q gpu_memory_used_bytes)" "$(q gpu_temperature_celsius)" \
  "$(q gpu_power_usage_watts)" "$(q 'count_over_time(nvml_gpu_utilization_percent[1m])')" "$(q gpu_memory_used_bytes agent)" <<'PY'
import json, sys
gpus = int(sys.argv[1])
util, mem, temp, power, samples, agent = (json.loads(a)["data"]["result"] for a in sys.argv[2:])
def check(name, series, lo, hi):
    assert len(series) == gpus, f"{name}: {len(series)} series for {gpus} GPUs"
    for s in series:
        v = float(s["value"][1])
        assert lo <= v <= hi, f"{name} {s['metric']}: {v} outside [{lo}, {hi}]"
        assert s["metric"].get("gpu_uuid", "").startswith("GPU-"), s["metric"]
check("gpu_utilization_ratio", util, 0, 1)
check("gpu_memory_used_bytes", mem, 0, 2**40)
check("gpu_temperature_celsius", temp, 5, 110)
check("gpu_power_usage_watts", power, 1, 2000)
assert all(float(s["value"][1]) >= 10 for s in samples), f"too few samples in a minute: {samples}"
assert len(agent) == gpus, f"gpu-agent sent {len(agent)} series for {gpus} GPUs"
print(f"gpu-check: {gpus} GPUs sampled every 2 s for 30 s; every series present and in range")
PY
