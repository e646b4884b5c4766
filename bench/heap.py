"""`--heap-profile`: what the operator's Python heap holds once every SpecServing is Ready, by allocating line.

The operator runs with a sitecustomize (written to the work dir and put first on its PYTHONPATH) that starts
tracemalloc with one frame per allocation a few seconds after start-up, so the imports (kopf and the kubernetes
client: about 80 MiB of the start-up RSS) are not traced and cost nothing, and that writes the top allocation
sites to a file on SIGUSR2. The bench sends the signal when every SpecServing is Ready and reads the file back.
Tracing slows every allocation, so the run's timings are not comparable with one made without it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

HOOK = '''\
import os, signal, threading, tracemalloc, json

def _start():
    tracemalloc.start(1)

def _dump(signum, frame):
    out = os.environ["SPECSERVING_HEAP_OUT"]
    snapshot = tracemalloc.take_snapshot()
    current, peak = tracemalloc.get_traced_memory()
    top = [{"where": str(s.traceback[0]), "kib": round(s.size / 1024, 1), "count": s.count}
           for s in snapshot.statistics("lineno")[:60]]
    with open(out + ".tmp", "w") as f:
        json.dump({"traced_mib": round(current / 2**20, 1), "traced_peak_mib": round(peak / 2**20, 1),
                   "top": top}, f)
    os.replace(out + ".tmp", out)

if os.environ.get("SPECSERVING_HEAP_OUT"):
    _timer = threading.Timer(float(os.environ.get("SPECSERVING_HEAP_DELAY", "10")), _start)
    _timer.daemon = True
    _timer.start()
    signal.signal(signal.SIGUSR2, _dump)
'''


def env_for(work: Path) -> dict[str, str]:
    """The environment additions that make the operator traceable."""
    hook_dir = work / "heap-hook"
    hook_dir.mkdir(parents=True, exist_ok=True)
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    return {"PYTHONPATH": str(hook_dir) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "SPECSERVING_HEAP_OUT": str(work / "heap.json")}


def snapshot(pid: int, work: Path, n: int, timeout: float = 120.0) -> dict[str, Any]:
    """Ask the operator for its heap now; the top sites, per SpecServing too."""
    out = work / "heap.json"
    out.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + timeout
    while not out.exists():
        if time.monotonic() > deadline:
            return {"error": f"no heap snapshot in {out} after {timeout:.0f} s"}
        time.sleep(0.5)
    found: dict[str, Any] = json.loads(out.read_text())
    for site in found["top"]:
        site["kib_per_specserving"] = round(site["kib"] / n, 2)
    (work / f"heap-{n}.json").write_text(json.dumps(found, indent=1))
    return found
