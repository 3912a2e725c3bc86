#!/usr/bin/env bash
# card-quota as users run it, on a real node (../shared/tools/k8s-1.37/kubelet.sh): the
# image built by `make image` loaded into the node, the chart installed with --wait, every
# webhook reached through the chart's Service with the chart's certificates, under its
# ServiceAccount, securityContext and probes. GPU pods (batch Jobs, and Volcano Jobs with
# Volcano's part played from its recorded writes) run and finish there, and quota comes
# back through the real pod lifecycle; a card-quota pod is force-deleted mid-burst, both
# are replaced by a rolling restart under load; the uninstall leaves nothing.
#
#   KUBECONFIG=<kubeconfig> CP_DIR=<test control plane> HELM=<helm> e2e/real-node.sh
#
# Needs a Ready node of kubelet.sh ($KL_NODE, default kl-node-1) holding card-quota's
# image (`kubelet.sh load target/image/card-quota-<version>.tar ghcr.io/card-quota/card-quota`)
# and its test image localhost/kl-busybox:1; CP_DIR (the vc-*.kubeconfig identities that play
# Volcano's programs). The node gets the GPU Feature Discovery label
# of a model and 2 `nvidia.com/gpu` in its status (no device plugin: pods asking for them
# run). Exit status: number of failed checks.
set -uo pipefail
CHART=$(cd "$(dirname "$0")/../charts/card-quota" && pwd)
: "${KUBECONFIG:?set KUBECONFIG}"
: "${CP_DIR:?set CP_DIR to the test control plane (its vc-*.kubeconfig files)}"
HELM=${HELM:-helm}
NODE=${KL_NODE:-kl-node-1}
NS=card-quota
RUN=r$(date +%s | tail -c 5)$RANDOM
APP=cq-real-$RUN
Q=cq-real-$RUN
MODEL=NVIDIA-H200
WORK=$(mktemp -d /tmp/cq-real.XXXXXX)
START=$(date +%s)
PASSED=0
FAILED=0
log() { printf '[%4ss] %s\n' $(( $(date +%s) - START )) "$*"; }
check() { local name=$1; shift; if "$@"; then PASSED=$((PASSED + 1)); log "PASS: $name"; else FAILED=$((FAILED + 1)); log "FAIL: $name"; echo "      command: $*"; fi; }
contains() { grep -qF -- "$2" <<<"$1"; }
k() { kubectl "$@"; }
wait_for() { local t=$1; shift; local end=$(( $(date +%s) + t )); while ! "$@" >/dev/null 2>&1; do [ "$(date +%s)" -ge $end ] && return 1; sleep 0.3; done; }
usage_field() { k get queue "$1" -o jsonpath='{.metadata.annotations.volcano\.sh/card\.usage}' | jq -r --arg m "$MODEL" --arg f "$2" '.[$m][$f] // 0'; }
usage_is() { [ "$(usage_field "$1" "$2")" = "$3" ]; }
export -f usage_field usage_is k
export MODEL
cleanup() {
  "$HELM" uninstall card-quota -n "$NS" --wait >/dev/null 2>&1
  k delete namespace "$APP" "$NS" --wait=false --ignore-not-found >/dev/null 2>&1
  k delete queue "$Q" "$Q-burst" "$Q-roll" "$Q-wait" --ignore-not-found >/dev/null 2>&1
  k delete clusterrolebinding "$APP-vc" --ignore-not-found >/dev/null 2>&1
  k label node "$NODE" nvidia.com/gpu.product- >/dev/null 2>&1
  k patch node "$NODE" --subresource=status --type=json \
    -p '[{"op":"remove","path":"/status/capacity/nvidia.com~1gpu"}]' >/dev/null 2>&1
  [ -n "${E2E_KEEP:-}" ] && echo "logs in $WORK" || rm -rf "$WORK"
}

if ! k get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -q True; then
  echo "no Ready node $NODE (start one with ../shared/tools/k8s-1.37/kubelet.sh start)"; exit 100
