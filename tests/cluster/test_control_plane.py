"""The local control plane is real: the SpecServing CRD is served with its CEL rules, pods are scheduled by their
GPU and RDMA requests onto fake nodes, RBAC is enforced, SpecServing's kwok stages fake crash loops and exits, and
the real node (a kubelet with containerd, not kwok) runs containers only for pods that tolerate its taint."""

from __future__ import annotations

import copy
import ipaddress
import json
import pathlib
import subprocess
from typing import Any

import pytest
import yaml

from .kube import REPO, Cluster, condition, container, pod, pod_phase_and_ready, wait_for

pytestmark = pytest.mark.cluster

CRD_FILE = REPO / "crds" / "specserving.io_specservings.yaml"
CRD_NAME = "specservings.specserving.io"
# A valid SpecServing to break one field at a time (the unit tier keeps the examples valid).
EXAMPLE = REPO / "examples" / "eagle3-pd-tp8.yaml"
GPU_NODE_LABELS = {"type": "kwok", "nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.count": "8"}
GPU_AND_RDMA = {"nvidia.com/gpu": "8", "rdma/ib": "8", "cpu": "4", "memory": "16Gi"}


def _load(path: pathlib.Path) -> dict[str, Any]:
    if not path.exists():
        pytest.fail(f"{path.relative_to(REPO)} is missing")
    return dict(yaml.safe_load(path.read_text()))


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def crd(cluster: Cluster) -> dict[str, Any]:
    """The SpecServing CRD from crds/, applied server-side and Established. Left installed: it is cluster-wide."""
    manifest = _load(CRD_FILE)
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=specserving-tests",
                    "-f", str(CRD_FILE))

    def established() -> bool:
        cond = condition(cluster.get("crd", CRD_NAME), "Established")
        return bool(cond and cond["status"] == "True")

    wait_for(established, timeout=30, what=f"CRD {CRD_NAME} to be Established")
    return manifest


def _spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return dict(version["schema"]["openAPIV3Schema"]["properties"]["spec"])


def test_crd_is_served_and_explained(cluster: Cluster, crd: dict[str, Any]) -> None:
    served = cluster.get("crd", CRD_NAME)
    cond = condition(served, "NamesAccepted")
    assert cond and cond["status"] == "True", cond
    resources = cluster.kubectl("api-resources", "--api-group=specserving.io", "-o", "name").stdout.split()
    assert CRD_NAME in resources

    fields = _spec_schema(crd)["properties"]

    def explained() -> str | None:
        # The OpenAPI v3 document for a new CRD is published a moment after it is Established.
        proc = cluster.kubectl("explain", "specservings.spec", check=False)
        return proc.stdout if proc.returncode == 0 and "FIELDS:" in proc.stdout else None

    out = _words(wait_for(explained, timeout=60, what="kubectl explain specservings.spec to list the fields"))
    assert "KIND: SpecServing" in out and "VERSION: v1alpha1" in out, out
    for name, schema in fields.items():
        assert f"{name} <" in out, f"field {name} missing from kubectl explain:\n{out}"
        opening = " ".join(_words(schema["description"]).split()[:6])
        assert opening in out, f"description of {name} ({opening!r}) missing from kubectl explain:\n{out}"


def _cel_message(crd: dict[str, Any], section: str, needle: str) -> str:
    rules = _spec_schema(crd)["properties"][section].get("x-kubernetes-validations", [])
    messages = [r["message"] for r in rules if needle in r["rule"]]
    assert len(messages) == 1, f"expected one CEL rule on spec.{section} mentioning {needle}: {rules}"
    return _words(messages[0])


def _specserving(namespace: str, name: str) -> dict[str, Any]:
    obj = copy.deepcopy(_load(EXAMPLE))
    obj["metadata"] = {"name": name, "namespace": namespace}
    return obj


def test_valid_specserving_is_accepted(cluster: Cluster, crd: dict[str, Any], namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(_specserving(namespace, "good")))
    stored = cluster.get("specserving", "good", namespace)
    assert stored is not None
    # Schema defaults are applied by the API server.
    assert stored["spec"]["transfer"]["network"]["mode"] in {"HostNetwork", "Multus"}


def _reject(cluster: Cluster, obj: dict[str, Any]) -> str:
    proc = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj), check=False)
    assert proc.returncode != 0, f"kubectl apply accepted an invalid SpecServing:\n{proc.stdout}"
    name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
    assert cluster.get("specserving", name, namespace) is None
    return _words(proc.stderr)


