"""Subprocesses the harness starts: a free port for them, and a stop that never hangs."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
from pathlib import Path
from typing import IO, Any


# Below the kernel's ephemeral range (32768-60999 by default) and the NodePort range (30000-32767), and above what
# the control plane and local registries bind here.
PORTS = range(20000, 30000)
_given: set[int] = set()


def _ephemeral() -> range:
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return range(32768, 61000)
    return range(low, high + 1)


def free_port() -> int:
    """A TCP port nothing listens on, outside the kernel's ephemeral range and never given twice by this process.

    Binding port 0 gives a port from the ephemeral range, which any outgoing connection can take as its source port
    before the child it was meant for binds it: a CI run lost an operator to EADDRINUSE on its health port that way.
    """
    ephemeral = _ephemeral()
    candidates = [p for p in PORTS if p not in _given and p not in ephemeral]
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("", port))  # every address: a listener on 127.0.0.1 or 0.0.0.0 refuses it
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free TCP port in {PORTS.start}-{PORTS.stop - 1} outside the ephemeral range "
                       f"{ephemeral.start}-{ephemeral.stop - 1}")


def stop(proc: subprocess.Popen[Any], out: IO[Any] | None = None, grace: float = 15) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; close the file its output went to."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if out is not None:
        out.close()
