"""Embeddings (runner="pooling") against HF transformers' LlamaModel on the same weights: its
final-norm hidden states pooled LAST / MEAN / CLS and L2-normalised, as vLLM pools a decoder
model. Chunked prefill, prefix-cache hits and preemption must not change a bit of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core import LLM, EngineArgs, LLMEngine, PoolingParams, SamplingParams
from strand.engine_core.outputs import PoolingRequestOutput

# Lengths from 1 token to several 16-token blocks; two share a 3-block prefix.
SHARED = list(range(3, 51))
PROMPTS: list[list[int]] = [[7], [5, 9, 13, 200], SHARED + [60, 61], SHARED + [70],
                            list(range(100, 137)), [11] * 20]


_MODELS: dict[Path, Any] = {}


def hf_hidden(model_dir: Path, token_ids: list[int]) -> torch.Tensor:
    """HF's LlamaModel: the final-norm hidden states of a prompt, [len, hidden] float32."""
    from transformers import AutoModel

    if model_dir not in _MODELS:
        _MODELS[model_dir] = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        return _MODELS[model_dir](torch.tensor([token_ids])).last_hidden_state[0].float()


def expected(model_dir: Path, token_ids: list[int], kind: str, normalize: bool) -> torch.Tensor:
    hidden = hf_hidden(model_dir, token_ids)
    pooled = {"LAST": hidden[-1], "MEAN": hidden.mean(dim=0), "CLS": hidden[0]}[kind]
    return torch.nn.functional.normalize(pooled, dim=-1) if normalize else pooled


