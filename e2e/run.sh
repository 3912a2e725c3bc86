#!/usr/bin/env bash
# End-to-end scenarios of card-quota against a real API server.
#
#   KUBECONFIG=<kubeconfig> e2e/run.sh [path/to/card-quota]
#
# E2E_NO_HOLDS=1 runs the replicas with --no-holds (every charge written, no holds of headroom).
#
# Needs: kubectl, curl, jq, openssl-free (certs come from `card-quota certs`), and an API
# server that can reach https://127.0.0.1:<port> (the webhooks run on this machine).
# Everything it creates is named cq-e2e-<run> and removed at the end; webhooks only see
# namespaces labelled card-quota-e2e=<run>. Volcano's Queue and PodGroup CRDs must be
# installed (a cluster with Volcano has them). Exit status: number of failed scenarios.
set -uo pipefail

BIN=${1:-${CARD_QUOTA:-target/release/card-quota}}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
REPO=$(cd "$(dirname "$0")/.." && pwd)
: "${KUBECONFIG:?set KUBECONFIG to the cluster to test against}"
export KUBECONFIG
RUN=${E2E_RUN:-$(date +%s | tail -c 6)$RANDOM}
NS=cq-e2e-$RUN
NS2=cq-e2e-$RUN-b
SYS=cq-e2e-$RUN-system
Q=cq-e2e-$RUN
PORT_A=${E2E_PORT_A:-19443}
PORT_B=${E2E_PORT_B:-19444}
PORT_D=${E2E_PORT_D:-19445}
WORK=$(mktemp -d /tmp/cq-e2e.XXXXXX)
START=$(date +%s)
PASSED=0
FAILED=0
RESULTS=()
PIDS=()

log() { printf '[%4ss] %s\n' $(( $(date +%s) - START )) "$*"; }
pass() { PASSED=$((PASSED + 1)); RESULTS+=("PASS  $1"); log "PASS: $1"; }
# A failure's details are printed again at the very end (CI shows the output's tail);
# CONTEXT, when set before a check, is what to know if it fails.
CONTEXT=""
DETAILS=()
fail() {
  FAILED=$((FAILED + 1)); RESULTS+=("FAIL  $1"); log "FAIL: $1"; DETAILS+=("FAIL  $1")
  shift
  local l
  for l in "$@" ${CONTEXT:+"$CONTEXT"}; do echo "      $l"; DETAILS+=("      $l"); done
}
k() { kubectl "$@" 2> >(grep -v 'exceeds the supported minor version skew' >&2); }
# shellcheck source=e2e/lib.sh
. "$REPO/e2e/lib.sh"
# check NAME CONDITION-COMMAND... : a scenario step that passes when the command succeeds
check() { local name=$1; shift; if "$@"; then pass "$name"; else fail "$name" "command: $*"; fi; CONTEXT=""; }
contains() { grep -qF -- "$2" <<<"$1"; }
# waits up to $1 seconds for command "${@:2}" to succeed
wait_for() { local t=$1; shift; local end=$(( $(date +%s) + t )); while ! "$@" >/dev/null 2>&1; do [ "$(date +%s)" -ge $end ] && return 1; sleep 0.3; done; }

cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  k delete mutatingwebhookconfiguration "$Q" "$Q-b" --ignore-not-found >/dev/null 2>&1
  k delete validatingwebhookconfiguration "$Q" "$Q-b" --ignore-not-found >/dev/null 2>&1
  k delete queue -l "card-quota-e2e=$RUN" --ignore-not-found >/dev/null 2>&1
  k delete namespace "$NS" "$NS2" "$NS-out" "$SYS" --wait=false --ignore-not-found >/dev/null 2>&1
  k delete node -l "card-quota-e2e=$RUN" --ignore-not-found >/dev/null 2>&1
  k delete resourceslice,deviceclass -l "card-quota-e2e=$RUN" --ignore-not-found >/dev/null 2>&1
  e2e_remove_identity "$Q"
  k delete clusterrolebinding "$Q-vc" --ignore-not-found >/dev/null 2>&1
  if [ "${E2E_KEEP:-}" = "" ]; then rm -rf "$WORK"; else echo "logs kept in $WORK"; fi
}
trap cleanup EXIT

# ---- API access for the binding bursts (curl, as a scheduler would post them) -----------
SERVER=$(k config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')
k config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d > "$WORK/api-ca.crt"
TOKEN=$(k config view --raw --minify -o jsonpath='{.users[0].user.token}')
CURL_AUTH=()
if [ -n "$TOKEN" ]; then
  CURL_AUTH=(-H "Authorization: Bearer $TOKEN")
else
  k config view --raw --minify -o jsonpath='{.users[0].user.client-certificate-data}' | base64 -d > "$WORK/client.crt"
  k config view --raw --minify -o jsonpath='{.users[0].user.client-key-data}' | base64 -d > "$WORK/client.key"
  CURL_AUTH=(--cert "$WORK/client.crt" --key "$WORK/client.key")
fi
# Who binds the scenarios' scheduler pods. The install's matchConditions gate the
# bindings of the schedulers' accounts only, so the e2e binds as one of them.
# - E2E_VOLCANO=standin (default): no Volcano runs; the e2e plays vc-scheduler, with the
#   control plane's vc-scheduler identity, on pods of schedulerName volcano.
# - E2E_VOLCANO=real: the real Volcano runs beside; its scheduler binds every
#   `volcano` pod. The pods the e2e binds itself use a scheduler name nobody runs
#   ($HAND_SCHED), and the e2e's own user is added to the gated binders: no check binds
#   one of Volcano's pods by hand.
# Every card pod is checked whatever its scheduler. The install also gates a second
# vendor's cards (example.com/npu): the hooks' conditions and serve get the same list.
VOLCANO=${E2E_VOLCANO:-standin}
CARDS=()
for r in nvidia.com/gpu nvidia.com/gpu.shared 'nvidia.com/mig-*' amd.com/gpu 'huawei.com/Ascend*' huawei.com/npu example.com/npu; do
  CARDS+=(--card-resource "$r")
done
SCOPE=("${CARDS[@]}")
case $VOLCANO in
  standin)
    HAND_SCHED=volcano
    VC_KUBECONFIG=${CP_DIR:-$HOME/.cache/card-quota-k8s-137}/vc-scheduler.kubeconfig
    [ -r "$VC_KUBECONFIG" ] || { echo "no $VC_KUBECONFIG: set CP_DIR to the test control plane (or E2E_VOLCANO=real)"; exit 100; }
    kubectl --kubeconfig "$VC_KUBECONFIG" config view --raw --minify -o jsonpath='{.users[0].user.client-certificate-data}' | base64 -d > "$WORK/vc.crt"
    kubectl --kubeconfig "$VC_KUBECONFIG" config view --raw --minify -o jsonpath='{.users[0].user.client-key-data}' | base64 -d > "$WORK/vc.key"
    CURL_AUTH=(--cert "$WORK/vc.crt" --key "$WORK/vc.key") ;;
  real)
    HAND_SCHED=cq-e2e-by-hand
    VC_KUBECONFIG=$KUBECONFIG
    ME=$(k auth whoami -o jsonpath='{.status.userInfo.username}') || { echo "kubectl auth whoami failed"; exit 100; }
    SCOPE+=(--binder system:serviceaccount:volcano-system:volcano-scheduler --binder system:kube-scheduler --binder "$ME") ;;
  *) echo "E2E_VOLCANO must be standin or real, not $VOLCANO"; exit 100 ;;
esac
# serve takes the card resources only.
SERVE_SCOPE=("${CARDS[@]}")
api_bind() { # ns pod node -> prints the HTTP status
  curl -s -o "$WORK/binds/$2.out" -w '%{http_code}' --cacert "$WORK/api-ca.crt" "${CURL_AUTH[@]}" \
    -H 'Content-Type: application/json' -X POST "$SERVER/api/v1/namespaces/$1/pods/$2/binding" \
    -d "{\"apiVersion\":\"v1\",\"kind\":\"Binding\",\"metadata\":{\"name\":\"$2\"},\"target\":{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"name\":\"$3\"}}"
}
bind() { # ns pod node : as the Volcano scheduler does
  echo "{\"apiVersion\":\"v1\",\"kind\":\"Binding\",\"metadata\":{\"name\":\"$2\"},\"target\":{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"name\":\"$3\"}}" > "$WORK/b.json"
  kubectl --kubeconfig "$VC_KUBECONFIG" create --raw "/api/v1/namespaces/$1/pods/$2/binding" -f "$WORK/b.json" 2>&1
}

usage() { k get queue "$1" -o jsonpath='{.metadata.annotations.volcano\.sh/card\.usage}'; }
usage_field() { usage "$1" | jq -r --arg m "$2" --arg f "$3" '.[$m][$f] // 0'; }
usage_is() { [ "$(usage_field "$1" "$2" "$3")" = "$4" ]; }
ledger_len() { k -n "$SYS" get configmap "card-quota-ledger.$1" -o jsonpath='{.data.ledger}' 2>/dev/null | jq '.entries | length' 2>/dev/null || echo 0; }

export NS Q WORK RUN SYS
export -f k usage usage_field usage_is ledger_len

queue() { # name quota-json
  cat <<EOF
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata:
  name: $1
  labels: {card-quota-e2e: "$RUN"}
  annotations:
    volcano.sh/card.quota: '$2'
spec: {weight: 1}
EOF
}

card_pod() { # name queue card-name resource count [namespace]
  cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: ${6:-$NS}
  labels: {card-quota-e2e: "$RUN"}
  annotations: {scheduling.volcano.sh/queue-name: $2, volcano.sh/card.name: "$3"}
spec:
  schedulerName: $HAND_SCHED
  containers: [{name: c, image: registry.k8s.io/pause:3.9, resources: {limits: {$4: "$5"}}}]
---
EOF
}

node() { # name product gpus extra-labels-json extra-allocatable-json
  k create -f - >/dev/null <<EOF
{"apiVersion":"v1","kind":"Node","metadata":{"name":"$1","labels":{"card-quota-e2e":"$RUN","nvidia.com/gpu.product":"$2"$4}}}
EOF
  # The node lifecycle controller also writes new nodes: retry on a resourceVersion conflict.
  local try
  for try in 1 2 3 4 5 6 7 8; do
    k get --raw "/api/v1/nodes/$1" | jq --arg g "$3" --argjson extra "{${5#,}}" \
      '.status = {capacity: ({cpu: "64", memory: "512Gi", pods: "500", "nvidia.com/gpu": $g} + $extra), allocatable: ({cpu: "64", memory: "512Gi", pods: "500", "nvidia.com/gpu": $g} + $extra), conditions: [{type: "Ready", status: "True", reason: "E2E", message: "fake node"}]}' \
      > "$WORK/node-$1.json"
    k replace --raw "/api/v1/nodes/$1/status" -f "$WORK/node-$1.json" >/dev/null 2>&1 && return 0
    sleep 0.3
  done
  echo "could not set the status of node $1"; exit 100
}

SERVER_MINOR=$(k version -o json 2>/dev/null | jq -r '.serverVersion.minor // "0"' | tr -dc 0-9)
SERVER_MINOR=${SERVER_MINOR:-0}
# namespace NAME [LABEL]: creates it and waits for what every pod in it needs first: the
# 'default' ServiceAccount and (before 1.24) its token Secret, both made by
# kube-controller-manager. Without them the API server refuses pods before any webhook.
namespace() {
  k create namespace "$1" >/dev/null || { echo "could not create namespace $1"; exit 100; }
  [ -z "${2:-}" ] || k label namespace "$1" "$2" >/dev/null
  local want='{.metadata.name}'
  [ "$SERVER_MINOR" -ge 24 ] || want='{.secrets[0].name}'
  wait_for 60 bash -c "[ -n \"\$(kubectl -n $1 get sa default -o jsonpath='$want' 2>/dev/null)\" ]" || {
    echo "namespace $1: no 'default' ServiceAccount with a token after 60 s; kube-controller-manager:"
    controller_manager_state
    exit 100
  }
}

# Where the test control plane keeps kube-controller-manager (for diagnostics only).
KCM_DIR=${CP_DIR:-$HOME/.cache/card-quota-k8s-137}
controller_manager_state() {
  if [ -f "$KCM_DIR/kube-controller-manager.pid" ]; then
    local pid; pid=$(cat "$KCM_DIR/kube-controller-manager.pid")
    if kill -0 "$pid" 2>/dev/null; then echo "  running (pid $pid)"; else echo "  NOT running (pid $pid gone)"; fi
    echo "  last lines of its log:"; tail -20 "$KCM_DIR/logs/kube-controller-manager.log" 2>/dev/null | cut -c1-300 | sed 's/^/    /'
  else
    echo "  (not the test control plane: no pid file under $KCM_DIR)"
  fi
}

serve() { # name port metrics-port policy
  # Only the API server's webhook client certificate (signed by the cluster CA) gets in.
  # Each replica runs as the install's ServiceAccount (a TokenRequest, see setup).
  KUBECONFIG="$WORK/card-quota.kubeconfig" "$BIN" serve --cert-dir "$WORK/certs" --listen "127.0.0.1:$2" --metrics-listen "127.0.0.1:$3" \
    --client-ca "$WORK/client-ca.crt" --client-name kube-apiserver-webhook-client \
    --scale-policy "$4" --lease-namespace "$SYS" --lease-name card-quota-e2e \
    --reconcile-seconds 0.5 "${SERVE_SCOPE[@]}" ${E2E_NO_HOLDS:+--no-holds} > "$WORK/$1.log" 2>&1 &
  PIDS+=($!)
  eval "PID_$1=$!"
  wait_for 30 curl -sf "http://127.0.0.1:$3/readyz" || { echo "replica $1 never became ready"; cat "$WORK/$1.log"; exit 100; }
}

# ---- setup ---------------------------------------------------------------------------
log "run $RUN against $SERVER with $BIN"
k get crd queues.scheduling.volcano.sh podgroups.scheduling.volcano.sh >/dev/null || { echo "Volcano's Queue/PodGroup CRDs are not installed"; exit 100; }
e2e_sweep_stale_hooks
e2e_build_burst "$REPO" || { echo "could not build examples/burst.rs"; exit 100; }
namespace "$NS" "card-quota-e2e=$RUN"
namespace "$NS2" "card-quota-e2e=$RUN-b"
namespace "$SYS"; mkdir -p "$WORK/binds"
"$BIN" certs --service card-quota --namespace "$SYS" --ip 127.0.0.1 --out "$WORK/certs" >/dev/null 2>&1
CA=$(base64 -w0 < "$WORK/certs/ca.crt")
k config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d > "$WORK/client-ca.crt"
# card-quota runs as the install's own ServiceAccount with the install's RBAC, from a
# TokenRequest (e2e/lib.sh): a verb the manifests do not grant fails this e2e.
e2e_install_identity "$BIN" "$SYS" "$Q"
# Volcano's programs get broad rights from its chart; the stand-in identity too.
[ "$VOLCANO" = real ] || k create clusterrolebinding "$Q-vc" --clusterrole=cluster-admin \
  --user=system:serviceaccount:volcano-system:volcano-scheduler >/dev/null

node "$Q-h200" NVIDIA-H200 8 ',"nvidia.com/gpu.memory":"143771","nvidia.com/gpu.replicas":"2"' ',"nvidia.com/mig-1g.18gb":"7","nvidia.com/gpu.shared":"4"'
node "$Q-rtx" RTX-4090 4 '' ''
node "$Q-a100" NVIDIA-A100 8 '' ''

