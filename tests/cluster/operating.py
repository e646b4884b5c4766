"""Running `specserving run` in tests, and reading what it and the cluster report.

Shared by the operator, admission and reliability tests: the operator is a subprocess, one per test namespace.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.operator import SPECSERVING, OperatorExited, OperatorProcess
from harness.process import free_port
from harness.prometheus import parse_prometheus, total

from .kube import Cluster, condition, wait_for

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "specserving.io_specservings.yaml"
SEED = REPO / "examples" / "dspark-pd-tp8dp8.yaml"
NAME = "dsv4-flash"
CHILD_KINDS = "deployments,services,serviceaccounts,roles,rolebindings,poddisruptionbudgets"
CRASH = "AttributeError: 'NoneType' object has no attribute 'prepare_for_decode'"
# parse_prometheus and total come from harness/ and are re-exported here; the tests import the rest by name.
__all__ = ["Operator", "parse_prometheus", "total"]
READY_TIMEOUT = 90
# The seed example's model folder, allowed as the chart's hack/real-node-values.yaml allows it (policy.py).
HOST_PATH_POLICY = ("--allow-host-path", "/data2")
RESYNC_SECONDS = 2


class Operator(OperatorProcess):
    """`specserving run --namespace NS` in the background, with its liveness and metrics endpoints."""

    def __init__(self, cluster: Cluster, namespace: str, log: Path, extra: Sequence[str] = (),
                 kubeconfig: Path | None = None, launched: Callable[[int], object] | None = None,
                 wait: bool = True) -> None:
        """`kubeconfig`: another identity than the cluster's admin (then the only one the process can reach).
        `launched` is called with the process id as soon as it exists; `wait=False` returns without waiting for
        the liveness endpoint (for a process that may be killed during its start)."""
        self.health, self.metrics_port = free_port(), free_port()
        config = kubeconfig or cluster.kubeconfig
        self.launch([SPECSERVING, "run", "--namespace", namespace, "--kubeconfig", str(config),
                     "--liveness", f"http://127.0.0.1:{self.health}/healthz", "--metrics-port",
                     str(self.metrics_port), "--metrics-address", "127.0.0.1", "--resync-seconds",
                     str(RESYNC_SECONDS), "--no-load-probe", "--serving-checks", "Off",
                     *HOST_PATH_POLICY, *extra], {**cluster.env, "KUBECONFIG": str(config)}, log)
        if launched:
            launched(self.proc.pid)
        if wait:
            wait_for(self._healthy, timeout=30, what=f"the operator's liveness endpoint (log: {log})")

    def _healthy(self) -> bool:
        try:
            return super()._healthy()
        except OperatorExited as exc:
            pytest.fail(str(exc))


@pytest.fixture(scope="module")
def crd(cluster: Cluster) -> None:
    """The SpecServing CRD, applied and Established. Polled rather than `kubectl wait --for=condition=Established`:
    right after the apply a fresh CRD has no status conditions yet, and kubectl 1.36 then fails at once ("accessor
    error: <nil> is of the type <nil>") instead of waiting."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_for(lambda: (condition(cluster.get("crd", "specservings.specserving.io"), "Established") or {}).get(
        "status") == "True", 60, "the SpecServing CRD Established")


@pytest.fixture
def operator(cluster: Cluster, namespace: str, crd: None, tmp_path: Path) -> Iterator[Operator]:
    op = Operator(cluster, namespace, tmp_path / "operator.log")
    try:
        yield op
    finally:
        op.stop()
        # pytest shows captured teardown output only when the test fails: the log tail explains the failure.
        sys.stderr.write(f"\n--- operator log ({op.log}) ---\n{op.log.read_text()[-6000:]}\n")


def example(path: Path, **changes: Any) -> dict[str, Any]:
    """An example SpecServing with `changes` ({"spec.decode.replicas": 2}: dotted path -> value) set."""
    obj: dict[str, Any] = yaml.safe_load(path.read_text())
    for dotted, value in changes.items():
        node = obj
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return obj


def seed(**changes: Any) -> dict[str, Any]:
    return example(SEED, **changes)


def sps(cluster: Cluster, ns: str, name: str = NAME) -> dict[str, Any]:
    obj = cluster.get("specservings", name, ns)
    assert obj is not None, f"SpecServing {ns}/{name} is gone"
    return obj


def cond_is(cluster: Cluster, ns: str, type_: str, status: str, reason: str | None = None,
            name: str = NAME) -> dict[str, Any] | None:
    obj = sps(cluster, ns, name)
    c = condition(obj, type_)
    if c and c["status"] == status and (reason is None or c["reason"] == reason) \
            and c.get("observedGeneration") == obj["metadata"]["generation"]:
        return obj
    return None


def ready(cluster: Cluster, ns: str, name: str = NAME) -> dict[str, Any] | None:
    return cond_is(cluster, ns, "Ready", "True", name=name)


def children(cluster: Cluster, ns: str, name: str = NAME) -> list[dict[str, Any]]:
    return cluster.list(CHILD_KINDS, ns, f"specserving.io/instance={name}")


def pods(cluster: Cluster, ns: str, role: str, name: str = NAME) -> list[dict[str, Any]]:
    return [p for p in cluster.list("pods", ns, f"specserving.io/instance={name},specserving.io/role={role}")
            if not p["metadata"].get("deletionTimestamp")]


def events(cluster: Cluster, ns: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.list("events", ns) if e.get("reason") == reason
            and e["involvedObject"].get("kind") == "SpecServing"]


def deployment(cluster: Cluster, ns: str, role: str, name: str = NAME) -> dict[str, Any]:
    """The router Deployment, or the pool Deployment the router pairs (its PD-contract revision)."""
    obj = cluster.get("deployment", f"{name}-{role}", ns) if role == "router" else cluster.pool(name, role, ns)
    assert obj is not None, f"no {role} Deployment of {ns}/{name}"
    return obj


def apply_ready(cluster: Cluster, ns: str, obj: dict[str, Any] | None = None) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    cluster.apply(obj or seed(), namespace=ns)
    found = wait_for(lambda: ready(cluster, ns), READY_TIMEOUT, "the SpecServing to become Ready")
    return found, time.monotonic() - started

