#!/usr/bin/env bash
# hack/node.sh: the real node beside kwok's fake ones, and the local registry it pulls from. hack/cluster.sh calls
# it; it is not a user entry point.
#
#   up CLUSTER_DIR BIN_DIR     a bridge (specserving0, 10.88.0.1/16), the registry on 10.88.0.1:5000, containerd,
#                              kube-proxy (iptables) and a kubelet that registers node specserving-real-0
#   down CLUSTER_DIR BIN_DIR   stop all of that and remove what it made: processes (by pid), pods and their network
#                              namespaces, mounts, the bridge, kube-proxy's iptables rules
#
# Only one real node runs on a machine (its bridge, iptables chains and registry address are the machine's), so the
# node belongs to one cluster at a time: $CACHE/node/owner names it. Everything else lives under CLUSTER_DIR/node,
# except the registry's blobs, which persist under $CACHE/registry so a warm run pushes nothing.
# Requires root and Debian's containerd, runc, containernetworking-plugins, iptables, conntrack and docker-registry.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${SPECSERVING_CACHE:-$HOME/.cache/specserving}
BRIDGE=specserving0
GATEWAY=10.88.0.1
POD_CIDR=10.88.0.0/16
FAKE_POD_CIDR=198.18.0.0/15  # kwok's fake pods (hack/cluster.sh gives each fake node a /26 of it)
REGISTRY_ADDR=$GATEWAY:5000
NODE_NAME=specserving-real-0
NODE_LABEL=specserving.io/real-node
OWNER_FILE=$CACHE/node/owner
KUBELET_PORT=10350        # kwok's fake kubelets serve on 10247/10250 (127.0.0.1); these are the real one's
KUBELET_HEALTHZ_PORT=10348
PROXY_METRICS_PORT=10349
PROXY_HEALTHZ_PORT=10356

