# Helpers shared by the e2e scripts (sourced). Needs: k (kubectl wrapper), WORK.

# A run killed before its cleanup leaves cluster-wide Fail-policy hooks pointing at a
# dead port, which would refuse every later run's pods: sweep them first.
e2e_sweep_stale_hooks() {
  k get mutatingwebhookconfiguration,validatingwebhookconfiguration -o name 2>/dev/null |
    grep -E '/cq-(e2e|burst|rolling|jobs)-' | xargs -r kubectl delete --ignore-not-found >/dev/null 2>&1 || true
}

# e2e_install_identity BIN SYS NAME: card-quota's ServiceAccount in SYS with the
# install's own RBAC (the cluster-wide role and binding renamed NAME for this run), and
# $WORK/card-quota.kubeconfig holding a TokenRequest token of that account. `serve` run
# with it has exactly the install's rights: a verb the manifests do not grant fails the
# e2e. Remove with e2e_remove_identity NAME.
e2e_install_identity() {
  local bin=$1 sys=$2 name=$3 token
  "$bin" manifests --cert-dir "$WORK/certs" --namespace "$sys" | k create --dry-run=client -o json -f - |
    jq --arg n "$name" '(if .kind == "List" then .items[] else . end)
      | select(.kind | test("^(ServiceAccount|ClusterRole|ClusterRoleBinding|Role|RoleBinding)$"))
      | if .kind == "ClusterRole" then .metadata.name = $n
        elif .kind == "ClusterRoleBinding" then .metadata.name = $n | .roleRef.name = $n else . end' |
    k apply -f - >/dev/null
  token=$(k -n "$sys" create token card-quota --duration=2h)
  k config view --raw --minify -o json | jq --arg t "$token" \
    '.users[0].user = {token: $t} | .contexts[0].context.user = .users[0].name' > "$WORK/card-quota.kubeconfig"
}
e2e_remove_identity() {
  k delete clusterrolebinding,clusterrole "$1" --ignore-not-found >/dev/null 2>&1 || true
}

# e2e_build_burst REPO: builds the burst examples (the client, the floor webhook, the
# round-robin proxy) once, before anything is timed, and sets BURST_BIN. (A `cargo run`
# inside a scenario would rebuild whenever the sources change during the run, and count
# cargo's own time.)
# E2E_PROFILE names the cargo profile (release by default; CI passes `test`, the profile
# its tests were built with, so nothing is compiled twice). Sets EXAMPLES too.
e2e_build_burst() {
  local profile=${E2E_PROFILE:-release} dir
  case $profile in release | bench) dir=release ;; dev | test) dir=debug ;; *) dir=$profile ;; esac
  cargo build --quiet --profile "$profile" --manifest-path "$1/Cargo.toml" \
    --example burst --example floor_webhook --example rr_proxy || return 1
  EXAMPLES=$1/target/$dir/examples
  BURST_BIN=$EXAMPLES/burst
}

# e2e_serve_release: `serve` as the installed Deployment in $NS would run it (the plane
# has no kubelet): its arguments, the release's account and certificate (with 127.0.0.1
# in it, for the URL the hooks call). Needs BIN, NS, PORT, WORK, wait_for; sets SERVE.
e2e_serve_release() {
  k -n "$NS" get secret card-quota-tls -o json > "$WORK/tls.json" || return 1
  mkdir -p "$WORK/tls"
  jq -r '.data["tls.crt"]' "$WORK/tls.json" | base64 -d > "$WORK/tls/tls.crt"
  jq -r '.data["tls.key"]' "$WORK/tls.json" | base64 -d > "$WORK/tls/tls.key"
  local token
  token=$(k -n "$NS" create token card-quota --duration=1h) || return 1
  k config view --raw --minify -o json | jq --arg t "$token" \
    '.users[0].user = {token: $t} | .contexts[0].context.user = .users[0].name' > "$WORK/sa.kubeconfig"
  mapfile -t args < <(k -n "$NS" get deploy card-quota -o json | jq -r '.spec.template.spec.containers[0].args[]' |
    grep -vE '^--(listen|metrics-listen|cert-dir|peer-routing)(=|$)')
  printf '%s\n' "${args[@]}" > "$WORK/args"
  KUBECONFIG="$WORK/sa.kubeconfig" POD_NAMESPACE="$NS" "$BIN" "${args[@]}" --listen "127.0.0.1:$PORT" \
    --metrics-listen "127.0.0.1:$((PORT + 1000))" --cert-dir "$WORK/tls" --lease-namespace "$NS" \
    --reconcile-seconds 0.5 >> "$WORK/serve.log" 2>&1 &
  SERVE=$!
  wait_for 30 curl -sf "http://127.0.0.1:$((PORT + 1000))/readyz"
}

