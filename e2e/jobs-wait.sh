#!/usr/bin/env bash
# Jobs wait, never die: Volcano Jobs held at Volcano's enqueue by card-quota, on a real
# API server (Kubernetes >= 1.30: the install's matchConditions are used as rendered).
#
#   KUBECONFIG=<kubeconfig> CP_DIR=<test control plane> e2e/jobs-wait.sh [path/to/card-quota]
#
# Volcano's part is played from its recorded writes (e2e/volcano-standin.sh) with the
# control plane's vc-*.kubeconfig identities; E2E_VOLCANO=real leaves it to the real
# Volcano. E2E_HOLD_SECONDS (default 300) is how long the held Jobs wait before room is
# made. Exit status: number of failed checks.
set -uo pipefail

BIN=${1:-target/release/card-quota}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
: "${KUBECONFIG:?set KUBECONFIG}"
: "${CP_DIR:?set CP_DIR to the test control plane (its vc-*.kubeconfig files)}"
export KUBECONFIG
RUN=${E2E_RUN:-$(date +%s | tail -c 6)$RANDOM}
NS=cq-jobs-$RUN
SYS=cq-jobs-$RUN-system
Q=cq-jobs-$RUN
NODE=$Q-h200
PORT=${E2E_PORT:-19543}
HOLD=${E2E_HOLD_SECONDS:-300}
WORK=$(mktemp -d /tmp/cq-jobs.XXXXXX)
START=$(date +%s)
PASSED=0
FAILED=0
PIDS=()

log() { printf '[%4ss] %s\n' $(( $(date +%s) - START )) "$*"; }
pass() { PASSED=$((PASSED + 1)); log "PASS: $1"; }
fail() { FAILED=$((FAILED + 1)); log "FAIL: $1"; shift; for l in "$@"; do echo "      $l"; done; }
k() { kubectl "$@"; }
check() { local name=$1; shift; if "$@"; then pass "$name"; else fail "$name" "command: $*"; return 1; fi; }
contains() { grep -qF -- "$2" <<<"$1"; }
wait_for() { local t=$1; shift; local end=$(( $(date +%s) + t )); while ! "$@" >/dev/null 2>&1; do [ "$(date +%s)" -ge $end ] && return 1; sleep 0.3; done; }
# A Queue the reconciler has not written yet has no card.usage: nothing in use.
usage_field() { local u; u=$(k get queue "$1" -o jsonpath='{.metadata.annotations.volcano\.sh/card\.usage}'); jq -r --arg m "$2" --arg f "$3" '.[$m][$f] // 0' <<<"${u:-"{}"}"; }
usage_is() { [ "$(usage_field "$1" "$2" "$3")" = "$4" ]; }
export -f k usage_field usage_is
# What a failed check of QUEUE and JOB saw, for a run that cannot be repeated (CI).
diagnose() {
  echo "      --- queue $1: card.usage"
  k get queue "$1" -o jsonpath='{.metadata.annotations.volcano\.sh/card\.usage}' | sed 's/^/      /'; echo
  echo "      --- ledger of $1"
  k -n "$SYS" get configmap "card-quota-ledger.$1" -o jsonpath='{.data}' 2>&1 | sed 's/^/      /'; echo
  echo "      --- PodGroup and pods of job $2"
  k -n "$NS" get podgroup -o json | jq -c --arg j "$2" '.items[] | select(.metadata.ownerReferences[0].name == $j) | {name: .metadata.name, phase: .status.phase, annotations: .metadata.annotations}' | sed 's/^/      /'
  k -n "$NS" get pods -l "volcano.sh/job-name=$2" -o json | jq -c '.items[] | {name: .metadata.name, node: .spec.nodeName, phase: .status.phase, annotations: .metadata.annotations}' | sed 's/^/      /'
  echo "      --- the stand-in's record of $2"
  cat "$WORK/vc/$2.log" "$WORK/vc/$2.held" "$WORK/vc/$2.sync-failures" 2>/dev/null | tail -n 20 | sed 's/^/      /'
  echo "      --- card-quota's log (last 40 lines)"
  tail -n 40 "$WORK/serve.log" | cut -c1-400 | sed 's/^/      /'
}

