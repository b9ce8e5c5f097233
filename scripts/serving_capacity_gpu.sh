#!/usr/bin/env bash
# The serving-capacity load tests of docs/serving-capacity.md, on a GPU host, in one go:
#   1. the host path alone: `streamdec serve --engine simulated` (nothing decoded) at 800 and 1,000 streams,
#      the server on CPU $HOST_CPUS (default 0; empty: wherever the scheduler puts it), the clients elsewhere;
#   2. the real engine (auk-24k, fp16x3, default mode) at 512 streams through the websocket server;
#   3. the same streams through one in-process StreamDecoder (the comparison point).
# Usage: scripts/serving_capacity_gpu.sh OUT_DIR [HOST_COUNTS] [REAL_COUNTS]
# Each step is bounded by `timeout`, so one that hangs leaves the others' JSON behind.
set -uo pipefail
out=${1:?usage: $0 OUT_DIR [HOST_COUNTS] [REAL_COUNTS]}
host_counts=${2:-800,1000}
real_counts=${3:-512}
mkdir -p "$out"
py=${PYTHON:-python3}
step() {  # step NAME SECONDS ARGS...
  local name=$1 secs=$2
  shift 2
  echo "== $name ($(date -u +%T))"
  timeout "$secs" "$py" -m streamdec.cli loadtest "$@" --out "$out/$name.json" > "$out/$name.log" 2>&1
  echo "rc=$?" >> "$out/$name.log"
  grep -E "^loadtest:|rc=" "$out/$name.log" | tail -8
}
host_cpus=${HOST_CPUS-0}
step serve-host-path "${HOST_TIMEOUT:-200}" --engine simulated --codec auk-24k --device cpu --server-threads 1 \
  --server-arg=--event-loop=uvloop ${host_cpus:+--server-cpus "$host_cpus"} --streams "$host_counts" \
  --max-runs "${HOST_RUNS:-4}"
step serve-real-engine-websocket "${REAL_TIMEOUT:-190}" --target websocket --codec auk-24k --device cuda \
  --precision fp16x3 --streams "$real_counts" --max-runs 2 --ttfa-limit-ms 100 --server-timeout 150
step serve-real-engine-decoder "${REAL_TIMEOUT:-190}" --target decoder --codec auk-24k --device cuda \
  --precision fp16x3 --streams "$real_counts" --max-runs 2 --ttfa-limit-ms 100 --server-timeout 150