serve A "$PORT_A" $((PORT_A + 1000)) clamp
serve B "$PORT_B" $((PORT_B + 1000)) clamp
# The API server calls one URL per webhook, so the two replicas split the work by
# namespace: A serves $NS, B serves $NS2. Pods of both namespaces share the queues,
# so both replicas record charges in the same Queue ledgers and race for real.
# --no-pin renders the binding hooks fail-closed, as for a card-aware scheduler: the
# scenarios below bind by hand and cut quotas under pending pods, where the binding
# check is the line (e2e/jobs-wait.sh runs the default install: pins on, bindings
# fail open).
"$BIN" manifests --cert-dir "$WORK/certs" --url "https://127.0.0.1:$PORT_A" --no-pin "${SCOPE[@]}" \
  --name "$Q" --namespace-label "card-quota-e2e=$RUN" | k apply -f - >/dev/null
"$BIN" manifests --cert-dir "$WORK/certs" --url "https://127.0.0.1:$PORT_B" --no-pin "${SCOPE[@]}" \
  --name "$Q-b" --namespace-label "card-quota-e2e=$RUN-b" | k apply -f - >/dev/null
# Queues are cluster-scoped: one replica validating them is enough (and B is killed later).
k get validatingwebhookconfiguration "$Q-b" -o json |
  jq 'del(.webhooks[] | select(.name == "queues.card-quota.volcano.sh"))' | k replace -f - >/dev/null
sleep 1

# ---- 0. Only the API server may call ------------------------------------------------------
code=$(curl -s -o /dev/null -w '%{http_code}' --cacert "$WORK/certs/ca.crt" -X POST -d '{}' "https://127.0.0.1:$PORT_A/validate" 2>/dev/null)
check "a caller without the API server's client certificate is refused at the TLS handshake (no HTTP status: $code)" \
  [ "$code" = 000 ]
check "... the metric counts it" bash -c "curl -s http://127.0.0.1:$((PORT_A + 1000))/metrics | grep -q '^card_quota_tls_handshakes_failed_total [1-9]'"

# A slowloris that passes the handshake: it needs a client certificate the replicas
# accept, i.e. one signed by the cluster CA. The test control plane keeps the API
# server's own; elsewhere set E2E_WEBHOOK_CLIENT_CERT and E2E_WEBHOOK_CLIENT_KEY.
WH_CRT=${E2E_WEBHOOK_CLIENT_CERT:-${CP_DIR:-$HOME/.cache/card-quota-k8s-137}/pki/webhook-client.crt}
WH_KEY=${E2E_WEBHOOK_CLIENT_KEY:-${WH_CRT%.crt}.key}
if [ -r "$WH_CRT" ] && [ -r "$WH_KEY" ]; then
  python3 - "$PORT_A" "$WORK/certs/ca.crt" "$WH_CRT" "$WH_KEY" > "$WORK/slowloris.out" 2>&1 <<'PY' &
import socket, ssl, sys, time
port, ca, crt, key = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.load_verify_locations(ca)
ctx.load_cert_chain(crt, key)
ctx.check_hostname = False
s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1")
s.sendall(b"POST /validate HTTP/1.1\r\nhost: x\r\n")
start = time.time()
s.settimeout(0.5)
i = 0
while time.time() - start < 30:
    try:
        s.sendall(f"x-{i}: y\r\n".encode())
        i += 1
        s.recv(256)
        break  # an answer or the close: cut off
    except socket.timeout:
        continue
    except OSError:
        break
print(f"cut off after {time.time() - start:.1f}s and {i} header lines")
PY
  LORIS=$!
  queue "$Q-loris" '{"RTX-4090":3}' | k apply -f - >/dev/null
  sleep 1
  ok=0
  for i in 1 2 3; do
    # Card pods (the hooks' conditions send only those), into a queue with room.
    if k -n "$NS" run "loris-$i" --image=registry.k8s.io/pause:3.9 --restart=Never --overrides="{\"apiVersion\":\"v1\",\"metadata\":{\"annotations\":{\"scheduling.volcano.sh/queue-name\":\"$Q-loris\",\"volcano.sh/card.name\":\"RTX-4090\"}},\"spec\":{\"schedulerName\":\"$HAND_SCHED\",\"containers\":[{\"name\":\"loris-$i\",\"image\":\"registry.k8s.io/pause:3.9\",\"resources\":{\"limits\":{\"nvidia.com/gpu\":\"1\"}}}]}}" >"$WORK/loris-$i.out" 2>&1; then
      ok=$((ok + 1))
    else
      log "pod loris-$i: $(tr '\n' ' ' < "$WORK/loris-$i.out" | cut -c1-400)"
    fi
  done
  wait "$LORIS"
  log "slowloris: $(cat "$WORK/slowloris.out")"
  check "a client dribbling headers past the handshake is cut off within the header timeout (5 s)" \
    grep -Eq 'cut off after [0-6]\.' "$WORK/slowloris.out"
  check "... while the API server's requests are answered meanwhile ($ok of 3 pods created)" [ "$ok" = 3 ]
else
  log "SKIP slowloris: no client certificate signed by the cluster CA at $WH_CRT"
fi

# ---- 1. Queue quotas ------------------------------------------------------------------
out=$(queue "$Q-research" '{"NVIDIA-H200":3,"NVIDIA-H200/mig-1g.18gb-mixed":4' | k apply -f - 2>&1)
check "malformed card.quota is refused with the exact problem" \
  contains "$out" "invalid volcano.sh/card.quota on queue $Q-research: not valid JSON (EOF while parsing an object at line 1 column 50)"
out=$(queue "$Q-research" '{"NVIDIA-H200":3,"NVIDIA-H200/mig-1g.18gb-mixed":4,"NVIDIA-H200/mps-140g*1/2":2,"RTX-4090":2,"NVIDIA-A100":0}' | k apply -f - 2>&1)
check "a valid quota is admitted" contains "$out" "queue.scheduling.volcano.sh/$Q-research created"
check "whole, MIG and MPS models are discovered from node labels (no 'no node offers' warning)" \
  bash -c '! grep -q "no node offers" <<<"$1"' _ "$out"
out=$(queue "$Q-typo" '{"NVIDIA-H100":1}' | k apply -f - 2>&1)
check "a quota naming a model no node has is admitted with a warning" \
  contains "$out" "Warning: queue $Q-typo: no node offers card model NVIDIA-H100"

# ---- 1b. Enforcement warn: a queue trials its quota before enforcing it -----------------
k apply -f - >/dev/null <<EOF
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata:
  name: $Q-trial
  labels: {card-quota-e2e: "$RUN"}
  annotations: {volcano.sh/card.quota: '{"RTX-4090":1}', volcano.sh/card.enforcement: warn}
spec: {weight: 1}
EOF
sleep 1
card_pod trial-1 "$Q-trial" RTX-4090 nvidia.com/gpu 1 | k apply -f - >/dev/null 2>&1
out=$(card_pod trial-2 "$Q-trial" RTX-4090 nvidia.com/gpu 1 | k apply -f - 2>&1)
check "warn: a pod past the quota of a queue in warn is created" contains "$out" "pod/trial-2 created"
check "... with a warning that says what deny would refuse" contains "$out" \
  "Warning: card-quota admitted this because queue $Q-trial's enforcement is warn (its volcano.sh/card.enforcement annotation); under deny: queue $Q-trial has insufficient RTX-4090 quota: requested 1, in use 1 (allocated 0, pending 1, reserved 0), quota 1"
check "... an Event CardQuotaWouldRefuse on the pod" wait_for 20 bash -c \
  "kubectl -n $NS get events.events.k8s.io --field-selector regarding.name=trial-2 -o jsonpath='{.items[*].reason}' | grep -q CardQuotaWouldRefuse"
check "... the admissions metric counts it as warned" bash -c \
  "curl -s http://127.0.0.1:$((PORT_A + 1000))/metrics | grep -q '^card_quota_admission_requests_total{.*result=\"warned\"} [1-9]'"
check "... and usage stays exact: 2 pending past the quota of 1" wait_for 20 usage_is "$Q-trial" RTX-4090 pending 2
check "... warn steers nothing: neither pod gets a nodeSelector" bash -c \
  "[ -z \"\$(kubectl -n $NS get pod trial-1 trial-2 -o jsonpath='{.items[*].spec.nodeSelector}')\" ]"
check "... the warning says where deny would have pinned it" contains "$out" \
  "Warning: card-quota does not pin pods in warn mode; under deny it would pin this one to RTX-4090"
k annotate queue "$Q-trial" volcano.sh/card.enforcement=deny --overwrite >/dev/null
sleep 1
out=$(card_pod trial-3 "$Q-trial" RTX-4090 nvidia.com/gpu 1 | k apply -f - 2>&1)
check "switched to deny, the next pod is refused" contains "$out" "queue $Q-trial has insufficient RTX-4090 quota: requested 1, in use 2"
out=$(k annotate queue "$Q-trial" volcano.sh/card.enforcement=audit --overwrite 2>&1)
check "a malformed card.enforcement is refused at kubectl annotate (the Queue hook's condition sees it)" \
  contains "$out" "invalid volcano.sh/card.enforcement on queue $Q-trial: expected \"deny\" or \"warn\", got \"audit\""
k -n "$NS" delete pod trial-1 trial-2 --wait=false >/dev/null 2>&1

# ---- 2. PodGroups ---------------------------------------------------------------------
pg() { cat <<EOF
apiVersion: scheduling.volcano.sh/v1beta1
kind: PodGroup
metadata: {name: $1, namespace: $NS, annotations: {volcano.sh/card.request: '$2'}}
spec: {queue: $Q-research, minMember: 1}
EOF
}
out=$(pg job-big '{"NVIDIA-H200":4}' | k apply -f - 2>&1)
check "a PodGroup whose card.request exceeds the quota is refused with the documented message" \
  contains "$out" "queue $Q-research has insufficient NVIDIA-H200 quota: requested 4, in use 0 (allocated 0, pending 0, reserved 0), quota 3"
out=$(pg job-mig '{"NVIDIA-H200/mig-1g.18gb-mixed":4}' | k apply -f - 2>&1)
check "a PodGroup within quota is admitted" contains "$out" "podgroup.scheduling.volcano.sh/job-mig created"
sleep 1
check "... and waits in line, reserving nothing (Pending)" usage_is "$Q-research" "NVIDIA-H200/mig-1g.18gb-mixed" reserved 0
# Volcano's enqueue: an UPDATE of the PodGroup itself (its CRD has no status subresource).
enqueue() { k -n "$NS" patch podgroup "$1" --type merge -p '{"status":{"phase":"Inqueue"}}' 2>&1; }
out=$(enqueue job-mig)
check "its enqueue (Pending -> Inqueue) is admitted" contains "$out" "podgroup.scheduling.volcano.sh/job-mig patched"
check "the reservation shows in the Queue's usage" wait_for 20 usage_is "$Q-research" "NVIDIA-H200/mig-1g.18gb-mixed" reserved 4
out=$(pg job-mig-2 '{"NVIDIA-H200/mig-1g.18gb-mixed":1}' | k apply -f - 2>&1)
check "a second job's PodGroup is admitted while the first holds every slice" contains "$out" "podgroup.scheduling.volcano.sh/job-mig-2 created"
out=$(enqueue job-mig-2)
check "... and its enqueue is held with the contract's message (the Job waits)" contains "$out" \
  "queue $Q-research has insufficient NVIDIA-H200/mig-1g.18gb-mixed quota: requested 1, in use 4 (allocated 0, pending 0, reserved 4), quota 4"
check "... with an Event on the PodGroup" wait_for 20 bash -c \
  "kubectl -n $NS get events.events.k8s.io --field-selector regarding.name=job-mig-2 -o jsonpath='{.items[*].reason}' | grep -q InsufficientCardQuota"
k -n "$NS" delete podgroup job-mig-2 --wait=false >/dev/null 2>&1

# ---- 3. Deployments, scale, bindings --------------------------------------------------
cat <<EOF | k apply -f - >/dev/null
apiVersion: apps/v1
kind: Deployment
metadata: {name: infer, namespace: $NS}
spec:
  replicas: 1
  selector: {matchLabels: {app: infer}}
  template:
    metadata:
      labels: {app: infer}
      annotations: {scheduling.volcano.sh/queue-name: $Q-research, volcano.sh/card.name: NVIDIA-H200}
    spec:
      schedulerName: $HAND_SCHED
      containers: [{name: c, image: registry.k8s.io/pause:3.9, resources: {limits: {nvidia.com/gpu: "1"}}}]
EOF
pods_of() { k -n "$NS" get pods -l app=infer -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}'; }
count_pods() { [ "$(pods_of | grep -c .)" = "$1" ]; }
export -f pods_of count_pods
check "the Deployment's pod is created by the real controllers" wait_for 30 count_pods 1
out=$(k -n "$NS" scale deployment/infer --replicas=5 2>&1)
check "kubectl scale beyond the quota is clamped with a warning" \
  contains "$out" "Warning: deployment $NS/infer scale-up from 1 to 5 replicas clamped to 3: queue $Q-research has insufficient NVIDIA-H200 quota: requested 4, in use 1 (allocated 0, pending 1, reserved 0), quota 3"
check "spec.replicas is clamped to what fits" bash -c "[ \"\$(kubectl -n $NS get deploy infer -o jsonpath='{.spec.replicas}' 2>/dev/null)\" = 3 ]"
check "the clamp is recorded as an Event on the Deployment" wait_for 20 bash -c \
  "kubectl -n $NS get events -o jsonpath='{range .items[*]}{.reason} {.involvedObject.kind} {.message}{\"\\n\"}{end}' 2>/dev/null | grep -q 'InsufficientCardQuota Deployment deployment $NS/infer scale-up from 1 to 5 replicas clamped to 3'"
check "the 3 pods are created and charged as pending" wait_for 30 bash -c "count_pods 3 && usage_is $Q-research NVIDIA-H200 pending 3"
serve D "$PORT_D" $((PORT_D + 1000)) deny
k get mutatingwebhookconfiguration "$Q" -o json | jq --arg u "https://127.0.0.1:$PORT_D/mutate" \
  '(.webhooks[] | select(.name == "scale.card-quota.volcano.sh") | .clientConfig.url) = $u' | k replace -f - >/dev/null
out=$(k -n "$NS" scale deployment/infer --replicas=4 2>&1)
check "under --scale-policy deny a scale-up past the quota is refused with the documented message" \
  contains "$out" "queue $Q-research has insufficient NVIDIA-H200 quota: requested 1, in use 3 (allocated 0, pending 3, reserved 0), quota 3"
k get mutatingwebhookconfiguration "$Q" -o json | jq --arg u "https://127.0.0.1:$PORT_A/mutate" \
  '(.webhooks[] | select(.name == "scale.card-quota.volcano.sh") | .clientConfig.url) = $u' | k replace -f - >/dev/null
kill "$PID_D" 2>/dev/null
P1=$(pods_of | head -1)
out=$(bind "$NS" "$P1" "$Q-h200")
check "binding a pod within quota succeeds" contains "$out" '"status":"Success"'
check "the binding stamps volcano.sh/card.charged on the pod" bash -c \
  "[ \"\$(kubectl -n $NS get pod $P1 -o jsonpath='{.metadata.annotations.volcano\.sh/card\.charged}' 2>/dev/null)\" = NVIDIA-H200 ]"