# e2e_single_node_setup GPUS PODS: what the one-node scripts (waiting.sh,
# measure-refused-retry.sh) start from: their namespaces (NS labelled for the hooks),
# certificates for 127.0.0.1 and the API server's client CA in WORK, a Ready fake node
# NODE of NVIDIA-H200 offering GPUS cards and PODS pods (no kubelet: pods bind, nothing
# runs), and card-quota's identity. Needs BIN, NS, SYS, Q, RUN, NODE, WORK, wait_for;
# exits 100 when the cluster is not fit to test.
e2e_single_node_setup() {
  local gpus=$1 pods=$2
  e2e_sweep_stale_hooks
  for ns in "$NS" "$SYS"; do k create namespace "$ns" >/dev/null; done
  k label namespace "$NS" "card-quota-e2e=$RUN" >/dev/null
  wait_for 60 k -n "$NS" get sa default || { echo "no default ServiceAccount in $NS"; exit 100; }
  "$BIN" certs --service card-quota --namespace "$SYS" --ip 127.0.0.1 --out "$WORK/certs" >/dev/null 2>&1
  k config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d > "$WORK/client-ca.crt"
  k create -f - >/dev/null <<JSON
{"apiVersion":"v1","kind":"Node","metadata":{"name":"$NODE","labels":{"nvidia.com/gpu.product":"NVIDIA-H200"}}}
JSON
  k get --raw "/api/v1/nodes/$NODE" | jq --arg g "$gpus" --arg p "$pods" \
    '.status = {capacity: {cpu: "256", memory: "1Ti", pods: $p, "nvidia.com/gpu": $g}, allocatable: {cpu: "256", memory: "1Ti", pods: $p, "nvidia.com/gpu": $g}, conditions: [{type: "Ready", status: "True", reason: "E2E", message: "fake node"}]}' \
    | k replace --raw "/api/v1/nodes/$NODE/status" -f - >/dev/null
  e2e_install_identity "$BIN" "$SYS" "$Q"
}

# DRA without a driver: nodes with no kubelet and the ResourceSlices NVIDIA's DRA driver
# would publish for them; kube-scheduler allocates their devices. Objects carry the label
# E2E_LABEL (key=value) when it is set, so a script's cleanup can delete them by it.
e2e_labels() { # -> the labels as a JSON object
  if [ -n "${E2E_LABEL:-}" ]; then jq -cn --arg k "${E2E_LABEL%%=*}" --arg v "${E2E_LABEL#*=}" '{($k): $v}'; else echo '{}'; fi
}
# e2e_dra_node NAME: a Ready node with 64 CPUs, 512Gi and room for 500 pods (no GPU
# labels, no extended resources). Exits the script (100) when its status cannot be set.
e2e_dra_node() {
  jq -cn --arg n "$1" --argjson l "$(e2e_labels)" '{apiVersion: "v1", kind: "Node", metadata: {name: $n, labels: $l}}' \
    | k create -f - >/dev/null
  local try
  for try in 1 2 3 4 5 6 7 8; do
    k get --raw "/api/v1/nodes/$1" | jq '.status = {capacity: {cpu: "64", memory: "512Gi", pods: "500"}, allocatable: {cpu: "64", memory: "512Gi", pods: "500"}, conditions: [{type: "Ready", status: "True", reason: "E2E", message: "fake node"}]}' \
      > "$WORK/node-$1.json"
    k replace --raw "/api/v1/nodes/$1/status" -f "$WORK/node-$1.json" >/dev/null 2>&1 && return 0
    sleep 0.3
  done
  echo "could not set the status of node $1"; exit 100
}
# e2e_dra_slice NODE PRODUCT COUNT [more attributes, e.g. "e2e: {string: er}"]: the
# ResourceSlice NODE-gpu of driver gpu.nvidia.com, devices gpu-0 .. gpu-(COUNT-1).
e2e_dra_slice() {
  local devices="" i
  for i in $(seq 0 $(($3 - 1))); do
    devices+="  - {name: gpu-$i, attributes: {type: {string: gpu}, productName: {string: $2}${4:+, $4}}}"$'\n'
  done
  k create -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: $1-gpu, labels: $(e2e_labels)}
spec:
  driver: gpu.nvidia.com
  nodeName: $1
  pool: {name: $1, generation: 1, resourceSliceCount: 1}
  devices:
$devices
EOF
}
# e2e_dra_class NAMESPACE: NVIDIA's whole-GPU DeviceClass (gpu.nvidia.com) and, in
# NAMESPACE, the ResourceClaimTemplate one-gpu asking for one device of it.
e2e_dra_class() {
  k apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.nvidia.com, labels: $(e2e_labels)}
spec: {selectors: [{cel: {expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: $1}
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}}
EOF
}
