#!/usr/bin/env bash
# The Helm chart on a real API server: install, a smoke test of the installed objects,
# upgrade (warn mode; the CA kept), uninstall leaving nothing behind. The control plane
# has no kubelet, so the chart's Deployment never runs: `serve` runs on this machine
# with the Deployment's own arguments, the release's ServiceAccount token and the
# release's serving certificate, and the webhooks point at it (webhooks.url).
#
#   KUBECONFIG=<kubeconfig> HELM=<helm> e2e/helm.sh [path/to/card-quota]
#
# Exit status: number of failed checks.
set -uo pipefail
BIN=${1:-target/release/card-quota}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
CHART=$(cd "$(dirname "$0")/../charts/card-quota" && pwd)
: "${KUBECONFIG:?set KUBECONFIG}"
HELM=${HELM:-helm}
RUN=h$(date +%s | tail -c 5)$RANDOM
NS=cq-helm-$RUN
APP=cq-helm-$RUN-apps
Q=cq-helm-$RUN
PORT=${HELM_E2E_PORT:-19643}
WORK=$(mktemp -d /tmp/cq-helm.XXXXXX)
START=$(date +%s)
PASSED=0
FAILED=0
SERVE=

log() { printf '[%4ss] %s\n' $(( $(date +%s) - START )) "$*"; }
check() { local name=$1; shift; if "$@"; then PASSED=$((PASSED + 1)); log "PASS: $name"; else FAILED=$((FAILED + 1)); log "FAIL: $name"; echo "      command: $*"; fi; }
contains() { grep -qF -- "$2" <<<"$1"; }
k() { kubectl "$@"; }
# shellcheck source=e2e/lib.sh
. "$(dirname "$0")/lib.sh"
stop_serve() { [ -n "$SERVE" ] && kill "$SERVE" 2>/dev/null && wait "$SERVE" 2>/dev/null; SERVE=; }
cleanup() {
  stop_serve
  "$HELM" uninstall cq -n "$NS" >/dev/null 2>&1
  k delete namespace "$NS" "$APP" --wait=false --ignore-not-found >/dev/null 2>&1
  k delete queue "$Q" --ignore-not-found >/dev/null 2>&1
  k delete node "$Q-rtx" --ignore-not-found >/dev/null 2>&1
  [ -n "${E2E_KEEP:-}" ] && echo "logs in $WORK" || rm -rf "$WORK"
}
trap cleanup EXIT

# The chart's webhook configurations and cluster roles are named card-quota: one
# install per cluster. Refuse to run over a real one.
if k get mutatingwebhookconfiguration card-quota >/dev/null 2>&1; then
  echo "a card-quota install exists in this cluster; not running the chart e2e"; exit 100
fi
k create namespace "$APP" >/dev/null && k label namespace "$APP" "card-quota-helm=$RUN" >/dev/null
k create -f - >/dev/null <<EOF2
{"apiVersion":"v1","kind":"Node","metadata":{"name":"$Q-rtx","labels":{"nvidia.com/gpu.product":"RTX-4090"}}}
EOF2
k get --raw "/api/v1/nodes/$Q-rtx" | jq '.status = {capacity: {"nvidia.com/gpu": "8", pods: "100"}, allocatable: {"nvidia.com/gpu": "8", pods: "100"}}' |
  k replace --raw "/api/v1/nodes/$Q-rtx/status" -f - >/dev/null

wait_for() { local t=$1; shift; local end=$(( $(date +%s) + t )); while ! "$@" >/dev/null 2>&1; do [ "$(date +%s)" -ge $end ] && return 1; sleep 0.3; done; }
pod() { # name
  cat <<EOF2
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: $APP
  annotations: {scheduling.volcano.sh/queue-name: $Q, volcano.sh/card.name: RTX-4090}
spec:
  schedulerName: volcano
  containers: [{name: c, image: registry.k8s.io/pause:3.9, resources: {limits: {nvidia.com/gpu: "1"}}}]
EOF2
}
queue() { # quota-json
  printf '{"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"Queue","metadata":{"name":"%s","annotations":{"volcano.sh/card.quota":"%s"}},"spec":{"weight":1}}' \
    "$Q" "$(sed 's/"/\\"/g' <<<"$1")" | k apply -f - 2>&1
}

VALUES=(--set image.repository=registry.example/card-quota --set "webhooks.url=https://127.0.0.1:$PORT" --set "certificates.extraIPs={127.0.0.1}"
  --set "webhooks.namespaceLabels.card-quota-helm=$RUN")
out=$("$HELM" install cq "$CHART" -n "$NS" --create-namespace "${VALUES[@]}" 2>&1)
check "helm install" contains "$out" "STATUS: deployed"
check "... the release runs the installed arguments as a real serve (RBAC, certificate, flags)" e2e_serve_release
log "serve $(tr '\n' ' ' < "$WORK/args")"
out=$(queue '{"RTX-4090":1')
check "a malformed card.quota is refused through the chart's Queue hook" contains "$out" "invalid volcano.sh/card.quota on queue $Q: not valid JSON"
queue '{"RTX-4090":1}' >/dev/null
sleep 1
out=$(pod p1 | k apply -f - 2>&1)
check "a card pod within the quota is created through the chart's pod hooks" contains "$out" "pod/p1 created"
check "... pinned to its model" bash -c "[ \"\$(kubectl -n $APP get pod p1 -o jsonpath='{.spec.nodeSelector.nvidia\.com/gpu\.product}')\" = RTX-4090 ]"
out=$(pod p2 | k apply -f - 2>&1)
check "the next is refused with the quota's message" contains "$out" "queue $Q has insufficient RTX-4090 quota: requested 1, in use 1 (allocated 0, pending 1, reserved 0), quota 1"
out=$(k -n "$APP" run plain --image=registry.k8s.io/pause:3.9 --restart=Never 2>&1)
check "a cardless pod never reaches card-quota (matchConditions)" contains "$out" "pod/plain created"

