#!/usr/bin/env bash
# Builds a pinned, real Kubernetes control plane and its test tools into .tools/bin, from the Go
# module proxy with plain `go build` (no release download can be reached from here):
#
#   etcd                     go.etcd.io/etcd/server/v3             v3.6.16  (tools/etcd)
#   kube-apiserver           k8s.io/kubernetes/cmd/kube-apiserver  v1.35.4  (tools/control-plane)
#   kube-controller-manager  k8s.io/kubernetes/cmd/kube-controller-manager
#   chainsaw                 github.com/kyverno/chainsaw           v0.2.12  (tools/chainsaw)
#   kwok                     sigs.k8s.io/kwok/cmd/kwok             v0.8.0   (tools/kwok)
#
# and, only when named (the Kyverno oracle, scripts/install-kyverno-oracle.sh; test tools that
# Verno never links, ships or needs):
#   kubectl-kyverno          github.com/kyverno/kyverno/cmd/cli/kubectl-kyverno  v1.19.1
#   kyverno                  github.com/kyverno/kyverno/cmd/kyverno  (tools/kyverno-oracle)
#
# Each tool is built from a small module of ours under tools/ whose committed go.mod/go.sum pin
# the exact dependency graph (each selects exactly the versions of the tool's own release; the
# kube one replaces k8s.io/kubernetes's ./staging/src/k8s.io/* folders with the published
# k8s.io/* v0.35.4 modules). Builds use CGO_ENABLED=0, -trimpath, -ldflags=-s -w, nice -n 10.
#
# Also writes .tools/share/kwok/stages.yaml, the stages kwok needs when run on its own.
#
# Usage: scripts/install-control-plane.sh [TOOL...]   (default: all of the above)
# A tool is rebuilt only when its stamp (.tools/bin/.TOOL.version: the pinned version and a hash
# of its module files, build flags and Go version) changes or its binary is missing, so a second
# run takes well under a second. A first run on a fresh machine downloads the modules (2.4 GB of
# module cache, plus about 5 GB of Go build cache) and compiles for about 15 minutes on 2 busy
# cores (kube-apiserver alone about 5). The binaries come out bit-identical from run to run.
# Needs Go >= 1.26 (etcd v3.6.16's go.mod says go 1.26.0); no GOTOOLCHAIN switch is needed.
# Any failure exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=$ROOT/.tools/bin

ETCD_VERSION=v3.6.16
KUBE_VERSION=v1.35.4
# The commit time of the v1.35.4 tag, as the module proxy reports it (`go list -m -json`): the
# binaries' buildDate, so that builds are reproducible.
KUBE_BUILD_DATE=2026-04-15T18:01:22Z
CHAINSAW_VERSION=v0.2.12
KWOK_VERSION=v0.8.0
KYVERNO_VERSION=v1.19.1
ALL_TOOLS=(etcd kube-apiserver kube-controller-manager chainsaw kwok)
ORACLE_TOOLS=(kubectl-kyverno kyverno)

export CGO_ENABLED=0
# Only what these builds need; -mod is given on each command line.
export GOFLAGS=-buildvcs=false
unset GOOS GOARCH 2>/dev/null || true

go_minor=$(go env GOVERSION | sed -n 's/^go1\.\([0-9]*\).*/\1/p')
if [ -z "$go_minor" ] || [ "$go_minor" -lt 26 ]; then
  echo "install-control-plane: needs Go >= 1.26, found $(go env GOVERSION)" >&2
  exit 1
fi

# Binaries are also kept outside the clone, by stamp, so that a fresh clone on the same
# machine (CI) copies them instead of building again.
CACHE=${VERNO_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/verno-tools}
BUILT=0
mkdir -p "$BIN"
# Several callers may install at once: one at a time, and the others find it done.
exec 9>"$ROOT/.tools/install-control-plane.lock"
flock 9

