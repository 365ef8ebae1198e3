"""Prometheus metrics under vLLM's names with a `strand:` prefix, each recorded by the stage that
knows it: the engine core (scheduler, KV cache, tokens per step), the output processor (each
request's latencies and how it finished). `reader.snapshot` is what LLMEngine.get_metrics()
returns; a service serves the same registry on /metrics (strand/services/common/metrics_server.py)."""

from __future__ import annotations

from strand.engine_core.metrics.reader import Counter, Gauge, Histogram, Metric, Vector, snapshot

PREFIX = "strand:"

__all__ = ["PREFIX", "Counter", "Gauge", "Histogram", "Metric", "Vector", "snapshot"]
