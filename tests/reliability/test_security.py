"""Security properties: no privileged pod, ever; no Secret value anywhere the operator writes or logs.

1. Every pod the renderer can produce (the examples and hypothesis-generated valid specs, offline) and every pod
   the lifecycle really starts: no privileged container; the only capability ever added is IPC_LOCK (prefill and
   decode, for RDMA memory registration); privilege escalation off in serving and router containers; the router
   non-root with every capability dropped; no host PID or IPC namespace. The image-build pod: not privileged, no
   capability added, non-root, no service-account token.
2. A Secret with a random value is referenced as spec.image.pullSecrets and spec.image.build.pushSecretRef; the
   operator (with --debug, so it logs everything it sees) runs a build and a serving lifecycle; the value, in every
   encoding the Secret holds it, appears in no log line, event, status, annotation or other object of the namespace.
3. RBAC: that the operator runs under the chart's ServiceAccount alone is proven by
   tests/cluster/test_chart.py::test_install_cluster_wide_runs_the_lifecycle_as_the_charts_identity.
"""

from __future__ import annotations

import base64
import json
import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster.kube import Cluster, condition, wait_for
from cluster.operating import NAME, READY_TIMEOUT, REPO, Operator, ready, seed
from hypothesis import given, settings
from specserving.api.loading import spec_of
from specserving.capabilities import load
from specserving.imagebuild.context import load as load_context
from specserving.imagebuild.job import build_objects
from specserving.imagebuild.planning import BUILD
from specserving.imagebuild.planning import plan as plan_image
from specserving.rendering import render
from specserving.validation import validate

from .faults import figure, size
from .specs import valid_specs

CONTEXT = REPO / "tests" / "unit" / "imagebuild" / "context"  # the unit tier's small build context
ALLOWED_CAPABILITIES = {"IPC_LOCK"}


