"""The shapes the API server's dry run accepted lately (reconcile/accepted.py): how long and how many are kept."""

from __future__ import annotations

from specserving.reconcile import accepted
from specserving.reconcile.accepted import Accepted, Shape
from specserving.rendering.image import ResolvedImage

IMAGE = ResolvedImage("lmsysorg/sglang:v0.5.17-cu129", "0.5.17")


def shape(namespace: str = "ns", digest: str = "d1") -> Shape:
    return Shape(namespace, digest, IMAGE, (("decode", 2), ("prefill", 1)), True)


def test_a_shape_is_accepted_for_ten_minutes_then_asked_again() -> None:
    now = [100.0]
    kept = Accepted(clock=lambda: now[0])
    assert not kept.holds(shape())
    kept.add(shape())
    assert kept.holds(shape()) and not kept.holds(shape("other")) and not kept.holds(shape(digest="d2"))
    now[0] += accepted.TTL_SECONDS - 1
    assert kept.holds(shape())
    now[0] += 1
    assert not kept.holds(shape())


def test_past_the_bound_the_oldest_shape_is_forgotten(monkeypatch) -> None:
    monkeypatch.setattr(accepted, "MAX_SHAPES", 2)
    kept = Accepted()
    for digest in ("a", "b", "c"):
        kept.add(shape(digest=digest))
    assert [kept.holds(shape(digest=d)) for d in ("a", "b", "c")] == [False, True, True]