cleanup() {
  touch "$WORK/vc/stop" 2>/dev/null
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  k delete mutatingwebhookconfiguration,validatingwebhookconfiguration "$Q" --ignore-not-found >/dev/null 2>&1
  k delete namespace "$NS" "$SYS" --wait=false --ignore-not-found >/dev/null 2>&1
  k delete queue -l "card-quota-e2e=$RUN" --ignore-not-found >/dev/null 2>&1
  k delete node "$NODE" "$Q-a100" --ignore-not-found >/dev/null 2>&1
  k delete clusterrolebinding "$Q-vc" --ignore-not-found >/dev/null 2>&1
  e2e_remove_identity "$Q"
  if [ -z "${E2E_KEEP:-}" ]; then rm -rf "$WORK"; else echo "logs kept in $WORK"; fi
}
trap cleanup EXIT

minor=$(k version -o json | jq -r '.serverVersion.minor' | tr -dc 0-9)
if [ "${minor:-0}" -lt 30 ]; then echo "Kubernetes 1.$minor has no webhook matchConditions; this e2e needs 1.30+"; exit 100; fi
k get crd jobs.batch.volcano.sh podgroups.scheduling.volcano.sh queues.scheduling.volcano.sh >/dev/null || { echo "Volcano's CRDs are not installed"; exit 100; }

# shellcheck source=e2e/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=e2e/volcano-standin.sh
. "$(dirname "$0")/volcano-standin.sh"

# ---- setup: one replica, the install's webhooks with their matchConditions --------------
e2e_sweep_stale_hooks
for ns in "$NS" "$SYS"; do k create namespace "$ns" >/dev/null; done
k label namespace "$NS" "card-quota-e2e=$RUN" >/dev/null
wait_for 60 k -n "$NS" get sa default || { echo "no default ServiceAccount in $NS"; exit 100; }
# Volcano's programs get broad rights from its chart; the stand-in's identities too.
k create clusterrolebinding "$Q-vc" --clusterrole=cluster-admin \
  --user=system:serviceaccount:volcano-system:volcano-scheduler \
  --user=system:serviceaccount:volcano-system:volcano-controllers >/dev/null
"$BIN" certs --service card-quota --namespace "$SYS" --ip 127.0.0.1 --out "$WORK/certs" >/dev/null 2>&1
k config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d > "$WORK/client-ca.crt"
k create -f - >/dev/null <<EOF
{"apiVersion":"v1","kind":"Node","metadata":{"name":"$NODE","labels":{"nvidia.com/gpu.product":"NVIDIA-H200"}}}
EOF
k get --raw "/api/v1/nodes/$NODE" | jq '.status = {capacity: {cpu: "64", memory: "512Gi", pods: "500", "nvidia.com/gpu": "8", "nvidia.com/hostdev": "8"}, allocatable: {cpu: "64", memory: "512Gi", pods: "500", "nvidia.com/gpu": "8", "nvidia.com/hostdev": "8"}, conditions: [{type: "Ready", status: "True", reason: "E2E", message: "fake node"}]}' \
  | k replace --raw "/api/v1/nodes/$NODE/status" -f - >/dev/null
# card-quota runs as the install's own ServiceAccount with the install's RBAC, from a
# TokenRequest (e2e/lib.sh): a verb the manifests do not grant fails this e2e.
e2e_install_identity "$BIN" "$SYS" "$Q"
serve() {
  KUBECONFIG="$WORK/card-quota.kubeconfig" \
  "$BIN" serve --cert-dir "$WORK/certs" --listen "127.0.0.1:$PORT" --metrics-listen "127.0.0.1:$((PORT + 1000))" \
    --client-ca "$WORK/client-ca.crt" --client-name kube-apiserver-webhook-client \
    --lease-namespace "$SYS" --lease-name card-quota-jobs --reconcile-seconds 0.5 >> "$WORK/serve.log" 2>&1 &
  SERVE=$!
  PIDS+=($SERVE)
  wait_for 30 curl -sf "http://127.0.0.1:$((PORT + 1000))/readyz" || { echo "card-quota never became ready"; cat "$WORK/serve.log"; exit 100; }
}
serve
"$BIN" manifests --cert-dir "$WORK/certs" --url "https://127.0.0.1:$PORT" --name "$Q" --namespace "$SYS" \
  --namespace-label "card-quota-e2e=$RUN" | k apply -f - >/dev/null
