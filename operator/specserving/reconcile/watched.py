"""What the watches saw: kopf's in-memory indexes of SpecServings and build Jobs, and our informers' stores of
children and pool pods (reconcile/informer.py)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from specserving.rendering.kinds import CHILD_KINDS, ChildKind
from specserving.reconcile.compact import NO_DICTIONARY, pack, unpack
from specserving.reconcile.informer import Informers
from specserving.reconcile.observed import Child, ChildRef, Pod
from specserving.reconcile.state import Key

# Index ids: handlers register them (kopf's, and our informers' stores under the same kind of name), the controller
# reads them.
OWNER_INDEX = "specservings_by_name"
POD_INDEX = "pods_by_instance"
BUILD_JOB_INDEX = "build_jobs_by_key"  # (namespace, build key) -> BuildJob
BUILD_POD_INDEX = "build_pods_by_key"  # (namespace, build key) -> BuildPod


# kopf keeps its own state in annotations under this prefix (handlers.py configures it), and reads them from its
# events, never from the index.
KOPF_PREFIX = "operator.specserving.io"


def child_index(kind: ChildKind) -> str:
    return f"{kind.plural}_by_instance"


@dataclass(frozen=True, slots=True)
class StoredOwner:
    """A SpecServing as the watch last saw it, kept packed (compact.py) and decoded when a pass reads it.

    Decoded, a bench SpecServing with its status took 19.1 KiB in the index; packed, 1.6 KiB, and a pass unpacks
    it in tens of microseconds. status.image stays decoded: every build decision reads it for all the SpecServings
    of its namespace."""

    raw: bytes
    image: Mapping[str, Any] | None
    # The preset dictionary raw was packed against (compact.py), shared by every SpecServing.
    dictionary: bytes = NO_DICTIONARY

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> StoredOwner:
        """Keep `body` less what no pass reads: managedFields, and kopf's annotations (a copy of the spec)."""
        kept = dict(body)
        meta = {k: v for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                       if not k.startswith(f"{KOPF_PREFIX}/")}
        if annotations:
            meta["annotations"] = annotations
        else:
            meta.pop("annotations", None)
        kept["metadata"] = meta
        image = (body.get("status") or {}).get("image")
        raw, dictionary = pack(kept, ("owner", str(body.get("apiVersion", ""))))
        return cls(raw, image or None, dictionary)

    def body(self) -> dict[str, Any]:
        return unpack(self.raw, self.dictionary)


class Watched:
    """Read access to the indexes; the kopf startup handler sets `indices` (kopf's indexes of SpecServings and
    builds, and the stores of our informers of children and pods, reconcile/informer.py) and `informers`."""

    def __init__(self) -> None:
        self.indices: Mapping[str, Any] = {}
        self.informers: Informers | None = None

    async def watches_listed(self) -> None:
        """Return once every informer has listed its kind: a pass before that would see no child at all."""
        if self.informers is not None:
            await self.informers.wait_synced()

    def kind_served(self, plural: str) -> None:
        if self.informers is not None:
            self.informers.served(plural)

    def _store(self, index_id: str, key: Key) -> list[Any]:
        index = self.indices.get(index_id)
        return list(index[key]) if index is not None and key in index else []

    def owner(self, key: Key) -> dict[str, Any] | None:
        found = self._store(OWNER_INDEX, key)
        return found[0].body() if found else None

    def has_owner(self, key: Key) -> bool:
        """Whether the watch holds this SpecServing, without decoding it."""
        index = self.indices.get(OWNER_INDEX)
        return index is not None and bool(index.get(key))

    def images_in(self, namespace: str, but: Key) -> Iterator[Mapping[str, Any] | None]:
        """status.image of every other SpecServing of `namespace`."""
        index = self.indices.get(OWNER_INDEX)
        if index is None:
            return
        for key in list(index):
            if key[0] == namespace and key != but:
                yield from (stored.image for stored in index.get(key, ()))

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
