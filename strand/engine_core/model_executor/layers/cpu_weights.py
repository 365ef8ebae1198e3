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
from strand.engine_core.model_executor.layers.linear import (
    Linear,
    pack_linear_weights,
    weight_uses,
)
from strand.engine_core.model_executor.layers.weight_arena import gather_decode_weights

logger = logging.getLogger(__name__)


def prepare_cpu_weights(model: nn.Module) -> int:
    """Packs, shares and gathers the model's weights; returns how many linear weights were
    packed."""
    shared = share_tied_panels(model)  # first: the table's pages go as its panels are packed
    if shared:
        logger.info("the tied embedding table is read from the lm_head's panels")
    packed = pack_linear_weights(model) + shared
    gather_decode_weights(model)  # on 2 MiB pages, in a decode step's read order
    trim_heap()
    return packed


def share_tied_panels(model: nn.Module) -> bool:
    """Packs a tied lm_head into panels that serve every row count, and has the
    embedding look its rows up in them (PanelEmbedding): the panels become the table's only
    copy, and the dense table's pages are handed back as they are packed. False (and nothing
    done) where that does not apply."""
    inner = getattr(model, "model", None)
    embed, head = getattr(inner, "embed_tokens", None), getattr(model, "lm_head", None)
    if type(embed) is not nn.Embedding or not isinstance(head, Linear) or head.packed is not None:
        return False
    if (head.weight.is_meta or head.weight.data_ptr() != embed.weight.data_ptr()
            or embed.max_norm is not None or not head.panels_will_serve_all()
            or weight_uses(model).get(head.weight.data_ptr()) != 2):  # the head's, the table's
        return False
    assert inner is not None
    head.pack(keep_dense=False)
    inner.embed_tokens = PanelEmbedding(head, embed.num_embeddings)
    return True