queue() { printf '{"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"Queue","metadata":{"name":"%s","labels":{"card-quota-e2e":"%s"},"annotations":{"volcano.sh/card.quota":"%s"}},"spec":{"weight":1}}' \
  "$1" "$RUN" "$(sed 's/"/\\"/g' <<<"$2")" | k apply -f - 2>&1; }
queue "$Q-a" '{"NVIDIA-H200":2}' >/dev/null
queue "$Q-c" '{"NVIDIA-H200":1}' >/dev/null
queue "$Q-d" '{"NVIDIA-H200":2}' >/dev/null
queue "$Q-h" '{"NVIDIA-H200":1}' >/dev/null
sleep 1
vc_loop

# ---- Job A fills queue a; Job B (card.request) and Job C (none: 2 x 1 H200 into a
# queue of 1) wait --------------------------------------------------------------------------
vc_job ja "$Q-a" 2 '{"NVIDIA-H200":2}'
check "job A is enqueued and its 2 pods are bound" wait_for 30 bash -c \
  "[ \"\$(kubectl -n $NS get pods -l volcano.sh/job-name=ja -o jsonpath='{.items[*].spec.nodeName}' | wc -w)\" = 2 ]"
vc_job jb "$Q-a" 2 '{"NVIDIA-H200":2}'
vc_job jc "$Q-c" 2 ''
check "job C's PodGroup carries the demand derived from its tasks" wait_for 20 bash -c \
  "kubectl -n $NS get podgroup -o json | jq -e '.items[] | select(.metadata.ownerReferences[0].name == \"jc\") | .metadata.annotations[\"volcano.sh/card.derived-request\"] == \"{\\\"NVIDIA-H200\\\":2}\"' >/dev/null"
log "holding jobs B and C for $HOLD s"
sleep "$HOLD"
held_b=$(wc -l < "$WORK/vc/jb.held" 2>/dev/null || echo 0)
held_c=$(wc -l < "$WORK/vc/jc.held" 2>/dev/null || echo 0)
log "enqueue refusals while held: B $held_b, C $held_c; last: $(tail -1 "$WORK/vc/jb.held" 2>/dev/null | cut -c1-240)"
# vc-scheduler retries once a cycle (1 s); the stand-in's kubectl calls stretch its cycle.
check "B's enqueue was refused once a cycle while held ($held_b in $HOLD s)" [ "$held_b" -ge $((HOLD / 3)) ]
check "... with the contract's message" grep -q "queue $Q-a has insufficient NVIDIA-H200 quota: requested 2, in use 2" "$WORK/vc/jb.held"
check "C's enqueue was refused too ($held_c)" [ "$held_c" -ge $((HOLD / 3)) ]
check "B and C stay Pending with no pod created" bash -c "[ \"\$(pods_of jb)\$(pods_of jc)\" = 00 ]"
check "... and their job syncs never failed: nothing would terminate them ($(sync_failures jb) + $(sync_failures jc))" \
  [ "$(( $(sync_failures jb) + $(sync_failures jc) ))" = 0 ]
check "the hold is an Event on B's PodGroup" bash -c \
  "kubectl -n $NS get events.events.k8s.io -o json | jq -e --arg n \"\$(pg_of jb)\" '[.items[] | select(.regarding.kind == \"PodGroup\" and .regarding.name == \$n and .reason == \"InsufficientCardQuota\")] | length > 0' >/dev/null"
check "... and on Job B" bash -c \
  "kubectl -n $NS get events.events.k8s.io -o json | jq -e '[.items[] | select(.regarding.kind == \"Job\" and .regarding.name == \"jb\" and .reason == \"InsufficientCardQuota\")] | length > 0' >/dev/null"
