"""Fixtures for the decode_path tier: the per-version SGLang interpreters and session-wide probe runs.

The interpreters are built by `bash hack/decode-path-env.sh` (run by `make test-decode-path` first). When they
are missing the tests fail and say so; they are never skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_capabilities", ROOT / "hack/gen-capabilities.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gen = _load_generator()
VERSIONS: list[str] = gen.versions()


@pytest.fixture(scope="session")
def envs() -> dict[str, Any]:
    try:
        loaded: dict[str, Any] = gen.load_envs()
    except RuntimeError as exc:
        pytest.fail(f"decode_path environment not ready: {exc}", pytrace=False)
    for version, env in loaded.items():
        if not Path(env["python"]).exists():
            pytest.fail(f"sglang {version}: interpreter {env['python']} is gone: rerun bash hack/decode-path-env.sh",
                        pytrace=False)
    return loaded


@pytest.fixture(scope="session")
def pdfix_site(envs: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fix package installed with pip (entry point included) into a folder put on PYTHONPATH."""
    target = tmp_path_factory.mktemp("pdfix") / "site"
    gen.install_pdfix(envs[VERSIONS[0]]["python"], target)
    return target


@pytest.fixture(scope="session")
def reports(envs: dict[str, Any], pdfix_site: Path) -> dict[str, dict[str, Any]]:
    """version -> {"upstream": probe --no-fix report, "withFix": probe report}, probed once per session."""
    return gen.probe_all(pdfix_site, jobs=int(os.environ.get("DECODE_PATH_JOBS", "2")))


def run_in(envs: dict[str, Any], pdfix_site: Path, version: str, args: list[str],
           timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run `python ARGS` in one version's interpreter with the fix package importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*envs[version]["pythonpath"], str(pdfix_site)])
    env["PYTHONWARNINGS"] = "ignore"
    env.pop("SGLANG_PLUGINS", None)
    return subprocess.run([envs[version]["python"], *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def run_script(envs: dict[str, Any], pdfix_site: Path, version: str, script: str) -> Any:
    """Run a Python snippet in one version's interpreter; it prints one JSON document, which is returned."""
    proc = run_in(envs, pdfix_site, version, ["-c", script])
    assert proc.returncode == 0, f"sglang {version}: script failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
