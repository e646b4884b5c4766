"""The Helm chart on the local control plane: lint, template, install, upgrade and uninstall, with the operator
running under exactly the chart's ServiceAccount.

kwok fakes containers, so the chart's Deployment never really runs the operator. Each test runs `specserving run`
as a local process instead, with the Deployment's flags and a kubeconfig that holds a token of the chart's
ServiceAccount (`kubectl create token`) and nothing else. The chart owns the ValidatingWebhookConfiguration, so
the process serves the webhook with `--webhook-configuration none` and the certificate from the chart's Secret,
and the release is installed with the development value webhook.url=https://127.0.0.1:PORT so that the API server
calls the process (the generated certificate then names 127.0.0.1 too).

A lifecycle that passes under that identity, with no "forbidden" in the operator's log, proves the RBAC is
sufficient; `kubectl auth can-i` and refused escalation attempts prove it is not excessive.
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

from .kube import Cluster, condition, wait_for
from .operating import (NAME, REPO, SPECSERVING, Operator, apply_ready, children, crd, events, free_port, pods,
                        ready, seed, sps)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]
__all__ = ["crd"]  # a fixture, used by name

CHART = REPO / "charts" / "specserving-operator"
CHART_NAME = "specserving-operator"
HOOK = "templates/tests/test-webhook.yaml"
FORBIDDEN = re.compile(r"forbidden|Not enough permissions", re.I)
NGRAM = {"spec.speculative.algorithm": "NGRAM"}
# The image build: the unit tier's small context (the image has images/sglang-pd at /opt/specserving/sglang-pd), and
# a base whose SGLang lacks DSPARK's PD-decode builder, so the operator starts a build Job.
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
    """One installed release of the chart, its names, and the local port its webhook URL points at."""

    cluster: Cluster
    name: str
    namespace: str
    watch: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)

    @property
    def fullname(self) -> str:
        return self.name if CHART_NAME in self.name else f"{self.name}-{CHART_NAME}"

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.fullname}"

    def sets(self) -> list[str]:
        sets = [f"webhook.url=https://127.0.0.1:{self.port}"]
        if self.watch:
            sets.append("watchNamespaces={" + ",".join(self.watch) + "}")
        return sets

    def install(self) -> float:
        started = time.monotonic()
        args = ["install", self.name, str(CHART), "-n", self.namespace, "--wait", "--timeout", "120s"]
        for s in self.sets():
            args += ["--set", s]
        helm(self.cluster, *args)
        return time.monotonic() - started

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
        self.health, self.metrics_port, self.log = free_port(), free_port(), log
        kubeconfig = token_kubeconfig(cluster, release.namespace, release.fullname,
                                      log.parent / f"{log.stem}.kubeconfig")
        scope = [f"--namespace={ns}" for ns in release.watch] or ["--all-namespaces"]
        cmd = [SPECSERVING, "run", *scope, "--kubeconfig", str(kubeconfig),
               f"--peering={release.fullname}", f"--priority={priority}",
               "--liveness", f"http://127.0.0.1:{self.health}/healthz", "--metrics-port", str(self.metrics_port),
               "--metrics-address", "127.0.0.1", "--resync-seconds", "2", "--no-load-probe",
               f"--build-registry={REGISTRY}", f"--build-context={BUILD_CONTEXT}"]
        if webhook:
            certfile, keyfile = release.tls_files(log.parent / f"{log.stem}-tls")
            cmd += [f"--webhook-port={release.port}", "--webhook-listen=127.0.0.1", f"--webhook-certfile={certfile}",
                    f"--webhook-keyfile={keyfile}", "--webhook-configuration=none"]
        self._out = log.open("w")
        env = {**cluster.env, "KUBECONFIG": str(kubeconfig)}  # no way back to the admin credentials
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, env=env)
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

    def release(self, watch: Sequence[str] = ()) -> Release:
        """A release (not yet installed) into the test's namespace."""
        rel = Release(self.cluster, f"sps-{uuid.uuid4().hex[:5]}", self.namespace_, list(watch))
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