fi
for o in mutatingwebhookconfiguration/card-quota namespace/card-quota; do
  if k get "$o" >/dev/null 2>&1; then echo "$o exists in this cluster; not installing over it"; exit 100; fi
done
trap cleanup EXIT

# The node's cards: GPU Feature Discovery's label and the device plugin's capacity.
k label node "$NODE" "nvidia.com/gpu.product=$MODEL" --overwrite >/dev/null
k patch node "$NODE" --subresource=status --type=merge -p '{"status":{"capacity":{"nvidia.com/gpu":"2"}}}' >/dev/null
wait_for 20 bash -c "[ \"\$(kubectl get node $NODE -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')\" = 2 ]"
k create namespace "$APP" >/dev/null

# ---- the install, as the README's ------------------------------------------------------
# On the real node only (the chart's nodeSelector value): other e2e scripts' fake nodes
# have CPU and would take the pods, which never run there.
t0=$(date +%s)
if ! "$HELM" install card-quota "$CHART" -n "$NS" --create-namespace --wait --timeout 180s \
  --set image.repository=ghcr.io/card-quota/card-quota \
  --set-string "nodeSelector.kubernetes\.io/hostname=$NODE" > "$WORK/install.out" 2>&1; then
  FAILED=$((FAILED + 1)); log "FAIL: helm install --wait"
  sed 's/^/      /' "$WORK/install.out"
  k -n "$NS" get pods -o wide 2>&1 | sed 's/^/      /'
  k -n "$NS" get events --sort-by=.lastTimestamp 2>&1 | tail -15 | sed 's/^/      /'
  exit "$FAILED"
fi
log "helm install --wait: $(( $(date +%s) - t0 )) s"
check "the chart's 2 replicas run from the loaded image on $NODE, ready (probes pass)" bash -c \
  "[ \"\$(kubectl -n $NS get pods -l app.kubernetes.io/name=card-quota -o json | jq '[.items[] | select(.status.phase == \"Running\" and .spec.nodeName == \"$NODE\" and (.status.containerStatuses[0].ready) and (.spec.containers[0].image | startswith(\"ghcr.io/card-quota/card-quota:\")))] | length')\" = 2 ]"
check "... as the image's non-root user, read-only root filesystem, under the chart's ServiceAccount" bash -c \
  "kubectl -n $NS get pods -l app.kubernetes.io/name=card-quota -o json | jq -e 'all(.items[]; .spec.serviceAccountName == \"card-quota\" and .spec.containers[0].securityContext.readOnlyRootFilesystem == true and (.spec.securityContext.runAsNonRoot // .spec.containers[0].securityContext.runAsNonRoot) == true)' >/dev/null"

queue() { # name quota-json
  k apply -f - >/dev/null <<EOF
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata:
  name: $1
  annotations: {volcano.sh/card.quota: '$2'}
spec: {weight: 1}
EOF
}
# Right after --wait, kube-proxy may not have programmed the Service yet: a client sees
# "connection refused" for a moment, and tries again, as this does (up to 20 s).
retried() { # command...: its output, once it is not an unreachable webhook
  local out i
  for i in $(seq 40); do
    out=$("$@" 2>&1)
    grep -q "failed calling webhook" <<<"$out" || break
    sleep 0.5
  done
  printf '%s' "$out"
}
export -f retried
out=$(retried queue "$Q" "{\"$MODEL\":1}")
check "a Queue's card quota is validated through the Service" [ -z "$out" ]

# ---- batch Jobs that run and finish ---------------------------------------------------
job() { # name seconds [queue [pods at once]]
  k -n "$APP" apply -f - >/dev/null <<EOF
apiVersion: batch/v1
kind: Job
metadata: {name: $1}
spec:
  parallelism: ${4:-1}
  completions: ${4:-1}
  backoffLimit: 0
  template:
    metadata: {annotations: {scheduling.volcano.sh/queue-name: ${3:-$Q}}}
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 1
      containers:
        - name: work
          image: localhost/kl-busybox:1
          imagePullPolicy: Never
          command: [sh, -c, "sleep $2"]
          resources: {limits: {nvidia.com/gpu: 1}}
EOF
}
job_pod() { k -n "$APP" get pods -l "job-name=$1" -o json | jq -r "[.items[] | select(.status.phase == \"$2\")] | length"; }
export -f job_pod
export APP
job first 6
check "a GPU Job's pod runs on the real node, pinned to its model" wait_for 30 bash -c \
  "[ \"\$(job_pod first Running)\" = 1 ] && [ \"\$(kubectl -n $APP get pods -l job-name=first -o jsonpath='{.items[0].spec.nodeSelector.nvidia\.com/gpu\.product}')\" = $MODEL ]"
