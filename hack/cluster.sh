#!/usr/bin/env bash
# hack/cluster.sh: build, start and stop SpecServing's local control plane.
#
#   build  build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok, kwokctl and helm
#          from their Go modules into $SPECSERVING_CACHE/ctlplane/<k8s-version>/bin (a no-op when they are there)
#   up     start a kwokctl cluster (binary runtime, 127.0.0.1, RBAC on) with fake 8-GPU RDMA nodes
#   down   stop and delete that cluster
#   env    print the KUBECONFIG export for that cluster, and a PATH export putting its kubectl and helm first
#   lws-up, lws-down  start the LeaderWorkerSet controller (hack/lws.sh) on that cluster / stop it and remove its
#          CRDs and webhooks; `build` also builds it
#
# Settings (environment):
#   SPECSERVING_CACHE         cache root (default $HOME/.cache/specserving)
#   SPECSERVING_CLUSTER_NAME  kwokctl cluster name (default specserving)
#   SPECSERVING_KWOK_WORKDIR  kwokctl's working dir (default $SPECSERVING_CACHE/kwok)
#   SPECSERVING_NODES         number of fake GPU nodes `up` creates (default 8)
#   SPECSERVING_GO_P          parallel Go compile jobs (default 2)
#   SPECSERVING_REAL_NODE     1 (default): `up` also starts the real node (hack/node.sh: containerd, kubelet,
#                             kube-proxy, a bridge and the local registry; root only, one cluster per machine);
#                             0: fake nodes only
#   SPECSERVING_LWS           1: `up` also starts the LeaderWorkerSet controller (default 0)
# See docs/control-plane.md.
set -euo pipefail

K8S_VERSION=1.36.3      # k8s.io/kubernetes; staging modules are v0.36.3
ETCD_VERSION=3.6.16     # go.etcd.io/etcd/server/v3
KWOK_VERSION=0.8.0      # sigs.k8s.io/kwok (kwok, kwokctl)
HELM_VERSION=3.21.4     # helm.sh/helm/v3; the last v3 built against k8s 0.36 libraries

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${SPECSERVING_CACHE:-$HOME/.cache/specserving}
ROOT=$CACHE/ctlplane/$K8S_VERSION
BIN=$ROOT/bin
SRC=$ROOT/src
CLUSTER_NAME=${SPECSERVING_CLUSTER_NAME:-specserving}
export KWOK_WORKDIR=${SPECSERVING_KWOK_WORKDIR:-$CACHE/kwok}
CLUSTER_DIR=$KWOK_WORKDIR/clusters/$CLUSTER_NAME
KUBECONFIG_PATH=$CLUSTER_DIR/kubeconfig.yaml
NODES=${SPECSERVING_NODES:-8}
(( NODES <= 2048 )) || { echo "cluster.sh: error: SPECSERVING_NODES=$NODES: at most 2048 fake nodes (a /26 each in 198.18.0.0/15)" >&2; exit 2; }
REAL_NODE=${SPECSERVING_REAL_NODE:-1}
LWS=${SPECSERVING_LWS:-0}
[[ $LWS == [01] ]] || { echo "cluster.sh: error: SPECSERVING_LWS must be 0 or 1, not '$LWS'" >&2; exit 2; }
[[ $REAL_NODE == [01] ]] || { echo "cluster.sh: error: SPECSERVING_REAL_NODE must be 0 or 1, not '$REAL_NODE'" >&2; exit 2; }
GATEWAY=10.88.0.1   # the real node's bridge address (hack/node.sh), where pods reach the API server
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy kwok kwokctl helm)
STAMP="k8s=$K8S_VERSION node=kubelet,kube-proxy etcd=$ETCD_VERSION kwok=$KWOK_VERSION helm=$HELM_VERSION"