def pod_templates(children: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(what, pod template) of every workload child."""
    out = []
    for c in children:
        what = f"{c['kind']}/{c['metadata']['name']}"
        if c["kind"] in ("Deployment", "Job"):
            out.append((what, c["spec"]["template"]))
        elif c["kind"] == "LeaderWorkerSet":
            tmpl = c["spec"]["leaderWorkerTemplate"]
            out += [(f"{what} leader", tmpl["leaderTemplate"]), (f"{what} worker", tmpl["workerTemplate"])]
    return out


def pod_problems(what: str, pod_spec: dict[str, Any], *, build: bool = False) -> list[str]:
    """Everything that breaks the security properties in one pod spec."""
    problems = []
    for key in ("hostPID", "hostIPC"):
        if pod_spec.get(key):
            problems.append(f"{what}: {key}")
    for c in pod_spec.get("initContainers", []) + pod_spec.get("containers", []):
        sc = c.get("securityContext") or {}
        name = f"{what} container {c['name']}"
        if sc.get("privileged"):
            problems.append(f"{name}: privileged")
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if added - (set() if build else ALLOWED_CAPABILITIES):
            problems.append(f"{name}: adds {sorted(added)}")
        if build:
            if not sc.get("runAsNonRoot") or pod_spec.get("automountServiceAccountToken") is not False:
                problems.append(f"{name}: build pod runs as root or with a service-account token")
            continue
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        router = c["name"] == "router" or "router" in what
        if router and (not sc.get("runAsNonRoot") or "ALL" not in ((sc.get("capabilities") or {}).get("drop") or [])):
            problems.append(f"{name}: router not non-root with every capability dropped")
    return problems


def rendered_problems(obj: dict[str, Any]) -> list[str]:
    """Security problems of every pod `obj` renders to, the build Job's included when it needs one."""
    obj = {**obj, "metadata": {**obj["metadata"], "namespace": "ns", "uid": "u-1"}}
    problems = []
    for what, tmpl in pod_templates(render(spec_of(obj), obj["metadata"])):
        problems += pod_problems(what, tmpl["spec"])
    ip = plan_image(spec_of(obj), load(), fix_version="f", default_registry="registry.example.com/ml")
    if ip.decision == BUILD:
        _, job = build_objects(ip, load_context(CONTEXT), namespace="ns", push_secret="push")
        problems += pod_problems(f"Job/{job['metadata']['name']}", job["spec"]["template"]["spec"], build=True)
    return problems


def test_examples_render_no_privileged_pod() -> None:
    examples = sorted((REPO / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        obj = yaml.safe_load(path.read_text())
        assert validate(obj).ok
        assert rendered_problems(obj) == [], path.name


@settings(max_examples=size(100, 1000), deadline=None, database=None)
@given(valid_specs("sec"))
def test_fuzzed_valid_specs_render_no_privileged_pod(obj: dict[str, Any]) -> None:
    if validate(obj).ok:
        assert rendered_problems(obj) == []


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_no_secret_value_in_logs_events_or_status(cluster: Cluster, namespace: str, crd: None,
                                                  tmp_path: Path) -> None:
    ns = namespace
    token = f"sps-{secrets.token_hex(16)}"
    auth = base64.b64encode(f"robot:{token}".encode()).decode()
    config = json.dumps({"auths": {"registry.example.com": {"auth": auth}}})
    forms = {token, auth, base64.b64encode(config.encode()).decode(), base64.b64encode(token.encode()).decode()}
    for secret in ("sps-pull", "sps-push"):
        cluster.kubectl("create", "secret", "docker-registry", secret, "-n", ns, "--docker-server=registry.example.com",
                        "--docker-username=robot", f"--docker-password={token}")

    op = Operator(cluster, ns, tmp_path / "operator.log", extra=["--debug", "--build-context", str(CONTEXT)])
    try:
        # A serving lifecycle with pull secrets: apply, Ready, scale, update.
        served = seed(**{"spec.image.pullSecrets": [{"name": "sps-pull"}]})
        cluster.apply(served, namespace=ns)
        wait_for(lambda: ready(cluster, ns), READY_TIMEOUT, "the SpecServing with pull secrets Ready")
        cluster.kubectl("scale", f"sps/{NAME}", "-n", ns, "--replicas=1")
        wait_for(lambda: (o := ready(cluster, ns)) and o["status"]["decode"]["replicas"] == 1, READY_TIMEOUT,
                 "Ready at 1 decode replica")
        # A build that pushes with the push secret (kwok ends the build pod without a digest: the build fails,
        # which puts the most text into status and events).
        built = seed(**{"metadata.name": "built", "spec.image.base": "lmsysorg/sglang:v0.5.16-cu129",
                        "spec.image.pullSecrets": [{"name": "sps-pull"}],
                        "spec.image.build": {"policy": "IfNeeded", "registry": "registry.example.com/ml",
                                             "pushSecretRef": {"name": "sps-push"}}})
        cluster.apply(built, namespace=ns)
        job = wait_for(lambda: cluster.list("jobs", ns), 60, "the build Job")[0]
        volumes = job["spec"]["template"]["spec"]["volumes"]
        assert "sps-push" in [(v.get("secret") or {}).get("secretName") for v in volumes]
        verdict = wait_for(lambda: (o := cluster.get("specservings", "built", ns)) and (c := condition(
            o, "ImageReady")) and c["reason"] not in ("Building", "Pending") and c, 90, "the build's verdict")
        print(f"build verdict: ImageReady={verdict['status']}/{verdict['reason']}: {verdict['message'][:300]}")
        pods = cluster.list("pods", ns)
        for p in pods:
            build = "specserving.io/build" in p["metadata"].get("labels", {})
            assert pod_problems(f"pod {p['metadata']['name']}", p["spec"], build=build) == []
        assert any(p["spec"].get("imagePullSecrets") == [{"name": "sps-pull"}] for p in pods)
        cluster.kubectl("delete", "sps", "--all", "-n", ns, "--wait=true", "--timeout=60s")
    finally:
        op.stop()

    everything = cluster.kubectl("get", "all,configmaps,events,specservings,serviceaccounts,roles,rolebindings,"
                                 "poddisruptionbudgets,jobs", "-n", ns, "-o", "json").stdout
    log = op.log.read_text()
    places = {"operator log": log, "objects of the namespace (but the Secrets)": everything}
    leaks = {where: sorted(f for f in forms if f in text) for where, text in places.items()}
    figure(f"secret value checked in {len(log.splitlines())} operator log lines (--debug) and "
           f"{len(json.loads(everything)['items'])} objects (events, status, pods, Jobs, ConfigMaps): "
           f"{sum(len(v) for v in leaks.values())} occurrences")
    assert "sps-pull" in log or "sps-pull" in everything  # the names are there: the search looked at the right text
    assert not any(leaks.values()), leaks
