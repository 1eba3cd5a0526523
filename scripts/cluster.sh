#!/usr/bin/env bash
# Starts and stops a real, throwaway Kubernetes control plane on loopback, for tests:
# etcd, kube-apiserver, kube-controller-manager and kwok (fake nodes and pods), built into
# .tools/bin by scripts/install-control-plane.sh.
#
#   scripts/cluster.sh up DIR [--no-kwok] [--no-controller-manager]
#   scripts/cluster.sh down DIR
#
# `up` creates DIR (it must not already hold a running cluster), writes a CA and certificates,
# starts the components, waits until they are ready and prints `KUBECONFIG=DIR/kubeconfig` as
# the last line of stdout. Everything listens on 127.0.0.1 only, on free ports picked at start,
# so several clusters can run at once. On any failure it prints the last 30 lines of the failing
# component's log to stderr, stops what it started (DIR and its logs are kept; `down DIR`
# removes them) and exits non-zero.
#
# `down` stops every process recorded in DIR/pids (TERM, then KILL after 10 s) and removes DIR.
# It is safe to call twice, or on a half-started DIR.
#
# Files in DIR:
#   kubeconfig            admin (client certificate with O=system:masters), certificates embedded
#   ca.crt, ca.key        the cluster CA: the API server trusts client certificates it signs, so
#                         tests can also sign more certificates with it (e.g. a webhook server's)
#   admin.crt, admin.key  the admin client certificate (as in kubeconfig)
#   apiserver.crt/.key    the API server's serving certificate (127.0.0.1, localhost, kubernetes…)
#   sa.key, sa.pub        service account token signing key pair
#   env                   shell-sourceable KEY=VALUE lines: APISERVER_URL, APISERVER_PORT,
#                         ETCD_PORT, … and the paths above
#   logs/<component>.log  etcd, kube-apiserver, kube-controller-manager, kwok
#   pids                  "<component> <pid>" per line, read by `down`
#   etcd/                 etcd's data directory
#
# What runs:
#   - kube-apiserver with RBAC (Node,RBAC), admission webhooks, ValidatingAdmissionPolicy and
#     MutatingAdmissionPolicy (beta in v1.35: feature gate + admissionregistration.k8s.io/v1beta1),
#     service account token signing (TokenRequest works), service CIDR 10.0.0.0/24. The admission
#     plugin TaintNodesByCondition is disabled so that new Nodes carry no not-ready taint (there is
#     no node-lifecycle controller to remove it).
#   - kube-controller-manager with the usual controllers (garbage collector, namespace,
#     deployment, replicaset, job, serviceaccount, serviceaccount-token, …) minus node IPAM and
#     node lifecycle. `up` waits until it has created the `default` ServiceAccount in `default`.
#     Without it (--no-controller-manager) no ServiceAccount is created, so Pods cannot be
#     created until a test creates the ServiceAccount they use.
#   - kwok, managing Nodes annotated kwok.x-k8s.io/node=fake; `up` creates one such Node,
#     `kwok-node-0` (label type=kwok, no taints) and waits until it is Ready. Pods bound to it
#     become Running (and are deleted promptly when deleted).
#   - NO kube-scheduler: Pods must set spec.nodeName (e.g. `nodeName: kwok-node-0`, also in
#     Deployment/Job pod templates), or tests must bind them themselves (pods/binding).
#
# Tools come from $VERNO_TOOLS if set, else <repo>/.tools/bin; kwok's stages from
# <tools>/../share/kwok/stages.yaml, else <repo>/.tools/share/kwok/stages.yaml. Also needs
# openssl, curl and python3. Linux only (uses /proc). Nothing is written outside DIR.
set -euo pipefail

