"""Builders for whole-engine tests: an LLMEngine on the tiny model, and HF's greedy oracle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core import EngineArgs, LLMEngine, RequestOutput


def make_engine(model_dir: Path, **overrides: Any) -> LLMEngine:
    args: dict[str, Any] = {"model": str(model_dir), "dtype": "float32", "device": "cpu"}
    args.update(overrides)
    return LLMEngine.from_engine_args(EngineArgs(**args))


def run_to_completion(engine: LLMEngine, max_steps: int = 10_000) -> dict[str, RequestOutput]:
    finished: dict[str, RequestOutput] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return finished
        for out in engine.step():
            assert isinstance(out, RequestOutput)  # a generating engine's
            if out.finished:
                finished[out.request_id] = out
    raise AssertionError(f"engine still busy after {max_steps} steps")


def assert_pool_whole(engine: LLMEngine) -> None:
    pool = engine.engine_core.scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_blocks - 1  # block 0 is reserved


class HFGreedy:
    """transformers' greedy `generate`, one prompt at a time (no padding to perturb it)."""

    def __init__(self, model_dir: Path) -> None:
        transformers = pytest.importorskip("transformers")
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=torch.float32, attn_implementation="eager").eval()
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))

    @torch.inference_mode()
    def generate(self, prompt_token_ids: list[int], max_new_tokens: int) -> list[int]:
        input_ids = torch.tensor([prompt_token_ids])
        out = self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                  max_new_tokens=max_new_tokens, do_sample=False)
        return out[0, len(prompt_token_ids):].tolist()

    @torch.inference_mode()
    def generate_logprobs(self, prompt_token_ids: list[int], max_new_tokens: int,
                          round_kv: bool = False) -> tuple[list[int], list[float]]:
        """generate()'s tokens and each one's logprob; round_kv: the cache rounds each new K/V
        to bfloat16 as it stores them (the oracle of kv_cache_dtype="bfloat16")."""
        transformers = pytest.importorskip("transformers")
        input_ids = torch.tensor([prompt_token_ids])
        cache = (bfloat16_rounding_cache(self.model.config) if round_kv
                 else transformers.DynamicCache(config=self.model.config))
        out = self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                  max_new_tokens=max_new_tokens, do_sample=False,
                                  return_dict_in_generate=True, output_logits=True,
                                  cache=cache)
        tokens = out.sequences[0, len(prompt_token_ids):].tolist()
        return tokens, [float(torch.log_softmax(step[0].float(), -1)[t])
                        for step, t in zip(out.logits, tokens, strict=True)]


def bfloat16_rounding_cache(config: Any) -> Any:
    """HF's DynamicCache for `config` (sliding-window layers included), each new K/V rounded to
    bfloat16 and kept in float32: what the engine's attention reads from a bfloat16 cache."""
    transformers = pytest.importorskip("transformers")

    class BFloat16RoundingCache(transformers.DynamicCache):  # type: ignore[misc, name-defined]
        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
                   *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            def rounded(x: torch.Tensor) -> torch.Tensor:
                return x.to(torch.bfloat16).to(x.dtype)
            return super().update(rounded(key_states), rounded(value_states), layer_idx,
                                  *args, **kwargs)

    return BFloat16RoundingCache(config=config)


@pytest.fixture(scope="module")
def hf_greedy(tiny_model_dir: Path) -> HFGreedy:
    return HFGreedy(tiny_model_dir)