def test_schema_rejects_negative_decode_replicas(cluster: Cluster, crd: dict[str, Any], namespace: str) -> None:
    obj = _specserving(namespace, "negative-decode")
    obj["spec"]["decode"]["replicas"] = -1
    err = _reject(cluster, obj)
    assert "spec.decode.replicas: Invalid value: -1" in err, err
    assert "should be greater than or equal to 0" in err, err


def test_cel_rejects_ib_devices_with_mooncake_tcp(cluster: Cluster, crd: dict[str, Any], namespace: str) -> None:
    obj = _specserving(namespace, "tcp-with-ib")
    transfer = obj["spec"]["transfer"]
    transfer["backend"] = "mooncake_tcp"
    transfer["ibDevices"] = ["mlx5_0", "mlx5_1"]
    transfer.pop("rdma", None)
    err = _reject(cluster, obj)
    message = _cel_message(crd, "transfer", "ibDevices")
    assert "ibDevices" in message
    assert "spec.transfer.ibDevices" in err and message in err, err


def _node(cluster: Cluster, name: str) -> dict[str, Any]:
    node = cluster.get("node", name)
    assert node is not None, f"node {name} is gone"
    return node


def test_gpu_deployment_runs_on_a_fake_gpu_node(cluster: Cluster, namespace: str) -> None:
    labels = {"app": "gpu-worker"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gpu-worker"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [container(resources=GPU_AND_RDMA)]},
            },
        },
    }
    cluster.apply(deployment, namespace=namespace)

    def available() -> dict[str, Any] | None:
        d = cluster.get("deployment", "gpu-worker", namespace)
        return d if d and (d.get("status") or {}).get("availableReplicas") == 1 else None

    wait_for(available, timeout=60, what="Deployment gpu-worker to have 1 available replica")
    (p,) = cluster.list("pods", namespace, selector="app=gpu-worker")
    assert pod_phase_and_ready(p) == ("Running", True), p["status"]
    node = _node(cluster, p["spec"]["nodeName"])
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert GPU_NODE_LABELS.items() <= node["metadata"]["labels"].items()
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert node["status"]["allocatable"]["rdma/ib"] == "8"


def test_pod_asking_for_nine_gpus_is_unschedulable(cluster: Cluster, namespace: str) -> None:
    cluster.apply(pod("too-big", [container(resources={"nvidia.com/gpu": "9"})]), namespace=namespace)

    def unschedulable() -> dict[str, Any] | None:
        cond = condition(cluster.get("pod", "too-big", namespace), "PodScheduled")
        return cond if cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable" else None

    cond = wait_for(unschedulable, timeout=60, what="pod too-big to be marked Unschedulable")
    assert "Insufficient nvidia.com/gpu" in cond.get("message", ""), cond
    p = cluster.get("pod", "too-big", namespace)
    assert p is not None and p["status"]["phase"] == "Pending" and not p["spec"].get("nodeName")


