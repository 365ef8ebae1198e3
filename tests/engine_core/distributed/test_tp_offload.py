"""The CPU offload tier with TP=2: rank 0's connector decides every save and load, each rank
copies its own KV heads; prefixes evicted from the device pool come back from the tier with
TP=1's greedy tokens."""

from __future__ import annotations

import random
from pathlib import Path

from strand.engine_core import LLMEngine, SamplingParams
from strand.engine_core.outputs import RequestOutput
from tests.engine_core.distributed.conftest import tp_engine

BLOCK_SIZE = 4
# 23 usable blocks of 4 tokens: the four 32-token prefixes (32 blocks) cannot all stay.
ARGS = {"block_size": BLOCK_SIZE, "num_gpu_blocks_override": 24, "kv_connector": "offload",
        "kv_offload_bytes": 1 << 20}


def _rounds(engine: LLMEngine) -> dict[str, list[int]]:
    rng = random.Random(0)
    prefixes = [[rng.randrange(3, 512) for _ in range(32)] for _ in range(4)]
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    for round_ in range(2):
        for p, prefix in enumerate(prefixes):
            req_id = f"{round_}-{p}"
            engine.add_request(req_id, {"prompt_token_ids": prefix + [round_ + 1, p + 1]},
                               params)
            for _ in range(100):
                if not engine.has_unfinished_requests():
                    break
                for out in engine.step():
                    assert isinstance(out, RequestOutput)  # a generating engine's
                    if out.finished:
                        tokens[req_id] = list(out.outputs[0].token_ids)
    return tokens


def test_tp2_with_the_offload_tier_gives_tp1_tokens(tiny_model_dir: Path) -> None:
    results, hits = {}, {}
    for tp in (1, 2):
        with tp_engine(tiny_model_dir, tp, **ARGS) as engine:
            results[tp] = _rounds(engine)
            stats = engine.engine_core.scheduler.make_stats().connector_prefix_cache_stats
            assert stats is not None
            hits[tp] = stats.hits
    assert hits[1] > 0 and hits[2] == hits[1], "the second round should load from the tier"
    assert len(results[2]) == 8
    assert results[2] == results[1]
