#!/usr/bin/env bash
# Where a webhook request's time goes in place, beside the floor: each server under the load of
# `bench/webhook.sh` (wrk, TLS keep-alive, the busybox review), and per request its user and
# system CPU time (`/proc/<pid>/stat`), its context switches, voluntary and involuntary, summed
# over its threads (`/proc/<pid>/task/*/status`), and with --strace the system calls it makes
# (`strace -c -f` over part of the run; strace slows the server, so its req/s is not shown).
# docs/benchmarks.md, sixteenth pass, has what these said.
#
#   bench/where.sh [--servers "floor empty pss17"] [--duration 8] [--connections 64]
#                  [--verno PATH] [--strace] [--shared ../shared]
#
# Needs the release builds of `verno` and `webhook-floor` (`cargo build --release -p verno
# -p verno-floor`, as bench/webhook.sh makes them); --verno picks another verno binary.
set -euo pipefail
cd "$(dirname "$0")/.."
SERVERS="floor empty pss17"
DURATION=8
CONNS=64
BIN=target/release/verno
STRACE=
SHARED=../shared
while [ $# -gt 0 ]; do
  case "$1" in
    --servers) SERVERS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --connections) CONNS=$2; shift 2 ;;
    --verno) BIN=$2; shift 2 ;;
    --strace) STRACE=1; shift ;;
    --shared) SHARED=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
for tool in wrk ${STRACE:+strace}; do
  if ! command -v "$tool" >/dev/null; then
    echo "installing $tool (Debian package)" >&2
    apt-get install -y "$tool" >/dev/null
  fi
done
FLOOR=target/release/webhook-floor
BODY="$SHARED/bench/requests/pod-busybox-create.json"
PSS="$SHARED/bench/policies/pss-17"
for f in "$BIN" "$FLOOR" "$BODY"; do
  [ -e "$f" ] || { echo "need $f (see the comment at the top)" >&2; exit 2; }
done
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
mkdir -p "$WORK/empty"
. bench/post-lua.sh
post_lua "$BODY" > "$WORK/post.lua"
cat >> "$WORK/post.lua" <<'LUA'
done = function(summary, latency, requests)
  io.write(string.format("RESULT %d %.0f %.3f\n", summary.requests,
    summary.requests / (summary.duration / 1e6), latency:percentile(99) / 1000))
end
LUA

# Context switches of all of a process's threads: "voluntary involuntary".
switches() {
  cat /proc/"$1"/task/*/status 2>/dev/null | awk '
    /^voluntary_ctxt_switches/ { v += $2 } /^nonvoluntary_ctxt_switches/ { n += $2 }
    END { print v + 0, n + 0 }'
}

echo "wrk -t2 -c$CONNS, ${DURATION}s per server, $(nproc) CPUs, $(date -u +%F)"
port=19640
for name in $SERVERS; do
  port=$((port + 1))
  case "$name" in
    floor) "$FLOOR" "127.0.0.1:$port" 2>/dev/null & pid=$! ;;
    empty) "$BIN" serve --policies "$WORK/empty" --addr "127.0.0.1:$port" --metrics-addr off --tls-dir "$WORK/tls" 2>/dev/null & pid=$! ;;
    pss17) "$BIN" serve --policies "$PSS" --addr "127.0.0.1:$port" --metrics-addr off --tls-dir "$WORK/tls" 2>/dev/null & pid=$! ;;
    *) echo "unknown server $name" >&2; exit 2 ;;
  esac
  for _ in $(seq 100); do curl -sk "https://127.0.0.1:$port/health/readiness" >/dev/null 2>&1 && break; sleep 0.1; done
  url="https://127.0.0.1:$port/validate"
  wrk -t2 -c"$CONNS" -d2s -s "$WORK/post.lua" "$url" >/dev/null
  read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$pid/stat")
  read -r v0 n0 < <(switches "$pid")
  line=$(wrk -t2 -c"$CONNS" -d"${DURATION}s" --latency -s "$WORK/post.lua" "$url" | grep '^RESULT')
  read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$pid/stat")
  read -r v1 n1 < <(switches "$pid")
  read -r _ requests rps p99 <<<"$line"
  awk -v n="$name" -v q="$requests" -v r="$rps" -v p="$p99" -v hz="$(getconf CLK_TCK)" \
    -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v v=$((v1 - v0)) -v nv=$((n1 - n0)) 'BEGIN {
    printf "%-6s %7d req/s  p99 %6.3f ms  user %5.1f us/req  system %5.1f us/req  switches/req: voluntary %.3f involuntary %.3f\n",
      n, r, p, u / hz * 1e6 / q, s / hz * 1e6 / q, v / q, nv / q }'
  if [ -n "$STRACE" ]; then
    timeout $((DURATION / 2 + 1)) strace -c -f -p "$pid" -o "$WORK/strace" 2>/dev/null &
    spid=$!
    sleep 0.5
    line=$(wrk -t2 -c"$CONNS" -d"$((DURATION / 2))s" -s "$WORK/post.lua" "$url" | grep '^RESULT')
    wait "$spid" || true
    read -r _ requests _ _ <<<"$line"
    echo "  system calls per request under strace ($requests requests):"
    awk -v q="$requests" 'NF >= 5 && $1 ~ /^[0-9.]+$/ && $NF != "total" {
      printf "    %-16s %8.3f\n", $NF, $4 / q }' "$WORK/strace" | head -8
  fi
  kill "$pid"; wait "$pid" 2>/dev/null || true
done
