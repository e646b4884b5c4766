"""hack/cluster.sh: run it, read where a cluster lives, and stop the clusters of runs that were killed."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SH = REPO / "hack" / "cluster.sh"


def cluster_sh(command: str, env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `bash hack/cluster.sh COMMAND` and return it, stdout and stderr captured as text."""
    return subprocess.run(["bash", str(CLUSTER_SH), command], env=dict(env), text=True, capture_output=True,
                          timeout=timeout, check=False)


def parse_env(output: str) -> tuple[Path, Path]:
    """The kubeconfig path and binary dir from `hack/cluster.sh env` (export KUBECONFIG=... / export PATH=...:$PATH)."""
    kubeconfig = re.search(r"^export KUBECONFIG=(\S+)$", output, re.M)
    path = re.search(r"^export PATH=([^:\s]+):\$PATH$", output, re.M)
    if not kubeconfig or not path:
        raise ValueError(f"unexpected output from hack/cluster.sh env: {output!r}")
    return Path(kubeconfig.group(1)), Path(path.group(1))


def kube_env(kubeconfig: Path, bin_dir: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """An environment for subprocesses: KUBECONFIG set, and the cluster's kubectl and helm first on PATH."""
    env = dict(os.environ if base is None else base)
    env["KUBECONFIG"] = str(kubeconfig)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def stop_orphans(prefix: str, env: Mapping[str, str], timeout: float = 300) -> list[str]:
    """Stop the clusters named PREFIX<pid> or PREFIX<pid>-<tag> whose process <pid> is gone (a killed run);
    return their names. The session, private and bench-smoke clusters are all named this way."""
    kubeconfig, _ = parse_env(cluster_sh("env", env, 30).stdout)
    stopped = []
    for workdir in sorted(kubeconfig.parent.parent.glob(f"{prefix}*")):
        pid = workdir.name.removeprefix(prefix).split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            cluster_sh("down", {**env, "SPECSERVING_CLUSTER_NAME": workdir.name}, timeout)
            stopped.append(workdir.name)
    return stopped
