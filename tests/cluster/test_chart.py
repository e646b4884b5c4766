"""The Helm chart on the local control plane: lint, template, install, upgrade and uninstall, with the operator
running as the chart's own pods.

The install tests run the chart as a user does: the operator image built from images/operator/Dockerfile and pushed
to the local registry (`operator_image`), `helm install` with hack/real-node-values.yaml, both replicas Running on
the real node (containerd) with the in-cluster ServiceAccount token, in a namespace that enforces Pod Security
"restricted". The API server reaches the webhook through the chart's Service (kube-proxy), `helm test` runs its hook
Pod, and the metrics are read through the metrics Service by the API server's service proxy.

A lifecycle that passes under that identity, with no "forbidden" in either pod's log, proves the RBAC is
sufficient; `kubectl auth can-i` and refused escalation attempts prove it is not excessive.

The peering test alone runs `specserving run` as local processes (as the chart's ServiceAccount, through a token
kubeconfig, with the development value webhook.url): it must SIGKILL the active replica and watch the standby take
over, which a process it owns shows exactly.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import REAL_NODE
from .kube import Cluster, condition, wait_for
from .operating import (HOST_PATH_POLICY, NAME, REPO, SPECSERVING, Operator, apply_ready, children, crd, events,
                        free_port, pods, ready, seed, sps)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]
__all__ = ["crd"]  # a fixture, used by name

CHART = REPO / "charts" / "specserving-operator"
CHART_NAME = "specserving-operator"
HOOK = "templates/tests/test-webhook.yaml"
FORBIDDEN = re.compile(r"forbidden|Not enough permissions", re.I)
NGRAM = {"spec.speculative.algorithm": "NGRAM"}
REAL_NODE_VALUES = REPO / "hack" / "real-node-values.yaml"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}
# The image build: a base whose SGLang lacks DSPARK's PD-decode builder, so the operator starts a build Job (the
# in-cluster operator ships its image's build context; the local one in the peering test, the unit tier's).
BUILD_CONTEXT = REPO / "tests" / "unit" / "imagebuild" / "context"
REGISTRY = "registry.local/ml"
NEEDS_BUILD = {"metadata.name": "needs-build", "spec.image.base": "lmsysorg/sglang:v0.5.16-cu129"}


# -- helpers -----------------------------------------------------------------------------------------------------


def helm(cluster: Cluster, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """The cluster's helm (built from its Go module) with KUBECONFIG set."""
    proc = subprocess.run([str(cluster.bin_dir / "helm"), *args], env=cluster.env, text=True, capture_output=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    return proc


def kube_version(cluster: Cluster) -> str:
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    return str(version).lstrip("v")


def render(cluster: Cluster, *sets: str, namespace: str = "specserving", show: str | None = None,
           release: str = "r") -> list[dict[str, Any]]:
    args = ["template", release, str(CHART), "-n", namespace, "--kube-version", kube_version(cluster)]
    for s in sets:
        args += ["--set", s]
    if show:
        args += ["--show-only", show]
    return [d for d in yaml.safe_load_all(helm(cluster, *args).stdout) if d]


def fresh_namespace(cluster: Cluster, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "specserving.io/test=true")
    wait_for(lambda: cluster.get("serviceaccount", "default", name), 30, f"the default ServiceAccount in {name}")
    return name


def token_kubeconfig(cluster: Cluster, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig with the cluster's server and CA and a token of `account`: that identity and no other."""
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--duration=2h").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    server = dict(admin["clusters"][0]["cluster"])
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": account,
        "clusters": [{"name": "cluster", "cluster": server}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": account, "context": {"cluster": "cluster", "user": account}}],
    }))
    path.chmod(0o600)
    return path


def can_i(cluster: Cluster, user: str, *args: str) -> bool:
    out = cluster.kubectl("auth", "can-i", *args, f"--as={user}", check=False)
    assert out.stdout.strip() in ("yes", "no"), out.stderr
    return out.stdout.strip() == "yes"


