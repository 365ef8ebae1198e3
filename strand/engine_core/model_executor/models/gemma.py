"""Gemma 2 and Gemma 3 (text): the Llama attention and gated MLP inside Gemma's block.

What differs from Llama, all HF-exact in float32: (1 + w) RMSNorms in float32 (GemmaRMSNorm),
the embedding scaled by sqrt(hidden), gelu-tanh MLP, a norm after attention and one before and
after the MLP (four per layer), attention scaled by query_pre_attn_scalar, sliding-window layers
interleaved with global ones, attention-logit soft-capping (Gemma 2), final-logit soft-capping.
Gemma 3 adds per-head q/k norms and its own RoPE base on the sliding layers.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from strand.engine_core.model_executor.attention.backend import AttentionBackend, AttentionMetadata
from strand.engine_core.model_executor.layers.embedding import embedding_table
from strand.engine_core.model_executor.layers.gemma_norm import GemmaRMSNorm
from strand.engine_core.model_executor.layers.linear import Linear
from strand.engine_core.model_executor.layers.rotary_embedding import RotaryEmbedding
from strand.engine_core.model_executor.model_config import ModelConfig
from strand.engine_core.model_executor.models.llama import (
    LlamaAttention,
    LlamaMLP,
    fewer_rows,
    head_name,
)

_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
          "post_feedforward_layernorm")


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, rotary, layer_idx)
        self.mlp = LlamaMLP(config)
        eps = config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)

    def forward(
        self,
        positions: torch.Tensor,  # [num_tokens]
        hidden: torch.Tensor,  # [num_tokens, hidden]: the residual stream
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        backend: AttentionBackend,
        rows: torch.Tensor | None = None,  # [n] int64: the only output rows needed, or all
    ) -> torch.Tensor:  # [num_tokens or n, hidden]
        attn = self.self_attn(positions, self.input_layernorm(hidden), kv_cache, metadata,
                              backend, rows)
        if rows is not None:
            hidden = hidden[rows]
        hidden = hidden + self.post_attention_layernorm(attn)
        mlp = self.mlp(self.pre_feedforward_layernorm(hidden))
        return hidden + self.post_feedforward_layernorm(mlp)


class GemmaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        arch = config.arch
        self.embed_tokens = embedding_table(config.vocab_size, config.hidden_size)
        # Global layers' RoPE (with the config's scaling); Gemma 3's sliding layers get a plain
        # one of their own base. The loader builds every RotaryEmbedding's table.
        self.rotary = RotaryEmbedding(config.head_dim, config.max_position_embeddings,
                                      config.rope_theta, config.rope_scaling)
        self.rotary_local = self.rotary
        if arch.local_rope_theta is not None:
            self.rotary_local = RotaryEmbedding(config.head_dim, config.max_position_embeddings,
                                                arch.local_rope_theta, None)
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(config, self.rotary_local if arch.window_of(i) else self.rotary, i)
            for i in range(config.num_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)


class GemmaForCausalLM(nn.Module):
    """Gemma2ForCausalLM and Gemma3ForCausalLM (text only)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = GemmaModel(config)
        self.lm_head = Linear(config.hidden_size, config.head_size, bias=False)  # or `score`
        self.embed_scale = config.hidden_size**0.5

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens] int64
        positions: torch.Tensor,  # [num_tokens] int64
        kv_caches: list[torch.Tensor],  # one per layer
        metadata: AttentionMetadata,
        backend: AttentionBackend,
        rows: torch.Tensor | None = None,  # [n] int64: the rows whose logits are computed
    ) -> torch.Tensor:  # [num_tokens, hidden] (or [n, hidden]) after the final norm
        """With `rows`, those rows alone; the last layer runs past attention for them only
        (as LlamaForCausalLM.forward)."""
        last_rows = rows if fewer_rows(rows, input_ids) else None
        hidden = self.model.embed_tokens(input_ids)
        # HF rounds the scale to the activation dtype first (sqrt(hidden) in bf16 is not exact).
        hidden = hidden * torch.tensor(self.embed_scale, dtype=hidden.dtype)
        last = len(self.model.layers) - 1
        for i, (layer, kv_cache) in enumerate(zip(self.model.layers, kv_caches, strict=True)):
            hidden = layer(positions, hidden, kv_cache, metadata, backend,
                           last_rows if i == last else None)
        out = cast(torch.Tensor, self.model.norm(hidden))
        return out if rows is None or last_rows is not None else out[rows]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, vocab]
        logits = self.lm_head(hidden)
        cap = self.config.arch.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def weight_destinations(self) -> dict[str, torch.Tensor]:
        """HF tensor name -> the (view of the) parameter it is copied into."""
        c = self.config
        q, kv, inter = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
        dest: dict[str, torch.Tensor] = {"model.embed_tokens.weight":
                                         self.model.embed_tokens.weight.data,
                                         "model.norm.weight": self.model.norm.weight.data}
        if not c.tie_word_embeddings:
            dest[head_name(c)] = self.lm_head.weight.data
        for i, module in enumerate(self.model.layers):
            layer = cast(GemmaDecoderLayer, module)
            p = f"model.layers.{i}."
            attn, mlp = layer.self_attn, layer.mlp
            w = attn.qkv_proj.weight.data
            for name, start, size in (("q", 0, q), ("k", q, kv), ("v", q + kv, kv)):
                dest[f"{p}self_attn.{name}_proj.weight"] = w.narrow(0, start, size)
            dest[f"{p}self_attn.o_proj.weight"] = attn.o_proj.weight.data
            if attn.q_norm is not None and attn.k_norm is not None:
                dest[f"{p}self_attn.q_norm.weight"] = cast(GemmaRMSNorm, attn.q_norm).weight.data
                dest[f"{p}self_attn.k_norm.weight"] = cast(GemmaRMSNorm, attn.k_norm).weight.data
            gate_up = mlp.gate_up_proj.weight.data
            dest[f"{p}mlp.gate_proj.weight"] = gate_up.narrow(0, 0, inter)
            dest[f"{p}mlp.up_proj.weight"] = gate_up.narrow(0, inter, inter)
            dest[f"{p}mlp.down_proj.weight"] = mlp.down_proj.weight.data
            for norm in _NORMS:
                dest[f"{p}{norm}.weight"] = cast(GemmaRMSNorm, getattr(layer, norm)).weight.data
        return dest
