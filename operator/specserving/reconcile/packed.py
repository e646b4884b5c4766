"""A plan's rendered children, kept compressed between passes and decoded one child at a time.

The operator keeps a rendering for every SpecServing it watches, since every pass compares the children against
it. As dicts, the seed's 11 children take about 60 KiB (measured with tracemalloc on the bench's SpecServing):
60 MiB with a thousand SpecServings, against a 200 MiB budget for the whole process (docs/benchmarks.md). Packed
as compact JSON through zlib, each against its family's preset dictionary (compact.py), they take about 0.5 KiB
(7.0 KiB packed alone). A pass in sync decodes nothing: it matches each child by the digest of what was applied
and the resourceVersion the watch shows. Only a child that must be compared with what the watch saw (its
resourceVersion moved) or applied is decoded, which costs tens of microseconds per child.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from specserving.reconcile.compact import dictionary_for, pack_text, unpack
from specserving.reconcile.observed import ChildRef, family_of, ref_of


# One (apiVersion, kind) pair per kind the renderer makes, shared by every rendering.
_KINDS: dict[tuple[str, str], tuple[str, str]] = {}


class Rendering:
    """The children of one rendering, in apply order. Its identity stands for its content: a plan renders each
    (image, replicas, router) combination once, so `a is b` tells a pass whether the rendering changed."""

    __slots__ = ("refs", "kinds", "digests", "_packed", "_dictionaries")

    def __init__(self, children: Iterable[dict[str, Any]]) -> None:
        refs, kinds, digests, packed, dictionaries = [], [], [], [], []
        for child in children:
            text = json.dumps(child, sort_keys=True, separators=(",", ":"), default=str).encode()
            refs.append(ref_of(child))
            kind = (str(child["apiVersion"]), str(child["kind"]))
            kinds.append(_KINDS.setdefault(kind, kind))
            digests.append(hashlib.sha256(text).hexdigest()[:16])
            dictionary = dictionary_for(family_of(child, "rendering"), text)
            packed.append(pack_text(text, dictionary))
            dictionaries.append(dictionary)
        self.refs: tuple[ChildRef, ...] = tuple(refs)
        self.kinds: tuple[tuple[str, str], ...] = tuple(kinds)  # (apiVersion, kind) per child
        self.digests: tuple[str, ...] = tuple(digests)
        self._packed: tuple[bytes, ...] = tuple(packed)
        self._dictionaries: tuple[bytes, ...] = tuple(dictionaries)  # shared with every rendering of the family

    def __len__(self) -> int:
        return len(self._packed)

    def child(self, index: int) -> dict[str, Any]:
        """A fresh copy of one child: callers may change it."""
        return unpack(self._packed[index], self._dictionaries[index])

    def children(self) -> tuple[dict[str, Any], ...]:
        return tuple(self.child(i) for i in range(len(self)))

    def packed_bytes(self) -> int:
        """What the children take here, for the memory figures."""
        return sum(len(p) for p in self._packed)


def fingerprint(value: Any) -> bytes:
    """16 bytes that stand for a JSON value in an equality test, where keeping the value itself would cost its
    decoded size for every SpecServing (the status seen before our last write, for one)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.blake2b(text, digest_size=16).digest()