usage() {
  cat >&2 <<'EOF'
usage: scripts/cluster.sh up DIR [--no-kwok] [--no-controller-manager]
       scripts/cluster.sh down DIR

  up    start etcd, kube-apiserver, kube-controller-manager and kwok on 127.0.0.1 (free ports),
        with all state in DIR; prints KUBECONFIG=DIR/kubeconfig as its last line
  down  stop the processes recorded in DIR/pids and remove DIR

Tools are taken from $VERNO_TOOLS, else <repo>/.tools/bin (scripts/install-control-plane.sh).
$VERNO_RUNTIME_CONFIG replaces the API server's --runtime-config (default:
admissionregistration.k8s.io/v1beta1=true, MutatingAdmissionPolicy at v1beta1).
EOF
  exit 2
}

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
TOOLS=${VERNO_TOOLS:-$REPO/.tools/bin}
if [ -f "$TOOLS/../share/kwok/stages.yaml" ]; then
  KWOK_STAGES=$(cd "$TOOLS/../share/kwok" && pwd -P)/stages.yaml
else
  KWOK_STAGES=$REPO/.tools/share/kwok/stages.yaml
fi

# A file that marks DIR as made by this script: `down` only removes a DIR that has it, and `up`
# only reuses (wipes) an existing non-empty DIR that has it.
MARKER=.verno-cluster
KWOK_NODE=kwok-node-0
CERT_DAYS=2
READY_TIMEOUT=60   # seconds, for each component
STOP_TIMEOUT=10    # seconds between TERM and KILL

log() { echo "cluster.sh: $*" >&2; }
now_ms() { local t=${EPOCHREALTIME/[.,]/}; echo $((t / 1000)); }

# ours DIR PID: whether PID is alive and is one of our components for DIR (every one of them
# has a path under DIR/ on its command line), so that a recycled PID is never signalled.
# Zombies (exited, not yet reaped) have an empty command line and count as gone.
ours() {
  local cmdline
  cmdline=$(tr '\0' ' ' 2>/dev/null <"/proc/$2/cmdline") || return 1
  [[ $cmdline == *"$1/"* ]]
}

# pids_of DIR [NAME|!NAME]: the PIDs listed in DIR/pids (of component NAME only, or of all but
# NAME) whose processes are still running.
pids_of() {
  local dir=$1 sel=${2:-} name pid
  [ -f "$dir/pids" ] || return 0
  while read -r name pid; do
    [[ $pid =~ ^[0-9]+$ ]] || continue
    case "$sel" in
      "") ;;
      !*) [ "$name" != "${sel#!}" ] || continue ;;
      *) [ "$name" = "$sel" ] || continue ;;
    esac
    if ours "$dir" "$pid"; then echo "$pid"; fi
  done <"$dir/pids"
}