check "... and is counted: allocated 1" wait_for 20 usage_is "$Q" allocated 1
job second 2
check "a second Job waits: its pod is refused at the quota (the Job controller says why)" wait_for 20 bash -c \
  "kubectl -n $APP get events --field-selector involvedObject.name=second,reason=FailedCreate -o jsonpath='{.items[*].message}' | grep -q 'queue $Q has insufficient $MODEL quota: requested 1, in use 1'"
check "the first Job completes on the node" wait_for 30 bash -c "[ \"\$(job_pod first Succeeded)\" = 1 ]"
done_at=$(date +%s%N)
if wait_for 60 bash -c "[ \"\$(job_pod second Running)\$(job_pod second Succeeded)\" != 00 ]"; then
  waited=$(( ($(date +%s%N) - done_at) / 1000000 ))
  log "the second Job's pod started ${waited} ms after the first one's completed (the Job controller's retry)"
  check "... and the waiting Job starts within 15 s of it: its cards came back when the pod finished" [ "$waited" -le 15000 ]
else
  check "... and the waiting Job starts once the first has finished" false
fi
check "both Jobs complete, and the queue's usage goes back to 0" wait_for 40 bash -c \
  "[ \"\$(job_pod second Succeeded)\" = 1 ] && usage_is $Q allocated 0 && usage_is $Q pending 0"

# ---- pods that wait for room (volcano.sh/card.full: wait), released as cards come back ------
out=$(retried queue "$Q-wait" "{\"$MODEL\":1}")
k annotate queue "$Q-wait" volcano.sh/card.full=wait --overwrite >/dev/null
job waits 4 "$Q-wait" 3
gated_pods() { k -n "$APP" get pods -l job-name=waits -o json | jq '[.items[] | select(any(.spec.schedulingGates[]?; .name == "volcano.sh/card-quota"))] | length'; }
export -f gated_pods
check "a Job of 3 parallel GPU pods into a quota of 1 (card.full: wait): 1 runs on the node, 2 wait behind card-quota's gate (none refused)" \
  wait_for 30 bash -c "[ \"\$(job_pod waits Running)\" = 1 ] && [ \"\$(gated_pods)\" = 2 ]"
check "... counted as waiting, not in use" wait_for 20 bash -c "usage_is $Q-wait waiting 2"
# From each pod's end (its phase Succeeded: its card is free) to the next pod's binding.
lat=()
prev_s=0
prev_b=1
t_done=""
end=$(( $(date +%s) + 90 ))
while [ "$(date +%s)" -lt "$end" ]; do
  j=$(k -n "$APP" get pods -l job-name=waits -o json)
  now=$(date +%s%N)
  s=$(jq '[.items[] | select(.status.phase == "Succeeded")] | length' <<<"$j")
  b=$(jq '[.items[] | select(.spec.nodeName != null)] | length' <<<"$j")
  if [ "$s" -gt "$prev_s" ]; then t_done=$now; prev_s=$s; fi
  if [ "$b" -gt "$prev_b" ] && [ -n "$t_done" ]; then lat+=($(( (now - t_done) / 1000000 ))); prev_b=$b; t_done=""; fi
  [ "$s" = 3 ] && break
  sleep 0.2
done
log "a pod's end -> the next waiting pod bound on the node, ms: ${lat[*]:-none}"
check "... each waiting pod released and bound within 5 s of the card coming back (${lat[*]:-none} ms)" \
  bash -c "[ ${#lat[@]} = 2 ] && [ ${lat[0]:-99999} -le 5000 ] && [ ${lat[1]:-99999} -le 5000 ]"
