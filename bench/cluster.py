"""The control plane the bench runs on: started with hack/cluster.sh under the bench's own name, or given."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.kubeapi import Api
from harness.cluster import REPO, cluster_sh, kube_env, parse_env
from harness.prometheus import parse_prometheus

CRD = REPO / "crds" / "specserving.io_specservings.yaml"


def log(msg: str) -> None:
    print(f"bench: {msg}", flush=True)


@dataclass
class Cluster:
    kubeconfig: str
    bin_dir: Path
    env: dict[str, str]
    name: str | None = None  # set when the bench started it (and so stops it)
    api: Api = field(init=False)

    def __post_init__(self) -> None:
        self.api = Api(self.kubeconfig)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 600) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / "kubectl"), *args]
        proc = subprocess.run(cmd, input=input, env=self.env, text=True, capture_output=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
        return proc

    def kubectl_popen(self, *args: str, stderr: Any = subprocess.PIPE) -> subprocess.Popen[str]:
        return subprocess.Popen([str(self.bin_dir / "kubectl"), *args], env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=stderr)

    def ensure_service_ips(self, needed: int) -> bool:
        """Room for `needed` ClusterIP Services. kube-apiserver's default range (10.0.0.0/24, which the local
        control plane keeps) holds about 250; beyond that, add a ServiceCIDR (networking.k8s.io/v1) of 10.8.0.0/16.
        Returns whether it added one."""
        if needed <= 200:
            return False
        body = {"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
                "metadata": {"name": "specserving-bench"}, "spec": {"cidrs": ["10.8.0.0/16"]}}
        self.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(body))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            obj = self.api.get("/apis/networking.k8s.io/v1/servicecidrs/specserving-bench")
            if any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in (obj.get("status") or {}).get("conditions") or []):
                return True
            time.sleep(0.5)
        raise RuntimeError("ServiceCIDR specserving-bench (10.8.0.0/16) did not become Ready in 60 s")

    def apiserver_metrics(self) -> dict[str, float]:
        """The API server's own /metrics (apiserver_request_total and the webhook histograms only)."""
        text = self.api.text("/metrics")
        keep = ("apiserver_request_total", "apiserver_admission_webhook_admission_duration_seconds")
        return parse_prometheus("\n".join(line for line in text.splitlines() if line.startswith(keep)))

    def version(self) -> str:
        return str(self.api.get("/version").get("gitVersion", "?"))

    def install_crd(self) -> None:
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
        # Polled: right after the apply the CRD has no status conditions yet, and `kubectl wait` then fails at once.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            crd = self.api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/specservings.specserving.io")
            if any(c.get("type") == "Established" and c.get("status") == "True"
                   for c in (crd.get("status") or {}).get("conditions") or []):
                return
            time.sleep(0.5)
        raise RuntimeError("the SpecServing CRD was not Established in 60 s")

    def gpu_nodes_ready(self) -> int:
        nodes = self.api.get("/api/v1/nodes", labelSelector="type=kwok")["items"]
        return sum(1 for n in nodes if int((n["status"].get("allocatable") or {}).get("nvidia.com/gpu", "0")) >= 8
                   and any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])))

    def create_namespace(self, name: str, labels: dict[str, str]) -> None:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
        self.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(body))
        deadline = time.monotonic() + 60
        while True:
            status, _ = self.api.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")
            if status == 200:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"namespace {name}: no default ServiceAccount after 60 s")
            time.sleep(0.2)

    def delete_namespace(self, name: str, timeout: float) -> float:
        """Delete a namespace and wait until it is gone (its pods too); returns the seconds it took."""
        started = time.monotonic()
        self.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")
        while True:
            status, _ = self.api.request("GET", f"/api/v1/namespaces/{name}")
            if status == 404:
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"namespace {name} still there after {timeout:.0f} s")
            time.sleep(1)


def start(name: str, nodes: int) -> Cluster:
    """hack/cluster.sh up with SPECSERVING_CLUSTER_NAME=name and SPECSERVING_NODES=nodes (idempotent)."""
    # Fake nodes only: the bench compares the operator against raw server-side apply, with kwok playing every pod.
    env = dict(os.environ, SPECSERVING_CLUSTER_NAME=name, SPECSERVING_NODES=str(nodes), SPECSERVING_REAL_NODE="0")
    build = cluster_sh("build", env, 3600)
    if build.returncode != 0:
        raise RuntimeError(f"hack/cluster.sh build failed:\n{build.stderr[-3000:]}")
    # `up` waits 60 s for the nodes; thousands of fake nodes can take longer to turn Ready, so ask again.
    last = None
    for attempt in range(4):
        log(f"hack/cluster.sh up (cluster {name}, {nodes} fake 8-GPU nodes){' again' if attempt else ''}")
        last = cluster_sh("up", env, 1200)
        if last.returncode == 0:
            break
        time.sleep(5)
    else:
        assert last is not None
        raise RuntimeError(f"hack/cluster.sh up failed:\n{last.stderr[-3000:]}")
    kubeconfig, bin_dir = parse_env(cluster_sh("env", env, 30).stdout)
    c = Cluster(str(kubeconfig), bin_dir, kube_env(kubeconfig, bin_dir), name=name)
    return c


def attach(kubeconfig: str) -> Cluster:
    """A cluster someone else runs (--kubeconfig): the bench stops nothing."""
    env = dict(os.environ)
    out = cluster_sh("env", env, 30).stdout
    _, bin_dir = parse_env(out)
    return Cluster(kubeconfig, bin_dir, kube_env(Path(kubeconfig), bin_dir))


def stop(c: Cluster) -> None:
    if not c.name:
        return
    env = dict(os.environ, SPECSERVING_CLUSTER_NAME=c.name)
    down = cluster_sh("down", env, 300)
    if down.returncode != 0:
        log(f"hack/cluster.sh down failed: {down.stderr[-1000:]}")


def revision() -> str:
    """The commit the operator code comes from (with -dirty for uncommitted changes under operator/)."""
    git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], text=True, capture_output=True,
                         check=False)
    if git.returncode == 0:
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "operator"], text=True,
                               capture_output=True, check=False).stdout.strip()
        return git.stdout.strip() + ("-dirty" if dirty else "")
    rev = REPO / "REV"  # an exported tree (git archive) may carry its commit here
    return rev.read_text().strip() if rev.exists() else "?"


def machine() -> dict[str, Any]:
    """nproc, memory, load, kernel, Python and kopf versions."""
    import importlib.metadata

    mem = 0.0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) / 1024 / 1024
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {
        "nproc": os.cpu_count(), "memory_gib": round(mem, 1), "cpu": cpu,
        "loadavg_start": os.getloadavg()[0], "kernel": platform.release(),
        "python": platform.python_version(), "kopf": importlib.metadata.version("kopf"),
        "kubernetes_client": importlib.metadata.version("kubernetes"), "revision": revision(),
    }
