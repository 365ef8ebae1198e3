"""HF architecture name -> model class."""

from __future__ import annotations

from torch import nn

from strand.engine_core.model_executor.model_config import SUPPORTED_ARCHITECTURES, ModelConfig
from strand.engine_core.model_executor.models.gemma import GemmaForCausalLM
from strand.engine_core.model_executor.models.llama import LlamaForCausalLM
from strand.engine_core.model_executor.models.phi3 import Phi3ForCausalLM
from strand.engine_core.model_executor.models.qwen3 import (
    Qwen3ForCausalLM,
    SlidingWindowLlamaForCausalLM,
)

_MODELS: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    # Qwen3 is Llama with per-head q/k norms; Qwen3-MoE adds sparse MLPs (config.arch).
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3ForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "Gemma2ForCausalLM": GemmaForCausalLM,
    "Gemma3ForCausalLM": GemmaForCausalLM,
}


def model_class(config: ModelConfig) -> type[LlamaForCausalLM]:
    """Every class has LlamaForCausalLM's interface (forward, compute_logits, tie_weights,
    weight_destinations, .model.embed_tokens), which is the type callers see."""
    if config.architecture not in _MODELS:
        raise ValueError(f"unsupported architecture {config.architecture!r}; supported: "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    cls = _MODELS[config.architecture]
    if cls is LlamaForCausalLM and config.arch.layer_windows:
        return SlidingWindowLlamaForCausalLM
    return cls  # type: ignore[return-value]