def embed_all(engine: LLMEngine, prompts: list[list[int]],
              params: PoolingParams | None = None) -> dict[str, PoolingRequestOutput]:
    for i, ids in enumerate(prompts):
        engine.add_request(str(i), {"prompt_token_ids": ids}, params)
    done: dict[str, PoolingRequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert isinstance(out, PoolingRequestOutput) and out.finished
            done[out.request_id] = out
    return done


def pooling_engine(model_dir: Path, **kwargs: Any) -> LLMEngine:
    args: dict[str, Any] = {"model": str(model_dir), "device": "cpu", "runner": "pooling",
                            "dtype": "float32", **kwargs}
    return LLMEngine.from_engine_args(EngineArgs(**args))


@pytest.mark.parametrize("kind", ["LAST", "MEAN", "CLS"])
def test_embeddings_equal_hf_with_chunks_and_cache(tiny_model_dir: Path, kind: str) -> None:
    # A 16-token step budget cuts every longer prompt into chunks; the same prompts twice, so
    # the second round finds their blocks cached.
    engine = pooling_engine(tiny_model_dir, max_num_batched_tokens=16, max_num_seqs=4,
                            pooler_config={"pooling_type": kind})
    first = embed_all(engine, PROMPTS)
    second = embed_all(engine, PROMPTS)
    for i, ids in enumerate(PROMPTS):
        want = expected(tiny_model_dir, ids, kind, normalize=True)
        for got in (first[str(i)], second[str(i)]):
            assert got.prompt_token_ids == ids
            assert got.outputs.data.dtype == torch.float32 and got.outputs.data.shape == (64,)
            torch.testing.assert_close(got.outputs.data, want, atol=2e-6, rtol=1e-5)
    cached = [second[str(i)].num_cached_tokens for i in range(len(PROMPTS))]
    if kind == "LAST":
        assert max(cached) >= 32  # the second round read cached blocks
    else:
        assert cached == [0] * len(PROMPTS)  # MEAN and CLS read every position: no hits


def test_preempted_prompts_embed_the_same(tiny_model_dir: Path) -> None:
    # Four 49-token prompts advance 8 tokens a step side by side; 8 usable blocks of 16 tokens
    # hold only two of them whole: the newest are preempted, then recomputed from the start.
    prompts = [list(range(1 + i, 50 + i)) for i in range(4)]
    engine = pooling_engine(tiny_model_dir, max_num_batched_tokens=32,
                            long_prefill_token_threshold=8, num_gpu_blocks_override=9,
                            pooler_config={"pooling_type": "MEAN"})
    done = embed_all(engine, prompts)
    assert engine.engine_core.scheduler.make_stats().num_preemptions > 0
    for i, ids in enumerate(prompts):
        torch.testing.assert_close(done[str(i)].outputs.data,
                                   expected(tiny_model_dir, ids, "MEAN", normalize=True),
                                   atol=2e-6, rtol=1e-5)
    pool = engine.engine_core.scheduler.kv_cache_manager.block_pool
    assert pool.free_block_queue.num_free_blocks == pool.num_blocks - 1  # nothing leaked


def test_normalize_per_request_and_per_engine(tiny_model_dir: Path) -> None:
    ids = PROMPTS[2]
    engine = pooling_engine(tiny_model_dir)
    raw = embed_all(engine, [ids], PoolingParams(normalize=False))["0"].outputs.data
    torch.testing.assert_close(raw, expected(tiny_model_dir, ids, "LAST", normalize=False),
                               atol=2e-6, rtol=1e-5)
    assert abs(float(raw.norm()) - 1.0) > 0.1  # the raw state really is not unit length
    unnormalized = pooling_engine(tiny_model_dir, pooler_config={"normalize": False})
    again = embed_all(unnormalized, [ids])["0"].outputs.data
    torch.testing.assert_close(again, raw)
    unit = embed_all(unnormalized, [ids], PoolingParams(normalize=True))["0"].outputs.data
    torch.testing.assert_close(unit, torch.nn.functional.normalize(raw, dim=-1))


def test_llm_embed_in_prompt_order_with_truncation(tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), runner="pooling", device="cpu")
    texts = ["hello world", "the quick brown fox jumps over the lazy dog", "hello"]
    outputs = llm.embed(texts, use_tqdm=False)
    tokenizer = llm.get_tokenizer()
    for text, out in zip(texts, outputs, strict=True):
        ids = tokenizer.encode(text)
        assert out.prompt_token_ids == ids and out.outputs.hidden_size == 64
        torch.testing.assert_close(torch.tensor(out.outputs.embedding),
                                   expected(tiny_model_dir, ids, "LAST", True),
                                   atol=2e-6, rtol=1e-5)
    cut = llm.embed(texts[1], truncate_prompt_tokens=3, use_tqdm=False)[0]
    assert cut.prompt_token_ids == tokenizer.encode(texts[1])[-3:]
    # encode(): the same vectors as tensors (vLLM's PoolingRequestOutput.outputs.data).
    encoded = llm.encode(texts, PoolingParams(normalize=True), use_tqdm=False)
    for pooled, embedded in zip(encoded, outputs, strict=True):
        assert pooled.outputs.data.tolist() == embedded.outputs.embedding
    with pytest.raises(ValueError, match="pooling_task must be one of"):
        llm.encode(texts, pooling_task="reward")
    with pytest.raises(ValueError, match="task 'classify' needs a sequence classifier"):
        llm.encode(texts, pooling_task="classify")
    assert not llm.engine.has_unfinished_requests()  # all or nothing


def test_the_wrong_kind_of_request_is_refused_and_changes_nothing(tiny_model_dir: Path) -> None:
    engine = pooling_engine(tiny_model_dir)
    with pytest.raises(ValueError, match="params must be a PoolingParams"):
        engine.add_request("g", {"prompt_token_ids": [1, 2]}, SamplingParams(max_tokens=2))
    assert not engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="dimensions must be unset: the model does not"):
        engine.add_request("d", {"prompt_token_ids": [1, 2]}, PoolingParams(dimensions=32))
    assert not engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="dimensions must be an integer >= 1"):
        PoolingParams(dimensions=0)
    with pytest.raises(ValueError, match="truncate_prompt_tokens"):
        PoolingParams(truncate_prompt_tokens=0)
    # A prompt of max_model_len tokens fits (it generates nothing); one more does not.
    short = pooling_engine(tiny_model_dir, max_model_len=32)
    assert embed_all(short, [list(range(1, 33))])["0"].outputs.data.shape == (64,)
    with pytest.raises(ValueError, match="max_model_len"):
        short.add_request("long", {"prompt_token_ids": list(range(1, 34))}, None)
    generating = LLM(str(tiny_model_dir), device="cpu")
    with pytest.raises(ValueError, match="runner='pooling'"):
        generating.embed("hello", use_tqdm=False)
    with pytest.raises(ValueError, match="runner='pooling'"):
        generating.engine.add_request("p", "hello", PoolingParams())
    assert not generating.engine.has_unfinished_requests()