def dry_run(cluster: Cluster, ns: str, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", "-n", ns, "--dry-run=server", "-f", "-", input=yaml.safe_dump(obj), check=False)


def refused_by_webhook(cluster: Cluster, ns: str) -> bool:
    out = dry_run(cluster, ns, seed(**NGRAM))
    return out.returncode != 0 and "denied the request" in out.stderr and "spec.speculative.algorithm" in out.stderr


@dataclass
class Release:
    """One installed release of the chart and its names. With an image, the operator runs as the chart's pods on
    the real node; without one, the API server calls the webhook at a local port (for local operator processes)."""

    cluster: Cluster
    name: str
    namespace: str
    watch: list[str] = field(default_factory=list)
    image: str | None = None
    port: int = field(default_factory=free_port)

    @property
    def fullname(self) -> str:
        return self.name if CHART_NAME in self.name else f"{self.name}-{CHART_NAME}"

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.fullname}"

    def sets(self) -> list[str]:
        if self.image:
            reference, digest = self.image.split("@")
            sets = [f"image.repository={reference.rsplit(':', 1)[0]}", f"image.digest={digest}",
                    f"build.registry={REGISTRY}"]
        else:
            sets = [f"webhook.url=https://127.0.0.1:{self.port}"]
        if self.watch:
            sets.append("watchNamespaces={" + ",".join(self.watch) + "}")
        return sets

    def install(self) -> float:
        started = time.monotonic()
        args = ["install", self.name, str(CHART), "-n", self.namespace, "--wait", "--timeout", "180s"]
        if self.image:
            args += ["-f", str(REAL_NODE_VALUES)]
        for s in self.sets():
            args += ["--set", s]
        proc = helm(self.cluster, *args, check=False, timeout=240)
        if proc.returncode != 0:
            pytest.fail(f"helm install exited {proc.returncode}: {proc.stderr.strip()}\n{self.describe_pods()}",
                        pytrace=False)
        return time.monotonic() - started

    def operator_pods(self) -> list[dict[str, Any]]:
        """The Deployment's pods (not the helm test Pod), oldest first."""
        found = self.cluster.list("pods", self.namespace,
                                  f"app.kubernetes.io/instance={self.name},app.kubernetes.io/name={CHART_NAME}")
        found = [p for p in found if p["metadata"].get("ownerReferences", [{}])[0].get("kind") == "ReplicaSet"]
        return sorted(found, key=lambda p: p["metadata"]["creationTimestamp"])

    def running_on_the_real_node(self) -> list[dict[str, Any]]:
        """Both replicas Running and Ready on the real node, as real containers; fails with what it saw instead."""
        def check() -> list[dict[str, Any]] | None:
            live = [p for p in self.operator_pods() if not p["metadata"].get("deletionTimestamp")]
            good = [p for p in live if p["spec"].get("nodeName") == REAL_NODE and p["status"].get("phase") == "Running"
                    and all(c.get("ready") and c.get("containerID", "").startswith("containerd://")
                            for c in p["status"].get("containerStatuses", []))]
            return good if len(good) == len(live) == 2 else None
        return wait_for(check, 120, f"both replicas of {self.fullname} Running and Ready on {REAL_NODE}")

    def describe_pods(self) -> str:
        out = self.cluster.kubectl("get", "pods", "-n", self.namespace, "-o", "wide", check=False).stdout
        for p in self.operator_pods():
            out += self.cluster.kubectl("logs", "-n", self.namespace, p["metadata"]["name"], "--tail=20",
                                        check=False).stdout
        return out

    def logs(self) -> dict[str, str]:
        """The logs of the replicas that run now; those of pods on their way out (after an upgrade) may vanish
        while they are read, and were read before the upgrade."""
        return {p["metadata"]["name"]: self.cluster.kubectl("logs", "-n", self.namespace, p["metadata"]["name"]).stdout
                for p in self.operator_pods() if not p["metadata"].get("deletionTimestamp")}

    def forbidden(self) -> list[str]:
        """Lines of the operator pods' logs that say the API server refused it something."""
        return [f"{pod}: {ln}" for pod, text in self.logs().items() for ln in text.splitlines() if FORBIDDEN.search(ln)]

    def metrics_through_service(self) -> str:
        """/metrics of one replica, through the metrics Service and the API server's service proxy."""
        return self.cluster.kubectl(
            "get", "--raw",
            f"/api/v1/namespaces/{self.namespace}/services/http:{self.fullname}-metrics:metrics/proxy/metrics").stdout

    def helm_test(self) -> subprocess.CompletedProcess[str]:
        """`helm test`: the hook Pod runs the selftest in the cluster; the kubelet's events show it ran there."""
        proc = helm(self.cluster, "test", self.name, "-n", self.namespace, "--timeout", "120s", check=False,
                    timeout=180)
        return proc

    def hook_pod_events(self) -> list[dict[str, Any]]:
        ns = self.watch[0] if self.watch else self.namespace
        pod = f"{self.fullname}-test"
        return [e for e in self.cluster.list("events", ns) if e["involvedObject"].get("name") == pod]

    def uninstall(self) -> None:
        helm(self.cluster, "uninstall", self.name, "-n", self.namespace, "--wait", "--timeout", "120s", check=False)

    def secret(self) -> dict[str, Any]:
        obj = self.cluster.get("secret", f"{self.fullname}-webhook-tls", self.namespace)
        assert obj is not None, "the chart's webhook Secret is missing"
        return obj

    def tls_files(self, directory: Path) -> tuple[Path, Path]:
        directory.mkdir(parents=True, exist_ok=True)
        data = self.secret()["data"]
        for key in ("tls.crt", "tls.key", "ca.crt"):
            (directory / key).write_bytes(base64.b64decode(data[key]))
        (directory / "tls.key").chmod(0o600)
        return directory / "tls.crt", directory / "tls.key"

    def ca_bundle(self) -> str:
        vwc = self.cluster.get("validatingwebhookconfiguration", self.fullname)
        assert vwc is not None
        return str(vwc["webhooks"][0]["clientConfig"]["caBundle"])

    def leftovers(self) -> list[str]:
        """Every object of this release still in the cluster (CRDs aside)."""
        found = []
        for kind in ("clusterrole", "clusterrolebinding", "validatingwebhookconfiguration", "clusterkopfpeering"):
            if self.cluster.get(kind, self.fullname):
                found.append(f"{kind}/{self.fullname}")
        kinds = "deployments,services,secrets,serviceaccounts,roles,rolebindings,poddisruptionbudgets,kopfpeerings,pods"
        for ns in [self.namespace, *self.watch]:
            found += [f"{ns}/{o['kind']}/{o['metadata']['name']}"
                      for o in self.cluster.list(kinds, ns, f"app.kubernetes.io/instance={self.name}")]
        return found


