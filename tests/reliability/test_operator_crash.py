"""SIGKILL the operator where a crash hurts most while it reconciles many SpecServings; every one must converge.

Kills are placed through a proxy between the operator and the API server (apiproxy.py): at an incarnation's first
request (before its first pass), inside a child apply that is not the incarnation's first (mid-pass), before that
apply reached the API server or after it answered (so it landed and the operator never heard), or at a random
time. The first kill is before a first pass and the second inside an apply; the test fails unless at least one of
each landed. The operator runs as the chart's ServiceAccount, and no request of it may be forbidden.

The operator is a `specserving run` subprocess. Between kills the test keeps giving it work: new SpecServings,
spec changes that roll pods (speculative steps, which start a new PD-contract revision and a rollout between
revisions, docs/rollouts.md; decode replicas), a SpecServing deleted and recreated under the
same name (a new uid), children deleted or edited by hand, SpecServings deleted for good. Some of that lands while
the operator is dead, some just before it is killed. After the last restart every SpecServing must be Ready for its
generation with exactly the children `specserving render` gives, each owned by its current uid (so no revision
a rollout left behind survives); no pool may have
more pods or live ReplicaSets than it asks for; no child may belong to a SpecServing that is gone; nothing may
carry a finalizer, so that deleting every SpecServing with the operator dead completes and the garbage collector
leaves nothing behind.

CI size: 10 SpecServings, 8 kills. SPECSERVING_RELIABILITY=full: 100 SpecServings, 100 kills.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
from cluster.kube import Cluster, wait_for
from cluster.operating import CHILD_KINDS, Operator, total

from .apiproxy import ApiProxy, Incarnation, KillPlan
from .faults import (
    FULL,
    apply_all,
    await_converged,
    cli_render,
    expected_children,
    figure,
    forbidden_lines,
    rng,
    sigkill,
    size,
    small,
    tracebacks,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800 if FULL else 420)]

COUNT = size(10, 100)
KILLS = size(8, 100)
# Pools with pods: every SpecServing in CI (20 GPUs of 64), the first 16 at full size (48 GPUs at most when their
# decode pools scale to 2); the others have empty GPU pools and only a router pod.
WITH_GPUS = size(10, 16)
MAX_RUN_BEFORE_KILL = 5.0  # seconds the operator runs before a kill at a random time, drawn from [0, this)
PLAN_WAIT = 10.0  # seconds to wait for a planned kill point before killing by time
CONVERGE_TIMEOUT = size(180, 600)


def name(i: int) -> str:
    return f"crash-{i:03d}"


def spec_for(i: int, decode: int | None = None, steps: int | None = None) -> dict[str, Any]:
    gpus = i < WITH_GPUS
    obj = small(name(i), prefill=1 if gpus else 0, decode=(decode if decode is not None else 1) if gpus else 0)
    if steps:
        obj["spec"]["speculative"].update({"numSteps": steps, "numDraftTokens": steps + 1})
    return obj


def scrape(op: Operator) -> dict[str, float]:
    try:
        return op.metrics()
    except OSError:
        return {}


def draw_plan(k: int, r: random.Random) -> KillPlan | None:
    """Where kill `k` lands: the first two are fixed (before the first pass; inside a child apply), the rest drawn.
    None: at a random time, as a crash with no relation to the operator's work would."""
    if k == 1:
        return KillPlan(first_request=True)
    if k == 2:
        return KillPlan(nth=r.randint(2, 12), after=r.random() < 0.5)
    x = r.random()
    if x < 0.15:
        return KillPlan(first_request=True)
    if x < 0.65:
        return KillPlan(nth=r.randint(2, 12), after=r.random() < 0.5)
    return None


