"""The oracle: greedy tokens equal HF transformers' greedy generation on the same weights, with
batching, chunked prefill, preemption and prefix caching all exercised in one run."""

from __future__ import annotations

import random
from pathlib import Path

from strand.engine_core import SamplingParams
from strand.engine_core.outputs import RequestOutput
from tests.engine_core.engine.conftest import (
    HFGreedy,
    assert_pool_whole,
    make_engine,
    run_to_completion,
)

MAX_TOKENS = 24


def make_prompts(vocab_size: int) -> list[list[int]]:
    rng = random.Random(7)
    lengths = [3, 17, 33, 150, 64, 90, 120, 9]
    prompts = [[rng.randrange(3, vocab_size) for _ in range(n)] for n in lengths]
    shared = prompts[3][:64]  # four full blocks shared with the 150-token prompt
    for i in (4, 5, 6):
        prompts[i] = shared + prompts[i][64:]
    return prompts


def test_greedy_equals_hf_with_chunking_preemption_and_prefix_hits(tiny_model_dir: Path,
                                                                   hf_greedy: HFGreedy) -> None:
    engine = make_engine(tiny_model_dir, block_size=16, num_gpu_blocks_override=20,
                         max_num_batched_tokens=48, max_num_seqs=8)
    prompts = make_prompts(engine.engine_core.vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    finished = {}
    # Continuous admission: half the prompts now, the rest while the first ones decode.
    for i in range(4):
        engine.add_request(str(i), {"prompt_token_ids": prompts[i]}, params)
    for _ in range(8):
        for out in engine.step():
            assert isinstance(out, RequestOutput)  # a generating engine's
            if out.finished:
                finished[out.request_id] = out
    for i in range(4, len(prompts)):
        engine.add_request(str(i), {"prompt_token_ids": prompts[i]}, params)
    finished.update(run_to_completion(engine))

    stats = engine.engine_core.scheduler.make_stats()
    assert stats.num_preemptions > 0, "the tiny pool should have forced preemption"
    assert stats.prefix_cache_stats.hits > 0, "shared prefixes should have hit the cache"
    for i, prompt in enumerate(prompts):
        expected = hf_greedy.generate(prompt, MAX_TOKENS)
        assert finished[str(i)].outputs[0].token_ids == expected, f"prompt {i}"
    assert_pool_whole(engine)


def test_greedy_text_equals_hf_decoded_text(tiny_model_dir: Path, hf_greedy: HFGreedy) -> None:
    engine = make_engine(tiny_model_dir)
    texts = ["The quick brown fox", "Once upon a time, in a land far away,", "é 中 🙂 tokens"]
    params = SamplingParams(temperature=0.0, max_tokens=16)
    for i, text in enumerate(texts):
        engine.add_request(str(i), text, params)
    finished = run_to_completion(engine)
    for i, text in enumerate(texts):
        out = finished[str(i)]
        hf_ids = hf_greedy.tokenizer(text)["input_ids"]
        assert out.prompt_token_ids == hf_ids
        expected_ids = hf_greedy.generate(hf_ids, 16)
        assert out.outputs[0].token_ids == expected_ids
        assert out.outputs[0].text == hf_greedy.tokenizer.decode(expected_ids,
                                                                 skip_special_tokens=True)
    assert_pool_whole(engine)
