"""Phi-3: the Llama graph (with Mistral's sliding window when the config sets one), whose
checkpoint already stores q/k/v and gate/up fused: qkv_proj and gate_up_proj load whole."""

from __future__ import annotations

from typing import cast

import torch

from strand.engine_core.model_executor.models.llama import (
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
)


class Phi3ForCausalLM(LlamaForCausalLM):
    def weight_destinations(self) -> dict[str, torch.Tensor]:
        dest = super().weight_destinations()
        for i, module in enumerate(self.model.layers):
            layer = cast(LlamaDecoderLayer, module)
            p = f"model.layers.{i}."
            for name in ("q", "k", "v"):
                del dest[f"{p}self_attn.{name}_proj.weight"]
            for name in ("gate", "up"):
                del dest[f"{p}mlp.{name}_proj.weight"]
            dest[f"{p}self_attn.qkv_proj.weight"] = layer.self_attn.qkv_proj.weight.data
            dest[f"{p}mlp.gate_up_proj.weight"] = cast(LlamaMLP, layer.mlp).gate_up_proj.weight.data
        return dest
