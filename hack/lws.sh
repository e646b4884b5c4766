#!/usr/bin/env bash
# The LeaderWorkerSet controller (sigs.k8s.io/lws), built from its Go module and run as a host process against a
# local control plane, with its CRDs and admission webhooks installed for real. hack/cluster.sh calls it:
#
#   lws.sh build                          build the manager into $SPECSERVING_CACHE/lws/<version>/ and copy the
#                                         module's CRDs beside it (a no-op when they are there)
#   lws.sh start CLUSTER_DIR KUBECONFIG   certs, CRDs, the manager (pid and log in CLUSTER_DIR/lws/), then the
#                                         webhook configurations, once its webhook server answers
#   lws.sh stop CLUSTER_DIR KUBECONFIG    webhook configurations first (they fail closed: left behind without a
#                                         manager they block every LeaderWorkerSet write and every LWS pod), then the
#                                         manager; with --uninstall also the CRDs (and so every LeaderWorkerSet)
#
# The manager runs with its component config: no internal cert rotation (it wants a Service and a Secret in
# lws-system; here the API server dials 127.0.0.1), a CA and serving cert made with openssl, no leader election,
# webhook/metrics/health ports picked free at start. The webhook configurations are upstream's
# (config/webhook/manifests.yaml with its patches: the pod webhooks only see pods labelled
# leaderworkerset.sigs.k8s.io/name) with clientConfig.url in place of a Service.
set -euo pipefail

# v0.10.0 is listed by the Go proxy, but its source zip is refused (403 "This module version is not available").
LWS_VERSION=0.9.0
CACHE=${SPECSERVING_CACHE:-$HOME/.cache/specserving}
ROOT=$CACHE/lws/v$LWS_VERSION
MWC=lws-mutating-webhook-configuration
VWC=lws-validating-webhook-configuration
CRDS=(leaderworkersets.leaderworkerset.x-k8s.io disaggregatedsets.disaggregatedset.x-k8s.io)