kube_ldflags() {
  local major minor pkg out="-s -w"
  major=${KUBE_VERSION#v}; major=${major%%.*}
  minor=${KUBE_VERSION#v*.}; minor=${minor%%.*}
  # As Kubernetes' hack/lib/version.sh, for a source archive (no git commit known).
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    out+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    out+=" -X $pkg.gitTreeState=archive -X $pkg.gitCommit= -X $pkg.buildDate=$KUBE_BUILD_DATE"
  done
  echo "$out"
}

# stamp VERSION MODULE_DIR RECIPE: what .TOOL.version holds once TOOL is built: the pinned
# version, then a hash of the module's go.mod, go.sum and *.in files, of the build's package,
# flags and tags, and of the Go version.
stamp() {
  local files=("$2"/go.mod "$2"/go.sum) f
  for f in "$2"/*.in; do [ -e "$f" ] && files+=("$f"); done
  echo "$1 $({ cat "${files[@]}"; echo "$3"; go env GOVERSION; } | sha256sum | cut -c1-16)"
}

# build NAME VERSION MODULE_DIR PACKAGE LDFLAGS [TAGS [PREPARE]]
# PREPARE: a function that prints a vendored copy of MODULE_DIR to build in (-mod=vendor)
# instead of MODULE_DIR itself (-mod=readonly: the committed go.mod/go.sum as they are).
build() {
  local name=$1 version=$2 dir=$3 pkg=$4 ldflags=$5 tags=${6:-} prepare=${7:-}
  local dest=$BIN/$name want build_dir=$3 mod=readonly start
  want=$(stamp "$version" "$dir" "$pkg|$ldflags|$tags")
  local cached=$CACHE/$name-$(echo "$want" | tr ' ' '-')
  if [ -x "$dest" ] && [ -f "$BIN/.$name.version" ] && [ "$(cat "$BIN/.$name.version")" = "$want" ]; then
    [ -x "$cached" ] || { mkdir -p "$CACHE" && cp -f "$dest" "$cached.tmp" && mv -f "$cached.tmp" "$cached"; }
    return 0
  fi
  # Built before on this machine (another clone, an earlier CI run): copied from the cache.
  if [ -x "$cached" ]; then
    cp -f "$cached" "$dest.tmp" && mv -f "$dest.tmp" "$dest"
    echo "$want" >"$BIN/.$name.version"
    echo "install-control-plane: $name $version from $CACHE" >&2
    return 0
  fi
  echo "install-control-plane: building $name $version ($pkg) ..." >&2
  start=$SECONDS
  rm -f "$BIN/.$name.version"
  if [ -n "$prepare" ]; then build_dir=$("$prepare"); mod=vendor; fi
  (cd "$build_dir" && nice -n 10 go build -mod=$mod -trimpath \
      ${tags:+-tags="$tags"} -ldflags="$ldflags" -o "$dest.tmp" "$pkg")
  mv -f "$dest.tmp" "$dest"
  echo "$want" >"$BIN/.$name.version"
  BUILT=1
  mkdir -p "$CACHE" && cp -f "$dest" "$cached.tmp" && mv -f "$cached.tmp" "$cached"
  [ -z "$prepare" ] || { rm -rf "$build_dir"; rmdir "$ROOT/.tools/build" 2>/dev/null || true; }
  echo "install-control-plane: built $name in $((SECONDS - start))s ($(du -h "$dest" | cut -f1))" >&2
}

# chainsaw v0.2.12 predates Go 1.26's testing.MainStart: one method is added to one of its
# packages (tools/chainsaw/module_path.go.in says why). The module cache is read-only (and
# go build -overlay refuses files in it), so chainsaw is built in a vendored copy of
# tools/chainsaw (go mod vendor checks every module against go.sum) with that file added.
prepare_chainsaw() {
  local work=$ROOT/.tools/build/chainsaw
  rm -rf "$work"; mkdir -p "$work"
  cp tools/chainsaw/go.mod tools/chainsaw/go.sum tools/chainsaw/tools.go "$work/"
  (cd "$work" && go mod vendor) >&2
  cp tools/chainsaw/module_path.go.in \
    "$work/vendor/github.com/kyverno/chainsaw/pkg/runner/internal/zz_module_path.go"
  echo "$work"
}

# kwok run on its own (not by kwokctl) has no stages: it exits with "no stages found" unless
# given some (--config FILE). Writes the ones kwokctl uses by default, from the same kwok
# release: node-initialize, node-heartbeat-with-lease (run kwok with
# --node-lease-duration-seconds=40) and pod-ready/-complete/-delete.
kwok_stages() {
  local out=$1 dir f sep=""
  mkdir -p "$(dirname "$out")"
  : >"$out.tmp"
  for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
      pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
    dir=$(cd tools/kwok && go list -mod=readonly -f '{{.Dir}}' "sigs.k8s.io/kwok/kustomize/stage/${f%/*}")
    { printf '%s' "$sep"; cat "$dir/${f##*/}.yaml"; } >>"$out.tmp"
    sep=$'---\n'
  done
  mv -f "$out.tmp" "$out"
}

install_tool() {
  case "$1" in
    etcd)
      build etcd "$ETCD_VERSION" tools/etcd go.etcd.io/etcd/server/v3 "-s -w" ;;
    kube-apiserver|kube-controller-manager)
      # Upstream's release tags (hack/lib/golang.sh).
      build "$1" "$KUBE_VERSION" tools/control-plane "k8s.io/kubernetes/cmd/$1" \
        "$(kube_ldflags)" selinux,notest,grpcnotrace ;;
    chainsaw)
      build chainsaw "$CHAINSAW_VERSION" tools/chainsaw github.com/kyverno/chainsaw \
        "-s -w -X github.com/kyverno/chainsaw/pkg/version.BuildVersion=$CHAINSAW_VERSION" \
        "" prepare_chainsaw ;;
    kwok)
      build kwok "$KWOK_VERSION" tools/kwok sigs.k8s.io/kwok/cmd/kwok \
        "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v} -X sigs.k8s.io/kwok/pkg/consts.PreRelease=GA"
      local stages=$ROOT/.tools/share/kwok/stages.yaml cached_stages=$CACHE/kwok-stages-$KWOK_VERSION.yaml
      if ! { [ -f "$stages" ] && [ "$stages" -nt "$BIN/.kwok.version" ]; }; then
        if [ -f "$cached_stages" ]; then
          mkdir -p "$(dirname "$stages")" && cp -f "$cached_stages" "$stages"
        else
          kwok_stages "$stages"
          mkdir -p "$CACHE" && cp -f "$stages" "$cached_stages"
        fi
      fi ;;
    kubectl-kyverno)
      build kubectl-kyverno "$KYVERNO_VERSION" tools/kyverno-oracle \
        github.com/kyverno/kyverno/cmd/cli/kubectl-kyverno \
        "-s -w -X github.com/kyverno/kyverno/pkg/version.BuildVersion=$KYVERNO_VERSION" ;;
    kyverno)
      build kyverno "$KYVERNO_VERSION" tools/kyverno-oracle github.com/kyverno/kyverno/cmd/kyverno \
        "-s -w -X github.com/kyverno/kyverno/pkg/version.BuildVersion=$KYVERNO_VERSION" ;;
    *)
      echo "install-control-plane: unknown tool '$1' (known: ${ALL_TOOLS[*]} ${ORACLE_TOOLS[*]})" >&2
      exit 2 ;;
  esac
}

