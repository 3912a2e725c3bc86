#!/usr/bin/env bash
# A replica whose watches stall (issue 46 #1), on a real API server: replica B reaches
# the API server through a proxy that freezes every connection open at one moment (its
# watches) and lets new ones through. Replica A then admits a queue's 4 cards and prunes
# its ledger past what B's caches show. B is asked again and again for a fifth pod for
# longer than the 30 s it once took a silent watch for current: it must never admit it.
# It answers "try again", lists again through a new connection, then refuses with the
# quota's message. Then a queue's quota is cut from 8 to 2 through A while B's Queue
# watch stays frozen: B must never admit more than 2 (issue 57 #1). Then replica C,
# whose ResourceClaim watch alone is frozen (a proxy that reads requests), is asked to
# admit a claim's allocation past a quota an allocation through A filled: it must never
# admit it (R2 for claims). Last, replica D's Node and ResourceSlice watches freeze while
# a node joins: an allocation onto its device is "try again" at D, never admitted.
#
#   KUBECONFIG=<kubeconfig> e2e/stall.sh [path/to/card-quota]
#
# Exit status: number of failed checks.
set -uo pipefail

BIN=${1:-target/release/card-quota}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
HERE=$(cd "$(dirname "$0")" && pwd)
: "${KUBECONFIG:?set KUBECONFIG}"
export KUBECONFIG
RUN=${E2E_RUN:-$(date +%s | tail -c 6)$RANDOM}
NS=cq-stall-$RUN
SYS=cq-stall-$RUN-system
Q=cq-stall-$RUN
NODE=$Q-h200
PORT_A=${E2E_PORT:-19643}
PORT_B=$((PORT_A + 1))
PROXY=$((PORT_A + 2))
WORK=$(mktemp -d /tmp/cq-stall.XXXXXX)
START=$(date +%s)
PASSED=0
FAILED=0
PIDS=()

log() { printf '[%4ss] %s\n' $(( $(date +%s) - START )) "$*"; }
pass() { PASSED=$((PASSED + 1)); log "PASS: $1"; }
fail() { FAILED=$((FAILED + 1)); log "FAIL: $1"; shift; for l in "$@"; do echo "      $l"; done; }
k() { kubectl "$@"; }
check() { local name=$1; shift; if "$@"; then pass "$name"; else fail "$name" "command: $*"; fi; }
wait_for() { local t=$1; shift; local end=$(( $(date +%s) + t )); while ! "$@" >/dev/null 2>&1; do [ "$(date +%s)" -ge $end ] && return 1; sleep 0.3; done; }
export -f k

ROOT_WAS=
CLASS_WAS=
cleanup() {
  case "$ROOT_WAS" in
    1) k annotate queue root volcano.sh/card.quota- >/dev/null 2>&1 ;;
    0) k delete queue root --ignore-not-found >/dev/null 2>&1 ;;
  esac
  k delete queue "$Q-burst" "$Q-cut" "$Q-dra" --ignore-not-found >/dev/null 2>&1
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  k delete mutatingwebhookconfiguration,validatingwebhookconfiguration "$Q" --ignore-not-found >/dev/null 2>&1
  k delete namespace "$NS" "$SYS" --wait=false --ignore-not-found >/dev/null 2>&1
  k delete queue "$Q" --ignore-not-found >/dev/null 2>&1
  k delete node "$NODE" --ignore-not-found >/dev/null 2>&1
  k delete node "$Q-dra" --ignore-not-found >/dev/null 2>&1
  k delete node "$Q-join" --ignore-not-found >/dev/null 2>&1
  k delete resourceslice "$Q-dra-gpu" "$Q-join-gpu" --ignore-not-found >/dev/null 2>&1
  [ "$CLASS_WAS" = 0 ] && k delete deviceclass gpu.nvidia.com --ignore-not-found >/dev/null 2>&1
  e2e_remove_identity "$Q"
  if [ -z "${E2E_KEEP:-}" ]; then rm -rf "$WORK"; else echo "logs kept in $WORK"; fi
}
trap cleanup EXIT

