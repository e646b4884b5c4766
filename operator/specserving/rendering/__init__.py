"""The renderer: a pure function from a SpecServing's typed spec and metadata to every manifest of its deployment.

No I/O, clocks or randomness: the same input always gives the same, sorted output. The operator, the admission
webhook and `specserving render` all call `render`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from specserving import API_VERSION, KIND
from specserving.api.types import SpecServingSpec
from specserving.capabilities import CapabilityTable
from specserving.rendering import labels as L
from specserving.rendering.contract import revision as contract_revision
from specserving.rendering.image import ResolvedImage, base_image
from specserving.rendering.kinds import CHILD_KINDS
from specserving.rendering.pools import render_pool
from specserving.rendering.router import render_router

_KIND_ORDER = [k.kind for k in CHILD_KINDS]  # what the others depend on first: ServiceAccount, ..., workloads


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """The controller reference to the SpecServing whose metadata is `owner`."""
    return {"apiVersion": API_VERSION, "kind": KIND, "name": owner["name"], "uid": owner["uid"],
            "controller": True, "blockOwnerDeletion": True}


def render(spec: SpecServingSpec, owner: Mapping[str, Any], image: ResolvedImage | None = None, *,
           replicas: Mapping[str, int] | None = None, router_deployment: bool = True,
           table: CapabilityTable | None = None) -> list[dict[str, Any]]:
    """Every child manifest of the SpecServing with the typed `spec` (see validation.validate, which parses it
    once) and the metadata `owner` (its name; its namespace and uid when it has them).

    Children carry the owner's namespace and, when the owner has a uid, an ownerReference to it.
    `image` defaults to the base image used as-is. The pools' workloads are those of the spec's PD-contract
    revision (rendering/contract.py), with `replicas` per role while a rollout sets them (default: the spec's);
    `router_deployment=False` leaves the router Deployment out while a rollout keeps it on an older revision.
    """
    name = owner["name"]
    namespace = owner.get("namespace")
    image = image or base_image(spec)
    revision = contract_revision(spec, image, table)
    replicas = replicas or {}
    # Unshared copies (a JSON round trip; deepcopy would keep the sharing): builders reuse label dicts, and
    # callers mutate and serialise what they get back.
    children: list[dict[str, Any]] = json.loads(json.dumps([
        *render_pool(name, spec, L.PREFILL, image, revision, replicas.get(L.PREFILL)),
        *render_pool(name, spec, L.DECODE, image, revision, replicas.get(L.DECODE)),
        *render_router(name, spec, image, revision, router_deployment),
    ]))
    for child in children:
        meta = child["metadata"]
        if namespace:
            meta["namespace"] = namespace
        if owner.get("uid"):
            meta["ownerReferences"] = [owner_reference(owner)]
    children.sort(key=lambda c: (_KIND_ORDER.index(c["kind"]), c["metadata"]["name"]))
    return children
