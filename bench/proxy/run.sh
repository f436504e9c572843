#!/usr/bin/env bash
# Proxy benchmark: per-SSE-event latency and CPU of the collector's
# token_stream proxy side by side with nginx (and no proxy at all).
# Usage: bench/proxy/run.sh            (from anywhere)
# Env:   DURATION=15s N=64 GAP=20ms CONCURRENCY="100 500" COLLECTOR=bin/otelcol-llm
#        REPEAT=3       runs of each concurrency per path, collector and nginx
#                       alternating; each figure is the median run's, each
#                       ratio the median of the runs' ratios, with the spread
#        USAGE=1        the client asks for stream_options.include_usage; 0: it
#                       does not, so the proxy asks on its behalf and folds
#                       the usage chunk's extras onto the finish chunk (the
#                       outside check's client)
#        BUSY_STREAMS=800 BUSY_DURATION=60s  the busy node: 8 engines × 100
#                       streams of one event every GAP (5000 tokens/s an
#                       engine) through each proxy, REPEAT times; 0: skip
#        PORT_BASE=18000 (upstream; +1 collector, +2 nginx, +3 collector pprof)
#        OUT_DIR=<dir>  write <dir>/proxy.json and <dir>/proxy.md
#                       (default: bench/results/proxy, git-ignored)
#        PROFILE=1      also save a 5 s CPU profile of the collector at each C
#                       (pprof extension) as collector-cpu-c<C>.pprof in the output dir
# Time: 3 × REPEAT runs of DURATION per concurrency plus ~8 s each (tail of
# the last streams, pauses), 2 × REPEAT busy-node runs, and building the two
# helpers: about 15 min with the defaults, 3 min with DURATION=5s REPEAT=1
# BUSY_STREAMS=0.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT_DIR=${OUT_DIR:-$ROOT/bench/results/proxy}
mkdir -p "$OUT_DIR"; OUT_DIR=$(cd "$OUT_DIR" && pwd)
OUT_JSON=$OUT_DIR/proxy.json OUT_MD=$OUT_DIR/proxy.md
PROFILE=${PROFILE:-0}
DURATION=${DURATION:-15s}
N=${N:-64}
GAP=${GAP:-20ms}
CONCURRENCY=${CONCURRENCY:-"100 500"}
REPEAT=${REPEAT:-3}
USAGE=${USAGE:-1}
BUSY_STREAMS=${BUSY_STREAMS:-800}
BUSY_DURATION=${BUSY_DURATION:-60s}
COLLECTOR=${COLLECTOR:-$ROOT/bin/otelcol-llm}
# The results name the collector by its path in the repository, not on the
# machine that ran them.
COLLECTOR_NAME=${COLLECTOR#"$ROOT"/}
PORT_BASE=${PORT_BASE:-18000}
UP_PORT=$PORT_BASE COL_PORT=$((PORT_BASE + 1)) NGX_PORT=$((PORT_BASE + 2)) PPROF_PORT=$((PORT_BASE + 3))
TCK=$(getconf CLK_TCK)

WORK=$(mktemp -d /tmp/bench-proxy.XXXXXX)
PIDS=()
cleanup() {
  set +e
  [[ -f $WORK/nginx.pid ]] && kill -QUIT "$(cat "$WORK/nginx.pid")" 2>/dev/null
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 1
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  echo "logs and configs: $WORK" >&2
}
trap cleanup EXIT INT TERM

# --- nginx (Debian package) only if missing -------------------------------
if ! command -v nginx >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y nginx-light >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y nginx-light >/dev/null; } \
    || apt-get install -y nginx >/dev/null
fi

# --- binaries --------------------------------------------------------------
(cd "$ROOT" && go build -o "$WORK/" ./bench/proxy/upstream ./bench/proxy/client)
[[ -x $COLLECTOR ]] || { echo "no collector at $COLLECTOR (make build)" >&2; exit 1; }

# --- configs ---------------------------------------------------------------
cat >"$WORK/collector.yaml" <<YAML
extensions:
  pprof:
    endpoint: 127.0.0.1:$PPROF_PORT
