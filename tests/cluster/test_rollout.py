"""Rollouts between PD-contract revisions on the real control plane (kwok plays the pods): an image change, an
algorithm change EAGLE3 -> DSPARK and a tp/dp change, each watched from before the apply to the end.

The watch (kubectl --watch of pods, Deployments and the SpecServing, merged in resourceVersion order) is replayed
event by event, and at every instant:
- every router pod selects exactly one revision, for prefill and decode alike;
- a router pod of the new revision appears only once both of that revision's pools have their Ready replicas;
- under Surge with 1-replica pools, some Ready router pod pairs a revision with a Ready prefill and a Ready decode;
and afterwards the old revision is gone. The steps the SpecServing reported equal `specserving plan --live`'s.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.operator import SPECSERVING

from .kube import Cluster, condition, wait_for
from .operating import NAME, READY_TIMEOUT, apply_ready, crd, operator, pods, ready, seed, sps

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300), pytest.mark.usefixtures("operator")]
__all__ = ["crd", "operator"]  # fixtures, used by name

REVISION = "specserving.io/revision"
ROLLOUT_TIMEOUT = 120


class Watch:
    """`kubectl get KIND --watch` of this SpecServing's objects, every event kept with its resourceVersion."""

    def __init__(self, cluster: Cluster, ns: str, kinds: tuple[str, ...]) -> None:
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        self.procs: list[subprocess.Popen[str]] = []
        self.threads: list[threading.Thread] = []
        for kind in kinds:
            args = [str(cluster.bin_dir / "kubectl"), "get", kind, "-n", ns, "--watch", "--output-watch-events",
                    "-o", "json"]
            if kind != "specservings":
                args += ["-l", f"specserving.io/instance={NAME}"]
            proc = subprocess.Popen(args, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    text=True)
            self.procs.append(proc)
            thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _read(self, proc: subprocess.Popen[str]) -> None:
        decoder, buf = json.JSONDecoder(), ""
        assert proc.stdout is not None
        for line in proc.stdout:
            buf += line
            while buf.strip():
                try:
                    event, end = decoder.raw_decode(buf.lstrip())
                except json.JSONDecodeError:
                    break
                buf = buf.lstrip()[end:]
                obj = event["object"]
                with self.lock:
                    self.events.append((int(obj["metadata"]["resourceVersion"]), event["type"], obj))

    def mark(self) -> int:
        """The resourceVersion up to which the watches' first events (a snapshot, not a history) reach."""
        with self.lock:
            return max((rv for rv, _, _ in self.events), default=0)

    def stop(self) -> list[tuple[int, str, dict[str, Any]]]:
        time.sleep(1)  # the last events reach the readers
        for proc in self.procs:
            proc.terminate()
            proc.wait(10)
        for thread in self.threads:
            thread.join(10)
        for proc in self.procs:
            assert proc.stdout is not None
            proc.stdout.close()
        with self.lock:
            return sorted(self.events, key=lambda e: e[0])


