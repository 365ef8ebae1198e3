"""TP=2 (two ranks, gloo on 127.0.0.1, one thread each) gives TP=1's greedy tokens, and its
logprobs within float tolerance (the row-parallel sums are added in another order), on every
tiny dense architecture, with chunked prefill, preemption and a prefix hit in the same run.
The Llama case runs as two "nodes" on loopback: the engine (rank 0, --nnodes 2) and
`strand worker --node-rank 1` (rank 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from strand.engine_core.distributed.driver import free_port
from tests.conftest import build_tiny_model
from tests.engine_core.distributed.conftest import (
    MAX_TOKENS,
    SCENARIO_ARGS,
    run_scenario,
    tp_engine,
    worker_node,
)

TWO_NODES = "llama_gqa_two_nodes"
ARCHS: dict[str, dict[str, Any]] = {
    TWO_NODES: {"arch": "llama", "num_heads": 4, "num_kv_heads": 2},  # 1 KV head per rank
    # One KV head for two ranks: replicated, as vLLM does when num_kv_heads < N.
    "mistral_kv_replicated": {"arch": "mistral", "num_heads": 4, "num_kv_heads": 1},
    "qwen2_qkv_bias": {"arch": "qwen2", "num_heads": 4, "num_kv_heads": 2,
                       "vocab_size": 509},  # a vocabulary N does not divide: padded shard
    "qwen3_qk_norm": {"arch": "qwen3", "num_heads": 4, "num_kv_heads": 2},  # per-head norms
}


@pytest.mark.parametrize("arch", list(ARCHS))
def test_tp2_greedy_tokens_and_logprobs_equal_tp1(arch: str, tmp_path: Path,
                                                  tiny_model_dir: Path) -> None:
    model_dir = build_tiny_model(tmp_path / arch, with_tokenizer=False, **ARCHS[arch])
    results = {}
    for tp in (1, 2):
        # The shared tiny tokenizer (512 ids): the scenario feeds token ids only.
        args: dict[str, Any] = {"tokenizer": str(tiny_model_dir), **SCENARIO_ARGS}
        if tp == 2 and arch == TWO_NODES:
            port = free_port("127.0.0.1")
            with worker_node(tp, port) as node:
                with tp_engine(model_dir, tp, nnodes=2, master_port=port, **args) as engine:
                    results[tp] = run_scenario(engine, engine.engine_core.vocab_size)
            assert node.returncode == 0, "the worker node should exit cleanly on shutdown"
            continue
        with tp_engine(model_dir, tp, **args) as engine:
            results[tp] = run_scenario(engine, engine.engine_core.vocab_size)
    single, sharded = results[1], results[2]
    assert single.num_preemptions > 0 and sharded.num_preemptions > 0, "pool too large"
    assert single.prefix_hits >= 32 and sharded.prefix_hits >= 32, "no prefix hit"
    assert sorted(sharded.tokens) == ["0", "1", "2", "3"]
    assert sharded.tokens == single.tokens
    assert len(single.logprobs["2"]) == MAX_TOKENS + 26, "prompt logprobs of request 2 missing"
    for req_id, values in single.logprobs.items():
        assert sharded.logprobs[req_id] == pytest.approx(values, abs=1e-4), req_id


def test_tp2_with_a_bfloat16_kv_cache_gives_tp1_s_tokens(tmp_path: Path,
                                                         tiny_model_dir: Path) -> None:
    # kv_cache_dtype="bfloat16": each rank's cache of its own KV heads holds bfloat16 (sized by
    # the rank's kv_config). The logprobs' tolerance is 1e-3, not 1e-4: where the two runs'
    # float32 K or V (equal to ~1e-6) straddle a bfloat16 rounding boundary, they round one unit
    # (2^-8) apart (measured: 2.1e-4 at most).
    model_dir = build_tiny_model(tmp_path / "llama", with_tokenizer=False, **ARCHS[TWO_NODES])
    results = {}
    for tp in (1, 2):
        args: dict[str, Any] = {"tokenizer": str(tiny_model_dir), "kv_cache_dtype": "bfloat16",
                                **SCENARIO_ARGS}
        with tp_engine(model_dir, tp, **args) as engine:
            results[tp] = run_scenario(engine, engine.engine_core.vocab_size)
    assert results[2].num_preemptions > 0 and results[2].prefix_hits >= 32
    assert results[2].tokens == results[1].tokens
    for req_id, values in results[1].logprobs.items():
        assert results[2].logprobs[req_id] == pytest.approx(values, abs=1e-3), req_id
