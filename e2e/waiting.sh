#!/usr/bin/env bash
# Pods that wait for room (volcano.sh/card.full: wait) on a real control plane: the real
# kube-scheduler binds, the real kube-controller-manager's ReplicaSet controller makes
# the pods, two card-quota replicas answer behind a round-robin (as the chart's Service
# spreads connections) and the leader's releaser removes the gates. A fake node offers
# the cards (pods bind, nothing runs).
#
#   KUBECONFIG=<kubeconfig> e2e/waiting.sh path/to/card-quota
#
# Checks: a Deployment scaled past its quota waits (no quota held, told why); each freed
# card goes to the oldest waiting pod, bound within 5 s (latencies printed); strict and
# best-effort order; 200 waiting pods whose gates are all removed at once by hand while
# 40 bound ones go never pass the quota; with card-quota down waiting pods stay waiting
# and cardless pods are created; `card-quota ungate` after the webhooks are removed
# leaves no gated pod. E2E_PROFILE picks the cargo profile of the round-robin proxy
# (lib.sh). Exit status: number of failed checks (100: the cluster is not fit to test).
set -uo pipefail
BIN=${1:?usage: e2e/waiting.sh path/to/card-quota}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
REPO=$(cd "$(dirname "$0")/.." && pwd)
: "${KUBECONFIG:?set KUBECONFIG}"
export KUBECONFIG
RUN=$(date +%s | tail -c 6)$RANDOM
NS=cq-wait-$RUN
SYS=cq-wait-$RUN-system
Q=cq-wait-$RUN
NODE=$Q-h200
PORT=${E2E_PORT:-19843}
WORK=$(mktemp -d /tmp/cq-wait.XXXXXX)
START=$(date +%s)
PASSED=0
FAILED=0
PIDS=()
log() { printf '[%4ss] %s\n' $(( $(date +%s) - START )) "$*"; }
check() { local name=$1; shift; if "$@"; then PASSED=$((PASSED + 1)); log "PASS: $name"; else FAILED=$((FAILED + 1)); log "FAIL: $name"; echo "      command: $*"; fi; }
k() { kubectl "$@"; }
wait_for() { local t=$1; shift; local end=$(( $(date +%s) + t )); while ! "$@" >/dev/null 2>&1; do [ "$(date +%s)" -ge $end ] && return 1; sleep 0.2; done; }
export -f k
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  k delete mutatingwebhookconfiguration,validatingwebhookconfiguration "$Q" --ignore-not-found >/dev/null 2>&1
  k delete namespace "$NS" "$SYS" --wait=false --ignore-not-found >/dev/null 2>&1
  k delete queue "$Q" "$Q-burst" "$Q-order" --ignore-not-found >/dev/null 2>&1
  k delete node "$NODE" --ignore-not-found >/dev/null 2>&1
  e2e_remove_identity "$Q"
  [ -n "${E2E_KEEP:-}" ] && echo "logs in $WORK" || rm -rf "$WORK"
}
trap cleanup EXIT
# shellcheck source=e2e/lib.sh
. "$(dirname "$0")/lib.sh"

k get crd queues.scheduling.volcano.sh >/dev/null 2>&1 || { echo "no Volcano Queue CRD"; exit 100; }
e2e_build_burst "$REPO" || { echo "could not build the round-robin proxy"; exit 100; }
e2e_single_node_setup 64 1000
replica() { # i: starts replica i (port PORT+i) as the install's ServiceAccount
  local p=$((PORT + $1))
  KUBECONFIG="$WORK/card-quota.kubeconfig" POD_NAME="wait-replica-$1" "$BIN" serve --cert-dir "$WORK/certs" \
    --listen "127.0.0.1:$p" --metrics-listen "127.0.0.1:$((p + 1000))" --client-ca "$WORK/client-ca.crt" \
    --client-name kube-apiserver-webhook-client --peer-routing --advertise-address "127.0.0.1:$p" \
    --lease-namespace "$SYS" --lease-name card-quota-wait --reconcile-seconds 0.5 >> "$WORK/replica-$1.log" 2>&1 &
  REPLICA[$1]=$!
  PIDS+=($!)
}
declare -a REPLICA
ready() { for i in 1 2; do curl -sf "http://127.0.0.1:$((PORT + i + 1000))/readyz" >/dev/null || return 1; done; }
replica 1
replica 2
"$EXAMPLES/rr_proxy" "$PORT" "$((PORT + 1))" "$((PORT + 2))" > "$WORK/proxy.log" 2>&1 &
PIDS+=($!)
wait_for 60 ready || { echo "card-quota never became ready"; tail -20 "$WORK"/replica-*.log; exit 100; }
"$BIN" manifests --cert-dir "$WORK/certs" --url "https://127.0.0.1:$PORT" --name "$Q" --namespace "$SYS" \
  --namespace-label "card-quota-e2e=$RUN" | k apply -f - >/dev/null