check "... all 3 complete, and the queue has nothing in use or waiting" wait_for 30 bash -c \
  "[ \"\$(job_pod waits Succeeded)\" = 3 ] && usage_is $Q-wait allocated 0 && usage_is $Q-wait waiting 0"

# ---- Volcano Jobs that run and finish ---------------------------------------------------
# Volcano's programs are played from their recorded writes (e2e/volcano-standin.sh, with
# the control plane's vc-*.kubeconfig identities); the workers run on the node and finish,
# and the waiting Job is enqueued because the first one's pod completed.
vc_jobs() (
  NS=$APP PIDS=()
  # shellcheck source=e2e/volcano-standin.sh
  . "$(dirname "$0")/volcano-standin.sh"
  vc_loop
  vc_job vc-first "$Q" 1 '' 1 6
  check "a Volcano Job's worker runs on the real node (played Volcano: PodGroup enqueued, pod created and bound)" \
    wait_for 40 bash -c "kubectl -n $APP get pods -l volcano.sh/job-name=vc-first -o jsonpath='{.items[0].status.phase}' | grep -qx Running"
  vc_job vc-second "$Q" 1 '' 1 2
  check "a second Volcano Job waits at Volcano's enqueue: held, no pod" wait_for 20 bash -c \
    "[ -s $WORK/vc/vc-second.held ] && [ \"\$(pods_of vc-second)\" = 0 ]"
  check "... with the quota's message" grep -q "queue $Q has insufficient $MODEL quota: requested 1, in use 1" "$WORK/vc/vc-second.held"
  check "the first Job's worker succeeds on the node" wait_for 40 bash -c \
    "kubectl -n $APP get pods -l volcano.sh/job-name=vc-first -o jsonpath='{.items[0].status.phase}' | grep -qx Succeeded"
  # Both ends as the kubelet stamped them: the first worker's exit, the second's start.
  started() { k -n "$APP" get pods -l "volcano.sh/job-name=$1" -o json |
    jq -r '.items[0].status.containerStatuses[0].state | (.running.startedAt // .terminated.startedAt // empty)'; }
  if wait_for 60 bash -c "[ -n \"\$(kubectl -n $APP get pods -l volcano.sh/job-name=vc-second -o json | jq -r '.items[0].status.containerStatuses[0].state | (.running.startedAt // .terminated.startedAt // empty)')\" ]"; then
    finished=$(k -n "$APP" get pods -l volcano.sh/job-name=vc-first -o jsonpath='{.items[0].status.containerStatuses[0].state.terminated.finishedAt}')
    waited=$(( $(date -d "$(started vc-second)" +%s) - $(date -d "$finished" +%s) ))
    log "the second Volcano Job's worker started ${waited} s after the first one's exited (kubelet's timestamps; held $(wc -l < "$WORK/vc/vc-second.held") enqueue cycles)"
    check "... and the waiting Job runs within 15 s of it: its cards came back when the worker finished" [ "$waited" -le 15 ]
  else
    check "... and the waiting Job runs once the first has finished" false
  fi
  check "the second Job completes too, both PodGroups are gone and the queue's usage is back to 0" wait_for 40 bash -c \
    "[ ! -f $WORK/vc/vc-second.job ] && [ -z \"\$(kubectl -n $APP get podgroups -o name)\" ] && usage_is $Q allocated 0 && usage_is $Q pending 0"
  touch "$WORK/vc/stop"
  wait "${PIDS[@]}" 2>/dev/null
  echo "$PASSED $FAILED" > "$WORK/vc-counts"
)
# Volcano's programs get broad rights from its chart; the stand-in's identities too.
k create clusterrolebinding "$APP-vc" --clusterrole=cluster-admin \
  --user=system:serviceaccount:volcano-system:volcano-scheduler \
  --user=system:serviceaccount:volcano-system:volcano-controllers >/dev/null
rm -f "$WORK/vc-counts"
vc_jobs
if ! read -r PASSED FAILED < "$WORK/vc-counts"; then
  FAILED=$((FAILED + 1)); log "FAIL: the Volcano Jobs section stopped before its end"