log() { printf 'lws.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

cmd_build() {
    [[ -x $ROOT/lws-manager && -d $ROOT/crds ]] && { log "LWS v$LWS_VERSION is in $ROOT"; return 0; }
    command -v go >/dev/null || PATH=/usr/local/go/bin:$PATH
    export GOTOOLCHAIN=local CGO_ENABLED=0 GOMODCACHE=$CACHE/go/mod GOCACHE=$CACHE/go/build
    export GOFLAGS="-trimpath -modcacherw -buildvcs=false -mod=mod" GOPROXY=${GOPROXY:-https://proxy.golang.org}
    local t=$SECONDS src
    mkdir -p "$CACHE/lws"
    exec 7>"$CACHE/lws/build.lock"
    flock 7
    [[ -x $ROOT/lws-manager && -d $ROOT/crds ]] && return 0
    log "building the LWS manager v$LWS_VERSION from sigs.k8s.io/lws"
    go mod download "sigs.k8s.io/lws@v$LWS_VERSION"
    # The module cache is read-only and has no go.sum entries for the build: build in a copy.
    src=$(mktemp -d)
    cp -r "$GOMODCACHE/sigs.k8s.io/lws@v$LWS_VERSION/." "$src"
    chmod -R u+w "$src"
    rm -rf "$ROOT.partial" && mkdir -p "$ROOT.partial/crds"
    (cd "$src" && go build -p "${SPECSERVING_GO_P:-2}" -o "$ROOT.partial/lws-manager" \
        -ldflags "-X sigs.k8s.io/lws/pkg/version.GitVersion=v$LWS_VERSION" ./cmd)
    cp "$src"/config/crd/bases/*.yaml "$ROOT.partial/crds/"
    rm -rf "$src" "$ROOT"
    mv "$ROOT.partial" "$ROOT"
    log "built in $(( SECONDS - t ))s: $ROOT/lws-manager"
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

certs() {  # dir
    [[ -f $1/tls.crt && -f $1/tls.key && -f $1/ca.crt ]] && return 0
    mkdir -p "$1"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=lws-local-webhook-ca" \
        -keyout "$1/ca.key" -out "$1/ca.crt" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout "$1/tls.key" -out "$1/tls.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$1/ext.cnf"
    openssl x509 -req -in "$1/tls.csr" -CA "$1/ca.crt" -CAkey "$1/ca.key" -CAcreateserial -days 3650 \
        -extfile "$1/ext.cnf" -out "$1/tls.crt" 2>/dev/null
}

webhook() {  # name path group resources operations [pods-only]
    cat <<EOF
- name: $1
  admissionReviewVersions: [v1]
  clientConfig: {url: "$URL$2", caBundle: $CA}
  failurePolicy: Fail
  sideEffects: None
  rules: [{apiGroups: ["$3"], apiVersions: [v1], operations: [$5], resources: [$4]}]
EOF
    [[ ${6:-} == pods-only ]] && echo "  objectSelector: {matchExpressions: [{key: leaderworkerset.sigs.k8s.io/name, operator: Exists}]}"
    return 0
}

webhook_configurations() {
    cat <<EOF
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: $MWC}
webhooks:
$(webhook mleaderworkerset.kb.io /mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset leaderworkerset.x-k8s.io leaderworkersets "CREATE, UPDATE")
$(webhook mpod.kb.io /mutate--v1-pod "" pods CREATE pods-only)
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: $VWC}
webhooks:
$(webhook vleaderworkerset.kb.io /validate-leaderworkerset-x-k8s-io-v1-leaderworkerset leaderworkerset.x-k8s.io leaderworkersets "CREATE, UPDATE")
$(webhook vpod.kb.io /validate--v1-pod "" pods "CREATE, UPDATE" pods-only)
$(webhook vdisaggregatedset.kb.io /validate-disaggregatedset-x-k8s-io-v1-disaggregatedset disaggregatedset.x-k8s.io disaggregatedsets "CREATE, UPDATE")
EOF
}

established() { [[ $(kc get crd "$1" -o 'jsonpath={.status.conditions[?(@.type=="Established")].status}' 2>/dev/null) == True ]]; }

until_true() {  # seconds what command...
    local limit=$1 deadline=$(( SECONDS + $1 )) what=$2
    shift 2
    until "$@"; do (( SECONDS < deadline )) || die "waited ${limit}s for $what"; sleep 0.5; done
}

cmd_start() {
    cmd_build
    mkdir -p "$RUN"
    if running; then log "the LWS manager is running (pid $(<"$RUN/pid"))"; return 0; fi
    certs "$RUN/certs"
    local port metrics health
    port=$(free_port) metrics=$(free_port) health=$(free_port)
    cat >"$RUN/config.yaml" <<EOF
apiVersion: config.lws.x-k8s.io/v1alpha1
kind: Configuration
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
webhook: {host: 127.0.0.1, port: $port, certDir: $RUN/certs}
metrics: {bindAddress: "127.0.0.1:$metrics"}
health: {healthProbeBindAddress: "127.0.0.1:$health"}
EOF
    kc apply --server-side --force-conflicts -f "$ROOT/crds/" >/dev/null
    local crd
    for crd in "${CRDS[@]}"; do until_true 60 "CRD $crd Established" established "$crd"; done
    # Its own session, so it outlives this shell and stops by pid alone.
    KUBECONFIG=$KUBECONFIG setsid "$ROOT/lws-manager" --config "$RUN/config.yaml" </dev/null >"$RUN/manager.log" 2>&1 &
    echo $! >"$RUN/pid"
    serving() {
        running || die "the LWS manager exited; see $RUN/manager.log"
        curl -s -o /dev/null --max-time 2 --cacert "$RUN/certs/ca.crt" "https://127.0.0.1:$port/"
    }
    until_true 60 "the LWS webhook server on 127.0.0.1:$port" serving
    URL=https://127.0.0.1:$port CA=$(base64 -w0 <"$RUN/certs/ca.crt") webhook_configurations >"$RUN/webhooks.yaml"
    kc apply --server-side --force-conflicts -f "$RUN/webhooks.yaml" >/dev/null
    log "LWS v$LWS_VERSION manager running (pid $(<"$RUN/pid"), webhooks at https://127.0.0.1:$port, log $RUN/manager.log)"
}

cmd_stop() {
    if [[ -f $KUBECONFIG ]] && kc get --raw /readyz --request-timeout=5s >/dev/null 2>&1; then
        kc delete --ignore-not-found --request-timeout=20s mutatingwebhookconfiguration "$MWC" >/dev/null || true
        kc delete --ignore-not-found --request-timeout=20s validatingwebhookconfiguration "$VWC" >/dev/null || true
        if [[ ${UNINSTALL:-0} == 1 ]]; then
            kc delete --ignore-not-found --request-timeout=60s crd "${CRDS[@]}" >/dev/null || true
        fi
    fi
    if running; then
        local pid
        pid=$(<"$RUN/pid")
        kill "$pid"
        local i
        for ((i = 0; i < 40; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        log "LWS manager (pid $pid) stopped"
    fi
    rm -f "$RUN/pid"
}

running() { [[ -f $RUN/pid ]] && kill -0 "$(<"$RUN/pid")" 2>/dev/null; }

cmd=${1:-}
case $cmd in
    build) cmd_build ;;
    start | stop)
        [[ $# -ge 3 ]] || die "usage: $0 $cmd CLUSTER_DIR KUBECONFIG [--uninstall]"
        RUN=$2/lws KUBECONFIG=$3 KUBECTL=${KUBECTL_BIN:?set KUBECTL_BIN to the control plane kubectl}
        kc() { "$KUBECTL" --kubeconfig "$KUBECONFIG" "$@"; }
        [[ ${4:-} == --uninstall ]] && UNINSTALL=1
        "cmd_$cmd" ;;
    *) echo "usage: $0 build | start|stop CLUSTER_DIR KUBECONFIG [--uninstall]" >&2; exit 2 ;;
esac
