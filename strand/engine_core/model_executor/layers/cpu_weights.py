"""A loaded model's weights made ready for the CPU kernels, once, after loading (and after
sleep mode's reload): each linear weight packed for its kernels (layers/linear.py), a tied
table read from its head's panels (layers/embedding.py), the decode weights gathered on huge pages
(layers/weight_arena.py), and the heap's freed pages handed back, so that a process holds one
copy of each weight (benchmarks/memory.py measures it)."""

from __future__ import annotations

import logging

from torch import nn

from strand.engine_core.model_executor.cpu_allocator import trim_heap
from strand.engine_core.model_executor.layers.embedding import PanelEmbedding
from strand.engine_core.model_executor.layers.linear import Linear, pack_linear_weights
from strand.engine_core.model_executor.layers.weight_arena import gather_decode_weights

logger = logging.getLogger(__name__)


def prepare_cpu_weights(model: nn.Module) -> int:
    """Packs, shares and gathers the model's weights; returns how many linear weights were
    packed."""
    packed = pack_linear_weights(model)
    if share_tied_panels(model):  # before the gather: the dense table must not move too
        logger.info("the tied embedding table is read from the lm_head's panels")
    gather_decode_weights(model)  # on 2 MiB pages, in a decode step's read order
    trim_heap()
    return packed


def share_tied_panels(model: nn.Module) -> bool:
    """A tied lm_head whose float32 panels serve every row count: the embedding looks its rows
    up in them (PanelEmbedding) and the dense table goes. False where that does not apply."""
    inner = getattr(model, "model", None)
    embed, head = getattr(inner, "embed_tokens", None), getattr(model, "lm_head", None)
    if type(embed) is not nn.Embedding or not isinstance(head, Linear) or head.packed is None:
        return False
    if (head.weight.is_meta or head.weight.data_ptr() != embed.weight.data_ptr()
            or embed.max_norm is not None or not head.panels_serve_all(head.packed)):
        return False
    assert inner is not None
    inner.embed_tokens = PanelEmbedding(head, embed.num_embeddings)
    head.drop_dense()
    return True