fi
k delete clusterrolebinding "$APP-vc" >/dev/null 2>&1

# ---- upgrades that really roll the pods: deny -> warn -> deny ------------------------------
gpu_pod() { # name: a plain GPU pod of queue $Q that runs until deleted
  kubectl -n "$APP" run "$1" --image=localhost/kl-busybox:1 --image-pull-policy=Never --restart=Never \
    --annotations="scheduling.volcano.sh/queue-name=$Q" \
    --overrides='{"apiVersion":"v1","spec":{"terminationGracePeriodSeconds":1,"containers":[{"name":"c","image":"localhost/kl-busybox:1","imagePullPolicy":"Never","command":["sleep","3600"],"resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}' 2>&1
}
export -f gpu_pod
replicas_now() { k -n "$NS" get pods -l app.kubernetes.io/name=card-quota -o json |
  jq -r '[.items[] | select(.metadata.deletionTimestamp == null) | .metadata.name] | sort | join(" ")'; }
upgrade() { # enforcement: helm upgrade --reuse-values, as docs/install.md writes it
  local before after
  before=$(replicas_now)
  "$HELM" upgrade card-quota "$CHART" -n "$NS" --reuse-values --set "enforcement=$1" --wait --timeout 180s > "$WORK/upgrade-$1.out" 2>&1 ||
    sed 's/^/      /' "$WORK/upgrade-$1.out"
  # --wait returns once the new pods are ready; the old ones may still be terminating,
  # and serve until they are gone (a request right after the upgrade may meet one).
  wait_for 60 bash -c "kubectl -n $NS get pods -l app.kubernetes.io/name=card-quota -o json | jq -e '(.items | length) == 2 and all(.items[]; .metadata.deletionTimestamp == null and .status.containerStatuses[0].ready and (.spec.containers[0].args | index(\"--enforcement=$1\")))'"
  after=$(replicas_now)
  check "helm upgrade --set enforcement=$1 rolls both pods (new: $after) and they run with --enforcement=$1" \
    bash -c "[ -n '$after' ] && [ -z \"\$(comm -12 <(tr ' ' '\n' <<<'$before' | sort) <(tr ' ' '\n' <<<'$after' | sort))\" ] && [ \$(wc -w <<<'$after') = 2 ]"
}
out=$(retried gpu_pod w1)
check "in deny, a GPU pod within the quota runs" contains "$out" "pod/w1 created"
upgrade warn
out=$(retried gpu_pod w2)
check "... in warn, the next one, past the quota, is admitted with the warning" bash -c \
  "grep -qF 'pod/w2 created' <<<\"\$1\" && grep -qF 'card-quota admitted this because' <<<\"\$1\"" _ "$out"
upgrade deny
out=$(retried gpu_pod w3)
check "... back in deny, the one after is refused at the quota" contains "$out" "queue $Q has insufficient $MODEL quota: requested 1, in use 2"
k -n "$APP" delete pod w1 w2 w3 --wait=false >/dev/null 2>&1

# ---- one replica and back to two: the PodDisruptionBudget only with two ------------------
scale_to() { # replicas
  "$HELM" upgrade card-quota "$CHART" -n "$NS" --reuse-values --set "replicas=$1" --wait --timeout 180s > "$WORK/replicas-$1.out" 2>&1 ||
    sed 's/^/      /' "$WORK/replicas-$1.out"
  wait_for 60 bash -c "kubectl -n $NS get pods -l app.kubernetes.io/name=card-quota -o json | jq -e '(.items | length) == $1 and all(.items[]; .metadata.deletionTimestamp == null and .status.containerStatuses[0].ready)'"
}
scale_to 1
check "helm upgrade --set replicas=1: one card-quota pod, ready, and no PodDisruptionBudget (it would block every drain of its node)" bash -c \
  "[ \"\$(kubectl -n $NS get pods -l app.kubernetes.io/name=card-quota -o name | wc -l)\" = 1 ] && [ -z \"\$(kubectl -n $NS get pdb -o name)\" ]"
