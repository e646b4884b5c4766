#!/usr/bin/env bash
# hack/images.sh: build SpecServing's images here and push them to the local registry (hack/node.sh starts it).
#
#   base       the stand-in for python:3.11-slim-bookworm: Debian bookworm (debootstrap, minbase) with Debian's
#              Python 3.11 and pip in a venv at /usr/local, so `python` and `pip` resolve as in the official image
#   pause      the stand-in for registry.k8s.io/pause: hack/pause, a static Go binary, in an image of its own
#   operator   images/operator/Dockerfile from the repository root, on the stand-in base
#
# Each prints the pushed reference (REGISTRY/REPO:TAG@sha256:...) on stdout. Tags are content hashes of what goes
# into the image (the recipe below, the Dockerfile, the build context), so a warm run finds the tag in the
# registry and builds nothing. The builder is buildah (Debian's package): daemonless, it reads the Dockerfile
# unchanged and pushes over plain HTTP to a loopback-only registry. Its storage is under the cache.
#
# Settings (environment): SPECSERVING_CACHE, SPECSERVING_REGISTRY (default 10.88.0.1:5000, the real node's bridge
# address, where hack/node.sh serves the registry). See docs/control-plane.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
CACHE=${SPECSERVING_CACHE:-$HOME/.cache/specserving}
REGISTRY=${SPECSERVING_REGISTRY:-10.88.0.1:5000}
STORE=$CACHE/images/buildah
DEBIAN_SUITE=bookworm
DEBIAN_MIRROR=${SPECSERVING_DEBIAN_MIRROR:-http://deb.debian.org/debian}

log() { printf 'images.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

need() {
    local c
    for c in "$@"; do
        command -v "$c" >/dev/null || die "$c is missing; install it with: apt-get install -y buildah debootstrap (as .ci/run does)"
    done
}

bah() { buildah --root "$STORE/root" --runroot "$STORE/run" --storage-driver overlay "$@"; }

registry_has() {
    # registry_has REPO TAG: the registry already holds that tag (a warm run's test).
    curl -fs -o /dev/null --max-time 10 \
        -H 'Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json' \
        "http://$REGISTRY/v2/$1/manifests/$2"
}

registry_digest() {
    curl -fsS --max-time 10 -o /dev/null -D - \
        -H 'Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json' \
        "http://$REGISTRY/v2/$1/manifests/$2" | tr -d '\r' | awk -F': ' 'tolower($1) == "docker-content-digest" {print $2}'
}

registry_up() {
    curl -fsS -o /dev/null --max-time 5 "http://$REGISTRY/v2/" ||
        die "the registry at $REGISTRY does not answer; start the cluster first (hack/cluster.sh up starts it with the real node)"
}

push() {
    # push IMAGE_REF: push, then print IMAGE_REF@DIGEST.
    local ref=$1 repo tag digest
    bah push --quiet --tls-verify=false "$ref" "docker://$ref" >/dev/null
    repo=${ref#"$REGISTRY"/}; tag=${repo##*:}; repo=${repo%:*}
    digest=$(registry_digest "$repo" "$tag")
    [[ -n $digest ]] || die "pushed $ref, but the registry gives no digest for it"
    echo "$ref@$digest"
}

cached() {
    # cached REPO TAG: print REGISTRY/REPO:TAG@DIGEST and succeed when the registry holds it.
    local digest
    registry_has "$1" "$2" || return 1
    digest=$(registry_digest "$1" "$2")
    log "$REGISTRY/$1:$2 is in the registry (content unchanged); not rebuilt"
    echo "$REGISTRY/$1:$2@$digest"
}

# Content only: the same files hash alike from any path or checkout.
recipe_hash() { cat "$@" | sha256sum | cut -c1-12; }

cmd_base() {
    local repo=specserving/stand-in/python tag rootfs ctr mnt t
    # The tag hashes this script (the recipe) and the host's extra CAs, which the image carries (see below).
    tag=3.11-slim-$DEBIAN_SUITE-$(recipe_hash "${BASH_SOURCE[0]}" /usr/local/share/ca-certificates/*.crt 2>/dev/null || recipe_hash "${BASH_SOURCE[0]}")
    cached "$repo" "$tag" && return 0
    need buildah debootstrap
    t=$(date +%s)
    rootfs=$(mktemp -d "$CACHE/images/rootfs.XXXXXX")
    trap 'rm -rf "$rootfs"' RETURN
    log "debootstrap $DEBIAN_SUITE (minbase, python3, python3-venv) from $DEBIAN_MIRROR (about 1 min)"
    local attempt
    for attempt in 1 2 3; do
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            "$DEBIAN_SUITE" "$rootfs" "$DEBIAN_MIRROR" >"$CACHE/images/debootstrap.log" 2>&1 && break
        # A mirror that fails to answer once (seen here: "Failed getting release file") usually answers next time.
        (( attempt < 3 )) || die "debootstrap failed 3 times; see $CACHE/images/debootstrap.log"
        log "debootstrap failed ($(grep '^E:' "$CACHE/images/debootstrap.log" | tail -1)); retrying"
        rm -rf "$rootfs" && mkdir -p "$rootfs"
        sleep 5
    done
    # This machine reaches PyPI through a TLS-inspecting proxy whose CAs are in the host's trust store; pip in the
    # image build trusts them only if the image does. The official image needs neither step.
    if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
        chroot "$rootfs" update-ca-certificates >/dev/null
        printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$rootfs/etc/pip.conf"
    fi
    # python:3.11-slim has python, python3 and pip in /usr/local/bin; a venv over Debian's Python puts them there.
    chroot "$rootfs" python3 -m venv /usr/local
    chroot "$rootfs" /usr/local/bin/python -m pip --version >/dev/null
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* \
        "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
    ctr=$(bah from --quiet scratch)
    mnt=$(bah mount "$ctr")
    tar -C "$rootfs" -c . | tar -C "$mnt" -x
    bah umount "$ctr" >/dev/null
    bah config --env PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
        --cmd python3 --label org.opencontainers.image.description="stand-in for python:3.11-slim-bookworm" "$ctr"
    bah commit --quiet --rm "$ctr" "$REGISTRY/$repo:$tag" >/dev/null
    log "built the base in $(( $(date +%s) - t ))s"
    push "$REGISTRY/$repo:$tag"
}

cmd_pause() {
    local repo=specserving/stand-in/pause tag out ctr
    tag=$(recipe_hash "${BASH_SOURCE[0]}" "$HERE/pause/main.go" "$HERE/pause/go.mod")
    cached "$repo" "$tag" && return 0
    need buildah go
    out=$(mktemp -d)
    trap 'rm -rf "$out"' RETURN
    (cd "$HERE/pause" && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath GOCACHE="$CACHE/go/build" \
        go build -ldflags "-s -w" -o "$out/pause" .)
    ctr=$(bah from --quiet scratch)
    bah copy --quiet "$ctr" "$out/pause" /pause >/dev/null
    bah config --entrypoint '["/pause"]' --user 65535:65535 \
        --label org.opencontainers.image.description="stand-in for registry.k8s.io/pause" "$ctr"
    bah commit --quiet --rm "$ctr" "$REGISTRY/$repo:$tag" >/dev/null
    push "$REGISTRY/$repo:$tag"
}

context_hash() {
    # What the operator image is made of: the Dockerfile, its ignore file and the paths that file lets in.
    (cd "$REPO" && find images/operator pyproject.toml README.md operator images/sglang-pd -type f \
        ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' ! -path '*/build/*' ! -path '*/dist/*' \
        -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16
}

cmd_operator() {
    local repo=specserving/operator base tag t
    registry_up
    base=$(cmd_base)
    tag=0.1.0-$(printf '%s\n%s\n' "$(context_hash)" "$base" | sha256sum | cut -c1-12)
    cached "$repo" "$tag" && return 0
    need buildah
    t=$(date +%s)
    log "building $REGISTRY/$repo:$tag from images/operator/Dockerfile on $base (buildah, layers cached)"
    # --isolation chroot: RUN steps need no user namespaces or CNI; the build's pip reaches PyPI as the host does.
    (cd "$REPO" && bah build --quiet --layers --isolation chroot --network host \
        --ignorefile images/operator/Dockerfile.dockerignore \
        --build-arg "PYTHON_IMAGE=$base" --tls-verify=false \
        -f images/operator/Dockerfile -t "$REGISTRY/$repo:$tag" .) >"$CACHE/images/operator-build.log" 2>&1 ||
        { tail -30 "$CACHE/images/operator-build.log" >&2; die "the operator image build failed; see $CACHE/images/operator-build.log"; }
    log "built the operator image in $(( $(date +%s) - t ))s"
    push "$REGISTRY/$repo:$tag"
}

mkdir -p "$CACHE/images"
case "${1:-}" in
    base) registry_up; cmd_base ;;
    pause) registry_up; cmd_pause ;;
    operator) cmd_operator ;;
    *) echo "usage: $0 base|pause|operator" >&2; exit 2 ;;
esac
