"""Fixtures for the reliability and security suite: the cluster tier's own, shared rather than copied.

pytest imports test packages in its default `prepend` mode: tests/ (the first directory without an __init__.py
above tests/cluster and tests/reliability) goes on sys.path, so the cluster tier is the package `cluster` and this
one `reliability`. Importing the fixture functions here registers them for tests/reliability. In one session with
tests/cluster (`pytest tests/cluster tests/reliability`), the `cluster` fixture is then set up once per directory,
but both set-ups name the same kwokctl cluster (specserving-test-<pid>): the second finds it up, and only the
set-up that started it stops it at the end of the session. So one control plane serves the whole session.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster.conftest import cluster, namespace
from cluster.kube import Cluster
from cluster.operating import Operator, crd

from .faults import chart_identity, chart_operator

__all__ = ["cluster", "crd", "namespace"]  # fixtures, used by name


@pytest.fixture
def chart_kubeconfig(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig holding only a token of the chart's ServiceAccount, with the chart's RBAC for an install that
    watches the test's namespace: the identity the operator has in production."""
    with chart_identity(cluster, namespace, tmp_path / "operator.kubeconfig") as kubeconfig:
        yield kubeconfig


@pytest.fixture
def operator(cluster: Cluster, namespace: str, crd: None, chart_kubeconfig: Path, tmp_path: Path,
             ) -> Iterator[Operator]:
    """The operator as the chart's ServiceAccount; the test fails if any of its requests was forbidden."""
    with chart_operator(cluster, namespace, tmp_path / "operator.log", chart_kubeconfig) as op:
        yield op
