"""`specserving run` as a subprocess of the bench, with what /proc and its /metrics say about it."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from harness.operator import SPECSERVING, OperatorProcess
from harness.process import free_port
from specserving.webhook.configuration import validating_configuration
from specserving.webhook.tls import generate

from bench.kubeapi import Api

CLK_TCK = os.sysconf("SC_CLK_TCK")
WRITE_VERBS = ("APPLY", "PATCH", "POST", "PUT", "DELETE")


class Operator(OperatorProcess):
    """`specserving run --namespace NS` with metrics, liveness and (optionally) the webhook.

    The webhook runs as the Helm chart runs it (`webhook_mode="chart"`): certificate files made beforehand and a
    ValidatingWebhookConfiguration the operator does not own, here applied by the bench. `"self"` is the local
    clusters' mode instead, in which the operator makes its certificate and configuration (and so imports
    cryptography: 8.8 MiB more RSS)."""

    STOP_GRACE = 20.0

    def __init__(self, kubeconfig: str, namespace: str, log: Path, *, resync_seconds: float,
                 webhook_configuration: str | None, env: dict[str, str], extra: Sequence[str] = (),
                 webhook_mode: str = "chart") -> None:
        self.health, self.metrics_port = free_port(), free_port()
        self.webhook_configuration = webhook_configuration
        self.webhook_url = ""
        cmd = [SPECSERVING, "run", "--namespace", namespace, "--kubeconfig", kubeconfig,
               "--liveness", f"http://127.0.0.1:{self.health}/healthz", "--metrics-port", str(self.metrics_port),
               "--metrics-address", "127.0.0.1", "--resync-seconds", f"{resync_seconds:g}", "--no-load-probe",
               # kwok pods answer no request: a serving check would only measure its own retries.
               "--serving-checks", "Off",
               # The seed's model folder (the chart's default allows no hostPath at all; policy.py).
               "--allow-host-path", "/data2"]
        configuration = None
        if webhook_configuration:
            port = free_port()
            self.webhook_url = f"https://127.0.0.1:{port}"
            cmd += ["--webhook-port", str(port), "--webhook-listen", "127.0.0.1"]
            cert_dir = log.parent / f"webhook-tls-{namespace}"
            if webhook_mode == "self":
                cmd += ["--webhook-cert-dir", str(cert_dir), "--webhook-configuration", "self",
                        "--webhook-configuration-name", webhook_configuration]
            else:
                material = generate(cert_dir, ["127.0.0.1", "localhost"])
                cmd += ["--webhook-certfile", str(material.certfile), "--webhook-keyfile", str(material.keyfile),
                        "--webhook-configuration", "none"]
                configuration = validating_configuration(material.ca_pem, url=self.webhook_url,
                                                          name=webhook_configuration, namespaces=[namespace])
        self.cmd = [*cmd, *extra]
        self.started = time.monotonic()
        self.launch(self.cmd, env, log)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 60
        while not self._healthy():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the operator did not become healthy in 60 s; log: {log}\n{self.tail()}")
            time.sleep(0.2)
        if configuration is not None:
            try:
                Api(kubeconfig).apply_webhook_configuration(configuration)
            except RuntimeError:
                self.stop()
                raise

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
