"""Helpers of the reliability suite: sizes, a small SpecServing, what a converged namespace looks like, faults to
inject (SIGKILL the operator, restart the API server of a private cluster) and a trail of status changes.

Sizes: the suite runs in `make test` at a size that fits CI, and at full size with SPECSERVING_RELIABILITY=full
(`make reliability`). SPECSERVING_RELIABILITY_SEED fixes the random choices (the seed is printed either way).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import yaml
from harness.cluster import stop_orphans
from cluster.kube import Cluster, cluster_sh, condition, parse_env, wait_for
from cluster.operating import CHILD_KINDS, SPECSERVING, Operator
from cluster.test_chart import token_kubeconfig
from cluster.test_chart import render as render_chart
from specserving.api.loading import spec_of
from specserving.rendering import render

FULL = os.environ.get("SPECSERVING_RELIABILITY", "") == "full"
INSTANCE = "specserving.io/instance"
ROLE = "specserving.io/role"
# A traceback, or the frame lines of one, anywhere a user or the operator's log could show it.
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s*File \"[^\"]+\", line \d+", re.M)


def size(ci: int, full: int) -> int:
    """`full` under SPECSERVING_RELIABILITY=full, else `ci`."""
    return full if FULL else ci


def rng(what: str) -> random.Random:
    """A seeded generator; the seed is printed so a failing run can be repeated."""
    seed = int(os.environ.get("SPECSERVING_RELIABILITY_SEED") or random.SystemRandom().randrange(1, 2**31))
    print(f"\n{what}: SPECSERVING_RELIABILITY_SEED={seed}")
    return random.Random(seed)


def figure(text: str) -> None:
    """A measured figure, printed for `pytest -s` and docs/reliability.md."""
    print(f"figure: {text}", flush=True)


# -- a small SpecServing --------------------------------------------------------------------------------------------

SMALL: dict[str, Any] = {
    "apiVersion": "specserving.io/v1alpha1",
    "kind": "SpecServing",
    "metadata": {"name": "small"},
    "spec": {
        "model": {"path": "/models/m"},
        "image": {"base": "lmsysorg/sglang:v0.5.17-cu129"},
        # One GPU per pod, and a Multus network rather than the host's: no host ports, so many of these share the
        # eight fake 8-GPU nodes.
        "engine": {"tp": 1, "dp": 1},
        "speculative": {"algorithm": "DSPARK"},
        "prefill": {"replicas": 1},
        "decode": {"replicas": 1},
        "transfer": {"backend": "mooncake", "ibDevices": ["mlx5_0"],
                     "network": {"mode": "Multus", "multusNetworks": ["ib-net"]}},
        "router": {"replicas": 1},
    },
}


def small(name: str, *, prefill: int = 1, decode: int = 1, **changes: Any) -> dict[str, Any]:
    """A one-GPU-per-pod SpecServing called `name`, with dotted-path changes (`**{"spec.engine.tp": 2}`)."""
    obj = copy.deepcopy(SMALL)
    obj["metadata"]["name"] = name
    obj["spec"]["prefill"]["replicas"] = prefill
    obj["spec"]["decode"]["replicas"] = decode
    for path, value in changes.items():
        node = obj
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return obj


def apply_all(cluster: Cluster, ns: str, objs: list[dict[str, Any]]) -> None:
    """One `kubectl apply` of many objects."""
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(objs), timeout=120)


def cli_render(cluster: Cluster, obj: Mapping[str, Any], ns: str) -> list[dict[str, Any]]:
    """`specserving render -f - -n NS`: the manifests the operator is expected to apply."""
    proc = subprocess.run([SPECSERVING, "render", "-f", "-", "-n", ns], input=yaml.safe_dump(dict(obj)),
                          text=True, capture_output=True, env=cluster.env, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def expected_children(obj: Mapping[str, Any], ns: str) -> set[tuple[str, str]]:
    """(kind, name) of every child of the stored SpecServing `obj`: the renderer behind `specserving render`."""
    return {(c["kind"], c["metadata"]["name"]) for c in rendered_children(obj, ns)}


# -- what converged means ----------------------------------------------------------------------------------------

def ready_now(obj: Mapping[str, Any]) -> bool:
    """Ready=True for the stored generation."""
    c = condition(obj, "Ready")
    return bool(c and c["status"] == "True" and c.get("observedGeneration") == obj["metadata"]["generation"]
                and (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"])


def inventory(cluster: Cluster, ns: str) -> dict[str, list[dict[str, Any]]]:
    """Every SpecServing, labelled child, ReplicaSet and pool pod of the namespace."""
    return {
        "specservings": cluster.list("specservings", ns),
        "children": cluster.list(CHILD_KINDS, ns, INSTANCE),
        "replicasets": cluster.list("replicasets", ns, INSTANCE),
        "pods": cluster.list("pods", ns, INSTANCE),
    }


def convergence_problems(cluster: Cluster, ns: str, *, require_ready: bool = True) -> list[str]:
    """Everything that keeps the namespace from being converged; [] when it is (see `problems_in`)."""
    return problems_in(inventory(cluster, ns), lambda obj: rendered_children(obj, ns), require_ready=require_ready)


def rendered_children(obj: Mapping[str, Any], ns: str) -> list[dict[str, Any]]:
    """The children the renderer gives the stored SpecServing `obj` in namespace `ns`."""
    clean = {k: v for k, v in obj.items() if k != "status"}
    clean["metadata"] = {**obj["metadata"], "namespace": ns}
    return render(spec_of(clean), clean["metadata"])


def _slot(child: Mapping[str, Any]) -> tuple[str, str]:
    """What one child stands for in its SpecServing: its kind and role (a pool's Deployment of any revision)."""
    return child["kind"], (child["metadata"].get("labels") or {}).get(ROLE, "")


def problems_in(inv: Mapping[str, list[dict[str, Any]]], rendered: Callable[[dict[str, Any]], list[dict[str, Any]]],
                *, require_ready: bool = True) -> list[str]:
    """Everything that keeps an inventory (see `inventory`) from being converged; [] when it is.

    Converged: every SpecServing is Ready for its generation (when `require_ready`) and carries no finalizer; its
    children are exactly what `rendered` gives (kind and name), each owned by it (controller reference to its uid,
    no finalizer); no kind and role has more objects than the rendering has (duplicates, such as a pool's
    Deployment of a revision left behind); no labelled child belongs to a SpecServing that is gone or no longer
    renders it (orphans); and no pool has more pods or live ReplicaSets than it should (duplicates).
    """
    owners = {o["metadata"]["name"]: o for o in inv["specservings"]}
    problems: list[str] = []
    for name, obj in sorted(owners.items()):
        if obj["metadata"].get("finalizers"):
            problems.append(f"{name}: finalizers {obj['metadata']['finalizers']}")
        if obj["metadata"].get("deletionTimestamp"):
            problems.append(f"{name}: being deleted")
            continue
        if require_ready and not ready_now(obj):
            c = condition(obj, "Ready") or {}
            problems.append(f"{name}: not Ready for generation {obj['metadata']['generation']} "
                            f"({c.get('reason')}: {c.get('message')})")
        wanted = rendered(obj)
        want = {(c["kind"], c["metadata"]["name"]) for c in wanted}
        have = [c for c in inv["children"] if c["metadata"]["labels"].get(INSTANCE) == name]
        if missing := sorted(want - {(c["kind"], c["metadata"]["name"]) for c in have}):
            problems.append(f"{name}: missing children {missing}")
        if extra := sorted({(c["kind"], c["metadata"]["name"]) for c in have} - want):
            problems.append(f"{name}: children not rendered (orphans) {extra}")
        slots = {_slot(c) for c in wanted}
        for kind, role in sorted(slots):
            n_want = sum(_slot(c) == (kind, role) for c in wanted)
            found = sorted(c["metadata"]["name"] for c in have if _slot(c) == (kind, role))
            if len(found) > n_want:
                problems.append(f"{name}: {len(found)} {kind} objects for role {role!r}, want {n_want} "
                                f"(duplicates: {', '.join(found)})")
        for child in have:
            key = (child["kind"], child["metadata"]["name"])
            refs = [r for r in child["metadata"].get("ownerReferences") or [] if r.get("controller")]
            if [(r["kind"], r["name"], r["uid"]) for r in refs] != [("SpecServing", name, obj["metadata"]["uid"])]:
                problems.append(f"{name}: {key} is controlled by {refs}, not SpecServing uid "
                                f"{obj['metadata']['uid']}")
            if child["metadata"].get("finalizers"):
                problems.append(f"{name}: {key} has finalizers {child['metadata']['finalizers']}")
        if require_ready:
            spec = obj["spec"]
            for role, desired in (("prefill", spec["prefill"]["replicas"]), ("decode", spec["decode"]["replicas"]),
                                  ("router", spec.get("router", {}).get("replicas", 1))):
                live = [p for p in inv["pods"] if p["metadata"]["labels"].get(INSTANCE) == name
                        and p["metadata"]["labels"].get(ROLE) == role and not p["metadata"].get("deletionTimestamp")
                        and (p.get("status") or {}).get("phase") not in ("Failed", "Succeeded")]
                if len(live) != desired:
                    problems.append(f"{name}: {len(live)} live {role} pods, want {desired}")
                sets = [r for r in inv["replicasets"] if r["metadata"]["labels"].get(INSTANCE) == name
                        and r["metadata"]["labels"].get(ROLE) == role and r["spec"].get("replicas")]
                if len(sets) > 1:
                    problems.append(f"{name}: {len(sets)} {role} ReplicaSets with replicas > 0")
    for child in inv["children"]:
        owner = child["metadata"]["labels"].get(INSTANCE)
        if owner not in owners:
            problems.append(f"orphan {child['kind']}/{child['metadata']['name']} of SpecServing {owner} (gone)")
    return problems


def await_converged(cluster: Cluster, ns: str, timeout: float, what: str, **kwargs: Any) -> float:
    """Wait until convergence_problems() is empty; return the seconds it took. Fails listing the problems."""
    started = time.monotonic()
    last: list[str] = []

    def done() -> bool:
        nonlocal last
        last = convergence_problems(cluster, ns, **kwargs)
        return not last

    deadline = started + timeout
    while not done():
        if time.monotonic() >= deadline:
            pytest.fail(f"not converged after {timeout:g}s ({what}); {len(last)} problem(s):\n  "
                        + "\n  ".join(last[:40]), pytrace=False)
        time.sleep(0.5)
    return time.monotonic() - started


# -- the operator's identity -----------------------------------------------------------------------------------------

RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


@contextlib.contextmanager
def chart_identity(cluster: Cluster, ns: str, path: pathlib.Path) -> Iterator[pathlib.Path]:
    """The chart's ServiceAccount and RBAC for an install that watches `ns` (`helm template` of
    charts/specserving-operator under a release name of its own), applied; yields a kubeconfig that holds only a
    token of that ServiceAccount. Its cluster-scoped objects are deleted afterwards."""
    release = f"rel-{random.SystemRandom().randrange(16**6):06x}"
    rbac = [d for d in render_chart(cluster, "watchNamespaces={" + ns + "}", namespace=ns, release=release)
            if d["kind"] in RBAC_KINDS and "helm.sh/hook" not in (d["metadata"].get("annotations") or {})]
    accounts = [d for d in rbac if d["kind"] == "ServiceAccount"]
    assert len(accounts) == 1, [d["metadata"]["name"] for d in accounts]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    user = f"system:serviceaccount:{ns}:{accounts[0]['metadata']['name']}"
    # The API server's RBAC authorizer learns new bindings from its own watch, a moment later: an operator started
    # at once would meet 403s and retry. Wait until every rule is in force.
    grants = sorted({(rule["verbs"][0], group, res)
                     for d in rbac if d["kind"] in ("Role", "ClusterRole") for rule in d.get("rules") or []
                     if not rule.get("resourceNames")
                     for group in rule.get("apiGroups") or [""] for res in rule.get("resources") or []})

    def granted(verb: str, group: str, resource: str) -> bool:
        resource, _, sub = resource.partition("/")
        args = ["auth", "can-i", verb, f"{resource}.{group}" if group else resource, "-n", ns, f"--as={user}",
                *([f"--subresource={sub}"] if sub else [])]
        out = cluster.kubectl(*args, check=False)
        # A kind the cluster does not serve (LeaderWorkerSet, ServiceMonitor): no request for it can be made.
        return out.stdout.strip() == "yes" or "doesn't have a resource type" in out.stderr

    wait_for(lambda: all(granted(*g) for g in grants), 60, f"the chart's RBAC in force for {user}")
    try:
        yield token_kubeconfig(cluster, ns, accounts[0]["metadata"]["name"], path)
    finally:
        for d in rbac:
            if d["kind"].startswith("Cluster"):
                cluster.kubectl("delete", d["kind"], d["metadata"]["name"], "--ignore-not-found", check=False)


# The API server's words when RBAC refuses a request (`... is forbidden: User "system:serviceaccount:..." cannot
# ...`), and kopf's when it cannot list or watch something. Not the "Forbidden:" of a field error in a validation
# message.
RBAC_REFUSAL = re.compile(r"is forbidden: User|status=403\b|\b403 Forbidden|Forbidden\b(?!:)|Not enough permissions")


def forbidden_lines(log: str) -> list[str]:
    """Lines of an operator log that show a request its RBAC refused."""
    return [ln for ln in log.splitlines() if RBAC_REFUSAL.search(ln)]


@contextlib.contextmanager
def chart_operator(cluster: Cluster, ns: str, log: pathlib.Path, kubeconfig: pathlib.Path,
                   extra: tuple[str, ...] = ()) -> Iterator[Operator]:
    """The operator as the chart's ServiceAccount (`kubeconfig` from `chart_identity`); stopped afterwards, its log
    tail shown, and a failure if any of its requests was refused."""
    op = Operator(cluster, ns, log, kubeconfig=kubeconfig, extra=extra)
    try:
        yield op
    finally:
        op.stop()
        # pytest shows captured teardown output only when the test fails: the log tail explains the failure.
        sys.stderr.write(f"\n--- operator log ({op.log}) ---\n{op.log.read_text()[-6000:]}\n")
    forbidden = forbidden_lines(op.log.read_text())
    assert not forbidden, "the chart's RBAC refused the operator:\n" + "\n".join(forbidden[:10])


# -- faults ----------------------------------------------------------------------------------------------------------

def sigkill(op: Operator) -> None:
    """SIGKILL the operator process: no cleanup handler, no graceful shutdown, mid-whatever-it-was-doing."""
    if op.proc.poll() is None:
        op.proc.send_signal(signal.SIGKILL)
    op.proc.wait(timeout=30)
    op._out.close()  # noqa: SLF001 - the helper's log handle; stop() would send SIGTERM first


def tracebacks(text: str) -> list[str]:
    """The lines that show a Python traceback in `text`."""
    return [m.group(0) for m in TRACEBACK.finditer(text)]


class StatusTrail:
    """`kubectl get specservings NAME --watch -o json`: every stored version of the object, with the time it was
    seen, as (monotonic time, phase, {condition type: "status/reason"}). The SpecServing must exist.

    (A jsonpath template with a range prints only the first object under --watch with kubectl 1.36, so the JSON
    stream is decoded here.)"""

    def __init__(self, cluster: Cluster, ns: str, name: str) -> None:
        self.lines: list[tuple[float, str, dict[str, str]]] = []
        self.proc = subprocess.Popen(
            [str(cluster.bin_dir / "kubectl"), "get", "specservings", name, "-n", ns, "--watch", "-o", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=cluster.env)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        while chunk := self.proc.stdout.readline():
            buffer += chunk
            while buffer.strip():
                try:
                    obj, end = decoder.raw_decode(buffer.lstrip())
                except ValueError:
                    break  # an object not complete yet
                buffer = buffer.lstrip()[end:]
                status = obj.get("status") or {}
                conds = {c["type"]: f"{c['status']}/{c.get('reason')}" for c in status.get("conditions") or []}
                self.lines.append((time.monotonic(), status.get("phase", ""), conds))

    def since(self, t: float) -> list[tuple[float, str, dict[str, str]]]:
        return [x for x in self.lines if x[0] >= t]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self._thread.join(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# -- a private control plane, for faults a shared one must not see --------------------------------------------------

PRIVATE_PREFIX = "specserving-reliability-"


@contextlib.contextmanager
def private_cluster(tag: str, nodes: int) -> Iterator[Cluster]:
    """A kwokctl cluster of its own (`hack/cluster.sh up` under another SPECSERVING_CLUSTER_NAME), always stopped
    and deleted afterwards. Never the session's cluster: its API server is restarted and its nodes deleted."""
    name = f"{PRIVATE_PREFIX}{os.getpid()}-{tag}"
    # Fake nodes only: the real node is the machine's one, and the session cluster holds it.
    env = {**os.environ, "SPECSERVING_CLUSTER_NAME": name, "SPECSERVING_NODES": str(nodes), "SPECSERVING_REAL_NODE": "0"}
    kubeconfig, bin_dir = parse_env(cluster_sh("env", env, 30).stdout)
    stop_orphans(PRIVATE_PREFIX, env, 120)
    started = time.monotonic()
    up = cluster_sh("up", env, 300)
    try:
        if up.returncode != 0:
            pytest.fail(f"hack/cluster.sh up ({name}) failed (exit {up.returncode}):\n{up.stderr[-4000:]}")
        figure(f"private cluster {name} ({nodes} nodes) up in {time.monotonic() - started:.1f}s")
        yield Cluster.at(kubeconfig, bin_dir, started_here=True)
    finally:
        down = cluster_sh("down", env, 120)
        if down.returncode != 0:
            pytest.fail(f"hack/cluster.sh down ({name}) failed (exit {down.returncode}):\n{down.stderr[-4000:]}")


class ControlPlane:
    """The processes of a kwokctl (binary runtime) cluster, started as kwokctl's component config says (binary,
    arguments, working directory, log). Kills one and starts it again, keeping kwokctl's pid files current so
    that `kwokctl delete cluster` still stops everything.

    kwokctl supervises nothing: kube-controller-manager and kube-scheduler exit when they cannot renew their
    leader lease (an API server down for more than ~10 s), which is what a kubelet or systemd would restart.
    `revive()` plays that part."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.workdir = cluster.kubeconfig.parent
        docs = yaml.safe_load_all((self.workdir / "kwok.yaml").read_text())
        config = next(d for d in docs if d and d.get("kind") == "KwokctlConfiguration")
        self.components = {c["name"]: c for c in config["components"]}

    def _pidfile(self, name: str) -> pathlib.Path:
        return self.workdir / "pids" / f"{name}.pid"

    def pid(self, name: str) -> int | None:
        """The component's pid if that process runs this cluster's binary, else None."""
        try:
            pid = int(self._pidfile(name).read_text().strip())
            exe = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except (OSError, ValueError):
            return None
        return pid if exe == self.components[name]["binary"] else None

    def ready(self) -> bool:
        return self.cluster.kubectl("get", "--raw", "/readyz", "--request-timeout=2s", check=False,
                                    timeout=10).returncode == 0

    def kill(self, name: str) -> None:
        pid = self.pid(name)
        assert pid is not None, f"{name} of {self.workdir.name} is not running"
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pathlib.Path(f"/proc/{pid}").exists(), 30, f"{name} ({pid}) to exit")

    def start(self, name: str) -> None:
        """Start it detached (its parent is a shell that exits at once), as kwokctl does, and record its pid."""
        c = self.components[name]
        log = self.workdir / "logs" / f"{name}.log"
        proc = subprocess.run(
            ["bash", "-c", 'cd "$1" && shift && { "$@" </dev/null >>"$LOG" 2>&1 & } && echo $!', "start",
             str(c.get("workDir") or self.workdir), c["binary"], *c.get("args", [])],
            env={**os.environ, "LOG": str(log)}, text=True, capture_output=True, timeout=30, check=True)
        self._pidfile(name).write_text(proc.stdout.strip())

    def revive(self) -> list[str]:
        """Start every component that is no longer running; returns their names."""
        dead = [name for name in self.components if self.pid(name) is None]
        for name in dead:
            self.start(name)
        return dead

    @contextlib.contextmanager
    def supervised(self, period: float = 0.5) -> Iterator[list[tuple[float, str]]]:
        """Revive dead components every `period` seconds while the block runs, as a kubelet restarts static
        pods; yields the (monotonic time, name) of every restart, filled in as they happen."""
        restarts: list[tuple[float, str]] = []
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(period):
                if self.pid("kube-apiserver") is None:
                    continue  # the test is restarting it
                restarts.extend((time.monotonic(), name) for name in self.revive())

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            yield restarts
        finally:
            stop.set()
            thread.join(timeout=30)


def events_text(cluster: Cluster, ns: str) -> str:
    """Every event of the namespace, as JSON text (reason, message, involved object)."""
    return json.dumps([{k: e.get(k) for k in ("reason", "message", "involvedObject", "type")}
                       for e in cluster.list("events", ns)])