class ChartOperator(Operator):
    """`specserving run` with the chart Deployment's flags, as the chart's ServiceAccount, on this machine."""

    def __init__(self, release: Release, log: Path, *, priority: int, webhook: bool = True) -> None:
        cluster = release.cluster
        self.health, self.metrics_port = free_port(), free_port()
        kubeconfig = token_kubeconfig(cluster, release.namespace, release.fullname,
                                      log.parent / f"{log.stem}.kubeconfig")
        scope = [f"--namespace={ns}" for ns in release.watch] or ["--all-namespaces"]
        cmd = [SPECSERVING, "run", *scope, "--kubeconfig", str(kubeconfig),
               f"--peering={release.fullname}", f"--priority={priority}",
               "--liveness", f"http://127.0.0.1:{self.health}/healthz", "--metrics-port", str(self.metrics_port),
               "--metrics-address", "127.0.0.1", "--resync-seconds", "2", "--no-load-probe",
               f"--build-registry={REGISTRY}", f"--build-context={BUILD_CONTEXT}", *HOST_PATH_POLICY]
        if webhook:
            certfile, keyfile = release.tls_files(log.parent / f"{log.stem}-tls")
            cmd += [f"--webhook-port={release.port}", "--webhook-listen=127.0.0.1", f"--webhook-certfile={certfile}",
                    f"--webhook-keyfile={keyfile}", "--webhook-configuration=none"]
        # No way back to the admin credentials: the token kubeconfig only.
        self.launch(cmd, {**cluster.env, "KUBECONFIG": str(kubeconfig)}, log)
        try:
            wait_for(self._healthy, timeout=30, what=f"the operator's liveness endpoint (log: {log})")
        except BaseException:
            self.stop()
            raise

    def forbidden(self) -> list[str]:
        return [ln for ln in self.log.read_text().splitlines() if FORBIDDEN.search(ln)]

    def reconciles(self) -> float:
        return sum(v for k, v in self.metrics().items() if k.startswith("specserving_reconcile_total"))


