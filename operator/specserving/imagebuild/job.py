"""The rootless, daemonless BuildKit Job that builds images/sglang-pd on a base image and pushes it.

The build context travels in a ConfigMap (it works in any cluster: no git server, no object store). The
Dockerfile runs the probe, so a fix that does not supply the required builders fails the build. On success the
container writes the pushed image's digest to its termination message, where the operator reads it; on failure
Kubernetes puts the log's tail there (FallbackToLogsOnError).
"""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specserving.imagebuild.context import BuildContext
from specserving.imagebuild.planning import BUILD, ImagePlan

BUILD_LABEL = "specserving.io/build"
# The newest BuildKit release on the Go module proxy when this was written; admins should pin a digest.
DEFAULT_BUILDKIT_IMAGE = "moby/buildkit:v0.34.2-rootless"
WORKSPACE = "/workspace"
HOME = "/home/user"
# Long enough to pull a multi-gigabyte CUDA base image and push the result.
DEFAULT_DEADLINE_SECONDS = 3 * 3600
FINISHED_TTL_SECONDS = 7 * 24 * 3600


DEFAULT_RESOURCES: dict[str, Any] = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "16Gi"}}
# Where the build pod finds buildkitd's configuration (the insecure registries), from the context ConfigMap.
BUILDKITD_CONFIG_KEY = "buildkitd.toml"
BUILDKITD_CONFIG_DIR = "/etc/specserving/buildkitd"
# The build context as a plain folder: a ConfigMap volume is a tree of symlinks (..data -> ..<timestamp>/), which
# BuildKit's local source would send as symlinks rather than the files they point to.
CONTEXT_COPY = f"{HOME}/.local/tmp/context"


@dataclass(frozen=True)
class BuildSettings:
    """Operator-wide build defaults; a SpecServing's spec.image.build may override the registry and secret."""

    buildkit_image: str = DEFAULT_BUILDKIT_IMAGE
    deadline_seconds: int = DEFAULT_DEADLINE_SECONDS
    # Registries (host[:port]) BuildKit reaches over plain HTTP, to pull the base and to push.
    insecure_registries: tuple[str, ...] = ()
    # Where build pods may run (CPU nodes that allow rootless BuildKit, docs/image-build.md) and what they request.
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, str], ...] = ()
    resources: Mapping[str, Any] = field(default_factory=lambda: copy.deepcopy(DEFAULT_RESOURCES))


def buildkitd_config(insecure_registries: tuple[str, ...]) -> str:
    """buildkitd.toml: the registries BuildKit talks plain HTTP to (to pull the base image and to push)."""
    lines = ["# Written by the SpecServing operator (--build-insecure-registry)."]
    for host in insecure_registries:
        lines += [f"[registry.{json.dumps(host)}]", "  http = true", "  insecure = true"]
    return "\n".join(lines) + "\n"


def _key(path: str) -> str:
    """A ConfigMap key for a context path (keys may not contain '/')."""
    return path.replace("/", "..")


def _script(plan: ImagePlan) -> str:
    tmp = f"{HOME}/.local/tmp"
    build = [
        "buildctl-daemonless.sh", "build", "--progress", "plain", "--frontend", "dockerfile.v0",
        "--local", f"context={CONTEXT_COPY}", "--local", f"dockerfile={CONTEXT_COPY}",
        # The base by digest when the operator resolved it: the image built is the one the build key names.
        "--opt", f"build-arg:BASE_IMAGE={plan.base_ref}",
        "--opt", f"build-arg:REQUIRE_ALGORITHMS={plan.algorithm}",
        "--output", f"type=image,name={plan.target},push=true",
        "--metadata-file", f"{tmp}/metadata.json",
    ]
    return (
        "set -u\n"
        f"mkdir -p {CONTEXT_COPY}\n"
        # -L: copy what the ConfigMap's symlinks point to; then drop the volume's own ..data bookkeeping.
        f"cp -RL {WORKSPACE}/. {CONTEXT_COPY}/ && rm -rf {CONTEXT_COPY}/..?* || exit 1\n"
        # The log streams (kubectl logs -f) and is kept; sh has no pipefail, so the exit status goes by file.
        f"{{ {' '.join(shlex.quote(a) for a in build)} 2>&1; echo $? > {tmp}/status; }} | tee {tmp}/build.log\n"
        f"status=$(cat {tmp}/status)\n"
        'if [ "$status" != 0 ]; then\n'
        # The termination message (the operator shows its last 2,000 bytes): the log's end, then the probe's
        # verdict, which BuildKit's closing error block would otherwise push out of that window.
        f"  {{ tail -c 1400 {tmp}/build.log; grep -h 'specserving_pdfix.probe:' {tmp}/build.log | tail -n 2 "
        "| sed 's/^#[0-9]* [0-9.]* //'; } > /dev/termination-log\n"
        '  exit "$status"\n'
        "fi\n"
        # The digest is the one fact the operator needs; it goes where the pod status shows it.
        "sed -n 's/.*\"containerimage.digest\": *\"\\(sha256:[0-9a-f]*\\)\".*/\\1/p' "
        f"{tmp}/metadata.json > /dev/termination-log\n"
    )


