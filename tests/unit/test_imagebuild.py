"""Image planning and the build Job: when to build, content-addressed names, and the Job's exact manifest."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest
import yaml

from specserving.api.loading import spec_of
from specserving.capabilities import load
from specserving.imagebuild import context as ctx
from specserving.imagebuild.job import BuildSettings, build_objects, digest_from_message, owned_by
from specserving.imagebuild.planning import BUILD, CANNOT_SERVE, NOT_NEEDED, ImagePlan, plan

from .builders import ROOT, seed

TABLE = load()
FIXTURE_CONTEXT = Path(__file__).parent / "imagebuild" / "context"
GOLDEN = Path(__file__).parent / "imagebuild" / "build-job.expected.yaml"


def _plan(**changes: object) -> ImagePlan:
    return plan(spec_of(seed(**changes)), TABLE, fix_version="f1", default_registry="registry.local/ml")


@pytest.mark.parametrize(("changes", "decision"), [
    ({}, NOT_NEEDED),  # DSPARK on 0.5.17: upstream builder
    ({"spec.image.base": "lmsysorg/sglang:v0.5.16-cu129"}, BUILD),
    ({"spec.image.base": "lmsysorg/sglang:v0.5.23-cu129"}, NOT_NEEDED),
    ({"spec.image.base": "lmsysorg/sglang:v0.5.18", "spec.speculative.algorithm": "DFLASH"}, BUILD),
    ({"spec.image.base": "lmsysorg/sglang:nightly"}, BUILD),  # unknown version: the probe decides
    ({"spec.image.base": "lmsysorg/sglang:nightly", "spec.image.build": {"policy": "Never"}}, NOT_NEEDED),
    ({"spec.speculative.algorithm": "NGRAM"}, CANNOT_SERVE),
    ({"spec.image.base": "lmsysorg/sglang:v0.5.16", "spec.image.build": {"policy": "Never"}}, CANNOT_SERVE),
])
def test_decision(changes: dict[str, object], decision: str) -> None:
    assert _plan(**changes).decision == decision


def test_same_base_fix_and_registry_share_one_build() -> None:
    a = _plan(**{"spec.image.base": "lmsysorg/sglang:v0.5.16-cu129"})
    b = plan(spec_of(seed(**{"metadata.name": "other", "spec.image.base": "lmsysorg/sglang:v0.5.16-cu129",
                             "spec.decode.replicas": 7})), TABLE, fix_version="f1", default_registry="registry.local/ml")
    assert a.build_name == b.build_name and a.target == b.target
    assert a.target == f"registry.local/ml/sglang-pd:pd-{a.build_key}"
    c = plan(spec_of(seed(**{"spec.image.base": "lmsysorg/sglang:v0.5.16-cu129"})), TABLE, fix_version="f2",
             default_registry="registry.local/ml")
    assert c.build_name != a.build_name, "a new fix version must build again"


def test_spec_registry_overrides_the_default() -> None:
    p = _plan(**{"spec.image.base": "lmsysorg/sglang:v0.5.16-cu129", "spec.image.build.registry": "r.example/x"})
    assert p.target is not None and p.target.startswith("r.example/x/sglang-pd:pd-")


def test_build_without_any_registry_has_no_target() -> None:
    p = plan(spec_of(seed(**{"spec.image.base": "lmsysorg/sglang:v0.5.16-cu129"})), TABLE, fix_version="f1",
             default_registry=None)
    assert p.decision == BUILD and p.target is None


def test_build_job_matches_golden() -> None:
    p = _plan(**{"spec.image.base": "lmsysorg/sglang:v0.5.16-cu129"})
    objs = build_objects(p, ctx.load(FIXTURE_CONTEXT), namespace="serving", push_secret="registry-push")
    rendered = yaml.safe_dump_all(objs, sort_keys=True, width=120)
    if os.environ.get("SPECSERVING_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(rendered)
    assert rendered == GOLDEN.read_text()


def test_build_job_is_unprivileged_and_never_retries() -> None:
    p = _plan(**{"spec.image.base": "lmsysorg/sglang:v0.5.16-cu129"})
    _, job = build_objects(p, ctx.load(FIXTURE_CONTEXT), namespace="serving", push_secret=None)
    pod = job["spec"]["template"]["spec"]
    sc = pod["containers"][0]["securityContext"]
    assert sc["privileged"] is False and sc["runAsNonRoot"] is True and sc["runAsUser"] == 1000
    assert job["spec"]["backoffLimit"] == 0
    assert pod["automountServiceAccountToken"] is False
    assert all("secret" not in v for v in pod["volumes"])


def test_context_paths_survive_the_configmap() -> None:
    p = _plan(**{"spec.image.base": "lmsysorg/sglang:v0.5.16-cu129"})
    cm, job = build_objects(p, ctx.load(FIXTURE_CONTEXT), namespace="serving", push_secret=None)
    items = job["spec"]["template"]["spec"]["volumes"][0]["configMap"]["items"]
    assert {i["path"]: cm["data"][i["key"]] for i in items} == ctx.load(FIXTURE_CONTEXT).files


def test_the_context_configmap_goes_with_its_job() -> None:
    p = _plan(**{"spec.image.base": "lmsysorg/sglang:v0.5.16-cu129"})
    cm, job = build_objects(p, ctx.load(FIXTURE_CONTEXT), namespace="serving", push_secret=None)
    assert "ownerReferences" not in job["metadata"], "the Job is shared: no SpecServing owns it"
    created = {**job, "metadata": {**job["metadata"], "uid": "job-uid"}}
    owned = owned_by(cm, created)
    assert owned["metadata"]["ownerReferences"] == [{"apiVersion": "batch/v1", "kind": "Job", "name": p.build_name,
                                                     "uid": "job-uid"}]
    assert "ownerReferences" not in cm["metadata"] and owned["data"] == cm["data"]


def test_the_real_context_loads_and_fits() -> None:
    real = ctx.load(ROOT / "images" / "sglang-pd")
    assert "Dockerfile" in real.files and len(real.fix_version) == 16


def test_context_hash_changes_with_content(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    first = ctx.load(tmp_path).digest
    (tmp_path / "Dockerfile").write_text("FROM y\n")
    assert ctx.load(tmp_path).digest != first


def test_missing_context_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ctx.ContextError, match="no Dockerfile"):
        ctx.load(tmp_path)


@pytest.mark.parametrize(("message", "digest"), [
    ("sha256:" + "a" * 64 + "\n", "sha256:" + "a" * 64),
    ("error: failed to solve: process did not complete", None),
    ("", None),
    (None, None),
])
def test_digest_from_termination_message(message: str | None, digest: str | None) -> None:
    assert digest_from_message(message) == digest


def test_insecure_registries_reach_buildkitd_through_its_config() -> None:
    p = _plan(**{"spec.image.base": "lmsysorg/sglang:v0.5.16-cu129"})
    settings = BuildSettings(insecure_registries=("10.88.0.1:5000", "registry.local"))
    cm, job = build_objects(p, ctx.load(FIXTURE_CONTEXT), namespace="serving", push_secret=None, settings=settings)
    config = tomllib.loads(cm["data"]["buildkitd.toml"])
    assert config["registry"] == {"10.88.0.1:5000": {"http": True, "insecure": True},
                                  "registry.local": {"http": True, "insecure": True}}
    container = job["spec"]["template"]["spec"]["containers"][0]
    flags = next(e["value"] for e in container["env"] if e["name"] == "BUILDKITD_FLAGS")
    mount = next(m for m in container["volumeMounts"] if m["name"] == "buildkitd-config")
    assert f"--config={mount['mountPath']}/buildkitd.toml" in flags.split()
    assert "buildkitd.toml" not in {i["path"] for i in job["spec"]["template"]["spec"]["volumes"][0]["configMap"]
                                    ["items"]}, "the config is not part of the build context"


def test_no_insecure_registry_means_no_buildkitd_config() -> None:
    p = _plan(**{"spec.image.base": "lmsysorg/sglang:v0.5.16-cu129"})
    cm, job = build_objects(p, ctx.load(FIXTURE_CONTEXT), namespace="serving", push_secret=None)
    assert "buildkitd.toml" not in cm["data"]
    assert "--config" not in json.dumps(job)


def test_build_pods_go_where_the_admin_says() -> None:
    p = _plan(**{"spec.image.base": "lmsysorg/sglang:v0.5.16-cu129"})
    settings = BuildSettings(node_selector={"pool": "cpu"},
                             tolerations=({"key": "dedicated", "operator": "Equal", "value": "build",
                                           "effect": "NoSchedule"},),
                             resources={"requests": {"cpu": "500m"}})
    _, job = build_objects(p, ctx.load(FIXTURE_CONTEXT), namespace="serving", push_secret=None, settings=settings)
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "cpu"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "build", "effect": "NoSchedule"}]
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "500m"}}


def test_the_build_reads_a_plain_copy_of_the_context_and_pulls_the_base_by_digest() -> None:
    digest = "sha256:" + "ab" * 32
    p = _plan(**{"spec.image.base": "registry.local/ml/sglang:v0.5.16"}).pinned(digest)
    _, job = build_objects(p, ctx.load(FIXTURE_CONTEXT), namespace="serving", push_secret=None)
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    copy = script.index("cp -RL /workspace/. ")
    assert copy < script.index("buildctl-daemonless.sh"), "the ConfigMap's symlinks are resolved before the build"
    assert f"build-arg:BASE_IMAGE=registry.local/ml/sglang@{digest}" in script
    assert "--local context=/home/user/.local/tmp/context" in script
