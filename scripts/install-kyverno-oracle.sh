#!/usr/bin/env bash
# Builds the Kyverno oracle into .tools/bin: Kyverno v1.19.1's CLI (kubectl-kyverno) and, with
# --controller, its admission controller (kyverno), from the Go module proxy with plain
# `go build` (tools/kyverno-oracle pins Kyverno's own dependency graph and repeats its one
# replace). Cached by version like the control plane (scripts/install-control-plane.sh does
# the build): a second run takes well under a second.
#
# A test tool only: the differential tests (bench/differential.sh, crates/differential) use it
# when present and skip with a message when not; Verno never links, ships or needs it, and
# neither of the README's two commands depends on it.
#
# Usage: scripts/install-kyverno-oracle.sh [--controller]
# A first build downloads about 1 GB of modules and compiles for 10-20 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
tools=(kubectl-kyverno)
for a in "$@"; do
  case "$a" in
    --controller) tools+=(kyverno) ;;
    *) echo "usage: scripts/install-kyverno-oracle.sh [--controller]" >&2; exit 2 ;;
  esac
done
exec bash scripts/install-control-plane.sh "${tools[@]}"
