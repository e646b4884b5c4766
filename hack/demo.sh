#!/usr/bin/env bash
# hack/demo.sh (`make demo`): the user's path on the local cluster, as a cluster admin and a serving engineer run it.
#
#   1. start the local control plane with kwok's fake 8-GPU RDMA nodes and one real node (hack/cluster.sh)
#   2. build the operator image from images/operator/Dockerfile and push it to the local registry (hack/images.sh)
#   3. helm install charts/specserving-operator into a Pod Security "restricted" namespace; both replicas run on
#      the real node, the API server calls the webhook through its Service
#   4. helm test (the hook Pod asks for a NGRAM dry run, which the webhook must refuse)
#   5. kubectl apply the seed example and wait for Ready (serving pods land on the fake GPU nodes)
#   6. kubectl apply a NGRAM variant: refused by the webhook, and not stored
#   7. kubectl apply a DSPARK variant on the stand-in SGLang 0.5.16 base, which lacks DSPARK's PD-decode builder: the
#      operator's build Job builds images/sglang-pd with rootless BuildKit on the real node, the probe passes, the
#      image is pushed to the local registry, and the pools run it by digest (the registry API shows the digest)
#   8. show what the operator made, and its metrics read through its Service
#   9. a SpecServing served for real: its pools and the real smg router run on the real node (stand-in engines,
#      NOT SGLang), the router registers every DP rank, and the operator's check request gets an answer
#      (ServingVerified), as does one sent here through the router
#
# Everything is left running: the operator keeps reconciling after the script exits. The script ends by saying how
# to look around and how to tear down. Running it again upgrades in place.
# Settings: DEMO_NAMESPACE (default specserving-demo), DEMO_EXAMPLE, DEMO_TIMEOUT (seconds, default 180),
# DEMO_BUILD_TIMEOUT (seconds, default 1800: a cold build pulls a 6 GB base),
# OPERATOR_NAMESPACE (default specserving-system), VENV (default .venv), SPECSERVING_CLUSTER_NAME.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
VENV=${VENV:-$REPO/.venv}
NS=${DEMO_NAMESPACE:-specserving-demo}
OPNS=${OPERATOR_NAMESPACE:-specserving-system}
RELEASE=specserving-operator
EXAMPLE=${DEMO_EXAMPLE:-examples/dspark-pd-tp8dp8.yaml}
TIMEOUT=${DEMO_TIMEOUT:-180}
BUILD_TIMEOUT=${DEMO_BUILD_TIMEOUT:-1800}
REGISTRY=10.88.0.1:5000  # hack/node.sh serves it on the real node's bridge address
STEPS=9
STEP=0

step() { STEP=$((STEP + 1)); printf '\n\033[1m==> [%d/%d] %s\033[0m\n' "$STEP" "$STEPS" "$*"; }
say() { printf '    %s\n' "$*"; }
die() { printf 'demo.sh: error: %s\n' "$*" >&2; exit 1; }

[[ -x $VENV/bin/python ]] || die "$VENV/bin/python is missing; run 'make venv' first"
NAME=$("$VENV/bin/python" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["metadata"]["name"])' "$EXAMPLE")
[[ ${SPECSERVING_REAL_NODE:-1} == 1 ]] || die "make demo runs the operator on the real node; unset SPECSERVING_REAL_NODE"

step "Starting the local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok's fake 8-GPU RDMA nodes, and a real node (containerd, kubelet, kube-proxy) with a local registry (hack/cluster.sh; the first run builds the binaries, about 10-20 min on 2 cores, then they are cached)"
bash hack/cluster.sh build
bash hack/cluster.sh up >/dev/null
eval "$(bash hack/cluster.sh env)"
say "KUBECONFIG=$KUBECONFIG"
# awk reads to the end: `head` would close the pipe early, and under pipefail kubectl's SIGPIPE ends the script.
kubectl get nodes -o custom-columns='NODE:.metadata.name,RUNTIME:.status.nodeInfo.containerRuntimeVersion,GPUS:.status.allocatable.nvidia\.com/gpu,RDMA:.status.allocatable.rdma/ib' |
    awk 'NR <= 3 || /specserving-real/'
