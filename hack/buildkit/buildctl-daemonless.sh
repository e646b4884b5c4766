#!/bin/sh
# buildctl-daemonless.sh ARGS...: run `buildctl ARGS...` against a buildkitd started for this one command.
#
# The official rootless image ships a script of this name and contract (BuildKit's
# examples/buildctl-daemonless); this one is SpecServing's own, for the stand-in image. The daemon runs rootless
# (under rootlesskit) with $BUILDKITD_FLAGS, listens on a socket under $XDG_RUNTIME_DIR, and is stopped when
# buildctl returns. If it dies or never answers, its log goes to stderr and the script exits non-zero.
set -eu

: "${XDG_RUNTIME_DIR:?XDG_RUNTIME_DIR must be set (the image sets it)}"
addr="unix://$XDG_RUNTIME_DIR/buildkit/buildkitd.sock"
daemon_log="${TMPDIR:-/tmp}/buildkitd.log"
wait_seconds="${BUILDKITD_START_SECONDS:-60}"

# shellcheck disable=SC2086  # BUILDKITD_FLAGS is a list of flags
rootlesskit buildkitd ${BUILDKITD_FLAGS:-} --addr="$addr" >"$daemon_log" 2>&1 &
daemon=$!
trap 'kill "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true' EXIT

tries=$((wait_seconds * 10))
until buildctl --addr="$addr" debug workers >/dev/null 2>&1; do
    if ! kill -0 "$daemon" 2>/dev/null; then
        cat "$daemon_log" >&2
        echo "buildctl-daemonless.sh: buildkitd exited before it answered (its log is above)" >&2
        exit 1
    fi
    tries=$((tries - 1))
    if [ "$tries" -le 0 ]; then
        cat "$daemon_log" >&2
        echo "buildctl-daemonless.sh: buildkitd did not answer within ${wait_seconds}s (its log is above)" >&2
        exit 1
    fi
    sleep 0.1
done

buildctl --addr="$addr" "$@"