receivers:
  token_stream:
    proxy:
      endpoint: 127.0.0.1:$COL_PORT
      upstream:
        endpoint: http://127.0.0.1:$UP_PORT
        keepalive:
          max_idle_conns: 2048
          max_idle_conns_per_host: 1024
processors:
  token_session: {}
exporters:
  debug:
    verbosity: basic
service:
  extensions: [pprof]
  telemetry:
    logs: {level: warn}
    metrics: {level: none}
  pipelines:
    logs:
      receivers: [token_stream]
      processors: [token_session]
      exporters: [debug]
YAML

mkdir -p "$WORK/nginx"
cat >"$WORK/nginx.conf" <<NGX
daemon off;
master_process on;
worker_processes auto;
worker_rlimit_nofile 16384;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx/body;
  proxy_temp_path $WORK/nginx/proxy;
  fastcgi_temp_path $WORK/nginx/fastcgi;
  uwsgi_temp_path $WORK/nginx/uwsgi;
  scgi_temp_path $WORK/nginx/scgi;
  upstream engine {
    server 127.0.0.1:$UP_PORT;
    keepalive 1024;
  }
  server {
    listen 127.0.0.1:$NGX_PORT;
    keepalive_requests 100000;
    location / {
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 120s;
    }
  }
}
NGX