out=$("$BIN" status --recount 2>&1)
check "card-quota status lists the waiting jobs" bash -c 'grep -q "^WAITING PODGROUP" <<<"$1" && grep -q "$2" <<<"$1"' _ "$out" "$(pg_of jb)"
check "the waiting-jobs metric counts them" bash -c \
  "curl -s http://127.0.0.1:$((PORT + 1000))/metrics | grep -q 'card_quota_jobs_waiting{queue_name=\"$Q-a\",card_name=\"NVIDIA-H200\"} 1'"

t0=$(date +%s)
vc_finish ja
check "A finished: B is enqueued and its pods are created within 10 s" wait_for 10 bash -c "[ \"\$(pods_of jb)\" = 2 ]"
log "B's pods $(( $(date +%s) - t0 )) s after A finished"
queue "$Q-c" '{"NVIDIA-H200":2}' >/dev/null
t0=$(date +%s)
check "C runs within 10 s of its queue's quota raise" wait_for 10 bash -c "[ \"\$(pods_of jc)\" = 2 ]"
log "C's pods $(( $(date +%s) - t0 )) s after the raise"
# A running Job's task replicas raised past its queue's quota: refused at the edit (its
# new pods would be refused one by one, which Volcano counts against the Job).
out=$(k -n "$NS" patch vcjob jc --type json -p '[{"op":"replace","path":"/spec/tasks/0/replicas","value":3}]' 2>&1)
check "a running Job's raise past its queue's quota is refused at the edit" \
  contains "$out" "job $NS/jc cannot add replicas to task w while it runs: queue $Q-c has insufficient NVIDIA-H200 quota: requested 1"
out=$(k -n "$NS" patch vcjob jc --type json -p '[{"op":"replace","path":"/spec/tasks/0/replicas","value":1}]' 2>&1)
check "... and a scale-down of it goes through" contains "$out" "job.batch.volcano.sh/jc patched"
check "usage of queue a: B's 2 cards" wait_for 20 bash -c "usage_is $Q-a NVIDIA-H200 allocated 2 && usage_is $Q-a NVIDIA-H200 reserved 0"

# ---- a group cap holds a Job at the enqueue: room on H200 and A100, 2 cards in all ("*") -
queue "$Q-g" '{"NVIDIA-H200":4,"NVIDIA-A100":4,"*":2}' >/dev/null
sleep 1
vc_job jx "$Q-g" 2 '{"NVIDIA-H200":2}'
check "group cap: job X's 2 pods fill queue g's * cap" wait_for 30 bash -c "[ \"\$(pods_of jx)\" = 2 ]"
vc_job jy "$Q-g" 1 '{"NVIDIA-H200|NVIDIA-A100":1}' 1 '' 'NVIDIA-H200|NVIDIA-A100'
check "... job Y (H200 or A100) is held at the enqueue by the cap, though both models have room" wait_for 20 \
  grep -qF "queue $Q-g has insufficient * quota (a group cap): requested 1, in use 2" "$WORK/vc/jy.held"
t0=$(date +%s)
vc_finish jx
check "... X finished: Y's pod is created within 15 s" wait_for 15 bash -c "[ \"\$(pods_of jy)\" = 1 ]"
log "Y's pod $(( $(date +%s) - t0 )) s after X finished"

# ---- one model per pod set: 2 workers that accept H200 or A100, room for 1 of each --------
# The A100 node is tainted: only the stand-in's bindings (which taints do not stop) land
# there, and kube-scheduler's pods below stay on NODE.
k create -f - >/dev/null <<EOF
{"apiVersion":"v1","kind":"Node","metadata":{"name":"$Q-a100","labels":{"nvidia.com/gpu.product":"NVIDIA-A100"}},"spec":{"taints":[{"key":"cq-e2e","value":"volcano-only","effect":"NoSchedule"}]}}
EOF
k get --raw "/api/v1/nodes/$Q-a100" | jq '.status = {capacity: {cpu: "64", memory: "512Gi", pods: "500", "nvidia.com/gpu": "8"}, allocatable: {cpu: "64", memory: "512Gi", pods: "500", "nvidia.com/gpu": "8"}, conditions: [{type: "Ready", status: "True", reason: "E2E", message: "fake node"}]}' \
  | k replace --raw "/api/v1/nodes/$Q-a100/status" -f - >/dev/null
