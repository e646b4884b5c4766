"""What one generation of a SpecServing should become: validate, plan the image, render. Pure and cached by the
caller per (uid, generation); rendering for an image that a build produced is cached on the plan too, packed
(reconcile/packed.py)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specserving.api.types import SpecServingSpec
from specserving.capabilities import UNKNOWN_VERSION, CapabilityTable
from specserving.capabilities import load as load_capabilities
from specserving.imagebuild.planning import NOT_NEEDED, ImagePlan
from specserving.imagebuild.planning import plan as plan_image
from specserving.policy import ServingPolicy
from specserving.reconcile.image import BuildConfig, pd_builders
from specserving.reconcile.packed import Rendering
from specserving.rendering import labels as L
from specserving.rendering import render
from specserving.rendering.contract import revision as contract_revision
from specserving.rendering.image import ResolvedImage, base_image
from specserving.validation import validate

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Plan:
    """The verdict on one generation and, when admitted, its image plan and children."""

    uid: str
    generation: int
    errors: tuple[str, ...] = ()
    # A digest of the spec as stored: with the owner, the image, the replicas and the router, what the rendering is
    # a function of (accepted.py).
    spec_digest: str = ""
    warnings: tuple[str, ...] = ()
    spec: SpecServingSpec | None = None
    # The base image, as the spec names it.
    image: ResolvedImage | None = None
    # Whether the base image serves, a build is needed, or nothing can (imagebuild.planning).
    image_plan: ImagePlan | None = None
    # The children on the base image, when the base image can run the spec; None otherwise.
    base: Rendering | None = field(default=None, repr=False)
    # Why the base image cannot run the spec as-is (a build may fix that), or None.
    unrunnable: str | None = None
    # What the rendering reads of the SpecServing's metadata (name, namespace, uid). Not the object itself: kept per
    # SpecServing, that held its managedFields and kopf's copy of the spec as decoded JSON (issue 21's heap profile).
    owner: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    # The capability table the plan was made with (the operator's, or a test's).
    table: CapabilityTable = field(default_factory=load_capabilities, repr=False, compare=False)
    _rendered: dict[tuple[Any, ...], Rendering] = field(default_factory=dict, repr=False, compare=False)
    _revisions: dict[ResolvedImage, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def children(self) -> tuple[dict[str, Any], ...]:
        """The children on the base image, decoded; () when the base image cannot run the spec."""
        return self.base.children() if self.base is not None else ()

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
        """status.image for the base image: base, resolved, sglangVersion, fixApplied and pdBuilders."""
        if self.spec is None or self.image is None:
            return None
        out: dict[str, Any] = {"base": self.spec.image.base, "resolved": self.image.ref,
                               "fixApplied": self.image.fix_applied}
        if self.image.sglang_version:
            out["sglangVersion"] = self.image.sglang_version
            verdict = self.table.verdict(self.image.sglang_version, self.spec.speculative.algorithm,
                                         with_fix=self.image.fix_applied)
            if verdict.kind != UNKNOWN_VERSION:
                out["pdBuilders"] = pd_builders(verdict)
        return out

    def revision_for(self, image: ResolvedImage) -> str:
        """The PD-contract revision of the spec on `image`: hashed once per image, as every pass of the generation
        asks (the hash was a third of a pass's own CPU in the N=200 profile of issue 21)."""
        assert self.spec is not None
        found = self._revisions.get(image)
        if found is None:
            found = self._revisions[image] = contract_revision(self.spec, image, self.table)
        return found

    def children_for(self, image: ResolvedImage, replicas: Mapping[str, int] | None = None,
                     router_deployment: bool = True) -> Rendering:
        """The children with the pools on `image`, at `replicas` per role (default: the spec's) and with or
        without the router Deployment (rendered once per combination)."""
        wanted = self.desired() or {}
        counts = tuple(sorted((replicas or {}).items()))
        if all(wanted.get(role) == n for role, n in counts):
            counts = ()  # the spec's own replicas: the same rendering as without an override
        if self.image is not None and image == self.image and self.base is not None and not counts and \
                router_deployment:
            return self.base
        key = (image.ref, counts, router_deployment)
        if key not in self._rendered:
            assert self.spec is not None  # only admitted plans are rendered
            self._rendered[key] = Rendering(render(self.spec, self.owner, image, replicas=dict(counts),
                                                   router_deployment=router_deployment, table=self.table))
        return self._rendered[key]


def make_plan(obj: dict[str, Any], build: BuildConfig | None = None, policy: ServingPolicy | None = None) -> Plan:
    """Validate `obj` as the API server stored it (CEL already ran there) and, if it passes, plan its image and
    render it on the base image when that can run it. `build` carries the fix's version and the default registry
    (none: an unversioned fix and no registry); `policy` the cluster admin's serving-pod policy.

    An unexpected exception (a bug in validation or rendering) becomes a refused plan with the error in its
    message, logged with its traceback: the plan is kept per generation, so a pass does not raise it again."""
    build = build or BuildConfig()
    try:
        return _make_plan(obj, build, policy)
    except Exception as exc:  # noqa: BLE001 - any bug must end as a condition, not as a pass that raises forever
        meta = obj.get("metadata") or {}
        log.exception("planning %s/%s generation %s failed", meta.get("namespace"), meta.get("name"),
                      meta.get("generation"))
        generation = meta.get("generation")
        return Plan(str(meta.get("uid", "")), generation if isinstance(generation, int) else 0, errors=(
            f"the operator could not validate or render this SpecServing ({type(exc).__name__}: {exc}); this is "
            "an operator bug (its log has the traceback): please report it; nothing is applied until the spec "
            "changes",), table=build.table)


def _make_plan(obj: dict[str, Any], build: BuildConfig, policy: ServingPolicy | None) -> Plan:
    meta = obj.get("metadata") or {}
    uid, generation = meta.get("uid", ""), int(meta.get("generation") or 0)
    clean = {k: v for k, v in obj.items() if k != "status"}
    report = validate(clean, build.table, run_cel=False, policy=policy)
    owner = {k: str(meta[k]) for k in ("name", "namespace", "uid") if meta.get(k)}
    warnings = tuple(str(w) for w in report.warnings)
    if report.errors:
        spec = None if report.malformed else report.spec
        return Plan(uid, generation, errors=tuple(str(e) for e in report.errors), warnings=warnings, spec=spec,
                    table=build.table)
    spec = report.spec
    assert spec is not None  # validate parses every object it does not call malformed
    digest = hashlib.sha256(json.dumps(obj.get("spec"), sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    image = base_image(spec)
    image_plan = plan_image(spec, build.table, fix_version=build.fix_version, default_registry=build.registry)
    problem = missing_builder(spec, image, build.table)
    if problem or image_plan.decision != NOT_NEEDED:
        return Plan(uid, generation, spec_digest=digest, warnings=warnings, spec=spec, image=image,
                    image_plan=image_plan, unrunnable=problem, owner=owner, table=build.table)
    return Plan(uid, generation, spec_digest=digest, warnings=warnings, spec=spec, image=image, image_plan=image_plan,
                base=Rendering(render(spec, owner, image, table=build.table)), owner=owner, table=build.table)


def missing_builder(spec: SpecServingSpec, image: ResolvedImage, table: CapabilityTable) -> str | None:
    """Why `image` would crash the first decode, or None. Admission allows an algorithm that only the project's
    fix supplies (build policy IfNeeded); until the fixed image is built, no decode pod may start. The controller
    checks every image it is about to deploy, the built one included."""
    verdict = table.verdict(image.sglang_version, spec.speculative.algorithm, with_fix=image.fix_applied)
    if verdict.kind == UNKNOWN_VERSION or verdict.runs:
        return None
    alg = verdict.algorithm
    if image.fix_applied:
        return (f"image {image.ref} (SGLang {image.sglang_version} with the fix) has no PD-decode draft-input "
                f"builder for {alg}, so no decode pod is started")
    return (f"image {image.ref} (SGLang {image.sglang_version}) has no PD-decode draft-input builder for {alg} and "
            f"the fixed image is not built yet, so no decode pod is started; algorithms this image can run: "
            f"{', '.join(sorted(verdict.builders)) or 'none'}")
