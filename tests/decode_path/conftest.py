"""Fixtures for the decode_path tier: the per-version SGLang interpreters and the runs in them.

Every run a selected test declares (`runs_for`) starts when the session does, two at a time, so both cores
stay busy; a test then waits for its own runs only.

The interpreters are built by `bash hack/decode-path-env.sh` (run by `make test-decode-path` first). When they
are missing the tests fail and say so; they are never skipped.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
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


PROBE_ARGS = ("-m", "specserving_pdfix.probe", "--compare")
RUN_TIMEOUT = 600  # seconds for one run; an import of torch and SGLang takes 5-20


@dataclass(frozen=True)
class Run:
    """`python ARGS` in one SGLang release's interpreter with the fix importable; with `router`, in the first
    interpreter with sglang-router and smg on the path instead (the routers' parsers need no SGLang release)."""

    version: str
    args: tuple[str, ...]
    router: bool = False


def python_run(version: str, *args: str) -> Run:
    return Run(version, args)


def script_run(version: str, script: str) -> Run:
    return Run(version, ("-c", script))


def router_run(script: str) -> Run:
    return Run(VERSIONS[0], ("-c", script), router=True)


def probe_runs() -> list[Run]:
    return [Run(v, PROBE_ARGS) for v in VERSIONS]


def runs_for(make: Callable[..., Iterable[Run]]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declares the subprocess runs a test reads (a function of its parameters), so the session can start them
    before the test is reached. Each run takes seconds (it imports torch and SGLang); started two at a time from
    the beginning, they keep both cores busy instead of one."""

    def mark(test: Callable[..., Any]) -> Callable[..., Any]:
        test.decode_path_runs = make  # type: ignore[attr-defined]
        return test

    return mark


PLANNED = pytest.StashKey[list[Run]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Plan the runs of the selected tests only, the probes first (the first tests read all of them)."""
    here = Path(__file__).parent
    planned: list[Run] = []
    for item in items:
        if here not in item.path.parents:
            continue
        if "reports" in getattr(item, "fixturenames", ()):
            planned[:0] = [r for r in probe_runs() if r not in planned]
        make = getattr(getattr(item, "function", None), "decode_path_runs", None)
        if make is not None:
            callspec = getattr(item, "callspec", None)
            planned.extend(r for r in make(**(callspec.params if callspec else {})) if r not in planned)
    config.stash[PLANNED] = planned


class Runner:
    """Runs each `Run` once per session, at most `jobs` at a time, and hands out the finished process."""

    def __init__(self, envs: dict[str, Any], pdfix_site: Path, jobs: int) -> None:
        self._envs, self._pdfix_site = envs, pdfix_site
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="decode-path")
        self._futures: dict[Run, concurrent.futures.Future[subprocess.CompletedProcess[str]]] = {}
        self._lock = threading.Lock()

    def command(self, run: Run) -> tuple[list[str], dict[str, str]]:
        env_of = self._envs[run.version]
        cmd, environ = gen.python_command(env_of, self._pdfix_site, *run.args)
        if run.router:
            environ["PYTHONPATH"] = os.pathsep.join([str(router_dir()), env_of["pythonpath"][-1],
                                                     str(self._pdfix_site)])
        return cmd, environ

    def start(self, run: Run) -> concurrent.futures.Future[subprocess.CompletedProcess[str]]:
        with self._lock:
            if run not in self._futures:
                cmd, environ = self.command(run)
                self._futures[run] = self._pool.submit(
                    subprocess.run, cmd, env=environ, capture_output=True, text=True, timeout=RUN_TIMEOUT)
            return self._futures[run]

    def result(self, run: Run) -> subprocess.CompletedProcess[str]:
        return self.start(run).result()

    def json(self, run: Run) -> Any:
        """The last line of a run that prints one JSON document; the run must exit 0."""
        proc = self.result(run)
        what = "sglang-router" if run.router else f"sglang {run.version}"
        assert proc.returncode == 0, f"{what}: script failed:\n{proc.stderr[-4000:]}"
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def close(self) -> None:
        with self._lock:
            for future in self._futures.values():
                future.cancel()
        self._pool.shutdown(wait=True)


router_pins = gen.router_pins
router_dir = gen.router_dir


@pytest.fixture(scope="session")
def runner(envs: dict[str, Any], pdfix_site: Path, pytestconfig: pytest.Config) -> Iterator[Runner]:
    started = Runner(envs, pdfix_site, jobs=int(os.environ.get("DECODE_PATH_JOBS", "2")))
    for run in pytestconfig.stash.get(PLANNED, []):
        started.start(run)
    yield started
    started.close()


@pytest.fixture(scope="session")
def reports(runner: Runner) -> dict[str, dict[str, Any]]:
    """version -> {"upstream": probe --no-fix report, "withFix": probe report}, probed once per session."""
    found = {}
    for run in probe_runs():
        cmd, environ = runner.command(run)
        found[run.version] = gen.parse_probe(runner.result(run), cmd, environ)
    return found
