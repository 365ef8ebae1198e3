"""The Llama-family decoder (Llama, Mistral, Qwen2; Qwen3, Qwen3-MoE and Phi-3 subclass it),
over a flattened batch and a paged KV cache.

Module names follow the HF checkpoint (model.layers.N.self_attn...), except that q/k/v and
gate/up are fused into one matmul each; weight_destinations() maps every HF tensor name to the
slice of the parameter it fills.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from strand.engine_core.model_executor.attention.backend import AttentionBackend, AttentionMetadata
from strand.engine_core.model_executor.layers.activation import act_and_mul
from strand.engine_core.model_executor.layers.embedding import embedding_table
from strand.engine_core.model_executor.layers.gemma_norm import GemmaRMSNorm
from strand.engine_core.model_executor.layers.linear import Linear
from strand.engine_core.model_executor.layers.moe import SparseMoeBlock
from strand.engine_core.model_executor.layers.rms_norm import RMSNorm
from strand.engine_core.model_executor.layers.rotary_embedding import RotaryEmbedding
from strand.engine_core.model_executor.model_config import ModelConfig
from strand.engine_core.model_executor.models import llama_fused_decode as fused_decode


def head_name(config: ModelConfig) -> str:
    """The checkpoint's name for the head: a classifier's is `score`."""
    return "score.weight" if config.labels else "lm_head.weight"


def fewer_rows(rows: torch.Tensor | None, input_ids: torch.Tensor) -> bool:
    """Whether `rows` selects fewer rows than the step has (a prefill's last rows, say)."""
    return rows is not None and rows.shape[0] < input_ids.shape[0]


class LlamaAttention(nn.Module):
    """Also Qwen3's and Gemma's: per-head q/k norms, the window and the softcap of `layer_idx`,
    Gemma's query_pre_attn_scalar all come from config.arch."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, layer_idx: int = 0) -> None:
        super().__init__()
        arch = config.arch
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.scale = (arch.query_pre_attn_scalar or config.head_dim) ** -0.5
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=config.qkv_bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=config.o_proj_bias)
        self.rotary = rotary
        # Only the keywords a layer needs reach the backend (a plain layer passes none).
        self.attn_kwargs: dict[str, Any] = {}
        if arch.window_of(layer_idx) is not None:
            self.attn_kwargs["sliding_window"] = arch.window_of(layer_idx)
        if arch.attn_logit_softcap is not None:
            self.attn_kwargs["logit_softcap"] = arch.attn_logit_softcap
        self.q_norm: nn.Module | None = None
        self.k_norm: nn.Module | None = None
        if arch.qk_norm:
            norm_cls = GemmaRMSNorm if config.architecture.startswith("Gemma") else RMSNorm
            self.q_norm = norm_cls(config.head_dim, config.rms_norm_eps)
            self.k_norm = norm_cls(config.head_dim, config.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,  # [num_tokens]
        hidden: torch.Tensor,  # [num_tokens, hidden]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        metadata: AttentionMetadata,
        backend: AttentionBackend,
        rows: torch.Tensor | None = None,  # [n] int64: the only output rows needed, or all
    ) -> torch.Tensor:  # [num_tokens or n, hidden]
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            # Each head normed on its own (Qwen3, Gemma 3), before RoPE.
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(num_tokens, self.num_heads, -1)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(num_tokens, self.num_kv_heads, -1)
        q, k = self.rotary(positions, q, k)
        out = backend.forward(q, k, v, kv_cache, metadata, self.scale, **self.attn_kwargs)
        out = out.reshape(num_tokens, self.q_size)
        # K/V were written for every token above; the projection runs for the rows needed.
        return self.o_proj(out if rows is None else out[rows])


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.act = config.arch.hidden_act
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, hidden]
        return self.down_proj(act_and_mul(self.gate_up_proj(x), self.act))


def make_mlp(config: ModelConfig, layer_idx: int) -> nn.Module:
    arch = config.arch
    if arch.is_moe_layer(layer_idx):
        return SparseMoeBlock(config.hidden_size, arch.moe_intermediate_size, arch.num_experts,
                              arch.num_experts_per_tok, arch.norm_topk_prob, arch.hidden_act)
    return LlamaMLP(config)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, layer_idx: int = 0) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, rotary, layer_idx)
        self.mlp = make_mlp(config, layer_idx)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,  # [num_tokens]
        hidden: torch.Tensor,  # [num_tokens, hidden]: the previous layer's MLP output
        residual: torch.Tensor | None,  # [num_tokens, hidden]; None at the first layer
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        backend: AttentionBackend,
        rows: torch.Tensor | None = None,  # [n] int64: the only output rows needed, or all
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (MLP output, residual stream before it)
        # HF's `hidden = hidden + sublayer(norm(hidden))`, with each add fused into the norm
        # after it (vLLM's form): the same sums, one pass fewer over the activations.
        # The adds' inputs are dropped after them: the kernels may store into them (in_place).
        if residual is None:
            residual, normed = hidden, self.input_layernorm(hidden)
        else:
            normed, residual = self.input_layernorm(hidden, residual, in_place=True)
        attn = self.self_attn(positions, normed, kv_cache, metadata, backend, rows)
        if rows is not None:
            residual = residual[rows]
        normed, residual = self.post_attention_layernorm(attn, residual, in_place=True)
        return self.mlp(normed), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = embedding_table(config.vocab_size, config.hidden_size)
        # One table shared by every layer.
        self.rotary = RotaryEmbedding(config.head_dim, config.max_position_embeddings,
                                      config.rope_theta, config.rope_scaling)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, self.rotary, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Also MistralForCausalLM and Qwen2ForCausalLM: same graph, differing only in config.
    Qwen3 (q/k norms) and Qwen3-MoE (SparseMoeBlock MLPs) too: config.arch switches them on,
    and weight_destinations names their tensors."""

    # Set per step by the LoRA manager: some token of this step runs through an adapter.
    lora_active: bool = False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        # A sequence classifier's `score` layer takes the head's place (seq_cls.py).
        self.lm_head = Linear(config.hidden_size, config.head_size, bias=False)

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
        """With `rows`, the output's rows at those indices alone. The last layer then runs its
        attention's projection and its MLP for those rows only (llama.cpp's skip of unused
        outputs): a prompt's other rows feed nothing but that layer's K/V, already written."""
        if self._fused_step(input_ids, kv_caches, metadata, backend):
            # A decode step of a few requests: each layer as one C++ call (same kernels).
            hidden = fused_decode.forward(self, input_ids, positions, kv_caches, metadata)
            return hidden if rows is None else hidden[rows]
        # LoRA maps adapters to the step's tokens, every row: there all rows run.
        last_rows = rows if fewer_rows(rows, input_ids) and not self.lora_active else None
        hidden = self.model.embed_tokens(input_ids)
        residual = None
        last = len(self.model.layers) - 1
        for i, (layer, kv_cache) in enumerate(zip(self.model.layers, kv_caches, strict=True)):
            hidden, residual = layer(positions, hidden, residual, kv_cache, metadata, backend,
                                     last_rows if i == last else None)
        out = (self.model.norm(hidden) if residual is None
               else self.model.norm(hidden, residual, in_place=True)[0])
        return out if rows is None or last_rows is not None else out[rows]

    def _fused_step(self, input_ids: torch.Tensor, kv_caches: list[torch.Tensor],
                    metadata: AttentionMetadata, backend: AttentionBackend) -> bool:
        """Whether this step goes through the C++ decode stack (plain Llama, no LoRA: the
        subclasses and the adapters change the layers the stack would run)."""
        return (type(self) is LlamaForCausalLM and not self.lora_active
                and fused_decode.applies(self, input_ids, kv_caches, metadata, backend))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, vocab]
        return self.lm_head(hidden)

    def decode_logits(
        self,
        input_ids: torch.Tensor,  # [num_tokens] int64
        positions: torch.Tensor,  # [num_tokens] int64
        kv_caches: list[torch.Tensor],  # one per layer
        metadata: AttentionMetadata,
        backend: AttentionBackend,
        rows: torch.Tensor | None = None,  # [n] int64: the rows whose logits are computed
    ) -> torch.Tensor | None:  # [n, vocab], or None: use forward and compute_logits
        """compute_logits(forward(...)) of a decode step of a few requests as one C++ call
        (the layers, the final norm and the lm_head), where the fused step applies and holds
        the head; None where it does not."""
        if not (self._fused_step(input_ids, kv_caches, metadata, backend)
                and fused_decode.has_head(self)):
            return None
        logits = fused_decode.logits(self, input_ids, positions, kv_caches, metadata)
        return logits if rows is None else logits[rows]

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
            layer = cast(LlamaDecoderLayer, module)
            p = f"model.layers.{i}."
            attn, mlp = layer.self_attn, layer.mlp
            w = attn.qkv_proj.weight.data
            for name, start, size in (("q", 0, q), ("k", q, kv), ("v", q + kv, kv)):
                dest[f"{p}self_attn.{name}_proj.weight"] = w.narrow(0, start, size)
                if c.qkv_bias:
                    dest[f"{p}self_attn.{name}_proj.bias"] = attn.qkv_proj.bias.data.narrow(
                        0, start, size)
            dest[f"{p}self_attn.o_proj.weight"] = attn.o_proj.weight.data
            if c.o_proj_bias:
                dest[f"{p}self_attn.o_proj.bias"] = attn.o_proj.bias.data
            if attn.q_norm is not None and attn.k_norm is not None:
                dest[f"{p}self_attn.q_norm.weight"] = cast(Any, attn.q_norm).weight.data
                dest[f"{p}self_attn.k_norm.weight"] = cast(Any, attn.k_norm).weight.data
            if isinstance(mlp, SparseMoeBlock):
                dest.update(moe_destinations(mlp, f"{p}mlp."))
            else:
                gate_up = cast(LlamaMLP, mlp).gate_up_proj.weight.data
                dest[f"{p}mlp.gate_proj.weight"] = gate_up.narrow(0, 0, inter)
                dest[f"{p}mlp.up_proj.weight"] = gate_up.narrow(0, inter, inter)
                dest[f"{p}mlp.down_proj.weight"] = cast(LlamaMLP, mlp).down_proj.weight.data
            dest[f"{p}input_layernorm.weight"] = layer.input_layernorm.weight.data
            dest[f"{p}post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight.data
        return dest


def moe_destinations(moe: SparseMoeBlock, prefix: str) -> dict[str, torch.Tensor]:
    """HF's per-expert names (mlp.experts.E.{gate,up,down}_proj) -> slices of the stacks."""
    inter = moe.w2.shape[2]
    dest = {f"{prefix}gate.weight": moe.gate.weight.data}
    for e in range(moe.num_experts):
        w13 = moe.w13.data[e]
        dest[f"{prefix}experts.{e}.gate_proj.weight"] = w13.narrow(0, 0, inter)
        dest[f"{prefix}experts.{e}.up_proj.weight"] = w13.narrow(0, inter, inter)
        dest[f"{prefix}experts.{e}.down_proj.weight"] = moe.w2.data[e]
    return dest
