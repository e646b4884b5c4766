"""The image the pools run, as resolved before rendering: the base image, or the fixed image by digest."""

from __future__ import annotations

from dataclasses import dataclass

from specserving.api.types import SpecServingSpec
from specserving.capabilities import version_from_image


@dataclass(frozen=True)
class ResolvedImage:
    """What the renderer needs to know about the serving image."""

    ref: str
    sglang_version: str | None
    fix_applied: bool = False


def sglang_version(spec: SpecServingSpec) -> str | None:
    """The SGLang version of the base image: spec.image.sglangVersion, else the tag's."""
    return spec.image.sglang_version or version_from_image(spec.image.base)


def base_image(spec: SpecServingSpec) -> ResolvedImage:
    """The base image used as-is (no fixed-image build)."""
    return ResolvedImage(ref=spec.image.base, sglang_version=sglang_version(spec))
