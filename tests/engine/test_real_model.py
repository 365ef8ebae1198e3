"""The real SmolLM2-135M-Instruct GGUF file: Strand's greedy tokens equal HF transformers' loading
the same file with gguf_file= (which dequantizes it the same way), plain and chat prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine_core import EngineArgs, LLMEngine, SamplingParams

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

PROMPTS: list[str | dict[str, Any]] = ["The capital of France is", "def fibonacci(n):",
                         {"messages": [{"role": "user", "content": "What is 2+2?"}]}]


def test_greedy_tokens_equal_hf_on_the_real_model(smollm2_gguf: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    engine = LLMEngine.from_engine_args(EngineArgs(model=str(smollm2_gguf), dtype="float32"))
    params = SamplingParams(temperature=0.0, max_tokens=16)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, params)
    ours: dict[str, tuple[list[int], list[int]]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                ours[out.request_id] = (list(out.prompt_token_ids or []),
                                        list(out.outputs[0].token_ids))
    tok = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    model = AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name,
                                                 dtype=torch.float32)
    for i, prompt in enumerate(PROMPTS):
        if isinstance(prompt, dict):
            text = tok.apply_chat_template(prompt["messages"], add_generation_prompt=True,
                                           tokenize=False)
            ids = tok(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tok(prompt)["input_ids"]
        prompt_ids, generated = ours[str(i)]
        assert prompt_ids == ids, f"prompt {i} tokenized differently"
        with torch.inference_mode():
            hf = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False,
                                pad_token_id=tok.eos_token_id)[0, len(ids):].tolist()
        assert generated == hf[:len(generated)] and generated, f"prompt {i}"


def test_smollm2_is_a_short_name_for_the_pulled_file(smollm2_gguf: Path) -> None:
    from engine_core.default_model import resolve_model_dir

    directory = Path(resolve_model_dir("smollm2"))
    assert (directory / "config.json").is_file() and (directory / "tokenizer.json").is_file()
    assert smollm2_gguf.stem in directory.name