# The pods above are gone by now (a grace period of 1 s): the queue's one card is free.
wait_for 30 bash -c "[ -z \"\$(kubectl -n $APP get pods -o name | grep -E '^pod/w[123]$')\" ]"
out=$(retried gpu_pod w4)
check "... and it alone decides: a GPU pod within the quota runs" contains "$out" "pod/w4 created"
out=$(retried gpu_pod w5)
check "... and the next is refused at the quota" contains "$out" "queue $Q has insufficient $MODEL quota: requested 1, in use 1"
scale_to 2
check "back to replicas=2: two pods ready and a PodDisruptionBudget" bash -c \
  "[ \"\$(kubectl -n $NS get pods -l app.kubernetes.io/name=card-quota -o name | wc -l)\" = 2 ] && [ -n \"\$(kubectl -n $NS get pdb -o name)\" ]"
k -n "$APP" delete pod w4 w5 --wait=false --ignore-not-found >/dev/null 2>&1

# ---- a card-quota pod force-deleted mid-burst --------------------------------------------
queue "$Q-burst" "{\"$MODEL\":20}" >/dev/null 2>&1
sleep 1
burst_pod() { # name queue: creates the pod, retrying what fails for another reason than the quota
  local i out
  for i in $(seq 20); do
    out=$(kubectl -n "$APP" run "$1" --image=localhost/kl-busybox:1 --image-pull-policy=Never --restart=Never \
      --annotations="scheduling.volcano.sh/queue-name=$2" \
      --overrides='{"apiVersion":"v1","spec":{"terminationGracePeriodSeconds":1,"containers":[{"name":"c","image":"localhost/kl-busybox:1","imagePullPolicy":"Never","command":["sleep","3600"],"resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}' 2>&1)
    case "$out" in
      *created*) echo created; return ;;
      *"insufficient $MODEL quota"*) echo "refused ${out##*: requested}"; return ;;
      *AlreadyExists*) echo created; return ;;
    esac
    sleep 0.5
  done
  echo "failed: $out"
}
export -f burst_pod
export Q
# A serving replica (the upgrades' old pods may still be terminating).
victim=$(replicas_now | cut -d' ' -f1)
( sleep 1; kubectl -n "$NS" delete pod "$victim" --force --grace-period=0 >/dev/null 2>&1 ) &
seq 1 40 | xargs -P 8 -I{} bash -c 'burst_pod b{} $Q-burst' > "$WORK/burst.out"
wait
created=$(grep -c '^created' "$WORK/burst.out"); refused=$(grep -c '^refused' "$WORK/burst.out")
log "burst: $created created, $refused refused, $((40 - created - refused)) failed (replica $victim force-deleted 1 s in)"
sort "$WORK/burst.out" | uniq -c | sort -rn | head -4 | while read -r line; do log "  $line"; done
check "40 GPU pods into a quota of 20 with a replica force-deleted mid-burst: at most 20 created, every other one refused at the quota" \
  bash -c "[ $created -le 20 ] && [ $((created + refused)) = 40 ]"
# The killed replica's hold of headroom counts for every other replica until it expires
# (40 s after they first saw it): until then they may refuse a little early, never late.
# The refused pods, created again once it has expired, fill the quota exactly.
if [ "$created" -lt 20 ]; then
  sleep 45
  grep -n '^refused' "$WORK/burst.out" | cut -d: -f1 | xargs -P 8 -I{} bash -c 'burst_pod b{} $Q-burst' > "$WORK/burst2.out"
  log "again, 45 s later: $(grep -c '^created' "$WORK/burst2.out") created, $(grep -c '^refused' "$WORK/burst2.out") refused"
fi
check "... 20 pods exist and the queue's usage counts all 20 (nothing lost)" wait_for 30 bash -c \
  "[ \"\$(kubectl -n $APP get pods -o name | grep -c '^pod/b')\" = 20 ] && [ \$(( \$(usage_field $Q-burst allocated) + \$(usage_field $Q-burst pending) )) = 20 ]"
check "... and the Deployment is back to 2 ready replicas" wait_for 60 bash -c \
  "[ \"\$(kubectl -n $NS get deploy card-quota -o jsonpath='{.status.readyReplicas}')\" = 2 ]"