queue "$Q-m" '{"NVIDIA-H200":1,"NVIDIA-A100":1}' >/dev/null
queue "$Q-s" '{"NVIDIA-H200":1,"NVIDIA-A100":1}' >/dev/null
sleep 1
# The models each bound worker of a Job was pinned to, sorted.
bound_models() { kubectl -n "$NS" get pods -l "volcano.sh/job-name=$1" -o json | jq -r '[.items[] | select(.spec.nodeName != null) | .spec.nodeSelector["nvidia.com/gpu.product"]] | sort | join(",")'; }
export -f bound_models
vc_job jm "$Q-m" 2 '' 1 '' 'NVIDIA-H200|NVIDIA-A100'
check "one model per pod set: a Job of 2 workers accepting H200 or A100, room for 1 of each, waits at the enqueue" wait_for 20 \
  grep -qF "waits: the pods of its Job that accept NVIDIA-H200|NVIDIA-A100 (2 cards) run on one model, and none has room for all 2 in queue $Q-m (room now: NVIDIA-H200 1, NVIDIA-A100 1)" "$WORK/vc/jm.held"
check "... with no pod created" [ "$(pods_of jm)" = 0 ]
vc_job js "$Q-s" 2 '' 1 '' 'NVIDIA-H200|NVIDIA-A100' true
check "... the same Job with volcano.sh/card.split: \"true\" runs split, one worker bound on each model" wait_for 30 bash -c \
  "[ \"\$(bound_models js)\" = NVIDIA-A100,NVIDIA-H200 ]"
queue "$Q-m" '{"NVIDIA-H200":1,"NVIDIA-A100":2}' >/dev/null
t0=$(date +%s)
check "... room for 2 A100: the held Job runs within 15 s, both workers bound on A100" wait_for 15 bash -c \
  "[ \"\$(bound_models jm)\" = NVIDIA-A100,NVIDIA-A100 ]"
log "the one-model Job's workers $(( $(date +%s) - t0 )) s after the raise"
check "... its PodGroup reserves the model chosen" bash -c \
  "kubectl -n $NS get podgroup \"\$(pg_of jm)\" -o jsonpath='{.metadata.annotations.volcano\\.sh/card\\.derived-request}' | grep -qx '{\"NVIDIA-A100\":2}'"
vc_finish jm
vc_finish js

# ---- card-quota check before submitting: a Deployment and a Volcano Job, live ------------
queue "$Q-k" '{"NVIDIA-H200":1,"NVIDIA-A100":1}' >/dev/null
vc_template() { # CARD-NAME
  echo "{metadata: {annotations: {volcano.sh/card.name: \"$1\"}}, spec: {containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: \"1\"}}}]}}"
}
cat > "$WORK/check-job.yaml" <<EOF
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: chk-train, namespace: $NS}
spec:
  queue: $Q-k
  minAvailable: 1
  tasks: [{name: w, replicas: 1, template: $(vc_template 'NVIDIA-H200|NVIDIA-A100')}]
EOF
cat > "$WORK/check-both.yaml" <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: chk-web, namespace: $NS}
spec:
  replicas: 3
  selector: {matchLabels: {app: chk-web}}
  template:
    metadata: {labels: {app: chk-web}, annotations: {scheduling.volcano.sh/queue-name: $Q-k}}
    spec: {containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]}
---
$(cat "$WORK/check-job.yaml")
EOF
rc=0; out=$("$BIN" check -f "$WORK/check-both.yaml" 2>&1) || rc=$?
log "card-quota check:
$out"
check "card-quota check, live: a Deployment of 3 plain pods in a queue of 1 H200 + 1 A100: 2 admitted, one on each" \
  bash -c 'grep -E "^Deployment +$1/chk-web +partly +2/3 +NVIDIA-A100:1,NVIDIA-H200:1\$" <<<"$2" >/dev/null' _ "$NS" "$out"
check "... then a Volcano Job would wait at its enqueue, and says why" \
  bash -c 'grep -E "^Job.batch.volcano.sh +$1/chk-train +waits" <<<"$2" >/dev/null && grep -qF "queue $3 has insufficient NVIDIA-H200|NVIDIA-A100 quota: requested 1, in use 2" <<<"$2"' _ "$NS" "$out" "$Q-k"
