"""Subprocesses the harness starts: a free port for them, and a stop that never hangs."""

from __future__ import annotations

import signal
import socket
import subprocess
from typing import IO, Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
