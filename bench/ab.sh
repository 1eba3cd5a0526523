#!/usr/bin/env bash
# Two (or more) `verno` binaries side by side under the webhook load of `bench/webhook.sh` (wrk,
# TLS keep-alive, the busybox review to /validate, the 17 Pod Security policies), alternated run
# by run, and each run repeated under several environment sizes. Why the sizes: on this machine
# the engine's speed moves by tens of percent with nothing but the size of the environment (it
# shifts the stack against the heap; docs/benchmarks.md, thirteenth pass), so one layout can
# make either build look faster. Prints every run, then per binary the medians over all runs.
#
#   bench/ab.sh [--rounds 2] [--pads "0 40 94"] [--duration 10] [--connections 64]
#               [--policies DIR] [--body FILE] [--shared ../shared] BIN BIN...
#
# --pads: environment padding in bytes (a variable PAD of that many characters), one run of each
# binary per padding per round. Needs nothing built: give it the binaries to compare.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=2
PADS="0 40 94"
DURATION=10
CONNS=64
SHARED=../shared
POL=
BODY=
BINS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --pads) PADS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --connections) CONNS=$2; shift 2 ;;
    --policies) POL=$2; shift 2 ;;
    --body) BODY=$2; shift 2 ;;
    --shared) SHARED=$2; shift 2 ;;
    -*) echo "unknown argument $1" >&2; exit 2 ;;
    *) BINS+=("$1"); shift ;;
  esac
done
[ "${#BINS[@]}" -ge 1 ] || { echo "usage: bench/ab.sh [options] BIN BIN..." >&2; exit 2; }
for b in "${BINS[@]}"; do [ -x "$b" ] || { echo "not an executable: $b" >&2; exit 2; }; done
if ! command -v wrk >/dev/null; then
  echo "installing wrk (Debian package)" >&2
  apt-get install -y wrk >/dev/null
fi
POL=${POL:-$SHARED/bench/policies/pss-17}
BODY=${BODY:-$SHARED/bench/requests/pod-busybox-create.json}
[ -f "$BODY" ] && [ -d "$POL" ] || { echo "need $BODY and $POL" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
. bench/post-lua.sh
post_lua "$BODY" > "$WORK/post.lua"
cat >> "$WORK/post.lua" <<'LUA'
done = function(summary, latency, requests)
  io.write(string.format("RESULT %.0f %.3f\n", summary.requests / (summary.duration / 1e6),
    latency:percentile(99) / 1000))
end
LUA

run() { # index binary padding port
  local i=$1 bin=$2 pad=$3 port=$4 pid line t0 t1 rss rps p99 cpu
  env PAD="$(head -c "$pad" /dev/zero | tr '\0' x)" "$bin" serve --policies "$POL" --addr "127.0.0.1:$port" \
    --metrics-addr off --tls-dir "$WORK/tls" 2>"$WORK/server.log" &
  pid=$!
  for _ in $(seq 100); do curl -sk "https://127.0.0.1:$port/health/readiness" >/dev/null 2>&1 && break; sleep 0.1; done
  wrk -t2 -c"$CONNS" -d2s -s "$WORK/post.lua" "https://127.0.0.1:$port/validate" >/dev/null
  t0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  line=$(wrk -t2 -c"$CONNS" -d"${DURATION}s" -s "$WORK/post.lua" "https://127.0.0.1:$port/validate" | grep '^RESULT')
  t1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  rss=$(awk '/VmHWM/ {printf "%.1f", $2/1024}' "/proc/$pid/status")
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  read -r _ rps p99 <<<"$line"
  cpu=$(awk -v t="$((t1 - t0))" -v hz="$(getconf CLK_TCK)" -v r="$rps" -v d="$DURATION" \
    'BEGIN { printf "%.1f", (r > 0) ? t / hz * 1e6 / (r * d) : 0 }')
  printf '%-2s pad %3s  %8s req/s  p99 %6s ms  peak RSS %5s MiB  server CPU %6s us/req  %s\n' \
    "$i" "$pad" "$rps" "$p99" "$rss" "$cpu" "$bin"
  echo "$i $rps $p99 $rss $cpu" >> "$WORK/results"
}

echo "wrk -t2 -c$CONNS, ${DURATION}s per run, $ROUNDS rounds × paddings ($PADS), $(nproc) CPUs, $(date -u +%F)"
port=19640
for _ in $(seq "$ROUNDS"); do
  for pad in $PADS; do
    for i in "${!BINS[@]}"; do
      port=$((port + 1))
      run "$i" "${BINS[$i]}" "$pad" "$port"
    done
  done
done
echo "medians:"
for i in "${!BINS[@]}"; do
  awk -v want="$i" -v bin="${BINS[$i]}" '
    $1 == want { k++; rps[k] = $2; p99[k] = $3; rss[k] = $4; cpu[k] = $5 }
    function med(a, k,   i, j, t) {
      for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
      return (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
    }
    END {
      lo = hi = rps[1]; for (j = 1; j <= k; j++) { if (rps[j] < lo) lo = rps[j]; if (rps[j] > hi) hi = rps[j] }
      printf "%-2s %8.0f req/s (%d runs, %d–%d)  p99 %6.3f ms  peak RSS %5.1f MiB  server CPU %6.1f us/req  %s\n",
        want, med(rps, k), k, lo, hi, med(p99, k), med(rss, k), med(cpu, k), bin
    }' "$WORK/results"
done