def run_selftest(cluster: Cluster, rel: Release, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The `helm test` Pod's command, run here under the identity the chart gives that Pod.

    kwok would only pretend to run the Pod, so the hook's ServiceAccount, Role and RoleBinding are applied from the
    chart's rendering, and the Pod's own command line runs locally with a token of that ServiceAccount.
    """
    docs = render(cluster, *rel.sets(), namespace=rel.namespace, show=HOOK, release=rel.name)
    hook_pod = next(d for d in docs if d["kind"] == "Pod")
    rbac = [d for d in docs if d["kind"] != "Pod"]
    cluster.apply(*rbac)
    container = hook_pod["spec"]["containers"][0]
    account = hook_pod["metadata"]["name"]
    ns = hook_pod["metadata"]["namespace"]
    try:
        kubeconfig = token_kubeconfig(cluster, ns, account, tmp_path / "selftest.kubeconfig")
        assert container["command"][:1] == ["python3"]
        cmd = [sys.executable, *container["command"][1:], *container["args"], "--kubeconfig", str(kubeconfig)]
        return subprocess.run(cmd, text=True, capture_output=True, timeout=60, env=cluster.env)
    finally:
        for d in rbac:
            cluster.kubectl("delete", d["kind"].lower(), d["metadata"]["name"], "-n", ns, "--ignore-not-found",
                            check=False)


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


def test_install_cluster_wide_runs_the_lifecycle_as_the_charts_identity(
        cluster: Cluster, charts: Charts, tmp_path: Path) -> None:
    rel = charts.release()
    work = charts.namespace("work")
    install_s = rel.install()
    op = charts.operator(rel, "operator", priority=100)
    wait_for(lambda: refused_by_webhook(cluster, work), 30, "the chart's webhook configuration reaching the operator")

    # `helm test`'s probe, under the identity the chart gives the test Pod.
    out = run_selftest(cluster, rel, tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("ok: the webhook refused NGRAM"), out.stderr

    times = lifecycle(cluster, work)
    # An image build: the shared Job and its context ConfigMap, made under the same identity.
    cluster.apply(seed(**NEEDS_BUILD), namespace=work)
    wait_for(lambda: cluster.list("jobs", work, "specserving.io/build") and cluster.list(
        "configmaps", work, "specserving.io/build"), 60, "the build Job and its context ConfigMap")
    wait_for(lambda: condition(sps(cluster, work, "needs-build"), "ImageReady"), 30, "ImageReady reported")
    assert op.forbidden() == []

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
                 ["watch", "customresourcedefinitions"], ["patch", f"clusterkopfpeerings/{rel.fullname}"]):
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
    assert refused_by_webhook(cluster, work), "a NGRAM dry run is admitted after helm upgrade"

    op.stop()
    rel.uninstall()
    assert rel.leftovers() == []
    for name in ("specservings.specserving.io", "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"):
        assert cluster.get("crd", name), f"helm uninstall removed the CRD {name}; Helm leaves CRDs"
    print(f"\nchart, cluster-wide: helm install --wait {install_s:.1f} s, helm upgrade --wait {upgrade_s:.1f} s, "
          + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))


def test_namespaced_install_acts_only_in_its_namespaces(cluster: Cluster, charts: Charts,
                                                         tmp_path: Path) -> None:
    watched, other = charts.namespace("watched"), charts.namespace("other")
    rel = charts.release(watch=[watched])
    install_s = rel.install()
    op = charts.operator(rel, "operator", priority=100)
    wait_for(lambda: refused_by_webhook(cluster, watched), 30, "the webhook refusing NGRAM in the watched namespace")
    out = run_selftest(cluster, rel, tmp_path)
    assert out.returncode == 0, out.stderr
    times = lifecycle(cluster, watched, scale_to=None)
    assert op.forbidden() == []

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

    op.stop()
    rel.uninstall()
    assert rel.leftovers() == []
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
