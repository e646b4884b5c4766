"""Image resolution in the reconciler: the verdict from the image plan, the remembered digest and the build Job and
pod the watches saw; ImageReady, phase, Ready and Progressing from it; rendering on the built image; start-up
settings (the build context, --build-registry)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specserving.api.loading import spec_of
from specserving.capabilities import load
from specserving.imagebuild import context as ctx
from specserving.imagebuild.planning import ImagePlan, plan
from specserving.kube import StartupError
from specserving.reconcile import reasons as R
from specserving.reconcile.image import (BuildConfig, ImageVerdict, build_job_of, build_pod_of, remembered, resolve,
                                         tail)
from specserving.reconcile.observed import workload_of
from specserving.reconcile.plan import make_plan, missing_builder
from specserving.reconcile.runner import Options, build_config
from specserving.reconcile.status import Observation, Outcome, compute
from specserving.rendering.image import ResolvedImage

from .builders import seed

TABLE = load()
REGISTRY = "registry.local/ml"
OLD = "lmsysorg/sglang:v0.5.16-cu129"  # DSPARK needs the fix
DIGEST = "sha256:" + "ab" * 32
CONTEXT = Path(__file__).parent / "imagebuild" / "context"
T0 = "2026-01-01T00:00:00Z"


def image_plan(base: str = OLD, registry: str | None = REGISTRY, **changes: Any) -> ImagePlan:
    return plan(spec_of(seed(**{"spec.image.base": base, **changes})), TABLE, fix_version="f1",
                default_registry=registry)


def job(*, complete: bool = False, failed: str | None = None, uid: str = "job-uid") -> dict[str, Any]:
    conds = []
    if complete:
        conds.append({"type": "Complete", "status": "True"})
    if failed:
        conds.append({"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": failed})
    ip = image_plan()
    return {"metadata": {"name": ip.build_name, "uid": uid, "labels": {"specserving.io/build": ip.build_key}},
            "status": {"conditions": conds}}


def pod(*, exit_code: int | None = None, message: str = "", waiting: str | None = None, uid: str = "job-uid",
        name: str = "build-x", created: str = T0) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {}}
    phase = "Running"
    if waiting:
        state, phase = {"waiting": {"reason": waiting, "message": f"{waiting}: back-off"}}, "Pending"
    if exit_code is not None:
        state = {"terminated": {"exitCode": exit_code, "message": message,
                                "reason": "Completed" if exit_code == 0 else "Error"}}
        phase = "Succeeded" if exit_code == 0 else "Failed"
    return {"metadata": {"name": name, "creationTimestamp": created,
                         "labels": {"batch.kubernetes.io/controller-uid": uid}},
            "status": {"phase": phase, "containerStatuses": [{"name": "buildkit", "state": state}]}}


def verdict(**kw: Any) -> ImageVerdict:
    j, pods = kw.pop("job", None), kw.pop("pods", ())
    return resolve(kw.pop("ip", None) or image_plan(), TABLE, job=build_job_of(j) if j else None,
                   pods=[build_pod_of(p) for p in pods], **kw)


# -- the verdict --------------------------------------------------------------------------------------------------

def test_a_base_with_its_own_builder_runs_as_is() -> None:
    v = verdict(ip=image_plan("lmsysorg/sglang:v0.5.23-cu129"))
    assert (v.status, v.reason, v.start_build) == ("True", R.NOT_NEEDED, False)
    assert v.image == ResolvedImage("lmsysorg/sglang:v0.5.23-cu129", "0.5.23")
    assert v.status_image == {"base": "lmsysorg/sglang:v0.5.23-cu129", "resolved": "lmsysorg/sglang:v0.5.23-cu129",
                              "fixApplied": False, "sglangVersion": "0.5.23",
                              "pdBuilders": ["DFLASH", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP"]}


def test_no_job_yet_starts_the_build_and_no_pool() -> None:
    ip = image_plan()
    v = verdict()
    assert (v.status, v.reason, v.start_build, v.image) == ("False", R.BUILDING, True, None)
    assert ip.target and ip.target in v.message and str(ip.build_name) in v.message
    assert v.status_image == {"base": OLD, "sglangVersion": "0.5.16", "buildKey": ip.build_key, "tag": ip.target}


def test_a_running_build_says_where_it_is() -> None:
    v = verdict(job=job(), pods=[pod(waiting="ErrImagePull")])
    assert (v.reason, v.start_build, v.image, v.failed) == (R.BUILDING, False, None, False)
    assert "pod build-x is Pending: ErrImagePull" in v.message


def test_success_deploys_the_digest() -> None:
    v = verdict(job=job(complete=True), pods=[pod(exit_code=0, message=DIGEST + "\n")])
    ref = f"{REGISTRY}/sglang-pd@{DIGEST}"
    assert (v.status, v.reason, v.image) == ("True", R.BUILT, ResolvedImage(ref, "0.5.16", fix_applied=True))
    assert v.status_image is not None and v.status_image["resolved"] == ref and v.status_image["fixApplied"] is True
    assert "DSPARK" in v.status_image["pdBuilders"] and v.status_image["buildKey"] == image_plan().build_key


def test_the_pod_can_report_before_the_job_does() -> None:
    v = verdict(job=job(), pods=[pod(exit_code=0, message=DIGEST)])
    assert v.reason == R.BUILT


def test_success_without_a_digest_is_a_failure() -> None:
    v = verdict(job=job(complete=True), pods=[pod(exit_code=0, message="")])
    assert (v.status, v.reason, v.failed, v.image) == ("False", R.BUILD_FAILED, True, None)
    assert "wrote no image digest" in v.message


def test_a_finished_job_whose_pod_is_not_seen_yet_keeps_building() -> None:
    assert verdict(job=job(complete=True)).reason == R.BUILDING


def test_failure_carries_the_log_tail() -> None:
    v = verdict(job=job(failed="Job has reached the specified backoff limit"),
                pods=[pod(exit_code=1, message="step 7/9\nprobe: DSPARK has no PD-decode builder")])
    assert (v.status, v.reason, v.failed, v.image) == ("False", R.BUILD_FAILED, True, None)
    assert "Error (exit code 1): step 7/9\nprobe: DSPARK has no PD-decode builder" in v.message
    assert "delete the Job to build again" in v.message


def test_failure_without_a_pod_uses_the_job_condition() -> None:
    v = verdict(job=job(failed="Job was active longer than specified deadline"))
    assert v.reason == R.BUILD_FAILED and "BackoffLimitExceeded: Job was active longer" in v.message


def test_pods_of_an_older_job_with_the_same_name_are_ignored() -> None:
    v = verdict(job=job(uid="new"), pods=[pod(exit_code=1, message="old failure", uid="old")])
    assert v.reason == R.BUILDING


def test_a_long_log_is_cut_to_its_end() -> None:
    log = "x" * 5000 + "the end"
    cut = tail(log)
    assert cut.startswith("...") and cut.endswith("the end") and len(cut.encode()) <= 2003
    assert tail("short\n") == "short"


def test_a_remembered_digest_needs_no_job() -> None:
    ip = image_plan()
    ref = f"{REGISTRY}/sglang-pd@{DIGEST}"
    mine = {"image": {"buildKey": ip.build_key, "resolved": ref}}
    assert remembered([None, {"image": {"buildKey": "other", "resolved": ref}}, mine], ip) == ref
    assert remembered([{"image": {"buildKey": ip.build_key, "resolved": "evil.example/x@" + DIGEST}}], ip) is None
    assert remembered([{"image": {"buildKey": ip.build_key, "resolved": f"{REGISTRY}/sglang-pd:tag"}}], ip) is None
    v = resolve(ip, TABLE, remembered_ref=ref)
    assert (v.reason, v.start_build) == (R.BUILT, False) and v.image is not None and v.image.ref == ref


def test_no_registry_anywhere_names_the_field_and_the_flag() -> None:
    v = verdict(ip=image_plan(registry=None))
    assert (v.status, v.reason, v.failed, v.start_build) == ("False", R.REGISTRY_MISSING, True, False)
    assert "spec.image.build.registry" in v.message and "--build-registry" in v.message


def test_the_spec_registry_is_enough() -> None:
    v = verdict(ip=image_plan(registry=None, **{"spec.image.build": {"registry": "r.example/x"}}))
    assert v.reason == R.BUILDING and v.start_build


# -- the plan -----------------------------------------------------------------------------------------------------

def stored(**changes: Any) -> dict[str, Any]:
    obj = seed(**changes)
    obj["metadata"].update(namespace="ns", uid="u1", generation=2)
    return obj


def test_a_plan_that_needs_a_build_renders_nothing_until_it_has_the_image() -> None:
    build = BuildConfig(context=ctx.load(CONTEXT), registry=REGISTRY)
    p = make_plan(stored(**{"spec.image.base": OLD}), build)
    assert p.children == () and p.image_plan is not None and p.image_plan.decision == "Build"
    built = ResolvedImage(f"{REGISTRY}/sglang-pd@{DIGEST}", "0.5.16", fix_applied=True)
    assert p.spec is not None and missing_builder(p.spec, built, p.table) is None
    children = p.children_for(built)
    assert children is p.children_for(built), "rendered once per image"
    pools = [c for c in children.children() if c["kind"] == "Deployment"]
    assert len(pools) == 3
    for d in pools:
        if not d["metadata"]["name"].endswith("router"):
            assert {c["image"] for c in d["spec"]["template"]["spec"]["containers"]} == {built.ref}


def test_the_build_key_follows_the_fix_version() -> None:
    a = make_plan(stored(**{"spec.image.base": OLD}), BuildConfig(context=ctx.load(CONTEXT), registry=REGISTRY))
    b = make_plan(stored(**{"spec.image.base": OLD}), BuildConfig(registry=REGISTRY))
    assert a.image_plan and b.image_plan and a.image_plan.build_key != b.image_plan.build_key


# -- status -------------------------------------------------------------------------------------------------------

def observe(v: Any, workloads: dict[str, Any] | None = None, blocked: bool = False) -> Observation:
    outcome = Outcome(admitted=True, image=v, blocked_reason=v.reason if blocked else None,
                      blocked_message=v.message if blocked else "")
    return Observation(name="sv", namespace="ns", generation=2, outcome=outcome,
                       desired={"prefill": 1, "decode": 2, "router": 1},
                       workloads={r: (workload_of(w) if w else None) for r, w in (workloads or {}).items()},
                       image=v.status_image)


def cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_building_is_its_own_phase_and_not_ready() -> None:
    s = compute(observe(verdict()), T0)
    assert s["phase"] == "Building"
    assert (cond(s, "ImageReady")["status"], cond(s, "ImageReady")["reason"]) == ("False", R.BUILDING)
    assert (cond(s, "Ready")["status"], cond(s, "Ready")["reason"]) == ("False", R.BUILDING)
    assert (cond(s, "Progressing")["status"], cond(s, "Progressing")["reason"]) == ("True", R.BUILDING)
    assert "not created until the image is ready (ImageReady is Building)" in cond(s, "DecodeReady")["message"]
    assert s["image"]["buildKey"] == image_plan().build_key and "resolved" not in s["image"]


def test_a_failed_build_fails_the_resource() -> None:
    v = verdict(job=job(failed="x"), pods=[pod(exit_code=1, message="probe failed")])
    s = compute(observe(v, blocked=True), T0)
    assert s["phase"] == "Failed"
    for type_ in ("ImageReady", "Ready", "Progressing"):
        assert (cond(s, type_)["status"], cond(s, type_)["reason"]) == ("False", R.BUILD_FAILED)
    assert "probe failed" in cond(s, "ImageReady")["message"]


def test_image_ready_comes_second_and_is_unknown_before_admission() -> None:
    s = compute(Observation(name="sv", namespace="ns", generation=1, outcome=Outcome(admitted=False, errors=("e",)),
                            desired=None, workloads={}), T0)
    assert [c["type"] for c in s["conditions"]][:2] == ["Admitted", "ImageReady"]
    assert (cond(s, "ImageReady")["status"], cond(s, "ImageReady")["reason"]) == ("Unknown", R.NOT_ADMITTED)


def test_built_and_ready() -> None:
    v = verdict(job=job(complete=True), pods=[pod(exit_code=0, message=DIGEST)])
    ready = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x", "generation": 1},
             "spec": {"replicas": 1}, "status": {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1,
                                                 "updatedReplicas": 1}}
    two = {**ready, "spec": {"replicas": 2}, "status": {**ready["status"], "replicas": 2, "readyReplicas": 2,
                                                         "updatedReplicas": 2}}
    s = compute(observe(v, {"prefill": ready, "decode": two, "router": ready}), T0)
    assert s["phase"] == "Ready" and cond(s, "ImageReady")["reason"] == R.BUILT


# -- start-up -----------------------------------------------------------------------------------------------------

def test_an_unloadable_context_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(StartupError) as err:
        build_config(Options(namespaces=["x"], build_context=str(tmp_path)))
    assert str(err.value) == (f"cannot load the image build context: no Dockerfile in the build context {tmp_path}; "
                              "set SPECSERVING_BUILD_CONTEXT")


@pytest.mark.parametrize(("flags", "message"), [
    ({"build_registry": "Registry With Spaces"}, "--build-registry must be a repository"),
    ({"build_push_secret": "Not_A_Name"}, "--build-push-secret must be a Secret name"),
    ({"build_insecure_registries": ["http://r:5000"]}, "--build-insecure-registry takes a registry host"),
    ({"build_node_selector": ["pool"]}, "--build-node-selector takes KEY=VALUE"),
    ({"build_tolerations": ["dedicated=build"]}, "--build-toleration takes KEY\\[=VALUE\\]:EFFECT"),
    ({"build_tolerations": ["dedicated:NoWay"]}, "--build-toleration takes"),
    ({"build_resources": "{cpu: 2}"}, "--build-resources must be JSON"),
    ({"build_resources": '{"cpu": "2"}'}, "only requests and limits"),
    ({"base_digests": "Sometimes"}, "--base-digests must be one of Required, BestEffort, Off"),
])
def test_bad_build_flags_are_refused(flags: dict[str, str], message: str) -> None:
    with pytest.raises(StartupError, match=message):
        build_config(Options(namespaces=["x"], build_context=str(CONTEXT), **flags))


def test_build_flags_become_the_defaults() -> None:
    cfg = build_config(Options(namespaces=["x"], build_context=str(CONTEXT), build_registry=REGISTRY,
                               build_push_secret="push", buildkit_image="moby/buildkit@sha256:" + "0" * 64))
    assert (cfg.registry, cfg.push_secret) == (REGISTRY, "push")
    assert cfg.settings.buildkit_image.endswith("0" * 64)
    assert cfg.fix_version == ctx.load(CONTEXT).fix_version


def test_build_pod_flags_become_the_jobs_settings() -> None:
    cfg = build_config(Options(namespaces=["x"], build_context=str(CONTEXT),
                               build_insecure_registries=["10.88.0.1:5000"], build_node_selector=["pool=cpu"],
                               build_tolerations=["dedicated=build:NoSchedule", "gpu:NoExecute"],
                               build_resources='{"requests": {"cpu": 1, "memory": "2Gi"}}', base_digests="Required",
                               read_pull_secrets=True))
    s = cfg.settings
    assert s.insecure_registries == ("10.88.0.1:5000",) and dict(s.node_selector) == {"pool": "cpu"}
    assert [dict(t) for t in s.tolerations] == [
        {"key": "dedicated", "operator": "Equal", "value": "build", "effect": "NoSchedule"},
        {"key": "gpu", "operator": "Exists", "effect": "NoExecute"}]
    assert dict(s.resources) == {"requests": {"cpu": "1", "memory": "2Gi"}}
    assert cfg.base_digests == "Required" and cfg.read_pull_secrets
    assert cfg.resolver is not None and cfg.resolver.insecure == {"10.88.0.1:5000"}
    assert build_config(Options(namespaces=["x"], build_context=str(CONTEXT), base_digests="Off")).resolver is None


def test_the_run_flags_reach_the_options() -> None:
    from specserving.cli import build_parser
    from specserving.imagebuild.job import DEFAULT_BUILDKIT_IMAGE

    args = build_parser().parse_args(["run", "-n", "x", "--build-registry", REGISTRY, "--build-push-secret", "push",
                                      "--build-context", str(CONTEXT)])
    assert (args.build_registry, args.build_push_secret, args.build_context) == (REGISTRY, "push", str(CONTEXT))
    assert args.buildkit_image == DEFAULT_BUILDKIT_IMAGE


def test_the_built_verdict_does_not_change_when_the_job_goes() -> None:
    from_job = verdict(job=job(complete=True), pods=[pod(exit_code=0, message=DIGEST)])
    assert from_job.image is not None
    assert resolve(image_plan(), TABLE, remembered_ref=from_job.image.ref) == from_job


@pytest.mark.parametrize("policy", ["IfNeeded", "Never"])
def test_admission_planning_and_deploy_check_agree_on_every_version_and_algorithm(policy: str) -> None:
    # The one verdict has four readers; none may admit what another refuses, for any known or unknown version.
    from specserving.imagebuild.planning import BUILD, CANNOT_SERVE
    from specserving.validation import check_pd_builder

    for version in [*TABLE.versions, "0.9.99"]:
        for alg in sorted(TABLE.versions["0.5.23"].algorithms):
            spec = spec_of(seed(**{"spec.image.base": f"lmsysorg/sglang:v{version}", "spec.image.build.policy": policy,
                                   "spec.speculative.algorithm": alg}))
            where = f"{alg} on {version}, {policy}"
            refused = bool(check_pd_builder(spec, TABLE).errors)
            decision = plan(spec, TABLE, fix_version="f1", default_registry=REGISTRY).decision
            assert refused == (decision == CANNOT_SERVE), where
            base = ResolvedImage(ref=spec.image.base, sglang_version=version, fix_applied=False)
            built = ResolvedImage(ref=f"{REGISTRY}/sglang-pd@{DIGEST}", sglang_version=version, fix_applied=True)
            if decision == BUILD:
                # The base image would crash (or is unproven); the built one is what gets deployed.
                assert missing_builder(spec, built, TABLE) is None, where
            elif not refused:
                assert missing_builder(spec, base, TABLE) is None, where


def test_build_metrics_count_each_job_end_once() -> None:
    from datetime import UTC, datetime, timedelta

    from prometheus_client import CollectorRegistry

    from specserving.metrics import Metrics
    from specserving.reconcile.building import Builds

    registry = CollectorRegistry()
    builds = Builds(kube=None, config=BuildConfig(), metrics=Metrics(registry), watched=None)  # type: ignore[arg-type]

    def job(uid: str, kind: str, start: datetime, seconds: int) -> dict[str, Any]:
        stamp = (start + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
        status: dict[str, Any] = {"startTime": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                  "conditions": [{"type": kind, "status": "True", "lastTransitionTime": stamp}]}
        if kind == "Complete":
            status["completionTime"] = stamp
        return {"metadata": {"name": uid, "uid": uid, "labels": {"specserving.io/build": "k"}}, "status": status}

    now = datetime.now(UTC)
    for body in (job("a", "Complete", now, 90), job("a", "Complete", now, 90), job("b", "Failed", now, 30),
                 job("old", "Complete", now - timedelta(days=1), 60)):
        builds.job_seen(body)
    value = registry.get_sample_value
    assert value("specserving_builds_total", {"result": "succeeded"}) == 1, "a Job's end counts once"
    assert value("specserving_builds_total", {"result": "failed"}) == 1
    assert value("specserving_build_duration_seconds_sum", {"result": "succeeded"}) == 90
    assert value("specserving_build_duration_seconds_count", {"result": "failed"}) == 1
