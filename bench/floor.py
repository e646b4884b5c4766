"""The webhook's floor: a no-op validating webhook in Go (bench/noopwebhook), registered for the same SpecServings
in a namespace of its own, so that the webhook series can tell what calling any webhook costs this API server from
what ours adds on top.

It is built from its source with the machine's Go (standard library only, nothing downloaded) into
$SPECSERVING_CACHE/bench/, keyed by the source's hash, and served with a certificate made as the operator's is.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

from harness import process
from harness.process import free_port
from specserving.webhook.configuration import validating_configuration
from specserving.webhook.tls import generate

from bench.kubeapi import Api
from bench.measure import FLOOR_WEBHOOK_NAME, wait_until

SOURCE = Path(__file__).resolve().parent / "noopwebhook"


def _cache() -> Path:
    return Path(os.environ.get("SPECSERVING_CACHE") or Path.home() / ".cache" / "specserving")


def build() -> Path:
    """The no-op webhook's binary, built once per source version."""
    digest = hashlib.sha256()
    for name in ("go.mod", "main.go"):
        digest.update((SOURCE / name).read_bytes())
    binary = _cache() / "bench" / f"noopwebhook-{digest.hexdigest()[:16]}"
    if binary.is_file():
        return binary
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).is_file():
        raise RuntimeError("the bench builds its no-op webhook with Go, as hack/cluster.sh builds the control plane: "
                           "put go on PATH")
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name(f"{binary.name}.{os.getpid()}.partial")
    env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": "-trimpath",
           "GOCACHE": str(_cache() / "go" / "build")}
    done = subprocess.run([go, "build", "-o", str(partial), "."], cwd=SOURCE, env=env, text=True,
                          capture_output=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"cannot build the no-op webhook ({go} build in {SOURCE}): {done.stderr.strip()}")
    partial.replace(binary)  # atomic: a concurrent bench finds a whole binary or none
    return binary


class FloorWebhook:
    """The no-op webhook serving on 127.0.0.1, and its ValidatingWebhookConfiguration for `namespace`."""

    def __init__(self, kubeconfig: str, namespace: str, work_dir: Path) -> None:
        binary = build()
        self.port = free_port()
        material = generate(work_dir / "noopwebhook-tls", ["127.0.0.1", "localhost"])
        self.log = work_dir / "noopwebhook.log"
        self._out: IO[Any] = self.log.open("w")
        self.proc = subprocess.Popen([str(binary), "-listen", f"127.0.0.1:{self.port}", "-cert",
                                      str(material.certfile), "-key", str(material.keyfile)],
                                     stdout=self._out, stderr=subprocess.STDOUT)
        self.api = Api(kubeconfig)
        self.configuration = validating_configuration(material.ca_pem, url=f"https://127.0.0.1:{self.port}",
                                                      name="specserving-bench-floor", namespaces=[namespace])
        self.configuration["webhooks"][0]["name"] = FLOOR_WEBHOOK_NAME
        try:
            self._wait_listening(ssl.create_default_context(cadata=material.ca_pem.decode()))
            self.api.apply_webhook_configuration(self.configuration)
        except Exception:
            self.stop()
            raise

    def _wait_listening(self, context: ssl.SSLContext) -> None:
        def answering() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the no-op webhook exited with {self.proc.returncode}: {self.log.read_text()}")
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{self.port}/", timeout=2, context=context):
                    return True
            except urllib.error.HTTPError:
                return True  # it answered (400: an empty body is no review)
            except OSError:
                return False

        wait_until(f"the no-op webhook to listen (its log: {self.log})", answering, 30, interval=0.1)

    def stop(self) -> None:
        """Remove the configuration first: it fails closed, and would refuse the namespace's SpecServings."""
        name = self.configuration["metadata"]["name"]
        self.api.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{name}")
        process.stop(self.proc, self._out, grace=5.0)
