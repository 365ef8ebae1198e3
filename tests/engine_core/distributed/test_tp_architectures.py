"""TP=2 (two ranks, gloo on 127.0.0.1, one thread each) gives TP=1's greedy tokens, and its
logprobs within float tolerance, on the families past the dense Llama decoder: Qwen3-MoE
(every expert's width split, router replicated), Phi-3 (fused qkv_proj / gate_up_proj tensors
split per part) and Gemma 2/3 (scaled vocab-parallel embedding, (1 + w) norms, sliding-window
layers, attention and final-logit soft-capping). Each runs conftest's scenario: chunked prefill,
preemption, reset_prefix_cache of running requests, prompt logprobs and a prefix hit.
TP=1 itself is compared with transformers in tests/engine_core/model_executor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from strand.engine_core import EngineArgs, LLMEngine
from tests.conftest import build_tiny_model
from tests.engine_core.distributed.conftest import (
    MAX_TOKENS,
    SCENARIO_ARGS,
    run_scenario,
    tp_engine,
)

# Windows of 16 tokens: shorter than the scenario's 27..48-token sequences, so the sliding
# layers attend to less than the full layers do, across chunk and block boundaries.
ARCHS: dict[str, dict[str, Any]] = {
    # 8 experts (top 2) of width 64, 32 per rank; layer 1 dense (mlp_only_layers), so both MLP
    # kinds are sharded in one model.
    "qwen3_moe_dense_and_sparse": {"arch": "qwen3_moe", "num_heads": 4, "num_kv_heads": 2,
                                   "extra_config": {"mlp_only_layers": [1]}},
    # GQA 4/2: each rank's fused qkv rows are its 2 q heads, 1 k head and 1 v head.
    "phi3_fused_gqa_window": {"arch": "phi3", "num_heads": 4, "num_kv_heads": 2,
                              "sliding_window": 16},
    "gemma2_softcaps_window": {"arch": "gemma2", "num_heads": 4, "num_kv_heads": 2,
                               "sliding_window": 16, "vocab_size": 509},
    # One KV head (replicated on both ranks), per-head (1 + w) q/k norms, tied embeddings: the
    # vocab-parallel table serves as the LM head too.
    "gemma3_tied_kv_replicated": {"arch": "gemma3", "num_heads": 4, "num_kv_heads": 1,
                                  "sliding_window": 16, "tie_word_embeddings": True},
}


@pytest.mark.parametrize("arch", list(ARCHS))
def test_tp2_equals_tp1_on_every_family(arch: str, tmp_path: Path, tiny_model_dir: Path) -> None:
    model_dir = build_tiny_model(tmp_path / arch, with_tokenizer=False, **ARCHS[arch])
    results = {}
    for tp in (1, 2):
        # The shared tiny tokenizer (512 ids): the scenario feeds token ids only.
        with tp_engine(model_dir, tp, tokenizer=str(tiny_model_dir), **SCENARIO_ARGS) as engine:
            results[tp] = run_scenario(engine, engine.engine_core.vocab_size)
    single, sharded = results[1], results[2]
    assert single.num_preemptions > 0 and sharded.num_preemptions > 0, "pool too large"
    assert single.prefix_hits >= 32 and sharded.prefix_hits >= 32, "no prefix hit"
    assert sorted(sharded.tokens) == ["0", "1", "2", "3"]
    assert all(len(t) == MAX_TOKENS for t in single.tokens.values())
    assert sharded.tokens == single.tokens
    assert len(single.logprobs["2"]) == MAX_TOKENS + 26, "prompt logprobs of request 2 missing"
    for req_id, values in single.logprobs.items():
        assert sharded.logprobs[req_id] == pytest.approx(values, abs=1e-4), req_id


def test_an_expert_width_two_ranks_cannot_split_is_refused_naming_it(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "moe", with_tokenizer=False, arch="qwen3_moe",
                                 extra_config={"moe_intermediate_size": 63})
    args = EngineArgs(model=str(model_dir), tokenizer=str(tiny_model_dir), dtype="float32",
                      device="cpu", tensor_parallel_size=2, cpu_threads=1,
                      distributed_timeout_s=30.0)
    with pytest.raises(ValueError, match=r"tensor_parallel_size \(2\) must divide "
                                         r"moe_intermediate_size \(63\)"):
        LLMEngine.from_engine_args(args)