class Charts:
    """Releases, operators and namespaces one test made; `close` stops, uninstalls and deletes them."""

    def __init__(self, cluster: Cluster, namespace: str, tmp_path: Path) -> None:
        self.cluster, self.namespace_, self.tmp_path = cluster, namespace, tmp_path
        self.releases: list[Release] = []
        self.operators: list[ChartOperator] = []
        self.namespaces: list[str] = []

    def release(self, watch: Sequence[str] = (), image: str | None = None) -> Release:
        """A release (not yet installed) into the test's namespace; with an image, run as the chart's pods."""
        rel = Release(self.cluster, f"sps-{uuid.uuid4().hex[:5]}", self.namespace_, list(watch), image)
        self.releases.append(rel)
        return rel

    def operator(self, rel: Release, name: str, **kw: Any) -> ChartOperator:
        op = ChartOperator(rel, self.tmp_path / f"{name}.log", **kw)
        self.operators.append(op)
        return op

    def namespace(self, prefix: str) -> str:
        self.namespaces.append(fresh_namespace(self.cluster, prefix))
        return self.namespaces[-1]

    def close(self) -> None:
        for op in self.operators:
            op.stop()
            # pytest shows captured teardown output only when the test fails: the log tail explains the failure.
            sys.stderr.write(f"\n--- {op.log.name} ---\n{op.log.read_text()[-4000:]}\n")
        for rel in self.releases:
            if rel.image:
                sys.stderr.write(f"\n--- {rel.fullname} pods ---\n{rel.describe_pods()[-6000:]}\n")
            rel.uninstall()
        for name in self.namespaces:
            self.cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def charts(cluster: Cluster, namespace: str, crd: None, tmp_path: Path) -> Iterator[Charts]:
    made = Charts(cluster, namespace, tmp_path)
    try:
        yield made
    finally:
        made.close()


def restricted(cluster: Cluster, namespace: str) -> None:
    """Enforce Pod Security "restricted" in the namespace: the chart's pods must still be admitted there."""
    cluster.kubectl("label", "namespace", namespace, "--overwrite", *(f"{k}={v}" for k, v in RESTRICTED.items()))


def assert_helm_test_ran_on_the_real_node(rel: Release) -> None:
    out = rel.helm_test()
    assert out.returncode == 0 and re.search(r"Phase:\s+Succeeded", out.stdout), out.stdout + out.stderr
    # The hook Pod is deleted once it succeeds; the kubelet's events stay, and name the node that ran it.
    started = [e for e in rel.hook_pod_events() if e["reason"] == "Started"]
    assert started and all(e["source"].get("host") == REAL_NODE for e in started), rel.hook_pod_events()