log() { printf 'cluster.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
elapsed() { echo "$(( $(date +%s) - $1 ))s"; }

go_env() {
    # Everything Go downloads or compiles stays under the cache, so a clean clone reuses it.
    command -v go >/dev/null || PATH=/usr/local/go/bin:$PATH
    command -v go >/dev/null || die "go is not on PATH (and not in /usr/local/go/bin); the control plane is built from source"
    export GOTOOLCHAIN=local CGO_ENABLED=0
    export GOMODCACHE=$CACHE/go/mod GOCACHE=$CACHE/go/build
    # -modcacherw: keep the module cache deletable with plain rm -rf.
    export GOFLAGS="-trimpath -modcacherw -buildvcs=false"
    # No ",direct": modules come from the proxy only, never from a VCS host such as GitHub.
    export GOPROXY=${GOPROXY:-https://proxy.golang.org}
}

built() {
    local b
    [[ -f $BIN/VERSIONS && $(<"$BIN/VERSIONS") == "$STAMP" ]] || return 1
    for b in "${BINARIES[@]}"; do [[ -x $BIN/$b ]] || return 1; done
}

quietly() {
    # Run a go command; drop its download chatter, show everything if it fails.
    local out
    if ! out=$("$@" 2>&1); then
        printf '%s\n' "$out" >&2
        die "failed: $*"
    fi
    grep -v -E '^go: (downloading|added|upgraded|downgraded|finding|creating new go.mod|to add module)' <<<"$out" >&2 || true
}

build_kube() {
    # One wrapper module for the Kubernetes binaries, kwok and helm: they share the k8s.io libraries (all pinned
    # to the staging release), so each package is compiled once.
    local t=$1 out=$2 w=$SRC/kube s=0.${K8S_VERSION#1.} minor gm staging gd
    minor=$(cut -d. -f2 <<<"$K8S_VERSION")
    mkdir -p "$w"
    cd "$w"
    [[ -f go.mod ]] || quietly go mod init local/specserving-ctlplane
    log "resolving k8s.io/kubernetes v$K8S_VERSION, kwok v$KWOK_VERSION, helm v$HELM_VERSION ($(elapsed "$t"))"
    gm=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("GoMod") or sys.exit(d.get("Error")))') ||
        die "cannot download k8s.io/kubernetes@v$K8S_VERSION from $GOPROXY"
    # k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with ./staging/src/...; a module
    # that depends on it must replace each one with the published v0.X.Y. Generate the list: it grows per release.
    staging=$(awk '$1 == "replace" && $2 == "(" {r=1; next} r && $1 == ")" {r=0} r && $3 ~ /^\.\/staging\// {print $1}' "$gm")
    [[ -n $staging ]] || die "no staging replacements found in $gm"
    # shellcheck disable=SC2046
    go mod edit $(for m in $staging; do printf -- '-replace=%s=%s@v%s ' "$m" "$m" "$s"; done)
    gd=$(awk '$1 == "godebug" && NF == 2 {print $2}' "$gm")
    [[ -z $gd ]] || go mod edit -godebug="$gd"
    quietly go get -tool \
        "k8s.io/kubernetes/cmd/kube-apiserver@v$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kube-controller-manager@v$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kube-scheduler@v$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kubectl@v$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kubelet@v$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kube-proxy@v$K8S_VERSION" \
        "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION" \
        "sigs.k8s.io/kwok/cmd/kwokctl@v$KWOK_VERSION" \
        "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"
    # /version must report the real release: helm refuses charts with a kubeVersion constraint against v0.0.0.
    local cb=k8s.io/component-base/version cg=k8s.io/client-go/pkg/version ldflags
    ldflags="-s -w"
    for p in $cb $cg; do
        ldflags+=" -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
        ldflags+=" -X $p.buildDate=1970-01-01T00:00:00Z"
    done
    ldflags+=" -X sigs.k8s.io/kwok/pkg/consts.Version=v$KWOK_VERSION -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=v$K8S_VERSION"
    ldflags+=" -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
    log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet, kube-proxy, kwok, kwokctl, helm" \
        "(cold: ~20 CPU-minutes, 18 min on 2 lightly shared cores) ($(elapsed "$t"))"
    go build -p "${SPECSERVING_GO_P:-2}" -o "$out/" -ldflags "$ldflags" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
        k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy \
        sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl helm.sh/helm/v3/cmd/helm
}

build_etcd() {
    local t=$1 out=$2 w=$SRC/etcd
    mkdir -p "$w"
    cd "$w"
    [[ -f go.mod ]] || quietly go mod init local/specserving-etcd
    log "resolving go.etcd.io/etcd/server/v3 v$ETCD_VERSION ($(elapsed "$t"))"
    quietly go get -tool "go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
    log "building etcd (cold: ~2-3 min on 2 cores) ($(elapsed "$t"))"
    go build -p "${SPECSERVING_GO_P:-2}" -o "$out/etcd" \
        -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=v$ETCD_VERSION" go.etcd.io/etcd/server/v3
}

cmd_build() {
    built && { log "binaries for $STAMP are in $BIN"; return 0; }
    mkdir -p "$ROOT"
    exec 9>"$ROOT/build.lock"
    flock 9  # another build of this version is running: wait for it, then reuse what it built
    built && { log "binaries for $STAMP are in $BIN"; return 0; }
    local t out b
    t=$(date +%s)
    out=$ROOT/bin.partial
    go_env
    log "building the control plane ($STAMP) into $BIN with $(go version | cut -d' ' -f3)"
    log "Go caches: GOMODCACHE=$GOMODCACHE GOCACHE=$GOCACHE"
    rm -rf "$out"
    mkdir -p "$out" "$BIN"
    (build_etcd "$t" "$out")
    (build_kube "$t" "$out")
    for b in "${BINARIES[@]}"; do [[ -x $out/$b ]] || die "$out/$b was not built"; done
    # mv renames, so a cluster running the old binaries keeps them ("text file busy" otherwise).
    for b in "${BINARIES[@]}"; do mv -f "$out/$b" "$BIN/$b"; done
    rmdir "$out"
    echo "$STAMP" >"$BIN/VERSIONS"
    exec 9>&-
    log "built in $(elapsed "$t"): ${BINARIES[*]}"
}

kwokctl_config() {
    # kwokctl's binary runtime with our binaries only: every binary it might fetch is named by a local path, so
    # nothing is downloaded (a missing one fails instead). A Stage in the config replaces all default stages,
    # so hack/kwok/stages holds kwok's defaults we keep (some narrowed) plus SpecServing's own.
    cat <<EOF
kind: KwokctlConfiguration
apiVersion: config.kwok.x-k8s.io/v1alpha1
options:
  runtime: binary
  bindAddress: 127.0.0.1
  securePort: true
  kubeAuthorization: true
  kubeAdmission: true
  kubeVersion: v$K8S_VERSION
  kwokVersion: v$KWOK_VERSION
  etcdVersion: $ETCD_VERSION
  kubeBinaryPrefix: $BIN
  kubectlBinary: $BIN/kubectl
  etcdBinaryPrefix: $BIN
  etcdBinary: $BIN/etcd
  etcdctlBinary: $BIN/etcdctl
  etcdutlBinary: $BIN/etcdutl
  kwokBinaryPrefix: $BIN
  kwokControllerBinary: $BIN/kwok
  kectlBinary: $BIN/kectl
  cacheDir: $KWOK_WORKDIR/cache
EOF
    if [[ $REAL_NODE == 1 ]]; then
        # Pods on the real node reach the API server through the kubernetes Service, whose endpoint is the
        # advertised address: the bridge's gateway (the listener takes every local address, since kwokctl's own
        # components dial 127.0.0.1). The serving certificate must name that address and the Service's ClusterIP.
        # kwok must leave the real node to its kubelet: it plays only nodes annotated as fake.
        cat <<EOF
  kubeApiserverCertSANs: [$GATEWAY, 10.0.0.1]
componentsPatches:
- name: kube-apiserver
  extraArgs:
  - {key: bind-address, value: 0.0.0.0, override: true}
  - {key: advertise-address, value: $GATEWAY}
  # kubectl logs and exec reach the real kubelet at its InternalIP, as the cluster's admin (kwok's fake nodes have
  # no InternalIP and are still reached by name).
  - {key: kubelet-preferred-address-types, value: "InternalIP,Hostname"}
  - {key: kubelet-client-certificate, value: $CLUSTER_DIR/pki/admin.crt}
  - {key: kubelet-client-key, value: $CLUSTER_DIR/pki/admin.key}
- name: kwok-controller
  extraArgs:
  - {key: manage-all-nodes, value: "false", override: true}
  - {key: manage-nodes-with-annotation-selector, value: kwok.x-k8s.io/node=fake}
EOF
    fi
    local f
    for f in "$HERE"/kwok/stages/*.yaml; do
        printf -- '---\n'
        cat "$f"
    done
}

fake_nodes() {
    local i name cidr
    for ((i = 0; i < NODES; i++)); do
        name=kwok-gpu-$i
        # kwok gives each fake pod an IP from its node's podCIDR: a /26 per node in 198.18.0.0/15 (the range set
        # aside for benchmarks, RFC 2544), which hack/node.sh blackholes, rather than kwok's default 10.0.0.0/24,
        # which is also the Service range and would send a real pod's request for a fake pod off this machine.
        cidr="198.$(( 18 + i / 1024 )).$(( (i % 1024) / 4 )).$(( (i % 4) * 64 ))/26"
        cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: $name
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: $name
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    node-role.kubernetes.io/agent: ""
    type: kwok
    node.kubernetes.io/instance-type: kwok-8xh200-8xib
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.product: NVIDIA-H200
    nvidia.com/gpu.count: "8"
    nvidia.com/gpu.memory: "143771"
spec:
  podCIDR: $cidr
  podCIDRs: [$cidr]
status:
  allocatable: &resources
    cpu: "192"
    memory: 2Ti
    ephemeral-storage: 3500Gi
    pods: "110"
    nvidia.com/gpu: "8"
    rdma/ib: "8"
  capacity: *resources
EOF
    done
}

kctl() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

apiserver_ready() { [[ -f $KUBECONFIG_PATH ]] && kctl get --raw /readyz --request-timeout=5s >/dev/null 2>&1; }

wait_until() {
    # wait_until SECONDS WHAT COMMAND...: run COMMAND every half second until it succeeds or SECONDS have passed.
    local seconds=$1 what=$2 deadline
    deadline=$(( $(date +%s) + seconds ))
    shift 2
    until "$@"; do
        (( $(date +%s) < deadline )) || die "timed out after ${seconds}s waiting for $what"
        sleep 0.5
    done
}

nodes_ready() {
    local ready
    ready=$(kctl get nodes -l type=kwok \
        -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null |
        grep -c '^True$' || true)
    (( ready >= NODES ))
}

default_sa_ready() { kctl -n default get serviceaccount default >/dev/null 2>&1; }

kwokctl() {
    # kwokctl logs JSON lines when stderr is not a terminal; show INFO ones as plain text, the rest whole.
    # 8>&- 9>&-: the cluster's processes outlive kwokctl and must not inherit (and so hold) our flock fds.
    PATH=$BIN:$PATH "$BIN/kwokctl" --name "$CLUSTER_NAME" "$@" 8>&- 9>&- 2>&1 |
        sed -E 's/^\{"time":"[^"]*","level":"INFO",.*"msg":"([^"]*)".*$/kwokctl: \1/' >&2
}

lock_cluster() {
    mkdir -p "$KWOK_WORKDIR/locks"
    exec 8>"$KWOK_WORKDIR/locks/$CLUSTER_NAME.lock"
    flock 8  # one up/down per cluster name at a time
}

cmd_up() {
    local t config stamp
    t=$(date +%s)
    cmd_build
    lock_cluster
    export PATH=$BIN:$PATH  # kwokctl looks kubectl up on PATH before it would download one
    config=$KWOK_WORKDIR/$CLUSTER_NAME.kwokctl.yaml
    kwokctl_config >"$config.new"
    stamp=$(cat "$config.new" <(fake_nodes) | sha256sum | cut -c1-16)
    if [[ -d $CLUSTER_DIR ]] && [[ $(cat "$CLUSTER_DIR/specserving.stamp" 2>/dev/null) != "$stamp" ]]; then
        log "cluster $CLUSTER_NAME was made from another config, stage set or node list; recreating it"
        kwokctl delete cluster --kubeconfig "$KUBECONFIG_PATH"
    fi
    mv "$config.new" "$config"
    if apiserver_ready && nodes_ready; then
        log "cluster $CLUSTER_NAME is already up ($(kctl get nodes -l type=kwok --no-headers | wc -l) fake GPU nodes)"
    else
        log "starting cluster $CLUSTER_NAME (kube-apiserver v$K8S_VERSION, etcd v$ETCD_VERSION, kwok v$KWOK_VERSION)" \
            "on 127.0.0.1, workdir $CLUSTER_DIR"
        # --kubeconfig= keeps kwokctl out of ~/.kube/config; the cluster's own kubeconfig is in its workdir.
        kwokctl --config "$config" create cluster --kubeconfig= --timeout 120s ||
            die "kwokctl create cluster failed; see $CLUSTER_DIR/logs"
        echo "$stamp" >"$CLUSTER_DIR/specserving.stamp"
        wait_until 60 "kube-apiserver /readyz" apiserver_ready
        log "creating $NODES fake GPU nodes ($(elapsed "$t"))"
        fake_nodes | kctl apply -f - >/dev/null
        wait_until 60 "$NODES fake nodes to become Ready" nodes_ready
        wait_until 60 "the default ServiceAccount" default_sa_ready
        log "cluster $CLUSTER_NAME is up in $(elapsed "$t")"
    fi
    if [[ $REAL_NODE == 1 ]]; then
        log "starting the real node ($(elapsed "$t"))"
        bash "$HERE/node.sh" up "$CLUSTER_DIR" "$BIN" 8>&-
    fi
    [[ $LWS == 1 ]] && cmd_lws_up
    log "KUBECONFIG=$KUBECONFIG_PATH"
    echo "$KUBECONFIG_PATH"
}

cmd_down() {
    lock_cluster
    if [[ ! -d $CLUSTER_DIR ]]; then
        log "cluster $CLUSTER_NAME is not there ($CLUSTER_DIR); nothing to stop"
        return 0
    fi
    [[ -x $BIN/kwokctl ]] || die "$BIN/kwokctl is missing; cannot stop $CLUSTER_NAME cleanly (its pids: $CLUSTER_DIR/pids)"
    # The real node (if this cluster has one) goes first, while its pods can still be stopped.
    bash "$HERE/node.sh" down "$CLUSTER_DIR" "$BIN" 8>&-
    KUBECTL_BIN=$BIN/kubectl bash "$HERE/lws.sh" stop "$CLUSTER_DIR" "$KUBECONFIG_PATH" 8>&-
    kwokctl delete cluster --kubeconfig "$KUBECONFIG_PATH"
    rm -f "$KWOK_WORKDIR/$CLUSTER_NAME.kwokctl.yaml"
    log "cluster $CLUSTER_NAME is stopped and deleted"
}

cmd_lws_up() {
    apiserver_ready || die "cluster $CLUSTER_NAME is not up; start it first"
    KUBECTL_BIN=$BIN/kubectl bash "$HERE/lws.sh" start "$CLUSTER_DIR" "$KUBECONFIG_PATH" 8>&-
}

cmd_lws_down() {  # the manager, its webhooks and its CRDs (so every LeaderWorkerSet) go
    KUBECTL_BIN=$BIN/kubectl bash "$HERE/lws.sh" stop "$CLUSTER_DIR" "$KUBECONFIG_PATH" --uninstall 8>&-
}

cmd_env() {
    [[ -f $KUBECONFIG_PATH ]] || log "cluster $CLUSTER_NAME is not up; start it with 'make cluster-up'"
    echo "export KUBECONFIG=$KUBECONFIG_PATH"
    # shellcheck disable=SC2016
    echo "export PATH=$BIN:"'$PATH'  # our kubectl and helm first
}

case "${1:-}" in
    build) cmd_build; bash "$HERE/lws.sh" build ;;
    up) cmd_up ;;
    down) cmd_down ;;
    env) cmd_env ;;
    lws-up) cmd_lws_up ;;
    lws-down) cmd_lws_down ;;
    *) echo "usage: $0 build|up|down|env|lws-up|lws-down" >&2; exit 2 ;;
esac
