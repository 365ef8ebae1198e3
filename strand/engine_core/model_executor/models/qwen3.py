"""Qwen3 and Qwen3-MoE: the Llama graph with per-head q/k RMSNorms before RoPE, no qkv bias,
and (MoE) sparse MLPs on the layers the config names; config.arch switches both on in the
shared modules of llama.py. Also Mistral/Llama configs with a sliding window.

Their own class, not LlamaForCausalLM itself: the fused C++ decode path (models/llama_fused_decode.py)
runs only plain Llama layers and is chosen for that exact class.
"""

from __future__ import annotations

from strand.engine_core.model_executor.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Also Qwen3MoeForCausalLM (SparseMoeBlock MLPs, loaded from per-expert tensors)."""


class SlidingWindowLlamaForCausalLM(LlamaForCausalLM):
    """Mistral (v0.1) and other Llama-shaped configs whose sliding_window is set."""
