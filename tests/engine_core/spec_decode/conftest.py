"""Prompts that prompt lookup can draft for, and runs with and without drafts to compare."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from strand.engine_core import LLMEngine, RequestOutput, SamplingParams
from tests.engine_core.engine.conftest import make_engine, run_to_completion
from tests.engine_core.model_executor.conftest import llama_dir, variant_dirs  # noqa: F401  (fixtures)

NGRAM: dict[str, Any] = {"method": "ngram", "num_speculative_tokens": 4,
                         "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def repetitive_prompts(vocab_size: int, seed: int = 1) -> list[list[int]]:
    """Patterns repeated: the tiny random model continues (and loops) in ways the history
    predicts, so drafts are accepted often enough to matter."""
    rng = random.Random(seed)
    prompts = []
    for n, times in ((5, 6), (9, 4), (13, 3), (4, 10)):
        pattern = [rng.randrange(3, vocab_size) for _ in range(n)]
        prompts.append(pattern * times)
    return prompts


def run(model_dir: Path, prompts: list[list[int]], params: list[SamplingParams],
        speculative: bool, **engine_args: Any) -> tuple[dict[str, RequestOutput], LLMEngine]:
    engine = make_engine(model_dir, speculative_config=NGRAM if speculative else None,
                         **engine_args)
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, p)
    return run_to_completion(engine), engine