# --- helpers ---------------------------------------------------------------
ticks() { # "utime stime" of the given pids, in clock ticks
  local u=0 k=0 p s
  for p in "$@"; do
    s=$(cat "/proc/$p/stat" 2>/dev/null) || continue
    s=${s##*) }            # fields from 3 on
    set -- $s
    u=$((u + ${12})); k=$((k + ${13}))   # fields 14 and 15
  done
  echo $u $k
}
ctxsw() { # voluntary + involuntary context switches of every thread of the given pids
  local t=0 p f
  for p in "$@"; do
    for f in /proc/$p/task/*/status; do
      t=$((t + $(awk '/ctxt_switches/{s+=$2} END{print s+0}' "$f" 2>/dev/null || echo 0)))
    done
  done
  echo $t
}
rss_kb() { awk '/^VmRSS:/{print $2}' "/proc/$1/status"; }
# heap_bytes: the collector's live heap (HeapAlloc right after a forced GC);
# the runtime's whole MemStats (stacks, GC goal, idle spans) go to
# $WORK/memstats.txt, and with PROFILE=1 beside the profiles.
heap_bytes() { curl -sf "http://127.0.0.1:$PPROF_PORT/debug/pprof/heap?gc=1&debug=1" | sed -n '/^# runtime.MemStats/,$p' | tee "$WORK/memstats.txt" | awk '/^# HeapAlloc = /{print $4; exit}'; }
# mem_parts FILE: "heap_resident stack_inuse gc_goal" bytes of a saved MemStats:
# the heap's pages the process holds (HeapSys − HeapReleased: in use, and
# freed but not yet returned to the OS), the goroutine stacks, the next GC's
# target.
mem_parts() { awk '/^# HeapSys = /{s=$4} /^# HeapReleased = /{r=$4} /^# Stack = /{k=$4} /^# NextGC = /{g=$4}
  END{print s-r+0, k+0, g+0}' "$1" 2>/dev/null || echo 0 0 0; }
# seconds DURATION: whole seconds of a Go duration such as 10s or 1m (3 if unsure).
seconds() { case $1 in *ms) echo 1 ;; *m) echo $((${1%m} * 60)) ;; *s) echo "${1%s}" | cut -d. -f1 ;; *) echo 3 ;; esac; }
nginx_pids() { local m; m=$(cat "$WORK/nginx.pid"); echo "$m" $(ps -o pid= --ppid "$m"); }
wait_port() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 not up" >&2; return 1; }

# --- start -----------------------------------------------------------------
ulimit -n 16384 || true
"$WORK/upstream" -addr 127.0.0.1:$UP_PORT -n "$N" -gap "$GAP" 2>"$WORK/upstream.log" & UP_PID=$!; PIDS+=($UP_PID)
"$COLLECTOR" --config "$WORK/collector.yaml" >"$WORK/collector.log" 2>&1 & COL_PID=$!; PIDS+=($COL_PID)
nginx -c "$WORK/nginx.conf" -p "$WORK/nginx" 2>"$WORK/nginx-start.log" & NGX_PID=$!; PIDS+=($NGX_PID)
wait_port $UP_PORT; wait_port $COL_PORT; wait_port $NGX_PORT
sleep 2
COL_RSS_IDLE=$(rss_kb $COL_PID)
COL_HEAP_IDLE=$(heap_bytes)
read -r COL_HEAPRES_IDLE COL_STACK_IDLE _ < <(mem_parts "$WORK/memstats.txt")
echo "collector idle RSS ${COL_RSS_IDLE} kB; $(nproc) cores; N=$N GAP=$GAP DURATION=$DURATION" >&2

RUNS="$WORK/runs.jsonl"; : >"$RUNS"

# run_path KIND PATH C DURATION REP: one client run of C streams through
# PATH for DURATION, one JSON line appended to $RUNS.
run_path() {
  local kind=$1 path=$2 C=$3 dur=$4 rep=$5 port tag out t0 t1
  case $path in
    direct)    port=$UP_PORT;  pids() { :; } ;;
    collector) port=$COL_PORT; pids() { echo $COL_PID; } ;;
    nginx)     port=$NGX_PORT; pids() { nginx_pids; } ;;
  esac
  tag=c$C; [[ $kind == busy ]] && tag=busy
  kill -USR1 $UP_PID; sleep 0.2; up_before=$(tail -1 "$WORK/upstream.log")
  read -r pu0 pk0 < <(ticks $(pids)); read -r uu0 uk0 < <(ticks $UP_PID); cs0=$(ctxsw $(pids)); rss_before=$(rss_kb $COL_PID)
  : >"$WORK/rss.txt"; : >"$WORK/heap.txt"
  if [[ $path == collector ]]; then
    ( while sleep 0.5; do rss_kb $COL_PID >>"$WORK/rss.txt"; done ) & RSS_PID=$!; PIDS+=($RSS_PID)
    # The live heap once, halfway through the run, every stream open; the
    # profiles of the first repetition only.
    ( sleep $(( $(seconds "$dur") / 2 + 1 )); heap_bytes >"$WORK/heap.txt"; cp "$WORK/memstats.txt" "$WORK/memstats-run.txt"
      if [[ $PROFILE == 1 && $rep == 1 ]]; then cp "$WORK/memstats.txt" "$OUT_DIR/collector-memstats-$tag.txt"
        curl -sf -o "$OUT_DIR/collector-heap-$tag.pprof" "http://127.0.0.1:$PPROF_PORT/debug/pprof/heap"; fi ) & PIDS+=($!)
    if [[ $PROFILE == 1 && $rep == 1 ]]; then
      ( sleep 3; curl -sf -o "$OUT_DIR/collector-cpu-$tag.pprof" "http://127.0.0.1:$PPROF_PORT/debug/pprof/profile?seconds=5" ) & PIDS+=($!)
    fi
  fi
  echo "run $rep/$REPEAT: $kind $path C=$C ..." >&2
  t0=$(date +%s%N)
  out=$("$WORK/client" -url "http://127.0.0.1:$port/v1/chat/completions" -c "$C" -duration "$dur" -label "$path" -usage="$([[ $USAGE == 0 ]] && echo false || echo true)")
  t1=$(date +%s%N)
  [[ $path == collector ]] && kill $RSS_PID 2>/dev/null
  read -r pu1 pk1 < <(ticks $(pids)); read -r uu1 uk1 < <(ticks $UP_PID); cs1=$(ctxsw $(pids))
  kill -USR1 $UP_PID; sleep 0.2; up_after=$(tail -1 "$WORK/upstream.log")
  rss_med=0; rss_max=0; heap_run=$(cat "$WORK/heap.txt" 2>/dev/null || true); heap_run=${heap_run:-0}
  read -r heapres_run stack_run goal_run < <(mem_parts "$WORK/memstats-run.txt"); rm -f "$WORK/memstats-run.txt"
  if [[ $path == collector ]]; then
    # steady state: drop the first 4 samples (2 s ramp) and the last 2 (drain)
    read -r rss_med rss_max < <(head -n -2 "$WORK/rss.txt" | tail -n +5 | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]+0, a[NR]+0}')
  fi
  echo "$out" | jq -c --arg kind "$kind" --arg path "$path" --argjson c "$C" --argjson rep "$rep" --argjson tck "$TCK" \
    --argjson wall "$(awk -v ns=$((t1 - t0)) 'BEGIN{printf "%.3f", ns/1e9}')" \
    --argjson pt "$((pu1 + pk1 - pu0 - pk0))" --argjson pk "$((pk1 - pk0))" --argjson ut "$((uu1 + uk1 - uu0 - uk0))" \
    --argjson cs "$((cs1 - cs0))" \
    --argjson rss_idle "$COL_RSS_IDLE" --argjson rss_before "$rss_before" --argjson rss_med "$rss_med" --argjson rss_max "$rss_max" \
    --argjson heap_idle "${COL_HEAP_IDLE:-0}" --argjson heap_run "$heap_run" \
    --argjson heapres_idle "${COL_HEAPRES_IDLE:-0}" --argjson stack_idle "${COL_STACK_IDLE:-0}" \
    --argjson heapres_run "${heapres_run:-0}" --argjson stack_run "${stack_run:-0}" --argjson goal_run "${goal_run:-0}" \
    --argjson up_before "$up_before" --argjson up_after "$up_after" '
    . + {kind: $kind, path: $path, c: $c, rep: $rep, wall_s: $wall,
         proxy_cpu_s: ($pt / $tck), upstream_cpu_s: ($ut / $tck),
         proxy_cores: (if $path == "direct" then null else ($pt / $tck / $wall) end),
         proxy_cpu_us_per_event: (if $path == "direct" then null else ($pt / $tck * 1e6 / .total_content_events) end),
         proxy_sys_us_per_event: (if $path == "direct" then null else ($pk / $tck * 1e6 / .total_content_events) end),
         proxy_ctxsw_per_event: (if $path == "direct" then null else ($cs / .total_content_events) end),
         upstream_connections: ($up_after.connections - $up_before.connections),
         upstream_requests: ($up_after.requests - $up_before.requests)}
    + (if $path == "collector" then {collector_rss_idle_kb: $rss_idle, collector_rss_before_kb: $rss_before,
         collector_rss_run_median_kb: $rss_med, collector_rss_run_max_kb: $rss_max,
         collector_heap_idle_bytes: $heap_idle, collector_heap_run_bytes: $heap_run,
         collector_heap_resident_idle_bytes: $heapres_idle, collector_heap_resident_run_bytes: $heapres_run,
         collector_stack_idle_bytes: $stack_idle, collector_stack_run_bytes: $stack_run, collector_gc_goal_run_bytes: $goal_run} else {} end)' >>"$RUNS"
  tail -1 "$RUNS" >&2
  sleep 2
}

# Each concurrency REPEAT times, the collector and nginx alternating which
# goes first (so neither always runs on a machine the other just warmed);
# direct first each time, as the baseline the added latencies are from.
for C in $CONCURRENCY; do
  for rep in $(seq "$REPEAT"); do
    order="collector nginx"; (( rep % 2 == 0 )) && order="nginx collector"
    for path in direct $order; do run_path stream "$path" "$C" "$DURATION" "$rep"; done
  done
done
# The busy node: BUSY_STREAMS streams (8 engines × 100 sequences decoding)
# of one event every GAP (50 tokens/s each: 5000 tokens/s an engine) for
# BUSY_DURATION through each proxy, alternating; the proxies' cores.
if (( BUSY_STREAMS > 0 )); then
  for rep in $(seq "$REPEAT"); do
    order="collector nginx"; (( rep % 2 == 0 )) && order="nginx collector"
    for path in $order; do run_path busy "$path" "$BUSY_STREAMS" "$BUSY_DURATION" "$rep"; done
  done
fi

# --- results ---------------------------------------------------------------
# Every figure of a path is the median of its REPEAT runs; a run's added
# latency is from the direct run of the same repetition, its CPU ratio from
# nginx's run of the same repetition.
GAP_MS=$(case $GAP in *ms) echo "${GAP%ms}" ;; *s) awk -v s="${GAP%s}" 'BEGIN{print s*1000}' ;; *) echo 0 ;; esac)
jq -s --arg n "$N" --arg gap "$GAP" --argjson gap_ms "$GAP_MS" --arg dur "$DURATION" --arg cores "$(nproc)" \
   --argjson repeat "$REPEAT" --argjson usage "$([[ $USAGE == 0 ]] && echo false || echo true)" --argjson busy_streams "$BUSY_STREAMS" --arg busy_dur "$BUSY_DURATION" \
   --arg nginx "$(nginx -v 2>&1 | sed 's/.*\///')" --arg collector "$COLLECTOR_NAME" '
  def median: sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  def med(f): [.[] | f | select(. != null)] | median;
  def runs(f): [.[] | f | select(. != null)];
  def rank: {direct: 0, collector: 1, nginx: 2}[.path];
  . as $runs
  | [$runs[] | select(.kind == "stream")] as $stream
  | [$runs[] | select(.kind == "busy")] as $busy
  | [ $stream[] as $r
      | ($stream[] | select(.c == $r.c and .rep == $r.rep and .path == "direct")) as $d
      | ($stream[] | select(.c == $r.c and .rep == $r.rep and .path == "nginx")) as $x
      | $r + {added_p50_us: ($r.p50_us - $d.p50_us), added_p99_us: ($r.p99_us - $d.p99_us),
              cpu_ratio: (if $r.path == "collector" then $r.proxy_cpu_us_per_event / $x.proxy_cpu_us_per_event else null end),
              p99_over_nginx_us: (if $r.path == "collector" then $r.p99_us - $x.p99_us else null end),
              mem_kb_per_stream: (if $r.path == "collector" then (($r.collector_rss_run_median_kb - $r.collector_rss_idle_kb) / $r.c) else null end),
              heap_kb_per_stream: (if $r.path == "collector" and $r.collector_heap_run_bytes > 0 then (($r.collector_heap_run_bytes - $r.collector_heap_idle_bytes) / 1024 / $r.c) else null end),
              heap_resident_kb_per_stream: (if $r.path == "collector" and $r.collector_heap_resident_run_bytes > 0 then (($r.collector_heap_resident_run_bytes - $r.collector_heap_resident_idle_bytes) / 1024 / $r.c) else null end),
              stack_kb_per_stream: (if $r.path == "collector" and $r.collector_stack_run_bytes > 0 then (($r.collector_stack_run_bytes - $r.collector_stack_idle_bytes) / 1024 / $r.c) else null end)} ] as $rs
  | {machine: {cores: ($cores|tonumber), clk_tck: '"$TCK"'},
     params: {n: ($n|tonumber), gap: $gap, duration: $dur, repeat: $repeat, client_asks_usage: $usage, busy_streams: $busy_streams, busy_duration: $busy_dur},
     nginx_version: $nginx, collector: $collector, runs: ($rs + $busy),
     summary: [ $rs | group_by(.c)[] | group_by(.path)[]
       | {path: .[0].path, c: .[0].c, runs: length,
          p50_us: med(.p50_us), p99_us: med(.p99_us), events_per_s: med(.events_per_s), errors: (map(.errors) | add),
          added_p50_us: med(.added_p50_us), added_p99_us: med(.added_p99_us), added_p99_runs: runs(.added_p99_us),
          p99_over_nginx_us: med(.p99_over_nginx_us), p99_over_nginx_runs: runs(.p99_over_nginx_us),
          cpu_us_per_event: med(.proxy_cpu_us_per_event), cpu_us_per_event_runs: runs(.proxy_cpu_us_per_event),
          sys_us_per_event: med(.proxy_sys_us_per_event), ctxsw_per_event: med(.proxy_ctxsw_per_event),
          cpu_ratio_collector_nginx: med(.cpu_ratio), cpu_ratio_runs: runs(.cpu_ratio),
          upstream_connections: (map(.upstream_connections) | add),
          rss_run_median_kb: med(.collector_rss_run_median_kb), rss_idle_kb: med(.collector_rss_idle_kb),
          mem_kb_per_stream: med(.mem_kb_per_stream), mem_kb_per_stream_runs: runs(.mem_kb_per_stream),
          heap_kb_per_stream: med(.heap_kb_per_stream), heap_kb_per_stream_runs: runs(.heap_kb_per_stream),
          heap_resident_kb_per_stream: med(.heap_resident_kb_per_stream), stack_kb_per_stream: med(.stack_kb_per_stream),
          gc_goal_run_bytes: med(.collector_gc_goal_run_bytes)} ]
       | sort_by(.c, rank),
     busy_node: (if ($busy | length) == 0 then null else
       [ $busy[] as $r | select($r.path == "collector")
         | ($busy[] | select(.rep == $r.rep and .path == "nginx")) as $x
         | {rep: $r.rep, collector_cores: $r.proxy_cores, nginx_cores: $x.proxy_cores, ratio: ($r.proxy_cores / $x.proxy_cores),
            collector_events_per_s: $r.events_per_s, nginx_events_per_s: $x.events_per_s,
            collector_cpu_us_per_event: $r.proxy_cpu_us_per_event, nginx_cpu_us_per_event: $x.proxy_cpu_us_per_event,
            collector_sys_us_per_event: $r.proxy_sys_us_per_event, nginx_sys_us_per_event: $x.proxy_sys_us_per_event,
            cpu_ratio: ($r.proxy_cpu_us_per_event / $x.proxy_cpu_us_per_event),
            collector_p99_us: $r.p99_us, nginx_p99_us: $x.p99_us, errors: ($r.errors + $x.errors)} ] as $pairs
       | {streams: $busy_streams, gap: $gap, duration: $busy_dur,
          offered_events_per_s: (if $gap_ms > 0 then $busy_streams * 1000 / $gap_ms else null end), runs: $pairs,
          collector_cores: ($pairs | med(.collector_cores)), nginx_cores: ($pairs | med(.nginx_cores)),
          ratio: ($pairs | med(.ratio)), ratio_runs: ($pairs | runs(.ratio)),
          cpu_ratio: ($pairs | med(.cpu_ratio)), cpu_ratio_runs: ($pairs | runs(.cpu_ratio)),
          collector_events_per_s: ($pairs | med(.collector_events_per_s)), nginx_events_per_s: ($pairs | med(.nginx_events_per_s)),
          collector_cpu_us_per_event: ($pairs | med(.collector_cpu_us_per_event)), nginx_cpu_us_per_event: ($pairs | med(.nginx_cpu_us_per_event)),
          nginx_sys_us_per_event: ($pairs | med(.nginx_sys_us_per_event)),
          collector_p99_us: ($pairs | med(.collector_p99_us)), nginx_p99_us: ($pairs | med(.nginx_p99_us)),
          errors: ($pairs | map(.errors) | add)} end)}' \
   "$RUNS" >"$OUT_JSON"

{
  echo "# Proxy benchmark: what a proxy adds per SSE event"
  echo
  echo "$(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, N=$N content chunks every $GAP per stream, $DURATION per run (first 2 s not sampled),"
  echo "$REPEAT runs per path and concurrency, the collector and nginx alternating which goes first; each figure is the median run's,"
  echo "each ratio the median of the runs' ratios (spread: the smallest and largest)."
  if [[ $USAGE == 0 ]]; then echo "USAGE=0: the client does not ask for usage, so the collector's proxy asks for it upstream and folds the usage chunk (nginx passes it through)."; fi
  echo "Client, upstream and proxy on the same machine (127.0.0.1). Latency = client receive time − upstream send time of each content chunk."
  echo "CPU = utime+stime of the proxying process(es) during the run ÷ content events (collector: one process; nginx: master + workers);"
  echo "of which kernel = the stime part. Context switches = voluntary + involuntary, all threads, ÷ content events."
  if [[ $PROFILE == 1 ]]; then echo "PROFILE=1: the collector was CPU-profiled for 5 s of the first run at each concurrency, which adds to its CPU figures."; fi
  echo
  echo "| path | C | runs | events/s | p50 µs | p99 µs | added p50 µs | added p99 µs | CPU µs/event | of which kernel | CPU collector/nginx (spread) | ctx switches/event | upstream conns | errors |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  jq -r 'def r1: if . == null then "—" else (.*10|round/10|tostring) end;
    def r2: (.*100|round/100|tostring);
    .summary[] | "| \(.path) | \(.c) | \(.runs) | \(.events_per_s|round) | \(.p50_us|round) | \(.p99_us|round) | \(if .path=="direct" then "—" else (.added_p50_us|round|tostring) end) | \(if .path=="direct" then "—" else (.added_p99_us|round|tostring) end) | \(.cpu_us_per_event|r1) | \(.sys_us_per_event|r1) | \(if .cpu_ratio_collector_nginx==null then "" else "\(.cpu_ratio_collector_nginx|r2)× (\(.cpu_ratio_runs|min|r2)–\(.cpu_ratio_runs|max|r2))" end) | \(if .ctxsw_per_event==null then "—" else (.ctxsw_per_event|r2) end) | \(.upstream_connections) | \(.errors) |"' "$OUT_JSON"
  echo
  jq -r 'def r1: (.*10|round/10|tostring);
    .summary[] | select(.path=="collector") | "Collector memory at C=\(.c) (median run): RSS idle \(.rss_idle_kb) kB, during the run \(.rss_run_median_kb) kB → \(.mem_kb_per_stream|r1) kB per open stream ((median − idle) ÷ C; runs \(.mem_kb_per_stream_runs|map(r1)|join(", "))); live heap after a forced GC halfway through, less idle, \(if .heap_kb_per_stream==null then "—" else (.heap_kb_per_stream|r1) end) KiB per open stream (runs \(.heap_kb_per_stream_runs|map(r1)|join(", "))); at that moment, less idle, per open stream: the heap pages the process holds (in use, or freed and not yet returned to the OS) \(if .heap_resident_kb_per_stream==null then "—" else (.heap_resident_kb_per_stream|r1) end) KiB, goroutine stacks \(if .stack_kb_per_stream==null then "—" else (.stack_kb_per_stream|r1) end) KiB; the next GC target \(if .gc_goal_run_bytes==null then "—" else (.gc_goal_run_bytes/1048576|r1) end) MiB."' "$OUT_JSON"
  # What one more stream costs, whatever the idle process holds: the RSS
  # slope between the smallest and the largest concurrency.
  jq -r '[.summary[] | select(.path=="collector")] | select(length > 1) | .[0] as $a | .[-1] as $b
    | "Marginal RSS per open stream between C=\($a.c) and C=\($b.c): \((($b.rss_run_median_kb - $a.rss_run_median_kb) / ($b.c - $a.c))*10|round/10) kB (the (median − idle) ÷ C figure also spreads the GC headroom of the idle heap over the streams)."' "$OUT_JSON"
  if (( BUSY_STREAMS > 0 )); then
    echo
    jq -r 'def r1: (.*10|round/10|tostring); def r2: (.*100|round/100|tostring); def r3: (.*1000|round/1000|tostring);
      .busy_node | "Busy node: \(.streams) streams (8 engines × \(.streams/8) sequences) of one event every \(.gap), \(.offered_events_per_s // "?") events/s offered, \(.duration) per run through each proxy, \(.runs|length) runs alternating. Collector \(.collector_cores|r3) cores (\(.collector_events_per_s|round) events/s delivered, \(.collector_cpu_us_per_event|r1) µs/event, p99 \(.collector_p99_us|round) µs), nginx \(.nginx_cores|r3) cores (\(.nginx_events_per_s|round) events/s, \(.nginx_cpu_us_per_event|r1) µs/event of which kernel \(.nginx_sys_us_per_event|r1), p99 \(.nginx_p99_us|round) µs): cores collector/nginx \(.ratio|r2)× (spread \(.ratio_runs|min|r2)–\(.ratio_runs|max|r2)), CPU per event \(.cpu_ratio|r2)× (spread \(.cpu_ratio_runs|min|r2)–\(.cpu_ratio_runs|max|r2)); errors \(.errors).\(if .offered_events_per_s != null and ([.collector_events_per_s, .nginx_events_per_s] | min) < 0.95 * .offered_events_per_s then " The machine saturated (a path delivered less than 95% of the offered events): its cores are what the machine had left, so CPU per event is the comparison." else "" end)"' "$OUT_JSON"
  fi
  echo
  echo "nginx $(jq -r .nginx_version "$OUT_JSON") (worker_processes auto, proxy_buffering off, HTTP/1.1 keepalive upstream); collector $COLLECTOR_NAME (token_stream proxy → token_session → debug basic)."
} >"$OUT_MD"
cat "$OUT_MD"
