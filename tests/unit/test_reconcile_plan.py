"""The plan of one generation (validate, resolve image, render), deletion costs, and the operator's metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from specserving.metrics import Metrics
from specserving.reconcile.costs import annotated_load, candidates, costs, running_requests
from specserving.reconcile.observed import pod_of
from specserving.reconcile.plan import make_plan

from .builders import seed


def stored(**changes: object) -> dict:
    obj = seed(**changes)
    obj["metadata"].update(namespace="ns", uid="u1", generation=4, resourceVersion="9",
                           managedFields=[{"manager": "kubectl"}], annotations={"a": "b"})
    obj["status"] = {"phase": "Ready", "kopf": {}}
    return obj


def test_an_admitted_generation_renders_owned_children() -> None:
    plan = make_plan(stored())
    assert plan.admitted and plan.unrunnable is None
    assert (plan.uid, plan.generation) == ("u1", 4)
    assert plan.desired() == {"prefill": 1, "decode": 2, "router": 1}
    assert all(c["metadata"]["ownerReferences"][0]["uid"] == "u1" for c in plan.children)
    assert all(c["metadata"]["namespace"] == "ns" for c in plan.children)
    assert plan.image_status() == {"base": "lmsysorg/sglang:v0.5.17-cu129", "resolved": "lmsysorg/sglang:v0.5.17-cu129",
                                   "fixApplied": False, "sglangVersion": "0.5.17",
                                   "pdBuilders": ["DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP"]}


def test_an_invalid_generation_has_errors_and_no_children() -> None:
    plan = make_plan(stored(**{"spec.speculative.algorithm": "NGRAM"}))
    assert not plan.admitted and plan.children == ()
    assert plan.errors[0].startswith('spec.speculative.algorithm: Unsupported value: "NGRAM"')


def test_an_algorithm_only_the_fix_supplies_is_not_started_on_the_base_image() -> None:
    # 0.5.17 has DFLASH only with the fix (and, before 0.5.23, without DP attention).
    plan = make_plan(stored(**{"spec.speculative.algorithm": "DFLASH", "spec.speculative.draftModelPath": "/data2/d",
                               "spec.engine.enableDpAttention": False, "spec.engine.dp": 1}))
    assert plan.admitted and plan.children == ()
    assert "has no PD-decode draft-input builder for DFLASH" in (plan.unrunnable or "")


def pod(name: str, load: str | None = None, ready: bool = True, cost: str | None = None) -> dict:
    ann = {k: v for k, v in {"specserving.io/load": load,
                             "controller.kubernetes.io/pod-deletion-cost": cost}.items() if v is not None}
    return {"metadata": {"name": name, "annotations": ann, "labels": {"specserving.io/role": "decode"}},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}]}}


def test_deletion_costs_follow_load_and_skip_unchanged() -> None:
    pods = [pod_of(p) for p in (pod("a", "5"), pod("b", "0.4", cost="0"), pod("c"), pod("d", "9", ready=False))]
    cands = candidates(pods)
    assert [p.name for p in cands] == ["a", "b", "c"]
    loads = {p.name: v for p in cands if (v := annotated_load(p)) is not None}
    assert costs(cands, loads) == {"a": "5"}  # b already has cost 0; c has no signal


def test_running_requests_sums_dp_ranks() -> None:
    text = ('# HELP sglang:num_running_reqs x\n'
            'sglang:num_running_reqs{dp_rank="0",model_name="m"} 3.0\n'
            'sglang:num_running_reqs{dp_rank="1",model_name="m"} 4.0\n'
            'sglang:num_queue_reqs{dp_rank="0"} 9.0\n')
    assert running_requests(text) == 7.0
    assert running_requests("nothing here") is None


def test_metric_names_follow_prometheus_conventions() -> None:
    m = Metrics(CollectorRegistry())
    m.observe_reconcile("applied", 0.01)
    m.observe_reconcile("error", 0.02, "ApiError")
    m.count_request("APPLY", "deployments", 200)
    m.set_state("ns", "sv", "Ready", {"decode": (1, 2)})
    m.set_state("ns", "other", "Progressing", {"decode": (0, 2)})
    text = generate_latest(m.registry).decode()
    for line in ('specserving_reconcile_total{result="applied"} 1.0',
                 'specserving_reconcile_errors_total{reason="ApiError"} 1.0',
                 'specserving_reconcile_duration_seconds_count{result="error"} 1.0',
                 'specserving_specservings{phase="Ready"} 1.0',
                 'specserving_specservings{phase="Progressing"} 1.0',
                 'specserving_pool_replicas_ready{namespace="ns",pool="decode",specserving="sv"} 1.0',
                 'specserving_pool_replicas_desired{namespace="ns",pool="decode",specserving="sv"} 2.0',
                 'specserving_api_requests_total{code="200",resource="deployments",verb="APPLY"} 1.0'):
        assert line in text
    m.set_state("ns", "sv", None)
    text = generate_latest(m.registry).decode()
    assert 'specserving="sv"' not in text
    assert 'specserving_specservings{phase="Ready"} 0.0' in text


def test_a_bug_in_rendering_becomes_a_refused_plan_not_a_pass_that_raises(monkeypatch, caplog) -> None:
    import specserving.reconcile.plan as plan_module

    def broken(*args: object, **kwargs: object) -> list[dict]:
        raise KeyError("spec.engine")

    monkeypatch.setattr(plan_module, "render", broken)
    plan = make_plan(stored())
    assert not plan.admitted and plan.children == ()
    assert "operator bug" in plan.errors[0] and "KeyError" in plan.errors[0]
    assert "planning ns/dsv4-flash generation 4 failed" in caplog.text and "Traceback" in caplog.text


def test_the_pool_gauges_follow_each_change_of_the_recorded_pools() -> None:
    m = Metrics(CollectorRegistry())
    for i in range(50):
        m.set_state("ns", f"sv{i}", "Progressing", {"decode": (0, 2), "prefill": (0, 1)})
    m.set_state("ns", "sv", "Progressing", {"decode": (0, 2), "prefill": (0, 1)})
    m.set_state("ns", "sv", "Ready", {"decode": (2, 2)})  # the prefill pool is no longer reported
    text = generate_latest(m.registry).decode()
    assert 'specserving_pool_replicas_ready{namespace="ns",pool="decode",specserving="sv"} 2.0' in text
    assert 'specserving_pool_replicas_desired{namespace="ns",pool="decode",specserving="sv"} 2.0' in text
    assert 'pool="prefill",specserving="sv"' not in text
    assert text.count("specserving_pool_replicas_ready{") == 101
    m.set_state("ns", "sv", "Ready", {})
    assert 'specserving="sv"' not in generate_latest(m.registry).decode()
    for i in range(50):
        m.set_state("ns", f"sv{i}", None)
    assert "specserving_pool_replicas_ready{" not in generate_latest(m.registry).decode()


def test_the_revision_of_a_generation_is_hashed_once_per_image(monkeypatch) -> None:
    import specserving.reconcile.plan as plan_module

    plan = make_plan(stored())
    assert plan.image is not None
    hashed: list[object] = []
    real = plan_module.contract_revision

    def counting(*args: object, **kwargs: object) -> str:
        hashed.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(plan_module, "contract_revision", counting)
    first = plan.revision_for(plan.image)
    assert [plan.revision_for(plan.image) for _ in range(3)] == [first] * 3
    assert len(hashed) == 1
