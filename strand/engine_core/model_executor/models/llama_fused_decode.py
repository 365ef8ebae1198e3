"""A decode step of a few requests on CPU through every Llama-family layer as one C++ call.

At batch size 1 a decode step reads every weight once, and for a small model the layers'
Python-level calls (~330 for SmolLM2's 30 layers: module dispatch, the kernel wrappers' checks,
tensor bookkeeping) cost nearly as much again as that read. strand/kernels/csrc/decode_layer.cpp runs the
layers' kernels (the same ones, in the same order, on the same data) from C++: the weights are
handed to a DecodeStack once per model, and a step is one call. This module decides when that
applies and does, once per step, the checks the wrappers would do once per call. The outputs are
the layer-by-layer path's, bit for bit (tests/engine_core/model_executor/test_fused_decode.py).

Where the embedding is a plain table and the final norm and lm_head take the same kernels (a
packed GGUF lm_head, or a dense one on the few-row kernel), they are handed over too, and
`logits` goes from the step's token ids to its logits in one call that also checks the step's
indices: the Python between the C++ step and the sampler (index casts and checks, embedding,
the final norm's and the lm_head's wrappers) was several percent of a one-thread step of
SmolLM2's packed Q4_1, ~10x its cost in a tight loop (strand/kernels/csrc/decode_ends.cpp says why),
and at two threads the lm_head was a parallel region of its own after the step's one.

Decode batches of SMALL_M < m <= BATCH_M requests of a model whose projections are all GGUF
tiles take it too (their int8 kernel takes any rows), and those of a model whose projections
are all dense, with the kernel the layer-by-layer path runs for those rows: the layers' packed
weights (float32 panels at the avx2 and avx512 levels, for bfloat16 layers too where oneDNN has
no bfloat16 kernels; oneDNN's copies otherwise: strand/kernels/cpu_linear.py), handed to the stack once
(set_batch_weights), or linear_batch where the panels are switched off at the avx2 level
(strand/kernels/cpu_linear_batch.py). Even at 32 requests of SmolLM2 the layers' Python calls
were several percent of a one-thread step.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from strand.engine_core.model_executor.attention.backend import AttentionBackend, AttentionMetadata
from strand.engine_core.model_executor.attention.torch_ref import (
    TorchAttentionBackend,
    check_block_table,
)
from strand.engine_core.model_executor.layers.embedding import PanelEmbedding
from strand.engine_core.model_executor.layers.gguf_embedding import GGUFEmbedding
from strand.engine_core.model_executor.layers.gguf_linear import GGUFLinear
from strand.engine_core.model_executor.layers.linear import Linear
from strand.engine_core.model_executor.layers.rms_norm import RMSNorm
from strand.kernels import (
    cpu_decode_attention,
    cpu_linear_batch,
    cpu_linear_panels,
    cpu_linear_panels_bf16,
)
from strand.kernels._cpu_build import KERNELS
from strand.kernels.cpu_linear import SMALL_M

if TYPE_CHECKING:
    from strand.engine_core.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM

_DTYPES = (torch.float32, torch.bfloat16)


@dataclass(slots=True)
class _Fused:
    stack: Any  # the C++ DecodeStack holding every layer
    has_head: bool  # it holds the embedding, the final norm and the lm_head too: logits()
    # The kv cache list last checked (the runner's, replaced whole when reallocated) and whether
    # every cache fits the stack: checked once, not 30 tensors' attributes a step.
    checked_caches: list[torch.Tensor] | None = None
    caches_fit: bool = False


# model -> its layers in C++ (None: some layer cannot take the fused call), made once.
_STACKS: weakref.WeakKeyDictionary[nn.Module, _Fused | None] = weakref.WeakKeyDictionary()
# model -> whether its stack takes decode batches past SMALL_M rows: every projection (the
# head's too) dense, and linear_batch chosen or the packed weights handed over; or every one
# GGUF tiles (the GGUF kernel over rows takes up to SMALL_M rows).
_BATCH: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def applies(model: LlamaForCausalLM, input_ids: torch.Tensor, kv_caches: list[torch.Tensor],
            metadata: AttentionMetadata, backend: AttentionBackend) -> bool:
    """A pure decode step of 1..SMALL_M requests (or up to BATCH_M of a stack that takes
    batches), on CPU, with every layer on the C++ kernels."""
    m = input_ids.shape[0]
    batch = SMALL_M < m <= cpu_linear_batch.BATCH_M
    if not ((0 < m <= SMALL_M or batch) and metadata.max_query_len == 1
            and metadata.num_reqs == m and metadata.num_actual_tokens == m
            and input_ids.device.type == "cpu"):
        return False
    if not (isinstance(backend, TorchAttentionBackend) and backend.use_cpu_kernel):
        return False
    return _stack(model, kv_caches) is not None and (not batch or _BATCH.get(model, False))


def has_head(model: LlamaForCausalLM) -> bool:
    """After applies(): the stack computes the logits too (`logits`)."""
    fused = _STACKS.get(model)
    return fused is not None and fused.has_head


def _stack(model: LlamaForCausalLM, kv_caches: list[torch.Tensor]) -> _Fused | None:
    """The model's DecodeStack, made once per model; None where a layer cannot go through the
    fused call."""
    module = KERNELS.module()
    if module is None:
        return None
    if model not in _STACKS:
        _STACKS[model] = _build(model, module)
    fused = _STACKS[model]
    if fused is None:
        return None
    if fused.checked_caches is not kv_caches:
        dtype = model.model.norm.weight.dtype
        # The model's dtype, or a bfloat16 cache under float32 weights (kv_cache_dtype).
        fused.caches_fit = all(cpu_decode_attention.takes(dtype, c.dtype) and c.is_contiguous()
                               and c.device.type == "cpu" for c in kv_caches)
        fused.checked_caches = kv_caches
    return fused if fused.caches_fit else None


def _build(model: LlamaForCausalLM, module: Any) -> _Fused | None:
    dtype = model.model.norm.weight.dtype
    rotary = model.model.rotary
    cos_sin = rotary.cos_sin
    if (dtype not in _DTYPES or cos_sin.dtype != torch.float32 or cos_sin.dim() != 2
            or cos_sin.shape[1] % 2 or cos_sin.shape[1] > model.config.head_dim):
        return None
    layers: list[tuple[object, ...]] = []
    # Per layer: (projection, tiles, GGML type) of each part after a projection's first.
    more: list[list[tuple[int, torch.Tensor, int]]] = []
    linears: list[object] = []  # every layer's four projections, in the stack's order
    sizes: set[tuple[int, int, int, float, float]] = set()
    for decoder_layer in model.model.layers:
        layer = cast("LlamaDecoderLayer", decoder_layer)
        attn, mlp = layer.self_attn, layer.mlp
        four = (attn.qkv_proj, attn.o_proj, getattr(mlp, "gate_up_proj", None),
                getattr(mlp, "down_proj", None))
        linears += four
        projections = [_projection(lin, dtype) for lin in four]
        norm1, norm2 = cast(RMSNorm, layer.input_layernorm), cast(RMSNorm,
                                                                 layer.post_attention_layernorm)
        if any(p is None for p in projections):
            return None
        if (type(attn.o_proj) not in (Linear, GGUFLinear)
                or type(getattr(mlp, "down_proj", None)) not in (Linear, GGUFLinear)):
            return None  # tensor-parallel layers: their all-reduce is not in the C++ call
        (qkv_w, qkv_b, qkv_q), (o_w, o_b, o_q), (gate_up_w, gate_up_b, gate_up_q), (
            down_w, down_b, down_q) = cast(list[tuple[torch.Tensor, torch.Tensor | None, int]],
                                           projections)
        if gate_up_b is not None or down_b is not None:
            return None
        if any(n.weight.dtype != dtype or n.weight.dim() != 1 for n in (norm1, norm2)):
            return None
        if norm1.eps != norm2.eps:
            return None  # the C++ takes one eps per layer (HF Llama's norms share it)
        sizes.add((attn.num_heads, attn.num_kv_heads, attn.head_dim, float(norm1.eps),
                   float(attn.scale)))
        layers.append((norm1.weight.contiguous(), qkv_w, qkv_b, o_w, o_b,
                       norm2.weight.contiguous(), gate_up_w, down_w,
                       [qkv_q, o_q, gate_up_q, down_q]))
        more.append([(i, w, q) for i, lin in enumerate(four) if isinstance(lin, GGUFLinear)
                     for w, q in lin.parts()[1:]])
    if len(sizes) != 1:
        return None  # the stack's buffers take one set of sizes for every layer
    heads, kv_heads, head_dim, eps, scale = sizes.pop()
    stack = module.DecodeStack(cos_sin, heads, kv_heads, head_dim, eps, scale)
    for args, parts in zip(layers, more, strict=True):
        stack.add_layer(*args)
        for projection, w, qtype in parts:  # rows in other types after the first weight's
            stack.add_part(projection, w, qtype)
    ends = _ends(model, dtype)
    if ends is not None:
        stack.set_ends(*ends)
    # Decode batches past SMALL_M rows where every projection, the head's too, is dense (their
    # batch kernel handed over), or every one is GGUF tiles (whose kernel takes any rows).
    qtypes = [q for args in layers for q in cast(list[int], args[-1])]
    dense = all(q == 0 for q in qtypes) and (ends is None or ends[3] == 0)
    tiled = (all(isinstance(lin, GGUFLinear) and lin.packed.dim() == 3 for lin in linears)
             and (ends is None or (ends[3] != 0 and ends[2].dim() == 3)))
    head = model.lm_head if ends is not None else None
    _BATCH[model] = tiled or (dense and (_bf16_panels(linears, head)
                                         or cpu_linear_batch.takes(dtype)
                                         or _hand_over_packed(stack, linears, head, dtype)))
    return _Fused(stack, ends is not None)


def _bf16_panels(linears: list[object], head: object | None) -> bool:
    """Whether every projection (and the head, where the stack holds it) is bfloat16 panels,
    the layer's only copy: the stack's kernel for them takes any rows, with no copy to hand
    over."""
    return all(isinstance(lin, Linear) and lin.panels_only and lin.packed is not None
               and cpu_linear_panels_bf16.is_panels(lin.packed)
               for lin in [*linears, *([head] if head is not None else [])])


def _hand_over_packed(stack: Any, linears: list[object], head: object | None,
                      dtype: torch.dtype) -> bool:
    """Gives the stack the packed copy (panels or oneDNN's) of every projection (and of the
    lm_head, where it holds the ends), for decode batches past SMALL_M rows: True where every
    one has a copy in the weights' dtype (not a float32 copy of bfloat16 weights, kept where oneDNN has no
    bfloat16 kernels)."""
    def packed(lin: object) -> torch.Tensor | None:
        copy = lin.packed if isinstance(lin, Linear) else None
        if copy is None:
            return None
        # Panels are float32 for bfloat16 layers too (where oneDNN has no bfloat16 kernels): the
        # stack widens the rows and rounds the sums, as the layer does.
        return copy if copy.dtype == dtype or cpu_linear_panels.is_panels(copy) else None

    weights = [packed(lin) for lin in linears]
    head_weight = None if head is None else packed(head)
    if any(w is None for w in weights) or (head is not None and head_weight is None):
        return False
    stack.set_batch_weights(weights, head_weight)
    return True


def _ends(model: LlamaForCausalLM, dtype: torch.dtype
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, float, int, int, int] | None:
    """(embedding table, final norm weight, lm_head weight, GGML type or 0, eps, vocabulary,
    head rows, the table's GGML type or 0) where the
    embedding is a plain table and compute_logits(norm(x)) takes the kernels the stack runs;
    None otherwise (tensor-parallel ends, a soft-capped head, a bias, a weight the few-row
    kernels do not take)."""
    embed, norm, lm_head = model.model.embed_tokens, model.model.norm, model.lm_head
    embed_qtype = 0
    if isinstance(embed, PanelEmbedding):  # a tied head's panels (layers/embedding.py)
        table, vocab = embed.panels, embed.num_embeddings
    elif (isinstance(embed, GGUFEmbedding) and embed.dtype == dtype
          and embed.table.packed.device.type == "cpu"):  # GGUF blocks (layers/gguf_embedding.py)
        table, vocab, embed_qtype = embed.table.packed, embed.num_embeddings, embed.table.qtype
    elif (type(embed) is nn.Embedding and embed.max_norm is None
            and embed.weight.dtype == dtype and embed.weight.is_contiguous()):
        table, vocab = embed.weight, embed.num_embeddings
    else:
        return None
    if type(norm) is not RMSNorm or norm.weight.dtype != dtype or norm.weight.dim() != 1:
        return None
    if type(lm_head) not in (Linear, GGUFLinear) or lm_head.bias is not None:
        return None
    if isinstance(lm_head, GGUFLinear) and lm_head.more_types:
        return None  # the stack's head is one weight
    projection = _projection(lm_head, dtype)
    if projection is None:
        return None
    weight, _, qtype = projection
    return (table, norm.weight.contiguous(), weight, qtype, float(norm.eps), vocab,
            lm_head.out_features, embed_qtype)


def _projection(lin: object,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None, int] | None:
    """(weight, bias, GGML type or 0 for a dense weight) as decode_layer takes a projection;
    None where the few-row kernels do not take it."""
    if isinstance(lin, GGUFLinear):
        if lin.packed.device.type != "cpu" or (lin.bias is not None and lin.bias.dtype != dtype):
            return None
        return lin.packed, lin.bias, lin.qtype
    if isinstance(lin, Linear) and lin.small_m and lin.weight.dtype == dtype:
        return lin.weight, lin.bias, 0
    if isinstance(lin, Linear) and lin.panels_only and lin.weight.dtype == dtype:
        assert lin.packed is not None
        return lin.packed, lin.bias, 0  # panels: the kernels take them at any rows
    return None


def _check_step(positions: torch.Tensor, slots: torch.Tensor, cos_sin: torch.Tensor,
                kv_cache: torch.Tensor, metadata: AttentionMetadata) -> None:
    """What the kernels index unchecked, checked once for every layer of the step."""
    if int(positions.min()) < 0 or int(positions.max()) >= len(cos_sin):
        raise ValueError(f"positions must be in [0, {len(cos_sin)}), got "
                         f"{int(positions.min())}..{int(positions.max())}")
    num_slots = kv_cache.shape[1] * kv_cache.shape[2]
    if int(slots.max()) >= num_slots:
        raise ValueError(f"slot_mapping must be < {num_slots} (the cache's slots), got "
                         f"{int(slots.max())}")
    check_block_table(metadata, num_blocks=kv_cache.shape[1])


def _step_args(model: LlamaForCausalLM, input_ids: torch.Tensor, positions: torch.Tensor,
               kv_caches: list[torch.Tensor], metadata: AttentionMetadata) -> tuple[Any, ...]:
    """The C++ step's arguments after the step's checks: (hidden, positions, kv_caches, slots,
    block_table, seq_lens)."""
    m = input_ids.shape[0]
    positions = positions[:m].to(torch.int64).contiguous()
    slots = metadata.slot_mapping[:m].to(torch.int64).contiguous()
    block_table = metadata.block_table[:m].to(torch.int32).contiguous()
    seq_lens = metadata.seq_lens[:m].to(torch.int32).contiguous()
    if kv_caches:
        _check_step(positions, slots, model.model.rotary.cos_sin, kv_caches[0], metadata)
    hidden = model.model.embed_tokens(input_ids)
    return hidden, positions, kv_caches, slots, block_table, seq_lens


def forward(model: LlamaForCausalLM, input_ids: torch.Tensor, positions: torch.Tensor,
            kv_caches: list[torch.Tensor],
            metadata: AttentionMetadata) -> torch.Tensor:  # [m, hidden] after the final norm
    fused = _STACKS.get(model)
    assert fused is not None, "call applies() first"
    hidden, residual = fused.stack.forward(*_step_args(model, input_ids, positions, kv_caches,
                                                       metadata))
    return model.model.norm(hidden, residual)[0]


def logits(model: LlamaForCausalLM, input_ids: torch.Tensor, positions: torch.Tensor,
           kv_caches: list[torch.Tensor],
           metadata: AttentionMetadata) -> torch.Tensor:  # [m, vocab]: compute_logits(forward)
    """The step from token ids to logits as one C++ call, which checks what _check_step checks
    (strand/kernels/csrc/decode_ends.cpp: the Python between the kernels cost more than its calls)."""
    fused = _STACKS.get(model)
    assert fused is not None and fused.has_head, "call applies() and has_head() first"
    return fused.stack.logits(input_ids, positions, kv_caches, metadata.slot_mapping,
                              metadata.block_table, metadata.seq_lens)
