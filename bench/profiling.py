"""`--profile`: py-spy samples the operator process during a phase; the bench keeps the collapsed stacks and a
summary of where the time went (`python -m bench.profiling FILE` prints it again)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Profile:
    """py-spy record --pid PID --format raw (collapsed stacks), nonblocking, from start to stop()."""

    def __init__(self, pid: int, out: Path) -> None:
        exe = py_spy()
        if exe is None:
            raise RuntimeError("--profile needs py-spy (pip install py-spy==0.4.3)")
        self.out = out
        self.proc = subprocess.Popen([exe, "record", "--pid", str(pid), "--format", "raw", "--nonblocking",
                                      "--rate", "100", "-o", str(out)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)

    def stop(self) -> dict[str, Any]:
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        if not self.out.exists():
            return {"error": (err or "").strip()[-500:]}
        return summarize(self.out)


def summarize(path: Path, top: int = 25) -> dict[str, Any]:
    """Inclusive and self sample counts per function ('function (file)'), from py-spy's collapsed stacks."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = [_frame(f) for f in stack.split(";")]
        for f in set(frames):
            if not any(g in f for g in GENERIC):
                inclusive[f] += n
        own[frames[-1]] += n
    return {"file": str(path), "samples": total,
            "inclusive": [(f, n, round(100 * n / total, 1)) for f, n in inclusive.most_common(top)] if total else [],
            "self": [(f, n, round(100 * n / total, 1)) for f, n in own.most_common(top)] if total else []}


GENERIC = ("asyncio/", "threading.py", "concurrent/futures/", "runpy.py", "<module>", "specserving/cli.py",
           "reconcile/runner.py", "kopf/_core/reactor/running.py")


def _frame(f: str) -> str:
    # py-spy raw frames look like "function (package/module.py:123)"; drop the line number.
    head, _, rest = f.partition(" (")
    return f"{head} ({rest.rsplit(':', 1)[0]})" if rest else head


def main() -> int:
    for arg in sys.argv[1:]:
        s = summarize(Path(arg))
        print(f"{arg}: {s['samples']} samples")
        for title in ("inclusive", "self"):
            print(f"  {title}:")
            for f, n, pct in s[title]:
                print(f"    {pct:5.1f}%  {n:6d}  {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
