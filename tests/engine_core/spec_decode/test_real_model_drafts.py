"""The real SmolLM2-135M-Instruct file with drafts on: greedy tokens still equal HF
transformers' loading the same file (gguf_file=), with drafts accepted along the way."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from strand.engine_core import EngineArgs, LLMEngine
from tests.engine_core.engine.test_real_model import HF_PROMPTS, greedy_ids
from tests.engine_core.spec_decode.conftest import NGRAM

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

COPY = ("Repeat this list exactly: apples, pears, plums, apples, pears, plums, apples, pears, "
        "plums, apples, pears, plums.")
MAX_TOKENS = 24


def test_greedy_tokens_with_drafts_equal_hf_on_the_real_model(smollm2_gguf: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    engine = LLMEngine.from_engine_args(EngineArgs(model=str(smollm2_gguf), dtype="float32",
                                                   speculative_config=NGRAM))
    prompts = [*HF_PROMPTS, COPY]
    ours = greedy_ids(engine, prompts, MAX_TOKENS)
    spec = engine.engine_core.scheduler.make_stats().spec_decoding
    assert spec is not None and spec.num_accepted_tokens >= 5, spec
    tok = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    model = AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent,
                                                 gguf_file=smollm2_gguf.name,
                                                 dtype=torch.float32)
    for i in range(len(prompts)):
        prompt_ids, generated = ours[str(i)]
        with torch.inference_mode():
            hf = model.generate(torch.tensor([prompt_ids]), max_new_tokens=MAX_TOKENS,
                                do_sample=False,
                                pad_token_id=tok.eos_token_id)[0, len(prompt_ids):].tolist()
        assert generated and generated == hf[:len(generated)], f"prompt {i}"