def test_rbac_is_enforced(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    user = f"system:serviceaccount:{namespace}:nobody"

    denied = cluster.run_as(user, "get", "pods", "-n", namespace)
    assert denied.returncode != 0 and "Forbidden" in denied.stderr, denied.stderr
    assert f'User "{user}" cannot list resource "pods"' in denied.stderr, denied.stderr
    assert cluster.run_as(user, "auth", "can-i", "create", "deployments", "-n", namespace).stdout.strip() == "no"

    # A real token, no impersonation: authentication and authorization both run.
    token = cluster.kubectl("create", "token", "nobody", "-n", namespace, "--duration=10m").stdout.strip()
    server = cluster.kubectl("config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}").stdout
    assert server.startswith("https://127.0.0.1:"), server
    flags = ["--kubeconfig=/dev/null", f"--server={server}", f"--token={token}", "--insecure-skip-tls-verify"]
    by_token = cluster.kubectl(*flags, "get", "pods", "-n", namespace, check=False)
    assert by_token.returncode != 0 and "Forbidden" in by_token.stderr, by_token.stderr

    # Granting the right makes the same request succeed, so the denial came from RBAC and not a broken setup.
    cluster.kubectl("create", "role", "pod-reader", "--verb=get,list", "--resource=pods", "-n", namespace)
    cluster.kubectl("create", "rolebinding", "nobody-reads-pods", "--role=pod-reader",
                    f"--serviceaccount={namespace}:nobody", "-n", namespace)
    wait_for(lambda: cluster.kubectl(*flags, "get", "pods", "-n", namespace, check=False).returncode == 0,
             timeout=30, what="the RoleBinding to let ServiceAccount nobody list pods")
    assert cluster.run_as(user, "get", "pods", "-n", namespace, "-A", check=False).returncode != 0


def _container_status(p: dict[str, Any] | None) -> dict[str, Any] | None:
    statuses = ((p or {}).get("status") or {}).get("containerStatuses") or []
    return dict(statuses[0]) if statuses else None


def test_crash_message_stage_shows_crash_loop(cluster: Cluster, namespace: str) -> None:
    message = "RuntimeError: build_disagg_draft_input is not implemented for DSPARK"
    cluster.apply(
        pod("crasher", [container()], annotations={"kwok.specserving.io/crash-message": message}),
        pod("healthy", [container()]),
        namespace=namespace,
    )

    def crash_looping() -> dict[str, Any] | None:
        cs = _container_status(cluster.get("pod", "crasher", namespace))
        waiting = ((cs or {}).get("state") or {}).get("waiting") or {}
        return cs if waiting.get("reason") == "CrashLoopBackOff" else None

    cs = wait_for(crash_looping, timeout=60, what="pod crasher to show CrashLoopBackOff")
    terminated = cs["lastState"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"], terminated["message"]) == (1, "Error", message)
    assert cs["restartCount"] > 0 and cs["ready"] is False

    # The default ready stage must not overtake it: once a plain pod in the same namespace is Ready, the crasher
    # is still not Ready.
    wait_for(lambda: pod_phase_and_ready(cluster.get("pod", "healthy", namespace)) == ("Running", True),
             timeout=60, what="pod healthy to be Running and Ready")
    p = cluster.get("pod", "crasher", namespace)
    assert pod_phase_and_ready(p) == ("Running", False), p
    assert _container_status(p)["state"]["waiting"]["reason"] == "CrashLoopBackOff"


def _job(name: str, annotations: dict[str, str] | None = None, backoff_limit: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": backoff_limit,
            "template": {
                "metadata": {"annotations": annotations or {}},
                "spec": {"restartPolicy": "Never", "containers": [container()]},
            },
        },
    }


def _job_condition(cluster: Cluster, namespace: str, name: str, type_: str) -> dict[str, Any] | None:
    cond = condition(cluster.get("job", name, namespace), type_)
    return cond if cond and cond["status"] == "True" else None


def test_plain_job_pod_completes(cluster: Cluster, namespace: str) -> None:
    cluster.apply(_job("plain"), namespace=namespace)
    wait_for(lambda: _job_condition(cluster, namespace, "plain", "Complete"), timeout=60,
             what="Job plain to Complete")
    (p,) = cluster.list("pods", namespace, selector="job-name=plain")
    assert p["status"]["phase"] == "Succeeded"
    assert _container_status(p)["state"]["terminated"]["exitCode"] == 0


def test_exit_code_stage_reports_digest_from_job(cluster: Cluster, namespace: str) -> None:
    digest = "sha256:" + "ab" * 32
    annotations = {"kwok.specserving.io/exit-code": "0", "kwok.specserving.io/termination-message": digest}
    cluster.apply(_job("build-image", annotations), namespace=namespace)
    wait_for(lambda: _job_condition(cluster, namespace, "build-image", "Complete"), timeout=60,
             what="Job build-image to Complete")
    (p,) = cluster.list("pods", namespace, selector="job-name=build-image")
    assert p["status"]["phase"] == "Succeeded"
    terminated = _container_status(p)["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"], terminated["message"]) == (0, "Completed", digest)


def test_exit_code_stage_fails_pod_and_job(cluster: Cluster, namespace: str) -> None:
    message = "error: failed to solve: pip install sglang==0.5.99: no matching distribution"
    annotations = {"kwok.specserving.io/exit-code": "3", "kwok.specserving.io/termination-message": message}
    cluster.apply(
        pod("exits-3", [container()], annotations=annotations, restart_policy="Never"),
        _job("broken-build", annotations),
        namespace=namespace,
    )

    def failed() -> dict[str, Any] | None:
        p = cluster.get("pod", "exits-3", namespace)
        return p if p and p["status"].get("phase") == "Failed" else None

    p = wait_for(failed, timeout=60, what="pod exits-3 to fail")
    terminated = _container_status(p)["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"], terminated["message"]) == (3, "Error", message)
    assert pod_phase_and_ready(p) == ("Failed", False)

    cond = wait_for(lambda: _job_condition(cluster, namespace, "broken-build", "Failed"), timeout=60,
                    what="Job broken-build to be Failed")
    assert cond.get("reason") == "BackoffLimitExceeded", json.dumps(cond)