check "... exit status 2" [ "$rc" = 2 ]
rc=0; out=$("$BIN" check -f "$WORK/check-job.yaml" 2>&1) || rc=$?
check "... the Job alone would start: its pod admitted on H200, exit 0" \
  bash -c '[ "$1" = 0 ] && grep -E "^Job.batch.volcano.sh +$2/chk-train +admitted +1/1 +NVIDIA-H200:1\$" <<<"$3" >/dev/null' _ "$rc" "$NS" "$out"
check "... and nothing was written to the cluster: no Deployment, no Job, no PodGroup" bash -c \
  "! kubectl -n $NS get deploy chk-web >/dev/null 2>&1 && ! kubectl -n $NS get vcjob chk-train >/dev/null 2>&1 && [ -z \"\$(pg_of chk-train)\" ]"
check "... and nothing charged to the queue" usage_is "$Q-k" NVIDIA-H200 pending 0 \
  || echo "      card.usage of $Q-k: $(k get queue "$Q-k" -o jsonpath='{.metadata.annotations.volcano\.sh/card\.usage}')"

# ---- two CREATEs of one PodGroup; a PodGroup created Inqueue ---------------------------------
vc_job jd "$Q-d" 2 '{"NVIDIA-H200":2}'
check "D's duplicate CREATE was refused by the API server (409), not by card-quota" grep -q AlreadyExists "$WORK/vc/jd.log"
wait_for 20 bash -c "[ \"\$(pods_of jd)\" = 2 ]"
vc_finish jd
check "nothing stays reserved once D's PodGroup is deleted" wait_for 20 bash -c \
  "! kubectl -n $NS get podgroup \"\$(pg_of jd)\" >/dev/null 2>&1; usage_is $Q-d NVIDIA-H200 reserved 0 && usage_is $Q-d NVIDIA-H200 pending 0"
out=$(k apply -f - 2>&1 <<EOF
{"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"PodGroup","metadata":{"name":"direct","namespace":"$NS","annotations":{"volcano.sh/card.request":"{\"NVIDIA-H200\":3}"}},"spec":{"queue":"$Q-d","minMember":1},"status":{"phase":"Inqueue"}}
EOF
)
check "a PodGroup created Inqueue that does not fit is refused" contains "$out" "queue $Q-d has insufficient NVIDIA-H200 quota: requested 3"

# ---- pods of kube-scheduler and others, with the install's conditions (issue 32) ------------
# plain_pod NAME QUEUE SCHEDULER RESOURCES-JSON [CARD-NAME] [NODE]
plain_pod() {
  local anns="{\"scheduling.volcano.sh/queue-name\":\"$2\"${5:+,\"volcano.sh/card.name\":\"$5\"}}" on=''
  [ -z "${6:-}" ] || on="\"nodeName\":\"$6\","
  k create -f - 2>&1 <<EOF
{"apiVersion":"v1","kind":"Pod","metadata":{"name":"$1","namespace":"$NS","annotations":$anns},
 "spec":{"schedulerName":"$3",$on"containers":[{"name":"c","image":"registry.k8s.io/pause:3.9","resources":{"limits":$4}}]}}
EOF
}
node_of() { k -n "$NS" get pod "$1" -o jsonpath='{.spec.nodeName}' 2>/dev/null; }
export -f node_of
out=$(plain_pod rdma "$Q-h" default-scheduler '{"nvidia.com/gpu":"1","nvidia.com/hostdev":"1"}' NVIDIA-H200)
check "a GPU pod that also asks for an RDMA host device is admitted" contains "$out" "pod/rdma created"
check "... kube-scheduler binds it" wait_for 20 bash -c "[ \"\$(node_of rdma)\" = $NODE ]"
check "... and it is charged one card of one model" wait_for 20 bash -c \
  "[ \"\$(kubectl -n $NS get pod rdma -o jsonpath='{.metadata.annotations.volcano\.sh/card\.charged}')\" = NVIDIA-H200 ] && usage_is $Q-h NVIDIA-H200 allocated 1"
