#!/usr/bin/env bash
# Kyverno as the oracle (issue 50): generated ClusterPolicies and resources through Kyverno's
# own CLI and through `verno apply`, policy reports compared result by result.
#
#   bench/differential.sh [N] [SEED]     (default 1000 cases, seed 1; a case is one policy on
#                                         one resource; 10000 is the full run; as many
#                                         generated JMESPath expressions through both
#                                         programs' `jp query` again)
#
# Builds the oracle if missing (scripts/install-kyverno-oracle.sh: Kyverno v1.19.1's
# kubectl-kyverno from the Go module proxy, 10-20 minutes the first time) and Verno's release
# build, then runs crates/differential. Every disagreeing pair is printed; the first of each
# kind is shrunk into a reproducer under target/differential/. A `jp:` line gives the JMESPath
# part's figures; the last line, over both, is
# `differential: cases=N agree=A disagree=D intended=I`; the exit status is 1 when D > 0.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000}
SEED=${2:-1}
bash scripts/install-kyverno-oracle.sh >&2
cargo build --release --locked -p verno -p verno-differential >&2
rm -rf target/differential
exec target/release/differential --cases "$N" --jp "$N" --seed "$SEED" \
  --kyverno .tools/bin/kubectl-kyverno --verno target/release/verno --out target/differential