def test_helm_installs_chart_with_kube_version_constraint(
    cluster: Cluster, namespace: str, tmp_path: pathlib.Path
) -> None:
    # helm checks kubeVersion against the server's /version: this passes only because the binaries are built with
    # the version ldflags (without them the server reports v0.0.0-master).
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        yaml.safe_dump({"apiVersion": "v2", "name": "probe", "version": "0.1.0", "kubeVersion": ">=1.30.0-0"})
    )
    (chart / "templates" / "configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: probe\n"
        "data:\n  kubeVersion: {{ .Capabilities.KubeVersion.Version | quote }}\n"
    )
    helm = str(cluster.bin_dir / "helm")
    proc = subprocess.run([helm, "install", "probe", str(chart), "-n", namespace, "--wait", "--timeout=60s"],
                          env=cluster.env, text=True, capture_output=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    assert version.startswith("v1.") and "master" not in version, version
    cm = cluster.get("configmap", "probe", namespace)
    assert cm is not None and cm["data"]["kubeVersion"] == version


REAL_NODE_LABEL = "specserving.io/real-node"
REAL_POD_CIDR = ipaddress.ip_network("10.88.0.0/16")  # hack/node.sh's bridge
FAKE_POD_CIDR = ipaddress.ip_network("198.18.0.0/15")  # hack/cluster.sh's fake nodes


def _on_the_real_node(p: dict[str, Any]) -> dict[str, Any]:
    p["spec"]["nodeSelector"] = {REAL_NODE_LABEL: "true"}
    p["spec"]["tolerations"] = [{"key": REAL_NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    return p


def test_real_node_is_a_kubelet_with_containerd_not_kwok(cluster: Cluster, real_node: str) -> None:
    node = _node(cluster, real_node)
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {}), "kwok must not play the real node"
    assert node["metadata"]["labels"][REAL_NODE_LABEL] == "true"
    assert {"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
    info = node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://"), info
    assert info["kubeletVersion"].startswith("v1.36."), info
    assert "nvidia.com/gpu" not in node["status"]["allocatable"], "the real node has no GPUs to offer"


def test_container_runs_on_the_real_node_and_its_log_is_read(
        cluster: Cluster, real_node: str, operator_image: str, namespace: str) -> None:
    # The operator image stands in for any image of ours: it has a Python to run and comes from the local registry.
    script = "import socket; print('ran in', socket.gethostname())"
    runner = _on_the_real_node(pod("runner", [dict(container(image=operator_image),
                                                   command=["python", "-c", script])], restart_policy="Never"))
    cluster.apply(runner, namespace=namespace)

    def finished() -> dict[str, Any] | None:
        p = cluster.get("pod", "runner", namespace)
        return p if p and p["status"].get("phase") in ("Succeeded", "Failed") else None

    p = wait_for(finished, timeout=120, what="pod runner to finish on the real node")
    assert p["status"]["phase"] == "Succeeded", p["status"]
    assert p["spec"]["nodeName"] == real_node
    assert _container_status(p)["containerID"].startswith("containerd://"), p["status"]
    assert ipaddress.ip_address(p["status"]["podIP"]) in REAL_POD_CIDR, p["status"]
    # kubectl logs goes API server -> the real kubelet -> containerd's log file: only a container that ran wrote it.
    assert cluster.kubectl("logs", "runner", "-n", namespace).stdout.strip() == "ran in runner"


def test_untolerating_pod_stays_off_the_real_node(cluster: Cluster, real_node: str, namespace: str) -> None:
    # Pinned to the real node by name, a pod without the toleration is refused there; the taint keeps it out.
    pinned = pod("pinned", [container()])
    pinned["spec"]["nodeSelector"] = {REAL_NODE_LABEL: "true"}
    cluster.apply(pinned, namespace=namespace)

    def unschedulable() -> dict[str, Any] | None:
        cond = condition(cluster.get("pod", "pinned", namespace), "PodScheduled")
        return cond if cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable" else None

    cond = wait_for(unschedulable, timeout=60, what="pod pinned to be marked Unschedulable")
    assert "untolerated taint" in cond.get("message", ""), cond
    # And an ordinary pod lands on a fake node, with an address from the fake range that goes nowhere.
    cluster.apply(pod("anywhere", [container()]), namespace=namespace)
    p = wait_for(lambda: (q := cluster.get("pod", "anywhere", namespace)) and q["status"].get("podIP") and q,
                 timeout=60, what="pod anywhere to get an IP")
    assert p["spec"]["nodeName"] != real_node
    assert ipaddress.ip_address(p["status"]["podIP"]) in FAKE_POD_CIDR, p["status"]
