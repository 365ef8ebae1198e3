"""The token embedding table, made without the random init a checkpoint overwrites.

The loader builds a model on the meta device; nn.Embedding's own init (normal_) on meta runs
through torch's reference ops, which import torch._dynamo and, with it, Triton: tens of MB of a CPU
process's memory spent on an init whose values nobody reads."""

from __future__ import annotations

import torch
from torch import nn


def embedding_table(num_embeddings: int, embedding_dim: int) -> nn.Embedding:
    """nn.Embedding(num_embeddings, embedding_dim) on the current device, its values unset."""
    return nn.Embedding(num_embeddings, embedding_dim,
                        _weight=torch.empty(num_embeddings, embedding_dim))


class PanelEmbedding(nn.Module):
    """A tied embedding table read from its lm_head's panels, the weight's only copy
    (layers/linear.py): row r is column r % W of panel r // W (float32 [P, H, W]; bfloat16
    [P, H / 2, W, 2] holds each column's values in pairs). A lookup gathers a step's few rows (a
    prefill's few thousand) with a stride; the head streams the panels whole."""

    def __init__(self, head: nn.Module, num_embeddings: int) -> None:
        super().__init__()
        panels = getattr(head, "packed", None)
        if not isinstance(panels, torch.Tensor) or panels.dim() not in (3, 4):
            raise ValueError("PanelEmbedding takes a head whose weight is packed into panels")
        # Not a submodule (the head is the model's own) nor a buffer: read through the head,
        # so that the panels moved into the weight arena are the ones read.
        self.__dict__["_head"] = head
        hidden = panels.shape[1] * (2 if panels.dim() == 4 else 1)
        self.num_embeddings = num_embeddings
        self.embedding_dim = int(getattr(head, "in_features", hidden))

    @property
    def panels(self) -> torch.Tensor:
        packed = self.__dict__["_head"].packed
        assert isinstance(packed, torch.Tensor)
        return packed

    @property
    def dtype(self) -> torch.dtype:
        return self.panels.dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [...] -> [..., hidden]
        ids = input_ids.reshape(-1)
        if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < self.num_embeddings:
            raise IndexError(f"token ids must be in [0, {self.num_embeddings}), got "
                             f"{int(ids.min())}..{int(ids.max())}")
        panels = self.panels
        width = panels.shape[2]
        rows = panels[ids // width, :, ids % width]  # [n, H] or, in pairs, [n, H / 2, 2]
        rows = rows.reshape(ids.numel(), -1)[:, :self.embedding_dim]
        return rows.reshape(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, from the lm_head's panels"