# shellcheck source=e2e/lib.sh
. "$HERE/lib.sh"
e2e_sweep_stale_hooks
for ns in "$NS" "$SYS"; do k create namespace "$ns" >/dev/null; done
k label namespace "$NS" "card-quota-e2e=$RUN" >/dev/null
"$BIN" certs --service card-quota --namespace "$SYS" --ip 127.0.0.1 --out "$WORK/certs" >/dev/null 2>&1
k create -f - >/dev/null <<EOF
{"apiVersion":"v1","kind":"Node","metadata":{"name":"$NODE","labels":{"nvidia.com/gpu.product":"NVIDIA-H200"}}}
EOF
k get --raw "/api/v1/nodes/$NODE" | jq '.status = {capacity: {cpu: "64", memory: "512Gi", pods: "500", "nvidia.com/gpu": "8"}, allocatable: {cpu: "64", memory: "512Gi", pods: "500", "nvidia.com/gpu": "8"}, conditions: [{type: "Ready", status: "True", reason: "E2E", message: "fake node"}]}' \
  | k replace --raw "/api/v1/nodes/$NODE/status" -f - >/dev/null
e2e_install_identity "$BIN" "$SYS" "$Q"
server=$(k config view --minify -o jsonpath='{.clusters[0].cluster.server}')
hostport=${server#https://}
python3 "$HERE/freeze_proxy.py" "$PROXY" "${hostport%:*}" "${hostport##*:}" > "$WORK/proxy.log" 2>&1 &
PROXY_PID=$!
PIDS+=($PROXY_PID)
# Replica B's first request goes through the proxy: a start that beats it fails.
wait_for 20 grep -q "listening on" "$WORK/proxy.log" || { echo "the freezing proxy never listened"; cat "$WORK/proxy.log"; exit 100; }
jq --arg s "https://127.0.0.1:$PROXY" '.clusters[0].cluster.server = $s' "$WORK/card-quota.kubeconfig" > "$WORK/b.kubeconfig"
serve() { # NAME PORT KUBECONFIG
  KUBECONFIG="$3" "$BIN" serve --cert-dir "$WORK/certs" --listen "127.0.0.1:$2" --metrics-listen "127.0.0.1:$(($2 + 1000))" \
    --lease-namespace "$SYS" --lease-name card-quota-stall --reconcile-seconds 0.5 >> "$WORK/$1.log" 2>&1 &
  PIDS+=($!)
  wait_for 30 curl -sf "http://127.0.0.1:$(($2 + 1000))/readyz" || { echo "replica $1 never became ready"; cat "$WORK/$1.log"; exit 100; }
}
serve a "$PORT_A" "$WORK/card-quota.kubeconfig"
serve b "$PORT_B" "$WORK/b.kubeconfig"
printf '{"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"Queue","metadata":{"name":"%s","annotations":{"volcano.sh/card.quota":"{\\"NVIDIA-H200\\":4}"}},"spec":{"weight":1}}' "$Q" | k apply -f - >/dev/null
# A queue whose quota is cut while B's Queue watch is frozen (issue 57 #1).
QC=$Q-cut
printf '{"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"Queue","metadata":{"name":"%s","annotations":{"volcano.sh/card.quota":"{\\"NVIDIA-H200\\":8}"}},"spec":{"weight":1}}' "$QC" | k apply -f - >/dev/null
# The API server calls replica A only; B is asked directly, as the API server would.
"$BIN" manifests --cert-dir "$WORK/certs" --url "https://127.0.0.1:$PORT_A" --name "$Q" --namespace "$SYS" \
  --namespace-label "card-quota-e2e=$RUN" | k apply -f - >/dev/null
sleep 2

pod() { printf '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"%s","namespace":"%s","annotations":{"scheduling.volcano.sh/queue-name":"%s","volcano.sh/card.name":"NVIDIA-H200"}},"spec":{"schedulerName":"nobody","containers":[{"name":"c","image":"registry.k8s.io/pause:3.9","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}' "$1" "$NS" "${2:-$Q}"; }

kill -USR1 "$PROXY_PID"
sleep 1
check "replica B's open connections (its watches) are frozen" grep -q "froze [1-9]" "$WORK/proxy.log"
for i in 1 2 3 4; do pod "p$i" | k create -f - >/dev/null 2>&1; done
check "replica A admits the queue's 4 cards" bash -c "[ \"\$(kubectl -n $NS get pods -o name | wc -l)\" = 4 ]"
ledger() { k -n "$SYS" get cm "card-quota-ledger.$Q" -o jsonpath='{.data.ledger}' 2>/dev/null; }
settled() { local l; l=$(ledger); [ -n "$l" ] && jq -e '(.entries // {} | length) == 0 and (.holds // {} | length) == 0 and .watermark.pods > 0' <<<"$l" >/dev/null; }
check "... and prunes its ledger past them (entries and holds gone, the watermark raised)" wait_for 30 settled
log "ledger: $(ledger)"

pod_review() { # NAME [QUEUE] -> a pod CREATE's AdmissionReview, as the API server sends it
  pod "$1" "${2:-$Q}" | jq --arg uid "$1-$RANDOM" '{apiVersion: "admission.k8s.io/v1", kind: "AdmissionReview",
    request: {uid: $uid, kind: {group: "", version: "v1", kind: "Pod"}, resource: {group: "", version: "v1", resource: "pods"},
      namespace: .metadata.namespace, operation: "CREATE", userInfo: {username: "e2e"}, object: (.metadata.uid = $uid)}}'
}
send_to() { # PORT: the AdmissionReview on stdin, posted to the replica there as the API server would
  curl -s --cacert "$WORK/certs/ca.crt" -H 'Content-Type: application/json' --data-binary @- "https://127.0.0.1:$1/validate"
}
# ask SECONDS GAP PORT WHO COMMAND...: sends the AdmissionReview COMMAND prints (given the
# ask's number) to the replica on PORT every GAP seconds for SECONDS, and counts the
# answers: allowed, retry ("try again"; again: its message), refused (last: its message).
ask() {
  local secs=$1 gap=$2 port=$3 who=$4 end out
  shift 4
  allowed=0 retry=0 refused=0 n=0 last= again=
  end=$(( $(date +%s) + secs ))
  while [ "$(date +%s)" -lt $end ]; do
    n=$((n + 1))
    out=$("$@" "$n" | send_to "$port")
    case "$(jq -r '.response.allowed' <<<"$out")" in
      true) allowed=$((allowed + 1)); log "$who admitted ask $n: $out" ;;
      *) if jq -e '.response.status.reason == "TryAgain"' <<<"$out" >/dev/null; then retry=$((retry + 1)); again=$(jq -r '.response.status.message' <<<"$out")
         else refused=$((refused + 1)); last=$(jq -r '.response.status.message' <<<"$out"); fi ;;
    esac
    sleep "$gap"
  done
}
extra() { pod_review "extra-$1"; }
ask 40 1 "$PORT_B" B extra
log "B over 40 s: $allowed admitted, $retry 'try again', $refused refused (last: ${last:-none})"
check "B never admits a fifth pod, however long its watch stalls ($n asks over 40 s)" [ "$allowed" = 0 ]
check "... it lists again through a new connection" grep -q "listing again" "$WORK/b.log"
check "... and then refuses with the quota's message" grep -q "queue $Q has insufficient NVIDIA-H200 quota: requested 1, in use 4" <<<"${last:-}"

