"""Deciding the serving image: the base image as-is, or a build of the fixed decode path on top of it."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace

from specserving.api.types import SpecServingSpec
from specserving.capabilities import NEEDS_FIX, UNKNOWN_VERSION, UPSTREAM, CapabilityTable
from specserving.rendering.image import sglang_version

NOT_NEEDED, BUILD, CANNOT_SERVE = "NotNeeded", "Build", "CannotServe"
IMAGE_NAME = "sglang-pd"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


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
    # The fix's version (the build context's hash), part of the build key.
    fix_version: str = ""
    # The registry's digest of `base` (sha256:...): pinned in the spec, or resolved by the operator. With it, the
    # build key names the base's content, not its tag.
    base_digest: str | None = None

    @property
    def base_ref(self) -> str:
        """What the build pulls: the base by digest when the digest is known, else the reference as written."""
        return f"{repository(self.base)}@{self.base_digest}" if self.base_digest else self.base

    def pinned(self, digest: str) -> ImagePlan:
        """This plan with the base's content known: the build key hashes `repository@digest`, so a tag that moved
        builds again and one digest under two tags builds once."""
        if self.decision != BUILD:
            return self
        key = (build_key(f"{repository(self.base)}@{digest}", self.fix_version, self.registry, self.algorithm)
               if self.registry else None)
        return replace(self, base_digest=digest, build_key=key)

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


def build_key(base: str, fix_version: str, registry: str, algorithm: str) -> str:
    """The build's content address. The algorithm is part of it because the build's probe proves the builder of
    that one algorithm: for a version the capability table lacks, a build probed for DSPARK says nothing of DFLASH."""
    return hashlib.sha256(f"{base}\n{fix_version}\n{registry}\n{algorithm}".encode()).hexdigest()[:16]


def repository(ref: str) -> str:
    """An image reference without its tag and digest (registry.example.com:5000/ml/sglang:v1@sha256:... ->
    registry.example.com:5000/ml/sglang)."""
    name = ref.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    if ":" in last:
        last = last.split(":", 1)[0]
    return f"{head}/{last}" if head else last


def pinned_digest(ref: str) -> str | None:
    """The digest an image reference pins (…@sha256:<64 hex>), or None."""
    _, at, digest = ref.partition("@")
    return digest if at and DIGEST.fullmatch(digest) else None


def plan(spec: SpecServingSpec, table: CapabilityTable, *, fix_version: str,
         default_registry: str | None) -> ImagePlan:
    """Whether `spec` can run its base image, needs the fixed image built, or cannot be served at all."""
    alg, base = spec.speculative.algorithm, spec.image.base
    version = sglang_version(spec)
    may_build = spec.image.build.policy == "IfNeeded"
    verdict = table.verdict(version, alg, with_fix=may_build)
    registry = spec.image.build.registry or default_registry

    def build(reason: str) -> ImagePlan:
        key = build_key(base, fix_version, registry, alg) if registry else None
        out = ImagePlan(BUILD, base, version, alg, reason, registry, key, fix_version=fix_version)
        digest = pinned_digest(base)
        return out.pinned(digest) if digest else out

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
