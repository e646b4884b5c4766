"""What the watches saw: kopf's in-memory indexes of SpecServings, their children and pods, and build Jobs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specserving.rendering.kinds import CHILD_KINDS, ChildKind
from specserving.reconcile.observed import Child, ChildRef, Pod
from specserving.reconcile.state import Key

# kopf index ids: handlers register them, the controller reads them.
OWNER_INDEX = "specservings_by_name"
POD_INDEX = "pods_by_instance"
BUILD_JOB_INDEX = "build_jobs_by_key"  # (namespace, build key) -> BuildJob
BUILD_POD_INDEX = "build_pods_by_key"  # (namespace, build key) -> BuildPod


def child_index(kind: ChildKind) -> str:
    return f"{kind.plural}_by_instance"


class Watched:
    """Read access to the indexes; the kopf startup handler sets `indices`."""

    def __init__(self) -> None:
        self.indices: Mapping[str, Any] = {}

    def _store(self, index_id: str, key: Key) -> list[Any]:
        index = self.indices.get(index_id)
        return list(index[key]) if index is not None and key in index else []

    def owner(self, key: Key) -> dict[str, Any] | None:
        found = self._store(OWNER_INDEX, key)
        return found[0] if found else None

    def children(self, key: Key) -> dict[ChildRef, Child]:
        found: dict[ChildRef, Child] = {}
        for kind in CHILD_KINDS:
            for child in self._store(child_index(kind), key):
                found[child.ref] = child
        return found

    def pods(self, key: Key) -> list[Pod]:
        return self._store(POD_INDEX, key)

    def known(self) -> list[Key]:
        index = self.indices.get(OWNER_INDEX)
        return list(index) if index is not None else []

    def build_job(self, namespace: str, build_key: str) -> Any:
        found = self._store(BUILD_JOB_INDEX, (namespace, build_key))
        return found[0] if found else None

    def build_pods(self, namespace: str, build_key: str) -> list[Any]:
        return self._store(BUILD_POD_INDEX, (namespace, build_key))