check "the bound pod is charged as allocated" wait_for 20 bash -c "usage_is $Q-research NVIDIA-H200 allocated 1 && usage_is $Q-research NVIDIA-H200 pending 2"
k -n "$NS" scale deployment/infer --replicas=1 >/dev/null 2>&1
check "scaling down gives the quota back (usage annotation drops)" wait_for 30 bash -c "count_pods 1 && usage_is $Q-research NVIDIA-H200 pending 0 && usage_is $Q-research NVIDIA-H200 allocated 1"

# ---- 4. Multi-model pods --------------------------------------------------------------
card_pod multi-1 "$Q-research" "NVIDIA-A100|RTX-4090" nvidia.com/gpu 1 > "$WORK/multi.yaml"
card_pod multi-2 "$Q-research" "NVIDIA-A100|RTX-4090" nvidia.com/gpu 1 >> "$WORK/multi.yaml"
out=$(k apply -f "$WORK/multi.yaml" 2>&1)
check "multi-model pods are admitted as pending A100|RTX-4090" contains "$out" "pod/multi-2 created"
out=$(bind "$NS" multi-1 "$Q-rtx")
check "a multi-model pod bound to an RTX-4090 node is charged RTX-4090" bash -c \
  "grep -q Success <<<'$out' && [ \"\$(kubectl -n $NS get pod multi-1 -o jsonpath='{.metadata.annotations.volcano\.sh/card\.charged}' 2>/dev/null)\" = RTX-4090 ]"
out=$(bind "$NS" multi-2 "$Q-h200")
check "a multi-model pod bound to a model it does not accept is refused" \
  contains "$out" "pod $NS/multi-2 accepts NVIDIA-A100|RTX-4090 but node $Q-h200 has NVIDIA-H200"

# ---- 4b. Hostile edits, Volcano's queue order, huge numbers -----------------------------
queue "$Q-label" '{"NVIDIA-H200":1}' | k apply -f - >/dev/null 2>&1
labelled_pod() { # name queue-label
  cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: $NS
  labels: {card-quota-e2e: "$RUN", volcano.sh/queue-name: $2}
  annotations: {volcano.sh/card.name: NVIDIA-H200}
spec:
  schedulerName: $HAND_SCHED
  containers: [{name: c, image: registry.k8s.io/pause:3.9, resources: {limits: {nvidia.com/gpu: "1"}}}]
EOF
}
labelled_pod lab-1 "$Q-label" | k apply -f - >/dev/null 2>&1
check "a pod labelled only volcano.sh/queue-name is stamped with that queue" bash -c \
  "[ \"\$(kubectl -n $NS get pod lab-1 -o jsonpath='{.metadata.annotations.volcano\.sh/card\.queue}' 2>/dev/null)\" = $Q-label ]"
check "... and charged to it" wait_for 20 usage_is "$Q-label" NVIDIA-H200 pending 1
out=$(labelled_pod lab-2 "$Q-label" | k apply -f - 2>&1)
check "the next labelled pod is refused by that queue's quota" \
  contains "$out" "queue $Q-label has insufficient NVIDIA-H200 quota: requested 1, in use 1 (allocated 0, pending 1, reserved 0), quota 1"
bind "$NS" lab-1 "$Q-h200" >/dev/null
out=$(k -n "$NS" annotate pod lab-1 volcano.sh/card.charged=x --overwrite 2>&1)
check "kubectl annotate card.charged on a bound pod is refused with a clear message" \
  contains "$out" "pod $NS/lab-1 has card demand: volcano.sh/card.charged cannot be changed (was \"NVIDIA-H200\", now \"x\")"
out=$(k -n "$NS" annotate pod lab-1 volcano.sh/card.queue=elsewhere --overwrite 2>&1)
check "kubectl annotate card.queue is refused too" contains "$out" "volcano.sh/card.queue cannot be changed"

queue "$Q-pg" '{"NVIDIA-H200":1}' | k apply -f - >/dev/null 2>&1
k apply -f - >/dev/null 2>&1 <<EOF
apiVersion: scheduling.volcano.sh/v1beta1
kind: PodGroup
metadata: {name: pgdel, namespace: $NS}
spec: {queue: $Q-pg, minMember: 1}
EOF
sleep 1
cat <<EOF | k apply -f - >/dev/null 2>&1
apiVersion: v1
kind: Pod
metadata:
  name: term-1
  namespace: $NS
  labels: {card-quota-e2e: "$RUN"}
  annotations: {scheduling.k8s.io/group-name: pgdel, volcano.sh/card.name: NVIDIA-H200}
spec:
  schedulerName: $HAND_SCHED
  containers: [{name: c, image: registry.k8s.io/pause:3.9, resources: {limits: {nvidia.com/gpu: "1"}}}]
EOF
bind "$NS" term-1 "$Q-h200" >/dev/null
k -n "$NS" delete pod term-1 --grace-period=600 --wait=false >/dev/null 2>&1
k -n "$NS" delete podgroup pgdel --wait=false >/dev/null 2>&1
sleep 3
check "deleting a PodGroup whose pod is terminating keeps the queue's usage" wait_for 20 bash -c \
  "[ -n \"\$(kubectl -n $NS get pod term-1 -o jsonpath='{.metadata.deletionTimestamp}' 2>/dev/null)\" ] && ! kubectl -n $NS get podgroup pgdel >/dev/null 2>&1 && usage_is $Q-pg NVIDIA-H200 allocated 1"
out=$(card_pod term-2 "$Q-pg" NVIDIA-H200 nvidia.com/gpu 1 | k apply -f - 2>&1)
check "... and the terminating pod's card still refuses the next pod" contains "$out" "queue $Q-pg has insufficient NVIDIA-H200 quota"
k -n "$NS" delete pod term-1 --grace-period=0 --force >/dev/null 2>&1

t0=$(date +%s%N)
out=$(k -n "$NS" scale deployment/infer --replicas=2147483647 2>&1)
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
log "kubectl scale --replicas=2147483647 answered in ${ms} ms"
check "kubectl scale --replicas=2147483647 is answered (clamped)" contains "$out" "scale-up from 1 to 2147483647 replicas clamped to"
check "... and the webhook keeps serving" bash -c \
  "curl -sf http://127.0.0.1:$((PORT_A + 1000))/readyz >/dev/null && kubectl -n $NS scale deployment/infer --replicas=1 >/dev/null 2>&1"
wait_for 30 count_pods 1

# ---- 4c. Steering kube-scheduler: pods pinned to the model they were admitted for ------
# The pods below use schedulerName default-scheduler: the real kube-scheduler places and
# binds them, through card-quota's binding gate, as user system:kube-scheduler.
denied_binds() {
  curl -s "http://127.0.0.1:$((PORT_A + 1000))/metrics" |
    awk '/^card_quota_admission_requests_total\{/ && /kind="binding"/ && /result="denied"/ {s += $NF} END {print s + 0}'
}
steer_pod() { # name queue card-name [extra spec yaml]
  cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: $NS
  labels: {card-quota-e2e: "$RUN", steer: "$2"}
  annotations: {scheduling.volcano.sh/queue-name: $2, volcano.sh/card.name: "$3"}
spec:
  containers: [{name: c, image: registry.k8s.io/pause:3.9, resources: {limits: {nvidia.com/gpu: "1"}}}]
---
EOF
}
bound_count() { k -n "$NS" get pods -l "steer=$1" -o json 2>/dev/null | jq '[.items[] | select((.spec.nodeName // "") != "")] | length'; }
# Every bound pod sits on a node whose product is one of the models it names.
on_named_models() {
  k -n "$NS" get pods -l "steer=$1" -o json | jq -r '.items[] | "\(.spec.nodeName) \(.metadata.annotations["volcano.sh/card.name"])"' |
    while read -r node names; do
      product=$(k get node "$node" -o jsonpath='{.metadata.labels.nvidia\.com/gpu\.product}')
      grep -qE "(^|\|)$product(\||$)" <<<"$names" || { echo "$node ($product) not in $names"; return 1; }
    done
}
export -f bound_count on_named_models
steer_run() { # label expected-pods -> logs ms and refused bindings, sets STEER_OK
  local t0 d0 ms refused
  t0=$(date +%s%N); d0=$(denied_binds)
  k apply -f "$WORK/$1.yaml" >/dev/null 2>&1
  if wait_for 10 bash -c "[ \"\$(bound_count $1)\" = $2 ]"; then STEER_OK=1; else STEER_OK=0; fi
  ms=$(( ($(date +%s%N) - t0) / 1000000 )); refused=$(( $(denied_binds) - d0 ))
  log "steer $1: $(bound_count "$1")/$2 bound in ${ms} ms, $refused refused bindings"
  STEER_REFUSED=$refused
}
for i in 1 2; do
  node "$Q-s-h200-$i" NVIDIA-H200 8 ',"cq-e2e-pool":"steer"' ''
  node "$Q-s-rtx-$i" RTX-4090 8 ',"cq-e2e-pool":"steer"' ''
done
sleep 1
queue "$Q-steer" '{"NVIDIA-H200":6,"RTX-4090":6}' | k apply -f - >/dev/null 2>&1
: > "$WORK/$Q-steer.yaml"
for i in $(seq 1 6); do
  steer_pod "s12-h-$i" "$Q-steer" NVIDIA-H200 >> "$WORK/$Q-steer.yaml"
  steer_pod "s12-r-$i" "$Q-steer" RTX-4090 >> "$WORK/$Q-steer.yaml"
done
steer_run "$Q-steer" 12
check "kube-scheduler: 12 single-model pods all bound within 10 s with 0 refused bindings" \
  bash -c "[ $STEER_OK = 1 ] && [ $STEER_REFUSED = 0 ]"
check "... each on a model it named, within quota" wait_for 20 bash -c \
  "on_named_models $Q-steer && usage_is $Q-steer NVIDIA-H200 allocated 6 && usage_is $Q-steer RTX-4090 allocated 6"

queue "$Q-steer2" '{"NVIDIA-H200":2,"RTX-4090":6}' | k apply -f - >/dev/null 2>&1
: > "$WORK/$Q-steer2.yaml"
for i in $(seq 1 8); do steer_pod "s8-$i" "$Q-steer2" "NVIDIA-H200|RTX-4090" >> "$WORK/$Q-steer2.yaml"; done
steer_run "$Q-steer2" 8
check "kube-scheduler: 8 NVIDIA-H200|RTX-4090 pods in H200=2,RTX=6 bound within 10 s, 0 refused" \
  bash -c "[ $STEER_OK = 1 ] && [ $STEER_REFUSED = 0 ]"
check "... 2 on H200 and 6 on RTX-4090 (the usage says so)" wait_for 20 bash -c \
  "on_named_models $Q-steer2 && usage_is $Q-steer2 NVIDIA-H200 allocated 2 && usage_is $Q-steer2 RTX-4090 allocated 6"
out=$(steer_pod s8-9 "$Q-steer2" "NVIDIA-H200|RTX-4090" | k apply -f - 2>&1)
check "a 9th pod over quota is still refused at CREATE" contains "$out" "queue $Q-steer2 has insufficient NVIDIA-H200|RTX-4090 quota"

queue "$Q-steer3" '{"NVIDIA-H200":2,"RTX-4090":6}' | k apply -f - >/dev/null 2>&1
cat > "$WORK/$Q-steer3.yaml" <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: steered, namespace: $NS}
spec:
  replicas: 4
  selector: {matchLabels: {steer: $Q-steer3}}
  template:
    metadata:
      labels: {steer: $Q-steer3, card-quota-e2e: "$RUN"}
      annotations: {scheduling.volcano.sh/queue-name: $Q-steer3, volcano.sh/card.name: "NVIDIA-H200|RTX-4090"}
    spec:
      nodeSelector: {cq-e2e-pool: steer}
      containers: [{name: c, image: registry.k8s.io/pause:3.9, resources: {limits: {nvidia.com/gpu: "1"}}}]
EOF
steer_run "$Q-steer3" 4
check "kube-scheduler: a Deployment of 4 such pods with an unrelated nodeSelector is bound within 10 s, 0 refused" \
  bash -c "[ $STEER_OK = 1 ] && [ $STEER_REFUSED = 0 ]"
check "... its pods keep their own selector next to the pin, and the template is not patched" bash -c \
  "on_named_models $Q-steer3 && [ \"\$(kubectl -n $NS get pods -l steer=$Q-steer3 -o json | jq '[.items[] | select(.spec.nodeSelector[\"cq-e2e-pool\"] == \"steer\" and .spec.nodeSelector[\"nvidia.com/gpu.product\"] != null)] | length')\" = 4 ] && [ \"\$(kubectl -n $NS get deploy steered -o jsonpath='{.spec.template.spec.nodeSelector}')\" = '{\"cq-e2e-pool\":\"steer\"}' ]"
k -n "$NS" delete deploy steered --wait=false >/dev/null 2>&1

node "$Q-b-h200" NVIDIA-H200 100 ',"cq-e2e-pool":"big"' ''
node "$Q-b-rtx" RTX-4090 100 ',"cq-e2e-pool":"big"' ''
sleep 1
queue "$Q-steer4" '{"NVIDIA-H200":100,"RTX-4090":100}' | k apply -f - >/dev/null 2>&1
: > "$WORK/$Q-steer4.yaml"
for i in $(seq 1 200); do
  steer_pod "s200-$i" "$Q-steer4" "NVIDIA-H200|RTX-4090" | sed 's/^spec:$/spec:\n  nodeSelector: {cq-e2e-pool: big}/' >> "$WORK/$Q-steer4.yaml"
done
t0=$(date +%s%N); d0=$(denied_binds)
k apply -f "$WORK/$Q-steer4.yaml" >/dev/null 2>&1
wait_for 90 bash -c "[ \"\$(bound_count $Q-steer4)\" = 200 ]"
ms=$(( ($(date +%s%N) - t0) / 1000000 )); refused=$(( $(denied_binds) - d0 ))
log "steer 200: $(bound_count "$Q-steer4")/200 bound ${ms} ms after the first create (creates included), $refused refused bindings"
check "kube-scheduler: 200 NVIDIA-H200|RTX-4090 pods all bound with 0 refused bindings" bash -c \
  "[ \"\$(bound_count $Q-steer4)\" = 200 ] && [ $refused = 0 ]"
check "... 100 on each model, each on a model it named" wait_for 30 bash -c \
  "on_named_models $Q-steer4 && usage_is $Q-steer4 NVIDIA-H200 allocated 100 && usage_is $Q-steer4 RTX-4090 allocated 100"

# ---- 4d. GPU pods as most are written: no annotation, any scheduler, a second vendor ----
# A Deployment of plain `nvidia.com/gpu: 1` pods (no card.name) in a queue whose quota
# names two models, RTX first: kube-scheduler binds each on the model it was pinned to,
# RTX then H200 in the quota's order, and the queue's quota is the line.
for i in 1 2; do
  node "$Q-p-h200-$i" NVIDIA-H200 1 ',"cq-e2e-pool":"plain"' ''
  node "$Q-p-rtx-$i" RTX-4090 1 ',"cq-e2e-pool":"plain"' ''
