#!/usr/bin/env bash
# Instructions per request of `verno serve` in place: the whole request (TLS, HTTP, parse, the
# engine, metrics, the answer), counted by callgrind while one `wrk` connection posts the busybox
# AdmissionReview. Unlike `bench/webhook.sh` (req/s on a shared 2-core machine, ±15 % from one
# run to the next) the count repeats to a fraction of a percent, so a change of 1–2 % shows.
# It says nothing about cache misses unless asked (`--cache`: callgrind's simulated L1 caches,
# which is where the engine's time in place goes — see docs/benchmarks.md, thirteenth pass).
#
#   bench/serve-callgrind.sh [--verno PATH] [--policies DIR] [--seconds 20] [--cache]
#                            [--floor] [--out FILE] [--shared ../shared]
#
# --verno: the binary to count (default: `cargo build --profile profiling -p verno`, which keeps
# symbols so `callgrind_annotate FILE` names the functions; a release binary counts the same).
# --floor: count crates/floor's webhook-floor instead. Prints requests, instructions and
# instructions per request (and with --cache the L1 misses per request).
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=../shared
BIN=
POL=
SECONDS_=20
CACHE=
FLOOR=
OUT=
while [ $# -gt 0 ]; do
  case "$1" in
    --verno) BIN=$2; shift 2 ;;
    --policies) POL=$2; shift 2 ;;
    --seconds) SECONDS_=$2; shift 2 ;;
    --cache) CACHE=--cache-sim=yes; shift ;;
    --floor) FLOOR=1; shift ;;
    --out) OUT=$2; shift 2 ;;
    --shared) SHARED=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
for tool in wrk valgrind; do
  if ! command -v "$tool" >/dev/null; then
    echo "installing $tool (Debian package)" >&2
    apt-get install -y "$tool" >/dev/null
  fi
done
POL=${POL:-$SHARED/bench/policies/pss-17}
BODY="$SHARED/bench/requests/pod-busybox-create.json"
[ -f "$BODY" ] && [ -d "$POL" ] || { echo "need $BODY and $POL" >&2; exit 2; }
if [ -n "$FLOOR" ]; then
  cargo build --release -p verno-floor >&2
  BIN=target/release/webhook-floor
elif [ -z "$BIN" ]; then
  cargo build --profile profiling -p verno >&2
  BIN=target/profiling/verno
fi
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
OUT=${OUT:-$WORK/callgrind.out}
# A copy of the policies: touched below to make the server load them again (see the warm-up).
cp -r "$POL" "$WORK/policies"
. bench/post-lua.sh
post_lua "$BODY" > "$WORK/post.lua"
PORT=19490
if [ -n "$FLOOR" ]; then
  valgrind --tool=callgrind $CACHE --callgrind-out-file="$OUT" "$BIN" "127.0.0.1:$PORT" 2>"$WORK/server.log" &
else
  valgrind --tool=callgrind $CACHE --callgrind-out-file="$OUT" "$BIN" serve --policies "$WORK/policies" \
    --addr "127.0.0.1:$PORT" --metrics-addr off --tls-dir "$WORK/tls" 2>"$WORK/server.log" &
fi
VP=$!
for _ in $(seq 600); do curl -sk "https://127.0.0.1:$PORT/health/readiness" >/dev/null 2>&1 && break; sleep 0.1; done
post() { wrk -t1 -c1 -d"$1"s -s "$WORK/post.lua" "https://127.0.0.1:$PORT/validate"; }
post 5 >/dev/null
if [ -z "$FLOOR" ]; then
  # Under valgrind the first (cold) evaluations take longer than the server allows on the
  # executor, and it sends that set's requests to the blocking pool from then on. A reload
  # brings a new set, evaluated on the executor again, as it is without valgrind.
  touch "$WORK"/policies/*
  sleep 6  # the server polls its policy files every 2 s
  post 3 >/dev/null
fi
callgrind_control -z "$VP" >/dev/null 2>&1
N=$(post "$SECONDS_" | awk '/requests in/ {print $1}')
callgrind_control -d "$VP" >/dev/null 2>&1
kill "$VP"; wait "$VP" 2>/dev/null || true
# Once for the first set is expected (see above); again means the reloaded set went too.
if [ -z "$FLOOR" ] && [ "$(grep -c "blocking pool from now on" "$WORK/server.log")" -gt 1 ]; then
  echo "note: the set went to the blocking pool after the reload; the count includes the hand-off" >&2
fi
# The dump triggered above is the largest file (the one written at exit holds the few
# instructions after it).
F=$(ls -S "$OUT"* | head -1)
callgrind_annotate "$F" 2>/dev/null | awk -v n="$N" -v f="$F" '
  /^Events recorded:/ { for (i = 3; i <= NF; i++) ev[i - 2] = $i; ne = NF - 2 }
  /PROGRAM TOTALS/ {
    line = $0; gsub(/\([^)]*\)/, "", line); gsub(/,/, "", line); split(line, v, " ")
    printf "requests %d\n", n
    for (i = 1; i <= ne; i++) printf "%-5s %14.0f  per request %10.0f\n", ev[i], v[i], v[i] / n
    printf "callgrind output: %s\n", f
  }'
