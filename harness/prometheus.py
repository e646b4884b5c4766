"""The operator's (and the API server's) /metrics in the Prometheus text format, as 'name{labels}' -> value."""

from __future__ import annotations

import re


def parse_prometheus(text: str) -> dict[str, float]:
    """'name{labels}' -> value for every sample; lines that are not samples are skipped."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out


def labels_of(key: str) -> tuple[str, dict[str, str]]:
    metric, _, rest = key.partition("{")
    return metric, dict(re.findall(r'(\w+)="([^"]*)"', rest))


def select(samples: dict[str, float], metric_name: str, **want: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples of metric `metric_name` whose labels match `want` (regexes), keyed by their sorted labels."""
    out = {}
    for key, value in samples.items():
        metric, labels = labels_of(key)
        if metric == metric_name and all(re.fullmatch(v, labels.get(k, "")) for k, v in want.items()):
            out[tuple(sorted(labels.items()))] = value
    return out


def total(samples: dict[str, float], metric_name: str, **want: str) -> float:
    """Sum of the samples of one metric whose labels match `want` (values may be regexes)."""
    return sum(select(samples, metric_name, **want).values())


def by_label(samples: dict[str, float], metric_name: str, label: str, **want: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in select(samples, metric_name, **want).items():
        k = dict(labels).get(label, "")
        out[k] = out.get(k, 0.0) + value
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}
