#!/usr/bin/env bash
# Reliability load tests of `verno serve` (issue 14), loopback only, every phase bounded in time.
# The server runs with the bundled policies (policies/) and answers a large Pod (bench/heavy_pod.py,
# ~170 KB) on /validate/fail (failure policy Fail: what is not evaluated is refused).
#
#   bench/reliability.sh overload    [--duration 60]   2x capacity, open loop (h2load --rps)
#   bench/reliability.sh soak        [--duration 1800] half capacity
#   bench/reliability.sh connections [--duration 60]   20 000 idle TCP connections
#   options: --bin PATH (default: build target/release/verno), --port P (default 19443)
#
# Capacity is measured first in every mode: closed loop, 16 requests in flight (well under the
# shedding threshold), 10 s. Each mode prints its figures and PASS or FAIL per criterion, and
# exits 1 on any FAIL:
#   overload:    health probes (every 0.25 s) answer within 1 s; every answer is a 200 within the
#                deadline (8 s) plus 1 s; RSS 30 s after the load is within 20 % of before.
#   soak:        RSS at the end is within 5 % of RSS after a 5-minute warm-up at the same load
#                (RSS is printed every minute, so a slow climb shows).
#   connections: health probes (every 0.5 s) answer within 1 s while 20 000 connections are
#                held open (two client processes of 10 000: the file limit here is 20 000).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-}
shift || true
DURATION=""
BIN=""
PORT=19443
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) DURATION=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$MODE" in
  overload|connections) DURATION=${DURATION:-60} ;;
  soak) DURATION=${DURATION:-1800} ;;
  *) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
for tool in h2load curl python3; do
  if ! command -v "$tool" >/dev/null; then
    echo "installing nghttp2-client (h2load) and curl (Debian packages)" >&2
    apt-get install -y nghttp2-client curl >/dev/null
    break
  fi
done
if [ -z "$BIN" ]; then
  cargo build --release -p verno >&2
  BIN=target/release/verno
fi
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
python3 bench/heavy_pod.py > "$WORK/heavy.json"
URL="https://127.0.0.1:$PORT"
FAILED=0
verdict() { # ok? text
  if [ "$1" = 1 ]; then echo "PASS  $2"; else echo "FAIL  $2"; FAILED=1; fi
}
rss_mib() { awk '/VmRSS/ {printf "%.1f", $2/1024}' "/proc/$PID/status"; }

"$BIN" serve --policies policies --addr "127.0.0.1:$PORT" --metrics-addr off --tls-dir "$WORK/tls" \
  2>"$WORK/serve.log" &
PID=$!
for _ in $(seq 100); do curl -sk "$URL/health/readiness" >/dev/null 2>&1 && break; sleep 0.1; done
load() { # extra h2load arguments...
  h2load -d "$WORK/heavy.json" -H 'Content-Type: application/json' "$@" "$URL/validate/fail" 2>&1
}
capacity=$(load -c 4 -m 4 -D 10 | awk '/^finished in/ {printf "%d", $4}')
echo "verno serve ($BIN), bundled policies, heavy Pod $(wc -c < "$WORK/heavy.json") bytes, $(nproc) CPUs, $(date -u +%F)"
echo "capacity: $capacity req/s (closed loop, 16 in flight, 10 s)"

# Probes /health/liveness every $1 s into $2 (one "code seconds" line each) until killed.
probe() {
  while true; do
    curl -sk -m 5 -o /dev/null -w '%{http_code} %{time_total}\n' "$URL/health/liveness" >> "$2" || echo "000 5" >> "$2"
    sleep "$1"
  done
}
# Health verdict from a probe file.
health() {
  local n worst bad
  n=$(wc -l < "$1")
  worst=$(awk 'BEGIN {m = 0} {if ($2 > m) m = $2} END {printf "%.3f", m}' "$1")
  bad=$(awk '$1 != 200 || $2 >= 1 {b++} END {print b + 0}' "$1")
  verdict "$([ "$bad" = 0 ] && [ "$n" -gt 0 ] && echo 1 || echo 0)" \
    "health: $n probes, slowest $worst s, $bad failed or over 1 s"
}