# terminate DIR PID...: TERM the PIDs, wait up to STOP_TIMEOUT s for them to exit, KILL the rest.
terminate() {
  local dir=$1 pid deadline=$(($(now_ms) + STOP_TIMEOUT * 1000)); shift
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  while :; do
    local still=()
    for pid in "$@"; do
      if ours "$dir" "$pid"; then still+=("$pid"); fi
    done
    [ ${#still[@]} -gt 0 ] || return 0
    if [ "$(now_ms)" -ge "$deadline" ]; then
      log "killing ${still[*]} (still running ${STOP_TIMEOUT}s after TERM)"
      kill -KILL "${still[@]}" 2>/dev/null || true
      return 0
    fi
    sleep 0.1
  done
}

# stop_all DIR: stops everything in DIR/pids; etcd last, since kube-apiserver does not finish
# its graceful shutdown while etcd is gone.
stop_all() {
  # shellcheck disable=SC2046  # word splitting of the PID lists is intended
  terminate "$1" $(pids_of "$1" '!etcd')
  # shellcheck disable=SC2046
  terminate "$1" $(pids_of "$1" etcd)
}

cmd_down() {
  local dir=$1
  [ -e "$dir" ] || return 0
  dir=$(cd "$dir" && pwd -P)
  if [ ! -f "$dir/$MARKER" ] && [ -n "$(ls -A "$dir")" ]; then
    log "$dir was not made by cluster.sh up (no $MARKER): leaving it alone"
    return 1
  fi
  stop_all "$dir"
  rm -rf "$dir"
}

# --- up ---------------------------------------------------------------------------------------

CURRENT=""      # the component being set up or waited for: whose log to show on failure
UP_DONE=0
declare -A PID=()

on_exit() {
  local rc=$?
  [ "$UP_DONE" = 1 ] && return 0
  [ "$rc" -ne 0 ] || rc=1
  trap - EXIT INT TERM
  log "up failed${CURRENT:+ at $CURRENT} (exit $rc)"
  if [ -n "$CURRENT" ] && [ -f "$LOG_DIR/$CURRENT.log" ]; then
    echo "----- last 30 lines of $LOG_DIR/$CURRENT.log -----" >&2
    tail -n 30 "$LOG_DIR/$CURRENT.log" >&2 || true
    echo "-----" >&2
  fi
  stop_all "$DIR"
  log "stopped what was started; logs kept in $LOG_DIR (remove with: $0 down $DIR)"
  exit "$rc"
}

fail() { log "$*"; exit 1; }

# start NAME CMD...: runs CMD in the background with its output in logs/NAME.log, records its PID.
# stdin/stdout/stderr are redirected so that a caller capturing `up`'s output is not kept
# waiting. The processes stay in the caller's process group, so a TERM or KILL sent to that group
# (e.g. by a test runner's timeout) also stops the cluster (after TERM, kube-apiserver and etcd
# may take up to ~30 s, each waiting on the other; `down` is faster: it stops etcd last).
# SIGINT does not stop it: bash starts background commands with SIGINT ignored.
start() {
  local name=$1; shift
  CURRENT=$name
  "$@" </dev/null >"$LOG_DIR/$name.log" 2>&1 &
  PID[$name]=$!
  echo "$name $!" >>"$DIR/pids"
  # Until the background subshell has exec'd the tool, its command line is this script's; wait
  # for the exec so that `ours` recognises the process from now on.
  local tries=0
  until ours "$DIR" "${PID[$name]}"; do
    [ -e "/proc/${PID[$name]}" ] && [ $((tries += 1)) -lt 100 ] || fail "could not start $1"
    sleep 0.02
  done
}

# wait_for NAME WHAT CMD...: polls CMD (a quiet probe) until it succeeds; fails if component NAME
# exits or READY_TIMEOUT passes first.
#
# Note: no function here runs with its output redirected (`f >file`): a TERM/INT arriving then
# would run on_exit with that redirection still in place, and its report would be lost. Only
# external commands and subshells are redirected.
wait_for() {
  local name=$1 what=$2; shift 2
  local deadline=$(($(now_ms) + READY_TIMEOUT * 1000))
  CURRENT=$name
  until "$@"; do
    ours "$DIR" "${PID[$name]}" || fail "$name exited while waiting for $what"
    [ "$(now_ms)" -lt "$deadline" ] || fail "timed out after ${READY_TIMEOUT}s waiting for $what"
    sleep 0.1
  done
}

# Picks N distinct free TCP ports on 127.0.0.1 (all sockets are bound at once, so they differ).
free_ports() {
  python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
' "$1"
}

# --- certificates (openssl, RSA 2048, valid CERT_DAYS days) ---

# openssl req config: just the subject, no prompts, no dependency on the system openssl.cnf.
req_config() { # SUBJECT_LINES...
  printf '[req]\ndistinguished_name = dn\nprompt = no\n[dn]\n'
  printf '%s\n' "$@"
}

make_ca() {
  openssl req -x509 -new -key ca.key -days "$CERT_DAYS" -out ca.crt -sha256 \
    -config <(req_config "CN = verno-test-ca"; printf '%s\n' '[ext]' \
      'basicConstraints = critical,CA:TRUE' \
      'keyUsage = critical,keyCertSign,cRLSign,digitalSignature' \
      'subjectKeyIdentifier = hash') -extensions ext
}

# sign NAME EXTENSIONS SUBJECT_LINES...: NAME.crt for the key NAME.key, signed by the CA.
sign() {
  local name=$1 ext=$2; shift 2
  openssl req -new -key "$name.key" -out "$name.csr" -config <(req_config "$@")
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -sha256 -days "$CERT_DAYS" \
    -set_serial "0x$(openssl rand -hex 16)" -out "$name.crt" \
    -extfile <(printf '[ext]\n%s\n' "$ext" \
      'keyUsage = critical,digitalSignature,keyEncipherment' \
      'authorityKeyIdentifier = keyid' \
      'basicConstraints = critical,CA:FALSE') -extensions ext
  rm -f "$name.csr"
}

make_certs() {
  # The four RSA keys first, in parallel (key generation is most of the time spent here).
  local key pids=()
  for key in ca apiserver admin sa; do
    openssl genrsa -out "$key.key" 2048 &
    pids+=($!)
  done
  for key in "${pids[@]}"; do wait "$key"; done
  make_ca
  sign apiserver "$(printf '%s\n' 'extendedKeyUsage = serverAuth' \
    'subjectAltName = IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local')" \
    "CN = kube-apiserver"
  # The admin as kind names it (CN kubernetes-admin; tests compare request.userInfo.username).
  sign admin 'extendedKeyUsage = clientAuth' "O = system:masters" "CN = kubernetes-admin"
  # Service account token signing key pair.
  openssl rsa -in sa.key -pubout -out sa.pub
  chmod 600 ./*.key
}

b64() { base64 -w0 <"$1"; }

write_kubeconfig() {
  cat >kubeconfig <<EOF
apiVersion: v1
kind: Config
clusters:
- name: verno-test
  cluster:
    server: $APISERVER_URL
    certificate-authority-data: $(b64 ca.crt)
users:
- name: kubernetes-admin
  user:
    client-certificate-data: $(b64 admin.crt)
    client-key-data: $(b64 admin.key)
contexts:
- name: verno-test
  context:
    cluster: verno-test
    user: kubernetes-admin
current-context: verno-test
EOF
  chmod 600 kubeconfig
}

write_env() {
  local k
  for k in CLUSTER_DIR KUBECONFIG APISERVER_URL APISERVER_PORT ETCD_URL ETCD_PORT ETCD_PEER_PORT \
      KCM_PORT KWOK_PORT KWOK_NODE CA_CERT CA_KEY ADMIN_CERT ADMIN_KEY SA_KEY SA_PUB LOG_DIR; do
    printf '%s=%q\n' "$k" "${!k}"
  done >"$DIR/env"
}

# --- readiness probes (quiet: no output, just the exit status) ---

etcd_healthy() { curl -sf --max-time 2 "$ETCD_URL/health" 2>/dev/null | grep -q '"health":"true"'; }
apiserver_ready() {
  [ "$(curl -sf --max-time 2 --cacert "$CA_CERT" --cert "$ADMIN_CERT" --key "$ADMIN_KEY" \
    "$APISERVER_URL/readyz" 2>/dev/null)" = ok ]
}
kcm_healthy() { [ "$(curl -skf --max-time 2 "https://127.0.0.1:$KCM_PORT/healthz" 2>/dev/null)" = ok ]; }
kwok_healthy() { [ "$(curl -sf --max-time 2 "http://127.0.0.1:$KWOK_PORT/healthz" 2>/dev/null)" = ok ]; }
node_ready() {
  [ "$("${KUBECTL[@]}" get node "$KWOK_NODE" 2>/dev/null \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}
default_sa_exists() { "${KUBECTL[@]}" get serviceaccount default -n default -o name >/dev/null 2>&1; }

cmd_up() {
  local with_kwok=1 with_kcm=1 arg tool
  DIR=$1; shift
  for arg in "$@"; do
    case "$arg" in
      --no-kwok) with_kwok=0 ;;
      --no-controller-manager) with_kcm=0 ;;
      *) usage ;;
    esac
  done

  for tool in etcd kube-apiserver kube-controller-manager kwok kubectl; do
    [ -x "$TOOLS/$tool" ] || fail "$TOOLS/$tool not found (run scripts/install-control-plane.sh)"
  done
  [ "$with_kwok" = 0 ] || [ -f "$KWOK_STAGES" ] || fail "$KWOK_STAGES not found"
  for tool in openssl curl python3 base64; do
    command -v "$tool" >/dev/null || fail "$tool not found"
  done

  # DIR: new, empty, or left by an earlier `up` of ours whose processes are all gone.
  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd -P)
  if [ -n "$(ls -A "$DIR")" ]; then
    [ -f "$DIR/$MARKER" ] || fail "$DIR is not empty and was not made by cluster.sh up"
    [ -z "$(pids_of "$DIR")" ] || fail "$DIR already holds a running cluster (run: $0 down $DIR)"
    find "$DIR" -mindepth 1 -delete
  fi
  LOG_DIR=$DIR/logs
  mkdir -p "$LOG_DIR"
  touch "$DIR/$MARKER"
  : >"$DIR/pids"
  trap on_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  cd "$DIR"

  read -r ETCD_PORT ETCD_PEER_PORT APISERVER_PORT KCM_PORT KWOK_PORT <<<"$(free_ports 5)"
  # shellcheck disable=SC2034  # CLUSTER_DIR is only read by write_env, as ${!k}
  CLUSTER_DIR=$DIR
  KUBECONFIG=$DIR/kubeconfig
  KUBECTL=("$TOOLS/kubectl" --kubeconfig="$KUBECONFIG" --request-timeout=5s)
  APISERVER_URL=https://127.0.0.1:$APISERVER_PORT
  ETCD_URL=http://127.0.0.1:$ETCD_PORT
  CA_CERT=$DIR/ca.crt CA_KEY=$DIR/ca.key
  ADMIN_CERT=$DIR/admin.crt ADMIN_KEY=$DIR/admin.key
  SA_KEY=$DIR/sa.key SA_PUB=$DIR/sa.pub
  [ "$with_kcm" = 1 ] || KCM_PORT=""
  [ "$with_kwok" = 1 ] || { KWOK_PORT=""; KWOK_NODE=""; }

  CURRENT=certs
  (make_certs) >"$LOG_DIR/certs.log" 2>&1
  write_kubeconfig
  write_env

  # etcd: a single member; metrics stay on the client URL (no separate listener). fsync is
  # off: the data is thrown away with DIR, and fsync dominates write latency on slow disks.
  start etcd "$TOOLS/etcd" \
    --name=default \
    --data-dir="$DIR/etcd" \
    --listen-client-urls="$ETCD_URL" \
    --advertise-client-urls="$ETCD_URL" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="default=http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster-state=new \
    --quota-backend-bytes=2147483648 \
    --unsafe-no-fsync=true \
    --log-level=warn
  wait_for etcd "etcd $ETCD_URL/health" etcd_healthy

  # kube-apiserver.
  # - MutatingAdmissionPolicy is beta and off by default in v1.35: it needs both the feature gate
  #   and its API, admissionregistration.k8s.io/v1beta1 (with the gate but without the API the
  #   server never becomes ready). ValidatingAdmissionPolicy is GA (v1).
  # - TaintNodesByCondition is disabled so that Nodes are created without the not-ready taint,
  #   which nothing would remove (no node-lifecycle controller).
  # - --endpoint-reconciler-type=none: the `kubernetes` Service's endpoints would be 127.0.0.1,
  #   which Endpoints validation rejects (loopback), logging an error every 10 s.
  # - Webhooks at https://127.0.0.1:PORT are called directly (no egress selector, no proxy).
  # - --enable-aggregator-routing: a webhook that names a Service is called at an address of
  #   the Service's EndpointSlices (there is no kube-proxy to route a ClusterIP); the chainsaw
  #   runner points Verno's Service at the host process that way.
  start kube-apiserver "$TOOLS/kube-apiserver" \
    --etcd-servers="$ETCD_URL" \
    --bind-address=127.0.0.1 \
    --advertise-address=127.0.0.1 \
    --secure-port="$APISERVER_PORT" \
    --tls-cert-file="$DIR/apiserver.crt" \
    --tls-private-key-file="$DIR/apiserver.key" \
    --client-ca-file="$CA_CERT" \
    --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NamespaceLifecycle,ServiceAccount,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,MutatingAdmissionPolicy \
    --disable-admission-plugins=TaintNodesByCondition \
    --feature-gates=MutatingAdmissionPolicy=true \
    --runtime-config="${VERNO_RUNTIME_CONFIG:-admissionregistration.k8s.io/v1beta1=true}" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$SA_PUB" \
    --service-account-signing-key-file="$SA_KEY" \
    --service-cluster-ip-range=10.0.0.0/24 \
    --endpoint-reconciler-type=none \
    --allow-privileged=true \
    --enable-aggregator-routing=true \
    --profiling=false
  wait_for kube-apiserver "kube-apiserver $APISERVER_URL/readyz" apiserver_ready

  # kube-controller-manager and kwok start together, then are waited for.
  # kube-controller-manager authenticates callers of its own HTTPS port (/metrics; /healthz is
  # always allowed) with client certificates from the CA, without looking up the API server's
  # request-header CA (there is none: that lookup would only log errors). --kube-api-qps/-burst:
  # with the defaults (20/30) client-side throttling of the per-controller service account
  # set-up (--use-service-account-credentials) delays the `default` ServiceAccount by ~4 s.
  if [ "$with_kcm" = 1 ]; then
    start kube-controller-manager "$TOOLS/kube-controller-manager" \
      --kubeconfig="$KUBECONFIG" \
      --authentication-kubeconfig="$KUBECONFIG" \
      --authentication-skip-lookup=true \
      --client-ca-file="$CA_CERT" \
      --authorization-kubeconfig="$KUBECONFIG" \
      --bind-address=127.0.0.1 \
      --secure-port="$KCM_PORT" \
      --cert-dir="$DIR/kube-controller-manager" \
      --leader-elect=false \
      --use-service-account-credentials=true \
      --service-account-private-key-file="$SA_KEY" \
      --root-ca-file="$CA_CERT" \
      --cluster-signing-cert-file="$CA_CERT" \
      --cluster-signing-key-file="$CA_KEY" \
      --controllers='*,-node-ipam-controller,-node-lifecycle-controller,-cloud-node-lifecycle-controller' \
      --kube-api-qps=200 \
      --kube-api-burst=400 \
      --profiling=false
  fi
  if [ "$with_kwok" = 1 ]; then
    start kwok "$TOOLS/kwok" \
      --kubeconfig="$KUBECONFIG" \
      --config="$KWOK_STAGES" \
      --node-lease-duration-seconds=40 \
      --manage-all-nodes=false \
      --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
      --cidr=10.244.0.0/24 \
      --server-address="127.0.0.1:$KWOK_PORT"
  fi
  if [ "$with_kcm" = 1 ]; then
    wait_for kube-controller-manager "kube-controller-manager /healthz" kcm_healthy
  fi
  if [ "$with_kwok" = 1 ]; then
    wait_for kwok "kwok /healthz" kwok_healthy
    CURRENT=kwok
    "${KUBECTL[@]}" create -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $KWOK_NODE
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    type: kwok
    kubernetes.io/hostname: $KWOK_NODE
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    kubernetes.io/role: agent
spec: {}
status:
  allocatable: {cpu: "32", memory: 256Gi, pods: "110"}
  capacity: {cpu: "32", memory: 256Gi, pods: "110"}
EOF
    wait_for kwok "node $KWOK_NODE Ready" node_ready
  fi
  if [ "$with_kcm" = 1 ]; then
    wait_for kube-controller-manager "ServiceAccount default/default" default_sa_exists
  fi

  UP_DONE=1
  CURRENT=""
  echo "KUBECONFIG=$KUBECONFIG"
}

[ $# -ge 2 ] || usage
case "$1" in
  up) shift; cmd_up "$@" ;;
  down) [ $# -eq 2 ] || usage; cmd_down "$2" ;;
  *) usage ;;
esac
