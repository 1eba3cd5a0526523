#!/usr/bin/env bash
# `verno serve` against the HTTPS floor, side by side: the busybox AdmissionReview posted to
# /validate over TLS keep-alive (HTTP/1.1, as the kube-apiserver does) by wrk, against
#   floor  — crates/floor's webhook-floor: axum + rustls, parse to a Value, answer allowed;
#   empty  — verno serve with no policies;
#   pss17  — verno serve with the 17 Pod Security policies of Kyverno's load test;
#   cel17  — verno serve with our CEL versions of them (bench/cel-pss17.yaml, ValidatingPolicies),
#            the review posted to /vpol.
# They run in interleaved rounds (floor, empty, pss17, cel17, floor, …) so the machine's drift hits
# them alike; each run starts a fresh server, warms up 2 s, then measures. Prints every run,
# then per server the medians of req/s, p50, p99 and peak RSS (VmHWM), and the ratios to the floor.
#
#   bench/webhook.sh [--rounds 3] [--connections 64] [--threads 2] [--duration 10] [--shared ../shared]
#                    [--verno PATH]   (another verno binary, e.g. an older build to compare; not rebuilt)
#                    [--servers "floor empty pss17 cel17"]   (which to run; the floor is always run)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3
CONNS=64
THREADS=2
DURATION=10
SHARED=../shared
BIN=
SERVERS="floor empty pss17 cel17"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --connections) CONNS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --shared) SHARED=$2; shift 2 ;;
    --verno) BIN=$2; shift 2 ;;
    --servers) SERVERS="floor ${2//floor/}"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if ! command -v wrk >/dev/null; then
  echo "installing wrk (Debian package)" >&2
  apt-get install -y wrk >/dev/null
fi
if [ -z "$BIN" ]; then
  cargo build --release -p verno -p verno-floor >&2
  BIN=target/release/verno
else
  cargo build --release -p verno-floor >&2
fi
FLOOR=target/release/webhook-floor
BODY="$SHARED/bench/requests/pod-busybox-create.json"
PSS="$SHARED/bench/policies/pss-17"
[ -f "$BODY" ] && [ -d "$PSS" ] || { echo "need $BODY and $PSS" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
mkdir -p "$WORK/empty" "$WORK/cel17"
cp bench/cel-pss17.yaml "$WORK/cel17/"
. bench/post-lua.sh
post_lua "$BODY" > "$WORK/post.lua"
cat >> "$WORK/post.lua" <<'LUA'
done = function(summary, latency, requests)
  io.write(string.format("RESULT %.0f %.3f %.3f %d\n", summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.status + summary.errors.timeout))
end
LUA

run() { # name port
  local name=$1 port=$2 pid path=/validate
  case "$name" in
    floor) "$FLOOR" "127.0.0.1:$port" 2>"$WORK/$name.log" & pid=$! ;;
    empty) "$BIN" serve --policies "$WORK/empty" --addr "127.0.0.1:$port" --metrics-addr off --tls-dir "$WORK/tls" 2>"$WORK/$name.log" & pid=$! ;;
    pss17) "$BIN" serve --policies "$PSS" --addr "127.0.0.1:$port" --metrics-addr off --tls-dir "$WORK/tls" 2>"$WORK/$name.log" & pid=$! ;;
    cel17) "$BIN" serve --policies "$WORK/cel17" --addr "127.0.0.1:$port" --metrics-addr off --tls-dir "$WORK/tls" 2>"$WORK/$name.log" & pid=$!; path=/vpol ;;
    *) echo "unknown server $name" >&2; exit 2 ;;
  esac
  for _ in $(seq 100); do curl -sk "https://127.0.0.1:$port/health/readiness" >/dev/null 2>&1 && break; sleep 0.1; done
  wrk -t"$THREADS" -c"$CONNS" -d2s -s "$WORK/post.lua" "https://127.0.0.1:$port$path" >/dev/null
  local line rss t0 t1 cpu
  # The server's own CPU time (user + system ticks) over the measured run, per request.
  t0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  line=$(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --latency -s "$WORK/post.lua" "https://127.0.0.1:$port$path" | grep '^RESULT')
  t1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  rss=$(awk '/VmHWM/ {printf "%.1f", $2/1024}' "/proc/$pid/status")
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  read -r _ rps p50 p99 errs <<<"$line"
  cpu=$(awk -v t="$((t1 - t0))" -v hz="$(getconf CLK_TCK)" -v r="$rps" -v d="$DURATION" \
    'BEGIN { printf "%.1f", (r > 0) ? t / hz * 1e6 / (r * d) : 0 }')
  printf '%-6s %8s req/s  p50 %6s ms  p99 %6s ms  peak RSS %5s MiB  server CPU %6s us/req  errors %s\n' \
    "$name" "$rps" "$p50" "$p99" "$rss" "$cpu" "$errs"
  # The server moves a set whose evaluation once took long on the executor to the blocking pool.
  if grep -q "blocking pool from now on" "$WORK/$name.log"; then
    echo "  note: $name: an evaluation took long on the executor; the set went to the blocking pool"
  fi
  echo "$name $rps $p50 $p99 $rss $cpu" >> "$WORK/results"
}

echo "wrk -t$THREADS -c$CONNS, ${DURATION}s per run, $ROUNDS interleaved rounds, $(nproc) CPUs, $(date -u +%F)"
port=19440
for r in $(seq "$ROUNDS"); do
  for name in $SERVERS; do
    port=$((port + 1))
    run "$name" "$port"
  done
done
echo "medians:"
awk '
  { n[$1]++; rps[$1, n[$1]] = $2; p50[$1, n[$1]] = $3; p99[$1, n[$1]] = $4; rss[$1, n[$1]] = $5; cpu[$1, n[$1]] = $6 }
  function med(a, name, k,   i, j, t, v) {
    for (i = 1; i <= k; i++) v[i] = a[name, i]
    for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (v[j] + 0 < v[i] + 0) { t = v[i]; v[i] = v[j]; v[j] = t }
    return (k % 2) ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
  }
  END {
    f = med(rps, "floor", n["floor"])
    m = split(servers, names, " ")
    for (x = 1; x <= m; x++) {
      s = names[x]; k = n[s]
      r = med(rps, s, k)
      printf "%-6s %8.0f req/s  %.2f of the floor  p50 %6.3f ms  p99 %6.3f ms  peak RSS %5.1f MiB  server CPU %6.1f us/req\n", s, r, r / f, med(p50, s, k), med(p99, s, k), med(rss, s, k), med(cpu, s, k)
    }
  }' servers="$SERVERS" "$WORK/results"
