"""Does an observed child still match its rendering, and which observed children are no longer rendered?

A child matches when every field the renderer sets has the same value in the observed object, read the way the
API server stores it: fields the server or other controllers add are ignored, zero values the server omits
(false, 0, "", empty lists and maps) match a missing field, resource quantities compare by value ("0.5" ==
"500m"), and lists of named items match by name. This catches a child deleted or edited by hand without a
request to the API server, so an idle resync costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

from specserving.reconcile.observed import Child, ChildRef

_MISSING = object()
_QUANTITY_PARENTS = frozenset({"requests", "limits", "capacity", "allocatable"})
_SUFFIXES = {
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal("1e3"),
    "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
}


def parse_quantity(value: Any) -> Decimal | None:
    """A Kubernetes resource quantity as a number, or None when it is not one."""
    text = str(value).strip()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if suffix and text.endswith(suffix):
            number, scale = text[: -len(suffix)], _SUFFIXES[suffix]
            break
    else:
        number, scale = text, Decimal(1)
    try:
        return Decimal(number) * scale
    except InvalidOperation:
        return None


def _is_zero(value: Any) -> bool:
    return value is None or value is False or value == 0 and not isinstance(value, bool) or value in ("", [], {})


def _named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items)


def _quantities_equal(desired: Any, observed: Any) -> bool:
    a, b = parse_quantity(desired), parse_quantity(observed)
    return a is not None and a == b


def matches(desired: Any, observed: Any, key: str = "", quantity: bool = False) -> bool:
    """True when `observed` carries every value of `desired` (see the module doc for the rules). `key` is the
    field name that led here; `quantity` says the value sits in a requests/limits map."""
    if observed is _MISSING:
        return _is_zero(desired)
    if isinstance(desired, dict):
        if not isinstance(observed, dict):
            return False
        in_quantities = key in _QUANTITY_PARENTS
        return all(matches(v, observed.get(k, _MISSING), k, in_quantities) for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(observed, list):
            return not desired and observed is None
        if _named(desired) and _named(observed):
            by_name = {o["name"]: o for o in observed}
            return all(matches(d, by_name.get(d["name"], _MISSING)) for d in desired)
        return len(desired) == len(observed) and all(matches(d, o) for d, o in zip(desired, observed, strict=True))
    if desired == observed and type(desired) is type(observed):
        return True
    return quantity and _quantities_equal(desired, observed)


def needs_apply(desired: dict[str, Any] | None, observed: Child | None, digest: str = "") -> bool:
    """The child is missing or differs from its rendering (`digest`: the rendering's, for a settled child, whose
    body was dropped once it matched: it matches only the rendering it was settled against). `desired` may be None
    for a settled child: its digest decides, and the rendering is not decoded (reconcile/packed.py)."""
    if observed is None:
        return True
    body = observed.body
    if body is None:
        return not digest or observed.in_sync != digest
    assert desired is not None, "a child the watch shows whole is compared with its rendering"
    return not matches(desired, body)


def prunable(desired: Iterable[ChildRef], observed: Iterable[Child], owner_uid: str) -> list[Child]:
    """Observed children owned by `owner_uid` that the current rendering (`desired`: its refs) no longer contains,
    sorted."""
    wanted = set(desired)
    stale = [c for c in observed if owner_uid in c.owner_uids and c.ref not in wanted]
    return sorted(stale, key=lambda c: (c.ref.kind, c.ref.name))
