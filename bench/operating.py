"""`specserving run` as a subprocess of the bench, with what /proc and its /metrics say about it."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

SPECSERVING = str(Path(sys.executable).parent / "specserving")  # the console script beside this Python
CLK_TCK = os.sysconf("SC_CLK_TCK")
WRITE_VERBS = ("APPLY", "PATCH", "POST", "PUT", "DELETE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_prometheus(text: str) -> dict[str, float]:
    """'name{labels}' -> value for every sample."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out


def labels_of(key: str) -> tuple[str, dict[str, str]]:
    metric, _, rest = key.partition("{")
    return metric, dict(re.findall(r'(\w+)="([^"]*)"', rest))


def select(samples: dict[str, float], metric_name: str, **want: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples of metric `metric_name` whose labels match `want` (regexes), keyed by their sorted labels."""
    out = {}
    for key, value in samples.items():
        metric, labels = labels_of(key)
        if metric == metric_name and all(re.fullmatch(v, labels.get(k, "")) for k, v in want.items()):
            out[tuple(sorted(labels.items()))] = value
    return out


def total(samples: dict[str, float], metric_name: str, **want: str) -> float:
    return sum(select(samples, metric_name, **want).values())


def by_label(samples: dict[str, float], metric_name: str, label: str, **want: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in select(samples, metric_name, **want).items():
        k = dict(labels).get(label, "")
        out[k] = out.get(k, 0.0) + value
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


class Operator:
    """`specserving run --namespace NS` with metrics, liveness and (optionally) the webhook in self mode."""

    def __init__(self, kubeconfig: str, namespace: str, log: Path, *, resync_seconds: float,
                 webhook_configuration: str | None, env: dict[str, str], extra: Sequence[str] = ()) -> None:
        self.health, self.metrics_port, self.log = free_port(), free_port(), log
        self.webhook_configuration = webhook_configuration
        self.webhook_url = ""
        cmd = [SPECSERVING, "run", "--namespace", namespace, "--kubeconfig", kubeconfig,
               "--liveness", f"http://127.0.0.1:{self.health}/healthz", "--metrics-port", str(self.metrics_port),
               "--metrics-address", "127.0.0.1", "--resync-seconds", f"{resync_seconds:g}", "--no-load-probe"]
        if webhook_configuration:
            port = free_port()
            self.webhook_url = f"https://127.0.0.1:{port}"
            cmd += ["--webhook-port", str(port), "--webhook-listen", "127.0.0.1",
                    "--webhook-cert-dir", str(log.parent / f"webhook-tls-{namespace}"),
                    "--webhook-configuration", "self", "--webhook-configuration-name", webhook_configuration]
        self.cmd = [*cmd, *extra]
        log.parent.mkdir(parents=True, exist_ok=True)
        self._out = log.open("w")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdout=self._out, stderr=subprocess.STDOUT, env=env)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 60
        while not self._healthy():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the operator did not become healthy in 60 s; log: {log}\n{self.tail()}")
            time.sleep(0.2)

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text()[-n:]
        except OSError:
            return ""

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the operator exited with {self.proc.returncode}:\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health}/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            return parse_prometheus(r.read().decode())

    def cpu_seconds(self) -> float:
        """User + system CPU of the operator process so far (its threads included)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime

    def memory(self) -> tuple[float, float]:
        """(current RSS, peak RSS) in MiB, from /proc/PID/status (VmRSS, VmHWM)."""
        found = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) / 1024
        return found.get("VmRSS", 0.0), found.get("VmHWM", 0.0)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()
