"""Builders for LoRA tests: PEFT adapters made by peft itself on the tiny Llama, HF's greedy
output on the PEFT-merged model (the oracle), and a LoRA-enabled engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core import EngineArgs, LLMEngine, LoRARequest, SamplingParams
from tests.engine_core.engine.conftest import run_to_completion

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPT = [1, 5, 9, 33, 7, 100, 200, 3, 44, 61, 17, 250, 8, 90, 12, 400, 23]  # 17 tokens
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def make_peft_adapter(model_dir: Path, out_dir: Path, *, seed: int, r: int = 8,
                      alpha: int = 16, targets: list[str] | None = None,
                      use_rslora: bool = False) -> Path:
    """peft's own get_peft_model + save_pretrained; lora_B drawn non-zero (peft inits it to
    zero, which would make any adapter a no-op and the test blind)."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    base = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets or ALL_TARGETS,
                             lora_dropout=0.0, use_rslora=use_rslora)
    torch.manual_seed(seed)
    model = peft.get_peft_model(base, config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, 0.3)
    model.save_pretrained(str(out_dir))
    return out_dir


def hf_merged_greedy(model_dir: Path, adapter_dir: Path | None, prompt: list[int],
                     max_new_tokens: int) -> list[int]:
    """transformers' greedy generate on the base model with the adapter merged in by peft."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if adapter_dir is not None:
        model = peft.PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    model.eval()
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=max_new_tokens, do_sample=False)
    return list(out[0, len(prompt):].tolist())


def make_lora_engine(model_dir: Path, **overrides: Any) -> LLMEngine:
    args: dict[str, Any] = {"model": str(model_dir), "dtype": "float32", "device": "cpu",
                            "enable_lora": True, "max_loras": 2, "max_lora_rank": 8,
                            "max_cpu_loras": 3, "block_size": 4}
    args.update(overrides)
    return LLMEngine.from_engine_args(EngineArgs(**args))


def generate(engine: LLMEngine, jobs: dict[str, LoRARequest | None],
             prompt: list[int] = PROMPT) -> dict[str, list[int]]:
    """All jobs added before the first step (one batch), greedy tokens per request id."""
    for request_id, lora in jobs.items():
        engine.add_request(request_id, {"prompt_token_ids": prompt}, GREEDY, lora_request=lora)
    done = run_to_completion(engine)
    return {rid: list(done[rid].outputs[0].token_ids) for rid in jobs}


def write_config(adapter_dir: Path, **changes: Any) -> None:
    path = adapter_dir / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.fixture(scope="session")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, Path]:
    """"all": every target, r=8; "qv": q and v only, r=4, rsLoRA scaling."""
    root = tmp_path_factory.mktemp("adapters")
    return {
        "all": make_peft_adapter(tiny_model_dir, root / "all", seed=1),
        "qv": make_peft_adapter(tiny_model_dir, root / "qv", seed=2, r=4, alpha=8,
                                targets=["q_proj", "v_proj"], use_rslora=True),
    }


@pytest.fixture(scope="module")
def lora_engine(tiny_model_dir: Path) -> LLMEngine:
    return make_lora_engine(tiny_model_dir)