# Self-service (opt-in): a team user with no cluster-wide rights reads its Queue.
TEAM=(--as=cq-helm-team-user --as-group=system:authenticated)
check "without queueReaders a team user cannot read Queues" \
  [ "$(k auth can-i get queues.scheduling.volcano.sh "${TEAM[@]}" 2>/dev/null)" = no ]
out=$("$HELM" upgrade cq "$CHART" -n "$NS" --reuse-values --set queueReaders.enabled=true 2>&1)
check "helm upgrade --set queueReaders.enabled=true" contains "$out" "STATUS: deployed"
check "... then the team user reads its queue's card quota" \
  [ "$(k get queue "$Q" "${TEAM[@]}" -o jsonpath='{.metadata.annotations.volcano\.sh/card\.quota}' 2>&1)" = '{"RTX-4090":1}' ]
check "... and nothing else cluster-wide (no nodes)" \
  [ "$(k auth can-i list nodes "${TEAM[@]}" 2>/dev/null)" = no ]
ca0=$(k -n "$NS" get secret card-quota-ca -o jsonpath='{.data.tls\.crt}')
crt0=$(k -n "$NS" get secret card-quota-tls -o jsonpath='{.data.tls\.crt}')
out=$("$HELM" upgrade cq "$CHART" -n "$NS" --reuse-values --set enforcement=warn 2>&1)
check "helm upgrade --set enforcement=warn" contains "$out" "STATUS: deployed"
check "... keeps the CA (the API server's trust does not change)" \
  [ "$(k -n "$NS" get secret card-quota-ca -o jsonpath='{.data.tls\.crt}')" = "$ca0" ]
check "... and renews the serving certificate under it" \
  [ "$(k -n "$NS" get secret card-quota-tls -o jsonpath='{.data.tls\.crt}')" != "$crt0" ]
stop_serve
check "... whose Deployment now runs --enforcement=warn" e2e_serve_release
grep -q -- '--enforcement=warn' "$WORK/args" || { FAILED=$((FAILED + 1)); log "FAIL: the upgraded Deployment has no --enforcement=warn: $(tr '\n' ' ' < "$WORK/args")"; }
out=$(pod p2 | k apply -f - 2>&1)
check "under warn the pod past the quota is created with a warning" contains "$out" \
  "Warning: card-quota admitted this because queue $Q's enforcement is warn (the install's default); under deny: queue $Q has insufficient RTX-4090 quota"
check "... and is not pinned: warn never steers where a pod runs" bash -c \
  "[ -z \"\$(kubectl -n $APP get pod p2 -o jsonpath='{.spec.nodeSelector}')\" ]"
k annotate queue "$Q" volcano.sh/card.enforcement=deny --overwrite >/dev/null
check "a queue in deny under a warn (fail-open) install is reported by a metric" wait_for 30 bash -c \
  "curl -s http://127.0.0.1:$((PORT + 1000))/metrics | grep -qx 'card_quota_queue_deny_fail_open{queue_name=\"$Q\"} 1'"
check "... by a CardQuotaDenyFailsOpen Event on the Queue" wait_for 30 bash -c \
  "kubectl get events -A --field-selector reason=CardQuotaDenyFailsOpen -o jsonpath='{.items[*].message}' | grep -q 'queue $Q is in deny, but card-quota is installed in warn'"
check "... and by card-quota status (which reads the install's webhooks)" bash -c \
  "'$BIN' status --queue $Q | grep -q 'deny, but the install fails open'"
k annotate queue "$Q" volcano.sh/card.enforcement- >/dev/null
stop_serve
check "a warn install's webhooks all fail open but the Queue one" bash -c \
  "[ \"\$(kubectl get validatingwebhookconfiguration,mutatingwebhookconfiguration -l app.kubernetes.io/instance=cq -o json | jq -r '[.items[].webhooks[] | select(.failurePolicy != \"Ignore\") | .name] | join(\",\")')\" = queues.card-quota.volcano.sh ]"
out=$(pod p-down | k apply -f - 2>&1)
check "... so with card-quota not running a GPU pod is still created" contains "$out" "pod/p-down created"

out=$("$HELM" uninstall cq -n "$NS" 2>&1)
check "helm uninstall" contains "$out" "uninstalled"
release_objects() {
  { k get mutatingwebhookconfiguration,validatingwebhookconfiguration,clusterrole,clusterrolebinding -o name -l app.kubernetes.io/instance=cq
    k -n "$NS" get all,secret,configmap,serviceaccount,role,rolebinding,networkpolicy,poddisruptionbudget -o name -l app.kubernetes.io/instance=cq; } 2>/dev/null
}
# The Deployment's ReplicaSets and pods are not the release's own objects: the garbage
# collector removes them after helm returns, so wait for it (on a slow machine, seconds).
left=$(release_objects)
for _ in $(seq 60); do
  [ -z "$left" ] && break
  sleep 1
  left=$(release_objects)
done
check "... leaves none of the release's objects behind" [ -z "$left" ]
[ -z "$left" ] || echo "      left: $left"
out=$(pod p3 | k apply -f - 2>&1)
check "... and with the hooks gone card pods are created again" contains "$out" "pod/p3 created"

echo "chart e2e: $PASSED passed, $FAILED failed ($(( $(date +%s) - START )) s)"
[ "$FAILED" = 0 ] || tail -20 "$WORK/serve.log"
exit "$FAILED"
