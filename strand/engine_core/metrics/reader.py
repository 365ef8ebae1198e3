"""In-memory view of a registry's metrics (vLLM's vllm/v1/metrics/reader.py shapes): what
LLMEngine.get_metrics() returns, one object per metric and label set."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.samples import Sample


@dataclass(slots=True)
class Metric:
    """One metric under one set of labels (a name may appear once per label set)."""

    name: str
    labels: dict[str, str]


@dataclass(slots=True)
class Counter(Metric):
    """Monotonically increasing; `name` is the family name (no `_total`)."""

    value: int


@dataclass(slots=True)
class Vector(Metric):
    """An ordered array of counters (vLLM's type for per-position counts; none here yet)."""

    values: list[int]


@dataclass(slots=True)
class Gauge(Metric):
    value: float


@dataclass(slots=True)
class Histogram(Metric):
    """buckets: upper bound as Prometheus writes it ("0.5", "+Inf") -> cumulative count."""

    count: int
    sum: float
    buckets: dict[str, int]


def snapshot(registry: CollectorRegistry, prefix: str = "strand:") -> list[Metric]:
    """Every gauge, counter and histogram of `registry` whose name starts with `prefix`."""
    collected: list[Metric] = []
    for family in registry.collect():
        if not family.name.startswith(prefix):
            continue
        if family.type == "gauge":
            collected += [Gauge(family.name, s.labels, s.value) for s in family.samples]
        elif family.type == "counter":
            collected += [Counter(family.name, s.labels, int(s.value))
                          for s in _named(family.samples, family.name + "_total")]
        elif family.type == "histogram":
            collected += _histograms(family.name, family.samples)
    return collected


def _named(samples: list[Sample], name: str) -> list[Sample]:
    return [s for s in samples if s.name == name]


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _histograms(name: str, samples: list[Sample]) -> list[Metric]:
    # One histogram per label set: its _bucket samples (label "le"), _count and _sum.
    buckets: dict[tuple[tuple[str, str], ...], dict[str, int]] = {}
    for s in _named(samples, name + "_bucket"):
        labels = {k: v for k, v in s.labels.items() if k != "le"}
        buckets.setdefault(_key(labels), {})[s.labels["le"]] = int(s.value)
    counts = {_key(s.labels): int(s.value) for s in _named(samples, name + "_count")}
    sums = {_key(s.labels): s.value for s in _named(samples, name + "_sum")}
    return [Histogram(name, dict(key), counts.get(key, 0), sums.get(key, 0.0), by_le)
            for key, by_le in buckets.items()]
