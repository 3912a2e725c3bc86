#!/usr/bin/env bash
# Burst benchmark on a real API server: N pods, C at a time, into three namespaces —
# one with no admission webhook, one with a Kubernetes ResourceQuota on
# requests.nvidia.com/gpu, one behind card-quota — interleaved A B C A B C.
#
#   KUBECONFIG=<kubeconfig> e2e/burst.sh [path/to/card-quota] [replicas]
#
# BURST_PODS (2000), BURST_CONCURRENCY (16), BURST_ROUNDS (2). BURST_NO_CARDS=1 adds a
# case of pods without cards behind card-quota (the webhook calls' own cost);
# BURST_NO_HOLDS=1 runs card-quota with --no-holds. BURST_FLOOR=1 adds a case behind examples/floor_webhook.rs, which answers with the
# patch the contract requires and decides nothing (the least any implementation costs);
# BURST_FLOOR_WATCH=1 has that floor also watch every pod of the cluster and keep its
# record (a diagnostic: what knowing usage costs, apart from deciding and recording). With 2 replicas the
# API server reaches them (and as many floor webhooks) through a per-connection round-robin
# (examples/rr_proxy.rs), as through a Service, and each replica sends a charge to the replica that owns its queue
# (--peer-routing; BURST_ROUTING=0: each records its own). Quotas are ample: every pod should be admitted. Prints pods/s per
# case and round with each case's p50 and p99 creation latency, the medians, the
# ledger writes per 1,000 pods, how many times the Queue object was written, the API
# server's mean wait per call of each hook (card-quota's and the floor's), and the CPU
# each process on this host spent per pod in each case (on a host whose cores are all
# busy, pods/s follows it).
# BURST_WEBHOOK_CPUS=1 (a CPU list for taskset) runs the webhooks (replicas, floors,
# proxies) on those CPUs and moves the control plane and the client off them for the
# run, as in a cluster, where webhooks run on worker nodes and take no CPU from the API
# server: the cases then differ by what each webhook adds to a pod's path, not by the
# API server's share of one pool of cores.
set -euo pipefail
BIN=${1:-target/release/card-quota}
REPLICAS=${2:-1}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
HERE=$(cd "$(dirname "$0")" && pwd)
: "${KUBECONFIG:?set KUBECONFIG}"
PODS=${BURST_PODS:-2000}
CONC=${BURST_CONCURRENCY:-16}
ROUNDS=${BURST_ROUNDS:-2}
RUN=b$(date +%s | tail -c 5)$RANDOM
Q=cq-burst-$RUN
SYS=cq-burst-$RUN-system
PORT=${BURST_PORT:-19543}
WORK=$(mktemp -d /tmp/cq-burst.XXXXXX)
PIDS=()
CONTROL=() MOVED=() PIN=() CLIENT_PIN=()
k() { kubectl "$@" 2> >(grep -v 'exceeds the supported minor version skew' >&2); }
# shellcheck source=e2e/lib.sh
. "$(dirname "$0")/lib.sh"
cleanup() {
  # The control plane's own CPUs back (MOVED holds PID=CPUS).
  for m in "${MOVED[@]}"; do taskset -a -p -c "${m#*=}" "${m%%=*}" >/dev/null 2>&1 || true; done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  k delete mutatingwebhookconfiguration,validatingwebhookconfiguration "$Q" --ignore-not-found >/dev/null 2>&1 || true
  e2e_remove_identity "$Q"
  k delete queue "$Q" --ignore-not-found >/dev/null 2>&1 || true
  k delete mutatingwebhookconfiguration,validatingwebhookconfiguration "$Q-floor" --ignore-not-found >/dev/null 2>&1 || true
  k delete namespace "$Q-plain" "$Q-rq" "$Q-cq" "$Q-nc" "$Q-pf" "$SYS" --wait=false --ignore-not-found >/dev/null 2>&1 || true
  [ -n "${BURST_KEEP:-}" ] && echo "logs in $WORK" || rm -rf "$WORK"
}
trap cleanup EXIT

e2e_sweep_stale_hooks
e2e_build_burst "$(dirname "$0")/.." || { echo "could not build examples/burst.rs"; exit 100; }
for ns in "$Q-plain" "$Q-rq" "$Q-cq" "$Q-nc" "$Q-pf" "$SYS"; do k create namespace "$ns" >/dev/null; done
k label namespace "$Q-cq" "card-quota-burst=$RUN" >/dev/null
k label namespace "$Q-nc" "card-quota-burst=$RUN" >/dev/null
k label namespace "$Q-pf" "card-quota-floor=$RUN" >/dev/null
k -n "$Q-rq" create quota gpus --hard=requests.nvidia.com/gpu=1000000 >/dev/null
k create -f - >/dev/null <<YAML
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: $Q, annotations: {volcano.sh/card.quota: '{"RTX-4090":1000000}'}}
spec: {weight: 1}
YAML
k create -f - >/dev/null <<YAML
{"apiVersion":"v1","kind":"Node","metadata":{"name":"$Q-rtx","labels":{"nvidia.com/gpu.product":"RTX-4090"}}}
YAML
for try in 1 2 3 4 5 6 7 8; do
  k get --raw "/api/v1/nodes/$Q-rtx" | jq '.status = {capacity: {"nvidia.com/gpu": "1000000", pods: "1000000"}, allocatable: {"nvidia.com/gpu": "1000000", pods: "1000000"}}' > "$WORK/node.json"
  k replace --raw "/api/v1/nodes/$Q-rtx/status" -f "$WORK/node.json" >/dev/null 2>&1 && break
  sleep 0.3