out=$("${VC_SCHED[@]}" create --raw "/api/v1/namespaces/$NS/pods/rdma/binding" -f - 2>&1 <<EOF
{"apiVersion":"v1","kind":"Binding","metadata":{"name":"rdma","namespace":"$NS"},"target":{"apiVersion":"v1","kind":"Node","name":"$NODE"}}
EOF
)
check "a scheduler's retried bind of a bound pod is refused by card-quota" contains "$out" "pod $NS/rdma is already bound to node $NODE"
# Every card pod is checked at its CREATE, whatever its scheduler: one of a scheduler
# nobody runs is refused in a full queue, and admitted where there is room.
out=$(plain_pod nobody-1 "$Q-h" nobody '{"nvidia.com/gpu":"1"}')
check "a card pod of another scheduler, into a full queue, is refused at its CREATE" \
  contains "$out" "queue $Q-h has insufficient NVIDIA-H200 quota"
queue "$Q-legacy" '{"NVIDIA-H200":1}' >/dev/null
sleep 1
out=$(plain_pod legacy "$Q-legacy" nobody '{"nvidia.com/gpu":"1"}')
check "... and admitted where its queue has room (no card.name needed)" contains "$out" "pod/legacy created"
# The quota cut under it, the legacy POST .../bindings is checked like pods/binding.
queue "$Q-legacy" '{"NVIDIA-H200":0}' >/dev/null
sleep 1
out=$("${VC_SCHED[@]}" -n "$NS" create -f - 2>&1 <<EOF
{"apiVersion":"v1","kind":"Binding","metadata":{"name":"legacy"},"target":{"apiVersion":"v1","kind":"Node","name":"$NODE"}}
EOF
)
check "a bind through the legacy POST .../bindings past the queue's quota is refused" \
  contains "$out" "queue $Q-legacy has insufficient NVIDIA-H200 quota"
out=$(plain_pod placed "$Q-h" no-such-scheduler '{"nvidia.com/gpu":"1"}' NVIDIA-H200 "$NODE")
check "a pod of another scheduler created on its node, into a full queue, is refused" \
  contains "$out" "queue $Q-h has insufficient NVIDIA-H200 quota"

