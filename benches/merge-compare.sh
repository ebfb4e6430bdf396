#!/usr/bin/env bash
# Merged against unmerged: N spans (default 20M) sent to a release `weft serve` whose blocks are
# 40k rows (none small enough to merge), then `weft-bench queries` on that store, then on the same
# data merged to the default target (131,072 rows) and to 262,144. Run from the repository root
# after `cargo build --release --workspace --bins`; uses ports 13100/14317/14318/15432 and /tmp/m20.
set -u
B=${CARGO_TARGET_DIR:-$HOME/.cache/weft-target}/release
D=/tmp/m20
N=${N:-20000000}
PORTS="--http-listen 127.0.0.1:13100 --otlp-http-listen 127.0.0.1:14318 --otlp-grpc-listen 127.0.0.1:14317 --pg-listen 127.0.0.1:15432"
start() { $B/weft serve --data-dir $D $PORTS --sql-memory-limit 4294967296 "$@" > /tmp/m20-serve.log 2>&1 & PID=$!; for i in $(seq 1 600); do curl -sf http://127.0.0.1:13100/ready >/dev/null && return; sleep 0.5; done; echo "not ready"; exit 1; }
stop() { kill -TERM $PID; wait $PID; }
blocks() { curl -s http://127.0.0.1:13100/metrics | grep -E "^weft_blocks |^weft_merges_total|^weft_blocks_merged_total"; }
rm -rf $D
start --flush-rows 40000 --merge-idle 1000h
/usr/bin/time -v $B/weft-bench send --spans $N --target http://127.0.0.1:14318 2>&1 | grep -E "spans|Maximum resident|Elapsed"
sleep 15
blocks
stop
$B/weft-bench compact --data-dir $D
start --flush-rows 40000 --merge-idle 1000h
echo "== unmerged"; blocks
$B/weft-bench queries --spans $N --target http://127.0.0.1:13100 --pg 127.0.0.1:15432 --runs 3
stop
for T in 131072 262144; do
  start --flush-rows $T --merge-idle 1s
  prev=""
  for i in $(seq 1 240); do sleep 5; cur=$(blocks | tr '\n' ' '); [ "$cur" = "$prev" ] && break; prev=$cur; done
  echo "== merged to $T: $cur"
  stop
  $B/weft-bench compact --data-dir $D
  start --flush-rows $T --merge-idle 1s
  blocks
  $B/weft-bench queries --spans $N --target http://127.0.0.1:13100 --pg 127.0.0.1:15432 --runs 3
  stop
done
du -sh $D
