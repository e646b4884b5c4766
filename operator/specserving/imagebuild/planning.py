"""Deciding the serving image: the base image as-is, or a build of the fixed decode path on top of it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from specserving.api.types import SpecServingSpec
from specserving.capabilities import NEEDS_FIX, UNKNOWN_VERSION, UPSTREAM, CapabilityTable
from specserving.rendering.image import sglang_version

NOT_NEEDED, BUILD, CANNOT_SERVE = "NotNeeded", "Build", "CannotServe"
IMAGE_NAME = "sglang-pd"


@dataclass(frozen=True)
class ImagePlan:
    """What the pools will run, before any build has happened."""

    decision: str
    base: str
    sglang_version: str | None
    algorithm: str
    reason: str
    registry: str | None = None
    build_key: str | None = None

    @property
    def target(self) -> str | None:
        """The tag the build pushes: content-addressed by base, fix and registry."""
        if self.decision != BUILD or not self.registry or not self.build_key:
            return None
        return f"{self.registry}/{IMAGE_NAME}:pd-{self.build_key}"

    @property
    def build_name(self) -> str | None:
        """The build Job's (and its context ConfigMap's) name."""
        return f"sps-build-{self.build_key}" if self.decision == BUILD and self.build_key else None


def build_key(base: str, fix_version: str, registry: str) -> str:
    return hashlib.sha256(f"{base}\n{fix_version}\n{registry}".encode()).hexdigest()[:16]


def plan(spec: SpecServingSpec, table: CapabilityTable, *, fix_version: str,
         default_registry: str | None) -> ImagePlan:
    """Whether `spec` can run its base image, needs the fixed image built, or cannot be served at all."""
    alg, base = spec.speculative.algorithm, spec.image.base
    version = sglang_version(spec)
    may_build = spec.image.build.policy == "IfNeeded"
    verdict = table.verdict(version, alg, with_fix=may_build)
    registry = spec.image.build.registry or default_registry

    def build(reason: str) -> ImagePlan:
        key = build_key(base, fix_version, registry) if registry else None
        return ImagePlan(BUILD, base, version, alg, reason, registry, key)

    if verdict.kind == UPSTREAM:
        return ImagePlan(NOT_NEEDED, base, version, alg, f"SGLang {version} has its own PD-decode builder for {alg}")
    if verdict.kind == NEEDS_FIX and may_build:
        return build(f"SGLang {version} lacks the PD-decode builder for {alg}; the fixed image adds it")
    if verdict.kind == UNKNOWN_VERSION and may_build:
        return build(f"SGLang version {version or 'unknown'} is not in the capability table; the build probe "
                     f"decides whether {alg} has a PD-decode builder")
    if verdict.kind == UNKNOWN_VERSION:
        return ImagePlan(NOT_NEEDED, base, version, alg, "build.policy is Never; the base image is used as-is")
    return ImagePlan(CANNOT_SERVE, base, version, alg,
                     f"SGLang {version} has no PD-decode builder for {alg}, with or without the fix"
                     if may_build else f"SGLang {version} has no PD-decode builder for {alg} and build.policy is "
                     "Never")