done
sleep 1
queue "$Q-plain" '{"RTX-4090":2,"NVIDIA-H200":2}' | k apply -f - >/dev/null 2>&1
plain_deploy() { # name queue replicas
  cat <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: $1, namespace: $NS}
spec:
  replicas: $3
  selector: {matchLabels: {plain: $1}}
  template:
    metadata:
      labels: {plain: $1, card-quota-e2e: "$RUN"}
      annotations: {scheduling.volcano.sh/queue-name: $2}
    spec:
      nodeSelector: {cq-e2e-pool: plain}
      containers: [{name: c, image: registry.k8s.io/pause:3.9, resources: {limits: {nvidia.com/gpu: "1"}}}]
EOF
}
plain_bound() { k -n "$NS" get pods -l "plain=$1" -o json 2>/dev/null | jq '[.items[] | select((.spec.nodeName // "") != "")] | length'; }
# Each bound pod's node has the product of its pin, and its card.name lists the queue's models.
on_pinned_models() {
  k -n "$NS" get pods -l "plain=$1" -o json | jq -r '.items[] | select((.spec.nodeName // "") != "") | "\(.spec.nodeName) \(.spec.nodeSelector["nvidia.com/gpu.product"]) \(.metadata.annotations["volcano.sh/card.name"])"' |
    while read -r node pin names; do
      product=$(k get node "$node" -o jsonpath='{.metadata.labels.nvidia\.com/gpu\.product}')
      [ "$product" = "$pin" ] && [ "$names" = "RTX-4090|NVIDIA-H200" ] || { echo "$node ($product) pin $pin names $names"; return 1; }
    done
}
export -f plain_bound on_pinned_models
plain_deploy plain "$Q-plain" 2 | k apply -f - >/dev/null 2>&1
check "plain GPU pods: a Deployment of 2 without card.name is bound, both on RTX-4090 (first in the quota)" wait_for 30 bash -c \
  "[ \"\$(plain_bound plain)\" = 2 ] && on_pinned_models plain && usage_is $Q-plain RTX-4090 allocated 2"
k -n "$NS" scale deployment plain --replicas 4 >/dev/null 2>&1
check "... scaled to 4: the next 2 go to NVIDIA-H200, each bound on the model it was pinned to" wait_for 30 bash -c \
  "[ \"\$(plain_bound plain)\" = 4 ] && on_pinned_models plain && usage_is $Q-plain RTX-4090 allocated 2 && usage_is $Q-plain NVIDIA-H200 allocated 2"
plain_pod() { # name queue [extra spec json]
  k -n "$NS" run "$1" --image=registry.k8s.io/pause:3.9 --restart=Never --labels="card-quota-e2e=$RUN" \
    --overrides="{\"apiVersion\":\"v1\",\"metadata\":{\"annotations\":{\"scheduling.volcano.sh/queue-name\":\"$2\"}},\"spec\":{\"schedulerName\":\"$HAND_SCHED\",\"containers\":[{\"name\":\"$1\",\"image\":\"registry.k8s.io/pause:3.9\",\"resources\":{\"limits\":{\"nvidia.com/gpu\":\"1\"}}}]${3:+,$3}}}" 2>&1
}
out=$(plain_pod plain-5 "$Q-plain")
check "... a fifth plain pod is refused at the quota" contains "$out" \
  "queue $Q-plain has insufficient RTX-4090|NVIDIA-H200 quota: requested 1, in use 4"
out=$(k -n "$NS" scale deployment plain --replicas 5 2>&1)
check "... and a scale-up to 5 goes through clamped, with a warning" contains "$out" "scaled"
check "... to 4 replicas" [ "$(k -n "$NS" get deploy plain -o jsonpath='{.spec.replicas}')" = 4 ]
k -n "$NS" delete deploy plain --wait=false >/dev/null 2>&1

# A group cap: 2 of each of three models, 3 in all ("*"). A Deployment of 5 plain pods
# stops at 3 with room left on every model; the rest are refused naming the cap.
node "$Q-c-h200" NVIDIA-H200 2 ',"cq-e2e-pool":"cap"' ''
node "$Q-c-rtx" RTX-4090 2 ',"cq-e2e-pool":"cap"' ''
node "$Q-c-a100" NVIDIA-A100 2 ',"cq-e2e-pool":"cap"' ''
sleep 1
queue "$Q-cap" '{"NVIDIA-H200":2,"RTX-4090":2,"NVIDIA-A100":2,"*":3}' | k apply -f - >/dev/null 2>&1
sleep 1
plain_deploy capped "$Q-cap" 5 | sed 's/cq-e2e-pool: plain/cq-e2e-pool: cap/' | k apply -f - >/dev/null 2>&1
# A controller's FailedCreate Event in $NS quotes MESSAGE.
failed_create_says() {
  kubectl -n "$NS" get events -o json | jq -e --arg q "$1" \
    'any(.items[]; .reason == "FailedCreate" and (.message | contains($q)))' >/dev/null
}
export -f failed_create_says
check "group cap: a Deployment of 5 plain pods over three models stops at the * cap of 3, all bound" wait_for 30 bash -c \
  "[ \"\$(plain_bound capped)\" = 3 ] && [ \"\$(kubectl -n $NS get pods -l plain=capped -o name | wc -l)\" = 3 ] && failed_create_says 'queue $Q-cap has insufficient * quota (a group cap)'"
check "... the queue's usage has a row for the cap: 3 of 3 allocated" wait_for 20 bash -c \
  "usage_is $Q-cap '*' allocated 3 && usage_is $Q-cap '*' quota 3"
k -n "$NS" delete deploy capped --wait=false >/dev/null 2>&1

# Pods created at the same moment through one replica spread over the models: its
# mutating call counts the pins it chose whose charge is not recorded yet. Pinned alike to
# the first model, all but 5 would be refused at the validating call with H200s free.
queue "$Q-spread" '{"RTX-4090":5,"NVIDIA-H200":5}' | k apply -f - >/dev/null 2>&1
sleep 1
"$BURST_BIN" --scheduler-name "$HAND_SCHED" --pods 20 --concurrency 20 --rounds 1 --keep \
  --queue "$Q-spread" --card 'RTX-4090|NVIDIA-H200' --case "a=$NS" > "$WORK/spread.out" 2>&1
spread_pins() {
  k -n "$NS" get pods -l card-quota-burst=1 -o json | jq -r '[.items[].spec.nodeSelector["nvidia.com/gpu.product"]] | group_by(.) | map("\(.[0])=\(length)") | join(" ")'
}
CONTEXT="pins: $(spread_pins); $(grep -E 'TOTAL|first' "$WORK/spread.out" | tr '\n' ';')"
check "20 pods of RTX-4090|NVIDIA-H200 created at once through one replica: 10 created, 5 pinned to each model" \
  [ "$(spread_pins)" = "NVIDIA-H200=5 RTX-4090=5" ]
k -n "$NS" delete pods -l card-quota-burst=1 --wait=false >/dev/null 2>&1

# The same under warn: admitted with the warning, the Event and the metric.
k apply -f - >/dev/null <<EOF
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata:
  name: $Q-plainwarn
  labels: {card-quota-e2e: "$RUN"}
  annotations: {volcano.sh/card.quota: '{"RTX-4090":1}', volcano.sh/card.enforcement: warn}
spec: {weight: 1}
EOF
sleep 1
warned0=$(curl -s "http://127.0.0.1:$((PORT_A + 1000))/metrics" | awk '/^card_quota_admission_requests_total\{/ && /result="warned"/ {s += $NF} END {print s + 0}')
plain_pod pw-1 "$Q-plainwarn" >/dev/null
out=$(plain_pod pw-2 "$Q-plainwarn")
check "warn: a plain pod past its queue's quota is created" contains "$out" "pod/pw-2 created"
check "... with a warning naming the enforcement that applied" contains "$out" \
  "Warning: card-quota admitted this because queue $Q-plainwarn's enforcement is warn (its volcano.sh/card.enforcement annotation); under deny: queue $Q-plainwarn has insufficient RTX-4090 quota: requested 1, in use 1"
check "... an Event CardQuotaWouldRefuse on the pod, usage past the quota, the warned metric" wait_for 20 bash -c \
  "kubectl -n $NS get events.events.k8s.io --field-selector regarding.name=pw-2 -o jsonpath='{.items[*].reason}' | grep -q CardQuotaWouldRefuse && usage_is $Q-plainwarn RTX-4090 pending 2 && [ \"\$(curl -s http://127.0.0.1:$((PORT_A + 1000))/metrics | awk '/^card_quota_admission_requests_total\\{/ && /result=\"warned\"/ {s += \$NF} END {print s + 0}')\" -gt $warned0 ]"
k -n "$NS" delete pod pw-1 pw-2 --wait=false >/dev/null 2>&1

# A pod created on its node (the GPU Operator's validators) is charged on that node's model.
queue "$Q-named" '{"RTX-4090":1}' | k apply -f - >/dev/null 2>&1
sleep 1
out=$(plain_pod named-1 "$Q-named" "\"nodeName\":\"$Q-rtx\"")
check "a plain pod with spec.nodeName is created" contains "$out" "pod/named-1 created"
check "... and charged on its node's model" wait_for 20 usage_is "$Q-named" RTX-4090 allocated 1
out=$(plain_pod named-2 "$Q-named" "\"nodeName\":\"$Q-rtx\"")
check "... a second one on that model is refused at the queue's quota" contains "$out" \
  "queue $Q-named has insufficient RTX-4090 quota: requested 1, in use 1 (allocated 1"

# A second vendor, gated because the install lists it (--card-resource example.com/npu).
k create -f - >/dev/null <<EOF
{"apiVersion":"v1","kind":"Node","metadata":{"name":"$Q-npu","labels":{"card-quota-e2e":"$RUN","example.com/npu.product":"X-NPU"}}}
EOF
for try in 1 2 3 4 5 6 7 8; do
  k get --raw "/api/v1/nodes/$Q-npu" | jq '.status = {capacity: {cpu: "64", memory: "512Gi", pods: "500", "example.com/npu": "4"}, allocatable: {cpu: "64", memory: "512Gi", pods: "500", "example.com/npu": "4"}, conditions: [{type: "Ready", status: "True", reason: "E2E", message: "fake node"}]}' > "$WORK/node-npu.json"
  k replace --raw "/api/v1/nodes/$Q-npu/status" -f "$WORK/node-npu.json" >/dev/null 2>&1 && break
  sleep 0.3
done
queue "$Q-npu" '{"X-NPU":1}' | k apply -f - >/dev/null 2>&1
sleep 1
npu_pod() {
  k -n "$NS" run "$1" --image=registry.k8s.io/pause:3.9 --restart=Never --labels="card-quota-e2e=$RUN" \
    --overrides="{\"apiVersion\":\"v1\",\"metadata\":{\"annotations\":{\"scheduling.volcano.sh/queue-name\":\"$Q-npu\"}},\"spec\":{\"schedulerName\":\"$HAND_SCHED\",\"containers\":[{\"name\":\"$1\",\"image\":\"registry.k8s.io/pause:3.9\",\"resources\":{\"limits\":{\"example.com/npu\":\"1\"}}}]}}" 2>&1
}
out=$(npu_pod npu-1)
check "a second vendor configured at install: its plain pod is created" contains "$out" "pod/npu-1 created"
check "... pinned to its model by the vendor's product label" \
  [ "$(k -n "$NS" get pod npu-1 -o jsonpath='{.spec.nodeSelector.example\.com/npu\.product}')" = X-NPU ]
out=$(npu_pod npu-2)
check "... and the next is refused at the queue's X-NPU quota" contains "$out" "queue $Q-npu has insufficient X-NPU quota: requested 1, in use 1"

# ---- 4e. GPUs through DRA: ResourceClaims, the real kube-scheduler, fake slices ----------
# No driver: nothing runs. Two nodes publish devices in ResourceSlices as NVIDIA's DRA
# driver writes them (no GPU labels, no extended resources); kube-scheduler allocates them.
E2E_LABEL=card-quota-e2e=$RUN
e2e_dra_node "$Q-dra-h200"; e2e_dra_slice "$Q-dra-h200" "NVIDIA H200" 4
e2e_dra_node "$Q-dra-rtx"; e2e_dra_slice "$Q-dra-rtx" "NVIDIA GeForce RTX 4090" 2
e2e_dra_class "$NS"
queue "$Q-dra" '{"NVIDIA-H200":2}' | k apply -f - >/dev/null
dra_pod_spec() { # scheduler: a pod whose only GPU comes from a claim made from one-gpu
  echo "{schedulerName: $1, containers: [{name: c, image: registry.k8s.io/pause:3.9, resources: {claims: [{name: gpu}]}}], resourceClaims: [{name: gpu, resourceClaimTemplateName: one-gpu}]}"
}
sleep 1
t0=$(date +%s%N)
k apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: dra-train, namespace: $NS, labels: {card-quota-e2e: "$RUN"}}
spec:
  replicas: 3
  selector: {matchLabels: {app: dra-train}}
  template:
    metadata: {labels: {app: dra-train, card-quota-e2e: "$RUN"}, annotations: {scheduling.volcano.sh/queue-name: $Q-dra}}
    spec: $(dra_pod_spec default-scheduler)
EOF
dra_bound() { # label-selector node -> pods bound there
  k -n "$NS" get pods -l "$1" -o json | jq --arg n "$2" '[.items[] | select(.spec.nodeName == $n)] | length'
}
export -f dra_bound
if wait_for 30 bash -c "[ \"\$(dra_bound app=dra-train $Q-dra-h200)\" = 2 ]"; then
  log "DRA: 2 claim pods bound on the H200 node $(( ($(date +%s%N) - t0) / 1000000 )) ms after the Deployment"
fi
check "a Deployment claiming GPUs through a template: two pods bound by kube-scheduler on the H200 node" \
  [ "$(dra_bound app=dra-train "$Q-dra-h200")" = 2 ]
check "... none on the RTX 4090 node, which the claims' DeviceClass also selects" \
  [ "$(dra_bound app=dra-train "$Q-dra-rtx")" = 0 ]
pinned_claims() {
  k -n "$NS" get resourceclaims -o json | jq '[.items[] | select(.metadata.annotations["volcano.sh/card.pinned"] // "" | startswith("NVIDIA-H200: the models pod"))
    | select(.spec.devices.requests[0].exactly.selectors[0].cel.expression | contains("NVIDIA H200"))] | length'
}
check "... their claims were pinned to NVIDIA-H200 at creation (a CEL selector on the request)" [ "$(pinned_claims)" = 2 ]
dra_refused() {
  k -n "$NS" get events -o json | jq -e --arg m "queue $Q-dra has insufficient NVIDIA-H200 quota: requested 1, in use 2" \
    'any(.items[]; .reason == "FailedCreate" and (.message | contains($m)))' >/dev/null
}
check "... and the third pod is refused at the queue's H200 quota (the ReplicaSet's FailedCreate)" wait_for 20 dra_refused
check "... the Queue shows 2 H200 allocated from the claims' devices" wait_for 20 usage_is "$Q-dra" NVIDIA-H200 allocated 2