done
trap 'k delete node "$Q-rtx" --ignore-not-found >/dev/null 2>&1 || true; cleanup' EXIT

"$BIN" certs --service card-quota --namespace "$SYS" --ip 127.0.0.1 --out "$WORK/certs" >/dev/null 2>&1
k config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d > "$WORK/client-ca.crt"
# Each replica runs as the install's ServiceAccount with the install's RBAC (e2e/lib.sh).
e2e_install_identity "$BIN" "$SYS" "$Q"
backends=()
# Processes whose CPU each case is charged with (examples/burst.rs --cpu): the
# webhooks, their proxies, and the control plane's, when they run on this host.
CPU=()
for p in kube-apiserver etcd kube-scheduler kube-controller; do  # (names as /proc shows them: 15 characters)
  for pid in $(pgrep -x "$p" 2>/dev/null); do CPU+=(--cpu "$p=$pid"); CONTROL+=("$pid"); done
done
if [ -n "${BURST_WEBHOOK_CPUS:-}" ]; then
  # The other CPUs: the control plane and the client move there for the run.
  OTHER_CPUS=$(python3 -c 'import os, sys
w = set()
for part in sys.argv[1].split(","):
    a, _, b = part.partition("-")
    w.update(range(int(a), int(b or a) + 1))
print(",".join(str(c) for c in sorted(os.sched_getaffinity(0)) if c not in w))' "$BURST_WEBHOOK_CPUS")
  [ -n "$OTHER_CPUS" ] || { echo "BURST_WEBHOOK_CPUS=$BURST_WEBHOOK_CPUS leaves no CPU for the control plane"; exit 100; }
  PIN=(taskset -c "$BURST_WEBHOOK_CPUS")
  CLIENT_PIN=(taskset -c "$OTHER_CPUS")
  for pid in "${CONTROL[@]}"; do
    was=$(taskset -p -c "$pid" | sed 's/.*: //')
    taskset -a -p -c "$OTHER_CPUS" "$pid" >/dev/null && MOVED+=("$pid=$was")
  done
  echo "webhooks on CPUs $BURST_WEBHOOK_CPUS; control plane (${#MOVED[@]} processes) and client on CPUs $OTHER_CPUS"
fi
for i in $(seq 1 "$REPLICAS"); do
  p=$((PORT + i)); backends+=("$p")
  routing=()
  # Several replicas send each charge to its queue's owner (as manifests/ deploys them);
  # BURST_ROUTING=0 has each record what it admits.
  [ "$REPLICAS" -gt 1 ] && [ "${BURST_ROUTING:-1}" = 1 ] && routing=(--peer-routing --advertise-address "127.0.0.1:$p")
  # BURST_NO_HOLDS=1: every charge gets a ledger write of its own (serve --no-holds).
  [ -n "${BURST_NO_HOLDS:-}" ] && routing+=(--no-holds)
  KUBECONFIG="$WORK/card-quota.kubeconfig" POD_NAME=burst-replica-$i "${PIN[@]}" "$BIN" serve --cert-dir "$WORK/certs" --listen "127.0.0.1:$p" --metrics-listen "127.0.0.1:$((p + 1000))" \
    --client-ca "$WORK/client-ca.crt" --client-name kube-apiserver-webhook-client "${routing[@]}" \
    --lease-namespace "$SYS" --lease-name card-quota-burst > "$WORK/replica-$i.log" 2>&1 &
  PIDS+=($!); CPU+=(--cpu "card-quota=$!")
done
if [ "$REPLICAS" = 1 ]; then URL_PORT=${backends[0]}; else
  "${PIN[@]}" "$EXAMPLES/rr_proxy" "$PORT" "${backends[@]}" & PIDS+=($!); CPU+=(--cpu "proxies=$!"); URL_PORT=$PORT
fi
for p in "${backends[@]}"; do
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$((p + 1000))/readyz" >/dev/null && break; sleep 0.3; done
done
"$BIN" manifests --cert-dir "$WORK/certs" --url "https://127.0.0.1:$URL_PORT" \
  --name "$Q" --namespace-label "card-quota-burst=$RUN" | k apply -f - >/dev/null
if [ -n "${BURST_FLOOR:-}" ]; then
  # As many floor webhooks as replicas, behind the same kind of proxy: both cases pay
  # for the same path.
  FLOOR_PORT=$((PORT + 50)); floors=()
  for i in $(seq 1 "$REPLICAS"); do
    fp=$((FLOOR_PORT + i)); floors+=("$fp")
    KUBECONFIG="$WORK/card-quota.kubeconfig" "${PIN[@]}" "$EXAMPLES/floor_webhook" --cert-dir "$WORK/certs" --listen "127.0.0.1:$fp" \
      ${BURST_FLOOR_WATCH:+--watch-pods} > "$WORK/floor-$i.log" 2>&1 &
    PIDS+=($!); CPU+=(--cpu "floor=$!")
  done
  if [ "$REPLICAS" = 1 ]; then FLOOR_PORT=${floors[0]}; else
    "${PIN[@]}" "$EXAMPLES/rr_proxy" "$FLOOR_PORT" "${floors[@]}" & PIDS+=($!); CPU+=(--cpu "proxies=$!")
  fi
  # Its hooks named apart (pods.floor.card-quota.volcano.sh ...) so the API server's
  # own latency metric tells the two cases apart.
  "$BIN" manifests --cert-dir "$WORK/certs" --url "https://127.0.0.1:$FLOOR_PORT" \
    --name "$Q-floor" --namespace-label "card-quota-floor=$RUN" \
    | sed -E 's/^(  name: [a-z-]+)\.card-quota\.volcano\.sh$/\1.floor.card-quota.volcano.sh/' | k apply -f - >/dev/null
fi
sleep 2
# The API server's view of each webhook call (TLS, HTTP and queueing included), before
# and after the run: printed per hook and case at the end.
hook_latency() { k get --raw /metrics | grep -E '^apiserver_admission_webhook_admission_duration_seconds_(sum|count)\{name="[a-z.-]*card-quota.volcano.sh"' || true; }
hook_latency > "$WORK/hooks-before"
rv0=$(k get queue "$Q" -o jsonpath='{.metadata.resourceVersion}')
t0=$(date +%s)
"${CLIENT_PIN[@]}" "$BURST_BIN" --pods "$PODS" --concurrency "$CONC" --rounds "$ROUNDS" \
  --case "plain=$Q-plain" --case "resourcequota=$Q-rq" --case "card-quota=$Q-cq" "${CPU[@]}" \
  ${BURST_NO_CARDS:+--case "webhook-no-cards=$Q-nc"} ${BURST_FLOOR:+--case "webhook-floor=$Q-pf"} --queue "$Q"
t1=$(date +%s)
# Queue writes during the run: resourceVersions are not counters, so count the usage
# writes card-quota reports and compare with the run's length.
writes=0
for p in "${backends[@]}"; do
  n=$(curl -s "http://127.0.0.1:$((p + 1000))/metrics" | awk '/^card_quota_usage_writes_total\{result="applied"\}/ {print $2}')
  writes=$((writes + ${n:-0}))
done
echo "card-quota replicas: $REPLICAS; Queue writes by card-quota during the run: $writes in $((t1 - t0)) s (queue resourceVersion $rv0 -> $(k get queue "$Q" -o jsonpath='{.metadata.resourceVersion}'))"
# Ledger writes (compare-and-swap writes that landed) per 1,000 card-quota pods admitted.
lw=0; held=0
for p in "${backends[@]}"; do
  m=$(curl -s "http://127.0.0.1:$((p + 1000))/metrics")
  n=$(awk '/^card_quota_ledger_writes_total\{result="written"\}/ {print $2}' <<<"$m"); lw=$((lw + ${n:-0}))
  n=$(awk '/^card_quota_ledger_held_charges_total / {print $2}' <<<"$m"); held=$((held + ${n:-0}))
done
cq_pods=$((PODS * ROUNDS))
echo "ledger writes: $lw for $cq_pods card-quota pods ($(( lw * 1000 / cq_pods )) per 1,000); $held admitted under a hold without a write of their own"
for p in "${backends[@]}"; do
  curl -s "http://127.0.0.1:$((p + 1000))/metrics" | grep -E '^card_quota_(ledger_(writes_total|rereads_total|batch_requests_(sum|count)|write_duration_seconds_(sum|count))|admission_duration_seconds_(sum|count)|admission_duration_seconds_bucket\{.*kind="pod"|forwarded_charges_total)' | sed "s/^/  replica :$p  /" || true
done
# Mean time the API server waited on each hook during the run, per operation and type
# (card-quota's hooks, then the floor's under pods.floor...).
hook_latency > "$WORK/hooks-after"
echo "API server's mean wait per webhook call during the run:"
awk '
  { split($1, a, "{"); metric = a[1]; labels = a[2]; sub(/}$/, "", labels)
    key = labels; gsub(/,?rejected="[a-z]*"/, "", key)
    if (FILENAME == ARGV[1]) { before[metric, key] += $2; next }
    after[metric, key] += $2; keys[key] = 1 }
  END {
    for (k in keys) {
      c = after["apiserver_admission_webhook_admission_duration_seconds_count", k] - before["apiserver_admission_webhook_admission_duration_seconds_count", k]
      s = after["apiserver_admission_webhook_admission_duration_seconds_sum", k] - before["apiserver_admission_webhook_admission_duration_seconds_sum", k]
      if (c > 0) printf "  %-90s %7d calls  %6.2f ms mean\n", k, c, 1000 * s / c
    }
  }' "$WORK/hooks-before" "$WORK/hooks-after" | sort
