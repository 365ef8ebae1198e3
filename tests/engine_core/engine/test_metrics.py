"""LLMEngine.get_metrics(): vLLM's metric objects under `strand:`, moving with requests."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from strand.engine_core import LLMEngine, SamplingParams
from strand.engine_core.errors import QueueFullError
from strand.engine_core.metrics import Counter, Gauge, Histogram, Metric
from tests.engine_core.engine.conftest import make_engine, run_to_completion

PROMPTS = [[1, 10, 11, 12, 13], [1, 20, 21, 22], [1, 30, 31, 32, 33, 34]]


def by_name(metrics: list[Metric], name: str, **labels: str) -> Metric:
    found = [m for m in metrics if m.name == name
             and all(m.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def counter(engine: LLMEngine, name: str, **labels: str) -> int:
    metric = by_name(engine.get_metrics(), name, **labels)
    assert isinstance(metric, Counter)
    return metric.value


def gauge(engine: LLMEngine, name: str) -> float:
    metric = by_name(engine.get_metrics(), name)
    assert isinstance(metric, Gauge)
    return metric.value


def histogram(engine: LLMEngine, name: str) -> Histogram:
    metric = by_name(engine.get_metrics(), name)
    assert isinstance(metric, Histogram)
    return metric


def add_all(engine: LLMEngine, max_tokens: int) -> None:
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), {"prompt_token_ids": prompt},
                           SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                          ignore_eos=True))


def test_metrics_start_at_zero_and_carry_the_model_name(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    metrics = engine.get_metrics()
    assert all(m.name.startswith("strand:") for m in metrics)
    assert {m.labels["model_name"] for m in metrics} == {str(tiny_model_dir)}
    for name in ("strand:prompt_tokens", "strand:generation_tokens",
                 "strand:prefix_cache_queries", "strand:num_preemptions"):
        assert counter(engine, name) == 0
    for reason in ("stop", "length", "abort", "error"):
        assert counter(engine, "strand:request_success", finished_reason=reason) == 0
    assert histogram(engine, "strand:time_to_first_token_seconds").count == 0


@pytest.mark.parametrize(("kv_cache_dtype", "resolved"), [("auto", "float32"),
                                                          ("bfloat16", "bfloat16")])
def test_cache_config_info_labels_the_kv_cache_s_configuration(
        tiny_model_dir: Path, kv_cache_dtype: str, resolved: str) -> None:
    # vLLM's cache_config_info: one sample of value 1, the configuration in its labels.
    engine = make_engine(tiny_model_dir, kv_cache_dtype=kv_cache_dtype, block_size=8,
                         num_gpu_blocks_override=40)
    metric = by_name(engine.get_metrics(), "strand:cache_config_info")
    assert isinstance(metric, Gauge) and metric.value == 1.0
    assert {k: v for k, v in metric.labels.items() if k != "model_name"} == {
        "block_size": "8", "cache_dtype": kv_cache_dtype, "kv_cache_dtype_resolved": resolved,
        "enable_prefix_caching": "True", "prefix_caching_hash_algo": "sha256",
        "num_gpu_blocks": "40"}


def test_gauges_follow_waiting_and_running_requests(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    add_all(engine, max_tokens=4)
    assert gauge(engine, "strand:num_requests_waiting") == 3
    assert gauge(engine, "strand:num_requests_running") == 0
    assert gauge(engine, "strand:kv_cache_usage_perc") == 0.0
    engine.step()
    assert gauge(engine, "strand:num_requests_waiting") == 0
    assert gauge(engine, "strand:num_requests_running") == 3
    assert 0.0 < gauge(engine, "strand:kv_cache_usage_perc") <= 1.0
    run_to_completion(engine)
    assert gauge(engine, "strand:num_requests_running") == 0
    assert gauge(engine, "strand:kv_cache_usage_perc") == 0.0


def test_token_counters_and_request_histograms_count_every_request(
        tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    max_tokens = 5
    add_all(engine, max_tokens)
    finished = run_to_completion(engine)
    assert counter(engine, "strand:prompt_tokens") == sum(len(p) for p in PROMPTS)
    assert counter(engine, "strand:generation_tokens") == 3 * max_tokens
    assert counter(engine, "strand:request_success", finished_reason="length") == 3
    assert counter(engine, "strand:request_success", finished_reason="stop") == 0
    for name in ("strand:time_to_first_token_seconds", "strand:e2e_request_latency_seconds",
                 "strand:request_queue_time_seconds", "strand:request_prefill_time_seconds",
                 "strand:request_decode_time_seconds",
                 "strand:request_time_per_output_token_seconds"):
        hist = histogram(engine, name)
        assert hist.count == 3, name
        assert hist.buckets["+Inf"] == 3, name
    # One inter-token interval per token after each request's first.
    assert histogram(engine, "strand:inter_token_latency_seconds").count == 3 * (max_tokens - 1)
    sizes = histogram(engine, "strand:request_generation_tokens")
    assert (sizes.count, sizes.sum) == (3, 3.0 * max_tokens)
    e2e = histogram(engine, "strand:e2e_request_latency_seconds").sum
    expected = 0.0
    for out in finished.values():
        assert out.metrics is not None and out.metrics.finished_time is not None
        expected += out.metrics.finished_time - out.metrics.arrival_time
    assert abs(e2e - expected) < 1e-6
    # Every step computed something: one iteration observation per step, all tokens counted.
    iterations = histogram(engine, "strand:iteration_tokens_total")
    assert iterations.count == engine.engine_core.num_steps
    assert iterations.sum == sum(len(p) for p in PROMPTS) + 3 * (max_tokens - 1)


def test_aborted_request_counts_as_abort(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    engine.add_request("a", "abort me", SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    engine.abort_request("a")
    assert counter(engine, "strand:request_success", finished_reason="abort") == 1
    assert histogram(engine, "strand:e2e_request_latency_seconds").count == 1


def test_request_the_core_refused_is_not_counted_as_aborted(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir, max_waiting_requests=1)
    engine.add_request("a", "one", SamplingParams(max_tokens=2))
    with pytest.raises(QueueFullError):
        engine.add_request("b", "two", SamplingParams(max_tokens=2))
    assert counter(engine, "strand:request_success", finished_reason="abort") == 0
    assert histogram(engine, "strand:e2e_request_latency_seconds").count == 0


def test_prefix_cache_counters_grow_across_a_reset(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir, block_size=16)
    prompt = {"prompt_token_ids": [1, *range(40, 80)]}  # 41 tokens: two full blocks
    params = SamplingParams(temperature=0.0, max_tokens=2)
    engine.add_request("first", prompt, params)
    run_to_completion(engine)
    assert counter(engine, "strand:prefix_cache_queries") == 41
    assert counter(engine, "strand:prefix_cache_hits") == 0
    engine.add_request("second", prompt, params)
    run_to_completion(engine)
    assert counter(engine, "strand:prefix_cache_queries") == 82
    assert counter(engine, "strand:prefix_cache_hits") == 32
    assert gauge(engine, "strand:prefix_cache_hit_rate") == 32 / 82
    # The scheduler's own counts restart at a reset; the Prometheus counters must not.
    assert engine.reset_prefix_cache()
    engine.add_request("third", prompt, params)
    run_to_completion(engine)
    assert counter(engine, "strand:prefix_cache_queries") == 123
    assert counter(engine, "strand:prefix_cache_hits") == 32


def test_preemptions_are_counted(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir, block_size=16, num_gpu_blocks_override=8,
                         max_num_seqs=8)
    for i in range(4):
        engine.add_request(str(i), {"prompt_token_ids": [1, *range(100 + i * 40, 130 + i * 40)]},
                           SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    finished = run_to_completion(engine)
    preemptions = engine.engine_core.scheduler.num_preemptions
    assert preemptions > 0, "the tiny pool should have forced preemption"
    assert counter(engine, "strand:num_preemptions") == preemptions
    # Each request's own preemptions reach its RequestOutput, with their times, in order.
    total = 0
    for out in finished.values():
        m = out.metrics
        assert m is not None and m.finished_time is not None
        assert m.preemption_times == sorted(m.preemption_times)
        assert all(m.arrival_time <= t <= m.finished_time for t in m.preemption_times)
        total += len(m.preemption_times)
    assert total == preemptions


def test_do_log_stats_logs_the_line_now(tiny_model_dir: Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    engine = make_engine(tiny_model_dir, log_stats=True, stats_interval_s=3600.0)
    engine.add_request("a", "one", SamplingParams(max_tokens=3, ignore_eos=True))
    run_to_completion(engine)
    with caplog.at_level(logging.INFO, logger="strand.stats"):
        engine.do_log_stats()  # the interval is an hour: only do_log_stats logs now
    lines = [r.getMessage() for r in caplog.records if r.name == "strand.stats"]
    assert len(lines) == 1
    assert "Avg generation throughput" in lines[0] and "Running: 0 reqs" in lines[0]
    assert not lines[0].startswith("Avg prompt throughput: 0.0")  # the prompt was counted


def test_do_log_stats_is_quiet_without_log_stats(tiny_model_dir: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    engine = make_engine(tiny_model_dir)
    with caplog.at_level(logging.INFO, logger="strand.stats"):
        engine.do_log_stats()
    assert not [r for r in caplog.records if r.name == "strand.stats"]


def test_many_observations_at_once_count_as_one_at_a_time() -> None:
    """observe_many (a request's held steps' latencies) leaves a histogram as observe would."""
    import random

    from prometheus_client import CollectorRegistry
    from prometheus_client import Histogram as PromHistogram

    from strand.engine_core.metrics.request_metrics import ITL_BUCKETS, observe_many

    rng = random.Random(5)
    values = [rng.choice([rng.random() / 10, rng.choice(ITL_BUCKETS), 200.0, 0.0])
              for _ in range(500)]
    histograms = []
    for _ in range(2):
        registry = CollectorRegistry()
        histograms.append((registry, PromHistogram("h", "h", buckets=ITL_BUCKETS,
                                                   registry=registry)))
    for value in values:
        histograms[0][1].observe(value)
    observe_many(histograms[1][1], values[:250])
    observe_many(histograms[1][1], values[250:])
    observe_many(histograms[1][1], [])

    def samples(registry: CollectorRegistry) -> dict[str, float]:
        return {f"{s.name}{sorted(s.labels.items())}": s.value for m in registry.collect()
                for s in m.samples if not s.name.endswith("_created")}

    one_by_one, batched = samples(histograms[0][0]), samples(histograms[1][0])
    assert batched == pytest.approx(one_by_one)
    assert one_by_one["h_count[]"] == 500