# ---- a quota cut B's frozen Queue watch never shows (issue 57 #1): the hook seals the
# queue before the cut is stored; B answers "try again", reads the Queue, and never
# admits past the new quota -------------------------------------------------------------
wait_for 20 bash -c "curl -s http://127.0.0.1:$((PORT_B + 1000))/metrics >/dev/null"
out=$(k annotate queue "$QC" --overwrite 'volcano.sh/card.quota={"NVIDIA-H200":2}' 2>&1)
log "quota of $QC cut from 8 to 2 through A: $out"
sealed=$(k -n "$SYS" get configmap "card-quota-ledger.$QC" -o json 2>/dev/null \
  | jq -r --arg q "$QC" '.data.ledger | fromjson | .seals[$q] | "\(.by) \(.cause)"')
check "... the Queue hook sealed it before the cut was stored (seal: $sealed)" test "$sealed" = "$QC limits"
cut_ask() { pod_review "cut-$1" "$QC"; }
ask 20 0.5 "$PORT_B" B cut_ask
log "B after the cut ($n asks): $allowed admitted, $retry 'try again' (last: ${again:-none}), $refused refused (last: ${last:-none})"
check "B, whose Queue watch still shows 8, admits at most the new quota of 2 ($allowed)" [ "$allowed" -le 2 ]
check "... and refuses the rest with the cut quota's message" grep -q "queue $QC has insufficient NVIDIA-H200 quota: requested 1, in use 2 .*quota 2" <<<"${last:-}"