queue() { # name quota [more annotations]
  k apply -f - >/dev/null <<YAML
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: $1, annotations: {volcano.sh/card.quota: '{"NVIDIA-H200":$2}', volcano.sh/card.full: wait${3:+, $3}}}
spec: {weight: 1}
YAML
}
deploy() { # name queue replicas
  k -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: $1}
spec:
  replicas: $3
  selector: {matchLabels: {app: $1}}
  template:
    metadata: {labels: {app: $1}, annotations: {scheduling.volcano.sh/queue-name: $2}}
    spec:
      terminationGracePeriodSeconds: 0
      containers: [{name: c, image: registry.k8s.io/pause:3.9, resources: {limits: {nvidia.com/gpu: "1"}}}]
YAML
}
bare() { # name queue gpus
  k -n "$NS" apply -f - 2>&1 <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, annotations: {scheduling.volcano.sh/queue-name: $2}}
spec:
  terminationGracePeriodSeconds: 0
  containers: [{name: c, image: registry.k8s.io/pause:3.9, resources: {limits: {nvidia.com/gpu: "$3"}}}]
YAML
}
GATE=volcano.sh/card-quota
pods_json() { k -n "$NS" get pods -l "app=$1" -o json; }
count() { # app bound|gated
  case $2 in
    bound) pods_json "$1" | jq '[.items[] | select(.spec.nodeName != null and .metadata.deletionTimestamp == null)] | length' ;;
    gated) pods_json "$1" | jq --arg g "$GATE" '[.items[] | select(any(.spec.schedulingGates[]?; .name == $g))] | length' ;;
  esac
}
counts_are() { [ "$(count "$1" bound)" = "$2" ] && [ "$(count "$1" gated)" = "$3" ]; }
usage() { k get queue "$1" -o jsonpath='{.metadata.annotations.volcano\.sh/card\.usage}' | jq -r ".[\"NVIDIA-H200\"].$2 // 0"; }
usage_is() { [ "$(usage "$1" "$2")" = "$3" ]; }
gated_pod() { k -n "$NS" get pod "$1" -o json | jq -e --arg g "$GATE" 'any(.spec.schedulingGates[]?; .name == $g)' >/dev/null; }
bound_pod() { [ -n "$(k -n "$NS" get pod "$1" -o jsonpath='{.spec.nodeName}' 2>/dev/null)" ]; }
# A field of a pod of an app bound now whose name is not in the space-padded list.
newly_bound() { # app " name1 name2 " field
  pods_json "$1" | jq -r --arg b "$2" --arg f "$3" '[.items[] | .metadata.name as $n
    | select(.spec.nodeName != null and .metadata.deletionTimestamp == null and (($b | contains(" " + $n + " ")) | not))][0].metadata[$f] // empty'
}
export -f count counts_are usage usage_is pods_json gated_pod bound_pod newly_bound
export NS GATE
# The most pods of an app bound at once, sampled every 0.2 s until $WORK/stop-$1.
sample_max() { # app
  local max=0 n
  while [ ! -e "$WORK/stop-$1" ]; do
    n=$(count "$1" bound 2>/dev/null || echo 0)
    [ "$n" -gt "$max" ] && max=$n
    echo "$max" > "$WORK/max-$1"
    sleep 0.2
  done
}

# ---- a Deployment past its quota waits ------------------------------------------------
queue "$Q" 4
sleep 1
deploy web "$Q" 10
check "a Deployment of 10 into a quota of 4 (card.full: wait): 4 pods bound, 6 wait behind card-quota's gate" \
  wait_for 60 counts_are web 4 6
check "... the 6 hold no quota: the usage counts 4 in use and 6 waiting" \
  wait_for 20 bash -c "usage_is $Q waiting 6 && [ \$(( \$(usage $Q allocated) + \$(usage $Q pending) )) = 4 ]"
