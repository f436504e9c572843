#!/usr/bin/env bash
# make bench: the Go benchmarks, then the collector side by side with the
# alternatives a user would pick, all in one run on this machine:
#   - token path (bench/cmd/tokenbench): hooks HTTP and UDP → token_session
#     against the stock pipeline (span per token → tail_sampling +
#     span_metrics, bin/otelcol-stock built by bench/stock/build.sh), memory
#     per in-flight session, the token path by workload shape (eight shapes,
#     ours over the hook clients' default transport, the Unix socket, vs
#     stock; 3 runs a side alternating, median ratio and spread), a busy node
#     (8 engines × 5000 tokens/s for 60 s: collector cores, ours vs stock),
#     scale to 100k sessions, event rate to saturation with a
#     CPU profile, the overhead at the demo's load (vllmsim + llmload
#     -concurrency 200), and the scale-out topology's costs (the agent through
#     load_balancing vs otlp, a tail_sampling gateway per span);
#   - proxy (bench/proxy/run.sh): direct vs the collector's proxy vs nginx at
#     100 and 500 streams, 3 runs alternating, and a busy node (800 streams,
#     40 000 events/s, 60 s) through each proxy.
# Writes $OUT_DIR/results.md and results.json (default bench/results, which
# git ignores), with the logs, configs and profile beside them.
# Env: BENCHTIME (Go benchmarks, default 1s), OUT_DIR, PROXY_DURATION (10s),
#      E2E_DURATION (20s), TOKENBENCH_FLAGS (extra tokenbench flags),
#      PROXY_BENCH=0 (skip the proxy benchmark), PROXY_PORT_BASE (28100),
#      PROXY_REPEAT (3), PROXY_BUSY_STREAMS (800; 0 skips the busy node),
#      PROXY_BUSY_DURATION (60s).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
GO=${GO:-go}
OUT=$(mkdir -p "${OUT_DIR:-$ROOT/bench/results}" && cd "${OUT_DIR:-$ROOT/bench/results}" && pwd)
: >"$OUT/timings.tsv"

# phase NAME CMD...: runs CMD and records its wall time in timings.tsv.
phase() {
  local name=$1 t0 t1
  shift
  echo "== $name" >&2
  t0=$(date +%s%N)
  "$@"
  t1=$(date +%s%N)
  printf '%s\t%s\n' "$name" "$(awk -v ns=$((t1 - t0)) 'BEGIN{printf "%.1f", ns/1e9}')" >>"$OUT/timings.tsv"
}

go_benchmarks() {
  $GO test -run '^$' -bench . -benchmem -benchtime "${BENCHTIME:-1s}" ./... | tee "$OUT/gobench.txt"
}
tools() {
  $GO build -o bin/vllmsim ./cmd/vllmsim
  $GO build -o bin/llmload ./cmd/llmload
  $GO build -o bin/tokenbench ./bench/cmd/tokenbench
}
tokenbench() {
  # shellcheck disable=SC2086 # TOKENBENCH_FLAGS is a list of flags
  bin/tokenbench -out "$OUT" -collector bin/otelcol-llm -stock bin/otelcol-stock \
    -vllmsim bin/vllmsim -llmload bin/llmload -e2e-duration "${E2E_DURATION:-20s}" ${TOKENBENCH_FLAGS:-}
}
proxy() {
  # Ports of its own, away from the proxy script's default (18000-18003),
  # which a developer may be running by hand at the same time.
  OUT_DIR=$OUT DURATION=${PROXY_DURATION:-10s} PORT_BASE=${PROXY_PORT_BASE:-28100} REPEAT=${PROXY_REPEAT:-3} \
    BUSY_STREAMS=${PROXY_BUSY_STREAMS:-800} BUSY_DURATION=${PROXY_BUSY_DURATION:-60s} bench/proxy/run.sh
}

[[ -x bin/otelcol-llm ]] || { echo "bin/otelcol-llm missing: make build" >&2; exit 1; }
ulimit -n 16384 2>/dev/null || true
phase go-benchmarks go_benchmarks
phase stock-build bench/stock/build.sh
phase tools tools
phase tokenbench tokenbench
[[ ${PROXY_BENCH:-1} == 0 ]] || phase proxy proxy
bin/tokenbench -report -out "$OUT"
cat "$OUT/results.md"
