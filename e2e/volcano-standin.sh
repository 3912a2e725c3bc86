# Volcano's part in the e2e, played as the real Volcano v1.15 plays it (sourced by
# e2e/jobs-wait.sh). Every request shape and identity follows the recorded writes in
# ../shared/fixtures/volcano-v1.15/ (writes-live-run.jsonl, writes-held-enqueue.jsonl):
#   - vc-controllers creates a Job's PodGroup `<job>-<job uid>` with the Job's
#     annotations, owner the Job, status {}; twice within milliseconds (201, then 409);
#   - vc-scheduler enqueues with an UPDATE of the PodGroup itself (Pending -> Inqueue),
#     once per scheduling cycle (1 s) while it is refused;
#   - once Inqueue, vc-controllers creates every pod of the Job in one sync
#     (scheduling.k8s.io/group-name, volcano.sh/queue-name as annotation and label, the
#     template's annotations); a refused write fails the sync, retried with backoff, and
#     the Job is terminated after 15 failures (--max-requeue-num);
#   - vc-scheduler binds each pod (pods/binding) and moves the PodGroup to Running.
#
# E2E_VOLCANO=real: the cluster runs the real Volcano; the stand-in only creates the Job
# objects and every check waits for what Volcano does.
#
# Needs: k, WORK, NS, CP_DIR (for the vc-*.kubeconfig files), NODE (where pods are bound).

VOLCANO=${E2E_VOLCANO:-standin}
VC_CTRL=(kubectl --kubeconfig "${CP_DIR:-}/vc-controllers.kubeconfig")
VC_SCHED=(kubectl --kubeconfig "${CP_DIR:-}/vc-scheduler.kubeconfig")
mkdir -p "$WORK/vc"

# Pod template parts of a worker with CARDS cards of MODELS (default NVIDIA-H200; `A|B`
# accepts either; 0 cards: a cardless worker).
worker_annotations() { [ "$1" = 0 ] && echo '{}' || echo "{volcano.sh/card.name: \"${2:-NVIDIA-H200}\"}"; }
worker_resources() { [ "$1" = 0 ] && echo '{}' || echo "{limits: {nvidia.com/gpu: \"$1\"}}"; }
# A worker's container: pause (bound to a fake node, it never runs), or, given SECONDS,
# one that runs that long and succeeds on a real node (its image loaded there).
worker_container() { # CARDS [SECONDS]
  if [ -z "${2:-}" ]; then
    echo "[{name: c, image: registry.k8s.io/pause:3.9, resources: $(worker_resources "$1")}]"
  else
    echo "[{name: c, image: localhost/kl-busybox:1, imagePullPolicy: Never, command: [sleep, \"$2\"], resources: $(worker_resources "$1")}]"
  fi
}

