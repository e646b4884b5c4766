"""Cluster-tier helpers: a handle on a running control plane, kubectl through it, and polling against a deadline.

Nothing here starts anything; conftest.py's `cluster` fixture does, through hack/cluster.sh.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import pytest
import yaml
from harness.cluster import REPO, cluster_sh, kube_env, parse_env

__all__ = ["REPO", "Cluster", "KubectlError", "cluster_sh", "condition", "parse_env", "wait_for"]


T = TypeVar("T")


class KubectlError(subprocess.CalledProcessError):
    """A kubectl command exited non-zero; str() shows the command and what it printed."""

    def __str__(self) -> str:
        return (
            f"{' '.join(map(str, self.cmd))} exited {self.returncode}\n"
            f"stdout: {(self.stdout or '').strip()}\nstderr: {(self.stderr or '').strip()}"
        )


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
    """Call `predicate` until it returns something truthy and return that, or fail naming `what` after `timeout` s.

    Polls at short intervals against a monotonic deadline (no fixed sleeps): the wait ends as soon as the condition
    holds. The last value the predicate returned is put in the failure message.
    """
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what} (last value: {last!r})", pytrace=False)
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def condition(obj: Mapping[str, Any] | None, type_: str) -> dict[str, Any] | None:
    """The status condition of `type_` in a Kubernetes object, or None."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A running control plane: its kubeconfig, the directory holding kubectl and helm, and an env for subprocesses."""

    kubeconfig: pathlib.Path
    bin_dir: pathlib.Path
    env: dict[str, str]
    started_here: bool = False

    @classmethod
    def at(cls, kubeconfig: pathlib.Path, bin_dir: pathlib.Path, started_here: bool = False) -> Cluster:
        return cls(kubeconfig=kubeconfig, bin_dir=bin_dir, env=kube_env(kubeconfig, bin_dir), started_here=started_here)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run this cluster's kubectl with KUBECONFIG set; text in and out. Raises KubectlError if check and rc != 0."""
        cmd = [str(self.bin_dir / "kubectl"), *args]
        proc = subprocess.run(cmd, input=input, env=self.env, text=True, capture_output=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, cmd, proc.stdout, proc.stderr)
        return proc

    def apply(self, *objs: Mapping[str, Any], namespace: str | None = None, server_side: bool = False) -> None:
        """kubectl apply the given manifests (plain dicts)."""
        args = ["apply", "-f", "-"]
        if server_side:
            args.append("--server-side")
        if namespace:
            args += ["-n", namespace]
        self.kubectl(*args, input=yaml.safe_dump_all(objs))

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object as a dict, or None if it does not exist."""
        args = ["get", kind, name, "-o", "json", "--ignore-not-found"]
        if namespace:
            args += ["-n", namespace]
        out = self.kubectl(*args).stdout
        return json.loads(out) if out.strip() else None

    def list(self, kind: str, namespace: str | None = None, selector: str | None = None) -> list[dict[str, Any]]:
        """The items of `kubectl get KIND`, optionally in a namespace and by label selector."""
        args = ["get", kind, "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        if selector:
            args += ["-l", selector]
        return list(json.loads(self.kubectl(*args).stdout)["items"])

    def pool(self, name: str, role: str, namespace: str) -> dict[str, Any] | None:
        """The Deployment of one pool of SpecServing `name`: the one its router pairs (status.servingRevision),
        or the only one there is; None while there is none."""
        found = self.list("deployments", namespace, f"specserving.io/instance={name},specserving.io/role={role}")
        if len(found) > 1:
            sps = self.get("specserving", name, namespace) or {}
            serving = (sps.get("status") or {}).get("servingRevision")
            found = [d for d in found if d["metadata"]["labels"].get("specserving.io/revision") == serving]
        return found[0] if len(found) == 1 else None

    def pool_name(self, name: str, role: str, namespace: str) -> str:
        found = self.pool(name, role, namespace)
        if found is None:
            raise AssertionError(f"no single {role} Deployment of {namespace}/{name}")
        return str(found["metadata"]["name"])

    def run_as(self, user: str, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        """kubectl impersonating `user` (for example system:serviceaccount:NS:NAME)."""
        return self.kubectl(f"--as={user}", *args, check=check)


def pod_phase_and_ready(pod: Mapping[str, Any] | None) -> tuple[str | None, bool]:
    """(status.phase, Ready condition is True) of a pod."""
    if not pod:
        return None, False
    ready = condition(pod, "Ready")
    return (pod.get("status") or {}).get("phase"), bool(ready and ready.get("status") == "True")


def container(name: str = "main", resources: Mapping[str, str] | None = None,
              image: str = "registry.invalid/specserving/test:1") -> dict[str, Any]:
    """A container spec; kwok never pulls the image. `resources` become both requests and limits."""
    spec: dict[str, Any] = {"name": name, "image": image}
    if resources:
        spec["resources"] = {"requests": dict(resources), "limits": dict(resources)}
    return spec


def pod(name: str, containers: Sequence[Mapping[str, Any]], annotations: Mapping[str, str] | None = None,
        restart_policy: str = "Always") -> dict[str, Any]:
    """A bare Pod manifest."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {"containers": [dict(c) for c in containers], "restartPolicy": restart_policy},
    }
