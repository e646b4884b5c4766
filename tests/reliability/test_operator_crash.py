"""SIGKILL the operator at random points while it reconciles many SpecServings; every one must converge.

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

CI size: 10 SpecServings, 4 kills. SPECSERVING_RELIABILITY=full: 100 SpecServings, 20 kills.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from cluster.kube import Cluster, wait_for
from cluster.operating import CHILD_KINDS, Operator, total

from .faults import (
    FULL,
    apply_all,
    await_converged,
    cli_render,
    expected_children,
    figure,
    rng,
    sigkill,
    size,
    small,
    tracebacks,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800 if FULL else 420)]

COUNT = size(10, 100)
KILLS = size(4, 20)
# Pools with pods: every SpecServing in CI (20 GPUs of 64), the first 16 at full size (48 GPUs at most when their
# decode pools scale to 2); the others have empty GPU pools and only a router pod.
WITH_GPUS = size(10, 16)
MAX_RUN_BEFORE_KILL = 5.0  # seconds the operator runs before a kill, drawn uniformly from [0, this)
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


def test_sigkill_at_random_points_converges_without_duplicates_or_orphans(cluster: Cluster, namespace: str,
                                                                         crd: None, tmp_path: Path) -> None:
    ns, r = namespace, rng("operator crash")
    logs: list[Path] = []
    reconciles = 0.0
    mutations: list[str] = []
    deleted: set[int] = set()

    def start(k: int) -> Operator:
        log = tmp_path / f"operator-{k:02d}.log"
        logs.append(log)
        return Operator(cluster, ns, log)

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

    op = start(0)
    apply_all(cluster, ns, [spec_for(i) for i in range(COUNT)])
    started = time.monotonic()
    kill_points: list[str] = []
    mid_rollout = 0
    for k in range(1, KILLS + 1):
        if k % 2:
            mutate(k)  # work in flight when the kill comes
        time.sleep(r.uniform(0, MAX_RUN_BEFORE_KILL))
        before = scrape(op)
        reconciles += total(before, "specserving_reconcile_total")
        kill_points.append(f"after {total(before, 'specserving_reconcile_total'):.0f} passes, "
                           f"{total(before, 'specserving_child_applies_total'):.0f} applies")
        rolling = [o["metadata"]["name"] for o in cluster.list("specservings", ns)
                   if (o.get("status") or {}).get("rollout")]
        mid_rollout += bool(rolling)
        sigkill(op)
        if rolling:
            kill_points[-1] += f", during the rollouts of {', '.join(rolling)}"
        if not k % 2:
            mutate(k)  # work waiting for the next incarnation
        op = start(k)
    try:
        mutate(KILLS + 1)
        last_restart = time.monotonic()
        print("kill points: " + "; ".join(kill_points))
        print("changes: " + " ".join(mutations), flush=True)
        converged = await_converged(cluster, ns, CONVERGE_TIMEOUT, f"{COUNT} SpecServings after {KILLS} SIGKILLs")
        samples = op.metrics()
        reconciles += total(samples, "specserving_reconcile_total")
        errors = total(samples, "specserving_reconcile_errors_total")
        alive = op.proc.poll() is None
    finally:
        sigkill(op)
    figure(f"operator SIGKILLed {KILLS} times at random points over {last_restart - started:.0f}s with "
           f"{COUNT} SpecServings ({len(mutations)} changes in between); all converged {converged:.1f}s after the "
           f"last changes; "
           f"{reconciles:.0f} reconcile passes counted (kills lose the counts since their last scrape), "
           f"{errors:.0f} errors in the last incarnation; {mid_rollout} kill(s) landed while a revision rollout "
           f"ran")
    assert alive

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


ROLLOUT_KILLS = size(6, 20)


def test_sigkill_during_revision_rollouts_leaves_no_orphaned_revision(cluster: Cluster, namespace: str,
                                                                    crd: None, tmp_path: Path) -> None:
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
        return Operator(cluster, ns, log)

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