one_gated=$(pods_json web | jq -r --arg g "$GATE" '[.items[] | select(any(.spec.schedulingGates[]?; .name == $g))][0].metadata.name')
check "... a waiting pod says why (kubectl describe pod: WaitingForCardQuota, the queue's numbers)" wait_for 20 bash -c \
  "kubectl -n $NS get events --field-selector involvedObject.name=$one_gated,reason=WaitingForCardQuota -o jsonpath='{.items[*].note}{.items[*].message}' | grep -q 'queue $Q has insufficient NVIDIA-H200 quota: requested 1, in use 4'"

# ---- each freed card goes to the oldest waiting pod ----------------------------------------
: > "$WORK/latencies"
: > "$WORK/order"
sample_max web &
SAMPLER=$!
for round in $(seq 1 8); do
  snapshot=$(pods_json web)
  oldest=$(jq -r --arg g "$GATE" '[.items[] | select(any(.spec.schedulingGates[]?; .name == $g))] | sort_by(.metadata.creationTimestamp) | .[0].metadata.creationTimestamp' <<<"$snapshot")
  victim=$(jq -r '[.items[] | select(.spec.nodeName != null)][0].metadata.name' <<<"$snapshot")
  before=$(jq -r '[.items[] | select(.spec.nodeName != null) | .metadata.name] | join(" ")' <<<"$snapshot")
  k -n "$NS" delete pod "$victim" --grace-period=0 --force >/dev/null 2>&1
  t0=$(date +%s%N)
  # The pod bound next: one not bound before.
  if wait_for 15 bash -c "[ -n \"\$(newly_bound web ' $before ' name)\" ]"; then
    echo $(( ($(date +%s%N) - t0) / 1000000 )) >> "$WORK/latencies"
    released=$(newly_bound web " $before " creationTimestamp)
    # Oldest first: the pod released was created no later than the oldest that waited.
    [[ "$released" > "$oldest" ]] && echo "round $round: released a pod of $released while one of $oldest waited" >> "$WORK/order"
  else
    echo "timeout" >> "$WORK/latencies"
  fi
  wait_for 15 counts_are web 4 6