def test_sigkill_at_random_points_converges_without_duplicates_or_orphans(cluster: Cluster, namespace: str,
                                                                         crd: None, chart_kubeconfig: Path,
                                                                         tmp_path: Path) -> None:
    ns, r = namespace, rng("operator crash")
    logs: list[Path] = []
    mutations: list[str] = []
    deleted: set[int] = set()
    incarnations: list[Incarnation] = []

    def mutate(k: int) -> None:
        """A few random changes, each logged; the operator may be alive or dead."""
        for _ in range(max(2, COUNT // 5)):
            i = r.randrange(COUNT)
            what = r.choice(["scale", "steps", "recreate", "delete-child", "edit-child", "delete", "restore"])
            if i in deleted and what != "restore":
                what = "restore"
            if what == "scale" and i < WITH_GPUS:
                n = r.choice([1, 2])
                cluster.kubectl("patch", "sps", name(i), "-n", ns, "--type=merge", "-p",
                                json.dumps({"spec": {"decode": {"replicas": n}}}))
            elif what == "steps":
                n = r.choice([1, 2, 3])
                cluster.kubectl("patch", "sps", name(i), "-n", ns, "--type=merge", "-p", json.dumps(
                    {"spec": {"speculative": {"numSteps": n, "numDraftTokens": n + 1}}}))
            elif what == "recreate":
                cluster.kubectl("delete", "sps", name(i), "-n", ns, "--wait=true", "--timeout=60s")
                apply_all(cluster, ns, [spec_for(i)])
            elif what == "delete-child":
                # By labels: a pool's Deployment carries its PD-contract revision in its name.
                kind, role = r.choice(["service", "deployment", "poddisruptionbudget", "role"]), \
                    r.choice(["prefill", "decode", "router"])
                cluster.kubectl("delete", kind, "-l", f"specserving.io/instance={name(i)},specserving.io/role={role}",
                                "-n", ns, "--ignore-not-found", "--wait=false")
            elif what == "edit-child":
                cluster.kubectl("patch", "deployment", f"{name(i)}-router", "-n", ns, "--type=merge", "-p",
                                '{"spec":{"replicas":3}}', check=False)
            elif what == "delete":
                cluster.kubectl("delete", "sps", name(i), "-n", ns, "--wait=false")
                deleted.add(i)
            elif what == "restore" and i in deleted:
                # Its old incarnation may still be going: wait, then create it anew.
                old = name(i)
                wait_for(lambda n=old: cluster.get("specservings", n, ns) is None, 60, f"{old} to go")
                apply_all(cluster, ns, [spec_for(i)])
                deleted.discard(i)
            else:
                continue
            mutations.append(f"{k}:{what}:{i}")

    # The expected children are what `specserving render` prints; check the in-process renderer agrees once.
    sample = spec_for(0)
    assert {(c["kind"], c["metadata"]["name"]) for c in cli_render(cluster, sample, ns)} == \
        expected_children(sample, ns)

    plans = [draw_plan(k, r) for k in range(1, KILLS + 1)]
    with ApiProxy(chart_kubeconfig) as proxy:
        def start(k: int) -> Operator:
            """Incarnation k, to be killed by kill k+1 (the last one lives)."""
            plan = (plans[k] if k < KILLS else None) or KillPlan()
            log = tmp_path / f"operator-{k:03d}.log"
            logs.append(log)
            return Operator(cluster, ns, log, kubeconfig=proxy.kubeconfig, wait=not plan.first_request,
                            launched=lambda pid: incarnations.append(proxy.follow(pid, plan)))

        op = start(0)
        apply_all(cluster, ns, [spec_for(i) for i in range(COUNT)])
        started = time.monotonic()
        kill_points: list[str] = []
        mid_rollout = 0
        for k in range(1, KILLS + 1):
            plan, inc = plans[k - 1], incarnations[-1]
            if k % 2 or (plan and plan.nth):
                mutate(k)  # work in flight when the kill comes
            if plan is None:
                time.sleep(r.uniform(0, MAX_RUN_BEFORE_KILL))
                sigkill(op)
                point = f"at a random time ({inc.applies} child applies in)"
            elif inc.killed.wait(PLAN_WAIT):
                sigkill(op)  # already dead: reaps it and closes its log
                point = inc.killed_at
            else:
                sigkill(op)
                point = f"by time: the plan's child apply {plan.nth} never came ({inc.applies} applies in)"
            rolling = [o["metadata"]["name"] for o in cluster.list("specservings", ns)
                       if (o.get("status") or {}).get("rollout")]
            mid_rollout += bool(rolling)
            kill_points.append(point + (f", during the rollouts of {', '.join(rolling)}" if rolling else ""))
            if not k % 2:
                mutate(k)  # work waiting for the next incarnation
            op = start(k)
        try:
            mutate(KILLS + 1)
            last_restart = time.monotonic()
            print("kill points:\n  " + "\n  ".join(f"{i + 1}: {p}" for i, p in enumerate(kill_points)))
            print("changes: " + " ".join(mutations), flush=True)
            converged = await_converged(cluster, ns, CONVERGE_TIMEOUT, f"{COUNT} SpecServings after {KILLS} SIGKILLs")
            samples = op.metrics()
            errors = total(samples, "specserving_reconcile_errors_total")
            alive = op.proc.poll() is None
        finally:
            sigkill(op)
    before_first_pass = sum(p.startswith("before the first pass") for p in kill_points)
    inside_apply = sum(p.startswith("inside child apply") for p in kill_points)
    figure(f"operator SIGKILLed {KILLS} times with {COUNT} SpecServings over {last_restart - started:.0f}s "
           f"({len(mutations)} changes in between): {before_first_pass} before the first pass, {inside_apply} inside "
           f"a child apply (a later one of the same incarnation), {KILLS - before_first_pass - inside_apply} at "
           f"random times; {sum(i.applies for i in incarnations)} child applies through the proxy; all converged "
           f"{converged:.1f}s after the last changes; {errors:.0f} errors in the last incarnation; {mid_rollout} "
           f"kill(s) landed while a revision rollout ran")
    assert alive
    # The premise: kills landed where a crash does the most harm, not only between passes.
    assert before_first_pass >= 1 and inside_apply >= 1, kill_points

    # A stored object the operator has not seen yet must not matter: convergence held at the end, with nothing
    # duplicated. Now, with the operator dead, everything must still go away: no finalizer holds anything.
    cluster.kubectl("delete", "specservings", "--all", "-n", ns, "--wait=true", "--timeout=120s", timeout=180)
    gone_started = time.monotonic()
    wait_for(lambda: not cluster.list(CHILD_KINDS, ns, "specserving.io/instance"), 120,
             "every child garbage-collected with the operator dead")
    wait_for(lambda: not [p for p in cluster.list("pods", ns, "specserving.io/instance")], 120, "every pool pod gone")
    figure(f"all {COUNT} SpecServings deleted with the operator dead: children and pods gone in "
           f"{time.monotonic() - gone_started:.1f}s (no finalizer)")

    text = "".join(log.read_text() for log in logs)
    assert not tracebacks(text), "a traceback in the operator's log:\n" + "\n".join(tracebacks(text)[:20])
    forbidden = forbidden_lines(text)
    assert not forbidden, "the chart's RBAC refused the operator:\n" + "\n".join(forbidden[:10])


ROLLOUT_KILLS = size(6, 20)


def test_sigkill_during_revision_rollouts_leaves_no_orphaned_revision(cluster: Cluster, namespace: str,
                                                                    crd: None, chart_kubeconfig: Path,
                                                                    tmp_path: Path) -> None:
    """Every round changes the PD contract of every SpecServing (speculative steps: a new revision each time),
    lets the operator work for 0.3-2.5 s, and SIGKILLs it; half the rounds also change it again while it is
    dead, so a rollout is replaced mid-way. After the last restart every SpecServing converges to exactly its
    current revision's children: no revision is orphaned, none is left half-drained."""
    ns, r = namespace, rng("rollout crash")
    count = size(10, 16)
    logs: list[Path] = []

    def start(k: int) -> Operator:
        log = tmp_path / f"operator-{k:02d}.log"
        logs.append(log)
        return Operator(cluster, ns, log, kubeconfig=chart_kubeconfig)

    def change(steps: int) -> None:
        apply_all(cluster, ns, [small(f"roll-{i:03d}", decode=2, **{
            "spec.speculative.numSteps": steps, "spec.speculative.numDraftTokens": steps + 1,
            "spec.rollout": {"strategy": r.choice(["Surge", "Stepped"]), "maxSurge": 1}}) for i in range(count)])

    op = start(0)
    change(1)
    await_converged(cluster, ns, CONVERGE_TIMEOUT, f"{count} SpecServings before the first kill")
    mid_rollout, steps = [], 1
    try:
        for k in range(1, ROLLOUT_KILLS + 1):
            steps = steps % 3 + 1
            change(steps)
            time.sleep(r.uniform(0.3, 2.5))
            rolling = [o["metadata"]["name"] for o in cluster.list("specservings", ns)
                       if (o.get("status") or {}).get("rollout")]
            sigkill(op)
            mid_rollout.append(len(rolling))
            if k % 2:
                steps = steps % 3 + 1
                change(steps)  # a new revision while the operator is dead: the unfinished one must go
            op = start(k)
        converged = await_converged(cluster, ns, CONVERGE_TIMEOUT, f"{count} SpecServings after rollout kills")
        alive = op.proc.poll() is None
    finally:
        sigkill(op)
    revisions = {(d["metadata"]["labels"]["specserving.io/instance"], d["metadata"]["labels"].get(
        "specserving.io/revision")) for d in cluster.list("deployments", ns, "specserving.io/instance")
        if d["metadata"]["labels"].get("specserving.io/role") != "router"}
    assert len(revisions) == count, f"more than one revision per SpecServing is left: {sorted(revisions)}"
    figure(f"operator SIGKILLed {ROLLOUT_KILLS} times during revision rollouts of {count} SpecServings; "
           f"SpecServings mid-rollout at each kill: {mid_rollout}; converged {converged:.1f}s after the last "
           "restart with one revision each")
    assert alive
    assert sum(1 for n in mid_rollout if n) >= 1, "no kill landed while a rollout ran: the test proved nothing"
    text = "".join(log.read_text() for log in logs)
    assert not tracebacks(text), "a traceback in the operator's log:\n" + "\n".join(tracebacks(text)[:20])
    forbidden = forbidden_lines(text)
    assert not forbidden, "the chart's RBAC refused the operator:\n" + "\n".join(forbidden[:10])
