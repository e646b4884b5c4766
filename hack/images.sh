#!/usr/bin/env bash
# hack/images.sh: build SpecServing's images here and push them to the local registry (hack/node.sh starts it).
#
#   base       the stand-in for python:3.11-slim-bookworm: Debian bookworm (debootstrap, minbase) with Debian's
#              Python 3.11 and pip in a venv at /usr/local, so `python` and `pip` resolve as in the official image
#   pause      the stand-in for registry.k8s.io/pause: hack/pause, a static Go binary, in an image of its own
#   operator   images/operator/Dockerfile from the repository root, on the stand-in base
#   buildkit   the stand-in for moby/buildkit:$BUILDKIT_VERSION-rootless: buildkitd, buildctl, rootlesskit and runc
#              built from their Go modules (the versions the official image uses), hack/buildkit/Dockerfile
#   stand-in-engine  NOT SGLang: hack/stand-in-engine, an HTTP server where an SGLang GPU process would answer
#              (health, server info with the bootstrap port, generate), run by the operator's own pods
#   stand-in-router  the real sglang-router and smg wheels (hack/stand-in-router/requirements.txt) on the base,
#              standing in for the router inside an lmsysorg/sglang image
#   sglang V   the stand-in for lmsysorg/sglang:vV: the base, torch (PyPI's CUDA build, which runs on CPU), the real
#              SGLang wheel V with its pins, and Mooncake's transfer engine, from hack/decode-path-env.sh's folders
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
# What moby/buildkit's own Dockerfile (v0.34.2) builds its rootless image from.
BUILDKIT_VERSION=v0.34.2
ROOTLESSKIT_VERSION=v3.2.0
RUNC_VERSION=v1.5.2

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
    # push IMAGE_REF [buildah push flags]: push, then print IMAGE_REF@DIGEST.
    local ref=$1 repo tag digest
    shift
    bah push --quiet --tls-verify=false "$@" "$ref" "docker://$ref" >/dev/null
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
# The recipe of one image is the functions that build it (not this whole file), so editing one image's recipe
# rebuilds that image only: the 6 GB torch layer is not rebuilt when the BuildKit recipe changes.
recipe_of() { declare -f "$@" | sha256sum | cut -c1-12; }

