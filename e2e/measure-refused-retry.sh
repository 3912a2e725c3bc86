#!/usr/bin/env bash
# A measurement, not a test (issue 61): how long a Deployment's pod refused for a full
# queue takes to be created and bound once another workload frees the cards, after it
# has been refused for HOLD seconds. The ReplicaSet controller retries a failed create
# with its own exponential backoff, which nothing resets when cards are freed.
#
#   KUBECONFIG=<kubeconfig> e2e/measure-refused-retry.sh [path/to/card-quota]
#
# E2E_HOLD_SECONDS (default 300). Prints the latency; exits non-zero only on a setup error.
set -uo pipefail

BIN=${1:-target/release/card-quota}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
: "${KUBECONFIG:?set KUBECONFIG}"
export KUBECONFIG
RUN=${E2E_RUN:-$(date +%s | tail -c 6)$RANDOM}
NS=cq-retry-$RUN
SYS=cq-retry-$RUN-system
Q=cq-retry-$RUN
NODE=$Q-h200
PORT=${E2E_PORT:-19643}
HOLD=${E2E_HOLD_SECONDS:-300}
WORK=$(mktemp -d /tmp/cq-retry.XXXXXX)
START=$(date +%s)
log() { printf '[%4ss] %s\n' $(( $(date +%s) - START )) "$*"; }
k() { kubectl "$@"; }
wait_for() { local t=$1; shift; local end=$(( $(date +%s) + t )); while ! "$@" >/dev/null 2>&1; do [ "$(date +%s)" -ge $end ] && return 1; sleep 0.2; done; }
SERVE=""
cleanup() {
  [ -n "$SERVE" ] && kill "$SERVE" 2>/dev/null
  k delete mutatingwebhookconfiguration,validatingwebhookconfiguration "$Q" --ignore-not-found >/dev/null 2>&1
  k delete namespace "$NS" "$SYS" --wait=false --ignore-not-found >/dev/null 2>&1
  k delete queue "$Q" --ignore-not-found >/dev/null 2>&1
  k delete node "$NODE" --ignore-not-found >/dev/null 2>&1
  e2e_remove_identity "$Q"
  rm -rf "$WORK"
}
trap cleanup EXIT
# shellcheck source=e2e/lib.sh
. "$(dirname "$0")/lib.sh"

e2e_single_node_setup 8 500
KUBECONFIG="$WORK/card-quota.kubeconfig" "$BIN" serve --cert-dir "$WORK/certs" --listen "127.0.0.1:$PORT" \
  --metrics-listen "127.0.0.1:$((PORT + 1000))" --client-ca "$WORK/client-ca.crt" \
  --client-name kube-apiserver-webhook-client --lease-namespace "$SYS" --lease-name card-quota-retry \
  --reconcile-seconds 0.5 > "$WORK/serve.log" 2>&1 &
SERVE=$!
wait_for 30 curl -sf "http://127.0.0.1:$((PORT + 1000))/readyz" || { echo "card-quota never became ready"; cat "$WORK/serve.log"; exit 100; }
"$BIN" manifests --cert-dir "$WORK/certs" --url "https://127.0.0.1:$PORT" --name "$Q" --namespace "$SYS" \
  --namespace-label "card-quota-e2e=$RUN" | k apply -f - >/dev/null
k apply -f - >/dev/null <<YAML
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: $Q, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":1}'}}
spec: {weight: 1}
YAML
sleep 1
deploy() { # name
  k -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: $1}
spec:
  replicas: 1
  selector: {matchLabels: {app: $1}}
  template:
    metadata: {labels: {app: $1}, annotations: {scheduling.volcano.sh/queue-name: $Q}}
    spec: {containers: [{name: c, image: registry.k8s.io/pause:3.9, resources: {limits: {nvidia.com/gpu: "1"}}}]}
YAML
}
bound() { [ -n "$(k -n "$NS" get pods -l "app=$1" -o jsonpath='{.items[*].spec.nodeName}')" ]; }
deploy holder
wait_for 60 bound holder || { echo "the holder's pod was never bound"; exit 100; }
deploy waiter
log "waiter refused while holder holds the queue's one H200; holding $HOLD s"
sleep "$HOLD"
refusals=$(k -n "$NS" get events --field-selector reason=FailedCreate -o json | jq '[.items[] | select(.involvedObject.name | startswith("waiter")) | .count // 1] | add // 0')
k -n "$NS" delete deployment holder --wait=false >/dev/null
k -n "$NS" delete pod -l app=holder --grace-period=0 --force >/dev/null 2>&1
wait_for 30 bash -c "[ -z \"\$(kubectl -n $NS get pods -l app=holder -o name)\" ]"
t0=$(date +%s.%N)
log "holder gone after $refusals refused creates of the waiter; waiting for the waiter's pod (up to 1200 s)"
if wait_for 1200 bound waiter; then
  t1=$(date +%s.%N)
  log "RESULT: the waiter's pod was created and bound $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}') s after the cards were freed, having been refused for $HOLD s ($refusals refused creates)"
else
  log "RESULT: the waiter's pod was not bound within 1200 s of the cards being freed"
fi