say "... ($(kubectl get nodes -l type=kwok --no-headers | wc -l) fake GPU nodes in all)"

step "Building the operator image (images/operator/Dockerfile), the rootless BuildKit image, the SGLang 0.5.16 base, the stand-in engine and the router image (stand-ins, see docs/image-build.md and docs/router.md) with buildah, and pushing them to the local registry"
IMAGE=$(bash hack/images.sh operator)
REPOSITORY=${IMAGE%@*}
REPOSITORY=${REPOSITORY%:*}
DIGEST=${IMAGE#*@}
say "$IMAGE"
BUILDKIT=$(bash hack/images.sh buildkit)
say "$BUILDKIT"
SGLANG_BASE=$(bash hack/images.sh sglang 0.5.16)
say "$SGLANG_BASE"
ENGINE_IMAGE=$(bash hack/images.sh stand-in-engine)
say "$ENGINE_IMAGE"
ROUTER_IMAGE=$(bash hack/images.sh stand-in-router)
say "$ROUTER_IMAGE"

step "helm install $RELEASE into namespace $OPNS (Pod Security: restricted)"
kubectl create namespace "$OPNS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl label namespace "$OPNS" --overwrite pod-security.kubernetes.io/enforce=restricted \
    pod-security.kubernetes.io/enforce-version=latest >/dev/null
# --wait: both replicas Ready, which the readiness probe ties to the webhook's TLS port answering.
helm upgrade --install "$RELEASE" charts/specserving-operator -n "$OPNS" \
    --set image.repository="$REPOSITORY" --set image.digest="$DIGEST" \
    --set build.registry="$REGISTRY/specserving-demo" --set build.buildkitImage="$BUILDKIT" \
    -f hack/real-node-values.yaml -f hack/real-node-build-values.yaml --wait --timeout 300s >/dev/null ||
    { kubectl get pods -n "$OPNS" -o wide; die "helm install did not become ready (kubectl logs -n $OPNS deploy/$RELEASE)"; }
kubectl get pods -n "$OPNS" -l app.kubernetes.io/instance="$RELEASE" \
    -o custom-columns='POD:.metadata.name,STATUS:.status.phase,NODE:.spec.nodeName,IP:.status.podIP,CONTAINER:.status.containerStatuses[0].containerID'

step "helm test $RELEASE (the hook Pod runs python -m specserving.selftest: a NGRAM dry run must be refused)"
helm test "$RELEASE" -n "$OPNS" --timeout 120s | grep -E '^(TEST SUITE|Last Started|Last Completed|Phase):'

step "kubectl apply -f $EXAMPLE, then wait for Ready (the serving pods run on the fake GPU nodes; kwok plays them)"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
started=$(date +%s)
kubectl apply -n "$NS" -f "$EXAMPLE"
if ! kubectl wait -n "$NS" "sps/$NAME" --for=condition=Ready --timeout="${TIMEOUT}s"; then
    kubectl describe -n "$NS" "sps/$NAME" | tail -30
    die "$NAME did not become Ready in ${TIMEOUT}s (kubectl logs -n $OPNS deploy/$RELEASE)"
fi
say "Ready after $(( $(date +%s) - started ))s"

step "kubectl apply of the same example with algorithm NGRAM, which has no PD-decode builder: the webhook refuses it"
BAD=$NAME-ngram
BAD_FILE=$(mktemp --suffix=.yaml)
trap 'rm -f "$BAD_FILE"' EXIT
"$VENV/bin/python" - "$EXAMPLE" "$BAD" >"$BAD_FILE" <<'PY'
import sys, yaml
obj = yaml.safe_load(open(sys.argv[1]))
obj["metadata"]["name"] = sys.argv[2]
obj["spec"]["speculative"]["algorithm"] = "NGRAM"
yaml.safe_dump(obj, sys.stdout, sort_keys=False)
PY
if out=$(kubectl apply -n "$NS" -f "$BAD_FILE" 2>&1); then
    die "the NGRAM variant was admitted: $out"
fi
printf '%s\n' "$out" | fold -s -w 116 | sed 's/^/    /'
if kubectl get sps -n "$NS" "$BAD" >/dev/null 2>&1; then
    die "the NGRAM variant $BAD was stored"
fi
say "kubectl get sps $BAD: $(kubectl get sps -n "$NS" "$BAD" 2>&1)"

BUILT_NAME=$NAME-on-0516
step "kubectl apply of the same example on the SGLang 0.5.16 base, which has no PD-decode builder for DSPARK: the operator builds the fixed image (a real rootless BuildKit Job on the real node), then runs the pools on its digest"
# Rootless BuildKit needs seccomp and AppArmor unconfined: the namespace that runs builds must allow Pod Security
# "privileged" (docs/image-build.md); the operator's own namespace stays "restricted".
kubectl label namespace "$NS" --overwrite pod-security.kubernetes.io/enforce=privileged >/dev/null
BUILT_FILE=$(mktemp --suffix=.yaml)
trap 'rm -f "$BAD_FILE" "$BUILT_FILE"' EXIT
"$VENV/bin/python" - "$EXAMPLE" "$BUILT_NAME" "${SGLANG_BASE%@*}" >"$BUILT_FILE" <<'PY'
import sys, yaml
obj = yaml.safe_load(open(sys.argv[1]))
obj["metadata"]["name"] = sys.argv[2]
obj["spec"]["image"]["base"] = sys.argv[3]
obj["spec"]["image"].pop("sglangVersion", None)
yaml.safe_dump(obj, sys.stdout, sort_keys=False)
PY
started=$(date +%s)
kubectl apply -n "$NS" -f "$BUILT_FILE"
job=""
for _ in $(seq 60); do
    job=$(kubectl get jobs -n "$NS" -l specserving.io/build -o jsonpath='{.items[0].metadata.name}' 2>/dev/null) && [[ -n $job ]] && break
    sleep 1
done
if [[ -n $job ]]; then
    say "build Job $job (kubectl logs -n $NS -f job/$job); waiting for it (a cold build pulls the 6 GB base)"
    kubectl wait -n "$NS" "job/$job" --for=condition=Complete --timeout="${BUILD_TIMEOUT}s" >/dev/null ||
        { kubectl logs -n "$NS" "job/$job" --tail=30 || true; die "the build Job $job did not complete"; }
    kubectl logs -n "$NS" "job/$job" | grep -E 'fix active: |pushing manifest for .* done' | sed 's/^/    /' || true
else
    say "no build Job: this registry already holds the image for this base and fix (status.image remembers it)"
fi
if ! kubectl wait -n "$NS" "sps/$BUILT_NAME" --for=condition=Ready --timeout="${TIMEOUT}s"; then
    kubectl describe -n "$NS" "sps/$BUILT_NAME" | tail -30
    die "$BUILT_NAME did not become Ready (kubectl logs -n $OPNS deploy/$RELEASE)"
fi
RESOLVED=$(kubectl get sps -n "$NS" "$BUILT_NAME" -o jsonpath='{.status.image.resolved}')
say "Ready after $(( $(date +%s) - started ))s on $RESOLVED"
repo=${RESOLVED%@*}
repo=${repo#"$REGISTRY"/}
code=$(curl -s -o /dev/null -w '%{http_code}' -I \
    -H 'Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json' \
    "http://$REGISTRY/v2/$repo/manifests/${RESOLVED#*@}")
[[ $code == 200 ]] || die "the registry has no manifest for $RESOLVED (HTTP $code)"
say "the registry API has it: HEAD /v2/$repo/manifests/${RESOLVED#*@} -> HTTP $code"

step "What the operator made, and its metrics (read from its pods through the API server's proxy)"
kubectl get sps -n "$NS" -o wide
echo
kubectl get deployments,services,poddisruptionbudgets -n "$NS" -l "specserving.io/instance=$NAME"
echo
kubectl get sps -n "$NS" "$NAME" -o jsonpath='{range .status.conditions[*]}{.type}{"\t"}{.status}{"\t"}{.reason}{"\n"}{end}' | column -t -s $'\t'
echo
# The Service picks either replica, and only the peering leader reconciles: read each pod, show the leader's.
port=$(kubectl get pods -n "$OPNS" -l app.kubernetes.io/instance="$RELEASE" \
    -o jsonpath='{.items[0].spec.containers[0].ports[?(@.name=="metrics")].containerPort}')
for pod in $(kubectl get pods -n "$OPNS" -l app.kubernetes.io/instance="$RELEASE" -o name); do
    text=$(kubectl get --raw "/api/v1/namespaces/$OPNS/pods/${pod#pod/}:$port/proxy/metrics" 2>/dev/null) || continue
    grep -q -E '^specserving_reconcile_total\{[^}]*\} [1-9]' <<<"$text" || continue
    say "${pod#pod/} (the leader):"
    grep -E '^specserving_(reconcile_total|specservings|builds_total|build_duration_seconds_(sum|count))' <<<"$text" |
        grep -v -E ' 0.0$' | sed 's/^/    /' || true
done

say "ServingVerified above is False: kwok's pods answer no request. The next step serves one for real."

step "A SpecServing served for real: pools and the real smg router on the real node (stand-in engines, NOT SGLang; GPUs and RDMA advertised as extended resources), then a request through the router"
kubectl patch node specserving-real-0 --subresource=status --type=merge \
    -p '{"status":{"capacity":{"nvidia.com/gpu":"64","rdma/ib":"64"}}}' >/dev/null
SERVED=served
started=$(date +%s)
sed -e "s|ENGINE_IMAGE|$ENGINE_IMAGE|" -e "s|ROUTER_IMAGE|$ROUTER_IMAGE|" hack/demo-served.yaml | kubectl apply -n "$NS" -f -
if ! kubectl wait -n "$NS" "sps/$SERVED" --for=condition=ServingVerified --timeout="${TIMEOUT}s"; then
    kubectl describe -n "$NS" "sps/$SERVED" | tail -30
    die "$SERVED was not verified serving in ${TIMEOUT}s (kubectl logs -n $NS deploy/$SERVED-router)"
fi
say "ServingVerified after $(( $(date +%s) - started ))s: $(kubectl get sps -n "$NS" "$SERVED" \
    -o jsonpath='{.status.conditions[?(@.type=="ServingVerified")].message}')"
router_ip=$(kubectl get pods -n "$NS" -l specserving.io/instance=$SERVED,specserving.io/role=router \
    -o jsonpath='{.items[0].status.podIP}')
say "the router's own worker list (GET /workers): $(curl -s "http://$router_ip:8000/workers" |
    "$VENV/bin/python" -c 'import json, sys; w = json.load(sys.stdin)["workers"]; print(len(w), "workers:", ", ".join(sorted(x["worker_type"] + " " + x["url"].split("//")[1] for x in w)))')"
svc=$(kubectl get svc -n "$NS" "$SERVED-router" -o jsonpath='{.spec.clusterIP}')
say "curl http://$svc:8000/v1/completions (the router Service):"
curl -s "http://$svc:8000/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "/models/stand-in", "prompt": "hello", "max_tokens": 1}' | sed 's/^/    /'
echo

cat <<EOF

The operator keeps running on the real node. To look around:
    eval "\$(bash hack/cluster.sh env)"
    kubectl get sps -A                                   # SpecServings, Ready, phase, pools
    kubectl get pods -n $OPNS -o wide              # the operator's two replicas
    kubectl logs -n $OPNS deploy/$RELEASE          # its log
    kubectl describe sps -n $NS $NAME
    kubectl scale sps -n $NS $NAME --replicas=3   # scale the decode pool
    kubectl logs -n $NS deploy/$SERVED-router      # the router registering and routing
To tear everything down (operator, cluster, real node; the image cache stays):
    make cluster-down
EOF