done
touch "$WORK/stop-web"
wait "$SAMPLER" 2>/dev/null
lat=$(grep -v timeout "$WORK/latencies" | sort -n | tr '\n' ' ')
n=$(grep -cv timeout "$WORK/latencies")
p50=$(grep -v timeout "$WORK/latencies" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
max=$(grep -v timeout "$WORK/latencies" | sort -n | tail -1)
log "freed card -> next pod bound, ms (8 rounds, force-deleted pod to binding): $lat (p50 ${p50:-?}, max ${max:-?})"
check "8 cards freed one at a time: each released and bound within 5 s (p50 ${p50:-?} ms, max ${max:-?} ms)" \
  bash -c "[ $n = 8 ] && [ ${max:-99999} -le 5000 ]"
check "... each to the oldest waiting pod" bash -c "[ ! -s $WORK/order ] || { cat $WORK/order; false; }"
check "... and never more than 4 bound at once (most seen: $(cat "$WORK/max-web"))" [ "$(cat "$WORK/max-web")" -le 4 ]

# ---- strict and best-effort order ----------------------------------------------------
queue "$Q-order" 2 "volcano.sh/card.order: strict"
sleep 1
bare h1 "$Q-order" 1 >/dev/null
bare h2 "$Q-order" 1 >/dev/null
wait_for 30 bash -c "bound_pod h1 && bound_pod h2"
bare big "$Q-order" 2 >/dev/null
sleep 1.1
bare small "$Q-order" 1 >/dev/null
check "strict order: a 2-card pod and then a 1-card pod wait in a full queue" bash -c "gated_pod big && gated_pod small"
k -n "$NS" delete pod h1 --grace-period=0 --force >/dev/null 2>&1
sleep 4
check "... one card freed: the 1-card pod stays behind the older 2-card one" bash -c "gated_pod big && gated_pod small"
k annotate queue "$Q-order" volcano.sh/card.order=best-effort --overwrite >/dev/null
check "... best-effort: the 1-card pod goes ahead within 5 s, the 2-card one waits" \
  wait_for 5 bash -c "bound_pod small && gated_pod big"

# ---- 200 waiting pods, every gate removed at once by hand, 40 bound pods going -----------
queue "$Q-burst" 40
sleep 1
deploy burst "$Q-burst" 240
check "a Deployment of 240 into a quota of 40: 40 bound, 200 waiting" wait_for 120 counts_are burst 40 200
sample_max burst &
SAMPLER=$!
pods_json burst | jq -r --arg g "$GATE" '.items[] | select(any(.spec.schedulingGates[]?; .name == $g)) | .metadata.name' > "$WORK/gated"
pods_json burst | jq -r '.items[] | select(.spec.nodeName != null) | .metadata.name' > "$WORK/bound"
# Every waiting pod's gate removed by hand, 16 at a time, through both replicas, while the
# 40 bound pods are force-deleted and the releaser works too.
xargs -P 16 -I{} sh -c "kubectl -n $NS patch pod {} -p '{\"spec\":{\"schedulingGates\":[{\"name\":\"$GATE\",\"\$patch\":\"delete\"}]}}' >/dev/null 2>>$WORK/ungate-refusals || true" < "$WORK/gated" &
UNGATE=$!
xargs -P 8 -I{} kubectl -n "$NS" delete pod {} --grace-period=0 --force >/dev/null 2>&1 < "$WORK/bound"
wait "$UNGATE"
wait_for 60 counts_are burst 40 200
touch "$WORK/stop-burst"
wait "$SAMPLER" 2>/dev/null
refused=$(grep -c "insufficient NVIDIA-H200 quota\|waits before\|goes first" "$WORK/ungate-refusals" || true)
log "by-hand releases refused by the webhook: $refused of 200; most bound at once: $(cat "$WORK/max-burst")"
check "... never more than 40 bound at once (most seen: $(cat "$WORK/max-burst")), 40 bound and 200 waiting after" \
  bash -c "[ $(cat "$WORK/max-burst") -le 40 ] && counts_are burst 40 200"
check "... the by-hand releases past the room were refused (the release is a charge)" [ "$refused" -ge 100 ]
# Its 240 pods would take the node's cards from the pods the uninstall lets go below.
k -n "$NS" delete deployment burst >/dev/null
wait_for 120 bash -c "[ \$(pods_json burst | jq '.items | length') = 0 ]"

# ---- card-quota down: waiting pods stay waiting, cardless pods go on -----------------------
kill "${REPLICA[1]}" "${REPLICA[2]}" 2>/dev/null
wait "${REPLICA[1]}" "${REPLICA[2]}" 2>/dev/null
two=$(pods_json web | jq -r '[.items[] | select(.spec.nodeName != null)][0:2][].metadata.name')
for p in $two; do k -n "$NS" delete pod "$p" --grace-period=0 --force >/dev/null 2>&1; done
sleep 5
check "card-quota down: 2 cards freed, the waiting pods stay waiting (2 bound, the rest gated)" \
  bash -c "[ \$(count web bound) = 2 ] && [ \$(count web gated) -ge 6 ]"
out=$(k -n "$NS" run cpu-only --image=registry.k8s.io/pause:3.9 --restart=Never 2>&1)
check "... and a cardless pod is created" grep -q "pod/cpu-only created" <<<"$out"
one_gated=$(pods_json web | jq -r --arg g "$GATE" '[.items[] | select(any(.spec.schedulingGates[]?; .name == $g))][0].metadata.name')
out=$(k -n "$NS" patch pod "$one_gated" -p "{\"spec\":{\"schedulingGates\":[{\"name\":\"$GATE\",\"\$patch\":\"delete\"}]}}" 2>&1)
check "... and a gate removed by hand is refused (card work waits for card-quota)" grep -q "failed calling webhook" <<<"$out"
t0=$(date +%s%N)
replica 1
replica 2
check "card-quota back: the 2 free cards go to waiting pods" wait_for 60 bash -c "[ \$(count web bound) = 4 ]"
log "back up to 4 bound: $(( ($(date +%s%N) - t0) / 1000000 )) ms after the replicas were started"

# ---- uninstall: the webhooks removed, then card-quota ungate -------------------------------
k delete mutatingwebhookconfiguration,validatingwebhookconfiguration "$Q" >/dev/null
for i in 1 2; do kill "${REPLICA[$i]}" 2>/dev/null; done
out=$("$BIN" ungate -n "$NS" 2>&1)
log "card-quota ungate: $(tail -1 <<<"$out")"
check "uninstalled, card-quota ungate leaves no pod behind card-quota's gate" \
  bash -c "[ \$(kubectl -n $NS get pods -o json | jq --arg g $GATE '[.items[] | select(any(.spec.schedulingGates[]?; .name == \$g))] | length') = 0 ]"
check "... and the pods it held go to the scheduler" wait_for 60 bash -c "[ \$(count web bound) = 10 ]"

log "passed $PASSED, failed $FAILED"
exit "$FAILED"