cmd_base() {
    local repo=specserving/stand-in/python tag rootfs ctr mnt t
    # The tag hashes this script (the recipe) and the host's extra CAs, which the image carries (see below).
    tag=3.11-slim-$DEBIAN_SUITE-$(recipe_hash <(recipe_of cmd_base) /usr/local/share/ca-certificates/*.crt 2>/dev/null ||
        recipe_of cmd_base)
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
    tag=$(recipe_hash <(recipe_of cmd_pause) "$HERE/pause/main.go" "$HERE/pause/go.mod")
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
    tag=0.1.0-$(printf '%s\n%s\n' "$(context_hash)" "${base#*@}" | sha256sum | cut -c1-12)
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

stand_in() {
    # stand_in DIR REPO: hack/DIR/Dockerfile on the stand-in base, the folder as context; tagged by its content.
    local dir=$HERE/$1 repo=$2 base tag t
    registry_up
    base=$(cmd_base)
    tag=$( (cd "$dir" && find . -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z |
        xargs -0 sha256sum; recipe_of stand_in; echo "${base#*@}") | sha256sum | cut -c1-12)
    cached "$repo" "$tag" && return 0
    need buildah
    t=$(date +%s)
    (cd "$dir" && bah build --quiet --layers --isolation chroot --network host --build-arg "PYTHON_IMAGE=$base" \
        --tls-verify=false -t "$REGISTRY/$repo:$tag" .) >"$CACHE/images/$1-build.log" 2>&1 ||
        { tail -30 "$CACHE/images/$1-build.log" >&2; die "the $1 image build failed; see $CACHE/images/$1-build.log"; }
    log "built $REGISTRY/$repo:$tag in $(( $(date +%s) - t ))s"
    push "$REGISTRY/$repo:$tag"
}

gobuild() {
    # gobuild MODULE@VERSION PACKAGE OUT [go build flags...]: build one main package of a module, in the module
    # cache's copy (go install refuses modules with replace directives, as buildkit's go.mod has).
    local modver=$1 pkg=$2 out=$3 dir
    shift 3
    # The Go caches of hack/cluster.sh, under the cache folder.
    export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" GOTOOLCHAIN=local
    dir=$(GOFLAGS=-mod=mod go mod download -json "$modver" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    [[ -d $dir ]] || die "go mod download $modver gave no folder (is the Go module proxy reachable?)"
    (cd "$dir" && GOFLAGS="-mod=mod -trimpath" go build "$@" -o "$out" "$pkg")
}

buildkit_binaries() {
    # Prints the folder holding buildkitd, buildctl, rootlesskit and runc; builds them once per version set.
    local bin t
    bin="$CACHE/buildkit/bin-$(printf '%s\n' "$BUILDKIT_VERSION" "$ROOTLESSKIT_VERSION" "$RUNC_VERSION" | sha256sum | cut -c1-12)"
    mkdir -p "$CACHE/buildkit"
    # .ci/run builds these in the background while the cluster tier may ask for the image: one builds, one waits.
    exec 8>"$CACHE/buildkit/.lock"
    flock 8
    if [[ ! -f $bin/.complete ]]; then
        need go gcc pkg-config
        [[ -f /usr/lib/x86_64-linux-gnu/libseccomp.a ]] ||
            die "runc links libseccomp statically; install it with: apt-get install -y libseccomp-dev (as .ci/run does)"
        t=$(date +%s)
        log "building buildkitd and buildctl $BUILDKIT_VERSION, rootlesskit $ROOTLESSKIT_VERSION and runc $RUNC_VERSION from their Go modules (cold: several minutes)"
        rm -rf "$bin.tmp" && mkdir -p "$bin.tmp"
        # The tags and static linking of the official image's build stages.
        CGO_ENABLED=0 gobuild "github.com/moby/buildkit@$BUILDKIT_VERSION" ./cmd/buildkitd "$bin.tmp/buildkitd" \
            -tags "osusergo netgo static_build seccomp" \
            -ldflags "-s -w -X github.com/moby/buildkit/version.Version=$BUILDKIT_VERSION"
        CGO_ENABLED=0 gobuild "github.com/moby/buildkit@$BUILDKIT_VERSION" ./cmd/buildctl "$bin.tmp/buildctl" \
            -ldflags "-s -w -X github.com/moby/buildkit/version.Version=$BUILDKIT_VERSION"
        CGO_ENABLED=0 gobuild "github.com/rootless-containers/rootlesskit/v3@$ROOTLESSKIT_VERSION" ./cmd/rootlesskit \
            "$bin.tmp/rootlesskit" -ldflags "-s -w"
        # runc's nsenter is C: cgo, with libseccomp linked in statically, as upstream's static build does.
        CGO_ENABLED=1 gobuild "github.com/opencontainers/runc@$RUNC_VERSION" . "$bin.tmp/runc" \
            -tags "seccomp netgo cgo static_build osusergo" -ldflags "-s -w -extldflags -static"
        # BuildKit's OCI worker looks for buildkit-runc before runc.
        mv "$bin.tmp/runc" "$bin.tmp/buildkit-runc"
        "$bin.tmp/buildkitd" --version >/dev/null && "$bin.tmp/buildkit-runc" --version >/dev/null
        touch "$bin.tmp/.complete"
        rm -rf "$bin" && mv "$bin.tmp" "$bin"
        log "built the BuildKit binaries in $(( $(date +%s) - t ))s"
    fi
    echo "$bin"
}

cmd_buildkit() {
    local repo=specserving/stand-in/buildkit base bin tag ctx t
    registry_up
    base=$(cmd_base)
    # The base by digest only: the same content hashes alike whatever registry address it was pushed to.
    tag=$BUILDKIT_VERSION-rootless-$(printf '%s\n%s\n%s\n' "$(recipe_hash <(recipe_of cmd_buildkit buildkit_binaries gobuild) "$HERE"/buildkit/*)" \
        "${base#*@}" "$ROOTLESSKIT_VERSION $RUNC_VERSION" | sha256sum | cut -c1-12)
    cached "$repo" "$tag" && return 0
    need buildah
    bin=$(buildkit_binaries)
    t=$(date +%s)
    ctx=$(mktemp -d)
    trap 'rm -rf "$ctx"' RETURN
    cp "$HERE"/buildkit/Dockerfile "$HERE"/buildkit/buildctl-daemonless.sh "$ctx/"
    mkdir "$ctx/bin" && cp "$bin"/buildkitd "$bin"/buildctl "$bin"/rootlesskit "$bin"/buildkit-runc "$ctx/bin/"
    log "building $REGISTRY/$repo:$tag (hack/buildkit/Dockerfile on $base)"
    bah build --quiet --layers --isolation chroot --network host --build-arg "BASE_IMAGE=$base" --tls-verify=false \
        -f "$ctx/Dockerfile" -t "$REGISTRY/$repo:$tag" "$ctx" >"$CACHE/images/buildkit-build.log" 2>&1 ||
        { tail -30 "$CACHE/images/buildkit-build.log" >&2; die "the BuildKit image build failed; see $CACHE/images/buildkit-build.log"; }
    log "built the BuildKit image in $(( $(date +%s) - t ))s"
    push "$REGISTRY/$repo:$tag"
}

MOONCAKE_VERSION=0.3.12.post1  # what images/sglang-pd/Dockerfile installs on a base without it
STAND_IN=/opt/stand-in          # where the stand-in SGLang images keep their packages

decode_path_env() {
    # decode_path_env VERSION: print "SGLANG_DIR LIBS_DIR CLOSURE_DIR TORCH_SITE_PACKAGES" for an SGLang version
    # that tests/decode_path/env/versions.txt pins (hack/decode-path-env.sh builds them; a warm run is a no-op).
    bash "$HERE/decode-path-env.sh" >&2 || die "hack/decode-path-env.sh failed"
    python3 - "$CACHE/decode-path/envs.json" "$1" <<'PY'
import json, os, sys
envs = json.load(open(sys.argv[1]))
if sys.argv[2] not in envs:
    sys.exit(f"images.sh: SGLang {sys.argv[2]} is not in tests/decode_path/env/versions.txt ({', '.join(envs)})")
env = envs[sys.argv[2]]
site = os.path.join(os.path.dirname(os.path.dirname(env["python"])), "lib", "python3.11", "site-packages")
print(*env["pythonpath"], site)
PY
}

wheel() {
    # wheel NAME VERSION: the cp311 manylinux wheel of NAME==VERSION in the cache, downloaded once.
    local w
    w=$(compgen -G "$CACHE/wheels/${1//-/_}-$2-*.whl" | head -n1 || true)
    if [[ -z $w ]]; then
        python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
            -d "$CACHE/wheels" "$1==$2" >&2 || die "cannot download $1==$2 from PyPI"
        w=$(compgen -G "$CACHE/wheels/${1//-/_}-$2-*.whl" | head -n1 || true)
        [[ -n $w ]] || die "pip downloaded $1==$2 but no cp311 wheel of it is in $CACHE/wheels"
    fi
    echo "$w"
}

torch_image() {
    # torch_image BASE SITE_PACKAGES: print the torch image's reference (the big layer every version shares).
    local base=$1 site=$2 repo=specserving/stand-in/sglang-torch tag ctr t
    tag=$(printf '%s\n%s\n' "$(recipe_hash <(recipe_of torch_image) "$REPO/tests/decode_path/env/torch.txt")" \
        "${base#*@}" | sha256sum | cut -c1-12)
    cached "$repo" "$tag" && return 0
    need buildah
    t=$(date +%s)
    log "building $REGISTRY/$repo:$tag: $site into $STAND_IN/torch (about 6 GB; cold: minutes)"
    ctr=$(bah from --quiet --tls-verify=false "$base")
    bah copy --quiet "$ctr" "$site" "$STAND_IN/torch" >/dev/null
    # The venv's own pip belongs to the build machine; the image's pip is the base's.
    bah run --isolation chroot "$ctr" -- sh -c "rm -rf $STAND_IN/torch/pip $STAND_IN/torch/pip-*.dist-info"
    bah config --label org.opencontainers.image.description="torch for the SGLang stand-in images" "$ctr"
    bah commit --quiet --rm "$ctr" "$REGISTRY/$repo:$tag" >/dev/null
    log "built the torch layer in $(( $(date +%s) - t ))s; pushing it (zstd)"
    # zstd: gzip of 6 GB takes minutes on one core, and every build pod decompresses what is pushed here.
    push "$REGISTRY/$repo:$tag" --compression-format zstd
}

cmd_sglang() {
    # The torch image, then one image per SGLang version on top of it.
    local version=$1 base sg libs closure site torch_ref repo=specserving/stand-in/sglang tag ctr t mooncake
    base=$(cmd_base)
    read -r sg libs closure site < <(decode_path_env "$version") || die "no decode-path folders for SGLang $version"
    torch_ref=$(torch_image "$base" "$site")
    mooncake=$(wheel mooncake-transfer-engine "$MOONCAKE_VERSION")
    tag=v$version-cpu-$(printf '%s\n' "$(recipe_of cmd_sglang)" "${torch_ref#*@}" "$(cat "$sg/.wheel")" \
        "$(cat "$libs/.pins")" "$(basename "$closure")" "$(basename "$mooncake")" | sha256sum | cut -c1-12)
    cached "$repo" "$tag" && return 0
    need buildah
    t=$(date +%s)
    log "building $REGISTRY/$repo:$tag: SGLang $version ($(cat "$sg/.wheel")) on $torch_ref"
    ctr=$(bah from --quiet --tls-verify=false "${torch_ref%@*}")
    bah copy --quiet "$ctr" "$closure" "$STAND_IN/closure" >/dev/null
    bah copy --quiet "$ctr" "$libs" "$STAND_IN/libs" >/dev/null
    bah copy --quiet "$ctr" "$sg" "$STAND_IN/sglang" >/dev/null
    bah copy --quiet "$ctr" "$mooncake" /tmp/ >/dev/null
    bah run --isolation chroot "$ctr" -- sh -c "python -m pip install --quiet --no-deps --no-index --no-compile \
        --target $STAND_IN/mooncake /tmp/$(basename "$mooncake") && rm /tmp/$(basename "$mooncake")"
    # The order of hack/decode-path-env.sh's wrappers: the version's own pins before the shared closure.
    bah config --env "PYTHONPATH=$STAND_IN/sglang:$STAND_IN/libs:$STAND_IN/closure:$STAND_IN/mooncake:$STAND_IN/torch" \
        --label org.opencontainers.image.description="stand-in for lmsysorg/sglang:v$version (CPU)" \
        --label io.specserving.stand-in.sglang="$version" "$ctr"
    bah commit --quiet --rm "$ctr" "$REGISTRY/$repo:$tag" >/dev/null
    log "built SGLang $version's stand-in in $(( $(date +%s) - t ))s"
    push "$REGISTRY/$repo:$tag" --compression-format zstd
}

mkdir -p "$CACHE/images"
case "${1:-}" in
    base) registry_up; cmd_base ;;
    pause) registry_up; cmd_pause ;;
    operator) cmd_operator ;;
    buildkit) cmd_buildkit ;;
    buildkit-binaries) buildkit_binaries ;;  # no registry needed: .ci/run starts it early, in the background
    stand-in-engine) stand_in stand-in-engine specserving/stand-in/engine ;;
    stand-in-router) stand_in stand-in-router specserving/stand-in/router ;;
    sglang) [[ -n ${2:-} ]] || { echo "usage: $0 sglang VERSION" >&2; exit 2; }; registry_up; cmd_sglang "$2" ;;
    *) echo "usage: $0 base|pause|operator|buildkit|buildkit-binaries|stand-in-engine|stand-in-router|sglang VERSION" >&2; exit 2 ;;
esac
