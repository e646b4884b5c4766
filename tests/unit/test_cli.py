"""The CLI as a user meets it: output, exit codes, and one clear line (never a traceback) for bad input."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from .builders import ROOT, SEED_EXAMPLE, seed


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specserving.cli", *args], capture_output=True, text=True,
                          input=stdin, cwd=ROOT, timeout=120)


def test_render_prints_the_seed_deployment() -> None:
    out = run("render", "-f", str(SEED_EXAMPLE))
    assert out.returncode == 0, out.stderr
    docs = list(yaml.safe_load_all(out.stdout))
    deps = {d["metadata"]["labels"]["specserving.io/role"]: d for d in docs if d["kind"] == "Deployment"}
    assert set(deps) == {"prefill", "decode", "router"}
    revision = deps["decode"]["metadata"]["labels"]["specserving.io/revision"]
    assert re.fullmatch(r"[0-9a-f]{8}", revision)
    assert {d["metadata"]["name"] for d in deps.values()} == {
        f"dsv4-flash-prefill-{revision}", f"dsv4-flash-decode-{revision}", "dsv4-flash-router"}
    for role in ("prefill", "decode"):
        pod = deps[role]["spec"]["template"]
        c = pod["spec"]["containers"][0]
        args = " ".join(c["args"])
        for want in (f"--disaggregation-mode {role}", "--speculative-algorithm DSPARK", "--tp-size 8",
                     "--dp-size 8", "--enable-dp-attention",
                     "--disaggregation-ib-device mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7"):
            assert want in args
        assert c["resources"]["limits"] == {"nvidia.com/gpu": "8", "rdma/ib": "8"}
        assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]
    assert "--cuda-graph-bs-decode 1 2 3 4 5 6 7 8 9 10 12 16" in " ".join(
        deps["decode"]["spec"]["template"]["spec"]["containers"][0]["args"])
    assert deps["prefill"]["spec"]["template"]["metadata"]["annotations"] == {
        "sglang.ai/bootstrap-port": "8998"}
    router_args = deps["router"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert router_args[:2] == ["--pd-disaggregation", "--service-discovery"]


def test_render_namespace_flag() -> None:
    out = run("render", "-f", str(SEED_EXAMPLE), "-n", "prod")
    assert {d["metadata"]["namespace"] for d in yaml.safe_load_all(out.stdout)} == {"prod"}


@pytest.mark.parametrize("registry", [None, "registry.example.com/ml"])
def test_render_never_prints_the_crashing_base_silently(tmp_path: Path, registry: str | None) -> None:
    # DFLASH on SGLang 0.5.18: the base has no PD-decode builder for it, so the operator would build and deploy
    # the fixed image; render must say so and must not put the base in the pools.
    base = "lmsysorg/sglang:v0.5.18-cu129"
    cr = tmp_path / "cr.yaml"
    cr.write_text(yaml.safe_dump(seed(**{"spec.image.base": base, "spec.speculative.algorithm": "DFLASH",
                                         "spec.speculative.draftModelPath": "/data2/draft",
                                         "spec.engine.enableDpAttention": False, "spec.engine.dp": 1})))
    out = run("render", "-f", str(cr), *(["--build-registry", registry] if registry else []))
    assert out.returncode == 0, out.stderr
    images = {c["image"] for d in yaml.safe_load_all(out.stdout) if d["kind"] == "Deployment"
              and d["metadata"]["labels"]["specserving.io/role"] in ("prefill", "decode")
              for c in d["spec"]["template"]["spec"]["containers"]}
    (image,) = images
    assert base not in images and "/sglang-pd:pd-" in image
    assert image.startswith(registry or "build-registry.invalid/")
    (warning,) = [ln for ln in out.stderr.splitlines() if "build Job" in ln]
    assert warning.startswith("warning: SGLang 0.5.18 lacks the PD-decode builder for DFLASH")
    assert "would crash the first decode" in warning and image in warning


def test_render_of_a_base_with_its_own_builder_prints_the_base() -> None:
    out = run("render", "-f", str(SEED_EXAMPLE))
    assert "build Job" not in out.stderr and "sglang-pd" not in out.stdout


def test_validate_accepts_every_example() -> None:
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        out = run("validate", "-f", str(example))
        assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(("changes", "words"), [
    ({"spec.speculative.algorithm": "NGRAM"}, ["spec.speculative.algorithm", "0.5.17", "DSPARK, EAGLE"]),
    ({"spec.image.base": "lmsysorg/sglang:v0.5.18-cu129", "spec.image.build": {"policy": "Never"},
      "spec.engine.enableDpAttention": False, "spec.engine.dp": 1,
      "spec.speculative": {"algorithm": "DFLASH", "draftModelPath": "/data2/d"}},
     ["spec.speculative.algorithm", "0.5.18", "DSPARK, EAGLE"]),
])
def test_validate_refuses_with_exit_1(tmp_path: Path, changes: dict[str, object], words: list[str]) -> None:
    f = tmp_path / "cr.yaml"
    f.write_text(yaml.safe_dump(seed(**changes)))
    out = run("validate", "-f", str(f))
    assert out.returncode == 1
    for word in words:
        assert word in out.stderr
    assert "Traceback" not in out.stderr


def test_a_refused_specserving_exits_1_schema_errors_included(tmp_path: Path) -> None:
    for i, changes in enumerate([{"spec.engine.tensorParallel": 8}, {"spec.engine.tp": 8.5},
                                 {"spec.decode.extraArgs": ["--speculative-al", "NGRAM"]}]):
        f = tmp_path / f"cr{i}.yaml"
        f.write_text(yaml.safe_dump(seed(**changes)))
        out = run("validate", "-f", str(f))
        assert out.returncode == 1, (changes, out.stderr)
        assert "Traceback" not in out.stderr and "celpy" not in out.stderr, out.stderr


@pytest.mark.parametrize(("content", "words"), [
    (None, ["no such file"]),
    ("spec: [", ["not valid YAML", "line"]),
    ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n", ["kind", "SpecServing"]),
    ("a: 1\n---\nb: 2\n", ["exactly one"]),
], ids=["missing-file", "not-yaml", "wrong-kind", "two-documents"])
def test_bad_input_gets_one_line_and_exit_2(tmp_path: Path, content: str | None, words: list[str]) -> None:
    f = tmp_path / "cr.yaml"
    if content is not None:
        f.write_text(content)
    for command in ("validate", "render"):
        out = run(command, "-f", str(f))
        assert out.returncode == 2, out.stderr
        assert "Traceback" not in out.stderr
        errors = [line for line in out.stderr.splitlines() if not line.endswith("nothing would be admitted")]
        assert len(errors) == 1, out.stderr
        for word in words:
            assert word in out.stderr


def test_crd_command_prints_the_committed_crd() -> None:
    out = run("crd")
    assert out.returncode == 0
    assert out.stdout == (ROOT / "crds" / "specserving.io_specservings.yaml").read_text()


def test_stdin() -> None:
    out = run("validate", "-f", "-", stdin=SEED_EXAMPLE.read_text())
    assert out.returncode == 0, out.stderr


def test_plan_from_a_file_names_the_contract_fields_and_the_steps(tmp_path: Path) -> None:
    new = tmp_path / "new.yaml"
    new.write_text(yaml.safe_dump(seed(**{"spec.speculative.algorithm": "EAGLE3",
                                          "spec.speculative.draftModelPath": "/data2/draft",
                                          "spec.rollout": {"strategy": "Stepped", "maxSurge": 1}})))
    out = run("plan", "-f", str(new), "--from", str(SEED_EXAMPLE))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert re.fullmatch(r"the PD contract changes: revision [0-9a-f]{8} -> [0-9a-f]{8}", lines[0]), lines
    assert lines[1] == "because of: spec.speculative"
    assert lines[2] == "steps (Stepped):"
    assert [ln.split(":")[0].strip() for ln in lines[3:]] == [
        "1. ScalingUpNew", "2. ScalingDownOld", "3. SwitchingRouter", "4. DrainingOld"]


def test_plan_of_a_change_outside_the_contract_and_of_a_creation(tmp_path: Path) -> None:
    new = tmp_path / "new.yaml"
    new.write_text(yaml.safe_dump(seed(**{"spec.decode.replicas": 6})))
    out = run("plan", "-f", str(new), "--from", str(SEED_EXAMPLE))
    assert out.returncode == 0 and "the PD contract is unchanged" in out.stdout and "no rollout" in out.stdout
    out = run("plan", "-f", str(new))
    assert out.returncode == 0 and out.stdout.startswith("creates revision ")


def test_plan_live_without_a_cluster_is_one_line(tmp_path: Path) -> None:
    out = run("plan", "-f", str(SEED_EXAMPLE), "--live", "--kubeconfig", str(tmp_path / "missing"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True))


@pytest.mark.parametrize(("content", "words"), [
    (BOMB.encode(), "expands to more than 100000 YAML nodes"),
    (("a: " + "[" * 100 + "]" * 100).encode(), "nested deeper than 64 levels"),
    (("a: " + "[" * 5000 + "]" * 5000).encode(), "nested deeper than 64 levels"),
    (b"a: &a [*a]\n", "recursive document"),
    (b"apiVersion: \xff\xfe\n", "not UTF-8 text (byte 0xff at offset 12)"),
    (b"a: " + b"x" * (1 << 20), "larger than 1024 KiB"),
])
def test_hostile_files_get_one_line_and_exit_2(tmp_path: Path, content: bytes, words: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content)
    started = time.monotonic()
    out = run("validate", "-f", str(bad))
    assert out.returncode == 2 and words in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert time.monotonic() - started < 30


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("ab:-&*[]{},'\"\n #!|>01")), max_size=200))
def test_random_yaml_is_read_or_refused_never_crashes(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    from specserving.cli import InputError, load_object
    from specserving.validation import validate

    f = tmp_path_factory.mktemp("fuzz") / "x.yaml"
    f.write_text(text)
    try:
        obj = load_object(str(f))
    except InputError:
        return
    validate(obj)
