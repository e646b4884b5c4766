"""The bench end to end at N=5 with a few-second idle window: every figure is produced (not how fast it is).

It runs `python -m bench` as `make bench` does, on its own control plane (cluster specserving-bench-smoke-<pid>,
started and stopped by the bench, 12 fake GPU nodes), and writes everything to a temporary folder, never docs/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from harness.cluster import stop_orphans

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
N = 5


DOCS = [REPO / "docs" / "benchmarks.md", REPO / "docs" / "benchmarks-latency.png"]
PREFIX = "specserving-bench-smoke-"


def _mtimes() -> list[float | None]:
    return [p.stat().st_mtime if p.exists() else None for p in DOCS]


BEFORE = _mtimes()


def docs_untouched() -> bool:
    return _mtimes() == BEFORE


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    stop_orphans(PREFIX, os.environ, 300)
    out = tmp_path_factory.mktemp("bench")
    cmd = [sys.executable, "-m", "bench", "--sizes", str(N), "--idle-seconds", "3", "--scale-samples", "2",
           "--children-repeats", "1", "--children-repeats-at", str(N),
           "--webhook-rates", "20", "--webhook-seconds", "2",
           "--webhook-quiet-seconds", "20",
           "--cluster-name", f"{PREFIX}{os.getpid()}",
           "--out-md", str(out / "benchmarks.md"), "--out-png", str(out / "benchmarks-latency.png"),
           "--out-json", str(out / "results.json"), "--work-dir", str(out / "work")]
    proc = subprocess.run(cmd, cwd=REPO, text=True, capture_output=True, timeout=1100, check=False)
    return proc, out


def _numbers(obj: Any, path: str) -> None:
    """Every leaf the report reads is a number (a figure that was not measured would be None)."""
    assert obj is not None, f"{path} is missing"
    if isinstance(obj, dict):
        for k, v in obj.items():
            _numbers(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _numbers(v, f"{path}[{i}]")


def test_bench_runs_and_reports_every_figure(run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, out = run
    assert proc.returncode == 0, f"python -m bench exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    results = json.loads((out / "results.json").read_text())
    (size,) = results["sizes"]
    assert size["n"] == N and "error" not in size, size
    op, base = size["operator"], size["baseline"]
    (wh,) = results["webhook"]["rates"]
    assert wh["rate"] == 20
    for side in (op, base):
        for what in ("children", "ready"):
            _numbers({k: side[what][k] for k in ("p50", "p99", "max")}, what)
        assert side["ready"]["n"] == N
        # The burst's N, and one more instance applied alone and deleted again.
        assert side["children"]["n"] == N + 1 and len(side["children_samples"]) == N + 1, side["children_samples"]
        assert side["children_samples"][:N] == side["samples"]["children"]
        _numbers([side["children_since_own_apply"]["p50"], side["ready_since_own_apply"]["p50"],
                  side["scale"]["p50"], side["scale"]["max"]], "own-apply figures and scale")
        assert side["scale"]["n"] == 2
    assert op["cpu_seconds"] > 0 and op["peak_rss_mib"] > 0 and op["rss_start_mib"] > 0
    assert op["requests_by_verb"].get("APPLY", 0) >= 11 * N, op["requests_by_verb"]
    assert op["writes_per_specserving"] >= 11 and op["child_applies_apiserver"] >= 11 * N
    assert base["apiserver_requests"], "the API server's request counts were read"
    lws = size["peer"]
    assert "error" not in lws and "skipped" not in lws, lws
    _numbers([lws[k]["p50"] for k in ("statefulsets", "pods", "available")] + [lws["peak_rss_mib"]], "peer")
    assert lws["statefulsets"]["n"] == N and lws["peak_rss_mib"] > 0
    assert op["webhook_during_apply"]["calls"] >= N, "the API server called the webhook for every SpecServing"
    _numbers({k: op["webhook_during_apply"][k] for k in ("mean_ms", "p50_ms", "p99_ms")}, "webhook during apply")
    queues = op["queue_depth"]
    assert queues["t"] and all(len(queues[k]) == len(queues["t"]) for k in queues["peak"]), queues
    _numbers(queues["peak"], "queue depth peaks")
    idle = op["idle"]
    _numbers({k: idle[k] for k in ("passes", "operator_requests", "operator_writes", "status_writes",
                                   "apiserver_applies_and_specserving_writes", "cpu_seconds")}, "idle")
    assert idle["seconds"] == 3 and idle["passes"] >= N, idle
    for series in ("webhook", "no_webhook", "noop_webhook", "webhook_direct"):
        assert wh[series]["n"] >= 20 and wh[series]["errors"] == 0, wh[series]
        _numbers({k: wh[series][k] for k in ("p50_ms", "p99_ms", "max_ms", "achieved_rate")}, series)
    _numbers({k: wh[k] for k in ("added_p50_ms", "added_p99_ms", "handler_p50_ms", "handler_p99_ms",
                                 "apiserver_call_p99_ms", "quiet_wait_s", "cpu_busy_before", "noop_added_p50_ms",
                                 "noop_added_p99_ms", "beyond_noop_p50_ms", "beyond_noop_p99_ms",
                                 "noop_apiserver_call_p99_ms")}, "webhook")
    assert 0 <= wh["cpu_busy_before"] <= 1, wh["cpu_busy_before"]
    assert results["settings"]["webhook_quiet"]["limit_s"] == 20
    assert wh["quiet_wait_s"] <= 20 + 2 * results["settings"]["webhook_quiet"]["window_s"], "the quiet wait is capped"
    assert op["log_errors"] == 0
    for k in ("nproc", "memory_gib", "kubernetes", "python", "kopf"):
        assert results["machine"][k], k
    assert results["settings"]["webhook_mode"] == "chart", "the webhook runs on certificate files, as the chart's"

    md = (out / "benchmarks.md").read_text()
    for words in ("## Targets", "within 1.2x of raw SSA", "within 1.5x of scaling the Deployment",
                  "zero writes on an idle resync", "200 MiB RSS", "webhook p99", "## Every figure", f"N={N}",
                  "benchmarks-latency.png", "Kubernetes v1.", "the webhook on certificate files",
                  "seconds waited for them to settle", "each apply alone in order", "a no-op Go webhook adds",
                  "ours adds beyond the no-op webhook"):
        assert words in md, words
    figures = md.split("## Every figure")[1].split("## Method")[0]
    assert "| - |" not in figures, f"a figure is missing in the table:\n{figures}"
    assert (out / "benchmarks-latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Targets:" in proc.stdout, "the table is printed"
    assert docs_untouched(), "the smoke run wrote to docs/"
