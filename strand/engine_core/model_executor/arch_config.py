"""ArchOptions: the config.json fields of the families past Llama (Qwen3, Qwen3-MoE, Phi-3,
Gemma 2/3), read and validated once so the models only read typed attributes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

SLIDING = "sliding_attention"
FULL = "full_attention"
GEMMA_ARCHITECTURES = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


@dataclass(slots=True)
class ArchOptions:
    qk_norm: bool = False  # Qwen3 / Gemma 3: RMSNorm over each head of q and k before RoPE
    hidden_act: str = "silu"  # or "gelu_pytorch_tanh" (Gemma)
    # Per layer: the sliding window in tokens (the query included), None = full attention.
    # Empty: every layer full.
    layer_windows: tuple[int | None, ...] = ()
    attn_logit_softcap: float | None = None  # Gemma 2: cap * tanh(scores / cap)
    final_logit_softcap: float | None = None  # Gemma 2: the same on the LM head's logits
    # Gemma: attention scale is query_pre_attn_scalar ** -0.5 instead of head_dim ** -0.5.
    query_pre_attn_scalar: float | None = None
    # Gemma 3: RoPE base (plain, unscaled) of the sliding layers; global layers keep rope_theta.
    local_rope_theta: float | None = None
    # Mixture of experts (Qwen3-MoE); num_experts 0 = dense MLP everywhere.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    moe_layers: tuple[bool, ...] = field(default_factory=tuple)  # per layer: MoE or dense

    def window_of(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None

    def is_moe_layer(self, layer: int) -> bool:
        return bool(self.moe_layers) and self.moe_layers[layer]


def parse_arch_options(raw: dict[str, Any], architecture: str, num_layers: int) -> ArchOptions:
    """ValueError naming the field for what the engine cannot run."""
    opts = ArchOptions()
    act = raw.get("hidden_activation") or raw.get("hidden_act") or "silu"
    if architecture in GEMMA_ARCHITECTURES:
        act = raw.get("hidden_activation") or "gelu_pytorch_tanh"
    if act not in _ACTIVATIONS:
        raise ValueError(f"hidden_act must be one of {', '.join(_ACTIVATIONS)}, got {act!r}")
    opts.hidden_act = act
    opts.qk_norm = architecture in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
                                    "Gemma3ForCausalLM")
    if architecture in ("MistralForCausalLM", "Phi3ForCausalLM"):
        # One window on every layer (Mistral 7B v0.1, Phi-3-mini), when the config sets one.
        window = _window(raw)
        if window is not None:
            opts.layer_windows = (window,) * num_layers
    rope_params = raw.get("rope_parameters") or {}
    partial = raw.get("partial_rotary_factor", rope_params.get("partial_rotary_factor", 1.0))
    if float(partial) != 1.0:
        raise ValueError(f"partial_rotary_factor must be 1.0, got {partial!r}")
    if architecture in GEMMA_ARCHITECTURES:
        _parse_gemma(raw, architecture, num_layers, opts)
    if architecture == "Qwen3MoeForCausalLM":
        _parse_moe(raw, num_layers, opts)
    return opts


def _window(raw: dict[str, Any]) -> int | None:
    window = raw.get("sliding_window")
    if window is None:
        return None
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"config.json sliding_window must be a positive integer, got {window!r}")
    return window


def _parse_gemma(raw: dict[str, Any], architecture: str, num_layers: int,
                 opts: ArchOptions) -> None:
    window = _window(raw)
    layer_types = raw.get("layer_types")
    if layer_types is None:
        # transformers' defaults: Gemma 2 alternates (sliding first), Gemma 3 has one global
        # layer every sliding_window_pattern (6).
        pattern = 2 if architecture == "Gemma2ForCausalLM" else int(
            raw.get("sliding_window_pattern", 6))
        layer_types = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
    if len(layer_types) != num_layers or any(t not in (SLIDING, FULL) for t in layer_types):
        raise ValueError(f"config.json layer_types must list {num_layers} entries of "
                         f"{SLIDING!r} or {FULL!r}, got {layer_types!r}")
    if window is not None:
        opts.layer_windows = tuple(window if t == SLIDING else None for t in layer_types)
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = raw.get(key)
        if value is not None and float(value) <= 0:
            raise ValueError(f"config.json {key} must be > 0 or null, got {value!r}")
    attn_cap, final_cap = raw.get("attn_logit_softcapping"), raw.get("final_logit_softcapping")
    opts.attn_logit_softcap = None if attn_cap is None else float(attn_cap)
    opts.final_logit_softcap = None if final_cap is None else float(final_cap)
    opts.query_pre_attn_scalar = float(raw.get("query_pre_attn_scalar", 256))
    if opts.query_pre_attn_scalar <= 0:
        raise ValueError(f"config.json query_pre_attn_scalar must be > 0, "
                         f"got {opts.query_pre_attn_scalar}")
    if architecture == "Gemma3ForCausalLM":
        params = raw.get("rope_parameters") or {}
        local = params.get(SLIDING) if isinstance(params, dict) else None
        theta = (local or {}).get("rope_theta") or raw.get("rope_local_base_freq") or 10000.0
        opts.local_rope_theta = float(theta)


def _parse_moe(raw: dict[str, Any], num_layers: int, opts: ArchOptions) -> None:
    for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
        value = raw.get(key)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"config.json {key} must be a positive integer, got {value!r}")
    opts.num_experts = raw["num_experts"]
    opts.num_experts_per_tok = raw["num_experts_per_tok"]
    if opts.num_experts_per_tok > opts.num_experts:
        raise ValueError(f"config.json num_experts_per_tok must be <= num_experts "
                         f"({opts.num_experts}), got {opts.num_experts_per_tok}")
    opts.moe_intermediate_size = raw["moe_intermediate_size"]
    opts.norm_topk_prob = bool(raw.get("norm_topk_prob", False))
    step = int(raw.get("decoder_sparse_step", 1))
    if step < 1:
        raise ValueError(f"config.json decoder_sparse_step must be >= 1, got {step}")
    dense = set(raw.get("mlp_only_layers") or [])
    # transformers: layer i is sparse when not in mlp_only_layers and (i + 1) % step == 0.
    opts.moe_layers = tuple(i not in dense and (i + 1) % step == 0 for i in range(num_layers))


def longrope_scaling(raw: dict[str, Any], scaling: dict[str, Any]) -> dict[str, Any]:
    """Phi-3's LongRoPE ("su"/"longrope"): per-frequency short and long factors and an
    attention factor on cos/sin. Returned with every default resolved, as the rotary reads it."""
    head_dim = int(raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"])
    orig = scaling.get("original_max_position_embeddings") or raw.get(
        "original_max_position_embeddings")
    if not isinstance(orig, int) or orig < 1:
        raise ValueError("rope_scaling.original_max_position_embeddings must be a positive "
                         f"integer for rope_type 'longrope', got {orig!r}")
    for key in ("short_factor", "long_factor"):
        factors = scaling.get(key)
        if not isinstance(factors, list) or len(factors) != head_dim // 2:
            raise ValueError(f"rope_scaling.{key} must list head_dim // 2 = {head_dim // 2} "
                             f"numbers, got {factors!r}")
    factor = float(scaling.get("factor") or raw.get("max_position_embeddings", orig) / orig)
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        # The LongRoPE paper's default, as transformers computes it.
        attention_factor = (1.0 if factor <= 1.0
                            else math.sqrt(1 + math.log(factor) / math.log(orig)))
    return {"rope_type": "longrope", "short_factor": [float(f) for f in scaling["short_factor"]],
            "long_factor": [float(f) for f in scaling["long_factor"]],
            "original_max_position_embeddings": orig, "attention_factor": float(attention_factor)}
