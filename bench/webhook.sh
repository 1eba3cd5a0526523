#!/usr/bin/env bash
# Benchmark of `verno serve`: the busybox AdmissionReview posted to /validate over TLS
# keep-alive (HTTP/1.1, as the kube-apiserver does), first with the 17 PSS policies of
# Kyverno's load test, then with no policies, back to back. Reports req/s, p50, p99, peak RSS
# and the ratio pss17/empty.
#
#   bench/webhook.sh [--connections 64] [--duration 10] [--shared ../shared]
set -euo pipefail
cd "$(dirname "$0")/.."
CONNS=64
DURATION=10
SHARED=../shared
while [ $# -gt 0 ]; do
  case "$1" in
    --connections) CONNS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --shared) SHARED=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if ! command -v wrk >/dev/null; then
  echo "installing wrk (Debian package)" >&2
  apt-get install -y wrk >/dev/null
fi
cargo build --release -p verno >&2
BIN=target/release/verno
BODY="$SHARED/bench/requests/pod-busybox-create.json"
PSS="$SHARED/bench/policies/pss-17"
[ -f "$BODY" ] && [ -d "$PSS" ] || { echo "need $BODY and $PSS" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
mkdir -p "$WORK/empty"
cat > "$WORK/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$BODY", "r")
wrk.body = f:read("*a")
f:close()
done = function(summary, latency, requests)
  io.write(string.format("RESULT %.0f %.3f %.3f %d\n", summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.status + summary.errors.timeout))
end
LUA

run() { # name policies-dir port
  local name=$1 dir=$2 port=$3
  "$BIN" serve --policies "$dir" --addr "127.0.0.1:$port" --metrics-addr off --tls-dir "$WORK/tls" 2>"$WORK/$name.log" &
  local pid=$!
  for _ in $(seq 50); do curl -sk "https://127.0.0.1:$port/health/readiness" >/dev/null 2>&1 && break; sleep 0.1; done
  # warm-up
  wrk -t1 -c"$CONNS" -d2s -s "$WORK/post.lua" "https://127.0.0.1:$port/validate" >/dev/null
  local line
  line=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s "$WORK/post.lua" "https://127.0.0.1:$port/validate" | grep '^RESULT')
  local rss
  rss=$(awk '/VmHWM/ {printf "%.1f", $2/1024}' "/proc/$pid/status")
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  read -r _ rps p50 p99 errs <<<"$line"
  printf '%-6s  %8s req/s  p50 %6s ms  p99 %6s ms  peak RSS %5s MiB  errors %s\n' "$name" "$rps" "$p50" "$p99" "$rss" "$errs"
  eval "${name}_rps=$rps"
}

echo "verno serve, $CONNS connections, ${DURATION}s, $(nproc) CPUs, $(date -u +%F)"
run pss17 "$PSS" 19443
run empty "$WORK/empty" 19444
awk -v a="$pss17_rps" -v b="$empty_rps" 'BEGIN {printf "ratio pss17/empty: %.2f\n", a / b}'
