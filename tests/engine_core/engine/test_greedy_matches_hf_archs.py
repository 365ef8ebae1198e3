"""The oracle for the newer families: greedy tokens equal HF transformers' on Qwen3, Qwen3-MoE,
Phi-3 (sliding window), Gemma 2 and Gemma 3 (sliding layers interleaved with global ones), with
batching, chunked prefill and prefix caching on, prompts longer than the window and a prefix
hit that ends past it."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from strand.engine_core import SamplingParams
from strand.engine_core.outputs import RequestOutput
from tests.conftest import build_tiny_model
from tests.engine_core.engine.conftest import (
    HFGreedy,
    assert_pool_whole,
    make_engine,
    run_to_completion,
)

MAX_TOKENS = 12
WINDOW = 24  # tokens: 1.5 blocks of 16
ARCHS: dict[str, dict[str, Any]] = {
    "qwen3": {"arch": "qwen3"},
    "qwen3_moe": {"arch": "qwen3_moe"},
    "phi3": {"arch": "phi3", "sliding_window": WINDOW},
    "gemma2": {"arch": "gemma2", "sliding_window": WINDOW,
               "extra_config": {"attn_logit_softcapping": 3.0, "final_logit_softcapping": 5.0}},
    "gemma3": {"arch": "gemma3", "sliding_window": WINDOW},
}


def make_prompts(vocab_size: int) -> list[list[int]]:
    rng = random.Random(11)
    lengths = [90, 5, 40, 75, 70]
    prompts = [[rng.randrange(3, vocab_size) for _ in range(n)] for n in lengths]
    shared = prompts[0][:64]  # four full blocks, 40 tokens past the window
    for i in (3, 4):
        prompts[i] = shared + prompts[i][64:]
    return prompts


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bfloat16"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_equals_hf_with_chunking_and_prefix_hits_past_the_window(
        arch: str, kv_cache_dtype: str, tmp_path: Path, tiny_model_dir: Path) -> None:
    # kv_cache_dtype="bfloat16": HF's cache rounds its K/V to bfloat16 too (the oracle of
    # tests/engine_core/engine/test_kv_cache_dtype.py), windowed and softcapped layers included.
    model_dir = build_tiny_model(tmp_path / arch, with_tokenizer=False, **ARCHS[arch])
    # The shared tiny tokenizer (same 512 ids): the test feeds token ids only.
    engine = make_engine(model_dir, tokenizer=str(tiny_model_dir), block_size=16,
                         max_num_batched_tokens=48, max_num_seqs=8, enable_prefix_caching=True,
                         kv_cache_dtype=kv_cache_dtype)
    prompts = make_prompts(engine.engine_core.vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    for i in range(3):
        engine.add_request(str(i), {"prompt_token_ids": prompts[i]}, params)
    finished = {}
    # The sharers arrive once the first prompt's blocks are cached.
    for _ in range(4):
        for out in engine.step():
            assert isinstance(out, RequestOutput)  # a generating engine's
            if out.finished:
                finished[out.request_id] = out
    for i in range(3, len(prompts)):
        engine.add_request(str(i), {"prompt_token_ids": prompts[i]}, params)
    finished.update(run_to_completion(engine))

    stats = engine.engine_core.scheduler.make_stats()
    assert stats.prefix_cache_stats.hits >= 2 * 64, "both sharers should hit the 64 tokens"
    hf = HFGreedy.__new__(HFGreedy)
    transformers = pytest.importorskip("transformers")
    hf.model = transformers.AutoModelForCausalLM.from_pretrained(
        str(model_dir), attn_implementation="eager").eval()  # see tests/engine_core/model_executor/conftest
    rounded = kv_cache_dtype == "bfloat16"
    for i, prompt in enumerate(prompts):
        want = (hf.generate_logprobs(prompt, MAX_TOKENS, round_kv=True)[0] if rounded
                else hf.generate(prompt, MAX_TOKENS))
        assert finished[str(i)].outputs[0].token_ids == want, f"prompt {i}"
    assert_pool_whole(engine)
