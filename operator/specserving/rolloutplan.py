"""`specserving plan`: what applying a SpecServing would roll out, printed from the planner the operator runs.

It compares the new file with the old one (`--from`) or with the object and workloads in the cluster (`--live`):
whether the PD contract changes, which of its fields do, and the steps (rollout.plan).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specserving.api.types import SpecServingSpec
from specserving.rendering import contract
from specserving.rendering.image import ResolvedImage, base_image
from specserving.rollout import ROLES, PlannedStep, Strategy, plan, shown


@dataclass(frozen=True)
class Current:
    """What runs now: the spec, the image its pools run, and the serving revision's replicas (None: as the spec
    says, for a file that was never applied)."""

    spec: SpecServingSpec
    image: ResolvedImage
    serving: str | None = None
    replicas: Mapping[str, int] | None = None


def live_image(spec: SpecServingSpec, status: Mapping[str, Any]) -> ResolvedImage:
    """The image the pools of a live SpecServing run, from its status (the base when nothing is recorded)."""
    image = status.get("image") or {}
    if image.get("resolved"):
        return ResolvedImage(image["resolved"], image.get("sglangVersion"), bool(image.get("fixApplied")))
    return base_image(spec)


def new_image(new: SpecServingSpec, current: Current | None) -> tuple[ResolvedImage, bool]:
    """The image the new spec would run, and whether that is certain: an unchanged spec.image keeps the image
    the pools run; a changed one is named by its base (a build, when needed, gives another reference)."""
    if current is not None and new.image == current.spec.image:
        return current.image, True
    return base_image(new), False


@dataclass(frozen=True)
class Preview:
    source: str | None
    target: str
    causes: list[str]
    certain: bool
    image: ResolvedImage
    strategy: Strategy
    steps: list[PlannedStep]


def preview(new: SpecServingSpec, current: Current | None) -> Preview:
    """The rollout from `current` (None: nothing applied yet) to the spec `new`."""
    image, certain = new_image(new, current)
    after = contract.fields(new, image)
    target = contract.revision_of(after)
    wanted = {role: new.pool(role).replicas for role in ROLES}
    strategy = Strategy.of(new.rollout)
    if current is None:
        return Preview(None, target, [], certain, image, strategy, [])
    before = contract.fields(current.spec, current.image)
    source = current.serving if current.serving is not None else contract.revision_of(before)
    replicas = dict(current.replicas) if current.replicas is not None else \
        {role: current.spec.pool(role).replicas for role in ROLES}
    steps = plan(source, replicas, target, wanted, strategy)
    return Preview(source, target, contract.changed(before, after), certain, image, strategy, steps)


def lines(new: SpecServingSpec, current: Current | None) -> list[str]:
    p = preview(new, current)
    if current is None:
        return [f"creates revision {p.target}: prefill {new.prefill.replicas}, decode {new.decode.replicas} "
                "replicas; no rollout"]
    if not p.steps:
        return [f"the PD contract is unchanged: revision {shown(p.target)} is updated in place (replicas, one "
                "pool's own settings or the router); no rollout"]
    out = [f"the PD contract changes: revision {shown(p.source)} -> {p.target}",
           "because of: " + (", ".join(p.causes) if p.causes else "the running pools are of another revision")]
    if not p.certain:
        out.append(f"note: spec.image changed; {p.target} hashes {p.image.ref} as named, and the operator hashes "
                   "the image it resolves (a built image gives another name, with the same steps)")
    out.append(f"steps ({p.strategy.name}):")
    out += [f"  {i}. {s.step}: {s.description}" for i, s in enumerate(p.steps, 1)]
    return out
