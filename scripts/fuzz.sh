#!/usr/bin/env bash
# Runs every fuzz target (or the ones named) for SECONDS each over its checked-in corpus in
# fuzz/corpus/<target>; new inputs go to $FUZZ_WORK/<target> (default: a temporary folder), so
# the checked-in corpora change only when someone minimizes into them (`cargo +nightly fuzz cmin`).
# A crash, a timeout (an input running over 10 s) or an input using over 2 GiB fails the run and
# leaves the input in fuzz/artifacts/<target>/.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     (CI runs `scripts/fuzz.sh 15`)
#
# Needs the nightly toolchain (libFuzzer's instrumentation) and installs cargo-fuzz, pinned, if
# it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
shift || true
if ! rustup toolchain list | grep -q '^nightly'; then
    echo "fuzz: SKIPPED: no nightly toolchain on this machine (rustup toolchain install nightly)" >&2
    exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --version 0.13.2 --locked
fi
cd fuzz
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
work=${FUZZ_WORK:-$(mktemp -d)}
cargo +nightly fuzz build -O
for t in "${targets[@]}"; do
    mkdir -p "$work/$t"
    echo "fuzz: $t for ${secs}s"
    # libFuzzer's output goes to a file and its exit status is kept as such: read through a
    # pipe with `|| true`, the status was that of `true` and a failing target passed.
    status=0
    cargo +nightly fuzz run -O "$t" "$work/$t" "corpus/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
        >"$work/$t.log" 2>&1 || status=$?
    # grep hides libFuzzer's chatter.
    grep -E '^(#[0-9]+.*(DONE|pulse)|stat::|==[0-9]+==|SUMMARY|artifact|Done|INFO: (Loaded|seed))' "$work/$t.log" || true
    [ "$status" -eq 0 ] || { echo "fuzz: $t FAILED (input in fuzz/artifacts/$t/)" >&2; exit 1; }
done
echo "fuzz: ${#targets[@]} targets ran ${secs}s each, clean"