# ---- a replica whose ResourceClaim watch alone stalls (issue 57 #2, R2 for claims):
# replica C reaches the API server through a proxy that ends TLS, reads each request and
# freezes only C's watch of ResourceClaims; its pod, PodGroup and Queue watches run. Two
# claim pods wait in a queue whose quota is then cut to one H200. The first's claim is
# allocated through A after the freeze (C's cache shows it unallocated), and A prunes
# that charge from its ledger once its own claim cache shows it. C, asked to admit the
# second claim's allocation, must never admit it: its claims are behind the ledger's
# watermark, so it waits ("try again" if that outlasts the request's budget), lists the
# claims again through a new connection, and refuses with the quota's message.
QD=$Q-dra
DRA_NODE=$Q-dra
e2e_dra_node "$DRA_NODE"
e2e_dra_slice "$DRA_NODE" "NVIDIA H200" 2
if k get deviceclass gpu.nvidia.com >/dev/null 2>&1; then CLASS_WAS=1; else CLASS_WAS=0; fi
e2e_dra_class "$NS"
printf '{"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"Queue","metadata":{"name":"%s","annotations":{"volcano.sh/card.quota":"{\\"NVIDIA-H200\\":2}"}},"spec":{"weight":1}}' "$QD" | k apply -f - >/dev/null
PORT_C=$((PORT_A + 3))
CLAIM_PROXY=$((PORT_A + 4))
k config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d > "$WORK/apiserver-ca.crt"
# watch_proxy PORT NAME TEXT...: freeze_proxy.py in its TLS mode on PORT, freezing the
# watches whose path holds one of the TEXTs on SIGUSR1; its pid in PROXY_PID, its log
# $WORK/NAME.log.
watch_proxy() {
  local port=$1 name=$2 only=() t
  shift 2
  for t in "$@"; do only+=(--only "$t"); done
  python3 "$HERE/freeze_proxy.py" "$port" "${hostport%:*}" "${hostport##*:}" --tls "$WORK/certs/tls.crt" "$WORK/certs/tls.key" \
    --upstream-ca "$WORK/apiserver-ca.crt" "${only[@]}" > "$WORK/$name.log" 2>&1 &
  PROXY_PID=$!
  PIDS+=($PROXY_PID)
  wait_for 20 grep -q "listening on" "$WORK/$name.log" || { echo "$name never listened"; cat "$WORK/$name.log"; exit 100; }
}
watch_proxy "$CLAIM_PROXY" claim-proxy /resourceclaims
CLAIM_PROXY_PID=$PROXY_PID
jq --arg s "https://127.0.0.1:$CLAIM_PROXY" --arg ca "$(base64 -w0 < "$WORK/certs/ca.crt")" \
  '.clusters[0].cluster.server = $s | .clusters[0].cluster["certificate-authority-data"] = $ca' "$WORK/card-quota.kubeconfig" > "$WORK/c.kubeconfig"
serve c "$PORT_C" "$WORK/c.kubeconfig"
dra_pod() { # name
  printf '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"%s","namespace":"%s","annotations":{"scheduling.volcano.sh/queue-name":"%s"}},"spec":{"schedulerName":"hand-%s","containers":[{"name":"c","image":"registry.k8s.io/pause:3.9","resources":{"claims":[{"name":"gpu"}]}}],"resourceClaims":[{"name":"gpu","resourceClaimTemplateName":"one-gpu"}]}}' "$1" "$NS" "$QD" "$RUN"
}
claim_of() { kubectl -n "$NS" get pod "$1" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}' 2>/dev/null; }
export -f claim_of
export NS
for d in d1 d2; do dra_pod "$d" | k create -f - >/dev/null; done
check "two claim pods are admitted through A under the queue's quota of 2, their claims made" \
  wait_for 30 bash -c '[ -n "$(claim_of d1)" ] && [ -n "$(claim_of d2)" ]'
