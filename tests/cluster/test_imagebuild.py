"""The in-cluster image build against the real control plane: `specserving run --build-registry ...` as a subprocess.

A SpecServing whose base lacks the PD-decode builder gets one shared build Job and no pool until the build is
proven; the digest the build pod reports becomes the pools' image and stays in status.image after the Job goes; a
failed probe surfaces its log in ImageReady=False/BuildFailed with no pool; a base with its own builder builds
nothing; a build with no registry anywhere says how to configure one.

kwok stands in for BuildKit: a pod annotated kwok.specserving.io/exit-code (and termination-message) ends with that
code and message (hack/kwok/stages/pod-exit.yaml). kwok completes a Job's pod as soon as it runs, before a test
could annotate it, so each test holds its namespace's build pods at creation with a MutatingAdmissionPolicy that adds
a scheduling gate; the test annotates the held pod and then removes the gate. Every wait polls against a deadline.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specserving.imagebuild import context as build_context
from specserving.imagebuild.planning import build_key

from .kube import Cluster, condition, wait_for
from .operating import READY_TIMEOUT, Operator, cond_is, crd, ready, seed, total
from .registry import LOCAL_REGISTRY, local_image, point_tag

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]
__all__ = ["crd"]  # fixture, used by name

REPO = Path(__file__).resolve().parents[2]
# The unit tier's small context: the operator's behaviour does not depend on the fix's contents, and the test does
# not wait for images/sglang-pd to change.
CONTEXT = REPO / "tests" / "unit" / "imagebuild" / "context"
REGISTRY = "registry.local/ml"
BASE = "lmsysorg/sglang:v0.5.16-cu129"  # 0.5.16 has no PD-decode builder for DSPARK; the fix adds it
DIGEST = "sha256:" + "5e" * 32
PROBE_FAILURE = "probe: DSPARK has no PD-decode builder"
BUILD = "specserving.io/build"
HOLD = "specserving.io/test-hold"
EXIT_CODE = "kwok.specserving.io/exit-code"
MESSAGE = "kwok.specserving.io/termination-message"
POOLS = ("prefill", "decode")


def expected_key(base: str = BASE) -> str:
    return build_key(base, build_context.load(CONTEXT).fix_version, REGISTRY, "DSPARK")


# -- fixtures -----------------------------------------------------------------------------------------------------

def _start(cluster: Cluster, namespace: str, tmp_path: Path, flags: list[str]) -> Iterator[Operator]:
    op = Operator(cluster, namespace, tmp_path / "operator.log", extra=["--build-context", str(CONTEXT), *flags])
    try:
        yield op
    finally:
        op.stop()
        sys.stderr.write(f"\n--- operator log ({op.log}) ---\n{op.log.read_text()[-6000:]}\n")


@pytest.fixture
def builder(cluster: Cluster, namespace: str, crd: None, tmp_path: Path) -> Iterator[Operator]:
    """The operator with --build-registry registry.local/ml."""
    # --base-digests Off: these bases are names only (kwok plays the build), so builds are keyed by the tag;
    # test_builds_follow_the_bases_digest_not_its_tag and tests/cluster/test_realbuild.py resolve real ones.
    yield from _start(cluster, namespace, tmp_path, ["--build-registry", REGISTRY, "--base-digests", "Off"])


@pytest.fixture
def no_registry(cluster: Cluster, namespace: str, crd: None, tmp_path: Path) -> Iterator[Operator]:
    """The operator with no default registry."""
    yield from _start(cluster, namespace, tmp_path, ["--base-digests", "Off"])


@pytest.fixture
def hold(cluster: Cluster, namespace: str) -> Iterator[None]:
    """Build pods created in this namespace wait behind a scheduling gate until the test releases them."""
    name = f"test-hold-{namespace}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                    "operations": ["CREATE"], "resources": ["pods"]}]},
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {
                "expression": f'Object{{spec: Object.spec{{schedulingGates: [Object.spec.schedulingGates{{'
                              f'name: "{HOLD}"}}]}}}}'}}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "matchResources": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "objectSelector": {"matchExpressions": [{"key": BUILD, "operator": "Exists"}]}}},
    }
    cluster.apply(policy, binding)
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hold-probe", "namespace": namespace,
                                                            "labels": {BUILD: "probe"}},
             "spec": {"containers": [{"name": "c", "image": "registry.invalid/x:1"}]}}

    def held() -> bool:  # the API server's policy informer has caught up
        out = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(probe))
        return any(g.get("name") == HOLD for g in json.loads(out.stdout)["spec"].get("schedulingGates") or [])

    wait_for(held, 30, "the MutatingAdmissionPolicy to gate build pods")
    try:
        yield
    finally:
        cluster.kubectl("delete", "mutatingadmissionpolicybinding", name, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "mutatingadmissionpolicy", name, "--ignore-not-found", check=False)


# -- helpers ------------------------------------------------------------------------------------------------------

def jobs(cluster: Cluster, ns: str) -> list[dict[str, Any]]:
    return cluster.list("jobs", ns, BUILD)


def one_job(cluster: Cluster, ns: str) -> dict[str, Any] | None:
    found = jobs(cluster, ns)
    assert len(found) <= 1, f"expected one build Job, found {[j['metadata']['name'] for j in found]}"
    return found[0] if found else None


def held_pod(cluster: Cluster, ns: str, job: str) -> dict[str, Any] | None:
    found = cluster.list("pods", ns, f"batch.kubernetes.io/job-name={job}")
    return found[0] if len(found) == 1 and found[0]["spec"].get("schedulingGates") else None


def finish(cluster: Cluster, ns: str, pod: str, code: int, message: str) -> None:
    """Make the held build pod end with `code` and `message`, then let it run."""
    cluster.kubectl("annotate", "pod", pod, "-n", ns, f"{EXIT_CODE}={code}", f"{MESSAGE}={message}")
    cluster.kubectl("patch", "pod", pod, "-n", ns, "--type=json",
                    "-p", '[{"op": "remove", "path": "/spec/schedulingGates"}]')


def deployments(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    return cluster.list("deployments", ns, f"specserving.io/instance={name}")


def images(deployment: dict[str, Any]) -> set[str]:
    pod = deployment["spec"]["template"]["spec"]
    return {c["image"] for c in [*pod.get("initContainers", []), *pod["containers"]]}


def building(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    obj = cond_is(cluster, ns, "ImageReady", "False", "Building", name=name)
    return obj if obj and obj["status"].get("phase") == "Building" else None


# -- tests --------------------------------------------------------------------------------------------------------

def test_one_shared_build_then_pools_run_the_digest(cluster: Cluster, namespace: str, hold: None,
                                                    builder: Operator) -> None:
    ns, key = namespace, expected_key()
    target = f"{REGISTRY}/sglang-pd:pd-{key}"
    started = time.monotonic()
    cluster.apply(seed(**{"metadata.name": "first", "spec.image.base": BASE}), namespace=ns)
    job = wait_for(lambda: one_job(cluster, ns), 30, "the build Job")
    print(f"\nfigure: apply -> build Job created in {time.monotonic() - started:.1f}s")

    assert job["metadata"]["name"] == f"sps-build-{key}"
    assert job["metadata"]["labels"][BUILD] == key
    assert not job["metadata"].get("ownerReferences"), "the shared Job belongs to no one SpecServing"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["ttlSecondsAfterFinished"] > 0
    (container,) = job["spec"]["template"]["spec"]["containers"]
    script = container["command"][-1]
    for arg in (f"build-arg:BASE_IMAGE={BASE}", "build-arg:REQUIRE_ALGORITHMS=DSPARK",
                f"type=image,name={target},push=true"):
        assert arg in script, script
    assert container["securityContext"]["privileged"] is False and container["securityContext"]["runAsNonRoot"]
    config_map = wait_for(lambda: cluster.get("configmap", job["metadata"]["name"], ns), 10, "the context ConfigMap")
    (owner,) = config_map["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("Job", job["metadata"]["uid"])

    first = wait_for(lambda: building(cluster, ns, "first"), 30, "first: ImageReady=False/Building")
    assert target in condition(first, "ImageReady")["message"]
    assert cond_is(cluster, ns, "Ready", "False", "Building", name="first")
    assert first["status"]["image"] == {"base": BASE, "sglangVersion": "0.5.16", "buildKey": key, "tag": target}
    pod = wait_for(lambda: held_pod(cluster, ns, job["metadata"]["name"]), 30, "the held build pod")

    # A second SpecServing on the same base waits on the same Job.
    cluster.apply(seed(**{"metadata.name": "second", "spec.image.base": BASE, "spec.decode.replicas": 1}),
                  namespace=ns)
    wait_for(lambda: building(cluster, ns, "second"), 30, "second: ImageReady=False/Building")
    assert [j["metadata"]["uid"] for j in jobs(cluster, ns)] == [job["metadata"]["uid"]]
    assert deployments(cluster, ns, "first") == [] and deployments(cluster, ns, "second") == [], \
        "no pool before the image is proven"

    released = time.monotonic()
    finish(cluster, ns, pod["metadata"]["name"], 0, DIGEST)
    built = f"{REGISTRY}/sglang-pd@{DIGEST}"
    obj = wait_for(lambda: ready(cluster, ns, "first"), READY_TIMEOUT, "first: Ready on the built image")
    print(f"figure: build pod released -> first Ready in {time.monotonic() - released:.1f}s")
    wait_for(lambda: ready(cluster, ns, "second"), READY_TIMEOUT, "second: Ready on the built image")
    print(f"figure: build pod released -> both Ready in {time.monotonic() - released:.1f}s")

    image = obj["status"]["image"]
    assert image["resolved"] == built and image["fixApplied"] is True
    assert (image["buildKey"], image["tag"], image["base"]) == (key, target, BASE)
    assert "DSPARK" in image["pdBuilders"]
    assert condition(obj, "ImageReady")["reason"] == "Built" and obj["status"]["phase"] == "Ready"
    for name in ("first", "second"):
        pools = {d["metadata"]["labels"]["specserving.io/role"]: images(d) for d in deployments(cluster, ns, name)}
        for role in POOLS:
            assert pools[role] == {built}, pools
    assert len(jobs(cluster, ns)) == 1

    # The Job's TTL removes it (here: a delete). The digest lives on in status.image: nothing is built again.
    cluster.kubectl("delete", "job", job["metadata"]["name"], "-n", ns, "--cascade=foreground")
    wait_for(lambda: not jobs(cluster, ns), 30, "the build Job to be gone")
    passes = total(builder.metrics(), "specserving_reconcile_total")
    wait_for(lambda: total(builder.metrics(), "specserving_reconcile_total") >= passes + 4, 30,
             "the operator to converge again (resync every 2 s)")
    assert jobs(cluster, ns) == [], "a recorded digest must not be built again"
    for name in ("first", "second"):
        obj = ready(cluster, ns, name)
        assert obj and obj["status"]["image"]["resolved"] == built


def test_failed_build_shows_the_log_and_starts_no_pool(cluster: Cluster, namespace: str, hold: None,
                                                       builder: Operator) -> None:
    ns = namespace
    cluster.apply(seed(**{"spec.image.base": BASE}), namespace=ns)
    job = wait_for(lambda: one_job(cluster, ns), 30, "the build Job")
    pod = wait_for(lambda: held_pod(cluster, ns, job["metadata"]["name"]), 30, "the held build pod")
    finish(cluster, ns, pod["metadata"]["name"], 1, PROBE_FAILURE)
    obj = wait_for(lambda: cond_is(cluster, ns, "ImageReady", "False", "BuildFailed"), 60,
                   "ImageReady=False/BuildFailed")
    message = condition(obj, "ImageReady")["message"]
    assert PROBE_FAILURE in message and job["metadata"]["name"] in message, message
    assert condition(obj, "Ready")["reason"] == "BuildFailed" and obj["status"]["phase"] == "Failed"
    assert deployments(cluster, ns, obj["metadata"]["name"]) == []
    assert len(jobs(cluster, ns)) == 1, "a failed build is not retried while its Job exists"


def test_a_base_with_its_own_builder_builds_nothing(cluster: Cluster, namespace: str, builder: Operator) -> None:
    ns, base = namespace, "lmsysorg/sglang:v0.5.23-cu129"
    cluster.apply(seed(**{"spec.image.base": base}), namespace=ns)
    obj = wait_for(lambda: ready(cluster, ns), READY_TIMEOUT, "Ready on the base image")
    image_ready = condition(obj, "ImageReady")
    assert (image_ready["status"], image_ready["reason"]) == ("True", "NotNeeded")
    assert obj["status"]["image"]["resolved"] == base and obj["status"]["image"]["fixApplied"] is False
    assert jobs(cluster, ns) == []


def test_a_needed_build_without_a_registry_says_how_to_set_one(cluster: Cluster, namespace: str,
                                                               no_registry: Operator) -> None:
    ns = namespace
    cluster.apply(seed(**{"spec.image.base": BASE}), namespace=ns)
    obj = wait_for(lambda: cond_is(cluster, ns, "ImageReady", "False", "RegistryMissing"), 30,
                   "ImageReady=False/RegistryMissing")
    message = condition(obj, "ImageReady")["message"]
    assert "spec.image.build.registry" in message and "--build-registry" in message, message
    assert jobs(cluster, ns) == [] and deployments(cluster, ns, obj["metadata"]["name"]) == []


# -- builds keyed by the base's digest (the local registry's real API; kwok still plays the build) -----------------

MOVING_REPO = "specserving-test/moving-sglang"


@pytest.fixture
def resolving(cluster: Cluster, namespace: str, crd: None, tmp_path: Path, real_node: str) -> Iterator[Operator]:
    """The operator keying builds by the base's digest, read from the local registry (--base-digests Required)."""
    yield from _start(cluster, namespace, tmp_path, ["--build-registry", REGISTRY, "--base-digests", "Required",
                                                     "--build-insecure-registry", LOCAL_REGISTRY])