report() {
  case "$1" in
    etcd) "$BIN/etcd" --version | sed -n 1p ;;
    kube-apiserver|kube-controller-manager) echo "$1: $("$BIN/$1" --version)" ;;
    chainsaw) echo "chainsaw: $("$BIN/chainsaw" version | sed -n 1p)" ;;
    kwok) echo "kwok: $("$BIN/kwok" --version | sed -n 1p) (stages: .tools/share/kwok/stages.yaml)" ;;
    kubectl-kyverno) echo "kubectl-kyverno: $("$BIN/kubectl-kyverno" version 2>/dev/null | sed -n 1p)" ;;
    kyverno) echo "kyverno: $KYVERNO_VERSION (admission controller, cmd/kyverno)" ;;
  esac
}

tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=("${ALL_TOOLS[@]}")
for t in "${tools[@]}"; do install_tool "$t"; done
# VERNO_GO_CLEAN=1 (CI, where disk is short): once something was built, Go's build and module
# caches (about 7 GB) are emptied; the binaries are kept (and cached by stamp).
if [ "${VERNO_GO_CLEAN:-0}" = 1 ] && [ "$BUILT" = 1 ]; then
  go clean -cache -modcache
  echo "install-control-plane: Go's build and module caches emptied (VERNO_GO_CLEAN=1)" >&2
fi
for t in "${tools[@]}"; do report "$t"; done
