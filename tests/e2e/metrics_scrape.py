"""Scraping a service's /metrics with Prometheus' own text parser, and a small workload that
moves them (shared by test_metrics.py and test_prometheus.py)."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

from strand.engine_core.sampling_params import SamplingParams
from strand.services.client import EngineClient
from strand.services.launch import Stack

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
# Distinct prompts shorter than a block: no prefix-cache hit, every prompt token computed.
PROMPTS = [[1, 201, 202, 203, 204], [1, 211, 212, 213]]
MAX_TOKENS = 4


def scrape(stack: Stack, service: str) -> tuple[dict[str, str], Samples]:
    """(family name -> type, (sample name, labels) -> value) of one service's /metrics."""
    url = f"http://{stack.config.host}:{stack.metrics_ports[service]}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return types, samples


def value(samples: Samples, name: str, labels: Mapping[str, str] | None = None,
          missing: float | None = None) -> float:
    """The sum over the samples of `name` whose labels include `labels` (`missing` when there
    is none: a label value appears with its first event)."""
    wanted = set((labels or {}).items())
    found = [v for (n, ls), v in samples.items() if n == name and wanted <= set(ls)]
    if not found and missing is not None:
        return missing
    assert found, f"no sample {name} {labels}"
    return sum(found)


def run_requests(client: EngineClient, prefix: str) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        client.add_request(f"{prefix}-{i}", {"prompt_token_ids": prompt}, params)
    deadline = time.monotonic() + 60
    while client.has_unfinished_requests():
        assert time.monotonic() < deadline, "requests did not finish"
        client.step()
