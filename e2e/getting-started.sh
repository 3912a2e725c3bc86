#!/usr/bin/env bash
# docs/getting-started.md as a new user runs it: every ```sh block of the page, in order,
# on a real API server, each output checked against the ```text block the page shows
# after it. The GPU nodes the page lists (gpu-1, gpu-2, labelled as GPU Feature Discovery
# labels them) are created first, as the page's prerequisites: fake nodes, where the
# page's GPU pods are bound and never run (they have no CPU, so card-quota's own pods
# cannot go there). A person reads between steps, so a block that fails, or does not
# show the output the page shows, is run again for up to 30 s.
#
# With E2E_REAL_NODE=1 (a node of ../shared/tools/k8s-1.37/kubelet.sh is Ready and holds
# card-quota's image, as .ci/run sets up), the page runs exactly as written: the chart's
# Deployment runs as pods from the image, and the API server calls the webhooks through
# the chart's Service with the chart's certificates. Without it (a control plane with no
# kubelet), two lines of step 1 are played by this script, and only those:
#   - `helm install card-quota ...` gets the values that point the webhooks at
#     https://127.0.0.1:$PORT (certificate with that IP);
#   - `kubectl -n card-quota rollout status deployment/card-quota` runs the Deployment's
#     container here (its arguments, ServiceAccount token and certificate).
#
#   KUBECONFIG=<kubeconfig> HELM=<helm> e2e/getting-started.sh [path/to/card-quota]
#
# Exit status: number of failed checks.
set -uo pipefail
BIN=${1:-target/release/card-quota}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
ROOT=$(cd "$(dirname "$0")/.." && pwd)
: "${KUBECONFIG:?set KUBECONFIG}"
HELM=${HELM:-helm}
NS=card-quota
PORT=${GETTING_STARTED_PORT:-19743}
WORK=$(mktemp -d /tmp/cq-getting-started.XXXXXX)
START=$(date +%s)
PASSED=0
FAILED=0
SERVE=
log() { printf '[%4ss] %s\n' $(( $(date +%s) - START )) "$*"; }
k() { kubectl "$@"; }
wait_for() { local t=$1; shift; local end=$(( $(date +%s) + t )); while ! "$@" >/dev/null 2>&1; do [ "$(date +%s)" -ge $end ] && return 1; sleep 0.3; done; }
# shellcheck source=e2e/lib.sh
. "$(dirname "$0")/lib.sh"
pass() { PASSED=$((PASSED + 1)); log "PASS: $*"; }
fail() { FAILED=$((FAILED + 1)); log "FAIL: $*"; }
cleanup() {
  [ -n "$SERVE" ] && kill "$SERVE" 2>/dev/null && wait "$SERVE" 2>/dev/null
  "$HELM" uninstall card-quota -n "$NS" >/dev/null 2>&1
  k delete namespace ml "$NS" --wait=false --ignore-not-found >/dev/null 2>&1
  k delete queue start research --ignore-not-found >/dev/null 2>&1
  k delete node gpu-1 gpu-2 --ignore-not-found >/dev/null 2>&1
  [ -n "${E2E_KEEP:-}" ] && echo "logs in $WORK" || rm -rf "$WORK"
}

# The page installs into fixed names: refuse to run over a cluster that has them.
for o in mutatingwebhookconfiguration/card-quota namespace/ml namespace/card-quota queue/start queue/research node/gpu-1 node/gpu-2; do
  if k get "$o" >/dev/null 2>&1; then echo "$o exists in this cluster; not running the page over it"; exit 100; fi
done
trap cleanup EXIT

# The prerequisites: two GPU nodes, labelled as GPU Feature Discovery labels them.
node() { # name product cards
  k create -f - >/dev/null <<EOF
{"apiVersion":"v1","kind":"Node","metadata":{"name":"$1","labels":{"nvidia.com/gpu.product":"$2","nvidia.com/gpu.count":"$3"}}}
EOF
  k get --raw "/api/v1/nodes/$1" | jq --arg n "$3" '.status = {capacity: {"nvidia.com/gpu": $n, pods: "110"}, allocatable: {"nvidia.com/gpu": $n, pods: "110"}}' |
    k replace --raw "/api/v1/nodes/$1/status" -f - >/dev/null
}
node gpu-1 NVIDIA-GeForce-RTX-4090 4
node gpu-2 NVIDIA-H200 8