CLAIM1=$(claim_of d1) CLAIM2=$(claim_of d2)
allocated() { # POD CLAIM NODE DEVICE -> the claim as a scheduler's allocation writes it
  local uid; uid=$(k -n "$NS" get pod "$1" -o jsonpath='{.metadata.uid}')
  k -n "$NS" get resourceclaim "$2" -o json | jq --arg n "$3" --arg d "$4" --arg pod "$1" --arg uid "$uid" \
    '.status = {allocation: {devices: {results: [{request: "gpu", driver: "gpu.nvidia.com", pool: $n, device: $d}]},
       nodeSelector: {nodeSelectorTerms: [{matchFields: [{key: "metadata.name", operator: "In", values: [$n]}]}]}},
     reservedFor: [{resource: "pods", name: $pod, uid: $uid}]}'
}
sleep 1
out=$(k annotate queue "$QD" --overwrite 'volcano.sh/card.quota={"NVIDIA-H200":1}' 2>&1)
log "quota of $QD cut from 2 to 1 through A: $out"
sleep 2
kill -USR1 "$CLAIM_PROXY_PID"
sleep 1
check "replica C's ResourceClaim watch alone is frozen ($(grep froze "$WORK/claim-proxy.log" | tail -n 1))" \
  grep -Eq "froze 1 connection\(s\) of [0-9]+: /apis/resource.k8s.io/v1/resourceclaims$" "$WORK/claim-proxy.log"
# The first claim's allocation, through the API server (A's Fail hook); the claim
# controller may write the claim meanwhile: retry a conflict.
for try in 1 2 3 4 5 6 7 8; do
  allocated d1 "$CLAIM1" "$DRA_NODE" gpu-0 > "$WORK/claim1.json"
  k replace --raw "/apis/resource.k8s.io/v1/namespaces/$NS/resourceclaims/$CLAIM1/status" -f "$WORK/claim1.json" >/dev/null 2>"$WORK/claim1.err" && break
  grep -q "the object has been modified" "$WORK/claim1.err" || break
  sleep 0.3
done
check "the first claim's allocation is admitted through A (the queue's one H200)" [ ! -s "$WORK/claim1.err" ]
claim_rv=$(k -n "$NS" get resourceclaim "$CLAIM1" -o jsonpath='{.metadata.resourceVersion}')
dra_settled() {
  local l; l=$(k -n "$SYS" get cm "card-quota-ledger.$QD" -o jsonpath='{.data.ledger}' 2>/dev/null)
  [ -n "$l" ] && jq -e --argjson rv "$claim_rv" '(.entries // {} | length) == 0 and (.holds // {} | length) == 0 and (.watermark.claims // 0) >= $rv' <<<"$l" >/dev/null
}
check "... and A prunes that charge from its ledger, raising the watermark's claims mark past the allocation" wait_for 30 dra_settled
log "ledger of $QD: $(k -n "$SYS" get cm "card-quota-ledger.$QD" -o jsonpath='{.data.ledger}'); the allocation at resourceVersion $claim_rv"
allocation_review() { # POD CLAIM NODE DEVICE -> the AdmissionReview of a scheduler's allocation of CLAIM for POD
  jq -n --slurpfile new <(allocated "$@") --slurpfile old <(k -n "$NS" get resourceclaim "$2" -o json) --arg uid "alloc-$RANDOM" \
    '{apiVersion: "admission.k8s.io/v1", kind: "AdmissionReview",
      request: {uid: $uid, kind: {group: "resource.k8s.io", version: "v1", kind: "ResourceClaim"},
        resource: {group: "resource.k8s.io", version: "v1", resource: "resourceclaims"}, subResource: "status",
        name: $old[0].metadata.name, namespace: $old[0].metadata.namespace, operation: "UPDATE",
        userInfo: {username: "system:kube-scheduler"}, object: $new[0], oldObject: $old[0]}}'
}
second() { allocation_review d2 "$CLAIM2" "$DRA_NODE" gpu-1; }
ask 15 1 "$PORT_C" C second
log "C over 15 s, its claim watch frozen: $allowed admitted, $retry 'try again', $refused refused (last: ${last:-none})"
check "C never admits the second claim's allocation past the cut quota of 1 ($n asks over 15 s)" [ "$allowed" = 0 ]
check "... it lists the ResourceClaims again through a new connection" grep -q 'listing again.*stream=Claims' "$WORK/c.log"
check "... and then refuses with the quota's message" grep -q "queue $QD has insufficient NVIDIA-H200 quota" <<<"${last:-}"

