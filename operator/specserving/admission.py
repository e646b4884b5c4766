"""Admission decisions as a pure function: what the validating webhook answers for a create or update.

The webhook (webhook/handlers.py) is a thin kopf wrapper around `review`. The reconciler calls
validation.validate as well, so a resource that entered while the webhook was down still gets no children.
"""

from __future__ import annotations

from typing import Any

from specserving.api.loading import spec_of
from specserving.api.types import SpecServingSpec
from specserving.capabilities import CapabilityTable
from specserving.problems import Problem, Report
from specserving.validation import Validation, validate


def _unsafe_update(new_spec: SpecServingSpec, old: dict[str, Any]) -> Report:
    """Changes that cannot be rolled out without breaking serving pods that are running."""
    report = Report()
    old_spec = spec_of(old)
    running = old_spec.prefill.replicas + old_spec.decode.replicas
    if new_spec.transfer.backend != old_spec.transfer.backend and running:
        report.errors.append(Problem("spec.transfer.backend", (
            f"Forbidden: changing the KV transfer backend from {old_spec.transfer.backend} to "
            f"{new_spec.transfer.backend} while pools run would pair prefill and decode pods that cannot talk "
            "during the rollout; scale spec.prefill.replicas and spec.decode.replicas to 0 first, or create a "
            "new SpecServing")))
    for role, new_pool, old_pool in (("prefill", new_spec.prefill, old_spec.prefill),
                                     ("decode", new_spec.decode, old_spec.decode)):
        if new_pool.nodes_per_replica != old_pool.nodes_per_replica and old_pool.replicas:
            report.errors.append(Problem(f"spec.{role}.nodesPerReplica", (
                f"Forbidden: changing nodesPerReplica from {old_pool.nodes_per_replica} to "
                f"{new_pool.nodes_per_replica} replaces the {role} workload (Deployment and LeaderWorkerSet) and "
                f"stops all {old_pool.replicas} replica(s) at once; scale spec.{role}.replicas to 0 first")))
    return report


def review(new: dict[str, Any], old: dict[str, Any] | None, table: CapabilityTable | None = None) -> Validation:
    """Everything that makes `new` inadmissible (old is None on create), plus warnings for kubectl to print.

    The apiserver has applied the schema and CEL rules before a validating webhook runs, so CEL is not
    re-evaluated here.
    """
    report = validate(new, table, run_cel=False)
    if old is not None and report.ok and report.spec is not None and not _deleting(new):
        report.extend(_unsafe_update(report.spec, old))
    return report


def _deleting(obj: dict[str, Any]) -> bool:
    return bool(obj.get("metadata", {}).get("deletionTimestamp"))


def refusal_message(report: Report) -> str:
    """The one message kubectl prints when the webhook refuses: every error, each with its field path."""
    count = len(report.errors)
    head = "SpecServing refused" if count == 1 else f"SpecServing refused ({count} problems)"
    return f"{head}: " + "; ".join(str(e) for e in report.errors)
