"""`specserving run` refuses to start with one clear line, exit 1 and no traceback (no cluster needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specserving.cli", "run", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_a_missing_kubeconfig(tmp_path: Path) -> None:
    line = one_line(run("--namespace", "x", "--kubeconfig", str(tmp_path / "nope.yaml")))
    assert line == f"specserving: kubeconfig {tmp_path / 'nope.yaml'} does not exist"


def test_an_unreachable_api_server(tmp_path: Path) -> None:
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
              "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
              "users": [{"name": "u", "user": {"token": "t"}}],
              "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(yaml.safe_dump(config))
    line = one_line(run("--namespace", "x", "--kubeconfig", str(path), "--metrics-port", "0"))
    assert line == "specserving: cannot reach the Kubernetes API server at https://127.0.0.1:1: Connection refused"


def test_a_scope_is_required() -> None:
    proc = run()
    assert proc.returncode == 2
    assert "one of the arguments -n/--namespace -A/--all-namespaces is required" in proc.stderr
