"""images/sglang-pd/Dockerfile: linted with hadolint, and shaped as the operator's build Job expects."""

from __future__ import annotations

import re
import subprocess

import pytest

from .conftest import ROOT, gen

pytestmark = pytest.mark.decode_path

DOCKERFILE = ROOT / "images/sglang-pd/Dockerfile"


HADOLINT = "tools/hadolint-2.15.1/bin/hadolint"


def test_hadolint() -> None:
    hadolint = gen.cache_dir() / HADOLINT
    if not hadolint.exists():
        pytest.fail("hadolint is missing from the decode-path cache: rerun bash hack/decode-path-env.sh",
                    pytrace=False)
    proc = subprocess.run([str(hadolint), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_build_arguments_and_probe_step() -> None:
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    assert base and base.group(1).startswith("lmsysorg/sglang:v") and not base.group(1).endswith(":latest")
    assert re.search(r"^ARG REQUIRE_ALGORITHMS=", text, re.M)
    assert re.search(r'^RUN python3 -m specserving_pdfix\.probe --require "\$\{REQUIRE_ALGORITHMS\}"', text, re.M)
    assert re.search(r"mooncake-transfer-engine==\$\{MOONCAKE_VERSION\}", text)
    assert re.search(r"^ARG MOONCAKE_VERSION=\d+\.\d+\.\d+", text, re.M)
    # The built image keeps its base's user: the pods set it (docs/security.md), so a build never changes who runs
    # SGLang.
    assert not re.findall(r"^USER ", text, re.M), "the image must not set a USER of its own"
    assert "org.opencontainers.image.title" in text
