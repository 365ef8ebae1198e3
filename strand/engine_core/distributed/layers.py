"""Megatron-style sharding of every decoder the engine runs, applied from outside the model.

The model is built from a rank-local config (its share of the heads, of the MLP width and of
every expert's width), so qkv_proj, gate_up_proj and each expert's gate|up stack come out
column-parallel by construction; shard_model() then swaps in the modules that talk to the other
ranks:
  - o_proj, down_proj  -> RowParallelLinear: partial sums, then one all-reduce;
  - a sparse MoE block -> RowParallelMoe: every expert's down projection is row-parallel, the
    router is replicated (all ranks pick the same experts), one all-reduce of the combined
    output (vLLM's FusedMoE with tensor parallelism, no expert parallelism);
  - embed_tokens       -> VocabParallelEmbedding: each rank looks up the rows it holds;
  - lm_head            -> ParallelLMHead: each rank's vocab slice, gathered on rank 0.
KV heads are split across ranks, or replicated when there are fewer of them than ranks (vLLM's
rule), so rank r's query heads always find their KV head on rank r.

Nothing else of a family changes with the ranks: norms (Gemma's (1 + w) included) and Gemma's
embedding scale act on the full hidden state every rank holds after an all-reduce; per-head
q/k norms, sliding windows and attention soft-capping act per head, and a rank holds whole heads;
final-logit soft-capping runs in compute_logits after ParallelLMHead's gather. Phi-3's fused
checkpoint tensors are cut per part by shard_loading.

The fused C++ decode call (models/llama_fused_decode.py) has no all-reduce inside a layer, so sharded
models run the layer-by-layer path (same kernels per op, one call each); fused_decode skips
any model whose o_proj / down_proj is not a plain Linear.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from strand.engine_core.distributed.parallel_state import TPGroup
from strand.engine_core.model_executor.layers.linear import Linear
from strand.engine_core.model_executor.layers.moe import SparseMoeBlock
from strand.engine_core.model_executor.model_config import ModelConfig

# Every family the engine runs: llama.py's decoder (Llama, Mistral, Qwen2, Qwen3 and Qwen3-MoE's
# sparse MLPs), Phi-3 (fused qkv_proj / gate_up_proj tensors, split per part when loaded) and
# Gemma 2/3 (gemma.py: same attention and MLP modules, sharded the same way). A family added to
# the registry is refused here until its modules are sharded.
TP_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                    "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Phi3ForCausalLM",
                    "Gemma2ForCausalLM", "Gemma3ForCausalLM")


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """Which part of every full tensor rank `rank` holds."""

    rank: int
    world_size: int
    num_heads: int  # query heads on this rank
    num_kv_heads: int  # KV heads on this rank (1 when replicated)
    first_kv_head: int  # global index of this rank's first KV head
    total_kv_heads: int  # KV heads of the full model (where k and v start in a fused qkv_proj)
    intermediate_size: int  # dense MLP width on this rank
    moe_intermediate_size: int  # every expert's width on this rank; 0 for a dense model
    head_dim: int
    vocab_size: int  # the full vocabulary
    vocab_per_rank: int  # rows of the embedding / lm_head per rank (the last rank's padded)

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_per_rank

    @property
    def vocab_rows(self) -> int:
        """Real (unpadded) vocabulary rows on this rank."""
        return max(0, min(self.vocab_size - self.vocab_start, self.vocab_per_rank))


def shard_layout(config: ModelConfig, rank: int, world_size: int) -> ShardLayout:
    """ValueError naming the field when the model cannot be split over world_size ranks."""
    n = world_size
    arch = config.arch
    if config.architecture not in TP_ARCHITECTURES:
        raise ValueError(f"tensor_parallel_size > 1 supports {', '.join(TP_ARCHITECTURES)}, "
                         f"got {config.architecture}")
    if config.num_heads % n:
        raise ValueError(f"tensor_parallel_size ({n}) must divide num_attention_heads "
                         f"({config.num_heads})")
    # Qwen3-MoE's dense layers (mlp_only_layers) use intermediate_size, its sparse ones
    # moe_intermediate_size: only the widths some layer uses must divide.
    moe = [arch.is_moe_layer(i) for i in range(config.num_layers)]
    if not all(moe) and config.intermediate_size % n:
        raise ValueError(f"tensor_parallel_size ({n}) must divide intermediate_size "
                         f"({config.intermediate_size})")
    if any(moe) and arch.moe_intermediate_size % n:
        raise ValueError(f"tensor_parallel_size ({n}) must divide moe_intermediate_size "
                         f"({arch.moe_intermediate_size})")
    kv = config.num_kv_heads
    if kv >= n:
        if kv % n:
            raise ValueError(f"tensor_parallel_size ({n}) must divide num_key_value_heads "
                             f"({kv}) when it is not larger than them")
        local_kv, first_kv = kv // n, rank * (kv // n)
    else:
        if n % kv:
            raise ValueError(f"num_key_value_heads ({kv}) must divide tensor_parallel_size "
                             f"({n}) when there are fewer KV heads than ranks")
        local_kv, first_kv = 1, rank // (n // kv)  # each KV head replicated on n / kv ranks
    return ShardLayout(rank=rank, world_size=n, num_heads=config.num_heads // n,
                       num_kv_heads=local_kv, first_kv_head=first_kv, total_kv_heads=kv,
                       intermediate_size=config.intermediate_size // n,
                       moe_intermediate_size=arch.moe_intermediate_size // n,
                       head_dim=config.head_dim, vocab_size=config.vocab_size,
                       vocab_per_rank=-(-config.vocab_size // n))


def local_config(config: ModelConfig, layout: ShardLayout) -> ModelConfig:
    """The config a rank builds its model from: its heads, MLP and expert widths (the vocabulary
    and the number of experts stay full)."""
    arch = dataclasses.replace(config.arch, moe_intermediate_size=layout.moe_intermediate_size)
    return dataclasses.replace(config, num_heads=layout.num_heads,
                               num_kv_heads=layout.num_kv_heads,
                               intermediate_size=layout.intermediate_size, arch=arch)


# (module, (input,), partial output) -> partial output: what a forward hook gets, before the sum.
PartialHook = Callable[[nn.Module, tuple[torch.Tensor], torch.Tensor], torch.Tensor]


class RowParallelLinear(Linear):
    """Input features split across ranks: each computes a partial product, an all-reduce sums
    them. A bias is held by rank 0 only (zeros elsewhere, see shard_loading) so it is added once.
    partial_hook (LoRA's delta, itself a partial sum of this rank's inputs) is added before the
    all-reduce, so one collective sums both."""

    tp: TPGroup
    partial_hook: PartialHook | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, in/N] -> [n, out]
        partial = super().forward(x)
        if self.partial_hook is not None:
            partial = self.partial_hook(self, (x,), partial)
        return self.tp.all_reduce(partial)


class RowParallelMoe(SparseMoeBlock):
    """Every expert holds its slice of the expert width: w13 is column-parallel (gate and up
    rows of this rank), w2 row-parallel. The router is whole on every rank and its input is the
    same bits on every rank (an all-reduce leaves all ranks one result), so each rank runs the
    same experts on the same tokens; the routing-weighted partial outputs summed over experts
    are summed over ranks by one all-reduce (not one per expert)."""

    tp: TPGroup

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, hidden]
        return self.tp.all_reduce(super().forward(x))


class VocabParallelEmbedding(nn.Embedding):
    """Rows [vocab_start, vocab_start + vocab_per_rank) of the table; ids outside give zeros,
    and the all-reduce fills each row from the rank that holds it."""

    tp: TPGroup
    vocab_start: int

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [n] -> [n, hidden]
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_embeddings)
        out = super().forward(local.masked_fill(outside, 0))
        out.masked_fill_(outside.unsqueeze(-1), 0.0)
        return self.tp.all_reduce(out)


class ParallelLMHead(Linear):
    """This rank's vocabulary slice of the logits; rank 0 gathers the slices (the sampler runs
    there only), the other ranks return an empty [n, 0]."""

    tp: TPGroup
    vocab_size: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, vocab] on rank 0
        parts = self.tp.gather_to_driver(super().forward(x))
        if parts is None:
            return x.new_empty(x.shape[0], 0)
        return torch.cat(parts, dim=-1)[:, :self.vocab_size]


def shard_model(model: nn.Module, layout: ShardLayout, tp: TPGroup) -> None:
    """Swap in the communicating modules (on meta, before the weights are allocated)."""
    inner = cast(nn.Module, model.model)
    for layer in cast(nn.ModuleList, inner.layers):
        # Llama's and Gemma's decoder layers name their sublayers alike.
        attn, mlp = cast(nn.Module, layer.self_attn), cast(nn.Module, layer.mlp)
        attn.o_proj = _row_parallel(cast(Linear, attn.o_proj), tp)
        if isinstance(mlp, SparseMoeBlock):
            layer.mlp = _row_parallel_moe(mlp, tp)
        else:
            mlp.down_proj = _row_parallel(cast(Linear, mlp.down_proj), tp)
    old = cast(nn.Embedding, inner.embed_tokens)
    embed = VocabParallelEmbedding(layout.vocab_per_rank, old.embedding_dim,
                                   device=old.weight.device)
    embed.tp, embed.vocab_start = tp, layout.vocab_start
    inner.embed_tokens = embed
    if cast(ModelConfig, model.config).labels:
        return  # a classifier's score layer (a few rows) stays whole on every rank
    head = ParallelLMHead(old.embedding_dim, layout.vocab_per_rank, bias=False,
                          device=old.weight.device)
    head.tp, head.vocab_size = tp, layout.vocab_size
    model.lm_head = head


def _row_parallel(linear: Linear, tp: TPGroup) -> RowParallelLinear:
    out = RowParallelLinear(linear.in_features, linear.out_features,
                            bias=linear.bias is not None, device=linear.weight.device)
    out.tp = tp
    return out


def _row_parallel_moe(moe: SparseMoeBlock, tp: TPGroup) -> RowParallelMoe:
    num_experts, hidden, inter = moe.w2.shape  # inter: this rank's slice (the local config's)
    out = RowParallelMoe(hidden, inter, num_experts, moe.top_k, moe.norm_topk_prob, moe.act)
    out.tp = tp
    return out