# ---- a node that joins while a replica's Node and ResourceSlice watches stall (R2 for
# nodes and slices): replica D's watches of both are frozen; a node joins with H200s in
# its slice; an allocation onto one of them, for the queue cut to one H200 and full, is
# asked of D. D cannot tell the device's model, so it never admits it (an allocation it
# read as no cards was once admitted charging nothing): "try again" until its watches
# show the node, then the quota's refusal.
PORT_D=$((PORT_A + 5))
NODE_PROXY=$((PORT_A + 6))
watch_proxy "$NODE_PROXY" node-proxy /nodes /resourceslices
NODE_PROXY_PID=$PROXY_PID
jq --arg s "https://127.0.0.1:$NODE_PROXY" '.clusters[0].cluster.server = $s' "$WORK/c.kubeconfig" > "$WORK/d.kubeconfig"
serve d "$PORT_D" "$WORK/d.kubeconfig"
sleep 2
kill -USR1 "$NODE_PROXY_PID"
sleep 1
check "replica D's Node and ResourceSlice watches alone are frozen ($(grep froze "$WORK/node-proxy.log" | tail -n 1))" \
  grep -Eq "froze 2 connection\(s\) of [0-9]+: /api/v1/nodes, /apis/resource.k8s.io/v1/resourceslices$" "$WORK/node-proxy.log"
JOIN_NODE=$Q-join
e2e_dra_node "$JOIN_NODE"
e2e_dra_slice "$JOIN_NODE" "NVIDIA H200" 1
joined() { allocation_review d2 "$CLAIM2" "$JOIN_NODE" gpu-0; }
ask 8 1 "$PORT_D" D joined
log "D over 8 s, its Node and ResourceSlice watches frozen: $allowed admitted, $retry 'try again' (last: ${again:-none}), $refused refused"
check "D never admits an allocation onto a device of a node its frozen watches do not show ($n asks)" [ "$allowed" = 0 ]
check "... it answers \"try again\", naming the device no slice it holds publishes" grep -q "names device gpu.nvidia.com/$JOIN_NODE/gpu-0, which no ResourceSlice publishes; try again" <<<"${again:-}"
kill -USR2 "$NODE_PROXY_PID"
d_refuses() { joined | send_to "$PORT_D" | jq -e --arg m "queue $QD has insufficient NVIDIA-H200 quota" '.response.allowed == false and (.response.status.message | contains($m))'; }
check "... and once its watches move again, refuses it with the quota's message" wait_for 20 d_refuses

# ---- a root card budget given mid-burst (issue 46 #3): the queue's charges in flight,
# recorded under its own ledger, count in the tree's ledger that takes over ----------------
Q2=$Q-burst
printf '{"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"Queue","metadata":{"name":"%s","annotations":{"volcano.sh/card.quota":"{\\"NVIDIA-H200\\":12}"}},"spec":{"weight":1}}' "$Q2" | k apply -f - >/dev/null
if k get queue root >/dev/null 2>&1; then ROOT_WAS=1; else ROOT_WAS=0; fi
sleep 1
burst() { pod "$1" "$Q2" | kubectl create -f - 2>&1; }
export -f burst pod
export NS Q Q2
seq 1 36 | sed 's/^/b/' | xargs -P 6 -I{} bash -c 'burst {}' > "$WORK/burst.log" 2>&1 &
BURST=$!
sleep 0.5
budget='{"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"Queue","metadata":{"name":"root","annotations":{"volcano.sh/card.quota":"{\"NVIDIA-H200\":100}"}},"spec":{"weight":1}}'
out=$(k apply -f - <<<"$budget" 2>&1)
log "root budget given mid-burst ($(grep -c created "$WORK/burst.log") pods created by then): $out"
wait "$BURST"
created=$(k -n "$NS" get pods -o json | jq --arg q "$Q2" '[.items[] | select(.metadata.annotations["scheduling.volcano.sh/queue-name"] == $q)] | length')
log "burst: $created created, $(grep -c 'insufficient NVIDIA-H200 quota' "$WORK/burst.log") refused for quota, $(grep -c 'try again' "$WORK/burst.log") 'try again'"
check "a root budget given mid-burst: the queue of 12 gets at most 12 ($created)" bash -c "[ $created -le 12 ] && [ $created -ge 1 ]"
# The Queue hook sealed the queue in the ledger it left before root's budget was stored:
# a replica whose Queue watch lagged could not go on charging it there.
sealed_by=$(k -n "$SYS" get configmap "card-quota-ledger.$Q2" -o json 2>/dev/null \
  | jq -r --arg q "$Q2" '.data.ledger | fromjson | .seals[$q].by // "none"')
check "... the queue was sealed in its old ledger by root's change (sealed by: $sealed_by)" test "$sealed_by" = root

log "RESULT: $PASSED passed, $FAILED failed"
exit "$FAILED"
