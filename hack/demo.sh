#!/usr/bin/env bash
# hack/demo.sh (`make demo`): the operator end to end on the local control plane.
#
#   1. start the local control plane (hack/cluster.sh; the binaries are built once and cached)
#   2. install the SpecServing CRD
#   3. start `specserving run` in the background (log file below; stopped when this script exits)
#   4. apply examples/dspark-pd-tp8dp8.yaml and wait for Ready
#   5. print `kubectl get sps`, the children, the conditions, the events and the operator's metrics
#
# The cluster stays up afterwards so you can look around (`make cluster-down` stops it).
# Settings: DEMO_NAMESPACE (default specserving-demo), DEMO_EXAMPLE, DEMO_LOG, DEMO_TIMEOUT (seconds, default 180),
# VENV (default .venv), SPECSERVING_CLUSTER_NAME (hack/cluster.sh's cluster name).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
VENV=${VENV:-$REPO/.venv}
NS=${DEMO_NAMESPACE:-specserving-demo}
EXAMPLE=${DEMO_EXAMPLE:-examples/dspark-pd-tp8dp8.yaml}
LOG=${DEMO_LOG:-$REPO/out/demo-operator.log}
TIMEOUT=${DEMO_TIMEOUT:-180}
STEP=0

step() { STEP=$((STEP + 1)); printf '\n\033[1m==> [%d/8] %s\033[0m\n' "$STEP" "$*"; }
say() { printf '    %s\n' "$*"; }
die() { printf 'demo.sh: error: %s\n' "$*" >&2; exit 1; }
free_port() { "$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

[[ -x $VENV/bin/specserving ]] || die "$VENV/bin/specserving is missing; run 'make venv' first"
NAME=$("$VENV/bin/python" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["metadata"]["name"])' "$EXAMPLE")

step "Starting the local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok's fake 8-GPU RDMA nodes (hack/cluster.sh; the first run builds the binaries, ~20 min on 2 cores, then they are cached)"
bash hack/cluster.sh build
bash hack/cluster.sh up >/dev/null
eval "$(bash hack/cluster.sh env)"
say "KUBECONFIG=$KUBECONFIG"
kubectl get nodes -l type=kwok -o custom-columns='NODE:.metadata.name,GPUS:.status.allocatable.nvidia\.com/gpu,RDMA:.status.allocatable.rdma/ib' | head -4 || true
say "..."

step "Installing the SpecServing CRD (crds/specserving.io_specservings.yaml)"
kubectl apply --server-side --force-conflicts -f crds/specserving.io_specservings.yaml
kubectl wait --for=condition=Established crd/specservings.specserving.io --timeout=60s

step "Creating namespace $NS"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f -

HEALTH_PORT=$(free_port)
METRICS_PORT=$(free_port)
step "Starting the operator in the background: specserving run --namespace $NS (log: $LOG)"
mkdir -p "$(dirname "$LOG")"
"$VENV/bin/specserving" run --namespace "$NS" --kubeconfig "$KUBECONFIG" \
    --liveness "http://127.0.0.1:$HEALTH_PORT/healthz" --metrics-port "$METRICS_PORT" \
    --metrics-address 127.0.0.1 >"$LOG" 2>&1 &
OPERATOR=$!
stop_operator() {
    if kill -0 "$OPERATOR" 2>/dev/null; then
        kill -TERM "$OPERATOR" 2>/dev/null || true
        wait "$OPERATOR" 2>/dev/null || true
        printf '\n    operator stopped (log: %s); the cluster is still up: eval "$(bash hack/cluster.sh env)", make cluster-down to stop it\n' "$LOG"
    fi
}
trap stop_operator EXIT
deadline=$(( $(date +%s) + 30 ))
until curl -fsS "http://127.0.0.1:$HEALTH_PORT/healthz" >/dev/null 2>&1; do
    kill -0 "$OPERATOR" 2>/dev/null || { tail -20 "$LOG" >&2; die "the operator exited (log: $LOG)"; }
    (( $(date +%s) < deadline )) || { tail -20 "$LOG" >&2; die "the operator's liveness endpoint did not answer in 30s"; }
    sleep 0.5
done
say "liveness: http://127.0.0.1:$HEALTH_PORT/healthz, metrics: http://127.0.0.1:$METRICS_PORT/metrics"

step "Applying $EXAMPLE"
started=$(date +%s)
kubectl apply -n "$NS" -f "$EXAMPLE"

step "Waiting for $NAME to become Ready (pods run on the fake GPU nodes; kwok plays the containers)"
if ! kubectl wait -n "$NS" "sps/$NAME" --for=condition=Ready --timeout="${TIMEOUT}s"; then
    kubectl describe -n "$NS" "sps/$NAME" | tail -30
    die "$NAME did not become Ready in ${TIMEOUT}s (operator log: $LOG)"
fi
say "Ready after $(( $(date +%s) - started ))s"

step "What the operator made"
kubectl get sps -n "$NS" -o wide
echo
kubectl get deployments,services,poddisruptionbudgets,serviceaccounts,roles,rolebindings -n "$NS" -l "specserving.io/instance=$NAME"
echo
kubectl get pods -n "$NS" -l "specserving.io/instance=$NAME" -o wide
echo
kubectl get sps -n "$NS" "$NAME" -o jsonpath='{range .status.conditions[*]}{.type}{"\t"}{.status}{"\t"}{.reason}{"\t"}{.message}{"\n"}{end}' | column -t -s $'\t'
echo
kubectl get events -n "$NS" --field-selector "involvedObject.kind=SpecServing,involvedObject.name=$NAME" \
    -o custom-columns='TYPE:.type,REASON:.reason,MESSAGE:.message' | cut -c1-160

step "The scale subresource and the operator's metrics"
kubectl get --raw "/apis/specserving.io/v1alpha1/namespaces/$NS/specservings/$NAME/scale"; echo
curl -fsS "http://127.0.0.1:$METRICS_PORT/metrics" | grep -E '^specserving_(reconcile_total|specservings|pool_replicas|status_writes_total|api_requests_total)' | grep -v ' 0.0$' | head -20
