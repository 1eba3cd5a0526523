#!/usr/bin/env bash
# The `verno` binary to serve webhooks with: the release build with its code laid out by BOLT
# (LLVM's post-link optimizer) from a profile of its own webhook requests. Same source, same
# answers; the code a request runs is packed together (hot paths first, each function's rare
# blocks moved out of the way), so a request misses the instruction cache a third less often.
# Measured side by side on the 2-core bench machine: 24–37 % more requests a second with the 17
# Pod Security policies (docs/benchmarks.md, seventeenth pass).
#
#   scripts/build-optimized.sh [--out target/optimized/verno] [--seconds 4]
#
# Steps: (1) `cargo rustc --profile bolt` — the release profile with the symbol table kept and
# the relocations emitted (BOLT needs both to move functions), and the code no webhook request
# runs built for size (Cargo.toml); (2) an instrumented copy made by `llvm-bolt -instrument`;
# (3) that copy starts and serves our own training load (bench/train: Kyverno policies with
# patterns, anchors, anyPattern, foreach/deny with JMESPath, a mutation; our CEL policies; a
# podSecurity rule; three requests to the validate, CEL and mutate webhooks) under `wrk` for
# --seconds each; (4) `llvm-bolt` lays out every function from that profile (`-lite=0`), in the
# old text's place (`-use-old-text`): the request path packed first, each function's rare blocks
# split off, start-up code packed together after it, code that never ran last — so a running
# server maps ~10 MiB of its text instead of ~17 (docs/benchmarks.md, eighteenth pass); then
# `strip`. Prints the binary's path and size.
#
# Needs llvm-bolt (Debian: `bolt-19`) and wrk; both are installed with apt-get when missing.
# The plain `cargo install --locked --path crates/verno` stays the way to install the CLI.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=target/optimized/verno
SECS=4
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --seconds) SECS=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

find_bolt() {
  command -v llvm-bolt 2>/dev/null && return
  ls /usr/lib/llvm-*/bin/llvm-bolt 2>/dev/null | sort -V | tail -n 1
}
BOLT=$(find_bolt || true)
if [ -z "$BOLT" ]; then
  echo "installing llvm-bolt (Debian package bolt-19)" >&2
  apt-get install -y bolt-19 >/dev/null
  BOLT=$(find_bolt)
fi
if ! command -v wrk >/dev/null; then
  echo "installing wrk (Debian package)" >&2
  apt-get install -y wrk >/dev/null
fi
for tool in curl strip; do
  command -v "$tool" >/dev/null || { echo "need $tool" >&2; exit 2; }
done

# (1) The base: relocations kept; identical functions folded by the linker (lld's ICF; it saves
# ~180 KB, which keeps the optimized binary under 30 MB).
cargo rustc --locked --profile bolt -p verno --bin verno -- \
  -C link-arg=-Wl,--emit-relocs -C link-arg=-Wl,--icf=all >&2
BASE=target/bolt/verno

WORK=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# (2) The instrumented copy writes its profile when it exits.
"$BOLT" "$BASE" -instrument -o "$WORK/verno.inst" --instrumentation-file="$WORK/profile.fdata" \
  >"$WORK/instrument.log" 2>&1 || { cat "$WORK/instrument.log" >&2; exit 1; }

# (3) The training load.
mkdir -p "$WORK/policies"
cp bench/train/policies.yaml bench/cel-pss17.yaml policies/pod-security-restricted.yaml "$WORK/policies/"
. bench/post-lua.sh
port=$((20000 + RANDOM % 20000))
"$WORK/verno.inst" serve --policies "$WORK/policies" --addr "127.0.0.1:$port" --metrics-addr off \
  --tls-dir "$WORK/tls" 2>"$WORK/serve.log" &
pid=$!
for _ in $(seq 300); do
  curl -sk "https://127.0.0.1:$port/health/readiness" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sk "https://127.0.0.1:$port/health/readiness" >/dev/null || { cat "$WORK/serve.log" >&2; exit 1; }
requests=0
for path in /validate /vpol /mutate; do
  for body in bench/train/pod-plain.json bench/train/pod-hardened.json bench/train/deployment.json; do
    post_lua "$body" > "$WORK/post.lua"
    cat >> "$WORK/post.lua" <<'LUA'
done = function(summary, latency, requests)
  io.write(string.format("TRAINED %d %d\n", summary.requests,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.status + summary.errors.timeout))
end
LUA
    line=$(wrk -t2 -c32 -d"${SECS}s" -s "$WORK/post.lua" "https://127.0.0.1:$port$path" | grep '^TRAINED' || true)
    read -r _ n errs <<<"${line:-TRAINED 0 none}"
    [ "$errs" = 0 ] && [ "$n" -gt 0 ] || { echo "training: no answers ($errs errors) on $path with $body" >&2; exit 1; }
    requests=$((requests + n))
  done
done
kill -TERM "$pid"
wait "$pid" || true
pid=
[ -s "$WORK/profile.fdata" ] || { echo "the instrumented server wrote no profile" >&2; exit 1; }

# (4) Lay out the code; regular pages (BOLT's default 2 MiB alignment would pad the file by ~1 MB).
mkdir -p "$(dirname "$OUT")"
"$BOLT" "$BASE" -o "$WORK/verno.bolt" -data="$WORK/profile.fdata" -lite=0 -use-old-text \
  -reorder-blocks=ext-tsp -reorder-functions=cdsort -split-functions -split-all-cold -split-eh \
  -icf=1 -use-gnu-stack -no-huge-pages >"$WORK/optimize.log" 2>&1 || { cat "$WORK/optimize.log" >&2; exit 1; }
strip --strip-all -o "$OUT" "$WORK/verno.bolt"
"$OUT" --version >/dev/null
echo "trained on $requests requests" >&2
grep -E "have non-empty execution profile|splitting separates" "$WORK/optimize.log" >&2 || true
echo "$OUT $(stat -c %s "$OUT") bytes"
