"""HF architecture name -> model class."""

from __future__ import annotations

from engine_core.model_executor.model_config import SUPPORTED_ARCHITECTURES, ModelConfig
from engine_core.model_executor.models.llama import LlamaForCausalLM

_MODELS: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
}


def model_class(config: ModelConfig) -> type[LlamaForCausalLM]:
    if config.architecture not in _MODELS:
        raise ValueError(f"unsupported architecture {config.architecture!r}; supported: "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    return _MODELS[config.architecture]