# A claim pinned to H200 whose allocation says an RTX 4090: the binding is refused.
queue "$Q-dra2" '{"NVIDIA-H200":1}' | k apply -f - >/dev/null
sleep 1
k -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: dra-hand, labels: {card-quota-e2e: "$RUN"}, annotations: {scheduling.volcano.sh/queue-name: $Q-dra2}}
spec: $(dra_pod_spec "$HAND_SCHED")
EOF
hand_claim() { k -n "$NS" get pod dra-hand -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}'; }
wait_for 20 bash -c "[ -n \"\$(kubectl -n $NS get pod dra-hand -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')\" ]"
HAND_CLAIM=$(hand_claim)
HAND_UID=$(k -n "$NS" get pod dra-hand -o jsonpath='{.metadata.uid}')
# The allocation as a scheduler writes it (on HAND_POOL's device HAND_DEVICE);
# kube-controller-manager also writes a new claim (its finalizer): retry on a
# resourceVersion conflict. Arguments: whose write it is (--as).
HAND_POOL=$Q-dra-rtx HAND_DEVICE=gpu-0
write_hand_allocation() {
  local try
  for try in 1 2 3 4 5 6 7 8; do
    k -n "$NS" get resourceclaim "$HAND_CLAIM" -o json | jq --arg n "$HAND_POOL" --arg d "$HAND_DEVICE" --arg uid "$HAND_UID" \
      '.status = {allocation: {devices: {results: [{request: "gpu", driver: "gpu.nvidia.com", pool: $n, device: $d}]},
         nodeSelector: {nodeSelectorTerms: [{matchFields: [{key: "metadata.name", operator: "In", values: [$n]}]}]}},
       reservedFor: [{resource: "pods", name: "dra-hand", uid: $uid}]}' > "$WORK/hand-claim.json"
    k replace "$@" --raw "/apis/resource.k8s.io/v1/namespaces/$NS/resourceclaims/$HAND_CLAIM/status" -f "$WORK/hand-claim.json" \
      >/dev/null 2>"$WORK/hand-claim.err" && return 0
    grep -q "the object has been modified" "$WORK/hand-claim.err" || return 1
    log "writing the allocation of $HAND_CLAIM lost a conflict (try $try)"
    sleep 0.3
  done
  return 1
}
# Written by kube-scheduler (a binder): refused at the write, before any binding.
write_hand_allocation --as=system:kube-scheduler
check "an RTX 4090 allocation written by kube-scheduler for a pod admitted for H200 is refused at the write" \
  grep -qF "pod $NS/dra-hand accepts NVIDIA-H200 but node $Q-dra-rtx has NVIDIA-GeForce-RTX-4090" "$WORK/hand-claim.err"
log "kube-scheduler's allocation write answered: $(cat "$WORK/hand-claim.err")"
# Written by anyone else (an admin, a scheduler whose bindings are not checked): the
# allocation is where the model is chosen and charged, so it is checked whoever writes it.
write_hand_allocation
check "... and so is the same allocation written by a user outside the binders" \
  grep -qF "pod $NS/dra-hand accepts NVIDIA-H200 but node $Q-dra-rtx has NVIDIA-GeForce-RTX-4090" "$WORK/hand-claim.err"
check "... and its queue is charged nothing" [ "$(usage_field "$Q-dra2" NVIDIA-H200 allocated)" = 0 ]
# An H200 allocation written by hand for the same pod, which no scheduler binds: its
# devices are taken, so the pod counts bound from then on, and the allocation's ledger
# entry is pruned where card-quota's claim cache shows it (the claims' stream is in the
# ledger's watermark).
HAND_POOL=$Q-dra-h200 HAND_DEVICE=gpu-3
write_hand_allocation
check "an H200 allocation written by hand for the pod admitted for H200 is admitted" \
  [ ! -s "$WORK/hand-claim.err" ]
check "... the pod, still unbound, counts its H200 allocated in its queue" \
  wait_for 20 bash -c "usage_is $Q-dra2 NVIDIA-H200 allocated 1 && [ -z \"\$(kubectl -n $NS get pod dra-hand -o jsonpath='{.spec.nodeName}')\" ]"
ledger_claims_mark() { k -n "$SYS" get configmap "card-quota-ledger.$1" -o jsonpath='{.data.ledger}' 2>/dev/null | jq '.watermark.claims // 0' 2>/dev/null || echo 0; }
export -f ledger_claims_mark
check "... and its charge leaves the ledger at the claim's version (the watermark's claims mark)" \
  wait_for 30 bash -c "[ \"\$(ledger_len $Q-dra2)\" = 0 ] && [ \"\$(ledger_claims_mark $Q-dra2)\" -gt 0 ]"

# A claim shared by two pods: counted once.
queue "$Q-dra3" '{"NVIDIA-H200":1}' | k apply -f - >/dev/null
sleep 1
k -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: dra-shared, labels: {card-quota-e2e: "$RUN"}}
spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com, selectors: [{cel: {expression: "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"}}]}}]}}
EOF
sleep 1
for i in 1 2; do
  k -n "$NS" apply -f - >/dev/null 2>"$WORK/shared-$i.err" <<EOF
apiVersion: v1
kind: Pod
metadata: {name: dra-shared-$i, labels: {card-quota-e2e: "$RUN", dra: shared}, annotations: {scheduling.volcano.sh/queue-name: $Q-dra3}}
spec: {containers: [{name: c, image: registry.k8s.io/pause:3.9, resources: {claims: [{name: gpu}]}}], resourceClaims: [{name: gpu, resourceClaimName: dra-shared}]}
EOF
done
check "a claim shared by two pods in a queue of one H200: both bound" \
  wait_for 30 bash -c "[ \"\$(dra_bound dra=shared $Q-dra-h200)\" = 2 ]"
check "... and counted once (1 H200 allocated)" wait_for 20 usage_is "$Q-dra3" NVIDIA-H200 allocated 1

# A claim of any GPU shared by a pod named for the H200 and one named for the RTX 4090:
# whichever kube-scheduler places first gets the claim allocated on its model; the
# other's reservation of that allocation is refused (it would run on a model it does
# not accept), so it stays pending and is never bound on the other model. Both are
# created behind a scheduling gate, so that both exist before the claim is allocated
# (created after, the second would be refused at its CREATE instead).
queue "$Q-dra5" '{"NVIDIA-H200":1,"NVIDIA-GeForce-RTX-4090":1}' | k apply -f - >/dev/null
sleep 1
k -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: dra-mixed, labels: {card-quota-e2e: "$RUN"}}
spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}
EOF
sleep 1
for m in NVIDIA-H200 NVIDIA-GeForce-RTX-4090; do
  k -n "$NS" apply -f - >/dev/null 2>"$WORK/mixed-$m.err" <<EOF
apiVersion: v1
kind: Pod
metadata: {name: dra-mixed-$(echo "$m" | tr 'A-Z' 'a-z'), labels: {card-quota-e2e: "$RUN", dra: mixed}, annotations: {scheduling.volcano.sh/queue-name: $Q-dra5, volcano.sh/card.name: $m}}
spec: {schedulingGates: [{name: e2e.card-quota/hold}], containers: [{name: c, image: registry.k8s.io/pause:3.9, resources: {claims: [{name: gpu}]}}], resourceClaims: [{name: gpu, resourceClaimName: dra-mixed}]}
EOF
done
for m in nvidia-h200 nvidia-geforce-rtx-4090; do
  k -n "$NS" patch pod "dra-mixed-$m" --type=json -p='[{"op": "remove", "path": "/spec/schedulingGates"}]' >/dev/null
done
mixed_bound() { k -n "$NS" get pods -l dra=mixed -o json | jq '[.items[] | select(.spec.nodeName != null)] | length'; }
mixed_refused() {
  k -n "$NS" get events -o json \
    | jq -e --arg c "ResourceClaim $NS/dra-mixed is allocated on" 'any(.items[]; (.involvedObject.name | startswith("dra-mixed-")) and (.message | contains($c)))' >/dev/null
}
check "a claim shared by pods named for different models: the second's reservation is refused with the message" wait_for 40 mixed_refused
check "... and only one of them is bound" [ "$(mixed_bound)" = 1 ]
log "dra-mixed pods: $(k -n "$NS" get pods -l dra=mixed -o jsonpath='{range .items[*]}{.metadata.name}={.spec.nodeName} {end}')"
k -n "$NS" delete pod -l dra=mixed --grace-period=0 --force >/dev/null 2>&1

# Warn: a queue trialling its quota admits a claim pod past it, with a warning.
queue "$Q-dra-warn" '{"NVIDIA-H200":0}' | sed 's|  annotations:|  annotations:\n    volcano.sh/card.enforcement: warn|' | k apply -f - >/dev/null
sleep 1
out=$(k -n "$NS" apply -f - 2>&1 <<EOF
apiVersion: v1
kind: Pod
metadata: {name: dra-warn, labels: {card-quota-e2e: "$RUN"}, annotations: {scheduling.volcano.sh/queue-name: $Q-dra-warn}}
spec: $(dra_pod_spec "$HAND_SCHED")
EOF
)
warned_created() { contains "$out" "pod/dra-warn created" && contains "$out" "insufficient NVIDIA-H200 quota"; }
check "under warn a claim pod past its queue's quota is created, with the quota's warning" warned_created

# A template and the pod that uses it in one file: the pod waits for the template to
# reach card-quota's cache instead of being refused.
queue "$Q-dra4" '{"NVIDIA-H200":1}' | k apply -f - >/dev/null
sleep 1
out=$(k -n "$NS" apply -f - 2>&1 <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: together, labels: {card-quota-e2e: "$RUN"}}
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}}
---
apiVersion: v1
kind: Pod
metadata: {name: dra-together, labels: {card-quota-e2e: "$RUN"}, annotations: {scheduling.volcano.sh/queue-name: $Q-dra4}}
spec: {schedulerName: $HAND_SCHED, containers: [{name: c, image: registry.k8s.io/pause:3.9, resources: {claims: [{name: gpu}]}}], resourceClaims: [{name: gpu, resourceClaimTemplateName: together}]}
EOF
)
together_created() { contains "$out" "pod/dra-together created"; }
check "a template and its pod in one kubectl apply: the pod is created" together_created
check "... and counted in its queue" wait_for 10 usage_is "$Q-dra4" NVIDIA-H200 pending 1

# Deallocation gives the cards back.
k -n "$NS" scale deployment dra-train --replicas=0 >/dev/null
k -n "$NS" delete pod -l app=dra-train --grace-period=0 --force >/dev/null 2>&1
check "the Deployment's pods gone, the queue's H200 are free again" wait_for 30 usage_is "$Q-dra" NVIDIA-H200 allocated 0
k -n "$NS" delete pod dra-hand dra-warn dra-together dra-shared-1 dra-shared-2 --grace-period=0 --force >/dev/null 2>&1

# ---- 4e'. A node's slice joining under many claims: admissions go on -------------------------
# One slice's event costs its own devices, not every claim against every device (3 s at
# 64 nodes and 500 claims before). 1,000 claims, each with a selector of its own, and 48
# nodes' slices of 8 GPUs with a uuid each (as NVIDIA's driver publishes them: no two
# alike); pod reviews are sent straight to a replica (dry runs, timed by curl), one after
# another, while one more node's slice joins and then leaves, and then while a tenant
# creates a claim whose selector costs 10,000 steps per device (within Kubernetes' cost
# limit, seconds over every device), and while an admin creates and changes a DeviceClass
# of the NVIDIA driver's cards (every demand read again): counted by their watchers,
# without the lock.
many_slices=48 many_claims=1000
many_slice() { # index -> a ResourceSlice of 8 H200 with uuids
  jq -cn --arg n "$Q-many-$1" --arg run "$RUN" '{apiVersion: "resource.k8s.io/v1", kind: "ResourceSlice",
    metadata: {name: $n, labels: {"card-quota-e2e": $run}},
    spec: {driver: "gpu.nvidia.com", nodeName: $n, pool: {name: $n, generation: 1, resourceSliceCount: 1},
      devices: [range(8) as $i | {name: "gpu-\($i)", attributes: {type: {string: "gpu"},
        productName: {string: "NVIDIA H200"}, uuid: {string: "GPU-\($n)-\($i)"}, index: {int: $i}}}]}}'
}
{ for i in $(seq 1 "$many_slices"); do many_slice "$i"; done; } | jq -s '{apiVersion: "v1", kind: "List", items: .}' > "$WORK/many-slices.json"
jq -n --arg ns "$NS" --arg run "$RUN" --argjson n "$many_claims" '{apiVersion: "v1", kind: "List", items: [range($n) as $i |
  {apiVersion: "resource.k8s.io/v1", kind: "ResourceClaim", metadata: {name: "many-\($i)", namespace: $ns, labels: {"card-quota-e2e": $run}},
   spec: {devices: {requests: [{name: "gpu", exactly: {deviceClassName: "gpu.nvidia.com",
     selectors: [{cel: {expression: "device.attributes[\"gpu.nvidia.com\"].index != \(1000 + $i)"}}]}}]}}}]}' > "$WORK/many-claims.json"
t0=$(date +%s)
k create -f "$WORK/many-slices.json" >/dev/null && k create -f "$WORK/many-claims.json" >/dev/null
log "DRA at size: $many_slices slices of 8 GPUs and $many_claims claims created in $(( $(date +%s) - t0 )) s"
# A claim pod's review, as the API server sends it (a dry run: nothing is charged).
jq --arg ns "$NS" --arg q "$Q-dra" '.request.namespace = $ns | .request.dryRun = true | .request.name = "timed"
  | .request.object = {apiVersion: "v1", kind: "Pod", metadata: {name: "timed", namespace: $ns,
      annotations: {"scheduling.volcano.sh/queue-name": $q}},
      spec: {containers: [{name: "c", image: "x", resources: {claims: [{name: "gpu"}]}}],
        resourceClaims: [{name: "gpu", resourceClaimTemplateName: "one-gpu"}]}}' \
  "$REPO/tests/fixtures/apiserver-pod-create-review.json" > "$WORK/timed-review.json"