def pod_ready(p: dict[str, Any]) -> bool:
    return not p["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or [])


def router_revisions(p: dict[str, Any]) -> set[str]:
    args = p["spec"]["containers"][0]["args"]
    return {a.split("=", 1)[1] for a in args if a.startswith(f"{REVISION}=")}


@dataclass
class Replay:
    """The cluster as the watch saw it, rebuilt one event at a time, with what each instant showed."""

    wanted_full: dict[str, int]
    surge: bool
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)
    steps: list[tuple[str, str]] = field(default_factory=list)
    router_revisions_seen: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    gaps: int = 0
    checking: bool = False

    def ready_pool(self, rev: str, role: str) -> int:
        return sum(1 for p in self.pods.values() if p["metadata"]["labels"].get("specserving.io/role") == role
                   and p["metadata"]["labels"].get(REVISION) == rev and pod_ready(p))

    def apply(self, rv: int, kind: str, type_: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "SpecServing":
            r = (obj.get("status") or {}).get("rollout")
            if r and (not self.steps or self.steps[-1] != (r["step"], r["description"])):
                self.steps.append((r["step"], r["description"]))
            return
        store = self.pods if kind == "Pod" else self.deployments
        if type_ == "DELETED":
            store.pop(name, None)
            return
        if kind == "Pod" and obj["metadata"]["labels"].get("specserving.io/role") == "router" \
                and name not in self.pods:
            revs = router_revisions(obj)
            if len(revs) != 1:
                self.violations.append(f"rv {rv}: router pod {name} selects revisions {sorted(revs)}")
            (rev,) = revs or {""}
            if rev not in self.router_revisions_seen:
                self.router_revisions_seen.append(rev)
                if self.checking and len(self.router_revisions_seen) > 1:  # a router pod of a new revision: are its pools Ready?
                    for role, n in self.wanted_full.items():
                        if self.ready_pool(rev, role) < (n if self.surge else 1):
                            self.violations.append(f"rv {rv}: router pod {name} pairs revision {rev} while only "
                                                   f"{self.ready_pool(rev, role)} {role} pod(s) of it are Ready")
        store[name] = obj
        if kind == "Pod" and self.surge and self.checking:
            serving = [p for p in self.pods.values() if p["metadata"]["labels"].get("specserving.io/role") == "router"
                       and pod_ready(p) and all(self.ready_pool(r, role) >= 1 for r in router_revisions(p)
                                                for role in ("prefill", "decode"))]
            if not serving:
                self.gaps += 1
                self.violations.append(f"rv {rv}: no Ready router pod pairs a Ready prefill and decode")


def replay(events: list[tuple[int, str, dict[str, Any]]], snapshot: int, wanted: dict[str, int],
           surge: bool) -> Replay:
    """Replay `events`; those up to `snapshot` (the watches' initial listing, taken before the apply while
    nothing changed) are the starting state, checked from there on."""
    r = Replay(wanted, surge)
    for rv, type_, obj in events:
        r.checking = rv > snapshot
        r.apply(rv, obj["kind"], type_, obj)
    return r


def plan_live(cluster: Cluster, ns: str, obj: dict[str, Any], tmp: Path) -> list[tuple[str, str]]:
    path = tmp / "new.yaml"
    path.write_text(yaml.safe_dump(obj))
    out = subprocess.run([SPECSERVING, "plan", "-f", str(path), "--live", "-n", ns,
                          "--kubeconfig", str(cluster.kubeconfig)],
                         capture_output=True, text=True, env=cluster.env, timeout=60)
    assert out.returncode == 0, out.stderr
    print(f"\nspecserving plan --live:\n{out.stdout}")
    return [(m[1], m[2]) for m in re.finditer(r"^\s+\d+\. (\w+): (.+)$", out.stdout, re.M)]


def roll(cluster: Cluster, ns: str, before: dict[str, Any], after: dict[str, Any], tmp: Path,
         surge: bool) -> tuple[Replay, float, str, str]:
    obj, _ = apply_ready(cluster, ns, before)
    old_rev = obj["status"]["revision"]
    planned = plan_live(cluster, ns, after, tmp)
    watch = Watch(cluster, ns, ("pods", "deployments", "specservings"))
    wait_for(lambda: len({obj["kind"] for _, _, obj in watch.events}) == 3, 20, "the watches' first events")
    time.sleep(1)
    snapshot = watch.mark()
    started = time.monotonic()
    cluster.apply(after, namespace=ns)
    done = wait_for(lambda: (o := ready(cluster, ns)) and "rollout" not in o["status"]
                    and o["status"]["revision"] != old_rev and o["status"].get("servingRevision") == o["status"][
                        "revision"] and o, ROLLOUT_TIMEOUT, "the rollout to finish")
    seconds = time.monotonic() - started
    new_rev = done["status"]["revision"]
    wait_for(lambda: not [d for d in cluster.list("deployments", ns, f"specserving.io/instance={NAME}")
                          if d["metadata"]["labels"].get(REVISION, new_rev) != new_rev], 60,
             "the old revision's Deployments to be deleted")
    wait_for(lambda: all(p["metadata"]["labels"].get(REVISION) == new_rev or p["metadata"]["labels"][
        "specserving.io/role"] == "router" for p in cluster.list("pods", ns, f"specserving.io/instance={NAME}")),
             60, "the old revision's pods to be gone")
    events = watch.stop()
    wanted = {"prefill": after["spec"]["prefill"]["replicas"], "decode": after["spec"]["decode"]["replicas"]}
    r = replay(events, snapshot, wanted, surge)
    assert not r.violations, "\n".join(r.violations[:20])
    assert r.router_revisions_seen == [old_rev, new_rev], r.router_revisions_seen
    assert r.steps == planned, f"observed {r.steps}\nplanned {planned}"
    print(f"figure: rollout {old_rev} -> {new_rev}: {seconds:.1f}s from apply, {len(events)} watch events, "
          f"steps {[s for s, _ in r.steps]}")
    return r, seconds, old_rev, new_rev


def small(**changes: Any) -> dict[str, Any]:
    return seed(**{"spec.prefill.replicas": 1, "spec.decode.replicas": 1, **changes})


def test_image_change_surges_a_new_revision_and_never_pairs_two(cluster: Cluster, namespace: str,
                                                               tmp_path: Path) -> None:
    r, seconds, old, new = roll(cluster, namespace, small(),
                                small(**{"spec.image.base": "lmsysorg/sglang:v0.5.18-cu129"}), tmp_path, True)
    assert [s for s, _ in r.steps] == ["ScalingUpNew", "SwitchingRouter", "DrainingOld"]
    obj = sps(cluster, namespace)
    assert obj["status"]["image"]["resolved"] == "lmsysorg/sglang:v0.5.18-cu129"
    reasons = [e["reason"] for e in cluster.list("events", namespace)
               if e["involvedObject"].get("kind") == "SpecServing"]
    assert {"ScalingUpNew", "SwitchingRouter", "DrainingOld"} <= set(reasons)

    # The same pods rolled by the Deployment controller alone (a change outside the contract, in place).
    started = time.monotonic()
    gen = obj["metadata"]["generation"]
    pool_gen = {role: cluster.pool(NAME, role, namespace)["metadata"]["generation"] for role in ("prefill", "decode")}
    cluster.apply(small(**{"spec.image.base": "lmsysorg/sglang:v0.5.18-cu129",
                           "spec.decode.resources": {"requests": {"memory": "1Gi"}},
                           "spec.prefill.resources": {"requests": {"memory": "1Gi"}}}), namespace=namespace)
    wait_for(lambda: (o := ready(cluster, namespace)) and o["metadata"]["generation"] > gen and all(
        (d := cluster.pool(NAME, role, namespace)) and d["metadata"]["generation"] > pool_gen[role]
        and d["status"].get("observedGeneration") == d["metadata"]["generation"]
        and d["status"].get("updatedReplicas") == d["status"].get("replicas") == d["status"].get("readyReplicas")
        == 1 for role in ("prefill", "decode")) and o, ROLLOUT_TIMEOUT, "the in-place rollout")
    in_place = time.monotonic() - started
    assert sps(cluster, namespace)["status"]["revision"] == new
    print(f"figure: revision rollout {seconds:.1f}s against an in-place Deployment rollout of the same pods "
          f"{in_place:.1f}s (ratio {seconds / in_place:.2f})")


def test_algorithm_change_eagle3_to_dspark_steps_without_pairing_across(cluster: Cluster, namespace: str,
                                                                        tmp_path: Path) -> None:
    eagle3 = {"spec.speculative.algorithm": "EAGLE3", "spec.speculative.draftModelPath": "/data2/draft",
              "spec.rollout": {"strategy": "Stepped", "maxSurge": 1}}
    before = seed(**{"spec.prefill.replicas": 1, "spec.decode.replicas": 2, **eagle3})
    after = seed(**{"spec.prefill.replicas": 1, "spec.decode.replicas": 2,
                    "spec.rollout": {"strategy": "Stepped", "maxSurge": 1}})
    r, _, old, new = roll(cluster, namespace, before, after, tmp_path, False)
    assert [s for s, _ in r.steps] == ["ScalingUpNew", "ScalingDownOld", "SwitchingRouter", "DrainingOld"]
    # The EAGLE3 decode and the DSPARK decode never ran under one router pod's selectors.
    for p in cluster.list("pods", namespace, f"specserving.io/instance={NAME},specserving.io/role=decode"):
        args = p["spec"]["containers"][0]["args"]
        assert args[args.index("--speculative-algorithm") + 1] == "DSPARK"


def test_tp_dp_change_and_changes_outside_the_contract(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    before = seed(**{"spec.prefill.replicas": 1, "spec.decode.replicas": 2})
    after = seed(**{"spec.prefill.replicas": 1, "spec.decode.replicas": 2, "spec.engine.dp": 4})
    r, _, old, new = roll(cluster, namespace, before, after, tmp_path, True)
    decode = cluster.pool(NAME, "decode", namespace)
    assert decode is not None and decode["metadata"]["name"] == f"{NAME}-decode-{new}"
    args = decode["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--dp-size") + 1] == "4"

    # Decode replicas and the router policy are outside the contract: no new revision, no rollout.
    gen = sps(cluster, namespace)["metadata"]["generation"]
    cluster.apply(seed(**{"spec.prefill.replicas": 1, "spec.decode.replicas": 3, "spec.engine.dp": 4,
                          "spec.router.policy": "round_robin"}), namespace=namespace)
    obj = wait_for(lambda: (o := ready(cluster, namespace)) and o["metadata"]["generation"] > gen
                   and o["status"]["decode"]["readyReplicas"] == 3
                   and condition(o, "Progressing")["reason"] == "RolloutComplete" and o, READY_TIMEOUT,
                   "decode scaled to 3 and the router rolled in place")
    assert obj["status"]["revision"] == new and "rollout" not in obj["status"]
    names = {d["metadata"]["name"] for d in cluster.list("deployments", namespace,
                                                          f"specserving.io/instance={NAME}")}
    assert names == {f"{NAME}-prefill-{new}", f"{NAME}-decode-{new}", f"{NAME}-router"}
    assert len(pods(cluster, namespace, "decode")) == 3


def test_a_new_revision_that_cannot_schedule_leaves_the_old_one_serving(cluster: Cluster, namespace: str,
                                                                        tmp_path: Path) -> None:
    obj, _ = apply_ready(cluster, namespace, small())
    old = obj["status"]["revision"]
    blocked = small(**{"spec.speculative.numSteps": 3, "spec.decode.nodeSelector": {"no-such-node": "true"}})
    cluster.apply(blocked, namespace=namespace)
    obj = wait_for(lambda: (o := sps(cluster, namespace)) and (c := condition(o, "Progressing"))
                   and c["reason"] == "NewRevisionUnschedulable" and o, 60, "NewRevisionUnschedulable")
    message = condition(obj, "Progressing")["message"]
    assert f"revision {old} keeps serving" in message and "node" in message, message
    assert obj["status"]["servingRevision"] == old and condition(obj, "Ready")["status"] == "True"
    router = cluster.get("deployment", f"{NAME}-router", namespace)
    assert router["spec"]["template"]["metadata"]["labels"][REVISION] == old