# A card pod created outside card-quota (its namespace out of the hooks' selector, as
# before an install) names a PodGroup not created yet: the PodGroup's CREATE would move
# its card into a full queue, and the install's hooks send that CREATE to card-quota
# (issue 46 #7: no hook selected a PodGroup CREATE without card.request).
k label namespace "$NS" card-quota-e2e- >/dev/null
out=$(k create -f - 2>&1 <<EOF
{"apiVersion":"v1","kind":"Pod","metadata":{"name":"early","namespace":"$NS","annotations":{"scheduling.k8s.io/group-name":"adopter","volcano.sh/card.name":"NVIDIA-H200"}},
 "spec":{"schedulerName":"nobody","containers":[{"name":"c","image":"registry.k8s.io/pause:3.9","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}
EOF
)
k label namespace "$NS" "card-quota-e2e=$RUN" >/dev/null
check "a card pod created outside card-quota's hooks is stored unstamped" contains "$out" "pod/early created"
sleep 1
out=$(k create -f - 2>&1 <<EOF
{"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"PodGroup","metadata":{"name":"adopter","namespace":"$NS"},"spec":{"queue":"$Q-h","minMember":1}}
EOF
)
check "... the PodGroup it names, created in a full queue with no card.request, is refused" \
  contains "$out" "podgroup $NS/adopter cannot be created in queue $Q-h: it would move pod $NS/early"
k -n "$NS" delete pod early --wait=false >/dev/null 2>&1

# ---- a Namespace naming a queue (Volcano's PodGroup webhook maps `default` there) -----------
queue "$Q-n" '{"NVIDIA-H200":1}' >/dev/null
k annotate namespace "$NS" "scheduling.volcano.sh/queue-name=$Q-n" >/dev/null
sleep 1
k -n "$NS" create -f - >/dev/null <<EOF
{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"ns-queue"},
 "spec":{"replicas":2,"selector":{"matchLabels":{"app":"ns-queue"}},
  "template":{"metadata":{"labels":{"app":"ns-queue"},"annotations":{"volcano.sh/card.name":"NVIDIA-H200"}},
   "spec":{"schedulerName":"volcano","containers":[{"name":"c","image":"registry.k8s.io/pause:3.9","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}}}
EOF
check "a Deployment of Volcano's scheduler naming no queue is charged to its Namespace's queue" wait_for 30 bash -c \
  "[ \"\$(kubectl -n $NS get pods -l app=ns-queue -o jsonpath='{.items[*].metadata.annotations.volcano\.sh/card\.queue}')\" = $Q-n ] && usage_is $Q-n NVIDIA-H200 pending 1"
check "... and its second replica is refused by that queue's quota" wait_for 30 bash -c \
  "kubectl -n $NS get events --field-selector reason=FailedCreate -o jsonpath='{.items[*].message}' | grep -qF 'queue $Q-n has insufficient NVIDIA-H200 quota'"
k -n "$NS" delete deployment ns-queue --wait=false >/dev/null
k annotate namespace "$NS" scheduling.volcano.sh/queue-name- >/dev/null

# ---- card-quota down: only card work waits ---------------------------------------------------
kill "$SERVE"; wait "$SERVE" 2>/dev/null
# A queue tree without card annotations is built while card-quota is down (issue 46 #8).
tree() { printf '{"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"Queue","metadata":{"name":"%s","labels":{"card-quota-e2e":"%s"}},"spec":{"weight":1,"parent":"%s"}}' \
  "$1" "$RUN" "$2" | k create -f - 2>&1; }
out=$(tree "$Q-tree" root)
out2=$(tree "$Q-tree-c" "$Q-tree")
check "card-quota down: a cardless Queue is created under a cardless parent" contains "$out $out2" "queue.scheduling.volcano.sh/$Q-tree-c created"
out=$(k patch queue "$Q-c" --type merge -p "{\"spec\":{\"parent\":\"$Q-tree\"}}" 2>&1)
check "... while moving a queue with a card quota waits for card-quota (fail closed)" contains "$out" "failed calling webhook"
out=$(plain_pod web "$Q-d" default-scheduler '{"cpu":"10m"}')
check "card-quota down: a cardless pod of kube-scheduler is created" contains "$out" "pod/web created"
check "... and bound (the binding hooks fail open with pins on)" wait_for 20 bash -c "[ \"\$(node_of web)\" = $NODE ]"
out=$(plain_pod gpu-down "$Q-d" default-scheduler '{"nvidia.com/gpu":"1"}' NVIDIA-H200)
check "... while a card pod waits: its creation fails closed" contains "$out" "failed calling webhook"
vc_job je "$Q-d" 1 '' 0
check "card-quota down: a cardless Job's PodGroup is created" bash -c "[ -n \"\$(pg_of je)\" ]"
check "... enqueued, and its pod created" wait_for 20 bash -c "[ \"\$(pods_of je)\" = 1 ]"
out=$(k patch queue "$Q-d" --type json -p '[{"op":"add","path":"/spec/parent","value":"root"}]' 2>&1)
check "... a Queue is patched with spec.parent: root as Volcano does" contains "$out" "patched"
vc_job jf "$Q-d" 1 '{"NVIDIA-H200":1}'
check "... a card Job's PodGroup is created (it only waits)" bash -c "[ -n \"\$(pg_of jf)\" ]"
sleep 3
check "... but its enqueue waits for card-quota (fail closed)" bash -c "[ \"\$(phase_of jf)\" != Inqueue ] && [ \"\$(phase_of jf)\" != Running ]"
serve
check "card-quota back: the card Job is enqueued and runs" wait_for 30 bash -c "[ \"\$(pods_of jf)\" = 1 ]"
check "... and the cardless pod is bound" wait_for 20 bash -c \
  "[ \"\$(kubectl -n $NS get pods -l volcano.sh/job-name=je -o jsonpath='{.items[*].spec.nodeName}')\" = $NODE ]"
check "usage is exact after the restart" wait_for 20 bash -c "usage_is $Q-d NVIDIA-H200 allocated 1 && usage_is $Q-d NVIDIA-H200 reserved 0" \
  || diagnose "$Q-d" jf

log "RESULT: $PASSED passed, $FAILED failed"
exit "$FAILED"
