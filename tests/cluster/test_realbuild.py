"""The build Job really builds, on the real node: the operator's own rendered Job runs rootless BuildKit (the
stand-in image of hack/buildkit), builds images/sglang-pd FROM the stand-in SGLang 0.5.16 base in the local
registry, runs the probe through SGLang's plugin loader, pushes, and reports the digest; the pools run it. A fix
that SGLang never loads fails its build on the 0.5.18 base (DFLASH); the 0.5.17 base needs no build.

Nothing is played here: the registry, BuildKit, the Dockerfile, pip and the probe are the real ones. What stands in
(docs/image-build.md): the BuildKit image (built here from the same Go modules as moby/buildkit's rootless image),
the SGLang base (Debian, PyPI's torch on CPU, the real SGLang wheel), and kwok's fake GPU nodes for the pools.

A build pulls the ~6 GB base into the pod's emptyDir; the namespace's deletion removes the pod and its disk.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .kube import REPO, Cluster, condition, wait_for
from .operating import READY_TIMEOUT, Operator, cond_is, crd, ready, seed
from .registry import LOCAL_REGISTRY, api, local_image, point_tag, repository_of

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(2400)]
__all__ = ["crd"]  # fixture, used by name

REGISTRY_HOST = LOCAL_REGISTRY
PUSH_REPO = "specserving-test"
BUILT = f"{REGISTRY_HOST}/{PUSH_REPO}/sglang-pd"
# Cold, the pod pulls the whole base (about 2 GB of zstd, 6 GB unpacked) before the first RUN.
BUILD_TIMEOUT = 1500
NODE_LABEL = "specserving.io/real-node"


@pytest.fixture(scope="module")
def buildkit_image(cluster: Cluster, real_node: str) -> str:
    return local_image(cluster, "buildkit")


@pytest.fixture(scope="module")
def base_0516(cluster: Cluster, real_node: str) -> str:
    """REGISTRY/specserving/stand-in/sglang:v0.5.16-cpu-HASH@sha256:...: DSPARK needs the fix."""
    return local_image(cluster, "sglang", "0.5.16")


@pytest.fixture(scope="module")
def base_0517(cluster: Cluster, real_node: str) -> str:
    """SGLang 0.5.17: its own PD-decode builder for DSPARK, no build needed."""
    return local_image(cluster, "sglang", "0.5.17")


@pytest.fixture(scope="module")
def base_0518(cluster: Cluster, real_node: str) -> str:
    """SGLang 0.5.18: DFLASH needs the fix."""
    return local_image(cluster, "sglang", "0.5.18")


def start_operator(cluster: Cluster, namespace: str, log: Path, buildkit_image: str,
                   context: Path | None = None) -> Operator:
    """The operator as an admin would configure it for this cluster: builds on the real node (CPU only), pushed to
    the local plain-HTTP registry, the base resolved to its digest before any build."""
    extra = ["--build-registry", f"{REGISTRY_HOST}/{PUSH_REPO}", "--build-insecure-registry", REGISTRY_HOST,
             "--buildkit-image", buildkit_image, "--build-node-selector", f"{NODE_LABEL}=true",
             "--build-toleration", f"{NODE_LABEL}=true:NoSchedule",
             "--build-resources", json.dumps({"requests": {"cpu": "500m", "memory": "1Gi"},
                                               "limits": {"memory": "8Gi"}}),
             "--base-digests", "Required", *(["--build-context", str(context)] if context else [])]
    return Operator(cluster, namespace, log, extra=extra)


@pytest.fixture
def operator_for(cluster: Cluster, namespace: str, crd: None, tmp_path: Path, buildkit_image: str,
                 ) -> Iterator[Any]:
    started: list[Operator] = []

    def start(context: Path | None = None) -> Operator:
        op = start_operator(cluster, namespace, tmp_path / f"operator-{len(started)}.log", buildkit_image, context)
        started.append(op)
        return op

    try:
        yield start
    finally:
        for op in started:
            op.stop()
            sys.stderr.write(f"\n--- operator log ({op.log}) ---\n{op.log.read_text()[-6000:]}\n")
        for job in cluster.list("jobs", namespace, "specserving.io/build"):
            logs = cluster.kubectl("logs", f"job/{job['metadata']['name']}", "-n", namespace, "--tail=40",
                                   check=False)
            sys.stderr.write(f"\n--- build log tail (Job {job['metadata']['name']}) ---\n{logs.stdout}{logs.stderr}\n")


def metric(op: Operator, name: str, labels: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=10).read().decode()
    m = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def image_ready(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    obj = cluster.get("specserving", name, ns)
    cond = condition(obj, "ImageReady") if obj else None
    if cond and cond["status"] == "False" and cond["reason"] not in ("Building",):
        pytest.fail(f"{name}: ImageReady=False/{cond['reason']}: {cond['message']}")
    return obj if cond and cond["status"] == "True" else None


def pool_images(cluster: Cluster, ns: str, name: str) -> set[str]:
    out = set()
    for d in cluster.list("deployments", ns, f"specserving.io/instance={name}"):
        if d["metadata"]["labels"].get("specserving.io/role") in ("prefill", "decode"):
            out |= {c["image"] for c in d["spec"]["template"]["spec"]["containers"]}
    return out


def test_a_real_build_serves_the_pushed_digest(cluster: Cluster, namespace: str, base_0516: str,
                                               operator_for: Any) -> None:
    ns = namespace
    op = operator_for()
    base_tag, base_digest = base_0516.split("@")
    started = time.monotonic()
    cluster.apply(seed(**{"metadata.name": "first", "spec.image.base": base_tag}), namespace=ns)
    obj = wait_for(lambda: image_ready(cluster, ns, "first"), BUILD_TIMEOUT, "first: ImageReady=True (a real build)")
    build_seconds = time.monotonic() - started
    image = obj["status"]["image"]
    resolved = image["resolved"]
    print(f"\nfigure: apply -> real build pushed and ImageReady in {build_seconds:.0f}s")

    assert image["baseDigest"] == base_digest, "the build is keyed by (and pulls) the base's digest"
    assert image["fixApplied"] is True and condition(obj, "ImageReady")["reason"] == "Built"
    assert re.fullmatch(rf"{re.escape(BUILT)}@sha256:[0-9a-f]{{64}}", resolved), resolved
    digest = resolved.split("@")[1]
    code, headers, manifest = api("HEAD", f"{PUSH_REPO}/sglang-pd/manifests/{digest}")
    assert code == 200 and headers.get("Docker-Content-Digest") == digest, (code, headers)
    code, _, manifest = api("GET", f"{PUSH_REPO}/sglang-pd/manifests/{digest}")
    config_digest = json.loads(manifest)["config"]["digest"]
    code, _, config = api("GET", f"{PUSH_REPO}/sglang-pd/blobs/{config_digest}")
    built_config = json.loads(config)["config"]
    labels = built_config["Labels"]
    assert labels["io.specserving.required-algorithms"] == "DSPARK"
    assert labels["io.specserving.base-image"] == f"{base_tag.rsplit(':', 1)[0]}@{base_digest}"
    base_repo = repository_of(base_0516)
    _, _, base_manifest = api("GET", f"{base_repo}/manifests/{base_digest}")
    _, _, base_config = api("GET", f"{base_repo}/blobs/{json.loads(base_manifest)['config']['digest']}")
    # The pods set the user either way (docs/security.md); the image itself must not change it either.
    base_user = json.loads(base_config)["config"].get("User", "")
    assert built_config.get("User", "") == base_user, "a build keeps the base's user"

    job = cluster.list("jobs", ns, "specserving.io/build")[0]["metadata"]["name"]
    log = cluster.kubectl("logs", f"job/{job}", "-n", ns).stdout
    assert re.search(r"sglang 0\.5\.16 fix active: True PD builders: .*DSPARK", log), log[-3000:]

    wait_for(lambda: ready(cluster, ns, "first"), READY_TIMEOUT, "first: Ready")
    assert pool_images(cluster, ns, "first") == {resolved}
    assert metric(op, "specserving_builds_total", 'result="started"') == 1
    wait_for(lambda: metric(op, "specserving_builds_total", 'result="succeeded"') == 1, 60,
             "specserving_builds_total{result=succeeded} = 1")
    assert metric(op, "specserving_build_duration_seconds_count", 'result="succeeded"') == 1

    # The same content under a second tag: one digest, one build.
    alias_tag = f"alias-{uuid.uuid4().hex[:8]}"
    point_tag(base_0516, repository_of(base_0516), alias_tag)
    alias = f"{base_tag.rsplit(':', 1)[0]}:{alias_tag}"
    again = time.monotonic()
    cluster.apply(seed(**{"metadata.name": "second", "spec.image.base": alias, "spec.decode.replicas": 1}),
                  namespace=ns)
    second = wait_for(lambda: ready(cluster, ns, "second"), READY_TIMEOUT, "second: Ready without a build")
    new_builds = metric(op, "specserving_builds_total", 'result="started"') - 1
    print(f"figure: a second SpecServing on the same base (another tag, same digest): {new_builds:.0f} new builds, "
          f"Ready in {time.monotonic() - again:.1f}s")
    assert new_builds == 0 and len(cluster.list("jobs", ns, "specserving.io/build")) == 1
    assert second["status"]["image"]["resolved"] == resolved
    assert pool_images(cluster, ns, "second") == {resolved}


def test_a_build_whose_probe_finds_no_builder_fails_for_real(cluster: Cluster, namespace: str, base_0518: str,
                                                              operator_for: Any, tmp_path: Path) -> None:
    # DFLASH on SGLang 0.5.18 needs the fix. Here the fix comes without its plugin entry point: SGLang's loader never
    # loads it, so the probe inside the build must find DFLASH's builder missing and fail the build.
    broken = tmp_path / "sglang-pd"
    shutil.copytree(REPO / "images" / "sglang-pd", broken,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    pyproject = broken / "pdfix" / "pyproject.toml"
    text = pyproject.read_text()
    cut = re.sub(r'\[project\.entry-points\."sglang\.srt\.plugins"\]\n[^\[]*', "", text)
    assert cut != text
    pyproject.write_text(cut)
    ns = namespace
    op = operator_for(broken)
    cluster.apply(seed(**{"metadata.name": "broken", "spec.image.base": base_0518.split("@")[0],
                          "spec.speculative.algorithm": "DFLASH", "spec.speculative.draftModelPath": "/data2/draft",
                          "spec.engine.dp": 1, "spec.engine.enableDpAttention": False}), namespace=ns)

    def failed() -> dict[str, Any] | None:
        return cond_is(cluster, ns, "ImageReady", "False", "BuildFailed", name="broken")

    obj = wait_for(failed, BUILD_TIMEOUT, "broken: ImageReady=False/BuildFailed")
    message = condition(obj, "ImageReady")["message"]
    print(f"\nfigure: the failed build's condition message ends: ...{message[-300:]}")
    assert "SGLang 0.5.18 (without the decode-path fix) has no PD-decode draft-input builder for: DFLASH" in message, \
        message
    assert obj["status"]["phase"] == "Failed"
    assert cluster.list("deployments", ns, "specserving.io/instance=broken") == [], "no pool after a failed build"
    wait_for(lambda: metric(op, "specserving_builds_total", 'result="failed"') == 1, 60,
             "specserving_builds_total{result=failed} = 1")


def test_a_base_with_its_own_builder_runs_as_is(cluster: Cluster, namespace: str, base_0517: str,
                                                operator_for: Any) -> None:
    ns = namespace
    op = operator_for()
    base = base_0517.split("@")[0]
    cluster.apply(seed(**{"metadata.name": "upstream", "spec.image.base": base}), namespace=ns)
    obj = wait_for(lambda: ready(cluster, ns, "upstream"), READY_TIMEOUT, "upstream: Ready on the base")
    assert condition(obj, "ImageReady")["reason"] == "NotNeeded"
    assert obj["status"]["image"]["resolved"] == base and pool_images(cluster, ns, "upstream") == {base}
    assert cluster.list("jobs", ns, "specserving.io/build") == []
    assert metric(op, "specserving_builds_total", 'result="started"') == 0


# -- what rootless BuildKit needs from the pod ---------------------------------------------------------------------

def _build_pod(namespace: str, name: str, buildkit_image: str) -> dict[str, Any]:
    """The pod of the operator's rendered build Job (the same securityContext, volumes and flags), with a command
    that only starts buildkitd rootless and asks it for its workers."""
    from specserving.api.loading import spec_of
    from specserving.capabilities import load
    from specserving.imagebuild import context
    from specserving.imagebuild.job import BuildSettings, build_objects
    from specserving.imagebuild.planning import plan

    ip = plan(spec_of(seed(**{"spec.image.base": f"{REGISTRY_HOST}/x/sglang:v0.5.16"})), load(),
              fix_version="f", default_registry=f"{REGISTRY_HOST}/{PUSH_REPO}")
    settings = BuildSettings(buildkit_image=buildkit_image, insecure_registries=(REGISTRY_HOST,),
                             node_selector={NODE_LABEL: "true"},
                             tolerations=({"key": NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"},),
                             resources={"requests": {"cpu": "100m", "memory": "256Mi"}})
    _, job = build_objects(ip, context.load(), namespace=namespace, push_secret=None, settings=settings)
    spec = job["spec"]["template"]["spec"]
    spec["volumes"] = [v for v in spec["volumes"] if "configMap" not in v]
    container = spec["containers"][0]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] in {v["name"] for v in spec["volumes"]}]
    container["env"] = [{"name": "BUILDKITD_FLAGS", "value": "--oci-worker-no-process-sandbox"}]
    container["command"] = ["buildctl-daemonless.sh", "debug", "workers"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def _run_to_end(cluster: Cluster, pod: dict[str, Any]) -> tuple[str, str]:
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    cluster.apply(pod, namespace=ns)

    def ended() -> dict[str, Any] | None:
        got = cluster.get("pod", name, ns)
        return got if got and got["status"].get("phase") in ("Succeeded", "Failed") else None

    done = wait_for(ended, 180, f"pod {name} to end")
    logs = cluster.kubectl("logs", name, "-n", ns, check=False)
    return done["status"]["phase"], logs.stdout + logs.stderr


@pytest.mark.parametrize(("change", "works"), [
    ("as rendered", True),
    ("seccomp RuntimeDefault", False),
    ("allowPrivilegeEscalation false", False),
])
def test_rootless_buildkit_needs_exactly_what_the_build_pod_has(cluster: Cluster, namespace: str,
                                                                 buildkit_image: str, change: str,
                                                                 works: bool) -> None:
    pod = _build_pod(namespace, "buildkitd-" + re.sub(r"[^a-z]+", "-", change.lower()).strip("-"), buildkit_image)
    sc = pod["spec"]["containers"][0]["securityContext"]
    if change == "seccomp RuntimeDefault":
        sc["seccompProfile"] = {"type": "RuntimeDefault"}
    elif change == "allowPrivilegeEscalation false":
        sc["allowPrivilegeEscalation"] = False
    phase, log = _run_to_end(cluster, pod)
    why = next((ln for ln in log.splitlines() if "error" in ln.lower()), log.strip().splitlines()[-1] if log else "")
    print(f"\nfigure: buildkitd {change}: {phase}; {why[:300]}")
    if works:
        assert phase == "Succeeded" and re.search(r"^ID\s+PLATFORMS", log, re.M), log[-2000:]
    else:
        assert phase == "Failed" and "buildkitd exited before it answered" in log, log[-2000:]


def test_the_build_namespace_must_allow_privileged_pod_security(cluster: Cluster, namespace: str,
                                                                buildkit_image: str) -> None:
    pod = _build_pod(namespace, "psa-check", buildkit_image)
    for level, allowed in (("restricted", False), ("baseline", False), ("privileged", True)):
        cluster.kubectl("label", "namespace", namespace, "--overwrite", f"pod-security.kubernetes.io/enforce={level}")
        out = cluster.kubectl("create", "--dry-run=server", "-o", "name", "-f", "-", input=json.dumps(pod), check=False)
        print(f"\nfigure: the build pod under Pod Security {level!r}: "
              f"{'admitted' if out.returncode == 0 else out.stderr.strip()[:300]}")
        assert (out.returncode == 0) == allowed, out.stderr
        if not allowed:
            assert "seccompProfile" in out.stderr or "unconfined" in out.stderr.lower(), out.stderr
