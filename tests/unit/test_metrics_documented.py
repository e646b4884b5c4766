"""Every Prometheus collector the operator serves (its own and the webhook's) is listed in docs/operator.md."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry

from specserving.metrics import Metrics
from specserving.webhook.handlers import WebhookMetrics

from .builders import ROOT


def test_every_metric_is_in_the_docs_table() -> None:
    registry = CollectorRegistry()
    Metrics(registry)
    WebhookMetrics(registry)
    served = {family.name for family in registry.collect()}
    assert {"specserving_builds", "specserving_build_duration_seconds"} <= served  # counters drop their _total
    table = (ROOT / "docs" / "operator.md").read_text().split("## Metrics", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`(specserving_[a-z_]+)`", table))
    missing = {name for name in served if name not in documented and f"{name}_total" not in documented}
    assert not missing, f"docs/operator.md's metrics table lacks {sorted(missing)}"
