#!/usr/bin/env bash
# Rolling restart under load: two replicas behind haproxy (standing in for the Service,
# health-checking /readyz), a steady stream of pod creations into one queue, and each
# replica restarted in turn with SIGTERM as a Deployment rollout does. Passes when no
# creation is refused or fails.
#
#   KUBECONFIG=<kubeconfig> e2e/rolling.sh [path/to/card-quota]
#
# ROLLING_PODS (4000), ROLLING_CONCURRENCY (4).
set -euo pipefail
BIN=${1:-target/release/card-quota}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
: "${KUBECONFIG:?set KUBECONFIG}"
command -v haproxy >/dev/null || { echo "haproxy is needed (Debian: apt-get install haproxy)"; exit 100; }
PODS=${ROLLING_PODS:-6000}
CONC=${ROLLING_CONCURRENCY:-4}
RUN=r$(date +%s | tail -c 5)$RANDOM
Q=cq-rolling-$RUN
SYS=cq-rolling-$RUN-system
PORT=${ROLLING_PORT:-19743}
WORK=$(mktemp -d /tmp/cq-rolling.XXXXXX)
PIDS=()
k() { kubectl "$@" 2> >(grep -v 'exceeds the supported minor version skew' >&2); }
# shellcheck source=e2e/lib.sh
. "$(dirname "$0")/lib.sh"
cleanup() {
  # The test is over: no drain, and the ports are free when this returns.
  for p in "${PIDS[@]}" $(cat "$WORK"/pid.* 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
  for p in $(cat "$WORK"/pid.* 2>/dev/null); do while kill -0 "$p" 2>/dev/null; do sleep 0.1; done; done
  wait 2>/dev/null || true
  k delete mutatingwebhookconfiguration,validatingwebhookconfiguration "$Q" --ignore-not-found >/dev/null 2>&1 || true
  e2e_remove_identity "$Q"
  k delete queue "$Q" --ignore-not-found >/dev/null 2>&1 || true
  k delete node "$Q-rtx" --ignore-not-found >/dev/null 2>&1 || true
  k delete namespace "$Q" "$SYS" --wait=false --ignore-not-found >/dev/null 2>&1 || true
  [ -n "${ROLLING_KEEP:-}" ] && echo "logs in $WORK" || rm -rf "$WORK"
}
trap cleanup EXIT
e2e_sweep_stale_hooks
e2e_build_burst "$(dirname "$0")/.." || { echo "could not build examples/burst.rs"; exit 100; }

k create namespace "$Q" >/dev/null; k create namespace "$SYS" >/dev/null
k label namespace "$Q" "card-quota-rolling=$RUN" >/dev/null
k create -f - >/dev/null <<YAML
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata: {name: $Q, annotations: {volcano.sh/card.quota: '{"RTX-4090":1000000}'}}
spec: {weight: 1}
YAML
k create -f - >/dev/null <<YAML
{"apiVersion":"v1","kind":"Node","metadata":{"name":"$Q-rtx","labels":{"nvidia.com/gpu.product":"RTX-4090"}}}
YAML
for _ in 1 2 3 4 5 6 7 8; do
  k get --raw "/api/v1/nodes/$Q-rtx" | jq '.status = {capacity: {"nvidia.com/gpu": "1000000", pods: "1000000"}, allocatable: {"nvidia.com/gpu": "1000000", pods: "1000000"}}' > "$WORK/node.json"
  k replace --raw "/api/v1/nodes/$Q-rtx/status" -f "$WORK/node.json" >/dev/null 2>&1 && break
  sleep 0.3
done
"$BIN" certs --service card-quota --namespace "$SYS" --ip 127.0.0.1 --out "$WORK/certs" >/dev/null 2>&1
k config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d > "$WORK/client-ca.crt"
# Each replica runs as the install's ServiceAccount with the install's RBAC (e2e/lib.sh).
e2e_install_identity "$BIN" "$SYS" "$Q"

serve() { # name port
  # Each queue's charges go to its owner (--peer-routing, as manifests/ deploys): a
  # replica going away must not cost a refusal through the other's forwarding either.
  KUBECONFIG="$WORK/card-quota.kubeconfig" POD_NAME=rolling-$1 "$BIN" serve --cert-dir "$WORK/certs" --listen "127.0.0.1:$2" --metrics-listen "127.0.0.1:$(($2 + 1000))" \
    --client-ca "$WORK/client-ca.crt" --client-name kube-apiserver-webhook-client \
    --peer-routing --advertise-address "127.0.0.1:$2" \
    --drain-seconds 3 --cert-reload-seconds 0.5 --lease-namespace "$SYS" --lease-name card-quota-rolling >> "$WORK/$1.log" 2>&1 &
  echo $! > "$WORK/pid.$1"
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$(($2 + 1000))/readyz" >/dev/null && return; sleep 0.2; done
  echo "replica $1 never became ready"; cat "$WORK/$1.log"; exit 100
}
PA=$((PORT + 1)); PB=$((PORT + 2))
serve a "$PA"; serve b "$PB"
cat > "$WORK/haproxy.cfg" <<CFG
global
  maxconn 2000
defaults
  mode tcp
  timeout connect 2s
  timeout client 120s
  timeout server 120s
frontend webhook
  bind 127.0.0.1:$PORT
  default_backend replicas
backend replicas
  balance roundrobin
  option httpchk GET /readyz
  http-check expect status 200
  server a 127.0.0.1:$PA check port $((PA + 1000)) inter 200ms fall 1 rise 2
  server b 127.0.0.1:$PB check port $((PB + 1000)) inter 200ms fall 1 rise 2
CFG
haproxy -f "$WORK/haproxy.cfg" -db > "$WORK/haproxy.log" 2>&1 & PIDS+=($!)
sleep 1
hooks() { # cert-dir: the webhook configurations with that directory's caBundle
  "$BIN" manifests --cert-dir "$1" --url "https://127.0.0.1:$PORT" \
    --name "$Q" --namespace-label "card-quota-rolling=$RUN" | k apply -f - >/dev/null
}
hooks "$WORK/certs"
sleep 2
restart() { # name port
  local pid; pid=$(cat "$WORK/pid.$1")
  local t0; t0=$(date +%s%N)
  kill -TERM "$pid"; while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  serve "$1" "$2"
  echo "replica $1 restarted in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
}
rotated() { local n; n=$(grep -c 'serving a rotated certificate' "$WORK/$1.log" 2>/dev/null); echo "${n:-0}"; }
rotate_ca() {
  # The documented CA rotation (docs/operations.md): new CA, caBundle with both, the
  # replicas' certificate swapped (a Secret update), then the old CA dropped.
  cp -r "$WORK/certs" "$WORK/next"
  "$BIN" certs --rotate-ca --service card-quota --namespace "$SYS" --ip 127.0.0.1 --out "$WORK/next" 2>/dev/null >/dev/null
  hooks "$WORK/next"
  sleep 1
  local a0 b0; a0=$(rotated a); b0=$(rotated b)
  cp "$WORK/next/tls.key" "$WORK/next/tls.crt" "$WORK/certs/"
  local i
  for i in $(seq 1 50); do
    [ "$(rotated a)" -gt "$a0" ] && [ "$(rotated b)" -gt "$b0" ] && break
    [ "$i" = 50 ] && { echo "the replicas did not load the new certificate within 10 s"; return 1; }
    sleep 0.2
  done
  "$BIN" certs --drop-previous-ca --out "$WORK/next" 2>/dev/null >/dev/null
  hooks "$WORK/next"
  echo "CA rotated: both replicas serve the new certificate, the old CA is no longer trusted"
}
(
  sleep 3; restart a "$PA"; sleep 2; restart b "$PB"; sleep 2; restart a "$PA"; sleep 1; rotate_ca
) > "$WORK/rollout.log" 2>&1 &
roller=$!
# The API server's own "ServerTimeout, please try again" (a CPU-starved control plane) is
# retried as a controller would; only webhook refusals and failures count.
"$BURST_BIN" --pods "$PODS" --concurrency "$CONC" --rounds 1 \
  --retry-server-timeouts --case "rolling=$Q" --queue "$Q" | tee "$WORK/stream.out"
wait "$roller" || true
cat "$WORK/rollout.log"
# Since each replica's last start: charges it sent to the queue's owner, by result.
for p in "$PA" "$PB"; do
  curl -s "http://127.0.0.1:$((p + 1000))/metrics" | grep -E '^card_quota_(forwarded_charges_total|ledger_writes_total)' | sed "s/^/  replica :$p  /" || true
done
if [ "$(grep -c restarted "$WORK/rollout.log")" -lt 3 ] || ! grep -q 'CA rotated' "$WORK/rollout.log"; then
  echo "FAIL: the stream ended before three restarts and a CA rotation; raise ROLLING_PODS"; exit 1
fi
if [ "$(grep -c 'serving a rotated certificate' "$WORK"/a.log "$WORK"/b.log | awk -F: '{s += $2} END {print s}')" -lt 2 ]; then
  echo "FAIL: the replicas did not both serve the rotated certificate"; exit 1
fi
total=$(grep TOTAL "$WORK/stream.out" || grep -E '^ +1 +rolling' "$WORK/stream.out")
echo "rolling restart: $total"
if grep -Eq '^ +1 +rolling +[0-9.]+ +[0-9]+ +0 +0 ' "$WORK/stream.out"; then
  echo "PASS: three rolling restarts and a CA rotation under a steady stream of pod creations, 0 refused, 0 failed"
else
  echo "FAIL: some creations were refused or failed during the rollout"; exit 1
fi
