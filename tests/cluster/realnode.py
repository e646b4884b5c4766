"""What the tests that run the operator's pods on the real node share: the stand-in images (hack/images.sh), the
fake GPUs and RDMA devices advertised on that node, the placement that puts pools there, and the router's own API.

Stand-ins, named: the engine image is hack/stand-in-engine (NOT SGLang: an HTTP server started by the rendered
`python3 -m sglang.launch_server`), the router image is the real router wheels on the stand-in Python base, and
the GPUs and RDMA NICs are extended resources patched onto the node's status (nothing backs them)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from .kube import Cluster, wait_for
from .registry import local_image

__all__ = ["engine_image", "fake_devices", "router_image"]  # fixtures, used by name

NODE_LABEL = "specserving.io/real-node"
PLACEMENT = {"nodeSelector": {NODE_LABEL: "true"},
             "tolerations": [{"key": NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}]}
# What the stand-in pods ask for: the rendered 8 GPUs and 8 RDMA devices of each pod, for up to 8 pods.
FAKE_DEVICES = {"nvidia.com/gpu": "64", "rdma/ib": "64"}
ENGINE_PORT = 30000
START_TIMEOUT = 600  # cold: the first pull of both stand-in images from the local registry


@pytest.fixture(scope="module")
def engine_image(cluster: Cluster, real_node: str) -> str:
    return local_image(cluster, "stand-in-engine")


@pytest.fixture(scope="module")
def router_image(cluster: Cluster, real_node: str) -> str:
    return local_image(cluster, "stand-in-router")


@pytest.fixture(scope="module")
def fake_devices(cluster: Cluster, real_node: str) -> Iterator[None]:
    """Advertise GPUs and RDMA devices on the real node as extended resources (the kubelet keeps capacity it does
    not manage), so the rendered pods, which request them, schedule there; taken away afterwards."""
    cluster.kubectl("patch", "node", real_node, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": {"capacity": FAKE_DEVICES}}))
    wait_for(lambda: all((cluster.get("node", real_node) or {}).get("status", {}).get("allocatable", {}).get(k) == v
                         for k, v in FAKE_DEVICES.items()), 60, "the real node to advertise the fake devices")
    try:
        yield
    finally:
        ops = [{"op": "remove", "path": f"/status/capacity/{k.replace('/', '~1')}"} for k in FAKE_DEVICES]
        cluster.kubectl("patch", "node", real_node, "--subresource=status", "--type=json", "-p", json.dumps(ops),
                        check=False)


def on_real_node(obj: dict[str, Any], engine_image: str, router_image: str, implementation: str, *,
                 routers: int = 1) -> dict[str, Any]:
    """A SpecServing's pools and router placed on the real node, running the stand-in engine as SGLang 0.5.17's
    decode path, on the pod network (Multus mode: no host ports, so several pods fit on one node)."""
    spec = obj["spec"]
    spec["model"] = {"path": "/models/stand-in"}
    spec["image"] = {"base": engine_image, "sglangVersion": "0.5.17", "build": {"policy": "Never"}}
    spec["transfer"]["network"] = {"mode": "Multus", "multusNetworks": ["rdma-net"]}
    pool = {**PLACEMENT, "startupTimeoutSeconds": 120, "terminationGracePeriodSeconds": 40}
    spec["prefill"].update(pool)
    spec["decode"].update(pool)
    spec["router"] = {"implementation": implementation, "image": router_image, "replicas": routers,
                      "policy": "round_robin", "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
                      **PLACEMENT}
    return obj


def http(method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


def workers(router_ip: str) -> dict[str, dict[str, Any]] | None:
    """url -> worker, from the router's own API; None while it does not answer."""
    try:
        listed = http("GET", f"http://{router_ip}:8000/workers")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return {w["url"]: w for w in listed.get("workers", [])}
