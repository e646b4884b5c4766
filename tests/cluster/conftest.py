"""Fixtures for the cluster tier: one real control plane per session, one namespace per test.

`cluster` (session scope, never autouse) uses the cluster named by SPECSERVING_TEST_KUBECONFIG when that is set;
otherwise it builds the binaries if needed and starts its own kwokctl cluster through `hack/cluster.sh up`, named
SPECSERVING_TEST_CLUSTER_NAME or, by default, specserving-test-<pid> (so neither a `make cluster-up` cluster nor a
concurrent test session is touched), and stops it at the end of the session, only if this session started it.
Default-named clusters whose session process is gone (a killed run) are stopped first. If the binaries cannot be
built or the cluster cannot start, the fixture fails with the reason; it never skips.

The cluster has kwok's fake GPU nodes and one real node (hack/node.sh: containerd, kubelet, kube-proxy, and the
local registry). `real_node` checks that node is Ready; `operator_image` builds the operator image and pushes it to
that registry (hack/images.sh, cached by content), for the tests that run the operator as the chart's pods.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import uuid
from collections.abc import Iterator

import pytest
from harness.cluster import stop_orphans

from .kube import REPO, Cluster, cluster_sh, parse_env, wait_for

__all__ = ["Cluster", "cluster", "namespace", "operator_image", "real_node", "wait_for"]

REAL_NODE = "specserving-real-0"  # hack/node.sh's node
IMAGE_TIMEOUT = 1800  # cold: debootstrap, pip install of the operator's dependencies; warm: a registry lookup

DEFAULT_PREFIX = "specserving-test-"
BUILD_TIMEOUT = 3600  # a cold build is ~20 min on 2 cores; warm it is a no-op
UP_TIMEOUT = 300


def _tail(proc_output: str, lines: int = 40) -> str:
    return "\n".join(proc_output.strip().splitlines()[-lines:])


def _ready(c: Cluster) -> bool:
    return c.kubectl("get", "--raw", "/readyz", "--request-timeout=5s", check=False).returncode == 0


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The control plane: kubeconfig, bin_dir, kubectl(*args, input=None, check=True) and env."""
    env = dict(os.environ)
    external = env.get("SPECSERVING_TEST_KUBECONFIG")
    if not external:
        env["SPECSERVING_CLUSTER_NAME"] = env.get("SPECSERVING_TEST_CLUSTER_NAME") or f"{DEFAULT_PREFIX}{os.getpid()}"

    build = cluster_sh("build", env, BUILD_TIMEOUT)
    if build.returncode != 0:
        pytest.fail(f"hack/cluster.sh build failed (exit {build.returncode}):\n{_tail(build.stderr + build.stdout)}")
    kubeconfig, bin_dir = parse_env(cluster_sh("env", env, 30).stdout)

    if external:
        c = Cluster.at(pathlib.Path(external), bin_dir)
        if not _ready(c):
            pytest.fail(f"SPECSERVING_TEST_KUBECONFIG={external}: the API server is not ready (kubectl get --raw /readyz)")
        yield c
        return

    stop_orphans(DEFAULT_PREFIX, env, 120)
    already_up = kubeconfig.exists() and _ready(Cluster.at(kubeconfig, bin_dir))
    up = cluster_sh("up", env, UP_TIMEOUT)
    if up.returncode != 0:
        pytest.fail(f"hack/cluster.sh up failed (exit {up.returncode}):\n{_tail(up.stderr + up.stdout)}")
    c = Cluster.at(kubeconfig, bin_dir, started_here=not already_up)
    try:
        yield c
    finally:
        if c.started_here:
            down = cluster_sh("down", env, 120)
            if down.returncode != 0:
                pytest.fail(f"hack/cluster.sh down failed (exit {down.returncode}):\n{_tail(down.stderr)}")


@pytest.fixture(scope="session")
def real_node(cluster: Cluster) -> str:
    """The real node's name, once it is Ready; fails (never skips) when the cluster has none."""
    node = cluster.get("node", REAL_NODE)
    if node is None:
        pytest.fail(f"the cluster has no real node {REAL_NODE}: hack/cluster.sh up starts one unless "
                    "SPECSERVING_REAL_NODE=0 (root, and Debian's containerd, runc and CNI plugins, are needed)")
    ready = [c for c in node["status"].get("conditions", []) if c["type"] == "Ready"]
    if not ready or ready[0]["status"] != "True":
        pytest.fail(f"the real node {REAL_NODE} is not Ready: {ready}")
    return REAL_NODE


@pytest.fixture(scope="session")
def operator_image(cluster: Cluster, real_node: str) -> str:
    """REGISTRY/specserving/operator:TAG@DIGEST, built from images/operator/Dockerfile and pushed (hack/images.sh)."""
    proc = subprocess.run(["bash", str(REPO / "hack" / "images.sh"), "operator"], env=cluster.env, text=True,
                          capture_output=True, timeout=IMAGE_TIMEOUT, check=False)
    if proc.returncode != 0:
        pytest.fail(f"hack/images.sh operator failed (exit {proc.returncode}):\n{_tail(proc.stderr)}")
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards without waiting for it to go."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    name = f"{slug}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "specserving.io/test=true")
    try:
        # Pods are rejected until the service-account controller has made the namespace's default ServiceAccount.
        wait_for(
            lambda: cluster.get("serviceaccount", "default", name),
            timeout=30,
            what=f"the default ServiceAccount in namespace {name}",
        )
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)
