#!/usr/bin/env bash
# Installs what the image verification tests need: Debian's `docker-registry` (the CNCF
# distribution registry, run on a loopback port by the tests) and `skopeo` (pushes the test
# images into it). Does nothing when both are on PATH. Needs apt (Debian/Ubuntu) and root or
# sudo; the tests say so when they cannot find the tools.
set -euo pipefail
if command -v docker-registry >/dev/null && command -v skopeo >/dev/null; then
    exit 0
fi
# Tests run in parallel and may all ask at once: one installs, the others wait and find it done.
if command -v flock >/dev/null; then
    exec 9>"${TMPDIR:-/tmp}/verno-install-registry.lock"
    flock 9
    if command -v docker-registry >/dev/null && command -v skopeo >/dev/null; then
        exit 0
    fi
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "install-registry.sh: run as root or install sudo" >&2; exit 1; }
    sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
# `apt-get update` only when the package lists do not know the packages yet.
if ! apt-cache show docker-registry >/dev/null 2>&1 || ! apt-cache show skopeo >/dev/null 2>&1; then
    $sudo apt-get update -qq
fi
$sudo apt-get install -y -qq --no-install-recommends docker-registry skopeo >/dev/null
command -v docker-registry >/dev/null && command -v skopeo >/dev/null
