"""The rootless, daemonless BuildKit Job that builds images/sglang-pd on a base image and pushes it.

The build context travels in a ConfigMap (it works in any cluster: no git server, no object store). The
Dockerfile runs the probe, so a fix that does not supply the required builders fails the build. On success the
container writes the pushed image's digest to its termination message, where the operator reads it; on failure
Kubernetes puts the log's tail there (FallbackToLogsOnError).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
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


@dataclass(frozen=True)
class BuildSettings:
    """Operator-wide build defaults; a SpecServing's spec.image.build may override the registry and secret."""

    buildkit_image: str = DEFAULT_BUILDKIT_IMAGE
    deadline_seconds: int = DEFAULT_DEADLINE_SECONDS


def _key(path: str) -> str:
    """A ConfigMap key for a context path (keys may not contain '/')."""
    return path.replace("/", "..")


def _script(plan: ImagePlan) -> str:
    build = [
        "buildctl-daemonless.sh", "build", "--frontend", "dockerfile.v0",
        "--local", f"context={WORKSPACE}", "--local", f"dockerfile={WORKSPACE}",
        "--opt", f"build-arg:BASE_IMAGE={plan.base}",
        "--opt", f"build-arg:REQUIRE_ALGORITHMS={plan.algorithm}",
        "--output", f"type=image,name={plan.target},push=true",
        "--metadata-file", "/tmp/metadata.json",
    ]
    return (
        "set -eu\n"
        + " ".join(shlex.quote(a) for a in build) + "\n"
        # The digest is the one fact the operator needs; it goes where the pod status shows it.
        + "sed -n 's/.*\"containerimage.digest\": *\"\\(sha256:[0-9a-f]*\\)\".*/\\1/p' /tmp/metadata.json "
          "> /dev/termination-log\n"
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
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": {_key(path): text for path, text in context.files.items()},
    }
    volumes: list[dict[str, Any]] = [
        {"name": "context", "configMap": {"name": name, "items": [
            {"key": _key(path), "path": path} for path in context.files]}},
        {"name": "buildkitd", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "context", "mountPath": WORKSPACE, "readOnly": True},
        {"name": "buildkitd", "mountPath": f"{HOME}/.local/share/buildkit"},
    ]
    env = [{"name": "BUILDKITD_FLAGS", "value": "--oci-worker-no-process-sandbox"}]
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
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "16Gi"}},
    }
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
                "spec": {"restartPolicy": "Never", "containers": [container], "volumes": volumes,
                         "automountServiceAccountToken": False, "enableServiceLinks": False},
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
