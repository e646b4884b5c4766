"""Security properties: no privileged pod, ever; no Secret value anywhere the operator writes or logs.

1. Every pod the renderer can produce (the examples and hypothesis-generated valid specs, offline) and every pod
   the lifecycle really starts: no privileged container; the only capability ever added is IPC_LOCK (prefill and
   decode, for RDMA memory registration); privilege escalation off in serving and router containers; the router
   non-root with every capability dropped; no host PID or IPC namespace. The image-build pod: not privileged, no
   capability added, non-root, no service-account token.
2. A Secret with a random value is referenced as spec.image.pullSecrets and spec.image.build.pushSecretRef; the
   operator (with --debug, so it logs everything it sees) runs a build and a serving lifecycle; the value, in every
   encoding the Secret holds it, appears in no log line, event, status, annotation or other object of the namespace.
   The operator runs as the chart's ServiceAccount (a token kubeconfig, the chart's RBAC from `helm template`)
   with its webhook serving TLS; that token and the TLS key are searched for too. The log must hold the lifecycle
   (an empty log finds nothing), and no request may be forbidden.
3. RBAC: the whole chart install runs the lifecycle under its ServiceAccount alone in
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
from cluster.operating import NAME, READY_TIMEOUT, REPO, Operator, free_port, ready, seed
from hypothesis import given, settings
from specserving.api.loading import spec_of
from specserving.capabilities import load
from specserving.imagebuild.context import load as load_context
from specserving.imagebuild.job import build_objects
from specserving.imagebuild.planning import BUILD
from specserving.imagebuild.planning import plan as plan_image
from specserving.rendering import render
from specserving.validation import validate
from specserving.webhook.tls import generate

from .faults import figure, forbidden_lines, size
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
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            problems.append(f"{name}: does not drop every capability")
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


def snapshot(cluster: Cluster, ns: str) -> str:
    """Every object of the namespace the operator could have written to, but the Secrets, as JSON text."""
    return cluster.kubectl("get", "all,configmaps,events,specservings,serviceaccounts,roles,rolebindings,"
                           "poddisruptionbudgets,jobs", "-n", ns, "-o", "json").stdout


def pem_lines(pem: str) -> set[str]:
    """The base64 lines of a PEM block: any one of them found elsewhere is a piece of the key."""
    return {ln for ln in pem.splitlines() if ln and not ln.startswith("-----")}


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_no_secret_value_in_logs_events_or_status(cluster: Cluster, namespace: str, crd: None,
                                                  chart_kubeconfig: Path, tmp_path: Path) -> None:
    ns = namespace
    token = f"sps-{secrets.token_hex(16)}"
    auth = base64.b64encode(f"robot:{token}".encode()).decode()
    config = json.dumps({"auths": {"registry.example.com": {"auth": auth}}})
    forms = {token, auth, base64.b64encode(config.encode()).decode(), base64.b64encode(token.encode()).decode()}
    for secret in ("sps-pull", "sps-push"):
        cluster.kubectl("create", "secret", "docker-registry", secret, "-n", ns, "--docker-server=registry.example.com",
                        "--docker-username=robot", f"--docker-password={token}")
    # The operator's own secrets: the token of the chart's ServiceAccount it runs as (no other identity), and its
    # webhook's TLS key.
    kubeconfig = chart_kubeconfig
    sa_token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    tls = generate(tmp_path / "webhook-tls", ["localhost"])
    key_pem = tls.keyfile.read_text()
    own = {"ServiceAccount token": {sa_token, *sa_token.split(".")[1:]},
           "webhook TLS key": {key_pem, base64.b64encode(key_pem.encode()).decode(), *pem_lines(key_pem)}}

    op = Operator(cluster, ns, tmp_path / "operator.log", kubeconfig=kubeconfig, extra=[
        "--debug", "--build-context", str(CONTEXT), "--webhook-port", str(free_port()),
        "--webhook-certfile", str(tls.certfile), "--webhook-keyfile", str(tls.keyfile),
        "--webhook-configuration", "none"])
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
        alive = snapshot(cluster, ns)  # status, pods and the build Job: what the deletion below removes
        cluster.kubectl("delete", "sps", "--all", "-n", ns, "--wait=true", "--timeout=60s")
    finally:
        op.stop()

    everything = alive + snapshot(cluster, ns)
    log = op.log.read_text()
    # An empty or quiet log would find nothing: it must hold the debug lines of the lifecycle it lived through.
    assert len(log.splitlines()) >= 100, f"the operator logged only {len(log.splitlines())} lines:\n{log[-2000:]}"
    for seen in ("sps-pull", "sps-push", NAME, "built"):
        assert seen in log, f"{seen!r} is not in the operator's --debug log: the search would look at the wrong text"
    assert "sps-pull" in alive and "sps-push" in alive  # the names are in the objects too
    forbidden = forbidden_lines(log)
    assert not forbidden, "the chart's RBAC refused the operator:\n" + "\n".join(forbidden[:10])
    objects = sum(len(json.loads(text)["items"]) for text in (alive, everything[len(alive):]))
    places = {"operator log": log, "objects of the namespace (but the Secrets)": everything}
    leaks = {f"{what} in the {where}": sorted(f[:24] + "..." for f in found if f in text)
             for what, found in {"pull/push secret": forms, **own}.items() for where, text in places.items()}
    figure(f"secret values (the pull and push secrets, the operator's ServiceAccount token, its webhook TLS key) "
           f"checked in {len(log.splitlines())} operator log lines (--debug, as the chart's ServiceAccount) and "
           f"{objects} objects before and after the deletion (events, status, pods, Jobs, ConfigMaps): "
           f"{sum(len(v) for v in leaks.values())} occurrences")
    assert not any(leaks.values()), {k: v for k, v in leaks.items() if v}
