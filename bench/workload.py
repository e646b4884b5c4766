"""The SpecServings the bench creates, and the children `specserving render` makes of them (the baseline).

A small spec keeps node counts sane: the seed example (DSPARK, TP8/DP8, Mooncake over eight RDMA NICs) with one
prefill and one decode replica, so each SpecServing needs two whole 8-GPU nodes (plus a router pod, which needs
no GPU) and the bench needs 2N fake nodes, plus a spare for each scale sample.
"""

from __future__ import annotations

import copy
import functools
import subprocess
from pathlib import Path
from typing import Any

import yaml

from bench.cluster import REPO
from bench.operating import SPECSERVING

SEED = REPO / "examples" / "dspark-pd-tp8dp8.yaml"
PREFIX = "bench"
NODES_PER_SPS = 2  # prefill 1 + decode 1, one 8-GPU pod per node


def name(i: int) -> str:
    return f"{PREFIX}-{i:04d}"


@functools.lru_cache(maxsize=1)
def _seed() -> dict[str, Any]:
    return yaml.safe_load(SEED.read_text())  # type: ignore[no-any-return]


def specserving(i: int | str, namespace: str | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = copy.deepcopy(_seed())
    obj["metadata"] = {"name": name(i) if isinstance(i, int) else i}
    if namespace:
        obj["metadata"]["namespace"] = namespace
    obj["spec"]["prefill"]["replicas"] = 1
    obj["spec"]["decode"]["replicas"] = 1
    return obj


def render(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """What `specserving render -f obj -n NS` prints, in process: validate, then render (as cli.cmd_render)."""
    from specserving.rendering import render as render_children
    from specserving.validation import validate

    report = validate(obj)
    if report.errors:
        raise RuntimeError(f"the bench's SpecServing is refused: {[str(e) for e in report.errors]}")
    return render_children(report.spec, obj["metadata"])


def refs(children: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(c["kind"], c["metadata"]["name"]) for c in children]


def check_cli_render(namespace: str, tmp: Path, env: dict[str, str]) -> None:
    """The in-process rendering is byte for byte what `specserving render` prints (checked on one object)."""
    src = tmp / "render-check.yaml"
    obj = specserving(0)
    src.write_text(yaml.safe_dump(obj))
    out = subprocess.run([SPECSERVING, "render", "-f", str(src), "-n", namespace], env=env, text=True,
                         capture_output=True, check=True).stdout
    cli = [d for d in yaml.safe_load_all(out) if d]
    mine = render(specserving(0, namespace))
    if cli != mine:
        raise RuntimeError("the bench's in-process rendering differs from `specserving render` output")


def marker(namespace: str, label: str) -> dict[str, Any]:
    """A ConfigMap applied first: its line in kubectl's output marks the moment kubectl starts applying."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"bench-marker-{label}", "namespace": namespace}, "data": {"marker": label}}