if [ -r "$WH_CRT" ] && [ -r "$WH_KEY" ]; then
  wait_for 30 bash -c "curl -s --cacert '$WORK/certs/ca.crt' --cert '$WH_CRT' --key '$WH_KEY' -H 'content-type: application/json' \
    --data-binary @'$WORK/timed-review.json' https://127.0.0.1:$PORT_A/validate | jq -e '.response.allowed' >/dev/null" || true
  timed_reviews() { # seconds -> one line per review: seconds taken, HTTP code
    local end=$(( $(date +%s) + $1 ))
    while [ "$(date +%s)" -lt "$end" ]; do
      curl -s -o /dev/null -w '%{time_total} %{http_code}\n' --max-time 15 --cacert "$WORK/certs/ca.crt" --cert "$WH_CRT" --key "$WH_KEY" \
        -H 'content-type: application/json' --data-binary @"$WORK/timed-review.json" "https://127.0.0.1:$PORT_A/validate"
    done
  }
  costly=$(jq -cn --arg ns "$NS" --arg run "$RUN" '[range(100)] as $l | {apiVersion: "resource.k8s.io/v1", kind: "ResourceClaim",
    metadata: {name: "costly", namespace: $ns, labels: {"card-quota-e2e": $run}},
    spec: {devices: {requests: [{name: "gpu", exactly: {deviceClassName: "gpu.nvidia.com",
      selectors: [{cel: {expression: "\($l | tostring).all(i, \($l | tostring).all(j, device.attributes[\"gpu.nvidia.com\"].productName.size() + i + j >= 0))"}}]}}]}}}')
  # An admin's own class selecting the NVIDIA driver's H200s (a card class: every demand
  # is read again), then changed: counted by the DeviceClass watcher, without the lock.
  nvidia_class() { # suffix of the expression -> NVIDIA's class as this e2e made it
    jq -cn --arg run "$RUN" --arg s "$1" '{apiVersion: "resource.k8s.io/v1", kind: "DeviceClass",
      metadata: {name: "gpu.nvidia.com", labels: {"card-quota-e2e": $run}},
      spec: {selectors: [{cel: {expression: ("device.driver == '"'"'gpu.nvidia.com'"'"' && device.attributes['"'"'gpu.nvidia.com'"'"'].type == '"'"'gpu'"'"'" + $s)}}]}}'
  }
  admin_class() { # expression -> the class
    jq -cn --arg n "$Q-admin-h200" --arg run "$RUN" --arg e "$1" '{apiVersion: "resource.k8s.io/v1", kind: "DeviceClass",
      metadata: {name: $n, labels: {"card-quota-e2e": $run}}, spec: {selectors: [{cel: {expression: $e}}]}}'
  }
  timed_reviews 20 > "$WORK/timed.txt" &
  timer=$!
  sleep 2
  many_slice join | k create -f - >/dev/null
  sleep 2
  k delete resourceslice "$Q-many-join" >/dev/null
  sleep 1
  echo "$costly" | k create -f - >/dev/null || log "the costly claim was not created"
  sleep 2
  admin_class "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'" |
    k create -f - >/dev/null || log "the admin's DeviceClass was not created"
  sleep 2
  admin_class "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].index < 4" |
    k replace -f - >/dev/null || log "the admin's DeviceClass was not changed"
  # NVIDIA's class, which every claim here asks through, rewritten to an equivalent
  # selector: every claim's requirement is counted again with it.
  sleep 2
  nvidia_class " && true" | k replace -f - >/dev/null || log "NVIDIA's DeviceClass was not rewritten"
  wait "$timer"
  k delete deviceclass "$Q-admin-h200" >/dev/null 2>&1
  nvidia_class "" | k replace -f - >/dev/null
  read -r n slowest ok < <(awk '{n++; if ($1 > m) m = $1; if ($2 == 200) ok++} END {printf "%d %.3f %d\n", n, m, ok}' "$WORK/timed.txt")
  log "DRA at size: $n pod reviews over 20 s while a node's slice joined and left, a costly claim came, an admin's DeviceClass came and changed and NVIDIA's was rewritten: slowest ${slowest} s, $ok answered 200"
  CONTEXT="slowest review ${slowest} s of $n; $(sort -rn "$WORK/timed.txt" | head -3 | tr '\n' ';')"
  check "a node's slice joining and leaving beside $many_claims claims and $many_slices nodes, then a costly claim, an admin's DeviceClass created and changed and NVIDIA's rewritten: every pod review answered within 1 s" \
    awk -v s="$slowest" -v n="$n" -v ok="$ok" 'BEGIN {exit !(s < 1.0 && n >= 10 && ok == n)}'
  # The costly claim is accepted by Kubernetes (its cost is within Kubernetes' own limit)
  # and refused by card-quota before it runs: a pod using it is told why.
  jq '.request.object.spec.resourceClaims = [{name: "gpu", resourceClaimName: "costly"}]' "$WORK/timed-review.json" > "$WORK/costly-review.json"
  costly_refused() {
    curl -s --cacert "$WORK/certs/ca.crt" --cert "$WH_CRT" --key "$WH_KEY" -H 'content-type: application/json' \
      --data-binary @"$WORK/costly-review.json" "https://127.0.0.1:$PORT_A/validate" |
      jq -e '.response.allowed == false and (.response.status.message | contains("past card-quota'"'"'s limit of 10000"))' >/dev/null
  }
  check "... the costly claim's selector is refused before it runs (its estimated cost past card-quota's limit), a pod using it told why" \
    wait_for 20 costly_refused
else
  log "SKIP the timed reviews: no client certificate signed by the cluster CA at $WH_CRT"
fi
k delete -f "$WORK/many-claims.json" -f "$WORK/many-slices.json" --wait=false >/dev/null 2>&1
k -n "$NS" delete resourceclaim costly --wait=false >/dev/null 2>&1

# ---- 4f. Plain GPU pods served through DRA (Kubernetes 1.37+) -----------------------------
# A DeviceClass with extendedResourceName nvidia.com/gpu: kube-scheduler serves a pod
# asking nvidia.com/gpu: 1 with a DRA device on a node whose allocatable does not list
# it, making a ResourceClaim for the pod. Two such nodes carry GPU Feature Discovery's
# product label (H200, RTX 4090), a third none (B200).
if [ "$(k version -o json | jq -r '.serverVersion.minor | tonumber? // 0')" -ge 37 ]; then
  er_node() { # name [product-label]
    e2e_dra_node "$1"
    k label node "$1" cq-e2e-pool=er ${2:+nvidia.com/gpu.product=$2} >/dev/null
  }
  er_node "$Q-er-h200" NVIDIA-H200; e2e_dra_slice "$Q-er-h200" "NVIDIA H200" 2 "e2e: {string: er}"
  er_node "$Q-er-rtx" NVIDIA-GeForce-RTX-4090; e2e_dra_slice "$Q-er-rtx" "NVIDIA GeForce RTX 4090" 2 "e2e: {string: er}"
  er_node "$Q-er-b200" ""; e2e_dra_slice "$Q-er-b200" "NVIDIA B200" 2 "e2e: {string: er}"
  k apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: cq-e2e-gpu-er, labels: {card-quota-e2e: "$RUN"}}
spec:
  extendedResourceName: nvidia.com/gpu
  selectors: [{cel: {expression: "device.driver == 'gpu.nvidia.com' && 'e2e' in device.attributes['gpu.nvidia.com'] && device.attributes['gpu.nvidia.com'].e2e == 'er'"}}]
EOF
  queue "$Q-er" '{"NVIDIA-GeForce-RTX-4090":1,"NVIDIA-H200":1,"NVIDIA-B200":1}' | k apply -f - >/dev/null
  sleep 1
  plain_deploy er "$Q-er" 3 | sed 's/cq-e2e-pool: plain/cq-e2e-pool: er/' | k apply -f - >/dev/null
  # Bound pods with the claim kube-scheduler made and allocated for them
  # (status.extendedResourceClaimStatus), each on a node whose product label is its pin.
  er_bound() {
    k -n "$NS" get pods -l plain=er -o json | jq -r '[.items[] | select((.spec.nodeName // "") != "")
      | select((.status.extendedResourceClaimStatus.resourceClaimName // "") != "")] | length'
  }
  er_on_pins() {
    k -n "$NS" get pods -l plain=er -o json | jq -r '.items[] | select((.spec.nodeName // "") != "") | "\(.spec.nodeName) \(.spec.nodeSelector["nvidia.com/gpu.product"])"' |
      while read -r node pin; do
        [ "$(k get node "$node" -o jsonpath='{.metadata.labels.nvidia\.com/gpu\.product}')" = "$pin" ] || { echo "$node: pin $pin"; return 1; }
      done
  }
  er_claims() {
    k -n "$NS" get resourceclaims -o json |
      jq '[.items[] | select(.metadata.annotations["resource.kubernetes.io/extended-resource-claim"] == "true") | select(.status.allocation != null)] | length'
  }
  export -f er_bound er_on_pins er_claims
  check "DRA-backed nvidia.com/gpu: a Deployment of 3 plain pods, 2 bound by kube-scheduler through its claims, on the RTX 4090 and the H200 pinned" \
    wait_for 40 bash -c "[ \"\$(er_bound)\" = 2 ] && er_on_pins && usage_is $Q-er NVIDIA-GeForce-RTX-4090 allocated 1 && usage_is $Q-er NVIDIA-H200 allocated 1"
  er_refused() {
    k -n "$NS" get events -o json | jq -e --arg q "queue $Q-er" \
      'any(.items[]; .reason == "FailedCreate" and (.message | contains($q)) and (.message | contains("carry no product label (nvidia.com/gpu.product)")))' >/dev/null
  }
  wait_for 20 er_refused || CONTEXT="the ReplicaSet's FailedCreate events: $(k -n "$NS" get events -o json |
    jq -r '.items[] | select(.reason == "FailedCreate") | .message' | tail -n 3 | cut -c1-700 | tr '\n' ';')"
  check "... the third, whose only room is the B200 of a node without a product label, is refused with the reason" er_refused
  check "... counted once: kube-scheduler's 2 allocated claims add nothing to the Queue's usage" \
    bash -c "[ \"\$(er_claims)\" = 2 ] && usage_is $Q-er NVIDIA-H200 allocated 1 && usage_is $Q-er NVIDIA-GeForce-RTX-4090 allocated 1"
  k -n "$NS" scale deployment er --replicas=0 >/dev/null
  k -n "$NS" delete pod -l plain=er --grace-period=0 --force >/dev/null 2>&1
  check "... deleted, the queue's cards are free again" wait_for 30 bash -c \
    "usage_is $Q-er NVIDIA-H200 allocated 0 && usage_is $Q-er NVIDIA-GeForce-RTX-4090 allocated 0"
  k -n "$NS" delete deploy er --wait=false >/dev/null 2>&1
  # The claims kube-scheduler made for the deleted pods go with them (garbage collection);
  # until then their devices are taken, which is the scheduler's business, not this test's.
  wait_for 30 bash -c "[ \"\$(er_claims)\" = 0 ]" || log "4f: kube-scheduler's claims of the deleted pods still exist after 30 s: $(er_claims)"
  # A burst: 20 such pods created at once, half through each replica (their namespaces),
  # kube-scheduler binding what is admitted: never more than the quota's 1 + 1.
  er_burst_pod() { # i
    local ns=$NS; [ $(($1 % 2)) = 1 ] && ns=$NS2
    kubectl -n "$ns" create -f - >"$WORK/er-burst-$1.out" 2>&1 <<EOF
apiVersion: v1
kind: Pod
metadata: {name: er-burst-$1, labels: {er-burst: "1", card-quota-e2e: "$RUN"}, annotations: {scheduling.volcano.sh/queue-name: $Q-er}}
spec:
  nodeSelector: {cq-e2e-pool: er}
  containers: [{name: c, image: registry.k8s.io/pause:3.9, resources: {limits: {nvidia.com/gpu: "1"}}}]
EOF
  }
  export -f er_burst_pod
  export NS2 WORK
  seq 1 20 | xargs -P 20 -I{} bash -c 'er_burst_pod {}'
  er_burst_bound() {
    kubectl get pods -A -l er-burst=1 -o json | jq '[.items[] | select((.spec.nodeName // "") != "")] | length'
  }
  export -f er_burst_bound
  er_burst_done() {
    [ "$(kubectl get pods -A -l er-burst=1 -o name | wc -l)" = 2 ] && [ "$(er_burst_bound)" = 2 ] &&
      usage_is "$Q-er" NVIDIA-H200 allocated 1 && usage_is "$Q-er" NVIDIA-GeForce-RTX-4090 allocated 1
  }
  wait_for 30 er_burst_done ||
    CONTEXT="answers: $(cat "$WORK"/er-burst-*.out | sed -E 's/er-burst-[0-9]+/er-burst-N/g; s/^.*denied the request: //' | cut -c1-400 | sort | uniq -c | tr '\n' ';') pods: $(kubectl get pods -A -l er-burst=1 -o json |
      jq -r '.items[] | "\(.metadata.name) node=\(.spec.nodeName // "-") pin=\(.spec.nodeSelector["nvidia.com/gpu.product"] // "-") claim=\(.status.extendedResourceClaimStatus.resourceClaimName // "-") \(.status.conditions // [] | map(select(.type == "PodScheduled")) | .[0].message // "" | .[0:200])"' | tr '\n' ';') claims: $(er_claims) usage: $(usage "$Q-er")"
  check "... a burst of 20 through both replicas: 2 created and bound, RTX 4090 and H200 at their quota" er_burst_done
  k delete pods -A -l er-burst=1 --grace-period=0 --force >/dev/null 2>&1 || true
  k delete deviceclass cq-e2e-gpu-er >/dev/null 2>&1
  k delete resourceslice "$Q-er-h200-gpu" "$Q-er-rtx-gpu" "$Q-er-b200-gpu" >/dev/null 2>&1
  k delete node "$Q-er-h200" "$Q-er-rtx" "$Q-er-b200" >/dev/null 2>&1
else
  log "4f skipped: DRA-backed extended resources need Kubernetes 1.37 (this server: $(k version -o json | jq -r .serverVersion.gitVersion))"
fi