def lifecycle(cluster: Cluster, ns: str, scale_to: int | None = 3) -> dict[str, float]:
    """Seed example -> children -> Ready -> kubectl scale -> delete -> no orphans; the times it took."""
    times: dict[str, float] = {}
    obj, times["apply->Ready"] = apply_ready(cluster, ns)
    owned = children(cluster, ns)
    assert {o["kind"] for o in owned} >= {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding"}
    for o in owned:
        refs = o["metadata"]["ownerReferences"]
        assert refs[0]["uid"] == obj["metadata"]["uid"] and refs[0]["blockOwnerDeletion"] is True
    assert events(cluster, ns, "ChildrenApplied"), "no ChildrenApplied event: the operator could not post events"
    if scale_to:
        for replicas in (scale_to, 2):  # up, then back down (the scale-down path patches pod-deletion-cost)
            started = time.monotonic()
            cluster.kubectl("scale", "specserving", NAME, "-n", ns, f"--replicas={replicas}")
            wait_for(lambda: (r := ready(cluster, ns)) and r["status"]["decode"]["readyReplicas"] == replicas
                     and len(pods(cluster, ns, "decode")) == replicas, 90, f"decode scaled to {replicas} and Ready")
            times[f"scale to {replicas}->Ready"] = time.monotonic() - started
    started = time.monotonic()
    cluster.kubectl("delete", "specserving", NAME, "-n", ns, "--timeout=60s")
    wait_for(lambda: not children(cluster, ns) and not cluster.list("pods", ns, f"specserving.io/instance={NAME}"),
             60, "every child and pool pod gone")
    times["delete->no orphans"] = time.monotonic() - started
    return times


# -- tests -------------------------------------------------------------------------------------------------------


def test_lint_and_template_in_every_mode(cluster: Cluster) -> None:
    version = kube_version(cluster)
    modes = {"cluster-wide": [], "namespaced": ["watchNamespaces={a,b}"],
             "cert-manager": ["webhook.certManager.enabled=true"],
             "development": ["webhook.url=https://127.0.0.1:9443"]}
    for mode, sets in modes.items():
        args = ["lint", "--strict", str(CHART), "--kube-version", version]
        for s in sets:
            args += ["--set", s]
        out = helm(cluster, *args)
        assert "0 chart(s) failed" in out.stdout, (mode, out.stdout)
        assert not re.search(r"\[(WARNING|ERROR)\]", out.stdout), (mode, out.stdout)

    docs = render(cluster)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("ClusterKopfPeering", "r-specserving-operator") in kinds
    assert ("Secret", "r-specserving-operator-webhook-tls") in kinds
    by_kind = {d["kind"]: d for d in docs}
    rules = by_kind["ClusterRole"]["rules"]
    _assert_least_privilege(rules)
    assert {"apiGroups": ["specserving.io"], "resources": ["specservings/finalizers"], "verbs": ["update"]} in rules
    deploy = by_kind["Deployment"]
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args and "--peering=r-specserving-operator" in args and "--priority=random" in args
    assert "--webhook-configuration=none" in args and deploy["spec"]["replicas"] == 2
    assert not [a for a in args if a.startswith(("--allow-", "--deny-"))]  # default policy: no hostPath at all

    docs = render(cluster, "servingPolicy.hostPathPrefixes={/data2,/models}", "servingPolicy.hostNetwork.allowed=false",
                  "servingPolicy.rdmaResources={rdma/ib}", "servingPolicy.multusNetworks={ib-net}")
    args = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith(("--allow-", "--deny-"))] == [
        "--allow-host-path=/data2", "--allow-host-path=/models", "--deny-host-network", "--allow-rdma-resource=rdma/ib",
        "--allow-multus-network=ib-net"]
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert deploy["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    hook = by_kind["ValidatingWebhookConfiguration"]["webhooks"][0]
    assert hook["clientConfig"]["service"]["path"] == "/validate-specserving" and hook["clientConfig"]["caBundle"]
    assert "namespaceSelector" not in hook

    docs = render(cluster, "watchNamespaces={a,b}")
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert {r["resources"][0] for r in cluster_role["rules"]} == {"customresourcedefinitions", "namespaces"}
    assert all(set(r["verbs"]) <= {"list", "watch"} for r in cluster_role["rules"])
    roles = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "r-specserving-operator"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["a", "b"]
    for role in roles:
        _assert_least_privilege(role["rules"])
    assert sorted(d["metadata"]["namespace"] for d in docs if d["kind"] == "KopfPeering") == ["a", "b"]
    assert not [d for d in docs if d["kind"] == "ClusterKopfPeering"]
    vwc = next(d for d in docs if d["kind"] == "ValidatingWebhookConfiguration")
    assert vwc["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["a", "b"]
    args = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=a" in args and "--namespace=b" in args and "--all-namespaces" not in args
    assert next(d for d in docs if d["kind"] == "Pod")["metadata"]["namespace"] == "a"  # the helm test Pod

    docs = render(cluster, "webhook.certManager.enabled=true")
    kinds = {d["kind"] for d in docs}
    assert {"Certificate", "Issuer"} <= kinds and "Secret" not in kinds
    vwc = next(d for d in docs if d["kind"] == "ValidatingWebhookConfiguration")
    inject = vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert inject == "specserving/r-specserving-operator-webhook-tls"
    assert "caBundle" not in vwc["webhooks"][0]["clientConfig"]


def _assert_least_privilege(rules: list[dict[str, Any]]) -> None:
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule.get("apiGroups", [])
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule
        assert not {"secrets", "pods/exec", "serviceaccounts/token", "nodes"} & set(rule["resources"]), rule
        if "update" in rule["verbs"]:
            assert rule["resources"] == ["specservings/finalizers"], rule


def test_install_cluster_wide_runs_the_lifecycle_as_the_charts_pods(
        cluster: Cluster, charts: Charts, operator_image: str, namespace: str) -> None:
    restricted(cluster, namespace)
    rel = charts.release(image=operator_image)
    work = charts.namespace("work")
    install_s = rel.install()
    first = rel.running_on_the_real_node()
    assert {p["spec"]["serviceAccountName"] for p in first} == {rel.fullname}
    reference, digest = operator_image.split("@")
    assert all(p["spec"]["containers"][0]["image"] == f"{reference.rsplit(':', 1)[0]}@{digest}" for p in first)
    # The API server calls the webhook through the chart's Service (kube-proxy's rules take it to a pod).
    vwc = cluster.get("validatingwebhookconfiguration", rel.fullname)
    assert vwc is not None and "url" not in vwc["webhooks"][0]["clientConfig"]
    assert vwc["webhooks"][0]["clientConfig"]["service"]["name"] == f"{rel.fullname}-webhook"
    wait_for(lambda: refused_by_webhook(cluster, work), 60, "the webhook refusing NGRAM through its Service")
    assert_helm_test_ran_on_the_real_node(rel)

    times = lifecycle(cluster, work)
    # An image build: the shared Job and its context ConfigMap, made under the same identity.
    cluster.apply(seed(**NEEDS_BUILD), namespace=work)
    wait_for(lambda: cluster.list("jobs", work, "specserving.io/build") and cluster.list(
        "configmaps", work, "specserving.io/build"), 60, "the build Job and its context ConfigMap")
    wait_for(lambda: condition(sps(cluster, work, "needs-build"), "ImageReady"), 30, "ImageReady reported")
    assert rel.forbidden() == []
    metrics = rel.metrics_through_service()
    assert re.search(r"^specserving_specservings\{phase=", metrics, re.M), metrics[:2000]
    assert all(p["status"]["containerStatuses"][0]["restartCount"] == 0 for p in rel.operator_pods())

    # Not excessive: no Secrets, no webhook configurations, no RBAC escalation, nothing it does not do.
    sa = rel.user
    for args in (["get", "secrets", "-n", work], ["list", "secrets", "-A"], ["get", "secrets", "-n", rel.namespace],
                 ["create", "validatingwebhookconfigurations"],
                 ["patch", f"validatingwebhookconfigurations/{rel.fullname}"],
                 ["delete", f"validatingwebhookconfigurations/{rel.fullname}"],
                 ["create", "mutatingwebhookconfigurations"], ["create", "clusterroles"],
                 ["create", "clusterrolebindings"], ["escalate", "roles", "-n", work], ["bind", "roles", "-n", work],
                 ["escalate", "clusterroles"], ["bind", "clusterroles"], ["impersonate", "serviceaccounts", "-A"],
                 ["create", "serviceaccounts", "--subresource=token", "-n", work], ["create", "pods", "-n", work],
                 ["create", "pods", "--subresource=exec", "-n", work], ["update", "deployments", "-n", work],
                 ["create", "specservings", "-n", work], ["delete", "specservings", "-n", work],
                 ["update", "specservings", "-n", work], ["patch", "nodes"], ["delete", "namespaces"],
                 ["create", "customresourcedefinitions"], ["patch", "clusterkopfpeerings/another-operator"]):
        assert not can_i(cluster, sa, *args), f"the chart's ServiceAccount may {' '.join(args)}"
    for args in (["patch", "deployments", "-n", work],
                 ["update", "specservings.specserving.io", "--subresource=finalizers", "-n", work],
                 ["patch", "specservings.specserving.io", "--subresource=status", "-n", work],
                 ["create", "events", "-n", work],
                 ["watch", "customresourcedefinitions"], ["watch", "namespaces"],
                 ["patch", f"clusterkopfpeerings/{rel.fullname}"]):
        assert can_i(cluster, sa, *args), f"the chart's ServiceAccount may not {' '.join(args)}"
    grab = cluster.run_as(sa, "create", "role", "grab", "--verb=get", "--resource=secrets", "-n", work)
    assert grab.returncode != 0 and "attempting to grant RBAC permissions not currently held" in grab.stderr
    grab = cluster.run_as(sa, "create", "rolebinding", "grab", "--clusterrole=admin",
                          f"--serviceaccount={work}:default", "-n", work)
    assert grab.returncode != 0 and "forbidden" in grab.stderr

    # Upgrade: the lookup keeps the Secret, so the CA the API server trusts still matches what the pods serve.
    ca, secret = rel.ca_bundle(), rel.secret()["data"]
    started = time.monotonic()
    helm(cluster, "upgrade", rel.name, str(CHART), "-n", rel.namespace, "--reuse-values", "--set", "logLevel=verbose",
         "--wait", "--timeout", "120s")
    upgrade_s = time.monotonic() - started
    assert rel.ca_bundle() == ca and rel.secret()["data"] == secret
    after = cluster.get("deployment", rel.fullname, rel.namespace)
    assert "--verbose" in after["spec"]["template"]["spec"]["containers"][0]["args"]
    upgraded = rel.running_on_the_real_node()
    assert not {p["metadata"]["name"] for p in upgraded} & {p["metadata"]["name"] for p in first}
    wait_for(lambda: refused_by_webhook(cluster, work), 60, "the webhook refusing NGRAM after helm upgrade")
    assert rel.forbidden() == []

    rel.uninstall()
    wait_for(lambda: not rel.leftovers(), 60, "every object of the release gone after helm uninstall")
    for name in ("specservings.specserving.io", "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"):
        assert cluster.get("crd", name), f"helm uninstall removed the CRD {name}; Helm leaves CRDs"
    print(f"\nchart, cluster-wide: helm install --wait {install_s:.1f} s, helm upgrade --wait {upgrade_s:.1f} s, "
          + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))


def test_namespaced_install_acts_only_in_its_namespaces(cluster: Cluster, charts: Charts, operator_image: str,
                                                         namespace: str) -> None:
    restricted(cluster, namespace)
    watched, other = charts.namespace("watched"), charts.namespace("other")
    rel = charts.release(watch=[watched], image=operator_image)
    install_s = rel.install()
    rel.running_on_the_real_node()
    wait_for(lambda: refused_by_webhook(cluster, watched), 60, "the webhook refusing NGRAM in the watched namespace")
    assert_helm_test_ran_on_the_real_node(rel)
    times = lifecycle(cluster, watched, scale_to=None)
    assert rel.forbidden() == []

    sa = rel.user
    for ns in (other, rel.namespace):
        for args in (["list", "specservings"], ["patch", "specservings"], ["create", "deployments"],
                     ["patch", "deployments"], ["list", "pods"], ["create", "roles"], ["create", "events"],
                     ["patch", f"kopfpeerings/{rel.fullname}"]):
            assert not can_i(cluster, sa, *args, "-n", ns), f"{sa} may {' '.join(args)} in {ns}"
    for args in (["list", "deployments", "-A"], ["list", "specservings", "-A"], ["get", "secrets", "-n", watched],
                 ["list", "clusterkopfpeerings"], ["create", "validatingwebhookconfigurations"],
                 ["escalate", "roles", "-n", watched], ["bind", "roles", "-n", watched]):
        assert not can_i(cluster, sa, *args), f"{sa} may {' '.join(args)}"
    assert can_i(cluster, sa, "patch", "deployments", "-n", watched)
    assert can_i(cluster, sa, "patch", f"kopfpeerings/{rel.fullname}", "-n", watched)
    # The webhook covers the watched namespaces only, so an operator scoped to them never holds up the others.
    assert dry_run(cluster, other, seed(**NGRAM)).returncode == 0

    rel.uninstall()
    wait_for(lambda: not rel.leftovers(), 60, "every object of the release gone after helm uninstall")
    print(f"\nchart, namespaced: helm install --wait {install_s:.1f} s, "
          + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))


