#!/usr/bin/env bash
# The token_stream receiver's vllm source against contrib's prometheus
# receiver on the same engine: what each reads from the
# repository's vLLM expositions, CPU per scrape, memory and first-scrape
# latency. Every process is on loopback, bounded in time and stopped by the
# harness (bench/scrape/*.go); the results are printed as Markdown at the end
# and written to $OUT_DIR/results.md and results.json, beside the configs,
# logs and outputs of every collector run.
# Env: OUT_DIR (default ${TMPDIR:-/tmp}/otelcol-llm-bench-scrape), RUNS (3),
#      CPU_DURATION (60s), CPU_INTERVAL (250ms), LATENCY_INTERVALS (5s,15s),
#      LATENCY_STARTS (3 per run), PARTS (correctness,cpu,latency),
#      VLLMSIM=0 (skip the live-engine CPU case), TIMEOUT (7200 s, the whole run).
# Extra arguments go to the harness (see -h).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
GO=${GO:-go}
OUT=${OUT_DIR:-${TMPDIR:-/tmp}/otelcol-llm-bench-scrape}
mkdir -p "$OUT"
[[ -x bin/otelcol-llm ]] || { echo "bin/otelcol-llm missing: make build" >&2; exit 1; }

$GO build -o "$OUT/scrapebench" ./bench/scrape
SIM=""
if [[ ${VLLMSIM:-1} != 0 ]]; then
  $GO build -o "$OUT/vllmsim" ./cmd/vllmsim
  SIM="$OUT/vllmsim"
fi
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); output in $OUT" >&2
timeout "${TIMEOUT:-7200}" "$OUT/scrapebench" -collector bin/otelcol-llm -root . -out "$OUT" -vllmsim "$SIM" \
  -runs "${RUNS:-3}" -cpu-duration "${CPU_DURATION:-60s}" -cpu-interval "${CPU_INTERVAL:-250ms}" \
  -latency-intervals "${LATENCY_INTERVALS:-5s,15s}" -latency-starts "${LATENCY_STARTS:-3}" \
  -parts "${PARTS:-correctness,cpu,latency}" "$@"
