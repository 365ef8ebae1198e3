"""kv_cache_dtype="bfloat16" under float32 weights (vLLM's kv_cache_dtype): the paged cache holds
K and V rounded to bfloat16, half of float32's bytes, and everything else stays float32.

The oracle is HF transformers with the same rounding: its cache rounds each layer's new K/V to
bfloat16 as it stores them, and its attention reads them from there for every token, the current
ones included, which is what the engine does (it writes a step's K/V, then attends over the
cache). The greedy tokens are then HF's, with batching, chunked prefill, preemption and prefix
hits on, and with the C++ kernels or the SDPA path (the newer families, windowed and softcapped
layers among them: tests/engine_core/engine/test_greedy_matches_hf_archs.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core import EngineArgs, RequestOutput, SamplingParams
from tests.engine_core.engine.conftest import (
    HFGreedy,
    assert_pool_whole,
    make_engine,
    run_to_completion,
)
from tests.engine_core.engine.test_greedy_matches_hf import MAX_TOKENS, make_prompts


@pytest.mark.parametrize("cpu_kernels", [True, False])
def test_greedy_equals_hf_with_its_cache_rounded_to_bfloat16(
        tiny_model_dir: Path, hf_greedy: HFGreedy, cpu_kernels: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if not cpu_kernels:  # every request on the gather + SDPA path, the cache cast as gathered
        from strand.engine_core.model_executor.attention import torch_ref

        monkeypatch.setattr(torch_ref, "cpu_attention_takes", lambda q, kv: False)
    engine = make_engine(tiny_model_dir, kv_cache_dtype="bfloat16", block_size=16,
                         num_gpu_blocks_override=20, max_num_batched_tokens=48, max_num_seqs=8)
    assert {c.dtype for c in engine.engine_core.runner.kv_caches} == {torch.bfloat16}
    prompts = make_prompts(engine.engine_core.vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=1)
    for i in range(4):
        engine.add_request(str(i), {"prompt_token_ids": prompts[i]}, params)
    finished = {}
    for _ in range(8):
        finished.update({o.request_id: o for o in engine.step()
                         if isinstance(o, RequestOutput) and o.finished})
    for i in range(4, len(prompts)):
        engine.add_request(str(i), {"prompt_token_ids": prompts[i]}, params)
    finished.update(run_to_completion(engine))
    stats = engine.engine_core.scheduler.make_stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_stats.hits > 0
    off_rounded = off_exact = 0.0
    for i, prompt in enumerate(prompts):
        out = finished[str(i)].outputs[0]
        tokens, logprobs = hf_greedy.generate_logprobs(prompt, MAX_TOKENS, round_kv=True)
        assert out.token_ids == tokens, f"prompt {i}"
        ours = [step[t].logprob for step, t in zip(out.logprobs or [], tokens, strict=True)]
        _, exact = hf_greedy.generate_logprobs(prompt, MAX_TOKENS)
        off_rounded = max(off_rounded, *(abs(a - b) for a, b in zip(ours, logprobs, strict=True)))
        off_exact = max(off_exact, *(abs(a - b) for a, b in zip(ours, exact, strict=False)))
    # Float32 noise against HF's rounded cache; the rounding itself against its float32 one
    # (measured: ~1e-5 and ~9e-3), so the oracle tells a rounded cache from an unrounded one.
    assert off_rounded < 5e-5 < 5e-4 < off_exact, (off_rounded, off_exact)
    assert_pool_whole(engine)


def test_the_cache_holds_half_the_bytes_so_twice_the_blocks(tiny_model_dir: Path) -> None:
    budget = 4 * 1024**2
    blocks = {kv: make_engine(tiny_model_dir, kv_cache_dtype=kv, kv_cache_memory=budget)
              .engine_core.scheduler.kv_cache_manager.block_pool.num_blocks
              for kv in ("auto", "bfloat16")}
    assert blocks["bfloat16"] == 2 * blocks["auto"]


@pytest.mark.parametrize(("value", "match"), [
    ("fp8", "fp8 caches are not supported"),
    ("float16", "kv_cache_dtype must be one of auto, bfloat16, got 'float16'"),
])
def test_other_values_are_refused_naming_the_field(value: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EngineArgs(kv_cache_dtype=value)


def test_a_backend_that_needs_the_model_s_dtype_is_refused_naming_the_way_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from strand.engine_core.model_executor.attention import selector
    from strand.engine_core.model_executor.attention.backend import AttentionBackend
    from strand.engine_core.model_executor.attention.selector import (
        get_attention_backend,
        register_attention_backend,
    )

    monkeypatch.setattr(selector, "_factories", {})  # registered for this test only

    class SameDtypeOnly(AttentionBackend):
        name = "same-dtype-only"

        def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            raise NotImplementedError

    register_attention_backend("same_dtype_only", lambda block_size: SameDtypeOnly())
    cpu = torch.device("cpu")
    assert isinstance(get_attention_backend("same_dtype_only", cpu, 16), SameDtypeOnly)
    with pytest.raises(ValueError, match="kv_cache_dtype 'auto', or attention_backend 'torch'"):
        get_attention_backend("same_dtype_only", cpu, 16, converts_kv=True)
    assert get_attention_backend(None, cpu, 16, converts_kv=True).converts_kv_dtype