def test_builds_follow_the_bases_digest_not_its_tag(cluster: Cluster, namespace: str, hold: None,
                                                     resolving: Operator) -> None:
    # Two different small images stand in for two builds of one SGLang tag: the tag is moved from one to the other.
    ns, tag = namespace, f"v0.5.16-{uuid.uuid4().hex[:8]}"
    base = f"{LOCAL_REGISTRY}/{MOVING_REPO}:{tag}"
    old = point_tag(local_image(cluster, "pause"), MOVING_REPO, tag)
    cluster.apply(seed(**{"metadata.name": "before", "spec.image.base": base}), namespace=ns)
    job = wait_for(lambda: one_job(cluster, ns), 30, "the build Job of the first digest")
    before = wait_for(lambda: building(cluster, ns, "before"), 30, "before: Building")
    assert before["status"]["image"]["baseDigest"] == old
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert f"build-arg:BASE_IMAGE={LOCAL_REGISTRY}/{MOVING_REPO}@{old}" in script, "the build pulls the digest"

    # The same digest under another tag: the same build.
    alias = f"alias-{uuid.uuid4().hex[:8]}"
    point_tag(f"{base}@{old}", MOVING_REPO, alias)
    cluster.apply(seed(**{"metadata.name": "alias", "spec.image.base": f"{LOCAL_REGISTRY}/{MOVING_REPO}:{alias}",
                          "spec.image.sglangVersion": "0.5.16"}), namespace=ns)
    alias_obj = wait_for(lambda: building(cluster, ns, "alias"), 30, "alias: Building on the same Job")
    assert alias_obj["status"]["image"]["buildKey"] == before["status"]["image"]["buildKey"]
    assert len(jobs(cluster, ns)) == 1

    # The tag moves: a new SpecServing builds again; the one already waiting keeps its build.
    new = point_tag(local_image(cluster, "base"), MOVING_REPO, tag)
    assert new != old
    time.sleep(11)  # past the operator's 10 s lookup cache
    cluster.apply(seed(**{"metadata.name": "after", "spec.image.base": base}), namespace=ns)
    after = wait_for(lambda: building(cluster, ns, "after"), 30, "after: Building")
    assert after["status"]["image"]["baseDigest"] == new
    assert after["status"]["image"]["buildKey"] != before["status"]["image"]["buildKey"]
    assert len(jobs(cluster, ns)) == 2, "a moved tag is a new build"
    cluster.kubectl("annotate", "sps", "before", "-n", ns, "poke=1")  # any event: a pass over `before`
    time.sleep(3)
    kept = building(cluster, ns, "before")
    assert kept and kept["status"]["image"]["baseDigest"] == old, "a running SpecServing is not rebuilt by surprise"


def test_an_unresolvable_base_blocks_the_build_when_digests_are_required(cluster: Cluster, namespace: str,
                                                                         resolving: Operator) -> None:
    ns = namespace
    cluster.apply(seed(**{"spec.image.base": f"{LOCAL_REGISTRY}/{MOVING_REPO}:v0.5.16-no-such-tag"}), namespace=ns)
    obj = wait_for(lambda: cond_is(cluster, ns, "ImageReady", "False", "BaseUnresolved"), 30,
                   "ImageReady=False/BaseUnresolved")
    message = condition(obj, "ImageReady")["message"]
    assert "HTTP 404" in message and "check the tag" in message, message
    assert jobs(cluster, ns) == [] and deployments(cluster, ns, obj["metadata"]["name"]) == []
