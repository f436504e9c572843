#!/usr/bin/env bash
# make bench: the Go benchmarks (and the in-process token path over the Unix
# socket, BenchmarkTokenPathUnix/batch1000/stream, 3 more times: the median
# ns/event and the spread), then the collector side by side with the
# alternatives a user would pick, all in one run on this machine:
#   - token path (bench/cmd/tokenbench): hooks HTTP and UDP → token_session
#     against the stock pipeline (span per token → tail_sampling +
#     span_metrics, bin/otelcol-stock built by bench/stock/build.sh), memory
#     per in-flight session (ours: median of 3 fresh collectors), the token
#     path by workload shape (eight shapes, ours over the hook clients'
#     default transport, the Unix socket, vs stock, and two of them, 1 and 50
#     sessions per POST, again over the HTTP hook; 3 runs a side
#     alternating, median ratio and spread), a busy node
#     (8 engines × 5000 tokens/s for 60 s: collector cores, ours vs stock),
#     scale to 100k sessions, event rate to saturation with a
#     CPU profile, the overhead at the demo's load (vllmsim + llmload
#     -concurrency 200), and the scale-out topology's costs (the agent through
#     load_balancing vs otlp, a tail_sampling gateway per span);
#   - proxy (bench/proxy/run.sh): direct vs the collector's proxy vs nginx at
#     100 and 500 streams, 3 runs alternating, and a busy node (800 streams,
#     40 000 events/s, 60 s) through each proxy; and again at the outside
#     check's shape (100 streams × 200 events 20 ms apart, the client not
#     asking for usage, so the proxy folds the usage chunk), 3 runs
#     alternating, into proxy-outside/.
# The summary table of results.md holds every target of issue 44, each met
# or missed.
# Writes $OUT_DIR/results.md and results.json (default bench/results, which
# git ignores), with the logs, configs and profile beside them.
# Env: BENCHTIME (Go benchmarks, default 1s), OUT_DIR, PROXY_DURATION (10s),
#      E2E_DURATION (20s), TOKENBENCH_FLAGS (extra tokenbench flags),
#      PROXY_BENCH=0 (skip the proxy benchmark), PROXY_PORT_BASE (28100),
#      PROXY_REPEAT (3), PROXY_BUSY_STREAMS (800; 0 skips the busy node),
#      PROXY_BUSY_DURATION (60s), PROXY_OUTSIDE_DURATION (10s; 0 skips the
#      outside check's shape), TOKENPATH_BENCHTIME (the in-process token
#      path's three runs, default BENCHTIME).
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
# The in-process token path's target row: its benchmark 3 times for a
# median and spread (go_benchmarks ran it once).
tokenpath_bench() {
  $GO test -run '^$' -bench 'BenchmarkTokenPathUnix$/^batch1000$/^stream$' -count 3 -benchmem \
    -benchtime "${TOKENPATH_BENCHTIME:-${BENCHTIME:-1s}}" ./receiver/tokenstreamreceiver/ | tee "$OUT/gobench-tokenpath.txt"
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

# The outside check's shape: 100 streams of 200 events 20 ms apart, the
# client not asking for usage (the proxy asks and folds), no busy node.
proxy_outside() {
  OUT_DIR=$OUT/proxy-outside DURATION=${PROXY_OUTSIDE_DURATION:-10s} PORT_BASE=$((${PROXY_PORT_BASE:-28100} + 10)) \
    REPEAT=${PROXY_REPEAT:-3} CONCURRENCY=100 N=200 GAP=20ms USAGE=0 BUSY_STREAMS=0 bench/proxy/run.sh
}

[[ -x bin/otelcol-llm ]] || { echo "bin/otelcol-llm missing: make build" >&2; exit 1; }
ulimit -n 16384 2>/dev/null || true
phase go-benchmarks go_benchmarks
phase tokenpath-bench tokenpath_bench
phase stock-build bench/stock/build.sh
phase tools tools
phase tokenbench tokenbench
[[ ${PROXY_BENCH:-1} == 0 ]] || phase proxy proxy
[[ ${PROXY_BENCH:-1} == 0 || ${PROXY_OUTSIDE_DURATION:-10s} == 0 ]] || phase proxy-outside proxy_outside
bin/tokenbench -report -out "$OUT"
cat "$OUT/results.md"