case "$MODE" in
overload)
  sleep 5
  before=$(rss_mib)
  rate=$((capacity * 2))
  clients=16
  : > "$WORK/probe"
  probe 0.25 "$WORK/probe" &
  PROBE=$!
  ( while true; do rss_mib; echo; sleep 1; done ) > "$WORK/rss" &
  SAMPLER=$!
  out=$(load -c "$clients" -m 64 --rps $((rate / clients)) -D "$DURATION" --log-file="$WORK/requests")
  kill "$PROBE" "$SAMPLER" 2>/dev/null || true
  peak=$(sort -n "$WORK/rss" | tail -1)
  echo "offered: $rate req/s for $DURATION s (h2load, $clients connections, open loop)"
  echo "$out" | grep -E '^(finished in|requests:|status codes:)' | sed 's/^/  /'
  total=$(wc -l < "$WORK/requests")
  slowest=$(awk 'BEGIN {m = 0} {if ($3 > m) m = $3} END {printf "%.3f", m / 1e6}' "$WORK/requests")
  non200=$(awk '$2 != 200 {b++} END {print b + 0}' "$WORK/requests")
  late=$(awk '$3 > 9e6 {b++} END {print b + 0}' "$WORK/requests")
  verdict "$([ "$non200" = 0 ] && [ "$late" = 0 ] && [ "$total" -gt 0 ] && echo 1 || echo 0)" \
    "answers: $total, slowest $slowest s, $non200 not 200, $late over the deadline + 1 s"
  health "$WORK/probe"
  sleep 30
  after=$(rss_mib)
  verdict "$(awk -v a="$after" -v b="$before" 'BEGIN {print (a <= b * 1.2) ? 1 : 0}')" \
    "RSS: before $before MiB, peak $peak MiB, 30 s after $after MiB (limit +20 %)"
  ;;
soak)
  rate=$((capacity / 2))
  clients=8
  warm=$((DURATION < 600 ? DURATION / 6 : 300))
  ( while true; do sleep 60; rss_mib; echo; done ) > "$WORK/rss" &
  SAMPLER=$!
  load -c "$clients" -m 16 --rps $((rate / clients)) -D "$warm" > /dev/null
  first=$(rss_mib)
  out=$(load -c "$clients" -m 16 --rps $((rate / clients)) -D "$((DURATION - warm))")
  last=$(rss_mib)
  kill "$SAMPLER" 2>/dev/null || true
  echo "offered: $rate req/s for $DURATION s (h2load, $clients connections, open loop)"
  echo "$out" | grep -E '^(finished in|requests:|status codes:)' | sed 's/^/  /'
  echo "RSS per minute (MiB): $(tr '\n' ' ' < "$WORK/rss")"
  verdict "$(awk -v a="$last" -v b="$first" 'BEGIN {print (a <= b * 1.05) ? 1 : 0}')" \
    "RSS: after the $warm s warm-up $first MiB, at the end $last MiB (limit +5 %)"
  ;;
connections)
  cat > "$WORK/hold.py" <<'PY'
import socket, sys, time
n, port, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
socks, failed, opened, peak, deadline = [], 0, 0, 0, time.time() + secs
# Holds n connections open, opening a new one for each the server closes, until the end.
while time.time() < deadline:
    while len(socks) < n and time.time() < deadline:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.setblocking(False)
            socks.append(s)
            opened += 1
            peak = max(peak, len(socks))
        except OSError:
            failed += 1
            time.sleep(0.01)
    alive = []
    for s in socks:
        try:
            if s.recv(1) == b"":
                s.close()
                continue
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            continue
        alive.append(s)
    socks = alive
    time.sleep(0.5)
print(f"opened {opened}, at most {peak} at once, {failed} connects failed", flush=True)
PY
  : > "$WORK/probe"
  python3 "$WORK/hold.py" 10000 "$PORT" "$DURATION" > "$WORK/hold1" &
  H1=$!
  python3 "$WORK/hold.py" 10000 "$PORT" "$DURATION" > "$WORK/hold2" &
  H2=$!
  sleep 2
  probe 0.5 "$WORK/probe" &
  PROBE=$!
  peak_fds=0
  while kill -0 "$H1" 2>/dev/null || kill -0 "$H2" 2>/dev/null; do
    fds=$(ls "/proc/$PID/fd" | wc -l)
    [ "$fds" -gt "$peak_fds" ] && peak_fds=$fds
    sleep 1
  done
  kill "$PROBE" 2>/dev/null || true
  echo "idle connections for $DURATION s, two clients: $(cat "$WORK/hold1"); $(cat "$WORK/hold2")"
  echo "server: peak $peak_fds open descriptors, RSS $(rss_mib) MiB"
  health "$WORK/probe"
  ;;
esac
kill -TERM "$PID"
wait "$PID" 2>/dev/null || true
exit "$FAILED"
