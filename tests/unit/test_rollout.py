"""The rollout planner (specserving.rollout) and the PD contract it rolls (rendering/contract.py): which changes make
a new revision, the step tables, and the invariants over random, partly progressing clusters."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specserving.api.loading import spec_of
from specserving.rendering.contract import changed, fields, revision
from specserving.rendering.image import ResolvedImage, base_image
from specserving.rollout import (DRAINING_OLD, ROLES, SCALING_DOWN_OLD, SCALING_UP_NEW, SWITCHING_ROUTER, Pools,
                                 Router, Strategy, decide, plan)

from .builders import seed


def rev(**changes: Any) -> str:
    spec = spec_of(seed(**changes))
    return revision(spec, base_image(spec))


BASE = rev()


@pytest.mark.parametrize("changes", [
    {"spec.decode.replicas": 5},
    {"spec.prefill.replicas": 3},
    {"spec.router.policy": "round_robin", "spec.router.replicas": 2},
    {"spec.decode.resources": {"limits": {"memory": "900Gi"}}},
    {"spec.decode.extraArgs": ["--cuda-graph-max-bs", "64"]},
    {"spec.prefill.env": [{"name": "SGLANG_LOCAL_ONLY", "value": "1"}]},
    {"spec.decode.terminationGracePeriodSeconds": 120},
    {"spec.rollout.strategy": "Stepped"},
    {"spec.engine.maxRunningRequests": 64},
])
def test_changes_outside_the_contract_keep_the_revision(changes: dict[str, Any]) -> None:
    assert rev(**changes) == BASE


@pytest.mark.parametrize("changes", [
    {"spec.image.base": "lmsysorg/sglang:v0.5.22-cu129"},
    {"spec.speculative.algorithm": "EAGLE3", "spec.speculative.draftModelPath": "/data2/draft"},
    {"spec.speculative.numSteps": 4},
    {"spec.engine.tp": 4, "spec.engine.dp": 4, "spec.transfer.ibDevices": [f"mlx5_{i}" for i in range(4)]},
    {"spec.engine.enableDpAttention": False, "spec.engine.dp": 1},
    {"spec.transfer.backend": "nixl"},
    {"spec.model.path": "/data2/another"},
    {"spec.engine.port": 31000},
    {"spec.prefill.speculativeDecoding": "Disabled"},
    {"spec.engine.extraArgs": ["--page-size", "64"]},
    {"spec.prefill.extraArgs": ["--kv-cache-dtype=fp8_e4m3"], "spec.decode.extraArgs": ["--kv-cache-dtype=fp8_e4m3"]},
    {"spec.decode.extraArgs": ["--context-length", "65536"]},
    {"spec.engine.env": [{"name": "SGLANG_RAGGED_VERIFY_MODE", "value": "1"}]},
    {"spec.decode.nodesPerReplica": 2, "spec.prefill.nodesPerReplica": 2,
     "spec.transfer.ibDevices": [f"mlx5_{i}" for i in range(4)]},
])
def test_contract_changes_make_a_new_revision(changes: dict[str, Any]) -> None:
    assert rev(**changes) != BASE


def test_the_resolved_image_is_part_of_the_contract() -> None:
    spec = spec_of(seed())
    built = ResolvedImage("registry.local/sglang-pd@sha256:" + "a" * 64, "0.5.23", fix_applied=True)
    assert revision(spec, built) != revision(spec, base_image(spec))


def test_changed_names_the_fields_that_bump() -> None:
    a, b = spec_of(seed()), spec_of(seed(**{"spec.speculative.algorithm": "EAGLE3",
                                            "spec.speculative.draftModelPath": "/data2/draft",
                                            "spec.decode.replicas": 9}))
    assert changed(fields(a, base_image(a)), fields(b, base_image(b))) == ["spec.speculative"]


def test_revision_is_eight_hex_digits_and_stable() -> None:
    assert len(BASE) == 8 and int(BASE, 16) >= 0 and rev() == BASE


def steps(source: dict[str, int], wanted: dict[str, int], surge: int | None) -> list[tuple[str, str]]:
    return [(s.step, s.description) for s in plan("aaaa", source, "bbbb", wanted, Strategy(surge))]


def test_surge_with_one_replica_per_role() -> None:
    one = {"prefill": 1, "decode": 1}
    assert steps(one, one, None) == [
        (SCALING_UP_NEW, "revision bbbb to prefill 1, decode 1"),
        (SWITCHING_ROUTER, "router from revision aaaa to bbbb"),
        (DRAINING_OLD, "revision aaaa drained and deleted; revision bbbb to prefill 1, decode 1"),
    ]


def test_stepped_gives_back_what_the_new_revision_holds_ready() -> None:
    four = {"prefill": 1, "decode": 4}
    assert steps(four, four, 1) == [
        (SCALING_UP_NEW, "revision bbbb to prefill 1, decode 1"),
        (SCALING_DOWN_OLD, "revision aaaa to prefill 1, decode 3"),
        (SCALING_UP_NEW, "revision bbbb to prefill 1, decode 2"),
        (SCALING_DOWN_OLD, "revision aaaa to prefill 1, decode 2"),
        (SWITCHING_ROUTER, "router from revision aaaa to bbbb"),
        (DRAINING_OLD, "revision aaaa drained and deleted; revision bbbb to prefill 1, decode 4"),
    ]


def test_first_creation_is_no_rollout() -> None:
    d = decide("bbbb", {"prefill": 1, "decode": 2}, Strategy(), {}, Router(None))
    assert not d.rolling and d.router == "bbbb" and d.replicas == {"bbbb": {"prefill": 1, "decode": 2}}
    assert plan(None, {}, "bbbb", {"prefill": 1, "decode": 2}, Strategy()) == []


def test_a_revision_replaced_mid_rollout_is_drained_at_once() -> None:
    pools = {"aaaa": Pools({"prefill": 1, "decode": 1}, {"prefill": 1, "decode": 1}, 2),
             "bbbb": Pools({"prefill": 1, "decode": 1}, {"prefill": 0, "decode": 0}, 2)}
    d = decide("cccc", {"prefill": 1, "decode": 1}, Strategy(), pools, Router("aaaa"))
    assert d.replicas["bbbb"] == {"prefill": 0, "decode": 0} and d.router == "aaaa"
    assert d.replicas["cccc"] == {"prefill": 1, "decode": 1}


def test_the_router_waits_for_its_own_rollout_before_the_old_revision_drains() -> None:
    pools = {"aaaa": Pools({"prefill": 1, "decode": 1}, {"prefill": 1, "decode": 1}, 2),
             "bbbb": Pools({"prefill": 1, "decode": 1}, {"prefill": 1, "decode": 1}, 2)}
    d = decide("bbbb", {"prefill": 1, "decode": 1}, Strategy(), pools, Router("bbbb", settled=False))
    assert d.step == SWITCHING_ROUTER and "aaaa" not in d.replicas and not d.delete
    d = decide("bbbb", {"prefill": 1, "decode": 1}, Strategy(), pools, Router("bbbb", settled=True))
    assert d.step == DRAINING_OLD and d.replicas["aaaa"] == {"prefill": 0, "decode": 0} and not d.delete
    drained = {**pools, "aaaa": Pools({"prefill": 0, "decode": 0}, {}, 0)}
    d = decide("bbbb", {"prefill": 1, "decode": 1}, Strategy(), drained, Router("bbbb"))
    assert d.delete == {"aaaa"}


counts = st.integers(min_value=0, max_value=5)


@settings(max_examples=300, deadline=None)
@given(old=st.fixed_dictionaries({"prefill": st.integers(1, 5), "decode": st.integers(1, 5)}),
       wanted=st.fixed_dictionaries({"prefill": counts, "decode": counts}),
       surge=st.one_of(st.none(), st.integers(1, 4)),
       world=st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), min_size=60, max_size=60))
def test_invariants_hold_while_the_cluster_lags(old: dict[str, int], wanted: dict[str, int], surge: int | None,
                                                world: list[tuple[bool, bool, bool]]) -> None:
    """Each pass: decide, apply, then the cluster makes some progress (pods get Ready, drained pods go, the
    router's rollout ends) or none. The rollout never pairs an unready revision, never leaves the serving one
    without a replica of a role it had, stays within the surge, and finishes once the cluster catches up."""
    pools = {"aaaa": Pools(dict(old), dict(old), sum(old.values()))}
    router = Router("aaaa")
    strategy = Strategy(surge)
    live = [r for r in ROLES if wanted[r] > 0]
    for ready_up, pods_go, router_done in world + [(True, True, True)] * 40:
        d = decide("bbbb", wanted, strategy, pools, router)
        new = pools.get("bbbb", Pools({}))
        if d.router == "bbbb" and router.revision == "aaaa":  # this pass switches
            assert all(new.ready_of(r) >= 1 and new.ready_of(r) >= min(wanted[r], pools["aaaa"].get(r))
                       for r in live)
        if d.router == "aaaa" and "aaaa" in d.replicas:
            assert all(d.replicas["aaaa"][r] >= 1 for r in ROLES if old[r] > 0)
        if surge is not None and "aaaa" in pools and router.revision == "aaaa":
            for r in ROLES:
                now_old = d.replicas.get("aaaa", pools["aaaa"].replicas).get(r, 0)
                assert d.replicas["bbbb"][r] + now_old <= max(wanted[r], old[r]) + surge
        # the cluster applies the decision and perhaps progresses
        nxt: dict[str, Pools] = {}
        for name, p in pools.items():
            if name in d.delete:
                continue
            reps = dict(d.replicas.get(name, p.replicas))
            ready = {r: min(reps.get(r, 0), p.ready_of(r) + (1 if ready_up else 0)) for r in ROLES}
            pods = sum(reps.values()) if pods_go else max(p.pods, sum(reps.values()))
            nxt[name] = Pools(reps, ready, pods)
        if "bbbb" not in nxt and "bbbb" in d.replicas:
            nxt["bbbb"] = Pools(dict(d.replicas["bbbb"]), {}, sum(d.replicas["bbbb"].values()))
        pools = nxt
        router = Router(d.router, settled=router.revision == d.router and (router.settled or router_done))
    final = decide("bbbb", wanted, strategy, pools, router)
    assert not final.rolling and set(pools) == {"bbbb"} and final.router == "bbbb"
    assert final.replicas["bbbb"] == wanted


def test_the_router_switch_ends_only_when_no_router_pod_of_the_old_template_is_left() -> None:
    from specserving.reconcile.observed import child_of, pod_of
    from specserving.reconcile.rollouts import observe

    def router_pod(name: str, revision: str, deleting: bool = False) -> Any:
        meta: dict[str, Any] = {"name": name, "labels": {"specserving.io/role": "router",
                                                         "specserving.io/revision": revision}}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return pod_of({"metadata": meta, "status": {"phase": "Running"}})

    deployment = child_of({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "sv-router", "generation": 2, "uid": "r", "ownerReferences": [{"uid": "u"}],
                     "labels": {"specserving.io/role": "router"}},
        "spec": {"replicas": 1, "template": {"metadata": {"labels": {"specserving.io/revision": "bbbb"}}}},
        "status": {"observedGeneration": 2, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}}, workload=True)
    children = {deployment.ref: deployment}
    # The Deployment counts only the new pod; the old one is still in its preStop and may get requests.
    draining = observe(("ns", "sv"), "u", children, [router_pod("a", "aaaa", deleting=True), router_pod("b", "bbbb")])
    assert draining.router.revision == "bbbb" and not draining.router.settled
    gone = observe(("ns", "sv"), "u", children, [router_pod("b", "bbbb")])
    assert gone.router.settled
