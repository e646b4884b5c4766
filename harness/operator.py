"""`specserving run` as a subprocess of a test or the bench: its log, its liveness endpoint and its /metrics."""

from __future__ import annotations

import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from harness import process
from harness.prometheus import parse_prometheus

SPECSERVING = str(Path(sys.executable).parent / "specserving")  # the console script beside this Python


class OperatorExited(RuntimeError):
    """The operator process ended while it was expected to run; the message ends with its log's tail."""


class OperatorProcess:
    """What every way of running the operator shares; subclasses choose its flags and how to wait for it."""

    STOP_GRACE = 15.0

    health: int
    metrics_port: int
    log: Path
    proc: subprocess.Popen[Any]
    _out: IO[Any]

    def launch(self, cmd: Sequence[str], env: Mapping[str, str], log: Path) -> None:
        """Start `cmd` with its output in `log` (liveness on self.health, metrics on self.metrics_port)."""
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._out = log.open("w")
        self.proc = subprocess.Popen(list(cmd), stdout=self._out, stderr=subprocess.STDOUT, env=dict(env))

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text()[-n:]
        except OSError:
            return ""

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise OperatorExited(f"the operator exited with {self.proc.returncode}:\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def metrics(self, *names: str) -> dict[str, float]:
        """Every sample of the operator's /metrics, or of the metrics `names` only (sample names, such as
        specserving_reconcile_total): 'name{labels}' -> value. Named, the operator collects only those (its
        prometheus-client's name[] filter): a whole page holds a series per pool of every SpecServing, and a
        sampler asking each second for all of them at N=1000 would load the process it measures."""
        query = "?" + urllib.parse.urlencode([("name[]", n) for n in names]) if names else ""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics{query}", timeout=10) as r:
            return parse_prometheus(r.read().decode())

    def stop(self) -> None:
        process.stop(self.proc, self._out, grace=self.STOP_GRACE)