def test_peering_standby_takes_over_when_the_active_operator_dies(cluster: Cluster, charts: Charts) -> None:
    watched = charts.namespace("peering")
    rel = charts.release(watch=[watched])
    rel.install()
    # Only the standby serves the webhook here (one local port; in the cluster both replicas serve it behind the
    # Service), so that admission keeps working when the active one is killed.
    active = charts.operator(rel, "active", priority=200, webhook=False)
    standby = charts.operator(rel, "standby", priority=100)
    # kopf starts paused and resumes only when no live peer has a higher priority: the standby never resumes.
    wait_for(lambda: len((cluster.get("kopfpeering", rel.fullname, watched) or {}).get("status") or {}) == 2, 30,
             "both operators in the KopfPeering")
    assert "Resuming operations" in active.log.read_text() and "Resuming operations" not in standby.log.read_text()
    wait_for(lambda: refused_by_webhook(cluster, watched), 30, "the standby's webhook answering while paused")

    apply_ready(cluster, watched)
    assert active.reconciles() > 0 and standby.reconciles() == 0

    active.proc.kill()  # a crash: no chance to withdraw its peering record
    active.proc.wait()
    killed = time.monotonic()
    second = seed(**{"metadata.name": "after-failover"})
    cluster.apply(second, namespace=watched)
    wait_for(lambda: ready(cluster, watched, "after-failover"), 150, "the standby reconciling a new SpecServing")
    failover_s = time.monotonic() - killed
    assert standby.reconciles() > 0
    assert "Resuming operations" in standby.log.read_text()
    assert sps(cluster, watched, "after-failover")["status"]["observedGeneration"] == 1
    print(f"\npeering failover (active SIGKILLed -> standby makes a new SpecServing Ready): {failover_s:.1f} s")
