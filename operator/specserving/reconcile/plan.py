"""What one generation of a SpecServing should become: validate, resolve the image, render. Pure and cached by
the caller per (uid, generation)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specserving.api.loading import spec_of
from specserving.api.types import SpecServingSpec
from specserving.capabilities import load as load_capabilities
from specserving.rendering import labels as L
from specserving.rendering import render
from specserving.rendering.image import ResolvedImage, base_image
from specserving.validation import validate


@dataclass(frozen=True)
class Plan:
    """The verdict on one generation and, when admitted, its children."""

    uid: str
    generation: int
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    spec: SpecServingSpec | None = None
    image: ResolvedImage | None = None
    children: tuple[dict[str, Any], ...] = field(default=(), repr=False)
    # Admitted, but the resolved image cannot run it: why, and nothing is applied.
    unrunnable: str | None = None

    @property
    def admitted(self) -> bool:
        return not self.errors

    def desired(self) -> dict[str, int] | None:
        """Replicas per pool, from the spec."""
        if self.spec is None:
            return None
        return {L.PREFILL: self.spec.prefill.replicas, L.DECODE: self.spec.decode.replicas,
                L.ROUTER: self.spec.router.replicas}

    def image_status(self) -> dict[str, Any] | None:
        """status.image: base, resolved, sglangVersion, fixApplied and the algorithms with a PD builder."""
        if self.spec is None or self.image is None:
            return None
        out: dict[str, Any] = {"base": self.spec.image.base, "resolved": self.image.ref,
                               "fixApplied": self.image.fix_applied}
        if self.image.sglang_version:
            out["sglangVersion"] = self.image.sglang_version
            caps = load_capabilities().lookup(self.image.sglang_version)
            if caps is not None:
                out["pdBuilders"] = sorted(caps.builders(with_fix=self.image.fix_applied))
        return out


def resolve_image(spec: SpecServingSpec) -> ResolvedImage:
    """The image the pools run. For now the base image as-is; the image-build issue replaces this function with
    one that builds (or finds) the fixed image and returns it by digest."""
    return base_image(spec)


def make_plan(obj: dict[str, Any]) -> Plan:
    """Validate `obj` as the API server stored it (CEL already ran there) and, if it passes, render it."""
    meta = obj.get("metadata") or {}
    uid, generation = meta.get("uid", ""), int(meta.get("generation") or 0)
    clean = {k: v for k, v in obj.items() if k != "status"}
    report = validate(clean, run_cel=False)
    warnings = tuple(str(w) for w in report.warnings)
    if report.errors:
        spec = None if report.malformed else spec_of(clean)
        return Plan(uid, generation, errors=tuple(str(e) for e in report.errors), warnings=warnings, spec=spec)
    spec = spec_of(clean)
    image = resolve_image(spec)
    problem = missing_builder(spec, image)
    if problem:
        return Plan(uid, generation, warnings=warnings, spec=spec, image=image, unrunnable=problem)
    return Plan(uid, generation, warnings=warnings, spec=spec, image=image, children=tuple(render(clean, image)))


def missing_builder(spec: SpecServingSpec, image: ResolvedImage) -> str | None:
    """Why the resolved image would crash the first decode, or None. Admission allows an algorithm that only the
    project's fix supplies (build policy IfNeeded); until the fixed image is built, no decode pod may start."""
    caps = load_capabilities().lookup(image.sglang_version)
    alg = spec.speculative.algorithm
    if caps is None or alg in caps.builders(with_fix=image.fix_applied):
        return None
    return (f"image {image.ref} (SGLang {image.sglang_version}) has no PD-decode draft-input builder for {alg} and "
            f"the fixed image is not built yet, so no decode pod is started; algorithms this image can run: "
            f"{', '.join(sorted(caps.builders(with_fix=image.fix_applied))) or 'none'}")
