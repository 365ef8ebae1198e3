"""The offload tier in a whole engine on the tiny model, and the KV cache Clear / Lookup calls.

The device pool (23 usable blocks of 4 tokens) cannot hold every shared prefix, so prefixes are
evicted between rounds and come back from the tier.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core import LLMEngine, RequestOutput, SamplingParams
from strand.engine_core.connector.cpu_tier import CPUBlockTier
from strand.engine_core.connector.offload import OffloadConnector
from tests.engine_core.engine.conftest import assert_pool_whole, make_engine, run_to_completion

BLOCK_SIZE = 4
PREFIX_LEN = 32  # eight blocks
NUM_PREFIXES = 4  # 32 blocks of prefixes: more than the pool holds
POOL = {"block_size": BLOCK_SIZE, "num_gpu_blocks_override": 24}
TIER = {"kv_connector": "offload", "kv_offload_bytes": 1 << 20}


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _prefixes() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, 512) for _ in range(PREFIX_LEN)] for _ in range(NUM_PREFIXES)]


def _serve(engine: LLMEngine, req_id: str, prompt: list[int]) -> RequestOutput:
    engine.add_request(req_id, {"prompt_token_ids": prompt},
                       SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    return run_to_completion(engine)[req_id]


def _rounds(engine: LLMEngine, num_rounds: int = 2) -> dict[str, RequestOutput]:
    outputs = {}
    for round_ in range(num_rounds):
        for p, prefix in enumerate(_prefixes()):
            req_id = f"{round_}-{p}"
            outputs[req_id] = _serve(engine, req_id, prefix + [round_ + 1, p + 1])
    return outputs


def _engine(model_dir: Path, **overrides: Any) -> LLMEngine:
    return make_engine(model_dir, **{**POOL, **overrides})


def test_greedy_outputs_are_identical_with_and_without_the_tier(tiny_model_dir: Path) -> None:
    plain = _rounds(_engine(tiny_model_dir))
    tiered_engine = _engine(tiny_model_dir, **TIER)
    tiered = _rounds(tiered_engine)
    assert {k: v.outputs[0].token_ids for k, v in tiered.items()} == \
        {k: v.outputs[0].token_ids for k, v in plain.items()}
    assert_pool_whole(tiered_engine)


def test_prompts_evicted_to_the_tier_are_served_with_fewer_computed_tokens(
        tiny_model_dir: Path) -> None:
    plain = _rounds(_engine(tiny_model_dir))
    tiered = _rounds(_engine(tiny_model_dir, **TIER))
    second_round = [f"1-{p}" for p in range(NUM_PREFIXES)]
    # Without the tier the pool has already evicted every prefix of the first round.
    assert [plain[r].num_cached_tokens for r in second_round] == [0] * NUM_PREFIXES
    assert [tiered[r].num_cached_tokens for r in second_round] == [PREFIX_LEN] * NUM_PREFIXES


def _tier(engine: LLMEngine) -> CPUBlockTier:
    connector = engine.engine_core.scheduler.kv_connector
    assert isinstance(connector, OffloadConnector)
    return connector.tier


def test_a_bfloat16_cache_is_offloaded_and_brought_back_as_bfloat16(
        tiny_model_dir: Path) -> None:
    # kv_cache_dtype="bfloat16": the tier holds the cache's bytes (twice the blocks of a float32
    # tier in the same budget), and a prefix brought back gives the tokens it gave on the device.
    plain = _rounds(_engine(tiny_model_dir, kv_cache_dtype="bfloat16"))
    engine = _engine(tiny_model_dir, kv_cache_dtype="bfloat16", **TIER)
    tiered = _rounds(engine)
    tier = _tier(engine)
    float32_tier = _tier(_engine(tiny_model_dir, **TIER))
    assert tier.buffer.dtype == torch.bfloat16
    assert tier.buffer.shape[0] == 2 * float32_tier.buffer.shape[0]
    assert [tiered[f"1-{p}"].num_cached_tokens for p in range(NUM_PREFIXES)] == \
        [PREFIX_LEN] * NUM_PREFIXES
    assert {k: v.outputs[0].token_ids for k, v in tiered.items()} == \
        {k: v.outputs[0].token_ids for k, v in plain.items()}
    assert_pool_whole(engine)


def test_external_hit_rate_is_reported_in_stats(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, **TIER)
    _rounds(engine)
    # Round two: 32 of 34 tokens per request came from the tier; round one: none.
    assert engine.get_stats()["connector_prefix_cache_hit_rate"] == pytest.approx(32 / 68)
    assert engine.reset_prefix_cache(reset_connector=True) is True
    assert engine.get_stats()["connector_prefix_cache_hit_rate"] == 0.0


def test_a_multi_connector_around_the_tier_serves_evicted_prompts(tiny_model_dir: Path) -> None:
    child = {"kv_connector": "offload", "kv_connector_config": {"num_cpu_blocks": 64}}
    engine = _engine(tiny_model_dir, kv_connector="multi",
                     kv_connector_config={"connectors": [child]})
    outputs = _rounds(engine)
    assert [outputs[f"1-{p}"].num_cached_tokens for p in range(NUM_PREFIXES)] == \
        [PREFIX_LEN] * NUM_PREFIXES
    assert engine.reset_prefix_cache(reset_connector=True) is True
    assert engine.lookup_kv_cache(_prefixes()[0]) == {"device": 0, "cpu": 0}


def test_after_reset_connector_lookup_reports_zero_on_every_location(
        tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, **TIER)
    prompt = _prefixes()[0] + [1]
    _serve(engine, "a", prompt)
    assert engine.lookup_kv_cache(prompt) == {"device": PREFIX_LEN, "cpu": PREFIX_LEN}
    assert engine.reset_prefix_cache(reset_connector=True) is True
    assert engine.lookup_kv_cache(prompt) == {"device": 0, "cpu": 0}
    assert_pool_whole(engine)


def test_reset_without_reset_connector_keeps_the_tier(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, **TIER)
    prompt = _prefixes()[0] + [1]
    _serve(engine, "a", prompt)
    assert engine.reset_prefix_cache() is True
    assert engine.lookup_kv_cache(prompt) == {"device": 0, "cpu": PREFIX_LEN}
    assert _serve(engine, "b", prompt).num_cached_tokens == PREFIX_LEN


def test_lookup_counts_only_the_leading_cached_blocks(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, **TIER)
    prefix = _prefixes()[0]
    _serve(engine, "a", prefix + [1])
    changed = prefix[:8] + [(prefix[8] + 1) % 512] + prefix[9:]
    assert engine.lookup_kv_cache(changed) == {"device": 8, "cpu": 8}
    assert engine.lookup_kv_cache(prefix[:6]) == {"device": 4, "cpu": 4}
    assert engine.lookup_kv_cache([]) == {"device": 0, "cpu": 0}


def test_clear_cpu_empties_the_tier_and_counts_its_tokens(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, **TIER)
    prompt = _prefixes()[0] + [1]
    _serve(engine, "a", prompt)  # 33 prompt + 3 fed back: 36 computed tokens, nine blocks
    event_id, num_tokens = engine.clear_kv_cache("", "cpu")
    assert event_id
    assert num_tokens == 36
    assert engine.lookup_kv_cache(prompt) == {"device": PREFIX_LEN, "cpu": 0}


def test_clear_device_forgets_the_pools_cached_prefixes(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, **TIER)
    prompt = _prefixes()[0] + [1]
    _serve(engine, "a", prompt)
    event_id, num_tokens = engine.clear_kv_cache("engine-0", "device")
    assert num_tokens == 36
    assert engine.lookup_kv_cache(prompt) == {"device": 0, "cpu": PREFIX_LEN}
    assert engine.clear_kv_cache("", "device")[1] == 0
    assert engine.clear_kv_cache("", "device")[0] != event_id  # each clear is its own event


def test_clear_cpu_without_a_connector_clears_nothing(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    _serve(engine, "a", _prefixes()[0] + [1])
    assert engine.clear_kv_cache("", "cpu")[1] == 0
    assert engine.lookup_kv_cache(_prefixes()[0])["cpu"] == 0


def test_clear_rejects_an_unknown_location(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, **TIER)
    with pytest.raises(ValueError, match=r"location must be one of \['device', 'cpu'\]"):
        engine.clear_kv_cache("", "disk")


def test_clear_rejects_another_instance_id(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, **TIER)
    with pytest.raises(ValueError, match="instance_id must be 'engine-0'"):
        engine.clear_kv_cache("engine-7", "cpu")


def test_lookup_rejects_token_ids_outside_the_vocabulary(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, **TIER)
    with pytest.raises(ValueError, match=r"token_ids must be ints in \[0, 512\)"):
        engine.lookup_kv_cache([1, 512])


def test_preempted_requests_resume_from_the_tier_with_unchanged_output(
        tiny_model_dir: Path) -> None:
    prompts = [p[:20] for p in _prefixes()[:3]]

    def run(**overrides: Any) -> tuple[dict[str, list[int]], LLMEngine]:
        engine = make_engine(tiny_model_dir, block_size=BLOCK_SIZE, num_gpu_blocks_override=16,
                             **overrides)
        for i, prompt in enumerate(prompts):
            engine.add_request(str(i), {"prompt_token_ids": prompt},
                               SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
        out = run_to_completion(engine)
        return {k: v.outputs[0].token_ids for k, v in out.items()}, engine

    plain, _ = run()
    tiered, engine = run(**TIER)
    scheduler = engine.engine_core.scheduler
    assert scheduler.num_preemptions > 0
    stats = scheduler.make_stats().connector_prefix_cache_stats
    # Resumed requests' loads count as preempted hits (vLLM's split of the counters).
    assert stats is not None and stats.preempted_hits > 0
    assert tiered == plain
    assert_pool_whole(engine)