log() { printf 'node.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

setup() {
    CLUSTER_DIR=$1 BIN=$2
    W=$CLUSTER_DIR/node
    KUBECONFIG_PATH=$CLUSTER_DIR/kubeconfig.yaml
    SOCK=$W/containerd/containerd.sock
}

kctl() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

alive() { [[ -f $1 ]] && kill -0 "$(<"$1")" 2>/dev/null; }

start() {
    # start NAME COMMAND...: run COMMAND in its own session (it outlives this script), pid and log under $W.
    local name=$1
    shift
    alive "$W/$name.pid" && return 0
    setsid "$@" </dev/null >>"$W/logs/$name.log" 2>&1 8>&- 9>&- &
    echo $! >"$W/$name.pid"
}

stop() {
    # stop PIDFILE [SECONDS]: TERM, then KILL after SECONDS (default 10).
    local pidfile=$1 seconds=${2:-10} pid i
    [[ -f $pidfile ]] || return 0
    pid=$(<"$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < seconds * 5; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
}

wait_until() {
    local seconds=$1 what=$2 deadline
    deadline=$(( $(date +%s) + seconds ))
    shift 2
    until "$@"; do
        (( $(date +%s) < deadline )) || die "timed out after ${seconds}s waiting for $what (logs: $W/logs)"
        sleep 0.5
    done
}

preflight() {
    local c missing=()
    (( EUID == 0 )) || die "the real node needs root (kubelet, containerd, iptables); run as root, or SPECSERVING_REAL_NODE=0 for fake nodes only"
    for c in containerd containerd-shim-runc-v2 runc ctr iptables conntrack ip docker-registry; do
        command -v "$c" >/dev/null || missing+=("$c")
    done
    [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] || missing+=(/usr/lib/cni/bridge)
    (( ${#missing[@]} == 0 )) || die "missing ${missing[*]}; install them with: apt-get install -y containerd runc containernetworking-plugins iptables conntrack docker-registry (as .ci/run does)"
    [[ -x $BIN/kubelet && -x $BIN/kube-proxy ]] || die "$BIN/kubelet or kube-proxy is missing; run hack/cluster.sh build"
}

claim() {
    # The real node is the machine's: refuse to take it from another cluster that is still running.
    local owner
    mkdir -p "$CACHE/node"
    owner=$(cat "$OWNER_FILE" 2>/dev/null || true)
    if [[ -n $owner && $owner != "$CLUSTER_DIR" ]]; then
        if [[ -d $owner/node ]] && alive "$owner/node/kubelet.pid"; then
            die "the real node belongs to the running cluster in $owner; stop that cluster first (SPECSERVING_CLUSTER_NAME=$(basename "$owner") make cluster-down), or start this one with SPECSERVING_REAL_NODE=0"
        fi
        log "the real node of $owner was left behind by a stopped cluster; cleaning it up"
        cmd_down "$owner" "$BIN"
    fi
    echo "$CLUSTER_DIR" >"$OWNER_FILE"
}

bridge_up() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
    fi
    # `replace` is idempotent. A test of `ip addr show | grep -q` is not reliable under pipefail: grep leaves at the first
    # match, ip's next line (it writes one per address) dies of SIGPIPE, and the pipeline fails as if no match.
    ip addr replace "$GATEWAY/16" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    # Nothing a pod sends may leave this machine: no forwarding out of the bridge, and the fake pods' IPs (which a
    # real operator probes on scale-down) go nowhere, at once, instead of out of the default route.
    iptables -w -C FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -j DROP 2>/dev/null ||
        iptables -w -I FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -j DROP
    # Unless this machine itself uses that range (its resolver or a route there would go dark too).
    local routes
    routes=$(ip route | grep -v '^blackhole' || true)
    if grep -qE '^nameserver 198\.1[89]\.' /etc/resolv.conf || grep -qE '198\.1[89]\.' <<<"$routes"; then
        die "this machine uses $FAKE_POD_CIDR (resolver or route), which the local cluster gives kwok's fake pods"
    fi
    ip route replace blackhole "$FAKE_POD_CIDR"
    # Pods reach each other through their own Services only if bridged traffic passes iptables (kube-proxy's DNAT).
    [[ $(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null) == 1 ]] ||
        die "net.bridge.bridge-nf-call-iptables is not 1 (br_netfilter not loaded?); Services would not work between pods"
}

registry_ready() { curl -fs -o /dev/null --max-time 2 "http://$REGISTRY_ADDR/v2/"; }

registry_up() {
    # Debian's docker-registry (distribution 2.8): a package, no build; blobs persist under the cache. It listens on
    # the bridge address only, which both containerd (on the host) and pods (through the bridge) reach.
    registry_ready && return 0
    mkdir -p "$CACHE/registry/data" "$CACHE/registry/logs"
    cat >"$CACHE/registry/config.yml" <<EOF
version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage:
  filesystem: {rootdirectory: $CACHE/registry/data}
  delete: {enabled: true}
http:
  addr: $REGISTRY_ADDR
  headers: {X-Content-Type-Options: [nosniff]}
EOF
    setsid docker-registry serve "$CACHE/registry/config.yml" </dev/null >>"$CACHE/registry/logs/registry.log" 2>&1 8>&- 9>&- &
    echo $! >"$CACHE/registry/registry.pid"
    W=$CACHE/registry wait_until 20 "the registry on $REGISTRY_ADDR" registry_ready
}

containerd_config() {
    local sandbox=$1
    cat <<EOF
version = 2
root = "$W/containerd/root"
state = "$W/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$W/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$sandbox"
  # A sandbox here may not lower its oom_score_adj; without this every sandbox fails with "can't get final
  # child's PID from pipe".
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$W/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."$REGISTRY_ADDR"]
    endpoint = ["http://$REGISTRY_ADDR"]
EOF
}

cni_config() {
    # hairpinMode: a pod reaches itself through its own Service. No masquerade: pods talk only to this machine.
    cat <<EOF
{
  "cniVersion": "1.0.0",
  "name": "specserving",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$W/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$GATEWAY"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

kubelet_config() {
    cat <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This kernel runs cgroup v1: kubelet refuses it unless told, and here pods run without QoS cgroups of their own.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
containerRuntimeEndpoint: unix://$SOCK
address: $GATEWAY
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
podLogsDir: $W/pods-logs
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $CLUSTER_DIR/pki/ca.crt}
authorization: {mode: Webhook}
registerNode: true
registerWithTaints:
- {key: $NODE_LABEL, value: "true", effect: NoSchedule}
serializeImagePulls: false
# A shared development machine's disk and memory are not this node's to guard: evict only when nearly exhausted.
evictionHard: {memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
maxPods: 60
resolvConf: /etc/resolv.conf
EOF
}

kube_proxy_config() {
    cat <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $KUBECONFIG_PATH}
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $POD_CIDR
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:$PROXY_HEALTHZ_PORT
metricsBindAddress: 127.0.0.1:$PROXY_METRICS_PORT
nodePortAddresses: [$GATEWAY/32]
# Leave the machine's conntrack sysctls alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false}
EOF
}

write_if_changed() {
    # write_if_changed FILE < content: replace FILE (by rename) only when the content differs, and fail then, so
    # the caller can restart what reads it. kube-proxy watches its config file and exits when it changes:
    # rewriting it on a second `up` left the running node without Service routing ("content of the proxy
    # server's configuration file was updated"), and the API server's webhook calls went out of the machine.
    local file=$1
    cat >"$file.new"
    if cmp -s "$file.new" "$file"; then rm -f "$file.new"; return 0; fi
    mv -f "$file.new" "$file"
    return 1
}

containerd_ready() { ctr --address "$SOCK" version >/dev/null 2>&1; }

node_ready() {
    local p
    for p in containerd kube-proxy kubelet; do
        alive "$W/$p.pid" || die "$p exited; its log ends: $(tail -c 1500 "$W/logs/$p.log")"
    done
    [[ $(kctl get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

cmd_up() {
    setup "$@"
    # sun_path holds 108 bytes, and containerd adds ".ttrpc" for its second socket. Only up checks: down must still
    # clean up a node whatever its path.
    (( ${#SOCK} + 7 < 108 )) || die "$SOCK is too long for a unix socket; use a shorter SPECSERVING_CACHE or SPECSERVING_CLUSTER_NAME"
    preflight
    claim
    mkdir -p "$W"/{logs,containerd,cni/net.d,cni/ipam,kubelet,pods-logs}
    bridge_up
    registry_up
    local sandbox
    sandbox=$(SPECSERVING_REGISTRY=$REGISTRY_ADDR bash "$HERE/images.sh" pause)
    # A process whose config changed (a newer node.sh) is restarted by the start below.
    containerd_config "${sandbox%@*}" | write_if_changed "$W/containerd/config.toml" || stop "$W/containerd.pid" 20
    cni_config | write_if_changed "$W/cni/net.d/10-specserving.conflist" || true
    kubelet_config | write_if_changed "$W/kubelet/config.yaml" || stop "$W/kubelet.pid" 20
    kube_proxy_config | write_if_changed "$W/kube-proxy.yaml" || stop "$W/kube-proxy.pid"
    start containerd containerd --config "$W/containerd/config.toml"
    wait_until 30 "containerd on $SOCK" containerd_ready
    start kube-proxy "$BIN/kube-proxy" --config "$W/kube-proxy.yaml"
    start kubelet "$BIN/kubelet" --config "$W/kubelet/config.yaml" --kubeconfig "$KUBECONFIG_PATH" \
        --root-dir "$W/kubelet/root" --cert-dir "$W/kubelet/pki" --hostname-override "$NODE_NAME" \
        --node-ip "$GATEWAY" --node-labels "$NODE_LABEL=true"
    wait_until 120 "node $NODE_NAME to become Ready" node_ready
    # A kubelet may not set node-role labels on itself; kubectl get nodes shows this one's role.
    kctl label node "$NODE_NAME" node-role.kubernetes.io/real= --overwrite >/dev/null
    log "real node $NODE_NAME is Ready (containerd $(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1{print $3}'), registry $REGISTRY_ADDR)"
}

kubelet_iptables_cleanup() {
    # kube-proxy --cleanup removes kube-proxy's chains; these few are the kubelet's own.
    local ipt table chain
    for ipt in iptables ip6tables; do
        command -v "$ipt" >/dev/null || continue
        "$ipt" -w -t filter -D INPUT -j KUBE-FIREWALL 2>/dev/null || true
        "$ipt" -w -t filter -D OUTPUT -j KUBE-FIREWALL 2>/dev/null || true
        for table in filter nat mangle; do
            for chain in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
                "$ipt" -w -t "$table" -F "$chain" 2>/dev/null && "$ipt" -w -t "$table" -X "$chain" 2>/dev/null || true
            done
        done
    done
}

our_netns() {
    # The network namespaces containerd made for our pods: those with an address in the pod range.
    local ns addrs
    for ns in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do
        addrs=$(ip netns exec "$ns" ip -o -4 addr show 2>/dev/null || true)
        grep -q " ${GATEWAY%.*.*}\." <<<"$addrs" && echo "$ns"
    done
    return 0
}

unmount_under() {
    # Deepest first; lazily, since a pod's mount may still be busy for a moment after its process died.
    local m
    awk -v p="$1" 'index($2, p) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
    done
}

cmd_down() {
    setup "$@"
    local ns id
    if [[ ! -d $W ]]; then
        [[ $(cat "$OWNER_FILE" 2>/dev/null) != "$CLUSTER_DIR" ]] || rm -f "$OWNER_FILE"
        return 0
    fi
    stop "$W/kubelet.pid" 20
    stop "$W/kube-proxy.pid"
    [[ ! -x $BIN/kube-proxy ]] || "$BIN/kube-proxy" --cleanup >"$W/logs/kube-proxy-cleanup.log" 2>&1 || true
    if containerd_ready; then
        # Kill every container and pod sandbox, so nothing of the node outlives it.
        for id in $(ctr --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
            ctr --address "$SOCK" -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
        done
        sleep 1
        for id in $(ctr --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
            ctr --address "$SOCK" -n k8s.io tasks delete -f "$id" >/dev/null 2>&1 || true
        done
    fi
    stop "$W/containerd.pid" 20
    # Shims of our containerd carry its socket in their command line.
    pkill -KILL -f -- "-address $SOCK" 2>/dev/null || true
    for ns in $(our_netns); do ip netns delete "$ns" 2>/dev/null || true; done
    unmount_under "$W/"
    kubelet_iptables_cleanup
    if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link delete "$BRIDGE" 2>/dev/null || true; fi
    iptables -w -D FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -j DROP 2>/dev/null || true
    ip route del blackhole "$FAKE_POD_CIDR" 2>/dev/null || true
    stop "$CACHE/registry/registry.pid"
    rm -rf "$W"
    [[ $(cat "$OWNER_FILE" 2>/dev/null) != "$CLUSTER_DIR" ]] || rm -f "$OWNER_FILE"
    log "real node stopped and removed"
}

case "${1:-}" in
    up) shift; cmd_up "$@" ;;
    down) shift; cmd_down "$@" ;;
    *) echo "usage: $0 up|down CLUSTER_DIR BIN_DIR" >&2; exit 2 ;;
esac