n=$(python3 "$ROOT/e2e/page.py" blocks "$ROOT/docs/getting-started.md" "$WORK") || { fail "the page's blocks"; exit 1; }
log "docs/getting-started.md: $n command blocks"
export PATH="$(dirname "$BIN"):$(dirname "$(command -v "$HELM")"):$PATH"
# Where the page's reader pushed the image: here, the name it is loaded under on the node.
export IMAGE=ghcr.io/card-quota/card-quota
cd "$ROOT" || exit 1
for i in $(seq -f %02g 1 "$n"); do
  block=$WORK/$i.sh
  start_serve=0
  if [ -z "${E2E_REAL_NODE:-}" ]; then
    if grep -q '^kubectl -n card-quota rollout status deployment/card-quota' "$block"; then
      sed -i 's|^kubectl -n card-quota rollout status deployment/card-quota.*|: played by the e2e: the Deployment runs here|' "$block"
      start_serve=1
    fi
    # Nothing runs on fake nodes: the install cannot wait for its pods.
    sed -i "s|^helm install card-quota charts/card-quota .*|& --set webhooks.url=https://127.0.0.1:$PORT --set 'certificates.extraIPs={127.0.0.1}'|; s|^\(helm install card-quota .*\) --wait|\1|" "$block"
  fi
  first=$(grep -v '^\s*$' "$block" | head -1)
  end=$(( $(date +%s) + 30 ))
  while :; do
    bash -e -o pipefail "$block" > "$WORK/$i.out" 2>&1
    rc=$?
    # A block that fails (the Service's endpoints not programmed yet, right after
    # `rollout status`) is run again too: the page's blocks are idempotent applies.
    if [ ! -f "$WORK/$i.expect" ] && [ "$rc" = 0 ]; then break; fi
    if [ "$rc" = 0 ] && python3 "$ROOT/e2e/page.py" match "$WORK/$i.expect" "$WORK/$i.out" 2>/dev/null; then break; fi
    [ "$(date +%s)" -ge "$end" ] && break
    sleep 1
  done
  if [ "$rc" != 0 ]; then
    fail "block $i ($first) exits $rc"; sed 's/^/      /' "$WORK/$i.out"
    break
  fi
  if [ -f "$WORK/$i.expect" ]; then
    if python3 "$ROOT/e2e/page.py" match "$WORK/$i.expect" "$WORK/$i.out" 2> "$WORK/$i.diff"; then
      pass "block $i ($first) prints what the page shows"
    else
      fail "block $i ($first) does not print what the page shows"; sed 's/^/      /' "$WORK/$i.diff"
    fi
  else
    pass "block $i ($first) runs"
  fi
  if [ "$start_serve" = 1 ]; then
    if e2e_serve_release; then pass "the installed Deployment's serve is up"; else fail "the installed Deployment's serve did not start"; tail -20 "$WORK/serve.log"; break; fi
  fi
done
if [ -n "${E2E_REAL_NODE:-}" ]; then
  # What ran: card-quota's own pods, from the image, on the real node, and no swapped line.
  running=$(k -n "$NS" get pods -l app.kubernetes.io/name=card-quota -o json 2>/dev/null |
    jq -r '[.items[] | select(.status.phase == "Running") | .spec.nodeName] | unique | join(",")')
  if [ -n "$running" ] && ! grep -q "played by the e2e" "$WORK"/*.sh; then
    pass "card-quota ran as the chart's pods (on $running), the page's every line as written"
  else
    fail "card-quota's pods are not Running on a real node (nodes: '${running}')"
    k -n "$NS" get pods -o wide 2>&1 | sed 's/^/      /'
  fi
fi
log "RESULT: $PASSED passed, $FAILED failed"
exit "$FAILED"