# ---- 5. Two replicas, 200 concurrent bindings, 10 free cards ----------------------------
ns_of() { if [ $((10#$1 % 2)) = 0 ]; then echo "$NS2"; else echo "$NS"; fi; }
burst_queue() { # name pods : half the pods in each replica's namespace
  queue "$1" '{"RTX-4090":500}' | k apply -f - >/dev/null
  : > "$WORK/$1.yaml"
  for i in $(seq -w 1 "$2"); do card_pod "$1-p$i" "$1" RTX-4090 nvidia.com/gpu 1 "$(ns_of "$i")" >> "$WORK/$1.yaml"; done
  k apply -f "$WORK/$1.yaml" >/dev/null
  # Cut the quota after the pods exist: the binding is the hard line left to hold it.
  local out
  out=$(queue "$1" '{"RTX-4090":10}' | k apply -f - 2>&1) || log "the quota cut of $1 failed: $out"
  # The race below is about bindings, not about how soon a replica sees a cut: wait
  # until both replicas answer with the new quota (a server dry run charges nothing).
  wait_for 30 sees_quota "$1" 10 "$NS" || log "replica A does not see $1's quota of 10"
  wait_for 30 sees_quota "$1" 10 "$NS2" || log "replica B does not see $1's quota of 10"
}
sees_quota() { # queue quota namespace: that namespace's replica refuses with this quota
  local out
  out=$(card_pod "$1-probe" "$1" RTX-4090 nvidia.com/gpu 1 "$3" | k apply --dry-run=server -f - 2>&1)
  grep -q "quota $2\$" <<<"$out"
}
bound_in() { k get pods -A -l "card-quota-e2e=$RUN" -o json 2>/dev/null | jq --arg q "$1" '[.items[] | select(.metadata.annotations["scheduling.volcano.sh/queue-name"] == $q and (.spec.nodeName // "") != "")] | length'; }
export -f bound_in
burst() { # queue pods -> codes file (one final HTTP status per pod), retries file
  # As kube-scheduler does, a binding answered "try again" is posted again (a few rounds):
  # that answer is allowed under load, and a binding that never lands is the failure.
  local todo="$WORK/$1.todo" next="$WORK/$1.next" round ns pod code
  for i in $(seq -w 1 "$2"); do echo "$(ns_of "$i") $1-p$i"; done > "$todo"
  : > "$WORK/$1.codes"; : > "$WORK/$1.retries"
  for round in 1 2 3 4; do
    xargs -P 64 -L 1 bash -c "$(declare -f api_bind); WORK=$WORK; SERVER=$SERVER; CURL_AUTH=(${CURL_AUTH[*]@Q}); echo \$0 \$1 \$(api_bind \$0 \$1 $Q-rtx)" < "$todo" > "$WORK/$1.round"
    : > "$next"
    while read -r ns pod code; do
      if [ "$code" != 201 ] && [ "$round" -lt 4 ] && grep -q 'try again' "$WORK/binds/$pod.out" 2>/dev/null; then
        echo "$ns $pod" >> "$next"; echo "$pod $(jq -r '.message // empty' "$WORK/binds/$pod.out" 2>/dev/null)" >> "$WORK/$1.retries"
      else
        echo "$code" >> "$WORK/$1.codes"
      fi
    done < "$WORK/$1.round"
    [ -s "$next" ] || break
    mv "$next" "$todo"; sleep 0.5
  done
}
burst_queue "$Q-burst" 200
check "200 pods were admitted while the quota was large" bash -c "[ \"\$(kubectl get pods -A -l card-quota-e2e=$RUN -o name 2>/dev/null | grep -c $Q-burst-p)\" = 200 ]"
t0=$(date +%s%N)
burst "$Q-burst" 200
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
ok=$(grep -c '^201$' "$WORK/$Q-burst.codes"); refused=$(grep -vc '^201$' "$WORK/$Q-burst.codes")
log "burst: 200 bindings in ${ms} ms: $ok bound, $refused refused, $(wc -l < "$WORK/$Q-burst.retries") posted again after \"try again\""
sed -E 's/-p[0-9]+/-pN/g' "$WORK/$Q-burst.retries" | cut -d' ' -f2- | sort | uniq -c | head -3 | while read -r line; do log "burst: try again: $line"; done
CONTEXT="burst: $ok bound, $refused refused, $(wc -l < "$WORK/$Q-burst.retries") posted again; codes: $(sort "$WORK/$Q-burst.codes" | uniq -c | tr -s ' \n' ' ');$(cat "$WORK"/binds/"$Q"-burst-p*.out 2>/dev/null | jq -r '.message // empty' 2>/dev/null | sed -E 's/-p[0-9]+/-pN/g' | sort | uniq -c | sort -rn | head -3 | cut -c1-240 | tr '\n' ';'); bound now: $(bound_in "$Q-burst"); usage: $(usage "$Q-burst")"
check "two replicas, 200 concurrent bindings, 10 free cards: exactly 10 bind" bash -c "[ $ok = 10 ] && [ \"\$(bound_in $Q-burst)\" = 10 ]"
check "the Queue's usage says 10 allocated" wait_for 20 usage_is "$Q-burst" RTX-4090 allocated 10
check "both replicas recorded charges in the same ledger" bash -c \
  "curl -s http://127.0.0.1:$((PORT_A + 1000))/metrics | grep -q 'card_quota_ledger_writes_total{result=\"written\"}' && curl -s http://127.0.0.1:$((PORT_B + 1000))/metrics | grep -q 'card_quota_ledger_writes_total{result=\"written\"}'"
check "the ledger converges (entries pruned once the caches show them)" wait_for 60 bash -c "[ \"\$(ledger_len $Q-burst)\" = 0 ]"

burst_queue "$Q-kill" 100
( sleep 0.4; kill -9 "$PID_B" 2>/dev/null ) &
burst "$Q-kill" 100
ok=$(grep -c '^201$' "$WORK/$Q-kill.codes")
log "kill burst: $ok of 100 bound; replica B killed mid-burst ($(grep -c '^201$' "$WORK/$Q-kill.codes") created, $(grep -c '^500$' "$WORK/$Q-kill.codes") failed closed)"
check "a replica killed mid-burst never lets more than the quota bind" bash -c "[ $ok -le 10 ] && [ \"\$(bound_in $Q-kill)\" -le 10 ]"

# ---- 5b. Pod bursts through both replicas: group commit, restarts ----------------------
BURST=("$BURST_BIN" --scheduler-name "$HAND_SCHED")
serve B "$PORT_B" $((PORT_B + 1000)) clamp   # B was killed above
pods_in() { k get pods -A -o json 2>/dev/null | jq --arg q "$1" '[.items[] | select(.metadata.annotations["scheduling.volcano.sh/queue-name"] == $q)] | length'; }
export -f pods_in
queue "$Q-flood" '{"RTX-4090":1500}' | k apply -f - >/dev/null
t0=$(date +%s%N)
"${BURST[@]}" --pods 1000 --concurrency 16 --rounds 1 --together --keep --queue "$Q-flood" \
  --case "a=$NS" --case "b=$NS2" > "$WORK/flood.out" 2>&1
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
log "flood: $(grep TOTAL "$WORK/flood.out") (${ms} ms)"
grep -E "first (error|refusal)" "$WORK/flood.out" | while read -r line; do log "flood: $line"; done
check "2,000 pods into quota 1,500 through two replicas: exactly 1,500 admitted, 500 refused" \
  grep -q 'TOTAL admitted=1500 refused=500 errors=0' "$WORK/flood.out"
check "... with the contract's message" grep -q "first refusal: admission webhook \"pods.card-quota.volcano.sh\" denied the request: queue $Q-flood has insufficient RTX-4090 quota: requested 1, in use 1500 (allocated 0, pending 1500, reserved 0), quota 1500" "$WORK/flood.out"
check "... 1,500 pods exist and the Queue's usage says 1,500 pending" wait_for 30 bash -c \
  "[ \"\$(pods_in $Q-flood)\" = 1500 ] && usage_is $Q-flood RTX-4090 pending 1500"
check "... the ledger empties once the caches show the pods" wait_for 60 bash -c "[ \"\$(ledger_len $Q-flood)\" = 0 ]"
k delete pods -n "$NS" -l card-quota-burst=1 --wait=false >/dev/null 2>&1
k delete pods -n "$NS2" -l card-quota-burst=1 --wait=false >/dev/null 2>&1

queue "$Q-restart" '{"RTX-4090":600}' | k apply -f - >/dev/null
# Killed once the burst is under way (100 charges recorded or held by the two replicas, read
# from their metrics: cheap enough to poll every 50 ms), whatever cargo's start-up time.
charged() {
  local n=0 p v
  for p in $((PORT_A + 1000)) $((PORT_B + 1000)); do
    v=$(curl -s "http://127.0.0.1:$p/metrics" | awk '/^card_quota_ledger_(batch_requests_sum|held_charges_total) / {n += $2} END {printf "%d", n}')
    n=$((n + ${v:-0}))
  done
  echo "$n"
}
base=$(charged)
( end=$(( $(date +%s) + 120 ))
  while [ "$(charged)" -lt $((base + 100)) ] && [ "$(date +%s)" -lt $end ]; do sleep 0.05; done
  kill -9 "$PID_A" "$PID_B" 2>/dev/null; sleep 1
  serve A "$PORT_A" $((PORT_A + 1000)) clamp; serve B "$PORT_B" $((PORT_B + 1000)) clamp
  echo "$PID_A $PID_B" > "$WORK/restarted.pids" ) > "$WORK/restart.log" 2>&1 &
restarter=$!
"${BURST[@]}" --pods 500 --concurrency 16 --rounds 1 --together --keep --queue "$Q-restart" \
  --case "a=$NS" --case "b=$NS2" > "$WORK/restart.out" 2>&1
wait "$restarter"
read -r PID_A PID_B < "$WORK/restarted.pids"; PIDS+=("$PID_A" "$PID_B")
log "restart burst: $(grep TOTAL "$WORK/restart.out"); both replicas killed once 100 charges were recorded"
# The burst goes on against the restarted replicas, past the quota.
"${BURST[@]}" --pods 500 --concurrency 16 --rounds 1 --together --keep --append --queue "$Q-restart" \
  --case "a=$NS" --case "b=$NS2" > "$WORK/restart2.out" 2>&1
log "after the restart: $(grep TOTAL "$WORK/restart2.out"); $(pods_in "$Q-restart") pods exist"
# Charges recorded by a replica killed before it answered stay in the ledger as phantoms
# until they expire (120 s): the queue may stop a few pods short of 600, never past it.
check "both replicas killed mid-burst and restarted: the burst stops at the quota of 600, never past it" \
  bash -c "grep -q 'errors=[1-9]' '$WORK/restart.out' && grep -q 'refused=[1-9]' '$WORK/restart2.out' && n=\$(pods_in $Q-restart) && [ \$n -le 600 ] && [ \$n -ge 560 ]"
check "... and usage equals the pods that exist" wait_for 30 bash -c \
  "usage_is $Q-restart RTX-4090 pending \"\$(pods_in $Q-restart)\""
k delete pods -n "$NS" -l card-quota-burst=1 --wait=false >/dev/null 2>&1
k delete pods -n "$NS2" -l card-quota-burst=1 --wait=false >/dev/null 2>&1

# ---- 6. The reconciler's usage annotation, status ---------------------------------------
status_has() { # queue jq-condition-on-the-RTX-4090-row [status flags...]
  local q=$1 cond=$2; shift 2
  "$BIN" status "$@" --queue "$q" -o json 2>/dev/null |
    jq -e --arg q "$q" ".[] | select(.queue == \$q and .model == \"RTX-4090\") | $cond" >/dev/null
}
export BIN; export -f status_has
check "card-quota status reads the usage the reconciler wrote (10 allocated in the burst queue)" \
  wait_for 20 status_has "$Q-burst" ".allocated == 10"
check "... and status --recount counts the same from the live cluster" \
  status_has "$Q-burst" ".allocated == 10" --recount "${SERVE_SCOPE[@]}"
check "usage is written by server-side apply under field manager card-quota" bash -c \
  "{ kubectl get queue $Q-research -o json --show-managed-fields 2>/dev/null || kubectl get queue $Q-research -o json; } | jq -e '.metadata.managedFields[] | select(.manager == \"card-quota\" and .operation == \"Apply\") | .fieldsV1[\"f:metadata\"][\"f:annotations\"][\"f:volcano.sh/card.usage\"]' >/dev/null"
queue "$Q-research" '{"NVIDIA-H200":3,"NVIDIA-H200/mig-1g.18gb-mixed":4,"NVIDIA-H200/mps-140g*1/2":2,"RTX-4090":2,"NVIDIA-A100":0}' |
  sed 's/weight: 1/weight: 2/' | k apply -f - >/dev/null 2>&1
check "an admin's later kubectl apply of the Queue keeps the usage annotation" bash -c \
  "[ \"\$(kubectl get queue $Q-research -o jsonpath='{.spec.weight}' 2>/dev/null)\" = 2 ] && [ -n \"\$(usage $Q-research)\" ]"
out=$(queue "$Q-burst" '{"RTX-4090":4}' | k apply -f - 2>&1)
check "a quota cut below usage is admitted with a Warning" \
  contains "$out" "Warning: queue $Q-burst: quota for RTX-4090 (4) is below current usage"
check "a quota cut below usage raises CardQuotaExceeded" wait_for 20 bash -c \
  "kubectl get events -A -o jsonpath='{range .items[*]}{.reason} {.message}{\"\\n\"}{end}' 2>/dev/null | grep -q 'CardQuotaExceeded queue $Q-burst is over its card quota: RTX-4090 allocated 10 > quota 4'"

# ---- 7. A newcomer's path (docs/getting-started.md): refused pod -> describe -> status ----
queue "$Q-start" '{"RTX-4090":2}' | k apply -f - >/dev/null
k apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: train, namespace: $NS}
spec:
  replicas: 3
  selector: {matchLabels: {app: train}}
  template:
    metadata:
      labels: {app: train}
      annotations: {scheduling.volcano.sh/queue-name: $Q-start, volcano.sh/card.name: RTX-4090}
    spec:
      schedulerName: $HAND_SCHED
      containers: [{name: c, image: registry.k8s.io/pause:3.9, resources: {limits: {nvidia.com/gpu: "1"}}}]
YAML
check "getting started: 2 of the Deployment's 3 pods are created, the third is refused" wait_for 30 bash -c \
  "[ \"\$(kubectl -n $NS get pods -l app=train --no-headers 2>/dev/null | wc -l)\" = 2 ]"
check "... kubectl describe replicaset shows why, with the numbers" wait_for 30 bash -c \
  "kubectl -n $NS describe replicaset -l app=train 2>/dev/null | tr -s ' \n' ' ' | grep -q 'queue $Q-start has insufficient RTX-4090 quota: requested 1, in use 2 (allocated 0, pending 2, reserved 0), quota 2'"
check "... card-quota status shows the queue full" wait_for 20 bash -c \
  '"$BIN" status --queue "$1" 2>/dev/null | grep -Eq "^$1 +RTX-4090 +2 +0 +2 +0 +0 +0"' _ "$Q-start"

# ---- 7b. A tree of queues: an org, two teams, borrowing from the org's pool -------------
tree_queue() { # name parent quota-json borrow-json|''
  local borrow=''
  [ -z "$4" ] || borrow="volcano.sh/card.borrow: '$4'"
  cat <<EOF
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata:
  name: $1
  labels: {card-quota-e2e: "$RUN"}
  annotations:
    volcano.sh/card.quota: '$3'
    $borrow
spec: {weight: 1, parent: $2}
EOF
}
tree_queue "$Q-org" root '{"NVIDIA-A100":6}' '' | k apply -f - >/dev/null
tree_queue "$Q-team-a" "$Q-org" '{"NVIDIA-A100":2}' '{"NVIDIA-A100":4}' | k apply -f - >/dev/null
tree_queue "$Q-team-b" "$Q-org" '{"NVIDIA-A100":2}' '{"NVIDIA-A100":4}' | k apply -f - >/dev/null
sleep 1
for t in a b; do
  tns=$NS; [ "$t" = b ] && tns=$NS2
  for i in 1 2; do card_pod "$Q-share-$t$i" "$Q-team-$t" NVIDIA-A100 nvidia.com/gpu 1 "$tns" | k create -f - >/dev/null 2>&1; done
done
check "each team fills its own share (2 + 2 of the org's 6)" bash -c \
  "[ \"\$(kubectl get pods -A -l card-quota-e2e=$RUN -o name 2>/dev/null | grep -c $Q-share-)\" = 4 ]"
# 20 borrowing pods at once, 10 per team, each team's through its own replica: the org's
# pool holds 2. The teams' charges share the org's ledger, so the replicas serialize.
mkdir -p "$WORK/race"
for t in a b; do
  tns=$NS; [ "$t" = b ] && tns=$NS2
  for i in $(seq -w 1 10); do card_pod "$Q-race-$t$i" "$Q-team-$t" NVIDIA-A100 nvidia.com/gpu 1 "$tns" > "$WORK/race/$t$i.yaml"; done
done
ls "$WORK"/race/*.yaml | xargs -P 20 -I{} sh -c 'kubectl create -f {} > {}.out 2>&1; true'
raced=$(cat "$WORK"/race/*.out | grep -c ' created$')
log "tree race: $raced of 20 borrowing pods admitted (pool 2); $(grep -l 'cannot borrow' "$WORK"/race/*.out | wc -l) refused with 'cannot borrow'"
check "two replicas, 20 concurrent borrowing pods, a pool of 2: exactly 2 admitted" [ "$raced" = 2 ]
check "... the others are refused because the org's pool is empty" bash -c \
  "grep -h 'denied' $WORK/race/*.out | grep -c \"cannot borrow NVIDIA-A100 from $Q-org: requested 1, $Q-org free 0 (quota 6, shares 4, borrowed 2)\" | grep -qx 18"
check "the org's usage annotation sums its subtree (6 pending, shares 4, nothing free)" wait_for 20 bash -c \
  "usage_is $Q-org NVIDIA-A100 pending 6 && usage_is $Q-org NVIDIA-A100 shares 4 && usage_is $Q-org NVIDIA-A100 free 0"
team_pods() { kubectl get pods -A -l "card-quota-e2e=$RUN" -o json | jq --arg q "$1" '[.items[] | select(.metadata.annotations["scheduling.volcano.sh/queue-name"] == $q)] | length'; }
export -f team_pods
check "... and each team's says its pods and what it borrowed" wait_for 20 bash -c \
  "a=\$(team_pods $Q-team-a); b=\$(team_pods $Q-team-b); usage_is $Q-team-a NVIDIA-A100 pending \$a && usage_is $Q-team-b NVIDIA-A100 pending \$b && usage_is $Q-team-a NVIDIA-A100 borrowed \$((a - 2)) && usage_is $Q-team-b NVIDIA-A100 borrowed \$((b - 2)) && [ \$((a + b)) = 6 ]"
out=$(tree_queue "$Q-org" "$Q-team-a" '{"NVIDIA-A100":6}' '' | k apply -f - 2>&1)
check "kubectl apply of a cycle (the org under its own team) is refused with the message" \
  contains "$out" "queue $Q-org cannot have parent $Q-team-a: $Q-team-a is below $Q-org, which would make a cycle ($Q-org -> $Q-team-a -> $Q-org)"
out=$(card_pod "$Q-to-org" "$Q-org" NVIDIA-A100 nvidia.com/gpu 1 | k create -f - 2>&1)
check "a card pod submitted to the org itself is refused: charges go to leaf queues" \
  contains "$out" "queue $Q-org has child queues ($Q-team-a, $Q-team-b): submit card workloads to a leaf queue"

# A group cap in a two-level tree: the org caps its subtree at 3 cards in all; its team's
# shares (2 H200 + 2 RTX-4090) would allow 4. A Deployment of 5 plain pods in the team
# stops at 3, refused naming the org's cap.
node "$Q-tc-h200" NVIDIA-H200 2 ',"cq-e2e-pool":"tcap"' ''
node "$Q-tc-rtx" RTX-4090 2 ',"cq-e2e-pool":"tcap"' ''
tree_queue "$Q-corg" root '{"NVIDIA-H200":2,"RTX-4090":2,"*":3}' '' | k apply -f - >/dev/null
tree_queue "$Q-cteam" "$Q-corg" '{"NVIDIA-H200":2,"RTX-4090":2}' '' | k apply -f - >/dev/null
sleep 1
plain_deploy tcapped "$Q-cteam" 5 | sed 's/cq-e2e-pool: plain/cq-e2e-pool: tcap/' | k apply -f - >/dev/null 2>&1
check "group cap in a tree: 5 plain pods of a team stop at its org's * cap of 3, all bound" wait_for 30 bash -c \
  "[ \"\$(plain_bound tcapped)\" = 3 ] && [ \"\$(kubectl -n $NS get pods -l plain=tcapped -o name | wc -l)\" = 3 ] && failed_create_says 'queue $Q-cteam has insufficient * quota (a group cap) in ancestor $Q-corg'"
check "... the org's usage has the cap's row, 3 of 3 allocated from its team" wait_for 20 bash -c \
  "usage_is $Q-corg '*' allocated 3 && usage_is $Q-corg '*' quota 3"
k -n "$NS" delete deploy tcapped --wait=false >/dev/null 2>&1

# A queue with card work moved under a parent, live: checked against the parent's cap
# with what it brings (not the headroom the replicas hold); once moved, a pod of the
# parent's other team is refused by the cap at once, the moved queue's cards counted
# (the move seals the parent's tree until both replicas see it; they read the Queue).
tree_queue "$Q-morg" root '{"NVIDIA-A100":3}' '' | k apply -f - >/dev/null
tree_queue "$Q-mteam" "$Q-morg" '{"NVIDIA-A100":3}' '' | k apply -f - >/dev/null
tree_queue "$Q-mover" root '{"NVIDIA-A100":2}' '' | k apply -f - >/dev/null
tree_queue "$Q-mover2" root '{"NVIDIA-A100":1}' '' | k apply -f - >/dev/null
sleep 1
card_pod "$Q-mt1" "$Q-mteam" NVIDIA-A100 nvidia.com/gpu 1 | k create -f - >/dev/null
card_pod "$Q-mv1" "$Q-mover" NVIDIA-A100 nvidia.com/gpu 1 | k create -f - >/dev/null
card_pod "$Q-mw1" "$Q-mover2" NVIDIA-A100 nvidia.com/gpu 1 | k create -f - >/dev/null
export -f card_pod
export HAND_SCHED
# Applied as an admin would: again on "try again".
apply_move() { # queue parent quota-json -> kubectl's output
  local out i
  for i in $(seq 1 20); do
    out=$(tree_queue "$1" "$2" "$3" '' | k apply -f - 2>&1)
    grep -q "try again" <<<"$out" || break
    sleep 0.5
  done
  echo "$out"
}
t0=$(date +%s%N)
out=$(apply_move "$Q-mover" "$Q-morg" '{"NVIDIA-A100":2}')
check "a queue with 1 card in use moves under a parent holding 1 of 3" \
  contains "$out" "queue.scheduling.volcano.sh/$Q-mover configured"
check "... its next pod is admitted in the parent's tree within 5 s" wait_for 5 bash -c \
  "card_pod $Q-mv2 $Q-mover NVIDIA-A100 nvidia.com/gpu 1 | kubectl create -f - >/dev/null 2>&1; kubectl -n $NS get pod $Q-mv2"
log "the moved queue's next pod admitted $(( ($(date +%s%N) - t0) / 1000000 )) ms after the move was applied"
check "... then the parent's cap counts it: a fourth pod, in the other team, is refused by the cap" wait_for 5 bash -c \
  "out=\$(card_pod $Q-mt2 $Q-mteam NVIDIA-A100 nvidia.com/gpu 1 | kubectl create -f - 2>&1); grep -q 'insufficient NVIDIA-A100 quota in ancestor $Q-morg' <<<\"\$out\""
out=$(apply_move "$Q-mover2" "$Q-morg" '{"NVIDIA-A100":1}')
check "... and a second queue's move that does not fit is refused with the message" \
  contains "$out" "queue $Q-mover2 cannot move under $Q-morg: $Q-morg would have 4 NVIDIA-A100 in use (3 there, 1 moving with $Q-mover2), quota 3"

# Claim pods in a tree: the parent's H200 caps its team's claims.
tree_queue "$Q-dra-org" root '{"NVIDIA-H200":1}' '' | k apply -f - >/dev/null
tree_queue "$Q-dra-team" "$Q-dra-org" '{"NVIDIA-H200":2}' '' | k apply -f - >/dev/null
sleep 1
for i in 1 2; do
  out=$(k -n "$NS" apply -f - 2>&1 <<EOF
apiVersion: v1
kind: Pod
metadata: {name: dra-tree-$i, labels: {card-quota-e2e: "$RUN"}, annotations: {scheduling.volcano.sh/queue-name: $Q-dra-team}}
spec: $(dra_pod_spec "$HAND_SCHED")
EOF
)
  echo "$out" > "$WORK/dra-tree-$i.out"
done
check "a claim pod in a team whose org holds one H200 is created" grep -q "pod/dra-tree-1 created" "$WORK/dra-tree-1.out"
check "... the second is refused by the org's quota, though the team's allows two" grep -q "$Q-dra-org" "$WORK/dra-tree-2.out"
log "dra-tree-2: $(cut -c1-300 "$WORK/dra-tree-2.out")"
k -n "$NS" delete pod dra-tree-1 dra-tree-2 --grace-period=0 --force >/dev/null 2>&1

# ---- 8. card-quota down: what still goes through ------------------------------------------
# Outside the selected namespaces nothing reaches card-quota; inside them the install's
# matchConditions let everything without cards through, and the Fail hooks hold card
# work until a replica answers. docs/install.md says so.
kill "$PID_A" "$PID_B" 2>/dev/null
for _ in $(seq 1 50); do kill -0 "$PID_A" 2>/dev/null || kill -0 "$PID_B" 2>/dev/null || break; sleep 0.2; done
namespace "$NS-out"
k apply -f - >/dev/null <<YAML
apiVersion: scheduling.volcano.sh/v1beta1
kind: PodGroup
metadata: {name: outside, namespace: $NS-out, annotations: {volcano.sh/card.request: '{"NVIDIA-H200":100}'}}
spec: {queue: $Q-research, minMember: 1}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: $NS-out}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      schedulerName: volcano
      containers: [{name: c, image: registry.k8s.io/pause:3.9}]
YAML
out=$(k -n "$NS-out" patch podgroup outside --type merge -p '{"status":{"phase":"Running"}}' 2>&1)
check "card-quota down: a PodGroup status update outside the selected namespaces goes through" \
  contains "$out" "podgroup.scheduling.volcano.sh/outside patched"
k -n "$NS-out" patch deployment web --type merge -p '{"spec":{"template":{"metadata":{"annotations":{"rollout":"2"}}}}}' >/dev/null 2>&1
check "... and so does a Deployment rollout there (a second ReplicaSet, its pod created)" wait_for 30 bash -c \
  "[ \"\$(kubectl -n $NS-out get replicasets -l app=web --no-headers 2>/dev/null | wc -l)\" = 2 ] && [ \"\$(kubectl -n $NS-out get pods -l app=web --no-headers 2>/dev/null | wc -l)\" -ge 2 ]"
out=$(k -n "$NS" scale deployment train --replicas 4 2>&1)
check "... inside them a scale-up goes through (the scale hook is Ignore)" \
  contains "$out" "deployment.apps/train scaled"
out=$(k -n "$NS" patch podgroup job-mig --type merge -p '{"status":{"phase":"Running"}}' 2>&1)
check "... and a PodGroup status update there (matchConditions: it charges nothing)" \
  contains "$out" "podgroup.scheduling.volcano.sh/job-mig patched"
out=$(k -n "$NS" run "down-plain" --image=registry.k8s.io/pause:3.9 --restart=Never --overrides='{"apiVersion":"v1","spec":{"schedulerName":"volcano"}}' 2>&1)
check "... and a cardless pod there" contains "$out" "pod/down-plain created"
out=$(k -n "$NS" run "down-vf" --image=registry.k8s.io/pause:3.9 --restart=Never --overrides='{"apiVersion":"v1","spec":{"schedulerName":"volcano","containers":[{"name":"down-vf","image":"registry.k8s.io/pause:3.9","resources":{"limits":{"nvidia.com/sriov_rdma_vf":"1"}}}]}}' 2>&1)
check "... and a pod asking only for a NIC's virtual function under nvidia.com/ (not a card resource)" contains "$out" "pod/down-vf created"
out=$(card_pod down-card "$Q-research" NVIDIA-H200 nvidia.com/gpu 1 | k apply -f - 2>&1)
check "... while a card pod fails closed until a replica answers" contains "$out" "failed calling webhook"
out=$(card_pod down-binpack "$Q-research" NVIDIA-H200 nvidia.com/gpu 1 | sed "s/schedulerName: .*/schedulerName: gpu-binpack/" | k apply -f - 2>&1)
check "... and so does a card pod of a second scheduler profile (every card pod is checked)" contains "$out" "failed calling webhook"
pg down-wait '{"NVIDIA-H200":1}' | k apply -f - >/dev/null 2>&1
out=$(enqueue down-wait)
check "... and so does a PodGroup's enqueue (its creation went through: Ignore)" contains "$out" "failed calling webhook"

# Pods with ResourceClaims: a condition cannot read a claim's DeviceClass, so they go to
# the claim-pods hooks (Ignore); the allocation of a card driver's devices is the line.
k -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-nic}
spec: {spec: {devices: {requests: [{name: nic, exactly: {deviceClassName: nic.example.com}}]}}}
EOF
out=$(k -n "$NS" apply -f - 2>&1 <<EOF
apiVersion: v1
kind: Pod
metadata: {name: down-nic, labels: {card-quota-e2e: "$RUN"}}
spec: {schedulerName: $HAND_SCHED, containers: [{name: c, image: registry.k8s.io/pause:3.9, resources: {claims: [{name: nic}]}}], resourceClaims: [{name: nic, resourceClaimTemplateName: one-nic}]}
EOF
)
check "... and a pod whose claims ask only for a NIC (the claim-pods hooks are Ignore)" contains "$out" "pod/down-nic created"
out=$(k -n "$NS" apply -f - 2>&1 <<EOF
apiVersion: v1
kind: Pod
metadata: {name: down-gpu, labels: {card-quota-e2e: "$RUN"}, annotations: {scheduling.volcano.sh/queue-name: $Q-dra}}
spec: $(dra_pod_spec default-scheduler)
EOF
)
check "... a pod whose GPU comes from a claim is created too" contains "$out" "pod/down-gpu created"
allocation_waits() {
  k -n "$NS" get events --field-selector involvedObject.name=down-gpu -o json \
    | jq -e 'any(.items[]; .message | contains("resourceclaim-allocations.card-quota.volcano.sh"))' >/dev/null
}
check "... but kube-scheduler's allocation of its claim waits for card-quota (resourceclaim-allocations is Fail)" wait_for 20 allocation_waits
check "... and the pod stays unbound" [ -z "$(k -n "$NS" get pod down-gpu -o jsonpath='{.spec.nodeName}')" ]
log "down-gpu's events: $(k -n "$NS" get events --field-selector involvedObject.name=down-gpu -o jsonpath='{.items[*].message}' | cut -c1-400)"
# A monitoring agent's claim reads every GPU with admin access and takes no cards: its
# allocation leaves the Fail hook's conditions (card-drivers), so it does not wait.
k label namespace "$NS" resource.kubernetes.io/admin-access=true >/dev/null
k -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: down-monitor}
spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com, allocationMode: All, adminAccess: true}}]}}
EOF
k -n "$NS" get resourceclaim down-monitor -o json | jq '.status = {allocation: {devices: {results: [
    {request: "gpu", driver: "gpu.nvidia.com", pool: "n1", device: "gpu-0", adminAccess: true}]},
  nodeSelector: {nodeSelectorTerms: [{matchFields: [{key: "metadata.name", operator: "In", values: ["n1"]}]}]}}}' \
  > "$WORK/down-monitor.json"
out=$(k replace --raw "/apis/resource.k8s.io/v1/namespaces/$NS/resourceclaims/down-monitor/status" -f "$WORK/down-monitor.json" 2>&1)
check "... while an allocation of GPUs with admin access only (a monitoring agent's) goes through" \
  contains "$out" '"adminAccess":true'

# ---- summary ----------------------------------------------------------------------------
echo
echo "card-quota e2e ($((PASSED + FAILED)) scenarios, $(( $(date +%s) - START )) s):"
printf '  %s\n' "${RESULTS[@]}"
if [ "$FAILED" -gt 0 ]; then
  for f in "$WORK"/*.log; do echo "--- $f (last 15 lines)"; tail -15 "$f" | cut -c1-300; done
  echo "--- warning events in $NS (last 15)"
  k -n "$NS" get events --field-selector type=Warning --sort-by=.lastTimestamp 2>&1 | tail -15 | cut -c1-300
  echo "--- kube-controller-manager"
  controller_manager_state
  echo "--- why the failed scenarios failed"
  printf '%s\n' "${DETAILS[@]}" | cut -c1-1200
fi
exit "$FAILED"