# vc_job NAME QUEUE REPLICAS CARD-REQUEST-JSON|'' [CARDS, default 1] [SECONDS] [MODELS]
# [SPLIT]: a Volcano Job of REPLICAS workers of CARDS cards each of MODELS (default
# NVIDIA-H200; given SECONDS, workers that run that long and finish; SPLIT `true`: the
# Job's volcano.sh/card.split); the user creates it, the job controller creates its
# PodGroup.
vc_job() {
  local name=$1 queue=$2 replicas=$3 request=$4 cards=${5:-1} seconds=${6:-} models=${7:-NVIDIA-H200} split=${8:-} anns=()
  [ -z "$request" ] || anns+=("volcano.sh/card.request: '$request'")
  [ -z "$split" ] || anns+=("volcano.sh/card.split: \"$split\"")
  anns=$(IFS=,; [ ${#anns[@]} = 0 ] || echo "annotations: {${anns[*]}}")
  k apply -f - >/dev/null <<EOF
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: $name, namespace: $NS, $anns}
spec:
  schedulerName: volcano
  queue: $queue
  minAvailable: $replicas
  tasks:
    - name: w
      replicas: $replicas
      template:
        metadata: {annotations: $(worker_annotations "$cards" "$models")}
        spec:
          schedulerName: volcano
          restartPolicy: Never
          containers: $(worker_container "$cards" "$seconds")
EOF
  [ "$VOLCANO" = real ] && return 0
  local uid; uid=$(k -n "$NS" get vcjob "$name" -o jsonpath='{.metadata.uid}')
  k -n "$NS" get vcjob "$name" -o json | jq --arg uid "$uid" --arg q "$queue" --argjson n "$replicas" '{
    apiVersion: "scheduling.volcano.sh/v1beta1", kind: "PodGroup",
    metadata: ({name: "\(.metadata.name)-\($uid)", namespace: .metadata.namespace,
      ownerReferences: [{apiVersion: "batch.volcano.sh/v1alpha1", kind: "Job", name: .metadata.name,
        uid: $uid, controller: true, blockOwnerDeletion: true}]}
      + (if .metadata.annotations then {annotations: .metadata.annotations} else {} end)),
    spec: {minMember: $n, minTaskMember: {w: $n}, queue: $q,
      minResources: {"count/pods": ($n|tostring), pods: ($n|tostring), "nvidia.com/gpu": ($n|tostring)}},
    status: {}}' > "$WORK/vc/$name.pg.json"
  # The job controller's two CREATEs within milliseconds (201, then 409 AlreadyExists).
  local i creators=()
  for i in 1 2; do
    "${VC_CTRL[@]}" create -f "$WORK/vc/$name.pg.json" > "$WORK/vc/$name.create.$i" 2>&1 &
    creators+=($!)
  done
  wait "${creators[@]}"
  cat "$WORK/vc/$name.create.1" "$WORK/vc/$name.create.2" >> "$WORK/vc/$name.log"
  grep -q 'created' "$WORK/vc/$name.create.1" "$WORK/vc/$name.create.2" || sync_failed "$name" "PodGroup CREATE"
  # Only now does vc-scheduler's loop see the job.
  echo "$queue $replicas $cards $models $seconds" > "$WORK/vc/$name.job"
}

# The job controller's failed sync: after 15 the real Volcano terminates the Job.
sync_failed() { echo "$(date +%s) $2" >> "$WORK/vc/$1.sync-failures"; }
sync_failures() { [ -f "$WORK/vc/$1.sync-failures" ] && wc -l < "$WORK/vc/$1.sync-failures" || echo 0; }

pg_of() { k -n "$NS" get podgroup -o json | jq -r --arg j "$1" '.items[] | select(.metadata.ownerReferences[0].name == $j) | .metadata.name' | head -1; }
phase_of() { k -n "$NS" get podgroup "$(pg_of "$1")" -o jsonpath='{.status.phase}' 2>/dev/null; }
pods_of() { k -n "$NS" get pods -l "volcano.sh/job-name=$1" -o name 2>/dev/null | wc -l; }
# Checks run these in `bash -c`.
export NS
export -f pg_of phase_of pods_of

# One scheduling cycle for one job: enqueue when Pending; once Inqueue, its pods are
# created (one sync) and bound, and the PodGroup goes Running.
vc_cycle() {
  local name=$1 pg phase queue replicas
  pg=$(pg_of "$name"); [ -n "$pg" ] || return 0
  local cards models seconds
  # The file goes when the Job finishes, maybe since the loop listed it.
  { read -r queue replicas cards models seconds < "$WORK/vc/$name.job"; } 2>/dev/null || return 0
  phase=$(k -n "$NS" get podgroup "$pg" -o jsonpath='{.status.phase}')
  if [ -z "$phase" ] || [ "$phase" = Pending ]; then
    k -n "$NS" get podgroup "$pg" -o json | jq '.status.phase = "Inqueue"' > "$WORK/vc/$name.enqueue.json"
    if "${VC_SCHED[@]}" replace -f "$WORK/vc/$name.enqueue.json" > "$WORK/vc/$name.enqueue.out" 2>&1; then
      echo "$(date +%s) enqueued" >> "$WORK/vc/$name.log"
      phase=Inqueue
    else
      echo "$(date +%s) $(tr '\n' ' ' < "$WORK/vc/$name.enqueue.out")" >> "$WORK/vc/$name.held"
      return 0
    fi
  fi
  if [ "$phase" = Inqueue ] && [ "$(pods_of "$name")" -lt "$replicas" ]; then
    local i ok=1
    for i in $(seq 0 $((replicas - 1))); do
      "${VC_CTRL[@]}" create -f - > "$WORK/vc/$name.pod.out" 2>&1 <<EOF || { grep -q AlreadyExists "$WORK/vc/$name.pod.out" || ok=0; }
apiVersion: v1
kind: Pod
metadata:
  name: $name-w-$i
  namespace: $NS
  labels: {volcano.sh/queue-name: $queue, volcano.sh/job-name: $name}
  annotations: $(sed "s|^{|{scheduling.k8s.io/group-name: $pg, volcano.sh/queue-name: $queue, volcano.sh/task-spec: w, |; s|, }|}|" <<<"$(worker_annotations "$cards" "$models")")
  ownerReferences: [{apiVersion: batch.volcano.sh/v1alpha1, kind: Job, name: $name, uid: "$(k -n "$NS" get vcjob "$name" -o jsonpath='{.metadata.uid}')", controller: true, blockOwnerDeletion: true}]
spec:
  schedulerName: volcano
  restartPolicy: Never
  containers: $(worker_container "$cards" "$seconds")
EOF
    done
    [ "$ok" = 1 ] || { sync_failed "$name" "pod CREATE: $(tr '\n' ' ' < "$WORK/vc/$name.pod.out")"; return 0; }
    echo "$(date +%s) pods created" >> "$WORK/vc/$name.log"
  fi
  # vc-scheduler binds what is unbound, every cycle, and then runs the group: on a node
  # of the model the pod is pinned to (the nodeSelector card-quota wrote), else on NODE.
  local p pin on
  for p in $(k -n "$NS" get pods -l "volcano.sh/job-name=$name" -o json | jq -r '.items[] | select(.spec.nodeName == null) | "\(.metadata.name)/\(.spec.nodeSelector["nvidia.com/gpu.product"] // "")"'); do
    pin=${p#*/} p=${p%%/*} on=$NODE
    [ -z "$pin" ] || on=$(k get nodes -l "nvidia.com/gpu.product=$pin" -o name | grep -m1 "$RUN" | sed 's|^node/||')
    on=${on:-$NODE}
    echo "{\"apiVersion\":\"v1\",\"kind\":\"Binding\",\"metadata\":{\"name\":\"$p\"},\"target\":{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"name\":\"$on\"}}" > "$WORK/vc/$name.bind.json"
    "${VC_SCHED[@]}" create --raw "/api/v1/namespaces/$NS/pods/$p/binding" -f "$WORK/vc/$name.bind.json" > "$WORK/vc/$name.bind.out" 2>&1 \
      || echo "$(date +%s) bind of $p: $(tr '\n' ' ' < "$WORK/vc/$name.bind.out")" >> "$WORK/vc/$name.log"
  done
  if [ "$phase" = Inqueue ] && [ "$(pods_of "$name")" -ge "$replicas" ]; then
    k -n "$NS" get podgroup "$pg" -o json | jq '.status.phase = "Running"' | "${VC_SCHED[@]}" replace -f - >/dev/null 2>&1
  fi
  # Workers that really run: once every one has succeeded, the job controller completes
  # the Job and deletes its PodGroup (as recorded).
  if [ -n "$seconds" ] && [ "$(k -n "$NS" get pods -l "volcano.sh/job-name=$name" -o json |
      jq '[.items[] | select(.status.phase == "Succeeded")] | length')" -ge "$replicas" ]; then
    echo "$(date +%s) completed" >> "$WORK/vc/$name.log"
    rm -f "$WORK/vc/$name.job"
    k -n "$NS" get podgroup "$pg" -o json | jq '.status.phase = "Completed"' | "${VC_SCHED[@]}" replace -f - >/dev/null 2>&1
    "${VC_CTRL[@]}" -n "$NS" delete podgroup "$pg" --wait=false >/dev/null 2>&1
  fi
}

# vc-scheduler's loop over every job of the stand-in, once a second, until $WORK/vc/stop.
vc_loop() {
  [ "$VOLCANO" = real ] && return 0
  ( while [ ! -f "$WORK/vc/stop" ]; do
      for j in "$WORK"/vc/*.job; do [ -f "$j" ] && vc_cycle "$(basename "$j" .job)"; done
      sleep 1
    done ) &
  PIDS+=($!)
}

# vc_finish NAME: the Job's pods succeed; Volcano completes its PodGroup and deletes it.
vc_finish() {
  local name=$1 p
  for p in $(k -n "$NS" get pods -l "volcano.sh/job-name=$name" -o name); do
    k -n "$NS" get "$p" -o json | jq '.status.phase = "Succeeded"' | k replace --raw "/api/v1/namespaces/$NS/pods/${p#pod/}/status" -f - >/dev/null
  done
  [ "$VOLCANO" = real ] && return 0
  rm -f "$WORK/vc/$name.job"
  local pg; pg=$(pg_of "$name")
  k -n "$NS" get podgroup "$pg" -o json | jq '.status.phase = "Completed"' | "${VC_SCHED[@]}" replace -f - >/dev/null 2>&1
  "${VC_CTRL[@]}" -n "$NS" delete podgroup "$pg" --wait=false >/dev/null 2>&1
}
