#!/usr/bin/env bash
# Load through a real kube-apiserver (Kyverno's published scaling rig, without k6): CLIENTS
# concurrent clients create and delete restricted-profile Pods for SECONDS (after a 2 s warm-up),
# each in its own namespace, in three configurations, one fresh control plane each
# (scripts/cluster.sh: etcd, kube-apiserver, kube-controller-manager, kwok):
#   baseline — no webhook (no Verno);
#   enforce  — Verno installed (`verno manifests --server-url`, `verno serve --kube`) with the 17
#              Pod Security policies of ../shared/bench/policies/pss-17 in Enforce;
#   audit    — the same policies in Audit, admission reports on;
#   floor    — (only with --modes) enforce's webhook registrations served by webhook-floor
#              (crates/floor: parse, answer allowed): what calling any webhook costs here.
# Prints one line per configuration (requests = creates in the window, latencies are the
# creates', errors = failed creates and deletes; Verno's peak RSS (VmHWM) and CPU seconds over the
# window); progress goes to stderr. More flags after the two numbers go to the binary, e.g.
# `--modes enforce` or `--verno PATH`.
#
#   bench/apiserver-load.sh [CLIENTS] [SECONDS] [apiserver-load flags…]   (defaults 100 and 30)
set -euo pipefail
cd "$(dirname "$0")/.."
CLIENTS=${1:-100}
SECONDS_=${2:-30}
shift $(($# < 2 ? $# : 2))
cargo build --release -p verno -p verno-e2e -p verno-floor >&2
# The pinned control plane, built once into .tools/bin (seconds when it is there).
bash scripts/install-control-plane.sh etcd kube-apiserver kube-controller-manager kwok >&2
[ -x .tools/bin/kubectl ] || bash scripts/install-kubectl.sh >&2
echo "apiserver-load: $CLIENTS clients, ${SECONDS_}s per configuration, $(nproc) CPUs, $(date -u +%F)" >&2
exec target/release/apiserver-load --clients "$CLIENTS" --seconds "$SECONDS_" "$@"