k -n "$APP" delete pods --all --wait=false >/dev/null 2>&1

# ---- a rolling restart under a stream of pod creations ----------------------------------
# `kubectl rollout restart`, as an upgrade or a node drain rolls the pods: the old replicas
# stop gracefully (they give their holds back), the new ones sync before they are Ready.
queue "$Q-roll" "{\"$MODEL\":20}" >/dev/null 2>&1
sleep 1
before=$(replicas_now)
( sleep 1; kubectl -n "$NS" rollout restart deployment card-quota >/dev/null 2>&1 ) &
seq 1 40 | xargs -P 4 -I{} bash -c 'burst_pod r{} $Q-roll; sleep 0.3' > "$WORK/roll.out"
wait
kubectl -n "$NS" rollout status deployment card-quota --timeout 120s >/dev/null 2>&1
wait_for 60 bash -c "[ \"\$(kubectl -n $NS get pods -l app.kubernetes.io/name=card-quota -o name | wc -l)\" = 2 ]"
after=$(replicas_now)
created=$(grep -c '^created' "$WORK/roll.out"); refused=$(grep -c '^refused' "$WORK/roll.out")
log "rolling restart: $created created, $refused refused, $((40 - created - refused)) failed; replicas $before -> $after"
check "40 GPU pods into a quota of 20 across a rolling restart: both replicas replaced, at most 20 created, every other one refused at the quota" \
  bash -c "[ $created -le 20 ] && [ $((created + refused)) = 40 ] && [ -z \"\$(comm -12 <(tr ' ' '\n' <<<'$before' | sort) <(tr ' ' '\n' <<<'$after' | sort))\" ]"
if [ "$created" -lt 20 ]; then
  log "rolling restart: $((20 - created)) refused early; the refused ones created again in 45 s"
  sleep 45
  grep -n '^refused' "$WORK/roll.out" | cut -d: -f1 | xargs -P 4 -I{} bash -c 'burst_pod r{} $Q-roll' > "$WORK/roll2.out"
fi
check "... the queue's usage counts all 20 (nothing lost)" wait_for 30 bash -c \
  "[ \"\$(kubectl -n $APP get pods -o name | grep -c '^pod/r')\" = 20 ] && [ \$(( \$(usage_field $Q-roll allocated) + \$(usage_field $Q-roll pending) )) = 20 ]"
k -n "$APP" delete pods --all --wait=false >/dev/null 2>&1

# ---- uninstall ---------------------------------------------------------------------------
# As docs/install.md says: helm uninstall, then the namespace (its ledgers are runtime
# state that Helm did not create).
"$HELM" uninstall card-quota -n "$NS" --wait >/dev/null 2>&1
left=$(k get mutatingwebhookconfiguration,validatingwebhookconfiguration,clusterrole,clusterrolebinding -o name 2>/dev/null | grep card-quota)
left+=$(k -n "$NS" get deploy,svc,sa,secret,role,rolebinding,pdb,networkpolicy -l app.kubernetes.io/name=card-quota -o name 2>/dev/null)
check "helm uninstall leaves no hook, RBAC or workload object" [ -z "$left" ]
k delete namespace "$NS" --wait --timeout 60s >/dev/null 2>&1
left+=$(k get namespace "$NS" -o name 2>/dev/null)
check "... and deleting the namespace takes the ledgers with it" [ -z "$left" ]
out=$(k -n "$APP" run after --image=localhost/kl-busybox:1 --image-pull-policy=Never --restart=Never \
  --annotations="scheduling.volcano.sh/queue-name=$Q" \
  --overrides='{"apiVersion":"v1","spec":{"containers":[{"name":"c","image":"localhost/kl-busybox:1","imagePullPolicy":"Never","command":["true"],"resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}' 2>&1)
check "... and a GPU pod is created with no webhook in its way" contains "$out" "pod/after created"
[ -n "$left" ] && echo "      left: $left"

log "RESULT: $PASSED passed, $FAILED failed"
exit "$FAILED"