def build_objects(plan: ImagePlan, context: BuildContext, *, namespace: str, push_secret: str | None,
                  settings: BuildSettings = BuildSettings()) -> list[dict[str, Any]]:
    """The context ConfigMap and the build Job for `plan` (which must be a BUILD plan with a registry)."""
    if plan.decision != BUILD or not plan.build_name or not plan.target:
        raise ValueError("build_objects needs a Build plan with a registry")
    labels = {"app.kubernetes.io/name": "sglang-pd-build", "app.kubernetes.io/managed-by": "specserving-operator",
              BUILD_LABEL: plan.build_key or ""}
    annotations = {"specserving.io/base-image": plan.base, "specserving.io/target-image": plan.target,
                   "specserving.io/require-algorithms": plan.algorithm}
    name = plan.build_name
    data = {_key(path): text for path, text in context.files.items()}
    volumes: list[dict[str, Any]] = [
        {"name": "context", "configMap": {"name": name, "items": [
            {"key": _key(path), "path": path} for path in context.files]}},
        {"name": "buildkitd", "emptyDir": {}},
        # TMPDIR: the context copy and the metadata file; the image's own folder would be the container's layer.
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "context", "mountPath": WORKSPACE, "readOnly": True},
        {"name": "buildkitd", "mountPath": f"{HOME}/.local/share/buildkit"},
        {"name": "tmp", "mountPath": f"{HOME}/.local/tmp"},
    ]
    flags = "--oci-worker-no-process-sandbox"
    if settings.insecure_registries:
        data[BUILDKITD_CONFIG_KEY] = buildkitd_config(settings.insecure_registries)
        volumes.append({"name": "buildkitd-config", "configMap": {"name": name, "items": [
            {"key": BUILDKITD_CONFIG_KEY, "path": BUILDKITD_CONFIG_KEY}]}})
        mounts.append({"name": "buildkitd-config", "mountPath": BUILDKITD_CONFIG_DIR, "readOnly": True})
        flags += f" --config={BUILDKITD_CONFIG_DIR}/{BUILDKITD_CONFIG_KEY}"
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": data,
    }
    env = [{"name": "BUILDKITD_FLAGS", "value": flags}]
    if push_secret:
        volumes.append({"name": "push-secret", "secret": {"secretName": push_secret, "items": [
            {"key": ".dockerconfigjson", "path": "config.json"}]}})
        mounts.append({"name": "push-secret", "mountPath": f"{HOME}/.docker", "readOnly": True})
        env.append({"name": "DOCKER_CONFIG", "value": f"{HOME}/.docker"})
    container = {
        "name": "buildkit",
        "image": settings.buildkit_image,
        "command": ["/bin/sh", "-c", _script(plan)],
        "env": env,
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # Rootless BuildKit: an unprivileged user; it needs seccomp and AppArmor unconfined to create its user
        # namespace (see docs/image-build.md), and nothing else.
        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True, "privileged": False,
                            "seccompProfile": {"type": "Unconfined"}, "appArmorProfile": {"type": "Unconfined"}},
        "resources": copy.deepcopy(dict(settings.resources)),
    }
    pod_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container], "volumes": volumes,
                                "automountServiceAccountToken": False, "enableServiceLinks": False}
    if settings.node_selector:
        pod_spec["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in settings.tolerations]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
        "spec": {
            # A fix that fails its probe fails every time: one attempt, and the failure goes to status.
            "backoffLimit": 0,
            "activeDeadlineSeconds": settings.deadline_seconds,
            "ttlSecondsAfterFinished": FINISHED_TTL_SECONDS,
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }
    unshared: list[dict[str, Any]] = json.loads(json.dumps([config_map, job]))  # callers mutate and serialise these
    return unshared


def owned_by(config_map: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    """The context ConfigMap with an ownerReference to its build Job (as the API server returned it, with a uid),
    so the garbage collector removes it when the Job's TTL removes the Job. Not a controller reference, and no
    blockOwnerDeletion: nothing waits on it."""
    meta = job["metadata"]
    ref = {"apiVersion": job.get("apiVersion", "batch/v1"), "kind": job.get("kind", "Job"), "name": meta["name"],
           "uid": meta["uid"]}
    out: dict[str, Any] = json.loads(json.dumps(config_map))
    out["metadata"]["ownerReferences"] = [ref]
    return out


def digest_from_message(message: str | None) -> str | None:
    """The image digest a successful build wrote to its termination message."""
    text = (message or "").strip()
    return text if text.startswith("sha256:") and len(text) == 71 else None