@pytest.mark.parametrize("config, match", [
    ({"pooling_type": "ALL"}, "pooler_config.pooling_type"),
    ({"normalise": True}, "unknown keys"),
    ({"normalize": "yes"}, "pooler_config.normalize"),
])
def test_bad_pooler_config_names_the_key(config: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EngineArgs(runner="pooling", pooler_config=config)


def test_runner_flags_are_checked() -> None:
    with pytest.raises(ValueError, match="runner must be one of"):
        EngineArgs(runner="embed")
    with pytest.raises(ValueError, match="pooler_config needs runner='pooling'"):
        EngineArgs(pooler_config={"pooling_type": "MEAN"})
    with pytest.raises(ValueError, match="speculative_config needs runner='generate'"):
        EngineArgs(runner="pooling", speculative_config={"method": "ngram",
                                                         "num_speculative_tokens": 2})


def test_abort_mid_prompt_frees_its_blocks(tiny_model_dir: Path) -> None:
    engine = pooling_engine(tiny_model_dir, max_num_batched_tokens=16)
    pool = engine.engine_core.scheduler.kv_cache_manager.block_pool
    free = pool.free_block_queue.num_free_blocks
    engine.add_request("a", {"prompt_token_ids": list(range(1, 60))}, None)
    assert engine.step() == []  # the first 16-token chunk: nothing to report yet
    engine.abort_request("a")
    assert not engine.has_unfinished_requests()
    engine.step()
    assert pool.free_block_queue.num_free_blocks == free


def test_matryoshka_dimensions_shorten_then_normalize(tiny_model_dir: Path) -> None:
    # vLLM's matryoshka embeddings: the first `dimensions` values, L2-normalised after; the
    # widths from config.json (set here by hf_overrides, as vLLM's docs set them).
    engine = pooling_engine(tiny_model_dir, hf_overrides={"matryoshka_dimensions": [16, 32]})
    ids = PROMPTS[2]
    engine.add_request("m", {"prompt_token_ids": ids}, PoolingParams(dimensions=16))
    engine.add_request("full", {"prompt_token_ids": ids}, None)
    done = {}
    while engine.has_unfinished_requests():
        done.update({out.request_id: out for out in engine.step()})
    hidden = hf_hidden(tiny_model_dir, ids)[-1]
    got = done["m"].outputs.data  # type: ignore[union-attr]
    assert got.shape == (16,)
    torch.testing.assert_close(got, torch.nn.functional.normalize(hidden[:16], dim=-1),
                               atol=2e-6, rtol=1e-5)
    assert done["full"].outputs.data.shape == (64,)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"dimensions must be one of \[16, 32\]"):
        engine.add_request("x", {"prompt_token_ids": ids}, PoolingParams(dimensions=8))
    with pytest.raises(ValueError, match="dimensions applies to task 'embed'"):
        PoolingParams(dimensions=16, task="classify")
    any_width = pooling_engine(tiny_model_dir, hf_overrides={"is_matryoshka": True})
    with pytest.raises(ValueError, match=r"dimensions must be <= the model's hidden_size \(64\)"):
        any_width.add_request("y", {"prompt_token_ids": ids}, PoolingParams(dimensions=65))
    assert embed_all(any_width, [ids], PoolingParams(dimensions=8))["0"].outputs.data.shape == (8,)
    assert not engine.has_unfinished_requests()
