"""Workload shapes the API server's dry run accepted lately, so a burst of alike SpecServings is dry-run once.

A new SpecServing's workloads are dry-run before anything of it is applied (controller.py, `_dry_run`). Rendering
is a pure function of the spec, the image, the replicas, the router's presence and the owner (name, namespace,
uid); the owner's name and uid only fill names, labels and owner references, which the CRD's name cap keeps valid
(api/naming.py). So a new SpecServing whose spec, image, replicas and router match those of one whose workloads
the API server accepted, in the same namespace and within the last ten minutes, gets the same answer, and it is not
asked again. With a thousand alike SpecServings applied at once, the dry runs were 3 of the 15 requests each
created one's pass made before its first child (docs/benchmarks.md).

Only creations use it: the dry run of a change also checks what the existing objects allow (an immutable selector),
which differs per object. What it gives up: an admission policy that judges workloads by their names would now
refuse the workload at the apply, after the ServiceAccount and Services were created (ApplyFailed, as before the
dry run existed), instead of at the dry run. Ten minutes bounds how long a policy change goes unseen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from specserving.rendering.image import ResolvedImage

TTL_SECONDS = 600.0
MAX_SHAPES = 1024  # a bound on memory: a new shape past it forgets the oldest


@dataclass(frozen=True, slots=True)
class Shape:
    """What a new SpecServing's rendering depends on, but for its name and uid."""

    namespace: str
    spec_digest: str  # plan.Plan.spec_digest
    image: ResolvedImage
    replicas: tuple[tuple[str, int], ...]  # the replicas rendered per role (the rollout's, for this revision)
    router: bool  # the router Deployment is rendered


class Accepted:
    """Shapes whose workloads the API server's dry run accepted, each for TTL_SECONDS."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._until: dict[Shape, float] = {}  # insertion order: oldest first

    def holds(self, shape: Shape) -> bool:
        until = self._until.get(shape)
        if until is None:
            return False
        if until <= self.clock():
            del self._until[shape]
            return False
        return True

    def add(self, shape: Shape) -> None:
        self._until.pop(shape, None)
        self._until[shape] = self.clock() + TTL_SECONDS
        while len(self._until) > MAX_SHAPES:
            del self._until[next(iter(self._until))]
